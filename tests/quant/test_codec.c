/* quant's host codecs against float64 models written from the formats'
 * definitions: fp8 e4m3fn / e5m2 decoding of every code against known
 * points, encoding against a brute-force nearest-code search (ties to the
 * even code, saturation) over random floats, every midpoint and the
 * specials, and against ml_dtypes' casts (a table made by
 * tests/quant/golden/make_fp8.py); NF4 against its nearest value; quantize -> dequantize round
 * trips per qtype x tile (ragged last tiles) x calibration within their
 * bounds in f64; the tree form; errors naming the field. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/quant.h"
#include "test.h"

/* ---------------------------------------------------------------- fp8 */

static void test_fp8_known(void) {
  nb_quant_type e4 = NB_QUANT_FP8_E4M3, e5 = NB_QUANT_FP8_E5M2;
  CHECK(nb_quant_fp8_decode(0x7e, e4) == 448.0f);
  CHECK(nb_quant_fp8_decode(0x38, e4) == 1.0f);
  CHECK(nb_quant_fp8_decode(0x01, e4) == ldexpf(1, -9));
  CHECK(nb_quant_fp8_decode(0x08, e4) == ldexpf(1, -6));
  CHECK(nb_quant_fp8_decode(0x07, e4) == 7 * ldexpf(1, -9));
  CHECK(isnan(nb_quant_fp8_decode(0x7f, e4)) && isnan(nb_quant_fp8_decode(0xff, e4)));
  CHECK(nb_quant_fp8_decode(0xfe, e4) == -448.0f);
  CHECK(nb_quant_fp8_decode(0x80, e4) == 0 && signbit(nb_quant_fp8_decode(0x80, e4)));
  CHECK(nb_quant_fp8_decode(0x7b, e5) == 57344.0f);
  CHECK(nb_quant_fp8_decode(0x3c, e5) == 1.0f);
  CHECK(nb_quant_fp8_decode(0x01, e5) == ldexpf(1, -16));
  CHECK(nb_quant_fp8_decode(0x04, e5) == ldexpf(1, -14));
  CHECK(isinf(nb_quant_fp8_decode(0x7c, e5)) && nb_quant_fp8_decode(0xfc, e5) < 0);
  CHECK(isnan(nb_quant_fp8_decode(0x7d, e5)) && isnan(nb_quant_fp8_decode(0x7f, e5)));
  /* every finite code survives encode(decode(c)) (up to -0 == +0) */
  for (int t = NB_QUANT_FP8_E4M3; t <= NB_QUANT_FP8_E5M2; t++)
    for (int c = 0; c < 256; c++) {
      float v = nb_quant_fp8_decode((uint8_t)c, (nb_quant_type)t);
      if (!isfinite(v)) continue;
      CHECK_MSG(nb_quant_fp8_encode(v, (nb_quant_type)t) == c, "type %d code 0x%02x (%g) -> 0x%02x", t, c, (double)v,
                nb_quant_fp8_encode(v, (nb_quant_type)t));
    }
  /* specials and saturation */
  CHECK(nb_quant_fp8_encode(1e9f, e4) == 0x7e && nb_quant_fp8_encode(-1e9f, e4) == 0xfe);
  CHECK(nb_quant_fp8_encode(1e9f, e5) == 0x7b && nb_quant_fp8_encode(INFINITY, e5) == 0x7c);
  CHECK(nb_quant_fp8_encode(INFINITY, e4) == 0x7e); /* e4m3fn has no infinity: saturates */
  CHECK(isnan(nb_quant_fp8_decode(nb_quant_fp8_encode(NAN, e4), e4)) && isnan(nb_quant_fp8_decode(nb_quant_fp8_encode(NAN, e5), e5)));
  CHECK(nb_quant_fp8_encode(ldexpf(1, -30), e4) == 0 && nb_quant_fp8_encode(-ldexpf(1, -30), e4) == 0x80);
}

/* The nearest finite value of the format in f64, ties to the code with an
 * even mantissa; beyond the largest, the largest (saturating). */
static double fp8_model(double x, nb_quant_type t, const double *vals) {
  double mx = nb_quant_fp8_max(t);
  if (x > mx) return mx;
  if (x < -mx) return -mx;
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    if (!isfinite(vals[c])) continue;
    double d = fabs(x - vals[c]);
    if (d < bd || (d == bd && (c & 1) == 0 && vals[c] != vals[best])) best = c, bd = d;
  }
  return vals[best];
}

static void test_fp8_encode_model(void) {
  nb_test_rng r = {11};
  for (int t = NB_QUANT_FP8_E4M3; t <= NB_QUANT_FP8_E5M2; t++) {
    double vals[256];
    for (int c = 0; c < 256; c++) vals[c] = nb_quant_fp8_decode((uint8_t)c, (nb_quant_type)t);
    int bad = 0;
    /* every midpoint of two neighbouring positive values (the ties), and just off them */
    for (int c = 0; c < 0x7f; c++) {
      if (!isfinite(vals[c + 1])) break;
      double mid = (vals[c] + vals[c + 1]) / 2;
      float probes[3] = {(float)mid, nextafterf((float)mid, 0), nextafterf((float)mid, INFINITY)};
      for (int k = 0; k < 3; k++)
        for (int s = 0; s < 2; s++) {
          float x = s ? -probes[k] : probes[k];
          double want = fp8_model(x, (nb_quant_type)t, vals), got = vals[nb_quant_fp8_encode(x, (nb_quant_type)t)];
          if (got != want && bad++ < 5) fprintf(stderr, "type %d: %.9g -> %.9g, model %.9g\n", t, (double)x, got, want);
        }
    }
    /* random floats over the whole range (log-uniform magnitudes) */
    for (int i = 0; i < 200000; i++) {
      float x = (float)(ldexp(1 + nb_test_uniform(&r), (int)nb_test_int(&r, -30, 20)) * (nb_test_uniform(&r) < 0.5 ? -1 : 1));
      double want = fp8_model(x, (nb_quant_type)t, vals), got = vals[nb_quant_fp8_encode(x, (nb_quant_type)t)];
      if (got != want && bad++ < 5) fprintf(stderr, "type %d: %.9g -> %.9g, model %.9g\n", t, (double)x, got, want);
    }
    CHECK_MSG(bad == 0, "%d fp8 encodings differ from the model", bad);
  }
}

/* ml_dtypes' casts (tests/quant/golden/make_fp8.py), in range */
static void test_fp8_ml_dtypes(void) {
  FILE *f = fopen("tests/quant/golden/fp8.txt", "r");
  CHECK_MSG(f != NULL, "tests/quant/golden/fp8.txt: cannot open (run from the repository root)");
  if (!f) return;
  char line[128], name[8];
  unsigned bits, code;
  int n = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || sscanf(line, "%7s %x %x", name, &bits, &code) != 3) continue;
    nb_quant_type t = strcmp(name, "e4m3") == 0 ? NB_QUANT_FP8_E4M3 : NB_QUANT_FP8_E5M2;
    float x;
    uint32_t b = bits;
    memcpy(&x, &b, sizeof x);
    uint8_t got = nb_quant_fp8_encode(x, t);
    n++;
    if (got != code && bad++ < 5) fprintf(stderr, "%s: %.9g -> 0x%02x, ml_dtypes 0x%02x\n", name, (double)x, got, code);
  }
  fclose(f);
  CHECK_MSG(n > 3000 && bad == 0, "%d of %d fp8 encodings differ from ml_dtypes", bad, n);
}

static void test_nf4(void) {
  CHECK(nb_quant_nf4_value(0) == -1.0f && nb_quant_nf4_value(7) == 0.0f && nb_quant_nf4_value(15) == 1.0f);
  for (int c = 1; c < 16; c++) CHECK(nb_quant_nf4_value(c) > nb_quant_nf4_value(c - 1));
  nb_test_rng r = {5};
  int bad = 0;
  for (int i = 0; i < 20000; i++) {
    float x = (float)(2 * nb_test_uniform(&r) - 1);
    int c = nb_quant_nf4_encode(x);
    for (int o = 0; o < 16; o++)
      if (fabs((double)x - nb_quant_nf4_value(o)) < fabs((double)x - nb_quant_nf4_value(c))) bad++;
  }
  CHECK_MSG(bad == 0, "%d NF4 codes not the nearest", bad);
}

/* ---------------------------------------------------------------- round trips */

static nb_array *random_w(nb_ctx *ctx, int64_t n, int64_t k, uint64_t seed, double shift) {
  nb_test_rng r = {seed};
  nb_array *w = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){n, k});
  float *p = nb_array_data_mut(w);
  for (int64_t i = 0; i < n * k; i++) p[i] = (float)(0.05 * nb_test_normal(&r) + shift);
  p[0] = 0.3f; /* an outlier */
  return w;
}

/* bounds in f64 per element, from the tile's scale (and zero point) */
static void check_round_trip(nb_ctx *ctx, nb_quant_type qt, int64_t tile, nb_quant_calib_kind ck, double shift) {
  int64_t n = 5, k = 100; /* 100 = 3 x 32 + 4, 64 + 36: ragged last tiles */
  nb_array *w = random_w(ctx, n, k, 7 + (uint64_t)qt, shift);
  nb_quant_calib c = {.kind = ck, .k = 3, .min = -0.1, .max = 0.12};
  nb_quant_weight q;
  CHECK_OK(ctx, nb_quant_quantize(ctx, w, qt, tile, &c, &q));
  nb_array *d = nb_quant_dequantize(ctx, &q);
  CHECK(d != NULL);
  if (!d) return nb_array_release(w);
  const nb_quant_layout *l = &q.layout;
  int64_t T = nb_quant_num_tiles(l);
  const float *wp = nb_array_data(w), *dp = nb_array_data(d), *sp = nb_array_data(q.scales);
  const uint8_t *zp = q.zero_points ? nb_array_data(q.zero_points) : NULL;
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t t = 0; t < T; t++) {
      int64_t k0 = t * l->tile, k1 = k0 + l->tile < k ? k0 + l->tile : k;
      double lo = 0, hi = 0, ss = 0;
      for (int64_t j = k0; j < k1; j++) {
        double v = wp[i * k + j];
        lo = fmin(lo, v), hi = fmax(hi, v), ss += v * v;
      }
      if (ck == NB_QUANT_ABSMAX) hi = fmax(-lo, hi), lo = -hi;
      if (ck == NB_QUANT_RMS) hi = 3 * sqrt(ss / (double)(k1 - k0)), lo = -hi;
      if (ck == NB_QUANT_FIXED) lo = -0.1, hi = 0.12;
      double s = sp[i * T + t], amax = fmax(-lo, hi), extreme = 0;
      for (int64_t j = k0; j < k1; j++) /* the first element of largest magnitude, sign kept */
        if (fabs(wp[i * k + j]) > fabs(extreme)) extreme = wp[i * k + j];
      bool integer = qt == NB_QUANT_INT8 || qt == NB_QUANT_INT4;
      bool q4_0 = qt == NB_QUANT_INT4 && !l->asymmetric && ck == NB_QUANT_ABSMAX;
      if (!l->asymmetric) lo = -amax, hi = amax; /* symmetric ranges */
      double want_s = !integer ? (qt == NB_QUANT_NF4 ? amax : amax / nb_quant_fp8_max(qt))
                      : l->asymmetric ? (hi - lo) / (qt == NB_QUANT_INT8 ? 255 : 15)
                      : q4_0 ? extreme / -8 /* GGUF Q4_0's scale: the signed extreme is code -8 */
                             : amax / (qt == NB_QUANT_INT8 ? 127 : 7);
      if (qt == NB_QUANT_INT4 && !l->asymmetric) /* codes -8 .. 7 times a scale of either sign */
        lo = fmin(-8 * s, 7 * s), hi = fmax(-8 * s, 7 * s);
      if (fabs(s - want_s) > 1e-7 * fabs(want_s) && bad++ < 5)
        fprintf(stderr, "scale [%lld, %lld] %.9g, wanted %.9g\n", (long long)i, (long long)t, s, want_s);
      for (int64_t j = k0; j < k1; j++) {
        double v = wp[i * k + j], got = dp[i * k + j];
        double inside = fmin(fmax(v, lo), hi), err = fabs(got - inside), bound;
        if (integer) bound = fabs(s) / 2 * (1 + 1e-6) + 1e-9; /* the half step, the range clipped */
        else if (qt == NB_QUANT_NF4) {
          double best = INFINITY; /* the nearest table value in f64 */
          for (int cc = 0; cc < 16; cc++) best = fmin(best, fabs(inside / s - nb_quant_nf4_value(cc)));
          bound = (best + 1e-6) * s; /* float rounding of the normalized weight */
        } else {
          double half_ulp = (qt == NB_QUANT_FP8_E4M3 ? ldexp(1, -4) : ldexp(1, -3)); /* relative */
          double tiny = s * (qt == NB_QUANT_FP8_E4M3 ? ldexp(1, -10) : ldexp(1, -17));
          bound = fabs(inside) * half_ulp * (1 + 1e-6) + tiny;
        }
        if (err > bound && bad++ < 5)
          fprintf(stderr, "%s tile %lld calib %d: w[%lld, %lld] = %.9g -> %.9g (bound %.3g)\n", nb_quant_type_name(qt), (long long)tile,
                  (int)ck, (long long)i, (long long)j, v, got, bound);
      }
      if (zp && (zp[i * T + t] > (qt == NB_QUANT_INT8 ? 255 : 15)) && bad++ < 5) fprintf(stderr, "zero point out of range\n");
    }
  CHECK_MSG(bad == 0, "%s tile %lld calib %d: %d elements off", nb_quant_type_name(qt), (long long)tile, (int)ck, bad);
  /* the tree form carries the same arrays */
  nb_tree *tr = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_quant_weight_to_tree(tr, "layers/0/wq", &q));
  nb_quant_weight back;
  CHECK_OK(ctx, nb_quant_weight_from_tree(ctx, tr, "layers/0/wq", l, &back));
  CHECK(back.values == q.values && back.scales == q.scales && back.zero_points == q.zero_points);
  nb_quant_weight_release(&back);
  nb_tree_destroy(tr);
  nb_array_release(d);
  nb_array_release(w);
  nb_quant_weight_release(&q);
}

static void test_round_trips(nb_ctx *ctx) {
  int64_t tiles[4] = {0, 32, 64, 128};
  for (int qt = 0; qt < NB_QUANT_TYPE_COUNT; qt++)
    for (int ti = 0; ti < 4; ti++) {
      check_round_trip(ctx, (nb_quant_type)qt, tiles[ti], NB_QUANT_ABSMAX, 0);
      check_round_trip(ctx, (nb_quant_type)qt, tiles[ti], NB_QUANT_RMS, 0);
      check_round_trip(ctx, (nb_quant_type)qt, tiles[ti], NB_QUANT_FIXED, 0);
      if (qt <= NB_QUANT_INT4) check_round_trip(ctx, (nb_quant_type)qt, tiles[ti], NB_QUANT_MINMAX, 0.03);
    }
}

/* ---------------------------------------------------------------- errors */

static void test_errors(nb_ctx *ctx) {
  nb_array *w = random_w(ctx, 3, 40, 1, 0);
  nb_quant_weight q;
  nb_quant_calib absmax = {.kind = NB_QUANT_ABSMAX}, minmax = {.kind = NB_QUANT_MINMAX}, badfix = {.kind = NB_QUANT_FIXED, .min = 1, .max = 0};
  CHECK(nb_quant_quantize(ctx, w, NB_QUANT_INT8, 20, &absmax, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "tile: 20");
  CHECK(nb_quant_quantize(ctx, w, NB_QUANT_NF4, 32, &minmax, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "calibration: minmax");
  CHECK(nb_quant_quantize(ctx, w, NB_QUANT_INT8, 32, &badfix, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "calibration: fixed");
  CHECK(nb_quant_quantize(ctx, w, (nb_quant_type)9, 32, &absmax, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "qtype: 9");
  ((float *)nb_array_data(w))[2 * 40 + 7] = NAN;
  CHECK(nb_quant_quantize(ctx, w, NB_QUANT_INT4, 32, &absmax, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "w: element [2, 7]");
  nb_array *i32 = nb_array_zeros(ctx, NB_I32, 2, (int64_t[]){3, 40});
  CHECK(nb_quant_quantize(ctx, i32, NB_QUANT_INT4, 32, &absmax, &q) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "w: f32[n, k]");
  nb_quant_type t;
  nb_quant_calib c;
  CHECK(nb_quant_type_parse(ctx, "int3", &t) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "qtype: 'int3'");
  CHECK(nb_quant_type_parse(ctx, "fp8_e5m2", &t) == NB_OK && t == NB_QUANT_FP8_E5M2);
  CHECK(nb_quant_calib_parse(ctx, "rms,2.5", &c) == NB_OK && c.kind == NB_QUANT_RMS && c.k == 2.5);
  CHECK(nb_quant_calib_parse(ctx, "fixed,-1,2", &c) == NB_OK && c.kind == NB_QUANT_FIXED && c.min == -1 && c.max == 2);
  CHECK(nb_quant_calib_parse(ctx, "rms,-1", &c) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "calibration: 'rms,-1'");
  CHECK(nb_quant_calib_parse(ctx, "fixed,2,1", &c) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "calibration:");
  /* a weight whose arrays do not fit its layout */
  ((float *)nb_array_data(w))[2 * 40 + 7] = 0;
  CHECK_OK(ctx, nb_quant_quantize(ctx, w, NB_QUANT_INT4, 32, &minmax, &q));
  nb_quant_weight bad = q;
  bad.scales = q.zero_points;
  CHECK(nb_quant_weight_check(ctx, &bad) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "scales: f32[3, 2]");
  bad = q, bad.zero_points = NULL;
  CHECK(nb_quant_weight_check(ctx, &bad) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "zero_points: missing");
  bad = q, bad.layout.k = 41;
  CHECK(nb_quant_weight_check(ctx, &bad) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "values: u8[3, 21]");
  nb_tree *tr = nb_tree_create(ctx);
  nb_quant_weight back;
  CHECK(nb_quant_weight_from_tree(ctx, tr, "wq", &q.layout, &back) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "wq: values: missing");
  nb_tree_destroy(tr);
  nb_quant_weight_release(&q);
  nb_array_release(i32);
  nb_array_release(w);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_fp8_known();
  test_fp8_encode_model();
  test_fp8_ml_dtypes();
  test_nf4();
  test_round_trips(ctx);
  test_errors(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_codec");
}
