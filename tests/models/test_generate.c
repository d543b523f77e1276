/* Generation: the sampler's semantics (greedy, top-k support, top-p,
 * empirical frequencies against the softmax, key determinism), the
 * generator against re-running the full forward every step (GPT-2 and
 * Llama, chunked prefill with a padded tail, compiled and interpreted),
 * seeds, the context bound, and loading a run directory / checkpoint step
 * made here the way the trainer makes them. */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_test_util.h"

/* ---------------------------------------------------------------- the sampler */

typedef struct sample_job {
  nb_model_sample_opts o;
} sample_job;

static nb_status sample_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sample_job *j = u;
  nb_val *t = nb_model_sample(nb_tree_get_val(in, "logits"), nb_tree_get_val(in, "key"), &j->o);
  return nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "t", t);
}

/* draws one id for each of n rows holding the same logits[v]; counts[v] */
static nb_array *draw(nb_ctx *ctx, const double *logits, int64_t v, int64_t n, uint64_t seed, nb_model_sample_opts o) {
  double *rows = malloc((size_t)(n * v) * sizeof *rows);
  for (int64_t i = 0; i < n * v; i++) rows[i] = logits[i % v];
  nb_array *l = nb_array_from_f64(ctx, NB_F32, 2, (int64_t[2]){n, v}, rows), *key = nb_key(ctx, seed);
  free(rows);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "logits", l);
  nb_tree_set_array(in, "key", key);
  sample_job j = {o};
  nb_graph *g = nb_trace(ctx, sample_fn, &j, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_array *t = NULL;
  if (g && nb_graph_run(ctx, g, in, out) == NB_OK) {
    t = nb_tree_get_array(out, "t");
    nb_array_retain(t);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_array_release(l);
  nb_array_release(key);
  return t;
}

static void softmax(const double *x, int64_t v, double temp, const bool *keep, double *p) {
  double m = -INFINITY, z = 0;
  for (int64_t i = 0; i < v; i++)
    if (keep[i]) m = fmax(m, x[i] / temp);
  for (int64_t i = 0; i < v; i++) z += p[i] = keep[i] ? exp(x[i] / temp - m) : 0;
  for (int64_t i = 0; i < v; i++) p[i] /= z;
}

/* frequencies of n draws within 5 binomial standard deviations of p, and
 * nothing drawn outside keep */
static void check_freqs(const char *what, const nb_array *t, const double *p, const bool *keep, int64_t v, int64_t n) {
  CHECK_MSG(t && nb_array_size(t) == n, "%s: no draws", what);
  if (!t) return;
  double count[16] = {0};
  int64_t outside = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = (int64_t)nb_array_get(t, i);
    if (id < 0 || id >= v || !keep[id]) outside++;
    else count[id]++;
  }
  CHECK_MSG(outside == 0, "%s: %lld draws outside the kept set", what, (long long)outside);
  for (int64_t i = 0; i < v; i++) {
    double f = count[i] / (double)n, sd = sqrt(p[i] * (1 - p[i]) / (double)n);
    CHECK_MSG(fabs(f - p[i]) <= 5 * sd + 1e-12, "%s: id %lld drawn %.4f of the time, softmax says %.4f (sd %.4f)", what,
              (long long)i, f, p[i], sd);
  }
}

static void test_sampler(nb_ctx *ctx) {
  const double x[6] = {1.0, 0.5, 0.0, -0.5, 2.0, 1.0}; /* a tie (ids 0 and 5) on purpose */
  const int64_t V = 6, N = 20000;
  bool all[6] = {1, 1, 1, 1, 1, 1};
  double p[6];
  /* plain categorical at temperatures 1 and 0.5 */
  double temps[2] = {1.0, 0.5};
  for (int k = 0; k < 2; k++) {
    nb_array *t = draw(ctx, x, V, N, 7 + k, (nb_model_sample_opts){.temperature = temps[k]});
    softmax(x, V, temps[k], all, p);
    check_freqs(k ? "temperature 0.5" : "temperature 1", t, p, all, V, N);
    nb_array_release(t);
  }
  /* top-k 3: ids 4, 0, 5 (the tie with 0 keeps both 0 and 5 here since k=3) */
  bool top3[6] = {1, 0, 0, 0, 1, 1};
  nb_array *t = draw(ctx, x, V, N, 11, (nb_model_sample_opts){.temperature = 1, .top_k = 3});
  softmax(x, V, 1, top3, p);
  check_freqs("top_k 3", t, p, top3, V, N);
  nb_array_release(t);
  /* top-k 2 with a tie at the boundary: the lower id (0) wins */
  bool top2[6] = {1, 0, 0, 0, 1, 0};
  t = draw(ctx, x, V, N, 12, (nb_model_sample_opts){.temperature = 1, .top_k = 2});
  softmax(x, V, 1, top2, p);
  check_freqs("top_k 2", t, p, top2, V, N);
  nb_array_release(t);
  /* top-p: the sorted masses are 0.459 (id 4), 0.169 (0), 0.169 (5; the
   * tie sorts after id 0), 0.103 (1), ...; a token stays while the mass
   * before it is below p */
  softmax(x, V, 1, all, p);
  CHECK(p[4] < 0.6 && p[4] + p[0] >= 0.6 && p[4] + p[0] < 0.7 && p[4] + p[0] + p[5] >= 0.7);
  double ps[2] = {0.6, 0.7};
  bool nucleus[2][6] = {{1, 0, 0, 0, 1, 0}, {1, 0, 0, 0, 1, 1}};
  for (int k = 0; k < 2; k++) {
    char what[32];
    snprintf(what, sizeof what, "top_p %.1f", ps[k]);
    t = draw(ctx, x, V, N, 13 + k, (nb_model_sample_opts){.temperature = 1, .top_p = ps[k]});
    softmax(x, V, 1, nucleus[k], p);
    check_freqs(what, t, p, nucleus[k], V, N);
    nb_array_release(t);
  }
  /* top-p tiny and top-k 1 are greedy; temperature 0 is argmax */
  nb_model_sample_opts greedy_like[3] = {{.temperature = 1, .top_p = 1e-6}, {.temperature = 3, .top_k = 1}, {.temperature = 0}};
  for (int k = 0; k < 3; k++) {
    t = draw(ctx, x, V, 500, 20 + k, greedy_like[k]);
    int64_t not4 = 0;
    for (int64_t i = 0; t && i < 500; i++) not4 += nb_array_get(t, i) != 4;
    CHECK_MSG(t && not4 == 0, "greedy-like option set %d drew a non-argmax id %lld times", k, (long long)not4);
    nb_array_release(t);
  }
  /* the same key draws the same, another key differs */
  nb_model_sample_opts o = {.temperature = 1};
  nb_array *a = draw(ctx, x, V, 64, 5, o), *b = draw(ctx, x, V, 64, 5, o), *c = draw(ctx, x, V, 64, 6, o);
  CHECK(a && b && c && nb_array_equal(a, b) && !nb_array_equal(a, c));
  nb_array_release(a);
  nb_array_release(b);
  nb_array_release(c);
  /* misuse is a named error */
  nb_graph *g = nb_graph_create(ctx);
  nb_val *l3 = nb_graph_input(g, "l", nb_aval_make(NB_F32, 3, (int64_t[3]){1, 2, 3}));
  nb_val *key = nb_graph_input(g, "k", nb_aval_make(NB_U32, 1, (int64_t[1]){2}));
  nb_model_sample(l3, key, &o);
  CHECK(nb_graph_status(g) != NB_OK); /* the message is the context's, as for every traced error */
  CHECK_ERR(ctx, NB_ERR_SHAPE, "sample: logits must be float [B, V] with V >= 1, not f32[1,2,3]");
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- the generator */

static nb_model_config tiny(const char *preset) { return tiny_config(preset, 40); }

/* greedy continuation by running the full forward on the whole sequence for
 * every new token (the interpreter, no cache) */
static void greedy_reference(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, const int32_t *prompt, int64_t n,
                             int64_t steps, int32_t *out) {
  int32_t seq[64];
  memcpy(seq, prompt, (size_t)n * sizeof *seq);
  for (int64_t s = 0; s < steps; s++) {
    int64_t len = n + s;
    nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, len}, seq);
    nb_tree *batch = nb_tree_create(ctx), *in = nb_tree_create(ctx), *res = nb_tree_create(ctx);
    nb_tree_set_array(batch, "inputs", tok);
    nb_graph *g = nb_model_trace_forward(ctx, c, NULL, params, batch);
    nb_tree_merge(in, "params", params);
    nb_tree_merge(in, "batch", batch);
    CHECK_OK(ctx, nb_graph_run(ctx, g, in, res));
    nb_array *lg = nb_tree_get_array(res, "logits");
    int32_t best = 0;
    for (int64_t v = 1; lg && v < c->vocab_size; v++)
      if (nb_array_get(lg, (len - 1) * c->vocab_size + v) > nb_array_get(lg, (len - 1) * c->vocab_size + best)) best = (int32_t)v;
    out[s] = seq[len] = best;
    nb_graph_destroy(g);
    nb_tree_destroy(batch);
    nb_tree_destroy(in);
    nb_tree_destroy(res);
    nb_array_release(tok);
  }
}

typedef struct collected {
  int32_t ids[64];
  int n, stop_after;
} collected;

static bool collect(void *ud, int32_t t) {
  collected *c = ud;
  c->ids[c->n++] = t;
  return c->n != c->stop_after;
}

static void test_greedy(nb_ctx *ctx, const char *preset, bool interpret, bool sampler_variants) {
  nb_model_config c = tiny(preset);
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &c, key);
  /* 19 prompt tokens: one full chunk of 16 and a tail of 3 padded to 8 */
  int32_t prompt[19], want[12], got[12];
  for (int i = 0; i < 19; i++) prompt[i] = (int32_t)((i * 7 + 3) % 32);
  greedy_reference(ctx, &c, params, prompt, 19, 12, want);
  nb_model_gen_opts go = {.prefill_chunk = 16, .interpret = interpret};
  nb_model_generator *gen = nb_model_generator_create(ctx, &c, params, &go);
  CHECK_MSG(gen, "%s", nb_ctx_error(ctx));
  collected col = {.n = 0};
  nb_model_gen_request r = {.prompt = prompt, .n_prompt = 19, .max_tokens = 12, .on_token = collect, .ud = &col, .out = got};
  nb_model_gen_result res;
  if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK_MSG(gen && res.n_tokens == 12 && col.n == 12 && !res.stopped && !res.truncated, "%s: %lld tokens", preset,
            gen ? (long long)res.n_tokens : -1LL);
  CHECK_MSG(!memcmp(got, want, sizeof want) && !memcmp(col.ids, want, sizeof want), "%s%s: greedy ids differ from the full forward's",
            preset, interpret ? " (interpreted)" : "");
  printf("%s%s greedy: %d %d %d %d ... (reference %d %d %d %d ...)\n", preset, interpret ? " interpreted" : "", got[0], got[1],
         got[2], got[3], want[0], want[1], want[2], want[3]);
  /* top_k 1 at any temperature is the same path through the sampler. The
   * variants below compile more executables, so the compiled runs (the
   * fast path, tested once per family above) leave them to the interpreter
   * run, which shares everything else: a cold compile cache is the cost of
   * this test. */
  if (sampler_variants) {
    r.sample = (nb_model_sample_opts){.temperature = 2, .top_k = 1};
    memset(got, 0, sizeof got);
    if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
    CHECK_MSG(!memcmp(got, want, sizeof want), "%s: top_k 1 differs from greedy", preset);
  }
  if (interpret) {
    /* a third option set: its third executable grows the generator's list
     * while the first two are in use */
    r.sample = (nb_model_sample_opts){.temperature = 0.5, .top_k = 1, .top_p = 0.5};
    memset(got, 0, sizeof got);
    if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
    CHECK_MSG(!memcmp(got, want, sizeof want), "%s: top_k 1 (third option set) differs from greedy", preset);
  }
  /* a stop id ends generation after emitting it; the callback can stop too */
  r.sample = (nb_model_sample_opts){0};
  r.stop = &want[4];
  r.n_stop = 1;
  if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  int first = 0;
  while (want[first] != want[4]) first++;
  CHECK_MSG(gen && res.stopped && res.n_tokens == first + 1, "%s: stop id: %lld tokens, wanted %d", preset, (long long)res.n_tokens,
            first + 1);
  r.n_stop = 0;
  col.n = 0;
  col.stop_after = 3;
  if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK(gen && res.n_tokens == 3 && !res.stopped);
  nb_model_generator_destroy(gen);
  /* chunks of 8: two full ones and a tail of 3; one chunk of 32 (tail 19 padded to 32) */
  int64_t chunks[2] = {8, 32};
  for (int k = 0; interpret && k < 2; k++) {
    go.prefill_chunk = chunks[k];
    gen = nb_model_generator_create(ctx, &c, params, &go);
    memset(got, 0, sizeof got);
    r = (nb_model_gen_request){.prompt = prompt, .n_prompt = 19, .max_tokens = 12, .out = got};
    if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
    CHECK_MSG(!memcmp(got, want, sizeof want), "%s: prefill chunk %lld changes the greedy ids", preset, (long long)chunks[k]);
    nb_model_generator_destroy(gen);
  }
  nb_tree_destroy(params);
  nb_array_release(key);
}

static void test_seeds_and_bounds(nb_ctx *ctx) {
  nb_model_config c = tiny("llama-tiny");
  nb_array *key = nb_key(ctx, 9);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_model_gen_opts go = {.max_seq_len = 24, .prefill_chunk = 8};
  nb_model_generator *gen = nb_model_generator_create(ctx, &c, params, &go);
  CHECK_MSG(gen, "%s", nb_ctx_error(ctx));
  if (!gen) return;
  CHECK(nb_model_generator_max_seq_len(gen) == 24);
  int32_t prompt[5] = {1, 2, 3, 4, 5}, a[16], b[16], d[16], e[16];
  nb_model_gen_request r = {.prompt = prompt, .n_prompt = 5, .max_tokens = 16, .seed = 42,
                            .sample = {.temperature = 1.5, .top_p = 0.95}};
  nb_model_gen_result res;
  r.out = a;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  r.out = b;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  r.out = d;
  r.seed = 43;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK_MSG(!memcmp(a, b, sizeof a), "the same seed gave different tokens");
  CHECK_MSG(memcmp(a, d, sizeof a), "seeds 42 and 43 gave the same 16 tokens");
  /* temperature 0 is deterministic whatever the seed */
  r.sample = (nb_model_sample_opts){0};
  r.out = a;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  r.seed = 1;
  r.out = e;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK(!memcmp(a, e, sizeof a));
  /* the context bound: 5 + 19 = 24 tokens, then truncated */
  int32_t many[64];
  r.out = many;
  r.max_tokens = 64;
  CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK_MSG(res.truncated && res.n_tokens == 19, "truncated %d after %lld tokens", res.truncated, (long long)res.n_tokens);
  int32_t long_prompt[24] = {0};
  r.prompt = long_prompt;
  r.n_prompt = 24;
  CHECK(nb_model_generate(gen, &r, &res) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "the prompt has 24 tokens but the context holds 24");
  r.n_prompt = 3;
  long_prompt[1] = 32;
  CHECK(nb_model_generate(gen, &r, &res) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "prompt token 1 is id 32, outside the vocabulary [0, 32)");
  nb_model_generator_destroy(gen);
  /* options and params are checked at creation */
  go.max_seq_len = 41;
  CHECK(!nb_model_generator_create(ctx, &c, params, &go));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_seq_len 41 must be in [2, model.max_seq_len = 40]");
  nb_tree_remove(params, "layers/1/mlp/wo/kernel");
  CHECK(!nb_model_generator_create(ctx, &c, params, NULL));
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "parameter 'layers/1/mlp/wo/kernel' is missing");
  nb_tree_destroy(params);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- loading a run dir */

static void test_run_dir(nb_ctx *ctx) {
  char dir[256];
  nb_test_scratch_dir(dir, sizeof dir, "models", "gen");
  nb_train_config rc;
  nb_train_config_defaults(&rc);
  CHECK_OK(ctx, nb_train_config_set(ctx, &rc, "model.preset=gpt2-tiny"));
  rc.model = tiny("gpt2-tiny");
  rc.data.seq_len = 32;
  char p[400];
  snprintf(p, sizeof p, "%s/config.yaml", dir);
  write_run_config(p, &rc);
  nb_array *key = nb_key(ctx, 4);
  nb_tree *params = nb_model_init(ctx, &rc.model, key);
  snprintf(p, sizeof p, "%s/checkpoints", dir);
  nb_model_loaded m;
  /* no committed step yet */
  nb_ckpt_options o = {.directory = p};
  nb_ckpt_manager *mgr = nb_ckpt_manager_create(ctx, &o);
  nb_ckpt_manager_destroy(mgr);
  CHECK(nb_train_load_run_dir(ctx, dir, NULL, &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "holds no committed checkpoint step");
  mgr = nb_ckpt_manager_create(ctx, &o);
  nb_ckpt_item items[1] = {{"params", params}};
  CHECK_OK(ctx, nb_ckpt_save(mgr, 3, items, 1, NULL, NULL));
  CHECK_OK(ctx, nb_ckpt_save(mgr, 5, items, 1, NULL, NULL));
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(mgr));
  char step[400];
  CHECK_OK(ctx, nb_ckpt_step_path(mgr, 5, step, sizeof step));
  nb_ckpt_manager_destroy(mgr);
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, dir, NULL, &m));
  CHECK(m.params && !m.tok && m.cfg.family == NB_MODEL_GPT2 && m.cfg.d_model == 16 && strstr(m.what, "step 5"));
  CHECK(m.params && nb_tree_size(m.params) == nb_tree_size(params));
  for (size_t i = 0; m.params && i < nb_tree_size(params); i++)
    CHECK(nb_array_equal(nb_tree_get_array(m.params, nb_tree_path(params, i)), nb_tree_leaf(params, i)->array));
  nb_model_loaded_free(&m);
  CHECK_OK(ctx, nb_train_load_checkpoint(ctx, step, NULL, &m));
  CHECK(m.params && nb_tree_size(m.params) == nb_tree_size(params));
  nb_model_loaded_free(&m);
  /* errors name what is missing */
  CHECK(nb_train_load_run_dir(ctx, "/nonexistent/run", NULL, &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "run dir '/nonexistent/run' does not exist");
  snprintf(p, sizeof p, "%s/config.yaml", dir);
  FILE *f = fopen(p, "w");
  fprintf(f, "model:\n  preset: gpt2-tiny\n  d_model: 32\n");
  fclose(f);
  CHECK(nb_train_load_run_dir(ctx, dir, NULL, &m) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "parameter 'embed/embedding' is f32[32,16], the model config wants f32[256,32]");
  /* one layer fewer than the weights (and no config stored with them): layer n-1's weights have no place */
  nb_train_config less = rc;
  less.model.n_layers = rc.model.n_layers - 1;
  write_run_config(p, &less);
  CHECK(nb_train_load_run_dir(ctx, dir, NULL, &m) == NB_ERR_SHAPE);
  char layer[64];
  snprintf(layer, sizeof layer, "parameter 'layers/%lld/", (long long)less.model.n_layers);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "does not match the weights"), "%s", nb_ctx_error(ctx));
  CHECK_ERR(ctx, NB_ERR_SHAPE, layer);
  snprintf(rc.data.tokenizer, sizeof rc.data.tokenizer, "no_such_tokenizer.json");
  write_run_config(p, &rc);
  CHECK(nb_train_load_checkpoint(ctx, step, NULL, &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "data.tokenizer 'no_such_tokenizer.json' not found");
  unlink(p);
  CHECK(nb_train_load_run_dir(ctx, dir, NULL, &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "no config.yaml");
  CHECK(nb_train_load_checkpoint(ctx, step, NULL, &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "give one with --config");
  CHECK(nb_test_rm_rf(dir) == 0);
  nb_tree_destroy(params);
  nb_array_release(key);
}

/* The config the trainer stores in a checkpoint's metadata is the model the
 * weights are: a config that differs where no shape shows (heads, the
 * activation) is refused, naming the keys. */
static void test_stored_config(nb_ctx *ctx) {
  char dir[256], p[400], step[400];
  nb_test_scratch_dir(dir, sizeof dir, "models", "stored");
  nb_train_config rc;
  nb_train_config_defaults(&rc);
  CHECK_OK(ctx, nb_train_config_set(ctx, &rc, "model.preset=gpt2-tiny"));
  rc.model = tiny("gpt2-tiny");
  rc.data.seq_len = 32;
  snprintf(p, sizeof p, "%s/config.yaml", dir);
  write_run_config(p, &rc);
  char *yaml = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&yaml, &len);
  nb_train_config_write(&rc, mem);
  fclose(mem);
  cJSON *meta = cJSON_CreateObject();
  cJSON_AddStringToObject(meta, "config", yaml);
  char *meta_text = cJSON_PrintUnformatted(meta);
  nb_array *key = nb_key(ctx, 4);
  nb_tree *params = nb_model_init(ctx, &rc.model, key);
  snprintf(p, sizeof p, "%s/checkpoints", dir);
  nb_ckpt_manager *mgr = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = p});
  nb_ckpt_item items[1] = {{"params", params}};
  CHECK_OK(ctx, nb_ckpt_save(mgr, 7, items, 1, &(nb_ckpt_save_opts){.metadata_json = meta_text}, NULL));
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(mgr));
  CHECK_OK(ctx, nb_ckpt_step_path(mgr, 7, step, sizeof step));
  nb_ckpt_manager_destroy(mgr);
  nb_model_loaded m;
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, dir, NULL, &m));
  nb_model_loaded_free(&m);
  /* two heads instead of four, GELU's exact form: every shape the same */
  rc.model.n_heads = rc.model.n_kv_heads = 2;
  rc.model.act = rc.model.act == NB_NN_GELU ? NB_NN_GELU_TANH : NB_NN_GELU;
  snprintf(p, sizeof p, "%s/other.yaml", dir);
  write_run_config(p, &rc);
  CHECK(nb_train_load_run_dir(ctx, dir, p, &m) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.n_heads, model.n_kv_heads, model.act differ");
  CHECK(nb_train_load_checkpoint(ctx, step, p, &m) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "describes another model than the one these weights were trained as");
  free(meta_text);
  cJSON_Delete(meta);
  free(yaml);
  nb_tree_destroy(params);
  nb_array_release(key);
  CHECK(nb_test_rm_rf(dir) == 0);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_sampler(ctx);
  test_greedy(ctx, "gpt2-tiny", false, false);
  test_greedy(ctx, "llama-tiny", false, true);
  test_greedy(ctx, "gpt2-tiny", true, true);
  test_greedy(ctx, "llama-tiny", true, true);
  test_seeds_and_bounds(ctx);
  test_run_dir(ctx);
  test_stored_config(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/generate");
}
