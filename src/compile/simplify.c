/* Pass 1, simplification: one engine re-emits the graph equation by
 * equation and offers each to a table of rewrite rules (constant folding,
 * algebraic identities, layout-chain folding); dead code is removed after
 * each sweep, and sweeps repeat until nothing changes. Common subexpressions
 * are merged by the IR's hash-consing as equations are re-emitted. The
 * calls that carry a graph (remat_call, remat_lin, custom_vjp_call) are
 * inlined, so their bodies are fused and compiled like the rest (as XLA
 * does); the barriers that reverse mode put on a remat region's recomputed
 * inputs stay, so the recomputation is never merged with the forward pass
 * (fuse.c makes them views: no copy). Not here: fusion or anything about
 * memory. */
#include <string.h>

#include "compile/jit.h"

#define FOLD_MAX_ELEMS 1024
#define MAX_SWEEPS 4

/* A rule sees the equation e of the source graph, its inputs `in` already
 * re-emitted in d, and how many equations of the source graph use each of
 * its values (by id). */
typedef nb_val *(*rule_fn)(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses);
typedef struct rule {
  nb_jit_switch sw;
  int prim; /* -1: any */
  rule_fn fn;
} rule;

/* ---------------------------------------------------------------- helpers */

static const nb_eqn *def_of(const nb_val *v, nb_prim p) { return v->def && v->def->prim == p ? v->def : NULL; }

/* v is a constant (or a broadcast of one) whose elements all equal *out. */
static bool splat_value(const nb_val *v, double *out) {
  const nb_eqn *b = def_of(v, NB_PRIM_broadcast_in_dim);
  if (b) v = b->in[0];
  const nb_eqn *c = def_of(v, NB_PRIM_constant);
  if (!c) return false;
  const nb_array *a = ((const nb_constant_params *)c->params)->value;
  int64_t n = nb_array_size(a);
  if (n == 0 || n > FOLD_MAX_ELEMS) return false;
  double x = nb_array_get(a, 0);
  for (int64_t i = 1; i < n; i++)
    if (nb_array_get(a, i) != x) return false;
  *out = x;
  return true;
}

static bool is_splat(const nb_val *v, double want) {
  double x;
  return splat_value(v, &x) && x == want;
}

/* Converting from -> to and back gives the original for every value. */
static bool lossless(nb_dtype from, nb_dtype to) {
  if (from == to) return true;
  if (from == NB_BOOL) return true;
  switch (from) {
  case NB_F32: return to == NB_F64;
  case NB_BF16: case NB_F16: return to == NB_F32 || to == NB_F64;
  case NB_I8: return to == NB_I32 || to == NB_I64 || to == NB_F32 || to == NB_F64 || to == NB_BF16 || to == NB_F16;
  case NB_U8: return to == NB_I32 || to == NB_I64 || to == NB_U32 || to == NB_F32 || to == NB_F64 || to == NB_F16;
  case NB_I32: case NB_U32: return to == NB_I64 || to == NB_F64;
  default: return false;
  }
}

/* ---------------------------------------------------------------- fold */

static nb_val *fold(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_prim_rules *r = nb__rules(e->prim);
  if (e->nin == 0 || e->nout != 1 || r->impure || r->kind == NB_KIND_OTHER || r->kind == NB_KIND_CONTRACTION) return NULL;
  nb_aval oa = e->out[0]->aval;
  int64_t n = nb_shape_size(&oa.shape);
  if (n > FOLD_MAX_ELEMS) return NULL;
  nb_array *args[8];
  if (e->nin > 8) return NULL;
  for (int i = 0; i < e->nin; i++) {
    const nb_eqn *c = def_of(in[i], NB_PRIM_constant);
    if (!c) return NULL;
    args[i] = ((const nb_constant_params *)c->params)->value;
  }
  /* a broadcast of a smaller constant stays: kernels compute it for free */
  if (e->prim == NB_PRIM_broadcast_in_dim && nb_array_size(args[0]) < n) return NULL;
  nb_ctx *ctx = nb_graph_ctx(d);
  nb_array *out = nb_array_empty(ctx, oa.dtype, oa.shape.rank, oa.shape.dims);
  if (!out) return NULL;
  nb_eqn tmp = *e; /* the rule reads params and avals from the source equation */
  nb_val *res = NULL;
  if (r->eval(ctx, &tmp, args, &out) == NB_OK) res = nb_const_at(e->loc, d, out);
  else nb_ctx_clear_error(ctx);
  nb_array_release(out);
  return res;
}

/* ---------------------------------------------------------------- algebra */

static nb_val *add_zero(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  if (is_splat(in[1], 0)) return in[0];
  if (is_splat(in[0], 0)) return in[1];
  return NULL;
}
static nb_val *sub_zero(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) { return is_splat(in[1], 0) ? in[0] : NULL; }
static nb_val *mul_one(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  if (is_splat(in[1], 1)) return in[0];
  if (is_splat(in[0], 1)) return in[1];
  return NULL;
}
static nb_val *div_one(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) { return is_splat(in[1], 1) ? in[0] : NULL; }
static nb_val *neg_neg(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_eqn *n = def_of(in[0], NB_PRIM_neg);
  return n ? n->in[0] : NULL;
}
static nb_val *identity(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) { return in[0]; }
static nb_val *select_same(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) { return in[1] == in[2] ? in[1] : NULL; }

static nb_val *convert_round_trip(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_eqn *c = def_of(in[0], NB_PRIM_convert);
  nb_dtype to = ((const nb_convert_params *)e->params)->dtype;
  if (!c) return NULL;
  nb_val *x = c->in[0];
  nb_dtype mid = in[0]->aval.dtype;
  if (x->aval.dtype == to && lossless(to, mid)) return x;
  return NULL;
}

static nb_val *reduce_no_axes(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  return ((const nb_reduce_params *)e->params)->naxes == 0 ? in[0] : NULL;
}

/* x + scatter_add(0, idx, u) -> scatter_add(x, idx, u): the gradient of a
 * gather (cross-entropy's label pick) added to a dense one. Saves filling
 * and re-reading a zero tensor of the operand's size (the logits' gradient:
 * 2 x 206 MB per GPT-2 124M step); the scatter then updates x in place.
 * Only when the scatter's result has no other use (else both would run).
 * Rounding: x + (0 + u) becomes x + u, the same for one update per element. */
static nb_val *add_scatter_into_zeros(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  for (int side = 0; side < 2; side++) {
    const nb_eqn *sc = e->in[side]->def;
    if (!sc || sc->prim != NB_PRIM_scatter_add || uses[e->in[side]->id] != 1) continue;
    const nb_eqn *now = def_of(in[side], NB_PRIM_scatter_add);
    if (!now || !is_splat(now->in[0], 0)) continue;
    nb_val *ops[3] = {in[1 - side], now->in[1], now->in[2]};
    return nb__emit1(d, e->loc, NB_PRIM_scatter_add, 3, ops, now->params, now->params_size);
  }
  return NULL;
}

/* ---------------------------------------------------------------- layout chains */

static nb_val *reshape_chain(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_reshape_params *p = e->params;
  const nb_eqn *inner = def_of(in[0], NB_PRIM_reshape);
  if (inner) return nb_reshape_at(e->loc, inner->in[0], p->shape.rank, p->shape.dims);
  const nb_eqn *b = def_of(in[0], NB_PRIM_broadcast_in_dim);
  if (b && b->in[0]->aval.shape.rank == 0) return nb_broadcast_in_dim_at(e->loc, b->in[0], p->shape.rank, p->shape.dims, NULL);
  return NULL;
}

static nb_val *transpose_chain(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_eqn *inner = def_of(in[0], NB_PRIM_transpose);
  if (!inner) return NULL;
  const int *p2 = ((const nb_transpose_params *)e->params)->perm, *p1 = ((const nb_transpose_params *)inner->params)->perm;
  int perm[NB_MAX_RANK];
  for (int i = 0; i < in[0]->aval.shape.rank; i++) perm[i] = p1[p2[i]];
  return nb_transpose_at(e->loc, inner->in[0], perm);
}

/* transpose(dot_general(a, b)) that only swaps the result's lhs-free and
 * rhs-free blocks -> dot_general(b, a). A dense layer's weight gradient is
 * traced as the transpose of dY^T X: the optimizer's kernel then read it
 * column-wise (16 x 16 tiles, strided loads); swapped, the product writes it
 * in the weight's own layout. Only when the dot has no other use (else both
 * would run). Rounding: each element is the same products in the same order
 * (a*b = b*a), the same bits on the f32 kernels (backend/cpu/sgemm.h). */
static nb_val *transpose_of_dot(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_eqn *src = e->in[0]->def, *dot = def_of(in[0], NB_PRIM_dot_general);
  if (!src || src->prim != NB_PRIM_dot_general || uses[e->in[0]->id] != 1 || !dot) return NULL;
  const nb_dot_params *p = dot->params;
  int nb = p->dn.n_batch, lf = dot->in[0]->aval.shape.rank - nb - p->dn.n_contract;
  int rf = in[0]->aval.shape.rank - nb - lf;
  const int *perm = ((const nb_transpose_params *)e->params)->perm;
  for (int i = 0; i < nb; i++)
    if (perm[i] != i) return NULL;
  for (int i = 0; i < rf; i++)
    if (perm[nb + i] != nb + lf + i) return NULL;
  for (int i = 0; i < lf; i++)
    if (perm[nb + rf + i] != nb + i) return NULL;
  nb_dot_dims dn = p->dn;
  memcpy(dn.lhs_contract, p->dn.rhs_contract, sizeof dn.lhs_contract);
  memcpy(dn.rhs_contract, p->dn.lhs_contract, sizeof dn.rhs_contract);
  memcpy(dn.lhs_batch, p->dn.rhs_batch, sizeof dn.lhs_batch);
  memcpy(dn.rhs_batch, p->dn.lhs_batch, sizeof dn.rhs_batch);
  return nb_dot_general_at(e->loc, dot->in[1], dot->in[0], &dn, p->out_dtype);
}

static nb_val *broadcast_chain(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses) {
  const nb_eqn *inner = def_of(in[0], NB_PRIM_broadcast_in_dim);
  if (!inner) return NULL;
  const nb_broadcast_params *p2 = e->params, *p1 = inner->params;
  int bd[NB_MAX_RANK];
  for (int i = 0; i < inner->in[0]->aval.shape.rank; i++) bd[i] = p2->bdims[p1->bdims[i]];
  return nb_broadcast_in_dim_at(e->loc, inner->in[0], p2->shape.rank, p2->shape.dims, bd);
}

static const rule rules[] = {
    {NB_SW_fold, -1, fold},
    {NB_SW_algebra, NB_PRIM_add, add_zero},
    {NB_SW_algebra, NB_PRIM_add, add_scatter_into_zeros},
    {NB_SW_algebra, NB_PRIM_sub, sub_zero},
    {NB_SW_algebra, NB_PRIM_mul, mul_one},
    {NB_SW_algebra, NB_PRIM_div, div_one},
    {NB_SW_algebra, NB_PRIM_neg, neg_neg},
    {NB_SW_algebra, NB_PRIM_stop_gradient, identity},
    {NB_SW_algebra, NB_PRIM_select, select_same},
    {NB_SW_algebra, NB_PRIM_convert, convert_round_trip},
    {NB_SW_algebra, NB_PRIM_reduce_sum, reduce_no_axes},
    {NB_SW_algebra, NB_PRIM_reduce_max, reduce_no_axes},
    {NB_SW_algebra, NB_PRIM_reduce_min, reduce_no_axes},
    {NB_SW_algebra, NB_PRIM_reduce_prod, reduce_no_axes},
    {NB_SW_algebra, NB_PRIM_reshape, reshape_chain},
    {NB_SW_algebra, NB_PRIM_transpose, transpose_chain},
    {NB_SW_algebra, NB_PRIM_transpose, transpose_of_dot},
    {NB_SW_algebra, NB_PRIM_broadcast_in_dim, broadcast_chain},
};

/* ---------------------------------------------------------------- calls */

/* The graph a call equation runs and the first of its outputs that are the
 * equation's (remat_lin: the jvp graph's tangents follow its primals);
 * NULL for other equations. custom_lin is not inlined: its evaluation is the
 * clear error for forward mode over a custom_vjp function. */
static const nb_graph *callee_of(const nb_eqn *e, size_t *first) {
  *first = 0;
  switch (e->prim) {
  case NB_PRIM_remat_call: return ((const nb_remat_params *)e->params)->body;
  case NB_PRIM_custom_vjp_call: return ((const nb_custom_vjp_params *)e->params)->fwd;
  case NB_PRIM_remat_lin: {
    const nb_remat_params *p = e->params;
    *first = nb_graph_num_outputs(p->body);
    return p->jvp;
  }
  default: return NULL;
  }
}

/* Re-emits the callee of call equation e into d on `in`; writes the
 * equation's outputs to outs. False when e is no call (or too wide). */
static bool inline_call(nb_graph *d, const nb_eqn *e, nb_val *const *in, nb_val **outs) {
  size_t first;
  const nb_graph *callee = callee_of(e, &first);
  if (!callee || nb_graph_num_outputs(callee) > 512) return false;
  nb_val *all[512];
  if (nb__graph_inline(d, callee, in, all) != NB_OK) return false;
  memcpy(outs, all + first, sizeof(nb_val *) * (size_t)e->nout);
  return true;
}

/* ---------------------------------------------------------------- engine */

/* A rule's replacement must have the equation's aval (rules never change
 * types); anything else is ignored. */
static bool try_rules(nb_graph *d, const nb_eqn *e, nb_val *const *in, const uint32_t *uses, const nb_jit_config *cfg,
                      nb_val **out) {
  if (e->nout != 1) return false;
  for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
    const rule *r = &rules[k];
    if (cfg->off[r->sw] || (r->prim >= 0 && r->prim != (int)e->prim)) continue;
    nb_val *v = r->fn(d, e, in, uses);
    if (nb_graph_status(d)) return false;
    if (v && nb_aval_equal(&v->aval, &e->out[0]->aval)) {
      *out = v;
      return true;
    }
  }
  return false;
}

static nb_graph *sweep(nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg) {
  size_t nv = nb__graph_nvals(g), ne = nb__graph_neqns(g);
  nb_graph *d = nb_graph_create(ctx);
  nb_val **map = nb_calloc(ctx, (nv + 1) * sizeof(nb_val *));
  uint32_t *uses = nb_calloc(ctx, (nv + 1) * sizeof(uint32_t));
  if (!d || !map || !uses) goto fail;
  for (size_t k = 0; k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(g, k);
    for (int i = 0; i < e->nin; i++) uses[e->in[i]->id]++;
  }
  for (size_t i = 0; i < nb_graph_num_outputs(g); i++) uses[nb__graph_output(g, i)->id]++;
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) {
    nb_val *v = nb__graph_input(g, i);
    map[v->id] = nb__graph_add_input(d, nb_graph_input_path(g, i), v->aval);
  }
  nb_val *small[64], *outs[256];
  for (size_t k = 0; k < ne && !nb_graph_status(d); k++) {
    const nb_eqn *e = nb__graph_eqn(g, k);
    nb_val **in = e->nin <= 64 ? small : nb_alloc(ctx, (size_t)e->nin * sizeof(nb_val *));
    if (!in || e->nout > 256) goto fail;
    for (int i = 0; i < e->nin; i++) in[i] = map[e->in[i]->id];
    nb_val *rep;
    if (try_rules(d, e, in, uses, cfg, &rep)) map[e->out[0]->id] = rep;
    else if (!cfg->off[NB_SW_inline] && inline_call(d, e, in, outs))
      for (int i = 0; i < e->nout; i++) map[e->out[i]->id] = outs[i];
    else {
      nb__emit(d, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
      for (int i = 0; !nb_graph_status(d) && i < e->nout; i++) map[e->out[i]->id] = outs[i];
    }
    if (in != small) nb_dealloc(ctx, in, (size_t)e->nin * sizeof(nb_val *));
  }
  for (size_t i = 0; i < nb_graph_num_outputs(g) && !nb_graph_status(d); i++)
    nb__graph_add_output(d, nb_graph_output_path(g, i), map[nb__graph_output(g, i)->id]);
  if (nb_graph_status(d)) goto fail;
  nb_dealloc(ctx, map, (nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, uses, (nv + 1) * sizeof(uint32_t));
  if (!cfg->off[NB_SW_dce]) {
    nb_graph *c = nb__graph_dce(d);
    nb_graph_destroy(d);
    return c;
  }
  return d;
fail:
  if (nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory while simplifying");
  nb_dealloc(ctx, map, (nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, uses, (nv + 1) * sizeof(uint32_t));
  nb_graph_destroy(d);
  return NULL;
}

nb_graph *nb_jit__simplify(nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg) {
  nb_graph *cur = sweep(ctx, g, cfg);
  uint64_t h = cur ? nb_graph_hash(cur) : 0;
  for (int i = 1; cur && i < MAX_SWEEPS; i++) {
    nb_graph *next = sweep(ctx, cur, cfg);
    nb_graph_destroy(cur);
    cur = next;
    if (!cur) break;
    uint64_t h2 = nb_graph_hash(cur);
    if (h2 == h) break;
    h = h2;
  }
  return cur ? nb__checked(cur) : NULL;
}
