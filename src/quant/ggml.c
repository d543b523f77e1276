/* GGUF's Q8_0 and Q4_0 blocks as quant's int8 / int4 g32 weights, Q6_K's
 * as int8 g16: the same codes and scales, repacked (docs/quant.md "GGUF
 * blocks"). */
#include <math.h>
#include <string.h>

#include "nabla/quant.h"

/* IEEE half -> float, exact (subnormals, infinities, NaN). */
static float half_to_float(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return sign ? -v : v;
}

/* Q6_K: 256 elements {u8 ql[128], qh[64]; i8 sc[16]; f16 d}, element
 * e = 128 h + 32 g + l (h < 2, g < 4, l < 32) has the 6-bit code
 * c = (4 bits of ql) | (2 bits of qh) << 4 and w = d * sc[e / 16] * (c - 32).
 * As int8 tile 16: code c - 32, scale d * sc (exact in f32: 11 x 8 bits),
 * so w is the same single rounding of the same product. */
static nb_status from_q6_k(nb_ctx *ctx, const uint8_t *data, int64_t n, int64_t k, const int64_t *row_of, nb_quant_weight *out) {
  enum { QK_K = 256, BLOCK = 210 };
  if (n < 1 || k < QK_K || k % QK_K) return nb_errorf(ctx, NB_ERR_SHAPE, "from ggml: k = %lld is not a positive multiple of 256", (long long)k);
  nb_quant_layout l = {.qtype = NB_QUANT_INT8, .n = n, .k = k, .tile = 16};
  nb_aval va = nb_quant_values_aval(&l), sa = nb_quant_scales_aval(&l);
  nb_array *values = nb_array_empty(ctx, va.dtype, va.shape.rank, va.shape.dims);
  nb_array *scales = values ? nb_array_empty(ctx, sa.dtype, sa.shape.rank, sa.shape.dims) : NULL;
  if (!scales) return nb_array_release(values), nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  int8_t *v = nb_array_data_mut(values);
  float *s = nb_array_data_mut(scales);
  for (int64_t r = 0; r < n; r++) {
    int64_t src_row = row_of ? row_of[r] : r;
    if (src_row < 0 || src_row >= n) {
      nb_array_release(values), nb_array_release(scales);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "from ggml: row_of[%lld] = %lld is not a row", (long long)r, (long long)src_row);
    }
    for (int64_t blk = 0; blk < k / QK_K; blk++) {
      const uint8_t *b = data + ((size_t)src_row * (size_t)(k / QK_K) + (size_t)blk) * BLOCK;
      uint16_t dh;
      memcpy(&dh, b + 208, 2);
      float d = half_to_float(dh);
      int8_t *dst = v + r * k + blk * QK_K;
      for (int i = 0; i < 16; i++) s[r * (k / 16) + blk * 16 + i] = d * (float)(int8_t)b[192 + i];
      for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
          for (int e = 0; e < 32; e++) {
            uint8_t ql = b[64 * h + e + (g & 1) * 32], qh = b[128 + 32 * h + e];
            int c = ((g < 2 ? ql & 15 : ql >> 4) | ((qh >> (2 * g)) & 3) << 4);
            dst[128 * h + 32 * g + e] = (int8_t)(c - 32);
          }
    }
  }
  *out = (nb_quant_weight){.layout = l, .values = values, .scales = scales};
  return NB_OK;
}

nb_status nb_quant_from_ggml(nb_ctx *ctx, int ggml_type, const void *data, int64_t n, int64_t k, const int64_t *row_of,
                             nb_quant_weight *out) {
  enum { QK = 32, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_Q6_K = 14 };
  if (ggml_type == GGML_Q6_K) return from_q6_k(ctx, data, n, k, row_of, out);
  if (ggml_type != GGML_Q8_0 && ggml_type != GGML_Q4_0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "from ggml: type %d is not Q8_0 (8), Q4_0 (2) or Q6_K (14)", ggml_type);
  if (n < 1 || k < QK || k % QK) return nb_errorf(ctx, NB_ERR_SHAPE, "from ggml: k = %lld is not a positive multiple of 32", (long long)k);
  bool q8 = ggml_type == GGML_Q8_0;
  size_t block = q8 ? 2 + QK : 2 + QK / 2;
  int64_t nb = k / QK;
  nb_quant_layout l = {.qtype = q8 ? NB_QUANT_INT8 : NB_QUANT_INT4, .n = n, .k = k, .tile = k == QK ? k : QK};
  nb_aval va = nb_quant_values_aval(&l), sa = nb_quant_scales_aval(&l);
  nb_array *values = nb_array_empty(ctx, va.dtype, va.shape.rank, va.shape.dims);
  nb_array *scales = values ? nb_array_empty(ctx, sa.dtype, sa.shape.rank, sa.shape.dims) : NULL;
  if (!scales) return nb_array_release(values), nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  uint8_t *v = nb_array_data_mut(values);
  float *s = nb_array_data_mut(scales);
  int64_t row_bytes = q8 ? k : k / 2;
  for (int64_t r = 0; r < n; r++) {
    int64_t src_row = row_of ? row_of[r] : r;
    if (src_row < 0 || src_row >= n) {
      nb_array_release(values), nb_array_release(scales);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "from ggml: row_of[%lld] = %lld is not a row", (long long)r, (long long)src_row);
    }
    const uint8_t *b = (const uint8_t *)data + (size_t)src_row * (size_t)nb * block;
    for (int64_t t = 0; t < nb; t++, b += block) {
      uint16_t d;
      memcpy(&d, b, 2);
      s[r * nb + t] = half_to_float(d);
      uint8_t *dst = v + r * row_bytes + (q8 ? t * QK : t * QK / 2);
      if (q8) {
        for (int j = 0; j < QK; j++)
          if ((int8_t)b[2 + j] == -128) {
            nb_array_release(values), nb_array_release(scales);
            return nb_errorf(ctx, NB_ERR_FORMAT, "from ggml: Q8_0 row %lld holds the code -128 (int8 symmetric is [-127, 127])",
                             (long long)src_row);
          }
        memcpy(dst, b + 2, QK);
      } else {
        uint8_t c[QK];
        for (int j = 0; j < QK / 2; j++) c[j] = b[2 + j] & 15, c[j + QK / 2] = b[2 + j] >> 4;
        for (int i = 0; i < QK / 2; i++) dst[i] = (uint8_t)(c[2 * i] | c[2 * i + 1] << 4);
      }
    }
  }
  *out = (nb_quant_weight){.layout = l, .values = values, .scales = scales};
  return NB_OK;
}
