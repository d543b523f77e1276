/* nb_model_save_hf: Hugging Face import then export gives the same tensors
 * bit for bit (names, dtypes, bytes: the f32 Llama golden folder, and a bf16
 * export exported again), and export then import gives the same nabla
 * parameters for GPT-2 (fused c_attn), Qwen2 (q/k/v biases, tied) and a
 * sharded Llama; models no architecture computes are refused by key; the
 * `nabla ckpt export SRC --hf DIR` command. */
#include <string.h>
#include <sys/stat.h>

#include "nabla/nabla.h"
#include "test.h"
#include "testfs.h"

static char work[256];

/* every tensor of a's folder is in b's with the same dtype, shape and bytes, and the counts agree */
static void same_tensors(nb_ctx *ctx, const char *a, const char *b, const char *what) {
  nb_tree *ta = nb_ckpt_safetensors_load(ctx, a, NULL, NULL), *tb = nb_ckpt_safetensors_load(ctx, b, NULL, NULL);
  CHECK_MSG(ta && tb, "%s: %s", what, nb_ctx_error(ctx));
  if (!ta || !tb) return;
  CHECK_MSG(nb_tree_size(ta) == nb_tree_size(tb), "%s: %zu tensors vs %zu", what, nb_tree_size(ta), nb_tree_size(tb));
  for (size_t i = 0; i < nb_tree_size(ta); i++) {
    const char *name = nb_tree_path(ta, i);
    nb_array *x = nb_tree_leaf(ta, i)->array, *y = nb_tree_get_array(tb, name);
    nb_aval ax = nb_array_aval(x), ay = y ? nb_array_aval(y) : ax;
    bool ok = y && nb_aval_equal(&ax, &ay) && !memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(x));
    CHECK_MSG(ok, "%s: tensor '%s' differs or is missing", what, name);
  }
  nb_tree_destroy(ta);
  nb_tree_destroy(tb);
}

static void same_params(const nb_tree *a, const nb_tree *b, const char *what) {
  CHECK_MSG(nb_tree_size(a) == nb_tree_size(b), "%s: %zu params vs %zu", what, nb_tree_size(a), nb_tree_size(b));
  for (size_t i = 0; i < nb_tree_size(a); i++) {
    nb_array *x = nb_tree_leaf(a, i)->array, *y = nb_tree_get_array(b, nb_tree_path(a, i));
    bool ok = y && nb_array_nbytes(x) == nb_array_nbytes(y) && !memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(x));
    CHECK_MSG(ok, "%s: parameter '%s' differs or is missing", what, nb_tree_path(a, i));
  }
}

static void test_import_export(nb_ctx *ctx) {
  const char *golden = "tests/models/golden/hf_llama_tiny";
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_hf(ctx, golden, &m));
  char a[600], b[600];
  snprintf(a, sizeof a, "%s/llama_f32", work);
  CHECK_OK(ctx, nb_model_save_hf(ctx, &m, a, NULL));
  same_tensors(ctx, golden, a, "import then export (f32)");
  snprintf(a, sizeof a, "%s/llama_bf16", work);
  CHECK_OK(ctx, nb_model_save_hf(ctx, &m, a, &(nb_model_hf_opts){.dtype = NB_BF16}));
  nb_model_loaded_free(&m);
  CHECK_OK(ctx, nb_model_load_hf(ctx, a, &m));
  snprintf(b, sizeof b, "%s/llama_bf16_again", work);
  CHECK_OK(ctx, nb_model_save_hf(ctx, &m, b, &(nb_model_hf_opts){.dtype = NB_BF16, .shard_bytes = 20000}));
  same_tensors(ctx, a, b, "bf16 import then export (sharded)");
  snprintf(b, sizeof b, "%s/llama_bf16_again/model.safetensors.index.json", work);
  struct stat st;
  CHECK_MSG(stat(b, &st) == 0, "no index: the shards were not written");
  nb_model_loaded_free(&m);
}

static void export_import(nb_ctx *ctx, const char *preset, int n_extra, const char *const *extra, const char *name,
                          const char *arch_want) {
  nb_train_config rc;
  CHECK_OK(ctx, nb_train_config_parse(ctx, name, NULL, 0, n_extra, extra, &rc));
  (void)preset;
  nb_model_loaded m;
  memset(&m, 0, sizeof m);
  m.cfg = rc.model;
  m.bos_id = -1;
  nb_array *key = nb_key(ctx, 3);
  m.params = nb_model_init(ctx, &m.cfg, key);
  nb_array_release(key);
  char d[600], cj[700];
  snprintf(d, sizeof d, "%s/%s", work, name);
  CHECK_OK(ctx, nb_model_save_hf(ctx, &m, d, NULL));
  snprintf(cj, sizeof cj, "grep -q '\"model_type\":[[:space:]]*\"%s\"' %s/config.json", arch_want, d);
  CHECK_MSG(system(cj) == 0, "%s: config.json is not model_type %s", name, arch_want);
  nb_model_loaded back;
  CHECK_OK(ctx, nb_model_load_hf(ctx, d, &back));
  same_params(m.params, back.params, name);
  if (!strcmp(arch_want, "gpt2")) { /* the original GPT-2 files: no "transformer." prefix, causal-mask buffers */
    nb_tree *t = nb_ckpt_safetensors_load(ctx, d, NULL, NULL), *u = nb_tree_create(ctx);
    for (size_t i = 0; t && i < nb_tree_size(t); i++) {
      const char *n = nb_tree_path(t, i);
      CHECK_OK(ctx, nb_tree_set_array(u, strncmp(n, "transformer.", 12) ? n : n + 12, nb_tree_leaf(t, i)->array));
    }
    nb_array *mask = nb_array_zeros(ctx, NB_F32, 4, (int64_t[4]){1, 1, 16, 16});
    CHECK_OK(ctx, nb_tree_set_array(u, "h.0.attn.bias", mask));
    nb_array_release(mask);
    snprintf(cj, sizeof cj, "%s/model.safetensors", d);
    CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, cj, u, NULL, NULL));
    nb_model_loaded_free(&back);
    CHECK_OK(ctx, nb_model_load_hf(ctx, d, &back));
    same_params(m.params, back.params, "gpt2 without the transformer. prefix");
    nb_tree_destroy(t);
    nb_tree_destroy(u);
  }
  CHECK_MSG(back.cfg.qkv_bias == m.cfg.qkv_bias && back.cfg.tie_embeddings == m.cfg.tie_embeddings &&
                back.cfg.d_ff == m.cfg.d_ff && back.cfg.n_kv_heads == m.cfg.n_kv_heads,
            "%s: the config did not come back", name);
  nb_model_loaded_free(&back);
  nb_model_loaded_free(&m);
}

static void test_architectures(nb_ctx *ctx) {
  const char *gpt2[] = {"model.preset=gpt2-tiny", "model.n_layers=2", "model.d_model=32", "model.n_heads=4",
                        "model.n_kv_heads=4", "model.d_ff=64", "model.max_seq_len=16", "data.seq_len=16"};
  export_import(ctx, "gpt2-tiny", 8, gpt2, "gpt2", "gpt2");
  const char *qwen[] = {"model.preset=llama-tiny", "model.n_layers=2", "model.d_model=32", "model.n_heads=4",
                        "model.n_kv_heads=2", "model.d_ff=64", "model.max_seq_len=16", "data.seq_len=16",
                        "model.qkv_bias=true", "model.tie_embeddings=true"};
  export_import(ctx, "llama-tiny", 10, qwen, "qwen2", "qwen2");
  /* refused: a mixture of experts */
  nb_model_loaded m;
  memset(&m, 0, sizeof m);
  nb_model_config_preset(ctx, "mixtral-tiny", &m.cfg);
  m.params = nb_tree_create(ctx);
  char d[600];
  snprintf(d, sizeof d, "%s/moe", work);
  CHECK(nb_model_save_hf(ctx, &m, d, NULL) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "model.n_experts is not 0");
  nb_model_config_preset(ctx, "llama-tiny", &m.cfg);
  CHECK(nb_model_save_hf(ctx, &m, d, &(nb_model_hf_opts){.arch = "qwen2"}) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "model.qkv_bias is false; Qwen2 has q/k/v biases");
  nb_tree_destroy(m.params);
}

/* nabla ckpt export SRC --hf DIR */
static void test_cli(nb_ctx *ctx) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return;
  char cmd[2000], out[8192], d[600];
  snprintf(d, sizeof d, "%s/cli", work);
  snprintf(cmd, sizeof cmd, "%s ckpt export tests/models/golden/hf_llama_tiny --hf %s --dtype bf16 2>&1", bin, d);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "(bf16)") && strstr(out, "with the tokenizer files"), "%s", out);
  snprintf(cmd, sizeof cmd, "grep -q bfloat16 %s/config.json && test -s %s/tokenizer.json", d, d);
  CHECK_MSG(system(cmd) == 0, "no bf16 config.json or no tokenizer.json in %s", d);
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_hf(ctx, d, &m));
  nb_model_loaded_free(&m);
  snprintf(cmd, sizeof cmd, "%s ckpt export tests/models/golden/hf_llama_tiny --hf %s --dtype f8 2>&1", bin, d);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "--dtype 'f8' is not one of f32, bf16, f16"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s ckpt export %s/nothing --hf %s/x 2>&1", bin, work, work);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 1 && strstr(out, "nothing"), "%s", out);
}

int main(void) {
  nb_test_scratch_dir(work, sizeof work, "models", "hf_export");
  nb_ctx *ctx = nb_ctx_create();
  test_import_export(ctx);
  test_architectures(ctx);
  test_cli(ctx);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("models/hf_export");
}
