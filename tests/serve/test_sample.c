/* The model step's sampler (src/serve/sample.c) against plain-C references
 * of each parameter's definition on fixed logits: greedy is the argmax
 * (lowest id on ties); the support of top_k, top_p and min_p against a full
 * sort; the penalties' and logit_bias' arithmetic bit for bit; the draw
 * against an inverse CDF fed the key fold_in(fold_in(key(seed), k), j)'s
 * uniform drawn eagerly (both PRNG layouts); logprobs and top logprobs;
 * the empirical distribution over many seeds against softmax(logits / T)
 * (chi-square); compiled equal to interpreted bit for bit; bad shapes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/compile.h"
#include "serve/internal.h"
#include "test.h"

static uint32_t lcg(uint32_t *x) { return (*x = *x * 1664525u + 1013904223u) >> 8; }
static float unit(uint32_t *x) { return (float)(lcg(x) % 1000000) / 1e6f; }

/* ---------------------------------------------------------------- references */

/* The logits processors in the documented order, one rounding per operation. */
static float ref_process(float z, float bias, float count, bool seen, const float pen[3]) {
  volatile float x = z + bias;
  if (seen) x = x > 0 ? x / pen[0] : x * pen[0];
  volatile float f = pen[1] * count;
  x = x - f;
  volatile float p = pen[2] * (count > 0 ? 1.0f : 0.0f);
  return x - p;
}

static int32_t ref_argmax(const float *x, int32_t V) {
  int32_t b = 0;
  for (int32_t i = 1; i < V; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

typedef struct yid {
  float y;
  int32_t id;
} yid;
static int by_y_desc(const void *pa, const void *pb) {
  const yid *a = pa, *b = pb;
  return a->y != b->y ? (a->y > b->y ? -1 : 1) : (a->id > b->id) - (a->id < b->id);
}

/* The support and weights by the definitions, with full sorts: top_k keeps
 * y >= the k-th largest; top_p keeps, of those, the most likely in order
 * while the mass before them is below top_p (ties with the last kept stay);
 * min_p keeps y - max >= log(min_p). */
static void ref_weights(const nb_serve__row *p, const float *x, int32_t V, double *w) {
  memset(w, 0, (size_t)V * sizeof *w);
  if (!(p->temperature > 0)) {
    w[ref_argmax(x, V)] = 1;
    return;
  }
  yid *s = malloc((size_t)V * sizeof *s);
  float *y = malloc((size_t)V * sizeof *y);
  for (int32_t i = 0; i < V; i++) y[i] = x[i] / p->temperature, s[i] = (yid){y[i], i};
  qsort(s, (size_t)V, sizeof *s, by_y_desc);
  double m = s[0].y;
  float lo = p->top_k > 0 && p->top_k < V ? s[p->top_k - 1].y : -INFINITY;
  if (p->top_p > 0 && p->top_p < 1) {
    double mass = 0, before = 0;
    for (int32_t i = 0; i < V; i++)
      if (y[i] >= lo) mass += exp((double)y[i] - m);
    float last = s[0].y;
    for (int32_t j = 0; j < V && s[j].y >= lo && before < p->top_p * mass; j++) {
      last = s[j].y;
      before += exp((double)s[j].y - m);
    }
    lo = last > lo ? last : lo;
  }
  for (int32_t i = 0; i < V; i++)
    if (y[i] >= lo && (p->min_p <= 0 || (double)y[i] - m >= log((double)p->min_p))) w[i] = exp((double)y[i] - m);
  free(s);
  free(y);
}

static int32_t ref_draw(const double *w, int32_t V, double u) {
  double total = 0, acc = 0;
  for (int32_t i = 0; i < V; i++) total += w[i];
  int32_t t = -1;
  for (int32_t i = 0; i < V; i++) {
    if (w[i] <= 0) continue;
    t = i;
    if ((acc += w[i]) > u * total) break;
  }
  return t;
}

/* JAX's uniform(fold_in(fold_in(PRNGKey(seed), k), j), (), float64), eagerly. */
static double ref_uniform(nb_ctx *ctx, uint64_t seed, uint32_t k, uint32_t j) {
  nb_array *k0 = nb_key(ctx, seed), *k1 = nb_key_fold_in(ctx, k0, k), *k2 = nb_key_fold_in(ctx, k1, j);
  nb_array *u = nb_array_random_uniform(ctx, k2, NB_F64, 0, NULL, 0, 1);
  double v = u ? nb_array_get(u, 0) : -1;
  nb_array_release(k0), nb_array_release(k1), nb_array_release(k2), nb_array_release(u);
  return v;
}

/* ---------------------------------------------------------------- the traced sampler */

typedef struct rows {
  int32_t R, V;
  float *z, *fp, *bias, *counts, *pen; /* bias, counts, seen, pen: NULL without processors */
  int32_t *ip;
  uint32_t *keys;
  uint8_t *seen;
} rows;

static void rows_alloc(rows *r, int32_t R, int32_t V, bool adjust) {
  memset(r, 0, sizeof *r);
  r->R = R, r->V = V;
  size_t n = (size_t)R * (size_t)V;
  r->z = calloc(n, sizeof(float));
  r->fp = calloc((size_t)R * 3, sizeof(float));
  r->ip = calloc((size_t)R * 3, sizeof(int32_t));
  r->keys = calloc((size_t)R * 4, sizeof(uint32_t));
  if (adjust) {
    r->bias = calloc(n, sizeof(float)), r->counts = calloc(n, sizeof(float)), r->seen = calloc(n, 1);
    r->pen = calloc((size_t)R * 3, sizeof(float));
  }
}

static void rows_free(rows *r) {
  free(r->z), free(r->fp), free(r->ip), free(r->keys), free(r->bias), free(r->counts), free(r->seen), free(r->pen);
}

static nb_serve__row row_params(const rows *r, int32_t i, double u) {
  return (nb_serve__row){.temperature = r->fp[3 * i], .top_p = r->fp[3 * i + 1], .min_p = r->fp[3 * i + 2],
                         .top_k = r->ip[3 * i], .num_logprobs = r->ip[3 * i + 1], .u = u};
}

typedef struct results {
  nb_array *out[5]; /* token, logprob, top_ids, top_logprobs, processed logits (with processors) */
} results;

/* Builds the sampler over r's shapes and runs it interpreted or compiled. */
static bool run_sampler(nb_ctx *ctx, const rows *r, bool compiled, results *res) {
  memset(res, 0, sizeof *res);
  bool adjust = r->bias != NULL;
  int64_t rv[2] = {r->R, r->V}, r3[2] = {r->R, 3}, r4[2] = {r->R, 4};
  nb_graph *g = nb_graph_create(ctx);
  nb_serve__sample_in si = {.logits = nb_graph_input(g, "a_logits", nb_aval_make(NB_F32, 2, rv)),
                            .fparams = nb_graph_input(g, "b_f", nb_aval_make(NB_F32, 2, r3)),
                            .iparams = nb_graph_input(g, "c_i", nb_aval_make(NB_I32, 2, r3)),
                            .keys = nb_graph_input(g, "d_keys", nb_aval_make(NB_U32, 2, r4))};
  nb_array *in[8] = {nb_array_create(ctx, NB_F32, 2, rv, r->z), nb_array_create(ctx, NB_F32, 2, r3, r->fp),
                     nb_array_create(ctx, NB_I32, 2, r3, r->ip), nb_array_create(ctx, NB_U32, 2, r4, r->keys)};
  int nin = 4;
  if (adjust) {
    si.bias = nb_graph_input(g, "e_bias", nb_aval_make(NB_F32, 2, rv));
    si.counts = nb_graph_input(g, "f_counts", nb_aval_make(NB_F32, 2, rv));
    si.seen = nb_graph_input(g, "g_seen", nb_aval_make(NB_BOOL, 2, rv));
    si.penalties = nb_graph_input(g, "h_pen", nb_aval_make(NB_F32, 2, r3));
    in[4] = nb_array_create(ctx, NB_F32, 2, rv, r->bias);
    in[5] = nb_array_create(ctx, NB_F32, 2, rv, r->counts);
    in[6] = nb_array_create(ctx, NB_BOOL, 2, rv, r->seen);
    in[7] = nb_array_create(ctx, NB_F32, 2, r3, r->pen);
    nin = 8;
  }
  nb_serve__sample_out so;
  CHECK_OK(ctx, nb_serve__sample_op(&si, &so));
  CHECK_OK(ctx, nb_graph_output(g, "a_token", so.token));
  CHECK_OK(ctx, nb_graph_output(g, "b_logprob", so.logprob));
  CHECK_OK(ctx, nb_graph_output(g, "c_top_ids", so.top_ids));
  CHECK_OK(ctx, nb_graph_output(g, "d_top_logprobs", so.top_logprobs));
  if (adjust) CHECK_OK(ctx, nb_graph_output(g, "e_x", nb_serve__process_logits(&si)));
  nb_exe *e = compiled ? nb_jit(ctx, g, &(nb_jit_opts){.threads = 1}) : NULL;
  CHECK_MSG(!compiled || e, "%s", nb_ctx_error(ctx));
  nb_status s = compiled ? (e ? nb_exe_run_flat(e, in, res->out) : NB_ERR_INTERNAL) : nb_graph_run_flat(ctx, g, in, res->out);
  CHECK_MSG(s == NB_OK, "%s", nb_ctx_error(ctx));
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  for (int i = 0; i < nin; i++) nb_array_release(in[i]);
  return s == NB_OK;
}

static void results_free(results *res) {
  for (int i = 0; i < 5; i++) nb_array_release(res->out[i]);
}

/* ---------------------------------------------------------------- tests */

/* Random parameters over the interesting values of each. */
static void random_params(rows *r, int32_t i, uint32_t *x) {
  static const float temps[] = {0, 0.3f, 0.7f, 1, 1.5f}, top_ps[] = {0, 0.1f, 0.5f, 0.9f, 0.99f, 1};
  static const float min_ps[] = {0, 0, 0.05f, 0.3f};
  int32_t top_ks[] = {-1, 0, 1, 5, 50, r->V - 1, r->V, r->V + 10};
  r->fp[3 * i] = temps[lcg(x) % 5];
  r->fp[3 * i + 1] = top_ps[lcg(x) % 6];
  r->fp[3 * i + 2] = min_ps[lcg(x) % 4];
  r->ip[3 * i] = top_ks[lcg(x) % 8];
  r->ip[3 * i + 1] = (int32_t)(lcg(x) % 21);
  r->ip[3 * i + 2] = 1;
  r->keys[4 * i] = lcg(x), r->keys[4 * i + 1] = lcg(x), r->keys[4 * i + 2] = lcg(x) % 4, r->keys[4 * i + 3] = lcg(x) % 100;
}

/* Logits of a few shapes: spread, flat (top_p must sort most of them),
 * peaked, and with repeated values (ties at every threshold). */
static void random_logits(float *z, int32_t V, int kind, uint32_t *x) {
  for (int32_t i = 0; i < V; i++) {
    float g = unit(x) + unit(x) + unit(x) - 1.5f;
    z[i] = kind == 0 ? 3 * g : kind == 1 ? 0.05f * g : kind == 2 ? 12 * g : (float)(int)(4 * g);
  }
}

/* The support and weights of many random rows against full sorts. */
static void test_weights(nb_ctx *ctx) {
  uint32_t x = 11;
  const int32_t sizes[] = {1, 2, 7, 500, 32000};
  int checked = 0;
  for (int si = 0; si < 5; si++) {
    int32_t V = sizes[si];
    rows r;
    rows_alloc(&r, 1, V, false);
    nb_serve__scratch s;
    CHECK_OK(ctx, nb_serve__scratch_init(ctx, &s, V));
    double *w = malloc((size_t)V * sizeof *w), *want = malloc((size_t)V * sizeof *want);
    int reps = V >= 32000 ? 12 : 120;
    for (int rep = 0; rep < reps; rep++) {
      random_logits(r.z, V, rep % 4, &x);
      random_params(&r, 0, &x);
      nb_serve__row p = row_params(&r, 0, 0);
      double total;
      int32_t n = nb_serve__sample_weights(&p, r.z, V, &s, w, &total);
      ref_weights(&p, r.z, V, want);
      int32_t n_want = 0, bad = -1;
      double t_want = 0;
      for (int32_t i = 0; i < V; i++) {
        n_want += want[i] > 0;
        t_want += want[i];
        if ((w[i] > 0) != (want[i] > 0) || fabs(w[i] - want[i]) > 1e-12 * want[i]) bad = bad < 0 ? i : bad;
      }
      CHECK_MSG(bad < 0 && n == n_want, "V %d kind %d T %g top_k %d top_p %g min_p %g: support %d vs %d, token %d weight %g vs %g",
                V, rep % 4, p.temperature, p.top_k, p.top_p, p.min_p, n, n_want, bad, bad >= 0 ? w[bad] : 0,
                bad >= 0 ? want[bad] : 0);
      CHECK(fabs(total - t_want) <= 1e-9 * t_want);
      checked++;
    }
    free(w), free(want);
    nb_serve__scratch_free(ctx, &s);
    rows_free(&r);
  }
  printf("weights: %d rows of vocab 1 to 32000 match the sorted reference\n", checked);
}

/* Greedy is the argmax with the lowest id on ties, whatever the other
 * parameters say. */
static void test_greedy_ties(nb_ctx *ctx) {
  rows r;
  rows_alloc(&r, 3, 6, false);
  const float z[3][6] = {{1, 5, 5, 3, 5, 0}, {-INFINITY, -2, -1, -1, -3, -INFINITY}, {0, 0, 0, 0, 0, 0}};
  memcpy(r.z, z, sizeof z);
  for (int i = 0; i < 3; i++) r.ip[3 * i] = 2, r.fp[3 * i + 1] = 0.5f, r.ip[3 * i + 2] = 1, r.keys[4 * i] = (uint32_t)i;
  results res;
  if (run_sampler(ctx, &r, false, &res)) {
    const int32_t *t = nb_array_data(res.out[0]);
    CHECK_MSG(t[0] == 1 && t[1] == 2 && t[2] == 0, "greedy ties: %d %d %d, want 1 2 0", t[0], t[1], t[2]);
  }
  results_free(&res);
  rows_free(&r);
}

/* R rows of random logits and parameters through the traced sampler: each
 * token is the reference inverse CDF at the eagerly drawn uniform of its
 * key, each logprob and top logprob log_softmax of the raw logits. */
static void test_draws(nb_ctx *ctx, bool compiled) {
  enum { R = 48, V = 300 };
  uint32_t x = compiled ? 5 : 6;
  rows r;
  rows_alloc(&r, R, V, false);
  for (int32_t i = 0; i < R; i++) {
    random_logits(r.z + i * V, V, i % 4, &x);
    random_params(&r, i, &x);
  }
  results res;
  if (run_sampler(ctx, &r, compiled, &res)) {
    const int32_t *tok = nb_array_data(res.out[0]), *top = nb_array_data(res.out[2]);
    const float *lp = nb_array_data(res.out[1]), *top_lp = nb_array_data(res.out[3]);
    double w[V];
    for (int32_t i = 0; i < R; i++) {
      const float *z = r.z + i * V;
      uint64_t seed = (uint64_t)r.keys[4 * i] << 32 | r.keys[4 * i + 1];
      double u = ref_uniform(ctx, seed, r.keys[4 * i + 2], r.keys[4 * i + 3]);
      nb_serve__row p = row_params(&r, i, u);
      ref_weights(&p, z, V, w);
      int32_t want = ref_draw(w, V, u);
      CHECK_MSG(tok[i] == want, "row %d (T %g top_k %d top_p %g min_p %g u %.17g): token %d, want %d", i, p.temperature, p.top_k,
                p.top_p, p.min_p, u, tok[i], want);
      /* log_softmax of the raw logits, max-shifted, summed in id order */
      float m = z[ref_argmax(z, V)];
      double sum = 0;
      for (int32_t j = 0; j < V; j++) sum += exp((double)z[j] - m);
      double lse = m + log(sum);
      CHECK_MSG(lp[i] == (float)(z[tok[i]] - lse), "row %d: logprob %.9g, want %.9g", i, lp[i], (float)(z[tok[i]] - lse));
      yid s[V];
      for (int32_t j = 0; j < V; j++) s[j] = (yid){z[j], j};
      qsort(s, V, sizeof *s, by_y_desc);
      for (int32_t j = 0; j < p.num_logprobs; j++) {
        int32_t at = i * NB_SERVE_MAX_LOGPROBS + j;
        CHECK_MSG(top[at] == s[j].id && top_lp[at] == (float)(s[j].y - lse), "row %d top %d: id %d lp %g, want %d %g", i, j,
                  top[at], top_lp[at], s[j].id, (float)(s[j].y - lse));
      }
    }
  }
  results_free(&res);
  rows_free(&r);
}

/* The processors' arithmetic bit for bit, a large logit_bias forcing its
 * token, and the compiled sampler equal to the interpreted one. */
static void test_processors(nb_ctx *ctx) {
  enum { R = 16, V = 64 };
  uint32_t x = 99;
  rows r;
  rows_alloc(&r, R, V, true);
  for (int32_t i = 0; i < R; i++) {
    random_logits(r.z + i * V, V, i % 4, &x);
    random_params(&r, i, &x);
    for (int32_t j = 0; j < V; j++) {
      int32_t at = i * V + j;
      r.bias[at] = lcg(&x) % 5 == 0 ? 4 * unit(&x) - 2 : 0;
      r.counts[at] = (float)(lcg(&x) % 7 < 2 ? lcg(&x) % 4 : 0);
      r.seen[at] = r.counts[at] > 0 || lcg(&x) % 6 == 0;
    }
    r.pen[3 * i] = i % 3 == 0 ? 1 : 0.5f + 2 * unit(&x);
    r.pen[3 * i + 1] = 4 * unit(&x) - 2, r.pen[3 * i + 2] = 4 * unit(&x) - 2;
  }
  /* row 0: token 7 forced by its bias, drawn at temperature 1 */
  r.bias[7] = 60, r.fp[0] = 1, r.fp[1] = 1, r.fp[2] = 0, r.ip[0] = 0;
  results res[2];
  bool ok = run_sampler(ctx, &r, false, &res[0]) && run_sampler(ctx, &r, true, &res[1]);
  if (ok) {
    const float *got = nb_array_data(res[0].out[4]);
    int bad = 0;
    for (int32_t i = 0; i < R * V; i++) {
      float want = ref_process(r.z[i], r.bias[i], r.counts[i], r.seen[i], r.pen + 3 * (i / V));
      if (memcmp(&got[i], &want, sizeof want)) bad++;
    }
    CHECK_MSG(bad == 0, "processors: %d of %d logits differ from the reference arithmetic", bad, R * V);
    const int32_t *tok = nb_array_data(res[0].out[0]);
    CHECK_MSG(tok[0] == 7, "a logit_bias of 60 on token 7: drew %d", tok[0]);
    const float *lp = nb_array_data(res[0].out[1]);
    for (int32_t i = 0; i < R; i++) {
      if (r.fp[3 * i] == 0) CHECK_MSG(tok[i] == ref_argmax(got + i * V, V), "row %d: greedy after processors", i);
      /* logprobs are the raw logits', before the processors */
      const float *z = r.z + i * V;
      float m = z[ref_argmax(z, V)];
      double sum = 0;
      for (int32_t j = 0; j < V; j++) sum += exp((double)z[j] - m);
      CHECK_MSG(lp[i] == (float)(z[tok[i]] - (m + log(sum))), "row %d: logprob %g is not the raw logits'", i, lp[i]);
    }
    for (int o = 0; o < 5; o++)
      CHECK_MSG(nb_array_nbytes(res[0].out[o]) == nb_array_nbytes(res[1].out[o]) &&
                    !memcmp(nb_array_data(res[0].out[o]), nb_array_data(res[1].out[o]), nb_array_nbytes(res[0].out[o])),
                "output %d: compiled differs from interpreted", o);
  }
  results_free(&res[0]);
  results_free(&res[1]);
  rows_free(&r);
}

/* Tokens drawn with N different seeds from one row: counts against the
 * distribution (chi-square with V - 1 degrees of freedom, bound at a tail
 * probability of about 1e-6), and nothing outside the support. */
static double chi_square(nb_ctx *ctx, const float *z, int32_t V, float T, int32_t top_k, float top_p, int N, int32_t *outside) {
  rows r;
  rows_alloc(&r, N, V, false);
  for (int i = 0; i < N; i++) {
    memcpy(r.z + (size_t)i * V, z, (size_t)V * sizeof *z);
    r.fp[3 * i] = T, r.fp[3 * i + 1] = top_p, r.ip[3 * i] = top_k, r.ip[3 * i + 2] = 1;
    r.keys[4 * i] = 7, r.keys[4 * i + 1] = (uint32_t)i;
  }
  results res;
  double chi = INFINITY;
  *outside = 0;
  if (run_sampler(ctx, &r, true, &res)) {
    double w[64], total = 0, count[64] = {0};
    nb_serve__row p = row_params(&r, 0, 0);
    ref_weights(&p, z, V, w);
    for (int32_t i = 0; i < V; i++) total += w[i];
    const int32_t *tok = nb_array_data(res.out[0]);
    for (int i = 0; i < N; i++) count[tok[i]] += 1;
    chi = 0;
    for (int32_t i = 0; i < V; i++) {
      double e = N * w[i] / total;
      if (e > 0) chi += (count[i] - e) * (count[i] - e) / e;
      else *outside += (int32_t)count[i];
    }
  }
  results_free(&res);
  rows_free(&r);
  return chi;
}

static void test_distribution(nb_ctx *ctx) {
  enum { V = 8, N = 20000 };
  const float z[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 0.2f, -1.0f, 1.2f};
  /* chi-square bounds at a tail probability near 1e-6: df 7 -> 38, df 3 -> 30, df 2 -> 28 */
  struct { float T; int32_t k; float p; double bound; } cases[] = {{0.7f, 0, 1, 38}, {1.6f, 0, 1, 38}, {1.3f, 4, 1, 30}, {1, 0, 0.6f, 28}};
  for (int c = 0; c < 4; c++) {
    int32_t outside;
    double chi = chi_square(ctx, z, V, cases[c].T, cases[c].k, cases[c].p, N, &outside);
    CHECK_MSG(chi < cases[c].bound && outside == 0, "T %g top_k %d top_p %g: chi-square %.1f (bound %.0f), %d draws outside the support",
              cases[c].T, cases[c].k, cases[c].p, chi, cases[c].bound, outside);
    printf("distribution: T %.1f top_k %d top_p %.1f over %d seeds: chi-square %.1f (bound %.0f)\n", cases[c].T, cases[c].k,
           cases[c].p, N, chi, cases[c].bound);
  }
}

/* The kernel's passes built for the baseline, AVX2 and AVX-512 give the
 * same weights, tokens and logprobs bit for bit (each one this CPU runs;
 * the others are reported skipped). */
static void test_isas(nb_ctx *ctx) {
  enum { ROWS = 24, V = 5000 };
  uint32_t x = 2024;
  rows r;
  rows_alloc(&r, ROWS, V, false);
  for (int32_t i = 0; i < ROWS; i++) {
    random_logits(r.z + i * V, V, i % 4, &x);
    random_params(&r, i, &x);
  }
  nb_serve__scratch s;
  CHECK_OK(ctx, nb_serve__scratch_init(ctx, &s, V));
  double *w[3], *dw = malloc(V * sizeof *dw);
  nb_serve__row_out out[3][ROWS];
  int best = nb_serve__sampler_isa(-1), ran = 0;
  static const char *const names[3] = {"baseline", "AVX2", "AVX-512"};
  for (int isa = 0; isa < 3; isa++) {
    w[isa] = calloc((size_t)ROWS * V, sizeof(double));
    if (nb_serve__sampler_isa(isa) < 0) {
      printf("isa %s: SKIPPED (this CPU lacks it)\n", names[isa]);
      continue;
    }
    ran++;
    for (int32_t i = 0; i < ROWS; i++) {
      nb_serve__row p = row_params(&r, i, (i + 0.5) / ROWS);
      double total;
      nb_serve__sample_weights(&p, r.z + i * V, V, &s, w[isa] + (size_t)i * V, &total);
      nb_serve__sample_row(&p, r.z + i * V, r.z + i * V, V, &s, dw, &out[isa][i]);
    }
    if (isa == 0) continue;
    CHECK_MSG(!memcmp(w[0], w[isa], (size_t)ROWS * V * sizeof(double)), "isa %s: weights differ from the baseline's", names[isa]);
    CHECK_MSG(!memcmp(out[0], out[isa], sizeof out[0]), "isa %s: draws or logprobs differ from the baseline's", names[isa]);
  }
  CHECK(nb_serve__sampler_isa(best) == best);
  printf("isa: %d of 3 builds of the sampler's passes ran, the same bits\n", ran);
  for (int isa = 0; isa < 3; isa++) free(w[isa]);
  free(dw);
  nb_serve__scratch_free(ctx, &s);
  rows_free(&r);
}

static void test_bad_shapes(nb_ctx *ctx) {
  int64_t rv[2] = {2, 5}, r2[2] = {2, 2}, r3[2] = {2, 3}, r4[2] = {2, 4};
  nb_graph *g = nb_graph_create(ctx);
  nb_serve__sample_in si = {.logits = nb_graph_input(g, "z", nb_aval_make(NB_F32, 2, rv)),
                            .fparams = nb_graph_input(g, "f", nb_aval_make(NB_F32, 2, r2)),
                            .iparams = nb_graph_input(g, "i", nb_aval_make(NB_I32, 2, r3)),
                            .keys = nb_graph_input(g, "k", nb_aval_make(NB_U32, 2, r4))};
  nb_serve__sample_out so;
  CHECK(nb_serve__sample_op(&si, &so) == NB_ERR_SHAPE);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "fparams") != NULL, "%s", nb_ctx_error(ctx));
  nb_graph_destroy(g);
  nb_ctx_clear_error(ctx);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  CHECK_OK(ctx, nb_serve_register_kernels(ctx, NULL));
  size_t base = nb_ctx_bytes_in_use(ctx);
  test_bad_shapes(ctx);
  test_greedy_ties(ctx);
  test_weights(ctx);
  test_draws(ctx, false);
  test_draws(ctx, true);
  nb_ctx_set_prng_impl(ctx, NB_PRNG_THREEFRY_PARTITIONABLE);
  test_draws(ctx, false);
  nb_ctx_set_prng_impl(ctx, NB_PRNG_THREEFRY);
  test_processors(ctx);
  test_distribution(ctx);
  test_isas(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/sample");
}
