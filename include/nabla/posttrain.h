/* nabla posttrain: post-training on top of the trainer (the analogue of
 * Tunix, with PEFT's LoRA). docs/posttrain.md has the whole story.
 *
 * LoRA adapts chosen linears of a frozen base model: y = x W + s (drop(x) A) B
 * with A [d_in, r], B [r, d_out], s = alpha / r (rsLoRA: alpha / sqrt(r)).
 * It enters the model through the linear hook (nb_nn_apply.linear_hook), so
 * model code does not change. The adapters are their own tree whose paths
 * mirror the base's ("layers/0/attn/wq/lora_a", ".../lora_b" beside the
 * base's "layers/0/attn/wq/kernel"); the two trees share no path, so a step
 * gets the adapters as "params/<p>" (differentiated, updated) and the base as
 * "frozen/<p>" (nb_model_trace_opts.frozen_spec: no gradient, no optimizer
 * state). QLoRA is the same over a base quantized by quant rules (nb_quant_ptq):
 * the hook runs the base product as quant.matmul.
 *
 * Example:
 *
 *   nb_pt_lora_config lc = {.target = ".*attn/w[qv]", .rank = 8, .alpha = 16};
 *   nb_tree *ad = nb_pt_lora_init(ctx, &lc, base, key, NB_F32);
 *   nb_pt_lora *l = nb_pt_lora_create(ctx, &lc, base, ad);
 *   nb_model_trace_opts o = {.linear_hook = nb_pt_lora_hook, .hook_ud = l, .frozen_spec = base};
 *   nb_graph *loss = nb_model_trace_loss(ctx, &cfg, &o, ad, batch_spec);   // params = adapters
 *   ...
 *   nb_tree *merged = nb_pt_lora_merge(ctx, &lc, base, ad);                // W + s A B, plain f32 tree
 */
#ifndef NABLA_POSTTRAIN_H
#define NABLA_POSTTRAIN_H

#include "nabla/export.h"
#include "nabla/core.h"
#include "nabla/nn.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* LoRA */
/* ------------------------------------------------------------------------ */

/* A's initialisation (B is always zeros, so an adapted model starts as the
 * base): PEFT's default kaiming_uniform(a = sqrt(5)), i.e. uniform in
 * [-1/sqrt(d_in), 1/sqrt(d_in)], or gaussian with std 1/r. */
typedef enum nb_pt_lora_init_kind { NB_PT_LORA_INIT_KAIMING_UNIFORM, NB_PT_LORA_INIT_GAUSSIAN, NB_PT_LORA_INIT_COUNT } nb_pt_lora_init_kind;

typedef struct nb_pt_lora_config {
  const char *target;          /* PCRE2 regex (Python re syntax), matched in full against module paths
                                  ("layers/3/attn/wq", "layers/3/mlp/wi_0", "lm_head") */
  int64_t rank;                /* r >= 1 */
  double alpha;                /* > 0 */
  double dropout;              /* on the adapter's input, in [0, 1); only when tracing with train */
  bool rslora;                 /* scale alpha / sqrt(r) instead of alpha / r */
  nb_pt_lora_init_kind init;
} nb_pt_lora_config;

/* Errors name the field ("lora.rank: 0 ..."). */
nb_status nb_pt_lora_config_check(nb_ctx *ctx, const nb_pt_lora_config *c);
double nb_pt_lora_scale(const nb_pt_lora_config *c);
const char *nb_pt_lora_init_name(nb_pt_lora_init_kind k);
nb_status nb_pt_lora_init_parse(nb_ctx *ctx, const char *s, nb_pt_lora_init_kind *out);

/* The adapter tree (new) for every linear <m> of base whose module path the
 * target matches: a rank-2 "<m>/kernel" [d_in, d_out] or a quantized one
 * ("<m>/kernel/quant", nb_quant_ptq): "<m>/lora_a" [d_in, r], "<m>/lora_b"
 * [r, d_out] in dtype, in base's order. A from fold_in(key, hash("<m>/lora_a"))
 * (nb_nn_leaf_key). Errors: a bad config or regex, a matched stacked
 * (per-expert) kernel, no linear matched (the message lists the linears). */
nb_tree *nb_pt_lora_init(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, nb_array *key, nb_dtype dtype);

/* The hook's plan (its user data): which modules have adapters, the scale,
 * the dropout and the base's quantized linears. base and adapters may be
 * trees of arrays or avals (borrowed only during the call). Every adapter
 * must sit on a linear of base with fitting shapes (errors name the path). */
typedef struct nb_pt_lora nb_pt_lora;
nb_pt_lora *nb_pt_lora_create(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, const nb_tree *adapters);
void nb_pt_lora_destroy(nb_pt_lora *l); /* NULL ok */
int64_t nb_pt_lora_count(const nb_pt_lora *l); /* adapted linears */

/* The linear hook (ud: an nb_pt_lora). An adapted linear: the base product
 * (quant.matmul for a quantized kernel, else x @ kernel, + bias) plus
 * s * (dropout(x) @ lora_a) @ lora_b, the adapters read from a->params; any
 * other linear: the base product alone. */
nb_val *nb_pt_lora_hook(void *lora, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);

/* The merged model (new tree, base's paths and order): each adapted
 * "<m>/kernel" becomes W + s * A @ B (summed in f64, rounded once to W's
 * dtype; a quantized kernel is dequantized first and leaves as f32); every
 * other leaf is base's, shared. */
nb_tree *nb_pt_lora_merge(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, const nb_tree *adapters);

NB_END_DECLS
#endif /* NABLA_POSTTRAIN_H */
