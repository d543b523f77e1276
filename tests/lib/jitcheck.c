/* Helpers of the compiler tests (see jitcheck.h). */
#include "jitcheck.h"

nb_jit_opts nb_test_jit_opts(const char *disable) {
  static char dir[1024];
  if (!dir[0]) {
    const char *b = getenv("NABLA_BUILD_DIR");
    snprintf(dir, sizeof dir, "%s/jit-cache", b && *b ? b : "/tmp/nabla-test");
  }
  nb_jit_opts o;
  memset(&o, 0, sizeof o);
  o.cache_dir = getenv("NABLA_CACHE_DIR") ? getenv("NABLA_CACHE_DIR") : dir;
  o.disable = disable;
  return o;
}

double nb_test_jit_tol(nb_dtype t) {
  switch (t) {
  case NB_F64: return 1e-9;
  case NB_F32: return 2e-5;
  case NB_BF16: case NB_F16: return 2e-2;
  default: return 0;
  }
}

double nb_test_max_rel_diff(const nb_array *a, const nb_array *b) {
  nb_aval x = nb_array_aval(a), y = nb_array_aval(b);
  if (!nb_aval_equal(&x, &y)) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    double p = nb_array_get(a, i), q = nb_array_get(b, i);
    if (p != p || q != q) {
      if ((p != p) != (q != q)) return INFINITY;
      continue;
    }
    if (p == q) continue;
    if (isinf(p) || isinf(q)) return INFINITY;
    double d = fabs(p - q) / (1 + fabs(q));
    if (d > worst) worst = d;
  }
  return worst;
}

bool nb_test_jit_matches(nb_ctx *ctx, const nb_graph *g, const nb_tree *in, const nb_jit_opts *opts, const char *what,
                         nb_exe_stats *stats_out) {
  nb_tree *want = nb_tree_create(ctx), *got = nb_tree_create(ctx);
  bool ok = true;
  if (nb_graph_run(ctx, g, in, want) != NB_OK) {
    fprintf(stderr, "%s: interpreter failed: %s\n", what, nb_ctx_error(ctx));
    ok = false;
  }
  nb_exe *e = ok ? nb_jit(ctx, g, opts) : NULL;
  if (ok && !e) {
    fprintf(stderr, "%s: nb_jit failed: %s\n", what, nb_ctx_error(ctx));
    ok = false;
  }
  if (ok && nb_exe_run(e, in, got) != NB_OK) {
    fprintf(stderr, "%s: nb_exe_run failed: %s\n", what, nb_ctx_error(ctx));
    ok = false;
  }
  for (size_t i = 0; ok && i < nb_tree_size(want); i++) {
    const char *p = nb_tree_path(want, i);
    nb_array *a = nb_tree_get_array(got, p), *b = nb_tree_get_array(want, p);
    double d = a ? nb_test_max_rel_diff(a, b) : INFINITY;
    if (!(d <= nb_test_jit_tol(nb_array_dtype(b)))) {
      fprintf(stderr, "%s: output '%s' differs (max rel diff %g)\n", what, p, d);
      if (a && nb_array_size(a) <= 64) {
        nb_array_print(a, stderr);
        fputc('\n', stderr);
        nb_array_print(b, stderr);
        fputc('\n', stderr);
      }
      ok = false;
    }
  }
  if (e && stats_out) nb_exe_get_stats(e, stats_out);
  if (!ok && e && getenv("NABLA_TEST_VERBOSE")) nb_exe_print(e, stderr);
  nb_exe_destroy(e);
  nb_tree_destroy(want);
  nb_tree_destroy(got);
  nb_ctx_clear_error(ctx);
  return ok;
}

nb_graph *nb_test_prim_table_graph(nb_ctx *ctx, nb_tree *inputs, int *nrows) {
  nb_graph *all = nb_graph_create(ctx);
  nb_test_rng rng = {4242};
  int rows = 0;
  size_t nfamilies;
  const nb_case_list_fn *families = nb_test_case_families(&nfamilies);
  for (size_t f = 0; f < nfamilies; f++) {
    size_t n;
    const nb_prim_case *cases = families[f](&n);
    for (size_t i = 0; i < n; i++) {
      const nb_prim_case *c = &cases[i];
      nb_tree *in = nb_tree_create(ctx), *vin = nb_tree_create(ctx), *out = nb_tree_create(ctx);
      CHECK_MSG(c->make_inputs(ctx, &rng, in) == NB_OK, "%s: inputs", c->name);
      nb_graph *g = nb_trace(ctx, c->fn, c->user, in);
      CHECK_MSG(g != NULL, "%s: %s", c->name, nb_ctx_error(ctx));
      for (size_t k = 0; g && k < nb_tree_size(in); k++) {
        char path[256];
        snprintf(path, sizeof path, "r%d/%s", rows, nb_tree_path(in, k));
        nb_array *a = nb_tree_leaf(in, k)->array;
        nb_tree_set_val(vin, nb_tree_path(in, k), nb_graph_input(all, path, nb_array_aval(a)));
        nb_tree_set_array(inputs, path, a);
      }
      if (g) CHECK_MSG(nb_graph_call(all, g, vin, out) == NB_OK, "%s: call", c->name);
      for (size_t k = 0; k < nb_tree_size(out); k++) {
        char path[256];
        snprintf(path, sizeof path, "r%d/%s %s/%s", rows, c->prim, c->name, nb_tree_path(out, k));
        for (char *p = path; *p; p++)
          if (*p == '/' && p > path && p[-1] == '/') *p = '_';
        nb_graph_output(all, path, nb_tree_leaf(out, k)->val);
      }
      nb_graph_destroy(g);
      nb_tree_destroy(in);
      nb_tree_destroy(vin);
      nb_tree_destroy(out);
      rows++;
    }
  }
  *nrows = rows;
  return all;
}

bool nb_test_cuda_usable(nb_ctx *ctx, char *why, size_t cap) {
  static int usable = -1;
  static char reason[512];
  if (usable < 0) {
    nb_graph *g = nb_graph_create(ctx);
    nb_graph_output(g, "y", nb_exp(nb_graph_input(g, "x", nb_aval_make(NB_F32, 0, NULL))));
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.backend = "cuda";
    nb_exe *e = nb_jit(ctx, g, &o);
    usable = e != NULL;
    if (!e) snprintf(reason, sizeof reason, "%s", nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
  snprintf(why, cap, "%s", reason);
  return usable == 1;
}
