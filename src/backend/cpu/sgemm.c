/* CPU backend: nabla's own f32 matrix product (sgemm.h), the classic
 * blocked scheme: op(B) packed in blocks of KC x NC (panels of NR columns;
 * read in place when few rows of A would reuse them), op(A) walked in blocks
 * of MC x KC and read in place (panels of MR rows; only a block's last,
 * partial panel is packed), and a register-blocked micro-kernel that adds one
 * MR x NR tile's products over a KC slice. A product of a few rows (a
 * decode step's) streams B once instead ("few rows"), with B untransposed,
 * transposed, or held as panels of 64 columns (the serving engine's
 * weights, "panels").
 *
 * Why not OpenBLAS: its result for an element depends on the kernels it
 * picks for the CPU (Haswell and SkylakeX sum in different orders) and on
 * how a product is split, so a step's numbers changed with the machine; and
 * pinned to its AVX2 kernels (so that AVX2 and AVX-512 machines agree) it
 * runs at half an AVX-512 core's rate. Here every element is one chain of
 * fused multiply-adds over k in order, whatever the kernel, the tile and the
 * blocking, so the AVX-512 kernel may run wherever the CPU has it: the
 * vector lanes only ever hold different columns. The plain C kernel (fmaf)
 * is the definition the others are tested against (tests/backend). */
#include "backend/cpu/sgemm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SGEMM_X86 1
#endif

#define KC 256   /* k per packed slice: an A panel (MR x KC) and a B panel (KC x NR) stay in L1 */
#define MC 128   /* rows per A block (MC x KC floats, 128 KB: L2) */
#define NC 1024  /* columns per packed B block */
#define MAX_MR 8
#define MAX_NR 32
#define PANEL NB_SGEMM_PANEL /* columns of a panel of B (nb_cpu__sgemm_panels); every NR divides it */

/* a: element (r, p) of the MR x kc slice of A at a[r*rsa + p*csa] (a packed
 * panel, or A itself); b: element (p, j) of the kc x NR slice of B at
 * b[p*rsb + j] (a packed panel, rsb = NR, or B itself); a_next: the next
 * panel of A read in place (csa 1, the same rsa), which the kernel asks
 * for while it runs, or NULL */
typedef void (*ukr_fn)(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t rsb, float *c,
                       int64_t ldc, bool first, const float *a_next);

/* ---------------------------------------------------------------- micro-kernels */

/* c[r][j] (first: from +0) += sum over p of a[p*MR + r] * b[p*NR + j], one fma at a time in order of p */
enum { C_MR = 4, C_NR = 8 };
static void ukr_c(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t rsb, float *c, int64_t ldc,
                  bool first, const float *a_next) {
  (void)a_next; /* the C kernel is the definition, not a fast path */
  float acc[C_MR][C_NR];
  for (int r = 0; r < C_MR; r++)
    for (int j = 0; j < C_NR; j++) acc[r][j] = first ? 0.0f : c[r * ldc + j];
  for (int64_t p = 0; p < kc; p++, a += csa, b += rsb)
    for (int r = 0; r < C_MR; r++)
      for (int j = 0; j < C_NR; j++) acc[r][j] = fmaf(a[r * rsa], b[j], acc[r][j]);
  for (int r = 0; r < C_MR; r++)
    for (int j = 0; j < C_NR; j++) c[r * ldc + j] = acc[r][j];
}

#ifdef SGEMM_X86
#define PREFETCH_ROWS 16
#define PREFETCH_NEXT_LDB 4096
/* A read in place with its k stride at least this many floats (a transposed
 * A: op(A)'s columns are A's rows) is a line per k; at strides near a page
 * the hardware prefetcher, which stays within a 4 KB page, finds too few
 * lines to follow and every k waits on L2 or L3 (perf: the first broadcast
 * of a row). The kernels ask for the line PREFETCH_ROWS k ahead. */
#define PREFETCH_A_CSA 64

/* 6 x 16: twelve 8-lane accumulators */
enum { AVX2_MR = 6, AVX2_NR = 16 };
__attribute__((target("avx2,fma"), always_inline)) static inline void ukr_avx2_body(int64_t kc, const float *a, int64_t rsa,
                                                                                   int64_t csa, const float *b, int64_t rsb,
                                                                                   float *c, int64_t ldc, bool first,
                                                                                   bool prefetch_a) {
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(r) __m256 c##r##0, c##r##1;
  ROWS(DECL)
#undef DECL
  if (first) {
#define ZERO(r) c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
    ROWS(ZERO)
#undef ZERO
  } else {
#define LOAD(r) c##r##0 = _mm256_loadu_ps(c + r * ldc), c##r##1 = _mm256_loadu_ps(c + r * ldc + 8);
    ROWS(LOAD)
#undef LOAD
  }
  for (int64_t p = 0; p < kc; p++, a += csa, b += rsb) {
    if (prefetch_a) _mm_prefetch((const char *)(a + PREFETCH_ROWS * csa), _MM_HINT_T0);
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
#define FMA(r) x = _mm256_broadcast_ss(a + r * rsa), c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0), c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1);
    ROWS(FMA)
#undef FMA
  }
#define STORE(r) _mm256_storeu_ps(c + r * ldc, c##r##0), _mm256_storeu_ps(c + r * ldc + 8, c##r##1);
  ROWS(STORE)
#undef STORE
#undef ROWS
}

__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t kc, const float *a, int64_t rsa, int64_t csa,
                                                         const float *b, int64_t rsb, float *c, int64_t ldc, bool first,
                                                         const float *a_next) {
  (void)a_next; /* not measured on AVX2 */
  if (csa >= PREFETCH_A_CSA) ukr_avx2_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true);
  else ukr_avx2_body(kc, a, rsa, csa, b, rsb, c, ldc, first, false);
}

/* 8 x 32: sixteen 16-lane accumulators. B read in place (rsb = ldb, not NR:
 * a panel's rows far apart, two cache lines each, as in a batched decode
 * step's products) is a pattern the hardware prefetcher does not follow, so
 * the kernel asks for the row PREFETCH_ROWS ahead itself (16 x 768 x 2048:
 * 47 -> 62 GFLOP/s, bench/RESULTS.md). When B's rows are at least
 * PREFETCH_NEXT_LDB floats apart (every row of a panel on its own page: the
 * 32000-wide output head), 16 rows ahead is too short for the latency of
 * such loads, and it also asks for the next panel's same row into L2, a
 * whole panel ahead (16 x 768 x 32000: 50 -> 63 GFLOP/s by CPU time; with
 * narrower B the hint cost as much as it gained). A packed panel is
 * contiguous: no hints. The AVX2 kernel has none for B: no gain measured
 * there (AVX2 proxy, loaded). Both ask for A's lines ahead (PREFETCH_A_CSA). */
enum { AVX512_MR = 8, AVX512_NR = 32 };
__attribute__((target("avx512f,fma"), always_inline)) static inline void ukr_avx512_body(int64_t kc, const float *a,
                                                                                       int64_t rsa, int64_t csa,
                                                                                       const float *b, int64_t rsb, float *c,
                                                                                       int64_t ldc, bool first,
                                                                                       bool prefetch, bool prefetch_next,
                                                                                       bool prefetch_a, const float *a_next) {
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DECL(r) __m512 c##r##0, c##r##1;
  ROWS(DECL)
#undef DECL
  if (first) {
    /* the tile's rows of C (written at the end, after kc iterations: a
     * product's first pass over C, fresh memory, stalled on the stores) */
#define PF(r) _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0), _mm_prefetch((const char *)(c + r * ldc + 31), _MM_HINT_T0);
    ROWS(PF)
#undef PF
#define ZERO(r) c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    ROWS(ZERO)
#undef ZERO
  } else {
#define LOAD(r) c##r##0 = _mm512_loadu_ps(c + r * ldc), c##r##1 = _mm512_loadu_ps(c + r * ldc + 16);
    ROWS(LOAD)
#undef LOAD
  }
  for (int64_t p = 0; p < kc; p++, a += csa, b += rsb) {
    if (prefetch)
      _mm_prefetch((const char *)(b + PREFETCH_ROWS * rsb), _MM_HINT_T0),
          _mm_prefetch((const char *)(b + PREFETCH_ROWS * rsb + 16), _MM_HINT_T0);
    if (prefetch_a) _mm_prefetch((const char *)(a + PREFETCH_ROWS * csa), _MM_HINT_T0);
    if (a_next) /* a line of the next panel every other k: its MR rows of kc floats by the end */
      _mm_prefetch((const char *)(a_next + ((p >> 1) & (AVX512_MR - 1)) * rsa + ((p >> 4) << 4)), _MM_HINT_T0);
    if (prefetch_next) /* the next panel's same row, into L2 */
      _mm_prefetch((const char *)(b + AVX512_NR), _MM_HINT_T1), _mm_prefetch((const char *)(b + AVX512_NR + 16), _MM_HINT_T1);
    __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), x;
#define FMA(r) x = _mm512_set1_ps(a[r * rsa]), c##r##0 = _mm512_fmadd_ps(x, b0, c##r##0), c##r##1 = _mm512_fmadd_ps(x, b1, c##r##1);
    ROWS(FMA)
#undef FMA
  }
#define STORE(r) _mm512_storeu_ps(c + r * ldc, c##r##0), _mm512_storeu_ps(c + r * ldc + 16, c##r##1);
  ROWS(STORE)
#undef STORE
#undef ROWS
}

__attribute__((target("avx512f,fma"))) static void ukr_avx512(int64_t kc, const float *a, int64_t rsa, int64_t csa,
                                                              const float *b, int64_t rsb, float *c, int64_t ldc, bool first,
                                                              const float *a_next) {
  bool pa = csa >= PREFETCH_A_CSA;
  if (rsb >= PREFETCH_NEXT_LDB && pa) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true, true, true, NULL);
  else if (rsb >= PREFETCH_NEXT_LDB) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true, true, false, NULL);
  else if (rsb != AVX512_NR && pa) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true, false, true, NULL);
  else if (rsb != AVX512_NR && a_next) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true, false, false, a_next);
  else if (rsb != AVX512_NR) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, true, false, false, NULL);
  else if (pa) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, false, false, true, NULL);
  else if (a_next) ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, false, false, false, a_next);
  else ukr_avx512_body(kc, a, rsa, csa, b, rsb, c, ldc, first, false, false, false, NULL);
}
#endif

typedef struct kernel {
  int mr, nr;
  ukr_fn fn;
} kernel;

static bool kernel_of(nb_sgemm_isa isa, kernel *k) {
  switch (isa) {
  case NB_SGEMM_C: *k = (kernel){C_MR, C_NR, ukr_c}; return true;
#ifdef SGEMM_X86
  case NB_SGEMM_AVX2:
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
    *k = (kernel){AVX2_MR, AVX2_NR, ukr_avx2};
    return true;
  case NB_SGEMM_AVX512:
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("fma")) return false;
    *k = (kernel){AVX512_MR, AVX512_NR, ukr_avx512};
    return true;
#endif
  default: return false;
  }
}

/* The best kernel the CPU has, or a weaker one that NABLA_SGEMM_ISA (avx2,
 * c) asks for: the same results, the speed of an AVX2 machine. */
nb_sgemm_isa nb_cpu__sgemm_best(void) {
  kernel k;
  nb_sgemm_isa best = kernel_of(NB_SGEMM_AVX512, &k) ? NB_SGEMM_AVX512 : kernel_of(NB_SGEMM_AVX2, &k) ? NB_SGEMM_AVX2 : NB_SGEMM_C;
  const char *want = getenv("NABLA_SGEMM_ISA");
  for (int i = NB_SGEMM_C; want && i < (int)best; i++)
    if (strcmp(want, nb_cpu__sgemm_name((nb_sgemm_isa)i)) == 0) return (nb_sgemm_isa)i;
  return best;
}

const char *nb_cpu__sgemm_name(nb_sgemm_isa isa) {
  return isa == NB_SGEMM_AVX512 ? "avx512" : isa == NB_SGEMM_AVX2 ? "avx2" : "c";
}

/* ---------------------------------------------------------------- packing */

/* rows [i0, i0 + mb) x cols [p0, p0 + kb) of op(A) as panels of mr rows: panel
 * q holds element (q*mr + r, p) at q*mr*kb + p*mr + r; rows past mb are 0 */
static void pack_a(bool ta, const float *A, int64_t lda, int64_t i0, int64_t mb, int64_t p0, int64_t kb, int mr, float *dst) {
  for (int64_t q = 0; q < mb; q += mr, dst += (int64_t)mr * kb) {
    int64_t rows = mb - q < mr ? mb - q : mr;
    if (rows < mr) memset(dst, 0, sizeof(float) * (size_t)(mr * kb));
    if (ta) {
      for (int64_t p = 0; p < kb; p++) {
        const float *s = A + (p0 + p) * lda + i0 + q;
        for (int64_t r = 0; r < rows; r++) dst[p * mr + r] = s[r];
      }
    } else {
      for (int64_t r = 0; r < rows; r++) {
        const float *s = A + (i0 + q + r) * lda + p0;
        for (int64_t p = 0; p < kb; p++) dst[p * mr + r] = s[p];
      }
    }
  }
}

#ifdef SGEMM_X86
/* dst[i*ldd + j] = src[j*lds + i] for an 8 x 8 block (pure data movement:
 * the same bits whatever the ISA) */
__attribute__((target("avx2"))) static void transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds), r2 = _mm256_loadu_ps(src + 2 * lds),
         r3 = _mm256_loadu_ps(src + 3 * lds), r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds),
         r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
         t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE), s2 = _mm256_shuffle_ps(t1, t3, 0x44),
         s3 = _mm256_shuffle_ps(t1, t3, 0xEE), s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
         s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}
#endif

/* rows [p0, p0 + kb) x cols [j0, j0 + nb) of op(B) as panels of nr columns:
 * panel q holds element (p, q*nr + j) at q*nr*kb + p*nr + j; columns past nb
 * are 0. A transposed B (its rows are our columns) goes through 8 x 8 block
 * transposes where the CPU has AVX2. */
static void pack_b(bool tb, bool avx2, const float *B, int64_t ldb, int64_t p0, int64_t kb, int64_t j0, int64_t nb, int nr,
                   float *dst) {
  for (int64_t q = 0; q < nb; q += nr, dst += (int64_t)nr * kb) {
    int64_t cols = nb - q < nr ? nb - q : nr;
    if (cols < nr) memset(dst, 0, sizeof(float) * (size_t)(nr * kb));
    if (!tb) {
      for (int64_t p = 0; p < kb; p++) memcpy(dst + p * nr, B + (p0 + p) * ldb + j0 + q, sizeof(float) * (size_t)cols);
      continue;
    }
    int64_t j = 0;
#ifdef SGEMM_X86
    if (avx2)
      for (; j + 8 <= cols; j += 8) {
        const float *s = B + (j0 + q + j) * ldb + p0;
        int64_t p = 0;
        for (; p + 8 <= kb; p += 8) transpose8(s + p, ldb, dst + p * nr + j, nr);
        for (int64_t jj = j; jj < j + 8; jj++)
          for (int64_t pp = p; pp < kb; pp++) dst[pp * nr + jj] = B[(j0 + q + jj) * ldb + p0 + pp];
      }
#else
    (void)avx2;
#endif
    for (; j < cols; j++) {
      const float *s = B + (j0 + q + j) * ldb + p0;
      for (int64_t p = 0; p < kb; p++) dst[p * nr + j] = s[p];
    }
  }
}

/* The same from B held as panels (the blocked path with panels, below):
 * j0 and nr fall on whole pieces of a panel (nr divides PANEL), so each
 * packed row is one copy. */
static void pack_b_panels(const float *Bp, int64_t k, int64_t p0, int64_t kb, int64_t j0, int64_t nb, int nr, float *dst) {
  for (int64_t q = 0; q < nb; q += nr, dst += (int64_t)nr * kb) {
    const float *s = Bp + (j0 + q) / PANEL * PANEL * k + p0 * PANEL + (j0 + q) % PANEL;
    for (int64_t p = 0; p < kb; p++) memcpy(dst + p * nr, s + p * PANEL, sizeof(float) * (size_t)nr);
  }
}

/* ---------------------------------------------------------------- scratch */

/* Each thread keeps its packing buffer between calls (the pool's workers run
 * many small products); freed when the thread ends. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local float *scratch_buf;
static _Thread_local size_t scratch_cap;

static void scratch_init(void) { (void)pthread_key_create(&scratch_key, free); }

static float *scratch(size_t floats) {
  if (floats <= scratch_cap) return scratch_buf;
  pthread_once(&scratch_once, scratch_init);
  void *p = NULL;
  if (posix_memalign(&p, 64, floats * sizeof(float))) return NULL;
  free(scratch_buf);
  scratch_buf = p, scratch_cap = floats;
  (void)pthread_setspecific(scratch_key, p);
  return p;
}

/* ---------------------------------------------------------------- few rows */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }


/* With a few rows of A (a decode step: one token) the blocked scheme spends
 * its micro-kernel on zero rows and walks B in panels of NR columns, row
 * after row of B far apart. Here each row of an untransposed B is read once,
 * left to right, and added into the rows of C, held in L1: c[i][j] =
 * fma(a[i][p], b[p][j], c[i][j]) for p in order, four rows of B per pass
 * over c. The same chain of fmas per element as the micro-kernels, so the
 * same bits. C's columns go GEMV_C_FLOATS / m at a time, so that its m rows
 * stay in L1 beside the rows of B streaming through (read m times each);
 * GEMV_C1_FLOATS for one row. Up to GEMV_MAX_M rows:
 * the serving step pads a lone decode to 8 tokens.
 *
 * When a pass reads only a piece of each row (the thread pool's tiles are
 * bands of columns, one per thread: at two threads gpt2's 768 x 3072
 * product is 2 bands of 6 KB out of each 12 KB row; they were 8 bands of
 * 1.5 KB before blas.c's one band a thread), every piece is on a page of
 * its own and the hardware prefetcher, which stays within a page, restarts
 * on each: the products read at 0.7-0.9 of a plain read. Such a pass asks
 * for the same columns GEMV_AHEAD rows further into L2 (0.83-1.04,
 * bench/sgemm_head.c --layer). So does a pass over whole rows: its GEMV_P
 * rows, read side by side, are GEMV_P short streams (3 KB each for a
 * 768-wide B) that AMD's Zen 4 prefetcher follows no better: 0.53-0.76 of a
 * plain read without the hints, 0.87-1.01 with them (bench/RESULTS.md,
 * session 13). */
#define GEMV_MAX_M NB_SGEMM_FEW_ROWS
#define GEMV_C_FLOATS 4096 /* 16 KB of C */
/* One row of A reads each row of B once: its C may sit in L2, and whole rows
 * of B stream best (a Llama's 768 x 32000 head: 0.78-0.80 of a plain read in
 * 16 KB pieces, 0.92-0.94 whole; Zen 4, bench/sgemm_head.c --layer). */
#define GEMV_C1_FLOATS 65536 /* 256 KB of C */
#define GEMV_P 4 /* rows of B per pass over a row of C */
#define GEMV_AHEAD 8 /* rows of B ahead that a pass asks for */

/* c[j] = fma(a[(np-1)*inca], b[(np-1)*ldb + j], ... fma(a[0], b[j], first ? +0 : c[j])) for j < n, 1 <= np <= GEMV_P;
 * ahead: also into L2 the lines of b's rows GEMV_AHEAD .. GEMV_AHEAD + GEMV_P - 1 at these columns (they exist) */
typedef void (*rows_fn)(int64_t n, int np, const float *a, int64_t inca, const float *b, int64_t ldb, float *c, bool first,
                        bool ahead);

static void rows_c(int64_t n, int np, const float *a, int64_t inca, const float *b, int64_t ldb, float *c, bool first,
                   bool ahead) {
  (void)ahead; /* the C kernel is the definition, not a fast path */
  for (int64_t j = 0; j < n; j++) {
    float acc = first ? 0.0f : c[j];
    for (int q = 0; q < np; q++) acc = fmaf(a[q * inca], b[q * ldb + j], acc);
    c[j] = acc;
  }
}

#ifdef SGEMM_X86
__attribute__((target("avx2,fma"))) static void rows_avx2(int64_t n, int np, const float *a, int64_t inca, const float *b,
                                                          int64_t ldb, float *c, bool first, bool ahead) {
  __m256 x[GEMV_P];
  for (int q = 0; q < np; q++) x[q] = _mm256_set1_ps(a[q * inca]);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    if (ahead && j % 16 == 0)
      for (int q = 0; q < GEMV_P; q++) _mm_prefetch((const char *)(b + (GEMV_AHEAD + q) * ldb + j), _MM_HINT_T1);
    __m256 acc = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + j);
    for (int q = 0; q < np; q++) acc = _mm256_fmadd_ps(x[q], _mm256_loadu_ps(b + q * ldb + j), acc);
    _mm256_storeu_ps(c + j, acc);
  }
  rows_c(n - j, np, a, inca, b + j, ldb, c + j, first, false);
}

__attribute__((target("avx512f,fma"))) static void rows_avx512(int64_t n, int np, const float *a, int64_t inca, const float *b,
                                                               int64_t ldb, float *c, bool first, bool ahead) {
  __m512 x[GEMV_P];
  for (int q = 0; q < np; q++) x[q] = _mm512_set1_ps(a[q * inca]);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    if (ahead)
      for (int q = 0; q < GEMV_P; q++) _mm_prefetch((const char *)(b + (GEMV_AHEAD + q) * ldb + j), _MM_HINT_T1);
    __m512 acc = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + j);
    for (int q = 0; q < np; q++) acc = _mm512_fmadd_ps(x[q], _mm512_loadu_ps(b + q * ldb + j), acc);
    _mm512_storeu_ps(c + j, acc);
  }
  rows_c(n - j, np, a, inca, b + j, ldb, c + j, first, false);
}
#endif

static rows_fn rows_of(nb_sgemm_isa isa) {
#ifdef SGEMM_X86
  if (isa == NB_SGEMM_AVX512) return rows_avx512;
  if (isa == NB_SGEMM_AVX2) return rows_avx2;
#endif
  (void)isa;
  return rows_c;
}

/* C = op(A) B for m <= GEMV_MAX_M, B not transposed, k >= 1 */
static void gemv(nb_sgemm_isa isa, bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float *C, int64_t ldc) {
  rows_fn fn = rows_of(isa);
  int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1, width = m == 1 ? GEMV_C1_FLOATS : GEMV_C_FLOATS / m / 16 * 16;
  for (int64_t j0 = 0; j0 < n; j0 += width) {
    int64_t nc = min64(width, n - j0);
    for (int64_t p = 0; p < k; p += GEMV_P) {
      int np = (int)min64(GEMV_P, k - p);
      bool ahead = p + GEMV_AHEAD + GEMV_P <= k; /* rows to ask for */
      for (int64_t i = 0; i < m; i++)
        fn(nc, np, A + i * ars + p * acs, acs, B + p * ldb + j0, ldb, C + i * ldc + j0, p == 0, ahead && i == 0);
    }
  }
}

/* A few rows of A times B^T, B stored n x k (a tied output embedding,
 * attention's keys, the serving engine's weights kept as [out, in]):
 * element (i, j) is the chain over p of a[i][p] * B[j][p], B's row j read
 * left to right. The C kernel runs each chain as it is written; the vector
 * ones take 16 rows of B at a time (8 for AVX2 with several rows of A) and
 * turn each block of 8 columns into 8 vectors of rows with register
 * transposes (data movement only), so lane l of a vector is element j + l's
 * chain, in order of p: the same bits. A block's transposes serve a group
 * of rows of A (an accumulator each: 16 on AVX-512, 8 on AVX2), so a
 * batched decode step's few rows cost little more than one, and rows of A
 * are copied p-major first so that each group's reads are one stream.
 *
 * Each thread reads its whole rows of B one after the other: one contiguous
 * stream, which follows the memory's rate where a band of columns of an
 * untransposed B does not (Zen 4, 2 threads, a Llama-134m step's 85
 * products when the VM's memory read at 44 GB/s: 11.8 ms transposed, 15.9 ms
 * in column bands; equal when it read at 30; bench/RESULTS.md, session 15).
 * A block's 16 rows are still 16 streams of 32 bytes a step that the
 * hardware prefetchers follow poorly (gpt2's 50257 x 768 head ran at
 * 0.65-0.75 of a plain read of the same bytes), so while a block is summed
 * its loop asks for the next block's rows, a line per row every 16 columns,
 * into L2: one block ahead is the whole next block's bytes by the time it
 * starts. The AVX-512 kernel transposes 16 rows into 16-lane vectors with
 * half the shuffles of two 8 x 8 AVX2 transposes (bench/sgemm_head.c). */
static void gemv_t_c(int64_t n, int64_t k, const float *a, int64_t inca, const float *B, int64_t ldb, float *c) {
  for (int64_t j = 0; j < n; j++) {
    float acc = 0.0f;
    for (int64_t p = 0; p < k; p++) acc = fmaf(a[p * inca], B[j * ldb + p], acc);
    c[j] = acc;
  }
}

#define GEMV_T_ROWS 16     /* rows of B per block */
#define GEMV_T_GROUP 16    /* rows of A per pass over a block (AVX-512: an accumulator each beside the 8 transposed vectors); the most on AVX2 */
#define GEMV_T_MAX_M 64    /* rows of A on AVX-512 when k <= GEMV_T_MAX_K */
#define GEMV_T_MAX_K 1024
#define GEMV_T_MIN_B (1 << 18) /* floats of B (1 MB) for more than GEMV_T_GROUP rows */
#define GEMV_T_PACK_MAX (1 << 20) /* floats of A copied p-major (4 MB); a longer A is read in place */

#ifdef SGEMM_X86
/* t[q] lane l = src[l*lds + q], for an 8 x 8 block */
__attribute__((target("avx2"))) static inline void transpose8_regs(const float *src, int64_t lds, __m256 t[8]) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds), r2 = _mm256_loadu_ps(src + 2 * lds),
         r3 = _mm256_loadu_ps(src + 3 * lds), r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds),
         r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
         t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE), s2 = _mm256_shuffle_ps(t1, t3, 0x44),
         s3 = _mm256_shuffle_ps(t1, t3, 0xEE), s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
         s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  t[0] = _mm256_permute2f128_ps(s0, s4, 0x20), t[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  t[2] = _mm256_permute2f128_ps(s2, s6, 0x20), t[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  t[4] = _mm256_permute2f128_ps(s0, s4, 0x31), t[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  t[6] = _mm256_permute2f128_ps(s2, s6, 0x31), t[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* lane l = b[l*ldb] */
__attribute__((target("avx2"))) static inline __m256 column8(const float *b, int64_t ldb) {
  return _mm256_set_ps(b[7 * ldb], b[6 * ldb], b[5 * ldb], b[4 * ldb], b[3 * ldb], b[2 * ldb], b[ldb], b[0]);
}

/* Into L2, when on: the line at column p of each of the `rows` rows at
 * `next` (every 16 columns). Always inlined: gcc 12 takes a function whose
 * only effect is a prefetch for one without effects and deletes its calls. */
__attribute__((always_inline)) static inline void prefetch_block(bool on, int rows, const float *next, int64_t ldb, int64_t p) {
  if (on && p % 16 == 0)
    for (int r = 0; r < rows; r++) _mm_prefetch((const char *)(next + r * ldb + p), _MM_HINT_T1);
}

/* One row of A, two blocks of 8 rows of B at a time: two independent chains
 * hide the fma latency that one chain of 8 dependent fmas per block would
 * expose. */
__attribute__((target("avx2,fma"))) static void gemv_t1_avx2(int64_t n, int64_t k, const float *a, int64_t inca, const float *B,
                                                             int64_t ldb, float *c) {
  int64_t j = 0;
  for (; j + GEMV_T_ROWS <= n; j += GEMV_T_ROWS) {
    const float *b0 = B + j * ldb, *b1 = b0 + 8 * ldb;
    bool ahead = j + 2 * GEMV_T_ROWS <= n; /* a next block to ask for */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), t0[8], t1[8];
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
      prefetch_block(ahead, GEMV_T_ROWS, b0 + GEMV_T_ROWS * ldb, ldb, p);
      transpose8_regs(b0 + p, ldb, t0);
      transpose8_regs(b1 + p, ldb, t1);
#pragma GCC unroll 8 /* t0 and t1 stay in registers (-O2 left this loop rolled, t0 and t1 on the stack) */
      for (int q = 0; q < 8; q++) {
        __m256 x = _mm256_set1_ps(a[(p + q) * inca]);
        acc0 = _mm256_fmadd_ps(x, t0[q], acc0), acc1 = _mm256_fmadd_ps(x, t1[q], acc1);
      }
    }
    for (; p < k; p++) {
      __m256 x = _mm256_set1_ps(a[p * inca]);
      acc0 = _mm256_fmadd_ps(x, column8(b0 + p, ldb), acc0), acc1 = _mm256_fmadd_ps(x, column8(b1 + p, ldb), acc1);
    }
    _mm256_storeu_ps(c + j, acc0), _mm256_storeu_ps(c + j + 8, acc1);
  }
  gemv_t_c(n - j, k, a, inca, B + j * ldb, ldb, c + j);
}

/* Rows i < m (a constant where inlined) of C at columns 0..7 from the 8 rows
 * of B at b; `ahead`: ask for the 8 rows after them. */
__attribute__((target("avx2,fma"), always_inline)) static inline void block8_t_avx2(int m, int64_t k, const float *A, int64_t ars,
                                                                                  int64_t acs, const float *b, int64_t ldb,
                                                                                  bool ahead, float *c, int64_t ldc) {
  __m256 acc[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    prefetch_block(ahead, 8, b + 8 * ldb, ldb, p);
    transpose8_regs(b + p, ldb, t);
#pragma GCC unroll 8
    for (int i = 0; i < m; i++)
#pragma GCC unroll 8
      for (int q = 0; q < 8; q++) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(A[i * ars + (p + q) * acs]), t[q], acc[i]);
  }
  for (; p < k; p++) {
    __m256 col = column8(b + p, ldb);
#pragma GCC unroll 8
    for (int i = 0; i < m; i++) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(A[i * ars + p * acs]), col, acc[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < m; i++) _mm256_storeu_ps(c + i * ldc, acc[i]);
}

/* 2 <= m <= GEMV_T_GROUP rows of A: 8 rows of B a block, transposed again
 * for each group of up to 8 rows of A (an accumulator each beside the 8
 * transposed vectors fill AVX2's 16 registers); the rows' own accumulators
 * are the independent chains. */
__attribute__((target("avx2,fma"))) static void gemv_t_avx2(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars,
                                                            int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int64_t i0 = 0; i0 < m; i0 += 8) {
      const float *b = B + j * ldb, *a = A + i0 * ars;
      bool ahead = i0 == 0 && j + 16 <= n;
      float *c = C + i0 * ldc + j;
      switch (min64(8, m - i0)) {
#define CASE(M) \
  case M: block8_t_avx2(M, k, a, ars, acs, b, ldb, ahead, c, ldc); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
      }
    }
  for (int64_t i = 0; i < m && j < n; i++) gemv_t_c(n - j, k, A + i * ars, acs, B + j * ldb, ldb, C + i * ldc + j);
}

/* lo's 8 floats in lanes 0-7, hi's in lanes 8-15 */
__attribute__((target("avx512f"), always_inline)) static inline __m512 two_rows(const float *lo, const float *hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(lo))),
                                             _mm256_castps_pd(_mm256_loadu_ps(hi)), 1));
}

/* t[q] lane l = src[l*lds + q], for 16 rows of 8. The rows are loaded in
 * pairs (a, a + 4) for a in 0..3 and 8..11, so that after the two in-lane
 * steps of an 8 x 8 transpose (on both 256-bit halves at once) one 128-bit
 * shuffle puts lanes in row order. */
__attribute__((target("avx512f"), always_inline)) static inline void transpose16x8_regs(const float *src, int64_t lds,
                                                                                      __m512 t[8]) {
  __m512 r0 = two_rows(src, src + 4 * lds), r1 = two_rows(src + lds, src + 5 * lds), r2 = two_rows(src + 2 * lds, src + 6 * lds),
         r3 = two_rows(src + 3 * lds, src + 7 * lds), r4 = two_rows(src + 8 * lds, src + 12 * lds),
         r5 = two_rows(src + 9 * lds, src + 13 * lds), r6 = two_rows(src + 10 * lds, src + 14 * lds),
         r7 = two_rows(src + 11 * lds, src + 15 * lds);
  __m512 t0 = _mm512_unpacklo_ps(r0, r1), t1 = _mm512_unpackhi_ps(r0, r1), t2 = _mm512_unpacklo_ps(r2, r3),
         t3 = _mm512_unpackhi_ps(r2, r3), t4 = _mm512_unpacklo_ps(r4, r5), t5 = _mm512_unpackhi_ps(r4, r5),
         t6 = _mm512_unpacklo_ps(r6, r7), t7 = _mm512_unpackhi_ps(r6, r7);
  __m512 s0 = _mm512_shuffle_ps(t0, t2, 0x44), s1 = _mm512_shuffle_ps(t0, t2, 0xEE), s2 = _mm512_shuffle_ps(t1, t3, 0x44),
         s3 = _mm512_shuffle_ps(t1, t3, 0xEE), s4 = _mm512_shuffle_ps(t4, t6, 0x44), s5 = _mm512_shuffle_ps(t4, t6, 0xEE),
         s6 = _mm512_shuffle_ps(t5, t7, 0x44), s7 = _mm512_shuffle_ps(t5, t7, 0xEE);
  /* s_q (q < 4) holds column q of rows 0-3, 8-11 in its 128-bit lanes 0, 2 and column q + 4 in lanes 1, 3;
   * s_{q+4} the same of rows 4-7, 12-15 */
  t[0] = _mm512_shuffle_f32x4(s0, s4, 0x88), t[1] = _mm512_shuffle_f32x4(s1, s5, 0x88);
  t[2] = _mm512_shuffle_f32x4(s2, s6, 0x88), t[3] = _mm512_shuffle_f32x4(s3, s7, 0x88);
  t[4] = _mm512_shuffle_f32x4(s0, s4, 0xDD), t[5] = _mm512_shuffle_f32x4(s1, s5, 0xDD);
  t[6] = _mm512_shuffle_f32x4(s2, s6, 0xDD), t[7] = _mm512_shuffle_f32x4(s3, s7, 0xDD);
}

/* lane l = b[l*ldb] */
__attribute__((target("avx512f"))) static inline __m512 column16(const float *b, int64_t ldb) {
  return _mm512_set_ps(b[15 * ldb], b[14 * ldb], b[13 * ldb], b[12 * ldb], b[11 * ldb], b[10 * ldb], b[9 * ldb], b[8 * ldb],
                       b[7 * ldb], b[6 * ldb], b[5 * ldb], b[4 * ldb], b[3 * ldb], b[2 * ldb], b[ldb], b[0]);
}

/* Rows i < m (a constant where inlined) of C at columns 0..15 from the 16
 * rows of B at b; `ahead`: ask for the 16 rows after them. With one row of
 * A, one chain per block: a second block beside it (two chains) measured no
 * faster, from L2 or from memory. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void block16_t_avx512(int m, int64_t k, const float *A,
                                                                                        int64_t ars, int64_t acs, const float *b,
                                                                                        int64_t ldb, bool ahead, float *c,
                                                                                        int64_t ldc) {
  __m512 acc[GEMV_T_GROUP], t[8];
#pragma GCC unroll 16
  for (int i = 0; i < m; i++) acc[i] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    prefetch_block(ahead, GEMV_T_ROWS, b + GEMV_T_ROWS * ldb, ldb, p);
    transpose16x8_regs(b + p, ldb, t);
#pragma GCC unroll 16
    for (int i = 0; i < m; i++)
#pragma GCC unroll 8
      for (int q = 0; q < 8; q++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(A[i * ars + (p + q) * acs]), t[q], acc[i]);
  }
  for (; p < k; p++) {
    __m512 col = column16(b + p, ldb);
#pragma GCC unroll 16
    for (int i = 0; i < m; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(A[i * ars + p * acs]), col, acc[i]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < m; i++) _mm512_storeu_ps(c + i * ldc, acc[i]);
}

/* 1 <= m <= GEMV_T_MAX_M rows of A, GEMV_T_GROUP at a time per block of B
 * (transposed again for each group, from L1 or L2); the last n % 16 rows of
 * B go to the C kernel. */
__attribute__((target("avx512f,fma"))) static void gemv_t_avx512(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars,
                                                                 int64_t acs, const float *B, int64_t ldb, float *C,
                                                                 int64_t ldc) {
  int64_t j = 0;
  for (; j + GEMV_T_ROWS <= n; j += GEMV_T_ROWS)
    for (int64_t i0 = 0; i0 < m; i0 += GEMV_T_GROUP) {
      const float *b = B + j * ldb, *a = A + i0 * ars;
      bool ahead = i0 == 0 && j + 2 * GEMV_T_ROWS <= n; /* a next block to ask for */
      float *c = C + i0 * ldc + j;
      switch (min64(GEMV_T_GROUP, m - i0)) {
#define CASE(M) \
  case M: block16_t_avx512(M, k, a, ars, acs, b, ldb, ahead, c, ldc); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
        CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
      }
    }
  for (int64_t i = 0; i < m && j < n; i++) gemv_t_c(n - j, k, A + i * ars, acs, B + j * ldb, ldb, C + i * ldc + j);
}
#endif

/* C = op(A) B^T for m <= GEMV_T_MAX_M (GEMV_T_GROUP below AVX-512), k >= 1; false when out of
 * memory. Several rows of A are first copied p-major (ap[p*m + i]): every
 * block of B reads all of A, and in that order it is one stream from L2
 * instead of m (16 x 768 x 2048 ...). */
static bool gemv_t(nb_sgemm_isa isa, bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc) {
  int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
#ifdef SGEMM_X86
  if (isa == NB_SGEMM_AVX2 && m == 1) return gemv_t1_avx2(n, k, A, acs, B, ldb, C), true;
  if (isa != NB_SGEMM_C && m > 1 && m * k <= GEMV_T_PACK_MAX) { /* the thread keeps its scratch: bounded */
    float *ap = scratch((size_t)(m * k));
    if (!ap) return false;
    for (int64_t p = 0; p < k; p++)
      for (int64_t i = 0; i < m; i++) ap[p * m + i] = A[i * ars + p * acs];
    A = ap, ars = 1, acs = m;
  }
  if (isa == NB_SGEMM_AVX512) return gemv_t_avx512(m, n, k, A, ars, acs, B, ldb, C, ldc), true;
  if (isa == NB_SGEMM_AVX2) return gemv_t_avx2(m, n, k, A, ars, acs, B, ldb, C, ldc), true;
#endif
  (void)isa;
  for (int64_t i = 0; i < m; i++) gemv_t_c(n, k, A + i * ars, acs, B, ldb, C + i * ldc);
  return true;
}

/* ---------------------------------------------------------------- panels */

/* B held as panels of PANEL columns, each panel's k rows one after the
 * other: element (p, j) at Bp[(j / PANEL) * PANEL * k + p * PANEL + j % PANEL]
 * (sgemm.h). A few rows of A read each panel once, front to back: one
 * contiguous stream a thread like whole rows of a transposed B, and each
 * p's PANEL values are already vectors of columns like a row of an
 * untransposed B, so no register transposes (AVX2's 8 x 8 transposes held
 * a transposed B's one-row product to 29.8 GB/s from L2 where AVX-512's
 * untransposed kernel read 59.8; Zen 4, session 15). The accumulators of a
 * panel's columns are the independent chains: 4 vectors on AVX-512 (a
 * group of up to 6 rows of A), 8 on AVX2 (one row; half a panel, 4 vectors,
 * for groups of up to 3 rows). */
#define PANEL_FEW_ROWS 16 /* rows of A up to which panels are streamed; past it the blocked path reads them in place */

static void panels_c(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *Bp, float *C,
                     int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      const float *b = Bp + j / PANEL * PANEL * k + j % PANEL;
      float acc = 0.0f;
      for (int64_t p = 0; p < k; p++) acc = fmaf(A[i * ars + p * acs], b[p * PANEL], acc);
      C[i * ldc + j] = acc;
    }
}

#ifdef SGEMM_X86
/* Rows i < m of C at the panel's 64 columns, the panel at b (element (p, j)
 * at b[p * PANEL + j]); m a constant where inlined. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void panel_block_avx512(int m, int64_t k, const float *A,
                                                                                          int64_t ars, int64_t acs,
                                                                                          const float *b, float *c,
                                                                                          int64_t ldc) {
  enum { nv = PANEL / 16 };
  __m512 acc[6][4];
#pragma GCC unroll 6
  for (int i = 0; i < m; i++)
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; p++, b += PANEL) {
    __m512 col[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) col[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 6
    for (int i = 0; i < m; i++) {
      __m512 x = _mm512_set1_ps(A[i * ars + p * acs]);
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(x, col[v], acc[i][v]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < m; i++)
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
}

__attribute__((target("avx512f,fma"))) static void panels_avx512(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars,
                                                                 int64_t acs, const float *Bp, float *C, int64_t ldc) {
  for (int64_t j = 0; j < n; j += PANEL)
    for (int64_t i0 = 0; i0 < m; i0 += 6) {
      const float *a = A + i0 * ars, *b = Bp + j * k;
      float *c = C + i0 * ldc + j;
      switch (min64(6, m - i0)) {
#define CASE(M) \
  case M: panel_block_avx512(M, k, a, ars, acs, b, c, ldc); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
      }
    }
}

/* The same with 8-lane vectors at columns 0 .. 8 * nv - 1: nv 8 (the whole
 * panel, one row) or 4 (half of it, up to 3 rows); m and nv constants where
 * inlined. */
__attribute__((target("avx2,fma"), always_inline)) static inline void panel_block_avx2(int m, int nv, int64_t k, const float *A,
                                                                                      int64_t ars, int64_t acs, const float *b,
                                                                                      float *c, int64_t ldc) {
  __m256 acc[3][8];
#pragma GCC unroll 3
  for (int i = 0; i < m; i++)
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) acc[i][v] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; p++, b += PANEL) {
#pragma GCC unroll 3
    for (int i = 0; i < m; i++) {
      __m256 x = _mm256_set1_ps(A[i * ars + p * acs]);
#pragma GCC unroll 8
      for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 8 * v), acc[i][v]);
    }
  }
#pragma GCC unroll 3
  for (int i = 0; i < m; i++)
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);
}

__attribute__((target("avx2,fma"))) static void panels_avx2(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars,
                                                            int64_t acs, const float *Bp, float *C, int64_t ldc) {
  for (int64_t j = 0; j < n; j += PANEL) {
    const float *b = Bp + j * k;
    if (m == 1) {
      panel_block_avx2(1, 8, k, A, ars, acs, b, C + j, ldc);
      continue;
    }
    for (int half = 0; half < PANEL; half += PANEL / 2)
      for (int64_t i0 = 0; i0 < m; i0 += 3) {
        const float *a = A + i0 * ars;
        float *c = C + i0 * ldc + j + half;
        switch (min64(3, m - i0)) {
#define CASE(M) \
  case M: panel_block_avx2(M, 4, k, a, ars, acs, b + half, c, ldc); break;
          CASE(1) CASE(2) CASE(3)
#undef CASE
        }
      }
  }
}
#endif

/* ---------------------------------------------------------------- driver */

static bool blocked(nb_sgemm_isa isa, kernel kr, bool ta, bool tb, bool panels, int64_t m, int64_t n, int64_t k,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc);

bool nb_cpu__sgemm_on(nb_sgemm_isa isa, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc) {
  kernel kr;
  if (!kernel_of(isa, &kr)) return false;
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)n);
    return true;
  }
  if (m <= GEMV_MAX_M && !tb) {
    gemv(isa, ta, m, n, k, A, lda, B, ldb, C, ldc);
    return true;
  }
  /* Past a group of rows the blocked path (B packed) wins with long rows of B, where a block's A and B
   * outgrow L1 (AVX-512, 64 x 2048 x 768: 65 GFLOP/s here, 85 blocked), and on AVX2, whose groups are
   * 8 rows (64 x 768 x 2048: 53 here, 75 blocked); AVX-512 with short rows is faster here (91 against
   * 79 blocked; Zen 4, session 15) when B is a weight streamed from memory: a small B (attention's
   * 64 x 32 x 64 scores of a training step) is cheaper blocked (the gpt2-tiny B=4 T=64 step 4% slower). */
  if (tb && (m <= GEMV_T_GROUP ||
             (isa == NB_SGEMM_AVX512 && m <= GEMV_T_MAX_M && k <= GEMV_T_MAX_K && n * k >= GEMV_T_MIN_B)))
    return gemv_t(isa, ta, m, n, k, A, lda, B, ldb, C, ldc);
  return blocked(isa, kr, ta, tb, false, m, n, k, A, lda, B, ldb, C, ldc);
}

bool nb_cpu__sgemm_panels_on(nb_sgemm_isa isa, bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                             const float *Bp, float *C, int64_t ldc) {
  kernel kr;
  if (!kernel_of(isa, &kr) || n % PANEL) return false;
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)n);
    return true;
  }
  if (m > PANEL_FEW_ROWS) return blocked(isa, kr, ta, false, true, m, n, k, A, lda, Bp, PANEL, C, ldc);
  int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
#ifdef SGEMM_X86
  /* One row streams panels from memory faster with 8-lane loads, two a line, than with one 16-lane load
   * a line (Zen 4, 768 x 2048 from memory, alternating: 18.8-24.5 GB/s against 15.9-20.7 at one
   * thread, 20.2-24.1 against 16.6-21.0 at two; equal from L2), so AVX-512 machines run it too. */
  if (isa != NB_SGEMM_C && m == 1) return panels_avx2(m, n, k, A, ars, acs, Bp, C, ldc), true;
  if (isa == NB_SGEMM_AVX512) return panels_avx512(m, n, k, A, ars, acs, Bp, C, ldc), true;
  if (isa == NB_SGEMM_AVX2) return panels_avx2(m, n, k, A, ars, acs, Bp, C, ldc), true;
#endif
  panels_c(m, n, k, A, ars, acs, Bp, C, ldc);
  return true;
}

/* The blocked scheme (the file's head); `panels`: B held as panels (ldb
 * PANEL), read in place up to a block of rows of A like an untransposed B,
 * packed past it (AVX2, 1024 x 768 x 2048: 65 GFLOP/s in place, 91
 * packed; 128 rows: 77 in place, 72 plain B packed). */
static bool blocked(nb_sgemm_isa isa, kernel kr, bool ta, bool tb, bool panels, int64_t m, int64_t n, int64_t k,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc) {
  int mr = kr.mr, nr = kr.nr;
  bool avx2 = isa != NB_SGEMM_C; /* the packing's transposes (data movement only) */
  int64_t mc = MC / mr * mr, nc = NC / nr * nr, kc_max = min64(k, KC);
  size_t na = (size_t)round_up((int64_t)mr * kc_max, 16); /* one packed panel: the last rows of a block */
  size_t nbf = (size_t)(round_up(min64(n, nc), nr) * kc_max);
  float *pa = scratch(na + nbf);
  if (!pa) return false;
  float *pb = pa + na;
  float edge[MAX_MR * MAX_NR] = {0};
  /* Whole panels of A are read in place: element (i, p) at A[i*ars + p*acs].
   * So are whole panels of an untransposed B when A has at most one block of
   * rows: a packed panel would serve at most MC / MR micro-kernel calls, too
   * few to pay for its copy (a weight gradient, 128 x 512 x 2048: 214 -> 234
   * GFLOP/s on AVX-512, 105 -> 114 on AVX2); with more rows the packed panel's
   * reuse from L1 wins (1024 x 3072 x 768: 218 packed, 169 in place). */
  bool b_direct = !tb && m <= MC;
  int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
  bool one_panel = n <= (int64_t)nr;
  for (int64_t jc = 0; jc < n; jc += nc) {
    int64_t nb = min64(nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      int64_t kb = min64(KC, k - pc);
      bool first = pc == 0;
      if (panels && !b_direct) pack_b_panels(B, k, pc, kb, jc, nb, nr, pb); /* n % PANEL == 0: no ragged nr */
      else if (!b_direct || nb % nr) pack_b(tb, avx2, B, ldb, pc, kb, jc, nb, nr, pb);
      for (int64_t ic = 0; ic < m; ic += mc) {
        int64_t mb = min64(mc, m - ic);
        if (mb % mr) pack_a(ta, A, lda, ic + mb / mr * mr, mb % mr, pc, kb, mr, pa);
        for (int64_t jr = 0; jr < nb; jr += nr) {
          int64_t cols = min64(nr, nb - jr);
          bool b_in_place = b_direct && cols == nr;
          int64_t col = jc + jr; /* panels: nr divides PANEL, so a slice never straddles two */
          const float *b = !b_in_place ? pb + jr * kb
                           : panels    ? B + col / PANEL * PANEL * k + pc * PANEL + col % PANEL
                                       : B + pc * ldb + col;
          int64_t rsb = b_in_place ? ldb : nr;
          for (int64_t ir = 0; ir < mb; ir += mr) {
            int64_t rows = min64(mr, mb - ir);
            float *c = C + (ic + ir) * ldc + jc + jr;
            const float *a = rows == mr ? A + (ic + ir) * ars + pc * acs : pa;
            int64_t rsa = rows == mr ? ars : 1, csa = rows == mr ? acs : mr;
            /* A read once (one panel of B: attention's P V with a 32-wide
             * head): each panel of A comes from memory once, so the kernel
             * asks for the next one while it runs, past the last one too
             * (the rows after this block: the next item of a batch of
             * products laid out one after the other; a prefetch does not
             * fault). 128 x 32 x 128 from memory 1.22x, P V of the tiny
             * gpt2 (64 of them) 1.16-1.24x; with two panels (128 x 64 x
             * 128) 1.02x from memory and 0.94x from cache, and with wide
             * B (decode products) 0.88-0.96x: the hints only cost. */
            const float *a_next = one_panel && !ta ? a + mr * ars : NULL;
            if (rows == mr && cols == nr) {
              kr.fn(kb, a, rsa, csa, b, rsb, c, ldc, first, a_next);
              continue;
            }
            /* an edge tile: through a full one on the stack */
            if (!first)
              for (int64_t r = 0; r < rows; r++) memcpy(edge + r * nr, c + r * ldc, sizeof(float) * (size_t)cols);
            kr.fn(kb, a, rsa, csa, b, rsb, edge, nr, first, NULL);
            for (int64_t r = 0; r < rows; r++) memcpy(c + r * ldc, edge + r * nr, sizeof(float) * (size_t)cols);
          }
        }
      }
    }
  }
  return true;
}

static nb_sgemm_isa best_isa(void) {
  static nb_sgemm_isa best = (nb_sgemm_isa)-1;
  nb_sgemm_isa isa = __atomic_load_n(&best, __ATOMIC_RELAXED);
  if ((int)isa < 0) __atomic_store_n(&best, isa = nb_cpu__sgemm_best(), __ATOMIC_RELAXED);
  return isa;
}

bool nb_cpu__sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc) {
  return nb_cpu__sgemm_on(best_isa(), ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
}

bool nb_cpu__sgemm_panels(bool ta, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bp, float *C,
                          int64_t ldc) {
  return nb_cpu__sgemm_panels_on(best_isa(), ta, m, n, k, A, lda, Bp, C, ldc);
}
