/* The engine: configuration and KV cache sizing, requests and their
 * sequences, and the continuous-batching scheduler that plans each step. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "serve/internal.h"
#include "util/trace.h"

/* ---- configuration --------------------------------------------------------- */

uint64_t nb_serve_bytes_per_block(const nb_serve_kv_geometry *g, int32_t block_size) {
  if (!g || block_size <= 0) return 0;
  int64_t f[5] = {g->num_layers, g->num_kv_heads, g->head_dim, g->dtype_size, block_size};
  uint64_t bytes = 2; /* keys and values */
  for (int i = 0; i < 5; i++) {
    if (f[i] <= 0 || bytes > UINT64_MAX / (uint64_t)f[i]) return 0;
    bytes *= (uint64_t)f[i];
  }
  return bytes;
}

static uint64_t physical_ram(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

static nb_status bad_config(nb_ctx *ctx, const char *field, const char *why, int64_t v) {
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve config: %s %s (got %lld)", field, why, (long long)v);
}

/* Fills defaults, checks every field and turns the KV budget into blocks;
 * fails when one sequence of max_model_len does not fit. */
static nb_status resolve_config(nb_ctx *ctx, const nb_serve_config *in, nb_serve_config *c, uint64_t *bytes_per_block) {
  *c = *in;
  if (c->block_size == 0) c->block_size = 16;
  if (c->max_num_seqs == 0) c->max_num_seqs = 256;
  if (c->max_num_batched_tokens == 0) c->max_num_batched_tokens = c->max_num_seqs > 2048 ? c->max_num_seqs : 2048;
  if (c->block_size < 1 || c->block_size > 4096) return bad_config(ctx, "block_size", "must be in [1, 4096]", c->block_size);
  if (c->max_model_len < 1) return bad_config(ctx, "max_model_len", "must be at least 1", c->max_model_len);
  if (c->max_num_seqs < 1) return bad_config(ctx, "max_num_seqs", "must be at least 1", c->max_num_seqs);
  if (c->max_num_batched_tokens < c->max_num_seqs)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "serve config: max_num_batched_tokens (%d) must be at least max_num_seqs (%d), so every running "
                     "sequence can decode in one step",
                     c->max_num_batched_tokens, c->max_num_seqs);
  if (c->num_blocks < 0) return bad_config(ctx, "num_blocks", "must not be negative", c->num_blocks);
  if (c->kv_cache_memory_fraction < 0 || c->kv_cache_memory_fraction > 1 || c->kv_cache_memory_fraction != c->kv_cache_memory_fraction)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve config: kv_cache_memory_fraction must be in (0, 1] (got %g)",
                     c->kv_cache_memory_fraction);
  uint64_t bpb = nb_serve_bytes_per_block(&c->kv, c->block_size);
  *bytes_per_block = bpb;
  int64_t need_blocks = ((int64_t)c->max_model_len + c->block_size - 1) / c->block_size;
  uint64_t budget = 0;
  const char *source;
  if (c->num_blocks == 0 && c->kv_cache_bytes == 0 && c->kv_cache_memory_fraction == 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "serve config: no KV cache size: set num_blocks, kv_cache_bytes or kv_cache_memory_fraction");
  if (c->num_blocks > 0) {
    source = "num_blocks";
  } else {
    if (bpb == 0)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                       "serve config: kv (num_layers %lld, num_kv_heads %lld, head_dim %lld, dtype_size %lld) must be "
                       "positive to size the KV cache from %s",
                       (long long)c->kv.num_layers, (long long)c->kv.num_kv_heads, (long long)c->kv.head_dim,
                       (long long)c->kv.dtype_size,
                       c->kv_cache_bytes ? "kv_cache_bytes" : "kv_cache_memory_fraction");
    if (c->kv_cache_bytes > 0) {
      source = "kv_cache_bytes";
      budget = c->kv_cache_bytes;
    } else {
      source = "kv_cache_memory_fraction";
      uint64_t ram = physical_ram();
      if (ram == 0) return nb_errorf(ctx, NB_ERR_IO, "serve config: cannot read the physical memory size");
      budget = (uint64_t)((double)ram * c->kv_cache_memory_fraction);
    }
    uint64_t blocks = budget / bpb;
    c->num_blocks = blocks > INT32_MAX - 1 ? INT32_MAX - 1 : (int64_t)blocks;
  }
  if (c->num_blocks > INT32_MAX - 1) return bad_config(ctx, "num_blocks", "must be below 2^31 - 1", c->num_blocks);
  if (c->num_blocks < need_blocks) {
    if (bpb > 0)
      return nb_errorf(ctx, NB_ERR_NOMEM,
                       "KV cache too small for max_model_len %d: one sequence needs %lld blocks of %d tokens = %llu "
                       "bytes, but %s gives %lld blocks = %llu bytes available",
                       c->max_model_len, (long long)need_blocks, c->block_size,
                       (unsigned long long)((uint64_t)need_blocks * bpb), source, (long long)c->num_blocks,
                       (unsigned long long)((uint64_t)c->num_blocks * bpb));
    return nb_errorf(ctx, NB_ERR_NOMEM,
                     "KV cache too small for max_model_len %d: one sequence needs %lld blocks of %d tokens, but "
                     "num_blocks is %lld",
                     c->max_model_len, (long long)need_blocks, c->block_size, (long long)c->num_blocks);
  }
  return NB_OK;
}

/* ---- engine ------------------------------------------------------------------ */

#define ENGINE_ARRAYS(X)                                                   \
  X(running, nb_serve__seq *, ms) X(pending, struct nb_serve__pending, np) \
  X(b_seqs, nb_serve_seq_batch, ms) X(b_tokens, int32_t, mt) X(b_positions, int32_t, mt) \
  X(b_slots, nb_serve_slot, mt) X(b_tables, int32_t, ms * mb) X(b_samples, int32_t, ms) \
  X(b_copies, nb_serve_block_copy, ms)

#define ENGINE_SIZES(e)                                                                              \
  size_t ms = (size_t)(e)->cfg.max_num_seqs, mt = (size_t)(e)->cfg.max_num_batched_tokens,        \
         mb = (size_t)(e)->max_blocks_per_seq, np = mt / (size_t)(e)->cfg.block_size + ms + 1; \
  (void)ms, (void)mt, (void)mb, (void)np

static void seq_free(nb_serve_engine *e, nb_serve__seq *s);

void nb_serve_engine_destroy(nb_serve_engine *e) {
  if (!e) return;
  nb_ctx *ctx = e->ctx;
  for (int32_t i = 0; i < e->num_running; i++) seq_free(e, e->running[i]);
  for (int32_t i = 0; i < e->num_waiting; i++) seq_free(e, e->waiting[i]);
  if (e->waiting) nb_dealloc(ctx, e->waiting, (size_t)e->cap_waiting * sizeof *e->waiting);
  ENGINE_SIZES(e);
#define FREE(f, T, count) \
  if (e->f) nb_dealloc(ctx, e->f, (count) * sizeof(T));
  ENGINE_ARRAYS(FREE)
#undef FREE
  nb_serve__pool_free(&e->pool);
  nb_dealloc(ctx, e, sizeof *e);
}

nb_serve_engine *nb_serve_engine_create(nb_ctx *ctx, const nb_serve_config *config) {
  if (!config) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_serve_engine_create: config is NULL");
    return NULL;
  }
  nb_serve_config c;
  uint64_t bpb = 0;
  if (resolve_config(ctx, config, &c, &bpb) != NB_OK) return NULL;
  nb_serve_engine *e = nb_calloc(ctx, sizeof *e);
  if (!e) return NULL;
  e->ctx = ctx;
  e->cfg = c;
  e->bytes_per_block = bpb;
  e->max_blocks_per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  ENGINE_SIZES(e);
#define ALLOC(f, T, count)                           \
  if (!(e->f = nb_alloc(ctx, (count) * sizeof(T)))) { \
    nb_serve_engine_destroy(e);                      \
    return NULL;                                     \
  }
  ENGINE_ARRAYS(ALLOC)
#undef ALLOC
  if (nb_serve__pool_init(&e->pool, ctx, (int32_t)c.num_blocks, c.block_size) != NB_OK) {
    nb_serve_engine_destroy(e);
    return NULL;
  }
  return e;
}

const nb_serve_config *nb_serve_engine_config(const nb_serve_engine *e) { return &e->cfg; }

/* ---- sequences ------------------------------------------------------------------ */

static void seq_free(nb_serve_engine *e, nb_serve__seq *s) {
  nb_ctx *ctx = e->ctx;
  for (int32_t i = 0; i < s->num_forks; i++)
    if (s->forks[i]) seq_free(e, s->forks[i]);
  if (s->forks) nb_dealloc(ctx, s->forks, (size_t)s->num_forks * sizeof *s->forks);
  if (s->tokens) nb_dealloc(ctx, s->tokens, (size_t)s->cap * sizeof *s->tokens);
  if (s->table) nb_dealloc(ctx, s->table, (size_t)e->max_blocks_per_seq * sizeof *s->table);
  if (s->hashes) nb_dealloc(ctx, s->hashes, (size_t)e->max_blocks_per_seq * sizeof *s->hashes);
  const nb_serve_sampling *sp = &s->sampling;
  if (sp->logit_bias_ids) nb_dealloc(ctx, (void *)sp->logit_bias_ids, (size_t)sp->num_logit_bias * sizeof(int32_t));
  if (sp->logit_bias_values) nb_dealloc(ctx, (void *)sp->logit_bias_values, (size_t)sp->num_logit_bias * sizeof(float));
  if (sp->stop_token_ids) nb_dealloc(ctx, (void *)sp->stop_token_ids, (size_t)sp->num_stop_token_ids * sizeof(int32_t));
  nb_dealloc(ctx, s, sizeof *s);
}

/* *d = *src with its arrays copied into d's own memory (freed by seq_free). */
static nb_status copy_sampling(nb_ctx *ctx, const nb_serve_sampling *src, nb_serve_sampling *d) {
  *d = *src;
  d->logit_bias_ids = NULL, d->logit_bias_values = NULL, d->stop_token_ids = NULL;
  size_t nb = (size_t)(src->num_logit_bias > 0 ? src->num_logit_bias : 0);
  size_t ns = (size_t)(src->num_stop_token_ids > 0 ? src->num_stop_token_ids : 0);
  int32_t *ids = nb ? nb_alloc(ctx, nb * sizeof *ids) : NULL, *stops = ns ? nb_alloc(ctx, ns * sizeof *stops) : NULL;
  float *vals = nb ? nb_alloc(ctx, nb * sizeof *vals) : NULL;
  d->logit_bias_ids = ids, d->logit_bias_values = vals, d->stop_token_ids = stops;
  if ((nb && (!ids || !vals)) || (ns && !stops)) return NB_ERR_NOMEM;
  if (nb) memcpy(ids, src->logit_bias_ids, nb * sizeof *ids), memcpy(vals, src->logit_bias_values, nb * sizeof *vals);
  if (ns) memcpy(stops, src->stop_token_ids, ns * sizeof *stops);
  return NB_OK;
}

/* A sequence with room for every token it will ever hold, so stepping never
 * allocates. */
static nb_serve__seq *seq_new(nb_serve_engine *e, const nb_serve_request *r, int32_t sample_index) {
  nb_ctx *ctx = e->ctx;
  nb_serve__seq *s = nb_calloc(ctx, sizeof *s);
  if (!s) return NULL;
  s->request_id = r->id;
  s->sample_index = sample_index;
  s->cap = r->prompt_len + r->max_tokens;
  s->prompt_len = s->num_tokens = r->prompt_len;
  s->max_tokens = r->max_tokens;
  s->tokens = nb_alloc(ctx, (size_t)s->cap * sizeof *s->tokens);
  s->table = nb_alloc(ctx, (size_t)e->max_blocks_per_seq * sizeof *s->table);
  s->hashes = nb_alloc(ctx, (size_t)e->max_blocks_per_seq * sizeof *s->hashes);
  if (!s->tokens || !s->table || !s->hashes) {
    seq_free(e, s);
    return NULL;
  }
  memcpy(s->tokens, r->prompt, (size_t)r->prompt_len * sizeof *s->tokens);
  if (r->sampling && copy_sampling(ctx, r->sampling, &s->sampling) != NB_OK) {
    seq_free(e, s);
    return NULL;
  }
  return s;
}

/* The chained hashes of the sequence's full blocks, computed as far as its
 * tokens go. */
static void seq_update_hashes(nb_serve_engine *e, nb_serve__seq *s) {
  int32_t bs = e->cfg.block_size;
  for (; s->num_hashes < s->num_tokens / bs; s->num_hashes++) {
    uint64_t parent = s->num_hashes ? s->hashes[s->num_hashes - 1] : NB_SERVE__ROOT_HASH;
    s->hashes[s->num_hashes] = nb_serve__block_hash(parent, s->tokens + (size_t)s->num_hashes * bs, bs);
  }
}

/* ---- KV blocks in traces (docs/prof.md, "KV cache") ------------------------------------ */

/* The counter "kv blocks: request ID/SAMPLE": the blocks one sequence holds. */
static void trace_seq_blocks(const nb_serve__seq *s, int64_t t) {
  char name[64];
  snprintf(name, sizeof name, "kv blocks: request %lld/%d", (long long)s->request_id, (int)s->sample_index);
  nb_util__trace_arg a = {"blocks", NULL, s->num_table};
  nb_util__trace_counter("serve", name, t, &a, 1);
}

/* After a step is planned: the pool's blocks (used: held by sequences;
 * free; cached: nobody holds them, the prefix cache keeps their contents
 * until they are needed) and each running sequence's, at one time. */
static void trace_blocks(const nb_serve_engine *e) {
  int64_t t = nb_util__trace_start();
  if (!t) return;
  const nb_serve__pool *p = &e->pool;
  nb_util__trace_arg a[] = {{"used", NULL, p->num_blocks - p->free.len - p->lru.len},
                            {"free", NULL, p->free.len},
                            {"cached", NULL, p->lru.len},
                            {"sequences", NULL, e->num_running}};
  nb_util__trace_counter("serve", "kv blocks", t, a, 4);
  for (int32_t i = 0; i < e->num_running; i++) trace_seq_blocks(e->running[i], t);
}

/* Gives back all of the sequence's blocks, the last first, so the tail of a
 * prompt is evicted before its head (which more requests share). */
static void seq_release_blocks(nb_serve_engine *e, nb_serve__seq *s) {
  for (int32_t i = s->num_table - 1; i >= 0; i--) nb_serve__pool_decref(&e->pool, s->table[i]);
  bool held = s->num_table > 0;
  s->num_table = 0;
  s->num_computed = 0;
  if (held) trace_seq_blocks(s, nb_util__trace_start());
}

static void seq_finish(nb_serve_engine *e, nb_serve__seq *s) {
  seq_release_blocks(e, s);
  s->state = NB_SERVE__FINISHED;
  s->awaiting_token = false;
  for (int32_t i = 0; i < s->num_forks; i++) seq_free(e, s->forks[i]);
  if (s->forks) nb_dealloc(e->ctx, s->forks, (size_t)s->num_forks * sizeof *s->forks);
  s->forks = NULL;
  s->num_forks = 0;
}

/* Sequence slots a sequence takes against max_num_seqs: itself and the
 * siblings it will fork. */
static int32_t seq_slots(const nb_serve__seq *s) { return 1 + s->num_forks; }

/* The live sequence of a request's sample, else (unless live_only) a
 * finished one not retired yet. */
static nb_serve__seq *find_seq(const nb_serve_engine *e, int64_t id, int32_t sample_index, bool live_only) {
  nb_serve__seq *done = NULL;
  for (int32_t i = 0; i < e->num_running; i++) {
    nb_serve__seq *s = e->running[i];
    if (s->request_id != id || s->sample_index != sample_index) continue;
    if (s->state != NB_SERVE__FINISHED) return s;
    done = s;
  }
  for (int32_t i = 0; i < e->num_waiting; i++)
    if (e->waiting[i]->request_id == id && e->waiting[i]->sample_index == sample_index) return e->waiting[i];
  return live_only ? NULL : done;
}

static bool request_live(const nb_serve_engine *e, int64_t id) {
  for (int32_t i = 0; i < e->num_running; i++)
    if (e->running[i]->request_id == id && e->running[i]->state != NB_SERVE__FINISHED) return true;
  for (int32_t i = 0; i < e->num_waiting; i++)
    if (e->waiting[i]->request_id == id) return true;
  return false;
}

static int32_t live_seqs(const nb_serve_engine *e) {
  int32_t n = 0;
  for (int32_t i = 0; i < e->num_running; i++) n += seq_slots(e->running[i]);
  for (int32_t i = 0; i < e->num_waiting; i++) n += seq_slots(e->waiting[i]);
  return n;
}

static nb_status waiting_reserve(nb_serve_engine *e, int32_t need) {
  if (need <= e->cap_waiting) return NB_OK;
  int32_t cap = e->cap_waiting ? e->cap_waiting : 16;
  while (cap < need) cap *= 2;
  nb_serve__seq **w = nb_alloc(e->ctx, (size_t)cap * sizeof *w);
  if (!w) return NB_ERR_NOMEM;
  if (e->waiting) {
    memcpy(w, e->waiting, (size_t)e->num_waiting * sizeof *w);
    nb_dealloc(e->ctx, e->waiting, (size_t)e->cap_waiting * sizeof *w);
  }
  e->waiting = w;
  e->cap_waiting = cap;
  return NB_OK;
}

/* ---- requests -------------------------------------------------------------------- */

/* The ranges vLLM's SamplingParams accepts; token ids are checked against
 * the vocabulary by the model step. */
static nb_status check_sampling(nb_ctx *ctx, int64_t id, const nb_serve_sampling *p) {
  const char *bad = NULL;
  double v = 0;
#define RULE(cond, field, value) \
  if (!bad && !(cond)) bad = field, v = (double)(value);
  RULE(isfinite(p->temperature) && p->temperature >= 0, "temperature", p->temperature)
  RULE(p->top_k >= -1, "top_k", p->top_k)
  RULE(p->top_p >= 0 && p->top_p <= 1, "top_p", p->top_p)
  RULE(p->min_p >= 0 && p->min_p <= 1, "min_p", p->min_p)
  RULE(p->presence_penalty >= -2 && p->presence_penalty <= 2, "presence_penalty", p->presence_penalty)
  RULE(p->frequency_penalty >= -2 && p->frequency_penalty <= 2, "frequency_penalty", p->frequency_penalty)
  RULE(isfinite(p->repetition_penalty) && p->repetition_penalty >= 0, "repetition_penalty", p->repetition_penalty)
  RULE(p->num_logprobs >= 0 && p->num_logprobs <= NB_SERVE_MAX_LOGPROBS, "num_logprobs", p->num_logprobs)
  RULE(p->min_tokens >= 0, "min_tokens", p->min_tokens)
  RULE(p->num_logit_bias >= 0 && (!p->num_logit_bias || (p->logit_bias_ids && p->logit_bias_values)), "num_logit_bias",
       p->num_logit_bias)
  RULE(p->num_stop_token_ids >= 0 && (!p->num_stop_token_ids || p->stop_token_ids), "num_stop_token_ids",
       p->num_stop_token_ids)
#undef RULE
  for (int32_t i = 0; !bad && i < p->num_logit_bias; i++)
    if (!isfinite(p->logit_bias_values[i])) bad = "logit_bias_values", v = p->logit_bias_values[i];
  if (!bad) return NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: sampling.%s = %g is out of range", (long long)id, bad, v);
}

nb_status nb_serve_add_request(nb_serve_engine *e, const nb_serve_request *r) {
  nb_ctx *ctx = e->ctx;
  if (!r || !r->prompt || r->prompt_len < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request: the prompt is empty");
  int64_t id = r->id;
  int32_t n = r->n ? r->n : 1;
  if (r->max_tokens < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: max_tokens must be at least 1 (got %d)", (long long)id,
                     r->max_tokens);
  if ((int64_t)r->prompt_len + r->max_tokens > e->cfg.max_model_len)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "serve request %lld: prompt of %d tokens + max_tokens %d = %lld exceeds max_model_len %d",
                     (long long)id, r->prompt_len, r->max_tokens, (long long)r->prompt_len + r->max_tokens,
                     e->cfg.max_model_len);
  if (n < 1 || n > e->cfg.max_num_seqs)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: n must be in [1, max_num_seqs %d] (got %d)",
                     (long long)id, e->cfg.max_num_seqs, n);
  if (request_live(e, id))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: the id is already in use", (long long)id);
  if (r->sampling && check_sampling(ctx, id, r->sampling) != NB_OK) return nb_ctx_status(ctx);
  /* the waiting queue has room for every live sequence, so preemption
   * never allocates */
  if (waiting_reserve(e, live_seqs(e) + n) != NB_OK) return nb_ctx_status(ctx);
  nb_serve__seq *s = seq_new(e, r, 0);
  if (!s) return nb_ctx_status(ctx);
  if (n > 1 && !(s->forks = nb_calloc(ctx, (size_t)(n - 1) * sizeof *s->forks))) {
    seq_free(e, s);
    return nb_ctx_status(ctx);
  }
  s->num_forks = n - 1;
  for (int32_t k = 1; k < n; k++)
    if (!(s->forks[k - 1] = seq_new(e, r, k))) {
      seq_free(e, s); /* frees the forks made so far; the rest are NULL */
      return nb_ctx_status(ctx);
    }
  s->state = NB_SERVE__WAITING;
  e->waiting[e->num_waiting++] = s;
  return NB_OK;
}

static void waiting_remove_at(nb_serve_engine *e, int32_t i) {
  memmove(e->waiting + i, e->waiting + i + 1, (size_t)(e->num_waiting - i - 1) * sizeof *e->waiting);
  e->num_waiting--;
}

nb_status nb_serve_abort_request(nb_serve_engine *e, int64_t id) {
  bool found = false;
  for (int32_t i = 0; i < e->num_waiting;) {
    if (e->waiting[i]->request_id == id) {
      seq_free(e, e->waiting[i]); /* holds no blocks and is in no batch */
      waiting_remove_at(e, i);
      found = true;
    } else {
      i++;
    }
  }
  for (int32_t i = 0; i < e->num_running; i++) {
    nb_serve__seq *s = e->running[i];
    if (s->request_id == id && s->state != NB_SERVE__FINISHED) {
      seq_finish(e, s); /* retired by the next step: the current batch may name it */
      s->aborted = true;
      found = true;
    }
  }
  if (!found) return nb_errorf(e->ctx, NB_ERR_NOT_FOUND, "serve: no unfinished request %lld to abort", (long long)id);
  return NB_OK;
}

nb_status nb_serve_append_token(nb_serve_engine *e, int64_t id, int32_t sample_index, int32_t token, bool *finished) {
  if (finished) *finished = false;
  nb_serve__seq *s = find_seq(e, id, sample_index, false);
  if (s && s->aborted) {
    if (finished) *finished = true;
    return NB_OK;
  }
  if (!s || !s->awaiting_token)
    return nb_errorf(e->ctx, NB_ERR_INVALID_ARG,
                     "serve: request %lld sample %d is not waiting for a token (%s)", (long long)id, sample_index,
                     !s ? "no such request" : s->state == NB_SERVE__FINISHED ? "it finished" : "its step has not run");
  s->tokens[s->num_tokens++] = token;
  s->awaiting_token = false;
  if (s->num_tokens - s->prompt_len >= s->max_tokens) {
    seq_finish(e, s);
    if (finished) *finished = true;
  }
  return NB_OK;
}

nb_status nb_serve_finish(nb_serve_engine *e, int64_t id, int32_t sample_index) {
  nb_serve__seq *s = find_seq(e, id, sample_index, true);
  if (!s)
    return nb_errorf(e->ctx, NB_ERR_NOT_FOUND, "serve: no unfinished request %lld sample %d", (long long)id, sample_index);
  if (s->state == NB_SERVE__WAITING) {
    for (int32_t i = 0; i < e->num_waiting; i++)
      if (e->waiting[i] == s) {
        waiting_remove_at(e, i);
        break;
      }
    seq_free(e, s);
    return NB_OK;
  }
  seq_finish(e, s);
  return NB_OK;
}

bool nb_serve_has_unfinished(const nb_serve_engine *e) {
  if (e->num_waiting > 0) return true;
  for (int32_t i = 0; i < e->num_running; i++)
    if (e->running[i]->state != NB_SERVE__FINISHED) return true;
  return false;
}

/* ---- scheduling --------------------------------------------------------------------- */

/* Publishes the full blocks the last step filled in the prefix cache. */
static void publish_pending(nb_serve_engine *e) {
  int32_t bs = e->cfg.block_size;
  for (int32_t i = 0; i < e->num_pending; i++) {
    struct nb_serve__pending *p = &e->pending[i];
    nb_serve__seq *s = p->seq;
    uint64_t parent = p->index ? s->hashes[p->index - 1] : NB_SERVE__ROOT_HASH;
    nb_serve__pool_register(&e->pool, p->block, s->hashes[p->index], parent, s->tokens + (size_t)p->index * bs);
  }
  e->num_pending = 0;
}

/* Drops finished sequences from the running list (their blocks are gone). */
static void retire_finished(nb_serve_engine *e) {
  int32_t kept = 0;
  for (int32_t i = 0; i < e->num_running; i++) {
    nb_serve__seq *s = e->running[i];
    if (s->state == NB_SERVE__FINISHED) seq_free(e, s);
    else e->running[kept++] = s;
  }
  e->num_running = kept;
}

static int32_t running_slots(const nb_serve_engine *e) {
  int32_t n = 0;
  for (int32_t i = 0; i < e->num_running; i++) n += seq_slots(e->running[i]);
  return n;
}

/* Recompute preemption: the sequence loses its blocks and goes back to the
 * front of the waiting queue; its tokens so far are computed again later. */
static void preempt(nb_serve_engine *e, nb_serve__seq *s) {
  seq_release_blocks(e, s);
  s->awaiting_token = false;
  s->state = NB_SERVE__WAITING;
  for (int32_t i = 0; i < e->num_running; i++)
    if (e->running[i] == s) {
      memmove(e->running + i, e->running + i + 1, (size_t)(e->num_running - i - 1) * sizeof *e->running);
      e->num_running--;
      break;
    }
  /* room was reserved when the request was added (see live_seqs) */
  memmove(e->waiting + 1, e->waiting, (size_t)e->num_waiting * sizeof *e->waiting);
  e->waiting[0] = s;
  e->num_waiting++;
  e->preemptions++;
  e->batch.num_preempted++;
}

/* Blocks the sequence needs to compute `n` more tokens: new blocks past its
 * table, plus a copy of the first one written when it is shared. */
static int32_t blocks_needed(const nb_serve_engine *e, const nb_serve__seq *s, int32_t n) {
  int32_t bs = e->cfg.block_size, c = s->num_computed;
  int32_t need = (c + n + bs - 1) / bs - s->num_table;
  if (c / bs < s->num_table && e->pool.ref[s->table[c / bs]] > 1) need++;
  return need;
}

/* The newest running sequence not in this step's batch. */
static nb_serve__seq *preemption_victim(const nb_serve_engine *e) {
  for (int32_t i = e->num_running - 1; i >= 0; i--)
    if (!e->running[i]->scheduled && e->running[i]->state == NB_SERVE__RUNNING) return e->running[i];
  return NULL;
}

/* Adds n tokens of s to the batch: copy-on-write of a shared first block,
 * new blocks, slots, the block table, and the pending cache entries for the
 * blocks it fills. The blocks must be available. */
static void emit(nb_serve_engine *e, nb_serve__seq *s, int32_t n) {
  nb_serve_batch *b = &e->batch;
  int32_t bs = e->cfg.block_size, c = s->num_computed;
  if (c / bs < s->num_table && e->pool.ref[s->table[c / bs]] > 1) {
    int32_t src = s->table[c / bs], dst = nb_serve__pool_alloc(&e->pool);
    e->b_copies[b->num_copies++] = (nb_serve_block_copy){src, dst};
    nb_serve__pool_decref(&e->pool, src);
    s->table[c / bs] = dst;
  }
  while (s->num_table * bs < c + n) s->table[s->num_table++] = nb_serve__pool_alloc(&e->pool);
  nb_serve_seq_batch *q = &e->b_seqs[b->num_seqs++];
  *q = (nb_serve_seq_batch){.request_id = s->request_id, .sample_index = s->sample_index, .token_start = b->num_tokens,
                            .num_tokens = n, .context_len = c + n, .sampling = &s->sampling, .tokens = s->tokens,
                            .prompt_len = s->prompt_len};
  for (int32_t k = 0; k < n; k++) {
    int32_t pos = c + k, t = b->num_tokens++;
    e->b_tokens[t] = s->tokens[pos];
    e->b_positions[t] = pos;
    e->b_slots[t] = (nb_serve_slot){s->table[pos / bs], pos % bs};
  }
  int32_t *table = e->b_tables + e->b_num_tables;
  memcpy(table, s->table, (size_t)s->num_table * sizeof *table);
  e->b_num_tables += s->num_table;
  q->block_table = table;
  q->num_table_blocks = s->num_table;
  seq_update_hashes(e, s);
  for (int32_t i = c / bs; i < (c + n) / bs; i++)
    e->pending[e->num_pending++] = (struct nb_serve__pending){s, i, s->table[i]};
  s->num_computed = c + n;
  s->scheduled = true;
  q->needs_logits = s->num_computed == s->num_tokens;
  if (!q->needs_logits) return;
  s->awaiting_token = true;
  int32_t *samples = e->b_samples + e->b_num_samples;
  q->sample_indices = samples;
  samples[q->num_samples++] = s->sample_index;
  /* the prompt is complete: the other samples fork off it, sharing every
   * block; whoever writes a shared block first copies it */
  for (int32_t k = 0; k < s->num_forks; k++) {
    nb_serve__seq *f = s->forks[k];
    memcpy(f->hashes, s->hashes, (size_t)s->num_hashes * sizeof *f->hashes);
    f->num_hashes = s->num_hashes;
    for (int32_t i = 0; i < s->num_table; i++) nb_serve__pool_incref(&e->pool, s->table[i]);
    memcpy(f->table, s->table, (size_t)s->num_table * sizeof *f->table);
    f->num_table = s->num_table;
    f->num_computed = s->num_computed;
    f->state = NB_SERVE__RUNNING;
    f->awaiting_token = f->scheduled = true;
    e->running[e->num_running++] = f;
    samples[q->num_samples++] = f->sample_index;
  }
  e->b_num_samples += q->num_samples;
  nb_dealloc(e->ctx, s->forks, (size_t)s->num_forks * sizeof *s->forks);
  s->forks = NULL;
  s->num_forks = 0;
}

/* Schedules up to budget tokens of a running sequence, preempting newer
 * unscheduled sequences (last of all itself) until its blocks fit. Returns
 * the tokens scheduled. */
static int32_t schedule_running(nb_serve_engine *e, nb_serve__seq *s, int32_t budget) {
  int32_t n = s->num_tokens - s->num_computed;
  if (n > budget) n = budget;
  if (n <= 0) return 0;
  while (blocks_needed(e, s, n) > nb_serve__pool_available(&e->pool)) {
    nb_serve__seq *v = preemption_victim(e);
    preempt(e, v);
    if (v == s) return 0;
  }
  emit(e, s, n);
  return n;
}

/* Admits the front waiting sequence when its blocks fit (after reusing its
 * cached prefix); returns the tokens scheduled, or -1 when it must wait. */
static int32_t admit(nb_serve_engine *e, nb_serve__seq *s, int32_t budget) {
  int32_t bs = e->cfg.block_size;
  if (e->cfg.enable_prefix_caching) {
    seq_update_hashes(e, s);
    /* the last token is always computed, to have its logits */
    int32_t max_hit = (s->num_tokens - 1) / bs;
    for (int32_t i = 0; i < max_hit; i++) {
      uint64_t parent = i ? s->hashes[i - 1] : NB_SERVE__ROOT_HASH;
      int32_t blk = nb_serve__pool_lookup(&e->pool, s->hashes[i], parent, s->tokens + (size_t)i * bs);
      if (blk < 0) break;
      nb_serve__pool_incref(&e->pool, blk); /* taken before allocating, so it cannot be evicted */
      s->table[s->num_table++] = blk;
    }
    s->num_computed = s->num_table * bs;
  }
  int32_t n = s->num_tokens - s->num_computed;
  if (n > budget) n = budget;
  if (blocks_needed(e, s, n) > nb_serve__pool_available(&e->pool)) {
    seq_release_blocks(e, s);
    return -1;
  }
  if (e->cfg.enable_prefix_caching) {
    e->queries += s->num_tokens;
    e->hits += s->num_computed;
  }
  s->state = NB_SERVE__RUNNING;
  e->running[e->num_running++] = s;
  emit(e, s, n);
  return n;
}

nb_status nb_serve_schedule(nb_serve_engine *e, const nb_serve_batch **out) {
  publish_pending(e);
  retire_finished(e);
  nb_serve_batch *b = &e->batch;
  *b = (nb_serve_batch){.seqs = e->b_seqs, .token_ids = e->b_tokens, .positions = e->b_positions,
                        .slots = e->b_slots, .copies = e->b_copies};
  e->b_num_tables = e->b_num_samples = 0;
  for (int32_t i = 0; i < e->num_running; i++) e->running[i]->scheduled = false;
  int32_t budget = e->cfg.max_num_batched_tokens;
  /* decodes first, oldest first, so streams keep flowing; then the prompt
   * chunks of running sequences. A preemption removes a newer sequence, so
   * the index stays valid unless the current one goes. */
  for (int pass = 0; pass < 2; pass++)
    for (int32_t i = 0; i < e->num_running && budget > 0; i++) {
      nb_serve__seq *s = e->running[i];
      int32_t todo = s->num_tokens - s->num_computed;
      if (s->scheduled || todo <= 0 || (pass == 0) != (todo == 1)) continue;
      int32_t before = e->num_running;
      budget -= schedule_running(e, s, budget);
      if (e->num_running < before) i = -1; /* preemptions shifted the list: rescan, skipping the scheduled */
    }
  /* then new and preempted sequences, first come first served */
  while (e->num_waiting > 0 && budget > 0) {
    nb_serve__seq *s = e->waiting[0];
    if (running_slots(e) + seq_slots(s) > e->cfg.max_num_seqs) break;
    int32_t n = admit(e, s, budget);
    if (n < 0) break;
    waiting_remove_at(e, 0);
    budget -= n;
  }
  e->steps++;
  trace_blocks(e);
  *out = b;
  return NB_OK;
}

/* ---- counters and checks -------------------------------------------------------------- */

void nb_serve_get_stats(const nb_serve_engine *e, nb_serve_stats *o) {
  *o = (nb_serve_stats){.num_blocks = e->pool.num_blocks,
                        .num_free_blocks = nb_serve__pool_available(&e->pool),
                        .num_cached_blocks = e->pool.num_cached,
                        .bytes_per_block = e->bytes_per_block,
                        .prefix_cache_queries = e->queries,
                        .prefix_cache_hits = e->hits,
                        .num_preemptions = e->preemptions,
                        .num_steps = e->steps};
  for (int32_t i = 0; i < e->num_running; i++) o->num_running += e->running[i]->state == NB_SERVE__RUNNING;
  for (int32_t i = 0; i < e->num_waiting; i++) o->num_waiting += seq_slots(e->waiting[i]);
}

bool nb_serve__engine_check(const nb_serve_engine *e, char *why, size_t cap) {
  const nb_serve__pool *p = &e->pool;
  if (!nb_serve__pool_check(p, why, cap)) return false;
  int32_t bs = e->cfg.block_size;
  int32_t *count = nb_calloc(e->ctx, (size_t)p->num_blocks * sizeof *count);
  if (!count) {
    snprintf(why, cap, "out of memory");
    return false;
  }
  bool ok = true;
  for (int32_t i = 0; i < e->num_running && ok; i++) {
    const nb_serve__seq *s = e->running[i];
    int32_t want = s->state == NB_SERVE__RUNNING ? (s->num_computed + bs - 1) / bs : 0;
    if (s->num_table != want) {
      snprintf(why, cap, "request %lld sample %d: %d blocks for %d computed tokens", (long long)s->request_id,
               s->sample_index, s->num_table, s->num_computed);
      ok = false;
    }
    for (int32_t k = 0; k < s->num_table; k++) count[s->table[k]]++;
  }
  for (int32_t i = 0; i < e->num_waiting && ok; i++)
    if (e->waiting[i]->num_table != 0 || e->waiting[i]->num_computed != 0) {
      snprintf(why, cap, "waiting request %lld holds blocks", (long long)e->waiting[i]->request_id);
      ok = false;
    }
  for (int32_t b = 0; b < p->num_blocks && ok; b++)
    if (count[b] != p->ref[b]) {
      snprintf(why, cap, "block %d: refcount %d, held by %d block tables", b, p->ref[b], count[b]);
      ok = false;
    }
  nb_dealloc(e->ctx, count, (size_t)p->num_blocks * sizeof *count);
  return ok;
}
