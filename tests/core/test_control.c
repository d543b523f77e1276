/* Control flow (cond/switch, while_loop, scan, fori_loop): values by hand,
 * shape-rule errors, printed params and cost; a remat region and a
 * custom_vjp call inside a scan body under grad (and jvp of jvp). The primitive table
 * (tests/lib/cases_control.c) runs the same primitives through the generic
 * evaluation, derivative and vmap checks. */
#include "core/ir.h"
#include "core/prims/params.h"
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

/* Zero trips: the carry passes through, ys are empty; grad too. */
static void test_scan_zero_length(void) {
  nb_graph *body = sum_body(NB_F64), *g = nb_graph_create(ctx);
  const int64_t d02[2] = {0, 2};
  nb_val *c0 = nb_graph_input(g, "c0", av(NB_F64, 1, D2)), *xs = nb_graph_input(g, "xs", av(NB_F64, 2, d02)), *c, *ys;
  CHECK_OK(ctx, nb_scan(g, body, 0, NULL, 1, &c0, 1, &xs, NULL, &c, &ys));
  nb_graph_output(g, "loss", nb_reduce_sum(nb_mul(c, c), 0, NULL));
  nb_graph_output(g, "ys", ys);
  nb_grad_opts aux = {.has_aux = true};
  nb_graph *dg = nb_grad(ctx, g, &aux);
  CHECK_MSG(dg, "%s", nb_ctx_error(ctx));
  nb_array *in[2] = {nb_array_from_f64(ctx, NB_F64, 1, D2, (double[]){1, 2}), nb_array_zeros(ctx, NB_F64, 2, d02)};
  nb_array *out[3] = {NULL, NULL, NULL};
  if (dg && run(dg, in, out) == NB_OK) {
    /* outputs: aux/ys, grad/c0, grad/xs */
    CHECK(nb_array_size(out[0]) == 0 && nb_array_size(out[2]) == 0);
    nb_test_check_values(ctx, "grad through zero trips", out[1], NB_F64, 1, D2, (double[]){2, 4});
    nb_array_release(out[0]);
    nb_array_release(out[2]);
  }
  for (int i = 0; i < 2; i++) nb_array_release(in[i]);
  nb_graph_destroy(dg);
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

/* ---------------------------------------------------------------- JAX goldens */

static const int64_t G3[1] = {3};

/* Traces fn on `in`, transforms it (0: none, 1: grad, 2: jvp, 3: vmap with
 * in_axes from `axes`), runs it on `in` and returns the outputs (a new tree). */
typedef enum { RUN_PLAIN, RUN_GRAD, RUN_JVP } run_kind;
static nb_tree *trace_run(nb_trace_fn fn, void *user, const nb_tree *spec, const nb_tree *in, run_kind kind) {
  nb_graph *g = nb_trace(ctx, fn, user, spec), *t = g;
  if (g && kind == RUN_GRAD) t = nb_grad(ctx, g, NULL);
  if (g && kind == RUN_JVP) t = nb_jvp(ctx, g);
  nb_tree *out = nb_tree_create(ctx);
  if (!t || nb_graph_run(ctx, t, in, out) != NB_OK) {
    fprintf(stderr, "trace_run: %s\n", nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    nb_tree_destroy(out);
    out = NULL;
  }
  if (t != g) nb_graph_destroy(t);
  nb_graph_destroy(g);
  return out;
}

/* out[path] against golden member `key` of j, within tol. */
static void check_golden(const char *what, const nb_tree *out, const char *path, const cJSON *j, const char *key, double tol) {
  nb_array *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(j, key));
  nb_array *got = out ? nb_tree_get_array(out, path) : NULL;
  char name[160];
  snprintf(name, sizeof name, "%s: %s", what, path);
  CHECK_MSG(got && want && nb_test_arrays_close(name, got, want, tol), "%s", name);
  nb_array_release(want);
}

static void set_golden(nb_tree *t, const char *path, const cJSON *j, const char *key) {
  nb_array *a = nb_test_golden_array(ctx, cJSON_GetObjectItem(j, key));
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

/* scan body (w; h; x) -> (tanh(h w + x); h x), as make_control.py's rnn */
static nb_graph *rnn_body(void) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(b, "w", av(NB_F64, 1, G3)), *h = nb_graph_input(b, "h", av(NB_F64, 1, G3));
  nb_val *x = nb_graph_input(b, "x", av(NB_F64, 1, G3));
  nb_graph_output(b, "h", nb_tanh(nb_add(nb_mul(h, w), x)));
  nb_graph_output(b, "y", nb_mul(h, x));
  return b;
}

typedef struct rnn_args {
  bool reverse, loss;
  nb_array *wh, *wy; /* loss = sum(wh hT) + sum(wy ys) */
  const nb_graph *dloss; /* for the Hessian-vector product: grad of the loss */
} rnn_args;

static nb_status f_rnn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const rnn_args *a = user;
  nb_graph *body = rnn_body();
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *xs = nb_tree_get_val(in, "xs"), *hT, *ys;
  nb_scan_opts o = {.reverse = a->reverse};
  nb_status st = nb_scan(g, body, 1, &w, 1, &h, 1, &xs, &o, &hT, &ys);
  nb_graph_destroy(body);
  if (st) return st;
  if (!a->loss) {
    st = nb_tree_set_val(out, "hT", hT);
    return st ? st : nb_tree_set_val(out, "ys", ys);
  }
  nb_val *l = nb_add(nb_reduce_sum(nb_mul(nb_const(g, a->wh), hT), 0, NULL), nb_reduce_sum(nb_mul(nb_const(g, a->wy), ys), 0, NULL));
  return nb_tree_set_val(out, "loss", l);
}

/* vdot(grad_w loss(w, h, xs), v): its gradient in w is a Hessian-vector product */
static nb_status f_grad_dot_v(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const rnn_args *a = user;
  nb_tree *inner = nb_tree_select_prefix(in, "", false), *res = nb_tree_create(ctx);
  nb_tree_remove(inner, "v");
  nb_status st = nb_graph_call(g, a->dloss, inner, res);
  if (st == NB_OK)
    st = nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_tree_get_val(res, "grad/w"), nb_tree_get_val(in, "v")), 0, NULL));
  nb_tree_destroy(inner);
  nb_tree_destroy(res);
  return st;
}

static void golden_scan(const cJSON *c) {
  rnn_args a = {.reverse = cJSON_IsTrue(cJSON_GetObjectItem(c, "reverse"))};
  const char *what = a.reverse ? "golden reverse scan" : "golden scan";
  nb_tree *in = nb_tree_create(ctx);
  set_golden(in, "w", c, "w");
  set_golden(in, "h", c, "h");
  set_golden(in, "xs", c, "xs");
  nb_tree *out = trace_run(f_rnn, &a, in, in, RUN_PLAIN);
  check_golden(what, out, "hT", c, "hT", 1e-13);
  check_golden(what, out, "ys", c, "ys", 1e-13);
  nb_tree_destroy(out);
  a.loss = true;
  a.wh = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "wh"));
  a.wy = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "wy"));
  out = trace_run(f_rnn, &a, in, in, RUN_GRAD);
  check_golden(what, out, "grad/w", c, "grad_w", 1e-12);
  check_golden(what, out, "grad/h", c, "grad_h", 1e-12);
  check_golden(what, out, "grad/xs", c, "grad_xs", 1e-12);
  nb_tree_destroy(out);
  /* grad of grad: d/dw <grad_w loss, v> */
  nb_graph *g = nb_trace(ctx, f_rnn, &a, in);
  nb_grad_opts wrt_w = {.wrt = "w"};
  nb_graph *dg = g ? nb_grad(ctx, g, &wrt_w) : NULL;
  CHECK_MSG(dg, "grad: %s", nb_ctx_error(ctx));
  a.dloss = dg;
  set_golden(in, "v", c, "v");
  if (dg) {
    nb_graph *h = nb_trace(ctx, f_grad_dot_v, &a, in), *dh = h ? nb_grad(ctx, h, &wrt_w) : NULL;
    nb_tree *res = nb_tree_create(ctx);
    CHECK_MSG(dh && nb_graph_run(ctx, dh, in, res) == NB_OK, "hvp: %s", nb_ctx_error(ctx));
    check_golden(what, res, "grad/w", c, "hvp_w", 1e-11);
    nb_tree_destroy(res);
    nb_graph_destroy(h);
    nb_graph_destroy(dh);
  }
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
  nb_array_release(a.wh);
  nb_array_release(a.wy);
  nb_tree_destroy(in);
}

/* (x) -> sin(x) * 2 ; (x) -> cos(x) * x ; (x) -> exp(x) / 2 ; (x) -> sin(x) */
static nb_graph *unary_branch(int which) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", av(NB_F64, 1, G3)), *y;
  switch (which) {
  case 0: y = nb_mul(nb_sin(x), nb_scalar(b, NB_F64, 2)); break;
  case 1: y = nb_mul(nb_cos(x), x); break;
  case 2: y = nb_div(nb_exp(x), nb_scalar(b, NB_F64, 2)); break;
  default: y = nb_sin(x); break;
  }
  nb_graph_output(b, "y", y);
  return b;
}

typedef struct cond_args {
  nb_array *wx; /* with wx: the output is loss = sum(wx y) */
  int index;    /* switch: the (constant) index; -100: cond on p > 0 */
} cond_args;

static nb_status f_cond(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const cond_args *a = user;
  nb_val *x = nb_tree_get_val(in, "x"), *y;
  nb_status st;
  if (a->index == -100) {
    nb_graph *t = unary_branch(0), *f = unary_branch(1);
    nb_val *p = nb_tree_get_val(in, "p");
    st = nb_cond(g, nb_gt(p, nb_scalar(g, NB_F64, 0)), t, f, 1, &x, &y);
    y = nb_mul(p, y);
    nb_graph_destroy(t);
    nb_graph_destroy(f);
  } else {
    const nb_graph *br[3] = {unary_branch(3), unary_branch(1), unary_branch(2)};
    st = nb_switch(g, nb_scalar(g, NB_I32, a->index), 3, br, 1, &x, &y);
    for (int k = 0; k < 3; k++) nb_graph_destroy((nb_graph *)br[k]);
  }
  if (st) return st;
  return a->wx ? nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_const(g, a->wx), y), 0, NULL)) : nb_tree_set_val(out, "y", y);
}

static void golden_cond(const cJSON *c, int index) {
  cond_args a = {NULL, index};
  nb_tree *in = nb_tree_create(ctx);
  set_golden(in, "x", c, "x");
  if (index == -100) set_golden(in, "p", c, "p");
  char what[64];
  snprintf(what, sizeof what, index == -100 ? "golden cond" : "golden switch(%d)", index);
  nb_tree *out = trace_run(f_cond, &a, in, in, RUN_PLAIN);
  check_golden(what, out, "y", c, "y", 1e-14);
  nb_tree_destroy(out);
  a.wx = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "wx"));
  out = trace_run(f_cond, &a, in, in, RUN_GRAD);
  check_golden(what, out, "grad/x", c, "grad_x", 1e-13);
  if (index == -100) check_golden(what, out, "grad/p", c, "grad_p", 1e-13);
  nb_tree_destroy(out);
  nb_array_release(a.wx);
  nb_tree_destroy(in);
}

/* fori_loop(1, 4): x = sin(x) w + i / 4 */
static nb_status f_fori(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *bw = nb_graph_input(b, "w", av(NB_F64, 1, G3)), *bi = nb_graph_input(b, "i", av(NB_I32, 0, NULL));
  nb_val *bx = nb_graph_input(b, "x", av(NB_F64, 1, G3));
  nb_graph_output(b, "x", nb_add(nb_mul(nb_sin(bx), bw), nb_div(nb_convert(bi, NB_F64), nb_scalar(b, NB_F64, 4))));
  nb_val *w = nb_tree_get_val(in, "w"), *x = nb_tree_get_val(in, "x"), *y;
  nb_status st = nb_fori_loop(g, nb_scalar(g, NB_I32, 1), nb_scalar(g, NB_I32, 4), b, 1, &w, 1, &x, &y);
  nb_graph_destroy(b);
  if (st) return st;
  return user ? nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_const(g, user), y), 0, NULL)) : nb_tree_set_val(out, "y", y);
}

static void golden_fori(const cJSON *c) {
  nb_tree *in = nb_tree_create(ctx);
  set_golden(in, "w", c, "w");
  set_golden(in, "x", c, "x");
  nb_tree *out = trace_run(f_fori, NULL, in, in, RUN_PLAIN);
  check_golden("golden fori_loop", out, "y", c, "y", 1e-14);
  nb_tree_destroy(out);
  nb_array *wx = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "wx"));
  out = trace_run(f_fori, wx, in, in, RUN_GRAD);
  check_golden("golden fori_loop", out, "grad/w", c, "grad_w", 1e-13);
  check_golden("golden fori_loop", out, "grad/x", c, "grad_x", 1e-13);
  nb_tree_destroy(out);
  nb_array_release(wx);
  nb_tree_destroy(in);
}

/* while sum(x) < 6: x = x + 1 + sin(x) k */
static nb_status f_while(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_graph *c = nb_graph_create(ctx), *b = nb_graph_create(ctx);
  nb_val *cx = nb_graph_input(c, "x", av(NB_F64, 1, G3));
  nb_graph_output(c, "go", nb_lt(nb_reduce_sum(cx, 0, NULL), nb_scalar(c, NB_F64, 6)));
  nb_val *bk = nb_graph_input(b, "k", av(NB_F64, 0, NULL)), *bx = nb_graph_input(b, "x", av(NB_F64, 1, G3));
  nb_graph_output(b, "x", nb_add(nb_add(bx, nb_scalar(b, NB_F64, 1)), nb_mul(nb_sin(bx), bk)));
  nb_val *k = nb_tree_get_val(in, "k"), *x = nb_tree_get_val(in, "x"), *y;
  nb_status st = nb_while_loop(g, c, b, 0, NULL, 1, &k, 1, &x, &y);
  nb_graph_destroy(c);
  nb_graph_destroy(b);
  if (st) return st;
  return nb_tree_set_val(out, user ? "loss" : "y", user ? nb_reduce_sum(y, 0, NULL) : y);
}

static void golden_while(const cJSON *c) {
  nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx);
  set_golden(spec, "k", c, "k");
  set_golden(spec, "x", c, "x");
  set_golden(in, "primal/k", c, "k");
  set_golden(in, "primal/x", c, "x");
  set_golden(in, "tangent/k", c, "tk");
  set_golden(in, "tangent/x", c, "tx");
  nb_tree *out = trace_run(f_while, NULL, spec, in, RUN_JVP);
  check_golden("golden while_loop jvp", out, "primal/y", c, "y", 1e-14);
  check_golden("golden while_loop jvp", out, "tangent/y", c, "ty", 1e-13);
  nb_tree_destroy(out);
  /* reverse mode is refused with a message that names the alternatives */
  nb_graph *g = nb_trace(ctx, f_while, &ctx, spec);
  CHECK(g && nb_grad(ctx, g, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "use fori_loop with constant bounds, or scan");
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
}

static nb_status f_call(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) { return nb_graph_call(g, user, in, out); }

/* vmap(f) of a traced f, with in_axis 0 for the inputs named in `batched`
 * (others unbatched), run on `in`. */
static nb_tree *vmap_run(nb_trace_fn fn, void *user, const nb_tree *spec, const nb_tree *in, const char *unbatched, int64_t n) {
  nb_graph *g = nb_trace(ctx, fn, user, spec);
  nb_tree *axes = nb_tree_create(ctx);
  nb_array *minus1 = nb_array_scalar(ctx, NB_I32, -1);
  for (const char *p = unbatched; p && *p; p += strlen(p) + 1) nb_tree_set_array(axes, p, minus1);
  nb_vmap_opts o = {.in_axis = 0, .out_axis = 0, .in_axes = axes, .axis_size = n};
  nb_graph *v = g ? nb_vmap(ctx, g, &o) : NULL;
  nb_tree *out = trace_run(f_call, v, in, in, RUN_PLAIN);
  nb_array_release(minus1);
  nb_tree_destroy(axes);
  nb_graph_destroy(v);
  nb_graph_destroy(g);
  return out;
}

static void golden_vmap(const cJSON *jc, const cJSON *js) {
  /* cond with a batched predicate: a select of both branches */
  cond_args a = {NULL, -100};
  nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx);
  nb_tree_set(spec, "p", nb_leaf_aval(av(NB_F64, 0, NULL)));
  nb_tree_set(spec, "x", nb_leaf_aval(av(NB_F64, 1, G3)));
  set_golden(in, "p", jc, "p");
  set_golden(in, "x", jc, "x");
  nb_tree *out = vmap_run(f_cond, &a, spec, in, NULL, 4);
  check_golden("golden vmap(cond)", out, "y", jc, "y", 1e-14);
  nb_tree_destroy(out);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
  /* scan with a batched carry, shared w and xs */
  rnn_args r = {0};
  spec = nb_tree_create(ctx), in = nb_tree_create(ctx);
  nb_tree_set(spec, "w", nb_leaf_aval(av(NB_F64, 1, G3)));
  nb_tree_set(spec, "h", nb_leaf_aval(av(NB_F64, 1, G3)));
  nb_tree_set(spec, "xs", nb_leaf_aval(av(NB_F64, 2, (int64_t[]){4, 3})));
  set_golden(in, "w", js, "w");
  set_golden(in, "h", js, "h");
  set_golden(in, "xs", js, "xs");
  out = vmap_run(f_rnn, &r, spec, in, "w\0xs\0", 5);
  check_golden("golden vmap(scan)", out, "hT", js, "hT", 1e-13);
  check_golden("golden vmap(scan)", out, "ys", js, "ys", 1e-13);
  nb_tree_destroy(out);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
}

static void test_goldens(void) {
  cJSON *j = nb_test_golden_load("tests/core/golden/control.json");
  CHECK(j != NULL);
  if (!j) return;
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "scan")) golden_scan(c);
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cond")) golden_cond(c, -100);
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "switch")) golden_cond(c, (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "i")));
  golden_fori(cJSON_GetObjectItem(j, "fori"));
  golden_while(cJSON_GetObjectItem(j, "while_jvp"));
  golden_vmap(cJSON_GetObjectItem(j, "vmap_cond"), cJSON_GetObjectItem(j, "vmap_scan"));
  cJSON_Delete(j);
}

/* The reverse pass of a scan stores the forward pass's residuals: grad has
 * one forward scan (no second primal scan) and one transposed scan. */
static void test_grad_structure(void) {
  rnn_args a = {.loss = true};
  a.wh = nb_array_ones(ctx, NB_F64, 1, G3);
  a.wy = nb_array_ones(ctx, NB_F64, 2, (int64_t[]){4, 3});
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "w", nb_leaf_aval(av(NB_F64, 1, G3)));
  nb_tree_set(spec, "h", nb_leaf_aval(av(NB_F64, 1, G3)));
  nb_tree_set(spec, "xs", nb_leaf_aval(av(NB_F64, 2, (int64_t[]){4, 3})));
  nb_graph *g = nb_trace(ctx, f_rnn, &a, spec), *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  char *text = dg ? nb_graph_to_string(dg) : NULL;
  int nscan = 0, nrev = 0;
  for (const char *p = text; p && (p = strstr(p, "= scan[")); p++) nscan++;
  for (const char *p = text; p && (p = strstr(p, "reverse=1")); p++) nrev++;
  CHECK_MSG(nscan == 2 && nrev == 1, "grad of a scan has %d scans (%d reversed):\n%s", nscan, nrev, text ? text : nb_ctx_error(ctx));
  free(text);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_array_release(a.wh);
  nb_array_release(a.wy);
}

/* A residual that depends on the consts only (exp(w) here, which the
 * tangent of h exp(w) needs) is computed once before the loop, not stacked
 * per iteration: it shows as a top-level exp in the grad graph (carried
 * bodies print as hashes). The derivatives are checked against finite
 * differences, to second order. */
static nb_status f_invariant(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *bw = nb_graph_input(b, "w", av(NB_F64, 1, G3)), *bh = nb_graph_input(b, "h", av(NB_F64, 1, G3));
  nb_val *bx = nb_graph_input(b, "x", av(NB_F64, 1, G3));
  nb_graph_output(b, "h", nb_tanh(nb_add(nb_mul(bh, nb_exp(bw)), bx)));
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *xs = nb_tree_get_val(in, "xs"), *hT;
  nb_status st = nb_scan(g, b, 1, &w, 1, &h, 1, &xs, NULL, &hT, NULL);
  nb_graph_destroy(b);
  return st ? st : nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(hT, hT), 0, NULL));
}

static void test_hoisted_residuals(void) {
  nb_test_rng rng = {99};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "w", NB_F64, 1, G3);
  nb_test_set_randn(in, &rng, "h", NB_F64, 1, G3);
  nb_test_set_randn(in, &rng, "xs", NB_F64, 2, (int64_t[]){5, 3});
  nb_graph *g = nb_trace(ctx, f_invariant, NULL, in), *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  char *text = dg ? nb_graph_to_string(dg) : NULL;
  CHECK_MSG(text && strstr(text, "= exp %"), "exp(w) is not hoisted out of the scan:\n%s", text ? text : nb_ctx_error(ctx));
  free(text);
  CHECK(nb_test_check_grads(ctx, "scan with a loop-invariant residual", f_invariant, NULL, in, 1e-6, true));
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- remat and custom_vjp inside a body */

/* The region of the body: (w, h, x) -> h' = tanh(h w + x) w + sin(h), whose
 * derivative reads tanh's output and cos(h), residuals a plain scan stores per
 * step. As a remat region its only residuals are its inputs (w and x are
 * passed through, h is stacked) and the reverse scan recomputes it, as
 * jax.checkpoint inside lax.scan. */
static nb_status region_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "h", nb_add(nb_mul(nb_tanh(nb_add(nb_mul(h, w), x)), w), nb_sin(h)));
}

/* custom_vjp's bwd: twice the true gradient, so that using it shows */
static nb_status region_bwd(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *x = nb_tree_get_val(in, "x");
  nb_val *ct = nb_mul(nb_tree_get_val(in, "ct/h"), nb_scalar(g, NB_F64, 2));
  nb_val *t = nb_tanh(nb_add(nb_mul(h, w), x)), *dt = nb_sub(nb_scalar(g, NB_F64, 1), nb_mul(t, t));
  nb_status st = nb_tree_set_val(out, "grad/h", nb_mul(ct, nb_add(nb_mul(nb_mul(w, w), dt), nb_cos(h))));
  if (!st) st = nb_tree_set_val(out, "grad/w", nb_mul(ct, nb_add(nb_mul(nb_mul(w, h), dt), t)));
  return st ? st : nb_tree_set_val(out, "grad/x", nb_mul(ct, nb_mul(w, dt)));
}

typedef enum { REGION_PLAIN, REGION_REMAT, REGION_CUSTOM_VJP } region_kind;
typedef struct region_args {
  region_kind kind;
  bool unrolled; /* a traced loop over the rows instead of a scan */
} region_args;

/* h' = region(w, h, x) called as kind, y = h' x */
static nb_status region_step(nb_graph *g, const region_args *a, nb_val *w, nb_val *h, nb_val *x, nb_val **h2, nb_val **y) {
  nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx), *res = nb_tree_create(ctx);
  nb_tree_set_val(in, "w", w);
  nb_tree_set_val(in, "h", h);
  nb_tree_set_val(in, "x", x);
  for (const char *const *p = (const char *const[]){"w", "h", "x", NULL}; *p; p++) nb_tree_set(spec, *p, nb_leaf_aval(av(NB_F64, 1, G3)));
  nb_graph *fwd = nb_trace(ctx, region_fn, NULL, spec), *bwd = NULL;
  if (a->kind == REGION_CUSTOM_VJP) {
    nb_tree_set(spec, "ct/h", nb_leaf_aval(av(NB_F64, 1, G3)));
    bwd = nb_trace(ctx, region_bwd, NULL, spec);
  }
  nb_status st = !fwd || (a->kind == REGION_CUSTOM_VJP && !bwd) ? nb_ctx_status(ctx)
                 : a->kind == REGION_PLAIN                      ? nb_graph_call(g, fwd, in, res)
                 : a->kind == REGION_REMAT                      ? nb_remat_call(g, fwd, in, res)
                                                                : nb_custom_vjp_call(g, fwd, bwd, in, res);
  if (!st) *h2 = nb_tree_get_val(res, "h"), *y = nb_mul(*h2, x);
  nb_graph_destroy(fwd);
  nb_graph_destroy(bwd);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
  nb_tree_destroy(res);
  return st;
}

static nb_status region_body(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *h2, *y;
  nb_status st = region_step(g, user, nb_tree_get_val(in, "a_w"), nb_tree_get_val(in, "b_h"), nb_tree_get_val(in, "c_x"), &h2, &y);
  if (!st) st = nb_tree_set_val(out, "a_h", h2);
  return st ? st : nb_tree_set_val(out, "b_y", y);
}

#define REGION_T 5

/* loss = sum(hT^2) + sum(ys^2) over a scan (or the unrolled loop) of the region */
static nb_status f_region_scan(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const region_args *a = user;
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *xs = nb_tree_get_val(in, "xs"), *ys = NULL;
  nb_status st = NB_OK;
  if (a->unrolled) {
    nb_val *rows[REGION_T];
    for (int64_t t = 0; !st && t < REGION_T; t++) {
      const int64_t start[2] = {t, 0}, limit[2] = {t + 1, 3}, row[2] = {1, 3};
      nb_val *x = nb_reshape(nb_slice(xs, start, limit, NULL), 1, G3);
      st = region_step(g, a, w, h, x, &h, &rows[t]);
      if (!st) rows[t] = nb_reshape(rows[t], 2, row);
    }
    if (!st) ys = nb_concatenate(REGION_T, rows, 0);
  } else {
    nb_tree *spec = nb_tree_create(ctx);
    for (const char *const *p = (const char *const[]){"a_w", "b_h", "c_x", NULL}; *p; p++) nb_tree_set(spec, *p, nb_leaf_aval(av(NB_F64, 1, G3)));
    nb_graph *body = nb_trace(ctx, region_body, (void *)a, spec);
    st = body ? nb_scan(g, body, 1, &w, 1, &h, 1, &xs, NULL, &h, &ys) : nb_ctx_status(ctx);
    nb_graph_destroy(body);
    nb_tree_destroy(spec);
  }
  if (st) return st;
  return nb_tree_set_val(out, "loss", nb_add(nb_reduce_sum(nb_mul(h, h), 0, NULL), nb_reduce_sum(nb_mul(ys, ys), 0, NULL)));
}

static nb_tree *region_inputs(void) {
  nb_test_rng rng = {1313};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "w", NB_F64, 1, G3);
  nb_test_set_randn(in, &rng, "h", NB_F64, 1, G3);
  nb_test_set_randn(in, &rng, "xs", NB_F64, 2, (int64_t[]){REGION_T, 3});
  return in;
}

static void check_same_grads(const char *what, const nb_tree *a, const nb_tree *b, double tol) {
  for (const char *const *p = (const char *const[]){"grad/w", "grad/h", "grad/xs", NULL}; *p; p++) {
    char name[160];
    snprintf(name, sizeof name, "%s: %s", what, *p);
    nb_array *x = a ? nb_tree_get_array(a, *p) : NULL, *y = b ? nb_tree_get_array(b, *p) : NULL;
    CHECK_MSG(x && y && nb_test_arrays_close(name, x, y, tol), "%s", name);
  }
}

/* The forward scan of grad(f) (the first scan of the graph): its number of
 * outputs and their total elements (the final carry, the ys and the stacked
 * residuals); and whether the reverse scan's body computes a tanh (recomputes
 * the region). */
static void grad_scans(const nb_graph *dg, int *nout, int64_t *elems, bool *recomputes) {
  *nout = 0, *elems = 0, *recomputes = false;
  for (size_t k = 0; k < nb__graph_neqns(dg); k++) {
    const nb_eqn *e = nb__graph_eqn(dg, k);
    if (e->prim != NB_PRIM_scan) continue;
    const nb_scan_params *sp = e->params;
    if (!sp->reverse && *nout == 0) {
      *nout = e->nout;
      for (int o = 0; o < e->nout; o++) *elems += nb_shape_size(&e->out[o]->aval.shape);
    }
    for (size_t j = 0; sp->reverse && j < nb__graph_neqns(sp->body); j++) *recomputes = *recomputes || nb__graph_eqn(sp->body, j)->prim == NB_PRIM_tanh;
  }
}

/* Is v computed from constants alone (literals, iota: equations without
 * operands, and what is computed from them)? */
static bool from_constants(const nb_val *v, int depth) {
  const nb_eqn *e = v->def;
  if (!e || depth > 64) return false;
  for (int i = 0; i < e->nin; i++)
    if (!from_constants(e->in[i], depth + 1)) return false;
  return true;
}

/* How many of the reverse scans' loop-invariant operands (consts) of dg are
 * computed from constants alone: such a value is better recomputed in the
 * body, where the compiler folds it into its kernels, than passed in at full
 * shape and read from memory on every iteration. */
static int reverse_scan_constant_consts(const nb_graph *dg) {
  int n = 0;
  for (size_t k = 0; k < nb__graph_neqns(dg); k++) {
    const nb_eqn *e = nb__graph_eqn(dg, k);
    if (e->prim != NB_PRIM_scan || !((const nb_scan_params *)e->params)->reverse) continue;
    for (int i = 0; i < ((const nb_scan_params *)e->params)->nconsts; i++) n += from_constants(e->in[i], 0);
  }
  return n;
}

/* grad of a scan whose body holds a remat region equals grad without remat
 * (and the unrolled loop's), matches finite differences (and second order:
 * the reverse scan's body is plain ops), stores the region's input and
 * output and recomputes the region in the reverse scan (the plain scan, its
 * region being elementwise, recomputes it from its input alone). */
static void test_remat_in_scan(void) {
  nb_tree *in = region_inputs();
  region_args plain = {REGION_PLAIN, false}, remat = {REGION_REMAT, false}, remat_unrolled = {REGION_REMAT, true};
  nb_tree *gp = trace_run(f_region_scan, &plain, in, in, RUN_GRAD), *gr = trace_run(f_region_scan, &remat, in, in, RUN_GRAD);
  nb_tree *gu = trace_run(f_region_scan, &remat_unrolled, in, in, RUN_GRAD);
  check_same_grads("remat in a scan vs plain scan", gr, gp, 1e-12);
  check_same_grads("remat in a scan vs unrolled remat", gr, gu, 1e-12);
  CHECK(nb_test_check_grads(ctx, "remat region in a scan body", f_region_scan, &remat, in, 1e-6, true));

  nb_graph *g0 = nb_trace(ctx, f_region_scan, &plain, in), *g1 = nb_trace(ctx, f_region_scan, &remat, in);
  nb_graph *d0 = g0 ? nb_grad(ctx, g0, NULL) : NULL, *d1 = g1 ? nb_grad(ctx, g1, NULL) : NULL;
  CHECK_MSG(d0 && d1, "%s", nb_ctx_error(ctx));
  if (d0 && d1) {
    int n0, n1;
    int64_t e0, e1;
    bool r0, r1;
    grad_scans(d0, &n0, &e0, &r0);
    grad_scans(d1, &n1, &e1, &r1);
    /* with remat: hT, ys and the stacked residuals: the region's input h
     * (w and x are passed through) and its output h' (y = h' x reads it) */
    CHECK_MSG(n1 == 4 && e1 == 3 + 3 * REGION_T * 3, "remat: the forward scan has %d outputs, %lld elements", n1, (long long)e1);
    /* plain: partial evaluation recomputes the region's cheap elementwise
     * values but stacks its transcendentals (tanh, and cos for sin's
     * derivative), as the unrolled loop keeps them: more than remat stores,
     * and no tanh in the reverse scan */
    CHECK_MSG(n0 > n1 && e0 > e1, "plain: %d outputs, %lld elements; remat: %d, %lld", n0, (long long)e0, n1, (long long)e1);
    CHECK_MSG(r1 && !r0, "the reverse scan recomputes tanh: remat %d, plain %d", r1, r0);
    /* tanh's derivative 1 - t^2 reads a broadcast 1: recomputed in the
     * reverse body, not passed in as a stacked-shape const */
    CHECK_MSG(reverse_scan_constant_consts(d0) == 0, "plain: %d reverse-scan consts computed from constants alone",
              reverse_scan_constant_consts(d0));
    if (getenv("NABLA_TEST_VERBOSE"))
      printf("forward scan of grad: plain %d outputs (%lld elements), remat %d (%lld)\n", n0, (long long)e0, n1, (long long)e1);
  }
  nb_graph_destroy(d0);
  nb_graph_destroy(d1);
  nb_graph_destroy(g0);
  nb_graph_destroy(g1);
  nb_tree_destroy(gp);
  nb_tree_destroy(gr);
  nb_tree_destroy(gu);
  nb_tree_destroy(in);
}

/* jvp(jvp(f)) over a remat region inside a scan (the second JVP meets
 * remat_lin with tangents on its primal operands) equals that of the plain
 * body. */
static void test_remat_second_order_forward(void) {
  nb_tree *in = region_inputs();
  region_args plain = {REGION_PLAIN, false}, remat = {REGION_REMAT, false};
  nb_tree *res[2] = {NULL, NULL}, *jin = NULL;
  for (int k = 0; k < 2; k++) {
    nb_graph *g = nb_trace(ctx, f_region_scan, k ? (void *)&remat : (void *)&plain, in);
    nb_graph *j1 = g ? nb_jvp(ctx, g) : NULL, *j2 = j1 ? nb_jvp(ctx, j1) : NULL;
    CHECK_MSG(j2, "jvp(jvp) of a scan%s: %s", k ? " with a remat region" : "", nb_ctx_error(ctx));
    if (j2 && !jin) { /* random inputs by path, the same for both */
      nb_test_rng rng = {77};
      jin = nb_tree_create(ctx);
      for (size_t i = 0; i < nb_graph_num_inputs(j2); i++) {
        nb_aval a = nb__graph_input(j2, i)->aval;
        nb_test_set_randn(jin, &rng, nb_graph_input_path(j2, i), a.dtype, a.shape.rank, a.shape.dims);
      }
    }
    res[k] = nb_tree_create(ctx);
    if (j2) CHECK_OK(ctx, nb_graph_run(ctx, j2, jin, res[k]));
    nb_graph_destroy(j2);
    nb_graph_destroy(j1);
    nb_graph_destroy(g);
  }
  CHECK(nb_tree_size(res[0]) == 4 && nb_tree_size(res[0]) == nb_tree_size(res[1]));
  for (size_t i = 0; i < nb_tree_size(res[0]); i++) {
    nb_array *b = nb_tree_get_array(res[1], nb_tree_path(res[0], i));
    CHECK_MSG(b && nb_test_arrays_close(nb_tree_path(res[0], i), b, nb_tree_leaf(res[0], i)->array, 1e-12), "jvp(jvp): %s", nb_tree_path(res[0], i));
  }
  nb_tree_destroy(res[0]);
  nb_tree_destroy(res[1]);
  nb_tree_destroy(jin);
  nb_tree_destroy(in);
}

/* A custom_vjp call inside a scan body: reverse mode runs its bwd (twice the
 * true gradient here) in the reverse scan, as the unrolled loop does; its
 * residuals are its inputs. */
static void test_custom_vjp_in_scan(void) {
  nb_tree *in = region_inputs();
  region_args scanned = {REGION_CUSTOM_VJP, false}, unrolled = {REGION_CUSTOM_VJP, true}, plain = {REGION_PLAIN, false};
  nb_tree *gs = trace_run(f_region_scan, &scanned, in, in, RUN_GRAD), *gu = trace_run(f_region_scan, &unrolled, in, in, RUN_GRAD);
  nb_tree *gp = trace_run(f_region_scan, &plain, in, in, RUN_GRAD);
  check_same_grads("custom_vjp in a scan vs unrolled", gs, gu, 1e-12);
  nb_array *a = gs ? nb_tree_get_array(gs, "grad/xs") : NULL, *b = gp ? nb_tree_get_array(gp, "grad/xs") : NULL;
  double most = 0;
  for (int64_t i = 0; a && b && i < nb_array_size(a); i++) most = fmax(most, fabs(nb_array_get(a, i) - nb_array_get(b, i)));
  CHECK_MSG(a && b && most > 1e-3, "custom_vjp's bwd is not used inside the scan (largest difference %g)", most);
  nb_tree_destroy(gs);
  nb_tree_destroy(gu);
  nb_tree_destroy(gp);
  nb_tree_destroy(in);
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
  test_scan_zero_length();
  test_switch_values();
  test_while_values();
  test_fori_values();
  test_errors();
  test_goldens();
  test_grad_structure();
  test_hoisted_residuals();
  test_remat_in_scan();
  test_remat_second_order_forward();
  test_custom_vjp_in_scan();
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx) - base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/control");
}
