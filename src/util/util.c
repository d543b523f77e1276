/* The shared helpers of src/util/util.h. Not here: anything that needs a
 * context (allocation accounting, error messages): that is the core's. */
#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- clocks -------------------------------------------------------------- */

int64_t nb_util__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double nb_util__now_s(void) { return (double)nb_util__now_ns() * 1e-9; }
double nb_util__now_ms(void) { return (double)nb_util__now_ns() * 1e-6; }

double nb_util__wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- directories and files ------------------------------------------------ */

int nb_util__mkdir_p(const char *path, unsigned mode, int (*before_mkdir)(void), char *failed, size_t cap) {
  char buf[4096];
  size_t n = strlen(path);
  if (cap) snprintf(failed, cap, "%s", path);
  if (n == 0) return ENOENT;
  if (n >= sizeof buf) return ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    struct stat st;
    int err = 0;
    if (stat(buf, &st) != 0) {
      if (before_mkdir && before_mkdir() != 0) err = EIO;
      else if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST) err = errno;
    } else if (!S_ISDIR(st.st_mode)) {
      err = ENOTDIR;
    }
    if (err) {
      if (cap) snprintf(failed, cap, "%s", buf);
      return err;
    }
    buf[i] = c;
  }
  return 0;
}

int nb_util__read_file(const char *path, size_t max, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno;
  struct stat st;
  int err = fstat(fileno(f), &st) != 0 ? errno
            : S_ISDIR(st.st_mode)      ? EISDIR
            : !S_ISREG(st.st_mode)     ? EINVAL
            : (uint64_t)st.st_size > max ? EFBIG
                                         : 0;
  size_t n = err ? 0 : (size_t)st.st_size;
  char *buf = err ? NULL : malloc(n + 1);
  if (!err && !buf) err = ENOMEM;
  if (!err && fread(buf, 1, n, f) != n) err = ferror(f) ? EIO : ENODATA; /* shrank while read */
  fclose(f);
  if (err) {
    free(buf);
    return err;
  }
  buf[n] = 0;
  *data = buf;
  *len = n;
  return 0;
}

/* ---- CRC-32C --------------------------------------------------------------- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    crc_table[0][i] = c;
  }
  for (int t = 1; t < 8; t++)
    for (int i = 0; i < 256; i++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t get32le(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t nb_util__crc32c(const void *p, size_t n) { /* slicing by 8 */
  pthread_once(&crc_once, crc_init);
  const uint8_t *b = p;
  uint32_t c = 0xffffffffu;
  while (n >= 8) {
    uint32_t lo = c ^ get32le(b), hi = get32le(b + 4);
    c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
        crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
        crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    b += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *b++) & 0xff];
  return c ^ 0xffffffffu;
}
