/* Shared by the benchmarks (header-only, static): a monotonic clock and the
 * median of repeated timings. Not here: anything one benchmark alone needs. */
#ifndef NABLA_BENCH_UTIL_H
#define NABLA_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Seconds (now_ms: milliseconds) on the monotonic clock. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double now_ms(void) { return 1e3 * now_s(); }

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

#endif
