/* Transformations composed: grad of vmap against vmap of grad, grad of grad
 * on known functions, Hessian-vector products, has_aux, stop_gradient, remat
 * and custom_vjp; the IR's text, hash and verifier; errors with the caller's
 * file:line; debug-nans; allocation failures at every point of a trace. */
#include "core/ir.h"
#include "primcheck.h"

static nb_array *vec(nb_ctx *ctx, int n, const double *v) {
  int64_t d[1] = {n};
  return nb_array_from_f64(ctx, NB_F64, 1, d, v);
}

static nb_tree *tree1(nb_ctx *ctx, const char *p, nb_array *a) {
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, p, a);
  nb_array_release(a);
  return t;
}

/* f(w, x) = sum(tanh(x * w) * x) */
static nb_status f_wx(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *w = nb_tree_get_val(in, "w"), *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_tanh(nb_mul(x, w)), x), 0, NULL));
}

static void test_grad_of_vmap(nb_ctx *ctx) {
  /* per-example gradients: vmap(grad f) over x, against grad f per row */
  double wv[3] = {0.3, -0.7, 1.1}, xv[12];
  nb_test_rng rng = {42};
  for (int i = 0; i < 12; i++) xv[i] = nb_test_normal(&rng);
  int64_t d3[1] = {3}, d43[2] = {4, 3};
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "w", nb_leaf_aval(nb_aval_make(NB_F64, 1, d3)));
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 1, d3)));
  nb_graph *g = nb_trace(ctx, f_wx, NULL, spec);
  nb_graph *dg = nb_grad(ctx, g, &(nb_grad_opts){.wrt = "w"});
  nb_tree *axes = nb_tree_create(ctx);
  nb_array *m1 = nb_array_scalar(ctx, NB_I32, -1);
  nb_tree_set_array(axes, "w", m1);
  nb_array_release(m1);
  nb_graph *vdg = nb_vmap(ctx, dg, &(nb_vmap_opts){.in_axes = axes, .axis_size = 4});
  CHECK_MSG(vdg, "%s", nb_ctx_error(ctx));
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *w = vec(ctx, 3, wv), *x = nb_array_from_f64(ctx, NB_F64, 2, d43, xv);
  nb_tree_set_array(in, "w", w);
  nb_tree_set_array(in, "x", x);
  CHECK_OK(ctx, nb_graph_run(ctx, vdg, in, out));
  nb_array *per = nb_tree_get_array(out, "grad/w");
  CHECK(per && nb_array_rank(per) == 2 && nb_array_dims(per)[0] == 4);
  for (int b = 0; per && b < 4; b++)
    for (int j = 0; j < 3; j++) {
      double xx = xv[b * 3 + j], t = tanh(xx * wv[j]);
      CHECK_NEAR(nb_array_get(per, b * 3 + j), xx * xx * (1 - t * t), 1e-12);
    }
  /* grad of (sum over the batch of vmap(f)) == sum over the batch of vmap(grad f) */
  nb_graph *vg = nb_vmap(ctx, g, &(nb_vmap_opts){.in_axes = axes, .axis_size = 4});
  nb_array_retain(per);
  nb_tree_destroy(out);
  out = nb_tree_create(ctx);
  nb_graph *summed = NULL;
  {
    /* total(w, x) = sum(vmap(f)(w, x)) */
    nb_tree *vspec = nb_graph_input_spec(vg);
    summed = nb_graph_create(ctx);
    nb_tree *vin = nb_tree_create(ctx), *vout = nb_tree_create(ctx);
    for (size_t i = 0; i < nb_tree_size(vspec); i++)
      nb_tree_set_val(vin, nb_tree_path(vspec, i), nb_graph_input(summed, nb_tree_path(vspec, i), nb_tree_leaf(vspec, i)->aval));
    nb_graph_call(summed, vg, vin, vout);
    nb_graph_output(summed, "total", nb_reduce_sum(nb_tree_get_val(vout, "loss"), 0, NULL));
    nb_tree_destroy(vspec);
    nb_tree_destroy(vin);
    nb_tree_destroy(vout);
  }
  nb_graph *dsum = nb_grad(ctx, summed, &(nb_grad_opts){.wrt = "w"});
  CHECK_OK(ctx, nb_graph_run(ctx, dsum, in, out));
  for (int j = 0; j < 3; j++) {
    double s = 0;
    for (int b = 0; b < 4; b++) s += nb_array_get(per, b * 3 + j);
    CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "grad/w"), j), s, 1e-12);
  }
  nb_array_release(per);
  nb_array_release(w);
  nb_array_release(x);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_tree_destroy(spec);
  nb_tree_destroy(axes);
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
  nb_graph_destroy(vdg);
  nb_graph_destroy(vg);
  nb_graph_destroy(summed);
  nb_graph_destroy(dsum);
}

static nb_status f_cube(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "y", nb_mul(nb_mul(x, x), x));
}

static void test_higher_order(nb_ctx *ctx) {
  nb_tree *in = tree1(ctx, "x", nb_array_scalar(ctx, NB_F64, 2.0));
  nb_graph *g = nb_trace(ctx, f_cube, NULL, in);
  nb_graph *d1 = nb_grad(ctx, g, NULL);
  nb_graph *d2 = nb_grad(ctx, d1, NULL); /* d1 has one output, grad/x: a scalar */
  nb_graph *d3 = nb_grad(ctx, d2, NULL);
  CHECK_MSG(d3, "%s", nb_ctx_error(ctx));
  nb_tree *o1 = nb_tree_create(ctx), *o2 = nb_tree_create(ctx), *o3 = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, d1, in, o1));
  CHECK_OK(ctx, nb_graph_run(ctx, d2, in, o2));
  CHECK_OK(ctx, nb_graph_run(ctx, d3, in, o3));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(o1, "grad/x"), 0), 12.0, 1e-12); /* 3x^2 */
  CHECK_NEAR(nb_array_get(nb_tree_get_array(o2, "grad/x"), 0), 12.0, 1e-12); /* 6x */
  CHECK_NEAR(nb_array_get(nb_tree_get_array(o3, "grad/x"), 0), 6.0, 1e-12);  /* 6 */
  CHECK_OK(ctx, nb_graph_verify(d3));
  nb_tree_destroy(o1);
  nb_tree_destroy(o2);
  nb_tree_destroy(o3);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_graph_destroy(d1);
  nb_graph_destroy(d2);
  nb_graph_destroy(d3);
}

/* f(x) = sum(sin(x) * x): Hessian is diag(2 cos x - x sin x) */
static nb_status f_sinx(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "y", nb_reduce_sum(nb_mul(nb_sin(x), x), 0, NULL));
}

static void test_hvp(nb_ctx *ctx) {
  double xv[4] = {0.1, -1.2, 2.3, 0.7}, vv[4] = {1, 2, -1, 0.5};
  nb_tree *in = tree1(ctx, "x", vec(ctx, 4, xv));
  nb_graph *g = nb_trace(ctx, f_sinx, NULL, in);
  nb_graph *dg = nb_grad(ctx, g, NULL);
  nb_graph *hv = nb_jvp(ctx, dg); /* forward over reverse */
  CHECK_MSG(hv, "%s", nb_ctx_error(ctx));
  nb_tree *jin = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(jin, "primal", in);
  nb_array *v = vec(ctx, 4, vv);
  nb_tree_set_array(jin, "tangent/x", v);
  nb_array_release(v);
  CHECK_OK(ctx, nb_graph_run(ctx, hv, jin, out));
  nb_array *h = nb_tree_get_array(out, "tangent/grad/x");
  for (int i = 0; h && i < 4; i++) CHECK_NEAR(nb_array_get(h, i), (2 * cos(xv[i]) - xv[i] * sin(xv[i])) * vv[i], 1e-12);
  nb_tree_destroy(jin);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
  nb_graph_destroy(hv);
}

/* loss = sum(stop_gradient(x) * x); aux "sq" = x * x */
static nb_status f_aux(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_status s = nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(nb_stop_gradient(x), x), 0, NULL));
  return s ? s : nb_tree_set_val(out, "sq", nb_mul(x, x));
}

static void test_aux_and_stop_gradient(nb_ctx *ctx) {
  double xv[3] = {1, -2, 3};
  nb_tree *in = tree1(ctx, "x", vec(ctx, 3, xv));
  nb_graph *g = nb_trace(ctx, f_aux, NULL, in);
  CHECK(nb_value_and_grad(ctx, g, NULL) == NULL); /* two outputs without has_aux */
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "has_aux");
  nb_graph *vg = nb_value_and_grad(ctx, g, &(nb_grad_opts){.has_aux = true});
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, vg, in, out));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "loss"), 0), 14, 1e-12);
  for (int i = 0; i < 3; i++) {
    CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "grad/x"), i), xv[i], 1e-12); /* not 2x */
    CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "aux/sq"), i), xv[i] * xv[i], 1e-12);
  }
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_graph_destroy(vg);
}

/* remat: y = sum(region(x)) with region = sin(exp(x)) recomputed in backward */
static nb_status region(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "r", nb_sin(nb_exp(nb_tree_get_val(in, "x"))));
}

static nb_status f_remat(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_graph *body = nb_trace(nb_graph_ctx(g), region, NULL, in);
  if (!body) return nb_ctx_status(nb_graph_ctx(g));
  nb_tree *res = nb_tree_create(nb_graph_ctx(g));
  nb_status st = u ? nb_remat_call(g, body, in, res) : nb_graph_call(g, body, in, res);
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_reduce_sum(nb_tree_get_val(res, "r"), 0, NULL));
  nb_tree_destroy(res);
  nb_graph_destroy(body);
  return st;
}

static size_t count_prim(const nb_graph *g, const char *name) {
  size_t n = 0;
  for (size_t k = 0; k < nb__graph_neqns(g); k++) n += strcmp(nb__rules(nb__graph_eqn(g, k)->prim)->name, name) == 0;
  return n;
}

static void test_remat(nb_ctx *ctx) {
  double xv[4] = {0.5, -0.3, 0.1, 1.0};
  nb_tree *in = tree1(ctx, "x", vec(ctx, 4, xv));
  nb_graph *plain = nb_trace(ctx, f_remat, NULL, in), *remat = nb_trace(ctx, f_remat, (void *)1, in);
  nb_graph *dp = nb_value_and_grad(ctx, plain, NULL), *dr = nb_value_and_grad(ctx, remat, NULL);
  CHECK_MSG(dr, "%s", nb_ctx_error(ctx));
  nb_tree *op = nb_tree_create(ctx), *orr = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, dp, in, op));
  CHECK_OK(ctx, nb_graph_run(ctx, dr, in, orr));
  for (int i = 0; i < 4; i++)
    CHECK_NEAR(nb_array_get(nb_tree_get_array(orr, "grad/x"), i), nb_array_get(nb_tree_get_array(op, "grad/x"), i), 1e-14);
  /* the forward pass runs the region as one remat_call (its intermediates
   * are not kept); the backward pass recomputes exp behind a barrier */
  CHECK(count_prim(dr, "barrier") == 1 && count_prim(dr, "exp") >= 1 && count_prim(dr, "remat_call") == 1);
  /* and it composes: derivatives checked against finite differences, vmap */
  CHECK(nb_test_check_grads(ctx, "remat", f_remat, (void *)1, in, 1e-5, true));
  nb_tree_destroy(op);
  nb_tree_destroy(orr);
  nb_tree_destroy(in);
  nb_graph_destroy(plain);
  nb_graph_destroy(remat);
  nb_graph_destroy(dp);
  nb_graph_destroy(dr);
}

/* custom_vjp: fwd softplus(x) = log1p(exp(x)); bwd deliberately 2x the true
 * gradient, so the test can tell that bwd was used. */
static nb_status softplus(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_log1p(nb_exp(nb_tree_get_val(in, "x"))));
}
static nb_status softplus_bwd(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *ct = nb_tree_get_val(in, "ct/y");
  return nb_tree_set_val(out, "grad/x", nb_mul(nb_mul(ct, nb_logistic(x)), nb_full_like(x, 2)));
}
static nb_status f_custom(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *bspec = nb_tree_copy(in);
  nb_tree_set(bspec, "ct/y", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "x"))));
  nb_graph *fwd = nb_trace(ctx, softplus, NULL, in), *bwd = nb_trace(ctx, softplus_bwd, NULL, bspec);
  nb_tree *res = nb_tree_create(ctx);
  nb_status st = fwd && bwd ? nb_custom_vjp_call(g, fwd, bwd, in, res) : NB_ERR_INTERNAL;
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_reduce_sum(nb_tree_get_val(res, "y"), 0, NULL));
  nb_tree_destroy(res);
  nb_tree_destroy(bspec);
  nb_graph_destroy(fwd);
  nb_graph_destroy(bwd);
  return st;
}

static void test_custom_vjp(nb_ctx *ctx) {
  double xv[3] = {0.5, -2, 3};
  nb_tree *in = tree1(ctx, "x", vec(ctx, 3, xv));
  nb_graph *g = nb_trace(ctx, f_custom, NULL, in);
  nb_graph *dg = nb_value_and_grad(ctx, g, NULL);
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, dg, in, out));
  double total = 0;
  for (int i = 0; i < 3; i++) {
    total += log1p(exp(xv[i]));
    CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "grad/x"), i), 2 / (1 + exp(-xv[i])), 1e-12);
  }
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "loss"), 0), total, 1e-12);
  /* grad of grad differentiates the user's bwd */
  nb_graph *d1 = nb_grad(ctx, g, NULL);
  CHECK(nb_grad(ctx, d1, NULL) == NULL); /* grad of a non-scalar: grad/x is a vector */
  CHECK_ERR(ctx, NB_ERR_SHAPE, "must be a float scalar");
  nb_graph_destroy(d1);
  /* forward mode is refused with a clear error at run time */
  nb_graph *jg = nb_jvp(ctx, g);
  nb_tree *jin = nb_tree_create(ctx), *jout = nb_tree_create(ctx);
  nb_tree_merge(jin, "primal", in);
  nb_tree_merge(jin, "tangent", in);
  CHECK(nb_graph_run(ctx, jg, jin, jout) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "forward-mode differentiation of a custom_vjp");
  /* vmap of a custom_vjp function, and grad of that */
  int64_t d23[2] = {2, 3};
  double xb[6] = {0.1, 0.2, 0.3, -1, -2, -3};
  nb_tree *bin = tree1(ctx, "x", nb_array_from_f64(ctx, NB_F64, 2, d23, xb));
  CHECK(nb_test_check_vmap(ctx, "custom_vjp vmap", f_custom, NULL, bin, NULL, 2));
  nb_tree_destroy(bin);
  nb_tree_destroy(jin);
  nb_tree_destroy(jout);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_graph_destroy(jg);
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
}

/* ---------------------------------------------------------------- IR text, hash, errors */

static const int last_axis[1] = {-1};
static nb_status f_small(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "y", nb_reduce_sum(nb_exp(nb_add(x, nb_scalar(g, NB_F32, 1))), 1, last_axis));
}

/* sum(sin(x + 1), last axis): f_small's avals, another body */
static nb_status f_small_sin(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "y", nb_reduce_sum(nb_sin(nb_add(x, nb_scalar(g, NB_F32, 1))), 1, last_axis));
}

/* remat(body), the body f_small (user NULL) or f_small_sin */
static nb_status f_remat_of(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_graph *body = nb_trace(nb_graph_ctx(g), user ? f_small_sin : f_small, NULL, in);
  nb_tree *res = nb_tree_create(nb_graph_ctx(g));
  nb_status st = body ? nb_remat_call(g, body, in, res) : nb_ctx_status(nb_graph_ctx(g));
  if (st == NB_OK) st = nb_tree_set_val(out, "y", nb_tree_get_val(res, "y"));
  nb_tree_destroy(res);
  nb_graph_destroy(body);
  return st;
}

/* Graphs that call different graphs print, hash and compare differently
 * (nb_jit keys its executables on the hash). */
static void test_carried_graphs_hash(nb_ctx *ctx) {
  int64_t d[2] = {2, 3};
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F32, 2, d)));
  nb_graph *a = nb_trace(ctx, f_remat_of, NULL, spec), *b = nb_trace(ctx, f_remat_of, NULL, spec);
  nb_graph *c = nb_trace(ctx, f_remat_of, (void *)1, spec);
  CHECK(a && b && c);
  CHECK(nb_graph_equal(a, b) && nb_graph_hash(a) == nb_graph_hash(b));
  CHECK(!nb_graph_equal(a, c) && nb_graph_hash(a) != nb_graph_hash(c));
  char *text = nb_graph_to_string(a);
  CHECK_MSG(text && strstr(text, "remat_call[body=#"), "%s", text);
  free(text);
  nb_tree_destroy(spec);
  nb_graph_destroy(a);
  nb_graph_destroy(b);
  nb_graph_destroy(c);
}

static void test_ir_text_and_hash(nb_ctx *ctx) {
  int64_t d[2] = {2, 3};
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F32, 2, d)));
  nb_graph *a = nb_trace(ctx, f_small, NULL, spec), *b = nb_trace(ctx, f_small, NULL, spec), *c = nb_trace(ctx, f_sinx, NULL, spec);
  char *text = nb_graph_to_string(a);
  const char *want =
      "in %0 x: f32[2,3]\n"
      "%1: f32[] = constant[1]\n"
      "%2: f32[2,3] = broadcast_in_dim[shape=(2,3) dims=()] %1\n"
      "%3: f32[2,3] = add %0 %2\n"
      "%4: f32[2,3] = exp %3\n"
      "%5: f32[2] = reduce_sum[axes=(1)] %4\n"
      "out y = %5\n";
  CHECK_MSG(strcmp(text, want) == 0, "IR text:\n%s", text);
  free(text);
  CHECK(nb_graph_equal(a, b) && nb_graph_hash(a) == nb_graph_hash(b));
  CHECK(!nb_graph_equal(a, c) && nb_graph_hash(a) != nb_graph_hash(c));
  CHECK_OK(ctx, nb_graph_verify(a));
  double flops, bytes;
  nb_graph_cost(a, &flops, &bytes);
  CHECK(flops == 18 && bytes > 0); /* add 6 + exp 6 + reduce 6 */
  nb_tree_destroy(spec);
  nb_graph_destroy(a);
  nb_graph_destroy(b);
  nb_graph_destroy(c);
}

static int bad_line;
static nb_status f_bad_shapes(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  bad_line = __LINE__ + 1;
  nb_val *y = nb_add(x, w); /* [2,3] + [4]: does not broadcast */
  nb_val *z = nb_exp(y);    /* a no-op on the poisoned graph */
  return nb_tree_set_val(out, "z", z);
}
static nb_status f_bad_dtype(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "z", nb_mul(x, nb_convert(x, NB_I32)));
}
static const int axis5[1] = {5};
static nb_status f_bad_axis(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "z", nb_reduce_sum(nb_tree_get_val(in, "x"), 1, axis5));
}
static nb_status f_bad_log(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "z", nb_exp(nb_log(nb_neg(nb_mul(x, x)))));
}
static nb_status f_bad_perm(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  static const int perm[2] = {0, 0};
  return nb_tree_set_val(out, "z", nb_transpose(nb_tree_get_val(in, "x"), perm));
}
static nb_status f_exp_of_int(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "z", nb_exp(nb_convert(nb_tree_get_val(in, "x"), NB_I32)));
}

static void test_errors(nb_ctx *ctx) {
  int64_t d23[2] = {2, 3}, d4[1] = {4};
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F32, 2, d23)));
  nb_tree_set(spec, "w", nb_leaf_aval(nb_aval_make(NB_F32, 1, d4)));
  CHECK(nb_trace(ctx, f_bad_shapes, NULL, spec) == NULL);
  char where[64];
  snprintf(where, sizeof where, "test_transforms.c:%d", bad_line);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "add") && strstr(nb_ctx_error(ctx), "f32[2,3]") && strstr(nb_ctx_error(ctx), "f32[4]") &&
                strstr(nb_ctx_error(ctx), where),
            "message: %s", nb_ctx_error(ctx));
  CHECK_ERR(ctx, NB_ERR_SHAPE, "do not broadcast");
  CHECK(nb_trace(ctx, f_bad_dtype, NULL, spec) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "f32 vs i32");
  CHECK(nb_trace(ctx, f_bad_axis, NULL, spec) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "axis 5 out of range");
  CHECK(nb_trace(ctx, f_bad_perm, NULL, spec) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "permutation");
  CHECK(nb_trace(ctx, f_exp_of_int, NULL, spec) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "needs a floating dtype");
  /* grad of a non-scalar output */
  nb_tree *spec_x = nb_tree_select_prefix(spec, "x", false);
  nb_graph *g = nb_trace(ctx, f_small, NULL, spec_x);
  nb_tree_destroy(spec_x);
  CHECK(nb_grad(ctx, g, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "must be a float scalar");
  CHECK(nb_grad(ctx, g, &(nb_grad_opts){.wrt = "nothing"}) == NULL);
  nb_ctx_clear_error(ctx);
  /* running with a wrong input shape */
  nb_tree *in = tree1(ctx, "x", nb_array_zeros(ctx, NB_F32, 1, d4)), *out = nb_tree_create(ctx);
  CHECK(nb_graph_run(ctx, g, in, out) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "input 'x' is f32[4], the graph wants f32[2,3]");
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  /* debug nans: log of a negative names the primitive */
  in = tree1(ctx, "x", nb_array_ones(ctx, NB_F32, 2, d23));
  g = nb_trace(ctx, f_bad_log, NULL, in);
  nb_ctx_set_debug_nans(ctx, true);
  CHECK(nb_graph_run(ctx, g, in, out) == NB_ERR_NUMERIC);
  CHECK_ERR(ctx, NB_ERR_NUMERIC, "debug-nans: log produced a NaN");
  nb_ctx_set_debug_nans(ctx, false);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  /* a NULL operand is an error, not a crash */
  nb_graph *h = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(h, "x", nb_aval_make(NB_F32, 0, NULL));
  CHECK(nb__is_poison(nb_add(x, NULL)));
  CHECK(nb_graph_status(h) == NB_ERR_INVALID_ARG);
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(h);
  nb_tree_destroy(spec);
}

/* Every allocation of trace + grad + run may fail: an error, never a crash
 * or a leak; eventually it succeeds. */
static void test_alloc_failures(void) {
  bool succeeded = false;
  for (int n = 1; n < 2000 && !succeeded; n += (n < 200 ? 1 : 7)) {
    nb_ctx *ctx = nb_ctx_create();
    double xv[3] = {1, 2, 3};
    nb_tree *in = tree1(ctx, "x", vec(ctx, 3, xv));
    nb_ctx_fail_alloc_after(ctx, n);
    nb_graph *g = nb_trace(ctx, f_sinx, NULL, in);
    nb_graph *dg = g ? nb_value_and_grad(ctx, g, NULL) : NULL;
    nb_tree *out = nb_tree_create(ctx);
    if (dg && out && nb_graph_run(ctx, dg, in, out) == NB_OK) succeeded = true;
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_tree_destroy(out);
    nb_graph_destroy(dg);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "failing allocation %d: %zu bytes leaked", n, nb_ctx_bytes_in_use(ctx));
    nb_ctx_destroy(ctx);
  }
  CHECK(succeeded);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_grad_of_vmap(ctx);
  test_higher_order(ctx);
  test_hvp(ctx);
  test_aux_and_stop_gradient(ctx);
  test_remat(ctx);
  test_custom_vjp(ctx);
  test_ir_text_and_hash(ctx);
  test_carried_graphs_hash(ctx);
  test_errors(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  test_alloc_failures();
  return nb_test_summary("core/transforms");
}
