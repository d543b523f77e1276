/* nabla grpo end to end on a tiny model (byte level, llama, 2 layers, d 64):
 *  - a base pretrained by nb_train_run on lines "abc=cba" (the reversal)
 *    and "abc=abc" (the copy), half and half, so that it answers a prompt
 *    "abc=" either way;
 *  - GRPO (nb_pt_grpo_run, base = that run dir) with the exact-match reward
 *    of the reversal (the row's "answer"): on 64 held-out prompts (words the
 *    base never saw) the greedy exact-match rate before (the eval at step 0)
 *    and after 30 steps, printed; after must be clearly higher;
 *  - the run-dir contract: config.yaml with the grpo: section (loads back
 *    for the trainer and the grpo config), metrics.jsonl with reward,
 *    reward_std, completion_length, kl, clip ratios and the held-out
 *    eval_reward, TensorBoard events, report.html;
 *  - LoRA (r 8 on every linear) the same way, checkpoints of the adapters;
 *  - with beta > 0 (the reference in the step): a stop at step 4 and a
 *    resume to 8 give the losses and parameters of an uninterrupted run
 *    bit for bit (the rollouts are seeded by the step);
 *  - `nabla grpo` refuses a bad grpo key by name. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "primcheck.h"
#include "testfs.h"
#include "testrun.h"
#include "nabla/posttrain.h"

static char dir[512];
static uint64_t lcg = 20261128;

static int rnd(int n) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (int)((lcg >> 33) % (uint64_t)n);
}

static void word(char w[4]) {
  for (int i = 0; i < 3; i++) w[i] = (char)('a' + rnd(8));
  w[3] = 0;
}

/* held-out words: 64 of the 512 drawn at random (write_data), never seen by the base */
static bool held_set[512];
static bool held(const char w[4]) { return held_set[(w[0] - 'a') * 64 + (w[1] - 'a') * 8 + (w[2] - 'a')]; }

static void write_data(void) {
  char path[600], w[4];
  for (int n = 0; n < 64;) {
    int k = rnd(512);
    if (!held_set[k]) held_set[k] = true, n++;
  }
  snprintf(path, sizeof path, "%s/lm.txt", dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; i < 20000; i++) {
    do word(w); while (held(w));
    if (rnd(2)) fprintf(f, "%s=%c%c%c\n", w, w[2], w[1], w[0]);
    else fprintf(f, "%s=%s\n", w, w);
  }
  fclose(f);
  snprintf(path, sizeof path, "%s/train.jsonl", dir);
  f = fopen(path, "w");
  for (int i = 0; i < 1000; i++) {
    do word(w); while (held(w));
    fprintf(f, "{\"prompt\": \"\\n%s=\", \"answer\": \"%c%c%c\"}\n", w, w[2], w[1], w[0]);
  }
  fclose(f);
  snprintf(path, sizeof path, "%s/eval.jsonl", dir);
  f = fopen(path, "w");
  for (int k = 0; k < 512; k++) {
    char x[4] = {(char)('a' + k / 64), (char)('a' + k / 8 % 8), (char)('a' + k % 8), 0};
    if (held(x)) fprintf(f, "{\"prompt\": \"\\n%s=\", \"answer\": \"%c%c%c\"}\n", x, x[2], x[1], x[0]);
  }
  fclose(f);
}

static const char base_yaml[] =
    "model:\n  preset: llama-tiny\n  vocab_size: 256\n  d_model: 64\n  n_layers: 2\n  n_heads: 4\n  n_kv_heads: 4\n"
    "  d_ff: 128\n  max_seq_len: 32\n"
    "optim:\n  lr: 3.0e-3\n  weight_decay: 0\nschedule:\n  kind: cosine\n  warmup_steps: 20\n"
    "batch_size: 32\nsteps: 600\neval_every: 0\nlog_every: 100\ncheckpoint_every: 0\n";

static const char grpo_yaml[] =
    "optim:\n  lr: 1.0e-4\n  weight_decay: 0\nschedule:\n  kind: constant\n  warmup_steps: 0\n"
    "batch_size: 8\nlog_every: 1\ncheckpoint_every: 0\n"
    "grpo:\n  num_generations: 8\n  max_completion_length: 5\n  stop_token_id: 10\n  loss_type: dapo\n"
    "  eval_prompts: 64\n  rewards:\n    - {kind: exact, pattern: '^([a-h]+)', field: answer}\n";

static bool stop_at_4(void *ud, int64_t step) { return step == 4; }

static nb_status grpo(nb_ctx *ctx, const char *run, int64_t steps, bool stop, const char *extra_override) {
  char path[700], data[700], eval[700], base[700], st[64], rd[700];
  snprintf(path, sizeof path, "%s/grpo.yaml", dir);
  nb_test_write_text(path, grpo_yaml);
  snprintf(data, sizeof data, "data.train=%s/train.jsonl", dir);
  snprintf(eval, sizeof eval, "data.eval=%s/eval.jsonl", dir);
  snprintf(base, sizeof base, "grpo.base=%s/base", dir);
  snprintf(st, sizeof st, "steps=%lld", (long long)steps);
  bool lora = extra_override && !strncmp(extra_override, "lora.", 5);
  const char *ov[8] = {data, eval, base, st, "data.seq_len=10", "eval_every=10", extra_override, "optim.lr=1e-3"};
  nb_pt_grpo_config gc;
  nb_train_config c;
  nb_status s = nb_pt_grpo_config_load(ctx, path, extra_override ? 7 + lora : 6, ov, &gc, &c);
  snprintf(rd, sizeof rd, "%s/%s", dir, run);
  nb_train_opts o = {.run_dir = rd, .threads = 2, .should_stop = stop ? stop_at_4 : NULL};
  if (!s) s = nb_pt_grpo_run(ctx, &gc, &c, &o, NULL, NULL, NULL);
  return s;
}

/* the value of "key": in the record of metrics.jsonl that has it at step `step` (NaN: none) */
static double metric(const char *run, int64_t step, const char *key) {
  char path[700], pat[64], k[96];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, run);
  snprintf(pat, sizeof pat, "{\"step\":%lld,", (long long)step);
  snprintf(k, sizeof k, "\"%s\":", key);
  char *t = nb_test_read_file(path, NULL);
  double v = NAN;
  for (char *line = t; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    char *end = strchr(line, '\n'), *at;
    if (strncmp(line, pat, strlen(pat))) continue;
    if ((at = strstr(line, k)) && (!end || at < end)) v = strtod(at + strlen(k), NULL);
  }
  free(t);
  return v;
}

/* run dirs below this test's scratch dir (tests/lib/testrun.h) */
static void losses(const char *run, char *out, size_t cap) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, run);
  nb_test_run_losses(path, out, cap);
}

static bool same_params(nb_ctx *ctx, const char *a, const char *b) {
  char pa[700], pb[700];
  snprintf(pa, sizeof pa, "%s/%s", dir, a);
  snprintf(pb, sizeof pb, "%s/%s", dir, b);
  return nb_test_run_same_params(ctx, pa, pb);
}

int main(void) {
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "grpo");
  write_data();
  nb_ctx *ctx = nb_ctx_create();
  char text[2048], path[700];
  snprintf(text, sizeof text, "%sdata:\n  train: %s/lm.txt\n  seq_len: 32\n  workers: 0\n", base_yaml, dir);
  nb_train_config base;
  CHECK_OK(ctx, nb_train_config_parse(ctx, "base", text, strlen(text), 0, NULL, &base));
  snprintf(path, sizeof path, "%s/base", dir);
  nb_train_opts bo = {.run_dir = path, .threads = 2};
  nb_train_result br;
  CHECK_OK(ctx, nb_train_run(ctx, &base, &bo, &br));
  printf("base: %lld steps, loss %.4f (reverse or copy half and half: about 0.87 at best)\n", (long long)br.final_step, br.final_loss);

  /* GRPO from the base: the demonstration */
  CHECK_OK(ctx, grpo(ctx, "grpo", 30, false, NULL));
  /* the serve kernels' registry lives as long as the context: later runs must add nothing */
  size_t after_first = nb_ctx_bytes_in_use(ctx);
  double before = metric("grpo", 0, "eval_reward"), after = metric("grpo", 30, "eval_reward");
  printf("held-out exact match (64 prompts, greedy): %.3f before, %.3f after 30 GRPO steps; eval_reward at 0/10/20/30: "
         "%.3f %.3f %.3f %.3f\n", before, after, before, metric("grpo", 10, "eval_reward"), metric("grpo", 20, "eval_reward"), after);
  CHECK_MSG(after >= 0.8 && after >= before + 0.2, "GRPO did not raise the held-out exact match enough: %.3f -> %.3f", before, after);
  const char *keys[] = {"reward", "reward_std", "completion_length", "stopped", "rewards/exact", "clip_ratio/region_mean"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    CHECK_MSG(isfinite(metric("grpo", 30, keys[i])), "metrics.jsonl: no %s at step 30", keys[i]);
  CHECK(isfinite(metric("grpo", 30, "eval_rewards/exact")) && isfinite(metric("grpo", 0, "eval_completion_length")));

  /* the run dir */
  snprintf(path, sizeof path, "%s/grpo/config.yaml", dir);
  char *cy = nb_test_read_file(path, NULL);
  CHECK(cy && strstr(cy, "\ngrpo:\n") && strstr(cy, "  loss_type: dapo\n") && strstr(cy, "    - kind: exact\n"));
  free(cy);
  nb_train_config back;
  nb_pt_grpo_config gback;
  CHECK_OK(ctx, nb_train_config_load(ctx, path, 0, NULL, &back));
  CHECK_OK(ctx, nb_pt_grpo_config_load(ctx, path, 0, NULL, &gback, &back));
  CHECK(gback.num_generations == 8 && gback.n_rewards == 1 && !strcmp(gback.rewards[0].pattern, "^([a-h]+)"));
  snprintf(path, sizeof path, "%s/grpo/report.html", dir);
  char *rep = nb_test_read_file(path, NULL); /* the reward curves are drawn */
  CHECK(rep && strstr(rep, "<figcaption>eval_reward</figcaption>") && strstr(rep, "<figcaption>reward</figcaption>"));
  free(rep);
  snprintf(path, sizeof path, "%s/grpo", dir);
  DIR *d = opendir(path);
  bool events = false;
  for (struct dirent *e; d && (e = readdir(d));) events |= !strncmp(e->d_name, "events.out.tfevents.", 20);
  if (d) closedir(d);
  CHECK(events);

  /* LoRA on every linear (the base frozen, the engine fed the merged weights): the held-out rate rises too,
   * and checkpoints hold the adapters only */
  CHECK_OK(ctx, grpo(ctx, "lora", 30, false, "lora.target=.*attn/w[qkvo]|.*mlp/w.*"));
  double lb0 = metric("lora", 0, "eval_reward"), lb1 = metric("lora", 30, "eval_reward");
  printf("LoRA r 8: held-out exact match %.3f -> %.3f after 30 steps (lr 1e-3)\n", lb0, lb1);
  CHECK_MSG(lb1 >= 0.8 && lb1 >= lb0 + 0.2, "GRPO with LoRA did not raise the held-out exact match enough: %.3f -> %.3f", lb0, lb1);
  snprintf(path, sizeof path, "%s/lora/checkpoints/step_00000030", dir);
  CHECK_MSG(access(path, F_OK) == 0, "no %s", path);
  snprintf(path, sizeof path, "%s/lora/config.yaml", dir);
  cy = nb_test_read_file(path, NULL);
  CHECK(cy && strstr(cy, "\nlora:\n  target: \".*attn/w[qkvo]|.*mlp/w.*\"\n"));
  free(cy);

  /* with the reference (beta > 0): stop at 4, resume to 8 == uninterrupted */
  CHECK_OK(ctx, grpo(ctx, "kl", 8, false, "grpo.beta=0.04"));
  CHECK_OK(ctx, grpo(ctx, "split", 8, true, "grpo.beta=0.04"));
  CHECK_OK(ctx, grpo(ctx, "split", 8, false, "grpo.beta=0.04"));
  CHECK(isfinite(metric("kl", 8, "kl")) && metric("kl", 8, "kl") > 0);
  char la[8192], lb[8192];
  losses("kl", la, sizeof la);
  losses("split", lb, sizeof lb);
  CHECK_MSG(la[0] && !strcmp(la, lb), "losses differ after a resume:\n%s\n%s", la, lb);
  CHECK_MSG(same_params(ctx, "kl", "split"), "parameters differ after a resume");

  /* the command refuses a bad key by name */
  const char *bin = nb_test_nabla_bin();
  if (bin) {
    char cmd[2048], outp[2048];
    snprintf(cmd, sizeof cmd, "%s grpo %s/grpo/config.yaml --run-dir %s/x grpo.betta=1 2>&1", bin, dir, dir);
    int rc = nb_test_run(cmd, outp, sizeof outp);
    CHECK_MSG(rc == 1 && strstr(outp, "unknown key 'grpo.betta'"), "nabla grpo: rc %d: %s", rc, outp);
  } else {
    printf("SKIPPED: the nabla grpo command check (no $NABLA_BIN)\n");
  }
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == after_first, "%zu bytes in use after the first run, %zu now", after_first,
            nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(dir);
  return nb_test_summary("posttrain/test_grpo_train");
}
