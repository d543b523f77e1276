/* Claim: a decode step's one-row products follow the memory's rate when
 * each thread reads whole rows of [out, in] weights (x @ W^T, one contiguous
 * run a thread), and not when it reads a band of columns of [in, out]
 * weights (x @ W, a piece of every row); and the serving engine's layout,
 * panels of 64 output features (src/serve/step.c, pack_kernels: one run a
 * thread, no register transposes).
 * The 85 products of one Llama-134m decode step (per layer 4 x 768 x 768,
 * 2 x 768 x 2048, 2048 x 768, then 768 x 32000), each weight its own array
 * in both layouts (2 x 438 MB: the set does not stay in the L3), on T
 * threads that wait for each other after every product, as the pool does:
 *   read:  a plain vector sum over each thread's contiguous part of each weight
 *   bands: nabla's sgemm, x @ W, W [in, out], a band of columns a thread (blas.c's cut)
 *   rows:  nabla's sgemm, x @ W^T, W [out, in], a band of whole rows a thread
 *   panels: nabla's sgemm, x @ W, W [out / 64, in, 64], a band of whole panels a thread
 * The four alternate within every repetition. The VM's memory speed drifts
 * (a read of 10 to 15 ms here within minutes), so besides the medians of
 * all repetitions the medians of the fast ones (read under 0.8 x the median
 * read) are printed; --raw prints every repetition's three times (ms).
 *
 *   ./build/bench_gemv_layout [--threads T] [--reps R] [--raw]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/sgemm.h"
#include "bench_util.h"

enum { NP = 85, MODES = 4, MAX_THREADS = 16, MAX_REPS = 400 };
static const char *const mode_names[MODES] = {"read", "bands", "rows", "panels"};

typedef struct bench {
  int64_t k[NP], n[NP];
  float *w[NP], *wt[NP], *wp[NP], *x, *y;
  int threads, mode;
  nb_sgemm_isa isa;
  atomic_int arrived, phase, go;
  double sink[MAX_THREADS];
} bench;

/* every thread waits for all the others (a pool's join after each product) */
static void barrier(bench *b, int *phase) {
  *phase = !*phase;
  if (atomic_fetch_add(&b->arrived, 1) == b->threads - 1) atomic_store(&b->arrived, 0), atomic_store(&b->phase, *phase);
  else
    while (atomic_load(&b->phase) != *phase) __builtin_ia32_pause();
}

/* thread t's part of n outputs: multiples of `align` (16; whole panels), as blas.c cuts them */
static void part(const bench *b, int t, int64_t n, int64_t align, int64_t *j0, int64_t *nc) {
  int64_t per = (n / b->threads + align - 1) / align * align, lo = per * t, hi = t == b->threads - 1 ? n : per * (t + 1);
  *j0 = lo < n ? lo : n, *nc = (hi < n ? hi : n) - *j0;
}

static void pass(bench *b, int t, int mode, int *phase) {
  double s = 0;
  for (int i = 0; i < NP; i++) {
    int64_t j0, nc, k = b->k[i], n = b->n[i];
    part(b, t, n, mode == 3 ? NB_SGEMM_PANEL : 16, &j0, &nc);
    if (nc > 0) {
      bool ok = true;
      if (mode == 0) s += bench_read_sum(b->w[i] + j0 * k, (size_t)(nc * k));
      else if (mode == 1) ok = nb_cpu__sgemm_on(b->isa, false, false, 1, nc, k, b->x, k, b->w[i] + j0, n, b->y + j0, nc);
      else if (mode == 2) ok = nb_cpu__sgemm_on(b->isa, false, true, 1, nc, k, b->x, k, b->wt[i] + j0 * k, k, b->y + j0, nc);
      else ok = nb_cpu__sgemm_panels_on(b->isa, false, 1, nc, k, b->x, k, b->wp[i] + j0 * k, b->y + j0, nc);
      if (!ok) fprintf(stderr, "sgemm failed\n"), exit(1);
    }
    barrier(b, phase);
  }
  b->sink[t] += s;
}

typedef struct worker_arg {
  bench *b;
  int t;
} worker_arg;

static void *worker(void *u) {
  worker_arg *w = u;
  int phase = 0, seen = 0;
  for (;;) {
    int go;
    while ((go = atomic_load(&w->b->go)) == seen) __builtin_ia32_pause();
    seen = go;
    int mode = w->b->mode; /* read once: the caller moves on as soon as the last barrier opens */
    if (mode < 0) return NULL;
    pass(w->b, w->t, mode, &phase);
  }
}

static double median_of(const double *v, int n) {
  double s[MAX_REPS];
  memcpy(s, v, sizeof(double) * (size_t)n);
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
      double x = s[j];
      s[j] = s[j - 1], s[j - 1] = x;
    }
  return n ? (n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2])) : 0;
}

int main(int argc, char **argv) {
  static bench b;
  int reps = 41;
  bool raw = false;
  b.threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) b.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--raw")) raw = true;
    else return fprintf(stderr, "usage: %s [--threads T] [--reps R] [--raw]\n", argv[0]), 2;
  }
  if (b.threads < 1 || b.threads > MAX_THREADS || reps < 1 || reps > MAX_REPS)
    return fprintf(stderr, "--threads 1..%d, --reps 1..%d\n", MAX_THREADS, MAX_REPS), 2;
  b.isa = nb_cpu__sgemm_best();
  int n = 0;
  static const int64_t lk[7] = {768, 768, 768, 768, 768, 768, 2048}, ln[7] = {768, 768, 768, 768, 2048, 2048, 768};
  for (int l = 0; l < 12; l++)
    for (int q = 0; q < 7; q++) b.k[n] = lk[q], b.n[n] = ln[q], n++;
  b.k[n] = 768, b.n[n] = 32000;
  double bytes = 0;
  for (int i = 0; i < NP; i++) {
    size_t e = (size_t)(b.k[i] * b.n[i]);
    b.w[i] = aligned_alloc(64, e * 4), b.wt[i] = aligned_alloc(64, e * 4), b.wp[i] = aligned_alloc(64, e * 4);
    if (!b.w[i] || !b.wt[i] || !b.wp[i]) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t q = 0; q < e; q++) b.w[i][q] = b.wt[i][q] = b.wp[i][q] = (float)(q % 7) * 0.01f;
    bytes += (double)e * 4;
  }
  b.x = aligned_alloc(64, 2048 * 4), b.y = aligned_alloc(64, 32000 * 4);
  for (int q = 0; q < 2048; q++) b.x[q] = 0.5f;
  pthread_t th[MAX_THREADS];
  worker_arg wa[MAX_THREADS];
  for (int t = 1; t < b.threads; t++) wa[t] = (worker_arg){&b, t}, pthread_create(&th[t], NULL, worker, &wa[t]);
  static double tm[MODES][MAX_REPS];
  int phase = 0;
  for (int r = 0; r < reps; r++) {
    for (int m = 0; m < MODES; m++) {
      b.mode = m;
      double t0 = now_s();
      atomic_fetch_add(&b.go, 1);
      pass(&b, 0, m, &phase);
      tm[m][r] = now_s() - t0;
    }
    if (raw)
      printf("rep %d: read %.3f bands %.3f rows %.3f panels %.3f ms\n", r, tm[0][r] * 1e3, tm[1][r] * 1e3, tm[2][r] * 1e3,
             tm[3][r] * 1e3);
  }
  b.mode = -1;
  atomic_fetch_add(&b.go, 1);
  for (int t = 1; t < b.threads; t++) pthread_join(th[t], NULL);
  double read_med = median_of(tm[0], reps);
  static double fast[MODES][MAX_REPS];
  int nf = 0;
  for (int r = 0; r < reps; r++)
    if (tm[0][r] < 0.8 * read_med) {
      for (int m = 0; m < MODES; m++) fast[m][nf] = tm[m][r];
      nf++;
    }
  printf("85 products of a Llama-134m decode step, %.1f MB of weights, %d threads, %s kernel, %d repetitions:\n", bytes / 1e6,
         b.threads, nb_cpu__sgemm_name(b.isa), reps);
  for (int m = 0; m < MODES; m++) {
    double all = median_of(tm[m], reps), f = median_of(fast[m], nf);
    printf("  %-6s median %6.2f ms (%5.1f GB/s); fast repetitions (%d): %6.2f ms (%5.1f GB/s)\n", mode_names[m], all * 1e3,
           bytes / all / 1e9, nf, f * 1e3, nf ? bytes / f / 1e9 : 0.0);
  }
  printf("RESULT gemv_layout threads %d: read %.3f bands %.3f rows %.3f panels %.3f ms; fast %d: read %.3f bands %.3f rows "
         "%.3f panels %.3f ms\n",
         b.threads, read_med * 1e3, median_of(tm[1], reps) * 1e3, median_of(tm[2], reps) * 1e3, median_of(tm[3], reps) * 1e3,
         nf, median_of(fast[0], nf) * 1e3, median_of(fast[1], nf) * 1e3, median_of(fast[2], nf) * 1e3,
         median_of(fast[3], nf) * 1e3);
  double sink = 0;
  for (int t = 0; t < b.threads; t++) sink += b.sink[t];
  return sink < 0; /* keeps the sums alive */
}
