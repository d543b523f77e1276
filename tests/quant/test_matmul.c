/* quant.matmul against its traced reference (nb_quant_matmul_reference:
 * dequantize as traced ops, then dot_general) on random inputs, per qtype x
 * tile (ragged last tiles; int8_block also tiles of 16 and 48, whose
 * halves of a 32-block lie in two tiles) x activation mode x M (1, 2, 7,
 * 16, 64) with N
 * odd, on every kernel this CPU has (forced one by one): within the f32
 * rounding of the dot products, and every kernel bit-identical to the C
 * one (the integer W8A8 path and, by construction, the float lanes). Also:
 * a compiled executable on two threads gives the interpreter's bits; the
 * vjp for x against the f64 product with the dequantized weight and a
 * central finite difference; errors naming the field. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jitcheck.h"
#include "nabla/quant.h"
#include "quant/internal.h"
#include "test.h"

typedef struct cfg {
  nb_quant_layout l;
  nb_quant_act act;
  bool reference;
  bool specials; /* fp8: NaN and infinity codes planted in the values */
} cfg;

static nb_status trace_mm(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const cfg *c = u;
  nb_val *x = nb_tree_get_val(in, "x"), *v = nb_tree_get_val(in, "w/values"), *s = nb_tree_get_val(in, "w/scales");
  nb_val *z = c->l.asymmetric ? nb_tree_get_val(in, "w/zero_points") : NULL;
  nb_val *y = c->reference ? nb_quant_matmul_reference(x, v, s, z, &c->l, c->act) : nb_quant_matmul(x, v, s, z, &c->l, c->act);
  return nb_tree_set_val(out, "y", y);
}

static nb_array *random_f32(nb_ctx *ctx, int rank, const int64_t *dims, nb_test_rng *r, double sd) {
  nb_array *a = nb_array_empty(ctx, NB_F32, rank, dims);
  float *p = nb_array_data_mut(a);
  for (int64_t i = 0; i < nb_array_size(a); i++) p[i] = (float)(sd * nb_test_normal(r));
  return a;
}

/* inputs {x, w/...} for x[m, k] (rank 3 [2, m/2, k] when m is even: the
 * leading dims flatten) and a quantized W[n, k] */
static nb_tree *make_inputs(nb_ctx *ctx, const cfg *c, int64_t m, nb_test_rng *r, nb_quant_weight *q) {
  nb_array *w = random_f32(ctx, 2, (int64_t[]){c->l.n, c->l.k}, r, 0.05);
  nb_quant_calib cal = {.kind = c->l.asymmetric ? NB_QUANT_MINMAX : NB_QUANT_ABSMAX};
  nb_status st = nb_quant_quantize(ctx, w, c->l.qtype, c->l.tile, &cal, q);
  nb_array_release(w);
  if (st != NB_OK) return NULL;
  if (c->specials) { /* a tree from elsewhere may hold any code: NaN and (e5m2) infinities */
    uint8_t *v = (uint8_t *)nb_array_data(q->values);
    const uint8_t e4[2] = {0x7f, 0xff}, e5[4] = {0x7c, 0xfc, 0x7d, 0xfe};
    for (int i = 0; i < 4; i++) {
      int64_t at = (int64_t)(nb_test_uniform(r) * (double)(c->l.n * c->l.k));
      v[at] = c->l.qtype == NB_QUANT_FP8_E4M3 ? e4[i % 2] : e5[i];
    }
  }
  nb_array *x = m % 2 == 0 ? random_f32(ctx, 3, (int64_t[]){2, m / 2, c->l.k}, r, 1.0) : random_f32(ctx, 2, (int64_t[]){m, c->l.k}, r, 1.0);
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, "x", x);
  nb_quant_weight_to_tree(t, "w", q);
  nb_array_release(x);
  return t;
}

static nb_array *run1(nb_ctx *ctx, const nb_graph *g, const nb_tree *in) {
  nb_tree *out = nb_tree_create(ctx);
  nb_array *y = NULL;
  if (nb_graph_run(ctx, g, in, out) == NB_OK) (y = nb_tree_get_array(out, "y")), nb_array_retain(y);
  nb_tree_destroy(out);
  return y;
}

/* |got - want| <= tol * sum_k |x_k| |w_k| per output (the scale of a dot
 * product's rounding error), in f64 against the dequantized weight */
static double worst_ratio(nb_ctx *ctx, const nb_array *x, const nb_quant_weight *q, const nb_array *got, const nb_array *want) {
  nb_array *wd = nb_quant_dequantize(ctx, q);
  const float *xp = nb_array_data(x), *wp = nb_array_data(wd), *gp = nb_array_data(got), *rp = nb_array_data(want);
  int64_t K = q->layout.k, N = q->layout.n, M = nb_array_size(x) / K;
  double worst = 0;
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double mag = 0;
      for (int64_t k = 0; k < K; k++)
        if (isfinite(wp[n * K + k])) mag += fabs((double)xp[m * K + k] * wp[n * K + k]);
      double g = gp[m * N + n], w = rp[m * N + n];
      double d = isnan(g) || isnan(w) || isinf(g) || isinf(w) ? (g == w || (isnan(g) && isnan(w)) ? 0 : INFINITY)
                                                             : fabs(g - w) / (mag + 1e-30);
      worst = d > worst ? d : worst;
    }
  nb_array_release(wd);
  return worst;
}

#define TOL 1e-6 /* about 8 f32 epsilons of sum |x w|: two orders of summation (seen: under 1e-7) */
static double seen_worst; /* printed: how close the kernels come to TOL */

/* equal bits, any NaN equal to any NaN */
static bool same_bits(const nb_array *a, const nb_array *b) {
  const float *p = nb_array_data(a), *q = nb_array_data(b);
  for (int64_t i = 0; i < nb_array_size(a); i++)
    if (memcmp(&p[i], &q[i], sizeof(float)) != 0 && !(isnan(p[i]) && isnan(q[i]))) return false;
  return true;
}

static void check_config(nb_ctx *ctx, cfg c, int64_t m, uint64_t seed) {
  nb_test_rng r = {seed};
  nb_quant_weight q;
  nb_tree *in = make_inputs(ctx, &c, m, &r, &q);
  CHECK_MSG(in != NULL, "quantize: %s", nb_ctx_error(ctx));
  if (!in) return;
  nb_tree *spec = nb_tree_copy(in);
  c.reference = false;
  nb_graph *gk = nb_trace(ctx, trace_mm, &c, spec);
  c.reference = true;
  nb_graph *gr = nb_trace(ctx, trace_mm, &c, spec);
  CHECK_MSG(gk && gr, "trace: %s", nb_ctx_error(ctx));
  nb_array *want = gr ? run1(ctx, gr, in) : NULL, *first = NULL;
  const char *what = nb_quant_type_name(c.l.qtype);
  for (int f = 0; f < NB_QUANT__F_COUNT && gk && want; f++)
    for (int i = 0; i < NB_QUANT__I_COUNT; i++) {
      bool w8a8 = c.act != NB_QUANT_ACT_NONE;
      if ((w8a8 ? f : i) != 0) continue; /* the float kernels for weight-only, the integer ones for W8A8 */
      if (!nb_quant__force_isa(f, i)) continue;
      nb_array *got = run1(ctx, gk, in);
      CHECK_MSG(got != NULL, "run: %s", nb_ctx_error(ctx));
      if (!got) continue;
      double ratio = worst_ratio(ctx, nb_tree_get_array(in, "x"), &q, got, want);
      CHECK_MSG(ratio <= TOL, "%s%s %s tile %lld m %lld k %lld n %lld on %s/%s: error %.3g x sum|x w|", what, c.l.asymmetric ? " asym" : "",
                nb_quant_act_name(c.act), (long long)c.l.tile, (long long)m, (long long)c.l.k, (long long)c.l.n, nb_quant__fisa_name((nb_quant__fisa)f),
                nb_quant__iisa_name((nb_quant__iisa)i), ratio);
      seen_worst = ratio > seen_worst ? ratio : seen_worst;
      if (!first) first = got;
      else {
        CHECK_MSG(same_bits(first, got), "%s tile %lld m %lld: %s/%s differs from c",
                  what, (long long)c.l.tile, (long long)m, nb_quant__fisa_name((nb_quant__fisa)f), nb_quant__iisa_name((nb_quant__iisa)i));
        nb_array_release(got);
      }
    }
  nb_quant__force_isa(-1, -1);
  nb_array_release(first);
  nb_array_release(want);
  nb_graph_destroy(gk);
  nb_graph_destroy(gr);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
  nb_quant_weight_release(&q);
}

/* dequantize_traced (interpreted and compiled) gives nb_quant_dequantize's
 * bits: every weight is one f32 multiply of an exact code by its scale */
static nb_status trace_deq(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const cfg *c = u;
  nb_val *z = c->l.asymmetric ? nb_tree_get_val(in, "w/zero_points") : NULL;
  return nb_tree_set_val(out, "y", nb_quant_dequantize_traced(nb_tree_get_val(in, "w/values"), nb_tree_get_val(in, "w/scales"), z, &c->l));
}

static void test_dequantize_traced(nb_ctx *ctx) {
  int64_t tiles[3] = {0, 32, 64};
  for (int qt = 0; qt < NB_QUANT_TYPE_COUNT; qt++)
    for (int asym = 0; asym < 2; asym++)
      for (int ti = 0; ti < 3; ti++) {
        if (asym && qt > NB_QUANT_INT4) continue;
        cfg c = {.l = {.qtype = (nb_quant_type)qt, .n = 9, .k = 101, .tile = tiles[ti] ? tiles[ti] : 101, .asymmetric = asym}};
        nb_test_rng r = {(uint64_t)(31 + qt * 7 + ti)};
        nb_quant_weight q;
        nb_tree *in = make_inputs(ctx, &c, 1, &r, &q);
        nb_graph *g = in ? nb_trace(ctx, trace_deq, &c, in) : NULL;
        nb_array *want = g ? nb_quant_dequantize(ctx, &q) : NULL, *got = g ? run1(ctx, g, in) : NULL;
        CHECK_MSG(want && got && same_bits(want, got), "%s%s tile %lld: dequantize_traced differs from nb_quant_dequantize",
                  nb_quant_type_name(c.l.qtype), asym ? " asym" : "", (long long)tiles[ti]);
        if (g && qt == NB_QUANT_INT4 && ti == 1) { /* and compiled */
          nb_jit_opts o = nb_test_jit_opts(NULL);
          nb_exe *e = nb_jit(ctx, g, &o);
          nb_tree *out = nb_tree_create(ctx);
          CHECK_MSG(e && nb_exe_run(e, in, out) == NB_OK, "jit: %s", nb_ctx_error(ctx));
          nb_array *cg = nb_tree_get_array(out, "y");
          CHECK(want && cg && same_bits(want, cg));
          nb_tree_destroy(out);
          nb_exe_destroy(e);
        }
        nb_array_release(want), nb_array_release(got);
        nb_graph_destroy(g);
        nb_tree_destroy(in);
        nb_quant_weight_release(&q);
      }
}

/* fp8 values holding NaN and infinity codes: NaN / inf in the same places
 * as the reference on every kernel */
static void test_special_codes(nb_ctx *ctx) {
  for (int t = NB_QUANT_FP8_E4M3; t <= NB_QUANT_FP8_E5M2; t++)
    for (int64_t m = 1; m <= 7; m += 6) {
      cfg c = {.l = {.qtype = (nb_quant_type)t, .n = 13, .k = 100, .tile = 32}, .act = NB_QUANT_ACT_NONE, .specials = true};
      check_config(ctx, c, m, 500 + (uint64_t)(t * 10 + m));
    }
}

static void test_against_reference(nb_ctx *ctx) {
  struct {
    nb_quant_type t;
    bool asym;
    nb_quant_act act;
  } kinds[] = {{NB_QUANT_INT8, false, NB_QUANT_ACT_NONE}, {NB_QUANT_INT8, true, NB_QUANT_ACT_NONE}, {NB_QUANT_INT4, false, NB_QUANT_ACT_NONE},
               {NB_QUANT_INT4, true, NB_QUANT_ACT_NONE},  {NB_QUANT_NF4, false, NB_QUANT_ACT_NONE},  {NB_QUANT_FP8_E4M3, false, NB_QUANT_ACT_NONE},
               {NB_QUANT_FP8_E5M2, false, NB_QUANT_ACT_NONE}, {NB_QUANT_INT8, false, NB_QUANT_ACT_INT8_DYNAMIC},
               {NB_QUANT_INT8, false, NB_QUANT_ACT_INT8_BLOCK}, {NB_QUANT_INT4, false, NB_QUANT_ACT_INT8_BLOCK}};
  int64_t ms[5] = {1, 2, 7, 16, 64};
  /* k = 100: tiles 32 (3 + 4), 64 (64 + 36), per-channel; k = 203 odd (a half byte); tiles 16 and 48 (int8_block
   * only) split 32-blocks between two tiles */
  int64_t ks[2] = {100, 203}, tiles[6] = {0, 32, 64, 128, 16, 48};
  uint64_t seed = 1;
  for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++)
    for (int ki = 0; ki < 2; ki++)
      for (int ti = 0; ti < 6; ti++)
        for (int mi = 0; mi < 5; mi++) {
          if (ti >= 4 && kinds[kd].act != NB_QUANT_ACT_INT8_BLOCK) continue;
          if ((ms[mi] == 64 && (ti != 2 || ki)) || (ms[mi] == 16 && ki)) continue; /* the larger M on a few tilings only: time */
          cfg c = {.l = {.qtype = kinds[kd].t, .n = mi % 2 ? 13 : 37, .k = ks[ki], .tile = tiles[ti] ? tiles[ti] : ks[ki],
                         .asymmetric = kinds[kd].asym},
                   .act = kinds[kd].act};
          check_config(ctx, c, ms[mi], seed++);
        }
}

/* compiled on two threads: the interpreter's bits (the pool splits n) */
static void test_compiled(nb_ctx *ctx) {
  cfg c = {.l = {.qtype = NB_QUANT_INT4, .n = 301, .k = 96, .tile = 32}, .act = NB_QUANT_ACT_NONE};
  for (int a = 0; a < 4; a++) {
    if (a == 1) c.l.qtype = NB_QUANT_INT8, c.act = NB_QUANT_ACT_INT8_DYNAMIC;
    if (a == 2) c.l.qtype = NB_QUANT_INT4, c.act = NB_QUANT_ACT_INT8_BLOCK;
    if (a == 3) c.l.qtype = NB_QUANT_INT8, c.l.tile = 16; /* GGUF Q6_K's layout, int8_block */
    nb_test_rng r = {99};
    nb_quant_weight q;
    nb_tree *in = make_inputs(ctx, &c, 5, &r, &q);
    nb_graph *g = nb_trace(ctx, trace_mm, &c, in);
    nb_array *want = g ? run1(ctx, g, in) : NULL;
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.threads = 2;
    nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
    CHECK_MSG(e != NULL, "jit: %s", nb_ctx_error(ctx));
    nb_tree *out = nb_tree_create(ctx);
    if (e) CHECK_OK(ctx, nb_exe_run(e, in, out));
    nb_array *got = nb_tree_get_array(out, "y");
    CHECK(want && got && memcmp(nb_array_data(want), nb_array_data(got), nb_array_nbytes(want)) == 0);
    nb_tree_destroy(out);
    nb_exe_destroy(e);
    nb_array_release(want);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
    nb_quant_weight_release(&q);
  }
}

/* ---------------------------------------------------------------- int8_block, bit for bit */

/* docs/quant.md's definition of int8_block, written here apart from
 * kernels.c: per 32-block x codes round(x / s) half to even, s = max |x| /
 * 127 (f32 divide); 8 lanes of 4 exact products per block; acc_j =
 * fma(lane_j, s_w(tile of lane j's first k, the last tile past k) * s_x,
 * acc_j) in order of blocks; the fixed tree ((l_i + l_i+4) + (.. i+2)) +
 * (.. i+1). */
static float block_definition(const float *x, const nb_quant_weight *q, int64_t n) {
  const nb_quant_layout *l = &q->layout;
  const int64_t K = l->k, T = nb_quant_num_tiles(l), rb = nb_quant__row_bytes(l);
  const uint8_t *row = (const uint8_t *)nb_array_data(q->values) + n * rb;
  const float *sw = (const float *)nb_array_data(q->scales) + n * T;
  float acc[8] = {0};
  for (int64_t b0 = 0; b0 < K; b0 += 32) {
    int64_t len = K - b0 < 32 ? K - b0 : 32;
    float amax = 0;
    bool finite = true;
    for (int64_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[b0 + i])), finite &= isfinite(x[b0 + i]) != 0;
    float s = finite ? amax / 127.0f : NAN;
    int32_t code[32] = {0};
    for (int64_t i = 0; i < len && s > 0; i++) code[i] = (int32_t)fminf(127, fmaxf(-127, nearbyintf(x[b0 + i] / s)));
    for (int j = 0; j < 8; j++) {
      int64_t t = (b0 + 4 * j) / l->tile;
      float d = sw[t < T ? t : T - 1] * s;
      int32_t lane = 0;
      for (int64_t k = b0 + 4 * j; k < b0 + 4 * j + 4 && k < K; k++) {
        int w = l->qtype == NB_QUANT_INT4 ? ((row[k / 2] >> (4 * (k % 2))) & 15) - 8 : (int8_t)row[k];
        lane += w * code[k - b0];
      }
      acc[j] = fmaf((float)lane, d, acc[j]);
    }
  }
  float a[4];
  for (int i = 0; i < 4; i++) a[i] = acc[i] + acc[i + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

/* k = 120: with tile 16 the last block's halves are tiles 6 and 7 (7
 * ragged); k = 100 and 203: the last block's second half is past k */
static void test_block_definition(nb_ctx *ctx) {
  int64_t ks[4] = {100, 203, 64, 120}, tiles[5] = {32, 64, 0, 16, 48};
  int checked_isas = 0;
  for (int qt = 0; qt < 2; qt++)
    for (int ki = 0; ki < 4; ki++)
      for (int ti = 0; ti < 5; ti++) {
        cfg c = {.l = {.qtype = qt ? NB_QUANT_INT4 : NB_QUANT_INT8, .n = 13, .k = ks[ki], .tile = tiles[ti] ? tiles[ti] : ks[ki]},
                 .act = NB_QUANT_ACT_INT8_BLOCK};
        nb_test_rng r = {(uint64_t)(700 + qt * 9 + ki * 3 + ti)};
        nb_quant_weight q;
        int64_t M = 3;
        nb_tree *in = make_inputs(ctx, &c, M, &r, &q);
        float *x = in ? nb_array_data_mut(nb_tree_get_array(in, "x")) : NULL;
        if (x && ki == 1) { /* a zero block, a NaN in the last block of row 2 */
          for (int64_t k = 32; k < 64; k++) x[k] = 0;
          x[2 * c.l.k + 200] = NAN;
        }
        nb_graph *g = in ? nb_trace(ctx, trace_mm, &c, in) : NULL;
        CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
        for (int i = 0; i < NB_QUANT__I_COUNT && g; i++) {
          if (!nb_quant__force_isa(0, i)) continue;
          checked_isas++;
          nb_array *y = run1(ctx, g, in);
          CHECK_MSG(y != NULL, "run: %s", nb_ctx_error(ctx));
          const float *yp = y ? nb_array_data(y) : NULL;
          int bad = 0;
          for (int64_t m = 0; m < M && yp; m++)
            for (int64_t n = 0; n < c.l.n; n++) {
              float want = block_definition(x + m * c.l.k, &q, n), got = yp[m * c.l.n + n];
              if (memcmp(&want, &got, 4) != 0 && !(isnan(want) && isnan(got))) bad++;
              if (ki == 1 && m == 2 && !isnan(got)) bad++;
            }
          CHECK_MSG(bad == 0, "%s k %lld tile %lld on %s: %d outputs differ from the definition", nb_quant_type_name(c.l.qtype),
                    (long long)c.l.k, (long long)tiles[ti], nb_quant__iisa_name((nb_quant__iisa)i), bad);
          nb_array_release(y);
        }
        nb_quant__force_isa(-1, -1);
        nb_graph_destroy(g);
        nb_tree_destroy(in);
        nb_quant_weight_release(&q);
      }
  CHECK(checked_isas >= 40); /* the C kernel at least, on every case */
}

/* ---------------------------------------------------------------- vjp */

static nb_status trace_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_tree *o = nb_tree_create(nb_graph_ctx(g));
  nb_status st = trace_mm(g, in, o, u);
  nb_val *y = nb_tree_get_val(o, "y"), *r = nb_tree_get_val(in, "r");
  nb_tree_destroy(o);
  return st != NB_OK ? st : nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, r), 0, NULL));
}

static void test_vjp(nb_ctx *ctx) {
  nb_quant_act acts[2] = {NB_QUANT_ACT_NONE, NB_QUANT_ACT_INT8_DYNAMIC};
  nb_quant_type types[2] = {NB_QUANT_NF4, NB_QUANT_INT8};
  for (int a = 0; a < 2; a++) {
    cfg c = {.l = {.qtype = types[a], .n = 11, .k = 70, .tile = 32}, .act = acts[a]};
    nb_test_rng r = {7};
    nb_quant_weight q;
    nb_tree *in = make_inputs(ctx, &c, 3, &r, &q);
    nb_array *ra = random_f32(ctx, 2, (int64_t[]){3, 11}, &r, 1.0);
    nb_tree_set_array(in, "r", ra);
    nb_graph *g = nb_trace(ctx, trace_loss, &c, in);
    nb_grad_opts go = {.wrt = "x"};
    nb_graph *dg = g ? nb_grad(ctx, g, &go) : NULL;
    CHECK_MSG(dg != NULL, "grad: %s", nb_ctx_error(ctx));
    nb_tree *out = nb_tree_create(ctx);
    if (dg) CHECK_OK(ctx, nb_graph_run(ctx, dg, in, out));
    nb_array *dx = nb_tree_get_array(out, "grad/x"), *wd = nb_quant_dequantize(ctx, &q);
    CHECK(dx != NULL && wd != NULL);
    if (dx && wd) {
      const float *gp = nb_array_data(dx), *wp = nb_array_data(wd), *rp = nb_array_data(ra), *xp = nb_array_data(nb_tree_get_array(in, "x"));
      double worst = 0, fd_worst = 0;
      for (int64_t m = 0; m < 3; m++)
        for (int64_t k = 0; k < 70; k++) {
          double want = 0, mag = 0;
          for (int64_t n = 0; n < 11; n++) want += (double)rp[m * 11 + n] * wp[n * 70 + k], mag += fabs((double)rp[m * 11 + n] * wp[n * 70 + k]);
          worst = fmax(worst, fabs(gp[m * 70 + k] - want) / (mag + 1e-30));
          if (k % 17 == 0) { /* central difference in f64 of sum(r * (x @ Wd^T)) */
            double h = 1e-3, lp = 0, lm = 0;
            for (int64_t n = 0; n < 11; n++) {
              double dp = 0, dm = 0;
              for (int64_t j = 0; j < 70; j++) {
                double xj = xp[m * 70 + j];
                dp += (j == k ? xj + h : xj) * wp[n * 70 + j], dm += (j == k ? xj - h : xj) * wp[n * 70 + j];
              }
              lp += rp[m * 11 + n] * dp, lm += rp[m * 11 + n] * dm;
            }
            fd_worst = fmax(fd_worst, fabs(gp[m * 70 + k] - (lp - lm) / (2 * h)) / (mag + 1e-30));
          }
        }
      CHECK_MSG(worst <= TOL, "%s: dx off by %.3g x sum|ct w|", nb_quant_type_name(types[a]), worst);
      CHECK_MSG(fd_worst <= 1e-5, "%s: dx off the finite difference by %.3g", nb_quant_type_name(types[a]), fd_worst);
    }
    CHECK(nb_tree_get_array(out, "grad/w/values") == NULL); /* integer: never differentiated */
    nb_tree_destroy(out);
    nb_array_release(wd);
    nb_array_release(ra);
    nb_graph_destroy(dg);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
    nb_quant_weight_release(&q);
  }
}

/* ---------------------------------------------------------------- errors */

typedef struct bad_case {
  nb_quant_layout l;
  nb_quant_act act;
  int64_t xk, vals_cols, scale_cols;
  bool zp;
  const char *needle;
} bad_case;

static nb_status trace_bad(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const bad_case *b = u;
  nb_val *x = nb_tree_get_val(in, "x"), *v = nb_tree_get_val(in, "v"), *s = nb_tree_get_val(in, "s");
  nb_val *z = b->zp ? nb_tree_get_val(in, "z") : NULL;
  (void)g;
  return nb_tree_set_val(out, "y", nb_quant_matmul(x, v, s, z, &b->l, b->act));
}

static void test_errors(nb_ctx *ctx) {
  bad_case cases[] = {
      {{NB_QUANT_INT4, 5, 64, 32, false}, 0, 63, 32, 2, false, "x: f32[..., 64]"},
      {{NB_QUANT_INT4, 5, 64, 32, false}, 0, 64, 64, 2, false, "values: u8[5, 32]"},
      {{NB_QUANT_INT4, 5, 64, 32, false}, 0, 64, 32, 1, false, "scales: f32[5, 2]"},
      {{NB_QUANT_INT4, 5, 64, 20, false}, 0, 64, 32, 4, false, "tile: 20"},
      {{NB_QUANT_INT4, 5, 64, 32, false}, NB_QUANT_ACT_INT8_DYNAMIC, 64, 32, 2, false, "act: int8 dynamic"},
      {{NB_QUANT_INT4, 5, 64, 32, true}, 0, 64, 32, 2, false, "zero_points: missing"},
      {{NB_QUANT_NF4, 5, 64, 32, true}, 0, 64, 32, 2, true, "asymmetric: nf4"},
      {{NB_QUANT_INT8, 5, 64, 32, false}, (nb_quant_act)7, 64, 64, 2, false, "act: 7"},
      {{NB_QUANT_NF4, 5, 64, 32, false}, NB_QUANT_ACT_INT8_BLOCK, 64, 32, 2, false, "act: int8_block activations need int8 or int4"},
      {{NB_QUANT_INT4, 5, 64, 32, true}, NB_QUANT_ACT_INT8_BLOCK, 64, 32, 2, true, "act: int8_block activations need int8 or int4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bad_case *b = &cases[i];
    nb_tree *spec = nb_tree_create(ctx);
    nb_dtype vt = b->l.qtype == NB_QUANT_INT8 && !b->l.asymmetric ? NB_I8 : NB_U8;
    nb_array *x = nb_array_zeros(ctx, NB_F32, 2, (int64_t[]){3, b->xk}), *v = nb_array_zeros(ctx, vt, 2, (int64_t[]){5, b->vals_cols});
    nb_array *s = nb_array_zeros(ctx, NB_F32, 2, (int64_t[]){5, b->scale_cols}), *z = nb_array_zeros(ctx, NB_U8, 2, (int64_t[]){5, b->scale_cols});
    nb_tree_set_array(spec, "x", x), nb_tree_set_array(spec, "v", v), nb_tree_set_array(spec, "s", s), nb_tree_set_array(spec, "z", z);
    nb_graph *g = nb_trace(ctx, trace_bad, b, spec);
    CHECK_MSG(g == NULL, "case %zu traced", i);
    CHECK_MSG(strstr(nb_ctx_error(ctx), b->needle) != NULL, "case %zu: '%s' lacks '%s'", i, nb_ctx_error(ctx), b->needle);
    nb_ctx_clear_error(ctx);
    nb_graph_destroy(g);
    nb_array_release(x), nb_array_release(v), nb_array_release(s), nb_array_release(z);
    nb_tree_destroy(spec);
  }
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  for (int f = 0; f < NB_QUANT__F_COUNT; f++)
    printf("float kernel %s: %s\n", nb_quant__fisa_name((nb_quant__fisa)f), nb_quant__fisa_supported((nb_quant__fisa)f) ? "tested" : "SKIPPED (not on this CPU)");
  for (int i = 0; i < NB_QUANT__I_COUNT; i++)
    printf("int kernel %s: %s\n", nb_quant__iisa_name((nb_quant__iisa)i), nb_quant__iisa_supported((nb_quant__iisa)i) ? "tested" : "SKIPPED (not on this CPU)");
  test_against_reference(ctx);
  printf("largest error against the reference: %.3g x sum|x w| (tolerance %g)\n", seen_worst, TOL);
  test_special_codes(ctx);
  test_block_definition(ctx);
  test_dequantize_traced(ctx);
  test_compiled(ctx);
  test_vjp(ctx);
  test_errors(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_matmul");
}
