/* QAT: the fake-quantized weight is dequantize(quantize(w)) of the host
 * codec bit for bit (every qtype, tiles with a ragged last one, every
 * calibration); its gradient is the clipped straight-through estimator
 * (the f32 gradient at the dequantized weight, zero where the code was
 * clamped), and that f32 gradient agrees with central finite differences;
 * fake activations round as the W8A8 kernels, with the gradient passing
 * straight through; the QAT hook's model is the model PTQ gives. */
#include <math.h>

#include "../lib/jitcheck.h"
#include "../lib/primcheck.h"
#include "../models/model_test_util.h"
#include "nabla/quant.h"

enum { K = 80, N = 37, M = 5 }; /* K = 80: 32-wide tiles end with a ragged one of 16 */

typedef struct job {
  const nb_quant_rule *rule;
  bool fake; /* false: the plain f32 product (the oracle) */
} job;

static nb_status fake_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const job *j = u;
  return nb_tree_set_val(out, "y", nb_quant_fake_weight(nb_tree_get_val(in, "w"), j->rule));
}

static nb_status act_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const job *j = u;
  return nb_tree_set_val(out, "y", nb_quant_fake_act(nb_tree_get_val(in, "x"), j->rule->act_qtype));
}

/* loss = sum(tanh(act(x) @ fake(w)) * c), or the same in f32 on the given x and w */
static nb_status loss_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const job *j = u;
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w"), *c = nb_tree_get_val(in, "c");
  if (j->fake) x = nb_quant_fake_act(x, j->rule->act_qtype), w = nb_quant_fake_weight(w, j->rule);
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}};
  nb_val *y = nb_tanh(nb_dot_general(x, w, &dn, NB_F32));
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, c), 0, NULL));
}

/* w with a few outliers, so tight calibrations clamp some codes */
static nb_array *weights(nb_ctx *ctx, nb_test_rng *rng, int64_t rows, int64_t cols) {
  nb_array *w = nb_test_randn(ctx, rng, NB_F32, 2, (int64_t[]){rows, cols});
  float *p = (float *)nb_array_data(w);
  for (int64_t i = 0; i < rows * cols; i++) p[i] *= 0.05f;
  for (int i = 0; i < 20; i++) p[nb_test_int(rng, 0, rows * cols - 1)] *= 8;
  return w;
}

/* The host's dequantize(quantize(kernel^T))^T: what PTQ gives. */
static nb_array *host_fake(nb_ctx *ctx, const nb_array *kernel, const nb_quant_rule *r, nb_quant_weight *q) {
  nb_array *t = nb_array_transpose2d(ctx, kernel);
  CHECK_OK(ctx, nb_quant_quantize(ctx, t, r->weight_qtype, r->tile_size, &r->weight_calibration, q));
  nb_array_release(t);
  nb_array *d = nb_quant_dequantize(ctx, q);
  nb_array *back = nb_array_transpose2d(ctx, d);
  nb_array_release(d);
  return back;
}

/* The test's own saturation rule: an integer code clamped into its range,
 * or an nf4 / fp8 value beyond the largest one. */
static bool saturates(const nb_quant_weight *q, int64_t n, int64_t k, float w) {
  const nb_quant_layout *l = &q->layout;
  int64_t T = nb_quant_num_tiles(l), t = n * T + k / (l->tile < l->k ? l->tile : l->k);
  float s = ((const float *)nb_array_data(q->scales))[t];
  if (s == 0) return false;
  double r = (double)w / s;
  int z = q->zero_points ? ((const uint8_t *)nb_array_data(q->zero_points))[t] : 0;
  switch (l->qtype) {
  case NB_QUANT_INT8: return l->asymmetric ? nearbyint(r) + z > 255 || nearbyint(r) + z < 0 : fabs(nearbyint(r)) > 127;
  case NB_QUANT_INT4: /* symmetric: w = (c - 8) s, c - 8 in [-8, 7] (s < 0 when a tile's signed extreme is positive) */
    return l->asymmetric ? nearbyint(r) + z > 15 || nearbyint(r) + z < 0 : nearbyint(r) > 7 || nearbyint(r) < -8;
  case NB_QUANT_NF4: return fabs(r) > 1;
  default: return fabs(r) > nb_quant_fp8_max(l->qtype);
  }
}

static bool bits_equal(const nb_array *a, const nb_array *b, int64_t *first) {
  for (int64_t i = 0; i < nb_array_size(a); i++)
    if (memcmp((const float *)nb_array_data(a) + i, (const float *)nb_array_data(b) + i, 4)) return *first = i, false;
  return true;
}

static void test_fake_weight_bits(nb_ctx *ctx) {
  static const nb_quant_type types[] = {NB_QUANT_INT8, NB_QUANT_INT4, NB_QUANT_NF4, NB_QUANT_FP8_E4M3, NB_QUANT_FP8_E5M2};
  static const int64_t tiles[] = {0, 32, 64};
  const nb_quant_calib calibs[] = {{.kind = NB_QUANT_ABSMAX}, {.kind = NB_QUANT_MINMAX}, {.kind = NB_QUANT_RMS, .k = 1.5},
                                   {.kind = NB_QUANT_FIXED, .min = -0.04, .max = 0.07}};
  nb_test_rng rng = {11};
  int cases = 0, clamped_cases = 0;
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
    for (size_t li = 0; li < sizeof tiles / sizeof *tiles; li++)
      for (size_t ci = 0; ci < sizeof calibs / sizeof *calibs; ci++) {
        bool integer = types[ti] == NB_QUANT_INT8 || types[ti] == NB_QUANT_INT4;
        if (calibs[ci].kind == NB_QUANT_MINMAX && !integer) continue;
        nb_quant_rule r = {.module_path = "x", .weight_qtype = types[ti], .tile_size = tiles[li], .weight_calibration = calibs[ci]};
        nb_array *w = weights(ctx, &rng, K, N);
        nb_tree *in = nb_tree_create(ctx);
        nb_tree_set_array(in, "w", w);
        job j = {&r, true};
        nb_array *got = nb_test_eval_output(ctx, fake_fn, &j, in, "y");
        nb_quant_weight q;
        nb_array *want = host_fake(ctx, w, &r, &q);
        int64_t at = -1;
        CHECK_MSG(got && bits_equal(got, want, &at), "%s tile %lld calib %zu: fake weight differs from the host codec at %lld",
                  nb_quant_type_name(types[ti]), (long long)tiles[li], ci, (long long)at);
        /* the gradient: ct where the code was not clamped, 0 where it was */
        nb_array *ct = nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){K, N});
        nb_tree_set_array(in, "c", ct);
        nb_graph *g = nb_trace(ctx, fake_fn, &j, in);
        nb_graph *vjp = g ? nb_vjp(ctx, g) : NULL;
        CHECK_MSG(vjp, "%s", nb_ctx_error(ctx));
        if (vjp) {
          nb_tree *vin = nb_tree_create(ctx), *vout = nb_tree_create(ctx);
          nb_tree_merge(vin, "primal", in);
          nb_tree_set_array(vin, "ct/y", ct);
          CHECK_OK(ctx, nb_graph_run(ctx, vjp, vin, vout));
          nb_array *gw = nb_tree_get_array(vout, "grad/w");
          int bad = 0, clamped = 0;
          for (int64_t k = 0; gw && k < K; k++)
            for (int64_t n = 0; n < N; n++) {
              float wv = ((const float *)nb_array_data(w))[k * N + n], c = ((const float *)nb_array_data(ct))[k * N + n];
              bool sat = saturates(&q, n, k, wv);
              clamped += sat;
              bad += nb_array_get(gw, k * N + n) != (sat ? 0.0 : c);
            }
          CHECK_MSG(gw && !bad, "%s tile %lld calib %zu: %d gradient elements not the clipped STE's", nb_quant_type_name(types[ti]),
                    (long long)tiles[li], ci, bad);
          clamped_cases += clamped > 0;
          nb_tree_destroy(vin), nb_tree_destroy(vout);
        }
        cases++;
        nb_graph_destroy(vjp), nb_graph_destroy(g);
        nb_array_release(ct), nb_array_release(got), nb_array_release(want), nb_array_release(w);
        nb_quant_weight_release(&q);
        nb_tree_destroy(in);
      }
  /* not vacuous: the tight calibrations (rms,1.5 and fixed) clamp codes */
  CHECK_MSG(cases == 51 && clamped_cases >= 20, "%d cases, %d with clamped codes", cases, clamped_cases);
}

/* value_and_grad of loss_fn at in, run by the interpreter: *loss and the
 * gradients "grad/x", "grad/w" (new references in out) */
static nb_tree *grads(nb_ctx *ctx, job *j, const nb_tree *in) {
  nb_graph *g = nb_trace(ctx, loss_fn, j, in);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = NULL}) : NULL;
  nb_tree *out = nb_tree_create(ctx);
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  if (vg) CHECK_OK(ctx, nb_graph_run(ctx, vg, in, out));
  nb_graph_destroy(vg), nb_graph_destroy(g);
  return out;
}

/* STE: the gradient of the fake-quantized loss at (x, w) is the f32
 * gradient at (act(x), dequant(quant(w))), masked where codes clamp; the
 * f32 gradient itself agrees with central differences of the f32 loss. */
static void test_ste(nb_ctx *ctx, const char *what, const nb_quant_rule *r) {
  nb_test_rng rng = {23};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){M, K}), *w = weights(ctx, &rng, K, N);
  nb_array *c = nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){M, N});
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x), nb_tree_set_array(in, "w", w), nb_tree_set_array(in, "c", c);
  job fake = {r, true}, plain = {r, false};
  nb_tree *gf = grads(ctx, &fake, in);
  /* the oracle's inputs: act(x) and the host's dequantized weight */
  nb_quant_weight q;
  nb_array *wd = host_fake(ctx, w, r, &q);
  nb_tree *xin = nb_tree_create(ctx);
  nb_tree_set_array(xin, "x", x);
  nb_array *xq = nb_test_eval_output(ctx, act_fn, &fake, xin, "y");
  if (!xq) xq = (nb_array_retain(x), x);
  if (r->act_qtype != NB_QUANT_ACT_NONE) {
    int64_t moved = 0;
    for (int64_t i = 0; i < M * K; i++) moved += nb_array_get(xq, i) != nb_array_get(x, i);
    CHECK_MSG(moved > M * K / 2, "%s: the activations were not rounded (%lld of %d moved)", what, (long long)moved, M * K);
  }
  nb_tree *pin = nb_tree_create(ctx);
  nb_tree_set_array(pin, "x", xq), nb_tree_set_array(pin, "w", wd), nb_tree_set_array(pin, "c", c);
  nb_tree *gp = grads(ctx, &plain, pin);
  nb_array *gfw = nb_tree_get_array(gf, "grad/w"), *gpw = nb_tree_get_array(gp, "grad/w");
  nb_array *gfx = nb_tree_get_array(gf, "grad/x"), *gpx = nb_tree_get_array(gp, "grad/x");
  if (gfw && gpw && gfx && gpx) {
    double worst = 0, scale = 0;
    int masked = 0;
    for (int64_t k = 0; k < K; k++)
      for (int64_t n = 0; n < N; n++) {
        bool sat = saturates(&q, n, k, ((const float *)nb_array_data(w))[k * N + n]);
        double want = sat ? 0 : nb_array_get(gpw, k * N + n);
        masked += sat;
        worst = fmax(worst, fabs(nb_array_get(gfw, k * N + n) - want)), scale = fmax(scale, fabs(want));
      }
    CHECK_MSG(worst <= 1e-6 * scale, "%s: STE grad/w differs from the masked f32 gradient by %g (scale %g)", what, worst, scale);
    /* x's gradient passes straight through the activation rounding */
    double wx = nb_test_max_rel_diff(gfx, gpx);
    CHECK_MSG(wx <= 1e-6, "%s: grad/x differs from the f32 gradient at (act(x), dequantized w) by %g", what, wx);
    fprintf(stderr, "%s: |STE - masked f32| grad/w %.3g (scale %.3g), %d of %d weights clamped\n", what, worst, scale, masked, K * N);
  }
  /* the f32 gradient against central differences of the f32 loss (f64 on the host) */
  if (gpw) {
    const float *wv = nb_array_data(wd), *xv = nb_array_data(xq), *cv = nb_array_data(c);
    double worst = 0;
    for (int t = 0; t < 12; t++) {
      int64_t k = nb_test_int(&rng, 0, K - 1), n = nb_test_int(&rng, 0, N - 1);
      double eps = 1e-4, lp = 0, lm = 0;
      for (int64_t m = 0; m < M; m++) {
        double base = 0;
        for (int64_t kk = 0; kk < K; kk++) base += (double)xv[m * K + kk] * wv[kk * N + n];
        lp += tanh(base + eps * xv[m * K + k]) * cv[m * N + n];
        lm += tanh(base - eps * xv[m * K + k]) * cv[m * N + n];
      }
      double fd = (lp - lm) / (2 * eps), got = nb_array_get(gpw, k * N + n);
      worst = fmax(worst, fabs(fd - got) / fmax(1e-3, fabs(fd)));
    }
    CHECK_MSG(worst <= 1e-3, "%s: f32 gradient vs central differences: relative %g", what, worst);
  }
  nb_array_release(xq);
  nb_tree_destroy(xin);
  nb_quant_weight_release(&q);
  nb_array_release(wd);
  nb_tree_destroy(gf), nb_tree_destroy(gp), nb_tree_destroy(in), nb_tree_destroy(pin);
  nb_array_release(x), nb_array_release(w), nb_array_release(c);
}

/* ---------------------------------------------------------------- the hook */

static nb_array *logits_of(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, nb_nn_linear_hook hook, void *ud,
                           const nb_array *tokens) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", (nb_array *)tokens);
  nb_model_trace_opts o = {.linear_hook = hook, .hook_ud = ud};
  nb_graph *g = nb_model_trace_forward(ctx, c, &o, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_array *logits = NULL;
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  nb_exe *e = g ? nb_jit(ctx, g, NULL) : NULL;
  if (e && !nb_exe_run(e, in, out) && (logits = nb_tree_get_array(out, "logits"))) nb_array_retain(logits);
  CHECK_MSG(logits, "%s", nb_ctx_error(ctx));
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in), nb_tree_destroy(out), nb_tree_destroy(batch);
  return logits;
}

/* The QAT model (f32 parameters, the hook fake-quantizing) is the model PTQ
 * of the same parameters gives: its logits equal the quantized model's
 * (quant.matmul) within the kernels' summation order. */
static void test_qat_model(nb_ctx *ctx) {
  nb_model_config c = tiny_config("llama-tiny", 32);
  c.d_model = 64, c.d_ff = 80, c.vocab_size = 48, c.tie_embeddings = false;
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &c, key);
  static const char rules_text[] = "quant:\n  rules:\n"
                                   "    - {module_path: '.*/mlp/.*', weight_qtype: int4, tile_size: 32}\n"
                                   "    - {module_path: '.*attn/w[qkv]', weight_qtype: int8, act_qtype: int8_dynamic}\n"
                                   "    - {module_path: lm_head, weight_qtype: nf4, tile_size: 64}\n";
  nb_quant_rules *r = nb_quant_rules_parse_yaml(ctx, "r.yaml", rules_text, strlen(rules_text));
  nb_tree *q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  nb_quant_plan *plan = q ? nb_quant_plan_create(ctx, q) : NULL;
  CHECK_MSG(plan, "%s", nb_ctx_error(ctx));
  CHECK(r && nb_quant_rules_count_linears(r, params) == 2 * 6 + 1);
  if (!plan) goto done;
  int32_t ids[2 * 9];
  nb_test_rng rng = {5};
  for (int i = 0; i < 18; i++) ids[i] = (int32_t)nb_test_int(&rng, 0, c.vocab_size - 1);
  nb_array *tokens = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 9}, ids);
  nb_array *lqat = logits_of(ctx, &c, params, nb_quant_qat_hook, r, tokens), *lq = logits_of(ctx, &c, q, nb_quant_linear_hook, plan, tokens);
  nb_array *lf = logits_of(ctx, &c, params, NULL, NULL, tokens);
  if (lqat && lq && lf) {
    double dq = nb_test_max_rel_diff(lqat, lq), df = nb_test_max_rel_diff(lqat, lf);
    CHECK_MSG(dq <= 1e-5, "QAT model vs PTQ model logits: relative %g", dq);
    CHECK_MSG(df > 1e-3, "QAT model vs f32 model logits: relative %g (the fake quantization did nothing?)", df);
    fprintf(stderr, "QAT hook vs PTQ model (quant.matmul) logits: relative %.3g; vs the f32 model %.3g\n", dq, df);
  }
  nb_array_release(lqat), nb_array_release(lq), nb_array_release(lf), nb_array_release(tokens);
done:
  nb_quant_plan_destroy(plan);
  nb_tree_destroy(q), nb_tree_destroy(params);
  nb_quant_rules_destroy(r);
  nb_array_release(key);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_fake_weight_bits(ctx);
  test_ste(ctx, "int4 g32 absmax", &(nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT4, .tile_size = 32});
  test_ste(ctx, "int8 rms,2 per-channel",
           &(nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT8, .weight_calibration = {.kind = NB_QUANT_RMS, .k = 2}});
  test_ste(ctx, "int8 per-channel, int8_dynamic activations",
           &(nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT8, .act_qtype = NB_QUANT_ACT_INT8_DYNAMIC});
  test_ste(ctx, "int4 g32, int8_block activations",
           &(nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT4, .tile_size = 32, .act_qtype = NB_QUANT_ACT_INT8_BLOCK});
  test_qat_model(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_qat");
}
