/* The building blocks: scaling, moment estimators (Adam and its relatives,
 * RMS, momentum, Lion, Adagrad, Adadelta, Adafactor's factored moments),
 * trust ratios, weight decay, clipping, EMA, NaN handling and freezing. Each
 * is an init/update pair over trees of traced values with Optax's formulas
 * and state names. Not here: wrappers (wrappers.c), aliases (alias.c). */
#include <math.h>
#include <string.h>

#include "optim/internal.h"

#define CFG(ud) nb_optim__cfg *c = (nb_optim__cfg *)(ud)
#define NLEAF(t) nb_tree_size(t)
#define PATH(t, i) nb_tree_path(t, i)
#define LEAF(t, i) (nb_tree_leaf(t, i)->val)

/* state[prefix/p] = value, shaped like each param */
static nb_status init_full(nb_graph *g, const nb_tree *params, nb_tree *state, const char *prefix, double value) {
  for (size_t i = 0; i < NLEAF(params); i++) {
    nb_status s = nb_optim__put(state, prefix, PATH(params, i), nb_full_like(LEAF(params, i), value));
    if (s) return s;
  }
  return NB_OK;
}

static nb_status init_count(nb_graph *g, nb_tree *state) { return nb_optim__put(state, "count", NULL, nb_optim__count_zero(g)); }

/* Fetches state[prefix/path] into *out. */
#define GET(out, prefix, path)                                                     \
  do {                                                                             \
    (out) = nb_optim__state(c->ctx, state, (prefix), (path));                      \
    if (!(out)) return nb_ctx_status(c->ctx);                                      \
  } while (0)
#define PUT(t, prefix, path, v)                                                    \
  do {                                                                             \
    nb_status s_ = nb_optim__put((t), (prefix), (path), (v));                      \
    if (s_) return s_;                                                             \
  } while (0)

/* nbound: how many of h[0..nh) the update reads through nb_optim__hp (and so an
 * input may supply: nb_optim_tx_from_input) */
static nb_optim_tx *make_bound(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                               const double *h, int nh, int nbound) {
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  for (int i = 0; i < nh; i++) c->h[i] = h[i];
  c->nh = nbound;
  return nb_optim__make(ctx, name, init, update, c);
}

static nb_optim_tx *make(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                         const double *h, int nh) {
  return make_bound(ctx, name, init, update, h, nh, 0);
}

static nb_status no_state(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) { return NB_OK; }

/* ---- scale and schedules ---------------------------------------------------- */

static nb_status scale_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_optim__hp factor = nb_optim__hp_get(c, g, 0);
  for (size_t i = 0; i < NLEAF(grads); i++)
    PUT(updates, PATH(grads, i), NULL, nb_mul(nb_optim__hk(LEAF(grads, i), factor), LEAF(grads, i)));
  return NB_OK;
}

nb_optim_tx *nb_optim_scale(nb_ctx *ctx, double factor) {
  if (!isfinite(factor)) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "scale: factor must be finite, got %g", factor);
    return NULL;
  }
  return make_bound(ctx, "scale", no_state, scale_update, &factor, 1, 1);
}

static nb_status sched_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) { return init_count(g, state); }

static nb_status sched_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_val *count;
  GET(count, "count", NULL);
  nb_dtype d = nb_optim__scalar_dtype(grads);
  nb_val *step = nb_optim_schedule_trace(c->sched, nb_convert(count, d));
  if (!step) return nb_ctx_status(c->ctx) ? nb_ctx_status(c->ctx) : nb_optim__graph_status(c->ctx, g);
  if (c->h[0] != 1) step = nb_mul(step, nb_scalar(g, d, c->h[0]));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *x = LEAF(grads, i);
    PUT(updates, PATH(grads, i), NULL, nb_mul(nb_optim__as(step, nb_val_dtype(x)), x));
  }
  PUT(new_state, "count", NULL, nb_optim__count_inc(count));
  return NB_OK;
}

static nb_optim_tx *by_schedule(nb_ctx *ctx, const char *name, nb_optim_schedule *s, double sign) {
  if (!nb_optim__args_ok(ctx, name, 0, NULL, 1, &s)) return NULL;
  if (nb_optim_schedule_is_constant(s)) {
    double v = sign * nb_optim_schedule_eval(s, 0);
    nb_optim_schedule_destroy(s);
    return nb_optim_scale(ctx, v);
  }
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) {
    nb_optim_schedule_destroy(s);
    return NULL;
  }
  c->sched = s;
  c->h[0] = sign;
  return nb_optim__make(ctx, name, sched_init, sched_update, c);
}

nb_optim_tx *nb_optim_scale_by_learning_rate(nb_ctx *ctx, nb_optim_schedule *lr) {
  if (lr && nb_optim_schedule_is_constant(lr) && !(nb_optim_schedule_eval(lr, 0) >= 0)) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "learning rate must be >= 0, got %g", nb_optim_schedule_eval(lr, 0));
    nb_optim_schedule_destroy(lr);
    return NULL;
  }
  return by_schedule(ctx, "scale_by_learning_rate", lr, -1);
}

nb_optim_tx *nb_optim_scale_by_schedule(nb_ctx *ctx, nb_optim_schedule *s) {
  return by_schedule(ctx, "scale_by_schedule", s, 1);
}

/* ---- Adam family ------------------------------------------------------------ */

/* h: b1, b2, eps, eps_root; f: nesterov, amsgrad */
static nb_status adam_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = init_count(g, state);
  if (!s) s = init_full(g, params, state, "mu", 0);
  if (!s) s = init_full(g, params, state, "nu", 0);
  if (!s && c->f[1]) s = init_full(g, params, state, "nu_max", 0);
  return s;
}

static nb_status adam_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_optim__hp b1 = nb_optim__hp_get(c, g, 0), b2 = nb_optim__hp_get(c, g, 1), eps = nb_optim__hp_get(c, g, 2), eps_root = nb_optim__hp_get(c, g, 3);
  nb_val *count;
  GET(count, "count", NULL);
  nb_val *cinc = nb_optim__count_inc(count);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *m0, *v0, *vmax = NULL;
    GET(m0, "mu", p);
    GET(v0, "nu", p);
    if (c->f[1]) GET(vmax, "nu_max", p);
    nb_val *mu = nb_optim__moment_hp(gr, m0, b1, 1), *nu = nb_optim__moment_hp(gr, v0, b2, 2);
    nb_val *mhat = c->f[0] ? nb_add(nb_mul(nb_optim__hk(gr, b1), nb_optim__bias_correct_hp(mu, b1, nb_optim__count_inc(cinc))),
                                    nb_mul(nb_optim__hk(gr, nb_optim__hp_rsub(1, b1)), nb_optim__bias_correct_hp(gr, b1, cinc)))
                           : nb_optim__bias_correct_hp(mu, b1, cinc);
    nb_val *nhat = nb_optim__bias_correct_hp(nu, b2, cinc);
    if (c->f[1]) {
      nhat = nb_max(vmax, nhat);
      PUT(new_state, "nu_max", p, nhat);
    }
    nb_val *u = nb_div(mhat, nb_add(nb_sqrt(nb_add(nhat, nb_optim__hk(nhat, eps_root))), nb_optim__hk(nhat, eps)));
    PUT(updates, p, NULL, u);
    PUT(new_state, "mu", p, mu);
    PUT(new_state, "nu", p, nu);
  }
  PUT(new_state, "count", NULL, cinc);
  return NB_OK;
}

static bool decay_ok(nb_ctx *ctx, const char *fn, const char *name, double v) {
  if (isfinite(v) && v >= 0 && v < 1) return true;
  nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s must be in [0, 1), got %g", fn, name, v);
  return false;
}

nb_optim_tx *nb_optim_scale_by_adam(nb_ctx *ctx, double b1, double b2, double eps, double eps_root, bool nesterov,
                                    bool amsgrad) {
  const char *fn = "scale_by_adam";
  if (!decay_ok(ctx, fn, "b1", b1) || !decay_ok(ctx, fn, "b2", b2) || !nb_optim__check(ctx, fn, "eps", eps, 0, false) ||
      !nb_optim__check(ctx, fn, "eps_root", eps_root, 0, false))
    return NULL;
  if (nesterov && amsgrad) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: nesterov and amsgrad together are not supported", fn);
    return NULL;
  }
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  memcpy(c->h, (double[]){b1, b2, eps, eps_root}, 4 * sizeof(double));
  c->nh = 4;
  c->f[0] = nesterov;
  c->f[1] = amsgrad;
  return nb_optim__make(ctx, amsgrad ? "scale_by_amsgrad" : "scale_by_adam", adam_init, adam_update, c);
}

static nb_status adamax_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                               const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  double b1 = c->h[0], b2 = c->h[1], eps = c->h[2];
  nb_val *count;
  GET(count, "count", NULL);
  nb_val *cinc = nb_optim__count_inc(count);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *m0, *v0;
    GET(m0, "mu", p);
    GET(v0, "nu", p);
    nb_val *mu = nb_optim__moment(gr, m0, b1, 1);
    nb_val *nu = nb_max(nb_mul(nb_optim__k(v0, b2), v0), nb_add(nb_abs(gr), nb_optim__k(gr, eps)));
    PUT(updates, p, NULL, nb_div(nb_optim__bias_correct(mu, b1, cinc), nu));
    PUT(new_state, "mu", p, mu);
    PUT(new_state, "nu", p, nu);
  }
  PUT(new_state, "count", NULL, cinc);
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_adamax(nb_ctx *ctx, double b1, double b2, double eps) {
  const char *fn = "scale_by_adamax";
  if (!decay_ok(ctx, fn, "b1", b1) || !decay_ok(ctx, fn, "b2", b2) || !nb_optim__check(ctx, fn, "eps", eps, 0, false))
    return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  memcpy(c->h, (double[]){b1, b2, eps}, 3 * sizeof(double));
  return nb_optim__make(ctx, fn, adam_init, adamax_update, c);
}

/* h: b1, b2, eps, eps_root, threshold */
static nb_status radam_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  double b1 = c->h[0], b2 = c->h[1], eps = c->h[2], eps_root = c->h[3], thr = c->h[4];
  double ro_inf = 2.0 / (1.0 - b2) - 1.0;
  nb_val *count;
  GET(count, "count", NULL);
  nb_val *cinc = nb_optim__count_inc(count), *cf = nb_convert(cinc, nb_optim__scalar_dtype(grads));
  nb_val *b2t = nb_pow(nb_optim__k(cf, b2), cf);
  nb_val *ro = nb_sub(nb_optim__k(cf, ro_inf), nb_div(nb_mul(nb_mul(nb_optim__k(cf, 2), cf), b2t), nb_sub(nb_optim__k(cf, 1), b2t)));
  /* r = sqrt((ro-4)(ro-2) ro_inf / ((ro_inf-4)(ro_inf-2) ro)), NaN below 4: masked by the select */
  nb_val *r = nb_sqrt(nb_div(nb_mul(nb_mul(nb_sub(ro, nb_optim__k(cf, 4)), nb_sub(ro, nb_optim__k(cf, 2))), nb_optim__k(cf, ro_inf)),
                             nb_mul(nb_optim__k(cf, (ro_inf - 4) * (ro_inf - 2)), ro)));
  nb_val *use = nb_ge(ro, nb_optim__k(cf, thr));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *m0, *v0;
    GET(m0, "mu", p);
    GET(v0, "nu", p);
    nb_val *mu = nb_optim__moment(gr, m0, b1, 1), *nu = nb_optim__moment(gr, v0, b2, 2);
    nb_val *mhat = nb_optim__bias_correct(mu, b1, cinc), *nhat = nb_optim__bias_correct(nu, b2, cinc);
    nb_val *rect = nb_div(nb_mul(nb_optim__as(r, nb_val_dtype(gr)), mhat),
                          nb_add(nb_sqrt(nb_add(nhat, nb_optim__k(nhat, eps_root))), nb_optim__k(nhat, eps)));
    PUT(updates, p, NULL, nb_select(nb_broadcast_to(use, nb_val_rank(gr), nb_val_aval(gr).shape.dims), rect, mhat));
    PUT(new_state, "mu", p, mu);
    PUT(new_state, "nu", p, nu);
  }
  PUT(new_state, "count", NULL, cinc);
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_radam(nb_ctx *ctx, double b1, double b2, double eps, double eps_root,
                                     double threshold) {
  const char *fn = "scale_by_radam";
  if (!decay_ok(ctx, fn, "b1", b1) || !decay_ok(ctx, fn, "b2", b2) || !nb_optim__check(ctx, fn, "eps", eps, 0, false) ||
      !nb_optim__check(ctx, fn, "eps_root", eps_root, 0, false) || !nb_optim__check(ctx, fn, "threshold", threshold, 0, false))
    return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  memcpy(c->h, (double[]){b1, b2, eps, eps_root, threshold}, 5 * sizeof(double));
  return nb_optim__make(ctx, fn, adam_init, radam_update, c);
}

/* ---- RMS, stddev, momentum, Lion, Adagrad, Adadelta ------------------------ */

/* h: decay, eps, initial_scale; f[0]: centered (stddev) */
static nb_status rms_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = init_full(g, params, state, "nu", c->h[2]);
  if (!s && c->f[0]) s = init_full(g, params, state, "mu", 0);
  return s;
}

static nb_status rms_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                            const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  double decay = c->h[0], eps = c->h[1];
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *v0, *m0 = NULL;
    GET(v0, "nu", p);
    nb_val *nu = nb_optim__moment(gr, v0, decay, 2), *den = nu;
    if (c->f[0]) {
      GET(m0, "mu", p);
      nb_val *mu = nb_optim__moment(gr, m0, decay, 1);
      den = nb_sub(nu, nb_mul(mu, mu));
      PUT(new_state, "mu", p, mu);
    }
    PUT(updates, p, NULL, nb_mul(nb_rsqrt(nb_add(den, nb_optim__k(den, eps))), gr));
    PUT(new_state, "nu", p, nu);
  }
  return NB_OK;
}

static nb_optim_tx *rms_make(nb_ctx *ctx, const char *fn, double decay, double eps, double initial_scale, bool centered) {
  if (!decay_ok(ctx, fn, "decay", decay) || !nb_optim__check(ctx, fn, "eps", eps, 0, false) ||
      !nb_optim__check(ctx, fn, "initial_scale", initial_scale, 0, false))
    return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  memcpy(c->h, (double[]){decay, eps, initial_scale}, 3 * sizeof(double));
  c->f[0] = centered;
  return nb_optim__make(ctx, fn, rms_init, rms_update, c);
}

nb_optim_tx *nb_optim_scale_by_rms(nb_ctx *ctx, double decay, double eps, double initial_scale) {
  return rms_make(ctx, "scale_by_rms", decay, eps, initial_scale, false);
}

nb_optim_tx *nb_optim_scale_by_stddev(nb_ctx *ctx, double decay, double eps, double initial_scale) {
  return rms_make(ctx, "scale_by_stddev", decay, eps, initial_scale, true);
}

static nb_status trace_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  return init_full(g, params, state, "trace", 0);
}

static nb_status trace_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_optim__hp decay = nb_optim__hp_get(c, g, 0);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *t0;
    GET(t0, "trace", p);
    nb_val *t = nb_add(gr, nb_mul(nb_optim__hk(t0, decay), t0));
    PUT(updates, p, NULL, c->f[0] ? nb_add(gr, nb_mul(nb_optim__hk(t, decay), t)) : t);
    PUT(new_state, "trace", p, t);
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_trace(nb_ctx *ctx, double decay, bool nesterov) {
  if (!nb_optim__check(ctx, "trace", "decay", decay, 0, false)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  c->h[0] = decay;
  c->nh = 1;
  c->f[0] = nesterov;
  return nb_optim__make(ctx, "trace", trace_init, trace_update, c);
}

static nb_status lion_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  nb_status s = init_count(g, state);
  return s ? s : init_full(g, params, state, "mu", 0);
}

static nb_status lion_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_val *count;
  GET(count, "count", NULL);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *m0;
    GET(m0, "mu", p);
    PUT(updates, p, NULL, nb_sign(nb_optim__moment(gr, m0, c->h[0], 1)));
    PUT(new_state, "mu", p, nb_optim__moment(gr, m0, c->h[1], 1));
  }
  PUT(new_state, "count", NULL, nb_optim__count_inc(count));
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_lion(nb_ctx *ctx, double b1, double b2) {
  if (!decay_ok(ctx, "scale_by_lion", "b1", b1) || !decay_ok(ctx, "scale_by_lion", "b2", b2)) return NULL;
  return make(ctx, "scale_by_lion", lion_init, lion_update, (double[]){b1, b2}, 2);
}

static nb_status rss_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  return init_full(g, params, state, "sum_of_squares", c->h[0]);
}

static nb_status rss_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                            const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *s0;
    GET(s0, "sum_of_squares", p);
    nb_val *ss = nb_add(nb_mul(gr, gr), s0);
    nb_val *inv = nb_select(nb_gt(ss, nb_full_like(ss, 0)), nb_rsqrt(nb_add(ss, nb_optim__k(ss, c->h[1]))), nb_full_like(ss, 0));
    PUT(updates, p, NULL, nb_mul(inv, gr));
    PUT(new_state, "sum_of_squares", p, ss);
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_rss(nb_ctx *ctx, double initial_accumulator, double eps) {
  const char *fn = "scale_by_rss";
  if (!nb_optim__check(ctx, fn, "initial_accumulator", initial_accumulator, 0, false) ||
      !nb_optim__check(ctx, fn, "eps", eps, 0, false))
    return NULL;
  return make(ctx, fn, rss_init, rss_update, (double[]){initial_accumulator, eps}, 2);
}

static nb_status adadelta_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  nb_status s = init_full(g, params, state, "e_g", 0);
  return s ? s : init_full(g, params, state, "e_x", 0);
}

static nb_status adadelta_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                 const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  double rho = c->h[0], eps = c->h[1];
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i), *eg0, *ex0;
    GET(eg0, "e_g", p);
    GET(ex0, "e_x", p);
    nb_val *eg = nb_optim__moment(gr, eg0, rho, 2);
    nb_val *u = nb_mul(nb_div(nb_sqrt(nb_add(ex0, nb_optim__k(ex0, eps))), nb_sqrt(nb_add(eg, nb_optim__k(eg, eps)))), gr);
    PUT(updates, p, NULL, u);
    PUT(new_state, "e_g", p, eg);
    PUT(new_state, "e_x", p, nb_optim__moment(u, ex0, rho, 2));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_adadelta(nb_ctx *ctx, double rho, double eps) {
  const char *fn = "scale_by_adadelta";
  if (!decay_ok(ctx, fn, "rho", rho) || !nb_optim__check(ctx, fn, "eps", eps, 0, false)) return NULL;
  return make(ctx, fn, adadelta_init, adadelta_update, (double[]){rho, eps}, 2);
}

/* ---- trust ratio and parameter-scale ---------------------------------------- */

/* Optax's safe_norm: the norm, or min_norm where the norm is <= min_norm
 * (with a gradient that stays finite at 0). */
static nb_val *safe_norm(nb_val *x, double min_norm) {
  nb_val *n = nb_sqrt(nb_reduce_sum(nb_mul(x, x), 0, NULL));
  nb_val *small = nb_le(n, nb_optim__k(n, min_norm));
  nb_val *xs = nb_select(nb_broadcast_to(small, nb_val_rank(x), nb_val_aval(x).shape.dims), nb_full_like(x, 1), x);
  return nb_select(small, nb_optim__k(n, min_norm), nb_sqrt(nb_reduce_sum(nb_mul(xs, xs), 0, NULL)));
}

static nb_status trust_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status s = nb_optim__need_params(c->ctx, "scale_by_trust_ratio", params);
  if (s) return s;
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i), *pv = nb_tree_get_val(params, PATH(grads, i));
    nb_val *pn = safe_norm(pv, c->h[0]), *un = safe_norm(u, c->h[0]);
    nb_val *tr = nb_div(nb_mul(nb_optim__k(pn, c->h[1]), pn), nb_add(un, nb_optim__k(un, c->h[2])));
    nb_val *zero = nb_or(nb_eq(pn, nb_optim__k(pn, 0)), nb_eq(un, nb_optim__k(un, 0)));
    PUT(updates, PATH(grads, i), NULL, nb_mul(u, nb_select(zero, nb_optim__k(tr, 1), tr)));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_trust_ratio(nb_ctx *ctx, double min_norm, double trust_coefficient, double eps) {
  const char *fn = "scale_by_trust_ratio";
  if (!nb_optim__check(ctx, fn, "min_norm", min_norm, 0, false) ||
      !nb_optim__check(ctx, fn, "trust_coefficient", trust_coefficient, 0, false) ||
      !nb_optim__check(ctx, fn, "eps", eps, 0, false))
    return NULL;
  return make(ctx, fn, no_state, trust_update, (double[]){min_norm, trust_coefficient, eps}, 3);
}

/* u * max(rms(param), min_scale) (Optax's scale_by_param_block_rms; used by
 * Adafactor). */
static nb_status param_rms_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                  const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status s = nb_optim__need_params(c->ctx, "scale_by_param_block_rms", params);
  if (s) return s;
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i), *pv = nb_tree_get_val(params, PATH(grads, i));
    nb_aval av_ = nb_val_aval(pv);
    double n = (double)nb_shape_size(&av_.shape);
    nb_val *rms = nb_sqrt(nb_div(nb_reduce_sum(nb_mul(pv, pv), 0, NULL), nb_optim__k(u, n > 0 ? n : 1)));
    nb_val *small = nb_le(rms, nb_optim__k(rms, c->h[0]));
    PUT(updates, PATH(grads, i), NULL, nb_mul(u, nb_select(small, nb_optim__k(rms, c->h[0]), rms)));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim__scale_by_param_block_rms(nb_ctx *ctx, double min_scale) {
  return make(ctx, "scale_by_param_block_rms", no_state, param_rms_update, &min_scale, 1);
}

/* ---- Adafactor's factored second moments ------------------------------------- */

/* The two factored dims (d1 < d0 by size order as Optax: d0 the largest, d1
 * the second largest), or false for unfactored leaves. */
static bool factored_dims(const nb_optim__cfg *c, const nb_aval *a, int *d1, int *d0) {
  int r = a->shape.rank;
  if (!c->f[0] || r < 2) return false;
  int order[NB_MAX_RANK];
  for (int i = 0; i < r; i++) order[i] = i;
  for (int i = 1; i < r; i++) /* stable insertion sort by size, as numpy's argsort on ties */
    for (int j = i; j > 0 && a->shape.dims[order[j - 1]] > a->shape.dims[order[j]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  if (a->shape.dims[order[r - 2]] < c->k[0]) return false;
  *d1 = order[r - 2];
  *d0 = order[r - 1];
  return true;
}

static nb_val *zeros_without(nb_val *p, int axis) {
  nb_aval a = nb_val_aval(p);
  int64_t dims[NB_MAX_RANK];
  int r = 0;
  for (int i = 0; i < a.shape.rank; i++)
    if (i != axis) dims[r++] = a.shape.dims[i];
  return nb_full(nb_val_graph(p), a.dtype, r, dims, 0);
}

static nb_status factored_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  CFG(ud);
  nb_status s = init_count(g, state);
  for (size_t i = 0; !s && i < NLEAF(params); i++) {
    nb_val *p = LEAF(params, i);
    nb_aval a = nb_val_aval(p);
    int d1, d0;
    if (factored_dims(c, &a, &d1, &d0)) {
      s = nb_optim__put(state, "v_row", PATH(params, i), zeros_without(p, d0));
      if (!s) s = nb_optim__put(state, "v_col", PATH(params, i), zeros_without(p, d1));
    } else {
      s = nb_optim__put(state, "v", PATH(params, i), nb_full_like(p, 0));
    }
  }
  return s;
}

static nb_val *mean_axis(nb_val *x, int axis) {
  double n = (double)nb_val_dim(x, axis);
  return nb_div(nb_reduce_sum(x, 1, &axis), nb_optim__k(x, n));
}

static nb_status factored_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                 const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_val *count;
  GET(count, "count", NULL);
  /* decay_t = 1 - (count - offset + 1)^-decay_rate */
  nb_val *cf = nb_convert(count, nb_optim__scalar_dtype(grads));
  nb_val *t = nb_add(nb_sub(cf, nb_optim__k(cf, c->h[1])), nb_optim__k(cf, 1));
  nb_val *dec = nb_sub(nb_optim__k(t, 1), nb_pow(t, nb_optim__k(t, -c->h[0])));
  double eps = c->h[2];
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *gr = LEAF(grads, i);
    nb_aval a = nb_val_aval(gr);
    nb_val *d = nb_optim__as(dec, a.dtype), *omd = nb_sub(nb_optim__k(gr, 1), d);
    nb_val *gsq = nb_add(nb_mul(gr, gr), nb_optim__k(gr, eps));
    int d1, d0;
    if (factored_dims(c, &a, &d1, &d0)) {
      nb_val *vr0, *vc0;
      GET(vr0, "v_row", p);
      GET(vc0, "v_col", p);
      nb_val *vr = nb_add(nb_mul(d, vr0), nb_mul(omd, mean_axis(gsq, d0)));
      nb_val *vc = nb_add(nb_mul(d, vc0), nb_mul(omd, mean_axis(gsq, d1)));
      int rd1 = d1 > d0 ? d1 - 1 : d1;
      nb_val *rcm = nb_expand_dims(mean_axis(vr, rd1), rd1);
      nb_val *row = nb_rsqrt(nb_div(vr, rcm)), *col = nb_rsqrt(vc);
      nb_val *u = nb_mul(nb_mul(gr, nb_expand_dims(row, d0)), nb_expand_dims(col, d1));
      PUT(updates, p, NULL, u);
      PUT(new_state, "v_row", p, vr);
      PUT(new_state, "v_col", p, vc);
    } else {
      nb_val *v0;
      GET(v0, "v", p);
      nb_val *v = nb_add(nb_mul(d, v0), nb_mul(omd, gsq));
      PUT(updates, p, NULL, nb_mul(gr, nb_rsqrt(v)));
      PUT(new_state, "v", p, v);
    }
  }
  PUT(new_state, "count", NULL, nb_optim__count_inc(count));
  return NB_OK;
}

nb_optim_tx *nb_optim_scale_by_factored_rms(nb_ctx *ctx, bool factored, double decay_rate, double step_offset,
                                            int64_t min_dim_size_to_factor, double epsilon) {
  const char *fn = "scale_by_factored_rms";
  if (!nb_optim__check(ctx, fn, "decay_rate", decay_rate, 0, false) ||
      !nb_optim__check(ctx, fn, "step_offset", step_offset, 0, false) || !nb_optim__check(ctx, fn, "epsilon", epsilon, 0, false))
    return NULL;
  if (min_dim_size_to_factor < 0) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: min_dim_size_to_factor must be >= 0", fn);
    return NULL;
  }
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  memcpy(c->h, (double[]){decay_rate, step_offset, epsilon}, 3 * sizeof(double));
  c->k[0] = min_dim_size_to_factor;
  c->f[0] = factored;
  return nb_optim__make(ctx, fn, factored_init, factored_update, c);
}

/* ---- weight decay and clipping ---------------------------------------------- */

static nb_status decay_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status s = nb_optim__need_params(c->ctx, "add_decayed_weights", params);
  if (s) return s;
  nb_optim__hp wd = nb_optim__hp_get(c, g, 0);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *u = LEAF(grads, i);
    bool on = c->h[0] != 0 && (c->nregex == 0 || nb_optim__cfg_match(c, 0, p)); /* 0 vs not: a graph of its own */
    nb_val *pv = nb_tree_get_val(params, p);
    PUT(updates, p, NULL, on ? nb_add(u, nb_mul(nb_optim__hk(pv, wd), pv)) : u);
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_add_decayed_weights(nb_ctx *ctx, double weight_decay, const char *mask_regex) {
  if (!nb_optim__check(ctx, "add_decayed_weights", "weight_decay", weight_decay, 0, false)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  c->h[0] = weight_decay;
  c->nh = 1;
  if (mask_regex && !nb_optim__cfg_add_regex(c, mask_regex, "add_decayed_weights")) {
    nb_optim__cfg_free(c);
    return NULL;
  }
  return nb_optim__make(ctx, "add_decayed_weights", no_state, decay_update, c);
}

static nb_status clip_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i);
    PUT(updates, PATH(grads, i), NULL, nb_clamp(nb_optim__k(u, -c->h[0]), u, nb_optim__k(u, c->h[0])));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_clip(nb_ctx *ctx, double max_delta) {
  if (!nb_optim__check(ctx, "clip", "max_delta", max_delta, 0, false)) return NULL;
  return make(ctx, "clip", no_state, clip_update, &max_delta, 1);
}

static nb_status gnorm_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                              const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_optim__hp max_norm = nb_optim__hp_get(c, g, 0);
  nb_val *norm = nb_optim_global_norm(g, grads);
  nb_val *keep = nb_lt(norm, nb_optim__hk(norm, max_norm));
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i);
    nb_val *clipped = nb_mul(nb_div(u, nb_optim__as(norm, nb_val_dtype(u))), nb_optim__hk(u, max_norm));
    nb_val *k = nb_broadcast_to(keep, nb_val_rank(u), nb_val_aval(u).shape.dims);
    PUT(updates, PATH(grads, i), NULL, nb_select(k, u, clipped));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_clip_by_global_norm(nb_ctx *ctx, double max_norm) {
  if (!nb_optim__check(ctx, "clip_by_global_norm", "max_norm", max_norm, 0, true)) return NULL;
  return make_bound(ctx, "clip_by_global_norm", no_state, gnorm_update, &max_norm, 1, 1);
}

static nb_status block_rms_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                  const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i);
    nb_aval av_ = nb_val_aval(u);
    double n = (double)nb_shape_size(&av_.shape);
    nb_val *rms = nb_sqrt(nb_div(nb_reduce_sum(nb_mul(u, u), 0, NULL), nb_optim__k(u, n > 0 ? n : 1)));
    nb_val *den = nb_max(nb_optim__k(u, 1), nb_div(rms, nb_optim__k(u, c->h[0])));
    PUT(updates, PATH(grads, i), NULL, nb_div(u, den));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_clip_by_block_rms(nb_ctx *ctx, double threshold) {
  if (!nb_optim__check(ctx, "clip_by_block_rms", "threshold", threshold, 0, true)) return NULL;
  return make(ctx, "clip_by_block_rms", no_state, block_rms_update, &threshold, 1);
}

/* Optax's unitwise_norm: whole-leaf norm for (squeezed) rank <= 1; over axis
 * 0 for rank 2 and 3; over all but the last axis for rank 4 and 5. */
static nb_val *unitwise_norm(nb_ctx *ctx, nb_val *x, const char *path) {
  nb_aval a = nb_val_aval(x);
  int r = a.shape.rank, nontriv = 0, axes[NB_MAX_RANK], n = 0;
  for (int i = 0; i < r; i++) nontriv += a.shape.dims[i] != 1;
  if (nontriv <= 1)
    for (int i = 0; i < r; i++) axes[n++] = i;
  else if (r == 2 || r == 3)
    axes[n++] = 0;
  else if (r == 4 || r == 5)
    for (int i = 0; i < r - 1; i++) axes[n++] = i;
  else {
    nb_errorf(ctx, NB_ERR_SHAPE, "adaptive_grad_clip: '%s' has rank %d; supported ranks are 1..5", path, r);
    return NULL;
  }
  nb_val *s = n ? nb_reduce_sum(nb_mul(x, x), n, axes) : nb_mul(x, x);
  int bd[NB_MAX_RANK], k = 0;
  for (int i = 0, j = 0; i < r; i++) {
    if (j < n && axes[j] == i)
      j++;
    else
      bd[k++] = i;
  }
  return nb_broadcast_in_dim(nb_sqrt(s), r, a.shape.dims, bd);
}

static nb_status agc_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                            const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_status s = nb_optim__need_params(c->ctx, "adaptive_grad_clip", params);
  if (s) return s;
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *u = LEAF(grads, i), *pv = nb_tree_get_val(params, p);
    nb_val *gn = unitwise_norm(c->ctx, u, p), *pn = unitwise_norm(c->ctx, pv, p);
    if (!gn || !pn) return nb_ctx_status(c->ctx);
    nb_val *maxn = nb_mul(nb_optim__k(u, c->h[0]), nb_max(pn, nb_optim__k(pn, c->h[1])));
    nb_val *clipped = nb_mul(u, nb_div(maxn, nb_max(gn, nb_optim__k(gn, 1e-6))));
    PUT(updates, p, NULL, nb_select(nb_lt(gn, maxn), u, clipped));
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_adaptive_grad_clip(nb_ctx *ctx, double clipping, double eps) {
  const char *fn = "adaptive_grad_clip";
  if (!nb_optim__check(ctx, fn, "clipping", clipping, 0, false) || !nb_optim__check(ctx, fn, "eps", eps, 0, false))
    return NULL;
  return make(ctx, fn, no_state, agc_update, (double[]){clipping, eps}, 2);
}

/* ---- EMA, NaNs, freezing ------------------------------------------------------ */

static nb_status ema_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  nb_status s = init_count(g, state);
  return s ? s : init_full(g, params, state, "ema", 0);
}

static nb_status ema_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                            const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  CFG(ud);
  nb_val *count;
  GET(count, "count", NULL);
  nb_val *cinc = nb_optim__count_inc(count);
  for (size_t i = 0; i < NLEAF(grads); i++) {
    const char *p = PATH(grads, i);
    nb_val *e0;
    GET(e0, "ema", p);
    nb_val *e = nb_optim__moment(LEAF(grads, i), e0, c->h[0], 1);
    PUT(updates, p, NULL, c->f[0] ? nb_optim__bias_correct(e, c->h[0], cinc) : e);
    PUT(new_state, "ema", p, e);
  }
  PUT(new_state, "count", NULL, cinc);
  return NB_OK;
}

nb_optim_tx *nb_optim_ema(nb_ctx *ctx, double decay, bool debias) {
  if (!decay_ok(ctx, "ema", "decay", decay)) return NULL;
  nb_optim__cfg *c = nb_optim__cfg_new(ctx);
  if (!c) return NULL;
  c->h[0] = decay;
  c->f[0] = debias;
  return nb_optim__make(ctx, "ema", ema_init, ema_update, c);
}

static nb_status zero_nans_init(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state) {
  for (size_t i = 0; i < NLEAF(params); i++) {
    nb_status s = nb_optim__put(state, "found_nan", PATH(params, i), nb_scalar(g, NB_BOOL, 0));
    if (s) return s;
  }
  return NB_OK;
}

static nb_status zero_nans_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                  const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  for (size_t i = 0; i < NLEAF(grads); i++) {
    nb_val *u = LEAF(grads, i), *isnan_ = nb_ne(u, u);
    nb_val *any = nb_gt(nb_reduce_sum(nb_convert(isnan_, NB_I32), 0, NULL), nb_scalar(g, NB_I32, 0));
    PUT(updates, PATH(grads, i), NULL, nb_select(isnan_, nb_full_like(u, 0), u));
    PUT(new_state, "found_nan", PATH(grads, i), any);
  }
  return NB_OK;
}

nb_optim_tx *nb_optim_zero_nans(nb_ctx *ctx) {
  return make(ctx, "zero_nans", zero_nans_init, zero_nans_update, NULL, 0);
}

static nb_status zero_update(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                             const nb_tree *params, nb_tree *updates, nb_tree *new_state) {
  for (size_t i = 0; i < NLEAF(grads); i++) PUT(updates, PATH(grads, i), NULL, nb_full_like(LEAF(grads, i), 0));
  return NB_OK;
}

nb_optim_tx *nb_optim_set_to_zero(nb_ctx *ctx) { return make(ctx, "set_to_zero", no_state, zero_update, NULL, 0); }
