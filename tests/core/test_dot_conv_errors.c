/* Misuse of dot_general, matmul, conv and rev: each bad call gives its named
 * error (status and message, with the caller's file:line), poisons the graph
 * so later ops are no-ops, and never crashes; the reference evals survive
 * every injected allocation failure. */
#include "primcheck.h"

typedef struct two {
  nb_graph *g;
  nb_val *a, *b;
} two;

static two inputs(nb_ctx *ctx, nb_dtype ta, int ra, const int64_t *da, nb_dtype tb, int rb, const int64_t *db) {
  two t;
  t.g = nb_graph_create(ctx);
  t.a = nb_graph_input(t.g, "a", nb_aval_make(ta, ra, da));
  t.b = nb_graph_input(t.g, "b", nb_aval_make(tb, rb, db));
  return t;
}

/* y must be the poison value; the graph stays in error and ops on y are no-ops. */
static void done(nb_ctx *ctx, two *t, nb_val *y) {
  CHECK(nb_graph_status(t->g) != NB_OK);
  nb_val *z = nb_matmul(y, y);
  CHECK(z == y);
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(t->g);
}

static nb_dot_dims mm_dims(void) {
  nb_dot_dims dn;
  memset(&dn, 0, sizeof dn);
  dn.n_contract = 1;
  dn.lhs_contract[0] = 1;
  return dn;
}

static void test_dot_errors(nb_ctx *ctx) {
  int64_t d34[2] = {3, 4}, d54[2] = {5, 4}, d45[2] = {4, 5}, d245[3] = {2, 4, 5}, d345[3] = {3, 4, 5};
  nb_dot_dims dn = mm_dims();
  two t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d54);
  nb_val *y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "contracting dims lhs 1 (4) and rhs 0 (5) differ");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  dn.lhs_contract[0] = 2;
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "lhs contracting dim 2 out of range for rank 2");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 3, d345, NB_F32, 3, d345);
  dn = mm_dims();
  dn.n_batch = 1;
  dn.lhs_batch[0] = 1; /* dim 1 is also contracted */
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "lhs dim 1 is used twice");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 3, d245, NB_F32, 3, d345);
  dn = mm_dims();
  dn.n_batch = 1;
  dn.lhs_contract[0] = 1;
  dn.rhs_contract[0] = 1;
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "batch dims lhs 0 (2) and rhs 0 (3) differ");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F64, 2, d45);
  dn = mm_dims();
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "operand dtypes differ (f32 vs f64)");
  done(ctx, &t, y);

  t = inputs(ctx, NB_BOOL, 2, d34, NB_BOOL, 2, d45);
  y = nb_matmul(t.a, t.b);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "bool operands are not allowed");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  y = nb_dot_general(t.a, t.b, &dn, NB_I32);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "out_dtype must be a float dtype");
  done(ctx, &t, y);

  t = inputs(ctx, NB_I32, 2, d34, NB_I32, 2, d45);
  y = nb_dot_general(t.a, t.b, &dn, NB_BF16);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "out_dtype must be an integer dtype");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  y = nb_dot_general(t.a, t.b, &dn, (nb_dtype)99);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "invalid out_dtype 99");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  y = nb_dot_general(t.a, t.b, NULL, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "NULL dimension numbers");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  y = nb_dot_general(t.a, NULL, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "dot_general: NULL operand");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d45);
  dn.n_contract = 3;
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "0 batch + 3 contracting dims for ranks 2 and 2");
  done(ctx, &t, y);

  /* the shape-rule error names the primitive, the operands and the caller */
  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d54);
  dn = mm_dims();
  y = nb_dot_general(t.a, t.b, &dn, NB_DTYPE_COUNT);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "dot_general") && strstr(nb_ctx_error(ctx), "f32[3,4]") &&
                strstr(nb_ctx_error(ctx), "test_dot_conv_errors.c"),
            "%s", nb_ctx_error(ctx));
  done(ctx, &t, y);

  CHECK(nb_dot_general(NULL, NULL, &dn, NB_DTYPE_COUNT) == NULL);
  CHECK(nb_matmul(NULL, NULL) == NULL);
}

static void test_matmul_errors(nb_ctx *ctx) {
  int64_t d34[2] = {3, 4}, d54[2] = {5, 4}, d2134[4] = {2, 1, 3, 4}, d345[3] = {3, 4, 5}, d4[1] = {4};
  two t = inputs(ctx, NB_F32, 0, NULL, NB_F32, 2, d34);
  nb_val *y = nb_matmul(t.a, t.b);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "operands must have rank >= 1");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 2, d34, NB_F32, 2, d54);
  y = nb_matmul(t.a, t.b);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "matmul: contracting dims differ: f32[3,4] @ f32[5,4]");
  done(ctx, &t, y);

  int64_t d2445[4] = {2, 2, 4, 5};
  t = inputs(ctx, NB_F32, 4, d2134, NB_F32, 4, d2445);
  y = nb_matmul(t.a, t.b); /* batch (2,1) vs (2,2) broadcast fine */
  CHECK(nb_graph_status(t.g) == NB_OK && nb_val_rank(y) == 4 && nb_val_dim(y, 1) == 2);
  nb_graph_destroy(t.g);

  int64_t d3345[4] = {3, 3, 4, 5};
  t = inputs(ctx, NB_F32, 4, d2134, NB_F32, 4, d3345);
  y = nb_matmul(t.a, t.b);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "do not broadcast (batch axis 0)");
  done(ctx, &t, y);

  t = inputs(ctx, NB_F32, 1, d4, NB_F32, 1, d4); /* vector . vector -> scalar */
  y = nb_matmul(t.a, t.b);
  CHECK(nb_graph_status(t.g) == NB_OK && nb_val_rank(y) == 0);
  nb_graph_destroy(t.g);
  t = inputs(ctx, NB_F32, 3, d345, NB_F32, 1, d4);
  y = nb_matmul(t.a, t.b);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "contracting dims differ");
  done(ctx, &t, y);
}

static void conv_err(nb_ctx *ctx, int r, const int64_t *da, const int64_t *db, const nb_conv_params *p, nb_status want,
                     const char *needle) {
  two t = inputs(ctx, NB_F32, r, da, NB_F32, r, db);
  nb_val *y = nb_conv(t.a, t.b, p);
  CHECK_ERR(ctx, want, needle);
  done(ctx, &t, y);
}

static void test_conv_errors(nb_ctx *ctx) {
  int64_t x[4] = {2, 4, 5, 5}, w[4] = {6, 2, 3, 3}, w3[3] = {6, 4, 3};
  nb_conv_params p = nb_conv_params_default(2, NULL, NULL);
  conv_err(ctx, 4, x, w, &p, NB_ERR_SHAPE, "lhs features (4) must equal rhs in-features (2) * feature_group_count (1)");
  p.feature_group_count = 4;
  conv_err(ctx, 4, x, w, &p, NB_ERR_SHAPE, "lhs features (4) must equal rhs in-features (2) * feature_group_count (4)");
  p.feature_group_count = 2;
  int64_t w5[4] = {5, 2, 3, 3};
  conv_err(ctx, 4, x, w5, &p, NB_ERR_SHAPE, "rhs out-features (5) must be divisible by the group count (2)");
  p.batch_group_count = 2;
  conv_err(ctx, 4, x, w, &p, NB_ERR_INVALID_ARG, "cannot both exceed 1");
  p = nb_conv_params_default(2, NULL, NULL);
  p.batch_group_count = 3;
  int64_t w4[4] = {6, 4, 3, 3};
  conv_err(ctx, 4, x, w4, &p, NB_ERR_SHAPE, "lhs batch (2) must be divisible by batch_group_count (3)");
  p.batch_group_count = 0;
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "must be >= 1");
  p = nb_conv_params_default(2, (int64_t[]){1, 0}, NULL);
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "spatial dim 1: strides and dilations must be in [1, 2^40]");
  p = nb_conv_params_default(2, NULL, NULL);
  p.rhs_dilation[0] = -1;
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "spatial dim 0: strides and dilations");
  p = nb_conv_params_default(2, NULL, NULL);
  p.pad_hi[1] = (int64_t)1 << 57;
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "spatial dim 1: padding out of range");
  p = nb_conv_params_default(2, NULL, NULL);
  p.lhs_dilation[0] = (int64_t)1 << 40;
  int64_t xhuge[4] = {2, 4, (int64_t)1 << 40, 5};
  conv_err(ctx, 4, xhuge, w4, &p, NB_ERR_SHAPE, "spatial dim 0: dilated sizes exceed 2^56");
  p = nb_conv_params_default(2, NULL, NULL);
  p.lhs_spatial[1] = 1; /* feature dim twice */
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "lhs dim numbers (batch, feature, spatial) are not a permutation of 0..3");
  p = nb_conv_params_default(2, NULL, NULL);
  p.rhs_in_feature_dim = 4;
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "rhs dim numbers");
  p = nb_conv_params_default(2, NULL, NULL);
  p.out_batch_dim = -1;
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "out dim numbers");
  p = nb_conv_params_default(2, NULL, NULL);
  conv_err(ctx, 3, x, w3, &p, NB_ERR_SHAPE, "lhs and rhs must have rank n_spatial + 2 = 4");
  p = nb_conv_params_default(7, NULL, NULL);
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "n_spatial 7 is not in [0, 6]");
  p = nb_conv_params_default(-1, NULL, NULL);
  conv_err(ctx, 4, x, w4, &p, NB_ERR_INVALID_ARG, "n_spatial -1");
  p = nb_conv_params_default(2, NULL, NULL);
  int64_t w0[4] = {6, 4, 0, 3};
  conv_err(ctx, 4, x, w0, &p, NB_ERR_SHAPE, "kernel spatial dim 0 is empty");

  two t = inputs(ctx, NB_F32, 4, x, NB_F64, 4, w4);
  nb_val *y = nb_conv(t.a, t.b, &p);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "operand dtypes differ (f32 vs f64)");
  done(ctx, &t, y);
  t = inputs(ctx, NB_BOOL, 4, x, NB_BOOL, 4, w4);
  y = nb_conv(t.a, t.b, &p);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "bool operands");
  done(ctx, &t, y);
  t = inputs(ctx, NB_F32, 4, x, NB_F32, 4, w4);
  y = nb_conv(t.a, t.b, NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "conv: NULL params");
  done(ctx, &t, y);
  t = inputs(ctx, NB_F32, 4, x, NB_F32, 4, w4);
  y = nb_conv(NULL, t.b, &p);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "conv: NULL operand");
  done(ctx, &t, y);
  CHECK(nb_conv(NULL, NULL, &p) == NULL);

  /* a zeroed struct is not valid params (n_spatial 0 with rank-3 operands) */
  int64_t xs[3] = {1, 1, 2}, ws[3] = {1, 1, 3};
  t = inputs(ctx, NB_F32, 3, xs, NB_F32, 3, ws);
  y = nb_conv(t.a, t.b, &(nb_conv_params){0});
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "lhs dim numbers (batch, feature, spatial) are not a permutation of 0..1");
  done(ctx, &t, y);
  /* a kernel that does not fit gives an empty output, not an error */
  t = inputs(ctx, NB_F32, 3, xs, NB_F32, 3, ws);
  p = nb_conv_params_default(1, NULL, NULL);
  y = nb_conv(t.a, t.b, &p);
  CHECK(nb_graph_status(t.g) == NB_OK && nb_val_dim(y, 2) == 0);
  nb_graph_destroy(t.g);
}

static void test_rev_errors(nb_ctx *ctx) {
  int64_t d[2] = {2, 3};
  two t = inputs(ctx, NB_F32, 2, d, NB_F32, 2, d);
  nb_val *y = nb_rev(t.a, 1, (int[]){2});
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rev: axis 2 out of range for rank 2");
  done(ctx, &t, y);
  t = inputs(ctx, NB_F32, 2, d, NB_F32, 2, d);
  static const int twice[2] = {1, -1};
  y = nb_rev(t.a, 2, twice);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rev: axis -1 repeated");
  done(ctx, &t, y);
  t = inputs(ctx, NB_F32, 2, d, NB_F32, 2, d);
  y = nb_rev(t.a, 1, NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rev: 1 axes for a rank-2 operand");
  done(ctx, &t, y);
  t = inputs(ctx, NB_F32, 2, d, NB_F32, 2, d);
  CHECK(nb_rev(t.a, 0, NULL) == t.a); /* nothing to reverse */
  nb_graph_destroy(t.g);
}

/* ---------------------------------------------------------------- rank limits */

static nb_status f_conv6(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_conv_params p = nb_conv_params_default(6, NULL, NULL);
  p.feature_group_count = 2;
  nb_val *y = nb_conv(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "w"), &p);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(y, 0, NULL));
}

/* The transpose of a grouped conv w.r.t. lhs reshapes the kernel to one more
 * dim than its rank; with 6 spatial dims that exceeds NB_MAX_RANK and is a
 * named NB_ERR_UNIMPLEMENTED (the gradient w.r.t. the kernel needs no
 * reshape and works). */
static void test_rank_limits(nb_ctx *ctx) {
  const int64_t dx[8] = {1, 2, 1, 2, 1, 1, 1, 1}, dw[8] = {2, 1, 1, 1, 1, 1, 1, 1};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_ones(ctx, NB_F64, 8, dx), *w = nb_array_ones(ctx, NB_F64, 8, dw);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "w", w);
  nb_graph *g = nb_trace(ctx, f_conv6, NULL, in);
  CHECK(g != NULL);
  nb_graph *gx = nb_grad(ctx, g, &(nb_grad_opts){.wrt = "x"});
  CHECK(gx == NULL);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "conv: the transpose of a grouped conv needs a rank-9 intermediate");
  nb_graph *gw = nb_grad(ctx, g, &(nb_grad_opts){.wrt = "w"});
  nb_tree *out = nb_tree_create(ctx);
  CHECK_MSG(gw && nb_graph_run(ctx, gw, in, out) == NB_OK, "%s", nb_ctx_error(ctx));
  nb_array *grad = nb_tree_get_array(out, "grad/w");
  CHECK(grad && nb_array_get(grad, 0) == 2 && nb_array_get(grad, 1) == 2); /* each tap sees two ones */
  nb_tree_destroy(out);
  nb_graph_destroy(gw);
  nb_graph_destroy(g);
  nb_array_release(x);
  nb_array_release(w);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- allocation failures */

static nb_status f_net(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_conv_params p = nb_conv_params_default(2, (int64_t[]){2, 1}, (int64_t[]){1, 1});
  p.feature_group_count = 2;
  nb_val *h = nb_conv(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "w"), &p); /* [2,4,3,4] */
  static const int64_t flat[2] = {2, 48};
  nb_val *f = nb_reshape(h, 2, flat);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_tanh(nb_matmul(f, nb_tree_get_val(in, "v"))), 0, NULL));
}

/* Fails the n-th allocation for n = 1, 2, ... while building and running the
 * gradient of a small conv + matmul network: every failure is reported as
 * NB_ERR_NOMEM (never a crash or a leak) until the run succeeds. */
static void test_alloc_failures(nb_ctx *ctx) {
  nb_test_rng rng = {3};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 4, (int64_t[]){2, 4, 5, 4});
  nb_array *w = nb_test_randn(ctx, &rng, NB_F64, 4, (int64_t[]){4, 2, 3, 3});
  nb_array *v = nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[]){48, 3});
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "w", w);
  nb_tree_set_array(in, "v", v);
  size_t base = nb_ctx_bytes_in_use(ctx);
  bool succeeded = false;
  int n;
  for (n = 1; n < 5000 && !succeeded; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_graph *g = nb_trace(ctx, f_net, NULL, in), *dg = g ? nb_value_and_grad(ctx, g, NULL) : NULL;
    nb_tree *out = nb_tree_create(ctx);
    nb_status st = dg && out ? nb_graph_run(ctx, dg, in, out) : NB_ERR_NOMEM;
    nb_ctx_fail_alloc_after(ctx, 0);
    if (st == NB_OK) succeeded = true;
    else CHECK_MSG(nb_ctx_status(ctx) == NB_ERR_NOMEM, "failure %d: %s", n, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    nb_tree_destroy(out);
    nb_graph_destroy(dg);
    nb_graph_destroy(g);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "failure %d leaked %zu bytes", n, nb_ctx_bytes_in_use(ctx) - base);
  }
  CHECK_MSG(succeeded && n > 10, "succeeded after %d injected failures", n);
  nb_array_release(x);
  nb_array_release(w);
  nb_array_release(v);
  nb_tree_destroy(in);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  test_dot_errors(ctx);
  test_matmul_errors(ctx);
  test_conv_errors(ctx);
  test_rev_errors(ctx);
  test_rank_limits(ctx);
  test_alloc_failures(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/dot_conv_errors");
}
