/* `nabla quantize MODEL --rules RULES -o DIR` on the tiny Hugging Face Llama:
 * the run dir it writes loads as a quantized tree; `nabla ckpt show` prints
 * each tensor's quantization; `nabla generate --run-dir DIR` (the serving
 * engine with quant's linear hook) gives, greedy, the tokens of the
 * reference generator on the dequantized f32 weights, at 1 and 2 threads;
 * the serving engine's tokens for a request do not change when other
 * requests share its steps (the quant kernels' rows do not depend on the
 * batch); a GGUF's Q8_0 / Q4_0 linears run quantized with the tokens of
 * the f32 decode of the same file; bad rules and arguments are refused by
 * name; `nabla serve` answers over HTTP with the greedy text of `nabla
 * generate` for the quantized run dir and the Q8_0 GGUF file. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "testfs.h"
#include "testserve.h"

#define HF "tests/models/golden/hf_llama_tiny"

static const char *bin;
static char src[4096], out[1 << 17], err[1 << 16], work[4096];

/* runs "nabla ARGS" (printf-formatted) in work; stdout in out, stderr in err */
#define nabla(...) nb_test_run_in(work, bin, out, sizeof out, err, sizeof err, __VA_ARGS__)

static void write_file(const char *name, const char *text) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", work, name);
  FILE *f = fopen(p, "w");
  CHECK(f);
  if (f) fputs(text, f), fclose(f);
}

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

static const char rules[] = "quant:\n  rules:\n"
                            "    - {module_path: '.*/mlp/wo', weight_qtype: int4, tile_size: 32, weight_calibration: minmax}\n"
                            "    - {module_path: '.*/mlp/.*', weight_qtype: int4, tile_size: 32}\n"
                            "    - {module_path: '.*attn/.*', weight_qtype: int8}\n";

static void test_show(void) {
  int rc = nabla("ckpt show q/checkpoints");
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  CHECK_MSG(strstr(out, "params/layers/1/mlp/wo/kernel/zero_points") && strstr(out, "int4 g32 asymmetric, weight-only, rule 0"),
            "%s", out);
  CHECK_MSG(strstr(out, "params/layers/0/attn/wq/kernel/values") && strstr(out, "int8 per-channel, weight-only, rule 2"), "%s", out);
}

/* greedy: `nabla generate` on the quantized run dir against the reference
 * generator on the dequantized weights */
static void test_generate(nb_ctx *ctx, const nb_model_loaded *q) {
  nb_tree *deq = nb_quant_dequantize_tree(ctx, q->params);
  CHECK_MSG(deq, "%s", nb_ctx_error(ctx));
  if (!deq) return;
  for (int threads = 1; threads <= 2; threads++) {
    int rc = nabla("generate --run-dir q --prompt 'merges merge the tokenizer' --temperature 0 --max-tokens 24 --show-ids "
                   "--threads %d", threads);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    int32_t prompt[64], got[64], want[64];
    int np = parse_ids(err, "prompt ids", prompt, 64), ng = parse_ids(err, "generated ids", got, 64);
    CHECK_MSG(np > 0 && ng > 0, "%s", err);
    if (np <= 0 || ng <= 0) continue;
    nb_model_generator *gen = nb_model_generator_create(ctx, &q->cfg, deq, &(nb_model_gen_opts){.max_seq_len = 64});
    CHECK_MSG(gen, "%s", nb_ctx_error(ctx));
    nb_model_gen_result res = {0};
    nb_model_gen_request r = {.prompt = prompt, .n_prompt = np, .max_tokens = 24, .stop = q->eos_ids, .n_stop = q->n_eos, .out = want};
    if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
    nb_model_generator_destroy(gen);
    CHECK_MSG(res.n_tokens == ng && !memcmp(got, want, (size_t)ng * sizeof *got), "threads %d: %d tokens vs %lld of the reference",
              threads, ng, (long long)res.n_tokens);
  }
  nb_tree_destroy(deq);
}

/* one request alone, then the same beside two others in the same steps */
static int engine_run(nb_ctx *ctx, const nb_model_loaded *q, nb_quant_plan *plan, int n_req, int32_t *ids0) {
  nb_serve_llm_config lc = {.engine = {.block_size = 16, .num_blocks = 16, .max_num_seqs = 4, .max_num_batched_tokens = 64,
                                       .max_model_len = 64},
                            .model = {.linear_hook = nb_quant_linear_hook, .hook_ud = plan}};
  nb_serve_llm *l = nb_serve_llm_create(ctx, &q->cfg, q->params, &lc);
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  if (!l) return -1;
  static const int32_t prompts[3][6] = {{5, 17, 33, 2, 90, 41}, {7, 7, 200, 13, 1, 9}, {250, 3, 3, 3, 77, 12}};
  nb_serve_sampling sp = {0};
  for (int k = 0; k < n_req; k++) {
    nb_serve_llm_request r = {.r = {.id = k, .prompt = prompts[k], .prompt_len = 6 - k, .max_tokens = 20, .sampling = &sp}};
    CHECK_OK(ctx, nb_serve_llm_add(l, &r));
  }
  int n = 0;
  for (int guard = 0; nb_serve_llm_has_unfinished(l) && guard < 1000; guard++) {
    const nb_serve_event *ev;
    int32_t n_ev = 0;
    if (nb_serve_llm_step(l, &ev, &n_ev)) break;
    for (int32_t i = 0; i < n_ev; i++)
      if (ev[i].s.request_id == 0) ids0[n++] = ev[i].s.token;
  }
  nb_serve_llm_destroy(l);
  return n;
}

static void test_batch_invariance(nb_ctx *ctx, const nb_model_loaded *q) {
  nb_quant_plan *plan = nb_quant_plan_create(ctx, q->params);
  CHECK_MSG(plan && nb_quant_plan_count(plan) == 14, "%s", nb_ctx_error(ctx));
  int32_t alone[64], shared[64];
  int na = engine_run(ctx, q, plan, 1, alone), ns = engine_run(ctx, q, plan, 3, shared);
  CHECK_MSG(na == 20 && ns == na && !memcmp(alone, shared, (size_t)na * sizeof *alone), "alone %d tokens, shared %d", na, ns);
  nb_quant_plan_destroy(plan);
}

/* GGUF in: Q8_0 / Q4_0 linears run quantized; greedy ids of `nabla generate
 * --gguf` equal the reference generator's on the loader's f32 decode of
 * the same file (the quant trees dequantize to exactly those values) */
static void test_gguf_in(nb_ctx *ctx) {
  for (int t = 0; t < 2; t++) {
    const char *type = t ? "q4_0" : "q8_0";
    int rc = nabla("quantize '%s/" HF "' --format gguf --type %s -o m-%s.gguf", src, type, type);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    /* the default: int8 per-32-block activations (llama.cpp's arithmetic; tests/quant/test_matmul.c checks its bits) */
    rc = nabla("generate --gguf m-%s.gguf --prompt 'merges merge the tokenizer' --temperature 0 --max-tokens 24 --threads 1", type);
    CHECK_MSG(rc == 0 && strstr(err, "15 Q8_0/Q4_0/Q6_K linears of") && strstr(err, "int8 per-32-block activations"), "%s: rc %d: %s", type,
              rc, err);
    rc = nabla("generate --gguf m-%s.gguf --gguf-act fp8 --prompt x", type);
    CHECK_MSG(rc == 2 && strstr(err, "--gguf-act: 'fp8'"), "%s: rc %d: %s", type, rc, err);
    /* weight-only: exactly the f32 model on the file's decoded weights */
    rc = nabla("generate --gguf m-%s.gguf --gguf-act none --prompt 'merges merge the tokenizer' --temperature 0 --max-tokens 24 "
               "--show-ids --threads 1", type);
    CHECK_MSG(rc == 0 && strstr(err, "15 Q8_0/Q4_0/Q6_K linears of") && strstr(err, "f32 activations"), "%s: rc %d: %s", type, rc, err);
    int32_t prompt[64], got[64], want[64];
    int np = parse_ids(err, "prompt ids", prompt, 64), ng = parse_ids(err, "generated ids", got, 64);
    char path[4200];
    snprintf(path, sizeof path, "%s/m-%s.gguf", work, type);
    nb_model_loaded f;
    CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &f));
    if (nb_ctx_status(ctx) || np <= 0 || ng <= 0) {
      nb_ctx_clear_error(ctx);
      CHECK_MSG(false, "%s: %s", type, err);
      continue;
    }
    nb_model_generator *gen = nb_model_generator_create(ctx, &f.cfg, f.params, &(nb_model_gen_opts){.max_seq_len = 64});
    nb_model_gen_result res = {0};
    nb_model_gen_request r = {.prompt = prompt, .n_prompt = np, .max_tokens = 24, .stop = f.eos_ids, .n_stop = f.n_eos, .out = want};
    if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
    nb_model_generator_destroy(gen);
    CHECK_MSG(res.n_tokens == ng && !memcmp(got, want, (size_t)ng * sizeof *got), "%s: %d tokens vs %lld of the reference", type,
              ng, (long long)res.n_tokens);
    nb_model_loaded_free(&f);
  }
}

/* `nabla serve MODEL` over HTTP: a greedy completion, whole and streamed,
 * is the text of `nabla generate`'s ids for the same prompt (detokenized
 * by the server after the last prompt id: it decodes in that context). */
static void test_serve_http(const char *model, const char *generate_args) {
  int rc = nabla("generate %s --prompt 'merges merge the tokenizer' --temperature 0 --max-tokens 24 --show-ids --threads 1",
                 generate_args);
  int32_t prompt[64], got[64];
  int np = parse_ids(err, "prompt ids", prompt, 64), ng = parse_ids(err, "generated ids", got, 64);
  CHECK_MSG(rc == 0 && np > 0 && ng > 0, "%s: rc %d: %s", model, rc, err);
  if (rc || np <= 0 || ng <= 0) return;
  nb_test_server s = {.pid = -1};
  if (!nb_test_serve_start(&s, bin, work, NULL, model, "")) return;
  static char resp[1 << 16], json[4096];
  const char *body;
  size_t n = (size_t)snprintf(json, sizeof json, "{\"tokens\": [%d", prompt[np - 1]);
  for (int i = 0; i < ng; i++) n += (size_t)snprintf(json + n, sizeof json - n, ",%d", got[i]);
  snprintf(json + n, sizeof json - n, "]}");
  int st = nb_test_http(s.port, "POST", "/detokenize", NULL, json, strlen(json), resp, sizeof resp, &body, 20);
  cJSON *all = cJSON_Parse(body);
  snprintf(json, sizeof json, "{\"tokens\": [%d]}", prompt[np - 1]);
  nb_test_http(s.port, "POST", "/detokenize", NULL, json, strlen(json), resp, sizeof resp, &body, 20);
  cJSON *ctx_tok = cJSON_Parse(body);
  const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(all, "prompt")), *c = cJSON_GetStringValue(cJSON_GetObjectItem(ctx_tok, "prompt"));
  CHECK_MSG(st == 200 && want && c && !strncmp(want, c, strlen(c)), "%s: /detokenize: %s, then %s", model, want ? want : "(none)", body);
  if (want && c && !strncmp(want, c, strlen(c))) want += strlen(c);
  for (int stream = 0; stream < 2 && want; stream++) {
    snprintf(json, sizeof json,
             "{\"prompt\": \"merges merge the tokenizer\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": %s}",
             stream ? "true" : "false");
    st = nb_test_http(s.port, "POST", "/v1/completions", NULL, json, strlen(json), resp, sizeof resp, &body, 60);
    /* the text: the one choice's, or the streamed chunks' joined */
    static char text[8192];
    size_t tn = 0;
    text[0] = 0;
    for (const char *at = body; (at = strstr(at, stream ? "data: {" : "{")); at++) {
      cJSON *j = cJSON_Parse(stream ? at + 6 : at);
      const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text"));
      if (t) tn += (size_t)snprintf(text + tn, sizeof text - tn, "%s", t);
      cJSON_Delete(j);
      if (!stream) break;
    }
    CHECK_MSG(st == 200 && !strcmp(text, want), "%s%s: status %d, text '%s', generate's '%s'", model, stream ? " (streamed)" : "",
              st, text, want);
  }
  cJSON_Delete(all);
  cJSON_Delete(ctx_tok);
  nb_test_serve_stop(&s);
}

static void test_errors(void) {
  write_file("bad.yaml", "quant:\n  rules:\n    - {module_path: a, weight_qtype: int8}\n    - {module_path: b, weight_qtype: int3}\n");
  int rc = nabla("quantize '%s/" HF "' --rules bad.yaml -o bad", src);
  CHECK_MSG(rc != 0 && strstr(err, "bad.yaml:4: rule 1: weight_qtype: 'int3'"), "rc %d: %s", rc, err);
  rc = nabla("quantize '%s/" HF "' --rules rules.yaml -o q", src);
  CHECK_MSG(rc != 0 && strstr(err, "q exists"), "rc %d: %s", rc, err);
  rc = nabla("quantize '%s/" HF "' --rules rules.yaml --format gguf -o x.gguf", src);
  CHECK_MSG(rc != 0 && strstr(err, "give one"), "rc %d: %s", rc, err);
  write_file("none.yaml", "quant:\n  rules:\n    - {module_path: nothing, weight_qtype: int8}\n");
  rc = nabla("quantize '%s/" HF "' --rules none.yaml -o none", src);
  CHECK_MSG(rc != 0 && strstr(err, "no rule of none.yaml matches"), "rc %d: %s", rc, err);
  rc = nabla("quantize --help");
  CHECK_MSG(rc == 0 && strstr(out, "--rules FILE"), "rc %d", rc);
}

int main(void) {
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/quantize_rules");
  if (!getcwd(src, sizeof src)) return 1;
  nb_test_scratch_dir(work, sizeof work, "cli", "quantize_rules");
  signal(SIGPIPE, SIG_IGN);
  write_file("rules.yaml", rules);
  nb_ctx *ctx = nb_ctx_create();
  int rc = nabla("quantize '%s/" HF "' --rules rules.yaml -o q", src);
  CHECK_MSG(rc == 0 && strstr(err, "wrote q (14 of the linears quantized by 3 rules"), "rc %d: %s", rc, err);
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/q", work);
  nb_model_loaded q;
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, dir, NULL, &q));
  if (!rc && !nb_ctx_status(ctx)) {
    CHECK(nb_quant_tree_count(ctx, q.params) == 14);
    test_show();
    test_generate(ctx, &q);
    test_batch_invariance(ctx, &q);
    test_serve_http("q", "--run-dir q");
    nb_model_loaded_free(&q);
  }
  test_gguf_in(ctx);
  test_serve_http("m-q8_0.gguf", "--gguf m-q8_0.gguf");
  test_errors();
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("cli/quantize_rules");
}
