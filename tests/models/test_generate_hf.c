/* The Hugging Face loader on a tiny random Llama written by PyTorch +
 * transformers (tests/models/golden/make_hf_llama_tiny.py): the config,
 * the tokenizer's ids for the prompt, nabla's logits against
 * LlamaForCausalLM's, the greedy continuation against its generate(), the
 * same weights as bf16 shards, and malformed folders (each error names the
 * file and the field or tensor). */
#include <unistd.h>

#include "json_golden.h"
#include "testfs.h"

#define HF_DIR "tests/models/golden/hf_llama_tiny"

static cJSON *golden;

static void test_load_and_match(nb_ctx *ctx) {
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_hf(ctx, HF_DIR, &m));
  if (!m.params) return;
  const nb_model_config *c = &m.cfg;
  CHECK(c->family == NB_MODEL_LLAMA && c->vocab_size == 304 && c->d_model == 32 && c->n_layers == 2 && c->n_heads == 4 &&
        c->n_kv_heads == 2 && c->d_ff == 64 && c->max_seq_len == 64 && !c->tie_embeddings && c->head_dim == 0);
  CHECK(c->rope_cfg.scaling == NB_NN_ROPE_LLAMA3 && c->rope_cfg.factor == 8 && c->rope_cfg.original_max_pos == 32 &&
        c->rope_cfg.high_freq_factor == 4 && c->rope_cfg.theta == 10000);
  CHECK(m.bos_id == 0 && m.n_eos == 1 && m.eos_ids[0] == 1 && m.tok);
  /* the prompt's ids: bos, then nabla's encoding of the text */
  const cJSON *pj = cJSON_GetObjectItemCaseSensitive(golden, "prompt_ids");
  int64_t want_ids[64];
  int n = nb_test_golden_ints(golden, "prompt_ids", want_ids, 64);
  const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(golden, "prompt"));
  nb_tok_ids ids = {0};
  int32_t prompt[64] = {m.bos_id};
  CHECK(pj && n > 1 && text && m.tok);
  if (m.tok && text) CHECK_OK(ctx, nb_tok_encode(m.tok, text, strlen(text), NULL, &ids));
  CHECK_MSG((int)ids.len == n - 1, "nabla encodes the prompt into %zu ids, tokenizers into %d", ids.len, n - 1);
  for (int i = 1; i < n && i - 1 < (int)ids.len; i++) {
    prompt[i] = ids.ids[i - 1];
    CHECK_MSG(prompt[i] == want_ids[i], "prompt id %d: nabla %d, tokenizers %lld", i, prompt[i], (long long)want_ids[i]);
  }
  nb_tok_ids_free(m.tok, &ids);
  /* logits of the full forward */
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, n}, prompt);
  nb_tree *batch = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", tok);
  nb_graph *g = nb_model_trace_forward(ctx, c, NULL, m.params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_tree_merge(in, "params", m.params);
  nb_tree_merge(in, "batch", batch);
  if (g) CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  nb_array *logits = nb_tree_get_array(out, "logits");
  const cJSON *want = cJSON_GetObjectItemCaseSensitive(golden, "logits");
  CHECK(logits && nb_array_size(logits) == cJSON_GetArraySize(want));
  double maxd = 0, maxv = 0;
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, want) {
    if (!logits || i >= nb_array_size(logits)) break;
    maxd = fmax(maxd, fabs(nb_array_get(logits, i) - v->valuedouble));
    maxv = fmax(maxv, fabs(v->valuedouble));
    i++;
  }
  printf("hf llama logits: %d values up to %.3g, max |nabla - transformers| = %.3g\n", i, maxv, maxd);
  CHECK_MSG(maxd < 1e-4, "logits differ from transformers' by %g", maxd);
  nb_graph_destroy(g);
  nb_tree_destroy(batch);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_array_release(tok);
  /* the greedy continuation, compiled, with the cache, against generate() */
  int64_t want_new[32];
  int k = nb_test_golden_ints(golden, "greedy_ids", want_new, 32);
  int32_t got[32];
  nb_model_generator *gen = nb_model_generator_create(ctx, c, m.params, NULL);
  CHECK_MSG(gen, "%s", nb_ctx_error(ctx));
  nb_model_gen_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = k, .out = got, .stop = m.eos_ids, .n_stop = m.n_eos};
  nb_model_gen_result res = {0};
  if (gen) CHECK_OK(ctx, nb_model_generate(gen, &r, &res));
  CHECK(res.n_tokens == k);
  for (int j = 0; j < k && j < res.n_tokens; j++)
    CHECK_MSG(got[j] == want_new[j], "greedy token %d: nabla %d, transformers %lld", j, got[j], (long long)want_new[j]);
  printf("hf llama greedy: %lld tokens, first %d %d %d (transformers %lld %lld %lld)\n", (long long)res.n_tokens, got[0], got[1],
         got[2], (long long)want_new[0], (long long)want_new[1], (long long)want_new[2]);
  nb_model_generator_destroy(gen);
  nb_model_loaded_free(&m);
}

/* ---------------------------------------------------------------- variants and malformed folders */

static char scratch[256];

static void copy_file(const char *from, const char *to_dir, const char *name) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s/%s'", from, to_dir, name);
  CHECK(system(cmd) == 0);
}

/* scratch/<name>/ with the golden's config.json (edited by `edit`) and the
 * given weights (NULL: none) */
static void make_dir(nb_ctx *ctx, const char *name, void (*edit)(cJSON *), const nb_tree *weights, char *dir, size_t cap) {
  snprintf(dir, cap, "%s/%s", scratch, name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  CHECK(system(cmd) == 0);
  cJSON *j = nb_test_golden_load(HF_DIR "/config.json");
  if (edit) edit(j);
  char p[600];
  snprintf(p, sizeof p, "%s/config.json", dir);
  char *text = cJSON_Print(j);
  nb_test_write_text(p, text);
  free(text);
  cJSON_Delete(j);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (weights) CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, p, weights, NULL, NULL));
}

static void drop_hidden_size(cJSON *j) { cJSON_DeleteItemFromObject(j, "hidden_size"); }
static void yarn(cJSON *j) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "rope_scaling"), "rope_type", cJSON_CreateString("yarn"));
}
static void falcon(cJSON *j) { cJSON_ReplaceItemInObject(j, "model_type", cJSON_CreateString("falcon")); }
static void mistral_class(cJSON *j) { cJSON_ReplaceItemInObject(j, "model_type", cJSON_CreateString("mistral")); }
static void gelu(cJSON *j) { cJSON_ReplaceItemInObject(j, "hidden_act", cJSON_CreateString("gelu")); }
static void no_factor(cJSON *j) { cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "rope_scaling"), "factor"); }
static void bad_layers(cJSON *j) { cJSON_ReplaceItemInObject(j, "num_hidden_layers", cJSON_CreateNumber(1.5)); }
static void tied(cJSON *j) { cJSON_ReplaceItemInObject(j, "tie_word_embeddings", cJSON_CreateTrue()); }

static void expect(nb_ctx *ctx, const char *dir, nb_status st, const char *needle) {
  nb_model_loaded m;
  nb_status got = nb_model_load_hf(ctx, dir, &m);
  CHECK_MSG(got == st && strstr(nb_ctx_error(ctx), needle) && strstr(nb_ctx_error(ctx), dir),
            "%s: got %s '%s', wanted %s with '%s' and the folder named", dir, nb_status_name(got), nb_ctx_error(ctx),
            nb_status_name(st), needle);
  CHECK(m.params == NULL && m.tok == NULL);
  nb_ctx_clear_error(ctx);
}

static void test_variants(nb_ctx *ctx) {
  nb_tree *raw = nb_ckpt_safetensors_load(ctx, HF_DIR "/model.safetensors", NULL, NULL);
  CHECK_MSG(raw, "%s", nb_ctx_error(ctx));
  if (!raw) return;
  char dir[512];
  /* bf16 weights in three shards with an index: loaded as the bf16 values */
  nb_tree *bf = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(raw); i++) {
    nb_array *b = nb_array_astype(ctx, nb_tree_leaf(raw, i)->array, NB_BF16);
    nb_tree_set_array(bf, nb_tree_path(raw, i), b);
    nb_array_release(b);
  }
  make_dir(ctx, "bf16", NULL, NULL, dir, sizeof dir);
  CHECK_OK(ctx, nb_ckpt_safetensors_save_sharded(ctx, dir, "model", bf, NULL, 40000, NULL));
  copy_file(HF_DIR "/tokenizer.json", dir, "tokenizer.json");
  nb_model_loaded m, ref;
  CHECK_OK(ctx, nb_model_load_hf(ctx, dir, &m));
  CHECK_OK(ctx, nb_model_load_hf(ctx, HF_DIR, &ref));
  double worst = 0;
  for (size_t i = 0; m.params && ref.params && i < nb_tree_size(ref.params); i++) {
    nb_array *a = nb_tree_leaf(m.params, i)->array, *b = nb_tree_leaf(ref.params, i)->array;
    CHECK(nb_array_dtype(a) == NB_F32 && nb_array_size(a) == nb_array_size(b));
    for (int64_t e = 0; e < nb_array_size(b); e++) {
      double want = nb_bf16_to_f32(nb_f32_to_bf16((float)nb_array_get(b, e)));
      worst = fmax(worst, fabs(nb_array_get(a, e) - want));
    }
  }
  CHECK_MSG(worst == 0, "bf16 shards load to values %g away from the rounded weights", worst);
  nb_model_loaded_free(&m);
  nb_model_loaded_free(&ref);
  nb_tree_destroy(bf);
  /* a tied head: lm_head.weight is not read (and may be absent) */
  nb_tree *no_head = nb_tree_copy(raw);
  nb_tree_remove(no_head, "lm_head.weight");
  make_dir(ctx, "tied", tied, no_head, dir, sizeof dir);
  CHECK_OK(ctx, nb_model_load_hf(ctx, dir, &m));
  CHECK(m.cfg.tie_embeddings && m.params && nb_tree_find(m.params, "lm_head/kernel") < 0 && !m.tok && m.n_eos == 1);
  nb_model_loaded_free(&m);
  nb_tree_destroy(no_head);
  /* config.json errors: one folder per edit of the golden's config */
  static const struct {
    const char *name;
    void (*edit)(cJSON *);
    nb_status st;
    const char *needle;
  } bad_cfg[] = {
      {"no_hidden", drop_hidden_size, NB_ERR_FORMAT, "config.json: field 'hidden_size' is missing"},
      {"yarn", yarn, NB_ERR_UNIMPLEMENTED,
       "config.json: field 'rope_scaling.rope_type' is 'yarn'; supported: default, linear, llama3"},
      {"falcon", falcon, NB_ERR_UNIMPLEMENTED, "config.json: field 'model_type' is 'falcon'; supported: llama, mistral, qwen2, gpt2"},
      {"mistral_class", mistral_class, NB_ERR_UNIMPLEMENTED,
       "config.json: field 'architectures' names 'LlamaForCausalLM'; supported: MistralForCausalLM (model_type says so)"},
      {"gelu", gelu, NB_ERR_UNIMPLEMENTED, "field 'hidden_act' is 'gelu'"},
      {"no_factor", no_factor, NB_ERR_FORMAT, "field 'rope_scaling' needs a positive number 'factor'"},
      {"bad_layers", bad_layers, NB_ERR_FORMAT, "field 'num_hidden_layers' must be a positive integer"},
  };
  for (size_t i = 0; i < sizeof bad_cfg / sizeof bad_cfg[0]; i++) {
    make_dir(ctx, bad_cfg[i].name, bad_cfg[i].edit, raw, dir, sizeof dir);
    expect(ctx, dir, bad_cfg[i].st, bad_cfg[i].needle);
  }
  /* weight errors */
  make_dir(ctx, "no_weights", NULL, NULL, dir, sizeof dir);
  expect(ctx, dir, NB_ERR_NOT_FOUND, "no model.safetensors or model.safetensors.index.json");
  nb_tree *t = nb_tree_copy(raw);
  nb_tree_remove(t, "model.norm.weight");
  make_dir(ctx, "missing", NULL, t, dir, sizeof dir);
  expect(ctx, dir, NB_ERR_NOT_FOUND, "model.safetensors: tensor 'model.norm.weight' [32] is missing (nabla's 'final_norm/scale')");
  nb_tree_destroy(t);
  t = nb_tree_copy(raw);
  nb_array *wrong = nb_array_zeros(ctx, NB_F32, 2, (int64_t[2]){32, 16});
  nb_tree_set_array(t, "model.layers.1.self_attn.q_proj.weight", wrong);
  nb_array_release(wrong);
  make_dir(ctx, "shape", NULL, t, dir, sizeof dir);
  expect(ctx, dir, NB_ERR_SHAPE,
         "model.safetensors: tensor 'model.layers.1.self_attn.q_proj.weight' is f32[32,16], expected a float tensor of shape [32, 32]");
  nb_tree_destroy(t);
  t = nb_tree_copy(raw);
  nb_array *bias = nb_array_zeros(ctx, NB_F32, 1, (int64_t[1]){32});
  nb_tree_set_array(t, "model.layers.0.self_attn.q_proj.bias", bias);
  nb_array_release(bias);
  make_dir(ctx, "bias", NULL, t, dir, sizeof dir);
  expect(ctx, dir, NB_ERR_UNIMPLEMENTED, "tensor 'model.layers.0.self_attn.q_proj.bias' is not part of the LlamaForCausalLM architecture");
  nb_tree_destroy(t);
  expect(ctx, "/nonexistent/hf_model", NB_ERR_NOT_FOUND, "does not exist");
  nb_tree_destroy(raw);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  golden = nb_test_golden_load("tests/models/golden/hf_llama_tiny.json");
  CHECK(golden);
  nb_test_scratch_dir(scratch, sizeof scratch, "models", "hf");
  if (golden) {
    test_load_and_match(ctx);
    test_variants(ctx);
  }
  CHECK(nb_test_rm_rf(scratch) == 0);
  cJSON_Delete(golden);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/generate_hf");
}
