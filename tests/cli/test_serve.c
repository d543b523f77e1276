/* `nabla serve` over loopback, with a raw HTTP/1.1 client (so half-sent
 * requests can be sent too): /health, /v1/models, /tokenize, /detokenize,
 * a completion, and every error in OpenAI's shape with its status (400
 * malformed JSON, wrong types naming the field, invalid UTF-8, a prompt plus
 * max_tokens beyond the context; 401 bad or missing API key; 404 unknown
 * model and route; 405 wrong method; 413 body over the limit), a half-sent
 * request closed by the timeout, and SIGTERM exiting 0. The test starts the
 * server (--port 0: it prints the port) and stops it by its PID.
 * Completions, streaming and chat through the official openai client:
 * tests/cli/peer_serve.py. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <pthread.h>

#include "testfs.h"
#include "testserve.h"

static const char *bin;
static char work[4096], out[1 << 16], err[1 << 16];
static const char *model = "run"; /* what start_server serves */
static nb_test_server srv = {.pid = -1};

static char resp[1 << 18];
static const char *resp_body;

static int http_into(const char *method, const char *path, const char *headers, const char *body, size_t body_len,
                     char *dst, size_t cap, const char **body_out) {
  return nb_test_http(srv.port, method, path, headers, body, body_len, dst, cap, body_out, 20);
}

static int http(const char *method, const char *path, const char *headers, const char *body, size_t body_len) {
  return http_into(method, path, headers, body, body_len, resp, sizeof resp, &resp_body);
}

static const char *auth = "Authorization: Bearer sekrit\r\n";

static int post(const char *path, const char *json) { return http("POST", path, auth, json, strlen(json)); }

/* An OpenAI error: status, and the message and param contain the needles. */
#define CHECK_ERROR(status_got, status_want, needle, param)                                                        \
  do {                                                                                                               \
    int s_ = (status_got);                                                                                           \
    CHECK_MSG(s_ == (status_want) && strstr(resp_body, "{\"error\":{\"message\":\"") && strstr(resp_body, needle) && \
                  strstr(resp_body, param),                                                                          \
              "status %d (want %d), body: %s", s_, status_want, resp_body);                                          \
  } while (0)

static bool start_server(const char *args) { return nb_test_serve_start(&srv, bin, work, NULL, model, args); }

/* SIGTERM: the server stops and exits 0 within a few seconds. */
static void stop_server(void) { nb_test_serve_stop(&srv); }

static void test_endpoints(void) {
  CHECK_MSG(http("GET", "/health", NULL, NULL, 0) == 200, "%s", resp); /* no key needed */
  CHECK_MSG(http("GET", "/v1/models", auth, NULL, 0) == 200 && strstr(resp_body, "\"object\":\"list\"") &&
                strstr(resp_body, "\"id\":\"tiny\"") && strstr(resp_body, "\"max_model_len\":64"),
            "%s", resp);
  /* byte-level model (no tokenizer): ids are the bytes */
  CHECK_MSG(post("/tokenize", "{\"prompt\": \"line 5\"}") == 200 &&
                strstr(resp_body, "\"tokens\":[108,105,110,101,32,53]") && strstr(resp_body, "\"count\":6"),
            "%s", resp);
  CHECK_MSG(post("/detokenize", "{\"tokens\": [108, 105, 110, 101]}") == 200 && strstr(resp_body, "\"prompt\":\"line\""),
            "%s", resp);
  /* a byte that is no UTF-8 comes back as U+FFFD, never raw */
  CHECK_MSG(post("/detokenize", "{\"tokens\": [108, 255]}") == 200 && strstr(resp_body, "\"prompt\":\"l\xEF\xBF\xBD\""),
            "%s", resp);
  CHECK_MSG(post("/v1/completions", "{\"model\": \"tiny\", \"prompt\": \"line\", \"max_tokens\": 3, \"temperature\": 0}") == 200 &&
                strstr(resp_body, "\"object\":\"text_completion\"") && strstr(resp_body, "\"finish_reason\":\"length\"") &&
                strstr(resp_body, "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3,\"total_tokens\":7}"),
            "%s", resp);
  /* prompt as token ids */
  CHECK_MSG(post("/v1/completions", "{\"prompt\": [108, 105], \"max_tokens\": 2, \"temperature\": 0}") == 200 &&
                strstr(resp_body, "\"prompt_tokens\":2,\"completion_tokens\":2"),
            "%s", resp);
}

static void test_errors(void) {
  /* API key: missing, wrong, wrong scheme */
  CHECK_ERROR(http("GET", "/v1/models", NULL, NULL, 0), 401, "API key", "\"code\":\"invalid_api_key\"");
  CHECK_ERROR(http("GET", "/v1/models", "Authorization: Bearer sekriT\r\n", NULL, 0), 401, "API key", "authentication_error");
  CHECK_ERROR(http("POST", "/v1/completions", "Authorization: sekrit\r\n", "{}", 2), 401, "API key", "\"param\":null");
  /* routes and methods */
  CHECK_ERROR(http("GET", "/v2/nothing", auth, NULL, 0), 404, "no route GET /v2/nothing", "not_found_error");
  CHECK_ERROR(http("GET", "/v1/completions", auth, NULL, 0), 405, "/v1/completions takes POST, not GET", "\"param\":null");
  CHECK_ERROR(http("DELETE", "/v1/models", auth, NULL, 0), 405, "takes GET, not DELETE", "\"param\":null");
  /* bodies */
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", "), 400, "malformed JSON", "\"param\":null");
  CHECK_ERROR(post("/v1/completions", ""), 400, "empty", "\"param\":null");
  CHECK_ERROR(post("/v1/completions", "[1, 2]"), 400, "must be a JSON object", "\"param\":null");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"\xC3\x28\"}"), 400, "not valid UTF-8", "\"param\":null");
  /* wrong types, naming the field */
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"8\"}"), 400, "'max_tokens' must be an integer",
              "\"param\":\"max_tokens\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2.5}"), 400, "'max_tokens' must be an integer",
              "\"param\":\"max_tokens\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1e30}"), 400, "'max_tokens' is 1000000000000000019884624838656, outside",
              "\"param\":\"max_tokens\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"seed\": -1e300}"), 400, "'seed' is", "\"param\":\"seed\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": [1e30]}"), 400, "outside the vocabulary", "\"param\":\"prompt\"");
  CHECK_MSG(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1, \"seed\": -5}") == 200, "%s", resp);
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"temperature\": \"hot\"}"), 400, "'temperature' must be a number",
              "\"param\":\"temperature\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"top_p\": 2}"), 400, "'top_p' is 2, outside (0, 1]",
              "\"param\":\"top_p\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"stream\": 1}"), 400, "'stream' must be a boolean",
              "\"param\":\"stream\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": 7}"), 400, "'prompt' must be a string or an array", "\"param\":\"prompt\"");
  CHECK_ERROR(post("/v1/completions", "{\"max_tokens\": 1}"), 400, "'prompt' is required", "\"param\":\"prompt\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": [1, \"a\"]}"), 400, "array of integer token ids", "\"param\":\"prompt\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": [1, 100000]}"), 400, "token id 100000 is outside the vocabulary",
              "\"param\":\"prompt\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"stop\": [1]}"), 400, "'stop' must be a string or an array",
              "\"param\":\"stop\"");
  CHECK_ERROR(post("/v1/chat/completions", "{\"messages\": \"hi\"}"), 400, "'messages' must be a non-empty array",
              "\"param\":\"messages\"");
  CHECK_ERROR(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}"), 400,
              "messages[0].role 'robot'", "\"param\":\"messages\"");
  CHECK_ERROR(post("/tokenize", "{\"prompt\": 3}"), 400, "'prompt' must be a string", "\"param\":\"prompt\"");
  CHECK_ERROR(post("/detokenize", "{\"tokens\": \"ab\"}"), 400, "'tokens' must be an array", "\"param\":\"tokens\"");
  /* what nabla cannot do is refused by name, not ignored */
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"suffix\": \"y\"}"), 400, "'suffix' is not supported",
              "\"param\":\"suffix\"");
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"x\", \"best_of\": 3, \"n\": 2}"), 400, "only best_of = n (2)",
              "\"param\":\"best_of\"");
  CHECK_ERROR(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": []}"), 400,
              "'tools' is not supported", "\"param\":\"tools\"");
  CHECK_ERROR(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                   "\"response_format\": {\"type\": \"json_object\"}}"), 400, "'response_format' is not supported",
              "\"param\":\"response_format\"");
  /* unknown model */
  CHECK_ERROR(post("/v1/completions", "{\"model\": \"gpt-4\", \"prompt\": \"x\"}"), 404, "The model 'gpt-4' does not exist",
              "\"code\":\"model_not_found\"");
  CHECK_ERROR(post("/tokenize", "{\"model\": \"gpt-4\", \"prompt\": \"x\"}"), 404, "does not exist", "\"param\":\"model\"");
  /* the context: 64 tokens */
  CHECK_ERROR(post("/v1/completions", "{\"prompt\": \"line\", \"max_tokens\": 61}"), 400,
              "maximum context length is 64 tokens. However, you requested 65 tokens (4 in the prompt, 61 for the completion)",
              "\"param\":\"max_tokens\"");
  CHECK_MSG(post("/v1/completions", "{\"prompt\": \"line\", \"max_tokens\": 60, \"temperature\": 0}") == 200, "%s", resp);
  /* over the body limit (2000 bytes here): by Content-Length before the body
   * is read, and by the bytes of a chunked body that declares none */
  char big[4096];
  memset(big, ' ', sizeof big);
  memcpy(big, "{\"prompt\": \"x\"}", 15);
  CHECK_ERROR(http("POST", "/v1/completions", auth, big, sizeof big), 413, "over the limit of 2000 bytes", "\"param\":null");
  int fd = nb_test_connect_loopback(srv.port);
  char req[8192];
  int n = snprintf(req, sizeof req,
                   "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sTransfer-Encoding: chunked\r\n\r\n"
                   "%x\r\n%.*s\r\n0\r\n\r\n",
                   auth, 3000, 3000, big);
  CHECK(fd >= 0 && write(fd, req, (size_t)n) == n);
  nb_test_read_until_closed(fd, resp, sizeof resp, 20);
  close(fd);
  CHECK_MSG(strstr(resp, "HTTP/1.1 413") && strstr(resp, "over the limit"), "%s", resp);
  /* the server still answers */
  CHECK_MSG(http("GET", "/health", NULL, NULL, 0) == 200, "%s", resp);
}

/* A half-sent request is closed after --timeout (1 s here). */
static void test_timeout(void) {
  int fd = nb_test_connect_loopback(srv.port);
  char half[512];
  int n = snprintf(half, sizeof half, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 100\r\n\r\n{\"prompt\":", auth);
  CHECK(fd >= 0 && write(fd, half, (size_t)n) == n);
  double t0 = nb_test_now();
  char junk[4096];
  size_t got = nb_test_read_until_closed(fd, junk, sizeof junk, 20); /* returns when the server closes */
  double dt = nb_test_now() - t0;
  close(fd);
  CHECK_MSG(dt > 0.5 && dt < 5 && !strstr(junk, "HTTP/1.1 2"), "a half-sent request was closed after %.2f s (timeout 1 s): %zu bytes: %s", dt, got, junk);
  CHECK_MSG(http("GET", "/health", NULL, NULL, 0) == 200, "%s", resp);
}

/* "tokens":[...] of a byte-level model for text */
static void byte_ids(const char *text, char *dst, size_t cap) {
  size_t n = (size_t)snprintf(dst, cap, "\"tokens\":[");
  for (const unsigned char *p = (const unsigned char *)text; *p && n < cap; p++)
    n += (size_t)snprintf(dst + n, cap - n, "%s%u", p == (const unsigned char *)text ? "" : ",", *p);
  if (n < cap) snprintf(dst + n, cap - n, "]");
}

/* Each chat format renders a conversation as the models' own templates do
 * (seen through /tokenize with messages; the model is byte-level, so the
 * ids are the rendered bytes); tokenizer_config.json's chat_template picks
 * the format, and one nabla does not know turns chat off with a reason. */
static void test_chat_templates(void) {
  static const char msgs[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
                             "\"content\": \" hi \"}, {\"role\": \"assistant\", \"content\": \"yo\"}, "
                             "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}]}";
  static const char no_system[] = "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, {\"role\": "
                                  "\"assistant\", \"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"q\"}]}";
  static const struct {
    const char *name, *messages, *want;
  } cases[] = {
      {"chatml", msgs,
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
       "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"},
      {"llama-3", msgs,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
       "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"gemma", no_system,
       "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n<start_of_turn>user\nq"
       "<end_of_turn>\n<start_of_turn>model\n"},
      {"llama-2", msgs, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n hi [/INST] yo </s><s>[INST] q [/INST]"},
      {"mistral", msgs, "<s>[INST] S\n\n hi  [/INST]yo</s>[INST] q [/INST]"},
  };
  static char want[1 << 14];
  char args[256];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(args, sizeof args, "--api-key sekrit --chat-template %s", cases[i].name);
    if (!start_server(args)) return;
    byte_ids(cases[i].want, want, sizeof want);
    CHECK_MSG(post("/tokenize", cases[i].messages) == 200 && strstr(resp_body, want), "%s: %s\nwant %s", cases[i].name,
              resp_body, want);
    if (!strcmp(cases[i].name, "gemma"))
      CHECK_ERROR(post("/v1/chat/completions", msgs), 400, "messages[0]: the gemma template has no system role",
                  "\"param\":\"messages\"");
    stop_server();
  }
  /* picked from tokenizer_config.json */
  nb_test_write_text("run/tokenizer_config.json", "{\"chat_template\": \"{% for m in messages %}<|start_header_id|>"
                                                  "{{ m.role }}<|end_header_id|>{% endfor %}\"}");
  if (start_server("--api-key sekrit")) {
    char *o = nb_test_read_file("serve.out", NULL);
    CHECK_MSG(o && strstr(o, "chat template llama-3"), "%s", o ? o : "");
    free(o);
    stop_server();
  }
  nb_test_write_text("run/tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
  if (start_server("--api-key sekrit")) {
    CHECK_ERROR(post("/v1/chat/completions", msgs), 400, "tokenizer_config.json's chat_template is none nabla knows",
                "\"param\":\"messages\"");
    stop_server();
  }
  unlink("run/tokenizer_config.json");
}

/* ---------------------------------------------------------------- the engine behind the API */

/* A chunked HTTP body, de-chunked in place (streamed responses). */
static void dechunk(char *b) {
  char *w = b, *r = b;
  for (;;) {
    char *end = NULL;
    unsigned long n = strtoul(r, &end, 16);
    if (end == r || !(end = strstr(end, "\r\n")) || n == 0) break;
    r = end + 2;
    if (strlen(r) < n) n = strlen(r);
    memmove(w, r, n);
    w += n, r += n;
    if (!strncmp(r, "\r\n", 2)) r += 2;
  }
  *w = 0;
}

/* A response's choices: text (or message content) and finish reason per
 * index; streamed responses are added up chunk by chunk. */
typedef struct answer {
  int status, n;
  char text[8][2048];
  char finish[8][16];
  int prompt_tokens, completion_tokens;
  bool done;                    /* streamed: data: [DONE] seen */
  int chunks;
} answer;

static void add_choices(answer *a, const cJSON *root) {
  const cJSON *c, *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
  cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "choices")) {
    int i = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "index"));
    if (i < 0 || i >= 8) continue;
    if (i + 1 > a->n) a->n = i + 1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text"), *m = cJSON_GetObjectItemCaseSensitive(c, "message");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta"), *f = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(m ? m : d, "content");
    if (cJSON_IsString(t)) strncat(a->text[i], t->valuestring, sizeof a->text[i] - strlen(a->text[i]) - 1);
    if (cJSON_IsString(f)) snprintf(a->finish[i], sizeof a->finish[i], "%s", f->valuestring);
  }
  if (cJSON_IsObject(u)) {
    a->prompt_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"));
    a->completion_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens"));
  }
}

/* Parses a body (whole JSON, or server-sent events when streamed). */
static void parse_answer(answer *a, char *body, bool streamed) {
  if (!streamed) {
    cJSON *root = cJSON_Parse(body);
    if (root) add_choices(a, root);
    cJSON_Delete(root);
    return;
  }
  dechunk(body);
  for (char *at = strstr(body, "data: "); at; at = strstr(at, "data: ")) {
    at += 6;
    char *end = strstr(at, "\n\n");
    if (!end) break;
    *end = 0;
    if (!strcmp(at, "[DONE]")) a->done = true;
    cJSON *root = cJSON_Parse(at);
    if (root) add_choices(a, root), a->chunks++;
    cJSON_Delete(root);
    at = end + 1;
  }
}

/* POSTs json (thread-safe) and parses the answer. */
static void ask(const char *path, const char *json, answer *a) {
  static __thread char buf[1 << 18];
  const char *body;
  memset(a, 0, sizeof *a);
  a->status = http_into("POST", path, auth, json, strlen(json), buf, sizeof buf, &body);
  if (a->status == 200) parse_answer(a, (char *)body, strstr(json, "\"stream\": true") != NULL);
  if (a->status != 200 || !a->n) snprintf(a->text[0], sizeof a->text[0], "%s", body);
}

#define NCONC 12

typedef struct conc {
  const char *path;
  char json[512];
  answer a;
} conc;

static void *conc_main(void *arg) {
  conc *c = arg;
  ask(c->path, c->json, &c->a);
  return NULL;
}

/* Batch invariance through HTTP: a random mix of 12 requests (completions
 * or chat, streamed or not, n 1 or 2, varied prompts, lengths and stop
 * strings) sent at once each get exactly the answer they get alone:
 * greedy, and with a seed at temperature 0.8. */
static void test_concurrent(void) {
  static const char *const prompts[] = {"line 3 of", "for the", "small", "corpus", "test", "line 12", "of a", "serve"};
  nb_test_rng rng = {42};
  for (int sampled = 0; sampled < 2; sampled++) {
    static conc c[NCONC];
    static answer alone[NCONC];
    for (int i = 0; i < NCONC; i++) {
      bool chat = nb_test_int(&rng, 0, 2) == 0, stream = nb_test_int(&rng, 0, 1);
      /* ChatML takes about 50 of the 64 tokens of context */
      int n = (int)nb_test_int(&rng, 1, 2), max_tokens = chat ? (int)nb_test_int(&rng, 1, 4) : (int)nb_test_int(&rng, 4, 40);
      const char *p = prompts[nb_test_int(&rng, 0, 7)], *stop = nb_test_int(&rng, 0, 3) == 0 ? ", \"stop\": \"or\"" : "";
      char head[160];
      if (chat) snprintf(head, sizeof head, "\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]", p);
      else snprintf(head, sizeof head, "\"prompt\": \"%s\"", p);
      c[i].path = chat ? "/v1/chat/completions" : "/v1/completions";
      snprintf(c[i].json, sizeof c[i].json, "{%s, \"max_tokens\": %d, \"n\": %d, \"temperature\": %s, \"seed\": %d%s%s}", head,
               max_tokens, n, sampled ? "0.8" : "0", 100 + i, stop, stream ? ", \"stream\": true" : "");
      ask(c[i].path, c[i].json, &alone[i]);
      CHECK_MSG(alone[i].status == 200 && alone[i].n == n && (!stream || alone[i].done), "%s: status %d, %d choices: %s", c[i].json,
                alone[i].status, alone[i].n, alone[i].text[0]);
    }
    pthread_t th[NCONC];
    for (int i = 0; i < NCONC; i++) pthread_create(&th[i], NULL, conc_main, &c[i]);
    for (int i = 0; i < NCONC; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NCONC; i++)
      for (int k = 0; k < alone[i].n; k++)
        CHECK_MSG(c[i].a.status == 200 && c[i].a.n == alone[i].n && !strcmp(c[i].a.text[k], alone[i].text[k]) &&
                      !strcmp(c[i].a.finish[k], alone[i].finish[k]),
                  "%s choice %d: concurrent %d '%s' (%s) != alone '%s' (%s)", c[i].json, k, c[i].a.status, c[i].a.text[k],
                  c[i].a.finish[k], alone[i].text[k], alone[i].finish[k]);
  }
}

/* cJSON of a whole answer (for shapes). */
static cJSON *post_json(const char *path, const char *json) {
  int st = post(path, json);
  CHECK_MSG(st == 200, "%s: %d %s", json, st, resp_body);
  return st == 200 ? cJSON_Parse(resp_body) : NULL;
}

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* n > 1, lists of prompts, logprobs' shapes, stop_token_ids, min_tokens,
 * max_tokens 0 with echo. */
static void test_choices(void) {
  answer one, a, b, s;
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0}", &one);
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0, \"n\": 3}", &a);
  CHECK_MSG(a.status == 200 && a.n == 3 && a.completion_tokens == 30 && a.prompt_tokens == 6, "n=3: %d, %d choices, usage %d/%d",
            a.status, a.n, a.prompt_tokens, a.completion_tokens);
  for (int i = 0; i < 3; i++) CHECK_MSG(!strcmp(a.text[i], one.text[0]), "n=3 greedy choice %d '%s' != '%s'", i, a.text[i], one.text[0]);
  /* two prompts, n = 2: choices prompt-major; prompt tokens counted once each */
  ask("/v1/completions", "{\"prompt\": [\"line 5\", [102, 111, 114, 32, 116, 104, 101]], \"max_tokens\": 10, \"temperature\": 0, \"n\": 2}", &a);
  ask("/v1/completions", "{\"prompt\": \"for the\", \"max_tokens\": 10, \"temperature\": 0}", &b);
  CHECK_MSG(strcmp(one.text[0], b.text[0]), "the two prompts continue alike ('%s'): the test cannot tell choices apart", b.text[0]);
  CHECK_MSG(a.status == 200 && a.n == 4 && a.prompt_tokens == 13 && a.completion_tokens == 40, "2 prompts x 2: %d, %d, %d/%d",
            a.status, a.n, a.prompt_tokens, a.completion_tokens);
  CHECK_MSG(!strcmp(a.text[0], one.text[0]) && !strcmp(a.text[1], one.text[0]) && !strcmp(a.text[2], b.text[0]) &&
                !strcmp(a.text[3], b.text[0]),
            "prompt-major choices: '%s' '%s' '%s' '%s', want '%s' x2, '%s' x2", a.text[0], a.text[1], a.text[2], a.text[3],
            one.text[0], b.text[0]);
  /* streamed, n = 2: each index adds up to the whole, then [DONE] */
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0, \"n\": 2, \"stream\": true, "
                         "\"stream_options\": {\"include_usage\": true}}", &s);
  CHECK_MSG(s.status == 200 && s.done && s.n == 2 && !strcmp(s.text[0], one.text[0]) && !strcmp(s.text[1], one.text[0]) &&
                !strcmp(s.finish[1], "length") && s.completion_tokens == 20,
            "streamed n=2: %d, done %d, '%s' '%s' (%s) usage %d", s.status, s.done, s.text[0], s.text[1], s.finish[1],
            s.completion_tokens);
  /* chat n = 2 */
  ask("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"line 7\"}], \"max_tokens\": 6, "
                              "\"temperature\": 0, \"n\": 2}", &a);
  CHECK_MSG(a.status == 200 && a.n == 2 && !strcmp(a.text[0], a.text[1]) && a.completion_tokens == 2 * 6, "chat n=2: %d %d '%s' '%s'",
            a.status, a.n, a.text[0], a.text[1]);

  /* completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}, one per token */
  cJSON *r = post_json("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0, \"logprobs\": 0}");
  const cJSON *lp = item(cJSON_GetArrayItem(item(r, "choices"), 0), "logprobs");
  int nt = cJSON_GetArraySize(item(lp, "tokens"));
  CHECK_MSG(nt == 10 && cJSON_GetArraySize(item(lp, "token_logprobs")) == 10 && cJSON_GetArraySize(item(lp, "top_logprobs")) == 10 &&
                cJSON_GetArraySize(item(lp, "text_offset")) == 10,
            "logprobs shape: %d tokens", nt);
  char joined[256] = "";
  int offset = 0;
  bool offsets_ok = true, lps_ok = true;
  for (int i = 0; i < nt; i++) {
    const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(item(lp, "tokens"), i));
    double l = cJSON_GetNumberValue(cJSON_GetArrayItem(item(lp, "token_logprobs"), i));
    offsets_ok &= (int)cJSON_GetNumberValue(cJSON_GetArrayItem(item(lp, "text_offset"), i)) == offset;
    lps_ok &= l <= 0 && l > -100;
    if (t) strncat(joined, t, sizeof joined - strlen(joined) - 1), offset += (int)strlen(t);
  }
  CHECK_MSG(!strcmp(joined, one.text[0]) && offsets_ok && lps_ok, "logprobs tokens '%s' != text '%s', offsets %d, logprobs %d", joined,
            one.text[0], offsets_ok, lps_ok);
  cJSON_Delete(r);
  /* chat logprobs: content [{token, logprob, bytes, top_logprobs}] */
  r = post_json("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"line 7\"}], \"max_tokens\": 6, "
                                        "\"temperature\": 0, \"logprobs\": true}");
  const cJSON *content = item(item(cJSON_GetArrayItem(item(r, "choices"), 0), "logprobs"), "content"), *e;
  int ne = 0;
  bool shape = true;
  cJSON_ArrayForEach(e, content) {
    ne++;
    shape &= cJSON_IsString(item(e, "token")) && cJSON_IsNumber(item(e, "logprob")) && cJSON_IsArray(item(e, "bytes")) &&
             cJSON_IsArray(item(e, "top_logprobs")) && cJSON_GetArraySize(item(e, "top_logprobs")) == 0;
  }
  CHECK_MSG(ne == 6 && shape, "chat logprobs: %d entries, shape %d", ne, shape);
  cJSON_Delete(r);
  /* top logprobs: greedy draws the most likely token */
  int st = post("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 4, \"temperature\": 0, \"logprobs\": 2}");
  r = cJSON_Parse(resp_body);
  lp = item(cJSON_GetArrayItem(item(r, "choices"), 0), "logprobs");
  bool ok = st == 200 && cJSON_GetArraySize(item(lp, "top_logprobs")) == 4;
  for (int i = 0; ok && i < 4; i++) {
    const cJSON *d = cJSON_GetArrayItem(item(lp, "top_logprobs"), i);
    const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(item(lp, "tokens"), i));
    ok = cJSON_GetArraySize(d) == 2 && t && item(d, t) && cJSON_GetNumberValue(item(d, t)) >= cJSON_GetNumberValue(d->child->next);
  }
  CHECK_MSG(ok, "top logprobs: %d %s", st, resp_body);
  cJSON_Delete(r);

  /* stop_token_ids end a sample (the token is not in the text); before
   * min_tokens they cannot be drawn */
  char json[512];
  int stop_id = (unsigned char)one.text[0][2], first = (int)(strchr(one.text[0], stop_id) - one.text[0]);
  snprintf(json, sizeof json, "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0, \"stop_token_ids\": [%d]}", stop_id);
  ask("/v1/completions", json, &a);
  CHECK_MSG(a.status == 200 && !strncmp(a.text[0], one.text[0], (size_t)first) && (int)strlen(a.text[0]) == first &&
                !strcmp(a.finish[0], "stop") && a.completion_tokens == first + 1,
            "stop_token_ids [%d]: '%s' (%s, %d tokens), want '%.*s'", stop_id, a.text[0], a.finish[0], a.completion_tokens, first,
            one.text[0]);
  snprintf(json, sizeof json, "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0, \"stop_token_ids\": [%d], "
                              "\"min_tokens\": 6}", stop_id);
  ask("/v1/completions", json, &a);
  CHECK_MSG(a.status == 200 && a.completion_tokens >= 6 && !strchr(a.text[0], stop_id), "min_tokens 6: '%s' (%d tokens)", a.text[0],
            a.completion_tokens);
  /* max_tokens 0 with echo: the prompt back, nothing generated */
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 0, \"echo\": true}", &a);
  CHECK_MSG(a.status == 200 && !strcmp(a.text[0], "line 5") && a.completion_tokens == 0 && !strcmp(a.finish[0], "length"),
            "echo, max_tokens 0: '%s' %d", a.text[0], a.completion_tokens);
  /* a seed reproduces; another seed draws otherwise */
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 16, \"temperature\": 1, \"seed\": 3}", &a);
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 16, \"temperature\": 1, \"seed\": 3}", &b);
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 16, \"temperature\": 1, \"seed\": 4}", &s);
  CHECK_MSG(a.status == 200 && !strcmp(a.text[0], b.text[0]) && strcmp(a.text[0], s.text[0]), "seeds 3, 3, 4: '%s' '%s' '%s'",
            a.text[0], b.text[0], s.text[0]);
}

/* Every new field's type and range errors name it. */
static void test_field_errors(void) {
  static const struct {
    const char *path, *json, *needle, *param;
  } cases[] = {
      {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": -1}", "'temperature' is -1, outside [0, 1e+06]", "temperature"},
      {"/v1/completions", "{\"prompt\": \"x\", \"top_p\": 0}", "'top_p' is 0, outside (0, 1]", "top_p"},
      {"/v1/completions", "{\"prompt\": \"x\", \"top_k\": -2}", "'top_k' is -2, outside [-1, 1000000000]", "top_k"},
      {"/v1/completions", "{\"prompt\": \"x\", \"min_p\": 1.5}", "'min_p' is 1.5, outside [0, 1]", "min_p"},
      {"/v1/completions", "{\"prompt\": \"x\", \"presence_penalty\": 3}", "'presence_penalty' is 3, outside [-2, 2]", "presence_penalty"},
      {"/v1/completions", "{\"prompt\": \"x\", \"frequency_penalty\": -2.5}", "'frequency_penalty' is -2.5, outside [-2, 2]",
       "frequency_penalty"},
      {"/v1/completions", "{\"prompt\": \"x\", \"repetition_penalty\": 0}", "'repetition_penalty' is 0, outside (0, 100]",
       "repetition_penalty"},
      {"/v1/completions", "{\"prompt\": \"x\", \"n\": 0}", "'n' is 0, outside [1, 16]", "n"},
      {"/v1/completions", "{\"prompt\": \"x\", \"n\": 17}", "'n' is 17, outside [1, 16]", "n"},
      {"/v1/completions", "{\"prompt\": \"x\", \"seed\": \"7\"}", "'seed' must be an integer", "seed"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": 6}", "'logprobs' is 6, outside [0, 5]", "logprobs"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": true}", "'logprobs' must be an integer", "logprobs"},
      {"/v1/completions", "{\"prompt\": \"x\", \"top_logprobs\": 2}", "'top_logprobs' is a chat field", "top_logprobs"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": 0, \"echo\": true}", "'echo' with 'logprobs'", "echo"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 2}",
       "'logprobs' must be a boolean", "logprobs"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}",
       "'top_logprobs' is 21, outside [0, 20]", "top_logprobs"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
       "'top_logprobs' needs 'logprobs': true", "top_logprobs"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": [1]}", "'logit_bias' must be an object", "logit_bias"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}", "key 'abc' is not a token id in [0, 256)", "logit_bias"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"256\": 1}}", "key '256' is not a token id", "logit_bias"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", "token 5 must be a number in [-100, 100]", "logit_bias"},
      {"/v1/completions", "{\"prompt\": \"x\", \"min_tokens\": -1}", "'min_tokens' is -1, outside", "min_tokens"},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 4, \"min_tokens\": 5}", "'min_tokens' (5) is more than 'max_tokens' (4)",
       "min_tokens"},
      {"/v1/completions", "{\"prompt\": \"x\", \"stop_token_ids\": 5}", "'stop_token_ids' must be an array", "stop_token_ids"},
      {"/v1/completions", "{\"prompt\": \"x\", \"stop_token_ids\": [256]}", "token ids in [0, 256)", "stop_token_ids"},
      {"/v1/completions", "{\"prompt\": \"x\", \"ignore_eos\": 1}", "'ignore_eos' must be a boolean", "ignore_eos"},
      {"/v1/completions", "{\"prompt\": []}", "the prompt is empty", "prompt"},
      {"/v1/completions", "{\"prompt\": [\"a\", 5]}", "a list of either", "prompt"},
      {"/v1/completions", "{\"prompt\": [\"a\", \"\"]}", "the prompt is empty", "prompt"},
      {"/v1/completions", "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", "only allowed with 'stream': true",
       "stream_options"},
  };
  char param[96];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(param, sizeof param, "\"param\":\"%s\"", cases[i].param);
    CHECK_ERROR(post(cases[i].path, cases[i].json), 400, cases[i].needle, param);
    if (!strstr(resp_body, cases[i].needle)) fprintf(stderr, "  (case %s)\n", cases[i].json);
  }
}

static bool get_metrics(char *dst, size_t cap) {
  const char *body;
  int st = http_into("GET", "/metrics", NULL, NULL, 0, dst, cap, &body);
  memmove(dst, body, strlen(body) + 1);
  return st == 200;
}

/* Prometheus text format 0.0.4: every sample's family has # HELP and #
 * TYPE before it, names are valid, values numbers; histograms' buckets are
 * cumulative up to +Inf = _count; the engine's gauges and counters are all
 * there. */
static void test_metrics(void) {
  static char m[1 << 16];
  CHECK_MSG(get_metrics(m, sizeof m), "GET /metrics: %s", m);
  char typed[64][96], line[512];
  int ntyped = 0, samples = 0, bad = 0;
  double last_bucket = -1;
  for (const char *at = m; *at;) {
    const char *nl = strchr(at, '\n');
    size_t len = nl ? (size_t)(nl - at) : strlen(at);
    snprintf(line, sizeof line, "%.*s", (int)len, at);
    at += len + (nl ? 1 : 0);
    char name[96], kind[32];
    if (sscanf(line, "# TYPE %95s %31s", name, kind) == 2) {
      bad += strcmp(kind, "counter") && strcmp(kind, "gauge") && strcmp(kind, "histogram");
      if (ntyped < 64) snprintf(typed[ntyped++], sizeof typed[0], "%s", name);
      last_bucket = -1;
      continue;
    }
    if (!strncmp(line, "# HELP ", 7)) continue;
    size_t k = strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
    char *end = NULL;
    const char *value = strchr(line, ' ');
    double v = value ? strtod(value + 1, &end) : 0;
    if (!k || (line[k] != ' ' && line[k] != '{') || !value || !end || *end) {
      bad++;
      fprintf(stderr, "bad metrics line: '%s'\n", line);
      continue;
    }
    samples++;
    bool declared = false;
    for (int t = 0; t < ntyped; t++) {
      size_t tl = strlen(typed[t]);
      declared |= !strncmp(line, typed[t], tl) && (line[tl] == ' ' || line[tl] == '{' || line[tl] == '_');
    }
    if (!declared) bad++, fprintf(stderr, "metric without # TYPE: '%s'\n", line);
    if (strstr(line, "_bucket{le=")) {
      if (v < last_bucket) bad++, fprintf(stderr, "buckets not cumulative: '%s'\n", line);
      last_bucket = v;
    } else if (strstr(line, "_count ") && v != last_bucket) {
      bad++, fprintf(stderr, "_count %g != +Inf bucket %g\n", v, last_bucket);
    }
  }
  CHECK_MSG(bad == 0 && samples > 20, "%d bad lines of %d samples", bad, samples);
  static const char *const names[] = {
      "nabla:num_requests_running", "nabla:num_requests_waiting", "nabla:kv_cache_blocks_used", "nabla:kv_cache_blocks_total",
      "nabla:kv_cache_usage_perc", "nabla:prefix_cache_queries_total", "nabla:prefix_cache_hits_total",
      "nabla:num_preemptions_total", "nabla:prompt_tokens_total", "nabla:generation_tokens_total",
      "nabla:request_success_total{finished_reason=\"length\"}", "nabla:request_success_total{finished_reason=\"stop\"}",
      "nabla:request_success_total{finished_reason=\"abort\"}", "nabla:time_to_first_token_seconds_count",
      "nabla:inter_token_latency_seconds_count", "nabla:e2e_request_latency_seconds_count",
      "nabla:time_to_first_token_seconds_bucket{le=\"+Inf\"}"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    CHECK_MSG(nb_test_metric(m, names[i]) >= 0, "/metrics lacks %s", names[i]);
  /* after the requests above: tokens counted, the cache idle, prefixes hit */
  CHECK_MSG(nb_test_metric(m, "nabla:generation_tokens_total") > 100 && nb_test_metric(m, "nabla:time_to_first_token_seconds_count") > 10 &&
                nb_test_metric(m, "nabla:kv_cache_blocks_used") == 0 && nb_test_metric(m, "nabla:num_requests_running") == 0 &&
                nb_test_metric(m, "nabla:kv_cache_blocks_total") > 0 && nb_test_metric(m, "nabla:prefix_cache_hits_total") > 0,
            "%s", m);
}

/* Waits (10 s at most) until the engine holds nothing (no running or
 * waiting sequence, no KV block in use) and at least min_aborts samples
 * were aborted; the metrics come from the last step. */
static bool engine_idle(char *m, size_t cap, double min_aborts) {
  double t0 = nb_test_now();
  while (nb_test_now() - t0 < 10) {
    if (get_metrics(m, cap) && nb_test_metric(m, "nabla:num_requests_running") == 0 && nb_test_metric(m, "nabla:num_requests_waiting") == 0 &&
        nb_test_metric(m, "nabla:kv_cache_blocks_used") == 0 &&
        nb_test_metric(m, "nabla:request_success_total{finished_reason=\"abort\"}") >= min_aborts)
      return true;
    usleep(20000);
  }
  return false;
}

/* A client that goes away mid-request (streamed: after the first chunk;
 * not streamed: 0.3 s into 4 prompts x 16 samples of 1000 tokens, queued
 * behind --max-num-seqs 16) aborts it: the engine frees its blocks and
 * generates no more for it. On the model's whole context (1024), so the
 * request is still running when the client leaves. */
static void test_disconnect(void) {
  static char m[1 << 16];
  for (int streamed = 1; streamed >= 0; streamed--) {
    CHECK(engine_idle(m, sizeof m, 0));
    double aborts = nb_test_metric(m, "nabla:request_success_total{finished_reason=\"abort\"}");
    double tokens = nb_test_metric(m, "nabla:generation_tokens_total");
    char body[256], req[1024];
    int bl = snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 1000, \"temperature\": 0, \"ignore_eos\": true%s}",
                      streamed ? "\"line 1\"" : "[\"line 1\", \"line 2\", \"line 3\", \"line 4\"], \"n\": 16",
                      streamed ? ", \"stream\": true" : "");
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", auth, bl, body);
    int fd = nb_test_connect_loopback(srv.port);
    CHECK(fd >= 0 && write(fd, req, (size_t)n) == n);
    if (streamed) { /* the first chunk, then away */
      char got[4096] = "";
      size_t have = 0;
      double t0 = nb_test_now();
      while (!strstr(got, "data: ") && nb_test_now() - t0 < 10 && have + 1 < sizeof got) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t k = read(fd, got + have, sizeof got - 1 - have);
        if (k <= 0) break;
        have += (size_t)k;
        got[have] = 0;
      }
      CHECK_MSG(strstr(got, "data: "), "no first chunk: %s", got);
    } else {
      usleep(300000);
    }
    close(fd);
    CHECK_MSG(engine_idle(m, sizeof m, aborts + 1), "the engine still holds the request 10 s after its client left: %s", m);
    double generated = nb_test_metric(m, "nabla:generation_tokens_total") - tokens, asked = streamed ? 1000 : 64000;
    double aborted = nb_test_metric(m, "nabla:request_success_total{finished_reason=\"abort\"}") - aborts;
    CHECK_MSG((streamed ? aborted == 1 : aborted >= 1) && generated < asked,
              "%s: after the client left: %g samples aborted, %g tokens generated of %g", streamed ? "streamed" : "whole", aborted,
              generated, asked);
  }
}

/* SIGTERM during a stream: the stream still ends properly (finish reason,
 * [DONE]) and the server exits 0. */
static void test_sigterm_stream(void) {
  const char *body = "{\"prompt\": \"line 1\", \"max_tokens\": 1000, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}";
  char req[1024];
  int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %zu\r\n\r\n%s", auth, strlen(body), body);
  int fd = nb_test_connect_loopback(srv.port);
  CHECK(fd >= 0 && write(fd, req, (size_t)n) == n);
  static char got[1 << 20];
  size_t have = 0;
  double t0 = nb_test_now();
  while (!strstr(got, "data: ") && nb_test_now() - t0 < 10) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t k = read(fd, got + have, sizeof got - 1 - have);
    if (k <= 0) break;
    have += (size_t)k;
    got[have] = 0;
  }
  stop_server();
  have += nb_test_read_until_closed(fd, got + have, sizeof got - have, 20);
  close(fd);
  answer a = {0};
  char *b = strstr(got, "\r\n\r\n");
  if (b) parse_answer(&a, b + 4, true);
  CHECK_MSG(a.done && !strcmp(a.finish[0], "length") && strlen(a.text[0]) > 0, "SIGTERM mid-stream: done %d, finish '%s', %zu bytes",
            a.done, a.finish[0], have);
}

/* --batch: OpenAI's batch format through the same engine; answers in input
 * order equal the HTTP server's, bad lines get their errors, the rest go on;
 * an output that is the input is refused. */
static void test_batch(void) {
  answer h1, h2, h3;
  ask("/v1/completions", "{\"prompt\": \"line 5\", \"max_tokens\": 10, \"temperature\": 0}", &h1);
  ask("/v1/completions", "{\"prompt\": [\"line 9\", \"line 12\"], \"max_tokens\": 7, \"temperature\": 0, \"n\": 2}", &h2);
  ask("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"line 7\"}], \"max_tokens\": 6, \"temperature\": 0}", &h3);
  nb_test_write_text(
      "batch.jsonl",
      "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"tiny\", \"prompt\": \"line 5\", "
      "\"max_tokens\": 10, \"temperature\": 0}}\n"
      "{\"custom_id\": \"b\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"line 9\", \"line 12\"], "
      "\"max_tokens\": 7, \"temperature\": 0, \"n\": 2}}\n"
      "\n"
      "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
      "\"content\": \"line 7\"}], \"max_tokens\": 6, \"temperature\": 0}}\n"
      "{\"custom_id\": \"d\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"max_tokens\": \"8\"}}\n"
      "not json\n"
      "{\"custom_id\": \"f\", \"method\": \"GET\", \"url\": \"/v1/completions\", \"body\": {}}\n"
      "{\"custom_id\": \"g\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"gpt-4\", \"prompt\": \"x\"}}\n");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --max-model-len 64 --served-model-name tiny --threads 1 --batch batch.jsonl "
                            "--output batch.out.jsonl </dev/null", work, bin);
  int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0 && strstr(err, "7 requests answered (4 with an error)"), "batch: rc %d: %s", rc, err);
  char *text = nb_test_read_file("batch.out.jsonl", NULL);
  const char *want_ids[] = {"a", "b", "c", "d", NULL, "f", "g"};
  int lines = 0;
  for (char *at = text, *nl; at && *at; at = nl + 1, lines++) {
    if (!(nl = strchr(at, '\n'))) break;
    *nl = 0;
    cJSON *o = cJSON_Parse(at);
    const cJSON *cid = item(o, "custom_id"), *r = item(o, "response"), *e = item(o, "error");
    int status = (int)cJSON_GetNumberValue(item(r, "status_code"));
    CHECK_MSG(o && cJSON_IsString(item(o, "id")) && lines < 7 &&
                  (want_ids[lines] ? cJSON_IsString(cid) && !strcmp(cid->valuestring, want_ids[lines]) : cJSON_IsNull(cid)),
              "line %d: %s", lines, at);
    answer a = {0};
    if (cJSON_IsObject(r)) add_choices(&a, item(r, "body"));
    if (lines == 0) CHECK_MSG(status == 200 && cJSON_IsNull(e) && a.n == 1 && !strcmp(a.text[0], h1.text[0]), "line a: %s", at);
    if (lines == 1)
      CHECK_MSG(status == 200 && a.n == 4 && !strcmp(a.text[0], h2.text[0]) && !strcmp(a.text[3], h2.text[3]) &&
                    a.completion_tokens == h2.completion_tokens && a.prompt_tokens == h2.prompt_tokens,
                "line b: %s", at);
    if (lines == 2) CHECK_MSG(status == 200 && !strcmp(a.text[0], h3.text[0]), "line c: %s", at);
    if (lines == 3) CHECK_MSG(status == 400 && strstr(at, "'max_tokens' must be an integer") && strstr(at, "\"param\":\"max_tokens\""), "line d: %s", at);
    if (lines == 4 || lines == 5) CHECK_MSG(cJSON_IsNull(r) && cJSON_IsObject(e) && strstr(at, lines == 4 ? "not valid JSON" : "'method'"), "line %d: %s", lines, at);
    if (lines == 6) CHECK_MSG(status == 404 && strstr(at, "model_not_found"), "line g: %s", at);
    cJSON_Delete(o);
  }
  CHECK_MSG(lines == 7, "%d output lines, want 7: %s", lines, text ? text : "");
  free(text);
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --batch batch.jsonl --output ./batch.jsonl </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 2 && strstr(err, "batch.jsonl"), "output over the input: rc %d: %s", rc, err);
}

/* A Hugging Face Llama with its tokenizer (tests/models/golden/hf_llama_tiny):
 * the text of 40 greedy tokens, whole and streamed, is what /detokenize
 * makes of `nabla generate --hf`'s ids (the server decodes incrementally,
 * token by token, in the context of the one before). */
static void test_hf_tokenizer(void) {
  const char *src = getenv("NABLA_SOURCE_DIR");
  static char dir[4096], cmd[8192], ids[4096], json[8192];
  snprintf(dir, sizeof dir, "%s/tests/models/golden/hf_llama_tiny", src ? src : ".");
  snprintf(cmd, sizeof cmd, "%s generate --hf '%s' --prompt 'Hello world' --max-tokens 40 --temperature 0 --show-ids --threads 1 2>&1",
           bin, dir);
  int rc = nb_test_run(cmd, out, sizeof out);
  const char *at = strstr(out, "generated ids:"), *pa = strstr(out, "prompt ids:");
  CHECK_MSG(rc == 0 && at && pa, "generate --hf: rc %d: %s", rc, out);
  if (!at || !pa) return;
  /* the last prompt id first: the server decodes in its context */
  const char *last = strchr(pa, '\n');
  while (last && last > pa && last[-1] == ' ') last--;
  const char *p = last;
  while (p && p > pa && p[-1] != ' ') p--;
  size_t n = (size_t)snprintf(ids, sizeof ids, "%.*s", (int)(last - p), p);
  for (at += strlen("generated ids:"); *at && *at != '\n' && n + 16 < sizeof ids; at++)
    if (*at == ' ' && at[1] >= '0' && at[1] <= '9') ids[n++] = ',';
    else if (*at >= '0' && *at <= '9') ids[n++] = *at;
  ids[n] = 0;
  model = dir;
  if (!start_server("")) return;
  snprintf(json, sizeof json, "{\"tokens\": [%s]}", ids);
  CHECK_MSG(post("/detokenize", json) == 200, "%s", resp_body);
  cJSON *d = cJSON_Parse(resp_body);
  const char *want_all = cJSON_GetStringValue(item(d, "prompt"));
  answer whole, streamed;
  ask("/v1/completions", "{\"prompt\": \"Hello world\", \"max_tokens\": 40, \"temperature\": 0}", &whole);
  ask("/v1/completions", "{\"prompt\": \"Hello world\", \"max_tokens\": 40, \"temperature\": 0, \"stream\": true}", &streamed);
  /* detokenize's text starts with the context token's */
  snprintf(json, sizeof json, "{\"tokens\": [%.*s]}", (int)(strchr(ids, ',') - ids), ids);
  post("/detokenize", json);
  cJSON *c = cJSON_Parse(resp_body);
  const char *ctx_text = cJSON_GetStringValue(item(c, "prompt"));
  const char *want = want_all && ctx_text && !strncmp(want_all, ctx_text, strlen(ctx_text)) ? want_all + strlen(ctx_text) : want_all;
  CHECK_MSG(want && strlen(want) > 10 && !strcmp(whole.text[0], want) && !strcmp(streamed.text[0], want),
            "hf: whole '%s', streamed '%s', want '%s'", whole.text[0], streamed.text[0], want ? want : "(none)");
  cJSON_Delete(d);
  cJSON_Delete(c);
  stop_server();
  model = "run";
}

int main(void) {
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/serve");
  nb_test_scratch_dir(work, sizeof work, "cli", "serve");
  if (chdir(work) != 0) return fprintf(stderr, "cannot enter %s\n", work), 1;
  signal(SIGPIPE, SIG_IGN);
  /* a tiny byte-level model (one training step: the weights do not matter) */
  FILE *f = fopen("corpus.txt", "w");
  for (int i = 0; f && i < 300; i++) fprintf(f, "line %d of a small corpus for the serve test\n", i);
  if (f) fclose(f);
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && NABLA_PEAK_GFLOPS=10 %s train --run-dir run data.train=corpus.txt model.preset=gpt2-tiny "
           "model.n_layers=1 model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=1024 "
           "data.seq_len=32 batch_size=8 steps=100 optim.lr=0.01 schedule.warmup_steps=0 eval_every=0 log_every=100 "
           "checkpoint_every=0 --threads 1 </dev/null",
           work, bin);
  int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "train: rc %d: %s", rc, err);
  /* bad options fail before loading anything */
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --chat-template vicuna --port 0 </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 2 && strstr(err, "unknown template 'vicuna'"), "rc %d: %s", rc, err);
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --max-num-seqs 32 --max-num-batched-tokens 16 </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 2 && strstr(err, "--max-num-batched-tokens 16 is below --max-num-seqs 32"), "rc %d: %s", rc, err);
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --batch x.jsonl </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 2 && strstr(err, "--batch and --output go together"), "rc %d: %s", rc, err);
  /* a KV budget that cannot hold one sequence of the context: the engine's
   * message with the bytes needed (1024 tokens x 2 x 32 floats x 4 bytes) */
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --kv-cache-bytes 100000 --port 0 </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 1 && strstr(err, "KV cache too small for max_model_len 1024") && strstr(err, "262144 bytes"), "rc %d: %s", rc, err);
  if (rc == 0 || !start_server("--api-key sekrit --max-body 2000 --timeout 1 --served-model-name tiny --max-model-len 64"))
    return nb_test_summary("cli/serve");
  test_endpoints();
  test_errors();
  test_timeout();
  test_concurrent();
  test_choices();
  test_field_errors();
  test_metrics();
  test_batch();
  stop_server();
  /* the model's whole context (1024), for requests that run a while */
  if (start_server("--api-key sekrit")) {
    test_disconnect();
    test_sigterm_stream(); /* stops the server */
  }
  test_chat_templates();
  test_hf_tokenizer();
  return nb_test_summary("cli/serve");
}
