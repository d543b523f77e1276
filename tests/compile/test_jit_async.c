/* Collectives as a start step and a wait step apart, in one process: a
 * "mirror" communicator of size 2 whose other rank holds this rank's values
 * and whose asynchronous collectives behave as messages in flight: the
 * result lands in recv at the start, and the wait checks that the operand
 * (what is being sent) did not change in between. So a plan that lets
 * another value share an operand's or a result's memory while the
 * collective is in flight fails here (seen failing with the wait's operands
 * and results left out of the live ranges). Also: the schedule puts
 * independent work between start and wait, async results equal the
 * synchronous ones bit for bit, and nb_comm_self's plans are unchanged.
 * Two processes over MPI: tests/dist/test_collectives.c. */
#include "jitcheck.h"

/* ---------------------------------------------------------------- the mirror communicator */

typedef struct mirror {
  nb_comm base;
  int starts, waits;
} mirror;

struct nb_comm_req {
  const void *send; /* checked unchanged at the wait */
  char *snapshot;
  size_t bytes;
  /* allreduce: folded at the wait, in place */
  void *buf;
  size_t count;
  nb_dtype t;
  nb_comm_reduce op;
};

static int m_rank(const nb_comm *c) { return 0; }
static int m_size(const nb_comm *c) { return 2; }

static nb_status m_allgather(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes) {
  memmove(recv, send, bytes);
  memmove((char *)recv + bytes, send, bytes);
  return NB_OK;
}
static nb_status m_allreduce(nb_comm *c, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op) {
  char *copy = malloc(count * nb_dtype_size(t) + 1);
  memcpy(copy, buf, count * nb_dtype_size(t));
  nb_status s = nb_comm_fold(ctx, t, buf, copy, count, op); /* x0 op x1, x1 == x0 */
  free(copy);
  return s;
}
/* block 0 (this rank's) of both ranks' send, folded */
static nb_status m_reduce_scatter(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                                  nb_comm_reduce op) {
  memmove(recv, send, count * nb_dtype_size(t));
  return nb_comm_fold(ctx, t, recv, send, count, op);
}
static nb_status m_all_to_all(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes) {
  memmove(recv, send, bytes);
  memmove((char *)recv + bytes, send, bytes);
  return NB_OK;
}
static nb_status m_sendrecv(nb_comm *c, nb_ctx *ctx, const void *send, int dst, void *recv, int src, size_t bytes) {
  if (src >= 0) memmove(recv, send, bytes);
  return NB_OK;
}
static nb_status m_barrier(nb_comm *c, nb_ctx *ctx) { return NB_OK; }
static void m_abort(nb_comm *c, int code, const char *msg) {
  fprintf(stderr, "mirror abort: %s\n", msg);
  exit(code ? code : 1);
}

static nb_comm_req *req_of(const void *send, size_t bytes) {
  nb_comm_req *q = calloc(1, sizeof *q);
  q->send = send;
  q->bytes = bytes;
  q->snapshot = malloc(bytes + 1);
  memcpy(q->snapshot, send, bytes);
  return q;
}
static nb_status m_allgather_start(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes, nb_comm_req **req) {
  ((mirror *)c)->starts++;
  *req = req_of(send, bytes);
  return m_allgather(c, ctx, send, recv, bytes); /* arrived at once */
}
static nb_status m_allreduce_start(nb_comm *c, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op,
                                   nb_comm_req **req) {
  ((mirror *)c)->starts++;
  nb_comm_req *q = req_of(buf, count * nb_dtype_size(t));
  q->buf = buf;
  q->count = count;
  q->t = t;
  q->op = op;
  *req = q;
  return NB_OK;
}
static nb_status m_reduce_scatter_start(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                                        nb_comm_reduce op, nb_comm_req **req) {
  ((mirror *)c)->starts++;
  *req = req_of(send, count * 2 * nb_dtype_size(t));
  return m_reduce_scatter(c, ctx, send, recv, count, t, op);
}
static nb_status m_test(nb_comm *c, nb_ctx *ctx, nb_comm_req *req, bool *done) {
  *done = false;
  return NB_OK;
}
static nb_status m_wait(nb_comm *c, nb_ctx *ctx, nb_comm_req *q) {
  ((mirror *)c)->waits++;
  nb_status s = NB_OK;
  if (memcmp(q->send, q->snapshot, q->bytes)) s = nb_errorf(ctx, NB_ERR_INTERNAL, "mirror: a collective's operand changed while in flight");
  else if (q->buf) s = m_allreduce(c, ctx, q->buf, q->count, q->t, q->op);
  free(q->snapshot);
  free(q);
  return s;
}

static const nb_comm_ops mirror_ops = {
    .name = "mirror",
    .rank = m_rank,
    .size = m_size,
    .allgather = m_allgather,
    .allreduce = m_allreduce,
    .reduce_scatter = m_reduce_scatter,
    .all_to_all = m_all_to_all,
    .sendrecv = m_sendrecv,
    .barrier = m_barrier,
    .abort = m_abort,
    .allgather_start = m_allgather_start,
    .allreduce_start = m_allreduce_start,
    .reduce_scatter_start = m_reduce_scatter_start,
    .test = m_test,
    .wait = m_wait,
};

/* ---------------------------------------------------------------- graphs */

enum { N = 48 };

/* Each collective's operand is an intermediate that dies at its start when
 * the wait is not counted, and its result is written from the start on;
 * between them run two products whose operands and results (each [N,N],
 * as large as the collective's buffers) the arena would like to place in
 * exactly that memory. */
static nb_status f_overlap(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  nb_val *a = nb_exp(nb_mul(x, nb_scalar(g, NB_F32, 0.5)));
  nb_val *sum = nb_psum(a, "d");                                  /* [N,N] */
  nb_val *gat = nb_all_gather(nb_tanh(x), "d", 0, true);          /* [2N,N] */
  nb_val *xw[2] = {x, w};
  nb_comm *c = nb_ctx_axis(nb_graph_ctx(g), "d");
  nb_val *blocks = c->ops->size(c) == 2 ? nb_concatenate(2, xw, 0) : x; /* [size N, N] */
  nb_val *sca = nb_psum_scatter(nb_sin(blocks), "d", 0, true); /* [N,N] */
  nb_val *t1 = nb_matmul(nb_sin(w), nb_cos(w));
  nb_val *t2 = nb_matmul(nb_cos(t1), nb_sin(t1));
  static const int64_t lo[2] = {0, 0}, hi[2] = {N, N};
  nb_val *top = nb_slice(gat, lo, hi, NULL);
  nb_tree_set_val(out, "sum", nb_add(sum, t2));
  nb_tree_set_val(out, "gat", nb_mul(top, t2));
  return nb_tree_set_val(out, "sca", nb_sub(sca, t2));
}

static nb_tree *inputs(nb_ctx *ctx) {
  nb_test_rng r = {42};
  nb_tree *in = nb_tree_create(ctx);
  int64_t d[2] = {N, N};
  nb_test_set_randn(in, &r, "x", NB_F32, 2, d);
  nb_test_set_randn(in, &r, "w", NB_F32, 2, d);
  return in;
}

static bool same_bits(const nb_array *a, const nb_array *b) {
  return a && b && nb_array_nbytes(a) == nb_array_nbytes(b) && !memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a));
}

static void count_kinds(const nb_exe *e, int *starts, int *waits, int *between) {
  *starts = *waits = *between = 0;
  int open = 0;
  for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info s;
    nb_exe_step(e, i, &s);
    if (s.kind == NB_EXE_STEP_START) ++*starts, open++;
    else if (s.kind == NB_EXE_STEP_WAIT) ++*waits, open--;
    else if (open > 0 && s.kind == NB_EXE_STEP_BLAS) ++*between; /* a product while a collective is in flight */
  }
}

static nb_tree *run(nb_ctx *ctx, nb_exe *e, const nb_tree *in) {
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_exe_run(e, in, out));
  return out;
}

static void test_in_flight(nb_ctx *ctx) {
  mirror m = {{&mirror_ops, 0}, 0, 0};
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "d", &m.base));
  nb_tree *in = inputs(ctx);
  nb_graph *g = nb_trace(ctx, f_overlap, NULL, in);
  CHECK(g != NULL);
  nb_tree *want = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want)); /* the interpreter: synchronous */
  nb_jit_opts on = nb_test_jit_opts(NULL), off = nb_test_jit_opts("async");
  nb_exe *ea = nb_jit(ctx, g, &on), *es = nb_jit(ctx, g, &off);
  CHECK_MSG(ea && es, "%s", nb_ctx_error(ctx));
  if (!ea || !es) return;
  int starts, waits, between;
  count_kinds(ea, &starts, &waits, &between);
  CHECK_MSG(starts == 3 && waits == 3, "%d starts, %d waits (3 collectives)", starts, waits);
  CHECK_MSG(between >= 2, "%d products while a collective is in flight (want both)", between);
  count_kinds(es, &starts, &waits, &between);
  CHECK_MSG(starts == 0 && waits == 0, "async off: %d starts, %d waits", starts, waits);
  m.starts = m.waits = 0;
  for (int rep = 0; rep < 2; rep++) { /* the second run reuses the arena */
    nb_tree *a = run(ctx, ea, in), *s = run(ctx, es, in);
    const char *paths[] = {"sum", "gat", "sca"};
    for (int i = 0; i < 3; i++) {
      nb_array *ya = nb_tree_get_array(a, paths[i]), *ys = nb_tree_get_array(s, paths[i]), *yw = nb_tree_get_array(want, paths[i]);
      CHECK_MSG(same_bits(ya, ys), "%s: async and sync differ", paths[i]);
      CHECK_MSG(ya && yw && nb_test_max_rel_diff(ya, yw) <= nb_test_jit_tol(NB_F32), "%s: compiled vs interpreter: %g", paths[i],
                ya && yw ? nb_test_max_rel_diff(ya, yw) : -1.0);
    }
    nb_tree_destroy(a);
    nb_tree_destroy(s);
  }
  CHECK_MSG(m.starts == 6 && m.waits == 6, "the runs started %d and waited %d collectives (want 6, 6)", m.starts, m.waits);
  nb_exe_destroy(ea);
  nb_exe_destroy(es);
  nb_graph_destroy(g);
  nb_tree_destroy(want);
  nb_tree_destroy(in);
  nb_ctx_bind_axis(ctx, "d", NULL);
}

/* The one-process communicator has no asynchronous operations: the plan is
 * the synchronous one, step for step. */
static void test_self_unchanged(nb_ctx *ctx) {
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "d", nb_comm_self()));
  nb_tree *in = inputs(ctx);
  nb_graph *g = nb_trace(ctx, f_overlap, NULL, in);
  nb_jit_opts on = nb_test_jit_opts(NULL);
  nb_exe *e = nb_jit(ctx, g, &on);
  CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
  int starts = -1, waits = -1, between;
  if (e) count_kinds(e, &starts, &waits, &between);
  CHECK_MSG(starts == 0 && waits == 0, "nb_comm_self: %d starts, %d waits", starts, waits);
  CHECK(g && nb_test_jit_matches(ctx, g, in, &on, "self", NULL));
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_ctx_bind_axis(ctx, "d", NULL);
}

/* nb_comm_fold's f32 loop against the rule it stands for (one add in
 * double, rounded to f32), over random bit patterns: normals, subnormals,
 * infinities, NaNs. */
static void test_fold_f32(nb_ctx *ctx) {
  enum { M = 1 << 18 };
  float *a = malloc(M * sizeof *a), *b = malloc(M * sizeof *b), *sum = malloc(M * sizeof *sum), *max = malloc(M * sizeof *max);
  nb_test_rng r = {7};
  for (int i = 0; i < M; i++) {
    uint32_t u = (uint32_t)nb_test_int(&r, 0, 0xffffffffll), v = (uint32_t)nb_test_int(&r, 0, 0xffffffffll);
    if (i % 4 == 1) v = (u & 0xff800000u) | (v & 0x807fffffu); /* the same exponent: cancellation */
    memcpy(&a[i], &u, 4);
    memcpy(&b[i], &v, 4);
  }
  memcpy(sum, a, M * sizeof *a);
  memcpy(max, a, M * sizeof *a);
  CHECK_OK(ctx, nb_comm_fold(ctx, NB_F32, sum, b, M, NB_COMM_SUM));
  CHECK_OK(ctx, nb_comm_fold(ctx, NB_F32, max, b, M, NB_COMM_MAX));
  int bad = 0;
  for (int i = 0; i < M; i++) {
    double x = a[i], y = b[i];
    float ws = (float)(x + y), wm = (float)((x != x || y != y) ? x + y : x > y ? x : y);
    bool nan_ok = ws != ws && sum[i] != sum[i];
    if ((!nan_ok && memcmp(&ws, &sum[i], 4)) || (wm == wm ? memcmp(&wm, &max[i], 4) != 0 : max[i] == max[i])) bad++;
  }
  CHECK_MSG(bad == 0, "%d of %d f32 folds differ from the double rule", bad, (int)M);
  free(a), free(b), free(sum), free(max);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_fold_f32(ctx);
  test_in_flight(ctx);
  test_self_unchanged(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/jit_async");
}
