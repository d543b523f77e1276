/* Attention over the paged KV cache against dense causal attention run by
 * the reference interpreter on the gathered keys and values: random block
 * layouts (shuffled block ids, partial last blocks with garbage past the
 * context, sequences of different lengths, prefill chunks after a cached
 * prefix, pure decodes, grouped-query heads, padding rows). Then the
 * invariances, bit for bit: a sequence alone or in a batch, any task order,
 * a prompt in one chunk or several. The cache write, the errors, and both
 * as custom calls in a traced step; steps planned by the engine, end to end. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/compile.h"
#include "nabla/serve.h"
#include "test.h"

/* ---------------------------------------------------------------- a layout */

typedef struct layout {
  int32_t num_seqs, num_tokens, num_heads, num_kv_heads, head_dim, block_size, num_blocks, max_blocks;
  int32_t ctx_len[8], new_tokens[8];
  int32_t *tables, *query_start, *context_lens;
  float *q, *k_cache, *v_cache, *out;
} layout;

static float *randn(nb_test_rng *r, int64_t n) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = (float)nb_test_normal(r);
  return x;
}

/* Sequences of the given context lengths and new tokens, each on blocks
 * drawn from a shuffled permutation of the cache (so no two share one), the
 * whole cache (unused slots included) random, `pad` padding rows at the end. */
static void layout_make(layout *L, nb_test_rng *r, int32_t pad) {
  int64_t hd = L->head_dim, row = (int64_t)L->num_kv_heads * hd;
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)L->num_blocks);
  for (int32_t i = 0; i < L->num_blocks; i++) perm[i] = i;
  for (int32_t i = L->num_blocks - 1; i > 0; i--) {
    int32_t j = (int32_t)nb_test_int(r, 0, i), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  L->max_blocks = 1;
  for (int32_t s = 0; s < L->num_seqs; s++) {
    int32_t nb = (L->ctx_len[s] + L->block_size - 1) / L->block_size;
    if (nb > L->max_blocks) L->max_blocks = nb;
  }
  L->tables = malloc(sizeof(int32_t) * (size_t)(L->num_seqs * L->max_blocks + 1));
  L->query_start = malloc(sizeof(int32_t) * (size_t)(L->num_seqs + 1));
  L->context_lens = malloc(sizeof(int32_t) * (size_t)(L->num_seqs + 1));
  int32_t used = 0, t = 0;
  for (int32_t s = 0; s < L->num_seqs; s++) {
    int32_t nb = (L->ctx_len[s] + L->block_size - 1) / L->block_size;
    for (int32_t b = 0; b < L->max_blocks; b++) L->tables[s * L->max_blocks + b] = b < nb ? perm[used++] : -7; /* unread */
    CHECK(used <= L->num_blocks);
    L->query_start[s] = t;
    L->context_lens[s] = L->ctx_len[s];
    t += L->new_tokens[s];
  }
  L->query_start[L->num_seqs] = t;
  L->num_tokens = t + pad;
  L->q = randn(r, (int64_t)L->num_tokens * L->num_heads * hd);
  L->k_cache = randn(r, (int64_t)L->num_blocks * L->block_size * row);
  L->v_cache = randn(r, (int64_t)L->num_blocks * L->block_size * row);
  L->out = malloc(sizeof(float) * (size_t)(L->num_tokens * L->num_heads * hd));
  for (int64_t i = 0; i < (int64_t)L->num_tokens * L->num_heads * hd; i++) L->out[i] = NAN;
  free(perm);
}

static void layout_free(layout *L) {
  free(L->tables), free(L->query_start), free(L->context_lens);
  free(L->q), free(L->k_cache), free(L->v_cache), free(L->out);
}

static nb_serve_attn attn_of(const layout *L) {
  return (nb_serve_attn){.num_seqs = L->num_seqs, .num_tokens = L->num_tokens, .num_heads = L->num_heads,
                         .num_kv_heads = L->num_kv_heads, .head_dim = L->head_dim, .block_size = L->block_size,
                         .num_blocks = L->num_blocks, .max_blocks_per_seq = L->max_blocks, .q = L->q,
                         .k_cache = L->k_cache, .v_cache = L->v_cache, .block_tables = L->tables,
                         .context_lens = L->context_lens, .query_start = L->query_start,
                         .scale = 1.0f / sqrtf((float)L->head_dim), .out = L->out};
}

/* ---------------------------------------------------------------- the reference */

/* Dense causal attention of n queries [n, H, D] at positions ctx-n..ctx-1
 * over keys and values [ctx, KVH, D], traced and run by the interpreter. */
static nb_array *dense_reference(nb_ctx *ctx, const layout *L, int32_t seq, float scale) {
  int64_t n = L->new_tokens[seq], len = L->ctx_len[seq], H = L->num_heads, KVH = L->num_kv_heads, D = L->head_dim, G = H / KVH;
  int64_t row = KVH * D;
  float *k = malloc(sizeof(float) * (size_t)(len * row)), *v = malloc(sizeof(float) * (size_t)(len * row));
  for (int64_t p = 0; p < len; p++) { /* gather through the block table */
    int64_t slot = (int64_t)L->tables[seq * L->max_blocks + p / L->block_size] * L->block_size + p % L->block_size;
    memcpy(k + p * row, L->k_cache + slot * row, sizeof(float) * (size_t)row);
    memcpy(v + p * row, L->v_cache + slot * row, sizeof(float) * (size_t)row);
  }
  nb_graph *g = nb_graph_create(ctx);
  int64_t qd[3] = {n, H, D}, kd[3] = {len, KVH, D}, q4[4] = {n, KVH, G, D}, sd[4] = {KVH, n, G, len}, nd[2] = {n, len};
  nb_val *q = nb_reshape(nb_graph_input(g, "q", nb_aval_make(NB_F32, 3, qd)), 4, q4);
  nb_val *kk = nb_graph_input(g, "k", nb_aval_make(NB_F32, 3, kd));
  nb_val *vv = nb_graph_input(g, "v", nb_aval_make(NB_F32, 3, kd));
  nb_dot_dims qk = {.n_contract = 1, .n_batch = 1, .lhs_contract = {3}, .rhs_contract = {2}, .lhs_batch = {1}, .rhs_batch = {1}};
  nb_val *s = nb_mul(nb_dot_general(q, kk, &qk, NB_F32), nb_scalar(g, NB_F32, scale)); /* [KVH, n, G, len] */
  nb_val *qpos = nb_add(nb_iota(g, NB_I32, 2, nd, 0), nb_scalar(g, NB_I32, (double)(len - n)));
  nb_val *allowed = nb_le(nb_iota(g, NB_I32, 2, nd, 1), qpos);
  int bd[2] = {1, 3};
  s = nb_select(nb_broadcast_in_dim(allowed, 4, sd, bd), s, nb_full(g, NB_F32, 4, sd, -INFINITY));
  int ax = 3;
  nb_val *e = nb_exp(nb_sub(s, nb_expand_dims(nb_reduce_max(s, 1, &ax), 3)));
  nb_val *p = nb_div(e, nb_expand_dims(nb_reduce_sum(e, 1, &ax), 3));
  nb_dot_dims pv = {.n_contract = 1, .n_batch = 1, .lhs_contract = {3}, .rhs_contract = {0}, .lhs_batch = {0}, .rhs_batch = {1}};
  int perm[4] = {1, 0, 2, 3};
  nb_val *o = nb_reshape(nb_transpose(nb_dot_general(p, vv, &pv, NB_F32), perm), 3, qd);
  CHECK_OK(ctx, nb_graph_output(g, "out", o));
  nb_array *in[3] = {nb_array_create(ctx, NB_F32, 3, qd, L->q + (int64_t)L->query_start[seq] * H * D),
                     nb_array_create(ctx, NB_F32, 3, kd, k), nb_array_create(ctx, NB_F32, 3, kd, v)};
  nb_array *out = NULL;
  CHECK_OK(ctx, nb_graph_run_flat(ctx, g, in, &out));
  for (int i = 0; i < 3; i++) nb_array_release(in[i]);
  nb_graph_destroy(g);
  free(k), free(v);
  return out;
}

static void check_against_reference(nb_ctx *ctx, const layout *L, int32_t pad, double tol) {
  int64_t row = (int64_t)L->num_heads * L->head_dim;
  double worst = 0;
  for (int32_t s = 0; s < L->num_seqs; s++) {
    if (L->new_tokens[s] == 0) continue;
    nb_array *ref = dense_reference(ctx, L, s, 1.0f / sqrtf((float)L->head_dim));
    if (!ref) return;
    const float *r = nb_array_data(ref), *o = L->out + (int64_t)L->query_start[s] * row;
    for (int64_t i = 0; i < L->new_tokens[s] * row; i++) {
      double err = fabs((double)o[i] - r[i]) / (1 + fabs(r[i]));
      if (!(err <= worst)) worst = isnan(worst) ? worst : err; /* a NaN sticks */
    }
    nb_array_release(ref);
  }
  CHECK_MSG(!isnan(worst) && worst <= tol, "worst relative error %g", worst);
  for (int64_t i = (int64_t)(L->num_tokens - pad) * row; i < (int64_t)L->num_tokens * row; i++)
    CHECK_MSG(L->out[i] == 0.0f, "padding row element %lld is %g", (long long)i, L->out[i]);
}

/* ---------------------------------------------------------------- tests */

static void test_random_layouts(nb_ctx *ctx) {
  nb_test_rng r = {0x5eed};
  const int32_t heads[][2] = {{4, 4}, {4, 2}, {6, 1}, {8, 2}};
  const int32_t dims[] = {8, 13, 64}, block_sizes[] = {1, 4, 16, 5};
  for (int trial = 0; trial < 24; trial++) {
    layout L = {.num_heads = heads[trial % 4][0], .num_kv_heads = heads[trial % 4][1], .head_dim = dims[trial % 3],
                .block_size = block_sizes[(trial / 3) % 4], .num_seqs = (int32_t)nb_test_int(&r, 1, 6)};
    int32_t blocks = 0;
    for (int32_t s = 0; s < L.num_seqs; s++) {
      int32_t len = (int32_t)nb_test_int(&r, 1, 70), kind = (int32_t)nb_test_int(&r, 0, 3);
      L.ctx_len[s] = len;
      /* a decode, a chunk after a cached prefix, a whole prompt, or nothing new */
      L.new_tokens[s] = kind == 0 ? 1 : kind == 1 ? (int32_t)nb_test_int(&r, 1, len) : kind == 2 ? len : 0;
      blocks += (len + L.block_size - 1) / L.block_size;
    }
    L.num_blocks = blocks + (int32_t)nb_test_int(&r, 0, 5);
    int32_t pad = (int32_t)nb_test_int(&r, 0, 3);
    layout_make(&L, &r, pad);
    nb_serve_attn a = attn_of(&L);
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));
    check_against_reference(ctx, &L, pad, 2e-6);
    layout_free(&L);
  }
}

/* Scores hundreds apart across blocks: exp overflows f32 unless the running
 * maximum is subtracted and the sums rescaled when it grows. */
static void test_large_scores(nb_ctx *ctx) {
  nb_test_rng r = {99};
  layout L = {.num_heads = 2, .num_kv_heads = 1, .head_dim = 16, .block_size = 4, .num_seqs = 2, .ctx_len = {30, 9},
              .new_tokens = {30, 1}, .num_blocks = 11};
  layout_make(&L, &r, 0);
  for (int64_t i = 0; i < (int64_t)L.num_tokens * L.num_heads * L.head_dim; i++) L.q[i] *= 200.0f;
  nb_serve_attn a = attn_of(&L);
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));
  check_against_reference(ctx, &L, 0, 1e-4);
  layout_free(&L);
}

/* Runners: tasks backwards, and odd tasks before even ones. */
static void run_backwards(void *runner, int n, void (*task)(void *, int), void *arg) {
  (void)runner;
  for (int i = n - 1; i >= 0; i--) task(arg, i);
}
static void run_interleaved(void *runner, int n, void (*task)(void *, int), void *arg) {
  (void)runner;
  for (int i = 1; i < n; i += 2) task(arg, i);
  for (int i = 0; i < n; i += 2) task(arg, i);
}

/* Three threads claiming tasks from a shared counter. */
typedef struct claim {
  atomic_int next;
  int n;
  void (*task)(void *, int);
  void *arg;
} claim;
static void *claim_loop(void *p) {
  claim *c = p;
  for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n;) c->task(c->arg, i);
  return NULL;
}
static void run_threads(void *runner, int n, void (*task)(void *, int), void *arg) {
  (void)runner;
  claim c = {.n = n, .task = task, .arg = arg};
  atomic_init(&c.next, 0);
  pthread_t t[2];
  int started = 0;
  for (; started < 2; started++)
    if (pthread_create(&t[started], NULL, claim_loop, &c) != 0) break;
  claim_loop(&c);
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
}

static void run_threads_counted(void *runner, int n, void (*task)(void *, int), void *arg) {
  ++*(int *)runner;
  run_threads(NULL, n, task, arg);
}

/* One sequence's rows, computed alone, equal its rows in a batch with
 * others, at any task order and on several threads: bit for bit. */
static void test_batch_invariance(nb_ctx *ctx) {
  nb_test_rng r = {42};
  layout L = {.num_heads = 8, .num_kv_heads = 2, .head_dim = 32, .block_size = 16, .num_seqs = 5,
              .ctx_len = {37, 1, 100, 64, 17}, .new_tokens = {1, 1, 40, 64, 3}, .num_blocks = 20};
  layout_make(&L, &r, 2);
  nb_serve_attn batch = attn_of(&L);
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &batch, NULL, NULL));
  int64_t row = (int64_t)L.num_heads * L.head_dim;
  float *other = malloc(sizeof(float) * (size_t)(L.num_tokens * row));
  nb_serve_parallel_fn runners[3] = {run_backwards, run_interleaved, run_threads};
  for (int k = 0; k < 3; k++) {
    batch.out = other;
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &batch, runners[k], NULL));
    CHECK(memcmp(other, L.out, sizeof(float) * (size_t)(L.num_tokens * row)) == 0);
  }
  for (int32_t s = 0; s < L.num_seqs; s++) { /* alone: its own q rows, table row, length */
    int32_t qs[2] = {0, L.new_tokens[s]};
    nb_serve_attn alone = batch;
    alone.num_seqs = 1, alone.num_tokens = L.new_tokens[s];
    alone.q = L.q + (int64_t)L.query_start[s] * row;
    alone.block_tables = L.tables + s * L.max_blocks;
    alone.context_lens = L.context_lens + s;
    alone.query_start = qs;
    alone.out = other;
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &alone, NULL, NULL));
    CHECK_MSG(memcmp(other, L.out + (int64_t)L.query_start[s] * row, sizeof(float) * (size_t)(L.new_tokens[s] * row)) == 0,
              "sequence %d differs alone and in the batch", s);
  }
  free(other);
  layout_free(&L);
}

/* The threads hint cuts a lone decode's 10 kv heads into runs of 1 to 10
 * heads: the same rows, bit for bit, whatever the cut. */
static void test_task_cuts(nb_ctx *ctx) {
  nb_test_rng r = {7};
  layout L = {.num_heads = 20, .num_kv_heads = 10, .head_dim = 22, .block_size = 4, .num_seqs = 1,
              .ctx_len = {53}, .new_tokens = {1}, .num_blocks = 16};
  layout_make(&L, &r, 0);
  nb_serve_attn a = attn_of(&L);
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));
  int64_t n = (int64_t)L.num_tokens * L.num_heads * L.head_dim;
  float *other = malloc(sizeof(float) * (size_t)n);
  int32_t hints[6] = {1, 2, 3, 5, 8, 64};
  for (int k = 0; k < 6; k++) {
    memset(other, 0xff, sizeof(float) * (size_t)n);
    a.out = other, a.threads = hints[k];
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, run_threads, NULL));
    CHECK_MSG(memcmp(other, L.out, sizeof(float) * (size_t)n) == 0, "threads hint %d changes the rows", hints[k]);
  }
  free(other);
  layout_free(&L);
}

/* A prompt of 45 tokens in one step, in chunks of 20 + 24 + 1, and its last
 * token as a decode after a cached prefix: the same rows, bit for bit. */
static void test_chunk_invariance(nb_ctx *ctx) {
  nb_test_rng r = {7};
  layout L = {.num_heads = 4, .num_kv_heads = 1, .head_dim = 24, .block_size = 8, .num_seqs = 1, .ctx_len = {45},
              .new_tokens = {45}, .num_blocks = 9};
  layout_make(&L, &r, 0);
  nb_serve_attn whole = attn_of(&L);
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &whole, NULL, NULL));
  int64_t row = (int64_t)L.num_heads * L.head_dim;
  float *chunk_out = malloc(sizeof(float) * (size_t)(45 * row));
  const int32_t chunks[] = {20, 24, 1};
  for (int32_t c = 0, done = 0; c < 3; done += chunks[c], c++) {
    int32_t qs[2] = {0, chunks[c]}, len = done + chunks[c];
    nb_serve_attn a = whole;
    a.num_tokens = chunks[c], a.q = L.q + done * row, a.out = chunk_out + done * row;
    a.context_lens = &len, a.query_start = qs;
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));
  }
  CHECK(memcmp(chunk_out, L.out, sizeof(float) * (size_t)(45 * row)) == 0);
  free(chunk_out);
  layout_free(&L);
}

/* The write puts each token's row at its slot, skips -1, and the attention
 * then reads them: a decode over a cache written token by token. */
static void test_cache_write(nb_ctx *ctx) {
  enum { KVH = 2, D = 4, BS = 4, NB = 3, T = 5 };
  float k[T][KVH * D], v[T][KVH * D], kc[NB * BS][KVH * D], vc[NB * BS][KVH * D];
  for (int t = 0; t < T; t++)
    for (int j = 0; j < KVH * D; j++) k[t][j] = (float)(t * 100 + j), v[t][j] = -(float)(t * 100 + j);
  memset(kc, 0, sizeof kc), memset(vc, 0, sizeof vc);
  int32_t slots[T] = {2 * BS + 0, 2 * BS + 1, -1, 0 * BS + 3, 11};
  nb_serve_kv_write w = {.num_tokens = T, .num_kv_heads = KVH, .head_dim = D, .block_size = BS, .num_blocks = NB,
                         .k = &k[0][0], .v = &v[0][0], .slot_mapping = slots, .k_cache = &kc[0][0], .v_cache = &vc[0][0]};
  CHECK_OK(ctx, nb_serve_kv_cache_write(ctx, &w));
  for (int t = 0; t < T; t++)
    if (slots[t] >= 0) CHECK(memcmp(kc[slots[t]], k[t], sizeof k[t]) == 0 && memcmp(vc[slots[t]], v[t], sizeof v[t]) == 0);
  int written = 0;
  for (int s = 0; s < NB * BS; s++)
    for (int j = 0; j < KVH * D; j++) written += kc[s][j] != 0.0f;
  CHECK(written == 4 * KVH * D - 1); /* four rows, one of which holds a 0 (token 0, j 0) */

  int32_t bad_slots[T] = {0, 1, 2, 12, 3};
  w.slot_mapping = bad_slots;
  CHECK(nb_serve_kv_cache_write(ctx, &w) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "slot_mapping[3] = 12 is out of range [0, 12)");
  CHECK(kc[0][1] == 0.0f); /* nothing written */
  w.slot_mapping = slots, w.head_dim = 0;
  CHECK(nb_serve_kv_cache_write(ctx, &w) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "head_dim must be positive");
}

static void test_errors(nb_ctx *ctx) {
  nb_test_rng r = {3};
  layout L = {.num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .num_seqs = 2, .ctx_len = {6, 3},
              .new_tokens = {2, 1}, .num_blocks = 4};
  layout_make(&L, &r, 0);
  nb_serve_attn good = attn_of(&L), a;
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &good, NULL, NULL));
  for (int i = 0; i < L.num_tokens * 32; i++) L.out[i] = 1.5f;

  a = good, a.num_heads = 3;
  CHECK(nb_serve_paged_attention(ctx, &a, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "num_heads 3 must be a positive multiple of num_kv_heads 2");
  int32_t saved = L.tables[1];
  L.tables[1] = 4;
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "block_tables[0][1] = 4 is out of range [0, 4)");
  L.tables[1] = -1;
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "block_tables[0][1] = -1");
  L.tables[1] = saved;
  L.context_lens[1] = 9; /* 3 blocks, rows hold 2 */
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "context_lens[1] = 9 needs 3 blocks of 4, but block_tables rows hold 2");
  L.context_lens[1] = 0;
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "sequence 1 has 1 new tokens but context_lens[1] = 0");
  L.context_lens[1] = 3;
  L.query_start[1] = 3, L.query_start[2] = 2; /* decreasing */
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "query_start[2] = 2 must lie in [query_start[1] = 3, num_tokens = 3]");
  L.query_start[1] = 2, L.query_start[2] = 4;
  CHECK(nb_serve_paged_attention(ctx, &good, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "query_start[2] = 4 must lie in [query_start[1] = 2, num_tokens = 3]");
  L.query_start[2] = 3;
  a = good, a.k_cache = NULL;
  CHECK(nb_serve_paged_attention(ctx, &a, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "are required");
  a = good, a.num_blocks = 1 << 30;
  CHECK(nb_serve_paged_attention(ctx, &a, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "exceed the i32 slot range");
  for (int i = 0; i < L.num_tokens * 32; i++) CHECK(L.out[i] == 1.5f); /* refused calls wrote nothing */
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &good, NULL, NULL));
  layout_free(&L);
}

/* ---------------------------------------------------------------- custom calls */

/* The step's graph for layout L's shapes: the custom calls are those
 * registered on ctx. */
static nb_graph *step_graph(nb_ctx *ctx, const layout *L, float scale) {
  int32_t T = L->num_tokens, KVH = L->num_kv_heads, D = L->head_dim, S = L->num_seqs;
  int64_t qd[3] = {T, L->num_heads, D}, cd[4] = {L->num_blocks, L->block_size, KVH, D}, kd[3] = {T, KVH, D};
  int64_t bd[2] = {S, L->max_blocks}, sd[1] = {S}, s1[1] = {S + 1}, td[1] = {T};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *q = nb_graph_input(g, "q", nb_aval_make(NB_F32, 3, qd));
  nb_val *kc = nb_graph_input(g, "k_cache", nb_aval_make(NB_F32, 4, cd));
  nb_val *vc = nb_graph_input(g, "v_cache", nb_aval_make(NB_F32, 4, cd));
  nb_val *kk = nb_graph_input(g, "k", nb_aval_make(NB_F32, 3, kd));
  nb_val *vv = nb_graph_input(g, "v", nb_aval_make(NB_F32, 3, kd));
  nb_val *bt = nb_graph_input(g, "block_tables", nb_aval_make(NB_I32, 2, bd));
  nb_val *cl = nb_graph_input(g, "context_lens", nb_aval_make(NB_I32, 1, sd));
  nb_val *qs = nb_graph_input(g, "query_start", nb_aval_make(NB_I32, 1, s1));
  nb_val *sm = nb_graph_input(g, "slot_mapping", nb_aval_make(NB_I32, 1, td));
  nb_val *kc2, *vc2;
  CHECK_OK(ctx, nb_serve_kv_cache_write_op(kc, vc, kk, vv, sm, &kc2, &vc2));
  CHECK_OK(ctx, nb_graph_output(g, "out", nb_serve_paged_attention_op(q, kc2, vc2, bt, cl, qs, scale)));
  CHECK_OK(ctx, nb_graph_output(g, "k_cache", kc2));
  CHECK_OK(ctx, nb_graph_output(g, "v_cache", vc2));
  CHECK_OK(ctx, nb_graph_verify(g));
  return g;
}

/* A traced step, as the model will run it: write the new tokens' keys and
 * values at their slots, then attend. Run by the interpreter (with or
 * without a lent pool) and compiled, it equals the kernels called directly,
 * bit for bit. */
static void test_traced_step(nb_ctx *ctx) {
  nb_test_rng r = {11};
  layout L = {.num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .num_seqs = 3, .ctx_len = {9, 5, 12},
              .new_tokens = {1, 5, 4}, .num_blocks = 10};
  layout_make(&L, &r, 1);
  int32_t T = L.num_tokens, KVH = L.num_kv_heads, D = L.head_dim, S = L.num_seqs;
  float *k = randn(&r, (int64_t)T * KVH * D), *v = randn(&r, (int64_t)T * KVH * D);
  int32_t *slots = malloc(sizeof(int32_t) * (size_t)T);
  for (int32_t s = 0, t = 0; s < S; s++)
    for (int32_t j = 0; j < L.new_tokens[s]; j++, t++) {
      int32_t pos = L.ctx_len[s] - L.new_tokens[s] + j;
      slots[t] = L.tables[s * L.max_blocks + pos / L.block_size] * L.block_size + pos % L.block_size;
    }
  slots[T - 1] = -1; /* the padding row */

  int64_t qd[3] = {T, L.num_heads, D}, cd[4] = {L.num_blocks, L.block_size, KVH, D}, kd[3] = {T, KVH, D};
  int64_t bd[2] = {S, L.max_blocks}, sd[1] = {S}, s1[1] = {S + 1}, td[1] = {T};
  float scale = 1.0f / sqrtf((float)D);
  nb_graph *g = step_graph(ctx, &L, scale);

  nb_array *in[9] = {nb_array_create(ctx, NB_F32, 3, qd, L.q), nb_array_create(ctx, NB_F32, 4, cd, L.k_cache),
                     nb_array_create(ctx, NB_F32, 4, cd, L.v_cache), nb_array_create(ctx, NB_F32, 3, kd, k),
                     nb_array_create(ctx, NB_F32, 3, kd, v), nb_array_create(ctx, NB_I32, 2, bd, L.tables),
                     nb_array_create(ctx, NB_I32, 1, sd, L.context_lens), nb_array_create(ctx, NB_I32, 1, s1, L.query_start),
                     nb_array_create(ctx, NB_I32, 1, td, slots)};
  /* the same step by direct calls */
  nb_serve_kv_write w = {.num_tokens = T, .num_kv_heads = KVH, .head_dim = D, .block_size = L.block_size,
                         .num_blocks = L.num_blocks, .k = k, .v = v, .slot_mapping = slots, .k_cache = L.k_cache,
                         .v_cache = L.v_cache};
  CHECK_OK(ctx, nb_serve_kv_cache_write(ctx, &w));
  nb_serve_attn a = attn_of(&L);
  CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));

  nb_ctx *lent_ctx = nb_ctx_create();
  int lent_runs = 0;
  nb_serve_pool_lend lend = {run_threads_counted, &lent_runs, NULL};
  CHECK_OK(lent_ctx, nb_serve_register_kernels(lent_ctx, &lend));
  nb_graph *lent_g = step_graph(lent_ctx, &L, scale);
  nb_graph *gs[2] = {g, lent_g};
  for (int c = 0; c < 2; c++) {
    nb_array *out[3] = {NULL, NULL, NULL};
    CHECK_OK(ctx, nb_graph_run_flat(nb_graph_ctx(gs[c]), gs[c], in, out));
    if (!out[0]) break;
    CHECK(memcmp(nb_array_data(out[0]), L.out, sizeof(float) * (size_t)(T * L.num_heads * D)) == 0);
    CHECK(memcmp(nb_array_data(out[1]), L.k_cache, nb_array_nbytes(out[1])) == 0);
    CHECK(memcmp(nb_array_data(out[2]), L.v_cache, nb_array_nbytes(out[2])) == 0);
    for (int i = 0; i < 3; i++) nb_array_release(out[i]);
  }

  /* compiled: the custom calls run as host steps of the executable */
  nb_exe *exe = nb_jit(ctx, g, NULL);
  CHECK_MSG(exe != NULL, "%s", nb_ctx_error(ctx));
  if (exe) {
    nb_array *out[3] = {NULL, NULL, NULL};
    CHECK_OK(ctx, nb_exe_run_flat(exe, in, out));
    CHECK(out[0] && memcmp(nb_array_data(out[0]), L.out, sizeof(float) * (size_t)(T * L.num_heads * D)) == 0);
    CHECK(out[1] && memcmp(nb_array_data(out[1]), L.k_cache, nb_array_nbytes(out[1])) == 0);
    for (int i = 0; i < 3; i++) nb_array_release(out[i]);
    nb_exe_destroy(exe);
  }

  /* contents the shapes cannot catch fail the run with the kernel's message */
  int32_t *tab = (int32_t *)nb_array_data(in[5]); /* sole owner: patched in place for the test */
  int32_t saved = tab[1];
  tab[1] = 99;
  nb_array *out[3] = {NULL, NULL, NULL};
  CHECK(nb_graph_run_flat(ctx, g, in, out) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "block_tables[0][1] = 99 is out of range [0, 10)");
  tab[1] = saved;
  for (int i = 0; i < 3; i++) nb_array_release(out[i]);
  for (int i = 0; i < 9; i++) nb_array_release(in[i]);
  nb_graph_destroy(g);
  nb_graph_destroy(lent_g);
  CHECK(lent_runs == 1); /* the lent pool ran the lent context's call */
  nb_ctx_destroy(lent_ctx);

  /* shapes: the trace fails naming the operand */
  g = nb_graph_create(ctx);
  int64_t bad_qd[3] = {T, 3, D};
  nb_val *bq = nb_graph_input(g, "q", nb_aval_make(NB_F32, 3, bad_qd));
  nb_val *ops[5] = {nb_graph_input(g, "k_cache", nb_aval_make(NB_F32, 4, cd)), nb_graph_input(g, "v_cache", nb_aval_make(NB_F32, 4, cd)),
                    nb_graph_input(g, "block_tables", nb_aval_make(NB_I32, 2, bd)),
                    nb_graph_input(g, "context_lens", nb_aval_make(NB_I32, 1, s1)),
                    nb_graph_input(g, "query_start", nb_aval_make(NB_I32, 1, s1))};
  nb_serve_paged_attention_op(bq, ops[0], ops[1], ops[2], ops[3], ops[4], scale);
  CHECK(nb_graph_status(g) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "q must be f32[num_tokens, num_heads, 8] with num_heads a positive multiple of num_kv_heads 2");
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  bq = nb_graph_input(g, "q", nb_aval_make(NB_F32, 3, qd));
  nb_val *bcl = nb_graph_input(g, "context_lens", nb_aval_make(NB_I32, 1, s1));
  nb_serve_paged_attention_op(bq, nb_graph_input(g, "k_cache", nb_aval_make(NB_F32, 4, cd)),
                              nb_graph_input(g, "v_cache", nb_aval_make(NB_F32, 4, cd)),
                              nb_graph_input(g, "block_tables", nb_aval_make(NB_I32, 2, bd)), bcl,
                              nb_graph_input(g, "query_start", nb_aval_make(NB_I32, 1, s1)), scale);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "context_lens must be i32[3] (a length per block_tables row)");
  nb_graph_destroy(g);
  g = nb_graph_create(ctx);
  nb_val *kc3, *vc3;
  int64_t bad_kd[3] = {T, KVH, D + 1};
  nb_val *wk = nb_graph_input(g, "k", nb_aval_make(NB_F32, 3, bad_kd));
  CHECK(nb_serve_kv_cache_write_op(nb_graph_input(g, "k_cache", nb_aval_make(NB_F32, 4, cd)),
                                   nb_graph_input(g, "v_cache", nb_aval_make(NB_F32, 4, cd)), wk, wk,
                                   nb_graph_input(g, "slot_mapping", nb_aval_make(NB_I32, 1, td)), &kc3, &vc3) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "k must be f32[num_tokens, 2, 8] (the cache's heads and head_dim)");
  nb_graph_destroy(g);
  CHECK(nb_serve_register_kernels(ctx, NULL) == NB_ERR_INVALID_ARG); /* once per context */
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "already registered");
  free(k), free(v), free(slots);
  layout_free(&L);
}

/* ---------------------------------------------------------------- with the engine */

/* A row of values for (token, position, what): the fake model's q, k and v. */
static void fake_row(int32_t token, int32_t pos, int what, float *out, int n) {
  uint64_t h = (uint64_t)token * 0x9e3779b97f4a7c15ull ^ (uint64_t)pos * 0xc2b2ae3d27d4eb4full ^ (uint64_t)what << 56;
  for (int i = 0; i < n; i++) {
    h ^= h >> 31, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 29;
    out[i] = (float)((double)(h >> 11) / 9007199254740992.0 * 2 - 1) * 2;
  }
}

/* The engine schedules (chunked prefill under a 12-token budget, prefix-cache
 * hits on a shared prompt head, decodes); each step performs the copies,
 * builds the kernels' operands from the batch, writes keys and values of
 * (token, position) and attends; every output row must equal dense
 * attention over the sequence's whole history recomputed from its tokens. */
static void test_engine_steps(nb_ctx *ctx) {
  enum { BS = 4, NB = 24, MAXB = 10, H = 2, KVH = 1, D = 8, ROW = KVH * D };
  nb_serve_config c = {.block_size = BS, .num_blocks = NB, .max_num_seqs = 4, .max_num_batched_tokens = 12,
                       .max_model_len = 40, .enable_prefix_caching = true};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  CHECK(e != NULL);
  if (!e) return;
  static int32_t hist[4][40];
  static float kc[NB * BS * ROW], vc[NB * BS * ROW];
  int32_t prompt_len[4] = {0, 13, 11, 5};
  for (int id = 1; id <= 3; id++)
    for (int i = 0; i < prompt_len[id]; i++) hist[id][i] = id == 2 && i < 8 ? hist[1][i] : (id * 13 + i * 5) % 50;
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = hist[1], .prompt_len = 13, .max_tokens = 6}));
  int32_t bt[4 * MAXB], cl[4], qs[5], sm[12];
  float q[12 * H * D], k[12 * ROW], v[12 * ROW], out[12 * H * D];
  int steps = 0, rows = 0;
  double worst = 0;
  while (nb_serve_has_unfinished(e) && steps < 100) {
    if (steps == 2) { /* request 2 shares request 1's first two blocks, now cached */
      CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = hist[2], .prompt_len = 11, .max_tokens = 6}));
      CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 3, .prompt = hist[3], .prompt_len = 5, .max_tokens = 6}));
    }
    steps++;
    const nb_serve_batch *b = NULL;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    if (!b) break;
    for (int32_t i = 0; i < b->num_copies; i++) {
      memcpy(kc + b->copies[i].dst * BS * ROW, kc + b->copies[i].src * BS * ROW, sizeof(float) * BS * ROW);
      memcpy(vc + b->copies[i].dst * BS * ROW, vc + b->copies[i].src * BS * ROW, sizeof(float) * BS * ROW);
    }
    CHECK_OK(ctx, nb_serve_batch_operands(ctx, b, BS, MAXB, bt, cl, qs, sm));
    for (int32_t t = 0; t < b->num_tokens; t++) {
      fake_row(b->token_ids[t], b->positions[t], 0, q + t * H * D, H * D);
      fake_row(b->token_ids[t], b->positions[t], 1, k + t * ROW, ROW);
      fake_row(b->token_ids[t], b->positions[t], 2, v + t * ROW, ROW);
      CHECK(sm[t] == b->slots[t].block * BS + b->slots[t].offset);
    }
    nb_serve_kv_write w = {.num_tokens = b->num_tokens, .num_kv_heads = KVH, .head_dim = D, .block_size = BS, .num_blocks = NB,
                           .k = k, .v = v, .slot_mapping = sm, .k_cache = kc, .v_cache = vc};
    CHECK_OK(ctx, nb_serve_kv_cache_write(ctx, &w));
    nb_serve_attn a = {.num_seqs = b->num_seqs, .num_tokens = b->num_tokens, .num_heads = H, .num_kv_heads = KVH, .head_dim = D,
                       .block_size = BS, .num_blocks = NB, .max_blocks_per_seq = MAXB, .q = q, .k_cache = kc, .v_cache = vc,
                       .block_tables = bt, .context_lens = cl, .query_start = qs, .scale = 0.35f, .out = out};
    CHECK_OK(ctx, nb_serve_paged_attention(ctx, &a, NULL, NULL));
    for (int32_t i = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *sq = &b->seqs[i];
      int32_t *h = hist[sq->request_id];
      for (int32_t t = sq->token_start; t < sq->token_start + sq->num_tokens; t++, rows++) {
        int32_t pos = b->positions[t];
        CHECK(b->token_ids[t] == h[pos]);
        for (int hh = 0; hh < H; hh++) { /* dense, in double, from the history */
          double sc[40], mx = -1e300, sum = 0, o[D] = {0};
          float kr[ROW], vr[ROW];
          for (int32_t j = 0; j <= pos; j++) {
            fake_row(h[j], j, 1, kr, ROW);
            sc[j] = 0;
            for (int d = 0; d < D; d++) sc[j] += (double)q[(t * H + hh) * D + d] * kr[d];
            sc[j] *= 0.35;
            mx = sc[j] > mx ? sc[j] : mx;
          }
          for (int32_t j = 0; j <= pos; j++) {
            fake_row(h[j], j, 2, vr, ROW);
            double p = exp(sc[j] - mx);
            sum += p;
            for (int d = 0; d < D; d++) o[d] += p * vr[d];
          }
          for (int d = 0; d < D; d++) {
            double err = fabs(o[d] / sum - out[(t * H + hh) * D + d]);
            if (!(err <= worst)) worst = isnan(worst) ? worst : err;
          }
        }
      }
      if (sq->needs_logits) {
        int32_t tok = (int32_t)(sq->request_id * 31 + sq->context_len * 7) % 50;
        h[sq->context_len] = tok;
        CHECK_OK(ctx, nb_serve_append_token(e, sq->request_id, 0, tok, NULL));
      }
    }
  }
  CHECK(!nb_serve_has_unfinished(e));
  CHECK_MSG(!isnan(worst) && worst <= 1e-5, "worst error %g over %d rows", worst, rows);
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  CHECK(st.prefix_cache_hits >= 8); /* request 2 found request 1's head */
  /* every token but the last of each request computed once, less the hits */
  CHECK_MSG(st.num_preemptions == 0 && rows == (13 + 5) + (11 + 5) + (5 + 5) - (int)st.prefix_cache_hits,
            "%d rows, %lld hits, %lld preemptions", rows, (long long)st.prefix_cache_hits, (long long)st.num_preemptions);

  /* a table longer than the rows */
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 4, .prompt = hist[1], .prompt_len = 13, .max_tokens = 1}));
  const nb_serve_batch *b = NULL;
  CHECK_OK(ctx, nb_serve_schedule(e, &b));
  CHECK(nb_serve_batch_operands(ctx, b, BS, 1, bt, cl, qs, sm) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rows hold max_blocks = 1");
  nb_serve_engine_destroy(e);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  CHECK_OK(ctx, nb_serve_register_kernels(ctx, NULL));
  size_t registered = nb_ctx_bytes_in_use(ctx);
  test_random_layouts(ctx);
  test_large_scores(ctx);
  test_batch_invariance(ctx);
  test_task_cuts(ctx);
  test_chunk_invariance(ctx);
  test_cache_write(ctx);
  test_errors(ctx);
  test_traced_step(ctx);
  test_engine_steps(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == registered);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/attention");
}
