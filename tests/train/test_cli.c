/* `nabla train`: a bad key and a missing data file give a named error and a
 * non-zero exit; a run writes config.yaml (loading back to the same config)
 * and a well-formed metrics.jsonl; a SIGTERM'd child checkpoints and exits
 * 0, and the same command resumes it to the losses of an uninterrupted run. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "train_util.h"

static char work[256], tiny[2048];

/* The tiny config of train_util.h as command-line overrides, with a
 * constant learning rate so the total step count does not change the run. */
static void make_tiny_args(void) {
  snprintf(tiny, sizeof tiny,
           "data.train=%s/corpus.txt model.preset=gpt2-tiny model.n_layers=1 model.d_model=32 model.n_heads=2 "
           "model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=16 data.seq_len=16 batch_size=4 log_every=1 "
           "eval_every=0 schedule.kind=constant schedule.warmup_steps=0 optim.lr=3e-3 --threads 1",
           work);
}

/* Records of metrics.jsonl: losses by step (as printed), count of train
 * records; every line must be a JSON object with the schema's fields. */
static int read_metrics(const char *dir, char loss[][40], int cap) {
  char p[600], line[4096];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  FILE *f = fopen(p, "r");
  int n = 0, expect = 1;
  while (f && fgets(line, sizeof line, f)) {
    cJSON *j = cJSON_Parse(line);
    CHECK_MSG(cJSON_IsObject(j), "not a JSON object: %s", line);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    if (cJSON_IsObject(j) && !cJSON_GetObjectItemCaseSensitive(j, "eval_loss")) {
      const char *keys[] = {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "elapsed_s"};
      for (int k = 0; k < 6; k++) CHECK_MSG(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, keys[k])), "%s lacks %s", line, keys[k]);
      CHECK_MSG(cJSON_IsNumber(st) && st->valueint == expect, "step %d expected: %s", expect, line);
      const char *l = strstr(line, "\"loss\":");
      if (l && expect <= cap) snprintf(loss[expect], 40, "%.*s", (int)strcspn(l + 7, ","), l + 7);
      expect++;
      n++;
    }
    cJSON_Delete(j);
  }
  if (f) fclose(f);
  return n;
}

static bool file_lines_at_least(const char *path, int n) {
  FILE *f = fopen(path, "r");
  int c, lines = 0;
  while (f && (c = fgetc(f)) != EOF) lines += c == '\n';
  if (f) fclose(f);
  return lines >= n;
}

static void test_errors(const char *bin) {
  static char out[1 << 16];
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s/bad model.n_layer=2 2>&1", bin, work);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  CHECK_MSG(strstr(out, "unknown key 'model.n_layer'"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s/bad data.train=%s/missing.txt 2>&1", bin, work, work);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  CHECK_MSG(strstr(out, "data.train") && strstr(out, "missing.txt"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s train --bogus 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0 && strstr(out, "usage: nabla train"));
}

static void test_run_and_sigterm(nb_ctx *ctx, const char *bin) {
  static char out[1 << 16];
  char cmd[4096], ref[600], sig[600];
  snprintf(ref, sizeof ref, "%s/ref", work);
  snprintf(sig, sizeof sig, "%s/sig", work);
  /* the uninterrupted reference, 200 steps */
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=200 2>&1", bin, ref, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0, "%s", out);
  CHECK_MSG(strstr(out, "unigram entropy") && strstr(out, "MFU") && strstr(out, "done: step 200"), "%s", out);
  static char lref[256][40], lsig[256][40];
  CHECK(read_metrics(ref, lref, 255) == 200);
  /* TensorBoard events and the report */
  snprintf(cmd, sizeof cmd, "ls %s/events.out.tfevents.* >/dev/null && grep -q 'train/loss' %s/events.out.tfevents.* && "
           "grep -q '<svg' %s/report.html", ref, ref, ref);
  CHECK_MSG(system(cmd) == 0, "%s", cmd);
  nb_train_config back;
  snprintf(cmd, sizeof cmd, "%s/config.yaml", ref);
  CHECK_OK(ctx, nb_train_config_load(ctx, cmd, 0, NULL, &back));
  CHECK(back.steps == 200 && back.model.d_model == 32 && back.schedule.kind == NB_TRAIN_SCHEDULE_CONSTANT);

  /* a long run in a child, SIGTERM'd once it has logged 3 steps */
  pid_t pid = fork();
  if (pid == 0) {
    snprintf(cmd, sizeof cmd, "exec %s train --run-dir %s %s steps=100000 checkpoint_every=0 >%s.log 2>&1", bin, sig,
             tiny, sig);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  char mp[700];
  snprintf(mp, sizeof mp, "%s/metrics.jsonl", sig);
  time_t t0 = time(NULL);
  while (!file_lines_at_least(mp, 3) && time(NULL) - t0 < 300) usleep(2000);
  CHECK(kill(pid, SIGTERM) == 0);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  int k = read_metrics(sig, lsig, 255);
  snprintf(cmd, sizeof cmd, "%s/checkpoints", sig);
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = cmd, .read_only = true});
  int64_t latest = -1;
  if (m) nb_ckpt_latest_step(m, &latest);
  nb_ckpt_manager_destroy(m);
  CHECK_MSG(latest >= 3 && latest == k && latest < 200, "checkpoint %lld, %d records", (long long)latest, k);
  printf("SIGTERM after %d logged steps: checkpoint at step %lld\n", k, (long long)latest);
  /* the same command (but 200 steps) resumes */
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=200 2>&1", bin, sig, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "resumed from the checkpoint"), "%s", out);
  CHECK(read_metrics(sig, lsig, 255) == 200);
  for (int s = 1; s <= 200; s++) CHECK_MSG(!strcmp(lref[s], lsig[s]), "step %d: loss %s vs %s", s, lref[s], lsig[s]);
}

/* A diverging run exits non-zero saying so; a refused resume prints its
 * cause once and leaves config.yaml as it was. */
static void test_divergence_and_refusal(const char *bin) {
  static char out[1 << 16];
  char cmd[4096], d[600], cfg[700];
  snprintf(d, sizeof d, "%s/nan", work);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=20 optim.lr=100 optim.grad_clip=0 2>&1", bin, d, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) != 0, "a diverging run exited 0: %s", out);
  CHECK_MSG(strstr(out, "not finite") && !strstr(out, "done:"), "%s", out);
  snprintf(d, sizeof d, "%s/refuse", work);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=2 2>&1", bin, d, tiny);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0, "%s", out);
  snprintf(cmd, sizeof cmd, "%s train --run-dir %s %s steps=4 model.d_model=64 2>&1", bin, d, tiny);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  const char *first = strstr(out, "restoring step 2");
  CHECK_MSG(first && !strstr(first + 1, "restoring step 2") && strstr(out, "target wants f32[256,64]"), "%s", out);
  snprintf(cfg, sizeof cfg, "%s/config.yaml", d);
  char *y = nb_test_read_file(cfg, NULL);
  CHECK_MSG(y && strstr(y, "d_model: 32") && strstr(y, "steps: 2"), "config.yaml changed by a refused run");
  free(y);
}

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("train/cli");
  make_workdir(work, sizeof work);
  make_tiny_args();
  nb_ctx *ctx = nb_ctx_create();
  test_errors(bin);
  test_divergence_and_refusal(bin);
  test_run_and_sigterm(ctx, bin);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("train/cli");
}
