/* nb_jit_parallel_for: a custom call's kernel run by a compiled executable
 * gets that executable's threads (nb_jit_opts.threads), every task exactly
 * once; interpreted, or called outside any executable, the tasks run in
 * order on the calling thread. The kernel writes out[i] = 2 x[i] + 1 in
 * tasks of 8 elements and reports nb_jit_parallel_threads() in its last
 * element, so a run that did not lend the pool shows 1 there. */
#include <stdatomic.h>

#include "nabla/compile.h"
#include "test.h"

enum { N = 257, PER_TASK = 8 };

typedef struct job {
  const float *x;
  float *y;
  atomic_int *runs; /* per task */
} job;

static void task(void *arg, int i) {
  job *j = arg;
  atomic_fetch_add(&j->runs[i], 1);
  for (int k = i * PER_TASK; k < (i + 1) * PER_TASK && k < N; k++) j->y[k] = 2 * j->x[k] + 1;
}

static int bad_runs; /* tasks that ran other than once, over every call */

/* [N] -> [N + 1]: the doubled-plus-one values, then the threads lent */
static nb_status par_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  (void)ud, (void)nin, (void)attrs, (void)size, (void)nout;
  int64_t d = in[0].shape.dims[0] + 1;
  out[0] = nb_aval_make(NB_F32, 1, &d);
  return NB_OK;
}

static nb_status par_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                          nb_array **out) {
  (void)ud, (void)ctx, (void)nin, (void)attrs, (void)size, (void)nout;
  enum { TASKS = (N + PER_TASK - 1) / PER_TASK };
  atomic_int runs[TASKS];
  for (int i = 0; i < TASKS; i++) atomic_init(&runs[i], 0);
  float *y = nb_array_data_mut(out[0]);
  job j = {nb_array_data(in[0]), y, runs};
  nb_jit_parallel_for(TASKS, task, &j);
  for (int i = 0; i < TASKS; i++) bad_runs += atomic_load(&runs[i]) != 1;
  y[N] = (float)nb_jit_parallel_threads();
  return NB_OK;
}

/* y = par(x + 1): the add is a kernel, so the executable has a pool */
static nb_status f(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)u;
  nb_val *x = nb_add(nb_tree_get_val(in, "x"), nb_scalar(g, NB_F32, 1));
  return nb_tree_set_val(out, "y", nb_custom_call(g, "test.par", 1, &x, NULL, 0, 1, NULL));
}

/* runs g (jit with `threads`, or interpreted when threads is 0); returns the threads the kernel saw */
static float run(nb_ctx *ctx, nb_graph *g, const nb_tree *in, int threads) {
  nb_tree *out = nb_tree_create(ctx);
  nb_exe *e = NULL;
  if (threads) {
    nb_jit_opts o = {.threads = threads};
    e = nb_jit(ctx, g, &o);
    CHECK(e != NULL);
    if (!e) return -1;
    CHECK_OK(ctx, nb_exe_run(e, in, out));
  } else
    CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  nb_array *y = nb_tree_get_array(out, "y"), *x = nb_tree_get_array(in, "x");
  const float *yv = nb_array_data(y), *xv = nb_array_data(x);
  int wrong = 0;
  for (int k = 0; k < N; k++) wrong += yv[k] != 2 * (xv[k] + 1) + 1;
  CHECK_MSG(wrong == 0, "threads %d: %d elements wrong", threads, wrong);
  float seen = yv[N];
  nb_tree_destroy(out);
  nb_exe_destroy(e);
  return seen;
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_custom_call_rules r = {.name = "test.par", .infer = par_infer, .eval = par_eval};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &r));
  float xs[N];
  for (int k = 0; k < N; k++) xs[k] = (float)(k % 13) - 6;
  int64_t n = N;
  nb_array *x = nb_array_create(ctx, NB_F32, 1, &n, xs);
  nb_tree *in = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_tree_set_array(in, "x", x));
  nb_array_release(x);
  nb_graph *g = nb_trace(ctx, f, NULL, in);
  CHECK(g != NULL);
  if (g) {
    CHECK(run(ctx, g, in, 0) == 1); /* interpreted: no pool */
    CHECK(run(ctx, g, in, 1) == 1);
    float t2 = run(ctx, g, in, 2), t3 = run(ctx, g, in, 3);
    CHECK_MSG(t2 == 2 && t3 == 3, "the kernel saw %g and %g threads in executables of 2 and 3", t2, t3);
  }
  /* outside any executable: inline */
  CHECK(nb_jit_parallel_threads() == 1);
  float y[N];
  atomic_int runs[(N + PER_TASK - 1) / PER_TASK];
  for (int i = 0; i < (N + PER_TASK - 1) / PER_TASK; i++) atomic_init(&runs[i], 0);
  job j = {xs, y, runs};
  nb_jit_parallel_for((N + PER_TASK - 1) / PER_TASK, task, &j);
  for (int i = 0; i < (N + PER_TASK - 1) / PER_TASK; i++) bad_runs += atomic_load(&runs[i]) != 1;
  CHECK(y[N - 1] == 2 * xs[N - 1] + 1);
  CHECK_MSG(bad_runs == 0, "%d tasks ran other than once", bad_runs);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_parallel");
}
