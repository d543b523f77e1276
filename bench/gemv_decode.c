/* Claim: nabla's f32 products with one row (a decode step's: x[1, K] @ W)
 * read their weights at the machine's read bandwidth. One jitted graph
 * holds the 85 products of one decode step of a Llama-architecture model
 * (default the 134M of bench/decode_vs_llamacpp.py: per layer q, k, v, o
 * 768 x 768, gate and up 768 x 2048, down 2048 x 768, then the 768 x 32000
 * output head), each with its own weight, so the weights (438 MB) stream from
 * memory as in a real step, not from the caches. Reported: the weight bytes
 * over the median run time, against the read bandwidth (bench_util.h)
 * measured with the same thread count, interleaved with the runs.
 * --transposed: the weights stored [N, K] (x @ W^T: tied output embeddings,
 * attention's keys). --rows M: a batched decode step, x [M, K] (M running
 * sequences); GFLOP/s is reported beside GB/s, since with many rows the
 * products approach the FMA rate instead of the bandwidth.
 *
 *   ./build/bench_gemv_decode [--threads T] [--reps R] [--d D] [--ffn F] [--vocab V] [--layers L] [--rows M] [--transposed]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "nabla/nabla.h"

typedef struct shapes {
  int n;
  int64_t k[512], m[512]; /* product i: [1, k] x [k, m] */
  bool transposed;
} shapes;

static nb_status fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const shapes *s = u;
  nb_status st = NB_OK;
  for (int i = 0; i < s->n && !st; i++) {
    char p[32];
    snprintf(p, sizeof p, "w/%03d", i);
    nb_val *w = nb_tree_get_val(in, p);
    snprintf(p, sizeof p, "x/%03d", i);
    nb_val *x = nb_tree_get_val(in, p);
    nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {s->transposed ? 1 : 0}};
    snprintf(p, sizeof p, "y/%03d", i);
    st = nb_tree_set_val(out, p, nb_dot_general(x, w, &dn, NB_DTYPE_COUNT));
  }
  return st;
}

int main(int argc, char **argv) {
  int threads = 1, reps = 7;
  int64_t rows = 1, d = 768, ffn = 2048, vocab = 32000, layers = 12;
  shapes s = {0};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--d") && i + 1 < argc) d = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--ffn") && i + 1 < argc) ffn = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--transposed")) s.transposed = true;
    else return fprintf(stderr, "unknown argument '%s'\n", argv[i]), 2;
  }
  if (threads < 1 || reps < 1 || rows < 1 || rows > 4096 || reps > 64 || layers < 0 || 7 * layers + 1 > 512) return fprintf(stderr, "bad arguments\n"), 2;
  for (int64_t l = 0; l < layers; l++) {
    int64_t k[7] = {d, d, d, d, d, d, ffn}, m[7] = {d, d, d, d, ffn, ffn, d};
    for (int q = 0; q < 7; q++) s.k[s.n] = k[q], s.m[s.n++] = m[q];
  }
  s.k[s.n] = d, s.m[s.n++] = vocab;
  nb_ctx *ctx = nb_ctx_create();
  nb_tree *in = nb_tree_create(ctx);
  double bytes = 0, flops = 0;
  uint64_t r = 88172645463325252ull;
  for (int i = 0; i < s.n; i++) {
    int64_t wd[2] = {s.transposed ? s.m[i] : s.k[i], s.transposed ? s.k[i] : s.m[i]}, xd[2] = {rows, s.k[i]};
    nb_array *w = nb_array_empty(ctx, NB_F32, 2, wd), *x = nb_array_empty(ctx, NB_F32, 2, xd);
    float *wv = nb_array_data_mut(w), *xv = nb_array_data_mut(x);
    for (int64_t e = 0; e < wd[0] * wd[1]; e++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, wv[e] = (float)(r >> 40) * 1e-8f;
    for (int64_t e = 0; e < rows * s.k[i]; e++) xv[e] = 1.0f / (float)(e % s.k[i] + 1 + e / s.k[i]);
    char p[32];
    snprintf(p, sizeof p, "w/%03d", i);
    nb_tree_set_array(in, p, w);
    snprintf(p, sizeof p, "x/%03d", i);
    nb_tree_set_array(in, p, x);
    nb_array_release(w), nb_array_release(x);
    bytes += (double)(wd[0] * wd[1]) * 4;
    flops += 2.0 * (double)rows * (double)(wd[0] * wd[1]);
  }
  nb_graph *g = nb_trace(ctx, fn, &s, in);
  nb_jit_opts o = {.threads = threads};
  nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
  if (!e) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  double t[64], bw[64];
  for (int k = -1; k < reps; k++) {
    nb_tree *out = nb_tree_create(ctx);
    double t0 = now_s();
    if (nb_exe_run(e, in, out)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
    double dt = now_s() - t0;
    nb_tree_destroy(out);
    if (k < 0) continue; /* warm-up */
    t[k] = dt;
    bw[k] = read_bandwidth(threads); /* interleaved: the machine's state of the moment */
  }
  double tm = median(t, reps), bm = median(bw, reps), gbs = bytes / tm / 1e9;
  printf("%d products of %lld rows (%lld layers, d %lld, ffn %lld, vocab %lld)%s, %.1f MB of weights, %d threads: median %.2f ms "
         "= %.2f GB/s, %.1f GFLOP/s; read bandwidth median %.2f GB/s; products at %.0f%% of it (min run %.2f ms, max %.2f ms)\n",
         s.n, (long long)rows, (long long)layers, (long long)d, (long long)ffn, (long long)vocab, s.transposed ? ", weights transposed" : "",
         bytes / 1e6, threads, 1e3 * tm, gbs, flops / tm / 1e9, bm, 100 * gbs / bm, 1e3 * t[0], 1e3 * t[reps - 1]);
  printf("RESULT gemv %lld %.4f %.3f %.3f %.2f\n", (long long)rows, tm, gbs, bm, flops / tm / 1e9);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_ctx_destroy(ctx);
  return 0;
}
