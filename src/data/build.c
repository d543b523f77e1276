/* Building record files and token shards from text: walks files and
 * directories, splits them into documents (lines, whole files, or one JSONL
 * field per line) and hands each document to a record writer or to a
 * tokenizer and a shard writer. Not here: the file formats (records.c,
 * shard.c) or any real tokenizer (see nb_data_tokenizer). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"

typedef struct path_list {
  nb_ctx *ctx;
  dev_t skip_dev; /* the output file, never an input */
  ino_t skip_ino;
  char **items;
  size_t n, cap;
  uint64_t bytes;
} path_list;

static nb_status list_add(path_list *l, const char *path, uint64_t size) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **p = nb_alloc(l->ctx, cap * sizeof *p);
    if (!p) return NB_ERR_NOMEM;
    if (l->n) memcpy(p, l->items, l->n * sizeof *p);
    nb_dealloc(l->ctx, l->items, l->cap * sizeof *p);
    l->items = p;
    l->cap = cap;
  }
  if (!(l->items[l->n] = nb_strdup(l->ctx, path))) return NB_ERR_NOMEM;
  l->n++;
  l->bytes += size;
  return NB_OK;
}

static void list_free(path_list *l) {
  for (size_t i = 0; i < l->n; i++) nb_strfree(l->ctx, l->items[i]);
  nb_dealloc(l->ctx, l->items, l->cap * sizeof *l->items);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static nb_status walk(path_list *l, const char *path, int depth) {
  nb_ctx *ctx = l->ctx;
  struct stat st;
  if (stat(path, &st) != 0)
    return nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "build: cannot read '%s': %s", path,
                        strerror(errno));
  if (!S_ISDIR(st.st_mode) && st.st_dev == l->skip_dev && st.st_ino == l->skip_ino) return NB_OK;
  if (!S_ISDIR(st.st_mode)) return list_add(l, path, (uint64_t)st.st_size) ? nb_data__err(ctx, NB_ERR_NOMEM, "build: out of memory") : NB_OK;
  if (depth > 64) return nb_data__err(ctx, NB_ERR_INVALID_ARG, "build: directories nested too deep at '%s'", path);
  DIR *d = opendir(path);
  if (!d) return nb_data__err(ctx, NB_ERR_IO, "build: cannot open directory '%s': %s", path, strerror(errno));
  path_list names = {.ctx = ctx, .skip_ino = (ino_t)-1};
  nb_status s = NB_OK;
  for (struct dirent *e; !s && (e = readdir(d));)
    if (e->d_name[0] != '.') s = list_add(&names, e->d_name, 0);
  closedir(d);
  if (s) return list_free(&names), nb_data__err(ctx, NB_ERR_NOMEM, "build: out of memory");
  if (names.n) qsort(names.items, names.n, sizeof *names.items, cmp_names);
  for (size_t i = 0; !s && i < names.n; i++) {
    size_t n = strlen(path) + strlen(names.items[i]) + 2;
    char *child = nb_alloc(ctx, n);
    if (!child) s = NB_ERR_NOMEM;
    else {
      snprintf(child, n, "%s/%s", path, names.items[i]);
      s = walk(l, child, depth + 1);
      nb_dealloc(ctx, child, n);
    }
  }
  list_free(&names);
  return s;
}

/* ---- documents ------------------------------------------------------------- */

typedef nb_status (*doc_fn)(void *ud, const char *text, size_t len);

typedef struct doc_walk {
  nb_ctx *ctx;
  const nb_data_build_opts *opts;
  doc_fn fn;
  void *ud;
  uint64_t done, total, reported;
} doc_walk;

static void progress(doc_walk *w, uint64_t done) {
  w->done = done;
  if (w->opts->progress && (done - w->reported >= (1u << 20) || done == w->total)) {
    w->opts->progress(w->opts->progress_ud, done, w->total);
    w->reported = done;
  }
}

static nb_status emit(doc_walk *w, const char *text, size_t len) {
  if (!len && !w->opts->keep_empty) return NB_OK;
  return w->fn(w->ud, text, len);
}

static nb_status jsonl_doc(doc_walk *w, const char *path, int64_t line, const char *p, size_t n) {
  bool blank = true;
  for (size_t i = 0; blank && i < n; i++) blank = p[i] == ' ' || p[i] == '\t' || p[i] == '\r';
  if (blank) return NB_OK;
  const char *field = w->opts->jsonl_field ? w->opts->jsonl_field : "text";
  cJSON *doc = cJSON_ParseWithLength(p, n);
  const cJSON *v = cJSON_IsObject(doc) ? cJSON_GetObjectItemCaseSensitive(doc, field) : NULL;
  nb_status s;
  if (!doc) s = nb_data__err(w->ctx, NB_ERR_FORMAT, "build: '%s' line %lld: not valid JSON", path, (long long)line);
  else if (!cJSON_IsString(v))
    s = nb_data__err(w->ctx, NB_ERR_FORMAT, "build: '%s' line %lld: no string field '%s'", path, (long long)line, field);
  else s = emit(w, v->valuestring, strlen(v->valuestring));
  cJSON_Delete(doc);
  return s;
}

static nb_status file_docs(doc_walk *w, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) close(fd);
    return nb_data__err(w->ctx, NB_ERR_IO, "build: cannot open '%s': %s", path, strerror(errno));
  }
  size_t size = (size_t)st.st_size;
  const char *base = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : "";
  close(fd);
  if (base == MAP_FAILED) return nb_data__err(w->ctx, NB_ERR_IO, "build: cannot map '%s': %s", path, strerror(errno));
  nb_data_format fmt = nb_data__format_of(base, size);
  if (fmt == NB_DATA_FORMAT_TOKENS || fmt == NB_DATA_FORMAT_RECORDS) { /* by magic, whatever its name */
    if (size) munmap((void *)base, size);
    return nb_data__err(w->ctx, NB_ERR_INVALID_ARG, "build: '%s' is %s, not text: give the text it was built from", path,
                        nb_data_format_name(fmt));
  }
  size_t plen = strlen(path);
  bool jsonl = plen > 6 && !strcmp(path + plen - 6, ".jsonl");
  uint64_t start = w->done;
  nb_status s = NB_OK;
  if (!jsonl && w->opts->unit == NB_DATA_UNIT_FILE) {
    s = emit(w, base, size);
  } else {
    int64_t line = 0;
    for (size_t at = 0; !s && at < size;) {
      const char *nl = memchr(base + at, '\n', size - at);
      size_t end = nl ? (size_t)(nl - base) : size, n = end - at;
      line++;
      if (jsonl) s = jsonl_doc(w, path, line, base + at, n);
      else s = emit(w, base + at, n && base[end - 1] == '\r' ? n - 1 : n);
      at = end + 1;
      progress(w, start + (at < size ? at : size));
    }
  }
  if (size) munmap((void *)base, size);
  progress(w, start + size);
  return s;
}

static nb_status walk_docs(nb_ctx *ctx, const char *out_path, int n, const char *const *inputs,
                           const nb_data_build_opts *opts, doc_fn fn, void *ud) {
  nb_data_build_opts o = opts ? *opts : (nb_data_build_opts){0};
  if (n < 1 || !inputs) return nb_data__err(ctx, NB_ERR_INVALID_ARG, "build: no inputs");
  path_list files = {.ctx = ctx, .skip_ino = (ino_t)-1};
  struct stat st;
  if (stat(out_path, &st) == 0) files.skip_dev = st.st_dev, files.skip_ino = st.st_ino;
  nb_status s = NB_OK;
  for (int i = 0; !s && i < n; i++) s = walk(&files, inputs[i], 0);
  doc_walk w = {ctx, &o, fn, ud, 0, files.bytes, 0};
  for (size_t i = 0; !s && i < files.n; i++) s = file_docs(&w, files.items[i]);
  list_free(&files);
  return s;
}

/* ---- records ---------------------------------------------------------------- */

static nb_status record_doc(void *ud, const char *text, size_t len) { return nb_data_rec_write(ud, text, len); }

nb_status nb_data_build_records(nb_ctx *ctx, const char *out_path, int n_inputs, const char *const *inputs,
                                const nb_data_build_opts *opts, const nb_data_rec_opts *rec, int64_t *n_out) {
  nb_data_rec_writer *w = nb_data_rec_create(ctx, out_path, rec);
  if (!w) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_IO;
  nb_status s = walk_docs(ctx, out_path, n_inputs, inputs, opts, record_doc, w);
  if (s) {
    nb_data_rec_abandon(w); /* no footer: readers reject the partial file */
    return s;
  }
  if (n_out) *n_out = nb_data_rec_writer_count(w);
  return nb_data_rec_finish(w);
}

/* ---- token shards ----------------------------------------------------------- */

typedef struct shard_build {
  nb_ctx *ctx;
  const nb_data_tokenizer *tok;
  nb_data_shard_writer *w;
  nb_data_ids ids;
} shard_build;

static nb_status shard_doc(void *ud, const char *text, size_t len) {
  shard_build *b = ud;
  b->ids.len = 0;
  nb_status s = b->tok->encode(b->tok->ud, b->ctx, text, len, &b->ids);
  if (!s && b->tok->eos_id >= 0) s = nb_data_ids_push(&b->ids, &b->tok->eos_id, 1);
  if (!s) s = nb_data_shard_write(b->w, b->ids.ids, b->ids.len);
  if (!s) nb_data_shard_end_document(b->w);
  return s;
}

nb_status nb_data_build_shard(nb_ctx *ctx, const char *out_path, int n_inputs, const char *const *inputs,
                              const nb_data_build_opts *opts, const nb_data_tokenizer *tok, int token_bytes,
                              int64_t *n_out) {
  nb_data_tokenizer bytes = nb_data_tokenizer_bytes();
  if (!tok) tok = &bytes;
  if (!tok->encode || tok->vocab_size < 1 || tok->eos_id >= tok->vocab_size)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "build: tokenizer without encode, or eos id %d outside vocab %lld",
                        tok->eos_id, (long long)tok->vocab_size);
  shard_build b = {ctx, tok, nb_data_shard_create(ctx, out_path, token_bytes, tok->vocab_size), {.ctx = ctx}};
  if (!b.w) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_IO;
  nb_status s = walk_docs(ctx, out_path, n_inputs, inputs, opts, shard_doc, &b);
  nb_data_ids_free(&b.ids);
  if (s) {
    nb_data_shard_abandon(b.w);
    return s;
  }
  if (n_out) *n_out = nb_data_shard_writer_count(b.w);
  return nb_data_shard_finish(b.w);
}
