/* Primitive-table rows for the graph-carrying primitives: remat_call and
 * custom_vjp_call, whose derivatives exercise remat_lin, barrier and
 * custom_lin. custom_vjp rows skip the finite-difference check (forward mode
 * over a custom_vjp is refused by design; test_transforms checks its reverse
 * mode against the user's bwd). */
#include "primcheck.h"

static nb_status in_any(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t d[2] = {2, 3};
  nb_array *a = nb_test_randn(c, r, NB_F64, 2, d);
  nb_status s = nb_tree_set_array(in, "x", a);
  nb_array_release(a);
  return s;
}

static nb_status region(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_status s = nb_tree_set_val(out, "r", nb_sin(nb_mul(nb_exp(x), x)));
  return s ? s : nb_tree_set_val(out, "n", nb_argmax(x, 1, NB_I32)); /* a non-float output too */
}

static nb_status f_remat(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_graph *body = nb_trace(nb_graph_ctx(g), region, NULL, in);
  nb_tree *res = nb_tree_create(nb_graph_ctx(g));
  nb_status st = body ? nb_remat_call(g, body, in, res) : NB_ERR_INTERNAL;
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_tanh(nb_tree_get_val(res, "r")));
  if (st == NB_OK) st = nb_tree_set_val(out, "n", nb_tree_get_val(res, "n"));
  nb_tree_destroy(res);
  nb_graph_destroy(body);
  return st;
}

static nb_status fwd(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_log1p(nb_exp(nb_tree_get_val(in, "x"))));
}
static nb_status bwd(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "grad/x", nb_mul(nb_tree_get_val(in, "ct/y"), nb_logistic(x)));
}
static nb_status f_custom(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *bspec = nb_tree_copy(in);
  nb_tree_set(bspec, "ct/y", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "x"))));
  nb_graph *f = nb_trace(ctx, fwd, NULL, in), *b = nb_trace(ctx, bwd, NULL, bspec);
  nb_tree *res = nb_tree_create(ctx);
  nb_status st = f && b ? nb_custom_vjp_call(g, f, b, in, res) : NB_ERR_INTERNAL;
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_tree_get_val(res, "y"));
  nb_tree_destroy(res);
  nb_tree_destroy(bspec);
  nb_graph_destroy(f);
  nb_graph_destroy(b);
  return st;
}

static const nb_prim_case cases[] = {
    {"remat_call", "tanh(remat(sin(exp(x) x)))", f_remat, NULL, in_any, 0, 0},
    {"remat_lin", "derivatives of a remat region (jvp runs remat_lin, vjp transposes it)", f_remat, NULL, in_any,
     NB_CASE_NO_SECOND_ORDER, 0},
    {"barrier", "the recomputation barrier of a remat region's backward pass", f_remat, NULL, in_any, 0, 0},
    {"custom_vjp_call", "softplus with a user bwd (values and vmap)", f_custom, NULL, in_any, NB_CASE_NO_GRAD, 0},
    {"custom_lin", "the linearized custom_vjp (batched with vmap)", f_custom, NULL, in_any, NB_CASE_NO_GRAD, 0},
};

const nb_prim_case *nb_cases_call(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
