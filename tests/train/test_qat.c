/* quant.rules in a run config: QAT. The step and eval run the matched
 * linears fake-quantized (step 1's loss is the loss of PTQ's model of the
 * initial parameters, not the f32 model's), the run trains and checkpoints
 * f32 parameters, and a rules file that matches no linear, or a bad one, is
 * refused naming quant.rules. */
#include <math.h>
#include <signal.h>

#include "nabla/quant.h"
#include "train_util.h"

static char work[256];

static void run_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", work, name); }

static void write_rules(const char *path, const char *text) { nb_test_write_text(path, text); }

static void test_qat_run(nb_ctx *ctx) {
  char rules[600], override[700], d_plain[600], d_qat[600];
  snprintf(rules, sizeof rules, "%s/rules.yaml", work);
  write_rules(rules, "quant:\n  rules:\n    - {module_path: '.*/(attn|mlp)/.*', weight_qtype: int4, tile_size: 32}\n");
  snprintf(override, sizeof override, "quant.rules=%s", rules);
  const char *plain_over[] = {"steps=4", "eval_every=4"}, *qat_over[] = {"steps=4", "eval_every=4", override};
  nb_train_config plain, qat;
  CHECK_OK(ctx, tiny_config(ctx, work, 2, plain_over, &plain));
  CHECK_OK(ctx, tiny_config(ctx, work, 3, qat_over, &qat));
  run_dir(d_plain, sizeof d_plain, "plain");
  run_dir(d_qat, sizeof d_qat, "qat");
  recorder rp = {0}, rq = {0};
  nb_train_result resp, resq;
  CHECK_OK(ctx, run_recorded(ctx, &plain, d_plain, &rp, false, &resp));
  CHECK_OK(ctx, run_recorded(ctx, &qat, d_qat, &rq, false, &resq));
  /* step 1 is the loss at the initial parameters: fake quantization moved it */
  CHECK_MSG(isfinite(rq.loss[1]) && rq.loss[1] != rp.loss[1], "step 1: QAT loss %.7g, f32 loss %.7g", rq.loss[1], rp.loss[1]);
  CHECK_MSG(resq.final_step == 4 && isfinite(resq.last_eval_loss) && rq.loss[4] < rq.loss[1],
            "QAT run: step %lld, eval loss %g, loss %g -> %g", (long long)resq.final_step, resq.last_eval_loss, rq.loss[1], rq.loss[4]);
  fprintf(stderr, "step 1 loss: f32 %.6f, QAT int4 g32 %.6f; QAT after 4 steps %.6f, eval %.6f\n", rp.loss[1], rq.loss[1],
          rq.loss[4], resq.last_eval_loss);
  /* config.yaml keeps quant.rules, so a resume trains the same way */
  char p[700];
  snprintf(p, sizeof p, "%s/config.yaml", d_qat);
  char *text = nb_test_read_file(p, NULL);
  CHECK_MSG(text && strstr(text, rules), "config.yaml lacks quant.rules");
  free(text);

  /* refused: a file with no rule matching a linear, a missing file */
  write_rules(rules, "quant:\n  rules:\n    - {module_path: 'nothing', weight_qtype: int8}\n");
  run_dir(d_qat, sizeof d_qat, "qat_nomatch");
  recorder r2 = {0};
  CHECK(run_recorded(ctx, &qat, d_qat, &r2, false, &resq) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "quant.rules: no rule of");
  snprintf(qat.quant.rules, sizeof qat.quant.rules, "%s/missing.yaml", work);
  run_dir(d_qat, sizeof d_qat, "qat_missing");
  CHECK(run_recorded(ctx, &qat, d_qat, &r2, false, &resq) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_IO, "quant.rules");
}

int main(void) {
  make_workdir(work, sizeof work);
  nb_ctx *ctx = nb_ctx_create();
  test_qat_run(ctx);
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(work);
  return nb_test_summary("train/test_qat");
}
