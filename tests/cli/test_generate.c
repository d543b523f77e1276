/* `nabla generate` as a client of the serving engine, on the tiny Hugging
 * Face Llama of tests/models/golden: greedy text and ids are byte for byte
 * those of the generator-based command (tests/cli/golden, made before the
 * move) and of nb_model_generate called here; a seeded sampled run is the
 * same across runs, thread counts and --n (sample 0 alone or with a
 * sibling), and is the engine's stream (nb_serve_llm with the same
 * sampling); options that reduce to greedy do; an eos token ends the
 * output; bad options are refused by name. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "testfs.h"

#define HF "tests/models/golden/hf_llama_tiny"
#define PROMPT "The tokenizer learned its merges"

static const char *bin;
static char src[4096], out[1 << 16], err[1 << 16], work[4096];

/* runs "nabla generate ARGS" (printf-formatted) in the scratch directory;
 * stdout in out, stderr in err */
static char generate_cmd[4200];
#define generate(...) nb_test_run_in(work, generate_cmd, out, sizeof out, err, sizeof err, __VA_ARGS__)

/* The ids of the line "what: ..." of text, at most cap; -1 when absent. */
static int parse_ids(const char *text, const char *what, int32_t *ids, int cap) {
  size_t k = strlen(what);
  const char *p = text;
  while (p && (strncmp(p, what, k) || p[k] != ':')) p = (p = strchr(p, '\n')) ? p + 1 : NULL;
  if (!p) return -1;
  p += k + 1;
  int n = 0;
  for (char *end; *p && *p != '\n' && n < cap; p = end) {
    long v = strtol(p, &end, 10);
    if (end == p) break;
    ids[n++] = (int32_t)v;
  }
  return n;
}

static bool same_ids(const int32_t *a, int na, const int32_t *b, int nb) {
  return na == nb && na >= 0 && !memcmp(a, b, (size_t)na * sizeof *a);
}

/* ---------------------------------------------------------------- greedy: unchanged */

/* tests/cli/golden/generate_hf_<tag>.{stdout,ids} against the command now */
static void check_golden(const char *tag, const char *args) {
  char path[4200];
  size_t n_want = 0, n_ids = 0;
  snprintf(path, sizeof path, "%s/tests/cli/golden/generate_hf_%s.stdout", src, tag);
  char *want = nb_test_read_file(path, &n_want);
  snprintf(path, sizeof path, "%s/tests/cli/golden/generate_hf_%s.ids", src, tag);
  char *want_ids = nb_test_read_file(path, &n_ids);
  CHECK_MSG(want && want_ids, "cannot read the golden files of case %s", tag);
  int rc = generate("--hf '%s/" HF "' --temperature 0 --show-ids %s", src, args);
  CHECK_MSG(rc == 0, "case %s: rc %d: %s", tag, rc, err);
  if (want) CHECK_MSG(strlen(out) == n_want && !memcmp(out, want, n_want), "case %s: stdout differs from the golden's", tag);
  if (want_ids) CHECK_MSG(!strncmp(err, want_ids, n_ids), "case %s: ids differ:\n%.*s\nwant\n%s", tag, (int)n_ids, err, want_ids);
  free(want);
  free(want_ids);
}

static void test_golden(void) {
  check_golden("a", "--prompt '" PROMPT "' --max-tokens 40 --threads 1");
  CHECK_MSG(strstr(err, "generated 40 (max tokens)"), "%s", err);
  check_golden("b", "--prompt '" PROMPT "' --max-tokens 60 --threads 1");
  CHECK_MSG(strstr(err, "generated 45 (context full"), "%s", err);
  check_golden("c", "--prompt merges --no-bos --max-tokens 30 --threads 2");
}

/* The generator of the models library on another prompt, and --n 2 greedy:
 * every sample is the generator's continuation. */
static void test_against_generator(nb_ctx *ctx, nb_model_loaded *m) {
  const char *prompt = "merges merge the tokenizer";
  nb_tok_ids enc = {0};
  CHECK_OK(ctx, nb_tok_encode(m->tok, prompt, strlen(prompt), NULL, &enc));
  int32_t ids[64], want[32], got[64];
  int n = 0;
  ids[n++] = m->bos_id;
  for (size_t i = 0; i < enc.len && n < 64; i++) ids[n++] = enc.ids[i];
  nb_tok_ids_free(m->tok, &enc);
  nb_model_generator *gen = nb_model_generator_create(ctx, &m->cfg, m->params, &(nb_model_gen_opts){.max_seq_len = 64});
  CHECK_MSG(gen, "%s", nb_ctx_error(ctx));
  nb_model_gen_result res = {0};
  nb_model_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = 24, .stop = m->eos_ids, .n_stop = m->n_eos, .out = want};
  if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  nb_model_generator_destroy(gen);
  int rc = generate("--hf '%s/" HF "' --prompt '%s' --temperature 0 --max-tokens 24 --show-ids --threads 2", src, prompt);
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  CHECK(same_ids(got, parse_ids(err, "prompt ids", got, 64), ids, n));
  CHECK_MSG(same_ids(got, parse_ids(err, "generated ids", got, 64), want, (int)res.n_tokens), "%s", err);
  rc = generate("--hf '%s/" HF "' --prompt '%s' --temperature 0 --max-tokens 24 --show-ids --n 2", src, prompt);
  CHECK_MSG(rc == 0 && strstr(out, "--- sample 0\n") && strstr(out, "--- sample 1\n"), "rc %d: %s%s", rc, out, err);
  for (int k = 0; k < 2; k++) {
    char what[64];
    snprintf(what, sizeof what, "generated ids [sample %d]", k);
    CHECK_MSG(same_ids(got, parse_ids(err, what, got, 64), want, (int)res.n_tokens), "sample %d: %s", k, err);
  }
}

/* ---------------------------------------------------------------- sampling */

/* The engine's tokens for one request with this sampling, n = 1. */
static int engine_ids(nb_ctx *ctx, nb_model_loaded *m, const int32_t *prompt, int n_prompt, const nb_serve_sampling *sp,
                      int max_tokens, int32_t *ids) {
  nb_serve_llm_config lc = {.engine = {.block_size = 16, .num_blocks = 4, .max_num_seqs = 1, .max_num_batched_tokens = 64,
                                       .max_model_len = 64},
                            .eos_token_ids = m->eos_ids, .num_eos_token_ids = m->n_eos};
  nb_serve_llm *l = nb_serve_llm_create(ctx, &m->cfg, m->params, &lc);
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  if (!l) return -1;
  nb_serve_llm_request r = {.r = {.id = 1, .prompt = prompt, .prompt_len = n_prompt, .max_tokens = max_tokens, .sampling = sp}};
  CHECK_OK(ctx, nb_serve_llm_add(l, &r));
  int n = 0;
  for (int guard = 0; nb_serve_llm_has_unfinished(l) && guard < 1000; guard++) {
    const nb_serve_event *ev;
    int32_t n_ev = 0;
    if (nb_serve_llm_step(l, &ev, &n_ev)) break;
    for (int32_t i = 0; i < n_ev; i++) ids[n++] = ev[i].s.token;
  }
  nb_serve_llm_destroy(l);
  return n;
}

static void test_seeded(nb_ctx *ctx, nb_model_loaded *m) {
  const char *opts = "--prompt '" PROMPT "' --temperature 0.9 --top-p 0.95 --seed 7 --max-tokens 30 --show-ids";
  static char first_out[1 << 16];
  int32_t a[64], b[64], greedy[64], prompt[64];
  int rc = generate("--hf '%s/" HF "' %s --threads 1", src, opts);
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  snprintf(first_out, sizeof first_out, "%s", out);
  int na = parse_ids(err, "generated ids", a, 64), n_prompt = parse_ids(err, "prompt ids", prompt, 64);
  CHECK_MSG(na > 0, "%s", err);
  int ng = 0;
  for (int threads = 1; threads <= 2; threads++) {
    rc = generate("--hf '%s/" HF "' %s --threads %d", src, opts, threads);
    CHECK_MSG(rc == 0 && !strcmp(out, first_out), "--threads %d: rc %d, '%s' != '%s'", threads, rc, out, first_out);
    CHECK_MSG(same_ids(b, parse_ids(err, "generated ids", b, 64), a, na), "--threads %d: %s", threads, err);
  }
  /* sample 0 with a sibling is sample 0 alone; the sibling draws its own */
  rc = generate("--hf '%s/" HF "' %s --n 2", src, opts);
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  CHECK_MSG(same_ids(b, parse_ids(err, "generated ids [sample 0]", b, 64), a, na), "%s", err);
  int n1 = parse_ids(err, "generated ids [sample 1]", b, 64);
  CHECK_MSG(n1 > 0 && !same_ids(b, n1, a, na), "%s", err);
  /* it samples (not greedy), and it is the engine's stream for this seed */
  rc = generate("--hf '%s/" HF "' --prompt '" PROMPT "' --temperature 0 --max-tokens 30 --show-ids", src);
  ng = parse_ids(err, "generated ids", greedy, 64);
  CHECK_MSG(rc == 0 && ng > 0 && !same_ids(greedy, ng, a, na), "%s", err);
  nb_serve_sampling sp = {.temperature = 0.9f, .top_p = 0.95f, .seed = 7};
  CHECK_MSG(same_ids(b, engine_ids(ctx, m, prompt, n_prompt, &sp, 30, b), a, na), "not the engine's stream");
  /* penalties reach the sampler: greedy changes, and is the engine's */
  rc = generate("--hf '%s/" HF "' --prompt '" PROMPT "' --temperature 0 --max-tokens 30 --show-ids --presence-penalty 0.5 "
                "--frequency-penalty 0.25 --repetition-penalty 1.3",
                src);
  na = parse_ids(err, "generated ids", a, 64);
  CHECK_MSG(rc == 0 && na > 0 && !same_ids(a, na, greedy, ng), "%s", err);
  sp = (nb_serve_sampling){.presence_penalty = 0.5f, .frequency_penalty = 0.25f, .repetition_penalty = 1.3f};
  CHECK_MSG(same_ids(b, engine_ids(ctx, m, prompt, n_prompt, &sp, 30, b), a, na), "penalized ids are not the engine's");
  /* top-k 1 and min-p 1 keep the most likely token only: greedy */
  const char *to_greedy[] = {"--top-k 1", "--min-p 1"};
  for (int i = 0; i < 2; i++) {
    rc = generate("--hf '%s/" HF "' --prompt '" PROMPT "' --temperature 1 --seed 3 --max-tokens 30 --show-ids %s", src,
                  to_greedy[i]);
    CHECK_MSG(rc == 0 && same_ids(a, parse_ids(err, "generated ids", a, 64), greedy, ng), "%s: %s", to_greedy[i], err);
  }
}

/* ---------------------------------------------------------------- eos, bad options */

/* a copy of the tiny model whose eos is its 5th greedy token (130) */
static void test_eos(void) {
  char path[4200], cmd[16384], junk[256];
  snprintf(path, sizeof path, "%s/" HF "/config.json", src);
  char *cfg = nb_test_read_file(path, NULL);
  char *at = cfg ? strstr(cfg, "\"eos_token_id\": 1,") : NULL;
  CHECK(at);
  if (!at) return free(cfg);
  CHECK(nb_test_run("mkdir -p eos", junk, sizeof junk) == 0);
  snprintf(cmd, sizeof cmd, "cd '%s' && ln -sf '%s/" HF "/model.safetensors' '%s/" HF "/tokenizer.json' eos/", work, src, src);
  CHECK(nb_test_run(cmd, junk, sizeof junk) == 0);
  static char edited[1 << 16];
  snprintf(edited, sizeof edited, "%.*s\"eos_token_id\": 130,%s", (int)(at - cfg), cfg, at + strlen("\"eos_token_id\": 1,"));
  nb_test_write_text("eos/config.json", edited);
  free(cfg);
  int rc = generate("--hf eos --prompt '" PROMPT "' --temperature 0 --max-tokens 40 --show-ids");
  int32_t ids[64], want[] = {293, 277, 213, 128, 130};
  CHECK_MSG(rc == 0 && strstr(err, "generated 5 (end of text)"), "rc %d: %s", rc, err);
  CHECK_MSG(same_ids(ids, parse_ids(err, "generated ids", ids, 64), want, 5), "%s", err);
}

static void test_bad_options(void) {
  static const struct {
    const char *args, *want;
    int rc;
  } cases[] = {
      {"--n 0", "--n: 0 is out of range", 2},
      {"--n two", "--n: 'two' is not an integer", 2},
      {"--min-p 1.5", "--min-p: 1.5 is out of range", 2},
      {"--presence-penalty 3", "--presence-penalty: 3 is out of range", 2},
      {"--frequency-penalty -2.5", "--frequency-penalty: -2.5 is out of range", 2},
      {"--repetition-penalty -1", "--repetition-penalty: -1 is out of range", 2},
      {"--prefill-chunk 0", "--prefill-chunk: 0 is out of range", 2},
      {"--max-seq-len 128", "--max-seq-len 128 exceeds the model's max_seq_len 64", 1},
      {"--max-seq-len 16", "the prompt has 19 tokens but the context holds 16", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = generate("--hf '%s/" HF "' --prompt '" PROMPT "' --max-tokens 4 %s", src, cases[i].args);
    CHECK_MSG(rc == cases[i].rc && strstr(err, cases[i].want), "%s: rc %d: %s", cases[i].args, rc, err);
  }
}

int main(void) {
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/generate");
  snprintf(generate_cmd, sizeof generate_cmd, "%s generate", bin);
  if (!getcwd(src, sizeof src)) return 1; /* ctest runs tests in the source tree */
  nb_test_scratch_dir(work, sizeof work, "cli", "generate");
  nb_ctx *ctx = nb_ctx_create();
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_hf(ctx, HF, &m));
  if (chdir(work) != 0) return fprintf(stderr, "cannot enter %s\n", work), 1;
  test_golden();
  test_against_generator(ctx, &m);
  test_seeded(ctx, &m);
  test_eos();
  test_bad_options();
  if (chdir(src) != 0) return 1;
  nb_model_loaded_free(&m);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("cli/generate");
}
