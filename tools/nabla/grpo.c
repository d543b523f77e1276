/* `nabla grpo`: GRPO of a trained model on JSONL prompts with built-in
 * rewards, rollouts through the serve engine, into a run directory.
 *   nabla grpo CONFIG.yaml [--run-dir DIR] [--peak-gflops X] [--threads N] [key=value ...] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla grpo CONFIG.yaml [--run-dir DIR] [--peak-gflops X] [--threads N] [key=value ...]\n"
    "  CONFIG      a run config (nabla train's keys) with grpo.base (or init_from=: the model to start\n"
    "              from), data.train / data.eval (JSONL: {\"prompt\": ..., <fields the rewards read>}),\n"
    "              batch_size (prompts per step), grpo.num_generations, grpo.max_completion_length,\n"
    "              grpo.loss_type, grpo.beta, grpo.rewards (a list: {kind: exact|format|length, ...}),\n"
    "              lora.target (a module-path regex: LoRA; empty: full fine-tuning), lora.rank/alpha/...\n"
    "              (docs/posttrain.md)\n"
    "  --run-dir   where config.yaml, metrics.jsonl and checkpoints/ go (default runs/<config name>);\n"
    "              an existing run there is resumed\n"
    "  --threads N compute threads (default: $NABLA_THREADS, else all CPUs)\n"
    "  --peak-gflops  the peak FLOP/s that MFU is relative to\n"
    "  key=value   overrides: steps=100 grpo.beta=0.04 grpo.rewards.0.weight=2 ...\n";

/* the trainer's progress line, then the rollout's reward (and the held-out reward at an eval) */
static void on_step(void *ud, const nb_train_step_info *si) {
  nb_cli_progress_step(ud, si);
  if (!si->metrics) return;
  const nb_array *r = nb_tree_get_array(si->metrics, "reward"), *l = nb_tree_get_array(si->metrics, "completion_length");
  const nb_array *e = nb_tree_get_array(si->metrics, "eval_reward");
  if (si->logged && r && l) printf("      reward %.4f  completion length %.2f\n", nb_array_get(r, 0), nb_array_get(l, 0));
  if (e) printf("      held-out reward %.4f\n", nb_array_get(e, 0));
  fflush(stdout);
}

int nb_cmd_grpo(int argc, char **argv) {
  nb_cli_train_args args;
  int prc = nb_cli_train_args_parse("grpo", usage_text, NULL, argc, argv, &args);
  if (prc >= 0) return prc;
  if (!args.config) {
    nb_cli_train_args_free(&args);
    fprintf(stderr, "nabla grpo: CONFIG is required\n");
    return nb_cli_usage(usage_text, false);
  }
  double peak = args.peak_flops;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return nb_cli_train_args_free(&args), 1;
  nb_train_config cfg;
  nb_pt_grpo_config gc;
  nb_status s = nb_pt_grpo_config_load(ctx, args.config, args.n_over, args.over, &gc, &cfg);
  nb_cli_train_args_free(&args);
  if (s) {
    fprintf(stderr, "nabla grpo: %s\n", nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return 1;
  }
  char dir[1024];
  nb_cli_train_run_dir(&args, dir, sizeof dir);
  int threads = nb_cli_threads("grpo", args.threads);
  if (!threads) return nb_ctx_destroy(ctx), 2;
  nb_cli_progress c = {0};
  nb_prof_peak pk; /* c.peak_source may point into it for the whole run */
  peak = nb_cli_progress_peak(&c, &pk, threads, peak);
  printf("nabla grpo: run dir %s, config %s, base %s, %s, %lld prompts x %lld completions per step, %s loss, %d threads\n", dir,
         args.config, gc.base[0] ? gc.base : "(a fresh model)", gc.lora_target[0] ? "LoRA" : "full fine-tuning",
         (long long)cfg.batch_size, (long long)gc.num_generations, nb_pt_grpo_loss_name(gc.loss.loss_type), threads);
  nb_train_opts o = {.run_dir = dir, .peak_flops = peak, .threads = threads, .handle_signals = true,
                     .on_start = nb_cli_progress_start, .on_step = on_step, .ud = &c};
  nb_train_result r;
  nb_pt_grpo_stats st;
  s = nb_pt_grpo_run(ctx, &gc, &cfg, &o, NULL, &r, &st);
  int rc = 0;
  if (s) {
    fprintf(stderr, "nabla grpo: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else if (r.preempted) {
    printf("interrupted: checkpoint at step %lld in %s/checkpoints; run the same command to resume\n",
           (long long)r.final_step, dir);
  } else {
    printf("done: step %lld, loss %.4f, held-out reward %.4f; step %.1f ms (median, rollout included)\n", (long long)r.final_step,
           r.final_loss, -r.last_eval_loss, r.iter_ms_median);
    double run_s = st.rollout_s - st.compile_s;
    printf("rollouts: %lld completion tokens in %.2f s (%.2f s of it compiling the engine's steps): %.0f tokens/s; "
           "weights handed to the engine %lld times, %.3f ms each (%s)\n",
           (long long)st.rollout_tokens, st.rollout_s, st.compile_s, run_s > 0 ? (double)st.rollout_tokens / run_s : 0.0,
           (long long)st.syncs, st.syncs ? 1e3 * st.sync_s / (double)st.syncs : 0.0,
           st.merged ? "the adapters merged into a copy of the adapted kernels" : "the trainer's arrays, no copy");
  }
  nb_ctx_destroy(ctx);
  return rc;
}
