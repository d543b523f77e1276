/* sort (stable, along any axis, ascending or descending) and top_k (the k
 * largest along the last axis, ties to the lower index); both output the
 * values and their positions as i32. NaNs order above every number: last
 * ascending (as NumPy), first descending and in top_k; -0 and +0 are equal.
 * Derivatives move the tangent with the values (a gather by the positions).
 * Not here: argmax/argmin (reduce.c). */
#include <math.h>
#include <string.h>

#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- one lane */

/* The keys of one lane: doubles for floating dtypes, int64 otherwise. */
typedef struct lane {
  bool is_float, descending;
  double *f;
  int64_t *i;
  int32_t *perm, *tmp;
  int64_t n;
} lane;

/* True when element a must come strictly before element b. */
static bool before(const lane *k, int32_t a, int32_t b) {
  if (!k->is_float) return k->descending ? k->i[a] > k->i[b] : k->i[a] < k->i[b];
  double x = k->f[a], y = k->f[b];
  bool xn = x != x, yn = y != y;
  if (k->descending) return !yn && (xn || x > y);
  return !xn && (yn || x < y);
}

/* Bottom-up merge sort of perm (stable: a later element moves ahead of an
 * earlier one only when strictly before it). */
static void sort_lane(lane *k) {
  for (int64_t i = 0; i < k->n; i++) k->perm[i] = (int32_t)i;
  for (int64_t width = 1; width < k->n; width *= 2) {
    for (int64_t lo = 0; lo < k->n; lo += 2 * width) {
      int64_t mid = lo + width < k->n ? lo + width : k->n, hi = lo + 2 * width < k->n ? lo + 2 * width : k->n;
      int64_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi) k->tmp[o++] = before(k, k->perm[j], k->perm[i]) ? k->perm[j++] : k->perm[i++];
      while (i < mid) k->tmp[o++] = k->perm[i++];
      while (j < hi) k->tmp[o++] = k->perm[j++];
    }
    memcpy(k->perm, k->tmp, (size_t)k->n * sizeof(int32_t));
  }
}

static size_t lane_bytes(int64_t n) { return (size_t)n * (sizeof(double) + sizeof(int64_t) + 2 * sizeof(int32_t)); }

static bool lane_alloc(nb_ctx *ctx, lane *k, nb_dtype t, bool descending, int64_t n) {
  memset(k, 0, sizeof *k);
  k->is_float = nb_dtype_is_float(t);
  k->descending = descending;
  k->n = n;
  char *m = nb_alloc(ctx, lane_bytes(n));
  if (!m) return false;
  k->f = (double *)m;
  k->i = (int64_t *)(m + (size_t)n * sizeof(double));
  k->perm = (int32_t *)(m + (size_t)n * (sizeof(double) + sizeof(int64_t)));
  k->tmp = k->perm + n;
  return true;
}

static void lane_free(nb_ctx *ctx, lane *k) { nb_dealloc(ctx, k->f, lane_bytes(k->n)); }

/* Sorts every lane of x along `axis` (length n) and writes the first `keep`
 * of each to values/indices, whose axis has length keep. */
static nb_status sort_lanes(nb_ctx *ctx, nb_array *x, int axis, bool descending, int64_t keep, nb_array *values,
                            nb_array *indices) {
  const nb_shape s = nb_array_aval(x).shape;
  nb_dtype t = nb_array_dtype(x);
  int64_t n = s.dims[axis], inner = 1, outer = 1;
  for (int d = axis + 1; d < s.rank; d++) inner *= s.dims[d];
  for (int d = 0; d < axis; d++) outer *= s.dims[d];
  if (n == 0 || inner == 0 || outer == 0) return NB_OK;
  lane k;
  if (!lane_alloc(ctx, &k, t, descending, n)) return NB_ERR_NOMEM;
  size_t es = nb_dtype_size(t);
  const char *src = nb_array_data(x);
  char *dst = nb_array_data_mut(values);
  int32_t *pos = nb_array_data_mut(indices);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * n * inner + in, obase = o * keep * inner + in;
      for (int64_t j = 0; j < n; j++) {
        if (k.is_float) k.f[j] = nb__load_f64(t, src, base + j * inner);
        else k.i[j] = nb__load_i64(t, src, base + j * inner);
      }
      sort_lane(&k);
      for (int64_t j = 0; j < keep; j++) {
        memcpy(dst + (obase + j * inner) * (int64_t)es, src + (base + k.perm[j] * inner) * (int64_t)es, es);
        pos[obase + j * inner] = k.perm[j];
      }
    }
  }
  lane_free(ctx, &k);
  return NB_OK;
}

/* y[..., j, ...] = t[..., idx[..., j, ...], ...] along axis, where idx has
 * t's shape but possibly a shorter `axis`: a gather with every other dim a
 * batching dim. With an empty dim no slice of size 1 fits (the gather would
 * be invalid) and nothing is taken: y is empty, as JAX's. */
static nb_val *take_lane(nb_loc l, nb_val *t, nb_val *idx, int axis) {
  int r = t->aval.shape.rank;
  if (nb_shape_size(&t->aval.shape) == 0 || nb_shape_size(&idx->aval.shape) == 0)
    return nb_full_at(l, t->g, t->aval.dtype, r, idx->aval.shape.dims, 0);
  nb_gather_dims dn;
  memset(&dn, 0, sizeof dn);
  int64_t ss[NB_MAX_RANK];
  dn.n_collapsed = dn.n_start_index_map = 1;
  dn.collapsed_slice_dims[0] = dn.start_index_map[0] = axis;
  dn.index_vector_dim = r;
  for (int i = 0; i < r; i++) {
    ss[i] = 1;
    if (i == axis) continue;
    dn.operand_batching_dims[dn.n_operand_batching] = i;
    dn.start_indices_batching_dims[dn.n_operand_batching++] = i;
  }
  return nb_gather_at(l, t, idx, &dn, ss);
}

static nb_status lane_len_ok(const nb_aval *x, int axis, char *why, size_t cap) {
  if (x->shape.dims[axis] > INT32_MAX)
    return snprintf(why, cap, "axis %d has %lld elements; i32 positions hold at most %d", axis,
                    (long long)x->shape.dims[axis], INT32_MAX), NB_ERR_SHAPE;
  return NB_OK;
}

/* ---------------------------------------------------------------- sort */

static nb_status sort_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                            size_t cap) {
  const nb_sort_params *p = params;
  *nout = 2;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand"), NB_ERR_INVALID_ARG;
  if (p->axis < 0 || p->axis >= in[0].shape.rank)
    return snprintf(why, cap, "axis %d out of range for rank %d", p->axis, in[0].shape.rank), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  out[1] = (nb_aval){NB_I32, in[0].shape};
  return lane_len_ok(&in[0], p->axis, why, cap);
}

static nb_status sort_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_sort_params *p = e->params;
  return sort_lanes(ctx, in[0], p->axis, p->descending, e->in[0]->aval.shape.dims[p->axis], out[0], out[1]);
}

static nb_status sort_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                          nb_val **ot) {
  ot[1] = NULL;
  ot[0] = t[0] ? take_lane(e->loc, t[0], outs[1], ((const nb_sort_params *)e->params)->axis) : NULL;
  return nb_graph_status(g);
}

/* The batch axis stays where it is; the sorted axis shifts past it. */
static nb_status sort_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                            nb_val **out, int *out_bdims) {
  nb_sort_params q = *(const nb_sort_params *)e->params;
  if (bdims[0] <= q.axis) q.axis++;
  nb_val *outs[2];
  int nout = 0;
  nb__emit(g, e->loc, NB_PRIM_sort, 1, in, &q, sizeof q, &nout, outs);
  if (nout != 2) return nb_graph_status(g) ? nb_graph_status(g) : NB_ERR_INTERNAL;
  out[0] = outs[0];
  out[1] = outs[1];
  out_bdims[0] = out_bdims[1] = bdims[0];
  return nb_graph_status(g);
}

static void sort_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_aval *x = &e->in[0]->aval;
  double n = (double)nb_shape_size(&x->shape), len = (double)x->shape.dims[((const nb_sort_params *)e->params)->axis];
  *flops = len > 1 ? n * log2(len) : 0; /* comparisons */
  *bytes = n * (2.0 * (double)nb_dtype_size(x->dtype) + 4.0);
}

static void sort_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_sort_params *p = e->params;
  snprintf(buf, cap, "axis=%d descending=%d", p->axis, p->descending ? 1 : 0);
}

const nb_prim_rules nb__prim_sort = {
    .name = "sort",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_sort_params),
    .infer = sort_infer,
    .eval = sort_eval,
    .jvp = sort_jvp,
    .batch = sort_batch,
    .cost = sort_cost,
    .print_params = sort_print,
};

/* ---------------------------------------------------------------- top_k */

static nb_status top_k_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                             size_t cap) {
  const nb_top_k_params *p = params;
  *nout = 2;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand"), NB_ERR_INVALID_ARG;
  int r = in[0].shape.rank;
  if (r < 1) return snprintf(why, cap, "the operand must have rank >= 1"), NB_ERR_SHAPE;
  int64_t n = in[0].shape.dims[r - 1];
  if (p->k < 0 || p->k > n)
    return snprintf(why, cap, "k = %d is outside [0, %lld] (the last axis)", p->k, (long long)n), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  out[0].shape.dims[r - 1] = p->k;
  out[1] = (nb_aval){NB_I32, out[0].shape};
  return lane_len_ok(&in[0], r - 1, why, cap);
}

static nb_status top_k_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_top_k_params *p = e->params;
  return sort_lanes(ctx, in[0], e->in[0]->aval.shape.rank - 1, true, p->k, out[0], out[1]);
}

static nb_status top_k_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                           nb_val **ot) {
  ot[1] = NULL;
  ot[0] = t[0] ? take_lane(e->loc, t[0], outs[1], t[0]->aval.shape.rank - 1) : NULL;
  return nb_graph_status(g);
}

/* The batch axis moves to the front, so the last axis stays last. */
static nb_status top_k_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                             nb_val **out, int *out_bdims) {
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0), *outs[2];
  int nout = 0;
  nb__emit(g, e->loc, NB_PRIM_top_k, 1, &x, e->params, e->params_size, &nout, outs);
  if (nout != 2) return nb_graph_status(g) ? nb_graph_status(g) : NB_ERR_INTERNAL;
  out[0] = outs[0];
  out[1] = outs[1];
  out_bdims[0] = out_bdims[1] = 0;
  return nb_graph_status(g);
}

static void top_k_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_aval *x = &e->in[0]->aval, *y = &e->out[0]->aval;
  double n = (double)nb_shape_size(&x->shape), len = (double)x->shape.dims[x->shape.rank - 1];
  *flops = len > 1 ? n * log2(len) : 0;
  double es = (double)nb_dtype_size(x->dtype);
  *bytes = n * es + (double)nb_shape_size(&y->shape) * (es + 4.0);
}

static void top_k_print(const nb_eqn *e, char *buf, size_t cap) {
  snprintf(buf, cap, "k=%d", ((const nb_top_k_params *)e->params)->k);
}

const nb_prim_rules nb__prim_top_k = {
    .name = "top_k",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_top_k_params),
    .infer = top_k_infer,
    .eval = top_k_eval,
    .jvp = top_k_jvp,
    .batch = top_k_batch,
    .cost = top_k_cost,
    .print_params = top_k_print,
};

/* ---------------------------------------------------------------- public ops */

/* Emits a two-output primitive; the second output goes to *second. */
static nb_val *emit2(nb_loc loc, nb_prim prim, nb_val *x, const void *p, size_t size, nb_val **second) {
  nb_val *outs[2];
  int nout = 0;
  nb_val *first = nb__emit(x->g, loc, prim, 1, &x, p, size, &nout, outs);
  if (second) *second = nout == 2 ? outs[1] : nb__poison(x->g);
  return first;
}

nb_val *nb_sort_at(nb_loc loc, nb_val *x, int axis, bool descending, nb_val **indices) {
  if (indices) *indices = x;
  if (!x || nb__is_poison(x)) return x;
  int a = nb__norm_axis(axis, x->aval.shape.rank);
  if (a < 0) {
    nb_val *bad = nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "sort: axis %d out of range for rank %d", axis,
                           x->aval.shape.rank);
    if (indices) *indices = bad;
    return bad;
  }
  nb_sort_params p;
  memset(&p, 0, sizeof p);
  p.axis = a;
  p.descending = descending;
  return emit2(loc, NB_PRIM_sort, x, &p, sizeof p, indices);
}

nb_val *nb_top_k_at(nb_loc loc, nb_val *x, int k, nb_val **indices) {
  if (indices) *indices = x;
  if (!x || nb__is_poison(x)) return x;
  nb_top_k_params p;
  memset(&p, 0, sizeof p);
  p.k = k;
  return emit2(loc, NB_PRIM_top_k, x, &p, sizeof p, indices);
}
