/* The tokenizer object: token table, bytes->id and pair->merge hash maps,
 * the GPT-2 byte alphabet, UTF-8 helpers and the public inspection calls.
 * Not here: file formats (load_*.c), encoding (encode.c), training. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "data/tokenizer/tok_internal.h"

nb_status nb_tok__grow(nb_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return NB_OK;
  size_t ncap = *cap ? *cap : 16;
  while (ncap < need) ncap *= 2;
  void *np = nb_alloc(ctx, ncap * elem);
  if (!np) return NB_ERR_NOMEM;
  if (*p) {
    memcpy(np, *p, *cap * elem);
    nb_dealloc(ctx, *p, *cap * elem);
  }
  *p = np;
  *cap = ncap;
  return NB_OK;
}

/* ---- GPT-2 byte alphabet ---- */

static bool printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

uint32_t nb_tok__byte_to_cp(uint8_t b) {
  if (printable_byte(b)) return b;
  int n = 0; /* rank of b among non-printable bytes */
  for (int i = 0; i < b; i++) n += !printable_byte(i);
  return 256u + (uint32_t)n;
}

int nb_tok__cp_to_byte(uint32_t cp) {
  if (cp < 256) return printable_byte((int)cp) ? (int)cp : -1;
  if (cp >= 256 + 68) return -1; /* 68 non-printable bytes */
  int n = (int)(cp - 256);
  for (int i = 0; i < 256; i++)
    if (!printable_byte(i) && n-- == 0) return i;
  return -1;
}

long nb_tok__unmap_bytes(const char *s, size_t n, uint8_t *out) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0, o = 0;
  while (i < n) {
    int l = nb_tok__utf8_len(u + i, n - i);
    if (l == 0 || l > 2) return -1; /* the alphabet lies below U+0800 */
    uint32_t cp = l == 1 ? u[i] : ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
    int b = nb_tok__cp_to_byte(cp);
    if (b < 0) return -1;
    out[o++] = (uint8_t)b;
    i += (size_t)l;
  }
  return (long)o;
}

size_t nb_tok__map_bytes(const uint8_t *b, size_t n, char *out) {
  static uint32_t table[256];
  static int ready; /* benign: every writer stores the same values */
  if (!ready) {
    for (int i = 0; i < 256; i++) table[i] = nb_tok__byte_to_cp((uint8_t)i);
    ready = 1;
  }
  size_t o = 0;
  for (size_t i = 0; i < n; i++) o += nb_tok__put_utf8(table[b[i]], (uint8_t *)out + o);
  return o;
}

/* ---- UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF) ---- */

int nb_tok__utf8_len(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
    return 4;
  }
  return 0;
}

size_t nb_tok__put_utf8(uint32_t cp, uint8_t *out) {
  if (cp < 0x80) {
    out[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | (cp >> 6));
    out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

size_t nb_tok__utf8_valid_prefix(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    while (i + 8 <= n) { /* ASCII fast path */
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) { i++; continue; }
    int l = nb_tok__utf8_len(s + i, n - i);
    if (!l) return i;
    i += (size_t)l;
  }
  return n;
}

/* ---- building ---- */

nb_tok *nb_tok__create(nb_ctx *ctx, nb_tok_kind kind) {
  nb_tok *t = nb_calloc(ctx, sizeof *t);
  if (!t) return NULL;
  t->ctx = ctx;
  t->kind = kind;
  t->unk_id = -1;
  t->id_limit = 1 << 24;
  t->blob = nb_alloc(ctx, 64); /* never NULL, so blob + off is always defined */
  t->blob_cap = 64;
  if (!t->blob) {
    nb_dealloc(ctx, t, sizeof *t);
    return NULL;
  }
  for (int i = 0; i < 256; i++) t->byte_token[i] = -1;
  return t;
}

nb_status nb_tok__set_token(nb_tok *t, int32_t id, const void *bytes, size_t len, uint8_t flags, const char *where) {
  if (id < 0 || id >= t->id_limit)
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: token id %d out of range [0, %d) (ids must be dense)", where, id, t->id_limit);
  if (len >= (1u << 20)) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: token %d is %zu bytes long", where, id, len);
  size_t need = (size_t)id + 1;
  if (need > (size_t)t->cap_tokens) {
    size_t cap = (size_t)t->cap_tokens, old = cap;
    if (nb_tok__grow(t->ctx, (void **)&t->tokens, &cap, need, sizeof *t->tokens)) return NB_ERR_NOMEM;
    memset(t->tokens + old, 0, (cap - old) * sizeof *t->tokens);
    t->cap_tokens = (int32_t)cap;
  }
  nb_tok__token *tk = &t->tokens[id];
  if (tk->flags & NB_TOK__F_PRESENT)
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: token id %d appears twice", where, id);
  if (nb_tok__grow(t->ctx, (void **)&t->blob, &t->blob_cap, t->blob_len + len, 1)) return NB_ERR_NOMEM;
  if (len) memcpy(t->blob + t->blob_len, bytes, len);
  tk->off = (uint32_t)t->blob_len;
  tk->len = (uint32_t)len;
  tk->flags = flags | NB_TOK__F_PRESENT;
  tk->byte_value = -1;
  t->blob_len += len;
  if (t->blob_len >= (1ull << 31)) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: vocabulary over 2 GiB", where);
  if (id >= t->n_tokens) t->n_tokens = id + 1;
  return NB_OK;
}

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

int32_t nb_tok__lookup(const nb_tok *t, const void *bytes, size_t len) {
  if (!t->vmap) return -1;
  size_t mask = t->vmap_cap - 1, i = (size_t)hash_bytes(bytes, len) & mask;
  for (;;) {
    int32_t v = t->vmap[i];
    if (!v) return -1;
    const nb_tok__token *tk = &t->tokens[v - 1];
    if (tk->len == len && memcmp(t->blob + tk->off, bytes, len) == 0) return v - 1;
    i = (i + 1) & mask;
  }
}

/* Parses "<0xNN>" (upper or lower case hex). */
static int parse_byte_piece(const uint8_t *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    int c = s[i], d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                     : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

nb_status nb_tok__index(nb_tok *t, const char *where) {
  size_t cap = 64;
  while (cap < (size_t)t->n_tokens * 2) cap *= 2;
  t->vmap = nb_calloc(t->ctx, cap * sizeof *t->vmap);
  if (!t->vmap) return NB_ERR_NOMEM;
  t->vmap_cap = cap;
  for (int32_t id = 0; id < t->n_tokens; id++) {
    nb_tok__token *tk = &t->tokens[id];
    if (!(tk->flags & NB_TOK__F_PRESENT) || (tk->flags & (NB_TOK__F_ADDED | NB_TOK__F_HIDDEN))) continue;
    const uint8_t *b = t->blob + tk->off;
    if (nb_tok__lookup(t, b, tk->len) >= 0) continue; /* duplicate bytes: the first id wins */
    size_t i = (size_t)hash_bytes(b, tk->len) & (cap - 1);
    while (t->vmap[i]) i = (i + 1) & (cap - 1);
    t->vmap[i] = id + 1;
    if (t->kind == NB_TOK_BYTE_LEVEL && tk->len == 1 && t->byte_token[b[0]] < 0) t->byte_token[b[0]] = id;
    if (t->kind == NB_TOK_CHAR_LEVEL) {
      int bv = parse_byte_piece(b, tk->len);
      if (bv >= 0) {
        tk->byte_value = (int16_t)bv;
        tk->flags |= NB_TOK__F_BYTE;
        if (t->byte_token[bv] < 0) t->byte_token[bv] = id;
      }
    }
  }
  t->all_bytes = true;
  for (int i = 0; i < 256; i++) t->all_bytes &= t->byte_token[i] >= 0;
  (void)where;
  return NB_OK;
}

static nb_status merges_reserve(nb_tok *t, size_t n) {
  if (t->merges) return NB_OK;
  size_t cap = 64;
  while (cap < n * 2 + 2) cap *= 2;
  t->merges = nb_alloc(t->ctx, cap * sizeof *t->merges);
  if (!t->merges) return NB_ERR_NOMEM;
  for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
  t->merges_cap = cap;
  return NB_OK;
}

static nb_status merges_rehash(nb_tok *t) {
  nb_tok__merge *old = t->merges;
  size_t ocap = t->merges_cap;
  t->merges = NULL;
  if (merges_reserve(t, ocap)) return (t->merges = old), NB_ERR_NOMEM;
  for (size_t i = 0; i < ocap; i++) {
    if (old[i].key == UINT64_MAX) continue;
    size_t mask = t->merges_cap - 1, j = (size_t)((old[i].key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
    while (t->merges[j].key != UINT64_MAX) j = (j + 1) & mask;
    t->merges[j] = old[i];
  }
  nb_dealloc(t->ctx, old, ocap * sizeof *old);
  return NB_OK;
}

nb_status nb_tok__add_merge(nb_tok *t, int32_t left, int32_t right, int32_t rank, const char *where) {
  if (merges_reserve(t, 1024)) return NB_ERR_NOMEM;
  if ((size_t)(t->n_merges + 1) * 2 > t->merges_cap && merges_rehash(t)) return NB_ERR_NOMEM;
  if (left < 0 || right < 0 || left >= t->n_tokens || right >= t->n_tokens)
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: merge of unknown ids %d, %d", where, left, right);
  const nb_tok__token *a = &t->tokens[left], *b = &t->tokens[right];
  size_t n = (size_t)a->len + b->len;
  uint8_t stack[256];
  uint8_t *buf = n <= sizeof stack ? stack : nb_alloc(t->ctx, n);
  if (!buf) return NB_ERR_NOMEM;
  memcpy(buf, t->blob + a->off, a->len);
  memcpy(buf + a->len, t->blob + b->off, b->len);
  int32_t result = nb_tok__lookup(t, buf, n);
  if (result < 0) result = nb_tok__added_id(t, buf, n); /* e.g. "<" + "/s>" = an added "</s>" */
  if (buf != stack) nb_dealloc(t->ctx, buf, n);
  if (result < 0) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: the merge's result is not in the vocabulary", where);
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  size_t mask = t->merges_cap - 1, i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
  while (t->merges[i].key != UINT64_MAX) {
    if (t->merges[i].key == key) return NB_OK; /* duplicate merge: the first (best) rank stays */
    i = (i + 1) & mask;
  }
  t->merges[i] = (nb_tok__merge){key, rank >= 0 ? rank : t->n_merges, result};
  t->n_merges++;
  return NB_OK;
}

nb_status nb_tok__derive_merges(nb_tok *t, const int32_t *rank_of, const char *where) {
  for (int32_t id = 0; id < t->n_tokens; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    if (!(tk->flags & NB_TOK__F_PRESENT) || (tk->flags & (NB_TOK__F_ADDED | NB_TOK__F_BYTE | NB_TOK__F_HIDDEN))) continue;
    if (nb_tok__lookup(t, t->blob + tk->off, tk->len) != id) continue;
    const uint8_t *b = t->blob + tk->off;
    for (uint32_t k = 1; k < tk->len; k++) {
      if (t->kind == NB_TOK_CHAR_LEVEL && (b[k] & 0xC0) == 0x80) continue; /* split at chars only */
      int32_t l = nb_tok__lookup(t, b, k), r = nb_tok__lookup(t, b + k, tk->len - k);
      if (l < 0 || r < 0) continue;
      if ((t->tokens[l].flags | t->tokens[r].flags) & NB_TOK__F_BYTE) continue;
      nb_status s = nb_tok__add_merge(t, l, r, rank_of ? rank_of[id] : id, where);
      if (s) return s;
    }
  }
  return NB_OK;
}

nb_status nb_tok__set_pattern(nb_tok *t, const char *pattern, const char *where) {
  size_t n = strlen(pattern);
  t->pattern = nb_alloc(t->ctx, n + 1);
  if (!t->pattern) return NB_ERR_NOMEM;
  memcpy(t->pattern, pattern, n + 1);
  int err;
  PCRE2_SIZE off;
  t->re = pcre2_compile((PCRE2_SPTR)pattern, n, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &off, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: pattern does not compile at offset %zu: %s", where, (size_t)off,
                     (const char *)msg);
  }
  t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
  return NB_OK;
}

static int cmp_added_len(const void *a, const void *b, void *ud) {
  const nb_tok *t = ud;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  uint32_t lx = t->tokens[x].len, ly = t->tokens[y].len;
  if (lx != ly) return lx > ly ? -1 : 1;
  return x < y ? -1 : x > y;
}

nb_status nb_tok__finish(nb_tok *t) {
  int32_t n = 0;
  for (int32_t id = 0; id < t->n_tokens; id++)
    if ((t->tokens[id].flags & NB_TOK__F_ADDED) && t->tokens[id].len > 0) n++;
  if (n) {
    t->added = nb_alloc(t->ctx, (size_t)n * sizeof *t->added);
    if (!t->added) return NB_ERR_NOMEM;
  }
  for (int32_t id = 0; id < t->n_tokens; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    if (!(tk->flags & NB_TOK__F_ADDED) || tk->len == 0) continue;
    t->added[t->n_added++] = id;
    uint8_t c = t->blob[tk->off];
    t->added_first[c >> 3] |= (uint8_t)(1u << (c & 7));
  }
  if (t->n_added > 1) qsort_r(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added_len, t);
  return NB_OK;
}

void nb_tok_destroy(nb_tok *t) {
  if (!t) return;
  nb_ctx *ctx = t->ctx;
  nb_dealloc(ctx, t->tokens, (size_t)t->cap_tokens * sizeof *t->tokens);
  nb_dealloc(ctx, t->blob, t->blob_cap);
  nb_dealloc(ctx, t->vmap, t->vmap_cap * sizeof *t->vmap);
  nb_dealloc(ctx, t->merges, t->merges_cap * sizeof *t->merges);
  if (t->pattern) nb_dealloc(ctx, t->pattern, strlen(t->pattern) + 1);
  if (t->re) pcre2_code_free(t->re);
  nb_dealloc(ctx, t->added, (size_t)t->n_added * sizeof *t->added);
  if (t->scores) nb_dealloc(ctx, t->scores, (size_t)t->n_tokens * sizeof *t->scores);
  if (t->sorted) nb_dealloc(ctx, t->sorted, (size_t)t->n_sorted * sizeof *t->sorted);
  if (t->spm_trie) nb_dealloc(ctx, t->spm_trie, t->spm_trie_n * 4);
  if (t->spm_strs) nb_dealloc(ctx, t->spm_strs, t->spm_strs_len);
  nb_dealloc(ctx, t, sizeof *t);
}

/* ---- inspection ---- */

nb_ctx *nb_tok_ctx(const nb_tok *t) { return t->ctx; }
nb_tok_kind nb_tok_get_kind(const nb_tok *t) { return t->kind; }
int32_t nb_tok_vocab_size(const nb_tok *t) { return t->n_tokens; }
int32_t nb_tok_num_merges(const nb_tok *t) { return t->n_merges; }
const char *nb_tok_pattern(const nb_tok *t) { return t->pattern; }
bool nb_tok_covers_all_bytes(const nb_tok *t) { return t->all_bytes; }
bool nb_tok_has_normalizer(const nb_tok *t) { return t->n_norm > 0 || t->spm_trie_n > 0 || t->spm_remove_extra; }

const uint8_t *nb_tok_token_bytes(const nb_tok *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->n_tokens || !(t->tokens[id].flags & NB_TOK__F_PRESENT)) return NULL;
  if (len) *len = t->tokens[id].len;
  return t->blob + t->tokens[id].off;
}

int32_t nb_tok_token_id(const nb_tok *t, const void *bytes, size_t len) { return nb_tok__lookup(t, bytes, len); }

int32_t nb_tok__added_id(const nb_tok *t, const void *bytes, size_t len) {
  for (int32_t id = 0; id < t->n_tokens; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    if ((tk->flags & NB_TOK__F_ADDED) && tk->len == len && memcmp(t->blob + tk->off, bytes, len) == 0) return id;
  }
  return -1;
}

int32_t nb_tok_added_id(const nb_tok *t, const char *content) {
  size_t n = strlen(content);
  for (int32_t i = 0; i < t->n_added; i++) {
    const nb_tok__token *tk = &t->tokens[t->added[i]];
    if (tk->len == n && memcmp(t->blob + tk->off, content, n) == 0) return t->added[i];
  }
  return -1;
}

bool nb_tok_is_special(const nb_tok *t, int32_t id) {
  return id >= 0 && id < t->n_tokens && (t->tokens[id].flags & NB_TOK__F_SPECIAL);
}
int32_t nb_tok_num_added(const nb_tok *t) { return t->n_added; }
int32_t nb_tok_added_at(const nb_tok *t, int32_t i) { return i >= 0 && i < t->n_added ? t->added[i] : -1; }

static int by_rank(const void *a, const void *b) {
  const nb_tok__merge *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return (x->key > y->key) - (x->key < y->key);
}

nb_status nb_tok_merges(const nb_tok *t, int32_t *pairs, size_t cap) {
  size_t n = (size_t)t->n_merges, k = 0;
  nb_tok__merge *all = nb_alloc(t->ctx, (n + 1) * sizeof *all);
  if (!all) return NB_ERR_NOMEM;
  for (size_t i = 0; t->merges && i < t->merges_cap; i++)
    if (t->merges[i].key != UINT64_MAX && k < n) all[k++] = t->merges[i];
  qsort(all, k, sizeof *all, by_rank);
  for (size_t r = 0; r < k && r < cap; r++) {
    pairs[2 * r] = (int32_t)(all[r].key >> 32);
    pairs[2 * r + 1] = (int32_t)(uint32_t)all[r].key;
  }
  nb_dealloc(t->ctx, all, (n + 1) * sizeof *all);
  return NB_OK;
}
