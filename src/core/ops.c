/* Public op helpers that are not one primitive: constants of a shape,
 * broadcasting, and the builders the rules share (zeros, summing a broadcast
 * back down, moving batch axes). Not here: primitive rules (prims/). */
#include <string.h>

#include "core/prims/elementwise.h"

static const nb_loc no_loc = {0};

nb_val *nb_scalar_at(nb_loc loc, nb_graph *g, nb_dtype t, double value) {
  if (!g) return NULL;
  if (nb_graph_status(g)) return nb__poison(g);
  if (t < 0 || t >= NB_DTYPE_COUNT) return nb__fail(g, loc, NB_ERR_DTYPE, "scalar: invalid dtype %d", (int)t);
  nb_array *a = nb_array_scalar(nb_graph_ctx(g), t, value);
  if (!a) return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
  nb_val *v = nb_const_at(loc, g, a);
  nb_array_release(a);
  return v;
}

nb_val *nb_full_at(nb_loc loc, nb_graph *g, nb_dtype t, int rank, const int64_t *dims, double value) {
  nb_val *s = nb_scalar_at(loc, g, t, value);
  if (!s || nb__is_poison(s) || rank == 0) return s;
  return nb_broadcast_in_dim_at(loc, s, rank, dims, NULL);
}

nb_val *nb_full_like_at(nb_loc loc, nb_val *x, double value) {
  if (!x) return NULL;
  return nb_full_at(loc, x->g, x->aval.dtype, x->aval.shape.rank, x->aval.shape.dims, value);
}

nb_val *nb_iota_at(nb_loc loc, nb_graph *g, nb_dtype t, int rank, const int64_t *dims, int axis) {
  if (!g) return NULL;
  if (rank < 0 || rank > NB_MAX_RANK || (rank && !dims))
    return nb__fail(g, loc, NB_ERR_SHAPE, "iota: invalid rank %d", rank);
  nb_iota_params p;
  memset(&p, 0, sizeof p);
  p.aval = nb_aval_make(t, rank, dims);
  p.axis = axis < 0 ? axis + rank : axis;
  return nb__emit1(g, loc, NB_PRIM_iota, 0, NULL, &p, sizeof p);
}

nb_val *nb__zeros(nb_graph *g, nb_aval a) {
  return nb_full_at(no_loc, g, a.dtype, a.shape.rank, a.shape.dims, 0.0);
}

nb_status nb__bilinear_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                           nb_val **ot) {
  nb_val *left[2] = {t[0], p[1]}, *right[2] = {p[0], t[1]};
  nb_val *a = t[0] ? nb__emit1(g, e->loc, e->prim, 2, left, e->params, e->params_size) : NULL;
  nb_val *b = t[1] ? nb__emit1(g, e->loc, e->prim, 2, right, e->params, e->params_size) : NULL;
  ot[0] = nb__add_tangents(e->loc, a, b);
  return nb_graph_status(g);
}

nb_val *nb__add_tangents(nb_loc loc, nb_val *a, nb_val *b) {
  if (!a) return b;
  if (!b) return a;
  return nb_add_at(loc, a, b);
}

/* x was broadcast (NumPy rules) from `shape`: sum the broadcast dims away. */
nb_val *nb__sum_to_shape(nb_loc loc, nb_val *x, const nb_shape *shape) {
  if (!x || nb__is_poison(x) || nb_shape_equal(&x->aval.shape, shape)) return x;
  int r = x->aval.shape.rank, lead = r - shape->rank, axes[NB_MAX_RANK], n = 0;
  for (int i = 0; i < r; i++)
    if (i < lead || (shape->dims[i - lead] == 1 && x->aval.shape.dims[i] != 1)) axes[n++] = i;
  nb_val *s = n ? nb_reduce_sum_at(loc, x, n, axes) : x;
  return nb_reshape_at(loc, s, shape->rank, shape->dims);
}

nb_val *nb__move_axis(nb_loc loc, nb_val *x, int from, int to) {
  if (!x || from == to) return x;
  int r = x->aval.shape.rank, perm[NB_MAX_RANK], k = 0;
  for (int i = 0; i < r; i++) {
    if (k == to) perm[k++] = from;
    if (i != from) perm[k++] = i;
  }
  if (k == to) perm[k++] = from;
  return nb_transpose_at(loc, x, perm);
}

nb_val *nb__bcast_batch(nb_loc loc, nb_val *x, int64_t n) {
  int r = x->aval.shape.rank, bdims[NB_MAX_RANK];
  int64_t dims[NB_MAX_RANK];
  if (r + 1 > NB_MAX_RANK) return nb__fail(x->g, loc, NB_ERR_SHAPE, "vmap: rank %d exceeds the maximum", r + 1);
  dims[0] = n;
  for (int i = 0; i < r; i++) {
    dims[i + 1] = x->aval.shape.dims[i];
    bdims[i] = i + 1;
  }
  return nb_broadcast_in_dim_at(loc, x, r + 1, dims, bdims);
}

nb_val *nb__batch_to_front(nb_loc loc, nb_val *x, int bdim, int64_t n) {
  return bdim < 0 ? nb__bcast_batch(loc, x, n) : nb__move_axis(loc, x, bdim, 0);
}

bool nb__broadcast_pair(nb_loc loc, nb_val **pa, nb_val **pb, const char *op) {
  nb_val *a = *pa, *b = *pb;
  if (nb_shape_equal(&a->aval.shape, &b->aval.shape)) return true;
  int ra = a->aval.shape.rank, rb = b->aval.shape.rank, r = ra > rb ? ra : rb;
  int64_t dims[NB_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int64_t da = i - (r - ra) >= 0 ? a->aval.shape.dims[i - (r - ra)] : 1;
    int64_t db = i - (r - rb) >= 0 ? b->aval.shape.dims[i - (r - rb)] : 1;
    if (da != db && da != 1 && db != 1) {
      char s1[128], s2[128];
      nb__fail(a->g, loc, NB_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (axis %d: %lld vs %lld)", op,
               nb_aval_str(&a->aval, s1, sizeof s1), nb_aval_str(&b->aval, s2, sizeof s2), i, (long long)da,
               (long long)db);
      return false;
    }
    dims[i] = da == 1 ? db : da;
  }
  *pa = nb_broadcast_to_at(loc, a, r, dims);
  *pb = nb_broadcast_to_at(loc, b, r, dims);
  return !nb__is_poison(*pa) && !nb__is_poison(*pb);
}

nb_val *nb_broadcast_to_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank, bdims[NB_MAX_RANK];
  if (rank < r) return nb__fail(x->g, loc, NB_ERR_SHAPE, "broadcast_to: rank %d is below the operand's %d", rank, r);
  nb_shape want = nb_shape_make(rank, dims);
  if (nb_shape_equal(&want, &x->aval.shape)) return x;
  /* size-1 dims that grow are dropped first, then broadcast_in_dim */
  int64_t kept[NB_MAX_RANK];
  int nk = 0;
  for (int i = 0; i < r; i++) {
    int j = rank - r + i;
    if (x->aval.shape.dims[i] == dims[j]) {
      kept[nk] = dims[j];
      bdims[nk++] = j;
    } else if (x->aval.shape.dims[i] != 1) {
      char s[128];
      return nb__fail(x->g, loc, NB_ERR_SHAPE, "broadcast_to: %s cannot broadcast to rank %d shape (axis %d)",
                      nb_aval_str(&x->aval, s, sizeof s), rank, i);
    }
  }
  nb_val *y = nk == r ? x : nb_reshape_at(loc, x, nk, kept);
  return nb_broadcast_in_dim_at(loc, y, rank, dims, bdims);
}

nb_val *nb_squeeze_at(nb_loc loc, nb_val *x, int naxes, const int *axes) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  bool drop[NB_MAX_RANK] = {false};
  for (int i = 0; i < naxes; i++) {
    int a = nb__norm_axis(axes[i], r);
    if (a < 0) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "squeeze: axis %d out of range for rank %d", axes[i], r);
    if (x->aval.shape.dims[a] != 1)
      return nb__fail(x->g, loc, NB_ERR_SHAPE, "squeeze: axis %d has size %lld, not 1", axes[i], (long long)x->aval.shape.dims[a]);
    drop[a] = true;
  }
  int64_t dims[NB_MAX_RANK];
  int n = 0;
  for (int i = 0; i < r; i++)
    if (!drop[i] && (naxes > 0 || x->aval.shape.dims[i] != 1)) dims[n++] = x->aval.shape.dims[i];
  return nb_reshape_at(loc, x, n, dims);
}

nb_val *nb_expand_dims_at(nb_loc loc, nb_val *x, int axis) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  int a = axis < 0 ? axis + r + 1 : axis;
  if (a < 0 || a > r || r + 1 > NB_MAX_RANK)
    return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "expand_dims: axis %d out of range for rank %d", axis, r);
  int64_t dims[NB_MAX_RANK];
  for (int i = 0, k = 0; i <= r; i++) dims[i] = i == a ? 1 : x->aval.shape.dims[k++];
  return nb_reshape_at(loc, x, r + 1, dims);
}

/* log(sum(exp(x))) along axis, shifted by the row max for range; a row
 * whose max is not finite is not shifted, so an all -inf row gives -inf
 * and a row holding +inf gives +inf (as JAX). The shift is a constant of
 * the gradient (the gradient is softmax). */
nb_val *nb_logsumexp_at(nb_loc loc, nb_val *x, int axis) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank, a = nb__norm_axis(axis, r);
  if (!nb_dtype_is_float(x->aval.dtype))
    return nb__fail(x->g, loc, NB_ERR_DTYPE, "logsumexp: needs a float array, got %s", nb_dtype_name(x->aval.dtype));
  if (a < 0) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "logsumexp: axis %d out of range for rank %d", axis, r);
  nb_val *m = nb_stop_gradient_at(loc, nb_reduce_max_at(loc, x, 1, &a));
  m = nb_select_at(loc, nb_is_finite_at(loc, m), m, nb_full_like_at(loc, m, 0));
  nb_val *e = nb_exp_at(loc, nb_sub_at(loc, x, nb_expand_dims_at(loc, m, a)));
  return nb_add_at(loc, nb_log_at(loc, nb_reduce_sum_at(loc, e, 1, &a)), m);
}
