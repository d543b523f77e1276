/* GGUF, ggml's model file format (ggml docs/gguf.md), read and written.
 *
 * A file is: "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata
 * count; the metadata (key: u64 length + bytes; u32 value type; the value,
 * arrays as u32 element type + u64 count + elements); the tensor infos
 * (name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset relative to
 * the data section); padding to general.alignment (default 32); the data.
 * All little-endian.
 *
 * The reader maps the file and never trusts it: every count is bounded by
 * the bytes left (each element needs at least its minimal encoding), every
 * length, dim product, size and offset is checked before use with
 * overflow-free arithmetic, and tensors must lie inside the data section
 * without overlapping. Messages name the file, the field and the key or
 * tensor. The block codecs follow ggml's reference quantizers (ggml-quants.c
 * quantize_row_*_ref / dequantize_row_*), bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/internal.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_DEPTH 8 /* nested arrays */
#define GGUF_MAX_ITEMS (1 << 24) /* strings or arrays in one array */
#define QK_K 256

/* ---- the type table -------------------------------------------------------------- */

typedef struct type_info {
  const char *name;
  int64_t block, bytes;
} type_info;

/* ggml's GGML_QUANT_SIZES */
static const type_info types[NB_GGUF_TYPE_LIMIT] = {
    [0] = {"F32", 1, 4},          [1] = {"F16", 1, 2},           [2] = {"Q4_0", 32, 18},       [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},       [7] = {"Q5_1", 32, 24},        [8] = {"Q8_0", 32, 34},       [9] = {"Q8_1", 32, 40},
    [10] = {"Q2_K", 256, 84},     [11] = {"Q3_K", 256, 110},     [12] = {"Q4_K", 256, 144},    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},    [15] = {"Q8_K", 256, 292},     [16] = {"IQ2_XXS", 256, 66},  [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},  [19] = {"IQ1_S", 256, 50},     [20] = {"IQ4_NL", 32, 18},    [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},    [23] = {"IQ4_XS", 256, 136},   [24] = {"I8", 1, 1},          [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},         [27] = {"I64", 1, 8},          [28] = {"F64", 1, 8},         [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},        [34] = {"TQ1_0", 256, 54},     [35] = {"TQ2_0", 256, 66},    [39] = {"MXFP4", 32, 17},
};

static const type_info *type_of(uint32_t t) { return t < NB_GGUF_TYPE_LIMIT && types[t].name ? &types[t] : NULL; }

const char *nb_gguf_type_name(nb_gguf_type t) {
  const type_info *ti = type_of((uint32_t)t);
  return ti ? ti->name : NULL;
}

bool nb_gguf_type_block(nb_gguf_type t, int64_t *block_elems, int64_t *block_bytes) {
  const type_info *ti = type_of((uint32_t)t);
  if (!ti) return false;
  if (block_elems) *block_elems = ti->block;
  if (block_bytes) *block_bytes = ti->bytes;
  return true;
}

bool nb_gguf_can_decode(nb_gguf_type t) {
  return t == NB_GGUF_F32 || t == NB_GGUF_F16 || t == NB_GGUF_BF16 || t == NB_GGUF_Q8_0 || t == NB_GGUF_Q4_0 ||
         t == NB_GGUF_Q4_K || t == NB_GGUF_Q6_K;
}

bool nb_gguf_can_encode(nb_gguf_type t) {
  return t == NB_GGUF_F32 || t == NB_GGUF_F16 || t == NB_GGUF_BF16 || t == NB_GGUF_Q8_0 || t == NB_GGUF_Q4_0 || t == NB_GGUF_Q4_K ||
         t == NB_GGUF_Q6_K;
}

/* ---- block codecs ------------------------------------------------------------------ */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* ggml_compute_fp32_to_bf16: NaNs quieted, round to nearest even */
static uint16_t f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static void dec_q8_0(const uint8_t *b, float *y) {
  float d = nb_f16_to_f32(rd16(b));
  for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dec_q4_0(const uint8_t *b, float *y) {
  float d = nb_f16_to_f32(rd16(b));
  for (int j = 0; j < 16; j++) {
    y[j] = (float)((b[2 + j] & 0x0F) - 8) * d;
    y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
  }
}

/* the 6-bit scale and min of sub-block j of a Q4_K block (get_scale_min_k4) */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* block_q4_K: f16 d, f16 dmin, scales[12], qs[128] */
static void dec_q4_k(const uint8_t *b, float *y) {
  float d = nb_f16_to_f32(rd16(b)), dmin = nb_f16_to_f32(rd16(b + 2));
  const uint8_t *scales = b + 4, *q = b + 16;
  for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; l++) y[j + l] = d1 * (float)(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
  }
}

/* block_q6_K: ql[128], qh[64], int8 scales[16], f16 d */
static void dec_q6_k(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = nb_f16_to_f32(rd16(b + 208));
  for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * (float)q1;
      y[l + 32] = d * sc[is + 2] * (float)q2;
      y[l + 64] = d * sc[is + 4] * (float)q3;
      y[l + 96] = d * sc[is + 6] * (float)q4;
    }
}

/* quantize_row_q8_0_ref */
static void enc_q8_0(const float *x, uint8_t *b) {
  float amax = 0;
  for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
  float d = amax / 127, id = d ? 1.0f / d : 0.0f;
  wr16(b, nb_f32_to_f16(d));
  for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* quantize_row_q4_0_ref: the scale maps the value of largest magnitude
 * (first on ties, sign kept) to -8 */
static void enc_q4_0(const float *x, uint8_t *b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; j++)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  float d = max / -8, id = d ? 1.0f / d : 0.0f;
  wr16(b, nb_f32_to_f16(d));
  for (int j = 0; j < 16; j++) {
    int a = (int)(int8_t)(x[j] * id + 8.5f), c = (int)(int8_t)(x[j + 16] * id + 8.5f);
    b[2 + j] = (uint8_t)((a < 15 ? a : 15) | (c < 15 ? c : 15) << 4);
  }
}

/* ggml's nearest_int: round half to even through the float adder (valid
 * for |x| < 2^22) */
static int nearest(float x) {
  float v = x + 12582912.f;
  int32_t i;
  memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int hi) { return v < 0 ? 0 : v > hi ? hi : v; }

/* A 4-bit scale and min for 32 values: ggml's make_qkx2_quants with its
 * Q4_K arguments (weights av_x + |x|, squared error, rmin -1, rdelta 0.1,
 * 20 steps): start from the min/max grid, then try 21 stretched grids and
 * keep the least-squares (scale, min) of the one with the least weighted
 * error. Float operations in ggml's order, so the bytes match. Returns the
 * scale; *neg_min = -min (>= 0). */
static float fit_scale_min(const float *x, const float *w, uint8_t *L, float *neg_min) {
  enum { N = 32, NMAX = 15, NSTEP = 20 };
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < N; i++) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    memset(L, 0, N);
    *neg_min = -lo;
    return 0;
  }
  float iscale = NMAX / (hi - lo), scale = 1 / iscale, best = 0;
  for (int i = 0; i < N; i++) {
    L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - lo)), NMAX);
    float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t aux[N];
  for (int step = 0; step <= NSTEP; step++) {
    iscale = (-1.f + 0.1f * step + NMAX) / (hi - lo);
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < N; i++) {
      int l = clampi(nearest(iscale * (x[i] - lo)), NMAX);
      aux[i] = (uint8_t)l;
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    float D = sum_w * sl2 - sl * sl;
    if (!(D > 0)) continue;
    float sc = (sum_w * sxl - sum_x * sl) / D, mn = (sl2 * sum_x - sl * sxl) / D;
    if (mn > 0) mn = 0, sc = sxl / sl2;
    float err = 0;
    for (int i = 0; i < N; i++) {
      float diff = sc * aux[i] + mn - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) memcpy(L, aux, N), best = err, scale = sc, lo = mn;
  }
  *neg_min = -lo;
  return scale;
}

/* quantize_row_q4_K_ref: 8 sub-blocks' scales and mins fitted, then
 * themselves quantized to 6 bits against the block's f16 d and dmin, and
 * the values requantized with the rounded scales */
static void enc_q4_k(const float *x, uint8_t *b) {
  uint8_t L[QK_K], *scales = b + 4, *qs = b + 16;
  float sc[8], mn[8], w[32], max_sc = 0, max_mn = 0;
  for (int j = 0; j < 8; j++) {
    const float *xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
    float av = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; l++) w[l] = av + fabsf(xj[l]);
    sc[j] = fit_scale_min(xj, w, L + 32 * j, &mn[j]);
    if (sc[j] > max_sc) max_sc = sc[j];
    if (mn[j] > max_mn) max_mn = mn[j];
  }
  float inv_sc = max_sc > 0 ? 63.f / max_sc : 0.f, inv_mn = max_mn > 0 ? 63.f / max_mn : 0.f;
  memset(scales, 0, 12);
  for (int j = 0; j < 8; j++) {
    uint8_t ls = (uint8_t)nearest(inv_sc * sc[j]), lm = (uint8_t)nearest(inv_mn * mn[j]);
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      scales[j] = ls;
      scales[j + 4] = lm;
    } else { /* low 4 bits in bytes 8..11, high 2 bits on top of bytes 0..7 */
      scales[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
      scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
      scales[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  wr16(b, nb_f32_to_f16(max_sc / 63.f));
  wr16(b + 2, nb_f32_to_f16(max_mn / 63.f));
  float d_all = nb_f16_to_f32(rd16(b)), dmin_all = nb_f16_to_f32(rd16(b + 2));
  for (int j = 0; j < 8; j++) {
    uint8_t s6, m6;
    scale_min_k4(j, scales, &s6, &m6);
    float d = d_all * s6;
    if (!d) continue;
    float dm = dmin_all * m6;
    for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)clampi(nearest((x[32 * j + i] + dm) / d), 15);
  }
  for (int j = 0; j < QK_K; j += 64, qs += 32)
    for (int l = 0; l < 32; l++) qs[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

/* A signed scale for n values on the grid [-nmax, nmax - 1]: ggml's
 * make_qx_quants with Q6_K's arguments (weights x^2): start from the
 * largest magnitude mapped to -nmax, keep the least-squares scale, and try
 * 18 stretched grids for a better one. *L gets level + nmax. */
static float fit_signed(const float *x, int n, int nmax, int8_t *L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++)
    if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
  if (amax < 1e-15f) { /* ggml's GROUP_MAX_EPS: all zero */
    memset(L, 0, (size_t)n);
    return 0;
  }
  float iscale = -nmax / max, sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = nearest(iscale * x[i]);
    l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int step = -9; step <= 9; step++) {
    if (!step) continue;
    iscale = -(nmax + 0.1f * step) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = nearest(iscale * x[i]);
      l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++) {
        int l = nearest(iscale * x[i]);
        L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* quantize_row_q6_K_ref: 16 sub-blocks of 16 fitted, their scales
 * quantized to int8 against the block's f16 d (the largest-magnitude scale
 * maps to -128), the values requantized to 6 bits with them; low 4 bits in
 * ql, high 2 in qh */
static void enc_q6_k(const float *x, uint8_t *b) {
  int8_t L[QK_K];
  float sc[16], max_sc = 0, max_abs = 0;
  uint8_t *ql = b, *qh = b + 128;
  int8_t *scales = (int8_t *)(b + 192);
  for (int j = 0; j < 16; j++) {
    sc[j] = fit_signed(x + 16 * j, 16, 32, L + 16 * j);
    if (fabsf(sc[j]) > max_abs) max_abs = fabsf(sc[j]), max_sc = sc[j];
  }
  memset(b, 0, 210);
  if (max_abs < 1e-15f) return; /* d = 0 */
  float iscale = -128.f / max_sc;
  wr16(b + 208, nb_f32_to_f16(1 / iscale));
  for (int j = 0; j < 16; j++) {
    int q = nearest(iscale * sc[j]);
    scales[j] = (int8_t)(q < 127 ? q : 127);
  }
  float d_all = nb_f16_to_f32(rd16(b + 208));
  for (int j = 0; j < 16; j++) {
    float d = d_all * scales[j];
    if (!d) continue;
    for (int i = 0; i < 16; i++) {
      int l = nearest(x[16 * j + i] / d);
      L[16 * j + i] = (int8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
    }
  }
  for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; l++) {
      const int8_t *q = L + j + l;
      ql[l] = (uint8_t)((q[0] & 0xF) | (q[64] & 0xF) << 4);
      ql[l + 32] = (uint8_t)((q[32] & 0xF) | (q[96] & 0xF) << 4);
      qh[l] = (uint8_t)((q[0] >> 4) | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
    }
}

static nb_status codec_check(nb_ctx *ctx, nb_gguf_type t, int64_t n, bool encode) {
  const type_info *ti = type_of((uint32_t)t);
  if (!ti || !(encode ? nb_gguf_can_encode(t) : nb_gguf_can_decode(t)))
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "gguf: %s %s tensors is not supported", encode ? "encoding" : "decoding",
                     ti ? ti->name : "unknown-type");
  if (n < 0 || n % ti->block)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf: %s: %lld elements is not a multiple of the block size %lld", ti->name,
                     (long long)n, (long long)ti->block);
  return NB_OK;
}

nb_status nb_gguf_decode(nb_ctx *ctx, nb_gguf_type t, const void *src, float *dst, int64_t n) {
  nb_status s = codec_check(ctx, t, n, false);
  if (s) return s;
  const uint8_t *p = src;
  switch (t) {
  case NB_GGUF_F32: memcpy(dst, src, (size_t)n * 4); break;
  case NB_GGUF_F16: for (int64_t i = 0; i < n; i++) dst[i] = nb_f16_to_f32(rd16(p + 2 * i)); break;
  case NB_GGUF_BF16: for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(rd16(p + 2 * i)); break;
  case NB_GGUF_Q8_0: for (int64_t i = 0; i < n / 32; i++) dec_q8_0(p + 34 * i, dst + 32 * i); break;
  case NB_GGUF_Q4_0: for (int64_t i = 0; i < n / 32; i++) dec_q4_0(p + 18 * i, dst + 32 * i); break;
  case NB_GGUF_Q4_K: for (int64_t i = 0; i < n / QK_K; i++) dec_q4_k(p + 144 * i, dst + QK_K * i); break;
  case NB_GGUF_Q6_K: for (int64_t i = 0; i < n / QK_K; i++) dec_q6_k(p + 210 * i, dst + QK_K * i); break;
  default: break;
  }
  return NB_OK;
}

nb_status nb_gguf_encode(nb_ctx *ctx, nb_gguf_type t, const float *src, void *dst, int64_t n) {
  nb_status s = codec_check(ctx, t, n, true);
  if (s) return s;
  /* a block scale cannot hold NaN or infinity (and converting them to
   * integer levels is undefined) */
  for (int64_t i = 0; t != NB_GGUF_F32 && t != NB_GGUF_F16 && t != NB_GGUF_BF16 && i < n; i++)
    if (!isfinite(src[i]))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf: %s: element %lld is %g; quantized blocks hold finite values only",
                       nb_gguf_type_name(t), (long long)i, (double)src[i]);
  uint8_t *p = dst;
  switch (t) {
  case NB_GGUF_F32: memcpy(dst, src, (size_t)n * 4); break;
  case NB_GGUF_F16: for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, nb_f32_to_f16(src[i])); break;
  case NB_GGUF_BF16: for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, f32_to_bf16(src[i])); break;
  case NB_GGUF_Q8_0: for (int64_t i = 0; i < n / 32; i++) enc_q8_0(src + 32 * i, p + 34 * i); break;
  case NB_GGUF_Q4_0: for (int64_t i = 0; i < n / 32; i++) enc_q4_0(src + 32 * i, p + 18 * i); break;
  case NB_GGUF_Q4_K: for (int64_t i = 0; i < n / QK_K; i++) enc_q4_k(src + QK_K * i, p + 144 * i); break;
  case NB_GGUF_Q6_K: for (int64_t i = 0; i < n / QK_K; i++) enc_q6_k(src + QK_K * i, p + 210 * i); break;
  default: break;
  }
  return NB_OK;
}

/* ---- the opened file ----------------------------------------------------------------- */

typedef struct kv {
  char *key;
  nb_gguf_value v;
} kv;

struct nb_gguf {
  nb_ctx *ctx;
  char *name;
  nb_ckpt__map *map;        /* NULL when parsing borrowed memory */
  const uint8_t *data;
  uint64_t size;
  uint32_t version;
  uint64_t alignment, data_offset;
  size_t n_kv, n_tensors;
  kv *kvs;
  nb_gguf_tensor *tensors;
  /* every allocation of nested values, to free them */
  void **allocs;
  size_t n_allocs, cap_allocs;
};

/* A cursor over the file; errors name the file and what is being read. */
typedef struct rd {
  nb_gguf *g;
  uint64_t pos;
  char what[320];           /* "key 'general.name'", "tensor 'x'", "header" */
} rd;

static nb_status bad(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static nb_status bad(rd *r, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nb_errorf(r->g->ctx, NB_ERR_FORMAT, "%s: %s: %s", r->g->name, r->what, msg);
}

static uint64_t left(const rd *r) { return r->g->size - r->pos; }

static nb_status need(rd *r, uint64_t n, const char *field) {
  if (n <= left(r)) return NB_OK;
  return bad(r, "truncated: %s needs %llu bytes at offset %llu (file size %llu)", field, (unsigned long long)n,
             (unsigned long long)r->pos, (unsigned long long)r->g->size);
}

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static nb_status get_u32(rd *r, const char *field, uint32_t *v) {
  if (need(r, 4, field)) return NB_ERR_FORMAT;
  *v = (uint32_t)le(r->g->data + r->pos, 4);
  r->pos += 4;
  return NB_OK;
}

static nb_status get_u64(rd *r, const char *field, uint64_t *v) {
  if (need(r, 8, field)) return NB_ERR_FORMAT;
  *v = le(r->g->data + r->pos, 8);
  r->pos += 8;
  return NB_OK;
}

static nb_status get_str(rd *r, const char *field, const char **s, uint64_t *len) {
  if (get_u64(r, field, len)) return NB_ERR_FORMAT;
  if (*len > left(r))
    return bad(r, "%s: length %llu exceeds the %llu bytes left in the file", field, (unsigned long long)*len,
               (unsigned long long)left(r));
  *s = (const char *)r->g->data + r->pos;
  r->pos += *len;
  return NB_OK;
}

static bool valid_utf8(const uint8_t *s, uint64_t n) {
  for (uint64_t i = 0; i < n;) {
    uint8_t c = s[i];
    int k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (k < 0 || (uint64_t)k >= n - i) return false;
    if (k == 0 && c == 0) return false; /* an embedded NUL would cut the name */
    for (int j = 1; j <= k; j++)
      if ((s[i + j] & 0xC0) != 0x80) return false;
    if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
        (c == 0xF4 && s[i + 1] > 0x8F))
      return false; /* overlong, surrogate, beyond U+10FFFF */
    i += (uint64_t)k + 1;
  }
  return true;
}

static char *dup_n(const char *s, uint64_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = 0;
  return d;
}

static const int scalar_size[NB_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const vtype_names[NB_GGUF_VTYPE_COUNT] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                                             "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};

/* a scalar's fields from its little-endian bytes */
static void set_scalar(nb_gguf_value *v, nb_gguf_vtype t, const uint8_t *p) {
  uint64_t u = le(p, scalar_size[t]);
  v->type = t;
  switch (t) {
  case NB_GGUF_INT8: v->i = (int8_t)u; break;
  case NB_GGUF_INT16: v->i = (int16_t)u; break;
  case NB_GGUF_INT32: v->i = (int32_t)u; break;
  case NB_GGUF_INT64: v->i = (int64_t)u; break;
  case NB_GGUF_FLOAT32: {
    uint32_t w = (uint32_t)u;
    float f;
    memcpy(&f, &w, 4);
    v->f = f;
    return;
  }
  case NB_GGUF_FLOAT64: memcpy(&v->f, &u, 8); return;
  default: v->u = u, v->i = u <= INT64_MAX ? (int64_t)u : INT64_MAX; break;
  }
  if (t == NB_GGUF_INT8 || t == NB_GGUF_INT16 || t == NB_GGUF_INT32 || t == NB_GGUF_INT64) v->u = v->i >= 0 ? (uint64_t)v->i : 0;
  v->f = t == NB_GGUF_INT8 || t == NB_GGUF_INT16 || t == NB_GGUF_INT32 || t == NB_GGUF_INT64 ? (double)v->i : (double)v->u;
}

static nb_status track(nb_gguf *g, void *p) {
  if (g->n_allocs == g->cap_allocs) {
    size_t cap = g->cap_allocs ? 2 * g->cap_allocs : 16;
    void **a = realloc(g->allocs, cap * sizeof *a);
    if (!a) return free(p), nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
    g->allocs = a, g->cap_allocs = cap;
  }
  g->allocs[g->n_allocs++] = p;
  return NB_OK;
}

static nb_status read_value(rd *r, nb_gguf_vtype t, nb_gguf_value *v, int depth);

static nb_status read_array(rd *r, nb_gguf_value *v, int depth) {
  uint32_t et;
  if (get_u32(r, "array element type", &et) || get_u64(r, "array length", &v->n)) return NB_ERR_FORMAT;
  if (et >= NB_GGUF_VTYPE_COUNT) return bad(r, "array element type %u is unknown (0..12)", et);
  if (et == NB_GGUF_ARRAY && depth >= GGUF_MAX_DEPTH) return bad(r, "arrays nested deeper than %d", GGUF_MAX_DEPTH);
  v->type = NB_GGUF_ARRAY;
  v->elem = (nb_gguf_vtype)et;
  /* the least bytes one element takes: a count is bounded by what is left */
  uint64_t min = et == NB_GGUF_STRING ? 8 : et == NB_GGUF_ARRAY ? 12 : (uint64_t)scalar_size[et];
  if (v->n > left(r) / min)
    return bad(r, "array length %llu of %s needs at least %llu bytes per element, beyond the file (%llu bytes left)",
               (unsigned long long)v->n, vtype_names[et], (unsigned long long)min, (unsigned long long)left(r));
  if (et != NB_GGUF_STRING && et != NB_GGUF_ARRAY) {
    v->raw = r->g->data + r->pos;
    r->pos += v->n * min;
    if (et == NB_GGUF_BOOL)
      for (uint64_t j = 0; j < v->n; j++)
        if (v->raw[j] > 1) return bad(r, "array element %llu is a BOOL of value %u (0 or 1)", (unsigned long long)j, v->raw[j]);
    return NB_OK;
  }
  /* each element is a value struct here (~11x a string's least size in
   * the file): a bound keeps a hostile file from asking for gigabytes
   * (vocabularies hold a few hundred thousand strings) */
  if (v->n > GGUF_MAX_ITEMS)
    return bad(r, "array of %llu %s values exceeds nabla's limit of %d", (unsigned long long)v->n, vtype_names[et], GGUF_MAX_ITEMS);
  nb_gguf_value *items = calloc(v->n ? v->n : 1, sizeof *items);
  if (!items || track(r->g, items)) return nb_errorf(r->g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  v->items = items;
  for (uint64_t j = 0; j < v->n; j++)
    if (read_value(r, (nb_gguf_vtype)et, &items[j], depth + 1)) return NB_ERR_FORMAT;
  return NB_OK;
}

static nb_status read_value(rd *r, nb_gguf_vtype t, nb_gguf_value *v, int depth) {
  if (t == NB_GGUF_STRING) {
    v->type = t;
    return get_str(r, "string value", &v->str, &v->len);
  }
  if (t == NB_GGUF_ARRAY) return read_array(r, v, depth);
  if (need(r, (uint64_t)scalar_size[t], vtype_names[t])) return NB_ERR_FORMAT;
  set_scalar(v, t, r->g->data + r->pos);
  if (t == NB_GGUF_BOOL && r->g->data[r->pos] > 1) return bad(r, "BOOL value is %u (0 or 1)", r->g->data[r->pos]);
  r->pos += (uint64_t)scalar_size[t];
  return NB_OK;
}

static nb_status read_kvs(rd *r, uint64_t n) {
  nb_gguf *g = r->g;
  if (n > left(r) / 13) /* key length 8 + one byte of key, type 4, a 1-byte value at least */
    return bad(r, "metadata count %llu is larger than the file could hold", (unsigned long long)n);
  g->kvs = calloc(n ? n : 1, sizeof *g->kvs);
  if (!g->kvs) return nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  for (uint64_t i = 0; i < n; i++) {
    snprintf(r->what, sizeof r->what, "metadata[%llu]", (unsigned long long)i);
    const char *k;
    uint64_t len;
    uint32_t t;
    if (get_str(r, "key", &k, &len)) return NB_ERR_FORMAT;
    if (len == 0 || !valid_utf8((const uint8_t *)k, len)) return bad(r, "key is %s", len ? "not valid UTF-8" : "empty");
    if (!(g->kvs[i].key = dup_n(k, len))) return nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
    g->n_kv = i + 1;
    snprintf(r->what, sizeof r->what, "key '%.200s'", g->kvs[i].key);
    for (uint64_t j = 0; j < i; j++)
      if (!strcmp(g->kvs[j].key, g->kvs[i].key)) return bad(r, "given twice");
    if (get_u32(r, "value type", &t)) return NB_ERR_FORMAT;
    if (t >= NB_GGUF_VTYPE_COUNT) return bad(r, "value type %u is unknown (0..12)", t);
    if (read_value(r, (nb_gguf_vtype)t, &g->kvs[i].v, 0)) return NB_ERR_FORMAT;
  }
  return NB_OK;
}

static nb_status read_alignment(rd *r) {
  nb_gguf *g = r->g;
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const nb_gguf_value *a = nb_gguf_get(g, "general.alignment");
  if (!a) return NB_OK;
  snprintf(r->what, sizeof r->what, "key 'general.alignment'");
  if (a->type != NB_GGUF_UINT32) return bad(r, "is a %s, expected UINT32", vtype_names[a->type]);
  if (a->u == 0 || (a->u & (a->u - 1))) return bad(r, "%llu is not a power of two", (unsigned long long)a->u);
  g->alignment = a->u;
  return NB_OK;
}

static nb_status read_tensor_info(rd *r, nb_gguf_tensor *t, size_t i) {
  nb_gguf *g = r->g;
  snprintf(r->what, sizeof r->what, "tensor_infos[%zu]", i);
  const char *name;
  uint64_t len;
  uint32_t nd, type;
  if (get_str(r, "name", &name, &len)) return NB_ERR_FORMAT;
  if (len == 0 || !valid_utf8((const uint8_t *)name, len)) return bad(r, "name is %s", len ? "not valid UTF-8" : "empty");
  char *copy = dup_n(name, len);
  if (!copy || track(g, copy)) return nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  t->name = copy;
  snprintf(r->what, sizeof r->what, "tensor '%.200s'", copy);
  if (get_u32(r, "n_dims", &nd)) return NB_ERR_FORMAT;
  if (nd < 1 || nd > GGUF_MAX_DIMS) return bad(r, "n_dims %u is not in 1..%d", nd, GGUF_MAX_DIMS);
  t->n_dims = (int)nd;
  t->n_elems = 1;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne;
    if (get_u64(r, "dim", &ne)) return NB_ERR_FORMAT;
    if (ne > INT64_MAX) return bad(r, "dim %u is %llu, beyond int64", d, (unsigned long long)ne);
    t->ne[d] = (int64_t)ne;
    if (ne && (uint64_t)t->n_elems > (uint64_t)INT64_MAX / ne)
      return bad(r, "the product of the dims overflows int64 at dim %u (%llu)", d, (unsigned long long)ne);
    t->n_elems *= (int64_t)ne;
  }
  if (get_u32(r, "type", &type)) return NB_ERR_FORMAT;
  const type_info *ti = type_of(type);
  if (!ti) return bad(r, "ggml type %u is unknown", type);
  t->type = (nb_gguf_type)type;
  if (t->ne[0] % ti->block) return bad(r, "ne[0] = %lld is not a multiple of %s's block of %lld", (long long)t->ne[0], ti->name, (long long)ti->block);
  uint64_t blocks = (uint64_t)t->n_elems / (uint64_t)ti->block;
  if (blocks > UINT64_MAX / (uint64_t)ti->bytes) return bad(r, "the size overflows 64 bits");
  t->nbytes = blocks * (uint64_t)ti->bytes;
  if (get_u64(r, "offset", &t->offset)) return NB_ERR_FORMAT;
  for (size_t j = 0; j < i; j++)
    if (!strcmp(g->tensors[j].name, t->name)) return bad(r, "name given twice");
  return NB_OK;
}

static int by_offset(const void *a, const void *b) {
  const nb_gguf_tensor *x = *(const nb_gguf_tensor *const *)a, *y = *(const nb_gguf_tensor *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Offsets aligned, data inside the file, no two tensors sharing a byte. */
static nb_status place_tensors(rd *r) {
  nb_gguf *g = r->g;
  uint64_t data_size = g->size - g->data_offset;
  for (size_t i = 0; i < g->n_tensors; i++) {
    nb_gguf_tensor *t = &g->tensors[i];
    snprintf(r->what, sizeof r->what, "tensor '%.200s'", t->name);
    if (t->offset % g->alignment)
      return bad(r, "offset %llu is not a multiple of the alignment %llu", (unsigned long long)t->offset,
                 (unsigned long long)g->alignment);
    if (t->offset > data_size || t->nbytes > data_size - t->offset)
      return bad(r, "offset %llu + %llu bytes beyond the file (size %llu, data section at %llu)", (unsigned long long)t->offset,
                 (unsigned long long)t->nbytes, (unsigned long long)g->size, (unsigned long long)g->data_offset);
    t->offset += g->data_offset;
    t->data = g->data + t->offset;
  }
  nb_gguf_tensor **order = malloc((g->n_tensors + 1) * sizeof *order);
  if (!order) return nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  for (size_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
  qsort(order, g->n_tensors, sizeof *order, by_offset);
  nb_status s = NB_OK;
  for (size_t i = 1; !s && i < g->n_tensors; i++)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes) {
      snprintf(r->what, sizeof r->what, "tensor '%.200s'", order[i]->name);
      s = bad(r, "data at offset %llu overlaps tensor '%.200s' (%llu + %llu bytes)", (unsigned long long)order[i]->offset,
              order[i - 1]->name, (unsigned long long)order[i - 1]->offset, (unsigned long long)order[i - 1]->nbytes);
    }
  free(order);
  return s;
}

static nb_status parse(nb_gguf *g) {
  rd r = {.g = g, .what = "header"};
  uint32_t magic;
  uint64_t n_tensors, n_kv;
  if (get_u32(&r, "magic", &magic)) return NB_ERR_FORMAT;
  if (memcmp(g->data, "GGUF", 4)) return bad(&r, "magic is not \"GGUF\" (not a GGUF file)");
  if (get_u32(&r, "version", &g->version)) return NB_ERR_FORMAT;
  if (g->version != 2 && g->version != 3)
    return bad(&r, "version %u is not supported (2 and 3 are; %s)", g->version,
               g->version == 1 ? "version 1 used 32-bit counts" : (g->version & 0xFFFF) == 0 ? "a big-endian file?" : "a newer file?");
  if (get_u64(&r, "tensor count", &n_tensors) || get_u64(&r, "metadata count", &n_kv)) return NB_ERR_FORMAT;
  if (read_kvs(&r, n_kv) || read_alignment(&r)) return NB_ERR_FORMAT;
  snprintf(r.what, sizeof r.what, "header");
  if (n_tensors > left(&r) / 24) /* name length 8, n_dims 4, one dim 8, type 4, offset 8, minus slack */
    return bad(&r, "tensor count %llu is larger than the file could hold", (unsigned long long)n_tensors);
  g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
  if (!g->tensors) return nb_errorf(g->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  for (size_t i = 0; i < n_tensors; i++) {
    g->n_tensors = i + 1;
    if (read_tensor_info(&r, &g->tensors[i], i)) return NB_ERR_FORMAT;
  }
  uint64_t pad = (g->alignment - r.pos % g->alignment) % g->alignment;
  snprintf(r.what, sizeof r.what, "data section");
  if (n_tensors && need(&r, pad, "padding before the data section")) return NB_ERR_FORMAT;
  g->data_offset = n_tensors ? r.pos + pad : g->size;
  return place_tensors(&r);
}

static nb_gguf *parse_or_close(nb_gguf *g) {
  if (parse(g) == NB_OK) return g;
  nb_gguf_close(g);
  return NULL;
}

nb_gguf *nb_gguf_parse(nb_ctx *ctx, const void *data, size_t size, const char *name) {
  if (!data && size) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_gguf_parse: NULL data"), NULL;
  nb_gguf *g = calloc(1, sizeof *g);
  if (!g || !(g->name = dup_n(name ? name : "gguf", strlen(name ? name : "gguf")))) {
    free(g);
    return nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory"), NULL;
  }
  g->ctx = ctx;
  g->data = data ? data : (const uint8_t *)"";
  g->size = size;
  return parse_or_close(g);
}

nb_gguf *nb_gguf_open(nb_ctx *ctx, const char *path) {
  if (!path) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_gguf_open: NULL path"), NULL;
  if (access(path, F_OK) != 0) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: no such file", path), NULL;
  nb_ckpt__map *m = nb_ckpt__map_open(ctx, path, 0);
  if (!m) return NULL;
  nb_gguf *g = nb_gguf_parse(ctx, nb_ckpt__map_data(m), nb_ckpt__map_size(m), path);
  if (!g) {
    nb_ckpt__map_release(m);
    return NULL;
  }
  g->map = m;
  return g;
}

void nb_gguf_close(nb_gguf *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n_kv; i++) free(g->kvs[i].key);
  for (size_t i = 0; i < g->n_allocs; i++) free(g->allocs[i]);
  free(g->allocs);
  free(g->kvs);
  free(g->tensors);
  free(g->name);
  if (g->map) nb_ckpt__map_release(g->map);
  free(g);
}

uint32_t nb_gguf_version(const nb_gguf *g) { return g->version; }
uint64_t nb_gguf_alignment(const nb_gguf *g) { return g->alignment; }
const char *nb_gguf_name(const nb_gguf *g) { return g->name; }
size_t nb_gguf_n_kv(const nb_gguf *g) { return g->n_kv; }
const char *nb_gguf_kv_key(const nb_gguf *g, size_t i) { return i < g->n_kv ? g->kvs[i].key : NULL; }
const nb_gguf_value *nb_gguf_kv_value(const nb_gguf *g, size_t i) { return i < g->n_kv ? &g->kvs[i].v : NULL; }
size_t nb_gguf_n_tensors(const nb_gguf *g) { return g->n_tensors; }
const nb_gguf_tensor *nb_gguf_tensor_at(const nb_gguf *g, size_t i) { return i < g->n_tensors ? &g->tensors[i] : NULL; }

const nb_gguf_value *nb_gguf_get(const nb_gguf *g, const char *key) {
  for (size_t i = 0; i < g->n_kv; i++)
    if (!strcmp(g->kvs[i].key, key)) return &g->kvs[i].v;
  return NULL;
}

const nb_gguf_tensor *nb_gguf_find_tensor(const nb_gguf *g, const char *name) {
  for (size_t i = 0; i < g->n_tensors; i++)
    if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
  return NULL;
}

static const nb_gguf_value *typed(const nb_gguf *g, const char *key, const char *want, bool (*ok)(nb_gguf_vtype)) {
  const nb_gguf_value *v = nb_gguf_get(g, key);
  if (!v) return nb_errorf(g->ctx, NB_ERR_NOT_FOUND, "%s: key '%s' is missing", g->name, key), NULL;
  if (!ok(v->type)) return nb_errorf(g->ctx, NB_ERR_FORMAT, "%s: key '%s' is a %s, expected %s", g->name, key, vtype_names[v->type], want), NULL;
  return v;
}

static bool is_int(nb_gguf_vtype t) { return t <= NB_GGUF_INT32 || t == NB_GGUF_UINT64 || t == NB_GGUF_INT64; }
static bool is_float(nb_gguf_vtype t) { return t == NB_GGUF_FLOAT32 || t == NB_GGUF_FLOAT64; }
static bool is_bool(nb_gguf_vtype t) { return t == NB_GGUF_BOOL; }
static bool is_string(nb_gguf_vtype t) { return t == NB_GGUF_STRING; }

nb_status nb_gguf_get_int(const nb_gguf *g, const char *key, int64_t *out) {
  const nb_gguf_value *v = typed(g, key, "an integer", is_int);
  if (!v) return nb_ctx_status(g->ctx);
  if (v->type == NB_GGUF_UINT64 && v->u > INT64_MAX)
    return nb_errorf(g->ctx, NB_ERR_FORMAT, "%s: key '%s' is %llu, beyond int64", g->name, key, (unsigned long long)v->u);
  *out = v->i;
  return NB_OK;
}

nb_status nb_gguf_get_float(const nb_gguf *g, const char *key, double *out) {
  const nb_gguf_value *v = typed(g, key, "a float", is_float);
  if (!v) return nb_ctx_status(g->ctx);
  *out = v->f;
  return NB_OK;
}

nb_status nb_gguf_get_bool(const nb_gguf *g, const char *key, bool *out) {
  const nb_gguf_value *v = typed(g, key, "a bool", is_bool);
  if (!v) return nb_ctx_status(g->ctx);
  *out = v->u != 0;
  return NB_OK;
}

nb_status nb_gguf_get_string(const nb_gguf *g, const char *key, const char **s, size_t *len) {
  const nb_gguf_value *v = typed(g, key, "a string", is_string);
  if (!v) return nb_ctx_status(g->ctx);
  *s = v->str;
  *len = (size_t)v->len;
  return NB_OK;
}

double nb_gguf_array_f64(const nb_gguf_value *v, uint64_t j) {
  if (v->type != NB_GGUF_ARRAY || j >= v->n || !v->raw) return 0;
  nb_gguf_value x = {0};
  set_scalar(&x, v->elem, v->raw + j * (uint64_t)scalar_size[v->elem]);
  return x.f;
}

int64_t nb_gguf_array_i64(const nb_gguf_value *v, uint64_t j) {
  if (v->type != NB_GGUF_ARRAY || j >= v->n || !v->raw) return 0;
  nb_gguf_value x = {0};
  set_scalar(&x, v->elem, v->raw + j * (uint64_t)scalar_size[v->elem]);
  return is_float(v->elem) ? (int64_t)x.f : x.i;
}

nb_array *nb_gguf_tensor_f32(const nb_gguf *g, const nb_gguf_tensor *t) {
  if (!nb_gguf_can_decode(t->type))
    return nb_errorf(g->ctx, NB_ERR_UNIMPLEMENTED, "%s: tensor '%s': type %s cannot be decoded (supported: F32, F16, BF16, "
                     "Q8_0, Q4_0, Q4_K, Q6_K)", g->name, t->name, nb_gguf_type_name(t->type)), NULL;
  int64_t dims[GGUF_MAX_DIMS];
  for (int d = 0; d < t->n_dims; d++) dims[d] = t->ne[t->n_dims - 1 - d];
  nb_array *a = nb_array_empty(g->ctx, NB_F32, t->n_dims, dims);
  if (!a) return NULL;
  if (nb_gguf_decode(g->ctx, t->type, t->data, nb_array_data_mut(a), t->n_elems)) {
    nb_array_release(a);
    return NULL;
  }
  return a;
}

/* ---- the writer ---------------------------------------------------------------------- */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_le(buf *b, uint64_t v, int n) {
  uint8_t x[8];
  for (int i = 0; i < n; i++) x[i] = (uint8_t)(v >> (8 * i));
  put(b, x, (size_t)n);
}

static void put_str(buf *b, const char *s, size_t n) {
  put_le(b, n, 8);
  put(b, s, n);
}

typedef struct w_tensor {
  char *name;
  nb_gguf_type type;
  int n_dims;
  int64_t ne[GGUF_MAX_DIMS];
  uint8_t *data;
  size_t nbytes;
} w_tensor;

struct nb_gguf_writer {
  nb_ctx *ctx;
  buf kv;
  uint64_t n_kv;
  char **keys;
  w_tensor *tensors;
  size_t n_tensors, cap_tensors;
};

nb_gguf_writer *nb_gguf_writer_create(nb_ctx *ctx) {
  nb_gguf_writer *w = calloc(1, sizeof *w);
  if (!w) return nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory"), NULL;
  w->ctx = ctx;
  return w;
}

void nb_gguf_writer_destroy(nb_gguf_writer *w) {
  if (!w) return;
  for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
  for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name), free(w->tensors[i].data);
  free(w->keys);
  free(w->tensors);
  free(w->kv.p);
  free(w);
}

/* the key (checked, unique) and the value type */
static nb_status begin_kv(nb_gguf_writer *w, const char *key, nb_gguf_vtype t) {
  if (!key || !*key || !valid_utf8((const uint8_t *)key, strlen(key)))
    return nb_errorf(w->ctx, NB_ERR_INVALID_ARG, "gguf writer: key '%s' is empty or not UTF-8", key ? key : "(null)");
  for (uint64_t i = 0; i < w->n_kv; i++)
    if (!strcmp(w->keys[i], key)) return nb_errorf(w->ctx, NB_ERR_INVALID_ARG, "gguf writer: key '%s' written twice", key);
  char **k = realloc(w->keys, (w->n_kv + 1) * sizeof *k);
  if (!k || !(k[w->n_kv] = dup_n(key, strlen(key)))) {
    if (k) w->keys = k;
    return nb_errorf(w->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  }
  w->keys = k;
  w->n_kv++;
  put_str(&w->kv, key, strlen(key));
  put_le(&w->kv, (uint64_t)t, 4);
  return NB_OK;
}

static nb_status end_kv(nb_gguf_writer *w) { return w->kv.oom ? nb_errorf(w->ctx, NB_ERR_NOMEM, "gguf: out of memory") : NB_OK; }

nb_status nb_gguf_write_u32(nb_gguf_writer *w, const char *key, uint32_t v) {
  if (begin_kv(w, key, NB_GGUF_UINT32)) return nb_ctx_status(w->ctx);
  put_le(&w->kv, v, 4);
  return end_kv(w);
}

nb_status nb_gguf_write_i32(nb_gguf_writer *w, const char *key, int32_t v) {
  if (begin_kv(w, key, NB_GGUF_INT32)) return nb_ctx_status(w->ctx);
  put_le(&w->kv, (uint32_t)v, 4);
  return end_kv(w);
}

nb_status nb_gguf_write_f32(nb_gguf_writer *w, const char *key, float v) {
  if (begin_kv(w, key, NB_GGUF_FLOAT32)) return nb_ctx_status(w->ctx);
  uint32_t u;
  memcpy(&u, &v, 4);
  put_le(&w->kv, u, 4);
  return end_kv(w);
}

nb_status nb_gguf_write_bool(nb_gguf_writer *w, const char *key, bool v) {
  if (begin_kv(w, key, NB_GGUF_BOOL)) return nb_ctx_status(w->ctx);
  put_le(&w->kv, v, 1);
  return end_kv(w);
}

nb_status nb_gguf_write_string(nb_gguf_writer *w, const char *key, const char *s, size_t len) {
  if (begin_kv(w, key, NB_GGUF_STRING)) return nb_ctx_status(w->ctx);
  put_str(&w->kv, s, len);
  return end_kv(w);
}

nb_status nb_gguf_write_strings(nb_gguf_writer *w, const char *key, const char *const *s, const size_t *lens, size_t n) {
  if (begin_kv(w, key, NB_GGUF_ARRAY)) return nb_ctx_status(w->ctx);
  put_le(&w->kv, NB_GGUF_STRING, 4);
  put_le(&w->kv, n, 8);
  for (size_t i = 0; i < n; i++) put_str(&w->kv, s[i], lens ? lens[i] : strlen(s[i]));
  return end_kv(w);
}

static nb_status write_nums(nb_gguf_writer *w, const char *key, nb_gguf_vtype t, const void *v, size_t n) {
  if (begin_kv(w, key, NB_GGUF_ARRAY)) return nb_ctx_status(w->ctx);
  put_le(&w->kv, t, 4);
  put_le(&w->kv, n, 8);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, (const uint8_t *)v + 4 * i, 4);
    put_le(&w->kv, u, 4);
  }
  return end_kv(w);
}

nb_status nb_gguf_write_f32s(nb_gguf_writer *w, const char *key, const float *v, size_t n) {
  return write_nums(w, key, NB_GGUF_FLOAT32, v, n);
}

nb_status nb_gguf_write_i32s(nb_gguf_writer *w, const char *key, const int32_t *v, size_t n) {
  return write_nums(w, key, NB_GGUF_INT32, v, n);
}

nb_status nb_gguf_write_tensor(nb_gguf_writer *w, const char *name, nb_gguf_type type, const nb_array *x) {
  nb_ctx *ctx = w->ctx;
  if (!name || !*name || !valid_utf8((const uint8_t *)name, strlen(name)) || !x)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf writer: tensor name '%s' is empty or not UTF-8, or no array", name ? name : "(null)");
  for (size_t i = 0; i < w->n_tensors; i++)
    if (!strcmp(w->tensors[i].name, name)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf writer: tensor '%s' written twice", name);
  int rank = nb_array_rank(x);
  const int64_t *dims = nb_array_dims(x);
  if (rank < 1 || rank > GGUF_MAX_DIMS || !nb_dtype_is_float(nb_array_dtype(x)) || !nb_array_data(x))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf writer: tensor '%s': a host float array of rank 1..4 is needed", name);
  int64_t block, bytes;
  if (!nb_gguf_type_block(type, &block, &bytes) || !nb_gguf_can_encode(type))
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "gguf writer: tensor '%s': cannot encode type %s", name,
                     nb_gguf_type_name(type) ? nb_gguf_type_name(type) : "(unknown)");
  if (dims[rank - 1] % block)
    return nb_errorf(ctx, NB_ERR_SHAPE, "gguf writer: tensor '%s': last dim %lld is not a multiple of %s's block of %lld", name,
                     (long long)dims[rank - 1], nb_gguf_type_name(type), (long long)block);
  if (w->n_tensors == w->cap_tensors) {
    size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
    w_tensor *t = realloc(w->tensors, cap * sizeof *t);
    if (!t) return nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory");
    w->tensors = t, w->cap_tensors = cap;
  }
  nb_array *f = nb_array_astype(ctx, (nb_array *)x, NB_F32); /* reads x only */
  if (!f) return nb_ctx_status(ctx);
  int64_t n = nb_array_size(f);
  w_tensor t = {.name = dup_n(name, strlen(name)), .type = type, .n_dims = rank, .nbytes = (size_t)(n / block * bytes)};
  t.data = malloc(t.nbytes ? t.nbytes : 1);
  for (int d = 0; d < rank; d++) t.ne[d] = dims[rank - 1 - d];
  nb_status s = t.name && t.data ? nb_gguf_encode(ctx, type, nb_array_data(f), t.data, n) : nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory");
  nb_array_release(f);
  if (s) {
    char why[400];
    snprintf(why, sizeof why, "%s", nb_ctx_error(ctx));
    free(t.name), free(t.data);
    return nb_errorf(ctx, s, "gguf writer: tensor '%s': %s", name, why);
  }
  w->tensors[w->n_tensors++] = t;
  return NB_OK;
}

static size_t align_up(size_t n) { return (n + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT; }

nb_status nb_gguf_writer_save(nb_gguf_writer *w, const char *path) {
  nb_ctx *ctx = w->ctx;
  buf h = {0};
  put(&h, "GGUF", 4);
  put_le(&h, 3, 4);
  put_le(&h, w->n_tensors, 8);
  put_le(&h, w->n_kv, 8);
  put(&h, w->kv.p, w->kv.n);
  size_t off = 0;
  for (size_t i = 0; i < w->n_tensors; i++) {
    const w_tensor *t = &w->tensors[i];
    put_str(&h, t->name, strlen(t->name));
    put_le(&h, (uint64_t)t->n_dims, 4);
    for (int d = 0; d < t->n_dims; d++) put_le(&h, (uint64_t)t->ne[d], 8);
    put_le(&h, (uint64_t)t->type, 4);
    put_le(&h, off, 8);
    off = align_up(off + t->nbytes);
  }
  static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
  put(&h, zeros, align_up(h.n) - h.n);
  if (h.oom) {
    free(h.p);
    return nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory");
  }
  char tmp[NB_CKPT__PATH_CAP], dir[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, tmp, "%s.tmp", path) != NB_OK) return free(h.p), NB_ERR_INVALID_ARG;
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  int fd = nb_ckpt__io_tick() == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
  if (fd < 0) {
    free(h.p);
    return nb_errorf(ctx, NB_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
  }
  nb_status s = nb_ckpt__write_all(ctx, fd, h.p, h.n, tmp);
  for (size_t i = 0; !s && i < w->n_tensors; i++) {
    s = nb_ckpt__write_all(ctx, fd, w->tensors[i].data, w->tensors[i].nbytes, tmp);
    size_t pad = align_up(w->tensors[i].nbytes) - w->tensors[i].nbytes;
    if (!s) s = nb_ckpt__write_all(ctx, fd, zeros, pad, tmp); /* ggml sizes the data section with the last pad too */
  }
  if (!s) s = nb_ckpt__fsync_fd(ctx, fd, tmp);
  close(fd);
  if (!s) s = nb_ckpt__rename(ctx, tmp, path);
  if (!s) s = nb_ckpt__fsync_dir(ctx, dir);
  if (s) unlink(tmp);
  free(h.p);
  return s;
}
