/* The machine's f32 peak FLOP/s, measured: MFU divides by it, and the
 * cores x clock x 64 rule it replaces (two AVX-512 FMA units) read 2x low on
 * AVX2 machines. One timed loop of independent FMAs per thread, at the
 * vector width the generated kernels use, cached per CPU model, ISA and
 * thread count (a thread count is a different number on the same CPU). */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "prof/internal.h"
#include "util/util.h"

const char *nb_prof_isa(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2+fma";
  return "sse2";
#elif defined(__aarch64__)
  return "neon";
#else
  return "scalar";
#endif
}

/* ---------------------------------------------------------------- the loop */

/* ACC independent accumulators hide the FMA latency (4-5 cycles) on two
 * ports; each kernel runs `iters` rounds and returns FLOPs done. The sum of
 * the accumulators is stored so the loop is not optimised away. */
enum { ACC = 12 };
static volatile float sink;
/* Unrolled, the accumulators live in registers; as a loop over an array they
 * were loaded and stored around every FMA, and the stores bounded the rate
 * (74.6 GFLOP/s on one Zen 5 core where sgemm ran at 110). */
#define NB_UNROLL_ACC _Pragma("GCC unroll 12")
/* Optimized and uninstrumented in every build: a Debug (-O0) or ASan build
 * kept the accumulators in memory (5.2, then 43 GFLOP/s under ASan) */
#if defined(__GNUC__) && !defined(__clang__)
#define NB_FAST __attribute__((optimize("O2"), no_sanitize_address, no_sanitize_undefined))
#elif defined(__clang__)
#define NB_FAST __attribute__((no_sanitize("address", "undefined")))
#else
#define NB_FAST
#endif

#if defined(__x86_64__) && defined(__GNUC__)
NB_FAST __attribute__((target("avx512f"))) static double fma_avx512(int64_t iters) {
  __m512 a[ACC], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
  for (int64_t k = 0; k < iters; k++)
    NB_UNROLL_ACC for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
  for (int i = 1; i < ACC; i++) a[0] = _mm512_add_ps(a[0], a[i]);
  sink = _mm512_reduce_add_ps(a[0]);
  return (double)iters * ACC * 16 * 2;
}

NB_FAST __attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters) {
  __m256 a[ACC], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
  for (int64_t k = 0; k < iters; k++)
    NB_UNROLL_ACC for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
  for (int i = 1; i < ACC; i++) a[0] = _mm256_add_ps(a[0], a[i]);
  float t[8];
  _mm256_storeu_ps(t, a[0]);
  sink = t[0] + t[7];
  return (double)iters * ACC * 8 * 2;
}
#endif

/* SSE2, NEON and others: a multiply and an add per lane, four lanes */
typedef float v4 __attribute__((vector_size(16)));
NB_FAST static double fma_generic(int64_t iters) {
  v4 a[ACC], x = {0.999999f, 0.999999f, 0.999999f, 0.999999f}, y = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
  for (int i = 0; i < ACC; i++) a[i] = (v4){(float)i, (float)i, (float)i, (float)i};
  for (int64_t k = 0; k < iters; k++)
    NB_UNROLL_ACC for (int i = 0; i < ACC; i++) a[i] = a[i] * x + y;
  for (int i = 1; i < ACC; i++) a[0] += a[i];
  sink = a[0][0] + a[0][3];
  return (double)iters * ACC * 4 * 2;
}

static double run_kernel(int64_t iters) {
  const char *isa = nb_prof_isa();
#if defined(__x86_64__) && defined(__GNUC__)
  if (!strcmp(isa, "avx512f")) return fma_avx512(iters);
  if (!strcmp(isa, "avx2+fma")) return fma_avx2(iters);
#endif
  (void)isa;
  return fma_generic(iters);
}

/* ---------------------------------------------------------------- memory */

/* Streams src into dst scaled (STREAM's "scale": 4 bytes read and 4
 * written per float, the cost rules' convention: what moves, not the
 * write-allocate reads), in 64-byte vectors the compiler lowers to the
 * widths it has. Returns the bytes counted. */
typedef float v16 __attribute__((vector_size(64)));
NB_FAST static double stream_scale(v16 *dst, const v16 *src, size_t n, float k) {
  v16 kk = {k, k, k, k, k, k, k, k, k, k, k, k, k, k, k, k};
  for (size_t i = 0; i < n; i++) dst[i] = src[i] * kk;
  return (double)n * sizeof(v16) * 2;
}

/* A footprint well past the last-level cache (twice its size, 64 MiB to
 * 1 GiB in all): a smaller one measures the cache (this machine's L3 is
 * 260 MB). */
static size_t stream_bytes(void) {
  size_t l3 = 0;
  char path[128], text[64];
  for (int i = 0; i < 8; i++) {
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fgets(text, sizeof text, f)) {
      char *end;
      double v = strtod(text, &end);
      size_t b = (size_t)(v * (*end == 'M' ? 1 << 20 : *end == 'K' ? 1 << 10 : 1));
      l3 = b > l3 ? b : l3;
    }
    fclose(f);
  }
  size_t want = 2 * l3;
  return want < ((size_t)64 << 20) ? (size_t)64 << 20 : want > ((size_t)1 << 30) ? (size_t)1 << 30 : want;
}

/* ---------------------------------------------------------------- rounds */

/* Robust to a busy machine: every thread runs `rounds` rounds in step (a
 * barrier between them) and times each by its own CPU clock, so time the
 * scheduler gave another process does not count; a round's rate is the sum
 * of its threads' rates (capped at the CPUs there are: more threads than
 * CPUs share them), and the peak the best round's. A first measurement
 * under load used to be cached as the machine's peak (98.5 GFLOP/s where
 * the loop reaches 162). */
typedef enum { WORK_FMA, WORK_STREAM } work_kind;

typedef struct rounds {
  work_kind kind;
  int threads, nrounds;
  int64_t iters;            /* FMA: rounds of the loop */
  size_t stream_vectors;    /* STREAM: per thread */
  pthread_barrier_t bar;
  atomic_int go;            /* 1: the barrier is ready; -1: give up */
  double *rate;             /* [round * threads + thread] */
} rounds;

typedef struct worker {
  rounds *r;
  int index;
} worker;

static double cpu_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *work(void *u) {
  worker *w = u;
  rounds *r = w->r;
  v16 *src = NULL, *dst = NULL;
  size_t n = r->stream_vectors;
  if (r->kind == WORK_STREAM) { /* touched by this thread: its pages are near it */
    src = aligned_alloc(64, n * sizeof(v16) + 64), dst = aligned_alloc(64, n * sizeof(v16) + 64);
    if (src && dst) memset(src, 0, n * sizeof(v16)), memset(dst, 0, n * sizeof(v16));
  }
  int go;
  while (!(go = atomic_load(&r->go))) sched_yield();
  for (int k = 0; go > 0 && k < r->nrounds; k++) {
    pthread_barrier_wait(&r->bar);
    double t0 = cpu_now_s(), done = 0;
    if (r->kind == WORK_FMA) done = run_kernel(r->iters);
    else if (src && dst) done = stream_scale(dst, src, n, 1.0f + (float)k);
    double dt = cpu_now_s() - t0;
    r->rate[k * r->threads + w->index] = dt > 0 ? done / dt : 0;
  }
  free(src);
  free(dst);
  return NULL;
}

static double best_round(rounds *r) {
  worker *ws = calloc((size_t)r->threads, sizeof *ws);
  pthread_t *ts = calloc((size_t)r->threads, sizeof *ts);
  r->rate = calloc((size_t)(r->threads * r->nrounds), sizeof *r->rate);
  double best = 0;
  int started = 0;
  for (; ws && ts && r->rate && started < r->threads; started++) {
    ws[started] = (worker){r, started};
    if (pthread_create(&ts[started], NULL, work, &ws[started]) != 0) break;
  }
  /* the barrier counts the threads that did start; they wait for it */
  bool ok = started > 0 && pthread_barrier_init(&r->bar, NULL, (unsigned)started) == 0;
  atomic_store(&r->go, ok ? 1 : -1);
  for (int i = 0; i < started; i++) pthread_join(ts[i], NULL);
  if (ok) {
    pthread_barrier_destroy(&r->bar);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double share = cpus > 0 && cpus < started ? (double)cpus / started : 1.0;
    for (int k = 0; k < r->nrounds; k++) {
      double sum = 0;
      for (int i = 0; i < started; i++) sum += r->rate[k * r->threads + i];
      best = fmax(best, sum * share);
    }
  }
  free(ws);
  free(ts);
  free(r->rate);
  return best;
}

/* FLOP/s: seven rounds of about seconds/7 each, the loop sized by a warm-up
 * (which also lets the clock settle) */
static double measure(int threads, double seconds) {
  int64_t iters = 1 << 10;
  double dt;
  for (;; iters *= 2) {
    double t0 = nb_util__now_s();
    run_kernel(iters);
    if ((dt = nb_util__now_s() - t0) > 0.01) break;
  }
  rounds r = {.kind = WORK_FMA, .threads = threads, .nrounds = 7, .iters = (int64_t)(seconds / 7 * (double)iters / dt) + 1};
  double best = best_round(&r);
  return best > 0 ? best : 1e9; /* out of memory: a placeholder, never zero */
}

/* bytes/s: five passes over a footprint past the last-level cache */
static double measure_bandwidth(int threads) {
  size_t per = stream_bytes() / 2 / (size_t)threads / sizeof(v16);
  rounds r = {.kind = WORK_STREAM, .threads = threads, .nrounds = 5, .stream_vectors = per ? per : 1};
  double best = best_round(&r);
  return best > 0 ? best : 1e9;
}

/* ---------------------------------------------------------------- the cache */

static void cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      const char *v = strchr(line, ':') + 1;
      while (*v == ' ' || *v == '\t') v++;
      snprintf(buf, cap, "%.*s", (int)strcspn(v, "\n|"), v);
      break;
    }
  if (f) fclose(f);
}

static bool cache_path(char *buf, size_t cap) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  int n = xdg && *xdg ? snprintf(buf, cap, "%s/nabla", xdg)
          : home && *home ? snprintf(buf, cap, "%s/.cache/nabla", home)
                          : -1;
  return n > 0 && (size_t)n < cap;
}

/* Lines "<cpu model>|<isa>|<threads>|<GFLOP/s>"; the last for the key wins. */
static bool cache_lookup(const char *file, const char *key, double *gflops) {
  FILE *f = fopen(file, "r");
  char line[1024];
  bool found = false;
  size_t kl = strlen(key);
  while (f && fgets(line, sizeof line, f)) {
    char why[64];
    line[strcspn(line, "\n")] = 0;
    double v;
    if (!strncmp(line, key, kl) && line[kl] == '|' && nb_parse_float(line + kl + 1, 1e-3, 1e9, &v, why, sizeof why))
      *gflops = v, found = true;
  }
  if (f) fclose(f);
  return found;
}

static void cache_store(nb_ctx *ctx, const char *dir, const char *file, const char *key, double gflops) {
  if (nb_prof__mkdirs(ctx, dir)) return;
  size_t n = 0;
  char *old = NULL; /* keep the other machines' and thread counts' lines */
  if (nb_util__read_file(file, 1 << 20, &old, &n) != 0) old = NULL, n = 0;
  size_t cap = n + strlen(key) + 64;
  char *text = malloc(cap);
  if (text) {
    int k = snprintf(text, cap, "%.*s%s|%.3f\n", (int)n, old ? old : "", key, gflops);
    nb_prof__write_atomic(ctx, file, text, (size_t)k);
  }
  free(text);
  free(old);
}

/* What is measured: its variable, cache file, unit and measurement. */
typedef struct peak_kind {
  const char *env, *file, *unit;
  double (*measure)(int threads);
} peak_kind;

static double measure_flops(int threads) { return measure(threads, 0.3); }

/* the env variable's value, else the cache's, else measured and cached; in
 * units of 1e9 (GFLOP/s, GB/s) in the variable and the file */
static double peak_of(const peak_kind *k, int *threads_io, char *source, size_t cap) {
  char why[160];
  double v;
  int threads = *threads_io;
  if (threads <= 0) {
    int64_t t;
    const char *e = getenv("NABLA_THREADS");
    /* the bounds nb_jit takes from $NABLA_THREADS (src/compile/jit.c), which refuses a bad value */
    threads = e && nb_parse_int(e, 1, 1024, &t, why, sizeof why) ? (int)t : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = 1;
  }
  *threads_io = threads;
  const char *env = getenv(k->env);
  char ignored[200] = "";
  if (env && *env && nb_parse_float(env, 1e-6, 1e12, &v, why, sizeof why)) {
    snprintf(source, cap, "env %s", k->env);
    return v * 1e9;
  }
  if (env && *env) snprintf(ignored, sizeof ignored, "; %s ignored: %s", k->env, why);
  char model[256], key[400], dir[700], file[760];
  cpu_model(model, sizeof model);
  snprintf(key, sizeof key, "%s|%s|%d", model, nb_prof_isa(), threads);
  bool cache = cache_path(dir, sizeof dir);
  snprintf(file, sizeof file, "%s/%s", dir, k->file);
  if (cache && cache_lookup(file, key, &v)) {
    snprintf(source, cap, "cached in %s%s", file, ignored);
    return v * 1e9;
  }
  double rate = k->measure(threads);
  nb_ctx *ctx = cache ? nb_ctx_create() : NULL;
  if (ctx) {
    nb_ctx_set_log(ctx, NULL, NULL);
    cache_store(ctx, dir, file, key, rate / 1e9);
    bool stored = !nb_ctx_status(ctx);
    snprintf(source, cap, "measured (%s, %d threads)%s%s%s", nb_prof_isa(), threads, stored ? ", cached in " : ", not cached: ",
             stored ? file : "the cache file cannot be written", ignored);
    nb_ctx_destroy(ctx);
  } else {
    snprintf(source, cap, "measured (%s, %d threads), not cached: no HOME or XDG_CACHE_HOME%s", nb_prof_isa(), threads, ignored);
  }
  return rate;
}

nb_prof_peak nb_prof_peak_flops(int threads) {
  /* .v3: v2 values were timed by the wall clock, so a busy machine's were too low */
  static const peak_kind k = {"NABLA_PEAK_GFLOPS", "peak_flops.v3", "GFLOP/s", measure_flops};
  nb_prof_peak p = {.threads = threads};
  p.flops = peak_of(&k, &p.threads, p.source, sizeof p.source);
  return p;
}

nb_prof_peak nb_prof_peak_bandwidth(int threads) {
  static const peak_kind k = {"NABLA_PEAK_GBPS", "peak_bandwidth.v1", "GB/s", measure_bandwidth};
  nb_prof_peak p = {.threads = threads};
  p.bytes_per_s = peak_of(&k, &p.threads, p.source, sizeof p.source);
  return p;
}
