/* SFT data: JSONL examples (chat messages or prompt/completion) to token ids
 * with a mask of the tokens trained on, and the map dataset of next-token
 * pairs that packing turns into batches. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nabla/posttrain.h"
#include "nabla/tokenizer.h"

/* ---------------------------------------------------------------- one example */

typedef struct builder {
  nb_ctx *ctx;
  const nb_pt_sft_data_opts *o;
  int32_t *ids;
  uint8_t *train;
  int64_t len, cap;
} builder;

static nb_status push(builder *b, int32_t id, bool train) {
  if (b->len == b->cap) {
    int64_t cap = b->cap ? 2 * b->cap : 256;
    int32_t *ids = realloc(b->ids, (size_t)cap * sizeof *ids);
    if (ids) b->ids = ids;
    uint8_t *tr = ids ? realloc(b->train, (size_t)cap) : NULL;
    if (!tr) return nb_errorf(b->ctx, NB_ERR_NOMEM, "sft data: out of memory");
    b->train = tr, b->cap = cap;
  }
  b->ids[b->len] = id, b->train[b->len] = train;
  b->len++;
  return NB_OK;
}

/* text[0..n) tokenized on its own, appended with the given train flag */
static nb_status push_text(builder *b, const char *text, size_t n, bool train) {
  if (!n) return NB_OK;
  if (!b->o->tok) {
    nb_status s = NB_OK;
    for (size_t i = 0; i < n && !s; i++) s = push(b, (unsigned char)text[i], train);
    return s;
  }
  nb_tok_ids enc = {0};
  nb_status s = nb_tok_encode(b->o->tok, text, n, NULL, &enc);
  for (size_t i = 0; !s && i < enc.len; i++) s = push(b, enc.ids[i], train);
  nb_tok_ids_free(b->o->tok, &enc);
  return s;
}

/* "path:line: <what>" */
__attribute__((format(printf, 5, 6))) static nb_status line_err(nb_ctx *ctx, nb_status s, const char *path, int64_t line,
                                                                const char *fmt, ...) {
  char what[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return nb_errorf(ctx, s, "%s:%lld: %s", path, (long long)line, what);
}
#define LINE_ERR(s, ...) line_err(ctx, s, path, line, __VA_ARGS__)

static nb_status from_messages(nb_ctx *ctx, const char *path, int64_t line, builder *b, const cJSON *msgs) {
  const nb_pt_sft_data_opts *o = b->o;
  if (o->chat == NB_SERVE_CHAT_NONE)
    return LINE_ERR(NB_ERR_INVALID_ARG, "messages: no chat template is set for messages (sft.chat_template)");
  int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
  if (n < 1) return LINE_ERR(NB_ERR_INVALID_ARG, "messages: must be a non-empty array of {role, content} objects");
  nb_serve_chat_msg *m = calloc((size_t)n, sizeof *m);
  if (!m) return nb_errorf(ctx, NB_ERR_NOMEM, "sft data: out of memory");
  nb_status s = NB_OK;
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, msgs) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsObject(e) || !cJSON_IsString(role)) {
      s = LINE_ERR(NB_ERR_INVALID_ARG, "messages[%d]: must be an object with a string 'role'", i);
      break;
    }
    if (!cJSON_IsString(c)) {
      s = LINE_ERR(NB_ERR_INVALID_ARG, "messages[%d].content: must be a string", i);
      break;
    }
    m[i] = (nb_serve_chat_msg){.role = role->valuestring, .content = c->valuestring, .content_len = strlen(c->valuestring)};
    i++;
  }
  nb_serve_chat_text t = {0};
  if (!s && nb_serve_chat_render(ctx, o->chat, m, n, false, &t)) s = LINE_ERR(NB_ERR_INVALID_ARG, "%s", nb_ctx_error(ctx));
  if (!s && !t.n_assistant) s = LINE_ERR(NB_ERR_INVALID_ARG, "messages: no assistant message (nothing to train on)");
  if (!s && t.add_bos && o->bos_id >= 0) s = push(b, o->bos_id, false);
  size_t at = 0;
  for (int k = 0; !s && k < t.n_assistant; k++) {
    s = push_text(b, t.text + at, t.assistant[k].start - at, false);
    if (!s) s = push_text(b, t.text + t.assistant[k].start, t.assistant[k].end - t.assistant[k].start, true);
    at = t.assistant[k].end;
  }
  if (!s) s = push_text(b, t.text + at, t.len - at, false);
  nb_serve_chat_text_free(&t);
  free(m);
  return s;
}

static nb_status from_prompt(nb_ctx *ctx, const char *path, int64_t line, builder *b, const cJSON *p, const cJSON *c) {
  if (!cJSON_IsString(p)) return LINE_ERR(NB_ERR_INVALID_ARG, "prompt: must be a string");
  if (!cJSON_IsString(c)) return LINE_ERR(NB_ERR_INVALID_ARG, "completion: must be a string");
  if (!*c->valuestring) return LINE_ERR(NB_ERR_INVALID_ARG, "completion: empty (nothing to train on)");
  nb_status s = b->o->bos_id >= 0 ? push(b, b->o->bos_id, false) : NB_OK;
  if (!s) s = push_text(b, p->valuestring, strlen(p->valuestring), false);
  if (!s) s = push_text(b, c->valuestring, strlen(c->valuestring), true);
  if (!s && b->o->eos_id >= 0) s = push(b, b->o->eos_id, true);
  return s;
}

static nb_status parse_line(nb_ctx *ctx, const char *path, int64_t line, const char *text, size_t n, builder *b) {
  cJSON *j = cJSON_ParseWithLength(text, n);
  if (!j || !cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return LINE_ERR(NB_ERR_FORMAT, "not a JSON object");
  }
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages"), *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"),
              *c = cJSON_GetObjectItemCaseSensitive(j, "completion");
  nb_status s;
  if (msgs && (p || c)) s = LINE_ERR(NB_ERR_INVALID_ARG, "messages: given with prompt/completion (one or the other)");
  else if (msgs) s = from_messages(ctx, path, line, b, msgs);
  else if (p || c) s = from_prompt(ctx, path, line, b, p, c);
  else s = LINE_ERR(NB_ERR_INVALID_ARG, "neither 'messages' nor 'prompt'/'completion'");
  cJSON_Delete(j);
  if (!s && b->o->max_len > 0 && b->len > b->o->max_len) b->len = b->o->max_len;
  if (!s && b->len < 2) s = LINE_ERR(NB_ERR_INVALID_ARG, "%lld token(s): an example needs at least 2", (long long)b->len);
  return s;
}

/* ---------------------------------------------------------------- the file */

void nb_pt_sft_data_free(nb_pt_sft_data *d) {
  if (!d) return;
  for (int64_t i = 0; i < d->n; i++) free(d->ex[i].ids), free(d->ex[i].train);
  free(d->ex);
  *d = (nb_pt_sft_data){0};
}

static nb_status add_example(nb_ctx *ctx, nb_pt_sft_data *d, int64_t *cap, builder *b) {
  if (d->n == *cap) {
    int64_t c = *cap ? 2 * *cap : 64;
    nb_pt_sft_example *ex = realloc(d->ex, (size_t)c * sizeof *ex);
    if (!ex) return nb_errorf(ctx, NB_ERR_NOMEM, "sft data: out of memory");
    d->ex = ex, *cap = c;
  }
  nb_pt_sft_example *e = &d->ex[d->n++];
  *e = (nb_pt_sft_example){.ids = b->ids, .train = b->train, .len = b->len};
  d->tokens += b->len;
  for (int64_t i = 0; i < b->len; i++) d->train_tokens += b->train[i];
  b->ids = NULL, b->train = NULL, b->len = b->cap = 0;
  return NB_OK;
}

typedef struct sft_reader {
  const char *path;
  nb_pt_sft_data *out;
  int64_t cap;
  builder b;
} sft_reader;

static nb_status sft_line(void *ud, nb_ctx *ctx, int64_t line, const char *text, size_t len) {
  sft_reader *r = ud;
  r->b.len = 0;
  nb_status s = parse_line(ctx, r->path, line, text, len, &r->b);
  return s ? s : add_example(ctx, r->out, &r->cap, &r->b);
}

nb_status nb_pt_sft_load(nb_ctx *ctx, const char *path, const nb_pt_sft_data_opts *opts, nb_pt_sft_data *out) {
  *out = (nb_pt_sft_data){0};
  if (!path || !opts) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft data: NULL path or options");
  sft_reader r = {.path = path, .out = out, .b = {.ctx = ctx, .o = opts}};
  nb_status s = nb_pt__jsonl_each(ctx, "sft data", path, sft_line, &r, NULL);
  if (!s && !out->n) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft data: '%s' holds no example", path);
  free(r.b.ids), free(r.b.train);
  if (s) nb_pt_sft_data_free(out);
  return s;
}

/* ---------------------------------------------------------------- the dataset */

static nb_status put(nb_ctx *ctx, nb_tree *t, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(t, path, a) : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status get_example(void *ud, nb_ctx *ctx, int64_t index, nb_data_elem *out) {
  const nb_pt_sft_data *d = ud;
  const nb_pt_sft_example *e = &d->ex[index % d->n];
  int64_t m = e->len - 1;
  nb_array *mask = nb_array_empty(ctx, NB_F32, 1, &m);
  if (!mask) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  float *mk = nb_array_data_mut(mask);
  for (int64_t i = 0; i < m; i++) mk[i] = e->train[i + 1];
  nb_tree *t = nb_tree_create(ctx);
  nb_status s = t ? put(ctx, t, "inputs", nb_array_create(ctx, NB_I32, 1, &m, e->ids)) : NB_ERR_NOMEM;
  if (!s) s = put(ctx, t, "targets", nb_array_create(ctx, NB_I32, 1, &m, e->ids + 1));
  if (!s) s = put(ctx, t, "mask", mask);
  else nb_array_release(mask);
  if (s) return nb_tree_destroy(t), s;
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

nb_data_map *nb_pt_sft_map(nb_ctx *ctx, const nb_pt_sft_data *d) {
  if (!d || d->n < 1) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft data: no examples"), NULL;
  return nb_data_map_source(ctx, d->n, get_example, (void *)d);
}
