/* The elementwise unary ops: the one list of them. nabla/core.h declares
 * nb_<op>_at(loc, x) for each (this file is part of it, not included on its
 * own); src/core/prims/prims.def makes each a primitive of the unary family,
 * whose rows (interpreter, derivative, C expression) are in
 * src/core/prims/unary.c. Adding a unary op: a name here, its macro below,
 * its row there, and its test rows (docs/adding-a-primitive.md). */
#ifndef NABLA_UNARY_H
#define NABLA_UNARY_H

#define NB_UNARY_OPS(X) \
  X(neg) X(abs) X(sign) X(exp) X(exp2) X(log) X(log1p) X(expm1) X(sqrt) X(rsqrt) X(tanh) \
  X(logistic) X(erf) X(erf_inv) X(sin) X(cos) X(floor) X(ceil) X(round) X(is_finite) X(not) \
  X(cbrt) X(erfc)

/* Location-capturing forms, called as nb_exp(x). */
#define nb_neg(x) nb_neg_at(NB_HERE, x)
#define nb_abs(x) nb_abs_at(NB_HERE, x)
#define nb_sign(x) nb_sign_at(NB_HERE, x)
#define nb_exp(x) nb_exp_at(NB_HERE, x)
#define nb_exp2(x) nb_exp2_at(NB_HERE, x)
#define nb_log(x) nb_log_at(NB_HERE, x)
#define nb_log1p(x) nb_log1p_at(NB_HERE, x)
#define nb_expm1(x) nb_expm1_at(NB_HERE, x)
#define nb_sqrt(x) nb_sqrt_at(NB_HERE, x)
#define nb_rsqrt(x) nb_rsqrt_at(NB_HERE, x)
#define nb_tanh(x) nb_tanh_at(NB_HERE, x)
#define nb_logistic(x) nb_logistic_at(NB_HERE, x)
#define nb_erf(x) nb_erf_at(NB_HERE, x)
#define nb_erf_inv(x) nb_erf_inv_at(NB_HERE, x)
#define nb_sin(x) nb_sin_at(NB_HERE, x)
#define nb_cos(x) nb_cos_at(NB_HERE, x)
#define nb_floor(x) nb_floor_at(NB_HERE, x)
#define nb_ceil(x) nb_ceil_at(NB_HERE, x)
#define nb_round(x) nb_round_at(NB_HERE, x)
#define nb_is_finite(x) nb_is_finite_at(NB_HERE, x)
#define nb_not(x) nb_not_at(NB_HERE, x)
#define nb_cbrt(x) nb_cbrt_at(NB_HERE, x)
#define nb_erfc(x) nb_erfc_at(NB_HERE, x)

#endif
