/* Parameter-free functions (activations, softmax, cross-entropy, dropout),
 * the norms and the MLP. Attention, MoE and the block are in files of their
 * own. Everything here is traced ops; nothing runs. */
#include <math.h>
#include <string.h>

#include "nn/internal.h"

/* ---------------------------------------------------------------- activations */

const char *nb_nn_act_name(nb_nn_act act) {
  static const char *names[NB_NN_ACT_COUNT] = {"gelu_tanh", "gelu", "relu", "silu"};
  return act >= 0 && act < NB_NN_ACT_COUNT ? names[act] : "?";
}

nb_val *nb_nn_activation(nb_val *x, nb_nn_act act) {
  switch (act) {
    case NB_NN_GELU_TANH: {
      nb_val *x3 = nb_mul(nb_mul(x, x), x);
      nb_val *inner = nb_mul(nb_nn__scalar(x, sqrt(2.0 / M_PI)), nb_add(x, nb_mul(nb_nn__scalar(x, 0.044715), x3)));
      return nb_mul(nb_mul(nb_nn__scalar(x, 0.5), x), nb_add(nb_nn__scalar(x, 1), nb_tanh(inner)));
    }
    case NB_NN_GELU:
      return nb_mul(nb_mul(nb_nn__scalar(x, 0.5), x), nb_add(nb_nn__scalar(x, 1), nb_erf(nb_mul(x, nb_nn__scalar(x, M_SQRT1_2)))));
    case NB_NN_RELU: return nb_max(x, nb_nn__scalar(x, 0));
    case NB_NN_SILU: return nb_mul(x, nb_logistic(x));
    default: return nb_add(x, NULL); /* poisons: "add: NULL operand" */
  }
}

/* ---------------------------------------------------------------- softmax family */

static int norm_axis(nb_val *x, int axis) { return axis < 0 ? axis + nb_val_rank(x) : axis; }

nb_val *nb_nn_logsumexp(nb_val *x, int axis) { return nb_logsumexp(nb_nn__upcast(x), axis); }

nb_val *nb_nn_softmax(nb_val *x, int axis) {
  nb_val *xf = nb_nn__upcast(x);
  int ax[1] = {norm_axis(x, axis)};
  nb_val *m = nb_stop_gradient(nb_reduce_max(xf, 1, ax));
  nb_val *e = nb_exp(nb_sub(xf, nb_expand_dims(m, ax[0])));
  nb_val *p = nb_div(e, nb_expand_dims(nb_reduce_sum(e, 1, ax), ax[0]));
  return nb_val_dtype(p) == nb_val_dtype(x) ? p : nb_convert(p, nb_val_dtype(x));
}

nb_val *nb_nn_log_softmax(nb_val *x, int axis) {
  nb_val *xf = nb_nn__upcast(x);
  int a = norm_axis(x, axis);
  nb_val *y = nb_sub(xf, nb_expand_dims(nb_nn_logsumexp(xf, a), a));
  return nb_val_dtype(y) == nb_val_dtype(x) ? y : nb_convert(y, nb_val_dtype(x));
}

nb_val *nb_nn_cross_entropy(nb_val *logits, nb_val *targets, nb_val *mask) {
  nb_val *lf = nb_nn__upcast(logits);
  int r = nb_val_rank(lf);
  nb_val *t = nb_val_dtype(targets) == NB_I32 ? targets : nb_convert(targets, NB_I32);
  nb_val *picked = nb_take_along_axis(lf, nb_expand_dims(t, r - 1), r - 1);
  int ax[1] = {r - 1};
  nb_val *nll = nb_sub(nb_nn_logsumexp(lf, r - 1), nb_squeeze(picked, 1, ax));
  if (!mask) {
    nb_aval av = nb_val_aval(nll);
    return nb_div(nb_reduce_sum(nll, 0, NULL), nb_nn__scalar(nll, (double)nb_shape_size(&av.shape)));
  }
  nb_val *m = nb_val_dtype(mask) == nb_val_dtype(nll) ? mask : nb_convert(mask, nb_val_dtype(nll));
  nb_val *total = nb_reduce_sum(nb_mul(nll, m), 0, NULL);
  nb_val *count = nb_max(nb_reduce_sum(m, 0, NULL), nb_nn__scalar(nll, 1));
  return nb_div(total, count);
}

/* ---------------------------------------------------------------- dropout */

nb_val *nb_nn_dropout(nb_nn_apply *a, const char *path, nb_val *x, double rate) {
  if (!a->train || rate <= 0) return x;
  if (rate >= 1) return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: dropout '%s': rate %g is not in [0, 1)", path, rate);
  if (!a->rng) return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: dropout '%s' in train mode needs the step's rng key", path);
  nb_val *key = nb_random_fold_in(a->rng, nb_scalar(a->g, NB_U32, (double)nb_nn_path_hash(path)));
  nb_aval av = nb_val_aval(x);
  nb_val *keep = nb_random_bernoulli(key, nb_scalar(a->g, NB_F32, 1 - rate), av.shape.rank, av.shape.dims);
  return nb_select(keep, nb_div(x, nb_nn__scalar(x, 1 - rate)), nb_full_like(x, 0));
}

/* ---------------------------------------------------------------- norms */

nb_status nb_nn_layernorm_init(nb_nn_init *in, const char *path, int64_t d, bool bias) {
  char p[NB_NN_PATH_MAX];
  if (!nb_nn__init_path(in, p, path, "scale")) return NB_ERR_INVALID_ARG;
  nb_status s = nb_nn_init_const(in, p, 1, &d, 1);
  if (s || !bias) return s;
  if (!nb_nn__init_path(in, p, path, "bias")) return NB_ERR_INVALID_ARG;
  return nb_nn_init_const(in, p, 1, &d, 0);
}

nb_status nb_nn_rmsnorm_init(nb_nn_init *in, const char *path, int64_t d) { return nb_nn_layernorm_init(in, path, d, false); }

/* scale (and bias) of a norm over x's last axis, in x's dtype */
static nb_val *affine(nb_nn_apply *a, const char *path, nb_val *y, bool with_bias) {
  char p[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, p, path, "scale")) return nb_nn__poison(a);
  nb_val *scale = nb_nn_param(a, p);
  if (nb_graph_status(a->g)) return scale;
  if (nb_val_rank(scale) != 1 || nb_val_dim(scale, 0) != nb_val_dim(y, -1))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: norm '%s': scale has %lld elements, the input %lld features", p,
                      (long long)nb_val_dim(scale, -1), (long long)nb_val_dim(y, -1));
  y = nb_mul(y, nb_convert(scale, nb_val_dtype(y)));
  if (!with_bias || !nb_nn__path(a, p, path, "bias")) return y;
  nb_val *b = nb_nn_param_opt(a, p);
  return b ? nb_add(y, nb_convert(b, nb_val_dtype(y))) : y;
}

nb_val *nb_nn_layernorm(nb_nn_apply *a, const char *path, nb_val *x, double eps) {
  nb_val *xf = nb_nn__upcast(x);
  nb_val *xc = nb_sub(xf, nb_nn__mean_last(xf));
  nb_val *var = nb_nn__mean_last(nb_mul(xc, xc));
  nb_val *y = affine(a, path, nb_mul(xc, nb_rsqrt(nb_add(var, nb_nn__scalar(var, eps)))), true);
  return nb_val_dtype(y) == nb_val_dtype(x) ? y : nb_convert(y, nb_val_dtype(x));
}

nb_val *nb_nn_rmsnorm(nb_nn_apply *a, const char *path, nb_val *x, double eps) {
  nb_val *xf = nb_nn__upcast(x);
  nb_val *ms = nb_nn__mean_last(nb_mul(xf, xf));
  nb_val *y = affine(a, path, nb_mul(xf, nb_rsqrt(nb_add(ms, nb_nn__scalar(ms, eps)))), false);
  return nb_val_dtype(y) == nb_val_dtype(x) ? y : nb_convert(y, nb_val_dtype(x));
}

nb_status nb_nn_norm_init(nb_nn_init *in, const char *path, const nb_nn_norm_cfg *cfg, int64_t d) {
  return cfg->kind == NB_NN_RMSNORM ? nb_nn_rmsnorm_init(in, path, d) : nb_nn_layernorm_init(in, path, d, cfg->bias);
}

nb_val *nb_nn_norm_apply(nb_nn_apply *a, const char *path, const nb_nn_norm_cfg *cfg, nb_val *x) {
  return cfg->kind == NB_NN_RMSNORM ? nb_nn_rmsnorm(a, path, x, cfg->eps) : nb_nn_layernorm(a, path, x, cfg->eps);
}

/* ---------------------------------------------------------------- MLP */

nb_status nb_nn_mlp_init(nb_nn_init *in, const char *path, const nb_nn_mlp_cfg *cfg, double std_in, double std_out) {
  char p[NB_NN_PATH_MAX];
  nb_status s = NB_OK;
  if (cfg->gated) {
    if (!s && !nb_nn__init_path(in, p, path, "wi_0")) s = NB_ERR_INVALID_ARG;
    if (!s) s = nb_nn_linear_init(in, p, cfg->d_model, cfg->d_ff, cfg->bias, std_in);
    if (!s && !nb_nn__init_path(in, p, path, "wi_1")) s = NB_ERR_INVALID_ARG;
    if (!s) s = nb_nn_linear_init(in, p, cfg->d_model, cfg->d_ff, cfg->bias, std_in);
  } else {
    if (!s && !nb_nn__init_path(in, p, path, "wi")) s = NB_ERR_INVALID_ARG;
    if (!s) s = nb_nn_linear_init(in, p, cfg->d_model, cfg->d_ff, cfg->bias, std_in);
  }
  if (!s && !nb_nn__init_path(in, p, path, "wo")) s = NB_ERR_INVALID_ARG;
  if (!s) s = nb_nn_linear_init(in, p, cfg->d_ff, cfg->d_model, cfg->bias, std_out);
  return s;
}

nb_val *nb_nn_mlp(nb_nn_apply *a, const char *path, const nb_nn_mlp_cfg *cfg, nb_val *x) {
  char p0[NB_NN_PATH_MAX], p1[NB_NN_PATH_MAX], po[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, po, path, "wo")) return nb_nn__poison(a);
  nb_val *h;
  if (cfg->gated) {
    if (!nb_nn__path(a, p0, path, "wi_0") || !nb_nn__path(a, p1, path, "wi_1")) return nb_nn__poison(a);
    h = nb_mul(nb_nn_activation(nb_nn_linear(a, p0, x), cfg->act), nb_nn_linear(a, p1, x));
  } else {
    if (!nb_nn__path(a, p0, path, "wi")) return nb_nn__poison(a);
    h = nb_nn_activation(nb_nn_linear(a, p0, x), cfg->act);
  }
  return nb_nn_linear(a, po, h);
}
