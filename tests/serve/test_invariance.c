/* Batch invariance of sampling (issue 14): random requests with random
 * sampling parameters (greedy and seeded temperature sampling, top_k,
 * top_p, min_p, penalties, logit_bias, min_tokens with stop tokens,
 * logprobs, n > 1), run each alone and all together under a small token
 * budget (chunked prefill), a tight block budget (preemption) and prefix
 * caching with a shared prefix: every sample's tokens, logprobs and top
 * logprobs are bit-identical, interpreted and compiled. Also min_tokens
 * masking and logit_bias through the step, and token ids outside the
 * vocabulary refused by name. */
#include <math.h>
#include <string.h>

#include "nabla/serve.h"
#include "test.h"

enum { NREQ = 9, MAXN = 3, MAXTOK = 20, MAXPROMPT = 40, MAXBIAS = 3 };

typedef struct req {
  int32_t prompt[MAXPROMPT], len, n, max_tokens;
  nb_serve_sampling sp;
  int32_t bias_ids[MAXBIAS], stops[2];
  float bias_vals[MAXBIAS];
} req;

/* Everything a sample drew, in order. */
typedef struct draws {
  int32_t n[NREQ][MAXN];
  nb_serve_sample_out out[NREQ][MAXN][MAXTOK];
} draws;

static uint32_t lcg(uint32_t *x) { return (*x = *x * 1664525u + 1013904223u) >> 8; }

static void make_requests(req *r, int32_t vocab, uint32_t seed) {
  uint32_t x = seed;
  int32_t shared[16];
  for (int j = 0; j < 16; j++) shared[j] = (int32_t)(lcg(&x) % (uint32_t)vocab);
  for (int i = 0; i < NREQ; i++) {
    req *q = &r[i];
    memset(q, 0, sizeof *q);
    q->len = 3 + (int32_t)(lcg(&x) % 30);
    for (int j = 0; j < q->len; j++) q->prompt[j] = i % 3 == 0 && j < 16 ? shared[j] : (int32_t)(lcg(&x) % (uint32_t)vocab);
    q->n = 1 + (int32_t)(lcg(&x) % MAXN);
    q->max_tokens = 4 + (int32_t)(lcg(&x) % 5);
    nb_serve_sampling *s = &q->sp;
    static const float temps[] = {0, 0.8f, 1.3f}, top_ps[] = {1, 0.9f, 0.5f}, min_ps[] = {0, 0, 0.2f};
    static const int32_t top_ks[] = {0, 5, 40};
    s->temperature = temps[lcg(&x) % 3];
    s->seed = (uint64_t)lcg(&x) << 32 | lcg(&x);
    s->top_k = top_ks[lcg(&x) % 3];
    s->top_p = top_ps[lcg(&x) % 3];
    s->min_p = min_ps[lcg(&x) % 3];
    if (lcg(&x) % 4) {
      s->presence_penalty = 1.5f, s->frequency_penalty = -0.5f, s->repetition_penalty = 2.0f;
    }
    s->num_logit_bias = (int32_t)(lcg(&x) % (MAXBIAS + 1));
    for (int j = 0; j < s->num_logit_bias; j++) {
      q->bias_ids[j] = (int32_t)(lcg(&x) % (uint32_t)vocab);
      q->bias_vals[j] = (float)(lcg(&x) % 600) / 100.0f - 3;
    }
    s->logit_bias_ids = q->bias_ids, s->logit_bias_values = q->bias_vals;
    s->num_logprobs = (int32_t)(lcg(&x) % 6);
    if (lcg(&x) % 2) {
      s->min_tokens = 1 + (int32_t)(lcg(&x) % 3);
      q->stops[0] = (int32_t)(lcg(&x) % (uint32_t)vocab), q->stops[1] = (int32_t)(lcg(&x) % (uint32_t)vocab);
      s->stop_token_ids = q->stops, s->num_stop_token_ids = 2;
    }
  }
}

typedef struct run_info {
  int64_t preemptions, hits, steps;
  int executables;
} run_info;

/* Runs requests [first, last) through one engine and model: `together`
 * adds half up front and the rest after three steps (so they find the
 * shared prefix cached); otherwise one at a time, each to its end. */
static void serve(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const nb_serve_config *ec, const req *r,
                  int nreq, bool together, bool interpret, draws *d, run_info *info) {
  memset(d, 0, sizeof *d);
  nb_serve_engine *e = nb_serve_engine_create(ctx, ec);
  nb_serve_model *m = e ? nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(e),
                                                &(nb_serve_model_opts){.interpret = interpret, .threads = 2})
                        : NULL;
  CHECK_MSG(e && m, "%s", nb_ctx_error(ctx));
  int added = 0;
  for (int step = 0; m && step < 4000; step++) {
    int want = together ? (step < 3 ? nreq / 2 : nreq) : (nb_serve_has_unfinished(e) ? added : added + 1);
    for (; added < want && added < nreq; added++) {
      const req *q = &r[added];
      CHECK_OK(ctx, nb_serve_model_check_sampling(m, added, &q->sp));
      CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = added, .prompt = q->prompt, .prompt_len = q->len,
                                                                 .max_tokens = q->max_tokens, .n = q->n, .sampling = &q->sp}));
    }
    if (!nb_serve_has_unfinished(e) && added == nreq) break;
    const nb_serve_batch *b;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    nb_serve_sample_out so[16];
    int32_t nso = 0;
    nb_status s = nb_serve_model_step(m, b, so, &nso);
    CHECK_MSG(s == NB_OK, "%s", nb_ctx_error(ctx));
    if (s) break;
    for (int32_t i = 0; i < nso; i++) {
      int64_t id = so[i].request_id;
      int32_t k = so[i].sample_index, *n = &d->n[id][k];
      if (*n < MAXTOK) d->out[id][k][(*n)++] = so[i];
      CHECK_OK(ctx, nb_serve_append_token(e, id, k, so[i].token, NULL));
    }
  }
  CHECK(added == nreq && e && !nb_serve_has_unfinished(e));
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  *info = (run_info){st.num_preemptions, st.prefix_cache_hits, st.num_steps, nb_serve_model_num_executables(m)};
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
}

/* Bit-identical draws per sample: token, logprob, top ids and logprobs. */
static int compare(const req *r, const draws *a, const draws *b, const char *what) {
  int diffs = 0;
  for (int i = 0; i < NREQ; i++)
    for (int k = 0; k < r[i].n; k++) {
      CHECK_MSG(a->n[i][k] == r[i].max_tokens && b->n[i][k] == r[i].max_tokens, "%s: request %d sample %d drew %d and %d of %d",
                what, i, k, a->n[i][k], b->n[i][k], r[i].max_tokens);
      for (int j = 0; j < a->n[i][k] && j < b->n[i][k]; j++) {
        const nb_serve_sample_out *x = &a->out[i][k][j], *y = &b->out[i][k][j];
        bool same = x->token == y->token && !memcmp(&x->logprob, &y->logprob, sizeof x->logprob) && x->num_top == y->num_top &&
                    !memcmp(x->top_ids, y->top_ids, (size_t)x->num_top * sizeof *x->top_ids) &&
                    !memcmp(x->top_logprobs, y->top_logprobs, (size_t)x->num_top * sizeof *x->top_logprobs);
        if (!same && diffs++ < 5)
          CHECK_MSG(same, "%s: request %d sample %d token %d: %d (%.9g) vs %d (%.9g)", what, i, k, j, x->token, x->logprob,
                    y->token, y->logprob);
      }
    }
  return diffs;
}

static void test_invariance(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, bool interpret, uint32_t seed) {
  req r[NREQ];
  make_requests(r, (int32_t)cfg->vocab_size, seed);
  nb_serve_config alone = {.block_size = 4, .num_blocks = 64, .max_num_seqs = 8, .max_num_batched_tokens = 64,
                           .max_model_len = 64};
  /* 8 tokens a step: prompts go in chunks beside the decodes; 14 blocks of 4
   * for up to 8 sequences of up to 40 tokens: preemptions */
  nb_serve_config tight = {.block_size = 4, .num_blocks = 14, .max_num_seqs = 8, .max_num_batched_tokens = 8,
                           .max_model_len = 48, .enable_prefix_caching = true};
  static draws a, t;
  run_info ia, it;
  serve(ctx, cfg, params, &alone, r, NREQ, false, interpret, &a, &ia);
  serve(ctx, cfg, params, &tight, r, NREQ, true, interpret, &t, &it);
  int diffs = compare(r, &a, &t, interpret ? "interpreted" : "compiled");
  CHECK_MSG(it.preemptions > 0 && it.hits > 0, "together: %lld preemptions, %lld prefix-cache hits: the test lost its point",
            (long long)it.preemptions, (long long)it.hits);
  int sampled = 0, greedy = 0;
  for (int i = 0; i < NREQ; i++) *(r[i].sp.temperature > 0 ? &sampled : &greedy) += r[i].n;
  printf("invariance (%s, seed %u): %d sampled and %d greedy samples bit-identical alone (%lld steps) and together (%lld steps, "
         "%lld preemptions, %lld prefix-cache hit tokens, %d executables); %d differences\n",
         interpret ? "interpreted" : "compiled", seed, sampled, greedy, (long long)ia.steps, (long long)it.steps,
         (long long)it.preemptions, (long long)it.hits, it.executables, diffs);
}

/* The whole step compiled against the interpreter. The sampler is the same
 * code in both (test_sample checks it bit for bit on the same logits), but
 * the model's compiled kernels round differently from the interpreter's
 * (about 4e-6 on these logprobs), so: logprobs within 1e-4 where the
 * tokens agree, and tokens agreeing but for a draw near a boundary (at most
 * one in twenty; a different token changes the rest of that sample). */
static void compiled_vs_interpreted(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, uint32_t seed) {
  req r[NREQ];
  make_requests(r, (int32_t)cfg->vocab_size, seed);
  nb_serve_config tight = {.block_size = 4, .num_blocks = 14, .max_num_seqs = 8, .max_num_batched_tokens = 8,
                           .max_model_len = 48, .enable_prefix_caching = true};
  static draws a, c;
  run_info ia, ic;
  serve(ctx, cfg, params, &tight, r, NREQ, true, true, &a, &ia);
  serve(ctx, cfg, params, &tight, r, NREQ, true, false, &c, &ic);
  int n = 0, same = 0;
  double worst = 0;
  for (int i = 0; i < NREQ; i++)
    for (int k = 0; k < r[i].n; k++)
      for (int j = 0; j < a.n[i][k] && j < c.n[i][k]; j++, n++) {
        const nb_serve_sample_out *x = &a.out[i][k][j], *y = &c.out[i][k][j];
        if (x->token != y->token) break;
        same++;
        double d = fabs((double)x->logprob - (double)y->logprob);
        for (int t = 0; t < x->num_top; t++) d = fmax(d, fabs((double)x->top_logprobs[t] - (double)y->top_logprobs[t]));
        worst = fmax(worst, d);
      }
  CHECK_MSG(same >= n - n / 20 && worst < 1e-4, "compiled vs interpreted: %d of %d draws agree, logprobs within %g", same, n, worst);
  printf("compiled vs interpreted step: %d of %d draws the same token, logprobs within %.2g\n", same, n, worst);
}

/* A greedy sample with strong penalties, preempted after it generated
 * tokens and recomputed (its next draw comes from a many-token chunk whose
 * context holds its output), draws what it draws alone. Two requests of
 * 3 + 20 tokens in 7 blocks of 4, the second added three steps later: it is
 * preempted after 10 tokens. (Its draws did not move when the last token
 * of a many-token chunk was left out of the penalties' inputs, nor when
 * chunks got no penalties at all: one draw follows the recompute here; the
 * random mixes above caught the second.) */
static void test_recompute_penalties(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params) {
  req r[NREQ];
  memset(r, 0, sizeof r);
  for (int i = 0; i < 2; i++) {
    r[i].len = 3, r[i].n = 1, r[i].max_tokens = MAXTOK;
    for (int j = 0; j < 3; j++) r[i].prompt[j] = 5 + 7 * i + j;
    r[i].sp = (nb_serve_sampling){.presence_penalty = 2, .frequency_penalty = 2, .repetition_penalty = 2,
                                  .temperature = i ? 0 : 0.9f, .seed = 77, .num_logprobs = 2};
  }
  /* both decode side by side; B needs blocks A holds after 16 tokens each */
  nb_serve_config tight = {.block_size = 4, .num_blocks = 7, .max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 28};
  nb_serve_config roomy = {.block_size = 4, .num_blocks = 32, .max_num_seqs = 2, .max_num_batched_tokens = 64, .max_model_len = 28};
  for (int i = 0; i < 2; i++) r[i].max_tokens = 20;
  static draws a, t;
  run_info ia, it;
  serve(ctx, cfg, params, &roomy, r, 2, false, true, &a, &ia);
  serve(ctx, cfg, params, &tight, r, 2, true, true, &t, &it);
  CHECK_MSG(it.preemptions > 0, "no preemption: the test lost its point");
  int diffs = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 20; j++)
      if (a.out[i][0][j].token != t.out[i][0][j].token || memcmp(&a.out[i][0][j].logprob, &t.out[i][0][j].logprob, sizeof(float)))
        diffs++;
  CHECK_MSG(diffs == 0 && a.n[0][0] == 20 && t.n[1][0] == 20, "recompute with penalties: %d draws differ", diffs);
  printf("recompute with penalties: %lld preemptions, 40 draws bit-identical alone and together\n", (long long)it.preemptions);
}

/* min_tokens masks the stop tokens until that many tokens are out, and a
 * large logit_bias forces its token; through the engine and the step. */
static void test_step_processors(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params) {
  nb_serve_config ec = {.block_size = 4, .num_blocks = 32, .max_num_seqs = 4, .max_num_batched_tokens = 32, .max_model_len = 32};
  const int32_t prompt[5] = {3, 1, 4, 1, 5};
  int32_t greedy[4] = {0}, masked[4] = {0}, forced[4] = {0};
  for (int pass = 0; pass < 3; pass++) {
    nb_serve_engine *e = nb_serve_engine_create(ctx, &ec);
    nb_serve_model *m = nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(e), &(nb_serve_model_opts){.interpret = true});
    int32_t stops[1] = {greedy[0]}, bias_id[1] = {17};
    float bias_val[1] = {80};
    nb_serve_sampling sp = {0};
    if (pass == 1) sp.stop_token_ids = stops, sp.num_stop_token_ids = 1, sp.min_tokens = 4;
    if (pass == 2) sp.temperature = 1, sp.seed = 5, sp.logit_bias_ids = bias_id, sp.logit_bias_values = bias_val, sp.num_logit_bias = 1;
    CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = prompt, .prompt_len = 5, .max_tokens = 4, .sampling = &sp}));
    int32_t *dst = pass == 0 ? greedy : pass == 1 ? masked : forced, n = 0;
    while (m && nb_serve_has_unfinished(e)) {
      const nb_serve_batch *b;
      nb_serve_sample_out so[4];
      int32_t nso;
      CHECK_OK(ctx, nb_serve_schedule(e, &b));
      if (nb_serve_model_step(m, b, so, &nso)) break;
      for (int32_t i = 0; i < nso; i++) {
        dst[n++] = so[i].token;
        CHECK_OK(ctx, nb_serve_append_token(e, 1, 0, so[i].token, NULL));
      }
    }
    nb_serve_model_destroy(m);
    nb_serve_engine_destroy(e);
  }
  for (int j = 0; j < 4; j++) {
    CHECK_MSG(masked[j] != greedy[0], "min_tokens 4: token %d is the masked stop token %d", j, greedy[0]);
    CHECK_MSG(forced[j] == 17, "logit_bias 80 on token 17: token %d is %d", j, forced[j]);
  }
}

static void test_vocab_errors(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params) {
  nb_serve_config ec = {.block_size = 4, .num_blocks = 16, .max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 16};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &ec);
  nb_serve_model *m = nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(e), &(nb_serve_model_opts){.interpret = true});
  int32_t ids[2] = {1, (int32_t)cfg->vocab_size}, stops[1] = {-1};
  float vals[2] = {1, 1};
  nb_serve_sampling bias = {.logit_bias_ids = ids, .logit_bias_values = vals, .num_logit_bias = 2};
  nb_serve_sampling stop = {.stop_token_ids = stops, .num_stop_token_ids = 1};
  CHECK(nb_serve_model_check_sampling(m, 4, &bias) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "sampling.logit_bias_ids[1] = 256 is outside the vocabulary [0, 256)");
  nb_ctx_clear_error(ctx);
  CHECK(nb_serve_model_check_sampling(m, 4, &stop) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "sampling.stop_token_ids[0] = -1");
  nb_ctx_clear_error(ctx);
  /* the step refuses it too, before running anything */
  const int32_t prompt[3] = {1, 2, 3};
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 9, .prompt = prompt, .prompt_len = 3, .max_tokens = 2, .sampling = &bias}));
  const nb_serve_batch *b;
  CHECK_OK(ctx, nb_serve_schedule(e, &b));
  nb_serve_sample_out so[2];
  int32_t nso;
  CHECK(nb_serve_model_step(m, b, so, &nso) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "serve request 9: sampling.logit_bias_ids[1] = 256");
  CHECK(nb_serve_model_num_executables(m) == 0);
  nb_ctx_clear_error(ctx);
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  CHECK_OK(ctx, nb_serve_register_kernels(ctx, NULL));
  size_t base = nb_ctx_bytes_in_use(ctx);
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", &cfg));
  cfg.n_layers = 2;
  cfg.init_std = 0.25; /* logits of a few units, not near-uniform ones: penalties and top_p change draws */
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &cfg, key);
  nb_array_release(key);
  test_vocab_errors(ctx, &cfg, params);
  test_step_processors(ctx, &cfg, params);
  test_recompute_penalties(ctx, &cfg, params);
  for (uint32_t seed = 1; seed <= 4; seed++) test_invariance(ctx, &cfg, params, true, seed);
  test_invariance(ctx, &cfg, params, false, 5);
  compiled_vs_interpreted(ctx, &cfg, params, 6);
  nb_tree_destroy(params);
  CHECK(nb_ctx_bytes_in_use(ctx) == base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/invariance");
}
