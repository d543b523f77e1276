/* A loaded model from a config, weights and a tokenizer: what the loaders of
 * trained runs (train/load.c) and of Hugging Face folders (hf.c) end with. */
#include <string.h>

#include "models/internal.h"

/* Whether `kernel` is a quantized tree in t (nabla/quant.h: the arrays
 * under "<kernel>/", its layout in "<kernel>/quant"); the quant library
 * checks the arrays against the layout when it runs them. */
static bool quantized_kernel(const nb_tree *t, const char *kernel) {
  size_t n = strlen(kernel);
  char q[NB_NN_PATH_MAX + 8];
  if (n < 7 || strcmp(kernel + n - 7, "/kernel") || n + 7 > sizeof q) return false;
  snprintf(q, sizeof q, "%s/quant", kernel);
  return nb_tree_find(t, q) >= 0;
}

/* The kernel path of spec that p ("<kernel>/values") lies under, quantized in t. */
static bool under_quantized_kernel(const nb_tree *spec, const nb_tree *t, const char *p) {
  const char *slash = strrchr(p, '/');
  char k[NB_NN_PATH_MAX + 8];
  if (!slash || (size_t)(slash - p) >= sizeof k) return false;
  memcpy(k, p, (size_t)(slash - p)), k[slash - p] = 0;
  return nb_tree_find(spec, k) >= 0 && quantized_kernel(t, k);
}

nb_tree *nb_model__params_f32(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *loaded, const char *where) {
  nb_tree *spec = nb_model_param_spec(ctx, cfg, NB_F32);
  nb_tree *out = spec ? nb_tree_create(ctx) : NULL;
  nb_status s = out ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    nb_aval want = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    nb_array *x = nb_tree_get_array(loaded, p);
    char a[96], b[96];
    if (!x && quantized_kernel(loaded, p)) { /* passed through as it is */
      nb_tree *sub = nb_tree_select_prefix(loaded, p, true);
      s = sub ? nb_tree_merge(out, p, sub) : NB_ERR_NOMEM;
      nb_tree_destroy(sub);
      continue;
    }
    if (!x) {
      s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: parameter '%s' is missing (the model config wants %s)", where, p,
                    nb_aval_str(&want, b, sizeof b));
      break;
    }
    nb_aval have = nb_array_aval(x);
    if (!nb_shape_equal(&have.shape, &want.shape) || !nb_dtype_is_float(have.dtype)) {
      s = nb_errorf(ctx, NB_ERR_SHAPE, "%s: parameter '%s' is %s, the model config wants %s", where, p,
                    nb_aval_str(&have, a, sizeof a), nb_aval_str(&want, b, sizeof b));
      break;
    }
    nb_array *f = nb_array_astype(ctx, x, NB_F32);
    s = f ? nb_tree_set_array(out, p, f) : NB_ERR_NOMEM;
    nb_array_release(f);
  }
  /* weights the config has no place for (more layers, a bias, an lm_head
   * next to tied embeddings) mean the config describes another model */
  for (size_t i = 0; !s && i < nb_tree_size(loaded); i++) {
    const char *p = nb_tree_path(loaded, i);
    if (nb_tree_find(spec, p) < 0 && !under_quantized_kernel(spec, loaded, p)) {
      char a[96];
      nb_aval have = nb_leaf_get_aval(nb_tree_leaf(loaded, i));
      s = nb_errorf(ctx, NB_ERR_SHAPE, "%s: parameter '%s' (%s) is not in the model the config describes: the config "
                    "does not match the weights", where, p, nb_aval_str(&have, a, sizeof a));
    }
  }
  nb_tree_destroy(spec);
  if (!s) return out;
  nb_tree_destroy(out);
  return NULL;
}

void nb_model__tok_stops(nb_model_loaded *m) {
  static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "</s>", "<eos>", NULL};
  for (int i = 0; m->tok && names[i] && m->n_eos < 8; i++) {
    int32_t id = nb_tok_added_id(m->tok, names[i]);
    bool have = false;
    for (int k = 0; k < m->n_eos; k++) have |= m->eos_ids[k] == id;
    if (id >= 0 && !have) m->eos_ids[m->n_eos++] = id;
  }
}

void nb_model_loaded_free(nb_model_loaded *m) {
  if (!m) return;
  nb_tree_destroy(m->params);
  nb_tok_destroy(m->tok);
  memset(m, 0, sizeof *m);
  m->bos_id = -1;
}

nb_status nb_model_loaded_make(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const char *tokenizer_path,
                               const char *where, nb_model_loaded *out) {
  if (!cfg || !params || !where || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_model_loaded_make: NULL argument");
  memset(out, 0, sizeof *out);
  out->cfg = *cfg;
  out->bos_id = -1;
  out->params = nb_model__params_f32(ctx, cfg, params, where);
  nb_status s = out->params ? NB_OK : nb_ctx_status(ctx);
  if (!s && tokenizer_path && tokenizer_path[0]) {
    out->tok = nb_tok_load(ctx, tokenizer_path);
    if (out->tok) nb_model__tok_stops(out);
    else s = nb_ctx_status(ctx);
  }
  if (s) nb_model_loaded_free(out);
  return s;
}
