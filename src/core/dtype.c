/* Dtypes and shapes: names, sizes, element load/store by dtype, and the
 * round-to-nearest-even conversions to and from bf16/f16. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

typedef struct dtype_info {
  const char *name;
  size_t size;
  bool is_float, is_int, is_unsigned;
} dtype_info;

static const dtype_info dtypes[NB_DTYPE_COUNT] = {
    [NB_F32] = {"f32", 4, true, false, false},   [NB_F64] = {"f64", 8, true, false, false},
    [NB_BF16] = {"bf16", 2, true, false, false}, [NB_F16] = {"f16", 2, true, false, false},
    [NB_I8] = {"i8", 1, false, true, false},     [NB_U8] = {"u8", 1, false, true, true},
    [NB_I32] = {"i32", 4, false, true, false},   [NB_I64] = {"i64", 8, false, true, false},
    [NB_U32] = {"u32", 4, false, true, true},    [NB_BOOL] = {"bool", 1, false, false, false},
};

static bool valid(nb_dtype t) { return t >= 0 && t < NB_DTYPE_COUNT; }
const char *nb_dtype_name(nb_dtype t) { return valid(t) ? dtypes[t].name : "invalid-dtype"; }
size_t nb_dtype_size(nb_dtype t) { return valid(t) ? dtypes[t].size : 0; }
bool nb_dtype_is_float(nb_dtype t) { return valid(t) && dtypes[t].is_float; }
bool nb_dtype_is_int(nb_dtype t) { return valid(t) && dtypes[t].is_int; }
bool nb_dtype_is_unsigned(nb_dtype t) { return valid(t) && dtypes[t].is_unsigned; }

bool nb_dtype_from_name(const char *name, nb_dtype *out) {
  static const struct { const char *alias; nb_dtype t; } aliases[] = {
      {"float32", NB_F32}, {"float64", NB_F64}, {"bfloat16", NB_BF16}, {"float16", NB_F16},
      {"int8", NB_I8},     {"uint8", NB_U8},    {"int32", NB_I32},     {"int64", NB_I64},
      {"uint32", NB_U32},
  };
  for (int t = 0; t < NB_DTYPE_COUNT; t++)
    if (strcmp(name, dtypes[t].name) == 0) return *out = (nb_dtype)t, true;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) return *out = aliases[i].t, true;
  return false;
}

/* bf16 is the top half of an f32: round the dropped 16 bits to nearest even. */
uint16_t nb_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)((u + rounding) >> 16);
}

float nb_bf16_to_f32(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t nb_f32_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu)); /* NaN */
  if (absu >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536 (and inf): inf */
  if (absu < 0x38800000u) {             /* below the smallest normal f16: subnormal */
    if (absu < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to zero */
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; /* value = mant * 2^(exp-150); f16 unit is 2^-24 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits */
  uint32_t v = absu - ((127u - 15u) << 23);
  uint32_t q = v >> 13;
  uint32_t rem = v & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* may carry into exponent: fine */
  return (uint16_t)(sign | q);
}

float nb_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while (!(mant & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double nb__load_f64(nb_dtype t, const void *base, int64_t i) {
  switch (t) {
  case NB_F32: return ((const float *)base)[i];
  case NB_F64: return ((const double *)base)[i];
  case NB_BF16: return nb_bf16_to_f32(((const uint16_t *)base)[i]);
  case NB_F16: return nb_f16_to_f32(((const uint16_t *)base)[i]);
  case NB_I8: return ((const int8_t *)base)[i];
  case NB_U8: return ((const uint8_t *)base)[i];
  case NB_I32: return ((const int32_t *)base)[i];
  case NB_I64: return (double)((const int64_t *)base)[i];
  case NB_U32: return ((const uint32_t *)base)[i];
  case NB_BOOL: return ((const uint8_t *)base)[i] ? 1.0 : 0.0;
  default: return 0;
  }
}

int64_t nb__load_i64(nb_dtype t, const void *base, int64_t i) {
  switch (t) {
  case NB_I8: return ((const int8_t *)base)[i];
  case NB_U8: return ((const uint8_t *)base)[i];
  case NB_I32: return ((const int32_t *)base)[i];
  case NB_I64: return ((const int64_t *)base)[i];
  case NB_U32: return ((const uint32_t *)base)[i];
  case NB_BOOL: return ((const uint8_t *)base)[i] ? 1 : 0;
  default: {
    double v = nb__load_f64(t, base, i);
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
  }
  }
}

/* Float -> int conversion: truncate toward zero, saturate, NaN -> 0. */
static int64_t sat(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

void nb__store_f64(nb_dtype t, void *base, int64_t i, double v) {
  switch (t) {
  case NB_F32: ((float *)base)[i] = (float)v; break;
  case NB_F64: ((double *)base)[i] = v; break;
  case NB_BF16: ((uint16_t *)base)[i] = nb_f32_to_bf16((float)v); break;
  case NB_F16: ((uint16_t *)base)[i] = nb_f32_to_f16((float)v); break;
  case NB_I8: ((int8_t *)base)[i] = (int8_t)sat(v, -128, 127); break;
  case NB_U8: ((uint8_t *)base)[i] = (uint8_t)sat(v, 0, 255); break;
  case NB_I32: ((int32_t *)base)[i] = (int32_t)sat(v, -2147483648.0, 2147483647.0); break;
  case NB_I64: ((int64_t *)base)[i] = v != v ? 0 : v >= 9.2233720368547758e18 ? INT64_MAX : v <= -9.2233720368547758e18 ? INT64_MIN : (int64_t)v; break;
  case NB_U32: ((uint32_t *)base)[i] = (uint32_t)sat(v, 0, 4294967295.0); break;
  case NB_BOOL: ((uint8_t *)base)[i] = v != 0; break;
  default: break;
  }
}

/* Integer stores wrap (two's complement), as XLA's integer converts do. */
void nb__store_i64(nb_dtype t, void *base, int64_t i, int64_t v) {
  switch (t) {
  case NB_I8: ((int8_t *)base)[i] = (int8_t)(uint8_t)v; break;
  case NB_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
  case NB_I32: ((int32_t *)base)[i] = (int32_t)(uint32_t)v; break;
  case NB_I64: ((int64_t *)base)[i] = v; break;
  case NB_U32: ((uint32_t *)base)[i] = (uint32_t)v; break;
  case NB_BOOL: ((uint8_t *)base)[i] = v != 0; break;
  default: nb__store_f64(t, base, i, (double)v); break;
  }
}

void nb_convert_elements(nb_dtype to, void *dst, nb_dtype from, const void *src, int64_t n) {
  if (to == from) {
    memcpy(dst, src, (size_t)n * nb_dtype_size(to));
    return;
  }
  bool int_path = !nb_dtype_is_float(from) && !nb_dtype_is_float(to);
  if (from == NB_F64 && (to == NB_F16)) {
    /* Avoid double rounding f64 -> f32 -> f16 where it matters: round via
     * the nearest f32 that preserves the sticky bit. */
    for (int64_t i = 0; i < n; i++) {
      double v = ((const double *)src)[i];
      float f = (float)v;
      if ((double)f != v && v == v && isfinite(v)) {
        uint32_t u;
        memcpy(&u, &f, 4);
        if (((double)f > v) == (v > 0)) u -= 1; /* truncate toward zero, then set sticky */
        u |= 1;
        memcpy(&f, &u, 4);
      }
      ((uint16_t *)dst)[i] = nb_f32_to_f16(f);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    if (int_path) nb__store_i64(to, dst, i, nb__load_i64(from, src, i));
    else nb__store_f64(to, dst, i, nb__load_f64(from, src, i));
  }
}

nb_shape nb_shape_make(int rank, const int64_t *dims) {
  nb_shape s;
  memset(&s, 0, sizeof s);
  s.rank = rank < 0 ? 0 : rank > NB_MAX_RANK ? NB_MAX_RANK : rank;
  for (int i = 0; i < s.rank; i++) s.dims[i] = dims[i];
  return s;
}

int64_t nb_shape_size(const nb_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

bool nb_shape_equal(const nb_shape *a, const nb_shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

nb_aval nb_aval_make(nb_dtype t, int rank, const int64_t *dims) {
  nb_aval a;
  memset(&a, 0, sizeof a);
  a.dtype = t;
  a.shape = nb_shape_make(rank, dims);
  return a;
}

bool nb_aval_equal(const nb_aval *a, const nb_aval *b) {
  return a->dtype == b->dtype && nb_shape_equal(&a->shape, &b->shape);
}

char *nb_aval_str(const nb_aval *a, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "%s[", nb_dtype_name(a->dtype));
  for (int i = 0; i < a->shape.rank && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)a->shape.dims[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

void nb__strides(const nb_shape *s, int64_t *strides) {
  int64_t st = 1;
  for (int i = s->rank - 1; i >= 0; i--) {
    strides[i] = st;
    st *= s->dims[i];
  }
}
