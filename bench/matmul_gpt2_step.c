/* Where a GPT-2 training step's time goes among its dots: value_and_grad of
 * the gpt2-124m loss (B=4, T=256 by default) through nb_jit, and per run the
 * step time, the time and rate of all dot_general steps, of the attention's
 * (the 48-item batched ones, 3e8-5e8 flops each at these shapes) and of the
 * other steps, from nb_exe_step. Run it against two builds alternately to
 * compare them under the same load.
 *
 *   ./build/bench_matmul_gpt2_step [runs] [B] [T]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"
#include "bench_util.h"

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 2;
  int64_t B = argc > 2 ? atoll(argv[2]) : 4, T = argc > 3 ? atoll(argv[3]) : 256;
  nb_ctx *ctx = nb_ctx_create();
  nb_model_config cfg;
  if (nb_model_config_preset(ctx, "gpt2-124m", &cfg) != NB_OK || T > cfg.max_seq_len || B < 1 || T < 1 || runs < 1) {
    fprintf(stderr, "bad arguments: %s\n", nb_ctx_error(ctx));
    return 2;
  }
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &cfg, key);
  nb_tree *batch = bench_lm_batch(ctx, B, T, cfg.vocab_size);
  nb_graph *g = nb_model_trace_loss(ctx, &cfg, NULL, params, batch);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  nb_exe *e = vg ? nb_jit(ctx, vg, NULL) : NULL;
  if (!e) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  for (int r = 0; r < runs; r++) {
    nb_tree *out = nb_tree_create(ctx);
    double t0 = now_ms();
    if (nb_exe_run(e, in, out) != NB_OK) {
      fprintf(stderr, "%s\n", nb_ctx_error(ctx));
      return 1;
    }
    double ms = now_ms() - t0, dot = 0, att = 0, fl = 0, fla = 0, other = 0;
    for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
      nb_exe_step_info s;
      nb_exe_step(e, i, &s);
      if (strcmp(s.name, "dot_general") != 0) other += s.last_ms;
      else if (s.flops > 3e8 && s.flops < 5e8) att += s.last_ms, fla += s.flops;
      else dot += s.last_ms, fl += s.flops;
    }
    printf("run %d: step %.0f ms; dots %.0f ms (%.1f GFLOP, %.1f GFLOP/s), of them attention-size %.0f ms (%.2f GFLOP, "
           "%.1f GFLOP/s); other steps %.0f ms\n",
           r, ms, dot + att, (fl + fla) / 1e9, (fl + fla) / (dot + att) / 1e6, att, fla / 1e9, fla / att / 1e6, other);
    nb_tree_destroy(out);
  }
  nb_tree_destroy(in);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_array_release(key);
  nb_exe_destroy(e);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_ctx_destroy(ctx);
  return 0;
}
