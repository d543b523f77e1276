/* Behaviour of the transformations beyond the Optax goldens: state paths,
 * gradient accumulation equal to one big-batch step, apply_if_finite giving
 * up, injected hyperparameters that follow a schedule or are changed from
 * the host, masks by regex, tree utilities, bad input with clear errors, and
 * allocation failures at every point of init and update. */
#include "primcheck.h"

static nb_array *vec(nb_ctx *ctx, int n, const double *v) {
  int64_t d[1] = {n};
  return nb_array_from_f64(ctx, NB_F32, 1, d, v);
}

static nb_tree *params2(nb_ctx *ctx) { /* w: f32[3], b: f32[2] */
  nb_tree *t = nb_tree_create(ctx);
  nb_array *w = vec(ctx, 3, (double[]){0.5, -1.0, 2.0}), *b = vec(ctx, 2, (double[]){0.1, -0.2});
  nb_tree_set_array(t, "w", w);
  nb_tree_set_array(t, "b", b);
  nb_array_release(w);
  nb_array_release(b);
  return t;
}

static nb_tree *grads2(nb_ctx *ctx, double s) {
  nb_tree *t = nb_tree_create(ctx);
  nb_array *w = vec(ctx, 3, (double[]){0.3 * s, -0.1, 0.7}), *b = vec(ctx, 2, (double[]){-0.4, 0.25 * s});
  nb_tree_set_array(t, "w", w);
  nb_tree_set_array(t, "b", b);
  nb_array_release(w);
  nb_array_release(b);
  return t;
}

/* one step in place: *p and *s replaced */
static nb_status step(nb_ctx *ctx, nb_optim_tx *tx, const nb_tree *g, nb_tree **p, nb_tree **s) {
  nb_tree *np = NULL, *ns = NULL;
  nb_status st = nb_optim_update_arrays(ctx, tx, g, *s, *p, &np, &ns);
  if (st) return st;
  nb_tree_destroy(*p);
  nb_tree_destroy(*s);
  *p = np;
  *s = ns;
  return NB_OK;
}

static nb_optim_schedule *C(nb_ctx *ctx, double v) { return nb_optim_constant(ctx, v); }

static void test_state_paths(nb_ctx *ctx) {
  nb_optim_tx *tx = nb_optim_adamw(ctx, C(ctx, 1e-3), 0.9, 0.999, 1e-8, 0.1, NULL);
  nb_tree *p = params2(ctx), *s = nb_optim_init_arrays(ctx, tx, p);
  const char *want[] = {"0/count", "0/mu/w", "0/mu/b", "0/nu/w", "0/nu/b"};
  CHECK(s && nb_tree_size(s) == 5);
  for (size_t i = 0; s && i < 5; i++) CHECK_MSG(strcmp(nb_tree_path(s, i), want[i]) == 0, "%s", nb_tree_path(s, i));
  CHECK(s && nb_array_dtype(nb_tree_get_array(s, "0/count")) == NB_I32);
  nb_tree *g = grads2(ctx, 1);
  for (int k = 0; k < 3; k++) CHECK_OK(ctx, step(ctx, tx, g, &p, &s));
  CHECK(nb_array_get(nb_tree_get_array(s, "0/count"), 0) == 3);
  nb_tree_destroy(g);
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_optim_tx_destroy(tx);
  /* wrappers nest their inner state */
  tx = nb_optim_multi_steps(ctx, nb_optim_apply_if_finite(ctx, nb_optim_sgd(ctx, C(ctx, 0.1), 0.9, false), 2), 3);
  p = params2(ctx);
  s = nb_optim_init_arrays(ctx, tx, p);
  CHECK(s && nb_tree_get_array(s, "inner/inner/0/trace/w") && nb_tree_get_array(s, "inner/total_notfinite") &&
        nb_tree_get_array(s, "acc_grads/b") && nb_tree_get_array(s, "mini_step"));
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_optim_tx_destroy(tx);
}

/* ---- gradient accumulation == one step on the whole batch -------------------- */

/* loss = mean over the batch of (x . w + b0 - y)^2 with x [n,3], y [n] */
static nb_status lin_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *w = nb_tree_get_val(in, "params/w"), *b = nb_tree_get_val(in, "params/b");
  nb_val *x = nb_tree_get_val(in, "x"), *y = nb_tree_get_val(in, "y");
  nb_val *pred = nb_add(nb_reduce_sum(nb_mul(x, w), 1, (int[]){1}), nb_reduce_sum(b, 0, NULL));
  nb_val *e = nb_sub(pred, y);
  double n = (double)nb_val_dim(e, 0);
  return nb_tree_set_val(out, "loss", nb_div(nb_reduce_sum(nb_mul(e, e), 0, NULL), nb_scalar(g, NB_F32, n)));
}

static nb_tree *batch_grads(nb_ctx *ctx, const nb_tree *p, const double *xv, const double *yv, int n) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", p);
  nb_array *x = nb_array_from_f64(ctx, NB_F32, 2, (int64_t[]){n, 3}, xv), *y = vec(ctx, n, yv);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "y", y);
  nb_graph *g = nb_trace(ctx, lin_loss, NULL, in), *dg = nb_grad(ctx, g, &(nb_grad_opts){.wrt = "params"});
  CHECK_OK(ctx, nb_graph_run(ctx, dg, in, out));
  nb_tree *gr = nb_tree_select_prefix(out, "grad/params", true);
  nb_array_release(x);
  nb_array_release(y);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  nb_graph_destroy(dg);
  return gr;
}

static void test_multi_steps_equivalence(nb_ctx *ctx) {
  enum { K = 4, MB = 2, N = K * MB };
  double xv[N * 3], yv[N];
  nb_test_rng rng = {7};
  for (int i = 0; i < N * 3; i++) xv[i] = nb_test_normal(&rng);
  for (int i = 0; i < N; i++) yv[i] = nb_test_normal(&rng);
  nb_optim_tx *acc = nb_optim_multi_steps(ctx, nb_optim_adam(ctx, C(ctx, 0.05), 0.9, 0.999, 1e-8), K);
  nb_optim_tx *big = nb_optim_adam(ctx, C(ctx, 0.05), 0.9, 0.999, 1e-8);
  nb_tree *pa = params2(ctx), *sa = nb_optim_init_arrays(ctx, acc, pa);
  nb_tree *pb = params2(ctx), *sb = nb_optim_init_arrays(ctx, big, pb);
  for (int outer = 0; outer < 3; outer++) {
    for (int m = 0; m < K; m++) {
      nb_tree *g = batch_grads(ctx, pa, xv + m * MB * 3, yv + m * MB, MB);
      nb_tree *before = nb_tree_copy(pa);
      CHECK_OK(ctx, step(ctx, acc, g, &pa, &sa));
      bool emitted = m == K - 1;
      for (size_t i = 0; i < nb_tree_size(pa); i++) /* zero updates in between */
        CHECK(emitted || nb_array_equal(nb_tree_leaf(pa, i)->array, nb_tree_leaf(before, i)->array));
      CHECK(nb_array_get(nb_tree_get_array(sa, "mini_step"), 0) == (m + 1) % K);
      nb_tree_destroy(g);
      nb_tree_destroy(before);
    }
    nb_tree *g = batch_grads(ctx, pb, xv, yv, N);
    CHECK_OK(ctx, step(ctx, big, g, &pb, &sb));
    nb_tree_destroy(g);
    CHECK(nb_array_get(nb_tree_get_array(sa, "gradient_step"), 0) == outer + 1);
    for (size_t i = 0; i < nb_tree_size(pa); i++)
      for (int64_t j = 0; j < nb_array_size(nb_tree_leaf(pa, i)->array); j++)
        CHECK_NEAR(nb_array_get(nb_tree_leaf(pa, i)->array, j), nb_array_get(nb_tree_get_array(pb, nb_tree_path(pa, i)), j),
                   2e-6);
  }
  nb_tree_destroy(pa);
  nb_tree_destroy(sa);
  nb_tree_destroy(pb);
  nb_tree_destroy(sb);
  nb_optim_tx_destroy(acc);
  nb_optim_tx_destroy(big);
}

/* ---- apply_if_finite gives up after N bad steps in a row ------------------------- */

static void test_apply_if_finite(nb_ctx *ctx) {
  nb_optim_tx *tx = nb_optim_apply_if_finite(ctx, nb_optim_sgd(ctx, C(ctx, 0.1), 0, false), 1);
  nb_tree *p = params2(ctx), *s = nb_optim_init_arrays(ctx, tx, p), *good = grads2(ctx, 1), *bad = grads2(ctx, NAN);
  nb_tree *p0 = nb_tree_copy(p);
  CHECK_OK(ctx, step(ctx, tx, bad, &p, &s)); /* skipped */
  CHECK(nb_array_equal(nb_tree_get_array(p, "w"), nb_tree_get_array(p0, "w")));
  CHECK(nb_array_get(nb_tree_get_array(s, "notfinite_count"), 0) == 1);
  CHECK(nb_array_get(nb_tree_get_array(s, "last_finite"), 0) == 0);
  CHECK_OK(ctx, step(ctx, tx, good, &p, &s)); /* applied, counter reset */
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "w"), 1), -1.0 + 0.01, 1e-6);
  CHECK(nb_array_get(nb_tree_get_array(s, "notfinite_count"), 0) == 0);
  CHECK_OK(ctx, step(ctx, tx, bad, &p, &s));
  CHECK(!isnan(nb_array_get(nb_tree_get_array(p, "w"), 0)));
  CHECK_OK(ctx, step(ctx, tx, bad, &p, &s)); /* second in a row > 1: applied anyway */
  CHECK(isnan(nb_array_get(nb_tree_get_array(p, "w"), 0)));
  CHECK(nb_array_get(nb_tree_get_array(s, "total_notfinite"), 0) == 3);
  nb_tree *all[] = {p, s, good, bad, p0};
  for (int i = 0; i < 5; i++) nb_tree_destroy(all[i]);
  nb_optim_tx_destroy(tx);
}

/* ---- inject_hyperparams ----------------------------------------------------------- */

static nb_optim_tx *make_sgd(nb_ctx *ctx, nb_optim_schedule *const *hp, void *ud) {
  return nb_optim_sgd(ctx, hp[0], 0, false);
}

static void test_inject(nb_ctx *ctx) {
  /* a schedule is evaluated at the count and stored every step */
  nb_optim_tx *tx = nb_optim_inject_hyperparams(ctx, make_sgd, NULL, 1, (const char *[]){"learning_rate"},
                                                (nb_optim_schedule *[]){nb_optim_linear(ctx, 1.0, 0.0, 4, 0)});
  CHECK_MSG(tx, "%s", nb_ctx_error(ctx));
  nb_tree *p = params2(ctx), *s = nb_optim_init_arrays(ctx, tx, p), *g = grads2(ctx, 1);
  double w = 0.5;
  for (int k = 0; k < 5; k++) {
    double lr = k < 4 ? 1.0 - k / 4.0 : 0;
    CHECK_OK(ctx, step(ctx, tx, g, &p, &s));
    w -= lr * 0.3;
    CHECK_NEAR(nb_array_get(nb_tree_get_array(s, "hyperparams/learning_rate"), 0), lr, 1e-7);
    CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "w"), 0), w, 1e-6);
  }
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_optim_tx_destroy(tx);
  /* a constant lives in the state and changes from the host, under a chain */
  tx = nb_optim_chain(ctx, 2, (nb_optim_tx *[]){nb_optim_clip(ctx, 10),
                                               nb_optim_inject_hyperparams(ctx, make_sgd, NULL, 1, (const char *[]){"lr"},
                                                                           (nb_optim_schedule *[]){C(ctx, 0.5)})});
  p = params2(ctx);
  s = nb_optim_init_arrays(ctx, tx, p);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(s, "1/hyperparams/lr"), 0), 0.5, 0);
  CHECK_OK(ctx, nb_optim_state_set_scalar(ctx, s, "1/hyperparams/lr", 2.0));
  CHECK_OK(ctx, step(ctx, tx, g, &p, &s));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "w"), 0), 0.5 - 2.0 * 0.3, 1e-6);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(s, "1/hyperparams/lr"), 0), 2.0, 0);
  CHECK(nb_optim_state_set_scalar(ctx, s, "1/hyperparams/nope", 1) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "1/hyperparams/nope");
  CHECK(nb_optim_state_set_scalar(ctx, s, "1/hyperparams/lr", NAN) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "not finite");
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_tree_destroy(g);
  nb_optim_tx_destroy(tx);
}

/* ---- masks ------------------------------------------------------------------------- */

static void test_masks(nb_ctx *ctx) {
  /* regex mask: only b moves */
  nb_optim_tx *tx = nb_optim_chain(ctx, 2, (nb_optim_tx *[]){nb_optim_masked(ctx, nb_optim_set_to_zero(ctx), "^w$", NULL, NULL),
                                                             nb_optim_sgd(ctx, C(ctx, 1), 0, false)});
  nb_tree *p = params2(ctx), *s = nb_optim_init_arrays(ctx, tx, p), *g = grads2(ctx, 1);
  CHECK_OK(ctx, step(ctx, tx, g, &p, &s));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "w"), 0), 0.5, 0);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "b"), 0), 0.1 + 0.4, 1e-6);
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_optim_tx_destroy(tx);
  /* multi_transform by regex; a leaf no regex matches is an error at init */
  tx = nb_optim_multi_transform_regex(ctx, 2, (nb_optim_tx *[]){nb_optim_sgd(ctx, C(ctx, 1), 0, false), nb_optim_set_to_zero(ctx)},
                                      (const char *[]){"^w", "^c"});
  p = params2(ctx);
  CHECK(nb_optim_init_arrays(ctx, tx, p) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "parameter 'b' has label -1");
  nb_tree_destroy(p);
  nb_tree_destroy(g);
  nb_optim_tx_destroy(tx);
  /* weight decay mask by regex */
  tx = nb_optim_add_decayed_weights(ctx, 0.5, "^b");
  p = params2(ctx);
  s = nb_optim_init_arrays(ctx, tx, p);
  g = grads2(ctx, 0);
  CHECK_OK(ctx, step(ctx, tx, g, &p, &s));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "w"), 0), 0.5, 0);               /* 0.5 + 0 */
  CHECK_NEAR(nb_array_get(nb_tree_get_array(p, "b"), 0), 0.1 - 0.4 + 0.05, 1e-6); /* p + (g + 0.5 p) */
  nb_tree_destroy(p);
  nb_tree_destroy(s);
  nb_tree_destroy(g);
  nb_optim_tx_destroy(tx);
}

/* ---- tree utilities ---------------------------------------------------------------- */

static nb_status tree_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_tree *a = nb_tree_select_prefix(in, "a", true), *b = nb_tree_select_prefix(in, "b", true);
  nb_tree *sum = nb_optim_tree_add(g, a, b), *dif = nb_optim_tree_sub(g, a, b);
  nb_tree *sc = nb_optim_tree_scale(g, a, nb_scalar(g, NB_F64, 3)), *z = nb_optim_tree_zeros_like(g, a);
  nb_status s = nb_tree_set_val(out, "norm", nb_optim_global_norm(g, a));
  if (!s) s = nb_tree_set_val(out, "dot", nb_optim_tree_vdot(g, a, b));
  if (!s) s = nb_tree_merge(out, "sum", sum);
  if (!s) s = nb_tree_merge(out, "dif", dif);
  if (!s) s = nb_tree_merge(out, "sc", sc);
  if (!s) s = nb_tree_merge(out, "z", z);
  nb_tree *all[] = {a, b, sum, dif, sc, z};
  for (int i = 0; i < 6; i++) nb_tree_destroy(all[i]);
  return s;
}

static void test_tree_utils(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *a1 = nb_array_from_f64(ctx, NB_F64, 1, (int64_t[]){2}, (double[]){3, 4});
  nb_array *a2 = nb_array_from_f64(ctx, NB_F64, 0, NULL, (double[]){12});
  nb_array *b1 = nb_array_from_f64(ctx, NB_F64, 1, (int64_t[]){2}, (double[]){1, -1});
  nb_array *b2 = nb_array_from_f64(ctx, NB_F64, 0, NULL, (double[]){0.5});
  nb_tree_set_array(in, "a/x", a1);
  nb_tree_set_array(in, "a/y", a2);
  nb_tree_set_array(in, "b/x", b1);
  nb_tree_set_array(in, "b/y", b2);
  CHECK_OK(ctx, nb_test_eval(ctx, tree_fn, NULL, in, out));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "norm"), 0), 13, 1e-6);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "dot"), 0), 3 - 4 + 6, 1e-6);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "sum/x"), 1), 3, 0);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "dif/y"), 0), 11.5, 0);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "sc/x"), 0), 9, 0);
  CHECK(nb_array_get(nb_tree_get_array(out, "z/y"), 0) == 0 && nb_array_dtype(nb_tree_get_array(out, "z/y")) == NB_F64);
  nb_array *arrs[] = {a1, a2, b1, b2};
  for (int i = 0; i < 4; i++) nb_array_release(arrs[i]);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* ---- bad input ----------------------------------------------------------------------- */

static void test_errors(nb_ctx *ctx) {
  nb_optim_tx *tx = nb_optim_adam(ctx, C(ctx, 1e-3), 0.9, 0.999, 1e-8);
  nb_tree *p = params2(ctx), *s = nb_optim_init_arrays(ctx, tx, p), *np = NULL, *ns = NULL;
  /* grads with another path */
  nb_tree *g = grads2(ctx, 1);
  nb_array *w = nb_tree_get_array(g, "w");
  nb_array_retain(w);
  nb_tree_remove(g, "w");
  nb_tree_set_array(g, "v", w);
  CHECK(nb_optim_update_arrays(ctx, tx, g, s, p, &np, &ns) == NB_ERR_INVALID_ARG && !np && !ns);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "grads and params");
  /* grads with another shape */
  nb_tree_remove(g, "v");
  nb_array *w4 = vec(ctx, 4, (double[]){1, 2, 3, 4});
  nb_tree_set_array(g, "w", w4);
  nb_tree *g2 = grads2(ctx, 1);
  nb_tree_set_array(g2, "w", w4);
  CHECK(nb_optim_update_arrays(ctx, tx, g2, s, p, &np, &ns) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "'w': f32[4] vs f32[3]");
  /* state of another optimizer */
  nb_optim_tx *mom = nb_optim_sgd(ctx, C(ctx, 0.1), 0.9, false);
  nb_tree *g1 = grads2(ctx, 1);
  CHECK(nb_optim_update_arrays(ctx, mom, g1, s, p, &np, &ns) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "lacks '0/trace/w'");
  /* hyperparameters */
  CHECK(nb_optim_adam(ctx, C(ctx, -1e-3), 0.9, 0.999, 1e-8) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "learning rate must be >= 0");
  CHECK(nb_optim_adam(ctx, C(ctx, 1e-3), NAN, 0.999, 1e-8) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "b1 must be in [0, 1)");
  CHECK(nb_optim_adamw(ctx, C(ctx, 1e-3), 0.9, 0.999, 1e-8, -0.1, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "weight_decay must be >= 0");
  CHECK(nb_optim_constant(ctx, NAN) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "must be finite");
  CHECK(nb_optim_sgd(ctx, nb_optim_constant(ctx, INFINITY), 0, false) == NULL); /* inner error kept */
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "constant schedule: value must be finite");
  CHECK(nb_optim_cosine_decay(ctx, 1, 0, 0, 1) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "decay_steps must be > 0");
  CHECK(nb_optim_linear(ctx, 1, 0, -5, 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "transition_steps must be >= 0");
  CHECK(nb_optim_clip_by_global_norm(ctx, 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "max_norm must be > 0");
  CHECK(nb_optim_multi_steps(ctx, nb_optim_identity(ctx), 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "every_k");
  /* an empty chain, a NULL member */
  CHECK(nb_optim_chain(ctx, 0, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "chain: needs at least one transformation");
  CHECK(nb_optim_chain(ctx, 2, (nb_optim_tx *[]){nb_optim_identity(ctx), NULL}) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "NULL");
  CHECK(nb_optim_masked(ctx, nb_optim_identity(ctx), "(", NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "bad regex");
  CHECK(nb_optim_join_schedules(ctx, 2, (nb_optim_schedule *[]){C(ctx, 1), C(ctx, 2)}, (int64_t[]){-3}) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "boundaries");
  /* params needed but not given (traced entry point) */
  nb_optim_tx *wd = nb_optim_add_decayed_weights(ctx, 0.1, NULL);
  nb_graph *gr = nb_graph_create(ctx);
  nb_tree *gt = nb_tree_create(ctx), *u = nb_tree_create(ctx), *st = nb_tree_create(ctx), *nst = nb_tree_create(ctx);
  nb_tree_set_val(gt, "w", nb_graph_input(gr, "w", nb_aval_make(NB_F32, 1, (int64_t[]){3})));
  CHECK(nb_optim_update(wd, gr, gt, st, NULL, u, nst) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "add_decayed_weights: needs params");
  /* integer gradients */
  nb_tree_set_val(gt, "w", nb_graph_input(gr, "wi", nb_aval_make(NB_I32, 1, (int64_t[]){3})));
  CHECK(nb_optim_update(tx, gr, gt, st, NULL, u, nst) == NB_ERR_DTYPE);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "not a float");
  nb_tree *all[] = {p, s, g, g1, g2, gt, u, st, nst};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) nb_tree_destroy(all[i]);
  nb_array_release(w);
  nb_array_release(w4);
  nb_graph_destroy(gr);
  nb_optim_tx_destroy(tx);
  nb_optim_tx_destroy(mom);
  nb_optim_tx_destroy(wd);
}

/* ---- allocation failures ----------------------------------------------------------- */

static nb_optim_tx *make_big(nb_ctx *ctx) {
  return nb_optim_chain(ctx, 2, (nb_optim_tx *[]){
      nb_optim_clip_by_global_norm(ctx, 1),
      nb_optim_multi_steps(ctx, nb_optim_adamw(ctx, nb_optim_warmup_cosine_decay(ctx, 0, 1e-3, 2, 10, 0, 1), 0.9, 0.99,
                                               1e-8, 0.1, "^w"), 2)});
}

static void test_alloc_failures(nb_ctx *ctx) {
  nb_tree *p = params2(ctx), *g = grads2(ctx, 1);
  int n;
  for (n = 1; n < 100000; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_optim_tx *tx = make_big(ctx);
    nb_tree *s = tx ? nb_optim_init_arrays(ctx, tx, p) : NULL, *np = NULL, *ns = NULL;
    nb_status st = s ? nb_optim_update_arrays(ctx, tx, g, s, p, &np, &ns) : NB_ERR_NOMEM;
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_tree_destroy(s);
    nb_tree_destroy(np);
    nb_tree_destroy(ns);
    nb_optim_tx_destroy(tx);
    nb_ctx_clear_error(ctx);
    if (st == NB_OK) break;
  }
  CHECK(n > 10 && n < 100000);
  nb_tree_destroy(p);
  nb_tree_destroy(g);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_state_paths(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_state_paths leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_multi_steps_equivalence(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_multi_steps_equivalence leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_apply_if_finite(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_apply_if_finite leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_inject(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_inject leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_masks(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_masks leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_tree_utils(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_tree_utils leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  test_errors(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "test_errors leaks %zu bytes", nb_ctx_bytes_in_use(ctx));
  size_t before = nb_ctx_bytes_in_use(ctx);
  test_alloc_failures(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == before);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("optim/test_optim");
}
