/* The SFT demonstration, end to end on a tiny byte-level Llama:
 *   - `nabla train` pretrains a base on "word drow" lines;
 *   - `nabla sft` fine-tunes LoRA adapters on a generated chat data set
 *     ("reverse abc" -> "cba", chatml) with lora.merge_at_end=true: the run
 *     dir holds config.yaml (with the sft and lora sections), metrics.jsonl,
 *     report.html, TensorBoard events and checkpoints of the adapters only;
 *   - the held-out completion loss (masked to the assistant's tokens) of
 *     the merged model is well below the base's (before/after printed), and
 *     equals the run's last eval loss;
 *   - the merged model's logits equal base + adapters through the hook
 *     within f32 rounding; `nabla lora merge` writes the same merged weights;
 *     `nabla lora export-peft` writes PEFT's files, which load back the same;
 *   - a run stopped at step 4 and resumed gives the uninterrupted run's
 *     losses and adapters bit for bit;
 *   - bad keys and bad data lines are refused naming them. */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"
#include "tracecheck.h"

#include "nabla/nabla.h"

static const char *const target = ".*attn/w[qkvo]|.*mlp/w.*|lm_head";

static uint64_t lcg(uint64_t *x) {
  *x = *x * 6364136223846793005ull + 1442695040888963407ull;
  return *x >> 33;
}

static void word(uint64_t *x, char *w) {
  int n = 3 + (int)(lcg(x) % 4);
  for (int i = 0; i < n; i++) w[i] = (char)('a' + lcg(x) % 8);
  w[n] = 0;
}

static void reversed(const char *w, char *r) {
  size_t n = strlen(w);
  for (size_t i = 0; i < n; i++) r[i] = w[n - 1 - i];
  r[n] = 0;
}

static void write_data(void) {
  uint64_t x = 7;
  char w[8], r[8];
  FILE *f = fopen("base.txt", "w");
  for (int i = 0; i < 3000; i++) word(&x, w), reversed(w, r), fprintf(f, "%s %s\n", w, r);
  fclose(f);
  for (int part = 0; part < 2; part++) {
    f = fopen(part ? "eval.jsonl" : "train.jsonl", "w");
    for (int i = 0; i < (part ? 24 : 400); i++) {
      word(&x, w), reversed(w, r);
      fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"reverse %s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", w, r);
    }
    fclose(f);
  }
  nb_test_write_text("base.yaml", "model:\n  preset: llama-tiny\n  n_layers: 2\n  d_model: 64\n  n_heads: 4\n  n_kv_heads: 2\n"
                                  "  d_ff: 128\n  vocab_size: 256\n  max_seq_len: 160\n"
                                  "data: {train: base.txt, seq_len: 64, workers: 0}\noptim: {lr: 3.0e-3}\n"
                                  "schedule: {warmup_steps: 5}\nbatch_size: 8\nsteps: 30\neval_every: 0\nlog_every: 10\n"
                                  "checkpoint_every: 0\n");
  char sft[1024];
  snprintf(sft, sizeof sft,
           "sft:\n  base: base\n  chat_template: chatml\n"
           "lora:\n  target: '%s'\n  rank: 8\n  alpha: 16\n"
           "data: {train: train.jsonl, eval: eval.jsonl, seq_len: 128, workers: 0}\n"
           "optim: {lr: 1.0e-2, weight_decay: 0.0}\nschedule: {warmup_steps: 5}\n"
           "batch_size: 8\nsteps: 40\neval_every: 20\neval_steps: 2\nlog_every: 10\ncheckpoint_every: 20\n",
           target);
  nb_test_write_text("sft.yaml", sft);
}

/* ---------------------------------------------------------------- the held-out loss, by hand */

/* The first 2 packed eval batches (8 rows of 128) as the trainer builds them. */
static nb_tree **eval_batches(nb_ctx *ctx, const nb_model_loaded *m, nb_pt_sft_data *d, int *n) {
  nb_pt_sft_data_opts o = {.chat = NB_SERVE_CHAT_CHATML, .tok = m->tok, .bos_id = m->bos_id,
                           .eos_id = m->n_eos ? m->eos_ids[0] : -1, .max_len = 129};
  CHECK_OK(ctx, nb_pt_sft_load(ctx, "eval.jsonl", &o, d));
  static nb_tree *b[2];
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(nb_pt_sft_map(ctx, d)), &(nb_data_pack_opts){.seq_len = 128, .rows = 8});
  for (*n = 0; *n < 2;) {
    nb_data_elem e = NB_DATA_ELEM_INIT;
    if (nb_data_iter_next(it, &e) || e.kind != NB_DATA_TREE) break;
    b[(*n)++] = e.tree;
  }
  nb_data_iter_destroy(it);
  return b;
}

/* mean over the batches of the masked CE ("loss"), or the logits of batch 0 */
static double run_model(nb_ctx *ctx, const nb_model_config *c, const nb_tree *params, const nb_tree *frozen, nb_pt_lora *l,
                        nb_tree **batches, int n, nb_array **logits0) {
  nb_model_trace_opts o = {.frozen_spec = frozen, .linear_hook = l ? nb_pt_lora_hook : NULL, .hook_ud = l};
  nb_graph *g = logits0 ? nb_model_trace_forward(ctx, c, &o, params, batches[0]) : nb_model_trace_loss(ctx, c, &o, params, batches[0]);
  nb_exe *e = g ? nb_jit(ctx, g, NULL) : NULL;
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  double sum = 0;
  for (int i = 0; e && i < (logits0 ? 1 : n); i++) {
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    if (frozen) nb_tree_merge(in, "frozen", frozen);
    nb_tree_merge(in, "batch", batches[i]);
    CHECK_OK(ctx, nb_exe_run(e, in, out));
    if (logits0) {
      *logits0 = nb_tree_get_array(out, "logits");
      if (*logits0) nb_array_retain(*logits0);
    } else {
      nb_array *a = nb_tree_get_array(out, "loss");
      sum += a ? nb_array_get(a, 0) : NAN;
    }
    nb_tree_destroy(in), nb_tree_destroy(out);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  return sum / n;
}

static double last_eval_loss(const char *metrics) {
  char *t = nb_test_read_file(metrics, NULL);
  double v = NAN;
  for (char *p = t ? strstr(t, "\"eval_loss\":") : NULL; p; p = strstr(p + 1, "\"eval_loss\":")) v = strtod(p + 12, NULL);
  free(t);
  return v;
}

static nb_tree *latest_params(nb_ctx *ctx, const char *ckpt_dir) {
  nb_ckpt_manager *cm = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = ckpt_dir, .read_only = true});
  int64_t step = -1;
  if (cm) nb_ckpt_latest_step(cm, &step);
  static const char *const items[] = {"params"};
  nb_tree *r = step >= 0 ? nb_ckpt_restore(cm, step, &(nb_ckpt_restore_opts){.items = items, .n_items = 1, .no_mmap = true}) : NULL;
  nb_tree *p = r ? nb_tree_select_prefix(r, "params", true) : NULL;
  nb_tree_destroy(r);
  nb_ckpt_manager_destroy(cm);
  CHECK_MSG(p, "no params in %s: %s", ckpt_dir, nb_ctx_error(ctx));
  return p;
}

static bool trees_equal(const nb_tree *a, const nb_tree *b) {
  if (!a || !b || nb_tree_size(a) != nb_tree_size(b)) return false;
  for (size_t i = 0; i < nb_tree_size(a); i++) {
    nb_array *x = nb_tree_get_array(a, nb_tree_path(a, i)), *y = nb_tree_get_array(b, nb_tree_path(a, i));
    if (!x || !y || nb_array_size(x) != nb_array_size(y)) return false;
    for (int64_t k = 0; k < nb_array_size(x); k++)
      if (nb_array_get(x, k) != nb_array_get(y, k)) return false;
  }
  return true;
}

static void test_demo(nb_ctx *ctx) {
  char out[1 << 14], err[1 << 14], cmd[1024];
  snprintf(cmd, sizeof cmd, "%s train base.yaml --run-dir base --threads 2", nb_test_nabla_bin());
  int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "base training failed: %s", err);
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir run --threads 2 lora.merge_at_end=true", nb_test_nabla_bin());
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0 && strstr(out, "merged model: run/merged"), "nabla sft failed (%d): %s\n%s", rc, out, err);
  if (rc) return;
  /* the run dir contract */
  char *cfg = nb_test_read_file("run/config.yaml", NULL);
  CHECK(cfg && strstr(cfg, "lora:\n  target: \"") && strstr(cfg, "sft:\n  base: \"base\"") && strstr(cfg, "steps: 40"));
  free(cfg);
  struct stat st;
  CHECK(!stat("run/report.html", &st) && !stat("run/metrics.jsonl", &st) && !stat("run/checkpoints/step_00000040", &st));
  nb_tree *ad = latest_params(ctx, "run/checkpoints");
  size_t n_ad = ad ? nb_tree_size(ad) : 0;
  for (size_t i = 0; i < n_ad; i++) {
    const char *p = nb_tree_path(ad, i);
    size_t n = strlen(p);
    CHECK_MSG(n > 7 && (!strcmp(p + n - 7, "/lora_a") || !strcmp(p + n - 7, "/lora_b")), "checkpointed: %s", p);
  }
  CHECK_MSG(n_ad == 2 * (2 * 7 + 1), "%zu adapter arrays checkpointed", n_ad);

  /* before / after on the held-out completions */
  nb_model_loaded base = {0}, merged = {0};
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, "base", NULL, &base));
  CHECK_OK(ctx, nb_train_load_run_dir(ctx, "run/merged", NULL, &merged));
  if (!base.params || !merged.params || !ad) goto done;
  nb_pt_sft_data d;
  int nb = 0;
  nb_tree **batches = eval_batches(ctx, &base, &d, &nb);
  CHECK(nb == 2);
  double before = run_model(ctx, &base.cfg, base.params, NULL, NULL, batches, nb, NULL);
  double after = run_model(ctx, &merged.cfg, merged.params, NULL, NULL, batches, nb, NULL);
  double logged = last_eval_loss("run/metrics.jsonl");
  fprintf(stderr, "held-out completion loss (nats/token, assistant tokens only): before %.4f (base), after %.4f "
          "(merged; the run's last eval_loss %.4f)\n", before, after, logged);
  CHECK_MSG(after < before - 1.0, "SFT did not lower the held-out completion loss: %g -> %g", before, after);
  CHECK_MSG(fabs(after - logged) < 1e-4 * fabs(logged), "merged %.6f vs the run's eval %.6f", after, logged);

  /* merged == base + adapters through the hook */
  nb_pt_lora_config lc = {.target = target, .rank = 8, .alpha = 16};
  nb_pt_lora *l = nb_pt_lora_create(ctx, &lc, base.params, ad);
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  nb_array *lm = NULL, *lh = NULL;
  run_model(ctx, &merged.cfg, merged.params, NULL, NULL, batches, 1, &lm);
  if (l) run_model(ctx, &base.cfg, ad, base.params, l, batches, 1, &lh);
  if (lm && lh) {
    double m = 0, s = 0;
    for (int64_t i = 0; i < nb_array_size(lm); i++) {
      m = fmax(m, fabs(nb_array_get(lm, i) - nb_array_get(lh, i)));
      s = fmax(s, fabs(nb_array_get(lh, i)));
    }
    fprintf(stderr, "merged vs base + adapters: max |logit diff| %.3g at max |logit| %.3g\n", m, s);
    CHECK_MSG(m <= 1e-5 * s, "merged vs base + adapters logits differ by %g (max |logit| %g)", m, s);
  }
  nb_array_release(lm), nb_array_release(lh);
  nb_pt_lora_destroy(l);
  for (int i = 0; i < nb; i++) nb_tree_destroy(batches[i]);
  nb_pt_sft_data_free(&d);

  /* nabla lora merge writes the same weights */
  snprintf(cmd, sizeof cmd, "%s lora merge run merged2", nb_test_nabla_bin());
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "nabla lora merge: %s", err);
  nb_tree *m2 = rc ? NULL : latest_params(ctx, "merged2/checkpoints"), *m1 = latest_params(ctx, "run/merged/checkpoints");
  CHECK(trees_equal(m1, m2));
  nb_tree_destroy(m1), nb_tree_destroy(m2);
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc != 0 && strstr(err, "merged2 exists"), "a second merge into merged2: %d %s", rc, err);

  /* nabla lora export-peft: PEFT's files, which load back to the same adapters */
  snprintf(cmd, sizeof cmd, "%s lora export-peft run peft", nb_test_nabla_bin());
  rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "nabla lora export-peft: %s", err);
  nb_pt_lora_config pc;
  nb_tree *back = rc ? NULL : nb_pt_lora_load_peft(ctx, "peft", &base.cfg, base.params, &pc);
  CHECK_MSG(back && trees_equal(back, ad) && pc.rank == 8 && pc.alpha == 16, "PEFT export does not load back: %s", nb_ctx_error(ctx));
  nb_tree_destroy(back);
done:
  nb_model_loaded_free(&base), nb_model_loaded_free(&merged);
  nb_tree_destroy(ad);
}

/* ---------------------------------------------------------------- resume */

typedef struct losses {
  double v[16];
  int64_t stop_at;
} losses;

static void on_step(void *ud, const nb_train_step_info *si) {
  losses *l = ud;
  if (si->step < 16) l->v[si->step] = si->loss;
}

static bool stop(void *ud, int64_t step) { return ((losses *)ud)->stop_at == step; }

static void run_lib(nb_ctx *ctx, const char *dir, losses *l) {
  static const char *const over[] = {"steps=8", "schedule.kind=constant", "schedule.warmup_steps=0", "checkpoint_every=2",
                                     "eval_every=0", "log_every=1", "lora.dropout=0.1"};
  nb_pt_sft_config sft;
  nb_train_config cfg;
  CHECK_OK(ctx, nb_pt_sft_config_load(ctx, "sft.yaml", 7, over, &sft, &cfg));
  nb_train_opts o = {.run_dir = dir, .threads = 2, .on_step = on_step, .should_stop = stop, .ud = l};
  nb_train_result r;
  CHECK_OK(ctx, nb_pt_sft_run(ctx, &sft, &cfg, &o, &r));
}

static void test_resume(nb_ctx *ctx) {
  losses a = {.stop_at = 4}, b = {0};
  run_lib(ctx, "ra", &a);
  a.stop_at = 0;
  run_lib(ctx, "ra", &a); /* resumes at 4 */
  run_lib(ctx, "rb", &b);
  bool same = true;
  for (int i = 1; i <= 8; i++) same &= a.v[i] == b.v[i] && isfinite(a.v[i]);
  CHECK_MSG(same, "losses differ after resume: step 5 %.9g vs %.9g, step 8 %.9g vs %.9g", a.v[5], b.v[5], a.v[8], b.v[8]);
  nb_tree *pa = latest_params(ctx, "ra/checkpoints"), *pb = latest_params(ctx, "rb/checkpoints");
  CHECK_MSG(trees_equal(pa, pb), "adapters differ after resume");
  nb_tree_destroy(pa), nb_tree_destroy(pb);
}

/* ---------------------------------------------------------------- refusals */

static void test_refusals(nb_ctx *ctx) {
  char out[1 << 14], err[1 << 14], cmd[1024];
  /* a Hugging Face folder as the base (init_from=): two steps run, the start line names the eval file */
  const char *src = getenv("NABLA_SOURCE_DIR");
  snprintf(cmd, sizeof cmd,
           "%s sft sft.yaml --run-dir hf --threads 1 sft.base= init_from=%s/tests/models/golden/hf_llama_tiny data.seq_len=64 "
           "steps=2 eval_every=2 eval_steps=1 checkpoint_every=0 lora.target='.*attn/w[qv]' profile.steps=2",
           nb_test_nabla_bin(), src ? src : "..");
  CHECK_MSG(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(out, "eval eval.jsonl") && strstr(out, "done: step 2"),
            "%s\n%s", out, err);
  /* profile.steps works through sft as through train: the trace holds step 2 alone */
  nb_test_trace t;
  if (!nb_test_trace_load("hf/profile/trace.json", &t)) {
    const nb_test_span *st = nb_test_trace_find(&t, "train step");
    CHECK_MSG(nb_test_trace_count(&t, "train step", "train", NULL) == 1 && st && strstr(st->args, "\"step\":2,"),
              "%zu train steps in sft's profile.steps trace", nb_test_trace_count(&t, "train step", NULL, NULL));
    nb_test_trace_free(&t);
  }
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir bad lora.rnk=3", nb_test_nabla_bin());
  CHECK(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 1 && strstr(err, "unknown key 'lora.rnk'"));
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir bad sft.chat_template=jinja", nb_test_nabla_bin());
  CHECK(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 1 && strstr(err, "sft.chat_template: 'jinja' is not one of"));
  FILE *f = fopen("eval.jsonl", "a");
  fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir bad", nb_test_nabla_bin());
  CHECK_MSG(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 1 && strstr(err, "eval.jsonl:25: messages: no assistant message"),
            "%s", err);
  /* the run config is checked against the base's model (max_seq_len 160), not the file's (128) */
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir bad data.seq_len=200", nb_test_nabla_bin());
  CHECK_MSG(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 1 && strstr(err, "data.seq_len (200) exceeds model.max_seq_len (160)"),
            "%s", err);
  nb_pt_sft_config sft;
  nb_train_config cfg;
  static const char *const no_lora[] = {"lora.target=", "lora.merge_at_end=true"};
  CHECK(nb_pt_sft_config_load(ctx, "sft.yaml", 2, no_lora, &sft, &cfg) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "lora.merge_at_end");
  /* init_from= names the base as in nabla train (and is not the trainer's: the adapters are the parameters) */
  static const char *const via_init[] = {"sft.base=", "init_from=base"}, *const both[] = {"init_from=elsewhere"};
  CHECK_OK(ctx, nb_pt_sft_config_load(ctx, "sft.yaml", 2, via_init, &sft, &cfg));
  CHECK_MSG(!strcmp(sft.base, "base") && !cfg.init_from[0], "sft.base '%s', init_from '%s'", sft.base, cfg.init_from);
  CHECK(nb_pt_sft_config_load(ctx, "sft.yaml", 1, both, &sft, &cfg) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "init_from 'elsewhere' and sft.base 'base' name different models");
  /* a missing base is named */
  snprintf(cmd, sizeof cmd, "%s sft sft.yaml --run-dir bad sft.base=no/such/dir", nb_test_nabla_bin());
  CHECK_MSG(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 1 && strstr(err, "sft.base 'no/such/dir':"), "%s", err);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[512], cwd[4096];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "sft");
  if (!getcwd(cwd, sizeof cwd) || chdir(dir)) return 1;
  write_data();
  test_demo(ctx);
  test_resume(ctx);
  test_refusals(ctx);
  if (chdir(cwd)) return 1;
  if (!nb_test_failures) nb_test_rm_rf(dir);
  else fprintf(stderr, "left %s for inspection\n", dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_sft");
}
