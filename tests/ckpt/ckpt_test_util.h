/* Helpers shared by the ckpt tests (header-only, static): deterministic
 * arrays of every dtype, tree comparison. Scratch directories and file
 * edits are testfs.h's. */
#ifndef NABLA_CKPT_TEST_UTIL_H
#define NABLA_CKPT_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"

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

#endif
