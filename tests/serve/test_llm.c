/* nb_serve_llm: the engine and model step driven together. Greedy tokens of
 * concurrent requests equal the bare engine + step loop's, cut at the first
 * end-of-sequence or stop token (once min_tokens are out) with finish
 * reason stop, else at max_tokens with reason length; ignore_eos runs on; an
 * abort reports one event per live sample and frees the request; finish()
 * ends a sample silently; n > 1 gives every sample its events; bad calls
 * are refused by name. */
#include <string.h>

#include "nabla/serve.h"
#include "test.h"

enum { NREQ = 4, GEN = 12 };

static const int32_t lens[NREQ] = {3, 17, 6, 9};
static int32_t prompts[NREQ][32];

static nb_model_config tiny_cfg(nb_ctx *ctx) {
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", &cfg));
  cfg.n_layers = 2, cfg.d_model = 32, cfg.n_heads = 2, cfg.n_kv_heads = 1, cfg.d_ff = 48, cfg.vocab_size = 40;
  return cfg;
}

static const nb_serve_config engine_cfg = {.block_size = 4, .num_blocks = 24, .max_num_seqs = 4,
                                           .max_num_batched_tokens = 8, .max_model_len = 32};

/* The reference: every request's GEN greedy tokens through the bare engine
 * and model step (test_step checks those against the generator). */
static void reference(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, int32_t want[NREQ][GEN]) {
  nb_serve_engine *e = nb_serve_engine_create(ctx, &engine_cfg);
  nb_serve_model *m = e ? nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(e), &(nb_serve_model_opts){.interpret = true}) : NULL;
  CHECK_MSG(m != NULL, "%s", nb_ctx_error(ctx));
  int32_t n[NREQ] = {0};
  for (int i = 0; m && i < NREQ; i++)
    CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = i, .prompt = prompts[i], .prompt_len = lens[i], .max_tokens = GEN}));
  for (int guard = 0; m && nb_serve_has_unfinished(e) && guard < 1000; guard++) {
    const nb_serve_batch *b;
    nb_serve_sample_out so[8];
    int32_t nso = 0;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    CHECK_OK(ctx, nb_serve_model_step(m, b, so, &nso));
    for (int32_t k = 0; k < nso; k++) {
      want[so[k].request_id][n[so[k].request_id]++] = so[k].token;
      CHECK_OK(ctx, nb_serve_append_token(e, so[k].request_id, so[k].sample_index, so[k].token, NULL));
    }
  }
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
}

typedef struct got {
  int32_t tok[NREQ][2][GEN];
  int32_t n[NREQ][2];
  nb_serve_finish_reason why[NREQ][2];
  int events_after_end;
} got;

/* Runs the loop to the end, recording each sample's tokens and finish. */
static void drain(nb_ctx *ctx, nb_serve_llm *l, got *g) {
  for (int guard = 0; nb_serve_llm_has_unfinished(l) && guard < 1000; guard++) {
    const nb_serve_event *ev;
    int32_t nev = 0;
    CHECK_OK(ctx, nb_serve_llm_step(l, &ev, &nev));
    for (int32_t k = 0; k < nev; k++) {
      int64_t id = ev[k].s.request_id;
      int32_t s = ev[k].s.sample_index;
      if (g->why[id][s] != NB_SERVE_RUNNING) g->events_after_end++;
      if (ev[k].finish != NB_SERVE_FINISHED_ABORT) {
        CHECK(ev[k].num_generated == g->n[id][s] + 1);
        g->tok[id][s][g->n[id][s]++] = ev[k].s.token;
      }
      g->why[id][s] = ev[k].finish;
    }
  }
}

static void test_stops(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, int32_t want[NREQ][GEN]) {
  /* eos: request 0's 4th greedy token; request 2 stops on its 6th token as a
   * stop token; request 1 ignores eos; request 3 may not stop before 8 */
  int32_t eos = want[0][3], stop2 = want[2][5];
  nb_serve_llm_config lc = {.engine = engine_cfg, .model = {.interpret = true}, .eos_token_ids = &eos, .num_eos_token_ids = 1};
  nb_serve_llm *l = nb_serve_llm_create(ctx, cfg, params, &lc);
  CHECK_MSG(l != NULL, "%s", nb_ctx_error(ctx));
  if (!l) return;
  nb_serve_sampling s2 = {.stop_token_ids = &stop2, .num_stop_token_ids = 1}, s3 = {.min_tokens = 8};
  nb_serve_llm_request rq[NREQ] = {
      {.r = {.id = 0, .prompt = prompts[0], .prompt_len = lens[0], .max_tokens = GEN}},
      {.r = {.id = 1, .prompt = prompts[1], .prompt_len = lens[1], .max_tokens = GEN}, .ignore_eos = true},
      {.r = {.id = 2, .prompt = prompts[2], .prompt_len = lens[2], .max_tokens = GEN, .sampling = &s2}},
      {.r = {.id = 3, .prompt = prompts[3], .prompt_len = lens[3], .max_tokens = GEN, .sampling = &s3}},
  };
  for (int i = 0; i < NREQ; i++) CHECK_OK(ctx, nb_serve_llm_add(l, &rq[i]));
  got g = {0};
  drain(ctx, l, &g);
  for (int i = 0; i < NREQ; i++) {
    /* the expected end: the first stop token at or after min_tokens. Before
     * min_tokens the step masks stop tokens, so the reference is followed
     * only while it has none there. */
    int32_t min = i == 3 ? 8 : 0, end = GEN, follow = GEN;
    nb_serve_finish_reason why = NB_SERVE_FINISHED_LENGTH;
    for (int32_t j = 0; j < GEN; j++) {
      bool stop = (i != 1 && want[i][j] == eos) || (i == 2 && want[i][j] == stop2);
      if (stop && j < min && follow == GEN) follow = j;
      if (stop && j >= min && follow == GEN) {
        end = j + 1, why = NB_SERVE_FINISHED_STOP;
        break;
      }
    }
    if (follow < GEN) {
      CHECK_MSG(g.n[i][0] >= min, "request %d ended after %d tokens, before min_tokens %d", i, g.n[i][0], min);
    } else {
      CHECK_MSG(g.n[i][0] == end, "request %d: %d tokens, want %d", i, g.n[i][0], end);
      CHECK_MSG(g.why[i][0] == why, "request %d: finish %d, want %d", i, g.why[i][0], why);
    }
    for (int32_t j = 0; j < g.n[i][0] && j < follow; j++)
      CHECK_MSG(g.tok[i][0][j] == want[i][j], "request %d token %d: %d, want %d", i, j, g.tok[i][0][j], want[i][j]);
  }
  CHECK_MSG(g.n[0][0] <= 4 && g.why[0][0] == NB_SERVE_FINISHED_STOP, "request 0 did not stop at eos");
  CHECK(g.events_after_end == 0);
  nb_serve_stats st;
  nb_serve_get_stats(nb_serve_llm_engine(l), &st);
  CHECK_MSG(st.num_free_blocks == st.num_blocks, "%lld of %lld blocks free at the end", (long long)st.num_free_blocks,
            (long long)st.num_blocks);
  nb_serve_llm_destroy(l);
}

static void test_abort_finish_n(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, int32_t want[NREQ][GEN]) {
  nb_serve_llm_config lc = {.engine = engine_cfg, .model = {.interpret = true}};
  nb_serve_llm *l = nb_serve_llm_create(ctx, cfg, params, &lc);
  CHECK_MSG(l != NULL, "%s", nb_ctx_error(ctx));
  if (!l) return;
  CHECK_OK(ctx, nb_serve_llm_add(l, &(nb_serve_llm_request){.r = {.id = 0, .prompt = prompts[0], .prompt_len = lens[0], .max_tokens = GEN, .n = 2}}));
  CHECK_OK(ctx, nb_serve_llm_add(l, &(nb_serve_llm_request){.r = {.id = 1, .prompt = prompts[1], .prompt_len = lens[1], .max_tokens = GEN}}));
  CHECK_OK(ctx, nb_serve_llm_add(l, &(nb_serve_llm_request){.r = {.id = 2, .prompt = prompts[2], .prompt_len = lens[2], .max_tokens = GEN}}));
  CHECK(nb_serve_llm_add(l, &(nb_serve_llm_request){.r = {.id = 2, .prompt = prompts[2], .prompt_len = lens[2], .max_tokens = GEN}}) ==
        NB_ERR_INVALID_ARG);
  CHECK(strstr(nb_ctx_error(ctx), "already in use") != NULL);
  /* a token outside the vocabulary is refused when added, not in a step */
  int32_t bad_id = 999;
  float bias = 1;
  nb_serve_sampling bad = {.logit_bias_ids = &bad_id, .logit_bias_values = &bias, .num_logit_bias = 1};
  CHECK(nb_serve_llm_add(l, &(nb_serve_llm_request){.r = {.id = 5, .prompt = prompts[2], .prompt_len = lens[2], .max_tokens = GEN,
                                                          .sampling = &bad}}) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "999") != NULL, "%s", nb_ctx_error(ctx));
  got g = {0};
  /* a few steps, then abort request 1 and end request 0's sample 1 */
  for (int step = 0; step < 6; step++) {
    const nb_serve_event *ev;
    int32_t nev = 0;
    CHECK_OK(ctx, nb_serve_llm_step(l, &ev, &nev));
    for (int32_t k = 0; k < nev; k++) {
      int64_t id = ev[k].s.request_id;
      int32_t s = ev[k].s.sample_index;
      g.tok[id][s][g.n[id][s]++] = ev[k].s.token;
    }
  }
  CHECK_MSG(g.n[0][0] > 0 && g.n[0][1] > 0, "request 0's samples have no tokens after 6 steps");
  CHECK_OK(ctx, nb_serve_llm_abort(l, 1));
  CHECK(nb_serve_llm_abort(l, 1) == NB_ERR_NOT_FOUND);
  CHECK_OK(ctx, nb_serve_llm_finish(l, 0, 1));
  CHECK(nb_serve_llm_finish(l, 0, 1) == NB_ERR_NOT_FOUND);
  CHECK(nb_serve_llm_finish(l, 0, 7) == NB_ERR_NOT_FOUND);
  int32_t n01 = g.n[0][1], aborts = 0;
  const nb_serve_event *ev;
  int32_t nev = 0;
  CHECK_OK(ctx, nb_serve_llm_step(l, &ev, &nev));
  for (int32_t k = 0; k < nev; k++) {
    if (ev[k].finish == NB_SERVE_FINISHED_ABORT) {
      aborts++;
      CHECK(ev[k].s.request_id == 1 && ev[k].s.token == -1);
    }
    CHECK_MSG(!(ev[k].s.request_id == 0 && ev[k].s.sample_index == 1), "an event for a finished sample");
    if (ev[k].finish != NB_SERVE_FINISHED_ABORT) {
      int64_t id = ev[k].s.request_id;
      g.tok[id][ev[k].s.sample_index][g.n[id][ev[k].s.sample_index]++] = ev[k].s.token;
    }
  }
  CHECK_MSG(aborts == 1, "%d abort events, want 1", aborts);
  g.n[1][0] = 0;
  memset(g.why, 0, sizeof g.why);
  got rest = g;
  drain(ctx, l, &rest);
  CHECK(rest.n[0][1] == n01);
  CHECK(rest.n[1][0] == 0);
  CHECK(rest.n[0][0] == GEN && rest.n[2][0] == GEN);
  /* greedy: both samples of request 0 follow the same tokens */
  for (int32_t j = 0; j < GEN; j++) CHECK(rest.tok[0][0][j] == want[0][j] && rest.tok[2][0][j] == want[2][j]);
  for (int32_t j = 0; j < n01; j++) CHECK(rest.tok[0][1][j] == want[0][j]);
  CHECK(!nb_serve_llm_has_unfinished(l));
  CHECK(nb_serve_llm_abort(l, 0) == NB_ERR_NOT_FOUND);
  nb_serve_stats st;
  nb_serve_get_stats(nb_serve_llm_engine(l), &st);
  CHECK(st.num_free_blocks == st.num_blocks);
  nb_serve_llm_destroy(l);
}

static void test_bad_config(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params) {
  int32_t eos = 99;
  nb_serve_llm_config lc = {.engine = engine_cfg, .eos_token_ids = &eos, .num_eos_token_ids = 1};
  CHECK(nb_serve_llm_create(ctx, cfg, params, &lc) == NULL);
  CHECK(strstr(nb_ctx_error(ctx), "eos_token_ids[0] = 99") != NULL);
  lc.num_eos_token_ids = 0;
  lc.engine.max_model_len = 0;
  CHECK(nb_serve_llm_create(ctx, cfg, params, &lc) == NULL);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  nb_model_config cfg = tiny_cfg(ctx);
  /* the custom calls' registry lives until the context goes: count from here */
  CHECK_OK(ctx, nb_serve_register_kernels(ctx, NULL));
  size_t base = nb_ctx_bytes_in_use(ctx);
  nb_array *key = nb_key(ctx, 11);
  nb_tree *params = nb_model_init(ctx, &cfg, key);
  nb_array_release(key);
  CHECK(params != NULL);
  uint32_t x = 99;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < lens[i]; j++) prompts[i][j] = (int32_t)(((x = x * 1664525u + 1013904223u) >> 8) % (uint32_t)cfg.vocab_size);
  int32_t want[NREQ][GEN] = {{0}};
  reference(ctx, &cfg, params, want);
  test_stops(ctx, &cfg, params, want);
  test_abort_finish_n(ctx, &cfg, params, want);
  test_bad_config(ctx, &cfg, params);
  nb_tree_destroy(params);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes still in use", nb_ctx_bytes_in_use(ctx) - base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/llm");
}
