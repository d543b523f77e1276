/* nabla's Hugging Face export against PyPI transformers. Four tiny models
 * (GPT-2, Llama, Mistral, Qwen2) with deterministic parameters (an integer
 * LCG, no libm: the same bits on every machine) are exported with
 * nb_model_save_hf; tests/models/golden/make_hf_export_goldens.py loaded
 * those exports with transformers (AutoModelForCausalLM) and recorded the
 * xxh3 of every tensor it read and its logits on fixed token ids
 * (hf_export_transformers.json). Here the same export is made again and
 *   - its tensors must hash to what the script saw (names, count, bytes);
 *   - nabla's logits on the exported model (imported back) must match
 *     transformers' within 1e-4 * (1 + |logit|): both compute in f32, the
 *     sums run in other orders (d <= 64 terms, |logits| < 10, so ~1e-5 of
 *     rounding), while a wrong layout or name moves logits by O(0.1).
 * `models_test_hf_peer --write DIR` writes the exports (what the script runs). */
#include <math.h>
#include <string.h>
#include <xxhash.h>

#include "json_golden.h"
#include "nabla/nabla.h"
#include "testfs.h"

#define GOLDEN "tests/models/golden/hf_export_transformers.json"

typedef struct arch {
  const char *name;
  const char *overrides[12];
} arch;

static const arch archs[] = {
    {"gpt2", {"model.preset=gpt2-tiny", "model.n_heads=4", "model.n_kv_heads=4", NULL}},
    {"llama", {"model.preset=llama-tiny", "model.n_heads=4", "model.n_kv_heads=2", NULL}},
    {"mistral", {"model.preset=llama-tiny", "model.n_heads=4", "model.n_kv_heads=1", "model.rope_theta=1000000", NULL}},
    {"qwen2", {"model.preset=llama-tiny", "model.n_heads=4", "model.n_kv_heads=2", "model.qkv_bias=true",
               "model.tie_embeddings=true", "model.norm_eps=1e-6", "model.rope_theta=1000000", NULL}},
};
static const char *const common[] = {"model.vocab_size=64", "model.d_model=32", "model.n_layers=2", "model.d_ff=64",
                                     "model.max_seq_len=32", "data.seq_len=32"};
enum { N_ARCH = 4, T = 12 };
static const int32_t ids[T] = {1, 17, 42, 3, 63, 0, 8, 8, 25, 50, 11, 30};

static nb_status config_of(nb_ctx *ctx, const arch *a, nb_model_config *out) {
  const char *ov[24];
  int n = 0;
  for (int i = 0; a->overrides[i]; i++) ov[n++] = a->overrides[i];
  for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) ov[n++] = common[i];
  nb_train_config rc;
  nb_status s = nb_train_config_parse(ctx, a->name, NULL, 0, n, ov, &rc);
  if (!s) *out = rc.model;
  return s;
}

/* parameters from an integer LCG: norms' scales 1 +- 0.2, biases +- 0.2,
 * embeddings +- 1, kernels +- 1.5 / sqrt(d_in) */
static nb_tree *params_of(nb_ctx *ctx, const nb_model_config *c) {
  nb_tree *spec = nb_model_param_spec(ctx, c, NB_F32), *p = nb_tree_create(ctx);
  uint64_t x = 0x243F6A8885A308D3ull;
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    const char *path = nb_tree_path(spec, i);
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    size_t n = (size_t)nb_shape_size(&av.shape), len = strlen(path);
    float *v = malloc(sizeof(float) * n);
    bool scale = len > 5 && !strcmp(path + len - 5, "scale"), bias = len > 4 && !strcmp(path + len - 4, "bias");
    bool embed = strstr(path, "embedding") != NULL;
    double amp = scale || bias ? 0.2 : embed ? 1.0 : 1.5 / sqrt((double)av.shape.dims[0]);
    for (size_t k = 0; k < n; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      double u = (double)((int64_t)((x >> 33) % 20001) - 10000) / 10000.0;
      v[k] = (float)((scale ? 1.0 : 0.0) + amp * u);
    }
    nb_array *arr = nb_array_create(ctx, NB_F32, av.shape.rank, av.shape.dims, v);
    nb_tree_set_array(p, path, arr);
    nb_array_release(arr);
    free(v);
  }
  nb_tree_destroy(spec);
  return p;
}

static nb_status export_arch(nb_ctx *ctx, const arch *a, const char *dir) {
  nb_model_loaded m;
  memset(&m, 0, sizeof m);
  m.bos_id = -1;
  nb_status s = config_of(ctx, a, &m.cfg);
  if (s) return s;
  m.params = params_of(ctx, &m.cfg);
  s = nb_model_save_hf(ctx, &m, dir, &(nb_model_hf_opts){.arch = a->name});
  nb_model_loaded_free(&m);
  return s;
}

/* nabla's logits [T, V] of the folder's model (imported back) */
static nb_array *nabla_logits(nb_ctx *ctx, const char *dir) {
  nb_model_loaded m;
  if (nb_model_load_hf(ctx, dir, &m)) return NULL;
  nb_tree *batch = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, T}, ids);
  nb_tree_set_array(batch, "inputs", tok);
  nb_array_release(tok);
  nb_graph *g = nb_model_trace_forward(ctx, &m.cfg, NULL, m.params, batch);
  nb_tree_merge(in, "params", m.params);
  nb_tree_merge(in, "batch", batch);
  nb_array *logits = NULL;
  if (g && nb_graph_run(ctx, g, in, out) == NB_OK) {
    nb_array *l = nb_tree_get_array(out, "logits");
    logits = nb_array_create(ctx, NB_F32, 2, (int64_t[2]){T, m.cfg.vocab_size}, nb_array_data(l));
  }
  nb_graph_destroy(g);
  nb_tree_destroy(batch), nb_tree_destroy(in), nb_tree_destroy(out);
  nb_model_loaded_free(&m);
  return logits;
}

static void check_arch(nb_ctx *ctx, const arch *a, const cJSON *g, const char *work) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/%s", work, a->name);
  CHECK_OK(ctx, export_arch(ctx, a, dir));
  /* the tensors transformers read */
  const cJSON *hashes = cJSON_GetObjectItemCaseSensitive(g, "tensors");
  nb_tree *t = nb_ckpt_safetensors_load(ctx, dir, NULL, NULL);
  CHECK_MSG(t && cJSON_GetArraySize(hashes) == (int)nb_tree_size(t), "%s: %zu tensors, the script read %d", a->name,
            t ? nb_tree_size(t) : 0, cJSON_GetArraySize(hashes));
  for (size_t i = 0; t && i < nb_tree_size(t); i++) {
    nb_array *x = nb_tree_leaf(t, i)->array;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(nb_array_data(x), nb_array_nbytes(x)));
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(hashes, nb_tree_path(t, i));
    CHECK_MSG(cJSON_IsString(want) && !strcmp(want->valuestring, hex), "%s: tensor '%s' hashes to %s, the script saw %s",
              a->name, nb_tree_path(t, i), hex, cJSON_IsString(want) ? want->valuestring : "no such tensor");
  }
  nb_tree_destroy(t);
  /* the logits */
  nb_array *ours = nabla_logits(ctx, dir);
  nb_array *theirs = nb_test_golden_array(ctx, cJSON_GetObjectItemCaseSensitive(g, "logits"));
  CHECK_MSG(ours && theirs, "%s: %s", a->name, nb_ctx_error(ctx));
  if (ours && theirs) {
    char what[64];
    snprintf(what, sizeof what, "%s logits vs transformers", a->name);
    CHECK(nb_test_arrays_close(what, ours, theirs, 1e-4));
    double worst = 0, big = 0;
    const float *o = nb_array_data(ours), *w = nb_array_data(theirs);
    for (int64_t i = 0; i < nb_array_size(ours); i++) worst = fmax(worst, fabs(o[i] - w[i])), big = fmax(big, fabs(w[i]));
    printf("%s: %lld logits up to %.3g, max |nabla - transformers| = %.3g\n", a->name, (long long)nb_array_size(ours), big, worst);
  }
  nb_array_release(ours);
  nb_array_release(theirs);
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (argc == 3 && !strcmp(argv[1], "--write")) { /* for the golden script */
    for (int i = 0; i < N_ARCH; i++) {
      char dir[4200];
      snprintf(dir, sizeof dir, "%s/%s", argv[2], archs[i].name);
      if (export_arch(ctx, &archs[i], dir)) return fprintf(stderr, "%s: %s\n", archs[i].name, nb_ctx_error(ctx)), 1;
    }
    printf("{\"ids\": [");
    for (int i = 0; i < T; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]}\n");
    nb_ctx_destroy(ctx);
    return 0;
  }
  char work[256];
  nb_test_scratch_dir(work, sizeof work, "models", "hf_peer");
  cJSON *g = nb_test_golden_load(GOLDEN);
  CHECK(g != NULL);
  for (int i = 0; g && i < N_ARCH; i++) {
    const cJSON *ga = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "models"), archs[i].name);
    CHECK_MSG(ga != NULL, "%s: not in %s", archs[i].name, GOLDEN);
    if (ga) check_arch(ctx, &archs[i], ga, work);
  }
  cJSON_Delete(g);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("models/hf_peer");
}
