/* Shared by the benchmarks (header-only, static): a monotonic clock, the
 * median of repeated timings and a synthetic language-model batch. Not here:
 * anything one benchmark alone needs. */
#ifndef NABLA_BENCH_UTIL_H
#define NABLA_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

#include "nabla/nabla.h"

/* Seconds (now_ms: milliseconds) on the monotonic clock. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double now_ms(void) { return 1e3 * now_s(); }

/* Seconds of CPU time this process has used, all its threads together: on a
 * loaded machine, one pinned thread's step costs its CPU time, whatever share
 * of the core the other processes took (the wall clock counts their turns). */
static inline double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort order of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v[0..n) in place (so v[0] and v[n - 1] are then the minimum and the
 * maximum) and returns its median: the middle value, or the mean of the two
 * middle ones when n is even. n >= 1. */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A synthetic language-model batch (a new tree, or NULL with the error on
 * ctx): "inputs" i32 [B, T] of scattered ids below vocab, "targets" the same
 * sequence one token on. */
static inline nb_tree *bench_lm_batch(nb_ctx *ctx, int64_t B, int64_t T, int64_t vocab) {
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T + 1));
  if (!tok) return NULL;
  for (int64_t i = 0; i <= B * T; i++) tok[i] = (int32_t)((i * 7919 + 13) % vocab);
  nb_array *x = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){B, T}, tok);
  nb_array *y = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){B, T}, tok + 1);
  free(tok);
  nb_tree *batch = x && y ? nb_tree_create(ctx) : NULL;
  if (batch && (nb_tree_set_array(batch, "inputs", x) != NB_OK || nb_tree_set_array(batch, "targets", y) != NB_OK)) {
    nb_tree_destroy(batch);
    batch = NULL;
  }
  nb_array_release(x);
  nb_array_release(y);
  return batch;
}

#endif
