/* Model presets (GPT-2, Llama 2/3, Mixtral, DeepSeek-style MoE), the model
 * config's validation, and the translation of a model config into the nn
 * library's block configs. The YAML side is config.c. */
#include <math.h>
#include <string.h>

#include "nabla/models.h"

static void gpt2_base(nb_model_config *c) {
  memset(c, 0, sizeof *c);
  c->family = NB_MODEL_GPT2;
  c->norm = NB_NN_LAYERNORM;
  c->norm_eps = 1e-5;
  c->act = NB_NN_GELU_TANH;
  c->bias = true;
  c->learned_pos = true;
  c->tie_embeddings = true;
  c->init_std = 0.02;
  c->scaled_init = true;
  c->rope_cfg.theta = 10000;
}

static void llama_base(nb_model_config *c) {
  memset(c, 0, sizeof *c);
  c->family = NB_MODEL_LLAMA;
  c->norm = NB_NN_RMSNORM;
  c->norm_eps = 1e-5;
  c->act = NB_NN_SILU;
  c->gated_mlp = true;
  c->rope = true;
  c->rope_cfg.theta = 10000;
  c->init_std = 0.02;
  c->router_score = NB_NN_SCORE_SOFTMAX;
  c->route_scale = 1;
  c->router_init_std = 0.02;
}

static void dims(nb_model_config *c, int64_t v, int64_t d, int64_t l, int64_t h, int64_t hkv, int64_t ff, int64_t t) {
  c->vocab_size = v;
  c->d_model = d;
  c->n_layers = l;
  c->n_heads = h;
  c->n_kv_heads = hkv;
  c->d_ff = ff;
  c->max_seq_len = t;
}

static void mixtral(nb_model_config *c, int64_t e, int64_t k, int64_t ff) {
  c->n_experts = e;
  c->top_k = k;
  c->moe_d_ff = ff;
  c->router_renormalize = true;
  c->lb_loss_coef = 0.01;
}

static const char *const preset_names[] = {"gpt2-tiny", "gpt2-124m", "llama-tiny", "llama2-7b", "llama3-8b",
                                           "mixtral-tiny", "mixtral-8x7b", "deepseek-tiny", NULL};

const char *const *nb_model_preset_names(void) { return preset_names; }

nb_status nb_model_config_preset(nb_ctx *ctx, const char *name, nb_model_config *c) {
  if (!name || !c) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model preset: NULL name or config");
  if (!strcmp(name, "gpt2-tiny")) {
    gpt2_base(c);
    dims(c, 256, 128, 4, 4, 4, 512, 128);
  } else if (!strcmp(name, "gpt2-124m")) {
    gpt2_base(c);
    dims(c, 50257, 768, 12, 12, 12, 3072, 1024);
  } else if (!strcmp(name, "llama-tiny")) {
    llama_base(c);
    dims(c, 256, 128, 4, 4, 2, 384, 128);
  } else if (!strcmp(name, "llama2-7b")) {
    llama_base(c);
    dims(c, 32000, 4096, 32, 32, 32, 11008, 4096);
  } else if (!strcmp(name, "llama3-8b")) {
    llama_base(c);
    dims(c, 128256, 4096, 32, 32, 8, 14336, 8192);
    c->rope_cfg.theta = 500000;
  } else if (!strcmp(name, "mixtral-tiny")) {
    llama_base(c);
    dims(c, 256, 128, 4, 4, 2, 384, 128);
    mixtral(c, 8, 2, 256);
  } else if (!strcmp(name, "mixtral-8x7b")) {
    llama_base(c);
    dims(c, 32000, 4096, 32, 32, 8, 14336, 32768);
    c->rope_cfg.theta = 1e6;
    mixtral(c, 8, 2, 14336);
  } else if (!strcmp(name, "deepseek-tiny")) {
    /* fine-grained experts (d_ff / 6 each), 2 shared, sigmoid router with
     * normalized top-k weights, the first layer dense */
    llama_base(c);
    dims(c, 256, 128, 4, 4, 4, 384, 128);
    mixtral(c, 16, 4, 64);
    c->n_shared_experts = 2;
    c->router_score = NB_NN_SCORE_SIGMOID;
    c->route_scale = 2.5;
    c->first_dense_layers = 1;
    c->lb_loss_coef = 0.001;
  } else {
    char list[256] = "";
    for (int i = 0; preset_names[i]; i++) {
      strcat(list, i ? ", " : "");
      strcat(list, preset_names[i]);
    }
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "model.preset: unknown preset '%s' (allowed: %s)", name, list);
  }
  return NB_OK;
}

int64_t nb_model_head_dim(const nb_model_config *c) {
  return c->head_dim > 0 ? c->head_dim : c->n_heads > 0 ? c->d_model / c->n_heads : 0;
}

#define REQUIRE(cond, ...) \
  do {                     \
    if (!(cond)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, __VA_ARGS__); \
  } while (0)

nb_status nb_model_config_validate(nb_ctx *ctx, const nb_model_config *c) {
  REQUIRE(c->family >= 0 && c->family < NB_MODEL_FAMILY_COUNT, "model.family: invalid value %d", (int)c->family);
  REQUIRE(c->vocab_size >= 1, "model.vocab_size must be >= 1, not %lld", (long long)c->vocab_size);
  REQUIRE(c->d_model >= 1 && c->n_layers >= 1 && c->n_heads >= 1 && c->d_ff >= 1 && c->max_seq_len >= 1,
          "model.d_model, n_layers, n_heads, d_ff and max_seq_len must be >= 1");
  REQUIRE(c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0,
          "model.n_kv_heads (%lld) must divide model.n_heads (%lld)", (long long)c->n_kv_heads, (long long)c->n_heads);
  REQUIRE(c->head_dim > 0 || c->d_model % c->n_heads == 0,
          "model.d_model (%lld) must be a multiple of model.n_heads (%lld) when model.head_dim is 0",
          (long long)c->d_model, (long long)c->n_heads);
  REQUIRE(c->head_dim >= 0, "model.head_dim must be >= 0");
  REQUIRE(!c->rope || nb_model_head_dim(c) % 2 == 0, "model.head_dim (%lld) must be even with model.rope",
          (long long)nb_model_head_dim(c));
  REQUIRE(c->norm_eps > 0 && c->norm_eps < 1, "model.norm_eps must be in (0, 1), not %g", c->norm_eps);
  REQUIRE(c->dropout >= 0 && c->dropout < 1 && c->attn_dropout >= 0 && c->attn_dropout < 1,
          "model.dropout and model.attn_dropout must be in [0, 1)");
  REQUIRE(c->init_std >= 0, "model.init_std must be >= 0");
  if (c->rope) {
    double f[4];
    nb_nn_rope_cfg r = c->rope_cfg;
    if (nb_nn_rope_freqs(ctx, &r, 2, f)) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model.rope: %s", msg);
    }
  }
  if (c->n_experts > 0) {
    REQUIRE(c->top_k >= 1 && c->top_k <= c->n_experts, "model.top_k (%lld) must be in [1, model.n_experts = %lld]",
            (long long)c->top_k, (long long)c->n_experts);
    REQUIRE(c->moe_d_ff >= 1, "model.moe_d_ff must be >= 1 with experts");
    REQUIRE(c->n_shared_experts >= 0, "model.n_shared_experts must be >= 0");
    REQUIRE(c->first_dense_layers >= 0 && c->first_dense_layers < c->n_layers,
            "model.first_dense_layers (%lld) must be in [0, model.n_layers = %lld)", (long long)c->first_dense_layers,
            (long long)c->n_layers);
    REQUIRE(c->route_scale >= 0 && c->lb_loss_coef >= 0 && c->z_loss_coef >= 0 && c->router_init_std >= 0,
            "model.route_scale, lb_loss_coef, z_loss_coef and router_init_std must be >= 0");
  } else {
    REQUIRE(c->n_experts == 0, "model.n_experts must be >= 0");
  }
  return NB_OK;
}

nb_nn_block_cfg nb_model_block_cfg(const nb_model_config *c, int64_t layer) {
  nb_nn_block_cfg b;
  memset(&b, 0, sizeof b);
  b.norm = (nb_nn_norm_cfg){.kind = c->norm, .eps = c->norm_eps, .bias = c->bias};
  b.attn = (nb_nn_attn_cfg){.d_model = c->d_model, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
                            .head_dim = nb_model_head_dim(c), .bias = c->bias, .qkv_bias = c->qkv_bias, .rope = c->rope,
                            .rope_cfg = c->rope_cfg, .causal = true, .dropout = c->attn_dropout};
  b.mlp = (nb_nn_mlp_cfg){.d_model = c->d_model, .d_ff = c->d_ff, .act = c->act, .gated = c->gated_mlp, .bias = c->bias};
  b.use_moe = c->n_experts > 0 && layer >= c->first_dense_layers;
  b.moe = (nb_nn_moe_cfg){.n_experts = c->n_experts, .top_k = c->top_k, .n_shared = c->n_shared_experts,
                          .expert = {.d_model = c->d_model, .d_ff = c->moe_d_ff, .act = c->act, .gated = c->gated_mlp},
                          .score = c->router_score, .renormalize = c->router_renormalize,
                          .route_scale = c->route_scale, .capacity_factor = c->capacity_factor};
  b.resid_dropout = c->dropout;
  return b;
}
