/* CPU backend: nabla's own f32 matrix product (sgemm.c). Private to the
 * CPU backend (blas.c runs every f32 product on it) and its tests. */
#ifndef NABLA_BACKEND_CPU_SGEMM_H
#define NABLA_BACKEND_CPU_SGEMM_H

#include <stdbool.h>
#include <stdint.h>

typedef enum nb_sgemm_isa { NB_SGEMM_C, NB_SGEMM_AVX2, NB_SGEMM_AVX512 } nb_sgemm_isa;

/* C = op(A) op(B), row-major like cblas_sgemm(CblasRowMajor, ...) with alpha
 * 1 and beta 0: op(A) is m x k (A[i*lda + p], or A[p*lda + i] when ta),
 * op(B) is k x n (B[p*ldb + j], or B[j*ldb + p] when tb), C is m x n with
 * row stride ldc. Every element of C is one chain of fused multiply-adds in
 * the order of p, c = fma(a[i][0], b[0][j], +0), c = fma(a[i][1], b[1][j], c),
 * ..., so its value depends neither on the kernel that runs it (AVX-512,
 * AVX2 + FMA, or C with fmaf) nor on how a caller cuts C into tiles.
 * Runs on the best kernel this CPU has. Returns false when out of memory for
 * its packing buffers. */
bool nb_cpu__sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc);

/* Up to this many rows of op(A) times an untransposed B, each row of B is
 * read once, left to right (a decode step's products: a streaming read of
 * the weights, bound by memory). */
#define NB_SGEMM_FEW_ROWS 8

/* The same on a given kernel (the tests compare them); false also when the
 * CPU lacks it. */
bool nb_cpu__sgemm_on(nb_sgemm_isa isa, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc);

/* B (k x n) held as panels of NB_SGEMM_PANEL columns, each panel's k rows
 * one after the other: element (p, j) at
 * Bp[(j / NB_SGEMM_PANEL) * NB_SGEMM_PANEL * k + p * NB_SGEMM_PANEL + j % NB_SGEMM_PANEL],
 * the layout in which the serving engine holds its weights (dot_general's
 * rhs [n / 64, k, 64] contracted along its middle dim; blas.c). The same
 * chains as nb_cpu__sgemm; n a multiple of NB_SGEMM_PANEL (false
 * otherwise, or when out of memory). A few rows of A read each panel once,
 * front to back. */
#define NB_SGEMM_PANEL 64
bool nb_cpu__sgemm_panels(bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bp, float *C,
                          int64_t ldc);
bool nb_cpu__sgemm_panels_on(nb_sgemm_isa isa, bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                             const float *Bp, float *C, int64_t ldc);

/* The best kernel this CPU has (or a weaker one named by $NABLA_SGEMM_ISA),
 * and a kernel's name ("avx512", "avx2", "c"). */
nb_sgemm_isa nb_cpu__sgemm_best(void);
const char *nb_cpu__sgemm_name(nb_sgemm_isa isa);

#endif
