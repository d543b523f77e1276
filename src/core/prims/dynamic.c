/* Data-dependent windows: dynamic_slice and dynamic_update_slice. Start
 * indices are scalar integer operands (one per axis, all of one dtype),
 * clamped so the window fits, as XLA does (negative starts clamp to 0; the
 * Python-style wrap of jax.lax's wrappers is not done here). Both are
 * linear: dynamic_slice in the operand, dynamic_update_slice in operand and
 * update jointly.
 *
 * vmap with batched start indices does not loop and needs no gather: axes
 * whose start is unbatched use the primitive itself; each axis whose start
 * is batched is moved per row with static ops only, whichever is cheaper:
 * a one-hot mask (iotas compared with the row's start), a select and a sum
 * (window x extent work, best for short windows), or a shift by each set bit
 * of the row's start (a pad and a select per bit: extent x log2(extent)). */
#include <string.h>

#include "core/prims/elementwise.h"

/* Checks the start operands: rank-0 integers of one dtype. */
static nb_status starts_check(int n, const nb_aval *s, char *why, size_t cap) {
  for (int i = 0; i < n; i++) {
    if (s[i].shape.rank != 0) return snprintf(why, cap, "start index %d is not a scalar", i), NB_ERR_SHAPE;
    if (!nb_dtype_is_int(s[i].dtype))
      return snprintf(why, cap, "start index %d is %s, not an integer", i, nb_dtype_name(s[i].dtype)), NB_ERR_DTYPE;
    if (s[i].dtype != s[0].dtype)
      return snprintf(why, cap, "start indices have different dtypes (%s and %s)", nb_dtype_name(s[0].dtype),
                      nb_dtype_name(s[i].dtype)), NB_ERR_DTYPE;
  }
  return NB_OK;
}

/* Start of every axis, clamped into [0, dim - size]. */
static void clamped_starts(const nb_shape *x, const int64_t *sizes, nb_array *const *starts, int64_t *s) {
  for (int d = 0; d < x->rank; d++) {
    int64_t v = nb__load_i64(nb_array_dtype(starts[d]), nb_array_data(starts[d]), 0), hi = x->dims[d] - sizes[d];
    s[d] = v < 0 ? 0 : v > hi ? hi : v;
  }
}

/* Copies the window at s between the full array `big` and the window array
 * `small` (of shape ws), in the direction given by `into_big`, one
 * contiguous run at a time: the innermost axis plus the axes inside it that
 * the window spans whole (a KV-cache row of [B, H, 1, D] is H runs of D). */
static void copy_window(const nb_shape *bs, const nb_shape *ws, const int64_t *s, size_t es, char *big, char *small,
                        bool into_big) {
  int r = ws->rank;
  if (nb_shape_size(ws) == 0) return;
  if (r == 0) {
    memcpy(into_big ? big : small, into_big ? small : big, es);
    return;
  }
  int64_t bstr[NB_MAX_RANK], idx[NB_MAX_RANK] = {0}, run = ws->dims[r - 1], nruns = 1;
  nb__strides(bs, bstr);
  int inner = r - 1; /* axes [inner, r) make one run; those after inner are whole */
  while (inner > 0 && ws->dims[inner] == bs->dims[inner]) run *= ws->dims[--inner];
  for (int d = 0; d < inner; d++) nruns *= ws->dims[d];
  size_t bytes = (size_t)run * es;
  for (int64_t k = 0; k < nruns; k++, small += bytes) {
    int64_t b = 0;
    for (int d = 0; d < r; d++) b += (s[d] + idx[d]) * bstr[d];
    if (into_big) memcpy(big + b * (int64_t)es, small, bytes);
    else memcpy(small, big + b * (int64_t)es, bytes);
    for (int d = inner - 1; d >= 0 && ++idx[d] == ws->dims[d]; d--) idx[d] = 0;
  }
}

static void print_sizes(const nb_eqn *e, char *buf, size_t cap) {
  const nb_dynamic_slice_params *p = e->params;
  size_t k = (size_t)snprintf(buf, cap, "sizes=(");
  for (int i = 0; i < e->in[0]->aval.shape.rank && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)p->sizes[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

/* ---------------------------------------------------------------- batching helpers */

/* The start for one axis as i64, clamped into [0, dim - size]. */
static nb_val *clamp_start(nb_loc l, nb_val *s, int64_t dim, int64_t size) {
  nb_graph *g = nb_val_graph(s);
  return nb_clamp_at(l, nb_scalar_at(l, g, NB_I64, 0), nb_convert_at(l, s, NB_I64), nb_scalar_at(l, g, NB_I64, (double)(dim - size)));
}

/* One axis of a per-row window by a one-hot mask. v is [n, ...] with the
 * window axis at ax >= 1, s the clamped starts (i64 [n]).
 *  take:  out[b,..,j,..] = v[b,..,s[b]+j,..] for j < len (v's axis: the extent);
 *  place: out[b,..,p,..] = v[b,..,p-s[b],..] where that index exists, else 0,
 *         for p < len (v's axis: the window).
 * The mask over (out index, v index) selects, a sum removes v's axis. */
static nb_val *onehot_axis(nb_loc l, nb_val *v, int ax, nb_val *s, int64_t len, bool take) {
  nb_graph *g = nb_val_graph(v);
  nb_shape vs = nb_val_aval(v).shape;
  int r = vs.rank;
  if (r + 1 > NB_MAX_RANK) return nb__fail(g, l, NB_ERR_SHAPE, "vmap of a dynamic window with batched starts: rank %d is too large", r);
  nb_dtype t = nb_val_dtype(v);
  if (t == NB_BOOL) v = nb_convert_at(l, v, NB_U8);
  int64_t wd[NB_MAX_RANK], md[3] = {vs.dims[0], len, vs.dims[ax]};
  int vb[NB_MAX_RANK], mb[3] = {0, ax, ax + 1}, zero = 0;
  for (int d = 0, k = 0; d <= r; d++) wd[d] = d == ax ? len : vs.dims[k++];
  for (int d = 0; d < r; d++) vb[d] = d < ax ? d : d + 1;
  nb_val *wide = nb_broadcast_in_dim_at(l, v, r + 1, wd, vb);
  nb_val *out_i = nb_iota_at(l, g, NB_I64, 3, md, 1), *v_i = nb_iota_at(l, g, NB_I64, 3, md, 2);
  nb_val *sb = nb_broadcast_in_dim_at(l, s, 3, md, &zero);
  nb_val *mask = take ? nb_eq_at(l, v_i, nb_add_at(l, sb, out_i)) : nb_eq_at(l, out_i, nb_add_at(l, sb, v_i));
  nb_val *picked = nb_select_at(l, nb_broadcast_in_dim_at(l, mask, r + 1, wd, mb), wide, nb_full_like_at(l, wide, 0));
  int red = ax + 1;
  nb_val *y = nb_reduce_sum_at(l, picked, 1, &red);
  return t == NB_BOOL ? nb_convert_at(l, y, NB_BOOL) : y;
}

/* The same by binary shifts: for each bit of the largest start, rows whose
 * start has that bit take v shifted by it (a pad with one negative edge).
 * Shifts never exceed extent - window, so no kept element falls off. */
static nb_val *shift_axis(nb_loc l, nb_val *v, int ax, nb_val *s, int64_t len, bool take) {
  nb_graph *g = nb_val_graph(v);
  nb_shape vs = nb_val_aval(v).shape;
  int64_t extent = take ? vs.dims[ax] : len, window = take ? len : vs.dims[ax];
  int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK] = {0}, start[NB_MAX_RANK] = {0}, limit[NB_MAX_RANK];
  int zero_axis = 0;
  nb_val *zero = nb_scalar_at(l, g, nb_val_dtype(v), 0);
  if (!take) { /* the window, zero-padded to the extent */
    hi[ax] = extent - window;
    v = nb_pad_at(l, v, zero, lo, hi, NULL);
    vs = nb_val_aval(v).shape;
  }
  for (int64_t bit = 1; bit <= extent - window; bit *= 2) {
    lo[ax] = take ? -bit : bit;
    hi[ax] = -lo[ax];
    nb_val *on = nb_ne_at(l, nb_and_at(l, s, nb_scalar_at(l, g, NB_I64, (double)bit)), nb_scalar_at(l, g, NB_I64, 0));
    on = nb_broadcast_in_dim_at(l, on, vs.rank, vs.dims, &zero_axis);
    v = nb_select_at(l, on, nb_pad_at(l, v, zero, lo, hi, NULL), v);
  }
  if (!take) return v;
  memcpy(limit, vs.dims, sizeof limit);
  limit[ax] = window;
  return nb_slice_at(l, v, start, limit, NULL);
}

/* Picks the cheaper of the two: one-hot costs ~window x extent, shifting
 * ~extent x (bits of extent - window + 1). One-hot needs one spare rank. */
static nb_val *window_axis(nb_loc l, nb_val *v, int ax, nb_val *s, int64_t len, bool take) {
  int64_t window = take ? len : nb_val_dim(v, ax), extent = take ? nb_val_dim(v, ax) : len, bits = 1;
  for (int64_t m = extent - window; m > 1; m /= 2) bits++;
  bool onehot = window <= bits && nb_val_rank(v) < NB_MAX_RANK;
  return onehot ? onehot_axis(l, v, ax, s, len, take) : shift_axis(l, v, ax, s, len, take);
}

/* ---------------------------------------------------------------- dynamic_slice */

static nb_status ds_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                          size_t cap) {
  const nb_dynamic_slice_params *p = params;
  *nout = 1;
  int r = in[0].shape.rank;
  if (nin != 1 + r) return snprintf(why, cap, "a rank-%d operand needs %d start indices, got %d", r, r, nin - 1), NB_ERR_INVALID_ARG;
  nb_status st = starts_check(r, in + 1, why, cap);
  if (st) return st;
  out[0] = in[0];
  for (int d = 0; d < r; d++) {
    if (p->sizes[d] < 0 || p->sizes[d] > in[0].shape.dims[d])
      return snprintf(why, cap, "axis %d: size %lld must be in [0, %lld]", d, (long long)p->sizes[d],
                      (long long)in[0].shape.dims[d]), NB_ERR_SHAPE;
    out[0].shape.dims[d] = p->sizes[d];
  }
  return NB_OK;
}

static nb_status ds_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_dynamic_slice_params *p = e->params;
  const nb_shape *xs = &e->in[0]->aval.shape;
  int64_t s[NB_MAX_RANK];
  clamped_starts(xs, p->sizes, in + 1, s);
  copy_window(xs, &e->out[0]->aval.shape, s, nb_dtype_size(nb_array_dtype(in[0])), (char *)nb_array_data(in[0]),
              nb_array_data_mut(out[0]), false);
  return NB_OK;
}

static nb_status ds_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                        nb_val **ot) {
  nb_val *ops[1 + NB_MAX_RANK];
  ot[0] = NULL;
  if (!t[0]) return NB_OK;
  ops[0] = t[0];
  for (int i = 1; i < e->nin; i++) ops[i] = p[i];
  ot[0] = nb__reemit(g, e, ops);
  return nb_graph_status(g);
}

/* The cotangent is written into zeros at the same (clamped) window. */
static nb_status ds_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct,
                              nb_val **ct_in) {
  for (int i = 0; i < e->nin; i++) ct_in[i] = NULL;
  for (int i = 1; i < e->nin; i++)
    if (linear[i]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "dynamic_slice: start index %d is linear", i - 1), NB_ERR_INTERNAL;
  if (!ct[0]) return NB_OK;
  ct_in[0] = nb_dynamic_update_slice_at(e->loc, nb__zeros(g, e->in[0]->aval), ct[0], in + 1);
  return nb_graph_status(g);
}

static nb_status ds_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                          int *out_bdims) {
  const nb_dynamic_slice_params *p = e->params;
  const nb_shape *xs = &e->in[0]->aval.shape;
  nb_loc l = e->loc;
  int r = xs->rank;
  if (r + 1 > NB_MAX_RANK) return nb__fail(g, l, NB_ERR_SHAPE, "vmap of dynamic_slice: rank too large"), NB_ERR_SHAPE;
  nb_val *x = nb__batch_to_front(l, in[0], bdims[0], n), *starts[1 + NB_MAX_RANK];
  int64_t sizes[1 + NB_MAX_RANK];
  out[0] = x;
  out_bdims[0] = 0;
  if (r == 0) return nb_graph_status(g); /* no starts: the whole scalar */
  starts[0] = nb_scalar_at(l, g, e->in[1]->aval.dtype, 0);
  sizes[0] = n;
  for (int d = 0; d < r; d++) {
    bool unbatched = bdims[1 + d] < 0;
    starts[d + 1] = unbatched ? in[1 + d] : starts[0];
    sizes[d + 1] = unbatched ? p->sizes[d] : xs->dims[d];
  }
  x = nb_dynamic_slice_at(l, x, starts, sizes);
  for (int d = 0; d < r; d++)
    if (bdims[1 + d] >= 0 && p->sizes[d] < xs->dims[d])
      x = window_axis(l, x, d + 1, clamp_start(l, in[1 + d], xs->dims[d], p->sizes[d]), p->sizes[d], true);
  out[0] = x;
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_dynamic_slice = {
    .name = "dynamic_slice",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_dynamic_slice_params),
    .infer = ds_infer,
    .eval = ds_eval,
    .jvp = ds_jvp,
    .transpose = ds_transpose,
    .batch = ds_batch,
    .print_params = print_sizes,
};

/* ---------------------------------------------------------------- dynamic_update_slice */

static nb_status dus_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  *nout = 1;
  if (nin < 2) return snprintf(why, cap, "needs an operand and an update"), NB_ERR_INVALID_ARG;
  int r = in[0].shape.rank;
  if (nin != 2 + r) return snprintf(why, cap, "a rank-%d operand needs %d start indices, got %d", r, r, nin - 2), NB_ERR_INVALID_ARG;
  if (in[1].dtype != in[0].dtype)
    return snprintf(why, cap, "update dtype %s differs from the operand's %s", nb_dtype_name(in[1].dtype),
                    nb_dtype_name(in[0].dtype)), NB_ERR_DTYPE;
  if (in[1].shape.rank != r) return snprintf(why, cap, "update rank %d differs from the operand's %d", in[1].shape.rank, r), NB_ERR_SHAPE;
  for (int d = 0; d < r; d++)
    if (in[1].shape.dims[d] > in[0].shape.dims[d])
      return snprintf(why, cap, "axis %d: update extent %lld exceeds the operand's %lld", d, (long long)in[1].shape.dims[d],
                      (long long)in[0].shape.dims[d]), NB_ERR_SHAPE;
  nb_status st = starts_check(r, in + 2, why, cap);
  out[0] = in[0];
  return st;
}

static nb_status dus_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_shape *xs = &e->in[0]->aval.shape, *us = &e->in[1]->aval.shape;
  int64_t s[NB_MAX_RANK];
  clamped_starts(xs, us->dims, in + 2, s);
  if (nb_array_data(out[0]) != nb_array_data(in[0])) /* else in place: only the window changes */
    memcpy(nb_array_data_mut(out[0]), nb_array_data(in[0]), nb_array_nbytes(in[0]));
  copy_window(xs, us, s, nb_dtype_size(nb_array_dtype(in[0])), nb_array_data_mut(out[0]), (char *)nb_array_data(in[1]), true);
  return NB_OK;
}

/* Linear in (operand, update) jointly: the same update of the tangents. */
static nb_status dus_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                         nb_val **ot) {
  nb_val *ops[2 + NB_MAX_RANK];
  ot[0] = NULL;
  if (!t[0] && !t[1]) return NB_OK;
  ops[0] = t[0] ? t[0] : nb__zeros(g, p[0]->aval);
  ops[1] = t[1] ? t[1] : nb__zeros(g, p[1]->aval);
  for (int i = 2; i < e->nin; i++) ops[i] = p[i];
  ot[0] = nb__reemit(g, e, ops);
  return nb_graph_status(g);
}

/* The operand gets the cotangent outside the window; the update gets the
 * window. */
static nb_status dus_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct,
                               nb_val **ct_in) {
  for (int i = 0; i < e->nin; i++) ct_in[i] = NULL;
  for (int i = 2; i < e->nin; i++)
    if (linear[i]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "dynamic_update_slice: start index %d is linear", i - 2), NB_ERR_INTERNAL;
  if (!ct[0]) return NB_OK;
  const nb_aval ua = e->in[1]->aval;
  if (linear[0]) ct_in[0] = nb_dynamic_update_slice_at(e->loc, ct[0], nb__zeros(g, ua), in + 2);
  if (linear[1]) ct_in[1] = nb_dynamic_slice_at(e->loc, ct[0], in + 2, ua.shape.dims);
  return nb_graph_status(g);
}

/* Batched starts: the update (and a mask of ones) is placed per row along
 * those axes by window_axis, the unbatched axes by the primitive; a select
 * then merges the placed update into the operand. */
static nb_status dus_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                           nb_val **out, int *out_bdims) {
  const nb_shape *xs = &e->in[0]->aval.shape, *us = &e->in[1]->aval.shape;
  nb_loc l = e->loc;
  int r = xs->rank;
  if (r + 1 > NB_MAX_RANK) return nb__fail(g, l, NB_ERR_SHAPE, "vmap of dynamic_update_slice: rank too large"), NB_ERR_SHAPE;
  nb_val *x = nb__batch_to_front(l, in[0], bdims[0], n), *u = nb__batch_to_front(l, in[1], bdims[1], n);
  nb_val *starts[1 + NB_MAX_RANK];
  out_bdims[0] = 0;
  if (r == 0) {
    out[0] = u; /* a scalar update replaces the scalar operand */
    return nb_graph_status(g);
  }
  starts[0] = nb_scalar_at(l, g, e->in[2]->aval.dtype, 0);
  bool any_batched = false;
  for (int d = 0; d < r; d++) {
    bool batched = bdims[2 + d] >= 0;
    any_batched = any_batched || batched;
    starts[d + 1] = batched ? starts[0] : in[2 + d];
  }
  if (!any_batched) {
    out[0] = nb_dynamic_update_slice_at(l, x, u, starts);
    return nb_graph_status(g);
  }
  nb_aval ub = nb_val_aval(u);
  nb_val *m = nb_full_at(l, g, NB_U8, ub.shape.rank, ub.shape.dims, 1);
  for (int d = 0; d < r; d++) {
    if (bdims[2 + d] < 0 || us->dims[d] == xs->dims[d]) continue;
    nb_val *s = clamp_start(l, in[2 + d], xs->dims[d], us->dims[d]);
    u = window_axis(l, u, d + 1, s, xs->dims[d], false);
    m = window_axis(l, m, d + 1, s, xs->dims[d], false);
  }
  nb_aval xb = nb_val_aval(x);
  nb_val *placed = nb_dynamic_update_slice_at(l, nb_full_like_at(l, x, 0), u, starts);
  nb_val *zeros_m = nb_full_at(l, g, NB_U8, xb.shape.rank, xb.shape.dims, 0);
  nb_val *mask = nb_ne_at(l, nb_dynamic_update_slice_at(l, zeros_m, m, starts), nb_full_like_at(l, zeros_m, 0));
  out[0] = nb_select_at(l, mask, placed, x);
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_dynamic_update_slice = {
    .name = "dynamic_update_slice",
    .kind = NB_KIND_OTHER,
    .infer = dus_infer,
    .eval = dus_eval,
    .jvp = dus_jvp,
    .transpose = dus_transpose,
    .batch = dus_batch,
    .in_place = true,
};

/* ---------------------------------------------------------------- public ops */

/* Common argument checks; fills ops[first..] with the starts. */
static bool check_starts(nb_graph *g, nb_loc loc, const char *op, int r, nb_val *const *start, nb_val **ops, int first) {
  if (r && !start) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: start is NULL for a rank-%d operand", op, r), false;
  for (int d = 0; d < r; d++) {
    nb_val *s = start[d];
    if (!s) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: start index %d is NULL", op, d), false;
    if (s->g != g) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: start index %d belongs to another graph", op, d), false;
    if (nb__is_poison(s)) return false;
    if (s->aval.shape.rank != 0 || !nb_dtype_is_int(s->aval.dtype) || s->aval.dtype != start[0]->aval.dtype) {
      char a[128];
      return nb__fail(g, loc, NB_ERR_DTYPE, "%s: start index %d is %s; starts must be integer scalars of one dtype", op, d,
                      nb_aval_str(&s->aval, a, sizeof a)), false;
    }
    ops[first + d] = s;
  }
  return true;
}

nb_val *nb_dynamic_slice_at(nb_loc loc, nb_val *x, nb_val *const *start, const int64_t *sizes) {
  if (!x || nb__is_poison(x)) return x;
  nb_graph *g = x->g;
  int r = x->aval.shape.rank;
  nb_val *ops[1 + NB_MAX_RANK] = {x};
  if (!check_starts(g, loc, "dynamic_slice", r, start, ops, 1)) return nb__poison(g);
  if (r && !sizes) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "dynamic_slice: sizes is NULL for a rank-%d operand", r);
  nb_dynamic_slice_params p;
  memset(&p, 0, sizeof p);
  bool whole = true;
  for (int d = 0; d < r; d++) {
    p.sizes[d] = sizes[d];
    whole = whole && sizes[d] == x->aval.shape.dims[d];
  }
  if (whole) return x; /* every start clamps to 0 */
  return nb__emit1(g, loc, NB_PRIM_dynamic_slice, 1 + r, ops, &p, sizeof p);
}

nb_val *nb_dynamic_update_slice_at(nb_loc loc, nb_val *x, nb_val *update, nb_val *const *start) {
  nb_val *ops[2 + NB_MAX_RANK] = {x, update};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!x || !update) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "dynamic_update_slice: %s is NULL", x ? "the update" : "the operand");
  if (nb_graph_status(g)) return nb__poison(g);
  int r = x->aval.shape.rank;
  if (!check_starts(g, loc, "dynamic_update_slice", r, start, ops, 2)) return nb__poison(g);
  if (nb_aval_equal(&x->aval, &update->aval)) return update; /* the window is everything */
  return nb__emit1(g, loc, NB_PRIM_dynamic_update_slice, 2 + r, ops, NULL, 0);
}
