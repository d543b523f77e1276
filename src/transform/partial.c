/* Partial evaluation of a linearization, as JAX's partial_eval of a jvp: the
 * forward-mode program of a graph split into the part that needs only the
 * primal inputs (known) and the part that is linear in the tangents (lin),
 * joined by residuals, the primal values lin reads. Control flow uses it to
 * linearize the graphs it carries: scan runs known forward, stacking the
 * residuals as ys, and lin (or its transpose) over them. */
#include <stdio.h>
#include <string.h>

#include "core/ir.h"

void nb__partial_free(nb_ctx *ctx, nb__partial *p) {
  nb_graph_destroy(p->known);
  nb_graph_destroy(p->lin);
  nb_graph_destroy(p->hoisted);
  nb_dealloc(ctx, p->res_input, (size_t)(p->nres + 1) * sizeof(int));
  memset(p, 0, sizeof *p);
}

/* The graph without dead equations, replacing g (NULL on failure). */
static nb_graph *dce_replace(nb_graph *g) {
  if (!g || nb_graph_status(g)) return g;
  nb_graph *d = nb__graph_dce(g);
  nb_graph_destroy(g);
  return d;
}

typedef struct pe_work {
  nb_ctx *ctx;
  nb_graph *t;      /* the linearized program */
  bool *linear;     /* per value of t: depends on a tangent */
  bool *invariant;  /* per value of t: depends only on inv_in inputs (and no impure equation) */
  bool *constant;   /* per value of t: computed from constants alone (literals, iota; no input, no impure equation) */
  bool *needed;     /* per value of t: a primal value that lin reads (directly, or to recompute one) */
  bool *remat;      /* per value of t: a primal value recomputed in lin instead of passed */
  int *res;         /* per value of t: residual index + 1, 0 when none */
  nb_val **kmap;    /* per value of t: its copy in known */
  nb_val **lmap;    /* per value of t: its copy in lin */
  size_t nv;
} pe_work;

/* A value of t as seen from lin: its copy, a residual input, or (values
 * with no operands: constants, iota) a copy recomputed there. */
static nb_val *lin_value(pe_work *w, nb_graph *lin, const nb_val *v) {
  if (w->lmap[v->id]) return w->lmap[v->id];
  const nb_eqn *e = v->def;
  if (!e || e->nin != 0) return nb__fail(lin, (nb_loc){0}, NB_ERR_INTERNAL, "partial eval: value %u has no residual", v->id);
  nb_val *outs[256];
  nb__emit(lin, e->loc, e->prim, 0, NULL, e->params, e->params_size, NULL, outs);
  for (int i = 0; !nb_graph_status(lin) && i < e->nout; i++) w->lmap[e->out[i]->id] = outs[i];
  return nb_graph_status(lin) ? nb__poison(lin) : w->lmap[v->id];
}

/* Does e evaluate a transcendental function per element (a libm-style call,
 * tens of cycles an element, where add or mul take one)? */
static bool transcendental(const nb_eqn *e) {
  switch (e->prim) {
  case NB_PRIM_exp: case NB_PRIM_exp2: case NB_PRIM_expm1: case NB_PRIM_log: case NB_PRIM_log1p:
  case NB_PRIM_tanh: case NB_PRIM_logistic: case NB_PRIM_erf: case NB_PRIM_erfc: case NB_PRIM_erf_inv:
  case NB_PRIM_sin: case NB_PRIM_cos: case NB_PRIM_cbrt: case NB_PRIM_pow: case NB_PRIM_atan2:
    return true;
  default:
    return false;
  }
}

/* Is e cheap to recompute where its result is read (an elementwise or
 * index-map primitive the compiler fuses into its readers anyway)? A
 * transcendental is not: recomputing a GELU's tanh or a softmax's exp in
 * every backward iteration of a scanned layer made its train step 10%
 * slower than the unrolled one, which keeps them. */
static bool recomputable(const nb_eqn *e) {
  const nb_prim_rules *r = nb__rules(e->prim);
  return e->nout == 1 && e->nin > 0 && !r->impure && !transcendental(e) &&
         (r->fusion == NB_FUSE_EXPR || r->fusion == NB_FUSE_CONVERT || r->fusion == NB_FUSE_INDEX);
}

/* Marks which primal values lin recomputes: walking back from the values the
 * linear equations read, a value defined by a recomputable equation (and not
 * loop-invariant: those are hoisted, computed once; unless it is a constant,
 * a broadcast literal say, which lin's compiler folds into its kernels where
 * as a residual it would be a loop input, materialized at full shape and
 * read from memory on every iteration) is recomputed from its operands,
 * which lin then needs in turn. So the residuals are what the
 * unrolled program's fused kernels would keep too (contractions, reductions,
 * inputs) rather than every elementwise step and broadcast between them (a
 * scanned GPT-2 block stacked 28 values per layer, and its train step needed
 * twice the memory of the same layers unrolled). */
static void mark_remat(pe_work *w, size_t ne) {
  for (size_t k = 0; k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w->t, k);
    if (!e->nout || !w->linear[e->out[0]->id]) continue;
    for (int i = 0; i < e->nin; i++)
      if (!w->linear[e->in[i]->id]) w->needed[e->in[i]->id] = true;
  }
  for (size_t k = ne; k-- > 0;) { /* readers before definitions */
    const nb_eqn *e = nb__graph_eqn(w->t, k);
    if (!e->nout || w->linear[e->out[0]->id] || !w->needed[e->out[0]->id]) continue;
    if (!recomputable(e) || (w->invariant[e->out[0]->id] && !w->constant[e->out[0]->id])) continue;
    w->remat[e->out[0]->id] = true;
    for (int i = 0; i < e->nin; i++) w->needed[e->in[i]->id] = true;
  }
}

nb_status nb__partial_eval(nb_ctx *ctx, const nb_graph *src, const bool *tan_in, const bool *fwd_in, const bool *inv_in,
                           const bool *want_out, bool *tout_nonzero, nb__partial *out) {
  memset(out, 0, sizeof *out);
  size_t nin = nb_graph_num_inputs(src), nout = nb_graph_num_outputs(src);
  pe_work w = {.ctx = ctx, .t = nb_graph_create(ctx)};
  nb_val **pin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *)), **tin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *));
  nb_val **pout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *)), **tout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *));
  nb_val **small = NULL;
  nb_status st = w.t && pin && tin && pout && tout ? NB_OK : NB_ERR_NOMEM;
  char path[64];

  /* 1. linearize src into t */
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    nb_aval a = nb__graph_input(src, i)->aval;
    snprintf(path, sizeof path, "p%zu", i);
    pin[i] = nb__graph_add_input(w.t, path, a);
    if (tan_in[i] && nb_dtype_is_float(a.dtype)) {
      snprintf(path, sizeof path, "t%zu", i);
      tin[i] = nb__graph_add_input(w.t, path, a);
    }
  }
  if (st == NB_OK) st = nb_graph_status(w.t);
  if (st == NB_OK && (st = nb__jvp_into(w.t, src, pin, tin, pout, tout)) != NB_OK)
    nb_errorf(ctx, st, "%s", nb_graph_error(w.t));

  /* 2. linear values, and the residuals: primal values that linear equations read */
  if (st == NB_OK) {
    w.nv = nb__graph_nvals(w.t);
    w.linear = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.invariant = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.constant = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.needed = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.remat = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.res = nb_calloc(ctx, (w.nv + 1) * sizeof(int));
    w.kmap = nb_calloc(ctx, (w.nv + 1) * sizeof(nb_val *));
    w.lmap = nb_calloc(ctx, (w.nv + 1) * sizeof(nb_val *));
    small = nb_calloc(ctx, (w.nv + 1) * sizeof(nb_val *)); /* the residual values, in order */
    if (!w.linear || !w.invariant || !w.constant || !w.needed || !w.remat || !w.res || !w.kmap || !w.lmap || !small) st = NB_ERR_NOMEM;
  }
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    if (tin[i]) w.linear[tin[i]->id] = true;
    w.invariant[pin[i]->id] = inv_in && inv_in[i];
  }
  size_t ne = st == NB_OK ? nb__graph_neqns(w.t) : 0;
  int nres = 0;
  for (size_t k = 0; k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    bool lin = false, inv = !nb__rules(e->prim)->impure, cst = inv;
    for (int i = 0; i < e->nin; i++)
      lin = lin || w.linear[e->in[i]->id], inv = inv && w.invariant[e->in[i]->id], cst = cst && w.constant[e->in[i]->id];
    for (int i = 0; i < e->nout; i++)
      w.linear[e->out[i]->id] = lin, w.invariant[e->out[i]->id] = inv && !lin, w.constant[e->out[i]->id] = cst && !lin;
  }
  if (st == NB_OK) mark_remat(&w, ne);
  for (size_t k = 0; k < ne; k++) { /* the residuals: what lin reads and does not recompute, in order */
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    if (!e->nout || !(w.linear[e->out[0]->id] || w.remat[e->out[0]->id])) continue;
    for (int i = 0; i < e->nin; i++) {
      const nb_val *v = e->in[i];
      if (w.linear[v->id] || w.remat[v->id] || w.res[v->id] || (v->def && v->def->nin == 0)) continue;
      w.res[v->id] = ++nres;
      small[nres - 1] = (nb_val *)v;
    }
  }
  for (size_t i = 0; st == NB_OK && i < nout; i++)
    if (tout_nonzero) tout_nonzero[i] = tout[i] && w.linear[tout[i]->id];

  /* 3. known: the primal equations; outputs src's, then the computed residuals */
  out->nres = nres;
  if (st == NB_OK && !(out->res_input = nb_calloc(ctx, (size_t)(nres + 1) * sizeof(int)))) st = NB_ERR_NOMEM;
  nb_graph *known = st == NB_OK ? nb_graph_create(ctx) : NULL;
  for (size_t i = 0; known && i < nin; i++) w.kmap[pin[i]->id] = nb__graph_add_input(known, nb_graph_input_path(src, i), pin[i]->aval);
  nb_val *ins[512], *outs[256];
  for (size_t k = 0; known && !nb_graph_status(known) && k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    if (e->nout && w.linear[e->out[0]->id]) continue;
    if (e->nin > 512) {
      nb__fail(known, e->loc, NB_ERR_UNIMPLEMENTED, "partial eval: an equation with more than 512 operands");
      break;
    }
    for (int i = 0; i < e->nin; i++) ins[i] = w.kmap[e->in[i]->id];
    nb__emit(known, e->loc, e->prim, e->nin, ins, e->params, e->params_size, NULL, outs);
    for (int i = 0; !nb_graph_status(known) && i < e->nout; i++) w.kmap[e->out[i]->id] = outs[i];
  }
  for (size_t i = 0; known && i < nout; i++) {
    snprintf(path, sizeof path, "primal/%zu", i); /* src's paths could clash with residual/<r> */
    nb__graph_add_output(known, path, w.kmap[pout[i]->id]);
  }
  for (int r = 0; known && r < nres; r++) {
    const nb_val *v = small[r];
    out->res_input[r] = NB__RES_COMPUTED;
    for (size_t i = 0; i < nin; i++)
      if (pin[i] == v && fwd_in[i]) out->res_input[r] = (int)i;
    if (out->res_input[r] < 0 && inv_in && w.invariant[v->id]) out->res_input[r] = NB__RES_HOISTED;
    if (out->res_input[r] != NB__RES_COMPUTED) continue;
    snprintf(path, sizeof path, "residual/%d", r);
    nb__graph_add_output(known, path, w.kmap[v->id]);
  }

  /* 3b. hoisted: (the inv_in inputs) -> the loop-invariant residuals */
  nb_graph *hoisted = known && inv_in ? nb_graph_create(ctx) : NULL;
  if (hoisted) {
    nb_val **hmap = w.lmap; /* borrowed as scratch until lin is built */
    for (size_t i = 0; i < nin; i++)
      if (inv_in[i]) hmap[pin[i]->id] = nb__graph_add_input(hoisted, nb_graph_input_path(src, i), pin[i]->aval);
    for (size_t k = 0; !nb_graph_status(hoisted) && k < ne; k++) {
      const nb_eqn *e = nb__graph_eqn(w.t, k);
      if (!e->nout || !w.invariant[e->out[0]->id] || e->nin > 512) continue;
      for (int i = 0; i < e->nin; i++) ins[i] = hmap[e->in[i]->id];
      nb__emit(hoisted, e->loc, e->prim, e->nin, ins, e->params, e->params_size, NULL, outs);
      for (int i = 0; !nb_graph_status(hoisted) && i < e->nout; i++) hmap[e->out[i]->id] = outs[i];
    }
    for (int r = 0; r < nres; r++) {
      if (out->res_input[r] != NB__RES_HOISTED) continue;
      snprintf(path, sizeof path, "residual/%d", r);
      nb__graph_add_output(hoisted, path, hmap[small[r]->id]);
    }
    memset(w.lmap, 0, (w.nv + 1) * sizeof(nb_val *));
  }

  /* 4. lin: (residuals, tangents) -> the wanted output tangents */
  nb_graph *lin = known ? nb_graph_create(ctx) : NULL;
  for (int r = 0; lin && r < nres; r++) {
    snprintf(path, sizeof path, "residual/%d", r);
    w.lmap[small[r]->id] = nb__graph_add_input(lin, path, small[r]->aval);
  }
  for (size_t i = 0; lin && i < nin; i++) {
    if (!tin[i]) continue;
    snprintf(path, sizeof path, "tangent/%s", nb_graph_input_path(src, i));
    w.lmap[tin[i]->id] = nb__graph_add_input(lin, path, tin[i]->aval);
  }
  for (size_t k = 0; lin && !nb_graph_status(lin) && k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    if (!e->nout || !(w.linear[e->out[0]->id] || w.remat[e->out[0]->id])) continue;
    if (e->nin > 512) {
      nb__fail(lin, e->loc, NB_ERR_UNIMPLEMENTED, "partial eval: an equation with more than 512 operands");
      break;
    }
    for (int i = 0; i < e->nin; i++) ins[i] = lin_value(&w, lin, e->in[i]); /* linear, recomputed, residual or constant */
    nb__emit(lin, e->loc, e->prim, e->nin, ins, e->params, e->params_size, NULL, outs);
    for (int i = 0; !nb_graph_status(lin) && i < e->nout; i++) w.lmap[e->out[i]->id] = outs[i];
  }
  for (size_t i = 0; lin && i < nout; i++) {
    if (!want_out[i]) continue;
    nb_aval a = pout[i]->aval;
    snprintf(path, sizeof path, "tangent/%zu", i);
    /* a tangent that is not linear is a zero (instantiated by some rule) */
    nb__graph_add_output(lin, path, tout[i] && w.linear[tout[i]->id] ? w.lmap[tout[i]->id] : nb__zeros(lin, a));
  }

  if (st == NB_OK && (nb_graph_status(known) || nb_graph_status(lin) || (hoisted && nb_graph_status(hoisted)))) {
    const nb_graph *bad = nb_graph_status(known) ? known : nb_graph_status(lin) ? lin : hoisted;
    st = nb_errorf(ctx, nb_graph_status(bad), "linearizing a carried graph: %s", nb_graph_error(bad));
  }
  out->known = dce_replace(known);
  out->lin = dce_replace(lin);
  out->hoisted = dce_replace(hoisted);
  if (st == NB_OK && (!out->known || !out->lin || (inv_in && !out->hoisted))) st = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (st == NB_ERR_NOMEM && nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "out of memory in partial evaluation");
  if (st != NB_OK) nb__partial_free(ctx, out);

  nb_dealloc(ctx, w.linear, (w.nv + 1) * sizeof(bool));
  nb_dealloc(ctx, w.invariant, (w.nv + 1) * sizeof(bool));
  nb_dealloc(ctx, w.constant, (w.nv + 1) * sizeof(bool));
  nb_dealloc(ctx, w.needed, (w.nv + 1) * sizeof(bool));
  nb_dealloc(ctx, w.remat, (w.nv + 1) * sizeof(bool));
  nb_dealloc(ctx, w.res, (w.nv + 1) * sizeof(int));
  nb_dealloc(ctx, w.kmap, (w.nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, w.lmap, (w.nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, small, (w.nv + 1) * sizeof(nb_val *));
  nb_graph_destroy(w.t);
  nb_dealloc(ctx, pin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, pout, (nout + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tout, (nout + 1) * sizeof(nb_val *));
  return st;
}
