/* Wrappers: transformations that take transformations (masked,
 * multi_transform, multi_steps, apply_if_finite, lookahead,
 * inject_hyperparams). Every conditional is a select on traced state, so a
 * wrapped step is one straight-line graph. Not here: chain (tx.c). */
#include <math.h>
#include <string.h>

#include "optim/internal.h"

#define CFG(ud) nb_optim__cfg *c = (nb_optim__cfg *)(ud)
#define NLEAF(t) nb_tree_size(t)
#define PATH(t, i) nb_tree_path(t, i)
#define LEAF(t, i) (nb_tree_leaf(t, i)->val)
#define TRY(expr)                                                                  \
  do {                                                                             \
    nb_status s_ = (expr);                                                         \
    if (s_) {                                                                      \
      st = s_;                                                                     \
      goto done;                                                                   \
    }                                                                              \
  } while (0)

static nb_status inner_init(const nb_optim_tx *tx, nb_graph *g, const nb_tree *params, nb_tree *state,
                            const char *prefix) {
  nb_tree *sub = nb_tree_create(nb_graph_ctx(g));
  nb_status s = sub ? tx->init(tx->ud, g, params, sub) : NB_ERR_NOMEM;
  if (!s) s = nb_tree_merge(state, prefix, sub);
  nb_tree_destroy(sub);
  return s;
}

/* Runs tx on the state under `prefix`; *u and *ns are new trees. */
static nb_status inner_update(const nb_optim_tx *tx, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const char *prefix, const nb_tree *params, nb_tree **u, nb_tree **ns) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *sub = nb_tree_select_prefix(state, prefix, true);
  *u = nb_tree_create(ctx);
  *ns = nb_tree_create(ctx);
  nb_status s = sub && *u && *ns ? tx->update(tx->ud, g, grads, sub, params, *u, *ns) : NB_ERR_NOMEM;
  nb_tree_destroy(sub);
  return s;
}

/* select(pred, a, b) leaf by leaf (same paths) into out under prefix */
static nb_status select_trees(nb_val *pred, const nb_tree *a, const nb_tree *b, nb_tree *out, const char *prefix) {
  for (size_t i = 0; i < NLEAF(a); i++) {
    nb_val *y = nb_tree_get_val(b, PATH(a, i));
    if (!y) return nb_errorf(nb_tree_ctx(out), NB_ERR_INTERNAL, "optim: '%s' missing in select", PATH(a, i));
    nb_status s = nb_optim__put(out, prefix, PATH(a, i), nb_select(pred, LEAF(a, i), y));
    if (s) return s;
  }
  return NB_OK;
}

static nb_optim_tx *wrap(nb_ctx *ctx, const char *name, nb_optim_tx *inner, nb_optim_init_fn init,
                         nb_optim_update_fn update, nb_optim__cfg **out) {
  if (!nb_optim__args_ok(ctx, name, 1, &inner, 0, NULL)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) {
    nb_optim_tx_destroy(inner);
    return NULL;
  }
  if (!nb_optim__cfg_take_kids(c, 1, &inner)) {
    nb_optim__cfg_free(c);
    return NULL;
  }
  *out = c;
  return nb_optim__make(ctx, name, init, update, c);
}

/* ---- masked ------------------------------------------------------------------- */

static bool mask_has(const nb_optim__cfg *c, const char *path) {
  return c->nregex ? nb_optim__cfg_match(c, 0, path) : c->pred(c->pred_ud, path);
}

static nb_tree *mask_tree(const nb_optim__cfg *c, const nb_tree *t) {
  nb_tree *out = nb_tree_create(c->ctx);
  for (size_t i = 0; out && i < NLEAF(t); i++)
    if (mask_has(c, PATH(t, i)) && nb_tree_set(out, PATH(t, i), *nb_tree_leaf(t, i))) {
      nb_tree_destroy(out);
      return NULL;
    }
  return out;
}

static nb_status masked_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_tree *p = mask_tree(c, params);
  nb_status s = p ? inner_init(c->kids[0], g, p, state, "inner") : NB_ERR_NOMEM;
  nb_tree_destroy(p);
  return s;
}

static nb_status masked_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                               const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status st = NB_OK;
  nb_tree *mg = mask_tree(c, grads), *mp = params ? mask_tree(c, params) : NULL, *u = NULL, *ns = NULL;
  if (!mg || (params && !mp)) TRY(NB_ERR_NOMEM);
  TRY(inner_update(c->kids[0], g, mg, state, "inner", mp, &u, &ns));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *v = nb_tree_get_val(u, PATH(grads, i));
    TRY(nb_tree_set_val(updates, PATH(grads, i), v ? v : LEAF(grads, i)));
  }
  TRY(nb_tree_merge(new_state, "inner", ns));
done:
  nb_tree_destroy(mg);
  nb_tree_destroy(mp);
  nb_tree_destroy(u);
  nb_tree_destroy(ns);
  return st;
}

nb_optim_tx *nb_optim_masked(nb_ctx *ctx, nb_optim_tx *inner, const char *regex, nb_optim_path_pred pred, void *ud) {
  if (!regex && !pred) {
    nb_optim_tx_destroy(inner);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "masked: needs a regex or a predicate");
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = wrap(ctx, "masked", inner, masked_init, masked_update, &c);
  if (!tx) return NULL;
  c->pred = pred;
  c->pred_ud = ud;
  if (regex && !nb_optim__cfg_add_regex(c, regex, "masked")) {
    nb_optim_tx_destroy(tx);
    return NULL;
  }
  return tx;
}

/* ---- multi_transform ---------------------------------------------------------- */

static int label_of(const nb_optim__cfg *c, const char *path) {
  if (c->label) return c->label(c->pred_ud, path);
  for (int i = 0; i < c->nregex; i++)
    if (nb_optim__cfg_match(c, i, path)) return i;
  return -1;
}

/* The leaves of t labelled k (an error for labels out of range). */
static nb_status group(const nb_optim__cfg *c, const nb_tree *t, int k, nb_tree **out) {
  *out = nb_tree_create(c->ctx);
  for (size_t i = 0; *out && i < NLEAF(t); i++) {
    int l = label_of(c, PATH(t, i));
    if (l < 0 || l >= c->nkids)
      return nb_errorf(c->ctx, NB_ERR_INVALID_ARG, "multi_transform: parameter '%s' has label %d, not in [0, %d)",
                       PATH(t, i), l, c->nkids);
    nb_status s = l == k ? nb_tree_set(*out, PATH(t, i), *nb_tree_leaf(t, i)) : NB_OK;
    if (s) return s;
  }
  return *out ? NB_OK : NB_ERR_NOMEM;
}

static nb_status multi_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = NB_OK;
  for (int k = 0; s == NB_OK && k < c->nkids; k++) {
    nb_tree *p = NULL;
    char pre[16];
    snprintf(pre, sizeof pre, "%d", k);
    s = group(c, params, k, &p);
    if (!s) s = inner_init(c->kids[k], g, p, state, pre);
    nb_tree_destroy(p);
  }
  return s;
}

static nb_status multi_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_tree *all = nb_tree_create(c->ctx);
  nb_status st = all ? NB_OK : NB_ERR_NOMEM;
  for (int k = 0; st == NB_OK && k < c->nkids; k++) {
    nb_tree *gk = NULL, *pk = NULL, *u = NULL, *ns = NULL;
    char pre[16];
    snprintf(pre, sizeof pre, "%d", k);
    st = group(c, grads, k, &gk);
    if (!st && params) st = group(c, params, k, &pk);
    if (!st) st = inner_update(c->kids[k], g, gk, state, pre, pk, &u, &ns);
    if (!st) st = nb_tree_merge(all, NULL, u);
    if (!st) st = nb_tree_merge(new_state, pre, ns);
    nb_tree_destroy(gk);
    nb_tree_destroy(pk);
    nb_tree_destroy(u);
    nb_tree_destroy(ns);
  }
  for (size_t i = 0; st == NB_OK && i < NLEAF(grads); i++) /* in the grads' order */
    st = nb_tree_set_val(updates, PATH(grads, i), nb_tree_get_val(all, PATH(grads, i)));
  nb_tree_destroy(all);
  return st;
}

static nb_optim_tx *multi_make(nb_ctx *ctx, int n, nb_optim_tx *const *txs, nb_optim__cfg **out) {
  if (n <= 0 || !txs) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "multi_transform: needs at least one transformation (got %d)", n);
    return NULL;
  }
  if (!nb_optim__args_ok(ctx, "multi_transform", n, txs, 0, NULL)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) {
    for (int i = 0; i < n; i++) nb_optim_tx_destroy(txs[i]);
    return NULL;
  }
  if (!nb_optim__cfg_take_kids(c, n, txs)) {
    nb_optim__cfg_free(c);
    return NULL;
  }
  *out = c;
  return nb_optim__make(ctx, "multi_transform", multi_init, multi_update, c);
}

nb_optim_tx *nb_optim_multi_transform(nb_ctx *ctx, int n, nb_optim_tx *const *txs, nb_optim_label_fn label,
                                      void *ud) {
  if (!label) {
    for (int i = 0; txs && i < n; i++) nb_optim_tx_destroy(txs[i]);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "multi_transform: needs a label function");
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = multi_make(ctx, n, txs, &c);
  if (tx) {
    c->label = label;
    c->pred_ud = ud;
  }
  return tx;
}

nb_optim_tx *nb_optim_multi_transform_regex(nb_ctx *ctx, int n, nb_optim_tx *const *txs,
                                            const char *const *regexes) {
  if (!regexes) {
    for (int i = 0; txs && i < n; i++) nb_optim_tx_destroy(txs[i]);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "multi_transform: needs n regexes");
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = multi_make(ctx, n, txs, &c);
  for (int i = 0; tx && i < n; i++)
    if (!nb_optim__cfg_add_regex(c, regexes[i], "multi_transform")) {
      nb_optim_tx_destroy(tx);
      return NULL;
    }
  return tx;
}

/* ---- multi_steps -------------------------------------------------------------- */

static nb_status msteps_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = nb_optim__put(state, "mini_step", NULL, nb_optim__count_zero(g));
  if (!s) s = nb_optim__put(state, "gradient_step", NULL, nb_optim__count_zero(g));
  for (size_t i = 0; !s && i < NLEAF(params); i++) {
    nb_aval a = nb_val_aval(LEAF(params, i));
    s = nb_optim__put(state, "acc_grads", PATH(params, i), nb_full(g, nb_optim__scalar_dtype_of(a.dtype), a.shape.rank, a.shape.dims, 0));
  }
  if (!s) s = inner_init(c->kids[0], g, params, state, "inner");
  return s;
}

static nb_status msteps_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                               const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status st = NB_OK;
  nb_tree *acc = nb_tree_create(c->ctx), *accg = nb_tree_create(c->ctx), *u = NULL, *ns = NULL, *old = NULL;
  nb_val *mini = nb_optim__state(c->ctx, state, "mini_step", NULL);
  nb_val *gstep = nb_optim__state(c->ctx, state, "gradient_step", NULL);
  if (!acc || !accg) TRY(NB_ERR_NOMEM);
  if (!mini || !gstep) TRY(nb_ctx_status(c->ctx));
  nb_val *k = nb_scalar(g, NB_I32, (double)c->k[0]);
  nb_val *emit = nb_eq(mini, nb_sub(k, nb_scalar(g, NB_I32, 1)));
  nb_val *n1 = nb_convert(nb_add(mini, nb_scalar(g, NB_I32, 1)), nb_optim__scalar_dtype(grads));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *a0 = nb_optim__state(c->ctx, state, "acc_grads", p), *gr = LEAF(grads, i);
    if (!a0) TRY(nb_ctx_status(c->ctx));
    nb_val *a = nb_add(a0, nb_div(nb_sub(nb_convert(gr, nb_val_dtype(a0)), a0), nb_convert(n1, nb_val_dtype(a0)))); /* running mean */
    TRY(nb_tree_set_val(acc, p, a));
    TRY(nb_tree_set_val(accg, p, nb_convert(a, nb_val_dtype(gr))));
    TRY(nb_optim__put(new_state, "acc_grads", p, nb_select(emit, nb_full_like(a, 0), a)));
  }
  TRY(inner_update(c->kids[0], g, accg, state, "inner", params, &u, &ns));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *v = nb_tree_get_val(u, PATH(grads, i));
    TRY(nb_tree_set_val(updates, PATH(grads, i), nb_select(emit, v, nb_full_like(v, 0))));
  }
  old = nb_tree_select_prefix(state, "inner", true);
  if (!old) TRY(NB_ERR_NOMEM);
  TRY(select_trees(emit, ns, old, new_state, "inner"));
  TRY(nb_optim__put(new_state, "mini_step", NULL, nb_rem(nb_optim__count_inc(mini), k)));
  TRY(nb_optim__put(new_state, "gradient_step", NULL, nb_select(emit, nb_optim__count_inc(gstep), gstep)));
done:
  nb_tree_destroy(acc);
  nb_tree_destroy(accg);
  nb_tree_destroy(u);
  nb_tree_destroy(ns);
  nb_tree_destroy(old);
  return st;
}

nb_optim_tx *nb_optim_multi_steps(nb_ctx *ctx, nb_optim_tx *inner, int64_t every_k) {
  if (every_k < 1 || every_k > 2147483647) {
    nb_optim_tx_destroy(inner);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "multi_steps: every_k must be in [1, 2^31), got %lld", (long long)every_k);
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = wrap(ctx, "multi_steps", inner, msteps_init, msteps_update, &c);
  if (tx) c->k[0] = every_k;
  return tx;
}

/* ---- apply_if_finite ---------------------------------------------------------- */

static nb_status finite_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = nb_optim__put(state, "notfinite_count", NULL, nb_optim__count_zero(g));
  if (!s) s = nb_optim__put(state, "last_finite", NULL, nb_scalar(g, NB_BOOL, 1));
  if (!s) s = nb_optim__put(state, "total_notfinite", NULL, nb_optim__count_zero(g));
  if (!s) s = inner_init(c->kids[0], g, params, state, "inner");
  return s;
}

static nb_status finite_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                               const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status st = NB_OK;
  nb_tree *u = NULL, *ns = NULL, *old = NULL;
  nb_val *nfc = nb_optim__state(c->ctx, state, "notfinite_count", NULL);
  nb_val *tot = nb_optim__state(c->ctx, state, "total_notfinite", NULL);
  if (!nfc || !tot) TRY(nb_ctx_status(c->ctx));
  nb_val *bad = nb_scalar(g, NB_I32, 0);
  for (size_t i = 0; i < NLEAF(grads); i++)
    bad = nb_max(bad, nb_reduce_max(nb_convert(nb_not(nb_is_finite(LEAF(grads, i))), NB_I32), 0, NULL));
  nb_val *finite = nb_eq(bad, nb_scalar(g, NB_I32, 0));
  nb_val *nfc1 = nb_select(finite, nb_scalar(g, NB_I32, 0), nb_optim__count_inc(nfc));
  nb_val *apply = nb_or(finite, nb_gt(nfc1, nb_scalar(g, NB_I32, (double)c->k[0])));
  TRY(inner_update(c->kids[0], g, grads, state, "inner", params, &u, &ns));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *v = nb_tree_get_val(u, PATH(grads, i));
    TRY(nb_tree_set_val(updates, PATH(grads, i), nb_select(apply, v, nb_full_like(v, 0))));
  }
  old = nb_tree_select_prefix(state, "inner", true);
  if (!old) TRY(NB_ERR_NOMEM);
  TRY(select_trees(apply, ns, old, new_state, "inner"));
  TRY(nb_optim__put(new_state, "notfinite_count", NULL, nfc1));
  TRY(nb_optim__put(new_state, "last_finite", NULL, finite));
  TRY(nb_optim__put(new_state, "total_notfinite", NULL, nb_select(finite, tot, nb_optim__count_inc(tot))));
done:
  nb_tree_destroy(u);
  nb_tree_destroy(ns);
  nb_tree_destroy(old);
  return st;
}

nb_optim_tx *nb_optim_apply_if_finite(nb_ctx *ctx, nb_optim_tx *inner, int64_t max_consecutive_errors) {
  if (max_consecutive_errors < 0 || max_consecutive_errors > 2147483647) {
    nb_optim_tx_destroy(inner);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "apply_if_finite: max_consecutive_errors must be in [0, 2^31), got %lld",
              (long long)max_consecutive_errors);
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = wrap(ctx, "apply_if_finite", inner, finite_init, finite_update, &c);
  if (tx) c->k[0] = max_consecutive_errors;
  return tx;
}

/* ---- lookahead ---------------------------------------------------------------- */

static nb_status look_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = nb_optim__put(state, "steps", NULL, nb_optim__count_zero(g));
  if (!s) s = nb_tree_merge(state, "slow", params);
  if (!s) s = inner_init(c->kids[0], g, params, state, "inner");
  return s;
}

static nb_status look_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status st = nb_optim__need_params(c->ctx, "lookahead", params);
  nb_tree *u = NULL, *ns = NULL;
  if (st) return st;
  nb_val *steps = nb_optim__state(c->ctx, state, "steps", NULL);
  if (!steps) return nb_ctx_status(c->ctx);
  nb_val *k = nb_scalar(g, NB_I32, (double)c->k[0]);
  nb_val *sync = nb_eq(steps, nb_sub(k, nb_scalar(g, NB_I32, 1)));
  TRY(inner_update(c->kids[0], g, grads, state, "inner", params, &u, &ns));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *fu = nb_tree_get_val(u, p), *pv = nb_tree_get_val(params, p);
    nb_val *slow = nb_optim__state(c->ctx, state, "slow", p);
    if (!slow) TRY(nb_ctx_status(c->ctx));
    nb_val *fast = nb_add(pv, fu);
    nb_val *ns_slow = nb_add(slow, nb_mul(nb_optim__k(slow, c->h[0]), nb_sub(fast, slow)));
    TRY(nb_tree_set_val(updates, p, nb_select(sync, nb_sub(ns_slow, pv), fu)));
    TRY(nb_optim__put(new_state, "slow", p, nb_select(sync, ns_slow, slow)));
  }
  TRY(nb_tree_merge(new_state, "inner", ns));
  TRY(nb_optim__put(new_state, "steps", NULL, nb_rem(nb_optim__count_inc(steps), k)));
done:
  nb_tree_destroy(u);
  nb_tree_destroy(ns);
  return st;
}

nb_optim_tx *nb_optim_lookahead(nb_ctx *ctx, nb_optim_tx *inner, int64_t sync_period, double slow_step_size) {
  if (sync_period < 1 || sync_period > 2147483647 || !(slow_step_size >= 0 && slow_step_size <= 1)) {
    nb_optim_tx_destroy(inner);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "lookahead: sync_period must be >= 1 and slow_step_size in [0, 1] (got %lld, %g)",
              (long long)sync_period, slow_step_size);
    return NULL;
  }
  nb_optim__cfg *c = NULL;
  nb_optim_tx *tx = wrap(ctx, "lookahead", inner, look_init, look_update, &c);
  if (tx) {
    c->k[0] = sync_period;
    c->h[0] = slow_step_size;
  }
  return tx;
}

/* ---- inject_hyperparams ------------------------------------------------------- */

static nb_status inject_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = nb_optim__put(state, "count", NULL, nb_optim__count_zero(g));
  for (int i = 0; !s && i < c->nnames; i++)
    s = nb_optim__put(state, "hyperparams", c->names[i],
                      nb_optim_schedule_trace(c->values[i], nb_optim__count_zero(g)));
  if (!s) s = inner_init(c->kids[0], g, params, state, "inner");
  return s;
}

static nb_status inject_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                               const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status st = NB_OK;
  nb_tree *u = NULL, *ns = NULL;
  nb_val *count = nb_optim__state(c->ctx, state, "count", NULL);
  if (!count) return nb_ctx_status(c->ctx);
  for (int i = 0; i < c->nnames; i++) {
    nb_val *v = nb_optim_schedule_is_constant(c->values[i])
                    ? nb_optim__state(c->ctx, state, "hyperparams", c->names[i])
                    : nb_optim_schedule_trace(c->values[i], count);
    if (!v) TRY(nb_ctx_status(c->ctx) ? nb_ctx_status(c->ctx) : NB_ERR_INTERNAL);
    c->cells[i] = v;
    TRY(nb_optim__put(new_state, "hyperparams", c->names[i], v));
  }
  TRY(inner_update(c->kids[0], g, grads, state, "inner", params, &u, &ns));
  TRY(nb_tree_merge(updates, NULL, u));
  TRY(nb_tree_merge(new_state, "inner", ns));
  TRY(nb_optim__put(new_state, "count", NULL, nb_optim__count_inc(count)));
done:
  for (int i = 0; i < c->nnames; i++) c->cells[i] = NULL;
  nb_tree_destroy(u);
  nb_tree_destroy(ns);
  return st;
}

nb_optim_tx *nb_optim_inject_hyperparams(nb_ctx *ctx, nb_optim_factory make, void *ud, int n,
                                         const char *const *names, nb_optim_schedule *const *values) {
  if (n < 1 || n > 64 || !make || !names || !values) {
    for (int i = 0; values && i < n && i < 64; i++) nb_optim_schedule_destroy(values[i]);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "inject_hyperparams: needs a factory and 1..64 named values (got %d)", n);
    return NULL;
  }
  if (!nb_optim__args_ok(ctx, "inject_hyperparams", 0, NULL, n, values)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  nb_optim_schedule *slots[64] = {0};
  if (c) {
    c->names = nb_calloc(ctx, sizeof(char *) * (size_t)n);
    c->values = nb_calloc(ctx, sizeof(nb_optim_schedule *) * (size_t)n);
    c->cells = nb_calloc(ctx, sizeof(nb_val *) * (size_t)n);
  }
  if (!c || !c->names || !c->values || !c->cells) {
    for (int i = 0; i < n; i++) nb_optim_schedule_destroy(values[i]);
    if (c) c->nnames = 0;
    nb_optim__cfg_free(c);
    return NULL;
  }
  c->nnames = n;
  bool ok = true;
  for (int i = 0; i < n; i++) {
    c->values[i] = values[i];
    size_t len = names[i] ? strlen(names[i]) : 0;
    if (!len || strchr(names[i], '/')) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "inject_hyperparams: name %d is empty or contains '/'", i);
      ok = false;
      continue;
    }
    c->names[i] = nb_alloc(ctx, len + 1);
    if (!c->names[i]) {
      ok = false;
      continue;
    }
    memcpy(c->names[i], names[i], len + 1);
    slots[i] = nb_optim__slot(ctx, &c->cells[i], nb_optim_schedule_eval(values[i], 0));
    ok = ok && slots[i];
  }
  nb_optim_tx *inner = NULL;
  if (ok) {
    inner = make(ctx, slots, ud); /* takes the slots */
    if (!inner && nb_ctx_status(ctx) == NB_OK)
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "inject_hyperparams: the factory returned NULL");
  } else {
    for (int i = 0; i < n; i++) nb_optim_schedule_destroy(slots[i]);
  }
  if (!inner || !nb_optim__cfg_take_kids(c, 1, &inner)) {
    nb_optim__cfg_free(c);
    return NULL;
  }
  return nb_optim__make(ctx, "inject_hyperparams", inject_init, inject_update, c);
}
