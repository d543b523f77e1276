/* WordPiece models (tokenizer.json "WordPiece", BERT): each pre-tokenized
 * word is cut greedily into the longest vocabulary token at its start, then
 * the longest "##"-prefixed (continuing_subword_prefix) token at each later
 * position, as `tokenizers` does; a word with a position no token fits, or
 * longer than max_input_chars_per_word characters, becomes one [UNK]. Also
 * the WordPiece decoder's joining of tokens. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

static int char_len(const uint8_t *s, size_t n) {
  int l = nb_tok__utf8_len(s, n);
  return l ? l : 1;
}

static nb_status unk(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out) {
  if (t->unk_id < 0)
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tokenizer: WordPiece model has no unk token for '%.*s'", (int)(n < 64 ? n : 64), (const char *)s);
  return nb_tok__push(t, out, t->unk_id);
}

nb_status nb_tok__wordpiece_encode(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out) {
  size_t chars = 0;
  for (size_t i = 0; i < n; i += (size_t)char_len(s + i, n - i)) chars++;
  if (chars > (size_t)t->wp_max_chars) return unk(t, s, n, out);
  size_t plen = strlen(t->wp_prefix), before = out->len;
  uint8_t small[256];
  uint8_t *buf = n + plen <= sizeof small ? small : nb_alloc(t->ctx, n + plen);
  if (!buf) return NB_ERR_NOMEM;
  memcpy(buf, t->wp_prefix, plen);
  nb_status r = NB_OK;
  bool bad = false;
  for (size_t start = 0; start < n && !r && !bad;) {
    int32_t id = -1;
    size_t end = n;
    while (end > start) {
      if (start == 0) {
        id = nb_tok__lookup(t, s, end);
      } else {
        memcpy(buf + plen, s + start, end - start);
        id = nb_tok__lookup(t, buf, plen + end - start);
      }
      if (id >= 0) break;
      size_t back = 1; /* step back over the last character */
      while (back < end - start && back < 4 && (s[end - back] & 0xC0) == 0x80) back++;
      if (nb_tok__utf8_len(s + end - back, back) != (int)back) back = 1;
      end -= back;
    }
    if (id < 0) bad = true;
    else r = nb_tok__push(t, out, id), start = end;
  }
  if (buf != small) nb_dealloc(t->ctx, buf, n + plen);
  if (r) return r;
  if (bad) {
    out->len = before;
    return unk(t, s, n, out);
  }
  return NB_OK;
}
