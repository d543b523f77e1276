/* Random numbers: the threefry2x32 block against Random123's known answers;
 * keys, split, fold_in, bits, uniform, normal and friends against JAX
 * (tests/core/golden/random.json, written by make_random.py; values as hex
 * bit patterns, compared exactly); statistics of
 * every sampler with fixed keys; vmap over keys, grad through a sampler, the
 * eager helpers, and misuse. */
#include "json_golden.h"
#include "primcheck.h"

static const int64_t D2[1] = {2}, D3[1] = {3}, D5[1] = {5};

static nb_array *key_array(nb_ctx *ctx, uint32_t k0, uint32_t k1) {
  uint32_t w[2] = {k0, k1};
  return nb_array_create(ctx, NB_U32, 1, D2, w);
}

/* ---------------------------------------------------------------- running a sampler */

typedef nb_val *(*sampler)(nb_graph *g, nb_val *key, void *user);

/* sampler(key) as a graph run on `key`: a new reference, or NULL. */
static nb_array *draw(nb_ctx *ctx, nb_array *key, sampler fn, void *user) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *k = nb_graph_input(g, "key", nb_array_aval(key));
  nb_array *res = NULL;
  if (nb_graph_output(g, "y", fn(g, k, user)) == NB_OK) nb_graph_run_flat(ctx, g, &key, &res);
  nb_graph_destroy(g);
  return res;
}

/* ---------------------------------------------------------------- known answers */

static nb_status f_block(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *y0, *y1;
  nb_threefry2x32(nb_tree_get_val(in, "k0"), nb_tree_get_val(in, "k1"), nb_tree_get_val(in, "x0"),
                  nb_tree_get_val(in, "x1"), &y0, &y1);
  nb_status s = nb_tree_set_val(out, "y0", y0);
  return s ? s : nb_tree_set_val(out, "y1", y1);
}

static void test_known_answers(nb_ctx *ctx) {
  /* Random123's kat_vectors for threefry2x32_20: (key, counter) -> output */
  const uint32_t kat[3][6] = {
      {0, 0, 0, 0, 0x6b200159u, 0x99ba4efeu},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x1cb996fcu, 0xbb002be7u},
      {0x13198a2eu, 0x03707344u, 0x243f6a88u, 0x85a308d3u, 0xc4923a9cu, 0x483df7a0u},
  };
  int64_t d3[1] = {3};
  uint32_t cols[4][3];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) cols[j][i] = kat[i][j];
  const char *names[4] = {"k0", "k1", "x0", "x1"};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  for (int j = 0; j < 4; j++) {
    nb_array *a = nb_array_create(ctx, NB_U32, 1, d3, cols[j]);
    nb_tree_set_array(in, names[j], a);
    nb_array_release(a);
  }
  CHECK_OK(ctx, nb_test_eval(ctx, f_block, NULL, in, out));
  nb_array *y0 = nb_tree_get_array(out, "y0"), *y1 = nb_tree_get_array(out, "y1");
  for (int i = 0; y0 && y1 && i < 3; i++) {
    CHECK_MSG(((const uint32_t *)nb_array_data(y0))[i] == kat[i][4], "kat %d lane 0", i);
    CHECK_MSG(((const uint32_t *)nb_array_data(y1))[i] == kat[i][5], "kat %d lane 1", i);
  }
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* ---------------------------------------------------------------- JAX goldens */

typedef struct golden {
  const char *op;
  nb_dtype t;
  int rank;
  int64_t dims[NB_MAX_RANK];
  const cJSON *args;
} golden;

static double arg(const golden *r, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->args, name);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static nb_val *golden_op(nb_graph *g, nb_val *key, void *user) {
  const golden *r = user;
  const char *op = r->op;
  if (!strcmp(op, "split")) return nb_random_split(key, (int64_t)arg(r, "n"));
  if (!strcmp(op, "fold_in")) return nb_random_fold_in(key, nb_scalar(g, NB_U32, arg(r, "data")));
  if (!strcmp(op, "bits")) return nb_random_bits(key, r->rank, r->dims);
  if (!strcmp(op, "uniform")) return nb_random_uniform(key, r->t, r->rank, r->dims, arg(r, "minval"), arg(r, "maxval"));
  if (!strcmp(op, "normal")) return nb_random_normal(key, r->t, r->rank, r->dims);
  if (!strcmp(op, "truncated_normal"))
    return nb_random_truncated_normal(key, r->t, r->rank, r->dims, arg(r, "lower"), arg(r, "upper"));
  if (!strcmp(op, "bernoulli")) return nb_random_bernoulli(key, nb_scalar(g, NB_F32, arg(r, "p")), r->rank, r->dims);
  if (!strcmp(op, "categorical")) {
    double v[40];
    int64_t d[2] = {5, 8};
    for (int j = 0; j < 40; j++) v[j] = (j % 7) * 0.5 - 1;
    nb_array *a = nb_array_from_f64(nb_graph_ctx(g), NB_F32, 2, d, v);
    nb_val *logits = nb_const(g, a);
    nb_array_release(a);
    return nb_random_categorical(key, logits, -1);
  }
  return NULL;
}

/* Bit pattern of element i, zero-extended. */
static uint64_t bits_at(const nb_array *a, int64_t i) {
  const unsigned char *p = (const unsigned char *)nb_array_data(a) + (size_t)i * nb_dtype_size(nb_array_dtype(a));
  uint64_t v = 0;
  memcpy(&v, p, nb_dtype_size(nb_array_dtype(a))); /* little-endian hosts */
  return v;
}

/* Distance in units in the last place between two floats of one dtype. */
static int64_t ulps(nb_dtype t, uint64_t a, uint64_t b) {
  int w = (int)nb_dtype_size(t) * 8;
  uint64_t sign = 1ull << (w - 1);
  int64_t x = (a & sign) ? -(int64_t)(a & ~sign) : (int64_t)a, y = (b & sign) ? -(int64_t)(b & ~sign) : (int64_t)b;
  return x > y ? x - y : y - x;
}

static double as_double(nb_dtype t, uint64_t bits) {
  unsigned char b[8];
  memcpy(b, &bits, 8); /* little-endian hosts */
  switch (t) {
  case NB_F64: {
    double d;
    memcpy(&d, b, 8);
    return d;
  }
  case NB_F32: {
    float f;
    memcpy(&f, b, 4);
    return f;
  }
  case NB_F16: return nb_f16_to_f32((uint16_t)bits);
  default: return nb_bf16_to_f32((uint16_t)bits);
  }
}

static double eps_of(nb_dtype t) { return t == NB_F64 ? 0x1p-52 : t == NB_F32 ? 0x1p-23 : t == NB_F16 ? 0x1p-10 : 0x1p-7; }

/* How close to JAX a value must be. Bit for bit, except: f64 uniform over a
 * range (XLA fuses the multiply-add, the interpreter rounds twice) and f16
 * uniform over a range (XLA's CPU code rounds its multiply-add once on some
 * machines, twice on others: the two golden files were made on different
 * ones), normal
 * (XLA's erf_inv is a polynomial good to tens of ulps in the tails; nabla's
 * is checked against the exact value separately) and truncated_normal
 * (also through erf, whose last bit moves the whole interval). */
static bool close_to_jax(const golden *r, uint64_t want, uint64_t have) {
  if (want == have) return true;
  if (!nb_dtype_is_float(r->t)) return false;
  double w = as_double(r->t, want), h = as_double(r->t, have);
  if (!strcmp(r->op, "uniform") && (r->t == NB_F64 || r->t == NB_F16))
    return fabs(w - h) <= eps_of(r->t) * (fabs(arg(r, "maxval") - arg(r, "minval")) + fabs(w));
  if (!strcmp(r->op, "normal")) return ulps(r->t, want, have) <= (r->t == NB_F64 ? 256 : r->t == NB_F32 ? 64 : 2);
  if (!strcmp(r->op, "truncated_normal")) return fabs(w - h) <= 16 * eps_of(r->t) * (1 + fabs(w));
  return false;
}

typedef struct golden_stats {
  int records, values, inexact, inexact_uniform, worst_exact_ulps[NB_DTYPE_COUNT];
} golden_stats;

/* Compares got with the hex bit patterns `hex`: against JAX (close_to_jax),
 * or, for "exact", within max_ulps of the correctly rounded value. */
static int64_t compare(const golden *r, const char *what, const nb_array *got, const cJSON *hex, bool exact,
                       golden_stats *st) {
  int64_t n = cJSON_GetArraySize(hex), bad = 0, worst = 0;
  for (int64_t i = 0; i < n; i++) {
    uint64_t want = strtoull(cJSON_GetArrayItem(hex, (int)i)->valuestring, NULL, 16), have = bits_at(got, i);
    bool ok;
    if (exact) {
      int64_t d = ulps(r->t, want, have);
      worst = d > worst ? d : worst;
      ok = d <= 2;
    } else {
      ok = close_to_jax(r, want, have);
      st->inexact += want != have;
      st->inexact_uniform += want != have && !strcmp(r->op, "uniform");
    }
    if (!ok && bad++ < 3)
      fprintf(stderr, "%s [%lld]: got %llx, %s %llx\n", what, (long long)i, (unsigned long long)have,
              exact ? "exact" : "JAX", (unsigned long long)want);
  }
  if (exact && worst > st->worst_exact_ulps[r->t]) st->worst_exact_ulps[r->t] = (int)worst;
  CHECK_MSG(bad == 0, "%s: %lld of %lld values differ from %s", what, (long long)bad, (long long)n,
            exact ? "the exact values by more than 2 ulps" : "JAX");
  return n;
}

static void check_record(nb_ctx *ctx, const cJSON *rec, golden_stats *st) {
  golden r = {.op = cJSON_GetObjectItemCaseSensitive(rec, "op")->valuestring};
  const cJSON *key = cJSON_GetObjectItemCaseSensitive(rec, "key");
  uint32_t k0 = (uint32_t)cJSON_GetArrayItem(key, 0)->valuedouble, k1 = (uint32_t)cJSON_GetArrayItem(key, 1)->valuedouble;
  st->records++;
  if (!strcmp(r.op, "key")) {
    unsigned long long seed = strtoull(cJSON_GetObjectItemCaseSensitive(rec, "seed")->valuestring, NULL, 10);
    nb_array *k = nb_key(ctx, seed), *want = key_array(ctx, k0, k1);
    CHECK_MSG(nb_array_equal(k, want), "key(%llu)", seed);
    nb_array_release(k);
    nb_array_release(want);
    return;
  }
  const cJSON *hex = cJSON_GetObjectItemCaseSensitive(rec, "hex");
  r.rank = nb_test_golden_ints(rec, "shape", r.dims, NB_MAX_RANK);
  CHECK(r.rank >= 0);
  const char *dt = cJSON_GetObjectItemCaseSensitive(rec, "dtype")->valuestring;
  CHECK(nb_dtype_from_name(dt, &r.t));
  r.args = cJSON_GetObjectItemCaseSensitive(rec, "args");
  nb_array *k = key_array(ctx, k0, k1), *got = draw(ctx, k, golden_op, &r);
  char what[512], *args = cJSON_PrintUnformatted(r.args);
  snprintf(what, sizeof what, "%s %s[rank %d] key=(%u,%u) %s", r.op, dt, r.rank, k0, k1, args ? args : "");
  free(args);
  CHECK_MSG(got, "%s: %s", what, nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  nb_aval want_aval = nb_aval_make(r.t, r.rank, r.dims);
  if (got) {
    nb_aval got_aval = nb_array_aval(got);
    CHECK_MSG(nb_aval_equal(&want_aval, &got_aval), "%s: wrong aval", what);
  }
  if (got && nb_array_size(got) == cJSON_GetArraySize(hex)) {
    st->values += (int)compare(&r, what, got, hex, false, st);
    const cJSON *exact = cJSON_GetObjectItemCaseSensitive(rec, "exact");
    if (exact) compare(&r, what, got, exact, true, st);
  }
  nb_array_release(k);
  nb_array_release(got);
}

/* The goldens of one layout, traced with the context set to it. */
static void test_jax_goldens(nb_ctx *ctx, nb_prng_impl impl) {
  const char *path = impl == NB_PRNG_THREEFRY ? "tests/core/golden/random.json" : "tests/core/golden/random_partitionable.json";
  nb_ctx_set_prng_impl(ctx, impl);
  cJSON *doc = nb_test_golden_load(path);
  CHECK(doc != NULL);
  /* the file says which layout made it (random.json predates the field: False) */
  const cJSON *flag = cJSON_GetObjectItemCaseSensitive(doc, "threefry_partitionable");
  CHECK_MSG(cJSON_IsTrue(flag) == (impl == NB_PRNG_THREEFRY_PARTITIONABLE), "%s: wrong layout", path);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(doc, "records"), *rec;
  golden_stats st = {0};
  cJSON_ArrayForEach(rec, recs) check_record(ctx, rec, &st);
  CHECK_MSG(st.records > 200 && st.values > 5000, "only %d records, %d values", st.records, st.values);
  printf("JAX goldens (%s): %d records, %d values, %d not bit for bit (%d of them f64 or f16 uniform over a range, the rest normal "
         "and truncated_normal); normal vs exact: worst ulps f32 %d, f64 %d, f16 %d, bf16 %d\n", path, st.records, st.values,
         st.inexact, st.inexact_uniform, st.worst_exact_ulps[NB_F32], st.worst_exact_ulps[NB_F64],
         st.worst_exact_ulps[NB_F16], st.worst_exact_ulps[NB_BF16]);
  cJSON_Delete(doc);
  nb_ctx_set_prng_impl(ctx, NB_PRNG_THREEFRY);
}

/* ---------------------------------------------------------------- statistics */

typedef struct draw_args {
  nb_dtype t;
  int rank;
  int64_t dims[2];
  double a, b;
} draw_args;

static nb_val *s_uniform(nb_graph *g, nb_val *k, void *u) {
  draw_args *a = u;
  return nb_convert(nb_random_uniform(k, a->t, a->rank, a->dims, a->a, a->b), NB_F64);
}
static nb_val *s_normal(nb_graph *g, nb_val *k, void *u) {
  draw_args *a = u;
  return nb_convert(nb_random_normal(k, a->t, a->rank, a->dims), NB_F64);
}
static nb_val *s_truncated(nb_graph *g, nb_val *k, void *u) {
  draw_args *a = u;
  return nb_convert(nb_random_truncated_normal(k, a->t, a->rank, a->dims, a->a, a->b), NB_F64);
}

static void moments(const nb_array *x, double *mean, double *var) {
  int64_t n = nb_array_size(x);
  const double *d = nb_array_data(x);
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) s += d[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++) s2 += (d[i] - *mean) * (d[i] - *mean);
  *var = s2 / (double)(n - 1);
}

static double correlation(const nb_array *x, const nb_array *y, int64_t lag) {
  int64_t n = nb_array_size(x) - lag;
  const double *a = nb_array_data(x), *b = (const double *)nb_array_data(y) + lag;
  double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
  for (int64_t i = 0; i < n; i++) ma += a[i], mb += b[i];
  ma /= (double)n;
  mb /= (double)n;
  for (int64_t i = 0; i < n; i++) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / sqrt(saa * sbb);
}

enum { N = 100000 };

static void test_uniform_normal_stats(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 2024);
  nb_dtype types[4] = {NB_F32, NB_F64, NB_BF16, NB_F16};
  for (int ti = 0; ti < 4; ti++) {
    nb_dtype t = types[ti];
    draw_args a = {t, 1, {N + ti}, -2, 3}; /* odd and even sizes */
    nb_array *u = draw(ctx, k, s_uniform, &a), *z = draw(ctx, k, s_normal, &a);
    CHECK_MSG(u && z, "%s: %s", nb_dtype_name(t), nb_ctx_error(ctx));
    if (!u || !z) continue;
    double m, v, lo = INFINITY, hi = -INFINITY;
    moments(u, &m, &v);
    for (int64_t i = 0; i < nb_array_size(u); i++) {
      lo = fmin(lo, nb_array_get(u, i));
      hi = fmax(hi, nb_array_get(u, i));
    }
    /* U[-2, 3): mean 0.5, variance 25/12; 5 sigma bounds */
    CHECK_MSG(fabs(m - 0.5) < 5 * sqrt(25.0 / 12 / N), "%s uniform mean %g", nb_dtype_name(t), m);
    CHECK_MSG(fabs(v - 25.0 / 12) < 5 * 25.0 * sqrt(1.0 / 180 / N) + 0.02, "%s uniform variance %g", nb_dtype_name(t), v);
    CHECK_MSG(lo >= -2 && hi < 3 && lo < -1.99 && hi > 2.9, "%s uniform range [%g, %g]", nb_dtype_name(t), lo, hi);
    moments(z, &m, &v);
    int64_t inside = 0;
    for (int64_t i = 0; i < nb_array_size(z); i++) inside += fabs(nb_array_get(z, i)) < 1;
    double frac = (double)inside / (double)nb_array_size(z), p1 = 0.682689492137;
    CHECK_MSG(fabs(m) < 5 / sqrt(N), "%s normal mean %g", nb_dtype_name(t), m);
    CHECK_MSG(fabs(v - 1) < 5 * sqrt(2.0 / N) + (t == NB_BF16 ? 0.01 : 0), "%s normal variance %g", nb_dtype_name(t), v);
    CHECK_MSG(fabs(frac - p1) < 5 * sqrt(p1 * (1 - p1) / N) + (t == NB_BF16 ? 0.01 : 0), "%s normal P(|z|<1) = %g",
              nb_dtype_name(t), frac);
    /* consecutive values are uncorrelated */
    CHECK_MSG(fabs(correlation(z, z, 1)) < 5 / sqrt(N), "%s normal lag-1 correlation", nb_dtype_name(t));
    nb_array_release(u);
    nb_array_release(z);
  }
  nb_array_release(k);
}

static void test_truncated_normal_stats(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 99);
  draw_args a = {NB_F32, 1, {N}, -0.5, 2};
  nb_array *z = draw(ctx, k, s_truncated, &a);
  CHECK_MSG(z, "%s", nb_ctx_error(ctx));
  if (z) {
    double m, v, lo = INFINITY, hi = -INFINITY;
    moments(z, &m, &v);
    for (int64_t i = 0; i < N; i++) {
      lo = fmin(lo, nb_array_get(z, i));
      hi = fmax(hi, nb_array_get(z, i));
    }
    /* mean of N(0,1) truncated to (a, b): (phi(a) - phi(b)) / (Phi(b) - Phi(a)) */
    double pa = exp(-0.125) / sqrt(2 * M_PI), pb = exp(-2.0) / sqrt(2 * M_PI);
    double Z = 0.5 * (erf(2 / M_SQRT2) - erf(-0.5 / M_SQRT2)), mean = (pa - pb) / Z;
    double var = 1 + (-0.5 * pa - 2 * pb) / Z - mean * mean;
    CHECK_MSG(lo > -0.5 && hi < 2, "truncated normal range (%g, %g)", lo, hi);
    CHECK_MSG(fabs(m - mean) < 5 * sqrt(var / N), "truncated normal mean %g, want %g", m, mean);
    CHECK_MSG(fabs(v - var) < 0.02, "truncated normal variance %g, want %g", v, var);
  }
  nb_array_release(z);
  nb_array_release(k);
}

static void test_split_independence(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 7), *ks = nb_key_split(ctx, k, 2), *folded = nb_key_fold_in(ctx, k, 1);
  CHECK_MSG(ks && folded, "%s", nb_ctx_error(ctx));
  if (!ks || !folded) return;
  nb_array *k0 = nb_key_row(ctx, ks, 0), *k1 = nb_key_row(ctx, ks, 1);
  draw_args a = {NB_F32, 1, {N}, 0, 1};
  nb_array *x = draw(ctx, k0, s_normal, &a), *y = draw(ctx, k1, s_normal, &a), *z = draw(ctx, folded, s_normal, &a),
           *w = draw(ctx, k, s_normal, &a);
  CHECK(x && y && z && w);
  if (x && y && z && w) {
    CHECK_MSG(fabs(correlation(x, y, 0)) < 5 / sqrt(N), "split streams correlate: %g", correlation(x, y, 0));
    CHECK_MSG(fabs(correlation(x, z, 0)) < 5 / sqrt(N), "split and fold_in streams correlate");
    CHECK_MSG(fabs(correlation(w, x, 0)) < 5 / sqrt(N), "parent and child streams correlate");
    CHECK_MSG(fabs(correlation(w, z, 0)) < 5 / sqrt(N), "parent and folded streams correlate");
  }
  nb_array_release(x);
  nb_array_release(y);
  nb_array_release(z);
  nb_array_release(w);
  nb_array_release(k0);
  nb_array_release(k1);
  nb_array_release(ks);
  nb_array_release(folded);
  nb_array_release(k);
}

static nb_val *s_bernoulli(nb_graph *g, nb_val *k, void *u) {
  draw_args *a = u;
  double pv[3] = {0.1, 0.5, 0.9};
  int64_t d3[1] = {3};
  nb_array *p = nb_array_from_f64(nb_graph_ctx(g), NB_F32, 1, d3, pv);
  nb_val *b = nb_random_bernoulli(k, nb_const(g, p), a->rank, a->dims);
  nb_array_release(p);
  return nb_convert(b, NB_F64);
}

static void test_bernoulli_rate(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 5);
  draw_args a = {NB_F32, 2, {N / 3, 3}, 0, 0};
  nb_array *b = draw(ctx, k, s_bernoulli, &a);
  CHECK_MSG(b, "%s", nb_ctx_error(ctx));
  double p[3] = {0.1, 0.5, 0.9};
  for (int j = 0; b && j < 3; j++) {
    double s = 0;
    for (int64_t i = 0; i < N / 3; i++) s += nb_array_get(b, i * 3 + j);
    double rate = s / (N / 3);
    CHECK_MSG(fabs(rate - p[j]) < 5 * sqrt(p[j] * (1 - p[j]) / (N / 3)), "bernoulli(%g) rate %g", p[j], rate);
  }
  nb_array_release(b);
  nb_array_release(k);
}

static nb_val *s_categorical(nb_graph *g, nb_val *k, void *u) {
  draw_args *a = u;
  double lv[4] = {0.5, -1, 2, 0};
  int64_t d4[1] = {4}, dn[2] = {a->dims[0], 4};
  nb_array *l = nb_array_from_f64(nb_graph_ctx(g), a->t, 1, d4, lv);
  nb_val *logits = nb_broadcast_to(nb_const(g, l), 2, dn);
  nb_array_release(l);
  return nb_random_categorical(k, logits, 1);
}

static void test_categorical_frequencies(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 11);
  double lv[4] = {0.5, -1, 2, 0}, z = 0;
  for (int j = 0; j < 4; j++) z += exp(lv[j]);
  nb_dtype types[2] = {NB_F32, NB_F64};
  for (int ti = 0; ti < 2; ti++) {
    draw_args a = {types[ti], 2, {N / 2, 4}, 0, 0};
    nb_array *c = draw(ctx, k, s_categorical, &a);
    CHECK_MSG(c && nb_array_dtype(c) == NB_I32 && nb_array_size(c) == N / 2, "%s", nb_ctx_error(ctx));
    int64_t count[4] = {0};
    for (int64_t i = 0; c && i < N / 2; i++) {
      int64_t v = (int64_t)nb_array_get(c, i);
      CHECK(v >= 0 && v < 4);
      if (v >= 0 && v < 4) count[v]++;
    }
    for (int j = 0; c && j < 4; j++) {
      double p = exp(lv[j]) / z, f = (double)count[j] / (N / 2);
      CHECK_MSG(fabs(f - p) < 5 * sqrt(p * (1 - p) / (N / 2)), "categorical class %d: %g, softmax %g", j, f, p);
    }
    nb_array_release(c);
  }
  nb_array_release(k);
}

/* ---------------------------------------------------------------- transformations */

static nb_status f_keyed(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *k = nb_tree_get_val(in, "key");
  int64_t d[2] = {2, 3};
  nb_val *sub = nb_random_split(k, 3);
  nb_status s = nb_tree_set_val(out, "u", nb_random_uniform(k, NB_F32, 2, d, -1, 1));
  if (!s) s = nb_tree_set_val(out, "split", sub);
  if (!s) s = nb_tree_set_val(out, "fold", nb_random_fold_in(k, nb_scalar(g, NB_U32, 3)));
  return s ? s : nb_tree_set_val(out, "bits", nb_random_bits(k, 1, d + 1));
}

static void test_vmap_over_keys(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, 3), *ks = nb_key_split(ctx, k, 4);
  nb_tree *batched = nb_tree_create(ctx);
  nb_tree_set_array(batched, "key", ks);
  CHECK(nb_test_check_vmap(ctx, "random over a batch of keys", f_keyed, NULL, batched, NULL, 4));
  nb_tree_destroy(batched);
  nb_array_release(ks);
  nb_array_release(k);
}

/* f(x) = sum(x * uniform(key)) + sum(normal(key)): grad = the uniforms. */
static nb_status f_reparam(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *k = nb_tree_get_val(in, "key");
  int64_t d[1] = {5};
  nb_val *y = nb_add(nb_reduce_sum(nb_mul(x, nb_random_uniform(k, NB_F64, 1, d, 0, 1)), 0, NULL),
                     nb_reduce_sum(nb_random_normal(k, NB_F64, 1, d), 0, NULL));
  return nb_tree_set_val(out, "loss", y);
}
static nb_val *s_u5(nb_graph *g, nb_val *k, void *u) {
  int64_t d[1] = {5};
  return nb_random_uniform(k, NB_F64, 1, d, 0, 1);
}

static void test_grad_through_sampler(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *k = nb_key(ctx, 8), *x = nb_array_full(ctx, NB_F64, 1, D5, 2.0);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "key", k);
  nb_graph *g = nb_trace(ctx, f_reparam, NULL, in), *dg = g ? nb_grad(ctx, g, &(nb_grad_opts){0}) : NULL;
  CHECK_MSG(dg, "%s", nb_ctx_error(ctx));
  nb_array *u = draw(ctx, k, s_u5, NULL);
  if (dg && nb_graph_run(ctx, dg, in, out) == NB_OK) {
    CHECK(nb_tree_get_array(out, "grad/key") == NULL); /* integer inputs are never differentiated */
    CHECK(nb_array_equal(nb_tree_get_array(out, "grad/x"), u));
  } else {
    CHECK_MSG(false, "grad run: %s", nb_ctx_error(ctx));
  }
  nb_array_release(u);
  nb_array_release(k);
  nb_array_release(x);
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* ---------------------------------------------------------------- eager helpers */

static nb_val *s_split3(nb_graph *g, nb_val *k, void *u) { return nb_random_split(k, 3); }

static void test_eager(nb_ctx *ctx) {
  nb_array *k = nb_key(ctx, (1ull << 32) + 9);
  CHECK(k && ((const uint32_t *)nb_array_data(k))[0] == 1 && ((const uint32_t *)nb_array_data(k))[1] == 9);
  nb_array *ks = nb_key_split(ctx, k, 3), *traced = draw(ctx, k, s_split3, NULL);
  CHECK(ks && nb_array_equal(ks, traced));
  nb_array *row = nb_key_row(ctx, ks, 2);
  CHECK(row && nb_array_get(row, 0) == nb_array_get(ks, 4) && nb_array_get(row, 1) == nb_array_get(ks, 5));
  int64_t d[2] = {3, 4};
  nb_array *u = nb_array_random_uniform(ctx, row, NB_F32, 2, d, 1, 2), *z = nb_array_random_normal(ctx, row, NB_F64, 2, d);
  CHECK(u && nb_array_dtype(u) == NB_F32 && nb_array_size(u) == 12 && z && nb_array_dtype(z) == NB_F64);
  for (int i = 0; u && i < 12; i++) CHECK(nb_array_get(u, i) >= 1 && nb_array_get(u, i) < 2);
  nb_array *f1 = nb_key_fold_in(ctx, k, 1), *f2 = nb_key_fold_in(ctx, k, 2);
  CHECK(f1 && f2 && !nb_array_equal(f1, f2) && !nb_array_equal(f1, k));
  nb_array *release[] = {k, ks, traced, row, u, z, f1, f2};
  for (size_t i = 0; i < sizeof release / sizeof release[0]; i++) nb_array_release(release[i]);
}

/* ---------------------------------------------------------------- misuse */

typedef enum misuse { M_KEY_DTYPE, M_KEY_SHAPE, M_INT_DTYPE, M_SPLIT0, M_FOLD_FLOAT, M_CAT_AXIS, M_BERN_INT,
                      M_TRUNC_RANGE, M_UNIF_RANGE, M_NEG_DIM, M_TOO_MANY, M_BLOCK_F32, M_BERN_SHAPE, M_COUNT } misuse;

static nb_val *s_misuse(nb_graph *g, nb_val *k, void *u) {
  int64_t d[1] = {4}, neg[1] = {-1}, big[2] = {1 << 20, 1 << 13}, col[2] = {2, 1};
  switch (*(misuse *)u) {
  case M_KEY_DTYPE: return nb_random_split(nb_convert(k, NB_F32), 2);
  case M_KEY_SHAPE: return nb_random_uniform(nb_reshape(k, 2, col), NB_F32, 1, d, 0, 1);
  case M_INT_DTYPE: return nb_random_normal(k, NB_I32, 1, d);
  case M_SPLIT0: return nb_random_split(k, 0);
  case M_FOLD_FLOAT: return nb_random_fold_in(k, nb_scalar(g, NB_F32, 1));
  case M_CAT_AXIS: return nb_random_categorical(k, nb_full(g, NB_F32, 1, d, 0), 1);
  case M_BERN_INT: return nb_random_bernoulli(k, nb_scalar(g, NB_I32, 0), 1, d);
  case M_TRUNC_RANGE: return nb_random_truncated_normal(k, NB_F32, 1, d, 1, -1);
  case M_UNIF_RANGE: return nb_random_uniform(k, NB_F32, 1, d, 0, INFINITY);
  case M_NEG_DIM: return nb_random_bits(k, 1, neg);
  case M_TOO_MANY: return nb_random_bits(k, 2, big);
  case M_BLOCK_F32: {
    nb_val *y0;
    nb_threefry2x32(k, k, nb_convert(k, NB_F32), k, &y0, NULL);
    return y0;
  }
  case M_BERN_SHAPE: return nb_random_bernoulli(k, nb_full(g, NB_F32, 1, D3, 0.5), 1, d);
  default: return NULL;
  }
}

static void test_misuse(nb_ctx *ctx) {
  struct { nb_status st; const char *msg; } want[M_COUNT] = {
      [M_KEY_DTYPE] = {NB_ERR_DTYPE, "random_split: the key must be u32[2], not f32[2]"},
      [M_KEY_SHAPE] = {NB_ERR_SHAPE, "random_uniform: the key must be u32[2], not u32[2,1]"},
      [M_INT_DTYPE] = {NB_ERR_DTYPE, "random_normal: dtype must be floating, not i32"},
      [M_SPLIT0] = {NB_ERR_INVALID_ARG, "random_split: n must be in [1, 2^31), got 0"},
      [M_FOLD_FLOAT] = {NB_ERR_DTYPE, "random_fold_in: data must be an integer scalar, not f32[]"},
      [M_CAT_AXIS] = {NB_ERR_INVALID_ARG, "random_categorical: axis 1 out of range for rank 1"},
      [M_BERN_INT] = {NB_ERR_DTYPE, "random_bernoulli (p): dtype must be floating, not i32"},
      [M_TRUNC_RANGE] = {NB_ERR_INVALID_ARG, "random_truncated_normal: need lower < upper"},
      [M_UNIF_RANGE] = {NB_ERR_INVALID_ARG, "random_uniform: need finite minval <= maxval"},
      [M_NEG_DIM] = {NB_ERR_SHAPE, "random_bits: negative dim -1"},
      [M_TOO_MANY] = {NB_ERR_SHAPE, "random_bits: more than 4294967294 values from one key"},
      [M_BLOCK_F32] = {NB_ERR_DTYPE, "threefry2x32: operand 2 must be u32, not f32"},
      [M_BERN_SHAPE] = {NB_ERR_SHAPE, "broadcast_to"},
  };
  nb_array *k = nb_key(ctx, 1);
  for (int m = 0; m < M_COUNT; m++) {
    misuse which = (misuse)m;
    nb_array *r = draw(ctx, k, s_misuse, &which);
    CHECK_MSG(r == NULL, "misuse %d was accepted", m);
    CHECK_MSG(strstr(nb_ctx_error(ctx), "test_random.c:"), "misuse %d: no caller location in '%s'", m, nb_ctx_error(ctx));
    CHECK_ERR(ctx, want[m].st, want[m].msg);
    nb_array_release(r);
  }
  /* eager helpers check their key arrays */
  nb_array *bad = nb_array_zeros(ctx, NB_I32, 1, D2);
  CHECK(nb_key_split(ctx, bad, 2) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "nb_key_split: the key must be u32[2], not i32[2]");
  CHECK(nb_array_random_normal(ctx, NULL, NB_F32, 0, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "nb_array_random_normal: NULL key");
  nb_array *ks = nb_key_split(ctx, k, 2);
  CHECK(nb_key_row(ctx, ks, 2) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "nb_key_row: row 2 out of range for u32[2,2]");
  CHECK(nb_key_row(ctx, k, 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "nb_key_row: keys must be u32[n,2], not u32[2]");
  nb_array_release(ks);
  nb_array_release(bad);
  nb_array_release(k);
}

/* NABLA_PRNG picks a new context's layout; an unknown value keeps the
 * default (with a warning on the log). */
static void test_prng_env(void) {
  const char *old = getenv("NABLA_PRNG");
  char *saved = old ? strdup(old) : NULL;
  const char *vals[] = {"threefry_partitionable", "threefry", "philox", ""};
  const nb_prng_impl want[] = {NB_PRNG_THREEFRY_PARTITIONABLE, NB_PRNG_THREEFRY, NB_PRNG_THREEFRY, NB_PRNG_THREEFRY};
  for (int i = 0; i < 4; i++) {
    setenv("NABLA_PRNG", vals[i], 1);
    nb_ctx *c = nb_ctx_create();
    CHECK_MSG(nb_ctx_prng_impl(c) == want[i], "NABLA_PRNG=%s", vals[i]);
    nb_ctx_destroy(c);
  }
  if (saved) setenv("NABLA_PRNG", saved, 1);
  else unsetenv("NABLA_PRNG");
  free(saved);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_prng_env();
  test_known_answers(ctx);
  test_jax_goldens(ctx, NB_PRNG_THREEFRY);
  test_jax_goldens(ctx, NB_PRNG_THREEFRY_PARTITIONABLE);
  test_uniform_normal_stats(ctx);
  test_truncated_normal_stats(ctx);
  test_split_independence(ctx);
  test_bernoulli_rate(ctx);
  test_categorical_frequencies(ctx);
  test_vmap_over_keys(ctx);
  test_grad_through_sampler(ctx);
  test_eager(ctx);
  test_misuse(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/random");
}
