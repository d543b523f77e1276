/* dot_general through nb_jit's BLAS steps against the interpreter: random
 * dimension numbers with batch, contracting and free dims in every position
 * of both operands, every float dtype for the operands and the result
 * (bf16/f16 packed to f32), degenerate extents 0 and 1, one and two threads
 * (batches split over the pool), the attention layouts the GPT-2 model
 * traces, and everything off. Every float dot must become a BLAS step.
 * Epilogues (bias, activation, residual) after a dot: one fused kernel
 * that reads the dot's result once. */
#include "jitcheck.h"
#include "nabla/nn.h"

static nb_ctx *ctx;
static nb_test_rng rng = {20261125};
static bool env_off; /* $NABLA_JIT_DISABLE set: only results are checked, not the plan */

typedef struct dot_case {
  int lr, rr;
  int64_t ld[NB_MAX_RANK], rd[NB_MAX_RANK];
  nb_dot_dims dn;
} dot_case;

/* places n roles (0 batch, 1 contract, 2 free) at random positions */
static void shuffle(int *a, int n) {
  for (int i = n - 1; i > 0; i--) {
    int j = (int)nb_test_int(&rng, 0, i), t = a[i];
    a[i] = a[j], a[j] = t;
  }
}

static int64_t extent(void) {
  int64_t r = nb_test_int(&rng, 0, 19);
  return r == 0 ? 0 : r < 4 ? 1 : nb_test_int(&rng, 2, 7);
}

static void side(int nb, int nc, int nf, const int64_t *bext, const int64_t *cext, int *rank, int64_t *dims, int *batch,
                 int *con) {
  int pos[NB_MAX_RANK];
  *rank = nb + nc + nf;
  for (int i = 0; i < *rank; i++) pos[i] = i;
  shuffle(pos, *rank);
  for (int i = 0; i < nb; i++) batch[i] = pos[i], dims[pos[i]] = bext[i];
  for (int i = 0; i < nc; i++) con[i] = pos[nb + i], dims[pos[nb + i]] = cext[i];
  for (int i = nb + nc; i < *rank; i++) dims[pos[i]] = extent();
}

static dot_case random_case(void) {
  dot_case c;
  memset(&c, 0, sizeof c);
  int nb = (int)nb_test_int(&rng, 0, 2), nc = (int)nb_test_int(&rng, 0, 2);
  int lf = (int)nb_test_int(&rng, 0, 2), rf = (int)nb_test_int(&rng, 0, 2);
  int64_t bext[NB_MAX_RANK], cext[NB_MAX_RANK];
  for (int i = 0; i < nb; i++) bext[i] = extent();
  for (int i = 0; i < nc; i++) cext[i] = extent();
  c.dn.n_batch = nb, c.dn.n_contract = nc;
  side(nb, nc, lf, bext, cext, &c.lr, c.ld, c.dn.lhs_batch, c.dn.lhs_contract);
  side(nb, nc, rf, bext, cext, &c.rr, c.rd, c.dn.rhs_batch, c.dn.rhs_contract);
  return c;
}

static void add_input(nb_tree *in, const char *path, nb_dtype t, int rank, const int64_t *dims) {
  nb_test_set_randn(in, &rng, path, t, rank, dims);
}

/* y = dot(a, b) as an output, and tanh(y) so that the dot also writes an
 * arena buffer; checks jit == interpreter with everything on (one BLAS
 * step) at 1 and 2 threads and with everything off. */
static void check(const dot_case *c, nb_dtype t, nb_dtype out, const char *what) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *a = nb_graph_input(g, "a", nb_aval_make(t, c->lr, c->ld)), *b = nb_graph_input(g, "b", nb_aval_make(t, c->rr, c->rd));
  nb_val *y = nb_dot_general(a, b, &c->dn, out);
  nb_graph_output(g, "y", y);
  nb_graph_output(g, "z", nb_tanh(y));
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s: %s", what, nb_graph_error(g));
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "a", t, c->lr, c->ld);
  add_input(in, "b", t, c->rr, c->rd);
  char name[160];
  for (int threads = 1; threads <= 2; threads++) {
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.threads = threads;
    nb_exe_stats s;
    snprintf(name, sizeof name, "%s %s->%s, %d threads", what, nb_dtype_name(t), nb_dtype_name(out), threads);
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, &s), "%s", name);
    CHECK_MSG(env_off || (s.nblas == 1 && s.neval == 0), "%s: %zu blas steps, %zu evals", name, s.nblas, s.neval);
  }
  nb_jit_opts o = nb_test_jit_opts("all");
  snprintf(name, sizeof name, "%s %s->%s, all off", what, nb_dtype_name(t), nb_dtype_name(out));
  CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, NULL), "%s", name);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
}

static void test_random(void) {
  static const nb_dtype pairs[][2] = {{NB_F32, NB_F32}, {NB_F64, NB_F64}, {NB_BF16, NB_F32}, {NB_BF16, NB_BF16},
                                      {NB_F16, NB_F16}, {NB_F32, NB_F64}, {NB_F64, NB_F32}};
  for (int i = 0; i < 60; i++) {
    dot_case c = random_case();
    const nb_dtype *p = pairs[i % (sizeof pairs / sizeof *pairs)];
    char what[32];
    snprintf(what, sizeof what, "random case %d", i);
    check(&c, p[0], p[1], what);
  }
}

/* The layouts GPT-2's attention traces (q as [B,T,H,1,hd] against k, v as
 * [B,H,T,hd]; see docs/compiler.md), forward and backward, small sizes but
 * batches large enough to split over two threads. */
static void test_attention_layouts(void) {
  enum { B = 2, H = 3, T = 8, D = 4 };
  static const dot_case cases[] = {
      /* scores: [B,T,H,1,D] x [B,H,T,D] -> [B,H,T,1,T] */
      {5, 4, {B, T, H, 1, D}, {B, H, T, D}, {.n_batch = 2, .n_contract = 1, .lhs_batch = {0, 2}, .rhs_batch = {0, 1}, .lhs_contract = {4}, .rhs_contract = {3}}},
      /* probs x v: [B,H,T,1,T] x [B,H,T,D] -> [B,H,T,1,D] */
      {5, 4, {B, H, T, 1, T}, {B, H, T, D}, {.n_batch = 2, .n_contract = 1, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}, .lhs_contract = {4}, .rhs_contract = {2}}},
      /* dv: [B,H,T,1,D] x [B,H,T,1,T] contracting (T,1) -> [B,H,D,T] */
      {5, 5, {B, H, T, 1, D}, {B, H, T, 1, T}, {.n_batch = 2, .n_contract = 2, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}, .lhs_contract = {2, 3}, .rhs_contract = {2, 3}}},
      /* dk: [B,H,T,1,T] x [B,T,H,1,D] -> [B,H,T,D] */
      {5, 5, {B, H, T, 1, T}, {B, T, H, 1, D}, {.n_batch = 2, .n_contract = 2, .lhs_batch = {0, 1}, .rhs_batch = {0, 2}, .lhs_contract = {2, 3}, .rhs_contract = {1, 3}}},
      /* dW = X^T dY over [B,T,C] -> [C,F] */
      {3, 3, {B, T, 5}, {B, T, 6}, {.n_contract = 2, .lhs_contract = {0, 1}, .rhs_contract = {0, 1}}},
      /* dX = dY W^T: [B,T,F] x [C,F] -> [B,T,C] */
      {3, 2, {B, T, 6}, {5, 6}, {.n_contract = 1, .lhs_contract = {2}, .rhs_contract = {1}}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char what[32];
    snprintf(what, sizeof what, "layout %zu", i);
    check(&cases[i], NB_F32, NB_F32, what);
    check(&cases[i], NB_BF16, NB_F32, what);
  }
}

/* Extents of 0 and 1 everywhere, and a batch dim between the free dims
 * (the operand must be packed). */
static void test_degenerate(void) {
  static const dot_case cases[] = {
      {2, 2, {0, 3}, {3, 4}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {2, 0}, {0, 4}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {1, 1}, {1, 1}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {1, 1, {5}, {5}, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {0}}},
      {1, 1, {3}, {4}, {.n_contract = 0}},
      {3, 2, {2, 0, 3}, {0, 3}, {.n_batch = 1, .n_contract = 1, .lhs_batch = {1}, .rhs_batch = {0}, .lhs_contract = {2}, .rhs_contract = {1}}},
      {4, 3, {3, 2, 4, 5}, {2, 5, 6}, {.n_batch = 1, .n_contract = 1, .lhs_batch = {1}, .rhs_batch = {0}, .lhs_contract = {3}, .rhs_contract = {1}}},
      {3, 3, {5, 1, 7}, {7, 1, 2}, {.n_batch = 1, .n_contract = 1, .lhs_batch = {1}, .rhs_batch = {1}, .lhs_contract = {2}, .rhs_contract = {0}}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char what[32];
    snprintf(what, sizeof what, "degenerate %zu", i);
    check(&cases[i], NB_F32, NB_F32, what);
    check(&cases[i], NB_BF16, NB_BF16, what);
  }
}

/* One item split into tiles of the result over the pool; a batch of items
 * split into tiles too. Every transpose combination, sides not a multiple
 * of a tile. */
static void test_blocks(void) {
  static const dot_case cases[] = {
      {2, 2, {300, 230}, {230, 261}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {230, 300}, {261, 230}, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {1}}},
      {2, 2, {300, 9}, {9, 7}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {9, 300}, {7, 9}, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {1}}},
      {2, 2, {7, 9}, {9, 301}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {9, 7}, {301, 9}, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {1}}},
      {3, 3, {2, 260, 5}, {2, 5, 3}, {.n_batch = 1, .n_contract = 1, .lhs_batch = {0}, .rhs_batch = {0}, .lhs_contract = {2}, .rhs_contract = {1}}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char what[32];
    snprintf(what, sizeof what, "blocks %zu", i);
    check(&cases[i], NB_F32, NB_F32, what);
    check(&cases[i], NB_F64, NB_F64, what);
  }
}

/* The same product at 1, 2, 3, 4 and 7 threads gives the same bits: tiles
 * are cut by the shape alone (OpenBLAS's edge kernels and its threaded path
 * sum in another order when a product is split otherwise, which made the
 * trainer's gradients depend on the thread count). Shapes above and below
 * the sizes that were once split by the thread count, every transpose, a
 * batch, f32 and f64. */
static void test_thread_invariance(void) {
  static const dot_case cases[] = {
      {2, 2, {333, 999}, {999, 777}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {999, 333}, {777, 999}, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {1}}},
      {2, 2, {100, 50}, {50, 300}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {1, 768}, {768, 1000}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {2, 2, {520, 64}, {64, 40}, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {3, 3, {3, 200, 70}, {3, 70, 150}, {.n_batch = 1, .n_contract = 1, .lhs_batch = {0}, .rhs_batch = {0}, .lhs_contract = {2}, .rhs_contract = {1}}},
  };
  static const nb_dtype types[] = {NB_F32, NB_F64};
  static const int threads[] = {2, 3, 4, 7};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (size_t ti = 0; ti < 2; ti++) {
      const dot_case *c = &cases[i];
      nb_dtype t = types[ti];
      nb_graph *g = nb_graph_create(ctx);
      nb_val *a = nb_graph_input(g, "a", nb_aval_make(t, c->lr, c->ld)), *b = nb_graph_input(g, "b", nb_aval_make(t, c->rr, c->rd));
      nb_graph_output(g, "y", nb_dot_general(a, b, &c->dn, t));
      nb_tree *in = nb_tree_create(ctx), *want = nb_tree_create(ctx);
      add_input(in, "a", t, c->lr, c->ld);
      add_input(in, "b", t, c->rr, c->rd);
      nb_jit_opts o = nb_test_jit_opts(NULL);
      o.threads = 1;
      nb_exe *e = nb_jit(ctx, g, &o);
      CHECK_OK(ctx, e ? nb_exe_run(e, in, want) : nb_ctx_status(ctx));
      nb_exe_destroy(e);
      for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
        o.threads = threads[k];
        nb_tree *got = nb_tree_create(ctx);
        e = nb_jit(ctx, g, &o);
        CHECK_OK(ctx, e ? nb_exe_run(e, in, got) : nb_ctx_status(ctx));
        nb_array *x = nb_tree_get_array(want, "y"), *y = nb_tree_get_array(got, "y");
        CHECK_MSG(x && y && memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(x)) == 0,
                  "thread invariance case %zu %s: %d threads differ from 1", i, nb_dtype_name(t), threads[k]);
        nb_exe_destroy(e);
        nb_tree_destroy(got);
      }
      nb_tree_destroy(want);
      nb_tree_destroy(in);
      nb_graph_destroy(g);
    }
}

/* y = act(dot(x, w) + b) (+ r): x [(G,) M, K] or its transpose, w [K, N]
 * or [N, K], b [N], r like y. One BLAS step and one kernel. */
static void test_epilogues(void) {
  for (int i = 0; i < 24; i++) {
    int64_t G = nb_test_int(&rng, 1, 3), M = nb_test_int(&rng, 1, 40), N = nb_test_int(&rng, 1, 40), K = nb_test_int(&rng, 1, 40);
    bool batch = nb_test_int(&rng, 0, 1), xt = nb_test_int(&rng, 0, 1), wt = nb_test_int(&rng, 0, 1), res = nb_test_int(&rng, 0, 1);
    nb_nn_act act = (nb_nn_act)(i % NB_NN_ACT_COUNT);
    int xr = batch ? 3 : 2, o = batch ? 1 : 0;
    int64_t xd[3] = {G, 0, 0}, wd[2] = {wt ? N : K, wt ? K : N}, yd[3] = {G, M, N};
    xd[o] = xt ? K : M, xd[o + 1] = xt ? M : K;
    nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {xt ? o : o + 1}, .rhs_contract = {wt ? 1 : 0}};
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, xr, xd)), *w = nb_graph_input(g, "w", nb_aval_make(NB_F32, 2, wd));
    nb_val *b = nb_graph_input(g, "b", nb_aval_make(NB_F32, 1, &N));
    nb_val *y = nb_dot_general(x, w, &dn, NB_F32);
    nb_val *z = nb_nn_activation(nb_add(y, nb_broadcast_to(b, xr, batch ? yd : yd + 1)), act);
    if (res) z = nb_add(z, nb_graph_input(g, "r", nb_aval_make(NB_F32, xr, batch ? yd : yd + 1)));
    nb_graph_output(g, "z", z);
    CHECK_MSG(nb_graph_status(g) == NB_OK, "epilogue %d: %s", i, nb_graph_error(g));
    nb_tree *in = nb_tree_create(ctx);
    add_input(in, "x", NB_F32, xr, xd);
    add_input(in, "w", NB_F32, 2, wd);
    add_input(in, "b", NB_F32, 1, &N);
    if (res) add_input(in, "r", NB_F32, xr, batch ? yd : yd + 1);
    char name[96];
    snprintf(name, sizeof name, "epilogue %d (%s%s)", i, nb_nn_act_name(act), res ? ", residual" : "");
    nb_jit_opts op = nb_test_jit_opts(NULL);
    nb_exe_stats s;
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &op, name, &s), "%s", name);
    CHECK_MSG(env_off || (s.nblas == 1 && s.nkernels == 1 && s.neval == 0), "%s: %zu blas, %zu kernels, %zu evals", name, s.nblas, s.nkernels,
              s.neval);
    op = nb_test_jit_opts("all");
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &op, name, NULL), "%s, all off", name);
    nb_tree_destroy(in);
    nb_graph_destroy(g);
  }
}

int main(void) {
  ctx = nb_ctx_create();
  env_off = getenv("NABLA_JIT_DISABLE") && *getenv("NABLA_JIT_DISABLE");
  test_degenerate();
  test_attention_layouts();
  test_random();
  test_blocks();
  test_thread_invariance();
  test_epilogues();
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_dot");
}
