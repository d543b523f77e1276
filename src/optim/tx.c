/* Gradient transformations as objects: creation and destruction, the traced
 * entry points (init, update with tree checks, apply_updates), chain, the
 * host conveniences that run a step through the interpreter, the shared
 * traced helpers and the tree utilities. Not here: the individual
 * transformations (transforms.c, wrappers.c, alias.c). */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "optim/internal.h"

/* ---- objects -------------------------------------------------------------- */

nb_optim_tx *nb_optim_tx_create(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                                void *ud, void (*free_ud)(void *ud)) {
  if (!ctx) return NULL;
  if (!init || !update) {
    if (free_ud) free_ud(ud);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "optim: transformation '%s' needs init and update functions",
              name ? name : "?");
    return NULL;
  }
  nb_optim_tx *tx = nb_calloc(ctx, sizeof *tx);
  if (!tx) {
    if (free_ud) free_ud(ud);
    return NULL;
  }
  tx->ctx = ctx;
  snprintf(tx->name, sizeof tx->name, "%s", name ? name : "custom");
  tx->init = init;
  tx->update = update;
  tx->ud = ud;
  tx->free_ud = free_ud;
  return tx;
}

void nb_optim_tx_destroy(nb_optim_tx *tx) {
  if (!tx) return;
  if (tx->free_ud) tx->free_ud(tx->ud);
  nb_dealloc(tx->ctx, tx, sizeof *tx);
}

const char *nb_optim_tx_name(const nb_optim_tx *tx) { return tx ? tx->name : ""; }

nb_optim__cfg *nb_optim__cfg_new(nb_ctx *ctx) {
  nb_optim__cfg *c = nb_calloc(ctx, sizeof *c);
  if (c) c->ctx = ctx;
  return c;
}

void nb_optim__cfg_free(void *p) {
  nb_optim__cfg *c = p;
  if (!c) return;
  nb_ctx *ctx = c->ctx;
  nb_optim_schedule_destroy(c->sched);
  for (int i = 0; i < c->nkids; i++) nb_optim_tx_destroy(c->kids[i]);
  if (c->kids) nb_dealloc(ctx, c->kids, sizeof(nb_optim_tx *) * (size_t)c->nkids);
  for (int i = 0; i < c->nregex; i++) regfree(&c->regexes[i]);
  if (c->regexes) nb_dealloc(ctx, c->regexes, sizeof(regex_t) * (size_t)c->nregex);
  for (int i = 0; i < c->nnames; i++) {
    if (c->names && c->names[i]) nb_dealloc(ctx, c->names[i], strlen(c->names[i]) + 1);
    if (c->values) nb_optim_schedule_destroy(c->values[i]);
  }
  if (c->names) nb_dealloc(ctx, c->names, sizeof(char *) * (size_t)c->nnames);
  if (c->values) nb_dealloc(ctx, c->values, sizeof(nb_optim_schedule *) * (size_t)c->nnames);
  if (c->cells) nb_dealloc(ctx, c->cells, sizeof(nb_val *) * (size_t)c->nnames);
  nb_dealloc(ctx, c, sizeof *c);
}

nb_optim_tx *nb_optim__make(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                            nb_optim__cfg *cfg) {
  if (!cfg) return NULL;
  return nb_optim_tx_create(ctx, name, init, update, cfg, nb_optim__cfg_free);
}

/* ---- input-bound hyperparameters ----------------------------------------- */

/* The built-in blocks of tx, each before its kids, in chain order: each is
 * given its first element of the vector (and, with cell, bound to it; with
 * rec, its numbers recorded). Returns the next free element. */
static int walk_numbers(const nb_optim_tx *tx, int at, nb_val *const *cell, int hlen, double *rec) {
  if (!tx || tx->free_ud != nb_optim__cfg_free) return at; /* a user's transformation keeps its numbers */
  nb_optim__cfg *c = tx->ud;
  if (cell) {
    c->hcell = cell;
    c->at = at;
    c->hlen = hlen;
  }
  for (int i = 0; rec && i < c->nh; i++) rec[at + i] = c->h[i];
  at += c->nh;
  for (int k = 0; k < c->nkids; k++) at = walk_numbers(c->kids[k], at, cell, hlen, rec);
  return at;
}

nb_optim_tx *nb_optim_tx_from_input(nb_ctx *ctx, nb_optim_tx *tx, nb_val *const *cell) {
  if (!tx || !cell) {
    nb_optim_tx_destroy(tx);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "tx_from_input: NULL transformation or cell"), NULL;
  }
  walk_numbers(tx, 0, cell, walk_numbers(tx, 0, NULL, 0, NULL), NULL);
  return tx;
}

nb_array *nb_optim_tx_inputs(nb_ctx *ctx, const nb_optim_tx *tx) {
  if (!tx) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "tx inputs: NULL transformation"), NULL;
  int64_t n = walk_numbers(tx, 0, NULL, 0, NULL);
  nb_array *a = nb_array_empty(ctx, NB_F64, 1, &n);
  if (a) walk_numbers(tx, 0, NULL, 0, nb_array_data_mut(a));
  return a;
}

bool nb_optim__cfg_take_kids(nb_optim__cfg *c, int n, nb_optim_tx *const *kids) {
  c->kids = nb_calloc(c->ctx, sizeof(nb_optim_tx *) * (size_t)n);
  if (!c->kids) {
    for (int i = 0; i < n; i++) nb_optim_tx_destroy(kids[i]);
    return false;
  }
  c->nkids = n;
  memcpy(c->kids, kids, sizeof(nb_optim_tx *) * (size_t)n);
  return true;
}

bool nb_optim__cfg_add_regex(nb_optim__cfg *c, const char *regex, const char *what) {
  regex_t re;
  int rc = regcomp(&re, regex ? regex : "", REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char msg[128];
    regerror(rc, &re, msg, sizeof msg);
    nb_errorf(c->ctx, NB_ERR_INVALID_ARG, "%s: bad regex '%s': %s", what, regex ? regex : "", msg);
    return false;
  }
  regex_t *r = nb_calloc(c->ctx, sizeof(regex_t) * (size_t)(c->nregex + 1));
  if (!r) {
    regfree(&re);
    return false;
  }
  if (c->regexes) {
    memcpy(r, c->regexes, sizeof(regex_t) * (size_t)c->nregex);
    nb_dealloc(c->ctx, c->regexes, sizeof(regex_t) * (size_t)c->nregex);
  }
  r[c->nregex++] = re;
  c->regexes = r;
  return true;
}

bool nb_optim__cfg_match(const nb_optim__cfg *c, int i, const char *path) {
  return regexec(&c->regexes[i], path, 0, NULL, 0) == 0;
}

bool nb_optim__check(nb_ctx *ctx, const char *fn, const char *name, double v, double lo, bool strict) {
  if (isfinite(v) && (strict ? v > lo : v >= lo)) return true;
  nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s must be %s %g, got %g", fn, name, strict ? ">" : ">=", lo, v);
  return false;
}

bool nb_optim__args_ok(nb_ctx *ctx, const char *fn, int ntx, nb_optim_tx *const *txs, int nsched,
                       nb_optim_schedule *const *scheds) {
  bool ok = true;
  for (int i = 0; i < ntx; i++) ok = ok && txs[i];
  for (int i = 0; i < nsched; i++) ok = ok && scheds[i];
  if (ok) return true;
  for (int i = 0; i < ntx; i++) nb_optim_tx_destroy(txs[i]);
  for (int i = 0; i < nsched; i++) nb_optim_schedule_destroy(scheds[i]);
  if (ctx && nb_ctx_status(ctx) == NB_OK)
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: a transformation or schedule argument is NULL", fn);
  return false;
}

/* ---- traced helpers ------------------------------------------------------- */

bool nb_optim__join(char *buf, const char *a, const char *b) {
  int n = b ? snprintf(buf, NB_OPTIM_PATH_MAX, "%s/%s", a, b) : snprintf(buf, NB_OPTIM_PATH_MAX, "%s", a);
  return n > 0 && n < NB_OPTIM_PATH_MAX;
}

nb_val *nb_optim__state(nb_ctx *ctx, const nb_tree *state, const char *prefix, const char *path) {
  char p[NB_OPTIM_PATH_MAX];
  if (!nb_optim__join(p, prefix, path)) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "optim: state path '%s/%s' is too long", prefix, path ? path : "");
    return NULL;
  }
  nb_val *v = nb_tree_get_val(state, p);
  if (!v)
    nb_errorf(ctx, NB_ERR_NOT_FOUND,
              "optim: the optimizer state has no value at '%s' (state built for other parameters or another "
              "optimizer?)",
              p);
  return v;
}

nb_status nb_optim__put(nb_tree *t, const char *prefix, const char *path, nb_val *v) {
  char p[NB_OPTIM_PATH_MAX];
  nb_ctx *ctx = nb_tree_ctx(t);
  if (!nb_optim__join(p, prefix, path))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "optim: state path '%s/%s' is too long", prefix, path ? path : "");
  if (!v) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : nb_errorf(ctx, NB_ERR_INTERNAL, "optim: NULL at %s", p);
  return nb_tree_set_val(t, p, v);
}

nb_status nb_optim__need_params(nb_ctx *ctx, const char *name, const nb_tree *params) {
  if (params) return NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: needs params (pass the parameter tree to update)", name);
}

nb_status nb_optim__graph_status(nb_ctx *ctx, nb_graph *g) {
  nb_status s = nb_graph_status(g);
  if (s == NB_OK || nb_ctx_status(ctx) == s) return s;
  return nb_errorf(ctx, s, "%s", nb_graph_error(g));
}

nb_val *nb_optim__k(nb_val *x, double c) {
  if (!x) return NULL;
  return nb_scalar(nb_val_graph(x), nb_val_dtype(x), c);
}

nb_val *nb_optim__count_zero(nb_graph *g) { return nb_scalar(g, NB_I32, 0); }

nb_val *nb_optim__count_inc(nb_val *c) {
  if (!c) return NULL;
  nb_val *top = nb_optim__k(c, 2147483647.0);
  return nb_select(nb_lt(c, top), nb_add(c, nb_optim__k(c, 1)), c);
}

nb_optim__hp nb_optim__hp_get(const nb_optim__cfg *c, nb_graph *g, int i) {
  nb_optim__hp x = {c->h[i], NULL};
  nb_val *vec = c->hcell ? *c->hcell : NULL;
  if (i >= c->nh || !vec || nb_val_graph(vec) != g) return x; /* not bound here: the constant */
  if (nb_val_rank(vec) != 1 || nb_val_dim(vec, 0) != c->hlen || nb_val_dtype(vec) != NB_F64) {
    x.v = nb_graph_fail_at(NB_HERE, g, NB_ERR_SHAPE, "optim: the hyperparameter input must be an f64 vector of %d numbers "
                   "(nb_optim_tx_inputs)", c->hlen);
    return x;
  }
  int64_t lo[1] = {c->at + i}, hi[1] = {c->at + i + 1};
  x.v = nb_reshape(nb_slice(vec, lo, hi, NULL), 0, NULL);
  return x;
}

nb_optim__hp nb_optim__hp_rsub(double a, nb_optim__hp x) {
  return (nb_optim__hp){a - x.d, x.v ? nb_sub(nb_scalar(nb_val_graph(x.v), NB_F64, a), x.v) : NULL};
}

nb_val *nb_optim__hk(nb_val *like, nb_optim__hp x) {
  if (!like) return NULL;
  return x.v ? nb_convert(x.v, nb_val_dtype(like)) : nb_optim__k(like, x.d);
}

nb_val *nb_optim__moment_hp(nb_val *g, nb_val *m, nb_optim__hp decay, int order) {
  nb_val *gp = order == 1 ? g : nb_mul(g, g);
  return nb_add(nb_mul(nb_optim__hk(gp, nb_optim__hp_rsub(1, decay)), gp), nb_mul(nb_optim__hk(m, decay), m));
}

nb_val *nb_optim__moment(nb_val *g, nb_val *m, double decay, int order) {
  return nb_optim__moment_hp(g, m, (nb_optim__hp){decay, NULL}, order);
}

nb_val *nb_optim__bias_correct_hp(nb_val *m, nb_optim__hp decay, nb_val *count) {
  if (!m || !count) return NULL;
  nb_dtype t = nb_val_dtype(m);
  nb_val *pw = nb_pow(nb_optim__hk(m, decay), nb_convert(count, t));
  return nb_div(m, nb_sub(nb_optim__k(m, 1), pw));
}

nb_val *nb_optim__bias_correct(nb_val *m, double decay, nb_val *count) {
  return nb_optim__bias_correct_hp(m, (nb_optim__hp){decay, NULL}, count);
}

nb_dtype nb_optim__scalar_dtype_of(nb_dtype leaf) { return leaf == NB_F64 ? NB_F64 : NB_F32; }

nb_dtype nb_optim__scalar_dtype(const nb_tree *t) {
  for (size_t i = 0; t && i < nb_tree_size(t); i++) {
    if (nb_leaf_get_aval(nb_tree_leaf(t, i)).dtype == NB_F64) return NB_F64;
  }
  return NB_F32;
}

nb_val *nb_optim__sum_sq(nb_val *x) {
  if (!x) return NULL;
  nb_val *xf = nb_convert(x, nb_optim__scalar_dtype_of(nb_val_dtype(x)));
  return nb_reduce_sum(nb_mul(xf, xf), 0, NULL);
}

nb_val *nb_optim__as(nb_val *s, nb_dtype t) { return nb_convert(s, t); }

/* ---- entry points --------------------------------------------------------- */

static nb_status need_vals(nb_ctx *ctx, const nb_tree *t, const char *what) {
  if (!t) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "optim: %s tree is NULL", what);
  for (size_t i = 0; i < nb_tree_size(t); i++)
    if (nb_tree_leaf(t, i)->kind != NB_LEAF_VAL)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "optim: %s leaf '%s' is not a traced value", what,
                       nb_tree_path(t, i));
  return NB_OK;
}

nb_status nb_optim_init(const nb_optim_tx *tx, nb_graph *g, const nb_tree *params, nb_tree *state) {
  if (!g) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!tx || !state) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_init: NULL transformation or state tree");
  nb_status s = need_vals(ctx, params, "params");
  if (s) return s;
  s = tx->init(tx->ud, g, params, state);
  return s ? s : nb_optim__graph_status(ctx, g);
}

/* The state paths and avals init would give for these params, checked
 * against `state` on a scratch graph. */
static nb_status check_state(const nb_optim_tx *tx, nb_ctx *ctx, const nb_tree *params, const nb_tree *state) {
  nb_graph *g = nb_graph_create(ctx);
  nb_tree *pin = nb_tree_create(ctx), *want = nb_tree_create(ctx);
  nb_status s = g && pin && want ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; s == NB_OK && i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i);
    s = nb_tree_set_val(pin, p, nb_graph_input(g, p, nb_leaf_get_aval(nb_tree_leaf(params, i))));
  }
  if (s == NB_OK) s = tx->init(tx->ud, g, pin, want);
  if (s == NB_OK) s = nb_optim__graph_status(ctx, g);
  if (s == NB_OK) {
    for (size_t i = 0; s == NB_OK && i < nb_tree_size(want); i++) {
      const char *p = nb_tree_path(want, i);
      const nb_leaf *l = nb_tree_get(state, p);
      nb_aval a = nb_leaf_get_aval(nb_tree_leaf(want, i));
      if (!l) {
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: optimizer state lacks '%s' (state from another optimizer or "
                      "parameter tree?)", tx->name, p);
      } else {
        nb_aval b = nb_leaf_get_aval(l);
        if (!nb_aval_equal(&a, &b)) {
          char s1[96], s2[96];
          s = nb_errorf(ctx, NB_ERR_SHAPE, "%s: optimizer state '%s' is %s, expected %s", tx->name, p,
                        nb_aval_str(&b, s1, sizeof s1), nb_aval_str(&a, s2, sizeof s2));
        }
      }
    }
    if (s == NB_OK && nb_tree_size(want) != nb_tree_size(state))
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: optimizer state has %zu leaves, expected %zu", tx->name,
                    nb_tree_size(state), nb_tree_size(want));
  }
  nb_tree_destroy(pin);
  nb_tree_destroy(want);
  nb_graph_destroy(g);
  return s;
}

nb_status nb_optim_update(const nb_optim_tx *tx, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                          const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  if (!g) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!tx || !updates || !new_state)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_update: NULL transformation or output tree");
  nb_status s = need_vals(ctx, grads, "grads");
  if (!s) s = need_vals(ctx, state, "state");
  if (!s && params) s = need_vals(ctx, params, "params");
  if (!s && params) s = nb_tree_check_same(ctx, grads, params, true, "grads and params");
  for (size_t i = 0; !s && i < nb_tree_size(grads); i++)
    if (!nb_dtype_is_float(nb_val_dtype(nb_tree_leaf(grads, i)->val)))
      s = nb_errorf(ctx, NB_ERR_DTYPE, "%s: gradient '%s' is %s, not a float", tx->name, nb_tree_path(grads, i),
                    nb_dtype_name(nb_val_dtype(nb_tree_leaf(grads, i)->val)));
  if (!s) s = check_state(tx, ctx, params ? params : grads, state);
  if (!s) s = tx->update(tx->ud, g, grads, state, params, updates, new_state);
  return s ? s : nb_optim__graph_status(ctx, g);
}

nb_status nb_optim_apply_updates(nb_graph *g, const nb_tree *params, const nb_tree *updates, nb_tree *new_params) {
  if (!g) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!params || !updates || !new_params)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_apply_updates: NULL tree");
  nb_status s = nb_tree_check_same(ctx, params, updates, false, "params and updates");
  for (size_t i = 0; !s && i < nb_tree_size(params); i++) {
    nb_val *p = nb_tree_leaf(params, i)->val, *u = nb_tree_leaf(updates, i)->val;
    if (!p || !u) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_apply_updates: '%s' is not a traced value",
                                   nb_tree_path(params, i));
    s = nb_tree_set_val(new_params, nb_tree_path(params, i), nb_add(p, nb_convert(u, nb_val_dtype(p))));
  }
  return s ? s : nb_optim__graph_status(ctx, g);
}

/* ---- chain and identity --------------------------------------------------- */

static nb_status chain_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  nb_optim__cfg *c = ud;
  nb_status s = NB_OK;
  for (int i = 0; s == NB_OK && i < c->nkids; i++) {
    nb_tree *sub = nb_tree_create(c->ctx);
    char pre[16];
    snprintf(pre, sizeof pre, "%d", i);
    s = sub ? c->kids[i]->init(c->kids[i]->ud, g, params, sub) : NB_ERR_NOMEM;
    if (!s) s = nb_tree_merge(state, pre, sub);
    nb_tree_destroy(sub);
  }
  return s;
}

static nb_status chain_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  nb_optim__cfg *c = ud;
  nb_tree *cur = nb_tree_copy(grads);
  nb_status s = cur ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; s == NB_OK && i < c->nkids; i++) {
    char pre[16];
    snprintf(pre, sizeof pre, "%d", i);
    nb_tree *sub = nb_tree_select_prefix(state, pre, true);
    nb_tree *u = nb_tree_create(c->ctx), *ns = nb_tree_create(c->ctx);
    s = sub && u && ns ? c->kids[i]->update(c->kids[i]->ud, g, cur, sub, params, u, ns) : NB_ERR_NOMEM;
    if (!s) s = nb_tree_merge(new_state, pre, ns);
    nb_tree_destroy(sub);
    nb_tree_destroy(ns);
    nb_tree_destroy(cur);
    cur = u;
  }
  if (!s) s = nb_tree_merge(updates, NULL, cur);
  nb_tree_destroy(cur);
  return s;
}

nb_optim_tx *nb_optim_chain(nb_ctx *ctx, int n, nb_optim_tx *const *txs) {
  if (n <= 0 || !txs) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "chain: needs at least one transformation (got %d)", n);
    return NULL;
  }
  if (!nb_optim__args_ok(ctx, "chain", n, txs, 0, NULL)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c || !nb_optim__cfg_take_kids(c, n, txs)) {
    if (!c)
      for (int i = 0; i < n; i++) nb_optim_tx_destroy(txs[i]);
    nb_optim__cfg_free(c);
    return NULL;
  }
  return nb_optim__make(ctx, "chain", chain_init, chain_update, c);
}

static nb_status empty_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) { return NB_OK; }

static nb_status identity_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                 const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  nb_status s = nb_tree_merge(updates, NULL, grads);
  return s ? s : nb_tree_merge(new_state, NULL, state);
}

nb_optim_tx *nb_optim_identity(nb_ctx *ctx) {
  return nb_optim__make(ctx, "identity", empty_init, identity_update, nb_optim__cfg_new(ctx));
}

/* ---- host conveniences ---------------------------------------------------- */

static nb_status host_init_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_optim_init(u, g, in, out);
}

nb_tree *nb_optim_init_arrays(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *params) {
  if (!tx || !params) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_init_arrays: NULL transformation or params");
    return NULL;
  }
  nb_graph *g = nb_trace(ctx, host_init_fn, (void *)tx, params);
  if (!g) return NULL;
  nb_tree *out = nb_tree_create(ctx);
  if (out && nb_graph_run(ctx, g, params, out) != NB_OK) {
    nb_tree_destroy(out);
    out = NULL;
  }
  nb_graph_destroy(g);
  return out;
}

static nb_status step_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const nb_optim_tx *tx = u;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *p = nb_tree_select_prefix(in, "params", true), *gr = nb_tree_select_prefix(in, "grads", true);
  nb_tree *st = nb_tree_select_prefix(in, "state", true);
  nb_tree *upd = nb_tree_create(ctx), *ns = nb_tree_create(ctx), *np = nb_tree_create(ctx);
  nb_status s = p && gr && st && upd && ns && np ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = nb_optim_update(tx, g, gr, st, p, upd, ns);
  if (!s) s = nb_optim_apply_updates(g, p, upd, np);
  if (!s) s = nb_tree_merge(out, "params", np);
  if (!s) s = nb_tree_merge(out, "state", ns);
  nb_tree_destroy(p);
  nb_tree_destroy(gr);
  nb_tree_destroy(st);
  nb_tree_destroy(upd);
  nb_tree_destroy(ns);
  nb_tree_destroy(np);
  return s;
}

static nb_status spec_merge(nb_tree *dst, const char *prefix, const nb_tree *src) {
  char p[NB_OPTIM_PATH_MAX];
  for (size_t i = 0; i < nb_tree_size(src); i++) {
    if (!nb_optim__join(p, prefix, nb_tree_path(src, i)))
      return nb_errorf(nb_tree_ctx(dst), NB_ERR_INVALID_ARG, "optim: path '%s' too long", nb_tree_path(src, i));
    nb_status s = nb_tree_set(dst, p, nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(src, i))));
    if (s) return s;
  }
  return NB_OK;
}

nb_graph *nb_optim_step_graph(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *params, const nb_tree *state) {
  if (!tx || !params || !state) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_step_graph: NULL transformation, params or state");
    return NULL;
  }
  nb_tree *spec = nb_tree_create(ctx);
  nb_status s = spec ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = spec_merge(spec, "params", params);
  if (!s) s = spec_merge(spec, "grads", params);
  if (!s) s = spec_merge(spec, "state", state);
  nb_graph *g = s ? NULL : nb_trace(ctx, step_fn, (void *)tx, spec);
  nb_tree_destroy(spec);
  return g;
}

nb_status nb_optim_update_arrays(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *grads, const nb_tree *state,
                                 const nb_tree *params, nb_tree **new_params, nb_tree **new_state) {
  if (!tx || !grads || !state || !params || !new_params || !new_state)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_update_arrays: NULL argument");
  *new_params = *new_state = NULL;
  nb_status s = nb_tree_check_same(ctx, grads, params, true, "grads and params");
  if (s) return s;
  nb_graph *g = nb_optim_step_graph(ctx, tx, params, state);
  if (!g) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  s = in && out ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = nb_tree_merge(in, "params", params);
  if (!s) s = nb_tree_merge(in, "grads", grads);
  if (!s) s = nb_tree_merge(in, "state", state);
  if (!s) s = nb_graph_run(ctx, g, in, out);
  if (!s) {
    *new_params = nb_tree_select_prefix(out, "params", true);
    *new_state = nb_tree_select_prefix(out, "state", true);
    if (!*new_params || !*new_state) s = NB_ERR_NOMEM;
  }
  if (s) {
    nb_tree_destroy(*new_params);
    nb_tree_destroy(*new_state);
    *new_params = *new_state = NULL;
  }
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  return s;
}

nb_status nb_optim_state_set_scalar(nb_ctx *ctx, nb_tree *state, const char *path, double value) {
  nb_array *old = state && path ? nb_tree_get_array(state, path) : NULL;
  if (!old) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "nb_optim_state_set_scalar: no array at '%s'", path ? path : "");
  if (nb_array_rank(old) != 0)
    return nb_errorf(ctx, NB_ERR_SHAPE, "nb_optim_state_set_scalar: '%s' is not a scalar", path);
  if (!isfinite(value))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_optim_state_set_scalar: '%s' value %g is not finite", path, value);
  nb_array *a = nb_array_scalar(ctx, nb_array_dtype(old), value);
  if (!a) return nb_ctx_status(ctx);
  nb_status s = nb_tree_set_array(state, path, a);
  nb_array_release(a);
  return s;
}

/* ---- tree utilities ------------------------------------------------------- */

nb_val *nb_optim_global_norm(nb_graph *g, const nb_tree *t) {
  nb_dtype d = nb_optim__scalar_dtype(t);
  nb_val *acc = nb_scalar(g, d, 0);
  for (size_t i = 0; t && i < nb_tree_size(t); i++) acc = nb_add(acc, nb_convert(nb_optim__sum_sq(nb_tree_leaf(t, i)->val), d));
  return nb_sqrt(acc);
}

nb_val *nb_optim_tree_vdot(nb_graph *g, const nb_tree *a, const nb_tree *b) {
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!a || !b || nb_tree_check_same(ctx, a, b, true, "tree_vdot")) return NULL;
  nb_dtype d = nb_optim__scalar_dtype(a);
  nb_val *acc = nb_scalar(g, d, 0);
  for (size_t i = 0; i < nb_tree_size(a); i++) {
    nb_val *x = nb_convert(nb_tree_leaf(a, i)->val, d), *y = nb_convert(nb_tree_leaf(b, i)->val, d);
    acc = nb_add(acc, nb_reduce_sum(nb_mul(x, y), 0, NULL));
  }
  return acc;
}

static nb_tree *zip_op(nb_graph *g, const nb_tree *a, const nb_tree *b, bool sub) {
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!a || !b || nb_tree_check_same(ctx, a, b, true, sub ? "tree_sub" : "tree_add")) return NULL;
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(a); i++) {
    nb_val *x = nb_tree_leaf(a, i)->val, *y = nb_tree_leaf(b, i)->val;
    if (nb_tree_set_val(out, nb_tree_path(a, i), sub ? nb_sub(x, y) : nb_add(x, y))) {
      nb_tree_destroy(out);
      return NULL;
    }
  }
  return out;
}

nb_tree *nb_optim_tree_add(nb_graph *g, const nb_tree *a, const nb_tree *b) { return zip_op(g, a, b, false); }
nb_tree *nb_optim_tree_sub(nb_graph *g, const nb_tree *a, const nb_tree *b) { return zip_op(g, a, b, true); }

nb_tree *nb_optim_tree_scale(nb_graph *g, const nb_tree *t, nb_val *s) {
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!t || !s) return NULL;
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(t); i++) {
    nb_val *x = nb_tree_leaf(t, i)->val;
    if (nb_tree_set_val(out, nb_tree_path(t, i), nb_mul(x, nb_convert(s, nb_val_dtype(x))))) {
      nb_tree_destroy(out);
      return NULL;
    }
  }
  return out;
}

nb_tree *nb_optim_tree_zeros_like(nb_graph *g, const nb_tree *t) {
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!t) return NULL;
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(t); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(t, i));
    if (nb_tree_set_val(out, nb_tree_path(t, i), nb_full(g, a.dtype, a.shape.rank, a.shape.dims, 0))) {
      nb_tree_destroy(out);
      return NULL;
    }
  }
  return out;
}
