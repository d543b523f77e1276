/* remat and custom_vjp through nb_jit: the simplifier inlines remat_call,
 * remat_lin and custom_vjp_call, so their bodies are compiled (no evaluated
 * step for a call primitive or a barrier), the value and gradient match the
 * interpreter, the compiled plan still recomputes a remat region in the
 * backward pass (more FLOPs, a lower peak than without remat: the barriers
 * keep the recomputation from being merged with the forward pass), and a
 * custom_vjp's own bwd (deliberately not the true gradient) is what the
 * compiled gradient runs. Forward mode over remat regions (remat_lin) too.
 * An optimization barrier over reductions whose results a later
 * elementwise op reads (the trainer's per-micro-batch gradients) matches
 * the interpreter. */
#include <math.h>

#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {2024};
enum { B = 256, N = 32, LAYERS = 4 };

static void put(nb_tree *t, const char *path, int rank, const int64_t *dims) {
  nb_array *a = nb_test_randn(ctx, &rng, NB_F32, rank, dims);
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

/* The plan is checked only with every optimization on ($NABLA_JIT_DISABLE
 * or another backend may turn inlining or native code off). */
static bool plan_checked(void) {
  const char *env = getenv("NABLA_JIT_DISABLE"), *bk = getenv("NABLA_BACKEND");
  return !(env && *env) && !(bk && *bk && strcmp(bk, "cpu"));
}

static bool is_call_prim(const char *name) {
  static const char *const calls[] = {"remat_call", "remat_lin", "custom_vjp_call", "custom_lin", "barrier"};
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
    if (!strcmp(name, calls[i])) return true;
  return false;
}

/* No step of e evaluates a call primitive; *flops: the plan's model FLOPs. */
static bool no_call_steps(const nb_exe *e, double *flops) {
  bool ok = true;
  *flops = 0;
  for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info s;
    if (nb_exe_step(e, i, &s) != NB_OK) return false;
    *flops += s.flops;
    if (s.kind == NB_EXE_STEP_EVAL && is_call_prim(s.name)) {
      fprintf(stderr, "  step %zu evaluates %s\n", i, s.name);
      ok = false;
    }
  }
  return ok;
}

/* ---------------------------------------------------------------- remat */

/* One block: three layers tanh(h w) on a batch of B rows (activations much
 * larger than the weights), whose outputs are residuals of the backward
 * pass unless the block is recomputed. */
static nb_status block(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *h = nb_tree_get_val(in, "h"), *w1 = nb_tree_get_val(in, "w1"), *w2 = nb_tree_get_val(in, "w2");
  h = nb_tanh(nb_matmul(h, w1));
  h = nb_tanh(nb_matmul(h, w2));
  return nb_tree_set_val(out, "h", nb_tanh(nb_matmul(h, w1)));
}

/* LAYERS blocks (u != NULL: each one remat region), loss = mean(h^2). */
static nb_status net(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *c = nb_graph_ctx(g);
  nb_tree *spec = nb_tree_create(c);
  nb_tree_set(spec, "h", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "x"))));
  nb_tree_set(spec, "w1", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "w1"))));
  nb_tree_set(spec, "w2", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "w2"))));
  nb_graph *body = nb_trace(c, block, NULL, spec);
  nb_val *h = nb_tree_get_val(in, "x");
  nb_status st = body ? NB_OK : nb_ctx_status(c);
  for (int l = 0; st == NB_OK && l < LAYERS; l++) {
    nb_tree *args = nb_tree_create(c), *res = nb_tree_create(c);
    nb_tree_set_val(args, "h", h);
    nb_tree_set_val(args, "w1", nb_tree_get_val(in, "w1"));
    nb_tree_set_val(args, "w2", nb_tree_get_val(in, "w2"));
    st = u ? nb_remat_call(g, body, args, res) : nb_graph_call(g, body, args, res);
    if (st == NB_OK) h = nb_tree_get_val(res, "h");
    nb_tree_destroy(args);
    nb_tree_destroy(res);
  }
  /* scaled so that the gradients' rounding stays within the f32 tolerance */
  nb_val *scale = nb_scalar(g, NB_F32, 1.0 / (B * N));
  if (st == NB_OK) st = nb_tree_set_val(out, "loss", nb_mul(nb_reduce_sum(nb_mul(h, h), 0, NULL), scale));
  nb_graph_destroy(body);
  nb_tree_destroy(spec);
  return st;
}

/* x, w1, w2; small weights keep tanh away from saturation (where 1 - y^2
 * is all rounding and the derivatives ~0) */
static nb_tree *net_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", 2, (int64_t[]){B, N});
  put(in, "w1", 2, (int64_t[]){N, N});
  put(in, "w2", 2, (int64_t[]){N, N});
  for (int k = 0; k < 2; k++) {
    nb_array *w = nb_tree_get_array(in, k ? "w2" : "w1");
    float *p = nb_array_data_mut(w);
    for (int64_t i = 0; i < nb_array_size(w); i++) p[i] *= 0.3f;
  }
  return in;
}

static void test_remat(void) {
  nb_tree *in = net_inputs();
  nb_exe_stats stats[2];
  double flops[2] = {0, 0};
  nb_tree *got[2] = {NULL, NULL};
  for (int remat = 0; remat < 2; remat++) {
    nb_graph *g = nb_trace(ctx, net, remat ? (void *)1 : NULL, in);
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, NULL) : NULL;
    CHECK_MSG(vg != NULL, "value_and_grad: %s", nb_ctx_error(ctx));
    if (!vg) {
      nb_graph_destroy(g);
      continue;
    }
    static const char *const modes[] = {NULL, "inline", "fuse", "all"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
      char what[96];
      snprintf(what, sizeof what, "%s (%s)", remat ? "remat" : "plain", modes[m] ? modes[m] : "on");
      nb_jit_opts o = nb_test_jit_opts(modes[m]);
      CHECK_MSG(nb_test_jit_matches(ctx, vg, in, &o, what, NULL), "%s", what);
    }
    nb_jit_opts o = nb_test_jit_opts(NULL);
    nb_exe *e = nb_jit(ctx, vg, &o);
    CHECK_MSG(e != NULL, "nb_jit: %s", nb_ctx_error(ctx));
    if (e) {
      nb_exe_get_stats(e, &stats[remat]);
      if (plan_checked()) CHECK_MSG(no_call_steps(e, &flops[remat]), "%s: a call primitive runs on the interpreter", remat ? "remat" : "plain");
      got[remat] = nb_tree_create(ctx);
      CHECK_OK(ctx, nb_exe_run(e, in, got[remat]));
    }
    nb_exe_destroy(e);
    nb_graph_destroy(vg);
    nb_graph_destroy(g);
  }
  /* remat changes where values are computed, not what: the same loss and
   * gradients (not bit for bit: w1's two uses per block are summed per
   * region with remat, across the network without) */
  for (size_t i = 0; got[0] && got[1] && i < nb_tree_size(got[0]); i++) {
    const char *p = nb_tree_path(got[0], i);
    double d = nb_test_max_rel_diff(nb_tree_get_array(got[1], p), nb_tree_get_array(got[0], p));
    CHECK_MSG(d <= nb_test_jit_tol(NB_F32), "%s: remat differs from plain by %g", p, d);
  }
  if (plan_checked() && got[0] && got[1]) {
    /* the recomputation survived simplification and fusion: the backward
     * pass runs each block's products again, and keeps only block inputs */
    CHECK_MSG(flops[1] > flops[0] * 1.2, "remat %.3g flops vs plain %.3g: the block is not recomputed", flops[1], flops[0]);
    CHECK_MSG(stats[1].peak_bytes < stats[0].peak_bytes, "peak with remat %zu bytes, without %zu", stats[1].peak_bytes,
              stats[0].peak_bytes);
  }
  nb_tree_destroy(got[0]);
  nb_tree_destroy(got[1]);
  nb_tree_destroy(in);
}

/* Forward mode over remat regions (remat_lin, inlined as its jvp graph). */
static void test_remat_jvp(void) {
  nb_tree *in = net_inputs();
  nb_graph *g = nb_trace(ctx, net, (void *)1, in);
  nb_graph *jg = g ? nb_jvp(ctx, g) : NULL;
  CHECK_MSG(jg != NULL, "jvp: %s", nb_ctx_error(ctx));
  nb_tree *jin = nb_tree_create(ctx);
  nb_tree_merge(jin, "primal", in);
  nb_tree_merge(jin, "tangent", in);
  static const char *const modes[] = {NULL, "inline", "all"};
  for (size_t m = 0; jg && m < sizeof modes / sizeof *modes; m++) {
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    CHECK_MSG(nb_test_jit_matches(ctx, jg, jin, &o, modes[m] ? modes[m] : "on", NULL), "jvp of remat (%s)", modes[m] ? modes[m] : "on");
  }
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = jg ? nb_jit(ctx, jg, &o) : NULL;
  double fl;
  if (e && plan_checked()) CHECK_MSG(no_call_steps(e, &fl), "jvp of remat: a call primitive runs on the interpreter");
  nb_exe_destroy(e);
  nb_tree_destroy(jin);
  nb_tree_destroy(in);
  nb_graph_destroy(jg);
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- custom_vjp */

/* fwd softplus(x) = log1p(exp(x)); bwd 3x the true gradient, so that the
 * test tells that bwd was used. */
static nb_status softplus(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_log1p(nb_exp(nb_tree_get_val(in, "x"))));
}
static nb_status softplus_bwd(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *ct = nb_tree_get_val(in, "ct/y");
  return nb_tree_set_val(out, "grad/x", nb_mul(nb_mul(ct, nb_logistic(x)), nb_full_like(x, 3)));
}
static nb_status f_custom(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_ctx *c = nb_graph_ctx(g);
  nb_tree *bspec = nb_tree_copy(in);
  nb_tree_set(bspec, "ct/y", nb_leaf_aval(nb_val_aval(nb_tree_get_val(in, "x"))));
  nb_graph *fwd = nb_trace(c, softplus, NULL, in), *bwd = nb_trace(c, softplus_bwd, NULL, bspec);
  nb_tree *res = nb_tree_create(c);
  nb_status st = fwd && bwd ? nb_custom_vjp_call(g, fwd, bwd, in, res) : NB_ERR_INTERNAL;
  if (st == NB_OK) st = nb_tree_set_val(out, "loss", nb_reduce_sum(nb_tree_get_val(res, "y"), 0, NULL));
  nb_tree_destroy(res);
  nb_tree_destroy(bspec);
  nb_graph_destroy(fwd);
  nb_graph_destroy(bwd);
  return st;
}

static void test_custom_vjp(void) {
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", 1, (int64_t[]){37});
  nb_graph *g = nb_trace(ctx, f_custom, NULL, in);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, NULL) : NULL;
  CHECK_MSG(vg != NULL, "value_and_grad: %s", nb_ctx_error(ctx));
  static const char *const modes[] = {NULL, "inline", "all"};
  for (size_t m = 0; vg && m < sizeof modes / sizeof *modes; m++) {
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    CHECK_MSG(nb_test_jit_matches(ctx, vg, in, &o, modes[m] ? modes[m] : "on", NULL), "custom_vjp (%s)", modes[m] ? modes[m] : "on");
  }
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = vg ? nb_jit(ctx, vg, &o) : NULL;
  CHECK_MSG(e != NULL, "nb_jit: %s", nb_ctx_error(ctx));
  if (e) {
    double fl;
    if (plan_checked()) CHECK_MSG(no_call_steps(e, &fl), "custom_vjp: a call primitive runs on the interpreter");
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_exe_run(e, in, out));
    const nb_array *x = nb_tree_get_array(in, "x"), *gx = nb_tree_get_array(out, "grad/x");
    double total = 0, worst = 0;
    for (int64_t i = 0; gx && i < nb_array_size(x); i++) {
      double xi = nb_array_get(x, i);
      total += log1p(exp(xi));
      double d = fabs(nb_array_get(gx, i) - 3 / (1 + exp(-xi)));
      worst = d > worst ? d : worst;
    }
    CHECK_MSG(gx && worst < 1e-5, "grad/x is not bwd's (off by %g)", worst);
    CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "loss"), 0), total, 1e-4);
    nb_tree_destroy(out);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- optimization barrier */

/* y = (sum x^2 + sum sin x + sum of x's rows) / 2 with the sums behind one
 * barrier: the barrier's results are the sums' memory, and the add that
 * reads them must not join the kernel that computes them (it would read
 * that memory before the kernel wrote it). */
static nb_status f_barrier(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *m = nb_tree_get_val(in, "m");
  nb_val *v[3] = {nb_reduce_sum(nb_mul(x, x), 0, NULL), nb_reduce_sum(nb_sin(x), 0, NULL), nb_reduce_sum(m, 0, NULL)};
  nb_status s = nb_optimization_barrier_at(NB_HERE, 3, v);
  if (!s) s = nb_tree_set_val(out, "y", nb_mul(nb_add(nb_add(v[0], v[1]), nb_reduce_sum(v[2], 0, NULL)), nb_scalar(g, NB_F32, 0.5)));
  if (!s) s = nb_tree_set_val(out, "rows", nb_add(v[2], v[0]));
  return s;
}

static void test_barrier(void) {
  nb_tree *in = nb_tree_create(ctx);
  put(in, "x", 1, (int64_t[]){37});
  put(in, "m", 2, (int64_t[]){5, 37});
  nb_graph *g = nb_trace(ctx, f_barrier, NULL, in);
  CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
  static const char *const modes[] = {NULL, "inline", "all"};
  for (size_t m = 0; g && m < sizeof modes / sizeof *modes; m++) {
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, modes[m] ? modes[m] : "on", NULL), "barrier (%s)", modes[m] ? modes[m] : "on");
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

int main(void) {
  ctx = nb_ctx_create();
  test_remat();
  test_remat_jvp();
  test_custom_vjp();
  test_barrier();
  nb_ctx_destroy(ctx);
  return nb_test_summary("jit_remat");
}
