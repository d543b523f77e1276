/* nn modules: deterministic init by path, linear (and its hook), embed,
 * norms, activations, cross-entropy, dropout and the MLP against values
 * computed here; gradients of each against finite differences (f64);
 * errors that name the parameter path; parameter-tree edits. */
#include "nn_case.h"

static nb_tree *init_tree(nb_ctx *ctx, uint64_t seed, nb_dtype t, nb_status (*fn)(nb_nn_init *, void *), void *u) {
  nb_tree *params = nb_tree_create(ctx);
  nb_array *key = nb_key(ctx, seed);
  nb_nn_init in = {.ctx = ctx, .params = params, .key = key, .dtype = t};
  nb_status s = fn(&in, u);
  CHECK_MSG(s == NB_OK, "init: %s", nb_ctx_error(ctx));
  nb_array_release(key);
  return params;
}

static nb_status init_linear(nb_nn_init *in, void *u) { return nb_nn_linear_init(in, "lin", 3, 4, true, 0.5); }
static nb_status init_norms(nb_nn_init *in, void *u) {
  nb_status s = nb_nn_layernorm_init(in, "ln", 5, true);
  return s ? s : nb_nn_rmsnorm_init(in, "rms", 5);
}
static nb_status init_mlp(nb_nn_init *in, void *u) { return nb_nn_mlp_init(in, "mlp", u, 0.5, 0.5); }

static void test_init(nb_ctx *ctx) {
  nb_tree *a = init_tree(ctx, 7, NB_F32, init_linear, NULL), *b = init_tree(ctx, 7, NB_F32, init_linear, NULL);
  nb_tree *c = init_tree(ctx, 8, NB_F32, init_linear, NULL);
  CHECK(nb_tree_size(a) == 2 && nb_tree_find(a, "lin/kernel") == 0 && nb_tree_find(a, "lin/bias") == 1);
  nb_array *k = nb_tree_get_array(a, "lin/kernel");
  CHECK(k && nb_array_rank(k) == 2 && nb_array_dims(k)[0] == 3 && nb_array_dims(k)[1] == 4);
  CHECK(nb_array_equal(k, nb_tree_get_array(b, "lin/kernel")));           /* same key: same values */
  CHECK(!nb_array_equal(k, nb_tree_get_array(c, "lin/kernel")));          /* another key: others */
  CHECK(nb_array_get(nb_tree_get_array(a, "lin/bias"), 2) == 0);
  /* a leaf's value depends on its path and the key, not on init order */
  nb_array *root = nb_key(ctx, 7), *lk = nb_nn_leaf_key(ctx, root, "lin/kernel");
  int64_t d[2] = {3, 4};
  nb_array *z = nb_array_random_normal(ctx, lk, NB_F32, 2, d);
  double s2 = 0;
  for (int i = 0; i < 12; i++) {
    CHECK_NEAR(nb_array_get(k, i), 0.5 * nb_array_get(z, i), 1e-6);
    s2 += nb_array_get(k, i) * nb_array_get(k, i);
  }
  CHECK(s2 > 0);
  CHECK(nb_nn_path_hash("a") != nb_nn_path_hash("b"));
  CHECK(nb_nn_params_count(a) == 16);
  nb_array_release(z);
  nb_array_release(lk);
  nb_array_release(root);
  /* bad dtype */
  nb_tree *t = nb_tree_create(ctx);
  nb_array *key = nb_key(ctx, 1);
  nb_nn_init bad = {.ctx = ctx, .params = t, .key = key, .dtype = NB_I32};
  CHECK(nb_nn_linear_init(&bad, "x", 2, 2, false, 1) == NB_ERR_DTYPE);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "not a float dtype");
  nb_array_release(key);
  nb_tree_destroy(t);
  nb_tree_destroy(a);
  nb_tree_destroy(b);
  nb_tree_destroy(c);
}

/* counts calls per path and doubles the result of "lin" */
typedef struct hook_state {
  int calls;
  char last[NB_NN_PATH_MAX];
} hook_state;
static nb_val *double_hook(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  hook_state *h = ud;
  h->calls++;
  snprintf(h->last, sizeof h->last, "%s", path);
  nb_val *y = nb_nn_linear_default(a, path, x, stacked);
  return nb_mul(y, nb_full_like(y, 2));
}

static void test_linear(nb_ctx *ctx) {
  nb_tree *params = init_tree(ctx, 3, NB_F64, init_linear, NULL);
  nb_test_rng rng = {5};
  int64_t dx[2] = {2, 3};
  nb_array *xa = nb_test_randn(ctx, &rng, NB_F64, 2, dx);
  nb_array_retain(xa);
  nb_tree *in = with_params(ctx, params, xa);
  nn_case c = {.kind = M_LINEAR, .dtype = NB_F64};
  nb_array *y = run_case(ctx, &c, in, NULL);
  nb_array *w = nb_tree_get_array(params, "lin/kernel"), *b = nb_tree_get_array(params, "lin/bias");
  for (int i = 0; y && i < 2; i++)
    for (int j = 0; j < 4; j++) {
      double s = nb_array_get(b, j);
      for (int k = 0; k < 3; k++) s += nb_array_get(xa, i * 3 + k) * nb_array_get(w, k * 4 + j);
      CHECK_NEAR(nb_array_get(y, i * 4 + j), s, 1e-12);
    }
  /* the hook sees every linear by path and may change it */
  hook_state h = {0};
  nn_case ch = {.kind = M_LINEAR, .dtype = NB_F64, .hook = double_hook, .hook_ud = &h};
  nb_array *y2 = run_case(ctx, &ch, in, NULL);
  CHECK(h.calls == 1 && strcmp(h.last, "lin") == 0);
  for (int i = 0; y && y2 && i < 8; i++) CHECK_NEAR(nb_array_get(y2, i), 2 * nb_array_get(y, i), 1e-12);
  CHECK(nb_test_check_grads(ctx, "linear", nn_case_fn, &c, in, 1e-5, true));
  /* a missing parameter names its path; a wrong width names the shapes */
  nb_tree_remove(in, "params/lin/kernel");
  CHECK(run_case(ctx, &c, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "parameter 'lin/kernel' is missing");
  int64_t d5[2] = {3, 5};
  put(in, "params/lin/kernel", nb_array_zeros(ctx, NB_F64, 2, d5));
  nb_array *bad = nb_array_zeros(ctx, NB_F64, 2, (int64_t[2]){2, 7});
  put(in, "x", bad);
  CHECK(run_case(ctx, &c, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "linear 'lin': input f64[2,7] does not fit kernel f64[3,5]");
  nb_array_release(y);
  nb_array_release(y2);
  nb_array_release(xa);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

static void test_norms(nb_ctx *ctx) {
  nb_tree *params = init_tree(ctx, 3, NB_F64, init_norms, NULL);
  /* non-trivial scale and bias */
  double sv[5] = {1, 2, 0.5, -1, 3}, bv[5] = {0.1, 0, -0.2, 0.3, 0};
  put(params, "ln/scale", nb_array_from_f64(ctx, NB_F64, 1, (int64_t[1]){5}, sv));
  put(params, "ln/bias", nb_array_from_f64(ctx, NB_F64, 1, (int64_t[1]){5}, bv));
  put(params, "rms/scale", nb_array_from_f64(ctx, NB_F64, 1, (int64_t[1]){5}, sv));
  nb_test_rng rng = {9};
  nb_array *xa = nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){3, 5});
  nb_array_retain(xa);
  nb_tree *in = with_params(ctx, params, xa);
  nn_case ln = {.kind = M_LAYERNORM, .dtype = NB_F64}, rms = {.kind = M_RMSNORM, .dtype = NB_F64};
  nb_array *y1 = run_case(ctx, &ln, in, NULL), *y2 = run_case(ctx, &rms, in, NULL);
  for (int r = 0; y1 && y2 && r < 3; r++) {
    double mean = 0, var = 0, ms = 0;
    for (int j = 0; j < 5; j++) mean += nb_array_get(xa, r * 5 + j) / 5;
    for (int j = 0; j < 5; j++) {
      double v = nb_array_get(xa, r * 5 + j);
      var += (v - mean) * (v - mean) / 5;
      ms += v * v / 5;
    }
    for (int j = 0; j < 5; j++) {
      double v = nb_array_get(xa, r * 5 + j);
      CHECK_NEAR(nb_array_get(y1, r * 5 + j), (v - mean) / sqrt(var + 1e-5) * sv[j] + bv[j], 1e-12);
      CHECK_NEAR(nb_array_get(y2, r * 5 + j), v / sqrt(ms + 1e-6) * sv[j], 1e-12);
    }
  }
  CHECK(nb_test_check_grads(ctx, "layernorm", nn_case_fn, &ln, in, 1e-5, true));
  CHECK(nb_test_check_grads(ctx, "rmsnorm", nn_case_fn, &rms, in, 1e-5, true));
  nb_array_release(y1);
  nb_array_release(y2);
  nb_array_release(xa);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

typedef struct act_case { nb_nn_act act; } act_case;
static nb_status act_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_nn_activation(nb_tree_get_val(in, "x"), ((act_case *)u)->act));
}

static void test_activations(nb_ctx *ctx) {
  double xv[5] = {-3, -0.5, 0, 0.7, 2.5};
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", nb_array_from_f64(ctx, NB_F64, 1, (int64_t[1]){5}, xv));
  for (int k = 0; k < NB_NN_ACT_COUNT; k++) {
    act_case c = {(nb_nn_act)k};
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_test_eval(ctx, act_fn, &c, in, out));
    nb_array *y = nb_tree_get_array(out, "y");
    for (int i = 0; y && i < 5; i++) {
      double x = xv[i], want = k == NB_NN_GELU_TANH ? 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)))
                               : k == NB_NN_GELU    ? 0.5 * x * (1 + erf(x / sqrt(2)))
                               : k == NB_NN_RELU    ? fmax(x, 0)
                                                    : x / (1 + exp(-x));
      CHECK_NEAR(nb_array_get(y, i), want, 1e-12);
    }
    if (k != NB_NN_RELU) CHECK(nb_test_check_grads(ctx, nb_nn_act_name((nb_nn_act)k), act_fn, &c, in, 1e-5, true));
    nb_tree_destroy(out);
  }
  CHECK(strcmp(nb_nn_act_name(NB_NN_SILU), "silu") == 0);
  nb_tree_destroy(in);
}

static void test_mlp(nb_ctx *ctx) {
  for (int gated = 0; gated < 2; gated++) {
    nb_nn_mlp_cfg cfg = {.d_model = 4, .d_ff = 6, .act = gated ? NB_NN_SILU : NB_NN_GELU_TANH, .gated = gated, .bias = !gated};
    nb_tree *params = init_tree(ctx, 11, NB_F64, init_mlp, &cfg);
    CHECK(nb_tree_size(params) == (gated ? 3u : 4u));
    CHECK(nb_tree_find(params, gated ? "mlp/wi_1/kernel" : "mlp/wi/bias") >= 0);
    nb_test_rng rng = {13};
    nb_tree *in = with_params(ctx, params, nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 3, 4}));
    nn_case c = {.kind = M_MLP, .cfg = &cfg, .dtype = NB_F64};
    nb_array *y = run_case(ctx, &c, in, NULL);
    CHECK(y && nb_array_rank(y) == 3 && nb_array_dims(y)[2] == 4);
    /* value at one row by hand */
    nb_array *x = nb_tree_get_array(in, "x");
    double h[6], out = 0;
    for (int f = 0; f < 6; f++) {
      double u = 0, v = 0;
      for (int k = 0; k < 4; k++) {
        u += nb_array_get(x, k) * nb_array_get(nb_tree_get_array(params, gated ? "mlp/wi_0/kernel" : "mlp/wi/kernel"), k * 6 + f);
        if (gated) v += nb_array_get(x, k) * nb_array_get(nb_tree_get_array(params, "mlp/wi_1/kernel"), k * 6 + f);
      }
      h[f] = gated ? u / (1 + exp(-u)) * v : 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
    }
    for (int f = 0; f < 6; f++) out += h[f] * nb_array_get(nb_tree_get_array(params, "mlp/wo/kernel"), f * 4 + 1);
    if (y) CHECK_NEAR(nb_array_get(y, 1), out, 1e-12);
    CHECK(nb_test_check_grads(ctx, gated ? "swiglu" : "mlp", nn_case_fn, &c, in, 1e-5, true));
    nb_array_release(y);
    nb_tree_destroy(in);
    nb_tree_destroy(params);
  }
}

static void test_cross_entropy(nb_ctx *ctx) {
  double lv[6] = {1, 2, 3, 0.5, -1, 0}, mv[2] = {1, 0};
  int32_t tv[2] = {2, 0};
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", nb_array_from_f64(ctx, NB_F64, 2, (int64_t[2]){2, 3}, lv));
  put(in, "targets", nb_array_create(ctx, NB_I32, 1, (int64_t[1]){2}, tv));
  nn_case c = {.kind = M_CE, .dtype = NB_F64};
  nb_array *y = run_case(ctx, &c, in, NULL);
  double l0 = log(exp(1) + exp(2) + exp(3)) - 3, l1 = log(exp(0.5) + exp(-1) + exp(0)) - 0.5;
  if (y) CHECK_NEAR(nb_array_get(y, 0), (l0 + l1) / 2, 1e-12);
  nb_array_release(y);
  CHECK(nb_test_check_grads(ctx, "cross_entropy", nn_case_fn, &c, in, 1e-5, true));
  put(in, "mask", nb_array_from_f64(ctx, NB_F32, 1, (int64_t[1]){2}, mv));
  y = run_case(ctx, &c, in, NULL);
  if (y) CHECK_NEAR(nb_array_get(y, 0), l0, 1e-12);
  nb_array_release(y);
  double zero[2] = {0, 0};
  put(in, "mask", nb_array_from_f64(ctx, NB_BOOL, 1, (int64_t[1]){2}, zero));
  y = run_case(ctx, &c, in, NULL);
  if (y) CHECK(nb_array_get(y, 0) == 0);
  nb_array_release(y);
  nb_tree_destroy(in);
}

typedef struct drop_case { double rate; bool train; } drop_case;
static nb_status drop_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const drop_case *d = u;
  nb_nn_apply a = {.g = g, .train = d->train, .rng = nb_tree_get_val(in, "rng")};
  return nb_tree_set_val(out, "y", nb_nn_dropout(&a, "layers/0/drop", nb_tree_get_val(in, "x"), d->rate));
}

static void test_dropout(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", nb_array_ones(ctx, NB_F32, 2, (int64_t[2]){40, 50}));
  put(in, "rng", nb_key(ctx, 42));
  drop_case d = {0.25, true};
  nb_tree *o1 = nb_tree_create(ctx), *o2 = nb_tree_create(ctx), *o3 = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_test_eval(ctx, drop_fn, &d, in, o1));
  CHECK_OK(ctx, nb_test_eval(ctx, drop_fn, &d, in, o2));
  put(in, "rng", nb_key(ctx, 43));
  CHECK_OK(ctx, nb_test_eval(ctx, drop_fn, &d, in, o3));
  nb_array *y1 = nb_tree_get_array(o1, "y"), *y2 = nb_tree_get_array(o2, "y"), *y3 = nb_tree_get_array(o3, "y");
  CHECK(y1 && y2 && y3 && nb_array_equal(y1, y2) && !nb_array_equal(y1, y3));
  int zeros = 0;
  for (int i = 0; y1 && i < 2000; i++) {
    double v = nb_array_get(y1, i);
    CHECK_MSG(v == 0 || fabs(v - 1 / 0.75) < 1e-6, "dropout value %g", v);
    zeros += v == 0;
  }
  CHECK_MSG(zeros > 400 && zeros < 600, "%d of 2000 dropped at rate 0.25", zeros);
  /* eval mode: identity; train without a key: a named error */
  drop_case e = {0.25, false};
  nb_tree *o4 = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_test_eval(ctx, drop_fn, &e, in, o4));
  CHECK(nb_array_equal(nb_tree_get_array(o4, "y"), nb_tree_get_array(in, "x")));
  nb_tree_remove(in, "rng");
  CHECK(nb_test_eval(ctx, drop_fn, &d, in, o4) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "dropout 'layers/0/drop' in train mode needs the step's rng key");
  nb_tree_destroy(o1);
  nb_tree_destroy(o2);
  nb_tree_destroy(o3);
  nb_tree_destroy(o4);
  nb_tree_destroy(in);
}

static nb_status init_embed(nb_nn_init *in, void *u) { return nb_nn_embed_init(in, "emb", 10, 3, 1.0); }

static void test_embed_and_edit(nb_ctx *ctx) {
  nb_tree *params = init_tree(ctx, 2, NB_F64, init_embed, NULL);
  nb_tree *in = with_params(ctx, params, NULL);
  int32_t ids[4] = {3, 0, 9, 3};
  put(in, "ids", nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 2}, ids));
  nn_case c = {.kind = M_EMBED, .dtype = NB_F64};
  nb_array *y = run_case(ctx, &c, in, NULL);
  nb_array *tab = nb_tree_get_array(params, "emb/embedding");
  CHECK(y && nb_array_rank(y) == 3 && nb_array_dims(y)[2] == 3);
  for (int i = 0; y && i < 4; i++)
    for (int j = 0; j < 3; j++) CHECK(nb_array_get(y, i * 3 + j) == nb_array_get(tab, ids[i] * 3 + j));
  nb_array_release(y);
  /* editing by path: replace a submodule's leaves */
  nb_tree *t = nb_tree_create(ctx);
  put(t, "a/x", nb_array_scalar(ctx, NB_F32, 1));
  put(t, "a/y/z", nb_array_scalar(ctx, NB_F32, 2));
  put(t, "ab", nb_array_scalar(ctx, NB_F32, 3));
  nb_tree *src = nb_tree_create(ctx);
  put(src, "w", nb_array_scalar(ctx, NB_F32, 4));
  CHECK_OK(ctx, nb_nn_params_replace(t, "a", src));
  CHECK(nb_tree_size(t) == 2 && nb_tree_find(t, "ab") >= 0 && nb_tree_find(t, "a/w") >= 0 && nb_tree_find(t, "a/x") < 0);
  nb_tree_destroy(src);
  nb_tree_destroy(t);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_init(ctx);
  test_linear(ctx);
  test_norms(ctx);
  test_activations(ctx);
  test_mlp(ctx);
  test_cross_entropy(ctx);
  test_dropout(ctx);
  test_embed_and_edit(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("nn/modules");
}
