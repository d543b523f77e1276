/* In-place optimizer updates through nb_jit: an AdamW step over a small
 * tree with params and state donated runs in place (the outputs are the
 * inputs' memory), matches the interpreter over several steps fed back as
 * the trainer does, keeps no temporaries beyond scalars, computes the
 * scalar bias corrections once in their own kernel (not per element), and
 * marks the aliasing element loops with ivdep so that they vectorize. */
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {777};

static void add(nb_tree *t, const char *path, int rank, const int64_t *dims) {
  nb_array *a = nb_test_randn(ctx, &rng, NB_F32, rank, dims);
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

static bool file_has(const char *path, const char *needle) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return false;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strstr(buf, needle) != NULL;
}

/* copies every leaf of t (fresh arrays, held once) */
static nb_tree *deep_copy(const nb_tree *t) {
  nb_tree *c = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(t); i++) {
    nb_array *a = nb_tree_leaf(t, i)->array, *b = nb_array_empty(ctx, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a));
    memcpy(nb_array_data_mut(b), nb_array_data(a), (size_t)nb_array_size(a) * nb_dtype_size(nb_array_dtype(a)));
    nb_tree_set_array(c, nb_tree_path(t, i), b);
    nb_array_release(b);
  }
  return c;
}

/* The inputs of a jit run that donates params and state (copies: the run
 * takes their memory) and of the interpreter run beside it (the originals),
 * both with `extra` merged under `extra_at` (NULL: at the root). */
static void paired_inputs(const nb_tree *params, const nb_tree *state, const char *extra_at, const nb_tree *extra, nb_tree **jin,
                          nb_tree **ref) {
  *jin = nb_tree_create(ctx), *ref = nb_tree_create(ctx);
  nb_tree *pc = deep_copy(params), *sc = deep_copy(state);
  nb_tree_merge(*jin, "params", pc);
  nb_tree_merge(*jin, "state", sc);
  nb_tree_merge(*jin, extra_at, extra);
  nb_tree_destroy(pc);
  nb_tree_destroy(sc);
  nb_tree_merge(*ref, "params", params);
  nb_tree_merge(*ref, "state", state);
  nb_tree_merge(*ref, extra_at, extra);
}

static void test_adamw_in_place(const char *disable) {
  nb_tree *params = nb_tree_create(ctx), *grads = nb_tree_create(ctx);
  add(params, "w", 2, (int64_t[]){33, 17});
  add(params, "b", 1, (int64_t[]){17});
  add(params, "e", 2, (int64_t[]){5, 33});
  add(grads, "w", 2, (int64_t[]){33, 17});
  add(grads, "b", 1, (int64_t[]){17});
  add(grads, "e", 2, (int64_t[]){5, 33});
  nb_optim_tx *tx = nb_optim_adamw(ctx, nb_optim_constant(ctx, 1e-2), 0.9, 0.95, 1e-8, 0.1, NULL);
  nb_tree *state = nb_optim_init_arrays(ctx, tx, params);
  nb_graph *g = nb_optim_step_graph(ctx, tx, params, state);
  CHECK_MSG(g != NULL, "step graph: %s", nb_ctx_error(ctx));
  if (!g) return;
  static const char *const donate[] = {"params", "state", NULL};
  nb_jit_opts o = nb_test_jit_opts(disable);
  o.donate = donate;
  nb_exe *e = nb_jit(ctx, g, &o);
  CHECK_MSG(e != NULL, "nb_jit: %s", nb_ctx_error(ctx));
  if (!e) return;
  nb_exe_stats s;
  nb_exe_get_stats(e, &s);
  /* the plan is checked only with every optimization on ($NABLA_JIT_DISABLE adds to disable) */
  const char *env = getenv("NABLA_JIT_DISABLE");
  bool env_off = env && *env, on = disable == NULL && !env_off;
  if (on) {
    /* one kernel for the scalars (count, then the bias corrections), then per
     * leaf shape one that writes the new moments and the parameter update
     * from them (the update joins the moments' kernel and uses their values
     * in registers: neither recomputed from the overwritten old moments nor
     * read back) */
    CHECK_MSG(s.nkernels == 4 && s.neval == 0, "%zu kernels, %zu evals", s.nkernels, s.neval);
    CHECK_MSG(s.arena_bytes <= 256, "arena %zu bytes: a temporary beyond the scalars", s.arena_bytes);
    /* "#pragma GCC ivdep" or a macro around "GCC ivdep" */
    CHECK_MSG(file_has(nb_exe_source_path(e), "GCC ivdep"), "no ivdep in %s", nb_exe_source_path(e));
  }
  /* jit state (held once, donated) and interpreter state step side by side */
  nb_tree *jin, *ref;
  paired_inputs(params, state, "grads", grads, &jin, &ref);
  for (int step = 0; step < 3; step++) {
    const void *before = nb_array_data(nb_tree_get_array(jin, "params/w"));
    nb_tree *got = nb_tree_create(ctx), *want = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_exe_run(e, jin, got));
    CHECK_OK(ctx, nb_graph_run(ctx, g, ref, want));
    bool donates = !env_off && (!disable || !strcmp(disable, "fuse")); /* "all" turns donation off */
    CHECK_MSG(nb_array_data(nb_tree_get_array(got, "params/w")) == before || !donates, "step %d (%s): params/w not updated in place", step,
              disable ? disable : "on");
    for (size_t i = 0; i < nb_tree_size(want); i++) {
      const char *p = nb_tree_path(want, i);
      nb_array *a = nb_tree_get_array(got, p), *b = nb_tree_leaf(want, i)->array;
      double d = a ? nb_test_max_rel_diff(a, b) : INFINITY;
      CHECK_MSG(d <= 2e-5, "step %d (%s): %s differs by %g", step, disable ? disable : "on", p, d);
    }
    for (size_t i = 0; i < nb_tree_size(got); i++) nb_tree_set_array(jin, nb_tree_path(got, i), nb_tree_leaf(got, i)->array);
    for (size_t i = 0; i < nb_tree_size(want); i++) nb_tree_set_array(ref, nb_tree_path(want, i), nb_tree_leaf(want, i)->array);
    nb_tree_destroy(got);
    nb_tree_destroy(want);
  }
  nb_tree_destroy(jin);
  nb_tree_destroy(ref);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(state);
  nb_optim_tx_destroy(tx);
  nb_tree_destroy(params);
  nb_tree_destroy(grads);
}

/* A computed scalar broadcast into an elementwise kernel is its own kernel;
 * one from a reduction stays inside the reduction's kernel. */
static void test_scalar_cone(void) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {64, 32};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d));
  nb_val *t = nb_graph_input(g, "t", nb_aval_make(NB_F32, 0, NULL));
  nb_val *c = nb_sub(nb_full_like(t, 1.0), nb_pow(nb_full_like(t, 0.9), t));
  nb_graph_output(g, "y", nb_div(x, nb_broadcast_to(c, 2, d)));
  static const int axes[] = {0, 1};
  nb_val *m = nb_reduce_sum(x, 2, axes);
  nb_graph_output(g, "z", nb_sub(x, nb_broadcast_to(nb_exp(m), 2, d)));
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_tree *in = nb_tree_create(ctx);
  add(in, "x", 2, d);
  nb_array *tv = nb_array_full(ctx, NB_F32, 0, NULL, 3.0);
  nb_tree_set_array(in, "t", tv);
  nb_array_release(tv);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe_stats s;
  CHECK(nb_test_jit_matches(ctx, g, in, &o, "scalar cone", &s));
  /* the scalar's kernel, y's kernel, z's reduction-and-elementwise kernel(s) */
  CHECK_MSG(getenv("NABLA_JIT_DISABLE") || s.nkernels >= 3, "%zu kernels: the scalar cone is not its own kernel", s.nkernels);
  o = nb_test_jit_opts("all");
  CHECK(nb_test_jit_matches(ctx, g, in, &o, "scalar cone, all off", NULL));
  nb_tree_destroy(in);
  nb_graph_destroy(g);
}

/* AdamW over 12 leaves of one shape: 36 roots of one domain, more than one
 * kernel holds (MAX_ROOTS). A leaf's param, mu and nu updates must stay in one
 * kernel, or a later kernel would read mu/nu after they were overwritten and
 * the planner would give them fresh outputs: every output is donated. */
static void test_adamw_many_leaves(void) {
  nb_tree *params = nb_tree_create(ctx);
  for (int i = 0; i < 12; i++) {
    char path[16];
    snprintf(path, sizeof path, "w%02d", i);
    add(params, path, 2, (int64_t[]){8, 24});
  }
  nb_optim_tx *tx = nb_optim_adamw(ctx, nb_optim_constant(ctx, 1e-2), 0.9, 0.95, 1e-8, 0.1, NULL);
  nb_tree *state = nb_optim_init_arrays(ctx, tx, params);
  nb_graph *g = nb_optim_step_graph(ctx, tx, params, state);
  CHECK_MSG(g != NULL, "step graph: %s", nb_ctx_error(ctx));
  static const char *const donate[] = {"params", "state", NULL};
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.donate = donate;
  nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
  CHECK_MSG(e != NULL, "nb_jit: %s", nb_ctx_error(ctx));
  const char *env = getenv("NABLA_JIT_DISABLE");
  if (e && !(env && *env)) {
    nb_exe_stats s;
    nb_exe_get_stats(e, &s);
    CHECK_MSG(s.peak_bytes == s.arena_bytes, "peak %zu bytes, arena %zu: %zu bytes of outputs not written in place",
              s.peak_bytes, s.arena_bytes, s.peak_bytes - s.arena_bytes);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(state);
  nb_optim_tx_destroy(tx);
  nb_tree_destroy(params);
}

/* An output written into a donated input must not overwrite it while any
 * root of the kernel still reads it: loss = sum(softmax(x) * c), also
 * returning softmax(x) with c donated (same shape as softmax(x)). The
 * softmax store and the loss's read of c sit in one loop of one kernel. */
static void test_donated_read_by_other_root(int rank) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[3] = {13, 13, 13};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F64, rank, d));
  nb_val *c = nb_graph_input(g, "c", nb_aval_make(NB_F64, rank, d));
  nb_val *p = nb_nn_softmax(x, -1);
  nb_graph_output(g, "loss", nb_reduce_sum(nb_mul(p, c), 0, NULL));
  nb_graph_output(g, "p", p);
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  static const char *const donate[] = {"c", NULL};
  for (int off = 0; off < 2; off++) {
    nb_tree *in = nb_tree_create(ctx);
    nb_test_set_randn(in, &rng, "x", NB_F64, rank, d);
    nb_test_set_randn(in, &rng, "c", NB_F64, rank, d);
    nb_jit_opts o = nb_test_jit_opts(off ? "fuse" : NULL);
    o.donate = donate;
    char what[64];
    snprintf(what, sizeof what, "softmax with c donated, rank %d%s", rank, off ? ", fuse off" : "");
    CHECK(nb_test_jit_matches(ctx, g, in, &o, what, NULL));
    nb_tree_destroy(in);
  }
  nb_graph_destroy(g);
}

/* Optimizers whose updates read their state more than once (amsgrad's
 * running max, centered rmsprop's mean gradient with nesterov momentum):
 * params and state donated, three steps fed back, each equal to the
 * interpreter's. */
static void test_optimizers_donated(nb_dtype dt) {
#define lr nb_optim_constant(ctx, 1e-2) /* each optimizer takes its own */
  struct {
    const char *name;
    nb_optim_tx *tx;
  } cases[] = {
      {"amsgrad", nb_optim_amsgrad(ctx, lr, 0.9, 0.99, 1e-8)},
      {"rmsprop centered nesterov", nb_optim_rmsprop(ctx, lr, 0.9, 1e-8, 0.0, true, 0.9, true)},
      {"rmsprop centered", nb_optim_rmsprop(ctx, lr, 0.9, 1e-8, 0.1, true, 0.0, false)},
      {"nadamw", nb_optim_nadamw(ctx, lr, 0.9, 0.99, 1e-8, 0.1, NULL)},
      {"radam", nb_optim_radam(ctx, lr, 0.9, 0.99, 1e-8, 5.0)},
      {"lamb", nb_optim_lamb(ctx, lr, 0.9, 0.99, 1e-6, 0.1, NULL)},
      {"lion", nb_optim_lion(ctx, lr, 0.9, 0.99, 0.1, NULL)},
      {"sgd nesterov", nb_optim_sgd(ctx, lr, 0.9, true)},
      {"adafactor", nb_optim_adafactor(ctx, lr, 4, 0.8, 1.0, 0.9, true, 1e-30, 0.0)},
      {"muon", nb_optim_muon(ctx, lr, 0.95, 5, 1e-7, 0.9, 0.99, 0.1)},
  };
#undef lr
  nb_tree *params = nb_tree_create(ctx), *grads = nb_tree_create(ctx);
  nb_test_set_randn(params, &rng, "w", dt, 2, (int64_t[]){33, 17});
  nb_test_set_randn(params, &rng, "b", dt, 1, (int64_t[]){17});
  nb_test_set_randn(params, &rng, "e", dt, 3, (int64_t[]){3, 5, 7});
  nb_test_set_randn(grads, &rng, "w", dt, 2, (int64_t[]){33, 17});
  nb_test_set_randn(grads, &rng, "b", dt, 1, (int64_t[]){17});
  nb_test_set_randn(grads, &rng, "e", dt, 3, (int64_t[]){3, 5, 7});
  for (int i = 0; i < 12; i++) { /* more roots of one domain than a kernel holds */
    char path[16];
    snprintf(path, sizeof path, "v%02d", i);
    nb_test_set_randn(params, &rng, path, dt, 2, (int64_t[]){8, 24});
    nb_test_set_randn(grads, &rng, path, dt, 2, (int64_t[]){8, 24});
  }
  static const char *const donate[] = {"params", "state", NULL};
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.donate = donate;
  o.cc = getenv("NABLA_CC") ? NULL : "cc -O0 -fPIC -shared"; /* many small shared objects */
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    nb_tree *state = nb_optim_init_arrays(ctx, cases[c].tx, params);
    nb_graph *g = state ? nb_optim_step_graph(ctx, cases[c].tx, params, state) : NULL;
    nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
    CHECK_MSG(e != NULL, "%s: %s", cases[c].name, nb_ctx_error(ctx));
    nb_tree *jin = NULL, *ref = NULL;
    if (e) paired_inputs(params, state, "grads", grads, &jin, &ref);
    for (int step = 0; e && step < 3; step++) {
      nb_tree *got = nb_tree_create(ctx), *want = nb_tree_create(ctx);
      CHECK_OK(ctx, nb_exe_run(e, jin, got));
      CHECK_OK(ctx, nb_graph_run(ctx, g, ref, want));
      for (size_t i = 0; i < nb_tree_size(want); i++) {
        const char *p = nb_tree_path(want, i);
        nb_array *a = nb_tree_get_array(got, p), *b = nb_tree_leaf(want, i)->array;
        double d = a ? nb_test_max_rel_diff(a, b) : INFINITY;
        CHECK_MSG(d <= nb_test_jit_tol(dt), "%s (%s), step %d: %s differs by %g", cases[c].name, nb_dtype_name(dt), step, p, d);
      }
      for (size_t i = 0; i < nb_tree_size(got); i++) nb_tree_set_array(jin, nb_tree_path(got, i), nb_tree_leaf(got, i)->array);
      for (size_t i = 0; i < nb_tree_size(want); i++) nb_tree_set_array(ref, nb_tree_path(want, i), nb_tree_leaf(want, i)->array);
      nb_tree_destroy(got);
      nb_tree_destroy(want);
    }
    nb_ctx_clear_error(ctx);
    nb_tree_destroy(jin);
    nb_tree_destroy(ref);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
    nb_tree_destroy(state);
    nb_optim_tx_destroy(cases[c].tx);
  }
  nb_tree_destroy(params);
  nb_tree_destroy(grads);
}

/* A training step as the trainer jits it: loss = sum(softmax(w) * c), its
 * gradient and the optimizer's update in one graph, params and state
 * donated (the backward's row kernels read w next to the update's store). */
static nb_graph *train_step_graph(const nb_optim_tx *tx, const int64_t *d, const nb_tree *state_arrays) {
  nb_graph *f = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(f, "params/w", nb_aval_make(NB_F64, 2, d));
  nb_val *c = nb_graph_input(f, "c", nb_aval_make(NB_F64, 2, d));
  nb_graph_output(f, "loss", nb_reduce_sum(nb_mul(nb_nn_softmax(w, -1), c), 0, NULL));
  nb_graph *vg = nb_value_and_grad(ctx, f, &(nb_grad_opts){"params", false});
  nb_graph_destroy(f);
  if (!vg) return NULL;
  nb_graph *g = nb_graph_create(ctx);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx), *params = nb_tree_create(ctx), *state = nb_tree_create(ctx);
  nb_val *pw = nb_graph_input(g, "params/w", nb_aval_make(NB_F64, 2, d));
  nb_tree_set_val(in, "params/w", pw);
  nb_tree_set_val(in, "c", nb_graph_input(g, "c", nb_aval_make(NB_F64, 2, d)));
  nb_tree_set_val(params, "w", pw);
  for (size_t i = 0; i < nb_tree_size(state_arrays); i++) {
    char path[128];
    snprintf(path, sizeof path, "state/%s", nb_tree_path(state_arrays, i));
    nb_tree_set_val(state, nb_tree_path(state_arrays, i), nb_graph_input(g, path, nb_array_aval(nb_tree_leaf(state_arrays, i)->array)));
  }
  nb_graph_call(g, vg, in, out);
  nb_tree *grads = nb_tree_select_prefix(out, "grad/params", true), *upd = nb_tree_create(ctx), *ns = nb_tree_create(ctx),
          *np = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_optim_update(tx, g, grads, state, params, upd, ns));
  CHECK_OK(ctx, nb_optim_apply_updates(g, params, upd, np));
  nb_graph_output(g, "loss", nb_tree_get_val(out, "loss"));
  for (size_t i = 0; i < nb_tree_size(np); i++) {
    char path[128];
    snprintf(path, sizeof path, "params/%s", nb_tree_path(np, i));
    nb_graph_output(g, path, nb_tree_leaf(np, i)->val);
  }
  for (size_t i = 0; i < nb_tree_size(ns); i++) {
    char path[128];
    snprintf(path, sizeof path, "state/%s", nb_tree_path(ns, i));
    nb_graph_output(g, path, nb_tree_leaf(ns, i)->val);
  }
  nb_tree *trees[] = {in, out, params, state, grads, upd, ns, np};
  for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) nb_tree_destroy(trees[i]);
  nb_graph_destroy(vg);
  return g;
}

static void test_train_step_donated(void) {
  int64_t d[2] = {13, 13};
  struct {
    const char *name;
    nb_optim_tx *tx;
  } cases[] = {
      {"amsgrad", nb_optim_amsgrad(ctx, nb_optim_constant(ctx, 1e-2), 0.9, 0.99, 1e-8)},
      {"rmsprop centered nesterov", nb_optim_rmsprop(ctx, nb_optim_constant(ctx, 1e-2), 0.9, 1e-8, 0.0, true, 0.9, true)},
      {"adamw", nb_optim_adamw(ctx, nb_optim_constant(ctx, 1e-2), 0.9, 0.99, 1e-8, 0.1, NULL)},
  };
  static const char *const donate[] = {"params", "state", NULL};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nb_tree *params = nb_tree_create(ctx);
    nb_test_set_randn(params, &rng, "w", NB_F64, 2, d);
    nb_tree *state = nb_optim_init_arrays(ctx, cases[k].tx, params);
    nb_graph *g = state ? train_step_graph(cases[k].tx, d, state) : NULL;
    CHECK_MSG(g && nb_graph_status(g) == NB_OK, "%s: %s", cases[k].name, g ? nb_graph_error(g) : nb_ctx_error(ctx));
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.donate = donate;
    nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
    CHECK_MSG(e != NULL, "%s: nb_jit: %s", cases[k].name, nb_ctx_error(ctx));
    nb_tree *jin, *ref, *c = nb_tree_create(ctx);
    nb_test_set_randn(c, &rng, "c", NB_F64, 2, d);
    paired_inputs(params, state, NULL, c, &jin, &ref);
    for (int step = 0; e && step < 3; step++) {
      nb_tree *got = nb_tree_create(ctx), *want = nb_tree_create(ctx);
      CHECK_OK(ctx, nb_exe_run(e, jin, got));
      CHECK_OK(ctx, nb_graph_run(ctx, g, ref, want));
      for (size_t i = 0; i < nb_tree_size(want); i++) {
        const char *p = nb_tree_path(want, i);
        nb_array *a = nb_tree_get_array(got, p), *b = nb_tree_leaf(want, i)->array;
        double diff = a ? nb_test_max_rel_diff(a, b) : INFINITY;
        CHECK_MSG(diff <= 1e-9, "train step %s, step %d: %s differs by %g", cases[k].name, step, p, diff);
      }
      for (size_t i = 0; i < nb_tree_size(got); i++)
        if (strcmp(nb_tree_path(got, i), "loss")) nb_tree_set_array(jin, nb_tree_path(got, i), nb_tree_leaf(got, i)->array);
      for (size_t i = 0; i < nb_tree_size(want); i++)
        if (strcmp(nb_tree_path(want, i), "loss")) nb_tree_set_array(ref, nb_tree_path(want, i), nb_tree_leaf(want, i)->array);
      nb_tree_destroy(got);
      nb_tree_destroy(want);
    }
    nb_tree *trees[] = {jin, ref, c, params, state};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) nb_tree_destroy(trees[i]);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
    nb_optim_tx_destroy(cases[k].tx);
    nb_ctx_clear_error(ctx);
  }
}

int main(void) {
  ctx = nb_ctx_create();
  test_train_step_donated();
  test_optimizers_donated(NB_F32);
  test_optimizers_donated(NB_F64);
  test_donated_read_by_other_root(2);
  test_donated_read_by_other_root(3);
  test_scalar_cone();
  test_adamw_in_place(NULL);
  test_adamw_in_place("all");
  test_adamw_in_place("fuse");
  test_adamw_many_leaves();
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_inplace");
}
