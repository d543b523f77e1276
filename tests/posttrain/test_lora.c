/* LoRA and QLoRA through the linear hook: the config's errors naming the
 * field, the adapter tree (paths mirror the base's, shapes, B = 0, A's
 * range), logits at init bit-equal to the base's, only the adapters
 * differentiated (the base frozen), the adapters' gradient against central
 * finite differences in f64, merge against base + adapter, and QLoRA
 * (int8, int4, nf4 bases through quant.matmul) against the same adapters on
 * the dequantized f32 base. */
#include "../models/model_test_util.h"
#include "primcheck.h"
#include "nabla/posttrain.h"
#include "nabla/quant.h"

static nb_model_config small_llama(void) {
  nb_model_config c = tiny_config("llama-tiny", 16);
  c.d_model = 32, c.d_ff = 48, c.vocab_size = 40, c.tie_embeddings = false;
  return c;
}

static nb_array *tokens(nb_ctx *ctx, const nb_model_config *c, int64_t b, int64_t t, uint64_t seed) {
  nb_test_rng rng = {seed};
  int32_t ids[64];
  for (int64_t i = 0; i < b * t; i++) ids[i] = (int32_t)nb_test_int(&rng, 0, c->vocab_size - 1);
  return nb_array_create(ctx, NB_I32, 2, (int64_t[2]){b, t}, ids);
}

/* replaces every lora_b (zeros at init) by normal * std, so the adapters matter */
static void randomize_b(nb_ctx *ctx, nb_tree *ad, double std, uint64_t seed) {
  nb_test_rng rng = {seed};
  for (size_t i = 0; i < nb_tree_size(ad); i++) {
    const char *p = nb_tree_path(ad, i);
    if (!strstr(p, "/lora_b")) continue;
    nb_array *b = nb_tree_get_array(ad, p);
    nb_array *r = nb_test_randn(ctx, &rng, nb_array_dtype(b), nb_array_rank(b), nb_array_dims(b));
    nb_array *o = nb_array_empty(ctx, NB_F64, nb_array_rank(b), nb_array_dims(b));
    double *d = nb_array_data_mut(o);
    for (int64_t k = 0; k < nb_array_size(r); k++) d[k] = std * nb_array_get(r, k);
    nb_array *cast = nb_array_astype(ctx, o, nb_array_dtype(b));
    nb_tree_set_array(ad, p, cast);
    nb_array_release(cast), nb_array_release(o), nb_array_release(r);
  }
}

/* logits of the model: params (plain run, no hook) or, with a lora, the
 * adapters as "params" and the base as "frozen" through the hook */
static nb_array *logits(nb_ctx *ctx, const nb_model_config *c, const nb_tree *base, const nb_tree *ad, nb_pt_lora *l,
                        const nb_array *toks) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", (nb_array *)toks);
  nb_model_trace_opts o = {0};
  if (l) o = (nb_model_trace_opts){.linear_hook = nb_pt_lora_hook, .hook_ud = l, .frozen_spec = base};
  const nb_tree *params = l ? ad : base;
  nb_graph *g = nb_model_trace_forward(ctx, c, &o, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_array *out = NULL;
  if (g) {
    nb_tree *in = nb_tree_create(ctx), *res = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    if (l) nb_tree_merge(in, "frozen", base);
    nb_tree_merge(in, "batch", batch);
    nb_exe *e = nb_jit(ctx, g, NULL);
    CHECK_MSG(e, "%s", nb_ctx_error(ctx));
    if (e) CHECK_OK(ctx, nb_exe_run(e, in, res));
    out = nb_tree_get_array(res, "logits");
    if (out) nb_array_retain(out);
    nb_exe_destroy(e);
    nb_tree_destroy(in);
    nb_tree_destroy(res);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(batch);
  return out;
}

static double max_abs_diff(const nb_array *a, const nb_array *b, double *scale) {
  double m = 0, s = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    m = fmax(m, fabs(nb_array_get(a, i) - nb_array_get(b, i)));
    s = fmax(s, fabs(nb_array_get(b, i)));
  }
  if (scale) *scale = s;
  return m;
}

/* ---------------------------------------------------------------- config */

static void test_config_errors(nb_ctx *ctx) {
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 1);
  nb_tree *base = nb_model_init(ctx, &c, key);
  static const struct {
    nb_pt_lora_config cfg;
    const char *needle;
  } bad[] = {
      {{.target = ".*", .rank = 0, .alpha = 1}, "lora.rank: 0"},
      {{.target = ".*", .rank = 2, .alpha = 0}, "lora.alpha"},
      {{.target = ".*", .rank = 2, .alpha = 1, .dropout = 1}, "lora.dropout: 1"},
      {{.target = "", .rank = 2, .alpha = 1}, "lora.target: empty"},
      {{.target = "a(b", .rank = 2, .alpha = 1}, "lora.target: 'a(b'"},
      /* full match: "attn/wq" is no suffix search; the message lists the linears */
      {{.target = "attn/wq", .rank = 2, .alpha = 1}, "matches no linear of the base (its linears: layers/0/attn/wq"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    nb_tree *ad = nb_pt_lora_init(ctx, &bad[i].cfg, base, key, NB_F32);
    CHECK_MSG(!ad, "case %zu accepted", i);
    CHECK_MSG(strstr(nb_ctx_error(ctx), bad[i].needle), "case %zu: '%s' lacks '%s'", i, nb_ctx_error(ctx), bad[i].needle);
    nb_tree_destroy(ad);
  }
  nb_pt_lora_init_kind k;
  CHECK(nb_pt_lora_init_parse(ctx, "gaussian", &k) == NB_OK && k == NB_PT_LORA_INIT_GAUSSIAN);
  CHECK(nb_pt_lora_init_parse(ctx, "xavier", &k) != NB_OK && strstr(nb_ctx_error(ctx), "lora.init: 'xavier'"));

  /* adapters that do not fit the base */
  nb_pt_lora_config lc = {.target = ".*attn/wq", .rank = 4, .alpha = 8};
  nb_tree *ad = nb_pt_lora_init(ctx, &lc, base, key, NB_F32);
  CHECK_MSG(ad, "%s", nb_ctx_error(ctx));
  nb_pt_lora_config r3 = lc;
  r3.rank = 3;
  CHECK(!nb_pt_lora_create(ctx, &r3, base, ad));
  CHECK_ERR(ctx, NB_ERR_SHAPE, "layers/0/attn/wq/lora_a': [32, 3] wanted");
  nb_tree *extra = nb_tree_copy(ad);
  nb_tree_set_array(extra, "layers/0/attn/wz/lora_a", nb_tree_get_array(ad, "layers/0/attn/wq/lora_a"));
  CHECK(!nb_pt_lora_create(ctx, &lc, base, extra));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "the base has no linear 'layers/0/attn/wz'");
  nb_tree_destroy(extra);
  /* a path both trainable and frozen is refused */
  nb_tree *batch = nb_tree_create(ctx);
  nb_array *toks = tokens(ctx, &c, 1, 4, 3);
  nb_tree_set_array(batch, "inputs", toks);
  nb_model_trace_opts o = {.frozen_spec = base};
  nb_graph *g = nb_model_trace_forward(ctx, &c, &o, base, batch);
  CHECK(!g);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'embed/embedding' is both a parameter and a frozen parameter");
  nb_graph_destroy(g);
  nb_array_release(toks);
  nb_tree_destroy(batch);
  nb_tree_destroy(ad);
  nb_tree_destroy(base);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- init */

static void test_init(nb_ctx *ctx) {
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 2);
  nb_tree *base = nb_model_init(ctx, &c, key);
  nb_pt_lora_config lc = {.target = ".*attn/w[qv]|.*mlp/wo", .rank = 4, .alpha = 8};
  nb_tree *ad = nb_pt_lora_init(ctx, &lc, base, key, NB_F32);
  CHECK_MSG(ad, "%s", nb_ctx_error(ctx));
  if (ad) {
    CHECK_MSG(nb_tree_size(ad) == 2 * 3 * 2, "%zu adapter leaves", nb_tree_size(ad));
    CHECK(!strcmp(nb_tree_path(ad, 0), "layers/0/attn/wq/lora_a") && !strcmp(nb_tree_path(ad, 1), "layers/0/attn/wq/lora_b"));
    nb_array *A = nb_tree_get_array(ad, "layers/1/mlp/wo/lora_a"), *B = nb_tree_get_array(ad, "layers/1/mlp/wo/lora_b");
    CHECK(A && nb_array_dims(A)[0] == 48 && nb_array_dims(A)[1] == 4 && B && nb_array_dims(B)[0] == 4 && nb_array_dims(B)[1] == 32);
    double bound = 1 / sqrt(48.0), amax = 0, bmax = 0;
    for (int64_t i = 0; A && i < nb_array_size(A); i++) amax = fmax(amax, fabs(nb_array_get(A, i)));
    for (int64_t i = 0; B && i < nb_array_size(B); i++) bmax = fmax(bmax, fabs(nb_array_get(B, i)));
    CHECK_MSG(amax <= bound && amax > 0.5 * bound && bmax == 0, "max |A| %g (bound %g), max |B| %g", amax, bound, bmax);
  }
  CHECK(nb_pt_lora_scale(&lc) == 2.0);
  nb_pt_lora_config rs = lc;
  rs.rslora = true;
  CHECK(nb_pt_lora_scale(&rs) == 4.0);
  rs.init = NB_PT_LORA_INIT_GAUSSIAN;
  nb_tree *g = nb_pt_lora_init(ctx, &rs, base, key, NB_F32);
  nb_array *ga = g ? nb_tree_get_array(g, "layers/0/attn/wq/lora_a") : NULL;
  double ss = 0;
  for (int64_t i = 0; ga && i < nb_array_size(ga); i++) ss += nb_array_get(ga, i) * nb_array_get(ga, i);
  double std = ga ? sqrt(ss / (double)nb_array_size(ga)) : 0;
  CHECK_MSG(std > 0.15 && std < 0.35, "gaussian init: std %g, want about 1/r = 0.25", std);
  nb_tree_destroy(g);
  nb_tree_destroy(ad);
  nb_tree_destroy(base);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- logits */

/* at init (B = 0) the adapted model's logits are the base's, bit for bit;
 * with trained-looking adapters they move, and the merged tree gives
 * base + adapter within f32 rounding */
static void test_logits_and_merge(nb_ctx *ctx) {
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 3);
  nb_tree *base = nb_model_init(ctx, &c, key);
  nb_pt_lora_config lc = {.target = ".*(attn/w[qkvo]|mlp/w.*)|lm_head", .rank = 4, .alpha = 8, .dropout = 0.1};
  nb_tree *ad = nb_pt_lora_init(ctx, &lc, base, key, NB_F32);
  nb_pt_lora *l = ad ? nb_pt_lora_create(ctx, &lc, base, ad) : NULL;
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  if (!l) goto done;
  CHECK(nb_pt_lora_count(l) == 2 * 7 + 1);
  nb_array *toks = tokens(ctx, &c, 3, 9, 11);
  nb_array *lb = logits(ctx, &c, base, NULL, NULL, toks), *la = logits(ctx, &c, base, ad, l, toks);
  if (lb && la) {
    int64_t differ = 0;
    for (int64_t i = 0; i < nb_array_size(lb); i++) differ += nb_array_get(lb, i) != nb_array_get(la, i);
    CHECK_MSG(differ == 0, "at init %lld of %lld logits differ from the base's", (long long)differ, (long long)nb_array_size(lb));
  }
  randomize_b(ctx, ad, 0.2, 5);
  nb_tree *merged = nb_pt_lora_merge(ctx, &lc, base, ad);
  CHECK_MSG(merged, "%s", nb_ctx_error(ctx));
  if (merged) {
    CHECK_OK(ctx, nb_tree_check_same(ctx, base, merged, true, "base and merged trees"));
    CHECK(nb_tree_get_array(merged, "embed/embedding") == nb_tree_get_array(base, "embed/embedding"));
    nb_array *lt = logits(ctx, &c, base, ad, l, toks), *lm = logits(ctx, &c, merged, NULL, NULL, toks);
    if (lt && lm && lb) {
      double scale, d = max_abs_diff(lm, lt, &scale), moved = max_abs_diff(lt, lb, NULL);
      /* f32: W + s A B rounded once vs x W + s (x A) B summed in another order */
      CHECK_MSG(d <= 2e-6 * scale, "merged vs base + adapter: max |diff| %g at max |logit| %g", d, scale);
      CHECK_MSG(moved > 100 * 2e-6 * scale, "the adapters moved the logits by only %g", moved);
      fprintf(stderr, "merge: max |merged - (base + adapter)| %.3g, max |logit| %.3g, adapters moved logits by %.3g\n", d,
              scale, moved);
    }
    nb_array_release(lt), nb_array_release(lm);
  }
  nb_tree_destroy(merged);
  nb_array_release(lb), nb_array_release(la), nb_array_release(toks);
done:
  nb_pt_lora_destroy(l);
  nb_tree_destroy(ad);
  nb_tree_destroy(base);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- gradients */

/* loss(adapters) on the f64 model, interpreted */
typedef struct loss_fixture {
  nb_ctx *ctx;
  nb_graph *loss, *vg;
  const nb_tree *base, *batch;
} loss_fixture;

static double eval_loss(loss_fixture *f, const nb_tree *ad) {
  nb_tree *in = nb_tree_create(f->ctx), *out = nb_tree_create(f->ctx);
  nb_tree_merge(in, "params", ad);
  nb_tree_merge(in, "frozen", f->base);
  nb_tree_merge(in, "batch", f->batch);
  nb_status s = nb_graph_run(f->ctx, f->loss, in, out);
  double v = s ? NAN : nb_array_get(nb_tree_get_array(out, "loss"), 0);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return v;
}

static void test_grad_fd(nb_ctx *ctx) {
  nb_model_config c = small_llama();
  c.n_layers = 1;
  nb_array *key = nb_key(ctx, 4);
  nb_tree *base = nb_model_init_dtype(ctx, &c, key, NB_F64);
  nb_pt_lora_config lc = {.target = ".*attn/w[qv]|.*mlp/wi_0|lm_head", .rank = 3, .alpha = 6, .rslora = true};
  nb_tree *ad = nb_pt_lora_init(ctx, &lc, base, key, NB_F64);
  if (ad) randomize_b(ctx, ad, 0.3, 9);
  nb_pt_lora *l = ad ? nb_pt_lora_create(ctx, &lc, base, ad) : NULL;
  nb_array *toks = tokens(ctx, &c, 2, 6, 13), *tgts = tokens(ctx, &c, 2, 6, 14);
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", toks);
  nb_tree_set_array(batch, "targets", tgts);
  nb_model_trace_opts o = {.dtype = NB_F64, .linear_hook = nb_pt_lora_hook, .hook_ud = l, .frozen_spec = base};
  nb_graph *loss = l ? nb_model_trace_loss(ctx, &c, &o, ad, batch) : NULL;
  nb_graph *vg = loss ? nb_value_and_grad(ctx, loss, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  if (!vg) goto done;
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", ad);
  nb_tree_merge(in, "frozen", base);
  nb_tree_merge(in, "batch", batch);
  CHECK_OK(ctx, nb_graph_run(ctx, vg, in, out));
  /* only the adapters are differentiated: no gradient of the frozen base */
  size_t n_grads = 0;
  for (size_t i = 0; i < nb_tree_size(out); i++) {
    const char *p = nb_tree_path(out, i);
    n_grads += !strncmp(p, "grad/", 5);
    CHECK_MSG(strncmp(p, "grad/frozen", 11) != 0, "a gradient of the base: %s", p);
  }
  CHECK_MSG(n_grads == nb_tree_size(ad), "%zu gradients for %zu adapter leaves", n_grads, nb_tree_size(ad));
  loss_fixture f = {.ctx = ctx, .loss = loss, .base = base, .batch = batch};
  double worst = 0;
  int checked = 0;
  nb_test_rng rng = {21};
  for (size_t i = 0; i < nb_tree_size(ad); i++) {
    const char *p = nb_tree_path(ad, i);
    char gp[300];
    snprintf(gp, sizeof gp, "grad/params/%s", p);
    nb_array *g = nb_tree_get_array(out, gp), *w = nb_tree_get_array(ad, p);
    if (!g) {
      CHECK_MSG(false, "no %s", gp);
      continue;
    }
    for (int rep = 0; rep < 3; rep++) {
      int64_t k = nb_test_int(&rng, 0, nb_array_size(w) - 1);
      double h = 1e-6, v[2];
      for (int side = 0; side < 2; side++) {
        nb_array *wc = nb_array_astype(ctx, w, NB_F64); /* a copy to perturb */
        nb_array *pert = nb_array_empty(ctx, NB_F64, nb_array_rank(w), nb_array_dims(w));
        double *d = nb_array_data_mut(pert);
        for (int64_t j = 0; j < nb_array_size(w); j++) d[j] = nb_array_get(wc, j);
        d[k] += side ? -h : h;
        nb_tree *t = nb_tree_copy(ad);
        nb_tree_set_array(t, p, pert);
        v[side] = eval_loss(&f, t);
        nb_tree_destroy(t);
        nb_array_release(pert), nb_array_release(wc);
      }
      double fd = (v[0] - v[1]) / (2 * h), an = nb_array_get(g, k);
      double err = fabs(fd - an) / fmax(1e-3, fabs(an));
      worst = fmax(worst, err);
      checked++;
      CHECK_MSG(err < 1e-6, "%s[%lld]: analytic %.10g, finite differences %.10g", p, (long long)k, an, fd);
    }
  }
  fprintf(stderr, "grad: %d adapter entries vs central differences (f64, h 1e-6): worst relative error %.3g\n", checked, worst);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
done:
  nb_graph_destroy(vg);
  nb_graph_destroy(loss);
  nb_tree_destroy(batch);
  nb_array_release(toks), nb_array_release(tgts);
  nb_pt_lora_destroy(l);
  nb_tree_destroy(ad);
  nb_tree_destroy(base);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- QLoRA */

/* adapters over a quantized base (the hook runs quant.matmul) against the
 * same adapters over the dequantized f32 base (plain products): logits, and
 * the adapters' gradients; the merge of a quantized base is f32 */
static void test_qlora(nb_ctx *ctx, const char *qtype) {
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 6);
  nb_tree *f32 = nb_model_init(ctx, &c, key);
  char rules_text[256];
  snprintf(rules_text, sizeof rules_text, "quant:\n  rules:\n    - {module_path: '.*', weight_qtype: %s, tile_size: 16}\n", qtype);
  nb_quant_rules *r = nb_quant_rules_parse_yaml(ctx, "r.yaml", rules_text, strlen(rules_text));
  nb_tree *q = r ? nb_quant_ptq(ctx, f32, r) : NULL;
  nb_tree *d = q ? nb_quant_dequantize_tree(ctx, q) : NULL;
  nb_pt_lora_config lc = {.target = ".*attn/w[qv]|.*mlp/wo|lm_head", .rank = 4, .alpha = 4};
  nb_tree *ad = q ? nb_pt_lora_init(ctx, &lc, q, key, NB_F32) : NULL;
  if (ad) randomize_b(ctx, ad, 0.2, 7);
  nb_pt_lora *lq = ad ? nb_pt_lora_create(ctx, &lc, q, ad) : NULL, *ld = lq ? nb_pt_lora_create(ctx, &lc, d, ad) : NULL;
  CHECK_MSG(ld, "%s: %s", qtype, nb_ctx_error(ctx));
  if (!ld) goto done;
  CHECK(nb_quant_tree_count(ctx, q) == 2 * 7 + 1 && nb_pt_lora_count(lq) == 2 * 3 + 1);
  nb_array *toks = tokens(ctx, &c, 2, 8, 17);
  nb_array *yq = logits(ctx, &c, q, ad, lq, toks), *yd = logits(ctx, &c, d, ad, ld, toks), *yf = logits(ctx, &c, f32, NULL, NULL, toks);
  nb_tree *merged = nb_pt_lora_merge(ctx, &lc, q, ad);
  CHECK_MSG(merged, "%s", nb_ctx_error(ctx));
  nb_array *ym = merged ? logits(ctx, &c, merged, NULL, NULL, toks) : NULL;
  if (yq && yd && yf && ym) {
    double scale, diff = max_abs_diff(yq, yd, &scale), fdiff = max_abs_diff(yq, yf, NULL), mdiff = max_abs_diff(ym, yq, NULL);
    CHECK_MSG(diff <= 1e-5 * scale, "%s: QLoRA vs dequantized f32 + LoRA logits differ by %g (scale %g)", qtype, diff, scale);
    CHECK_MSG(fdiff > 1000 * 1e-5 * scale, "%s: quantization moved the logits by only %g", qtype, fdiff);
    CHECK_MSG(mdiff <= 1e-5 * scale, "%s: merged (f32) vs QLoRA logits differ by %g", qtype, mdiff);
    CHECK(nb_tree_find(merged, "layers/0/attn/wq/kernel") >= 0 && nb_tree_find(merged, "layers/0/attn/wq/kernel/values") < 0);
    fprintf(stderr, "qlora %s: |quantized + LoRA - dequantized f32 + LoRA| %.3g, |merged - QLoRA| %.3g, max |logit| %.3g\n", qtype,
            diff, mdiff, scale);
  }
  /* the adapters' gradient through quant.matmul's vjp for x */
  nb_array *tg = tokens(ctx, &c, 2, 8, 18);
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", toks);
  nb_tree_set_array(batch, "targets", tg);
  nb_array *grads[2] = {0};
  for (int side = 0; side < 2; side++) {
    const nb_tree *b = side ? d : q;
    nb_model_trace_opts o = {.linear_hook = nb_pt_lora_hook, .hook_ud = side ? ld : lq, .frozen_spec = b};
    nb_graph *loss = nb_model_trace_loss(ctx, &c, &o, ad, batch);
    nb_graph *vg = loss ? nb_value_and_grad(ctx, loss, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
    nb_exe *e = vg ? nb_jit(ctx, vg, NULL) : NULL;
    CHECK_MSG(e, "%s: %s", qtype, nb_ctx_error(ctx));
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_tree_merge(in, "params", ad);
    nb_tree_merge(in, "frozen", b);
    nb_tree_merge(in, "batch", batch);
    if (e && !nb_exe_run(e, in, out)) {
      grads[side] = nb_tree_get_array(out, "grad/params/layers/0/attn/wq/lora_a");
      if (grads[side]) nb_array_retain(grads[side]);
    }
    nb_tree_destroy(in), nb_tree_destroy(out);
    nb_exe_destroy(e), nb_graph_destroy(vg), nb_graph_destroy(loss);
  }
  if (grads[0] && grads[1]) {
    double scale, diff = max_abs_diff(grads[0], grads[1], &scale);
    CHECK_MSG(diff <= 1e-4 * scale && scale > 0, "%s: adapter gradients differ by %g (scale %g)", qtype, diff, scale);
  } else {
    CHECK_MSG(false, "%s: no gradients", qtype);
  }
  nb_array_release(grads[0]), nb_array_release(grads[1]);
  nb_tree_destroy(batch);
  nb_array_release(tg);
  nb_tree_destroy(merged);
  nb_array_release(yq), nb_array_release(yd), nb_array_release(yf), nb_array_release(ym), nb_array_release(toks);
done:
  nb_pt_lora_destroy(lq), nb_pt_lora_destroy(ld);
  nb_tree_destroy(ad), nb_tree_destroy(d), nb_tree_destroy(q), nb_tree_destroy(f32);
  nb_quant_rules_destroy(r);
  nb_array_release(key);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_config_errors(ctx);
  test_init(ctx);
  test_logits_and_merge(ctx);
  test_grad_fd(ctx);
  test_qlora(ctx, "int8");
  test_qlora(ctx, "int4");
  test_qlora(ctx, "nf4");
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_lora");
}
