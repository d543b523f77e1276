/* Private to the serve library: the KV block pool (free list, reference
 * counts, prefix-cache table, LRU of evictable blocks) and the engine's
 * sequences. The public API is include/nabla/serve.h. */
#ifndef NABLA_SERVE_INTERNAL_H
#define NABLA_SERVE_INTERNAL_H

#include "nabla/serve.h"

/* ---- block pool --------------------------------------------------------- */
/* Every block is in exactly one of three places: held (refcount > 0), on the
 * free list (refcount 0, not cached), or on the LRU list (refcount 0, cached:
 * its contents are still findable by hash). The two lists are intrusive
 * doubly linked lists over prev/next; allocation takes the free list's head
 * and evicts the LRU's head only when the free list is empty. */
enum { NB_SERVE__HELD = 0, NB_SERVE__FREE = 1, NB_SERVE__LRU = 2 };

typedef struct nb_serve__list {
  int32_t head, tail, len;
} nb_serve__list;

typedef struct nb_serve__pool {
  nb_ctx *ctx;
  int32_t num_blocks, block_size;
  int32_t *ref;
  int32_t *prev, *next;
  uint8_t *where;               /* NB_SERVE__HELD / FREE / LRU */
  nb_serve__list free, lru;
  /* prefix cache: a block is cached when `cached` is set; its key is its
   * chained hash, checked against the parent hash and tokens it was
   * registered with, so a hash collision is a miss, never wrong contents */
  uint8_t *cached;
  uint64_t *hash, *parent;
  int32_t *tokens;              /* [num_blocks * block_size] */
  uint64_t *tab_key;            /* open addressing, linear probing */
  int32_t *tab_val;             /* block, or -1 for an empty slot */
  uint32_t tab_mask;
  int32_t num_cached;
} nb_serve__pool;

/* The hash of the first block's parent. */
#define NB_SERVE__ROOT_HASH 0x6e61626c61ULL

nb_status nb_serve__pool_init(nb_serve__pool *p, nb_ctx *ctx, int32_t num_blocks, int32_t block_size);
void nb_serve__pool_free(nb_serve__pool *p);
/* Blocks an allocation can get: free plus evictable. */
static inline int32_t nb_serve__pool_available(const nb_serve__pool *p) { return p->free.len + p->lru.len; }
/* A block with refcount 1, or -1 when none is available. */
int32_t nb_serve__pool_alloc(nb_serve__pool *p);
/* Another holder of block b (which may be an unheld cached block). */
void nb_serve__pool_incref(nb_serve__pool *p, int32_t b);
/* One holder fewer; at zero the block goes to the LRU's tail when cached,
 * else to the free list. */
void nb_serve__pool_decref(nb_serve__pool *p, int32_t b);

/* The chained hash of a full block of tokens whose predecessor hashed to
 * `parent` (NB_SERVE__ROOT_HASH for the first block). */
uint64_t nb_serve__block_hash(uint64_t parent, const int32_t *tokens, int32_t block_size);
/* The cached block with this key and contents, or -1. Does not take it. */
int32_t nb_serve__pool_lookup(const nb_serve__pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Makes full block b findable under `hash`; no-op when b is cached already
 * or another block holds the hash. An unheld block on the free list moves to
 * the LRU's tail. */
void nb_serve__pool_register(nb_serve__pool *p, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Checks the lists, reference-free blocks and the table against each other;
 * false with why[cap] on the first inconsistency. */
bool nb_serve__pool_check(const nb_serve__pool *p, char *why, size_t cap);

/* ---- engine --------------------------------------------------------------- */
typedef enum nb_serve__state { NB_SERVE__WAITING, NB_SERVE__RUNNING, NB_SERVE__FINISHED } nb_serve__state;

typedef struct nb_serve__seq nb_serve__seq;
struct nb_serve__seq {
  int64_t request_id;
  int32_t sample_index;
  nb_serve__state state;
  bool aborted;
  bool awaiting_token;          /* the last step computed every token: append one */
  bool scheduled;               /* in the batch being built */
  int32_t *tokens;              /* [cap]: prompt, then generated */
  int32_t num_tokens, prompt_len, cap;
  int32_t max_tokens;
  int32_t num_computed;         /* tokens whose KV is in the cache (after the planned step) */
  int32_t *table;               /* [max_blocks_per_seq] */
  int32_t num_table;
  uint64_t *hashes;             /* chained hashes of the full blocks of tokens */
  int32_t num_hashes;
  nb_serve_sampling sampling;   /* the request's, its arrays owned by the sequence */
  nb_serve__seq **forks;        /* siblings made when the prompt completes (n > 1) */
  int32_t num_forks;
};

struct nb_serve_engine {
  nb_ctx *ctx;
  nb_serve_config cfg;
  uint64_t bytes_per_block;
  int32_t max_blocks_per_seq;
  nb_serve__pool pool;
  nb_serve__seq **running;      /* admission order: oldest first */
  int32_t num_running;
  nb_serve__seq **waiting;      /* front first */
  int32_t num_waiting, cap_waiting;
  /* blocks filled by the last step, published in the prefix cache at the
   * start of the next one (their contents exist only once it ran) */
  struct nb_serve__pending {
    nb_serve__seq *seq;         /* alive until retired, after publication */
    int32_t index;              /* which block of the sequence */
    int32_t block;
  } *pending;
  int32_t num_pending;
  /* the batch under construction, sized for the limits at creation */
  nb_serve_batch batch;
  nb_serve_seq_batch *b_seqs;
  int32_t *b_tokens, *b_positions, *b_tables, *b_samples;
  nb_serve_slot *b_slots;
  nb_serve_block_copy *b_copies;
  int32_t b_num_tables, b_num_samples;
  int64_t queries, hits, preemptions, steps;
};

/* Checks the engine's invariants: each block's refcount equals the number
 * of block tables holding it, held + free + evictable = all blocks, tables
 * cover exactly the computed tokens. */
bool nb_serve__engine_check(const nb_serve_engine *e, char *why, size_t cap);

/* The names the serve kernels are registered under as custom calls. */
#define NB_SERVE__ATTN_NAME "serve.paged_attention"
#define NB_SERVE__WRITE_NAME "serve.kv_cache_write"
#define NB_SERVE__SAMPLE_NAME "serve.sample"

/* ---- sampling (sample.c) --------------------------------------------------- */

/* One drawn row's selection parameters, as the kernel reads them. */
typedef struct nb_serve__row {
  float temperature;            /* 0: greedy */
  float top_p, min_p;
  int32_t top_k, num_logprobs;
  double u;                     /* the row's uniform in [0, 1) */
} nb_serve__row;

typedef struct nb_serve__row_out {
  int32_t token;
  float logprob;
  int32_t num_top;
  int32_t top_ids[NB_SERVE_MAX_LOGPROBS];
  float top_logprobs[NB_SERVE_MAX_LOGPROBS];
} nb_serve__row_out;

/* Work space for rows of V logits. */
typedef struct nb_serve__scratch {
  int32_t V;
  float *y, *sel;
  void *cands;
} nb_serve__scratch;
nb_status nb_serve__scratch_init(nb_ctx *ctx, nb_serve__scratch *s, int32_t V);
void nb_serve__scratch_free(nb_ctx *ctx, nb_serve__scratch *s);

/* The sampling distribution of one row of processed logits x[V]: w[i] the
 * unnormalized weight of token i (0 outside the support), *total their sum
 * in id order; returns the support's size. Greedy (temperature 0): weight 1
 * on the argmax (lowest id on ties). Otherwise y = x / temperature and the
 * support is y >= the top_k-th largest y, then y >= the smallest y of the
 * top_p set (the most likely tokens, in order, while the mass before them is
 * below top_p of the top_k survivors' mass), and y - max(y) >= log(min_p);
 * w = exp(y - max(y)). */
int32_t nb_serve__sample_weights(const nb_serve__row *p, const float *x, int32_t V, nb_serve__scratch *s, double *w,
                                 double *total);
/* A greedy row: temperature 0 (or NaN), the argmax of x and no scratch. */
static inline bool nb_serve__row_greedy(const nb_serve__row *p) { return !(p->temperature > 0); }
/* The draw: the first token in id order whose cumulative weight exceeds
 * u * total; its log-probability and the top num_logprobs from
 * log_softmax(z) of the raw logits z. w: V doubles of scratch, and s, unread
 * for a greedy row (NULL allowed there). */
void nb_serve__sample_row(const nb_serve__row *p, const float *z, const float *x, int32_t V, nb_serve__scratch *s, double *w,
                          nb_serve__row_out *o);
nb_status nb_serve__register_sampler(nb_ctx *ctx);
/* The sampler's passes over a row exist for the baseline (0), AVX2 (1) and
 * AVX-512 (2), picked by the CPU; they give the same bits. isa in [0, 2]
 * forces one for tests (returns it, or -1 when the CPU lacks it); another
 * value returns the CPU's best. */
int nb_serve__sampler_isa(int isa);

/* The traced sampler over R rows of V logits. */
typedef struct nb_serve__sample_in {
  nb_val *logits;               /* f32[R, V], raw */
  nb_val *fparams;              /* f32[R, 3]: temperature, top_p, min_p */
  nb_val *iparams;              /* i32[R, 3]: top_k, num_logprobs, active (0: a padding row) */
  nb_val *keys;                 /* u32[R, 4]: seed >> 32, seed & 0xffffffff, sample index k, token index j */
  /* all NULL, or all set (a bucket with logits processors): */
  nb_val *bias;                 /* f32[R, V]: logit_bias, -inf on the stop tokens min_tokens masks */
  nb_val *counts;               /* f32[R, V]: occurrences among the generated tokens */
  nb_val *seen;                 /* bool[R, V]: in the prompt or generated */
  nb_val *penalties;            /* f32[R, 3]: repetition (1: off), frequency, presence */
} nb_serve__sample_in;
typedef struct nb_serve__sample_out {
  nb_val *token, *logprob;      /* i32[R], f32[R] */
  nb_val *top_ids, *top_logprobs; /* i32 / f32 [R, NB_SERVE_MAX_LOGPROBS]; the first num_logprobs of a row set */
} nb_serve__sample_out;
nb_status nb_serve__sample_op(const nb_serve__sample_in *in, nb_serve__sample_out *out);
/* The logits processors alone (in->bias etc. set): the processed logits
 * f32[R, V] the kernel selects from. */
nb_val *nb_serve__process_logits(const nb_serve__sample_in *in);

#endif
