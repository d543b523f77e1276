/* Traces of the stack, captured from the command line: `nabla train ...
 * profile.steps=3-4` writes <run_dir>/profile/trace.json holding exactly
 * those training steps, with every step of the compiled executable inside
 * them (fused kernels named by their ops, GEMMs), the data pipeline's waits
 * and the checkpoint's snapshot; `nabla profile --out F -- train ...` and
 * NABLA_PROFILE=F trace the whole command (compiles with their phases, the
 * data worker's and checkpoint writer's tracks); a malformed profile.steps
 * is refused by name; `nabla serve` under NABLA_PROFILE traces each HTTP
 * request, the engine's steps and its KV blocks (counters). Each trace is
 * checked on its own (tracecheck.h); beside profile.steps's trace, the
 * memory viewer's live set at the step's peak names parameters by path and
 * the graph has a node per step. */
#include <cjson/cJSON.h>
#include <signal.h> /* train_util.h uses raise */
#include <unistd.h>

#include <cjson/cJSON.h>

#include "testserve.h"
#include "tracecheck.h"
#include "train_util.h"

static char work[512], tiny[2048];

static void make_tiny_args(void) {
  snprintf(tiny, sizeof tiny,
           "data.train=%s/corpus.txt model.preset=gpt2-tiny model.n_layers=1 model.d_model=32 model.n_heads=2 "
           "model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=16 data.seq_len=16 batch_size=4 log_every=1 "
           "eval_every=0 schedule.kind=constant schedule.warmup_steps=0 optim.lr=3e-3 --threads 2",
           work);
}

/* every span of category (or name) cat lies inside a span named parent on its thread */
static void check_inside(const nb_test_trace *t, const char *cat, const char *parent) {
  size_t n = 0, outside = 0;
  for (size_t i = 0; i < t->n; i++) {
    const nb_test_span *s = &t->spans[i];
    if (strcmp(s->cat, cat) && strcmp(s->name, cat)) continue;
    n++;
    bool in = false;
    for (size_t j = 0; j < t->n && !in; j++) {
      const nb_test_span *p = &t->spans[j];
      in = !strcmp(p->name, parent) && p->tid == s->tid && p->ts <= s->ts && s->ts + s->dur <= p->ts + p->dur;
    }
    outside += !in;
  }
  CHECK_MSG(n > 0 && outside == 0, "%zu of %zu '%s' spans outside a '%s'", outside, n, cat, parent);
}

/* the memory and graph viewers beside the trace: the step's live set at
 * its peak names parameters by path, the graph has a node per step */
static void check_viewers(const char *dir) {
  char path[700];
  snprintf(path, sizeof path, "%s/profile/trace.memory.json", dir);
  char *text = nb_test_read_file(path, NULL);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  const cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "executables"), 0), *b;
  /* the one that ran the most: the step (the eval executable did not run in steps 3-4) */
  const char *title = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "title"));
  CHECK_MSG(title && strstr(title, "inputs") && strstr(title, "params") && strstr(title, "opt_state"), "title '%s'", title ? title : "-");
  size_t params = 0, at_peak = 0;
  cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(x, "live_at_peak")) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "name"));
    at_peak++;
    params += name && !strncmp(name, "params/", 7);
  }
  CHECK_MSG(params > 4 && at_peak > params, "%zu of %zu buffers live at the peak name parameters", params, at_peak);
  CHECK_MSG(strstr(text ? text : "", "\"name\":\"params/layers/0/"), "no params/layers/0/... in %s", path);
  int steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "steps"));
  cJSON_Delete(j);
  free(text);
  snprintf(path, sizeof path, "%s/profile/trace.graph.svg", dir);
  text = nb_test_read_file(path, NULL);
  size_t nodes = 0;
  for (const char *p = text; p && (p = strstr(p, "<g class=\"step\"")); p++) nodes++;
  CHECK_MSG(steps > 10 && nodes == (size_t)steps, "%zu nodes in %s, %d steps", nodes, path, steps);
  free(text);
  snprintf(path, sizeof path, "%s/profile/trace.memory.html", dir);
  CHECK_MSG(access(path, R_OK) == 0, "no %s", path);
}

static void train_steps(const char *bin) {
  static char out[1 << 16];
  char cmd[4096], dir[600], path[700];
  snprintf(dir, sizeof dir, "%s/steps", work);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=6 checkpoint_every=4 profile.steps=3-4 2>&1", bin, dir, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0, "%s", out);
  CHECK_MSG(strstr(out, "profile: memory viewer ") && strstr(out, "/profile/trace.memory.html, graph of the longest-running"), "%s", out);
  snprintf(path, sizeof path, "%s/profile/trace.json", dir);
  nb_test_trace t;
  if (nb_test_trace_load(path, &t)) return;
  CHECK_MSG(nb_test_trace_count(&t, "train step", "train", NULL) == 2, "%zu train steps", nb_test_trace_count(&t, "train step", NULL, NULL));
  size_t steps_seen = 0;
  for (size_t i = 0; i < t.n; i++)
    if (!strcmp(t.spans[i].name, "train step"))
      steps_seen += strstr(t.spans[i].args, "\"step\":3,") || strstr(t.spans[i].args, "\"step\":4,");
  CHECK_MSG(steps_seen == 2, "the traced steps are not 3 and 4");
  CHECK(nb_test_trace_count(&t, "next batch", "data", NULL) == 2 && nb_test_trace_count(&t, "step executable", "train", NULL) == 2);
  CHECK(nb_test_trace_count(&t, "data wait", "data", NULL) == 2);
  CHECK(nb_test_trace_count(&t, "ckpt snapshot", "ckpt", NULL) == 1 && nb_test_trace_count(&t, "checkpoint save", "ckpt", NULL) == 1);
  CHECK(nb_test_trace_count(&t, "nb_jit", NULL, NULL) == 0); /* compiled before step 3 */
  /* every executable step is inside the step's run, and each kernel names its ops and origin */
  check_inside(&t, "kernel", "step executable");
  check_inside(&t, "gemm", "step executable");
  check_inside(&t, "next batch", "train step");
  check_inside(&t, "data wait", "next batch");
  size_t gemms = 0, gemms_named = 0;
  for (size_t i = 0; i < t.n; i++)
    if (!strcmp(t.spans[i].cat, "gemm")) gemms++, gemms_named += !strncmp(t.spans[i].name, "dot_general f32[", 16);
  CHECK_MSG(gemms > 0 && gemms_named == gemms, "%zu of %zu GEMMs named with their result type", gemms_named, gemms);
  size_t kernels = 0, named = 0;
  for (size_t i = 0; i < t.n; i++) {
    const nb_test_span *s = &t.spans[i];
    if (strcmp(s->cat, "kernel")) continue;
    kernels++;
    bool copy = strstr(s->args, "\"ops\":\"copy\"") != NULL; /* may have no equation to point at */
    named += s->name[0] == 'k' && strchr(s->name, ' ') && strstr(s->args, "\"ops\":\"") && (copy || strstr(s->args, ".c:")) &&
             strstr(s->args, "\"flops\":") && strstr(s->args, "\"bytes\":");
  }
  CHECK_MSG(kernels > 10 && named == kernels, "%zu of %zu kernels named with ops, place and cost", named, kernels);
  const nb_test_span *k = nb_test_trace_find(&t, "train step");
  const char *main_track = k ? nb_test_trace_thread(&t, k->tid) : NULL;
  CHECK_MSG(main_track && !strcmp(main_track, "nabla"), "main track '%s'", main_track ? main_track : "-");
  nb_test_trace_free(&t);
  /* the op profile: GEMMs name the parameters they read; the page is beside report.html */
  snprintf(path, sizeof path, "%s/profile/trace.ops.json", dir);
  char *ops = nb_test_read_file(path, NULL);
  cJSON *j = ops ? cJSON_Parse(ops) : NULL;
  const cJSON *row;
  size_t gemms_rows = 0, attn = 0, noted = 0;
  cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(j, "kernels")) {
    noted += cJSON_GetObjectItemCaseSensitive(row, "reads") != NULL;
    if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(row, "cat")), "gemm")) continue;
    gemms_rows++;
    const cJSON *r;
    bool reads_attn = false;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(row, "reads")) reads_attn |= strstr(cJSON_GetStringValue(r), "params/layers/0/attn/") != NULL;
    attn += reads_attn;
  }
  CHECK_MSG(j && gemms_rows > 4 && attn >= 4 && noted == (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "kernels")),
            "%zu GEMM rows, %zu read params/layers/0/attn/..., %zu of %d rows noted", gemms_rows, attn, noted,
            cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "kernels")));
  cJSON_Delete(j);
  free(ops);
  CHECK_MSG(strstr(out, "[params/layers/0/"), "the table names no parameter: %s", out);
  snprintf(path, sizeof path, "%s/profile.html", dir);
  char *page = nb_test_read_file(path, NULL);
  CHECK_MSG(page && strstr(page, "id='roofline'") && strstr(page, "params/layers/0/attn/") && strstr(page, "<section id='memory'>") &&
                strstr(page, "<section id='graph'>") && strstr(page, "<svg") && !strstr(page, "<script src") && !strstr(page, "<link"),
            "%s: no page with a roofline, the memory and the graph viewer", path);
  free(page);
  check_viewers(dir);

  snprintf(cmd, sizeof cmd, "%s train --run-dir %s/bad %s steps=2 profile.steps=4-3 2>&1", bin, work, tiny);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  CHECK_MSG(strstr(out, "profile.steps: '4-3' is not a step range"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s/bad %s steps=2 profile.steps=x 2>&1", bin, work, tiny);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  CHECK_MSG(strstr(out, "profile.steps: 'x'"), "%s", out);
}

/* a whole command: its compiles, and the tracks of the threads it started */
static void check_whole(const char *path, int steps) {
  nb_test_trace t;
  if (nb_test_trace_load(path, &t)) return;
  CHECK_MSG(nb_test_trace_count(&t, "train step", NULL, NULL) == (size_t)steps, "%zu steps",
            nb_test_trace_count(&t, "train step", NULL, NULL));
  CHECK(nb_test_trace_count(&t, "nb_jit", "compile", NULL) == 2); /* the step and the eval executable */
  check_inside(&t, "compile", "nb_jit");
  CHECK(nb_test_trace_count(&t, "fuse", "compile", NULL) == 2 && nb_test_trace_count(&t, "codegen + build", "compile", NULL) == 2);
  const nb_test_span *w = nb_test_trace_find(&t, "ckpt write"), *d = nb_test_trace_find(&t, "data element");
  const char *wn = w ? nb_test_trace_thread(&t, w->tid) : NULL, *dn = d ? nb_test_trace_thread(&t, d->tid) : NULL;
  CHECK_MSG(wn && !strcmp(wn, "nabla-ckpt"), "checkpoint writer track '%s'", wn ? wn : "-");
  CHECK_MSG(dn && !strncmp(dn, "nabla-data-", 11), "data worker track '%s'", dn ? dn : "-");
  nb_test_trace_free(&t);
}

static void whole_command(const char *bin) {
  static char out[1 << 16];
  char cmd[4096], path[700];
  snprintf(path, sizeof path, "%s/whole/a/trace.json", work);
  snprintf(cmd, sizeof cmd, "%s profile --out %s -- train --run-dir %s/whole %s steps=3 checkpoint_every=2 2>&1", bin, path,
           work, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0, "%s", out);
  CHECK_MSG(strstr(out, "trace written to") && strstr(out, "nabla train: memory viewer "), "%s", out);
  check_whole(path, 3);
  snprintf(path, sizeof path, "%s/env.json", work);
  snprintf(cmd, sizeof cmd, "NABLA_PROFILE=%s %s train --run-dir %s/env %s steps=2 checkpoint_every=2 profile.steps=1-2 2>&1",
           path, bin, work, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0, "%s", out);
  CHECK_MSG(strstr(out, "a trace is already being recorded"), "%s", out); /* profile.steps yields to it */
  check_whole(path, 2);
  snprintf(cmd, sizeof cmd, "%s profile --out %s/x.json 2>&1", bin, work);
  CHECK(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "no command to run after --"));
}

/* nabla serve under NABLA_PROFILE: a span per HTTP request on the
 * connection's track, the model's steps on the engine's */
static void serve_traced(const char *bin) {
  char env[800], model[600], path[700], dst[1 << 14];
  snprintf(path, sizeof path, "%s/serve.json", work);
  snprintf(env, sizeof env, "NABLA_PROFILE=%s ", path); /* a prefix of the command line */
  snprintf(model, sizeof model, "%s/steps", work); /* train_steps's run */
  nb_test_server sv;
  if (!nb_test_serve_start(&sv, bin, work, env, model, "")) return;
  const char *body = NULL, *req = "{\"prompt\":\"the cat\",\"max_tokens\":3,\"temperature\":0}";
  int st = nb_test_http(sv.port, "POST", "/v1/completions", "Content-Type: application/json\r\n", req, strlen(req), dst,
                        sizeof dst, &body, 60);
  CHECK_MSG(st == 200, "status %d: %s", st, body ? body : "");
  CHECK(nb_test_http(sv.port, "GET", "/health", NULL, NULL, 0, dst, sizeof dst, &body, 20) == 200);
  nb_test_serve_stop(&sv);
  nb_test_trace t;
  if (nb_test_trace_load(path, &t)) return;
  const nb_test_span *post = nb_test_trace_find(&t, "POST /v1/completions"), *health = nb_test_trace_find(&t, "GET /health");
  const char *pn = post ? nb_test_trace_thread(&t, post->tid) : NULL;
  CHECK_MSG(post && health && !strcmp(post->cat, "http") && pn && !strcmp(pn, "nabla-http"), "http spans %p %p on '%s'",
            (const void *)post, (const void *)health, pn ? pn : "-");
  size_t on_engine = 0;
  for (size_t i = 0; i < t.n; i++) {
    const char *tn = nb_test_trace_thread(&t, t.spans[i].tid);
    on_engine += (!strcmp(t.spans[i].cat, "kernel") || !strcmp(t.spans[i].cat, "gemm")) && tn && !strcmp(tn, "nabla-engine");
  }
  CHECK_MSG(on_engine > 0, "no compiled steps on the engine's track");
  size_t per_seq = 0; /* the engine's KV blocks, and the request's */
  for (size_t i = 0; i < t.ncounters; i++) per_seq += !strncmp(t.counters[i].name, "kv blocks: request ", 19);
  CHECK_MSG(nb_test_trace_samples(&t, "kv blocks") > 0 && per_seq > 0, "%zu KV block samples, %zu of sequences",
            nb_test_trace_samples(&t, "kv blocks"), per_seq);
  nb_test_trace_free(&t);
}

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return 77;
  nb_test_scratch_dir(work, sizeof work, "train", "profile");
  char corpus[600];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
  write_corpus(corpus);
  make_tiny_args();
  train_steps(bin);
  whole_command(bin);
  serve_traced(bin);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("train/test_profile");
}
