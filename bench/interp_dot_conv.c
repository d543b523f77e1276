/* Timings of the reference interpreter's dot_general and conv (the oracle, not
 * the fast path): medians of repeated runs of one traced op, with the FLOP
 * rate from the op's cost rule. The claim checked: the interpreter runs the
 * small MLP and CNN shapes of the examples and tests in milliseconds.
 *
 * Build and run (from the repository root, after scripts/build.sh build):
 *   cc -O2 -std=c11 -Iinclude bench/interp_dot_conv.c build/libnabla.a \
 *      $(pkg-config --libs libzstd libpcre2-8 libcjson yaml-0.1) -lxxhash -lm -lpthread -ldl \
 *      -o build/interp_dot_conv && build/interp_dot_conv
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "nabla/nabla.h"

/* Median seconds of `reps` runs of g on inputs a, b. */
static double time_graph(nb_ctx *ctx, nb_graph *g, nb_array *a, nb_array *b, int reps) {
  double t[64];
  nb_array *in[2] = {a, b}, *out[1];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    if (nb_graph_run_flat(ctx, g, in, out) != NB_OK) {
      fprintf(stderr, "run failed: %s\n", nb_ctx_error(ctx));
      exit(1);
    }
    t[r] = now_s() - t0;
    nb_array_release(out[0]);
  }
  return median(t, reps);
}

static void report(nb_ctx *ctx, const char *name, nb_graph *g, nb_aval aa, nb_aval ab) {
  nb_array *a = nb_array_full(ctx, aa.dtype, aa.shape.rank, aa.shape.dims, 0.5);
  nb_array *b = nb_array_full(ctx, ab.dtype, ab.shape.rank, ab.shape.dims, 0.25);
  double flops, bytes, s = time_graph(ctx, g, a, b, 21);
  nb_graph_cost(g, &flops, &bytes);
  printf("%-44s median %8.3f ms  %7.2f GFLOP/s\n", name, s * 1e3, flops / s * 1e-9);
  nb_array_release(a);
  nb_array_release(b);
}

static void bench_matmul(nb_ctx *ctx, nb_dtype t, int64_t m, int64_t k, int64_t n) {
  nb_graph *g = nb_graph_create(ctx);
  nb_aval aa = nb_aval_make(t, 2, (int64_t[]){m, k}), ab = nb_aval_make(t, 2, (int64_t[]){k, n});
  nb_val *a = nb_graph_input(g, "a", aa), *b = nb_graph_input(g, "b", ab);
  nb_graph_output(g, "y", nb_matmul(a, b));
  char name[128];
  snprintf(name, sizeof name, "matmul %s [%lld,%lld]x[%lld,%lld]", nb_dtype_name(t), (long long)m, (long long)k,
           (long long)k, (long long)n);
  report(ctx, name, g, aa, ab);
  nb_graph_destroy(g);
}

static void bench_conv(nb_ctx *ctx, int64_t n, int64_t c, int64_t hw, int64_t o, int64_t k) {
  nb_graph *g = nb_graph_create(ctx);
  nb_aval aa = nb_aval_make(NB_F32, 4, (int64_t[]){n, c, hw, hw}), ab = nb_aval_make(NB_F32, 4, (int64_t[]){o, c, k, k});
  nb_conv_params p = nb_conv_params_default(2, NULL, (int64_t[]){k / 2, k / 2});
  nb_val *a = nb_graph_input(g, "a", aa), *b = nb_graph_input(g, "b", ab);
  nb_graph_output(g, "y", nb_conv(a, b, &p));
  char name[128];
  snprintf(name, sizeof name, "conv f32 [%lld,%lld,%lld,%lld] * [%lld,%lld,%lld,%lld]", (long long)n, (long long)c,
           (long long)hw, (long long)hw, (long long)o, (long long)c, (long long)k, (long long)k);
  report(ctx, name, g, aa, ab);
  nb_graph_destroy(g);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  bench_matmul(ctx, NB_F32, 64, 128, 64);
  bench_matmul(ctx, NB_F64, 64, 128, 64);
  bench_matmul(ctx, NB_F32, 256, 256, 256);
  bench_conv(ctx, 8, 1, 28, 16, 3);
  bench_conv(ctx, 8, 16, 14, 32, 3);
  nb_ctx_destroy(ctx);
  return 0;
}
