/* One-call optimizers: chains of building blocks in Optax's order (so state
 * paths are "<position in chain>/..."). Each alias takes its learning-rate
 * schedule. Not here: the blocks themselves (transforms.c) or muon
 * (muon.c). */
#include <math.h>

#include "optim/internal.h"

/* chain of n txs, ending with scale_by_learning_rate(lr); takes everything */
static nb_optim_tx *with_lr(nb_ctx *ctx, const char *fn, nb_optim_schedule *lr, int n, nb_optim_tx **txs) {
  nb_optim_tx *all[8];
  for (int i = 0; i < n; i++) all[i] = txs[i];
  if (!nb_optim__args_ok(ctx, fn, n, all, 1, &lr)) return NULL;
  all[n] = nb_optim_scale_by_learning_rate(ctx, lr);
  return nb_optim_chain(ctx, n + 1, all);
}

nb_optim_tx *nb_optim_sgd(nb_ctx *ctx, nb_optim_schedule *lr, double momentum, bool nesterov) {
  nb_optim_tx *t = momentum != 0 || nesterov ? nb_optim_trace(ctx, momentum, nesterov) : nb_optim_identity(ctx);
  return with_lr(ctx, "sgd", lr, 1, &t);
}

nb_optim_tx *nb_optim_adam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps) {
  nb_optim_tx *t = nb_optim_scale_by_adam(ctx, b1, b2, eps, 0, false, false);
  return with_lr(ctx, "adam", lr, 1, &t);
}

nb_optim_tx *nb_optim_amsgrad(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps) {
  nb_optim_tx *t = nb_optim_scale_by_adam(ctx, b1, b2, eps, 0, false, true);
  return with_lr(ctx, "amsgrad", lr, 1, &t);
}

nb_optim_tx *nb_optim_nadam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps) {
  nb_optim_tx *t = nb_optim_scale_by_adam(ctx, b1, b2, eps, 0, true, false);
  return with_lr(ctx, "nadam", lr, 1, &t);
}

static nb_optim_tx *adamw_like(nb_ctx *ctx, const char *fn, nb_optim_schedule *lr, double b1, double b2, double eps,
                               double wd, const char *mask, bool nesterov) {
  nb_optim_tx *t[2] = {nb_optim_scale_by_adam(ctx, b1, b2, eps, 0, nesterov, false),
                       nb_optim_add_decayed_weights(ctx, wd, mask)};
  return with_lr(ctx, fn, lr, 2, t);
}

nb_optim_tx *nb_optim_adamw(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                            double weight_decay, const char *weight_decay_mask) {
  return adamw_like(ctx, "adamw", lr, b1, b2, eps, weight_decay, weight_decay_mask, false);
}

nb_optim_tx *nb_optim_nadamw(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                             double weight_decay, const char *weight_decay_mask) {
  return adamw_like(ctx, "nadamw", lr, b1, b2, eps, weight_decay, weight_decay_mask, true);
}

nb_optim_tx *nb_optim_adamax(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps) {
  nb_optim_tx *t = nb_optim_scale_by_adamax(ctx, b1, b2, eps);
  return with_lr(ctx, "adamax", lr, 1, &t);
}

nb_optim_tx *nb_optim_radam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                            double threshold) {
  nb_optim_tx *t = nb_optim_scale_by_radam(ctx, b1, b2, eps, 0, threshold);
  return with_lr(ctx, "radam", lr, 1, &t);
}

nb_optim_tx *nb_optim_rmsprop(nb_ctx *ctx, nb_optim_schedule *lr, double decay, double eps, double initial_scale,
                              bool centered, double momentum, bool nesterov) {
  nb_optim_tx *t = centered ? nb_optim_scale_by_stddev(ctx, decay, eps, initial_scale)
                            : nb_optim_scale_by_rms(ctx, decay, eps, initial_scale);
  nb_optim_tx *all[3] = {t, NULL, NULL};
  nb_optim_tx *m = momentum != 0 || nesterov ? nb_optim_trace(ctx, momentum, nesterov) : nb_optim_identity(ctx);
  if (!nb_optim__args_ok(ctx, "rmsprop", 2, (nb_optim_tx *[]){t, m}, 1, &lr)) return NULL;
  all[1] = nb_optim_scale_by_learning_rate(ctx, lr);
  all[2] = m;
  return nb_optim_chain(ctx, 3, all);
}

nb_optim_tx *nb_optim_adagrad(nb_ctx *ctx, nb_optim_schedule *lr, double initial_accumulator, double eps) {
  nb_optim_tx *t = nb_optim_scale_by_rss(ctx, initial_accumulator, eps);
  return with_lr(ctx, "adagrad", lr, 1, &t);
}

nb_optim_tx *nb_optim_adadelta(nb_ctx *ctx, nb_optim_schedule *lr, double rho, double eps, double weight_decay) {
  nb_optim_tx *t[2] = {nb_optim_add_decayed_weights(ctx, weight_decay, NULL), nb_optim_scale_by_adadelta(ctx, rho, eps)};
  return with_lr(ctx, "adadelta", lr, 2, t);
}

nb_optim_tx *nb_optim_adafactor(nb_ctx *ctx, nb_optim_schedule *lr, int64_t min_dim_size_to_factor,
                                double decay_rate, double clipping_threshold, double momentum,
                                bool multiply_by_parameter_scale, double eps, double weight_decay_rate) {
  nb_optim_tx *t[7];
  int n = 0;
  if (!lr) {
    nb_optim__args_ok(ctx, "adafactor", 0, NULL, 1, &lr);
    return NULL;
  }
  t[n++] = nb_optim_scale_by_factored_rms(ctx, true, decay_rate, 0, min_dim_size_to_factor, eps);
  if (!isnan(clipping_threshold)) t[n++] = nb_optim_clip_by_block_rms(ctx, clipping_threshold);
  t[n++] = nb_optim_scale_by_schedule(ctx, lr); /* Optax: scale_by_learning_rate without the sign flip */
  if (multiply_by_parameter_scale) t[n++] = nb_optim__scale_by_param_block_rms(ctx, 1e-3);
  if (!isnan(momentum)) t[n++] = nb_optim_ema(ctx, momentum, false);
  if (weight_decay_rate != 0) t[n++] = nb_optim_add_decayed_weights(ctx, weight_decay_rate, NULL);
  t[n++] = nb_optim_scale(ctx, -1);
  if (!nb_optim__args_ok(ctx, "adafactor", n, t, 0, NULL)) return NULL;
  return nb_optim_chain(ctx, n, t);
}

nb_optim_tx *nb_optim_lamb(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                           double weight_decay, const char *weight_decay_mask) {
  nb_optim_tx *t[3] = {nb_optim_scale_by_adam(ctx, b1, b2, eps, 0, false, false),
                       nb_optim_add_decayed_weights(ctx, weight_decay, weight_decay_mask),
                       nb_optim_scale_by_trust_ratio(ctx, 0, 1, 0)};
  return with_lr(ctx, "lamb", lr, 3, t);
}

nb_optim_tx *nb_optim_lars(nb_ctx *ctx, nb_optim_schedule *lr, double weight_decay, const char *weight_decay_mask,
                           double trust_coefficient, double eps, double momentum, bool nesterov) {
  nb_optim_tx *t[4] = {nb_optim_add_decayed_weights(ctx, weight_decay, weight_decay_mask),
                       nb_optim_scale_by_trust_ratio(ctx, 0, trust_coefficient, eps), NULL,
                       nb_optim_trace(ctx, momentum, nesterov)};
  nb_optim_tx *chk[3] = {t[0], t[1], t[3]};
  if (!nb_optim__args_ok(ctx, "lars", 3, chk, 1, &lr)) return NULL;
  t[2] = nb_optim_scale_by_learning_rate(ctx, lr);
  return nb_optim_chain(ctx, 4, t);
}

nb_optim_tx *nb_optim_lion(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double weight_decay,
                           const char *weight_decay_mask) {
  nb_optim_tx *t[2] = {nb_optim_scale_by_lion(ctx, b1, b2),
                       nb_optim_add_decayed_weights(ctx, weight_decay, weight_decay_mask)};
  return with_lr(ctx, "lion", lr, 2, t);
}
