/* Higher-order primitives that carry graphs: remat_call (recompute the region
 * in the backward pass), custom_vjp_call (a user-supplied backward pass),
 * their linearized forms remat_lin / custom_lin that reverse mode transposes,
 * and barrier, an identity the hash-consing never merges (it keeps the
 * recomputed forward pass of a remat region from being shared with the
 * stored one). */
#include <stdatomic.h>
#include <string.h>

#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- barrier */

static nb_status barrier_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  *nout = nin;
  for (int i = 0; i < nin; i++) out[i] = in[i];
  return NB_OK;
}

static nb_status barrier_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  for (int i = 0; i < e->nin; i++) memcpy(nb_array_data_mut(out[i]), nb_array_data(in[i]), nb_array_nbytes(in[i]));
  return NB_OK;
}

static nb_status barrier_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                             nb_val **ot) {
  for (int i = 0; i < e->nin; i++) ot[i] = t[i];
  return NB_OK;
}

static nb_status barrier_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                               nb_val **out, int *out_bdims) {
  nb__emit(g, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, out);
  for (int i = 0; i < e->nin; i++) out_bdims[i] = bdims[i];
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_barrier = {
    .name = "barrier",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_barrier_params),
    .infer = barrier_infer,
    .eval = barrier_eval,
    .jvp = barrier_jvp,
    .batch = barrier_batch,
    .impure = true,
};

/* One barrier over all of vals (in place). */
static void barrier_all(nb_graph *g, nb_loc loc, int n, nb_val **vals) {
  static _Atomic uint64_t nonce;
  nb_barrier_params p = {atomic_fetch_add(&nonce, 1) + 1};
  nb_val *outs[256];
  if (n == 0 || n > 256) return; /* more than 256 operands: left unguarded (only costs recomputation sharing) */
  nb__emit(g, loc, NB_PRIM_barrier, n, vals, &p, sizeof p, NULL, outs);
  if (!nb_graph_status(g)) memcpy(vals, outs, sizeof(nb_val *) * (size_t)n);
}

nb_status nb_optimization_barrier_at(nb_loc loc, int n, nb_val **vals) {
  if (n < 0 || n > 256 || (n && !vals)) return NB_ERR_INVALID_ARG;
  nb_graph *g = n ? nb__graph_of(loc, n, vals) : NULL;
  if (!g) return n ? NB_ERR_INVALID_ARG : NB_OK;
  barrier_all(g, loc, n, vals);
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- shared helpers */

static nb_status sig_infer(const nb_graph *body, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  if ((size_t)nin != nb_graph_num_inputs(body))
    return snprintf(why, cap, "the called graph takes %zu inputs, got %d", nb_graph_num_inputs(body), nin), NB_ERR_INVALID_ARG;
  for (int i = 0; i < nin; i++) {
    nb_aval want = nb__graph_input(body, (size_t)i)->aval;
    if (!nb_aval_equal(&want, &in[i])) {
      char a[128];
      return snprintf(why, cap, "input '%s' must be %s", nb_graph_input_path(body, (size_t)i), nb_aval_str(&want, a, sizeof a)),
             NB_ERR_SHAPE;
    }
  }
  *nout = (int)nb_graph_num_outputs(body);
  for (int i = 0; i < *nout; i++) out[i] = nb__graph_output(body, (size_t)i)->aval;
  return NB_OK;
}

/* Runs graph on in[], copying selected outputs [first, first + nout) into out[]. */
static nb_status run_into(nb_ctx *ctx, const nb_graph *graph, nb_array *const *in, size_t first, int nout, nb_array **out) {
  size_t n = nb_graph_num_outputs(graph);
  nb_array **res = nb_calloc(ctx, (n + 1) * sizeof(nb_array *));
  if (!res) return NB_ERR_NOMEM;
  nb_status st = nb_graph_run_flat(ctx, graph, in, res);
  for (int i = 0; st == NB_OK && i < nout; i++)
    memcpy(nb_array_data_mut(out[i]), nb_array_data(res[first + (size_t)i]), nb_array_nbytes(out[i]));
  for (size_t i = 0; i < n; i++) nb_array_release(res[i]);
  nb_dealloc(ctx, res, (n + 1) * sizeof(nb_array *));
  return st;
}

static size_t count_float_inputs(const nb_graph *g) {
  size_t n = 0;
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) n += nb_dtype_is_float(nb__graph_input(g, i)->aval.dtype);
  return n;
}

/* Tangent operands of the float inputs (zeros for symbolic zeros), appended
 * after the primals in ops; returns the operand count. */
static int lin_operands(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val **ops) {
  int n = 0;
  for (int i = 0; i < e->nin; i++) ops[n++] = p[i];
  for (int i = 0; i < e->nin; i++)
    if (nb_dtype_is_float(e->in[i]->aval.dtype)) ops[n++] = t[i] ? t[i] : nb__zeros(g, e->in[i]->aval);
  return n;
}

/* Scatters the lin primitive's outputs (float outputs only) to ot[]. */
static void lin_outputs(const nb_eqn *e, nb_val *const *lin_out, nb_val **ot) {
  for (int i = 0, k = 0; i < e->nout; i++) ot[i] = nb_dtype_is_float(e->out[i]->aval.dtype) ? lin_out[k++] : NULL;
}

static nb_status lin_infer_outputs(const nb_graph *body, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                   size_t cap) {
  size_t np = nb_graph_num_inputs(body), nf = count_float_inputs(body);
  if ((size_t)nin != np + nf) return snprintf(why, cap, "takes %zu operands, got %d", np + nf, nin), NB_ERR_INVALID_ARG;
  int no = 0;
  nb_status st = sig_infer(body, (int)np, in, &no, out, why, cap);
  if (st) return st;
  for (size_t i = 0, k = np; i < np; i++)
    if (nb_dtype_is_float(in[i].dtype) && !nb_aval_equal(&in[i], &in[k++]))
      return snprintf(why, cap, "tangent %zu does not match its primal", i), NB_ERR_SHAPE;
  int nfo = 0;
  for (int i = 0; i < no; i++)
    if (nb_dtype_is_float(out[i].dtype)) out[nfo++] = out[i];
  *nout = nfo;
  return NB_OK;
}

/* Batching for the graph-carrying primitives: every operand to axis 0, the
 * carried graphs vmapped with all inputs batched at 0. */
static nb_status batch_graphs(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                              const nb_graph **graphs, int ngraphs, nb_val **out, int *out_bdims) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_val *ops[512];
  if (e->nin > 512) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "vmap of a call with more than 512 operands"), NB_ERR_UNIMPLEMENTED;
  for (int i = 0; i < e->nin; i++) ops[i] = nb__batch_to_front(e->loc, in[i], bdims[i], n);
  /* both params structs are a pair of graph pointers (checked below) */
  _Static_assert(sizeof(nb_remat_params) == 2 * sizeof(nb_graph *) && sizeof(nb_custom_vjp_params) == 2 * sizeof(nb_graph *),
                 "graph-carrying params are pairs of graphs");
  struct { const nb_graph *g[2]; } pair;
  memcpy(&pair, e->params, sizeof pair);
  nb_graph *made[2] = {NULL, NULL};
  for (int k = 0; k < ngraphs; k++) {
    if (!graphs[k]) continue;
    size_t gn = nb_graph_num_inputs(graphs[k]);
    int *zeros = nb_calloc(ctx, (gn + 1) * sizeof(int));
    made[k] = zeros ? nb__vmap_graph(ctx, graphs[k], zeros, n, 0) : NULL;
    nb_dealloc(ctx, zeros, (gn + 1) * sizeof(int));
    if (!made[k]) {
      nb__fail(g, e->loc, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM, "vmap of %s: %s", nb__rules(e->prim)->name, nb_ctx_error(ctx));
      break;
    }
    pair.g[k] = made[k];
  }
  if (!nb_graph_status(g)) nb__emit(g, e->loc, e->prim, e->nin, ops, &pair, sizeof pair, NULL, out);
  for (int k = 0; k < ngraphs; k++) nb_graph_destroy(made[k]); /* the new equation holds them */
  for (int i = 0; i < e->nout; i++) out_bdims[i] = 0;
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- remat */

static nb_status remat_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  return sig_infer(((const nb_remat_params *)params)->body, nin, in, nout, out, why, cap);
}

static nb_status remat_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  return run_into(ctx, ((const nb_remat_params *)e->params)->body, in, 0, e->nout, out);
}

static nb_status remat_hold(nb_graph *g, const void *params) {
  const nb_remat_params *p = params;
  nb_status st = nb__graph_hold_graph(g, p->body);
  return st || !p->jvp ? st : nb__graph_hold_graph(g, p->jvp);
}

static nb_status remat_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                           nb_val **ot) {
  const nb_remat_params *rp = e->params;
  nb_graph *lin = nb__jvp_graph(nb_graph_ctx(g), rp->body);
  if (!lin) return nb__fail(g, e->loc, nb_ctx_status(nb_graph_ctx(g)), "remat: %s", nb_ctx_error(nb_graph_ctx(g))), nb_graph_status(g);
  nb_remat_params lp = {rp->body, lin};
  nb_val *ops[512], *lo[256];
  if (2 * e->nin > 512) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "remat region with more than 256 inputs"), NB_ERR_UNIMPLEMENTED;
  int n = lin_operands(g, e, p, t, ops);
  nb__emit(g, e->loc, NB_PRIM_remat_lin, n, ops, &lp, sizeof lp, NULL, lo);
  nb_graph_destroy(lin); /* held by the equation */
  if (!nb_graph_status(g)) lin_outputs(e, lo, ot);
  return nb_graph_status(g);
}

static nb_status remat_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                             int *out_bdims) {
  const nb_remat_params *rp = e->params;
  const nb_graph *graphs[2] = {rp->body, rp->jvp};
  return batch_graphs(g, e, in, bdims, n, graphs, 2, out, out_bdims);
}

static void remat_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_remat_params *p = e->params;
  size_t n = (size_t)nb__print_graph_param(buf, cap, "body", p->body);
  if (p->jvp && n < cap) nb__print_graph_param(buf + n, cap - n, " jvp", p->jvp);
}

static void cvjp_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_custom_vjp_params *p = e->params;
  size_t n = (size_t)nb__print_graph_param(buf, cap, "fwd", p->fwd);
  if (n < cap) nb__print_graph_param(buf + n, cap - n, " bwd", p->bwd);
}

static void call_cost(const nb_eqn *e, double *flops, double *bytes) {
  nb_graph_cost(((const nb_remat_params *)e->params)->body, flops, bytes);
}

const nb_prim_rules nb__prim_remat_call = {
    .name = "remat_call",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_remat_params),
    .print_params = remat_print,
    .infer = remat_infer,
    .eval = remat_eval,
    .jvp = remat_jvp,
    .batch = remat_batch,
    .cost = call_cost,
    .hold_params = remat_hold,
};

static nb_status remat_lin_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                 size_t cap) {
  return lin_infer_outputs(((const nb_remat_params *)params)->body, nin, in, nout, out, why, cap);
}

/* Runs jvp(body) and keeps its tangent outputs (they follow the primal ones). */
static nb_status remat_lin_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_remat_params *rp = e->params;
  return run_into(ctx, rp->jvp, in, nb_graph_num_outputs(rp->body), e->nout, out);
}

/* The backward pass of a remat region: recompute the body from its (barrier-
 * guarded) inputs and back-propagate through it, here, in the backward pass. */
static nb_status remat_lin_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                     nb_val *const *ct_out, nb_val **ct_in) {
  const nb_remat_params *rp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  size_t np = nb_graph_num_inputs(rp->body), no = nb_graph_num_outputs(rp->body);
  for (size_t i = 0; i < np; i++)
    if (linear[i]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "remat: a primal operand is linear"), NB_ERR_INTERNAL;
  nb_val **prim = nb_calloc(ctx, (np + 1) * sizeof(nb_val *)), **cto = nb_calloc(ctx, (no + 1) * sizeof(nb_val *));
  nb_val **cti = nb_calloc(ctx, (np + 1) * sizeof(nb_val *)), **pout = nb_calloc(ctx, (no + 1) * sizeof(nb_val *));
  bool *wrt = nb_calloc(ctx, np + 1);
  nb_status st = prim && cto && cti && pout && wrt ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < np; i++) {
    prim[i] = in[i];
    wrt[i] = nb_dtype_is_float(nb__graph_input(rp->body, i)->aval.dtype);
  }
  for (size_t i = 0, k = 0; st == NB_OK && i < no; i++)
    if (nb_dtype_is_float(nb__graph_output(rp->body, i)->aval.dtype)) cto[i] = ct_out[k++];
  if (st == NB_OK) {
    barrier_all(g, e->loc, (int)np, prim);
    st = nb__vjp_into(g, rp->body, wrt, prim, cto, false, pout, cti);
  }
  for (size_t i = 0, k = np; st == NB_OK && i < np; i++)
    if (wrt[i]) ct_in[k++] = cti[i];
  nb_dealloc(ctx, prim, (np + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, cto, (no + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, cti, (np + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, pout, (no + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, wrt, np + 1);
  return st ? st : nb_graph_status(g);
}

/* The JVP of remat_lin / custom_lin. Both are linear in their tangent
 * operands, so where their primal operands carry no tangent (the case that
 * transposing a linearized graph meets: a scan's linear body is transposed by
 * reverse mode over its linearization, with the residuals held fixed) the
 * tangent is the same primitive applied to the tangent operands' tangents.
 * With a tangent on a primal operand (forward mode over forward mode), a
 * remat_lin's is the JVP of its jvp graph, inlined (the second-order terms
 * are not rematerialized); a custom_lin has no forward mode at all. */
static nb_status lin_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                         nb_val **ot) {
  const bool remat = e->prim == NB_PRIM_remat_lin;
  const nb_graph *callee = remat ? ((const nb_remat_params *)e->params)->body : ((const nb_custom_vjp_params *)e->params)->fwd;
  int np = (int)nb_graph_num_inputs(callee), no = (int)nb_graph_num_outputs(callee);
  bool primal_tangent = false, any = false;
  for (int i = 0; i < e->nin; i++) {
    if (i < np) primal_tangent = primal_tangent || t[i];
    else any = any || t[i];
  }
  if (e->nin > 512 || e->nout + no > 512)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "%s with more than 512 operands", nb__rules(e->prim)->name), NB_ERR_UNIMPLEMENTED;
  nb_val *ops[512], *po[512], *to[512];
  if (primal_tangent && !remat)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED,
                    "forward-mode differentiation of a custom_vjp function is not supported (forward mode over its "
                    "linearization)"),
           NB_ERR_UNIMPLEMENTED;
  if (primal_tangent) { /* the jvp graph's outputs: the body's, then its float outputs' tangents */
    nb_status st = nb__jvp_into(g, ((const nb_remat_params *)e->params)->jvp, p, t, po, to);
    for (int i = 0; st == NB_OK && i < e->nout; i++) ot[i] = to[no + i];
    return st ? st : nb_graph_status(g);
  }
  if (!any) return NB_OK; /* every output tangent a symbolic zero */
  for (int i = 0; i < e->nin; i++) ops[i] = i < np ? p[i] : t[i] ? t[i] : nb__zeros(g, e->in[i]->aval);
  nb__emit(g, e->loc, e->prim, e->nin, ops, e->params, e->params_size, NULL, ot);
  return nb_graph_status(g);
}

const nb_prim_rules nb__prim_remat_lin = {
    .name = "remat_lin",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_remat_params),
    .print_params = remat_print,
    .infer = remat_lin_infer,
    .eval = remat_lin_eval,
    .jvp = lin_jvp,
    .transpose = remat_lin_transpose,
    .batch = remat_batch,
    .hold_params = remat_hold,
};

/* ---------------------------------------------------------------- custom_vjp */

static nb_status cvjp_hold(nb_graph *g, const void *params) {
  const nb_custom_vjp_params *p = params;
  nb_status st = nb__graph_hold_graph(g, p->fwd);
  return st ? st : nb__graph_hold_graph(g, p->bwd);
}

static nb_status cvjp_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  return sig_infer(((const nb_custom_vjp_params *)params)->fwd, nin, in, nout, out, why, cap);
}

static nb_status cvjp_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  return run_into(ctx, ((const nb_custom_vjp_params *)e->params)->fwd, in, 0, e->nout, out);
}

static nb_status cvjp_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                          nb_val **ot) {
  nb_val *ops[512], *lo[256];
  if (2 * e->nin > 512) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "custom_vjp with more than 256 inputs"), NB_ERR_UNIMPLEMENTED;
  int n = lin_operands(g, e, p, t, ops);
  nb__emit(g, e->loc, NB_PRIM_custom_lin, n, ops, e->params, e->params_size, NULL, lo);
  if (!nb_graph_status(g)) lin_outputs(e, lo, ot);
  return nb_graph_status(g);
}

static nb_status cvjp_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                            int *out_bdims) {
  const nb_custom_vjp_params *cp = e->params;
  const nb_graph *graphs[2] = {cp->fwd, cp->bwd};
  return batch_graphs(g, e, in, bdims, n, graphs, 2, out, out_bdims);
}

static void cvjp_cost(const nb_eqn *e, double *flops, double *bytes) {
  nb_graph_cost(((const nb_custom_vjp_params *)e->params)->fwd, flops, bytes);
}

const nb_prim_rules nb__prim_custom_vjp_call = {
    .name = "custom_vjp_call",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_custom_vjp_params),
    .print_params = cvjp_print,
    .infer = cvjp_infer,
    .eval = cvjp_eval,
    .jvp = cvjp_jvp,
    .batch = cvjp_batch,
    .cost = cvjp_cost,
    .hold_params = cvjp_hold,
};

static nb_status custom_lin_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                  size_t cap) {
  return lin_infer_outputs(((const nb_custom_vjp_params *)params)->fwd, nin, in, nout, out, why, cap);
}

static nb_status custom_lin_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                   "forward-mode differentiation of a custom_vjp function is not supported (use grad/vjp; traced at %s:%d)",
                   e->loc.file ? e->loc.file : "?", e->loc.line);
}

/* Runs bwd: its inputs are fwd's inputs by path and "ct/<out>" cotangents. */
static nb_status custom_lin_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                      nb_val *const *ct_out, nb_val **ct_in) {
  const nb_custom_vjp_params *cp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  size_t np = nb_graph_num_inputs(cp->fwd), no = nb_graph_num_outputs(cp->fwd);
  size_t nbi = nb_graph_num_inputs(cp->bwd), nbo = nb_graph_num_outputs(cp->bwd);
  nb_val **bin = nb_calloc(ctx, (nbi + 1) * sizeof(nb_val *)), **bout = nb_calloc(ctx, (nbo + 1) * sizeof(nb_val *));
  nb_status st = bin && bout ? NB_OK : NB_ERR_NOMEM;
  char path[1024];
  for (size_t j = 0; st == NB_OK && j < nbi; j++) {
    const char *bp = nb_graph_input_path(cp->bwd, j);
    for (size_t i = 0; !bin[j] && i < np; i++)
      if (!strcmp(bp, nb_graph_input_path(cp->fwd, i))) bin[j] = in[i];
    for (size_t i = 0, k = 0; !bin[j] && i < no; i++) {
      nb_aval a = nb__graph_output(cp->fwd, i)->aval;
      if (!nb_dtype_is_float(a.dtype)) continue;
      snprintf(path, sizeof path, "ct/%s", nb_graph_output_path(cp->fwd, i));
      if (!strcmp(bp, path)) bin[j] = ct_out[k] ? ct_out[k] : nb__zeros(g, a);
      k++;
    }
    if (!bin[j]) {
      nb__fail(g, e->loc, NB_ERR_INVALID_ARG, "custom_vjp: bwd input '%s' is neither a fwd input nor a ct/ of an output", bp);
      st = NB_ERR_INVALID_ARG;
    }
  }
  if (st == NB_OK) st = nb__graph_inline(g, cp->bwd, bin, bout);
  for (size_t i = 0, k = np; st == NB_OK && i < np; i++) {
    if (!nb_dtype_is_float(nb__graph_input(cp->fwd, i)->aval.dtype)) continue;
    snprintf(path, sizeof path, "grad/%s", nb_graph_input_path(cp->fwd, i));
    nb_val *gv = NULL;
    for (size_t j = 0; j < nbo; j++)
      if (!strcmp(path, nb_graph_output_path(cp->bwd, j))) gv = bout[j];
    ct_in[k++] = gv; /* a missing grad/ output means a zero cotangent */
  }
  nb_dealloc(ctx, bin, (nbi + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, bout, (nbo + 1) * sizeof(nb_val *));
  return st ? st : nb_graph_status(g);
}

const nb_prim_rules nb__prim_custom_lin = {
    .name = "custom_lin",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_custom_vjp_params),
    .print_params = cvjp_print,
    .infer = custom_lin_infer,
    .eval = custom_lin_eval,
    .jvp = lin_jvp,
    .transpose = custom_lin_transpose,
    .batch = cvjp_batch,
    .hold_params = cvjp_hold,
};

/* ---------------------------------------------------------------- public */

/* Operands of a call: callee's inputs looked up by path in `in`. */
static nb_status call_operands(nb_graph *g, const nb_graph *callee, const nb_tree *in, nb_val **ops, const char *what) {
  for (size_t i = 0; i < nb_graph_num_inputs(callee); i++) {
    const nb_leaf *l = nb_tree_get(in, nb_graph_input_path(callee, i));
    ops[i] = !l ? NULL : l->kind == NB_LEAF_VAL ? l->val : l->kind == NB_LEAF_ARRAY ? nb_const_at((nb_loc){0}, g, l->array) : NULL;
    if (!ops[i]) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "%s: no value for input '%s'", what, nb_graph_input_path(callee, i)), NB_ERR_INVALID_ARG;
  }
  return NB_OK;
}

static nb_status emit_call(nb_graph *g, nb_prim prim, const nb_graph *callee, const void *params, size_t psize,
                           const nb_tree *in, nb_tree *out, const char *what) {
  if (nb_graph_status(g)) return nb_graph_status(g);
  size_t nin = nb_graph_num_inputs(callee), nout = nb_graph_num_outputs(callee);
  if (nin > 256 || nout > 256) return nb__fail(g, (nb_loc){0}, NB_ERR_UNIMPLEMENTED, "%s: more than 256 inputs or outputs", what), NB_ERR_UNIMPLEMENTED;
  nb_val *ops[256], *outs[256];
  nb_status st = call_operands(g, callee, in, ops, what);
  if (st == NB_OK) nb__emit(g, (nb_loc){0}, prim, (int)nin, ops, params, psize, NULL, outs);
  for (size_t i = 0; st == NB_OK && !nb_graph_status(g) && i < nout; i++) st = nb_tree_set_val(out, nb_graph_output_path(callee, i), outs[i]);
  return st ? st : nb_graph_status(g);
}

nb_status nb_remat_call(nb_graph *g, const nb_graph *callee, const nb_tree *in, nb_tree *out) {
  if (!g || !callee || !in || !out) return NB_ERR_INVALID_ARG;
  nb_remat_params p = {callee, NULL};
  return emit_call(g, NB_PRIM_remat_call, callee, &p, sizeof p, in, out, "remat");
}

/* bwd's signature: inputs are fwd inputs or ct/<float fwd output> with the
 * same avals; outputs grad/<float fwd input> with the input's aval. */
static nb_status check_bwd(nb_graph *g, const nb_graph *fwd, const nb_graph *bwd) {
  char path[1024];
  for (size_t j = 0; j < nb_graph_num_inputs(bwd); j++) {
    const char *bp = nb_graph_input_path(bwd, j);
    nb_aval ba = nb__graph_input(bwd, j)->aval, want;
    bool found = false;
    for (size_t i = 0; !found && i < nb_graph_num_inputs(fwd); i++)
      if (!strcmp(bp, nb_graph_input_path(fwd, i))) found = true, want = nb__graph_input(fwd, i)->aval;
    for (size_t i = 0; !found && i < nb_graph_num_outputs(fwd); i++) {
      snprintf(path, sizeof path, "ct/%s", nb_graph_output_path(fwd, i));
      if (!strcmp(bp, path)) found = true, want = nb__graph_output(fwd, i)->aval;
    }
    if (!found) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "custom_vjp: bwd input '%s' is neither a fwd input nor ct/<fwd output>", bp), NB_ERR_INVALID_ARG;
    if (!nb_aval_equal(&ba, &want)) return nb__fail(g, (nb_loc){0}, NB_ERR_SHAPE, "custom_vjp: bwd input '%s' has the wrong dtype or shape", bp), NB_ERR_SHAPE;
  }
  for (size_t j = 0; j < nb_graph_num_outputs(bwd); j++) {
    const char *bp = nb_graph_output_path(bwd, j);
    bool found = false;
    for (size_t i = 0; !found && i < nb_graph_num_inputs(fwd); i++) {
      snprintf(path, sizeof path, "grad/%s", nb_graph_input_path(fwd, i));
      nb_aval want = nb__graph_input(fwd, i)->aval, got = nb__graph_output(bwd, j)->aval;
      if (!strcmp(bp, path)) {
        if (!nb_aval_equal(&want, &got)) return nb__fail(g, (nb_loc){0}, NB_ERR_SHAPE, "custom_vjp: bwd output '%s' has the wrong dtype or shape", bp), NB_ERR_SHAPE;
        found = true;
      }
    }
    if (!found) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "custom_vjp: bwd output '%s' is not grad/<fwd input>", bp), NB_ERR_INVALID_ARG;
  }
  return NB_OK;
}

nb_status nb_custom_vjp_call(nb_graph *g, const nb_graph *fwd_primal, const nb_graph *bwd, const nb_tree *in, nb_tree *out) {
  if (!g || !fwd_primal || !bwd || !in || !out) return NB_ERR_INVALID_ARG;
  nb_status st = check_bwd(g, fwd_primal, bwd);
  if (st) return st;
  nb_custom_vjp_params p = {fwd_primal, bwd};
  return emit_call(g, NB_PRIM_custom_vjp_call, fwd_primal, &p, sizeof p, in, out, "custom_vjp");
}
