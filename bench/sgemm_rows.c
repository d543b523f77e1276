/* Claim: a batched decode step's products (M = 9..64 running sequences
 * times a weight, B untransposed and read in place by the blocked path) run
 * faster with the AVX-512 micro-kernel prefetching B's panel rows ahead.
 * One M x K x N product of nabla's sgemm (src/backend/cpu/sgemm.c) on one
 * thread, repeated; B (K x N, at least 2.3 MB here) does not stay in L2.
 * Medians of 15 timings of a batch of calls, in GFLOP/s by wall time and by
 * the process's CPU time (what a loaded machine stretches less). For an A/B run,
 * build both sides and alternate them (bench/RESULTS.md).
 *
 * With a fifth argument "bt", B is stored transposed, N x K (x @ W^T); with
 * "panels", B is held as panels of 64 columns ([N / 64, K, 64]: the serving
 * engine's kernels, nb_serve_model_opts.pack_kernels).
 *
 *   ./build/bench_sgemm_rows M K N [isa: 0 c, 1 avx2, 2 avx512] [bt | panels]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/sgemm.h"
#include "bench_util.h"

static float *floats64(int64_t n) { return aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64); }

int main(int argc, char **argv) {
  if (argc < 4) return fprintf(stderr, "usage: %s M K N [isa] [bt]\n", argv[0]), 2;
  int64_t m = atoll(argv[1]), k = atoll(argv[2]), n = atoll(argv[3]);
  int isa = argc > 4 ? atoi(argv[4]) : (int)nb_cpu__sgemm_best();
  bool bt = argc > 5 && !strcmp(argv[5], "bt"), panels = argc > 5 && !strcmp(argv[5], "panels");
  if (m < 1 || k < 1 || n < 1 || isa < NB_SGEMM_C || isa > NB_SGEMM_AVX512) return fprintf(stderr, "bad arguments\n"), 2;
  if (panels && n % NB_SGEMM_PANEL) return fprintf(stderr, "panels: N must be a multiple of %d\n", NB_SGEMM_PANEL), 2;
  /* 64-byte aligned, as nabla's arrays are (NB_ARRAY_ALIGN): malloc's large blocks start 16 bytes past a
   * page, and a B misaligned so runs 1.5x slower (16 x 2048 x 768: 95 against 62 GFLOP/s by CPU time) */
  float *A = floats64(m * k), *B = floats64(k * n), *C = floats64(m * n);
  if (!A || !B || !C) return fprintf(stderr, "out of memory\n"), 1;
  for (int64_t i = 0; i < m * k; i++) A[i] = 1.0f / (float)(i % 7 + 1);
  for (int64_t i = 0; i < k * n; i++) B[i] = 1.0f / (float)(i % 5 + 1);
  double flop = 2.0 * (double)m * (double)n * (double)k, t[15], tc[15];
  int calls = (int)(2e9 / flop) + 1;
  for (int r = 0; r < 15; r++) {
    double t0 = now_s(), c0 = cpu_s();
    for (int q = 0; q < calls; q++)
      if (panels ? !nb_cpu__sgemm_panels_on((nb_sgemm_isa)isa, false, m, n, k, A, k, B, C, n)
                 : !nb_cpu__sgemm_on((nb_sgemm_isa)isa, false, bt, m, n, k, A, k, B, bt ? k : n, C, n))
        return fprintf(stderr, "kernel %s not available on this CPU\n", nb_cpu__sgemm_name((nb_sgemm_isa)isa)), 1;
    t[r] = (now_s() - t0) / calls, tc[r] = (cpu_s() - c0) / calls;
  }
  printf("RESULT sgemm_rows %s%s m %lld k %lld n %lld: median %.1f GFLOP/s (by CPU time %.1f)\n",
         nb_cpu__sgemm_name((nb_sgemm_isa)isa), bt ? " bt" : panels ? " panels" : "", (long long)m, (long long)k, (long long)n, flop / median(t, 15) / 1e9,
         flop / median(tc, 15) / 1e9);
  free(A), free(B), free(C);
  return 0;
}
