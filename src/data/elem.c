/* Elements and the small shared pieces of the data library: the worker error
 * channel, checksums (XXH3 via libxxhash, CRC32C in software), per-record
 * RNGs, id vectors and the byte-level tokenizer, stacking elements into
 * batches, and the LM inputs/targets split. Not here: datasets or files. */
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "data/internal.h"

_Thread_local nb_data__errslot *nb_data__tls_err;

nb_status nb_data__err(nb_ctx *ctx, nb_status s, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  nb_data__errslot *slot = nb_data__tls_err;
  if (slot) {
    slot->status = s;
    memcpy(slot->msg, buf, sizeof slot->msg);
    return s;
  }
  return nb_errorf(ctx, s, "%s", buf);
}

void nb_data__capture(nb_ctx *ctx, nb_status s, nb_data__errslot *slot) {
  if (slot->status != NB_OK) return;
  /* The failure was reported by the core or a user callback straight to the
   * context: take its message (best effort when workers fail at once). */
  slot->status = s;
  snprintf(slot->msg, sizeof slot->msg, "%s", nb_ctx_error(ctx));
}

uint64_t nb_data__mix64(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* ---- checksums ---------------------------------------------------------- */

const char *nb_data_checksum_name(nb_data_checksum c) {
  return c == NB_DATA_XXH3 ? "xxh3" : c == NB_DATA_CRC32C ? "crc32c" : "unknown";
}

bool nb_data_checksum_from_name(const char *name, nb_data_checksum *out) {
  if (!strcmp(name, "xxh3")) return *out = NB_DATA_XXH3, true;
  if (!strcmp(name, "crc32c")) return *out = NB_DATA_CRC32C, true;
  return false;
}

uint64_t nb_data_checksum_bytes(nb_data_checksum c, const void *p, size_t n) {
  if (c == NB_DATA_CRC32C) return nb_util__crc32c(p, n);
  return XXH3_64bits(p, n);
}

/* ---- rng ---------------------------------------------------------------- */

nb_data_rng nb_data_rng_make(uint64_t seed, uint64_t index) {
  nb_data_rng r;
  uint64_t x = nb_data__mix64(seed ^ nb_data__mix64(index ^ 0x5851f42d4c957f2dull));
  for (int i = 0; i < 4; i++) r.s[i] = x = nb_data__mix64(x);
  return r;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t nb_data_rng_next(nb_data_rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double nb_data_rng_uniform(nb_data_rng *r) { return (double)(nb_data_rng_next(r) >> 11) * 0x1.0p-53; }

uint64_t nb_data_rng_below(nb_data_rng *r, uint64_t n) {
  if (n == 0) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
  do x = nb_data_rng_next(r);
  while (x >= limit);
  return x % n;
}

/* ---- elements ----------------------------------------------------------- */

void nb_data_elem_clear(nb_ctx *ctx, nb_data_elem *e) {
  if (!e) return;
  if (e->bytes) nb_dealloc(ctx, e->bytes, e->len + 1);
  if (e->tree) nb_tree_destroy(e->tree);
  *e = (nb_data_elem)NB_DATA_ELEM_INIT;
}

nb_status nb_data_elem_set_bytes(nb_ctx *ctx, nb_data_elem *e, const void *data, size_t len) {
  nb_data_elem_clear(ctx, e);
  uint8_t *p = nb_alloc(ctx, len + 1);
  if (!p) return nb_data__err(ctx, NB_ERR_NOMEM, "out of memory for a %zu-byte element", len);
  if (len) memcpy(p, data, len);
  p[len] = 0;
  e->kind = NB_DATA_BYTES;
  e->bytes = p;
  e->len = len;
  return NB_OK;
}

void nb_data_elem_set_tree(nb_ctx *ctx, nb_data_elem *e, nb_tree *t) {
  nb_data_elem_clear(ctx, e);
  e->kind = NB_DATA_TREE;
  e->tree = t;
}

nb_status nb_data_elem_copy(nb_ctx *ctx, const nb_data_elem *src, nb_data_elem *dst) {
  if (src->kind == NB_DATA_BYTES) return nb_data_elem_set_bytes(ctx, dst, src->bytes, src->len);
  nb_data_elem_clear(ctx, dst);
  if (src->kind != NB_DATA_TREE) return NB_OK;
  nb_tree *t = nb_tree_copy(src->tree);
  if (!t) return nb_data__err(ctx, NB_ERR_NOMEM, "out of memory copying an element");
  nb_data_elem_set_tree(ctx, dst, t);
  return NB_OK;
}

bool nb_data_elem_equal(const nb_data_elem *a, const nb_data_elem *b) {
  if (a->kind != b->kind) return false;
  if (a->kind == NB_DATA_BYTES) return a->len == b->len && !memcmp(a->bytes, b->bytes, a->len);
  if (a->kind != NB_DATA_TREE) return true;
  size_t n = nb_tree_size(a->tree);
  if (n != nb_tree_size(b->tree)) return false;
  for (size_t i = 0; i < n; i++) {
    const nb_leaf *la = nb_tree_leaf(a->tree, i), *lb = nb_tree_leaf(b->tree, i);
    if (strcmp(nb_tree_path(a->tree, i), nb_tree_path(b->tree, i))) return false;
    if (la->kind != NB_LEAF_ARRAY || lb->kind != NB_LEAF_ARRAY || !nb_array_equal(la->array, lb->array)) return false;
  }
  return true;
}

/* ---- ids and tokenizers --------------------------------------------------- */

nb_status nb_data_ids_push(nb_data_ids *v, const int32_t *ids, size_t n) {
  if (v->len + n > v->cap) {
    size_t cap = v->cap ? v->cap : 256;
    while (cap < v->len + n) cap *= 2;
    int32_t *p = nb_alloc(v->ctx, cap * sizeof *p);
    if (!p) return nb_data__err(v->ctx, NB_ERR_NOMEM, "out of memory for %zu token ids", cap);
    if (v->len) memcpy(p, v->ids, v->len * sizeof *p);
    nb_dealloc(v->ctx, v->ids, v->cap * sizeof *p);
    v->ids = p;
    v->cap = cap;
  }
  if (n) memcpy(v->ids + v->len, ids, n * sizeof *ids);
  v->len += n;
  return NB_OK;
}

void nb_data_ids_free(nb_data_ids *v) {
  if (v->ids) nb_dealloc(v->ctx, v->ids, v->cap * sizeof *v->ids);
  v->ids = NULL;
  v->len = v->cap = 0;
}

static nb_status bytes_encode(void *ud, nb_ctx *ctx, const char *text, size_t len, nb_data_ids *out) {
  int32_t buf[512];
  for (size_t i = 0; i < len; i += 512) {
    size_t n = len - i < 512 ? len - i : 512;
    for (size_t j = 0; j < n; j++) buf[j] = (unsigned char)text[i + j];
    nb_status s = nb_data_ids_push(out, buf, n);
    if (s) return s;
  }
  return NB_OK;
}

nb_data_tokenizer nb_data_tokenizer_bytes(void) {
  return (nb_data_tokenizer){.encode = bytes_encode, .ud = NULL, .vocab_size = 256, .eos_id = -1};
}

nb_status nb_data__tokenize(nb_ctx *ctx, const nb_data_tokenizer *tok, const char *text, size_t len, nb_data_elem *out) {
  nb_data_ids ids = {.ctx = ctx};
  nb_status s = tok->encode(tok->ud, ctx, text, len, &ids);
  if (!s && tok->eos_id >= 0) s = nb_data_ids_push(&ids, &tok->eos_id, 1);
  nb_tree *t = NULL;
  nb_array *a = NULL;
  if (!s) {
    int64_t n = (int64_t)ids.len;
    a = nb_array_create(ctx, NB_I32, 1, &n, ids.ids);
    t = nb_tree_create(ctx);
    if (!a || !t || nb_tree_set_array(t, "tokens", a)) s = nb_data__err(ctx, NB_ERR_NOMEM, "out of memory tokenizing");
  }
  nb_array_release(a);
  nb_data_ids_free(&ids);
  if (s) return nb_tree_destroy(t), s;
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

/* ---- stacking ------------------------------------------------------------ */

/* Checks that all n elements are trees with the same paths, dtypes and ranks;
 * with pad, finds each element's length (shared first dim). */
static nb_status check_stackable(nb_ctx *ctx, nb_data_elem *elems, int64_t n, bool pad, const char *what,
                                 int64_t *lens) {
  const nb_tree *t0 = elems[0].tree;
  for (int64_t b = 0; b < n; b++) {
    if (elems[b].kind != NB_DATA_TREE)
      return nb_data__err(ctx, NB_ERR_INVALID_ARG, "%s: element %lld of the batch is %s, not a tree of arrays "
                          "(map bytes to arrays first, e.g. nb_data_map_tokenize)", what, (long long)b,
                          elems[b].kind == NB_DATA_BYTES ? "bytes" : "empty");
    const nb_tree *t = elems[b].tree;
    if (nb_tree_size(t) != nb_tree_size(t0))
      return nb_data__err(ctx, NB_ERR_SHAPE, "%s: element %lld has %zu leaves, element 0 has %zu", what, (long long)b,
                          nb_tree_size(t), nb_tree_size(t0));
    lens[b] = -1;
    for (size_t i = 0; i < nb_tree_size(t); i++) {
      const char *p = nb_tree_path(t, i);
      const nb_leaf *l = nb_tree_leaf(t, i), *l0 = nb_tree_leaf(t0, i);
      if (strcmp(p, nb_tree_path(t0, i)))
        return nb_data__err(ctx, NB_ERR_SHAPE, "%s: element %lld has leaf '%s' where element 0 has '%s'", what,
                            (long long)b, p, nb_tree_path(t0, i));
      if (l->kind != NB_LEAF_ARRAY || !nb_array_data(l->array))
        return nb_data__err(ctx, NB_ERR_INVALID_ARG, "%s: leaf '%s' is not a host array", what, p);
      nb_aval a = nb_array_aval(l->array), a0 = nb_array_aval(l0->array);
      char s1[96], s2[96];
      bool same = a.dtype == a0.dtype && a.shape.rank == a0.shape.rank;
      for (int k = pad ? 1 : 0; same && k < a.shape.rank; k++) same = a.shape.dims[k] == a0.shape.dims[k];
      if (!same)
        return nb_data__err(ctx, NB_ERR_SHAPE, "%s: leaf '%s' is %s in element %lld but %s in element 0%s", what, p,
                            nb_aval_str(&a, s1, sizeof s1), (long long)b, nb_aval_str(&a0, s2, sizeof s2),
                            pad ? "" : " (set pad to batch different lengths)");
      if (!pad || a.shape.rank == 0) continue;
      if (lens[b] >= 0 && lens[b] != a.shape.dims[0])
        return nb_data__err(ctx, NB_ERR_SHAPE, "%s: padding needs one length per element, but element %lld has "
                            "leaves of length %lld and %lld ('%s')", what, (long long)b, (long long)lens[b],
                            (long long)a.shape.dims[0], p);
      lens[b] = a.shape.dims[0];
    }
    if (lens[b] < 0) lens[b] = 0;
  }
  return NB_OK;
}

static nb_array *stack_leaf(nb_ctx *ctx, nb_data_elem *elems, int64_t n, size_t leaf, bool pad, int64_t L,
                            double pad_value) {
  nb_aval a0 = nb_array_aval(nb_tree_leaf(elems[0].tree, leaf)->array);
  int64_t dims[NB_MAX_RANK];
  if (a0.shape.rank >= NB_MAX_RANK) return nb_data__err(ctx, NB_ERR_SHAPE, "batch: leaf rank too large"), NULL;
  dims[0] = n;
  for (int k = 0; k < a0.shape.rank; k++) dims[k + 1] = a0.shape.dims[k];
  if (pad && a0.shape.rank > 0) dims[1] = L;
  nb_array *out = nb_array_empty(ctx, a0.dtype, a0.shape.rank + 1, dims);
  if (!out) return NULL;
  uint8_t *dst = nb_array_data_mut(out);
  size_t esz = nb_dtype_size(a0.dtype), row = nb_array_nbytes(out) / (size_t)(n ? n : 1);
  uint8_t padv[16];
  nb_convert_elements(a0.dtype, padv, NB_F64, &pad_value, 1);
  for (int64_t b = 0; b < n; b++) {
    const nb_array *x = nb_tree_leaf(elems[b].tree, leaf)->array;
    size_t nb = nb_array_nbytes(x);
    memcpy(dst + (size_t)b * row, nb_array_data(x), nb);
    for (size_t off = nb; off < row; off += esz) memcpy(dst + (size_t)b * row + off, padv, esz);
  }
  return out;
}

nb_status nb_data__stack(nb_ctx *ctx, nb_data_elem *elems, int64_t n, const nb_data_batch_opts *o, const char *what,
                         nb_data_elem *out) {
  bool pad = o && o->pad;
  int64_t *lens = nb_alloc(ctx, (size_t)n * sizeof *lens);
  if (!lens) return nb_data__err(ctx, NB_ERR_NOMEM, "%s: out of memory", what);
  nb_status s = check_stackable(ctx, elems, n, pad, what, lens);
  int64_t L = 0;
  for (int64_t b = 0; !s && b < n; b++) L = lens[b] > L ? lens[b] : L;
  if (!s && pad && o->pad_to > 0) {
    if (L > o->pad_to)
      s = nb_data__err(ctx, NB_ERR_SHAPE, "%s: an element of length %lld is longer than pad_to %lld", what,
                       (long long)L, (long long)o->pad_to);
    L = o->pad_to;
  }
  nb_tree *t = s ? NULL : nb_tree_create(ctx);
  if (!s && !t) s = NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(elems[0].tree); i++) {
    nb_array *a = stack_leaf(ctx, elems, n, i, pad, L, pad ? o->pad_value : 0);
    s = a ? nb_tree_set_array(t, nb_tree_path(elems[0].tree, i), a) : NB_ERR_NOMEM;
    nb_array_release(a);
  }
  if (!s && pad) {
    int64_t dims[2] = {n, L};
    nb_array *m = nb_array_empty(ctx, NB_BOOL, 2, dims);
    if (m) {
      uint8_t *d = nb_array_data_mut(m);
      for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < L; j++) d[b * L + j] = j < lens[b];
    }
    s = m ? nb_tree_set_array(t, "mask", m) : NB_ERR_NOMEM;
    nb_array_release(m);
  }
  nb_dealloc(ctx, lens, (size_t)n * sizeof *lens);
  if (s) {
    nb_tree_destroy(t);
    return s == NB_ERR_NOMEM ? nb_data__err(ctx, s, "%s: out of memory stacking %lld elements", what, (long long)n) : s;
  }
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

/* ---- lm targets ------------------------------------------------------------ */

static nb_array *shifted(nb_ctx *ctx, const nb_array *tok, int64_t shift) {
  nb_aval a = nb_array_aval(tok);
  int64_t last = a.shape.dims[a.shape.rank - 1], rows = nb_array_size(tok) / last;
  a.shape.dims[a.shape.rank - 1] = last - 1;
  nb_array *out = nb_array_empty(ctx, a.dtype, a.shape.rank, a.shape.dims);
  if (!out) return NULL;
  size_t esz = nb_dtype_size(a.dtype);
  const uint8_t *src = nb_array_data(tok);
  uint8_t *dst = nb_array_data_mut(out);
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + (size_t)(r * (last - 1)) * esz, src + (size_t)(r * last + shift) * esz, (size_t)(last - 1) * esz);
  return out;
}

nb_status nb_data_fn_lm_targets(void *ud, nb_ctx *ctx, nb_data_elem *e) {
  (void)ud;
  const nb_array *tok = e->kind == NB_DATA_TREE ? nb_tree_get_array(e->tree, "tokens") : NULL;
  if (!tok || nb_array_rank(tok) < 1 || nb_array_dims(tok)[nb_array_rank(tok) - 1] < 2 || !nb_array_data(tok))
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "lm_targets: the element needs a host leaf 'tokens' [..., T+1] "
                        "with T >= 1");
  nb_tree *t = nb_tree_create(ctx);
  nb_array *in = shifted(ctx, tok, 0), *tg = shifted(ctx, tok, 1);
  nb_status s = t && in && tg ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(e->tree); i++)
    if (strcmp(nb_tree_path(e->tree, i), "tokens")) s = nb_tree_set(t, nb_tree_path(e->tree, i), *nb_tree_leaf(e->tree, i));
  if (!s) s = nb_tree_set_array(t, "inputs", in);
  if (!s) s = nb_tree_set_array(t, "targets", tg);
  nb_array_release(in);
  nb_array_release(tg);
  if (s) {
    nb_tree_destroy(t);
    return nb_data__err(ctx, NB_ERR_NOMEM, "lm_targets: out of memory");
  }
  nb_data_elem_set_tree(ctx, e, t);
  return NB_OK;
}
