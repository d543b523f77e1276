/* Primitive-table rows for the core families written with the IR: constants,
 * elementwise (unary, binary, select, clamp, convert), layout (reshape,
 * broadcast_in_dim, transpose) and reductions. Inputs are named a, b, c. */
#include "primcheck.h"

static const int64_t D34[2] = {3, 4}, D4[1] = {4}, D31[2] = {3, 1}, D234[3] = {2, 3, 4};

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

/* ---------------------------------------------------------------- inputs */

static nb_status in_any(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 2, D34)); }
static nb_status in_pos(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_array *a = nb_test_randn(c, r, NB_F64, 2, D34);
  double *d = nb_array_data_mut(a);
  for (int i = 0; i < 12; i++) d[i] = 0.2 + fabs(d[i]);
  return put(in, "a", a);
}
static nb_status in_unit(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* (-0.9, 0.9) */
  nb_array *a = nb_test_randn(c, r, NB_F64, 2, D34);
  double *d = nb_array_data_mut(a);
  for (int i = 0; i < 12; i++) d[i] = 0.9 * tanh(d[i]);
  return put(in, "a", a);
}
static nb_status in_nonzero(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* both signs, |a| >= 0.5 */
  nb_array *a = nb_test_randn(c, r, NB_F64, 2, D34);
  double *d = nb_array_data_mut(a);
  for (int i = 0; i < 12; i++) d[i] = (d[i] < 0 ? -0.5 : 0.5) + d[i];
  return put(in, "a", a);
}
static nb_status in_two(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, 2, D34));
  return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, 2, D34));
}
static nb_status in_two_bcast(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* [3,4] with [4] */
  nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, 2, D34));
  return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, 1, D4));
}
static nb_status in_two_col(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* [3,1] with [3,4] */
  nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, 2, D31));
  return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, 2, D34));
}
static nb_status in_two_pos(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = in_pos(c, r, in);
  return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, 2, D34));
}
static nb_status in_two_denom(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* b away from 0 */
  nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, 2, D34));
  nb_array *b = nb_test_randn(c, r, NB_F64, 2, D34);
  double *d = nb_array_data_mut(b);
  for (int i = 0; i < 12; i++) d[i] = (d[i] < 0 ? -0.5 : 0.5) + d[i];
  return s ? s : put(in, "b", b);
}
static nb_status in_ints(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = put(in, "a", nb_test_randint(c, r, NB_I32, 2, D34, -50, 50));
  return s ? s : put(in, "b", nb_test_randint(c, r, NB_I32, 2, D34, -7, 7));
}
static nb_status in_bools(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = put(in, "a", nb_test_randn(c, r, NB_BOOL, 2, D34));
  return s ? s : put(in, "b", nb_test_randn(c, r, NB_BOOL, 2, D34));
}
static nb_status in_select(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = put(in, "p", nb_test_randn(c, r, NB_BOOL, 2, D34));
  return s ? s : in_two(c, r, in);
}
static nb_status in_rank3(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 3, D234)); }
static nb_status in_vec(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 1, D4)); }
static nb_status in_col(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 2, D31)); }

/* ---------------------------------------------------------------- functions */

#define A nb_tree_get_val(in, "a")
#define B nb_tree_get_val(in, "b")
#define OUT(v) return nb_tree_set_val(out, "y", (v))

typedef nb_val *(*unary_op)(nb_loc, nb_val *);
typedef nb_val *(*binary_op)(nb_loc, nb_val *, nb_val *);
static nb_status apply_unary(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(((unary_op)u)(NB_HERE, A)); }
static nb_status apply_binary(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(((binary_op)u)(NB_HERE, A, B)); }

static nb_status f_const(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *ctx = nb_graph_ctx(g);
  double v[4] = {1, -2, 3.5, 0.25};
  nb_array *k = nb_array_from_f64(ctx, NB_F64, 1, D4, v);
  nb_val *y = nb_mul(A, nb_const(g, k));
  nb_array_release(k);
  OUT(y);
}
static nb_status f_iota(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_mul(A, nb_iota(g, NB_F64, 2, D34, 1)));
}
static nb_status f_select(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_select(nb_tree_get_val(in, "p"), A, B));
}
static nb_status f_clamp(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_clamp(nb_scalar(g, NB_F64, -0.5), A, nb_scalar(g, NB_F64, 0.7)));
}
static nb_status f_convert_f32(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_convert(nb_mul(nb_convert(A, NB_F32), nb_scalar(g, NB_F32, 3)), NB_F64));
}
static nb_status f_convert_int(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_convert(A, NB_I32)); }
static nb_status f_bitcast(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_bitcast(A, NB_I64)); }
static nb_status f_stop_gradient(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_stop_gradient(nb_mul(A, A)));
}
static nb_status f_reshape(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t d[2] = {2, 6};
  OUT(nb_reshape(nb_sin(A), 2, d));
}
static nb_status f_reshape_flat(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t d[1] = {-1};
  OUT(nb_reshape(A, 1, d));
}
static nb_status f_bcast_vec(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int bd[1] = {1};
  OUT(nb_mul(nb_broadcast_in_dim(A, 2, D34, bd), nb_iota(g, NB_F64, 2, D34, 0)));
}
static nb_status f_bcast_col(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int bd[2] = {0, 1};
  OUT(nb_mul(nb_broadcast_in_dim(A, 2, D34, bd), nb_iota(g, NB_F64, 2, D34, 1)));
}
static nb_status f_transpose(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int perm[3] = {2, 0, 1};
  OUT(nb_transpose(nb_exp(A), perm));
}
static nb_status f_transpose_neg(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int perm[3] = {-1, 1, 0};
  OUT(nb_transpose(A, perm));
}
typedef nb_val *(*reduce_op)(nb_loc, nb_val *, int, const int *);
typedef struct reduce_case {
  reduce_op op;
  int naxes;
  int axes[3];
} reduce_case;
static nb_status f_reduce(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const reduce_case *c = u;
  OUT(c->op(NB_HERE, A, c->naxes, c->naxes ? c->axes : NULL));
}
static nb_status f_argmax(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_argmax(A, -1, NB_I32)); }
static nb_status f_argmin(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_argmin(A, 0, NB_I64)); }

static const reduce_case r_sum0 = {nb_reduce_sum_at, 1, {0}}, r_sum_all = {nb_reduce_sum_at, 0, {0}},
                         r_sum_02 = {nb_reduce_sum_at, 2, {0, -1}}, r_max1 = {nb_reduce_max_at, 1, {1}},
                         r_max_all = {nb_reduce_max_at, 0, {0}}, r_min0 = {nb_reduce_min_at, 1, {0}},
                         r_prod1 = {nb_reduce_prod_at, 1, {1}}, r_prod_all = {nb_reduce_prod_at, 2, {0, 1}};

#define NG NB_CASE_NO_GRAD
static const nb_prim_case cases[] = {
    {"constant", "a * constant vector (broadcast)", f_const, NULL, in_any, 0, 0},
    {"iota", "a * iota along axis 1", f_iota, NULL, in_any, 0, 0},
    {"neg", "neg", apply_unary, (void *)nb_neg_at, in_any, 0, 0},
    {"abs", "abs", apply_unary, (void *)nb_abs_at, in_any, 0, 0},
    {"sign", "sign", apply_unary, (void *)nb_sign_at, in_any, 0, 0},
    {"exp", "exp", apply_unary, (void *)nb_exp_at, in_any, 0, 0},
    {"exp2", "exp2", apply_unary, (void *)nb_exp2_at, in_any, 0, 0},
    {"log", "log of positives", apply_unary, (void *)nb_log_at, in_pos, 0, 0},
    {"log1p", "log1p of positives", apply_unary, (void *)nb_log1p_at, in_pos, 0, 0},
    {"expm1", "expm1", apply_unary, (void *)nb_expm1_at, in_any, 0, 0},
    {"sqrt", "sqrt of positives", apply_unary, (void *)nb_sqrt_at, in_pos, 0, 0},
    {"rsqrt", "rsqrt of positives", apply_unary, (void *)nb_rsqrt_at, in_pos, 0, 0},
    {"tanh", "tanh", apply_unary, (void *)nb_tanh_at, in_any, 0, 0},
    {"logistic", "logistic", apply_unary, (void *)nb_logistic_at, in_any, 0, 0},
    {"erf", "erf", apply_unary, (void *)nb_erf_at, in_any, 0, 0},
    {"erf_inv", "erf_inv on (-0.9, 0.9)", apply_unary, (void *)nb_erf_inv_at, in_unit, 0, 0},
    {"sin", "sin", apply_unary, (void *)nb_sin_at, in_any, 0, 0},
    {"cos", "cos", apply_unary, (void *)nb_cos_at, in_any, 0, 0},
    {"floor", "floor", apply_unary, (void *)nb_floor_at, in_any, 0, 0},
    {"ceil", "ceil", apply_unary, (void *)nb_ceil_at, in_any, 0, 0},
    {"round", "round", apply_unary, (void *)nb_round_at, in_any, 0, 0},
    {"is_finite", "is_finite", apply_unary, (void *)nb_is_finite_at, in_any, NG, 0},
    {"cbrt", "cbrt of both signs, away from 0", apply_unary, (void *)nb_cbrt_at, in_nonzero, 0, 0},
    {"erfc", "erfc", apply_unary, (void *)nb_erfc_at, in_any, 0, 0},
    {"not", "not of bools", apply_unary, (void *)nb_not_at, in_bools, NG, 0},
    {"add", "add with broadcasting [3,4]+[4]", apply_binary, (void *)nb_add_at, in_two_bcast, 0, 0},
    {"add", "add [3,1]+[3,4]", apply_binary, (void *)nb_add_at, in_two_col, 0, 0},
    {"sub", "sub", apply_binary, (void *)nb_sub_at, in_two_bcast, 0, 0},
    {"mul", "mul", apply_binary, (void *)nb_mul_at, in_two_col, 0, 0},
    {"div", "div", apply_binary, (void *)nb_div_at, in_two_denom, 0, 0},
    {"rem", "rem", apply_binary, (void *)nb_rem_at, in_two_denom, 0, 0},
    {"pow", "pow of positives", apply_binary, (void *)nb_pow_at, in_two_pos, 0, 0},
    {"max", "max", apply_binary, (void *)nb_max_at, in_two, 0, 0},
    {"min", "min", apply_binary, (void *)nb_min_at, in_two, 0, 0},
    {"atan2", "atan2", apply_binary, (void *)nb_atan2_at, in_two, 0, 0},
    {"eq", "eq", apply_binary, (void *)nb_eq_at, in_ints, NG, 0},
    {"ne", "ne", apply_binary, (void *)nb_ne_at, in_ints, NG, 0},
    {"lt", "lt", apply_binary, (void *)nb_lt_at, in_two, NG, 0},
    {"le", "le", apply_binary, (void *)nb_le_at, in_ints, NG, 0},
    {"gt", "gt", apply_binary, (void *)nb_gt_at, in_two, NG, 0},
    {"ge", "ge", apply_binary, (void *)nb_ge_at, in_ints, NG, 0},
    {"and", "and of bools", apply_binary, (void *)nb_and_at, in_bools, NG, 0},
    {"or", "or of ints", apply_binary, (void *)nb_or_at, in_ints, NG, 0},
    {"xor", "xor of bools", apply_binary, (void *)nb_xor_at, in_bools, NG, 0},
    {"div", "integer div (wraps, x/0 = -1)", apply_binary, (void *)nb_div_at, in_ints, NG, 0},
    {"select", "select(p, a, b)", f_select, NULL, in_select, 0, 0},
    {"clamp", "clamp(-0.5, a, 0.7) with scalar bounds", f_clamp, NULL, in_any, 0, 0},
    {"convert", "f64 -> f32 -> f64", f_convert_f32, NULL, in_any, 0, 5e-2},
    {"convert", "f64 -> i32", f_convert_int, NULL, in_any, NG, 0},
    {"bitcast", "f64 -> i64", f_bitcast, NULL, in_any, NG, 0},
    {"stop_gradient", "stop_gradient(a*a) (value only; gradient tested in test_transforms)", f_stop_gradient, NULL, in_any, NG, 0},
    {"reshape", "[3,4] -> [2,6]", f_reshape, NULL, in_any, 0, 0},
    {"reshape", "[3,4] -> [-1]", f_reshape_flat, NULL, in_any, 0, 0},
    {"broadcast_in_dim", "[4] -> [3,4]", f_bcast_vec, NULL, in_vec, 0, 0},
    {"broadcast_in_dim", "[3,1] -> [3,4] (size-1 dim)", f_bcast_col, NULL, in_col, 0, 0},
    {"transpose", "perm (2,0,1)", f_transpose, NULL, in_rank3, 0, 0},
    {"transpose", "perm (-1,1,0)", f_transpose_neg, NULL, in_rank3, 0, 0},
    {"reduce_sum", "axis 0", f_reduce, (void *)&r_sum0, in_any, 0, 0},
    {"reduce_sum", "all axes", f_reduce, (void *)&r_sum_all, in_rank3, 0, 0},
    {"reduce_sum", "axes (0,-1)", f_reduce, (void *)&r_sum_02, in_rank3, 0, 0},
    {"reduce_max", "axis 1", f_reduce, (void *)&r_max1, in_any, 0, 0},
    {"reduce_max", "all axes", f_reduce, (void *)&r_max_all, in_rank3, 0, 0},
    {"reduce_min", "axis 0", f_reduce, (void *)&r_min0, in_any, 0, 0},
    {"reduce_prod", "axis 1", f_reduce, (void *)&r_prod1, in_any, 0, 0},
    {"reduce_prod", "axes (0,1) of rank 3", f_reduce, (void *)&r_prod_all, in_rank3, 0, 0},
    {"argmax", "last axis, i32", f_argmax, NULL, in_any, NG, 0},
    {"argmin", "axis 0, i64", f_argmin, NULL, in_any, NG, 0},
};

const nb_prim_case *nb_cases_core(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
