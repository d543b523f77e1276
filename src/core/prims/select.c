/* select(pred, on_true, on_false) and clamp(lo, x, hi): elementwise choices.
 * The public ops broadcast their operands (NumPy rules) first. */
#include <string.h>

#include "core/prims/elementwise.h"

static nb_status select_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  *nout = 1;
  if (nin != 3) return snprintf(why, cap, "takes 3 operands"), NB_ERR_INVALID_ARG;
  if (in[0].dtype != NB_BOOL) return snprintf(why, cap, "predicate must be bool, not %s", nb_dtype_name(in[0].dtype)), NB_ERR_DTYPE;
  if (!nb_shape_equal(&in[0].shape, &in[1].shape)) return snprintf(why, cap, "predicate and value shapes differ"), NB_ERR_SHAPE;
  return nb__ew_infer(2, in + 1, NB_CLASS_ANY, false, out, why, cap);
}

static nb_status select_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const uint8_t *p = nb_array_data(in[0]);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *a = nb_array_data(in[1]), *b = nb_array_data(in[2]);
  char *y = nb_array_data_mut(out[0]);
  int64_t n = nb_array_size(out[0]);
  for (int64_t i = 0; i < n; i++) memcpy(y + i * (int64_t)es, (p[i] ? a : b) + i * (int64_t)es, es);
  return NB_OK;
}

static nb_val *zero_if_null(nb_val *t, nb_val *like) { return t ? t : nb__zeros(like->g, like->aval); }

static nb_status select_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  ot[0] = (t[1] || t[2]) ? nb_select_at(e->loc, p[0], zero_if_null(t[1], p[1]), zero_if_null(t[2], p[2])) : NULL;
  return nb_graph_status(g);
}

static nb_status select_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                  nb_val *const *ct_out, nb_val **ct_in) {
  nb_val *ct = ct_out[0];
  ct_in[0] = ct_in[1] = ct_in[2] = NULL;
  if (linear[0]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "select: linear predicate"), NB_ERR_INTERNAL;
  if (!ct) return NB_OK;
  nb_val *zero = nb__zeros(g, ct->aval);
  if (linear[1]) ct_in[1] = nb_select_at(e->loc, in[0], ct, zero);
  if (linear[2]) ct_in[2] = nb_select_at(e->loc, in[0], zero, ct);
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_select = {
    .name = "select",
    .kind = NB_KIND_ELEMENTWISE,
    .infer = select_infer,
    .eval = select_eval,
    .jvp = select_jvp,
    .transpose = select_transpose,
    .batch = nb__ew_batch,
    .fusion = NB_FUSE_EXPR,
    .c = &(const nb_c_expr){.f = "($0 ? $1 : $2)", .i = "($0 ? $1 : $2)", .exact = true},
};

static nb_status clamp_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                             size_t cap) {
  *nout = 1;
  if (nin != 3) return snprintf(why, cap, "takes 3 operands"), NB_ERR_INVALID_ARG;
  return nb__ew_infer(3, in, NB_CLASS_NUMERIC, false, out, why, cap);
}

static nb_status clamp_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  nb_dtype t = nb_array_dtype(out[0]);
  int64_t n = nb_array_size(out[0]);
  const void *lo = nb_array_data(in[0]), *x = nb_array_data(in[1]), *hi = nb_array_data(in[2]);
  void *y = nb_array_data_mut(out[0]);
  for (int64_t i = 0; i < n; i++) {
    if (nb_dtype_is_float(t)) {
      double v = nb__load_f64(t, x, i), l = nb__load_f64(t, lo, i), h = nb__load_f64(t, hi, i);
      nb__store_f64(t, y, i, v != v ? v : v < l ? l : v > h ? h : v);
    } else {
      int64_t v = nb__load_i64(t, x, i), l = nb__load_i64(t, lo, i), h = nb__load_i64(t, hi, i);
      nb__store_i64(t, y, i, v < l ? l : v > h ? h : v);
    }
  }
  return NB_OK;
}

/* d clamp = t_lo where x < lo, t_hi where x > hi, t_x otherwise. */
static nb_status clamp_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                           nb_val **ot) {
  nb_loc l = e->loc;
  if (!t[0] && !t[1] && !t[2]) return ot[0] = NULL, NB_OK;
  nb_val *inner = nb_select_at(l, nb_gt_at(l, p[1], p[2]), zero_if_null(t[2], p[2]), zero_if_null(t[1], p[1]));
  ot[0] = nb_select_at(l, nb_lt_at(l, p[1], p[0]), zero_if_null(t[0], p[0]), inner);
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_clamp = {
    .name = "clamp",
    .kind = NB_KIND_ELEMENTWISE,
    .infer = clamp_infer,
    .eval = clamp_eval,
    .jvp = clamp_jvp,
    .batch = nb__ew_batch,
    .fusion = NB_FUSE_EXPR,
    .c = &(const nb_c_expr){.f = "nbx_clamp($0, $1, $2)",
                            .i = "($T)((int64_t)$1 < (int64_t)$0 ? $0 : (int64_t)$1 > (int64_t)$2 ? $2 : $1)"},
};

nb_val *nb_select_at(nb_loc loc, nb_val *pred, nb_val *on_true, nb_val *on_false) {
  nb_val *ops[3] = {pred, on_true, on_false};
  nb_graph *g = nb__graph_of(loc, 3, ops);
  if (!g) return NULL;
  if (!pred || !on_true || !on_false) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "select: NULL operand");
  if (nb_graph_status(g)) return nb__poison(g);
  if (!nb__broadcast_pair(loc, &ops[1], &ops[2], "select") || !nb__broadcast_pair(loc, &ops[0], &ops[1], "select") ||
      !nb__broadcast_pair(loc, &ops[0], &ops[2], "select"))
    return nb__poison(g);
  return nb__emit1(g, loc, NB_PRIM_select, 3, ops, NULL, 0);
}

nb_val *nb_clamp_at(nb_loc loc, nb_val *lo, nb_val *x, nb_val *hi) {
  nb_val *ops[3] = {lo, x, hi};
  nb_graph *g = nb__graph_of(loc, 3, ops);
  if (!g) return NULL;
  if (!lo || !x || !hi) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "clamp: NULL operand");
  if (nb_graph_status(g)) return nb__poison(g);
  ops[0] = nb_broadcast_to_at(loc, lo, x->aval.shape.rank, x->aval.shape.dims);
  ops[2] = nb_broadcast_to_at(loc, hi, x->aval.shape.rank, x->aval.shape.dims);
  return nb__emit1(g, loc, NB_PRIM_clamp, 3, ops, NULL, 0);
}
