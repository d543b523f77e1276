/* --profile-steps of `nabla generate` and `nabla serve` (the serving
 * engine's steps, 1-based): generate's trace of steps 2-3 holds exactly the
 * engine-step spans 2 and 3, with the op profile and profile.html beside it;
 * a range past the run's end is written at exit; serve's, over one HTTP
 * completion, is written at SIGTERM; malformed ranges are refused naming
 * the option; the shared range parser (nb_prof_parse_steps) on its own. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "testfs.h"
#include "testserve.h"
#include "tracecheck.h"

#define HF "tests/models/golden/hf_llama_tiny"

static const char *bin;
static char src[4096], work[4096], out[1 << 16], err[1 << 16];

static void test_parse(void) {
  int64_t a, b;
  CHECK(nb_prof_parse_steps("2-3", &a, &b) && a == 2 && b == 3);
  CHECK(nb_prof_parse_steps("4", &a, &b) && a == 4 && b == 4);
  const char *bad[] = {"", "0-1", "3-2", "x", "2-", "-2", "1-x", "1-2-3", " 1", "99999999999999999999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK_MSG(!nb_prof_parse_steps(bad[i], &a, &b) && a == 0 && b == 0, "'%s' was taken", bad[i]);
  CHECK(!nb_prof_parse_steps(NULL, &a, &b));
}

/* The step numbers of the trace's engine-step spans, in file order, into steps[cap]; returns their count. */
static int engine_steps(const char *path, int64_t *steps, int cap) {
  nb_test_trace t;
  if (nb_test_trace_load(path, &t)) {
    CHECK_MSG(0, "no trace at %s", path);
    return -1;
  }
  int n = 0;
  for (size_t i = 0; i < t.n; i++) {
    if (strcmp(t.spans[i].name, "engine step") || strcmp(t.spans[i].cat, "serve")) continue;
    const char *p = strstr(t.spans[i].args, "\"step\":");
    CHECK_MSG(p, "an engine step without its number: %s", t.spans[i].args);
    if (p && n < cap) steps[n++] = (int64_t)atof(p + 7);
  }
  nb_test_trace_free(&t);
  return n;
}

static int generate(const char *args) {
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "cd '%s' && %s generate --hf '%s/%s' --prompt 'The tokenizer learned its merges' "
           "--temperature 0 --threads 1 --prefill-chunk 4 %s </dev/null", work, bin, src, HF, args);
  return nb_test_run2(cmd, out, sizeof out, err, sizeof err);
}

static void test_generate(void) {
  int rc = generate("--max-tokens 6 --profile-steps 2-3 --profile-out g/trace.json");
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  char path[4300];
  snprintf(path, sizeof path, "%s/g/trace.json", work);
  int64_t st[64];
  int n = engine_steps(path, st, 64);
  CHECK_MSG(n == 2 && st[0] == 2 && st[1] == 3, "engine steps in the trace: %d (%lld, %lld)", n, n > 0 ? (long long)st[0] : -1LL,
            n > 1 ? (long long)st[1] : -1LL);
  const char *beside[] = {"g/trace.summary.json", "g/trace.ops.json", "g/profile.html"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", work, beside[i]);
    CHECK_MSG(access(path, R_OK) == 0, "%s is missing", path);
  }
  CHECK_MSG(strstr(err, "trace of engine steps 2-3 in g/trace.json"), "%s", err);
  /* the range's end never comes (the run takes a few steps): written at exit, step 5 to the run's last, in order */
  rc = generate("--max-tokens 3 --profile-steps 5-1000");
  CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
  snprintf(path, sizeof path, "%s/profile/trace.json", work);
  n = engine_steps(path, st, 64);
  CHECK_MSG(n >= 1 && st[0] == 5, "engine steps: %d, first %lld", n, n > 0 ? (long long)st[0] : -1LL);
  for (int i = 1; i < n; i++) CHECK(st[i] == st[i - 1] + 1);
  /* refused by name */
  rc = generate("--profile-steps 3-2");
  CHECK_MSG(rc == 2 && strstr(err, "--profile-steps: '3-2' is not a step range"), "rc %d: %s", rc, err);
  rc = generate("--profile-steps 0");
  CHECK_MSG(rc == 2 && strstr(err, "--profile-steps: '0'"), "rc %d: %s", rc, err);
  rc = generate("--profile-out x.json");
  CHECK_MSG(rc == 2 && strstr(err, "--profile-out goes with --profile-steps"), "rc %d: %s", rc, err);
}

static void test_serve(void) {
  char model[4200], args[8400], path[4300];
  snprintf(model, sizeof model, "%s/%s", src, HF);
  snprintf(path, sizeof path, "%s/s/trace.json", work);
  snprintf(args, sizeof args, "--served-model-name tiny --profile-steps 2-100000 --profile-out '%s'", path);
  nb_test_server s = {.pid = -1};
  if (!nb_test_serve_start(&s, bin, work, NULL, model, args)) return;
  static char resp[1 << 16];
  const char *body, *json = "{\"model\": \"tiny\", \"prompt\": \"The tokenizer\", \"max_tokens\": 4, \"temperature\": 0}";
  int code = nb_test_http(s.port, "POST", "/v1/completions", NULL, json, strlen(json), resp, sizeof resp, &body, 60);
  CHECK_MSG(code == 200, "status %d: %s", code, body);
  CHECK_MSG(access(path, R_OK) != 0, "the trace was written before the server stopped");
  nb_test_serve_stop(&s);
  int64_t st[64];
  int n = engine_steps(path, st, 64);
  CHECK_MSG(n >= 2 && st[0] == 2, "engine steps in serve's trace: %d, first %lld", n, n > 0 ? (long long)st[0] : -1LL);
  for (int i = 1; i < n; i++) CHECK(st[i] == st[i - 1] + 1);
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "%s serve '%s' --profile-steps 2-x 2>&1", bin, model);
  int rc = nb_test_run(cmd, out, sizeof out);
  CHECK_MSG(rc == 2 && strstr(out, "nabla serve: --profile-steps: '2-x'"), "rc %d: %s", rc, out);
}

int main(void) {
  test_parse();
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("prof/engine_steps");
  if (!getcwd(src, sizeof src)) return 1; /* ctest runs tests in the source tree */
  nb_test_scratch_dir(work, sizeof work, "prof", "engine_steps");
  test_generate();
  test_serve();
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("prof/engine_steps");
}
