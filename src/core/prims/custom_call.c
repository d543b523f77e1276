/* Custom calls: host kernels registered on the context by name and used as
 * primitives. custom_call runs the kernel's eval; reverse mode differentiates
 * it through custom_call_lin, a linear stand-in whose transpose emits the
 * kernel's vjp (as JAX's custom_vjp); vmap runs the kernel once per batch item.
 * Not here: forward-mode derivatives (kernels have no jvp rule) and device
 * kernels (eval is host code). */
#include <string.h>

#include "core/internal.h"
#include "core/prims/custom_call.h"
#include "core/prims/elementwise.h"

#define MAX_IO 64 /* operands and outputs of one kernel */

/* ---------------------------------------------------------------- registry */

const nb_custom_call_entry *nb__custom_call_find(const nb_ctx *ctx, const char *name) {
  for (const nb_custom_call_entry *e = ctx ? ctx->custom_calls : NULL; e && name; e = e->next)
    if (strcmp(e->name, name) == 0) return e;
  return NULL;
}

bool nb_custom_call_registered(const nb_ctx *ctx, const char *name) { return nb__custom_call_find(ctx, name) != NULL; }

nb_status nb_custom_call_register(nb_ctx *ctx, const nb_custom_call_rules *rules) {
  if (!ctx) return NB_ERR_INVALID_ARG;
  if (!rules || !rules->name || !*rules->name)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_custom_call_register: rules with a non-empty name are required");
  if (!rules->infer || !rules->eval)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_custom_call_register: custom call '%s' needs infer and eval rules", rules->name);
  if (nb__custom_call_find(ctx, rules->name))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_custom_call_register: custom call '%s' is already registered", rules->name);
  nb_custom_call_entry *e = nb_calloc(ctx, sizeof *e);
  char *name = e ? nb_strdup(ctx, rules->name) : NULL;
  if (!name) {
    nb_dealloc(ctx, e, sizeof *e);
    return NB_ERR_NOMEM;
  }
  e->rules = *rules;
  e->rules.name = e->name = name;
  e->next = ctx->custom_calls;
  ctx->custom_calls = e;
  return NB_OK;
}

/* ---------------------------------------------------------------- shape rules */

static const nb_custom_call_params *P(const nb_eqn *e) { return e->params; }
static const void *attrs_of(const nb_custom_call_params *p) { return p->attrs ? nb_array_data(p->attrs) : NULL; }
/* Does output i update operand i in place (rules.in_place)? */
static bool updates(const nb_custom_call_params *p, int i) { return i < 64 && (p->entry->rules.in_place >> i & 1u); }

static nb_aval strip_batch(nb_aval a) {
  nb_aval r = nb_aval_make(a.dtype, a.shape.rank - 1, a.shape.dims + 1);
  return r;
}

/* The kernel's output avals for per-item operand avals, checked. */
static nb_status kernel_infer(const nb_custom_call_params *p, const nb_aval *in, nb_aval *out, char *why, size_t cap) {
  const nb_custom_call_rules *r = &p->entry->rules;
  memset(out, 0, sizeof(nb_aval) * (size_t)p->nout);
  nb_status st = r->infer(r->ud, p->nin, in, attrs_of(p), p->attrs_size, p->nout, out);
  if (st != NB_OK)
    return snprintf(why, cap, "custom call '%s' refused its operands (its infer rule returned %s)", r->name,
                    nb_status_name(st)), st;
  int max_rank = NB_MAX_RANK - (p->batch > 0);
  for (int i = 0; i < p->nout; i++) {
    bool ok = out[i].dtype >= 0 && out[i].dtype < NB_DTYPE_COUNT && out[i].shape.rank >= 0 && out[i].shape.rank <= max_rank;
    for (int d = 0; ok && d < out[i].shape.rank; d++) ok = out[i].shape.dims[d] >= 0;
    if (!ok) return snprintf(why, cap, "custom call '%s': its infer rule made an invalid aval for output %d", r->name, i), NB_ERR_INVALID_ARG;
    out[i] = nb_aval_make(out[i].dtype, out[i].shape.rank, out[i].shape.dims); /* zero the unused dims */
    if (updates(p, i) && (i >= p->nin || !nb_aval_equal(&out[i], &in[i])))
      return snprintf(why, cap, "custom call '%s': output %d updates operand %d in place but %s", r->name, i, i,
                      i >= p->nin ? "there is no such operand" : "its infer rule gave it another aval"), NB_ERR_INVALID_ARG;
  }
  if (p->nout < 64 && (r->in_place >> p->nout))
    return snprintf(why, cap, "custom call '%s': in_place names an output beyond its %d", r->name, p->nout), NB_ERR_INVALID_ARG;
  return NB_OK;
}

/* Per-item avals of n operands: the batch axis checked and removed. */
static nb_status item_avals(const nb_custom_call_params *p, int n, const nb_aval *in, nb_aval *items, char *why, size_t cap) {
  for (int i = 0; i < n; i++) {
    if (!p->batch) {
      items[i] = in[i];
    } else if (in[i].shape.rank < 1 || in[i].shape.dims[0] != p->batch) {
      return snprintf(why, cap, "operand %d lacks the batch axis of size %lld", i, (long long)p->batch), NB_ERR_SHAPE;
    } else {
      items[i] = strip_batch(in[i]);
    }
  }
  return NB_OK;
}

static void add_batch(const nb_custom_call_params *p, int n, nb_aval *out) {
  for (int i = 0; p->batch && i < n; i++) {
    nb_aval a = out[i];
    a.shape.rank++;
    memmove(a.shape.dims + 1, out[i].shape.dims, sizeof(int64_t) * (size_t)out[i].shape.rank);
    a.shape.dims[0] = p->batch;
    out[i] = a;
  }
}

static nb_status call_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  const nb_custom_call_params *p = params;
  nb_aval items[MAX_IO];
  *nout = p->nout;
  if (nin != p->nin) return snprintf(why, cap, "custom call '%s' takes %d operands here, got %d", p->entry->name, p->nin, nin), NB_ERR_INVALID_ARG;
  nb_status st = item_avals(p, nin, in, items, why, cap);
  if (st == NB_OK) st = kernel_infer(p, items, out, why, cap);
  if (st == NB_OK) add_batch(p, p->nout, out);
  return st;
}

static int count_float(int n, const nb_aval *a) {
  int k = 0;
  for (int i = 0; i < n; i++) k += nb_dtype_is_float(a[i].dtype);
  return k;
}

/* custom_call_lin: the call's primals, then a tangent for each float primal;
 * outputs the tangents of the call's float outputs. */
static nb_status lin_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  const nb_custom_call_params *p = params;
  int n = p->nin;
  if (nin < n || nin != n + count_float(n, in))
    return snprintf(why, cap, "custom call '%s': the linearized call takes %d primals and their float tangents, got %d operands",
                    p->entry->name, n, nin), NB_ERR_INVALID_ARG;
  for (int i = 0, k = n; i < n; i++)
    if (nb_dtype_is_float(in[i].dtype) && !nb_aval_equal(&in[i], &in[k++]))
      return snprintf(why, cap, "tangent of operand %d does not match it", i), NB_ERR_SHAPE;
  int no = 0;
  nb_status st = call_infer(params, n, in, &no, out, why, cap);
  int nf = 0;
  for (int i = 0; st == NB_OK && i < no; i++)
    if (nb_dtype_is_float(out[i].dtype)) out[nf++] = out[i];
  *nout = nf;
  return st;
}

/* ---------------------------------------------------------------- evaluation */

/* Runs the kernel on one item: out[] holds fresh arrays of the item avals,
 * which the kernel fills or replaces (releasing them). */
static nb_status run_kernel(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out, const nb_aval *want) {
  const nb_custom_call_params *p = P(e);
  const nb_custom_call_rules *r = &p->entry->rules;
  nb_status st = r->eval(r->ud, ctx, p->nin, in, attrs_of(p), p->attrs_size, p->nout, out);
  if (st != NB_OK) {
    if (nb_ctx_status(ctx) == NB_OK)
      nb_errorf(ctx, st, "custom call '%s' failed: its eval returned %s (traced at %s:%d)", r->name, nb_status_name(st),
                e->loc.file ? e->loc.file : "?", e->loc.line);
    return st;
  }
  for (int i = 0; i < p->nout; i++) {
    nb_aval got = out[i] ? nb_array_aval(out[i]) : nb_aval_make(NB_F32, 0, NULL);
    if (out[i] && nb_aval_equal(&got, &want[i]) && nb_array_device(out[i]).kind == NB_DEVICE_CPU) continue;
    char a[128], b[128];
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "custom call '%s': eval made %s for output %d, its infer rule said %s", r->name,
                     out[i] ? nb_aval_str(&got, a, sizeof a) : "nothing", i, nb_aval_str(&want[i], b, sizeof b));
  }
  return NB_OK;
}

/* Item b of a batched array, copied (kernels may keep references). */
static nb_array *item(nb_ctx *ctx, const nb_array *a, int64_t b) {
  nb_aval s = strip_batch(nb_array_aval(a));
  size_t bytes = (size_t)nb_shape_size(&s.shape) * nb_dtype_size(s.dtype);
  return nb_array_create(ctx, s.dtype, s.shape.rank, s.shape.dims, (const char *)nb_array_data(a) + (size_t)b * bytes);
}

/* The batched call: the kernel once per item, results copied into out. */
static nb_status run_batched(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_custom_call_params *p = P(e);
  nb_array *ins[MAX_IO] = {NULL}, *outs[MAX_IO] = {NULL};
  nb_aval want[MAX_IO];
  for (int i = 0; i < p->nout; i++) want[i] = strip_batch(nb_array_aval(out[i]));
  nb_status st = NB_OK;
  for (int64_t b = 0; st == NB_OK && b < p->batch; b++) {
    for (int i = 0; st == NB_OK && i < p->nin; i++)
      if (!(ins[i] = item(ctx, in[i], b))) st = NB_ERR_NOMEM;
    for (int i = 0; st == NB_OK && i < p->nout; i++)
      if (!(outs[i] = updates(p, i) ? item(ctx, in[i], b) : nb_array_empty(ctx, want[i].dtype, want[i].shape.rank, want[i].shape.dims)))
        st = NB_ERR_NOMEM;
    if (st == NB_OK) st = run_kernel(ctx, e, ins, outs, want);
    for (int i = 0; st == NB_OK && i < p->nout; i++) {
      size_t n = nb_array_nbytes(outs[i]);
      memcpy((char *)nb_array_data_mut(out[i]) + (size_t)b * n, nb_array_data(outs[i]), n);
    }
    for (int i = 0; i < MAX_IO; i++) {
      nb_array_release(ins[i]);
      nb_array_release(outs[i]);
      ins[i] = outs[i] = NULL;
    }
  }
  return st;
}

/* The kernel writes fresh arrays (it may replace them), copied into out:
 * executors hand eval views of their own buffers, which must be filled in place.
 * An output that updates its operand is handed to the kernel itself, holding
 * the operand's contents: already there when a compiler planned it in the
 * operand's memory (equal pointers), else copied here. */
static nb_status call_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_custom_call_params *p = P(e);
  if (p->batch) return run_batched(ctx, e, in, out);
  nb_aval want[MAX_IO];
  nb_array *fresh[MAX_IO] = {NULL};
  nb_status st = NB_OK;
  for (int i = 0; st == NB_OK && i < e->nout; i++) {
    want[i] = e->out[i]->aval;
    if (updates(p, i)) {
      if (nb_array_data(out[i]) != nb_array_data(in[i])) memcpy(nb_array_data_mut(out[i]), nb_array_data(in[i]), nb_array_nbytes(in[i]));
      nb_array_retain(fresh[i] = out[i]);
    } else if (!(fresh[i] = nb_array_empty(ctx, want[i].dtype, want[i].shape.rank, want[i].shape.dims))) {
      st = NB_ERR_NOMEM;
    }
  }
  if (st == NB_OK) st = run_kernel(ctx, e, in, fresh, want);
  for (int i = 0; st == NB_OK && i < e->nout; i++)
    if (fresh[i] != out[i]) memcpy(nb_array_data_mut(out[i]), nb_array_data(fresh[i]), nb_array_nbytes(fresh[i]));
  for (int i = 0; i < e->nout; i++) nb_array_release(fresh[i]);
  return st;
}

/* For the compiler (nb_prim_rules.in_place_operand). */
static int call_in_place_operand(const nb_eqn *e, int out) { return updates(P(e), out) ? out : -1; }

static nb_status lin_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                   "custom call '%s' has no forward-mode rule (only a vjp): differentiate it with grad or vjp, not jvp "
                   "(traced at %s:%d)", P(e)->entry->name, e->loc.file ? e->loc.file : "?", e->loc.line);
}

/* ---------------------------------------------------------------- derivatives */

static nb_status call_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                          nb_val **ot) {
  const nb_custom_call_params *cp = P(e);
  if (!cp->entry->rules.vjp)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "custom call '%s' cannot be differentiated: it was registered without a vjp rule",
                    cp->entry->name), NB_ERR_UNIMPLEMENTED;
  nb_val *ops[2 * MAX_IO], *lo[MAX_IO];
  int n = 0;
  for (int i = 0; i < e->nin; i++) ops[n++] = p[i];
  for (int i = 0; i < e->nin; i++)
    if (nb_dtype_is_float(e->in[i]->aval.dtype)) ops[n++] = t[i] ? t[i] : nb__zeros(g, e->in[i]->aval);
  nb__emit(g, e->loc, NB_PRIM_custom_call_lin, n, ops, e->params, e->params_size, NULL, lo);
  for (int i = 0, k = 0; !nb_graph_status(g) && i < e->nout; i++) ot[i] = nb_dtype_is_float(e->out[i]->aval.dtype) ? lo[k++] : NULL;
  return nb_graph_status(g);
}

static nb_status lin_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs, nb_val **ot) {
  return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "custom call '%s' has no forward-mode rule (only a vjp): higher-order "
                  "forward mode over it is not supported", P(e)->entry->name), NB_ERR_UNIMPLEMENTED;
}

/* Checks the cotangents a vjp made (NULL = zero) against the primals. */
static nb_status check_cotangents(nb_graph *g, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                  nb_val *const *in_ct) {
  for (int i = 0; i < p->nin && !nb_graph_status(g); i++) {
    if (!in_ct[i] || !nb_dtype_is_float(primals[i]->aval.dtype)) continue;
    if (in_ct[i]->g != g || !nb_aval_equal(&in_ct[i]->aval, &primals[i]->aval)) {
      char a[128], b[128];
      nb__fail(g, loc, NB_ERR_SHAPE, "custom call '%s': its vjp made a %s cotangent for operand %d of %s", p->entry->name,
               in_ct[i]->g == g ? nb_aval_str(&in_ct[i]->aval, a, sizeof a) : "foreign", i,
               nb_aval_str(&primals[i]->aval, b, sizeof b));
    }
  }
  return nb_graph_status(g);
}

/* The kernel's vjp on one unbatched call, emitted into g. */
static nb_status emit_vjp_direct(nb_graph *g, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                 nb_val *const *out_ct, nb_val **in_ct) {
  const nb_custom_call_rules *r = &p->entry->rules;
  nb_val *outs[MAX_IO];
  nb__emit(g, loc, NB_PRIM_custom_call, p->nin, primals, p, sizeof *p, NULL, outs); /* the forward call, hash-consed */
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int i = 0; i < p->nin; i++) in_ct[i] = NULL;
  nb_status st = r->vjp(r->ud, g, p->nin, primals, p->nout, outs, out_ct, attrs_of(p), p->attrs_size, in_ct);
  if (st != NB_OK && !nb_graph_status(g))
    nb__fail(g, loc, st, "custom call '%s': its vjp returned %s", r->name, nb_status_name(st));
  return check_cotangents(g, loc, p, primals, in_ct);
}

/* Per-item vjp of a batched call as a graph: inputs "in<i>" (the primals)
 * and "ct<j>" (float outputs), outputs "grad<i>" (float primals). */
static nb_graph *item_vjp_graph(nb_ctx *ctx, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                nb_val *const *out_ct) {
  nb_custom_call_params q = *p;
  q.batch = 0;
  nb_graph *ig = nb_graph_create(ctx);
  if (!ig) return NULL;
  nb_val *in[MAX_IO], *ct[MAX_IO] = {NULL}, *grads[MAX_IO];
  char path[32];
  for (int i = 0; i < p->nin; i++) {
    snprintf(path, sizeof path, "in%d", i);
    in[i] = nb_graph_input(ig, path, strip_batch(primals[i]->aval));
  }
  for (int j = 0; j < p->nout; j++) {
    if (!out_ct[j]) continue;
    snprintf(path, sizeof path, "ct%d", j);
    ct[j] = nb_graph_input(ig, path, strip_batch(out_ct[j]->aval));
  }
  if (!nb_graph_status(ig)) emit_vjp_direct(ig, loc, &q, in, ct, grads);
  for (int i = 0; i < p->nin && !nb_graph_status(ig); i++) {
    if (!nb_dtype_is_float(in[i]->aval.dtype)) continue;
    snprintf(path, sizeof path, "grad%d", i);
    nb_graph_output(ig, path, grads[i] ? grads[i] : nb__zeros(ig, in[i]->aval));
  }
  if (nb_graph_status(ig)) {
    nb_graph_destroy(ig);
    return NULL;
  }
  return ig;
}

/* A batched call's vjp: the per-item vjp graph, vmapped and inlined. */
static nb_status emit_vjp_batched(nb_graph *g, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                  nb_val *const *out_ct, nb_val **in_ct) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_graph *ig = item_vjp_graph(ctx, loc, p, primals, out_ct), *vg = NULL;
  int zeros[2 * MAX_IO] = {0};
  if (ig) vg = nb__vmap_graph(ctx, ig, zeros, p->batch, 0);
  if (!vg) {
    nb_graph_destroy(ig);
    return nb__fail(g, loc, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM, "custom call '%s': batched vjp: %s",
                    p->entry->name, nb_ctx_error(ctx)), nb_graph_status(g);
  }
  nb_val *map_in[2 * MAX_IO], *map_out[MAX_IO];
  int n = 0;
  for (int i = 0; i < p->nin; i++) map_in[n++] = primals[i];
  for (int j = 0; j < p->nout; j++)
    if (out_ct[j]) map_in[n++] = out_ct[j];
  nb_status st = nb__graph_inline(g, vg, map_in, map_out);
  for (int i = 0, k = 0; st == NB_OK && i < p->nin; i++) in_ct[i] = nb_dtype_is_float(primals[i]->aval.dtype) ? map_out[k++] : NULL;
  nb_graph_destroy(vg);
  nb_graph_destroy(ig);
  return st ? st : nb_graph_status(g);
}

nb_status nb__custom_call_emit_vjp(nb_graph *g, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                   nb_val *const *out_ct, nb_val **in_ct) {
  if (!p->entry->rules.vjp)
    return nb__fail(g, loc, NB_ERR_UNIMPLEMENTED, "custom call '%s' has no vjp rule", p->entry->name), NB_ERR_UNIMPLEMENTED;
  return p->batch ? emit_vjp_batched(g, loc, p, primals, out_ct, in_ct) : emit_vjp_direct(g, loc, p, primals, out_ct, in_ct);
}

static nb_status lin_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct_out,
                               nb_val **ct_in) {
  const nb_custom_call_params *p = P(e);
  nb_val *out_ct[MAX_IO], *in_ct[MAX_IO], *outs[MAX_IO];
  for (int i = 0; i < p->nin; i++)
    if (linear[i]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "custom_call_lin: primal operand %d is linear", i), NB_ERR_INTERNAL;
  /* the call's output avals, to zero-fill the float outputs without a cotangent */
  nb__emit(g, e->loc, NB_PRIM_custom_call, p->nin, in, p, sizeof *p, NULL, outs);
  for (int j = 0, k = 0; !nb_graph_status(g) && j < p->nout; j++) {
    out_ct[j] = NULL;
    if (nb_dtype_is_float(outs[j]->aval.dtype)) {
      out_ct[j] = ct_out[k] ? ct_out[k] : nb__zeros(g, outs[j]->aval);
      k++;
    }
  }
  if (nb_graph_status(g) || nb__custom_call_emit_vjp(g, e->loc, p, in, out_ct, in_ct)) return nb_graph_status(g);
  for (int i = 0, k = p->nin; i < p->nin; i++)
    if (nb_dtype_is_float(in[i]->aval.dtype)) ct_in[k++] = in_ct[i];
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- vmap, cost, params */

/* Every operand to a leading batch axis; an already batched call folds the
 * new axis into its own (n * batch items) and unfolds the outputs. */
static nb_status call_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                            int *out_bdims) {
  nb_custom_call_params q = *P(e);
  int64_t b0 = q.batch, dims[NB_MAX_RANK];
  if (b0 && n > INT64_MAX / b0) return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of custom call: batch too large"), NB_ERR_SHAPE;
  q.batch = b0 ? n * b0 : n;
  nb_val *ops[2 * MAX_IO], *outs[MAX_IO];
  for (int i = 0; i < e->nin; i++) {
    ops[i] = nb__batch_to_front(e->loc, in[i], bdims[i], n);
    if (b0 && !nb_graph_status(g)) {
      nb_shape s = ops[i]->aval.shape;
      dims[0] = q.batch;
      memcpy(dims + 1, s.dims + 2, sizeof(int64_t) * (size_t)(s.rank - 2));
      ops[i] = nb_reshape_at(e->loc, ops[i], s.rank - 1, dims);
    }
  }
  if (!nb_graph_status(g)) nb__emit(g, e->loc, e->prim, e->nin, ops, &q, sizeof q, NULL, outs);
  for (int i = 0; !nb_graph_status(g) && i < e->nout; i++) {
    out[i] = outs[i];
    out_bdims[i] = 0;
    if (!b0) continue;
    nb_shape s = outs[i]->aval.shape;
    if (s.rank + 1 > NB_MAX_RANK) return nb__fail(g, e->loc, NB_ERR_SHAPE, "vmap of custom call: rank too large"), NB_ERR_SHAPE;
    dims[0] = n;
    dims[1] = b0;
    memcpy(dims + 2, s.dims + 1, sizeof(int64_t) * (size_t)(s.rank - 1));
    out[i] = nb_reshape_at(e->loc, outs[i], s.rank + 1, dims);
  }
  return nb_graph_status(g);
}

static void call_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_custom_call_params *p = P(e);
  double items = p->batch ? (double)p->batch : 1, b = 0;
  for (int i = 0; i < e->nin; i++) b += (double)nb_shape_size(&e->in[i]->aval.shape) * (double)nb_dtype_size(e->in[i]->aval.dtype);
  for (int i = 0; i < e->nout; i++) b += (double)nb_shape_size(&e->out[i]->aval.shape) * (double)nb_dtype_size(e->out[i]->aval.dtype);
  *flops = 0;
  *bytes = b;
  const nb_custom_call_rules *r = &p->entry->rules;
  if (!r->cost || e->prim != NB_PRIM_custom_call) return;
  nb_aval avals[MAX_IO];
  for (int i = 0; i < p->nin; i++) avals[i] = p->batch ? strip_batch(e->in[i]->aval) : e->in[i]->aval;
  double f = 0, kb = 0;
  r->cost(r->ud, p->nin, avals, attrs_of(p), p->attrs_size, &f, &kb);
  *flops = f * items;
  *bytes = kb * items;
}

static uint64_t params_hash(const void *params, size_t size) {
  const nb_custom_call_params *p = params;
  uint64_t h = nb__hash_bytes(&p->entry, sizeof p->entry, 13);
  int64_t ints[3] = {p->nin, p->nout, p->batch};
  h = nb__hash_combine(h, nb__hash_bytes(ints, sizeof ints, 17));
  return nb__hash_combine(h, nb__hash_bytes(attrs_of(p), p->attrs_size, p->attrs_size));
}

static bool params_equal(const void *a, const void *b, size_t size) {
  const nb_custom_call_params *x = a, *y = b;
  return x->entry == y->entry && x->nin == y->nin && x->nout == y->nout && x->batch == y->batch &&
         x->attrs_size == y->attrs_size && (x->attrs_size == 0 || memcmp(attrs_of(x), attrs_of(y), x->attrs_size) == 0);
}

static nb_status params_hold(nb_graph *g, const void *params) {
  const nb_custom_call_params *p = params;
  return p->attrs ? nb__graph_hold_array(g, p->attrs) : NB_OK;
}

static void params_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_custom_call_params *p = P(e);
  int k = snprintf(buf, cap, "%s", p->entry->name);
  if (p->batch && k >= 0 && (size_t)k < cap) k += snprintf(buf + k, cap - (size_t)k, " batch=%lld", (long long)p->batch);
  if (p->attrs_size && k >= 0 && (size_t)k < cap)
    snprintf(buf + k, cap - (size_t)k, " attrs=%zuB#%08llx", p->attrs_size,
             (unsigned long long)(nb__hash_bytes(attrs_of(p), p->attrs_size, 0) & 0xffffffffu));
}

const nb_prim_rules nb__prim_custom_call = {
    .name = "custom_call",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_custom_call_params),
    .infer = call_infer,
    .eval = call_eval,
    .in_place_operand = call_in_place_operand,
    .jvp = call_jvp,
    .batch = call_batch,
    .cost = call_cost,
    .print_params = params_print,
    .hash_params = params_hash,
    .params_equal = params_equal,
    .hold_params = params_hold,
};

const nb_prim_rules nb__prim_custom_call_lin = {
    .name = "custom_call_lin",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_custom_call_params),
    .infer = lin_infer,
    .eval = lin_eval,
    .jvp = lin_jvp,
    .transpose = lin_transpose,
    .batch = call_batch,
    .cost = call_cost,
    .print_params = params_print,
    .hash_params = params_hash,
    .params_equal = params_equal,
    .hold_params = params_hold,
};

/* ---------------------------------------------------------------- public */

static nb_val *fail_outputs(nb_graph *g, int nout, nb_val **out) {
  for (int i = 0; out && i < nout && i < MAX_IO; i++) out[i] = nb__poison(g);
  return nb__poison(g);
}

nb_val *nb_custom_call_at(nb_loc loc, nb_graph *g, const char *name, int nin, nb_val *const *in, const void *attrs,
                          size_t attrs_size, int nout, nb_val **out) {
  if (!g) return NULL;
  if (nb_graph_status(g)) return fail_outputs(g, nout, out);
  const nb_custom_call_entry *entry = nb__custom_call_find(nb_graph_ctx(g), name);
  if (!name) nb__fail(g, loc, NB_ERR_INVALID_ARG, "custom_call: NULL name");
  else if (!entry)
    nb__fail(g, loc, NB_ERR_NOT_FOUND, "custom call '%s' is not registered on this context (nb_custom_call_register)", name);
  else if (nin < 0 || nin > MAX_IO || (nin && !in) || nout < 1 || nout > MAX_IO)
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "custom call '%s': needs 0 to %d operands and 1 to %d outputs, got %d and %d", name,
             MAX_IO, MAX_IO, nin, nout);
  else if (attrs_size && !attrs) nb__fail(g, loc, NB_ERR_INVALID_ARG, "custom call '%s': NULL attrs of %zu bytes", name, attrs_size);
  if (nb_graph_status(g)) return fail_outputs(g, nout, out);

  nb_custom_call_params p;
  memset(&p, 0, sizeof p);
  p.entry = entry;
  p.attrs_size = attrs_size;
  p.nin = nin;
  p.nout = nout;
  int64_t n = (int64_t)attrs_size;
  if (attrs_size && !(p.attrs = nb_array_create(nb_graph_ctx(g), NB_U8, 1, &n, attrs)))
    return nb__fail(g, loc, NB_ERR_NOMEM, "custom call '%s': out of memory", name), fail_outputs(g, nout, out);
  nb_val *outs[MAX_IO];
  nb__emit(g, loc, NB_PRIM_custom_call, nin, in, &p, sizeof p, NULL, outs);
  nb_array_release(p.attrs); /* the equation holds its own reference */
  if (nb_graph_status(g)) return fail_outputs(g, nout, out);
  for (int i = 0; out && i < nout; i++) out[i] = outs[i];
  return outs[0];
}
