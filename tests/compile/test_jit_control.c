/* Control flow through nb_jit: scan (forward, reverse, length 0 and 1),
 * while_loop (zero and many trips), cond/switch (every branch, clamped
 * indices, only the taken one runs), fori_loop and its gradient, nested loops (a scan in a scan, a cond in a scan), a
 * body with a dot_general (a BLAS step inside the loop), the gradient of a
 * scan (also with its body a remat region), and a donated carry, against the interpreter with everything on,
 * fusion off and everything off. The plan is a loop: the parent's steps and
 * the body's kernels do not grow with the trip count, and a scan compiled
 * is bit-identical to the same body unrolled and compiled. Views (what
 * scan_layers relies on): a reshape read by an evaluated step, a contiguous
 * slice and a scan's passed-through ys get no copy. */
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {4242};
static const char *const modes[] = {NULL, "fuse", "all"};

static nb_aval f32(int rank, const int64_t *dims) { return nb_aval_make(NB_F32, rank, dims); }

static void put(nb_tree *t, const char *path, nb_dtype dt, int rank, const int64_t *dims) {
  nb_array *a = nb_test_randn(ctx, &rng, dt, rank, dims);
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

static void put_i32(nb_tree *t, const char *path, int32_t v) {
  nb_array *a = nb_array_empty(ctx, NB_I32, 0, NULL);
  *(int32_t *)nb_array_data_mut(a) = v;
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

/* Every mode against the interpreter; returns the executable of the first
 * (everything on) for plan checks, or NULL. */
static nb_exe *check_all_modes(const nb_graph *g, const nb_tree *in, const char *what) {
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
    char name[160];
    snprintf(name, sizeof name, "%s (%s)", what, modes[m] ? modes[m] : "on");
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, NULL), "%s", name);
  }
  nb_jit_opts o = nb_test_jit_opts(NULL);
  return nb_jit(ctx, g, &o);
}

/* The plan is checked only with every optimization on (on any backend:
 * NABLA_BACKEND=interp runs the loops through the interface too). */
static const char *env_disable(void) {
  const char *env = getenv("NABLA_JIT_DISABLE");
  return env && *env ? env : NULL;
}

/* the index of e's first CONTROL step, or -1 */
static int control_step(const nb_exe *e) {
  for (size_t i = 0; e && i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info s;
    if (nb_exe_step(e, i, &s) == NB_OK && s.kind == NB_EXE_STEP_CONTROL) return (int)i;
  }
  return -1;
}

/* ---------------------------------------------------------------- graphs */

#define N 24

/* body(c, h, x) -> (h' = tanh(h * c + x), y = h' * c - x): consts, carry, xs */
static nb_graph *rnn_body(bool with_dot, int64_t n) {
  nb_graph *b = nb_graph_create(ctx);
  int64_t d[1] = {n}, dw[2] = {n, n};
  nb_val *c = with_dot ? nb_graph_input(b, "a_w", f32(2, dw)) : nb_graph_input(b, "a_c", f32(1, d));
  nb_val *h = nb_graph_input(b, "b_h", f32(1, d)), *x = nb_graph_input(b, "c_x", f32(1, d));
  int64_t row[2] = {1, n};
  nb_val *hc = with_dot ? nb_matmul(nb_reshape(h, 2, row), c) : nb_mul(h, c);
  if (with_dot) hc = nb_reshape(hc, 1, d);
  nb_val *h2 = nb_tanh(nb_add(hc, x));
  nb_graph_output(b, "a_h", h2);
  nb_graph_output(b, "b_y", nb_sub(nb_mul(h2, h2), x));
  return b;
}

/* out h, ys of scan(rnn_body) over xs [len, n] */
static nb_graph *scan_graph(int64_t len, bool reverse, bool with_dot, int64_t n) {
  nb_graph *body = rnn_body(with_dot, n);
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[1] = {n}, dw[2] = {n, n}, dx[2] = {len, n};
  nb_val *c = with_dot ? nb_graph_input(g, "c", f32(2, dw)) : nb_graph_input(g, "c", f32(1, d));
  nb_val *h = nb_graph_input(g, "h", f32(1, d)), *xs = nb_graph_input(g, "xs", f32(2, dx));
  nb_val *hout, *ys;
  nb_scan_opts so = {.length = len, .reverse = reverse};
  CHECK_OK(ctx, nb_scan(g, body, 1, &c, 1, &h, 1, &xs, &so, &hout, &ys));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "ys", ys);
  nb_graph_destroy(body);
  return g;
}

static nb_tree *scan_inputs(int64_t len, bool with_dot, int64_t n) {
  nb_tree *in = nb_tree_create(ctx);
  int64_t d[1] = {n}, dw[2] = {n, n}, dx[2] = {len, n};
  put(in, "c", NB_F32, with_dot ? 2 : 1, with_dot ? dw : d);
  put(in, "h", NB_F32, 1, d);
  put(in, "xs", NB_F32, 2, dx);
  return in;
}

/* ---------------------------------------------------------------- scan */

static void test_scan(void) {
  static const int64_t lens[] = {0, 1, 2, 7};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
    for (int rev = 0; rev < 2; rev++) {
      nb_graph *g = scan_graph(lens[i], rev, false, N);
      nb_tree *in = scan_inputs(lens[i], false, N);
      char what[64];
      snprintf(what, sizeof what, "scan len %lld%s", (long long)lens[i], rev ? " reverse" : "");
      nb_exe *e = check_all_modes(g, in, what);
      CHECK_MSG(e != NULL, "%s: %s", what, nb_ctx_error(ctx));
      if (e && !env_disable()) {
        int s = control_step(e);
        CHECK_MSG(s >= 0, "%s: no control step", what);
        CHECK_MSG(nb_exe_step_body(e, (size_t)s, 0) != NULL && nb_exe_step_body(e, (size_t)s, 1) == NULL, "%s: scan has one body", what);
      }
      nb_exe_destroy(e);
      nb_tree_destroy(in);
      nb_graph_destroy(g);
    }
}

/* The plan is a loop: 3 and 60 iterations give the same steps and the same
 * body; the body ran once per iteration (its profile counts them). */
static void test_scan_is_a_loop(void) {
  if (env_disable()) return;
  nb_graph *g3 = scan_graph(3, false, true, N), *g60 = scan_graph(60, false, true, N);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e3 = nb_jit(ctx, g3, &o), *e60 = nb_jit(ctx, g60, &o);
  CHECK_MSG(e3 && e60, "nb_jit: %s", nb_ctx_error(ctx));
  if (e3 && e60) {
    nb_exe_stats s3, s60, b3, b60;
    nb_exe_get_stats(e3, &s3);
    nb_exe_get_stats(e60, &s60);
    CHECK_MSG(s3.nsteps == s60.nsteps, "steps grow with the trip count: %zu vs %zu", s3.nsteps, s60.nsteps);
    int c3 = control_step(e3), c60 = control_step(e60);
    CHECK(c3 >= 0 && c60 >= 0);
    const nb_exe *body3 = c3 >= 0 ? nb_exe_step_body(e3, (size_t)c3, 0) : NULL;
    const nb_exe *body60 = c60 >= 0 ? nb_exe_step_body(e60, (size_t)c60, 0) : NULL;
    CHECK(body3 && body60);
    if (body3 && body60) {
      nb_exe_get_stats(body3, &b3);
      nb_exe_get_stats(body60, &b60);
      CHECK_MSG(b3.nkernels == b60.nkernels && b3.nsteps == b60.nsteps && b3.nkernels >= 1, "body: %zu/%zu kernels", b3.nkernels,
                b60.nkernels);
      CHECK_MSG(b60.nblas == 1, "the body's dot_general is one BLAS step, got %zu", b60.nblas);
      nb_tree *in = scan_inputs(60, true, N), *out = nb_tree_create(ctx);
      CHECK_OK(ctx, nb_exe_run(e60, in, out));
      nb_exe_get_stats(body60, &b60);
      CHECK_MSG(b60.runs == 60, "the body's profile counts %llu runs, not 60", (unsigned long long)b60.runs);
      nb_exe_step_info si;
      CHECK_OK(ctx, nb_exe_step(body60, 0, &si));
      CHECK(si.total_ms >= 0);
      nb_exe_step_info ci;
      CHECK_OK(ctx, nb_exe_step(e60, (size_t)c60, &ci));
      CHECK_MSG(ci.flops > 50 * 2.0 * N * N, "the scan step's flops (%g) count every iteration", ci.flops);
      nb_tree_destroy(in);
      nb_tree_destroy(out);
    }
  }
  nb_exe_destroy(e3);
  nb_exe_destroy(e60);
  nb_graph_destroy(g3);
  nb_graph_destroy(g60);
}

/* The same body unrolled by hand (slices of xs, a stack of ys) compiles to
 * the same arithmetic: bit-identical results. */
static void test_scan_bitwise_unrolled(void) {
  const int64_t len = 5;
  nb_graph *gs = scan_graph(len, false, true, N);
  nb_graph *gu = nb_graph_create(ctx);
  int64_t d[1] = {N}, dw[2] = {N, N}, dx[2] = {len, N};
  nb_val *w = nb_graph_input(gu, "c", f32(2, dw)), *h = nb_graph_input(gu, "h", f32(1, d)), *xs = nb_graph_input(gu, "xs", f32(2, dx));
  nb_val *ys[8];
  int64_t row[2] = {1, N};
  for (int64_t t = 0; t < len; t++) {
    int64_t start[2] = {t, 0}, limit[2] = {t + 1, N};
    nb_val *x = nb_reshape(nb_slice(xs, start, limit, NULL), 1, d);
    nb_val *hc = nb_reshape(nb_matmul(nb_reshape(h, 2, row), w), 1, d);
    h = nb_tanh(nb_add(hc, x));
    ys[t] = nb_reshape(nb_sub(nb_mul(h, h), x), 2, row);
  }
  nb_graph_output(gu, "h", h);
  nb_graph_output(gu, "ys", nb_concatenate((int)len, ys, 0));
  nb_tree *in = scan_inputs(len, true, N);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *es = nb_jit(ctx, gs, &o), *eu = nb_jit(ctx, gu, &o);
  nb_tree *a = nb_tree_create(ctx), *b = nb_tree_create(ctx);
  CHECK_MSG(es && eu, "nb_jit: %s", nb_ctx_error(ctx));
  if (es && eu) {
    CHECK_OK(ctx, nb_exe_run(es, in, a));
    CHECK_OK(ctx, nb_exe_run(eu, in, b));
    for (size_t i = 0; i < nb_tree_size(b); i++) {
      nb_array *x = nb_tree_get_array(a, nb_tree_path(b, i)), *y = nb_tree_leaf(b, i)->array;
      CHECK_MSG(x && nb_array_nbytes(x) == nb_array_nbytes(y) && !memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(y)),
                "scan vs unrolled: %s differs", nb_tree_path(b, i));
    }
  }
  nb_tree_destroy(a);
  nb_tree_destroy(b);
  nb_tree_destroy(in);
  nb_exe_destroy(es);
  nb_exe_destroy(eu);
  nb_graph_destroy(gs);
  nb_graph_destroy(gu);
}

/* ---------------------------------------------------------------- while, fori */

/* while i < n: i += 1, v = v * 0.5 + k */
static nb_graph *while_graph(void) {
  int64_t d[1] = {N};
  nb_graph *cond = nb_graph_create(ctx);
  nb_val *n = nb_graph_input(cond, "a_n", nb_aval_make(NB_I32, 0, NULL));
  nb_val *i = nb_graph_input(cond, "b_i", nb_aval_make(NB_I32, 0, NULL));
  nb_graph_input(cond, "c_v", f32(1, d));
  nb_graph_output(cond, "go", nb_lt(i, n));
  nb_graph *body = nb_graph_create(ctx);
  nb_val *k = nb_graph_input(body, "a_k", f32(1, d));
  nb_val *bi = nb_graph_input(body, "b_i", nb_aval_make(NB_I32, 0, NULL));
  nb_val *v = nb_graph_input(body, "c_v", f32(1, d));
  nb_graph_output(body, "a_i", nb_add(bi, nb_scalar(body, NB_I32, 1)));
  nb_graph_output(body, "b_v", nb_add(nb_mul(v, nb_scalar(body, NB_F32, 0.5)), k));
  nb_graph *g = nb_graph_create(ctx);
  nb_val *gn = nb_graph_input(g, "n", nb_aval_make(NB_I32, 0, NULL)), *gk = nb_graph_input(g, "k", f32(1, d));
  nb_val *init[2] = {nb_scalar(g, NB_I32, 0), nb_graph_input(g, "v", f32(1, d))}, *outs[2];
  CHECK_OK(ctx, nb_while_loop(g, cond, body, 1, &gn, 1, &gk, 2, init, outs));
  nb_graph_output(g, "i", outs[0]);
  nb_graph_output(g, "v", outs[1]);
  nb_graph_destroy(cond);
  nb_graph_destroy(body);
  return g;
}

static void test_while(void) {
  nb_graph *g = while_graph();
  static const int32_t trips[] = {-3, 0, 1, 2, 9};
  for (size_t t = 0; t < sizeof trips / sizeof *trips; t++) {
    nb_tree *in = nb_tree_create(ctx);
    put_i32(in, "n", trips[t]);
    put(in, "k", NB_F32, 1, (int64_t[]){N});
    put(in, "v", NB_F32, 1, (int64_t[]){N});
    char what[64];
    snprintf(what, sizeof what, "while n=%d", trips[t]);
    nb_exe *e = check_all_modes(g, in, what);
    CHECK_MSG(e != NULL, "%s: %s", what, nb_ctx_error(ctx));
    if (e && !env_disable()) CHECK_MSG(control_step(e) >= 0, "%s: no control step", what);
    nb_exe_destroy(e);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(g);
}

/* fori_loop with constant bounds (a scan) and bounds from the inputs (a while) */
static void test_fori(void) {
  int64_t d[1] = {N};
  nb_graph *body = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(body, "a_w", f32(1, d)), *i = nb_graph_input(body, "b_i", nb_aval_make(NB_I32, 0, NULL));
  nb_val *v = nb_graph_input(body, "c_v", f32(1, d));
  nb_graph_output(body, "v", nb_add(nb_sin(nb_mul(v, w)), nb_convert(i, NB_F32)));
  for (int dyn = 0; dyn < 2; dyn++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *gw = nb_graph_input(g, "w", f32(1, d)), *gv = nb_graph_input(g, "v", f32(1, d)), *out;
    nb_val *lo = dyn ? nb_graph_input(g, "lo", nb_aval_make(NB_I32, 0, NULL)) : nb_scalar(g, NB_I32, 2);
    nb_val *hi = dyn ? nb_graph_input(g, "hi", nb_aval_make(NB_I32, 0, NULL)) : nb_scalar(g, NB_I32, 9);
    CHECK_OK(ctx, nb_fori_loop(g, lo, hi, body, 1, &gw, 1, &gv, &out));
    nb_graph_output(g, "v", out);
    nb_tree *in = nb_tree_create(ctx);
    put(in, "w", NB_F32, 1, d);
    put(in, "v", NB_F32, 1, d);
    if (dyn) {
      put_i32(in, "lo", 3);
      put_i32(in, "hi", 11);
    }
    nb_exe *e = check_all_modes(g, in, dyn ? "fori (while)" : "fori (scan)");
    nb_exe_destroy(e);
    if (!dyn) { /* constant bounds: a scan, which reverse mode differentiates */
      static const int ax0[1] = {0};
      nb_graph *lg = nb_graph_create(ctx);
      nb_val *lw = nb_graph_input(lg, "w", f32(1, d)), *lv = nb_graph_input(lg, "v", f32(1, d)), *lout;
      CHECK_OK(ctx, nb_fori_loop(lg, nb_scalar(lg, NB_I32, 2), nb_scalar(lg, NB_I32, 9), body, 1, &lw, 1, &lv, &lout));
      nb_graph_output(lg, "loss", nb_reduce_sum(nb_mul(lout, lout), 1, ax0));
      nb_grad_opts go = {.wrt = "w"};
      nb_graph *vg = nb_value_and_grad(ctx, lg, &go);
      CHECK_MSG(vg != NULL, "grad of fori: %s", nb_ctx_error(ctx));
      if (vg) nb_exe_destroy(check_all_modes(vg, in, "grad of fori (scan)"));
      nb_graph_destroy(vg);
      nb_graph_destroy(lg);
    }
    nb_tree_destroy(in);
    nb_graph_destroy(g);
  }
  nb_graph_destroy(body);
}

/* ---------------------------------------------------------------- cond */

static void test_switch(void) {
  int64_t d[2] = {5, 7};
  nb_graph *br[3];
  for (int k = 0; k < 3; k++) {
    br[k] = nb_graph_create(ctx);
    nb_val *a = nb_graph_input(br[k], "a", f32(2, d)), *b = nb_graph_input(br[k], "b", f32(2, d));
    static const int ax1[1] = {1}, bd0[1] = {0};
    nb_val *y = k == 0 ? nb_add(a, b) : k == 1 ? nb_exp(nb_mul(a, b)) : nb_reduce_sum(nb_sub(a, b), 1, ax1);
    if (k == 2) y = nb_broadcast_in_dim(y, 2, d, bd0);
    nb_graph_output(br[k], "a_y", y);
    nb_graph_output(br[k], "b_z", nb_neg(a));
  }
  nb_graph *g = nb_graph_create(ctx);
  nb_val *idx = nb_graph_input(g, "index", nb_aval_make(NB_I32, 0, NULL));
  nb_val *ops[2] = {nb_graph_input(g, "a", f32(2, d)), nb_graph_input(g, "b", f32(2, d))}, *outs[2];
  CHECK_OK(ctx, nb_switch(g, idx, 3, (const nb_graph *const *)br, 2, ops, outs));
  nb_graph_output(g, "y", outs[0]);
  nb_graph_output(g, "z", outs[1]);
  static const int32_t idxs[] = {-1, 0, 1, 2, 7};
  for (size_t i = 0; i < sizeof idxs / sizeof *idxs; i++) {
    nb_tree *in = nb_tree_create(ctx);
    put_i32(in, "index", idxs[i]);
    put(in, "a", NB_F32, 2, d);
    put(in, "b", NB_F32, 2, d);
    char what[64];
    snprintf(what, sizeof what, "switch index %d", idxs[i]);
    nb_exe *e = check_all_modes(g, in, what);
    if (e && !env_disable()) {
      int s = control_step(e);
      CHECK_MSG(s >= 0 && nb_exe_step_body(e, (size_t)s, 2) && !nb_exe_step_body(e, (size_t)s, 3), "%s: three branches", what);
      /* only the taken branch runs */
      nb_tree *out = nb_tree_create(ctx);
      uint64_t before[3];
      nb_exe_stats bs;
      for (int k = 0; s >= 0 && k < 3; k++) {
        nb_exe_get_stats(nb_exe_step_body(e, (size_t)s, (size_t)k), &bs);
        before[k] = bs.runs;
      }
      CHECK_OK(ctx, nb_exe_run(e, in, out));
      int taken = idxs[i] < 0 ? 0 : idxs[i] > 2 ? 2 : idxs[i];
      for (int k = 0; s >= 0 && k < 3; k++) {
        nb_exe_get_stats(nb_exe_step_body(e, (size_t)s, (size_t)k), &bs);
        CHECK_MSG(bs.runs - before[k] == (k == taken), "%s: branch %d ran %llu times", what, k, (unsigned long long)(bs.runs - before[k]));
      }
      nb_tree_destroy(out);
    }
    nb_exe_destroy(e);
    nb_tree_destroy(in);
  }
  for (int k = 0; k < 3; k++) nb_graph_destroy(br[k]);
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- nesting */

/* scan over rows r of xs [L, M, N]: carry h [N]; inside, a scan over the M
 * rows of r (the rnn body), then a cond on the sign of sum(h) */
static void test_nested(void) {
  const int64_t L = 4, M = 3;
  int64_t d[1] = {N}, dr[2] = {M, N}, dx[3] = {L, M, N};
  nb_graph *inner = rnn_body(false, N);
  nb_graph *pos = nb_graph_create(ctx), *neg = nb_graph_create(ctx);
  nb_graph_output(pos, "h", nb_mul(nb_graph_input(pos, "h", f32(1, d)), nb_scalar(pos, NB_F32, 0.5)));
  nb_graph_output(neg, "h", nb_neg(nb_graph_input(neg, "h", f32(1, d))));
  nb_graph *outer = nb_graph_create(ctx);
  nb_val *c = nb_graph_input(outer, "a_c", f32(1, d)), *h = nb_graph_input(outer, "b_h", f32(1, d));
  nb_val *r = nb_graph_input(outer, "c_r", f32(2, dr)), *h2, *ys;
  nb_scan_opts so = {.length = M};
  CHECK_OK(ctx, nb_scan(outer, inner, 1, &c, 1, &h, 1, &r, &so, &h2, &ys));
  static const int ax0[1] = {0};
  nb_val *p = nb_gt(nb_reduce_sum(h2, 1, ax0), nb_scalar(outer, NB_F32, 0)), *h3;
  CHECK_OK(ctx, nb_cond(outer, p, pos, neg, 1, &h2, &h3));
  nb_graph_output(outer, "a_h", h3);
  nb_graph_output(outer, "b_y", nb_reduce_sum(ys, 1, ax0));
  nb_graph *g = nb_graph_create(ctx);
  nb_val *gc = nb_graph_input(g, "c", f32(1, d)), *gh = nb_graph_input(g, "h", f32(1, d)), *xs = nb_graph_input(g, "xs", f32(3, dx));
  nb_val *hout, *yout;
  nb_scan_opts lo = {.length = L, .reverse = true};
  CHECK_OK(ctx, nb_scan(g, outer, 1, &gc, 1, &gh, 1, &xs, &lo, &hout, &yout));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "ys", yout);
  nb_tree *in = nb_tree_create(ctx);
  put(in, "c", NB_F32, 1, d);
  put(in, "h", NB_F32, 1, d);
  put(in, "xs", NB_F32, 3, dx);
  nb_exe *e = check_all_modes(g, in, "scan in scan, cond in scan");
  if (e && !env_disable()) {
    int s = control_step(e);
    const nb_exe *b = s >= 0 ? nb_exe_step_body(e, (size_t)s, 0) : NULL;
    int n = 0;
    for (size_t i = 0; b && i < nb_exe_num_steps(b); i++) n += nb_exe_step_body(b, i, 0) != NULL;
    CHECK_MSG(n == 2, "the outer body holds %d control steps, not 2 (the inner scan and the cond)", n);
  }
  nb_exe_destroy(e);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_graph_destroy(outer);
  nb_graph_destroy(inner);
  nb_graph_destroy(pos);
  nb_graph_destroy(neg);
}

/* ---------------------------------------------------------------- grad, donation */

/* rnn_body(true, n) called as one remat region (same inputs and outputs) */
static nb_graph *remat_rnn_body(const nb_graph *inner, int64_t n) {
  nb_graph *b = nb_graph_create(ctx);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  int64_t d[1] = {n}, dw[2] = {n, n};
  nb_tree_set_val(in, "a_w", nb_graph_input(b, "a_w", f32(2, dw)));
  nb_tree_set_val(in, "b_h", nb_graph_input(b, "b_h", f32(1, d)));
  nb_tree_set_val(in, "c_x", nb_graph_input(b, "c_x", f32(1, d)));
  CHECK_OK(ctx, nb_remat_call(b, inner, in, out));
  nb_graph_output(b, "a_h", nb_tree_get_val(out, "a_h"));
  nb_graph_output(b, "b_y", nb_tree_get_val(out, "b_y"));
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return b;
}

/* loss = sum(ys) + sum(h) of the rnn scan, differentiated wrt its weights;
 * also with the body a remat region (the reverse scan recomputes it). The
 * remat region is inlined, so its product runs on sgemm, whose rounding
 * differs from the interpreter's by more than the tolerance after the
 * backward pass (6e-5 on these inputs): it is compared with the interpreter
 * with BLAS off, and bit for bit with the plain body's compiled gradient
 * (recomputing changes where values are computed, not what; checked with
 * every optimization on). */
static void test_grad_of_scan(void) {
  static const int ax0[1] = {0}, ax01[2] = {0, 1};
  static const char *const remat_modes[] = {"blas", "fuse,blas", "all"};
  nb_tree *in = scan_inputs(6, true, N), *plain = nb_tree_create(ctx);
  for (int remat = 0; remat < 2; remat++) {
    nb_graph *inner = rnn_body(true, N), *body = remat ? remat_rnn_body(inner, N) : inner;
    nb_graph *lg = nb_graph_create(ctx);
    int64_t d[1] = {N}, dw[2] = {N, N}, dx[2] = {6, N};
    nb_val *c = nb_graph_input(lg, "c", f32(2, dw)), *h = nb_graph_input(lg, "h", f32(1, d)), *xs = nb_graph_input(lg, "xs", f32(2, dx));
    nb_val *hout, *ys;
    nb_scan_opts so = {.length = 6};
    CHECK_OK(ctx, nb_scan(lg, body, 1, &c, 1, &h, 1, &xs, &so, &hout, &ys));
    nb_graph_output(lg, "loss", nb_add(nb_reduce_sum(ys, 2, ax01), nb_reduce_sum(hout, 1, ax0)));
    nb_grad_opts go = {.wrt = "c"};
    nb_graph *vg = nb_value_and_grad(ctx, lg, &go);
    CHECK_MSG(vg != NULL, "value_and_grad of a scan%s: %s", remat ? " (remat body)" : "", nb_ctx_error(ctx));
    nb_exe *e = NULL;
    if (vg && !remat) e = check_all_modes(vg, in, "grad of scan");
    for (size_t m = 0; vg && remat && m < sizeof remat_modes / sizeof *remat_modes; m++) {
      nb_jit_opts o = nb_test_jit_opts(remat_modes[m]);
      CHECK_MSG(nb_test_jit_matches(ctx, vg, in, &o, remat_modes[m], NULL), "grad of scan, remat body (%s)", remat_modes[m]);
    }
    if (vg && remat) {
      nb_jit_opts o = nb_test_jit_opts(NULL);
      e = nb_jit(ctx, vg, &o);
    }
    nb_tree *got = nb_tree_create(ctx);
    if (e) CHECK_OK(ctx, nb_exe_run(e, in, remat ? got : plain));
    /* bit for bit only with everything on (inline off runs the region on the interpreter) */
    for (size_t i = 0; e && remat && !env_disable() && i < nb_tree_size(plain); i++) {
      const char *p = nb_tree_path(plain, i);
      const nb_array *a = nb_tree_get_array(got, p), *b = nb_tree_get_array(plain, p);
      CHECK_MSG(a && !memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(b)), "grad of scan: %s with a remat body is not the plain one's", p);
    }
    nb_tree_destroy(got);
    nb_exe_destroy(e);
    nb_graph_destroy(vg);
    nb_graph_destroy(lg);
    if (body != inner) nb_graph_destroy(body);
    nb_graph_destroy(inner);
  }
  nb_tree_destroy(plain);
  nb_tree_destroy(in);
}

/* A donated initial carry: the final carry is written into its memory when
 * the input is held once, and the result is the interpreter's either way. */
static void test_donated_carry(void) {
  for (int len = 3; len <= 4; len++) { /* odd and even trip counts start in different buffers */
    nb_graph *g = scan_graph(len, false, false, N);
    static const char *const donate[] = {"h", NULL};
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.donate = donate;
    nb_exe *e = nb_jit(ctx, g, &o);
    CHECK_MSG(e != NULL, "nb_jit: %s", nb_ctx_error(ctx));
    nb_tree *ref = scan_inputs(len, false, N), *want = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_graph_run(ctx, g, ref, want));
    for (int held = 1; e && held <= 2; held++) {
      nb_tree *in = nb_tree_create(ctx), *got = nb_tree_create(ctx);
      nb_array *h0 = nb_tree_get_array(ref, "h"), *h = nb_array_empty(ctx, NB_F32, 1, (int64_t[]){N});
      memcpy(nb_array_data_mut(h), nb_array_data(h0), nb_array_nbytes(h0));
      nb_tree_set_array(in, "h", h);
      nb_tree_set_array(in, "c", nb_tree_get_array(ref, "c"));
      nb_tree_set_array(in, "xs", nb_tree_get_array(ref, "xs"));
      const void *mem = nb_array_data(h);
      if (held == 1) nb_array_release(h);
      CHECK_OK(ctx, nb_exe_run(e, in, got));
      bool taken = nb_array_data(nb_tree_get_array(got, "h")) == mem;
      if (!env_disable()) CHECK_MSG(taken == (held == 1), "len %d, held %d: donated carry %s", len, held, taken ? "taken" : "not taken");
      for (size_t i = 0; i < nb_tree_size(want); i++) {
        nb_array *a = nb_tree_get_array(got, nb_tree_path(want, i));
        CHECK_MSG(a && nb_test_max_rel_diff(a, nb_tree_leaf(want, i)->array) <= 2e-5, "len %d held %d: %s differs", len, held,
                  nb_tree_path(want, i));
      }
      if (held == 2) {
        CHECK_MSG(!memcmp(nb_array_data(h), nb_array_data(h0), nb_array_nbytes(h0)), "a carry held twice was overwritten");
        nb_array_release(h);
      }
      nb_tree_destroy(in);
      nb_tree_destroy(got);
    }
    nb_tree_destroy(ref);
    nb_tree_destroy(want);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
}

/* Stacking (what scan_layers does per parameter): a reshape that only an
 * evaluated step reads (concatenate) is its operand's memory, not a copy
 * kernel; with the operand donated and also updated by a kernel, the
 * stacked result is still the old values. */
static void test_reshape_views(void) {
  int64_t d[2] = {4, 6}, d1[3] = {1, 4, 6};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *a = nb_graph_input(g, "a", f32(2, d)), *b = nb_graph_input(g, "b", f32(2, d));
  nb_val *parts[3] = {nb_reshape(a, 3, d1), nb_reshape(b, 3, d1), nb_reshape(a, 3, d1)};
  nb_graph_output(g, "stack", nb_concatenate(3, parts, 0));
  nb_graph_output(g, "a2", nb_mul(a, nb_scalar(g, NB_F32, 2)));
  static const char *const donate[] = {"a", NULL};
  for (int m = 0; m < 2; m++) {
    nb_jit_opts o = nb_test_jit_opts(m ? "all" : NULL);
    o.donate = donate;
    nb_exe_stats s;
    nb_tree *in = nb_tree_create(ctx);
    nb_array *x = nb_test_randn(ctx, &rng, NB_F32, 2, d);
    nb_tree_set_array(in, "a", x);
    nb_array_release(x); /* held once: may be donated */
    put(in, "b", NB_F32, 2, d);
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, "reshape views", &s), "reshape views (%s)", m ? "all off" : "on");
    if (!m && !env_disable()) CHECK_MSG(s.nkernels == 1, "%zu kernels: the stacking reshapes were copied", s.nkernels);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(g);
}

/* A contiguous slice (single indices, one range, whole dims: the per-layer
 * gradients out of scan_layers' stacked ones) is its operand's memory at an
 * offset: no step; other slices are copied. */
static void test_slice_views(void) {
  int64_t d[3] = {6, 4, 5};
  static const int64_t s1[3] = {2, 0, 0}, l1[3] = {3, 4, 5}, s2[3] = {1, 1, 0}, l2[3] = {2, 3, 5}, s3[3] = {0, 0, 1}, l3[3] = {6, 4, 3};
  static const int64_t s4[3] = {3, 0, 0}, l4[3] = {6, 4, 5};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", f32(3, d)), *y = nb_exp(x);
  nb_val *a = nb_slice(y, s1, l1, NULL), *b = nb_slice(y, s2, l2, NULL), *c = nb_slice(y, s3, l3, NULL), *r = nb_slice(x, s4, l4, NULL);
  nb_graph_output(g, "a", nb_mul(a, nb_scalar(g, NB_F32, 2)));
  nb_graph_output(g, "b", nb_add(b, nb_scalar(g, NB_F32, 1)));
  nb_graph_output(g, "c", c);
  nb_graph_output(g, "r", nb_neg(r));
  nb_graph_output(g, "y", nb_sub(y, x)); /* y's memory is read through the views and by this kernel */
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", NB_F32, 3, d);
  nb_exe *e = check_all_modes(g, in, "slice views");
  if (e && !env_disable()) {
    int slices = 0;
    for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
      nb_exe_step_info si;
      if (nb_exe_step(e, i, &si) == NB_OK && !strcmp(si.name, "slice")) slices++;
    }
    CHECK_MSG(slices == 1, "%d slice steps: only the strided one is a copy", slices);
  }
  nb_exe_destroy(e);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
}

/* A y the body passes through from its x (a differentiated scan's residual
 * parameters) is the xs' memory: no copy per iteration, no buffer. */
static void test_passthrough_ys(void) {
  const int64_t L = 8, M = 4096;
  int64_t d[1] = {M}, dx[2] = {L, M};
  static const int ax01[2] = {0, 1};
  nb_graph *body = nb_graph_create(ctx);
  nb_val *h = nb_graph_input(body, "a_h", f32(1, d)), *x = nb_graph_input(body, "b_x", f32(1, d));
  nb_graph_output(body, "a_h", nb_add(h, x));
  nb_graph_output(body, "b_y", x);
  nb_graph *g = nb_graph_create(ctx);
  nb_val *gh = nb_graph_input(g, "h", f32(1, d)), *xs = nb_graph_input(g, "xs", f32(2, dx));
  nb_val *xs2 = nb_exp(xs), *hout, *ys; /* computed xs: an intermediate the ys can share */
  nb_scan_opts so = {.length = L, .reverse = true};
  CHECK_OK(ctx, nb_scan(g, body, 0, NULL, 1, &gh, 1, &xs2, &so, &hout, &ys));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "s", nb_reduce_sum(nb_mul(ys, xs2), 2, ax01));
  nb_tree *in = nb_tree_create(ctx);
  put(in, "h", NB_F32, 1, d);
  put(in, "xs", NB_F32, 2, dx);
  nb_exe *e = check_all_modes(g, in, "passthrough ys");
  if (e && !env_disable()) {
    nb_exe_stats s;
    nb_exe_get_stats(e, &s);
    CHECK_MSG(s.arena_bytes < 2 * (size_t)(L * M) * sizeof(float), "arena %zu bytes: ys has a buffer of its own", s.arena_bytes);
  }
  nb_exe_destroy(e);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_graph_destroy(body);
}

int main(void) {
  ctx = nb_ctx_create();
  test_scan();
  test_scan_is_a_loop();
  test_scan_bitwise_unrolled();
  test_while();
  test_fori();
  test_switch();
  test_nested();
  test_grad_of_scan();
  test_donated_carry();
  test_reshape_views();
  test_passthrough_ys();
  test_slice_views();
  nb_ctx_destroy(ctx);
  return nb_test_summary("jit_control");
}
