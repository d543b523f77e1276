/* Unigram models (SentencePiece model_type UNIGRAM, tokenizer.json "Unigram"):
 * a piece is cut into the vocabulary tokens whose scores (log probabilities)
 * sum highest, by Viterbi over the character positions, exactly as
 * sentencepiece's and `tokenizers`' encoders do it:
 *   - the best path ending at each position keeps the first candidate that
 *     is strictly better (candidates come by start position, then length);
 *   - a character no token starts with becomes <unk> scored min_score - 10;
 *   - adjacent <unk> fuse into one; with byte fallback an <unk> becomes the
 *     <0xNN> tokens of its bytes.
 * SentencePiece keeps float path scores, `tokenizers` doubles (t->uni_f32). */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

#define UNK_PENALTY 10.0

typedef struct uni_node {
  double score; /* best path score ending here */
  int32_t start; /* where its last token starts; -1: not reached */
  int32_t id;    /* its last token (unk_id for an unknown character) */
} uni_node;

/* sentencepiece (0.2) adds, compares and stores path scores in float. */
static void relax(const nb_tok *t, uni_node *node, double base, double score, int32_t start, int32_t id) {
  double cand = t->uni_f32 ? (double)((float)score + (float)base) : score + base;
  if (node->start < 0 || cand > node->score) *node = (uni_node){cand, start, id};
}

/* Emits the (fused) unknown bytes s[a..b): byte tokens or one unk. */
static nb_status emit_unknown(const nb_tok *t, const uint8_t *s, size_t a, size_t b, nb_tok_ids *out) {
  bool bytes = t->byte_fallback;
  for (size_t i = a; i < b && bytes; i++) bytes = t->byte_token[s[i]] >= 0;
  if (bytes) {
    for (size_t i = a; i < b; i++)
      if (nb_tok__push(t, out, t->byte_token[s[i]])) return NB_ERR_NOMEM;
    return NB_OK;
  }
  if (t->unk_id < 0)
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tokenizer: Unigram model has no unk token for '%.*s'", (int)(b - a), (const char *)s + a);
  return nb_tok__push(t, out, t->unk_id);
}

nb_status nb_tok__unigram_encode(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out) {
  nb_ctx *ctx = t->ctx;
  uni_node small[65];
  uni_node *node = n < 65 ? small : nb_alloc(ctx, (n + 1) * sizeof *node);
  if (!node) return NB_ERR_NOMEM;
  for (size_t i = 0; i <= n; i++) node[i] = (uni_node){0, -1, -1};
  for (size_t start = 0; start < n;) {
    int mblen = nb_tok__char_len(s + start, n - start); /* an invalid byte: an unknown character */
    double base = node[start].score;
    bool single = false;
    nb_tok__range rg = nb_tok__range_all(t);
    for (size_t end = start + 1; end <= n && nb_tok__range_step(t, &rg, s[end - 1]); end++) {
      int32_t id = nb_tok__range_exact(t, &rg);
      if (id < 0) continue;
      relax(t, &node[end], base, t->scores[id], (int32_t)start, id);
      if (end - start == (size_t)mblen) single = true;
    }
    if (!single) relax(t, &node[start + (size_t)mblen], base, t->uni_unk_score, (int32_t)start, -1);
    start += (size_t)mblen;
  }
  /* backtrack: the best path's token ends, last first */
  size_t k = 0;
  int32_t small_ends[65];
  int32_t *ends = n < 65 ? small_ends : nb_alloc(ctx, (n + 1) * sizeof *ends);
  nb_status r = ends ? NB_OK : NB_ERR_NOMEM;
  for (size_t end = n; !r && end > 0; end = (size_t)node[end].start) ends[k++] = (int32_t)end;
  /* then forward along the path, fusing runs of unknowns */
  size_t unk_from = SIZE_MAX, prev = 0;
  for (size_t j = k; !r && j-- > 0;) {
    size_t end = (size_t)ends[j];
    int32_t id = node[end].id;
    bool unk = id < 0 || id == t->unk_id;
    if (unk) {
      if (unk_from == SIZE_MAX) unk_from = prev;
    } else {
      if (unk_from != SIZE_MAX) r = emit_unknown(t, s, unk_from, prev, out);
      unk_from = SIZE_MAX;
      if (!r) r = nb_tok__push(t, out, id);
    }
    prev = end;
  }
  if (!r && unk_from != SIZE_MAX) r = emit_unknown(t, s, unk_from, prev, out);
  if (ends && ends != small_ends) nb_dealloc(ctx, ends, (n + 1) * sizeof *ends);
  if (node != small) nb_dealloc(ctx, node, (n + 1) * sizeof *node);
  return r;
}

nb_status nb_tok__unigram_finish(nb_tok *t, double min_score, bool skip_bytes) {
  t->model = NB_TOK__MODEL_UNIGRAM;
  t->uni_unk_score = t->uni_f32 ? (double)((float)min_score - (float)UNK_PENALTY) : min_score - UNK_PENALTY;
  return nb_tok__prefix_index(t, skip_bytes);
}
