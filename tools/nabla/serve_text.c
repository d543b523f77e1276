/* `nabla serve`'s text: byte buffers, UTF-8 checks and repair, prompt text
 * to ids and back, and request messages handed to the serve library's chat
 * templates (nb_serve_chat_render). */
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"

/* ---------------------------------------------------------------- buffers, UTF-8 */

bool buf_add(buf *b, const void *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return false;
    b->data = d, b->cap = cap;
  }
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return true;
}

bool buf_str(buf *b, const char *s) { return buf_add(b, s, strlen(s)); }

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

bool utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

/* How much of s[0..n) to release now: all but a trailing sequence that is
 * valid so far and may still complete with the next token's bytes. */
size_t utf8_complete_prefix(const char *s, size_t n) {
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
bool utf8_append_lossy(buf *out, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (!(k ? buf_add(out, s + i, k) : buf_add(out, "\xEF\xBF\xBD", 3))) return false;
    i += k ? k : 1;
  }
  return true;
}

/* ---------------------------------------------------------------- tokens */

/* Prompt text to ids: [bos] + the tokenizer's, or its bytes. */
bool encode(server *sv, const char *text, size_t n, bool add_bos, nb_tok_ids *ids) {
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

/* ids to raw bytes (appended), special tokens left out. Ids the tokenizer
 * lacks have no text and are left out, as nabla generate does: without a
 * tokenizer token i is byte i and ids past 255 have none; with one, a
 * model's vocabulary padded past the tokenizer's (Qwen2's, the tiny test
 * Llama's) has rows a model may still pick. */
bool decode(server *sv, const int32_t *ids, size_t n, buf *out) {
  if (!sv->m.tok) {
    for (size_t i = 0; i < n; i++) {
      char c = (char)ids[i];
      if (ids[i] >= 0 && ids[i] < 256 && !buf_add(out, &c, 1)) return false;
    }
    return true;
  }
  int32_t *known = malloc((n ? n : 1) * sizeof *known);
  if (!known) return false;
  size_t k = 0, len;
  for (size_t i = 0; i < n; i++)
    if (nb_tok_token_bytes(sv->m.tok, ids[i], &len)) known[k++] = ids[i];
  nb_tok_text t = {0};
  nb_tok_decode_opts o = {.skip_special = true};
  bool ok = !nb_tok_decode(sv->m.tok, known, k, &o, &t) && buf_add(out, t.data ? t.data : "", t.len);
  nb_tok_text_free(sv->m.tok, &t);
  free(known);
  return ok;
}

/* ---------------------------------------------------------------- chat */

/* Renders a request's messages with the server's chat format (the serve
 * library's templates), with the generation prompt when gen_prompt.
 * *add_bos: whether the caller prepends the BOS id. */
bool render_chat(server *sv, const cJSON *messages, bool gen_prompt, buf *out, bool *add_bos, bad *b) {
  if (sv->chat == NB_SERVE_CHAT_NONE) return fail(b, 400, "messages", "chat is off for this model: %s", sv->chat_why);
  if (!cJSON_IsArray(messages) || !cJSON_GetArraySize(messages))
    return fail(b, 400, "messages", "'messages' must be a non-empty array of {role, content} objects");
  int n = cJSON_GetArraySize(messages), i = 0;
  nb_serve_chat_msg *msgs = calloc((size_t)n, sizeof *msgs);
  buf *content = calloc((size_t)n, sizeof *content);
  bool ok = msgs && content ? true : fail(b, 500, "messages", "out of memory");
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    if (!ok) break;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
      ok = fail(b, 400, "messages", "messages[%d] must be an object with a string 'role'", i);
      break;
    }
    buf_add(&content[i], "", 0);
    if (cJSON_IsString(c)) {
      buf_str(&content[i], c->valuestring);
    } else if (cJSON_IsArray(c)) { /* [{type: text, text}] parts */
      const cJSON *part;
      cJSON_ArrayForEach(part, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type"), *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
          ok = fail(b, 400, "messages", "messages[%d].content: only text parts are supported", i);
          break;
        }
        buf_str(&content[i], tx->valuestring);
      }
    } else if (!absent(c)) {
      ok = fail(b, 400, "messages", "messages[%d].content must be a string or an array of text parts", i);
    }
    msgs[i] = (nb_serve_chat_msg){.role = role->valuestring, .content = content[i].data, .content_len = content[i].len};
    i++;
  }
  nb_serve_chat_text t = {0};
  if (ok && nb_serve_chat_render(sv->ctx, sv->chat, msgs, n, gen_prompt, &t))
    ok = fail(b, 400, "messages", "%s", nb_ctx_error(sv->ctx));
  if (ok) {
    ok = buf_add(out, t.text, t.len);
    *add_bos = t.add_bos;
  }
  nb_serve_chat_text_free(&t);
  for (int k = 0; content && k < n; k++) free(content[k].data);
  free(content);
  free(msgs);
  return ok;
}
