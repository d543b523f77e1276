/* nb_train_run on a tiny GPT and a tiny corpus: determinism, resume (after
 * a stop, after a SIGINT, after losing the newest checkpoints) bit-identical
 * to an uninterrupted run, with and without dropout, the loss going down,
 * grad_accum equal to the big-batch step, metrics.jsonl kept consistent,
 * and configuration errors that name what is wrong. */
#include <cjson/cJSON.h>
#include <signal.h>

#include "train_util.h"

static char work[256];

static void run_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", work, name); }

static bool same_losses(const recorder *a, const recorder *b, int64_t from, int64_t to) {
  bool ok = true;
  for (int64_t s = from; s <= to; s++)
    if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) || memcmp(&a->grad_norm[s], &b->grad_norm[s], sizeof(double))) {
      fprintf(stderr, "step %lld: loss %.9g vs %.9g, grad_norm %.9g vs %.9g\n", (long long)s, a->loss[s], b->loss[s],
              a->grad_norm[s], b->grad_norm[s]);
      ok = false;
    }
  return ok;
}

/* The "step" of every metrics.jsonl record in order ("eval" records as -step). */
static int read_metric_steps(const char *dir, int64_t *steps, int cap) {
  char p[600], line[4096];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  FILE *f = fopen(p, "r");
  int n = 0;
  while (f && fgets(line, sizeof line, f) && n < cap) {
    cJSON *j = cJSON_Parse(line);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    CHECK_MSG(cJSON_IsNumber(s), "bad record: %s", line);
    if (cJSON_IsNumber(s)) steps[n++] = cJSON_GetObjectItemCaseSensitive(j, "eval_loss") ? -(int64_t)s->valuedouble : (int64_t)s->valuedouble;
    cJSON_Delete(j);
  }
  if (f) fclose(f);
  return n;
}

static double first_loss[2]; /* without, with dropout */

static void test_determinism_and_resume(nb_ctx *ctx, bool dropout) {
  const char *extra[] = {"model.dropout=0.1", "model.attn_dropout=0.1"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, dropout ? 2 : 0, extra, &cfg));
  char d1[600], d2[600], d3[600];
  run_dir(d1, sizeof d1, dropout ? "drop_a" : "a");
  run_dir(d2, sizeof d2, dropout ? "drop_b" : "b");
  run_dir(d3, sizeof d3, dropout ? "drop_c" : "c");
  recorder a = {0}, b = {0}, c = {0};
  nb_train_result ra, rb, rc;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d1, &a, false, &ra));
  CHECK(ra.final_step == 8 && a.last_step == 8 && isfinite(ra.final_loss) && isfinite(ra.last_eval_loss));
  CHECK(a.n_eval == 2);
  first_loss[dropout] = a.loss[1];
  char cmd[2000];
  snprintf(cmd, sizeof cmd, "grep -q 'eval/loss' %s/events.out.tfevents.* && grep -q 'train/grad_norm' %s/events.out.tfevents.* && test -s %s/report.html", d1, d1, d1);
  CHECK_MSG(system(cmd) == 0, "%s", cmd);
  /* (a) same config and seed, fresh dir: bit-identical, also with 2 and 3
   * threads (losses and grad norms: the products are cut by shape, not by
   * the thread count) */
  b.threads = 2;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d2, &b, false, &rb));
  CHECK(same_losses(&a, &b, 1, 8));
  if (!dropout) {
    char d4[600];
    run_dir(d4, sizeof d4, "a3");
    recorder a3 = {.threads = 3};
    CHECK_OK(ctx, run_recorded(ctx, &cfg, d4, &a3, false, &rb));
    CHECK(same_losses(&a, &a3, 1, 8));
  }
  /* (b) stop after step 5 (a checkpoint is written), resume to 8 */
  c.stop_at = 5;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d3, &c, false, &rc));
  CHECK(rc.stopped && rc.final_step == 5 && latest_ckpt(ctx, d3) == 5);
  recorder c2 = {0};
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d3, &c2, false, &rc));
  CHECK_MSG(rc.start_step == 5 && rc.final_step == 8 && c2.first_step == 6, "start %lld final %lld",
            (long long)rc.start_step, (long long)rc.final_step);
  CHECK(same_losses(&a, &c, 1, 5));
  CHECK(same_losses(&a, &c2, 6, 8));
  int64_t steps[32];
  int n = read_metric_steps(d3, steps, 32);
  int64_t want[] = {2, 4, -4, 6, 8, -8};
  CHECK_MSG(n == 6 && !memcmp(steps, want, sizeof want), "%d records", n);
  /* a finished run resumed again does nothing */
  recorder c3 = {0};
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d3, &c3, false, &rc));
  CHECK(rc.steps_run == 0 && rc.final_step == 8 && read_metric_steps(d3, steps, 32) == 6);
}

/* (f) SIGINT during step 3: the trainer checkpoints the step it is at and
 * returns; resuming continues bit-identically. */
static void test_sigint(nb_ctx *ctx) {
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 0, NULL, &cfg));
  char d[600];
  run_dir(d, sizeof d, "sigint");
  recorder r = {0}, r2 = {0}, a = {0};
  nb_train_result res;
  char dfresh[600];
  run_dir(dfresh, sizeof dfresh, "sigint_ref");
  CHECK_OK(ctx, run_recorded(ctx, &cfg, dfresh, &a, false, &res));
  r.raise_at = 3;
  r.raise_sig = SIGINT;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &r, true, &res));
  CHECK_MSG(res.preempted && res.final_step == 4, "preempted %d final %lld", res.preempted, (long long)res.final_step);
  CHECK(latest_ckpt(ctx, d) == 4);
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &r2, true, &res));
  CHECK(!res.preempted && res.start_step == 4 && res.final_step == 8);
  CHECK(same_losses(&a, &r, 1, 4));
  CHECK(same_losses(&a, &r2, 5, 8));
}

/* The newest checkpoints lost (a crash after logging): resume from step 3
 * drops metrics records after 3 and writes them again. */
static void test_metrics_truncated(nb_ctx *ctx) {
  const char *extra[] = {"log_every=1", "checkpoint_keep=0"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 2, extra, &cfg));
  char d[600], cmd[1400];
  run_dir(d, sizeof d, "trunc");
  recorder a = {0}, b = {0};
  nb_train_result res;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &a, false, &res));
  snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoints/step_00000006 %s/checkpoints/step_00000008", d, d);
  CHECK(system(cmd) == 0);
  CHECK(latest_ckpt(ctx, d) == 3);
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &b, false, &res));
  CHECK(res.start_step == 3 && res.final_step == 8);
  CHECK(same_losses(&a, &b, 4, 8));
  int64_t steps[32];
  int n = read_metric_steps(d, steps, 32);
  int64_t want[] = {1, 2, 3, 4, -4, 5, 6, 7, 8, -8};
  CHECK_MSG(n == 10 && !memcmp(steps, want, sizeof want), "%d records", n);
}

/* (c) the loss goes down on the tiny corpus */
static void test_learns(nb_ctx *ctx) {
  const char *extra[] = {"steps=40", "eval_every=20", "checkpoint_every=0", "optim.lr=1e-2", "schedule.warmup_steps=4"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 5, extra, &cfg));
  char d[600];
  run_dir(d, sizeof d, "learn");
  recorder r = {0};
  nb_train_result res;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &r, false, &res));
  double last = (r.loss[36] + r.loss[37] + r.loss[38] + r.loss[39] + r.loss[40]) / 5;
  CHECK_MSG(last < 0.6 * r.loss[1] && res.last_eval_loss < 0.6 * r.loss[1], "loss %.4f -> %.4f, eval %.4f", r.loss[1],
            last, res.last_eval_loss);
  CHECK(latest_ckpt(ctx, d) == 40); /* the end of a run is always checkpointed */
}

/* (d) grad_accum = 2 and 4 equal the big-batch step (float rounding aside) */
static void test_grad_accum(nb_ctx *ctx) {
  /* eval_steps=1: the held-out windows make one batch of 8 */
  const char *e1[] = {"steps=4", "checkpoint_every=0", "batch_size=8", "eval_steps=1"};
  const char *e2[] = {"steps=4", "checkpoint_every=0", "batch_size=8", "eval_steps=1", "grad_accum=2"};
  const char *e4[] = {"steps=4", "checkpoint_every=0", "batch_size=8", "eval_steps=1", "grad_accum=4"};
  nb_train_config c1, c2, c4;
  CHECK_OK(ctx, tiny_config(ctx, work, 4, e1, &c1));
  CHECK_OK(ctx, tiny_config(ctx, work, 5, e2, &c2));
  CHECK_OK(ctx, tiny_config(ctx, work, 5, e4, &c4));
  char d1[600], d2[600], d4[600];
  run_dir(d1, sizeof d1, "acc1");
  run_dir(d2, sizeof d2, "acc2");
  run_dir(d4, sizeof d4, "acc4");
  recorder r1 = {0}, r2 = {0}, r4 = {0};
  nb_train_result res;
  CHECK_OK(ctx, run_recorded(ctx, &c1, d1, &r1, false, &res));
  CHECK_OK(ctx, run_recorded(ctx, &c2, d2, &r2, false, &res));
  CHECK_OK(ctx, run_recorded(ctx, &c4, d4, &r4, false, &res));
  CHECK_NEAR(r2.loss[1], r1.loss[1], 1e-6);
  CHECK_NEAR(r4.loss[1], r1.loss[1], 1e-6);
  CHECK_NEAR(r2.grad_norm[1], r1.grad_norm[1], 1e-5);
  CHECK_NEAR(r4.grad_norm[1], r1.grad_norm[1], 1e-5);
  for (int s = 2; s <= 4; s++) {
    CHECK_NEAR(r2.loss[s], r1.loss[s], 1e-4);
    CHECK_NEAR(r4.loss[s], r1.loss[s], 1e-4);
  }
  /* and they are not trivially equal to a different batch: step 2 saw new data */
  CHECK(r1.loss[2] != r1.loss[1]);
  printf("grad_accum: step 1 loss %a %a %a gnorm %a %a %a; step 4 loss %.9g (1), %.9g (2), %.9g (4)\n", r1.loss[1], r2.loss[1], r4.loss[1], r1.grad_norm[1], r2.grad_norm[1], r4.grad_norm[1], r1.loss[4], r2.loss[4], r4.loss[4]);
}

/* remat: block recomputes the blocks in the backward pass: same numbers */
static void test_remat(nb_ctx *ctx) {
  const char *e0[] = {"steps=3", "checkpoint_every=0", "model.n_layers=2"};
  const char *e1[] = {"steps=3", "checkpoint_every=0", "model.n_layers=2", "remat=block"};
  nb_train_config c0, c1;
  CHECK_OK(ctx, tiny_config(ctx, work, 3, e0, &c0));
  CHECK_OK(ctx, tiny_config(ctx, work, 4, e1, &c1));
  CHECK(c1.remat == NB_TRAIN_REMAT_BLOCK);
  char d0[600], d1[600];
  run_dir(d0, sizeof d0, "remat0");
  run_dir(d1, sizeof d1, "remat1");
  recorder r0 = {0}, r1 = {0};
  nb_train_result res;
  CHECK_OK(ctx, run_recorded(ctx, &c0, d0, &r0, false, &res));
  CHECK_OK(ctx, run_recorded(ctx, &c1, d1, &r1, false, &res));
  /* and the remat graph is another graph (the blocks are recomputed) */
  nb_optim_tx *tx = nb_train_optimizer(ctx, &c0);
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &c0.model, key), *opt = NULL;
  nb_array_release(key);
  if (tx && params) opt = nb_optim_init_arrays(ctx, tx, params);
  nb_graph *g0 = opt ? nb_train_trace_step(ctx, &c0, params, opt) : NULL;
  nb_graph *g1 = opt ? nb_train_trace_step(ctx, &c1, params, opt) : NULL;
  CHECK(g0 && g1 && nb_graph_num_eqns(g0) != nb_graph_num_eqns(g1));
  nb_graph_destroy(g0);
  nb_graph_destroy(g1);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  nb_optim_tx_destroy(tx);
  for (int s = 1; s <= 3; s++) {
    CHECK_NEAR(r1.loss[s], r0.loss[s], 1e-6);
    CHECK_NEAR(r1.grad_norm[s], r0.grad_norm[s], 1e-5);
  }
}

/* Token shards as data.train / data.eval, used as they are (no DIR/data/). */
static void test_shard_inputs(nb_ctx *ctx) {
  char corpus[600], shard[600], tr[700], ev[700], d[600], cache[700];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
  snprintf(shard, sizeof shard, "%s/corpus.tshard", work);
  const char *in[1] = {corpus};
  CHECK_OK(ctx, nb_data_build_shard(ctx, shard, 1, in, NULL, NULL, 0, NULL));
  snprintf(tr, sizeof tr, "data.train=%s", shard);
  snprintf(ev, sizeof ev, "data.eval=%s", shard);
  const char *extra[] = {tr, ev, "steps=4", "data.workers=0"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 4, extra, &cfg));
  run_dir(d, sizeof d, "shard");
  recorder r = {0};
  nb_train_result res;
  CHECK_OK(ctx, run_recorded(ctx, &cfg, d, &r, false, &res));
  CHECK(res.final_step == 4 && isfinite(res.last_eval_loss) && r.n_eval == 1);
  snprintf(cache, sizeof cache, "%s/data", d);
  CHECK(access(cache, F_OK) != 0);
}

static void test_errors(nb_ctx *ctx) {
  nb_train_config cfg;
  char d[600];
  run_dir(d, sizeof d, "err");
  nb_train_opts o = {.run_dir = d, .threads = 1};
  const char *missing[] = {"data.train=/nonexistent/nabla.txt"};
  CHECK_OK(ctx, tiny_config(ctx, work, 1, missing, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "data.train: '/nonexistent/nabla.txt'");
  const char *bf16[] = {"precision.compute=bf16"};
  CHECK_OK(ctx, tiny_config(ctx, work, 1, bf16, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "precision.compute=bf16");
  const char *vocab[] = {"model.vocab_size=100"};
  CHECK_OK(ctx, tiny_config(ctx, work, 1, vocab, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "more than model.vocab_size 100");
  CHECK_OK(ctx, tiny_config(ctx, work, 0, NULL, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &(nb_train_opts){0}, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "run_dir");
  /* FSDP in one process: no axis 'fsdp' of 2 processes bound on the context */
  const char *fsdp[] = {"mesh.fsdp=2", "grad_accum=2"};
  CHECK_OK(ctx, tiny_config(ctx, work, 2, fsdp, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.fsdp=2 needs the mesh axis 'fsdp' bound to 2 processes");
  const char *accum[] = {"mesh.fsdp=2", "mesh.data=2", "grad_accum=2"};
  CHECK(tiny_config(ctx, work, 3, accum, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "grad_accum (2) must be a multiple of mesh.data x mesh.fsdp x mesh.expert (2 x 2 x 1)");
  /* expert parallel: refused with the keys and numbers named */
  const char *dense_ep[] = {"mesh.expert=2", "grad_accum=2"};
  CHECK(tiny_config(ctx, work, 2, dense_ep, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.expert (2) needs a mixture-of-experts model: model.n_experts is 0");
  const char *moe = "model.preset=mixtral-tiny";
  const char *uneven[] = {moe, "model.n_experts=6", "model.capacity_factor=3", "mesh.expert=4", "grad_accum=4"};
  CHECK(tiny_config(ctx, work, 5, uneven, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.n_experts (6) must be a multiple of mesh.expert (4)");
  const char *dropless[] = {moe, "model.capacity_factor=0", "mesh.expert=2", "grad_accum=2"};
  CHECK(tiny_config(ctx, work, 4, dropless, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.expert (2) needs model.capacity_factor > 0 (it is 0");
  const char *with_fsdp[] = {moe, "model.capacity_factor=4", "mesh.expert=2", "mesh.fsdp=2", "grad_accum=4"};
  CHECK(tiny_config(ctx, work, 5, with_fsdp, &cfg) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "mesh.expert (2) with mesh.fsdp (2) is not supported yet");
  const char *accum_ep[] = {moe, "model.capacity_factor=4", "mesh.expert=2", "mesh.data=2", "grad_accum=2"};
  CHECK(tiny_config(ctx, work, 5, accum_ep, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.data x mesh.fsdp x mesh.expert (2 x 1 x 2)");
  const char *unbound[] = {moe, "model.capacity_factor=4", "mesh.expert=2", "grad_accum=2"};
  CHECK_OK(ctx, tiny_config(ctx, work, 4, unbound, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.expert=2 needs the mesh axis 'expert' bound to 2 processes");
  /* tensor parallel: in one process no axis 'tensor'; heads, kv heads and d_ff must divide; no FSDP with it */
  const char *tensor[] = {"mesh.tensor=2"};
  CHECK_OK(ctx, tiny_config(ctx, work, 1, tensor, &cfg));
  CHECK(nb_train_run(ctx, &cfg, &o, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.tensor=2 needs the mesh axis 'tensor' bound to 2 processes");
  const char *heads[] = {"mesh.tensor=3"};
  CHECK(tiny_config(ctx, work, 1, heads, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.tensor=3 must divide model.n_heads (2), model.n_kv_heads (2)");
  const char *kv[] = {"model.n_kv_heads=1", "mesh.tensor=2"};
  CHECK(tiny_config(ctx, work, 2, kv, &cfg) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.n_kv_heads (1)");
  const char *both[] = {"mesh.tensor=2", "mesh.fsdp=2", "grad_accum=2"};
  CHECK(tiny_config(ctx, work, 3, both, &cfg) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "mesh.tensor=2 with mesh.fsdp > 1 is not supported yet");
  const char *adrop[] = {"mesh.tensor=2", "model.attn_dropout=0.1"};
  CHECK(tiny_config(ctx, work, 2, adrop, &cfg) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "model.attn_dropout > 0");
}

/* The MFU peak: $NABLA_PEAK_GFLOPS wins; otherwise the measured peak
 * (tests/prof/test_peak checks it), more threads never much lower. */
static void test_peak_estimate(void) {
  setenv("NABLA_PEAK_GFLOPS", "123.5", 1);
  CHECK_MSG(nb_train_peak_flops_estimate(7) == 123.5e9, "%g", nb_train_peak_flops_estimate(7));
  unsetenv("NABLA_PEAK_GFLOPS");
  double one = nb_train_peak_flops_estimate(1), four = nb_train_peak_flops_estimate(4);
  CHECK_MSG(one > 1e8 && four >= 0.5 * one, "1 thread %g, 4 threads %g", one, four);
}

int main(void) {
  make_workdir(work, sizeof work);
  test_peak_estimate();
  nb_ctx *ctx = nb_ctx_create();
  test_determinism_and_resume(ctx, false);
  test_determinism_and_resume(ctx, true);
  CHECK_MSG(first_loss[0] != first_loss[1], "dropout changed nothing: %.9g", first_loss[0]);
  test_sigint(ctx);
  test_metrics_truncated(ctx);
  test_learns(ctx);
  test_grad_accum(ctx);
  test_remat(ctx);
  test_shard_inputs(ctx);
  test_errors(ctx);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("train/train");
}
