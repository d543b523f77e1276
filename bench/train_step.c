/* Claim: the trainer's loop (data pipeline + compiled step + async
 * checkpoints + metrics) costs within 5% of the bare compiled step.
 * Measures, in one process and on one config: the bare step (nb_train_trace_step
 * jit'd with donation, run on one fixed batch) before and after, and
 * nb_train_run end to end (median loop iteration, eval off, checkpoints every
 * `ckpt` steps). Prints medians, their ratio, tokens/s and MFU.
 *   ./build/bench_train_step [preset] [B] [T] [steps] [ckpt_every] [data]
 * (defaults: gpt2-tiny 16 128 40 10 data/corpus/kjv.txt). MFU peak:
 * $NABLA_PEAK_GFLOPS, else cores x cpu MHz x 64. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"

#define TRY(x)                                                   \
  do {                                                           \
    if (!(x)) {                                                  \
      fprintf(stderr, "bench_train_step: %s\n", nb_ctx_error(ctx)); \
      return 1;                                                  \
    }                                                            \
  } while (0)

/* n runs of the bare step on one batch; per-run ms into ms[] */
static int bare_steps(nb_ctx *ctx, const nb_train_config *c, int n, double *ms) {
  nb_array *key = nb_key(ctx, (uint64_t)c->seed);
  nb_tree *params = nb_model_init(ctx, &c->model, key);
  TRY(params);
  nb_optim_tx *tx = nb_train_optimizer(ctx, c);
  TRY(tx);
  nb_tree *opt = nb_optim_init_arrays(ctx, tx, params);
  TRY(opt);
  nb_graph *g = nb_train_trace_step(ctx, c, params, opt);
  TRY(g);
  const char *donate[] = {"params", "opt_state", NULL};
  nb_exe *exe = nb_jit(ctx, g, &(nb_jit_opts){.donate = donate});
  TRY(exe);
  nb_tree *st = nb_tree_create(ctx);
  nb_tree_merge(st, "params", params);
  nb_tree_merge(st, "opt_state", opt);
  TRY(nb_train_set_hparams(ctx, c, st) == NB_OK);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  int64_t B = c->batch_size, T = c->data.seq_len;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T));
  for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7919) % 256);
  nb_array *x = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){B, T}, tok);
  free(tok);
  for (int r = 0; r < n; r++) {
    nb_array *step = nb_array_scalar(ctx, NB_I32, r);
    nb_tree_set_array(st, "batch/inputs", x);
    nb_tree_set_array(st, "batch/targets", x);
    nb_tree_set_array(st, "step", step);
    nb_array_release(step);
    nb_tree *out = nb_tree_create(ctx);
    double a = now_ms();
    TRY(nb_exe_run(exe, st, out) == NB_OK);
    ms[r] = now_ms() - a;
    for (size_t i = 0; i < nb_tree_size(out); i++) {
      const char *p = nb_tree_path(out, i);
      if (!strncmp(p, "params/", 7) || !strncmp(p, "opt_state/", 10)) nb_tree_set_array(st, p, nb_tree_leaf(out, i)->array);
    }
    nb_tree_destroy(out);
  }
  nb_array_release(x);
  nb_array_release(key);
  nb_tree_destroy(st);
  nb_exe_destroy(exe);
  nb_graph_destroy(g);
  nb_optim_tx_destroy(tx);
  return 0;
}

int main(int argc, char **argv) {
  const char *preset = argc > 1 ? argv[1] : "gpt2-tiny";
  int B = argc > 2 ? atoi(argv[2]) : 16, T = argc > 3 ? atoi(argv[3]) : 128, n = argc > 4 ? atoi(argv[4]) : 40;
  int ck = argc > 5 ? atoi(argv[5]) : 10;
  const char *data = argc > 6 ? argv[6] : "data/corpus/kjv.txt";
  nb_ctx *ctx = nb_ctx_create();
  char o[8][600];
  snprintf(o[0], sizeof o[0], "model.preset=%s", preset);
  snprintf(o[1], sizeof o[1], "batch_size=%d", B);
  snprintf(o[2], sizeof o[2], "data.seq_len=%d", T);
  snprintf(o[3], sizeof o[3], "steps=%d", n);
  snprintf(o[4], sizeof o[4], "checkpoint_every=%d", ck);
  snprintf(o[5], sizeof o[5], "data.train=%s", data);
  snprintf(o[6], sizeof o[6], "log_every=%d", n);
  snprintf(o[7], sizeof o[7], "eval_every=0");
  const char *ov[8];
  for (int i = 0; i < 8; i++) ov[i] = o[i];
  nb_train_config c;
  TRY(nb_train_config_parse(ctx, "<bench>", "", 0, 8, ov, &c) == NB_OK);
  double *bare = calloc((size_t)(2 * n), sizeof *bare);
  if (bare_steps(ctx, &c, n, bare)) return 1;
  char dir[] = "/tmp/nabla_bench_train_XXXXXX";
  TRY(mkdtemp(dir));
  nb_train_result r;
  double t0 = now_ms();
  TRY(nb_train_run(ctx, &c, &(nb_train_opts){.run_dir = dir}, &r) == NB_OK);
  double e2e_ms = now_ms() - t0;
  if (bare_steps(ctx, &c, n, bare + n)) return 1;
  double bare_med = median(bare, 2 * n);
  double tokens = (double)B * T, N = 0;
  nb_tree *spec = nb_model_param_spec(ctx, &c.model, NB_F32);
  N = (double)nb_nn_params_count(spec);
  nb_tree_destroy(spec);
  double flops = 6 * N * tokens + 12.0 * (double)(c.model.n_layers * c.model.n_heads * nb_model_head_dim(&c.model)) * T * tokens;
  double peak = nb_train_peak_flops_estimate(0);
  printf("%s B=%d T=%d, %d steps, checkpoint every %d (%.0f params, %.3g model FLOP/step, peak %.1f GFLOP/s)\n", preset, B,
         T, n, ck, N, flops, peak / 1e9);
  printf("| what | median ms/step | tokens/s | MFU |\n|---|---|---|---|\n");
  printf("| bare step (2 x %d runs, before and after) | %.1f | %.0f | %.2f%% |\n", n, bare_med, tokens / bare_med * 1e3,
         100 * flops / (bare_med * 1e-3) / peak);
  printf("| trainer: step executable | %.1f | %.0f | %.2f%% |\n", r.exe_ms_median, tokens / r.exe_ms_median * 1e3,
         100 * flops / (r.exe_ms_median * 1e-3) / peak);
  printf("| trainer: loop iteration (data + step + ckpt + metrics) | %.1f | %.0f | %.2f%% |\n", r.iter_ms_median,
         tokens / r.iter_ms_median * 1e3, 100 * flops / (r.iter_ms_median * 1e-3) / peak);
  printf("loop iteration / bare step = %.3f; whole nb_train_run %.1f s (set-up and compile included), data wait %.2f s, "
         "checkpoint calls %.2f s\n",
         r.iter_ms_median / bare_med, e2e_ms / 1e3, r.data_s, r.ckpt_s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  free(bare);
  nb_ctx_destroy(ctx);
  return 0;
}
