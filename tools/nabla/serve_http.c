/* `nabla serve`'s HTTP side: libmicrohttpd, one thread per connection. A
 * completion request is read whole (a slow or half-sent body never reaches
 * the engine), checked, handed to the engine thread as a job, and answered
 * when its choices end (or streamed as they go). A client that goes away
 * (a failed write, or its socket closed while the job waits) cancels the
 * job, which frees its KV blocks. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_int.h"
#include "util/trace.h"

/* ---------------------------------------------------------------- replies */

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, char *body, const char *type) {
  if (!body) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) return free(body), MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, cJSON *j) {
  char *s = j ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  return reply_text(c, status, s, "application/json");
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *param, const char *code,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *param, const char *code,
                                   const char *fmt, ...) {
  char msg[5200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return reply_json(c, status, error_json(error_type(status), param, code, msg));
}

static enum MHD_Result reply_bad(struct MHD_Connection *c, const bad *b) {
  return reply_error(c, b->status, b->param[0] ? b->param : NULL, b->status == 404 ? "model_not_found" : NULL, "%s", b->msg);
}

/* ---------------------------------------------------------------- small endpoints */

static enum MHD_Result do_models(server *sv, struct MHD_Connection *c) {
  cJSON *root = cJSON_CreateObject(), *data, *m = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "object", "list");
  data = cJSON_AddArrayToObject(root, "data");
  cJSON_AddStringToObject(m, "id", sv->opt.name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)sv->created);
  cJSON_AddStringToObject(m, "owned_by", "nabla");
  cJSON_AddStringToObject(m, "root", sv->opt.model);
  cJSON_AddNumberToObject(m, "max_model_len", (double)sv->max_model_len);
  cJSON_AddItemToArray(data, m);
  return reply_json(c, 200, root);
}

/* vLLM's /tokenize: {prompt, add_special_tokens?} or {messages,
 * add_generation_prompt?} -> {count, max_model_len, tokens}. */
static enum MHD_Result do_tokenize(server *sv, struct MHD_Connection *c, const cJSON *o) {
  bad b = {0};
  bool add_special = true, gen_prompt = true;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
  if (!check_model(sv, o, &b) || !get_bool(o, "add_special_tokens", &add_special, &b) ||
      !get_bool(o, "add_generation_prompt", &gen_prompt, &b))
    return reply_bad(c, &b);
  buf chat = {0};
  if (!absent(msgs)) {
    bool bos = false;
    if (!render_chat(sv, msgs, gen_prompt, &chat, &bos, &b)) return free(chat.data), reply_bad(c, &b);
    add_special = bos;
  } else if (!cJSON_IsString(p)) {
    return reply_error(c, 400, "prompt", NULL, "'prompt' must be a string (or give 'messages')");
  }
  const char *text = chat.data ? chat.data : p->valuestring;
  nb_tok_ids ids = {0};
  bool ok = encode(sv, text, strlen(text), add_special, &ids);
  free(chat.data);
  if (!ok) return free(ids.ids), reply_error(c, 500, NULL, NULL, "cannot tokenize: %s", nb_ctx_error(sv->ctx));
  cJSON *root = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(root, "tokens");
  cJSON_AddNumberToObject(root, "count", (double)ids.len);
  cJSON_AddNumberToObject(root, "max_model_len", (double)sv->max_model_len);
  for (size_t i = 0; i < ids.len; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids.ids[i]));
  free(ids.ids);
  return reply_json(c, 200, root);
}

/* vLLM's /detokenize: {tokens} -> {prompt}. */
static enum MHD_Result do_detokenize(server *sv, struct MHD_Connection *c, const cJSON *o) {
  bad b = {0};
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens");
  if (!check_model(sv, o, &b)) return reply_bad(c, &b);
  if (!cJSON_IsArray(t)) return reply_error(c, 400, "tokens", NULL, "'tokens' must be an array of integer token ids");
  nb_tok_ids ids = {0};
  if (!get_ids(sv, t, "tokens", &ids, &b)) return free(ids.ids), reply_bad(c, &b);
  buf raw = {0}, text = {0};
  bool ok = decode(sv, ids.ids, ids.len, &raw) && utf8_append_lossy(&text, raw.data ? raw.data : "", raw.len);
  free(ids.ids);
  free(raw.data);
  if (!ok) return free(text.data), reply_error(c, 500, NULL, NULL, "cannot detokenize: %s", nb_ctx_error(sv->ctx));
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "prompt", text.data ? text.data : "");
  free(text.data);
  return reply_json(c, 200, root);
}

/* ---------------------------------------------------------------- waiting for a job */

/* Whether the client is still there: its socket neither hung up nor at
 * end of file (pipelined bytes are fine). */
static bool client_alive(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return true;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return true;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return false;
  char x;
  ssize_t k = recv(ci->connect_fd, &x, 1, MSG_PEEK | MSG_DONTWAIT);
  return k > 0 || (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

/* Waits until the job has events, or 250 ms pass: how often a waiting
 * handler looks at its client's socket. */
static void wait_events(job *j) {
  pthread_mutex_lock(j->mu);
  if (!j->n_ev && !j->error) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 250000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(j->cv, j->mu, &ts);
  }
  pthread_mutex_unlock(j->mu);
}

/* Until the job ends: true; false (job cancelled) when the client went away. */
static bool wait_job(job *j, struct MHD_Connection *c) {
  double checked = now_s();
  while (!job_pump(j, 0)) {
    wait_events(j);
    if (now_s() - checked >= 0.25) {
      checked = now_s();
      if (!client_alive(c)) return job_cancel(j), false;
    }
  }
  return true;
}

/* A streamed response: MHD's reader callback (the connection's thread)
 * turns the job's events into server-sent events as they come. */
typedef struct stream {
  job *j;
  struct MHD_Connection *c;
  buf out;
  size_t sent;
  bool finished;
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *dst, size_t max) {
  (void)pos;
  stream *k = cls;
  double checked = now_s(), since = checked;
  while (k->sent == k->out.len) {
    if (k->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    k->out.len = k->sent = 0;
    bool done = job_pump(k->j, 1);
    job_stream(k->j, &k->out, done);
    k->finished = done;
    if (k->out.len || done) continue;
    wait_events(k->j);
    double t = now_s();
    if (t - checked >= 0.25) {
      checked = t;
      if (!client_alive(k->c)) return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
    }
    /* nothing to send for a while (a queue, a compile): an SSE comment,
     * which clients ignore, so that --timeout does not close the stream */
    if (t - since >= 0.4 * (double)k->j->sv->opt.timeout) buf_str(&k->out, ": keep-alive\n\n");
  }
  size_t n = k->out.len - k->sent;
  if (n > max) n = max;
  memcpy(dst, k->out.data + k->sent, n);
  k->sent += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  stream *k = cls;
  if (!k->finished) job_cancel(k->j); /* the client went away (or the write failed) */
  job_unref(k->j);
  free(k->out.data);
  free(k);
}

/* /v1/completions and /v1/chat/completions. */
static enum MHD_Result do_complete(server *sv, struct MHD_Connection *c, const cJSON *body, bool chat) {
  bad b = {0};
  creq q;
  if (!parse_request(sv, body, chat, &q, &b)) {
    creq_free(&q);
    return reply_bad(c, &b);
  }
  if (atomic_load(&sv->stopping)) {
    creq_free(&q);
    return reply_error(c, 503, NULL, NULL, "the server is shutting down");
  }
  bool stream_it = q.stream;
  job *j = job_new(sv, &q, NULL, NULL);
  if (!j) return creq_free(&q), reply_error(c, 500, NULL, NULL, "out of memory");
  job_submit(j);
  if (stream_it) {
    stream *k = calloc(1, sizeof *k);
    struct MHD_Response *r = k ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, k, stream_free) : NULL;
    if (!r) {
      job_cancel(j);
      job_unref(j);
      free(k);
      return MHD_NO;
    }
    k->j = j, k->c = c;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  if (!wait_job(j, c)) {
    job_unref(j);
    return MHD_NO; /* nobody to answer */
  }
  enum MHD_Result ret = j->failed ? reply_error(c, 500, NULL, NULL, "%s", j->failed) : reply_json(c, 200, job_response(j));
  job_unref(j);
  return ret;
}

/* ---------------------------------------------------------------- the request handler */

typedef struct request {
  buf body;
  bool too_large;
  int64_t t0;   /* a trace's span of the request, from its headers to its last byte (0: not traced) */
  char what[64]; /* "POST /v1/completions" */
} request;

typedef enum route { R_HEALTH, R_METRICS, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS, R_CHAT, R_COUNT } route;
static const struct {
  const char *path, *method;
  bool open; /* no API key needed */
} routes[R_COUNT] = {{"/health", "GET", true},       {"/metrics", "GET", true},
                     {"/v1/models", "GET", false},   {"/tokenize", "POST", false},
                     {"/detokenize", "POST", false}, {"/v1/completions", "POST", false},
                     {"/v1/chat/completions", "POST", false}};

static bool authorized(server *sv, struct MHD_Connection *c) {
  if (!sv->opt.api_key) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncmp(h, "Bearer ", 7)) return false;
  /* compared in time independent of where they differ */
  const char *k = sv->opt.api_key, *g = h + 7;
  size_t kl = strlen(k), gl = strlen(g);
  unsigned char diff = kl != gl;
  for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(k[i] ^ (i < gl ? g[i] : 0));
  return !diff;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
  (void)version;
  server *sv = cls;
  request *rq = *state;
  if (!rq) { /* headers only so far: refuse early what needs no body */
    rq = calloc(1, sizeof *rq);
    if (!rq) return MHD_NO;
    *state = rq;
    if ((rq->t0 = nb_util__trace_start())) { /* one thread per connection: its requests follow one another */
      static _Thread_local bool named;
      if (!named) nb_util__trace_thread_name("nabla-http"), named = true;
      snprintf(rq->what, sizeof rq->what, "%s %s", method, url);
    }
    atomic_fetch_add(&sv->active, 1);
    if (atomic_load(&sv->stopping)) return reply_error(c, 503, NULL, NULL, "the server is shutting down");
    int r = 0;
    while (r < R_COUNT && strcmp(url, routes[r].path)) r++;
    if (r == R_COUNT) return reply_error(c, 404, NULL, "not_found", "no route %s %s", method, url);
    if (strcmp(method, routes[r].method))
      return reply_error(c, 405, NULL, "method_not_allowed", "%s takes %s, not %s", url, routes[r].method, method);
    if (!routes[r].open && !authorized(sv, c))
      return reply_error(c, 401, NULL, "invalid_api_key", "missing or incorrect API key ('Authorization: Bearer KEY')");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)sv->opt.max_body)
      return reply_error(c, 413, NULL, "request_too_large", "the request body (%s bytes) is over the limit of %lld bytes",
                         cl, (long long)sv->opt.max_body);
    return MHD_YES;
  }
  if (*upload_size) { /* more of the body */
    if (!rq->too_large && rq->body.len + *upload_size > (size_t)sv->opt.max_body) {
      rq->too_large = true;
      free(rq->body.data);
      rq->body = (buf){0};
    }
    if (!rq->too_large && !buf_add(&rq->body, upload, *upload_size)) return MHD_NO;
    *upload_size = 0;
    return MHD_YES;
  }
  if (rq->too_large)
    return reply_error(c, 413, NULL, "request_too_large", "the request body is over the limit of %lld bytes",
                       (long long)sv->opt.max_body);
  if (!strcmp(url, "/health")) return reply_text(c, 200, strdup(""), "text/plain");
  if (!strcmp(url, "/metrics")) return reply_text(c, 200, metrics_text(sv), "text/plain; version=0.0.4; charset=utf-8");
  if (!strcmp(url, "/v1/models")) return do_models(sv, c);
  /* the POST routes: a JSON object body */
  if (!utf8_valid(rq->body.data ? rq->body.data : "", rq->body.len))
    return reply_error(c, 400, NULL, NULL, "the request body is not valid UTF-8");
  const char *end = NULL;
  cJSON *body = rq->body.len ? cJSON_ParseWithLengthOpts(rq->body.data, rq->body.len, &end, false) : NULL;
  if (!body) {
    size_t at = end && rq->body.data ? (size_t)(end - rq->body.data) : 0;
    if (!rq->body.len) return reply_error(c, 400, NULL, NULL, "the request body is empty: a JSON object is expected");
    return reply_error(c, 400, NULL, NULL, "malformed JSON in the request body (near byte %zu)", at);
  }
  enum MHD_Result r;
  if (!cJSON_IsObject(body)) r = reply_error(c, 400, NULL, NULL, "the request body must be a JSON object");
  else if (!strcmp(url, "/tokenize")) r = do_tokenize(sv, c, body);
  else if (!strcmp(url, "/detokenize")) r = do_detokenize(sv, c, body);
  else r = do_complete(sv, c, body, !strcmp(url, "/v1/chat/completions"));
  cJSON_Delete(body);
  return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why) {
  (void)c, (void)why;
  server *sv = cls;
  request *rq = *state;
  if (rq && rq->t0) nb_util__trace_span("http", rq->what, rq->t0, nb_util__now_ns(), NULL, 0);
  if (rq) free(rq->body.data), atomic_fetch_sub(&sv->active, 1);
  free(rq);
  *state = NULL;
}

/* ---------------------------------------------------------------- the server */

int serve_http(server *sv) {
  const options *o = &sv->opt;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
  const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
    return fprintf(stderr, "nabla serve: --host '%s' is not an IPv4 address\n", o->host), 2;
  /* SIGTERM / SIGINT are taken by sigwait below: blocked in every thread
   * (the engine thread is started after this) */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  if (!engine_start(sv)) return fprintf(stderr, "nabla serve: cannot start the engine thread\n"), 1;
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle, sv,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout,
      MHD_OPTION_NOTIFY_COMPLETED, completed, sv, MHD_OPTION_END);
  if (!d) {
    int e = errno;
    engine_stop(sv);
    return fprintf(stderr, "nabla serve: cannot listen on %s:%lld: %s\n", o->host, (long long)o->port, strerror(e)), 1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  const nb_serve_config *ec = nb_serve_engine_config(nb_serve_llm_engine(sv->llm));
  printf("nabla serve: %s on http://%s:%u (context %lld, chat template %s; up to %d sequences at once, "
         "%lld KV blocks of %d tokens)\n",
         sv->m.what, host, info ? info->port : (unsigned)o->port, (long long)sv->max_model_len, nb_serve_chat_format_name(sv->chat),
         ec->max_num_seqs, (long long)ec->num_blocks, ec->block_size);
  fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  /* stop accepting, end in-flight requests (the engine aborts them: a stream
   * gets its final chunk and [DONE]; a half-sent request waits at most
   * --timeout) and let their responses go out before closing connections */
  fprintf(stderr, "nabla serve: %s: shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  atomic_store(&sv->stopping, true);
  pthread_mutex_lock(&sv->mu);
  sv->abort_all = true;
  pthread_cond_signal(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
  MHD_socket ls = MHD_quiesce_daemon(d);
  if (ls != MHD_INVALID_SOCKET) close(ls);
  for (int64_t ms = 0; atomic_load(&sv->active) > 0 && ms < 1000 * (o->timeout + 2); ms += 10) usleep(10000);
  MHD_stop_daemon(d);
  engine_stop(sv);
  return 0;
}
