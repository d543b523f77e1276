/* Claim: quant.matmul's kernels make a decode step's products (M = 1) and a
 * small batch's (M = 16) faster than nabla's f32 sgemm by reading fewer
 * weight bytes. The floor of a product is the larger of its weight bytes /
 * the measured read bandwidth (bench_util.h's read_bandwidth, one thread)
 * and its arithmetic at the measured f32 FMA peak (prof's
 * nb_prof_peak_flops(1)); W8A8's int8 multiply-adds at 4x that rate
 * (vpdpbusd: 64 per instruction against vfmadd's 16).
 *
 * The Llama-134M shapes (N x K: 768x768 attention, 2048x768 and 768x2048
 * MLP, 32000x768 the head), y[M, N] = x[M, K] @ W^T, one thread, each
 * product on the next of enough copies of W (>= 256 MB in all) that W
 * comes from memory, not cache, as in a decode step. Formats: f32 (sgemm,
 * B transposed in place), int8 per-channel, int4 g32, nf4 g64, fp8 e4m3
 * per-channel, W8A8 (int8 per-channel x int8 per token), int8 g32
 * weight-only, int8 g32 / int4 g32 x int8 per 32-block activations
 * ("blk": int8_block, llama.cpp's Q8_0 / Q4_0 product), and int8 g16
 * (GGUF Q6_K's layout, the head of a Q4_0 file) weight-only and "blk"
 * (each half of a 32-block scaled by its own tile). Every format runs once
 * per round, rounds interleaved; medians of the rounds.
 *
 *   ./build/bench_quant_gemv [rounds (default 7)] [M ...]
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/sgemm.h"
#include "bench_util.h"
#include "quant/internal.h"

enum { F32, I8, I4, NF4, FP8, W8A8, I8G32, I8BLK, I4BLK, I8G16, I8G16BLK, NFMT };
static const char *const fmt_names[NFMT] = {"f32",      "int8",      "int4 g32",  "nf4 g64",  "fp8 e4m3", "W8A8",
                                            "int8 g32", "i8g32 blk", "i4g32 blk", "int8 g16", "i8g16 blk"};
/* the activations of each format: blk = int8_block (x int8 per 32) */
static const nb_quant_act fmt_act[NFMT] = {0, 0, 0, 0, 0, NB_QUANT_ACT_INT8_DYNAMIC, 0, NB_QUANT_ACT_INT8_BLOCK, NB_QUANT_ACT_INT8_BLOCK,
                                           0, NB_QUANT_ACT_INT8_BLOCK};

typedef struct copies {
  int n;                 /* copies of W */
  nb_quant_weight q[64]; /* quantized formats */
  float *f[64];          /* f32 */
  double bytes;          /* weight bytes one product reads */
} copies;

static void make_copies(nb_ctx *ctx, int fmt, int64_t N, int64_t K, copies *c) {
  nb_array *w = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){N, K});
  float *wp = nb_array_data_mut(w);
  uint64_t s = 42;
  for (int64_t i = 0; i < N * K; i++) s = s * 6364136223846793005ull + 1442695040888963407ull, wp[i] = (float)((double)(s >> 40) / (1 << 24) - 0.5) * 0.1f;
  nb_quant_type qt[NFMT] = {0,             NB_QUANT_INT8, NB_QUANT_INT4, NB_QUANT_NF4,  NB_QUANT_FP8_E4M3, NB_QUANT_INT8,
                            NB_QUANT_INT8, NB_QUANT_INT8, NB_QUANT_INT4, NB_QUANT_INT8, NB_QUANT_INT8};
  int64_t tile[NFMT] = {0, 0, 32, 64, 0, 0, 32, 32, 32, 16, 16};
  nb_quant_calib cal = {.kind = NB_QUANT_ABSMAX};
  nb_quant_weight q0 = {0};
  if (fmt == F32) c->bytes = 4.0 * (double)(N * K);
  else {
    if (nb_quant_quantize(ctx, w, qt[fmt], tile[fmt], &cal, &q0) != NB_OK) fprintf(stderr, "%s\n", nb_ctx_error(ctx)), exit(1);
    c->bytes = (double)nb_array_nbytes(q0.values) + (double)nb_array_nbytes(q0.scales);
  }
  c->n = (int)(256e6 / c->bytes) + 1;
  c->n = c->n > 64 ? 64 : c->n;
  for (int i = 0; i < c->n; i++) {
    if (fmt == F32) {
      c->f[i] = malloc(sizeof(float) * (size_t)(N * K));
      memcpy(c->f[i], wp, sizeof(float) * (size_t)(N * K));
    } else { /* fresh arrays: distinct memory per copy */
      c->q[i].layout = q0.layout;
      c->q[i].values = nb_array_create(ctx, nb_array_dtype(q0.values), 2, nb_array_dims(q0.values), nb_array_data(q0.values));
      c->q[i].scales = nb_array_create(ctx, NB_F32, 2, nb_array_dims(q0.scales), nb_array_data(q0.scales));
      c->q[i].zero_points = NULL;
    }
  }
  nb_quant_weight_release(&q0);
  nb_array_release(w);
}

static void free_copies(int fmt, copies *c) {
  for (int i = 0; i < c->n; i++)
    if (fmt == F32) free(c->f[i]);
    else nb_quant_weight_release(&c->q[i]);
}

/* seconds per product, over `reps` products on successive copies */
static double time_fmt(nb_ctx *ctx, int fmt, copies *c, int64_t M, int64_t N, int64_t K, const float *x, float *y, int reps) {
  double t0 = now_s();
  for (int r = 0; r < reps; r++) {
    int i = r % c->n;
    if (fmt == F32) nb_cpu__sgemm(false, true, M, N, K, x, K, c->f[i], K, y, N);
    else {
      nb_quant__mm p = {.l = c->q[i].layout, .m = M, .x = x, .values = nb_array_data(c->q[i].values),
                        .scales = nb_array_data(c->q[i].scales), .act = fmt_act[fmt], .y = y};
      nb_quant__matmul(ctx, &p);
    }
  }
  return (now_s() - t0) / reps;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 7;
  int64_t ms[8] = {1, 16};
  int nm = 2;
  if (argc > 2) {
    nm = 0;
    for (int a = 2; a < argc && nm < 8; a++) ms[nm++] = atoll(argv[a]);
  }
  if (rounds < 1 || rounds > 63) return fprintf(stderr, "rounds: 1..63\n"), 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_quant__fisa fi;
  nb_quant__iisa ii;
  nb_quant__current_isa(&fi, &ii);
  double bw = read_bandwidth(1);
  nb_prof_peak peak = nb_prof_peak_flops(1);
  printf("quant_gemv: one thread, kernels %s (float) / %s (int8), sgemm %s, read bandwidth %.1f GB/s, f32 peak %.1f GFLOP/s (%s)\n",
         nb_quant__fisa_name(fi), nb_quant__iisa_name(ii), nb_cpu__sgemm_name(nb_cpu__sgemm_best()), bw, peak.flops / 1e9, peak.source);
  int64_t shapes[4][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
  printf("%-6s %-11s %-9s %9s %11s %11s %8s %8s\n", "M", "N x K", "format", "MB", "us", "floor us", "x floor", "vs f32");
  printf("(floor: m = memory-bound, c = compute-bound)\n");
  for (int s = 0; s < 4; s++) {
    int64_t N = shapes[s][0], K = shapes[s][1];
    copies *c = calloc(NFMT, sizeof *c);
    for (int f = 0; f < NFMT; f++) make_copies(ctx, f, N, K, &c[f]);
    for (int mi = 0; mi < nm; mi++) {
      int64_t M = ms[mi];
      float *x = malloc(sizeof(float) * (size_t)(M * K)), *y = malloc(sizeof(float) * (size_t)(M * N));
      for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
      double t[NFMT][64];
      for (int r = 0; r < rounds; r++)
        for (int f = 0; f < NFMT; f++) {
          int reps = (int)(0.05 / (c[f].bytes / (bw * 1e9) + 2.0 * (double)(M * N * K) / 50e9)) + 1; /* ~50 ms a round */
          t[f][r] = time_fmt(ctx, f, &c[f], M, N, K, x, y, reps);
        }
      double f32 = median(t[F32], rounds);
      for (int f = 0; f < NFMT; f++) {
        double med = median(t[f], rounds), mem_s = c[f].bytes / (bw * 1e9);
        double flop_s = 2.0 * (double)(M * N * K) / (peak.flops * (fmt_act[f] != NB_QUANT_ACT_NONE ? 4 : 1));
        double floor_s = mem_s > flop_s ? mem_s : flop_s;
        printf("%-6lld %5lldx%-5lld %-9s %9.2f %11.1f %10.1f%c %8.2f %8.2f\n", (long long)M, (long long)N, (long long)K, fmt_names[f],
               c[f].bytes / 1e6, med * 1e6, floor_s * 1e6, mem_s > flop_s ? 'm' : 'c', med / floor_s, f32 / med);
      }
      free(x), free(y);
    }
    for (int f = 0; f < NFMT; f++) free_copies(f, &c[f]);
    free(c);
  }
  nb_ctx_destroy(ctx);
  return 0;
}
