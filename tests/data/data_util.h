/* Helpers shared by the data library's tests: a scratch directory, small
 * file edits (flip a byte, truncate), and elements made from strings. */
#ifndef NABLA_TEST_DATA_UTIL_H
#define NABLA_TEST_DATA_UTIL_H

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"

static char tdir[256];

static inline const char *tpath(char *buf, const char *name) {
  snprintf(buf, 512, "%s/%s", tdir, name);
  return buf;
}

static inline void tdir_make(void) {
  snprintf(tdir, sizeof tdir, "/tmp/nabla_data_test_XXXXXX");
  if (!mkdtemp(tdir)) {
    perror("mkdtemp");
    exit(1);
  }
}

static inline int rm_entry(const char *p, const struct stat *s, int flag, struct FTW *f) {
  (void)s, (void)flag, (void)f;
  return remove(p);
}

static inline void tdir_remove(void) { nftw(tdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static inline void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  fputs(text, f);
  fclose(f);
}

static inline long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static inline void flip_byte(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  fseek(f, off, SEEK_SET);
  int c = fgetc(f);
  fseek(f, off, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
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
