/* The CUDA backend's generated code compiles: every row of the primitive
 * table (all fused primitives, every dtype they take), fused and unfused,
 * and a small model's loss and gradient, planned (on the interp backend:
 * the kernel IR does not depend on the backend) and turned into CUDA C
 * (backend/cuda/codegen_cu.c), which NVRTC must compile for sm_90 without
 * an error, and so must the gather/scatter_add kernels (backend/cuda/walk.c).
 * Needs NVRTC only, not a GPU or its driver: SKIPPED where the
 * backend is not built or NVRTC is not found. Whether the code computes the
 * right values is for the device (backend/test_backend, compile/test_jit_prims
 * on "cuda"). */
#include "jitcheck.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda.h"
#include "runtime/exe.h"
#endif

static nb_ctx *ctx;

#ifdef NABLA_HAVE_CUDA
/* Generates and compiles e's kernels; false (and a failed check) on error. */
static void check_compiles(const char *what, const nb_exe *e, const char *must_have) {
  const nb_jplan *p = &e->plan;
  nb_jit_text src = {ctx, NULL, 0, 0, false};
  int *alias = calloc((size_t)p->nkernels + 1, sizeof *alias);
  int64_t *blocks = calloc((size_t)p->nkernels + 1, sizeof *blocks);
  nb_status st = nb_cuda__codegen(ctx, p, &src, alias, blocks);
  CHECK_MSG(st == NB_OK, "%s: codegen: %s", what, nb_ctx_error(ctx));
  char *bin = NULL;
  size_t n = 0;
  bool cached = false;
  if (st == NB_OK) {
    st = nb_cuda__nvrtc_compile(ctx, src.s, src.n, 90, &bin, &n, &cached);
    CHECK_MSG(st == NB_OK && n > 0, "%s: NVRTC: %s", what, nb_ctx_error(ctx));
    int unique = 0;
    for (int k = 0; k < p->nkernels; k++) unique += alias[k] == k;
    printf("%s: %d kernels (%d distinct), %zu bytes of CUDA C, cubin %zu bytes\n", what, p->nkernels, unique, src.n, n);
    CHECK_MSG(!must_have || strstr(src.s, must_have), "%s: the CUDA C has no '%s'", what, must_have);
    if (getenv("NABLA_TEST_VERBOSE")) fwrite(src.s, 1, src.n, stderr);
  }
  nb_ctx_clear_error(ctx);
  free(bin);
  free(alias);
  free(blocks);
  nb_jit__text_free(&src);
}

/* rows of 700: block kernels, each kind of block combination */
static nb_status f_rows(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *n = nb_convert(x, NB_I32), *d = nb_convert(x, NB_F64);
  int ax1[1] = {1}, all[2] = {0, 1};
  nb_status st = nb_tree_set_val(out, "a", nb_reduce_sum(nb_exp(x), 1, ax1));
  if (!st) st = nb_tree_set_val(out, "b", nb_reduce_max(x, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "c", nb_reduce_min(d, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "d", nb_reduce_max(n, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "e", nb_reduce_sum(n, 2, all));
  if (!st) st = nb_tree_set_val(out, "f", nb_reduce_prod(x, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "g", nb_reduce_min(n, 1, ax1));
  return st;
}

static nb_status f_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "params/w");
  int ax[1] = {1}, all[2] = {0, 1};
  nb_val *z = nb_tanh(nb_matmul(x, w));
  nb_val *m = nb_reduce_max(z, 1, ax);
  int64_t dims[2] = {nb_val_dim(z, 0), nb_val_dim(z, 1)};
  int bd[1] = {0};
  nb_val *lse = nb_log(nb_reduce_sum(nb_exp(nb_sub(z, nb_broadcast_in_dim(m, 2, dims, bd))), 1, ax));
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_add(lse, m), 1, all + 0));
}
#endif

int main(void) {
  ctx = nb_ctx_create();
#ifndef NABLA_HAVE_CUDA
  printf("cuda codegen: SKIPPED (the CUDA backend is not built: no CUDA toolkit headers)\n");
#else
  char why[512];
  if (!nb_cuda__nvrtc(why, sizeof why)) {
    printf("cuda codegen: SKIPPED (%s)\n", why);
  } else {
    nb_test_register_custom_calls(ctx);
    nb_tree *inputs = nb_tree_create(ctx);
    int rows = 0;
    nb_graph *all = nb_test_prim_table_graph(ctx, inputs, &rows);
    static const char *const modes[] = {NULL, "all"};
    for (int m = 0; m < 2; m++) {
      nb_jit_opts o = nb_test_jit_opts(modes[m]);
      o.backend = "interp";
      nb_exe *e = nb_jit(ctx, all, &o);
      CHECK_MSG(e, "%s", nb_ctx_error(ctx));
      if (e) check_compiles(m ? "table, all off" : "table", e, NULL);
      nb_exe_destroy(e);
    }
    nb_graph_destroy(all);
    nb_tree_destroy(inputs);
    char *wbin = NULL;
    size_t wn = 0;
    CHECK_MSG(nb_cuda__walk_compile(ctx, 90, &wbin, &wn) == NB_OK && wn > 0, "gather/scatter kernels: %s", nb_ctx_error(ctx));
    printf("gather/scatter kernels: cubin %zu bytes\n", wn);
    free(wbin);
    nb_tree *rin = nb_tree_create(ctx);
    nb_test_rng rng = {99};
    nb_test_set_randn(rin, &rng, "x", NB_F32, 2, (int64_t[]){3, 700});
    nb_graph *rg = nb_trace(ctx, f_rows, NULL, rin);
    nb_jit_opts ro = nb_test_jit_opts("fuse"); /* a kernel per reduction */
    ro.backend = "interp";
    nb_exe *re = rg ? nb_jit(ctx, rg, &ro) : NULL;
    CHECK_MSG(re, "%s", nb_ctx_error(ctx));
    if (re) check_compiles("long rows", re, "nbx_bred_add_d(acc");
    nb_exe_destroy(re);
    nb_graph_destroy(rg);
    nb_tree_destroy(rin);
    nb_tree *in = nb_tree_create(ctx);
    nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){8, 12});
    nb_test_set_randn(in, &rng, "params/w", NB_F32, 2, (int64_t[]){12, 5});
    nb_graph *g = nb_trace(ctx, f_loss, NULL, in);
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params"}) : NULL;
    CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.backend = "interp";
    nb_exe *e = vg ? nb_jit(ctx, vg, &o) : NULL;
    if (e) check_compiles("loss and grad", e, NULL);
    nb_exe_destroy(e);
    nb_graph_destroy(vg);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
  }
#endif
  nb_ctx_destroy(ctx);
  return nb_test_summary("backend/test_cuda_codegen");
}
