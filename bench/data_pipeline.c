/* Token rate of the LM input pipeline: read a token shard, cut windows of
 * T+1, shuffle globally, batch B windows, and prefetch on W worker threads;
 * the consumer only touches each batch. Reports the median of several runs
 * in tokens/s (input tokens, B*T per batch).
 *
 *   bench_data_pipeline [--tokens N] [--seq T] [--batch B] [--workers W] [--shard PATH]
 *
 * Without --shard it writes a shard of N random uint16 ids (vocab 50257) to
 * /tmp first. No peer runs here: the number to compare with is the trainer's
 * step rate (tokens/s it can consume), measured later. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"

static int write_shard(nb_ctx *ctx, const char *path, int64_t n) {
  nb_data_shard_writer *w = nb_data_shard_create(ctx, path, 2, 50257);
  if (!w) return 1;
  int32_t buf[4096];
  uint64_t x = 42;
  for (int64_t at = 0; at < n; at += 4096) {
    int64_t k = n - at < 4096 ? n - at : 4096;
    for (int64_t i = 0; i < k; i++) x = x * 6364136223846793005ull + 1442695040888963407ull, buf[i] = (int32_t)((x >> 33) % 50257);
    if (nb_data_shard_write(w, buf, (size_t)k)) return 1;
  }
  return nb_data_shard_finish(w) != NB_OK;
}

/* One run: batches until `tokens` input tokens went by; returns tokens/s. */
static double run(nb_ctx *ctx, const char *shard, int64_t T, int64_t B, int W, int64_t tokens, uint64_t seed,
                  bool stats) {
  nb_data_map *ds = nb_data_map_tokens(ctx, 1, &shard, T);
  ds = nb_data_map_batch(nb_data_map_repeat(nb_data_map_shuffle(ds, seed), 0), B, true);
  nb_data_iter *it = nb_data_iter_prefetch(nb_data_iter_create(ds), W, 4 * W + 4);
  if (!it) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 0;
  nb_data_elem e = NB_DATA_ELEM_INIT;
  int64_t seen = 0;
  volatile int64_t sink = 0;
  double t0 = now_s();
  while (seen < tokens) {
    if (nb_data_iter_next(it, &e) || e.kind != NB_DATA_TREE) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 0;
    const nb_array *a = nb_tree_get_array(e.tree, "tokens");
    sink += ((const int32_t *)nb_array_data(a))[nb_array_size(a) - 1];
    seen += B * T;
  }
  double dt = now_s() - t0;
  if (stats) nb_data_iter_print_stats(it, stdout);
  nb_data_elem_clear(ctx, &e);
  nb_data_iter_destroy(it);
  (void)sink;
  return (double)seen / dt;
}

int main(int argc, char **argv) {
  int64_t n = 64 << 20, T = 1024, B = 16, runs = 5;
  int W = 1;
  const char *shard = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tokens")) n = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--seq")) T = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) B = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--workers")) W = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--shard")) shard = argv[i + 1];
    else if (!strcmp(argv[i], "--runs")) runs = atoll(argv[i + 1]);
  }
  nb_ctx *ctx = nb_ctx_create();
  char path[128];
  if (!shard) {
    snprintf(path, sizeof path, "/tmp/nabla_bench_%d.tok", (int)getpid());
    if (write_shard(ctx, path, n)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
    shard = path;
  }
  double rates[64];
  if (runs > 64) runs = 64;
  if (runs < 1) runs = 1;
  for (int r = 0; r < runs; r++) rates[r] = run(ctx, shard, T, B, W, n / 2, (uint64_t)r + 1, r == runs - 1);
  double med = median(rates, (int)runs);
  printf("pipeline shard->window(T=%lld)->shuffle->batch(B=%lld)->prefetch(%d worker%s): median %.1f M tokens/s "
         "(min %.1f, max %.1f, %lld runs of %lld tokens)\n", (long long)T, (long long)B, W, W > 1 ? "s" : "",
         med / 1e6, rates[0] / 1e6, rates[runs - 1] / 1e6, (long long)runs, (long long)(n / 2));
  if (shard == path) remove(path);
  nb_ctx_destroy(ctx);
  return 0;
}
