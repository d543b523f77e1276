/* nabla dpo end to end on a tiny model (byte level, 2 layers, d 32):
 *  - a base pretrained by nb_train_run on text of the same form whose
 *    prompts and completions are any letters of a-p ("jbc=kbe."), so it has no
 *    preference between the pairs below;
 *  - DPO (nb_pt_pref_run, base = that run dir) on pairs chosen = the prompt
 *    copied, rejected = the copy with one letter corrupted; held-out pairs
 *    (other prompts): the policy's log-prob preference logp(chosen) -
 *    logp(rejected) and how often it is > 0, before (the base) and after,
 *    printed; after must be clearly better;
 *  - the run-dir contract: config.yaml with the pref: section (loads back
 *    for both the trainer and the pref config), metrics.jsonl with rewards,
 *    accuracy and margin (train and eval), TensorBoard events, report.html;
 *  - a stop at step 10 and a resume to 20 give the losses and parameters of
 *    an uninterrupted run bit for bit;
 *  - pref.precompute_ref (reference log-probs computed once, a batch field)
 *    and grad_accum 4 give the losses of the plain run (to 1e-5);
 *  - `nabla dpo` refuses a bad pref key by name. */
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
static uint64_t lcg = 12345;

static int rnd(int n) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (int)((lcg >> 33) % (uint64_t)n);
}

/* prompt "xyz=" (letters a-h), the copy, and the copy with one letter
 * replaced by one of i-p (a corruption a 2-layer model can learn to avoid in
 * a few dozen steps; a copy against a copy with another letter of a-h needs
 * hundreds: tried) */
static void triple(char p[5], char c[5], char r[5]) {
  for (int i = 0; i < 3; i++) p[i] = c[i] = r[i] = (char)('a' + rnd(8));
  r[rnd(3)] = (char)('i' + rnd(8));
  p[3] = '=';
  c[3] = r[3] = '.';
  p[4] = c[4] = r[4] = 0;
}

static void write_data(void) {
  char path[600], p[5], c[5], r[5];
  snprintf(path, sizeof path, "%s/lm.txt", dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; i < 600; i++) { /* letters a-p alike: no preference for a-h */
    triple(p, c, r);
    for (int k = 0; k < 3; k++) p[k] = (char)('a' + rnd(16)), c[k] = (char)('a' + rnd(16));
    fprintf(f, "%s%s\n", p, c);
  }
  fclose(f);
  const char *names[2] = {"train.jsonl", "eval.jsonl"};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[k]);
    f = fopen(path, "w");
    for (int i = 0; i < (k ? 64 : 512); i++) {
      triple(p, c, r);
      fprintf(f, "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", p, c, r);
    }
    fclose(f);
  }
}

static const char model_yaml[] =
    "model:\n  preset: gpt2-tiny\n  d_model: 32\n  n_layers: 2\n  n_heads: 2\n  n_kv_heads: 2\n  d_ff: 64\n"
    "  max_seq_len: 16\n"
    "optim:\n  lr: 3.0e-3\n  weight_decay: 0\nschedule:\n  kind: constant\n  warmup_steps: 0\n"
    "batch_size: 16\nlog_every: 1\ncheckpoint_every: 0\n";

static nb_status parse(nb_ctx *ctx, const char *extra, nb_train_config *c) {
  char text[4096];
  snprintf(text, sizeof text, "%s%s", model_yaml, extra);
  return nb_train_config_parse(ctx, "test", text, strlen(text), 0, NULL, c);
}

/* Held-out preference of params: mean logp(chosen) - logp(rejected) and the
 * share of pairs where it is > 0, from a forward pass (interpreter). */
static nb_status pref_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const nb_model_config *mc = u;
  nb_tree *params = nb_tree_select_prefix(in, "params", true);
  nb_nn_apply a = {.g = g, .params = params};
  nb_val *x = nb_pt_pref_rows(nb_tree_get_val(in, "inputs")), *y = nb_pt_pref_rows(nb_tree_get_val(in, "targets"));
  nb_val *m = nb_pt_pref_rows(nb_tree_get_val(in, "mask"));
  nb_val *lp = nb_pt_seq_logps(nb_model_forward(&a, mc, &(nb_model_fwd){.tokens = x}, NULL), y, m, false);
  nb_tree_destroy(params);
  return nb_tree_set_val(out, "logps", lp);
}

static void held_out(nb_ctx *ctx, const nb_model_config *mc, const nb_tree *params, double *margin, double *acc) {
  char path[600];
  snprintf(path, sizeof path, "%s/eval.jsonl", dir);
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  nb_tree *data = nb_pt_pref_data_load(ctx, path, &tok, 12, 256, NULL);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "", data);
  nb_tree_merge(in, "params", params);
  nb_array *lp = nb_test_eval_output(ctx, pref_fn, (void *)mc, in, "logps");
  CHECK_MSG(lp, "held-out log-probs: %s", nb_ctx_error(ctx));
  int64_t B = lp ? nb_array_size(lp) / 2 : 0;
  double sum = 0, n = 0;
  for (int64_t i = 0; i < B; i++) {
    double d = nb_array_get(lp, i) - nb_array_get(lp, B + i);
    sum += d;
    n += d > 0;
  }
  *margin = B ? sum / (double)B : NAN;
  *acc = B ? n / (double)B : NAN;
  nb_array_release(lp);
  nb_tree_destroy(in);
  nb_tree_destroy(data);
}

static bool stop_at_10(void *ud, int64_t step) { return step == 10; }

static nb_status dpo(nb_ctx *ctx, const char *run, int64_t steps, bool stop, bool precompute, int64_t grad_accum) {
  char extra[2048], rd[600];
  snprintf(extra, sizeof extra,
           "data:\n  train: %s/train.jsonl\n  eval: %s/eval.jsonl\n  seq_len: 12\n  workers: 0\n"
           "steps: %lld\neval_every: 10\neval_steps: 4\ngrad_accum: %lld\n", dir, dir, (long long)steps,
           (long long)grad_accum);
  nb_train_config c;
  nb_pt_pref_config pc;
  nb_status s = parse(ctx, extra, &c);
  char over[700];
  snprintf(over, sizeof over, "pref.base=%s/base", dir);
  const char *ov[3] = {over, "pref.beta=0.1", precompute ? "pref.precompute_ref=true" : "pref.precompute_ref=false"};
  if (!s) s = nb_pt_pref_config_load(ctx, NULL, 3, ov, &pc);
  snprintf(rd, sizeof rd, "%s/%s", dir, run);
  nb_train_opts o = {.run_dir = rd, .threads = 2, .should_stop = stop ? stop_at_10 : NULL};
  nb_train_result r;
  if (!s) s = nb_pt_pref_run(ctx, &c, &pc, &o, &r);
  return s;
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
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "dpo");
  write_data();
  nb_ctx *ctx = nb_ctx_create();
  char extra[1024], path[700];
  nb_train_config base;
  snprintf(extra, sizeof extra, "data:\n  train: %s/lm.txt\n  seq_len: 12\n  workers: 0\nsteps: 60\neval_every: 0\n", dir);
  CHECK_OK(ctx, parse(ctx, extra, &base));
  snprintf(path, sizeof path, "%s/base", dir);
  nb_train_opts bo = {.run_dir = path, .threads = 2};
  CHECK_OK(ctx, nb_train_run(ctx, &base, &bo, NULL));

  /* DPO from the base: the demonstration */
  CHECK_OK(ctx, dpo(ctx, "dpo", 20, false, false, 1));
  nb_model_loaded mb, md;
  snprintf(path, sizeof path, "%s/base", dir);
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, path, NULL, &mb));
  snprintf(path, sizeof path, "%s/dpo", dir);
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, path, NULL, &md));
  double m0, a0, m1, a1;
  held_out(ctx, &mb.cfg, mb.params, &m0, &a0);
  held_out(ctx, &md.cfg, md.params, &m1, &a1);
  printf("held-out pairs (64): logp(chosen) - logp(rejected) %+.3f -> %+.3f nats, chosen preferred %.0f%% -> %.0f%%\n",
         m0, m1, 100 * a0, 100 * a1);
  CHECK_MSG(a1 >= 0.8 && a1 >= a0 + 0.2 && m1 > m0 + 1, "DPO did not raise the held-out preference enough");
  nb_model_loaded_free(&mb);
  nb_model_loaded_free(&md);

  /* the run dir */
  snprintf(path, sizeof path, "%s/dpo/config.yaml", dir);
  char *cy = nb_test_read_file(path, NULL);
  CHECK(cy && strstr(cy, "\npref:\n  loss_type: sigmoid\n  beta: 0.1\n") && strstr(cy, "/base\""));
  free(cy);
  nb_train_config back;
  nb_pt_pref_config pback;
  CHECK_OK(ctx, nb_train_config_load(ctx, path, 0, NULL, &back));
  CHECK_OK(ctx, nb_pt_pref_config_load(ctx, path, 0, NULL, &pback));
  CHECK(pback.loss.loss_type == NB_PT_PREF_SIGMOID && pback.loss.beta == 0.1 && strstr(pback.base, "/base"));
  snprintf(path, sizeof path, "%s/dpo/metrics.jsonl", dir);
  char *mj = nb_test_read_file(path, NULL);
  CHECK(mj && strstr(mj, "\"rewards/accuracies\":") && strstr(mj, "\"rewards/margins\":") &&
        strstr(mj, "\"rewards/chosen\":") && strstr(mj, "\"eval_rewards/margins\":"));
  const char *last_eval = mj ? strstr(mj, "{\"step\":20,\"eval_loss\"") : NULL;
  CHECK_MSG(last_eval, "no eval record at step 20");
  if (last_eval) printf("eval at step 20: %.*s\n", (int)strcspn(last_eval, "\n"), last_eval);
  free(mj);
  snprintf(path, sizeof path, "%s/dpo/report.html", dir);
  CHECK(access(path, R_OK) == 0);
  snprintf(path, sizeof path, "%s/dpo", dir);
  DIR *d = opendir(path);
  bool events = false;
  for (struct dirent *e; d && (e = readdir(d));) events |= !strncmp(e->d_name, "events.out.tfevents.", 20);
  if (d) closedir(d);
  CHECK(events);

  /* stop at 10, resume to 20: the uninterrupted run's losses and parameters */
  CHECK_OK(ctx, dpo(ctx, "split", 20, true, false, 1));
  CHECK_OK(ctx, dpo(ctx, "split", 20, false, false, 1));
  char la[8192], lb[8192];
  losses("dpo", la, sizeof la);
  losses("split", lb, sizeof lb);
  CHECK_MSG(la[0] && !strcmp(la, lb), "losses differ after a resume:\n%s\n%s", la, lb);
  CHECK_MSG(same_params(ctx, "dpo", "split"), "parameters differ after a resume");

  /* reference log-probs precomputed once (a batch field) instead of the frozen model in the step, and
   * grad_accum 4 (micro-batches of 4 whole pairs): the same losses, to f32 rounding (other graphs). With
   * grad_accum the gradient sums round otherwise and Adam amplifies that (1e-4 apart by step 16): its first
   * 10 steps are compared. */
  struct { const char *run; bool pre; int64_t ga; int steps; } same[2] = {{"pre", true, 1, 20}, {"ga", false, 4, 10}};
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ctx, dpo(ctx, same[k].run, 20, false, same[k].pre, same[k].ga));
    losses(same[k].run, lb, sizeof lb);
    int n = 0;
    for (char *p = la, *q = lb; *p && *q && n < same[k].steps; p = strchr(p, ';') + 1, q = strchr(q, ';') + 1, n++)
      CHECK_MSG(fabs(strtod(p, NULL) - strtod(q, NULL)) <= 1e-5 * (1 + fabs(strtod(p, NULL))), "%s: loss %d: %.12s vs %.12s",
                same[k].run, n, p, q);
    CHECK(n == same[k].steps);
  }

  /* the command refuses a bad key by name */
  const char *bin = nb_test_nabla_bin();
  if (bin) {
    char cmd[2048], outp[2048];
    snprintf(cmd, sizeof cmd, "%s dpo %s/dpo/config.yaml --run-dir %s/x pref.betta=1 2>&1", bin, dir, dir);
    int rc = nb_test_run(cmd, outp, sizeof outp);
    CHECK_MSG(rc == 1 && strstr(outp, "unknown key 'pref.betta'"), "nabla dpo: rc %d: %s", rc, outp);
  } else {
    printf("SKIPPED: the nabla dpo command check (no $NABLA_BIN)\n");
  }
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(dir);
  return nb_test_summary("posttrain/test_pref_train");
}
