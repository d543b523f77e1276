/* Hugging Face safetensors: single files and sharded sets (an index JSON
 * mapping tensor names to files). A file is an 8-byte little-endian header
 * size N, N bytes of JSON ({name: {dtype, shape, data_offsets}, optional
 * __metadata__}), then the tensor bytes. The header is validated completely
 * (bounded size, known dtypes, offsets in range, no overlaps or holes, sizes
 * matching shapes) before any tensor byte is read, so a hostile file cannot
 * make us read out of bounds or allocate more than the file holds. Not here:
 * nabla's own checkpoint format. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/internal.h"

#define ST_MAX_HEADER ((uint64_t)100000000) /* the reference implementation's bound */
#define ST_MAX_INDEX ((size_t)64 << 20)

static const struct {
  const char *name;
  nb_dtype dtype;
} st_dtypes[] = {{"F32", NB_F32}, {"F64", NB_F64}, {"BF16", NB_BF16}, {"F16", NB_F16}, {"I8", NB_I8},
                 {"U8", NB_U8},   {"I32", NB_I32}, {"I64", NB_I64},   {"U32", NB_U32}, {"BOOL", NB_BOOL}};

static bool st_dtype_from(const char *s, nb_dtype *t) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
    if (!strcmp(st_dtypes[i].name, s)) return *t = st_dtypes[i].dtype, true;
  return false;
}

static const char *st_dtype_name(nb_dtype t) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
    if (st_dtypes[i].dtype == t) return st_dtypes[i].name;
  return NULL;
}

/* ---- the parsed header ----------------------------------------------------- */

typedef struct st_tensor {
  const char *name;   /* points into the cJSON tree */
  nb_dtype dtype;
  nb_shape shape;
  uint64_t begin, end; /* relative to the data section */
} st_tensor;

typedef struct st_header {
  nb_ctx *ctx;
  cJSON *json;
  st_tensor *t;
  size_t n;
  uint64_t data_start; /* 8 + N */
  const cJSON *metadata;
} st_header;

static void header_free(st_header *h) {
  if (h->t) nb_dealloc(h->ctx, h->t, h->n * sizeof *h->t + 1);
  cJSON_Delete(h->json);
  memset(h, 0, sizeof *h);
}

static nb_status st_bad(nb_ctx *ctx, const char *what, const char *tensor, const char *why) {
  if (tensor) return nb_errorf(ctx, NB_ERR_FORMAT, "safetensors '%s': tensor '%s': %s", what, tensor, why);
  return nb_errorf(ctx, NB_ERR_FORMAT, "safetensors '%s': %s", what, why);
}

static nb_status parse_tensor(nb_ctx *ctx, const char *what, const cJSON *j, uint64_t data_size, st_tensor *t) {
  t->name = j->string;
  if (!cJSON_IsObject(j)) return st_bad(ctx, what, t->name, "entry is not an object");
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype"), *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
  if (!cJSON_IsString(dt)) return st_bad(ctx, what, t->name, "'dtype' is not a string");
  if (!st_dtype_from(dt->valuestring, &t->dtype))
    return nb_errorf(ctx, NB_ERR_DTYPE, "safetensors '%s': tensor '%s': dtype %.16s is not supported", what, t->name,
                     dt->valuestring);
  int rank = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
  if (rank < 0 || rank > NB_MAX_RANK) return st_bad(ctx, what, t->name, "'shape' is not an array of at most 8 dims");
  uint64_t bytes = nb_dtype_size(t->dtype);
  t->shape.rank = rank;
  int i = 0;
  for (const cJSON *d = shape->child; d; d = d->next, i++) {
    if (!cJSON_IsNumber(d) || !nb_ckpt__json_int(d->valuedouble, 0, &t->shape.dims[i]))
      return st_bad(ctx, what, t->name, "a dim is not an integer >= 0");
    if (t->shape.dims[i] && bytes > data_size / (uint64_t)t->shape.dims[i])
      return st_bad(ctx, what, t->name, "shape is larger than the file");
    bytes *= (uint64_t)t->shape.dims[i];
  }
  int64_t b, e;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !cJSON_IsNumber(offs->child) ||
      !cJSON_IsNumber(offs->child->next) || !nb_ckpt__json_int(offs->child->valuedouble, 0, &b) ||
      !nb_ckpt__json_int(offs->child->next->valuedouble, 0, &e))
    return st_bad(ctx, what, t->name, "'data_offsets' is not two integers >= 0");
  if (b > e || (uint64_t)e > data_size) return st_bad(ctx, what, t->name, "'data_offsets' out of the data section");
  if ((uint64_t)(e - b) != bytes) return st_bad(ctx, what, t->name, "'data_offsets' size does not match shape and dtype");
  t->begin = (uint64_t)b;
  t->end = (uint64_t)e;
  return NB_OK;
}

static int by_offset(const void *a, const void *b) {
  const st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* The tensors must tile the data section exactly: sorted by offset, each
 * begins where the previous ended, the last ends at the section's end. */
static nb_status check_layout(nb_ctx *ctx, const char *what, st_header *h, uint64_t data_size) {
  if (h->n) qsort(h->t, h->n, sizeof *h->t, by_offset);
  uint64_t at = 0;
  for (size_t i = 0; i < h->n; i++) {
    if (h->t[i].begin < at) return st_bad(ctx, what, h->t[i].name, "data overlaps the previous tensor's");
    if (h->t[i].begin > at) return st_bad(ctx, what, h->t[i].name, "a hole precedes the tensor's data");
    at = h->t[i].end;
  }
  if (at != data_size) return st_bad(ctx, what, NULL, "the data section has bytes no tensor covers");
  return NB_OK;
}

static nb_status check_metadata_obj(nb_ctx *ctx, const char *what, const cJSON *m) {
  if (!cJSON_IsObject(m)) return st_bad(ctx, what, NULL, "__metadata__ is not an object");
  for (const cJSON *e = m->child; e; e = e->next)
    if (!cJSON_IsString(e)) return st_bad(ctx, what, NULL, "__metadata__ values must be strings");
  return NB_OK;
}

/* Parses header bytes hdr[0..len) of a file whose data section has
 * data_size bytes. */
static nb_status parse_header(nb_ctx *ctx, const char *what, const char *hdr, size_t len, uint64_t data_size,
                              st_header *h) {
  memset(h, 0, sizeof *h);
  h->ctx = ctx;
  h->data_start = 8 + (uint64_t)len;
  const char *end = NULL;
  h->json = cJSON_ParseWithLengthOpts(hdr, len, &end, false);
  if (!h->json || !cJSON_IsObject(h->json)) return st_bad(ctx, what, NULL, "header is not a JSON object");
  for (const char *p = end; p < hdr + len; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != 0)
      return st_bad(ctx, what, NULL, "header has bytes after its JSON object");
  size_t n = 0;
  for (const cJSON *e = h->json->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
  if (!(h->t = nb_calloc(ctx, n * sizeof *h->t + 1))) return NB_ERR_NOMEM;
  h->n = n;
  size_t i = 0;
  for (const cJSON *e = h->json->child; e; e = e->next) {
    nb_status s;
    if (!strcmp(e->string, "__metadata__")) {
      if (h->metadata) return st_bad(ctx, what, NULL, "__metadata__ given twice");
      s = check_metadata_obj(ctx, what, e);
      h->metadata = e;
    } else {
      s = parse_tensor(ctx, what, e, data_size, &h->t[i++]);
    }
    if (s != NB_OK) return s;
  }
  return check_layout(ctx, what, h, data_size);
}

/* Validates the 8-byte prefix against the file size; *hdr_len = N. */
static nb_status check_prefix(nb_ctx *ctx, const char *what, const uint8_t *prefix, uint64_t file_size,
                              size_t *hdr_len) {
  if (file_size < 8) return st_bad(ctx, what, NULL, "shorter than the 8-byte header size");
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | prefix[i];
  if (n > ST_MAX_HEADER) return st_bad(ctx, what, NULL, "header size exceeds 100 MB");
  if (n > file_size - 8) return st_bad(ctx, what, NULL, "header size exceeds the file");
  *hdr_len = (size_t)n;
  return NB_OK;
}

/* ---- names <-> paths ------------------------------------------------------------ */

/* Tensor name -> tree path into buf[NB_CKPT__PATH_CAP]. */
static nb_status name_to_path(nb_ctx *ctx, const char *what, const char *name, bool hf, char *buf) {
  if (nb_ckpt__pathf(ctx, buf, "%s", name) != NB_OK) return st_bad(ctx, what, NULL, "a tensor name is too long");
  if (hf)
    for (char *c = buf; *c; c++)
      if (*c == '.') *c = '/';
  if (!nb_ckpt__valid_tree_path(buf))
    return st_bad(ctx, what, name, "name is not a valid tree path (empty, or an empty component)");
  return NB_OK;
}

static nb_status path_to_name(nb_ctx *ctx, const char *path, bool hf, char *buf) {
  if (nb_ckpt__pathf(ctx, buf, "%s", path) != NB_OK) return NB_ERR_INVALID_ARG;
  if (!hf) return NB_OK;
  if (strchr(buf, '.'))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "tree path '%s' has a '.': ambiguous as a dotted tensor name", path);
  for (char *c = buf; *c; c++)
    if (*c == '/') *c = '.';
  return NB_OK;
}

static char *metadata_text(nb_ctx *ctx, const cJSON *m) {
  if (!m) return NULL;
  char *txt = cJSON_PrintUnformatted(m);
  if (!txt) return nb_errorf(ctx, NB_ERR_NOMEM, "out of memory printing metadata"), NULL;
  char *out = nb_strdup(ctx, txt);
  cJSON_free(txt);
  return out;
}

/* ---- loading --------------------------------------------------------------------- */

/* Builds the tree: arrays wrap the mapping, or copy out of base. */
static nb_tree *tensors_to_tree(nb_ctx *ctx, const char *what, const st_header *h, nb_ckpt__map *map,
                                const uint8_t *base, bool hf) {
  nb_tree *t = nb_tree_create(ctx);
  nb_status s = t ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; s == NB_OK && i < h->n; i++) {
    const st_tensor *x = &h->t[i];
    char path[NB_CKPT__PATH_CAP];
    if ((s = name_to_path(ctx, what, x->name, hf, path)) != NB_OK) break;
    if (nb_tree_find(t, path) >= 0) {
      s = st_bad(ctx, what, x->name, "name given twice");
      break;
    }
    uint64_t off = h->data_start + x->begin;
    nb_array *a = map ? nb_ckpt__map_array(ctx, map, off, x->dtype, &x->shape)
                      : nb_array_create(ctx, x->dtype, x->shape.rank, x->shape.dims, base + off);
    s = a ? nb_tree_set_array(t, path, a) : nb_ctx_status(ctx);
    nb_array_release(a);
  }
  if (s != NB_OK) {
    nb_tree_destroy(t);
    return NULL;
  }
  return t;
}

nb_tree *nb_ckpt_safetensors_parse(nb_ctx *ctx, const void *data, size_t size, const nb_ckpt_st_opts *opts,
                                   char **metadata_json) {
  const uint8_t *p = data;
  size_t len = 0;
  if (metadata_json) *metadata_json = NULL;
  if (!p && size) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_safetensors_parse: data is NULL"), NULL;
  if (check_prefix(ctx, "(memory)", p, size, &len) != NB_OK) return NULL;
  st_header h;
  nb_tree *t = NULL;
  if (parse_header(ctx, "(memory)", (const char *)p + 8, len, size - 8 - len, &h) == NB_OK)
    t = tensors_to_tree(ctx, "(memory)", &h, NULL, p, opts && opts->hf_names);
  if (t && metadata_json && h.metadata && !(*metadata_json = metadata_text(ctx, h.metadata))) {
    nb_tree_destroy(t);
    t = NULL;
  }
  header_free(&h);
  return t;
}

static nb_tree *load_file(nb_ctx *ctx, const char *path, const nb_ckpt_st_opts *o, char **metadata_json) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    nb_errorf(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return NULL;
  }
  uint64_t size = (uint64_t)st.st_size;
  uint8_t prefix[8] = {0};
  size_t len = 0;
  char *hdr = NULL;
  nb_status s = nb_ckpt__pread_all(ctx, fd, prefix, size < 8 ? (size_t)size : 8, 0, path);
  if (s == NB_OK) s = check_prefix(ctx, path, prefix, size, &len);
  if (s == NB_OK && !(hdr = nb_alloc(ctx, len + 1))) s = NB_ERR_NOMEM;
  if (s == NB_OK) s = nb_ckpt__pread_all(ctx, fd, hdr, len, 8, path);
  st_header h = {0};
  if (s == NB_OK) s = parse_header(ctx, path, hdr, len, size - 8 - len, &h);
  if (hdr) nb_dealloc(ctx, hdr, len + 1);
  nb_tree *t = NULL;
  if (s == NB_OK && o->no_mmap) {
    uint8_t *all = nb_alloc(ctx, (size_t)size);
    if (all && nb_ckpt__pread_all(ctx, fd, all, (size_t)size, 0, path) == NB_OK)
      t = tensors_to_tree(ctx, path, &h, NULL, all, o->hf_names);
    if (all) nb_dealloc(ctx, all, (size_t)size);
  } else if (s == NB_OK) {
    nb_ckpt__map *map = nb_ckpt__map_open(ctx, path, size);
    if (map) t = tensors_to_tree(ctx, path, &h, map, NULL, o->hf_names);
    nb_ckpt__map_release(map);
  }
  close(fd);
  if (t && metadata_json && h.metadata && !(*metadata_json = metadata_text(ctx, h.metadata))) {
    nb_tree_destroy(t);
    t = NULL;
  }
  header_free(&h);
  return t;
}

/* The shard files of an index, each loaded once (raw names as paths). */
typedef struct shard_set {
  nb_ctx *ctx;
  const char **names; /* borrowed from the index JSON */
  nb_tree **trees;
  size_t n, cap;
} shard_set;

static void shards_free(shard_set *ss) {
  for (size_t i = 0; i < ss->n; i++) nb_tree_destroy(ss->trees[i]);
  if (ss->cap) {
    nb_dealloc(ss->ctx, ss->names, ss->cap * sizeof *ss->names);
    nb_dealloc(ss->ctx, ss->trees, ss->cap * sizeof *ss->trees);
  }
}

/* The tree of shard file `name`, loading it on first use. */
static nb_tree *shard_tree(shard_set *ss, const char *dir, const char *name, const nb_ckpt_st_opts *o) {
  for (size_t i = 0; i < ss->n; i++)
    if (!strcmp(ss->names[i], name)) return ss->trees[i];
  if (ss->n == ss->cap) {
    size_t cap = ss->cap ? 2 * ss->cap : 16;
    const char **nn = nb_alloc(ss->ctx, cap * sizeof *nn);
    nb_tree **nt = nn ? nb_alloc(ss->ctx, cap * sizeof *nt) : NULL;
    if (!nt) {
      if (nn) nb_dealloc(ss->ctx, nn, cap * sizeof *nn);
      return NULL;
    }
    if (ss->n) memcpy(nn, ss->names, ss->n * sizeof *nn), memcpy(nt, ss->trees, ss->n * sizeof *nt);
    if (ss->cap) {
      nb_dealloc(ss->ctx, ss->names, ss->cap * sizeof *ss->names);
      nb_dealloc(ss->ctx, ss->trees, ss->cap * sizeof *ss->trees);
    }
    ss->names = nn, ss->trees = nt, ss->cap = cap;
  }
  char fpath[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ss->ctx, fpath, "%s/%s", dir, name) != NB_OK) return NULL;
  nb_ckpt_st_opts raw = *o;
  raw.hf_names = false;
  nb_tree *t = load_file(ss->ctx, fpath, &raw, NULL);
  if (!t) return NULL;
  ss->names[ss->n] = name;
  ss->trees[ss->n++] = t;
  return t;
}

/* A sharded set, in weight_map order: every entry found in its file, and
 * every tensor of every file listed in the weight map. */
static nb_tree *load_index(nb_ctx *ctx, const char *path, const nb_ckpt_st_opts *o, char **metadata_json) {
  char *txt, dir[NB_CKPT__PATH_CAP];
  size_t n;
  if (nb_ckpt__read_file(ctx, path, ST_MAX_INDEX, &txt, &n) != NB_OK) return NULL;
  cJSON *j = cJSON_ParseWithLength(txt, n);
  nb_dealloc(ctx, txt, n + 1);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  nb_status s = cJSON_IsObject(wm) ? NB_OK : st_bad(ctx, path, NULL, "index has no 'weight_map' object");
  nb_tree *out = s == NB_OK ? nb_tree_create(ctx) : NULL;
  shard_set ss = {ctx, NULL, NULL, 0, 0};
  size_t listed = 0;
  for (const cJSON *e = wm ? wm->child : NULL; s == NB_OK && e; e = e->next, listed++) {
    if (!cJSON_IsString(e) || !nb_ckpt__valid_file_name(e->valuestring)) {
      s = st_bad(ctx, path, e->string, "weight_map value is not a plain file name");
      break;
    }
    nb_tree *ft = shard_tree(&ss, dir, e->valuestring, o);
    nb_array *a = ft ? nb_tree_get_array(ft, e->string) : NULL;
    char p2[NB_CKPT__PATH_CAP];
    if (!ft) s = nb_ctx_status(ctx);
    else if (!a) s = nb_errorf(ctx, NB_ERR_FORMAT, "safetensors index '%s': tensor '%s' is not in '%s/%s'", path,
                               e->string, dir, e->valuestring);
    else if ((s = name_to_path(ctx, path, e->string, o->hf_names, p2)) == NB_OK) s = nb_tree_set_array(out, p2, a);
  }
  size_t loaded = 0;
  for (size_t i = 0; i < ss.n; i++) loaded += nb_tree_size(ss.trees[i]);
  if (s == NB_OK && (loaded != listed || nb_tree_size(out) != listed))
    s = st_bad(ctx, path, NULL, "the shard files hold tensors the weight_map does not list (or names repeat)");
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
  if (s == NB_OK && metadata_json && meta && !(*metadata_json = metadata_text(ctx, meta))) s = nb_ctx_status(ctx);
  shards_free(&ss);
  cJSON_Delete(j);
  if (s != NB_OK) {
    nb_tree_destroy(out);
    return NULL;
  }
  return out;
}

/* A file's kind by its bytes, whatever its name: an index
 * (model.safetensors.index.json) is a JSON object, '{' after white space; a
 * safetensors file opens with its header's length, 8 bytes little-endian,
 * whose first byte can be '{' too (a length of 123 + 256 k), but then that
 * length fits in the file, where JSON text read as one does not. */
static bool is_index(const char *path) {
  unsigned char head[8];
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  size_t n = fread(head, 1, sizeof head, f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  size_t i = 0;
  while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r')) i++;
  if (i == n || head[i] != '{') return false;
  if (n < 8) return true;
  uint64_t len = 0;
  for (int k = 7; k >= 0; k--) len = len << 8 | head[k];
  return size < 8 || len > (uint64_t)size - 8;
}

nb_tree *nb_ckpt_safetensors_load(nb_ctx *ctx, const char *path, const nb_ckpt_st_opts *opts, char **metadata_json) {
  static const nb_ckpt_st_opts defaults;
  const nb_ckpt_st_opts *o = opts ? opts : &defaults;
  if (metadata_json) *metadata_json = NULL;
  if (!path) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_safetensors_load: path is NULL"), NULL;
  struct stat st;
  if (stat(path, &st) != 0) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "'%s' does not exist", path), NULL;
  if (S_ISDIR(st.st_mode)) {
    char p[NB_CKPT__PATH_CAP];
    if (nb_ckpt__pathf(ctx, p, "%s/model.safetensors.index.json", path) != NB_OK) return NULL;
    if (nb_ckpt__exists(p)) return load_index(ctx, p, o, metadata_json);
    if (nb_ckpt__pathf(ctx, p, "%s/model.safetensors", path) != NB_OK) return NULL;
    if (nb_ckpt__exists(p)) return load_file(ctx, p, o, metadata_json);
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "'%s' holds neither model.safetensors.index.json nor model.safetensors",
                     path), NULL;
  }
  if (is_index(path)) return load_index(ctx, path, o, metadata_json); /* by its bytes, not its name */
  return load_file(ctx, path, o, metadata_json);
}

/* ---- writing --------------------------------------------------------------------- */

/* A growing text buffer for the header. */
typedef struct sbuf {
  nb_ctx *ctx;
  char *p;
  size_t n, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t k) {
  if (b->oom) return;
  if (b->n + k + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + k + 1) cap *= 2;
    char *p = nb_alloc(b->ctx, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    if (b->n) memcpy(p, b->p, b->n);
    if (b->p) nb_dealloc(b->ctx, b->p, b->cap);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, k);
  b->n += k;
  b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s) {
  sb_str(b, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') snprintf(esc, sizeof esc, "\\%c", *c);
    else if (*c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *c);
    else esc[0] = (char)*c, esc[1] = 0;
    sb_str(b, esc);
  }
  sb_str(b, "\"");
}

typedef struct st_out {
  char name[NB_CKPT__PATH_CAP];
  nb_array *a; /* borrowed */
  size_t idx;  /* position in the tree, for a stable sort */
  uint64_t begin;
} st_out;

/* Stable order by element size, largest first, so no padding is needed. */
static int by_elem_size(const void *a, const void *b) {
  const st_out *x = a, *y = b;
  size_t sx = nb_dtype_size(nb_array_dtype(x->a)), sy = nb_dtype_size(nb_array_dtype(y->a));
  if (sx != sy) return sx > sy ? -1 : 1;
  return (x->idx > y->idx) - (x->idx < y->idx);
}

static nb_status build_header(nb_ctx *ctx, st_out *ts, size_t n, const cJSON *meta, sbuf *b) {
  sb_str(b, "{");
  bool first = true;
  if (meta) {
    sb_str(b, "\"__metadata__\":{");
    for (const cJSON *e = meta->child; e; e = e->next) {
      if (e != meta->child) sb_str(b, ",");
      sb_json_string(b, e->string);
      sb_str(b, ":");
      sb_json_string(b, e->valuestring);
    }
    sb_str(b, "}");
    first = false;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    char num[64];
    nb_aval av = nb_array_aval(ts[i].a);
    if (!first) sb_str(b, ",");
    first = false;
    sb_json_string(b, ts[i].name);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, st_dtype_name(av.dtype));
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < av.shape.rank; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)av.shape.dims[d]);
      sb_str(b, num);
    }
    ts[i].begin = at;
    at += nb_array_nbytes(ts[i].a);
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)ts[i].begin,
             (unsigned long long)at);
    sb_str(b, num);
  }
  sb_str(b, "}");
  while ((8 + b->n) % 8) sb_str(b, " ");
  return b->oom ? NB_ERR_NOMEM : NB_OK;
}

static nb_status write_st(nb_ctx *ctx, const char *path, const sbuf *hdr, const st_out *ts, size_t n) {
  char tmp[NB_CKPT__PATH_CAP], dir[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, tmp, "%s.tmp", path) != NB_OK) return NB_ERR_INVALID_ARG;
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  int fd = nb_ckpt__io_tick() == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
  if (fd < 0) return nb_errorf(ctx, NB_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
  uint8_t prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)hdr->n >> (8 * i));
  nb_status s = nb_ckpt__write_all(ctx, fd, prefix, 8, tmp);
  if (s == NB_OK) s = nb_ckpt__write_all(ctx, fd, hdr->p, hdr->n, tmp);
  for (size_t i = 0; s == NB_OK && i < n; i++)
    s = nb_ckpt__write_all(ctx, fd, nb_array_data(ts[i].a), nb_array_nbytes(ts[i].a), tmp);
  if (s == NB_OK) s = nb_ckpt__fsync_fd(ctx, fd, tmp);
  close(fd);
  if (s == NB_OK) s = nb_ckpt__rename(ctx, tmp, path);
  if (s == NB_OK) s = nb_ckpt__fsync_dir(ctx, dir);
  if (s != NB_OK) unlink(tmp);
  return s;
}

static nb_status parse_user_metadata(nb_ctx *ctx, const char *json, cJSON **out) {
  *out = NULL;
  if (!json) return NB_OK;
  cJSON *m = cJSON_Parse(json);
  if (!m || check_metadata_obj(ctx, "(metadata argument)", m) != NB_OK) {
    cJSON_Delete(m);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "safetensors metadata must be a JSON object of string values");
  }
  *out = m;
  return NB_OK;
}

/* Writes leaves [lo, hi) of tree as one file. */
static nb_status save_range(nb_ctx *ctx, const char *path, const nb_tree *tree, size_t lo, size_t hi, const cJSON *meta,
                            bool hf) {
  size_t n = hi - lo;
  st_out *ts = nb_calloc(ctx, n * sizeof *ts + 1);
  if (!ts) return NB_ERR_NOMEM;
  nb_status s = NB_OK;
  for (size_t i = 0; s == NB_OK && i < n; i++) {
    const nb_leaf *l = nb_tree_leaf(tree, lo + i);
    const char *p = nb_tree_path(tree, lo + i);
    if (l->kind != NB_LEAF_ARRAY || !nb_array_data(l->array))
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "safetensors save: leaf '%s' is not a host array", p);
    else if ((s = path_to_name(ctx, p, hf, ts[i].name)) == NB_OK)
      ts[i].a = l->array, ts[i].idx = i;
  }
  if (s == NB_OK && n) qsort(ts, n, sizeof *ts, by_elem_size);
  sbuf hdr = {ctx, NULL, 0, 0, false};
  if (s == NB_OK) s = build_header(ctx, ts, n, meta, &hdr);
  if (s == NB_OK) s = write_st(ctx, path, &hdr, ts, n);
  if (hdr.p) nb_dealloc(ctx, hdr.p, hdr.cap);
  nb_dealloc(ctx, ts, n * sizeof *ts + 1);
  return s;
}

nb_status nb_ckpt_safetensors_save(nb_ctx *ctx, const char *path, const nb_tree *tree, const char *metadata_json,
                                   const nb_ckpt_st_opts *opts) {
  if (!path || !tree) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_safetensors_save: NULL path or tree");
  cJSON *meta;
  if (parse_user_metadata(ctx, metadata_json, &meta) != NB_OK) return NB_ERR_INVALID_ARG;
  nb_status s = save_range(ctx, path, tree, 0, nb_tree_size(tree), meta, opts && opts->hf_names);
  cJSON_Delete(meta);
  return s;
}

/* The index: {"metadata": {"total_size": N}, "weight_map": {name: file}}. */
static nb_status write_index(nb_ctx *ctx, const char *dir, const char *base, const nb_tree *tree, const size_t *shard_of,
                             size_t n_shards, bool hf) {
  sbuf b = {ctx, NULL, 0, 0, false};
  size_t total = 0;
  for (size_t i = 0; i < nb_tree_size(tree); i++) total += nb_array_nbytes(nb_tree_leaf(tree, i)->array);
  char num[64], name[NB_CKPT__PATH_CAP], file[NB_CKPT__PATH_CAP];
  snprintf(num, sizeof num, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {", total);
  sb_str(&b, num);
  nb_status s = NB_OK;
  for (size_t i = 0; s == NB_OK && i < nb_tree_size(tree); i++) {
    s = path_to_name(ctx, nb_tree_path(tree, i), hf, name);
    snprintf(file, sizeof file, "%s-%05zu-of-%05zu.safetensors", base, shard_of[i] + 1, n_shards);
    sb_str(&b, i ? ",\n    " : "\n    ");
    sb_json_string(&b, name);
    sb_str(&b, ": ");
    sb_json_string(&b, file);
  }
  sb_str(&b, "\n  }\n}\n");
  if (s == NB_OK && b.oom) s = NB_ERR_NOMEM;
  snprintf(file, sizeof file, "%s.safetensors.index.json", base);
  if (s == NB_OK) s = nb_ckpt__write_file_durable(ctx, dir, file, b.p, b.n);
  if (b.p) nb_dealloc(ctx, b.p, b.cap);
  return s;
}

nb_status nb_ckpt_safetensors_save_sharded(nb_ctx *ctx, const char *dir, const char *base, const nb_tree *tree,
                                           const char *metadata_json, size_t max_shard_bytes,
                                           const nb_ckpt_st_opts *opts) {
  if (!dir || !tree || max_shard_bytes == 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_safetensors_save_sharded: NULL dir/tree or zero shard size");
  if (!base) base = "model";
  if (!nb_ckpt__valid_file_name(base)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "invalid base name '%s'", base);
  bool hf = opts && opts->hf_names;
  size_t n = nb_tree_size(tree);
  for (size_t i = 0; i < n; i++)
    if (nb_tree_leaf(tree, i)->kind != NB_LEAF_ARRAY)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "safetensors save: leaf '%s' is not an array", nb_tree_path(tree, i));
  size_t *shard_of = nb_alloc(ctx, (n + 1) * sizeof *shard_of), n_shards = 0, bytes = 0;
  if (!shard_of) return NB_ERR_NOMEM;
  for (size_t i = 0; i < n; i++) { /* consecutive leaves, at most max_shard_bytes per shard */
    size_t k = nb_array_nbytes(nb_tree_leaf(tree, i)->array);
    if (n_shards == 0 || (bytes > 0 && bytes + k > max_shard_bytes)) n_shards++, bytes = 0;
    shard_of[i] = n_shards - 1;
    bytes += k;
  }
  cJSON *meta = NULL;
  nb_status s = nb_ckpt__mkdirs(ctx, dir);
  if (s == NB_OK) s = parse_user_metadata(ctx, metadata_json, &meta);
  for (size_t sh = 0, lo = 0; s == NB_OK && sh < n_shards; sh++) {
    size_t hi = lo;
    while (hi < n && shard_of[hi] == sh) hi++;
    char path[NB_CKPT__PATH_CAP];
    s = nb_ckpt__pathf(ctx, path, "%s/%s-%05zu-of-%05zu.safetensors", dir, base, sh + 1, n_shards);
    if (s == NB_OK) s = save_range(ctx, path, tree, lo, hi, meta, hf);
    lo = hi;
  }
  if (s == NB_OK) s = write_index(ctx, dir, base, tree, shard_of, n_shards, hf);
  cJSON_Delete(meta);
  nb_dealloc(ctx, shard_of, (n + 1) * sizeof *shard_of);
  return s;
}
