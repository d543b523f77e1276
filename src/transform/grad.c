/* Reverse mode as JAX does it: linearize (forward mode), split the result
 * into its primal half and its linear (tangent) half, then transpose the
 * linear half equation by equation, last to first, with the primitives'
 * transpose rules. Only linear primitives need transpose rules; every other
 * primitive needs only a JVP. */
#include <stdio.h>
#include <string.h>

#include "core/ir.h"

typedef struct vjp_work {
  nb_ctx *ctx;
  nb_graph *t;        /* the linearized program */
  bool *linear;       /* per value of t: depends on a tangent input */
  nb_val **map;       /* per value of t: its copy in dst (non-linear values) */
  nb_val **ct;        /* per value of t: accumulated cotangent in dst, NULL = 0 */
  size_t nv;
} vjp_work;

static void work_free(vjp_work *w) {
  nb_dealloc(w->ctx, w->linear, (w->nv + 1) * sizeof(bool));
  nb_dealloc(w->ctx, w->map, (w->nv + 1) * sizeof(nb_val *));
  nb_dealloc(w->ctx, w->ct, (w->nv + 1) * sizeof(nb_val *));
  nb_graph_destroy(w->t);
}

static nb_status accumulate(nb_graph *dst, vjp_work *w, const nb_val *tv, nb_val *c, nb_loc loc) {
  if (!c) return NB_OK;
  if (!nb_aval_equal(&c->aval, &tv->aval)) {
    char a[128], b[128];
    nb__fail(dst, loc, NB_ERR_INTERNAL, "transpose produced a %s cotangent for a %s value",
             nb_aval_str(&c->aval, a, sizeof a), nb_aval_str(&tv->aval, b, sizeof b));
    return nb_graph_status(dst);
  }
  w->ct[tv->id] = nb__add_tangents(loc, w->ct[tv->id], c);
  return nb_graph_status(dst);
}

/* Transposes one linear equation of w->t, emitting into dst. */
static nb_status transpose_eqn(nb_graph *dst, vjp_work *w, const nb_eqn *e) {
  const nb_prim_rules *r = nb__rules(e->prim);
  nb_val *ct_out[256], *ct_in_small[64], *in_small[64];
  bool lin_small[64];
  bool any = false;
  for (int i = 0; i < e->nout; i++) {
    ct_out[i] = w->ct[e->out[i]->id]; /* every output, not just up to the first non-zero one */
    any = any || ct_out[i] != NULL;
  }
  if (!any) return NB_OK;
  if (!r->transpose) {
    nb__fail(dst, e->loc, NB_ERR_UNIMPLEMENTED, "transpose rule for '%s' not implemented (needed by reverse mode)", r->name);
    return nb_graph_status(dst);
  }
  bool big = e->nin > 64;
  nb_val **in = big ? nb_calloc(w->ctx, (size_t)e->nin * sizeof(nb_val *)) : in_small;
  nb_val **ct_in = big ? nb_calloc(w->ctx, (size_t)e->nin * sizeof(nb_val *)) : ct_in_small;
  bool *lin = big ? nb_calloc(w->ctx, (size_t)e->nin) : lin_small;
  if (!in || !ct_in || !lin) return NB_ERR_NOMEM;
  for (int i = 0; i < e->nin; i++) {
    lin[i] = w->linear[e->in[i]->id];
    in[i] = lin[i] ? NULL : w->map[e->in[i]->id];
    ct_in[i] = NULL;
  }
  nb_status st = r->transpose(dst, e, in, lin, ct_out, ct_in);
  if (st == NB_OK) st = nb_graph_status(dst);
  for (int i = 0; st == NB_OK && i < e->nin; i++)
    if (lin[i]) st = accumulate(dst, w, e->in[i], ct_in[i], e->loc);
  if (big) {
    nb_dealloc(w->ctx, in, (size_t)e->nin * sizeof(nb_val *));
    nb_dealloc(w->ctx, ct_in, (size_t)e->nin * sizeof(nb_val *));
    nb_dealloc(w->ctx, lin, (size_t)e->nin);
  }
  return st;
}

nb_status nb__vjp_into(nb_graph *dst, const nb_graph *src, const bool *wrt, nb_val *const *primal_in,
                       nb_val *const *ct_out, bool seed_first, nb_val **primal_out, nb_val **ct_in) {
  nb_ctx *ctx = nb_graph_ctx(dst);
  size_t nin = nb_graph_num_inputs(src), nout = nb_graph_num_outputs(src);
  vjp_work w = {.ctx = ctx, .t = nb_graph_create(ctx)};
  nb_val **pin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *)), **tin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *));
  nb_val **pout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *)), **tout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *));
  nb_status st = w.t && pin && tin && pout && tout ? NB_OK : NB_ERR_NOMEM;

  /* 1. linearize src into t */
  char path[1024];
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    nb_aval a = nb__graph_input(src, i)->aval;
    pin[i] = nb__graph_add_input(w.t, nb_graph_input_path(src, i), a);
    if (wrt[i] && nb_dtype_is_float(a.dtype)) {
      snprintf(path, sizeof path, "tangent/%s", nb_graph_input_path(src, i));
      tin[i] = nb__graph_add_input(w.t, path, a);
    }
  }
  if (st == NB_OK) st = nb_graph_status(w.t);
  if (st == NB_OK && (st = nb__jvp_into(w.t, src, pin, tin, pout, tout)) != NB_OK)
    nb__fail(dst, (nb_loc){0}, st, "%s", nb_graph_error(w.t));

  /* 2. which values of t are linear (depend on a tangent input) */
  if (st == NB_OK) {
    w.nv = nb__graph_nvals(w.t);
    w.linear = nb_calloc(ctx, (w.nv + 1) * sizeof(bool));
    w.map = nb_calloc(ctx, (w.nv + 1) * sizeof(nb_val *));
    w.ct = nb_calloc(ctx, (w.nv + 1) * sizeof(nb_val *));
    if (!w.linear || !w.map || !w.ct) st = NB_ERR_NOMEM;
  }
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    if (tin[i]) w.linear[tin[i]->id] = true;
    w.map[pin[i]->id] = primal_in[i];
  }
  size_t ne = st == NB_OK ? nb__graph_neqns(w.t) : 0;
  for (size_t k = 0; k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    bool lin = false;
    for (int i = 0; i < e->nin; i++) lin = lin || w.linear[e->in[i]->id];
    for (int i = 0; i < e->nout; i++) w.linear[e->out[i]->id] = lin;
  }

  /* 3. the primal half: every non-linear equation of t, re-emitted into dst */
  nb_val *small[64], *outs[256];
  for (size_t k = 0; st == NB_OK && k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    if (e->nout && w.linear[e->out[0]->id]) continue;
    nb_val **in = e->nin <= 64 ? small : nb_alloc(ctx, (size_t)e->nin * sizeof(nb_val *));
    if (!in) {
      st = NB_ERR_NOMEM;
      break;
    }
    for (int i = 0; i < e->nin; i++) in[i] = w.map[e->in[i]->id];
    nb__emit(dst, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
    if (in != small) nb_dealloc(ctx, in, (size_t)e->nin * sizeof(nb_val *));
    st = nb_graph_status(dst);
    for (int i = 0; st == NB_OK && i < e->nout; i++) w.map[e->out[i]->id] = outs[i];
  }
  for (size_t i = 0; st == NB_OK && i < nout; i++) primal_out[i] = w.map[pout[i]->id];

  /* 4. seed the output cotangents, then transpose the linear half backwards */
  for (size_t i = 0; st == NB_OK && i < nout; i++) {
    nb_val *seed = ct_out ? ct_out[i] : (seed_first && i == 0 ? nb__zeros(dst, pout[0]->aval) : NULL);
    if (seed && !ct_out) seed = nb_full_like_at((nb_loc){0}, seed, 1.0);
    if (seed && tout[i] && w.linear[tout[i]->id]) st = accumulate(dst, &w, tout[i], seed, (nb_loc){0});
  }
  for (size_t k = ne; st == NB_OK && k-- > 0;) {
    const nb_eqn *e = nb__graph_eqn(w.t, k);
    if (e->nout && w.linear[e->out[0]->id]) st = transpose_eqn(dst, &w, e);
  }
  for (size_t i = 0; st == NB_OK && i < nin; i++) ct_in[i] = tin[i] ? w.ct[tin[i]->id] : NULL;

  if (st == NB_ERR_NOMEM && nb_graph_status(dst) == NB_OK) nb__fail(dst, (nb_loc){0}, st, "out of memory in reverse mode");
  work_free(&w);
  nb_dealloc(ctx, pin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, pout, (nout + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tout, (nout + 1) * sizeof(nb_val *));
  return st != NB_OK ? st : nb_graph_status(dst);
}

/* ---------------------------------------------------------------- public graphs */

static bool path_selected(const char *path, const char *prefix) {
  if (!prefix || !*prefix) return true;
  size_t n = strlen(prefix);
  while (n && prefix[n - 1] == '/') n--;
  return strncmp(path, prefix, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* Builds the reverse-mode graph shared by vjp, grad and value_and_grad. */
typedef enum grad_kind { KIND_VJP, KIND_GRAD, KIND_VALUE_AND_GRAD } grad_kind;

static nb_graph *build(nb_ctx *ctx, const nb_graph *g, const nb_grad_opts *opts, grad_kind kind) {
  if (!g) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "reverse mode: NULL graph"), NULL;
  if (nb_graph_status(g)) return nb_errorf(ctx, nb_graph_status(g), "reverse mode: graph is in error: %s", nb_graph_error(g)), NULL;
  size_t nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  const char *wrt_prefix = opts ? opts->wrt : NULL;
  bool has_aux = opts && opts->has_aux;
  if (kind != KIND_VJP) {
    if (nout == 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grad: the function has no outputs"), NULL;
    nb_aval a = nb__graph_output(g, 0)->aval;
    char s[128];
    if (!nb_dtype_is_float(a.dtype) || a.shape.rank != 0)
      return nb_errorf(ctx, NB_ERR_SHAPE, "grad: output '%s' must be a float scalar, not %s", nb_graph_output_path(g, 0),
                       nb_aval_str(&a, s, sizeof s)), NULL;
    if (nout > 1 && !has_aux)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grad: the function has %zu outputs; pass has_aux to return the others", nout), NULL;
  }
  bool *wrt = nb_calloc(ctx, nin + 1);
  nb_graph *d = nb_graph_create(ctx);
  nb_val **pin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *)), **ctin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *));
  nb_val **pout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *)), **ctout = NULL;
  nb_status st = wrt && d && pin && ctin && pout ? NB_OK : NB_ERR_NOMEM;
  size_t selected = 0;
  char path[1024];
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    wrt[i] = nb_dtype_is_float(nb__graph_input(g, i)->aval.dtype) && path_selected(nb_graph_input_path(g, i), wrt_prefix);
    selected += wrt[i];
    if (kind == KIND_VJP) snprintf(path, sizeof path, "primal/%s", nb_graph_input_path(g, i));
    else snprintf(path, sizeof path, "%s", nb_graph_input_path(g, i));
    pin[i] = nb__graph_add_input(d, path, nb__graph_input(g, i)->aval);
  }
  if (st == NB_OK && selected == 0 && kind != KIND_VJP)
    st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "grad: no float input matches wrt='%s'", wrt_prefix ? wrt_prefix : "(all)");
  if (st == NB_OK && kind == KIND_VJP) {
    if (!(ctout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *)))) st = NB_ERR_NOMEM;
    for (size_t i = 0; st == NB_OK && i < nout; i++) {
      nb_aval a = nb__graph_output(g, i)->aval;
      if (!nb_dtype_is_float(a.dtype)) continue;
      snprintf(path, sizeof path, "ct/%s", nb_graph_output_path(g, i));
      ctout[i] = nb__graph_add_input(d, path, a);
    }
  }
  if (st == NB_OK) st = nb_graph_status(d);
  if (st == NB_OK) st = nb__vjp_into(d, g, wrt, pin, ctout, kind != KIND_VJP, pout, ctin);
  for (size_t i = 0; st == NB_OK && i < nout; i++) {
    const char *p = nb_graph_output_path(g, i);
    if (kind == KIND_VJP) {
      snprintf(path, sizeof path, "primal/%s", p);
      st = nb__graph_add_output(d, path, pout[i]);
    } else if (i == 0) {
      if (kind == KIND_VALUE_AND_GRAD) st = nb__graph_add_output(d, "loss", pout[i]);
    } else {
      snprintf(path, sizeof path, "aux/%s", p);
      st = nb__graph_add_output(d, path, pout[i]);
    }
  }
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    if (!wrt[i]) continue;
    snprintf(path, sizeof path, "grad/%s", nb_graph_input_path(g, i));
    st = nb__graph_add_output(d, path, ctin[i] ? ctin[i] : nb__zeros(d, pin[i]->aval));
  }
  nb_dealloc(ctx, wrt, nin + 1);
  nb_dealloc(ctx, pin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, ctin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, pout, (nout + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, ctout, (nout + 1) * sizeof(nb_val *));
  if (st != NB_OK) {
    if (nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "reverse mode failed: %s", nb_status_name(st));
    nb_graph_destroy(d);
    return NULL;
  }
  nb_graph *live = nb__graph_dce(d);
  nb_graph_destroy(d);
  return nb__checked(live);
}

nb_graph *nb_value_and_grad(nb_ctx *ctx, const nb_graph *g, const nb_grad_opts *opts) {
  return build(ctx, g, opts, KIND_VALUE_AND_GRAD);
}
nb_graph *nb_grad(nb_ctx *ctx, const nb_graph *g, const nb_grad_opts *opts) { return build(ctx, g, opts, KIND_GRAD); }
nb_graph *nb_vjp(nb_ctx *ctx, const nb_graph *g) {
  nb_grad_opts all = {0};
  return build(ctx, g, &all, KIND_VJP);
}
nb_graph *nb__vjp_graph(nb_ctx *ctx, const nb_graph *g) { return nb_vjp(ctx, g); }
