/* The reference models against Hugging Face's implementations (Flax, on
 * JAX) of the same weights: Llama logits for fixed tokens, and GPT-2's
 * masked loss and its gradient for every weight. The goldens are written by
 * tests/models/golden/make_{llama,gpt2}_golden.py. */
#include "golden_st.h"

/* params in the order of the model's own spec, checking paths and shapes */
static nb_tree *ordered_params(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *loaded) {
  nb_tree *spec = nb_model_param_spec(ctx, cfg, NB_F32);
  CHECK_MSG(spec, "%s", nb_ctx_error(ctx));
  if (!spec) return NULL;
  nb_tree *out = nb_tree_create(ctx);
  size_t n_params = 0;
  for (size_t i = 0; i < nb_tree_size(loaded); i++) n_params += strncmp(nb_tree_path(loaded, i), "grad/", 5) != 0;
  CHECK_MSG(n_params == nb_tree_size(spec), "golden has %zu weights, the model %zu", n_params, nb_tree_size(spec));
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    nb_array *a = nb_tree_get_array(loaded, p);
    nb_aval want = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    CHECK_MSG(a, "golden lacks %s", p);
    if (!a) continue;
    nb_aval have = nb_array_aval(a);
    CHECK_MSG(nb_aval_equal(&have, &want), "%s: shapes differ", p);
    nb_tree_set_array(out, p, a);
  }
  nb_tree_destroy(spec);
  return out;
}

static void test_llama(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/models/golden/llama_tiny.json");
  nb_tree *loaded = golden_safetensors(ctx, "tests/models/golden/llama_tiny.safetensors");
  CHECK(j && loaded);
  if (!j || !loaded) return;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
  nb_model_config cfg;
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", &cfg));
  cfg.vocab_size = cfg_int(c, "vocab_size");
  cfg.d_model = cfg_int(c, "d_model");
  cfg.n_layers = cfg_int(c, "n_layers");
  cfg.n_heads = cfg_int(c, "n_heads");
  cfg.n_kv_heads = cfg_int(c, "n_kv_heads");
  cfg.d_ff = cfg_int(c, "d_ff");
  cfg.max_seq_len = cfg_int(c, "max_seq_len");
  cfg.norm_eps = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "norm_eps"));
  cfg.rope_cfg.theta = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "rope_theta"));
  nb_tree *params = ordered_params(ctx, &cfg, loaded);
  nb_tree *batch = nb_tree_create(ctx);
  nb_array *tok = golden_int_matrix(ctx, cJSON_GetObjectItemCaseSensitive(j, "tokens"), NB_I32);
  nb_tree_set_array(batch, "inputs", tok);
  nb_graph *g = nb_model_trace_forward(ctx, &cfg, NULL, params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  if (g) CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  nb_array *logits = nb_tree_get_array(out, "logits");
  const cJSON *want = cJSON_GetObjectItemCaseSensitive(j, "logits");
  CHECK(logits && nb_array_size(logits) == cJSON_GetArraySize(want));
  double maxd = 0;
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, want) {
    if (!logits || i >= nb_array_size(logits)) break;
    maxd = fmax(maxd, fabs(nb_array_get(logits, i) - cJSON_GetNumberValue(v)));
    if (i < 3) printf("llama logit %d: nabla %.7f, reference %.7f\n", i, nb_array_get(logits, i), cJSON_GetNumberValue(v));
    i++;
  }
  printf("llama logits: max |nabla - reference| = %.3g\n", maxd);
  CHECK_MSG(maxd < 2e-4, "llama logits differ by %g", maxd);
  nb_array_release(tok);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_tree_destroy(loaded);
  cJSON_Delete(j);
}

static void test_gpt2(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/models/golden/gpt2_tiny.json");
  nb_tree *loaded = golden_safetensors(ctx, "tests/models/golden/gpt2_tiny.safetensors");
  CHECK(j && loaded);
  if (!j || !loaded) return;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
  nb_model_config cfg;
  golden_gpt2_config(ctx, c, &cfg);
  nb_tree *params = ordered_params(ctx, &cfg, loaded);
  nb_tree *batch = golden_batch(ctx, j);
  nb_tree *out = nb_tree_create(ctx);
  golden_loss_and_grads(ctx, &cfg, NULL, params, batch, out);
  nb_array *loss = nb_tree_get_array(out, "loss");
  double want = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "loss"));
  if (loss) printf("gpt2 loss: nabla %.7f, reference %.7f\n", nb_array_get(loss, 0), want);
  CHECK(loss && fabs(nb_array_get(loss, 0) - want) < 1e-5);
  double worst = 0;
  const char *worst_path = "";
  size_t n_grads = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    char gp[300], rp[300];
    snprintf(gp, sizeof gp, "grad/params/%s", nb_tree_path(params, i));
    snprintf(rp, sizeof rp, "grad/%s", nb_tree_path(params, i));
    nb_array *got = nb_tree_get_array(out, gp), *ref = nb_tree_get_array(loaded, rp);
    CHECK_MSG(got && ref && nb_array_size(got) == nb_array_size(ref), "gradient %s missing", gp);
    if (!got || !ref) continue;
    double scale = 0, d = 0;
    for (int64_t k = 0; k < nb_array_size(ref); k++) scale = fmax(scale, fabs(nb_array_get(ref, k)));
    for (int64_t k = 0; k < nb_array_size(ref); k++) d = fmax(d, fabs(nb_array_get(got, k) - nb_array_get(ref, k)));
    /* relative to the tensor's largest gradient; key biases have a zero
     * true gradient (softmax ignores a per-query constant), so a small
     * absolute floor covers their float noise */
    double rel = d / (scale + 1e-2);
    if (rel > worst) worst = rel, worst_path = nb_tree_path(params, i);
    n_grads++;
  }
  printf("gpt2 gradients: %zu tensors, worst relative difference %.3g (%s)\n", n_grads, worst, worst_path);
  CHECK_MSG(n_grads == nb_tree_size(params) && worst < 1e-4, "gradient %s differs by %g (relative)", worst_path, worst);
  nb_tree_destroy(out);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_tree_destroy(loaded);
  cJSON_Delete(j);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_llama(ctx);
  test_gpt2(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/golden");
}
