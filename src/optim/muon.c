/* Muon (Optax's contrib.muon with its defaults): for 2-D leaves, Nesterov
 * momentum orthogonalized by quintic Newton-Schulz iterations (nb_matmul),
 * scaled by sqrt(max(1, cols/rows)), plus decoupled weight decay; every other
 * leaf goes to NAdam with the same learning rate. State "muon/count",
 * "muon/mu/<p>" and "adam/<...>". Not here: other preconditionings. */
#include <math.h>
#include <string.h>

#include "optim/internal.h"

static const double ns_coeffs[3] = {3.4445, -4.7750, 2.0315};

/* h: beta, eps, weight_decay; k[0]: ns_steps; sched: lr; kids[0]: the
 * NAdam part, whose lr is a slot reading cells[0]. */
static bool is_2d(const nb_leaf *l) { return nb_leaf_get_aval(l).shape.rank == 2; }

static nb_tree *subset(nb_ctx *ctx, const nb_tree *t, bool two_d) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(t); i++)
    if (is_2d(nb_tree_leaf(t, i)) == two_d && nb_tree_set(out, nb_tree_path(t, i), *nb_tree_leaf(t, i))) {
      nb_tree_destroy(out);
      return NULL;
    }
  return out;
}

static nb_status muon_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  nb_optim__cfg *c = ud;
  nb_tree *rest = subset(c->ctx, params, false), *sub = nb_tree_create(c->ctx);
  nb_status s = rest && sub ? nb_optim__put(state, "muon/count", NULL, nb_optim__count_zero(g)) : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(params); i++)
    if (is_2d(nb_tree_leaf(params, i)))
      s = nb_optim__put(state, "muon/mu", nb_tree_path(params, i), nb_full_like(nb_tree_leaf(params, i)->val, 0));
  if (!s) s = c->kids[0]->init(c->kids[0]->ud, g, rest, sub);
  if (!s) s = nb_tree_merge(state, "adam", sub);
  nb_tree_destroy(rest);
  nb_tree_destroy(sub);
  return s;
}

/* x: [m, n] with m <= n. Frobenius-normalize, then x = a x + (b A + c A A) x
 * with A = x x^T, ns_steps times. */
static nb_val *newton_schulz(nb_val *x, int steps, double eps) {
  int perm[2] = {1, 0};
  nb_val *norm = nb_sqrt(nb_reduce_sum(nb_mul(x, x), 0, NULL));
  x = nb_div(x, nb_add(norm, nb_optim__k(norm, eps)));
  for (int i = 0; i < steps; i++) {
    nb_val *a = nb_matmul(x, nb_transpose(x, perm));
    nb_val *b = nb_add(nb_mul(nb_optim__k(a, ns_coeffs[1]), a), nb_mul(nb_optim__k(a, ns_coeffs[2]), nb_matmul(a, a)));
    x = nb_add(nb_mul(nb_optim__k(x, ns_coeffs[0]), x), nb_matmul(b, x));
  }
  return x;
}

static nb_val *orthogonalize(nb_val *x, int steps, double eps) {
  int perm[2] = {1, 0};
  if (nb_val_dim(x, 0) > nb_val_dim(x, 1)) return nb_transpose(newton_schulz(nb_transpose(x, perm), steps, eps), perm);
  return newton_schulz(x, steps, eps);
}

static nb_status muon_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  nb_optim__cfg *c = ud;
  double beta = c->h[0], eps = c->h[1], wd = c->h[2];
  nb_status s = wd != 0 ? nb_optim__need_params(c->ctx, "muon", params) : NB_OK;
  nb_val *count = s ? NULL : nb_optim__state(c->ctx, state, "muon/count", NULL);
  if (!count) return s ? s : nb_ctx_status(c->ctx);
  nb_val *lr = nb_optim_schedule_trace(c->sched, nb_convert(count, nb_optim__scalar_dtype(grads)));
  nb_val *cinc = nb_optim__count_inc(count);
  for (size_t i = 0; !s && i < nb_tree_size(grads); i++) {
    const char *p = nb_tree_path(grads, i);
    nb_val *gr = nb_tree_leaf(grads, i)->val;
    if (nb_val_rank(gr) != 2) continue;
    nb_val *m0 = nb_optim__state(c->ctx, state, "muon/mu", p);
    if (!m0) return nb_ctx_status(c->ctx);
    nb_val *mu = nb_optim__moment(gr, m0, beta, 1);
    nb_val *mhat = nb_add(nb_mul(nb_optim__k(gr, beta), nb_optim__bias_correct(mu, beta, nb_optim__count_inc(cinc))),
                          nb_mul(nb_optim__k(gr, 1 - beta), nb_optim__bias_correct(gr, beta, cinc)));
    nb_val *o = orthogonalize(mhat, (int)c->k[0], eps);
    double rows = (double)nb_val_dim(gr, 0), cols = (double)nb_val_dim(gr, 1);
    o = nb_mul(o, nb_optim__k(o, sqrt(fmax(1.0, cols / rows))));
    if (wd != 0) {
      nb_val *pv = nb_tree_get_val(params, p);
      o = nb_add(o, nb_mul(nb_optim__k(pv, wd), pv));
    }
    s = nb_tree_set_val(updates, p, nb_mul(nb_neg(nb_optim__as(lr, nb_val_dtype(o))), o));
    if (!s) s = nb_optim__put(new_state, "muon/mu", p, mu);
  }
  if (!s) s = nb_optim__put(new_state, "muon/count", NULL, cinc);
  /* the rest: NAdam, its lr read from the cell */
  nb_tree *rg = subset(c->ctx, grads, false), *rp = params ? subset(c->ctx, params, false) : NULL;
  nb_tree *rs = nb_tree_select_prefix(state, "adam", true), *u = nb_tree_create(c->ctx), *ns = nb_tree_create(c->ctx);
  if (!s && (!rg || (params && !rp) || !rs || !u || !ns)) s = NB_ERR_NOMEM;
  c->cells[0] = lr;
  if (!s) s = c->kids[0]->update(c->kids[0]->ud, g, rg, rs, rp, u, ns);
  c->cells[0] = NULL;
  if (!s) s = nb_tree_merge(updates, NULL, u);
  if (!s) s = nb_tree_merge(new_state, "adam", ns);
  nb_tree *all[] = {rg, rp, rs, u, ns};
  for (int i = 0; i < 5; i++) nb_tree_destroy(all[i]);
  if (s) return s;
  /* updates in the grads' order */
  nb_tree *ordered = nb_tree_create(c->ctx);
  for (size_t i = 0; ordered && !s && i < nb_tree_size(grads); i++)
    s = nb_tree_set_val(ordered, nb_tree_path(grads, i), nb_tree_get_val(updates, nb_tree_path(grads, i)));
  for (size_t i = 0; ordered && !s && i < nb_tree_size(grads); i++) s = nb_tree_remove(updates, nb_tree_path(grads, i));
  if (!s) s = ordered ? nb_tree_merge(updates, NULL, ordered) : NB_ERR_NOMEM;
  nb_tree_destroy(ordered);
  return s;
}

nb_optim_tx *nb_optim_muon(nb_ctx *ctx, nb_optim_schedule *lr, double beta, int ns_steps, double eps,
                           double adam_b1, double adam_b2, double weight_decay) {
  const char *fn = "muon";
  if (!nb_optim__args_ok(ctx, fn, 0, NULL, 1, &lr)) return NULL;
  bool ok = beta >= 0 && beta < 1 && ns_steps >= 0 && ns_steps <= 100;
  if (!ok) nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: beta must be in [0, 1) and ns_steps in [0, 100] (got %g, %d)", fn, beta, ns_steps);
  ok = ok && nb_optim__check(ctx, fn, "eps", eps, 0, false) && nb_optim__check(ctx, fn, "weight_decay", weight_decay, 0, false);
  if (ok && nb_optim_schedule_is_constant(lr) && !(nb_optim_schedule_eval(lr, 0) >= 0)) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: learning rate must be >= 0", fn);
    ok = false;
  }
  nb_optim__cfg *c = ok ? nb_optim__cfg_new(ctx) : NULL;
  if (c) {
    c->sched = lr;
    lr = NULL;
    c->cells = nb_calloc(ctx, sizeof(nb_val *));
  }
  if (!c || !c->cells) {
    nb_optim_schedule_destroy(lr);
    nb_optim__cfg_free(c);
    return NULL;
  }
  c->nnames = 1; /* cells has one entry; names/values stay NULL */
  c->h[0] = beta;
  c->h[1] = eps;
  c->h[2] = weight_decay;
  c->k[0] = ns_steps;
  nb_optim_tx *adam = nb_optim_nadam(ctx, nb_optim__slot(ctx, &c->cells[0], nb_optim_schedule_eval(c->sched, 0)),
                                     adam_b1, adam_b2, eps);
  if (!adam || !nb_optim__cfg_take_kids(c, 1, &adam)) {
    nb_optim__cfg_free(c);
    return NULL;
  }
  return nb_optim__make(ctx, fn, muon_init, muon_update, c);
}
