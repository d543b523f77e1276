/* Elementwise binary primitives: one row per primitive in `binary_defs`
 * (dtype class, bool result, float and integer functions, C expression for
 * the compiler); JVPs and the
 * transposes of the linear ones (add, sub, mul, div) follow. Integer
 * arithmetic wraps; integer x/0 is -1 and x%0 is x, as XLA defines them. */
#include <math.h>
#include <string.h>

#include "core/prims/elementwise.h"

typedef struct binary_def {
  nb_dtype_class cls;
  bool bool_out;
  double (*f)(double, double);
  int64_t (*fi)(int64_t, int64_t);
  nb_c_expr c; /* the compiler's C expression (ir.h) */
} binary_def;

static double f_add(double a, double b) { return a + b; }
static double f_sub(double a, double b) { return a - b; }
static double f_mul(double a, double b) { return a * b; }
static double f_div(double a, double b) { return a / b; }
static double f_max(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }
static double f_min(double a, double b) { return a != a || b != b ? NAN : a < b ? a : b; }
static double f_eq(double a, double b) { return a == b; }
static double f_ne(double a, double b) { return a != b; }
static double f_lt(double a, double b) { return a < b; }
static double f_le(double a, double b) { return a <= b; }
static double f_gt(double a, double b) { return a > b; }
static double f_ge(double a, double b) { return a >= b; }
static int64_t i_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t i_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t i_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static int64_t i_div(int64_t a, int64_t b) { return b == 0 ? -1 : (b == -1 ? i_sub(0, a) : a / b); }
static int64_t i_rem(int64_t a, int64_t b) { return b == 0 ? a : (b == -1 ? 0 : a % b); }
static int64_t i_pow(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? (b % 2 ? -1 : 1) : 0;
  int64_t r = 1;
  while (b) {
    if (b & 1) r = i_mul(r, a);
    a = i_mul(a, a);
    b >>= 1;
  }
  return r;
}
static int64_t i_max(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t i_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t i_eq(int64_t a, int64_t b) { return a == b; }
static int64_t i_ne(int64_t a, int64_t b) { return a != b; }
static int64_t i_lt(int64_t a, int64_t b) { return a < b; }
static int64_t i_le(int64_t a, int64_t b) { return a <= b; }
static int64_t i_gt(int64_t a, int64_t b) { return a > b; }
static int64_t i_ge(int64_t a, int64_t b) { return a >= b; }
static int64_t i_and(int64_t a, int64_t b) { return a & b; }
static int64_t i_or(int64_t a, int64_t b) { return a | b; }
static int64_t i_xor(int64_t a, int64_t b) { return a ^ b; }

static const binary_def binary_defs[NB_PRIM_COUNT] = {
    [NB_PRIM_add] = {NB_CLASS_NUMERIC, false, f_add, i_add, {.f = "$0 + $1", .i = "($T)((uint64_t)(int64_t)$0 + (uint64_t)(int64_t)$1)"}},
    [NB_PRIM_sub] = {NB_CLASS_NUMERIC, false, f_sub, i_sub, {.f = "$0 - $1", .i = "($T)((uint64_t)(int64_t)$0 - (uint64_t)(int64_t)$1)"}},
    [NB_PRIM_mul] = {NB_CLASS_NUMERIC, false, f_mul, i_mul, {.f = "$0 * $1", .i = "($T)((uint64_t)(int64_t)$0 * (uint64_t)(int64_t)$1)"}},
    [NB_PRIM_div] = {NB_CLASS_NUMERIC, false, f_div, i_div, {.f = "$0 / $1", .i = "($T)nbx_idiv((int64_t)$0, (int64_t)$1)"}},
    [NB_PRIM_rem] = {NB_CLASS_NUMERIC, false, fmod, i_rem, {.f = "fmod($0, $1)", .i = "($T)nbx_irem((int64_t)$0, (int64_t)$1)"}},
    [NB_PRIM_pow] = {NB_CLASS_NUMERIC, false, pow, i_pow, {.f = "pow($0, $1)", .i = "($T)nbx_ipow((int64_t)$0, (int64_t)$1)"}},
    [NB_PRIM_max] = {NB_CLASS_NUMERIC, false, f_max, i_max, {.f = "nbx_max($0, $1)", .i = "($T)((int64_t)$0 > (int64_t)$1 ? $0 : $1)"}},
    [NB_PRIM_min] = {NB_CLASS_NUMERIC, false, f_min, i_min, {.f = "nbx_min($0, $1)", .i = "($T)((int64_t)$0 < (int64_t)$1 ? $0 : $1)"}},
    [NB_PRIM_atan2] = {NB_CLASS_FLOAT, false, atan2, NULL, {.f = "atan2($0, $1)", .i = NULL}},
    [NB_PRIM_eq] = {NB_CLASS_ANY, true, f_eq, i_eq, {.f = "(uint8_t)($0 == $1)", .i = "(uint8_t)((int64_t)$0 == (int64_t)$1)"}},
    [NB_PRIM_ne] = {NB_CLASS_ANY, true, f_ne, i_ne, {.f = "(uint8_t)($0 != $1)", .i = "(uint8_t)((int64_t)$0 != (int64_t)$1)"}},
    [NB_PRIM_lt] = {NB_CLASS_ANY, true, f_lt, i_lt, {.f = "(uint8_t)($0 < $1)", .i = "(uint8_t)((int64_t)$0 < (int64_t)$1)"}},
    [NB_PRIM_le] = {NB_CLASS_ANY, true, f_le, i_le, {.f = "(uint8_t)($0 <= $1)", .i = "(uint8_t)((int64_t)$0 <= (int64_t)$1)"}},
    [NB_PRIM_gt] = {NB_CLASS_ANY, true, f_gt, i_gt, {.f = "(uint8_t)($0 > $1)", .i = "(uint8_t)((int64_t)$0 > (int64_t)$1)"}},
    [NB_PRIM_ge] = {NB_CLASS_ANY, true, f_ge, i_ge, {.f = "(uint8_t)($0 >= $1)", .i = "(uint8_t)((int64_t)$0 >= (int64_t)$1)"}},
    [NB_PRIM_and] = {NB_CLASS_INTBOOL, false, NULL, i_and, {.f = NULL, .i = "($T)($0 & $1)"}},
    [NB_PRIM_or] = {NB_CLASS_INTBOOL, false, NULL, i_or, {.f = NULL, .i = "($T)($0 | $1)"}},
    [NB_PRIM_xor] = {NB_CLASS_INTBOOL, false, NULL, i_xor, {.f = NULL, .i = "($T)($0 ^ $1)"}},
};

static nb_status infer_for(nb_prim p, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  *nout = 1;
  if (nin != 2) return snprintf(why, cap, "takes 2 operands, got %d", nin), NB_ERR_INVALID_ARG;
  return nb__ew_infer(2, in, binary_defs[p].cls, binary_defs[p].bool_out, out, why, cap);
}

static nb_status binary_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const binary_def *d = &binary_defs[e->prim];
  nb_dtype t = nb_array_dtype(in[0]), to = nb_array_dtype(out[0]);
  const void *a = nb_array_data(in[0]), *b = nb_array_data(in[1]);
  void *y = nb_array_data_mut(out[0]);
  int64_t n = nb_array_size(in[0]);
  if (nb_dtype_is_float(t) || !d->fi) {
    for (int64_t i = 0; i < n; i++) nb__store_f64(to, y, i, d->f(nb__load_f64(t, a, i), nb__load_f64(t, b, i)));
  } else if (nb_dtype_is_unsigned(t) && (e->prim == NB_PRIM_div || e->prim == NB_PRIM_rem ||
                                         e->prim == NB_PRIM_lt || e->prim == NB_PRIM_le || e->prim == NB_PRIM_gt ||
                                         e->prim == NB_PRIM_ge || e->prim == NB_PRIM_max || e->prim == NB_PRIM_min)) {
    /* u32/u8 values fit in int64 as non-negative numbers: signed ops agree,
     * except x/0 which is all ones for unsigned dtypes. */
    for (int64_t i = 0; i < n; i++) {
      int64_t x = nb__load_i64(t, a, i), z = nb__load_i64(t, b, i);
      nb__store_i64(to, y, i, (e->prim == NB_PRIM_div && z == 0) ? -1 : d->fi(x, z));
    }
  } else {
    for (int64_t i = 0; i < n; i++) nb__store_i64(to, y, i, d->fi(nb__load_i64(t, a, i), nb__load_i64(t, b, i)));
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- derivatives */

static nb_val *one_like(nb_loc l, nb_val *x) { return nb_full_like_at(l, x, 1); }
static nb_val *scale(nb_loc l, nb_val *t, nb_val *factor) { return t ? nb_mul_at(l, t, factor) : NULL; }

/* weight of a in y = max/min(a, b): 1 where y is a alone, 0.5 where it is
 * both (ties), 0 where it is b alone or NaN (a NaN operand passes no
 * gradient to either side), as JAX's */
static nb_val *pick_weight(nb_loc l, nb_val *a, nb_val *b, nb_val *y) {
  nb_val *half = nb_full_like_at(l, a, 0.5), *zero = nb_full_like_at(l, a, 0);
  return nb_select_at(l, nb_eq_at(l, a, y), nb_select_at(l, nb_eq_at(l, b, y), half, one_like(l, a)), zero);
}

static nb_status binary_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  nb_loc l = e->loc;
  nb_val *a = p[0], *b = p[1], *ta = t[0], *tb = t[1], *y = outs[0];
  switch (e->prim) {
  case NB_PRIM_add: ot[0] = nb__add_tangents(l, ta, tb); break;
  case NB_PRIM_sub: ot[0] = ta ? (tb ? nb_sub_at(l, ta, tb) : ta) : (tb ? nb_neg_at(l, tb) : NULL); break;
  case NB_PRIM_mul: ot[0] = nb__add_tangents(l, scale(l, ta, b), scale(l, tb, a)); break;
  case NB_PRIM_div:
    ot[0] = nb__add_tangents(l, ta ? nb_div_at(l, ta, b) : NULL, scale(l, tb, nb_neg_at(l, nb_div_at(l, y, b))));
    break;
  case NB_PRIM_rem: { /* rem(a, b) = a - b * trunc(a / b) */
    nb_val *q = nb_div_at(l, a, b), *trunc = nb_sub_at(l, q, nb_rem_at(l, q, one_like(l, q)));
    ot[0] = nb__add_tangents(l, ta, scale(l, tb, nb_neg_at(l, trunc)));
    break;
  }
  case NB_PRIM_pow: {
    nb_val *da = ta ? nb_mul_at(l, b, nb_pow_at(l, a, nb_sub_at(l, b, one_like(l, b)))) : NULL;
    /* d/db = y log(a), with log(0) replaced so that 0^b has derivative 0 */
    nb_val *safe_a = tb ? nb_select_at(l, nb_eq_at(l, a, nb_full_like_at(l, a, 0)), one_like(l, a), a) : NULL;
    nb_val *db = tb ? nb_mul_at(l, y, nb_log_at(l, safe_a)) : NULL;
    ot[0] = nb__add_tangents(l, scale(l, ta, da), scale(l, tb, db));
    break;
  }
  case NB_PRIM_max:
  case NB_PRIM_min: {
    ot[0] = nb__add_tangents(l, ta ? scale(l, ta, pick_weight(l, a, b, y)) : NULL, tb ? scale(l, tb, pick_weight(l, b, a, y)) : NULL);
    break;
  }
  case NB_PRIM_atan2: { /* d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2) */
    nb_val *r2 = nb_add_at(l, nb_mul_at(l, a, a), nb_mul_at(l, b, b));
    ot[0] = nb__add_tangents(l, scale(l, ta, nb_div_at(l, b, r2)), scale(l, tb, nb_neg_at(l, nb_div_at(l, a, r2))));
    break;
  }
  default: ot[0] = NULL; break; /* comparisons and logic: not differentiable (bool/int results) */
  }
  return nb_graph_status(g);
}

static nb_status binary_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                  nb_val *const *ct_out, nb_val **ct_in) {
  nb_loc l = e->loc;
  nb_val *ct = ct_out[0];
  ct_in[0] = ct_in[1] = NULL;
  if (!ct) return NB_OK;
  switch (e->prim) {
  case NB_PRIM_add:
    if (linear[0]) ct_in[0] = ct;
    if (linear[1]) ct_in[1] = ct;
    break;
  case NB_PRIM_sub:
    if (linear[0]) ct_in[0] = ct;
    if (linear[1]) ct_in[1] = nb_neg_at(l, ct);
    break;
  case NB_PRIM_mul:
    if (linear[0] && linear[1]) return nb__fail(g, l, NB_ERR_INTERNAL, "mul: transpose with both operands linear"), NB_ERR_INTERNAL;
    if (linear[0]) ct_in[0] = nb_mul_at(l, ct, in[1]);
    else ct_in[1] = nb_mul_at(l, in[0], ct);
    break;
  case NB_PRIM_div:
    if (linear[1]) return nb__fail(g, l, NB_ERR_INTERNAL, "div: transpose with a linear denominator"), NB_ERR_INTERNAL;
    ct_in[0] = nb_div_at(l, ct, in[1]);
    break;
  default: return nb__fail(g, l, NB_ERR_INTERNAL, "%s is not linear", nb__rules(e->prim)->name), NB_ERR_INTERNAL;
  }
  return nb_graph_status(g);
}

#define IS_LINEAR(p) ((p) == NB_PRIM_add || (p) == NB_PRIM_sub || (p) == NB_PRIM_mul || (p) == NB_PRIM_div)

#define BINARY_RULES(op)                                                                            \
  static nb_status infer_##op(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, \
                                char *why, size_t cap) {                                              \
    return infer_for(NB_PRIM_##op, nin, in, nout, out, why, cap);                                   \
  }                                                                                                   \
  const nb_prim_rules nb__prim_##op = {                                                             \
      .name = #op,                                                                                  \
      .kind = NB_KIND_ELEMENTWISE,                                                                    \
      .infer = infer_##op,                                                                          \
      .eval = binary_eval,                                                                            \
      .jvp = binary_jvp,                                                                              \
      .transpose = IS_LINEAR(NB_PRIM_##op) ? binary_transpose : NULL,                               \
      .batch = nb__ew_batch,                                                                          \
      .fusion = NB_FUSE_EXPR,                                                                         \
      .c = &binary_defs[NB_PRIM_##op].c,                                                              \
  };                                                                                                  \
  nb_val *nb_##op##_at(nb_loc loc, nb_val *a, nb_val *b) {                                          \
    nb_val *ops[2] = {a, b};                                                                          \
    nb_graph *g = nb__graph_of(loc, 2, ops);                                                          \
    if (!g || !a || !b) return g ? nb__fail(g, loc, NB_ERR_INVALID_ARG, #op ": NULL operand") : NULL; \
    if (nb_graph_status(g)) return nb__poison(g);                                                     \
    if (!nb__broadcast_pair(loc, &ops[0], &ops[1], #op)) return nb__poison(g);                      \
    return nb__emit1(g, loc, NB_PRIM_##op, 2, ops, NULL, 0);                                        \
  }
NB_BINARY_OPS(BINARY_RULES)
