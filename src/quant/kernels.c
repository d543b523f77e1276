/* The quant.matmul kernels: y[m, n] = x[m, k] @ dequant(W)^T.
 *
 * Weight-only (int8, int4, nf4, fp8): each 16 codes of a row are decoded in
 * registers, multiplied by their tile's scale (or, per-channel byte codes,
 * the sum by the row's: folds), and accumulated with f32 fused
 * multiply-adds into 16 lanes (lane = k mod 16, in the order of k), summed
 * at the end by a fixed tree (reduce16). A register block reuses a
 * decoded vector for up to 4 rows of x (small M) and streams W once per
 * block of rows (M = 1 decode: once). Every path, C or vector, computes the
 * same chain per lane, so all give the same bits.
 *
 * W8A8: x is quantized per row (symmetric absmax, int8), each tile's dot
 * product is exact in int32 (vpdpbusd with AVX512-VNNI / AVX-VNNI, or
 * vpmaddubsw + vpmaddwd on AVX2, with the sign trick that keeps vpmaddubsw's
 * i16 pairs from saturating), and the tiles are combined in C as
 * y = fma(dot_t, s_w * s_x, y) in order of t: the same bits on every path.
 *
 * Threads: the n range is cut into chunks run through nb_jit_parallel_for
 * (an executable's pool when the call runs in one); no element depends on
 * the cut. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/compile.h"
#include "quant/internal.h"
#include "util/util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define QUANT_X86 1
#endif

/* fused multiply-adds only where written (fmaf): the C kernel is the definition */
NB_FP_CONTRACT_OFF

/* ---------------------------------------------------------------- shared pieces */

/* U8 and U4: asymmetric, a zero point per tile (the symmetric kinds' is a
 * constant, so their tile tables fold) */
typedef enum dec_kind { DEC_I8, DEC_U8, DEC_I4, DEC_U4, DEC_NF4, DEC_E4M3, DEC_E5M2 } dec_kind;

static dec_kind dec_kind_of(const nb_quant_layout *l) {
  switch (l->qtype) {
  case NB_QUANT_INT8: return l->asymmetric ? DEC_U8 : DEC_I8;
  case NB_QUANT_INT4: return l->asymmetric ? DEC_U4 : DEC_I4;
  case NB_QUANT_NF4: return DEC_NF4;
  case NB_QUANT_FP8_E4M3: return DEC_E4M3;
  default: return DEC_E5M2;
  }
}

/* the zero point of a symmetric layout: int4 codes are stored with +8 */
static inline int default_zero(dec_kind kind) { return kind == DEC_I4 ? 8 : 0; }

/* A row of byte codes in one tile (per-channel int8, fp8) takes its scale
 * once, on the sum: y = reduce16(lanes of fma(x, code, .)) * s, one
 * multiply per weight fewer. Tiled and 4-bit rows scale each weight:
 * y = reduce16(lanes of fma(x, code * s_t, .)). */
static inline bool folds(const nb_quant_layout *l) {
  return nb_quant_num_tiles(l) == 1 && l->qtype != NB_QUANT_INT4 && l->qtype != NB_QUANT_NF4;
}

/* The 16 lanes summed as ((l_i + l_{i+8}) + (.. i+4)) + (.. i+2)) + (.. i+1):
 * what the vector reductions below do. */
static inline float reduce16(const float *l) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; i++) a[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

/* code k of a row, decoded without its scale */
static float c_decode(dec_kind kind, const uint8_t *row, int64_t k, int z) {
  switch (kind) {
  case DEC_I8: return (float)(int8_t)row[k];
  case DEC_U8: return (float)((int)row[k] - z);
  case DEC_I4:
  case DEC_U4: return (float)(((row[k / 2] >> (4 * (k % 2))) & 15) - z);
  case DEC_NF4: return nb_quant__nf4_table[(row[k / 2] >> (4 * (k % 2))) & 15];
  case DEC_E4M3: return nb_quant_fp8_decode(row[k], NB_QUANT_FP8_E4M3);
  default: return nb_quant_fp8_decode(row[k], NB_QUANT_FP8_E5M2);
  }
}

/* ---------------------------------------------------------------- weight-only: C */

static void fkernel_c(const nb_quant__mm *p, int64_t n0, int64_t n1) {
  const int64_t K = p->l.k, T = nb_quant_num_tiles(&p->l), rb = nb_quant__row_bytes(&p->l);
  dec_kind kind = dec_kind_of(&p->l);
  bool fold = folds(&p->l);
  float *w = malloc(sizeof(float) * (size_t)K); /* one decoded row, reused for every row of x */
  for (int64_t n = n0; n < n1; n++) {
    const uint8_t *row = p->values + n * rb;
    for (int64_t k = 0; k < K; k++) {
      int64_t t = k / p->l.tile;
      int z = p->zero_points ? p->zero_points[n * T + t] : default_zero(kind);
      float v = fold ? c_decode(kind, row, k, z) : c_decode(kind, row, k, z) * p->scales[n * T + t];
      if (w) w[k] = v;
    }
    for (int64_t m = 0; m < p->m; m++) {
      const float *x = p->x + m * K;
      float acc[16] = {0};
      for (int64_t k = 0; k < K; k++) {
        int64_t t = k / p->l.tile;
        int z = p->zero_points ? p->zero_points[n * T + t] : default_zero(kind);
        float wk = w ? w[k] : fold ? c_decode(kind, row, k, z) : c_decode(kind, row, k, z) * p->scales[n * T + t];
        acc[k % 16] = fmaf(x[k], wk, acc[k % 16]);
      }
      p->y[m * p->l.n + n] = fold ? reduce16(acc) * p->scales[n * T] : reduce16(acc);
    }
  }
  free(w);
}

#ifdef QUANT_X86
/* ---------------------------------------------------------------- weight-only: AVX2 */

NB_TARGET_BEGIN("avx2,fma,f16c")

typedef struct v16x2 {
  __m256 lo, hi;
} v16x2;

static inline v16x2 a2_zero(void) { return (v16x2){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16x2 a2_fma(v16x2 x, v16x2 w, v16x2 acc) {
  return (v16x2){_mm256_fmadd_ps(x.lo, w.lo, acc.lo), _mm256_fmadd_ps(x.hi, w.hi, acc.hi)};
}
static inline __m256i a2_lanes_below(int valid, int first) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first)));
}
static inline v16x2 a2_fma_masked(int valid, v16x2 x, v16x2 w, v16x2 acc) {
  v16x2 f = a2_fma(x, w, acc);
  __m256 m0 = _mm256_castsi256_ps(a2_lanes_below(valid, 0)), m1 = _mm256_castsi256_ps(a2_lanes_below(valid, 8));
  return (v16x2){_mm256_blendv_ps(acc.lo, f.lo, m0), _mm256_blendv_ps(acc.hi, f.hi, m1)};
}
static inline v16x2 a2_load_x(const float *p, int valid) {
  if (valid == 16) return (v16x2){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  return (v16x2){_mm256_maskload_ps(p, a2_lanes_below(valid, 0)), _mm256_maskload_ps(p + 8, a2_lanes_below(valid, 8))};
}
static inline void a2_store(float *p, v16x2 v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
static inline v16x2 a2_set1(float s) { return (v16x2){_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
static inline v16x2 a2_mul(v16x2 a, v16x2 b) { return (v16x2){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline float a2_reduce(v16x2 v) {
  __m256 a = _mm256_add_ps(v.lo, v.hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
/* 8 bytes of nibbles -> 16 bytes, one code each in bits 0..3 (bits 4..7
 * junk: the lookups read only the low bits), in the order of k: a byte b
 * widened to 16 bits, b | b << 4, has b's low nibble in its low byte and
 * its high nibble as the whole high byte */
static inline __m128i a2_nibble_bytes(const uint8_t *p) {
  __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
  return _mm_or_si128(w, _mm_slli_epi16(w, 4));
}
/* 8 fp8 codes -> f32 through fp16 (vcvtph2ps, exact): an e5m2 code is the
 * high byte of the fp16 of its value (infinities and NaN included); an e4m3
 * code's magnitude placed in fp16 bits 7..13 (sign in 15) is its value /
 * 2^8 (subnormals included), times 2^8 exactly; its NaN code (s1111111)
 * becomes fp16's NaN. Bits as nb_quant_fp8_decode's, NaN payloads aside. */
static inline __m128i a2_fp8_half(__m128i h, dec_kind kind) {
  if (kind == DEC_E5M2) return _mm_slli_epi16(h, 8);
  h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(h, 8), 1), _mm_set1_epi16((short)0xbfff));
  __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80));
  return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), nan);
}
static inline __m256 a2_fp8(__m128i bytes8, dec_kind kind) {
  __m256 f = _mm256_cvtph_ps(a2_fp8_half(_mm_cvtepu8_epi16(bytes8), kind));
  return kind == DEC_E4M3 ? _mm256_mul_ps(f, _mm256_set1_ps(256.0f)) : f;
}
static inline v16x2 a2_dec(dec_kind kind, const uint8_t *p, int z) {
  __m128i bytes = _mm_loadu_si128((const __m128i *)p);
  __m128i b8 = _mm_unpackhi_epi64(bytes, bytes);
  if (kind == DEC_I8) return (v16x2){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8))};
  if (kind == DEC_E4M3 || kind == DEC_E5M2) return (v16x2){a2_fp8(bytes, kind), a2_fp8(b8, kind)};
  __m256i c0 = _mm256_cvtepu8_epi32(bytes), c1 = _mm256_cvtepu8_epi32(b8);
  __m256i zv = _mm256_set1_epi32(z);
  return (v16x2){_mm256_cvtepi32_ps(_mm256_sub_epi32(c0, zv)), _mm256_cvtepi32_ps(_mm256_sub_epi32(c1, zv))};
}
typedef struct i16x2 {
  __m256i lo, hi;
} i16x2;
static inline i16x2 a2_nibbles(const uint8_t *p) {
  __m128i b = a2_nibble_bytes(p);
  return (i16x2){_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b))};
}
static inline v16x2 a2_tile_table(dec_kind kind, int z) {
  if (kind == DEC_NF4) return (v16x2){_mm256_loadu_ps(nb_quant__nf4_table), _mm256_loadu_ps(nb_quant__nf4_table + 8)};
  __m256i zv = _mm256_set1_epi32(z);
  return (v16x2){_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), zv)),
                 _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15), zv))};
}
/* t[idx & 15]: the two halves permuted by idx's low 3 bits, picked by bit 3 */
static inline __m256 a2_lut8(v16x2 t, __m256i idx) {
  __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, idx), _mm256_permutevar8x32_ps(t.hi, idx), sel);
}
static inline v16x2 a2_lut(v16x2 t, i16x2 idx) { return (v16x2){a2_lut8(t, idx.lo), a2_lut8(t, idx.hi)}; }
/* 16 int4 codes minus z, as f32 */
static inline v16x2 a2_dec4(const uint8_t *p, int z) {
  __m128i b = _mm_and_si128(a2_nibble_bytes(p), _mm_set1_epi8(0x0f));
  __m256i zv = _mm256_set1_epi32(z);
  return (v16x2){_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(b), zv)),
                 _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b)), zv))};
}

#define SFX avx2
#define MB_MAX 2
#define NB 2
#define V v16x2
#define v_zero a2_zero
#define v_fma a2_fma
#define v_fma_masked a2_fma_masked
#define v_load_x a2_load_x
#define v_store a2_store
#define v_set1 a2_set1
#define v_mul a2_mul
#define v_reduce a2_reduce
#define v_dec a2_dec
#define VI i16x2
#define v_nibbles a2_nibbles
#define v_tile_table a2_tile_table
#define v_lut a2_lut
#define INT4_BY_CONVERT 1
#define v_dec4 a2_dec4
#include "quant/kernel_f32.inc" /* undefines the parameters above */
NB_TARGET_END

/* ---------------------------------------------------------------- weight-only: AVX-512 */

NB_TARGET_BEGIN("avx512f,avx512bw,avx512vl,fma,avx2,f16c")

static inline __m512 a5_zero(void) { return _mm512_setzero_ps(); }
static inline __m512 a5_fma(__m512 x, __m512 w, __m512 acc) { return _mm512_fmadd_ps(x, w, acc); }
static inline __mmask16 a5_mask(int valid) { return (__mmask16)((1u << valid) - 1); }
static inline __m512 a5_fma_masked(int valid, __m512 x, __m512 w, __m512 acc) {
  return _mm512_mask3_fmadd_ps(x, w, acc, a5_mask(valid));
}
static inline __m512 a5_load_x(const float *p, int valid) {
  return valid == 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(a5_mask(valid), p);
}
static inline void a5_store(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
static inline __m512 a5_set1(float s) { return _mm512_set1_ps(s); }
static inline float a5_reduce(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
/* as a2_fp8, 16 codes at once */
static inline __m512 a5_fp8(__m128i bytes, dec_kind kind) {
  __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8);
  if (kind == DEC_E5M2) return _mm512_cvtph_ps(h);
  h = _mm256_and_si256(_mm256_srai_epi16(h, 1), _mm256_set1_epi16((short)0xbfff));
  __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x3f80));
  h = _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7e00));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}
static inline __m512 a5_dec(dec_kind kind, const uint8_t *p, int z) {
  __m128i bytes = _mm_loadu_si128((const __m128i *)p);
  if (kind == DEC_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
  if (kind == DEC_E4M3 || kind == DEC_E5M2) return a5_fp8(bytes, kind);
  __m512i c = _mm512_cvtepu8_epi32(bytes);
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(c, _mm512_set1_epi32(z)));
}
static inline __m512i a5_nibbles(const uint8_t *p) { return _mm512_cvtepu8_epi32(a2_nibble_bytes(p)); }
static inline __m512 a5_tile_table(dec_kind kind, int z) {
  if (kind == DEC_NF4) return _mm512_loadu_ps(nb_quant__nf4_table);
  __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(z)));
}
static inline __m512 a5_lut(__m512 t, __m512i idx) { return _mm512_permutexvar_ps(idx, t); }
static inline __m512 a5_dec4(const uint8_t *p, int z) { /* unused: AVX-512 looks int4 up (INT4_BY_CONVERT 0) */
  __m128i b = _mm_and_si128(a2_nibble_bytes(p), _mm_set1_epi8(0x0f));
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(z)));
}

#define SFX avx512
#define MB_MAX 4
#define NB 4
#define V __m512
#define v_zero a5_zero
#define v_fma a5_fma
#define v_fma_masked a5_fma_masked
#define v_load_x a5_load_x
#define v_store a5_store
#define v_set1 a5_set1
#define v_mul _mm512_mul_ps
#define v_reduce a5_reduce
#define v_dec a5_dec
#define VI __m512i
#define v_nibbles a5_nibbles
#define v_tile_table a5_tile_table
#define v_lut a5_lut
#define INT4_BY_CONVERT 0
#define v_dec4 a5_dec4
#include "quant/kernel_f32.inc" /* undefines the parameters above */
NB_TARGET_END
#endif /* QUANT_X86 */

/* ---------------------------------------------------------------- W8A8 */

/* Exact int32 dots of one tile: r[i*NBI + j] = sum over len codes of
 * x_i * w_j, for MB rows of x (1 or MBI) and NBI rows of W. x holds the
 * row's int8 codes, or (AVX512-VNNI) the codes + 128 as u8. */
enum { MBI = 4, NBI = 4 };
typedef void (*tile_dots_fn)(const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r);

static inline __attribute__((always_inline)) void dots_c_body(const uint8_t *const *x, const uint8_t *const *w, int64_t len,
                                                              int32_t *r, const int MB) {
  for (int i = 0; i < MB; i++)
    for (int j = 0; j < NBI; j++) {
      int32_t s = 0;
      for (int64_t k = 0; k < len; k++) s += (int32_t)(int8_t)x[i][k] * (int32_t)(int8_t)w[j][k];
      r[i * NBI + j] = s;
    }
}
static void dots_c_1(const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r) { dots_c_body(x, w, len, r, 1); }
static void dots_c_4(const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r) { dots_c_body(x, w, len, r, MBI); }

#ifdef QUANT_X86
NB_TARGET_BEGIN("avx2,fma")
static inline int32_t hsum8(__m256i v) {
  __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4e));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xb1));
  return _mm_cvtsi128_si32(a);
}
/* 32 codes at p, or the len < 32 last ones followed by zeros */
static inline __m256i load32(const uint8_t *p, int64_t len, uint8_t *tmp) {
  if (len >= 32) return _mm256_loadu_si256((const __m256i *)p);
  memset(tmp, 0, 32), memcpy(tmp, p, (size_t)len);
  return _mm256_loadu_si256((const __m256i *)tmp);
}
static inline __m256i madd_avx2(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
NB_TARGET_END

/* The sign trick: x*w = |w| * (x with w's sign), |w| as u8 (|-128| = 128)
 * and |x| <= 127, so vpmaddubsw's pairs stay within 2 * 128 * 127 < 2^15.
 * One body per instruction set: ACC(acc, u8, s8) adds the products. */
#define DOTS_256(SFX, TARGET, ACC)                                                                                           \
  __attribute__((target(TARGET), always_inline)) static inline void dots_##SFX##_body(                                     \
      const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r, const int MB) {                            \
    uint8_t tmp[32];                                                                                                       \
    _Pragma("GCC unroll 8")                                                                                             \
    for (int jp = 0; jp < NBI; jp += 2) {                                                                                  \
      __m256i acc[MBI][2];                                                                                                 \
      _Pragma("GCC unroll 8")                                                                                           \
      for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();                                         \
      for (int64_t c0 = 0; c0 < len; c0 += 32) {                                                                           \
        __m256i w0 = load32(w[jp] + c0, len - c0, tmp), w1 = load32(w[jp + 1] + c0, len - c0, tmp);                         \
        __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);                                               \
        _Pragma("GCC unroll 8")                                                                                         \
        for (int i = 0; i < MB; i++) {                                                                                     \
          __m256i xv = load32(x[i] + c0, len - c0, tmp);                                                                   \
          acc[i][0] = ACC(acc[i][0], a0, _mm256_sign_epi8(xv, w0));                                                        \
          acc[i][1] = ACC(acc[i][1], a1, _mm256_sign_epi8(xv, w1));                                                        \
        }                                                                                                                  \
      }                                                                                                                    \
      _Pragma("GCC unroll 8")                                                                                           \
      for (int i = 0; i < MB; i++) r[i * NBI + jp] = hsum8(acc[i][0]), r[i * NBI + jp + 1] = hsum8(acc[i][1]);             \
    }                                                                                                                      \
  }                                                                                                                        \
  __attribute__((target(TARGET))) static void dots_##SFX##_1(const uint8_t *const *x, const uint8_t *const *w, int64_t len, \
                                                            int32_t *r) {                                                 \
    dots_##SFX##_body(x, w, len, r, 1);                                                                                    \
  }                                                                                                                        \
  __attribute__((target(TARGET))) static void dots_##SFX##_4(const uint8_t *const *x, const uint8_t *const *w, int64_t len, \
                                                            int32_t *r) {                                                 \
    dots_##SFX##_body(x, w, len, r, MBI);                                                                                  \
  }
DOTS_256(avx2, "avx2,fma", madd_avx2)
DOTS_256(avxvnni, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32)

NB_TARGET_BEGIN("avx512f,avx512bw,avx512vnni")
/* x as u8 = code + 128: sum (x + 128) w = sum x w + 128 sum w, sum w taken
 * by one more vpdpbusd of ones per vector of W (shared by the rows of x). */
static inline __attribute__((always_inline)) void dots_512_body(const uint8_t *const *x, const uint8_t *const *w, int64_t len,
                                                                int32_t *r, const int MB) {
  __m512i acc[MBI][NBI], ws[NBI], ones = _mm512_set1_epi8(1);
  _Pragma("GCC unroll 8")
  for (int j = 0; j < NBI; j++) {
    ws[j] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int i = 0; i < MB; i++) acc[i][j] = _mm512_setzero_si512();
  }
  for (int64_t c0 = 0; c0 < len; c0 += 64) {
    __mmask64 m = len - c0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (len - c0)) - 1);
    __m512i wv[NBI];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NBI; j++) wv[j] = _mm512_maskz_loadu_epi8(m, w[j] + c0), ws[j] = _mm512_dpbusd_epi32(ws[j], ones, wv[j]);
    _Pragma("GCC unroll 8")
    for (int i = 0; i < MB; i++) {
      __m512i xv = _mm512_maskz_loadu_epi8(m, x[i] + c0);
      _Pragma("GCC unroll 8")
      for (int j = 0; j < NBI; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv, wv[j]);
    }
  }
  _Pragma("GCC unroll 8")
  for (int j = 0; j < NBI; j++) {
    int32_t sw = _mm512_reduce_add_epi32(ws[j]);
    _Pragma("GCC unroll 8")
    for (int i = 0; i < MB; i++) r[i * NBI + j] = _mm512_reduce_add_epi32(acc[i][j]) - 128 * sw;
  }
}
static void dots_avx512vnni_1(const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r) {
  dots_512_body(x, w, len, r, 1);
}
static void dots_avx512vnni_4(const uint8_t *const *x, const uint8_t *const *w, int64_t len, int32_t *r) {
  dots_512_body(x, w, len, r, MBI);
}
NB_TARGET_END
#endif /* QUANT_X86 */

/* Correctly rounded IEEE operations only (divide, round to nearest even,
 * fused multiply-add): each clone, vectorized for its ISA, gives the same
 * bits; the clone is picked by the CPU at load time. */
#define QUANT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

QUANT_CLONES static float quantize_row_i8(const float *x, int64_t k, int8_t *q) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < k; i++) {
    float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
    finite &= a <= 3.40282347e38f; /* false for NaN and infinity */
  }
  if (!finite || amax == 0) {
    for (int64_t i = 0; i < k; i++) q[i] = 0;
    return finite ? 0.0f : NAN;
  }
  float s = amax / 127.0f;
  for (int64_t i = 0; i < k; i++) {
    float v = nearbyintf(x[i] / s);
    q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
  }
  return s;
}

/* int8_static's rounding of one row by a fixed scale s: codes saturate at
 * +-127 (infinities too); a row with a NaN gives scale NaN (codes 0), as
 * the dynamic rounding; s = 0 gives zero codes. */
QUANT_CLONES static float quantize_row_i8_static(const float *x, int64_t k, float s, int8_t *q) {
  bool nan = false;
  for (int64_t i = 0; i < k; i++) nan |= x[i] != x[i];
  if (nan || s == 0) {
    for (int64_t i = 0; i < k; i++) q[i] = 0;
    return nan ? NAN : 0.0f;
  }
  for (int64_t i = 0; i < k; i++) {
    float v = nearbyintf(x[i] / s);
    q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
  }
  return s;
}

/* (a clone set is a symbol of its own, kept static: not exported) */
float nb_quant__quantize_row_i8(const float *x, int64_t k, int8_t *q) { return quantize_row_i8(x, k, q); }

/* y for rows [n0, n1): tile dots in blocks of MBI x NBI (rows past the end
 * run on copies of the last one and are not stored), combined in C */
QUANT_CLONES static void ikernel(const nb_quant__mm *p, const uint8_t *xq, const float *xs, tile_dots_fn dots1, tile_dots_fn dots4,
                    int64_t n0, int64_t n1) {
  const int64_t K = p->l.k, T = nb_quant_num_tiles(&p->l), N = p->l.n;
  for (int64_t n = n0; n < n1; n += NBI)
    for (int64_t m = 0; m < p->m; m += MBI) {
      int mb = p->m - m == 1 ? 1 : MBI;
      float y[MBI][NBI] = {{0}};
      for (int64_t t = 0; t < T; t++) {
        int64_t k0 = t * p->l.tile, len = K - k0 < p->l.tile ? K - k0 : p->l.tile;
        const uint8_t *xr[MBI], *wr[NBI];
        for (int i = 0; i < MBI; i++) xr[i] = xq + (m + i < p->m ? m + i : p->m - 1) * K + k0;
        for (int j = 0; j < NBI; j++) wr[j] = p->values + (n + j < n1 ? n + j : n1 - 1) * K + k0;
        int32_t r[MBI * NBI];
        (mb == 1 ? dots1 : dots4)(xr, wr, len, r);
        for (int i = 0; i < mb && m + i < p->m; i++)
          for (int j = 0; j < NBI && n + j < n1; j++) y[i][j] = __builtin_fmaf((float)r[i * NBI + j], p->scales[(n + j) * T + t] * xs[m + i], y[i][j]);
      }
      for (int i = 0; i < mb && m + i < p->m; i++)
        for (int j = 0; j < NBI && n + j < n1; j++) p->y[(m + i) * N + n + j] = y[i][j];
    }
}

/* ---------------------------------------------------------------- W8A8 per block (int8_block) */

/* x quantized per 32-element block (llama.cpp's Q8_0 activations, with an
 * f32 scale): each block by quantize_row_i8, so its scale is max |block| /
 * 127 and its codes round half to even. Rows are padded with zero codes to
 * whole blocks. For int4 weights, held as u8 codes c = w + 8, the kernels
 * take sum c x - 8 sum x: corr holds 8 x each lane's sum of 4 codes. */
typedef struct xblocks {
  int64_t nb; /* blocks per row: ceil(k / 32) */
  int8_t *q;  /* [m][nb * 32] */
  float *s;   /* [m][nb] */
  int32_t *corr; /* [m][nb][8], int4 weights only */
  int32_t *tile_of; /* [nb][2]: the weight tile of lanes 0-3 and of lanes 4-7 of block b */
  bool split;    /* some block's halves lie in two tiles (tiles of 16, 48, ...): a scale per half */
} xblocks;

enum { QB = NB_QUANT__ACT_BLOCK, QL = 8 /* lanes of 4 codes per block */, QH = QB / 2 /* codes per half block */ };

/* The weight tile of half h of block b (lanes 4h .. 4h + 3, k from 32 b +
 * 16 h): tiles are multiples of 16, so a half lies in one tile; a half
 * wholly past k (its lanes 0) takes the last tile, as does the rest of a
 * per-channel row. Tiles of a multiple of 32 give both halves one tile. */
static int32_t half_tile(const nb_quant_layout *l, int64_t b, int h) {
  int64_t t = (b * QB + h * QH) / l->tile, last = nb_quant_num_tiles(l) - 1;
  return (int32_t)(t < last ? t : last);
}

/* The 8 lanes summed as ((l_i + l_{i+4}) + (.. i+2)) + (.. i+1): what
 * reduce8_256 does. */
static inline float reduce8(const float *l) {
  float a[4], c[2];
  for (int i = 0; i < 4; i++) a[i] = l[i] + l[i + 4];
  for (int i = 0; i < 2; i++) c[i] = a[i] + a[i + 2];
  return c[0] + c[1];
}

/* The definition, one output at a time: lane j of block b is the exact
 * integer sum of the 4 products at k = 32 b + 4 j ... + 3 (codes past k
 * are 0); acc_j = fma((float)lane, s_w(tile of lane j) * s_x(b), acc_j) in
 * order of b (half_tile: lanes 0-3 and 4-7 of a block may lie in two
 * tiles of 16); y = reduce8(acc). Every vector kernel computes the same
 * lanes (8 int32 lanes of a 256-bit vpdpbusd / vpmaddubsw + vpmaddwd are
 * exactly these) and the same chain, so all give these bits. */
static void bkernel_c(const nb_quant__mm *p, const xblocks *xb, int64_t n0, int64_t n1) {
  const int64_t K = p->l.k, T = nb_quant_num_tiles(&p->l), rb = nb_quant__row_bytes(&p->l), B = xb->nb;
  const bool i4 = p->l.qtype == NB_QUANT_INT4;
  for (int64_t n = n0; n < n1; n++) {
    const uint8_t *row = p->values + n * rb;
    const float *sr = p->scales + n * T;
    for (int64_t m = 0; m < p->m; m++) {
      const int8_t *xq = xb->q + m * B * QB;
      const float *xs = xb->s + m * B;
      float acc[QL] = {0};
      for (int64_t b = 0; b < B; b++) {
        float d[2] = {sr[xb->tile_of[2 * b]] * xs[b], sr[xb->tile_of[2 * b + 1]] * xs[b]};
        for (int j = 0; j < QL; j++) {
          int32_t lane = 0;
          for (int64_t k = b * QB + 4 * j; k < b * QB + 4 * j + 4 && k < K; k++)
            lane += (i4 ? ((row[k / 2] >> (4 * (k % 2))) & 15) - 8 : (int8_t)row[k]) * xq[k];
          acc[j] = fmaf((float)lane, d[j / 4], acc[j]);
        }
      }
      p->y[m * p->l.n + n] = reduce8(acc);
    }
  }
}

#ifdef QUANT_X86
NB_TARGET_BEGIN("avx2,fma")
static inline float reduce8_256(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 c = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
/* 16 bytes of int4 codes -> 32 bytes, one code each, in the order of k
 * (a2_nibble_bytes on a whole block) */
static inline __m256i nibbles32(const uint8_t *p) {
  __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
  return _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16(w, 4)), _mm256_set1_epi8(0x0f));
}
NB_TARGET_END

/* One block for NBI rows of W (w[j]: the block's codes of row j), one row
 * of x: int8 codes by the sign trick (|w| as u8 times x with w's sign),
 * int4 codes as u8 (c <= 15: vpmaddubsw's pairs cannot saturate) less the
 * block's corr. ACC(acc, u8, s8) adds the 4-code lane sums. Lanes 0-3
 * take tile t01[0]'s scale, lanes 4-7 tile t01[1]'s: one broadcast product
 * when the layout never splits a block, else a vector of the two (the
 * same f32 products lane by lane). */
#define BLOCKS_256(SFX, TARGET, ACC)                                                                                          \
  __attribute__((target(TARGET), always_inline)) static inline void bstep_##SFX(                                           \
      const uint8_t *const *w, __m256i xv, __m256i corr, float sx, const float *const *sr, const int32_t *t01, __m256 *acc, \
      const bool i4, const bool split, int64_t ahead) {                                                                     \
    _Pragma("GCC unroll 8")                                                                                              \
    for (int j = 0; j < NBI; j++) {                                                                                         \
      _mm_prefetch((const char *)w[j] + ahead, _MM_HINT_T0); /* the next rows' block: rows are short streams */          \
      __m256i lanes;                                                                                                        \
      if (i4) {                                                                                                             \
        lanes = _mm256_sub_epi32(ACC(_mm256_setzero_si256(), nibbles32(w[j]), xv), corr);                                 \
      } else {                                                                                                              \
        __m256i wv = _mm256_loadu_si256((const __m256i *)w[j]);                                                            \
        lanes = ACC(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));                           \
      }                                                                                                                     \
      __m256 d = split ? _mm256_mul_ps(_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(sr[j] + t01[0])),      \
                                                            _mm_broadcast_ss(sr[j] + t01[1]), 1),                            \
                                       _mm256_set1_ps(sx))                                                                 \
                       : _mm256_set1_ps(sr[j][t01[0]] * sx);                                                               \
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), d, acc[j]);                                                       \
    }                                                                                                                       \
  }                                                                                                                         \
  __attribute__((target(TARGET), always_inline)) static inline void bkernel_##SFX##_body(                                  \
      const nb_quant__mm *p, const xblocks *xb, int64_t n0, int64_t n1, const bool i4, const bool split) {                  \
    const int64_t K = p->l.k, T = nb_quant_num_tiles(&p->l), rb = nb_quant__row_bytes(&p->l), B = xb->nb, N = p->l.n;      \
    const int64_t full = K / QB, wstep = i4 ? QB / 2 : QB;                                                                  \
    for (int64_t n = n0; n < n1; n += NBI) {                                                                                \
      const uint8_t *wr[NBI];                                                                                               \
      const float *sr[NBI];                                                                                                 \
      for (int j = 0; j < NBI; j++) {                                                                                       \
        int64_t r = n + j < n1 ? n + j : n1 - 1; /* past the end: the last row again, not stored */                       \
        wr[j] = p->values + r * rb, sr[j] = p->scales + r * T;                                                             \
      }                                                                                                                     \
      for (int64_t m = 0; m < p->m; m++) {                                                                                  \
        const int8_t *xq = xb->q + m * B * QB;                                                                              \
        const float *xs = xb->s + m * B;                                                                                    \
        const int32_t *xc = i4 ? xb->corr + m * B * QL : NULL;                                                              \
        __m256 acc[NBI];                                                                                                    \
        for (int j = 0; j < NBI; j++) acc[j] = _mm256_setzero_ps();                                                         \
        for (int64_t b = 0; b < full; b++) {                                                                                \
          const uint8_t *w[NBI];                                                                                            \
          for (int j = 0; j < NBI; j++) w[j] = wr[j] + b * wstep;                                                           \
          __m256i corr = i4 ? _mm256_loadu_si256((const __m256i *)(xc + b * QL)) : _mm256_setzero_si256();                 \
          bstep_##SFX(w, _mm256_loadu_si256((const __m256i *)(xq + b * QB)), corr, xs[b], sr, xb->tile_of + 2 * b, acc, i4, \
                      split, NBI * rb);                                                                                     \
        }                                                                                                                   \
        if (full < B) { /* the ragged last block, from zero-padded copies */                                               \
          uint8_t tmp[NBI][QB];                                                                                             \
          const uint8_t *w[NBI];                                                                                            \
          for (int j = 0; j < NBI; j++) {                                                                                   \
            memset(tmp[j], 0, QB), memcpy(tmp[j], wr[j] + full * wstep, (size_t)(rb - full * wstep));                      \
            w[j] = tmp[j];                                                                                                  \
          }                                                                                                                 \
          __m256i corr = i4 ? _mm256_loadu_si256((const __m256i *)(xc + full * QL)) : _mm256_setzero_si256();              \
          bstep_##SFX(w, _mm256_loadu_si256((const __m256i *)(xq + full * QB)), corr, xs[full], sr, xb->tile_of + 2 * full,  \
                      acc, i4, split, 0);                                                                                   \
        }                                                                                                                   \
        for (int j = 0; j < NBI && n + j < n1; j++) p->y[m * N + n + j] = reduce8_256(acc[j]);                              \
      }                                                                                                                     \
    }                                                                                                                       \
  }                                                                                                                         \
  __attribute__((target(TARGET))) static void bkernel_##SFX(const nb_quant__mm *p, const xblocks *xb, int64_t n0, int64_t n1) { \
    bool i4 = p->l.qtype == NB_QUANT_INT4;                                                                                  \
    if (xb->split) i4 ? bkernel_##SFX##_body(p, xb, n0, n1, true, true) : bkernel_##SFX##_body(p, xb, n0, n1, false, true); \
    else i4 ? bkernel_##SFX##_body(p, xb, n0, n1, true, false) : bkernel_##SFX##_body(p, xb, n0, n1, false, false);         \
  }
BLOCKS_256(avx2, "avx2,fma", madd_avx2)
BLOCKS_256(avxvnni, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32)
BLOCKS_256(avx512vnni, "avx2,fma,avx512f,avx512vl,avx512vnni", _mm256_dpbusd_epi32)
#endif /* QUANT_X86 */

typedef void (*bkernel_fn)(const nb_quant__mm *p, const xblocks *xb, int64_t n0, int64_t n1);

static void xblocks_free(xblocks *xb) { free(xb->q), free(xb->s), free(xb->corr), free(xb->tile_of); }

static nb_status quantize_blocks(nb_ctx *ctx, const nb_quant__mm *p, xblocks *xb) {
  const int64_t K = p->l.k, B = (K + QB - 1) / QB, M = p->m;
  *xb = (xblocks){.nb = B, .q = calloc((size_t)(M * B), QB), .s = malloc(sizeof(float) * (size_t)(M * B)),
                  .tile_of = malloc(sizeof(int32_t) * 2 * (size_t)B), .split = p->l.tile < K && p->l.tile % QB};
  if (p->l.qtype == NB_QUANT_INT4) xb->corr = malloc(sizeof(int32_t) * QL * (size_t)(M * B));
  if (!xb->q || !xb->s || !xb->tile_of || (p->l.qtype == NB_QUANT_INT4 && !xb->corr)) {
    xblocks_free(xb);
    return nb_errorf(ctx, NB_ERR_NOMEM, "quant.matmul: out of memory for %lld quantized activations", (long long)(M * K));
  }
  for (int64_t b = 0; b < B; b++) xb->tile_of[2 * b] = half_tile(&p->l, b, 0), xb->tile_of[2 * b + 1] = half_tile(&p->l, b, 1);
  for (int64_t m = 0; m < M; m++)
    for (int64_t b = 0; b < B; b++) {
      int64_t len = K - b * QB < QB ? K - b * QB : QB;
      int8_t *q = xb->q + (m * B + b) * QB;
      xb->s[m * B + b] = quantize_row_i8(p->x + m * K + b * QB, len, q);
      if (xb->corr)
        for (int j = 0; j < QL; j++) xb->corr[(m * B + b) * QL + j] = 8 * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
    }
  return NB_OK;
}

/* ---------------------------------------------------------------- dispatch */

#ifdef QUANT_X86
/* F16C and AVX-VNNI from cpuid: clang 14's __builtin_cpu_supports knows
 * neither name. Leaf 1 ECX bit 29; leaf 7 subleaf 1 EAX bit 4. */
static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
  unsigned r[4];
  return __get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]) && (r[reg] >> bit & 1);
}
static bool has_f16c(void) { return cpuid_bit(1, 0, 2, 29); }
static bool has_avxvnni(void) { return cpuid_bit(7, 1, 0, 4); }
#endif

static bool cpu_has(const char *f) {
#ifdef QUANT_X86
  __builtin_cpu_init();
  if (strcmp(f, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  if (strcmp(f, "avxvnni") == 0) return __builtin_cpu_supports("avx2") && has_avxvnni();
  if (strcmp(f, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma") && has_f16c();
  if (strcmp(f, "avx512vnni") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#endif
  (void)f;
  return false;
}

static const char *const fisa_names[NB_QUANT__F_COUNT] = {"c", "avx2", "avx512"};
static const char *const iisa_names[NB_QUANT__I_COUNT] = {"c", "avx2", "avxvnni", "avx512vnni"};
const char *nb_quant__fisa_name(nb_quant__fisa f) { return (unsigned)f < NB_QUANT__F_COUNT ? fisa_names[f] : "?"; }
const char *nb_quant__iisa_name(nb_quant__iisa i) { return (unsigned)i < NB_QUANT__I_COUNT ? iisa_names[i] : "?"; }
bool nb_quant__fisa_supported(nb_quant__fisa f) { return f == NB_QUANT__F_C || ((unsigned)f < NB_QUANT__F_COUNT && cpu_has(fisa_names[f])); }
bool nb_quant__iisa_supported(nb_quant__iisa i) { return i == NB_QUANT__I_C || ((unsigned)i < NB_QUANT__I_COUNT && cpu_has(iisa_names[i])); }

static _Atomic int forced_f = -1, forced_i = -1;

/* The best kernels, at most $NABLA_QUANT_ISA's level (c, avx2, avxvnni). */
static void best_isa(nb_quant__fisa *f, nb_quant__iisa *i) {
  const char *cap = getenv("NABLA_QUANT_ISA");
  int level = !cap ? 3 : strcmp(cap, "c") == 0 ? 0 : strcmp(cap, "avx2") == 0 ? 1 : strcmp(cap, "avxvnni") == 0 ? 2 : 3;
  *f = NB_QUANT__F_C, *i = NB_QUANT__I_C;
  for (int k = NB_QUANT__F_COUNT - 1; k > 0; k--)
    if (k <= (level >= 2 ? level - 1 : level) && nb_quant__fisa_supported((nb_quant__fisa)k)) {
      *f = (nb_quant__fisa)k;
      break;
    }
  for (int k = NB_QUANT__I_COUNT - 1; k > 0; k--)
    if (k <= level && nb_quant__iisa_supported((nb_quant__iisa)k)) {
      *i = (nb_quant__iisa)k;
      break;
    }
}

bool nb_quant__force_isa(int f, int i) {
  if ((f >= 0 && !nb_quant__fisa_supported((nb_quant__fisa)f)) || (i >= 0 && !nb_quant__iisa_supported((nb_quant__iisa)i))) return false;
  forced_f = f;
  forced_i = i;
  return true;
}

void nb_quant__current_isa(nb_quant__fisa *f, nb_quant__iisa *i) {
  static _Atomic int best = -1; /* f * 16 + i, found once */
  int b = best;
  if (b < 0) {
    best_isa(f, i);
    best = b = (int)*f * 16 + (int)*i;
  }
  *f = (nb_quant__fisa)(b / 16), *i = (nb_quant__iisa)(b % 16);
  if (forced_f >= 0) *f = (nb_quant__fisa)forced_f;
  if (forced_i >= 0) *i = (nb_quant__iisa)forced_i;
}

/* ---------------------------------------------------------------- threads */

typedef struct job {
  const nb_quant__mm *p;
  int64_t chunk;
  nb_quant__fisa f;
  const uint8_t *xq; /* W8A8 */
  const float *xs;
  tile_dots_fn dots1, dots4;
  const xblocks *xb; /* W8A8 per block */
  bkernel_fn bk;
} job;

static void run_chunk(void *arg, int i) {
  const job *j = arg;
  int64_t n0 = (int64_t)i * j->chunk, n1 = n0 + j->chunk < j->p->l.n ? n0 + j->chunk : j->p->l.n;
  if (n0 >= n1) return;
  if (j->xb) {
    j->bk(j->p, j->xb, n0, n1);
    return;
  }
  if (j->xq) {
    ikernel(j->p, j->xq, j->xs, j->dots1, j->dots4, n0, n1);
    return;
  }
  switch (j->f) {
#ifdef QUANT_X86
  case NB_QUANT__F_AVX512: fkernel_avx512(j->p, n0, n1); break;
  case NB_QUANT__F_AVX2: fkernel_avx2(j->p, n0, n1); break;
#endif
  default: fkernel_c(j->p, n0, n1); break;
  }
}

nb_status nb_quant__matmul(nb_ctx *ctx, const nb_quant__mm *p) {
  nb_quant__fisa f;
  nb_quant__iisa isa;
  nb_quant__current_isa(&f, &isa);
  job j = {.p = p, .f = f, .dots1 = dots_c_1, .dots4 = dots_c_4, .bk = bkernel_c};
  uint8_t *xq = NULL;
  float *xs = NULL;
  xblocks xb = {0};
  if (p->act == NB_QUANT_ACT_INT8_BLOCK) {
    nb_status st = quantize_blocks(ctx, p, &xb);
    if (st != NB_OK) return st;
#ifdef QUANT_X86
    j.bk = isa == NB_QUANT__I_AVX512VNNI ? bkernel_avx512vnni : isa == NB_QUANT__I_AVXVNNI ? bkernel_avxvnni
         : isa == NB_QUANT__I_AVX2       ? bkernel_avx2       : bkernel_c;
#endif
    j.xb = &xb;
  }
  if (p->act == NB_QUANT_ACT_INT8_DYNAMIC || p->act == NB_QUANT_ACT_INT8_STATIC) {
    xq = malloc((size_t)(p->m * p->l.k)), xs = malloc(sizeof(float) * (size_t)p->m);
    if (!xq || !xs) {
      free(xq), free(xs);
      return nb_errorf(ctx, NB_ERR_NOMEM, "quant.matmul: out of memory for %lld quantized activations", (long long)(p->m * p->l.k));
    }
    for (int64_t m = 0; m < p->m; m++)
      xs[m] = p->act == NB_QUANT_ACT_INT8_STATIC ? quantize_row_i8_static(p->x + m * p->l.k, p->l.k, p->act_scale, (int8_t *)xq + m * p->l.k)
                                                  : quantize_row_i8(p->x + m * p->l.k, p->l.k, (int8_t *)xq + m * p->l.k);
#ifdef QUANT_X86
    if (isa == NB_QUANT__I_AVX512VNNI) {
      for (int64_t e = 0; e < p->m * p->l.k; e++) xq[e] ^= 0x80; /* code + 128 as u8 */
      j.dots1 = dots_avx512vnni_1, j.dots4 = dots_avx512vnni_4;
    } else if (isa == NB_QUANT__I_AVXVNNI) {
      j.dots1 = dots_avxvnni_1, j.dots4 = dots_avxvnni_4;
    } else if (isa == NB_QUANT__I_AVX2) {
      j.dots1 = dots_avx2_1, j.dots4 = dots_avx2_4;
    }
#endif
    j.xq = xq, j.xs = xs;
  }
  /* chunks of whole register blocks, a few per thread for balance */
  int threads = nb_jit_parallel_threads();
  int64_t N = p->l.n, want = threads <= 1 ? 1 : 4 * (int64_t)threads;
  int64_t chunk = (N + want - 1) / want;
  chunk = (chunk + 15) / 16 * 16;
  j.chunk = chunk;
  nb_jit_parallel_for((int)((N + chunk - 1) / chunk), run_chunk, &j);
  free(xq), free(xs);
  xblocks_free(&xb);
  return NB_OK;
}
