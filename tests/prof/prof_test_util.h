/* Helpers shared by the prof tests (header-only, static): a scratch
 * directory, whole-file reads and writes. */
#ifndef NABLA_PROF_TEST_UTIL_H
#define NABLA_PROF_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

/* A fresh scratch directory under $TMPDIR (or /tmp); removed by rm_rf. */
static inline void scratch_dir(char *buf, size_t cap, const char *tag) {
  const char *base = getenv("TMPDIR");
  snprintf(buf, cap, "%s/nabla_prof_%s_XXXXXX", base && *base ? base : "/tmp", tag);
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    exit(1);
  }
}

static inline void rm_rf(const char *path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

/* The whole file as a new NUL-terminated malloc'ed buffer (free()), or NULL. */
static inline char *slurp(const char *path, size_t *n_out) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *p = malloc(cap + 1);
  size_t k;
  while (p && (k = fread(p + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      char *q = realloc(p, 2 * cap + 1);
      if (!q) free(p);
      p = q, cap *= 2;
    }
  }
  fclose(f);
  if (p) p[n] = 0;
  if (n_out) *n_out = n;
  return p;
}

static inline void spit(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

#endif
