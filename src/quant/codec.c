/* Quantized weights on the host: the element codecs (fp8, NF4), the
 * layout's shapes and checks, quantize / dequantize tile by tile, and the
 * tree form. The formulas here are the definitions the kernels and the
 * traced reference reproduce (docs/quant.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/internal.h"

/* ---------------------------------------------------------------- names */

static const char *const type_names[NB_QUANT_TYPE_COUNT] = {"int8", "int4", "nf4", "fp8_e4m3", "fp8_e5m2"};

const char *nb_quant_type_name(nb_quant_type t) { return (unsigned)t < NB_QUANT_TYPE_COUNT ? type_names[t] : "?"; }

nb_status nb_quant_type_parse(nb_ctx *ctx, const char *s, nb_quant_type *out) {
  for (int t = 0; s && t < NB_QUANT_TYPE_COUNT; t++)
    if (strcmp(s, type_names[t]) == 0) return *out = (nb_quant_type)t, NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "qtype: '%s' is none of int8, int4, nf4, fp8_e4m3, fp8_e5m2", s ? s : "(null)");
}

nb_status nb_quant_calib_parse(nb_ctx *ctx, const char *s, nb_quant_calib *out) {
  char tail;
  double a, b;
  if (!s) s = "(null)";
  if (strcmp(s, "absmax") == 0) return *out = (nb_quant_calib){.kind = NB_QUANT_ABSMAX}, NB_OK;
  if (strcmp(s, "minmax") == 0) return *out = (nb_quant_calib){.kind = NB_QUANT_MINMAX}, NB_OK;
  if (sscanf(s, "rms,%lf%c", &a, &tail) == 1 && a > 0 && isfinite(a))
    return *out = (nb_quant_calib){.kind = NB_QUANT_RMS, .k = a}, NB_OK;
  if (sscanf(s, "fixed,%lf,%lf%c", &a, &b, &tail) == 2 && isfinite(a) && isfinite(b) && a < b)
    return *out = (nb_quant_calib){.kind = NB_QUANT_FIXED, .min = a, .max = b}, NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                   "calibration: '%s' is none of absmax, minmax, rms,K (K > 0), fixed,MIN,MAX (finite, MIN < MAX)", s);
}

/* ---------------------------------------------------------------- fp8 */

typedef struct fp8_format {
  int mbits, bias, emax_field; /* emax_field: the largest exponent field of a finite value */
  bool has_inf;                /* e5m2: exponent field 31 is inf (m = 0) or NaN; e4m3fn: only s1111111 is NaN */
  float max;
} fp8_format;

static fp8_format fp8_of(nb_quant_type t) {
  return t == NB_QUANT_FP8_E5M2 ? (fp8_format){2, 15, 30, true, 57344.0f} : (fp8_format){3, 7, 15, false, 448.0f};
}

float nb_quant_fp8_max(nb_quant_type t) { return fp8_of(t).max; }

float nb_quant_fp8_decode(uint8_t code, nb_quant_type t) {
  fp8_format f = fp8_of(t);
  int e = (code & 0x7f) >> f.mbits, m = code & ((1 << f.mbits) - 1);
  double sign = code & 0x80 ? -1.0 : 1.0;
  if (f.has_inf && e == 31) return m == 0 ? (float)(sign * INFINITY) : NAN;
  if (!f.has_inf && e == 15 && m == 7) return NAN;
  double v = e == 0 ? ldexp(m, 1 - f.bias - f.mbits) : ldexp(1.0 + ldexp(m, -f.mbits), e - f.bias);
  return (float)(sign * v);
}

/* In double, exactly: the quantum of |x|'s binade (the subnormal one below
 * the smallest normal), |x| / quantum rounded to nearest even, and the
 * result's fields. Saturating: |x| is first clamped to the largest finite
 * value, a point of the grid, so rounding never passes it. */
uint8_t nb_quant_fp8_encode(float x, nb_quant_type t) {
  fp8_format f = fp8_of(t);
  uint8_t sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return (uint8_t)(sign | (f.has_inf ? 0x7e : 0x7f));
  if (isinf(x) && f.has_inf) return (uint8_t)(sign | 0x7c);
  double a = fabs((double)x);
  if (a > f.max) a = f.max;
  if (a == 0) return sign;
  int e2;
  frexp(a, &e2);
  int e = e2 - 1 < 1 - f.bias ? 1 - f.bias : e2 - 1;
  double r = nearbyint(ldexp(a, f.mbits - e)); /* in [0, 2^(mbits+1)] */
  int one = 1 << f.mbits;
  if (e == 1 - f.bias && r < one) return (uint8_t)(sign | (int)r); /* subnormal (or 0) */
  if (r == 2 * one) e++, r = one;
  return (uint8_t)(sign | (e + f.bias) << f.mbits | ((int)r - one));
}

/* ---------------------------------------------------------------- nf4 */

/* QLoRA's NormalFloat4 (bitsandbytes' create_normal_map): the quantiles of
 * N(0, 1) scaled to [-1, 1], 0 exact. */
const float nb_quant__nf4_table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

float nb_quant_nf4_value(int code) { return nb_quant__nf4_table[code & 15]; }

uint8_t nb_quant_nf4_encode(float x) {
  int best = 0;
  for (int c = 1; c < 16; c++)
    if (fabsf(x - nb_quant__nf4_table[c]) < fabsf(x - nb_quant__nf4_table[best])) best = c;
  return (uint8_t)best;
}

/* ---------------------------------------------------------------- layout */

int64_t nb_quant_num_tiles(const nb_quant_layout *l) { return l->tile >= l->k ? 1 : (l->k + l->tile - 1) / l->tile; }

static bool packed4(nb_quant_type t) { return t == NB_QUANT_INT4 || t == NB_QUANT_NF4; }

int64_t nb_quant__row_bytes(const nb_quant_layout *l) { return packed4(l->qtype) ? (l->k + 1) / 2 : l->k; }

static nb_aval aval2(nb_dtype t, int64_t a, int64_t b) {
  nb_aval v = {.dtype = t};
  v.shape.rank = 2, v.shape.dims[0] = a, v.shape.dims[1] = b;
  return v;
}

nb_aval nb_quant_values_aval(const nb_quant_layout *l) {
  bool signed8 = l->qtype == NB_QUANT_INT8 && !l->asymmetric;
  return aval2(signed8 ? NB_I8 : NB_U8, l->n, nb_quant__row_bytes(l));
}
nb_aval nb_quant_scales_aval(const nb_quant_layout *l) { return aval2(NB_F32, l->n, nb_quant_num_tiles(l)); }
nb_aval nb_quant_zero_points_aval(const nb_quant_layout *l) { return aval2(NB_U8, l->n, nb_quant_num_tiles(l)); }

bool nb_quant__layout_ok(const nb_quant_layout *l, char *why, size_t cap) {
  if (!l) return snprintf(why, cap, "layout: NULL"), false;
  if ((unsigned)l->qtype >= NB_QUANT_TYPE_COUNT) return snprintf(why, cap, "qtype: %d is no quant type", (int)l->qtype), false;
  if (l->n <= 0 || l->n > INT32_MAX) return snprintf(why, cap, "n: %lld outputs (want 1 .. 2^31-1)", (long long)l->n), false;
  if (l->k <= 0 || l->k > INT32_MAX) return snprintf(why, cap, "k: %lld inputs (want 1 .. 2^31-1)", (long long)l->k), false;
  if (l->tile <= 0 || (l->tile < l->k && l->tile % 16 != 0))
    return snprintf(why, cap, "tile: %lld is neither a positive multiple of 16 nor >= k = %lld (per-channel)", (long long)l->tile,
                    (long long)l->k), false;
  bool integer = l->qtype == NB_QUANT_INT8 || l->qtype == NB_QUANT_INT4;
  if (l->asymmetric && !integer)
    return snprintf(why, cap, "asymmetric: %s has no zero points (int8 and int4 only)", nb_quant_type_name(l->qtype)), false;
  return true;
}

nb_status nb_quant_layout_check(nb_ctx *ctx, const nb_quant_layout *l) {
  char why[200];
  return nb_quant__layout_ok(l, why, sizeof why) ? NB_OK : nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s", why);
}

static const char *const act_names[NB_QUANT_ACT_COUNT] = {"none", "int8_dynamic", "int8_block", "int8_static"};
const char *nb_quant_act_name(nb_quant_act a) { return (unsigned)a < NB_QUANT_ACT_COUNT ? act_names[a] : "?"; }

/* W8A8 multiplies int8 activations by integer codes: int8 symmetric
 * weights (per row), int8 or int4 symmetric (per block: any tile, since
 * every tile is a multiple of 16 and the kernels scale each half block of
 * 16 by its own tile) */
bool nb_quant__act_ok(const nb_quant_layout *l, nb_quant_act act, char *why, size_t cap) {
  if ((unsigned)act >= NB_QUANT_ACT_COUNT) return snprintf(why, cap, "act: %d is no activation mode", (int)act), false;
  int64_t tile = l->tile < l->k ? l->tile : l->k;
  bool per_row = act == NB_QUANT_ACT_INT8_DYNAMIC || act == NB_QUANT_ACT_INT8_STATIC;
  if (per_row && (l->qtype != NB_QUANT_INT8 || l->asymmetric))
    return snprintf(why, cap, "act: int8 %s activations need int8 symmetric weights, not %s%s",
                    act == NB_QUANT_ACT_INT8_STATIC ? "static" : "dynamic", nb_quant_type_name(l->qtype),
                    l->asymmetric ? " asymmetric" : ""), false;
  if (per_row && tile > NB_QUANT__MAX_INT_TILE)
    return snprintf(why, cap, "tile: W8A8 sums a tile in int32: at most %d, got %lld", NB_QUANT__MAX_INT_TILE, (long long)tile), false;
  if (act == NB_QUANT_ACT_INT8_BLOCK && ((l->qtype != NB_QUANT_INT8 && l->qtype != NB_QUANT_INT4) || l->asymmetric))
    return snprintf(why, cap, "act: int8_block activations need int8 or int4 symmetric weights, not %s%s", nb_quant_type_name(l->qtype),
                    l->asymmetric ? " asymmetric" : ""), false;
  return true;
}

nb_status nb_quant_act_check(nb_ctx *ctx, const nb_quant_layout *l, nb_quant_act act) {
  char why[240];
  if (!nb_quant__layout_ok(l, why, sizeof why) || !nb_quant__act_ok(l, act, why, sizeof why))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s", why);
  return NB_OK;
}

static nb_status check_array(nb_ctx *ctx, const char *field, const nb_array *a, nb_aval want) {
  if (!a) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: missing", field);
  nb_aval got = nb_array_aval(a);
  if (got.dtype != want.dtype || !nb_shape_equal(&got.shape, &want.shape))
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: %s[%lld, %lld] wanted, got %s of rank %d", field, nb_dtype_name(want.dtype),
                     (long long)want.shape.dims[0], (long long)want.shape.dims[1], nb_dtype_name(got.dtype), got.shape.rank);
  return NB_OK;
}

nb_status nb_quant_weight_check(nb_ctx *ctx, const nb_quant_weight *w) {
  nb_status st = nb_quant_layout_check(ctx, &w->layout);
  if (st == NB_OK) st = check_array(ctx, "values", w->values, nb_quant_values_aval(&w->layout));
  if (st == NB_OK) st = check_array(ctx, "scales", w->scales, nb_quant_scales_aval(&w->layout));
  if (st == NB_OK && w->layout.asymmetric) st = check_array(ctx, "zero_points", w->zero_points, nb_quant_zero_points_aval(&w->layout));
  if (st == NB_OK && !w->layout.asymmetric && w->zero_points)
    st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "zero_points: given for a symmetric layout");
  return st;
}

void nb_quant_weight_release(nb_quant_weight *w) {
  if (!w) return;
  nb_array_release(w->values), nb_array_release(w->scales), nb_array_release(w->zero_points);
  w->values = w->scales = w->zero_points = NULL;
}

nb_status nb_quant_weight_to_tree(nb_tree *t, const char *prefix, const nb_quant_weight *w) {
  char path[1024];
  const char *names[3] = {"values", "scales", "zero_points"};
  nb_array *arrays[3] = {w->values, w->scales, w->zero_points};
  for (int i = 0; i < 3; i++) {
    if (!arrays[i]) continue;
    snprintf(path, sizeof path, "%s/%s", prefix, names[i]);
    nb_status st = nb_tree_set_array(t, path, arrays[i]);
    if (st != NB_OK) return st;
  }
  return NB_OK;
}

nb_status nb_quant_weight_from_tree(nb_ctx *ctx, const nb_tree *t, const char *prefix, const nb_quant_layout *layout,
                                    nb_quant_weight *out) {
  char path[1024];
  nb_quant_weight w = {.layout = *layout};
  snprintf(path, sizeof path, "%s/values", prefix), w.values = nb_tree_get_array(t, path);
  snprintf(path, sizeof path, "%s/scales", prefix), w.scales = nb_tree_get_array(t, path);
  snprintf(path, sizeof path, "%s/zero_points", prefix), w.zero_points = nb_tree_get_array(t, path);
  nb_status st = nb_quant_weight_check(ctx, &w);
  if (st != NB_OK) return nb_errorf(ctx, st, "%s: %s", prefix, nb_ctx_error(ctx));
  nb_array_retain(w.values), nb_array_retain(w.scales);
  if (w.zero_points) nb_array_retain(w.zero_points);
  *out = w;
  return NB_OK;
}

/* ---------------------------------------------------------------- quantize */

/* The code range of an integer type: symmetric int8 [-127, 127], symmetric
 * int4 [-8, 7] (stored with +8: codes 0..15, as GGUF's Q4_0), asymmetric
 * [0, umax]. */
static int sym_qmax(nb_quant_type t) { return t == NB_QUANT_INT8 ? 127 : 7; }
static int sym_qmin(nb_quant_type t) { return t == NB_QUANT_INT8 ? -127 : -8; }
static int asym_qmax(nb_quant_type t) { return t == NB_QUANT_INT8 ? 255 : 15; }

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The calibrated range [lo, hi] of one tile, and (absmax) the tile's signed
 * extreme: the first element of largest magnitude, sign kept. */
static void tile_range(const float *w, int64_t len, const nb_quant_calib *c, double *lo, double *hi, double *extreme) {
  double mn = 0, mx = 0, amax = 0, ss = 0;
  *extreme = 0;
  for (int64_t i = 0; i < len; i++) {
    double v = w[i];
    if (fabs(v) > amax) amax = fabs(v), *extreme = v;
    mn = v < mn ? v : mn, mx = v > mx ? v : mx, ss += v * v;
  }
  switch (c->kind) {
  case NB_QUANT_MINMAX: *lo = mn, *hi = mx; break;
  case NB_QUANT_RMS: *hi = c->k * sqrt(ss / (double)len), *lo = -*hi; break;
  case NB_QUANT_FIXED: *lo = c->min < 0 ? c->min : 0, *hi = c->max > 0 ? c->max : 0; break;
  default: *lo = -amax, *hi = amax; break;
  }
}

/* Codes of one tile of row n into the row's bytes, its scale and zero point. */
static void quantize_tile(const nb_quant_layout *l, const float *w, int64_t k0, int64_t len, const nb_quant_calib *c,
                          uint8_t *row, float *scale, uint8_t *zp) {
  double lo, hi, extreme;
  tile_range(w + k0, len, c, &lo, &hi, &extreme);
  double amax = fmax(fabs(lo), fabs(hi));
  float s;
  int z = 0;
  switch (l->qtype) {
  case NB_QUANT_INT8:
  case NB_QUANT_INT4:
    if (l->asymmetric) {
      int qm = asym_qmax(l->qtype);
      s = (float)((hi - lo) / qm);
      z = s > 0 ? (int)clampd(nearbyint(-lo / s), 0, qm) : 0;
    } else if (l->qtype == NB_QUANT_INT4 && c->kind == NB_QUANT_ABSMAX) {
      /* Q4_0's choice: the signed extreme is code -8 exactly (the scale is
       * negative when it is positive), so all 16 codes are used; the other
       * side reaches 8 |s| and saturates at 7 |s| */
      s = (float)(extreme / -8);
      z = 8;
    } else {
      s = (float)(amax / sym_qmax(l->qtype));
      z = l->qtype == NB_QUANT_INT4 ? 8 : 0;
    }
    break;
  case NB_QUANT_NF4: s = (float)amax; break;
  default: s = (float)(amax / nb_quant_fp8_max(l->qtype)); break;
  }
  *scale = s;
  if (zp) *zp = (uint8_t)z;
  for (int64_t i = 0; i < len; i++) {
    int64_t k = k0 + i;
    double r = s != 0 ? (double)w[k] / s : 0;
    uint8_t code;
    switch (l->qtype) {
    case NB_QUANT_INT8:
    case NB_QUANT_INT4: {
      double lo_code = l->asymmetric ? 0 : sym_qmin(l->qtype) + z, hi_code = l->asymmetric ? asym_qmax(l->qtype) : sym_qmax(l->qtype) + z;
      code = (uint8_t)(int)clampd(nearbyint(r) + z, lo_code, hi_code); /* int8 symmetric: the i8's bits */
      break;
    }
    case NB_QUANT_NF4: code = nb_quant_nf4_encode((float)clampd(r, -1, 1)); break;
    default: code = nb_quant_fp8_encode((float)r, l->qtype); break;
    }
    if (packed4(l->qtype)) row[k / 2] |= (uint8_t)(k % 2 ? code << 4 : code);
    else row[k] = code;
  }
}

nb_status nb_quant_quantize(nb_ctx *ctx, const nb_array *w, nb_quant_type qtype, int64_t tile, const nb_quant_calib *calib,
                            nb_quant_weight *out) {
  memset(out, 0, sizeof *out);
  if (!w || nb_array_dtype(w) != NB_F32 || nb_array_rank(w) != 2)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "w: f32[n, k] wanted%s", w ? "" : " (got NULL)");
  nb_quant_calib absmax = {.kind = NB_QUANT_ABSMAX};
  if (!calib) calib = &absmax;
  if ((unsigned)calib->kind > NB_QUANT_FIXED) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "calibration: kind %d unknown", (int)calib->kind);
  if (calib->kind == NB_QUANT_RMS && !(calib->k > 0 && isfinite(calib->k)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "calibration: rms,K needs a finite K > 0");
  if (calib->kind == NB_QUANT_FIXED && !(isfinite(calib->min) && isfinite(calib->max) && calib->min < calib->max))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "calibration: fixed,MIN,MAX needs finite MIN < MAX");
  bool integer = qtype == NB_QUANT_INT8 || qtype == NB_QUANT_INT4;
  if (calib->kind == NB_QUANT_MINMAX && !integer && (unsigned)qtype < NB_QUANT_TYPE_COUNT)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "calibration: minmax is asymmetric, %s is symmetric (use absmax)", nb_quant_type_name(qtype));
  const int64_t *d = nb_array_dims(w);
  nb_quant_layout l = {.qtype = qtype, .n = d[0], .k = d[1], .tile = tile == 0 || tile > d[1] ? d[1] : tile,
                       .asymmetric = integer && (calib->kind == NB_QUANT_MINMAX || calib->kind == NB_QUANT_FIXED)};
  nb_status st = nb_quant_layout_check(ctx, &l);
  if (st != NB_OK) return st;
  const float *src = nb_array_data(w);
  for (int64_t i = 0; i < l.n * l.k; i++)
    if (!isfinite(src[i]))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "w: element [%lld, %lld] is %g (not finite)", (long long)(i / l.k),
                       (long long)(i % l.k), (double)src[i]);
  int64_t T = nb_quant_num_tiles(&l), rb = nb_quant__row_bytes(&l);
  nb_aval va = nb_quant_values_aval(&l), sa = nb_quant_scales_aval(&l), za = nb_quant_zero_points_aval(&l);
  out->layout = l;
  out->values = nb_array_zeros(ctx, va.dtype, 2, va.shape.dims);
  out->scales = nb_array_empty(ctx, NB_F32, 2, sa.shape.dims);
  out->zero_points = l.asymmetric ? nb_array_empty(ctx, NB_U8, 2, za.shape.dims) : NULL;
  if (!out->values || !out->scales || (l.asymmetric && !out->zero_points)) {
    nb_quant_weight_release(out);
    return nb_errorf(ctx, NB_ERR_NOMEM, "quantize: out of memory");
  }
  uint8_t *vals = nb_array_data_mut(out->values), *zps = out->zero_points ? nb_array_data_mut(out->zero_points) : NULL;
  float *scales = nb_array_data_mut(out->scales);
  for (int64_t n = 0; n < l.n; n++)
    for (int64_t t = 0; t < T; t++) {
      int64_t k0 = t * l.tile, len = l.k - k0 < l.tile ? l.k - k0 : l.tile;
      quantize_tile(&l, src + n * l.k, k0, len, calib, vals + n * rb, scales + n * T + t, zps ? zps + n * T + t : NULL);
    }
  return NB_OK;
}

/* ---------------------------------------------------------------- dequantize */

nb_array *nb_quant_dequantize(nb_ctx *ctx, const nb_quant_weight *w) {
  if (nb_quant_weight_check(ctx, w) != NB_OK) return NULL;
  const nb_quant_layout *l = &w->layout;
  int64_t T = nb_quant_num_tiles(l), rb = nb_quant__row_bytes(l);
  nb_array *out = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){l->n, l->k});
  if (!out) return NULL;
  float *y = nb_array_data_mut(out);
  const uint8_t *v = nb_array_data(w->values), *zp = w->zero_points ? nb_array_data(w->zero_points) : NULL;
  const float *s = nb_array_data(w->scales);
  for (int64_t n = 0; n < l->n; n++)
    for (int64_t k = 0; k < l->k; k++) {
      int64_t t = k / l->tile;
      float sc = s[n * T + t];
      int z = zp ? zp[n * T + t] : l->qtype == NB_QUANT_INT4 ? 8 : 0;
      const uint8_t *row = v + n * rb;
      float val;
      switch (l->qtype) {
      case NB_QUANT_INT8: val = (float)((l->asymmetric ? (int)row[k] : (int)(int8_t)row[k]) - z); break;
      case NB_QUANT_INT4: val = (float)(((row[k / 2] >> (4 * (k % 2))) & 15) - z); break;
      case NB_QUANT_NF4: val = nb_quant__nf4_table[(row[k / 2] >> (4 * (k % 2))) & 15]; break;
      default: val = nb_quant_fp8_decode(row[k], l->qtype); break;
      }
      y[n * l->k + k] = val * sc;
    }
  return out;
}
