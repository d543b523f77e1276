/* `nabla eval` and `nabla quantize --calibrate` on a run `nabla train` makes
 * here (a 1-layer GPT on a made-up text): eval's nll over the first eval
 * windows is the trainer's own eval loss on them; a rules file with
 * int8_static activations needs --calibrate, which records each linear's
 * act_scale and observed range (ckpt show), and the calibrated run dir
 * evaluates close to the f32 model; bad arguments are refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "testfs.h"

static const char *bin;
static char out[1 << 17], err[1 << 16], work[4096];

/* runs "nabla ARGS" (printf-formatted) in work; stdout in out, stderr in err */
#define nabla(...) nb_test_run_in(work, bin, out, sizeof out, err, sizeof err, __VA_ARGS__)

static void write_text(const char *name, int lines, uint64_t seed) {
  static const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "big", "house"};
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", work, name);
  FILE *f = fopen(p, "w");
  CHECK(f);
  if (!f) return;
  for (int line = 0; line < lines; line++) {
    for (int i = 0; i < 4 + line % 5; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      fprintf(f, "%s%s", i ? " " : "", w[(seed >> 33) % 13]);
    }
    fputs(".\n", f);
  }
  fclose(f);
}

/* "nll X nats/token" of eval's output, NAN when absent */
static double nll_of(const char *text) {
  const char *p = strstr(text, "\nnll ");
  return p ? strtod(p + 5, NULL) : NAN;
}

int main(void) {
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/eval_calib");
  nb_test_scratch_dir(work, sizeof work, "cli", "eval_calib");
  write_text("train.txt", 600, 1), write_text("heldout.txt", 60, 2);
  int rc = nabla("train --run-dir run --threads 1 data.train=train.txt data.eval=heldout.txt model.preset=gpt2-tiny "
                 "model.n_layers=1 model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=16 "
                 "data.seq_len=16 batch_size=4 steps=6 eval_every=6 eval_steps=2 log_every=3 checkpoint_every=6");
  CHECK_MSG(rc == 0, "train: rc %d: %s", rc, err);
  /* the trainer's eval: eval_steps 2 x batch_size 4 = the first 8 windows of 16 + 1 tokens */
  char p[4200];
  snprintf(p, sizeof p, "%s/run/metrics.jsonl", work);
  char *m = nb_test_read_file(p, NULL), *e = m ? strstr(m, "\"eval_loss\":") : NULL;
  double trainer = e ? strtod(e + strlen("\"eval_loss\":"), NULL) : NAN;
  free(m);
  rc = nabla("eval run --data heldout.txt --seq-len 16 --max-windows 8 --batch 3 --threads 1");
  double f32 = nll_of(out);
  CHECK_MSG(rc == 0 && fabs(f32 - trainer) <= 1e-5 * trainer, "eval: rc %d, nll %.7g, trainer's eval loss %.7g: %s", rc, f32, trainer, err);
  fprintf(stderr, "nabla eval %.7g, the trainer's eval loss %.7g\n", f32, trainer);

  /* int8_static activations: calibrated from text, recorded, evaluated */
  snprintf(p, sizeof p, "%s/static.yaml", work);
  nb_test_write_text(p, "quant:\n  rules:\n    - {module_path: '.*', weight_qtype: int8, act_qtype: int8_static, act_calibration: 'rms,4'}\n");
  rc = nabla("quantize run --rules static.yaml -o nocal");
  CHECK_MSG(rc != 0 && strstr(err, "'layers/0/attn/wq' has int8_static activations calibrated from data: give --calibrate"), "rc %d: %s",
            rc, err);
  rc = nabla("quantize run --rules static.yaml --calibrate train.txt --calib-batches 2 -o cal");
  CHECK_MSG(rc == 0, "quantize --calibrate: rc %d: %s", rc, err);
  rc = nabla("ckpt show cal/checkpoints");
  CHECK_MSG(rc == 0 && strstr(out, "\"act_ranges\":{\"params/layers/0/attn/wq/kernel\":{\"min\":") &&
                strstr(out, "\"calibration\":{\"data\":\"train.txt\",\"batches\":2,\"windows\":16,\"seq_len\":16}") &&
                strstr(out, "kernel/act_scale") && strstr(out, "int8 static activations"),
            "ckpt show: rc %d: %.2000s", rc, out);
  rc = nabla("eval cal --data heldout.txt --seq-len 16 --max-windows 8 --threads 1");
  double cal = nll_of(out);
  CHECK_MSG(rc == 0 && cal != f32 && fabs(cal - f32) < 0.05, "calibrated model: rc %d, nll %.7g (f32 %.7g): %s", rc, cal, f32, err);
  fprintf(stderr, "W8A8 static (rms,4) nll %.7g, f32 %.7g\n", cal, f32);

  /* refused by name */
  rc = nabla("eval run");
  CHECK_MSG(rc == 2 && strstr(err, "--data are required"), "rc %d: %s", rc, err);
  rc = nabla("eval run --data heldout.txt --seq-len 17");
  CHECK_MSG(rc == 1 && strstr(err, "--seq-len 17 exceeds the model's max_seq_len 16"), "rc %d: %s", rc, err);
  rc = nabla("eval run --data missing.txt");
  CHECK_MSG(rc == 1 && strstr(err, "missing.txt: cannot open"), "rc %d: %s", rc, err);
  rc = nabla("quantize run --calibrate train.txt --format gguf -o x.gguf");
  CHECK_MSG(rc == 2 && strstr(err, "--calibrate goes with --rules"), "rc %d: %s", rc, err);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("cli/eval_calib");
}
