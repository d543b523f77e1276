/* Control flow (cond/switch, while_loop, scan, fori_loop): values by hand,
 * shape-rule errors, printed params and cost. The primitive table
 * (tests/lib/cases_control.c) runs the same primitives through the generic
 * evaluation, derivative and vmap checks. */
#include "core/ir.h"
#include "json_golden.h"
#include "primcheck.h"

static nb_ctx *ctx;

static nb_aval av(nb_dtype t, int rank, const int64_t *dims) { return nb_aval_make(t, rank, dims); }
static const int64_t D2[1] = {2}, D3[1] = {3}, D42[2] = {4, 2};

/* (c; x) -> (c + x; c * x): a running sum and the products along the way */
static nb_graph *sum_body(nb_dtype t) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *c = nb_graph_input(b, "c", av(t, 1, D2)), *x = nb_graph_input(b, "x", av(t, 1, D2));
  nb_graph_output(b, "c", nb_add(c, x));
  nb_graph_output(b, "y", nb_mul(c, x));
  return b;
}

/* Runs g on the arrays in[] (borrowed); out[] receive new references. */
static nb_status run(const nb_graph *g, nb_array *const *in, nb_array **out) {
  nb_status st = nb_graph_run_flat(ctx, g, in, out);
  if (st) fprintf(stderr, "run: %s\n", nb_ctx_error(ctx));
  return st;
}

/* ---------------------------------------------------------------- values */

static void test_scan_values(void) {
  for (int rev = 0; rev < 2; rev++) {
    nb_graph *body = sum_body(NB_F64), *g = nb_graph_create(ctx);
    nb_val *c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2)), *xs = nb_graph_input(g, "xs", av(NB_F64, 2, D42)), *c, *ys;
    nb_scan_opts o = {.reverse = rev, .unroll = 2};
    CHECK_OK(ctx, nb_scan(g, body, 0, NULL, 1, &c0, 1, &xs, &o, &c, &ys));
    nb_graph_output(g, "c", c);
    nb_graph_output(g, "ys", ys);
    nb_array *in[2] = {nb_array_from_f64(ctx, NB_F64, 1, D2, (double[]){1, 10}),
                       nb_array_from_f64(ctx, NB_F64, 2, D42, (double[]){1, 2, 3, 4, 5, 6, 7, 8})};
    nb_array *out[2] = {NULL, NULL};
    if (run(g, in, out) == NB_OK) {
      nb_test_check_values(ctx, "scan carry", out[0], NB_F64, 1, D2, (double[]){17, 30});
      /* forward: c = (1,10),(2,12),(5,16),(10,22); reverse visits rows 3,2,1,0 */
      const double fwd[8] = {1, 20, 6, 48, 25, 96, 70, 176}, bwd[8] = {16, 56, 39, 96, 40, 108, 7, 80};
      nb_test_check_values(ctx, rev ? "reverse scan ys" : "scan ys", out[1], NB_F64, 2, D42, rev ? bwd : fwd);
    }
    char *text = nb_graph_to_string(g);
    CHECK_MSG(text && strstr(text, rev ? "scan[length=4 nconsts=0 ncarry=1 reverse=1 unroll=2 body=#" : "reverse=0 unroll=2"),
              "printed: %s", text);
    free(text);
    double flops, bytes, bf, bb;
    nb_graph_cost(g, &flops, &bytes);
    nb_graph_cost(body, &bf, &bb);
    CHECK_MSG(flops == 4 * bf && bf > 0, "scan cost %g flops, body %g", flops, bf);
    for (int i = 0; i < 2; i++) nb_array_release(in[i]);
    nb_graph_destroy(body);
    nb_graph_destroy(g);
  }
}

/* A scan with no xs takes its trip count from opts; the body's ys still stack. */
static void test_scan_length_only(void) {
  nb_graph *body = nb_graph_create(ctx);
  nb_val *c = nb_graph_input(body, "c", av(NB_I32, 0, NULL));
  nb_graph_output(body, "c", nb_mul(c, nb_scalar(body, NB_I32, 2)));
  nb_graph_output(body, "y", c);
  nb_graph *g = nb_graph_create(ctx);
  nb_val *c0 = nb_graph_input(g, "c0", av(NB_I32, 0, NULL)), *cT, *ys;
  nb_scan_opts o = {.length = 5};
  CHECK_OK(ctx, nb_scan(g, body, 0, NULL, 1, &c0, 0, NULL, &o, &cT, &ys));
  nb_graph_output(g, "c", cT);
  nb_graph_output(g, "ys", ys);
  nb_array *in = nb_array_scalar(ctx, NB_I32, 3), *out[2] = {NULL, NULL};
  if (run(g, &in, out) == NB_OK) {
    nb_test_check_values(ctx, "doubling carry", out[0], NB_I32, 0, NULL, (double[]){96});
    nb_test_check_values(ctx, "doubling ys", out[1], NB_I32, 1, (int64_t[]){5}, (double[]){3, 6, 12, 24, 48});
  }
  nb_array_release(in);
  nb_graph_destroy(body);
  nb_graph_destroy(g);
}

static nb_graph *scale_branch(double k) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", av(NB_F32, 1, D3));
  nb_graph_output(b, "y", nb_mul(x, nb_scalar(b, NB_F32, k)));
  return b;
}

static void test_switch_values(void) {
  const nb_graph *br[3] = {scale_branch(10), scale_branch(20), scale_branch(30)};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *i = nb_graph_input(g, "i", av(NB_I64, 0, NULL)), *x = nb_graph_input(g, "x", av(NB_F32, 1, D3)), *y;
  CHECK_OK(ctx, nb_switch(g, i, 3, br, 1, &x, &y));
  nb_graph_output(g, "y", y);
  nb_array *xa = nb_array_from_f64(ctx, NB_F32, 1, D3, (double[]){1, 2, 3});
  const int64_t idx[5] = {-5, 0, 1, 2, 7};
  const double want[5] = {10, 10, 20, 30, 30}; /* clamped like lax.switch */
  for (int k = 0; k < 5; k++) {
    nb_array *in[2] = {nb_array_scalar(ctx, NB_I64, (double)idx[k]), xa}, *out = NULL;
    if (run(g, in, &out) == NB_OK)
      nb_test_check_values(ctx, "switch", out, NB_F32, 1, D3, (double[]){want[k], 2 * want[k], 3 * want[k]});
    nb_array_release(in[0]);
  }
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "cond[nbranches=3 branch0=#") && strstr(text, "branch2=#"), "printed: %s", text);
  free(text);
  nb_array_release(xa);
  nb_graph_destroy(g);

  /* cond(pred): on_true when it holds */
  g = nb_graph_create(ctx);
  nb_val *p = nb_graph_input(g, "p", av(NB_BOOL, 0, NULL));
  x = nb_graph_input(g, "x", av(NB_F32, 1, D3));
  CHECK_OK(ctx, nb_cond(g, p, br[1], br[0], 1, &x, &y));
  nb_graph_output(g, "y", y);
  xa = nb_array_from_f64(ctx, NB_F32, 1, D3, (double[]){1, 1, 1});
  for (int k = 0; k < 2; k++) {
    nb_array *in[2] = {nb_array_scalar(ctx, NB_BOOL, k), xa}, *out = NULL;
    if (run(g, in, &out) == NB_OK) nb_test_check_values(ctx, "cond", out, NB_F32, 1, D3, k ? (double[]){20, 20, 20} : (double[]){10, 10, 10});
    nb_array_release(in[0]);
  }
  nb_array_release(xa);
  nb_graph_destroy(g);
  for (int k = 0; k < 3; k++) nb_graph_destroy((nb_graph *)br[k]);
}

/* Collatz steps of n: while n != 1: n = n even ? n / 2 : 3n + 1; count++. */
static void test_while_values(void) {
  nb_aval s = av(NB_I32, 0, NULL);
  nb_graph *cond = nb_graph_create(ctx);
  nb_val *n = nb_graph_input(cond, "n", s);
  nb_graph_input(cond, "count", s);
  nb_graph_output(cond, "go", nb_ne(n, nb_scalar(cond, NB_I32, 1)));
  nb_graph *body = nb_graph_create(ctx);
  n = nb_graph_input(body, "n", s);
  nb_val *count = nb_graph_input(body, "count", s);
  nb_val *even = nb_eq(nb_rem(n, nb_scalar(body, NB_I32, 2)), nb_scalar(body, NB_I32, 0));
  nb_graph_output(body, "n", nb_select(even, nb_div(n, nb_scalar(body, NB_I32, 2)), nb_add(nb_mul(n, nb_scalar(body, NB_I32, 3)), nb_scalar(body, NB_I32, 1))));
  nb_graph_output(body, "count", nb_add(count, nb_scalar(body, NB_I32, 1)));
  nb_graph *g = nb_graph_create(ctx);
  nb_val *init[2] = {nb_graph_input(g, "n", s), nb_scalar(g, NB_I32, 0)}, *outs[2];
  CHECK_OK(ctx, nb_while_loop(g, cond, body, 0, NULL, 0, NULL, 2, init, outs));
  nb_graph_output(g, "count", outs[1]);
  const int start[3] = {1, 6, 27}, steps[3] = {0, 8, 111};
  for (int k = 0; k < 3; k++) {
    nb_array *in = nb_array_scalar(ctx, NB_I32, start[k]), *out = NULL;
    if (run(g, &in, &out) == NB_OK) nb_test_check_values(ctx, "collatz steps", out, NB_I32, 0, NULL, (double[]){steps[k]});
    nb_array_release(in);
  }
  nb_graph_destroy(cond);
  nb_graph_destroy(body);
  nb_graph_destroy(g);
}

/* (i; x) -> x * 2 + i: the same values through the scan (constant bounds) and
 * the while_loop (traced bounds) forms. */
static void test_fori_values(void) {
  nb_graph *body = nb_graph_create(ctx);
  nb_val *i = nb_graph_input(body, "i", av(NB_I32, 0, NULL)), *x = nb_graph_input(body, "x", av(NB_F64, 0, NULL));
  nb_graph_output(body, "x", nb_add(nb_mul(x, nb_scalar(body, NB_F64, 2)), nb_convert(i, NB_F64)));
  for (int traced = 0; traced < 2; traced++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x0 = nb_graph_input(g, "x", av(NB_F64, 0, NULL)), *y;
    nb_val *lo = traced ? nb_graph_input(g, "lo", av(NB_I64, 0, NULL)) : nb_scalar(g, NB_I64, 2);
    nb_val *hi = traced ? nb_graph_input(g, "hi", av(NB_I32, 0, NULL)) : nb_scalar(g, NB_I32, 5);
    CHECK_OK(ctx, nb_fori_loop(g, lo, hi, body, 0, NULL, 1, &x0, &y));
    nb_graph_output(g, "y", y);
    char *text = nb_graph_to_string(g);
    CHECK_MSG(text && strstr(text, traced ? "while_loop[" : "scan[length=3"), "fori_loop printed: %s", text);
    free(text);
    nb_array *in[3] = {nb_array_scalar(ctx, NB_F64, 1), nb_array_scalar(ctx, NB_I64, 2), nb_array_scalar(ctx, NB_I32, 5)};
    nb_array *out = NULL;
    /* x: 1 -> 4 -> 11 -> 26 */
    if (run(g, in, &out) == NB_OK) nb_test_check_values(ctx, traced ? "fori (while)" : "fori (scan)", out, NB_F64, 0, NULL, (double[]){26});
    for (int k = 0; k < 3; k++) nb_array_release(in[k]);
    nb_graph_destroy(g);
  }
  /* empty range: the carry passes through */
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x0 = nb_graph_input(g, "x", av(NB_F64, 0, NULL)), *y;
  CHECK_OK(ctx, nb_fori_loop(g, nb_scalar(g, NB_I32, 4), nb_scalar(g, NB_I32, 1), body, 0, NULL, 1, &x0, &y));
  CHECK(y == x0);
  nb_graph_destroy(g);
  nb_graph_destroy(body);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void) {
  nb_graph *body = sum_body(NB_F64), *body32 = sum_body(NB_F32);
  nb_graph *g = nb_graph_create(ctx);
  nb_val *c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2)), *xs = nb_graph_input(g, "xs", av(NB_F64, 2, D42)), *c, *ys;
  nb_scan_opts five = {.length = 5};
  CHECK(nb_scan(g, body, 0, NULL, 1, &c0, 1, &xs, &five, &c, &ys) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_graph_error(g), "leading dimension must be the scan length 5"), "%s", nb_graph_error(g));
  CHECK(nb__is_poison(c) && nb__is_poison(ys));
  nb_graph_destroy(g);

  g = nb_graph_create(ctx);
  c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2));
  CHECK(nb_scan(g, body, 0, NULL, 1, &c0, 0, NULL, NULL, &c, &ys) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_graph_error(g), "opts->length"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);

  /* carry in f64, body made for f32 */
  g = nb_graph_create(ctx);
  c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2));
  xs = nb_graph_input(g, "xs", av(NB_F64, 2, D42));
  CHECK(nb_scan(g, body32, 0, NULL, 1, &c0, 1, &xs, NULL, &c, &ys) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_graph_error(g), "body input 0 ('c') is f32[2] but its operand is f64[2]"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);

  /* a body whose carry changes aval */
  nb_graph *grow = nb_graph_create(ctx);
  nb_val *gc = nb_graph_input(grow, "c", av(NB_F64, 1, D2));
  nb_graph_output(grow, "c", nb_convert(gc, NB_F32));
  g = nb_graph_create(ctx);
  c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2));
  CHECK(nb_scan(g, grow, 0, NULL, 1, &c0, 0, NULL, &five, &c, NULL) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_graph_error(g), "carry output 0 ('c') is f32[2] but the carry input is f64[2]"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  nb_graph *yes = nb_graph_create(ctx);
  nb_graph_input(yes, "c", av(NB_F64, 1, D2));
  nb_graph_output(yes, "go", nb_scalar(yes, NB_BOOL, 1));
  c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2));
  CHECK(nb_while_loop(g, yes, grow, 0, NULL, 0, NULL, 1, &c0, &c) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_graph_error(g), "the carry keeps its avals"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  /* a cond that is not a bool scalar */
  g = nb_graph_create(ctx);
  c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2));
  CHECK(nb_while_loop(g, grow, grow, 0, NULL, 0, NULL, 1, &c0, &c) == NB_ERR_DTYPE);
  CHECK_MSG(strstr(nb_graph_error(g), "cond must return one bool scalar"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);

  /* branches that disagree; a non-bool predicate; a float index */
  nb_graph *b64 = nb_graph_create(ctx), *b32 = nb_graph_create(ctx);
  nb_graph_output(b64, "y", nb_graph_input(b64, "x", av(NB_F64, 1, D2)));
  nb_graph_output(b32, "y", nb_convert(nb_graph_input(b32, "x", av(NB_F64, 1, D2)), NB_F32));
  g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", av(NB_F64, 1, D2)), *p = nb_graph_input(g, "p", av(NB_BOOL, 0, NULL)), *y;
  CHECK(nb_cond(g, p, b64, b32, 1, &x, &y) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_graph_error(g), "branch 1 output 0 ('y') is f64[2] but branch 0's is f32[2]"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  x = nb_graph_input(g, "x", av(NB_F64, 1, D2));
  CHECK(nb_cond(g, x, b64, b64, 1, &x, &y) == NB_ERR_DTYPE);
  CHECK_MSG(strstr(nb_graph_error(g), "the predicate must be a bool scalar, not f64[2]"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  x = nb_graph_input(g, "x", av(NB_F64, 1, D2));
  const nb_graph *two[2] = {b64, b64};
  CHECK(nb_switch(g, nb_scalar(g, NB_F32, 1), 2, two, 1, &x, &y) == NB_ERR_DTYPE);
  CHECK_MSG(strstr(nb_graph_error(g), "the index must be an integer scalar"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  x = nb_graph_input(g, "x", av(NB_F64, 1, D2));
  CHECK(nb_switch(g, nb_scalar(g, NB_I32, 1), 0, two, 1, &x, &y) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_graph_error(g), "needs 1 to 32 branches"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  /* an operand from another graph */
  nb_graph *other = nb_graph_create(ctx);
  nb_val *ox = nb_graph_input(other, "x", av(NB_F64, 1, D2));
  g = nb_graph_create(ctx);
  CHECK(nb_switch(g, nb_scalar(g, NB_I32, 0), 2, two, 1, &ox, &y) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_graph_error(g), "operand 0 belongs to another graph"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  nb_graph_destroy(other);
  /* fori_loop's body must take the i32 index after its consts */
  g = nb_graph_create(ctx);
  x = nb_graph_input(g, "x", av(NB_F64, 1, D2));
  CHECK(nb_fori_loop(g, nb_scalar(g, NB_I32, 0), nb_scalar(g, NB_I32, 3), b64, 0, NULL, 0, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_graph_error(g), "body must take 0 consts, the i32 scalar index"), "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  nb_graph_destroy(b64);
  nb_graph_destroy(b32);
  nb_graph_destroy(yes);
  nb_graph_destroy(grow);
  nb_graph_destroy(body);
  nb_graph_destroy(body32);
}

int main(void) {
  ctx = nb_ctx_create();
  size_t base = nb_ctx_bytes_in_use(ctx);
  test_scan_values();
  test_scan_length_only();
  test_switch_values();
  test_while_values();
  test_fori_values();
  test_errors();
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx) - base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/control");
}
