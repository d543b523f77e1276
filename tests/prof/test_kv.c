/* The serving engine's KV blocks in a trace: after each planned step the
 * engine records the counter "kv blocks" (used, free, cached, sequences)
 * and one per sequence, 0 when a sequence gives its blocks back; the trace
 * holds them as Chrome "C" events and the memory viewer's JSON as the
 * timeline, the peak and each sequence's blocks at the peak. Two requests
 * (10 and 6 prompt tokens, blocks of 4) are worked out by hand: 3 + 2
 * blocks used at the first step, then one of the finished request's full
 * blocks stays cached for the prefix cache. */
#include <cjson/cJSON.h>

#include "nabla/serve.h"
#include "test.h"
#include "testfs.h"
#include "tracecheck.h"

static nb_ctx *ctx;
static char work[512];

static const nb_test_counter *sample(const nb_test_trace *t, const char *name, size_t k) {
  for (size_t i = 0; i < t->ncounters; i++)
    if (!strcmp(t->counters[i].name, name) && k-- == 0) return &t->counters[i];
  return NULL;
}

static bool args_are(const nb_test_counter *c, const char *json) {
  CHECK_MSG(c && !strcmp(c->args, json), "counter '%s' args %s, want %s", c ? c->name : "?", c ? c->args : "(none)", json);
  return c && !strcmp(c->args, json);
}

static void step(nb_serve_engine *e, int32_t token) {
  const nb_serve_batch *b = NULL;
  CHECK_OK(ctx, nb_serve_schedule(e, &b));
  for (int32_t i = 0; b && i < b->num_seqs; i++)
    if (b->seqs[i].needs_logits)
      for (int32_t k = 0; k < b->seqs[i].num_samples; k++)
        CHECK_OK(ctx, nb_serve_append_token(e, b->seqs[i].request_id, b->seqs[i].sample_indices[k], token, NULL));
}

int main(void) {
  ctx = nb_ctx_create();
  nb_test_scratch_dir(work, sizeof work, "prof", "kv");
  nb_serve_config c = {.num_blocks = 16, .block_size = 4, .max_num_seqs = 4, .max_model_len = 32, .enable_prefix_caching = true};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &c);
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  if (!e) return nb_test_summary("prof/test_kv");
  int32_t p1[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, p2[6] = {11, 12, 13, 14, 15, 16};
  char path[700];
  snprintf(path, sizeof path, "%s/trace.json", work);
  step(e, 0); /* nothing queued, before the trace: not recorded */
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path}));
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 1, .prompt = p1, .prompt_len = 10, .max_tokens = 2}));
  CHECK_OK(ctx, nb_serve_add_request(e, &(nb_serve_request){.id = 2, .prompt = p2, .prompt_len = 6, .max_tokens = 1}));
  step(e, 20); /* both prompts: 3 + 2 blocks; request 2 is done and gives its back */
  step(e, 21); /* request 1 decodes in its third block; then it is done */
  step(e, 22); /* nothing left */
  CHECK_OK(ctx, nb_prof_stop(ctx));
  nb_serve_engine_destroy(e);

  nb_test_trace t;
  if (nb_test_trace_load(path, &t) == 0) {
    CHECK_MSG(nb_test_trace_samples(&t, "kv blocks") == 3, "%zu samples", nb_test_trace_samples(&t, "kv blocks"));
    args_are(sample(&t, "kv blocks", 0), "{\"used\":5,\"free\":11,\"cached\":0,\"sequences\":2}");
    /* request 2's first block (tokens 11-14) is full: published at the next step, kept on the LRU */
    args_are(sample(&t, "kv blocks", 1), "{\"used\":3,\"free\":12,\"cached\":1,\"sequences\":1}");
    const nb_test_counter *end = sample(&t, "kv blocks", 2);
    CHECK_MSG(end && strstr(end->args, "\"used\":0,") && strstr(end->args, "\"sequences\":0"), "%s", end ? end->args : "-");
    CHECK(nb_test_trace_samples(&t, "kv blocks: request 1/0") == 3 && nb_test_trace_samples(&t, "kv blocks: request 2/0") == 2);
    args_are(sample(&t, "kv blocks: request 1/0", 0), "{\"blocks\":3}");
    args_are(sample(&t, "kv blocks: request 2/0", 0), "{\"blocks\":2}");
    args_are(sample(&t, "kv blocks: request 2/0", 1), "{\"blocks\":0}"); /* given back */
    args_are(sample(&t, "kv blocks: request 1/0", 2), "{\"blocks\":0}");
    nb_test_trace_free(&t);
  }
  snprintf(path, sizeof path, "%s/trace.memory.json", work);
  char *text = nb_test_read_file(path, NULL);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  const cJSON *kv = cJSON_GetObjectItemCaseSensitive(j, "kv_cache"), *peak = cJSON_GetObjectItemCaseSensitive(kv, "peak");
  CHECK_MSG(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(kv, "samples")) == 3 &&
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(peak, "used")) == 5 &&
                cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(kv, "timeline")) == 3,
            "%s", text ? text : "(no memory.json)");
  const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(peak, "sequences"), *s0 = cJSON_GetArrayItem(seqs, 0), *s1 = cJSON_GetArrayItem(seqs, 1);
  CHECK_MSG(cJSON_GetArraySize(seqs) == 2 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s0, "name")), "request 1/0") &&
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(s0, "blocks")) == 3 &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s1, "name")), "request 2/0") &&
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(s1, "blocks")) == 2,
            "%s", text ? text : "");
  cJSON_Delete(j);
  free(text);
  snprintf(path, sizeof path, "%s/trace.memory.html", work);
  text = nb_test_read_file(path, NULL);
  CHECK(text && strstr(text, "<section class=\"nb-kv\">") && strstr(text, "request 1/0"));
  /* read back for a report: the page's section, byte for byte */
  snprintf(path, sizeof path, "%s/trace.json", work);
  char *sec = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&sec, &n);
  CHECK_OK(ctx, nb_prof_trace_memory_html(ctx, path, 0, f));
  fclose(f);
  CHECK_MSG(!strncmp(sec, "<section class=\"nb-kv\">", 23) && text && strstr(text, sec), "%s", sec);
  free(sec);
  free(text);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("prof/test_kv");
}
