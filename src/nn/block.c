/* The pre-norm transformer block: attention and an MLP (or MoE layer), each
 * behind a norm and added back to the residual stream. Model-level choices
 * (embeddings, final norm, heads, remat) belong to the models library. */
#include "nn/internal.h"

nb_status nb_nn_block_init(nb_nn_init *in, const char *path, const nb_nn_block_cfg *cfg, double std, double std_out,
                           double router_std) {
  char p[NB_NN_PATH_MAX];
  int64_t d = cfg->attn.d_model;
  nb_status s = NB_OK;
  if (!nb_nn__init_path(in, p, path, "attn_norm")) return NB_ERR_INVALID_ARG;
  if (!s) s = nb_nn_norm_init(in, p, &cfg->norm, d);
  if (!s && !nb_nn__init_path(in, p, path, "attn")) return NB_ERR_INVALID_ARG;
  if (!s) s = nb_nn_attention_init(in, p, &cfg->attn, std, std_out);
  if (!s && !nb_nn__init_path(in, p, path, "mlp_norm")) return NB_ERR_INVALID_ARG;
  if (!s) s = nb_nn_norm_init(in, p, &cfg->norm, d);
  if (!s && !nb_nn__init_path(in, p, path, cfg->use_moe ? "moe" : "mlp")) return NB_ERR_INVALID_ARG;
  if (!s) s = cfg->use_moe ? nb_nn_moe_init(in, p, &cfg->moe, std, std_out, router_std)
                           : nb_nn_mlp_init(in, p, &cfg->mlp, std, std_out);
  return s;
}

nb_val *nb_nn_block(nb_nn_apply *a, const char *path, const nb_nn_block_cfg *cfg, nb_val *x, nb_nn_attn_io *io,
                    nb_nn_moe_aux *aux) {
  char pn1[NB_NN_PATH_MAX], pa[NB_NN_PATH_MAX], pn2[NB_NN_PATH_MAX], pf[NB_NN_PATH_MAX], pd1[NB_NN_PATH_MAX],
      pd2[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, pn1, path, "attn_norm") || !nb_nn__path(a, pa, path, "attn") ||
      !nb_nn__path(a, pn2, path, "mlp_norm") || !nb_nn__path(a, pf, path, cfg->use_moe ? "moe" : "mlp") ||
      !nb_nn__path(a, pd1, path, "attn_dropout") || !nb_nn__path(a, pd2, path, "mlp_dropout"))
    return nb_nn__poison(a);
  nb_val *h = nb_nn_attention(a, pa, &cfg->attn, nb_nn_norm_apply(a, pn1, &cfg->norm, x), io);
  x = nb_add(x, nb_nn_dropout(a, pd1, h, cfg->resid_dropout));
  nb_val *n2 = nb_nn_norm_apply(a, pn2, &cfg->norm, x);
  nb_val *f = cfg->use_moe ? nb_nn_moe(a, pf, &cfg->moe, n2, aux) : nb_nn_mlp(a, pf, &cfg->mlp, n2);
  return nb_add(x, nb_nn_dropout(a, pd2, f, cfg->resid_dropout));
}
