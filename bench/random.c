/* Sampling rate of the reference interpreter for the threefry samplers (the
 * oracle, not the fast path): medians of repeated runs of one traced sampler
 * on 2^20 values, against JAX on the CPU (bench/random_vs_jax.py, same shapes
 * and dtypes). The claim checked: the interpreter draws a million values in
 * well under a second (bits and uniform in tens of milliseconds), so tests
 * and small model inits need no compiler; XLA's compiled kernels are the
 * yardstick for the compiler, not for this oracle.
 *
 * Build and run (from the repository root, after scripts/build.sh build):
 *   build/bench_random          (CMake builds every program in bench/)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "nabla/nabla.h"

enum { N = 1 << 20, REPS = 11 };

typedef enum which { BITS, UNIFORM_F32, NORMAL_F32, UNIFORM_F64, SPLIT } which;

static nb_val *sampler(nb_val *key, which w) {
  int64_t n = N;
  switch (w) {
  case BITS: return nb_random_bits(key, 1, &n);
  case UNIFORM_F32: return nb_random_uniform(key, NB_F32, 1, &n, 0, 1);
  case NORMAL_F32: return nb_random_normal(key, NB_F32, 1, &n);
  case UNIFORM_F64: return nb_random_uniform(key, NB_F64, 1, &n, 0, 1);
  default: return nb_random_split(key, N / 2);
  }
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  const char *names[] = {"bits u32", "uniform f32", "normal f32", "uniform f64", "split (2^19 keys)"};
  nb_array *key = nb_key(ctx, 0);
  for (int w = BITS; w <= SPLIT; w++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *k = nb_graph_input(g, "key", nb_array_aval(key));
    nb_graph_output(g, "y", sampler(k, (which)w));
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
      nb_array *out = NULL;
      double t0 = now_s();
      if (nb_graph_run_flat(ctx, g, &key, &out) != NB_OK) {
        fprintf(stderr, "%s: %s\n", names[w], nb_ctx_error(ctx));
        return 1;
      }
      t[r] = now_s() - t0;
      nb_array_release(out);
    }
    double med = median(t, REPS);
    printf("%-20s median %8.2f ms  %7.1f M values/s\n", names[w], med * 1e3, N / med * 1e-6);
    nb_graph_destroy(g);
  }
  nb_array_release(key);
  nb_ctx_destroy(ctx);
  return 0;
}
