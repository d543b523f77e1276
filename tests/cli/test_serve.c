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

#include "testfs.h"

static const char *bin;
static char work[4096], out[1 << 16], err[1 << 16];
static int port;
static pid_t server = -1;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int connect_server(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* Reads until the server closes (or 20 s pass); returns the bytes read. */
static size_t read_all(int fd, char *dst, size_t cap) {
  size_t n = 0;
  double t0 = now();
  while (n + 1 < cap && now() - t0 < 20) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t k = read(fd, dst + n, cap - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
  }
  dst[n] = 0;
  return n;
}

static char resp[1 << 16];
static const char *resp_body;

/* One request (Connection: close); returns the status, the body in resp_body. */
static int http(const char *method, const char *path, const char *headers, const char *body, size_t body_len) {
  resp[0] = 0;
  resp_body = "";
  int fd = connect_server();
  if (fd < 0) return -1;
  char head[2048];
  int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                    method, path, headers ? headers : "", body ? body_len : 0);
  bool ok = write(fd, head, (size_t)hn) == hn && (!body || write(fd, body, body_len) == (ssize_t)body_len);
  if (ok) read_all(fd, resp, sizeof resp);
  close(fd);
  int status = -1;
  sscanf(resp, "HTTP/1.1 %d", &status);
  const char *b = strstr(resp, "\r\n\r\n");
  resp_body = b ? b + 4 : "";
  return status;
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

static bool start_server(const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cd '%s' && exec %s serve run --port 0 --threads 1 %s >serve.out 2>serve.err", work, bin, args);
  unlink("serve.out");
  server = fork();
  if (server == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  /* the port, once it is listening (model load + first line) */
  double t0 = now();
  while (now() - t0 < 60) {
    size_t n = 0;
    char *o = nb_test_read_file("serve.out", &n);
    const char *at = o ? strstr(o, "http://127.0.0.1:") : NULL;
    if (at) port = atoi(at + strlen("http://127.0.0.1:"));
    free(o);
    if (port) return true;
    int st;
    if (waitpid(server, &st, WNOHANG) == server) break;
    usleep(50000);
  }
  char *e = nb_test_read_file("serve.err", NULL);
  CHECK_MSG(false, "the server did not start: %s", e ? e : "");
  free(e);
  return false;
}

/* SIGTERM: the server stops and exits 0 within a few seconds. */
static void stop_server(void) {
  kill(server, SIGTERM);
  double t0 = now();
  int st = 0;
  pid_t w = 0;
  while (now() - t0 < 10 && (w = waitpid(server, &st, WNOHANG)) == 0) usleep(20000);
  if (w != server) {
    kill(server, SIGKILL);
    waitpid(server, &st, 0);
    CHECK_MSG(false, "the server did not exit within 10 s of SIGTERM");
  } else {
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: exit status %d", st);
    fprintf(stderr, "  exited %.2f s after SIGTERM\n", now() - t0);
  }
  CHECK_MSG(connect_server() < 0, "the port still accepts connections after the server exited");
  server = -1;
}

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
  int fd = connect_server();
  char req[8192];
  int n = snprintf(req, sizeof req,
                   "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sTransfer-Encoding: chunked\r\n\r\n"
                   "%x\r\n%.*s\r\n0\r\n\r\n",
                   auth, 3000, 3000, big);
  CHECK(fd >= 0 && write(fd, req, (size_t)n) == n);
  read_all(fd, resp, sizeof resp);
  close(fd);
  CHECK_MSG(strstr(resp, "HTTP/1.1 413") && strstr(resp, "over the limit"), "%s", resp);
  /* the server still answers */
  CHECK_MSG(http("GET", "/health", NULL, NULL, 0) == 200, "%s", resp);
}

/* A half-sent request is closed after --timeout (1 s here). */
static void test_timeout(void) {
  int fd = connect_server();
  char half[512];
  int n = snprintf(half, sizeof half, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 100\r\n\r\n{\"prompt\":", auth);
  CHECK(fd >= 0 && write(fd, half, (size_t)n) == n);
  double t0 = now();
  char junk[4096];
  size_t got = read_all(fd, junk, sizeof junk); /* returns when the server closes */
  double dt = now() - t0;
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
    port = 0;
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
  port = 0;
  if (start_server("--api-key sekrit")) {
    char *o = nb_test_read_file("serve.out", NULL);
    CHECK_MSG(o && strstr(o, "chat template llama-3"), "%s", o ? o : "");
    free(o);
    stop_server();
  }
  nb_test_write_text("run/tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
  port = 0;
  if (start_server("--api-key sekrit")) {
    CHECK_ERROR(post("/v1/chat/completions", msgs), 400, "tokenizer_config.json's chat_template is none nabla knows",
                "\"param\":\"messages\"");
    stop_server();
  }
  unlink("run/tokenizer_config.json");
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
           "model.n_layers=1 model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=64 "
           "data.seq_len=16 batch_size=2 steps=1 eval_every=0 log_every=1 checkpoint_every=0 --threads 1 </dev/null",
           work, bin);
  int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "train: rc %d: %s", rc, err);
  /* bad options fail before loading anything */
  snprintf(cmd, sizeof cmd, "cd '%s' && %s serve run --chat-template vicuna --port 0 </dev/null", work, bin);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 2 && strstr(err, "unknown template 'vicuna'"), "rc %d: %s", rc, err);
  if (rc == 0 || !start_server("--api-key sekrit --max-body 2000 --timeout 1 --served-model-name tiny"))
    return nb_test_summary("cli/serve");
  test_endpoints();
  test_errors();
  test_timeout();
  stop_server();
  test_chat_templates();
  return nb_test_summary("cli/serve");
}
