/* The MFU peak: measured once per CPU model, ISA and thread count and
 * cached; $NABLA_PEAK_GFLOPS wins when it is a number and is reported as
 * ignored when not; the trainer's estimate is that same peak (it used to be
 * cores x MHz x 64, 2x too high on AVX2 machines). */
#include <cblas.h>
#include <time.h>
#include <unistd.h>

#include "testfs.h"

/* lanes of f32 a vector of the ISA holds */
static int lanes(const char *isa) { return !strcmp(isa, "avx512f") ? 16 : !strcmp(isa, "avx2+fma") ? 8 : 4; }

/* One thread's sgemm rate (best of 3, 512^3, the kernels nabla picks): no
 * real peak is below it. */
static double sgemm_flops(void) {
  enum { N = 512 };
  float *a = calloc(N * N, sizeof(float)), *b = calloc(N * N, sizeof(float)), *c = calloc(N * N, sizeof(float));
  for (int i = 0; i < N * N; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
  nb_jit_blas_core();
  openblas_set_num_threads(1);
  double best = 0;
  for (int r = 0; r < 3; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    best = fmax(best, 2.0 * N * N * N / s);
  }
  free(a), free(b), free(c);
  return best;
}

/* the clock /proc/cpuinfo shows, in MHz (it can be the base clock: boost gets a 2.5x margin below) */
static double max_mhz(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  double m = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "cpu MHz", 7) && strchr(line, ':')) m = fmax(m, atof(strchr(line, ':') + 1));
  if (f) fclose(f);
  return m > 0 ? m : 6000;
}

/* The memory roof: the variable wins; measured, a plausible number, cached. */
static void bandwidth(const char *dir) {
  setenv("NABLA_PEAK_GBPS", "7.5", 1);
  nb_prof_peak p = nb_prof_peak_bandwidth(2);
  CHECK_MSG(p.bytes_per_s == 7.5e9 && p.flops == 0 && strstr(p.source, "NABLA_PEAK_GBPS"), "%g %s", p.bytes_per_s, p.source);
  unsetenv("NABLA_PEAK_GBPS");
  p = nb_prof_peak_bandwidth(1);
  printf("memory bandwidth, 1 thread: %.1f GB/s (%s)\n", p.bytes_per_s / 1e9, p.source);
  CHECK_MSG(p.bytes_per_s > 0.5e9 && p.bytes_per_s < 5e12 && !strncmp(p.source, "measured", 8), "%g %s", p.bytes_per_s, p.source);
  nb_prof_peak again = nb_prof_peak_bandwidth(1);
  CHECK_MSG(!strncmp(again.source, "cached in ", 10) && strstr(again.source, "peak_bandwidth.v1") &&
                fabs(again.bytes_per_s - p.bytes_per_s) <= 1e-3 * p.bytes_per_s,
            "%g %s", again.bytes_per_s, again.source);
  (void)dir;
}

int main(void) {
  char dir[4096], file[4200];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "peak");
  setenv("XDG_CACHE_HOME", dir, 1);
  snprintf(file, sizeof file, "%s/nabla/peak_flops.v3", dir);

  setenv("NABLA_PEAK_GFLOPS", "12.5", 1);
  nb_prof_peak p = nb_prof_peak_flops(3);
  CHECK_MSG(p.flops == 12.5e9 && strstr(p.source, "NABLA_PEAK_GFLOPS") && p.threads == 3, "%g %s", p.flops, p.source);
  CHECK(nb_train_peak_flops_estimate(3) == 12.5e9);

  setenv("NABLA_PEAK_GFLOPS", "fast", 1);
  p = nb_prof_peak_flops(1);
  CHECK_MSG(!strncmp(p.source, "measured (", 10) && strstr(p.source, file) && strstr(p.source, "'fast' is not a finite number"),
            "%s", p.source);
  unsetenv("NABLA_PEAK_GFLOPS");
  /* a real FMA rate: above 0.1 GFLOP/s, below what the ISA could do with two FMA units at 2.5x the clock
   * /proc/cpuinfo shows (a Zen 5 VM shows 2596 MHz and its FMAs ran at 266 GFLOP/s: over 4.1 GHz) */
  double bound = max_mhz() * 2.5e6 * lanes(nb_prof_isa()) * 2 * 2;
  CHECK_MSG(p.flops > 1e8 && p.flops < bound, "%.3g FLOP/s for %s (bound %.3g)", p.flops, nb_prof_isa(), bound);
  printf("peak, 1 thread: %.1f GFLOP/s (%s; %s)\n", p.flops / 1e9, nb_prof_isa(), p.source);
  /* and not below what sgemm reaches (with a margin for a noisy machine): a
   * loop bound by its own loads and stores measured 74.6 GFLOP/s on a Zen 5
   * core where sgemm ran at 110, and MFU read over 100% */
  double gemm = sgemm_flops(), best = p.flops;
  for (int retry = 0; retry < 6 && best < 0.8 * gemm; retry++) { /* a busy machine (ctest -j, other processes) slowed one of the two: again */
    unlink(file);
    best = fmax(best, nb_prof_peak_flops(1).flops);
    gemm = fmin(gemm, sgemm_flops());
  }
  CHECK_MSG(best >= 0.8 * gemm, "peak %.1f GFLOP/s below one-thread sgemm's %.1f", best / 1e9, gemm / 1e9);
  p = nb_prof_peak_flops(1); /* the cached value the checks below compare against */

  /* cached: the same number, said so, and the trainer's estimate is it */
  nb_prof_peak again = nb_prof_peak_flops(1);
  CHECK_MSG(!strncmp(again.source, "cached in ", 10) && fabs(again.flops - p.flops) <= 1e-3 * p.flops, "%g vs %g: %s",
            again.flops, p.flops, again.source);
  CHECK_MSG(fabs(nb_train_peak_flops_estimate(1) - again.flops) <= 1e-3 * again.flops, "estimate %g, cached peak %g",
            nb_train_peak_flops_estimate(1), again.flops);
  char *text = nb_test_read_file(file, NULL);
  char key[128];
  snprintf(key, sizeof key, "|%s|1|", nb_prof_isa());
  CHECK_MSG(text && strstr(text, key), "%s", text ? text : "(no cache file)");
  free(text);

  /* a damaged cache file is measured over, not believed */
  nb_test_write_text(file, "garbage|||x\n");
  p = nb_prof_peak_flops(1);
  CHECK_MSG(!strncmp(p.source, "measured", 8) && p.flops > 1e8, "%g %s", p.flops, p.source);
  bandwidth(dir);
  nb_test_rm_rf(dir);
  return nb_test_summary("prof/peak");
}
