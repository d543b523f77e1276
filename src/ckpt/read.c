/* Reading a step: opening it (commit marker, manifest and its hash), choosing
 * which arrays to restore (items, path prefixes, a target tree), and
 * producing them — wrapped over a read-only mapping (the fast path) or read
 * into fresh arrays — with checksum verification. Arrays split into several
 * shards are assembled block by block. Not here: writing, or the manager. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/internal.h"

/* ---- opening ------------------------------------------------------------------ */

nb_ckpt_info *nb_ckpt_info_open(nb_ctx *ctx, const char *step_dir) {
  if (!step_dir) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_info_open: step_dir is NULL"), NULL;
  int64_t step;
  uint64_t mh;
  if (nb_ckpt__read_commit(ctx, step_dir, &step, &mh) != NB_OK) return NULL;
  char path[NB_CKPT__PATH_CAP], *txt;
  size_t n;
  if (nb_ckpt__pathf(ctx, path, "%s/%s", step_dir, NB_CKPT__MANIFEST) != NB_OK) return NULL;
  nb_status s = nb_ckpt__read_file(ctx, path, NB_CKPT__MAX_MANIFEST, &txt, &n);
  if (s == NB_ERR_NOT_FOUND) nb_errorf(ctx, NB_ERR_FORMAT, "manifest '%s' is missing", path);
  if (s != NB_OK) return NULL;
  if (nb_ckpt__xxh3(txt, n) != mh) {
    nb_dealloc(ctx, txt, n + 1);
    return nb_errorf(ctx, NB_ERR_FORMAT, "manifest '%s' is damaged: its checksum differs from the commit marker's",
                     path), NULL;
  }
  nb_ckpt_info *info = nb_ckpt__manifest_parse(ctx, txt, n, path);
  nb_dealloc(ctx, txt, n + 1);
  if (!info) return NULL;
  if (info->step != step) {
    nb_errorf(ctx, NB_ERR_FORMAT, "manifest '%s' is for step %lld, its commit marker for step %lld", path,
              (long long)info->step, (long long)step);
    nb_ckpt_info_destroy(info);
    return NULL;
  }
  if (!(info->dir = nb_strdup(ctx, step_dir))) {
    nb_ckpt_info_destroy(info);
    return NULL;
  }
  return info;
}

/* ---- data files, opened once per restore -------------------------------------- */

typedef struct data_file {
  const char *name;
  char path[NB_CKPT__PATH_CAP];
  nb_ckpt__map *map; /* mmap mode */
  int fd;            /* read mode */
  uint64_t size;
} data_file;

typedef struct reader {
  nb_ctx *ctx;
  const nb_ckpt_info *info;
  const nb_ckpt_restore_opts *opts;
  data_file *files;
  size_t n_files, cap_files;
} reader;

static nb_status open_file(reader *r, data_file *f) {
  nb_ctx *ctx = r->ctx;
  if (nb_ckpt__pathf(ctx, f->path, "%s/%s", r->info->dir, f->name) != NB_OK) return NB_ERR_INVALID_ARG;
  if (!r->opts->no_mmap) {
    if (!(f->map = nb_ckpt__map_open(ctx, f->path, 0))) return nb_ctx_status(ctx);
    f->size = nb_ckpt__map_size(f->map);
    return NB_OK;
  }
  f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (f->fd < 0 || fstat(f->fd, &st) != 0)
    return nb_errorf(ctx, errno == ENOENT ? NB_ERR_FORMAT : NB_ERR_IO, "cannot open data file '%s': %s", f->path,
                     strerror(errno));
  f->size = (uint64_t)st.st_size;
  return NB_OK;
}

static data_file *get_file(reader *r, const char *name) {
  for (size_t i = 0; i < r->n_files; i++)
    if (!strcmp(r->files[i].name, name)) return &r->files[i];
  if (r->n_files == r->cap_files) {
    size_t cap = r->cap_files ? 2 * r->cap_files : 8;
    data_file *f = nb_calloc(r->ctx, cap * sizeof *f);
    if (!f) return NULL;
    if (r->n_files) memcpy(f, r->files, r->n_files * sizeof *f);
    if (r->files) nb_dealloc(r->ctx, r->files, r->cap_files * sizeof *f);
    r->files = f;
    r->cap_files = cap;
  }
  data_file *f = &r->files[r->n_files++];
  f->name = name;
  f->fd = -1;
  return open_file(r, f) == NB_OK ? f : NULL;
}

static void close_files(reader *r) {
  for (size_t i = 0; i < r->n_files; i++) {
    nb_ckpt__map_release(r->files[i].map);
    if (r->files[i].fd >= 0) close(r->files[i].fd);
  }
  if (r->files) nb_dealloc(r->ctx, r->files, r->cap_files * sizeof *r->files);
}

/* ---- one array ----------------------------------------------------------------- */

static nb_status check_shard(reader *r, const nb_ckpt__array *a, int k, const uint8_t *bytes, const data_file *f) {
  const nb_ckpt__shard *sh = &a->shards[k];
  if (r->opts->skip_checksums || nb_ckpt__xxh3(bytes, (size_t)sh->nbytes) == sh->xxh3) return NB_OK;
  return nb_errorf(r->ctx, NB_ERR_FORMAT, "data file '%s' is damaged: checksum mismatch for array '%s/%s' (shard %d)",
                   f->path, a->e.item, a->e.path, k);
}

/* The shard's file, opened, and its byte range checked against the file. */
static data_file *shard_file(reader *r, const nb_ckpt__array *a, const nb_ckpt__shard *sh) {
  data_file *f = get_file(r, sh->file);
  if (!f) return NULL;
  if (sh->offset > f->size || sh->nbytes > f->size - sh->offset) {
    nb_errorf(r->ctx, NB_ERR_FORMAT,
              "data file '%s' is truncated: array '%s/%s' needs bytes [%llu, %llu), the file has %llu", f->path,
              a->e.item, a->e.path, (unsigned long long)sh->offset, (unsigned long long)(sh->offset + sh->nbytes),
              (unsigned long long)f->size);
    return NULL;
  }
  return f;
}

/* Copies a row-major block (extent at start) into the full array dst. */
static void place_block(uint8_t *dst, const nb_shape *full, const nb_ckpt__shard *sh, const uint8_t *src, size_t es) {
  int rank = full->rank;
  if (sh->nbytes == 0) return;
  if (rank == 0) {
    memcpy(dst, src, es);
    return;
  }
  int64_t strides[NB_MAX_RANK], idx[NB_MAX_RANK] = {0};
  strides[rank - 1] = 1;
  for (int i = rank - 2; i >= 0; i--) strides[i] = strides[i + 1] * full->dims[i + 1];
  size_t row = (size_t)sh->extent[rank - 1] * es;
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < rank; i++) off += (sh->start[i] + (i < rank - 1 ? idx[i] : 0)) * strides[i];
    memcpy(dst + (size_t)off * es, src, row);
    src += row;
    int i = rank - 2;
    while (i >= 0 && ++idx[i] == sh->extent[i]) idx[i--] = 0;
    if (i < 0) break;
  }
}

/* Bytes of shard k: in the mapping, or read into buf (nbytes long). */
static const uint8_t *shard_bytes(reader *r, const nb_ckpt__array *a, int k, uint8_t *buf, data_file **fo) {
  const nb_ckpt__shard *sh = &a->shards[k];
  data_file *f = shard_file(r, a, sh);
  if (!f) return NULL;
  *fo = f;
  if (f->map) return nb_ckpt__map_data(f->map) + sh->offset;
  if (sh->nbytes && nb_ckpt__pread_all(r->ctx, f->fd, buf, (size_t)sh->nbytes, sh->offset, f->path) != NB_OK)
    return NULL;
  return buf;
}

static nb_status load_single(reader *r, const nb_ckpt__array *a, nb_array **out) {
  const nb_ckpt__shard *sh = &a->shards[0];
  data_file *f = shard_file(r, a, sh);
  if (!f) return nb_ctx_status(r->ctx);
  if (f->map) {
    const uint8_t *p = nb_ckpt__map_data(f->map) + sh->offset;
    if (!out) return check_shard(r, a, 0, p, f);
    nb_status s = check_shard(r, a, 0, p, f);
    if (s == NB_OK && !(*out = nb_ckpt__map_array(r->ctx, f->map, sh->offset, a->e.dtype, &a->e.shape)))
      s = nb_ctx_status(r->ctx);
    return s;
  }
  nb_array *arr = nb_array_empty(r->ctx, a->e.dtype, a->e.shape.rank, a->e.shape.dims);
  if (!arr) return nb_ctx_status(r->ctx);
  uint8_t *dst = nb_array_data_mut(arr);
  nb_status s = sh->nbytes ? nb_ckpt__pread_all(r->ctx, f->fd, dst, (size_t)sh->nbytes, sh->offset, f->path) : NB_OK;
  if (s == NB_OK) s = check_shard(r, a, 0, dst, f);
  if (s == NB_OK && out) *out = arr;
  else nb_array_release(arr);
  return s;
}

static nb_status load_sharded(reader *r, const nb_ckpt__array *a, nb_array **out) {
  nb_ctx *ctx = r->ctx;
  nb_array *arr = nb_array_empty(ctx, a->e.dtype, a->e.shape.rank, a->e.shape.dims);
  if (!arr) return nb_ctx_status(ctx);
  size_t biggest = 1;
  for (int k = 0; k < a->e.n_shards; k++)
    if (a->shards[k].nbytes > biggest) biggest = (size_t)a->shards[k].nbytes;
  uint8_t *buf = r->opts->no_mmap ? nb_alloc(ctx, biggest) : NULL;
  nb_status s = (r->opts->no_mmap && !buf) ? NB_ERR_NOMEM : NB_OK;
  for (int k = 0; s == NB_OK && k < a->e.n_shards; k++) {
    data_file *f = NULL;
    const uint8_t *src = shard_bytes(r, a, k, buf, &f);
    if (!src) s = nb_ctx_status(ctx);
    if (s == NB_OK) s = check_shard(r, a, k, src, f);
    if (s == NB_OK) place_block(nb_array_data_mut(arr), &a->e.shape, &a->shards[k], src, nb_dtype_size(a->e.dtype));
  }
  if (buf) nb_dealloc(ctx, buf, biggest);
  if (s == NB_OK && out) *out = arr;
  else nb_array_release(arr);
  return s;
}

static nb_status load_array(reader *r, const nb_ckpt__array *a, nb_array **out) {
  bool whole = a->e.n_shards == 1;
  return whole ? load_single(r, a, out) : load_sharded(r, a, out);
}

/* ---- selection ---------------------------------------------------------------- */

static bool path_under(const char *full, const char *prefix) {
  size_t n = strlen(prefix);
  while (n > 0 && prefix[n - 1] == '/') n--;
  return n > 0 && strncmp(full, prefix, n) == 0 && (full[n] == 0 || full[n] == '/');
}

static bool passes_filters(const nb_ckpt_restore_opts *o, const char *item, const char *full) {
  bool ok = !o->items;
  for (int i = 0; o->items && i < o->n_items && !ok; i++) ok = o->items[i] && !strcmp(o->items[i], item);
  if (!ok) return false;
  if (!o->paths) return true;
  for (int i = 0; i < o->n_paths; i++)
    if (o->paths[i] && path_under(full, o->paths[i])) return true;
  return false;
}

/* Every requested item and path prefix must name something in the step. */
static nb_status check_filters(nb_ctx *ctx, const nb_ckpt_info *info, const nb_ckpt_restore_opts *o) {
  for (int i = 0; o->items && i < o->n_items; i++) {
    bool found = false;
    for (size_t k = 0; k < info->n_items && !found; k++) found = o->items[i] && !strcmp(info->items[k], o->items[i]);
    if (!found)
      return nb_errorf(ctx, NB_ERR_NOT_FOUND, "step %lld has no item '%s'", (long long)info->step,
                       o->items[i] ? o->items[i] : "(null)");
  }
  for (int i = 0; o->paths && i < o->n_paths; i++) {
    bool found = false;
    for (size_t k = 0; k < info->n && !found; k++) {
      char full[NB_CKPT__PATH_CAP];
      snprintf(full, sizeof full, "%s/%s", info->arrays[k].e.item, info->arrays[k].e.path);
      found = o->paths[i] && path_under(full, o->paths[i]);
    }
    if (!found)
      return nb_errorf(ctx, NB_ERR_NOT_FOUND, "step %lld has no array at or under '%s'", (long long)info->step,
                       o->paths[i] ? o->paths[i] : "(null)");
  }
  return NB_OK;
}

/* Indices of the arrays to restore, in output order, into *sel (n_sel). */
static nb_status select_arrays(nb_ctx *ctx, const nb_ckpt_info *info, const nb_ckpt_restore_opts *o, size_t *sel,
                               size_t *n_sel) {
  nb_status s = check_filters(ctx, info, o);
  if (s != NB_OK) return s;
  *n_sel = 0;
  if (!o->target) {
    for (size_t k = 0; k < info->n; k++) {
      char full[NB_CKPT__PATH_CAP];
      snprintf(full, sizeof full, "%s/%s", info->arrays[k].e.item, info->arrays[k].e.path);
      if (passes_filters(o, info->arrays[k].e.item, full)) sel[(*n_sel)++] = k;
    }
    return NB_OK;
  }
  nb_tree *index = nb_tree_create(ctx);
  if (!index) return NB_ERR_NOMEM;
  for (size_t k = 0; s == NB_OK && k < info->n; k++) {
    char full[NB_CKPT__PATH_CAP];
    s = nb_ckpt__pathf(ctx, full, "%s/%s", info->arrays[k].e.item, info->arrays[k].e.path);
    if (s == NB_OK) s = nb_tree_set(index, full, nb_leaf_aval(nb_aval_make(NB_U8, 0, NULL)));
  }
  for (size_t t = 0; s == NB_OK && t < nb_tree_size(o->target); t++) {
    const char *full = nb_tree_path(o->target, t);
    int64_t k = nb_tree_find(index, full);
    const char *slash = strchr(full, '/');
    char item[80] = "";
    if (slash && (size_t)(slash - full) < sizeof item) memcpy(item, full, (size_t)(slash - full));
    if (!passes_filters(o, item, full)) continue;
    if (k < 0) {
      s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "restore: target path '%s' is not in step %lld", full, (long long)info->step);
      break;
    }
    const nb_ckpt_entry *e = &info->arrays[k].e;
    nb_aval want = nb_leaf_get_aval(nb_tree_leaf(o->target, t)), have = nb_aval_make(e->dtype, e->shape.rank, e->shape.dims);
    if (!nb_aval_equal(&want, &have)) {
      char s1[128], s2[128];
      s = nb_errorf(ctx, want.dtype != have.dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                    "restore: '%s' is %s in step %lld but the target wants %s", full, nb_aval_str(&have, s1, sizeof s1),
                    (long long)info->step, nb_aval_str(&want, s2, sizeof s2));
      break;
    }
    sel[(*n_sel)++] = (size_t)k;
  }
  nb_tree_destroy(index);
  return s;
}

/* ---- restore ------------------------------------------------------------------- */

nb_status nb_ckpt__restore(nb_ctx *ctx, const nb_ckpt_info *info, const nb_ckpt_restore_opts *opts, nb_tree **out) {
  static const nb_ckpt_restore_opts defaults;
  const nb_ckpt_restore_opts *o = opts ? opts : &defaults;
  if (out) *out = NULL;
  size_t cap = info->n + (o->target ? nb_tree_size(o->target) : 0) + 1, n_sel = 0;
  size_t *sel = nb_alloc(ctx, cap * sizeof *sel);
  if (!sel) return NB_ERR_NOMEM;
  nb_status s = select_arrays(ctx, info, o, sel, &n_sel);
  reader r = {ctx, info, o, NULL, 0, 0};
  nb_tree *t = (s == NB_OK && out) ? nb_tree_create(ctx) : NULL;
  if (s == NB_OK && out && !t) s = NB_ERR_NOMEM;
  if (!o->no_mmap) /* start read-ahead of everything selected, then consume it in order */
    for (size_t i = 0; s == NB_OK && i < n_sel; i++) {
      const nb_ckpt__array *a = &info->arrays[sel[i]];
      for (int k = 0; s == NB_OK && k < a->e.n_shards; k++) {
        data_file *f = shard_file(&r, a, &a->shards[k]);
        if (!f) s = nb_ctx_status(ctx);
        else nb_ckpt__map_willneed(f->map, a->shards[k].offset, a->shards[k].nbytes);
      }
    }
  for (size_t i = 0; s == NB_OK && i < n_sel; i++) {
    const nb_ckpt__array *a = &info->arrays[sel[i]];
    nb_array *arr = NULL;
    s = load_array(&r, a, out ? &arr : NULL);
    char full[NB_CKPT__PATH_CAP];
    if (s == NB_OK && out) s = nb_ckpt__pathf(ctx, full, "%s/%s", a->e.item, a->e.path);
    if (s == NB_OK && out) s = nb_tree_set_array(t, full, arr);
    nb_array_release(arr);
  }
  close_files(&r);
  nb_dealloc(ctx, sel, cap * sizeof *sel);
  if (s != NB_OK) {
    nb_tree_destroy(t);
    return s;
  }
  if (out) *out = t;
  return NB_OK;
}

nb_tree *nb_ckpt_read_dir(nb_ctx *ctx, const char *step_dir, const nb_ckpt_restore_opts *opts) {
  nb_ckpt_info *info = nb_ckpt_info_open(ctx, step_dir);
  if (!info) return NULL;
  nb_tree *t = NULL;
  nb_ckpt__restore(ctx, info, opts, &t);
  nb_ckpt_info_destroy(info);
  return t;
}

nb_status nb_ckpt_verify_dir(nb_ctx *ctx, const char *step_dir) {
  nb_ckpt_info *info = nb_ckpt_info_open(ctx, step_dir);
  if (!info) return nb_ctx_status(ctx);
  nb_status s = nb_ckpt__restore(ctx, info, NULL, NULL);
  nb_ckpt_info_destroy(info);
  return s;
}
