/* Claim: a training step (loss + gradients) of the tiny reference models
 * traces, transforms and runs through the reference interpreter in well
 * under a second at B=2, T=64, so model tests and CPU smoke runs are cheap.
 * Prints per preset: trace ms, value_and_grad transform ms, median run ms of
 * 5, tokens/s and the graph's model FLOPs. The interpreter is the oracle,
 * not the fast path (that is the compiler's job); no peer here.
 *   ./build/bench_models_step [B] [T] */
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "nabla/nabla.h"

int main(int argc, char **argv) {
  int64_t B = argc > 1 ? atoll(argv[1]) : 2, T = argc > 2 ? atoll(argv[2]) : 64;
  const char *presets[] = {"gpt2-tiny", "llama-tiny", "mixtral-tiny", "deepseek-tiny"};
  nb_ctx *ctx = nb_ctx_create();
  printf("| preset | params | trace ms | grad transform ms | run ms (median of 5) | tokens/s | GFLOP/step |\n|---|---|---|---|---|---|---|\n");
  for (int p = 0; p < 4; p++) {
    nb_model_config cfg;
    nb_model_config_preset(ctx, presets[p], &cfg);
    nb_array *key = nb_key(ctx, 0);
    nb_tree *params = nb_model_init(ctx, &cfg, key);
    nb_tree *batch = bench_lm_batch(ctx, B, T, cfg.vocab_size);
    double t0 = now_ms();
    nb_graph *g = nb_model_trace_loss(ctx, &cfg, NULL, params, batch);
    double t1 = now_ms();
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
    double t2 = now_ms();
    if (!vg) {
      fprintf(stderr, "%s: %s\n", presets[p], nb_ctx_error(ctx));
      return 1;
    }
    nb_tree *in = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    nb_tree_merge(in, "batch", batch);
    double runs[5];
    for (int r = 0; r < 5; r++) {
      nb_tree *out = nb_tree_create(ctx);
      double a = now_ms();
      if (nb_graph_run(ctx, vg, in, out) != NB_OK) {
        fprintf(stderr, "%s: %s\n", presets[p], nb_ctx_error(ctx));
        return 1;
      }
      runs[r] = now_ms() - a;
      nb_tree_destroy(out);
    }
    double run_ms = median(runs, 5);
    double flops, bytes;
    nb_graph_cost(vg, &flops, &bytes);
    printf("| %s | %lld | %.1f | %.1f | %.1f | %.0f | %.3f |\n", presets[p], (long long)nb_nn_params_count(params), t1 - t0,
           t2 - t1, run_ms, (double)(B * T) / (run_ms / 1e3), flops / 1e9);
    nb_tree_destroy(in);
    nb_graph_destroy(g);
    nb_graph_destroy(vg);
    nb_tree_destroy(batch);
    nb_tree_destroy(params);
    nb_array_release(key);
  }
  nb_ctx_destroy(ctx);
  return 0;
}
