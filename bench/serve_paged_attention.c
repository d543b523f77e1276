/* Paged attention on the host (nb_serve_paged_attention): a decode step of
 * 32 sequences with 1024 tokens of context each, and a 512-token prefill,
 * for a gpt2-124m-sized layer (12 heads of 64, block_size 16, f32), on one
 * thread and on two (a runner that starts threads per call, as a stand-in
 * for the runtime's pool). Medians of 9 runs. A decode reads every key and
 * value of every context once: its GB/s is against the memory bandwidth; a
 * prefill is compute (4 * rows * keys * head_dim flops over the causal half).
 * On a shared machine the wall time is the load's; the one-thread rows also
 * give the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), the kernel's own.
 *
 * Build and run (from the repository root, after scripts/build.sh build):
 *   build/bench_serve_paged_attention
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

enum { H = 12, D = 64, BS = 16, REPS = 9 };

typedef struct claim {
  atomic_int next;
  int n;
  void (*task)(void *, int);
  void *arg;
} claim;

static void *claim_loop(void *p) {
  claim *c = p;
  for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n;) c->task(c->arg, i);
  return NULL;
}

static void run_two(void *runner, int n, void (*task)(void *, int), void *arg) {
  (void)runner;
  claim c = {.n = n, .task = task, .arg = arg};
  atomic_init(&c.next, 0);
  pthread_t t;
  int started = pthread_create(&t, NULL, claim_loop, &c) == 0;
  claim_loop(&c);
  if (started) pthread_join(t, NULL);
}

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *randf(int64_t n) {
  float *x = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  return x;
}

/* num_seqs sequences of ctx tokens, the last n_new of them new. */
static void bench(nb_ctx *ctx, const char *name, int32_t num_seqs, int32_t ctx_len, int32_t n_new) {
  int32_t per_seq = (ctx_len + BS - 1) / BS, num_blocks = num_seqs * per_seq, T = num_seqs * n_new;
  int32_t *tables = malloc(sizeof(int32_t) * (size_t)num_blocks), *lens = malloc(sizeof(int32_t) * (size_t)num_seqs);
  int32_t *qs = malloc(sizeof(int32_t) * (size_t)(num_seqs + 1));
  for (int32_t b = 0; b < num_blocks; b++) tables[b] = (b * 7919) % num_blocks; /* scattered (7919 is prime) */
  for (int32_t s = 0; s <= num_seqs; s++) qs[s] = s * n_new;
  for (int32_t s = 0; s < num_seqs; s++) lens[s] = ctx_len;
  float *q = randf((int64_t)T * H * D), *kc = randf((int64_t)num_blocks * BS * H * D), *vc = randf((int64_t)num_blocks * BS * H * D);
  float *out = malloc(sizeof(float) * (size_t)T * H * D);
  nb_serve_attn a = {.num_seqs = num_seqs, .num_tokens = T, .num_heads = H, .num_kv_heads = H, .head_dim = D,
                     .block_size = BS, .num_blocks = num_blocks, .max_blocks_per_seq = per_seq, .q = q, .k_cache = kc,
                     .v_cache = vc, .block_tables = tables, .context_lens = lens, .query_start = qs, .scale = 0.125f,
                     .out = out};
  double keys = 0; /* query-key pairs */
  for (int32_t r = 0; r < n_new; r++) keys += ctx_len - n_new + r + 1;
  keys *= (double)num_seqs * H;
  double kv_bytes = (double)num_seqs * ctx_len * H * D * 4 * 2;
  for (int threads = 1; threads <= 2; threads++) {
    double t[REPS], cpu[REPS];
    for (int i = 0; i < REPS; i++) {
      double t0 = now_s(), c0 = thread_cpu_s();
      if (nb_serve_paged_attention(ctx, &a, threads == 2 ? run_two : NULL, NULL) != NB_OK) {
        fprintf(stderr, "%s\n", nb_ctx_error(ctx));
        exit(1);
      }
      t[i] = now_s() - t0;
      cpu[i] = thread_cpu_s() - c0;
    }
    double m = median(t, REPS), c = median(cpu, REPS);
    printf("%-28s %d thread%s  wall %8.3f ms  %6.2f GB/s of KV  %6.2f GFLOP/s", name, threads, threads > 1 ? "s" : " ",
           1e3 * m, kv_bytes / m / 1e9, 4.0 * keys * D / m / 1e9);
    if (threads == 1) printf("  | cpu %8.3f ms  %6.2f GB/s  %6.2f GFLOP/s", 1e3 * c, kv_bytes / c / 1e9, 4.0 * keys * D / c / 1e9);
    printf("\n");
  }
  free(tables), free(lens), free(qs), free(q), free(kc), free(vc), free(out);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  bench(ctx, "decode 32 seqs x 1024 ctx", 32, 1024, 1);
  bench(ctx, "prefill 1 seq x 512 tokens", 1, 512, 512);
  nb_ctx_destroy(ctx);
  return 0;
}
