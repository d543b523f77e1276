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
