/* `nabla generate`: greedy text from the tiny Hugging Face Llama equal to
 * transformers' ids and to their decoded bytes, a run directory and one of
 * its checkpoint steps made here (byte-level, as the trainer writes them)
 * giving the same text, seeds, and errors: a missing run dir is named and
 * fails, bad usage exits 2. */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "json_golden.h"

static char tmp[256];

/* runs cmd with stdout into out and stderr into err; returns the exit code */
static int run(const char *cmd, char *out, size_t cap, char *err, size_t ecap) {
  char full[4096], errfile[300];
  snprintf(errfile, sizeof errfile, "%s/stderr.txt", tmp);
  snprintf(full, sizeof full, "%s 2>%s", cmd, errfile);
  FILE *p = popen(full, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  FILE *f = fopen(errfile, "r");
  n = f ? fread(err, 1, ecap - 1, f) : 0;
  err[n] = 0;
  if (f) fclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_hf(nb_ctx *ctx, const char *bin) {
  static char out[1 << 16], err[1 << 16];
  cJSON *j = nb_test_golden_load("tests/models/golden/hf_llama_tiny.json");
  CHECK(j);
  if (!j) return;
  int64_t want[32];
  int k = nb_test_golden_ints(j, "greedy_ids", want, 32);
  char cmd[2048], ids[512] = "generated ids:";
  snprintf(cmd, sizeof cmd, "%s generate --hf tests/models/golden/hf_llama_tiny --prompt '%s' --max-tokens %d --temperature 0 --show-ids",
           bin, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "prompt")), k);
  CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < k; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), " %lld", (long long)want[i]);
  CHECK_MSG(strstr(err, ids), "stderr lacks '%s':\n%s", ids, err);
  CHECK_MSG(strstr(err, "prefill") && strstr(err, "decode") && strstr(err, "tokens/s") && strstr(err, "first token"), "%s", err);
  /* stdout: the tokenizer's decoding of those ids, then a newline */
  nb_tok *tok = nb_tok_load(ctx, "tests/models/golden/hf_llama_tiny/tokenizer.json");
  int32_t w32[32];
  for (int i = 0; i < k; i++) w32[i] = (int32_t)want[i];
  nb_tok_text text = {0};
  CHECK(tok && nb_tok_decode(tok, w32, (size_t)k, NULL, &text) == NB_OK);
  CHECK_MSG(strlen(out) == text.len + 1 && !memcmp(out, text.data, text.len) && out[text.len] == '\n',
            "stdout (%zu bytes) is not the decoded ids (%zu bytes)", strlen(out), text.len);
  nb_tok_text_free(tok, &text);
  nb_tok_destroy(tok);
  /* sampling: the same seed twice gives the same text; a max-seq-len bound truncates */
  char again[1 << 12];
  snprintf(cmd, sizeof cmd, "%s generate --hf tests/models/golden/hf_llama_tiny --prompt 'In the' --max-tokens 20 --seed 7 --top-k 50 --top-p 0.9", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
  CHECK(run(cmd, again, sizeof again, err, sizeof err) == 0);
  CHECK_MSG(!strcmp(out, again), "seed 7 gave two texts");
  snprintf(cmd, sizeof cmd, "%s generate --hf tests/models/golden/hf_llama_tiny --prompt 'In the' --max-tokens 20 --max-seq-len 8 --show-ids", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 0);
  CHECK_MSG(strstr(err, "context full"), "%s", err);
  cJSON_Delete(j);
}

static void test_run_dir(nb_ctx *ctx, const char *bin) {
  static char out[1 << 16], err[1 << 16], out2[1 << 16];
  nb_model_run_config rc;
  nb_model_run_config_defaults(&rc);
  CHECK_OK(ctx, nb_model_run_config_set(ctx, &rc, "model.preset=gpt2-tiny"));
  rc.model.n_layers = 2;
  rc.model.d_model = 32;
  rc.model.d_ff = 64;
  rc.model.max_seq_len = 512;
  rc.model.init_std = 0.2;
  rc.data.seq_len = 64;
  char dir[400], p[500], step[600];
  snprintf(dir, sizeof dir, "%s/run", tmp);
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/config.yaml", dir);
  FILE *f = fopen(p, "w");
  nb_model_run_config_write(&rc, f);
  fclose(f);
  nb_array *key = nb_key(ctx, 1);
  nb_tree *params = nb_model_init(ctx, &rc.model, key);
  snprintf(p, sizeof p, "%s/checkpoints", dir);
  nb_ckpt_options o = {.directory = p};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_ckpt_item items[1] = {{"params", params}};
  CHECK_OK(ctx, nb_ckpt_save(m, 10, items, 1, NULL, NULL));
  CHECK_OK(ctx, nb_ckpt_step_path(m, 10, step, sizeof step));
  nb_ckpt_manager_destroy(m);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s generate --run-dir %s --prompt 'Hello' --max-tokens 16 --temperature 0 --show-ids", bin, dir);
  CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
  /* the context defaults to prompt + max tokens rounded up to a power of two >= 256 */
  CHECK_MSG(strstr(err, "prompt ids: 72 101 108 108 111\n") && strstr(err, "step 10") && strstr(err, "context 256,"), "%s", err);
  /* byte-level: stdout is the generated ids as bytes */
  const char *g = strstr(err, "generated ids:");
  size_t n = 0;
  char bytes[64];
  for (const char *q = g ? g + 14 : ""; *q && *q != '\n' && n < sizeof bytes;) {
    char *end;
    long v = strtol(q, &end, 10);
    if (end == q) break;
    bytes[n++] = (char)v;
    q = end;
  }
  CHECK_MSG(n == 16 && strlen(out) >= n && !memcmp(out, bytes, n), "stdout is not the %zu generated bytes", n);
  snprintf(cmd, sizeof cmd, "%s generate --checkpoint %s --prompt 'Hello' --max-tokens 16 --temperature 0", bin, step);
  CHECK_MSG(run(cmd, out2, sizeof out2, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(!strcmp(out, out2), "the checkpoint step and its run dir generate different text");
  /* 5 + 300 tokens need 512; the model's own bound caps it */
  snprintf(cmd, sizeof cmd, "%s generate --checkpoint %s --prompt 'Hello' --max-tokens 300 --temperature 0 --max-seq-len 600", bin, step);
  CHECK(run(cmd, out2, sizeof out2, err, sizeof err) == 1);
  CHECK_MSG(strstr(err, "--max-seq-len 600 exceeds the model's max_seq_len 512"), "%s", err);
  nb_tree_destroy(params);
  nb_array_release(key);
}

static void test_errors(const char *bin) {
  static char out[1 << 12], err[1 << 12];
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s generate --run-dir /nonexistent/run --prompt hi", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 1);
  CHECK_MSG(strstr(err, "run dir '/nonexistent/run' does not exist"), "%s", err);
  snprintf(cmd, sizeof cmd, "%s generate --hf /nonexistent/hf --prompt hi", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 1);
  CHECK_MSG(strstr(err, "'/nonexistent/hf' does not exist"), "%s", err);
  snprintf(cmd, sizeof cmd, "%s generate --hf tests/models/golden/hf_llama_tiny", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 2);
  CHECK_MSG(strstr(err, "--prompt is required") && strstr(err, "usage: nabla generate"), "%s", err);
  snprintf(cmd, sizeof cmd, "%s generate --hf a --run-dir b --prompt hi", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 2);
  snprintf(cmd, sizeof cmd, "%s generate --hf tests/models/golden/hf_llama_tiny --prompt hi --top-p 2", bin);
  CHECK(run(cmd, out, sizeof out, err, sizeof err) == 2);
  CHECK_MSG(strstr(err, "bad argument '--top-p' 2"), "%s", err);
}

int main(void) {
  const char *bin = getenv("NABLA_BIN");
  if (!bin) {
    printf("NABLA_BIN not set: skipped\n");
    return nb_test_summary("models/generate_cli");
  }
  snprintf(tmp, sizeof tmp, "%s/nabla_gencli_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  CHECK(mkdtemp(tmp) != NULL);
  nb_ctx *ctx = nb_ctx_create();
  test_hf(ctx, bin);
  test_run_dir(ctx, bin);
  test_errors(bin);
  nb_ctx_destroy(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  CHECK(system(cmd) == 0);
  return nb_test_summary("models/generate_cli");
}
