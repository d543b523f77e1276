/* Chat templates: conversations rendered as the models' own Jinja templates
 * render them, with the spans of the assistant's turns (what SFT trains
 * on). One copy, for `nabla serve` and `nabla sft`. */
#include <stdlib.h>
#include <string.h>

#include "nabla/serve.h"

/* Llama-2's and Mistral's both use [INST]; only Llama-2's has <<SYS>>, so
 * it is looked for first. A format's end-of-turn text ends generation. */
static const struct {
  const char *name, *marker, *end;
} formats[NB_SERVE_CHAT_COUNT] = {
    [NB_SERVE_CHAT_CHATML] = {"chatml", "<|im_start|>", "<|im_end|>"},
    [NB_SERVE_CHAT_LLAMA3] = {"llama-3", "<|start_header_id|>", "<|eot_id|>"},
    [NB_SERVE_CHAT_GEMMA] = {"gemma", "<start_of_turn>", "<end_of_turn>"},
    [NB_SERVE_CHAT_LLAMA2] = {"llama-2", "<<SYS>>", NULL},
    [NB_SERVE_CHAT_MISTRAL] = {"mistral", "[INST]", NULL},
};

static bool valid(nb_serve_chat_format f) { return f >= 0 && f < NB_SERVE_CHAT_COUNT; }

const char *nb_serve_chat_format_name(nb_serve_chat_format f) { return valid(f) ? formats[f].name : "none"; }

nb_serve_chat_format nb_serve_chat_format_parse(const char *name) {
  for (int k = 0; name && k < NB_SERVE_CHAT_COUNT; k++)
    if (!strcmp(name, formats[k].name)) return (nb_serve_chat_format)k;
  return NB_SERVE_CHAT_NONE;
}

const char *nb_serve_chat_known(void) { return "chatml, llama-3, gemma, llama-2, mistral"; }

nb_serve_chat_format nb_serve_chat_detect(const char *jinja) {
  for (int k = 0; jinja && k < NB_SERVE_CHAT_COUNT; k++)
    if (strstr(jinja, formats[k].marker)) return (nb_serve_chat_format)k;
  return NB_SERVE_CHAT_NONE;
}

const char *nb_serve_chat_end(nb_serve_chat_format f) { return valid(f) ? formats[f].end : NULL; }

/* ---------------------------------------------------------------- rendering */

typedef struct text {
  char *d;
  size_t len, cap;
  bool oom;
} text;

static void add(text *t, const char *s, size_t n) {
  if (t->oom) return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n + 1) cap *= 2;
    char *d = realloc(t->d, cap);
    if (!d) {
      t->oom = true;
      return;
    }
    t->d = d, t->cap = cap;
  }
  if (n) memcpy(t->d + t->len, s, n);
  t->len += n;
  t->d[t->len] = 0;
}

static void add_str(text *t, const char *s) { add(t, s, strlen(s)); }

/* s without leading and trailing whitespace (the Llama and Gemma templates'
 * `| trim`) */
static void add_trimmed(text *t, const char *s, size_t n) {
  while (n && strchr(" \t\n\r", s[0])) s++, n--;
  while (n && strchr(" \t\n\r", s[n - 1])) n--;
  add(t, s, n);
}

void nb_serve_chat_text_free(nb_serve_chat_text *t) {
  if (!t) return;
  free(t->text);
  free(t->assistant);
  *t = (nb_serve_chat_text){0};
}

nb_status nb_serve_chat_render(nb_ctx *ctx, nb_serve_chat_format f, const nb_serve_chat_msg *msgs, int n, bool gen_prompt,
                               nb_serve_chat_text *out) {
  *out = (nb_serve_chat_text){0};
  if (!valid(f)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "chat template: format %d unknown", (int)f);
  if (n < 1 || !msgs) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "messages: empty (a conversation needs at least one message)");
  out->assistant = calloc((size_t)n, sizeof *out->assistant);
  if (!out->assistant) return nb_errorf(ctx, NB_ERR_NOMEM, "chat template: out of memory");
  text o = {0}, system = {0}, turn = {0};
  bool have_system = false;
  nb_status s = NB_OK;
  out->add_bos = f == NB_SERVE_CHAT_CHATML;
  if (f == NB_SERVE_CHAT_LLAMA3) add_str(&o, "<|begin_of_text|>");
  if (f == NB_SERVE_CHAT_GEMMA) add_str(&o, "<bos>");
  if (f == NB_SERVE_CHAT_MISTRAL) add_str(&o, "<s>");
  for (int i = 0; i < n && !s; i++) {
    const char *r = msgs[i].role, *c = msgs[i].content ? msgs[i].content : "";
    size_t cn = msgs[i].content ? msgs[i].content_len : 0;
    if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "messages[%d].role '%s' is not system, user or assistant", i, r ? r : "(null)");
      break;
    }
    bool sys = !strcmp(r, "system"), user = !strcmp(r, "user"), asst = !sys && !user;
    size_t start = 0;
    switch (f) {
    case NB_SERVE_CHAT_CHATML:
      add_str(&o, "<|im_start|>"), add_str(&o, r), add_str(&o, "\n");
      start = o.len;
      add(&o, c, cn), add_str(&o, "<|im_end|>");
      if (asst) out->assistant[out->n_assistant++] = (nb_serve_chat_span){start, o.len};
      add_str(&o, "\n");
      break;
    case NB_SERVE_CHAT_LLAMA3:
      add_str(&o, "<|start_header_id|>"), add_str(&o, r), add_str(&o, "<|end_header_id|>\n\n");
      start = o.len;
      add_trimmed(&o, c, cn), add_str(&o, "<|eot_id|>");
      if (asst) out->assistant[out->n_assistant++] = (nb_serve_chat_span){start, o.len};
      break;
    case NB_SERVE_CHAT_GEMMA:
      if (sys) {
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "messages[%d]: the gemma template has no system role", i);
        break;
      }
      add_str(&o, "<start_of_turn>"), add_str(&o, user ? "user" : "model"), add_str(&o, "\n");
      start = o.len;
      add_trimmed(&o, c, cn), add_str(&o, "<end_of_turn>");
      if (asst) out->assistant[out->n_assistant++] = (nb_serve_chat_span){start, o.len};
      add_str(&o, "\n");
      break;
    case NB_SERVE_CHAT_LLAMA2: /* the system prompt goes inside the first user turn */
    case NB_SERVE_CHAT_MISTRAL:
      if (sys) {
        if (i) {
          s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "messages[%d]: the %s template takes a system message only first", i,
                        formats[f].name);
          break;
        }
        have_system = true;
        add(&system, c, cn);
        break;
      }
      if (user) {
        add_str(&o, f == NB_SERVE_CHAT_LLAMA2 ? "<s>[INST] " : "[INST] ");
        turn.len = 0;
        add(&turn, "", 0);
        if (have_system) {
          if (f == NB_SERVE_CHAT_LLAMA2) add_str(&turn, "<<SYS>>\n"), add(&turn, system.d, system.len), add_str(&turn, "\n<</SYS>>\n\n");
          else add(&turn, system.d, system.len), add_str(&turn, "\n\n");
          have_system = false;
        }
        add(&turn, c, cn);
        if (!turn.oom) f == NB_SERVE_CHAT_LLAMA2 ? add_trimmed(&o, turn.d, turn.len) : add(&o, turn.d, turn.len);
        o.oom |= turn.oom;
        add_str(&o, " [/INST]");
      } else if (f == NB_SERVE_CHAT_LLAMA2) {
        add_str(&o, " ");
        start = o.len;
        add_trimmed(&o, c, cn), add_str(&o, " </s>");
        out->assistant[out->n_assistant++] = (nb_serve_chat_span){start, o.len};
      } else {
        start = o.len;
        add(&o, c, cn), add_str(&o, "</s>");
        out->assistant[out->n_assistant++] = (nb_serve_chat_span){start, o.len};
      }
      break;
    default:
      break;
    }
  }
  if (!s && gen_prompt) {
    if (f == NB_SERVE_CHAT_CHATML) add_str(&o, "<|im_start|>assistant\n");
    if (f == NB_SERVE_CHAT_LLAMA3) add_str(&o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (f == NB_SERVE_CHAT_GEMMA) add_str(&o, "<start_of_turn>model\n");
  }
  add(&o, "", 0);
  if (!s && (o.oom || system.oom)) s = nb_errorf(ctx, NB_ERR_NOMEM, "chat template: out of memory");
  free(system.d);
  free(turn.d);
  if (s) {
    free(o.d);
    nb_serve_chat_text_free(out);
    return s;
  }
  out->text = o.d, out->len = o.len;
  return NB_OK;
}
