/* dot_general through nb_jit against cblas_sgemm called directly, on the
 * shapes and dimension numbers a GPT-2-small training step traces
 * (B=4, T=256, C=768, H=12): the MLP's forward dots, their backward
 * (dX = dY W^T, dW = X^T dY as the grad transform emits them) and the
 * attention's batched dots in the model's layouts. Same thread count on
 * both sides, runs interleaved, medians. Batched shapes have two direct
 * peers: one threaded sgemm per item, and items split over threads with
 * OpenBLAS on one thread each.
 *
 *   ./build/bench_matmul_vs_sgemm [--threads N] [--reps R] [--only SUBSTRING] [--bf16]
 *
 * --bf16: the jit's operands are bf16 (its result f32: convert-on-pack, f32
 * accumulation); the direct calls get the same values as f32.
 *
 * The jit's output array is allocated per run (as nb_exe_run does); the
 * bench raises glibc's mmap threshold so that a large output reuses heap
 * pages instead of faulting fresh ones in every run, as a model's arena
 * does. Not here: epilogues (see tests/compile/test_jit_dot.c). */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"
#include "bench_util.h"

#if __has_include(<cblas.h>)
#include <cblas.h>

enum { B = 4, T = 256, C = 768, F = 3072, H = 12, D = 64 };

/* One dot: the traced form (shapes, dimension numbers) and the same product
 * as direct calls: nb0 x nb1 items of an M x N x K sgemm, the operands of
 * item (i, j) at i * s0 + j * s1 elements. */
typedef struct bcase {
  const char *name;
  int lr, rr;
  int64_t ld[5], rd[5];
  nb_dot_dims dn;
  int nb0, nb1;
  int64_t as0, as1, bs0, bs1;
  int M, N, K;
  bool ta, tb;
  int lda, ldb;
} bcase;

#define DN(nb, nc, lb0, lb1, rb0, rb1, lc0, lc1, rc0, rc1) \
  {.n_batch = nb, .n_contract = nc, .lhs_batch = {lb0, lb1}, .rhs_batch = {rb0, rb1}, .lhs_contract = {lc0, lc1}, .rhs_contract = {rc0, rc1}}

static const bcase cases[] = {
    /* MLP up: X [B,T,C] . W [C,F] */
    {"fc   X.W    [4096x768]x[768x3072]", 3, 2, {B, T, C}, {C, F}, DN(0, 1, 0, 0, 0, 0, 2, 0, 0, 0), 1, 1, 0, 0, 0, 0, B * T, F, C, false, false, C, F},
    /* MLP down: H [B,T,F] . W [F,C] */
    {"proj H.W    [4096x3072]x[3072x768]", 3, 2, {B, T, F}, {F, C}, DN(0, 1, 0, 0, 0, 0, 2, 0, 0, 0), 1, 1, 0, 0, 0, 0, B * T, C, F, false, false, F, C},
    /* backward of fc: dX = dY [B,T,F] . W [C,F] contracting F */
    {"fc   dX=dY.W^T [4096x3072]x[768x3072]^T", 3, 2, {B, T, F}, {C, F}, DN(0, 1, 0, 0, 0, 0, 2, 0, 1, 0), 1, 1, 0, 0, 0, 0, B * T, C, F, false, true, F, F},
    /* backward of fc: dW = X [B,T,C] . dY [B,T,F] contracting (B,T) */
    {"fc   dW=X^T.dY [4096x768]^Tx[4096x3072]", 3, 3, {B, T, C}, {B, T, F}, DN(0, 2, 0, 0, 0, 0, 0, 1, 0, 1), 1, 1, 0, 0, 0, 0, C, F, B * T, true, false, C, F},
    /* backward of proj: dX = dY [B,T,C] . W [F,C] contracting C */
    {"proj dX=dY.W^T [4096x768]x[3072x768]^T", 3, 2, {B, T, C}, {F, C}, DN(0, 1, 0, 0, 0, 0, 2, 0, 1, 0), 1, 1, 0, 0, 0, 0, B * T, F, C, false, true, C, C},
    /* backward of proj: dW = H [B,T,F] . dY [B,T,C] contracting (B,T) */
    {"proj dW=H^T.dY [4096x3072]^Tx[4096x768]", 3, 3, {B, T, F}, {B, T, C}, DN(0, 2, 0, 0, 0, 0, 0, 1, 0, 1), 1, 1, 0, 0, 0, 0, F, C, B * T, true, false, F, C},
    /* scores: q [B,T,H,1,D] . k [B,H,T,D] -> [B,H,T,1,T] */
    {"attn q.k^T  48x[256x64]x[256x64]^T", 5, 4, {B, T, H, 1, D}, {B, H, T, D}, DN(2, 1, 0, 2, 0, 1, 4, 0, 3, 0), B, H, (int64_t)T * H * D, D,
     (int64_t)H * T * D, (int64_t)T * D, T, T, D, false, true, H * D, D},
    /* p [B,H,T,1,T] . v [B,H,T,D] -> [B,H,T,1,D] */
    {"attn p.v    48x[256x256]x[256x64]", 5, 4, {B, H, T, 1, T}, {B, H, T, D}, DN(2, 1, 0, 1, 0, 1, 4, 0, 2, 0), B, H, (int64_t)H * T * T, (int64_t)T * T,
     (int64_t)H * T * D, (int64_t)T * D, T, D, T, false, false, T, D},
    /* dv: p [B,H,T,1,D] . g [B,H,T,1,T] contracting (T,1) -> [B,H,D,T] */
    {"attn dv-like 48x[256x64]^Tx[256x256]", 5, 5, {B, H, T, 1, D}, {B, H, T, 1, T}, DN(2, 2, 0, 1, 0, 1, 2, 3, 2, 3), B, H, (int64_t)H * T * D,
     (int64_t)T * D, (int64_t)H * T * T, (int64_t)T * T, D, T, T, true, false, D, T},
    /* dk: g [B,H,T,1,T] . q [B,T,H,1,D] contracting (T,1) -> [B,H,T,D] */
    {"attn dk-like 48x[256x256]^Tx[256x64] (q strided)", 5, 5, {B, H, T, 1, T}, {B, T, H, 1, D}, DN(2, 2, 0, 1, 0, 2, 2, 3, 1, 3), B, H,
     (int64_t)H * T * T, (int64_t)T * T, (int64_t)T * H * D, D, T, D, T, true, false, T, H * D},
};

static void item(const bcase *c, const float *a, const float *b, float *out, int i, int j) {
  cblas_sgemm(CblasRowMajor, c->ta ? CblasTrans : CblasNoTrans, c->tb ? CblasTrans : CblasNoTrans, c->M, c->N, c->K, 1.0f,
              a + i * c->as0 + j * c->as1, c->lda, b + i * c->bs0 + j * c->bs1, c->ldb, 0.0f,
              out + ((int64_t)i * c->nb1 + j) * c->M * c->N, c->N);
}

typedef struct split_arg {
  const bcase *c;
  const float *a, *b;
  float *out;
  int lo, hi;
} split_arg;

static void *split_worker(void *p) {
  split_arg *s = p;
  for (int t = s->lo; t < s->hi; t++) item(s->c, s->a, s->b, s->out, t / s->c->nb1, t % s->c->nb1);
  return NULL;
}

/* direct: one sgemm per item on `threads` BLAS threads */
static void direct_loop(const bcase *c, const float *a, const float *b, float *out, int threads) {
  openblas_set_num_threads(threads);
  for (int i = 0; i < c->nb0; i++)
    for (int j = 0; j < c->nb1; j++) item(c, a, b, out, i, j);
}

/* direct: items split over `threads` threads, BLAS on one thread each */
static void direct_split(const bcase *c, const float *a, const float *b, float *out, int threads) {
  openblas_set_num_threads(1);
  pthread_t th[64];
  split_arg s[64];
  int n = c->nb0 * c->nb1;
  for (int t = 0; t < threads; t++) {
    s[t] = (split_arg){c, a, b, out, n * t / threads, n * (t + 1) / threads};
    if (t) pthread_create(&th[t], NULL, split_worker, &s[t]);
  }
  split_worker(&s[0]);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
}

/* x's values rounded to bf16 in place; returns them as a bf16 array */
static nb_array *to_bf16(nb_ctx *ctx, nb_array *x) {
  nb_array *y = nb_array_empty(ctx, NB_BF16, nb_array_rank(x), nb_array_dims(x));
  float *p = nb_array_data_mut(x);
  uint16_t *q = nb_array_data_mut(y);
  for (int64_t i = 0; i < nb_array_size(x); i++) {
    uint32_t u;
    memcpy(&u, &p[i], 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaNs here) */
    q[i] = (uint16_t)(u >> 16);
    u = (uint32_t)q[i] << 16;
    memcpy(&p[i], &u, 4);
  }
  return y;
}

static nb_array *randn(nb_ctx *ctx, int rank, const int64_t *dims, unsigned seed) {
  nb_array *x = nb_array_empty(ctx, NB_F32, rank, dims);
  float *p = nb_array_data_mut(x);
  for (int64_t i = 0; i < nb_array_size(x); i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return x;
}

int main(int argc, char **argv) {
  int threads = 2, reps = 5;
  const char *only = NULL;
  bool bf16 = false;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--only")) only = argv[++i];
    else if (!strcmp(argv[i], "--bf16")) bf16 = true;
  }
  if (threads < 1 || threads > 64 || reps < 1 || reps > 99) return 2;
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  nb_ctx *ctx = nb_ctx_create();
  printf("dot_general (nb_jit%s) vs cblas_sgemm, %d threads, median of %d interleaved runs; both on %s\n",
         bf16 ? ", bf16 operands" : "", threads, reps, nb_jit_blas_core());
  printf("%-46s %9s %9s %9s %7s %7s  %s\n", "case", "jit ms", "loop ms", "split ms", "GF/s", "best", "jit/best");
  double peak = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
    const bcase *c = &cases[ci];
    if (only && !strstr(c->name, only)) continue;
    nb_graph *g = nb_graph_create(ctx);
    nb_dtype t = bf16 ? NB_BF16 : NB_F32;
    nb_val *a = nb_graph_input(g, "a", nb_aval_make(t, c->lr, c->ld));
    nb_val *b = nb_graph_input(g, "b", nb_aval_make(t, c->rr, c->rd));
    nb_graph_output(g, "y", nb_dot_general(a, b, &c->dn, NB_F32));
    nb_jit_opts o = {.threads = threads};
    nb_exe *e = nb_jit(ctx, g, &o);
    if (!e) {
      fprintf(stderr, "%s: %s\n", c->name, nb_ctx_error(ctx));
      return 1;
    }
    nb_array *f[2] = {randn(ctx, c->lr, c->ld, 1), randn(ctx, c->rr, c->rd, 2)}, *out[1] = {NULL};
    nb_array *in[2] = {f[0], f[1]};
    if (bf16) in[0] = to_bf16(ctx, f[0]), in[1] = to_bf16(ctx, f[1]);
    const float *pa = nb_array_data(f[0]), *pb = nb_array_data(f[1]);
    size_t ny = (size_t)c->nb0 * c->nb1 * c->M * c->N;
    float *ref = malloc(ny * sizeof(float));
    double tj[99], tl[99], ts[99];
    bool batched = c->nb0 * c->nb1 > 1;
    double maxdiff = 0;
    for (int r = -1; r < reps; r++) { /* r = -1 warms up */
      double t0 = now_s();
      if (nb_exe_run_flat(e, in, out) != NB_OK) {
        fprintf(stderr, "%s: %s\n", c->name, nb_ctx_error(ctx));
        return 1;
      }
      double t1 = now_s();
      direct_loop(c, pa, pb, ref, threads);
      double t2 = now_s();
      if (batched) direct_split(c, pa, pb, ref, threads);
      double t3 = now_s();
      if (r < 0) { /* the jit's result is the direct one (same order of the sum) */
        const float *y = nb_array_data(out[0]);
        for (size_t i = 0; i < ny; i++) {
          double d = y[i] - ref[i];
          if (d < 0) d = -d;
          if (d > maxdiff) maxdiff = d;
        }
      } else {
        tj[r] = t1 - t0, tl[r] = t2 - t1, ts[r] = batched ? t3 - t2 : 1e30;
      }
      nb_array_release(out[0]);
      out[0] = NULL;
    }
    double flops = 2.0 * c->nb0 * c->nb1 * c->M * c->N * c->K;
    double mj = median(tj, reps), ml = median(tl, reps), ms = median(ts, reps), best = ml < ms ? ml : ms;
    if (flops / best > peak) peak = flops / best;
    char split[16] = "-";
    if (batched) snprintf(split, sizeof split, "%.3f", ms * 1e3);
    printf("%-46s %9.3f %9.3f %9s %7.1f %7.1f  %.1f%%%s\n", c->name, mj * 1e3, ml * 1e3, split, flops / mj / 1e9, flops / best / 1e9,
           100 * best / mj, maxdiff > 1e-3 ? "  RESULT DIFFERS" : "");
    free(ref);
    if (bf16) nb_array_release(in[0]), nb_array_release(in[1]);
    nb_array_release(f[0]);
    nb_array_release(f[1]);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
  printf("best direct sgemm rate seen: %.1f GFLOP/s\n", peak / 1e9);
  nb_ctx_destroy(ctx);
  return 0;
}
#else
int main(void) {
  printf("bench_matmul_vs_sgemm: built without cblas.h\n");
  return 0;
}
#endif
