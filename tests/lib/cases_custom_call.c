/* Primitive-table rows for custom_call.c, and the test kernels they use
 * (also used by tests/core/test_custom_call.c):
 *   softplus   log1p(exp(beta x)) / beta, beta in the attributes (a double,
 *              default 1), with a vjp;
 *   polar      (r, theta) -> (r cos theta, r sin theta, i32 quadrant), a vjp;
 *   cube_nograd x^3 with no vjp.
 * Derivatives go through reverse mode only, so the rows skip the table's
 * finite-difference check (test_custom_call checks grad, grad of grad and
 * vmap of grad against the analytic derivatives). */
#include "core/internal.h"
#include "primcheck.h"

static double beta_of(const void *attrs, size_t size) {
  double b = 1;
  if (size == sizeof b) memcpy(&b, attrs, sizeof b);
  return b;
}

/* ---------------------------------------------------------------- softplus */

static nb_status softplus_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  if (nin != 1 || nout != 1 || !nb_dtype_is_float(in[0].dtype) || (size != 0 && size != sizeof(double))) return NB_ERR_INVALID_ARG;
  out[0] = in[0];
  return NB_OK;
}

static nb_status softplus_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                               nb_array **out) {
  double b = beta_of(attrs, size);
  int64_t n = nb_array_size(in[0]);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = log1p(exp(b * nb_array_get(in[0], i))) / b;
  nb_array *r = nb_array_from_f64(ctx, nb_array_dtype(in[0]), nb_array_rank(in[0]), nb_array_dims(in[0]), v);
  free(v);
  if (!r) return NB_ERR_NOMEM;
  nb_array_release(out[0]); /* replace the preallocated output */
  out[0] = r;
  return NB_OK;
}

static nb_status softplus_vjp(void *ud, nb_graph *g, int nin, nb_val *const *in, int nout, nb_val *const *out,
                              nb_val *const *out_ct, const void *attrs, size_t size, nb_val **in_ct) {
  nb_val *bx = nb_mul(in[0], nb_scalar(g, nb_val_dtype(in[0]), beta_of(attrs, size)));
  in_ct[0] = nb_mul(out_ct[0], nb_logistic(bx));
  return nb_graph_status(g);
}

static void softplus_cost(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, double *flops, double *bytes) {
  double n = (double)nb_shape_size(&in[0].shape);
  *flops = 4 * n;
  *bytes = 2 * n * (double)nb_dtype_size(in[0].dtype);
}

/* ---------------------------------------------------------------- polar */

static nb_status polar_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  if (nin != 2 || nout != 3 || !nb_aval_equal(&in[0], &in[1]) || !nb_dtype_is_float(in[0].dtype)) return NB_ERR_INVALID_ARG;
  out[0] = out[1] = out[2] = in[0];
  out[2].dtype = NB_I32;
  return NB_OK;
}

static nb_status polar_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                            nb_array **out) {
  nb_dtype t = nb_array_dtype(in[0]);
  for (int64_t i = 0; i < nb_array_size(in[0]); i++) {
    double r = nb_array_get(in[0], i), th = nb_array_get(in[1], i), x = r * cos(th), y = r * sin(th);
    if (t == NB_F64) {
      ((double *)nb_array_data_mut(out[0]))[i] = x;
      ((double *)nb_array_data_mut(out[1]))[i] = y;
    } else {
      ((float *)nb_array_data_mut(out[0]))[i] = (float)x;
      ((float *)nb_array_data_mut(out[1]))[i] = (float)y;
    }
    ((int32_t *)nb_array_data_mut(out[2]))[i] = (x < 0) + 2 * (y < 0);
  }
  return NB_OK;
}

static nb_status polar_vjp(void *ud, nb_graph *g, int nin, nb_val *const *in, int nout, nb_val *const *out,
                           nb_val *const *out_ct, const void *attrs, size_t size, nb_val **in_ct) {
  if (out_ct[2] != NULL) return NB_ERR_INTERNAL; /* integer outputs get no cotangent */
  nb_val *c = nb_cos(in[1]), *s = nb_sin(in[1]), *cx = out_ct[0], *cy = out_ct[1];
  in_ct[0] = nb_add(nb_mul(cx, c), nb_mul(cy, s));
  in_ct[1] = nb_mul(in[0], nb_sub(nb_mul(cy, c), nb_mul(cx, s)));
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- cube, no vjp */

static nb_status cube_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  if (nin != 1 || nout != 1) return NB_ERR_INVALID_ARG;
  out[0] = in[0];
  return NB_OK;
}

static nb_status cube_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                           nb_array **out) {
  for (int64_t i = 0; i < nb_array_size(in[0]); i++) {
    double x = nb_array_get(in[0], i);
    ((double *)nb_array_data_mut(out[0]))[i] = x * x * x;
  }
  return NB_OK;
}

nb_status nb_test_register_custom_calls(nb_ctx *ctx) {
  static const nb_custom_call_rules rules[3] = {
      {"softplus", softplus_infer, softplus_eval, softplus_vjp, softplus_cost, NULL, 0},
      {"polar", polar_infer, polar_eval, polar_vjp, NULL, NULL, 0},
      {"cube_nograd", cube_infer, cube_eval, NULL, NULL, NULL, 0},
  };
  for (int i = 0; i < 3; i++) {
    if (nb__custom_call_find(ctx, rules[i].name)) continue;
    nb_status s = nb_custom_call_register(ctx, &rules[i]);
    if (s) return s;
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- rows */

static const int64_t D34[2] = {3, 4}, D5[1] = {5};

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status in_x(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = nb_test_register_custom_calls(c);
  return s ? s : put(in, "x", nb_test_randn(c, r, NB_F64, 2, D34));
}
static nb_status in_polar(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = nb_test_register_custom_calls(c);
  if (!s) s = put(in, "r", nb_test_randn(c, r, NB_F64, 1, D5));
  return s ? s : put(in, "theta", nb_test_randn(c, r, NB_F64, 1, D5));
}

#define V(name) nb_tree_get_val(in, name)

/* tanh(softplus_2(x)) with beta = 2 in the attributes */
static nb_status f_softplus(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  double beta = 2;
  nb_val *x = V("x");
  return nb_tree_set_val(out, "y", nb_tanh(nb_custom_call(g, "softplus", 1, &x, &beta, sizeof beta, 1, NULL)));
}

static nb_status f_polar(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *ops[2] = {V("r"), V("theta")}, *res[3];
  nb_custom_call(g, "polar", 2, ops, NULL, 0, 3, res);
  nb_status s = nb_tree_set_val(out, "x", res[0]);
  if (!s) s = nb_tree_set_val(out, "y", nb_mul(res[1], res[0]));
  return s ? s : nb_tree_set_val(out, "quadrant", res[2]);
}

static nb_status f_cube(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = V("x");
  return nb_tree_set_val(out, "y", nb_custom_call(g, "cube_nograd", 1, &x, NULL, 0, 1, NULL));
}

/* The gradient of sum(softplus(x) * x), traced into this function: tracing
 * it runs custom_call_lin's transpose (the kernel's vjp), and the table then
 * runs and vmaps the result. */
static nb_status inner(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = V("x");
  nb_val *y = nb_custom_call(g, "softplus", 1, &x, NULL, 0, 1, NULL);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, x), 0, NULL));
}
static nb_status f_grad_inside(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_graph *f = nb_trace(ctx, inner, NULL, in), *df = f ? nb_grad(ctx, f, NULL) : NULL;
  nb_tree *res = nb_tree_create(ctx);
  nb_status s = df ? nb_graph_call(g, df, in, res) : NB_ERR_INTERNAL;
  if (!s) s = nb_tree_set_val(out, "dx", nb_tree_get_val(res, "grad/x"));
  nb_tree_destroy(res);
  nb_graph_destroy(df);
  nb_graph_destroy(f);
  return s;
}

#define NG NB_CASE_NO_GRAD
static const nb_prim_case cases[] = {
    {"custom_call", "softplus kernel with attrs (eval replaces its output), vmap loops over items", f_softplus, NULL, in_x, NG, 0},
    {"custom_call", "polar: 2 inputs, 3 outputs (one i32), kernel fills its outputs", f_polar, NULL, in_polar, NG, 0},
    {"custom_call", "a kernel without a vjp (values and vmap only)", f_cube, NULL, in_x, NG, 0},
    {"custom_call_lin", "grad of sum(softplus(x) x) traced inside (the linearized call's transpose)", f_grad_inside, NULL,
     in_x, NG, 0},
};

const nb_prim_case *nb_cases_custom_call(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
