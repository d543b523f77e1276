/* The step planner (nb_train_plan_make, `nabla plan`): parameter counts,
 * model FLOPs and one layout's bytes, times and memory against numbers
 * worked out by hand below; the chip table; the command's table, JSON and
 * errors (unknown chip, a chip count no mesh fits, missing flags). */
#include <cjson/cJSON.h>

#include "testfs.h"

/* gpt2-tiny, counted by hand: embeddings 256x128 + 128x128 positions;
 * per block 2 LayerNorms (2 x 256), attention 4 x (128x128 + 128),
 * MLP 128x512 + 512 + 512x128 + 128 = 198272; 4 blocks; final norm 256; tied head */
#define TINY_PARAMS (32768 + 16384 + 4 * 198272 + 256)

static const char tiny_yaml[] = "model:\n  preset: gpt2-tiny\nbatch_size: 16\ngrad_accum: 2\ndata:\n  seq_len: 128\n";

static void load(nb_ctx *ctx, const char *yaml, nb_train_config *cfg) {
  CHECK_OK(ctx, nb_train_config_parse(ctx, "plan.yaml", yaml, strlen(yaml), 0, NULL, cfg));
}

static void test_counts(nb_ctx *ctx) {
  nb_train_config cfg;
  /* gpt2-124m: 124439808 parameters (Hugging Face's count); one row of 1024:
   * 6 N T + 12 L H hd T^2 */
  CHECK_OK(ctx, nb_train_config_parse(ctx, "p.yaml", "", 0, 3,
                                      (const char *const[]){"model.preset=gpt2-124m", "batch_size=1", "data.seq_len=1024"}, &cfg));
  nb_tree *spec = nb_model_param_spec(ctx, &cfg.model, NB_F32);
  CHECK(spec && nb_train_active_params(&cfg, spec) == 124439808);
  CHECK_NEAR(nb_train_model_flops(&cfg, 124439808), 6.0 * 124439808 * 1024 + 12.0 * 12 * 12 * 64 * 1024.0 * 1024, 1e-15);
  CHECK_NEAR(nb_train_model_flops(&cfg, 124439808), 880522297344.0, 1e-15);
  nb_tree_destroy(spec);
  /* Mixtral 8x7B: 46702792704 in all; a token runs 2 of the 8 experts of each
   * of 32 layers, each expert 3 x 4096 x 14336: 6 of 8 x 32 x 3 x 4096 x 14336 idle */
  CHECK_OK(ctx, nb_train_config_parse(ctx, "p.yaml", "", 0, 1, (const char *const[]){"model.preset=mixtral-8x7b"}, &cfg));
  spec = nb_model_param_spec(ctx, &cfg.model, NB_F32);
  CHECK(spec && nb_nn_params_count(spec) == 46702792704LL);
  int64_t active = spec ? nb_train_active_params(&cfg, spec) : 0;
  CHECK_MSG(active == 46702792704LL - 6LL * 32 * 3 * 4096 * 14336, "mixtral active %lld", (long long)active);
  nb_tree_destroy(spec);
}

static nb_train_chip test_chip(void) {
  nb_train_chip c = {.peak_flops_bf16 = 1e12, .peak_flops_f32 = 1e12, .mem_bytes = 1e9, .link_bytes_per_s = 1e9,
                     .node_link_bytes_per_s = 1e9, .efficiency = 0.5};
  snprintf(c.name, sizeof c.name, "test");
  return c;
}

static const nb_train_plan_layout *find(const nb_train_plan *p, int64_t d, int64_t f, int64_t t, int64_t e) {
  for (int i = 0; i < p->n_layouts; i++) {
    const nb_train_plan_layout *l = &p->layouts[i];
    if (l->data == d && l->fsdp == f && l->tensor == t && l->expert == e) return l;
  }
  return NULL;
}

/* gpt2-tiny, batch 16 x 128, grad_accum 2, on 2 chips of 1 TFLOP/s at
 * efficiency 0.5 with 1 GB/s links, no overlap, no HBM roof */
static void test_layouts(nb_ctx *ctx) {
  nb_train_config cfg;
  load(ctx, tiny_yaml, &cfg);
  nb_train_chip chip = test_chip();
  nb_train_plan p;
  CHECK_OK(ctx, nb_train_plan_make(ctx, &cfg, &chip, 2, &p));
  const double P = TINY_PARAMS;
  CHECK(p.n_params == TINY_PARAMS && p.active_params == TINY_PARAMS);
  /* 6 P tokens + 12 L H hd T tokens, tokens = 2048 */
  double F = 6.0 * P * 2048 + 12.0 * 4 * 4 * 32 * 128 * 2048;
  CHECK_NEAR(p.model_flops, F, 1e-15);
  CHECK_NEAR(p.model_flops, 11963203584.0, 1e-15);
  /* data 2 / fsdp 2 / tensor 2 (4 heads, d_ff 512 divide by 2); no expert axis (dense) */
  CHECK_MSG(p.n_layouts == 3, "%d layouts", p.n_layouts);
  const nb_train_plan_layout *dp = find(&p, 2, 1, 1, 1), *fs = find(&p, 1, 2, 1, 1), *tp = find(&p, 1, 1, 2, 1);
  CHECK(dp && fs && tp);
  if (dp && fs && tp) {
    /* data=2: one micro-batch of 8 rows each; compute F / 2 chips / (1e12 x 0.5) */
    CHECK(dp->micro_batches == 1 && dp->micro_rows == 8);
    CHECK_NEAR(dp->compute_s, F / 1e12, 1e-12);
    /* the gradient all-reduce: 2 (n-1)/n x 4 P bytes */
    CHECK_NEAR(dp->dp_bytes, 4.0 * P, 1e-12);
    CHECK(dp->fsdp_bytes == 0 && dp->tp_bytes == 0 && dp->ep_bytes == 0);
    CHECK_NEAR(dp->step_s, F / 1e12 + 4.0 * P / 1e9, 1e-12);
    CHECK_NEAR(dp->step_s, 0.015333187584, 1e-9);
    CHECK_NEAR(dp->mfu, F / (dp->step_s * 2 * 1e12), 1e-12);
    /* memory: params + grads + 2 Adam moments (16 P bytes) and the activations
     * of 1024 tokens: 4 blocks x (4d + qd + kvd + H T + qd + 2 ff) = 10240 f32,
     * f32 logits and gradient 2 x 256 x 4, the embedding output 128 x 4 */
    CHECK_NEAR(dp->act_bytes, 1024.0 * (10240 * 4 + 2048 + 512), 1e-12);
    CHECK_NEAR(dp->mem_bytes, 16.0 * P + 44564480.0, 1e-12);
    CHECK(dp->fits);
    CHECK(!dp->note[0]);
    /* fsdp=2: two all-gathers (forward, backward) and one reduce-scatter of
     * (n-1)/n x 4 P bytes; half the state, all gathered weights kept (no remat) */
    CHECK_NEAR(fs->fsdp_bytes, 2 * 0.5 * 4 * P + 0.5 * 4 * P, 1e-12);
    CHECK(fs->dp_bytes == 0);
    CHECK_NEAR(fs->param_bytes + fs->grad_bytes + fs->opt_bytes, 8.0 * P, 1e-12);
    CHECK_NEAR(fs->gathered_bytes, 4.0 * P, 1e-12);
    /* tensor=2: both micro-batches of 8 rows on each chip; per block 4
     * all-reduces of [1024, 128] f32, each 2 (n-1)/n x 512 KiB */
    CHECK(tp->micro_batches == 2 && tp->micro_rows == 8);
    CHECK_NEAR(tp->tp_bytes, 2.0 * 4 * 4 * 1024 * 128 * 4, 1e-12);
    CHECK(!tp->note[0]); /* nabla train runs it */
    /* sorted: fastest first; the best fits */
    for (int i = 1; i < p.n_layouts; i++) CHECK(p.layouts[i - 1].step_s <= p.layouts[i].step_s);
    CHECK(p.best == 0);
  }
  nb_train_plan_free(&p);

  /* overlap hides the all-reduce behind compute; remat=block adds the forward again */
  chip.overlap = true;
  CHECK_OK(ctx, nb_train_plan_make(ctx, &cfg, &chip, 2, &p));
  dp = find(&p, 2, 1, 1, 1);
  CHECK(dp && dp->exposed_comm_s == 0 && dp->step_s == dp->compute_s);
  nb_train_plan_free(&p);
  cfg.remat = NB_TRAIN_REMAT_BLOCK;
  CHECK_OK(ctx, nb_train_plan_make(ctx, &cfg, &chip, 2, &p));
  CHECK_NEAR(p.hw_flops, F * 8 / 6, 1e-12);
  CHECK_NEAR(p.model_flops, F, 1e-15);
  nb_train_plan_free(&p);

  /* nothing fits in 1 MB: best is -1, every layout flagged */
  cfg.remat = NB_TRAIN_REMAT_NONE;
  chip.mem_bytes = 1e6;
  CHECK_OK(ctx, nb_train_plan_make(ctx, &cfg, &chip, 2, &p));
  CHECK(p.best == -1);
  for (int i = 0; i < p.n_layouts; i++) CHECK(!p.layouts[i].fits);
  nb_train_plan_free(&p);

  /* 7 chips: 7 divides neither the heads nor the batch of 16 */
  chip.mem_bytes = 1e9;
  CHECK(nb_train_plan_make(ctx, &cfg, &chip, 7, &p) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "--chips 7");
  CHECK(nb_train_plan_make(ctx, &cfg, &chip, 0, &p) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "--chips");
  chip.link_bytes_per_s = 0;
  CHECK(nb_train_plan_make(ctx, &cfg, &chip, 2, &p) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "--link-gbs");
}

/* MoE: an expert axis appears, its all_to_all bytes per MoE layer */
static void test_expert(nb_ctx *ctx) {
  nb_train_config cfg;
  load(ctx, "model:\n  preset: mixtral-tiny\nbatch_size: 16\ngrad_accum: 2\ndata:\n  seq_len: 128\n", &cfg);
  nb_train_chip chip = test_chip();
  nb_train_plan p;
  CHECK_OK(ctx, nb_train_plan_make(ctx, &cfg, &chip, 2, &p));
  const nb_train_plan_layout *ep = find(&p, 1, 1, 1, 2);
  CHECK(ep != NULL);
  if (ep) {
    /* 1 micro-batch of 8 rows; 4 all_to_all per MoE layer of (n-1)/n x tokens x top_k x d x 4 bytes */
    double a2a = 0.5 * 1024 * (double)cfg.model.top_k * (double)cfg.model.d_model * 4;
    CHECK_NEAR(ep->ep_bytes, 4.0 * (double)(cfg.model.n_layers - cfg.model.first_dense_layers) * a2a, 1e-12);
    CHECK(strstr(ep->note, "expert parallel needs model.capacity_factor > 0")); /* the preset is dropless */
  }
  const nb_train_plan_layout *tp = find(&p, 1, 1, 2, 1);
  if (tp) CHECK(strstr(tp->note, "tensor parallel not with MoE"));
  nb_train_plan_free(&p);
}

static void test_chips(nb_ctx *ctx) {
  nb_train_chip c;
  CHECK_OK(ctx, nb_train_chip_spec(ctx, "h100", 8, &c));
  CHECK(c.peak_flops_bf16 == 989e12 && c.mem_bytes == 80e9 && c.chips_per_node == 8 && c.overlap);
  CHECK_OK(ctx, nb_train_chip_spec(ctx, "tpu-v5p", 64, &c));
  CHECK(c.peak_flops_bf16 == 459e12 && c.mem_bytes == 95e9);
  setenv("NABLA_PEAK_GFLOPS", "10", 1); /* no measurement in a unit test */
  setenv("NABLA_PEAK_GBPS", "4", 1);
  CHECK_OK(ctx, nb_train_chip_spec(ctx, "cpu:this", 2, &c));
  CHECK(c.peak_flops_f32 == 10e9 && c.hbm_bytes_per_s == 4e9 && c.link_bytes_per_s == 2e9 && !c.overlap && c.mem_bytes > 0);
  CHECK(nb_train_chip_spec(ctx, "a100", 1, &c) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "unknown chip 'a100' (known: h100, tpu-v5p, cpu:this, custom)");
}

static char out[1 << 18], err[1 << 16], work[512];

static int plan(const char *bin, const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && NABLA_PEAK_GFLOPS=10 NABLA_PEAK_GBPS=4 %s plan %s </dev/null", work, bin, args);
  return nb_test_run2(cmd, out, sizeof out, err, sizeof err);
}

static void test_cli(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return;
  nb_test_scratch_dir(work, sizeof work, "train", "plan");
  char path[600];
  snprintf(path, sizeof path, "%s/tiny.yaml", work);
  nb_test_write_text(path, tiny_yaml);
  /* the table: 6 layouts of 4 chips, the best marked */
  int rc = plan(bin, "tiny.yaml --chips 4 --chip-spec h100");
  CHECK_MSG(rc == 0 && strstr(out, "\n* ") && strstr(out, "data fsdp tensor expert") && strstr(out, "NVIDIA H100"),
            "rc %d: %s%s", rc, out, err);
  int rows = 0;
  for (const char *s = strstr(out, "data fsdp tensor expert"); s && (s = strchr(s, '\n')) && s[1]; s++)
    rows += s[1] == '*' || s[1] == ' ' || s[1] == '!';
  CHECK_MSG(rows == 6, "%d rows: %s", rows, out);
  /* --json: the same layouts, best first, numbers for machines */
  rc = plan(bin, "tiny.yaml batch_size=32 --chips 4 --chip-spec custom --peak-tflops 1 --hbm-gbs 0 --mem-gib 1 --link-gbs 1 --json");
  cJSON *j = rc == 0 ? cJSON_Parse(out) : NULL;
  CHECK_MSG(j, "rc %d: %s%s", rc, out, err);
  const cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "layouts");
  CHECK(cJSON_GetArraySize(ls) == 6);
  CHECK(cJSON_GetObjectItemCaseSensitive(j, "best") && cJSON_GetObjectItemCaseSensitive(j, "best")->valueint == 0);
  const cJSON *first = cJSON_GetArrayItem(ls, 0);
  CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(first, "best")));
  const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(j, "tokens_per_step");
  CHECK(cJSON_IsNumber(tokens) && tokens->valuedouble == 32 * 128);
  cJSON_Delete(j);
  /* cpu:this reads the (here: given) peaks */
  rc = plan(bin, "tiny.yaml --chips 2 --chip-spec cpu:this");
  CHECK_MSG(rc == 0 && strstr(out, "env NABLA_PEAK_GFLOPS") && strstr(out, "(no overlap)"), "rc %d: %s%s", rc, out, err);
  /* bad input: clear errors naming the flag */
  struct {
    const char *args, *want;
  } bad[] = {
      {"tiny.yaml --chips 4 --chip-spec a100", "unknown chip 'a100'"},
      {"tiny.yaml --chip-spec h100", "--chips N is required"},
      {"tiny.yaml --chips 4", "--chip-spec is required"},
      {"tiny.yaml --chips 7 --chip-spec h100", "--chips 7: no mesh"},
      {"tiny.yaml --chips 7 --chip-spec h100", "tensor=7 does not divide n_heads 4"},
      {"tiny.yaml --chips 7 --chip-spec h100", "batch_size 16 is not divisible by data x fsdp x expert = 7"},
      {"tiny.yaml --chips 0 --chip-spec h100", "--chips"},
      {"tiny.yaml --chips four --chip-spec h100", "--chips"},
      {"tiny.yaml --chips 2 --chip-spec custom --peak-tflops 1 --hbm-gbs 1 --mem-gib 1", "needs --link-gbs"},
      {"tiny.yaml --chips 2 --chip-spec h100 --efficiency 2", "--efficiency"},
      {"tiny.yaml --chips 2 --chip-spec h100 model.n_heads=x", "model.n_heads"},
      {"missing.yaml --chips 2 --chip-spec h100", "missing.yaml"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rc = plan(bin, bad[i].args);
    CHECK_MSG(rc != 0 && strstr(err, bad[i].want) && !strstr(err, "Segmentation"), "'%s': rc %d, stderr '%s'", bad[i].args,
              rc, err);
  }
  nb_test_rm_rf(work);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_counts(ctx);
  test_layouts(ctx);
  test_expert(ctx);
  test_chips(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  test_cli();
  return nb_test_summary("train/plan");
}
