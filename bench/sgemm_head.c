/* Claim: the output head of a decode step, one row times a transposed B
 * (x[1, K] @ W^T with W [N, K], rows contiguous: gpt2's tied embedding,
 * 50257 x 768, 154 MB), reads W at the rate a plain streaming read of the
 * same bytes gets. nabla's sgemm (src/backend/cpu/sgemm.c) on T threads,
 * each taking whole tiles of contiguous rows as blas.c cuts them (tiles of a
 * multiple of 16 rows, 4 per thread, handed out in order); the read is a
 * plain vector sum (bench_util.h's bench_read_sum: AVX-512 where the CPU
 * has it) over the same bytes, split the same way.
 * COPIES copies of W are used in turn so that the set (default 4 x 154 MB)
 * does not stay in the L3. A and B timings alternate; medians of REPS, in
 * GB/s by wall time and by the process's CPU time.
 *
 * --layer: a layer's product instead, x[1, K] @ W with W [K, N] (the few-rows
 * path), cut as blas.c cuts it (column bands of at least 128, halved until
 * 1 per thread; every band reads a piece of each of W's rows); the read is
 * of the same bytes in contiguous parts. Give --copies so that the set
 * outgrows the L3 (768 x 3072: 9.4 MB a copy).
 *
 * --panels: the same layer product with W held as panels of 64 columns
 * ([N / 64, K, 64], the serving engine's layout; n a multiple of 64), cut
 * as for --layer with bands of whole panels: each band one contiguous run.
 *
 *   ./build/bench_sgemm_head [--n N] [--k K] [--threads T] [--copies C] [--reps R] [--isa c|avx2|avx512] [--layer | --panels]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/sgemm.h"
#include "bench_util.h"

typedef struct job {
  nb_sgemm_isa isa;
  bool read_only;          /* the streaming read instead of the product */
  bool layer;              /* x @ W, W [k, n], tiles of columns; else x @ W^T, W [n, k], tiles of rows */
  bool panels;             /* x @ W, W in panels, tiles of whole panels */
  int64_t n, k, tile, tiles;
  const float *x, *w;
  float *y;
  atomic_long next;        /* the next tile to take */
  double sum;              /* the reads' sums, kept alive */
} job;

static void *worker(void *u) {
  job *j = u;
  double sum = 0;
  for (long t; (t = atomic_fetch_add(&j->next, 1)) < j->tiles;) {
    int64_t r0 = t * j->tile, rows = j->n - r0 < j->tile ? j->n - r0 : j->tile; /* rows of W^T: columns of W */
    bool ok = true;
    if (j->read_only) sum += bench_read_sum(j->w + r0 * j->k, (size_t)(rows * j->k)); /* the same bytes, contiguous */
    else if (j->panels) ok = nb_cpu__sgemm_panels_on(j->isa, false, 1, rows, j->k, j->x, j->k, j->w + r0 * j->k, j->y + r0, rows);
    else if (j->layer) ok = nb_cpu__sgemm_on(j->isa, false, false, 1, rows, j->k, j->x, j->k, j->w + r0, j->n, j->y + r0, rows);
    else ok = nb_cpu__sgemm_on(j->isa, false, true, 1, rows, j->k, j->x, j->k, j->w + r0 * j->k, j->k, j->y + r0, rows);
    if (!ok) fprintf(stderr, "kernel %s not available on this CPU\n", nb_cpu__sgemm_name(j->isa)), exit(1);
  }
  j->sum += sum; /* racy between workers, but only a sink */
  return NULL;
}

static void run(job *j, int threads) {
  pthread_t th[64];
  atomic_store(&j->next, 0);
  for (int t = 1; t < threads; t++) pthread_create(&th[t], NULL, worker, j);
  worker(j);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
}

int main(int argc, char **argv) {
  int64_t n = 50257, k = 768;
  int threads = 1, copies = 4, reps = 9;
  bool layer = false, panels = false;
  nb_sgemm_isa isa = nb_cpu__sgemm_best();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--k") && i + 1 < argc) k = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--copies") && i + 1 < argc) copies = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layer")) layer = true;
    else if (!strcmp(argv[i], "--panels")) layer = panels = true;
    else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
      const char *s = argv[++i];
      isa = !strcmp(s, "c") ? NB_SGEMM_C : !strcmp(s, "avx2") ? NB_SGEMM_AVX2 : !strcmp(s, "avx512") ? NB_SGEMM_AVX512 : (nb_sgemm_isa)-1;
      if ((int)isa < 0) return fprintf(stderr, "--isa: unknown kernel '%s' (c, avx2, avx512)\n", s), 2;
    } else return fprintf(stderr, "unknown argument '%s'\n", argv[i]), 2;
  }
  if (n < 1 || k < 1 || threads < 1 || threads > 64 || copies < 1 || copies > 256 || reps < 1 || reps > 99)
    return fprintf(stderr, "bad arguments: --n, --k >= 1, --threads 1..64, --copies 1..256, --reps 1..99\n"), 2;
  if (panels && n % NB_SGEMM_PANEL) return fprintf(stderr, "--panels: n must be a multiple of %d\n", NB_SGEMM_PANEL), 2;
  size_t wbytes = (size_t)(n * k) * sizeof(float);
  float *w[256], *x = aligned_alloc(64, ((size_t)k * 4 + 63) / 64 * 64), *y = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
  if (!x || !y) return fprintf(stderr, "out of memory\n"), 1;
  for (int c = 0; c < copies; c++) {
    if (!(w[c] = aligned_alloc(64, (wbytes + 63) / 64 * 64))) return fprintf(stderr, "out of memory\n"), 1;
    for (int64_t e = 0; e < n * k; e++) w[c][e] = 1.0f / (float)((e + c) % 5 + 1);
  }
  for (int64_t p = 0; p < k; p++) x[p] = 1.0f / (float)(p % 7 + 1);
  /* blas.c's plan_tiles for one row: at T > 1 threads n is halved while the
   * halves keep 128 columns and 2^16 multiply-adds, up to 4 tiles per thread
   * (W^T) or 1 (W: a band of columns each); sides rounded up to multiples of 16 */
  int64_t tiles = 1;
  while (threads > 1 && tiles < (layer ? 1 : 4) * threads && (n + tiles - 1) / tiles >= 256 && ((n + tiles - 1) / tiles + 1) / 2 * k >= 65536)
    tiles *= 2;
  int64_t tile = (n + tiles - 1) / tiles;
  int64_t align = panels ? NB_SGEMM_PANEL : 16;
  tile = tile > align || panels ? (tile + align - 1) / align * align : tile;
  job j = {.isa = isa, .layer = layer, .panels = panels, .n = n, .k = k, .tile = tile, .tiles = (n + tile - 1) / tile, .x = x, .y = y};
  double tw[2][99], tc[2][99];
  for (int r = -1; r < reps; r++)
    for (int side = 0; side < 2; side++) {
      j.read_only = side == 1;
      double t0 = now_s(), c0 = cpu_s();
      for (int c = 0; c < copies; c++) j.w = w[c], run(&j, threads);
      if (r >= 0) tw[side][r] = (now_s() - t0) / copies, tc[side][r] = (cpu_s() - c0) / copies;
    }
  double gb = (double)wbytes / 1e9, pw = gb / median(tw[0], reps), pc = gb / median(tc[0], reps);
  double rw = gb / median(tw[1], reps), rc = gb / median(tc[1], reps);
  printf("x[1, %lld] @ %s, W [%lld, %lld] (%.1f MB, %d copies), %s kernel, %d threads, %lld tiles of %lld:\n"
         "  product %.2f ms = %.2f GB/s (%.2f GB per CPU-second)\n"
         "  read    %.2f ms = %.2f GB/s (%.2f GB per CPU-second)\n  product / read %.2f (by CPU time %.2f)\n",
         (long long)k, panels ? "W (panels)" : layer ? "W" : "W^T", (long long)(layer ? k : n), (long long)(layer ? n : k), gb * 1e3, copies, nb_cpu__sgemm_name(isa), threads, (long long)j.tiles,
         (long long)tile, 1e3 * median(tw[0], reps), pw, pc, 1e3 * median(tw[1], reps), rw, rc, pw / rw, pc / rc);
  printf("RESULT sgemm_head %s%s n %lld k %lld threads %d: product %.2f GB/s read %.2f GB/s ratio %.2f; per CPU-second: "
         "product %.2f read %.2f ratio %.2f\n",
         panels ? "panels " : layer ? "layer " : "", nb_cpu__sgemm_name(isa), (long long)n, (long long)k, threads, pw, rw, pw / rw, pc, rc, pc / rc);
  for (int c = 0; c < copies; c++) free(w[c]);
  free(x), free(y);
  return j.sum == 12345.678 ? 3 : 0; /* the sink */
}
