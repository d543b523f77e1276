/* nabla's own f32 matrix product (src/backend/cpu/sgemm.c): every kernel this
 * CPU has (AVX-512, AVX2 + FMA, plain C) gives, bit for bit, the definition:
 * each element one chain of fmaf over k in order from +0. Over shapes that
 * leave edge tiles on both sides, k across several packed slices (KC = 256),
 * every transpose of both operands, leading dims wider than the matrices, and
 * a result written into a wider matrix (its other columns untouched). Values
 * span many binades so that another order of the sums would round
 * differently (checked: summing in another order changes some element). */
#include <stdint.h>

#include "backend/cpu/sgemm.h"
#include "test.h"

/* products a kernel could not run because this CPU lacks its ISA: reported */
static int skipped[NB_SGEMM_AVX512 + 1];

static uint64_t rng = 88172645463325252ull;
static float rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  float u = (float)((rng >> 40) & 0xffffff) / 16777216.0f - 0.5f;
  return ldexpf(u, (int)(rng % 17) - 8); /* values over 16 binades */
}

/* op(X)[r][c] for an r x c operand stored with leading dim ld, transposed or not */
static float at(const float *X, bool t, int64_t ld, int64_t r, int64_t c) { return t ? X[c * ld + r] : X[r * ld + c]; }

static void reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float *C, int64_t ldc, bool reversed) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int64_t q = 0; q < k; q++) {
        int64_t p = reversed ? k - 1 - q : q;
        acc = fmaf(at(A, ta, lda, i, p), at(B, tb, ldb, p, j), acc);
      }
      C[i * ldc + j] = acc;
    }
}

static int mismatches(const float *x, const float *y, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return bad;
}

/* one product; B's rows are ldb_pad floats longer than they need be */
static void one_padded(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t ldb_pad) {
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + ldb_pad, ldc = n + 7;
  int64_t arows = ta ? k : m, brows = tb ? n : k;
  size_t na = (size_t)(arows * lda), nb = (size_t)(brows * ldb), nc = (size_t)(m * ldc);
  float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
  float *want = malloc(sizeof(float) * nc), *got = malloc(sizeof(float) * nc);
  for (size_t i = 0; i < na; i++) A[i] = rnd();
  for (size_t i = 0; i < nb; i++) B[i] = rnd();
  for (size_t i = 0; i < nc; i++) want[i] = got[i] = (float)i; /* the columns past n stay */
  reference(ta, tb, m, n, k, A, lda, B, ldb, want, ldc, false);
  for (int isa = NB_SGEMM_C; isa <= NB_SGEMM_AVX512; isa++) {
    for (size_t i = 0; i < nc; i++) got[i] = (float)i;
    bool ran = nb_cpu__sgemm_on((nb_sgemm_isa)isa, ta, tb, m, n, k, A, lda, B, ldb, got, ldc);
    if (!ran) {
      CHECK_MSG(isa != NB_SGEMM_C && isa > (int)nb_cpu__sgemm_best(), "kernel %s refused", nb_cpu__sgemm_name(isa));
      skipped[isa]++;
      continue;
    }
    int bad = mismatches(want, got, nc);
    CHECK_MSG(bad == 0, "%s: %lldx%lldx%lld ta %d tb %d: %d elements differ from the in-order fmaf chain",
              nb_cpu__sgemm_name(isa), (long long)m, (long long)n, (long long)k, ta, tb, bad);
  }
  float *best = got;
  for (size_t i = 0; i < nc; i++) best[i] = (float)i;
  CHECK(nb_cpu__sgemm(ta, tb, m, n, k, A, lda, B, ldb, best, ldc));
  CHECK(mismatches(want, best, nc) == 0);
  free(A), free(B), free(want), free(got);
}

static void one(int64_t m, int64_t n, int64_t k, bool ta, bool tb) { one_padded(m, n, k, ta, tb, 5); }

/* one product with B held as panels of NB_SGEMM_PANEL columns (the serving
 * engine's weights), against the chain over the same B held plainly */
static void one_panels(int64_t m, int64_t n, int64_t k, bool ta) {
  int64_t lda = (ta ? m : k) + 3, ldc = n + 7, arows = ta ? k : m, w = NB_SGEMM_PANEL;
  size_t na = (size_t)(arows * lda), nb = (size_t)(k * n), nc = (size_t)(m * ldc);
  float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb), *Bp = malloc(sizeof(float) * nb);
  float *want = malloc(sizeof(float) * nc), *got = malloc(sizeof(float) * nc);
  for (size_t i = 0; i < na; i++) A[i] = rnd();
  for (size_t i = 0; i < nb; i++) B[i] = rnd();
  for (int64_t p = 0; p < k; p++)
    for (int64_t j = 0; j < n; j++) Bp[j / w * w * k + p * w + j % w] = B[p * n + j];
  for (size_t i = 0; i < nc; i++) want[i] = (float)i; /* the columns past n stay */
  reference(ta, false, m, n, k, A, lda, B, n, want, ldc, false);
  for (int isa = NB_SGEMM_C; isa <= NB_SGEMM_AVX512; isa++) {
    for (size_t i = 0; i < nc; i++) got[i] = (float)i;
    if (!nb_cpu__sgemm_panels_on((nb_sgemm_isa)isa, ta, m, n, k, A, lda, Bp, got, ldc)) {
      CHECK_MSG(isa != NB_SGEMM_C && isa > (int)nb_cpu__sgemm_best(), "kernel %s refused panels", nb_cpu__sgemm_name(isa));
      skipped[isa]++;
      continue;
    }
    int bad = mismatches(want, got, nc);
    CHECK_MSG(bad == 0, "%s: %lldx%lldx%lld ta %d, B in panels: %d elements differ from the in-order fmaf chain",
              nb_cpu__sgemm_name(isa), (long long)m, (long long)n, (long long)k, ta, bad);
  }
  for (size_t i = 0; i < nc; i++) got[i] = (float)i;
  CHECK(nb_cpu__sgemm_panels(ta, m, n, k, A, lda, Bp, got, ldc));
  CHECK(mismatches(want, got, nc) == 0);
  free(A), free(B), free(Bp), free(want), free(got);
}

int main(void) {
  printf("best kernel here: %s\n", nb_cpu__sgemm_name(nb_cpu__sgemm_best()));
  static const int64_t shapes[][3] = {{1, 1, 1},   {3, 5, 7},    {8, 32, 16},   {9, 33, 17},    {64, 64, 32},
                                      {17, 70, 300}, {130, 47, 600}, {6, 16, 513}, {200, 100, 1}, {5, 3, 0}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) one(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t & 2);
  /* a few rows (decode steps: the few-rows path that streams B once): every m
   * up to past its limit, ragged vector tails, k not a multiple of its four
   * rows of B per pass, more columns than one pass over C holds (4096 / m, m > 1) */
  static const int64_t few[][2] = {{1, 1}, {15, 1}, {17, 2}, {33, 3}, {100, 5}, {768, 300}, {2049, 7}, {4100, 64}, {40, 513}};
  for (int64_t m = 1; m <= 9; m++)
    for (size_t s = 0; s < sizeof few / sizeof few[0]; s++)
      for (int t = 0; t < 4; t++) one(m, few[s][0], few[s][1], t & 1, t & 2);
  /* one row takes up to 65536 columns a pass (its C in L2): past that, and
   * k with a tail of its four rows per pass */
  for (int t = 0; t < 2; t++) one(1, 65600, 9, t, false);
  /* a few rows times a transposed B (a decode step's output head, x @ W^T,
   * or the serving engine's [out, in] weights: W's rows contiguous, ldb = k,
   * or wider): several blocks of 16 (8) rows with the next block's prefetch
   * and a ragged tail of rows, k a multiple of 8 or with a tail of columns;
   * counts of rows of A around the group sizes (8 on AVX2, 16 on AVX-512)
   * and the limits (16; 64 on AVX-512 with k <= 1024 and B of 1 MB or more:
   * 649 x 768 does, the others go to the blocked path past 16 rows) */
  static const int64_t head[][2] = {{649, 768}, {663, 45}, {48, 16}, {31, 773}, {7, 9}, {40, 1100}};
  static const int64_t head_m[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 31, 33, 64, 65};
  for (size_t a = 0; a < sizeof head_m / sizeof head_m[0]; a++)
    for (size_t s = 0; s < sizeof head / sizeof head[0]; s++)
      for (int t = 0; t < 2; t++)
        one_padded(head_m[a], head[s][0], head[s][1], t, true, 0), one(head_m[a], head[s][0], head[s][1], t, true);
  /* an A too long to copy p-major (m * k > 2^20 floats) is read in place */
  for (int t = 0; t < 2; t++) one(16, 20, 70000, t, true);
  /* a batched decode step (one row per running sequence, 9..64 rows): ragged
   * row tails for every micro-kernel's MR, columns past one packed block
   * (NC = 1024) and ragged NR tails, k across packed slices (KC = 256), B's
   * rows far enough apart (ldb = n + 5 >= 4096) for the AVX-512 kernel's
   * next-panel hint, and up to one block of rows (MC = 128, B in place) */
  static const int64_t batch_m[] = {9, 15, 16, 17, 33, 64, 65, 128};
  static const int64_t batch_nk[][2] = {{33, 7}, {100, 300}, {1030, 40}, {2049, 5}, {4100, 19}};
  for (size_t a = 0; a < sizeof batch_m / sizeof batch_m[0]; a++)
    for (size_t s = 0; s < sizeof batch_nk / sizeof batch_nk[0]; s++)
      for (int t = 0; t < 4; t++) one(batch_m[a], batch_nk[s][0], batch_nk[s][1], t & 1, t & 2);
  /* B in panels: every row count of the streamed path's groups (6 on
   * AVX-512, 1 and 3 on AVX2) up to its limit (16) and past it (the blocked
   * path reading panels in place: ragged MR tails, one block of rows and
   * more, MC = 128), k across packed slices (KC = 256), columns past one
   * block (NC = 1024); n not a multiple of the panel is refused */
  static const int64_t panel_m[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33, 130};
  static const int64_t panel_nk[][2] = {{64, 1}, {128, 7}, {192, 300}, {1088, 40}, {64, 513}};
  for (size_t a = 0; a < sizeof panel_m / sizeof panel_m[0]; a++)
    for (size_t s = 0; s < sizeof panel_nk / sizeof panel_nk[0]; s++)
      for (int t = 0; t < 2; t++) one_panels(panel_m[a], panel_nk[s][0], panel_nk[s][1], t);
  float one_elem = 1.0f, out[2];
  CHECK(!nb_cpu__sgemm_panels_on(NB_SGEMM_C, false, 1, 32, 1, &one_elem, 1, &one_elem, out, 32));
  /* the check has teeth: another summation order changes some element of such a product */
  int64_t m = 16, n = 16, k = 300;
  float *A = malloc(sizeof(float) * (size_t)(m * k)), *B = malloc(sizeof(float) * (size_t)(k * n));
  float *x = malloc(sizeof(float) * (size_t)(m * n)), *y = malloc(sizeof(float) * (size_t)(m * n));
  for (int64_t i = 0; i < m * k; i++) A[i] = rnd();
  for (int64_t i = 0; i < k * n; i++) B[i] = rnd();
  reference(false, false, m, n, k, A, k, B, n, x, n, false);
  reference(false, false, m, n, k, A, k, B, n, y, n, true);
  CHECK_MSG(mismatches(x, y, (size_t)(m * n)) > 0, "summing backwards changed nothing: the values are too tame");
  free(A), free(B), free(x), free(y);
  for (int isa = NB_SGEMM_C; isa <= NB_SGEMM_AVX512; isa++)
    if (skipped[isa]) printf("SKIPPED: the %s kernel on %d products (this CPU lacks its ISA)\n", nb_cpu__sgemm_name(isa), skipped[isa]);
  return nb_test_summary("backend/test_sgemm");
}
