/* Shared by the benchmarks (header-only, static): a monotonic clock, the
 * median of repeated timings, a synthetic language-model batch, and the
 * read-bandwidth probe and random parameters of the decode benches. Not here:
 * anything one benchmark alone needs. */
#ifndef NABLA_BENCH_UTIL_H
#define NABLA_BENCH_UTIL_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
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

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The sum of p[0..n): four 16-lane accumulators, the fastest plain read (the
 * portable loop below, SSE at -O2, read at 0.75 of it on a Zen 4 core) */
__attribute__((target("avx512f"))) static inline double bench_sum_avx512(const float *p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i)), a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16)),
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32)), a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  double s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; i++) s += p[i];
  return s;
}
#endif

/* The sum of p[0..n): AVX-512 where the CPU has it, else a portable loop */
static inline double bench_read_sum(const float *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return bench_sum_avx512(p, n);
#endif
  float acc[16] = {0};
  double s = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += p[i + k];
  for (int k = 0; k < 16; k++) s += acc[k];
  for (; i < n; i++) s += p[i];
  return s;
}

typedef struct bench_bw_part {
  const float *p;
  size_t n;
  double sum;
} bench_bw_part;

static inline void *bench_bw_sum_part(void *u) {
  bench_bw_part *w = u;
  w->sum = bench_read_sum(w->p, w->n);
  return NULL;
}

/* GB/s reading a 1 GiB buffer with `threads` (<= 64) threads, best of 5:
 * the read bandwidth a memory-bound decode step is held to (the benches
 * that state a floor in bytes per token). 0 when out of memory. */
static inline double read_bandwidth(int threads) {
  size_t n = (size_t)1 << 28;
  float *buf = malloc(n * sizeof *buf);
  if (!buf) return 0;
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
  double best = 0, sink = 0;
  for (int r = 0; r < 5; r++) {
    pthread_t th[64];
    bench_bw_part w[64];
    double t0 = now_s();
    for (int k = 0; k < threads; k++) {
      w[k] = (bench_bw_part){buf + n / (size_t)threads * (size_t)k, n / (size_t)threads, 0};
      pthread_create(&th[k], NULL, bench_bw_sum_part, &w[k]);
    }
    for (int k = 0; k < threads; k++) pthread_join(th[k], NULL), sink += w[k].sum;
    double gbs = (double)(n * sizeof *buf) / (now_s() - t0) / 1e9;
    if (gbs > best) best = gbs;
  }
  free(buf);
  return sink > 0 ? best : best; /* sink keeps the sums alive */
}

/* Random model parameters for the decode benches: uniform(-0.05, 0.05)
 * weights, norm scales 1 (values do not change the work); cheap to make for
 * 124M parameters. */
static inline nb_tree *bench_random_params(nb_ctx *ctx, const nb_model_config *cfg) {
  nb_tree *spec = nb_model_param_spec(ctx, cfg, NB_F32), *p = nb_tree_create(ctx);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; spec && i < nb_tree_size(spec); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    bool scale = strstr(nb_tree_path(spec, i), "norm") != NULL;
    nb_array *x = nb_array_empty(ctx, NB_F32, a.shape.rank, a.shape.dims);
    float *d = nb_array_data_mut(x);
    for (int64_t k = 0; k < nb_array_size(x); k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      d[k] = scale ? 1.0f : (float)((double)(s >> 11) / 9007199254740992.0 * 0.1 - 0.05);
    }
    nb_tree_set_array(p, nb_tree_path(spec, i), x);
    nb_array_release(x);
  }
  nb_tree_destroy(spec);
  return p;
}

/* Bytes of weights one decode step reads: every parameter but the input
 * embedding and a learned position table (of those, one row) unless the
 * embedding is tied to the output. */
static inline double bench_decode_weight_bytes(const nb_model_config *c, const nb_tree *params) {
  double b = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i);
    nb_array *a = nb_tree_leaf(params, i)->array;
    bool one_row = !strcmp(p, "pos_embed/embedding") || (!strcmp(p, "embed/embedding") && !c->tie_embeddings);
    b += one_row ? (double)nb_array_dims(a)[1] * 4 : (double)nb_array_nbytes(a);
  }
  return b;
}

#endif
