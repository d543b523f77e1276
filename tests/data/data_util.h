/* Helpers shared by the data library's tests: one scratch directory for
 * the test (tdir), small file edits (truncate, copy), and elements made from
 * strings. Writing and flipping bytes of files are testfs.h's. */
#ifndef NABLA_TEST_DATA_UTIL_H
#define NABLA_TEST_DATA_UTIL_H

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"

static char tdir[256];

static inline const char *tpath(char *buf, const char *name) {
  snprintf(buf, 512, "%s/%s", tdir, name);
  return buf;
}

static inline void tdir_make(void) { nb_test_scratch_dir(tdir, sizeof tdir, "data", "test"); }

static inline void tdir_remove(void) { nb_test_rm_rf(tdir); }

static inline long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static inline void truncate_to(const char *path, long size) {
  if (truncate(path, size) != 0) perror("truncate");
}

/* Copies src to dst. */
static inline void copy_file(const char *src, const char *dst) {
  FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
  fclose(a);
  fclose(b);
}

#endif
