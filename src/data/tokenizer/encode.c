/* Encoding pieces with BPE merges, and decoding ids to bytes. A piece's
 * symbols are merged lowest rank first, leftmost on ties: short pieces by a
 * scan over a rank array (tiktoken's shape, cache friendly), long ones by a
 * binary heap over a linked list so that a long piece (a SentencePiece-style
 * sentence, a run of 100k spaces) costs O(n log n), not O(n^2). Not here:
 * splitting text into pieces (pretok.c). */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

#define SMALL_PIECE 48 /* symbols; up to this the quadratic scan wins */

typedef struct heap_entry {
  int32_t rank, pos, left, right;
} heap_entry;

typedef struct enc_state {
  const nb_tok *t;
  nb_tok_ids *out;
  /* scratch for long pieces */
  int32_t *sym, *prev, *next;
  size_t cap;
  heap_entry *heap;
  size_t heap_len, heap_cap;
} enc_state;

nb_status nb_tok__push(const nb_tok *t, nb_tok_ids *o, int32_t id) {
  if (o->len == o->cap && nb_tok__grow(t->ctx, (void **)&o->ids, &o->cap, o->len + 1, sizeof *o->ids)) return NB_ERR_NOMEM;
  o->ids[o->len++] = id;
  return NB_OK;
}

static nb_status push_id(enc_state *st, int32_t id) { return nb_tok__push(st->t, st->out, id); }

static inline int32_t pair_rank(const nb_tok *t, int32_t a, int32_t b, int32_t *result) {
  const nb_tok__merge *m = nb_tok__find_merge(t, a, b);
  if (!m) return INT32_MAX;
  *result = m->result;
  return m->rank;
}

/* Merges sym[0..n) in place; returns the new length. */
static size_t merge_small(const nb_tok *t, int32_t *sym, size_t n) {
  int32_t rank[SMALL_PIECE], res[SMALL_PIECE];
  for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(t, sym[i], sym[i + 1], &res[i]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; i++)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    sym[best] = res[best];
    memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
    memmove(rank + best + 1, rank + best + 2, (n - best - 2) * sizeof *rank);
    memmove(res + best + 1, res + best + 2, (n - best - 2) * sizeof *res);
    n--;
    if (best > 0) rank[best - 1] = pair_rank(t, sym[best - 1], sym[best], &res[best - 1]);
    if (best + 1 < n) rank[best] = pair_rank(t, sym[best], sym[best + 1], &res[best]);
  }
  return n;
}

static bool heap_less(const heap_entry *a, const heap_entry *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static nb_status heap_push(enc_state *st, heap_entry e) {
  if (st->heap_len == st->heap_cap &&
      nb_tok__grow(st->t->ctx, (void **)&st->heap, &st->heap_cap, st->heap_len + 1, sizeof *st->heap))
    return NB_ERR_NOMEM;
  size_t i = st->heap_len++;
  while (i > 0 && heap_less(&e, &st->heap[(i - 1) / 2])) {
    st->heap[i] = st->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  st->heap[i] = e;
  return NB_OK;
}

static heap_entry heap_pop(enc_state *st) {
  heap_entry top = st->heap[0], last = st->heap[--st->heap_len];
  size_t i = 0, n = st->heap_len;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && heap_less(&st->heap[c + 1], &st->heap[c])) c++;
    if (!heap_less(&st->heap[c], &last)) break;
    st->heap[i] = st->heap[c];
    i = c;
  }
  if (n) st->heap[i] = last;
  return top;
}

static nb_status push_pair(enc_state *st, int32_t pos) {
  int32_t nx = st->next[pos], res = -1;
  if (nx < 0) return NB_OK;
  int32_t r = pair_rank(st->t, st->sym[pos], st->sym[nx], &res);
  if (r == INT32_MAX) return NB_OK;
  return heap_push(st, (heap_entry){r, pos, st->sym[pos], st->sym[nx]});
}

/* Merges st->sym[0..n) with a heap and emits the result. */
static nb_status merge_long(enc_state *st, size_t n) {
  st->heap_len = 0;
  for (size_t i = 0; i < n; i++) {
    st->prev[i] = (int32_t)i - 1;
    st->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  nb_status r;
  for (size_t i = 0; i + 1 < n; i++)
    if ((r = push_pair(st, (int32_t)i))) return r;
  while (st->heap_len) {
    heap_entry e = heap_pop(st);
    int32_t nx = st->next[e.pos];
    if (st->sym[e.pos] != e.left || nx < 0 || st->sym[nx] != e.right) continue; /* stale */
    int32_t res = -1;
    pair_rank(st->t, e.left, e.right, &res);
    st->sym[e.pos] = res;
    st->sym[nx] = -1;
    st->next[e.pos] = st->next[nx];
    if (st->next[nx] >= 0) st->prev[st->next[nx]] = e.pos;
    if (st->prev[e.pos] >= 0 && (r = push_pair(st, st->prev[e.pos]))) return r;
    if ((r = push_pair(st, e.pos))) return r;
  }
  for (int32_t i = 0; i >= 0; i = st->next[i])
    if ((r = push_id(st, st->sym[i]))) return r;
  return NB_OK;
}

static void free_long(enc_state *st) {
  nb_ctx *ctx = st->t->ctx;
  size_t bytes = st->cap * sizeof(int32_t);
  if (st->sym) nb_dealloc(ctx, st->sym, bytes);
  if (st->prev) nb_dealloc(ctx, st->prev, bytes);
  if (st->next) nb_dealloc(ctx, st->next, bytes);
  st->sym = st->prev = st->next = NULL;
  st->cap = 0;
}

/* Three parallel arrays of n int32 (contents need not survive). */
static nb_status reserve_long(enc_state *st, size_t n) {
  if (n <= st->cap) return NB_OK;
  free_long(st);
  size_t cap = 256;
  while (cap < n) cap *= 2;
  nb_ctx *ctx = st->t->ctx;
  st->cap = cap;
  st->sym = nb_alloc(ctx, cap * sizeof(int32_t));
  st->prev = nb_alloc(ctx, cap * sizeof(int32_t));
  st->next = nb_alloc(ctx, cap * sizeof(int32_t));
  if (st->sym && st->prev && st->next) return NB_OK;
  free_long(st);
  return NB_ERR_NOMEM;
}

/* Initial symbols of a piece into sym (capacity >= n + 1); returns count. */
static size_t initial_symbols(const nb_tok *t, const uint8_t *s, size_t n, int32_t *sym) {
  size_t k = 0;
  if (t->kind == NB_TOK_BYTE_LEVEL) {
    for (size_t i = 0; i < n; i++) {
      int32_t id = t->byte_token[s[i]];
      if (id < 0) id = t->unk_id;
      if (id < 0 || (t->fuse_unk && id == t->unk_id && k && sym[k - 1] == id)) continue;
      sym[k++] = id;
    }
    return k;
  }
  for (size_t i = 0; i < n;) {
    size_t len = (size_t)nb_tok__char_len(s + i, n - i);
    int32_t id = nb_tok__lookup(t, s + i, len);
    if (id >= 0) {
      sym[k++] = id;
    } else {
      bool bytes = t->byte_fallback;
      for (size_t j = 0; j < len && bytes; j++) bytes = t->byte_token[s[i + j]] >= 0;
      if (bytes) {
        for (size_t j = 0; j < len; j++) sym[k++] = t->byte_token[s[i + j]];
      } else if (t->unk_id >= 0 && !(t->fuse_unk && k && sym[k - 1] == t->unk_id)) {
        sym[k++] = t->unk_id;
      }
    }
    i += len;
  }
  return k;
}

static nb_status on_piece(void *ud, const uint8_t *s, size_t n) {
  enc_state *st = ud;
  const nb_tok *t = st->t;
  if (t->model == NB_TOK__MODEL_UNIGRAM) return nb_tok__unigram_encode(t, s, n, st->out);
  if (t->model == NB_TOK__MODEL_WORDPIECE) return nb_tok__wordpiece_encode(t, s, n, st->out);
  if (t->ignore_merges || n == 1) {
    int32_t id = nb_tok__lookup(t, s, n);
    if (id >= 0) return push_id(st, id);
  }
  int32_t small[SMALL_PIECE + 1];
  int32_t *sym = small;
  if (n > SMALL_PIECE) {
    if (reserve_long(st, n + 1)) return NB_ERR_NOMEM;
    sym = st->sym;
  }
  size_t k = initial_symbols(t, s, n, sym);
  if (k <= SMALL_PIECE) {
    if (sym != small) memcpy(small, sym, k * sizeof *sym);
    k = merge_small(t, small, k);
    for (size_t i = 0; i < k; i++) {
      nb_status r = push_id(st, small[i]);
      if (r) return r;
    }
    return NB_OK;
  }
  return merge_long(st, k);
}

static nb_status on_added(void *ud, int32_t id) { return push_id(ud, id); }

nb_status nb_tok_encode(const nb_tok *t, const void *text, size_t len, const nb_tok_encode_opts *opts,
                        nb_tok_ids *out) {
  if (!t || !out || (!text && len)) return nb_errorf(t ? t->ctx : NULL, NB_ERR_INVALID_ARG, "nb_tok_encode: NULL argument");
  nb_tok_special mode = opts ? opts->special : NB_TOK_SPECIAL_ALLOW;
  if ((unsigned)mode >= NB_TOK_SPECIAL_COUNT)
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "nb_tok_encode: bad special-token mode %d", (int)mode);
  enc_state st = {.t = t, .out = out};
  size_t before = out->len;
  bool wrap = opts && opts->add_special_tokens;
  nb_status r = NB_OK;
  for (int i = 0; wrap && i < t->n_post_prefix && !r; i++) r = push_id(&st, t->post_prefix[i]);
  if (!r) r = nb_tok__split(t, text, len, mode, on_piece, on_added, &st);
  for (int i = 0; wrap && i < t->n_post_suffix && !r; i++) r = push_id(&st, t->post_suffix[i]);
  nb_ctx *ctx = t->ctx;
  free_long(&st);
  if (st.heap) nb_dealloc(ctx, st.heap, st.heap_cap * sizeof *st.heap);
  if (r) out->len = before;
  return r;
}

/* ---- decoding ---- */

static nb_status append(const nb_tok *t, nb_tok_text *o, const void *p, size_t n) {
  if (o->len + n + 1 > o->cap && nb_tok__grow(t->ctx, (void **)&o->data, &o->cap, o->len + n + 1, 1))
    return NB_ERR_NOMEM;
  memcpy(o->data + o->len, p, n);
  o->len += n;
  return NB_OK;
}

/* Char-level piece: "▁" back to ' '. */
static nb_status append_piece(const nb_tok *t, nb_tok_text *o, const uint8_t *p, size_t n) {
  size_t start = 0;
  for (size_t i = 0; i + 3 <= n; i++) {
    if (p[i] == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
      if (append(t, o, p + start, i - start) || append(t, o, " ", 1)) return NB_ERR_NOMEM;
      start = i + 3;
      i += 2;
    }
  }
  return append(t, o, p + start, n - start);
}

/* `tokenizers`' WordPiece cleanup, in place on o->data[from..len): each
 * rule replaces every occurrence, in this order; none makes text longer. */
static void wordpiece_cleanup(nb_tok_text *o, size_t from) {
  static const char *const rules[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
                                         {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (size_t k = 0; k < sizeof rules / sizeof *rules; k++) {
    size_t fl = strlen(rules[k][0]), tl = strlen(rules[k][1]), w = from;
    for (size_t i = from; i < o->len;) {
      if (i + fl <= o->len && !memcmp(o->data + i, rules[k][0], fl)) {
        memmove(o->data + w, rules[k][1], tl);
        w += tl;
        i += fl;
      } else {
        o->data[w++] = o->data[i++];
      }
    }
    o->len = w;
  }
}

/* WordPiece decoder: the k-th token output is joined to the text before it
 * without its prefix ("##ing"), or after a ' '. */
static nb_status append_wordpiece(const nb_tok *t, nb_tok_text *o, const uint8_t *p, size_t n, size_t k) {
  size_t pl = strlen(t->wp_dec_prefix), from = o->len;
  nb_status r;
  if (k > 0 && n >= pl && !memcmp(p, t->wp_dec_prefix, pl)) r = append(t, o, p + pl, n - pl);
  else r = (k > 0 ? append(t, o, " ", 1) : NB_OK) || append(t, o, p, n) ? NB_ERR_NOMEM : NB_OK;
  if (!r && t->wp_cleanup) wordpiece_cleanup(o, from);
  return r;
}

nb_status nb_tok_decode(const nb_tok *t, const int32_t *ids, size_t n, const nb_tok_decode_opts *opts,
                        nb_tok_text *out) {
  if (!t || !out || (!ids && n)) return nb_errorf(t ? t->ctx : NULL, NB_ERR_INVALID_ARG, "nb_tok_decode: NULL argument");
  bool skip = opts && opts->skip_special;
  size_t before = out->len;
  nb_status r = append(t, out, "", 0);
  size_t k = 0; /* tokens output so far (the WordPiece decoder joins on it) */
  for (size_t i = 0; i < n && !r; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_tokens || !(t->tokens[id].flags & NB_TOK__F_PRESENT)) {
      r = nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "nb_tok_decode: id %d at position %zu is not in the vocabulary (size %d)",
                    id, i, t->n_tokens);
      break;
    }
    const nb_tok__token *tk = &t->tokens[id];
    const uint8_t *b = t->blob + tk->off;
    if (t->wp_decoder) {
      if (!(skip && (tk->flags & NB_TOK__F_SPECIAL))) r = append_wordpiece(t, out, b, tk->len, k++);
    } else if (id == t->unk_id && t->unk_surface[0]) {
      r = append(t, out, t->unk_surface, strlen(t->unk_surface));
    } else if ((tk->flags & NB_TOK__F_SPECIAL) && !(tk->flags & NB_TOK__F_ADDED)) {
      /* a SentencePiece control token (<s>, </s>): decodes to nothing */
    } else if (tk->flags & NB_TOK__F_ADDED) {
      if (!(skip && (tk->flags & NB_TOK__F_SPECIAL))) r = append(t, out, b, tk->len);
    } else if (tk->flags & NB_TOK__F_BYTE) {
      uint8_t c = (uint8_t)tk->byte_value;
      r = append(t, out, &c, 1);
    } else if (t->kind == NB_TOK_CHAR_LEVEL) {
      r = append_piece(t, out, b, tk->len);
    } else {
      r = append(t, out, b, tk->len);
    }
  }
  if (r) {
    out->len = before;
    if (out->data) out->data[before] = 0;
    return r;
  }
  size_t strip = 0;
  bool unk_first = n && ids[0] == t->unk_id && t->unk_surface[0]; /* sentencepiece strips a "▁", not the surface's ' ' */
  while (!unk_first && (int)strip < t->strip_leading && before + strip < out->len && out->data[before + strip] == ' ') strip++;
  if (strip) memmove(out->data + before, out->data + before + strip, out->len - before - strip);
  out->len -= strip;
  out->data[out->len] = 0;
  return NB_OK;
}

void nb_tok_ids_free(const nb_tok *t, nb_tok_ids *ids) {
  if (!ids) return;
  if (ids->ids) nb_dealloc(t->ctx, ids->ids, ids->cap * sizeof *ids->ids);
  *ids = (nb_tok_ids){0};
}

void nb_tok_text_free(const nb_tok *t, nb_tok_text *text) {
  if (!text) return;
  if (text->data) nb_dealloc(t->ctx, text->data, text->cap);
  *text = (nb_tok_text){0};
}
