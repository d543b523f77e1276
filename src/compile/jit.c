/* nb_jit: reads the options (the backend among them), runs the passes in
 * pipeline order (simplify, fuse, assign buffers) and has the backend compile
 * the plan, keeps live executables in a memory cache keyed by graph hash,
 * options and context, and reports what it did at the debug levels. Not
 * here: generating or building code (src/backend/), running
 * (runtime/exe.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/exe.h"
#include "util/trace.h"
#include "util/util.h"

static const char *const switch_names[NB_SW_COUNT] = {
#define NB_JIT_SW(n) #n,
    NB_JIT_SWITCHES(NB_JIT_SW)
#undef NB_JIT_SW
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static nb_exe *cache_list;

/* ---------------------------------------------------------------- options */

static nb_status parse_switches(nb_ctx *ctx, const char *list, const char *where, nb_jit_config *cfg) {
  if (!list) return NB_OK;
  const char *p = list;
  while (*p) {
    size_t n = strcspn(p, ", ");
    if (n > 0) {
      bool found = false;
      if (n == 3 && strncmp(p, "all", 3) == 0) {
        for (int i = 0; i < NB_SW_COUNT; i++)
          if (i != NB_SW_native) cfg->off[i] = true;
        found = true;
      }
      for (int i = 0; i < NB_SW_COUNT && !found; i++)
        if (strlen(switch_names[i]) == n && strncmp(p, switch_names[i], n) == 0) cfg->off[i] = found = true;
      if (!found)
        return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                         "jit: unknown switch '%.*s' in %s (known: dce, fold, algebra, inline, fuse, reuse, donate, parallel, blas, async, native, all)",
                         (int)n, p, where);
    }
    p += n;
    while (*p == ',' || *p == ' ') p++;
  }
  return NB_OK;
}

#define DEFAULT_CACHE_MAX_MB 1024

/* The disk cache's directory (the option, $NABLA_CACHE_DIR, ~/.cache/nabla/jit
 * or /tmp/nabla-jit-<uid>) and size limit ($NABLA_CACHE_MAX_MB). */
static nb_status cache_config(nb_ctx *ctx, const char *dir, nb_jit_config *cfg) {
  const char *home = getenv("HOME");
  int n;
  if (dir) n = snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s", dir);
  else if (getenv("NABLA_CACHE_DIR")) n = snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s", getenv("NABLA_CACHE_DIR"));
  else if (home && *home) n = snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s/.cache/nabla/jit", home);
  else n = snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "/tmp/nabla-jit-%d", (int)getuid());
  if (n < 0 || (size_t)n >= sizeof cfg->cache_dir || !cfg->cache_dir[0])
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: cache directory path is empty or too long");
  if (strchr(cfg->cache_dir, '\'')) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: cache directory may not contain a quote: %s", cfg->cache_dir);
  const char *max = getenv("NABLA_CACHE_MAX_MB");
  int64_t mb = DEFAULT_CACHE_MAX_MB;
  char why[160];
  if (max && !nb_parse_int(max, 1, INT64_C(1) << 40, &mb, why, sizeof why))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: NABLA_CACHE_MAX_MB must be a whole number of megabytes >= 1: %s", why);
  cfg->cache_max_bytes = (uint64_t)mb << 20;
  return NB_OK;
}

static nb_status make_config(nb_ctx *ctx, const nb_jit_opts *o, nb_jit_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  if (o && o->device.kind != NB_DEVICE_CPU)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "jit: only the CPU device is supported (got device kind %d)", (int)o->device.kind);
  const char *env_backend = getenv("NABLA_BACKEND");
  bool from_env = !(o && o->backend) && env_backend && *env_backend;
  const char *backend = o && o->backend ? o->backend : from_env ? env_backend : "cpu";
  if (!(cfg->backend = nb_backend__find(backend)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: unknown backend '%s' in %s (known: %s)", backend,
                     from_env ? "$NABLA_BACKEND" : "nb_jit_opts.backend", nb_backend__names());
  nb_status st = parse_switches(ctx, getenv("NABLA_JIT_DISABLE"), "NABLA_JIT_DISABLE", cfg);
  if (st == NB_OK && o) st = parse_switches(ctx, o->disable, "nb_jit_opts.disable", cfg);
  if (st != NB_OK) return st;
  const char *env_threads = getenv("NABLA_THREADS");
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t t = ncpu > 0 ? ncpu : 1;
  char why[160];
  if (!(o && o->threads) && env_threads && *env_threads && !nb_parse_int(env_threads, 1, 1024, &t, why, sizeof why))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: $NABLA_THREADS: %s", why);
  cfg->threads = o && o->threads ? o->threads : (int)t;
  if (cfg->threads < 0 || cfg->threads > 1024)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: threads must be in [0, 1024], got %d", cfg->threads);
  if (cfg->off[NB_SW_parallel]) cfg->threads = 1;
  cfg->debug = o && o->debug ? o->debug : nb_ctx_debug_level(ctx);
  const char *cc = o && o->cc ? o->cc : getenv("NABLA_CC") ? getenv("NABLA_CC") : "cc -O3 -march=native -fno-math-errno -fopenmp-simd -fPIC -shared";
  if (cache_config(ctx, o ? o->cache_dir : NULL, cfg) != NB_OK) return nb_ctx_status(ctx);
  if (strlen(cc) >= sizeof cfg->cc || !*cc) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "jit: compiler command is empty or too long");
  snprintf(cfg->cc, sizeof cfg->cc, "%s", cc);
  return NB_OK;
}

static nb_status cache_usage(nb_ctx *ctx, const char *cache_dir, bool clear, nb_jit_cache_info *out) {
  memset(out, 0, sizeof *out);
  nb_jit_config cfg;
  memset(&cfg, 0, sizeof cfg);
  nb_status st = cache_config(ctx, cache_dir, &cfg);
  return st ? st : nb_backend__find("cpu")->cache_usage(ctx, &cfg, clear, out); /* the one backend with a disk cache */
}

nb_status nb_jit_cache_stat(nb_ctx *ctx, const char *cache_dir, nb_jit_cache_info *out) {
  if (!out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_jit_cache_stat: NULL out");
  return cache_usage(ctx, cache_dir, false, out);
}

nb_status nb_jit_cache_clear(nb_ctx *ctx, const char *cache_dir, nb_jit_cache_info *out) {
  nb_jit_cache_info scratch;
  return cache_usage(ctx, cache_dir, true, out ? out : &scratch);
}

static uint64_t config_key(const nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg, const nb_jit_opts *o) {
  uint64_t h = nb__hash_combine(nb_graph_hash(g), (uint64_t)(uintptr_t)ctx);
  h = nb__hash_combine(h, nb__hash_bytes(cfg, sizeof *cfg, 7));
  for (const char *const *d = o && o->donate ? o->donate : NULL; d && *d; d++) h = nb__hash_combine(h, nb__hash_bytes(*d, strlen(*d), 9));
  return h;
}

static bool donated(const char *path, const char *const *donate) {
  for (; donate && *donate; donate++) {
    size_t n = strlen(*donate);
    if (n && strncmp(path, *donate, n) == 0 && (path[n] == 0 || path[n] == '/')) return true;
  }
  return false;
}

/* ---------------------------------------------------------------- diagnostics */

static void log_text(nb_ctx *ctx, const char *text) {
  const char *p = text;
  while (p && *p) {
    size_t n = strcspn(p, "\n");
    nb_logf(ctx, NB_LOG_INFO, "%.*s", (int)n, p);
    p += n + (p[n] == '\n');
  }
}

static void report(nb_exe *e) {
  nb_ctx *ctx = e->ctx;
  if (e->cfg.debug < 1) return;
  nb_exe_stats s;
  nb_exe_get_stats(e, &s);
  nb_logf(ctx, NB_LOG_INFO, "jit: %zu equations -> %zu steps (%zu kernels, %zu eval, %zu blas) for backend %s; arena %zu bytes, peak %zu bytes; %s%s (%.1f ms)",
          nb_graph_num_eqns(e->graph), s.nsteps, s.nkernels, s.neval, s.nblas, s.backend, s.arena_bytes, s.peak_bytes,
          e->native ? e->build.source : "interpreter", e->native && e->build.from_cache ? " (from the disk cache)" : "", e->compile_ms);
  nb_logf(ctx, NB_LOG_INFO, "jit: compile phases: simplify %.1f ms, fuse %.1f ms (%d attempts), buffers %.1f ms, codegen %.1f ms, %s %.1f ms",
          e->phase_ms[0], e->phase_ms[1], e->plan.fuse_attempts, e->phase_ms[2], e->phase_ms[3], e->build.from_cache ? "disk cache + load" : "C compiler + load",
          e->phase_ms[4]);
  if (s.nblas && e->cfg.backend == nb_backend__find("cpu")) nb_logf(ctx, NB_LOG_INFO, "jit: dot_general on %s", nb_jit_blas_core());
  if (e->cfg.debug >= 3) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
      nb_exe_print(e, f);
      fclose(f);
      log_text(ctx, buf);
      free(buf);
    }
  }
}

void nb_exe_print(const nb_exe *e, FILE *f) {
  if (!e || !f) return;
  const nb_jplan *p = &e->plan;
  fprintf(f, "optimized graph:\n");
  nb_graph_print(e->graph, f);
  fprintf(f, "backend: %s\n", e->cfg.backend->name);
  fprintf(f, "source: %s\n", e->native ? e->build.source : "(none: interpreter)");
  for (int s = 0; s < p->nsteps; s++) {
    const nb_jstep *st = &p->steps[s];
    fprintf(f, "step %d %s: %zu eqns, %.3g flops, %.3g bytes, last %.3f ms", s, st->name, st->neqns, st->flops, st->bytes, st->last_ms);
    if (st->kind == NB_EXE_STEP_KERNEL) {
      const nb_kernel *k = &p->kernels[st->kernel];
      fprintf(f, ", outer [");
      for (int v = 0; v < k->ro; v++) fprintf(f, "%s%lld", v ? "," : "", (long long)k->dims[v]);
      fprintf(f, "] inner [");
      for (int v = k->ro; v < k->ro + k->rr; v++) fprintf(f, "%s%lld", v > k->ro ? "," : "", (long long)k->dims[v]);
      fprintf(f, "] phases %d, %d nodes, writes", k->nphases, k->nnodes);
      for (int a = 0; a < k->nargs; a++)
        if (k->arg_written[a]) fprintf(f, " %%v%u", k->args[a]);
    }
    fprintf(f, "\n");
    if (st->kind == NB_EXE_STEP_CONTROL) nb_jit__control_print(st, f, 1);
  }
}

/* ---------------------------------------------------------------- pipeline */

/* The backend turns the plan into a module (NULL: run on the interpreter). */
static nb_status build(nb_exe *e) {
  nb_status st = e->cfg.backend->compile(e->ctx, &e->cfg, &e->plan, &e->mod, &e->build);
  e->phase_ms[3] = e->build.codegen_ms;
  e->phase_ms[4] = e->build.build_ms;
  e->native = e->mod != NULL;
  return st;
}

/* The compile's phases as spans of a trace, inside one "nb_jit" span
 * (src/util/trace.h); t[]: ns at the start of each phase and at the end. */
static void trace_compile(const nb_exe *e, const int64_t t[6]) {
  static const char *const names[] = {"simplify", "fuse", "buffers", "control bodies", "codegen + build"};
  nb_util__trace_arg args[] = {{"steps", NULL, e->plan.nsteps}, {"kernels", NULL, e->plan.nkernels},
                               {"from_disk_cache", NULL, e->build.from_cache}};
  nb_util__trace_span("compile", "nb_jit", t[0], t[5], args, 3);
  for (int i = 0; i < 5; i++) nb_util__trace_span("compile", names[i], t[i], t[i + 1], NULL, 0);
}

static nb_status compile(nb_exe *e, const nb_graph *g, const nb_jit_opts *o) {
  nb_ctx *ctx = e->ctx;
  int64_t t[6];
  t[0] = nb_util__now_ns();
  double t0 = (double)t[0] * 1e-6;
  e->graph = nb_jit__simplify(ctx, g, &e->cfg);
  e->phase_ms[0] = nb_util__now_ms() - t0;
  if (!e->graph) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (e->cfg.debug >= 4) {
    char *text = nb_graph_to_string(e->graph);
    nb_logf(ctx, NB_LOG_INFO, "jit: optimized graph:");
    log_text(ctx, text);
    free(text);
  }
  e->plan.ar = &e->ar;
  e->plan.g = e->graph;
  size_t nin = nb_graph_num_inputs(e->graph);
  e->plan.donated = nb_jit__alloc(&e->ar, nin + 1);
  if (!e->plan.donated) return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory");
  for (size_t i = 0; i < nin; i++) e->plan.donated[i] = donated(nb_graph_input_path(e->graph, i), o ? o->donate : NULL);
  t[1] = nb_util__now_ns();
  nb_status st = nb_jit__fuse(ctx, &e->plan, &e->cfg);
  t[2] = nb_util__now_ns();
  if (st == NB_OK) st = nb_jit__assign_buffers(ctx, &e->plan, &e->cfg);
  t[3] = nb_util__now_ns();
  e->phase_ms[1] = (double)(t[2] - t[1]) * 1e-6;
  e->phase_ms[2] = (double)(t[3] - t[2]) * 1e-6;
  if (st == NB_OK) st = nb_jit__control_compile(e);
  t[4] = nb_util__now_ns();
  if (st == NB_OK) st = build(e);
  t[5] = nb_util__now_ns();
  if (st != NB_OK) return st;
  if (nb_util__tracing()) trace_compile(e, t);
  for (int k = 0; k < e->plan.nkernels; k++)
    if (e->plan.kernels[k].nargs > e->max_args) e->max_args = e->plan.kernels[k].nargs;
  for (int s = 0; s < e->plan.nsteps; s++) {
    const nb_jstep *step = &e->plan.steps[s];
    if (step->kind == NB_EXE_STEP_BLAS && step->eqn->nin + step->eqn->nout > e->max_args) e->max_args = step->eqn->nin + step->eqn->nout;
  }
  e->compile_ms = nb_util__now_ms() - t0;
  return NB_OK;
}

nb_exe *nb_jit(nb_ctx *ctx, const nb_graph *g, const nb_jit_opts *opts) {
  if (!g) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_jit: NULL graph"), NULL;
  if (nb_graph_status(g)) return nb_errorf(ctx, nb_graph_status(g), "nb_jit: graph is in error: %s", nb_graph_error(g)), NULL;
  nb_jit_config cfg;
  if (make_config(ctx, opts, &cfg) != NB_OK) return NULL;
  uint64_t key = config_key(ctx, g, &cfg, opts);
  pthread_mutex_lock(&cache_mu);
  for (nb_exe *c = cache_list; c; c = c->link)
    if (c->key == key && c->ctx == ctx) {
      c->refs++;
      pthread_mutex_unlock(&cache_mu);
      return c;
    }
  pthread_mutex_unlock(&cache_mu);
  nb_exe *e = nb_calloc(ctx, sizeof *e);
  if (!e) return NULL;
  e->ctx = ctx;
  e->refs = 1;
  e->key = key;
  e->cfg = cfg;
  e->ar.ctx = ctx;
  pthread_mutex_init(&e->mu, NULL);
  if (compile(e, g, opts) != NB_OK) {
    nb_rt__exe_free(e);
    return NULL;
  }
  report(e);
  pthread_mutex_lock(&cache_mu);
  e->link = cache_list;
  cache_list = e;
  pthread_mutex_unlock(&cache_mu);
  return e;
}

nb_exe *nb_jit__compile_sub(nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg) {
  nb_exe *e = nb_calloc(ctx, sizeof *e);
  if (!e) return NULL;
  e->ctx = ctx;
  e->refs = 1;
  e->cfg = *cfg;
  e->ar.ctx = ctx;
  pthread_mutex_init(&e->mu, NULL);
  if (compile(e, g, NULL) != NB_OK) {
    nb_rt__exe_free(e);
    return NULL;
  }
  return e;
}

void nb_exe_destroy(nb_exe *e) {
  if (!e) return;
  pthread_mutex_lock(&cache_mu);
  bool last = --e->refs == 0;
  if (last)
    for (nb_exe **p = &cache_list; *p; p = &(*p)->link)
      if (*p == e) {
        *p = e->link;
        break;
      }
  pthread_mutex_unlock(&cache_mu);
  if (last) nb_rt__exe_free(e);
}
