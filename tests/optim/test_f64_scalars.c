/* f64 parameters get f64 optimizer scalars: schedules traced at an f64
 * step, global norms of f64 trees, RAdam's rectification, MultiSteps'
 * averaging and muon's learning rate, each checked against a double
 * precision reference on the host (Optax's formulas) to ~1e-13, where f32
 * scalars would be ~1e-7 off. */
#include "test.h"

static nb_ctx *ctx;

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-300); }

/* One f64 leaf "w" of n values. */
static nb_tree *leaf(const double *v, int64_t n) {
  nb_tree *t = nb_tree_create(ctx);
  nb_array *a = nb_array_from_f64(ctx, NB_F64, 1, &n, v);
  nb_tree_set_array(t, "w", a);
  nb_array_release(a);
  return t;
}

static void test_schedules(void) {
  nb_optim_schedule *s[] = {
      nb_optim_constant(ctx, 0.1),
      nb_optim_cosine_decay(ctx, 0.3, 1000, 0.1, 1.0),
      nb_optim_warmup_cosine_decay(ctx, 0.0, 0.7, 100, 1000, 0.01, 1.0),
      nb_optim_exponential_decay(ctx, 0.3, 100, 0.9, 10, false, NAN),
      nb_optim_polynomial(ctx, 0.3, 0.01, 2.0, 500, 20),
  };
  const double steps[] = {0, 7, 123, 777};
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *v = nb_optim_schedule_trace(s[i], nb_graph_input(g, "step", nb_aval_make(NB_F64, 0, NULL)));
    CHECK_MSG(v && nb_val_dtype(v) == NB_F64, "schedule %zu: traced at an f64 step as %s", i, v ? nb_dtype_name(nb_val_dtype(v)) : "NULL");
    nb_graph_output(g, "lr", v);
    /* an integer step keeps f32 */
    nb_val *w = nb_optim_schedule_trace(s[i], nb_graph_input(g, "count", nb_aval_make(NB_I32, 0, NULL)));
    CHECK(w && nb_val_dtype(w) == NB_F32);
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
      nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
      nb_array *st = nb_array_scalar(ctx, NB_F64, steps[k]), *ct = nb_array_scalar(ctx, NB_I32, steps[k]);
      nb_tree_set_array(in, "step", st);
      nb_tree_set_array(in, "count", ct);
      nb_array_release(st);
      nb_array_release(ct);
      CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
      nb_array *lr = nb_tree_get_array(out, "lr");
      double want = nb_optim_schedule_eval(s[i], steps[k]);
      CHECK_MSG(lr && rel(nb_array_get(lr, 0), want) <= 1e-13, "schedule %zu at %g: %.17g, want %.17g", i, steps[k],
                lr ? nb_array_get(lr, 0) : NAN, want);
      nb_tree_destroy(in);
      nb_tree_destroy(out);
    }
    nb_graph_destroy(g);
    nb_optim_schedule_destroy(s[i]);
  }
}

static void test_global_norm(void) {
  double v[5] = {0.1, -0.2, 0.3, 1.0 / 3, 1e-3};
  nb_tree *t = leaf(v, 5);
  nb_graph *g = nb_graph_create(ctx);
  nb_tree *vals = nb_tree_create(ctx);
  nb_tree_set_val(vals, "w", nb_graph_input(g, "w", nb_aval_make(NB_F64, 1, (int64_t[]){5})));
  nb_val *n = nb_optim_global_norm(g, vals);
  CHECK(n && nb_val_dtype(n) == NB_F64);
  nb_graph_output(g, "n", n);
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, t, out));
  double want = 0;
  for (int i = 0; i < 5; i++) want += v[i] * v[i];
  want = sqrt(want);
  nb_array *got = nb_tree_get_array(out, "n");
  CHECK_MSG(got && rel(nb_array_get(got, 0), want) <= 1e-15, "global norm %.17g, want %.17g", got ? nb_array_get(got, 0) : NAN, want);
  nb_tree_destroy(out);
  nb_tree_destroy(vals);
  nb_graph_destroy(g);
  nb_tree_destroy(t);
}

/* Runs tx for `steps` steps from params p0 with gradient grads(step) and
 * returns the final w (n values) in out. */
static void run_steps(nb_optim_tx *tx, const double *p0, int64_t n, int steps, void (*grads)(int step, double *g),
                      double *out) {
  nb_tree *params = leaf(p0, n);
  nb_tree *state = nb_optim_init_arrays(ctx, tx, params);
  CHECK_MSG(state != NULL, "init: %s", nb_ctx_error(ctx));
  for (int s = 0; state && s < steps; s++) {
    double gv[8];
    grads(s, gv);
    nb_tree *gt = leaf(gv, n), *np = NULL, *ns = NULL;
    CHECK_OK(ctx, nb_optim_update_arrays(ctx, tx, gt, state, params, &np, &ns));
    nb_tree_destroy(gt);
    if (!np || !ns) break;
    nb_tree_destroy(params);
    nb_tree_destroy(state);
    params = np, state = ns;
  }
  nb_array *w = nb_tree_get_array(params, "w");
  for (int64_t i = 0; i < n; i++) out[i] = w ? nb_array_get(w, i) : NAN;
  nb_tree_destroy(params);
  nb_tree_destroy(state);
}

static void radam_grads(int step, double *g) {
  for (int i = 0; i < 3; i++) g[i] = 0.3 * (i + 1) - 0.05 * step + 0.01 * i * step;
}

/* optax.radam: the first rectified update comes at step 6 with b2 = 0.999 */
static void test_radam(void) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, thr = 5, lr = 0.1, p0[3] = {0.5, -0.25, 1.0 / 3};
  double want[3], mu[3] = {0}, nu[3] = {0}, got[3];
  memcpy(want, p0, sizeof want);
  double ro_inf = 2 / (1 - b2) - 1;
  for (int s = 0; s < 8; s++) {
    double g[3], t = s + 1, b2t = pow(b2, t), ro = ro_inf - 2 * t * b2t / (1 - b2t);
    radam_grads(s, g);
    for (int i = 0; i < 3; i++) {
      mu[i] = (1 - b1) * g[i] + b1 * mu[i];
      nu[i] = (1 - b2) * g[i] * g[i] + b2 * nu[i];
      double mh = mu[i] / (1 - pow(b1, t)), nh = nu[i] / (1 - pow(b2, t)), u = mh;
      if (ro >= thr) u = sqrt((ro - 4) * (ro - 2) * ro_inf / ((ro_inf - 4) * (ro_inf - 2) * ro)) * mh / (sqrt(nh) + eps);
      want[i] -= lr * u;
    }
  }
  nb_optim_tx *tx = nb_optim_radam(ctx, nb_optim_constant(ctx, lr), b1, b2, eps, thr);
  run_steps(tx, p0, 3, 8, radam_grads, got);
  for (int i = 0; i < 3; i++) CHECK_MSG(rel(got[i], want[i]) <= 1e-13, "radam w[%d]: %.17g, want %.17g", i, got[i], want[i]);
  nb_optim_tx_destroy(tx);
}

static void ms_grads(int step, double *g) {
  for (int i = 0; i < 2; i++) g[i] = 1.0 / (3 + step + i) + 0.1 * i;
}

/* optax.MultiSteps(sgd, every_k_schedule=3): the mean of 3 gradients, in f64 */
static void test_multi_steps(void) {
  const double p0[2] = {0.7, -0.3};
  double got[2], want[2];
  nb_optim_tx *tx = nb_optim_multi_steps(ctx, nb_optim_sgd(ctx, nb_optim_constant(ctx, 0.1), 0, false), 3);
  run_steps(tx, p0, 2, 3, ms_grads, got);
  for (int i = 0; i < 2; i++) {
    double mean = 0, g[2];
    for (int s = 0; s < 3; s++) {
      ms_grads(s, g);
      mean += (g[i] - mean) / (s + 1);
    }
    want[i] = p0[i] - 0.1 * mean;
    CHECK_MSG(rel(got[i], want[i]) <= 1e-14, "multi_steps w[%d]: %.17g, want %.17g", i, got[i], want[i]);
  }
  nb_tree *params = leaf(p0, 2), *state = nb_optim_init_arrays(ctx, tx, params);
  nb_array *acc = state ? nb_tree_get_array(state, "acc_grads/w") : NULL;
  CHECK_MSG(acc && nb_array_dtype(acc) == NB_F64, "acc_grads is %s", acc ? nb_dtype_name(nb_array_dtype(acc)) : "missing");
  nb_tree_destroy(params);
  nb_tree_destroy(state);
  nb_optim_tx_destroy(tx);
}

/* muon's learning rate in f64: lr 0.1 moves a matrix exactly 0.1 times as
 * far as lr 1 */
static void test_muon(void) {
  double w0[6] = {0.3, -0.1, 0.2, 0.5, -0.4, 0.05}, g[6] = {0.1, 0.2, -0.3, 0.05, 0.4, -0.2};
  double moved[2][6];
  for (int k = 0; k < 2; k++) {
    nb_optim_tx *tx = nb_optim_muon(ctx, nb_optim_constant(ctx, k ? 0.1 : 1.0), 0.95, 5, 1e-7, 0.9, 0.999, 0);
    int64_t dims[2] = {2, 3};
    nb_tree *params = nb_tree_create(ctx), *grads = nb_tree_create(ctx);
    nb_array *pa = nb_array_from_f64(ctx, NB_F64, 2, dims, w0), *ga = nb_array_from_f64(ctx, NB_F64, 2, dims, g);
    nb_tree_set_array(params, "w", pa);
    nb_tree_set_array(grads, "w", ga);
    nb_array_release(pa);
    nb_array_release(ga);
    nb_tree *state = nb_optim_init_arrays(ctx, tx, params), *np = NULL, *ns = NULL;
    CHECK_OK(ctx, nb_optim_update_arrays(ctx, tx, grads, state, params, &np, &ns));
    nb_array *w = np ? nb_tree_get_array(np, "w") : NULL;
    for (int i = 0; i < 6; i++) moved[k][i] = w ? nb_array_get(w, i) - w0[i] : NAN;
    nb_tree *trees[] = {params, grads, state, np, ns};
    for (int i = 0; i < 5; i++) nb_tree_destroy(trees[i]);
    nb_optim_tx_destroy(tx);
  }
  for (int i = 0; i < 6; i++)
    CHECK_MSG(rel(moved[1][i], 0.1 * moved[0][i]) <= 1e-13, "muon w[%d] moved %.17g, want %.17g", i, moved[1][i], 0.1 * moved[0][i]);
}

int main(void) {
  ctx = nb_ctx_create();
  test_schedules();
  test_global_norm();
  test_radam();
  test_multi_steps();
  test_muon();
  nb_ctx_destroy(ctx);
  return nb_test_summary("optim/test_f64_scalars");
}
