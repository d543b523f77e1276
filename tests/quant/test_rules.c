/* Quantization by rules: rule matching (first match wins, full match, op
 * names), the YAML form and its errors naming the rule and field, PTQ of a small Llama's
 * parameter tree (which leaves become quantized trees, the transposition of
 * nabla's [d_in, d_out] kernels, the dequantized tree), and the quantized
 * model run through the linear hook: logits against the f32 model on the
 * dequantized weights, and greedy decoding with a KV cache token for token;
 * op names on a small Mixtral (experts only, everything but the experts),
 * its stacked quantized experts run through the hook. */
#include "../models/model_test_util.h"
#include "nabla/quant.h"

/* ---------------------------------------------------------------- rules */

static void test_rules_api(nb_ctx *ctx) {
  nb_quant_rule rs[] = {
      {.module_path = "layers/0/.*", .weight_qtype = NB_QUANT_INT4, .tile_size = 32},
      {.module_path = ".*attn/w[qkv]", .weight_qtype = NB_QUANT_INT8, .act_qtype = NB_QUANT_ACT_INT8_DYNAMIC},
      {.module_path = "attn/wo", .weight_qtype = NB_QUANT_NF4, .tile_size = 64},
  };
  nb_quant_rules *r = nb_quant_rules_create(ctx, 3, rs);
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  CHECK(nb_quant_rules_count(r) == 3 && nb_quant_rules_at(r, 1)->weight_qtype == NB_QUANT_INT8);
  CHECK(nb_quant_rules_match(r, "layers/0/attn/wq", NB_QUANT_OP_DOT_GENERAL) == 0); /* the first match wins */
  CHECK(nb_quant_rules_match(r, "layers/1/attn/wk", NB_QUANT_OP_DOT_GENERAL) == 1);
  CHECK(nb_quant_rules_match(r, "layers/1/attn/wo", NB_QUANT_OP_DOT_GENERAL) == -1); /* full match: "attn/wo" is not a suffix search */
  CHECK(nb_quant_rules_match(r, "layers/1/attn/wqx", NB_QUANT_OP_DOT_GENERAL) == -1);
  CHECK(nb_quant_rules_match(r, "xlayers/0/mlp", NB_QUANT_OP_DOT_GENERAL) == -1);
  nb_quant_rules_destroy(r);

  /* op names: a rule whose path matches but whose ops do not is skipped */
  const char *experts[] = {"stacked_dot_general"}, *both[] = {"dot_general", "stacked_dot_general"}, *plain[] = {"dot_general"};
  nb_quant_rule ops[] = {
      {.module_path = ".*/moe/.*", .op_names = experts, .n_op_names = 1, .weight_qtype = NB_QUANT_INT4, .tile_size = 32},
      {.module_path = "layers/0/.*", .op_names = both, .n_op_names = 2, .weight_qtype = NB_QUANT_INT8},
      {.module_path = ".*", .op_names = plain, .n_op_names = 1, .weight_qtype = NB_QUANT_NF4},
  };
  static const struct { const char *path; nb_quant_op op; int want; } table[] = {
      {"layers/1/moe/wi_0", NB_QUANT_OP_STACKED_DOT_GENERAL, 0}, {"layers/1/moe/router", NB_QUANT_OP_DOT_GENERAL, 2},
      {"layers/0/moe/wi_0", NB_QUANT_OP_STACKED_DOT_GENERAL, 0}, {"layers/0/moe/router", NB_QUANT_OP_DOT_GENERAL, 1},
      {"layers/0/attn/wq", NB_QUANT_OP_DOT_GENERAL, 1},           {"layers/1/attn/wq", NB_QUANT_OP_DOT_GENERAL, 2},
      {"layers/1/mlp/wo", NB_QUANT_OP_STACKED_DOT_GENERAL, -1},   {"lm_head", NB_QUANT_OP_DOT_GENERAL, 2},
  };
  r = nb_quant_rules_create(ctx, 3, ops);
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  for (size_t i = 0; r && i < sizeof table / sizeof *table; i++) {
    int got = nb_quant_rules_match(r, table[i].path, table[i].op);
    CHECK_MSG(got == table[i].want, "%s as %s: rule %d, wanted %d", table[i].path, nb_quant_op_name(table[i].op), got, table[i].want);
  }
  if (r) { /* the rule keeps its names (copies: the caller's array may go) */
    const nb_quant_rule *q1 = nb_quant_rules_at(r, 1);
    CHECK(q1->n_op_names == 2 && q1->op_names != both && !strcmp(q1->op_names[1], "stacked_dot_general"));
    CHECK(nb_quant_rules_applies_to(r, 0, NB_QUANT_OP_STACKED_DOT_GENERAL) && !nb_quant_rules_applies_to(r, 0, NB_QUANT_OP_DOT_GENERAL));
  }
  nb_quant_rules_destroy(r);
  const char *conv[] = {"dot_general", "conv"};
  ops[2].op_names = conv, ops[2].n_op_names = 2;
  CHECK(!nb_quant_rules_create(ctx, 3, ops));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 2: op_names[1]: unknown op 'conv'; known: dot_general, stacked_dot_general");
  ops[2].op_names = NULL;
  CHECK(!nb_quant_rules_create(ctx, 3, ops));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 2: op_names: 2 names and no array");

  nb_quant_rule bad[] = {{.module_path = "ok", .weight_qtype = NB_QUANT_INT8}, {.module_path = "a(b", .weight_qtype = NB_QUANT_INT8}};
  CHECK(!nb_quant_rules_create(ctx, 2, bad));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 1: module_path: 'a(b'");
  bad[1] = (nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT8, .tile_size = 20};
  CHECK(!nb_quant_rules_create(ctx, 2, bad));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 1: tile_size: 20");
  bad[0] = (nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_INT4, .act_qtype = NB_QUANT_ACT_INT8_DYNAMIC};
  CHECK(!nb_quant_rules_create(ctx, 1, bad));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 0: act_qtype");
  bad[0] = (nb_quant_rule){.module_path = "x", .weight_qtype = NB_QUANT_NF4, .weight_calibration = {.kind = NB_QUANT_MINMAX}};
  CHECK(!nb_quant_rules_create(ctx, 1, bad));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rule 0: weight_calibration: minmax");

  /* int8_block takes any tile: 16 (GGUF Q6_K's) and 48 split a 32-block between two tiles */
  nb_quant_rule blk[] = {{.module_path = "lm_head", .weight_qtype = NB_QUANT_INT8, .act_qtype = NB_QUANT_ACT_INT8_BLOCK, .tile_size = 16},
                         {.module_path = ".*", .weight_qtype = NB_QUANT_INT4, .act_qtype = NB_QUANT_ACT_INT8_BLOCK, .tile_size = 48}};
  r = nb_quant_rules_create(ctx, 2, blk);
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  nb_quant_rules_destroy(r);
}

static nb_quant_rules *yaml(nb_ctx *ctx, const char *text) { return nb_quant_rules_parse_yaml(ctx, "r.yaml", text, strlen(text)); }

static void test_rules_yaml(nb_ctx *ctx) {
  nb_quant_rules *r = yaml(ctx,
                           "model: {preset: llama-tiny}\n"
                           "quant:\n"
                           "  rules:\n"
                           "    - module_path: '.*/mlp/.*'\n"
                           "      weight_qtype: int4\n"
                           "      tile_size: 32\n"
                           "      weight_calibration: minmax\n"
                           "    - {module_path: '.*attn/.*', weight_qtype: int8, act_qtype: int8_dynamic, tile_size: per_channel}\n"
                           "    - {module_path: lm_head, weight_qtype: fp8_e4m3, weight_calibration: 'rms,3.5'}\n"
                           "    - {module_path: 'layers/0/.*', op_names: [stacked_dot_general], weight_qtype: nf4}\n"
                           "    - module_path: '.*'\n"
                           "      op_names:\n"
                           "        - dot_general\n"
                           "      weight_qtype: int4\n"
                           "      act_qtype: int8_block\n"
                           "      tile_size: 64\n"
                           "    - {module_path: '.*', op_names: stacked_dot_general, weight_qtype: int8}\n");
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  if (r) {
    CHECK(nb_quant_rules_count(r) == 6);
    const nb_quant_rule *d = nb_quant_rules_at(r, 4);
    CHECK(d->n_op_names == 1 && !strcmp(d->op_names[0], "dot_general") && nb_quant_rules_at(r, 0)->n_op_names == 0);
    CHECK(d->weight_qtype == NB_QUANT_INT4 && d->act_qtype == NB_QUANT_ACT_INT8_BLOCK && d->tile_size == 64);
    const nb_quant_rule *a = nb_quant_rules_at(r, 0), *b = nb_quant_rules_at(r, 1), *c = nb_quant_rules_at(r, 2);
    CHECK(!strcmp(a->module_path, ".*/mlp/.*") && a->weight_qtype == NB_QUANT_INT4 && a->tile_size == 32 &&
          a->weight_calibration.kind == NB_QUANT_MINMAX && a->act_qtype == NB_QUANT_ACT_NONE);
    CHECK(b->weight_qtype == NB_QUANT_INT8 && b->act_qtype == NB_QUANT_ACT_INT8_DYNAMIC && b->tile_size == 0 &&
          b->weight_calibration.kind == NB_QUANT_ABSMAX);
    CHECK(c->weight_qtype == NB_QUANT_FP8_E4M3 && c->weight_calibration.kind == NB_QUANT_RMS && c->weight_calibration.k == 3.5);
    CHECK(nb_quant_rules_match(r, "layers/3/mlp/wi_0", NB_QUANT_OP_DOT_GENERAL) == 0 &&
          nb_quant_rules_match(r, "lm_head", NB_QUANT_OP_DOT_GENERAL) == 2);
    /* layers/0's experts: rule 3; its plain linears skip rule 3 (op) and take 4 */
    CHECK(nb_quant_rules_match(r, "layers/0/moe/wo", NB_QUANT_OP_STACKED_DOT_GENERAL) == 3 &&
          nb_quant_rules_match(r, "layers/0/moe/router", NB_QUANT_OP_DOT_GENERAL) == 4 &&
          nb_quant_rules_match(r, "layers/1/moe/wo", NB_QUANT_OP_STACKED_DOT_GENERAL) == 5);
  }
  nb_quant_rules_destroy(r);

  static const struct { const char *text, *needle; } errs[] = {
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8}\n    - {module_path: b, weight_qtype: int3}\n",
       "r.yaml:4: rule 1: weight_qtype: 'int3'"},
      {"quant:\n  rules:\n    - {module_path: 'a[', weight_qtype: int8}\n", "r.yaml: rule 0: module_path: 'a['"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, tile: 32}\n", "rule 0: unknown field 'tile'"},
      {"quant:\n  rules:\n    - {module_path: a}\n", "rule 0: weight_qtype: missing"},
      {"quant:\n  rules:\n    - {weight_qtype: int8}\n", "rule 0: module_path: missing"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, tile_size: -32}\n", "rule 0: tile_size: '-32'"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, tile_size: 24}\n", "rule 0: tile_size: 24"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, act_qtype: int16}\n", "rule 0: act_qtype: 'int16'"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: nf4, act_qtype: int8_block}\n", "rule 0: act_qtype: int8_block needs int8 or int4"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, weight_calibration: 'rms,-1'}\n",
       "rule 0: weight_calibration:"},
      {"quant:\n  rules:\n    - {module_path: [a], weight_qtype: int8}\n", "rule 0: module_path: a scalar wanted"},
      {"quant:\n  rules:\n    - just-a-string\n", "rule 0: a mapping of fields wanted"},
      {"quant:\n  rules: {a: 1}\n", "quant.rules: a list of rules wanted"},
      {"model: {}\n", "quant.rules: missing"},
      {"quant:\n  rules: [\n", "YAML error"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8}\n    - {module_path: b, weight_qtype: int8}\n"
       "    - {module_path: c, weight_qtype: int8, op_names: [conv]}\n",
       "r.yaml:5: rule 2: op_names[0]: unknown op 'conv'; known: dot_general, stacked_dot_general"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, op_names: [dot_general, {x: 1}]}\n",
       "rule 0: op_names[1]: a name wanted"},
      {"quant:\n  rules:\n    - {module_path: a, weight_qtype: int8, op_names: einsum}\n", "rule 0: op_names[0]: unknown op 'einsum'"},
  };
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) {
    r = yaml(ctx, errs[i].text);
    CHECK_MSG(!r, "case %zu accepted", i);
    nb_quant_rules_destroy(r);
    CHECK_MSG(strstr(nb_ctx_error(ctx), errs[i].needle), "case %zu: '%s' lacks '%s'", i, nb_ctx_error(ctx), errs[i].needle);
    nb_ctx_clear_error(ctx);
  }
}

/* ---------------------------------------------------------------- PTQ */

/* 2 layers, d_model 64, d_ff 80 (the down projection's K = 80: a ragged
 * last tile of 16 with 32-wide tiles), vocab 48, untied lm_head. */
static nb_model_config small_llama(void) {
  nb_model_config c = tiny_config("llama-tiny", 32);
  c.d_model = 64, c.d_ff = 80, c.vocab_size = 48, c.tie_embeddings = false;
  return c;
}

static const char *const mixed_rules =
    "quant:\n  rules:\n"
    "    - {module_path: 'layers/0/mlp/.*', weight_qtype: int4, tile_size: 32, weight_calibration: minmax}\n"
    "    - {module_path: '.*/mlp/.*', weight_qtype: int4, tile_size: 32}\n"
    "    - {module_path: '.*attn/w[qk]', weight_qtype: int8}\n"
    "    - {module_path: '.*attn/wv', weight_qtype: nf4, tile_size: 32}\n"
    "    - {module_path: '.*attn/wo', weight_qtype: fp8_e4m3, tile_size: 32}\n"
    "    - {module_path: lm_head, weight_qtype: int8, tile_size: 32}\n";

static void test_ptq(nb_ctx *ctx) {
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 5);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_quant_rules *r = yaml(ctx, mixed_rules);
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  nb_tree *q = nb_quant_ptq(ctx, params, r);
  CHECK_MSG(q, "%s", nb_ctx_error(ctx));
  if (!q) goto done;
  /* 7 linears per layer, lm_head */
  CHECK_MSG(nb_quant_tree_count(ctx, q) == 2 * 7 + 1, "%lld quantized", (long long)nb_quant_tree_count(ctx, q));
  /* embedding and norms are the same arrays */
  CHECK(nb_tree_get_array(q, "embed/embedding") == nb_tree_get_array(params, "embed/embedding"));
  CHECK(nb_tree_get_array(q, "layers/1/attn_norm/scale") == nb_tree_get_array(params, "layers/1/attn_norm/scale"));
  CHECK(nb_tree_find(q, "layers/0/attn/wq/kernel") < 0 && nb_tree_find(q, "layers/0/attn/wq/kernel/values") >= 0);
  nb_quant_linear l;
  bool found;
  CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, "layers/0/mlp/wo", &l, &found));
  CHECK(found && l.layout.qtype == NB_QUANT_INT4 && l.layout.n == 64 && l.layout.k == 80 && l.layout.tile == 32 &&
        l.layout.asymmetric && l.rule == 0);
  CHECK(nb_tree_find(q, "layers/0/mlp/wo/kernel/zero_points") >= 0);
  CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, "layers/1/mlp/wo", &l, &found));
  CHECK(found && !l.layout.asymmetric && l.rule == 1);
  CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, "layers/1/attn/wv", &l, &found));
  CHECK(found && l.layout.qtype == NB_QUANT_NF4 && l.layout.n == 2 * 16 && l.layout.k == 64 && l.rule == 3);
  CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, "embed", &l, &found));
  CHECK(!found);

  /* the dequantized tree: the original paths in order, kernels [d_in,
   * d_out] within half a step of the originals (int8: step = scale) */
  nb_tree *d = nb_quant_dequantize_tree(ctx, q);
  CHECK_MSG(d, "%s", nb_ctx_error(ctx));
  if (d) {
    CHECK_OK(ctx, nb_tree_check_same(ctx, params, d, true, "f32 and dequantized trees"));
    nb_array *w0 = nb_tree_get_array(params, "layers/0/attn/wq/kernel"), *w1 = nb_tree_get_array(d, "layers/0/attn/wq/kernel");
    nb_array *sc = nb_tree_get_array(q, "layers/0/attn/wq/kernel/scales"); /* [d_out, 1]: per-channel */
    const int64_t *dims = nb_array_dims(w0);
    double worst = 0;
    bool changed = false;
    for (int64_t i = 0; i < dims[0]; i++)
      for (int64_t o = 0; o < dims[1]; o++) {
        double a = nb_array_get(w0, i * dims[1] + o), b = nb_array_get(w1, i * dims[1] + o);
        worst = fmax(worst, fabs(a - b) / nb_array_get(sc, o));
        changed |= a != b;
      }
    CHECK_MSG(worst <= 0.5 + 1e-6 && changed, "worst error %g steps", worst);
  }
  nb_tree_destroy(d);

  /* a damaged "quant" array is refused naming the path */
  nb_tree *broken = nb_tree_copy(q);
  int64_t meta[6] = {NB_QUANT_INT8, 63, 0, 0, 0, 0}, six = 6;
  nb_array *m = nb_array_create(ctx, NB_I64, 1, &six, meta);
  nb_tree_set_array(broken, "layers/1/attn/wq/kernel/quant", m);
  nb_array_release(m);
  CHECK(nb_quant_tree_count(ctx, broken) == -1);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "layers/1/attn/wq/kernel");
  CHECK(!nb_quant_plan_create(ctx, broken));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "layers/1/attn/wq/kernel");
  nb_tree_destroy(broken);
  nb_tree_destroy(q);
done:
  nb_quant_rules_destroy(r);
  nb_tree_destroy(params);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- running */

/* The oracle of the hook: the same lookup (ud: the host quantized tree), the
 * product as ordinary traced ops (nb_quant_matmul_reference). */
static nb_val *reference_hook(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  nb_quant_linear l;
  bool found;
  if (nb_quant_tree_linear(nb_graph_ctx(a->g), ud, path, &l, &found) || !found) return nb_nn_linear_default(a, path, x, stacked);
  char p[300];
  snprintf(p, sizeof p, "%s/kernel/values", path);
  nb_val *v = nb_tree_get_val(a->params, p);
  snprintf(p, sizeof p, "%s/kernel/scales", path);
  nb_val *s = nb_tree_get_val(a->params, p);
  snprintf(p, sizeof p, "%s/kernel/zero_points", path);
  nb_val *z = l.layout.asymmetric ? nb_tree_get_val(a->params, p) : NULL;
  return nb_quant_matmul_reference(x, v, s, z, &l.layout, l.act);
}

static nb_array *run_forward(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, nb_nn_linear_hook hook,
                             void *ud, const nb_array *tokens) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", (nb_array *)tokens);
  nb_model_trace_opts o = {.linear_hook = hook, .hook_ud = ud};
  nb_graph *g = nb_model_trace_forward(ctx, c, &o, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_array *logits = NULL;
  if (g) {
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    nb_tree_merge(in, "batch", batch);
    nb_exe *e = nb_jit(ctx, g, NULL);
    CHECK_MSG(e, "%s", nb_ctx_error(ctx));
    if (e) CHECK_OK(ctx, nb_exe_run(e, in, out));
    logits = nb_tree_get_array(out, "logits");
    if (logits) nb_array_retain(logits);
    nb_exe_destroy(e);
    nb_tree_destroy(in);
    nb_tree_destroy(out);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(batch);
  return logits;
}

static double max_abs_diff(const nb_array *a, const nb_array *b, double *scale) {
  double m = 0, s = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    m = fmax(m, fabs(nb_array_get(a, i) - nb_array_get(b, i)));
    s = fmax(s, fabs(nb_array_get(b, i)));
  }
  *scale = s;
  return m;
}

/* logits of the quantized model (the hook: quant.matmul) against the same
 * products as ordinary traced ops (nb_quant_matmul_reference), and for
 * weight-only rules against the f32 model on the dequantized weights
 * (plain dot products; W8A8 also rounds the activations, which the f32
 * model does not) */
static void test_hook_logits(nb_ctx *ctx, const char *rules_text, bool weight_only, const char *what) {
  const double tol = 1e-5;
  nb_model_config c = small_llama();
  nb_array *key = nb_key(ctx, 9);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_quant_rules *r = yaml(ctx, rules_text);
  nb_tree *q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  nb_tree *d = q ? nb_quant_dequantize_tree(ctx, q) : NULL;
  nb_quant_plan *plan = q ? nb_quant_plan_create(ctx, q) : NULL;
  CHECK_MSG(plan && d, "%s: %s", what, nb_ctx_error(ctx));
  if (!plan || !d) goto done;
  CHECK(nb_quant_plan_count(plan) == 15);
  nb_test_rng rng = {77};
  int32_t ids[3 * 11];
  for (int i = 0; i < 33; i++) ids[i] = (int32_t)nb_test_int(&rng, 0, c.vocab_size - 1);
  nb_array *tokens = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){3, 11}, ids);
  nb_array *lq = run_forward(ctx, &c, q, nb_quant_linear_hook, plan, tokens),
           *lr = run_forward(ctx, &c, q, reference_hook, q, tokens), *ld = run_forward(ctx, &c, d, NULL, NULL, tokens),
           *lf = run_forward(ctx, &c, params, NULL, NULL, tokens);
  if (lq && lr && ld && lf) {
    double scale, diff = max_abs_diff(lq, lr, &scale), ddiff = max_abs_diff(lq, ld, &scale), fscale,
                  fdiff = max_abs_diff(lf, lq, &fscale);
    CHECK_MSG(diff <= tol * scale, "%s: quant.matmul vs reference logits differ by %g (scale %g)", what, diff, scale);
    if (weight_only)
      CHECK_MSG(ddiff <= tol * scale, "%s: quantized vs dequantized-f32 logits differ by %g (scale %g)", what, ddiff, scale);
    /* not vacuous: quantization moved the logits far more than that */
    CHECK_MSG(fdiff > 1000 * tol * scale, "%s: f32 vs quantized %g", what, fdiff);
    fprintf(stderr, "%s: |quantized - reference| %.3g, |quantized - dequantized f32| %.3g, |quantized - f32| %.3g, max |logit| %.3g\n",
            what, diff, ddiff, fdiff, scale);
  }
  nb_array_release(lq), nb_array_release(lr), nb_array_release(ld), nb_array_release(lf), nb_array_release(tokens);
done:
  nb_quant_plan_destroy(plan);
  nb_tree_destroy(d);
  nb_tree_destroy(q);
  nb_quant_rules_destroy(r);
  nb_tree_destroy(params);
  nb_array_release(key);
}

/* ---------------------------------------------------------------- op names on MoE */

/* Mixtral-style: 2 layers, 4 experts (top 2) of d_ff 80 (ragged 32-wide
 * tiles of the down projection), d_model 64. */
static nb_model_config small_mixtral(void) {
  nb_model_config c = tiny_config("mixtral-tiny", 32);
  c.d_model = 64, c.moe_d_ff = 80, c.vocab_size = 48, c.tie_embeddings = false;
  return c;
}

/* Which "<m>/kernel" of params (rank 2 or 3) q holds quantized, and whether
 * that is exactly the kernels of the wanted rank; how many there are. */
static int64_t quantized_exactly(nb_ctx *ctx, const nb_tree *params, const nb_tree *q, int want_rank, const char *what) {
  int64_t n = 0, wrong = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    const char *path = nb_tree_path(params, i);
    size_t len = strlen(path);
    if (len < 7 || strcmp(path + len - 7, "/kernel")) continue;
    char m[256];
    snprintf(m, sizeof m, "%.*s", (int)(len - 7), path);
    nb_quant_linear l;
    bool found;
    CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, m, &l, &found));
    int rank = nb_array_rank(nb_tree_get_array(params, path));
    bool want = rank == want_rank;
    if (found != want || (found && (l.experts > 0) != (rank == 3))) {
      if (wrong++ < 5) fprintf(stderr, "%s: %s (rank %d) %squantized\n", what, m, rank, found ? "" : "not ");
    }
    n += found;
  }
  CHECK_MSG(wrong == 0, "%s: %lld kernels quantized or left wrongly", what, (long long)wrong);
  CHECK(nb_quant_tree_count(ctx, q) == n);
  return n;
}

static void test_op_names_moe(nb_ctx *ctx) {
  const double tol = 1e-5;
  nb_model_config c = small_mixtral();
  nb_array *key = nb_key(ctx, 11);
  nb_tree *params = nb_model_init(ctx, &c, key);
  /* experts only: every stacked kernel, nothing else (the router is a plain linear under moe/) */
  nb_quant_rules *r = yaml(ctx, "quant:\n  rules:\n"
                                "    - {module_path: '.*', op_names: [stacked_dot_general], weight_qtype: int4, tile_size: 32}\n");
  nb_tree *q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  CHECK_MSG(q, "%s", nb_ctx_error(ctx));
  if (q) CHECK(quantized_exactly(ctx, params, q, 3, "experts only") == 2 * 3);
  nb_quant_linear l;
  bool found = false;
  if (q) CHECK_OK(ctx, nb_quant_tree_linear(ctx, q, "layers/1/moe/experts/wo", &l, &found));
  CHECK(found && l.experts == 4 && l.layout.n == 4 * 64 && l.layout.k == 80 && l.layout.tile == 32 && l.rule == 0);
  if (q) CHECK(nb_array_rank(nb_tree_get_array(q, "layers/1/moe/experts/wo/kernel/values")) == 3 &&
               nb_array_dims(nb_tree_get_array(q, "layers/1/moe/experts/wo/kernel/scales"))[2] == 3);

  /* the stacked experts on the hook: logits as the f32 model on the dequantized tree */
  nb_tree *d = q ? nb_quant_dequantize_tree(ctx, q) : NULL;
  nb_quant_plan *plan = q ? nb_quant_plan_create(ctx, q) : NULL;
  CHECK_MSG(d && plan, "%s", nb_ctx_error(ctx));
  if (d && plan) {
    CHECK_OK(ctx, nb_tree_check_same(ctx, params, d, true, "f32 and dequantized trees"));
    nb_test_rng rng = {78};
    int32_t ids[2 * 9];
    for (int i = 0; i < 18; i++) ids[i] = (int32_t)nb_test_int(&rng, 0, c.vocab_size - 1);
    nb_array *tokens = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 9}, ids);
    nb_array *lq = run_forward(ctx, &c, q, nb_quant_linear_hook, plan, tokens), *ld = run_forward(ctx, &c, d, NULL, NULL, tokens),
             *lf = run_forward(ctx, &c, params, NULL, NULL, tokens);
    if (lq && ld && lf) {
      double scale, fscale, diff = max_abs_diff(lq, ld, &scale), fdiff = max_abs_diff(lf, lq, &fscale);
      CHECK_MSG(diff <= tol * scale, "stacked experts: quantized vs dequantized-f32 logits differ by %g (scale %g)", diff, scale);
      CHECK_MSG(fdiff > 1000 * tol * scale, "stacked experts: f32 vs quantized %g", fdiff);
      fprintf(stderr, "stacked int4 experts: |quantized - dequantized f32| %.3g, |quantized - f32| %.3g, max |logit| %.3g\n", diff,
              fdiff, scale);
    }
    nb_array_release(lq), nb_array_release(ld), nb_array_release(lf), nb_array_release(tokens);
  }
  nb_quant_plan_destroy(plan);
  nb_tree_destroy(d);
  nb_tree_destroy(q);
  nb_quant_rules_destroy(r);

  /* everything but the experts */
  r = yaml(ctx, "quant:\n  rules:\n    - {module_path: '.*', op_names: [dot_general], weight_qtype: int8}\n");
  q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  CHECK_MSG(q, "%s", nb_ctx_error(ctx));
  if (q) CHECK(quantized_exactly(ctx, params, q, 2, "plain only") == 2 * 5 + 1); /* wq wk wv wo router, lm_head */
  nb_tree_destroy(q);
  nb_quant_rules_destroy(r);

  /* int8_static experts have no calibration yet: refused naming the kernel */
  r = yaml(ctx, "quant:\n  rules:\n    - {module_path: '.*', weight_qtype: int8, act_qtype: int8_static, "
                "act_calibration: 'fixed,-1,1'}\n");
  q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  CHECK(!q);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "layers/0/moe/experts/wi_0/kernel (rule 0): int8_static activations of stacked");
  nb_tree_destroy(q);
  nb_quant_rules_destroy(r);
  nb_tree_destroy(params);
  nb_array_release(key);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_rules_api(ctx);
  test_rules_yaml(ctx);
  test_ptq(ctx);
  test_hook_logits(ctx, mixed_rules, true, "weight-only");
  test_hook_logits(ctx,
                   "quant:\n  rules:\n    - {module_path: '.*', weight_qtype: int8, act_qtype: int8_dynamic, tile_size: 32}\n",
                   false, "W8A8");
  test_hook_logits(ctx, /* a Q4_0 GGUF's layout: int4 g32 linears, an int8 g16 head (K = 64, 80: 4, 5 tiles) */
                   "quant:\n  rules:\n    - {module_path: lm_head, weight_qtype: int8, act_qtype: int8_block, tile_size: 16}\n"
                   "    - {module_path: '.*', weight_qtype: int4, act_qtype: int8_block, tile_size: 32}\n",
                   false, "W8A8 per block, int8 g16 head");
  test_op_names_moe(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("quant/test_rules");
}
