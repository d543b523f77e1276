/* Writing a byte-level tokenizer as a Hugging Face tokenizer.json: BPE model
 * (vocab in the GPT-2 byte alphabet, merges as "a b" strings, which every
 * version of `tokenizers` reads), Split(regex, Isolated) + ByteLevel(no
 * regex) pre-tokenizer, ByteLevel decoder, special tokens as added_tokens.
 * Written to PATH.tmp, then renamed. Not here: reading (load_hf.c). */
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer/tok_internal.h"

typedef struct out {
  FILE *f;
  char *buf; /* mapped-bytes scratch */
  size_t cap;
  nb_ctx *ctx;
  bool oom;
} out;

/* A JSON string of UTF-8 text s[0..n). */
static void put_json(out *o, const char *s, size_t n) {
  fputc('"', o->f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') fprintf(o->f, "\\%c", c);
    else if (c == '\n') fputs("\\n", o->f);
    else if (c == '\t') fputs("\\t", o->f);
    else if (c == '\r') fputs("\\r", o->f);
    else if (c < 0x20 || c == 0x7F) fprintf(o->f, "\\u%04x", c);
    else fputc(c, o->f);
  }
  fputc('"', o->f);
}

/* A token's bytes mapped into the byte alphabet, as a JSON string. */
static void put_mapped(out *o, const uint8_t *b, size_t n) {
  if (nb_tok__grow(o->ctx, (void **)&o->buf, &o->cap, 2 * n + 1, 1)) {
    o->oom = true;
    return;
  }
  size_t m = nb_tok__map_bytes(b, n, o->buf);
  put_json(o, o->buf, m);
}

static int cmp_rank(const void *a, const void *b) {
  const nb_tok__merge *x = *(const nb_tok__merge *const *)a, *y = *(const nb_tok__merge *const *)b;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static void put_added(out *o, const nb_tok *t) {
  fputs("  \"added_tokens\": [", o->f);
  for (int32_t i = 0; i < t->n_added; i++) {
    int32_t id = t->added[i];
    const nb_tok__token *tk = &t->tokens[id];
    fprintf(o->f, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", id);
    put_json(o, (const char *)t->blob + tk->off, tk->len);
    fprintf(o->f, ", \"single_word\": false, \"lstrip\": %s, \"rstrip\": %s, \"normalized\": false, \"special\": %s}",
            tk->flags & NB_TOK__F_LSTRIP ? "true" : "false", tk->flags & NB_TOK__F_RSTRIP ? "true" : "false",
            tk->flags & NB_TOK__F_SPECIAL ? "true" : "false");
  }
  fputs(t->n_added ? "\n  ],\n" : "],\n", o->f);
}

static void put_pipeline(out *o, const nb_tok *t) {
  fputs("  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [", o->f);
  if (t->pattern) {
    fputs("{\"type\": \"Split\", \"pattern\": {\"Regex\": ", o->f);
    put_json(o, t->pattern, strlen(t->pattern));
    fputs("}, \"behavior\": \"Isolated\", \"invert\": false}, ", o->f);
  }
  fprintf(o->f, "{\"type\": \"ByteLevel\", \"add_prefix_space\": %s, \"trim_offsets\": true, \"use_regex\": false}]},\n",
          t->add_prefix_space ? "true" : "false");
  fputs("  \"post_processor\": null,\n", o->f);
  fputs("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n",
        o->f);
}

static nb_status put_model(out *o, const nb_tok *t) {
  fputs("  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
        "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
        "    \"vocab\": {",
        o->f);
  bool first = true;
  for (int32_t id = 0; id < t->n_tokens; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    if (!(tk->flags & NB_TOK__F_PRESENT)) continue;
    fputs(first ? "\n      " : ",\n      ", o->f);
    first = false;
    if (tk->flags & NB_TOK__F_ADDED) put_json(o, (const char *)t->blob + tk->off, tk->len);
    else put_mapped(o, t->blob + tk->off, tk->len);
    fprintf(o->f, ": %d", id);
  }
  fputs("\n    },\n    \"merges\": [", o->f);
  const nb_tok__merge **ms = NULL;
  if (t->n_merges) {
    ms = nb_alloc(t->ctx, (size_t)t->n_merges * sizeof *ms);
    if (!ms) return NB_ERR_NOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < t->merges_cap && ms; i++)
    if (t->merges[i].key != UINT64_MAX) ms[k++] = &t->merges[i];
  qsort(ms, k, sizeof *ms, cmp_rank);
  for (size_t i = 0; i < k && !o->oom; i++) {
    int32_t a = (int32_t)(ms[i]->key >> 32), b = (int32_t)(uint32_t)ms[i]->key;
    size_t la = t->tokens[a].len, lb = t->tokens[b].len;
    if (nb_tok__grow(o->ctx, (void **)&o->buf, &o->cap, 2 * (la + lb) + 2, 1)) {
      o->oom = true;
      break;
    }
    size_t m = nb_tok__map_bytes(nb_tok__bytes(t, a), la, o->buf);
    o->buf[m++] = ' ';
    m += nb_tok__map_bytes(nb_tok__bytes(t, b), lb, o->buf + m);
    fputs(i ? ",\n      " : "\n      ", o->f);
    put_json(o, o->buf, m);
  }
  if (ms) nb_dealloc(t->ctx, ms, (size_t)t->n_merges * sizeof *ms);
  fputs("\n    ]\n  }\n}\n", o->f);
  return o->oom ? NB_ERR_NOMEM : NB_OK;
}

nb_status nb_tok_save_hf(const nb_tok *t, const char *path) {
  if (!t || !path) return NB_ERR_INVALID_ARG;
  if (t->kind != NB_TOK_BYTE_LEVEL)
    return nb_errorf(t->ctx, NB_ERR_UNIMPLEMENTED, "nb_tok_save_hf: only byte-level tokenizers can be saved (%s)", path);
  if (t->n_norm || t->n_post_prefix || t->n_post_suffix) /* never write a file that tokenizes differently */
    return nb_errorf(t->ctx, NB_ERR_UNIMPLEMENTED, "nb_tok_save_hf: tokenizers with a %s cannot be saved yet (%s)",
                     t->n_norm ? "normalizer" : "post-processor", path);
  for (int32_t i = 0; i < t->n_added; i++) {
    const nb_tok__token *tk = &t->tokens[t->added[i]];
    if (nb_tok__utf8_valid_prefix(t->blob + tk->off, tk->len) != tk->len)
      return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "nb_tok_save_hf: added token %d is not valid UTF-8", t->added[i]);
  }
  size_t n = strlen(path);
  char *tmp = nb_alloc(t->ctx, n + 5);
  if (!tmp) return NB_ERR_NOMEM;
  memcpy(tmp, path, n);
  memcpy(tmp + n, ".tmp", 5);
  out o = {.f = fopen(tmp, "wb"), .ctx = t->ctx};
  nb_status r = NB_OK;
  if (!o.f) {
    r = nb_errorf(t->ctx, NB_ERR_IO, "%s: cannot open for writing", tmp);
  } else {
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n", o.f);
    put_added(&o, t);
    put_pipeline(&o, t);
    r = put_model(&o, t);
    bool bad = ferror(o.f) != 0;
    if (fclose(o.f) != 0 || bad) r = r ? r : nb_errorf(t->ctx, NB_ERR_IO, "%s: write failed", tmp);
    if (!r && rename(tmp, path) != 0) r = nb_errorf(t->ctx, NB_ERR_IO, "%s: cannot rename to %s", tmp, path);
    if (r) remove(tmp);
  }
  if (o.buf) nb_dealloc(t->ctx, o.buf, o.cap);
  nb_dealloc(t->ctx, tmp, n + 5);
  return r;
}
