/* MoE routing invariants: dropless with every expert chosen equals the dense
 * softmax mixture of the experts run one by one; a capacity that holds every
 * token equals dropless; a small capacity drops exactly the later tokens of
 * overloaded experts (their rows become zero); shared experts add to every
 * token; auxiliary losses at a uniform router; gradients; the expert-
 * parallel path over a one-process axis (its exchanges are the identity)
 * and its refusals. The multi-process path: tests/dist/train_ep.sh. */
#include "nn_case.h"

static nb_tree *moe_params(nb_ctx *ctx, const nb_nn_moe_cfg *cfg, uint64_t seed, double router_std) {
  nb_tree *params = nb_tree_create(ctx);
  nb_array *key = nb_key(ctx, seed);
  nb_nn_init in = {.ctx = ctx, .params = params, .key = key, .dtype = NB_F64};
  CHECK_OK(ctx, nb_nn_moe_init(&in, "moe", cfg, 0.5, 0.5, router_std));
  nb_array_release(key);
  return params;
}

static nb_nn_moe_cfg small_moe(int64_t e, int64_t k) {
  nb_nn_moe_cfg c = {.n_experts = e, .top_k = k, .expert = {.d_model = 4, .d_ff = 3, .act = NB_NN_SILU, .gated = true}};
  return c;
}

/* expert e's own kernels [d_in, d_out] out of the stacked [E, d_in, d_out] */
static nb_array *expert_slice(nb_ctx *ctx, nb_array *w, int64_t e) {
  int64_t a = nb_array_dims(w)[1], b = nb_array_dims(w)[2];
  return nb_array_create(ctx, NB_F64, 2, (int64_t[2]){a, b}, (const double *)nb_array_data(w) + e * a * b);
}

/* reference: sum_e softmax(router(x))_e * mlp_e(x), experts as plain MLPs */
typedef struct ref_case { const nb_nn_moe_cfg *cfg; } ref_case;
static nb_status ref_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const nb_nn_moe_cfg *cfg = ((ref_case *)u)->cfg;
  nb_tree *p = nb_tree_select_prefix(in, "params", true);
  nb_nn_apply a = {.g = g, .params = p, .dtype = NB_F64};
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *probs = nb_nn_softmax(nb_nn_linear(&a, "moe/router", x), -1);
  nb_val *y = NULL;
  for (int64_t e = 0; e < cfg->n_experts; e++) {
    char path[64];
    snprintf(path, sizeof path, "e%lld", (long long)e);
    int64_t st[2] = {0, e}, lim[2] = {nb_val_dim(probs, 0), e + 1};
    nb_val *w = nb_slice(probs, st, lim, NULL);
    nb_val *t = nb_mul(w, nb_nn_mlp(&a, path, &cfg->expert, x));
    y = y ? nb_add(y, t) : t;
  }
  nb_tree_destroy(p);
  return nb_tree_set_val(out, "y", y);
}

static void test_dropless_is_dense_mixture(nb_ctx *ctx) {
  nb_nn_moe_cfg cfg = small_moe(3, 3);
  nb_tree *params = moe_params(ctx, &cfg, 1, 0.5);
  nb_test_rng rng = {2};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){5, 4});
  nb_array_retain(x);
  nb_tree *in = with_params(ctx, params, x);
  const char *names[3] = {"wi_0", "wi_1", "wo"};
  for (int e = 0; e < 3; e++)
    for (int n = 0; n < 3; n++) {
      char src[64], dst[64];
      snprintf(src, sizeof src, "moe/experts/%s/kernel", names[n]);
      snprintf(dst, sizeof dst, "params/e%d/%s/kernel", e, names[n]);
      put(in, dst, expert_slice(ctx, nb_tree_get_array(params, src), e));
    }
  nn_case c = {.kind = M_MOE, .cfg = &cfg, .dtype = NB_F64};
  ref_case rc = {&cfg};
  nb_array *y = run_case(ctx, &c, in, NULL);
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_test_eval(ctx, ref_fn, &rc, in, out));
  CHECK_MSG(max_diff(y, nb_tree_get_array(out, "y")) < 1e-13, "dropless vs mixture: %g", max_diff(y, nb_tree_get_array(out, "y")));
  /* capacity for every token: the same */
  cfg.capacity_factor = 100;
  nb_array *yc = run_case(ctx, &c, in, NULL);
  CHECK_MSG(max_diff(y, yc) < 1e-13, "capacity vs dropless: %g", max_diff(y, yc));
  nb_array_release(yc);
  nb_array_release(y);
  nb_array_release(x);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

static void test_top2_capacity(nb_ctx *ctx) {
  nb_nn_moe_cfg cfg = small_moe(4, 2);
  cfg.renormalize = true;
  nb_tree *params = moe_params(ctx, &cfg, 3, 0.8);
  nb_test_rng rng = {4};
  nb_tree *in = with_params(ctx, params, nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[3]){2, 4, 4}));
  nn_case c = {.kind = M_MOE, .cfg = &cfg, .dtype = NB_F64, .aux_out = true};
  nb_tree *o1 = nb_tree_create(ctx);
  nb_array *y = run_case(ctx, &c, in, o1);
  CHECK(y && nb_array_rank(y) == 3);
  cfg.capacity_factor = 4; /* C = ceil(4 * 8 * 2 / 4) = 16 > N: clamped to N, nothing dropped */
  nb_tree *o2 = nb_tree_create(ctx);
  nb_array *yc = run_case(ctx, &c, in, o2);
  CHECK_MSG(max_diff(y, yc) < 1e-13, "top-2 capacity vs dropless: %g", max_diff(y, yc));
  CHECK(nb_array_get(nb_tree_get_array(o2, "dropped"), 0) == 0);
  /* load sums to N * k */
  double total = 0;
  for (int e = 0; e < 4; e++) total += nb_array_get(nb_tree_get_array(o1, "load"), e);
  CHECK(total == 16);
  CHECK(nb_test_check_grads(ctx, "moe top-2 capacity", nn_case_fn, &c, in, 1e-5, false));
  cfg.capacity_factor = 0;
  c.aux_out = false;
  CHECK(nb_test_check_grads(ctx, "moe top-2 dropless", nn_case_fn, &c, in, 1e-5, false));
  nb_array_release(y);
  nb_array_release(yc);
  nb_tree_destroy(o1);
  nb_tree_destroy(o2);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

/* top-1 of 2 experts with capacity 1 per expert: the first token routed to
 * each expert is kept, later ones become zero rows */
static void test_capacity_drops(nb_ctx *ctx) {
  nb_nn_moe_cfg cfg = small_moe(2, 1);
  cfg.capacity_factor = 1.0 / 3; /* C = ceil(6 * 1 / 2 / 3) = 1 */
  nb_tree *params = moe_params(ctx, &cfg, 5, 1.0);
  nb_test_rng rng = {6};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){6, 4});
  nb_array_retain(x);
  nb_tree *in = with_params(ctx, params, x);
  nn_case c = {.kind = M_MOE, .cfg = &cfg, .dtype = NB_F64, .aux_out = true};
  nb_tree *out = nb_tree_create(ctx);
  nb_array *y = run_case(ctx, &c, in, out);
  nb_array *r = nb_tree_get_array(params, "moe/router/kernel");
  bool seen[2] = {false, false};
  int kept = 0;
  for (int n = 0; y && n < 6; n++) {
    double l[2] = {0, 0};
    for (int e = 0; e < 2; e++)
      for (int k = 0; k < 4; k++) l[e] += nb_array_get(x, n * 4 + k) * nb_array_get(r, k * 2 + e);
    int e = l[1] > l[0];
    bool keep = !seen[e];
    seen[e] = true;
    kept += keep;
    double norm = 0;
    for (int j = 0; j < 4; j++) norm += fabs(nb_array_get(y, n * 4 + j));
    CHECK_MSG(keep ? norm > 0 : norm == 0, "token %d (expert %d, %s): |y| = %g", n, e, keep ? "kept" : "dropped", norm);
  }
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "dropped"), 0), 1 - kept / 6.0, 1e-12);
  CHECK(kept < 6);
  nb_array_release(y);
  nb_array_release(x);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

static void test_aux_and_shared(nb_ctx *ctx) {
  nb_nn_moe_cfg cfg = small_moe(4, 2);
  cfg.n_shared = 2;
  cfg.score = NB_NN_SCORE_SIGMOID;
  cfg.renormalize = true;
  cfg.route_scale = 2.5;
  nb_tree *params = moe_params(ctx, &cfg, 7, 0); /* router all zero: uniform scores */
  CHECK(nb_tree_find(params, "moe/shared/wi_0/kernel") >= 0);
  CHECK(nb_array_dims(nb_tree_get_array(params, "moe/shared/wi_0/kernel"))[1] == 6);
  nb_test_rng rng = {8};
  nb_tree *in = with_params(ctx, params, nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){5, 4}));
  nn_case c = {.kind = M_MOE, .cfg = &cfg, .dtype = NB_F64, .aux_out = true};
  nb_tree *out = nb_tree_create(ctx);
  nb_array *y = run_case(ctx, &c, in, out);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "lb"), 0), 1.0, 1e-12);
  double lse = log(4 * exp(0)); /* zero logits */
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "z"), 0), lse * lse, 1e-12);
  /* with the routed experts' outputs zeroed, only the shared MLP remains */
  nb_array *wo = nb_tree_get_array(params, "moe/experts/wo/kernel");
  put(in, "params/moe/experts/wo/kernel", nb_array_zeros(ctx, NB_F64, 3, nb_array_dims(wo)));
  nb_array *ys = run_case(ctx, &c, in, NULL);
  nb_nn_mlp_cfg sh = cfg.expert;
  sh.d_ff *= 2;
  nb_tree *in2 = nb_tree_copy(in);
  nb_tree *out2 = nb_tree_create(ctx);
  nn_case cm = {.kind = M_MLP, .cfg = &sh, .dtype = NB_F64};
  nb_tree *p2 = nb_tree_select_prefix(in, "params/moe/shared", true);
  nb_tree_merge(in2, "params/mlp", p2);
  nb_array *ym = run_case(ctx, &cm, in2, out2);
  CHECK_MSG(max_diff(ys, ym) < 1e-13, "shared only: %g", max_diff(ys, ym));
  CHECK(max_diff(y, ys) > 1e-6);
  /* gradients away from the all-tied router (top-k is not differentiable at ties) */
  put(in, "params/moe/router/kernel", nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){4, 4}));
  put(in, "params/moe/experts/wo/kernel", nb_test_randn(ctx, &rng, NB_F64, 3, nb_array_dims(wo)));
  c.aux_out = false;
  CHECK(nb_test_check_grads(ctx, "moe sigmoid shared", nn_case_fn, &c, in, 1e-5, false));
  /* misuse */
  cfg.top_k = 5;
  CHECK(run_case(ctx, &c, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "need 1 <= top_k (5) <= n_experts (4)");
  nb_array_release(y);
  nb_array_release(ys);
  nb_array_release(ym);
  nb_tree_destroy(p2);
  nb_tree_destroy(in2);
  nb_tree_destroy(out2);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
}

/* expert_axis bound to one process: both all_to_alls are the identity, so
 * the capacity path is the plain one bit for bit, and its gradients go
 * through the exchanges' transposes; dropless and an unbound axis are
 * refused naming what is wrong. */
static void test_expert_axis(nb_ctx *ctx) {
  nb_nn_moe_cfg cfg = small_moe(4, 2);
  cfg.capacity_factor = 1;
  nb_tree *params = moe_params(ctx, &cfg, 5, 0.8);
  nb_test_rng rng = {6};
  nb_tree *in = with_params(ctx, params, nb_test_randn(ctx, &rng, NB_F64, 2, (int64_t[2]){6, 4}));
  nn_case plain = {.kind = M_MOE, .cfg = &cfg, .dtype = NB_F64}, ep = plain;
  ep.expert_axis = "expert";
  nb_array *y = run_case(ctx, &plain, in, NULL);
  CHECK(run_case(ctx, &ep, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "expert axis 'expert' is not bound");
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "expert", nb_comm_self()));
  nb_array *ye = run_case(ctx, &ep, in, NULL);
  CHECK_MSG(max_diff(y, ye) == 0, "one-process expert axis vs none: %g", max_diff(y, ye));
  CHECK(nb_test_check_grads(ctx, "moe expert axis", nn_case_fn, &ep, in, 1e-5, false));
  cfg.capacity_factor = 0;
  CHECK(run_case(ctx, &ep, in, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "expert parallelism needs a capacity factor > 0");
  nb_array_release(y);
  nb_array_release(ye);
  nb_tree_destroy(in);
  nb_tree_destroy(params);
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "expert", NULL));
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_dropless_is_dense_mixture(ctx);
  test_top2_capacity(ctx);
  test_capacity_drops(ctx);
  test_aux_and_shared(ctx);
  test_expert_axis(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("nn/moe");
}
