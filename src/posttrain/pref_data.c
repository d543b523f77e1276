/* Preference pairs from JSONL into pair-major arrays [P, 2, T] (chosen row,
 * rejected row), and the reshape the loss reads them through ([2B, T]:
 * chosen rows, then rejected). Host code: parsing, tokenizing, masking. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/posttrain.h"
#include "internal.h"

static const char *const fields[3] = {"prompt", "chosen", "rejected"};

/* field f of line j as a non-empty string, or an error naming file:line and the field */
static nb_status text_field(nb_ctx *ctx, const char *path, int64_t line, const cJSON *j, int f, const char **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, fields[f]);
  if (!v) return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: missing field '%s' (a pair needs prompt, chosen, rejected)", path,
                           (long long)line, fields[f]);
  if (cJSON_IsArray(v))
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field '%s' is a list of messages but '%s' is not: give all three as "
                     "strings or all as message lists", path, (long long)line, fields[f], fields[f ? 0 : 1]);
  if (!cJSON_IsString(v))
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field '%s' must be a string", path, (long long)line, fields[f]);
  if (!v->valuestring[0] && f)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field '%s' is empty", path, (long long)line, fields[f]);
  *out = v->valuestring;
  return NB_OK;
}

typedef struct rows_buf {
  int32_t *inputs, *targets;
  float *mask, *valid;
  int64_t n, cap, T;            /* rows */
} rows_buf;

static nb_status grow(nb_ctx *ctx, rows_buf *b) {
  if (b->n < b->cap) return NB_OK;
  int64_t cap = b->cap ? 2 * b->cap : 64, T = b->T;
  int32_t *in = realloc(b->inputs, (size_t)(cap * T) * sizeof *in);
  if (in) b->inputs = in;
  int32_t *tg = in ? realloc(b->targets, (size_t)(cap * T) * sizeof *tg) : NULL;
  if (tg) b->targets = tg;
  float *m = tg ? realloc(b->mask, (size_t)(cap * T) * sizeof *m) : NULL;
  if (m) b->mask = m;
  float *v = m ? realloc(b->valid, (size_t)(cap * T) * sizeof *v) : NULL;
  if (!v) return nb_errorf(ctx, NB_ERR_NOMEM, "pref data: out of memory");
  b->valid = v;
  b->cap = cap;
  return NB_OK;
}

/* One row: prompt ids p[np] then completion ids c[nc], cut to T+1 tokens. */
static nb_status add_row(nb_ctx *ctx, rows_buf *b, const int32_t *p, int64_t np, const int32_t *c, int64_t nc,
                         bool *cut) {
  nb_status s = grow(ctx, b);
  if (s) return s;
  int64_t T = b->T, n = np + nc;
  *cut = n > T + 1;
  if (*cut) n = T + 1;
  int64_t o = b->n++ * T;
  for (int64_t t = 0; t < T; t++) {
    bool has = t < n - 1;
    b->inputs[o + t] = has ? (t < np ? p[t] : c[t - np]) : 0;
    b->targets[o + t] = has ? (t + 1 < np ? p[t + 1] : c[t + 1 - np]) : 0;
    b->valid[o + t] = has ? 1.0f : 0.0f;
    b->mask[o + t] = has && t + 1 >= np ? 1.0f : 0.0f;
  }
  return NB_OK;
}

/* text[0..n) tokenized and appended to ids (the tokenizer's eos after it with eos) */
static nb_status encode_append(nb_ctx *ctx, const nb_data_tokenizer *tok, const char *text, size_t n, bool eos, nb_data_ids *ids) {
  nb_status s = n ? tok->encode(tok->ud, ctx, text, n, ids) : NB_OK;
  if (!s && eos && tok->eos_id >= 0) s = nb_data_ids_push(ids, &tok->eos_id, 1);
  return s;
}

static nb_status encode(nb_ctx *ctx, const nb_data_tokenizer *tok, const char *text, bool eos, nb_data_ids *ids) {
  ids->len = 0;
  return encode_append(ctx, tok, text, strlen(text), eos, ids);
}

/* ---------------------------------------------------------------- chat rows */

/* TRL's conversational preference rows: "chosen" / "rejected" lists of
 * assistant messages after a "prompt" list, or (implicit prompt) whole
 * conversations whose shared leading messages are the prompt. */

/* messages list v (a JSON array) into m[*n] (borrowing its strings); errors name field[i] */
static nb_status read_msgs(nb_ctx *ctx, const char *path, int64_t line, const char *field, const cJSON *v, nb_serve_chat_msg *m,
                           int *n) {
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsObject(e) || !cJSON_IsString(role))
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: %s[%d]: must be an object with a string 'role'", path, (long long)line, field, i);
    if (!cJSON_IsString(c))
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: %s[%d].content: must be a string", path, (long long)line, field, i);
    m[i++] = (nb_serve_chat_msg){.role = role->valuestring, .content = c->valuestring, .content_len = strlen(c->valuestring)};
  }
  *n = i;
  return NB_OK;
}

static bool same_msg(const nb_serve_chat_msg *a, const nb_serve_chat_msg *b) {
  return !strcmp(a->role, b->role) && a->content_len == b->content_len && !memcmp(a->content, b->content, a->content_len);
}

/* The ids of prompt (ids[0]) and of both completions (ids[1], ids[2]) of a
 * row given as messages: prompt + completion rendered with the chat
 * template, the prompt's part being the text before the completion's first
 * assistant turn (its header included: what a generation prompt renders),
 * the completion's the rest (its turns and end-of-turn markers), each
 * tokenized apart; BOS before the prompt when the template wants it. */
static nb_status chat_row(nb_ctx *ctx, const char *path, int64_t line, const cJSON *j, const nb_data_tokenizer *tok,
                          const nb_pt_pref_data_opts *o, nb_data_ids ids[3]) {
  if (o->chat == NB_SERVE_CHAT_NONE)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s:%lld: messages need a chat template (pref.chat_template)", path, (long long)line);
  const cJSON *v[3];
  int cap = 0;
  for (int f = 0; f < 3; f++) {
    v[f] = cJSON_GetObjectItemCaseSensitive(j, fields[f]);
    if (f && !v[f]) return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: missing field '%s'", path, (long long)line, fields[f]);
    if (v[f] && !cJSON_IsArray(v[f]))
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field '%s' is not a list of messages but '%s' is: give all three as "
                       "strings or all as message lists", path, (long long)line, fields[f], cJSON_IsArray(v[1]) ? "chosen" : "prompt");
    cap += v[f] ? cJSON_GetArraySize(v[f]) : 0;
  }
  nb_serve_chat_msg *m = calloc((size_t)cap + 1, sizeof *m), *side[2];
  if (!m) return nb_errorf(ctx, NB_ERR_NOMEM, "pref data: out of memory");
  int np = 0, nc[2] = {0, 0};
  nb_status s = v[0] ? read_msgs(ctx, path, line, "prompt", v[0], m, &np) : NB_OK;
  side[0] = m + np;
  if (!s) s = read_msgs(ctx, path, line, "chosen", v[1], side[0], &nc[0]);
  side[1] = side[0] + nc[0];
  if (!s) s = read_msgs(ctx, path, line, "rejected", v[2], side[1], &nc[1]);
  int skip = 0; /* implicit prompt: the leading messages both sides share */
  if (!s && !v[0]) {
    while (skip < nc[0] && skip < nc[1] && same_msg(&side[0][skip], &side[1][skip])) skip++;
    if (!skip) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: missing field 'prompt' (and chosen and rejected share no leading "
                             "message to be the prompt)", path, (long long)line);
  }
  for (int k = 0; !s && k < 2; k++) {
    if (nc[k] <= skip) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field '%s' has no message after the prompt", path, (long long)line, fields[1 + k]);
      break;
    }
    for (int i = skip; !s && i < nc[k]; i++)
      if (strcmp(side[k][i].role, "assistant"))
        s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: %s[%d].role '%s': a completion holds assistant messages only", path,
                      (long long)line, fields[1 + k], i, side[k][i].role);
  }
  /* the prompt's messages, then the side's completion: one conversation to render */
  nb_serve_chat_msg *conv = s ? NULL : calloc((size_t)cap + 1, sizeof *conv);
  if (!s && !conv) s = nb_errorf(ctx, NB_ERR_NOMEM, "pref data: out of memory");
  char *prompt_text = NULL;
  for (int k = 0; !s && k < 2; k++) {
    int n = 0, n_prompt_asst = 0;
    const nb_serve_chat_msg *pm = v[0] ? m : side[k];
    int npm = v[0] ? np : skip;
    for (int i = 0; i < npm; i++) conv[n++] = pm[i], n_prompt_asst += !strcmp(pm[i].role, "assistant");
    for (int i = skip; i < nc[k]; i++) conv[n++] = side[k][i];
    nb_serve_chat_text t = {0};
    if (nb_serve_chat_render(ctx, o->chat, conv, n, false, &t)) {
      char why[1024];
      snprintf(why, sizeof why, "%s", nb_ctx_error(ctx));
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: %s (prompt + %s): %s", path, (long long)line, fields[1 + k], fields[1 + k], why);
      break;
    }
    size_t cut = t.assistant[n_prompt_asst].start;
    if (!k) {
      prompt_text = strndup(t.text, cut);
      if (!prompt_text) s = nb_errorf(ctx, NB_ERR_NOMEM, "pref data: out of memory");
      if (!s && t.add_bos && o->bos_id >= 0) s = nb_data_ids_push(&ids[0], &o->bos_id, 1);
      if (!s) s = encode_append(ctx, tok, prompt_text, strlen(prompt_text), false, &ids[0]);
    } else if (strlen(prompt_text) != cut || memcmp(prompt_text, t.text, cut)) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: the prompt renders differently before 'chosen' and 'rejected'", path,
                    (long long)line);
    }
    if (!s) s = encode_append(ctx, tok, t.text + cut, t.len - cut, true, &ids[1 + k]);
    if (s && s != NB_ERR_FORMAT && s != NB_ERR_NOMEM)
      s = nb_errorf(ctx, s, "%s:%lld: field '%s': tokenizing: %s", path, (long long)line, fields[k ? 2 : 1], nb_ctx_error(ctx));
    nb_serve_chat_text_free(&t);
  }
  free(prompt_text);
  free(conv);
  free(m);
  return s;
}

static nb_tree *finish(nb_ctx *ctx, rows_buf *b) {
  int64_t P = b->n / 2, d[3] = {P, 2, b->T};
  nb_tree *t = nb_tree_create(ctx);
  nb_array *a[4] = {nb_array_create(ctx, NB_I32, 3, d, b->inputs), nb_array_create(ctx, NB_I32, 3, d, b->targets),
                    nb_array_create(ctx, NB_F32, 3, d, b->mask), nb_array_create(ctx, NB_F32, 3, d, b->valid)};
  const char *names[4] = {"inputs", "targets", "mask", "valid"};
  nb_status s = t ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; i < 4; i++) {
    if (!s) s = a[i] ? nb_tree_set_array(t, names[i], a[i]) : nb_ctx_status(ctx);
    nb_array_release(a[i]);
  }
  if (s) nb_tree_destroy(t);
  return s ? NULL : t;
}

nb_tree *nb_pt_pref_data_load(nb_ctx *ctx, const char *path, const nb_data_tokenizer *tok, int64_t seq_len,
                              int64_t vocab_size, nb_pt_pref_data_info *info) {
  return nb_pt_pref_data_load_opts(ctx, path, tok, seq_len, vocab_size, NULL, info);
}

/* a row in message form: any of its three fields a list */
static bool is_chat_row(const cJSON *j) {
  for (int f = 0; f < 3; f++)
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, fields[f]))) return true;
  return false;
}

typedef struct pref_reader {
  const char *path;
  const nb_data_tokenizer *tok;
  const nb_pt_pref_data_opts *o;
  int64_t seq_len, vocab_size;
  rows_buf *b;
  nb_data_ids *ids; /* [3]: prompt, chosen, rejected */
  nb_pt_pref_data_info *inf;
} pref_reader;

static nb_status pref_line(void *ud, nb_ctx *ctx, int64_t ln, const char *line, size_t len) {
  pref_reader *r = ud;
  const char *path = r->path;
  nb_data_ids *ids = r->ids;
  int64_t seq_len = r->seq_len, vocab_size = r->vocab_size;
  nb_status s = NB_OK;
  cJSON *j = cJSON_ParseWithLength(line, len);
  if (!cJSON_IsObject(j)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: not a JSON object", path, (long long)ln);
  const char *txt[3] = {0};
  bool chat = !s && is_chat_row(j);
  if (chat) {
    for (int fi = 0; fi < 3; fi++) ids[fi].len = 0;
    s = chat_row(ctx, path, ln, j, r->tok, r->o, ids);
  }
  for (int fi = 0; !s && !chat && fi < 3; fi++) s = text_field(ctx, path, ln, j, fi, &txt[fi]);
  for (int fi = 0; !s && !chat && fi < 3; fi++)
    if ((s = encode(ctx, r->tok, txt[fi], fi > 0, &ids[fi])))
      s = nb_errorf(ctx, s, "%s:%lld: field '%s': tokenizing: %s", path, (long long)ln, fields[fi], nb_ctx_error(ctx));
  for (int fi = 0; !s && fi < 3; fi++)
    for (size_t i = 0; !s && i < ids[fi].len; i++)
      if (vocab_size > 0 && ids[fi].ids[i] >= vocab_size)
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s:%lld: field '%s': token id %d is not below the model's vocab_size %lld",
                      path, (long long)ln, fields[fi], ids[fi].ids[i], (long long)vocab_size);
  if (!s && (int64_t)ids[0].len >= seq_len)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s:%lld: field 'prompt' is %zu tokens: seq_len %lld leaves no room for the "
                  "completion (raise data.seq_len or shorten the prompt)", path, (long long)ln, ids[0].len,
                  (long long)seq_len);
  if (!s && ids[0].len == 0)
    s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: field 'prompt' has no tokens: the first completion token needs one "
                  "before it", path, (long long)ln);
  for (int k = 1; !s && k < 3; k++) {
    bool cut = false;
    s = add_row(ctx, r->b, ids[0].ids, (int64_t)ids[0].len, ids[k].ids, (int64_t)ids[k].len, &cut);
    r->inf->n_truncated += cut;
    r->inf->tokens += (int64_t)(ids[0].len + ids[k].len);
  }
  cJSON_Delete(j);
  return s;
}

nb_tree *nb_pt_pref_data_load_opts(nb_ctx *ctx, const char *path, const nb_data_tokenizer *tok, int64_t seq_len,
                                   int64_t vocab_size, const nb_pt_pref_data_opts *opts, nb_pt_pref_data_info *info) {
  const nb_pt_pref_data_opts none = {.chat = NB_SERVE_CHAT_NONE, .bos_id = -1}, *o = opts ? opts : &none;
  if (!path || !tok || !tok->encode || seq_len < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref data: need a path, a tokenizer and seq_len >= 1"), NULL;
  nb_pt_pref_data_info inf = {0};
  rows_buf b = {.T = seq_len};
  nb_data_ids ids[3] = {{.ctx = ctx}, {.ctx = ctx}, {.ctx = ctx}};
  pref_reader r = {.path = path, .tok = tok, .o = o, .seq_len = seq_len, .vocab_size = vocab_size, .b = &b, .ids = ids,
                   .inf = &inf};
  nb_status s = nb_pt__jsonl_each(ctx, "pref data", path, pref_line, &r, &inf.xxh3);
  for (int i = 0; i < 3; i++) nb_data_ids_free(&ids[i]);
  if (!s && b.n == 0) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: no preference pairs", path);
  nb_tree *t = s ? NULL : finish(ctx, &b);
  free(b.inputs);
  free(b.targets);
  free(b.mask);
  free(b.valid);
  inf.pairs = b.n / 2;
  if (info) *info = inf;
  return t;
}

nb_val *nb_pt_pref_rows(nb_val *x) {
  if (!x) return NULL;
  nb_aval a = nb_val_aval(x);
  if (a.shape.rank < 2 || a.shape.dims[1] != 2) {
    char s[96];
    nb_errorf(nb_graph_ctx(nb_val_graph(x)), NB_ERR_SHAPE, "pref rows: need [B, 2, ...] (pairs), got %s",
              nb_aval_str(&a, s, sizeof s));
    return NULL;
  }
  int perm[NB_MAX_RANK], r = a.shape.rank;
  int64_t dims[NB_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[0] = 1;
  perm[1] = 0;
  dims[0] = 2 * a.shape.dims[0];
  for (int i = 2; i < r; i++) dims[i - 1] = a.shape.dims[i];
  return nb_reshape(nb_transpose(x, perm), r - 1, dims);
}
