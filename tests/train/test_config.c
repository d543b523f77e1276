/* The YAML run configuration: every file in configs/ loads and validates;
 * overrides; presets apply before the other model keys; the writer's
 * output loads back to the same config; malformed files, unknown keys and
 * bad values give errors naming the file:line, the key path and what is
 * allowed. */
#include <dirent.h>

#include "test.h"

static nb_status parse(nb_ctx *ctx, const char *text, int n, const char *const *ov, nb_train_config *c) {
  return nb_train_config_parse(ctx, "t.yaml", text, strlen(text), n, ov, c);
}

static void test_checked_in_configs(nb_ctx *ctx) {
  DIR *d = opendir("configs");
  CHECK_MSG(d, "configs/ not found (run from the repository root)");
  if (!d) return;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".yaml")) continue;
    char path[512];
    snprintf(path, sizeof path, "configs/%s", e->d_name);
    nb_train_config c;
    nb_status s = nb_train_config_load(ctx, path, 0, NULL, &c);
    CHECK_MSG(s == NB_OK, "%s: %s", path, nb_ctx_error(ctx));
    /* the overrides every config must take */
    const char *ov[3] = {"steps=3", "seed=11", "checkpoint_every=2"};
    nb_train_config o;
    CHECK_MSG(nb_train_config_load(ctx, path, 3, ov, &o) == NB_OK && o.steps == 3 && o.seed == 11 &&
                  o.checkpoint_every == 2,
              "%s with overrides: %s", path, nb_ctx_error(ctx));
    /* the model named by the file is the preset's, and it can be traced */
    if (s == NB_OK) {
      nb_tree *spec = nb_model_param_spec(ctx, &c.model, c.precision.params);
      CHECK_MSG(spec && nb_nn_params_count(spec) > 0, "%s: %s", path, nb_ctx_error(ctx));
      printf("%-24s preset %-14s %14lld parameters\n", path, c.preset, (long long)nb_nn_params_count(spec));
      nb_tree_destroy(spec);
    }
    n++;
  }
  closedir(d);
  CHECK(n >= 8);
  nb_train_config c;
  CHECK_OK(ctx, nb_train_config_load(ctx, "configs/mixtral_tiny.yaml", 0, NULL, &c));
  CHECK(c.model.n_experts == 8 && c.model.top_k == 2 && c.model.z_loss_coef == 0.001 && c.model.capacity_factor == 0);
  CHECK(!strcmp(c.checkpoint_dir, "checkpoints/mixtral_tiny") && c.optim.name == NB_TRAIN_OPTIM_ADAMW);
}

static void test_overrides_and_defaults(nb_ctx *ctx) {
  nb_train_config c;
  const char *ov[] = {"steps=5", "seed=3", "checkpoint_every=7", "model.n_layers=2", "optim.lr=1e-2",
                      "model.act=gelu", "precision.compute=bf16", "remat=block", "data.train=x y.bin"};
  CHECK_OK(ctx, nb_train_config_load(ctx, "configs/llama_tiny.yaml", 9, ov, &c));
  CHECK(c.steps == 5 && c.seed == 3 && c.checkpoint_every == 7 && c.model.n_layers == 2 && c.optim.lr == 1e-2);
  CHECK(c.model.act == NB_NN_GELU && c.precision.compute == NB_BF16 && c.remat == NB_TRAIN_REMAT_BLOCK);
  CHECK(!strcmp(c.data.train, "x y.bin"));
  CHECK_OK(ctx, nb_train_config_load(ctx, NULL, 0, NULL, &c));
  CHECK(!strcmp(c.preset, "llama-tiny") && c.model.family == NB_MODEL_LLAMA);
  /* model.preset applies first wherever it is written */
  CHECK_OK(ctx, parse(ctx, "model:\n  n_layers: 3\n  preset: gpt2-tiny\n", 0, NULL, &c));
  CHECK(c.model.n_layers == 3 && c.model.family == NB_MODEL_GPT2 && c.model.learned_pos);
  /* an empty file is the defaults */
  CHECK_OK(ctx, parse(ctx, "", 0, NULL, &c));
  CHECK_OK(ctx, parse(ctx, "# nothing\n", 0, NULL, &c));
}

static void test_round_trip(nb_ctx *ctx) {
  nb_train_config c, d;
  CHECK_OK(ctx, nb_train_config_load(ctx, "configs/deepseek_tiny.yaml", 1, (const char *const[]){"data.eval=a\"b\\c"}, &c));
  char *t1 = NULL, *t2 = NULL;
  size_t n1 = 0, n2 = 0;
  FILE *f = open_memstream(&t1, &n1);
  nb_train_config_write(&c, f);
  fclose(f);
  CHECK_OK(ctx, parse(ctx, t1, 0, NULL, &d));
  f = open_memstream(&t2, &n2);
  nb_train_config_write(&d, f);
  fclose(f);
  CHECK_MSG(n1 == n2 && !memcmp(t1, t2, n1), "written config does not load back:\n%s\n---\n%s", t1, t2);
  CHECK(!strcmp(d.data.eval, "a\"b\\c") && d.model.n_shared_experts == 2 && d.model.router_score == NB_NN_SCORE_SIGMOID);
  free(t1);
  free(t2);
}

static void expect(nb_ctx *ctx, const char *text, const char *override, nb_status st, const char *needle) {
  nb_train_config c;
  const char *ov[1] = {override};
  nb_status s = parse(ctx, text, override ? 1 : 0, ov, &c);
  CHECK_MSG(s == st, "'%s' gave %s (%s)", text, nb_status_name(s), nb_ctx_error(ctx));
  CHECK_MSG(strstr(nb_ctx_error(ctx), needle), "'%s': message '%s' lacks '%s'", text, nb_ctx_error(ctx), needle);
  nb_ctx_clear_error(ctx);
}

static void test_errors(nb_ctx *ctx) {
  const nb_status A = NB_ERR_INVALID_ARG, F = NB_ERR_FORMAT;
  expect(ctx, "model:\n  n_layer: 2\n", NULL, A, "t.yaml:2: unknown key 'model.n_layer' (keys of model: preset, family, vocab_size");
  expect(ctx, "stepz: 3\n", NULL, A, "unknown key 'stepz' (keys of the top level: model, data, optim, schedule, precision, remat");
  expect(ctx, "trainer:\n  x: 1\n", NULL, A, "t.yaml:1: unknown key 'trainer' (keys of the top level: model, data");
  expect(ctx, "model:\n  act: swish\n", NULL, A, "t.yaml:2: model.act: 'swish' is not one of: gelu_tanh, gelu, relu, silu");
  expect(ctx, "model:\n  preset: gpt9\n", NULL, A, "t.yaml:2: model.preset: unknown preset 'gpt9'");
  expect(ctx, "steps: ten\n", NULL, A, "t.yaml:1: steps: 'ten' is not an integer");
  expect(ctx, "steps: -1\n", NULL, A, "steps: -1 is out of range");
  expect(ctx, "optim:\n  lr: nan\n", NULL, A, "optim.lr: 'nan' is not a finite number");
  expect(ctx, "optim:\n  b1: 1.5\n", NULL, A, "optim.b1: 1.5 is out of range [0, 0.999999]");
  expect(ctx, "data:\n  pack: maybe\n", NULL, A, "data.pack: 'maybe' is not a boolean");
  expect(ctx, "precision:\n  params: f16\n", NULL, A, "precision.params: 'f16' is not one of: f32, bf16");
  expect(ctx, "model: 3\n", NULL, F, "'model' is a section: it needs a mapping");
  expect(ctx, "steps:\n  a: 1\n", NULL, F, "'steps' takes a value, not a mapping");
  expect(ctx, "steps: [1, 2]\n", NULL, F, "t.yaml:1: 'steps' cannot be a list");
  expect(ctx, "steps: 1\nseed: 2\nsteps: 3\n", NULL, F, "t.yaml:3: duplicate key 'steps'");
  expect(ctx, "model: {d_model: 8\n", NULL, F, "t.yaml:2: YAML error");
  expect(ctx, "- a\n- b\n", NULL, F, "the top level must be a mapping");
  expect(ctx, "batch_size: 10\ngrad_accum: 3\n", NULL, A, "batch_size (10) must be a multiple of grad_accum (3)");
  expect(ctx, "model:\n  n_kv_heads: 3\n", NULL, A, "model.n_kv_heads (3) must divide model.n_heads (4)");
  expect(ctx, "data:\n  seq_len: 4096\n", NULL, A, "data.seq_len (4096) exceeds model.max_seq_len (128)");
  expect(ctx, "model:\n  n_experts: 4\n  top_k: 5\n  moe_d_ff: 8\n", NULL, A, "model.top_k (5) must be in [1, model.n_experts = 4]");
  expect(ctx, "model:\n  rope_scaling: llama3\n  rope_factor: 8\n", NULL, A, "model.rope:");
  expect(ctx, "", "steps", A, "override 'steps': expected key=value");
  expect(ctx, "", "model.heads=4", A, "override 'model.heads=4': unknown key 'model.heads'");
  expect(ctx, "", "schedule.kind=exp", A, "schedule.kind: 'exp' is not one of: constant, linear, cosine");
  nb_train_config c;
  CHECK(nb_train_config_load(ctx, "configs/no_such.yaml", 0, NULL, &c) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "configs/no_such.yaml: cannot open");
}

/* scan_layers: a top-level key (a resume does not compare it: checkpoints
 * are the same either way) that a preset does not reset; allowed with remat. */
static void test_scan_layers(nb_ctx *ctx) {
  nb_train_config rc;
  const char *yaml = "scan_layers: true\nmodel:\n  preset: gpt2-tiny\n";
  CHECK_OK(ctx, nb_train_config_parse(ctx, "t.yaml", yaml, strlen(yaml), 0, NULL, &rc));
  CHECK_MSG(rc.model.scan_layers, "scan_layers lost when the preset was applied");
  const char *bad = "scan_layers: maybe\n";
  CHECK(nb_train_config_parse(ctx, "t.yaml", bad, strlen(bad), 0, NULL, &rc) != NB_OK);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "scan_layers"), "the error names the key: %s", nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  /* with remat: block, each scanned layer is a remat region (MaxText's setup) */
  const char *both = "scan_layers: true\nremat: block\n";
  CHECK_OK(ctx, nb_train_config_parse(ctx, "t.yaml", both, strlen(both), 0, NULL, &rc));
  CHECK(rc.model.scan_layers && rc.remat == NB_TRAIN_REMAT_BLOCK);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_scan_layers(ctx);
  test_checked_in_configs(ctx);
  test_overrides_and_defaults(ctx);
  test_round_trip(ctx);
  test_errors(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("train/config");
}
