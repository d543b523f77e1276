/* `nabla serve`: an OpenAI-compatible HTTP/1.1 server (libmicrohttpd, one
 * thread per connection; JSON through cJSON) over a model loaded as `nabla
 * generate` loads it. Until the batched engine of src/serve can generate,
 * completions run on the single-sequence KV-cached generator, one request
 * at a time behind a mutex (docs/serve.md).
 *
 * Read top-down: options, text helpers, the model and one generation
 * (stop strings, UTF-8 hold-back), JSON replies and errors, the endpoints,
 * the request handler (auth, routing, body limit), then the command. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla serve MODEL [options]\n"
    "  MODEL                a nabla run dir (config.yaml), a checkpoint step dir, or a Hugging Face\n"
    "                       Llama folder (config.json)\n"
    "  --config FILE        the run config for a run dir / checkpoint\n"
    "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
    "  --port N             TCP port (default 8000; 0 picks a free one; the port is printed)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' (every route but /health)\n"
    "  --max-body BYTES     largest request body (default 1048576; larger: 413)\n"
    "  --timeout S          close a connection idle (or half-sent) for S seconds (default 30)\n"
    "  --served-model-name NAME  the model's id in the API (default: MODEL as given)\n"
    "  --max-model-len N    context bound for prompt + output (default: the model's, at most 4096)\n"
    "  --chat-template NAME chatml, llama-3, gemma, llama-2 or mistral (default: the one\n"
    "                       tokenizer_config.json's chat_template is, else chatml)\n"
    "  --threads N          compute threads (default: all CPUs)\n";

/* The chat formats nabla renders; each is recognised in a model's
 * tokenizer_config.json chat_template by a marker (in this order: Llama-2's
 * and Mistral's both use [INST], only Llama-2's has <<SYS>>). A format's
 * end-of-turn text ends generation, as a token when the tokenizer has it
 * and as a stop string. */
typedef enum chat_template { CHAT_NONE = -1, CHAT_CHATML, CHAT_LLAMA3, CHAT_GEMMA, CHAT_LLAMA2, CHAT_MISTRAL, CHAT_COUNT } chat_template;
static const struct {
  const char *name, *marker, *end;
} chat_formats[CHAT_COUNT] = {
    [CHAT_CHATML] = {"chatml", "<|im_start|>", "<|im_end|>"},
    [CHAT_LLAMA3] = {"llama-3", "<|start_header_id|>", "<|eot_id|>"},
    [CHAT_GEMMA] = {"gemma", "<start_of_turn>", "<end_of_turn>"},
    [CHAT_LLAMA2] = {"llama-2", "<<SYS>>", NULL},
    [CHAT_MISTRAL] = {"mistral", "[INST]", NULL},
};
static const char chat_known[] = "chatml, llama-3, gemma, llama-2, mistral";

typedef struct options {
  const char *model, *config, *host, *api_key, *name, *chat_template;
  int64_t port, max_body, timeout, max_model_len;
  int threads;
} options;

/* 0 ok, 2 usage */
static int parse(int argc, char **argv, options *o) {
  *o = (options){.host = "127.0.0.1", .port = 8000, .max_body = 1 << 20, .timeout = 30};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t n = 0;
    bool ok = true;
    if (a[0] != '-') {
      if (o->model) return fprintf(stderr, "nabla serve: one MODEL only ('%s' and '%s')\n", o->model, a), nb_cli_usage(usage_text, false);
      o->model = a;
      continue;
    }
    if (!v) return fprintf(stderr, "nabla serve: %s needs a value\n", a), nb_cli_usage(usage_text, false);
    if (!strcmp(a, "--config")) o->config = v;
    else if (!strcmp(a, "--host")) o->host = v;
    else if (!strcmp(a, "--api-key")) o->api_key = v;
    else if (!strcmp(a, "--served-model-name")) o->name = v;
    else if (!strcmp(a, "--chat-template")) o->chat_template = v;
    else if (!strcmp(a, "--port")) ok = nb_cli_int("serve", a, v, 0, 65535, &o->port);
    else if (!strcmp(a, "--max-body")) ok = nb_cli_int("serve", a, v, 1, INT64_C(1) << 32, &o->max_body);
    else if (!strcmp(a, "--timeout")) ok = nb_cli_int("serve", a, v, 1, 86400, &o->timeout);
    else if (!strcmp(a, "--max-model-len")) ok = nb_cli_int("serve", a, v, 2, 1000000000, &o->max_model_len);
    else if (!strcmp(a, "--threads")) ok = nb_cli_int("serve", a, v, 1, 4096, &n), o->threads = (int)n;
    else return fprintf(stderr, "nabla serve: unknown argument '%s'\n", a), nb_cli_usage(usage_text, false);
    if (!ok) return 2;
    i++;
  }
  if (!o->model) return fprintf(stderr, "nabla serve: MODEL is required\n"), nb_cli_usage(usage_text, false);
  if (!o->name) o->name = o->model;
  if (o->chat_template) {
    int k = 0;
    while (k < CHAT_COUNT && strcmp(o->chat_template, chat_formats[k].name)) k++;
    if (k == CHAT_COUNT)
      return fprintf(stderr, "nabla serve: --chat-template: unknown template '%s' (known: %s)\n", o->chat_template,
                     chat_known), 2;
  }
  return 0;
}

/* ---------------------------------------------------------------- text helpers */

/* Growable byte buffer. */
typedef struct buf {
  char *data;
  size_t len, cap;
} buf;

static bool buf_add(buf *b, const void *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return false;
    b->data = d, b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return true;
}

/* The length of the longest valid UTF-8 sequence starting at s (0: invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!need || need > n) return 0;
  for (size_t k = 1; k < need; k++)
    if ((s[k] & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
  if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
  if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
  if (c == 0xF4 && s[1] >= 0x90) return 0; /* beyond U+10FFFF */
  return need;
}

static bool utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

/* How much of s[0..n) to release now: all but a trailing sequence that is
 * valid so far and may still complete with the next token's bytes. */
static size_t utf8_complete_prefix(const char *s, size_t n) {
  for (size_t k = 1; k <= 3 && k <= n; k++) {
    unsigned char c = (unsigned char)s[n - k];
    if ((c & 0xC0) == 0x80) continue;
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    return need > k ? n - k : n;
  }
  return n;
}

/* Appends s[0..n) to out with every invalid byte replaced by U+FFFD, so JSON
 * strings are always valid UTF-8 whatever bytes a model generates. */
static bool utf8_append_lossy(buf *out, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (!(k ? buf_add(out, s + i, k) : buf_add(out, "\xEF\xBF\xBD", 3))) return false;
    i += k ? k : 1;
  }
  return true;
}

/* ---------------------------------------------------------------- the model */


typedef struct server {
  options opt;
  nb_ctx *ctx;
  nb_model_loaded m;
  nb_model_generator *gen;
  int64_t max_model_len;
  chat_template chat;
  char chat_why[4400];          /* why chat is off (CHAT_NONE) */
  int32_t im_end_id;            /* the chat format's end-of-turn token, -1: none */
  pthread_mutex_t lock;         /* one generation at a time (ctx, gen) */
  atomic_bool stopping;         /* SIGTERM: in-flight generations end now */
  atomic_int active;            /* requests begun and not yet completed */
  atomic_ulong next_id;
  time_t created;
} server;

/* Prompt text to ids: [bos] + the tokenizer's, or its bytes. Under lock. */
static bool encode(server *sv, const char *text, size_t n, bool add_bos, nb_tok_ids *ids) {
  if (!sv->m.tok) {
    ids->ids = malloc((n + 1) * sizeof *ids->ids);
    if (!ids->ids) return false;
    if (add_bos && sv->m.bos_id >= 0) ids->ids[ids->len++] = sv->m.bos_id;
    for (size_t i = 0; i < n; i++) ids->ids[ids->len++] = (unsigned char)text[i];
    ids->cap = n + 1;
    return true;
  }
  nb_tok_ids enc = {0};
  if (nb_tok_encode(sv->m.tok, text, n, NULL, &enc)) return false;
  ids->ids = malloc((enc.len + 1) * sizeof *ids->ids);
  if (!ids->ids) return nb_tok_ids_free(sv->m.tok, &enc), false;
  if (add_bos && sv->m.bos_id >= 0) ids->ids[ids->len++] = sv->m.bos_id;
  memcpy(ids->ids + ids->len, enc.ids, enc.len * sizeof *enc.ids);
  ids->len += enc.len;
  ids->cap = enc.len + 1;
  nb_tok_ids_free(sv->m.tok, &enc);
  return true;
}

/* ids to raw bytes (appended), special tokens left out. */
static bool decode(server *sv, const int32_t *ids, size_t n, buf *out) {
  if (!sv->m.tok) {
    for (size_t i = 0; i < n; i++) {
      char c = (char)ids[i];
      if (!buf_add(out, &c, 1)) return false;
    }
    return true;
  }
  nb_tok_text t = {0};
  nb_tok_decode_opts o = {.skip_special = true};
  bool ok = !nb_tok_decode(sv->m.tok, ids, n, &o, &t) && buf_add(out, t.data ? t.data : "", t.len);
  nb_tok_text_free(sv->m.tok, &t);
  return ok;
}

static int32_t vocab_size(const server *sv) { return (int32_t)sv->m.cfg.vocab_size; }

/* ---------------------------------------------------------------- one generation */

typedef struct stream_sink stream_sink;

/* One generation: the generated ids, their text so far (decoded in the
 * context of the last prompt token, so a leading space comes out as the
 * whole sequence would print it), how much of it was released, and the
 * stop strings, which are never released partially. */
typedef struct generation {
  server *sv;
  int32_t ctx_tok;              /* last prompt token, -1: none */
  int32_t *ids;                 /* [ctx_tok] + generated */
  int64_t n_ids, n_generated;
  buf prefix;                   /* decode([ctx_tok]) */
  buf text;                     /* decode(ids) minus prefix, raw bytes */
  size_t released;              /* bytes of text already emitted */
  char **stop;
  int n_stop;
  bool hit_stop, failed;
  buf out;                      /* emitted text (lossy UTF-8) */
  void (*emit)(struct generation *g, const char *s, size_t n); /* streaming: each release */
  void *ud;
  atomic_bool *cancel;          /* set when the client went away */
} generation;

static void release(generation *g, size_t upto) {
  if (upto <= g->released) return;
  size_t start = g->out.len;
  if (!utf8_append_lossy(&g->out, g->text.data + g->released, upto - g->released)) g->failed = true;
  g->released = upto;
  if (g->emit && g->out.len > start) g->emit(g, g->out.data + start, g->out.len - start);
}

/* Re-decodes the generated text, cuts it at the first stop string and
 * releases what can no longer become part of one. Returns false to stop. */
static bool advance(generation *g, bool last) {
  g->text.len = 0;
  buf all = {0};
  bool have_ctx = g->ctx_tok >= 0;
  if (!decode(g->sv, have_ctx ? g->ids : g->ids + 1, (size_t)(have_ctx ? g->n_ids : g->n_ids - 1), &all)) {
    free(all.data);
    return g->failed = true, false;
  }
  size_t skip = g->prefix.len <= all.len && !memcmp(all.data, g->prefix.data, g->prefix.len) ? g->prefix.len : 0;
  buf_add(&g->text, all.data + skip, all.len - skip);
  free(all.data);
  /* the first stop string, searched from a little before what was released */
  size_t cut = g->text.len;
  for (int i = 0; i < g->n_stop; i++) {
    size_t sl = strlen(g->stop[i]);
    for (size_t at = 0; sl && at + sl <= g->text.len; at++)
      if (!memcmp(g->text.data + at, g->stop[i], sl)) {
        if (at < cut) cut = at;
        break;
      }
  }
  if (cut < g->text.len) {
    g->hit_stop = true;
    g->text.len = cut;
    release(g, cut);
    return false;
  }
  size_t safe = last ? g->text.len : utf8_complete_prefix(g->text.data, g->text.len);
  /* hold back a tail that is a prefix of a stop string */
  for (int i = 0; !last && i < g->n_stop; i++) {
    size_t sl = strlen(g->stop[i]);
    for (size_t k = sl > 1 ? sl - 1 : 0; k > 0; k--)
      if (k <= g->text.len && !memcmp(g->text.data + g->text.len - k, g->stop[i], k)) {
        if (g->text.len - k < safe) safe = g->text.len - k;
        break;
      }
  }
  release(g, safe);
  return true;
}

static bool on_token(void *ud, int32_t t) {
  generation *g = ud;
  g->ids[g->n_ids++] = t;
  g->n_generated++;
  bool eos = false;
  for (int i = 0; i < g->sv->m.n_eos; i++) eos |= t == g->sv->m.eos_ids[i];
  eos |= t == g->sv->im_end_id && g->sv->im_end_id >= 0;
  if (!advance(g, eos)) return false;
  return !atomic_load(&g->sv->stopping) && !(g->cancel && atomic_load(g->cancel));
}

typedef struct gen_params {
  const int32_t *prompt;
  int64_t n_prompt, max_tokens;
  nb_model_sample_opts sample;
  uint64_t seed;
  char **stop;
  int n_stop;
} gen_params;

typedef struct gen_outcome {
  int64_t completion_tokens;
  const char *finish_reason;
} gen_outcome;

/* Runs one generation under the server's lock. False: an internal error
 * (message in err). */
static bool run_generation(generation *g, const gen_params *p, gen_outcome *oc, char *err, size_t errn) {
  server *sv = g->sv;
  g->stop = p->stop, g->n_stop = p->n_stop;
  g->ctx_tok = p->n_prompt ? p->prompt[p->n_prompt - 1] : -1;
  g->ids = malloc((size_t)(p->max_tokens + 2) * sizeof *g->ids);
  if (!g->ids) return snprintf(err, errn, "out of memory"), false;
  g->ids[g->n_ids++] = g->ctx_tok;
  if (g->ctx_tok >= 0 && !decode(sv, &g->ctx_tok, 1, &g->prefix)) g->failed = true;
  int32_t stops[9];
  int n_stop_ids = 0;
  for (int i = 0; i < sv->m.n_eos; i++) stops[n_stop_ids++] = sv->m.eos_ids[i];
  if (sv->im_end_id >= 0) stops[n_stop_ids++] = sv->im_end_id;
  nb_model_gen_request r = {.prompt = p->prompt, .n_prompt = p->n_prompt, .max_tokens = p->max_tokens,
                            .sample = p->sample, .seed = p->seed, .stop = stops, .n_stop = n_stop_ids,
                            .on_token = on_token, .ud = g};
  nb_model_gen_result res = {0};
  nb_status s = NB_OK;
  if (p->max_tokens > 0) s = nb_model_generate(sv->gen, &r, &res);
  if (s || g->failed) {
    snprintf(err, errn, "generation failed: %s", s ? nb_ctx_error(sv->ctx) : "cannot decode the generated tokens");
    return false;
  }
  if (!g->hit_stop) advance(g, true); /* flush a held-back tail */
  oc->completion_tokens = g->n_generated;
  oc->finish_reason = g->hit_stop || res.stopped ? "stop" : "length";
  return true;
}

static void generation_free(generation *g) {
  free(g->ids);
  free(g->prefix.data);
  free(g->text.data);
  free(g->out.data);
}

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

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static cJSON *error_json(const char *type, const char *param, const char *code, const char *msg) {
  cJSON *e = cJSON_CreateObject(), *root = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", type);
  param ? (void)cJSON_AddStringToObject(e, "param", param) : (void)cJSON_AddNullToObject(e, "param");
  code ? (void)cJSON_AddStringToObject(e, "code", code) : (void)cJSON_AddNullToObject(e, "code");
  cJSON_AddItemToObject(root, "error", e);
  return root;
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
  const char *type = status == 401   ? "authentication_error"
                     : status == 404  ? "not_found_error"
                     : status >= 500  ? "server_error"
                                      : "invalid_request_error";
  return reply_json(c, status, error_json(type, param, code, msg));
}

/* ---------------------------------------------------------------- request fields */

/* A bad request found while reading fields: status, param, message. */
typedef struct bad {
  unsigned status;
  char param[64];
  char msg[5000];
} bad;

static bool fail(bad *b, unsigned status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool fail(bad *b, unsigned status, const char *param, const char *fmt, ...) {
  b->status = status;
  snprintf(b->param, sizeof b->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->msg, sizeof b->msg, fmt, ap);
  va_end(ap);
  return false;
}

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static bool get_int(const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *out, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (absent(v)) return true;
  double d = cJSON_IsNumber(v) ? v->valuedouble : 0.5;
  if (!cJSON_IsNumber(v) || d != floor(d)) return fail(b, 400, k, "'%s' must be an integer", k);
  if (!(d >= (double)lo && d <= (double)hi)) /* before any cast: 1e30 is no int64 */
    return fail(b, 400, k, "'%s' is %.0f, outside [%lld, %lld]", k, d, (long long)lo, (long long)hi);
  *out = (int64_t)d;
  return true;
}

static bool get_num(const cJSON *o, const char *k, double lo, double hi, double *out, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (absent(v)) return true;
  if (!cJSON_IsNumber(v)) return fail(b, 400, k, "'%s' must be a number", k);
  if (!(v->valuedouble >= lo && v->valuedouble <= hi)) return fail(b, 400, k, "'%s' is %g, outside [%g, %g]", k, v->valuedouble, lo, hi);
  *out = v->valuedouble;
  return true;
}

static bool get_bool(const cJSON *o, const char *k, bool *out, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (absent(v)) return true;
  if (!cJSON_IsBool(v)) return fail(b, 400, k, "'%s' must be a boolean", k);
  *out = cJSON_IsTrue(v);
  return true;
}

/* The model field names the served model (or is absent). */
static bool check_model(server *sv, const cJSON *o, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "model");
  if (absent(v)) return true;
  if (!cJSON_IsString(v)) return fail(b, 400, "model", "'model' must be a string");
  if (strcmp(v->valuestring, sv->opt.name))
    return fail(b, 404, "model", "The model '%s' does not exist (this server serves '%s')", v->valuestring, sv->opt.name);
  return true;
}

/* Fields nabla does not implement yet are refused when set, never ignored. */
static bool refuse_unsupported(const cJSON *o, bad *b) {
  static const char *const zero_ok[] = {"presence_penalty", "frequency_penalty"};
  for (size_t i = 0; i < sizeof zero_ok / sizeof *zero_ok; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, zero_ok[i]);
    if (!absent(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
      return fail(b, 400, zero_ok[i], "'%s' is not supported yet by nabla serve", zero_ok[i]);
  }
  static const char *const never[] = {"logprobs", "top_logprobs", "logit_bias", "suffix", "best_of", "tools", "functions",
                                      "response_format", "min_p", "repetition_penalty"};
  for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, never[i]);
    if (!absent(v) && !cJSON_IsFalse(v))
      return fail(b, 400, never[i], "'%s' is not supported yet by nabla serve (the generator does not expose it)", never[i]);
  }
  int64_t n = 1;
  if (!get_int(o, "n", 1, 1000000, &n, b)) return false;
  if (n != 1) return fail(b, 400, "n", "'n' = %lld: only n = 1 is supported yet", (long long)n);
  return true;
}

/* ids from a JSON array of integers in [0, vocab). */
static bool get_ids(server *sv, const cJSON *arr, const char *k, nb_tok_ids *ids, bad *b) {
  int n = cJSON_GetArraySize(arr);
  ids->ids = malloc(((size_t)n + 1) * sizeof *ids->ids);
  if (!ids->ids) return fail(b, 500, NULL, "out of memory");
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
      return fail(b, 400, k, "'%s' must be a string or an array of integer token ids", k);
    if (!(v->valuedouble >= 0 && v->valuedouble < vocab_size(sv)))
      return fail(b, 400, k, "'%s': token id %.0f is outside the vocabulary [0, %d)", k, v->valuedouble, vocab_size(sv));
    ids->ids[ids->len++] = (int32_t)v->valuedouble;
  }
  return true;
}

/* ---------------------------------------------------------------- sampling fields */

typedef struct sampling {
  int64_t max_tokens, top_k, seed;
  bool has_seed;
  double temperature, top_p;
  bool stream, include_usage, echo;
  char *stop[4];
  int n_stop;
} sampling;

static bool get_sampling(const cJSON *o, bool chat, sampling *s, bad *b) {
  *s = (sampling){.max_tokens = chat ? -1 : 16, .temperature = 1, .top_p = 1, .seed = -1};
  int64_t mct = -1;
  if (!get_int(o, "max_tokens", 0, 1000000000, &s->max_tokens, b) ||
      (chat && !get_int(o, "max_completion_tokens", 0, 1000000000, &mct, b)) ||
      !get_num(o, "temperature", 0, 1e6, &s->temperature, b) || !get_num(o, "top_p", 0, 1, &s->top_p, b) ||
      !get_int(o, "top_k", -1, 1000000000, &s->top_k, b) || !get_int(o, "seed", INT64_MIN, INT64_MAX, &s->seed, b) ||
      !get_bool(o, "stream", &s->stream, b) || (!chat && !get_bool(o, "echo", &s->echo, b)))
    return false;
  if (mct >= 0) s->max_tokens = mct;
  s->has_seed = !absent(cJSON_GetObjectItemCaseSensitive(o, "seed"));
  if (s->top_k < 0) s->top_k = 0; /* vLLM's -1: off */
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
  if (!absent(so)) {
    if (!cJSON_IsObject(so)) return fail(b, 400, "stream_options", "'stream_options' must be an object");
    if (!s->stream) return fail(b, 400, "stream_options", "'stream_options' is only allowed with 'stream': true");
    if (!get_bool(so, "include_usage", &s->include_usage, b)) return fail(b, 400, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
  }
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop");
  if (cJSON_IsString(st)) {
    if (st->valuestring[0]) s->stop[s->n_stop++] = st->valuestring;
  } else if (cJSON_IsArray(st)) {
    const cJSON *v;
    if (cJSON_GetArraySize(st) > 4) return fail(b, 400, "stop", "'stop' holds at most 4 strings");
    cJSON_ArrayForEach(v, st) {
      if (!cJSON_IsString(v)) return fail(b, 400, "stop", "'stop' must be a string or an array of strings");
      if (v->valuestring[0]) s->stop[s->n_stop++] = v->valuestring;
    }
  } else if (!absent(st)) {
    return fail(b, 400, "stop", "'stop' must be a string or an array of strings");
  }
  return true;
}

/* The context check, then the generator's options. */
static bool fit_context(server *sv, int64_t n_prompt, sampling *s, bad *b, const char *param) {
  if (n_prompt < 1) return fail(b, 400, param, "the prompt is empty");
  if (s->max_tokens < 0) s->max_tokens = sv->max_model_len - n_prompt; /* chat default: the rest */
  if (n_prompt + s->max_tokens > sv->max_model_len || n_prompt >= sv->max_model_len)
    return fail(b, 400, "max_tokens",
                "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%lld in the "
                "prompt, %lld for the completion). Please reduce the prompt or max_tokens.",
                (long long)sv->max_model_len, (long long)(n_prompt + s->max_tokens), (long long)n_prompt,
                (long long)s->max_tokens);
  return true;
}

/* ---------------------------------------------------------------- streaming */

/* A streamed response: a worker thread runs the generation and appends
 * server-sent events to out; MHD's reader callback (the connection's
 * thread) hands them to the socket as they come. A client that goes away
 * cancels the generation at its next token. */
struct stream_sink {
  server *sv;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  buf out;
  size_t sent;
  bool done, started;
  atomic_bool cancelled;
  /* the request */
  bool chat, include_usage, echo_pending;
  char id[48];
  gen_params p;
  nb_tok_ids prompt;
  sampling s;
  cJSON *body;                  /* owns the stop strings */
  buf echo;                     /* the prompt's text for echo */
};

static void sink_push(stream_sink *k, const char *s, size_t n) {
  pthread_mutex_lock(&k->mu);
  buf_add(&k->out, s, n);
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
}

static void sink_event(stream_sink *k, cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!s) return;
  sink_push(k, "data: ", 6);
  sink_push(k, s, strlen(s));
  sink_push(k, "\n\n", 2);
  free(s);
}

static cJSON *chunk_base(stream_sink *k) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", k->id);
  cJSON_AddStringToObject(j, "object", k->chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(j, "created", (double)time(NULL));
  cJSON_AddStringToObject(j, "model", k->sv->opt.name);
  return j;
}

/* One chunk with one choice: text (or a delta), finish_reason or null. */
static void sink_chunk(stream_sink *k, const char *text, size_t n, bool role, const char *finish) {
  cJSON *j = chunk_base(k), *choices = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", 0);
  char *t = strndup(text, n);
  if (k->chat) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (n || role) cJSON_AddStringToObject(d, "content", t ? t : "");
  } else {
    cJSON_AddStringToObject(c, "text", t ? t : "");
  }
  free(t);
  cJSON_AddNullToObject(c, "logprobs");
  finish ? (void)cJSON_AddStringToObject(c, "finish_reason", finish) : (void)cJSON_AddNullToObject(c, "finish_reason");
  cJSON_AddItemToArray(choices, c);
  if (k->include_usage) cJSON_AddNullToObject(j, "usage");
  sink_event(k, j);
}

static void stream_emit(generation *g, const char *s, size_t n) { sink_chunk(g->ud, s, n, false, NULL); }

static cJSON *usage_json(int64_t prompt, int64_t completion) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
  return u;
}

static void *stream_worker(void *arg) {
  stream_sink *k = arg;
  server *sv = k->sv;
  if (k->chat) sink_chunk(k, "", 0, true, NULL);
  if (k->echo_pending) sink_chunk(k, k->echo.data ? k->echo.data : "", k->echo.len, false, NULL);
  generation g = {.sv = sv, .emit = stream_emit, .ud = k, .cancel = &k->cancelled};
  gen_outcome oc = {0};
  char err[1024];
  pthread_mutex_lock(&sv->lock);
  bool ok = run_generation(&g, &k->p, &oc, err, sizeof err);
  pthread_mutex_unlock(&sv->lock);
  if (ok) {
    sink_chunk(k, "", 0, false, oc.finish_reason);
    if (k->include_usage) {
      cJSON *j = chunk_base(k);
      cJSON_AddArrayToObject(j, "choices");
      cJSON_AddItemToObject(j, "usage", usage_json(k->p.n_prompt, oc.completion_tokens));
      sink_event(k, j);
    }
  } else {
    sink_event(k, error_json("server_error", NULL, NULL, err));
  }
  sink_push(k, "data: [DONE]\n\n", 14);
  generation_free(&g);
  pthread_mutex_lock(&k->mu);
  k->done = true;
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

static ssize_t sink_read(void *cls, uint64_t pos, char *dst, size_t max) {
  (void)pos;
  stream_sink *k = cls;
  pthread_mutex_lock(&k->mu);
  while (k->sent == k->out.len && !k->done) pthread_cond_wait(&k->cv, &k->mu);
  size_t n = k->out.len - k->sent;
  if (n > max) n = max;
  memcpy(dst, k->out.data + k->sent, n);
  k->sent += n;
  bool end = !n && k->done;
  pthread_mutex_unlock(&k->mu);
  return end ? MHD_CONTENT_READER_END_OF_STREAM : (ssize_t)n;
}

static void sink_free(void *cls) {
  stream_sink *k = cls;
  atomic_store(&k->cancelled, true);
  if (k->started) pthread_join(k->thread, NULL);
  pthread_mutex_destroy(&k->mu);
  pthread_cond_destroy(&k->cv);
  free(k->out.data);
  free(k->echo.data);
  free(k->prompt.ids);
  cJSON_Delete(k->body);
  free(k);
}

/* ---------------------------------------------------------------- chat templates */

static const char *chat_template_name(chat_template t) { return t == CHAT_NONE ? "none" : chat_formats[t].name; }

static void add_str(buf *out, const char *s) { buf_add(out, s, strlen(s)); }

/* s without leading and trailing whitespace (the Llama and Gemma templates'
 * `| trim`). */
static void add_trimmed(buf *out, const char *s, size_t n) {
  while (n && strchr(" \t\n\r", s[0])) s++, n--;
  while (n && strchr(" \t\n\r", s[n - 1])) n--;
  buf_add(out, s, n);
}

/* Renders messages with the server's chat format, as the models' own Jinja
 * templates do (Hugging Face's tokenizer_config.json), with the generation
 * prompt (the assistant's header) when gen_prompt. *add_bos: whether the
 * caller prepends the BOS id (the Llama, Gemma and Mistral formats write it
 * as text). */
static bool render_chat(server *sv, const cJSON *messages, bool gen_prompt, buf *out, bool *add_bos, bad *b) {
  chat_template f = sv->chat;
  if (f == CHAT_NONE) return fail(b, 400, "messages", "chat is off for this model: %s", sv->chat_why);
  if (!cJSON_IsArray(messages) || !cJSON_GetArraySize(messages))
    return fail(b, 400, "messages", "'messages' must be a non-empty array of {role, content} objects");
  *add_bos = f == CHAT_CHATML;
  if (f == CHAT_LLAMA3) add_str(out, "<|begin_of_text|>");
  if (f == CHAT_GEMMA) add_str(out, "<bos>");
  if (f == CHAT_MISTRAL) add_str(out, "<s>");
  const cJSON *m;
  int i = 0;
  buf system = {0}, content = {0};
  bool have_system = false, ok = true;
  cJSON_ArrayForEach(m, messages) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
      ok = fail(b, 400, "messages", "messages[%d] must be an object with a string 'role'", i);
      break;
    }
    const char *r = role->valuestring;
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
      ok = fail(b, 400, "messages", "messages[%d].role '%s' is not system, user or assistant", i, r);
      break;
    }
    content.len = 0;
    buf_add(&content, "", 0);
    if (cJSON_IsString(c)) {
      add_str(&content, c->valuestring);
    } else if (cJSON_IsArray(c)) { /* [{type: text, text}] parts */
      const cJSON *part;
      cJSON_ArrayForEach(part, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type"), *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
          ok = fail(b, 400, "messages", "messages[%d].content: only text parts are supported", i);
          break;
        }
        add_str(&content, tx->valuestring);
      }
      if (!ok) break;
    } else if (!absent(c)) {
      ok = fail(b, 400, "messages", "messages[%d].content must be a string or an array of text parts", i);
      break;
    }
    bool sys = !strcmp(r, "system"), user = !strcmp(r, "user");
    switch (f) {
    case CHAT_CHATML:
      add_str(out, "<|im_start|>"), add_str(out, r), add_str(out, "\n");
      buf_add(out, content.data, content.len), add_str(out, "<|im_end|>\n");
      break;
    case CHAT_LLAMA3:
      add_str(out, "<|start_header_id|>"), add_str(out, r), add_str(out, "<|end_header_id|>\n\n");
      add_trimmed(out, content.data, content.len), add_str(out, "<|eot_id|>");
      break;
    case CHAT_GEMMA:
      if (sys) {
        ok = fail(b, 400, "messages", "messages[%d]: the gemma template has no system role", i);
        break;
      }
      add_str(out, "<start_of_turn>"), add_str(out, user ? "user" : "model"), add_str(out, "\n");
      add_trimmed(out, content.data, content.len), add_str(out, "<end_of_turn>\n");
      break;
    case CHAT_LLAMA2: /* the system prompt goes inside the first user turn */
    case CHAT_MISTRAL:
      if (sys) {
        if (i) {
          ok = fail(b, 400, "messages", "messages[%d]: the %s template takes a system message only first", i,
                    chat_formats[f].name);
          break;
        }
        have_system = true;
        buf_add(&system, content.data, content.len);
        break;
      }
      if (user) {
        add_str(out, f == CHAT_LLAMA2 ? "<s>[INST] " : "[INST] ");
        buf turn = {0};
        if (have_system) {
          if (f == CHAT_LLAMA2) add_str(&turn, "<<SYS>>\n"), buf_add(&turn, system.data, system.len), add_str(&turn, "\n<</SYS>>\n\n");
          else buf_add(&turn, system.data, system.len), add_str(&turn, "\n\n");
          have_system = false;
        }
        buf_add(&turn, content.data, content.len);
        f == CHAT_LLAMA2 ? add_trimmed(out, turn.data, turn.len) : (void)buf_add(out, turn.data, turn.len);
        free(turn.data);
        add_str(out, " [/INST]");
      } else if (f == CHAT_LLAMA2) {
        add_str(out, " "), add_trimmed(out, content.data, content.len), add_str(out, " </s>");
      } else {
        buf_add(out, content.data, content.len), add_str(out, "</s>");
      }
      break;
    default:
      break;
    }
    if (!ok) break;
    i++;
  }
  free(system.data);
  free(content.data);
  if (!ok) return false;
  if (gen_prompt) {
    if (f == CHAT_CHATML) add_str(out, "<|im_start|>assistant\n");
    if (f == CHAT_LLAMA3) add_str(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (f == CHAT_GEMMA) add_str(out, "<start_of_turn>model\n");
  }
  buf_add(out, "", 0);
  return true;
}

/* ---------------------------------------------------------------- endpoints */

static void new_id(server *sv, const char *prefix, char *out, size_t n) {
  snprintf(out, n, "%s-%lx%08lx", prefix, (unsigned long)time(NULL), (unsigned long)atomic_fetch_add(&sv->next_id, 1));
}

static enum MHD_Result reply_bad(struct MHD_Connection *c, const bad *b) {
  return reply_error(c, b->status, b->param[0] ? b->param : NULL, b->status == 404 ? "model_not_found" : NULL, "%s", b->msg);
}

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

/* vLLM's /tokenize: {prompt, add_special_tokens?} -> {count, max_model_len, tokens}. */
static enum MHD_Result do_tokenize(server *sv, struct MHD_Connection *c, const cJSON *o) {
  bad b = {0};
  bool add_special = true;
  bool gen_prompt = true;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
  if (!check_model(sv, o, &b) || !get_bool(o, "add_special_tokens", &add_special, &b) ||
      !get_bool(o, "add_generation_prompt", &gen_prompt, &b))
    return reply_bad(c, &b);
  buf chat = {0};
  if (!absent(msgs)) { /* a conversation, rendered as /v1/chat/completions does */
    bool bos = false;
    if (!render_chat(sv, msgs, gen_prompt, &chat, &bos, &b)) return free(chat.data), reply_bad(c, &b);
    add_special = bos;
  } else if (!cJSON_IsString(p)) {
    return reply_error(c, 400, "prompt", NULL, "'prompt' must be a string (or give 'messages')");
  }
  const char *text = chat.data ? chat.data : p->valuestring;
  nb_tok_ids ids = {0};
  pthread_mutex_lock(&sv->lock);
  bool ok = encode(sv, text, strlen(text), add_special, &ids);
  pthread_mutex_unlock(&sv->lock);
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
  pthread_mutex_lock(&sv->lock);
  bool ok = decode(sv, ids.ids, ids.len, &raw) && utf8_append_lossy(&text, raw.data ? raw.data : "", raw.len);
  pthread_mutex_unlock(&sv->lock);
  free(ids.ids);
  free(raw.data);
  if (!ok) return free(text.data), reply_error(c, 500, NULL, NULL, "cannot detokenize: %s", nb_ctx_error(sv->ctx));
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "prompt", text.data ? text.data : "");
  free(text.data);
  return reply_json(c, 200, root);
}

/* /v1/completions and /v1/chat/completions. Takes ownership of body. */
static enum MHD_Result do_complete(server *sv, struct MHD_Connection *c, cJSON *body, bool chat) {
  bad b = {0};
  sampling s;
  nb_tok_ids prompt = {0};
  buf echo = {0}, rendered = {0};
  enum MHD_Result ret;
  if (!check_model(sv, body, &b) || !refuse_unsupported(body, &b) || !get_sampling(body, chat, &s, &b)) goto bad;
  if (chat) {
    bool bos = false;
    if (!render_chat(sv, cJSON_GetObjectItemCaseSensitive(body, "messages"), true, &rendered, &bos, &b)) goto bad;
    pthread_mutex_lock(&sv->lock);
    bool ok = encode(sv, rendered.data, rendered.len, bos, &prompt);
    pthread_mutex_unlock(&sv->lock);
    if (!ok) {
      fail(&b, 400, "messages", "cannot tokenize the conversation: %s", nb_ctx_error(sv->ctx));
      goto bad;
    }
  } else {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(p->child)) p = p->child; /* ["text"] */
    if (cJSON_IsString(p)) {
      pthread_mutex_lock(&sv->lock);
      bool ok = encode(sv, p->valuestring, strlen(p->valuestring), true, &prompt);
      pthread_mutex_unlock(&sv->lock);
      if (!ok) {
        fail(&b, 400, "prompt", "cannot tokenize the prompt: %s", nb_ctx_error(sv->ctx));
        goto bad;
      }
      if (s.echo) buf_add(&echo, p->valuestring, strlen(p->valuestring));
    } else if (cJSON_IsArray(p)) {
      if (cJSON_IsArray(p->child)) {
        fail(&b, 400, "prompt", "'prompt': batches of prompts are not supported yet; send one prompt per request");
        goto bad;
      }
      if (!get_ids(sv, p, "prompt", &prompt, &b)) goto bad;
      if (s.echo) {
        buf raw = {0};
        pthread_mutex_lock(&sv->lock);
        decode(sv, prompt.ids, prompt.len, &raw);
        pthread_mutex_unlock(&sv->lock);
        utf8_append_lossy(&echo, raw.data ? raw.data : "", raw.len);
        free(raw.data);
      }
    } else {
      fail(&b, 400, "prompt", absent(p) ? "'prompt' is required" : "'prompt' must be a string or an array of integer token ids");
      goto bad;
    }
  }
  if (!fit_context(sv, (int64_t)prompt.len, &s, &b, chat ? "messages" : "prompt")) goto bad;

  uint64_t seed = s.has_seed ? (uint64_t)s.seed : (uint64_t)time(NULL) ^ ((uint64_t)atomic_fetch_add(&sv->next_id, 1) << 32);
  gen_params p = {.prompt = prompt.ids, .n_prompt = (int64_t)prompt.len, .max_tokens = s.max_tokens,
                  .sample = {.temperature = s.temperature, .top_k = s.top_k, .top_p = s.top_p}, .seed = seed,
                  .stop = s.stop, .n_stop = s.n_stop};
  if (chat && chat_formats[sv->chat].end && p.n_stop < 4) p.stop[p.n_stop++] = (char *)chat_formats[sv->chat].end;
  char id[48];
  new_id(sv, chat ? "chatcmpl" : "cmpl", id, sizeof id);

  if (s.stream) { /* the sink takes prompt, echo and body */
    free(rendered.data);
    rendered = (buf){0};
    stream_sink *k = calloc(1, sizeof *k);
    if (!k) goto oom;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->sv = sv, k->chat = chat, k->include_usage = s.include_usage, k->echo_pending = s.echo;
    snprintf(k->id, sizeof k->id, "%s", id);
    k->s = s, k->prompt = prompt, k->body = body, k->echo = echo;
    k->p = p;
    k->p.stop = k->s.stop;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sink_read, k, sink_free);
    if (!r) {
      sink_free(k);
      return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    k->started = !pthread_create(&k->thread, NULL, stream_worker, k);
    if (!k->started) {
      k->done = true;
    }
    ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }

  generation g = {.sv = sv};
  gen_outcome oc = {0};
  char err[1024];
  pthread_mutex_lock(&sv->lock);
  bool ok = run_generation(&g, &p, &oc, err, sizeof err);
  pthread_mutex_unlock(&sv->lock);
  if (!ok) {
    generation_free(&g);
    ret = reply_error(c, 500, NULL, NULL, "%s", err);
    goto done;
  }
  cJSON *root = cJSON_CreateObject(), *choices, *ch = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "id", id);
  cJSON_AddStringToObject(root, "object", chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(root, "created", (double)time(NULL));
  cJSON_AddStringToObject(root, "model", sv->opt.name);
  choices = cJSON_AddArrayToObject(root, "choices");
  cJSON_AddNumberToObject(ch, "index", 0);
  buf text = {0};
  buf_add(&text, echo.data ? echo.data : "", echo.len);
  buf_add(&text, g.out.data ? g.out.data : "", g.out.len);
  if (chat) {
    cJSON *msg = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", text.data ? text.data : "");
  } else {
    cJSON_AddStringToObject(ch, "text", text.data ? text.data : "");
  }
  free(text.data);
  cJSON_AddNullToObject(ch, "logprobs");
  cJSON_AddStringToObject(ch, "finish_reason", oc.finish_reason);
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddItemToObject(root, "usage", usage_json(p.n_prompt, oc.completion_tokens));
  generation_free(&g);
  ret = reply_json(c, 200, root);
  goto done;
oom:
  ret = reply_error(c, 500, NULL, NULL, "out of memory");
  goto done;
bad:
  ret = reply_bad(c, &b);
done:
  free(prompt.ids);
  free(echo.data);
  free(rendered.data);
  cJSON_Delete(body);
  return ret;
}

/* ---------------------------------------------------------------- the request handler */

typedef struct request {
  buf body;
  bool too_large;
} request;

typedef enum route { R_HEALTH, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS, R_CHAT, R_COUNT } route;
static const struct {
  const char *path, *method;
} routes[R_COUNT] = {{"/health", "GET"},     {"/v1/models", "GET"},       {"/tokenize", "POST"},
                     {"/detokenize", "POST"}, {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};

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
    atomic_fetch_add(&sv->active, 1);
    if (atomic_load(&sv->stopping)) return reply_error(c, 503, NULL, NULL, "the server is shutting down");
    int r = 0;
    while (r < R_COUNT && strcmp(url, routes[r].path)) r++;
    if (r == R_COUNT) return reply_error(c, 404, NULL, "not_found", "no route %s %s", method, url);
    if (strcmp(method, routes[r].method))
      return reply_error(c, 405, NULL, "method_not_allowed", "%s takes %s, not %s", url, routes[r].method, method);
    if (r != R_HEALTH && !authorized(sv, c))
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
  if (!cJSON_IsObject(body)) {
    cJSON_Delete(body);
    return reply_error(c, 400, NULL, NULL, "the request body must be a JSON object");
  }
  if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
    enum MHD_Result r = !strcmp(url, "/tokenize") ? do_tokenize(sv, c, body) : do_detokenize(sv, c, body);
    cJSON_Delete(body);
    return r;
  }
  return do_complete(sv, c, body, !strcmp(url, "/v1/chat/completions"));
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why) {
  (void)c, (void)why;
  server *sv = cls;
  request *rq = *state;
  if (rq) free(rq->body.data), atomic_fetch_sub(&sv->active, 1);
  free(rq);
  *state = NULL;
}

/* ---------------------------------------------------------------- the command */

static bool is_file(const char *dir, const char *name) {
  char p[4096];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return !stat(p, &st) && S_ISREG(st.st_mode);
}

/* The chat format: --chat-template, else the one tokenizer_config.json's
 * chat_template is, else ChatML when the model declares none. A declared
 * template nabla does not know turns chat off (requests say why). */
static void pick_chat_template(server *sv) {
  sv->chat = CHAT_CHATML;
  if (sv->opt.chat_template) { /* a known name: parse() refused the others */
    while (strcmp(sv->opt.chat_template, chat_formats[sv->chat].name)) sv->chat++;
  } else {
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", sv->opt.model);
    size_t n = 0;
    char *text = is_file(sv->opt.model, "tokenizer_config.json") ? nb_cli_read_input("serve", p, &n) : NULL;
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    if (text && !j) {
      sv->chat = CHAT_NONE;
      snprintf(sv->chat_why, sizeof sv->chat_why, "%s is not valid JSON; pass --chat-template NAME", p);
    } else if (!absent(t)) {
      sv->chat = CHAT_NONE;
      for (int k = 0; k < CHAT_COUNT && sv->chat == CHAT_NONE; k++)
        if (cJSON_IsString(t) && strstr(t->valuestring, chat_formats[k].marker)) sv->chat = (chat_template)k;
      if (sv->chat == CHAT_NONE)
        snprintf(sv->chat_why, sizeof sv->chat_why,
                 "%s's chat_template is none nabla knows (known: %s); pass --chat-template NAME", p, chat_known);
    }
    cJSON_Delete(j);
    free(text);
  }
  sv->im_end_id = -1;
  if (sv->chat != CHAT_NONE && chat_formats[sv->chat].end && sv->m.tok) {
    sv->im_end_id = nb_tok_added_id(sv->m.tok, chat_formats[sv->chat].end);
    if (sv->im_end_id < 0) sv->im_end_id = -1;
  }
}

static int serve(server *sv) {
  const options *o = &sv->opt;
  nb_model_loaded *m = &sv->m;
  nb_status s = is_file(o->model, "config.yaml") ? nb_train_load_run_dir(sv->ctx, o->model, o->config, m)
                : is_file(o->model, "config.json") && !o->config ? nb_model_load_hf(sv->ctx, o->model, m)
                                                                  : nb_train_load_checkpoint(sv->ctx, o->model, o->config, m);
  if (s) return fprintf(stderr, "nabla serve: %s\n", nb_ctx_error(sv->ctx)), 1;
  sv->max_model_len = o->max_model_len ? o->max_model_len : m->cfg.max_seq_len < 4096 ? m->cfg.max_seq_len : 4096;
  if (sv->max_model_len > m->cfg.max_seq_len)
    return fprintf(stderr, "nabla serve: --max-model-len %lld exceeds the model's max_seq_len %lld\n",
                   (long long)sv->max_model_len, (long long)m->cfg.max_seq_len), 1;
  pick_chat_template(sv);
  nb_model_gen_opts go = {.max_seq_len = sv->max_model_len, .threads = o->threads};
  sv->gen = nb_model_generator_create(sv->ctx, &m->cfg, m->params, &go);
  if (!sv->gen) return fprintf(stderr, "nabla serve: %s\n", nb_ctx_error(sv->ctx)), 1;

  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
  const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
    return fprintf(stderr, "nabla serve: --host '%s' is not an IPv4 address\n", o->host), 2;
  /* SIGTERM / SIGINT are taken by sigwait below: blocked in every thread */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle, sv,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout,
      MHD_OPTION_NOTIFY_COMPLETED, completed, sv, MHD_OPTION_END);
  if (!d) return fprintf(stderr, "nabla serve: cannot listen on %s:%lld: %s\n", o->host, (long long)o->port, strerror(errno)), 1;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  printf("nabla serve: %s on http://%s:%u (context %lld, chat template %s; one request at a time)\n", m->what, host,
         info ? info->port : (unsigned)o->port, (long long)sv->max_model_len, chat_template_name(sv->chat));
  fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  /* stop accepting, end in-flight generations at their next token, and let
   * their responses finish (a stream gets its final chunk and [DONE]; a
   * half-sent request waits at most --timeout) before closing connections */
  fprintf(stderr, "nabla serve: %s: shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  atomic_store(&sv->stopping, true);
  MHD_socket ls = MHD_quiesce_daemon(d);
  if (ls != MHD_INVALID_SOCKET) close(ls);
  for (int64_t ms = 0; atomic_load(&sv->active) > 0 && ms < 1000 * (o->timeout + 2); ms += 10) usleep(10000);
  MHD_stop_daemon(d);
  return 0;
}

int nb_cmd_serve(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  server *sv = calloc(1, sizeof *sv);
  if (!sv) return 1;
  int rc = parse(argc, argv, &sv->opt);
  if (!rc) {
    sv->ctx = nb_ctx_create();
    pthread_mutex_init(&sv->lock, NULL);
    sv->created = time(NULL);
    rc = sv->ctx ? serve(sv) : 1;
    nb_model_generator_destroy(sv->gen);
    nb_model_loaded_free(&sv->m);
    nb_ctx_destroy(sv->ctx);
    pthread_mutex_destroy(&sv->lock);
  }
  free(sv);
  return rc;
}
