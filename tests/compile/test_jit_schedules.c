/* The C code generator's loop schedules against the interpreter: column
 * strips (reductions along the outer axis), tiled transposes, partial
 * accumulators over contiguous rows, hoisted loop invariants, the
 * vectorizable exp/tanh/logistic (special values included) and kernels
 * that write a donated input they read transposed. Odd sizes throughout, so
 * strips, tiles and lanes all have tails; every graph is checked with all
 * optimizations on, fusion off and all off, and the generated source must
 * show the schedule the case is about. */
#include <math.h>

#include "jitcheck.h"

static nb_ctx *ctx;
/* false when $NABLA_JIT_DISABLE turns donation off for the whole suite */
/* Plan checks (in place or not) only with every optimization on, as the other
 * jit tests: with fusion off, say, a donated buffer may be read after the
 * kernel that would overwrite it, so the planner rightly copies. */
static bool donation_on(void) {
  const char *env = getenv("NABLA_JIT_DISABLE");
  return !env || !*env;
}
static nb_test_rng rng = {777};

static void add_input(nb_tree *in, const char *path, int rank, const int64_t *dims) {
  nb_test_set_randn(in, &rng, path, NB_F32, rank, dims);
}

/* Does the generated source of g (all on) contain `want`? */
static bool source_has(const nb_graph *g, const char *want) {
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &o);
  const char *path = e ? nb_exe_source_path(e) : NULL;
  bool found = false;
  FILE *f = path ? fopen(path, "r") : NULL;
  char line[4096];
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, want) != NULL;
  if (f) fclose(f);
  nb_exe_destroy(e);
  return found;
}

static void check_modes(const char *what, const nb_graph *g, const nb_tree *in, const char *const *donate) {
  static const char *const modes[] = {NULL, "fuse", "all"};
  for (int m = 0; m < 3; m++) {
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    o.donate = donate;
    char name[256];
    snprintf(name, sizeof name, "%s [off: %s]", what, modes[m] ? modes[m] : "none");
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, NULL), "%s", name);
  }
}

/* ---------------------------------------------------------------- reductions along every axis */

typedef struct red_case {
  int prim; /* 0 sum, 1 max, 2 min */
  int naxes;
  int axes[3];
} red_case;

static nb_status f_reduce(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const red_case *c = u;
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *e = nb_mul(nb_exp(nb_mul(x, nb_scalar(g, NB_F32, 0.5))), x); /* a cone, not just a load */
  nb_val *r = c->prim == 0 ? nb_reduce_sum(e, c->naxes, c->axes) : c->prim == 1 ? nb_reduce_max(e, c->naxes, c->axes)
                                                                                 : nb_reduce_min(e, c->naxes, c->axes);
  nb_tree_set_val(out, "r", nb_tanh(r));
  /* a second root of the same domain: two reductions share the kernel */
  return nb_tree_set_val(out, "s", nb_reduce_sum(nb_mul(x, x), c->naxes, c->axes));
}

static void test_reductions(void) {
  const int64_t dims[3] = {37, 19, 70};
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "x", 3, dims);
  bool saw_column = false, saw_lanes = false;
  /* every non-empty subset of the three axes for sums; max and min over
   * the first axis, the last, and the last two */
  for (int prim = 0; prim < 3; prim++)
    for (int mask = 1; mask < 8; mask++) {
      if (prim > 0 && mask != 1 && mask != 4 && mask != 6) continue;
      red_case c = {prim, 0, {0}};
      for (int a = 0; a < 3; a++)
        if (mask & (1 << a)) c.axes[c.naxes++] = a;
      nb_graph *g = nb_trace(ctx, f_reduce, &c, in);
      CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
      if (!g) continue;
      char what[64];
      snprintf(what, sizeof what, "reduce %s over axes mask %d", prim == 0 ? "sum" : prim == 1 ? "max" : "min", mask);
      check_modes(what, g, in, NULL);
      if (prim == 0 && mask == 1) saw_column = source_has(g, "column schedule");
      if (prim == 1 && mask == 4) saw_lanes = source_has(g, "simd reduction */");
      nb_graph_destroy(g);
    }
  CHECK_MSG(saw_column, "a reduction over axis 0 of [37,19,70] uses the column schedule");
  CHECK_MSG(saw_lanes, "a reduction over the last axis of [37,19,70] is a simd reduction");
  nb_tree_destroy(in);
}

/* NaN and infinities inside reductions on both schedules */
static nb_status f_nan_reduce(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_tree_set_val(out, "colmax", nb_reduce_max(x, 1, (int[]){0}));
  nb_tree_set_val(out, "colsum", nb_reduce_sum(x, 1, (int[]){0}));
  nb_tree_set_val(out, "rowmin", nb_reduce_min(x, 1, (int[]){1}));
  return nb_tree_set_val(out, "rowmax", nb_reduce_max(x, 1, (int[]){1}));
}

static void test_special_reductions(void) {
  const int64_t dims[2] = {41, 67};
  float *v = malloc(sizeof(float) * 41 * 67);
  for (int i = 0; i < 41 * 67; i++) v[i] = (float)((i * 37) % 101) - 50;
  v[5 * 67 + 3] = NAN;      /* row 5, column 3 */
  v[9 * 67 + 66] = INFINITY; /* row 9, the tail of the lanes */
  v[40 * 67 + 10] = -INFINITY;
  nb_array *a = nb_array_create(ctx, NB_F32, 2, dims, v);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", a);
  nb_graph *g = nb_trace(ctx, f_nan_reduce, NULL, in);
  CHECK(g != NULL);
  if (g) check_modes("reductions with NaN and infinities", g, in, NULL);
  nb_graph_destroy(g);
  nb_array_release(a);
  nb_tree_destroy(in);
  free(v);
}

/* ---------------------------------------------------------------- transposes */

static nb_status f_transpose(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const int *perm = u;
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *t = nb_transpose(nb_add(nb_mul(x, nb_scalar(g, NB_F32, 2)), nb_scalar(g, NB_F32, 1)), perm);
  nb_tree_set_val(out, "t", nb_add(t, nb_tanh(t)));
  /* more roots in the same kernel: one sharing t's cone, one independent
   * (a tiled kernel walks the two groups' tiles separately) */
  nb_tree_set_val(out, "u", nb_mul(t, t));
  return nb_tree_set_val(out, "v", nb_transpose(nb_mul(nb_tree_get_val(in, "z"), nb_scalar(g, NB_F32, 3)), perm));
}

static void test_transposes(void) {
  static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const int64_t dims[3] = {5, 33, 47};
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "x", 3, dims);
  add_input(in, "z", 3, dims);
  bool saw_tile = false;
  for (int p = 0; p < 6; p++) {
    nb_graph *g = nb_trace(ctx, f_transpose, (void *)perms[p], in);
    CHECK(g != NULL);
    if (!g) continue;
    char what[64];
    snprintf(what, sizeof what, "transpose (%d %d %d)", perms[p][0], perms[p][1], perms[p][2]);
    check_modes(what, g, in, NULL);
    if (p == 1) saw_tile = source_has(g, "tile schedule");
    nb_graph_destroy(g);
  }
  CHECK_MSG(saw_tile, "transposing the last two axes of [5,33,47] uses the tiled schedule");
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- softmax, layer norm, cross-entropy */

static nb_val *bcast(nb_val *v, nb_val *like, int kept) {
  int64_t dims[2] = {nb_val_dim(like, 0), nb_val_dim(like, 1)};
  return nb_broadcast_in_dim(v, 2, dims, (int[]){kept});
}

static nb_status f_norms(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int axis = *(const int *)u, kept = 1 - axis;
  nb_val *x = nb_tree_get_val(in, "x");
  int ax[1] = {axis};
  double n = (double)nb_val_dim(x, axis);
  /* softmax */
  nb_val *m = nb_reduce_max(x, 1, ax);
  nb_val *e = nb_exp(nb_sub(x, bcast(m, x, kept)));
  nb_tree_set_val(out, "softmax", nb_div(e, bcast(nb_reduce_sum(e, 1, ax), x, kept)));
  /* layer norm */
  nb_val *xc = nb_sub(x, bcast(nb_div(nb_reduce_sum(x, 1, ax), nb_scalar(g, NB_F32, n)), x, kept));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_tree_set_val(out, "layernorm", nb_mul(xc, bcast(nb_rsqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5))), x, kept)));
  /* cross-entropy against class 3 of each row, mean over rows */
  nb_val *lse = nb_add(nb_log(nb_reduce_sum(e, 1, ax)), m);
  int64_t dims[2] = {nb_val_dim(x, 0), nb_val_dim(x, 1)};
  nb_val *hit = nb_convert(nb_eq(nb_iota(g, NB_I32, 2, dims, axis), nb_full(g, NB_I32, 2, dims, 3)), NB_F32);
  nb_val *nll = nb_sub(lse, nb_reduce_sum(nb_mul(x, hit), 1, ax));
  return nb_tree_set_val(out, "xent", nb_div(nb_reduce_sum(nll, 0, NULL), nb_scalar(g, NB_F32, (double)dims[kept])));
}

static void test_norms(void) {
  static const int64_t shapes[][2] = {{129, 70}, {3, 301}, {70, 17}, {1, 33}};
  for (int s = 0; s < 4; s++)
    for (int axis = 0; axis < 2; axis++) {
      nb_tree *in = nb_tree_create(ctx);
      add_input(in, "x", 2, shapes[s]);
      nb_graph *g = nb_trace(ctx, f_norms, &axis, in);
      CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
      char what[96];
      snprintf(what, sizeof what, "softmax/layernorm/xent over axis %d of [%lld,%lld]", axis, (long long)shapes[s][0],
               (long long)shapes[s][1]);
      if (g) check_modes(what, g, in, NULL);
      /* a row kernel's later loop reads what an earlier one kept (the
       * exponentials of the softmax: summed, then divided) */
      if (g && axis == 1 && s == 0) CHECK_MSG(source_has(g, " = row"), "%s: a value kept in a row array", what);
      nb_graph_destroy(g);
      nb_tree_destroy(in);
    }
}

/* A row kernel's store loop (after its reduction phases) over a pre-norm
 * residual block's layer norm: the residual sum x + a + b written into the
 * donated x, the normalized row, and the scaled and shifted one. Its
 * arguments are eleven pointers, more pairs than gcc checks for aliasing
 * before it gives up on a loop: unless the generator marks the store loop
 * (NBX_IVDEP, as it marks the outer loops) it stays scalar (gpt2's layer
 * norms ran at a third of the speed). */
static nb_status f_norm_stores(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)u;
  nb_val *x = nb_tree_get_val(in, "params/x"), *r = nb_add(nb_add(x, nb_tree_get_val(in, "a")), nb_tree_get_val(in, "b"));
  int ax[1] = {1};
  double n = (double)nb_val_dim(x, 1);
  nb_val *xc = nb_sub(r, bcast(nb_div(nb_reduce_sum(r, 1, ax), nb_scalar(g, NB_F32, n)), r, 0));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *xn = nb_mul(xc, bcast(nb_rsqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5))), r, 0));
  int64_t dims[2] = {nb_val_dim(x, 0), nb_val_dim(x, 1)};
  nb_val *scale = nb_broadcast_in_dim(nb_tree_get_val(in, "scale"), 2, dims, (int[]){1});
  nb_val *shift = nb_broadcast_in_dim(nb_tree_get_val(in, "shift"), 2, dims, (int[]){1});
  nb_tree_set_val(out, "params/x", r);
  nb_tree_set_val(out, "xn", xn);
  nb_tree_set_val(out, "y", nb_add(nb_mul(xn, scale), shift));
  return nb_tree_set_val(out, "y2", nb_mul(xn, nb_scalar(g, NB_F32, 2)));
}

/* Does the generated source of g (all on) hold a line that is exactly `want`? */
static bool source_has_line(const nb_graph *g, const char *want) {
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &o);
  const char *path = e ? nb_exe_source_path(e) : NULL;
  bool found = false;
  FILE *f = path ? fopen(path, "r") : NULL;
  char line[4096];
  while (f && !found && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    found = strcmp(line, want) == 0;
  }
  if (f) fclose(f);
  nb_exe_destroy(e);
  return found;
}

static void test_row_stores(void) {
  static const int64_t shapes[][2] = {{37, 133}, {5, 16}, {9, 7}};
  for (int s = 0; s < 3; s++) {
    nb_tree *in = nb_tree_create(ctx);
    add_input(in, "params/x", 2, shapes[s]);
    add_input(in, "a", 2, shapes[s]);
    add_input(in, "b", 2, shapes[s]);
    add_input(in, "scale", 1, shapes[s] + 1);
    add_input(in, "shift", 1, shapes[s] + 1);
    nb_graph *g = nb_trace(ctx, f_norm_stores, NULL, in);
    CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
    char what[96];
    snprintf(what, sizeof what, "residual + layer norm of [%lld,%lld], the sum into the donated x", (long long)shapes[s][0],
             (long long)shapes[s][1]);
    const char *donate[] = {"params", NULL};
    if (g) check_modes(what, g, in, donate);
    if (g && s == 0) CHECK_MSG(source_has_line(g, "NBX_IVDEP"), "the row kernel's store loop is marked for vectorizing");
    nb_graph_destroy(g);
    nb_tree_destroy(in);
  }
}

/* Bias gradients fused with their optimizer update (the column schedule's
 * main use): two column sums of [R, C] operands, then per column a moment
 * and a parameter update written into the donated ones. The strip is the
 * whole row when its arrays fit (the accumulators and sums; the update is
 * computed per column in the strip's last loop), else as wide as they allow
 * (two double accumulators in 24 KB: 1536 columns, a partial last strip). */
static nb_status f_bias_updates(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)u;
  nb_val *x = nb_tree_get_val(in, "x"), *y = nb_tree_get_val(in, "y");
  nb_val *m = nb_tree_get_val(in, "params/m"), *b = nb_tree_get_val(in, "params/b");
  int ax[1] = {0};
  nb_val *gx = nb_reduce_sum(x, 1, ax), *gy = nb_reduce_sum(nb_mul(y, y), 1, ax);
  nb_val *m2 = nb_add(nb_mul(m, nb_scalar(g, NB_F32, 0.9)), nb_mul(gx, nb_scalar(g, NB_F32, 0.1)));
  nb_val *den = nb_add(nb_sqrt(nb_div(gy, nb_scalar(g, NB_F32, (double)nb_val_dim(y, 0)))), nb_scalar(g, NB_F32, 1e-3));
  nb_tree_set_val(out, "params/m", m2);
  nb_tree_set_val(out, "gy", gy);
  return nb_tree_set_val(out, "params/b", nb_sub(b, nb_div(nb_mul(m2, nb_scalar(g, NB_F32, 0.01)), den)));
}

static void test_column_strips(void) {
  static const int64_t shapes[][2] = {{301, 203}, {7, 5000}, {64, 9}};
  static const char *const width[] = {"W_ = 203 }", "W_ = 1536 }", "W_ = 9 }"};
  for (int s = 0; s < 3; s++) {
    nb_tree *in = nb_tree_create(ctx);
    add_input(in, "x", 2, shapes[s]);
    add_input(in, "y", 2, shapes[s]);
    add_input(in, "params/m", 1, shapes[s] + 1);
    add_input(in, "params/b", 1, shapes[s] + 1);
    nb_graph *g = nb_trace(ctx, f_bias_updates, NULL, in);
    CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
    char what[96];
    snprintf(what, sizeof what, "column sums of [%lld,%lld] and a donated update", (long long)shapes[s][0],
             (long long)shapes[s][1]);
    const char *donate[] = {"params", NULL};
    if (g) check_modes(what, g, in, donate);
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.threads = 3; /* a thread's range of columns starts and ends inside strips */
    CHECK_MSG(!g || nb_test_jit_matches(ctx, g, in, &o, what, NULL), "%s at 3 threads", what);
    if (g) CHECK_MSG(source_has(g, "column schedule") && source_has(g, width[s]), "%s: a strip of %s", what, width[s]);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
  }
}

/* ---------------------------------------------------------------- invariants, donation */

/* An AdamW-like update of a donated parameter whose gradient arrives
 * transposed, with a bias correction pow(b, step) that is loop-invariant. */
static nb_status f_update(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *w = nb_tree_get_val(in, "params/w"), *gt = nb_tree_get_val(in, "gradT"), *step = nb_tree_get_val(in, "step");
  nb_val *grad = nb_transpose(gt, ((int[]){1, 0}));
  nb_val *corr = nb_sub(nb_scalar(g, NB_F32, 1), nb_pow(nb_scalar(g, NB_F32, 0.9), step));
  int64_t dims[2] = {nb_val_dim(w, 0), nb_val_dim(w, 1)};
  nb_val *c = nb_broadcast_in_dim(corr, 2, dims, NULL);
  return nb_tree_set_val(out, "params/w", nb_sub(w, nb_mul(nb_div(grad, c), nb_scalar(g, NB_F32, 0.01))));
}

/* Two donated parameters updated in one tiled kernel (both written in
 * place), the second also reading the first through a reshape. The case
 * that once broke (a tiled kernel's store groups run one after the other,
 * so a store into a donor must not precede another group's read of it) is
 * exercised end to end by tests/train/test_train.c's resume and
 * gradient-accumulation checks; this graph checks the in-place pair. */
static nb_status f_two_updates(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *w1 = nb_tree_get_val(in, "params/w1"), *w2 = nb_tree_get_val(in, "params/w2");
  nb_val *g1 = nb_transpose(nb_tree_get_val(in, "g1T"), ((int[]){1, 0}));
  nb_val *g2 = nb_transpose(nb_tree_get_val(in, "g2T"), ((int[]){1, 0}));
  int64_t flat[1] = {nb_val_dim(w1, 0) * nb_val_dim(w1, 1)}, dims[2] = {nb_val_dim(w1, 0), nb_val_dim(w1, 1)};
  nb_val *w1v = nb_reshape(nb_reshape(w1, 1, flat), 2, dims);
  nb_tree_set_val(out, "params/w1", nb_sub(w1, nb_mul(g1, nb_scalar(g, NB_F32, 0.5))));
  return nb_tree_set_val(out, "params/w2", nb_add(nb_sub(w2, nb_mul(g2, nb_scalar(g, NB_F32, 0.5))), w1v));
}

static void test_two_donated_updates(void) {
  const int64_t wd[2] = {40, 56}, gd[2] = {56, 40};
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "params/w1", 2, wd);
  add_input(in, "params/w2", 2, wd);
  add_input(in, "g1T", 2, gd);
  add_input(in, "g2T", 2, gd);
  nb_graph *g = nb_trace(ctx, f_two_updates, NULL, in);
  CHECK(g != NULL);
  if (!g) return;
  nb_tree *want = nb_tree_create(ctx), *got = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want));
  const char *donate[] = {"params", NULL};
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.donate = donate;
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_array *w1 = nb_tree_get_array(in, "params/w1");
  CHECK_OK(ctx, nb_exe_run(e, in, got));
  CHECK_MSG(!donation_on() || nb_tree_get_array(got, "params/w1") == w1, "w1 was updated in place");
  for (int i = 1; i <= 2; i++) {
    char path[32];
    snprintf(path, sizeof path, "params/w%d", i);
    double d = nb_test_max_rel_diff(nb_tree_get_array(got, path), nb_tree_get_array(want, path));
    CHECK_MSG(d <= 2e-5, "%s differs from the interpreter by %g", path, d);
  }
  nb_exe_destroy(e);
  nb_tree_destroy(got);
  nb_tree_destroy(want);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_donated_transposed_update(void) {
  const int64_t wd[2] = {45, 83}, gd[2] = {83, 45};
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "params/w", 2, wd);
  add_input(in, "gradT", 2, gd);
  nb_array *step = nb_array_scalar(ctx, NB_F32, 3);
  nb_tree_set_array(in, "step", step);
  nb_array_release(step);
  nb_graph *g = nb_trace(ctx, f_update, NULL, in);
  CHECK(g != NULL);
  if (!g) return;
  const char *donate[] = {"params", NULL};
  /* the test tree holds params/w once only after the interpreter's run in
   * nb_test_jit_matches, so the executable may write it in place: compare
   * against a copy taken before */
  nb_tree *want = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want));
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.donate = donate;
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_array *w = nb_tree_get_array(in, "params/w");
  nb_tree *got = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_exe_run(e, in, got));
  CHECK_MSG(!donation_on() || nb_tree_get_array(got, "params/w") == w, "the update was written into the donated input");
  CHECK(nb_test_max_rel_diff(nb_tree_get_array(got, "params/w"), nb_tree_get_array(want, "params/w")) <= 2e-5);
  nb_exe_destroy(e);
  CHECK_MSG(source_has(g, "tile schedule"), "the transposed gradient makes the update tiled");
  nb_tree_destroy(got);
  nb_tree_destroy(want);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- exp, tanh, logistic */

static nb_status f_transcendental(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_tree_set_val(out, "exp", nb_exp(x));
  nb_tree_set_val(out, "tanh", nb_tanh(x));
  return nb_tree_set_val(out, "logistic", nb_logistic(x));
}

static void test_transcendentals(void) {
  enum { N = 4099 };
  float *v = malloc(sizeof(float) * N);
  const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 88.72f, 88.73f, -87.3f, -103.9f, -104.0f, -150.0f,
                           1e-10f, -1e-10f, 1e-30f, 20.0f, -20.0f, 0.5f, -0.5f, 709.0f, -745.0f};
  int ns = (int)(sizeof special / sizeof special[0]);
  for (int i = 0; i < N; i++) v[i] = i < ns ? special[i] : (float)((i - N / 2) * 0.05); /* -102 .. 102 */
  int64_t d[1] = {N};
  nb_array *a = nb_array_create(ctx, NB_F32, 1, d, v);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", a);
  nb_graph *g = nb_trace(ctx, f_transcendental, NULL, in);
  CHECK(g != NULL);
  if (g) check_modes("exp/tanh/logistic over special values and [-102, 102]", g, in, NULL);
  /* accuracy of the float formulas (core/prims/float_math.h): exp within one
   * float ulp of libm's double result, tanh and logistic within two */
  nb_tree *out = nb_tree_create(ctx);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
  CHECK_OK(ctx, nb_exe_run(e, in, out));
  const char *names[] = {"exp", "tanh", "logistic"};
  for (int f = 0; f < 3; f++) {
    nb_array *r = nb_tree_get_array(out, names[f]);
    int bad = 0;
    for (int i = 0; r && i < N; i++) {
      double x = v[i], want = f == 0 ? exp(x) : f == 1 ? tanh(x) : x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
      float wf = (float)want, got = (float)nb_array_get(r, i);
      float ulp = fmaxf(nextafterf(fabsf(wf), INFINITY) - fabsf(wf), 0x1p-149f); /* subnormals: 2^-149 */
      if (wf != wf) bad += got == got;
      else if (got != wf && !(fabsf(got - wf) <= (f == 0 ? 1 : 2) * ulp)) {
        if (bad++ < 3) fprintf(stderr, "%s(%a) = %a, libm %a\n", names[f], v[i], got, wf);
      }
    }
    CHECK_MSG(r && bad == 0, "%s: %d values more than %d ulp from libm", names[f], bad, f == 0 ? 1 : 2);
  }
  nb_exe_destroy(e);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_array_release(a);
  free(v);
}

int main(void) {
  ctx = nb_ctx_create();
  test_reductions();
  test_special_reductions();
  test_transposes();
  test_norms();
  test_row_stores();
  test_column_strips();
  test_donated_transposed_update();
  test_two_donated_updates();
  test_transcendentals();
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_schedules");
}
