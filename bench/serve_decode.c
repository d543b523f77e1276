/* Claim: single-stream decode through the serving engine (nb_serve_engine
 * scheduling one request, nb_serve_model_step running the compiled step:
 * paged KV cache write + paged attention) against its memory-bandwidth
 * floor, beside `nabla generate` and llama.cpp in bench/decode_vs_llamacpp.py.
 * A decode step must read every weight it multiplies (all but the untied
 * input embedding, of which one row) and the keys and values of the
 * sequence's context; floor tokens/s = read bandwidth / those bytes, the
 * bandwidth measured here (bench_util.h) with the same thread count.
 *
 *   ./build/bench_serve_decode (--hf DIR | --run-dir DIR | --preset NAME) [--prompt N] [--tokens M] [--reps R] [--threads T]
 *                              [--block B] [--seqs S] [--ids] [--plain-kernels]
 *
 * The model holds its kernels in the decode layout (panels of 64 output
 * features, or [out, in]), as `nabla serve` and `nabla generate` do
 * (nb_serve_model_opts.pack_kernels); --plain-kernels runs them as
 * [in, out] instead (the same bits).
 * The prompt is ids (i * 7919 + 13) % vocab unless --prompt-ids a,b,c.
 * --ids prints the greedy ids of the last run. Medians of R runs after one
 * warm-up run (which compiles the step buckets). Prints a line
 * "RESULT serve prefill_tok_s decode_tok_s floor_tok_s bytes_per_token bandwidth_GB_s
 * decode_tok_per_cpu_s". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"
#include "nabla/serve.h"

typedef struct run_times {
  double prefill_s, decode_s, decode_cpu_s; /* decode_cpu_s: the process's CPU time in the decode steps */
  int n_tokens, decode_steps;
} run_times;


/* S requests of the same prompt through the engine and the model at once,
 * greedy, exactly M tokens each: a prefill step, then decode steps of S rows
 * (S = 1: single-stream decode). out: the first request's tokens. */
static int run_batch(nb_ctx *ctx, nb_serve_engine *e, nb_serve_model *m, int64_t id, int32_t S, const int32_t *prompt,
                     int32_t P, int32_t M, int32_t *out, run_times *t) {
  for (int32_t q = 0; q < S; q++) {
    nb_serve_request r = {.id = id + q, .prompt = prompt, .prompt_len = P, .max_tokens = M, .n = 1};
    if (nb_serve_add_request(e, &r)) return fprintf(stderr, "add_request: %s\n", nb_ctx_error(ctx)), 1;
  }
  *t = (run_times){0};
  nb_serve_sample_out *drawn = malloc(sizeof *drawn * (size_t)S);
  double t0 = now_s();
  int rc = 0;
  while (!rc && nb_serve_has_unfinished(e)) {
    const nb_serve_batch *b;
    double s0 = now_s(), c0 = cpu_s();
    if (nb_serve_schedule(e, &b)) rc = fprintf(stderr, "schedule: %s\n", nb_ctx_error(ctx));
    else if (b->num_seqs == 0) rc = fprintf(stderr, "schedule: an empty batch with a request unfinished\n");
    if (rc) break;
    bool decode = t->n_tokens > 0;
    for (int32_t i = 0; i < b->num_seqs; i++) decode = decode && b->seqs[i].num_tokens == 1;
    int32_t n_drawn = 0;
    if (nb_serve_model_step(m, b, drawn, &n_drawn)) rc = fprintf(stderr, "step: %s\n", nb_ctx_error(ctx));
    for (int32_t i = 0; !rc && i < n_drawn; i++) {
      if (drawn[i].request_id == id && t->n_tokens < M) out[t->n_tokens++] = drawn[i].token;
      if (nb_serve_append_token(e, drawn[i].request_id, drawn[i].sample_index, drawn[i].token, NULL))
        rc = fprintf(stderr, "append: %s\n", nb_ctx_error(ctx));
    }
    double s1 = now_s();
    if (decode) t->decode_s += s1 - s0, t->decode_cpu_s += cpu_s() - c0, t->decode_steps++;
    else t->prefill_s = s1 - t0;
  }
  free(drawn);
  if (rc) return 1;
  return t->n_tokens == M ? 0 : (fprintf(stderr, "got %d tokens, wanted %d\n", t->n_tokens, M), 1);
}

int main(int argc, char **argv) {
  const char *hf = NULL, *run_dir = NULL, *preset = NULL, *ids = NULL;
  int32_t P = 8, M = 128, block = 16, S = 1;
  int reps = 5, threads = 0;
  bool print_ids = false, plain_kernels = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--hf") && i + 1 < argc) hf = argv[++i];
    else if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
    else if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
    else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) P = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--prompt-ids") && i + 1 < argc) ids = argv[++i];
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) M = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--block") && i + 1 < argc) block = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) S = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ids")) print_ids = true;
    else if (!strcmp(argv[i], "--plain-kernels")) plain_kernels = true;
    else return fprintf(stderr, "unknown argument '%s'\n", argv[i]), 2;
  }
  if (!!hf + !!run_dir + !!preset != 1) return fprintf(stderr, "give exactly one of --hf DIR, --run-dir DIR, --preset NAME\n"), 2;
  if (reps < 1 || reps > 64 || P < 1 || M < 2 || block < 1 || S < 1 || S > 1024)
    return fprintf(stderr, "bad --reps/--prompt/--tokens/--block/--seqs\n"), 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_model_loaded lm = {0};
  nb_model_config cfg;
  nb_tree *params = NULL;
  if (hf || run_dir) { /* a Hugging Face Llama, or a nabla run dir (any family: gpt2-124m) */
    if (hf ? nb_model_load_hf(ctx, hf, &lm) : nb_train_load_run_dir(ctx, run_dir, NULL, &lm))
      return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
    cfg = lm.cfg, params = lm.params;
  } else {
    if (nb_model_config_preset(ctx, preset, &cfg)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
    params = bench_random_params(ctx, &cfg);
  }
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(P + 4096)), *out = malloc(sizeof(int32_t) * (size_t)M);
  if (ids) {
    P = 0;
    for (const char *c = ids; *c && P < 4096; P++) {
      prompt[P] = (int32_t)strtol(c, (char **)&c, 10);
      if (*c == ',') c++;
    }
  } else
    for (int32_t i = 0; i < P; i++) prompt[i] = (int32_t)(((int64_t)i * 7919 + 13) % cfg.vocab_size);
  int bw_threads = threads ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  double bw = read_bandwidth(bw_threads < 64 ? bw_threads : 64);
  int64_t hd = nb_model_head_dim(&cfg);
  int32_t budget = S * P > 64 ? S * P : 64;
  nb_serve_config ec = {.block_size = block, .num_blocks = S * ((P + M) / block + 2), .max_num_seqs = S,
                        .max_num_batched_tokens = budget, .max_model_len = P + M,
                        .kv = {.num_layers = cfg.n_layers, .num_kv_heads = cfg.n_kv_heads, .head_dim = hd, .dtype_size = 4}};
  nb_serve_engine *e = nb_serve_engine_create(ctx, &ec);
  nb_serve_model_opts mo = {.threads = threads, .pack_kernels = !plain_kernels};
  nb_serve_model *m = e ? nb_serve_model_create(ctx, &cfg, params, nb_serve_engine_config(e), &mo) : NULL;
  if (!m) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  run_times t;
  double t0 = now_s();
  if (run_batch(ctx, e, m, 0, S, prompt, P, M, out, &t)) return 1;
  double warm = now_s() - t0;
  double pre[64], dec[64], dec_cpu[64], step_ms[64];
  for (int k = 0; k < reps; k++) {
    if (run_batch(ctx, e, m, (k + 1) * (int64_t)S, S, prompt, P, M, out, &t)) return 1;
    pre[k] = (double)S * P / t.prefill_s;
    dec[k] = (double)S * (M - 1) / t.decode_s;
    dec_cpu[k] = (double)S * (M - 1) / t.decode_cpu_s;
    step_ms[k] = 1e3 * t.decode_s / t.decode_steps;
  }
  /* keys and values of the average context of a decode step, P + M/2 tokens */
  double kv = 2.0 * (double)cfg.n_layers * (double)(cfg.n_kv_heads * hd) * 4 * (P + M / 2.0);
  double bytes = bench_decode_weight_bytes(&cfg, params) + kv, floor_tps = bw * 1e9 / bytes;
  double p_med = median(pre, reps), d_med = median(dec, reps), c_med = median(dec_cpu, reps), st_med = median(step_ms, reps);
  printf("read bandwidth (1 GiB, %d threads, best of 5): %.2f GB/s\n", bw_threads, bw);
  printf("serve decode: prompt %d, %d tokens, %d threads, %d executables; prefill %.1f tok/s, decode %.2f tok/s "
         "(min %.2f, max %.2f), floor %.2f MB/token = %.1f tok/s (%.1f%%), first run %.2f s\n",
         P, M, bw_threads, nb_serve_model_num_executables(m), p_med, d_med, dec[0], dec[reps - 1], bytes / 1e6, floor_tps,
         100 * d_med / floor_tps, warm);
  printf("decode per CPU second of the process: %.2f tok/s (the figure to compare at one thread on a busy machine)\n", c_med);
  if (S > 1) /* the floor above is single-stream's: a step of S rows reads the weights once and S contexts */
    printf("batched decode: %d sequences, a step of %d rows %.2f ms (median), %.1f tok/s\n", S, S, st_med, d_med);
  if (print_ids) {
    printf("IDS");
    for (int32_t i = 0; i < M; i++) printf("%c%d", i ? ',' : ' ', out[i]);
    printf("\n");
  }
  printf("RESULT serve %.3f %.3f %.3f %.0f %.3f %.3f\n", p_med, d_med, floor_tps, bytes, bw, c_med);
  nb_serve_model_destroy(m);
  nb_serve_engine_destroy(e);
  if (hf || run_dir) nb_model_loaded_free(&lm);
  else nb_tree_destroy(params);
  free(prompt);
  free(out);
  nb_ctx_destroy(ctx);
  return 0;
}
