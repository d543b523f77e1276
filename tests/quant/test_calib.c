/* Static activation ranges (int8_static): the W8A8 product with a fixed
 * activation scale against its definition written here in f64 (codes
 * round(x / s) saturating at +-127) and the traced reference, bit for bit
 * across kernels; the calibration pass's observed inputs of a tiny Llama's
 * first attention projections against the same inputs computed here by hand
 * (embedding rows through RMSNorm); the act_scale each act_calibration
 * gives; an uncalibrated linear refused by the hook; the rules' YAML. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../models/model_test_util.h"
#include "jitcheck.h"
#include "nabla/quant.h"
#include "primcheck.h"
#include "quant/internal.h"

enum { M = 3, K = 80, N = 13 };

typedef struct sjob {
  const nb_quant_layout *l;
  float s;
  bool reference;
} sjob;

static nb_status static_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g;
  const sjob *j = u;
  nb_val *x = nb_tree_get_val(in, "x"), *v = nb_tree_get_val(in, "values"), *sc = nb_tree_get_val(in, "scales");
  return nb_tree_set_val(out, "y", j->reference ? nb_quant_matmul_reference_static(x, v, sc, j->l, j->s)
                                                : nb_quant_matmul_static(x, v, sc, j->l, j->s));
}

static void test_static_product(nb_ctx *ctx) {
  nb_test_rng rng = {31};
  nb_array *w = nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){N, K}), *x = nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){M, K});
  float *xv = (float *)nb_array_data(x);
  const float s = 0.02f; /* |x| > 127 s = 2.54 saturates */
  xv[5] = 9.0f, xv[K + 7] = -4.0f, xv[2 * K + 79] = 1e30f, xv[2 * K] = -INFINITY;
  int saturated = 0;
  for (int i = 0; i < M * K; i++) saturated += fabsf(xv[i]) > 127.5f * s;
  nb_quant_weight q;
  CHECK_OK(ctx, nb_quant_quantize(ctx, w, NB_QUANT_INT8, 32, NULL, &q));
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x), nb_tree_set_array(in, "values", q.values), nb_tree_set_array(in, "scales", q.scales);
  /* the definition: codes clamp(rint(x / s)), exact integer tile sums, y = sum_t dot_t * (s_w * s) */
  double want[M * N];
  const int8_t *wc = nb_array_data(q.values);
  const float *ws = nb_array_data(q.scales);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double y = 0;
      for (int t = 0; t * 32 < K; t++) {
        long dot = 0;
        for (int k = t * 32; k < K && k < t * 32 + 32; k++) {
          double c = nearbyint((double)xv[m * K + k] / s);
          dot += (long)(c > 127 ? 127 : c < -127 ? -127 : c) * wc[n * K + k];
        }
        y += (double)dot * (double)(ws[n * 3 + t] * s);
      }
      want[m * N + n] = y;
    }
  nb_array *first = NULL;
  int kernels = 0;
  for (int i = 0; i < NB_QUANT__I_COUNT; i++) {
    if (!nb_quant__force_isa(0, i)) continue;
    sjob j = {&q.layout, s, false};
    nb_array *y = nb_test_eval_output(ctx, static_fn, &j, in, "y");
    if (!y) continue;
    double worst = 0;
    for (int e = 0; e < M * N; e++) worst = fmax(worst, fabs(nb_array_get(y, e) - want[e]) / fmax(1, fabs(want[e])));
    CHECK_MSG(worst <= 1e-6, "%s: static W8A8 vs its definition: %g", nb_quant__iisa_name(i), worst);
    if (first) CHECK_MSG(!memcmp(nb_array_data(first), nb_array_data(y), sizeof(float) * M * N), "%s: bits differ from the C kernel's",
                         nb_quant__iisa_name(i));
    else first = (nb_array_retain(y), y);
    nb_array_release(y);
    kernels++;
  }
  nb_quant__force_isa(-1, -1);
  sjob rj = {&q.layout, s, true};
  nb_array *yr = nb_test_eval_output(ctx, static_fn, &rj, in, "y");
  if (yr && first) {
    double worst = 0;
    for (int e = 0; e < M * N; e++) worst = fmax(worst, fabs(nb_array_get(yr, e) - nb_array_get(first, e)) / fmax(1, fabs(want[e])));
    CHECK_MSG(worst <= 1e-6, "static W8A8 kernel vs traced reference: %g", worst);
  }
  CHECK_MSG(kernels >= 2 && saturated >= 4, "%d kernels, %d saturated activations", kernels, saturated);
  fprintf(stderr, "static W8A8: %d kernels, %d of %d activations saturated, bit-identical\n", kernels, saturated, M * K);
  /* a NaN activation makes its row NaN */
  xv[K + 3] = NAN;
  sjob j = {&q.layout, s, false};
  nb_array *yn = nb_test_eval_output(ctx, static_fn, &j, in, "y");
  CHECK(yn && isnan(nb_array_get(yn, N)) && !isnan(nb_array_get(yn, 0)));
  /* a scale that is no scale is refused naming it */
  sjob bad = {&q.layout, -1, false};
  CHECK(!nb_test_eval_output(ctx, static_fn, &bad, in, "y")); /* (it prints the message naming act_scale) */
  nb_array_release(yn), nb_array_release(yr), nb_array_release(first);
  nb_quant_weight_release(&q);
  nb_tree_destroy(in);
  nb_array_release(w), nb_array_release(x);
}

/* ---------------------------------------------------------------- calibration */

static const char calib_rules[] = "quant:\n  rules:\n"
                                  "    - {module_path: 'layers/0/attn/w[qkv]', weight_qtype: int8, act_qtype: int8_static}\n"
                                  "    - {module_path: 'layers/1/mlp/wo', weight_qtype: int8, act_qtype: int8_static, act_calibration: 'rms,3'}\n"
                                  "    - {module_path: lm_head, weight_qtype: int8, act_qtype: int8_static, act_calibration: 'fixed,-2,3'}\n"
                                  "    - {module_path: '.*', weight_qtype: int4, tile_size: 16}\n";

static nb_array *forward(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, nb_nn_linear_hook hook, void *ud,
                         const nb_array *tokens, nb_quant_observer *obs) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", (nb_array *)tokens);
  nb_model_trace_opts o = {.linear_hook = hook, .hook_ud = ud};
  nb_graph *g = nb_model_trace_forward(ctx, c, &o, params, batch);
  nb_array *logits = NULL;
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params), nb_tree_merge(in, "batch", batch);
  nb_exe *e = g ? nb_jit(ctx, g, NULL) : NULL;
  if (e && !nb_exe_run(e, in, out)) {
    if (obs) CHECK_OK(ctx, nb_quant_observer_add(obs, out));
    if ((logits = nb_tree_get_array(out, "logits"))) nb_array_retain(logits);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in), nb_tree_destroy(out), nb_tree_destroy(batch);
  return logits;
}

/* The quantized tree's products as ordinary traced ops (ud: the tree). */
static nb_val *reference_hook(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  nb_quant_linear l;
  bool found;
  if (nb_quant_tree_linear(nb_graph_ctx(a->g), ud, path, &l, &found) || !found) return nb_nn_linear_default(a, path, x, stacked);
  char p[300], s[300], z[300];
  snprintf(p, sizeof p, "%s/kernel/values", path), snprintf(s, sizeof s, "%s/kernel/scales", path);
  snprintf(z, sizeof z, "%s/kernel/zero_points", path);
  nb_val *v = nb_tree_get_val(a->params, p), *sc = nb_tree_get_val(a->params, s);
  if (l.act == NB_QUANT_ACT_INT8_STATIC) return nb_quant_matmul_reference_static(x, v, sc, &l.layout, l.act_scale);
  return nb_quant_matmul_reference(x, v, sc, l.layout.asymmetric ? nb_tree_get_val(a->params, z) : NULL, &l.layout, l.act);
}

static void test_calibration(nb_ctx *ctx) {
  nb_model_config c = tiny_config("llama-tiny", 16);
  c.tie_embeddings = false, c.scan_layers = false;
  nb_array *key = nb_key(ctx, 8);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_quant_rules *r = nb_quant_rules_parse_yaml(ctx, "r.yaml", calib_rules, strlen(calib_rules));
  nb_quant_observer *obs = r ? nb_quant_observer_create(ctx, r) : NULL;
  CHECK_MSG(obs, "%s", nb_ctx_error(ctx));
  if (!obs) goto done;
  enum { B = 2, T = 8, BATCHES = 2 };
  int32_t ids[BATCHES][B * T];
  nb_test_rng rng = {4};
  for (int b = 0; b < BATCHES; b++)
    for (int i = 0; i < B * T; i++) ids[b][i] = (int32_t)nb_test_int(&rng, 0, c.vocab_size - 1);
  for (int b = 0; b < BATCHES; b++) {
    nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[]){B, T}, ids[b]);
    nb_array *l = forward(ctx, &c, params, nb_quant_observe_hook, obs, tok, obs);
    CHECK_MSG(l, "calibration batch %d: %s", b, nb_ctx_error(ctx));
    nb_array_release(l), nb_array_release(tok);
  }
  /* by hand: layer 0's attention input is RMSNorm(embedding[id]) * scale */
  nb_array *emb = nb_tree_get_array(params, "embed/embedding"), *ns = nb_tree_get_array(params, "layers/0/attn_norm/scale");
  const float *ev = nb_array_data(emb), *nv = nb_array_data(ns);
  int64_t d = c.d_model;
  double mn = INFINITY, mx = -INFINITY, ss = 0;
  for (int b = 0; b < BATCHES; b++)
    for (int i = 0; i < B * T; i++) {
      const float *row = ev + ids[b][i] * d;
      double ms = 0;
      for (int64_t k = 0; k < d; k++) ms += (double)row[k] * row[k];
      double inv = 1 / sqrt(ms / (double)d + c.norm_eps);
      for (int64_t k = 0; k < d; k++) {
        double v = row[k] * inv * nv[k];
        mn = fmin(mn, v), mx = fmax(mx, v), ss += v * v;
      }
    }
  double rms = sqrt(ss / (double)(BATCHES * B * T * d));
  nb_quant_observed o, ov, wo;
  CHECK(nb_quant_observer_get(obs, "layers/0/attn/wq", &o) && nb_quant_observer_get(obs, "layers/0/attn/wv", &ov));
  CHECK_MSG(o.count == BATCHES * B * T * d && fabs(o.min - mn) <= 1e-5 * fabs(mn) && fabs(o.max - mx) <= 1e-5 * fabs(mx) &&
                fabs(o.rms - rms) <= 1e-5 * rms,
            "observed [%g, %g] rms %g count %lld; by hand [%g, %g] rms %g", o.min, o.max, o.rms, (long long)o.count, mn, mx, rms);
  CHECK(ov.min == o.min && ov.max == o.max);
  CHECK(nb_quant_observer_get(obs, "layers/1/mlp/wo", &wo) && wo.count == BATCHES * B * T * c.d_ff);
  nb_quant_observed none;
  CHECK(!nb_quant_observer_get(obs, "lm_head", &none) && !nb_quant_observer_get(obs, "layers/0/mlp/wo", &none)); /* fixed; not static */

  /* the scales: absmax, rms,3, fixed,-2,3 (set by PTQ already) */
  nb_tree *q = nb_quant_ptq(ctx, params, r);
  nb_quant_linear lq;
  bool found;
  CHECK(q && !nb_quant_tree_linear(ctx, q, "layers/0/attn/wq", &lq, &found) && found && isnan(lq.act_scale));
  CHECK(q && !nb_quant_tree_linear(ctx, q, "lm_head", &lq, &found) && found && lq.act_scale == (float)(3.0 / 127));
  nb_quant_plan *plan = q ? nb_quant_plan_create(ctx, q) : NULL;
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[]){B, T}, ids[0]);
  CHECK(plan && !forward(ctx, &c, q, nb_quant_linear_hook, plan, tok, NULL));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'layers/0/attn/wq': int8_static activations without a calibrated act_scale");
  nb_quant_plan_destroy(plan);
  nb_quant_observer *empty = nb_quant_observer_create(ctx, r);
  CHECK(q && nb_quant_observer_apply(empty, q) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'layers/0/attn/w");
  nb_quant_observer_destroy(empty);
  CHECK_OK(ctx, nb_quant_observer_apply(obs, q));
  CHECK(!nb_quant_tree_linear(ctx, q, "layers/0/attn/wk", &lq, &found) && lq.act_scale == (float)(fmax(-o.min, o.max) / 127));
  CHECK(!nb_quant_tree_linear(ctx, q, "layers/1/mlp/wo", &lq, &found) && lq.act_scale == (float)(3 * wo.rms / 127));
  CHECK(!nb_quant_tree_linear(ctx, q, "lm_head", &lq, &found) && lq.act_scale == (float)(3.0 / 127));
  /* the calibrated model runs: logits equal those of the same products as traced ops */
  plan = nb_quant_plan_create(ctx, q);
  nb_array *lcal = forward(ctx, &c, q, nb_quant_linear_hook, plan, tok, NULL), *lref = forward(ctx, &c, q, reference_hook, q, tok, NULL);
  CHECK_MSG(lcal && lref, "%s", nb_ctx_error(ctx));
  if (lcal && lref) {
    double dq = nb_test_max_rel_diff(lcal, lref);
    CHECK_MSG(dq <= 1e-5, "calibrated static model vs its traced reference: relative %g", dq);
    fprintf(stderr, "observed layers/0/attn/wq inputs [%.6g, %.6g] rms %.6g (by hand [%.6g, %.6g] rms %.6g); calibrated model vs "
            "reference logits: relative %.3g\n", o.min, o.max, o.rms, mn, mx, rms, dq);
  }
  nb_array_release(lcal), nb_array_release(lref), nb_array_release(tok);
  nb_quant_plan_destroy(plan);
  nb_tree_destroy(q);
done:
  nb_quant_observer_destroy(obs);
  nb_quant_rules_destroy(r);
  nb_tree_destroy(params);
  nb_array_release(key);
}

static void test_rules(nb_ctx *ctx) {
  static const struct { const char *text, *needle; } errs[] = {
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int4, act_qtype: int8_static}\n", "rule 0: act_qtype: int8_static needs int8"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, act_calibration: 'rms,2'}\n", "act_calibration: only int8_static"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, act_qtype: int8_static, act_calibration: 'fixed,3,1'}\n",
       "r.yaml:3: rule 0: act_calibration: calibration: 'fixed,3,1'"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, act_qtype: int8_static, act_calibration: median}\n",
       "r.yaml:3: rule 0: act_calibration"},
  };
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) {
    nb_quant_rules *r = nb_quant_rules_parse_yaml(ctx, "r.yaml", errs[i].text, strlen(errs[i].text));
    CHECK_MSG(!r, "accepted: %s", errs[i].text);
    CHECK_MSG(strstr(nb_ctx_error(ctx), errs[i].needle), "'%s' lacks '%s'", nb_ctx_error(ctx), errs[i].needle);
    nb_ctx_clear_error(ctx);
    nb_quant_rules_destroy(r);
  }
  nb_quant_rules *r = nb_quant_rules_parse_yaml(ctx, "r.yaml", calib_rules, strlen(calib_rules));
  CHECK(r && nb_quant_rules_at(r, 1)->act_qtype == NB_QUANT_ACT_INT8_STATIC && nb_quant_rules_at(r, 1)->act_calibration.kind == NB_QUANT_RMS &&
        nb_quant_rules_at(r, 1)->act_calibration.k == 3 && nb_quant_rules_at(r, 0)->act_calibration.kind == NB_QUANT_ABSMAX);
  nb_quant_rules_destroy(r);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_static_product(ctx);
  test_calibration(ctx);
  test_rules(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_calib");
}
