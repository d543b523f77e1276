/* Prefix search over the vocabulary for Unigram and WordPiece: the tokens
 * sorted by their bytes act as a trie. Walking the text a byte at a time
 * narrows a range of tokens sharing the prefix walked so far (two binary
 * searches per byte), and stops as soon as no token continues it; so a
 * position costs O(longest match x log V), whatever the longest token. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

static int cmp_bytes(const void *a, const void *b, void *ud) {
  const nb_tok *t = ud;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  const nb_tok__token *tx = &t->tokens[x], *ty = &t->tokens[y];
  uint32_t n = tx->len < ty->len ? tx->len : ty->len;
  int c = n ? memcmp(t->blob + tx->off, t->blob + ty->off, n) : 0;
  if (c) return c;
  if (tx->len != ty->len) return tx->len < ty->len ? -1 : 1; /* a prefix sorts first */
  return x < y ? -1 : x > y;
}

nb_status nb_tok__prefix_index(nb_tok *t, bool skip_bytes) {
  int32_t n = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t id = 0; id < t->n_tokens; id++) {
      const nb_tok__token *tk = &t->tokens[id];
      if (!(tk->flags & NB_TOK__F_PRESENT) || !tk->len || (skip_bytes && (tk->flags & NB_TOK__F_BYTE))) continue;
      if (nb_tok__lookup(t, nb_tok__bytes(t, id), tk->len) != id) continue; /* added, hidden, or a duplicate */
      if (pass) t->sorted[t->n_sorted++] = id;
      else n++;
    }
    if (!pass && n && !(t->sorted = nb_alloc(t->ctx, (size_t)n * sizeof *t->sorted))) return NB_ERR_NOMEM;
  }
  if (t->n_sorted > 1) qsort_r(t->sorted, (size_t)t->n_sorted, sizeof *t->sorted, cmp_bytes, t);
  return NB_OK;
}

/* The byte at r->depth of sorted[i], or -1 when the token ends there. */
static int key(const nb_tok *t, const nb_tok__range *r, int32_t i) {
  const nb_tok__token *tk = &t->tokens[t->sorted[i]];
  return tk->len > r->depth ? t->blob[tk->off + r->depth] : -1;
}

/* The first index in [lo, hi) whose key is >= v (keys rise along the range). */
static int32_t lower(const nb_tok *t, const nb_tok__range *r, int32_t lo, int32_t hi, int v) {
  while (lo < hi) {
    int32_t mid = lo + (hi - lo) / 2;
    if (key(t, r, mid) < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

bool nb_tok__range_step(const nb_tok *t, nb_tok__range *r, uint8_t c) {
  int32_t lo = lower(t, r, r->lo, r->hi, c), hi = lower(t, r, lo, r->hi, c + 1);
  r->lo = lo;
  r->hi = hi;
  r->depth++;
  return lo < hi;
}

int32_t nb_tok__range_exact(const nb_tok *t, const nb_tok__range *r) {
  if (r->lo >= r->hi) return -1;
  int32_t id = t->sorted[r->lo]; /* the shortest token with this prefix sorts first */
  return t->tokens[id].len == r->depth ? id : -1;
}
