/* The mixture-of-experts layer: router (softmax or sigmoid scores, top-k),
 * capacity-limited dispatch with token dropping (GShard-style dense
 * dispatch/combine masks), a dropless mode (every expert runs on every
 * token, weighted by its gate, zero for experts not chosen), shared experts
 * and the auxiliary losses. Correctness first: the masks cost N*E*C
 * memory; a sort-based grouped dispatch is for a later kernel. */
#include <math.h>
#include <string.h>

#include "nn/internal.h"

nb_status nb_nn_moe_init(nb_nn_init *in, const char *path, const nb_nn_moe_cfg *cfg, double std, double std_out,
                         double router_std) {
  char p[NB_NN_PATH_MAX];
  const nb_nn_mlp_cfg *m = &cfg->expert;
  int64_t E = cfg->n_experts;
  if (!nb_nn__init_path(in, p, path, "router/kernel")) return NB_ERR_INVALID_ARG;
  nb_status s = nb_nn_init_normal(in, p, 2, (int64_t[2]){m->d_model, E}, router_std);
  const char *names[3] = {"experts/wi_0", "experts/wi_1", "experts/wo"};
  if (!m->gated) names[0] = "experts/wi", names[1] = NULL;
  for (int i = 0; i < 3 && !s; i++) {
    if (!names[i]) continue;
    if (!nb_nn__init_path(in, p, path, names[i])) return NB_ERR_INVALID_ARG;
    s = i == 2 ? nb_nn_linear_stacked_init(in, p, E, m->d_ff, m->d_model, false, std_out)
               : nb_nn_linear_stacked_init(in, p, E, m->d_model, m->d_ff, false, std);
  }
  if (!s && cfg->n_shared > 0) {
    nb_nn_mlp_cfg sh = *m;
    sh.d_ff *= cfg->n_shared;
    sh.bias = false;
    if (!nb_nn__init_path(in, p, path, "shared")) return NB_ERR_INVALID_ARG;
    s = nb_nn_mlp_init(in, p, &sh, std, std_out);
  }
  return s;
}

/* the routed experts on xe [E, n, d] -> [E, n, d] */
static nb_val *experts(nb_nn_apply *a, const char *path, const nb_nn_mlp_cfg *m, nb_val *xe) {
  char p0[NB_NN_PATH_MAX], p1[NB_NN_PATH_MAX], po[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, po, path, "experts/wo")) return nb_nn__poison(a);
  nb_val *h;
  if (m->gated) {
    if (!nb_nn__path(a, p0, path, "experts/wi_0") || !nb_nn__path(a, p1, path, "experts/wi_1")) return nb_nn__poison(a);
    h = nb_mul(nb_nn_activation(nb_nn_linear_stacked(a, p0, xe), m->act), nb_nn_linear_stacked(a, p1, xe));
  } else {
    if (!nb_nn__path(a, p0, path, "experts/wi")) return nb_nn__poison(a);
    h = nb_nn_activation(nb_nn_linear_stacked(a, p0, xe), m->act);
  }
  return nb_nn_linear_stacked(a, po, h);
}

/* out [N, d] = sum_e gate[n, e] * expert_e(x[n]), every expert on every token */
static nb_val *dropless(nb_nn_apply *a, const char *path, const nb_nn_moe_cfg *cfg, nb_val *xf, nb_val *gate_dense) {
  int64_t N = nb_val_dim(xf, 0), D = nb_val_dim(xf, 1), E = cfg->n_experts;
  nb_val *xe = nb_nn__broadcast_in_dim(xf, 3, (int64_t[3]){E, N, D}, (int[2]){1, 2});
  nb_val *h = experts(a, path, &cfg->expert, xe);
  nb_dot_dims dn = {.n_contract = 1, .n_batch = 1, .lhs_contract = {1}, .rhs_contract = {0},
                    .lhs_batch = {0}, .rhs_batch = {1}};
  return nb_dot_general(nb_convert(gate_dense, nb_val_dtype(h)), h, &dn, NB_DTYPE_COUNT);
}

/* Capacity-limited dispatch: onehot [N, K, E] choices, gates [N, K]. */
static nb_val *with_capacity(nb_nn_apply *a, const char *path, const nb_nn_moe_cfg *cfg, nb_val *xf, nb_val *onehot,
                             nb_val *gates, nb_val **kept_frac) {
  int64_t N = nb_val_dim(xf, 0), E = cfg->n_experts, K = cfg->top_k;
  int64_t C = (int64_t)ceil(cfg->capacity_factor * (double)N * (double)K / (double)E);
  if (C < 1) C = 1;
  if (C > N) C = N;
  /* slot of each choice in its expert: first choices of all tokens first */
  static const int nke_to_kne[3] = {1, 0, 2};
  nb_val *order = nb_nn__reshape(nb_transpose(onehot, nke_to_kne), 2, (int64_t[2]){K * N, E});
  nb_val *slot = nb_mul(nb_sub(nb_cumsum(order, 0, false), nb_nn__scalar(order, 1)), order);
  slot = nb_transpose(nb_nn__reshape(slot, 3, (int64_t[3]){K, N, E}), nke_to_kne);
  int ax2[1] = {2};
  nb_val *slot_tok = nb_reduce_sum(slot, 1, ax2); /* [N, K] */
  nb_val *keep = nb_convert(nb_lt(slot_tok, nb_nn__scalar(slot_tok, (double)C)), nb_val_dtype(onehot));
  *kept_frac = nb_div(nb_reduce_sum(keep, 0, NULL), nb_nn__scalar(keep, (double)(N * K)));
  nb_val *ic = nb_iota(a->g, nb_val_dtype(onehot), 1, &C, 0);
  nb_val *oc = nb_mul(nb_convert(nb_eq(nb_expand_dims(slot_tok, 2), ic), nb_val_dtype(onehot)), nb_expand_dims(keep, 2));
  nb_dot_dims nk = {.n_contract = 1, .n_batch = 1, .lhs_contract = {1}, .rhs_contract = {1},
                    .lhs_batch = {0}, .rhs_batch = {0}};
  nb_val *dispatch = nb_dot_general(onehot, oc, &nk, NB_DTYPE_COUNT);                          /* [N, E, C] */
  nb_val *combine = nb_dot_general(nb_mul(onehot, nb_expand_dims(gates, 2)), oc, &nk, NB_DTYPE_COUNT);
  nb_dot_dims dx = {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {0}};
  nb_val *xe = nb_dot_general(nb_convert(dispatch, nb_val_dtype(xf)), xf, &dx, NB_DTYPE_COUNT); /* [E, C, d] */
  /* expert parallel: block i of E / E_p experts to process i, which gets [E / E_p, E_p C, d] (every process's
   * slots for its experts, in process order); the outputs go back the same way. AD transposes each into the
   * other's exchange, so the gradients of this process's experts come from every process's tokens. */
  if (a->expert_axis) xe = nb_all_to_all(xe, a->expert_axis, 0, 1);
  nb_val *h = experts(a, path, &cfg->expert, xe);
  if (a->expert_axis) h = nb_all_to_all(h, a->expert_axis, 1, 0); /* [E, C, d] */
  nb_dot_dims dc = {.n_contract = 2, .lhs_contract = {1, 2}, .rhs_contract = {0, 1}};
  return nb_dot_general(nb_convert(combine, nb_val_dtype(h)), h, &dc, NB_DTYPE_COUNT); /* [N, d] */
}

static bool check_cfg(nb_nn_apply *a, const char *path, const nb_nn_moe_cfg *cfg, nb_val *x) {
  if (cfg->n_experts < 1 || cfg->top_k < 1 || cfg->top_k > cfg->n_experts || cfg->n_shared < 0)
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: moe '%s': need 1 <= top_k (%lld) <= n_experts (%lld), n_shared >= 0", path,
                      (long long)cfg->top_k, (long long)cfg->n_experts),
           false;
  if (cfg->score < 0 || cfg->score >= NB_NN_SCORE_COUNT)
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: moe '%s': unknown router score %d", path, (int)cfg->score), false;
  if (a->expert_axis) {
    nb_comm *c = nb_ctx_axis(nb_graph_ctx(a->g), a->expert_axis);
    int64_t ep = c ? c->ops->size(c) : 0;
    if (!c)
      return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: moe '%s': expert axis '%s' is not bound on the context", path,
                        a->expert_axis),
             false;
    if (cfg->n_experts % ep)
      return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: moe '%s': n_experts (%lld) is not a multiple of the %lld processes of "
                        "expert axis '%s'", path, (long long)cfg->n_experts, (long long)ep, a->expert_axis),
             false;
    if (cfg->capacity_factor <= 0)
      return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "nn: moe '%s': expert parallelism needs a capacity factor > 0 (dropless "
                        "dispatch is not split over processes); n_experts / top_k = %g drops no token", path,
                        (double)cfg->n_experts / (double)cfg->top_k),
             false;
  }
  if (nb_val_rank(x) < 1 || nb_val_dim(x, -1) != cfg->expert.d_model)
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: moe '%s': input has %lld features, d_model is %lld", path,
                      (long long)nb_val_dim(x, -1), (long long)cfg->expert.d_model),
           false;
  return true;
}

nb_val *nb_nn_moe(nb_nn_apply *a, const char *path, const nb_nn_moe_cfg *cfg, nb_val *x, nb_nn_moe_aux *aux) {
  char pr[NB_NN_PATH_MAX], ps[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, pr, path, "router") || !nb_nn__path(a, ps, path, "shared")) return nb_nn__poison(a);
  if (!check_cfg(a, path, cfg, x)) return nb_nn__poison(a);
  nb_aval xa = nb_val_aval(x);
  int64_t D = cfg->expert.d_model, N = nb_shape_size(&xa.shape) / D, E = cfg->n_experts, K = cfg->top_k;
  nb_val *xf = nb_nn__reshape(x, 2, (int64_t[2]){N, D});
  nb_val *logits = nb_nn__upcast(nb_nn_linear(a, pr, xf)); /* [N, E] */
  if (nb_graph_status(a->g)) return nb_nn__poison(a);
  if (nb_val_dim(logits, 1) != E)
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: moe router '%s' has %lld outputs for %lld experts", pr,
                      (long long)nb_val_dim(logits, 1), (long long)E);
  nb_val *scores = cfg->score == NB_NN_SCORE_SOFTMAX ? nb_nn_softmax(logits, -1) : nb_logistic(logits);
  nb_val *top_i = NULL;
  nb_val *gates = nb_top_k(scores, (int)K, &top_i); /* [N, K] */
  if (cfg->renormalize) gates = nb_div(gates, nb_nn__sum_last(gates));
  if (cfg->route_scale > 0 && cfg->route_scale != 1) gates = nb_mul(gates, nb_nn__scalar(gates, cfg->route_scale));
  nb_val *ie = nb_iota(a->g, NB_I32, 1, &E, 0);
  nb_val *onehot = nb_convert(nb_eq(nb_expand_dims(top_i, 2), ie), nb_val_dtype(scores)); /* [N, K, E] */
  nb_val *kept = NULL, *out;
  if (cfg->capacity_factor > 0) {
    out = with_capacity(a, path, cfg, xf, onehot, gates, &kept);
  } else {
    int ax1[1] = {1};
    out = dropless(a, path, cfg, xf, nb_reduce_sum(nb_mul(onehot, nb_expand_dims(gates, 2)), 1, ax1));
  }
  if (cfg->n_shared > 0) {
    nb_nn_mlp_cfg sh = cfg->expert;
    sh.d_ff *= cfg->n_shared;
    sh.bias = false;
    out = nb_add(out, nb_nn_mlp(a, ps, &sh, xf));
  }
  if (aux) {
    int ax01[2] = {0, 1}, ax0[1] = {0};
    nb_val *probs = cfg->score == NB_NN_SCORE_SOFTMAX ? scores : nb_div(scores, nb_nn__sum_last(scores));
    nb_val *load = nb_reduce_sum(onehot, 2, ax01); /* [E] */
    nb_val *frac = nb_div(load, nb_nn__scalar(load, (double)(N * K)));
    nb_val *mean_p = nb_div(nb_reduce_sum(probs, 1, ax0), nb_nn__scalar(probs, (double)N));
    aux->lb_loss = nb_mul(nb_nn__scalar(frac, (double)E), nb_reduce_sum(nb_mul(frac, mean_p), 0, NULL));
    nb_val *lse = nb_nn_logsumexp(logits, -1);
    aux->z_loss = nb_div(nb_reduce_sum(nb_mul(lse, lse), 0, NULL), nb_nn__scalar(lse, (double)N));
    aux->dropped = kept ? nb_sub(nb_nn__scalar(kept, 1), kept) : nb_scalar(a->g, nb_val_dtype(scores), 0);
    aux->load = load;
  }
  out = nb_reshape(out, xa.shape.rank, xa.shape.dims);
  return nb_val_dtype(out) == xa.dtype ? out : nb_convert(out, xa.dtype);
}
