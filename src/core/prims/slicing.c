/* Static slicing primitives: slice (start/limit/stride windows), pad (edge
 * padding that may be negative, i.e. cropping, plus interior padding, with a
 * scalar pad-value operand) and concatenate (n operands along one axis). All
 * three are linear and only move elements. Data-dependent windows are in
 * dynamic.c; reshape/broadcast/transpose in shape.c. */
#include <string.h>

#include "core/prims/elementwise.h"

/* Bounds on static window parameters, so that shape arithmetic never
 * overflows int64 (dims themselves are far smaller in practice). */
#define PARAM_LIMIT ((int64_t)1 << 40)

static void print_list(char *buf, size_t cap, const char *label, int n, const int64_t *d) {
  size_t k = strlen(buf);
  if (k >= cap) return;
  k += (size_t)snprintf(buf + k, cap - k, "%s%s=(", k ? " " : "", label);
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)d[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

/* Advances a row-major coordinate counter over dims; false after the last. */
static bool next_coord(int rank, const int64_t *dims, int64_t *c) {
  for (int d = rank - 1; d >= 0; d--) {
    if (++c[d] < dims[d]) return true;
    c[d] = 0;
  }
  return false;
}

/* ---------------------------------------------------------------- slice */

static int64_t slice_len(int64_t start, int64_t limit, int64_t stride) {
  return limit > start ? (limit - start + stride - 1) / stride : 0;
}

static nb_status slice_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                             size_t cap) {
  const nb_slice_params *p = params;
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  for (int d = 0; d < in[0].shape.rank; d++) {
    int64_t n = in[0].shape.dims[d];
    if (p->start[d] < 0 || p->start[d] > p->limit[d] || p->limit[d] > n)
      return snprintf(why, cap, "axis %d: need 0 <= start (%lld) <= limit (%lld) <= dim (%lld)", d,
                      (long long)p->start[d], (long long)p->limit[d], (long long)n), NB_ERR_SHAPE;
    if (p->strides[d] < 1 || p->strides[d] > PARAM_LIMIT)
      return snprintf(why, cap, "axis %d: stride %lld must be positive", d, (long long)p->strides[d]), NB_ERR_INVALID_ARG;
    out[0].shape.dims[d] = slice_len(p->start[d], p->limit[d], p->strides[d]);
  }
  return NB_OK;
}

static nb_status slice_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_slice_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape, *os = &e->out[0]->aval.shape;
  if (nb_shape_size(os) == 0) return NB_OK;
  int64_t istr[NB_MAX_RANK], c[NB_MAX_RANK] = {0}, o = 0;
  nb__strides(is, istr);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *x = nb_array_data(in[0]);
  char *y = nb_array_data_mut(out[0]);
  /* rows of the last dim with unit stride are contiguous: one copy each (the
   * per-layer gradients unstacked from scan_layers' stacked ones) */
  int last = is->rank - 1;
  int64_t run = is->rank && p->strides[last] == 1 ? os->dims[last] : 1;
  int outer = run > 1 ? last : is->rank;
  do {
    int64_t src = 0;
    for (int d = 0; d < is->rank; d++) src += (p->start[d] + (d < outer ? c[d] : 0) * p->strides[d]) * istr[d];
    memcpy(y + o * (int64_t)es, x + src * (int64_t)es, (size_t)(run * (int64_t)es));
    o += run;
  } while (next_coord(outer, os->dims, c));
  return NB_OK;
}

static nb_status linear_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  ot[0] = t[0] ? nb__reemit(g, e, t) : NULL;
  return nb_graph_status(g);
}

/* The cotangent goes back to the strided positions it came from: edge
 * padding up to the operand's extent, stride - 1 zeros in between. */
static nb_status slice_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                 nb_val *const *ct, nb_val **ct_in) {
  const nb_slice_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape, *os = &e->out[0]->aval.shape;
  ct_in[0] = NULL;
  if (!ct[0]) return NB_OK;
  int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK], interior[NB_MAX_RANK];
  for (int d = 0; d < is->rank; d++) {
    int64_t n = os->dims[d];
    lo[d] = p->start[d];
    interior[d] = p->strides[d] - 1;
    hi[d] = is->dims[d] - lo[d] - (n + (n > 0 ? (n - 1) * interior[d] : 0));
  }
  nb_val *zero = nb_scalar_at(e->loc, g, ct[0]->aval.dtype, 0);
  ct_in[0] = nb_pad_at(e->loc, ct[0], zero, lo, hi, interior);
  return nb_graph_status(g);
}

static nb_status slice_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                             nb_val **out, int *out_bdims) {
  const nb_slice_params *p = e->params;
  int r = e->in[0]->aval.shape.rank;
  int64_t start[NB_MAX_RANK], limit[NB_MAX_RANK], strides[NB_MAX_RANK];
  if (r + 1 > NB_MAX_RANK) return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of slice: rank too large"), NB_ERR_SHAPE;
  start[0] = 0, limit[0] = n, strides[0] = 1;
  for (int d = 0; d < r; d++) start[d + 1] = p->start[d], limit[d + 1] = p->limit[d], strides[d + 1] = p->strides[d];
  out[0] = nb_slice_at(e->loc, nb__move_axis(e->loc, in[0], bdims[0], 0), start, limit, strides);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void slice_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_slice_params *p = e->params;
  int r = e->in[0]->aval.shape.rank;
  buf[0] = 0;
  print_list(buf, cap, "start", r, p->start);
  print_list(buf, cap, "limit", r, p->limit);
  print_list(buf, cap, "strides", r, p->strides);
}

const nb_prim_rules nb__prim_slice = {
    .name = "slice",
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_slice_params),
    .infer = slice_infer,
    .eval = slice_eval,
    .jvp = linear_jvp,
    .transpose = slice_transpose,
    .batch = slice_batch,
    .print_params = slice_print,
};

/* ---------------------------------------------------------------- pad */

static nb_status pad_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_pad_params *p = params;
  *nout = 1;
  if (nin != 2) return snprintf(why, cap, "takes 2 operands (x, pad value), got %d", nin), NB_ERR_INVALID_ARG;
  if (in[1].shape.rank != 0) return snprintf(why, cap, "the pad value must be a scalar"), NB_ERR_SHAPE;
  if (in[1].dtype != in[0].dtype)
    return snprintf(why, cap, "pad value dtype %s differs from the operand's %s", nb_dtype_name(in[1].dtype),
                    nb_dtype_name(in[0].dtype)), NB_ERR_DTYPE;
  out[0] = in[0];
  for (int d = 0; d < in[0].shape.rank; d++) {
    int64_t n = in[0].shape.dims[d], lo = p->lo[d], hi = p->hi[d], it = p->interior[d];
    if (it < 0 || it > PARAM_LIMIT || lo < -PARAM_LIMIT || lo > PARAM_LIMIT || hi < -PARAM_LIMIT || hi > PARAM_LIMIT)
      return snprintf(why, cap, "axis %d: interior padding must be >= 0 and edge padding within +-2^40", d), NB_ERR_INVALID_ARG;
    int64_t len = lo + hi + n + (n > 0 ? (n - 1) * it : 0);
    if (len < 0)
      return snprintf(why, cap, "axis %d: padding (lo %lld, hi %lld) crops more than the %lld elements there", d,
                      (long long)lo, (long long)hi, (long long)(n + (n > 0 ? (n - 1) * it : 0))), NB_ERR_SHAPE;
    out[0].shape.dims[d] = len;
  }
  return NB_OK;
}

static nb_status pad_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_pad_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape, *os = &e->out[0]->aval.shape;
  int64_t ostr[NB_MAX_RANK], no = nb_shape_size(os), ni = nb_shape_size(is);
  nb__strides(os, ostr);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *x = nb_array_data(in[0]), *v = nb_array_data(in[1]);
  char *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < no; o++) memcpy(y + o * (int64_t)es, v, es);
  if (no == 0 || ni == 0) return NB_OK;
  int64_t c[NB_MAX_RANK] = {0}, i = 0;
  do {
    int64_t dst = 0;
    bool inside = true;
    for (int d = 0; d < is->rank && inside; d++) {
      int64_t oc = p->lo[d] + c[d] * (p->interior[d] + 1);
      inside = oc >= 0 && oc < os->dims[d];
      dst += oc * ostr[d];
    }
    if (inside) memcpy(y + dst * (int64_t)es, x + i * (int64_t)es, es);
    i++;
  } while (next_coord(is->rank, is->dims, c));
  return NB_OK;
}

/* pad is linear in (x, pad value) jointly. */
static nb_status pad_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                         nb_val **ot) {
  ot[0] = NULL;
  if (!t[0] && !t[1]) return NB_OK;
  nb_val *ts[2] = {t[0] ? t[0] : nb__zeros(g, p[0]->aval), t[1] ? t[1] : nb__zeros(g, p[1]->aval)};
  ot[0] = nb__reemit(g, e, ts);
  return nb_graph_status(g);
}

/* x's cotangent: undo the edge padding (negated pads restore cropped
 * elements as zeros), then take every (interior + 1)-th element. The pad
 * value's: everything not taken by x. */
static nb_status pad_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                               nb_val *const *ct, nb_val **ct_in) {
  const nb_pad_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape;
  int r = is->rank;
  ct_in[0] = ct_in[1] = NULL;
  if (!ct[0]) return NB_OK;
  int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK], start[NB_MAX_RANK], limit[NB_MAX_RANK], strides[NB_MAX_RANK];
  for (int d = 0; d < r; d++) {
    lo[d] = -p->lo[d], hi[d] = -p->hi[d];
    start[d] = 0, strides[d] = p->interior[d] + 1;
    limit[d] = is->dims[d] + (is->dims[d] > 0 ? (is->dims[d] - 1) * p->interior[d] : 0);
  }
  nb_val *zero = nb_scalar_at(e->loc, g, ct[0]->aval.dtype, 0);
  nb_val *ct_x = nb_slice_at(e->loc, nb_pad_at(e->loc, ct[0], zero, lo, hi, NULL), start, limit, strides);
  if (linear[0]) ct_in[0] = ct_x;
  if (linear[1])
    ct_in[1] = nb_sub_at(e->loc, nb_reduce_sum_at(e->loc, ct[0], 0, NULL), nb_reduce_sum_at(e->loc, ct_x, 0, NULL));
  return nb_graph_status(g);
}

/* With an unbatched pad value the batch axis is just not padded; a batched
 * one is written through a mask of the padded positions. */
static nb_status pad_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                           nb_val **out, int *out_bdims) {
  const nb_pad_params *p = e->params;
  nb_loc l = e->loc;
  int r = e->in[0]->aval.shape.rank;
  if (r + 1 > NB_MAX_RANK) return nb__fail(g, l, NB_ERR_SHAPE, "vmap of pad: rank too large"), NB_ERR_SHAPE;
  int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK], it[NB_MAX_RANK];
  lo[0] = hi[0] = it[0] = 0;
  for (int d = 0; d < r; d++) lo[d + 1] = p->lo[d], hi[d + 1] = p->hi[d], it[d + 1] = p->interior[d];
  nb_val *x = nb__batch_to_front(l, in[0], bdims[0], n);
  out_bdims[0] = 0;
  if (bdims[1] < 0) {
    out[0] = nb_pad_at(l, x, in[1], lo, hi, it);
    return nb_graph_status(g);
  }
  nb_val *zero = nb_scalar_at(l, g, x->aval.dtype, 0);
  nb_val *padded = nb_pad_at(l, x, zero, lo, hi, it);
  nb_aval xa = e->in[0]->aval;
  nb_val *ones = nb_full_at(l, g, NB_BOOL, xa.shape.rank, xa.shape.dims, 1);
  nb_val *from_x = nb_pad_at(l, ones, nb_scalar_at(l, g, NB_BOOL, 0), lo + 1, hi + 1, it + 1);
  nb_shape ps = padded->aval.shape;
  int bd[NB_MAX_RANK];
  for (int d = 0; d < r; d++) bd[d] = d + 1;
  nb_val *mask = nb_broadcast_in_dim_at(l, from_x, ps.rank, ps.dims, bd);
  int zero_axis = 0;
  nb_val *v = nb_broadcast_in_dim_at(l, in[1], ps.rank, ps.dims, &zero_axis); /* in[1] is [n] */
  out[0] = nb_select_at(l, mask, padded, v);
  return nb_graph_status(g);
}

static void pad_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_pad_params *p = e->params;
  int r = e->in[0]->aval.shape.rank;
  buf[0] = 0;
  print_list(buf, cap, "lo", r, p->lo);
  print_list(buf, cap, "hi", r, p->hi);
  print_list(buf, cap, "interior", r, p->interior);
}

const nb_prim_rules nb__prim_pad = {
    .name = "pad",
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_pad_params),
    .infer = pad_infer,
    .eval = pad_eval,
    .jvp = pad_jvp,
    .transpose = pad_transpose,
    .batch = pad_batch,
    .print_params = pad_print,
};

/* ---------------------------------------------------------------- concatenate */

static nb_status concat_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  const nb_concatenate_params *p = params;
  *nout = 1;
  if (nin < 1) return snprintf(why, cap, "needs at least one operand"), NB_ERR_INVALID_ARG;
  int r = in[0].shape.rank, a = p->axis;
  if (a < 0 || a >= r) return snprintf(why, cap, "axis %d out of range for rank %d", a, r), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  for (int i = 1; i < nin; i++) {
    if (in[i].dtype != in[0].dtype)
      return snprintf(why, cap, "operand %d is %s, operand 0 is %s", i, nb_dtype_name(in[i].dtype),
                      nb_dtype_name(in[0].dtype)), NB_ERR_DTYPE;
    if (in[i].shape.rank != r) return snprintf(why, cap, "operand %d has rank %d, operand 0 has %d", i, in[i].shape.rank, r), NB_ERR_SHAPE;
    for (int d = 0; d < r; d++)
      if (d != a && in[i].shape.dims[d] != in[0].shape.dims[d])
        return snprintf(why, cap, "operand %d differs from operand 0 in axis %d (%lld vs %lld), not the concatenation axis %d",
                        i, d, (long long)in[i].shape.dims[d], (long long)in[0].shape.dims[d], a), NB_ERR_SHAPE;
    out[0].shape.dims[a] += in[i].shape.dims[a];
  }
  return NB_OK;
}

static nb_status concat_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_concatenate_params *p = e->params;
  const nb_shape *os = &e->out[0]->aval.shape;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < p->axis; d++) outer *= os->dims[d];
  for (int d = p->axis + 1; d < os->rank; d++) inner *= os->dims[d];
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  size_t row = (size_t)(os->dims[p->axis] * inner) * es;
  char *y = nb_array_data_mut(out[0]);
  size_t offset = 0;
  for (int i = 0; i < e->nin; i++) {
    size_t chunk = (size_t)(e->in[i]->aval.shape.dims[p->axis] * inner) * es;
    const char *x = nb_array_data(in[i]);
    for (int64_t o = 0; o < outer && chunk; o++) memcpy(y + (size_t)o * row + offset, x + (size_t)o * chunk, chunk);
    offset += chunk;
  }
  return NB_OK;
}

static nb_status concat_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  ot[0] = NULL;
  bool any = false;
  for (int i = 0; i < e->nin; i++) any = any || t[i];
  if (!any) return NB_OK;
  nb_val **ts = nb_alloc(nb_graph_ctx(g), (size_t)e->nin * sizeof(nb_val *));
  if (!ts) return nb__fail(g, e->loc, NB_ERR_NOMEM, "out of memory"), NB_ERR_NOMEM;
  for (int i = 0; i < e->nin; i++) ts[i] = t[i] ? t[i] : nb__zeros(g, p[i]->aval);
  ot[0] = nb__reemit(g, e, ts);
  nb_dealloc(nb_graph_ctx(g), ts, (size_t)e->nin * sizeof(nb_val *));
  return nb_graph_status(g);
}

static nb_status concat_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                  nb_val *const *ct, nb_val **ct_in) {
  const nb_concatenate_params *p = e->params;
  const nb_shape *os = &e->out[0]->aval.shape;
  int64_t start[NB_MAX_RANK] = {0}, limit[NB_MAX_RANK];
  memcpy(limit, os->dims, sizeof limit);
  for (int i = 0; i < e->nin; i++) {
    int64_t len = e->in[i]->aval.shape.dims[p->axis];
    limit[p->axis] = start[p->axis] + len;
    ct_in[i] = ct[0] && linear[i] ? nb_slice_at(e->loc, ct[0], start, limit, NULL) : NULL;
    start[p->axis] += len;
  }
  return nb_graph_status(g);
}

static nb_status concat_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                              nb_val **out, int *out_bdims) {
  const nb_concatenate_params *p = e->params;
  nb_val **xs = nb_alloc(nb_graph_ctx(g), (size_t)e->nin * sizeof(nb_val *));
  if (!xs) return nb__fail(g, e->loc, NB_ERR_NOMEM, "out of memory"), NB_ERR_NOMEM;
  for (int i = 0; i < e->nin; i++) xs[i] = nb__batch_to_front(e->loc, in[i], bdims[i], n);
  out[0] = nb_concatenate_at(e->loc, e->nin, xs, p->axis + 1);
  out_bdims[0] = 0;
  nb_dealloc(nb_graph_ctx(g), xs, (size_t)e->nin * sizeof(nb_val *));
  return nb_graph_status(g);
}

static void concat_print(const nb_eqn *e, char *buf, size_t cap) {
  snprintf(buf, cap, "axis=%d", ((const nb_concatenate_params *)e->params)->axis);
}

const nb_prim_rules nb__prim_concatenate = {
    .name = "concatenate",
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_concatenate_params),
    .infer = concat_infer,
    .eval = concat_eval,
    .jvp = concat_jvp,
    .transpose = concat_transpose,
    .batch = concat_batch,
    .print_params = concat_print,
};

/* ---------------------------------------------------------------- public ops */

nb_val *nb_slice_at(nb_loc loc, nb_val *x, const int64_t *start, const int64_t *limit, const int64_t *strides) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  if (r && (!start || !limit)) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "slice: start or limit is NULL for a rank-%d operand", r);
  nb_slice_params p;
  memset(&p, 0, sizeof p);
  bool identity = true;
  for (int d = 0; d < r; d++) {
    p.start[d] = start[d];
    p.limit[d] = limit[d];
    p.strides[d] = strides ? strides[d] : 1;
    identity = identity && p.start[d] == 0 && p.limit[d] == x->aval.shape.dims[d] && p.strides[d] == 1;
  }
  if (identity) return x;
  return nb__emit1(x->g, loc, NB_PRIM_slice, 1, &x, &p, sizeof p);
}

nb_val *nb_pad_at(nb_loc loc, nb_val *x, nb_val *pad_value, const int64_t *lo, const int64_t *hi, const int64_t *interior) {
  nb_val *ops[2] = {x, pad_value};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!x || !pad_value) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "pad: %s is NULL", x ? "the pad value" : "the operand");
  if (nb_graph_status(g)) return nb__poison(g);
  int r = x->aval.shape.rank;
  if (r && (!lo || !hi)) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "pad: lo or hi is NULL for a rank-%d operand", r);
  nb_pad_params p;
  memset(&p, 0, sizeof p);
  bool identity = true;
  for (int d = 0; d < r; d++) {
    p.lo[d] = lo[d];
    p.hi[d] = hi[d];
    p.interior[d] = interior ? interior[d] : 0;
    identity = identity && !p.lo[d] && !p.hi[d] && !p.interior[d];
  }
  if (identity && pad_value->aval.shape.rank == 0 && pad_value->aval.dtype == x->aval.dtype) return x;
  return nb__emit1(g, loc, NB_PRIM_pad, 2, ops, &p, sizeof p);
}

nb_val *nb_concatenate_at(nb_loc loc, int n, nb_val *const *xs, int axis) {
  if (n < 1 || !xs) return NULL;
  nb_graph *g = nb__graph_of(loc, n, xs);
  if (!g) return NULL;
  for (int i = 0; i < n; i++)
    if (!xs[i]) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "concatenate: operand %d is NULL", i);
  if (nb_graph_status(g)) return nb__poison(g);
  int r = xs[0]->aval.shape.rank, a = nb__norm_axis(axis, r);
  if (a < 0) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "concatenate: axis %d out of range for rank %d", axis, r);
  if (n == 1) return xs[0];
  nb_concatenate_params p;
  memset(&p, 0, sizeof p);
  p.axis = a;
  return nb__emit1(g, loc, NB_PRIM_concatenate, n, xs, &p, sizeof p);
}
