/* Reductions over a set of axes (sum, max, min, prod) and the index
 * reductions argmax/argmin along one axis. Reduced axes are removed. */
#include <math.h>
#include <string.h>

#include "core/prims/elementwise.h"

static nb_status reduce_shape(const nb_reduce_params *p, const nb_aval *in, nb_aval *out, char *why, size_t cap) {
  int r = in->shape.rank;
  bool drop[NB_MAX_RANK] = {false};
  for (int i = 0; i < p->naxes; i++) {
    if (p->axes[i] < 0 || p->axes[i] >= r || drop[p->axes[i]] || (i && p->axes[i] <= p->axes[i - 1]))
      return snprintf(why, cap, "axes must be distinct, increasing and in [0, %d)", r), NB_ERR_INVALID_ARG;
    drop[p->axes[i]] = true;
  }
  out->dtype = in->dtype;
  out->shape.rank = 0;
  memset(out->shape.dims, 0, sizeof out->shape.dims);
  for (int i = 0; i < r; i++)
    if (!drop[i]) out->shape.dims[out->shape.rank++] = in->shape.dims[i];
  return NB_OK;
}

static nb_status reduce_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  *nout = 1;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "cannot reduce bool (convert first)"), NB_ERR_DTYPE;
  return reduce_shape(params, &in[0], &out[0], why, cap);
}

/* Output position of each input element: the coordinates of kept axes. */
static int64_t out_index(int64_t i, const nb_shape *is, const int64_t *istr, const bool *drop, const int64_t *ostr_by_in) {
  int64_t o = 0;
  for (int d = 0; d < is->rank; d++)
    if (!drop[d]) o += ((i / istr[d]) % is->dims[d]) * ostr_by_in[d];
  return o;
}

static nb_status reduce_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_reduce_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape, *os = &e->out[0]->aval.shape;
  nb_dtype t = nb_array_dtype(in[0]);
  bool drop[NB_MAX_RANK] = {false}, is_float = nb_dtype_is_float(t);
  for (int i = 0; i < p->naxes; i++) drop[p->axes[i]] = true;
  int64_t istr[NB_MAX_RANK], ostr[NB_MAX_RANK], ostr_by_in[NB_MAX_RANK] = {0};
  nb__strides(is, istr);
  nb__strides(os, ostr);
  for (int d = 0, k = 0; d < is->rank; d++)
    if (!drop[d]) ostr_by_in[d] = ostr[k++];
  int64_t n = nb_shape_size(is), no = nb_shape_size(os);
  double *acc = nb_alloc(ctx, (size_t)(no ? no : 1) * sizeof(double));
  int64_t *iacc = nb_alloc(ctx, (size_t)(no ? no : 1) * sizeof(int64_t));
  if (!acc || !iacc) {
    nb_dealloc(ctx, acc, (size_t)(no ? no : 1) * sizeof(double));
    nb_dealloc(ctx, iacc, (size_t)(no ? no : 1) * sizeof(int64_t));
    return NB_ERR_NOMEM;
  }
  nb_prim pr = e->prim;
  for (int64_t o = 0; o < no; o++) {
    acc[o] = pr == NB_PRIM_reduce_sum ? 0 : pr == NB_PRIM_reduce_prod ? 1 : pr == NB_PRIM_reduce_max ? -INFINITY : INFINITY;
    iacc[o] = pr == NB_PRIM_reduce_sum ? 0 : pr == NB_PRIM_reduce_prod ? 1 : pr == NB_PRIM_reduce_max ? INT64_MIN : INT64_MAX;
  }
  const void *x = nb_array_data(in[0]);
  for (int64_t i = 0; i < n; i++) {
    int64_t o = out_index(i, is, istr, drop, ostr_by_in);
    if (is_float) {
      double v = nb__load_f64(t, x, i), a = acc[o];
      acc[o] = pr == NB_PRIM_reduce_sum    ? a + v
               : pr == NB_PRIM_reduce_prod ? a * v
               : (v != v || a != a)        ? NAN
               : pr == NB_PRIM_reduce_max  ? (v > a ? v : a)
                                           : (v < a ? v : a);
    } else {
      int64_t v = nb__load_i64(t, x, i), a = iacc[o];
      iacc[o] = pr == NB_PRIM_reduce_sum    ? (int64_t)((uint64_t)a + (uint64_t)v)
                : pr == NB_PRIM_reduce_prod ? (int64_t)((uint64_t)a * (uint64_t)v)
                : pr == NB_PRIM_reduce_max  ? (v > a ? v : a)
                                            : (v < a ? v : a);
    }
  }
  void *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < no; o++) {
    if (is_float) nb__store_f64(t, y, o, acc[o]);
    else nb__store_i64(t, y, o, iacc[o]);
  }
  nb_dealloc(ctx, acc, (size_t)(no ? no : 1) * sizeof(double));
  nb_dealloc(ctx, iacc, (size_t)(no ? no : 1) * sizeof(int64_t));
  return NB_OK;
}

/* y broadcast back to the operand's shape (the reduced axes re-inserted). */
static nb_val *expand_back(nb_loc l, nb_val *y, const nb_eqn *e) {
  const nb_reduce_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape;
  bool drop[NB_MAX_RANK] = {false};
  int bd[NB_MAX_RANK], k = 0;
  for (int i = 0; i < p->naxes; i++) drop[p->axes[i]] = true;
  for (int d = 0; d < is->rank; d++)
    if (!drop[d]) bd[k++] = d;
  return nb_broadcast_in_dim_at(l, y, is->rank, is->dims, bd);
}

static nb_status reduce_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  nb_loc l = e->loc;
  const nb_reduce_params *rp = e->params;
  ot[0] = NULL;
  if (!t[0]) return NB_OK;
  nb_val *x = p[0], *factor = NULL;
  switch (e->prim) {
  case NB_PRIM_reduce_sum: ot[0] = nb__reemit(g, e, t); return nb_graph_status(g);
  case NB_PRIM_reduce_max:
  case NB_PRIM_reduce_min: { /* split the tangent evenly among the tied winners */
    nb_val *hit = nb_convert_at(l, nb_eq_at(l, x, expand_back(l, outs[0], e)), x->aval.dtype);
    nb_val *count = nb_reduce_sum_at(l, hit, rp->naxes, rp->axes);
    factor = nb_div_at(l, hit, expand_back(l, count, e));
    break;
  }
  case NB_PRIM_reduce_prod: { /* product of the others, exact when some x are zero */
    nb_val *zero = nb_full_like_at(l, x, 0), *one = nb_full_like_at(l, x, 1);
    nb_val *nz = nb_ne_at(l, x, zero), *safe = nb_select_at(l, nz, x, one);
    nb_val *prod_nz = expand_back(l, nb_reduce_prod_at(l, safe, rp->naxes, rp->axes), e);
    nb_val *zeros = expand_back(l, nb_reduce_sum_at(l, nb_convert_at(l, nb_not_at(l, nz), x->aval.dtype), rp->naxes, rp->axes), e);
    nb_val *none = nb_eq_at(l, zeros, zero), *one_zero = nb_and_at(l, nb_eq_at(l, zeros, one), nb_not_at(l, nz));
    factor = nb_select_at(l, none, nb_div_at(l, prod_nz, safe), nb_select_at(l, one_zero, prod_nz, zero));
    break;
  }
  default: return NB_ERR_INTERNAL;
  }
  ot[0] = nb_reduce_sum_at(l, nb_mul_at(l, t[0], factor), rp->naxes, rp->axes);
  return nb_graph_status(g);
}

static nb_status sum_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct,
                               nb_val **ct_in) {
  ct_in[0] = ct[0] ? expand_back(e->loc, ct[0], e) : NULL;
  return nb_graph_status(g);
}

static nb_status reduce_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                              nb_val **out, int *out_bdims) {
  const nb_reduce_params *p = e->params;
  nb_reduce_params q = *p;
  for (int i = 0; i < q.naxes; i++) q.axes[i]++;
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0);
  out[0] = nb__emit1(g, e->loc, e->prim, 1, &x, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void reduce_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_reduce_params *p = e->params;
  size_t k = (size_t)snprintf(buf, cap, "axes=(");
  for (int i = 0; i < p->naxes && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", p->axes[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

static void reduce_cost(const nb_eqn *e, double *flops, double *bytes) {
  double n = (double)nb_shape_size(&e->in[0]->aval.shape), s = (double)nb_dtype_size(e->in[0]->aval.dtype);
  *flops = n;
  *bytes = n * s + (double)nb_shape_size(&e->out[0]->aval.shape) * s;
}

/* How the compiler accumulates each reduction (ir.h). */
static const nb_reduce_lowering lower_sum = {.op = "+", .omp = "+", .id_f = "0", .id_i = "0"};
static const nb_reduce_lowering lower_prod = {.op = "*", .omp = "*", .id_f = "1", .id_i = "1"};
static const nb_reduce_lowering lower_max = {.extremum = true, .op = ">", .omp = "max", .id_f = "-INFINITY", .id_i = "INT64_MIN"};
static const nb_reduce_lowering lower_min = {.extremum = true, .op = "<", .omp = "min", .id_f = "INFINITY", .id_i = "INT64_MAX"};

#define REDUCE_RULES(op, transpose_rule, lowering)              \
  const nb_prim_rules nb__prim_##op = {                         \
      .name = #op,                                              \
      .kind = NB_KIND_REDUCE,                                     \
      .params_size = sizeof(nb_reduce_params),                    \
      .infer = reduce_infer,                                      \
      .eval = reduce_eval,                                        \
      .jvp = reduce_jvp,                                          \
      .transpose = transpose_rule,                                \
      .batch = reduce_batch,                                      \
      .cost = reduce_cost,                                        \
      .print_params = reduce_print,                               \
      .fusion = NB_FUSE_REDUCE,                                   \
      .reduce = &lowering,                                        \
  };
REDUCE_RULES(reduce_sum, sum_transpose, lower_sum)
REDUCE_RULES(reduce_max, NULL, lower_max)
REDUCE_RULES(reduce_min, NULL, lower_min)
REDUCE_RULES(reduce_prod, NULL, lower_prod)

static nb_val *reduce_op(nb_loc loc, nb_prim prim, nb_val *x, int naxes, const int *axes) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  nb_reduce_params p;
  memset(&p, 0, sizeof p);
  bool sel[NB_MAX_RANK] = {false};
  if (naxes == 0 && !axes) {
    for (int i = 0; i < r; i++) sel[i] = true;
  } else {
    if (naxes < 0 || naxes > r || (naxes && !axes))
      return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "%s: %d axes for a rank-%d operand", nb__rules(prim)->name, naxes, r);
    for (int i = 0; i < naxes; i++) {
      int a = nb__norm_axis(axes[i], r);
      if (a < 0) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "%s: axis %d out of range for rank %d", nb__rules(prim)->name, axes[i], r);
      if (sel[a]) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "%s: axis %d repeated", nb__rules(prim)->name, axes[i]);
      sel[a] = true;
    }
  }
  for (int i = 0; i < r; i++)
    if (sel[i]) p.axes[p.naxes++] = i;
  if (p.naxes == 0) return x;
  return nb__emit1(x->g, loc, prim, 1, &x, &p, sizeof p);
}

nb_val *nb_reduce_sum_at(nb_loc loc, nb_val *x, int naxes, const int *axes) { return reduce_op(loc, NB_PRIM_reduce_sum, x, naxes, axes); }
nb_val *nb_reduce_max_at(nb_loc loc, nb_val *x, int naxes, const int *axes) { return reduce_op(loc, NB_PRIM_reduce_max, x, naxes, axes); }
nb_val *nb_reduce_min_at(nb_loc loc, nb_val *x, int naxes, const int *axes) { return reduce_op(loc, NB_PRIM_reduce_min, x, naxes, axes); }
nb_val *nb_reduce_prod_at(nb_loc loc, nb_val *x, int naxes, const int *axes) { return reduce_op(loc, NB_PRIM_reduce_prod, x, naxes, axes); }

/* ---------------------------------------------------------------- argmax / argmin */

static nb_status arg_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_argreduce_params *p = params;
  *nout = 1;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "cannot take argmax/argmin of bool"), NB_ERR_DTYPE;
  if (p->index_dtype != NB_I32 && p->index_dtype != NB_I64)
    return snprintf(why, cap, "index dtype must be i32 or i64"), NB_ERR_DTYPE;
  if (in[0].shape.dims[p->axis] == 0 && p->axis < in[0].shape.rank)
    return snprintf(why, cap, "axis %d is empty", p->axis), NB_ERR_SHAPE;
  nb_reduce_params rp;
  memset(&rp, 0, sizeof rp);
  rp.naxes = 1;
  rp.axes[0] = p->axis;
  nb_status s = reduce_shape(&rp, &in[0], &out[0], why, cap);
  out[0].dtype = p->index_dtype;
  return s;
}

/* First index of the extreme value; NaN counts as the extreme (as XLA). */
static nb_status arg_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_argreduce_params *p = e->params;
  const nb_shape *is = &e->in[0]->aval.shape;
  nb_dtype t = nb_array_dtype(in[0]);
  int64_t istr[NB_MAX_RANK];
  nb__strides(is, istr);
  int64_t len = is->dims[p->axis], step = istr[p->axis], no = nb_shape_size(&e->out[0]->aval.shape);
  int64_t inner = step, outer_stride = step * len;
  bool is_max = e->prim == NB_PRIM_argmax;
  const void *x = nb_array_data(in[0]);
  for (int64_t o = 0; o < no; o++) {
    int64_t base = (o / inner) * outer_stride + o % inner, best = 0;
    double bv = nb__load_f64(t, x, base);
    int64_t bi = nb__load_i64(t, x, base);
    for (int64_t k = 1; k < len && bv == bv; k++) {
      int64_t at = base + k * step;
      if (nb_dtype_is_float(t)) {
        double v = nb__load_f64(t, x, at);
        if (v != v || (is_max ? v > bv : v < bv)) bv = v, best = k;
      } else {
        int64_t v = nb__load_i64(t, x, at);
        if (is_max ? v > bi : v < bi) bi = v, best = k;
      }
    }
    nb__store_i64(p->index_dtype, nb_array_data_mut(out[0]), o, best);
  }
  return NB_OK;
}

static nb_status arg_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                           int *out_bdims) {
  nb_argreduce_params q = *(const nb_argreduce_params *)e->params;
  q.axis++;
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0);
  out[0] = nb__emit1(g, e->loc, e->prim, 1, &x, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void arg_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_argreduce_params *p = e->params;
  snprintf(buf, cap, "axis=%d index_dtype=%s", p->axis, nb_dtype_name(p->index_dtype));
}

#define ARG_RULES(op)                                \
  const nb_prim_rules nb__prim_##op = {              \
      .name = #op,                                   \
      .kind = NB_KIND_REDUCE,                          \
      .params_size = sizeof(nb_argreduce_params),      \
      .infer = arg_infer,                              \
      .eval = arg_eval,                                \
      .batch = arg_batch,                              \
      .print_params = arg_print,                       \
  };
ARG_RULES(argmax)
ARG_RULES(argmin)

static nb_val *arg_op(nb_loc loc, nb_prim prim, nb_val *x, int axis, nb_dtype index_dtype) {
  if (!x || nb__is_poison(x)) return x;
  int a = nb__norm_axis(axis, x->aval.shape.rank);
  if (a < 0) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "%s: axis %d out of range for rank %d", nb__rules(prim)->name, axis, x->aval.shape.rank);
  nb_argreduce_params p;
  memset(&p, 0, sizeof p);
  p.axis = a;
  p.index_dtype = index_dtype;
  return nb__emit1(x->g, loc, prim, 1, &x, &p, sizeof p);
}

nb_val *nb_argmax_at(nb_loc loc, nb_val *x, int axis, nb_dtype t) { return arg_op(loc, NB_PRIM_argmax, x, axis, t); }
nb_val *nb_argmin_at(nb_loc loc, nb_val *x, int axis, nb_dtype t) { return arg_op(loc, NB_PRIM_argmin, x, axis, t); }
