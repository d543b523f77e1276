/* Claim: `nabla generate`'s compiled decode step (one token, KV cache,
 * sampler fused) runs at a stated fraction of its memory-bandwidth floor on
 * the CPU: every decode step must read the weights it multiplies (all of
 * them but the untied input embedding and the position table, of which one
 * row is read) and the whole KV cache (attention runs over the cache's
 * fixed length, masked). Floor tokens/s = read bandwidth / those bytes, the
 * bandwidth measured here over a 1 GiB buffer with the same thread count.
 * Prefill tokens/s is reported beside it. Random weights (values do not
 * change the work). Medians of --reps runs after one warm-up run that
 * compiles. Each preset prints a line "RESULT name prefill_tok_s
 * decode_tok_s floor_tok_s bytes_per_token bandwidth_GB_s" for
 * bench/generate_vs_torch.py.
 *   ./build/bench_generate_decode [--prompt N] [--tokens M] [--reps R] [--threads T] preset...
 *   (default: gpt2-tiny llama-tiny, prompt 64, 64 tokens, 5 reps) */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"

/* ---------------------------------------------------------------- one preset */

/* bytes one decode step must read: see the header */
static double floor_bytes(const nb_model_config *c, const nb_tree *params, int64_t cache_len) {
  return bench_decode_weight_bytes(c, params) +
         2.0 * (double)c->n_layers * (double)c->n_kv_heads * (double)cache_len * (double)nb_model_head_dim(c) * 4;
}

static int bench(nb_ctx *ctx, const char *name, int64_t P, int64_t M, int reps, int threads, double bw) {
  nb_model_config cfg;
  if (nb_model_config_preset(ctx, name, &cfg)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  int64_t max_len = P + M < cfg.max_seq_len ? P + M : cfg.max_seq_len, chunk = 64 < max_len ? 64 : max_len;
  int64_t cache_len = (max_len + chunk - 1) / chunk * chunk;
  nb_tree *params = bench_random_params(ctx, &cfg);
  nb_model_gen_opts go = {.max_seq_len = max_len, .prefill_chunk = chunk, .threads = threads};
  nb_model_generator *gen = nb_model_generator_create(ctx, &cfg, params, &go);
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
  for (int64_t i = 0; i < P; i++) prompt[i] = (int32_t)((i * 7919 + 13) % cfg.vocab_size);
  nb_model_gen_request r = {.prompt = prompt, .n_prompt = P, .max_tokens = M};
  nb_model_gen_result res;
  double t0 = now_s();
  if (!gen || nb_model_generate(gen, &r, &res)) return fprintf(stderr, "%s: %s\n", name, nb_ctx_error(ctx)), 1;
  double warm = now_s() - t0, compile = res.compile_s;
  double pre[64], dec[64];
  for (int k = 0; k < reps; k++) {
    if (nb_model_generate(gen, &r, &res) || res.n_tokens != M) return fprintf(stderr, "%s: %s\n", name, nb_ctx_error(ctx)), 1;
    pre[k] = (double)P / res.prefill_s;
    dec[k] = (double)(M - 1) / res.decode_s;
  }
  double bytes = floor_bytes(&cfg, params, cache_len), floor_tps = bw * 1e9 / bytes;
  double p_med = median(pre, reps), d_med = median(dec, reps);
  printf("| %s | %lld | %lld+%lld (cache %lld) | %.0f | %.1f | %.2f | %.1f | %.1f%% | %.2f s (compile %.2f s) |\n", name,
         (long long)nb_nn_params_count(params), (long long)P, (long long)M, (long long)cache_len, p_med, d_med, bytes / 1e6,
         floor_tps, 100 * d_med / floor_tps, warm, compile);
  printf("RESULT %s %.3f %.3f %.3f %.0f %.3f\n", name, p_med, d_med, floor_tps, bytes, bw);
  fflush(stdout);
  free(prompt);
  nb_model_generator_destroy(gen);
  nb_tree_destroy(params);
  return 0;
}

int main(int argc, char **argv) {
  int64_t P = 64, M = 64;
  int reps = 5, threads = 0, first = argc;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--prompt") && i + 1 < argc) P = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) M = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (first == argc) first = i;
  }
  if (reps < 1 || reps > 64 || P < 1 || M < 2) return fprintf(stderr, "bad --reps/--prompt/--tokens\n"), 2;
  int bw_threads = threads ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  double bw = read_bandwidth(bw_threads < 64 ? bw_threads : 64);
  printf("read bandwidth (1 GiB, %d threads, best of 5): %.2f GB/s\n\n", bw_threads, bw);
  printf("| preset | params | prompt+new (cache) | prefill tok/s | decode tok/s | floor MB/token | floor tok/s | decode / floor | first run |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  nb_ctx *ctx = nb_ctx_create();
  const char *def[] = {"gpt2-tiny", "llama-tiny"};
  int rc = 0;
  if (first == argc)
    for (int k = 0; k < 2; k++) rc |= bench(ctx, def[k], P, M, reps, threads, bw);
  for (int i = first; i < argc; i++) {
    if (argv[i][0] == '-') {
      i++;
      continue;
    }
    rc |= bench(ctx, argv[i], P, M, reps, threads, bw);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
