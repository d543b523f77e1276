/* Token shards (docs/token-shard-format.md): a 64-byte header and packed
 * little-endian uint16/uint32 token ids, written streaming and read through
 * mmap. Not here: windows over shards (map_sources.c). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "data/internal.h"

#define SHARD_VERSION 1u
#define SHARD_HEADER 64
#define WBUF 65536
static const char SHARD_MAGIC[8] = NB_DATA__SHARD_MAGIC;

struct nb_data_shard_writer {
  nb_ctx *ctx;
  char *path;
  int fd;
  int token_bytes;
  int64_t vocab, count, docs;
  XXH3_state_t *hash;
  uint8_t buf[WBUF];
  size_t buf_len;
  nb_status failed;
};

struct nb_data_shard {
  nb_ctx *ctx;
  char *path;
  const uint8_t *base;
  size_t size;
  int token_bytes;
  int64_t vocab, count, docs;
  uint64_t data_checksum;
};

static void shard_header(uint8_t *h, int token_bytes, int64_t count, int64_t vocab, int64_t docs, uint64_t sum) {
  memset(h, 0, SHARD_HEADER);
  memcpy(h, SHARD_MAGIC, 8);
  nb_data__put32(h + 8, SHARD_VERSION);
  nb_data__put32(h + 12, (uint32_t)token_bytes);
  nb_data__put64(h + 16, (uint64_t)count);
  nb_data__put64(h + 24, (uint64_t)vocab);
  nb_data__put64(h + 32, (uint64_t)docs);
  nb_data__put64(h + 40, sum);
  nb_data__put64(h + 56, XXH3_64bits(h, 56));
}

static nb_status shard_write_all(nb_data_shard_writer *w, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t k = write(w->fd, b, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return nb_data__err(w->ctx, NB_ERR_IO, "token shard '%s': write failed: %s", w->path, strerror(errno));
    b += k;
    n -= (size_t)k;
  }
  return NB_OK;
}

nb_data_shard_writer *nb_data_shard_create(nb_ctx *ctx, const char *path, int token_bytes, int64_t vocab_size) {
  if (token_bytes == 0) token_bytes = vocab_size <= 65536 ? 2 : 4;
  if ((token_bytes != 2 && token_bytes != 4) || vocab_size < 1 || (token_bytes == 2 && vocab_size > 65536) ||
      vocab_size > 2147483648LL)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "token shard '%s': %d-byte tokens cannot hold vocab size %lld", path,
                        token_bytes, (long long)vocab_size), NULL;
  nb_data_shard_writer *w = nb_calloc(ctx, sizeof *w);
  if (!w) return NULL;
  w->ctx = ctx;
  w->fd = -1;
  w->token_bytes = token_bytes;
  w->vocab = vocab_size;
  w->path = nb_strdup(ctx, path);
  w->hash = XXH3_createState();
  if (!w->path || !w->hash) {
    nb_data__err(ctx, NB_ERR_NOMEM, "token shard '%s': out of memory", path);
    return nb_data_shard_abandon(w), NULL;
  }
  XXH3_64bits_reset(w->hash);
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    nb_data__err(ctx, NB_ERR_IO, "token shard '%s': cannot create: %s", path, strerror(errno));
    return nb_data_shard_abandon(w), NULL;
  }
  uint8_t h[SHARD_HEADER];
  shard_header(h, token_bytes, -1, vocab_size, 0, 0); /* count -1: unfinished, until finish rewrites it */
  if (shard_write_all(w, h, SHARD_HEADER)) return nb_data_shard_abandon(w), NULL;
  return w;
}

static nb_status shard_flush(nb_data_shard_writer *w) {
  XXH3_64bits_update(w->hash, w->buf, w->buf_len);
  nb_status s = shard_write_all(w, w->buf, w->buf_len);
  w->buf_len = 0;
  return s;
}

nb_status nb_data_shard_write(nb_data_shard_writer *w, const int32_t *ids, size_t n) {
  if (w->failed) return nb_data__err(w->ctx, w->failed, "token shard '%s': an earlier write failed", w->path);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= w->vocab)
      return nb_data__err(w->ctx, NB_ERR_INVALID_ARG, "token shard '%s': token id %d at position %lld is outside the "
                          "vocab [0, %lld)", w->path, ids[i], (long long)(w->count + (int64_t)i), (long long)w->vocab);
  for (size_t i = 0; i < n; i++) {
    if (w->buf_len + 4 > WBUF && (w->failed = shard_flush(w))) return w->failed;
    if (w->token_bytes == 2) {
      w->buf[w->buf_len] = (uint8_t)ids[i];
      w->buf[w->buf_len + 1] = (uint8_t)(ids[i] >> 8);
    } else {
      nb_data__put32(w->buf + w->buf_len, (uint32_t)ids[i]);
    }
    w->buf_len += (size_t)w->token_bytes;
  }
  w->count += (int64_t)n;
  return NB_OK;
}

void nb_data_shard_end_document(nb_data_shard_writer *w) { w->docs++; }
int64_t nb_data_shard_writer_count(const nb_data_shard_writer *w) { return w->count; }

nb_status nb_data_shard_finish(nb_data_shard_writer *w) {
  nb_status s = w->failed;
  if (s) nb_data__err(w->ctx, s, "token shard '%s': not finished because an earlier write failed", w->path);
  if (!s) s = shard_flush(w);
  if (!s) {
    uint8_t h[SHARD_HEADER];
    shard_header(h, w->token_bytes, w->count, w->vocab, w->docs, XXH3_64bits_digest(w->hash));
    if (pwrite(w->fd, h, SHARD_HEADER, 0) != SHARD_HEADER)
      s = nb_data__err(w->ctx, NB_ERR_IO, "token shard '%s': cannot write the header: %s", w->path, strerror(errno));
  }
  if (close(w->fd) != 0 && !s)
    s = nb_data__err(w->ctx, NB_ERR_IO, "token shard '%s': close failed: %s", w->path, strerror(errno));
  w->fd = -1;
  nb_data_shard_abandon(w);
  return s;
}

void nb_data_shard_abandon(nb_data_shard_writer *w) {
  if (!w) return;
  if (w->fd >= 0) {
    XXH3_64bits_update(w->hash, w->buf, w->buf_len); /* what a crash leaves: data without a final header */
    (void)!write(w->fd, w->buf, w->buf_len);
    close(w->fd);
  }
  if (w->hash) XXH3_freeState(w->hash);
  nb_strfree(w->ctx, w->path);
  nb_dealloc(w->ctx, w, sizeof *w);
}

/* ---- reader ------------------------------------------------------------- */

static nb_data_shard *shard_fail(nb_data_shard *s) {
  nb_data_shard_close(s);
  return NULL;
}

nb_data_shard *nb_data_shard_open(nb_ctx *ctx, const char *path) {
  nb_data_shard *s = nb_calloc(ctx, sizeof *s);
  if (!s) return NULL;
  s->ctx = ctx;
  s->path = nb_strdup(ctx, path);
  if (!s->path) return shard_fail(s);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "token shard '%s': cannot open: %s", path,
                 strerror(errno));
    if (fd >= 0) close(fd);
    return shard_fail(s);
  }
  s->size = (size_t)st.st_size;
  if (s->size >= SHARD_HEADER) {
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      nb_data__err(ctx, NB_ERR_IO, "token shard '%s': mmap failed: %s", path, strerror(errno));
      close(fd);
      return shard_fail(s);
    }
    s->base = m;
  }
  close(fd);
  const uint8_t *h = s->base;
  if (!h || memcmp(h, SHARD_MAGIC, 8))
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': not a token shard (bad magic or %zu bytes is too short)",
                        path, s->size), shard_fail(s);
  uint32_t version = nb_data__get32(h + 8);
  if (version != SHARD_VERSION)
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': version %u; this nabla reads version %u (hint: written "
                        "by a newer nabla?)", path, version, SHARD_VERSION), shard_fail(s);
  if (XXH3_64bits(h, 56) != nb_data__get64(h + 56))
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': header checksum mismatch", path), shard_fail(s);
  s->token_bytes = (int)nb_data__get32(h + 12);
  uint64_t count = nb_data__get64(h + 16), vocab = nb_data__get64(h + 24);
  s->docs = (int64_t)nb_data__get64(h + 32);
  s->data_checksum = nb_data__get64(h + 40);
  if ((s->token_bytes != 2 && s->token_bytes != 4) || vocab < 1 || vocab > 2147483648ULL ||
      (s->token_bytes == 2 && vocab > 65536))
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': bad token width %d or vocab size %llu", path,
                        s->token_bytes, (unsigned long long)vocab), shard_fail(s);
  if (count == UINT64_MAX)
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': the writer did not finish (crashed or still writing)",
                        path), shard_fail(s);
  if (count > (s->size - SHARD_HEADER) / (uint64_t)s->token_bytes || SHARD_HEADER + count * s->token_bytes != s->size)
    return nb_data__err(ctx, NB_ERR_FORMAT, "token shard '%s': header says %llu tokens of %d bytes but the file has %zu "
                        "data bytes (truncated, or the writer did not finish)", path, (unsigned long long)count,
                        s->token_bytes, s->size - SHARD_HEADER), shard_fail(s);
  s->count = (int64_t)count;
  s->vocab = (int64_t)vocab;
  return s;
}

void nb_data_shard_close(nb_data_shard *s) {
  if (!s) return;
  if (s->base) munmap((void *)s->base, s->size);
  nb_strfree(s->ctx, s->path);
  nb_dealloc(s->ctx, s, sizeof *s);
}

int64_t nb_data_shard_count(const nb_data_shard *s) { return s->count; }
int64_t nb_data_shard_documents(const nb_data_shard *s) { return s->docs; }
int64_t nb_data_shard_vocab(const nb_data_shard *s) { return s->vocab; }
int nb_data_shard_token_bytes(const nb_data_shard *s) { return s->token_bytes; }
uint64_t nb_data_shard_checksum(const nb_data_shard *s) { return s->data_checksum; }

nb_status nb_data_shard_read(const nb_data_shard *s, int64_t start, int64_t n, int32_t *out) {
  if (start < 0 || n < 0 || start > s->count || n > s->count - start)
    return nb_data__err(s->ctx, NB_ERR_INVALID_ARG, "token shard '%s': tokens [%lld, %lld) out of range [0, %lld)",
                        s->path, (long long)start, (long long)(start + n), (long long)s->count);
  const uint8_t *p = s->base + SHARD_HEADER + (size_t)start * (size_t)s->token_bytes;
  if (s->token_bytes == 2) {
    const uint16_t *q = (const uint16_t *)p; /* the data starts 64-byte aligned */
    for (int64_t i = 0; i < n; i++) out[i] = q[i];
  } else {
    const uint32_t *q = (const uint32_t *)p;
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)q[i];
  }
  return NB_OK;
}

nb_status nb_data_shard_verify(const nb_data_shard *s, nb_data_progress_fn progress, void *ud) {
  const uint8_t *data = s->base + SHARD_HEADER;
  size_t bytes = (size_t)s->count * (size_t)s->token_bytes, step = 1 << 24;
  XXH3_state_t *h = XXH3_createState();
  if (!h) return nb_data__err(s->ctx, NB_ERR_NOMEM, "token shard '%s': out of memory", s->path);
  XXH3_64bits_reset(h);
  int64_t bad = -1;
  for (size_t off = 0; off < bytes; off += step) {
    size_t n = bytes - off < step ? bytes - off : step;
    XXH3_64bits_update(h, data + off, n);
    for (size_t i = 0; bad < 0 && i < n; i += (size_t)s->token_bytes) {
      uint32_t id = s->token_bytes == 2 ? (uint32_t)data[off + i] | (uint32_t)data[off + i + 1] << 8
                                        : nb_data__get32(data + off + i);
      if ((int64_t)id >= s->vocab) bad = (int64_t)((off + i) / (size_t)s->token_bytes);
    }
    if (progress) progress(ud, off + n, bytes);
  }
  uint64_t got = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  if (got != s->data_checksum)
    return nb_data__err(s->ctx, NB_ERR_FORMAT, "token shard '%s': data checksum mismatch (stored %016llx, computed "
                        "%016llx)", s->path, (unsigned long long)s->data_checksum, (unsigned long long)got);
  if (bad >= 0)
    return nb_data__err(s->ctx, NB_ERR_FORMAT, "token shard '%s': token %lld is outside the vocab [0, %lld)", s->path,
                        (long long)bad, (long long)s->vocab);
  return NB_OK;
}
