/* The machine's f32 peak FLOP/s, measured: MFU divides by it, and the
 * cores x clock x 64 rule it replaces (two AVX-512 FMA units) read 2x low on
 * AVX2 machines. One timed loop of independent FMAs per thread, at the
 * vector width the generated kernels use, cached per CPU model, ISA and
 * thread count (a thread count is a different number on the same CPU). */
#include <errno.h>
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

typedef struct worker {
  atomic_int *go;
  int64_t iters;
  double flops;
} worker;

static void *work(void *u) {
  worker *w = u;
  while (!atomic_load(w->go)) {
  }
  w->flops = run_kernel(w->iters);
  return NULL;
}

/* All threads at once for about `seconds` in all, after a warm-up that
 * sizes the loop (and lets the clock settle); the best of three rounds. */
static double measure(int threads, double seconds) {
  int64_t iters = 1 << 10;
  double dt;
  for (;; iters *= 2) {
    double t0 = nb_util__now_s();
    run_kernel(iters);
    if ((dt = nb_util__now_s() - t0) > 0.01) break;
  }
  iters = (int64_t)(seconds / 3 * (double)iters / dt) + 1;
  worker *ws = calloc((size_t)threads, sizeof *ws);
  pthread_t *ts = calloc((size_t)threads, sizeof *ts);
  double best = 0;
  for (int round = 0; round < 3 && ws && ts; round++) {
    atomic_int go = 0;
    int started = 0;
    while (started < threads) {
      ws[started] = (worker){&go, iters, 0};
      if (pthread_create(&ts[started], NULL, work, &ws[started]) != 0) break;
      started++;
    }
    double t0 = nb_util__now_s(), flops = 0;
    atomic_store(&go, 1);
    for (int i = 0; i < started; i++) pthread_join(ts[i], NULL), flops += ws[i].flops;
    double rate = flops / (nb_util__now_s() - t0);
    best = rate > best ? rate : best;
  }
  free(ws);
  free(ts);
  return best > 0 ? best : 1e9; /* out of memory: a placeholder, never zero */
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

nb_prof_peak nb_prof_peak_flops(int threads) {
  nb_prof_peak p = {0};
  char why[160];
  double v;
  if (threads <= 0) {
    int64_t t;
    const char *e = getenv("NABLA_THREADS");
    /* the bounds nb_jit takes from $NABLA_THREADS (src/compile/jit.c), which refuses a bad value */
    threads = e && nb_parse_int(e, 1, 1024, &t, why, sizeof why) ? (int)t : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = 1;
  }
  p.threads = threads;
  const char *env = getenv("NABLA_PEAK_GFLOPS");
  char ignored[200] = "";
  if (env && *env && nb_parse_float(env, 1e-6, 1e12, &v, why, sizeof why)) {
    p.flops = v * 1e9;
    snprintf(p.source, sizeof p.source, "env NABLA_PEAK_GFLOPS");
    return p;
  }
  if (env && *env) snprintf(ignored, sizeof ignored, "; NABLA_PEAK_GFLOPS ignored: %s", why);
  char model[256], key[400], dir[700], file[760];
  cpu_model(model, sizeof model);
  snprintf(key, sizeof key, "%s|%s|%d", model, nb_prof_isa(), threads);
  bool cache = cache_path(dir, sizeof dir);
  snprintf(file, sizeof file, "%s/peak_flops.v2", dir); /* .v2: v1 values came from a store-bound loop */
  if (cache && cache_lookup(file, key, &v)) {
    p.flops = v * 1e9;
    snprintf(p.source, sizeof p.source, "cached in %s%s", file, ignored);
    return p;
  }
  p.flops = measure(threads, 0.3);
  nb_ctx *ctx = cache ? nb_ctx_create() : NULL;
  if (ctx) {
    nb_ctx_set_log(ctx, NULL, NULL);
    cache_store(ctx, dir, file, key, p.flops / 1e9);
    bool stored = !nb_ctx_status(ctx);
    snprintf(p.source, sizeof p.source, "measured (%s, %d threads)%s%s%s", nb_prof_isa(), threads,
             stored ? ", cached in " : ", not cached: ", stored ? file : "the cache file cannot be written", ignored);
    nb_ctx_destroy(ctx);
  } else {
    snprintf(p.source, sizeof p.source, "measured (%s, %d threads), not cached: no HOME or XDG_CACHE_HOME%s",
             nb_prof_isa(), threads, ignored);
  }
  return p;
}
