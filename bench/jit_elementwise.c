/* Benchmark: a fused chain of 10 elementwise ops over 64M f32 (256 MiB in,
 * 256 MiB out) against the machine's copy bandwidth (memcpy of the same
 * bytes, measured here) and against the interpreter; compile time cold
 * (fresh cache directory) and warm (disk cache). Medians of several runs.
 * Usage: bench_jit_elementwise [n_elements] [runs] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "bench_util.h"

static volatile char sink;

/* 10 elementwise ops: y = max(((x*a + b) * x - c) / d, x) ... */
static nb_status chain(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *y = nb_mul(x, nb_scalar(g, NB_F32, 1.5f));      /* 1 */
  y = nb_add(y, nb_scalar(g, NB_F32, 0.25f));              /* 2 */
  y = nb_mul(y, x);                                        /* 3 */
  y = nb_sub(y, nb_scalar(g, NB_F32, 3.0f));               /* 4 */
  y = nb_abs(y);                                           /* 5 */
  y = nb_max(y, x);                                        /* 6 */
  y = nb_div(y, nb_scalar(g, NB_F32, 7.0f));               /* 7 */
  y = nb_min(y, nb_scalar(g, NB_F32, 100.0f));             /* 8 */
  y = nb_neg(y);                                           /* 9 */
  y = nb_add(y, x);                                        /* 10 */
  return nb_tree_set_val(out, "y", y);
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 64ll << 20;
  int runs = argc > 2 ? atoi(argv[2]) : 7;
  nb_ctx *ctx = nb_ctx_create();
  nb_array *x = nb_array_empty(ctx, NB_F32, 1, &n);
  float *xd = nb_array_data_mut(x);
  for (int64_t i = 0; i < n; i++) xd[i] = (float)(i % 1000) * 0.01f - 5.0f;
  size_t bytes = (size_t)n * 4;

  /* copy bandwidth: read n*4 + write n*4 bytes, as the kernel does */
  char *dst = malloc(bytes);
  memset(dst, 1, bytes);
  double t[64];
  for (int r = 0; r < runs; r++) {
    double t0 = now_s();
    memcpy(dst, xd, bytes);
    t[r] = now_s() - t0;
  }
  double copy_s = median(t, runs), copy_gbs = 2.0 * (double)bytes / copy_s / 1e9;
  for (int r = 0; r < runs; r++) { /* the same into freshly allocated memory (page faults included) */
    double t0 = now_s();
    char *volatile fresh = malloc(bytes);
    memcpy(fresh, xd, bytes);
    sink += fresh[bytes - 1];
    t[r] = now_s() - t0;
    free(fresh);
  }
  double fresh_s = median(t, runs);

  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x);
  nb_graph *g = nb_trace(ctx, chain, NULL, in);

  char dir[256];
  snprintf(dir, sizeof dir, "/tmp/nabla-bench-%d", (int)getpid());
  nb_jit_opts o = {.cache_dir = dir};
  double t0 = now_s();
  nb_exe *e = nb_jit(ctx, g, &o);
  double cold_ms = (now_s() - t0) * 1e3;
  nb_exe_destroy(e);
  t0 = now_s();
  e = nb_jit(ctx, g, &o); /* not in memory any more: from the disk cache */
  double warm_ms = (now_s() - t0) * 1e3;
  nb_exe_stats st;
  nb_exe_get_stats(e, &st);

  for (int r = 0; r < runs; r++) {
    nb_tree *out = nb_tree_create(ctx);
    double t1 = now_s();
    if (nb_exe_run(e, in, out) != NB_OK) fprintf(stderr, "run: %s\n", nb_ctx_error(ctx));
    t[r] = now_s() - t1;
    nb_tree_destroy(out);
  }
  double jit_s = median(t, runs), jit_gbs = 2.0 * (double)bytes / jit_s / 1e9;
  nb_exe_step_info si;
  nb_exe_step(e, 0, &si);

  int iruns = runs < 3 ? runs : 3;
  for (int r = 0; r < iruns; r++) {
    nb_tree *out = nb_tree_create(ctx);
    double t1 = now_s();
    nb_graph_run(ctx, g, in, out);
    t[r] = now_s() - t1;
    nb_tree_destroy(out);
  }
  double interp_s = median(t, iruns);

  printf("elements            %lld f32 (%.0f MiB in, %.0f MiB out), %d runs, threads: default\n", (long long)n,
         (double)bytes / (1 << 20), (double)bytes / (1 << 20), runs);
  printf("memcpy              %8.2f ms  %6.2f GB/s (read+write)\n", copy_s * 1e3, copy_gbs);
  printf("memcpy, fresh dst   %8.2f ms  %6.2f GB/s\n", fresh_s * 1e3, 2.0 * (double)bytes / fresh_s / 1e9);
  printf("jit (1 kernel: %zu)  %8.2f ms  %6.2f GB/s  = %.0f%% of copy bandwidth\n", st.nkernels, jit_s * 1e3, jit_gbs,
         100 * jit_gbs / copy_gbs);
  printf("  of which kernel   %8.2f ms (the rest: allocating and first-touching the fresh output)\n", si.last_ms);
  printf("interpreter         %8.2f ms  -> jit is %.1fx faster\n", interp_s * 1e3, interp_s / jit_s);
  printf("compile             cold %.1f ms, warm (disk cache) %.1f ms\n", cold_ms, warm_ms);
  nb_exe_destroy(e);

  /* x donated: the output is written in place (a training step's update) */
  const char *donate[] = {"x", NULL};
  o.donate = donate;
  e = nb_jit(ctx, g, &o);
  nb_array_release(x); /* the input tree is now its only holder */
  for (int r = 0; r < runs; r++) {
    nb_tree *out = nb_tree_create(ctx);
    double t1 = now_s();
    if (nb_exe_run(e, in, out) != NB_OK) fprintf(stderr, "run: %s\n", nb_ctx_error(ctx));
    t[r] = now_s() - t1;
    if (nb_tree_get_array(out, "y") != nb_tree_get_array(in, "x")) fprintf(stderr, "donation did not happen\n");
    nb_tree_destroy(out);
  }
  double don_s = median(t, runs), don_gbs = 2.0 * (double)bytes / don_s / 1e9;
  printf("jit, x donated      %8.2f ms  %6.2f GB/s  = %.0f%% of copy bandwidth (in place, no fresh output)\n", don_s * 1e3,
         don_gbs, 100 * don_gbs / copy_gbs);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  free(dst);
  nb_ctx_destroy(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : 1;
}
