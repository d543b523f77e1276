/* Map dataset sources: record files (many as one), token-shard windows, text
 * and JSONL lines, in-memory arrays and a user callback. Index i past len
 * wraps (i % len): later epochs re-read the same source. Not here: the
 * transforms (map_ops.c) or the file formats themselves. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"

/* Index of the last cum[k] <= i among cum[0..n) (cum[0] = 0, rising). */
static int find_part(const int64_t *cum, int n, int64_t i) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (cum[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* ---- record files ------------------------------------------------------------ */

typedef struct records_impl {
  int n;
  nb_data_rec_reader **readers;
  int64_t *cum; /* first record of each file */
} records_impl;

static nb_status records_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const records_impl *r = ds->impl;
  int64_t j = i % ds->len;
  int k = find_part(r->cum, r->n, j);
  while (k + 1 < r->n && r->cum[k + 1] <= j) k++; /* skip empty files */
  return nb_data_rec_read(r->readers[k], j - r->cum[k], out);
}

static void records_destroy(nb_data_map *ds) {
  records_impl *r = ds->impl;
  for (int k = 0; r->readers && k < r->n; k++) nb_data_rec_close(r->readers[k]);
  nb_dealloc(ds->ctx, r->readers, (size_t)r->n * sizeof *r->readers);
  nb_dealloc(ds->ctx, r->cum, (size_t)r->n * sizeof *r->cum);
}

static const nb_data__map_ops records_ops = {"records", records_get, records_destroy};

nb_data_map *nb_data_map_records(nb_ctx *ctx, int n, const char *const *paths) {
  if (n < 1 || !paths) return nb_data__err(ctx, NB_ERR_INVALID_ARG, "records: need at least one path"), NULL;
  nb_data_map *ds = nb_data__map_new(ctx, &records_ops, NULL, 0, sizeof(records_impl));
  if (!ds) return NULL;
  records_impl *r = ds->impl;
  r->readers = nb_calloc(ctx, (size_t)n * sizeof *r->readers);
  r->cum = nb_calloc(ctx, (size_t)n * sizeof *r->cum);
  if (!r->readers || !r->cum) return nb_data_map_release(ds), NULL;
  r->n = n;
  for (int k = 0; k < n; k++) {
    r->readers[k] = nb_data_rec_open(ctx, paths[k]);
    if (!r->readers[k]) return nb_data_map_release(ds), NULL;
    r->cum[k] = ds->len;
    ds->len += nb_data_rec_count(r->readers[k]);
  }
  return ds;
}

/* ---- token windows --------------------------------------------------------- */

typedef struct tokens_impl {
  int n;
  nb_data_shard **shards;
  int64_t *cum; /* first window of each shard */
  int64_t seq_len;
} tokens_impl;

static nb_status tokens_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const tokens_impl *t = ds->impl;
  int64_t j = i % ds->len, dim = t->seq_len + 1;
  int k = find_part(t->cum, t->n, j);
  while (k + 1 < t->n && t->cum[k + 1] <= j) k++;
  nb_array *a = nb_array_empty(ds->ctx, NB_I32, 1, &dim);
  nb_tree *tree = a ? nb_tree_create(ds->ctx) : NULL;
  nb_status s = tree ? NB_OK : nb_data__err(ds->ctx, NB_ERR_NOMEM, "tokens: out of memory for a window");
  if (!s) s = nb_data_shard_read(t->shards[k], (j - t->cum[k]) * t->seq_len, dim, nb_array_data_mut(a));
  if (!s) s = nb_tree_set_array(tree, "tokens", a);
  nb_array_release(a);
  if (s) return nb_tree_destroy(tree), s;
  nb_data_elem_set_tree(ds->ctx, out, tree);
  return NB_OK;
}

static void tokens_destroy(nb_data_map *ds) {
  tokens_impl *t = ds->impl;
  for (int k = 0; t->shards && k < t->n; k++) nb_data_shard_close(t->shards[k]);
  nb_dealloc(ds->ctx, t->shards, (size_t)t->n * sizeof *t->shards);
  nb_dealloc(ds->ctx, t->cum, (size_t)t->n * sizeof *t->cum);
}

static const nb_data__map_ops tokens_ops = {"tokens", tokens_get, tokens_destroy};

nb_data_map *nb_data_map_tokens(nb_ctx *ctx, int n, const char *const *paths, int64_t seq_len) {
  if (n < 1 || !paths || seq_len < 1)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "tokens: need at least one shard and seq_len >= 1 (got %d, %lld)", n,
                        (long long)seq_len), NULL;
  nb_data_map *ds = nb_data__map_new(ctx, &tokens_ops, NULL, 0, sizeof(tokens_impl));
  if (!ds) return NULL;
  tokens_impl *t = ds->impl;
  t->seq_len = seq_len;
  t->shards = nb_calloc(ctx, (size_t)n * sizeof *t->shards);
  t->cum = nb_calloc(ctx, (size_t)n * sizeof *t->cum);
  if (!t->shards || !t->cum) return nb_data_map_release(ds), NULL;
  t->n = n;
  for (int k = 0; k < n; k++) {
    t->shards[k] = nb_data_shard_open(ctx, paths[k]);
    if (!t->shards[k]) return nb_data_map_release(ds), NULL;
    int64_t c = nb_data_shard_count(t->shards[k]);
    t->cum[k] = ds->len;
    ds->len += c > seq_len ? (c - 1) / seq_len : 0;
  }
  return ds;
}

/* ---- lines ------------------------------------------------------------------- */

typedef struct lines_impl {
  char *path, *field;
  const char *base; /* mapping */
  size_t size;
  int64_t *start, *line_no; /* [len + 1] starts (the last is the end), 1-based numbers */
} lines_impl;

static nb_status lines_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const lines_impl *l = ds->impl;
  int64_t j = i % ds->len;
  const char *p = l->base + l->start[j];
  size_t n = (size_t)(l->start[j + 1] - l->start[j]);
  while (n && (p[n - 1] == '\n' || p[n - 1] == '\r')) n--;
  if (!l->field) return nb_data_elem_set_bytes(ds->ctx, out, p, n);
  cJSON *doc = cJSON_ParseWithLength(p, n);
  if (!doc) return nb_data__err(ds->ctx, NB_ERR_FORMAT, "'%s' line %lld: not valid JSON", l->path, (long long)l->line_no[j]);
  const cJSON *v = cJSON_IsObject(doc) ? cJSON_GetObjectItemCaseSensitive(doc, l->field) : NULL;
  nb_status s;
  if (!v) {
    s = nb_data__err(ds->ctx, NB_ERR_FORMAT, "'%s' line %lld: no field '%s'", l->path, (long long)l->line_no[j], l->field);
  } else if (cJSON_IsString(v)) {
    s = nb_data_elem_set_bytes(ds->ctx, out, v->valuestring, strlen(v->valuestring));
  } else {
    char *txt = cJSON_PrintUnformatted(v);
    s = txt ? nb_data_elem_set_bytes(ds->ctx, out, txt, strlen(txt)) : nb_data__err(ds->ctx, NB_ERR_NOMEM, "out of memory");
    cJSON_free(txt);
  }
  cJSON_Delete(doc);
  return s;
}

static void lines_destroy(nb_data_map *ds) {
  lines_impl *l = ds->impl;
  if (l->base) munmap((void *)l->base, l->size);
  nb_strfree(ds->ctx, l->path);
  nb_strfree(ds->ctx, l->field);
  nb_dealloc(ds->ctx, l->start, (size_t)(ds->len + 1) * sizeof *l->start);
  nb_dealloc(ds->ctx, l->line_no, (size_t)(ds->len + 1) * sizeof *l->line_no);
}

static const nb_data__map_ops lines_ops = {"lines", lines_get, lines_destroy};

static bool blank(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\n') return false;
  return true;
}

/* Two passes over the mapping: count the lines, then record their starts. */
static nb_status index_lines(nb_data_map *ds, lines_impl *l) {
  int64_t count = 0;
  for (int pass = 0; pass < 2; pass++) {
    int64_t k = 0, no = 0;
    for (size_t at = 0; at < l->size;) {
      const char *nl = memchr(l->base + at, '\n', l->size - at);
      size_t end = nl ? (size_t)(nl - l->base) + 1 : l->size;
      no++;
      if (!(l->field && blank(l->base + at, end - at))) {
        if (pass) l->start[k] = (int64_t)at, l->line_no[k] = no;
        k++;
      }
      at = end;
    }
    if (pass) {
      l->start[k] = (int64_t)l->size;
      break;
    }
    count = k;
    l->start = nb_alloc(ds->ctx, (size_t)(count + 1) * sizeof *l->start);
    l->line_no = nb_alloc(ds->ctx, (size_t)(count + 1) * sizeof *l->line_no);
    ds->len = count;
    if (!l->start || !l->line_no) return NB_ERR_NOMEM;
  }
  return NB_OK;
}

nb_data_map *nb_data_map_lines(nb_ctx *ctx, const char *path, const char *jsonl_field) {
  nb_data_map *ds = nb_data__map_new(ctx, &lines_ops, NULL, 0, sizeof(lines_impl));
  if (!ds) return NULL;
  lines_impl *l = ds->impl;
  l->path = nb_strdup(ctx, path);
  l->field = jsonl_field ? nb_strdup(ctx, jsonl_field) : NULL;
  if (!l->path || (jsonl_field && !l->field)) return nb_data_map_release(ds), NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "lines: cannot open '%s': %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return nb_data_map_release(ds), NULL;
  }
  l->size = (size_t)st.st_size;
  void *m = l->size ? mmap(NULL, l->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (m == MAP_FAILED) {
    nb_data__err(ctx, NB_ERR_IO, "lines: cannot map '%s': %s", path, strerror(errno));
    l->size = 0;
    return nb_data_map_release(ds), NULL;
  }
  l->base = m;
  if (index_lines(ds, l)) return nb_data_map_release(ds), NULL;
  return ds;
}

/* ---- in-memory arrays -------------------------------------------------------- */

typedef struct arrays_impl {
  nb_tree *tree;
} arrays_impl;

static nb_status arrays_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const nb_tree *src = ((const arrays_impl *)ds->impl)->tree;
  int64_t j = i % ds->len;
  nb_tree *t = nb_tree_create(ds->ctx);
  nb_status s = t ? NB_OK : NB_ERR_NOMEM;
  for (size_t k = 0; !s && k < nb_tree_size(src); k++) {
    const nb_array *a = nb_tree_leaf(src, k)->array;
    size_t row = nb_array_nbytes(a) / (size_t)ds->len;
    nb_array *e = nb_array_create(ds->ctx, nb_array_dtype(a), nb_array_rank(a) - 1, nb_array_dims(a) + 1,
                                  (const uint8_t *)nb_array_data(a) + (size_t)j * row);
    s = e ? nb_tree_set_array(t, nb_tree_path(src, k), e) : NB_ERR_NOMEM;
    nb_array_release(e);
  }
  if (s) {
    nb_tree_destroy(t);
    return nb_data__err(ds->ctx, s, "arrays: out of memory for element %lld", (long long)j);
  }
  nb_data_elem_set_tree(ds->ctx, out, t);
  return NB_OK;
}

static void arrays_destroy(nb_data_map *ds) { nb_tree_destroy(((arrays_impl *)ds->impl)->tree); }

static const nb_data__map_ops arrays_ops = {"arrays", arrays_get, arrays_destroy};

nb_data_map *nb_data_map_arrays(nb_ctx *ctx, const nb_tree *arrays) {
  if (!arrays || nb_tree_size(arrays) == 0)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "arrays: need a tree with at least one array"), NULL;
  int64_t n = -1;
  for (size_t k = 0; k < nb_tree_size(arrays); k++) {
    const nb_leaf *l = nb_tree_leaf(arrays, k);
    const char *p = nb_tree_path(arrays, k);
    if (l->kind != NB_LEAF_ARRAY || !nb_array_data(l->array) || nb_array_rank(l->array) < 1)
      return nb_data__err(ctx, NB_ERR_INVALID_ARG, "arrays: leaf '%s' must be a host array of rank >= 1", p), NULL;
    int64_t d = nb_array_dims(l->array)[0];
    if (n >= 0 && d != n)
      return nb_data__err(ctx, NB_ERR_SHAPE, "arrays: leaf '%s' has %lld rows, the first leaf %lld", p, (long long)d,
                          (long long)n), NULL;
    n = d;
  }
  nb_data_map *ds = nb_data__map_new(ctx, &arrays_ops, NULL, n, sizeof(arrays_impl));
  if (!ds) return NULL;
  ((arrays_impl *)ds->impl)->tree = nb_tree_copy(arrays);
  if (!((arrays_impl *)ds->impl)->tree) return nb_data_map_release(ds), NULL;
  return ds;
}

/* ---- user callback ------------------------------------------------------------ */

typedef struct source_impl {
  nb_data_get_fn fn;
  void *ud;
} source_impl;

static nb_status source_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const source_impl *s = ds->impl;
  return s->fn(s->ud, ds->ctx, i % ds->len, out);
}

static const nb_data__map_ops source_ops = {"source", source_get, NULL};

nb_data_map *nb_data_map_source(nb_ctx *ctx, int64_t len, nb_data_get_fn fn, void *ud) {
  if (!fn || len < 0)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "source: need a function and len >= 0 (got %lld)", (long long)len), NULL;
  nb_data_map *ds = nb_data__map_new(ctx, &source_ops, NULL, len, sizeof(source_impl));
  if (ds) *(source_impl *)ds->impl = (source_impl){fn, ud};
  return ds;
}
