/* gather and scatter_add with StableHLO's dimension numbers (batching dims
 * included), and the conveniences built on gather: take (rows of a table by
 * ids) and take_along_axis (NumPy's). gather clamps each start index so its
 * slice fits (as XLA); scatter_add skips every window that does not fit in
 * full (as XLA's scatter; StableHLO leaves this implementation-defined).
 * Not here: dynamic_slice / dynamic_update_slice (slicing.c), sort (sort.c). */
#include <string.h>

#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- geometry */

/* gather and scatter share one geometry: an operand, integer indices and a
 * "window array" (gather's result, scatter's updates). The window array's
 * window dims hold a slice of the operand; its other dims, the batch dims,
 * follow the indices' dims other than index_vector_dim, in order. */
typedef struct geom {
  int nw, nc, nm, nb;
  const int *wdims;         /* window dims of the window array (increasing) */
  const int *cdims;         /* collapsed (inserted) operand dims: extent 1 */
  const int *map;           /* index vector entry k starts operand dim map[k] */
  const int *obat, *ibat;   /* operand dim obat[i] is batched like indices dim ibat[i] */
  int ivd;                  /* index_vector_dim */
  int64_t win[NB_MAX_RANK]; /* window extent per operand dim */
} geom;

typedef struct geom_names {
  const char *w, *c, *m, *ob, *ib;
} geom_names;

static const geom_names gather_names = {"offset_dims", "collapsed_slice_dims", "start_index_map",
                                        "operand_batching_dims", "start_indices_batching_dims"};
static const geom_names scatter_names = {"update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                                         "operand_batching_dims", "scatter_indices_batching_dims"};

static geom gather_geom(const nb_gather_params *p) {
  const nb_gather_dims *d = &p->dn;
  geom g = {d->n_offset, d->n_collapsed, d->n_start_index_map, d->n_operand_batching, d->offset_dims,
            d->collapsed_slice_dims, d->start_index_map, d->operand_batching_dims, d->start_indices_batching_dims,
            d->index_vector_dim, {0}};
  memcpy(g.win, p->slice_sizes, sizeof g.win);
  return g;
}

static geom scatter_geom(const nb_scatter_params *p) {
  const nb_scatter_dims *d = &p->dn;
  geom g = {d->n_update_window, d->n_inserted_window, d->n_scatter_to_operand, d->n_operand_batching,
            d->update_window_dims, d->inserted_window_dims, d->scatter_dims_to_operand_dims, d->operand_batching_dims,
            d->scatter_indices_batching_dims, d->index_vector_dim, {0}};
  return g;
}

/* Operand dims with no window dim of their own (collapsed or batching). */
static void mark_unwindowed(const geom *g, bool *skip) {
  memset(skip, 0, NB_MAX_RANK * sizeof(bool));
  for (int i = 0; i < g->nc; i++) skip[g->cdims[i]] = true;
  for (int i = 0; i < g->nb; i++) skip[g->obat[i]] = true;
}

/* Each of d[0..n) in [0, bound), distinct, and increasing when `sorted`. */
static bool dims_ok(int n, const int *d, int bound, bool sorted) {
  bool seen[NB_MAX_RANK] = {false};
  for (int i = 0; i < n; i++) {
    if (d[i] < 0 || d[i] >= bound || bound > NB_MAX_RANK || seen[d[i]]) return false;
    if (sorted && i && d[i] <= d[i - 1]) return false;
    seen[d[i]] = true;
  }
  return true;
}

/* Rank of the window array: the indices' dims but index_vector_dim, plus the
 * window dims. */
static int window_array_rank(const geom *g, int ri) { return ri - (g->ivd < ri) + g->nw; }

/* StableHLO's constraints on the dimension numbers against the operand and
 * indices avals (all but the window extents, which differ between gather
 * and scatter). */
static nb_status geom_check(const geom *g, const geom_names *nm, const nb_aval *op, const nb_aval *ix, char *why,
                            size_t cap) {
  int ro = op->shape.rank, ri = ix->shape.rank;
  if (!nb_dtype_is_int(ix->dtype))
    return snprintf(why, cap, "indices must have an integer dtype, not %s", nb_dtype_name(ix->dtype)), NB_ERR_DTYPE;
  if (g->nw < 0 || g->nw > NB_MAX_RANK || g->nc < 0 || g->nc > NB_MAX_RANK || g->nm < 0 || g->nm > NB_MAX_RANK ||
      g->nb < 0 || g->nb > NB_MAX_RANK)
    return snprintf(why, cap, "dimension-number counts must be in [0, %d]", NB_MAX_RANK), NB_ERR_INVALID_ARG;
  if (g->ivd < 0 || g->ivd > ri)
    return snprintf(why, cap, "index_vector_dim %d is outside [0, %d]", g->ivd, ri), NB_ERR_INVALID_ARG;
  int64_t vec = g->ivd < ri ? ix->shape.dims[g->ivd] : 1;
  if (g->nm != vec)
    return snprintf(why, cap, "%s has %d entries but the index vector has %lld", nm->m, g->nm, (long long)vec),
           NB_ERR_SHAPE;
  int rw = window_array_rank(g, ri);
  if (rw > NB_MAX_RANK) return snprintf(why, cap, "the result would have rank %d > %d", rw, NB_MAX_RANK), NB_ERR_SHAPE;
  if (!dims_ok(g->nw, g->wdims, rw, true))
    return snprintf(why, cap, "%s must be increasing and in [0, %d)", nm->w, rw), NB_ERR_INVALID_ARG;
  if (ro != g->nw + g->nc + g->nb)
    return snprintf(why, cap, "operand rank %d is not %d %s + %d %s + %d %s", ro, g->nw, nm->w, g->nc, nm->c, g->nb,
                    nm->ob), NB_ERR_SHAPE;
  if (!dims_ok(g->nc, g->cdims, ro, true))
    return snprintf(why, cap, "%s must be increasing and in [0, %d)", nm->c, ro), NB_ERR_INVALID_ARG;
  if (!dims_ok(g->nb, g->obat, ro, true))
    return snprintf(why, cap, "%s must be increasing and in [0, %d)", nm->ob, ro), NB_ERR_INVALID_ARG;
  bool in_c[NB_MAX_RANK] = {false}, in_ob[NB_MAX_RANK] = {false};
  for (int i = 0; i < g->nc; i++) in_c[g->cdims[i]] = true;
  for (int i = 0; i < g->nb; i++) {
    if (in_c[g->obat[i]])
      return snprintf(why, cap, "operand dim %d is in both %s and %s", g->obat[i], nm->c, nm->ob), NB_ERR_INVALID_ARG;
    in_ob[g->obat[i]] = true;
  }
  if (!dims_ok(g->nb, g->ibat, ri, false))
    return snprintf(why, cap, "%s must be distinct and in [0, %d)", nm->ib, ri), NB_ERR_INVALID_ARG;
  for (int i = 0; i < g->nb; i++) {
    if (g->ibat[i] == g->ivd)
      return snprintf(why, cap, "index_vector_dim %d is also in %s", g->ivd, nm->ib), NB_ERR_INVALID_ARG;
    if (op->shape.dims[g->obat[i]] != ix->shape.dims[g->ibat[i]])
      return snprintf(why, cap, "batching dims differ: operand dim %d is %lld, indices dim %d is %lld", g->obat[i],
                      (long long)op->shape.dims[g->obat[i]], g->ibat[i], (long long)ix->shape.dims[g->ibat[i]]),
             NB_ERR_SHAPE;
  }
  if (!dims_ok(g->nm, g->map, ro, false))
    return snprintf(why, cap, "%s must be distinct and in [0, %d)", nm->m, ro), NB_ERR_INVALID_ARG;
  for (int k = 0; k < g->nm; k++)
    if (in_ob[g->map[k]])
      return snprintf(why, cap, "operand dim %d is in both %s and %s", g->map[k], nm->m, nm->ob), NB_ERR_INVALID_ARG;
  return NB_OK;
}

/* The window array's shape: batch dims from the indices, window dims from the
 * window extents of the windowed operand dims, in order. */
static nb_shape window_array_shape(const geom *g, const nb_shape *op, const nb_shape *ix) {
  bool skip[NB_MAX_RANK], is_w[NB_MAX_RANK] = {false};
  mark_unwindowed(g, skip);
  int64_t wsz[NB_MAX_RANK], bsz[NB_MAX_RANK];
  int nw = 0, nbd = 0;
  for (int d = 0; d < op->rank; d++)
    if (!skip[d]) wsz[nw++] = g->win[d];
  for (int d = 0; d < ix->rank; d++)
    if (d != g->ivd) bsz[nbd++] = ix->dims[d];
  for (int i = 0; i < g->nw; i++) is_w[g->wdims[i]] = true;
  nb_shape s;
  memset(&s, 0, sizeof s);
  s.rank = nbd + nw;
  for (int pos = 0, kw = 0, kb = 0; pos < s.rank; pos++) s.dims[pos] = is_w[pos] ? wsz[kw++] : bsz[kb++];
  return s;
}

static void shape_str(const nb_shape *s, char *buf, size_t cap) {
  nb_aval a = {NB_F32, *s};
  char tmp[160];
  nb_aval_str(&a, tmp, sizeof tmp);
  snprintf(buf, cap, "%s", tmp + 3); /* drop the dtype name: "[2,3]" */
}

/* ---------------------------------------------------------------- the walk */

static void add_elem(nb_dtype t, void *dst, int64_t i, const void *src, int64_t j) {
  if (nb_dtype_is_float(t)) {
    nb__store_f64(t, dst, i, nb__load_f64(t, dst, i) + nb__load_f64(t, src, j));
  } else {
    uint64_t s = (uint64_t)nb__load_i64(t, dst, i) + (uint64_t)nb__load_i64(t, src, j);
    nb__store_i64(t, dst, i, (int64_t)s);
  }
}

static geom scatter_geom_of(const nb_eqn *e);

/* The walk's numbers from the geometry and the three shapes (operand,
 * indices, window array). */
static void walk_from(const geom *g, const nb_shape *op, const nb_shape *ix, const nb_shape *wa, nb_walk *w) {
  memset(w, 0, sizeof *w);
  bool skip[NB_MAX_RANK], is_w[NB_MAX_RANK] = {false};
  mark_unwindowed(g, skip);
  for (int i = 0; i < g->nw; i++) is_w[g->wdims[i]] = true;
  int64_t ostr[NB_MAX_RANK], wstr[NB_MAX_RANK], istr[NB_MAX_RANK];
  nb__strides(op, ostr);
  nb__strides(wa, wstr);
  nb__strides(ix, istr);
  /* the window array's batch dims follow the indices' dims other than index_vector_dim, in order */
  int d = 0;
  for (int pos = 0; pos < wa->rank; pos++) {
    if (is_w[pos]) continue;
    while (d == g->ivd) d++;
    w->bext[w->nbd] = wa->dims[pos];
    w->bw[w->nbd] = wstr[pos];
    w->bi[w->nbd++] = istr[d++];
  }
  w->nm = g->nm;
  w->iv = g->ivd < ix->rank ? istr[g->ivd] : 0;
  w->disjoint = true;
  for (int k = 0; k < g->nm; k++) w->disjoint &= skip[g->map[k]] || g->win[g->map[k]] == 1;
  for (int k = 0; k < g->nm; k++) w->mo[k] = ostr[g->map[k]], w->mhi[k] = op->dims[g->map[k]] - g->win[g->map[k]];
  w->nbat = g->nb;
  for (int i = 0; i < g->nb; i++) w->batj[i] = g->ibat[i] - (g->ibat[i] > g->ivd), w->bato[i] = ostr[g->obat[i]];
  for (int o = 0; o < op->rank; o++)
    if (!skip[o]) {
      w->wext[w->nwd] = g->win[o];
      w->ww[w->nwd] = wstr[g->wdims[w->nwd]];
      w->wo[w->nwd++] = ostr[o];
    }
  w->nbatch = w->nwin = 1;
  for (int j = 0; j < w->nbd; j++) w->nbatch *= w->bext[j];
  for (int k = 0; k < w->nwd; k++) w->nwin *= w->wext[k];
}

void nb__walk_of(const nb_eqn *e, nb_walk *w) {
  bool gather = e->prim == NB_PRIM_gather;
  geom g = gather ? gather_geom(e->params) : scatter_geom_of(e);
  walk_from(&g, &e->in[0]->aval.shape, &e->in[1]->aval.shape, gather ? &e->out[0]->aval.shape : &e->in[2]->aval.shape, w);
}

/* Visits every element of the window array with the operand element it
 * pairs with (nb_walk): gather copies operand -> window array (starts
 * clamped); scatter_add adds window array -> operand (windows that do not
 * fit are skipped). */
static void walk(const nb_walk *w, bool gather, nb_dtype it, const void *ixd, nb_dtype t, const void *src, void *dst) {
  size_t es = nb_dtype_size(t);
  /* the innermost window dim contiguous on both sides: its runs move at once
   * (an embedding's rows: 2-5 ns an element one by one) */
  int64_t run = 1;
  if (w->nwd > 0 && w->ww[w->nwd - 1] == 1 && w->wo[w->nwd - 1] == 1 && w->wext[w->nwd - 1] > 1) run = w->wext[w->nwd - 1];
  for (int64_t b = 0; b < w->nbatch; b++) {
    int64_t bc[NB_MAX_RANK], rest = b, wbase = 0, obase = 0, ibase = 0;
    for (int j = w->nbd - 1; j >= 0; j--) {
      bc[j] = rest % w->bext[j];
      rest /= w->bext[j];
      wbase += bc[j] * w->bw[j];
      ibase += bc[j] * w->bi[j];
    }
    bool fits = true;
    for (int k = 0; k < w->nm; k++) {
      int64_t v = nb__load_i64(it, ixd, ibase + k * w->iv);
      if (gather) v = v < 0 ? 0 : v > w->mhi[k] ? w->mhi[k] : v;
      else fits &= v >= 0 && v <= w->mhi[k];
      obase += v * w->mo[k];
    }
    if (!fits) continue;
    for (int i = 0; i < w->nbat; i++) obase += bc[w->batj[i]] * w->bato[i];
    for (int64_t v = 0; v < w->nwin; v += run) {
      int64_t r = v, woff = wbase, ooff = obase;
      for (int k = w->nwd - 1; k >= 0; k--) {
        int64_t c = r % w->wext[k];
        r /= w->wext[k];
        woff += c * w->ww[k];
        ooff += c * w->wo[k];
      }
      if (gather) {
        memcpy((char *)dst + woff * (int64_t)es, (const char *)src + ooff * (int64_t)es, es * (size_t)run);
      } else if (t == NB_F32) { /* f32 + f32 rounds as add_elem's sum in f64 does (53 >= 2 * 24 + 2) */
        float *d = (float *)dst + ooff;
        const float *u = (const float *)src + woff;
        for (int64_t i = 0; i < run; i++) d[i] += u[i];
      } else {
        for (int64_t i = 0; i < run; i++) add_elem(t, dst, ooff + i, src, woff + i);
      }
    }
  }
}

/* ---------------------------------------------------------------- graph helpers */

static nb_val *i64_const(nb_loc l, nb_graph *g, int n, const int64_t *v) {
  int64_t dims[1] = {n};
  nb_array *a = nb_array_create(nb_graph_ctx(g), NB_I64, 1, dims, v);
  if (!a) return nb__fail(g, l, NB_ERR_NOMEM, "out of memory");
  nb_val *c = nb_const_at(l, g, a);
  nb_array_release(a);
  return c;
}

/* The largest in-range start of each index-vector entry, laid out like the
 * indices (i64): operand dim - window extent. */
static nb_val *start_limits(nb_loc l, const geom *gm, const nb_shape *op, nb_val *ix64) {
  int64_t hi[NB_MAX_RANK];
  for (int k = 0; k < gm->nm; k++) hi[k] = op->dims[gm->map[k]] - gm->win[gm->map[k]];
  nb_val *v = i64_const(l, ix64->g, gm->nm, hi);
  const nb_shape *s = &ix64->aval.shape;
  if (gm->ivd < s->rank) {
    int bd[1] = {gm->ivd};
    return nb_broadcast_in_dim_at(l, v, s->rank, s->dims, bd);
  }
  return nb_broadcast_in_dim_at(l, nb_reshape_at(l, v, 0, NULL), s->rank, s->dims, NULL);
}

/* Indices clamped the way gather clamps them, so a scatter with them never
 * skips (used by gather's transpose). */
static nb_val *clamp_starts(nb_loc l, nb_val *ix, const geom *gm, const nb_shape *op) {
  nb_val *ix64 = nb_convert_at(l, ix, NB_I64);
  return nb_clamp_at(l, nb_scalar_at(l, ix->g, NB_I64, 0), ix64, start_limits(l, gm, op, ix64));
}

/* Bool over the window array's batch dims (the indices' dims but
 * index_vector_dim): true where scatter's window fits. */
static nb_val *windows_fit(nb_loc l, nb_val *ix, const geom *gm, const nb_shape *op) {
  nb_val *ix64 = nb_convert_at(l, ix, NB_I64);
  nb_val *bad = nb_or_at(l, nb_lt_at(l, ix64, nb_scalar_at(l, ix->g, NB_I64, 0)),
                         nb_gt_at(l, ix64, start_limits(l, gm, op, ix64)));
  if (gm->ivd >= ix->aval.shape.rank) return nb_not_at(l, bad);
  int axis[1] = {gm->ivd};
  nb_val *nbad = nb_reduce_sum_at(l, nb_convert_at(l, bad, NB_I32), 1, axis);
  return nb_eq_at(l, nbad, nb_scalar_at(l, ix->g, NB_I32, 0));
}

/* gather params that read back what a scatter with `p` writes. */
static nb_gather_params gather_of_scatter(const nb_scatter_params *p, const geom *gm) {
  nb_gather_params q;
  memset(&q, 0, sizeof q);
  const nb_scatter_dims *s = &p->dn;
  nb_gather_dims *d = &q.dn;
  d->n_offset = s->n_update_window;
  d->n_collapsed = s->n_inserted_window;
  d->n_start_index_map = s->n_scatter_to_operand;
  d->n_operand_batching = s->n_operand_batching;
  memcpy(d->offset_dims, s->update_window_dims, sizeof d->offset_dims);
  memcpy(d->collapsed_slice_dims, s->inserted_window_dims, sizeof d->collapsed_slice_dims);
  memcpy(d->start_index_map, s->scatter_dims_to_operand_dims, sizeof d->start_index_map);
  memcpy(d->operand_batching_dims, s->operand_batching_dims, sizeof d->operand_batching_dims);
  memcpy(d->start_indices_batching_dims, s->scatter_indices_batching_dims, sizeof d->start_indices_batching_dims);
  d->index_vector_dim = s->index_vector_dim;
  memcpy(q.slice_sizes, gm->win, sizeof q.slice_sizes);
  return q;
}

static nb_scatter_params scatter_of_gather(const nb_gather_params *p) {
  nb_scatter_params q;
  memset(&q, 0, sizeof q);
  const nb_gather_dims *d = &p->dn;
  nb_scatter_dims *s = &q.dn;
  s->n_update_window = d->n_offset;
  s->n_inserted_window = d->n_collapsed;
  s->n_scatter_to_operand = d->n_start_index_map;
  s->n_operand_batching = d->n_operand_batching;
  memcpy(s->update_window_dims, d->offset_dims, sizeof s->update_window_dims);
  memcpy(s->inserted_window_dims, d->collapsed_slice_dims, sizeof s->inserted_window_dims);
  memcpy(s->scatter_dims_to_operand_dims, d->start_index_map, sizeof s->scatter_dims_to_operand_dims);
  memcpy(s->operand_batching_dims, d->operand_batching_dims, sizeof s->operand_batching_dims);
  memcpy(s->scatter_indices_batching_dims, d->start_indices_batching_dims, sizeof s->scatter_indices_batching_dims);
  s->index_vector_dim = d->index_vector_dim;
  return q;
}

/* Shifts n entries by one and, with `first` >= 0, puts `first` in front. */
static int shift_dims(int n, int *d, int first) {
  for (int i = 0; i < n; i++) d[i]++;
  if (first < 0) return n;
  memmove(d + 1, d, (size_t)n * sizeof(int));
  d[0] = first;
  return n + 1;
}

static void append_ints(char *buf, size_t cap, const char *label, int n, const int *d) {
  size_t k = strlen(buf);
  if (k >= cap) return;
  k += (size_t)snprintf(buf + k, cap - k, "%s%s=(", k ? " " : "", label);
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", d[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

/* ---------------------------------------------------------------- gather */

static nb_status gather_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  *nout = 1;
  if (nin != 2) return snprintf(why, cap, "takes 2 operands (operand, indices)"), NB_ERR_INVALID_ARG;
  const nb_gather_params *p = params;
  geom g = gather_geom(p);
  nb_status st = geom_check(&g, &gather_names, &in[0], &in[1], why, cap);
  if (st != NB_OK) return st;
  bool skip[NB_MAX_RANK];
  mark_unwindowed(&g, skip);
  for (int d = 0; d < in[0].shape.rank; d++) {
    if (g.win[d] < 0 || g.win[d] > in[0].shape.dims[d])
      return snprintf(why, cap, "slice_sizes[%d] = %lld is outside [0, %lld]", d, (long long)g.win[d],
                      (long long)in[0].shape.dims[d]), NB_ERR_SHAPE;
    if (skip[d] && g.win[d] > 1)
      return snprintf(why, cap, "slice_sizes[%d] = %lld for a collapsed or batching dim (must be 1)", d,
                      (long long)g.win[d]), NB_ERR_SHAPE;
  }
  out[0].dtype = in[0].dtype;
  out[0].shape = window_array_shape(&g, &in[0].shape, &in[1].shape);
  for (int d = 0; d < in[0].shape.rank; d++)
    if (skip[d] && g.win[d] == 0 && nb_shape_size(&out[0].shape) > 0)
      return snprintf(why, cap, "slice_sizes[%d] = 0 for a collapsed or batching dim of a non-empty result", d),
             NB_ERR_SHAPE;
  return NB_OK;
}

static nb_status gather_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  nb_walk w;
  nb__walk_of(e, &w);
  walk(&w, true, e->in[1]->aval.dtype, nb_array_data(in[1]), e->in[0]->aval.dtype, nb_array_data(in[0]), nb_array_data_mut(out[0]));
  return NB_OK;
}

static nb_status gather_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  nb_val *ops[2] = {t[0], p[1]};
  ot[0] = t[0] ? nb__reemit(g, e, ops) : NULL;
  return nb_graph_status(g);
}

/* The transpose scatters the cotangent back at the clamped starts. */
static nb_status gather_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                  nb_val *const *ct, nb_val **ct_in) {
  ct_in[0] = ct_in[1] = NULL;
  if (linear[1]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "gather: indices cannot be linear"), NB_ERR_INTERNAL;
  if (!ct[0] || !linear[0]) return NB_OK;
  const nb_gather_params *p = e->params;
  geom gm = gather_geom(p);
  nb_scatter_params q = scatter_of_gather(p);
  nb_val *ops[3] = {nb__zeros(g, e->in[0]->aval), clamp_starts(e->loc, in[1], &gm, &e->in[0]->aval.shape), ct[0]};
  ct_in[0] = nb__emit1(g, e->loc, NB_PRIM_scatter_add, 3, ops, &q, sizeof q);
  return nb_graph_status(g);
}

/* A batched operand gets a leading window dim of full extent (indices
 * unbatched) or becomes a batching dim paired with the indices' batch axis. */
static nb_status gather_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                              nb_val **out, int *out_bdims) {
  nb_gather_params q = *(const nb_gather_params *)e->params;
  nb_gather_dims *d = &q.dn;
  int ro = e->in[0]->aval.shape.rank;
  if (e->out[0]->aval.shape.rank + 1 > NB_MAX_RANK || ro + 1 > NB_MAX_RANK ||
      e->in[1]->aval.shape.rank + 1 > NB_MAX_RANK)
    return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of gather: rank too large"), NB_ERR_SHAPE;
  nb_val *ops[2] = {bdims[0] >= 0 ? nb__move_axis(e->loc, in[0], bdims[0], 0) : in[0],
                    bdims[1] >= 0 ? nb__move_axis(e->loc, in[1], bdims[1], 0) : in[1]};
  if (bdims[0] >= 0) {
    memmove(q.slice_sizes + 1, q.slice_sizes, (size_t)ro * sizeof(int64_t));
    q.slice_sizes[0] = bdims[1] >= 0 ? 1 : n;
    shift_dims(d->n_collapsed, d->collapsed_slice_dims, -1);
    shift_dims(d->n_start_index_map, d->start_index_map, -1);
  }
  if (bdims[0] >= 0 && bdims[1] < 0) { /* the batch axis is one more window dim */
    shift_dims(d->n_operand_batching, d->operand_batching_dims, -1);
    d->n_offset = shift_dims(d->n_offset, d->offset_dims, 0);
  } else if (bdims[0] < 0) { /* the batch axis is one more index batch dim */
    shift_dims(d->n_offset, d->offset_dims, -1);
    shift_dims(d->n_operand_batching, d->start_indices_batching_dims, -1);
    d->index_vector_dim++;
  } else { /* both: a new pair of batching dims */
    shift_dims(d->n_offset, d->offset_dims, -1);
    shift_dims(d->n_operand_batching, d->operand_batching_dims, 0);
    d->n_operand_batching = shift_dims(d->n_operand_batching, d->start_indices_batching_dims, 0);
    d->index_vector_dim++;
  }
  out[0] = nb__emit1(g, e->loc, NB_PRIM_gather, 2, ops, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void gather_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_aval *r = &e->out[0]->aval, *ix = &e->in[1]->aval;
  double es = (double)nb_dtype_size(r->dtype);
  *flops = 0;
  *bytes = 2 * es * (double)nb_shape_size(&r->shape) +
           (double)nb_dtype_size(ix->dtype) * (double)nb_shape_size(&ix->shape);
}

static void gather_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_gather_params *p = e->params;
  const nb_gather_dims *d = &p->dn;
  int ro = e->in[0]->aval.shape.rank, ss[NB_MAX_RANK];
  buf[0] = 0;
  append_ints(buf, cap, "offset_dims", d->n_offset, d->offset_dims);
  append_ints(buf, cap, "collapsed", d->n_collapsed, d->collapsed_slice_dims);
  append_ints(buf, cap, "start_index_map", d->n_start_index_map, d->start_index_map);
  append_ints(buf, cap, "operand_batching", d->n_operand_batching, d->operand_batching_dims);
  append_ints(buf, cap, "indices_batching", d->n_operand_batching, d->start_indices_batching_dims);
  size_t k = strlen(buf);
  if (k < cap) snprintf(buf + k, cap - k, " index_vector_dim=%d", d->index_vector_dim);
  for (int i = 0; i < ro; i++) ss[i] = (int)p->slice_sizes[i];
  append_ints(buf, cap, "slice_sizes", ro, ss);
}

const nb_prim_rules nb__prim_gather = {
    .name = "gather",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_gather_params),
    .infer = gather_infer,
    .eval = gather_eval,
    .jvp = gather_jvp,
    .transpose = gather_transpose,
    .batch = gather_batch,
    .cost = gather_cost,
    .print_params = gather_print,
};

/* ---------------------------------------------------------------- scatter_add */

static nb_status scatter_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  *nout = 1;
  if (nin != 3) return snprintf(why, cap, "takes 3 operands (operand, indices, updates)"), NB_ERR_INVALID_ARG;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "cannot scatter-add bool"), NB_ERR_DTYPE;
  if (in[2].dtype != in[0].dtype)
    return snprintf(why, cap, "updates dtype %s differs from the operand's %s", nb_dtype_name(in[2].dtype),
                    nb_dtype_name(in[0].dtype)), NB_ERR_DTYPE;
  geom g = scatter_geom(params);
  nb_status st = geom_check(&g, &scatter_names, &in[0], &in[1], why, cap);
  if (st != NB_OK) return st;
  int rw = window_array_rank(&g, in[1].shape.rank);
  if (in[2].shape.rank != rw)
    return snprintf(why, cap, "updates have rank %d; the indices and %d update_window_dims make %d", in[2].shape.rank,
                    g.nw, rw), NB_ERR_SHAPE;
  bool skip[NB_MAX_RANK];
  mark_unwindowed(&g, skip);
  for (int d = 0, k = 0; d < in[0].shape.rank; d++) {
    g.win[d] = skip[d] ? 1 : in[2].shape.dims[g.wdims[k++]];
    if (!skip[d] && g.win[d] > in[0].shape.dims[d])
      return snprintf(why, cap, "update window of %lld exceeds operand dim %d (%lld)", (long long)g.win[d], d,
                      (long long)in[0].shape.dims[d]), NB_ERR_SHAPE;
  }
  nb_shape want = window_array_shape(&g, &in[0].shape, &in[1].shape);
  if (!nb_shape_equal(&want, &in[2].shape)) {
    char a[160], b[160];
    shape_str(&in[2].shape, a, sizeof a);
    shape_str(&want, b, sizeof b);
    return snprintf(why, cap, "updates shape %s does not match %s from the indices and window", a, b), NB_ERR_SHAPE;
  }
  out[0] = in[0];
  return NB_OK;
}

/* The geometry with the window extents read from the updates' shape. */
static geom scatter_geom_of(const nb_eqn *e) {
  geom g = scatter_geom(e->params);
  bool skip[NB_MAX_RANK];
  mark_unwindowed(&g, skip);
  const nb_shape *u = &e->in[2]->aval.shape;
  for (int d = 0, k = 0; d < e->in[0]->aval.shape.rank; d++) g.win[d] = skip[d] ? 1 : u->dims[g.wdims[k++]];
  return g;
}

static nb_status scatter_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  if (nb_array_data(out[0]) != nb_array_data(in[0])) /* else in place: only the windows change */
    memcpy(nb_array_data_mut(out[0]), nb_array_data(in[0]), nb_array_nbytes(in[0]));
  nb_walk w;
  nb__walk_of(e, &w);
  walk(&w, false, e->in[1]->aval.dtype, nb_array_data(in[1]), e->in[0]->aval.dtype, nb_array_data(in[2]), nb_array_data_mut(out[0]));
  return NB_OK;
}

static nb_status scatter_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                             nb_val **ot) {
  if (!t[2]) {
    ot[0] = t[0];
    return NB_OK;
  }
  nb_val *ops[3] = {t[0] ? t[0] : nb__zeros(g, p[0]->aval), p[1], t[2]};
  ot[0] = nb__reemit(g, e, ops);
  return nb_graph_status(g);
}

/* Operand: the cotangent itself. Updates: the cotangent gathered back, zero
 * where the window was skipped. */
static nb_status scatter_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                   nb_val *const *ct, nb_val **ct_in) {
  ct_in[0] = ct_in[1] = ct_in[2] = NULL;
  if (linear[1]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "scatter_add: indices cannot be linear"), NB_ERR_INTERNAL;
  if (!ct[0]) return NB_OK;
  if (linear[0]) ct_in[0] = ct[0];
  if (!linear[2]) return nb_graph_status(g);
  const nb_aval *ua = &e->in[2]->aval, *oa = &e->in[0]->aval;
  if (nb_shape_size(&oa->shape) == 0) { /* every window was skipped */
    ct_in[2] = nb__zeros(g, *ua);
    return nb_graph_status(g);
  }
  geom gm = scatter_geom_of(e);
  nb_gather_params q = gather_of_scatter(e->params, &gm);
  nb_val *ops[2] = {ct[0], in[1]};
  nb_val *back = nb__emit1(g, e->loc, NB_PRIM_gather, 2, ops, &q, sizeof q);
  nb_val *fit = windows_fit(e->loc, in[1], &gm, &oa->shape);
  bool is_w[NB_MAX_RANK] = {false};
  int bpos[NB_MAX_RANK], nbd = 0;
  for (int i = 0; i < gm.nw; i++) is_w[gm.wdims[i]] = true;
  for (int pos = 0; pos < ua->shape.rank; pos++)
    if (!is_w[pos]) bpos[nbd++] = pos;
  nb_val *mask = nb_broadcast_in_dim_at(e->loc, fit, ua->shape.rank, ua->shape.dims, bpos);
  ct_in[2] = nb_select_at(e->loc, mask, back, nb__zeros(g, *ua));
  return nb_graph_status(g);
}

/* Unbatched indices: the batch axis is one more window dim; batched
 * indices: it is a new pair of batching dims. Operand and updates are
 * broadcast when unbatched. */
static nb_status scatter_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                               nb_val **out, int *out_bdims) {
  nb_scatter_params q = *(const nb_scatter_params *)e->params;
  nb_scatter_dims *d = &q.dn;
  if (e->in[0]->aval.shape.rank + 1 > NB_MAX_RANK || e->in[1]->aval.shape.rank + 1 > NB_MAX_RANK ||
      e->in[2]->aval.shape.rank + 1 > NB_MAX_RANK)
    return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of scatter_add: rank too large"), NB_ERR_SHAPE;
  nb_val *ops[3] = {nb__batch_to_front(e->loc, in[0], bdims[0], n),
                    bdims[1] >= 0 ? nb__move_axis(e->loc, in[1], bdims[1], 0) : in[1],
                    nb__batch_to_front(e->loc, in[2], bdims[2], n)};
  shift_dims(d->n_inserted_window, d->inserted_window_dims, -1);
  shift_dims(d->n_scatter_to_operand, d->scatter_dims_to_operand_dims, -1);
  if (bdims[1] < 0) {
    shift_dims(d->n_operand_batching, d->operand_batching_dims, -1);
    d->n_update_window = shift_dims(d->n_update_window, d->update_window_dims, 0);
  } else {
    shift_dims(d->n_update_window, d->update_window_dims, -1);
    shift_dims(d->n_operand_batching, d->operand_batching_dims, 0);
    d->n_operand_batching = shift_dims(d->n_operand_batching, d->scatter_indices_batching_dims, 0);
    d->index_vector_dim++;
  }
  out[0] = nb__emit1(g, e->loc, NB_PRIM_scatter_add, 3, ops, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void scatter_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_aval *o = &e->in[0]->aval, *ix = &e->in[1]->aval, *u = &e->in[2]->aval;
  double es = (double)nb_dtype_size(o->dtype), nu = (double)nb_shape_size(&u->shape);
  *flops = nu;
  *bytes = 2 * es * (double)nb_shape_size(&o->shape) + 2 * es * nu +
           (double)nb_dtype_size(ix->dtype) * (double)nb_shape_size(&ix->shape);
}

static void scatter_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_scatter_dims *d = &((const nb_scatter_params *)e->params)->dn;
  buf[0] = 0;
  append_ints(buf, cap, "update_window_dims", d->n_update_window, d->update_window_dims);
  append_ints(buf, cap, "inserted", d->n_inserted_window, d->inserted_window_dims);
  append_ints(buf, cap, "to_operand", d->n_scatter_to_operand, d->scatter_dims_to_operand_dims);
  append_ints(buf, cap, "operand_batching", d->n_operand_batching, d->operand_batching_dims);
  append_ints(buf, cap, "indices_batching", d->n_operand_batching, d->scatter_indices_batching_dims);
  size_t k = strlen(buf);
  if (k < cap) snprintf(buf + k, cap - k, " index_vector_dim=%d", d->index_vector_dim);
}

const nb_prim_rules nb__prim_scatter_add = {
    .name = "scatter_add",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_scatter_params),
    .infer = scatter_infer,
    .eval = scatter_eval,
    .jvp = scatter_jvp,
    .transpose = scatter_transpose,
    .batch = scatter_batch,
    .cost = scatter_cost,
    .print_params = scatter_print,
    .in_place = true,
};

/* ---------------------------------------------------------------- public ops */

static bool counts_ok(int a, int b, int c, int d) {
  return a >= 0 && a <= NB_MAX_RANK && b >= 0 && b <= NB_MAX_RANK && c >= 0 && c <= NB_MAX_RANK && d >= 0 &&
         d <= NB_MAX_RANK;
}

nb_val *nb_gather_at(nb_loc loc, nb_val *operand, nb_val *indices, const nb_gather_dims *dn,
                     const int64_t *slice_sizes) {
  nb_val *ops[2] = {operand, indices};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!operand || !indices || !dn) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "gather: NULL operand, indices or dims");
  if (nb_graph_status(g)) return nb__poison(g);
  int ro = operand->aval.shape.rank;
  if (ro && !slice_sizes) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "gather: slice_sizes is NULL");
  if (!counts_ok(dn->n_offset, dn->n_collapsed, dn->n_start_index_map, dn->n_operand_batching))
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "gather: dimension-number counts must be in [0, %d]", NB_MAX_RANK);
  nb_gather_params p;
  memset(&p, 0, sizeof p);
  p.dn.n_offset = dn->n_offset;
  p.dn.n_collapsed = dn->n_collapsed;
  p.dn.n_start_index_map = dn->n_start_index_map;
  p.dn.n_operand_batching = dn->n_operand_batching;
  p.dn.index_vector_dim = dn->index_vector_dim;
  memcpy(p.dn.offset_dims, dn->offset_dims, (size_t)dn->n_offset * sizeof(int));
  memcpy(p.dn.collapsed_slice_dims, dn->collapsed_slice_dims, (size_t)dn->n_collapsed * sizeof(int));
  memcpy(p.dn.start_index_map, dn->start_index_map, (size_t)dn->n_start_index_map * sizeof(int));
  memcpy(p.dn.operand_batching_dims, dn->operand_batching_dims, (size_t)dn->n_operand_batching * sizeof(int));
  memcpy(p.dn.start_indices_batching_dims, dn->start_indices_batching_dims,
         (size_t)dn->n_operand_batching * sizeof(int));
  if (ro) memcpy(p.slice_sizes, slice_sizes, (size_t)ro * sizeof(int64_t));
  return nb__emit1(g, loc, NB_PRIM_gather, 2, ops, &p, sizeof p);
}

nb_val *nb_scatter_add_at(nb_loc loc, nb_val *operand, nb_val *indices, nb_val *updates, const nb_scatter_dims *dn) {
  nb_val *ops[3] = {operand, indices, updates};
  nb_graph *g = nb__graph_of(loc, 3, ops);
  if (!g) return NULL;
  if (!operand || !indices || !updates || !dn)
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "scatter_add: NULL operand, indices, updates or dims");
  if (nb_graph_status(g)) return nb__poison(g);
  if (!counts_ok(dn->n_update_window, dn->n_inserted_window, dn->n_scatter_to_operand, dn->n_operand_batching))
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "scatter_add: dimension-number counts must be in [0, %d]", NB_MAX_RANK);
  nb_scatter_params p;
  memset(&p, 0, sizeof p);
  nb_scatter_dims *d = &p.dn;
  d->n_update_window = dn->n_update_window;
  d->n_inserted_window = dn->n_inserted_window;
  d->n_scatter_to_operand = dn->n_scatter_to_operand;
  d->n_operand_batching = dn->n_operand_batching;
  d->index_vector_dim = dn->index_vector_dim;
  memcpy(d->update_window_dims, dn->update_window_dims, (size_t)dn->n_update_window * sizeof(int));
  memcpy(d->inserted_window_dims, dn->inserted_window_dims, (size_t)dn->n_inserted_window * sizeof(int));
  memcpy(d->scatter_dims_to_operand_dims, dn->scatter_dims_to_operand_dims,
         (size_t)dn->n_scatter_to_operand * sizeof(int));
  memcpy(d->operand_batching_dims, dn->operand_batching_dims, (size_t)dn->n_operand_batching * sizeof(int));
  memcpy(d->scatter_indices_batching_dims, dn->scatter_indices_batching_dims,
         (size_t)dn->n_operand_batching * sizeof(int));
  return nb__emit1(g, loc, NB_PRIM_scatter_add, 3, ops, &p, sizeof p);
}

/* Negative ids count from the end (NumPy): id + n where id < 0. Unsigned ids
 * pass through; narrow signed ids are widened when n does not fit them. */
static nb_val *wrap_negative(nb_loc l, nb_val *ids, int64_t n) {
  nb_dtype t = ids->aval.dtype;
  if (nb_dtype_is_unsigned(t)) return ids;
  int64_t max = t == NB_I8 ? INT8_MAX : t == NB_I32 ? INT32_MAX : INT64_MAX;
  if (n > max) ids = nb_convert_at(l, ids, NB_I64), t = NB_I64;
  nb_val *neg = nb_lt_at(l, ids, nb_scalar_at(l, ids->g, t, 0));
  return nb_select_at(l, neg, nb_add_at(l, ids, nb_scalar_at(l, ids->g, t, (double)n)), ids);
}

static bool check_ids(nb_loc loc, nb_graph *g, nb_val *ids, const char *op) {
  if (nb_dtype_is_int(ids->aval.dtype)) return true;
  nb__fail(g, loc, NB_ERR_DTYPE, "%s: indices must have an integer dtype, not %s", op, nb_dtype_name(ids->aval.dtype));
  return false;
}

nb_val *nb_take_at(nb_loc loc, nb_val *table, nb_val *ids) {
  nb_val *ops[2] = {table, ids};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!table || !ids) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "take: NULL table or ids");
  if (nb_graph_status(g)) return nb__poison(g);
  int rt = table->aval.shape.rank, ri = ids->aval.shape.rank;
  if (rt < 1) return nb__fail(g, loc, NB_ERR_SHAPE, "take: the table must have rank >= 1, not 0");
  if (!check_ids(loc, g, ids, "take")) return nb__poison(g);
  if (ri + rt - 1 > NB_MAX_RANK)
    return nb__fail(g, loc, NB_ERR_SHAPE, "take: result rank %d exceeds %d", ri + rt - 1, NB_MAX_RANK);
  nb_gather_dims dn;
  memset(&dn, 0, sizeof dn);
  int64_t ss[NB_MAX_RANK];
  dn.n_offset = rt - 1;
  for (int i = 0; i < rt - 1; i++) dn.offset_dims[i] = ri + i;
  dn.n_collapsed = dn.n_start_index_map = 1;
  dn.index_vector_dim = ri;
  ss[0] = 1;
  for (int i = 1; i < rt; i++) ss[i] = table->aval.shape.dims[i];
  return nb_gather_at(loc, table, wrap_negative(loc, ids, table->aval.shape.dims[0]), &dn, ss);
}

nb_val *nb_take_along_axis_at(nb_loc loc, nb_val *x, nb_val *idx, int axis) {
  nb_val *ops[2] = {x, idx};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!x || !idx) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "take_along_axis: NULL operand or indices");
  if (nb_graph_status(g)) return nb__poison(g);
  int r = x->aval.shape.rank, a = nb__norm_axis(axis, r);
  if (a < 0) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "take_along_axis: axis %d out of range for rank %d", axis, r);
  if (!check_ids(loc, g, idx, "take_along_axis")) return nb__poison(g);
  if (idx->aval.shape.rank != r)
    return nb__fail(g, loc, NB_ERR_SHAPE, "take_along_axis: indices have rank %d, the operand %d (they must match)",
                    idx->aval.shape.rank, r);
  /* broadcast every dim but `axis` to the common size */
  int64_t xd[NB_MAX_RANK], id[NB_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int64_t dx = x->aval.shape.dims[i], di = idx->aval.shape.dims[i];
    if (i != a && dx != di && dx != 1 && di != 1) {
      char s1[128], s2[128];
      return nb__fail(g, loc, NB_ERR_SHAPE, "take_along_axis: %s and indices %s do not broadcast (axis %d)",
                      nb_aval_str(&x->aval, s1, sizeof s1), nb_aval_str(&idx->aval, s2, sizeof s2), i);
    }
    xd[i] = i == a ? dx : (dx == 1 ? di : dx);
    id[i] = i == a ? di : xd[i];
  }
  nb_val *xb = nb_broadcast_to_at(loc, x, r, xd);
  nb_val *ib = nb_broadcast_to_at(loc, wrap_negative(loc, idx, x->aval.shape.dims[a]), r, id);
  nb_gather_dims dn;
  memset(&dn, 0, sizeof dn);
  int64_t ss[NB_MAX_RANK];
  dn.n_collapsed = dn.n_start_index_map = 1;
  dn.collapsed_slice_dims[0] = dn.start_index_map[0] = a;
  dn.index_vector_dim = r;
  for (int i = 0; i < r; i++) {
    ss[i] = 1;
    if (i == a) continue;
    dn.operand_batching_dims[dn.n_operand_batching] = i;
    dn.start_indices_batching_dims[dn.n_operand_batching++] = i;
  }
  return nb_gather_at(loc, xb, ib, &dn, ss);
}
