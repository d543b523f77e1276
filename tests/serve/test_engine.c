/* The engine, step by step on small cases: KV cache sizing and the startup
 * check, refused requests, copy-on-write after an n > 1 prompt, prefix-cache
 * hits, chunked prefill behind decodes, preemption of the newest sequence,
 * and aborts. */
#include "nabla/serve.h"
#include "serve/internal.h"
#include "test.h"

static void check_engine(const nb_serve_engine *e) {
  char why[256] = "";
  CHECK_MSG(nb_serve__engine_check(e, why, sizeof why), "%s", why);
}

static const nb_serve_batch *step(nb_serve_engine *e) {
  const nb_serve_batch *b = NULL;
  CHECK(nb_serve_schedule(e, &b) == NB_OK);
  check_engine(e);
  return b;
}

/* Appends token 7 to every sample that takes one from this batch. */
static void append_all(nb_ctx *ctx, nb_serve_engine *e, const nb_serve_batch *b) {
  for (int32_t i = 0; i < b->num_seqs; i++)
    for (int32_t k = 0; k < b->seqs[i].num_samples; k++)
      CHECK_OK(ctx, nb_serve_append_token(e, b->seqs[i].request_id, b->seqs[i].sample_indices[k], 7, NULL));
}

static const nb_serve_seq_batch *entry(const nb_serve_batch *b, int64_t id, int32_t sample) {
  for (int32_t i = 0; i < b->num_seqs; i++)
    if (b->seqs[i].request_id == id && b->seqs[i].sample_index == sample) return &b->seqs[i];
  return NULL;
}

static void test_config(nb_ctx *ctx) {
  nb_serve_kv_geometry g = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .dtype_size = 4};
  CHECK(nb_serve_bytes_per_block(&g, 16) == 4096); /* K and V x 2 layers x 2 heads x 8 x 4 bytes x 16 tokens */
  nb_serve_kv_geometry bad = {.num_layers = 2, .num_kv_heads = 0, .head_dim = 8, .dtype_size = 4};
  CHECK(nb_serve_bytes_per_block(&bad, 16) == 0);

  /* defaults and a byte budget */
  nb_serve_config c = {.kv = g, .kv_cache_bytes = 100 * 4096 + 17, .max_model_len = 64};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  CHECK(e != NULL);
  if (e) {
    const nb_serve_config *r = nb_serve_engine_config(e);
    CHECK(r->block_size == 16 && r->max_num_seqs == 256 && r->max_num_batched_tokens == 2048);
    CHECK(r->num_blocks == 100); /* 4096 bytes per block, the remainder unused */
    nb_serve_engine_destroy(e);
  }
  /* the startup check: one sequence of max_model_len 4096 needs 256 blocks
   * of 4096 bytes; 1 MiB holds 256, 1 MiB - 1 does not */
  c = (nb_serve_config){.kv = g, .kv_cache_bytes = 1 << 20, .max_model_len = 4096};
  e = nb_serve_engine_create(ctx, &c);
  CHECK(e != NULL);
  nb_serve_engine_destroy(e);
  c.kv_cache_bytes = (1 << 20) - 1;
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "needs 256 blocks of 16 tokens = 1048576 bytes") &&
                strstr(nb_ctx_error(ctx), "kv_cache_bytes gives 255 blocks = 1044480 bytes available"),
            "%s", nb_ctx_error(ctx));
  CHECK_ERR(ctx, NB_ERR_NOMEM, "max_model_len 4096");
  /* a fraction of RAM: a tiny one cannot hold the sequence, a larger one can */
  c = (nb_serve_config){.kv = g, .kv_cache_memory_fraction = 1e-12, .max_model_len = 4096};
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOMEM, "kv_cache_memory_fraction gives 0 blocks");
  c.kv_cache_memory_fraction = 1e-3;
  c.kv = (nb_serve_kv_geometry){1, 1, 1, 1};
  e = nb_serve_engine_create(ctx, &c);
  CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
  nb_serve_engine_destroy(e);
  /* num_blocks without geometry */
  c = (nb_serve_config){.num_blocks = 3, .block_size = 4, .max_model_len = 13};
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOMEM, "one sequence needs 4 blocks of 4 tokens, but num_blocks is 3");
  /* bad fields, named */
  c = (nb_serve_config){.num_blocks = 8, .max_model_len = 16};
  CHECK(nb_serve_engine_create(ctx, &(nb_serve_config){.max_model_len = 16}) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "no KV cache size");
  CHECK(nb_serve_engine_create(ctx, &(nb_serve_config){.max_model_len = 16, .kv_cache_bytes = 1 << 20}) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "must be positive to size the KV cache from kv_cache_bytes");
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 4;
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_num_batched_tokens (4) must be at least max_num_seqs (8)");
  c = (nb_serve_config){.num_blocks = 8, .max_model_len = 0};
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_model_len");
  c = (nb_serve_config){.num_blocks = 8, .max_model_len = 16, .kv_cache_memory_fraction = 1.5};
  CHECK(nb_serve_engine_create(ctx, &c) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "kv_cache_memory_fraction must be in (0, 1]");
}

static void test_refused_requests(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 8, .block_size = 4, .max_num_seqs = 4, .max_model_len = 16};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t prompt[12] = {0};
  CHECK(nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 12, .max_tokens = 5}) ==
        NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "prompt of 12 tokens + max_tokens 5 = 17 exceeds max_model_len 16");
  CHECK(nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 0, .max_tokens = 1}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "prompt is empty");
  CHECK(nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 2, .max_tokens = 0}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_tokens must be at least 1");
  CHECK(nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 2, .max_tokens = 1, .n = 5}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "n must be in [1, max_num_seqs 4]");
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 2, .max_tokens = 1}));
  CHECK(nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 2, .max_tokens = 1}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "request 1: the id is already in use");
  CHECK(nb_serve_append_token(e, 1, 0, 3, NULL) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "not waiting for a token (its step has not run)");
  CHECK(nb_serve_abort_request(e, 99) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "no unfinished request 99");
  nb_serve_engine_destroy(e);
}

/* An n = 2 request: the prompt is computed once, both samples take a token
 * from its logits and share its blocks; the first to write into the shared
 * partial block copies it, the second then owns the original alone. */
static void test_fork_cow(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 8, .block_size = 4, .max_num_seqs = 4, .max_model_len = 16};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 5, .prompt = prompt, .prompt_len = 6, .max_tokens = 3, .n = 2}));
  const nb_serve_batch *b = step(e);
  CHECK(b->num_seqs == 1 && b->num_tokens == 6 && b->num_copies == 0);
  CHECK(b->seqs[0].needs_logits && b->seqs[0].num_samples == 2);
  CHECK(b->seqs[0].sample_indices[0] == 0 && b->seqs[0].sample_indices[1] == 1);
  CHECK(b->seqs[0].num_table_blocks == 2);
  int32_t shared = b->seqs[0].block_table[1];
  int32_t full = b->seqs[0].block_table[0];
  CHECK(e->pool.ref[shared] == 2 && e->pool.ref[full] == 2);
  append_all(ctx, e, b);
  b = step(e);
  CHECK(b->num_seqs == 2 && b->num_tokens == 2);
  CHECK(b->num_copies == 1);
  const nb_serve_seq_batch *s0 = entry(b, 5, 0), *s1 = entry(b, 5, 1);
  CHECK(s0 && s1);
  if (s0 && s1 && b->num_copies == 1) {
    /* sample 0 is older: it writes first and gets the copy */
    CHECK(b->copies[0].src == shared && b->copies[0].dst == s0->block_table[1]);
    CHECK(s1->block_table[1] == shared);
    CHECK(s0->block_table[0] == full && s1->block_table[0] == full); /* full blocks stay shared */
    CHECK(b->slots[s0->token_start].block == s0->block_table[1] && b->slots[s0->token_start].offset == 2);
    CHECK(b->positions[s0->token_start] == 6 && b->token_ids[s0->token_start] == 7);
    CHECK(e->pool.ref[shared] == 1 && e->pool.ref[full] == 2);
  }
  append_all(ctx, e, b);
  b = step(e);
  CHECK(b->num_copies == 0);
  bool done[2] = {false, false};
  for (int k = 0; k < 2; k++) CHECK_OK(ctx, nb_serve_append_token(e, 5, k, 9, &done[k]));
  CHECK(done[0] && done[1]); /* 3 tokens each */
  CHECK(!nb_serve_has_unfinished(e));
  b = step(e);
  CHECK(b->num_seqs == 0);
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  CHECK(st.num_free_blocks == 8 && st.num_running == 0);
  nb_serve_engine_destroy(e);
}

static void run_to_end(nb_ctx *ctx, nb_serve_engine *e) {
  for (int i = 0; i < 100 && nb_serve_has_unfinished(e); i++) append_all(ctx, e, step(e));
  CHECK(!nb_serve_has_unfinished(e));
}

static void test_prefix_cache(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 16, .block_size = 4, .max_num_seqs = 4, .max_model_len = 32, .enable_prefix_caching = true};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t p1[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p1, .prompt_len = 10, .max_tokens = 2}));
  run_to_end(ctx, e);
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  CHECK(st.num_cached_blocks == 2 && st.prefix_cache_queries == 10 && st.prefix_cache_hits == 0);
  /* shares the first two blocks */
  int32_t p2[11] = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = p2, .prompt_len = 11, .max_tokens = 1}));
  const nb_serve_batch *b = step(e);
  CHECK(b->num_seqs == 1 && b->seqs[0].num_tokens == 3 && b->positions[0] == 8 && b->seqs[0].context_len == 11);
  nb_serve_get_stats(e, &st);
  CHECK(st.prefix_cache_queries == 21 && st.prefix_cache_hits == 8);
  append_all(ctx, e, b);
  /* the same prompt again, 8 tokens: the last token is always computed, so
   * one block hits and the second is computed again */
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 3, .prompt = p1, .prompt_len = 8, .max_tokens = 1}));
  b = step(e);
  CHECK(b->num_seqs == 1 && b->seqs[0].num_tokens == 4 && b->positions[0] == 4);
  append_all(ctx, e, b);
  /* a different first block: no hit, even though the second block matches */
  int32_t p3[9] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 4, .prompt = p3, .prompt_len = 9, .max_tokens = 1}));
  b = step(e);
  CHECK(b->num_seqs == 1 && b->seqs[0].num_tokens == 9);
  append_all(ctx, e, b);
  run_to_end(ctx, e);
  nb_serve_engine_destroy(e);
}

/* max_num_batched_tokens 8: a running decode goes first, a long prompt
 * takes the rest of each step in chunks. */
static void test_chunked_prefill(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 16, .block_size = 4, .max_num_seqs = 2, .max_num_batched_tokens = 8, .max_model_len = 32};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t p[20] = {0};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p, .prompt_len = 2, .max_tokens = 10}));
  const nb_serve_batch *b = step(e);
  CHECK(b->num_tokens == 2);
  append_all(ctx, e, b);
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = p, .prompt_len = 20, .max_tokens = 1}));
  int chunks = 0;
  for (int i = 0; i < 4; i++) {
    b = step(e);
    CHECK(b->num_tokens <= 8);
    CHECK(b->num_seqs >= 1 && b->seqs[0].request_id == 1 && b->seqs[0].num_tokens == 1);
    if (b->num_seqs == 2) {
      CHECK(b->seqs[1].num_tokens == (chunks < 2 ? 7 : 6));
      CHECK(b->seqs[1].needs_logits == (chunks == 2));
      chunks++;
    }
    append_all(ctx, e, b);
  }
  CHECK(chunks == 3);
  run_to_end(ctx, e);
  nb_serve_engine_destroy(e);
}

/* Six blocks of 2 tokens: two sequences grow until they do not both fit;
 * the newer one is preempted, waits at the front, and is recomputed. */
static void test_preemption(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 6, .block_size = 2, .max_num_seqs = 3, .max_model_len = 12};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t p[4] = {1, 2, 3, 4};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p, .prompt_len = 4, .max_tokens = 8}));
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = p, .prompt_len = 4, .max_tokens = 8}));
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 3, .prompt = p, .prompt_len = 2, .max_tokens = 1}));
  const nb_serve_batch *b = step(e);
  CHECK(b->num_seqs == 3);
  append_all(ctx, e, b);
  int preempted_at = -1;
  int64_t steps = 0;
  for (; steps < 100 && nb_serve_has_unfinished(e); steps++) {
    b = step(e);
    if (b->num_preempted > 0 && preempted_at < 0) {
      preempted_at = (int)steps;
      CHECK(entry(b, 1, 0) != NULL && entry(b, 2, 0) == NULL); /* the newest lost its blocks */
      CHECK(e->num_waiting == 1 && e->waiting[0]->request_id == 2 && e->waiting[0]->num_tokens > 4);
    }
    append_all(ctx, e, b);
  }
  CHECK(preempted_at >= 0);
  CHECK(!nb_serve_has_unfinished(e));
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  CHECK(st.num_preemptions >= 1 && st.num_free_blocks == 6);
  nb_serve_engine_destroy(e);
}

static void test_abort(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 8, .block_size = 4, .max_num_seqs = 1, .max_model_len = 16};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  int32_t p[5] = {1, 2, 3, 4, 5};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p, .prompt_len = 5, .max_tokens = 4, .n = 1}));
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = p, .prompt_len = 5, .max_tokens = 4}));
  const nb_serve_batch *b = step(e);
  CHECK(b->num_seqs == 1 && b->seqs[0].request_id == 1);
  CHECK_OK(ctx, nb_serve_abort_request(e, 2)); /* waiting */
  CHECK_OK(ctx, nb_serve_abort_request(e, 1)); /* running, its batch in flight */
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  CHECK(st.num_free_blocks == 8 && st.num_waiting == 0);
  bool done = false;
  CHECK_OK(ctx, nb_serve_append_token(e, 1, 0, 3, &done)); /* the in-flight step's token is dropped */
  CHECK(done);
  CHECK(!nb_serve_has_unfinished(e));
  CHECK(nb_serve_abort_request(e, 1) == NB_ERR_NOT_FOUND);
  nb_ctx_clear_error(ctx);
  b = step(e);
  CHECK(b->num_seqs == 0);
  /* the id can be used again */
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p, .prompt_len = 5, .max_tokens = 1}));
  b = step(e);
  CHECK(b->num_seqs == 1);
  CHECK_OK(ctx, nb_serve_finish(e, 1, 0));
  CHECK(!nb_serve_has_unfinished(e));
  nb_serve_engine_destroy(e);
}

/* Every allocation of creating an engine and adding an n = 3 request fails
 * in turn: a clean error each time, nothing leaked, the engine usable. */
static void test_alloc_failures(nb_ctx *ctx) {
  nb_serve_config c = {.num_blocks = 8, .block_size = 4, .max_num_seqs = 4, .max_model_len = 16, .enable_prefix_caching = true};
  int32_t p[5] = {1, 2, 3, 4, 5};
  bool completed = false;
  for (int64_t n = 1; n < 100 && !completed; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
    if (e) {
      nb_status s = nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p, .prompt_len = 5, .max_tokens = 2, .n = 3});
      if (s == NB_OK) {
        completed = true;
        nb_ctx_fail_alloc_after(ctx, 0);
        run_to_end(ctx, e);
      } else {
        CHECK(s == NB_ERR_NOMEM);
        CHECK(!nb_serve_has_unfinished(e));
      }
      nb_serve_engine_destroy(e);
    } else {
      CHECK(nb_ctx_status(ctx) == NB_ERR_NOMEM);
    }
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_ctx_clear_error(ctx);
    CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  }
  CHECK(completed);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  test_config(ctx);
  test_refused_requests(ctx);
  test_fork_cow(ctx);
  test_prefix_cache(ctx);
  test_chunked_prefill(ctx);
  test_preemption(ctx);
  test_abort(ctx);
  test_alloc_failures(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/engine");
}
