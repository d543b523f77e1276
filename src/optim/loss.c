/* Losses as traced functions of nb_val, per example (no reduction), with
 * Optax's definitions. Everything that exponentiates goes through a
 * max-shifted log-sum-exp or a softplus written for both signs, so large
 * logits neither overflow nor lose their gradient. Integer labels use a
 * one-hot built from iota == label (exact). Not here: reductions over the
 * batch (the caller's choice). */
#include <math.h>

#include "optim/internal.h"

static int last(nb_val *x) { return nb_val_rank(x) - 1; }

static nb_val *sum_last(nb_val *x) {
  int ax = last(x);
  return nb_reduce_sum(x, 1, &ax);
}

static nb_val *keep(nb_val *reduced, nb_val *like) {
  nb_val *e = nb_expand_dims(reduced, last(like));
  nb_aval a = nb_val_aval(like);
  return nb_broadcast_to(e, a.shape.rank, a.shape.dims);
}

static bool ranked(nb_val *x, const char *fn) {
  if (!x) return false;
  if (nb_val_rank(x) >= 1 && nb_dtype_is_float(nb_val_dtype(x))) return true;
  nb_errorf(nb_graph_ctx(nb_val_graph(x)), NB_ERR_SHAPE, "%s: needs a float array of rank >= 1", fn);
  return false;
}

nb_val *nb_optim_logsumexp(nb_val *x) {
  return ranked(x, "logsumexp") ? nb_logsumexp(x, -1) : NULL;
}

nb_val *nb_optim_log_softmax(nb_val *logits) {
  nb_val *lse = nb_optim_logsumexp(logits);
  return lse ? nb_sub(logits, keep(lse, logits)) : NULL;
}

nb_val *nb_optim_softmax_cross_entropy(nb_val *logits, nb_val *labels) {
  nb_val *lp = nb_optim_log_softmax(logits);
  return lp && labels ? nb_neg(sum_last(nb_mul(labels, lp))) : NULL;
}

nb_val *nb_optim_softmax_cross_entropy_int(nb_val *logits, nb_val *labels, nb_val *weights, double label_smoothing,
                                           double z_loss) {
  if (!ranked(logits, "softmax_cross_entropy_int") || !labels) return NULL;
  nb_ctx *ctx = nb_graph_ctx(nb_val_graph(logits));
  if (!nb_dtype_is_int(nb_val_dtype(labels))) {
    nb_errorf(ctx, NB_ERR_DTYPE, "softmax_cross_entropy_int: labels must be integers, got %s",
              nb_dtype_name(nb_val_dtype(labels)));
    return NULL;
  }
  if (!(label_smoothing >= 0 && label_smoothing <= 1) || !(z_loss >= 0) || !isfinite(z_loss)) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "softmax_cross_entropy_int: label_smoothing must be in [0, 1] and z_loss >= 0 "
              "(got %g, %g)", label_smoothing, z_loss);
    return NULL;
  }
  nb_aval a = nb_val_aval(logits);
  int r = a.shape.rank;
  nb_aval la = nb_val_aval(labels);
  bool shape_ok = la.shape.rank == r - 1;
  for (int i = 0; shape_ok && i < r - 1; i++) shape_ok = la.shape.dims[i] == a.shape.dims[i];
  if (!shape_ok) {
    char s1[96], s2[96];
    nb_errorf(ctx, NB_ERR_SHAPE, "softmax_cross_entropy_int: labels %s do not match logits %s without the class axis",
              nb_aval_str(&la, s2, sizeof s2), nb_aval_str(&a, s1, sizeof s1));
    return NULL;
  }
  double C = (double)a.shape.dims[r - 1];
  nb_val *ids = nb_iota(nb_val_graph(logits), NB_I32, r, a.shape.dims, r - 1);
  nb_val *onehot = nb_convert(nb_eq(ids, keep(nb_convert(labels, NB_I32), logits)), a.dtype);
  nb_val *target = label_smoothing == 0
                       ? onehot
                       : nb_add(nb_mul(onehot, nb_optim__k(logits, 1 - label_smoothing)), nb_optim__k(logits, label_smoothing / C));
  nb_val *lse = nb_optim_logsumexp(logits);
  nb_val *loss = nb_sub(lse, sum_last(nb_mul(target, logits)));
  if (z_loss != 0) loss = nb_add(loss, nb_mul(nb_optim__k(lse, z_loss), nb_mul(lse, lse)));
  if (weights) loss = nb_mul(loss, nb_convert(weights, a.dtype));
  return loss;
}

/* log(sigmoid(x)) = -softplus(-x), softplus(z) = max(z, 0) + log1p(exp(-|z|)) */
static nb_val *log_sigmoid(nb_val *x) {
  nb_val *z = nb_neg(x);
  return nb_neg(nb_add(nb_max(z, nb_full_like(z, 0)), nb_log1p(nb_exp(nb_neg(nb_abs(z))))));
}

nb_val *nb_optim_sigmoid_binary_cross_entropy(nb_val *logits, nb_val *labels) {
  if (!logits || !labels) return NULL;
  nb_val *l = nb_convert(labels, nb_val_dtype(logits));
  return nb_sub(nb_neg(nb_mul(l, log_sigmoid(logits))),
                nb_mul(nb_sub(nb_full_like(l, 1), l), log_sigmoid(nb_neg(logits))));
}

static nb_val *logaddexp(nb_val *a, nb_val *b) {
  nb_val *m = nb_max(a, b);
  nb_val *d = nb_abs(nb_sub(a, b));
  d = nb_select(nb_ne(d, d), nb_full_like(d, INFINITY), d); /* -inf - -inf */
  return nb_add(m, nb_log1p(nb_exp(nb_neg(d))));
}

nb_val *nb_optim_sigmoid_focal_loss(nb_val *logits, nb_val *labels, double alpha, double gamma) {
  if (!logits || !labels) return NULL;
  nb_val *l = nb_convert(labels, nb_val_dtype(logits));
  nb_val *ce = nb_optim_sigmoid_binary_cross_entropy(logits, l);
  nb_val *one = nb_full_like(l, 1);
  /* log(1 - p_t) = log((1 - l) p + l (1 - p)), in log space */
  nb_val *lm = logaddexp(nb_add(nb_log(nb_sub(one, l)), log_sigmoid(logits)),
                         nb_add(nb_log(l), log_sigmoid(nb_neg(logits))));
  nb_val *loss = nb_mul(ce, nb_exp(nb_mul(nb_optim__k(lm, gamma), lm)));
  if (alpha < 0) return loss;
  nb_val *w = nb_add(nb_mul(nb_optim__k(l, alpha), l), nb_mul(nb_optim__k(l, 1 - alpha), nb_sub(one, l)));
  return nb_mul(w, loss);
}

nb_val *nb_optim_squared_error(nb_val *predictions, nb_val *targets) {
  nb_val *e = nb_sub(predictions, targets);
  return nb_mul(e, e);
}

nb_val *nb_optim_l2_loss(nb_val *predictions, nb_val *targets) {
  nb_val *s = nb_optim_squared_error(predictions, targets);
  return nb_mul(nb_optim__k(s, 0.5), s);
}

nb_val *nb_optim_huber_loss(nb_val *predictions, nb_val *targets, double delta) {
  nb_val *e = nb_abs(nb_sub(predictions, targets));
  nb_val *q = nb_min(e, nb_optim__k(e, delta));
  return nb_add(nb_mul(nb_optim__k(q, 0.5), nb_mul(q, q)), nb_mul(nb_optim__k(e, delta), nb_sub(e, q)));
}

nb_val *nb_optim_log_cosh(nb_val *predictions, nb_val *targets) {
  nb_val *e = nb_sub(predictions, targets), *a = nb_abs(e);
  /* logaddexp(e, -e) - log 2 = |e| + log1p(exp(-2|e|)) - log 2 */
  return nb_sub(nb_add(a, nb_log1p(nb_exp(nb_mul(nb_optim__k(a, -2), a)))), nb_optim__k(a, M_LN2));
}

nb_val *nb_optim_hinge_loss(nb_val *scores, nb_val *labels) {
  nb_val *m = nb_sub(nb_optim__k(scores, 1), nb_mul(scores, nb_convert(labels, nb_val_dtype(scores))));
  return nb_max(m, nb_full_like(m, 0));
}

nb_val *nb_optim_cosine_similarity(nb_val *predictions, nb_val *targets, double eps) {
  if (!ranked(predictions, "cosine_similarity") || !targets) return NULL;
  nb_val *an = nb_sqrt(nb_max(sum_last(nb_mul(predictions, predictions)), nb_optim__k(predictions, eps)));
  nb_val *bn = nb_sqrt(nb_max(sum_last(nb_mul(targets, targets)), nb_optim__k(targets, eps)));
  return sum_last(nb_mul(nb_div(predictions, keep(an, predictions)), nb_div(targets, keep(bn, targets))));
}

nb_val *nb_optim_cosine_distance(nb_val *predictions, nb_val *targets, double eps) {
  nb_val *s = nb_optim_cosine_similarity(predictions, targets, eps);
  return s ? nb_sub(nb_optim__k(s, 1), s) : NULL;
}

nb_val *nb_optim_kl_divergence(nb_val *log_predictions, nb_val *targets) {
  if (!ranked(log_predictions, "kl_divergence") || !targets) return NULL;
  nb_val *zero = nb_eq(targets, nb_full_like(targets, 0));
  nb_val *lt = nb_log(nb_select(zero, nb_full_like(targets, 1), targets));
  return sum_last(nb_mul(targets, nb_sub(lt, log_predictions)));
}
