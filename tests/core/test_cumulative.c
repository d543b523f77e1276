/* Values of cumsum and cummax: JAX goldens (tests/core/golden/
 * make_cumulative.py) in both directions over f64, f32 and integers, and
 * JAX's gradient of cummax on tie-free inputs; by hand: cummax's tangent on
 * ties (first occurrence, in the scan's direction), NaN propagation, integer
 * wrap-around; vmap of grad and grad of vmap; printed params, cost, misuse. */
#include "json_golden.h"
#include "primcheck.h"

typedef struct scan_args {
  bool is_max;
  int axis;
  bool reverse;
  const nb_array *w; /* with w: the output is sum(w * scan(x)) */
} scan_args;

static nb_status f_scan(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const scan_args *a = user;
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *y = a->is_max ? nb_cummax(x, a->axis, a->reverse) : nb_cumsum(x, a->axis, a->reverse);
  if (a->w) y = nb_reduce_sum(nb_mul(y, nb_const(g, (nb_array *)a->w)), 0, NULL);
  return nb_tree_set_val(out, "y", y);
}

/* Runs the scan on x; with grad, returns d/dx of the (scalar) output. */
static nb_array *run_scan(nb_ctx *ctx, const scan_args *a, nb_array *x, bool grad) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x);
  nb_graph *g = nb_trace(ctx, f_scan, (void *)a, in);
  nb_graph *run = g && grad ? nb_grad(ctx, g, NULL) : g;
  nb_array *y = NULL;
  if (run && nb_graph_run(ctx, run, in, out) == NB_OK) {
    y = nb_tree_get_array(out, grad ? "grad/x" : "y");
    nb_array_retain(y);
  } else {
    fprintf(stderr, "run failed: %s\n", nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
  }
  if (run != g) nb_graph_destroy(run);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return y;
}

static void check_values_1d(nb_ctx *ctx, const char *what, nb_array *got, nb_dtype t, int64_t n, const double *want) {
  nb_test_check_values(ctx, what, got, t, 1, &n, want);
}

/* ---------------------------------------------------------------- hand-computed */

static void test_ties_nan_wrap(nb_ctx *ctx) {
  int64_t n = 6;
  nb_array *x = nb_array_from_f64(ctx, NB_F64, 1, &n, (double[]){1, 3, 3, 2, 5, 5});
  nb_array *ones = nb_array_ones(ctx, NB_F64, 1, &n);
  scan_args fwd = {true, 0, false, NULL}, bwd = {true, -1, true, NULL};
  check_values_1d(ctx, "cummax with ties", run_scan(ctx, &fwd, x, false), NB_F64, n, (double[]){1, 3, 3, 3, 5, 5});
  check_values_1d(ctx, "reverse cummax", run_scan(ctx, &bwd, x, false), NB_F64, n, (double[]){5, 5, 5, 5, 5, 5});
  fwd.w = bwd.w = ones;
  /* each output's tangent comes from the first position holding its maximum */
  check_values_1d(ctx, "grad of sum(cummax) on ties", run_scan(ctx, &fwd, x, true), NB_F64, n, (double[]){1, 3, 0, 0, 2, 0});
  check_values_1d(ctx, "grad of sum(reverse cummax) on ties", run_scan(ctx, &bwd, x, true), NB_F64, n,
               (double[]){0, 0, 0, 0, 0, 6});
  nb_array_release(x);
  nb_array_release(ones);

  nb_array *nan = nb_array_from_f64(ctx, NB_F32, 1, (int64_t[]){4}, (double[]){1, NAN, 2, 0});
  scan_args m = {true, 0, false, NULL};
  check_values_1d(ctx, "NaN sticks in cummax", run_scan(ctx, &m, nan, false), NB_F32, 4, (double[]){1, NAN, NAN, NAN});
  nb_array_release(nan);

  nb_array *i8 = nb_array_from_f64(ctx, NB_I8, 1, (int64_t[]){3}, (double[]){100, 100, -128});
  scan_args s = {false, 0, false, NULL};
  check_values_1d(ctx, "i8 cumsum wraps", run_scan(ctx, &s, i8, false), NB_I8, 3, (double[]){100, -56, 72});
  nb_array_release(i8);
  nb_array *u32 = nb_array_from_f64(ctx, NB_U32, 1, (int64_t[]){3}, (double[]){4000000000.0, 7, 4294967295.0});
  check_values_1d(ctx, "u32 cummax", run_scan(ctx, &m, u32, false), NB_U32, 3, (double[]){4000000000.0, 4000000000.0, 4294967295.0});
  nb_array_release(u32);
}

/* ---------------------------------------------------------------- goldens */

static void test_goldens(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/core/golden/cumulative.json");
  CHECK(j != NULL);
  if (!j) return;
  for (int is_max = 0; is_max < 2; is_max++) {
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, is_max ? "cummax" : "cumsum")) {
      scan_args a = {is_max, (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "axis")),
                     cJSON_IsTrue(cJSON_GetObjectItem(c, "reverse")), NULL};
      nb_array *x = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "x"));
      nb_array *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "y"));
      nb_dtype t = x ? nb_array_dtype(x) : NB_F64;
      double tol = t == NB_F32 ? 1e-6 : t == NB_F64 ? 1e-13 : 0; /* summation order may differ */
      nb_array *got = x ? run_scan(ctx, &a, x, false) : NULL;
      char what[80];
      snprintf(what, sizeof what, "golden %s %d", is_max ? "cummax" : "cumsum", k);
      CHECK_MSG(got && want && nb_test_arrays_close(what, got, want, tol), "%s", what);
      nb_array_release(got), nb_array_release(want);
      const cJSON *wj = cJSON_GetObjectItem(c, "w");
      if (wj && x) {
        nb_array *w = nb_test_golden_array(ctx, wj), *gwant = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "grad"));
        a.w = w;
        nb_array *ggot = run_scan(ctx, &a, x, true);
        snprintf(what, sizeof what, "golden gradient of cummax %d", k);
        CHECK_MSG(ggot && gwant && nb_test_arrays_close(what, ggot, gwant, 1e-13), "%s", what);
        nb_array_release(w), nb_array_release(gwant), nb_array_release(ggot);
      }
      nb_array_release(x);
      k++;
    }
  }
  cJSON_Delete(j);
}

/* ---------------------------------------------------------------- compositions */

static nb_status f_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *x = nb_tree_get_val(in, "x"), *m = nb_cummax(x, -1, false);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_cumsum(m, 0, true), m), 0, NULL));
}
static nb_status f_call(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  return nb_graph_call(g, user, in, out);
}

/* vmap(grad f) against a loop and grad(vmap f) against finite differences:
 * cummax's tangent scan batches and transposes. */
static void test_compositions(nb_ctx *ctx) {
  nb_test_rng rng = {777};
  const int64_t n = 3;
  nb_tree *b = nb_tree_create(ctx), *spec = nb_tree_create(ctx);
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[]){n, 4, 7});
  nb_tree_set_array(b, "x", x);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 2, (int64_t[]){4, 7})));
  nb_graph *g = nb_trace(ctx, f_loss, NULL, spec);
  nb_graph *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  CHECK(dg && nb_test_check_vmap(ctx, "vmap(grad(cummax, cumsum))", f_call, dg, b, NULL, n));
  nb_vmap_opts o = {.in_axis = 0, .out_axis = 0, .axis_size = n};
  nb_graph *vg = g ? nb_vmap(ctx, g, &o) : NULL;
  CHECK(vg && nb_test_check_grads(ctx, "grad(vmap(cummax, cumsum))", f_call, vg, b, 1e-5, true));
  nb_graph_destroy(vg);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_array_release(x);
  nb_tree_destroy(b);
  nb_tree_destroy(spec);
}

/* ---------------------------------------------------------------- print, cost, misuse */

static void test_print_and_cost(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {3, 4};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d));
  nb_graph_output(g, "y", nb_cummax(nb_cumsum(x, -1, true), 0, false));
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "cumsum[axis=1 reverse]"), "%s", text);
  CHECK_MSG(text && strstr(text, "cummax[axis=0]"), "%s", text);
  free(text);
  double flops, bytes;
  nb_graph_cost(g, &flops, &bytes);
  CHECK_NEAR(flops, 24, 0);
  CHECK_NEAR(bytes, 2 * 2 * 12 * 4, 0);
  nb_graph_destroy(g);
}

static void test_misuse(nb_ctx *ctx) {
  int64_t d[2] = {3, 4};
  for (int k = 0; k < 4; k++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(k < 2 ? NB_F32 : NB_BOOL, 2, d));
    if (k == 0) nb_cumsum(x, 2, false);
    if (k == 1) nb_cummax(x, -3, true);
    if (k == 2) nb_cumsum(x, 0, false);
    if (k == 3) nb_cummax(x, 1, false);
    if (k < 2) CHECK_ERR(ctx, NB_ERR_INVALID_ARG, k ? "cummax: axis -3 out of range for rank 2" : "cumsum: axis 2 out of range");
    else CHECK_ERR(ctx, NB_ERR_DTYPE, "cannot scan bool");
    nb_graph_destroy(g);
  }
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_ties_nan_wrap(ctx);
  test_goldens(ctx);
  test_compositions(ctx);
  test_print_and_cost(ctx);
  test_misuse(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/cumulative");
}
