/* The backend seam (src/backend/backend.h): the same graphs compiled for the
 * "cpu" and the "interp" backends give the interpreter's results (the
 * interp backend bit for bit: it runs the same reference rules), and
 * everything the plan needs goes through the interface: the interp
 * backend's counters show that the fusion pass asked it which contractions
 * are library calls (it takes integer ones, the CPU backend does not), that
 * every kernel and library step ran through it, only on memory it
 * allocated, with inputs copied in and outputs out, and that all of its
 * memory is freed. Unknown backend names are errors. */
#include "backend/interp/interp.h"
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {2718};
static const char *const backends[] = {"cpu", "interp"};

/* ---------------------------------------------------------------- graphs */

static nb_val *bcast_rows(nb_val *r, const nb_val *like) {
  int64_t dims[2] = {nb_val_dim(like, 0), nb_val_dim(like, 1)};
  int bd[1] = {0};
  return nb_broadcast_in_dim(r, 2, dims, bd);
}

/* A tiny model's loss: layer norm, a dense layer with tanh, softmax
 * cross-entropy against one-hot targets. */
static nb_status f_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "params/w"), *t = nb_tree_get_val(in, "t");
  int ax[1] = {1};
  double n = (double)nb_val_dim(x, 1);
  nb_val *mean = nb_div(nb_reduce_sum(x, 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *xc = nb_sub(x, bcast_rows(mean, x));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *h = nb_div(xc, bcast_rows(nb_sqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5))), x));
  nb_val *z = nb_tanh(nb_matmul(h, w));
  nb_val *m = nb_reduce_max(z, 1, ax);
  nb_val *lse = nb_add(nb_log(nb_reduce_sum(nb_exp(nb_sub(z, bcast_rows(m, z))), 1, ax)), m);
  nb_val *nll = nb_sub(lse, nb_reduce_sum(nb_mul(z, t), 1, ax));
  int all[1] = {0};
  return nb_tree_set_val(out, "loss", nb_div(nb_reduce_sum(nll, 1, all), nb_scalar(g, NB_F32, (double)nb_val_dim(x, 0))));
}

/* A decode step: the new key written into the cache at `pos` (in place
 * when the cache is donated), then attention scores of q over it. */
static nb_status f_kv(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *cache = nb_tree_get_val(in, "cache"), *k = nb_tree_get_val(in, "k"), *q = nb_tree_get_val(in, "q");
  nb_val *start[2] = {nb_tree_get_val(in, "pos"), nb_scalar(g, NB_I32, 0)};
  nb_val *c = nb_dynamic_update_slice(cache, k, start);
  nb_val *s = nb_matmul(q, nb_transpose(c, ((int[]){1, 0})));
  nb_status st = nb_tree_set_val(out, "cache", c);
  return st ? st : nb_tree_set_val(out, "scores", nb_exp(nb_mul(s, nb_scalar(g, NB_F32, 0.25))));
}

/* An integer contraction and an elementwise op after it. */
static nb_status f_int_dot(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *a = nb_tree_get_val(in, "a"), *b = nb_tree_get_val(in, "b");
  return nb_tree_set_val(out, "y", nb_add(nb_matmul(a, b), nb_scalar(g, NB_I32, 3)));
}

/* Elementwise work and a contraction over arrays with no elements. */
static nb_status f_empty(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  nb_status st = nb_tree_set_val(out, "y", nb_mul(nb_tanh(x), nb_scalar(g, NB_F32, 2)));
  return st ? st : nb_tree_set_val(out, "z", nb_exp(nb_matmul(x, w)));
}

/* ---------------------------------------------------------------- checks */

static nb_tree *loss_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){24, 40});
  nb_test_set_randn(in, &rng, "params/w", NB_F32, 2, (int64_t[]){40, 16});
  nb_array *t = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){24, 16});
  float *td = nb_array_data_mut(t);
  memset(td, 0, nb_array_nbytes(t));
  for (int i = 0; i < 24; i++) td[i * 16 + (i * 7) % 16] = 1;
  nb_tree_set_array(in, "t", t);
  nb_array_release(t);
  return in;
}

static nb_tree *kv_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "cache", NB_F32, 2, (int64_t[]){16, 8});
  nb_test_set_randn(in, &rng, "k", NB_F32, 2, (int64_t[]){1, 8});
  nb_test_set_randn(in, &rng, "q", NB_F32, 2, (int64_t[]){3, 8});
  nb_array *pos = nb_array_scalar(ctx, NB_I32, 5);
  nb_tree_set_array(in, "pos", pos);
  nb_array_release(pos);
  return in;
}

static nb_tree *int_dot_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_array *a = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){6, 5}, -20, 20);
  nb_array *b = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){5, 7}, -20, 20);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_array_release(a);
  nb_array_release(b);
  return in;
}

static uint64_t diff(uint64_t after, uint64_t before) { return after - before; }

/* Runs g on both backends (with everything on, and with fusion off) against
 * the interpreter; on interp, checks what its counters say went through it. */
static void check_graph(const char *what, const nb_graph *g, const nb_tree *in, const char *const *donate) {
  static const char *const modes[] = {NULL, "fuse"};
  nb_tree *want = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want));
  size_t out_bytes = 0;
  for (size_t i = 0; i < nb_tree_size(want); i++) out_bytes += nb_array_nbytes(nb_tree_get_array(want, nb_tree_path(want, i)));
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < 2; m++) {
      nb_jit_opts o = nb_test_jit_opts(modes[m]);
      o.backend = backends[b];
      o.donate = donate;
      nb_interp_counters c0, c1, c2;
      nb_interp__counters(&c0);
      nb_exe *e = nb_jit(ctx, g, &o);
      CHECK_MSG(e, "%s on %s: %s", what, backends[b], nb_ctx_error(ctx));
      if (!e) continue;
      nb_interp__counters(&c1);
      nb_exe_stats s;
      nb_exe_get_stats(e, &s);
      CHECK_MSG(s.backend && !strcmp(s.backend, backends[b]), "%s: stats name backend %s", what, s.backend ? s.backend : "(null)");
      CHECK_MSG(s.native, "%s on %s runs the plan, not the interpreter fallback", what, backends[b]);
      const int runs = 2;
      for (int r = 0; r < runs; r++) {
        nb_tree *got = nb_tree_create(ctx);
        CHECK_OK(ctx, nb_exe_run(e, in, got));
        for (size_t i = 0; i < nb_tree_size(want); i++) {
          const char *p = nb_tree_path(want, i);
          nb_array *x = nb_tree_get_array(got, p), *y = nb_tree_get_array(want, p);
          double d = x ? nb_test_max_rel_diff(x, y) : INFINITY;
          /* interp runs the interpreter's own rules: the same bits */
          double tol = b == 1 ? 0 : nb_test_jit_tol(nb_array_dtype(y));
          CHECK_MSG(d <= tol, "%s on %s [off: %s] run %d: '%s' differs by %g", what, backends[b], modes[m] ? modes[m] : "none",
                    r, p, d);
        }
        nb_tree_destroy(got);
      }
      nb_interp__counters(&c2);
      if (b == 1) {
        CHECK_MSG(diff(c1.compiles, c0.compiles) == 1, "%s: nb_jit compiled through the interp backend", what);
        CHECK_MSG(diff(c1.library_asked, c0.library_asked) > 0 || s.nblas + s.neval == 0,
                  "%s: the fusion pass asked the interp backend about its contractions", what);
        CHECK_MSG(diff(c2.launches, c1.launches) == runs * s.nkernels, "%s: %llu launches for %zu kernels x %d runs", what,
                  (unsigned long long)diff(c2.launches, c1.launches), s.nkernels, runs);
        CHECK_MSG(diff(c2.library_calls, c1.library_calls) == runs * s.nblas, "%s: %llu library calls for %zu x %d", what,
                  (unsigned long long)diff(c2.library_calls, c1.library_calls), s.nblas, runs);
        CHECK_MSG(diff(c2.bytes_to_device, c1.bytes_to_device) > 0 && (diff(c2.bytes_to_host, c1.bytes_to_host) > 0 || !out_bytes),
                  "%s: inputs copied in and outputs out", what);
        CHECK_MSG(diff(c2.foreign_pointers, c0.foreign_pointers) == 0, "%s: a step got memory the backend did not allocate", what);
      } else {
        CHECK_MSG(diff(c2.compiles, c0.compiles) == 0 && diff(c2.launches, c0.launches) == 0 &&
                      diff(c2.library_asked, c0.library_asked) == 0,
                  "%s: the cpu executable went through the interp backend", what);
      }
      nb_exe_destroy(e);
      if (b == 1) {
        nb_interp_counters c3;
        nb_interp__counters(&c3);
        CHECK_MSG(c3.allocs - c3.frees == c0.allocs - c0.frees, "%s: the interp backend's memory was not all freed (%llu allocs, %llu frees)",
                  what, (unsigned long long)diff(c3.allocs, c0.allocs), (unsigned long long)diff(c3.frees, c0.frees));
      }
    }
  nb_tree_destroy(want);
}

static void test_graphs(void) {
  nb_tree *in = loss_inputs();
  nb_graph *g = nb_trace(ctx, f_loss, NULL, in);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params"}) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  if (vg) check_graph("loss and grad", vg, in, NULL);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){0, 5});
  nb_test_set_randn(in, &rng, "w", NB_F32, 2, (int64_t[]){5, 3});
  g = nb_trace(ctx, f_empty, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) check_graph("no elements", g, in, NULL);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = kv_inputs();
  g = nb_trace(ctx, f_kv, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  static const char *const donate_cache[] = {"cache", NULL};
  if (g) check_graph("kv step", g, in, donate_cache);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* Which contractions are library calls is the backend's answer, asked
 * through the interface: interp takes integer ones too. A fusion pass that
 * asked the CPU backend directly makes this one an eval step on interp. */
static void test_library_question(void) {
  nb_tree *in = int_dot_inputs();
  nb_graph *g = nb_trace(ctx, f_int_dot, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) {
    check_graph("integer dot", g, in, NULL);
    for (int b = 0; b < 2; b++) {
      nb_jit_opts o = nb_test_jit_opts(NULL);
      o.backend = backends[b];
      nb_exe *e = nb_jit(ctx, g, &o);
      nb_exe_stats s = {0};
      nb_exe_get_stats(e, &s);
      CHECK_MSG(e && s.nblas == (size_t)b, "integer dot on %s: %zu library steps, %zu eval steps", backends[b], s.nblas, s.neval);
      nb_exe_destroy(e);
    }
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_names(void) {
  nb_tree *in = int_dot_inputs();
  nb_graph *g = nb_trace(ctx, f_int_dot, NULL, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.backend = "cuda";
  CHECK(nb_jit(ctx, g, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "unknown backend 'cuda' in nb_jit_opts.backend (known: cpu, interp)");
  /* $NABLA_BACKEND picks the default; the option wins over it */
  const char *old = getenv("NABLA_BACKEND");
  char *saved = old ? strdup(old) : NULL;
  setenv("NABLA_BACKEND", "nope", 1);
  o.backend = NULL;
  CHECK(nb_jit(ctx, g, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "unknown backend 'nope' in $NABLA_BACKEND");
  setenv("NABLA_BACKEND", "interp", 1);
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_exe_stats s = {0};
  nb_exe_get_stats(e, &s);
  CHECK(e && s.backend && !strcmp(s.backend, "interp"));
  o.backend = "cpu";
  nb_exe *c = nb_jit(ctx, g, &o);
  CHECK_MSG(c && c != e, "one graph compiled for two backends is two executables");
  nb_exe_destroy(c);
  nb_exe_destroy(e);
  if (saved) setenv("NABLA_BACKEND", saved, 1);
  else unsetenv("NABLA_BACKEND");
  free(saved);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

int main(void) {
  ctx = nb_ctx_create();
  test_graphs();
  test_library_question();
  test_names();
  nb_ctx_destroy(ctx);
  return nb_test_summary("backend/test_backend");
}
