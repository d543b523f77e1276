/* Random numbers: the threefry2x32 primitive (the Threefry-2x32 block cipher,
 * 20 rounds, as JAX's) and the samplers built on it as ordinary traced ops,
 * so jit, vmap and grad see plain equations. Streams match JAX's threefry
 * implementation in either layout (the context's nb_prng_impl:
 * jax_threefry_partitionable False or True): keys, split, fold_in,
 * random_bits and uniform bit for bit; normal up to erf_inv's rounding. Not here: stateful generators (keys are
 * values, passed explicitly) and other bit generators (rbg, philox). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- the block cipher */

static uint32_t rotl32(uint32_t x, unsigned r) { return (x << r) | (x >> (32u - r)); }

/* Encrypts the pair (x0, x1) under the key (k0, k1): 5 groups of 4 rounds,
 * alternating the two rotation schedules; after each group a key word is
 * injected into each lane (the schedule k0, k1, k0^k1^C rotating by one per
 * group) and the group number into lane 1. */
static void threefry_block(uint32_t k0, uint32_t k1, uint32_t *x0, uint32_t *x1) {
  static const unsigned rotations[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t a = *x0 + ks[0], b = *x1 + ks[1];
  for (unsigned group = 0; group < 5; group++) {
    for (int r = 0; r < 4; r++) {
      a += b;
      b = rotl32(b, rotations[group % 2][r]) ^ a;
    }
    a += ks[(group + 1) % 3];
    b += ks[(group + 2) % 3] + group + 1;
  }
  *x0 = a;
  *x1 = b;
}

static nb_status threefry_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                size_t cap) {
  *nout = 2;
  if (nin != 4) return snprintf(why, cap, "takes 4 operands (k0, k1, x0, x1), got %d", nin), NB_ERR_INVALID_ARG;
  for (int i = 0; i < 4; i++) {
    if (in[i].dtype != NB_U32) return snprintf(why, cap, "operand %d must be u32, not %s", i, nb_dtype_name(in[i].dtype)), NB_ERR_DTYPE;
    if (!nb_shape_equal(&in[i].shape, &in[0].shape)) return snprintf(why, cap, "operand shapes differ"), NB_ERR_SHAPE;
  }
  out[0] = out[1] = in[2];
  return NB_OK;
}

static nb_status threefry_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const uint32_t *k0 = nb_array_data(in[0]), *k1 = nb_array_data(in[1]), *x0 = nb_array_data(in[2]),
                 *x1 = nb_array_data(in[3]);
  uint32_t *y0 = nb_array_data_mut(out[0]), *y1 = nb_array_data_mut(out[1]);
  int64_t n = nb_array_size(out[0]);
  for (int64_t i = 0; i < n; i++) {
    uint32_t a = x0[i], b = x1[i];
    threefry_block(k0[i], k1[i], &a, &b);
    y0[i] = a;
    y1[i] = b;
  }
  return NB_OK;
}

/* About 80 integer operations per pair (20 rounds of add/rotate/xor, the key
 * schedule and the injections), counted as flops for roofline purposes. */
static void threefry_cost(const nb_eqn *e, double *flops, double *bytes) {
  double n = (double)nb_shape_size(&e->out[0]->aval.shape);
  *flops = 80 * n;
  *bytes = 6 * 4 * n;
}

/* Integer outputs only, so there is no JVP: the transformations treat the
 * outputs as constants. vmap is the elementwise rule. */
const nb_prim_rules nb__prim_threefry2x32 = {
    .name = "threefry2x32",
    .kind = NB_KIND_ELEMENTWISE,
    .infer = threefry_infer,
    .eval = threefry_eval,
    .batch = nb__ew_batch,
    .cost = threefry_cost,
};

void nb_threefry2x32_at(nb_loc loc, nb_val *k0, nb_val *k1, nb_val *x0, nb_val *x1, nb_val **y0, nb_val **y1) {
  nb_val *ops[4] = {k0, k1, x0, x1}, *outs[2] = {NULL, NULL};
  nb_graph *g = nb__graph_of(loc, 4, ops);
  if (g) {
    if (!k0 || !k1 || !x0 || !x1) {
      nb__fail(g, loc, NB_ERR_INVALID_ARG, "threefry2x32: NULL operand");
    } else if (!nb_graph_status(g)) {
      /* NumPy broadcasting of the four operands to their common shape */
      for (int i = 1; i < 4; i++) nb__broadcast_pair(loc, &ops[0], &ops[i], "threefry2x32");
      for (int i = 1; i < 4; i++) nb__broadcast_pair(loc, &ops[0], &ops[i], "threefry2x32");
      nb__emit(g, loc, NB_PRIM_threefry2x32, 4, ops, NULL, 0, NULL, outs);
    }
    if (nb_graph_status(g)) outs[0] = outs[1] = nb__poison(g);
  }
  if (y0) *y0 = outs[0];
  if (y1) *y1 = outs[1];
}

/* ---------------------------------------------------------------- traced helpers */

/* Key layout: u32[2] = (k0, k1). */

static nb_val *u32c(nb_loc l, nb_graph *g, uint64_t v) { return nb_scalar_at(l, g, NB_U32, (double)v); }
static nb_val *iota1(nb_loc l, nb_graph *g, int64_t n) { return nb_iota_at(l, g, NB_U32, 1, &n, 0); }

static bool check_key(nb_loc l, nb_val *key, const char *op) {
  if (nb__is_poison(key)) return false;
  nb_aval a = key->aval;
  if (a.dtype != NB_U32 || a.shape.rank != 1 || a.shape.dims[0] != 2) {
    char s[128];
    nb__fail(key->g, l, a.dtype != NB_U32 ? NB_ERR_DTYPE : NB_ERR_SHAPE, "%s: the key must be u32[2], not %s", op,
             nb_aval_str(&a, s, sizeof s));
    return false;
  }
  return !nb_graph_status(key->g);
}

static nb_val *key_word(nb_loc l, nb_val *key, int i) {
  int64_t start = i, limit = i + 1;
  return nb_reshape_at(l, nb_slice_at(l, key, &start, &limit, NULL), 0, NULL);
}

/* The first n elements of the 1-D x. */
static nb_val *head(nb_loc l, nb_val *x, int64_t n) {
  int64_t start = 0;
  return nb_val_dim(x, 0) == n ? x : nb_slice_at(l, x, &start, &n, NULL);
}

/* The first n words of the stream JAX's threefry_2x32(key, iota(n)) makes:
 * the counters split in two halves, x0 = [0, h) and x1 = [h, n) padded with
 * a zero counter when n is odd; the outputs laid out as [y0..., y1...] and
 * the padding's word dropped. */
static nb_val *stream(nb_loc l, nb_val *k0, nb_val *k1, int64_t n) {
  nb_graph *g = k0->g;
  int64_t h = (n + 1) / 2;
  nb_val *x0 = iota1(l, g, h), *x1 = nb_add_at(l, x0, u32c(l, g, (uint64_t)h)), *y[2];
  if (n % 2) x1 = nb_select_at(l, nb_eq_at(l, x1, u32c(l, g, (uint64_t)n)), u32c(l, g, 0), x1);
  nb_threefry2x32_at(l, k0, k1, x0, x1, &y[0], &y[1]);
  return head(l, nb_concatenate_at(l, 2, y, 0), n);
}

/* ---- the partitionable layout: element i of a call encrypts the counter
 * pair (0, i) (the 64-bit index i as hi, lo words) */

static bool partitionable(nb_graph *g) { return nb_ctx_prng_impl(nb_graph_ctx(g)) == NB_PRNG_THREEFRY_PARTITIONABLE; }

/* The output words (y0[i], y1[i]) of the counters (0, i), i < n. */
static void index_pairs(nb_loc l, nb_val *k0, nb_val *k1, int64_t n, nb_val **y0, nb_val **y1) {
  nb_graph *g = k0->g;
  nb_threefry2x32_at(l, k0, k1, nb_full_at(l, g, NB_U32, 1, &n, 0), iota1(l, g, n), y0, y1);
}

/* n random words of `width` bits (32, 16 or 8) as u32: y0 ^ y1, its low bits
 * for narrower widths. */
static nb_val *index_words(nb_loc l, nb_val *k0, nb_val *k1, int64_t n, int width) {
  nb_val *y0, *y1;
  index_pairs(l, k0, k1, n, &y0, &y1);
  nb_val *w = nb_xor_at(l, y0, y1);
  return width == 32 ? w : nb_rem_at(l, w, u32c(l, k0->g, 1ull << width));
}

/* n words of 32/per bits each, `per` per stream word, lowest bits first (JAX's
 * view of the u32 stream as u16/u8). */
static nb_val *narrow_words(nb_loc l, nb_val *k0, nb_val *k1, int64_t n, int per) {
  nb_graph *g = k0->g;
  int64_t m = (n + per - 1) / per, rows[2] = {m, per}, flat = m * per;
  int bd[1] = {0};
  nb_val *words = nb_broadcast_in_dim_at(l, stream(l, k0, k1, m), 2, rows, bd); /* each word `per` times */
  words = head(l, nb_reshape_at(l, words, 1, &flat), n);
  uint64_t base = 1ull << (32 / per);
  nb_val *shift = nb_pow_at(l, u32c(l, g, base), nb_rem_at(l, iota1(l, g, n), u32c(l, g, (uint64_t)per)));
  return nb_rem_at(l, nb_div_at(l, words, shift), u32c(l, g, base));
}

/* Mantissa bits of t. */
static int mantissa_bits(nb_dtype t) { return t == NB_F64 ? 52 : t == NB_F32 ? 23 : t == NB_F16 ? 10 : 7; }

/* Values one key gives per call: the u32 counter space less a padding
 * counter (f64 values take two words each). */
static int64_t max_count(nb_dtype t) { return t == NB_F64 ? 0x7FFFFFFF : 0xFFFFFFFE; }

/* Uniform values in [0, 1) as f64, flat: the top mantissa bits of each random
 * word times 2^-nmant. This is exactly JAX's
 * bitcast((bits >> (width - nmant)) | bits(1.0)) - 1, computed without
 * shifts. f64 takes the 64-bit words hi = y0, lo = y1 of the counter pairs
 * (i, i + n) (partitionable: (0, i)); f32 the u32 stream; f16/bf16 its
 * 16/8-bit pieces (partitionable: one word per value, its low bits). */
static nb_val *unit_floats(nb_loc l, nb_val *k0, nb_val *k1, nb_dtype t, int64_t n) {
  nb_graph *g = k0->g;
  int nmant = mantissa_bits(t);
  if (t == NB_F64) {
    nb_val *hi, *lo;
    if (partitionable(g)) {
      index_pairs(l, k0, k1, n, &hi, &lo);
    } else {
      nb_val *x0 = iota1(l, g, n);
      nb_threefry2x32_at(l, k0, k1, x0, nb_add_at(l, x0, u32c(l, g, (uint64_t)n)), &hi, &lo);
    }
    nb_val *top = nb_mul_at(l, nb_convert_at(l, hi, NB_F64), nb_scalar_at(l, g, NB_F64, ldexp(1, -32)));
    nb_val *rest = nb_convert_at(l, nb_div_at(l, lo, u32c(l, g, 1u << 12)), NB_F64);
    return nb_add_at(l, top, nb_mul_at(l, rest, nb_scalar_at(l, g, NB_F64, ldexp(1, -52))));
  }
  int width = t == NB_F32 ? 32 : t == NB_F16 ? 16 : 8;
  nb_val *words = partitionable(g) ? index_words(l, k0, k1, n, width)
                  : width == 32    ? stream(l, k0, k1, n)
                                   : narrow_words(l, k0, k1, n, 32 / width);
  nb_val *m = nb_div_at(l, words, u32c(l, g, 1ull << (width - nmant)));
  return nb_mul_at(l, nb_convert_at(l, m, NB_F64), nb_scalar_at(l, g, NB_F64, ldexp(1, -nmant)));
}

/* v rounded to dtype t (and back to double). */
static double round_to(nb_dtype t, double v) {
  _Alignas(8) unsigned char buf[8];
  nb__store_f64(t, buf, 0, v);
  return nb__load_f64(t, buf, 0);
}

/* The neighbour of x in dtype t toward +inf (dir > 0) or -inf. */
static double step_in(nb_dtype t, double x, int dir) {
  if (t == NB_F64) return nextafter(x, dir > 0 ? INFINITY : -INFINITY);
  if (t == NB_F32) return nextafterf((float)x, dir > 0 ? INFINITY : -INFINITY);
  /* 16-bit formats: step the sign-magnitude bit pattern */
  uint16_t b = t == NB_F16 ? nb_f32_to_f16((float)x) : nb_f32_to_bf16((float)x);
  bool neg = b & 0x8000u, zero = (b & 0x7fffu) == 0;
  if (zero) b = dir > 0 ? 1 : 0x8001u;
  else if (neg == (dir < 0)) b++;
  else b--;
  return t == NB_F16 ? nb_f16_to_f32(b) : nb_bf16_to_f32(b);
}

static bool check_float(nb_loc l, nb_graph *g, nb_dtype t, const char *op) {
  if (t >= 0 && t < NB_DTYPE_COUNT && nb_dtype_is_float(t)) return true;
  nb__fail(g, l, NB_ERR_DTYPE, "%s: dtype must be floating, not %s", op,
           t >= 0 && t < NB_DTYPE_COUNT ? nb_dtype_name(t) : "an invalid dtype");
  return false;
}

static bool check_dims(nb_loc l, nb_graph *g, int rank, const int64_t *dims, int64_t limit, const char *op,
                       int64_t *n) {
  if (rank < 0 || rank > NB_MAX_RANK || (rank && !dims))
    return nb__fail(g, l, NB_ERR_SHAPE, "%s: invalid rank %d", op, rank), false;
  *n = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0) return nb__fail(g, l, NB_ERR_SHAPE, "%s: negative dim %lld", op, (long long)dims[i]), false;
    if (dims[i] && *n > limit / dims[i]) *n = limit + 1;
    else *n *= dims[i];
  }
  if (*n > limit)
    return nb__fail(g, l, NB_ERR_SHAPE, "%s: more than %lld values from one key; split the key and draw in parts", op,
                    (long long)limit), false;
  return true;
}

/* floats * (maxval - minval) + minval, clipped below at minval, with the
 * range rounded to t first and its width computed in t, as JAX does. The
 * multiply-add rounds as XLA's CPU code does: once for f32 and f16 (a fused
 * multiply-add: exact in f64, then rounded to t), after each operation for
 * bf16 (computed in bf16) and f64 (here XLA fuses but the interpreter does
 * not: results may differ in the last bit, or more near a zero crossing). */
static nb_val *scale_unit(nb_loc l, nb_val *u, nb_dtype t, double minval, double maxval, int rank,
                          const int64_t *dims) {
  nb_graph *g = u->g;
  double lo = round_to(t, minval), width = round_to(t, round_to(t, maxval) - lo);
  nb_dtype ct = t == NB_BF16 ? NB_BF16 : NB_F64; /* u is exact in either */
  nb_val *y = nb_convert_at(l, u, ct);
  if (width != 1) y = nb_mul_at(l, y, nb_scalar_at(l, g, ct, width));
  if (lo != 0) y = nb_add_at(l, y, nb_scalar_at(l, g, ct, lo));
  y = nb_reshape_at(l, nb_convert_at(l, y, t), rank, dims);
  return lo != 0 ? nb_max_at(l, y, nb_scalar_at(l, g, t, lo)) : y;
}

/* ---------------------------------------------------------------- keys */

nb_val *nb_random_key_at(nb_loc loc, nb_graph *g, uint64_t seed) {
  if (!g) return NULL;
  if (nb_graph_status(g)) return nb__poison(g);
  nb_array *k = nb_key(nb_graph_ctx(g), seed);
  if (!k) return nb__fail(g, loc, NB_ERR_NOMEM, "random_key: out of memory");
  nb_val *v = nb_const_at(loc, g, k);
  nb_array_release(k);
  return v;
}

nb_val *nb_random_split_at(nb_loc loc, nb_val *key, int64_t n) {
  if (!key || !check_key(loc, key, "random_split")) return key ? nb__poison(key->g) : NULL;
  if (n < 1 || n > 0x7FFFFFFF)
    return nb__fail(key->g, loc, NB_ERR_INVALID_ARG, "random_split: n must be in [1, 2^31), got %lld", (long long)n);
  int64_t d[2] = {n, 2}, col[2] = {n, 1};
  nb_val *k0 = key_word(loc, key, 0), *k1 = key_word(loc, key, 1);
  if (!partitionable(key->g)) return nb_reshape_at(loc, stream(loc, k0, k1, 2 * n), 2, d);
  nb_val *y[2]; /* row i: the words of the counters (0, i) */
  index_pairs(loc, k0, k1, n, &y[0], &y[1]);
  y[0] = nb_reshape_at(loc, y[0], 2, col);
  y[1] = nb_reshape_at(loc, y[1], 2, col);
  return nb_concatenate_at(loc, 2, y, 1);
}

nb_val *nb_random_fold_in_at(nb_loc loc, nb_val *key, nb_val *data) {
  nb_val *ops[2] = {key, data};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!key || !data) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_fold_in: NULL operand");
  if (!check_key(loc, key, "random_fold_in")) return nb__poison(g);
  if (!nb_dtype_is_int(data->aval.dtype) || data->aval.shape.rank != 0) {
    char s[128];
    return nb__fail(g, loc, NB_ERR_DTYPE, "random_fold_in: data must be an integer scalar, not %s",
                    nb_aval_str(&data->aval, s, sizeof s));
  }
  /* JAX: threefry_2x32(key, seed(data)) with seed(data) = (0, data) */
  nb_val *y[2];
  int64_t one = 1;
  nb_threefry2x32_at(loc, key_word(loc, key, 0), key_word(loc, key, 1), u32c(loc, g, 0), nb_convert_at(loc, data, NB_U32),
                     &y[0], &y[1]);
  y[0] = nb_reshape_at(loc, y[0], 1, &one);
  y[1] = nb_reshape_at(loc, y[1], 1, &one);
  return nb_concatenate_at(loc, 2, y, 0);
}

nb_val *nb_random_bits_at(nb_loc loc, nb_val *key, int rank, const int64_t *dims) {
  int64_t n;
  if (!key || !check_key(loc, key, "random_bits")) return key ? nb__poison(key->g) : NULL;
  if (!check_dims(loc, key->g, rank, dims, max_count(NB_U32), "random_bits", &n)) return nb__poison(key->g);
  if (n == 0) return nb_full_at(loc, key->g, NB_U32, rank, dims, 0);
  nb_val *k0 = key_word(loc, key, 0), *k1 = key_word(loc, key, 1);
  return nb_reshape_at(loc, partitionable(key->g) ? index_words(loc, k0, k1, n, 32) : stream(loc, k0, k1, n), rank, dims);
}

/* ---------------------------------------------------------------- samplers */

nb_val *nb_random_uniform_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims, double minval,
                             double maxval) {
  int64_t n;
  if (!key || !check_key(loc, key, "random_uniform")) return key ? nb__poison(key->g) : NULL;
  nb_graph *g = key->g;
  if (!check_float(loc, g, t, "random_uniform") || !check_dims(loc, g, rank, dims, max_count(t), "random_uniform", &n))
    return nb__poison(g);
  if (!isfinite(minval) || !isfinite(maxval) || !(minval <= maxval))
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_uniform: need finite minval <= maxval, got [%g, %g)", minval, maxval);
  if (n == 0) return nb_full_at(loc, g, t, rank, dims, 0);
  nb_val *u = unit_floats(loc, key_word(loc, key, 0), key_word(loc, key, 1), t, n);
  return scale_unit(loc, u, t, minval, maxval, rank, dims);
}

/* sqrt(2) erf_inv(u) for u uniform in (-1, 1), everything in t, as JAX. */
nb_val *nb_random_normal_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims) {
  if (!key || (nb__is_poison(key))) return key;
  if (!check_float(loc, key->g, t, "random_normal")) return nb__poison(key->g);
  nb_val *u = nb_random_uniform_at(loc, key, t, rank, dims, step_in(t, -1, +1), 1);
  return nb_mul_at(loc, nb_scalar_at(loc, key->g, t, M_SQRT2), nb_erf_inv_at(loc, u));
}

/* Inverse-CDF sampling on [erf(lower/√2), erf(upper/√2)), clipped to the
 * open interval (lower, upper) as JAX does. */
nb_val *nb_random_truncated_normal_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims, double lower,
                                      double upper) {
  if (!key || (nb__is_poison(key))) return key;
  nb_graph *g = key->g;
  if (!check_float(loc, g, t, "random_truncated_normal")) return nb__poison(g);
  if (isnan(lower) || isnan(upper) || !(lower < upper))
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_truncated_normal: need lower < upper, got (%g, %g)", lower, upper);
  double s2 = round_to(t, M_SQRT2), lo = round_to(t, lower), hi = round_to(t, upper);
  double a = round_to(t, erf(round_to(t, lo / s2))), b = round_to(t, erf(round_to(t, hi / s2)));
  nb_val *u = nb_random_uniform_at(loc, key, t, rank, dims, a, b);
  nb_val *x = nb_mul_at(loc, nb_scalar_at(loc, g, t, s2), nb_erf_inv_at(loc, u));
  return nb_clamp_at(loc, nb_scalar_at(loc, g, t, step_in(t, lo, +1)), x, nb_scalar_at(loc, g, t, step_in(t, hi, -1)));
}

nb_val *nb_random_bernoulli_at(nb_loc loc, nb_val *key, nb_val *p, int rank, const int64_t *dims) {
  nb_val *ops[2] = {key, p};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!key || !p) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_bernoulli: NULL operand");
  if (!check_key(loc, key, "random_bernoulli") || !check_float(loc, g, p->aval.dtype, "random_bernoulli (p)"))
    return nb__poison(g);
  nb_val *pb = nb_broadcast_to_at(loc, p, rank, dims);
  return nb_lt_at(loc, nb_random_uniform_at(loc, key, p->aval.dtype, rank, dims, 0, 1), pb);
}

/* Gumbel-max: argmax(logits + g) with g = -log(-log(u)), u uniform in
 * [tiny, 1) (JAX's default "low" mode). */
nb_val *nb_random_categorical_at(nb_loc loc, nb_val *key, nb_val *logits, int axis) {
  nb_val *ops[2] = {key, logits};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!key || !logits) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_categorical: NULL operand");
  if (!check_key(loc, key, "random_categorical") || !check_float(loc, g, logits->aval.dtype, "random_categorical (logits)"))
    return nb__poison(g);
  nb_aval a = logits->aval;
  int ax = nb__norm_axis(axis, a.shape.rank);
  if (ax < 0)
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "random_categorical: axis %d out of range for rank %d", axis, a.shape.rank);
  if (a.shape.dims[ax] == 0) return nb__fail(g, loc, NB_ERR_SHAPE, "random_categorical: no categories along axis %d", axis);
  double tiny = a.dtype == NB_F64 ? DBL_MIN : a.dtype == NB_F16 ? ldexp(1, -14) : FLT_MIN;
  nb_val *u = nb_random_uniform_at(loc, key, a.dtype, a.shape.rank, a.shape.dims, tiny, 1);
  nb_val *gumbel = nb_neg_at(loc, nb_log_at(loc, nb_neg_at(loc, nb_log_at(loc, u))));
  return nb_argmax_at(loc, nb_add_at(loc, gumbel, logits), ax, NB_I32);
}

/* ---------------------------------------------------------------- eager helpers */

nb_array *nb_key(nb_ctx *ctx, uint64_t seed) {
  uint32_t w[2] = {(uint32_t)(seed >> 32), (uint32_t)seed};
  int64_t d[1] = {2};
  return nb_array_create(ctx, NB_U32, 1, d, w);
}

static bool is_key_array(nb_ctx *ctx, const nb_array *key, const char *op) {
  if (!key) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: NULL key", op), false;
  nb_aval a = nb_array_aval(key);
  if (a.dtype == NB_U32 && a.shape.rank == 1 && a.shape.dims[0] == 2) return true;
  char s[128];
  nb_errorf(ctx, a.dtype != NB_U32 ? NB_ERR_DTYPE : NB_ERR_SHAPE, "%s: the key must be u32[2], not %s", op,
            nb_aval_str(&a, s, sizeof s));
  return false;
}

typedef nb_val *(*sampler_fn)(nb_loc loc, nb_val *key, const void *args);

/* Builds key -> sampler(key) as a graph, runs it on `key` with the
 * interpreter, and returns the result (a new reference) or NULL. */
static nb_array *run_sampler(nb_ctx *ctx, nb_array *key, sampler_fn fn, const void *args, const char *op) {
  if (!is_key_array(ctx, key, op)) return NULL;
  nb_graph *g = nb_graph_create(ctx);
  if (!g) return NULL;
  nb_array *res = NULL;
  nb_val *k = nb_graph_input(g, "key", nb_array_aval(key));
  if (nb_graph_output(g, "y", fn((nb_loc){__FILE__, __LINE__}, k, args)) == NB_OK) nb_graph_run_flat(ctx, g, &key, &res);
  nb_graph_destroy(g);
  return res;
}

typedef struct sample_args {
  int64_t n;
  uint32_t data;
  nb_dtype t;
  int rank;
  const int64_t *dims;
  double lo, hi;
} sample_args;

static nb_val *do_split(nb_loc l, nb_val *k, const void *a) { return nb_random_split_at(l, k, ((const sample_args *)a)->n); }
static nb_val *do_fold_in(nb_loc l, nb_val *k, const void *a) {
  return nb_random_fold_in_at(l, k, u32c(l, k->g, ((const sample_args *)a)->data));
}
static nb_val *do_uniform(nb_loc l, nb_val *k, const void *v) {
  const sample_args *a = v;
  return nb_random_uniform_at(l, k, a->t, a->rank, a->dims, a->lo, a->hi);
}
static nb_val *do_normal(nb_loc l, nb_val *k, const void *v) {
  const sample_args *a = v;
  return nb_random_normal_at(l, k, a->t, a->rank, a->dims);
}

nb_array *nb_key_split(nb_ctx *ctx, nb_array *key, int64_t n) {
  sample_args a = {.n = n};
  return run_sampler(ctx, key, do_split, &a, "nb_key_split");
}

nb_array *nb_key_fold_in(nb_ctx *ctx, nb_array *key, uint32_t data) {
  sample_args a = {.data = data};
  return run_sampler(ctx, key, do_fold_in, &a, "nb_key_fold_in");
}

nb_array *nb_key_row(nb_ctx *ctx, nb_array *keys, int64_t i) {
  if (!keys) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_key_row: NULL keys"), NULL;
  nb_aval a = nb_array_aval(keys);
  char s[128];
  if (a.dtype != NB_U32 || a.shape.rank != 2 || a.shape.dims[1] != 2)
    return nb_errorf(ctx, a.dtype != NB_U32 ? NB_ERR_DTYPE : NB_ERR_SHAPE, "nb_key_row: keys must be u32[n,2], not %s",
                     nb_aval_str(&a, s, sizeof s)), NULL;
  if (i < 0 || i >= a.shape.dims[0])
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_key_row: row %lld out of range for %s", (long long)i,
                     nb_aval_str(&a, s, sizeof s)), NULL;
  int64_t d[1] = {2};
  return nb_array_create(ctx, NB_U32, 1, d, (const uint32_t *)nb_array_data(keys) + 2 * i);
}

nb_array *nb_array_random_uniform(nb_ctx *ctx, nb_array *key, nb_dtype t, int rank, const int64_t *dims, double minval,
                                  double maxval) {
  sample_args a = {.t = t, .rank = rank, .dims = dims, .lo = minval, .hi = maxval};
  return run_sampler(ctx, key, do_uniform, &a, "nb_array_random_uniform");
}

nb_array *nb_array_random_normal(nb_ctx *ctx, nb_array *key, nb_dtype t, int rank, const int64_t *dims) {
  sample_args a = {.t = t, .rank = rank, .dims = dims};
  return run_sampler(ctx, key, do_normal, &a, "nb_array_random_normal");
}
