/* GGUF's Q8_0 / Q4_0 / Q6_K blocks as quant weights (nb_quant_from_ggml): the
 * dequantized values are bit for bit the GGUF codec's f32 decode (ggml's
 * dequantize_row_q8_0 / _q4_0 / _q6_K), for random rows (Q4_0's code 0 included),
 * with a row permutation; nabla's own int4 g32 (absmax) exported as Q4_0 and
 * read back keeps every code, the scales rounded to f16 only; bad inputs
 * named. */
#include <string.h>

#include "nabla/quant.h"
#include "test.h"

static void check_type(nb_ctx *ctx, nb_gguf_type type, int64_t n, int64_t k, bool permute) {
  nb_test_rng rng = {(uint64_t)(type * 1000 + n + k)};
  float *w = malloc((size_t)(n * k) * sizeof *w), *want = malloc((size_t)(n * k) * sizeof *w);
  size_t block = type == NB_GGUF_Q8_0 ? 34 : type == NB_GGUF_Q4_0 ? 18 : 210, per = type == NB_GGUF_Q6_K ? 256 : 32;
  uint8_t *blocks = malloc((size_t)(n * k) / per * block);
  for (int64_t i = 0; i < n * k; i++) w[i] = (float)(nb_test_normal(&rng) * (1 + i % 7));
  CHECK_OK(ctx, nb_gguf_encode(ctx, type, w, blocks, n * k));
  CHECK_OK(ctx, nb_gguf_decode(ctx, type, blocks, want, n * k));
  int64_t *rows = malloc((size_t)n * sizeof *rows);
  for (int64_t r = 0; r < n; r++) rows[r] = permute ? (r * 5 + 3) % n : r;
  nb_quant_weight q;
  nb_status s = nb_quant_from_ggml(ctx, (int)type, blocks, n, k, permute ? rows : NULL, &q);
  CHECK_MSG(s == NB_OK, "%s", nb_ctx_error(ctx));
  if (!s) {
    CHECK(q.layout.qtype == (type == NB_GGUF_Q4_0 ? NB_QUANT_INT4 : NB_QUANT_INT8) && q.layout.tile == (type == NB_GGUF_Q6_K ? 16 : 32));
    nb_array *d = nb_quant_dequantize(ctx, &q);
    const float *got = d ? nb_array_data(d) : NULL;
    int64_t bad = 0, zeros = 0;
    for (int64_t r = 0; got && r < n; r++)
      for (int64_t c = 0; c < k; c++) bad += memcmp(&got[r * k + c], &want[rows[r] * k + c], sizeof(float)) != 0;
    if (type == NB_GGUF_Q4_0) /* code 0 (-8 d) occurs: ggml maps each block's signed extreme to it */
      for (int64_t i = 0; i < n * k / 2; i++) zeros += (((const uint8_t *)nb_array_data(q.values))[i] & 15) == 0;
    CHECK_MSG(got && bad == 0, "%s %lldx%lld: %lld values differ from the GGUF decode", nb_gguf_type_name(type), (long long)n,
              (long long)k, (long long)bad);
    if (type == NB_GGUF_Q4_0) CHECK(zeros > 0);
    nb_array_release(d);
    nb_quant_weight_release(&q);
  }
  free(rows), free(blocks), free(want), free(w);
}

/* nabla's int4 g32 absmax is Q4_0's quantizer (the signed extreme at code
 * -8): its dequantized weights, encoded by the GGUF writer's Q4_0
 * (quantize_row_q4_0_ref) and read back by nb_quant_from_ggml, have the same
 * codes, and the file's d is f16(nabla's scale). */
static void test_int4_is_q4_0(nb_ctx *ctx) {
  int64_t n = 9, k = 96;
  nb_test_rng rng = {77};
  nb_array *w = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){n, k});
  float *wp = nb_array_data_mut(w);
  for (int64_t i = 0; i < n * k; i++) wp[i] = (float)(nb_test_normal(&rng) * (1 + i % 5));
  for (int64_t r = 0; r < n; r++) wp[r * k + 5 + r] = (r % 2 ? -1 : 1) * 30.0f; /* extremes of both signs */
  nb_quant_calib absmax = {.kind = NB_QUANT_ABSMAX};
  nb_quant_weight q, back;
  CHECK_OK(ctx, nb_quant_quantize(ctx, w, NB_QUANT_INT4, 32, &absmax, &q));
  nb_array *d = nb_quant_dequantize(ctx, &q);
  uint8_t *blocks = malloc((size_t)(n * k / 32 * 18));
  CHECK_OK(ctx, nb_gguf_encode(ctx, NB_GGUF_Q4_0, nb_array_data(d), blocks, n * k));
  CHECK_OK(ctx, nb_quant_from_ggml(ctx, NB_GGUF_Q4_0, blocks, n, k, NULL, &back));
  int64_t code_diff = 0, scale_diff = 0, zeros = 0, negative = 0;
  const uint8_t *c0 = nb_array_data(q.values), *c1 = nb_array_data(back.values);
  const float *s0 = nb_array_data(q.scales), *s1 = nb_array_data(back.scales);
  for (int64_t i = 0; i < n * k / 2; i++) code_diff += c0[i] != c1[i], zeros += (c0[i] & 15) == 0 || c0[i] >> 4 == 0;
  for (int64_t i = 0; i < n * k / 32; i++) scale_diff += s1[i] != nb_f16_to_f32(nb_f32_to_f16(s0[i])), negative += s0[i] < 0;
  CHECK_MSG(code_diff == 0 && scale_diff == 0, "int4 g32 -> Q4_0 -> int4: %lld code bytes and %lld scales differ", (long long)code_diff,
            (long long)scale_diff);
  CHECK_MSG(zeros > 0 && negative > 0, "code 0 in %lld bytes, %lld negative scales (both wanted)", (long long)zeros, (long long)negative);
  nb_quant_weight_release(&back);
  free(blocks);
  nb_array_release(d);
  nb_quant_weight_release(&q);
  nb_array_release(w);
}

static void test_errors(nb_ctx *ctx) {
  uint8_t b[34] = {0x00, 0x3c}; /* d = 1 */
  b[2 + 5] = 0x80;             /* -128 */
  nb_quant_weight q;
  CHECK(nb_quant_from_ggml(ctx, 8, b, 1, 32, NULL, &q) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "Q8_0 row 0 holds the code -128");
  CHECK(nb_quant_from_ggml(ctx, 12, b, 1, 32, NULL, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "type 12");
  CHECK(nb_quant_from_ggml(ctx, 14, b, 1, 32, NULL, &q) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "k = 32 is not a positive multiple of 256");
  CHECK(nb_quant_from_ggml(ctx, 8, b, 1, 48, NULL, &q) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "k = 48");
  int64_t rows[1] = {1};
  CHECK(nb_quant_from_ggml(ctx, 2, b, 1, 32, rows, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "row_of[0] = 1");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  for (int t = 0; t < 2; t++) {
    nb_gguf_type type = t ? NB_GGUF_Q4_0 : NB_GGUF_Q8_0;
    check_type(ctx, type, 1, 32, false);
    check_type(ctx, type, 13, 96, true);
    check_type(ctx, type, 64, 768, true);
  }
  check_type(ctx, NB_GGUF_Q6_K, 3, 256, false); /* Q6_K as int8 g16 (a Q4_0 file's output.weight) */
  check_type(ctx, NB_GGUF_Q6_K, 13, 768, true);
  test_int4_is_q4_0(ctx);
  test_errors(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_ggml");
}
