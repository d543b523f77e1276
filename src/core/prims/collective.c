/* Collectives over a mesh axis (nabla/collective.h): psum, pmax, pbroadcast,
 * all_gather, psum_scatter, all_to_all, ppermute, axis_index. Their
 * reference rules run through the communicator the context binds to the
 * axis; a compiled step runs them as steps of their own (NB_FUSE_NONE), psum,
 * pmax, all_gather and psum_scatter as a start and a finish step apart (the
 * async rules) when the communicator can. They are never folded (kind
 * OTHER). pmean is psum times 1/size. */
#include <stdlib.h>
#include <string.h>

#include "core/prims/elementwise.h"

/* ------------------------------------------------------------ helpers */

static nb_status comm_of(nb_ctx *ctx, const nb_eqn *e, nb_comm **out) {
  const nb_collective_params *p = e->params;
  nb_comm *c = nb_ctx_axis(ctx, p->axis);
  if (!c)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: axis '%s' is not bound on this context (nb_ctx_bind_axis)",
                     nb__rules(e->prim)->name, p->axis);
  int n = c->ops->size(c);
  if (n != p->axis_size)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: axis '%s' was traced with size %lld but runs over %d processes",
                     nb__rules(e->prim)->name, p->axis, (long long)p->axis_size, n);
  *out = c;
  return NB_OK;
}

/* src viewed as [pre][n][chunk] bytes -> dst as [n][pre][chunk] (to_major),
 * or the inverse. */
static void regroup(char *dst, const char *src, int64_t pre, int64_t n, size_t chunk, bool to_major) {
  for (int64_t o = 0; o < pre; o++)
    for (int64_t r = 0; r < n; r++) {
      size_t a = ((size_t)o * (size_t)n + (size_t)r) * chunk, b = ((size_t)r * (size_t)pre + (size_t)o) * chunk;
      memcpy(to_major ? dst + b : dst + a, to_major ? src + a : src + b, chunk);
    }
}

static int64_t prod(const nb_shape *s, int from, int to) {
  int64_t n = 1;
  for (int d = from; d < to; d++) n *= s->dims[d];
  return n;
}

static nb_val *emit_like(nb_graph *g, const nb_eqn *e, nb_prim prim, nb_val *x, const nb_collective_params *p) {
  return nb__emit1(g, e->loc, prim, 1, &x, p, sizeof *p);
}

/* ------------------------------------------------------------ shape rules */

static nb_status same_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                            size_t cap) {
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  return NB_OK;
}

static nb_status reduce_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  nb_status s = same_infer(params, nin, in, nout, out, why, cap);
  if (!s && in[0].dtype == NB_BOOL) return snprintf(why, cap, "cannot reduce bool (convert first)"), NB_ERR_DTYPE;
  return s;
}

static nb_status gather_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                              size_t cap) {
  const nb_collective_params *p = params;
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  int r = in[0].shape.rank;
  if (p->dim < 0 || p->dim > (p->tiled ? r - 1 : r) || (!p->tiled && r == NB_MAX_RANK))
    return snprintf(why, cap, "dim %d out of range for rank %d%s", p->dim, r, p->tiled ? " (tiled)" : ""),
           NB_ERR_INVALID_ARG;
  out[0] = in[0];
  if (p->tiled) {
    out[0].shape.dims[p->dim] *= p->axis_size;
  } else {
    for (int d = r; d > p->dim; d--) out[0].shape.dims[d] = in[0].shape.dims[d - 1];
    out[0].shape.dims[p->dim] = p->axis_size;
    out[0].shape.rank = r + 1;
  }
  return NB_OK;
}

static nb_status scatter_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  const nb_collective_params *p = params;
  nb_status s = reduce_infer(params, nin, in, nout, out, why, cap);
  if (s) return s;
  int r = in[0].shape.rank;
  if (p->dim < 0 || p->dim >= r) return snprintf(why, cap, "dim %d out of range for rank %d", p->dim, r), NB_ERR_INVALID_ARG;
  int64_t len = in[0].shape.dims[p->dim];
  if (p->tiled ? len % p->axis_size : len != p->axis_size)
    return snprintf(why, cap, "dim %d has %lld elements: %s %lld (the axis's size)", p->dim, (long long)len,
                    p->tiled ? "not a multiple of" : "not", (long long)p->axis_size),
           NB_ERR_SHAPE;
  if (p->tiled) {
    out[0].shape.dims[p->dim] = len / p->axis_size;
  } else {
    for (int d = p->dim; d < r - 1; d++) out[0].shape.dims[d] = in[0].shape.dims[d + 1];
    out[0].shape.rank = r - 1;
  }
  return NB_OK;
}

static nb_status a2a_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_collective_params *p = params;
  nb_status s = same_infer(params, nin, in, nout, out, why, cap);
  if (s) return s;
  int r = in[0].shape.rank;
  if (p->dim < 0 || p->dim >= r || p->dim2 < 0 || p->dim2 >= r)
    return snprintf(why, cap, "split dim %d or concat dim %d out of range for rank %d", p->dim, p->dim2, r),
           NB_ERR_INVALID_ARG;
  if (in[0].shape.dims[p->dim] % p->axis_size)
    return snprintf(why, cap, "split dim %d has %lld elements, not a multiple of %lld (the axis's size)", p->dim,
                    (long long)in[0].shape.dims[p->dim], (long long)p->axis_size),
           NB_ERR_SHAPE;
  out[0].shape.dims[p->dim] /= p->axis_size;
  out[0].shape.dims[p->dim2] *= p->axis_size;
  return NB_OK;
}

static nb_status index_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                             size_t cap) {
  *nout = 1;
  if (nin != 0) return snprintf(why, cap, "takes no operands, got %d", nin), NB_ERR_INVALID_ARG;
  out[0] = nb_aval_make(NB_I32, 0, NULL);
  return NB_OK;
}

/* ------------------------------------------------------------ reference rules */

/* psum, pmax, pbroadcast, all_gather and psum_scatter run in two halves:
 * begin starts the communicator's collective (its *_start operation when it
 * has one and defer is set, else the synchronous one, which finishes it),
 * finish waits for it and puts the result in place. eval is both at once;
 * a compiled executable runs them as two steps with others in between. */
typedef struct pending_coll {
  nb_comm *c;
  nb_comm_req *req; /* NULL: nothing left to wait for */
  char *tmp;        /* all_gather: every rank's x; psum_scatter: x regrouped by rank */
  size_t tmp_bytes;
  char *out;        /* all_gather: regrouped from tmp at the end */
  int64_t pre, n;
  size_t chunk;
} pending_coll;

static void pending_free(nb_ctx *ctx, pending_coll *p) {
  if (p->tmp) nb_dealloc(ctx, p->tmp, p->tmp_bytes);
  nb_dealloc(ctx, p, sizeof *p);
}

static bool can_defer(const nb_comm *c) {
  return c->ops->allgather_start && c->ops->allreduce_start && c->ops->reduce_scatter_start && c->ops->test && c->ops->wait;
}

static nb_status finish_coll(nb_ctx *ctx, void *pv) {
  pending_coll *p = pv;
  nb_status s = p->req ? p->c->ops->wait(p->c, ctx, p->req) : NB_OK;
  if (!s && p->out && p->chunk) regroup(p->out, p->tmp, p->pre, p->n, p->chunk, false);
  pending_free(ctx, p);
  return s;
}

static nb_status begin_coll(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out, bool defer,
                            void **pending) {
  const nb_collective_params *prm = e->params;
  *pending = NULL;
  nb_comm *c;
  nb_status s = comm_of(ctx, e, &c);
  if (s) return s;
  pending_coll *p = nb_calloc(ctx, sizeof *p);
  if (!p) return NB_ERR_NOMEM;
  p->c = c;
  defer = defer && can_defer(c);
  const nb_comm_ops *op = c->ops;
  size_t bytes = nb_array_nbytes(in[0]);
  nb_dtype t = nb_array_dtype(in[0]);
  int64_t n = prm->axis_size, pre = e->prim == NB_PRIM_psum || e->prim == NB_PRIM_pmax || e->prim == NB_PRIM_pbroadcast
                                        ? 1
                                        : prod(&e->in[0]->aval.shape, 0, prm->dim);
  switch (e->prim) {
  case NB_PRIM_psum:
  case NB_PRIM_pmax:
  case NB_PRIM_pbroadcast: {
    char *y = nb_array_data_mut(out[0]);
    if (bytes) memcpy(y, nb_array_data(in[0]), bytes);
    if (e->prim == NB_PRIM_pbroadcast) break;
    size_t count = (size_t)nb_array_size(in[0]);
    nb_comm_reduce r = e->prim == NB_PRIM_pmax ? NB_COMM_MAX : NB_COMM_SUM;
    s = defer ? op->allreduce_start(c, ctx, y, count, t, r, &p->req) : op->allreduce(c, ctx, y, count, t, r);
    break;
  }
  case NB_PRIM_all_gather:
    p->tmp_bytes = (size_t)n * bytes + 1;
    if (!(p->tmp = nb_alloc(ctx, p->tmp_bytes))) {
      s = NB_ERR_NOMEM;
      break;
    }
    p->out = nb_array_data_mut(out[0]);
    p->pre = pre;
    p->n = n;
    p->chunk = bytes ? bytes / (size_t)pre : 0; /* 0: nothing to regroup */
    s = defer ? op->allgather_start(c, ctx, nb_array_data(in[0]), p->tmp, bytes, &p->req)
              : op->allgather(c, ctx, nb_array_data(in[0]), p->tmp, bytes);
    break;
  case NB_PRIM_psum_scatter: {
    p->tmp_bytes = bytes + 1;
    if (!(p->tmp = nb_alloc(ctx, p->tmp_bytes))) {
      s = NB_ERR_NOMEM;
      break;
    }
    if (bytes) regroup(p->tmp, nb_array_data(in[0]), pre, n, bytes / (size_t)pre / (size_t)n, true);
    size_t count = (size_t)nb_array_size(out[0]);
    s = defer ? op->reduce_scatter_start(c, ctx, p->tmp, nb_array_data_mut(out[0]), count, t, NB_COMM_SUM, &p->req)
              : op->reduce_scatter(c, ctx, p->tmp, nb_array_data_mut(out[0]), count, t, NB_COMM_SUM);
    break;
  }
  default: s = nb_errorf(ctx, NB_ERR_INTERNAL, "%s cannot start asynchronously", nb__rules(e->prim)->name); break;
  }
  if (s) {
    pending_free(ctx, p);
    return s;
  }
  if (!p->req) return finish_coll(ctx, p); /* done already: only the regrouping is left */
  *pending = p;
  return NB_OK;
}

static nb_status coll_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  void *p;
  return begin_coll(ctx, e, in, out, false, &p);
}

static nb_status coll_start(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out, void **pending) {
  return begin_coll(ctx, e, in, out, true, pending);
}

static nb_status coll_test(nb_ctx *ctx, void *pv, bool *done) {
  pending_coll *p = pv;
  return p->c->ops->test(p->c, ctx, p->req, done);
}

static bool coll_available(nb_ctx *ctx, const nb_eqn *e) {
  nb_comm *c = nb_ctx_axis(ctx, ((const nb_collective_params *)e->params)->axis);
  return c && can_defer(c) && e->prim != NB_PRIM_pbroadcast;
}

static const nb_async_rules coll_async = {coll_available, coll_start, coll_test, finish_coll};

static nb_status a2a_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_collective_params *p = e->params;
  nb_comm *c;
  nb_status s = comm_of(ctx, e, &c);
  if (s) return s;
  size_t bytes = nb_array_nbytes(in[0]), n = (size_t)p->axis_size;
  char *send = nb_alloc(ctx, bytes ? 2 * bytes : 1), *recv = send + bytes;
  if (!send) return NB_ERR_NOMEM;
  nb_shape block = e->in[0]->aval.shape; /* what one rank sends another */
  block.dims[p->dim] /= (int64_t)n;
  int64_t pre_s = prod(&block, 0, p->dim), pre_c = prod(&block, 0, p->dim2);
  if (bytes) regroup(send, nb_array_data(in[0]), pre_s, (int64_t)n, bytes / n / (size_t)pre_s, true);
  s = c->ops->all_to_all(c, ctx, send, recv, bytes / n);
  if (!s && bytes) regroup(nb_array_data_mut(out[0]), recv, pre_c, (int64_t)n, bytes / n / (size_t)pre_c, false);
  nb_dealloc(ctx, send, bytes ? 2 * bytes : 1);
  return s;
}

static nb_status ppermute_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_collective_params *p = e->params;
  nb_comm *c;
  nb_status s = comm_of(ctx, e, &c);
  if (s) return s;
  int me = c->ops->rank(c), to = -1, from = -1;
  for (int i = 0; i < p->npairs; i++) {
    if (p->src[i] == me) to = p->dst[i];
    if (p->dst[i] == me) from = p->src[i];
  }
  size_t bytes = nb_array_nbytes(in[0]);
  if (bytes) memset(nb_array_data_mut(out[0]), 0, bytes);
  return c->ops->sendrecv(c, ctx, nb_array_data(in[0]), to, nb_array_data_mut(out[0]), from, bytes);
}

static nb_status index_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  nb_comm *c = NULL;
  nb_status s = comm_of(ctx, e, &c);
  if (!s) *(int32_t *)nb_array_data_mut(out[0]) = c->ops->rank(c);
  return s;
}

/* ------------------------------------------------------------ derivatives */

/* Every collective but pmax and axis_index is linear: its tangent is itself. */
static nb_status linear_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                            nb_val **ot) {
  ot[0] = t[0] ? nb__reemit(g, e, t) : NULL;
  return nb_graph_status(g);
}

/* The tangent at the maximum, averaged over the ranks that hold it (ties),
 * as reduce_max's JVP averages over tied positions. */
static nb_status pmax_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                          nb_val **ot) {
  ot[0] = NULL;
  if (!t[0]) return NB_OK;
  nb_loc l = e->loc;
  nb_val *at = nb_convert_at(l, nb_eq_at(l, p[0], outs[0]), p[0]->aval.dtype);
  nb_val *count = emit_like(g, e, NB_PRIM_psum, at, e->params);
  ot[0] = nb_div_at(l, emit_like(g, e, NB_PRIM_psum, nb_mul_at(l, t[0], at), e->params), count);
  return nb_graph_status(g);
}

static nb_status collective_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                      nb_val *const *ct, nb_val **ct_in) {
  ct_in[0] = NULL;
  if (!ct[0]) return NB_OK;
  nb_collective_params q = *(const nb_collective_params *)e->params;
  nb_prim back = e->prim;
  switch (e->prim) {
  case NB_PRIM_psum: back = NB_PRIM_pbroadcast; break;
  case NB_PRIM_pbroadcast: back = NB_PRIM_psum; break;
  case NB_PRIM_all_gather: back = NB_PRIM_psum_scatter; break;
  case NB_PRIM_psum_scatter: back = NB_PRIM_all_gather; break;
  case NB_PRIM_all_to_all: /* the blocks go back: split where they were concatenated */
    q.dim = q.dim2;
    q.dim2 = ((const nb_collective_params *)e->params)->dim;
    break;
  case NB_PRIM_ppermute:
    for (int i = 0; i < q.npairs; i++) {
      int s = q.src[i];
      q.src[i] = q.dst[i];
      q.dst[i] = s;
    }
    break;
  default: return nb_errorf(nb_graph_ctx(g), NB_ERR_INTERNAL, "%s has no transpose", nb__rules(e->prim)->name);
  }
  ct_in[0] = emit_like(g, e, back, ct[0], &q);
  return nb_graph_status(g);
}

/* ------------------------------------------------------------ vmap, cost, text */

/* The batch axis goes to the front; the dims the params name move by one. */
static nb_status collective_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                                  nb_val **out, int *out_bdims) {
  nb_collective_params q = *(const nb_collective_params *)e->params;
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0);
  q.dim++;
  q.dim2++;
  out[0] = emit_like(g, e, e->prim, x, &q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

/* flops: the adds of the fold; bytes: what this process sends and receives. */
static void collective_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_collective_params *p = e->params;
  double n = (double)p->axis_size;
  double in = e->nin ? (double)nb_shape_size(&e->in[0]->aval.shape) * (double)nb_dtype_size(e->in[0]->aval.dtype) : 0;
  double elems = e->nin ? (double)nb_shape_size(&e->in[0]->aval.shape) : 0;
  *flops = 0;
  *bytes = 0;
  switch (e->prim) {
  case NB_PRIM_psum:
  case NB_PRIM_pmax: *flops = elems * (n - 1); *bytes = 2 * in * (n - 1); break;
  case NB_PRIM_all_gather: *bytes = 2 * in * (n - 1); break;
  case NB_PRIM_psum_scatter: *flops = elems / n * (n - 1); *bytes = 2 * in * (n - 1) / n; break;
  case NB_PRIM_all_to_all: *bytes = 2 * in * (n - 1) / n; break;
  case NB_PRIM_ppermute: *bytes = 2 * in; break;
  default: break;
  }
}

static void collective_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_collective_params *p = e->params;
  int k = snprintf(buf, cap, "axis=%s size=%lld", p->axis, (long long)p->axis_size);
  if (k < 0 || (size_t)k >= cap) return;
  switch (e->prim) {
  case NB_PRIM_all_gather:
  case NB_PRIM_psum_scatter: snprintf(buf + k, cap - (size_t)k, " dim=%d%s", p->dim, p->tiled ? " tiled" : ""); break;
  case NB_PRIM_all_to_all: snprintf(buf + k, cap - (size_t)k, " split=%d concat=%d", p->dim, p->dim2); break;
  case NB_PRIM_ppermute:
    for (int i = 0; i < p->npairs && (size_t)k < cap; i++) {
      int w = snprintf(buf + k, cap - (size_t)k, "%s%d->%d", i ? "," : " perm=", p->src[i], p->dst[i]);
      if (w < 0) return;
      k += w;
    }
    break;
  default: break;
  }
}

#define COLLECTIVE(nm, inf, ev, jv, tr, as)                                                                        \
  const nb_prim_rules nb__prim_##nm = {.name = #nm,                                                                \
                                       .kind = NB_KIND_OTHER,                                                      \
                                       .params_size = sizeof(nb_collective_params),                                \
                                       .infer = inf,                                                               \
                                       .eval = ev,                                                                 \
                                       .jvp = jv,                                                                  \
                                       .transpose = tr,                                                            \
                                       .batch = collective_batch,                                                  \
                                       .cost = collective_cost,                                                    \
                                       .print_params = collective_print,                                           \
                                       .async = as}
COLLECTIVE(psum, reduce_infer, coll_eval, linear_jvp, collective_transpose, &coll_async);
COLLECTIVE(pmax, reduce_infer, coll_eval, pmax_jvp, NULL, &coll_async);
COLLECTIVE(pbroadcast, same_infer, coll_eval, linear_jvp, collective_transpose, NULL);
COLLECTIVE(all_gather, gather_infer, coll_eval, linear_jvp, collective_transpose, &coll_async);
COLLECTIVE(psum_scatter, scatter_infer, coll_eval, linear_jvp, collective_transpose, &coll_async);
COLLECTIVE(all_to_all, a2a_infer, a2a_eval, linear_jvp, collective_transpose, NULL);
COLLECTIVE(ppermute, same_infer, ppermute_eval, linear_jvp, collective_transpose, NULL);
COLLECTIVE(axis_index, index_infer, index_eval, NULL, NULL, NULL);

/* ------------------------------------------------------------ public ops */

/* Fills p for a collective on axis of g's context; false after recording
 * the error in g. */
static bool params_for(nb_graph *g, nb_loc loc, const char *op, const char *axis, nb_collective_params *p) {
  memset(p, 0, sizeof *p);
  if (!axis || !axis[0] || strlen(axis) >= NB_AXIS_NAME_MAX) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: axis name must have 1 to %d characters", op, NB_AXIS_NAME_MAX - 1);
    return false;
  }
  nb_comm *c = nb_ctx_axis(nb_graph_ctx(g), axis);
  if (!c) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: axis '%s' is not bound on this context (nb_ctx_bind_axis, or nb_dist_mesh_bind)",
             op, axis);
    return false;
  }
  strcpy(p->axis, axis);
  p->axis_size = c->ops->size(c);
  return true;
}

static nb_val *op1(nb_loc loc, nb_prim prim, nb_val *x, const char *axis, int dim, int dim2, bool tiled) {
  if (!x || nb__is_poison(x)) return x;
  nb_collective_params p;
  if (!params_for(x->g, loc, nb__rules(prim)->name, axis, &p)) return nb__poison(x->g);
  int r = x->aval.shape.rank;
  if (prim == NB_PRIM_all_gather && !tiled) dim = dim < 0 ? dim + r + 1 : dim; /* a new axis: rank + 1 places */
  else if (prim == NB_PRIM_all_gather || prim == NB_PRIM_psum_scatter || prim == NB_PRIM_all_to_all) {
    dim = dim < 0 ? dim + r : dim;
    dim2 = dim2 < 0 ? dim2 + r : dim2;
  }
  p.dim = dim;
  p.dim2 = dim2;
  p.tiled = tiled;
  return nb__emit1(x->g, loc, prim, 1, &x, &p, sizeof p);
}

nb_val *nb_psum_at(nb_loc loc, nb_val *x, const char *axis) { return op1(loc, NB_PRIM_psum, x, axis, 0, 0, false); }
nb_val *nb_pmax_at(nb_loc loc, nb_val *x, const char *axis) { return op1(loc, NB_PRIM_pmax, x, axis, 0, 0, false); }
nb_val *nb_pbroadcast_at(nb_loc loc, nb_val *x, const char *axis) {
  return op1(loc, NB_PRIM_pbroadcast, x, axis, 0, 0, false);
}
nb_val *nb_all_gather_at(nb_loc loc, nb_val *x, const char *axis, int dim, bool tiled) {
  return op1(loc, NB_PRIM_all_gather, x, axis, dim, 0, tiled);
}
nb_val *nb_psum_scatter_at(nb_loc loc, nb_val *x, const char *axis, int dim, bool tiled) {
  return op1(loc, NB_PRIM_psum_scatter, x, axis, dim, 0, tiled);
}
nb_val *nb_all_to_all_at(nb_loc loc, nb_val *x, const char *axis, int split_dim, int concat_dim) {
  return op1(loc, NB_PRIM_all_to_all, x, axis, split_dim, concat_dim, false);
}

nb_val *nb_pmean_at(nb_loc loc, nb_val *x, const char *axis) {
  nb_val *s = nb_psum_at(loc, x, axis);
  if (!s || nb__is_poison(s)) return s;
  if (!nb_dtype_is_float(x->aval.dtype))
    return nb__fail(x->g, loc, NB_ERR_DTYPE, "pmean: %s is not a float dtype", nb_dtype_name(x->aval.dtype));
  const nb_collective_params *p = s->def->params;
  return nb_mul_at(loc, s, nb_scalar_at(loc, x->g, x->aval.dtype, 1.0 / (double)p->axis_size));
}

nb_val *nb_ppermute_at(nb_loc loc, nb_val *x, const char *axis, int npairs, const int *src, const int *dst) {
  if (!x || nb__is_poison(x)) return x;
  nb_collective_params p;
  if (!params_for(x->g, loc, "ppermute", axis, &p)) return nb__poison(x->g);
  if (npairs < 0 || npairs > NB_PPERMUTE_MAX || (npairs && (!src || !dst)))
    return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "ppermute: %d pairs (at most %d, with src and dst)", npairs,
                    NB_PPERMUTE_MAX);
  for (int i = 0; i < npairs; i++) {
    if (src[i] < 0 || src[i] >= p.axis_size || dst[i] < 0 || dst[i] >= p.axis_size)
      return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "ppermute: pair %d (%d -> %d) outside axis '%s' of size %lld", i,
                      src[i], dst[i], axis, (long long)p.axis_size);
    for (int j = 0; j < i; j++)
      if (src[j] == src[i] || dst[j] == dst[i])
        return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "ppermute: pairs %d and %d share a %s (%d)", j, i,
                        src[j] == src[i] ? "source" : "destination", src[j] == src[i] ? src[i] : dst[i]);
    p.src[i] = src[i];
    p.dst[i] = dst[i];
  }
  p.npairs = npairs;
  return nb__emit1(x->g, loc, NB_PRIM_ppermute, 1, &x, &p, sizeof p);
}

nb_val *nb_axis_index_at(nb_loc loc, nb_graph *g, const char *axis) {
  if (!g) return NULL;
  nb_collective_params p;
  if (!params_for(g, loc, "axis_index", axis, &p)) return nb__poison(g);
  return nb__emit1(g, loc, NB_PRIM_axis_index, 0, NULL, &p, sizeof p);
}
