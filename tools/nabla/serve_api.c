/* `nabla serve`'s OpenAI API: request fields read and checked (every
 * refusal names its field), the text of each choice as the engine's tokens
 * arrive (stop strings, UTF-8 hold-back, logprobs), and the responses:
 * whole, or as server-sent chunks. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve_int.h"

/* ---------------------------------------------------------------- fields */

bool fail(bad *b, unsigned status, const char *param, const char *fmt, ...) {
  b->status = status;
  snprintf(b->param, sizeof b->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->msg, sizeof b->msg, fmt, ap);
  va_end(ap);
  return false;
}

bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

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

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static bool get_num(const cJSON *o, const char *k, double lo, bool lo_open, double hi, double *out, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (absent(v)) return true;
  if (!cJSON_IsNumber(v)) return fail(b, 400, k, "'%s' must be a number", k);
  double d = v->valuedouble;
  if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
    return fail(b, 400, k, "'%s' is %g, outside %c%g, %g]", k, d, lo_open ? '(' : '[', lo, hi);
  *out = d;
  return true;
}

bool get_bool(const cJSON *o, const char *k, bool *out, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (absent(v)) return true;
  if (!cJSON_IsBool(v)) return fail(b, 400, k, "'%s' must be a boolean", k);
  *out = cJSON_IsTrue(v);
  return true;
}

bool check_model(server *sv, const cJSON *o, bad *b) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "model");
  if (absent(v)) return true;
  if (!cJSON_IsString(v)) return fail(b, 400, "model", "'model' must be a string");
  if (strcmp(v->valuestring, sv->opt.name))
    return fail(b, 404, "model", "The model '%s' does not exist (this server serves '%s')", v->valuestring, sv->opt.name);
  return true;
}

static int32_t vocab_size(const server *sv) { return (int32_t)sv->m.cfg.vocab_size; }

/* ids from a JSON array of integers in [0, vocab); appended to ids. */
bool get_ids(server *sv, const cJSON *arr, const char *k, nb_tok_ids *ids, bad *b) {
  int n = cJSON_GetArraySize(arr);
  int32_t *g = realloc(ids->ids, (ids->len + (size_t)n + 1) * sizeof *g);
  if (!g) return fail(b, 500, NULL, "out of memory");
  ids->ids = g;
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

/* Fields nabla does not implement are refused when set, never ignored. */
static bool refuse_unsupported(const cJSON *o, bad *b) {
  static const char *const never[] = {"suffix", "tools", "functions", "tool_choice", "function_call", "response_format"};
  for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, never[i]);
    if (!absent(v) && !cJSON_IsFalse(v)) return fail(b, 400, never[i], "'%s' is not supported by nabla serve", never[i]);
  }
  return true;
}

static bool get_stop(const cJSON *o, creq *q, bad *b) {
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop"), *v;
  if (absent(st)) return true;
  if (cJSON_IsString(st)) {
    if (st->valuestring[0]) q->stop[q->n_stop++] = strdup(st->valuestring);
    return true;
  }
  if (!cJSON_IsArray(st)) return fail(b, 400, "stop", "'stop' must be a string or an array of strings");
  if (cJSON_GetArraySize(st) > 4) return fail(b, 400, "stop", "'stop' holds at most 4 strings");
  cJSON_ArrayForEach(v, st) {
    if (!cJSON_IsString(v)) return fail(b, 400, "stop", "'stop' must be a string or an array of strings");
    if (v->valuestring[0]) q->stop[q->n_stop++] = strdup(v->valuestring);
  }
  return true;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100]}. */
static bool get_logit_bias(server *sv, const cJSON *o, creq *q, bad *b) {
  const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias"), *v;
  if (absent(lb)) return true;
  if (!cJSON_IsObject(lb)) return fail(b, 400, "logit_bias", "'logit_bias' must be an object of token ids to biases");
  int n = cJSON_GetArraySize(lb);
  if (!n) return true;
  q->bias_ids = malloc((size_t)n * sizeof *q->bias_ids);
  q->bias_values = malloc((size_t)n * sizeof *q->bias_values);
  if (!q->bias_ids || !q->bias_values) return fail(b, 500, NULL, "out of memory");
  cJSON_ArrayForEach(v, lb) {
    char *end = NULL;
    long long id = strtoll(v->string, &end, 10);
    if (!v->string[0] || *end || id < 0 || id >= vocab_size(sv))
      return fail(b, 400, "logit_bias", "'logit_bias': key '%s' is not a token id in [0, %d)", v->string, vocab_size(sv));
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -100 && v->valuedouble <= 100))
      return fail(b, 400, "logit_bias", "'logit_bias': the bias of token %lld must be a number in [-100, 100]", id);
    q->bias_ids[q->sp.num_logit_bias] = (int32_t)id;
    q->bias_values[q->sp.num_logit_bias++] = (float)v->valuedouble;
  }
  q->sp.logit_bias_ids = q->bias_ids;
  q->sp.logit_bias_values = q->bias_values;
  return true;
}

static bool get_stop_token_ids(server *sv, const cJSON *o, creq *q, bad *b) {
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop_token_ids"), *v;
  if (absent(st)) return true;
  if (!cJSON_IsArray(st)) return fail(b, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
  int n = cJSON_GetArraySize(st);
  q->stop_ids = malloc(((size_t)n + 1) * sizeof *q->stop_ids);
  if (!q->stop_ids) return fail(b, 500, NULL, "out of memory");
  cJSON_ArrayForEach(v, st) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !(v->valuedouble >= 0 && v->valuedouble < vocab_size(sv)))
      return fail(b, 400, "stop_token_ids", "'stop_token_ids' must hold token ids in [0, %d)", vocab_size(sv));
    q->stop_ids[q->sp.num_stop_token_ids++] = (int32_t)v->valuedouble;
  }
  q->sp.stop_token_ids = q->stop_ids;
  return true;
}

/* The sampling fields (vLLM's SamplingParams through OpenAI's names). */
static bool get_sampling(server *sv, const cJSON *o, creq *q, bad *b) {
  double temperature = 1, top_p = 1, min_p = 0, pres = 0, freq = 0, rep = 1;
  int64_t top_k = -1, seed = 0, min_tokens = 0, n = 1, best_of = -1;
  if (!get_num(o, "temperature", 0, false, 1e6, &temperature, b) || !get_num(o, "top_p", 0, true, 1, &top_p, b) ||
      !get_int(o, "top_k", -1, 1000000000, &top_k, b) || !get_num(o, "min_p", 0, false, 1, &min_p, b) ||
      !get_num(o, "presence_penalty", -2, false, 2, &pres, b) || !get_num(o, "frequency_penalty", -2, false, 2, &freq, b) ||
      !get_num(o, "repetition_penalty", 0, true, 100, &rep, b) || !get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, b) ||
      !get_int(o, "n", 1, sv->opt.max_num_seqs, &n, b) || !get_int(o, "best_of", 1, sv->opt.max_num_seqs, &best_of, b) ||
      !get_bool(o, "ignore_eos", &q->ignore_eos, b))
    return false;
  if (best_of >= 0 && best_of != n)
    return fail(b, 400, "best_of", "'best_of' = %lld: only best_of = n (%lld) is supported", (long long)best_of, (long long)n);
  q->n = (int32_t)n;
  q->sp.temperature = (float)temperature;
  q->sp.top_k = top_k > 0 ? (int32_t)top_k : 0; /* vLLM's -1 and 0: off */
  q->sp.top_p = (float)top_p;
  q->sp.min_p = (float)min_p;
  q->sp.presence_penalty = (float)pres;
  q->sp.frequency_penalty = (float)freq;
  q->sp.repetition_penalty = (float)rep;
  if (!absent(cJSON_GetObjectItemCaseSensitive(o, "seed"))) {
    q->sp.seed = (uint64_t)seed;
  } else { /* a fresh stream per request */
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    q->sp.seed = r ^ atomic_fetch_add(&sv->next_id, 1);
  }
  if (!get_logit_bias(sv, o, q, b) || !get_stop_token_ids(sv, o, q, b) ||
      !get_int(o, "min_tokens", 0, 1000000000, &min_tokens, b))
    return false;
  q->sp.min_tokens = (int32_t)min_tokens;
  /* logprobs: completions take a count, chat a boolean and top_logprobs */
  const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
  q->logprobs = -1;
  if (q->chat) {
    bool on = false;
    int64_t top = -1;
    if (!get_bool(o, "logprobs", &on, b) || !get_int(o, "top_logprobs", 0, NB_SERVE_MAX_LOGPROBS, &top, b)) return false;
    if (top >= 0 && !on) return fail(b, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (on) q->logprobs = top > 0 ? (int)top : 0;
  } else if (!absent(lp)) {
    int64_t k = 0;
    if (cJSON_IsBool(lp)) return fail(b, 400, "logprobs", "'logprobs' must be an integer");
    if (!get_int(o, "logprobs", 0, 5, &k, b)) return false;
    q->logprobs = (int)k;
  }
  if (!q->chat && !absent(cJSON_GetObjectItemCaseSensitive(o, "top_logprobs")))
    return fail(b, 400, "top_logprobs", "'top_logprobs' is a chat field; completions take 'logprobs': N");
  q->sp.num_logprobs = q->logprobs > 0 ? q->logprobs : 0;
  return true;
}

/* One prompt's check against the context; a chat request without a
 * max_tokens gets the rest of it. */
static bool fit_context(server *sv, creq *q, int64_t n_prompt, const char *param, bad *b) {
  if (n_prompt < 1) return fail(b, 400, param, "the prompt is empty");
  int64_t mt = q->max_tokens >= 0 ? q->max_tokens : sv->max_model_len - n_prompt;
  if (n_prompt + mt > sv->max_model_len || n_prompt >= sv->max_model_len)
    return fail(b, 400, "max_tokens",
                "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%lld in the "
                "prompt, %lld for the completion). Please reduce the prompt or max_tokens.",
                (long long)sv->max_model_len, (long long)(n_prompt + mt), (long long)n_prompt, (long long)mt);
  if (q->max_tokens < 0) q->max_tokens = mt;
  return true;
}

static bool add_prompt(creq *q) {
  nb_tok_ids *p = realloc(q->prompts, ((size_t)q->num_prompts + 1) * sizeof *p);
  buf *e = realloc(q->echo_text, ((size_t)q->num_prompts + 1) * sizeof *e);
  if (p) q->prompts = p;
  if (e) q->echo_text = e;
  if (!p || !e) return false;
  p[q->num_prompts] = (nb_tok_ids){0};
  e[q->num_prompts] = (buf){0};
  q->num_prompts++;
  return true;
}

/* A completions prompt: a string, an array of token ids, or a list of
 * either (each its own prompt; choices are indexed prompt-major). */
static bool get_prompts(server *sv, const cJSON *body, creq *q, bad *b) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt"), *v;
  if (absent(p)) return fail(b, 400, "prompt", "'prompt' is required");
  bool list = cJSON_IsArray(p) && p->child && (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
  if (!cJSON_IsString(p) && !cJSON_IsArray(p)) return fail(b, 400, "prompt", "'prompt' must be a string or an array of integer token ids");
  if (cJSON_IsArray(p) && !p->child) return fail(b, 400, "prompt", "the prompt is empty");
  const cJSON *one = p;
  for (v = list ? p->child : p; v; v = list ? v->next : NULL) {
    one = v;
    if (!add_prompt(q)) return fail(b, 500, NULL, "out of memory");
    nb_tok_ids *ids = &q->prompts[q->num_prompts - 1];
    if (cJSON_IsString(one)) {
      if (!encode(sv, one->valuestring, strlen(one->valuestring), true, ids))
        return fail(b, 400, "prompt", "cannot tokenize the prompt: %s", nb_ctx_error(sv->ctx));
      if (q->echo) buf_str(&q->echo_text[q->num_prompts - 1], one->valuestring);
    } else if (cJSON_IsArray(one) && (!one->child || !cJSON_IsArray(one->child))) {
      if (!get_ids(sv, one, "prompt", ids, b)) return false;
      if (q->echo) {
        buf raw = {0};
        decode(sv, ids->ids, ids->len, &raw);
        utf8_append_lossy(&q->echo_text[q->num_prompts - 1], raw.data ? raw.data : "", raw.len);
        free(raw.data);
      }
    } else {
      return fail(b, 400, "prompt", "'prompt' must be a string, an array of token ids, or a list of either");
    }
    if (!fit_context(sv, q, (int64_t)ids->len, "prompt", b)) return false;
    if (!list) break;
  }
  return true;
}

bool parse_request(server *sv, const cJSON *body, bool chat, creq *q, bad *b) {
  *q = (creq){.chat = chat, .max_tokens = chat ? -1 : 16, .n = 1, .created = time(NULL)};
  snprintf(q->id, sizeof q->id, "%s-%lx%08lx", chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL),
           (unsigned long)atomic_fetch_add(&sv->next_id, 1));
  int64_t mct = -1;
  if (!check_model(sv, body, b) || !refuse_unsupported(body, b) ||
      !get_int(body, "max_tokens", 0, 1000000000, &q->max_tokens, b) ||
      (chat && !get_int(body, "max_completion_tokens", 0, 1000000000, &mct, b)) || !get_bool(body, "stream", &q->stream, b) ||
      (!chat && !get_bool(body, "echo", &q->echo, b)) || !get_sampling(sv, body, q, b) || !get_stop(body, q, b))
    return false;
  if (mct >= 0) q->max_tokens = mct;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
  if (!absent(so)) {
    if (!cJSON_IsObject(so)) return fail(b, 400, "stream_options", "'stream_options' must be an object");
    if (!q->stream) return fail(b, 400, "stream_options", "'stream_options' is only allowed with 'stream': true");
    if (!get_bool(so, "include_usage", &q->include_usage, b))
      return fail(b, 400, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
  }
  if (q->echo && q->logprobs >= 0)
    return fail(b, 400, "echo", "'echo' with 'logprobs' is not supported (prompt logprobs are not computed)");
  if (chat) {
    buf rendered = {0};
    bool bos = false;
    if (!render_chat(sv, cJSON_GetObjectItemCaseSensitive(body, "messages"), true, &rendered, &bos, b))
      return free(rendered.data), false;
    bool ok = add_prompt(q) && encode(sv, rendered.data, rendered.len, bos, &q->prompts[0]);
    free(rendered.data);
    if (!ok) return fail(b, 400, "messages", "cannot tokenize the conversation: %s", nb_ctx_error(sv->ctx));
    if (!fit_context(sv, q, (int64_t)q->prompts[0].len, "messages", b)) return false;
    if (nb_serve_chat_end(sv->chat)) q->stop[q->n_stop++] = strdup(nb_serve_chat_end(sv->chat));
  } else if (!get_prompts(sv, body, q, b)) {
    return false;
  }
  if (q->sp.min_tokens > q->max_tokens)
    return fail(b, 400, "min_tokens", "'min_tokens' (%d) is more than 'max_tokens' (%lld)", q->sp.min_tokens,
                (long long)q->max_tokens);
  for (int i = 0; i < q->n_stop; i++)
    if (!q->stop[i]) return fail(b, 500, NULL, "out of memory");
  return true;
}

void creq_free(creq *q) {
  for (int32_t i = 0; i < q->num_prompts; i++) {
    free(q->prompts[i].ids);
    free(q->echo_text[i].data);
  }
  free(q->prompts);
  free(q->echo_text);
  free(q->bias_ids);
  free(q->bias_values);
  free(q->stop_ids);
  for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
  *q = (creq){0};
}

/* ---------------------------------------------------------------- errors */

const char *error_type(unsigned status) {
  return status == 401 ? "authentication_error" : status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
cJSON *error_json(const char *type, const char *param, const char *code, const char *msg) {
  cJSON *e = cJSON_CreateObject(), *root = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", type);
  param ? (void)cJSON_AddStringToObject(e, "param", param) : (void)cJSON_AddNullToObject(e, "param");
  code ? (void)cJSON_AddStringToObject(e, "code", code) : (void)cJSON_AddNullToObject(e, "code");
  cJSON_AddItemToObject(root, "error", e);
  return root;
}

/* ---------------------------------------------------------------- a choice's text */

void choice_init(server *sv, choice *c, const creq *q, int32_t prompt) {
  const nb_tok_ids *p = &q->prompts[prompt];
  *c = (choice){.ctx_tok = p->len ? p->ids[p->len - 1] : -1};
  c->cap_ids = 16;
  c->ids = malloc((size_t)c->cap_ids * sizeof *c->ids);
  if (c->ids) c->ids[c->n_ids++] = c->ctx_tok;
  c->win_from = c->ctx_tok >= 0 ? 0 : 1;
  c->win_to = 1;
  if (c->ctx_tok >= 0) decode(sv, &c->ctx_tok, 1, &c->window);
  if (q->echo) c->text_offset = q->echo_text[prompt].len;
}

void choice_free(choice *c) {
  free(c->ids);
  free(c->window.data);
  free(c->text.data);
  free(c->out.data);
  free(c->lp);
}

static void release(choice *c, size_t upto) {
  if (upto <= c->released) return;
  utf8_append_lossy(&c->out, c->text.data + c->released, upto - c->released);
  c->released = upto;
}

/* Adds the new ids' bytes to the text: decode(ids[win_from..]) minus
 * decode(ids[win_from, win_to)), the window starting at a token already
 * out so that a leading space or a merge decodes as in the whole sequence.
 * A tokenizer whose window decodes otherwise gets the whole text decoded
 * again. */
static void extend_text(server *sv, choice *c) {
  buf cur = {0};
  decode(sv, c->ids + c->win_from, (size_t)(c->n_ids - c->win_from), &cur);
  if (cur.len >= c->window.len && (!c->window.len || !memcmp(cur.data, c->window.data, c->window.len))) {
    buf_add(&c->text, cur.data ? cur.data + c->window.len : "", cur.len - c->window.len);
  } else {
    buf all = {0}, first = {0};
    int64_t from = c->ctx_tok >= 0 ? 0 : 1;
    decode(sv, c->ids + from, (size_t)(c->n_ids - from), &all);
    if (from == 0) decode(sv, c->ids, 1, &first);
    size_t skip = first.len <= all.len && (!first.len || !memcmp(all.data, first.data, first.len)) ? first.len : 0;
    c->text.len = c->searched = 0;
    buf_add(&c->text, all.data ? all.data + skip : "", all.len - skip);
    free(all.data);
    free(first.data);
  }
  free(cur.data);
  /* the next window: the ids this call added */
  c->win_from = c->win_to;
  c->win_to = c->n_ids;
  c->window.len = 0;
  decode(sv, c->ids + c->win_from, (size_t)(c->win_to - c->win_from), &c->window);
}

/* Adds the new ids' text, cuts it at the first stop string and releases
 * what can no longer become part of one. False: a stop string ended the
 * text. */
static bool advance(server *sv, choice *c, const creq *q, bool last) {
  if (c->n_ids > c->win_to) extend_text(sv, c);
  /* the first stop string: only where one may end in the new bytes */
  size_t cut = c->text.len;
  for (int i = 0; i < q->n_stop; i++) {
    size_t sl = strlen(q->stop[i]), from = c->searched >= sl ? c->searched - sl + 1 : 0;
    const char *hit = from < c->text.len ? memmem(c->text.data + from, c->text.len - from, q->stop[i], sl) : NULL;
    if (hit && (size_t)(hit - c->text.data) < cut) cut = (size_t)(hit - c->text.data);
  }
  c->searched = c->text.len;
  if (cut < c->text.len) {
    c->text.len = cut;
    release(c, cut);
    return false;
  }
  size_t safe = last ? c->text.len : utf8_complete_prefix(c->text.data, c->text.len);
  /* hold back a tail that is a prefix of a stop string */
  for (int i = 0; !last && i < q->n_stop; i++) {
    size_t sl = strlen(q->stop[i]);
    for (size_t k = sl > 1 ? sl - 1 : 0; k > 0; k--)
      if (k <= c->text.len && !memcmp(c->text.data + c->text.len - k, q->stop[i], k)) {
        if (c->text.len - k < safe) safe = c->text.len - k;
        break;
      }
  }
  release(c, safe);
  return true;
}

bool choice_event(server *sv, choice *c, const creq *q, const nb_serve_event *ev) {
  if (c->finish) return false;
  if (ev->finish == NB_SERVE_FINISHED_ABORT) { /* shutdown (or the engine failed): what came so far */
    advance(sv, c, q, true);
    c->finish = "length";
    return false;
  }
  c->n_tokens++;
  if (q->logprobs >= 0) {
    if (c->n_lp == c->cap_lp) {
      int64_t cap = c->cap_lp ? 2 * c->cap_lp : 16;
      nb_serve_sample_out *g = realloc(c->lp, (size_t)cap * sizeof *g);
      if (g) c->lp = g, c->cap_lp = cap;
    }
    if (c->n_lp < c->cap_lp) c->lp[c->n_lp++] = ev->s;
  }
  /* an end-of-sequence or stop token is not part of the text */
  if (ev->finish != NB_SERVE_FINISHED_STOP) {
    if (c->n_ids == c->cap_ids) {
      int32_t *g = realloc(c->ids, (size_t)(2 * c->cap_ids) * sizeof *g);
      if (g) c->ids = g, c->cap_ids *= 2;
    }
    if (c->n_ids < c->cap_ids) c->ids[c->n_ids++] = ev->s.token;
  }
  bool last = ev->finish != NB_SERVE_RUNNING;
  if (!advance(sv, c, q, last)) {
    c->finish = "stop";
    return !last;
  }
  if (last) c->finish = ev->finish == NB_SERVE_FINISHED_STOP ? "stop" : "length";
  return false;
}

/* ---------------------------------------------------------------- responses */

cJSON *usage_json(int64_t prompt, int64_t completion) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
  return u;
}

static cJSON *job_usage(const job *j) {
  int64_t prompt = 0, completion = 0;
  for (int32_t p = 0; p < j->q.num_prompts; p++) prompt += (int64_t)j->q.prompts[p].len;
  for (int32_t i = 0; i < j->q.num_prompts * j->q.n; i++) completion += j->ch[i].n_tokens;
  return usage_json(prompt, completion);
}

/* A token's text as a logprobs entry shows it (lossy UTF-8), and its bytes. */
static void token_text(server *sv, int32_t id, buf *raw, buf *text) {
  raw->len = text->len = 0;
  decode(sv, &id, 1, raw);
  buf_add(raw, "", 0);
  utf8_append_lossy(text, raw->data, raw->len);
  buf_add(text, "", 0);
}

static cJSON *bytes_json(const buf *raw) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; i < raw->len; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw->data[i]));
  return a;
}

/* Logprobs of entries [from, to) of a choice: chat's {content: [...]}, or
 * completions' {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *logprobs_json(job *j, choice *c, int64_t from, int64_t to) {
  server *sv = j->sv;
  buf raw = {0}, text = {0};
  cJSON *root = cJSON_CreateObject();
  if (j->q.chat) {
    cJSON *content = cJSON_AddArrayToObject(root, "content");
    for (int64_t i = from; i < to; i++) {
      const nb_serve_sample_out *s = &c->lp[i];
      cJSON *e = cJSON_CreateObject(), *tops;
      token_text(sv, s->token, &raw, &text);
      cJSON_AddStringToObject(e, "token", text.data);
      cJSON_AddNumberToObject(e, "logprob", s->logprob);
      cJSON_AddItemToObject(e, "bytes", bytes_json(&raw));
      tops = cJSON_AddArrayToObject(e, "top_logprobs");
      for (int32_t k = 0; k < s->num_top && k < j->q.logprobs; k++) {
        cJSON *t = cJSON_CreateObject();
        token_text(sv, s->top_ids[k], &raw, &text);
        cJSON_AddStringToObject(t, "token", text.data);
        cJSON_AddNumberToObject(t, "logprob", s->top_logprobs[k]);
        cJSON_AddItemToObject(t, "bytes", bytes_json(&raw));
        cJSON_AddItemToArray(tops, t);
      }
      cJSON_AddItemToArray(content, e);
    }
  } else {
    cJSON *tokens = cJSON_AddArrayToObject(root, "tokens"), *lps = cJSON_AddArrayToObject(root, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(root, "top_logprobs"), *offs = cJSON_AddArrayToObject(root, "text_offset");
    for (int64_t i = from; i < to; i++) {
      const nb_serve_sample_out *s = &c->lp[i];
      token_text(sv, s->token, &raw, &text);
      cJSON_AddItemToArray(tokens, cJSON_CreateString(text.data));
      cJSON_AddItemToArray(lps, cJSON_CreateNumber(s->logprob));
      cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)c->text_offset));
      c->text_offset += text.len;
      cJSON *t = cJSON_CreateObject();
      for (int32_t k = 0; k < s->num_top && k < j->q.logprobs; k++) {
        token_text(sv, s->top_ids[k], &raw, &text);
        if (!cJSON_GetObjectItemCaseSensitive(t, text.data)) cJSON_AddNumberToObject(t, text.data, s->top_logprobs[k]);
      }
      cJSON_AddItemToArray(tops, t);
    }
  }
  free(raw.data);
  free(text.data);
  return root;
}

static void add_base(job *j, cJSON *root, const char *object) {
  cJSON_AddStringToObject(root, "id", j->q.id);
  cJSON_AddStringToObject(root, "object", object);
  cJSON_AddNumberToObject(root, "created", (double)j->q.created);
  cJSON_AddStringToObject(root, "model", j->sv->opt.name);
}

cJSON *job_response(job *j) {
  const creq *q = &j->q;
  cJSON *root = cJSON_CreateObject(), *choices;
  add_base(j, root, q->chat ? "chat.completion" : "text_completion");
  choices = cJSON_AddArrayToObject(root, "choices");
  for (int32_t i = 0; i < q->num_prompts * q->n; i++) {
    choice *c = &j->ch[i];
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    buf text = {0};
    if (q->echo) buf_add(&text, q->echo_text[i / q->n].data, q->echo_text[i / q->n].len);
    buf_add(&text, c->out.data ? c->out.data : "", c->out.len);
    if (q->chat) {
      cJSON *msg = cJSON_AddObjectToObject(ch, "message");
      cJSON_AddStringToObject(msg, "role", "assistant");
      cJSON_AddStringToObject(msg, "content", text.data);
    } else {
      cJSON_AddStringToObject(ch, "text", text.data);
    }
    free(text.data);
    if (q->logprobs >= 0) cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c, 0, c->n_lp));
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "length");
    cJSON_AddItemToArray(choices, ch);
  }
  cJSON_AddItemToObject(root, "usage", job_usage(j));
  return root;
}

static void add_event(buf *out, cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!s) return;
  buf_str(out, "data: ");
  buf_str(out, s);
  buf_str(out, "\n\n");
  free(s);
}

/* One chunk for choice i: text (or a delta), its logprobs, finish_reason. */
static void add_chunk(job *j, buf *out, int32_t i, const char *text, size_t n, bool role, int64_t lp_from,
                      int64_t lp_to, const char *finish) {
  cJSON *root = cJSON_CreateObject(), *choices, *c = cJSON_CreateObject();
  add_base(j, root, j->q.chat ? "chat.completion.chunk" : "text_completion");
  choices = cJSON_AddArrayToObject(root, "choices");
  cJSON_AddNumberToObject(c, "index", i);
  char *t = strndup(text, n);
  if (j->q.chat) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (n || role) cJSON_AddStringToObject(d, "content", t ? t : "");
  } else {
    cJSON_AddStringToObject(c, "text", t ? t : "");
  }
  free(t);
  if (j->q.logprobs >= 0 && lp_to > lp_from) cJSON_AddItemToObject(c, "logprobs", logprobs_json(j, &j->ch[i], lp_from, lp_to));
  else cJSON_AddNullToObject(c, "logprobs");
  finish ? (void)cJSON_AddStringToObject(c, "finish_reason", finish) : (void)cJSON_AddNullToObject(c, "finish_reason");
  cJSON_AddItemToArray(choices, c);
  if (j->q.include_usage) cJSON_AddNullToObject(root, "usage");
  add_event(out, root);
}

void job_stream(job *j, buf *out, bool final) {
  const creq *q = &j->q;
  if (j->failed) {
    if (final) {
      add_event(out, error_json("server_error", NULL, NULL, j->failed));
      buf_str(out, "data: [DONE]\n\n");
    }
    return;
  }
  for (int32_t i = 0; i < q->num_prompts * q->n; i++) {
    choice *c = &j->ch[i];
    if (!c->started) {
      c->started = true;
      if (q->chat) add_chunk(j, out, i, "", 0, true, 0, 0, NULL);
      if (q->echo) add_chunk(j, out, i, q->echo_text[i / q->n].data, q->echo_text[i / q->n].len, false, 0, 0, NULL);
    }
    if (c->out.len > c->sent_text || c->n_lp > c->sent_lp) {
      add_chunk(j, out, i, c->out.data + c->sent_text, c->out.len - c->sent_text, false, c->sent_lp, c->n_lp, NULL);
      c->sent_text = c->out.len;
      c->sent_lp = c->n_lp;
    }
    if (c->finish && !c->finish_sent) {
      c->finish_sent = true;
      add_chunk(j, out, i, "", 0, false, 0, 0, c->finish);
    }
  }
  if (final) {
    if (q->include_usage) {
      cJSON *root = cJSON_CreateObject();
      add_base(j, root, q->chat ? "chat.completion.chunk" : "text_completion");
      cJSON_AddArrayToObject(root, "choices");
      cJSON_AddItemToObject(root, "usage", job_usage(j));
      add_event(out, root);
    }
    buf_str(out, "data: [DONE]\n\n");
  }
}
