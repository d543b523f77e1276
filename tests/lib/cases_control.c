/* Primitive-table rows for control flow: cond (two branches and a clamped
 * switch), scan (both directions, with consts, carry and xs), fori_loop over
 * constant bounds (a scan) and over traced ones (a while_loop), and a
 * while_loop whose trip count depends on the data (so vmap runs it under a
 * mask). while_loop rows skip the derivative checks: reverse mode refuses it
 * by design (tests/core/test_control.c checks its forward mode). */
#include "primcheck.h"

static nb_aval f64v(int rank, const int64_t *dims) { return nb_aval_make(NB_F64, rank, dims); }
static const int64_t D3[1] = {3}, D43[2] = {4, 3};

/* ---------------------------------------------------------------- carried graphs */

/* (x) -> sin(x) * 2 */
static nb_graph *branch_sin(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "y", nb_mul(nb_sin(x), nb_scalar(b, NB_F64, 2)));
  return b;
}
/* (x) -> cos(x) * x */
static nb_graph *branch_cosx(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "y", nb_mul(nb_cos(x), x));
  return b;
}
/* (x) -> exp(x) / 2 */
static nb_graph *branch_exp(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "y", nb_div(nb_exp(x), nb_scalar(b, NB_F64, 2)));
  return b;
}

/* scan body (w; h; x) -> (tanh(h w + x); h x) */
static nb_graph *rnn_body(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(b, "w", f64v(1, D3)), *h = nb_graph_input(b, "h", f64v(1, D3));
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "h", nb_tanh(nb_add(nb_mul(h, w), x)));
  nb_graph_output(b, "y", nb_mul(h, x));
  return b;
}

/* fori body (w; i; x) -> sin(x) w + i / 4 */
static nb_graph *fori_body(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(b, "w", f64v(1, D3)), *i = nb_graph_input(b, "i", nb_aval_make(NB_I32, 0, NULL));
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "x", nb_add(nb_mul(nb_sin(x), w), nb_div(nb_convert(i, NB_F64), nb_scalar(b, NB_F64, 4))));
  return b;
}

/* while: (x) -> sum(x) < 6 ; (x) -> x + 1 + sin(x) / 10 (sum(x) grows by at least 2.7 a trip) */
static nb_graph *grow_cond(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "go", nb_lt(nb_reduce_sum(x, 0, NULL), nb_scalar(b, NB_F64, 6)));
  return b;
}
static nb_graph *grow_body(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(b, "x", f64v(1, D3));
  nb_graph_output(b, "x", nb_add(nb_add(x, nb_scalar(b, NB_F64, 1)), nb_div(nb_sin(x), nb_scalar(b, NB_F64, 10))));
  return b;
}

/* scan body with a cond inside: (h; x) -> (cond(sum(h x) > 0, sin, cos x)(h + x); h) */
static nb_graph *nested_body(nb_ctx *ctx) {
  nb_graph *b = nb_graph_create(ctx), *t = branch_sin(ctx), *f = branch_cosx(ctx);
  nb_val *h = nb_graph_input(b, "h", f64v(1, D3)), *x = nb_graph_input(b, "x", f64v(1, D3)), *y;
  nb_val *hx = nb_add(h, x);
  nb_cond(b, nb_gt(nb_reduce_sum(nb_mul(h, x), 0, NULL), nb_scalar(b, NB_F64, 0)), t, f, 1, &hx, &y);
  nb_graph_output(b, "h", y);
  nb_graph_output(b, "y", h);
  nb_graph_destroy(t);
  nb_graph_destroy(f);
  return b;
}

/* ---------------------------------------------------------------- traced functions */

static nb_status f_cond(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_graph *t = branch_sin(ctx), *f = branch_cosx(ctx);
  nb_val *x = nb_tree_get_val(in, "x"), *y;
  nb_val *pred = nb_gt(nb_tree_get_val(in, "p"), nb_scalar(g, NB_F64, 0));
  nb_status st = nb_cond(g, pred, t, f, 1, &x, &y);
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_mul(y, nb_tree_get_val(in, "p")));
  nb_graph_destroy(t);
  nb_graph_destroy(f);
  return st;
}

static nb_status f_switch(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  const nb_graph *br[3] = {branch_sin(ctx), branch_cosx(ctx), branch_exp(ctx)};
  nb_val *x = nb_tree_get_val(in, "x"), *y;
  nb_status st = nb_switch(g, nb_tree_get_val(in, "i"), 3, br, 1, &x, &y);
  if (st == NB_OK) st = nb_tree_set_val(out, "y", y);
  for (int k = 0; k < 3; k++) nb_graph_destroy((nb_graph *)br[k]);
  return st;
}

static nb_status f_scan(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_graph *body = rnn_body(nb_graph_ctx(g));
  nb_val *w = nb_tree_get_val(in, "w"), *h = nb_tree_get_val(in, "h"), *xs = nb_tree_get_val(in, "xs"), *hT, *ys;
  nb_scan_opts o = {.reverse = u != NULL};
  nb_status st = nb_scan(g, body, 1, &w, 1, &h, 1, &xs, &o, &hT, &ys);
  if (st == NB_OK) st = nb_tree_set_val(out, "h", hT);
  if (st == NB_OK) st = nb_tree_set_val(out, "ys", ys);
  nb_graph_destroy(body);
  return st;
}

static nb_status f_nested(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_graph *body = nested_body(nb_graph_ctx(g));
  nb_val *h = nb_tree_get_val(in, "h"), *xs = nb_tree_get_val(in, "xs"), *hT, *ys;
  nb_status st = nb_scan(g, body, 0, NULL, 1, &h, 1, &xs, NULL, &hT, &ys);
  if (st == NB_OK) st = nb_tree_set_val(out, "h", hT);
  if (st == NB_OK) st = nb_tree_set_val(out, "ys", ys);
  nb_graph_destroy(body);
  return st;
}

static nb_status f_fori(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_graph *body = fori_body(nb_graph_ctx(g));
  nb_val *w = nb_tree_get_val(in, "w"), *x = nb_tree_get_val(in, "x"), *y;
  nb_val *lo = u ? nb_tree_get_val(in, "lo") : nb_scalar(g, NB_I32, 1);
  nb_val *hi = u ? nb_tree_get_val(in, "hi") : nb_scalar(g, NB_I32, 4);
  nb_status st = nb_fori_loop(g, lo, hi, body, 1, &w, 1, &x, &y);
  if (st == NB_OK) st = nb_tree_set_val(out, "y", y);
  nb_graph_destroy(body);
  return st;
}

static nb_status f_while(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_graph *c = grow_cond(ctx), *b = grow_body(ctx);
  nb_val *x = nb_tree_get_val(in, "x"), *y;
  nb_status st = nb_while_loop(g, c, b, 0, NULL, 0, NULL, 1, &x, &y);
  if (st == NB_OK) st = nb_tree_set_val(out, "y", y);
  nb_graph_destroy(c);
  nb_graph_destroy(b);
  return st;
}

/* ---------------------------------------------------------------- inputs */

static nb_status in_cond(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "p", NB_F64, 0, NULL);
  nb_test_set_randn(in, r, "x", NB_F64, 1, D3);
  return NB_OK;
}

static nb_status in_switch(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "x", NB_F64, 1, D3);
  nb_array *i = nb_test_randint(c, r, NB_I32, 0, NULL, -1, 3); /* out of range: clamped */
  nb_status s = nb_tree_set_array(in, "i", i);
  nb_array_release(i);
  return s;
}

static nb_status in_scan(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "xs", NB_F64, 2, D43);
  nb_test_set_randn(in, r, "h", NB_F64, 1, D3);
  nb_test_set_randn(in, r, "w", NB_F64, 1, D3);
  return NB_OK;
}

static nb_status in_fori(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "x", NB_F64, 1, D3);
  nb_test_set_randn(in, r, "w", NB_F64, 1, D3);
  return NB_OK;
}

static nb_status in_fori_dynamic(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "x", NB_F64, 1, D3);
  nb_array *lo = nb_test_randint(c, r, NB_I32, 0, NULL, 0, 1), *hi = nb_test_randint(c, r, NB_I32, 0, NULL, 1, 4);
  nb_tree_set_array(in, "lo", lo);
  nb_tree_set_array(in, "hi", hi);
  nb_array_release(lo);
  nb_array_release(hi);
  nb_test_set_randn(in, r, "w", NB_F64, 1, D3);
  return NB_OK;
}

static nb_status in_while(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_test_set_randn(in, r, "x", NB_F64, 1, D3);
  return NB_OK;
}

static int reversed = 1;

static const nb_prim_case cases[] = {
    {"cond", "p * cond(p > 0, sin(x) 2, cos(x) x)", f_cond, NULL, in_cond, 0, 0},
    {"cond", "switch(i clamped to 0..2, [sin, cos x, exp / 2])", f_switch, NULL, in_switch, 0, 0},
    {"scan", "rnn h = tanh(h w + x), ys = h x", f_scan, NULL, in_scan, 0, 0},
    {"scan", "reverse rnn", f_scan, &reversed, in_scan, 0, 0},
    {"scan", "a cond inside a scan (vmap: a batched predicate inside the body)", f_nested, NULL, in_scan, 0, 0},
    {"scan", "fori_loop over constant bounds", f_fori, NULL, in_fori, 0, 0},
    {"while_loop", "fori_loop over traced bounds", f_fori, &reversed, in_fori_dynamic, NB_CASE_NO_GRAD, 0},
    {"while_loop", "while sum(x) < 6: x = x + 1 + sin(x) / 10", f_while, NULL, in_while, NB_CASE_NO_GRAD, 0},
};

const nb_prim_case *nb_cases_control(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
