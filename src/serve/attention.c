/* Attention over the paged KV cache, and the cache write: the host kernels
 * of a serving step (nabla/serve.h states the layout and the contract).
 *
 * Everything an output row depends on is its query, its position and its
 * sequence's keys and values: rows are computed one by one, keys visited in
 * position order one block at a time (online softmax: a running maximum m,
 * sum l and accumulator acc rescaled by exp(m_old - m_new) when a block
 * raises the maximum), dot products summed in a fixed 8-lane order. The
 * batch, the chunking of a prompt and the thread that runs a task change
 * nothing, which is what batch invariance needs. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "serve/internal.h"

#define Q_TILE 16 /* query rows per task: long prefills split across threads */
#define LANES 8
#define PREFETCH_ROWS 4 /* slot rows of keys asked for ahead of the one in use */

/* ---------------------------------------------------------------- checks */

static nb_status bad(nb_ctx *ctx, const char *fn, const char *what) {
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s", fn, what);
}

/* The shared geometry: positive sizes, a cache addressable with i32 slots. */
static nb_status check_geometry(nb_ctx *ctx, const char *fn, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                int32_t num_blocks) {
  if (num_kv_heads <= 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: num_kv_heads must be positive, got %d", fn, num_kv_heads);
  if (head_dim <= 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: head_dim must be positive, got %d", fn, head_dim);
  if (block_size <= 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: block_size must be positive, got %d", fn, block_size);
  if (num_blocks <= 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: num_blocks must be positive, got %d", fn, num_blocks);
  if ((int64_t)num_blocks * block_size > INT32_MAX)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: num_blocks %d * block_size %d slots exceed the i32 slot range", fn,
                     num_blocks, block_size);
  return NB_OK;
}

static nb_status check_attn(nb_ctx *ctx, const nb_serve_attn *a) {
  const char *fn = "nb_serve_paged_attention";
  if (!a) return bad(ctx, fn, "arguments are required");
  nb_status st = check_geometry(ctx, fn, a->num_kv_heads, a->head_dim, a->block_size, a->num_blocks);
  if (st != NB_OK) return st;
  if (a->num_heads <= 0 || a->num_heads % a->num_kv_heads != 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: num_heads %d must be a positive multiple of num_kv_heads %d", fn,
                     a->num_heads, a->num_kv_heads);
  if (a->num_seqs < 0 || a->num_tokens < 0 || a->max_blocks_per_seq < 0)
    return bad(ctx, fn, "num_seqs, num_tokens and max_blocks_per_seq must not be negative");
  if (!a->out || (a->num_tokens > 0 && !a->q) || !a->k_cache || !a->v_cache || !a->query_start ||
      (a->num_seqs > 0 && (!a->context_lens || (a->max_blocks_per_seq > 0 && !a->block_tables))))
    return bad(ctx, fn, "q, k_cache, v_cache, block_tables, context_lens, query_start and out are required");
  if (!isfinite(a->scale)) return bad(ctx, fn, "scale must be finite");
  if (a->query_start[0] < 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: query_start[0] is %d, below 0", fn, a->query_start[0]);
  for (int32_t i = 0; i < a->num_seqs; i++) {
    int32_t q0 = a->query_start[i], q1 = a->query_start[i + 1], n = q1 - q0, len = a->context_lens[i];
    if (q1 < q0 || q1 > a->num_tokens)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: query_start[%d] = %d must lie in [query_start[%d] = %d, num_tokens = %d]", fn,
                       i + 1, q1, i, q0, a->num_tokens);
    if (len < n)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: sequence %d has %d new tokens but context_lens[%d] = %d", fn, i, n, i, len);
    int64_t nblk = ((int64_t)len + a->block_size - 1) / a->block_size;
    if (nblk > a->max_blocks_per_seq)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: context_lens[%d] = %d needs %lld blocks of %d, but block_tables rows hold %d",
                       fn, i, len, (long long)nblk, a->block_size, a->max_blocks_per_seq);
    const int32_t *row = a->block_tables + (int64_t)i * a->max_blocks_per_seq;
    for (int64_t b = 0; b < nblk; b++)
      if (row[b] < 0 || row[b] >= a->num_blocks)
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: block_tables[%d][%lld] = %d is out of range [0, %d)", fn, i, (long long)b,
                         row[b], a->num_blocks);
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- kernel */

/* A task is one sequence's tile of query rows for a run of its kv heads:
 * all of them unless there are too few tiles to give each thread
 * TASKS_PER_THREAD tasks (one thread: one task; MIN_TASKS in all when the
 * thread count is not known). Runs as long as that allows: a lone decode
 * at two threads is 4 tasks of 3 heads, not 12 of one head, each of which
 * read 256 bytes of every 3 KB slot row (at one thread 129 -> 50-58 us a
 * Llama-134m layer, AMD Zen 4, in the traced decode step). */
#define MIN_TASKS 16
#define TASKS_PER_THREAD 2 /* more than one: a worker that starts late leaves its share to the others */

typedef struct attn_job {
  const nb_serve_attn *a;
  int32_t *task_start;   /* [num_seqs + 1]: first task of each sequence */
  int32_t heads_per_task; /* kv heads of one task; the last run may be shorter */
  int32_t chunks;         /* runs of kv heads per tile */
  float *scratch;         /* per task: m, l [nh], acc [nh * head_dim], scores [nh * block_size] */
  size_t scratch_per_task;
} attn_job;

/* Four floats as one value (GCC/Clang vector extension: SSE on x86-64, NEON
 * on arm64), two of them for eight lanes; unaligned loads through memcpy. */
typedef float v4 __attribute__((vector_size(4 * sizeof(float))));
static inline v4 load4(const float *p) {
  v4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void store4(float *p, v4 v) { memcpy(p, &v, sizeof v); }

/* Lane j sums the products at d = j mod 8 in order; the lanes are added in
 * a fixed tree. */
static float dot(const float *x, const float *y, int32_t n) {
  v4 lo = {0}, hi = {0};
  int32_t d = 0;
  for (; d + LANES <= n; d += LANES) {
    lo += load4(x + d) * load4(y + d);
    hi += load4(x + d + 4) * load4(y + d + 4);
  }
  float lane[LANES];
  store4(lane, lo), store4(lane + 4, hi);
  for (int j = 0; d < n; d++, j++) lane[j] += x[d] * y[d];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* acc[d] += p[0] * v0[d], then + p[1] * v1[d], ... for the n <= 4 keys at
 * v[0..n): each element's chain is acc = acc + p * v in key order, as a
 * scalar loop would compute it, with acc loaded and stored once. */
static void add_scaled(float *acc, const float *p, const float *const *v, int32_t n, int32_t hd) {
  int32_t d = 0;
  if (n == 4) {
    v4 p0 = {p[0], p[0], p[0], p[0]}, p1 = {p[1], p[1], p[1], p[1]}, p2 = {p[2], p[2], p[2], p[2]}, p3 = {p[3], p[3], p[3], p[3]};
    for (; d + 4 <= hd; d += 4) {
      v4 a = load4(acc + d);
      a += p0 * load4(v[0] + d);
      a += p1 * load4(v[1] + d);
      a += p2 * load4(v[2] + d);
      a += p3 * load4(v[3] + d);
      store4(acc + d, a);
    }
  }
  for (; d < hd; d++) {
    float a = acc[d];
    for (int32_t j = 0; j < n; j++) a += p[j] * v[j][d];
    acc[d] = a;
  }
}

/* Asks for the n bytes at p ahead of their use, a cache line at a time: a
 * task's piece of a slot row is too short for the hardware prefetchers to
 * follow from row to row, and a decode's cache comes from memory. */
static inline void prefetch_bytes(const float *p, int64_t n) {
  for (int64_t o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o);
}

/* One query row, the query heads of kv heads [kvh0, kvh0 + nkv): out =
 * softmax(scale q.K[0..pos]) V per head. Each head's numbers are its own
 * chain: keys in position order, a block at a time (the block's maximum
 * rescales what came before), each value added into acc in key order. The
 * heads are visited inside each block: its keys slot row by slot row (a row
 * holds every kv head), then its values head by head, while the block is
 * at hand, instead of the whole context once per head at a stride of a
 * row: the cache is what a batched decode step waits on. */
static void attend_row(const nb_serve_attn *a, const int32_t *table, int32_t kvh0, int32_t nkv, int32_t pos, const float *q,
                       float *out, float *scr) {
  int32_t hd = a->head_dim, bs = a->block_size, group = a->num_heads / a->num_kv_heads, nh = nkv * group;
  int32_t h0 = kvh0 * group; /* first query head */
  int64_t row_stride = (int64_t)a->num_kv_heads * hd; /* floats between consecutive slots */
  float *m = scr, *l = m + nh, *acc = l + nh, *s = acc + (size_t)nh * hd; /* s: [nh][bs] */
  for (int32_t i = 0; i < nh; i++) m[i] = -INFINITY, l[i] = 0.0f;
  memset(acc, 0, sizeof(float) * (size_t)nh * (size_t)hd);
  int64_t piece = (int64_t)nkv * hd * (int64_t)sizeof(float); /* bytes of a slot row this call reads */
  const float *k_first = a->k_cache + ((int64_t)table[0] * bs) * row_stride + (int64_t)kvh0 * hd;
  for (int32_t j = 0; j < PREFETCH_ROWS && j <= pos && j < bs; j++) prefetch_bytes(k_first + j * row_stride, piece);
  for (int32_t first = 0, b = 0; first <= pos; first += bs, b++) {
    int32_t n = pos - first + 1 < bs ? pos - first + 1 : bs;
    const float *kb = a->k_cache + ((int64_t)table[b] * bs) * row_stride + (int64_t)kvh0 * hd;
    const float *vb = a->v_cache + ((int64_t)table[b] * bs) * row_stride + (int64_t)kvh0 * hd;
    int32_t next_n = pos - first - bs + 1 < bs ? pos - first - bs + 1 : bs; /* rows of the next block */
    const float *kn = next_n > 0 ? a->k_cache + ((int64_t)table[b + 1] * bs) * row_stride + (int64_t)kvh0 * hd : NULL;
    for (int32_t j = 0; j < n; j++) {
      /* keys PREFETCH_ROWS rows ahead (into the next block), this row's values */
      if (j + PREFETCH_ROWS < n) prefetch_bytes(kb + (j + PREFETCH_ROWS) * row_stride, piece);
      else if (kn && j + PREFETCH_ROWS - n < next_n) prefetch_bytes(kn + (j + PREFETCH_ROWS - n) * row_stride, piece);
      prefetch_bytes(vb + j * row_stride, piece);
      for (int32_t i = 0; i < nh; i++) s[i * bs + j] = a->scale * dot(q + (int64_t)(h0 + i) * hd, kb + j * row_stride + (i / group) * hd, hd);
    }
    for (int32_t i = 0; i < nh; i++) {
      float *si = s + i * bs, bm = -INFINITY;
      for (int32_t j = 0; j < n; j++) bm = si[j] > bm ? si[j] : bm;
      if (bm > m[i]) { /* scale what came before to the new maximum, with the first key */
        float alpha = expf(m[i] - bm);
        l[i] *= alpha, m[i] = bm;
        for (int32_t d = 0; d < hd; d++) acc[(size_t)i * hd + d] *= alpha;
      }
      for (int32_t j = 0; j < n; j++) {
        si[j] = expf(si[j] - m[i]);
        l[i] += si[j];
      }
    }
    /* the values slot row by slot row, like the keys: one pass along the
     * block (each head walking its 256 bytes of every 3 KB row left the
     * loads waiting on memory) */
    for (int32_t j = 0; j < n; j += 4) {
      int32_t k = n - j < 4 ? n - j : 4;
      for (int32_t i = 0; i < nh; i++) {
        const float *v[4];
        for (int32_t u = 0; u < k; u++) v[u] = vb + (j + u) * row_stride + (i / group) * hd;
        add_scaled(acc + (size_t)i * hd, s + i * bs + j, v, k, hd);
      }
    }
  }
  for (int32_t i = 0; i < nh; i++) {
    float inv = 1.0f / l[i];
    for (int32_t d = 0; d < hd; d++) out[(int64_t)(h0 + i) * hd + d] = acc[(size_t)i * hd + d] * inv;
  }
}

static void attn_task(void *arg, int t) {
  const attn_job *job = arg;
  const nb_serve_attn *a = job->a;
  int32_t lo = 0, hi = a->num_seqs; /* the sequence whose tasks hold t */
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if (job->task_start[mid] <= t) lo = mid; else hi = mid;
  }
  int32_t seq = lo, k = t - job->task_start[seq];
  int32_t q0 = a->query_start[seq], n = a->query_start[seq + 1] - q0;
  int32_t tile = k / job->chunks, kvh0 = k % job->chunks * job->heads_per_task;
  int32_t nkv = a->num_kv_heads - kvh0 < job->heads_per_task ? a->num_kv_heads - kvh0 : job->heads_per_task;
  const int32_t *table = a->block_tables + (int64_t)seq * a->max_blocks_per_seq;
  float *scr = job->scratch + (size_t)t * job->scratch_per_task;
  int32_t r_end = (tile + 1) * Q_TILE < n ? (tile + 1) * Q_TILE : n;
  /* One row (a decode): all the task's heads at once, the cache read once.
   * Several (a prefill tile): one kv head at a time for all rows, so that
   * they find its keys and values in L2 (all heads of a long context would
   * not fit). The same numbers either way. */
  int32_t step = r_end - tile * Q_TILE == 1 ? nkv : 1;
  for (int32_t h = kvh0; h < kvh0 + nkv; h += step)
    for (int32_t r = tile * Q_TILE; r < r_end; r++) {
      int32_t pos = a->context_lens[seq] - n + r;
      int64_t off = (int64_t)(q0 + r) * a->num_heads * a->head_dim;
      attend_row(a, table, h, step, pos, a->q + off, a->out + off, scr);
    }
}

nb_status nb_serve_paged_attention(nb_ctx *ctx, const nb_serve_attn *a, nb_serve_parallel_fn par, void *runner) {
  nb_status st = check_attn(ctx, a);
  if (st != NB_OK) return st;
  int64_t row = (int64_t)a->num_heads * a->head_dim;
  /* padding rows (outside every sequence) are zero */
  int32_t qs0 = a->num_seqs > 0 ? a->query_start[0] : a->num_tokens, qs1 = a->num_seqs > 0 ? a->query_start[a->num_seqs] : a->num_tokens;
  memset(a->out, 0, sizeof(float) * (size_t)(qs0 * row));
  memset(a->out + qs1 * row, 0, sizeof(float) * (size_t)((a->num_tokens - qs1) * row));
  if (a->num_seqs == 0) return NB_OK;

  int64_t tiles = 0;
  for (int32_t i = 0; i < a->num_seqs; i++) tiles += (a->query_start[i + 1] - a->query_start[i] + Q_TILE - 1) / Q_TILE;
  int64_t want = a->threads == 1 ? 1 : a->threads > 0 ? (int64_t)a->threads * TASKS_PER_THREAD : MIN_TASKS;
  int32_t kvh = a->num_kv_heads, per = tiles >= want ? kvh : (int32_t)((kvh * tiles + want - 1) / want);
  per = per < 1 ? 1 : per;
  attn_job job = {.a = a, .heads_per_task = per, .chunks = (kvh + per - 1) / per};
  if (tiles * job.chunks > INT32_MAX / 2) return bad(ctx, "nb_serve_paged_attention", "too many tasks (sequences x query tiles x head runs)");
  size_t ts_bytes = sizeof(int32_t) * ((size_t)a->num_seqs + 1);
  job.task_start = nb_alloc(ctx, ts_bytes);
  if (!job.task_start) return NB_ERR_NOMEM;
  int32_t ntasks = 0;
  for (int32_t i = 0; i < a->num_seqs; i++) {
    job.task_start[i] = ntasks;
    ntasks += job.chunks * ((a->query_start[i + 1] - a->query_start[i] + Q_TILE - 1) / Q_TILE);
  }
  job.task_start[a->num_seqs] = ntasks;
  size_t nh = (size_t)per * (size_t)(a->num_heads / a->num_kv_heads);
  job.scratch_per_task = nh * (2 + (size_t)a->head_dim + (size_t)a->block_size);
  size_t scratch_bytes = sizeof(float) * job.scratch_per_task * (size_t)(ntasks > 0 ? ntasks : 1);
  job.scratch = nb_alloc(ctx, scratch_bytes);
  if (!job.scratch) {
    nb_dealloc(ctx, job.task_start, ts_bytes);
    return NB_ERR_NOMEM;
  }
  if (par) {
    par(runner, ntasks, attn_task, &job);
  } else {
    for (int t = 0; t < ntasks; t++) attn_task(&job, t);
  }
  nb_dealloc(ctx, job.scratch, scratch_bytes);
  nb_dealloc(ctx, job.task_start, ts_bytes);
  return NB_OK;
}

/* ---------------------------------------------------------------- cache write */

nb_status nb_serve_kv_cache_write(nb_ctx *ctx, const nb_serve_kv_write *w) {
  const char *fn = "nb_serve_kv_cache_write";
  if (!w) return bad(ctx, fn, "arguments are required");
  nb_status st = check_geometry(ctx, fn, w->num_kv_heads, w->head_dim, w->block_size, w->num_blocks);
  if (st != NB_OK) return st;
  if (w->num_tokens < 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: num_tokens is %d, below 0", fn, w->num_tokens);
  if (w->num_tokens > 0 && (!w->k || !w->v || !w->slot_mapping || !w->k_cache || !w->v_cache))
    return bad(ctx, fn, "k, v, slot_mapping, k_cache and v_cache are required");
  int32_t slots = w->num_blocks * w->block_size;
  for (int32_t t = 0; t < w->num_tokens; t++)
    if (w->slot_mapping[t] < -1 || w->slot_mapping[t] >= slots)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: slot_mapping[%d] = %d is out of range [0, %d) (or -1 for padding)", fn, t,
                       w->slot_mapping[t], slots);
  size_t row = (size_t)w->num_kv_heads * (size_t)w->head_dim;
  for (int32_t t = 0; t < w->num_tokens; t++) {
    if (w->slot_mapping[t] < 0) continue;
    memcpy(w->k_cache + (size_t)w->slot_mapping[t] * row, w->k + (size_t)t * row, sizeof(float) * row);
    memcpy(w->v_cache + (size_t)w->slot_mapping[t] * row, w->v + (size_t)t * row, sizeof(float) * row);
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- a batch's operands */

nb_status nb_serve_batch_operands(nb_ctx *ctx, const nb_serve_batch *b, int32_t block_size, int32_t max_blocks,
                                  int32_t *block_tables, int32_t *context_lens, int32_t *query_start,
                                  int32_t *slot_mapping) {
  const char *fn = "nb_serve_batch_operands";
  if (!b || block_size <= 0 || max_blocks < 0) return bad(ctx, fn, "a batch, a positive block_size and max_blocks >= 0 are required");
  if ((b->num_seqs > 0 && (!context_lens || (max_blocks > 0 && !block_tables))) || !query_start ||
      (b->num_tokens > 0 && !slot_mapping))
    return bad(ctx, fn, "block_tables, context_lens, query_start and slot_mapping are required");
  int32_t next = 0;
  for (int32_t i = 0; i < b->num_seqs; i++) {
    const nb_serve_seq_batch *s = &b->seqs[i];
    if (s->token_start != next || s->num_tokens < 0 || s->token_start + s->num_tokens > b->num_tokens)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: sequence %d's tokens [%d, %d) do not follow the previous ones (at %d) within %d",
                       fn, i, s->token_start, s->token_start + s->num_tokens, next, b->num_tokens);
    if (s->num_table_blocks > max_blocks)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: sequence %d's table has %d blocks, rows hold max_blocks = %d", fn, i,
                       s->num_table_blocks, max_blocks);
    next += s->num_tokens;
  }
  for (int32_t i = 0; i < b->num_seqs; i++) {
    const nb_serve_seq_batch *s = &b->seqs[i];
    int32_t *row = block_tables + (int64_t)i * max_blocks;
    for (int32_t k = 0; k < max_blocks; k++) row[k] = k < s->num_table_blocks ? s->block_table[k] : 0;
    context_lens[i] = s->context_len;
    query_start[i] = s->token_start;
  }
  query_start[b->num_seqs] = next;
  for (int32_t t = 0; t < b->num_tokens; t++)
    slot_mapping[t] = t < next ? b->slots[t].block * block_size + b->slots[t].offset : -1;
  return NB_OK;
}
