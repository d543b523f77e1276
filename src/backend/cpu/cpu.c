/* The CPU backend behind backend/backend.h: device memory is host memory;
 * a plan's kernels become C (codegen_c.c) built by the system C compiler
 * into a cached shared object (cc.c), and a kernel step is split into tasks
 * over the thread pool (pool.c); contractions run as GEMMs through cblas
 * (blas.c). Not here: which step runs when, or binding buffers
 * (runtime/exe.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "util/util.h"

/* elements of work per task below which splitting does not pay: at 32768 a
 * tiny model's decode ran at 0.87x its one-thread speed at two threads (the
 * split kernels' data moved between the cores), at 65536 1.00x, with the
 * tiny training step 0.5-2% slower (bench/pool_oversubscribed.sh) */
#define MIN_TASK_WORK 65536

struct nb_backend_module {
  const nb_jplan *plan;
  void *dl;               /* shared object, NULL when the plan has no kernels */
  nb_kernel_fn *fns;      /* per kernel */
  nb_pool *pool;
};

/* ---------------------------------------------------------------- memory */

static void *cpu_alloc(nb_ctx *ctx, size_t bytes) { return nb_alloc(ctx, bytes); }
static void cpu_free(nb_ctx *ctx, void *p, size_t bytes) { nb_dealloc(ctx, p, bytes); }

/* to_device, to_host and copy: all of them host memory */
static nb_status cpu_copy(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  (void)ctx;
  if (bytes && dst != src) memcpy(dst, src, bytes);
  return NB_OK;
}

/* ---------------------------------------------------------------- compiling */

static void cpu_release(nb_backend_module *m) {
  if (!m) return;
  nb_cpu__pool_put(m->pool);
  nb_cpu__unload(m->dl);
  free(m->fns);
  free(m);
}

static nb_status build_native(nb_ctx *ctx, const nb_jit_config *cfg, const nb_jplan *plan, nb_backend_module *m,
                              nb_backend_build *b, bool *native) {
  nb_jit_text src = {ctx, NULL, 0, 0, false};
  double t0 = nb_util__now_ms();
  nb_status st = nb_cpu__codegen_c(ctx, plan, &src);
  b->codegen_ms = nb_util__now_ms() - t0;
  if (st != NB_OK) return nb_jit__text_free(&src), st;
  t0 = nb_util__now_ms();
  char why[1600] = "";
  if (!cfg->off[NB_SW_native] && plan->nkernels > 0) {
    m->dl = nb_cpu__load(ctx, cfg, src.s, src.n, b->source, sizeof b->source, &b->from_cache, why, sizeof why);
    m->fns = m->dl ? calloc((size_t)plan->nkernels, sizeof(nb_kernel_fn)) : NULL;
    if (m->dl && !m->fns) snprintf(why, sizeof why, "out of memory");
    for (int k = 0; m->fns && k < plan->nkernels; k++) {
      char name[32];
      snprintf(name, sizeof name, "nbk_%d", k);
      void *sym = nb_cpu__sym(m->dl, name);
      memcpy(&m->fns[k], &sym, sizeof sym);
      if (!sym) {
        snprintf(why, sizeof why, "symbol %s missing from %s", name, b->source);
        free(m->fns);
        m->fns = NULL;
      }
    }
    if (m->dl && !m->fns) {
      nb_cpu__unload(m->dl);
      m->dl = NULL;
    }
    if (!m->dl) nb_logf(ctx, NB_LOG_WARN, "jit: no native code (%s); this executable runs on the interpreter", why);
  }
  *native = cfg->off[NB_SW_native] ? false : plan->nkernels == 0 || m->dl != NULL;
  b->build_ms = nb_util__now_ms() - t0;
  nb_jit__text_free(&src);
  return NB_OK;
}

static nb_status cpu_compile(nb_ctx *ctx, const nb_jit_config *cfg, const nb_jplan *plan, nb_backend_module **out,
                             nb_backend_build *b) {
  *out = NULL;
  nb_backend_module *m = calloc(1, sizeof *m);
  if (!m) return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory");
  m->plan = plan;
  bool native = false;
  nb_status st = build_native(ctx, cfg, plan, m, b, &native);
  bool blas = false;
  for (int s = 0; s < plan->nsteps; s++) blas |= plan->steps[s].kind == NB_EXE_STEP_BLAS;
  if (st == NB_OK && native && (plan->nkernels || blas)) { /* BLAS steps split batches over the pool */
    m->pool = nb_cpu__pool_get(cfg->threads);
    if (!m->pool) st = nb_errorf(ctx, NB_ERR_NOMEM, "jit: cannot start the thread pool");
  }
  if (st != NB_OK || !native) {
    cpu_release(m);
    return st;
  }
  *out = m;
  return NB_OK;
}

/* ---------------------------------------------------------------- running */

typedef struct launch {
  nb_kernel_fn fn;
  char *const *bufs;
  int64_t total;
  int ntasks;
} launch;

static void run_task(void *arg, int t) {
  const launch *l = arg;
  int64_t lo = l->total / l->ntasks * t + (t < l->total % l->ntasks ? t : l->total % l->ntasks);
  int64_t hi = lo + l->total / l->ntasks + (t < l->total % l->ntasks ? 1 : 0);
  l->fn(lo, hi, l->bufs);
}

static nb_status cpu_launch(nb_ctx *ctx, nb_backend_module *m, int kernel, char *const *args) {
  (void)ctx;
  const nb_kernel *k = &m->plan->kernels[kernel];
  nb_kernel_fn fn = m->fns[kernel];
  int64_t total = 1, work = 1;
  for (int v = 0; v < k->ro; v++) total *= k->dims[v];
  for (int v = k->ro; v < k->ro + k->rr; v++) work *= k->dims[v];
  if (total == 0) return NB_OK;
  int threads = nb_cpu__pool_threads(m->pool);
  int64_t by_work = total * (work ? work : 1) / MIN_TASK_WORK;
  int64_t n = threads > 1 ? (by_work < 4 * (int64_t)threads ? by_work : 4 * (int64_t)threads) : 1;
  if (n > total) n = total;
  if (n <= 1) {
    fn(0, total, args);
    return NB_OK;
  }
  launch l = {fn, args, total, (int)n};
  nb_cpu__pool_run(m->pool, (int)n, run_task, &l);
  return NB_OK;
}

static nb_status cpu_library(nb_ctx *ctx, nb_backend_module *m, const nb_eqn *e, char *const *args) {
  return nb_cpu__blas_run(ctx, m->pool, e, args[0], args[1], args[2]);
}

static void cpu_parallel(nb_backend_module *m, int ntasks, void (*task)(void *arg, int i), void *arg) {
  nb_cpu__pool_run(m->pool, ntasks, task, arg); /* no pool (a plan without kernels or products): inline */
}

static int cpu_threads(const nb_backend_module *m) { return nb_cpu__pool_threads(m->pool); }

static nb_status cpu_synchronize(nb_ctx *ctx, nb_backend_module *m) {
  (void)ctx, (void)m;
  return NB_OK;
}

const nb_backend nb_cpu__backend = {
    .name = "cpu",
    .host_memory = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .library_supported = nb_cpu__blas_supported,
    .compile = cpu_compile,
    .release = cpu_release,
    .launch = cpu_launch,
    .library = cpu_library,
    .parallel = cpu_parallel,
    .threads = cpu_threads,
    .synchronize = cpu_synchronize,
    .cache_usage = nb_cpu__cache_usage,
};
