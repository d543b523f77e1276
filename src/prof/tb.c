/* TensorBoard event files: TFRecord framing around Event protobufs, both
 * encoded here by hand (a few varints and fixed-width fields; no protobuf
 * library). Only what scalars need: wall_time, step, file_version and a
 * Summary of one simple_value. Not here: reading event files, histograms,
 * images. The format is described in docs/prof.md. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prof/internal.h"
#include "util/util.h"

struct nb_prof_tb {
  nb_ctx *ctx;
  FILE *f;
  nb_status err; /* sticky: the first write error */
  uint8_t *buf;  /* one framed record, reused */
  size_t cap;
  char path[NB_PROF__PATH_CAP];
};

/* ---- protobuf and TFRecord encoding ------------------------------------- */

/* Wire types of the tags: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. */
#define TAG(field, wire) ((uint8_t)((field) << 3 | (wire)))

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
  *p++ = (uint8_t)v;
  return p;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) *p++ = (uint8_t)(v >> (8 * i));
  return p;
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
  uint32_t c = nb_util__crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* The fields of one Event; a NULL version/tag leaves that field out. */
typedef struct event {
  double wall_time;
  bool has_step;
  int64_t step;
  const char *file_version;
  const char *tag;
  float value;
} event;

static size_t value_len(const event *e) { /* Summary.Value{tag = 1, simple_value = 2} */
  size_t t = strlen(e->tag);
  return 1 + varint_len(t) + t + 1 + 4;
}

static size_t summary_len(const event *e) { /* Summary{repeated Value value = 1} */
  size_t v = value_len(e);
  return 1 + varint_len(v) + v;
}

static size_t event_len(const event *e) {
  size_t n = 1 + 8;
  if (e->has_step) n += 1 + varint_len((uint64_t)e->step);
  if (e->file_version) n += 1 + varint_len(strlen(e->file_version)) + strlen(e->file_version);
  if (e->tag) n += 1 + varint_len(summary_len(e)) + summary_len(e);
  return n;
}

static uint8_t *put_event(uint8_t *p, const event *e) {
  uint64_t bits;
  memcpy(&bits, &e->wall_time, 8);
  *p++ = TAG(1, 1), p = put_le(p, bits, 8);
  if (e->has_step) *p++ = TAG(2, 0), p = put_varint(p, (uint64_t)e->step); /* int64: two's complement */
  if (e->file_version) {
    size_t n = strlen(e->file_version);
    *p++ = TAG(3, 2), p = put_varint(p, n);
    memcpy(p, e->file_version, n), p += n;
  }
  if (e->tag) {
    size_t t = strlen(e->tag);
    uint32_t fbits;
    memcpy(&fbits, &e->value, 4);
    *p++ = TAG(5, 2), p = put_varint(p, summary_len(e));
    *p++ = TAG(1, 2), p = put_varint(p, value_len(e));
    *p++ = TAG(1, 2), p = put_varint(p, t);
    memcpy(p, e->tag, t), p += t;
    *p++ = TAG(2, 5), p = put_le(p, fbits, 4);
  }
  return p;
}

/* Protobuf string fields must be UTF-8: TensorBoard's parser rejects the
 * whole file otherwise. Strict: no overlong forms, surrogates or code points
 * past U+10FFFF. */
static bool valid_utf8(const unsigned char *s) {
  while (*s) {
    unsigned c = *s++, n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
    if (n == 9) return false;
    uint32_t cp = n == 0 ? c : c & (0x3f >> n);
    for (unsigned k = 0; k < n; k++, s++) {
      if ((*s & 0xc0) != 0x80) return false;
      cp = cp << 6 | (*s & 0x3f);
    }
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
  }
  return true;
}

/* ---- writing ------------------------------------------------------------ */

static nb_status sticky_error(nb_prof_tb *w) {
  return nb_errorf(w->ctx, w->err, "event file '%s' failed earlier and takes no more records", w->path);
}

/* Frames e as one TFRecord: u64 length, masked crc of the length, data,
 * masked crc of the data (all little-endian). */
static nb_status write_event(nb_prof_tb *w, const event *e) {
  if (w->err != NB_OK) return sticky_error(w);
  size_t n = event_len(e), total = 8 + 4 + n + 4;
  if (total > w->cap) {
    uint8_t *nb = nb_alloc(w->ctx, total);
    if (!nb) return NB_ERR_NOMEM;
    if (w->buf) nb_dealloc(w->ctx, w->buf, w->cap);
    w->buf = nb, w->cap = total;
  }
  uint8_t *p = put_le(w->buf, n, 8);
  p = put_le(p, masked_crc(w->buf, 8), 4);
  uint8_t *data = p;
  p = put_event(p, e);
  if ((size_t)(p - data) != n) return nb_errorf(w->ctx, NB_ERR_INTERNAL, "event encoded to %td bytes, sized %zu", p - data, n);
  p = put_le(p, masked_crc(data, n), 4);
  if (fwrite(w->buf, 1, total, w->f) != total) {
    w->err = NB_ERR_IO;
    return nb_errorf(w->ctx, NB_ERR_IO, "cannot write event file '%s': %s", w->path, strerror(errno));
  }
  return NB_OK;
}

/* Creates logdir/events.out.tfevents.<time>.<host>.<pid>.<k> for the first
 * k whose name is new; returns the open descriptor or -1 (error on ctx). */
static int create_exclusive(nb_ctx *ctx, const char *logdir, char *path) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
  host[sizeof host - 1] = 0;
  for (char *c = host; *c; c++)
    if (*c == '/') *c = '_';
  long long t = (long long)time(NULL);
  for (int k = 0; k < 1000; k++) {
    int len = snprintf(path, NB_PROF__PATH_CAP, "%s/events.out.tfevents.%010lld.%s.%ld.%d", logdir, t, host,
                       (long)getpid(), k);
    if (len < 0 || len >= NB_PROF__PATH_CAP) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "event file path in '%s' too long", logdir);
      return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) {
      nb_errorf(ctx, NB_ERR_IO, "cannot create event file '%s': %s", path, strerror(errno));
      return -1;
    }
  }
  nb_errorf(ctx, NB_ERR_IO, "cannot create an event file in '%s': 1000 names taken", logdir);
  return -1;
}

/* ---- public API --------------------------------------------------------- */

nb_prof_tb *nb_prof_tb_create(nb_ctx *ctx, const char *logdir) {
  if (!ctx) return NULL;
  if (!logdir || !*logdir) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_tb_create: logdir is %s", logdir ? "empty" : "NULL");
    return NULL;
  }
  if (nb_prof__mkdirs(ctx, logdir) != NB_OK) return NULL;
  nb_prof_tb *w = nb_calloc(ctx, sizeof *w);
  if (!w) return NULL;
  w->ctx = ctx;
  int fd = create_exclusive(ctx, logdir, w->path);
  if (fd < 0) {
    nb_dealloc(ctx, w, sizeof *w);
    return NULL;
  }
  w->f = fdopen(fd, "wb");
  if (!w->f) {
    nb_errorf(ctx, NB_ERR_IO, "cannot open event file '%s': %s", w->path, strerror(errno));
    close(fd);
    unlink(w->path);
    nb_dealloc(ctx, w, sizeof *w);
    return NULL;
  }
  event e = {.wall_time = nb_util__wall_s(), .file_version = "brain.Event:2"};
  if (write_event(w, &e) != NB_OK || nb_prof_tb_flush(w) != NB_OK) {
    fclose(w->f);
    unlink(w->path);
    if (w->buf) nb_dealloc(ctx, w->buf, w->cap);
    nb_dealloc(ctx, w, sizeof *w);
    return NULL;
  }
  return w;
}

nb_status nb_prof_tb_scalar(nb_prof_tb *w, const char *tag, int64_t step, double value) {
  if (!w) return NB_ERR_INVALID_ARG;
  if (!tag || !*tag)
    return nb_errorf(w->ctx, NB_ERR_INVALID_ARG, "nb_prof_tb_scalar: tag is %s", tag ? "empty" : "NULL");
  if (!valid_utf8((const unsigned char *)tag))
    return nb_errorf(w->ctx, NB_ERR_INVALID_ARG, "nb_prof_tb_scalar: tag is not valid UTF-8");
  event e = {.wall_time = nb_util__wall_s(), .has_step = true, .step = step, .tag = tag, .value = (float)value};
  return write_event(w, &e);
}

nb_status nb_prof_tb_flush(nb_prof_tb *w) {
  if (!w) return NB_ERR_INVALID_ARG;
  if (w->err != NB_OK) return sticky_error(w);
  if (fflush(w->f) != 0) {
    w->err = NB_ERR_IO;
    return nb_errorf(w->ctx, NB_ERR_IO, "cannot write event file '%s': %s", w->path, strerror(errno));
  }
  return NB_OK;
}

const char *nb_prof_tb_path(const nb_prof_tb *w) { return w ? w->path : ""; }

void nb_prof_tb_destroy(nb_prof_tb *w) {
  if (!w) return;
  if (nb_prof_tb_flush(w) == NB_OK && fsync(fileno(w->f)) != 0)
    nb_errorf(w->ctx, NB_ERR_IO, "cannot fsync event file '%s': %s", w->path, strerror(errno));
  if (fclose(w->f) != 0 && w->err == NB_OK)
    nb_errorf(w->ctx, NB_ERR_IO, "cannot close event file '%s': %s", w->path, strerror(errno));
  if (w->buf) nb_dealloc(w->ctx, w->buf, w->cap);
  nb_dealloc(w->ctx, w, sizeof *w);
}
