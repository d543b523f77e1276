/* `nabla dpo`: preference optimization (DPO sigmoid/cDPO, IPO, hinge, ORPO)
 * of a trained model on JSONL pairs, into a run directory.
 *   nabla dpo CONFIG.yaml [--run-dir DIR] [--threads N] [key=value ...]
 * CONFIG is a run config (nabla train's keys; data.train / data.eval are
 * JSONL pairs) with a pref: section (nabla/posttrain.h); pref.<key>=value
 * overrides go to that section, the others to the trainer. The loop, run
 * dir and resume are nb_train_run's (through nb_pt_pref_run). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla dpo CONFIG.yaml [--run-dir DIR] [--threads N] [--peak-gflops X] [key=value ...]\n"
    "  CONFIG      a run config: nabla train's keys (data.train, data.eval: JSONL lines {\"prompt\", \"chosen\",\n"
    "              \"rejected\"}) and a pref: section (loss_type sigmoid|ipo|hinge|orpo, beta, label_smoothing,\n"
    "              orpo_lambda, base: the run dir or checkpoint to start from; docs/posttrain.md)\n"
    "  --run-dir   where config.yaml, metrics.jsonl and checkpoints/ go (default runs/<config name>); an\n"
    "              existing run there is resumed from its latest checkpoint\n"
    "  --threads N compute threads (default: $NABLA_THREADS, else all CPUs)\n"
    "  --peak-gflops  the peak FLOP/s that MFU is relative to\n"
    "  key=value   overrides: pref.beta=0.2 pref.loss_type=ipo steps=100 optim.lr=1e-5 ...\n";

static void on_start(void *ud, const nb_train_start_info *in) {
  if (in->start_step > 0) printf("resumed from the checkpoint at step %lld\n", (long long)in->start_step);
  printf("model: %lld parameters; %lld train pairs, %lld eval pairs; compiled in %.1f s; steps %lld..%lld\n",
         (long long)in->n_params, (long long)in->train_windows, (long long)in->eval_windows, in->compile_s,
         (long long)in->start_step + 1, (long long)in->total_steps);
  fflush(stdout);
}

static double metric(const nb_tree *m, const char *name) {
  nb_array *a = m ? nb_tree_get_array(m, name) : NULL;
  return a ? nb_array_get(a, 0) : NAN;
}

static void on_step(void *ud, const nb_train_step_info *si) {
  if (si->logged)
    printf("step %6lld/%lld loss %.4f  lr %.2e  gnorm %.3f | rewards chosen %+.4f rejected %+.4f  accuracy %.3f  "
           "margin %+.4f | %.1f s\n",
           (long long)si->step, (long long)si->total_steps, si->loss, si->lr, si->grad_norm,
           metric(si->metrics, "rewards/chosen"), metric(si->metrics, "rewards/rejected"),
           metric(si->metrics, "rewards/accuracies"), metric(si->metrics, "rewards/margins"), si->elapsed_s);
  if (si->has_eval)
    printf("eval  %6lld  eval_loss %.4f  accuracy %.3f  margin %+.4f\n", (long long)si->step, si->eval_loss,
           metric(si->metrics, "eval_rewards/accuracies"), metric(si->metrics, "eval_rewards/margins"));
  fflush(stdout);
}

int nb_cmd_dpo(int argc, char **argv) {
  nb_cli_train_args args;
  int prc = nb_cli_train_args_parse("dpo", usage_text, "pref.", argc, argv, &args);
  if (prc >= 0) return prc;
  if (!args.config) {
    nb_cli_train_args_free(&args);
    fprintf(stderr, "nabla dpo: a run config is required\n");
    return nb_cli_usage(usage_text, false);
  }
  const char *config = args.config;
  nb_ctx *ctx = nb_ctx_create();
  nb_train_config cfg;
  nb_pt_pref_config pc;
  nb_status s = ctx ? nb_train_config_load(ctx, config, args.n_over, args.over, &cfg) : NB_ERR_NOMEM;
  if (!s) s = nb_pt_pref_config_load(ctx, config, args.n_sec_over, args.sec_over, &pc);
  nb_cli_train_args_free(&args);
  if (s) {
    fprintf(stderr, "nabla dpo: %s\n", ctx ? nb_ctx_error(ctx) : "out of memory");
    nb_ctx_destroy(ctx);
    return 1;
  }
  char dir[1024];
  nb_cli_train_run_dir(&args, dir, sizeof dir);
  int threads = nb_cli_threads("dpo", args.threads);
  if (!threads) return nb_ctx_destroy(ctx), 2;
  printf("nabla dpo: run dir %s, config %s, loss %s (beta %g), base %s, %d threads\n", dir, config,
         nb_pt_pref_loss_name(pc.loss.loss_type), pc.loss.beta, pc.base[0] ? pc.base : "<fresh model>", threads);
  nb_train_opts o = {.run_dir = dir, .peak_flops = args.peak_flops, .threads = threads, .handle_signals = true,
                     .on_start = on_start, .on_step = on_step};
  nb_train_result r;
  s = nb_pt_pref_run(ctx, &cfg, &pc, &o, &r);
  int rc = 0;
  if (s) {
    fprintf(stderr, "nabla dpo: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else if (r.preempted) {
    printf("interrupted: checkpoint at step %lld in %s/checkpoints; run the same command to resume\n",
           (long long)r.final_step, dir);
  } else {
    printf("done: step %lld, loss %.4f, eval loss %.4f; step %.1f ms (median)\n", (long long)r.final_step, r.final_loss,
           r.last_eval_loss, r.exe_ms_median);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
