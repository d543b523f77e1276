/* The trainer never loses or silently corrupts a run: a refused run leaves
 * config.yaml alone and checkpoints carry the config; a resume with other
 * data is refused naming the key (unless resume.allow_data_change); data
 * files are told by their magic bytes and shards verified; the text cache
 * follows the tokenizer's content; divergence stops the run without saving
 * it; a damaged newest checkpoint is set aside and the previous one used;
 * signals during set-up and after the last step are handled; eval_steps
 * beyond the eval data is an error; a failed resume says its cause once. */
#include <cjson/cJSON.h>
#include <signal.h>

#include "nabla/tokenizer.h"
#include "train_util.h"

static char work[256];

/* Warnings logged by the trainer, concatenated. */
static char logbuf[1 << 14];
static void capture_log(void *ud, nb_log_level level, const char *msg) {
  (void)ud;
  if (level < NB_LOG_WARN) return;
  size_t n = strlen(logbuf);
  snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
}

static void run_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", work, name); }

/* The tiny config with a constant schedule (so `steps` is not in the step
 * graph and most runs here share one compiled executable), then extra. */
static nb_status run_with(nb_ctx *ctx, const char *dir, int n_extra, const char *const *extra, recorder *r,
                          nb_train_result *res) {
  const char *all[32] = {"schedule.kind=constant"};
  for (int i = 0; i < n_extra && i < 31; i++) all[i + 1] = extra[i];
  nb_train_config cfg;
  nb_status s = tiny_config(ctx, work, n_extra + 1, all, &cfg);
  if (s) return s;
  recorder local = {0};
  return run_recorded(ctx, &cfg, dir, r ? r : &local, false, res);
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static bool file_has(const char *path, const char *needle) {
  char *t = nb_test_read_file(path, NULL);
  bool ok = t && strstr(t, needle);
  free(t);
  return ok;
}

/* Items 1 and 9: a run refused for a changed model shape, or for a live
 * trainer on the same dir, leaves config.yaml as it was; the checkpoint
 * holds the config; the failed resume states its cause once. */
static void test_refused_run_keeps_config(nb_ctx *ctx) {
  char d[600], cfgp[700], step3[700];
  run_dir(d, sizeof d, "refused");
  snprintf(cfgp, sizeof cfgp, "%s/config.yaml", d);
  const char *e3[] = {"steps=3"};
  CHECK_OK(ctx, run_with(ctx, d, 1, e3, NULL, NULL));
  CHECK(file_has(cfgp, "d_model: 32") && file_has(cfgp, "steps: 3"));
  /* the checkpoint stores the resolved config */
  snprintf(step3, sizeof step3, "%s/checkpoints/step_00000003/manifest.json", d);
  CHECK(file_has(step3, "d_model: 32"));
  const char *wide[] = {"steps=6", "model.d_model=64"};
  CHECK(run_with(ctx, d, 2, wide, NULL, NULL) == NB_ERR_SHAPE);
  const char *msg = nb_ctx_error(ctx);
  CHECK_MSG(count(msg, "train: restoring step 3") == 1, "%s", msg);
  CHECK_MSG(strstr(msg, "model.d_model: 32 in the checkpoint, 64 now"), "%s", msg);
  CHECK_MSG(strstr(msg, "'params/embed/embedding' is f32[256,32] in step 3 but the target wants f32[256,64]"),
            "the checkpoint's cause is cut off: %s", msg);
  nb_ctx_clear_error(ctx);
  CHECK_MSG(file_has(cfgp, "d_model: 32") && file_has(cfgp, "steps: 3"), "config.yaml rewritten by a refused run");
  /* nor by one that fails to compile */
  const char *bf16[] = {"steps=6", "precision.compute=bf16"};
  CHECK(run_with(ctx, d, 2, bf16, NULL, NULL) == NB_ERR_UNIMPLEMENTED);
  nb_ctx_clear_error(ctx);
  CHECK_MSG(file_has(cfgp, "compute: f32"), "config.yaml rewritten by a run that failed");
  /* a second trainer while the first holds the run */
  char ck[700];
  snprintf(ck, sizeof ck, "%s/checkpoints", d);
  nb_ckpt_manager *live = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = ck});
  CHECK(live != NULL);
  const char *e6[] = {"steps=6"};
  CHECK(run_with(ctx, d, 1, e6, NULL, NULL) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "in use by another manager");
  CHECK_MSG(file_has(cfgp, "steps: 3"), "config.yaml rewritten by a refused run");
  nb_ckpt_manager_destroy(live);
  CHECK_OK(ctx, run_with(ctx, d, 1, e6, NULL, NULL));
  CHECK(file_has(cfgp, "steps: 6"));
}

/* Item 2: the data position's dependencies are checked on resume. */
static void test_data_change_refused(nb_ctx *ctx) {
  char d[600], other[600], tr[700];
  run_dir(d, sizeof d, "datachange");
  const char *e3[] = {"steps=3"};
  CHECK_OK(ctx, run_with(ctx, d, 1, e3, NULL, NULL));
  struct {
    const char *over, *key;
  } cases[] = {{"batch_size=2", "batch_size: 2 now, 4 saved"}, {"data.seq_len=8", "data.seq_len: 8 now, 16 saved"},
               {"seed=7", "seed: 7 now, 0 saved"}, {NULL, "data.train: the training tokens differ"}};
  snprintf(other, sizeof other, "%s/other.txt", work);
  nb_test_write_text(other, "another text, long enough to make a few windows of seventeen bytes each. again and "
                            "again and again and again and again and again and again and again and again and "
                            "again and again and again and again and again and again and again and again. "
                            "eval: more text here so that the held out part makes one batch of four windows of "
                            "tokens, which needs at least four hundred bytes of text in all, so here is some more "
                            "text, and more text, and more text, and more text, and more text, and more text and "
                            "more text, and more text, and more text, and more text, and more text, and more. "
                            "more text, and more text, and more text, and more text, and more text, and more text "
                            "and the end of it all, here.\n");
  snprintf(tr, sizeof tr, "data.train=%s", other);
  for (int i = 0; i < 4; i++) {
    const char *over[] = {"steps=5", cases[i].over ? cases[i].over : tr, "eval_steps=0"};
    CHECK(run_with(ctx, d, 3, over, NULL, NULL) == NB_ERR_INVALID_ARG);
    CHECK_ERR(ctx, NB_ERR_INVALID_ARG, cases[i].key);
    CHECK(latest_ckpt(ctx, d) == 3);
  }
  /* eval_steps does not move the data position */
  const char *ok1[] = {"steps=4", "eval_steps=1"};
  CHECK_OK(ctx, run_with(ctx, d, 2, ok1, NULL, NULL));
  /* the documented override */
  const char *ok2[] = {"steps=5", "seed=7", "resume.allow_data_change=true"};
  logbuf[0] = 0;
  nb_train_result res;
  CHECK_OK(ctx, run_with(ctx, d, 3, ok2, NULL, &res));
  CHECK(res.start_step == 4 && res.final_step == 5);
  CHECK_MSG(strstr(logbuf, "allowed by resume.allow_data_change"), "%s", logbuf);
}

/* Item 3: a token shard is used as a shard whatever its name; a record
 * file or binary is refused; a damaged shard or ids beyond the vocabulary
 * are errors naming the file. */
static void test_formats_and_verification(nb_ctx *ctx) {
  char corpus[600], tok[600], txt[600], rec[600], d[600], cache[700], tr[800];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
  snprintf(tok, sizeof tok, "%s/corpus.tok", work);
  const char *in[1] = {corpus};
  nb_data_build_opts whole = {.unit = NB_DATA_UNIT_FILE}; /* as the trainer tokenizes text */
  CHECK_OK(ctx, nb_data_build_shard(ctx, tok, 1, in, &whole, NULL, 0, NULL));
  const char *names[] = {tok, txt};
  snprintf(txt, sizeof txt, "%s/shard_named.txt", work);
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cp %s %s", tok, txt);
  CHECK(system(cmd) == 0);
  for (int i = 0; i < 2; i++) {
    run_dir(d, sizeof d, i ? "fmt_txt" : "fmt_tok");
    snprintf(tr, sizeof tr, "data.train=%s", names[i]);
    const char *e[] = {tr, "steps=2"};
    recorder r = {0};
    CHECK_OK(ctx, run_with(ctx, d, 2, e, &r, NULL));
    snprintf(cache, sizeof cache, "%s/data", d);
    CHECK_MSG(access(cache, F_OK) != 0, "%s was tokenized as text", names[i]);
    /* the same tokens as the text itself gives */
    static double ref1;
    if (!i) {
      char dref[600];
      run_dir(dref, sizeof dref, "fmt_ref");
      recorder rr = {0};
      const char *e2[] = {"steps=2"};
      CHECK_OK(ctx, run_with(ctx, dref, 1, e2, &rr, NULL));
      ref1 = rr.loss[1];
    }
    CHECK_MSG(r.loss[1] == ref1, "%s: loss %.9g vs %.9g", names[i], r.loss[1], ref1);
  }
  /* a record file is not text */
  snprintf(rec, sizeof rec, "%s/corpus.txt.rec", work);
  CHECK_OK(ctx, nb_data_build_records(ctx, rec, 1, in, NULL, NULL, NULL));
  run_dir(d, sizeof d, "fmt_rec");
  snprintf(tr, sizeof tr, "data.train=%s", rec);
  const char *er[] = {tr};
  CHECK(run_with(ctx, d, 1, er, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "is a record file");
  /* a flipped data byte */
  snprintf(cmd, sizeof cmd, "cp %s %s/damaged.tok", tok, work);
  CHECK(system(cmd) == 0);
  char dmg[700];
  snprintf(dmg, sizeof dmg, "%s/damaged.tok", work);
  nb_test_flip_byte(dmg, 64 + 100);
  snprintf(tr, sizeof tr, "data.train=%s", dmg);
  const char *ed[] = {tr};
  run_dir(d, sizeof d, "fmt_dmg");
  CHECK(run_with(ctx, d, 1, ed, NULL, NULL) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "damaged.tok': data checksum mismatch");
  /* ids at or above the vocabulary the header claims (and the model's 256) */
  char big[700];
  snprintf(big, sizeof big, "%s/big_ids.tok", work);
  nb_data_shard_writer *w = nb_data_shard_create(ctx, big, 4, 512);
  int32_t ids[400];
  for (int i = 0; i < 400; i++) ids[i] = i % 50 == 49 ? 300 : 97 + i % 20;
  CHECK(w && nb_data_shard_write(w, ids, 400) == NB_OK);
  CHECK_OK(ctx, nb_data_shard_finish(w));
  size_t n;
  uint8_t *h = (uint8_t *)nb_test_read_file(big, &n);
  CHECK(h != NULL);
  if (h) {
    uint64_t v = 256, hc;
    memcpy(h + 24, &v, 8); /* little-endian hosts */
    hc = nb_data_checksum_bytes(NB_DATA_XXH3, h, 56);
    memcpy(h + 56, &hc, 8);
    nb_test_write_file(big, h, n);
    free(h);
  }
  snprintf(tr, sizeof tr, "data.train=%s", big);
  const char *eb[] = {tr, "eval_steps=0"};
  run_dir(d, sizeof d, "fmt_big");
  CHECK(run_with(ctx, d, 2, eb, NULL, NULL) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "big_ids.tok': token 49 is outside the vocab [0, 256)");
  /* the eval shard's vocabulary is checked too */
  char ev[800];
  snprintf(ev, sizeof ev, "data.eval=%s", tok);
  const char *ev100[] = {ev, "model.vocab_size=200"};
  run_dir(d, sizeof d, "fmt_evvocab");
  CHECK(run_with(ctx, d, 2, ev100, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "more than model.vocab_size 200");
}

/* Item 4: the text cache follows the tokenizer's content: the same path
 * holding another tokenizer tokenizes again (and the resume notices). */
static void test_cache_follows_tokenizer(nb_ctx *ctx) {
  char corpus[600], tokp[600], d[600], tk[700];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
  snprintf(tokp, sizeof tokp, "%s/tok.json", work);
  size_t n;
  char *text = nb_test_read_file(corpus, &n);
  for (int v = 0; v < 2; v++) {
    nb_tok_trainer *tr = nb_tok_trainer_create(ctx, &(nb_tok_train_opts){.vocab_size = v ? 290 : 270});
    CHECK(tr && text && nb_tok_trainer_feed(tr, text, n) == NB_OK);
    nb_tok *t = nb_tok_trainer_finish(tr);
    nb_tok_trainer_destroy(tr);
    CHECK(t && nb_tok_save_hf(t, tokp) == NB_OK);
    nb_tok_destroy(t);
    run_dir(d, sizeof d, "tokcache");
    snprintf(tk, sizeof tk, "data.tokenizer=%s", tokp);
    const char *e[] = {tk, "model.vocab_size=300", v ? "steps=4" : "steps=2", "eval_steps=1"};
    nb_status s = run_with(ctx, d, 4, e, NULL, NULL);
    if (!v) CHECK_OK(ctx, s);
    else {
      CHECK_MSG(s == NB_ERR_INVALID_ARG, "the old tokenizer's cached tokens were used: %s", nb_status_name(s));
      CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "data.train: the training tokens differ");
    }
  }
  free(text);
  char cmd[1400], out[256];
  snprintf(cmd, sizeof cmd, "ls %s/data | grep -c tshard", d);
  nb_test_run(cmd, out, sizeof out);
  CHECK_MSG(atoi(out) == 2, "%s shards in the cache", out);
}

/* Item 4, the input side: editing a file inside a text directory (which
 * leaves the directory's own mtime alone) tokenizes again. */
static void test_cache_follows_dir_content(nb_ctx *ctx) {
  char dir[600], cmd[2000], d[600], tr[700];
  snprintf(dir, sizeof dir, "%s/textdir", work);
  snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/corpus.txt %s/a.txt", dir, work, dir);
  CHECK(system(cmd) == 0);
  run_dir(d, sizeof d, "dircache");
  snprintf(tr, sizeof tr, "data.train=%s", dir);
  const char *e2[] = {tr, "steps=2"}, *e4[] = {tr, "steps=4"};
  CHECK_OK(ctx, run_with(ctx, d, 2, e2, NULL, NULL));
  snprintf(cmd, sizeof cmd, "echo 'one more line at the end.' >> %s/a.txt", dir);
  CHECK(system(cmd) == 0);
  CHECK(run_with(ctx, d, 2, e4, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "data.train: the training tokens differ");
}

/* Item 5: divergence. optim.lr=100 goes non-finite within a few steps. */
static void test_divergence(nb_ctx *ctx) {
  char d[600];
  const char *base[] = {"optim.lr=100", "optim.grad_clip=0", "schedule.warmup_steps=0", "schedule.kind=constant",
                        "steps=12", "checkpoint_every=1", "checkpoint_keep=2", "eval_every=0"};
  run_dir(d, sizeof d, "diverge_stop");
  recorder r = {0};
  nb_train_result res;
  nb_status s = run_with(ctx, d, 8, base, &r, &res);
  CHECK_MSG(s == NB_ERR_NUMERIC, "lr=100 ended with %s, loss %g", nb_status_name(s), res.final_loss);
  CHECK_ERR(ctx, NB_ERR_NUMERIC, "not finite");
  int64_t last = latest_ckpt(ctx, d);
  CHECK_MSG(last >= 1 && last < 12 && res.final_step == last, "latest %lld, final %lld", (long long)last,
            (long long)res.final_step);
  /* what is left is finite */
  char ck[700];
  snprintf(ck, sizeof ck, "%s/checkpoints", d);
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = ck, .read_only = true});
  nb_tree *t = m ? nb_ckpt_restore(m, NB_CKPT_LATEST, NULL) : NULL;
  CHECK(t != NULL);
  for (size_t i = 0; t && i < nb_tree_size(t); i++) {
    const nb_array *a = nb_tree_leaf(t, i)->array;
    const float *p = nb_array_dtype(a) == NB_F32 ? nb_array_data(a) : NULL;
    for (int64_t k = 0; p && k < nb_array_size(a); k++)
      if (!isfinite(p[k])) {
        CHECK_MSG(false, "checkpoint %lld: '%s' is not finite", (long long)last, nb_tree_path(t, i));
        break;
      }
  }
  nb_tree_destroy(t);
  nb_ckpt_manager_destroy(m);
  /* skip: bad updates are dropped, the run ends with a finite state */
  const char *mode[9];
  memcpy(mode, base, sizeof base);
  mode[8] = "on_nonfinite=skip";
  run_dir(d, sizeof d, "diverge_skip");
  logbuf[0] = 0;
  CHECK_OK(ctx, run_with(ctx, d, 9, mode, NULL, &res));
  CHECK_MSG(strstr(logbuf, "update skipped"), "%s", logbuf);
  CHECK(res.final_step == 12 && latest_ckpt(ctx, d) == 12);
  /* continue: applied, but a non-finite state is never saved */
  mode[8] = "on_nonfinite=continue";
  run_dir(d, sizeof d, "diverge_cont");
  logbuf[0] = 0;
  CHECK_OK(ctx, run_with(ctx, d, 9, mode, NULL, &res));
  CHECK_MSG(strstr(logbuf, "not checkpointed"), "%s", logbuf);
  CHECK(latest_ckpt(ctx, d) < 12);
}

/* Item 6: a damaged newest step is set aside and the previous one used;
 * so is a step with a damaged commit marker. Both resume to the same
 * numbers as an undisturbed run. */
static void test_damaged_checkpoints(nb_ctx *ctx) {
  char ref[600], d[600], p[800];
  run_dir(ref, sizeof ref, "dmg_ref");
  const char *e10[] = {"steps=10", "eval_every=0", "schedule.kind=constant"};
  recorder a = {0};
  CHECK_OK(ctx, run_with(ctx, ref, 3, e10, &a, NULL));
  for (int kind = 0; kind < 2; kind++) {
    run_dir(d, sizeof d, kind ? "dmg_commit" : "dmg_data");
    const char *e8[] = {"steps=8", "eval_every=0", "schedule.kind=constant"};
    CHECK_OK(ctx, run_with(ctx, d, 3, e8, NULL, NULL));
    if (kind) {
      snprintf(p, sizeof p, "%s/checkpoints/step_00000008/COMMIT", d);
      nb_test_write_file(p, "{garbage", 8);
    } else {
      snprintf(p, sizeof p, "%s/checkpoints/step_00000008/params.00000.bin", d);
      nb_test_flip_byte(p, 200);
    }
    logbuf[0] = 0;
    recorder b = {0};
    nb_train_result res;
    CHECK_OK(ctx, run_with(ctx, d, 3, e10, &b, &res));
    CHECK_MSG(res.start_step == 6 && res.final_step == 10, "start %lld", (long long)res.start_step);
    CHECK_MSG(strstr(logbuf, "set aside as") && strstr(logbuf, "step_00000008.damaged"), "%s", logbuf);
    snprintf(p, sizeof p, "%s/checkpoints/step_00000008.damaged", d);
    CHECK(access(p, F_OK) == 0);
    for (int s = 7; s <= 10; s++) CHECK_MSG(a.loss[s] == b.loss[s], "step %d: %.9g vs %.9g", s, a.loss[s], b.loss[s]);
  }
  /* every checkpoint damaged: refused, not silently started over */
  run_dir(d, sizeof d, "dmg_all");
  const char *e6[] = {"steps=6", "eval_every=0", "schedule.kind=constant"};
  CHECK_OK(ctx, run_with(ctx, d, 3, e6, NULL, NULL));
  for (int st = 3; st <= 6; st += 3) {
    snprintf(p, sizeof p, "%s/checkpoints/step_%08d/params.00000.bin", d, st);
    nb_test_flip_byte(p, 100);
  }
  CHECK(run_with(ctx, d, 3, e10, NULL, NULL) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "every checkpoint in");
}

/* Item 7: a signal during set-up (here: on_start, the end of set-up) or
 * after the last step does not kill the process; the checkpoint is kept. */
static void on_start_raise(void *ud, const nb_train_start_info *in) {
  (void)ud;
  (void)in;
  raise(SIGTERM);
}

static void test_signals(nb_ctx *ctx) {
  nb_train_config cfg;
  const char *e4[] = {"steps=4", "eval_every=0", "schedule.kind=constant"};
  CHECK_OK(ctx, tiny_config(ctx, work, 3, e4, &cfg));
  char d[600];
  run_dir(d, sizeof d, "sig_setup");
  nb_train_opts o = {.run_dir = d, .threads = 1, .handle_signals = true, .on_start = on_start_raise};
  nb_train_result res;
  CHECK_OK(ctx, nb_train_run(ctx, &cfg, &o, &res));
  CHECK(res.preempted && res.final_step == 1 && latest_ckpt(ctx, d) == 1);
  /* SIGTERM in the last step's callback, while its checkpoint is written */
  run_dir(d, sizeof d, "sig_final");
  recorder r = {.raise_at = 4, .raise_sig = SIGTERM};
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &r, true, &res));
  CHECK(res.final_step == 4 && latest_ckpt(ctx, d) == 4);
}

/* Item 8: eval_steps beyond the eval data is an error naming the key. */
static void test_eval_steps(nb_ctx *ctx) {
  char d[600];
  run_dir(d, sizeof d, "evalsteps");
  const char *e[] = {"eval_steps=50"};
  CHECK(run_with(ctx, d, 1, e, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "eval_steps = 50, but the eval data");
}

int main(void) {
  make_workdir(work, sizeof work);
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, capture_log, NULL);
  test_refused_run_keeps_config(ctx);
  test_data_change_refused(ctx);
  test_formats_and_verification(ctx);
  test_cache_follows_tokenizer(ctx);
  test_cache_follows_dir_content(ctx);
  test_divergence(ctx);
  test_damaged_checkpoints(ctx);
  test_signals(ctx);
  test_eval_steps(ctx);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("train/safety");
}
