/* Attention: causal and segment masks, GQA/MQA against MHA with repeated
 * key/value heads, the KV cache against the full forward, RoPE's
 * properties (norms kept, scores depend only on relative positions) and
 * scalings, gradients against finite differences, misuse errors. */
#include "nn_case.h"

static nb_tree *attn_params(nb_ctx *ctx, const nb_nn_attn_cfg *cfg, uint64_t seed) {
  nb_tree *params = nb_tree_create(ctx);
  nb_array *key = nb_key(ctx, seed);
  nb_nn_init in = {.ctx = ctx, .params = params, .key = key, .dtype = NB_F64};
  CHECK_OK(ctx, nb_nn_attention_init(&in, "attn", cfg, 0.5, 0.5));
  nb_array_release(key);
  return params;
}

static nb_nn_attn_cfg small_cfg(int64_t h, int64_t hkv) {
  nb_nn_attn_cfg c = {.d_model = 8, .n_heads = h, .n_kv_heads = hkv, .head_dim = 4, .rope = true, .causal = true,
                      .rope_cfg = {.theta = 10000}};
  return c;
}

static void test_causal(nb_ctx *ctx) {
  nb_nn_attn_cfg cfg = small_cfg(4, 2);
  nb_tree *params = attn_params(ctx, &cfg, 1);
  nb_test_rng rng = {3};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 5, 8});
  nb_tree *in = with_params(ctx, params, x);
  nn_case c = {.kind = M_ATTN, .cfg = &cfg, .dtype = NB_F64};
  nb_array *y1 = run_case(ctx, &c, in, NULL);
  /* change the last token of each row: earlier outputs stay */
  double *v = malloc(sizeof(double) * 80);
  for (int i = 0; i < 80; i++) v[i] = nb_array_get(nb_tree_get_array(in, "x"), i) + ((i / 8) % 5 == 4 ? 1.0 : 0);
  put(in, "x", nb_array_from_f64(ctx, NB_F64, 3, (int64_t[3]){2, 5, 8}, v));
  nb_array *y2 = run_case(ctx, &c, in, NULL);
  for (int i = 0; y1 && y2 && i < 80; i++) {
    bool last = (i / 8) % 5 == 4;
    double d = fabs(nb_array_get(y1, i) - nb_array_get(y2, i));
    if (!last) CHECK_MSG(d < 1e-14, "position %d changed by %g", (i / 8) % 5, d);
  }
  CHECK(max_diff(y1, y2) > 1e-3);
  /* not causal: everything changes */
  cfg.causal = false;
  nb_array *y3 = run_case(ctx, &c, in, NULL);
  CHECK(y3 && fabs(nb_array_get(y3, 0) - nb_array_get(y2, 0)) > 1e-6);
  free(v);
  nb_array_release(y1);
  nb_array_release(y2);
  nb_array_release(y3);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

/* Two documents packed in one row == the documents run separately. */
static void test_segments(nb_ctx *ctx) {
  nb_nn_attn_cfg cfg = small_cfg(2, 1);
  nb_tree *params = attn_params(ctx, &cfg, 2);
  nb_test_rng rng = {4};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){1, 6, 8});
  nb_array_retain(x);
  nb_tree *packed = with_params(ctx, params, x);
  int32_t seg[6] = {1, 1, 1, 2, 2, 2}, pos[6] = {0, 1, 2, 0, 1, 2};
  put(packed, "segment_ids", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 6}, seg));
  put(packed, "positions", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, 6}, pos));
  nb_tree *split = with_params(ctx, params, nb_array_create(ctx, NB_F64, 3, (int64_t[3]){2, 3, 8}, nb_array_data(x)));
  nn_case c = {.kind = M_ATTN, .cfg = &cfg, .dtype = NB_F64};
  nb_array *yp = run_case(ctx, &c, packed, NULL), *ys = run_case(ctx, &c, split, NULL);
  CHECK_MSG(max_diff(yp, ys) < 1e-13, "packed vs separate: %g", max_diff(yp, ys));
  /* without segment ids the second document sees the first */
  nb_tree_remove(packed, "segment_ids");
  nb_array *yn = run_case(ctx, &c, packed, NULL);
  CHECK(max_diff(yn, ys) > 1e-4);
  nb_array_release(yp);
  nb_array_release(ys);
  nb_array_release(yn);
  nb_array_release(x);
  nb_tree_destroy(packed);
  nb_tree_destroy(split);
  nb_tree_destroy(params);
}

/* GQA (and MQA) equal MHA whose k/v projections repeat each kv head for
 * its group of query heads. */
static void test_gqa_is_mha(nb_ctx *ctx) {
  for (int64_t hkv = 1; hkv <= 2; hkv++) {
    nb_nn_attn_cfg g = small_cfg(4, hkv), m = small_cfg(4, 4);
    nb_tree *pg = attn_params(ctx, &g, 5);
    nb_tree *pm = nb_tree_copy(pg);
    int64_t G = 4 / hkv, hd = 4;
    const char *names[2] = {"attn/wk/kernel", "attn/wv/kernel"};
    for (int n = 0; n < 2; n++) {
      nb_array *w = nb_tree_get_array(pg, names[n]); /* [8, hkv*hd] */
      double rep[8 * 16];
      for (int r = 0; r < 8; r++)
        for (int h = 0; h < 4; h++)
          for (int j = 0; j < hd; j++) rep[r * 16 + h * hd + j] = nb_array_get(w, r * hkv * hd + (h / G) * hd + j);
      put(pm, names[n], nb_array_from_f64(ctx, NB_F64, 2, (int64_t[2]){8, 16}, rep));
    }
    nb_test_rng rng = {6};
    nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 4, 8});
    nb_array_retain(x); /* with_params takes one reference per call */
    nb_array_retain(x);
    nb_tree *ig = with_params(ctx, pg, x), *im = with_params(ctx, pm, x);
    nn_case cg = {.kind = M_ATTN, .cfg = &g, .dtype = NB_F64}, cm = {.kind = M_ATTN, .cfg = &m, .dtype = NB_F64};
    nb_array *yg = run_case(ctx, &cg, ig, NULL), *ym = run_case(ctx, &cm, im, NULL);
    CHECK_MSG(max_diff(yg, ym) < 1e-13, "kv heads %lld: GQA vs MHA %g", (long long)hkv, max_diff(yg, ym));
    nb_array_release(yg);
    nb_array_release(ym);
    nb_array_release(x);
    nb_tree_destroy(ig);
    nb_tree_destroy(im);
    nb_tree_destroy(pg);
    nb_tree_destroy(pm);
  }
}

/* Prefill 3 tokens, then decode 2 one by one: the same outputs as the full
 * forward over 5, and the cache holds every key. */
static void test_kv_cache(nb_ctx *ctx) {
  nb_nn_attn_cfg cfg = small_cfg(4, 2);
  nb_tree *params = attn_params(ctx, &cfg, 7);
  nb_test_rng rng = {8};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 5, 8});
  nb_array_retain(x);
  nb_tree *full = with_params(ctx, params, x);
  nn_case c = {.kind = M_ATTN, .cfg = &cfg, .dtype = NB_F64};
  nb_array *yf = run_case(ctx, &c, full, NULL);
  nn_case cc = {.kind = M_ATTN, .cfg = &cfg, .dtype = NB_F64, .use_cache = true};
  nb_array *ck = nb_array_zeros(ctx, NB_F64, 4, (int64_t[4]){2, 2, 6, 4});
  nb_array *cv = nb_array_zeros(ctx, NB_F64, 4, (int64_t[4]){2, 2, 6, 4});
  int64_t starts[3] = {0, 3, 4}, lens[3] = {3, 1, 1};
  const double *xd = nb_array_data(x);
  for (int s = 0; s < 3; s++) {
    int64_t T = lens[s];
    double xs[2 * 3 * 8];
    for (int b = 0; b < 2; b++)
      for (int t = 0; t < T; t++)
        for (int j = 0; j < 8; j++) xs[(b * T + t) * 8 + j] = xd[(b * 5 + starts[s] + t) * 8 + j];
    nb_tree *in = with_params(ctx, params, nb_array_from_f64(ctx, NB_F64, 3, (int64_t[3]){2, T, 8}, xs));
    nb_tree_set_array(in, "cache_k", ck);
    nb_tree_set_array(in, "cache_v", cv);
    put(in, "cache_pos", nb_array_scalar(ctx, NB_I32, (double)starts[s]));
    nb_tree *out = nb_tree_create(ctx);
    nb_array *y = run_case(ctx, &cc, in, out);
    for (int b = 0; y && yf && b < 2; b++)
      for (int t = 0; t < T; t++)
        for (int j = 0; j < 8; j++)
          CHECK_NEAR(nb_array_get(y, (b * T + t) * 8 + j), nb_array_get(yf, (b * 5 + starts[s] + t) * 8 + j), 1e-12);
    nb_array_release(ck);
    nb_array_release(cv);
    ck = nb_tree_get_array(out, "cache_k");
    cv = nb_tree_get_array(out, "cache_v");
    nb_array_retain(ck);
    nb_array_retain(cv);
    nb_array_release(y);
    nb_tree_destroy(out);
    nb_tree_destroy(in);
  }
  /* slot 5 was never written */
  for (int b = 0; b < 2; b++)
    for (int h = 0; h < 2; h++)
      for (int j = 0; j < 4; j++) CHECK(nb_array_get(ck, ((b * 2 + h) * 6 + 5) * 4 + j) == 0);
  CHECK(nb_array_get(ck, 0) != 0);
  /* misuse: segments with a cache; a cache of the wrong shape */
  nb_tree *bad = with_params(ctx, params, NULL);
  nb_tree_set_array(bad, "x", x);
  nb_tree_set_array(bad, "cache_k", ck);
  nb_tree_set_array(bad, "cache_v", cv);
  put(bad, "cache_pos", nb_array_scalar(ctx, NB_I32, 0));
  int32_t seg[10] = {0};
  put(bad, "segment_ids", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 5}, seg));
  CHECK(run_case(ctx, &cc, bad, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "segment_ids cannot be combined with a KV cache");
  nb_tree_remove(bad, "segment_ids");
  put(bad, "cache_k", nb_array_zeros(ctx, NB_F64, 4, (int64_t[4]){2, 4, 6, 4}));
  CHECK(run_case(ctx, &cc, bad, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "cache_k must be [B=2, n_kv_heads=2, T_max>=5, head_dim=4]");
  nb_tree_destroy(bad);
  nb_array_release(ck);
  nb_array_release(cv);
  nb_array_release(yf);
  nb_array_release(x);
  nb_tree_destroy(full);
  nb_tree_destroy(params);
}

typedef struct rope_case { nb_nn_rope_cfg cfg; } rope_case;
static nb_status rope_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_nn_rope(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "positions"), &((rope_case *)u)->cfg));
}

static void test_rope(nb_ctx *ctx) {
  for (int inter = 0; inter < 2; inter++) {
    rope_case rc = {{.theta = 100, .interleaved = inter}};
    /* q at position m and k at position n, as two heads of one token row:
     * rows (m, n) = (1, 4) and (6, 9) share m - n */
    nb_test_rng rng = {10};
    nb_array *qk = nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){2, 6});
    double xv[2 * 2 * 2 * 6];
    for (int b = 0; b < 2; b++)
      for (int t = 0; t < 2; t++)
        for (int h = 0; h < 2; h++)
          for (int j = 0; j < 6; j++) xv[((b * 2 + t) * 2 + h) * 6 + j] = nb_array_get(qk, h * 6 + j);
    int32_t pos[4] = {1, 4, 6, 9};
    nb_tree *in = nb_tree_create(ctx);
    put(in, "x", nb_array_from_f64(ctx, NB_F64, 4, (int64_t[4]){2, 2, 2, 6}, xv)); /* [B=2, T=2, H=2, 6] */
    put(in, "positions", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 2}, pos));
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_test_eval(ctx, rope_fn, &rc, in, out));
    nb_array *y = nb_tree_get_array(out, "y");
    /* norms kept for every (b, t, h) */
    for (int r = 0; y && r < 8; r++) {
      double n0 = 0, n1 = 0;
      for (int j = 0; j < 6; j++) {
        n0 += xv[r * 6 + j] * xv[r * 6 + j];
        n1 += nb_array_get(y, r * 6 + j) * nb_array_get(y, r * 6 + j);
      }
      CHECK_NEAR(n1, n0, 1e-12);
    }
    /* <rope(q, m), rope(k, n)> depends on m - n only: q = head 0 at t=0,
     * k = head 1 at t=1, in both rows */
    double d[2] = {0, 0};
    for (int b = 0; y && b < 2; b++)
      for (int j = 0; j < 6; j++) d[b] += nb_array_get(y, ((b * 2 + 0) * 2 + 0) * 6 + j) * nb_array_get(y, ((b * 2 + 1) * 2 + 1) * 6 + j);
    CHECK_NEAR(d[0], d[1], 1e-12);
    /* position 0 is the identity */
    CHECK(nb_test_check_grads(ctx, "rope", rope_fn, &rc, in, 1e-5, true));
    nb_tree_destroy(out);
    nb_tree_destroy(in);
    nb_array_release(qk);
  }
  /* frequencies: theta^(-2i/d); linear divides all; llama3 keeps the high
   * ones, divides the low ones by factor and ramps in between */
  double f0[64], f1[64], f2[64];
  nb_nn_rope_cfg plain = {.theta = 500000}, lin = {.theta = 500000, .scaling = NB_NN_ROPE_LINEAR, .factor = 4};
  nb_nn_rope_cfg l3 = {.theta = 500000, .scaling = NB_NN_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                       .high_freq_factor = 4, .original_max_pos = 8192};
  CHECK_OK(ctx, nb_nn_rope_freqs(ctx, &plain, 128, f0));
  CHECK_OK(ctx, nb_nn_rope_freqs(ctx, &lin, 128, f1));
  CHECK_OK(ctx, nb_nn_rope_freqs(ctx, &l3, 128, f2));
  CHECK_NEAR(f0[1], pow(500000, -2.0 / 128), 1e-15);
  int ramp = 0;
  for (int i = 0; i < 64; i++) {
    CHECK_NEAR(f1[i], f0[i] / 4, 1e-15);
    double wl = 2 * M_PI / f0[i];
    if (wl < 8192 / 4.0) CHECK(f2[i] == f0[i]);
    else if (wl > 8192) CHECK_NEAR(f2[i], f0[i] / 8, 1e-15);
    else {
      CHECK(f2[i] < f0[i] && f2[i] > f0[i] / 8);
      ramp++;
    }
  }
  CHECK(ramp > 0);
  CHECK(nb_nn_rope_freqs(ctx, &plain, 7, f0) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "even head_dim");
  l3.high_freq_factor = 0.5;
  CHECK(nb_nn_rope_freqs(ctx, &l3, 8, f0) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "llama3");
}

static void test_grads(nb_ctx *ctx) {
  nb_nn_attn_cfg cfg = small_cfg(4, 2);
  cfg.bias = true;
  nb_tree *params = attn_params(ctx, &cfg, 9);
  nb_test_rng rng = {12};
  nb_tree *in = with_params(ctx, params, nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 3, 8}));
  int32_t seg[6] = {1, 1, 2, 1, 1, 1};
  put(in, "segment_ids", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 3}, seg));
  nn_case c = {.kind = M_ATTN, .cfg = &cfg, .dtype = NB_F64};
  CHECK(nb_test_check_grads(ctx, "attention", nn_case_fn, &c, in, 1e-5, false));
  /* bad head counts */
  cfg.n_kv_heads = 3;
  CHECK(run_case(ctx, &c, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "n_heads 4 must be a positive multiple of n_kv_heads 3");
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_causal(ctx);
  test_segments(ctx);
  test_gqa_is_mha(ctx);
  test_kv_cache(ctx);
  test_rope(ctx);
  test_grads(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("nn/attention");
}
