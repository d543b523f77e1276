/* Loading a trained model for generation from what the trainer writes: a
 * run directory (config.yaml + a checkpoint manager directory) or one of its
 * checkpoint step directories. Hugging Face folders are hf.c. */
#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#include "models/internal.h"
#include "nabla/ckpt.h"

nb_tree *nb_model__params_f32(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *loaded, const char *where) {
  nb_tree *spec = nb_model_param_spec(ctx, cfg, NB_F32);
  nb_tree *out = spec ? nb_tree_create(ctx) : NULL;
  nb_status s = out ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    nb_aval want = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    nb_array *x = nb_tree_get_array(loaded, p);
    char a[96], b[96];
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
    if (nb_tree_find(spec, p) < 0) {
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

static bool exists(const char *p) { return access(p, F_OK) == 0; }

/* data.tokenizer as given (absolute, or relative to the working directory),
 * else relative to the run directory; "" is byte level */
static nb_status load_tokenizer(nb_ctx *ctx, const nb_model_run_config *rc, const char *run_dir, const char *cfg_path,
                                nb_model_loaded *m) {
  const char *t = rc->data.tokenizer;
  if (!t[0]) return NB_OK;
  char rel[4200];
  snprintf(rel, sizeof rel, "%s/%s", run_dir, t);
  const char *use = exists(t) ? t : t[0] != '/' && exists(rel) ? rel : NULL;
  if (!use)
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: data.tokenizer '%s' not found (tried it as given and as '%s')", cfg_path, t,
                     rel);
  m->tok = nb_tok_load(ctx, use);
  if (!m->tok) return nb_ctx_status(ctx);
  nb_model__tok_stops(m);
  return NB_OK;
}

/* The config the trainer stored in the checkpoint's metadata ("config": the
 * resolved config as YAML) against the one given: the model must be the
 * same, also in what no weight shape shows (heads, RoPE, norm, activation).
 * A checkpoint without one (older, or imported) has nothing to compare. */
static nb_status check_stored_config(nb_ctx *ctx, const nb_ckpt_info *info, const char *cfg_path,
                                     const nb_model_run_config *rc, const char *where) {
  const char *meta = info ? nb_ckpt_info_metadata(info) : NULL;
  cJSON *j = meta ? cJSON_Parse(meta) : NULL;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "config");
  nb_status s = NB_OK;
  if (cJSON_IsString(text)) {
    nb_model_run_config stored;
    char name[4400], diff[1024];
    snprintf(name, sizeof name, "%s: the config stored in the checkpoint", where);
    s = nb_model_run_config_parse(ctx, name, text->valuestring, strlen(text->valuestring), 0, NULL, &stored);
    if (!s) {
      nb_model_run_config_diff(&stored, rc, "model.", diff, sizeof diff);
      if (diff[0])
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG,
                      "%s: %s describes another model than the one these weights were trained as (the config stored "
                      "in the checkpoint): %s differ", where, cfg_path, diff);
    }
  }
  cJSON_Delete(j);
  return s;
}

/* config, params (from the restored tree "params/..."), tokenizer; info
 * (may be NULL) is the step's, for the config stored in it */
static nb_status finish(nb_ctx *ctx, const char *cfg_path, const char *run_dir, const char *where, nb_tree *restored,
                        const nb_ckpt_info *info, nb_model_loaded *out) {
  nb_model_run_config rc;
  nb_status s = nb_model_run_config_load(ctx, cfg_path, 0, NULL, &rc);
  if (!s) s = check_stored_config(ctx, info, cfg_path, &rc, where);
  nb_tree *p = s ? NULL : nb_tree_select_prefix(restored, "params", true);
  if (!s && !p) s = NB_ERR_NOMEM;
  if (!s && nb_tree_size(p) == 0) s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: the checkpoint has no item 'params'", where);
  if (!s) {
    out->cfg = rc.model;
    out->params = nb_model__params_f32(ctx, &rc.model, p, where);
    if (!out->params) s = nb_ctx_status(ctx);
  }
  if (!s) s = load_tokenizer(ctx, &rc, run_dir, cfg_path, out);
  nb_tree_destroy(p);
  if (s) nb_model_loaded_free(out);
  return s;
}

static void init_out(nb_model_loaded *out, const char *what, const char *path) {
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  snprintf(out->what, sizeof out->what, "%s %s", what, path);
}

nb_status nb_model_load_run_dir(nb_ctx *ctx, const char *dir, const char *config_path, nb_model_loaded *out) {
  if (!dir || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "load run dir: NULL argument");
  init_out(out, "run dir", dir);
  char cfg[4200], ck[4200];
  snprintf(cfg, sizeof cfg, "%s/config.yaml", dir);
  snprintf(ck, sizeof ck, "%s/checkpoints", dir);
  if (!exists(dir)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "run dir '%s' does not exist", dir);
  if (!config_path && !exists(cfg))
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "run dir '%s': no config.yaml (the run config the trainer writes)", dir);
  if (!exists(ck)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "run dir '%s': no checkpoints/ directory", dir);
  nb_ckpt_options o = {.directory = ck, .read_only = true};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  int64_t step = -1;
  nb_status s = m ? nb_ckpt_latest_step(m, &step) : nb_ctx_status(ctx);
  if (!s && step < 0) s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "run dir '%s': %s holds no committed checkpoint step", dir, ck);
  const char *items[] = {"params"};
  nb_ckpt_restore_opts ro = {.items = items, .n_items = 1};
  nb_tree *t = s ? NULL : nb_ckpt_restore(m, step, &ro);
  if (!s && !t) s = nb_ctx_status(ctx);
  char where[4300];
  snprintf(where, sizeof where, "%s (step %lld)", ck, (long long)step);
  nb_ckpt_info *info = s ? NULL : nb_ckpt_info_load(m, step);
  if (!s && !info) s = nb_ctx_status(ctx);
  if (!s) s = finish(ctx, config_path ? config_path : cfg, dir, where, t, info, out);
  nb_ckpt_info_destroy(info);
  if (!s) snprintf(out->what, sizeof out->what, "run dir %s, step %lld", dir, (long long)step);
  nb_tree_destroy(t);
  nb_ckpt_manager_destroy(m);
  return s;
}

nb_status nb_model_load_checkpoint(nb_ctx *ctx, const char *step_dir, const char *config_path, nb_model_loaded *out) {
  if (!step_dir || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "load checkpoint: NULL argument");
  init_out(out, "checkpoint", step_dir);
  if (!exists(step_dir)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "checkpoint step '%s' does not exist", step_dir);
  char run[4200], cfg[4300];
  snprintf(run, sizeof run, "%s/../..", step_dir);
  snprintf(cfg, sizeof cfg, "%s/config.yaml", run);
  if (!config_path && !exists(cfg))
    return nb_errorf(ctx, NB_ERR_NOT_FOUND,
                     "checkpoint step '%s': no run config at '%s' (the run dir two levels up); give one with --config", step_dir,
                     cfg);
  const char *items[] = {"params"};
  nb_ckpt_restore_opts ro = {.items = items, .n_items = 1};
  nb_tree *t = nb_ckpt_read_dir(ctx, step_dir, &ro);
  nb_ckpt_info *info = t ? nb_ckpt_info_open(ctx, step_dir) : NULL;
  nb_status s = t && info ? finish(ctx, config_path ? config_path : cfg, run, step_dir, t, info, out) : nb_ctx_status(ctx);
  nb_ckpt_info_destroy(info);
  nb_tree_destroy(t);
  return s;
}
