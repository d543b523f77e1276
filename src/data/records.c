/* Record files (docs/record-format.md): a streaming writer that groups
 * records into checksummed, optionally zstd-compressed chunks and ends the
 * file with a footer index and a trailer; and an mmap reader that validates
 * the structure on open, checks each chunk's checksum on first use and reads
 * record i with one index lookup. Not here: pipelines over record files. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "data/internal.h"

#define REC_VERSION 1u
#define HEADER_SIZE 64
#define CHUNK_HEADER_SIZE 40
#define ENTRY_SIZE 40
#define TRAILER_SIZE 32
#define FLAG_ZSTD 1u
#define CACHE_SLOTS 4
#define MAX_CHUNK_RAW (1ull << 30) /* 1 GiB: bounds what a reader allocates for one chunk */
static const char REC_MAGIC[8] = NB_DATA__RECORD_MAGIC, END_MAGIC[8] = "NBRECEND", INDEX_MAGIC[8] = "NBINDEX";
static const char CHUNK_MAGIC[4] = "NBCK";

typedef struct chunk_entry {
  uint64_t offset, first, count, raw_size, stored_size;
} chunk_entry;

/* ---- writer ------------------------------------------------------------- */

struct nb_data_rec_writer {
  nb_ctx *ctx;
  char *path;
  int fd;
  nb_data_rec_opts opts;
  uint64_t offset, records;
  uint8_t *data;          /* the open chunk's record bytes */
  size_t data_len, data_cap;
  uint64_t *ends;         /* end offset of each record of the open chunk */
  size_t n_ends, ends_cap;
  chunk_entry *chunks;
  size_t n_chunks, chunks_cap;
  nb_status failed;       /* sticky */
};

static nb_status write_all(nb_ctx *ctx, int fd, const void *p, size_t n, const char *path) {
  const uint8_t *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return nb_data__err(ctx, NB_ERR_IO, "record file '%s': write failed: %s", path, strerror(errno));
    b += k;
    n -= (size_t)k;
  }
  return NB_OK;
}

/* Grows *p (elements of size esz) to hold at least need elements. */
static nb_status grow(nb_ctx *ctx, void **p, size_t *cap, size_t need, size_t esz) {
  if (need <= *cap) return NB_OK;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *q = nb_alloc(ctx, c * esz);
  if (!q) return NB_ERR_NOMEM;
  if (*p) memcpy(q, *p, *cap * esz);
  nb_dealloc(ctx, *p, *cap * esz);
  *p = q;
  *cap = c;
  return NB_OK;
}

static void header_bytes(uint8_t *h, const nb_data_rec_writer *w) {
  memset(h, 0, HEADER_SIZE);
  memcpy(h, REC_MAGIC, 8);
  nb_data__put32(h + 8, REC_VERSION);
  nb_data__put32(h + 12, (uint32_t)w->opts.checksum);
  nb_data__put64(h + 16, w->records);
  nb_data__put64(h + 24, w->opts.chunk_bytes);
  nb_data__put64(h + 56, nb_data_checksum_bytes(w->opts.checksum, h, 56));
}

nb_data_rec_writer *nb_data_rec_create(nb_ctx *ctx, const char *path, const nb_data_rec_opts *opts) {
  nb_data_rec_opts o = opts ? *opts : (nb_data_rec_opts){0};
  if (!o.chunk_bytes) o.chunk_bytes = 1 << 20;
  if (o.chunk_bytes > MAX_CHUNK_RAW / 2 || o.zstd_level < 0 || o.zstd_level > 19 || o.checksum < 0 || o.checksum >= NB_DATA_CHECKSUM_COUNT)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "record file '%s': chunk bytes %zu (want <= 512 MiB), zstd level %d (want "
                        "0..19) or checksum %d invalid", path, o.chunk_bytes, o.zstd_level, (int)o.checksum), NULL;
  nb_data_rec_writer *w = nb_calloc(ctx, sizeof *w);
  if (!w) return NULL;
  w->ctx = ctx;
  w->opts = o;
  w->fd = -1;
  w->path = nb_strdup(ctx, path);
  if (!w->path) return nb_data_rec_abandon(w), NULL;
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    nb_data__err(ctx, NB_ERR_IO, "record file '%s': cannot create: %s", path, strerror(errno));
    return nb_data_rec_abandon(w), NULL;
  }
  uint8_t h[HEADER_SIZE];
  header_bytes(h, w); /* record count 0 until finished */
  if (write_all(ctx, w->fd, h, HEADER_SIZE, path)) return nb_data_rec_abandon(w), NULL;
  w->offset = HEADER_SIZE;
  return w;
}

static nb_status flush_chunk(nb_data_rec_writer *w) {
  nb_ctx *ctx = w->ctx;
  if (!w->n_ends) return NB_OK;
  size_t raw_size = w->n_ends * 8 + w->data_len, stored_cap = raw_size;
  if (w->opts.zstd_level) stored_cap = ZSTD_compressBound(raw_size);
  uint8_t *raw = nb_alloc(ctx, raw_size), *stored = w->opts.zstd_level ? nb_alloc(ctx, stored_cap) : NULL;
  if (!raw || (w->opts.zstd_level && !stored)) {
    nb_dealloc(ctx, raw, raw_size);
    nb_dealloc(ctx, stored, stored_cap);
    return nb_data__err(ctx, NB_ERR_NOMEM, "record file '%s': out of memory for a %zu-byte chunk", w->path, raw_size);
  }
  for (size_t j = 0; j < w->n_ends; j++) nb_data__put64(raw + 8 * j, w->ends[j]);
  memcpy(raw + 8 * w->n_ends, w->data, w->data_len);
  uint32_t flags = 0;
  const uint8_t *payload = raw;
  size_t stored_size = raw_size;
  if (stored) {
    size_t k = ZSTD_compress(stored, stored_cap, raw, raw_size, w->opts.zstd_level);
    if (!ZSTD_isError(k) && k < raw_size) payload = stored, stored_size = k, flags = FLAG_ZSTD;
  }
  uint8_t ch[CHUNK_HEADER_SIZE];
  memcpy(ch, CHUNK_MAGIC, 4);
  nb_data__put32(ch + 4, flags);
  nb_data__put64(ch + 8, w->n_ends);
  nb_data__put64(ch + 16, raw_size);
  nb_data__put64(ch + 24, stored_size);
  nb_data__put64(ch + 32, nb_data_checksum_bytes(w->opts.checksum, payload, stored_size));
  nb_status s = grow(ctx, (void **)&w->chunks, &w->chunks_cap, w->n_chunks + 1, sizeof *w->chunks);
  if (s) s = nb_data__err(ctx, s, "record file '%s': out of memory for the index", w->path);
  if (!s) s = write_all(ctx, w->fd, ch, CHUNK_HEADER_SIZE, w->path);
  if (!s) s = write_all(ctx, w->fd, payload, stored_size, w->path);
  if (!s) {
    w->chunks[w->n_chunks++] = (chunk_entry){w->offset, w->records - w->n_ends, w->n_ends, raw_size, stored_size};
    w->offset += CHUNK_HEADER_SIZE + stored_size;
  }
  nb_dealloc(ctx, raw, raw_size);
  nb_dealloc(ctx, stored, stored_cap);
  w->n_ends = w->data_len = 0;
  return s;
}

nb_status nb_data_rec_write(nb_data_rec_writer *w, const void *data, size_t len) {
  if (w->failed) return nb_data__err(w->ctx, w->failed, "record file '%s': an earlier write failed", w->path);
  if (len > MAX_CHUNK_RAW - 8)
    return nb_data__err(w->ctx, NB_ERR_INVALID_ARG, "record file '%s': a record of %zu bytes is over the 1 GiB limit",
                        w->path, len);
  nb_status s = NB_OK;
  if (w->n_ends && (w->data_len + len > w->opts.chunk_bytes || 8 * (w->n_ends + 1) + w->data_len + len > MAX_CHUNK_RAW))
    s = flush_chunk(w);
  if (!s && (grow(w->ctx, (void **)&w->data, &w->data_cap, w->data_len + len, 1) ||
             grow(w->ctx, (void **)&w->ends, &w->ends_cap, w->n_ends + 1, sizeof *w->ends)))
    s = nb_data__err(w->ctx, NB_ERR_NOMEM, "record file '%s': out of memory for a %zu-byte record", w->path, len);
  if (!s) {
    if (len) memcpy(w->data + w->data_len, data, len);
    w->data_len += len;
    w->ends[w->n_ends++] = w->data_len;
    w->records++;
    if (w->data_len >= w->opts.chunk_bytes) s = flush_chunk(w);
  }
  return w->failed = s;
}

int64_t nb_data_rec_writer_count(const nb_data_rec_writer *w) { return (int64_t)w->records; }

static nb_status write_footer(nb_data_rec_writer *w) {
  size_t fsize = 16 + w->n_chunks * ENTRY_SIZE;
  uint8_t *f = nb_alloc(w->ctx, fsize);
  if (!f) return nb_data__err(w->ctx, NB_ERR_NOMEM, "record file '%s': out of memory for the footer", w->path);
  memcpy(f, INDEX_MAGIC, 8);
  nb_data__put64(f + 8, w->n_chunks);
  for (size_t k = 0; k < w->n_chunks; k++) {
    uint8_t *e = f + 16 + k * ENTRY_SIZE;
    const chunk_entry *c = &w->chunks[k];
    nb_data__put64(e, c->offset);
    nb_data__put64(e + 8, c->first);
    nb_data__put64(e + 16, c->count);
    nb_data__put64(e + 24, c->raw_size);
    nb_data__put64(e + 32, c->stored_size);
  }
  uint8_t t[TRAILER_SIZE];
  nb_data__put64(t, w->offset);
  nb_data__put64(t + 8, w->records);
  nb_data__put64(t + 16, nb_data_checksum_bytes(w->opts.checksum, f, fsize));
  memcpy(t + 24, END_MAGIC, 8);
  nb_status s = write_all(w->ctx, w->fd, f, fsize, w->path);
  nb_dealloc(w->ctx, f, fsize);
  uint8_t h[HEADER_SIZE];
  header_bytes(h, w);
  if (!s && pwrite(w->fd, h, HEADER_SIZE, 0) != HEADER_SIZE)
    s = nb_data__err(w->ctx, NB_ERR_IO, "record file '%s': cannot rewrite the header: %s", w->path, strerror(errno));
  if (!s) s = write_all(w->ctx, w->fd, t, TRAILER_SIZE, w->path); /* last: the file is valid from here on */
  return s;
}

nb_status nb_data_rec_finish(nb_data_rec_writer *w) {
  nb_status s = w->failed;
  if (s) nb_data__err(w->ctx, s, "record file '%s': not finished because an earlier write failed", w->path);
  if (!s) s = flush_chunk(w);
  if (!s) s = write_footer(w);
  if (close(w->fd) != 0 && !s)
    s = nb_data__err(w->ctx, NB_ERR_IO, "record file '%s': close failed: %s", w->path, strerror(errno));
  w->fd = -1;
  nb_data_rec_abandon(w);
  return s;
}

void nb_data_rec_abandon(nb_data_rec_writer *w) {
  if (!w) return;
  nb_ctx *ctx = w->ctx;
  if (w->fd >= 0) close(w->fd);
  nb_strfree(ctx, w->path);
  nb_dealloc(ctx, w->data, w->data_cap);
  nb_dealloc(ctx, w->ends, w->ends_cap * sizeof *w->ends);
  nb_dealloc(ctx, w->chunks, w->chunks_cap * sizeof *w->chunks);
  nb_dealloc(ctx, w, sizeof *w);
}

/* ---- reader ------------------------------------------------------------- */

typedef struct cache_slot {
  int64_t chunk; /* -1: empty */
  uint8_t *raw;
  size_t raw_size;
  uint64_t used;
} cache_slot;

struct nb_data_rec_reader {
  nb_ctx *ctx;
  char *path;
  const uint8_t *base; /* the mapping */
  size_t size;
  nb_data_checksum checksum;
  uint32_t version;
  uint64_t records, n_chunks;
  chunk_entry *chunks;
  _Atomic uint8_t *verified; /* per chunk: checksum and structure checked */
  pthread_mutex_t lock;      /* guards cache */
  cache_slot cache[CACHE_SLOTS];
  uint64_t tick;
};

static nb_data_rec_reader *open_fail(nb_data_rec_reader *r) {
  nb_data_rec_close(r);
  return NULL;
}

#define BAD(...) (nb_data__err(ctx, NB_ERR_FORMAT, __VA_ARGS__), open_fail(r))

static nb_data_rec_reader *parse_index(nb_data_rec_reader *r) {
  nb_ctx *ctx = r->ctx;
  const uint8_t *b = r->base, *t = b + r->size - TRAILER_SIZE;
  const char *p = r->path;
  if (memcmp(t + 24, END_MAGIC, 8))
    return BAD("record file '%s': no footer (trailer magic missing): the writer did not finish (crashed or still "
               "writing), or the file is truncated", p);
  uint64_t foff = nb_data__get64(t), count = nb_data__get64(t + 8);
  if (foff < HEADER_SIZE || foff > r->size - TRAILER_SIZE - 16)
    return BAD("record file '%s': footer offset %llu out of range (file is %zu bytes)", p, (unsigned long long)foff,
               r->size);
  uint64_t fsize = r->size - TRAILER_SIZE - foff;
  if (nb_data_checksum_bytes(r->checksum, b + foff, fsize) != nb_data__get64(t + 16))
    return BAD("record file '%s': footer checksum mismatch (corrupted index)", p);
  r->n_chunks = nb_data__get64(b + foff + 8);
  if (memcmp(b + foff, INDEX_MAGIC, 8) || r->n_chunks != (fsize - 16) / ENTRY_SIZE || (fsize - 16) % ENTRY_SIZE)
    return BAD("record file '%s': malformed footer index", p);
  if (count != nb_data__get64(b + 16))
    return BAD("record file '%s': header says %llu records, trailer %llu (the writer did not finish?)", p,
               (unsigned long long)nb_data__get64(b + 16), (unsigned long long)count);
  r->records = count;
  size_t n = (size_t)r->n_chunks;
  r->chunks = nb_alloc(ctx, (n ? n : 1) * sizeof *r->chunks);
  r->verified = nb_calloc(ctx, n ? n : 1);
  if (!r->chunks || !r->verified) return open_fail(r);
  uint64_t expect_off = HEADER_SIZE, first = 0;
  for (size_t k = 0; k < n; k++) {
    const uint8_t *e = b + foff + 16 + k * ENTRY_SIZE;
    chunk_entry c = {nb_data__get64(e), nb_data__get64(e + 8), nb_data__get64(e + 16), nb_data__get64(e + 24),
                     nb_data__get64(e + 32)};
    if (c.offset != expect_off || c.first != first || c.count == 0 || c.stored_size > foff ||
        c.offset + CHUNK_HEADER_SIZE + c.stored_size > foff || c.count > c.raw_size / 8 || c.raw_size > MAX_CHUNK_RAW)
      return BAD("record file '%s': footer entry of chunk %zu is inconsistent (offset %llu, first record %llu, %llu "
                 "records)", p, k, (unsigned long long)c.offset, (unsigned long long)c.first,
                 (unsigned long long)c.count);
    r->chunks[k] = c;
    expect_off = c.offset + CHUNK_HEADER_SIZE + c.stored_size;
    first += c.count;
  }
  if (expect_off != foff || first != count)
    return BAD("record file '%s': chunks end at %llu and hold %llu records, footer at %llu says %llu", p,
               (unsigned long long)expect_off, (unsigned long long)first, (unsigned long long)foff,
               (unsigned long long)count);
  return r;
}

nb_data_rec_reader *nb_data_rec_open(nb_ctx *ctx, const char *path) {
  nb_data_rec_reader *r = nb_calloc(ctx, sizeof *r);
  if (!r) return NULL;
  r->ctx = ctx;
  pthread_mutex_init(&r->lock, NULL);
  for (int i = 0; i < CACHE_SLOTS; i++) r->cache[i].chunk = -1;
  r->path = nb_strdup(ctx, path);
  if (!r->path) return open_fail(r);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "record file '%s': cannot open: %s", path,
                 strerror(errno));
    if (fd >= 0) close(fd);
    return open_fail(r);
  }
  r->size = (size_t)st.st_size;
  if (r->size >= HEADER_SIZE + TRAILER_SIZE) {
    void *m = mmap(NULL, r->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      nb_data__err(ctx, NB_ERR_IO, "record file '%s': mmap failed: %s", path, strerror(errno));
      close(fd);
      return open_fail(r);
    }
    r->base = m;
  }
  close(fd);
  if (!r->base || memcmp(r->base, REC_MAGIC, 8))
    return BAD("record file '%s': not a record file (bad magic or %zu bytes is too short)", path, r->size);
  r->version = nb_data__get32(r->base + 8);
  uint32_t ck = nb_data__get32(r->base + 12);
  if (r->version != REC_VERSION)
    return BAD("record file '%s': version %u; this nabla reads version %u (hint: written by a newer nabla?)", path,
               r->version, REC_VERSION);
  if (ck >= NB_DATA_CHECKSUM_COUNT) return BAD("record file '%s': unknown checksum kind %u", path, ck);
  r->checksum = (nb_data_checksum)ck;
  if (nb_data_checksum_bytes(r->checksum, r->base, 56) != nb_data__get64(r->base + 56))
    return BAD("record file '%s': header checksum mismatch", path);
  return parse_index(r);
}

void nb_data_rec_close(nb_data_rec_reader *r) {
  if (!r) return;
  nb_ctx *ctx = r->ctx;
  if (r->base) munmap((void *)r->base, r->size);
  for (int i = 0; i < CACHE_SLOTS; i++) nb_dealloc(ctx, r->cache[i].raw, r->cache[i].raw_size);
  size_t n = (size_t)r->n_chunks ? (size_t)r->n_chunks : 1;
  nb_dealloc(ctx, r->chunks, n * sizeof *r->chunks);
  nb_dealloc(ctx, (void *)r->verified, n);
  nb_strfree(ctx, r->path);
  pthread_mutex_destroy(&r->lock);
  nb_dealloc(ctx, r, sizeof *r);
}

int64_t nb_data_rec_count(const nb_data_rec_reader *r) { return (int64_t)r->records; }

static size_t find_chunk(const nb_data_rec_reader *r, uint64_t i) {
  size_t lo = 0, hi = (size_t)r->n_chunks - 1;
  while (lo < hi) {
    size_t mid = lo + (hi - lo + 1) / 2;
    if (r->chunks[mid].first <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

static nb_status chunk_err(nb_data_rec_reader *r, size_t k, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static nb_status chunk_err(nb_data_rec_reader *r, size_t k, const char *where, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nb_data__err(r->ctx, NB_ERR_FORMAT, "record file '%s': chunk %zu (records %llu..%llu)%s: %s", r->path, k,
                      (unsigned long long)r->chunks[k].first,
                      (unsigned long long)(r->chunks[k].first + r->chunks[k].count - 1), where, msg);
}
#define CHUNK_ERR(k, ...) chunk_err(r, k, where, __VA_ARGS__)

/* Checks a raw chunk's record table: ends rise and the last is the data size. */
static nb_status check_raw(nb_data_rec_reader *r, size_t k, const uint8_t *raw, const char *where) {
  const chunk_entry *c = &r->chunks[k];
  uint64_t data = c->raw_size - 8 * c->count, prev = 0;
  for (uint64_t j = 0; j < c->count; j++) {
    uint64_t e = nb_data__get64(raw + 8 * j);
    if (e < prev || e > data) return CHUNK_ERR(k, "record table entry %llu is out of order", (unsigned long long)j);
    prev = e;
  }
  if (prev != data) return CHUNK_ERR(k, "records end at %llu of %llu data bytes", (unsigned long long)prev,
                                     (unsigned long long)data);
  return NB_OK;
}

/* Validates chunk k's header and checksum (once per reader for raw chunks). */
static nb_status check_chunk(nb_data_rec_reader *r, size_t k, const char *where) {
  const chunk_entry *c = &r->chunks[k];
  const uint8_t *h = r->base + c->offset, *payload = h + CHUNK_HEADER_SIZE;
  uint32_t flags = nb_data__get32(h + 4);
  if (memcmp(h, CHUNK_MAGIC, 4) || (flags & ~FLAG_ZSTD) || nb_data__get64(h + 8) != c->count ||
      nb_data__get64(h + 16) != c->raw_size || nb_data__get64(h + 24) != c->stored_size)
    return CHUNK_ERR(k, "chunk header does not match the footer index");
  uint64_t want = nb_data__get64(h + 32), got = nb_data_checksum_bytes(r->checksum, payload, c->stored_size);
  if (want != got)
    return CHUNK_ERR(k, "%s checksum mismatch (stored %016llx, computed %016llx)", nb_data_checksum_name(r->checksum),
                     (unsigned long long)want, (unsigned long long)got);
  if (!(flags & FLAG_ZSTD)) {
    if (c->stored_size != c->raw_size) return CHUNK_ERR(k, "raw chunk with stored size != raw size");
    nb_status s = check_raw(r, k, payload, where);
    if (s) return s;
  }
  atomic_store(&r->verified[k], 1);
  return NB_OK;
}

/* A new buffer with chunk k decompressed and checked. */
static nb_status decompress_chunk(nb_data_rec_reader *r, size_t k, const char *where, uint8_t **out) {
  const chunk_entry *c = &r->chunks[k];
  if (!atomic_load(&r->verified[k])) {
    nb_status s = check_chunk(r, k, where);
    if (s) return s;
  }
  const uint8_t *payload = r->base + c->offset + CHUNK_HEADER_SIZE;
  if (ZSTD_getFrameContentSize(payload, c->stored_size) != c->raw_size)
    return CHUNK_ERR(k, "zstd frame size does not match the index");
  uint8_t *raw = nb_alloc(r->ctx, c->raw_size);
  if (!raw) return nb_data__err(r->ctx, NB_ERR_NOMEM, "record file '%s': out of memory for chunk %zu", r->path, k);
  size_t got = ZSTD_decompress(raw, c->raw_size, payload, c->stored_size);
  nb_status s = NB_OK;
  if (ZSTD_isError(got) || got != c->raw_size) s = CHUNK_ERR(k, "zstd decompression failed");
  if (!s) s = check_raw(r, k, raw, where);
  if (s) return nb_dealloc(r->ctx, raw, c->raw_size), s;
  *out = raw;
  return NB_OK;
}

static nb_status copy_record(nb_data_rec_reader *r, size_t k, const uint8_t *raw, uint64_t i, nb_data_elem *out) {
  const chunk_entry *c = &r->chunks[k];
  uint64_t j = i - c->first, start = j ? nb_data__get64(raw + 8 * (j - 1)) : 0, end = nb_data__get64(raw + 8 * j);
  return nb_data_elem_set_bytes(r->ctx, out, raw + 8 * c->count + start, (size_t)(end - start));
}

/* Record i of a compressed chunk, through the small LRU cache. */
static nb_status read_cached(nb_data_rec_reader *r, size_t k, uint64_t i, const char *where, nb_data_elem *out) {
  pthread_mutex_lock(&r->lock);
  for (int s = 0; s < CACHE_SLOTS; s++)
    if (r->cache[s].chunk == (int64_t)k) {
      r->cache[s].used = ++r->tick;
      nb_status st = copy_record(r, k, r->cache[s].raw, i, out);
      pthread_mutex_unlock(&r->lock);
      return st;
    }
  pthread_mutex_unlock(&r->lock);
  uint8_t *raw;
  nb_status st = decompress_chunk(r, k, where, &raw);
  if (st) return st;
  pthread_mutex_lock(&r->lock);
  int victim = 0;
  for (int s = 1; s < CACHE_SLOTS; s++)
    if (r->cache[s].used < r->cache[victim].used) victim = s;
  cache_slot *v = &r->cache[victim];
  nb_dealloc(r->ctx, v->raw, v->raw_size);
  *v = (cache_slot){(int64_t)k, raw, r->chunks[k].raw_size, ++r->tick};
  st = copy_record(r, k, raw, i, out);
  pthread_mutex_unlock(&r->lock);
  return st;
}

nb_status nb_data_rec_read(nb_data_rec_reader *r, int64_t i, nb_data_elem *out) {
  nb_data_elem_clear(r->ctx, out);
  if (i < 0 || (uint64_t)i >= r->records)
    return nb_data__err(r->ctx, NB_ERR_INVALID_ARG, "record file '%s': record %lld out of range [0, %llu)", r->path,
                        (long long)i, (unsigned long long)r->records);
  size_t k = find_chunk(r, (uint64_t)i);
  char where[64];
  snprintf(where, sizeof where, " reading record %lld", (long long)i);
  const uint8_t *h = r->base + r->chunks[k].offset;
  if (nb_data__get32(h + 4) & FLAG_ZSTD) return read_cached(r, k, (uint64_t)i, where, out);
  if (!atomic_load(&r->verified[k])) {
    nb_status s = check_chunk(r, k, where);
    if (s) return s;
  }
  return copy_record(r, k, h + CHUNK_HEADER_SIZE, (uint64_t)i, out);
}

void nb_data_rec_get_info(const nb_data_rec_reader *r, nb_data_rec_info *out) {
  *out = (nb_data_rec_info){.records = (int64_t)r->records, .chunks = (int64_t)r->n_chunks,
                            .file_bytes = r->size, .checksum = r->checksum, .version = r->version};
  for (uint64_t k = 0; k < r->n_chunks; k++) {
    out->raw_bytes += r->chunks[k].raw_size;
    out->stored_bytes += r->chunks[k].stored_size;
    if (nb_data__get32(r->base + r->chunks[k].offset + 4) & FLAG_ZSTD) out->compressed_chunks++;
  }
}

nb_status nb_data_rec_verify(nb_data_rec_reader *r, nb_data_progress_fn progress, void *ud) {
  uint64_t done = 0, total = r->size;
  for (size_t k = 0; k < r->n_chunks; k++) {
    const char *where = "";
    atomic_store(&r->verified[k], 0);
    nb_status s = check_chunk(r, k, where);
    if (!s && (nb_data__get32(r->base + r->chunks[k].offset + 4) & FLAG_ZSTD)) {
      uint8_t *raw;
      s = decompress_chunk(r, k, where, &raw);
      if (!s) nb_dealloc(r->ctx, raw, r->chunks[k].raw_size);
    }
    if (s) return s;
    done += CHUNK_HEADER_SIZE + r->chunks[k].stored_size;
    if (progress) progress(ud, done, total);
  }
  if (progress) progress(ud, total, total);
  return NB_OK;
}
