/* nb_jit: fused patterns (elementwise chains, softmax, layer norm,
 * cross-entropy, layouts, column and full reductions, every dtype) against
 * the interpreter with optimizations on and off, the simplification passes,
 * the memory and disk caches, donation, buffer reuse, the interpreter
 * fallback, step statistics, BLAS (when dot_general exists) and misuse. */
#include "core/prims/params.h"
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {12345};
/* false when $NABLA_JIT_DISABLE turns switches off for the whole suite: the
 * checks of the plan's shape (kernel counts, donation, reuse) are skipped */
static bool plan_on;

static nb_tree *inputs1(nb_dtype t, int rank, const int64_t *dims) {
  nb_tree *in = nb_tree_create(ctx);
  nb_array *a = nb_test_randn(ctx, &rng, t, rank, dims);
  nb_tree_set_array(in, "x", a);
  nb_array_release(a);
  return in;
}

static void add_input(nb_tree *in, const char *path, nb_dtype t, int rank, const int64_t *dims) {
  nb_test_set_randn(in, &rng, path, t, rank, dims);
}

static size_t kernels_of(const nb_graph *g, const char *disable) {
  nb_jit_opts o = nb_test_jit_opts(disable);
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_exe_stats s = {0};
  nb_exe_get_stats(e, &s);
  if (getenv("NABLA_TEST_VERBOSE")) nb_exe_print(e, stderr);
  nb_exe_destroy(e);
  return s.nkernels;
}

/* Checks g on `in` with everything on, with fusion off and with all off. */
static void check_all_ways(const char *what, const nb_graph *g, const nb_tree *in) {
  static const char *const modes[] = {NULL, "fuse", "all"};
  for (int m = 0; m < 3; m++) {
    nb_jit_opts o = nb_test_jit_opts(modes[m]);
    char name[200];
    snprintf(name, sizeof name, "%s [off: %s]", what, modes[m] ? modes[m] : "none");
    CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, NULL), "%s", name);
  }
}

/* ---------------------------------------------------------------- traced functions */

static nb_status f_chain(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *y = nb_tree_get_val(in, "y");
  nb_val *z = nb_add(nb_mul(x, y), nb_scalar(g, nb_val_dtype(x), 1.5));
  z = nb_max(nb_tanh(z), nb_neg(nb_abs(y)));
  z = nb_div(nb_exp(nb_sub(z, x)), nb_add(nb_mul(y, y), nb_scalar(g, nb_val_dtype(x), 1)));
  return nb_tree_set_val(out, "z", z);
}

static nb_val *softmax(nb_val *x, int axis) {
  int ax[1] = {axis};
  nb_val *m = nb_reduce_max(x, 1, ax);
  int r = nb_val_rank(x);
  int64_t dims[NB_MAX_RANK];
  int bd[NB_MAX_RANK];
  for (int i = 0, k = 0; i < r; i++) {
    dims[i] = nb_val_dim(x, i);
    if (i != axis) bd[k++] = i;
  }
  nb_val *e = nb_exp(nb_sub(x, nb_broadcast_in_dim(m, r, dims, bd)));
  nb_val *s = nb_reduce_sum(e, 1, ax);
  return nb_div(e, nb_broadcast_in_dim(s, r, dims, bd));
}

static nb_status f_softmax(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", softmax(nb_tree_get_val(in, "x"), *(int *)u));
}

static nb_status f_layernorm(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *gamma = nb_tree_get_val(in, "gamma"), *beta = nb_tree_get_val(in, "beta");
  int ax[1] = {1};
  int64_t dims[2] = {nb_val_dim(x, 0), nb_val_dim(x, 1)};
  double n = (double)dims[1];
  nb_val *mean = nb_div(nb_reduce_sum(x, 1, ax), nb_scalar(g, NB_F32, n));
  int64_t col[2] = {dims[0], 1};
  nb_val *xc = nb_sub(x, nb_reshape(mean, 2, col));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *rstd = nb_rsqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5)));
  nb_val *y = nb_add(nb_mul(nb_mul(xc, nb_reshape(rstd, 2, col)), gamma), beta);
  nb_tree_set_val(out, "y", y);
  return nb_tree_set_val(out, "rstd", rstd);
}

/* softmax and layer norm with their statistics as outputs too, also read
 * by a reduction of another domain, as inside value_and_grad (the backward
 * pass reads them, so they are materialized): still one row kernel each,
 * the statistics computed as earlier phases and the later values joining
 * their kernel, plus one kernel for the totals */
/* Softmax over the last axis of x (rank 2, or any: attention's scores
 * [batch, heads, queries, kv group, keys] have a size-1 axis). */
static nb_status f_softmax_stats(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)u;
  nb_val *x = nb_tree_get_val(in, "x");
  int r = nb_val_rank(x), ax[1] = {r - 1}, kept[NB_MAX_RANK], all[NB_MAX_RANK];
  int64_t dims[NB_MAX_RANK];
  for (int d = 0; d < r; d++) dims[d] = nb_val_dim(x, d), kept[d] = all[d] = d;
  nb_val *m = nb_reduce_max(x, 1, ax);
  nb_val *e = nb_exp(nb_sub(x, nb_broadcast_in_dim(m, r, dims, kept)));
  nb_val *sum = nb_reduce_sum(e, 1, ax);
  nb_tree_set_val(out, "max", m);
  nb_tree_set_val(out, "exp", e);
  nb_tree_set_val(out, "sum", sum);
  /* read in another domain too: materialized, as in a backward pass */
  nb_tree_set_val(out, "max_total", nb_reduce_sum(m, r - 1, all));
  nb_tree_set_val(out, "sum_total", nb_reduce_sum(sum, r - 1, all));
  return nb_tree_set_val(out, "y", nb_div(e, nb_broadcast_in_dim(sum, r, dims, kept)));
}

static nb_status f_layernorm_stats(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  int ax[1] = {1};
  int64_t dims[2] = {nb_val_dim(x, 0), nb_val_dim(x, 1)}, col[2] = {dims[0], 1};
  double n = (double)dims[1];
  nb_val *mean = nb_div(nb_reduce_sum(x, 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *xc = nb_sub(x, nb_reshape(mean, 2, col));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *rstd = nb_rsqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5)));
  nb_tree_set_val(out, "mean", mean);
  nb_tree_set_val(out, "rstd", rstd);
  nb_tree_set_val(out, "mean_total", nb_reduce_sum(mean, 1, (int[]){0}));
  nb_tree_set_val(out, "rstd_total", nb_reduce_sum(rstd, 1, (int[]){0}));
  return nb_tree_set_val(out, "xhat", nb_mul(xc, nb_reshape(rstd, 2, col)));
}

/* mean over the batch of logsumexp(logits) - logits[label] */
static nb_status f_xent(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *label = nb_tree_get_val(in, "label");
  int ax[1] = {1};
  int64_t dims[2] = {nb_val_dim(x, 0), nb_val_dim(x, 1)};
  nb_val *m = nb_stop_gradient(nb_reduce_max(x, 1, ax));
  nb_val *mb = nb_broadcast_in_dim(m, 2, dims, (int[]){0});
  nb_val *lse = nb_add(nb_log(nb_reduce_sum(nb_exp(nb_sub(x, mb)), 1, ax)), m);
  nb_val *onehot = nb_convert(nb_eq(nb_iota(g, NB_I32, 2, dims, 1), nb_broadcast_in_dim(label, 2, dims, (int[]){0})), NB_F32);
  nb_val *picked = nb_reduce_sum(nb_mul(x, onehot), 1, ax);
  nb_val *loss = nb_div(nb_reduce_sum(nb_sub(lse, picked), 0, NULL), nb_scalar(g, NB_F32, (double)dims[0]));
  return nb_tree_set_val(out, "loss", loss);
}

static nb_status f_layout(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"); /* [4,6,5] */
  nb_val *t = nb_transpose(nb_exp(x), ((int[]){2, 0, 1}));                 /* [5,4,6] */
  nb_val *r = nb_reshape(nb_mul(t, t), 2, ((int64_t[]){20, 6}));            /* [20,6] */
  nb_val *b = nb_broadcast_in_dim(nb_reduce_sum(r, 1, (int[]){0}), 3, ((int64_t[]){2, 6, 3}), (int[]){1});
  nb_val *s = nb_reshape(nb_transpose(x, ((int[]){1, 0, 2})), 2, ((int64_t[]){12, 10})); /* not affine */
  nb_val *col = nb_reduce_max(nb_sin(x), 1, (int[]){0});                    /* [6,5] */
  nb_tree_set_val(out, "r", r);
  nb_tree_set_val(out, "b", b);
  nb_tree_set_val(out, "s", nb_add(s, nb_full_like(s, 2)));
  nb_tree_set_val(out, "col", col);
  return nb_tree_set_val(out, "all", nb_reduce_sum(nb_cos(x), 0, NULL));
}

static nb_status f_dtypes(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"); /* f32 */
  nb_val *i = nb_convert(nb_mul(x, nb_full_like(x, 40)), NB_I32);
  nb_val *q = nb_div(i, nb_full_like(i, 3));
  nb_val *r = nb_rem(i, nb_full_like(i, 0));
  nb_val *u8 = nb_convert(x, NB_U8);
  nb_val *bf = nb_convert(nb_add(nb_convert(x, NB_BF16), nb_full_like(nb_convert(x, NB_BF16), 0.3)), NB_F32);
  nb_val *h = nb_mul(nb_convert(x, NB_F16), nb_convert(x, NB_F16));
  nb_val *b = nb_and(nb_gt(x, nb_full_like(x, 0)), nb_not(nb_is_finite(nb_log(x))));
  nb_val *sel = nb_select(b, nb_convert(q, NB_F64), nb_convert(x, NB_F64));
  nb_val *cl = nb_clamp(nb_scalar(g, NB_I32, -5), nb_add(q, r), nb_scalar(g, NB_I32, 7));
  nb_tree_set_val(out, "q", q);
  nb_tree_set_val(out, "r", r);
  nb_tree_set_val(out, "u8", u8);
  nb_tree_set_val(out, "bf", bf);
  nb_tree_set_val(out, "h", h);
  nb_tree_set_val(out, "b", b);
  nb_tree_set_val(out, "sel", sel);
  nb_tree_set_val(out, "isum", nb_reduce_sum(cl, 1, (int[]){1}));
  nb_tree_set_val(out, "imax", nb_reduce_max(i, 1, (int[]){0}));
  nb_tree_set_val(out, "argmax", nb_argmax(x, 1, NB_I32));
  return nb_tree_set_val(out, "prod", nb_reduce_prod(nb_convert(x, NB_F64), 1, (int[]){1}));
}

static nb_status f_foldable(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *c = nb_exp(nb_add(nb_scalar(g, NB_F32, 1), nb_scalar(g, NB_F32, 2))); /* folds */
  nb_val *y = nb_mul(nb_add(x, nb_full_like(x, 0)), nb_full_like(x, 1));       /* x */
  y = nb_neg(nb_neg(nb_convert(nb_convert(y, NB_F64), NB_F32)));               /* x */
  y = nb_transpose(nb_transpose(y, ((int[]){1, 0})), ((int[]){1, 0}));          /* x */
  return nb_tree_set_val(out, "y", nb_mul(y, nb_broadcast_to(c, 2, ((int64_t[]){nb_val_dim(x, 0), nb_val_dim(x, 1)}))));
}

static nb_status f_update(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *p = nb_tree_get_val(in, "params/w"), *gr = nb_tree_get_val(in, "grad");
  nb_tree_set_val(out, "params/w", nb_sub(p, nb_mul(gr, nb_full_like(gr, 0.1))));
  return NB_OK;
}

static nb_status f_long(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *keep = NULL;
  for (int i = 0; i < 12; i++) {
    x = nb_exp(nb_neg(nb_mul(x, x)));
    if (i == 2) keep = x;
    nb_tree_set_val(out, i == 5 ? "mid" : "tmp", nb_reduce_sum(x, 0, NULL));
  }
  nb_tree_set_val(out, "keep", keep);
  return nb_tree_set_val(out, "x", x);
}

/* exp-sum minus the labels' entries (cross-entropy's shape): the gradient
 * adds exp(x) to a scatter_add of the label picks into zeros. With u->keep,
 * the scatter's own result is an output too. */
static nb_status f_pick(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *labels = nb_tree_get_val(in, "labels");
  nb_val *picked = nb_take_along_axis(x, labels, 1);
  nb_tree_set_val(out, "loss", nb_sub(nb_reduce_sum(nb_exp(x), 0, NULL), nb_reduce_sum(picked, 0, NULL)));
  return NB_OK;
}

/* ---------------------------------------------------------------- tests */

static nb_graph *trace(nb_trace_fn fn, void *u, const nb_tree *in) {
  nb_graph *g = nb_trace(ctx, fn, u, in);
  CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
  return g;
}

static void test_patterns(void) {
  int64_t d[2] = {33, 257}, d3[3] = {4, 6, 5};
  nb_tree *in = inputs1(NB_F32, 2, d);
  add_input(in, "y", NB_F32, 2, d);
  nb_graph *g = trace(f_chain, NULL, in);
  check_all_ways("chain", g, in);
  CHECK(!plan_on || kernels_of(g, NULL) == 1);
  nb_graph_destroy(g);
  for (int axis = 0; axis < 2; axis++) {
    g = trace(f_softmax, &axis, in);
    check_all_ways(axis ? "softmax rows" : "softmax columns", g, in);
    CHECK_MSG(!plan_on || kernels_of(g, NULL) == 1, "softmax over axis %d is one kernel", axis);
    CHECK(kernels_of(g, "fuse") > 3);
    nb_graph_destroy(g);
  }
  nb_tree_destroy(in);

  in = inputs1(NB_F32, 2, d);
  add_input(in, "gamma", NB_F32, 1, d + 1);
  add_input(in, "beta", NB_F32, 1, d + 1);
  g = trace(f_layernorm, NULL, in);
  check_all_ways("layernorm", g, in);
  CHECK(!plan_on || kernels_of(g, NULL) == 1);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = inputs1(NB_F32, 2, d);
  nb_array *lab = nb_test_randint(ctx, &rng, NB_I32, 1, d, 0, d[1] - 1);
  nb_tree_set_array(in, "label", lab);
  nb_array_release(lab);
  g = trace(f_xent, NULL, in);
  check_all_ways("cross-entropy", g, in);
  CHECK_MSG(!plan_on || kernels_of(g, NULL) <= 2, "cross-entropy in two passes");
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = inputs1(NB_F32, 3, d3);
  g = trace(f_layout, NULL, in);
  check_all_ways("layout", g, in);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = inputs1(NB_F32, 2, d);
  g = trace(f_dtypes, NULL, in);
  check_all_ways("dtypes", g, in);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = inputs1(NB_F32, 1, (int64_t[]){1000});
  g = trace(f_long, NULL, in);
  check_all_ways("long chain with side outputs", g, in);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* A costly intermediate t (GELU's backward has one) read twice by the value
 * that joins its kernel: materialized by fusion as a root, but when nothing
 * outside that kernel reads it, it is computed there and never stored.
 * With `also` it is also a graph output (u 1), or the operand of a matrix
 * product (u 2): then it is stored. */
static nb_status f_shared_intermediate(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int also = *(const int *)u;
  nb_val *x = nb_tree_get_val(in, "x"), *t = x;
  for (int i = 0; i < 7; i++) t = nb_tanh(nb_mul(t, x)); /* 14 operations: too many to recompute per user */
  nb_val *y = nb_add(nb_mul(t, x), nb_mul(t, t));
  if (also == 1) nb_tree_set_val(out, "t", t);
  if (also == 2) y = nb_add(y, nb_matmul(t, nb_tree_get_val(in, "w")));
  return nb_tree_set_val(out, "y", y);
}

/* How many values the executable's kernels store. */
static int kernel_stores(const nb_graph *g) {
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &o);
  int n = 0;
  for (size_t i = 0; e && i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info si;
    nb_exe_operand ops[64];
    nb_exe_step(e, i, &si);
    size_t no = nb_exe_step_operands(e, i, ops, 64);
    for (size_t j = 0; si.kind == NB_EXE_STEP_KERNEL && j < no && j < 64; j++) n += ops[j].written;
  }
  nb_exe_destroy(e);
  return n;
}

static void test_unread_stores(void) {
  int64_t d[2] = {19, 77};
  for (int also = 0; also < 3; also++) {
    nb_tree *in = inputs1(NB_F32, 2, d);
    add_input(in, "w", NB_F32, 2, (int64_t[]){77, 77});
    nb_graph *g = trace(f_shared_intermediate, &also, in);
    static const char *const what[] = {"an intermediate read twice in its kernel", "... and a graph output",
                                       "... and a matmul operand"};
    check_all_ways(what[also], g, in);
    int stores = kernel_stores(g), want = also == 0 ? 1 : 2; /* y, and t when something else reads it */
    CHECK_MSG(stores == want, "%s: the kernels store %d values, want %d", what[also], stores, want);
    nb_graph_destroy(g);
    nb_tree_destroy(in);
  }
}

/* Attention's heads merged back into rows for the output projection:
 * [B, H, T, D] transposed to [B, T, H, D] (a kernel: the layout changes),
 * reshaped to [B, T, H*D] and multiplied. The reshape cannot be lowered
 * onto the transposed value's index space (H*D is not affine in H, D), so
 * it is memory; read only by the product, it is the transposed value's
 * memory, not a copy of it. */
static nb_status f_heads_merged(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g, (void)u;
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  int64_t dims[3] = {nb_val_dim(x, 0), nb_val_dim(x, 2), nb_val_dim(x, 1) * nb_val_dim(x, 3)};
  static const int perm[4] = {0, 2, 1, 3};
  nb_val *rows = nb_reshape(nb_transpose(x, perm), 3, dims);
  return nb_tree_set_val(out, "y", nb_matmul(rows, w));
}

static void test_reshape_for_blas(void) {
  nb_tree *in = inputs1(NB_F32, 4, (int64_t[]){2, 3, 5, 4});
  add_input(in, "w", NB_F32, 2, (int64_t[]){12, 7});
  nb_graph *g = trace(f_heads_merged, NULL, in);
  check_all_ways("heads merged into rows for a matmul", g, in);
  CHECK_MSG(kernels_of(g, NULL) == 1, "heads merged into rows: %zu kernels (the transpose, no copy)", kernels_of(g, NULL));
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_stats_join(void) {
  int64_t d[2] = {37, 300};
  nb_tree *in = inputs1(NB_F32, 2, d);
  nb_graph *g = trace(f_softmax_stats, NULL, in);
  check_all_ways("softmax with its statistics", g, in);
  CHECK_MSG(kernels_of(g, NULL) == 2, "softmax with its statistics: %zu kernels", kernels_of(g, NULL));
  nb_graph_destroy(g);
  g = trace(f_layernorm_stats, NULL, in);
  check_all_ways("layer norm with its statistics", g, in);
  CHECK_MSG(kernels_of(g, NULL) == 2, "layer norm with its statistics: %zu kernels", kernels_of(g, NULL));
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  /* the same softmax over scores with a size-1 axis: the root exp reads the
   * root max through a broadcast that leaves that axis's coordinate 0 */
  in = inputs1(NB_F32, 4, (int64_t[]){5, 3, 1, 37});
  g = trace(f_softmax_stats, NULL, in);
  check_all_ways("softmax of [5,3,1,37] with its statistics", g, in);
  CHECK_MSG(kernels_of(g, NULL) == 2, "softmax of [5,3,1,37] with its statistics: %zu kernels", kernels_of(g, NULL));
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_simplify(void) {
  int64_t d[2] = {3, 5};
  nb_tree *in = inputs1(NB_F32, 2, d);
  nb_graph *g = trace(f_foldable, NULL, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &o);
  CHECK(e != NULL);
  /* what is left: x * broadcast(constant) */
  CHECK_MSG(nb_graph_num_eqns(nb_exe_graph(e)) == 3, "optimized graph has %zu equations", nb_graph_num_eqns(nb_exe_graph(e)));
  if (nb_graph_num_eqns(nb_exe_graph(e)) != 3) nb_graph_print(nb_exe_graph(e), stderr);
  nb_exe_destroy(e);
  o = nb_test_jit_opts("fold,algebra");
  e = nb_jit(ctx, g, &o);
  CHECK(e && nb_graph_num_eqns(nb_exe_graph(e)) > 8);
  nb_exe_destroy(e);
  check_all_ways("foldable", g, in);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* x + scatter_add(0, idx, u) becomes scatter_add(x, idx, u): no zero
 * tensor in the arena (the scatter updates x's buffer), the same gradient;
 * not when the scatter's result is used twice. */
static void test_scatter_into_zeros(void) {
  int64_t d[2] = {6, 9}, ld[2] = {6, 1};
  nb_tree *in = inputs1(NB_F32, 2, d);
  nb_array *labels = nb_array_from_f64(ctx, NB_I32, 2, ld, (const double[]){3, 0, 8, 3, 5, 1});
  nb_tree_set_array(in, "labels", labels);
  nb_array_release(labels);
  nb_graph *g = trace(f_pick, NULL, in);
  nb_graph *gg = g ? nb_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
  CHECK_MSG(gg != NULL, "grad: %s", nb_ctx_error(ctx));
  if (!gg) return;
  nb_jit_opts on = nb_test_jit_opts(NULL), off = nb_test_jit_opts("algebra");
  nb_exe *a = nb_jit(ctx, gg, &on), *b = nb_jit(ctx, gg, &off);
  CHECK(a && b);
  if (a && b) {
    nb_exe_stats sa, sb;
    nb_exe_get_stats(a, &sa);
    nb_exe_get_stats(b, &sb);
    CHECK_MSG(sa.arena_bytes < sb.arena_bytes, "arena %zu vs %zu bytes", sa.arena_bytes, sb.arena_bytes);
  }
  nb_exe_destroy(a);
  nb_exe_destroy(b);
  check_all_ways("gradient of a label pick", gg, in);
  /* the scatter's result also an output: both the scatter and the add stay */
  nb_graph *g2 = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g2, "x", nb_aval_make(NB_F32, 2, d)), *ids = nb_graph_input(g2, "labels", nb_aval_make(NB_I32, 2, ld));
  nb_scatter_dims sd = {.n_inserted_window = 2, .inserted_window_dims = {0, 1}, .n_scatter_to_operand = 2,
                        .scatter_dims_to_operand_dims = {0, 1}, .index_vector_dim = 1};
  nb_val *rows = nb_reshape(nb_iota(g2, NB_I32, 1, (int64_t[]){6}, 0), 2, ld);
  nb_val *idx = nb_concatenate(2, ((nb_val *[]){rows, ids}), 1);
  nb_val *s = nb_scatter_add(nb_full_like(x, 0), idx, nb_full(g2, NB_F32, 1, (int64_t[]){6}, -1), &sd);
  nb_graph_output(g2, "scatter", s);
  nb_graph_output(g2, "sum", nb_add(nb_tanh(x), s));
  CHECK_MSG(nb_graph_status(g2) == NB_OK, "%s", nb_graph_error(g2));
  check_all_ways("scatter into zeros used twice", g2, in);
  nb_graph_destroy(g2);
  nb_graph_destroy(gg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static bool has_transpose(const nb_exe *e) {
  char *text = e ? nb_graph_to_string(nb_exe_graph(e)) : NULL;
  bool yes = text && strstr(text, "transpose") != NULL;
  free(text);
  return yes;
}

/* transpose(dot_general(a, b)) swapping the lhs-free and rhs-free blocks
 * becomes dot_general(b, a) (a weight gradient then needs no transposed
 * read); with batch dims too; the same values as the interpreter. Not when
 * the dot is used twice, nor for another permutation. */
static void test_transpose_of_dot(void) {
  int64_t a2[2] = {5, 7}, b2[2] = {5, 3}, a3[3] = {2, 5, 7}, b3[3] = {2, 5, 3};
  for (int batched = 0; batched < 2; batched++)
    for (int twice = 0; twice < 2; twice++) {
      nb_tree *in = nb_tree_create(ctx);
      add_input(in, "a", NB_F32, 2 + batched, batched ? a3 : a2);
      add_input(in, "b", NB_F32, 2 + batched, batched ? b3 : b2);
      nb_graph *g = nb_graph_create(ctx);
      nb_val *a = nb_graph_input(g, "a", nb_aval_make(NB_F32, 2 + batched, batched ? a3 : a2));
      nb_val *b = nb_graph_input(g, "b", nb_aval_make(NB_F32, 2 + batched, batched ? b3 : b2));
      nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {batched}, .rhs_contract = {batched}};
      if (batched) dn.n_batch = 1, dn.lhs_contract[0] = dn.rhs_contract[0] = 1;
      nb_val *dot = nb_dot_general(a, b, &dn, NB_F32);
      static const int swap2[2] = {1, 0}, swap3[3] = {0, 2, 1}, batch_moved[3] = {1, 0, 2};
      nb_graph_output(g, "t", nb_transpose(dot, batched ? swap3 : swap2));
      if (twice) nb_graph_output(g, "dot", dot);
      CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
      nb_jit_opts o = nb_test_jit_opts(NULL);
      nb_exe *e = nb_jit(ctx, g, &o);
      CHECK_MSG(e && has_transpose(e) == (bool)twice, "batched %d, dot used twice %d: transpose left %d", batched, twice,
                has_transpose(e));
      nb_exe_destroy(e);
      check_all_ways("transpose of a dot", g, in);
      if (batched && !twice) { /* moving the batch dim is no swap of the operands */
        nb_graph *g2 = nb_graph_create(ctx);
        nb_val *x = nb_graph_input(g2, "a", nb_aval_make(NB_F32, 3, a3)), *y = nb_graph_input(g2, "b", nb_aval_make(NB_F32, 3, b3));
        nb_graph_output(g2, "t", nb_transpose(nb_dot_general(x, y, &dn, NB_F32), batch_moved));
        e = nb_jit(ctx, g2, &o);
        CHECK_MSG(e && has_transpose(e), "a batch dim moved: the transpose must stay");
        nb_exe_destroy(e);
        check_all_ways("batch dim of a dot moved", g2, in);
        nb_graph_destroy(g2);
      }
      nb_graph_destroy(g);
      nb_tree_destroy(in);
    }
}

static void test_caches(void) {
  int64_t d[1] = {77};
  nb_tree *in = inputs1(NB_F32, 1, d);
  add_input(in, "y", NB_F32, 1, d);
  nb_graph *g = trace(f_chain, NULL, in), *g2 = trace(f_chain, NULL, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *a = nb_jit(ctx, g, &o), *b = nb_jit(ctx, g2, &o);
  CHECK(a && a == b); /* equal graphs: one executable */
  nb_exe_destroy(b);
  nb_exe_destroy(a);
  nb_exe *c = nb_jit(ctx, g, &o); /* gone from memory: from disk */
  nb_exe_stats s;
  nb_exe_get_stats(c, &s);
  CHECK(s.native && s.from_disk_cache);
  CHECK(nb_exe_source_path(c) != NULL);
  nb_exe_destroy(c);
  nb_graph_destroy(g);
  nb_graph_destroy(g2);
  nb_tree_destroy(in);
}

typedef struct logcap {
  int warnings;
  char last[512];
} logcap;

static void capture(void *ud, nb_log_level level, const char *msg) {
  logcap *c = ud;
  if (level == NB_LOG_WARN) {
    c->warnings++;
    snprintf(c->last, sizeof c->last, "%s", msg);
  }
}

static void test_fallback(void) {
  int64_t d[1] = {10};
  nb_tree *in = inputs1(NB_F32, 1, d);
  add_input(in, "y", NB_F32, 1, d);
  nb_graph *g = trace(f_chain, NULL, in);
  logcap cap = {0, ""};
  nb_ctx_set_log(ctx, capture, &cap);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.cc = "/nonexistent/cc";
  nb_exe_stats s;
  CHECK(nb_test_jit_matches(ctx, g, in, &o, "fallback", &s));
  CHECK(!s.native);
  CHECK_MSG(cap.warnings == 1 && strstr(cap.last, "interpreter"), "warnings %d: %s", cap.warnings, cap.last);
  o = nb_test_jit_opts("native");
  CHECK(nb_test_jit_matches(ctx, g, in, &o, "native off", &s));
  CHECK(!s.native);
  nb_ctx_set_log(ctx, NULL, NULL);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

typedef struct infocap {
  int n;
  bool summary, groups, graph, timings;
} infocap;

static void capture_info(void *ud, nb_log_level level, const char *msg) {
  infocap *c = ud;
  if (level != NB_LOG_INFO) return;
  c->n++;
  c->summary |= strstr(msg, "jit: ") && strstr(msg, "kernels") != NULL;
  c->groups |= strstr(msg, "step 0 k0:") != NULL;
  c->graph |= strstr(msg, "= tanh") != NULL;
  c->timings |= strstr(msg, "jit step 0") && strstr(msg, "GB/s") != NULL;
}

static void test_debug_levels(void) {
  int64_t d[1] = {64};
  nb_tree *in = inputs1(NB_F32, 1, d);
  add_input(in, "y", NB_F32, 1, d);
  nb_graph *g = trace(f_chain, NULL, in);
  for (int level = 1; level <= 4; level++) {
    infocap cap = {0, false, false, false, false};
    nb_ctx_set_log(ctx, capture_info, &cap);
    nb_jit_opts o = nb_test_jit_opts(level == 1 ? "dce" : level == 2 ? "fold" : level == 3 ? "algebra" : "reuse");
    o.debug = level;
    nb_exe *e = nb_jit(ctx, g, &o);
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_exe_run(e, in, out));
    nb_ctx_set_log(ctx, NULL, NULL);
    CHECK_MSG(cap.summary && cap.timings == (level >= 2) && cap.groups == (level >= 3) && cap.graph == (level >= 3),
              "debug %d: summary %d timings %d groups %d graph %d", level, cap.summary, cap.timings, cap.groups, cap.graph);
    nb_tree_destroy(out);
    nb_exe_destroy(e);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_donation(void) {
  int64_t d[1] = {1000};
  nb_tree *in = nb_tree_create(ctx);
  add_input(in, "params/w", NB_F32, 1, d);
  add_input(in, "grad", NB_F32, 1, d);
  nb_graph *g = trace(f_update, NULL, in);
  const char *donate[] = {"params", NULL};
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.donate = donate;
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_exe_stats s;
  nb_exe_get_stats(e, &s);
  CHECK(s.peak_bytes == 0 && s.output_bytes == 4000);
  nb_array *w = nb_tree_get_array(in, "params/w");
  double w0 = nb_array_get(w, 7), g0 = nb_array_get(nb_tree_get_array(in, "grad"), 7);
  /* the caller still holds w: no donation, w unchanged */
  nb_array_retain(w);
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_exe_run(e, in, out));
  CHECK(nb_tree_get_array(out, "params/w") != w && nb_array_get(w, 7) == w0);
  nb_array_release(w);
  nb_tree_destroy(out);
  /* only the input tree holds it: written in place */
  out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_exe_run(e, in, out));
  CHECK(nb_tree_get_array(out, "params/w") == w);
  CHECK_NEAR(nb_array_get(w, 7), (float)(w0 - (float)(g0 * (float)0.1)), 1e-6);
  nb_tree_destroy(out);
  nb_exe_destroy(e);
  o.donate = NULL;
  e = nb_jit(ctx, g, &o);
  nb_exe_get_stats(e, &s);
  CHECK(s.peak_bytes == 4000);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_reuse_and_stats(void) {
  int64_t d[1] = {4096};
  nb_tree *in = inputs1(NB_F32, 1, d);
  nb_graph *g = trace(f_long, NULL, in);
  nb_jit_opts o = nb_test_jit_opts("fuse");
  nb_exe *e = nb_jit(ctx, g, &o);
  o = nb_test_jit_opts("fuse,reuse");
  nb_exe *f = nb_jit(ctx, g, &o);
  nb_exe_stats a, b;
  nb_exe_get_stats(e, &a);
  nb_exe_get_stats(f, &b);
  CHECK_MSG(a.arena_bytes < b.arena_bytes && a.arena_bytes <= 3 * 4096 * 4, "arena %zu with reuse, %zu without", a.arena_bytes, b.arena_bytes);
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_exe_run(e, in, out));
  size_t n = nb_exe_num_steps(e);
  CHECK(n == a.nsteps && n > 10);
  double flops = 0;
  for (size_t i = 0; i < n; i++) {
    nb_exe_step_info si;
    CHECK_OK(ctx, nb_exe_step(e, i, &si));
    flops += si.flops;
    CHECK(si.name && si.last_ms >= 0 && si.bytes > 0);
  }
  CHECK(flops >= 36 * 4096);
  nb_exe_step_info si;
  CHECK(nb_exe_step(e, n, &si) == NB_ERR_INVALID_ARG);
  nb_ctx_clear_error(ctx);
  char *buf = NULL;
  size_t len = 0;
  FILE *mf = open_memstream(&buf, &len);
  nb_exe_print(e, mf);
  fclose(mf);
  CHECK(buf && strstr(buf, "step 0") && strstr(buf, "optimized graph"));
  free(buf);
  nb_tree_destroy(out);
  nb_exe_destroy(e);
  nb_exe_destroy(f);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static void test_misuse(void) {
  int64_t d[1] = {5};
  nb_tree *in = inputs1(NB_F32, 1, d);
  add_input(in, "y", NB_F32, 1, d);
  nb_graph *g = trace(f_chain, NULL, in);
  nb_jit_opts o = nb_test_jit_opts("fuse,bogus");
  CHECK(nb_jit(ctx, g, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "unknown switch 'bogus'");
  CHECK(nb_jit(ctx, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "NULL graph");
  o = nb_test_jit_opts(NULL);
  o.device = (nb_device){NB_DEVICE_CUDA, 0};
  CHECK(nb_jit(ctx, g, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "CPU");
  o = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_tree *bad = inputs1(NB_F32, 1, (int64_t[]){6});
  add_input(bad, "y", NB_F32, 1, d);
  nb_tree *out = nb_tree_create(ctx);
  CHECK(nb_exe_run(e, bad, out) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "input 'x' is f32[6]");
  nb_tree_remove(bad, "y");
  CHECK(nb_exe_run(e, bad, out) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "no array at 'y'");
  CHECK(nb_exe_run(e, NULL, out) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "NULL");
  nb_exe_destroy(e);
  nb_exe_destroy(NULL);
  nb_tree_destroy(bad);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* dot_general through BLAS, when the primitive exists in this build. */
static void test_blas(void) {
  int dot = -1;
  for (int p = 0; p < NB_PRIM_COUNT; p++)
    if (strcmp(nb__prim_table[p]->name, "dot_general") == 0) dot = p;
  if (dot < 0) {
    printf("test_jit: dot_general is not in this build; BLAS lowering not exercised\n");
    return;
  }
  static const struct { int64_t lhs[3], rhs[3]; int lr, rr; nb_dot_dims dn; } cases[] = {
      {{5, 7}, {7, 3}, 2, 2, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}},
      {{7, 5}, {7, 3}, 2, 2, {.n_contract = 1, .lhs_contract = {0}, .rhs_contract = {0}}},
      {{5, 7}, {3, 7}, 2, 2, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {1}}},
      {{2, 5, 7}, {2, 7, 3}, 3, 3, {.n_contract = 1, .n_batch = 1, .lhs_contract = {2}, .rhs_contract = {1}, .lhs_batch = {0}, .rhs_batch = {0}}},
      {{5, 2, 7}, {7, 2, 3}, 3, 3, {.n_contract = 1, .n_batch = 1, .lhs_contract = {2}, .rhs_contract = {0}, .lhs_batch = {1}, .rhs_batch = {1}}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int t = 0; t < 2; t++) {
      nb_dtype dt = t ? NB_F64 : NB_F32;
      nb_graph *g = nb_graph_create(ctx);
      nb_val *ins[2] = {nb_graph_input(g, "a", nb_aval_make(dt, cases[c].lr, cases[c].lhs)),
                        nb_graph_input(g, "b", nb_aval_make(dt, cases[c].rr, cases[c].rhs))};
      nb_dot_params p;
      memset(&p, 0, sizeof p);
      p.dn = cases[c].dn;
      p.out_dtype = dt;
      nb_val *y = nb__emit1(g, NB_HERE, (nb_prim)dot, 2, ins, &p, sizeof p);
      nb_graph_output(g, "y", nb_tanh(y));
      CHECK_MSG(nb_graph_status(g) == NB_OK, "dot case %zu: %s", c, nb_graph_error(g));
      nb_tree *in = nb_tree_create(ctx);
      add_input(in, "a", dt, cases[c].lr, cases[c].lhs);
      add_input(in, "b", dt, cases[c].rr, cases[c].rhs);
      nb_jit_opts o = nb_test_jit_opts(NULL);
      nb_exe_stats s;
      char name[64];
      snprintf(name, sizeof name, "dot case %zu %s", c, nb_dtype_name(dt));
      CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, &s), "%s", name);
      CHECK_MSG(!plan_on || s.nblas == 1u, "%s: %zu blas steps", name, s.nblas);
      o = nb_test_jit_opts("blas");
      CHECK_MSG(nb_test_jit_matches(ctx, g, in, &o, name, &s) && s.nblas == 0, "%s without blas", name);
      nb_tree_destroy(in);
      nb_graph_destroy(g);
    }
}

int main(void) {
  ctx = nb_ctx_create();
  const char *env = getenv("NABLA_JIT_DISABLE");
  plan_on = !env || !*env;
  test_patterns();
  if (plan_on) test_simplify();
  if (plan_on) test_scatter_into_zeros();
  if (plan_on) test_transpose_of_dot();
  if (plan_on) test_stats_join();
  if (plan_on) test_unread_stores();
  if (plan_on) test_reshape_for_blas();
  test_caches();
  test_fallback();
  if (plan_on) test_donation();
  test_debug_levels();
  if (plan_on) test_reuse_and_stats();
  test_misuse();
  test_blas();
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit");
}
