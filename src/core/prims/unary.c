/* Elementwise unary primitives: one row per primitive in `unary_defs`
 * (dtype class, the float and integer functions, the derivative factor
 * d y / d x built from x and y, and the C expression for the compiler); the rules are derived from the row. */
#include <math.h>
#include <string.h>

#include "core/prims/elementwise.h"
#include "core/prims/erf_inv.h"
#include "core/prims/float_math.h"

typedef nb_val *(*deriv_fn)(nb_loc loc, nb_val *x, nb_val *y);

typedef struct unary_def {
  nb_dtype_class cls;
  bool bool_out;
  double (*f)(double);
  int64_t (*fi)(int64_t);   /* integer/bool version, NULL: computed through f */
  deriv_fn deriv;           /* NULL: zero derivative */
  nb_c_expr c;              /* the compiler's C expression (ir.h) */
  float (*f32)(float);      /* f32/bf16/f16 version, the one the compiled code calls (float_math.h); NULL: through f */
} unary_def;

NB__ERF_INV_DEF(erf_inv)
NB__FLOAT_MATH_DEF(fm_)

static double f_neg(double x) { return -x; }
static double f_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : x; }
static double f_rsqrt(double x) { return 1 / sqrt(x); }
static double f_logistic(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
static double f_is_finite(double x) { return isfinite(x) ? 1 : 0; }
static int64_t i_neg(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static int64_t i_abs(int64_t x) { return x < 0 ? i_neg(x) : x; }
static int64_t i_sign(int64_t x) { return (x > 0) - (x < 0); }
static int64_t i_not(int64_t x) { return ~x; }

/* Derivative factors, emitted with the equation's location. */
static nb_val *d_neg(nb_loc l, nb_val *x, nb_val *y) { return nb_full_like_at(l, x, -1); }
/* 1 for x >= 0 (0 included), else -1 (NaN too): JAX's rule */
static nb_val *d_abs(nb_loc l, nb_val *x, nb_val *y) {
  return nb_select_at(l, nb_ge_at(l, x, nb_full_like_at(l, x, 0)), nb_full_like_at(l, x, 1), nb_full_like_at(l, x, -1));
}
static nb_val *d_exp(nb_loc l, nb_val *x, nb_val *y) { return y; }
static nb_val *d_exp2(nb_loc l, nb_val *x, nb_val *y) { return nb_mul_at(l, y, nb_full_like_at(l, y, M_LN2)); }
static nb_val *d_log(nb_loc l, nb_val *x, nb_val *y) { return nb_div_at(l, nb_full_like_at(l, x, 1), x); }
static nb_val *d_log1p(nb_loc l, nb_val *x, nb_val *y) {
  return nb_div_at(l, nb_full_like_at(l, x, 1), nb_add_at(l, x, nb_full_like_at(l, x, 1)));
}
static nb_val *d_expm1(nb_loc l, nb_val *x, nb_val *y) { return nb_add_at(l, y, nb_full_like_at(l, y, 1)); }
static nb_val *d_sqrt(nb_loc l, nb_val *x, nb_val *y) { return nb_div_at(l, nb_full_like_at(l, y, 0.5), y); }
static nb_val *d_rsqrt(nb_loc l, nb_val *x, nb_val *y) {
  return nb_mul_at(l, nb_full_like_at(l, y, -0.5), nb_div_at(l, y, x));
}
static nb_val *d_tanh(nb_loc l, nb_val *x, nb_val *y) { return nb_sub_at(l, nb_full_like_at(l, y, 1), nb_mul_at(l, y, y)); }
static nb_val *d_logistic(nb_loc l, nb_val *x, nb_val *y) {
  return nb_mul_at(l, y, nb_sub_at(l, nb_full_like_at(l, y, 1), y));
}
static nb_val *d_erf(nb_loc l, nb_val *x, nb_val *y) {
  return nb_mul_at(l, nb_full_like_at(l, x, 1.1283791670955126), nb_exp_at(l, nb_neg_at(l, nb_mul_at(l, x, x))));
}
static nb_val *d_erf_inv(nb_loc l, nb_val *x, nb_val *y) {
  return nb_mul_at(l, nb_full_like_at(l, y, 0.88622692545275801), nb_exp_at(l, nb_mul_at(l, y, y)));
}
/* 1 / (3 y^2), infinite at 0 as JAX's */
static nb_val *d_cbrt(nb_loc l, nb_val *x, nb_val *y) {
  return nb_div_at(l, nb_full_like_at(l, y, 1.0 / 3), nb_mul_at(l, y, y));
}
/* -2 / sqrt(pi) exp(-x^2) */
static nb_val *d_erfc(nb_loc l, nb_val *x, nb_val *y) {
  return nb_mul_at(l, nb_full_like_at(l, x, -1.1283791670955126), nb_exp_at(l, nb_neg_at(l, nb_mul_at(l, x, x))));
}
static nb_val *d_sin(nb_loc l, nb_val *x, nb_val *y) { return nb_cos_at(l, x); }
static nb_val *d_cos(nb_loc l, nb_val *x, nb_val *y) { return nb_neg_at(l, nb_sin_at(l, x)); }

static const unary_def unary_defs[NB_PRIM_COUNT] = {
    [NB_PRIM_neg] = {NB_CLASS_NUMERIC, false, f_neg, i_neg, d_neg, {.f = "-$0", .i = "($T)(0 - (uint64_t)(int64_t)$0)"}},
    [NB_PRIM_abs] = {NB_CLASS_NUMERIC, false, fabs, i_abs, d_abs, {.f = "fabs($0)", .i = "($T)((int64_t)$0 < 0 ? 0 - (uint64_t)(int64_t)$0 : (uint64_t)(int64_t)$0)"}},
    [NB_PRIM_sign] = {NB_CLASS_NUMERIC, false, f_sign, i_sign, NULL, {.f = "nbx_sign($0)", .i = "($T)(((int64_t)$0 > 0) - ((int64_t)$0 < 0))"}},
    [NB_PRIM_exp] = {NB_CLASS_FLOAT, false, exp, NULL, d_exp, {.f = "exp($0)", .f32 = "nbx_expf($0)"}, fm_expf},
    [NB_PRIM_exp2] = {NB_CLASS_FLOAT, false, exp2, NULL, d_exp2, {.f = "exp2($0)"}},
    [NB_PRIM_log] = {NB_CLASS_FLOAT, false, log, NULL, d_log, {.f = "log($0)"}},
    [NB_PRIM_log1p] = {NB_CLASS_FLOAT, false, log1p, NULL, d_log1p, {.f = "log1p($0)"}},
    [NB_PRIM_expm1] = {NB_CLASS_FLOAT, false, expm1, NULL, d_expm1, {.f = "expm1($0)"}},
    [NB_PRIM_sqrt] = {NB_CLASS_FLOAT, false, sqrt, NULL, d_sqrt, {.f = "sqrt($0)"}},
    [NB_PRIM_rsqrt] = {NB_CLASS_FLOAT, false, f_rsqrt, NULL, d_rsqrt, {.f = "1 / sqrt($0)"}},
    [NB_PRIM_tanh] = {NB_CLASS_FLOAT, false, tanh, NULL, d_tanh, {.f = "tanh($0)", .f32 = "nbx_tanhf($0)"}, fm_tanhf},
    [NB_PRIM_logistic] = {NB_CLASS_FLOAT, false, f_logistic, NULL, d_logistic, {.f = "nbx_logistic($0)", .f32 = "nbx_logisticf($0)"}, fm_logisticf},
    [NB_PRIM_erf] = {NB_CLASS_FLOAT, false, erf, NULL, d_erf, {.f = "erf($0)"}},
    [NB_PRIM_erf_inv] = {NB_CLASS_FLOAT, false, erf_inv, NULL, d_erf_inv, {.f = "nbx_erf_inv((double)$0)"}},
    [NB_PRIM_sin] = {NB_CLASS_FLOAT, false, sin, NULL, d_sin, {.f = "sin($0)"}},
    [NB_PRIM_cos] = {NB_CLASS_FLOAT, false, cos, NULL, d_cos, {.f = "cos($0)"}},
    [NB_PRIM_floor] = {NB_CLASS_FLOAT, false, floor, NULL, NULL, {.f = "floor($0)"}},
    [NB_PRIM_ceil] = {NB_CLASS_FLOAT, false, ceil, NULL, NULL, {.f = "ceil($0)"}},
    [NB_PRIM_round] = {NB_CLASS_FLOAT, false, round, NULL, NULL, {.f = "round($0)"}}, /* half away from zero, as lax.round */
    [NB_PRIM_is_finite] = {NB_CLASS_FLOAT, true, f_is_finite, NULL, NULL, {.f = "(uint8_t)(isfinite($0) != 0)"}},
    [NB_PRIM_cbrt] = {NB_CLASS_FLOAT, false, cbrt, NULL, d_cbrt, {.f = "cbrt($0)"}},
    [NB_PRIM_erfc] = {NB_CLASS_FLOAT, false, erfc, NULL, d_erfc, {.f = "erfc($0)"}},
    [NB_PRIM_not] = {NB_CLASS_INTBOOL, false, NULL, i_not, NULL, {.i = "($T)~(int64_t)$0", .b = "(uint8_t)!$0"}},
};


static nb_status infer_for(nb_prim p, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  return nb__ew_infer(1, in, unary_defs[p].cls, unary_defs[p].bool_out, out, why, cap);
}

static nb_status unary_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const unary_def *d = &unary_defs[e->prim];
  nb_dtype t = nb_array_dtype(in[0]), to = nb_array_dtype(out[0]);
  const void *x = nb_array_data(in[0]);
  void *y = nb_array_data_mut(out[0]);
  int64_t n = nb_array_size(in[0]);
  if (e->prim == NB_PRIM_not && t == NB_BOOL) {
    for (int64_t i = 0; i < n; i++) ((uint8_t *)y)[i] = !((const uint8_t *)x)[i];
  } else if (!nb_dtype_is_float(t) && d->fi) {
    for (int64_t i = 0; i < n; i++) nb__store_i64(to, y, i, d->fi(nb__load_i64(t, x, i)));
  } else if (d->f32 && t != NB_F64) {
    for (int64_t i = 0; i < n; i++) nb__store_f64(to, y, i, d->f32((float)nb__load_f64(t, x, i)));
  } else {
    for (int64_t i = 0; i < n; i++) nb__store_f64(to, y, i, d->f(nb__load_f64(t, x, i)));
  }
  return NB_OK;
}

static nb_status unary_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *primals, nb_val *const *tangents,
                           nb_val *const *outs, nb_val **out_tangents) {
  const unary_def *d = &unary_defs[e->prim];
  out_tangents[0] = NULL;
  if (!tangents[0] || !d->deriv) return NB_OK;
  if (e->prim == NB_PRIM_neg) out_tangents[0] = nb_neg_at(e->loc, tangents[0]);
  else out_tangents[0] = nb_mul_at(e->loc, tangents[0], d->deriv(e->loc, primals[0], outs[0]));
  return nb_graph_status(g);
}

/* neg is the only linear unary primitive. */
static nb_status neg_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                               nb_val *const *ct_out, nb_val **ct_in) {
  ct_in[0] = ct_out[0] ? nb_neg_at(e->loc, ct_out[0]) : NULL;
  return nb_graph_status(g);
}

#define UNARY_RULES(op)                                                                            \
  static nb_status infer_##op(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, \
                                char *why, size_t cap) {                                             \
    return infer_for(NB_PRIM_##op, nin, in, nout, out, why, cap);                                  \
  }                                                                                                  \
  const nb_prim_rules nb__prim_##op = {                                                            \
      .name = #op,                                                                                 \
      .kind = NB_KIND_ELEMENTWISE,                                                                   \
      .infer = infer_##op,                                                                         \
      .eval = unary_eval,                                                                            \
      .jvp = unary_jvp,                                                                              \
      .transpose = NB_PRIM_##op == NB_PRIM_neg ? neg_transpose : NULL,                             \
      .batch = nb__ew_batch,                                                                         \
      .fusion = NB_FUSE_EXPR,                                                                        \
      .c = &unary_defs[NB_PRIM_##op].c,                                                              \
  };                                                                                                 \
  nb_val *nb_##op##_at(nb_loc loc, nb_val *x) {                                                    \
    if (!x) return NULL;                                                                             \
    return nb__emit1(x->g, loc, NB_PRIM_##op, 1, &x, NULL, 0);                                     \
  }
NB_UNARY_OPS(UNARY_RULES)
