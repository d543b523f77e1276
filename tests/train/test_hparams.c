/* Hyper-parameters that do not change shapes are inputs of the compiled
 * step, not constants: an input-bound schedule gives bit for bit the values
 * of the constant one (interpreter and jit, every schedule kind), and two
 * runs that differ only in optim.lr, steps, warmup, min_lr_ratio or the
 * seed trace the same step graph: one compile, one disk cache entry. So do
 * the optimizer's own numbers (b1, b2, eps, weight_decay, grad_clip,
 * momentum, a constant lr): input-bound, the trainer's optimizers give bit
 * for bit the updates of their constants. */
#include <signal.h>

#include "jitcheck.h"
#include "train_util.h"

static nb_ctx *ctx;

enum { NS = 10, N = 12 };
static const float steps[N] = {0, 1, 2, 3, 5, 7, 10, 13, 20, 26, 33, 45};

typedef struct sched_job {
  nb_optim_schedule *const *s;
  nb_val **cells; /* NULL: the constant form */
} sched_job;

/* lr/<k>: schedule k at each step of "steps" (f32 [N]) */
static nb_status f_sched(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sched_job *j = u;
  nb_val *st = nb_tree_get_val(in, "steps");
  nb_status s = NB_OK;
  for (int k = 0; k < NS && !s; k++) {
    char path[32];
    snprintf(path, sizeof path, "hparams/%d", k);
    if (j->cells) j->cells[k] = nb_tree_get_val(in, path);
    nb_val *acc = NULL;
    for (int64_t i = 0; i < N; i++) {
      int64_t lo[1] = {i}, hi[1] = {i + 1}, one[1] = {1};
      nb_val *t = nb_reshape(nb_slice(st, lo, hi, NULL), 0, NULL);
      nb_val *v = nb_reshape(nb_optim_schedule_trace(j->s[k], t), 1, one), *pair[2] = {acc, v};
      acc = acc ? nb_concatenate(2, pair, 0) : v;
    }
    snprintf(path, sizeof path, "lr/%d", k);
    s = nb_tree_set_val(out, path, acc);
  }
  return s;
}

/* Every schedule kind at steps before, inside and after its phases,
 * constant and input-bound, interpreted and compiled: all four ways give
 * the same bits. */
static void test_schedules(void) {
  nb_optim_sgdr_cycle cyc[2] = {{0, 1e-3, 1e-5, 3, 12}, {1e-5, 5e-4, 0, 2, 20}};
  nb_optim_schedule *plain[NS] = {
      nb_optim_constant(ctx, 3e-4),
      nb_optim_linear(ctx, 1e-3, 1e-5, 25, 3),
      nb_optim_polynomial(ctx, 1e-2, 1e-4, 2.5, 30, 2),
      nb_optim_exponential_decay(ctx, 0.1, 7, 0.7, 3, true, 0.01),
      nb_optim_cosine_decay(ctx, 6e-4, 30, 0.1, 1.5),
      nb_optim_warmup_cosine_decay(ctx, 0, 3e-3, 5, 33, 1e-4, 1),
      nb_optim_piecewise_constant(ctx, 0.5, 3, (int64_t[]){4, 10, 20}, (double[]){0.5, 0.1, 2}),
      nb_optim_linear_onecycle(ctx, 30, 0.01, 0.3, 0.85, 25, 1e4),
      nb_optim_cosine_onecycle(ctx, 30, 0.01, 0.25, 25, 1e4),
      nb_optim_sgdr(ctx, 2, cyc),
  };
  nb_val *cells[NS] = {0};
  nb_optim_schedule *bound[NS];
  int64_t n = N;
  nb_tree *in = nb_tree_create(ctx), *spec_c = nb_tree_create(ctx);
  nb_array *st = nb_array_create(ctx, NB_F32, 1, &n, steps);
  nb_tree_set_array(in, "steps", st);
  nb_tree_set_array(spec_c, "steps", st);
  nb_array_release(st);
  for (int k = 0; k < NS; k++) {
    CHECK_MSG(plain[k] != NULL, "schedule %d: %s", k, nb_ctx_error(ctx));
    bound[k] = nb_optim_schedule_from_input(ctx, plain[k], &cells[k]); /* takes plain[k] */
    nb_array *hp = bound[k] ? nb_optim_schedule_inputs(ctx, bound[k]) : NULL;
    char path[32];
    snprintf(path, sizeof path, "hparams/%d", k);
    CHECK(hp && nb_tree_set_array(in, path, hp) == NB_OK);
    nb_array_release(hp);
  }
  sched_job jc = {bound, NULL}, jb = {bound, cells};
  nb_graph *gc = nb_trace(ctx, f_sched, &jc, spec_c), *gb = nb_trace(ctx, f_sched, &jb, in);
  CHECK_MSG(gc && gb, "%s", nb_ctx_error(ctx));
  nb_tree *res[4] = {0};
  for (int w = 0; gc && gb && w < 4; w++) {
    const nb_graph *g = w & 1 ? gb : gc;
    res[w] = nb_tree_create(ctx);
    if (w < 2) {
      CHECK_OK(ctx, nb_graph_run(ctx, g, in, res[w]));
    } else {
      nb_jit_opts o = nb_test_jit_opts(NULL);
      nb_exe *e = nb_jit(ctx, g, &o);
      CHECK_OK(ctx, e ? nb_exe_run(e, in, res[w]) : nb_ctx_status(ctx));
      nb_exe_destroy(e);
    }
  }
  for (int k = 0; res[3] && k < NS; k++) {
    char path[32];
    snprintf(path, sizeof path, "lr/%d", k);
    nb_array *want = nb_tree_get_array(res[0], path);
    for (int w = 1; w < 4; w++) {
      nb_array *got = nb_tree_get_array(res[w], path);
      CHECK_MSG(want && got && !memcmp(nb_array_data(want), nb_array_data(got), sizeof(float) * N),
                "schedule %d: way %d (%s, %s) differs from the constant schedule", k, w, w & 1 ? "bound" : "constant",
                w < 2 ? "interpreter" : "jit");
    }
    const float *v = want ? nb_array_data(want) : NULL;
    for (int i = 0; v && i < N; i++)
      CHECK_MSG(fabs(v[i] - nb_optim_schedule_eval(bound[k], steps[i])) <= 1e-5 * (1 + fabs(v[i])), "schedule %d, step %g", k,
                steps[i]);
  }
  for (int w = 0; w < 4; w++) nb_tree_destroy(res[w]);
  nb_graph_destroy(gc);
  nb_graph_destroy(gb);
  nb_tree_destroy(in);
  nb_tree_destroy(spec_c);
  for (int k = 0; k < NS; k++) nb_optim_schedule_destroy(bound[k]);
}

/* A vector of the wrong length is an error that says what is expected. */
static nb_status f_one(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  sched_job *j = u;
  j->cells[0] = nb_tree_get_val(in, "hparams");
  return nb_tree_set_val(out, "lr", nb_optim_schedule_trace(j->s[0], nb_tree_get_val(in, "step")));
}

static void test_wrong_length(void) {
  nb_val *cell = NULL;
  nb_optim_schedule *b = nb_optim_schedule_from_input(ctx, nb_optim_linear(ctx, 1, 0, 10, 0), &cell);
  nb_tree *spec = nb_tree_create(ctx);
  int64_t three = 3;
  nb_tree_set(spec, "step", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  nb_tree_set(spec, "hparams", nb_leaf_aval(nb_aval_make(NB_F32, 1, &three)));
  sched_job j = {&b, &cell};
  nb_graph *g = nb_trace(ctx, f_one, &j, spec);
  CHECK_MSG(!g && strstr(nb_ctx_error(ctx), "nb_optim_schedule_inputs"), "%s", nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_optim_schedule_destroy(b);
}

/* ---- the optimizer's own numbers ------------------------------------------ */

enum { NO = 6, NSTEP = 3 };

typedef struct opt_job {
  nb_optim_tx *const *tx;
  nb_val **cells; /* NULL: the constant form */
} opt_job;

/* <k>/params and <k>/state after one update of optimizer k by <k>/grads */
static nb_status f_opt(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const opt_job *j = u;
  nb_ctx *c = nb_graph_ctx(g);
  nb_status s = NB_OK;
  for (int k = 0; k < NO && !s; k++) {
    char pre[32];
    snprintf(pre, sizeof pre, "%d/hparams", k);
    if (j->cells) j->cells[k] = nb_tree_get_val(in, pre);
    snprintf(pre, sizeof pre, "%d", k);
    nb_tree *mine = nb_tree_select_prefix(in, pre, true);
    nb_tree *p = nb_tree_select_prefix(mine, "params", true), *st = nb_tree_select_prefix(mine, "state", true);
    nb_tree *gr = nb_tree_select_prefix(mine, "grads", true);
    nb_tree *upd = nb_tree_create(c), *ns = nb_tree_create(c), *np = nb_tree_create(c), *res = nb_tree_create(c);
    s = nb_optim_update(j->tx[k], g, gr, st, p, upd, ns);
    if (!s) s = nb_optim_apply_updates(g, p, upd, np);
    if (!s) s = nb_tree_merge(res, "params", np);
    if (!s) s = nb_tree_merge(res, "state", ns);
    if (!s) s = nb_tree_merge(out, pre, res);
    nb_tree *all[] = {mine, p, st, gr, upd, ns, np, res};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) nb_tree_destroy(all[i]);
  }
  return s;
}

/* Deterministic values in [-scale, scale) */
static nb_array *filled(nb_dtype t, int rank, const int64_t *dims, uint64_t seed, double scale) {
  double v[64];
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = scale * ((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
  }
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  for (int64_t i = 0; a && i < n; i++) {
    if (t == NB_F64) ((double *)nb_array_data_mut(a))[i] = v[i];
    else ((float *)nb_array_data_mut(a))[i] = (float)v[i];
  }
  return a;
}

/* A kernel and an embedding (decayed), a bias (not), one leaf f64. */
static nb_tree *leaves(uint64_t seed, double scale) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t kd[2] = {4, 6}, bd[1] = {6}, ed[2] = {5, 3};
  nb_array *a[3] = {filled(NB_F32, 2, kd, seed, scale), filled(NB_F32, 1, bd, seed + 1, scale),
                    filled(NB_F64, 2, ed, seed + 2, scale)};
  const char *path[3] = {"w/kernel", "w/bias", "tok/embedding"};
  for (int i = 0; i < 3; i++) {
    CHECK(a[i] && nb_tree_set_array(t, path[i], a[i]) == NB_OK);
    nb_array_release(a[i]);
  }
  return t;
}

/* Step t's gradients of every optimizer, growing with t (so clipping acts) */
static void set_grads(nb_tree *cur, int t) {
  for (int k = 0; k < NO; k++) {
    char pre[32];
    snprintf(pre, sizeof pre, "%d/grads", k);
    nb_tree *gr = leaves(1000 + 10 * (uint64_t)t + (uint64_t)k, 0.5 + t);
    CHECK_OK(ctx, nb_tree_merge(cur, pre, gr));
    nb_tree_destroy(gr);
  }
}

/* The trainer's optimizers (b1, b2, eps, weight_decay, grad_clip, momentum,
 * a constant lr) and nesterov's forms, input-bound: NSTEP updates give the
 * same bits as their constants, interpreted and compiled. The numbers are
 * ones whose 1 - b rounds differently in f32 than in f64. */
static void test_optimizers(void) {
  const char *a0[] = {"optim.b1=0.9", "optim.b2=0.95", "optim.eps=1e-7", "optim.weight_decay=0.1",
                      "optim.grad_clip=0.7"};
  const char *a1[] = {"optim.name=adam", "optim.b1=0.8", "optim.b2=0.99", "optim.weight_decay=0.03",
                      "optim.grad_clip=1.3"};
  const char *a2[] = {"optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01", "optim.lr=0.1"};
  const char *a3[] = {"schedule.kind=constant", "schedule.warmup_steps=0", "optim.lr=3e-3", "optim.b1=0.7"};
  const char *const *args[4] = {a0, a1, a2, a3};
  int nargs[4] = {5, 5, 4, 4};
  nb_optim_tx *tx[NO];
  for (int k = 0; k < 4; k++) {
    nb_train_config c;
    CHECK_OK(ctx, tiny_config(ctx, "/nonexistent", nargs[k], args[k], &c));
    tx[k] = nb_train_optimizer(ctx, &c);
  }
  tx[4] = nb_optim_nadamw(ctx, nb_optim_linear(ctx, 1e-2, 1e-3, 5, 0), 0.9, 0.999, 1e-6, 0.05, "kernel$");
  tx[5] = nb_optim_sgd(ctx, nb_optim_constant(ctx, 0.3), 0.6, true);
  nb_val *cells[NO] = {0};
  nb_tree *in = nb_tree_create(ctx);
  for (int k = 0; k < NO; k++) {
    CHECK_MSG(tx[k] != NULL, "optimizer %d: %s", k, nb_ctx_error(ctx));
    tx[k] = nb_optim_tx_from_input(ctx, tx[k], &cells[k]);
    nb_array *hp = tx[k] ? nb_optim_tx_inputs(ctx, tx[k]) : NULL;
    CHECK(hp && nb_array_size(hp) > 0);
    nb_tree *p = leaves(10 * (uint64_t)k, 1), *st = p && tx[k] ? nb_optim_init_arrays(ctx, tx[k], p) : NULL;
    char pre[32];
    snprintf(pre, sizeof pre, "%d/params", k);
    CHECK_OK(ctx, nb_tree_merge(in, pre, p));
    snprintf(pre, sizeof pre, "%d/state", k);
    CHECK_OK(ctx, st ? nb_tree_merge(in, pre, st) : nb_ctx_status(ctx));
    snprintf(pre, sizeof pre, "%d/hparams", k);
    CHECK_OK(ctx, nb_tree_set_array(in, pre, hp));
    nb_array_release(hp);
    nb_tree_destroy(p);
    nb_tree_destroy(st);
  }
  nb_tree *res[4] = {0};
  for (int w = 0; w < 4; w++) { /* constant, bound; interpreter, jit */
    opt_job j = {tx, w & 1 ? cells : NULL};
    for (int k = 0; k < NO; k++) cells[k] = NULL;
    nb_tree *cur = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_tree_merge(cur, "", in));
    set_grads(cur, 0);
    nb_graph *g = nb_trace(ctx, f_opt, &j, cur);
    CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
    nb_exe *e = NULL;
    if (g && w >= 2) {
      nb_jit_opts o = nb_test_jit_opts(NULL);
      e = nb_jit(ctx, g, &o);
      CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
    }
    for (int t = 0; g && (w < 2 || e) && t < NSTEP; t++) {
      set_grads(cur, t);
      nb_tree *out = nb_tree_create(ctx);
      CHECK_OK(ctx, e ? nb_exe_run(e, cur, out) : nb_graph_run(ctx, g, cur, out));
      CHECK_OK(ctx, nb_tree_merge(cur, "", out)); /* the new params and state replace the old */
      nb_tree_destroy(res[w]);
      res[w] = out;
    }
    nb_exe_destroy(e);
    nb_graph_destroy(g);
    nb_tree_destroy(cur);
  }
  for (size_t i = 0; res[0] && i < nb_tree_size(res[0]); i++) {
    const char *p = nb_tree_path(res[0], i);
    const nb_array *want = nb_tree_leaf(res[0], i)->array;
    for (int w = 1; w < 4; w++) {
      nb_array *got = res[w] ? nb_tree_get_array(res[w], p) : NULL;
      CHECK_MSG(got && nb_array_nbytes(got) == nb_array_nbytes(want) &&
                    !memcmp(nb_array_data(got), nb_array_data(want), nb_array_nbytes(want)),
                "optimizer %s after %d steps: way %d (%s, %s) differs from the constants", p, NSTEP, w,
                w & 1 ? "bound" : "constant", w < 2 ? "interpreter" : "jit");
    }
  }
  for (int w = 0; w < 4; w++) nb_tree_destroy(res[w]);
  nb_tree_destroy(in);
  for (int k = 0; k < NO; k++) nb_optim_tx_destroy(tx[k]);
}

/* A vector of the wrong length is an error that says what is expected. */
static nb_status f_opt_one(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const opt_job *j = u;
  j->cells[0] = nb_tree_get_val(in, "hparams");
  nb_tree *p = nb_tree_select_prefix(in, "params", true), *gr = nb_tree_select_prefix(in, "grads", true);
  nb_tree *st = nb_tree_create(nb_graph_ctx(g)), *ns = nb_tree_create(nb_graph_ctx(g));
  nb_status s = nb_optim_update(j->tx[0], g, gr, st, p, out, ns);
  nb_tree_destroy(p);
  nb_tree_destroy(gr);
  nb_tree_destroy(st);
  nb_tree_destroy(ns);
  return s;
}

static void test_optim_wrong_length(void) {
  nb_val *cell = NULL;
  nb_optim_tx *tx = nb_optim_tx_from_input(ctx, nb_optim_clip_by_global_norm(ctx, 1), &cell);
  nb_array *hp = nb_optim_tx_inputs(ctx, tx);
  CHECK(hp && nb_array_size(hp) == 1 && nb_array_get(hp, 0) == 1);
  nb_array_release(hp);
  nb_tree *spec = nb_tree_create(ctx);
  int64_t three = 3;
  nb_tree_set(spec, "params/w", nb_leaf_aval(nb_aval_make(NB_F32, 1, &three)));
  nb_tree_set(spec, "grads/w", nb_leaf_aval(nb_aval_make(NB_F32, 1, &three)));
  nb_tree_set(spec, "hparams", nb_leaf_aval(nb_aval_make(NB_F64, 1, &three)));
  opt_job j = {&tx, &cell};
  nb_graph *g = nb_trace(ctx, f_opt_one, &j, spec);
  CHECK_MSG(!g && strstr(nb_ctx_error(ctx), "nb_optim_tx_inputs"), "%s", nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_optim_tx_destroy(tx);
}

/* The step graphs of two configs. With `cache`, both are compiled into it
 * (emptied first), and the number of its entries after both is returned. */
static size_t step_graphs(const char *const *e0, int n0, const char *const *e1, int n1, const char *cache, bool *same) {
  nb_train_config c0, c1;
  CHECK_OK(ctx, tiny_config(ctx, "/nonexistent", n0, e0, &c0));
  CHECK_OK(ctx, tiny_config(ctx, "/nonexistent", n1, e1, &c1));
  nb_optim_tx *tx = nb_train_optimizer(ctx, &c0);
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &c0.model, key), *opt = tx && params ? nb_optim_init_arrays(ctx, tx, params) : NULL;
  nb_array_release(key);
  nb_graph *g0 = opt ? nb_train_trace_step(ctx, &c0, params, opt) : NULL;
  nb_graph *g1 = opt ? nb_train_trace_step(ctx, &c1, params, opt) : NULL;
  CHECK_MSG(g0 && g1, "%s", nb_ctx_error(ctx));
  *same = g0 && g1 && nb_graph_hash(g0) == nb_graph_hash(g1);
  nb_jit_cache_info info = {0};
  if (cache && g0 && g1) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    CHECK(system(cmd) == 0);
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.cache_dir = cache;
    for (int k = 0; k < 2; k++) {
      nb_exe *e = nb_jit(ctx, k ? g1 : g0, &o);
      CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
      nb_exe_destroy(e); /* gone from memory: the second one is up to the disk cache */
    }
    CHECK_OK(ctx, nb_jit_cache_stat(ctx, cache, &info));
  }
  nb_graph_destroy(g0);
  nb_graph_destroy(g1);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  nb_optim_tx_destroy(tx);
  return info.entries;
}

static void test_step_shared(void) {
  const char *b = getenv("NABLA_BUILD_DIR");
  char cache[1000];
  snprintf(cache, sizeof cache, "%s/jit-cache-hparams", b && *b ? b : "/tmp/nabla-test");
  bool same = false;
  const char *e0[] = {"steps=8", "optim.lr=3e-3"};
  const char *e1[] = {"steps=50", "optim.lr=1e-4", "schedule.warmup_steps=7", "schedule.min_lr_ratio=0.2"};
  size_t n = step_graphs(e0, 2, e1, 4, cache, &same);
  CHECK_MSG(same && n == 1, "runs that differ in lr and steps: same graph %d, %zu compiled steps (want 1)", same, n);
  /* the optimizer's own numbers (defaults: b1 0.9, b2 0.95, eps 1e-8, weight_decay 0.1, grad_clip 1) */
  const char *o1[] = {"optim.b1=0.8", "optim.b2=0.99", "optim.eps=1e-6", "optim.weight_decay=0.02",
                      "optim.grad_clip=0.5"};
  n = step_graphs(e0, 2, o1, 5, cache, &same);
  CHECK_MSG(same && n == 1, "runs that differ in b1, b2, eps, weight_decay, grad_clip: same graph %d, "
                            "%zu compiled steps (want 1)", same, n);
  const char *l0[] = {"schedule.kind=linear", "steps=8", "optim.lr=3e-3", "optim.name=sgd"};
  const char *l1[] = {"schedule.kind=linear", "steps=80", "optim.lr=1e-3", "optim.name=sgd", "schedule.decay_steps=30",
                      "optim.momentum=0.5", "optim.weight_decay=0.3"};
  step_graphs(l0, 4, l1, 7, NULL, &same);
  CHECK_MSG(same, "linear schedules, sgd: the lr, the lengths, momentum or weight decay change the graph");
  const char *a0[] = {"optim.name=adam", "optim.weight_decay=0.1"};
  const char *a1[] = {"optim.name=adam", "optim.weight_decay=0.01", "optim.b1=0.7", "optim.eps=1e-5"};
  step_graphs(a0, 2, a1, 4, NULL, &same);
  CHECK_MSG(same, "adam: weight decay, b1 or eps change the graph");
  const char *d0[] = {"model.dropout=0.1", "seed=1"};
  const char *d1[] = {"model.dropout=0.1", "seed=7"};
  step_graphs(d0, 2, d1, 2, NULL, &same);
  CHECK_MSG(same, "dropout: the seed changes the graph");
  /* a constant schedule folds lr into a scale, whose factor is an input too */
  const char *k0[] = {"schedule.kind=constant", "schedule.warmup_steps=0", "steps=9"};
  const char *k1[] = {"schedule.kind=constant", "schedule.warmup_steps=0", "steps=90", "optim.lr=1e-2"};
  step_graphs(k0, 3, k1, 4, NULL, &same);
  CHECK_MSG(same, "constant schedules: steps or the lr change the graph");
  /* and a change of shape is another program */
  const char *s1[] = {"steps=8", "optim.lr=3e-3", "batch_size=8"};
  step_graphs(e0, 2, s1, 3, NULL, &same);
  CHECK(!same);
}

int main(void) {
  ctx = nb_ctx_create();
  test_schedules();
  test_wrong_length();
  test_optimizers();
  test_optim_wrong_length();
  test_step_shared();
  nb_ctx_destroy(ctx);
  return nb_test_summary("train/test_hparams");
}
