/* The collectives over MPI, as 2 processes (tests/dist/mpirun.sh): each
 * primitive's values against what every rank computes alone from both
 * ranks' inputs (bit for bit: sums fold in rank order), the compiled step
 * against the interpreter, gradients of shard_map'd functions against
 * finite differences in f64, and misuse. With an argument it plays a broken
 * job instead (tests/dist/dead_rank.sh): "exit" (rank 1 exits early) or
 * "hang" (rank 1 never joins) while rank 0 sums, or "inflight" (rank 1 dies
 * while a compiled step's psum is in flight). */
#include <pthread.h>
#include <unistd.h>

#include "jitcheck.h"

static int rank;

/* rank r's input: rows x cols from its own stream */
static nb_array *input_of(nb_ctx *ctx, int r, nb_dtype t, int64_t rows, int64_t cols) {
  nb_test_rng rng = {0x9e3779b97f4a7c15ull * (uint64_t)(r + 1)};
  int64_t d[2] = {rows, cols};
  return nb_test_randn(ctx, &rng, t, 2, d);
}

typedef struct op_case {
  const char *name;
  nb_val *(*fn)(nb_graph *g, nb_val *x);
  int64_t rows, cols;
  nb_dtype dtype;
  /* expected element i of the output on rank r from both inputs */
  double (*want)(const nb_array *x0, const nb_array *x1, int r, int64_t i);
} op_case;

static nb_status trace_op(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const op_case *c = u;
  return nb_tree_set_val(out, "y", c->fn(g, nb_tree_get_val(in, "x")));
}

static const nb_array *xs(const nb_array *x0, const nb_array *x1, int r) { return r ? x1 : x0; }

static nb_val *f_psum(nb_graph *g, nb_val *x) { return nb_psum(x, "data"); }
static double w_psum(const nb_array *x0, const nb_array *x1, int r, int64_t i) {
  if (nb_array_dtype(x0) == NB_F32) return (double)((float)nb_array_get(x0, i) + (float)nb_array_get(x1, i));
  return nb_array_get(x0, i) + nb_array_get(x1, i);
}
static nb_val *f_pmean(nb_graph *g, nb_val *x) { return nb_pmean(x, "data"); }
static double w_pmean(const nb_array *x0, const nb_array *x1, int r, int64_t i) { return (nb_array_get(x0, i) + nb_array_get(x1, i)) * 0.5; }
static nb_val *f_pmax(nb_graph *g, nb_val *x) { return nb_pmax(x, "data"); }
static double w_pmax(const nb_array *x0, const nb_array *x1, int r, int64_t i) { return fmax(nb_array_get(x0, i), nb_array_get(x1, i)); }
/* [2,3] -> [2,6] */
static nb_val *f_gather_tiled(nb_graph *g, nb_val *x) { return nb_all_gather(x, "data", 1, true); }
static double w_gather_tiled(const nb_array *x0, const nb_array *x1, int r, int64_t i) {
  int64_t row = i / 6, col = i % 6;
  return nb_array_get(xs(x0, x1, (int)(col / 3)), row * 3 + col % 3);
}
/* [2,3] -> [2,2,3] */
static nb_val *f_gather_stacked(nb_graph *g, nb_val *x) { return nb_all_gather(x, "data", 0, false); }
static double w_gather_stacked(const nb_array *x0, const nb_array *x1, int r, int64_t i) {
  return nb_array_get(xs(x0, x1, (int)(i / 6)), i % 6);
}
/* [4,3] -> [2,3]: rows [2r, 2r+2) summed */
static nb_val *f_scatter(nb_graph *g, nb_val *x) { return nb_psum_scatter(x, "data", 0, true); }
static double w_scatter(const nb_array *x0, const nb_array *x1, int r, int64_t i) { return w_psum(x0, x1, r, r * 6 + i); }
/* [2,4] split 1, concat 0 -> [4,2]: out[k*2 + a][b] = x_k[a][2r + b] */
static nb_val *f_a2a(nb_graph *g, nb_val *x) { return nb_all_to_all(x, "data", 1, 0); }
static double w_a2a(const nb_array *x0, const nb_array *x1, int r, int64_t i) {
  int64_t row = i / 2, b = i % 2, k = row / 2, a = row % 2;
  return nb_array_get(xs(x0, x1, (int)k), a * 4 + 2 * r + b);
}
static nb_val *f_swap(nb_graph *g, nb_val *x) {
  static const int src[2] = {0, 1}, dst[2] = {1, 0};
  return nb_ppermute(x, "data", 2, src, dst);
}
static double w_swap(const nb_array *x0, const nb_array *x1, int r, int64_t i) { return nb_array_get(xs(x0, x1, 1 - r), i); }
static nb_val *f_shift(nb_graph *g, nb_val *x) {
  static const int src[1] = {0}, dst[1] = {1};
  return nb_ppermute(x, "data", 1, src, dst);
}
static double w_shift(const nb_array *x0, const nb_array *x1, int r, int64_t i) { return r ? nb_array_get(x0, i) : 0; }
static nb_val *f_index(nb_graph *g, nb_val *x) {
  return nb_add(x, nb_convert(nb_mul(nb_axis_index(g, "data"), nb_scalar(g, NB_I32, 10)), nb_val_dtype(x)));
}
static double w_index(const nb_array *x0, const nb_array *x1, int r, int64_t i) {
  return (double)(float)(nb_array_get(xs(x0, x1, r), i) + 10.0 * r);
}

static const op_case ops[] = {
    {"psum f32", f_psum, 5, 7, NB_F32, w_psum},
    {"psum f64", f_psum, 3, 3, NB_F64, w_psum},
    {"pmean f64", f_pmean, 3, 4, NB_F64, w_pmean},
    {"pmax f32", f_pmax, 4, 4, NB_F32, w_pmax},
    {"all_gather tiled dim 1", f_gather_tiled, 2, 3, NB_F32, w_gather_tiled},
    {"all_gather stacked dim 0", f_gather_stacked, 2, 3, NB_F32, w_gather_stacked},
    {"psum_scatter tiled dim 0", f_scatter, 4, 3, NB_F32, w_scatter},
    {"all_to_all split 1 concat 0", f_a2a, 2, 4, NB_F32, w_a2a},
    {"ppermute swap", f_swap, 3, 2, NB_F32, w_swap},
    {"ppermute 0 -> 1", f_shift, 3, 2, NB_F32, w_shift},
    {"axis_index", f_index, 2, 2, NB_F32, w_index},
};

static void check_op(nb_ctx *ctx, const op_case *c) {
  nb_array *x0 = input_of(ctx, 0, c->dtype, c->rows, c->cols), *x1 = input_of(ctx, 1, c->dtype, c->rows, c->cols);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", rank ? x1 : x0);
  nb_array *y = nb_test_eval_output(ctx, trace_op, (void *)c, in, "y");
  CHECK_MSG(y != NULL, "%s: %s", c->name, nb_ctx_error(ctx));
  int bad = 0;
  for (int64_t i = 0; y && i < nb_array_size(y); i++) {
    double got = nb_array_get(y, i), want = c->want(x0, x1, rank, i);
    if (got != want && bad++ < 3) fprintf(stderr, "rank %d: %s: element %lld: %.17g, want %.17g\n", rank, c->name, (long long)i, got, want);
  }
  CHECK_MSG(bad == 0, "%s: %d elements differ on rank %d", c->name, bad, rank);
  /* the compiled step runs the collective as a step of its own */
  nb_graph *g = nb_trace(ctx, trace_op, (void *)c, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  CHECK_MSG(g && nb_test_jit_matches(ctx, g, in, &o, c->name, NULL), "%s: compiled vs interpreter on rank %d", c->name, rank);
  nb_graph_destroy(g);
  nb_array_release(y);
  nb_tree_destroy(in);
  nb_array_release(x0);
  nb_array_release(x1);
}

/* ---------------------------------------------------------------- gradients */

/* Global X [4,6] split over data along dim 0 (each rank a [2,6] block):
 *   loss  = psum(sum(sin(x) * x))                      replicated
 *   ring  = ppermute(sin x) (swap)                     split dim 0
 *   mixed = psum_scatter(all_gather(x*x, 0) * c, 0)     split dim 0
 *   moved = all_to_all(x * cos x, split 1, concat 0)   split dim 0 */
static nb_status local_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  static const int src[2] = {0, 1}, dst[2] = {1, 0};
  nb_val *gathered = nb_all_gather(nb_mul(x, x), "data", 0, true);
  nb_val *c = nb_add(nb_iota_at(NB_HERE, g, NB_F64, 2, (int64_t[]){4, 6}, 0), nb_scalar(g, NB_F64, 0.5));
  nb_status s = nb_tree_set_val(out, "loss", nb_psum(nb_reduce_sum(nb_mul(nb_sin(x), x), 0, NULL), "data"));
  if (!s) s = nb_tree_set_val(out, "ring", nb_ppermute(nb_sin(x), "data", 2, src, dst));
  if (!s) s = nb_tree_set_val(out, "mixed", nb_psum_scatter(nb_mul(gathered, c), "data", 0, true));
  if (!s) s = nb_tree_set_val(out, "moved", nb_all_to_all(nb_mul(x, nb_cos(x)), "data", 1, 0));
  return s;
}

static nb_status call_graph(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_graph_call(g, (const nb_graph *)u, in, out);
}

static void check_shard_map_grads(nb_ctx *ctx) {
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 2, (int64_t[]){2, 6})));
  nb_graph *f = nb_trace(ctx, local_fn, NULL, spec);
  CHECK_MSG(f != NULL, "tracing the local function: %s", nb_ctx_error(ctx));
  const char *rows[2] = {"data", NULL};
  nb_part_spec in_specs[1] = {rows}, out_specs[4] = {NULL, rows, rows, rows};
  /* outputs are in path order: loss, mixed, moved, ring */
  nb_graph *sm = f ? nb_shard_map(ctx, f, in_specs, out_specs) : NULL;
  CHECK_MSG(sm != NULL, "shard_map: %s", nb_ctx_error(ctx));
  if (sm) {
    nb_tree *in = nb_tree_create(ctx);
    nb_array *x = input_of(ctx, 7, NB_F64, 4, 6); /* the same global value on both ranks */
    nb_tree_set_array(in, "x", x);
    /* loss = sum(sin(X) * X) over the global X, on every rank */
    nb_array *loss = nb_test_eval_output(ctx, call_graph, sm, in, "loss");
    double want = 0;
    for (int64_t i = 0; i < 24; i++) want += sin(nb_array_get(x, i)) * nb_array_get(x, i);
    CHECK_MSG(loss && fabs(nb_array_get(loss, 0) - want) < 1e-12 * (1 + fabs(want)), "loss %.17g, want %.17g",
              loss ? nb_array_get(loss, 0) : NAN, want);
    nb_array *ring = nb_test_eval_output(ctx, call_graph, sm, in, "ring");
    /* ring's block r is sin of block 1-r */
    CHECK(ring && nb_array_get(ring, 0) == sin(nb_array_get(x, 12)) && nb_array_get(ring, 12) == sin(nb_array_get(x, 0)));
    CHECK_MSG(nb_test_check_grads(ctx, "shard_map over 2 processes", call_graph, sm, in, 1e-6, true),
              "gradients vs finite differences on rank %d", rank);
    nb_jit_opts o = nb_test_jit_opts(NULL);
    CHECK(nb_test_jit_matches(ctx, sm, in, &o, "shard_map compiled", NULL));
    nb_array_release(loss);
    nb_array_release(ring);
    nb_array_release(x);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(sm);
  nb_graph_destroy(f);
  nb_tree_destroy(spec);
}

/* ---------------------------------------------------------------- asynchronous */

/* psum, all_gather and psum_scatter started early and waited for late, with
 * products in between: the same bits as each collective run as one
 * synchronous step (async off), and the interpreter's values. */
enum { AN = 64 };
static nb_status f_async(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *sum = nb_psum(nb_exp(nb_mul(x, nb_scalar(g, NB_F32, 0.25))), "data");
  nb_val *gat = nb_all_gather(nb_tanh(x), "data", 0, true);
  nb_val *xc[2] = {x, nb_cos(x)};
  nb_val *sca = nb_psum_scatter(nb_sin(nb_concatenate(2, xc, 0)), "data", 0, true);
  nb_val *t = nb_matmul(nb_matmul(nb_sin(x), nb_cos(x)), nb_sin(x));
  static const int64_t lo[2] = {AN, 0}, hi[2] = {2 * AN, AN};
  nb_val *top = nb_slice(gat, lo, hi, NULL);
  nb_tree_set_val(out, "sum", nb_add(sum, t));
  nb_tree_set_val(out, "gat", nb_mul(top, t));
  return nb_tree_set_val(out, "sca", nb_sub(sca, t));
}

static void check_async(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = input_of(ctx, rank, NB_F32, AN, AN);
  nb_tree_set_array(in, "x", x);
  nb_graph *g = nb_trace(ctx, f_async, NULL, in);
  nb_jit_opts on = nb_test_jit_opts(NULL), off = nb_test_jit_opts("async");
  nb_exe *ea = g ? nb_jit(ctx, g, &on) : NULL, *es = g ? nb_jit(ctx, g, &off) : NULL;
  CHECK_MSG(ea && es, "%s", nb_ctx_error(ctx));
  int starts = 0, waits = 0, sync = 0;
  for (size_t i = 0; ea && i < nb_exe_num_steps(ea); i++) {
    nb_exe_step_info s;
    nb_exe_step(ea, i, &s);
    starts += s.kind == NB_EXE_STEP_START;
    waits += s.kind == NB_EXE_STEP_WAIT;
  }
  for (size_t i = 0; es && i < nb_exe_num_steps(es); i++) {
    nb_exe_step_info s;
    nb_exe_step(es, i, &s);
    sync += s.kind == NB_EXE_STEP_START || s.kind == NB_EXE_STEP_WAIT;
  }
  CHECK_MSG(starts == 3 && waits == 3 && sync == 0, "%d starts, %d waits; %d with async off", starts, waits, sync);
  nb_tree *oa = nb_tree_create(ctx), *os = nb_tree_create(ctx);
  for (int rep = 0; ea && es && rep < 3; rep++) { /* again on the same arena */
    CHECK_OK(ctx, nb_exe_run(ea, in, oa));
    CHECK_OK(ctx, nb_exe_run(es, in, os));
    const char *paths[] = {"sum", "gat", "sca"};
    for (int i = 0; i < 3; i++) {
      nb_array *a = nb_tree_get_array(oa, paths[i]), *s = nb_tree_get_array(os, paths[i]);
      CHECK_MSG(a && s && nb_array_nbytes(a) == nb_array_nbytes(s) && !memcmp(nb_array_data(a), nb_array_data(s), nb_array_nbytes(a)),
                "%s: async and sync differ on rank %d", paths[i], rank);
    }
  }
  CHECK_MSG(g && nb_test_jit_matches(ctx, g, in, &on, "async", NULL), "async compiled vs interpreter on rank %d", rank);
  nb_tree_destroy(oa);
  nb_tree_destroy(os);
  nb_exe_destroy(ea);
  nb_exe_destroy(es);
  nb_graph_destroy(g);
  nb_array_release(x);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- misuse */

static void check_misuse(nb_ctx *ctx, nb_dist_mesh *m) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_scalar(g, NB_F32, 1);
  nb_psum(x, "model");
  CHECK_MSG(strstr(nb_graph_error(g), "axis 'model' is not bound") != NULL, "%s", nb_graph_error(g));
  nb_graph_destroy(g);
  nb_ctx_clear_error(ctx);
  /* traced with data=2, run where data is the one-process comm */
  nb_tree *in = nb_tree_create(ctx);
  nb_array *a = input_of(ctx, rank, NB_F32, 2, 2);
  nb_tree_set_array(in, "x", a);
  nb_graph *sum = nb_trace(ctx, trace_op, (void *)&ops[0], in);
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "data", nb_comm_self()));
  nb_tree *out = nb_tree_create(ctx);
  CHECK(sum && nb_graph_run(ctx, sum, in, out) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "traced with size 2 but runs over 1");
  CHECK_OK(ctx, nb_dist_mesh_bind(m, ctx));
  nb_tree_destroy(out);
  nb_graph_destroy(sum);
  nb_array_release(a);
  nb_tree_destroy(in);
  /* two axes: data over the 2 processes (the last axis varies fastest), model of size 1 */
  nb_dist_mesh *m2 = nb_dist_mesh_create(ctx, 2, (const char *[]){"model", "data"}, (int64_t[]){1, -1});
  CHECK_MSG(m2 && nb_dist_mesh_axis_size(m2, 1) == 2 && nb_dist_mesh_axis_size(m2, 0) == 1, "%s", nb_ctx_error(ctx));
  nb_comm *model = m2 ? nb_dist_mesh_axis(m2, "model") : NULL, *data = m2 ? nb_dist_mesh_axis(m2, "data") : NULL;
  CHECK(model && model->ops->size(model) == 1 && model->ops->rank(model) == 0);
  CHECK(data && data->ops->size(data) == 2 && data->ops->rank(data) == rank);
  float v = (float)(rank + 1);
  CHECK(model && model->ops->allreduce(model, ctx, &v, 1, NB_F32, NB_COMM_SUM) == NB_OK && v == (float)(rank + 1));
  CHECK(data && data->ops->allreduce(data, ctx, &v, 1, NB_F32, NB_COMM_SUM) == NB_OK && v == 3.0f);
  nb_dist_mesh_destroy(m2);
  CHECK(nb_dist_mesh_create(ctx, 1, (const char *[]){"data"}, (int64_t[]){3}) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "do not multiply to the job's 2 processes");
}

/* ---------------------------------------------------------------- broken jobs */

/* "inflight": both ranks start a psum in a compiled step, then a chain of
 * products; rank 1 dies (a thread _exits) while its products run, with the
 * psum in flight. Rank 0's wait must end the job naming rank 1. */
static void *die_soon(void *u) {
  usleep(50 * 1000);
  _exit(0);
  return NULL;
}

static nb_status f_inflight(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *t = x;
  for (int i = 0; i < 24; i++) t = nb_tanh(nb_matmul(t, x));
  return nb_tree_set_val(out, "y", nb_add(nb_psum(nb_exp(x), "data"), t));
}

static int inflight_job(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *a = input_of(ctx, rank, NB_F32, 512, 512);
  nb_tree_set_array(in, "x", a);
  nb_graph *g = nb_trace(ctx, f_inflight, NULL, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
  if (!e) return fprintf(stderr, "rank %d: %s\n", rank, nb_ctx_error(ctx)), 1;
  nb_comm *c = nb_ctx_axis(ctx, "data");
  if (c->ops->barrier(c, ctx)) return 1; /* both compiled: the psum starts on both */
  pthread_t t;
  if (rank == 1) pthread_create(&t, NULL, die_soon, NULL);
  nb_exe_run(e, in, out); /* rank 0: ends the job */
  fprintf(stderr, "rank %d: the run returned: %s\n", rank, nb_ctx_error(ctx));
  return 1;
}

static int broken_job(nb_ctx *ctx, nb_dist_mesh *m, const char *mode) {
  nb_dist_mesh_axis(m, "data")->timeout_s = 3;
  if (!strcmp(mode, "inflight")) return inflight_job(ctx);
  if (rank == 1) {
    if (!strcmp(mode, "exit")) _exit(0); /* gone without a word */
    sleep(60);                           /* "hang": never joins */
    return 0;
  }
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *a = input_of(ctx, 0, NB_F32, 2, 2);
  nb_tree_set_array(in, "x", a);
  nb_graph *sum = nb_trace(ctx, trace_op, (void *)&ops[0], in);
  nb_graph_run(ctx, sum, in, out); /* ends the job */
  fprintf(stderr, "rank 0: the sum returned: %s\n", nb_ctx_error(ctx));
  return 1;
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (nb_dist_init(ctx, &argc, &argv)) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  rank = nb_dist_rank();
  nb_dist_mesh *m = nb_dist_mesh_create(ctx, 1, (const char *[]){"data"}, (int64_t[]){-1});
  if (!m || nb_dist_size() != 2 || nb_dist_mesh_bind(m, ctx)) {
    fprintf(stderr, "needs 2 processes (tests/dist/mpirun.sh 2 ...): %s\n", nb_ctx_error(ctx));
    return 1;
  }
  if (argc > 1) return broken_job(ctx, m, argv[1]);
  size_t base = nb_ctx_bytes_in_use(ctx);
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) check_op(ctx, &ops[i]);
  check_shard_map_grads(ctx);
  check_async(ctx);
  check_misuse(ctx, m);
  /* leak check of our own (LeakSanitizer is off under mpirun: tests/dist/mpirun.sh) */
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes leaked on rank %d", nb_ctx_bytes_in_use(ctx) - base, rank);
  char name[64];
  snprintf(name, sizeof name, "dist/collectives rank %d", rank);
  int rc = nb_test_summary(name);
  nb_dist_mesh_destroy(m);
  nb_ctx_destroy(ctx);
  nb_dist_finalize();
  return rc;
}
