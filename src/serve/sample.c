/* Sampling in the model step: each drawn row's logits processors
 * (logit_bias, min_tokens masking, repetition / frequency / presence
 * penalties) as traced elementwise ops, its key and uniform as traced
 * threefry ops, and the selection (greedy argmax, temperature, top_k,
 * top_p, min_p, the draw) with the raw log-probabilities as one curated
 * kernel, the custom call "serve.sample". The kernel exists because the
 * primitives it would take are slow on a vocabulary row: nb_top_k and
 * nb_sort are full merge sorts on the interpreter (130 ms for 16 rows of
 * 32000), argmax and cumsum 3 ms; the kernel never sorts the vocabulary
 * unless top_p is on. Every row is computed alone, in a fixed order, in
 * double where it sums: a row's result does not depend on the rest of the
 * batch, and the interpreter and compiled executables run the same code. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "util/util.h"

/* No contraction into fused multiply-adds: the exp below gives the same
 * bits in its vector and scalar forms, on every ISA. */
NB_FP_CONTRACT_OFF

/* ---------------------------------------------------------------- exp */

/* exp(x) for x <= 0 in double, 0 below -708: x = k ln2 + r with |r| <=
 * ln2 / 2 (k rounded by the 1.5 * 2^52 shift, ln2 in two parts), a
 * degree-12 Taylor polynomial in r (error under 2e-16 relative), times
 * 2^k built from k's bits. Branch-free, so the loops below vectorize. */
static inline __attribute__((always_inline)) double exp_neg(double x) {
  const double shift = 6755399441055744.0;
  double c = x < -708.0 ? -708.0 : x;
  double t = c * 1.4426950408889634 + shift, k = t - shift;
  double r = c - k * 6.93147180369123816490e-01;
  r = r - k * 1.90821492927058770002e-10;
  double p = 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0, p = p * r + 1.0 / 3628800.0, p = p * r + 1.0 / 362880.0, p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0, p = p * r + 1.0 / 720.0, p = p * r + 1.0 / 120.0, p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0, p = p * r + 0.5, p = p * r + 1.0, p = p * r + 1.0;
  uint64_t tb, sb;
  memcpy(&tb, &t, sizeof tb);
  memcpy(&sb, &shift, sizeof sb);
  uint64_t e = (tb - sb + 1023) << 52; /* 2^k: k >= -1022 here */
  double scale;
  memcpy(&scale, &e, sizeof scale);
  return x < -708.0 ? 0.0 : p * scale;
}

/* ---------------------------------------------------------------- passes over a row */

#define INLINE static inline __attribute__((always_inline))
enum { LANES = 8 };

/* out[i] = exp(v[i] - m) where v[i] >= lo, else 0 (v[i] <= m). */
INLINE void exp_shifted_body(const float *restrict v, int32_t n, double m, float lo, double *restrict out) {
  for (int32_t i = 0; i < n; i++) {
    double e = exp_neg((double)v[i] - m);
    out[i] = v[i] >= lo ? e : 0.0;
  }
}

/* y = x / temperature, NaN read as -inf. */
INLINE void scale_row_body(const float *restrict x, int32_t n, float temperature, float *restrict y) {
  for (int32_t i = 0; i < n; i++) {
    float v = x[i] / temperature;
    y[i] = v != v ? -INFINITY : v;
  }
}

/* w[i] = 0 where v[i] < lo. */
INLINE void mask_below_body(const float *restrict v, int32_t n, float lo, double *restrict w) {
  for (int32_t i = 0; i < n; i++) w[i] = v[i] >= lo ? w[i] : 0.0;
}

INLINE int32_t count_at_least_body(const float *v, int32_t n, float lo) {
  int32_t c = 0;
  for (int32_t i = 0; i < n; i++) c += v[i] >= lo;
  return c;
}

/* Sums and maxima in a fixed order: 8 interleaved lanes (lane i % 8), then
 * combined as ((0+1)+(2+3))+((4+5)+(6+7)): the same bits on any ISA and in
 * any batch, and 8 independent chains instead of one. */
INLINE double sum_lanes_body(const double *w, int32_t n) {
  double l[LANES] = {0};
  int32_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) l[j] += w[i + j];
  for (int j = 0; i + j < n; j++) l[j] += w[i + j];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* sum_lanes of exp_shifted(v, n, m, -inf): the same lanes, the same order,
 * the same bits, through a buffer in L1 instead of n doubles in memory
 * (chunks of a multiple of LANES keep every element in its lane). */
enum { EXP_CHUNK = 256 };
INLINE double sum_exp_shifted_body(const float *v, int32_t n, double m) {
  double l[LANES] = {0}, buf[EXP_CHUNK];
  for (int32_t c = 0; c < n; c += EXP_CHUNK) {
    int32_t k = n - c < EXP_CHUNK ? n - c : EXP_CHUNK, i = 0;
    exp_shifted_body(v + c, k, m, -INFINITY, buf);
    for (; i + LANES <= k; i += LANES)
      for (int j = 0; j < LANES; j++) l[j] += buf[i + j];
    for (int j = 0; i + j < k; j++) l[j] += buf[i + j];
  }
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The largest of v[0..n), NaNs skipped (a max is exact in any order). */
INLINE float max_lanes_body(const float *v, int32_t n) {
  float l[LANES];
  for (int j = 0; j < LANES; j++) l[j] = -INFINITY;
  int32_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) l[j] = v[i + j] > l[j] ? v[i + j] : l[j];
  for (int j = 0; i + j < n; j++) l[j] = v[i + j] > l[j] ? v[i + j] : l[j];
  float m = l[0];
  for (int j = 1; j < LANES; j++) m = l[j] > m ? l[j] : m;
  return m;
}

/* The passes built for AVX-512, AVX2 and the baseline (the loops above
 * inlined into each and vectorized for it), picked at run time. Without
 * contraction each gives the same bits as the others: test_sample runs
 * every one this CPU has. */
typedef struct row_ops {
  void (*exp_shifted)(const float *restrict, int32_t, double, float, double *restrict);
  void (*scale_row)(const float *restrict, int32_t, float, float *restrict);
  void (*mask_below)(const float *restrict, int32_t, float, double *restrict);
  int32_t (*count_at_least)(const float *, int32_t, float);
  double (*sum_lanes)(const double *, int32_t);
  double (*sum_exp_shifted)(const float *, int32_t, double);
  float (*max_lanes)(const float *, int32_t);
} row_ops;

#define ROW_OPS(isa, attr)                                                                                                   \
  attr static void exp_shifted_##isa(const float *restrict v, int32_t n, double m, float lo, double *restrict out) {         \
    exp_shifted_body(v, n, m, lo, out);                                                                                      \
  }                                                                                                                          \
  attr static void scale_row_##isa(const float *restrict x, int32_t n, float t, float *restrict y) { scale_row_body(x, n, t, y); } \
  attr static void mask_below_##isa(const float *restrict v, int32_t n, float lo, double *restrict w) {                     \
    mask_below_body(v, n, lo, w);                                                                                            \
  }                                                                                                                          \
  attr static int32_t count_at_least_##isa(const float *v, int32_t n, float lo) { return count_at_least_body(v, n, lo); }   \
  attr static double sum_lanes_##isa(const double *w, int32_t n) { return sum_lanes_body(w, n); }                            \
  attr static double sum_exp_shifted_##isa(const float *v, int32_t n, double m) { return sum_exp_shifted_body(v, n, m); }    \
  attr static float max_lanes_##isa(const float *v, int32_t n) { return max_lanes_body(v, n); }                              \
  static const row_ops ops_##isa = {exp_shifted_##isa, scale_row_##isa, mask_below_##isa, count_at_least_##isa,             \
                                    sum_lanes_##isa, sum_exp_shifted_##isa, max_lanes_##isa};

/* gcc: O3 for the loops whatever the build type (clang has no optimize
 * attribute; its fp-contract is off by NB_FP_CONTRACT_OFF above) */
#ifdef __clang__
#define ROW_OPT
#else
#define ROW_OPT optimize("O3", "fp-contract=off")
#endif
ROW_OPS(avx512, __attribute__((target("avx512f"), ROW_OPT)))
ROW_OPS(avx2, __attribute__((target("avx2"), ROW_OPT)))
ROW_OPS(base, __attribute__((ROW_OPT)))

static _Atomic int forced_isa = -1;

int nb_serve__sampler_isa(int isa) {
  bool has[3] = {true, __builtin_cpu_supports("avx2"), __builtin_cpu_supports("avx512f")};
  if (isa < 0 || isa > 2) return has[2] ? 2 : has[1] ? 1 : 0;
  if (!has[isa]) return -1;
  forced_isa = isa;
  return isa;
}

static const row_ops *ops(void) {
  static const row_ops *const by_isa[3] = {&ops_base, &ops_avx2, &ops_avx512};
  int isa = forced_isa;
  return by_isa[isa >= 0 ? isa : nb_serve__sampler_isa(-1)];
}

static void exp_shifted(const float *v, int32_t n, double m, float lo, double *out) { ops()->exp_shifted(v, n, m, lo, out); }
static void scale_row(const float *x, int32_t n, float t, float *y) { ops()->scale_row(x, n, t, y); }
static void mask_below(const float *v, int32_t n, float lo, double *w) { ops()->mask_below(v, n, lo, w); }
static int32_t count_at_least(const float *v, int32_t n, float lo) { return ops()->count_at_least(v, n, lo); }
static double sum_lanes(const double *w, int32_t n) { return ops()->sum_lanes(w, n); }
static double sum_exp_shifted(const float *v, int32_t n, double m) { return ops()->sum_exp_shifted(v, n, m); }
static float max_lanes(const float *v, int32_t n) { return ops()->max_lanes(v, n); }

/* ---------------------------------------------------------------- one row */

/* NaN logits (a broken model) order as -inf, so selection always ends. */
static float finite_or_low(float v) { return v != v ? -INFINITY : v; }

/* The first index of the largest value (lowest id on ties); 0 when every
 * value is -inf or NaN. */
static int32_t argmax_row(const float *x, int32_t V) {
  float m = max_lanes(x, V);
  for (int32_t i = 0; i < V; i++)
    if (x[i] == m) return i;
  return 0;
}

/* log(sum(exp(z))) of the raw logits, max-shifted, summed in double in
 * fixed lanes. */
static double log_normalizer(const float *z, int32_t V) {
  float m = max_lanes(z, V);
  if (m == -INFINITY) return -INFINITY;
  return (double)m + log(sum_exp_shifted(z, V, m));
}

/* The n largest of z (n <= NB_SERVE_MAX_LOGPROBS), most likely first, the
 * lower id first among equals: one pass keeping a sorted buffer. */
static void top_n(const float *z, int32_t V, int32_t n, int32_t *ids, float *vals) {
  int32_t have = 0;
  for (int32_t i = 0; i < V; i++) {
    float v = finite_or_low(z[i]);
    if (have == n && !(v > vals[n - 1])) continue;
    int32_t j = have < n ? have++ : n - 1; /* the slot to fill, moving smaller ones down */
    while (j > 0 && vals[j - 1] < v) {
      vals[j] = vals[j - 1], ids[j] = ids[j - 1];
      j--;
    }
    vals[j] = v, ids[j] = i;
  }
}

/* The k-th largest of a[0..n), 1 <= k <= n (a is reordered): quickselect
 * with a median-of-three pivot. The value, not its position, is the
 * result, so the pivot choices do not change it. */
static float kth_largest(float *a, int32_t n, int32_t k) {
  int32_t lo = 0, hi = n - 1, want = k - 1; /* the position in descending order */
  while (lo < hi) {
    float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
    float pv = x > y ? (y > z ? y : x > z ? z : x) : (x > z ? x : y > z ? z : y);
    int32_t i = lo, j = hi;
    while (i <= j) {
      while (a[i] > pv) i++;
      while (a[j] < pv) j--;
      if (i <= j) {
        float t = a[i];
        a[i++] = a[j], a[j--] = t;
      }
    }
    /* a[lo..j] >= pv >= a[i..hi], and everything between equals pv */
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else return pv;
  }
  return a[want];
}

/* The same for k <= SMALL_K in one pass: a sorted buffer of the k largest
 * so far, which most values fail to enter at the first comparison. */
enum { SMALL_K = 128 };
static float kth_largest_small(const float *v, int32_t n, int32_t k, float *buf) {
  int32_t have = 0;
  for (int32_t i = 0; i < n; i++) {
    if (have == k && !(v[i] > buf[k - 1])) continue;
    int32_t j = have < k ? have++ : k - 1;
    while (j > 0 && buf[j - 1] < v[i]) {
      buf[j] = buf[j - 1];
      j--;
    }
    buf[j] = v[i];
  }
  return buf[k - 1];
}

typedef struct cand {
  float y;
  int32_t id;
} cand;

/* most likely first, the lower id first among equals */
static int cand_order(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  if (a->y != b->y) return a->y > b->y ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

nb_status nb_serve__scratch_init(nb_ctx *ctx, nb_serve__scratch *s, int32_t V) {
  memset(s, 0, sizeof *s);
  s->V = V;
  s->y = nb_alloc(ctx, (size_t)V * sizeof *s->y);
  s->sel = nb_alloc(ctx, (size_t)V * sizeof *s->sel);
  s->cands = nb_alloc(ctx, (size_t)V * sizeof(cand));
  if (s->y && s->sel && s->cands) return NB_OK;
  nb_serve__scratch_free(ctx, s);
  return NB_ERR_NOMEM;
}

void nb_serve__scratch_free(nb_ctx *ctx, nb_serve__scratch *s) {
  if (s->y) nb_dealloc(ctx, s->y, (size_t)s->V * sizeof *s->y);
  if (s->sel) nb_dealloc(ctx, s->sel, (size_t)s->V * sizeof *s->sel);
  if (s->cands) nb_dealloc(ctx, s->cands, (size_t)s->V * sizeof(cand));
  memset(s, 0, sizeof *s);
}

/* The smallest y of the top_p set among the tokens y >= lo (weights w, 0
 * elsewhere): the most likely tokens, in order, while the mass before them
 * is below top_p of the whole. Only tokens above half the mean weight a
 * token may leave outside the set can be in it (those below weigh less
 * than (1 - top_p) / 2 of the mass together, so more than top_p comes
 * before each of them); they are bucketed by y (1/32 wide, from the
 * maximum m down), whole buckets are taken while their mass stays below
 * the limit, and only the bucket where it crosses is sorted. */
enum { P_BUCKETS = 1024 };
static const double P_BUCKET_SCALE = 32;

static int32_t p_bucket(double m, float y) {
  double d = (m - (double)y) * P_BUCKET_SCALE;
  return d < P_BUCKETS - 1 ? (int32_t)d : P_BUCKETS - 1;
}

static float top_p_threshold(const float *y, const double *w, int32_t V, float m, float lo, float top_p, nb_serve__scratch *s) {
  static _Thread_local double mass[P_BUCKETS];
  memset(mass, 0, sizeof mass);
  double total = sum_lanes(w, V), limit = (double)top_p * total, before = 0;
  double floor_w = 0.5 * (1 - (double)top_p) * total / count_at_least(y, V, lo);
  for (int32_t i = 0; i < V; i++)
    if (w[i] > 0 && w[i] >= floor_w) mass[p_bucket(m, y[i])] += w[i];
  int32_t b = 0;
  while (b < P_BUCKETS && before + mass[b] < limit) before += mass[b++];
  if (b == P_BUCKETS) return lo; /* rounding left the whole mass below the limit: all stay */
  cand *c = s->cands;
  int32_t nc = 0;
  for (int32_t i = 0; i < V; i++)
    if (w[i] > 0 && w[i] >= floor_w && p_bucket(m, y[i]) == b) c[nc++] = (cand){y[i], i};
  qsort(c, (size_t)nc, sizeof *c, cand_order);
  float last = c[0].y;
  for (int32_t j = 0; j < nc && before < limit; j++) {
    last = c[j].y;
    before += w[c[j].id];
  }
  return last > lo ? last : lo;
}

/* The smallest float y with y - m >= log(min_p) evaluated in double. */
static float min_p_threshold(float m, float min_p) {
  double l = log((double)min_p);
  float t = (float)((double)m + l);
  while ((double)t - (double)m < l) t = nextafterf(t, INFINITY);
  while ((double)nextafterf(t, -INFINITY) - (double)m >= l) t = nextafterf(t, -INFINITY);
  return t;
}

int32_t nb_serve__sample_weights(const nb_serve__row *p, const float *x, int32_t V, nb_serve__scratch *s, double *w,
                                 double *total) {
  *total = 1;
  float *y = s->y, m = -INFINITY;
  if (p->temperature > 0) {
    scale_row(x, V, p->temperature, y);
    m = max_lanes(y, V);
  }
  if (m == -INFINITY) { /* greedy, or everything masked: the argmax */
    memset(w, 0, (size_t)V * sizeof *w);
    w[argmax_row(x, V)] = 1;
    return 1;
  }
  /* the support is y >= lo: top_k's k-th largest, top_p's last kept, min_p's bound */
  float lo = -INFINITY;
  if (p->top_k > 0 && p->top_k < V) lo = p->top_k <= SMALL_K ? kth_largest_small(y, V, p->top_k, s->sel) : kth_largest(memcpy(s->sel, y, (size_t)V * sizeof *y), V, p->top_k);
  bool have_w = p->top_p > 0 && p->top_p < 1;
  if (have_w) {
    exp_shifted(y, V, m, lo, w);
    lo = top_p_threshold(y, w, V, m, lo, p->top_p, s);
  }
  if (p->min_p > 0) {
    float t = min_p_threshold(m, p->min_p);
    lo = t > lo ? t : lo;
  }
  if (have_w) mask_below(y, V, lo, w); /* the same exps, fewer of them */
  else exp_shifted(y, V, m, lo, w);
  *total = sum_lanes(w, V);
  return count_at_least(y, V, lo);
}

void nb_serve__sample_row(const nb_serve__row *p, const float *z, const float *x, int32_t V, nb_serve__scratch *s, double *w,
                          nb_serve__row_out *o) {
  memset(o, 0, sizeof *o);
  int32_t token = -1;
  if (!nb_serve__row_greedy(p)) {
    double total;
    nb_serve__sample_weights(p, x, V, s, w, &total);
    /* the first token whose cumulative weight, in id order, exceeds u of the total */
    double target = p->u * total, acc = 0;
    for (int32_t i = 0; i < V; i++) {
      if (w[i] <= 0) continue;
      token = i;
      if ((acc += w[i]) > target) break;
    }
  }
  if (token < 0) token = argmax_row(x, V); /* greedy (the weights' one token), or every weight underflowed */
  double lse = log_normalizer(z, V);
  o->token = token;
  o->logprob = (float)((double)z[token] - lse);
  int32_t n = p->num_logprobs < NB_SERVE_MAX_LOGPROBS ? p->num_logprobs : NB_SERVE_MAX_LOGPROBS;
  if (n > V) n = V;
  if (n > 0) {
    top_n(z, V, n, o->top_ids, o->top_logprobs);
    for (int32_t j = 0; j < n; j++) o->top_logprobs[j] = (float)((double)o->top_logprobs[j] - lse);
    o->num_top = n;
  }
}

/* ---------------------------------------------------------------- the custom call */

/* logits f32[R, V], x f32[R, V] (processed), fparams f32[R, 3], iparams i32[R, 3], u f64[R] */
static bool check_sample_avals(int nin, const nb_aval *in, char *why, size_t cap) {
  if (nin != 5) return snprintf(why, cap, "takes 5 operands, got %d", nin), false;
  const nb_aval *z = &in[0];
  if (z->dtype != NB_F32 || z->shape.rank != 2 || z->shape.dims[1] < 1 || z->shape.dims[1] > INT32_MAX)
    return snprintf(why, cap, "logits must be f32[rows, vocab] with vocab >= 1"), false;
  int64_t R = z->shape.dims[0];
  if (in[1].dtype != NB_F32 || !nb_shape_equal(&in[1].shape, &z->shape))
    return snprintf(why, cap, "the processed logits must be f32 of the logits' shape"), false;
  if (in[2].dtype != NB_F32 || in[2].shape.rank != 2 || in[2].shape.dims[0] != R || in[2].shape.dims[1] != 3)
    return snprintf(why, cap, "fparams must be f32[%lld, 3] (temperature, top_p, min_p)", (long long)R), false;
  if (in[3].dtype != NB_I32 || in[3].shape.rank != 2 || in[3].shape.dims[0] != R || in[3].shape.dims[1] != 3)
    return snprintf(why, cap, "iparams must be i32[%lld, 3] (top_k, num_logprobs, active)", (long long)R), false;
  if (in[4].dtype != NB_F64 || in[4].shape.rank != 1 || in[4].shape.dims[0] != R)
    return snprintf(why, cap, "u must be f64[%lld]", (long long)R), false;
  return true;
}

static nb_status sample_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out) {
  (void)ud, (void)attrs;
  char why[160];
  if (nout != 4 || attrs_size != 0 || !check_sample_avals(nin, in, why, sizeof why)) return NB_ERR_SHAPE;
  int64_t R = in[0].shape.dims[0], top[2] = {R, NB_SERVE_MAX_LOGPROBS};
  out[0] = nb_aval_make(NB_I32, 1, &R);
  out[1] = nb_aval_make(NB_F32, 1, &R);
  out[2] = nb_aval_make(NB_I32, 2, top);
  out[3] = nb_aval_make(NB_F32, 2, top);
  return NB_OK;
}

static nb_status sample_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout,
                             nb_array **out) {
  (void)ud, (void)nin, (void)attrs, (void)attrs_size, (void)nout;
  int64_t R = nb_array_dims(in[0])[0];
  int32_t V = (int32_t)nb_array_dims(in[0])[1];
  const float *z = nb_array_data(in[0]), *x = nb_array_data(in[1]), *fp = nb_array_data(in[2]);
  const int32_t *ip = nb_array_data(in[3]);
  const double *u = nb_array_data(in[4]);
  int32_t *token = nb_array_data_mut(out[0]), *top_ids = nb_array_data_mut(out[2]);
  float *logprob = nb_array_data_mut(out[1]), *top_lp = nb_array_data_mut(out[3]);
  memset(token, 0, (size_t)R * sizeof *token);
  memset(logprob, 0, (size_t)R * sizeof *logprob);
  memset(top_ids, 0, (size_t)R * NB_SERVE_MAX_LOGPROBS * sizeof *top_ids);
  memset(top_lp, 0, (size_t)R * NB_SERVE_MAX_LOGPROBS * sizeof *top_lp);
  nb_serve__scratch s = {0};
  double *w = NULL; /* the weights and scratch, made for the first row that samples (a greedy step has none) */
  for (int64_t r = 0; r < R; r++) {
    if (!ip[3 * r + 2]) continue; /* a padding row */
    nb_serve__row p = {.temperature = fp[3 * r], .top_p = fp[3 * r + 1], .min_p = fp[3 * r + 2], .top_k = ip[3 * r],
                       .num_logprobs = ip[3 * r + 1], .u = u[r]};
    if (!w && !nb_serve__row_greedy(&p)) {
      w = nb_alloc(ctx, (size_t)V * sizeof *w);
      if (!w || nb_serve__scratch_init(ctx, &s, V)) {
        if (w) nb_dealloc(ctx, w, (size_t)V * sizeof *w);
        return NB_ERR_NOMEM;
      }
    }
    nb_serve__row_out o;
    nb_serve__sample_row(&p, z + r * V, x + r * V, V, &s, w, &o);
    token[r] = o.token;
    logprob[r] = o.logprob;
    memcpy(top_ids + r * NB_SERVE_MAX_LOGPROBS, o.top_ids, (size_t)o.num_top * sizeof *top_ids);
    memcpy(top_lp + r * NB_SERVE_MAX_LOGPROBS, o.top_logprobs, (size_t)o.num_top * sizeof *top_lp);
  }
  if (w) {
    nb_serve__scratch_free(ctx, &s);
    nb_dealloc(ctx, w, (size_t)V * sizeof *w);
  }
  return NB_OK;
}

static void sample_cost(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, double *flops, double *bytes) {
  (void)ud, (void)nin, (void)attrs, (void)attrs_size;
  double n = (double)in[0].shape.dims[0] * (double)in[0].shape.dims[1];
  *flops = 8 * n; /* two exps and a few compares per logit */
  *bytes = 2 * 4 * n;
}

nb_status nb_serve__register_sampler(nb_ctx *ctx) {
  nb_custom_call_rules r = {.name = NB_SERVE__SAMPLE_NAME, .infer = sample_infer, .eval = sample_eval, .cost = sample_cost};
  return nb_custom_call_register(ctx, &r);
}

/* ---------------------------------------------------------------- traced ops */

static nb_val *column(nb_val *m, int64_t c) {
  int64_t R = nb_val_dim(m, 0), start[2] = {0, c}, limit[2] = {R, c + 1};
  return nb_reshape(nb_slice(m, start, limit, NULL), 1, &R);
}

/* u in [0, 1) per row: JAX's uniform(key, (), float64) with key =
 * fold_in(fold_in(PRNGKey(seed), k), j), from the columns seed_hi, seed_lo,
 * k, j of keys; fold_in(key, d) is threefry(key, (0, d)), and the f64
 * uniform takes the words (hi, lo) of the counters (0, 1), or (0, 0) in
 * the partitionable layout, as 2^-32 hi + 2^-52 (lo >> 12). */
static nb_val *row_uniform(nb_val *keys) {
  nb_graph *g = nb_val_graph(keys);
  int64_t R = nb_val_dim(keys, 0);
  nb_val *zero = nb_full(g, NB_U32, 1, &R, 0), *a0, *a1, *b0, *b1, *hi, *lo;
  nb_threefry2x32(column(keys, 0), column(keys, 1), zero, column(keys, 2), &a0, &a1);
  nb_threefry2x32(a0, a1, zero, column(keys, 3), &b0, &b1);
  bool part = nb_ctx_prng_impl(nb_graph_ctx(g)) == NB_PRNG_THREEFRY_PARTITIONABLE;
  nb_threefry2x32(b0, b1, zero, part ? zero : nb_full(g, NB_U32, 1, &R, 1), &hi, &lo);
  nb_val *top = nb_mul(nb_convert(hi, NB_F64), nb_scalar(g, NB_F64, ldexp(1, -32)));
  nb_val *rest = nb_convert(nb_div(lo, nb_scalar(g, NB_U32, 4096)), NB_F64);
  return nb_add(top, nb_mul(rest, nb_scalar(g, NB_F64, ldexp(1, -52))));
}

/* The logits processors in the header's order: logit_bias and the
 * min_tokens mask (both in bias), then repetition on tokens seen in the
 * prompt or output (divide a positive logit, multiply a negative one), then
 * frequency (per occurrence in the output) and presence (once). A row with
 * zero bias and counts and repetition 1 comes out bit for bit unchanged. */
nb_val *nb_serve__process_logits(const nb_serve__sample_in *in) {
  nb_val *x = nb_add(in->logits, in->bias);
  nb_val *rep = nb_expand_dims(column(in->penalties, 0), 1), *freq = nb_expand_dims(column(in->penalties, 1), 1);
  nb_val *pres = nb_expand_dims(column(in->penalties, 2), 1);
  nb_val *zero = nb_full_like(x, 0);
  nb_val *repeated = nb_select(nb_gt(x, zero), nb_div(x, rep), nb_mul(x, rep));
  x = nb_select(in->seen, repeated, x);
  x = nb_sub(x, nb_mul(freq, in->counts));
  return nb_sub(x, nb_mul(pres, nb_convert(nb_gt(in->counts, zero), NB_F32)));
}

nb_status nb_serve__sample_op(const nb_serve__sample_in *in, nb_serve__sample_out *out) {
  nb_graph *g = nb_val_graph(in->logits);
  bool adjust = in->bias != NULL;
  if (adjust && (!in->counts || !in->seen || !in->penalties))
    return nb_graph_fail_at(NB_HERE, g, NB_ERR_INVALID_ARG, "serve sample: bias without counts, seen or penalties"),
           NB_ERR_INVALID_ARG;
  nb_val *ops[5] = {in->logits, adjust ? nb_serve__process_logits(in) : in->logits, in->fparams, in->iparams, row_uniform(in->keys)};
  if (nb_graph_status(g)) return nb_graph_status(g);
  nb_aval av[5];
  for (int i = 0; i < 5; i++) av[i] = nb_val_aval(ops[i]);
  char why[160];
  if (!check_sample_avals(5, av, why, sizeof why)) {
    nb_graph_fail_at(NB_HERE, g, NB_ERR_SHAPE, "serve sample: %s", why);
    return NB_ERR_SHAPE;
  }
  nb_val *res[4] = {NULL, NULL, NULL, NULL};
  nb_custom_call(g, NB_SERVE__SAMPLE_NAME, 5, ops, NULL, 0, 4, res);
  out->token = res[0], out->logprob = res[1], out->top_ids = res[2], out->top_logprobs = res[3];
  return nb_graph_status(g);
}
