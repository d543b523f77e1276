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
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla dpo CONFIG.yaml [--run-dir DIR] [--threads N] [key=value ...]\n"
    "  CONFIG      a run config: nabla train's keys (data.train, data.eval: JSONL lines {\"prompt\", \"chosen\",\n"
    "              \"rejected\"}) and a pref: section (loss_type sigmoid|ipo|hinge|orpo, beta, label_smoothing,\n"
    "              orpo_lambda, base: the run dir or checkpoint to start from; docs/posttrain.md)\n"
    "  --run-dir   where config.yaml, metrics.jsonl and checkpoints/ go (default runs/<config name>); an\n"
    "              existing run there is resumed from its latest checkpoint\n"
    "  --threads N compute threads (default: $NABLA_THREADS, else all CPUs)\n"
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
  const char *config = NULL, *run_dir = NULL;
  int threads = 0;
  const char **over = calloc((size_t)argc + 1, sizeof *over), **pover = calloc((size_t)argc + 1, sizeof *pover);
  int n_over = 0, n_pover = 0;
  if (!over || !pover) return free(over), free(pover), 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_next = i + 1 < argc;
    int64_t t;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return free(over), free(pover), nb_cli_usage(usage_text, true);
    if (!strcmp(a, "--run-dir") && has_next) run_dir = argv[++i];
    else if (!strcmp(a, "--threads")) {
      if (!nb_cli_int("dpo", a, has_next ? argv[++i] : NULL, 1, 65536, &t)) return free(over), free(pover), 2;
      threads = (int)t;
    } else if (a[0] == '-') {
      fprintf(stderr, "nabla dpo: unknown or incomplete option '%s'\n", a);
      return free(over), free(pover), nb_cli_usage(usage_text, false);
    } else if (strchr(a, '=')) {
      if (!strncmp(a, "pref.", 5)) pover[n_pover++] = a;
      else over[n_over++] = a;
    } else if (!config) config = a;
    else {
      fprintf(stderr, "nabla dpo: a second config '%s' (overrides are key=value)\n", a);
      return free(over), free(pover), nb_cli_usage(usage_text, false);
    }
  }
  if (!config) {
    fprintf(stderr, "nabla dpo: a run config is required\n");
    return free(over), free(pover), nb_cli_usage(usage_text, false);
  }
  nb_ctx *ctx = nb_ctx_create();
  nb_train_config cfg;
  nb_pt_pref_config pc;
  nb_status s = ctx ? nb_train_config_load(ctx, config, n_over, over, &cfg) : NB_ERR_NOMEM;
  if (!s) s = nb_pt_pref_config_load(ctx, config, n_pover, pover, &pc);
  free(over);
  free(pover);
  if (s) {
    fprintf(stderr, "nabla dpo: %s\n", ctx ? nb_ctx_error(ctx) : "out of memory");
    nb_ctx_destroy(ctx);
    return 1;
  }
  char dir[1024];
  if (run_dir) snprintf(dir, sizeof dir, "%s", run_dir);
  else {
    const char *b = strrchr(config, '/') ? strrchr(config, '/') + 1 : config;
    snprintf(dir, sizeof dir, "runs/%.*s", (int)strcspn(b, "."), b);
  }
  const char *env_threads = getenv("NABLA_THREADS");
  int64_t t;
  if (threads <= 0 && env_threads && *env_threads) {
    if (!nb_cli_int("dpo", "$NABLA_THREADS", env_threads, 1, 65536, &t)) return nb_ctx_destroy(ctx), 2;
    threads = (int)t;
  }
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  printf("nabla dpo: run dir %s, config %s, loss %s (beta %g), base %s, %d threads\n", dir, config,
         nb_pt_pref_loss_name(pc.loss.loss_type), pc.loss.beta, pc.base[0] ? pc.base : "<fresh model>", threads);
  nb_train_opts o = {.run_dir = dir, .threads = threads, .handle_signals = true, .on_start = on_start,
                     .on_step = on_step};
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
