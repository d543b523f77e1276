/* WordPiece models (tokenizer.json "WordPiece", BERT): each pre-tokenized
 * word is cut greedily into the longest vocabulary token at its start, then
 * the longest "##"-prefixed (continuing_subword_prefix) token at each later
 * position, as `tokenizers` does; a word with a position no token fits, or
 * longer than max_input_chars_per_word characters, becomes one [UNK]. Also
 * the WordPiece decoder's joining of tokens. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

static nb_status unk(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out) {
  if (t->unk_id < 0)
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tokenizer: WordPiece model has no unk token for '%.*s'", (int)(n < 64 ? n : 64), (const char *)s);
  return nb_tok__push(t, out, t->unk_id);
}

/* The longest token matching s[start..) (after the continuing prefix when
 * start > 0); its end in *end, or -1. */
static int32_t longest(const nb_tok *t, const uint8_t *s, size_t n, size_t start, size_t *end) {
  nb_tok__range rg = nb_tok__range_all(t);
  if (start > 0)
    for (const char *p = t->wp_prefix; *p; p++)
      if (!nb_tok__range_step(t, &rg, (uint8_t)*p)) return -1;
  int32_t best = -1;
  for (size_t i = start; i < n && nb_tok__range_step(t, &rg, s[i]); i++) {
    int32_t id = nb_tok__range_exact(t, &rg);
    if (id >= 0) best = id, *end = i + 1;
  }
  return best;
}

nb_status nb_tok__wordpiece_encode(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out) {
  size_t chars = 0;
  for (size_t i = 0; i < n; i += (size_t)nb_tok__char_len(s + i, n - i)) chars++;
  if (chars > (size_t)t->wp_max_chars) return unk(t, s, n, out);
  size_t before = out->len;
  for (size_t start = 0; start < n;) {
    size_t end = start;
    int32_t id = longest(t, s, n, start, &end);
    if (id < 0) { /* one position no token fits: the whole word is unknown */
      out->len = before;
      return unk(t, s, n, out);
    }
    nb_status r = nb_tok__push(t, out, id);
    if (r) return r;
    start = end;
  }
  return NB_OK;
}
