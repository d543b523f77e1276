/* `nabla sft`: supervised fine-tuning into a run directory, the trainer's
 * loop with the posttrain library's data, LoRA and frozen base.
 *   nabla sft CONFIG.yaml [--run-dir DIR] [--peak-gflops X] [--threads N] [key=value ...] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla sft CONFIG.yaml [--run-dir DIR] [--peak-gflops X] [--threads N] [key=value ...]\n"
    "  CONFIG      a run config (nabla train's keys) with sft.base (the run dir or checkpoint to start\n"
    "              from), data.train / data.eval (JSONL: {\"messages\": [...]} or {\"prompt\", \"completion\"}),\n"
    "              sft.chat_template, lora.target (a module-path regex; empty: full fine-tuning),\n"
    "              lora.rank/alpha/dropout/rslora/init, sft.quant_rules (QLoRA), lora.merge_at_end\n"
    "              (docs/posttrain.md)\n"
    "  --run-dir   where config.yaml, metrics.jsonl and checkpoints/ (the adapters) go (default\n"
    "              runs/<config name>); an existing run there is resumed\n"
    "  --threads N compute threads (default: $NABLA_THREADS, else all CPUs)\n"
    "  --peak-gflops  the peak FLOP/s that MFU is relative to\n"
    "  key=value   overrides: steps=100 lora.rank=16 lora.merge_at_end=true ...\n";

int nb_cmd_sft(int argc, char **argv) {
  nb_cli_train_args args;
  int prc = nb_cli_train_args_parse("sft", usage_text, NULL, argc, argv, &args);
  if (prc >= 0) return prc;
  if (!args.config) {
    nb_cli_train_args_free(&args);
    fprintf(stderr, "nabla sft: CONFIG is required\n");
    return nb_cli_usage(usage_text, false);
  }
  double peak = args.peak_flops;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return nb_cli_train_args_free(&args), 1;
  nb_train_config cfg;
  nb_pt_sft_config sft;
  nb_status s = nb_pt_sft_config_load(ctx, args.config, args.n_over, args.over, &sft, &cfg);
  nb_cli_train_args_free(&args);
  if (s) {
    fprintf(stderr, "nabla sft: %s\n", nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return 1;
  }
  char dir[1024];
  nb_cli_train_run_dir(&args, dir, sizeof dir);
  int threads = nb_cli_threads("sft", args.threads);
  if (!threads) return nb_ctx_destroy(ctx), 2;
  nb_cli_progress c = {0};
  nb_prof_peak pk; /* c.peak_source may point into it for the whole run */
  peak = nb_cli_progress_peak(&c, &pk, threads, peak);
  printf("nabla sft: run dir %s, config %s, base %s, %s, %d threads\n", dir, args.config, sft.base,
         sft.lora_target[0] ? (sft.quant_rules[0] ? "QLoRA" : "LoRA") : "full fine-tuning", threads);
  nb_train_opts o = {.run_dir = dir, .peak_flops = peak, .threads = threads, .handle_signals = true,
                     .on_start = nb_cli_progress_start, .on_step = nb_cli_progress_step, .ud = &c};
  nb_train_result r;
  s = nb_pt_sft_run(ctx, &sft, &cfg, &o, &r);
  int rc = 0;
  if (s) {
    fprintf(stderr, "nabla sft: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else if (r.preempted) {
    printf("interrupted: checkpoint at step %lld in %s/checkpoints; run the same command to resume\n",
           (long long)r.final_step, dir);
  } else {
    printf("done: step %lld, loss %.4f, held-out completion loss %.4f; step %.1f ms (median)\n", (long long)r.final_step,
           r.final_loss, r.last_eval_loss, r.exe_ms_median);
    if (sft.merge_at_end) printf("merged model: %s/merged\n", dir);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
