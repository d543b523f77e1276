/* nabla nn: neural-network modules over path-addressed parameter trees (the
 * analogue of Flax NNX).
 *
 * A module is two plain functions:
 *   - init:  writes its parameters, as host arrays, into a tree under a path
 *            prefix ("layers/3/attn"), drawn deterministically from a PRNG
 *            key: each leaf's key is the root key folded with a hash of the
 *            leaf's full path, so a parameter does not depend on the order
 *            in which modules are initialized, nor on other modules;
 *   - apply: emits traced ops on a graph, reading its parameters (traced
 *            values) from the same paths.
 * There are no module objects: a model is a function that calls applies
 * with paths, and its parameters are the tree. Editing a model is editing
 * the tree (nb_nn_params_replace) or intercepting linears by path: every
 * dense projection of every module goes through nb_nn_linear, which calls
 * the apply context's linear hook when one is set (the one place where
 * LoRA and quantization step in).
 *
 * Conventions: activations are [..., features]; a linear's kernel is
 * [d_in, d_out] at "<path>/kernel" with an optional bias [d_out] at
 * "<path>/bias"; a stacked (per-expert) linear's kernel is [E, d_in, d_out].
 * Norms hold "<path>/scale" (and "<path>/bias"); embeddings
 * "<path>/embedding" [vocab, d]. Floating modules work in the dtype of
 * their input (f32 or f64; bf16/f16 inputs are upcast to f32 for norms,
 * softmax and losses).
 *
 * Errors: apply functions return traced values; a missing parameter or a
 * wrong shape poisons the graph with a message naming the parameter path
 * (reported once by nb_trace or nb_graph_status), as every traced op does.
 *
 * Example: a two-layer MLP on x [B, 16].
 *
 *   nb_tree *params = nb_tree_create(ctx);
 *   nb_array *key = nb_key(ctx, 0);
 *   nb_nn_init in = {.ctx = ctx, .params = params, .key = key, .dtype = NB_F32};
 *   nb_nn_mlp_cfg mlp = {.d_model = 16, .d_ff = 64, .act = NB_NN_GELU_TANH};
 *   nb_nn_mlp_init(&in, "mlp", &mlp, 0.02, 0.02);
 *   ...
 *   // in a traced function whose inputs hold params under "params/":
 *   nb_tree *p = nb_tree_select_prefix(in_tree, "params", true);
 *   nb_nn_apply a = {.g = g, .params = p};
 *   nb_val *y = nb_nn_mlp(&a, "mlp", &mlp, x);
 *   nb_tree_destroy(p);
 */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* Longest parameter path, NUL included. */
#define NB_NN_PATH_MAX 256

/* ------------------------------------------------------------------------ */
/* Initialization: host arrays into a tree                                  */
/* ------------------------------------------------------------------------ */

typedef struct nb_nn_init {
  nb_ctx *ctx;
  nb_tree *params; /* borrowed: leaves are added (or replaced) here */
  nb_array *key;   /* borrowed: u32[2] root key */
  nb_dtype dtype;  /* parameter dtype (a float dtype) */
  bool abstract;   /* leaves are abstract values (dtype, shape): no memory, no key */
} nb_nn_init;

/* The 32-bit hash (FNV-1a) of a path that init folds into the root key. */
uint32_t nb_nn_path_hash(const char *path);
/* The key of the leaf at `path`: fold_in(root, nb_nn_path_hash(path)). New
 * reference, or NULL with an error. */
nb_array *nb_nn_leaf_key(nb_ctx *ctx, nb_array *root, const char *path);

/* Leaves: normal(0, std) (std == 0 gives zeros) and a constant. */
nb_status nb_nn_init_normal(nb_nn_init *in, const char *path, int rank, const int64_t *dims, double std);
nb_status nb_nn_init_const(nb_nn_init *in, const char *path, int rank, const int64_t *dims, double value);

/* ------------------------------------------------------------------------ */
/* Apply context                                                            */
/* ------------------------------------------------------------------------ */

typedef struct nb_nn_apply nb_nn_apply;

/* Intercepts every linear (stacked: a per-expert linear). It returns the
 * projection of x; it may call nb_nn_linear_default for the plain one. */
typedef nb_val *(*nb_nn_linear_hook)(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);
/* Sees every parameter as it is read (nb_nn_param), where it is read: in
 * the graph of the block that uses it, so a remat block's reads are redone
 * in its backward pass. It returns the value the layer uses (FSDP: the
 * all_gather of a shard). */
typedef nb_val *(*nb_nn_param_hook)(void *ud, nb_nn_apply *a, const char *path, nb_val *v);

struct nb_nn_apply {
  nb_graph *g;
  const nb_tree *params;     /* borrowed: traced values by path */
  bool train;                /* dropout on */
  nb_val *rng;               /* u32[2] key of this step (needed by dropout in train) */
  nb_dtype dtype;            /* floating params are converted to it; 0 (f32) by default */
  nb_nn_linear_hook linear_hook; /* NULL: nb_nn_linear_default */
  void *hook_ud;
  nb_nn_param_hook param_hook;   /* NULL: parameters as given */
  void *param_ud;
  /* Expert parallelism (nb_nn_moe): the mesh axis the routed experts are
   * split over. Each process holds E / E_p of them (their stacked kernels
   * [E / E_p, ...]: experts [i E / E_p, (i+1) E / E_p) on the process of
   * index i) and the MoE layers exchange tokens with nb_all_to_all over it.
   * NULL: every expert here. */
  const char *expert_axis;
};

/* The value at `path` (converted to a->dtype when it is a float), or a
 * poison value with an error naming the path when it is missing. */
nb_val *nb_nn_param(nb_nn_apply *a, const char *path);
/* Same, or NULL (no error) when missing. */
nb_val *nb_nn_param_opt(nb_nn_apply *a, const char *path);
/* Poisons a->g with the message (when it is not already in error) and
 * returns the poison value. */
nb_val *nb_nn_fail(nb_nn_apply *a, nb_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "prefix/name" into buf[NB_NN_PATH_MAX] (prefix NULL or "": name); NULL
 * when it does not fit. */
char *nb_nn_join(char *buf, const char *prefix, const char *name);

/* ------------------------------------------------------------------------ */
/* Functions without parameters                                              */
/* ------------------------------------------------------------------------ */

typedef enum nb_nn_act {
  NB_NN_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  NB_NN_GELU,      /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
  NB_NN_RELU,
  NB_NN_SILU,      /* x * logistic(x) */
  NB_NN_ACT_COUNT
} nb_nn_act;
const char *nb_nn_act_name(nb_nn_act act); /* "gelu_tanh", "gelu", "relu", "silu" */

nb_val *nb_nn_activation(nb_val *x, nb_nn_act act);
/* Along `axis` (negative counts from the end); bf16/f16 computed in f32. */
nb_val *nb_nn_softmax(nb_val *x, int axis);
nb_val *nb_nn_log_softmax(nb_val *x, int axis);
nb_val *nb_nn_logsumexp(nb_val *x, int axis); /* nb_logsumexp of x upcast to f32 (bf16/f16); the axis is removed */
/* Cross-entropy of logits [..., V] against integer targets [...]:
 * sum(mask * -log softmax(logits)[target]) / max(sum(mask), 1) with `mask`
 * [...] bool or float (NULL: the plain mean). An f32 (or f64) scalar; 0 when
 * the mask is all zero. */
nb_val *nb_nn_cross_entropy(nb_val *logits, nb_val *targets, nb_val *mask);

/* Dropout: in train mode with rate > 0, keeps each element with
 * probability 1 - rate (scaled by 1 / (1 - rate)) drawn from
 * fold_in(a->rng, nb_nn_path_hash(path)); otherwise returns x. */
nb_val *nb_nn_dropout(nb_nn_apply *a, const char *path, nb_val *x, double rate);

/* ------------------------------------------------------------------------ */
/* Linear, embedding, norms                                                  */
/* ------------------------------------------------------------------------ */

nb_status nb_nn_linear_init(nb_nn_init *in, const char *path, int64_t d_in, int64_t d_out, bool bias, double std);
/* E stacked kernels [E, d_in, d_out] (+ bias [E, d_out]). */
nb_status nb_nn_linear_stacked_init(nb_nn_init *in, const char *path, int64_t e, int64_t d_in, int64_t d_out,
                                    bool bias, double std);
/* x [..., d_in] -> [..., d_out]: through the hook when set. */
nb_val *nb_nn_linear(nb_nn_apply *a, const char *path, nb_val *x);
/* x [E, ..., d_in] -> [E, ..., d_out] with per-expert kernels. */
nb_val *nb_nn_linear_stacked(nb_nn_apply *a, const char *path, nb_val *x);
/* The plain projection x @ kernel (+ bias), no hook. */
nb_val *nb_nn_linear_default(nb_nn_apply *a, const char *path, nb_val *x, bool stacked);
/* The same with the (unstacked) kernel held in the serving engine's layout,
 * the same bits: transposed, [d_out, d_in] (x @ kernel^T), or as panels of
 * w output features, [d_out / w, d_in, w] (panel q holds columns
 * q*w .. q*w + w - 1 of the [d_in, d_out] kernel, row after row). */
nb_val *nb_nn_linear_held(nb_nn_apply *a, const char *path, nb_val *x);

nb_status nb_nn_embed_init(nb_nn_init *in, const char *path, int64_t vocab, int64_t d, double std);
/* ids (integer) [...] -> [..., d]. */
nb_val *nb_nn_embed(nb_nn_apply *a, const char *path, nb_val *ids);
/* Tied output projection: x [..., d] -> [..., vocab] = x @ embedding^T. */
nb_val *nb_nn_embed_attend(nb_nn_apply *a, const char *path, nb_val *x);

nb_status nb_nn_layernorm_init(nb_nn_init *in, const char *path, int64_t d, bool bias);
/* (x - mean) / sqrt(var + eps) * scale (+ bias), over the last axis. */
nb_val *nb_nn_layernorm(nb_nn_apply *a, const char *path, nb_val *x, double eps);
nb_status nb_nn_rmsnorm_init(nb_nn_init *in, const char *path, int64_t d);
/* x / sqrt(mean(x^2) + eps) * scale, over the last axis. */
nb_val *nb_nn_rmsnorm(nb_nn_apply *a, const char *path, nb_val *x, double eps);

typedef enum nb_nn_norm { NB_NN_LAYERNORM, NB_NN_RMSNORM, NB_NN_NORM_COUNT } nb_nn_norm;
typedef struct nb_nn_norm_cfg {
  nb_nn_norm kind;
  double eps;
  bool bias; /* layernorm only */
} nb_nn_norm_cfg;
nb_status nb_nn_norm_init(nb_nn_init *in, const char *path, const nb_nn_norm_cfg *cfg, int64_t d);
nb_val *nb_nn_norm_apply(nb_nn_apply *a, const char *path, const nb_nn_norm_cfg *cfg, nb_val *x);

/* ------------------------------------------------------------------------ */
/* MLP                                                                       */
/* ------------------------------------------------------------------------ */

/* Plain: wo(act(wi(x))). Gated (SwiGLU = silu, GeGLU = gelu):
 * wo(act(wi_0(x)) * wi_1(x)). Paths: "<path>/wi", "<path>/wo" or
 * "<path>/wi_0", "<path>/wi_1", "<path>/wo". */
typedef struct nb_nn_mlp_cfg {
  int64_t d_model, d_ff;
  nb_nn_act act;
  bool gated;
  bool bias;
} nb_nn_mlp_cfg;
/* std_in for the input projections, std_out for wo. */
nb_status nb_nn_mlp_init(nb_nn_init *in, const char *path, const nb_nn_mlp_cfg *cfg, double std_in, double std_out);
nb_val *nb_nn_mlp(nb_nn_apply *a, const char *path, const nb_nn_mlp_cfg *cfg, nb_val *x);

/* ------------------------------------------------------------------------ */
/* Rotary position embeddings and attention                                 */
/* ------------------------------------------------------------------------ */

typedef enum nb_nn_rope_scaling {
  NB_NN_ROPE_NONE,
  NB_NN_ROPE_LINEAR, /* frequencies / factor (position interpolation) */
  NB_NN_ROPE_LLAMA3, /* Llama 3.1's band-wise scaling */
  NB_NN_ROPE_SCALING_COUNT
} nb_nn_rope_scaling;
const char *nb_nn_rope_scaling_name(nb_nn_rope_scaling s); /* "none", "linear", "llama3" */

typedef struct nb_nn_rope_cfg {
  double theta;          /* base, 10000 for Llama 2 */
  nb_nn_rope_scaling scaling;
  double factor;         /* linear, llama3 */
  double low_freq_factor, high_freq_factor; /* llama3 */
  int64_t original_max_pos;                 /* llama3 */
  bool interleaved;      /* rotate pairs (2i, 2i+1) (GPT-J) instead of halves (NeoX, HF Llama) */
} nb_nn_rope_cfg;
/* The rotation frequencies for head_dim (head_dim/2 of them) into out. */
nb_status nb_nn_rope_freqs(nb_ctx *ctx, const nb_nn_rope_cfg *cfg, int64_t head_dim, double *out);
/* x [B, T, H, hd] rotated by integer positions [B, T]. */
nb_val *nb_nn_rope(nb_val *x, nb_val *positions, const nb_nn_rope_cfg *cfg);

/* Multi-head attention with n_kv_heads dividing n_heads: MHA (equal),
 * grouped-query, multi-query (1). Query head h uses key/value head
 * h / (n_heads / n_kv_heads). Paths "<path>/wq" [d, H*hd], wk, wv
 * [d, Hkv*hd], wo [H*hd, d]. */
typedef struct nb_nn_attn_cfg {
  int64_t d_model, n_heads, n_kv_heads, head_dim;
  bool bias;             /* biases on the four projections */
  bool qkv_bias;         /* biases on wq, wk, wv only (Qwen2); ignored when bias is set */
  bool rope;             /* apply rotary embeddings to q and k */
  nb_nn_rope_cfg rope_cfg;
  bool causal;
  double softmax_scale;  /* 0: 1/sqrt(head_dim) */
  double dropout;        /* on the attention probabilities (train) */
} nb_nn_attn_cfg;

/* Optional inputs. Positions (RoPE) default to 0..T-1, or cache_pos + t
 * with a cache. Causal masking is by index in the sequence (absolute cache
 * index with a cache), so packed documents keep positions of their own.
 * Segment ids restrict attention to equal ids (packed documents). With a
 * cache ([B, Hkv, T_max, hd] each), this call's keys and values are written
 * at cache_pos (an i32 scalar) and the queries attend to cache entries
 * 0 .. cache_pos + t (causal) or all of them (not causal). */
typedef struct nb_nn_attn_io {
  nb_val *positions;   /* i32 [B, T] or NULL */
  nb_val *segment_ids; /* i32 [B, T] or NULL (not with a cache) */
  nb_val *cache_k, *cache_v, *cache_pos;
  /* outputs with a cache: the updated cache */
  nb_val *new_cache_k, *new_cache_v;
} nb_nn_attn_io;

nb_status nb_nn_attention_init(nb_nn_init *in, const char *path, const nb_nn_attn_cfg *cfg, double std, double std_out);
/* x [B, T, d] -> [B, T, d]; io may be NULL. */
nb_val *nb_nn_attention(nb_nn_apply *a, const char *path, const nb_nn_attn_cfg *cfg, nb_val *x, nb_nn_attn_io *io);

/* ------------------------------------------------------------------------ */
/* Mixture of experts                                                        */
/* ------------------------------------------------------------------------ */

typedef enum nb_nn_router_score { NB_NN_SCORE_SOFTMAX, NB_NN_SCORE_SIGMOID, NB_NN_SCORE_COUNT } nb_nn_router_score;

/* Routed experts are gated MLPs (or plain, per `expert`) stacked at
 * "<path>/experts/{wi_0,wi_1,wo}" ([E, ...] kernels); the router is the
 * linear "<path>/router" [d, E] (no bias); shared experts form one MLP of
 * width n_shared * expert.d_ff at "<path>/shared", added for every token.
 *
 * Routing: scores = softmax or sigmoid of the router logits (computed in at
 * least f32); each token takes its top_k experts, weighted by their scores
 * (renormalized to sum 1 when `renormalize`, then times route_scale).
 * capacity_factor > 0: each expert takes at most
 * C = ceil(capacity_factor * N * top_k / E) tokens (N tokens in the call),
 * first choices before second choices, earlier tokens first; the rest are
 * dropped (that expert contributes nothing to them). capacity_factor <= 0:
 * dropless (every chosen expert runs on its tokens).
 *
 * With a->expert_axis (E_p processes, E a multiple of E_p): the capacity
 * is over this process's N tokens, as above; the dispatch buffer [E, C, d]
 * goes through nb_all_to_all so that each process runs its own E / E_p
 * experts on every process's slots ([E / E_p, E_p C, d]), and a second
 * all_to_all brings the outputs back before the combine. The router,
 * shared experts and aux losses are this process's tokens'. Dropless mode
 * is refused there (it would send every token to every process). */
typedef struct nb_nn_moe_cfg {
  int64_t n_experts, top_k, n_shared;
  nb_nn_mlp_cfg expert; /* d_model, d_ff (per expert), act, gated; no bias */
  nb_nn_router_score score;
  bool renormalize;
  double route_scale;    /* 0 means 1 */
  double capacity_factor;
} nb_nn_moe_cfg;

/* Diagnostics and auxiliary losses of one MoE call (f32 scalars, except
 * load). lb_loss = E * sum_e f_e * P_e with f_e the fraction of the N*k
 * assignments routed to e and P_e the mean normalized score of e (1 for a
 * perfectly uniform router); z_loss = mean over tokens of
 * logsumexp(router logits)^2; dropped = fraction of assignments dropped
 * for capacity; load [E] = assignments per expert before dropping. */
typedef struct nb_nn_moe_aux {
  nb_val *lb_loss, *z_loss, *dropped, *load;
} nb_nn_moe_aux;

nb_status nb_nn_moe_init(nb_nn_init *in, const char *path, const nb_nn_moe_cfg *cfg, double std, double std_out,
                         double router_std);
/* x [..., d] -> [..., d]; aux may be NULL. */
nb_val *nb_nn_moe(nb_nn_apply *a, const char *path, const nb_nn_moe_cfg *cfg, nb_val *x, nb_nn_moe_aux *aux);

/* ------------------------------------------------------------------------ */
/* Transformer block (pre-norm)                                              */
/* ------------------------------------------------------------------------ */

/* h = x + drop(attn(attn_norm(x))); out = h + drop(ffn(mlp_norm(h))) with
 * ffn the MLP at "<path>/mlp", or the MoE layer at "<path>/moe" when
 * use_moe. Paths "<path>/attn_norm", "<path>/attn", "<path>/mlp_norm". */
typedef struct nb_nn_block_cfg {
  nb_nn_norm_cfg norm;
  nb_nn_attn_cfg attn;
  nb_nn_mlp_cfg mlp;
  bool use_moe;
  nb_nn_moe_cfg moe;
  double resid_dropout;
} nb_nn_block_cfg;

/* std for input projections, std_out for the projections back into the
 * residual stream (wo of attention and MLPs). */
nb_status nb_nn_block_init(nb_nn_init *in, const char *path, const nb_nn_block_cfg *cfg, double std, double std_out,
                           double router_std);
/* x [B, T, d]; io and aux may be NULL. */
nb_val *nb_nn_block(nb_nn_apply *a, const char *path, const nb_nn_block_cfg *cfg, nb_val *x, nb_nn_attn_io *io,
                    nb_nn_moe_aux *aux);

/* ------------------------------------------------------------------------ */
/* Parameter trees                                                           */
/* ------------------------------------------------------------------------ */

/* Replaces the subtree at `prefix` of params: removes every leaf at or
 * under prefix, then adds src's leaves under it (arrays retained). */
nb_status nb_nn_params_replace(nb_tree *params, const char *prefix, const nb_tree *src);
/* Total number of elements of the tree's leaves; INT64_MAX when that
 * overflows 64 bits. */
int64_t nb_nn_params_count(const nb_tree *params);

NB_END_DECLS
#endif /* NABLA_NN_H */
