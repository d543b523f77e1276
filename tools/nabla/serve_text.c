/* `nabla serve`'s text: byte buffers, UTF-8 checks and repair, prompt text
 * to ids and back, and the chat templates (rendered as the models' own
 * Jinja templates render them). */
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

/* ---------------------------------------------------------------- chat templates */

/* Llama-2's and Mistral's both use [INST]; only Llama-2's has <<SYS>>, so
 * it is looked for first. A format's end-of-turn text ends generation, as a
 * token when the tokenizer has it and as a stop string. */
const chat_format chat_formats[CHAT_COUNT] = {
    [CHAT_CHATML] = {"chatml", "<|im_start|>", "<|im_end|>"},
    [CHAT_LLAMA3] = {"llama-3", "<|start_header_id|>", "<|eot_id|>"},
    [CHAT_GEMMA] = {"gemma", "<start_of_turn>", "<end_of_turn>"},
    [CHAT_LLAMA2] = {"llama-2", "<<SYS>>", NULL},
    [CHAT_MISTRAL] = {"mistral", "[INST]", NULL},
};
const char chat_known[] = "chatml, llama-3, gemma, llama-2, mistral";

const char *chat_template_name(chat_template t) { return t == CHAT_NONE ? "none" : chat_formats[t].name; }

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
bool render_chat(server *sv, const cJSON *messages, bool gen_prompt, buf *out, bool *add_bos, bad *b) {
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

