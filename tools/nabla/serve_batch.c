/* `nabla serve MODEL --batch in.jsonl --output out.jsonl`: OpenAI's batch
 * file format, answered offline. Every line is checked as the HTTP server
 * checks a request, and all of them go to the engine at once (continuous
 * batching does the rest). Input lines {"custom_id", "method": "POST",
 * "url": "/v1/completions" | "/v1/chat/completions", "body": {...}};
 * output lines, in input order, {"id", "custom_id", "response":
 * {"status_code", "request_id", "body"}, "error"}: a request the API
 * refuses gets its status and OpenAI error body, a line that is no request
 * at all gets "response": null and an error object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve_int.h"

typedef struct line {
  job *j;                       /* running, NULL once answered or refused */
  char *custom_id;
  cJSON *answer;                /* the output line once known */
} line;

static cJSON *out_line(int64_t i, const char *custom_id) {
  cJSON *o = cJSON_CreateObject();
  char id[64];
  snprintf(id, sizeof id, "batch_req_%lld", (long long)i);
  cJSON_AddStringToObject(o, "id", id);
  custom_id ? (void)cJSON_AddStringToObject(o, "custom_id", custom_id) : (void)cJSON_AddNullToObject(o, "custom_id");
  return o;
}

/* A line that is no request: response null, error {code, message}. */
static cJSON *line_error(int64_t i, const char *custom_id, const char *msg) {
  cJSON *o = out_line(i, custom_id), *e;
  cJSON_AddNullToObject(o, "response");
  e = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(e, "code", "invalid_request");
  cJSON_AddStringToObject(e, "message", msg);
  return o;
}

/* An API answer: its status and body. */
static cJSON *line_response(int64_t i, const char *custom_id, unsigned status, const char *request_id, cJSON *body) {
  cJSON *o = out_line(i, custom_id), *r = cJSON_AddObjectToObject(o, "response");
  cJSON_AddNumberToObject(r, "status_code", status);
  cJSON_AddStringToObject(r, "request_id", request_id);
  cJSON_AddItemToObject(r, "body", body);
  cJSON_AddNullToObject(o, "error");
  return o;
}

/* Checks one input line and submits it, or answers it at once. */
static void start_line(server *sv, int64_t i, const char *text, size_t n, line *l, pthread_mutex_t *mu, pthread_cond_t *cv) {
  char msg[5200];
  cJSON *in = cJSON_ParseWithLength(text, n);
  const cJSON *cid = cJSON_GetObjectItemCaseSensitive(in, "custom_id"), *method = cJSON_GetObjectItemCaseSensitive(in, "method");
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(in, "url"), *body = cJSON_GetObjectItemCaseSensitive(in, "body");
  if (cJSON_IsString(cid)) l->custom_id = strdup(cid->valuestring);
  const char *why = !in ? "the line is not valid JSON"
                    : !cJSON_IsObject(in) ? "the line must be a JSON object"
                    : !cJSON_IsString(cid) ? "'custom_id' must be a string"
                    : !cJSON_IsString(method) || strcmp(method->valuestring, "POST") ? "'method' must be \"POST\""
                    : !cJSON_IsString(url) || (strcmp(url->valuestring, "/v1/completions") &&
                                               strcmp(url->valuestring, "/v1/chat/completions"))
                        ? "'url' must be \"/v1/completions\" or \"/v1/chat/completions\""
                    : !cJSON_IsObject(body) ? "'body' must be a JSON object"
                                            : NULL;
  if (why) {
    snprintf(msg, sizeof msg, "line %lld: %s", (long long)i + 1, why);
    l->answer = line_error(i, l->custom_id, msg);
    cJSON_Delete(in);
    return;
  }
  bool chat = !strcmp(url->valuestring, "/v1/chat/completions");
  bad b = {0};
  creq q;
  char rid[64];
  snprintf(rid, sizeof rid, "batch-%lld", (long long)i + 1);
  bool ok = parse_request(sv, body, chat, &q, &b);
  if (ok && q.stream) ok = fail(&b, 400, "stream", "'stream' is not supported in a batch file");
  if (!ok) {
    l->answer = line_response(i, l->custom_id, b.status, rid,
                              error_json(error_type(b.status), b.param[0] ? b.param : NULL,
                                         b.status == 404 ? "model_not_found" : NULL, b.msg));
    creq_free(&q);
  } else if (!(l->j = job_new(sv, &q, mu, cv))) {
    creq_free(&q);
    l->answer = line_response(i, l->custom_id, 500, rid, error_json("server_error", NULL, NULL, "out of memory"));
  } else {
    job_submit(l->j);
  }
  cJSON_Delete(in);
}

int serve_batch(server *sv) {
  const options *o = &sv->opt;
  size_t n = 0;
  char *text = nb_cli_read_input("serve", o->batch, &n);
  if (!text) return 1;
  FILE *out = fopen(o->output, "w");
  if (!out) {
    free(text);
    return fprintf(stderr, "nabla serve: cannot write %s\n", o->output), 1;
  }
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_mutex_init(&mu, NULL);
  pthread_cond_init(&cv, NULL);
  line *lines = NULL;
  int64_t count = 0, cap = 0;
  bool ok = engine_start(sv);
  /* every line goes in first: the engine batches them as it likes */
  for (size_t at = 0; ok && at < n;) {
    const char *nl = memchr(text + at, '\n', n - at);
    size_t len = nl ? (size_t)(nl - (text + at)) : n - at;
    size_t k = 0;
    while (k < len && strchr(" \t\r", text[at + k])) k++;
    if (k < len) {
      if (count == cap) {
        cap = cap ? 2 * cap : 64;
        line *g = realloc(lines, (size_t)cap * sizeof *g);
        if (!g) {
          ok = false;
          break;
        }
        lines = g;
      }
      lines[count] = (line){0};
      start_line(sv, count, text + at, len, &lines[count], &mu, &cv);
      count++;
    }
    at += len + 1;
  }
  /* then answers as they complete */
  for (int64_t left = count; ok;) {
    left = 0;
    for (int64_t i = 0; i < count; i++) {
      line *l = &lines[i];
      if (!l->j) continue;
      if (!job_pump(l->j, 0)) {
        left++;
        continue;
      }
      l->answer = l->j->failed ? line_response(i, l->custom_id, 500, l->j->q.id,
                                               error_json("server_error", NULL, NULL, l->j->failed))
                              : line_response(i, l->custom_id, 200, l->j->q.id, job_response(l->j));
      job_unref(l->j);
      l->j = NULL;
    }
    if (!left) break;
    pthread_mutex_lock(&mu);
    bool pending = false;
    for (int64_t i = 0; i < count && !pending; i++) pending = lines[i].j && (lines[i].j->n_ev || lines[i].j->error);
    if (!pending) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
  }
  engine_stop(sv);
  int64_t answered = 0, failed = 0;
  for (int64_t i = 0; i < count; i++) {
    line *l = &lines[i];
    if (l->j) job_unref(l->j);
    char *s = l->answer ? cJSON_PrintUnformatted(l->answer) : NULL;
    if (s) {
      fprintf(out, "%s\n", s);
      answered++;
      const cJSON *r = cJSON_GetObjectItemCaseSensitive(l->answer, "response");
      const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "status_code");
      failed += !cJSON_IsNumber(st) || st->valuedouble != 200;
    }
    free(s);
    cJSON_Delete(l->answer);
    free(l->custom_id);
  }
  free(lines);
  free(text);
  bool write_error = ferror(out) != 0; /* before fclose, which must run either way */
  bool wrote = fclose(out) == 0 && !write_error;
  pthread_cond_destroy(&cv);
  pthread_mutex_destroy(&mu);
  if (!ok || !wrote || answered != count)
    return fprintf(stderr, "nabla serve: --batch: %s\n", !wrote ? "cannot write the output" : "out of memory"), 1;
  fprintf(stderr, "nabla serve: --batch: %lld requests answered (%lld with an error) in %s\n", (long long)count,
          (long long)failed, o->output);
  return 0;
}
