/* init_from: a run that starts from a Hugging Face directory (GPT-2 and
 * Qwen2 layouts, written here by hand, not by nabla's own table), from a run
 * dir, from a checkpoint step and from an imported checkpoint has, at its
 * first step, exactly the loss of a fresh run whose seed gives the same
 * parameters (the loss of step 1 is the loss of the parameters it starts
 * from). Also: a model key that disagrees with the source, a Mistral window
 * shorter than seq_len, a resumed init_from run that needs only the
 * source's config.json, and the `nabla ckpt import` + `nabla train` of the
 * issue (a weights-only checkpoint in the run dir) are errors that say what
 * to do. */
#include <cjson/cJSON.h>
#include <signal.h>

#include "train_util.h"

static char work[256];

/* ---------------------------------------------------------------- HF folders written by hand */

static void put(nb_ctx *ctx, nb_tree *t, const char *name, nb_array *a) {
  CHECK_OK(ctx, nb_tree_set_array(t, name, a));
  nb_array_release(a);
}
static nb_array *get(const nb_tree *p, const char *path) {
  nb_array *a = nb_tree_get_array(p, path);
  CHECK_MSG(a != NULL, "no parameter %s", path);
  nb_array_retain(a);
  return a;
}
/* PyTorch's nn.Linear layout: [out, in] */
static nb_array *linear(nb_ctx *ctx, const nb_tree *p, const char *path) {
  return nb_array_transpose2d(ctx, nb_tree_get_array(p, path));
}
/* GPT-2's c_attn: [q | k | v] along the last axis */
static nb_array *fused(nb_ctx *ctx, const nb_tree *p, const char *layer, const char *leaf) {
  const char *w[3] = {"wq", "wk", "wv"};
  nb_array *x[3];
  for (int k = 0; k < 3; k++) {
    char path[128];
    snprintf(path, sizeof path, "%s/attn/%s/%s", layer, w[k], leaf);
    x[k] = nb_tree_get_array(p, path);
  }
  nb_aval av = nb_array_aval(x[0]);
  int64_t n = av.shape.dims[av.shape.rank - 1], rows = nb_shape_size(&av.shape) / n;
  int64_t dims[2] = {rows, 3 * n};
  float *buf = malloc(sizeof(float) * (size_t)(rows * 3 * n));
  for (int k = 0; k < 3; k++)
    for (int64_t r = 0; r < rows; r++)
      memcpy(buf + r * 3 * n + k * n, (const float *)nb_array_data(x[k]) + r * n, sizeof(float) * (size_t)n);
  nb_array *y = av.shape.rank == 1 ? nb_array_create(ctx, NB_F32, 1, dims + 1, buf) : nb_array_create(ctx, NB_F32, 2, dims, buf);
  free(buf);
  return y;
}

static void write_json(const char *dir, const cJSON *j) {
  char p[700];
  snprintf(p, sizeof p, "%s/config.json", dir);
  char *text = cJSON_Print(j);
  nb_test_write_text(p, text);
  free(text);
}

static void write_gpt2(nb_ctx *ctx, const nb_model_config *c, const nb_tree *p, const char *dir) {
  mkdir(dir, 0777);
  nb_tree *t = nb_tree_create(ctx);
  put(ctx, t, "transformer.wte.weight", get(p, "embed/embedding"));
  put(ctx, t, "transformer.wpe.weight", get(p, "pos_embed/embedding"));
  for (int64_t l = 0; l < c->n_layers; l++) {
    char L[32], n[128], q[128];
    snprintf(L, sizeof L, "layers/%lld", (long long)l);
    const char *map[][2] = {{"ln_1.weight", "attn_norm/scale"}, {"ln_1.bias", "attn_norm/bias"},
                            {"ln_2.weight", "mlp_norm/scale"},  {"ln_2.bias", "mlp_norm/bias"},
                            {"attn.c_proj.weight", "attn/wo/kernel"}, {"attn.c_proj.bias", "attn/wo/bias"},
                            {"mlp.c_fc.weight", "mlp/wi/kernel"}, {"mlp.c_fc.bias", "mlp/wi/bias"},
                            {"mlp.c_proj.weight", "mlp/wo/kernel"}, {"mlp.c_proj.bias", "mlp/wo/bias"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
      snprintf(n, sizeof n, "transformer.h.%lld.%s", (long long)l, map[i][0]);
      snprintf(q, sizeof q, "%s/%s", L, map[i][1]);
      put(ctx, t, n, get(p, q)); /* Conv1D weights are [in, out] like nabla's kernels */
    }
    snprintf(n, sizeof n, "transformer.h.%lld.attn.c_attn.weight", (long long)l);
    put(ctx, t, n, fused(ctx, p, L, "kernel"));
    snprintf(n, sizeof n, "transformer.h.%lld.attn.c_attn.bias", (long long)l);
    put(ctx, t, n, fused(ctx, p, L, "bias"));
  }
  put(ctx, t, "transformer.ln_f.weight", get(p, "final_norm/scale"));
  put(ctx, t, "transformer.ln_f.bias", get(p, "final_norm/bias"));
  char path[700];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, path, t, "{\"format\":\"pt\"}", NULL));
  nb_tree_destroy(t);
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "model_type", "gpt2");
  cJSON_AddNumberToObject(j, "n_embd", (double)c->d_model);
  cJSON_AddNumberToObject(j, "n_layer", (double)c->n_layers);
  cJSON_AddNumberToObject(j, "n_head", (double)c->n_heads);
  cJSON_AddNumberToObject(j, "n_inner", (double)c->d_ff);
  cJSON_AddNumberToObject(j, "n_positions", (double)c->max_seq_len);
  cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
  cJSON_AddNumberToObject(j, "layer_norm_epsilon", c->norm_eps);
  cJSON_AddStringToObject(j, "activation_function", "gelu_new");
  write_json(dir, j);
  cJSON_Delete(j);
}

/* Qwen2 (q/k/v biases, tied embeddings), or Mistral with `window` > 0 */
static void write_qwen2(nb_ctx *ctx, const nb_model_config *c, const nb_tree *p, const char *dir, int64_t window) {
  mkdir(dir, 0777);
  nb_tree *t = nb_tree_create(ctx);
  put(ctx, t, "model.embed_tokens.weight", get(p, "embed/embedding"));
  put(ctx, t, "model.norm.weight", get(p, "final_norm/scale"));
  for (int64_t l = 0; l < c->n_layers; l++) {
    const char *lin[][2] = {{"self_attn.q_proj", "attn/wq"}, {"self_attn.k_proj", "attn/wk"},
                            {"self_attn.v_proj", "attn/wv"}, {"self_attn.o_proj", "attn/wo"},
                            {"mlp.gate_proj", "mlp/wi_0"},   {"mlp.up_proj", "mlp/wi_1"},
                            {"mlp.down_proj", "mlp/wo"}};
    char n[128], q[128];
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
      snprintf(n, sizeof n, "model.layers.%lld.%s.weight", (long long)l, lin[i][0]);
      snprintf(q, sizeof q, "layers/%lld/%s/kernel", (long long)l, lin[i][1]);
      put(ctx, t, n, linear(ctx, p, q));
      if (i < 3 && !window) {
        snprintf(n, sizeof n, "model.layers.%lld.%s.bias", (long long)l, lin[i][0]);
        snprintf(q, sizeof q, "layers/%lld/%s/bias", (long long)l, lin[i][1]);
        put(ctx, t, n, get(p, q));
      }
    }
    snprintf(n, sizeof n, "model.layers.%lld.input_layernorm.weight", (long long)l);
    snprintf(q, sizeof q, "layers/%lld/attn_norm/scale", (long long)l);
    put(ctx, t, n, get(p, q));
    snprintf(n, sizeof n, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
    snprintf(q, sizeof q, "layers/%lld/mlp_norm/scale", (long long)l);
    put(ctx, t, n, get(p, q));
  }
  char path[700];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, path, t, "{\"format\":\"pt\"}", NULL));
  nb_tree_destroy(t);
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "model_type", window ? "mistral" : "qwen2");
  cJSON_AddNumberToObject(j, "hidden_size", (double)c->d_model);
  cJSON_AddNumberToObject(j, "intermediate_size", (double)c->d_ff);
  cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->n_heads);
  cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->n_kv_heads);
  cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->n_layers);
  cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
  cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_seq_len);
  cJSON_AddNumberToObject(j, "rms_norm_eps", c->norm_eps);
  cJSON_AddNumberToObject(j, "rope_theta", c->rope_cfg.theta);
  cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
  if (window) cJSON_AddNumberToObject(j, "sliding_window", (double)window);
  write_json(dir, j);
  cJSON_Delete(j);
}

/* ---------------------------------------------------------------- nabla sources */

/* a checkpoint manager dir holding step 0 = {"params": p} and nothing else
 * (what `nabla ckpt import` writes) */
static void write_params_ckpt(nb_ctx *ctx, const char *dir, const nb_tree *p) {
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = dir});
  nb_ckpt_item it = {"params", p};
  CHECK_OK(ctx, nb_ckpt_save(m, 0, &it, 1, &(nb_ckpt_save_opts){.force = true}, NULL));
  nb_ckpt_manager_destroy(m);
}

static void write_config(const nb_train_config *cfg, const char *dir) {
  char p[700];
  snprintf(p, sizeof p, "%s/config.yaml", dir);
  FILE *f = fopen(p, "w");
  nb_train_config_write(cfg, f);
  fclose(f);
}

/* ---------------------------------------------------------------- runs */

/* loss of the first step of cfg (+ init_from=src) in a new run dir */
static double first_loss(nb_ctx *ctx, const nb_train_config *base, const char *name, const char *src) {
  nb_train_config cfg = *base;
  if (src) snprintf(cfg.init_from, sizeof cfg.init_from, "%.500s", src);
  char d[600];
  snprintf(d, sizeof d, "%s/%s", work, name);
  recorder r = {0};
  nb_train_result res;
  nb_status s = run_recorded(ctx, &cfg, d, &r, false, &res);
  CHECK_MSG(s == NB_OK, "%s: %s", name, nb_ctx_error(ctx));
  return s ? NAN : r.loss[1];
}

static void check_same(const char *what, double want, double got) {
  CHECK_MSG(!memcmp(&want, &got, sizeof want) && isfinite(want), "%s: loss %.9g, the source's %.9g", what, got, want);
}

static void test_gpt2_sources(nb_ctx *ctx) {
  const char *extra[] = {"steps=1", "eval_every=0", "checkpoint_every=0"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 3, extra, &cfg));
  double want = first_loss(ctx, &cfg, "fresh", NULL);
  /* the parameters the fresh run started from */
  nb_array *key = nb_key(ctx, (uint64_t)cfg.seed);
  nb_tree *p = nb_model_init(ctx, &cfg.model, key);
  nb_array_release(key);
  char hf[600], run[600], ck[700], step[800];
  snprintf(hf, sizeof hf, "%s/hf_gpt2", work);
  write_gpt2(ctx, &cfg.model, p, hf);
  nb_train_config plain = cfg;
  plain.model_keys_set = 0; /* a run config that says nothing about the model */
  check_same("init_from a GPT-2 Hugging Face dir", want, first_loss(ctx, &plain, "from_hf", hf));
  /* a run dir: config.yaml + checkpoints/ */
  snprintf(run, sizeof run, "%s/src_run", work);
  snprintf(ck, sizeof ck, "%s/checkpoints", run);
  mkdir(run, 0777);
  write_config(&cfg, run);
  write_params_ckpt(ctx, ck, p);
  check_same("init_from a run dir", want, first_loss(ctx, &plain, "from_run", run));
  snprintf(step, sizeof step, "%s/step_00000000", ck);
  check_same("init_from a checkpoint step", want, first_loss(ctx, &plain, "from_step", step));
  /* imported weights with no config anywhere: the run's model */
  snprintf(ck, sizeof ck, "%s/imported", work);
  write_params_ckpt(ctx, ck, p);
  check_same("init_from an imported checkpoint", want, first_loss(ctx, &cfg, "from_import", ck));
  /* a model key the run sets to another value than the source's */
  nb_train_config bad = plain;
  CHECK_OK(ctx, nb_train_config_set(ctx, &bad, "model.d_ff=128"));
  snprintf(bad.init_from, sizeof bad.init_from, "%.500s", hf);
  char d[600];
  snprintf(d, sizeof d, "%s/bad_key", work);
  CHECK(nb_train_run(ctx, &bad, &(nb_train_opts){.run_dir = d, .threads = 1}, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "model.d_ff is 128 in the run config but 64 in the model it starts from");
  /* a resumed init_from run reads the source's config, not its weights */
  char w[700];
  snprintf(w, sizeof w, "%s/model.safetensors", hf);
  CHECK(unlink(w) == 0);
  nb_train_config more = plain;
  more.steps = 2;
  snprintf(more.init_from, sizeof more.init_from, "%.500s", hf);
  snprintf(d, sizeof d, "%s/from_hf", work);
  recorder r = {0};
  nb_status rs = run_recorded(ctx, &more, d, &r, false, NULL);
  CHECK_MSG(rs == NB_OK && r.first_step == 2 && r.last_step == 2, "resume of an init_from run: %s (steps %lld..%lld)",
            nb_ctx_error(ctx), (long long)r.first_step, (long long)r.last_step);
  /* the workaround: imported weights as the run dir's own checkpoint */
  snprintf(d, sizeof d, "%s/import_then_train", work);
  snprintf(ck, sizeof ck, "%s/checkpoints", d);
  mkdir(d, 0777);
  write_params_ckpt(ctx, ck, p);
  CHECK(nb_train_run(ctx, &cfg, &(nb_train_opts){.run_dir = d, .threads = 1}, NULL) == NB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "is not a training state to resume (it has no item 'opt_state')"), "%s",
            nb_ctx_error(ctx));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "give init_from=");
  nb_tree_destroy(p);
}

static void test_qwen2_mistral(nb_ctx *ctx) {
  const char *extra[] = {"steps=1", "eval_every=0", "checkpoint_every=0", "model.preset=llama-tiny", "model.n_layers=1",
                         "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=64",
                         "model.max_seq_len=16", "model.qkv_bias=true", "model.tie_embeddings=true"};
  nb_train_config cfg;
  CHECK_OK(ctx, tiny_config(ctx, work, 12, extra, &cfg));
  double want = first_loss(ctx, &cfg, "qwen_fresh", NULL);
  nb_array *key = nb_key(ctx, (uint64_t)cfg.seed);
  nb_tree *p = nb_model_init(ctx, &cfg.model, key);
  nb_array_release(key);
  char hf[600];
  snprintf(hf, sizeof hf, "%s/hf_qwen2", work);
  write_qwen2(ctx, &cfg.model, p, hf, 0);
  check_same("init_from a Qwen2 Hugging Face dir", want, first_loss(ctx, &cfg, "from_qwen2", hf));
  /* Mistral with a window shorter than data.seq_len = 16 */
  nb_train_config m = cfg;
  CHECK_OK(ctx, nb_train_config_set(ctx, &m, "model.qkv_bias=false"));
  m.model_keys_set = 0;
  nb_tree_destroy(p);
  key = nb_key(ctx, 0);
  p = nb_model_init(ctx, &m.model, key);
  nb_array_release(key);
  snprintf(hf, sizeof hf, "%s/hf_mistral", work);
  write_qwen2(ctx, &m.model, p, hf, 8);
  snprintf(m.init_from, sizeof m.init_from, "%.500s", hf);
  char d[600];
  snprintf(d, sizeof d, "%s/mistral_window", work);
  CHECK(nb_train_run(ctx, &m, &(nb_train_opts){.run_dir = d, .threads = 1}, NULL) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "config.json's sliding_window (8) is shorter than data.seq_len (16)");
  CHECK_OK(ctx, nb_train_config_set(ctx, &m, "data.seq_len=8"));
  CHECK_MSG(isfinite(first_loss(ctx, &m, "mistral_short", hf)), "a Mistral within its window trains");
  nb_tree_destroy(p);
}

int main(void) {
  make_workdir(work, sizeof work);
  nb_ctx *ctx = nb_ctx_create();
  test_gpt2_sources(ctx);
  test_qwen2_mistral(ctx);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("train/init_from");
}
