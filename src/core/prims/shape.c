/* Layout primitives that only move or replicate elements: reshape,
 * broadcast_in_dim and transpose (slicing, padding and concatenation are in
 * slicing.c). All three are linear. */
#include <string.h>

#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- reshape */

static nb_status reshape_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  const nb_reshape_params *p = params;
  *nout = 1;
  if (nb_shape_size(&p->shape) != nb_shape_size(&in[0].shape))
    return snprintf(why, cap, "cannot reshape %lld elements into %lld", (long long)nb_shape_size(&in[0].shape),
                    (long long)nb_shape_size(&p->shape)), NB_ERR_SHAPE;
  out[0] = (nb_aval){in[0].dtype, p->shape};
  return NB_OK;
}

static nb_status copy_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  memcpy(nb_array_data_mut(out[0]), nb_array_data(in[0]), nb_array_nbytes(in[0]));
  return NB_OK;
}

static nb_status linear1_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                             nb_val **ot) {
  ot[0] = t[0] ? nb__reemit(g, e, t) : NULL;
  return nb_graph_status(g);
}

static nb_status reshape_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                   nb_val *const *ct, nb_val **ct_in) {
  const nb_shape *s = &e->in[0]->aval.shape;
  ct_in[0] = ct[0] ? nb_reshape_at(e->loc, ct[0], s->rank, s->dims) : NULL;
  return nb_graph_status(g);
}

static nb_status reshape_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                               nb_val **out, int *out_bdims) {
  const nb_reshape_params *p = e->params;
  int64_t dims[NB_MAX_RANK];
  if (p->shape.rank + 1 > NB_MAX_RANK) return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of reshape: rank too large"), NB_ERR_SHAPE;
  dims[0] = n;
  memcpy(dims + 1, p->shape.dims, sizeof(int64_t) * (size_t)p->shape.rank);
  out[0] = nb_reshape_at(e->loc, nb__move_axis(e->loc, in[0], bdims[0], 0), p->shape.rank + 1, dims);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void print_dims(char *buf, size_t cap, const char *label, int n, const int64_t *d) {
  size_t k = strlen(buf);
  k += (size_t)snprintf(buf + k, cap - k, "%s%s=(", k ? " " : "", label);
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)d[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

static void print_ints(char *buf, size_t cap, const char *label, int n, const int *d) {
  int64_t w[NB_MAX_RANK];
  for (int i = 0; i < n; i++) w[i] = d[i];
  print_dims(buf, cap, label, n, w);
}

static void reshape_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_reshape_params *p = e->params;
  print_dims(buf, cap, "shape", p->shape.rank, p->shape.dims);
}

const nb_prim_rules nb__prim_reshape = {
    .name = "reshape",
    .fusion = NB_FUSE_INDEX,
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_reshape_params),
    .infer = reshape_infer,
    .eval = copy_eval,
    .jvp = linear1_jvp,
    .transpose = reshape_transpose,
    .batch = reshape_batch,
    .print_params = reshape_print,
};

nb_val *nb_reshape_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims) {
  if (!x || nb__is_poison(x)) return x;
  if (rank < 0 || rank > NB_MAX_RANK || (rank && !dims))
    return nb__fail(x->g, loc, NB_ERR_SHAPE, "reshape: invalid rank %d", rank);
  nb_reshape_params p;
  memset(&p, 0, sizeof p);
  p.shape.rank = rank;
  int infer_at = -1;
  int64_t known = 1;
  for (int i = 0; i < rank; i++) {
    p.shape.dims[i] = dims[i];
    if (dims[i] == -1) {
      if (infer_at >= 0) return nb__fail(x->g, loc, NB_ERR_SHAPE, "reshape: more than one -1 dim");
      infer_at = i;
    } else if (dims[i] < 0) {
      return nb__fail(x->g, loc, NB_ERR_SHAPE, "reshape: negative dim %lld", (long long)dims[i]);
    } else {
      known *= dims[i];
    }
  }
  if (infer_at >= 0) {
    int64_t total = nb_shape_size(&x->aval.shape);
    if (known == 0 || total % known) {
      char s[128];
      return nb__fail(x->g, loc, NB_ERR_SHAPE, "reshape: cannot infer the -1 dim for %s", nb_aval_str(&x->aval, s, sizeof s));
    }
    p.shape.dims[infer_at] = total / known;
  }
  if (nb_shape_equal(&p.shape, &x->aval.shape)) return x;
  return nb__emit1(x->g, loc, NB_PRIM_reshape, 1, &x, &p, sizeof p);
}

/* ---------------------------------------------------------------- broadcast_in_dim */

static nb_status bcast_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                             size_t cap) {
  const nb_broadcast_params *p = params;
  *nout = 1;
  int r = in[0].shape.rank;
  if (r > p->shape.rank) return snprintf(why, cap, "operand rank %d exceeds target rank %d", r, p->shape.rank), NB_ERR_SHAPE;
  for (int i = 0; i < r; i++) {
    int d = p->bdims[i];
    if (d < 0 || d >= p->shape.rank || (i > 0 && d <= p->bdims[i - 1]))
      return snprintf(why, cap, "broadcast dims must be increasing and in range (dim %d -> %d)", i, d), NB_ERR_INVALID_ARG;
    if (in[0].shape.dims[i] != 1 && in[0].shape.dims[i] != p->shape.dims[d])
      return snprintf(why, cap, "operand dim %d (%lld) cannot broadcast to %lld", i, (long long)in[0].shape.dims[i],
                      (long long)p->shape.dims[d]), NB_ERR_SHAPE;
  }
  for (int i = 0; i < p->shape.rank; i++)
    if (p->shape.dims[i] < 0) return snprintf(why, cap, "negative target dim"), NB_ERR_SHAPE;
  out[0] = (nb_aval){in[0].dtype, p->shape};
  return NB_OK;
}

static nb_status bcast_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_broadcast_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape;
  int64_t istr[NB_MAX_RANK], ostr[NB_MAX_RANK], n = nb_shape_size(&p->shape);
  nb__strides(is, istr);
  nb__strides(&p->shape, ostr);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *x = nb_array_data(in[0]);
  char *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < n; o++) {
    int64_t src = 0;
    for (int i = 0; i < is->rank; i++) {
      int64_t coord = (o / ostr[p->bdims[i]]) % p->shape.dims[p->bdims[i]];
      if (is->dims[i] != 1) src += coord * istr[i];
    }
    memcpy(y + o * (int64_t)es, x + src * (int64_t)es, es);
  }
  return NB_OK;
}

static nb_status bcast_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                 nb_val *const *ct, nb_val **ct_in) {
  const nb_broadcast_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape;
  ct_in[0] = NULL;
  if (!ct[0]) return NB_OK;
  bool kept[NB_MAX_RANK] = {false};
  int axes[NB_MAX_RANK], n = 0;
  for (int i = 0; i < is->rank; i++)
    if (is->dims[i] == p->shape.dims[p->bdims[i]]) kept[p->bdims[i]] = true;
  for (int i = 0; i < p->shape.rank; i++)
    if (!kept[i]) axes[n++] = i;
  nb_val *s = n ? nb_reduce_sum_at(e->loc, ct[0], n, axes) : ct[0];
  ct_in[0] = nb_reshape_at(e->loc, s, is->rank, is->dims);
  return nb_graph_status(g);
}

static nb_status bcast_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                             nb_val **out, int *out_bdims) {
  const nb_broadcast_params *p = e->params;
  if (p->shape.rank + 1 > NB_MAX_RANK) return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of broadcast: rank too large"), NB_ERR_SHAPE;
  int64_t dims[NB_MAX_RANK];
  int bd[NB_MAX_RANK];
  dims[0] = n;
  memcpy(dims + 1, p->shape.dims, sizeof(int64_t) * (size_t)p->shape.rank);
  bd[0] = 0;
  for (int i = 0; i < e->in[0]->aval.shape.rank; i++) bd[i + 1] = p->bdims[i] + 1;
  out[0] = nb_broadcast_in_dim_at(e->loc, nb__move_axis(e->loc, in[0], bdims[0], 0), p->shape.rank + 1, dims, bd);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void bcast_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_broadcast_params *p = e->params;
  print_dims(buf, cap, "shape", p->shape.rank, p->shape.dims);
  print_ints(buf, cap, "dims", e->in[0]->aval.shape.rank, p->bdims);
}

const nb_prim_rules nb__prim_broadcast_in_dim = {
    .name = "broadcast_in_dim",
    .fusion = NB_FUSE_INDEX,
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_broadcast_params),
    .infer = bcast_infer,
    .eval = bcast_eval,
    .jvp = linear1_jvp,
    .transpose = bcast_transpose,
    .batch = bcast_batch,
    .print_params = bcast_print,
};

nb_val *nb_broadcast_in_dim_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims, const int *bdims) {
  if (!x || nb__is_poison(x)) return x;
  if (rank < 0 || rank > NB_MAX_RANK || (rank && !dims))
    return nb__fail(x->g, loc, NB_ERR_SHAPE, "broadcast_in_dim: invalid rank %d", rank);
  if (x->aval.shape.rank && !bdims)
    return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "broadcast_in_dim: bdims is NULL for a rank-%d operand", x->aval.shape.rank);
  nb_broadcast_params p;
  memset(&p, 0, sizeof p);
  p.shape = nb_shape_make(rank, dims);
  for (int i = 0; i < x->aval.shape.rank; i++) p.bdims[i] = bdims[i];
  if (nb_shape_equal(&p.shape, &x->aval.shape)) {
    bool identity = true;
    for (int i = 0; i < rank; i++) identity = identity && p.bdims[i] == i;
    if (identity) return x;
  }
  return nb__emit1(x->g, loc, NB_PRIM_broadcast_in_dim, 1, &x, &p, sizeof p);
}

/* ---------------------------------------------------------------- transpose */

static nb_status transpose_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                 size_t cap) {
  const nb_transpose_params *p = params;
  *nout = 1;
  int r = in[0].shape.rank;
  bool seen[NB_MAX_RANK] = {false};
  out[0] = in[0];
  for (int i = 0; i < r; i++) {
    if (p->perm[i] < 0 || p->perm[i] >= r || seen[p->perm[i]])
      return snprintf(why, cap, "perm is not a permutation of 0..%d", r - 1), NB_ERR_INVALID_ARG;
    seen[p->perm[i]] = true;
    out[0].shape.dims[i] = in[0].shape.dims[p->perm[i]];
  }
  return NB_OK;
}

static nb_status transpose_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_transpose_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape, *os = &e->out[0]->aval.shape;
  int64_t istr[NB_MAX_RANK], ostr[NB_MAX_RANK], n = nb_shape_size(os);
  nb__strides(is, istr);
  nb__strides(os, ostr);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *x = nb_array_data(in[0]);
  char *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < n; o++) {
    int64_t src = 0;
    for (int i = 0; i < os->rank; i++) src += ((o / ostr[i]) % os->dims[i]) * istr[p->perm[i]];
    memcpy(y + o * (int64_t)es, x + src * (int64_t)es, es);
  }
  return NB_OK;
}

static nb_status transpose_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                     nb_val *const *ct, nb_val **ct_in) {
  const nb_transpose_params *p = e->params;
  int inv[NB_MAX_RANK];
  for (int i = 0; i < e->in[0]->aval.shape.rank; i++) inv[p->perm[i]] = i;
  ct_in[0] = ct[0] ? nb_transpose_at(e->loc, ct[0], inv) : NULL;
  return nb_graph_status(g);
}

static nb_status transpose_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                                 nb_val **out, int *out_bdims) {
  const nb_transpose_params *p = e->params;
  int perm[NB_MAX_RANK];
  perm[0] = 0;
  for (int i = 0; i < e->in[0]->aval.shape.rank; i++) perm[i + 1] = p->perm[i] + 1;
  out[0] = nb_transpose_at(e->loc, nb__move_axis(e->loc, in[0], bdims[0], 0), perm);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void transpose_print(const nb_eqn *e, char *buf, size_t cap) {
  print_ints(buf, cap, "perm", e->in[0]->aval.shape.rank, ((const nb_transpose_params *)e->params)->perm);
}

const nb_prim_rules nb__prim_transpose = {
    .name = "transpose",
    .fusion = NB_FUSE_INDEX,
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_transpose_params),
    .infer = transpose_infer,
    .eval = transpose_eval,
    .jvp = linear1_jvp,
    .transpose = transpose_transpose,
    .batch = transpose_batch,
    .print_params = transpose_print,
};

nb_val *nb_transpose_at(nb_loc loc, nb_val *x, const int *perm) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  if (r && !perm) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "transpose: perm is NULL");
  nb_transpose_params p;
  memset(&p, 0, sizeof p);
  bool identity = true;
  for (int i = 0; i < r; i++) {
    p.perm[i] = perm[i] < 0 ? perm[i] + r : perm[i];
    identity = identity && p.perm[i] == i;
  }
  if (identity) return x;
  return nb__emit1(x->g, loc, NB_PRIM_transpose, 1, &x, &p, sizeof p);
}
