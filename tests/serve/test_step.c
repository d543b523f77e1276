/* The model step over scheduled batches (step.c): greedy tokens of several
 * concurrent requests of different prompt lengths, under a token budget
 * that chunks prompts and a block budget that preempts, equal the
 * single-sequence generator's tokens for each request alone (which also
 * shows batch invariance at temperature 0); the shape buckets stay bounded
 * over a long random run, a lone decode keeps one bucket as its context
 * grows, and compile time accrues only in the steps that
 * build one; bad input is refused by name; the cache write
 * updates donated caches in place, without copying them; kernels held in
 * the decode layout (pack_kernels) give the same tokens and logprobs, bit
 * for bit. */
#include <string.h>

#include "nabla/compile.h"
#include "nabla/serve.h"
#include "test.h"

enum { MAX_REQ = 8, MAX_GEN = 16 };

typedef struct run_result {
  int32_t out[MAX_REQ][MAX_GEN];
  float logprob[MAX_REQ][MAX_GEN];
  int32_t n_out[MAX_REQ];
  int64_t preemptions, steps;
  int executables;
} run_result;

/* Serves prompts[i] (lengths lens[i]) for max_tokens each through engine e
 * and model m; every request added up front. */
static void serve_on(nb_ctx *ctx, nb_serve_engine *e, nb_serve_model *m, int nreq, int32_t (*prompts)[64], const int32_t *lens,
                     int32_t max_tokens, run_result *r) {
  memset(r, 0, sizeof *r);
  for (int i = 0; i < nreq; i++)
    CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = i, .prompt = prompts[i], .prompt_len = lens[i],
                                                               .max_tokens = max_tokens}));
  for (int guard = 0; nb_serve_has_unfinished(e) && guard < 10000; guard++) {
    const nb_serve_batch *b;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    nb_serve_sample_out so[64];
    int32_t nso = 0;
    nb_status s = nb_serve_model_step(m, b, so, &nso);
    CHECK_MSG(s == NB_OK, "%s", nb_ctx_error(ctx));
    if (s) break;
    for (int32_t i = 0; i < nso; i++) {
      int64_t id = so[i].request_id;
      r->logprob[id][r->n_out[id]] = so[i].logprob;
      r->out[id][r->n_out[id]++] = so[i].token;
      CHECK_OK(ctx, nb_serve_append_token(e, id, so[i].sample_index, so[i].token, NULL));
    }
  }
  nb_serve_stats st;
  nb_serve_get_stats(e, &st);
  r->preemptions = st.num_preemptions;
  r->steps = st.num_steps;
  r->executables = nb_serve_model_num_executables(m);
}

/* serve_on with an engine and a model of their own (options mo) */
static void serve_all(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const nb_serve_config *ec, int nreq,
                      int32_t (*prompts)[64], const int32_t *lens, int32_t max_tokens, nb_serve_model_opts mo, run_result *r) {
  memset(r, 0, sizeof *r);
  nb_serve_engine *e = nb_serve_engine_create(ctx, ec);
  CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
  nb_serve_model *m = e ? nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(e), &mo) : NULL;
  CHECK_MSG(m != NULL, "%s", nb_ctx_error(ctx));
  if (m) serve_on(ctx, e, m, nreq, prompts, lens, max_tokens, r);
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
}

/* capacity > 0 (MoE presets): the model is served with that capacity in its
 * config and must run dropless, as the generator does with capacity 0 */
static void test_matches_generator(nb_ctx *ctx, const char *preset, bool interpret, double capacity) {
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, preset, &cfg));
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &cfg, key);
  nb_array_release(key);
  CHECK(params != NULL);
  enum { NREQ = 5, GEN = 10 };
  static const int32_t lens[NREQ] = {5, 23, 2, 37, 11};
  int32_t prompts[NREQ][64];
  uint32_t x = 12345;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < lens[i]; j++) prompts[i][j] = (int32_t)((x = x * 1664525u + 1013904223u) >> 8) % (int32_t)cfg.vocab_size;

  /* 8 tokens per step: prompts go in chunks next to the decodes; 20 blocks of
   * 4 tokens: the five requests need 102 slots at the end, so some wait and
   * some get preempted */
  nb_serve_config ec = {.block_size = 4, .num_blocks = 20, .max_num_seqs = 4, .max_num_batched_tokens = 8,
                        .max_model_len = 64};
  run_result r;
  nb_model_config served = cfg;
  if (capacity > 0) served.capacity_factor = capacity;
  serve_all(ctx, &served, params, &ec, NREQ, prompts, lens, GEN, (nb_serve_model_opts){.interpret = interpret, .threads = 1}, &r);
  CHECK_MSG(r.preemptions > 0, "%s: no preemption: the test lost its point", preset);

  nb_model_gen_opts go = {.interpret = interpret, .threads = 1};
  nb_model_generator *gen = nb_model_generator_create(ctx, &cfg, params, &go);
  CHECK_MSG(gen != NULL, "%s", nb_ctx_error(ctx));
  for (int i = 0; gen && i < NREQ; i++) {
    int32_t want[GEN];
    nb_model_gen_result res;
    CHECK_OK(ctx, nb_model_generate(gen, &(nb_model_gen_request){.prompt = prompts[i], .n_prompt = lens[i], .max_tokens = GEN,
                                                                  .out = want},
                                    &res));
    CHECK(res.n_tokens == GEN && r.n_out[i] == GEN);
    for (int j = 0; j < GEN; j++)
      CHECK_MSG(r.out[i][j] == want[j], "%s request %d token %d: engine %d, generator %d", preset, i, j, r.out[i][j], want[j]);
  }
  nb_model_generator_destroy(gen);
  nb_tree_destroy(params);
  printf("%s (%s): %lld steps, %lld preemptions, %d executables\n", preset, interpret ? "interpreted" : "compiled",
         (long long)r.steps, (long long)r.preemptions, r.executables);
}

/* A one-layer Llama of width 32 and vocabulary 64 (random weights from
 * key `seed`): the buckets' tests need steps, not a model. */
static nb_tree *small_llama(nb_ctx *ctx, uint64_t seed, nb_model_config *cfg) {
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", cfg));
  cfg->n_layers = 1, cfg->d_model = 32, cfg->n_heads = 2, cfg->n_kv_heads = 1, cfg->d_ff = 32, cfg->vocab_size = 64;
  nb_array *key = nb_key(ctx, seed);
  nb_tree *params = nb_model_init(ctx, cfg, key);
  nb_array_release(key);
  return params;
}

/* A long run of random requests arriving over time, a third of them with
 * penalties (the buckets with the logits processors' inputs): the
 * executables stay within the bound, the buckets of T and S (and of the
 * table width, one here) times 2. */
static void test_bounded_buckets(nb_ctx *ctx) {
  nb_model_config cfg;
  nb_tree *params = small_llama(ctx, 4, &cfg);
  nb_serve_config ec = {.block_size = 4, .num_blocks = 40, .max_num_seqs = 8, .max_num_batched_tokens = 32,
                        .max_model_len = 64};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &ec);
  nb_serve_model *m = nb_serve_model_create(ctx, &cfg, params, nb_serve_engine_config(e), &(nb_serve_model_opts){.interpret = true});
  CHECK_MSG(e && m, "%s", nb_ctx_error(ctx));
  uint32_t x = 7;
  int64_t next_id = 0, tokens = 0;
  for (int step = 0; e && m && step < 400; step++) {
    x = x * 1664525u + 1013904223u;
    if ((x >> 28) < 6 && next_id < 150) {
      int32_t p[40], n = 1 + (int32_t)((x >> 8) % 40);
      for (int j = 0; j < n; j++) p[j] = (int32_t)((x >> (j % 16)) % 64);
      nb_serve_sampling sp = {.temperature = 0.7f, .seed = x, .presence_penalty = 0.5f};
      int64_t id = next_id++;
      CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = id, .prompt = p, .prompt_len = n,
                                                                 .max_tokens = 1 + (int32_t)((x >> 4) % 20),
                                                                 .sampling = id % 3 ? NULL : &sp}));
    }
    const nb_serve_batch *b;
    CHECK_OK(ctx, nb_serve_schedule(e, &b));
    nb_serve_sample_out so[64];
    int32_t nso = 0;
    int n0 = nb_serve_model_num_executables(m);
    double c0 = nb_serve_model_compile_s(m);
    CHECK_OK(ctx, nb_serve_model_step(m, b, so, &nso));
    /* compile time accrues exactly in the steps that built a bucket */
    bool built = nb_serve_model_num_executables(m) > n0;
    CHECK_MSG(built ? nb_serve_model_compile_s(m) > c0 : nb_serve_model_compile_s(m) == c0, "step built %d: %g -> %g s", built,
              c0, nb_serve_model_compile_s(m));
    tokens += b->num_tokens;
    for (int32_t i = 0; i < nso; i++) {
      CHECK(so[i].token >= 0 && so[i].token < 64);
      CHECK_OK(ctx, nb_serve_append_token(e, so[i].request_id, so[i].sample_index, so[i].token, NULL));
    }
  }
  /* T in {8, 16, 32} with S in {1, 2, 4, 8}, and T = 1 for a lone decode
   * (S = 1); one table width (16 blocks at most, under MIN_TABLE_BLOCKS);
   * with or without processors */
  int n = nb_serve_model_num_executables(m);
  CHECK_MSG(n >= 1 && n <= (3 * 4 + 1) * 2, "%d executables", n);
  printf("bounded buckets: %lld requests, %lld tokens, %d executables (bound 26)\n", (long long)next_id, (long long)tokens, n);
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
  nb_tree_destroy(params);
}

/* A lone decode whose context grows from 3 to 3 + MAX_GEN tokens over
 * blocks of 2 (tables of 2 to 10 blocks) stays in one decode bucket: the
 * table width starts at 64 blocks, so the steps are the prompt's bucket and
 * the decode's, not a new one at every power of two of the context. */
static void test_one_decode_bucket(nb_ctx *ctx) {
  nb_model_config cfg;
  nb_tree *params = small_llama(ctx, 5, &cfg);
  int32_t prompts[1][64] = {{5, 9, 2}}, lens[1] = {3};
  nb_serve_config ec = {.block_size = 2, .num_blocks = 40, .max_num_seqs = 4, .max_num_batched_tokens = 16,
                        .max_model_len = 64};
  run_result r;
  serve_all(ctx, &cfg, params, &ec, 1, prompts, lens, MAX_GEN, (nb_serve_model_opts){.interpret = true, .threads = 1}, &r);
  CHECK(r.n_out[0] == MAX_GEN);
  CHECK_MSG(r.executables == 2, "a lone decode over a growing context built %d executables, want 2 (prompt, decode)", r.executables);
  nb_tree_destroy(params);
}

/* opts.pack_kernels: every request's tokens and logprobs bit-identical to
 * the plain layout's, compiled at two threads, with steps of 1 token (a
 * lone decode), 8, 16 and 32 (the few-rows paths of either layout and the
 * blocked one), for a dense model with biases and tied embeddings (gpt2: the
 * table held as the head's panels, also padded past a vocabulary of 250),
 * one without (llama: every kernel in panels of 64), one whose MLP and head
 * are no multiple of 64 wide (held [out, in]) and an MoE (its router [out,
 * in], its stacked experts as they were); then set_params on a packed
 * model takes [in, out] kernels and a [vocab, d] table, and refuses a wrong
 * shape by name. */
static void test_packed_kernels(nb_ctx *ctx, const char *preset, int64_t vocab, int64_t d_ff) {
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, preset, &cfg));
  if (vocab) cfg.vocab_size = vocab;
  if (d_ff) cfg.d_ff = d_ff;
  nb_array *key = nb_key(ctx, 7), *key2 = nb_key(ctx, 8);
  nb_tree *params = nb_model_init(ctx, &cfg, key), *other = nb_model_init(ctx, &cfg, key2);
  nb_array_release(key), nb_array_release(key2);
  CHECK(params && other);
  enum { NREQ = 6, GEN = 12 };
  static const int32_t lens[NREQ] = {5, 23, 2, 37, 11, 17};
  int32_t prompts[NREQ][64];
  uint32_t x = 777;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < lens[i]; j++) prompts[i][j] = (int32_t)((x = x * 1664525u + 1013904223u) >> 8) % (int32_t)cfg.vocab_size;
  nb_serve_config ec = {.block_size = 4, .num_blocks = 128, .max_num_seqs = NREQ, .max_num_batched_tokens = 32, .max_model_len = 64};
  static run_result plain, held;
  for (int nreq = 1; nreq <= NREQ; nreq += NREQ - 1) {
    serve_all(ctx, &cfg, params, &ec, nreq, prompts, lens, GEN, (nb_serve_model_opts){.threads = 2}, &plain);
    serve_all(ctx, &cfg, params, &ec, nreq, prompts, lens, GEN, (nb_serve_model_opts){.threads = 2, .pack_kernels = true}, &held);
    for (int i = 0; i < nreq; i++) {
      CHECK_MSG(plain.n_out[i] == GEN && held.n_out[i] == GEN, "%s: request %d made %d and %d tokens", preset, i, plain.n_out[i],
                held.n_out[i]);
      CHECK_MSG(!memcmp(plain.out[i], held.out[i], sizeof plain.out[i]) && !memcmp(plain.logprob[i], held.logprob[i], sizeof plain.logprob[i]),
                "%s (%d requests): request %d's tokens or logprobs differ with the kernels packed", preset, nreq, i);
    }
  }
  /* a packed model swapped to `params` from `other` serves as a fresh plain one */
  nb_serve_engine *e = nb_serve_engine_create(ctx, &ec);
  nb_serve_model *m = e ? nb_serve_model_create(ctx, &cfg, other, nb_serve_engine_config(e),
                                                &(nb_serve_model_opts){.threads = 2, .pack_kernels = true})
                        : NULL;
  CHECK_MSG(m && nb_serve_model_kernels_packed(m), "%s: pack_kernels did not take", preset);
  if (m) {
    /* a kernel of the wrong shape: refused by its path, nothing swapped */
    char kp[NB_NN_PATH_MAX] = "";
    for (size_t i = 0; i < nb_tree_size(params) && !*kp; i++) {
      const char *p = nb_tree_path(params, i);
      size_t n = strlen(p);
      if (n > 7 && !strcmp(p + n - 7, "/kernel") && nb_array_rank(nb_tree_leaf(params, i)->array) == 2) snprintf(kp, sizeof kp, "%s", p);
    }
    nb_array *good = *kp ? nb_tree_get_array(params, kp) : NULL;
    CHECK_MSG(good, "%s: no 2-D kernel to swap", preset);
    if (good) {
      nb_array_retain(good);
      nb_array *bad = nb_array_zeros(ctx, NB_F32, 2, (int64_t[2]){nb_array_dims(good)[0], nb_array_dims(good)[1] + 64});
      CHECK_OK(ctx, nb_tree_set_array(params, kp, bad));
      CHECK(nb_serve_model_set_params(m, params) == NB_ERR_SHAPE && strstr(nb_ctx_error(ctx), kp));
      CHECK_OK(ctx, nb_tree_set_array(params, kp, good));
      nb_array_release(bad), nb_array_release(good);
    }
    CHECK_OK(ctx, nb_serve_model_set_params(m, params));
    serve_on(ctx, e, m, NREQ, prompts, lens, GEN, &held);
    for (int i = 0; i < NREQ; i++)
      CHECK_MSG(!memcmp(plain.out[i], held.out[i], sizeof plain.out[i]) && !memcmp(plain.logprob[i], held.logprob[i], sizeof plain.logprob[i]),
                "%s: after set_params, request %d differs from a fresh model's", preset, i);
  }
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
  nb_tree_destroy(params), nb_tree_destroy(other);
}

/* The cache write op alone, compiled with the caches donated or not, and
 * interpreted: the slots written, the others kept. Donated caches held once
 * are the outputs' memory (no O(cache) copy per step); not donated, the
 * inputs are left alone. */
static void test_cache_write_in_place(nb_ctx *ctx) {
  enum { NB = 4, BS = 2, KVH = 2, D = 3, T = 3, N = NB * BS * KVH * D };
  int64_t cdims[4] = {NB, BS, KVH, D}, tdims[3] = {T, KVH, D}, sdims[1] = {T};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *kc = nb_graph_input(g, "k_cache", nb_aval_make(NB_F32, 4, cdims));
  nb_val *vc = nb_graph_input(g, "v_cache", nb_aval_make(NB_F32, 4, cdims));
  nb_val *k = nb_graph_input(g, "k", nb_aval_make(NB_F32, 3, tdims));
  nb_val *v = nb_graph_input(g, "v", nb_aval_make(NB_F32, 3, tdims));
  nb_val *sm = nb_graph_input(g, "slot_mapping", nb_aval_make(NB_I32, 1, sdims));
  nb_val *ko = NULL, *vo = NULL;
  CHECK_OK(ctx, nb_serve_kv_cache_write_op(kc, vc, k, v, sm, &ko, &vo));
  CHECK_OK(ctx, nb_graph_output(g, "k_cache", ko));
  CHECK_OK(ctx, nb_graph_output(g, "v_cache", vo));
  float cache[N], kv[T * KVH * D];
  for (int i = 0; i < N; i++) cache[i] = (float)i;
  for (int i = 0; i < T * KVH * D; i++) kv[i] = -1.0f - (float)i;
  int32_t slots[T] = {5, -1, 0}; /* token 1 is padding */
  float want[N];
  memcpy(want, cache, sizeof cache);
  for (int t = 0; t < T; t++)
    if (slots[t] >= 0) memcpy(want + slots[t] * KVH * D, kv + t * KVH * D, sizeof(float) * KVH * D);
  const char *donate[] = {"k_cache", "v_cache", NULL};
  for (int mode = 0; mode < 3; mode++) { /* 0: compiled, donated; 1: compiled; 2: interpreted */
    nb_jit_opts o = {.donate = mode == 0 ? donate : NULL};
    nb_exe *exe = mode < 2 ? nb_jit(ctx, g, &o) : NULL;
    CHECK(mode == 2 || exe != NULL);
    nb_array *in[5] = {nb_array_create(ctx, NB_F32, 4, cdims, cache), nb_array_create(ctx, NB_F32, 4, cdims, cache),
                       nb_array_create(ctx, NB_F32, 3, tdims, kv), nb_array_create(ctx, NB_F32, 3, tdims, kv),
                       nb_array_create(ctx, NB_I32, 1, sdims, slots)};
    const void *kc_mem = nb_array_data(in[0]), *vc_mem = nb_array_data(in[1]);
    nb_array *out[2] = {NULL, NULL};
    CHECK_OK(ctx, mode < 2 ? nb_exe_run_flat(exe, in, out) : nb_graph_run_flat(ctx, g, in, out));
    for (int c = 0; c < 2 && out[c]; c++) {
      CHECK_MSG(memcmp(nb_array_data(out[c]), want, sizeof want) == 0, "mode %d: cache %d written wrong", mode, c);
      bool same = nb_array_data(out[c]) == (c ? vc_mem : kc_mem);
      CHECK_MSG(same == (mode == 0), "mode %d: cache %d %s", mode, c, same ? "overwrote a kept input" : "was copied, not updated in place");
      if (mode) CHECK_MSG(memcmp(nb_array_data(in[c]), cache, sizeof cache) == 0, "mode %d: input cache %d changed", mode, c);
    }
    for (int i = 0; i < 5; i++) nb_array_release(in[i]);
    for (int i = 0; i < 2; i++) nb_array_release(out[i]);
    nb_exe_destroy(exe);
  }
  nb_graph_destroy(g);
}

static void test_errors(nb_ctx *ctx) {
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, "mixtral-tiny", &cfg));
  nb_tree *spec = nb_model_param_spec(ctx, &cfg, NB_F32);
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", &cfg));
  nb_serve_config empty = {0};
  CHECK(nb_serve_model_create(ctx, &cfg, spec, &empty, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_model_len");
  nb_ctx_clear_error(ctx);
  nb_tree_destroy(spec);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  /* the custom calls' registry lives until the context goes: count from here */
  CHECK_OK(ctx, nb_serve_register_kernels(ctx, NULL));
  size_t base = nb_ctx_bytes_in_use(ctx);
  test_errors(ctx);
  test_cache_write_in_place(ctx);
  test_matches_generator(ctx, "llama-tiny", true, 0);
  test_matches_generator(ctx, "gpt2-tiny", true, 0);
  test_matches_generator(ctx, "mixtral-tiny", true, 0);
  test_matches_generator(ctx, "mixtral-tiny", true, 1.0);
  test_matches_generator(ctx, "llama-tiny", false, 0);
  test_bounded_buckets(ctx);
  test_one_decode_bucket(ctx);
  test_packed_kernels(ctx, "llama-tiny", 0, 0);
  test_packed_kernels(ctx, "llama-tiny", 250, 392); /* MLP and head [out, in] */
  test_packed_kernels(ctx, "gpt2-tiny", 0, 0);      /* the tied table as the head's panels */
  test_packed_kernels(ctx, "gpt2-tiny", 250, 0);    /* ... padded past the vocabulary */
  test_packed_kernels(ctx, "mixtral-tiny", 0, 0);
  CHECK(nb_ctx_bytes_in_use(ctx) == base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/step");
}
