/* The model functions on tiny configs: deterministic init, parameter counts
 * of the real presets (GPT-2 124M, Llama 2 7B, Llama 3 8B, Mixtral 8x7B),
 * decode with a KV cache against the full forward, per-block remat against
 * plain gradients, MoE losses, upcycling (an upcycled model computes what
 * the dense one did), packed documents, the linear hook on a whole model,
 * dropout in train mode, and errors. */
#include "model_test_util.h"

static nb_model_config tiny(const char *preset) { return tiny_config(preset, 16); }

static nb_array *tokens(nb_ctx *ctx, int64_t b, int64_t t, int seed) {
  nb_test_rng r = {(uint64_t)seed};
  int32_t v[256];
  for (int64_t i = 0; i < b * t; i++) v[i] = (int32_t)nb_test_int(&r, 0, 31);
  return nb_array_create(ctx, NB_I32, 2, (int64_t[2]){b, t}, v);
}

static nb_tree *batch_of(nb_ctx *ctx, int64_t b, int64_t t, int seed) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_array *x = tokens(ctx, b, t, seed), *y = tokens(ctx, b, t, seed + 1);
  nb_tree_set_array(batch, "inputs", x);
  nb_tree_set_array(batch, "targets", y);
  nb_array_release(x);
  nb_array_release(y);
  return batch;
}

/* runs graph g on params + batch (and extra inputs); out must be fresh */
static nb_status run(nb_ctx *ctx, const nb_graph *g, const nb_tree *params, const nb_tree *batch, const nb_tree *extra,
                     nb_tree *out) {
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  if (batch) nb_tree_merge(in, "batch", batch);
  if (extra) nb_tree_merge(in, NULL, extra);
  nb_status s = nb_graph_run(ctx, g, in, out);
  nb_tree_destroy(in);
  return s;
}

static double scalar(const nb_tree *t, const char *p) {
  nb_array *a = nb_tree_get_array(t, p);
  return a ? nb_array_get(a, 0) : NAN;
}

static double max_diff(const nb_array *a, const nb_array *b) {
  if (!a || !b || nb_array_size(a) != nb_array_size(b)) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) m = fmax(m, fabs(nb_array_get(a, i) - nb_array_get(b, i)));
  return m;
}

static void test_init_and_counts(nb_ctx *ctx) {
  nb_model_config c = tiny("llama-tiny");
  nb_array *k1 = nb_key(ctx, 1), *k2 = nb_key(ctx, 2);
  nb_tree *a = nb_model_init(ctx, &c, k1), *b = nb_model_init(ctx, &c, k1), *d = nb_model_init(ctx, &c, k2);
  CHECK(a && b && d);
  CHECK_OK(ctx, nb_tree_check_same(ctx, a, b, true, "two inits"));
  for (size_t i = 0; a && b && i < nb_tree_size(a); i++) CHECK(nb_array_equal(nb_tree_leaf(a, i)->array, nb_tree_leaf(b, i)->array));
  CHECK(!nb_array_equal(nb_tree_get_array(a, "embed/embedding"), nb_tree_get_array(d, "embed/embedding")));
  CHECK(nb_tree_find(a, "layers/1/attn/wq/kernel") >= 0 && nb_tree_find(a, "lm_head/kernel") >= 0);
  CHECK(nb_array_get(nb_tree_get_array(a, "final_norm/scale"), 0) == 1);
  nb_tree *spec = nb_model_param_spec(ctx, &c, NB_F32);
  CHECK_OK(ctx, nb_tree_check_same(ctx, a, spec, true, "init vs spec"));
  nb_tree_destroy(spec);
  nb_tree_destroy(a);
  nb_tree_destroy(b);
  nb_tree_destroy(d);
  nb_array_release(k1);
  nb_array_release(k2);
  /* the real configurations, counted from abstract specs */
  struct { const char *name; int64_t n; } want[] = {
      {"gpt2-124m", 124439808}, {"llama2-7b", 6738415616}, {"llama3-8b", 8030261248}, {"mixtral-8x7b", 46702792704}};
  for (int i = 0; i < 4; i++) {
    nb_model_config m;
    CHECK_OK(ctx, nb_model_config_preset(ctx, want[i].name, &m));
    nb_tree *s = nb_model_param_spec(ctx, &m, NB_BF16);
    CHECK_MSG(s && nb_nn_params_count(s) == want[i].n, "%s: %lld parameters, wanted %lld", want[i].name,
              s ? (long long)nb_nn_params_count(s) : -1LL, (long long)want[i].n);
    nb_tree_destroy(s);
  }
  for (const char *const *p = nb_model_preset_names(); *p; p++) {
    nb_model_config m;
    CHECK_OK(ctx, nb_model_config_preset(ctx, *p, &m));
    CHECK_OK(ctx, nb_model_config_validate(ctx, &m));
  }
  nb_model_config m;
  CHECK(nb_model_config_preset(ctx, "gpt5", &m) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "unknown preset 'gpt5' (allowed: gpt2-tiny, gpt2-124m");
  m = tiny("llama-tiny");
  m.n_kv_heads = 3;
  CHECK(nb_model_config_validate(ctx, &m) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.n_kv_heads (3) must divide model.n_heads (4)");
}

/* prefill 5 tokens then decode 3 one at a time == the full forward on 8 */
static void test_decode(nb_ctx *ctx, const char *preset) {
  nb_model_config c = tiny(preset);
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_tree *batch = nb_tree_create(ctx);
  nb_array *tok = tokens(ctx, 2, 8, 4);
  nb_tree_set_array(batch, "inputs", tok);
  nb_graph *fg = nb_model_trace_forward(ctx, &c, NULL, params, batch);
  nb_tree *fo = nb_tree_create(ctx);
  CHECK_OK(ctx, run(ctx, fg, params, batch, NULL, fo));
  nb_array *full = nb_tree_get_array(fo, "logits");
  nb_tree *cache = nb_model_cache_create(ctx, &c, 2, 10, NB_F32);
  int64_t starts[4] = {0, 5, 6, 7}, lens[4] = {5, 1, 1, 1};
  const int32_t *td = nb_array_data(tok);
  double worst = 0;
  for (int s = 0; s < 4; s++) {
    nb_graph *dg = nb_model_trace_decode(ctx, &c, NULL, params, 2, lens[s], 10, NB_F32);
    CHECK_MSG(dg, "%s", nb_ctx_error(ctx));
    if (!dg) break;
    int32_t step[10];
    for (int b = 0; b < 2; b++)
      for (int t = 0; t < lens[s]; t++) step[b * lens[s] + t] = td[b * 8 + starts[s] + t];
    nb_tree *extra = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_array *st = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, lens[s]}, step), *pos = nb_array_scalar(ctx, NB_I32, (double)starts[s]);
    nb_tree_set_array(extra, "tokens", st);
    nb_tree_set_array(extra, "pos", pos);
    nb_tree_merge(extra, "cache", cache);
    CHECK_OK(ctx, run(ctx, dg, params, NULL, extra, out));
    nb_array *lg = nb_tree_get_array(out, "logits");
    for (int b = 0; lg && b < 2; b++)
      for (int t = 0; t < lens[s]; t++)
        for (int v = 0; v < 32; v++)
          worst = fmax(worst, fabs(nb_array_get(lg, (b * lens[s] + t) * 32 + v) - nb_array_get(full, (b * 8 + starts[s] + t) * 32 + v)));
    nb_tree_destroy(cache);
    cache = nb_tree_select_prefix(out, "cache", true);
    nb_array_release(st);
    nb_array_release(pos);
    nb_tree_destroy(extra);
    nb_tree_destroy(out);
    nb_graph_destroy(dg);
  }
  CHECK_MSG(worst < 1e-5, "%s: decode vs forward logits differ by %g", preset, worst);
  nb_tree_destroy(cache);
  nb_array_release(tok);
  nb_array_release(key);
  nb_graph_destroy(fg);
  nb_tree_destroy(fo);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
}

/* value_and_grad of the loss with and without per-block remat */
static void test_remat_and_moe_loss(nb_ctx *ctx, const char *preset) {
  nb_model_config c = tiny(preset);
  c.z_loss_coef = 0.01;
  nb_array *key = nb_key(ctx, 5);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_tree *batch = batch_of(ctx, 2, 6, 7);
  nb_tree *outs[2];
  for (int r = 0; r < 2; r++) {
    nb_model_trace_opts o = {.remat = r == 1};
    nb_graph *g = nb_model_trace_loss(ctx, &c, &o, params, batch);
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
    CHECK_MSG(vg, "%s: %s", preset, nb_ctx_error(ctx));
    outs[r] = nb_tree_create(ctx);
    if (vg) CHECK_OK(ctx, run(ctx, vg, params, batch, NULL, outs[r]));
    nb_graph_destroy(g);
    nb_graph_destroy(vg);
  }
  double l0 = scalar(outs[0], "loss"), l1 = scalar(outs[1], "loss");
  CHECK_MSG(fabs(l0 - l1) < 1e-6 && l0 > 0, "%s: loss %g vs remat %g", preset, l0, l1);
  double ce = scalar(outs[0], "aux/metrics/ce");
  if (c.n_experts) {
    double lb = scalar(outs[0], "aux/metrics/moe_lb"), z = scalar(outs[0], "aux/metrics/moe_z");
    CHECK_MSG(lb >= 0.99 && z > 0, "%s: lb %g z %g", preset, lb, z); /* lb >= 1 up to rounding */
    CHECK_NEAR(l0, ce + c.lb_loss_coef * lb + c.z_loss_coef * z, 1e-6);
  } else {
    CHECK_NEAR(l0, ce, 1e-7);
  }
  CHECK(scalar(outs[0], "aux/metrics/tokens") == 12);
  double worst = 0;
  for (size_t i = 0; i < nb_tree_size(outs[0]); i++) {
    const char *p = nb_tree_path(outs[0], i);
    nb_array *g1 = nb_tree_get_array(outs[1], p);
    CHECK_MSG(g1, "%s: remat lacks %s", preset, p);
    worst = fmax(worst, max_diff(nb_tree_leaf(outs[0], i)->array, g1));
  }
  CHECK_MSG(worst < 1e-5, "%s: remat gradients differ by %g", preset, worst);
  nb_tree_destroy(outs[0]);
  nb_tree_destroy(outs[1]);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_array_release(key);
}

static nb_array *logits_of(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, const nb_tree *batch) {
  nb_graph *g = nb_model_trace_forward(ctx, c, NULL, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_tree *out = nb_tree_create(ctx);
  nb_array *l = NULL;
  if (g && run(ctx, g, params, batch, NULL, out) == NB_OK) {
    l = nb_tree_get_array(out, "logits");
    nb_array_retain(l);
  }
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  return l;
}

static void test_upcycle(nb_ctx *ctx) {
  nb_model_config dense = tiny("llama-tiny"), moe = tiny("mixtral-tiny");
  nb_array *key = nb_key(ctx, 9);
  nb_tree *dp = nb_model_init(ctx, &dense, key);
  nb_tree *mp = nb_model_upcycle(ctx, &dense, dp, &moe, key);
  CHECK_MSG(mp, "%s", nb_ctx_error(ctx));
  nb_tree *spec = nb_model_param_spec(ctx, &moe, NB_F32);
  if (mp) CHECK_OK(ctx, nb_tree_check_same(ctx, mp, spec, true, "upcycled vs MoE spec"));
  nb_tree *batch = batch_of(ctx, 2, 5, 11);
  nb_array *ld = logits_of(ctx, &dense, dp, batch), *lm = mp ? logits_of(ctx, &moe, mp, batch) : NULL;
  CHECK_MSG(max_diff(ld, lm) < 1e-5, "upcycled logits differ by %g", max_diff(ld, lm));
  /* the router is random and experts are copies */
  nb_array *e = mp ? nb_tree_get_array(mp, "layers/0/moe/experts/wi_0/kernel") : NULL;
  nb_array *w = nb_tree_get_array(dp, "layers/0/mlp/wi_0/kernel");
  CHECK(e && nb_array_dims(e)[0] == 4 && nb_array_get(e, 3 * nb_array_size(w) + 5) == nb_array_get(w, 5));
  /* mismatched configs are refused, naming the keys */
  moe.moe_d_ff = 12;
  CHECK(nb_model_upcycle(ctx, &dense, dp, &moe, key) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.moe_d_ff (12) = the dense model.d_ff (24)");
  nb_array_release(ld);
  nb_array_release(lm);
  nb_tree_destroy(batch);
  nb_tree_destroy(spec);
  nb_tree_destroy(mp);
  nb_tree_destroy(dp);
  nb_array_release(key);
}

/* two documents packed into one row (segment ids, positions restarting)
 * give the same per-token logits as the documents in rows of their own */
static void test_packed(nb_ctx *ctx, const char *preset) {
  nb_model_config c = tiny(preset);
  nb_array *key = nb_key(ctx, 13);
  nb_tree *params = nb_model_init(ctx, &c, key);
  int32_t packed[6] = {3, 4, 5, 6, 7, 8}, seg[6] = {1, 1, 1, 1, 2, 2}, pos[6] = {0, 1, 2, 3, 0, 1};
  int32_t doc1[4] = {3, 4, 5, 6}, doc2[2] = {7, 8};
  nb_tree *bp = nb_tree_create(ctx), *b1 = nb_tree_create(ctx), *b2 = nb_tree_create(ctx);
  nb_array *arrs[5] = {nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 6}, packed),
                       nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 6}, seg),
                       nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 6}, pos),
                       nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 4}, doc1),
                       nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 2}, doc2)};
  nb_tree_set_array(bp, "inputs", arrs[0]);
  nb_tree_set_array(bp, "segment_ids", arrs[1]);
  nb_tree_set_array(bp, "positions", arrs[2]);
  nb_tree_set_array(b1, "inputs", arrs[3]);
  nb_tree_set_array(b2, "inputs", arrs[4]);
  nb_array *lp = logits_of(ctx, &c, params, bp), *l1 = logits_of(ctx, &c, params, b1), *l2 = logits_of(ctx, &c, params, b2);
  double worst = 0;
  for (int t = 0; lp && l1 && l2 && t < 6; t++)
    for (int v = 0; v < 32; v++)
      worst = fmax(worst, fabs(nb_array_get(lp, t * 32 + v) - (t < 4 ? nb_array_get(l1, t * 32 + v) : nb_array_get(l2, (t - 4) * 32 + v))));
  CHECK_MSG(worst < 1e-5, "%s: packed vs separate logits differ by %g", preset, worst);
  for (int i = 0; i < 5; i++) nb_array_release(arrs[i]);
  nb_array_release(lp);
  nb_array_release(l1);
  nb_array_release(l2);
  nb_tree_destroy(bp);
  nb_tree_destroy(b1);
  nb_tree_destroy(b2);
  nb_tree_destroy(params);
  nb_array_release(key);
}

typedef struct seen { int n; int wq; } seen;
static nb_val *counting_hook(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  seen *s = ud;
  s->n++;
  s->wq += strstr(path, "attn/wq") != NULL;
  return nb_nn_linear_default(a, path, x, stacked);
}

static void test_hook_dropout_errors(nb_ctx *ctx) {
  nb_model_config c = tiny("mixtral-tiny");
  c.dropout = 0.1;
  nb_array *key = nb_key(ctx, 17);
  nb_tree *params = nb_model_init(ctx, &c, key);
  nb_tree *batch = batch_of(ctx, 1, 4, 3);
  seen s = {0};
  nb_model_trace_opts o = {.linear_hook = counting_hook, .hook_ud = &s};
  nb_graph *g = nb_model_trace_loss(ctx, &c, &o, params, batch);
  CHECK(g);
  /* per layer: 4 attention + router + 3 stacked expert linears; lm_head */
  CHECK_MSG(s.n == 2 * 8 + 1 && s.wq == 2, "hook saw %d linears, %d wq", s.n, s.wq);
  nb_graph_destroy(g);
  /* dropout: train mode needs an rng input, deterministic in it */
  nb_model_trace_opts tr = {.train = true};
  g = nb_model_trace_loss(ctx, &c, &tr, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  double l[3];
  for (int i = 0; g && i < 3; i++) {
    nb_tree *extra = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_array *k = nb_key(ctx, i == 2 ? 100 : 99);
    nb_tree_set_array(extra, "rng", k);
    CHECK_OK(ctx, run(ctx, g, params, batch, extra, out));
    l[i] = scalar(out, "loss");
    nb_array_release(k);
    nb_tree_destroy(extra);
    nb_tree_destroy(out);
  }
  if (g) CHECK(l[0] == l[1] && l[0] != l[2]);
  nb_graph_destroy(g);
  /* errors: a missing weight names its path; a batch without targets */
  nb_tree *broken = nb_tree_copy(params);
  nb_tree_remove(broken, "layers/1/moe/router/kernel");
  CHECK(nb_model_trace_loss(ctx, &c, NULL, broken, batch) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "parameter 'layers/1/moe/router/kernel' is missing");
  nb_tree_remove(batch, "targets");
  CHECK(nb_model_trace_loss(ctx, &c, NULL, params, batch) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "the batch needs 'inputs' and 'targets'");
  nb_tree *long_batch = batch_of(ctx, 1, 20, 1);
  CHECK(nb_model_trace_loss(ctx, &c, NULL, params, long_batch) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "20 tokens exceed model.max_seq_len 16");
  /* bf16 compute traces and runs */
  nb_tree_destroy(batch);
  batch = batch_of(ctx, 1, 4, 3);
  nb_model_trace_opts bf = {.dtype = NB_BF16};
  g = nb_model_trace_loss(ctx, &c, &bf, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_tree *out = nb_tree_create(ctx);
  if (g) CHECK_OK(ctx, run(ctx, g, params, batch, NULL, out));
  double lf = scalar(out, "loss");
  CHECK_MSG(isfinite(lf) && lf > 0, "bf16 loss %g", lf);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  nb_tree_destroy(long_batch);
  nb_tree_destroy(broken);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_array_release(key);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_init_and_counts(ctx);
  test_decode(ctx, "llama-tiny");
  test_decode(ctx, "gpt2-tiny");
  test_remat_and_moe_loss(ctx, "gpt2-tiny");
  test_remat_and_moe_loss(ctx, "mixtral-tiny");
  test_remat_and_moe_loss(ctx, "deepseek-tiny");
  test_upcycle(ctx);
  test_packed(ctx, "llama-tiny");
  test_packed(ctx, "gpt2-tiny");
  test_hook_dropout_errors(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/transformer");
}
