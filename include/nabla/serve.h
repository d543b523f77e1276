/* nabla serve: the host-side core of an LLM serving engine (the analogue of
 * vLLM's scheduler and KV cache manager). No model is attached yet: the
 * engine decides, step by step, which tokens of which sequences a model step
 * computes and where their keys and values live in a paged KV cache; the
 * caller runs the step and feeds back the sampled tokens.
 *
 *  - Paged KV cache: the cache is num_blocks blocks of block_size tokens
 *    each; a sequence owns a block table (block indices, in order). Blocks
 *    are reference counted: the n > 1 samples of a request share their
 *    prompt's blocks, and the first write into a shared block copies it
 *    (copy-on-write; the copies to perform are part of each step's batch).
 *    The engine deals only in block indices: where the memory lives is the
 *    backend's business.
 *  - Automatic prefix caching (enable_prefix_caching): every full block is
 *    keyed by a hash chained over the token ids of all blocks up to it; a new
 *    request reuses the cached blocks of its longest cached prefix. Cached
 *    blocks nobody holds are evicted least-recently-used first, and only
 *    when no never-used or plainly freed block is left.
 *  - Continuous batching: every nb_serve_schedule admits waiting requests
 *    and retires finished ones, under max_num_seqs sequences and
 *    max_num_batched_tokens tokens per step. Running decodes are scheduled
 *    first; prompts are split into chunks that take the rest of the token
 *    budget (chunked prefill). When blocks run out, the newest running
 *    sequence is preempted: its blocks are freed and it goes back to the
 *    front of the waiting queue to be recomputed later. No request is ever
 *    dropped; one that could never fit is refused when it is added.
 *
 * A serving loop:
 *
 *   nb_serve_config c = {.block_size = 16, .kv_cache_bytes = 1 << 30,
 *                        .kv = {.num_layers = 12, .num_kv_heads = 12, .head_dim = 64, .dtype_size = 4},
 *                        .max_num_seqs = 64, .max_num_batched_tokens = 2048,
 *                        .max_model_len = 4096, .enable_prefix_caching = true};
 *   nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
 *   nb_serve_request r = {.id = 1, .prompt = ids, .prompt_len = n, .max_tokens = 128, .n = 1};
 *   nb_serve_add_request(e, &r);
 *   while (nb_serve_has_unfinished(e)) {
 *     const nb_serve_batch *b;
 *     nb_serve_schedule(e, &b);
 *     // device: perform b->copies in order, then run the model on b
 *     for (int32_t i = 0; i < b->num_seqs; i++)
 *       if (b->seqs[i].needs_logits)
 *         for (int32_t k = 0; k < b->seqs[i].num_samples; k++) {
 *           bool done;
 *           nb_serve_append_token(e, b->seqs[i].request_id, b->seqs[i].sample_indices[k], sample(...), &done);
 *         }
 *   }
 *
 * Contract of a step: every batch returned by nb_serve_schedule is run
 * before the next call of nb_serve_schedule (the prefix cache publishes the
 * blocks a step filled at the start of the next one). The model performs the
 * block copies first, in list order, then writes the keys and values of the
 * scheduled tokens at their slots, then attends over each sequence's first
 * context_len positions.
 *
 * Threads: an engine is used from one thread at a time.
 * Errors: calls return nb_status and leave the message in the context
 * (nb_ctx_error). */
#ifndef NABLA_SERVE_H
#define NABLA_SERVE_H

#include "nabla/export.h"
#include "nabla/core.h"
#include "nabla/models.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

/* The model's KV geometry, which turns a memory budget into blocks: one
 * block holds keys and values of block_size tokens for every layer, that is
 * 2 * num_layers * num_kv_heads * head_dim * dtype_size * block_size bytes. */
typedef struct nb_serve_kv_geometry {
  int64_t num_layers;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t dtype_size;           /* bytes per element: 4 for f32, 2 for bf16/f16 */
} nb_serve_kv_geometry;

/* Zero fields take the defaults named here. The KV cache size comes from the
 * first of num_blocks, kv_cache_bytes, kv_cache_memory_fraction that is set
 * (the last two need `kv`). */
typedef struct nb_serve_config {
  int32_t block_size;               /* tokens per KV block; 0: 16 */
  int64_t num_blocks;               /* exactly this many blocks */
  uint64_t kv_cache_bytes;          /* or a budget in bytes */
  double kv_cache_memory_fraction;  /* or this fraction (0, 1] of physical RAM */
  nb_serve_kv_geometry kv;
  int32_t max_num_seqs;             /* sequences running at once; 0: 256 */
  int32_t max_num_batched_tokens;   /* tokens per step, >= max_num_seqs; 0: max(2048, max_num_seqs) */
  int32_t max_model_len;            /* prompt + generated tokens of one sequence; required */
  bool enable_prefix_caching;
} nb_serve_config;

/* Bytes of one block for geometry g; 0 when a field is not positive or the
 * product overflows. */
uint64_t nb_serve_bytes_per_block(const nb_serve_kv_geometry *g, int32_t block_size);

/* ------------------------------------------------------------------------ */
/* Engine, requests                                                          */
/* ------------------------------------------------------------------------ */

typedef struct nb_serve_engine nb_serve_engine;

/* Returns a new engine, or NULL with the error in ctx: a bad field of the
 * config (named), or a KV cache too small for one sequence of max_model_len
 * (the message says how many bytes are needed and how many are available). */
nb_serve_engine *nb_serve_engine_create(nb_ctx *ctx, const nb_serve_config *config);
void nb_serve_engine_destroy(nb_serve_engine *e);
/* The config with the defaults filled in and num_blocks computed. */
const nb_serve_config *nb_serve_engine_config(const nb_serve_engine *e);

/* How the next token of a request is chosen (vLLM's SamplingParams). All
 * zero is greedy with no penalties; the model step applies it inside its
 * executable (nb_serve_model_step), in this order on each sequence's logits:
 * logit_bias, min_tokens masking of stop_token_ids, repetition, frequency
 * and presence penalties (traced ops), then temperature, top_k, top_p, min_p
 * and the draw (the serve.sample kernel, a custom call: docs/serve.md).
 *
 * Reproducible: token j (counted from 0 among the generated tokens) of
 * sample k of a request is drawn with the key
 * fold_in(fold_in(threefry_key(seed), k), j), whatever else is in the batch,
 * however the prompt was chunked or cached, and after a preemption. */
#define NB_SERVE_MAX_LOGPROBS 20
typedef struct nb_serve_sampling {
  float temperature;            /* 0: greedy (argmax, the lowest id on ties); > 0: softmax(logits / temperature) */
  int32_t top_k;                /* keep the k most likely tokens; <= 0: all */
  float top_p;                  /* keep the most likely tokens until their mass reaches top_p; 0 or 1: all */
  float min_p;                  /* drop tokens whose probability is below min_p times the largest; 0: off */
  float presence_penalty;       /* OpenAI's: subtracted once from each token generated so far, [-2, 2] */
  float frequency_penalty;      /* OpenAI's: subtracted per occurrence among the generated tokens, [-2, 2] */
  float repetition_penalty;     /* on prompt and generated tokens: logit / r when positive, logit * r otherwise; 0 or 1: off */
  uint64_t seed;                /* the request's random stream (callers draw one when the user gave none) */
  const int32_t *logit_bias_ids;  /* [num_logit_bias], added to those logits (copied with the request) */
  const float *logit_bias_values;
  int32_t num_logit_bias;
  int32_t num_logprobs;         /* also return the top num_logprobs tokens' logprobs, [0, NB_SERVE_MAX_LOGPROBS] */
  int32_t min_tokens;           /* stop_token_ids cannot be drawn before this many tokens were generated */
  const int32_t *stop_token_ids;  /* [num_stop_token_ids]: masked before min_tokens (copied); ending a
                                   * sample on them is the caller's (nb_serve_llm's) business */
  int32_t num_stop_token_ids;
} nb_serve_sampling;

typedef struct nb_serve_request {
  int64_t id;                   /* caller's id, unique among unfinished requests */
  const int32_t *prompt;        /* borrowed: the engine copies it */
  int32_t prompt_len;           /* >= 1 */
  int32_t max_tokens;           /* tokens to generate per sample, >= 1 */
  int32_t n;                    /* samples sharing the prompt; 0: 1 */
  const nb_serve_sampling *sampling; /* NULL: greedy; copied, with its arrays */
} nb_serve_request;

/* Queues a request. Refused (NB_ERR_INVALID_ARG, request untouched) when
 * prompt_len + max_tokens exceeds max_model_len, n exceeds max_num_seqs, or
 * the id is in use. */
nb_status nb_serve_add_request(nb_serve_engine *e, const nb_serve_request *r);
/* Ends every sample of a request now (a client went away): its blocks are
 * freed; tokens later appended for it are ignored. NB_ERR_NOT_FOUND for an
 * unknown or finished id. */
nb_status nb_serve_abort_request(nb_serve_engine *e, int64_t id);

/* Appends the token sampled from the logits of the last step for one sample
 * of a request (an entry with needs_logits lists the samples that take a
 * token). *finished (may be NULL) is set when the sample reached max_tokens
 * with this token, or was aborted (the token is then ignored). An error for
 * a sample that was not waiting for a token. */
nb_status nb_serve_append_token(nb_serve_engine *e, int64_t id, int32_t sample_index, int32_t token, bool *finished);
/* Finishes one sample early (end-of-sequence token, stop string): its
 * blocks are freed now. Finishing sample 0 before its prompt completed also
 * ends the samples that were to fork off it. NB_ERR_NOT_FOUND for an
 * unknown or finished sample. */
nb_status nb_serve_finish(nb_serve_engine *e, int64_t id, int32_t sample_index);
/* True while any request is waiting or running. */
bool nb_serve_has_unfinished(const nb_serve_engine *e);

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct nb_serve_slot {
  int32_t block;                /* index into the KV cache's blocks */
  int32_t offset;               /* token within the block, [0, block_size) */
} nb_serve_slot;

typedef struct nb_serve_block_copy {
  int32_t src, dst;             /* copy all of block src into block dst */
} nb_serve_block_copy;

/* One scheduled sequence. Its tokens are token_ids[token_start ..
 * token_start + num_tokens) of the batch, at positions context_len -
 * num_tokens .. context_len - 1 (also in positions[] and slots[]). */
typedef struct nb_serve_seq_batch {
  int64_t request_id;
  int32_t sample_index;
  int32_t token_start;
  int32_t num_tokens;           /* 1 for a decode, more for a prompt chunk */
  int32_t context_len;          /* tokens in the KV cache once this step ran */
  const int32_t *block_table;   /* [num_table_blocks]: covers context_len */
  int32_t num_table_blocks;
  bool needs_logits;            /* the step completes the sequence: sample from its last token */
  /* the samples that take a token from these logits: this one, and for the
   * last prompt chunk of an n > 1 request also its siblings */
  const int32_t *sample_indices;
  int32_t num_samples;
  const nb_serve_sampling *sampling; /* the request's (never NULL: zeros when it gave none) */
  const int32_t *tokens;        /* the sequence's tokens so far: the prompt, then the generated ones ... */
  int32_t prompt_len;           /* ... from prompt_len up to context_len (penalties read them) */
} nb_serve_seq_batch;

typedef struct nb_serve_batch {
  int32_t num_seqs;
  const nb_serve_seq_batch *seqs;  /* decodes first, then prompt chunks */
  int32_t num_tokens;              /* <= max_num_batched_tokens */
  const int32_t *token_ids;        /* [num_tokens], all sequences concatenated */
  const int32_t *positions;        /* [num_tokens] */
  const nb_serve_slot *slots;      /* [num_tokens]: where each token's key and value go */
  int32_t num_copies;
  const nb_serve_block_copy *copies; /* copy-on-write, to perform first, in order */
  int32_t num_preempted;           /* sequences preempted by this step */
} nb_serve_batch;

/* Plans the next step. *batch is valid until the next call on the engine
 * that schedules, or its destruction; it may have no sequences (nothing to
 * do until tokens are appended or requests added). */
nb_status nb_serve_schedule(nb_serve_engine *e, const nb_serve_batch **batch);

/* ------------------------------------------------------------------------ */
/* Counters                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct nb_serve_stats {
  int32_t num_running;          /* sequences holding blocks */
  int32_t num_waiting;          /* sequences queued (new or preempted) */
  int64_t num_blocks;
  int64_t num_free_blocks;      /* never used or freed, plus cached ones nobody holds */
  int64_t num_cached_blocks;    /* full blocks findable by the prefix cache */
  uint64_t bytes_per_block;     /* 0 when the config gave no geometry */
  int64_t prefix_cache_queries; /* prompt tokens looked up on admission */
  int64_t prefix_cache_hits;    /* of which found in the cache */
  int64_t num_preemptions;
  int64_t num_steps;
} nb_serve_stats;

void nb_serve_get_stats(const nb_serve_engine *e, nb_serve_stats *out);

/* ------------------------------------------------------------------------ */
/* Attention over the paged KV cache                                         */
/* ------------------------------------------------------------------------ */

/* The cache of one layer is two f32 arrays, keys and values, each
 * [num_blocks, block_size, num_kv_heads, head_dim] (vLLM's flash-attention
 * layout): a token's slot is block * block_size + offset, and its keys for
 * all heads are one contiguous row of num_kv_heads * head_dim floats. A step
 * writes the new tokens' keys and values at their slots (nb_serve_kv_write),
 * then attends (nb_serve_paged_attention).
 *
 * The batch is flat: sequence i owns query rows query_start[i] ..
 * query_start[i+1] - 1, its n_i new tokens, which sit at positions
 * context_lens[i] - n_i .. context_lens[i] - 1 of its context; so a
 * prefill chunk after a cached prefix and a decode (n_i = 1) are the same
 * case. Query row at position p attends to the sequence's keys 0..p
 * (causal), read through row i of block_tables. Grouped-query attention:
 * query head h reads kv head h / (num_heads / num_kv_heads).
 *
 * Numerics: f32 throughout, online softmax with the running maximum
 * subtracted, keys visited block by block in position order, dot products
 * with a fixed 8-lane split. Every output row is computed from its own
 * query, position and sequence alone, the same way whatever else is in the
 * batch, however the prompt was chunked and on whatever thread: a
 * sequence's outputs are bit-identical alone or in any batch (batch
 * invariance, issue 14), at any thread count. */
typedef struct nb_serve_attn {
  int32_t num_seqs;
  int32_t num_tokens;             /* rows of q and out; rows outside every sequence (padding) get zeros */
  int32_t num_heads, num_kv_heads; /* num_heads a multiple of num_kv_heads */
  int32_t head_dim;
  int32_t block_size;
  int32_t num_blocks;             /* blocks in the cache: table entries must be below it */
  int32_t max_blocks_per_seq;     /* row length of block_tables */
  const float *q;                 /* [num_tokens, num_heads, head_dim] */
  const float *k_cache, *v_cache; /* [num_blocks, block_size, num_kv_heads, head_dim] */
  const int32_t *block_tables;    /* [num_seqs, max_blocks_per_seq]; entries past a context unread */
  const int32_t *context_lens;    /* [num_seqs] */
  const int32_t *query_start;     /* [num_seqs + 1], non-decreasing, within [0, num_tokens] */
  float scale;                    /* multiplies q.k, usually 1 / sqrt(head_dim) */
  float *out;                     /* [num_tokens, num_heads, head_dim] */
  int32_t threads;                /* threads `par` runs tasks on (sizes the tasks); 0: unknown */
} nb_serve_attn;

/* Runs task(arg, i) for every i in [0, ntasks), in any order and on any
 * threads, and returns when all are done: how a caller lends its thread
 * pool to a kernel. NULL runs the tasks in order on the calling thread. */
typedef void (*nb_serve_parallel_fn)(void *runner, int ntasks, void (*task)(void *arg, int i), void *arg);

/* Attention of every sequence's new tokens over its paged context. Checks
 * every shape and table entry first and fails with NB_ERR_INVALID_ARG
 * naming the field (a context longer than its table, a block id out of
 * range, more new tokens than context, ...), writing nothing. Tasks are
 * (sequence, tile of 16 query rows, run of kv heads): all kv heads in one
 * task unless there are fewer tiles than twice a->threads (1 for one
 * thread, 16 when a->threads is 0), then runs short enough for about that
 * many tasks. The cut changes no bits. */
nb_status nb_serve_paged_attention(nb_ctx *ctx, const nb_serve_attn *a, nb_serve_parallel_fn par, void *runner);

/* The cache write of one layer: the keys and values of token t go to slot
 * slot_mapping[t] (block * block_size + offset; -1 skips a padding token).
 * Checked first like nb_serve_paged_attention. */
typedef struct nb_serve_kv_write {
  int32_t num_tokens, num_kv_heads, head_dim, block_size, num_blocks;
  const float *k, *v;             /* [num_tokens, num_kv_heads, head_dim] */
  const int32_t *slot_mapping;    /* [num_tokens] */
  float *k_cache, *v_cache;       /* [num_blocks, block_size, num_kv_heads, head_dim] */
} nb_serve_kv_write;
nb_status nb_serve_kv_cache_write(nb_ctx *ctx, const nb_serve_kv_write *w);

/* The kernels' operands for a step's batch b (from nb_serve_schedule):
 * block_tables [b->num_seqs, max_blocks] (each sequence's table, the rest of
 * its row 0, unread), context_lens and query_start [b->num_seqs + 1] per
 * sequence, slot_mapping [b->num_tokens] from b->slots. A table longer than
 * max_blocks, or a batch whose sequences do not tile its tokens in order, is
 * NB_ERR_INVALID_ARG. The caller performs b->copies before the write. */
nb_status nb_serve_batch_operands(nb_ctx *ctx, const nb_serve_batch *b, int32_t block_size, int32_t max_blocks,
                                  int32_t *block_tables, int32_t *context_lens, int32_t *query_start,
                                  int32_t *slot_mapping);

/* The same kernels as custom calls, for a traced model step (run by the
 * interpreter, and by compiled executables as host steps).
 * nb_serve_register_kernels registers "serve.paged_attention",
 * "serve.kv_cache_write" and the model step's sampler "serve.sample" on ctx (once per context: a second call is refused
 * as the custom-call registry refuses a name in use); `lend` (may be NULL:
 * one thread) is borrowed until ctx is destroyed, and its pool runs every
 * paged attention call.
 *
 * nb_serve_paged_attention_op: q f32[T, H, D], k_cache and v_cache
 * f32[num_blocks, block_size, KVH, D], block_tables i32[S, max_blocks],
 * context_lens i32[S], query_start i32[S + 1] -> f32[T, H, D].
 * nb_serve_kv_cache_write_op: k_cache, v_cache, k and v f32[T, KVH, D],
 * slot_mapping i32[T] -> the updated caches in *k_out and *v_out (new
 * values: the interpreter copies the caches; updating them in place is the
 * runtime's business). Bad shapes or dtypes fail the trace with a message
 * naming the operand; bad contents (a block id out of range) fail the run
 * with the kernels' messages. */
typedef struct nb_serve_pool_lend {
  nb_serve_parallel_fn par;
  void *runner;
  int (*threads)(void *runner); /* the threads par runs tasks on; NULL: unknown */
} nb_serve_pool_lend;
nb_status nb_serve_register_kernels(nb_ctx *ctx, const nb_serve_pool_lend *lend);
nb_val *nb_serve_paged_attention_op(nb_val *q, nb_val *k_cache, nb_val *v_cache, nb_val *block_tables,
                                    nb_val *context_lens, nb_val *query_start, float scale);
nb_status nb_serve_kv_cache_write_op(nb_val *k_cache, nb_val *v_cache, nb_val *k, nb_val *v, nb_val *slot_mapping,
                                     nb_val **k_out, nb_val **v_out);

/* ------------------------------------------------------------------------ */
/* The model step over a scheduled batch                                     */
/* ------------------------------------------------------------------------ */

/* A model attached to a paged KV cache: its parameters, the cache (per
 * layer two f32 arrays [num_blocks, block_size, n_kv_heads, head_dim]) and
 * the compiled step executables. One step runs the model over a batch's
 * flat tokens at their positions, writes their keys and values at their
 * slots (nb_serve_kv_cache_write_op), attends through the block tables
 * (nb_serve_paged_attention_op), computes logits only for the rows that
 * draw (a sequence's last token, once per sample that takes it) and samples
 * them (nb_serve_sampling), all in the step's executable: every request's
 * parameters are per-row inputs, so one executable serves any mix.
 *
 * Shape buckets: a step is compiled for (tokens T, rows S, table width MB,
 * processors), T, S and MB each rounded up to a power of two (T at least 8
 * but T = 1 for a lone decode, S counting sequences and drawn samples alike, MB at most the blocks of
 * max_model_len); padding tokens write nowhere (slot -1), padding sequences
 * have no rows, padding draws draw nothing. "processors" is set when some
 * row needs logit_bias, min_tokens masking or penalties: only those steps
 * pay for their dense [S, vocab] inputs. So at most 2 x log2 T_max x log2
 * S_max x log2 MB_max executables exist, however long the run
 * (nb_serve_model_num_executables).
 *
 * Families: gpt2 and llama (dense), and MoE, always run dropless (the
 * config's capacity_factor is ignored: with a capacity a token's experts
 * would depend on the other tokens of the batch).
 * The custom calls are registered on ctx on first use (nb_serve_register_kernels,
 * lending the compiled step's threads through nb_jit_parallel_for). */
typedef struct nb_serve_model nb_serve_model;

typedef struct nb_serve_model_opts {
  bool interpret;               /* run the step graphs on the reference interpreter instead of nb_jit */
  int threads;                  /* nb_jit's thread count; 0: its default */
  nb_nn_linear_hook linear_hook; /* every linear of the step goes through it (quantized models: nb_quant_linear_hook); NULL: plain */
  void *hook_ud;
  /* Hold every linear's 2-D kernel ("<path>/kernel", [in, out]) in the
   * decode layout, repacked once into arrays of the model's own (host arrays
   * without a linear_hook; ignored otherwise): panels of 64 output features,
   * [out / 64, in, 64], when out is a multiple of 64, else [out, in]; a tied
   * f32 embedding table [vocab, d] as the output head's panels,
   * [ceil(vocab / 64), d, 64], zero past the vocabulary. The
   * same bits; a decode step's few rows then read each thread's share of a
   * weight as one contiguous run, which follows the memory's rate where
   * bands of columns of [in, out] do not. The caller's kernels are not
   * retained: release them to keep one copy. set_params still takes them as
   * loaded ([in, out], [vocab, d]). */
  bool pack_kernels;
} nb_serve_model_opts;

/* cfg copied; params: f32 arrays with exactly the model's parameter paths
 * (retained), or quantized kernels in their place with opts->linear_hook
 * set to nb_quant_linear_hook (nabla/quant.h). The engine config gives block_size, num_blocks,
 * max_num_batched_tokens, max_num_seqs and max_model_len (pass
 * nb_serve_engine_config of the engine the model will serve). Compiles
 * nothing yet. NULL with an error naming the field otherwise. */
nb_serve_model *nb_serve_model_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                      const nb_serve_config *engine_config, const nb_serve_model_opts *opts);
void nb_serve_model_destroy(nb_serve_model *m); /* NULL ok */
/* Whether m holds its kernels in the decode layout (opts.pack_kernels took:
 * host arrays, no linear_hook). */
bool nb_serve_model_kernels_packed(const nb_serve_model *m);

/* The token a step drew for one sample, with log-probabilities of the
 * model's distribution: log_softmax of the raw logits, before logit_bias,
 * penalties and temperature (vLLM's raw logprobs). */
typedef struct nb_serve_sample_out {
  int64_t request_id;
  int32_t sample_index;
  int32_t token;
  float logprob;                /* of token */
  int32_t num_top;              /* the request's num_logprobs */
  int32_t top_ids[NB_SERVE_MAX_LOGPROBS];  /* the most likely tokens, most likely first (lowest id on ties) */
  float top_logprobs[NB_SERVE_MAX_LOGPROBS];
} nb_serve_sample_out;

/* Runs one step: b->copies (copy-on-write) on every layer's cache, then the
 * model, then each request's sampling (nb_serve_sampling) on the logits of
 * every sequence with needs_logits: one draw per listed sample (the n > 1
 * samples that fork off a prompt draw from the same logits with their own
 * keys). out (room for max_num_seqs entries) receives the draws in batch
 * order, *num_out their count. A batch with no sequences does nothing. */
nb_status nb_serve_model_step(nb_serve_model *m, const nb_serve_batch *b, nb_serve_sample_out *out, int32_t *num_out);
/* Checks a request's sampling against the model: every logit_bias_ids and
 * stop_token_ids entry must be a token of the vocabulary (the engine does
 * not know it). NB_ERR_INVALID_ARG naming the request, the field, the index
 * and the value otherwise. nb_serve_model_step makes the same check on
 * every drawing sequence before it runs anything; call this when a request
 * is added so that one bad request is refused alone instead of failing a
 * step. NULL sampling is fine. */
nb_status nb_serve_model_check_sampling(const nb_serve_model *m, int64_t id, const nb_serve_sampling *sampling);
/* Step executables compiled (or graphs traced, when interpreting) so far,
 * and the seconds spent tracing and compiling them (inside the steps that
 * first needed them: subtract it from a step's time to get its run time). */
/* Replaces the parameters the steps read by params' arrays (retained, not
 * copied): the same paths, shapes and dtypes as the model's, else nothing
 * changes and the error names the parameter. The compiled executables stay.
 * How a trainer hands its current weights to the engine between rollout
 * phases (GRPO); the KV cache is not touched, so with prefix caching on,
 * blocks cached under the old weights would be reused: keep it off then. */
nb_status nb_serve_model_set_params(nb_serve_model *m, const nb_tree *params);
int nb_serve_model_num_executables(const nb_serve_model *m);
double nb_serve_model_compile_s(const nb_serve_model *m);

/* ------------------------------------------------------------------------ */
/* The engine and the model together                                        */
/* ------------------------------------------------------------------------ */

/* nb_serve_llm drives an engine and its model step: requests in, one event
 * per drawn token out, with the end of each sample decided (max_tokens, an
 * end-of-sequence or stop token once min_tokens are out, an abort). What a
 * server or a rollout loop calls; text (detokenizing, stop strings) stays
 * the caller's, who ends a sample early with nb_serve_llm_finish. Used from
 * one thread at a time. */
typedef struct nb_serve_llm nb_serve_llm;

typedef struct nb_serve_llm_config {
  nb_serve_config engine;       /* engine.kv is filled in from the model when zero */
  nb_serve_model_opts model;
  const int32_t *eos_token_ids; /* end a sample (finish reason stop) unless the request ignores them; copied */
  int32_t num_eos_token_ids;
} nb_serve_llm_config;

typedef enum nb_serve_finish_reason {
  NB_SERVE_RUNNING = 0,         /* more tokens follow */
  NB_SERVE_FINISHED_LENGTH,     /* max_tokens reached */
  NB_SERVE_FINISHED_STOP,       /* an end-of-sequence or stop token (it is this event's token) */
  NB_SERVE_FINISHED_ABORT,      /* nb_serve_llm_abort */
} nb_serve_finish_reason;

typedef struct nb_serve_llm_request {
  nb_serve_request r;           /* r.sampling's stop_token_ids end the sample (finish reason stop) */
  bool ignore_eos;              /* the config's eos tokens neither end nor get masked */
} nb_serve_llm_request;

typedef struct nb_serve_event {
  nb_serve_sample_out s;        /* the token; s.token is -1 for an abort */
  int32_t num_generated;        /* tokens of this sample so far, this one included */
  nb_serve_finish_reason finish;
} nb_serve_event;

/* NULL with the error in ctx (the engine's and the model's checks). */
nb_serve_llm *nb_serve_llm_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                  const nb_serve_llm_config *config);
void nb_serve_llm_destroy(nb_serve_llm *l); /* NULL ok */
nb_serve_engine *nb_serve_llm_engine(nb_serve_llm *l);
nb_serve_model *nb_serve_llm_model(nb_serve_llm *l);
/* Queues a request (nb_serve_add_request's checks). */
nb_status nb_serve_llm_add(nb_serve_llm *l, const nb_serve_llm_request *r);
/* Ends every sample of the request; the next step reports one abort event
 * per sample still running. NB_ERR_NOT_FOUND for an unknown id. */
nb_status nb_serve_llm_abort(nb_serve_llm *l, int64_t id);
/* Ends one sample now (a stop string): no event follows for it. */
nb_status nb_serve_llm_finish(nb_serve_llm *l, int64_t id, int32_t sample_index);
bool nb_serve_llm_has_unfinished(const nb_serve_llm *l);
/* Schedules and runs one step and appends its tokens. *events (valid until
 * the next call) lists every token drawn and every sample ended, in batch
 * order; a step may have none (a prompt chunk that is not the last). */
nb_status nb_serve_llm_step(nb_serve_llm *l, const nb_serve_event **events, int32_t *num_events);
/* Steps run so far (nb_serve_llm_step calls, failed ones included): step k
 * (1-based) is a prefill chunk or a decode step of the batch, recorded in a
 * trace as the span "engine step" (category "serve") with argument step=k. */
int64_t nb_serve_llm_steps(const nb_serve_llm *l);

/* ------------------------------------------------------------------------ */
/* Chat templates                                                            */
/* ------------------------------------------------------------------------ */

/* The chat formats nabla renders as the models' own Jinja templates do
 * (Hugging Face's tokenizer_config.json chat_template); the server renders
 * requests with them and SFT renders its training conversations with them,
 * so a fine-tuned model is served in the format it was trained on. */
typedef enum nb_serve_chat_format {
  NB_SERVE_CHAT_NONE = -1,
  NB_SERVE_CHAT_CHATML,
  NB_SERVE_CHAT_LLAMA3,
  NB_SERVE_CHAT_GEMMA,
  NB_SERVE_CHAT_LLAMA2,
  NB_SERVE_CHAT_MISTRAL,
  NB_SERVE_CHAT_COUNT
} nb_serve_chat_format;

/* "chatml", "llama-3", "gemma", "llama-2", "mistral"; "none" for NONE. */
const char *nb_serve_chat_format_name(nb_serve_chat_format f);
/* The format of that name, or NB_SERVE_CHAT_NONE. */
nb_serve_chat_format nb_serve_chat_format_parse(const char *name);
/* "chatml, llama-3, gemma, llama-2, mistral" (for messages). */
const char *nb_serve_chat_known(void);
/* The format a Jinja chat_template is, by its marker text, or NONE. */
nb_serve_chat_format nb_serve_chat_detect(const char *jinja);
/* The text that ends an assistant turn and so ends generation
 * ("<|im_end|>"), or NULL (llama-2, mistral: the EOS token). */
const char *nb_serve_chat_end(nb_serve_chat_format f);

typedef struct nb_serve_chat_msg {
  const char *role;     /* "system", "user" or "assistant" */
  const char *content;  /* content_len bytes */
  size_t content_len;
} nb_serve_chat_msg;

typedef struct nb_serve_chat_span {
  size_t start, end;    /* [start, end) bytes of the rendered text */
} nb_serve_chat_span;

typedef struct nb_serve_chat_text {
  char *text;           /* NUL-terminated, len bytes */
  size_t len;
  bool add_bos;         /* the caller prepends the BOS id (chatml); the others write it as text */
  int n_assistant;
  nb_serve_chat_span *assistant; /* per assistant message: what the model is to produce
                                    (its content and end of turn), in order */
} nb_serve_chat_text;

/* Renders n messages with format f, with the generation prompt (the
 * assistant's header) when gen_prompt, into *out (free with
 * nb_serve_chat_text_free). Errors (NB_ERR_INVALID_ARG) name the message:
 * "messages[2].role 'robot' is not system, user or assistant", "messages[0]:
 * the gemma template has no system role", a llama-2 / mistral system
 * message other than the first. */
nb_status nb_serve_chat_render(nb_ctx *ctx, nb_serve_chat_format f, const nb_serve_chat_msg *msgs, int n, bool gen_prompt,
                               nb_serve_chat_text *out);
void nb_serve_chat_text_free(nb_serve_chat_text *t);

NB_END_DECLS

#endif
