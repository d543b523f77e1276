/* A seeded random simulation of the engine under a tight block budget: random
 * prompts sharing prefixes, lengths, n > 1 forks, early finishes and aborts (also of requests
 * whose step is in flight), driven by a fake model that keeps a KV cache of
 * one value per slot, hash(token, position). Every step checks:
 *  - the engine's block accounting (refcounts = tables holding the block,
 *    held + free + evictable = all blocks);
 *  - the limits: tokens <= max_num_batched_tokens, sequences <= max_num_seqs;
 *  - the batch: tokens and positions are the sequence's, slots agree with the
 *    block table, the table covers the context;
 *  - the contents: after the copies and writes of the step, every position a
 *    sequence attends to holds its own token's value, so prefix-cache hits
 *    and copy-on-write reproduce exactly what the sequence would compute;
 * and at the end every request that was not aborted produced exactly
 * max_tokens tokens per sample (or ended early by an end-of-sequence finish), and every block is free again. */
#include "nabla/serve.h"
#include "serve/internal.h"
#include "test.h"

enum { MAX_REQ = 700, MAX_N = 3, MAX_LEN = 96, VOCAB = 40 };

typedef struct sim_req {
  int32_t n, max_tokens, prompt_len;
  bool aborted;
  int32_t len[MAX_N];           /* tokens so far per sample */
  int32_t tokens[MAX_N][MAX_LEN];
  bool done[MAX_N];
  bool eos[MAX_N];               /* finished early by nb_serve_finish */
} sim_req;

static sim_req reqs[MAX_REQ];

static uint64_t kv_value(int32_t token, int32_t pos) {
  uint64_t x = ((uint64_t)(uint32_t)token << 32 | (uint32_t)pos) + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct sim_stats {
  int64_t copies, forks, eos, aborts, inflight_aborts, preempted, steps, tokens;
} sim_stats;

static bool live(const sim_req *r) {
  if (r->aborted) return false;
  for (int k = 0; k < r->n; k++)
    if (!r->done[k]) return true;
  return false;
}

static void simulate(nb_ctx *ctx, nb_serve_config cfg, uint64_t seed, int n_requests) {
  nb_serve_engine *e = nb_serve_engine_create(ctx, &cfg);
  CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
  if (!e) return;
  cfg = *nb_serve_engine_config(e);
  int32_t bs = cfg.block_size;
  uint64_t *kv = calloc((size_t)cfg.num_blocks * bs, sizeof *kv);
  memset(reqs, 0, sizeof reqs);
  nb_test_rng r = {seed};
  /* shared system prompts, so prefixes repeat */
  int32_t prefix[3][40], prefix_len[3] = {0, 17, 40};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 40; j++) prefix[i][j] = (int32_t)nb_test_int(&r, 0, VOCAB - 1);
  sim_stats st = {0};
  int added = 0;
  char why[256];
  for (int64_t step = 0; step < 20000; step++) {
    /* new requests */
    while (added < n_requests && nb_test_uniform(&r) < 0.35) {
      sim_req *q = &reqs[added];
      int p = (int)nb_test_int(&r, 0, 2);
      int32_t suffix = (int32_t)nb_test_int(&r, 1, 30);
      q->prompt_len = prefix_len[p] + suffix;
      q->max_tokens = (int32_t)nb_test_int(&r, 1, cfg.max_model_len - q->prompt_len < 24 ? cfg.max_model_len - q->prompt_len : 24);
      q->n = nb_test_uniform(&r) < 0.25 ? (int32_t)nb_test_int(&r, 2, MAX_N) : 1;
      int32_t prompt[MAX_LEN];
      memcpy(prompt, prefix[p], (size_t)prefix_len[p] * sizeof *prompt);
      for (int32_t j = prefix_len[p]; j < q->prompt_len; j++) prompt[j] = (int32_t)nb_test_int(&r, 0, VOCAB - 1);
      for (int k = 0; k < q->n; k++) {
        memcpy(q->tokens[k], prompt, (size_t)q->prompt_len * sizeof *prompt);
        q->len[k] = q->prompt_len;
      }
      nb_serve_request rq = {.id = added, .prompt = prompt, .prompt_len = q->prompt_len, .max_tokens = q->max_tokens, .n = q->n};
      CHECK_OK(ctx, nb_serve_add_request(e, &rq));
      added++;
    }
    /* aborts of waiting or running requests */
    if (added > 0 && nb_test_uniform(&r) < 0.01) {
      int id = (int)nb_test_int(&r, 0, added - 1);
      if (live(&reqs[id])) {
        CHECK_OK(ctx, nb_serve_abort_request(e, id));
        reqs[id].aborted = true;
        st.aborts++;
      }
    }
    if (added == n_requests && !nb_serve_has_unfinished(e)) break;

    const nb_serve_batch *b;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    st.steps++;
    CHECK_MSG(nb_serve__engine_check(e, why, sizeof why), "step %lld: %s", (long long)step, why);
    nb_serve_stats es;
    nb_serve_get_stats(e, &es);
    CHECK(es.num_running <= cfg.max_num_seqs);
    CHECK(b->num_tokens <= cfg.max_num_batched_tokens && b->num_seqs <= cfg.max_num_seqs);
    st.preempted += b->num_preempted;
    st.copies += b->num_copies;
    st.tokens += b->num_tokens;
    if (nb_test_failures > 20) break;

    /* the batch describes the sequences' own tokens, at slots their tables name */
    int32_t at = 0;
    for (int32_t i = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *s = &b->seqs[i];
      sim_req *q = &reqs[s->request_id];
      const int32_t *toks = q->tokens[s->sample_index];
      CHECK(s->token_start == at && s->num_tokens >= 1);
      at += s->num_tokens;
      CHECK(s->num_table_blocks == (s->context_len + bs - 1) / bs);
      CHECK(s->context_len <= q->len[s->sample_index]);
      CHECK(s->needs_logits == (s->context_len == q->len[s->sample_index]));
      for (int32_t j = 0; j < i; j++)
        CHECK(b->seqs[j].request_id != s->request_id || b->seqs[j].sample_index != s->sample_index);
      for (int32_t k = 0; k < s->num_tokens; k++) {
        int32_t t = s->token_start + k, pos = s->context_len - s->num_tokens + k;
        CHECK(b->positions[t] == pos && b->token_ids[t] == toks[pos]);
        CHECK(b->slots[t].block == s->block_table[pos / bs] && b->slots[t].offset == pos % bs);
      }
      if (s->num_samples > 1) st.forks++;
    }
    CHECK(at == b->num_tokens);

    /* a client may go away while its step is in flight */
    if (b->num_seqs > 0 && nb_test_uniform(&r) < 0.01) {
      int64_t id = b->seqs[nb_test_int(&r, 0, b->num_seqs - 1)].request_id;
      if (live(&reqs[id])) {
        CHECK_OK(ctx, nb_serve_abort_request(e, id));
        reqs[id].aborted = true;
        st.inflight_aborts++;
      }
    }

    /* the fake model: copies, then writes, then reads */
    for (int32_t c = 0; c < b->num_copies; c++)
      memcpy(kv + (size_t)b->copies[c].dst * bs, kv + (size_t)b->copies[c].src * bs, (size_t)bs * sizeof *kv);
    for (int32_t t = 0; t < b->num_tokens; t++)
      kv[(size_t)b->slots[t].block * bs + b->slots[t].offset] = kv_value(b->token_ids[t], b->positions[t]);
    for (int32_t i = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *s = &b->seqs[i];
      const int32_t *toks = reqs[s->request_id].tokens[s->sample_index];
      int bad = -1;
      for (int32_t pos = 0; pos < s->context_len && bad < 0; pos++)
        if (kv[(size_t)s->block_table[pos / bs] * bs + pos % bs] != kv_value(toks[pos], pos)) bad = pos;
      CHECK_MSG(bad < 0, "step %lld: request %lld sample %d reads a wrong value at position %d", (long long)step,
                (long long)s->request_id, s->sample_index, bad);
    }
    /* sampling */
    for (int32_t i = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *s = &b->seqs[i];
      if (!s->needs_logits) continue;
      sim_req *q = &reqs[s->request_id];
      for (int32_t k = 0; k < s->num_samples; k++) {
        int32_t sample = s->sample_indices[k];
        CHECK(sample >= 0 && sample < q->n && (k == 0 || q->len[sample] == q->prompt_len));
        int32_t tok = (int32_t)nb_test_int(&r, 0, VOCAB - 1);
        bool fin = false;
        CHECK_OK(ctx, nb_serve_append_token(e, s->request_id, sample, tok, &fin));
        if (q->aborted) {
          CHECK(fin);
          continue;
        }
        q->tokens[sample][q->len[sample]++] = tok;
        CHECK(fin == (q->len[sample] - q->prompt_len == q->max_tokens));
        if (fin) q->done[sample] = true;
        if (!fin && nb_test_uniform(&r) < 0.005) { /* an end-of-sequence token */
          CHECK_OK(ctx, nb_serve_finish(e, s->request_id, sample));
          q->done[sample] = q->eos[sample] = true;
          st.eos++;
        }
      }
    }
  }
  CHECK_MSG(added == n_requests && !nb_serve_has_unfinished(e), "did not finish: %d of %d requests added", added, n_requests);
  int finished = 0;
  for (int i = 0; i < added; i++) {
    sim_req *q = &reqs[i];
    if (q->aborted) continue;
    finished++;
    for (int k = 0; k < q->n; k++)
      CHECK_MSG(q->done[k] && (q->eos[k] || q->len[k] - q->prompt_len == q->max_tokens), "request %d sample %d: %d of %d tokens", i, k,
                q->len[k] - q->prompt_len, q->max_tokens);
  }
  const nb_serve_batch *b;
  CHECK_OK(ctx, nb_serve_schedule(e, &b)); /* retires the last ones */
  nb_serve_stats es;
  nb_serve_get_stats(e, &es);
  CHECK(es.num_free_blocks == es.num_blocks && es.num_running == 0 && es.num_waiting == 0);
  CHECK_MSG(nb_serve__engine_check(e, why, sizeof why), "%s", why);
  printf("block_size %d, %lld blocks, prefix caching %d: %lld steps, %lld tokens, %d requests finished, %lld aborted "
         "(%lld in flight), %lld ended early, %lld forks, %lld copies, %lld preemptions, prefix hits %lld of %lld tokens\n",
         bs, (long long)cfg.num_blocks, cfg.enable_prefix_caching, (long long)st.steps, (long long)st.tokens, finished,
         (long long)st.aborts, (long long)st.inflight_aborts, (long long)st.eos, (long long)st.forks, (long long)st.copies,
         (long long)st.preempted, (long long)es.prefix_cache_hits, (long long)es.prefix_cache_queries);
  /* the run exercised what it is meant to check */
  CHECK(st.preempted > 0 && st.copies > 0 && st.forks > 0 && st.aborts > 0 && st.inflight_aborts > 0 && st.eos > 0);
  if (cfg.enable_prefix_caching) CHECK(es.prefix_cache_hits > 0);
  free(kv);
  nb_serve_engine_destroy(e);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  /* tight: one sequence of max_model_len plus a few blocks */
  simulate(ctx,
           (nb_serve_config){.block_size = 4, .num_blocks = 24 + 8, .max_num_seqs = 8, .max_num_batched_tokens = 24,
                             .max_model_len = MAX_LEN, .enable_prefix_caching = true},
           1, 600);
  simulate(ctx,
           (nb_serve_config){.block_size = 16, .num_blocks = 6 + 3, .max_num_seqs = 6, .max_num_batched_tokens = 40,
                             .max_model_len = MAX_LEN, .enable_prefix_caching = true},
           2, 500);
  simulate(ctx,
           (nb_serve_config){.block_size = 8, .num_blocks = 12 + 6, .max_num_seqs = 5, .max_num_batched_tokens = 16,
                             .max_model_len = MAX_LEN, .enable_prefix_caching = false},
           3, 500);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/sim");
}
