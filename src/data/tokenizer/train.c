/* Byte-level BPE training: count the corpus's pieces (pre-tokenized with the
 * same splitter encoding uses), then learn merges greedily, highest pair
 * count first, ties to the smallest (left id, right id). Counts are kept
 * incrementally: each merge rewrites only the words that hold the pair
 * (found through per-pair occurrence lists) and a lazy max-heap yields the
 * best pair. Not here: writing tokenizer.json (save_hf.c). */
#include <string.h>
#include <xxhash.h>

#include "data/tokenizer/tok_internal.h"

typedef struct word {
  uint32_t off, len; /* bytes in wblob while counting; symbols in syms after */
  int64_t count;
} word;

typedef struct pair_info {
  int32_t left, right;
  int64_t count;
  int32_t occ; /* head of the occurrence list (index into occ pool), -1 none */
} pair_info;

typedef struct occ_node {
  int32_t word, next;
} occ_node;

typedef struct heap_item {
  int64_t count;
  int32_t left, right;
} heap_item;

struct nb_tok_trainer {
  nb_ctx *ctx;
  int32_t vocab_size;
  int64_t min_frequency;
  nb_tok *splitter; /* pattern + specials as added tokens; no vocabulary */
  word *words;
  size_t n_words, cap_words;
  uint8_t *wblob;
  size_t wblob_len, wblob_cap;
  int32_t *wmap; /* word index + 1; 0 empty */
  size_t wmap_cap;
  bool done;
};

/* ---- counting ---- */

static nb_status wmap_rehash(nb_tok_trainer *tr) {
  size_t cap = tr->wmap_cap ? tr->wmap_cap * 2 : 1024;
  int32_t *m = nb_calloc(tr->ctx, cap * sizeof *m);
  if (!m) return NB_ERR_NOMEM;
  for (size_t w = 0; w < tr->n_words; w++) {
    size_t i = (size_t)XXH3_64bits(tr->wblob + tr->words[w].off, tr->words[w].len) & (cap - 1);
    while (m[i]) i = (i + 1) & (cap - 1);
    m[i] = (int32_t)w + 1;
  }
  if (tr->wmap) nb_dealloc(tr->ctx, tr->wmap, tr->wmap_cap * sizeof *tr->wmap);
  tr->wmap = m;
  tr->wmap_cap = cap;
  return NB_OK;
}

static nb_status count_piece(void *ud, const uint8_t *s, size_t n) {
  nb_tok_trainer *tr = ud;
  if (n == 0) return NB_OK;
  if ((tr->n_words + 1) * 2 > tr->wmap_cap && wmap_rehash(tr)) return NB_ERR_NOMEM;
  size_t mask = tr->wmap_cap - 1, i = (size_t)XXH3_64bits(s, n) & mask;
  for (; tr->wmap[i]; i = (i + 1) & mask) {
    word *w = &tr->words[tr->wmap[i] - 1];
    if (w->len == n && memcmp(tr->wblob + w->off, s, n) == 0) {
      w->count++;
      return NB_OK;
    }
  }
  if (tr->n_words >= INT32_MAX - 1 || tr->wblob_len + n >= UINT32_MAX)
    return nb_errorf(tr->ctx, NB_ERR_INVALID_ARG, "tokenizer training: corpus has too many distinct pieces");
  if (nb_tok__grow(tr->ctx, (void **)&tr->words, &tr->cap_words, tr->n_words + 1, sizeof *tr->words) ||
      nb_tok__grow(tr->ctx, (void **)&tr->wblob, &tr->wblob_cap, tr->wblob_len + n, 1))
    return NB_ERR_NOMEM;
  memcpy(tr->wblob + tr->wblob_len, s, n);
  tr->words[tr->n_words] = (word){(uint32_t)tr->wblob_len, (uint32_t)n, 1};
  tr->wblob_len += n;
  tr->wmap[i] = (int32_t)++tr->n_words;
  return NB_OK;
}

static nb_status skip_added(void *ud, int32_t id) { return NB_OK; }

nb_tok_trainer *nb_tok_trainer_create(nb_ctx *ctx, const nb_tok_train_opts *o) {
  if (!o) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_create: NULL options"), NULL;
  if (o->n_special < 0 || (o->n_special && !o->special))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_create: bad special token list"), NULL;
  if (o->vocab_size < 256 + o->n_special || o->vocab_size > (1 << 24))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_create: vocab_size %d must be in [256 + %d specials, 2^24]",
                     o->vocab_size, o->n_special), NULL;
  nb_tok_trainer *tr = nb_calloc(ctx, sizeof *tr);
  if (!tr) return NULL;
  tr->ctx = ctx;
  tr->vocab_size = o->vocab_size;
  tr->min_frequency = o->min_frequency > 1 ? o->min_frequency : 1;
  nb_tok *sp = tr->splitter = nb_tok__create(ctx, NB_TOK_BYTE_LEVEL);
  nb_status r = sp ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; i < o->n_special && !r; i++) {
    if (!o->special[i] || !o->special[i][0]) r = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_create: special[%d] is empty", i);
    else if (nb_tok__added_id(sp, o->special[i], strlen(o->special[i])) >= 0)
      r = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_create: special token '%s' given twice", o->special[i]);
    else r = nb_tok__set_token(sp, i, o->special[i], strlen(o->special[i]), NB_TOK__F_ADDED | NB_TOK__F_SPECIAL, "special tokens");
  }
  if (!r) r = nb_tok__index(sp, "trainer");
  if (!r) r = nb_tok__set_pattern(sp, o->pattern ? o->pattern : NB_TOK_PATTERN_GPT2, "training options: pattern");
  if (!r) r = nb_tok__finish(sp);
  if (r) {
    nb_tok_trainer_destroy(tr);
    return NULL;
  }
  return tr;
}

nb_status nb_tok_trainer_feed(nb_tok_trainer *tr, const void *text, size_t len) {
  if (!tr || (!text && len)) return NB_ERR_INVALID_ARG;
  if (tr->done) return nb_errorf(tr->ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_feed: the trainer has finished");
  return nb_tok__split(tr->splitter, text, len, NB_TOK_SPECIAL_ALLOW, count_piece, skip_added, tr);
}

void nb_tok_trainer_destroy(nb_tok_trainer *tr) {
  if (!tr) return;
  nb_ctx *ctx = tr->ctx;
  nb_tok_destroy(tr->splitter);
  nb_dealloc(ctx, tr->words, tr->cap_words * sizeof *tr->words);
  nb_dealloc(ctx, tr->wblob, tr->wblob_cap);
  nb_dealloc(ctx, tr->wmap, tr->wmap_cap * sizeof *tr->wmap);
  nb_dealloc(ctx, tr, sizeof *tr);
}

/* ---- learning ---- */

typedef struct learn {
  nb_ctx *ctx;
  int32_t *syms;       /* words' symbols, word w at words[w].off */
  size_t syms_cap;
  pair_info *pairs;
  size_t n_pairs, cap_pairs;
  int32_t *pmap;       /* pair index + 1 */
  size_t pmap_cap;
  occ_node *occ;
  size_t n_occ, cap_occ;
  heap_item *heap;
  size_t n_heap, cap_heap;
  int32_t *stamp;      /* per word: last merge that rewrote it */
  int32_t *dirty;      /* pairs touched by this merge that involve the new id */
  size_t n_dirty, cap_dirty;
  int32_t (*merges)[2];
  size_t cap_merges;
} learn;

static uint64_t pkey(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }
static size_t phash(uint64_t k) { return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 32); }

static nb_status pmap_rehash(learn *L) {
  size_t cap = L->pmap_cap ? L->pmap_cap * 2 : 4096;
  int32_t *m = nb_calloc(L->ctx, cap * sizeof *m);
  if (!m) return NB_ERR_NOMEM;
  for (size_t p = 0; p < L->n_pairs; p++) {
    size_t i = phash(pkey(L->pairs[p].left, L->pairs[p].right)) & (cap - 1);
    while (m[i]) i = (i + 1) & (cap - 1);
    m[i] = (int32_t)p + 1;
  }
  if (L->pmap) nb_dealloc(L->ctx, L->pmap, L->pmap_cap * sizeof *L->pmap);
  L->pmap = m;
  L->pmap_cap = cap;
  return NB_OK;
}

/* The pair's index, created (count 0) when missing; -1 on OOM. */
static int32_t pair_get(learn *L, int32_t a, int32_t b) {
  if ((L->n_pairs + 1) * 2 > L->pmap_cap && pmap_rehash(L)) return -1;
  uint64_t k = pkey(a, b);
  size_t mask = L->pmap_cap - 1, i = phash(k) & mask;
  for (; L->pmap[i]; i = (i + 1) & mask) {
    pair_info *p = &L->pairs[L->pmap[i] - 1];
    if (p->left == a && p->right == b) return L->pmap[i] - 1;
  }
  if (nb_tok__grow(L->ctx, (void **)&L->pairs, &L->cap_pairs, L->n_pairs + 1, sizeof *L->pairs)) return -1;
  L->pairs[L->n_pairs] = (pair_info){a, b, 0, -1};
  L->pmap[i] = (int32_t)++L->n_pairs;
  return (int32_t)L->n_pairs - 1;
}

static bool item_before(const heap_item *x, const heap_item *y) {
  if (x->count != y->count) return x->count > y->count;
  if (x->left != y->left) return x->left < y->left;
  return x->right < y->right;
}

static nb_status heap_push(learn *L, heap_item it) {
  if (nb_tok__grow(L->ctx, (void **)&L->heap, &L->cap_heap, L->n_heap + 1, sizeof *L->heap)) return NB_ERR_NOMEM;
  size_t i = L->n_heap++;
  while (i && item_before(&it, &L->heap[(i - 1) / 2])) {
    L->heap[i] = L->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  L->heap[i] = it;
  return NB_OK;
}

static heap_item heap_pop(learn *L) {
  heap_item top = L->heap[0], last = L->heap[--L->n_heap];
  size_t i = 0, n = L->n_heap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && item_before(&L->heap[c + 1], &L->heap[c])) c++;
    if (!item_before(&L->heap[c], &last)) break;
    L->heap[i] = L->heap[c];
    i = c;
  }
  if (n) L->heap[i] = last;
  return top;
}

static nb_status occ_add(learn *L, int32_t p, int32_t w) {
  if (nb_tok__grow(L->ctx, (void **)&L->occ, &L->cap_occ, L->n_occ + 1, sizeof *L->occ)) return NB_ERR_NOMEM;
  if (L->n_occ >= INT32_MAX) return nb_errorf(L->ctx, NB_ERR_NOMEM, "tokenizer training: too many pair occurrences");
  L->occ[L->n_occ] = (occ_node){w, L->pairs[p].occ};
  L->pairs[p].occ = (int32_t)L->n_occ++;
  return NB_OK;
}

/* Adds sign * count for each adjacent pair of word w; with new_id >= 0,
 * records occurrences and dirtiness of pairs holding new_id. */
static nb_status word_pairs(learn *L, const word *wd, int32_t w, int64_t sign, int32_t new_id) {
  const int32_t *s = L->syms + wd->off;
  for (uint32_t i = 0; i + 1 < wd->len; i++) {
    int32_t p = pair_get(L, s[i], s[i + 1]);
    if (p < 0) return NB_ERR_NOMEM;
    L->pairs[p].count += sign * wd->count;
    bool fresh = new_id < 0 || s[i] == new_id || s[i + 1] == new_id;
    if (sign > 0 && fresh) {
      if (occ_add(L, p, w)) return NB_ERR_NOMEM;
      if (new_id >= 0) {
        if (nb_tok__grow(L->ctx, (void **)&L->dirty, &L->cap_dirty, L->n_dirty + 1, sizeof *L->dirty)) return NB_ERR_NOMEM;
        L->dirty[L->n_dirty++] = p;
      }
    }
  }
  return NB_OK;
}

static nb_status apply_merge(learn *L, word *words, int32_t pi, int32_t new_id, int32_t step) {
  int32_t a = L->pairs[pi].left, b = L->pairs[pi].right;
  L->n_dirty = 0;
  for (int32_t o = L->pairs[pi].occ; o >= 0; o = L->occ[o].next) {
    int32_t w = L->occ[o].word;
    if (L->stamp[w] == step) continue;
    L->stamp[w] = step;
    word *wd = &words[w];
    int32_t *s = L->syms + wd->off;
    bool has = false;
    for (uint32_t i = 0; i + 1 < wd->len && !has; i++) has = s[i] == a && s[i + 1] == b;
    if (!has) continue;
    nb_status r = word_pairs(L, wd, w, -1, -1);
    if (r) return r;
    uint32_t k = 0;
    for (uint32_t i = 0; i < wd->len; i++) {
      if (i + 1 < wd->len && s[i] == a && s[i + 1] == b) {
        s[k++] = new_id;
        i++;
      } else {
        s[k++] = s[i];
      }
    }
    wd->len = k;
    if ((r = word_pairs(L, wd, w, +1, new_id))) return r;
  }
  for (size_t i = 0; i < L->n_dirty; i++) {
    pair_info *p = &L->pairs[L->dirty[i]];
    if (p->count > 0 && heap_push(L, (heap_item){p->count, p->left, p->right})) return NB_ERR_NOMEM;
  }
  return NB_OK;
}

static void learn_free(learn *L, size_t n_words) {
  nb_ctx *c = L->ctx;
  nb_dealloc(c, L->syms, L->syms_cap * sizeof *L->syms);
  nb_dealloc(c, L->pairs, L->cap_pairs * sizeof *L->pairs);
  nb_dealloc(c, L->pmap, L->pmap_cap * sizeof *L->pmap);
  nb_dealloc(c, L->occ, L->cap_occ * sizeof *L->occ);
  nb_dealloc(c, L->heap, L->cap_heap * sizeof *L->heap);
  nb_dealloc(c, L->stamp, n_words * sizeof *L->stamp);
  nb_dealloc(c, L->dirty, L->cap_dirty * sizeof *L->dirty);
  nb_dealloc(c, L->merges, L->cap_merges * sizeof *L->merges);
}

/* Learns up to max_merges merges into L->merges; returns the count or -1. */
static int32_t learn_merges(nb_tok_trainer *tr, learn *L, int32_t max_merges) {
  size_t nw = tr->n_words;
  L->syms_cap = tr->wblob_len ? tr->wblob_len : 1;
  L->syms = nb_alloc(tr->ctx, L->syms_cap * sizeof *L->syms);
  L->stamp = nb_alloc(tr->ctx, (nw ? nw : 1) * sizeof *L->stamp);
  if (!L->syms || !L->stamp) return -1;
  for (size_t w = 0; w < nw; w++) {
    L->stamp[w] = -1;
    for (uint32_t i = 0; i < tr->words[w].len; i++) L->syms[tr->words[w].off + i] = tr->wblob[tr->words[w].off + i];
    if (word_pairs(L, &tr->words[w], (int32_t)w, +1, -1)) return -1;
  }
  for (size_t p = 0; p < L->n_pairs; p++)
    if (heap_push(L, (heap_item){L->pairs[p].count, L->pairs[p].left, L->pairs[p].right})) return -1;
  int32_t n = 0;
  while (n < max_merges && L->n_heap) {
    heap_item it = heap_pop(L);
    int32_t pi = pair_get(L, it.left, it.right);
    if (pi < 0) return -1;
    int64_t now = L->pairs[pi].count;
    if (now != it.count) { /* stale: counts of old pairs only fall */
      if (now > 0 && heap_push(L, (heap_item){now, it.left, it.right})) return -1;
      continue;
    }
    if (now < tr->min_frequency || now <= 0) break;
    if (nb_tok__grow(tr->ctx, (void **)&L->merges, &L->cap_merges, (size_t)n + 1, sizeof *L->merges)) return -1;
    L->merges[n][0] = it.left;
    L->merges[n][1] = it.right;
    if (apply_merge(L, tr->words, pi, 256 + n, n)) return -1;
    n++;
  }
  return n;
}

/* Token bytes of id (< 256 + n) written by recursion on merges into out. */
static size_t token_bytes(const learn *L, int32_t id, uint8_t *out) {
  if (id < 256) {
    out[0] = (uint8_t)id;
    return 1;
  }
  size_t k = token_bytes(L, L->merges[id - 256][0], out);
  return k + token_bytes(L, L->merges[id - 256][1], out + k);
}

static size_t token_len(const nb_tok *t, const learn *L, int32_t id) {
  if (id < 256) return 1;
  return t->tokens[L->merges[id - 256][0]].len + t->tokens[L->merges[id - 256][1]].len;
}

nb_tok *nb_tok_trainer_finish(nb_tok_trainer *tr) {
  if (!tr) return NULL;
  if (tr->done) return nb_errorf(tr->ctx, NB_ERR_INVALID_ARG, "nb_tok_trainer_finish: called twice"), NULL;
  tr->done = true;
  nb_tok *sp = tr->splitter;
  int32_t n_special = sp->n_added;
  learn L = {.ctx = tr->ctx};
  int32_t n = learn_merges(tr, &L, tr->vocab_size - 256 - n_special);
  nb_tok *t = n >= 0 ? nb_tok__create(tr->ctx, NB_TOK_BYTE_LEVEL) : NULL;
  nb_status r = t ? NB_OK : NB_ERR_NOMEM;
  uint8_t *buf = NULL;
  size_t cap = 0;
  for (int32_t id = 0; id < 256 + n && !r; id++) {
    size_t len = id < 256 ? 1 : token_len(t, &L, id);
    if ((r = nb_tok__grow(tr->ctx, (void **)&buf, &cap, len, 1))) break;
    token_bytes(&L, id, buf);
    r = nb_tok__set_token(t, id, buf, len, 0, "trainer");
  }
  for (int32_t i = 0; i < n_special && !r; i++) { /* the splitter's added ids are 0..n_special-1 */
    const nb_tok__token *tk = &sp->tokens[i];
    r = nb_tok__set_token(t, 256 + n + i, sp->blob + tk->off, tk->len, NB_TOK__F_ADDED | NB_TOK__F_SPECIAL, "trainer");
  }
  if (!r) r = nb_tok__index(t, "trainer");
  for (int32_t i = 0; i < n && !r; i++) r = nb_tok__add_merge(t, L.merges[i][0], L.merges[i][1], i, "trainer");
  if (!r) r = nb_tok__set_pattern(t, sp->pattern, "trainer");
  if (!r) r = nb_tok__finish(t);
  if (buf) nb_dealloc(tr->ctx, buf, cap);
  learn_free(&L, tr->n_words ? tr->n_words : 1);
  if (r || n < 0) {
    nb_tok_destroy(t);
    return NULL;
  }
  return t;
}
