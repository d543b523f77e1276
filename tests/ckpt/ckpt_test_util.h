/* Helpers shared by the ckpt tests (header-only, static): scratch
 * directories, deterministic arrays of every dtype, tree comparison. */
#ifndef NABLA_CKPT_TEST_UTIL_H
#define NABLA_CKPT_TEST_UTIL_H

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
  snprintf(buf, cap, "%s/nabla_ckpt_%s_XXXXXX", base && *base ? base : "/tmp", tag);
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

/* An array whose bytes are a function of (seed, byte index): any bit
 * pattern, NaNs included, so comparisons are bitwise. */
static inline nb_array *pattern_array(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, uint64_t seed) {
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  if (!a) return NULL;
  uint8_t *p = nb_array_data_mut(a);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < nb_array_nbytes(a); i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = (uint8_t)(t == NB_BOOL ? (x & 1) : x);
  }
  return a;
}

/* Trees equal: same paths in order, arrays bitwise equal. */
static inline bool trees_equal(const nb_tree *a, const nb_tree *b) {
  if (nb_tree_size(a) != nb_tree_size(b)) return false;
  for (size_t i = 0; i < nb_tree_size(a); i++) {
    if (strcmp(nb_tree_path(a, i), nb_tree_path(b, i)) != 0) return false;
    const nb_leaf *x = nb_tree_leaf(a, i), *y = nb_tree_leaf(b, i);
    if (x->kind != NB_LEAF_ARRAY || y->kind != NB_LEAF_ARRAY || !nb_array_equal(x->array, y->array)) return false;
  }
  return true;
}

/* Same as trees_equal after prefixing every path of b with "<item>/". */
static inline bool item_equal(const nb_tree *restored, const char *item, const nb_tree *orig) {
  nb_tree *sub = nb_tree_select_prefix(restored, item, true);
  bool ok = sub && trees_equal(sub, orig);
  nb_tree_destroy(sub);
  return ok;
}

static inline void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    perror(path);
    exit(1);
  }
  fclose(f);
}

/* Flips one byte of a file at offset (from the end when negative). */
static inline void flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
  int c = fgetc(f);
  fseek(f, -1, SEEK_CUR);
  fputc(c ^ 0x5a, f);
  fclose(f);
}

#endif
