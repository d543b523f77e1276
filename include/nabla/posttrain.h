/* nabla posttrain: post-training on top of the trainer (the analogue of
 * Tunix and TRL, with PEFT's LoRA): LoRA/QLoRA and SFT, and preference
 * optimization (DPO, IPO, hinge, ORPO) whose losses are traced into the
 * trainer's step. docs/posttrain.md has the whole story.
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

#include <stdio.h>

#include "nabla/export.h"
#include "nabla/core.h"
#include "nabla/data.h"
#include "nabla/models.h"
#include "nabla/nn.h"
#include "nabla/serve.h"
#include "nabla/train.h"

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

/* The hook's plan (its user data): which modules have adapters (c->target
 * is not used: the adapters say where they go), the scale,
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

/* PEFT's format, for the Hugging Face model nb_model_save_hf writes model as
 * (NULL: a Llama-architecture one; the module names of
 * nb_model_hf_name_for): DIR/adapter_config.json ({"peft_type": "LORA", "r",
 * "lora_alpha", "lora_dropout", "use_rslora", "target_modules": a regex
 * matching exactly the adapted modules' full names, ...}) and
 * DIR/adapter_model.safetensors with "base_model.model.<module>.lora_A.weight"
 * f32[r, in] (A transposed) and ".lora_B.weight" f32[out, r].
 * GPT-2 ("fan_in_fan_out": true): its c_attn computes q, k and v at once, so
 * the k of them adapted become one LoRA of rank k r (A: their A^T stacked;
 * B [3 d, k r]: each B^T in its projection's rows and its A's columns, zeros
 * elsewhere), with rank_pattern k r and alpha_pattern k alpha (rsLoRA:
 * sqrt(k) alpha) for it, and a README.md saying so.
 * Save: DIR is created (it must not exist as a file); a module without a
 * Hugging Face name is an error naming it. Load: the adapters for base
 * (shapes checked against its linears, errors naming the tensor) and *c from
 * the config (target NULL: the adapters say which modules); a GPT-2 c_attn
 * LoRA of rank r (PEFT's own: one A for q, k and v) becomes q, k and v
 * adapters sharing that A, one of rank k r (nabla's stacking) is split back;
 * per-module ranks or alphas otherwise, a c_attn B that is not
 * block-structured, DoRA and fan_in_fan_out on a non-GPT-2 base are refused
 * naming the field or tensor. */
nb_status nb_pt_lora_save_peft(nb_ctx *ctx, const char *dir, const nb_pt_lora_config *c, const nb_model_config *model,
                               const nb_tree *adapters, const char *base_model_name);
nb_tree *nb_pt_lora_load_peft(nb_ctx *ctx, const char *dir, const nb_model_config *model, const nb_tree *base,
                              nb_pt_lora_config *c);

/* ------------------------------------------------------------------------ */
/* SFT */
/* ------------------------------------------------------------------------ */

/* Supervised fine-tuning data: JSONL, one example a line, either
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 * rendered with a serving chat template (nb_serve_chat_render), trained on
 * every assistant turn (its content and end of turn), or
 *   {"prompt": "...", "completion": "..."}
 * trained on the completion (and the EOS id after it). The loss mask covers
 * those tokens only. Each part is tokenized on its own, so a mask boundary
 * is a token boundary. */
struct nb_tok;
typedef struct nb_pt_sft_data_opts {
  nb_serve_chat_format chat;   /* for "messages" lines (NB_SERVE_CHAT_NONE: such lines are refused) */
  const struct nb_tok *tok;    /* NULL: byte-level ids (the byte values) */
  int32_t bos_id;              /* prepended when >= 0 (messages: when the format wants it) */
  int32_t eos_id;              /* appended after a completion when >= 0 (trained on) */
  int64_t max_len;             /* tokens kept per example (the rest cut); 0: all */
} nb_pt_sft_data_opts;

typedef struct nb_pt_sft_example {
  int32_t *ids;
  uint8_t *train;              /* train[i]: ids[i] is a completion token (loss on predicting it) */
  int64_t len;
} nb_pt_sft_example;

typedef struct nb_pt_sft_data {
  int64_t n;
  nb_pt_sft_example *ex;
  int64_t tokens, train_tokens; /* over all examples */
} nb_pt_sft_data;

/* Reads path into *out (free with nb_pt_sft_data_free). A bad line is an
 * error naming "path:line" and the field: not JSON, neither messages nor
 * prompt/completion, a field of the wrong type, a bad role, no assistant
 * message, fewer than 2 tokens. An empty file is an error too. */
nb_status nb_pt_sft_load(nb_ctx *ctx, const char *path, const nb_pt_sft_data_opts *opts, nb_pt_sft_data *out);
void nb_pt_sft_data_free(nb_pt_sft_data *d); /* zeroed; ok twice */

/* A map dataset over d (borrowed: it must outlive the dataset): element i
 * is {"inputs": i32[n-1], "targets": i32[n-1], "mask": f32[n-1]}, the next-
 * token pairs of example i with mask 1 where the target is trained on.
 * nb_data_iter_pack packs them into rows with segment_ids and positions, the
 * batch nb_model_loss takes. */
nb_data_map *nb_pt_sft_map(nb_ctx *ctx, const nb_pt_sft_data *d);

/* `nabla sft CONFIG [key=value ...]`: a run configuration (train.h's keys;
 * data.train / data.eval are JSONL files of the format above, data.seq_len
 * the packed row length) plus these sections:
 *   sft.base           the model to start from: a run dir or a checkpoint step dir (its model
 *                      config replaces model.*; its tokenizer is used)
 *   sft.chat_template  chatml (default), llama-3, gemma, llama-2, mistral
 *   sft.quant_rules    QLoRA: a quant rules YAML (nabla/quant.h) the base is quantized by
 *   lora.target        a module-path regex: LoRA on those linears; "" (default): full fine-tuning
 *   lora.rank, lora.alpha, lora.dropout, lora.rslora, lora.init
 *   lora.merge_at_end  write DIR/merged, a run dir of the merged model, after the last step */
typedef struct nb_pt_sft_config {
  char base[NB_TRAIN_STR_MAX];
  nb_serve_chat_format chat;
  char quant_rules[NB_TRAIN_STR_MAX];
  char lora_target[NB_TRAIN_STR_MAX];
  nb_pt_lora_config lora;      /* lora.target is set from lora_target where it is used */
  bool merge_at_end;
} nb_pt_sft_config;

void nb_pt_sft_config_defaults(nb_pt_sft_config *c);
/* The file (path NULL: defaults) and the overrides into both configs (the
 * run config is validated when the run starts, with the base's model);
 * errors name file:line (or the override) and the key. */
nb_status nb_pt_sft_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                nb_pt_sft_config *sft, nb_train_config *train);
/* The sft and lora sections as YAML (malloc'd; NULL when out of memory). */
char *nb_pt_sft_config_yaml(const nb_pt_sft_config *c);

/* Runs (or resumes) SFT into opts->run_dir through nb_train_run: the base
 * loaded, the data rendered, tokenized and packed, the adapters (or the
 * whole model) trained with the base frozen; checkpoints hold the trainable
 * parameters only (the adapters with LoRA). With merge_at_end, the merged
 * model is written to DIR/merged once the last step is done. */
nb_status nb_pt_sft_run(nb_ctx *ctx, const nb_pt_sft_config *sft, const nb_train_config *cfg, const nb_train_opts *opts,
                        nb_train_result *out);
/* `nabla lora merge RUN_DIR OUT_DIR`: the latest adapters of a LoRA SFT run
 * merged into its base, written as a run dir (config.yaml, checkpoints/,
 * tokenizer.json when the base has a BPE tokenizer). OUT_DIR must not exist. */
nb_status nb_pt_lora_merge_run(nb_ctx *ctx, const char *run_dir, const char *out_dir);
/* `nabla lora export-peft RUN_DIR OUT_DIR`: its latest adapters in PEFT's
 * format (nb_pt_lora_save_peft; a Llama-architecture or GPT-2 base). */
nb_status nb_pt_lora_export_peft_run(nb_ctx *ctx, const char *run_dir, const char *out_dir);

/* ------------------------------------------------------------------------ */
/* preference optimization                                                   */
/* ------------------------------------------------------------------------ */

/* A batch of B preference pairs is 2B rows: the B chosen completions, then
 * the B rejected ones, each row prompt + completion, right-padded to T.
 * Losses follow TRL (trl 1.16 DPOTrainer._compute_loss and ORPOTrainer;
 * docs/posttrain.md "Preference optimization"), with
 *   logratio_c = logp(chosen) - ref_logp(chosen),  the same for rejected,
 *   d = logratio_c - logratio_r:
 *   sigmoid  -(1 - ls) log sigmoid(beta d) - ls log sigmoid(-beta d)  (DPO; ls > 0 is cDPO)
 *   ipo      (d' - 1 / (2 beta))^2, d' the difference of the logratios
 *            divided by each completion's token count (TRL's normalization)
 *   hinge    max(0, 1 - beta d)
 *   orpo     NLL(chosen) - lambda log sigmoid(log_odds), log_odds =
 *            (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r)), a = the mean
 *            token log-prob of the completion; no reference model.
 * Rewards: beta * logratio (ORPO: lambda * a), accuracy = mean(reward_c >
 * reward_r), margin = mean(reward_c - reward_r). */
typedef enum nb_pt_pref_loss_type {
  NB_PT_PREF_SIGMOID, NB_PT_PREF_IPO, NB_PT_PREF_HINGE, NB_PT_PREF_ORPO, NB_PT_PREF_COUNT
} nb_pt_pref_loss_type;
/* "sigmoid", "ipo", "hinge", "orpo" (NULL out of range). */
const char *nb_pt_pref_loss_name(nb_pt_pref_loss_type t);

typedef struct nb_pt_pref_opts {
  nb_pt_pref_loss_type loss_type;
  double beta;             /* DPO's beta, IPO's tau; > 0 (TRL's default 0.1) */
  double label_smoothing;  /* sigmoid only: the probability that a label is flipped, in [0, 0.5) */
  double orpo_lambda;      /* ORPO: weight of the odds-ratio term, > 0 (TRL's ORPOConfig.beta, 0.1) */
} nb_pt_pref_opts;

/* Sequence log-probabilities: logits [N, T, V] (float), targets integer
 * [N, T] (the next tokens), mask [N, T] (bool or float: 1 on the completion's
 * targets) -> [N] sum over T of mask * log softmax(logits)[target]; with
 * mean, divided by the mask's count (at least 1). Logits' dtype. NULL with
 * the error on the graph for mismatched shapes or dtypes. */
nb_val *nb_pt_seq_logps(nb_val *logits, nb_val *targets, nb_val *mask, bool mean);
/* Per-token log-probabilities: logits [N, T, V], targets integer [N, T] ->
 * [N, T] log softmax(logits)[target] (TRL's selective_log_softmax). */
nb_val *nb_pt_token_logps(nb_val *logits, nb_val *targets);

/* What the loss reads, all values of one graph. */
typedef struct nb_pt_pref_in {
  nb_val *logits;          /* the policy's [2B, T, V] */
  nb_val *targets, *mask;  /* [2B, T]: next tokens; 1 on completion targets */
  nb_val *valid;           /* [2B, T]: 1 on every non-padding target (ORPO's NLL, as TRL: prompt and
                              completion); NULL: mask */
  nb_val *ref_logps;       /* [2B] the reference model's sequence log-prob sums (of the same rows;
                              gradients stopped here); required but for ORPO */
} nb_pt_pref_in;

typedef struct nb_pt_pref_out {
  nb_val *loss;                                /* scalar: the mean over pairs */
  nb_val *chosen_rewards, *rejected_rewards;   /* [B], no gradient */
  nb_val *accuracy, *margin;                   /* scalars, no gradient */
  nb_val *chosen_logps, *rejected_logps;       /* [B] sums (ORPO: means), no gradient */
  nb_val *nll, *log_odds_ratio, *log_odds;     /* ORPO only (scalars: NLL, mean log sigmoid(log_odds),
                                                  mean log_odds), else NULL */
} nb_pt_pref_out;

/* Traces the preference loss of o over in into out. NB_ERR_INVALID_ARG for
 * options out of range (named), NB_ERR_SHAPE for mismatched inputs (an odd
 * row count, ref_logps not [2B]). */
nb_status nb_pt_pref_loss(const nb_pt_pref_opts *o, const nb_pt_pref_in *in, nb_pt_pref_out *out);

/* Preference data: JSONL, one pair per line, {"prompt": "...", "chosen":
 * "...", "rejected": "..."} (strings; TRL's "explicit prompt" format).
 * Prompt and completion are tokenized apart and joined (the tokenizer's eos,
 * if any, closes each completion), so pair i becomes two rows, chosen and
 * rejected, of T = seq_len next-token positions:
 *   "inputs", "targets"  i32 [P, 2, T]  tokens and next tokens, 0 after the end
 *   "mask"               f32 [P, 2, T]  1 where the target is a completion token
 *   "valid"              f32 [P, 2, T]  1 where the target is a token (prompt or completion)
 * Pair-major ([P, 2, T], not [2P, T]) so that any slice of pairs keeps its
 * chosen and rejected rows together; the loss takes [2B, T] (chosen rows,
 * then rejected: nb_pt_pref_rows). A completion longer than the room left
 * is cut at the end (counted in n_truncated). Refused with file:line and
 * the field: a line that is not a JSON object, a missing or empty field, a
 * field that is not a string (message lists: nb_pt_pref_data_load_opts), a prompt that leaves no room for a completion token in
 * seq_len, an id at or above vocab_size (> 0). */
typedef struct nb_pt_pref_data_info {
  int64_t pairs, n_truncated, tokens; /* tokens: of all rows, before padding */
  uint64_t xxh3;                      /* of the file's lines (XXH3 of each, combined in order) */
} nb_pt_pref_data_info;
nb_tree *nb_pt_pref_data_load(nb_ctx *ctx, const char *path, const nb_data_tokenizer *tok, int64_t seq_len,
                              int64_t vocab_size, nb_pt_pref_data_info *info);
/* The same with preference rows in TRL's conversational form too:
 *   {"prompt": [messages], "chosen": [assistant messages], "rejected": [...]}
 *   {"chosen": [conversation], "rejected": [conversation]}  (implicit prompt: the messages both start with)
 * rendered with opts->chat (nb_serve_chat_render, the serving templates): the
 * prompt's part is the text before the completion's first assistant turn
 * (the assistant header included), the completion the rest (its content and
 * end-of-turn markers), tokenized apart and masked as the string form (eos
 * after it when the tokenizer has one); opts->bos_id (>= 0) first when the
 * template wants a BOS id. Errors name file:line and the field ("chosen[1].role
 * 'user': a completion holds assistant messages only", a row mixing strings
 * and lists, no chat template). opts NULL: no chat template (message rows are
 * refused). */
typedef struct nb_pt_pref_data_opts {
  nb_serve_chat_format chat;
  int32_t bos_id;
} nb_pt_pref_data_opts;
nb_tree *nb_pt_pref_data_load_opts(nb_ctx *ctx, const char *path, const nb_data_tokenizer *tok, int64_t seq_len,
                                   int64_t vocab_size, const nb_pt_pref_data_opts *opts, nb_pt_pref_data_info *info);
/* x [B, 2, ...] (a value) -> [2B, ...]: the B chosen rows, then the B rejected. */
nb_val *nb_pt_pref_rows(nb_val *x);

/* `nabla dpo`: preference optimization as a task of the trainer
 * (nb_train_run: the run dir, checkpoints, resume, metrics.jsonl,
 * TensorBoard and report are train's). The run config is a train config
 * (data.train / data.eval: JSONL pairs as above, tokenized with
 * data.tokenizer, else the base's tokenizer, else bytes) plus a pref:
 * section, written back into the run dir's config.yaml:
 *   pref:
 *     loss_type: sigmoid        # sigmoid, ipo, hinge, orpo
 *     beta: 0.1
 *     label_smoothing: 0        # sigmoid only (cDPO)
 *     orpo_lambda: 0.1          # orpo only
 *     base: runs/sft            # a run dir or checkpoint step dir to start from ("": a fresh model)
 *     precompute_ref: false     # true: reference log-probs once per pair at the start, not per step
 *     chat_template: chatml     # renders pairs given as messages (nb_pt_pref_data_load_opts)
 * The policy starts from the base's parameters (model: its config) and the
 * reference model is a frozen copy of them, run in the same step (ORPO has
 * none). Metrics (means over the batch, TRL's names): rewards/chosen,
 * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
 * logps/rejected; ORPO also nll_loss, log_odds_ratio, log_odds_chosen;
 * eval records the same as eval_<name>. */
typedef struct nb_pt_pref_config {
  nb_pt_pref_opts loss;
  char base[NB_TRAIN_STR_MAX];
  bool precompute_ref;     /* the reference's log-probs computed once for every pair at the start (a
                              batch field, TRL's precompute_ref_log_probs) instead of in every step */
  nb_serve_chat_format chat; /* pref.chat_template: renders rows given as messages (default chatml) */
} nb_pt_pref_config;

/* sigmoid, beta 0.1, label_smoothing 0, orpo_lambda 0.1, no base, chatml. */
void nb_pt_pref_config_defaults(nb_pt_pref_config *c);
/* The pref: section of the YAML file at path (NULL: defaults; the file's
 * other keys are the trainer's) and "pref.<key>=value" overrides; errors
 * name file:line (or the override) and the key. */
nb_status nb_pt_pref_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                 nb_pt_pref_config *out);
nb_status nb_pt_pref_config_set(nb_ctx *ctx, nb_pt_pref_config *c, const char *assignment);
void nb_pt_pref_config_write(const nb_pt_pref_config *c, FILE *f);
/* Runs (or resumes) the preference training of cfg and pc in
 * opts->run_dir (opts->task is set here); as nb_train_run. */
nb_status nb_pt_pref_run(nb_ctx *ctx, const nb_train_config *cfg, const nb_pt_pref_config *pc, const nb_train_opts *opts,
                         nb_train_result *out);

/* ------------------------------------------------------------------------ */
/* GRPO                                                                      */
/* ------------------------------------------------------------------------ */

/* Group Relative Policy Optimization (TRL 1.16's GRPOTrainer._compute_loss,
 * docs/posttrain.md "GRPO"). Over N completions (G per prompt), with
 * per-token log-probs lp of the policy, old of the policy that sampled them
 * and ref of the reference model, and one advantage A per completion:
 *   r = exp(lp - old), per-token loss -min(r A, clamp(r, 1 - eps_low, 1 + eps_high) A)
 *       + beta (exp(ref - lp) - (ref - lp) - 1)          (k3 KL; beta 0: no reference)
 * aggregated over the completion tokens (mask) by loss_type:
 *   grpo     mean over completions of each one's token mean
 *   bnpo     sum over all tokens / their count (token-level)
 *   dr_grpo  sum over all tokens / (N * max_completion_length)
 *   dapo     sum over all tokens / num_items (the token count of the whole
 *            generation batch, so micro-batches of one batch weigh tokens equally)
 * Metrics (masked token means, TRL's): kl (beta > 0), clip_low (r < 1 -
 * eps_low where A < 0), clip_high (r > 1 + eps_high where A > 0), clip_region
 * (either). */
typedef enum nb_pt_grpo_loss_type {
  NB_PT_GRPO_GRPO, NB_PT_GRPO_BNPO, NB_PT_GRPO_DR_GRPO, NB_PT_GRPO_DAPO, NB_PT_GRPO_LOSS_COUNT
} nb_pt_grpo_loss_type;
/* "grpo", "bnpo", "dr_grpo", "dapo" (NULL out of range). */
const char *nb_pt_grpo_loss_name(nb_pt_grpo_loss_type t);

typedef struct nb_pt_grpo_opts {
  nb_pt_grpo_loss_type loss_type;
  double epsilon_low, epsilon_high;  /* clip range [1 - epsilon_low, 1 + epsilon_high]; >= 0 (TRL: 0.2, 0.2;
                                        DAPO: 0.2, 0.28) */
  double beta;                       /* KL coefficient, >= 0 */
  int64_t max_completion_length;     /* dr_grpo's normalizer, >= 1 */
} nb_pt_grpo_opts;

typedef struct nb_pt_grpo_in {
  nb_val *logits;           /* the policy's [N, T, V] */
  nb_val *targets, *mask;   /* [N, T]: next tokens; 1 on completion targets (0 on prompt and padding) */
  nb_val *old_logps;        /* [N, T] per-token, of the rollout policy; NULL: the policy's own, gradient stopped
                               (one update per rollout: the ratio is 1, TRL's num_iterations = 1) */
  nb_val *ref_logps;        /* [N, T] per-token, of the reference; required when beta > 0 */
  nb_val *advantages;       /* [N] */
  nb_val *num_items;        /* dapo: a scalar or [N] (every entry the same), the batch's completion tokens;
                               NULL: the mask's count */
} nb_pt_grpo_in;

typedef struct nb_pt_grpo_out {
  nb_val *loss;                                   /* scalar */
  nb_val *kl;                                     /* scalar, no gradient; NULL when beta = 0 */
  nb_val *clip_low, *clip_high, *clip_region;     /* scalars, no gradient */
} nb_pt_grpo_out;

/* Traces the loss of o over in into out. NB_ERR_INVALID_ARG for options out
 * of range (named), NB_ERR_SHAPE for mismatched inputs. */
nb_status nb_pt_grpo_loss(const nb_pt_grpo_opts *o, const nb_pt_grpo_in *in, nb_pt_grpo_out *out);

/* Group-normalized advantages (host, f64, TRL's): rewards [n_groups * G]
 * (group g is rows g*G .. g*G+G-1) -> adv[i] = r_i - mean(group), divided by
 * (std(group) + 1e-4) when scale_std (std with Bessel's correction, 0 for
 * G = 1); scale_std false is Dr.GRPO. NaN rewards (no score) are left out of
 * their group's mean and std and get advantage 0. std_out (may be NULL)
 * receives each row's group std. */
void nb_pt_grpo_advantages(const double *rewards, int64_t n_groups, int64_t G, bool scale_std, double *adv,
                           double *std_out);

/* ---- rewards ------------------------------------------------------------ */

/* What a reward function sees of one completion. The data row's fields are
 * the prompt line's JSON keys with scalar values, as text (strings as they
 * are, numbers and booleans as written): nb_pt_reward_field finds one. */
typedef struct nb_pt_reward_in {
  const char *prompt;              /* text, NUL-terminated */
  const int32_t *prompt_ids;
  int64_t n_prompt;
  const char *completion;          /* text (the stop token's text included when it ended the sample) */
  const int32_t *completion_ids;
  int64_t n_completion;
  bool stopped;                    /* ended by a stop/eos token, not by the length limit */
  int n_fields;
  const char *const *keys, *const *values;
} nb_pt_reward_in;
const char *nb_pt_reward_field(const nb_pt_reward_in *in, const char *key); /* NULL: no such field */

/* A reward: the score of one completion; NaN means "no score" (TRL's None). */
typedef double (*nb_pt_reward_fn)(void *ud, const nb_pt_reward_in *in);

/* Built-in rewards (grpo.rewards in YAML: a list of mappings with these keys):
 *   exact   1 when the text pattern extracts from the completion (its group 1, or
 *           the whole match when it has no group; pattern "": the whole
 *           completion), trimmed of white space, equals the row's field (default
 *           "answer"), trimmed; else 0 (also when the pattern does not match)
 *   format  1 when pattern matches the completion (PCRE2 search: anchor it
 *           with ^ and $ for a whole match), else 0
 *   length  -scale * |completion tokens - target|: a penalty with scale > 0
 *           (target 0: shorter is better), a reward for length with scale < 0
 * Each is multiplied by weight; the total reward is the sum. */
typedef enum nb_pt_reward_kind { NB_PT_REWARD_EXACT, NB_PT_REWARD_FORMAT, NB_PT_REWARD_LENGTH, NB_PT_REWARD_KIND_COUNT } nb_pt_reward_kind;
#define NB_PT_REWARD_MAX 8
typedef struct nb_pt_reward_spec {
  nb_pt_reward_kind kind;
  char pattern[256];               /* PCRE2 (Python re syntax) */
  char field[64];                  /* exact: the row's field; "" : "answer" */
  double weight;                   /* 0 in a spec read from YAML means the default 1 */
  double target, scale;            /* length */
} nb_pt_reward_spec;
const char *nb_pt_reward_kind_name(nb_pt_reward_kind k); /* "exact", "format", "length" */

/* A set of weighted rewards: built-ins from specs (patterns compiled now:
 * an error names "<where>[i].pattern" and PCRE2's message and offset) and
 * callbacks added with nb_pt_rewards_add. */
typedef struct nb_pt_rewards nb_pt_rewards;
nb_pt_rewards *nb_pt_rewards_create(nb_ctx *ctx, const nb_pt_reward_spec *specs, int n, const char *where);
nb_status nb_pt_rewards_add(nb_pt_rewards *r, const char *name, nb_pt_reward_fn fn, void *ud, double weight);
void nb_pt_rewards_destroy(nb_pt_rewards *r); /* NULL ok */
int nb_pt_rewards_count(const nb_pt_rewards *r);
const char *nb_pt_rewards_name(const nb_pt_rewards *r, int i); /* "exact", "format_1", a callback's name */
/* Scores one completion: per[i] (may be NULL; room for count) each reward's
 * unweighted value, the return value their weighted sum (NaN rewards left
 * out; NaN when all are NaN). */
double nb_pt_rewards_score(nb_pt_rewards *r, const nb_pt_reward_in *in, double *per);

/* ---- nabla grpo ------------------------------------------------------------ */

/* `nabla grpo CONFIG [key=value ...]`: a run config (train.h's keys) plus a
 * grpo: section (and lora: for LoRA):
 *   grpo:
 *     base: runs/sft               # or init_from=: a run dir, checkpoint or Hugging Face folder
 *     num_generations: 8          # G completions per prompt; batch_size is prompts per step
 *     max_completion_length: 16   # tokens generated per completion (prompt + this <= data.seq_len + 1)
 *     temperature: 1.0            # rollout sampling; top_k, top_p as serve's
 *     top_k: 0
 *     top_p: 1.0
 *     stop_token_id: -1           # a token that ends a completion (beside the tokenizer's eos)
 *     loss_type: dapo             # grpo, bnpo, dr_grpo, dapo
 *     epsilon_low: 0.2
 *     epsilon_high: 0.28
 *     beta: 0.0                   # KL to the reference (the starting model)
 *     scale_rewards: true         # false: Dr.GRPO advantages (no std scaling)
 *     eval_prompts: 64            # held-out prompts of data.eval scored greedily at each eval
 *     rewards: [{kind: exact, pattern: '=\s*(-?\d+)', field: answer, weight: 1}]
 * data.train / data.eval: JSONL, {"prompt": "...", <fields the rewards read>}. */
typedef struct nb_pt_grpo_config {
  nb_pt_grpo_opts loss;
  char base[NB_TRAIN_STR_MAX];
  int64_t num_generations, max_completion_length, eval_prompts;
  double temperature, top_p;
  int64_t top_k;
  int64_t stop_token_id;
  bool scale_rewards;
  int n_rewards;
  nb_pt_reward_spec rewards[NB_PT_REWARD_MAX];
  char lora_target[NB_TRAIN_STR_MAX];
  nb_pt_lora_config lora;
} nb_pt_grpo_config;

void nb_pt_grpo_config_defaults(nb_pt_grpo_config *c);
/* The file (NULL: defaults) and overrides into both configs (grpo.<key>=,
 * lora.<key>=, the rest the trainer's); errors name file:line (or the
 * override) and the key. */
nb_status nb_pt_grpo_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                 nb_pt_grpo_config *grpo, nb_train_config *train);
void nb_pt_grpo_config_write(const nb_pt_grpo_config *c, FILE *f);

/* Runs (or resumes) GRPO into opts->run_dir through nb_train_run (a task:
 * run dir, checkpoints, resume, metrics are the trainer's). Each step: the
 * policy's current parameters are handed to a serve engine (nb_serve_llm:
 * batched, paged; the engine reads the trainer's arrays, no copy; with LoRA
 * the merged kernels), batch_size prompts x G completions sampled with the
 * seed fold(seed, step), scored by the rewards (extra: callbacks added to
 * the built-ins, may be NULL), group-normalized, then one update. */
typedef struct nb_pt_grpo_stats {
  int64_t syncs;             /* parameter hand-overs to the engine (rollouts and evals) */
  double sync_s;             /* their total time */
  int64_t rollout_tokens;    /* completion tokens sampled for training */
  double rollout_s;          /* the training rollouts' generation time (engine steps, not scoring) */
  double compile_s;          /* of that, tracing and compiling the engine's step executables */
  bool merged;               /* LoRA: each hand-over merged the adapters into a copy of the adapted kernels
                                (else the engine reads the trainer's arrays, no copy) */
} nb_pt_grpo_stats;
nb_status nb_pt_grpo_run(nb_ctx *ctx, const nb_pt_grpo_config *gc, const nb_train_config *cfg, const nb_train_opts *opts,
                         nb_pt_rewards *extra, nb_train_result *out, nb_pt_grpo_stats *stats);

NB_END_DECLS
#endif /* NABLA_POSTTRAIN_H */
