/* nabla models: the reference decoder-only transformers (the analogue of
 * MaxText's model code) and the validated YAML run configuration that the
 * trainer reads.
 *
 * Families, all one pre-norm decoder with switches:
 *   - gpt2:  learned positions, LayerNorm with bias, GELU (tanh) MLP, biases,
 *            tied output embedding. Presets gpt2-tiny, gpt2-124m.
 *   - llama: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases,
 *            untied head. Presets llama-tiny, llama2-7b, llama3-8b.
 *   - MoE (llama family with n_experts > 0): Mixtral style (top-2 of 8,
 *     softmax router; presets mixtral-tiny, mixtral-8x7b) and DeepSeek style
 *     (shared + fine-grained routed experts, sigmoid router, first layers
 *     dense; preset deepseek-tiny).
 *
 * Parameter paths: "embed/embedding" [V, d], "pos_embed/embedding" [T, d]
 * (gpt2), "layers/<i>/{attn_norm,attn/{wq,wk,wv,wo},mlp_norm,mlp|moe}/...",
 * "final_norm/...", "lm_head/kernel" [d, V] (untied). Linear kernels are
 * [d_in, d_out] (transposed from PyTorch's nn.Linear weight).
 *
 * Example: loss and gradients of a tiny Llama on one batch.
 *
 *   nb_model_config cfg;
 *   nb_model_config_preset(ctx, "llama-tiny", &cfg);
 *   nb_array *key = nb_key(ctx, 0);
 *   nb_tree *params = nb_model_init(ctx, &cfg, key);
 *   nb_tree *batch = ...;  // {"inputs", "targets": i32[B, T]} (+ "mask", "segment_ids", "positions")
 *   nb_graph *g = nb_model_trace_loss(ctx, &cfg, NULL, params, batch);
 *   nb_graph *vg = nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true});
 *   nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
 *   nb_tree_merge(in, "params", params);
 *   nb_tree_merge(in, "batch", batch);
 *   nb_graph_run(ctx, vg, in, out);     // "loss", "aux/metrics/...", "grad/params/..."
 */
#ifndef NABLA_MODELS_H
#define NABLA_MODELS_H

#include "nabla/export.h"
#include "nabla/ckpt.h"
#include "nabla/core.h"
#include "nabla/nn.h"
#include "nabla/tokenizer.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Model configuration                                                       */
/* ------------------------------------------------------------------------ */

typedef enum nb_model_family { NB_MODEL_GPT2, NB_MODEL_LLAMA, NB_MODEL_FAMILY_COUNT } nb_model_family;

typedef struct nb_model_config {
  nb_model_family family;
  int64_t vocab_size, d_model, n_layers, n_heads, n_kv_heads;
  int64_t head_dim;        /* 0: d_model / n_heads */
  int64_t d_ff;            /* dense MLP width */
  int64_t max_seq_len;     /* learned positions and the KV cache bound */
  nb_nn_norm norm;
  double norm_eps;
  nb_nn_act act;
  bool gated_mlp;          /* SwiGLU / GeGLU */
  bool bias;               /* biases in attention and MLP linears, and LayerNorm */
  bool qkv_bias;           /* biases on the q, k, v projections only (Qwen2) */
  bool learned_pos;        /* absolute position embeddings (gpt2) */
  bool rope;
  nb_nn_rope_cfg rope_cfg;
  bool tie_embeddings;
  double dropout;          /* embeddings and residual branches (train) */
  double attn_dropout;     /* attention probabilities (train) */
  double init_std;         /* normal std of kernels and embeddings */
  bool scaled_init;        /* residual projections (wo) get init_std / sqrt(2 n_layers) */
  bool scan_layers;        /* runs of equal blocks as one scan over their stacked parameters (the
                              YAML's top-level scan_layers): compile time flat in depth; the
                              parameters keep their per-layer paths */
  /* mixture of experts (n_experts == 0: dense) */
  int64_t n_experts, top_k, n_shared_experts, moe_d_ff, first_dense_layers;
  nb_nn_router_score router_score;
  bool router_renormalize;
  double route_scale, capacity_factor; /* capacity_factor <= 0: dropless */
  double lb_loss_coef, z_loss_coef, router_init_std;
} nb_model_config;

/* Names: "gpt2-tiny", "gpt2-124m", "llama-tiny", "llama2-7b", "llama3-8b",
 * "mixtral-tiny", "mixtral-8x7b", "deepseek-tiny". NB_ERR_NOT_FOUND (naming
 * the allowed ones) otherwise. */
nb_status nb_model_config_preset(nb_ctx *ctx, const char *name, nb_model_config *out);
/* The preset names, NULL-terminated (static storage). */
const char *const *nb_model_preset_names(void);
/* Errors name the key ("model.n_kv_heads") and what was wrong. */
nb_status nb_model_config_validate(nb_ctx *ctx, const nb_model_config *cfg);
int64_t nb_model_head_dim(const nb_model_config *cfg);
/* The configuration of layer i's block (MoE or dense per first_dense_layers). */
nb_nn_block_cfg nb_model_block_cfg(const nb_model_config *cfg, int64_t layer);

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */
/* ------------------------------------------------------------------------ */

/* A new tree of host arrays (dtype: f32 unless given otherwise), or NULL
 * with an error. Deterministic in (cfg, key). */
nb_tree *nb_model_init(nb_ctx *ctx, const nb_model_config *cfg, nb_array *key);
nb_tree *nb_model_init_dtype(nb_ctx *ctx, const nb_model_config *cfg, nb_array *key, nb_dtype dtype);
/* The same paths as abstract values (no memory, no randomness): for
 * tracing and counting parameters of large configs. */
nb_tree *nb_model_param_spec(nb_ctx *ctx, const nb_model_config *cfg, nb_dtype dtype);
/* MoE params from a dense model's (same architecture but for the MoE
 * fields): every expert of layer i a copy of the dense MLP of layer i, the
 * router normal(router_init_std) from key, shared experts (if any) copies
 * of the dense MLP with d_ff scaled. Requires moe.moe_d_ff == dense.d_ff
 * and gated MLPs alike. A new tree, or NULL with an error. */
nb_tree *nb_model_upcycle(nb_ctx *ctx, const nb_model_config *dense, const nb_tree *dense_params,
                          const nb_model_config *moe, nb_array *key);

/* ------------------------------------------------------------------------ */
/* Forward, loss, decode                                                     */
/* ------------------------------------------------------------------------ */

/* Inputs of one forward call (values of a->g). With a cache (a tree of
 * "layers/<i>/k" and "layers/<i>/v" [B, n_kv_heads, T_max, hd]) the tokens
 * are written at cache_pos and new_cache receives the updated entries. */
typedef struct nb_model_fwd {
  nb_val *tokens;          /* integer [B, T] */
  nb_val *positions;       /* [B, T] or NULL */
  nb_val *segment_ids;     /* [B, T] or NULL (packed documents) */
  const nb_tree *cache;    /* or NULL */
  nb_val *cache_pos;       /* i32 scalar */
  nb_tree *new_cache;      /* borrowed; filled when cache is set */
  bool remat;              /* recompute each block in the backward pass */
  nb_val *logits_at;       /* integer scalar or NULL: logits [B, 1, V] of this index of T only */
} nb_model_fwd;

/* Sums over the MoE layers (mean over layers): load-balancing and z loss. */
typedef struct nb_model_aux {
  nb_val *lb_loss, *z_loss;
} nb_model_aux;

/* logits [B, T, V] in f32 (f64 when a->dtype is f64). aux may be NULL. */
nb_val *nb_model_forward(nb_nn_apply *a, const nb_model_config *cfg, const nb_model_fwd *in, nb_model_aux *aux);
/* Mean next-token cross-entropy of batch {"inputs", "targets", optional
 * "mask" (bool/float), "segment_ids" (0 marks padding, masked out when no
 * mask is given), "positions"} plus lb_loss_coef * lb + z_loss_coef * z.
 * metrics (may be NULL) receives "ce", "tokens" and for MoE "moe_lb",
 * "moe_z". */
nb_val *nb_model_loss(nb_nn_apply *a, const nb_model_config *cfg, const nb_tree *batch, bool remat, nb_tree *metrics);

typedef struct nb_model_trace_opts {
  bool train;              /* dropout on: input "rng" u32[2] */
  bool remat;
  nb_dtype dtype;          /* compute dtype; 0 = f32 */
  nb_nn_linear_hook linear_hook;
  void *hook_ud;
  nb_nn_param_hook param_hook; /* every parameter read goes through it (FSDP's gather); not with scan_layers */
  void *param_ud;
  const char *expert_axis;     /* nb_nn_apply.expert_axis: the MoE layers' experts split over it (expert parallel) */
  /* More parameters, not differentiated by a grad w.r.t. "params": inputs
   * "frozen/<path>", seen by the model (and the hook) beside "params/<path>"
   * (a LoRA base under its adapters; the two trees share no path). NULL: none. */
  const nb_tree *frozen_spec;
} nb_model_trace_opts;

/* Graphs (new; destroy them) with inputs "params/<path>" (avals of
 * param_spec's leaves, any leaf kind), "frozen/<path>" (opts->frozen_spec)
 * and "batch/<name>" (batch_spec):
 *   loss:    outputs "loss", "metrics/<name>";
 *   forward: outputs "logits" (batch needs only "inputs"). */
nb_graph *nb_model_trace_loss(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                              const nb_tree *param_spec, const nb_tree *batch_spec);
nb_graph *nb_model_trace_forward(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                                 const nb_tree *param_spec, const nb_tree *batch_spec);
/* One decode step over T new tokens per row: inputs "params/<path>",
 * "tokens" i32 [B, T], "pos" i32 scalar, "cache/layers/<i>/{k,v}"; outputs
 * "logits" [B, T, V] and "cache/layers/<i>/{k,v}". */
nb_graph *nb_model_trace_decode(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                                const nb_tree *param_spec, int64_t batch, int64_t tokens, int64_t max_len,
                                nb_dtype cache_dtype);
/* A zero KV cache tree "layers/<i>/{k,v}" [batch, n_kv_heads, max_len, hd]
 * of host arrays. */
nb_tree *nb_model_cache_create(nb_ctx *ctx, const nb_model_config *cfg, int64_t batch, int64_t max_len, nb_dtype dtype);

/* ------------------------------------------------------------------------ */
/* Generation: sampling, the KV-cached generator, model loaders              */
/* ------------------------------------------------------------------------ */

/* The generator is a single-sequence reference: dense attention over a
 * fixed-length cache, its own sampler and decode loop. What generates text
 * in nabla (`nabla generate`, the server, rollouts) is the serving engine,
 * nb_serve_llm in nabla/serve.h; the engine's tests compare against this.
 *
 * Example: greedy continuation of a Hugging Face Llama's prompt.
 *
 *   nb_model_loaded m;
 *   if (nb_model_load_hf(ctx, "models/llama", &m)) fail(nb_ctx_error(ctx));
 *   nb_model_generator *gen = nb_model_generator_create(ctx, &m.cfg, m.params, NULL);
 *   int32_t out[64];
 *   nb_model_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = 64, .out = out,
 *                             .stop = m.eos_ids, .n_stop = m.n_eos};   // .sample = {0}: greedy
 *   nb_model_gen_result res;
 *   nb_model_generate(gen, &r, &res);     // out[0 .. res.n_tokens)
 *   nb_model_generator_destroy(gen);
 *   nb_model_loaded_free(&m);
 */

/* Sampling options, compile-time constants of the graphs that use them
 * (zero-init: greedy, no filtering).
 *   temperature  <= 0: greedy (argmax, first index on ties); else logits / T
 *   top_k        > 0: keep the k largest logits (ties to the lower id); 0 or
 *                >= vocab: off
 *   top_p        in (0, 1): nucleus: sort descending, keep the smallest
 *                prefix whose softmax mass is >= top_p (a token is kept when
 *                the mass strictly before it is < top_p, so at least one
 *                token always is); <= 0 or >= 1: off. Applied after top_k. */
typedef struct nb_model_sample_opts {
  double temperature;
  int64_t top_k;
  double top_p;
} nb_model_sample_opts;

/* Traced: one token id per row of logits [B, V] (float), i32 [B]. key is a
 * u32[2] key value; the draw is categorical (Gumbel-max) over the kept
 * logits / temperature, so equal (logits, key, opts) give equal ids. Bad
 * shapes or options poison the graph with a message naming them. */
nb_val *nb_model_sample(nb_val *logits, nb_val *key, const nb_model_sample_opts *opts);

/* A generator: a model's parameters, a KV cache of batch 1 and the compiled
 * executables that run the model on it. Prefill is chunked: the prompt runs
 * through full chunks of prefill_chunk tokens and a last partial chunk
 * padded to the smallest power of two >= its length (at least 8), so at
 * most log2(prefill_chunk / 8) + 2 executables are ever compiled
 * (prefill sizes plus the one-token decode step), whatever the prompt
 * lengths; padded positions write cache slots that decoding overwrites
 * before they are read. Every executable is one fused graph: the model
 * step over its tokens with the cache donated (updated in place), the
 * logits of the last real token only, and the sampler on them with the key
 * fold_in(key(seed), position of the new token), so a run depends only on
 * (params, prompt, options, seed). */
typedef struct nb_model_generator nb_model_generator;

typedef struct nb_model_gen_opts {
  int64_t max_seq_len;    /* 0: cfg->max_seq_len; larger is an error. Bounds prompt + output */
  int64_t prefill_chunk;  /* 0: 64 (clamped to max_seq_len) */
  bool interpret;         /* run the graphs on the reference interpreter instead of nb_jit */
  int threads;            /* nb_jit's thread count; 0: its default */
} nb_model_gen_opts;

/* Borrows cfg (copied) and params (leaves retained; every path of the
 * model's param spec must be there with its shape; f32 arrays, other float
 * dtypes are converted once). opts may be NULL. Compiles nothing yet.
 * Returns a new generator, or NULL with an error naming the first missing
 * or mis-shaped parameter. */
nb_model_generator *nb_model_generator_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                              const nb_model_gen_opts *opts);
void nb_model_generator_destroy(nb_model_generator *g); /* NULL ok */
/* The context length the generator was built for. */
int64_t nb_model_generator_max_seq_len(const nb_model_generator *g);

/* Called once per generated token, in order; return false to stop early. */
typedef bool (*nb_model_token_fn)(void *ud, int32_t token);

typedef struct nb_model_gen_request {
  const int32_t *prompt;  /* borrowed; 1 <= n_prompt < max_seq_len, ids in [0, vocab) */
  int64_t n_prompt;
  int64_t max_tokens;     /* new tokens at most (>= 0) */
  nb_model_sample_opts sample;
  uint64_t seed;
  const int32_t *stop;    /* generation ends after emitting one of these (eos) */
  int n_stop;
  nb_model_token_fn on_token; /* may be NULL */
  void *ud;
  int32_t *out;           /* may be NULL; else receives the generated ids (room for max_tokens) */
} nb_model_gen_request;

typedef struct nb_model_gen_result {
  int64_t n_tokens;       /* generated (the stop token included) */
  bool stopped;           /* ended on a stop id */
  bool truncated;         /* ended because the context (max_seq_len) was full */
  int64_t prefill_tokens; /* prompt tokens run (padding excluded) */
  double prefill_s;       /* wall time of the prefill (time to first token) */
  double decode_s;        /* wall time of the decode steps after the first token */
  double compile_s;       /* time spent compiling executables during this call */
} nb_model_gen_result;

/* Runs the prompt and generates up to max_tokens ids. The context bound is
 * prompt + generated <= max_seq_len: a longer prompt is an error naming both
 * numbers; generation that reaches the bound stops with res->truncated (and
 * an info log line). Returns NB_OK or an error; res may be NULL. One call at
 * a time per generator. */
nb_status nb_model_generate(nb_model_generator *g, const nb_model_gen_request *req, nb_model_gen_result *res);

/* A model ready to generate: its config and parameters (f32), and how to
 * tokenize for it. */
typedef struct nb_model_loaded {
  nb_model_config cfg;
  nb_tree *params;        /* owned */
  nb_tok *tok;            /* owned; NULL: byte-level ids (token i is byte i) */
  int32_t bos_id;         /* -1: none; prepended to prompts by the caller's choice */
  int32_t eos_ids[8];     /* stop ids */
  int n_eos;
  int64_t sliding_window; /* a Hugging Face Mistral's or Qwen2's attention window when shorter than
                             cfg.max_seq_len, else 0: nabla attends to every earlier position, so the
                             model is that model only for contexts up to this length */
  char what[512];         /* where it came from, for messages */
} nb_model_loaded;

/* A loaded model from its config, a tree of weights (any float dtype: f32
 * copies are made) with exactly the paths of nb_model_param_spec, and a
 * tokenizer file (NULL or "": byte-level ids; its end-of-text special tokens
 * become the stop ids). A missing, mis-shaped or extra weight is an error
 * naming `where` and the path. A linear's kernel may be a quantized tree
 * (nabla/quant.h: "<kernel>/{values,scales,zero_points,quant}"), kept as
 * it is: run such a model with quant's linear hook (nb_quant_linear_hook). Fills *out, out->what left empty (free with
 * nb_model_loaded_free). Trained runs: nb_train_load_run_dir (train.h). */
nb_status nb_model_loaded_make(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const char *tokenizer_path,
                               const char *where, nb_model_loaded *out);
/* A Hugging Face model directory: config.json, model.safetensors or
 * model.safetensors.index.json with its shards, tokenizer.json (optional:
 * without it, ids only). Architectures: LlamaForCausalLM, MistralForCausalLM
 * (out->sliding_window set when the window is shorter than the context),
 * Qwen2ForCausalLM (q/k/v biases: model.qkv_bias) and GPT2LMHeadModel
 * (Conv1D weights, fused c_attn split into wq/wk/wv). Weights are renamed to
 * nabla's paths, PyTorch [out, in] linears transposed to [in, out] kernels,
 * bf16/f16 converted to f32. Llama-like: hidden_act silu, rope_scaling null,
 * "linear" or "llama3"; GPT-2: activation gelu_new. Every missing key, bad
 * value, missing, extra or mis-shaped tensor names the file and the field or
 * tensor. */
nb_status nb_model_load_hf(nb_ctx *ctx, const char *dir, nb_model_loaded *out);
/* The same from config.json alone: cfg, bos/eos ids and sliding_window;
 * no params, no tokenizer (out->params NULL). */
nb_status nb_model_load_hf_config(nb_ctx *ctx, const char *dir, nb_model_loaded *out);
/* Writing a model as a Hugging Face folder (nb_model_save_hf). */
typedef struct nb_model_hf_opts {
  nb_dtype dtype;          /* of the tensors: f32 (also 0), bf16 or f16 */
  size_t shard_bytes;      /* tensor bytes above which the weights are sharded
                              (model-0000i-of-0000n.safetensors + model.safetensors.index.json);
                              0: 5 GB, save_pretrained's default */
  const char *arch;        /* "llama", "mistral", "qwen2" or "gpt2"; NULL: gpt2 for the gpt2 family,
                              qwen2 with model.qkv_bias, else llama */
} nb_model_hf_opts;
/* Writes config.json and model.safetensors (or shards and their index) into
 * dir (made when missing) under the architecture's Hugging Face names and
 * layouts (the table in src/models/hf.c that nb_model_load_hf reads):
 * nn.Linear weights [out, in], GPT-2's Conv1D weights [in, out] with q, k, v
 * fused into c_attn, a tied lm_head left out (tie_word_embeddings). A model
 * the architecture does not compute (MoE, other norms or activations) is
 * refused naming the key. Loading it back gives the same parameters
 * bit for bit (f32; bf16/f16 as rounded). */
nb_status nb_model_save_hf(nb_ctx *ctx, const nb_model_loaded *m, const char *dir, const nb_model_hf_opts *opts);
/* The Hugging Face (Llama-architecture) tensor name of a nabla parameter path
 * ("layers/0/attn/wq/kernel" -> "model.layers.0.self_attn.q_proj.weight",
 * *transpose: HF stores it [out, in]); false when the path has none. */
bool nb_model_hf_name(const char *path, char *name, size_t cap, bool *transpose);
/* The same for the architecture nb_model_save_hf writes cfg as (NULL: Llama's
 * names, as nb_model_hf_name): GPT-2's "layers/0/attn/wk/kernel" ->
 * "transformer.h.0.attn.c_attn.weight" with *fused_part 1 (c_attn holds q, k
 * and v side by side on its output axis; -1 for an unfused tensor) and
 * *transpose false (Conv1D weights are [in, out]); its lm_head is an
 * nn.Linear (*transpose true). NULL outputs are not written. */
bool nb_model_hf_name_for(const nb_model_config *cfg, const char *path, char *name, size_t cap, bool *transpose,
                          int *fused_part);
/* A GGUF file of a Llama- or GPT-2-architecture model (llama.cpp's format,
 * versions 2 and 3): the config from the llama.* / gpt2.* metadata, tensors renamed from
 * llama.cpp's names and decoded to f32 (F32, F16, BF16, Q8_0, Q4_0, Q4_K,
 * Q6_K; to keep Q8_0 / Q4_0 linears quantized, nabla generate and serve
 * put nb_quant_from_ggml's weights in their place, nabla/quant.h), llama.cpp's
 * permutation of the attn_q / attn_k rows undone, and the tokenizer from
 * tokenizer.ggml.* ("llama": SentencePiece BPE; "gpt2": byte-level BPE;
 * "no_vocab" or none: ids only). Errors name the file and the key or
 * tensor. docs/gguf.md has the mapping. */
nb_status nb_model_load_gguf(nb_ctx *ctx, const char *path, nb_model_loaded *out);

typedef struct nb_model_gguf_opts {
  nb_gguf_type type;      /* of the 2-D weights: F32 (0), F16, BF16, Q8_0, Q4_0, Q4_K */
  const char *name;       /* general.name; NULL: none */
} nb_model_gguf_opts;
/* Writes a dense Llama or a GPT-2 model as a GGUF file llama.cpp loads:
 * llama.* / gpt2.* metadata, the tokenizer (none: "no_vocab" with
 * <arch>.vocab_size; byte-level BPE: "gpt2" tokens and merges; char-level
 * BPE: "llama" pieces and scores; others are refused by name), tensors
 * under llama.cpp's names with the q/k rows permuted for its RoPE (Llama
 * 3.1 RoPE scaling as rope_freqs.weight). 1-D tensors stay F32; in a Q4_0
 * or Q4_K file the output projection is Q6_K (Q8_0 when its rows are not a
 * multiple of 256); in a Q4_K file other rows not a multiple of 256 are
 * Q4_0; rows not a multiple of the block fall back to F16. opts may be
 * NULL (F32). */
nb_status nb_model_save_gguf(nb_ctx *ctx, const nb_model_loaded *m, const char *path, const nb_model_gguf_opts *opts);
void nb_model_loaded_free(nb_model_loaded *m); /* zeroes *m; NULL ok */

NB_END_DECLS
#endif /* NABLA_MODELS_H */
