/* TensorBoard event files: write scalars, read them back with a decoder of
 * the test's own (bitwise CRC32C, generic protobuf field walk that rejects
 * unknown fields and wrong wire types), the file name, a second writer in the
 * same directory, bad log directories and arguments, allocation failures. */
#include <math.h>
#include <time.h>
#include <unistd.h>

#include "testfs.h"

/* ---- an independent decoder --------------------------------------------- */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

static uint64_t le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

typedef struct rec {
  double wall_time;
  bool has_step, has_version, has_value;
  int64_t step;
  char version[64], tag[64];
  float value;
} rec;

/* A protobuf reader over [p, end): false on any malformation. */
typedef struct pb {
  const uint8_t *p, *end;
} pb;

static bool pb_varint(pb *b, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
    uint8_t c = *b->p++;
    *v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

static bool pb_bytes(pb *b, pb *sub) {
  uint64_t n;
  if (!pb_varint(b, &n) || n > (uint64_t)(b->end - b->p)) return false;
  sub->p = b->p, sub->end = b->p + n;
  b->p += n;
  return true;
}

static bool pb_fixed(pb *b, int bytes, uint64_t *v) {
  if (b->end - b->p < bytes) return false;
  *v = le(b->p, bytes);
  b->p += bytes;
  return true;
}

static bool copy_str(pb s, char *out, size_t cap) {
  size_t n = (size_t)(s.end - s.p);
  if (n >= cap) return false;
  memcpy(out, s.p, n), out[n] = 0;
  return true;
}

/* Summary.Value{tag = 1 string, simple_value = 2 float}: exactly one value. */
static bool decode_summary(pb s, rec *r) {
  int nvalues = 0;
  while (s.p < s.end) {
    uint64_t key;
    pb v;
    if (!pb_varint(&s, &key) || key != (1 << 3 | 2) || !pb_bytes(&s, &v)) return false;
    nvalues++;
    while (v.p < v.end) {
      uint64_t k, x;
      pb str;
      if (!pb_varint(&v, &k)) return false;
      if (k == (1 << 3 | 2)) {
        if (!pb_bytes(&v, &str) || !copy_str(str, r->tag, sizeof r->tag)) return false;
      } else if (k == (2 << 3 | 5)) {
        if (!pb_fixed(&v, 4, &x)) return false;
        uint32_t bits = (uint32_t)x;
        memcpy(&r->value, &bits, 4);
        r->has_value = true;
      } else {
        return false;
      }
    }
  }
  return nvalues == 1;
}

/* Event{wall_time = 1 double, step = 2 int64, file_version = 3 string, summary = 5}. */
static bool decode_event(pb b, rec *r) {
  memset(r, 0, sizeof *r);
  bool has_time = false;
  while (b.p < b.end) {
    uint64_t key, x;
    pb sub;
    if (!pb_varint(&b, &key)) return false;
    switch (key) {
    case 1 << 3 | 1:
      if (!pb_fixed(&b, 8, &x)) return false;
      memcpy(&r->wall_time, &x, 8), has_time = true;
      break;
    case 2 << 3 | 0:
      if (!pb_varint(&b, &x)) return false;
      r->step = (int64_t)x, r->has_step = true;
      break;
    case 3 << 3 | 2:
      if (!pb_bytes(&b, &sub) || !copy_str(sub, r->version, sizeof r->version)) return false;
      r->has_version = true;
      break;
    case 5 << 3 | 2:
      if (!pb_bytes(&b, &sub) || !decode_summary(sub, r)) return false;
      break;
    default:
      return false;
    }
  }
  return has_time;
}

/* Decodes the whole file into recs[0..cap); returns the count, or -1 with
 * the reason printed. */
static int decode_file(const uint8_t *p, size_t n, rec *recs, int cap) {
  size_t off = 0;
  int count = 0;
  while (off < n) {
    if (n - off < 12 || count == cap) return fprintf(stderr, "record %d: truncated header\n", count), -1;
    uint64_t len = le(p + off, 8);
    if ((uint32_t)le(p + off + 8, 4) != mask(crc32c_bitwise(p + off, 8)))
      return fprintf(stderr, "record %d: bad length crc\n", count), -1;
    if (len > n - off - 16) return fprintf(stderr, "record %d: truncated data\n", count), -1;
    const uint8_t *data = p + off + 12;
    if ((uint32_t)le(data + len, 4) != mask(crc32c_bitwise(data, len)))
      return fprintf(stderr, "record %d: bad data crc\n", count), -1;
    if (!decode_event((pb){data, data + len}, &recs[count]))
      return fprintf(stderr, "record %d: malformed event\n", count), -1;
    count++;
    off += 16 + len;
  }
  return count;
}

static int decode_path(const char *path, rec *recs, int cap) {
  size_t n;
  char *p = nb_test_read_file(path, &n);
  if (!p) return -1;
  int k = decode_file((const uint8_t *)p, n, recs, cap);
  free(p);
  return k;
}

/* ---- tests -------------------------------------------------------------- */

typedef struct scalar {
  const char *tag;
  int64_t step;
  double value;
} scalar;

static const scalar scalars[] = {
    {"train/loss", 0, 10.25},  {"train/lr", 0, 3e-4},      {"train/loss", 1, 9.5},
    {"train/loss", 127, 0.1},  {"train/loss", 128, -2.5},  {"a tag with spaces/é/\xf0\x9f\x99\x82", 300, 1e30},
    {"train/loss", (int64_t)1 << 40, 7}, {"neg", -3, 0},   {"nan", 5, NAN},
    {"inf", 6, -INFINITY},
};
#define NSCALARS ((int)(sizeof scalars / sizeof scalars[0]))

static bool same_float(float a, double want) {
  float w = (float)want;
  return isnan(w) ? isnan(a) : memcmp(&a, &w, 4) == 0;
}

static void check_records(const rec *r, int n, int want_scalars, double t0, double t1) {
  CHECK_MSG(n == 1 + want_scalars, "%d records, wanted %d", n, 1 + want_scalars);
  if (n < 1) return;
  CHECK(r[0].has_version && !strcmp(r[0].version, "brain.Event:2") && !r[0].has_value && !r[0].has_step);
  for (int i = 0; i < n; i++) {
    CHECK_MSG(r[i].wall_time >= t0 - 1 && r[i].wall_time <= t1 + 1, "wall_time %.3f not in [%.3f, %.3f]",
              r[i].wall_time, t0, t1);
    if (i > 0) CHECK(r[i].wall_time >= r[i - 1].wall_time);
  }
  for (int i = 1; i < n && i <= want_scalars; i++) {
    const scalar *s = &scalars[i - 1];
    CHECK_MSG(r[i].has_step && r[i].step == s->step, "record %d step %lld", i, (long long)r[i].step);
    CHECK_MSG(!strcmp(r[i].tag, s->tag), "record %d tag '%s'", i, r[i].tag);
    CHECK_MSG(r[i].has_value && same_float(r[i].value, s->value), "record %d value %g, wanted %g", i, r[i].value,
              s->value);
    CHECK(!r[i].has_version);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_name(const char *path, const char *logdir, double t0) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  size_t ld = strlen(logdir);
  CHECK(!strncmp(path, logdir, ld) && path[ld] == '/');
  const char *base = path + ld + 1;
  long long t = 0;
  int used = 0;
  CHECK_MSG(sscanf(base, "events.out.tfevents.%10lld.%n", &t, &used) == 1 && used == 31, "name '%s'", base);
  CHECK_MSG(t >= (long long)t0 - 1 && t <= (long long)now() + 1, "time %lld in '%s'", t, base);
  char want[512];
  snprintf(want, sizeof want, "%s.%ld.", host, (long)getpid());
  CHECK_MSG(!strncmp(base + used, want, strlen(want)), "'%s' lacks host.pid '%s'", base, want);
}

static void test_roundtrip(nb_ctx *ctx, const char *dir) {
  char logdir[4200];
  snprintf(logdir, sizeof logdir, "%s/run/tb", dir); /* two levels that do not exist yet */
  double t0 = now();
  nb_prof_tb *w = nb_prof_tb_create(ctx, logdir);
  CHECK_MSG(w != NULL, "%s", nb_ctx_error(ctx));
  if (!w) return;
  char path[4200];
  snprintf(path, sizeof path, "%s", nb_prof_tb_path(w));
  test_name(path, logdir, t0);
  const char *tail = strrchr(path, '.');
  CHECK(tail && !strcmp(tail, ".0")); /* the first writer of this second gets counter 0 */

  rec r[32];
  CHECK(decode_path(path, r, 32) == 1); /* the version record is there at once */
  for (int i = 0; i < NSCALARS; i++) CHECK_OK(ctx, nb_prof_tb_scalar(w, scalars[i].tag, scalars[i].step, scalars[i].value));
  CHECK_OK(ctx, nb_prof_tb_flush(w));
  check_records(r, decode_path(path, r, 32), NSCALARS, t0, now()); /* visible after a flush */

  /* a second writer in the same directory gets its own file */
  nb_prof_tb *w2 = nb_prof_tb_create(ctx, logdir);
  CHECK(w2 && strcmp(nb_prof_tb_path(w2), path) != 0);
  if (w2) CHECK_OK(ctx, nb_prof_tb_scalar(w2, scalars[0].tag, scalars[0].step, scalars[0].value));
  nb_prof_tb_destroy(w2);
  CHECK(nb_ctx_status(ctx) == NB_OK);

  CHECK(nb_prof_tb_scalar(w, "", 1, 1.0) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "tag is empty");
  CHECK(nb_prof_tb_scalar(w, NULL, 1, 1.0) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "tag is NULL");
  /* not UTF-8: a stray byte, a truncated sequence, an overlong '/', a
   * surrogate, past U+10FFFF */
  const char *bad[] = {"loss\xff", "a\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"};
  for (int i = 0; i < 6; i++) {
    CHECK_MSG(nb_prof_tb_scalar(w, bad[i], 1, 1.0) == NB_ERR_INVALID_ARG, "bad tag %d accepted", i);
    CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "tag is not valid UTF-8");
  }
  nb_prof_tb_destroy(w);
  nb_prof_tb_destroy(NULL);
  CHECK(nb_ctx_status(ctx) == NB_OK);
  int n = decode_path(path, r, 32);
  check_records(r, n, NSCALARS, t0, now()); /* the bad calls wrote nothing */

  /* the decoder is not a rubber stamp: one flipped byte in the last record's
   * data (its float) fails the data CRC */
  size_t len;
  char *bytes = nb_test_read_file(path, &len);
  CHECK(bytes && len > 8);
  if (bytes) {
    bytes[len - 6] ^= 1;
    CHECK(decode_file((const uint8_t *)bytes, len, r, 32) == -1);
    free(bytes);
  }
}

static void test_bad_logdir(nb_ctx *ctx, const char *dir) {
  char file[4200], under[4300];
  snprintf(file, sizeof file, "%s/plain_file", dir);
  nb_test_write_text(file, "not a directory\n");
  CHECK(nb_prof_tb_create(ctx, file) == NULL);
  CHECK_ERR(ctx, NB_ERR_IO, file);
  snprintf(under, sizeof under, "%s/sub/tb", file);
  CHECK(nb_prof_tb_create(ctx, under) == NULL);
  CHECK_ERR(ctx, NB_ERR_IO, "cannot create directory");
  CHECK(nb_prof_tb_create(ctx, "") == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "logdir is empty");
  CHECK(nb_prof_tb_create(ctx, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "logdir is NULL");
}

/* Fail the n-th allocation for n = 1.. until create + write + destroy all
 * succeed: every failure is a clean NB_ERR_NOMEM with nothing leaked. */
static void test_alloc_failures(nb_ctx *ctx, const char *dir) {
  char logdir[4200];
  snprintf(logdir, sizeof logdir, "%s/oom", dir);
  size_t base = nb_ctx_bytes_in_use(ctx);
  bool done = false;
  for (int64_t n = 1; n < 50 && !done; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_prof_tb *w = nb_prof_tb_create(ctx, logdir);
    nb_status s = w ? nb_prof_tb_scalar(w, "a/long/enough/tag/to/need/a/bigger/buffer", 1, 2.0) : nb_ctx_status(ctx);
    nb_prof_tb_destroy(w);
    nb_ctx_fail_alloc_after(ctx, 0);
    CHECK_MSG(s == NB_OK || s == NB_ERR_NOMEM, "n=%lld: %s", (long long)n, nb_ctx_error(ctx));
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "n=%lld: %zu bytes leaked", (long long)n, nb_ctx_bytes_in_use(ctx) - base);
    done = s == NB_OK;
    nb_ctx_clear_error(ctx);
  }
  CHECK(done);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "tb");
  test_roundtrip(ctx, dir);
  test_bad_logdir(ctx, dir);
  test_alloc_failures(ctx, dir);
  nb_test_rm_rf(dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("prof/test_tb");
}
