/* Scans along one axis: cumsum (linear; its transpose is the reversed
 * cumsum) and cummax (its tangent is the input tangent at the position of
 * the running maximum, the first one on ties). Both may run in reverse (from
 * the last element). NaN propagates through cummax as through max. Not
 * here: general associative scans or cumprod/cummin. */
#include <string.h>

#include "core/prims/elementwise.h"

static nb_status cum_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_cumulative_params *p = params;
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "cannot scan bool (convert first)"), NB_ERR_DTYPE;
  if (p->axis < 0 || p->axis >= in[0].shape.rank)
    return snprintf(why, cap, "axis %d out of range for rank %d", p->axis, in[0].shape.rank), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  return NB_OK;
}

/* One pass per line along the axis: outer index o, inner index i. */
static nb_status cum_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_cumulative_params *p = e->params;
  const nb_shape *s = &e->in[0]->aval.shape;
  nb_dtype t = nb_array_dtype(in[0]);
  bool is_sum = e->prim == NB_PRIM_cumsum, is_float = nb_dtype_is_float(t);
  int64_t len = s->dims[p->axis], inner = 1, outer = 1;
  for (int d = 0; d < p->axis; d++) outer *= s->dims[d];
  for (int d = p->axis + 1; d < s->rank; d++) inner *= s->dims[d];
  const void *x = nb_array_data(in[0]);
  void *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      double acc = 0;
      int64_t iacc = 0;
      for (int64_t k = 0; k < len; k++) {
        int64_t at = (o * len + (p->reverse ? len - 1 - k : k)) * inner + i;
        if (is_float) {
          double v = nb__load_f64(t, x, at);
          if (is_sum) acc += v;
          else if (k == 0 || v != v || (acc == acc && v > acc)) acc = v; /* NaN sticks */
          nb__store_f64(t, y, at, acc);
        } else {
          int64_t v = nb__load_i64(t, x, at);
          iacc = is_sum ? (int64_t)((uint64_t)iacc + (uint64_t)v) : (k == 0 || v > iacc) ? v : iacc;
          nb__store_i64(t, y, at, iacc);
        }
      }
    }
  }
  return NB_OK;
}

static nb_status cumsum_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  ot[0] = t[0] ? nb__reemit(g, e, t) : NULL;
  return nb_graph_status(g);
}

static nb_status cumsum_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                  nb_val *const *ct, nb_val **ct_in) {
  const nb_cumulative_params *p = e->params;
  ct_in[0] = ct[0] ? nb_cumsum_at(e->loc, ct[0], p->axis, !p->reverse) : NULL;
  return nb_graph_status(g);
}

/* v shifted by off along axis toward the scan direction, `fill` entering:
 * out[k] = v[k - off] (v[k + off] in reverse). A pad with a negative edge. */
static nb_val *shift(nb_loc l, nb_val *v, int axis, int64_t off, bool reverse, nb_val *fill) {
  int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK] = {0};
  lo[axis] = reverse ? -off : off;
  hi[axis] = -lo[axis];
  return nb_pad_at(l, v, fill, lo, hi, NULL);
}

/* The tangent at the running maximum's first position. The positions where
 * the running maximum changes ("records", and the scan's first position)
 * carry their own tangent; every other position takes that of the last
 * record before it. That forward fill is a log-depth scan of selects on
 * shifted tangents (Hillis-Steele), so it is linear in t and needs no gather. */
static nb_status cummax_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  const nb_cumulative_params *cp = e->params;
  nb_loc l = e->loc;
  nb_aval a = p[0]->aval;
  int ax = cp->axis;
  int64_t len = a.shape.dims[ax];
  ot[0] = NULL;
  if (!t[0]) return NB_OK;
  nb_val *y = outs[0], *tan = t[0];
  nb_val *pos = nb_iota_at(l, g, NB_I64, a.shape.rank, a.shape.dims, ax);
  nb_val *first = nb_eq_at(l, pos, nb_scalar_at(l, g, NB_I64, cp->reverse ? (double)(len - 1) : 0));
  nb_val *zero = nb_scalar_at(l, g, a.dtype, 0), *no = nb_scalar_at(l, g, NB_BOOL, 0);
  nb_val *rec = nb_or_at(l, first, nb_ne_at(l, y, shift(l, y, ax, 1, cp->reverse, zero)));
  for (int64_t off = 1; off < len; off *= 2) {
    tan = nb_select_at(l, rec, tan, shift(l, tan, ax, off, cp->reverse, zero));
    if (off * 2 < len) rec = nb_or_at(l, rec, shift(l, rec, ax, off, cp->reverse, no));
  }
  ot[0] = tan;
  return nb_graph_status(g);
}

static nb_status cum_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                           int *out_bdims) {
  nb_cumulative_params q = *(const nb_cumulative_params *)e->params;
  q.axis++;
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0);
  out[0] = nb__emit1(g, e->loc, e->prim, 1, &x, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void cum_cost(const nb_eqn *e, double *flops, double *bytes) {
  double n = (double)nb_shape_size(&e->in[0]->aval.shape);
  *flops = n;
  *bytes = 2 * n * (double)nb_dtype_size(e->in[0]->aval.dtype);
}

static void cum_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_cumulative_params *p = e->params;
  snprintf(buf, cap, "axis=%d%s", p->axis, p->reverse ? " reverse" : "");
}

const nb_prim_rules nb__prim_cumsum = {
    .name = "cumsum",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_cumulative_params),
    .infer = cum_infer,
    .eval = cum_eval,
    .jvp = cumsum_jvp,
    .transpose = cumsum_transpose,
    .batch = cum_batch,
    .cost = cum_cost,
    .print_params = cum_print,
};

const nb_prim_rules nb__prim_cummax = {
    .name = "cummax",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_cumulative_params),
    .infer = cum_infer,
    .eval = cum_eval,
    .jvp = cummax_jvp,
    .batch = cum_batch,
    .cost = cum_cost,
    .print_params = cum_print,
};

static nb_val *cum_op(nb_loc loc, nb_prim prim, nb_val *x, int axis, bool reverse) {
  if (!x || nb__is_poison(x)) return x;
  int a = nb__norm_axis(axis, x->aval.shape.rank);
  if (a < 0)
    return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "%s: axis %d out of range for rank %d", nb__rules(prim)->name, axis,
                    x->aval.shape.rank);
  nb_cumulative_params p;
  memset(&p, 0, sizeof p);
  p.axis = a;
  p.reverse = reverse;
  return nb__emit1(x->g, loc, prim, 1, &x, &p, sizeof p);
}

nb_val *nb_cumsum_at(nb_loc loc, nb_val *x, int axis, bool reverse) { return cum_op(loc, NB_PRIM_cumsum, x, axis, reverse); }
nb_val *nb_cummax_at(nb_loc loc, nb_val *x, int axis, bool reverse) { return cum_op(loc, NB_PRIM_cummax, x, axis, reverse); }
