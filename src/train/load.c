/* Loading a trained model for generation from what the trainer writes: a
 * run directory (config.yaml + a checkpoint manager directory) or one of its
 * checkpoint step directories, and the weights a run starts from
 * (init_from: those, or a Hugging Face directory). The model is assembled by
 * models (nb_model_loaded_make); this file knows the run directory and its
 * config. */
#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#include "nabla/ckpt.h"
#include "train/internal.h"

static bool exists(const char *p) { return access(p, F_OK) == 0; }

/* data.tokenizer as given (absolute, or relative to the working directory),
 * else relative to the run directory, into path[cap]; "" is byte level */
static nb_status find_tokenizer(nb_ctx *ctx, const nb_train_config *rc, const char *run_dir, const char *cfg_path,
                                char *path, size_t cap) {
  const char *t = rc->data.tokenizer;
  path[0] = 0;
  if (!t[0]) return NB_OK;
  char rel[4200];
  snprintf(rel, sizeof rel, "%s/%s", run_dir, t);
  const char *use = exists(t) ? t : t[0] != '/' && exists(rel) ? rel : NULL;
  if (!use)
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: data.tokenizer '%s' not found (tried it as given and as '%s')", cfg_path, t,
                     rel);
  snprintf(path, cap, "%s", use);
  return NB_OK;
}

/* The config the trainer stored in the checkpoint's metadata ("config": the
 * resolved config as YAML) against the one given: the model must be the
 * same, also in what no weight shape shows (heads, RoPE, norm, activation).
 * A checkpoint without one (older, or imported) has nothing to compare. */
static nb_status check_stored_config(nb_ctx *ctx, const nb_ckpt_info *info, const char *cfg_path,
                                     const nb_train_config *rc, const char *where) {
  const char *meta = info ? nb_ckpt_info_metadata(info) : NULL;
  cJSON *j = meta ? cJSON_Parse(meta) : NULL;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "config");
  nb_status s = NB_OK;
  if (cJSON_IsString(text)) {
    nb_train_config stored;
    char name[4400], diff[1024];
    snprintf(name, sizeof name, "%s: the config stored in the checkpoint", where);
    s = nb_train_config_parse(ctx, name, text->valuestring, strlen(text->valuestring), 0, NULL, &stored);
    if (!s) {
      nb_train_config_diff(&stored, rc, "model.", diff, sizeof diff);
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
  nb_train_config rc;
  nb_status s = nb_train_config_load(ctx, cfg_path, 0, NULL, &rc);
  if (!s) s = check_stored_config(ctx, info, cfg_path, &rc, where);
  nb_tree *p = s ? NULL : nb_tree_select_prefix(restored, "params", true);
  if (!s && !p) s = NB_ERR_NOMEM;
  if (!s && nb_tree_size(p) == 0) s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: the checkpoint has no item 'params'", where);
  char tok[4200];
  if (!s) s = find_tokenizer(ctx, &rc, run_dir, cfg_path, tok, sizeof tok);
  if (!s) {
    char what[sizeof out->what];
    snprintf(what, sizeof what, "%s", out->what);
    s = nb_model_loaded_make(ctx, &rc.model, p, tok, where, out);
    snprintf(out->what, sizeof out->what, "%s", what);
  }
  nb_tree_destroy(p);
  return s;
}

static void init_out(nb_model_loaded *out, const char *what, const char *path) {
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  snprintf(out->what, sizeof out->what, "%s %s", what, path);
}

nb_status nb_train_load_run_dir(nb_ctx *ctx, const char *dir, const char *config_path, nb_model_loaded *out) {
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

nb_status nb_train_load_checkpoint(nb_ctx *ctx, const char *step_dir, const char *config_path, nb_model_loaded *out) {
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

/* ---------------------------------------------------------------- init_from */

/* A checkpoint's params (step dir, or the latest step of a manager dir) and
 * its model config: stored in its metadata, else the run config at
 * cfg_guess, else the run's own (an imported checkpoint) */
static nb_status load_checkpoint_params(nb_ctx *ctx, const char *src, bool step_dir, bool want_params,
                                        const nb_train_config *run, nb_model_loaded *out) {
  char where[4300], cfg_guess[4300];
  const char *items[] = {"params"};
  nb_ckpt_restore_opts ro = {.items = items, .n_items = 1, .no_mmap = true};
  nb_ckpt_manager *m = NULL;
  nb_ckpt_info *info = NULL;
  nb_tree *t = NULL;
  int64_t step = -1;
  nb_status s = NB_OK;
  if (step_dir) {
    snprintf(where, sizeof where, "checkpoint %s", src);
    snprintf(cfg_guess, sizeof cfg_guess, "%s/../../config.yaml", src);
    t = want_params ? nb_ckpt_read_dir(ctx, src, &ro) : nb_tree_create(ctx);
    info = t ? nb_ckpt_info_open(ctx, src) : NULL;
  } else {
    snprintf(cfg_guess, sizeof cfg_guess, "%s/../config.yaml", src);
    m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = src, .read_only = true});
    s = m ? nb_ckpt_latest_step(m, &step) : nb_ctx_status(ctx);
    if (!s && step < 0) s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "init_from '%s': no committed checkpoint step in it", src);
    snprintf(where, sizeof where, "checkpoint %s (step %lld)", src, (long long)step);
    t = s ? NULL : want_params ? nb_ckpt_restore(m, step, &ro) : nb_tree_create(ctx);
    info = t ? nb_ckpt_info_load(m, step) : NULL;
  }
  if (!s && (!t || !info)) s = nb_train__wrapf(ctx, nb_ctx_status(ctx), "init_from '%s'", src);
  const char *meta = info ? nb_ckpt_info_metadata(info) : NULL;
  cJSON *j = meta ? cJSON_Parse(meta) : NULL;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "config");
  nb_train_config stored = *run;
  if (!s && cJSON_IsString(text)) {
    char name[4400];
    snprintf(name, sizeof name, "%s: the config stored in the checkpoint", where);
    s = nb_train_config_parse(ctx, name, text->valuestring, strlen(text->valuestring), 0, NULL, &stored);
  } else if (!s && exists(cfg_guess)) {
    s = nb_train_config_load(ctx, cfg_guess, 0, NULL, &stored);
  }
  nb_tree *p = s || !want_params ? NULL : nb_tree_select_prefix(t, "params", true);
  if (!s && want_params && !p) s = NB_ERR_NOMEM;
  if (!s && want_params) s = nb_model_loaded_make(ctx, &stored.model, p, NULL, where, out);
  if (!s && !want_params) out->cfg = stored.model;
  if (!s) snprintf(out->what, sizeof out->what, "%.500s", where);
  nb_tree_destroy(p);
  cJSON_Delete(j);
  nb_ckpt_info_destroy(info);
  nb_tree_destroy(t);
  nb_ckpt_manager_destroy(m);
  return s;
}

/* every leaf a fresh host array: the step updates its parameters in place,
 * never a file's mapping or an array someone else holds. src is emptied
 * leaf by leaf, so at most one leaf is held twice. */
static nb_tree *fresh_copy(nb_ctx *ctx, nb_tree *src) {
  nb_tree *out = nb_tree_create(ctx);
  nb_status s = out ? NB_OK : NB_ERR_NOMEM;
  while (!s && nb_tree_size(src) > 0) {
    char path[NB_NN_PATH_MAX];
    snprintf(path, sizeof path, "%s", nb_tree_path(src, 0));
    nb_array *x = nb_tree_leaf(src, 0)->array;
    nb_aval av = nb_array_aval(x);
    nb_array *y = nb_array_create(ctx, av.dtype, av.shape.rank, av.shape.dims, nb_array_data(x));
    s = y ? nb_tree_set_array(out, path, y) : nb_ctx_status(ctx);
    nb_array_release(y);
    if (!s) s = nb_tree_remove(src, path);
  }
  if (s) nb_tree_destroy(out);
  return s ? NULL : out;
}

nb_status nb_train_init_from(nb_ctx *ctx, const char *source, const nb_train_config *run, nb_model_config *model,
                             nb_tree **params) {
  if (!source || !source[0] || !run || !model)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "init_from: NULL or empty argument");
  if (params) *params = NULL;
  char p[4200], q[4200];
  snprintf(p, sizeof p, "%s/config.json", source);
  snprintf(q, sizeof q, "%s/checkpoints", source);
  nb_model_loaded m;
  memset(&m, 0, sizeof m);
  nb_status s;
  if (!exists(source)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "init_from '%s' does not exist", source);
  if (exists(p)) {
    s = params ? nb_model_load_hf(ctx, source, &m) : nb_model_load_hf_config(ctx, source, &m);
    if (!s && m.sliding_window && run->data.seq_len > m.sliding_window)
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                    "init_from '%s': config.json's sliding_window (%lld) is shorter than data.seq_len (%lld): nabla has no "
                    "windowed attention, so it would compute another model; lower data.seq_len to at most %lld",
                    source, (long long)m.sliding_window, (long long)run->data.seq_len, (long long)m.sliding_window);
  } else if (exists(q) && params) {
    s = nb_train_load_run_dir(ctx, source, NULL, &m);
  } else if (exists(q)) { /* its config.yaml is enough */
    nb_train_config rc;
    snprintf(p, sizeof p, "%s/config.yaml", source);
    s = nb_train_config_load(ctx, p, 0, NULL, &rc);
    m.cfg = rc.model;
  } else {
    snprintf(p, sizeof p, "%s/COMMIT", source);
    bool step_dir = exists(p);
    snprintf(p, sizeof p, "%s/config.yaml", source);
    if (!step_dir && exists(p))
      return nb_errorf(ctx, NB_ERR_NOT_FOUND, "init_from '%s': a run dir without checkpoints/ (nothing trained yet)", source);
    s = load_checkpoint_params(ctx, source, step_dir, params != NULL, run, &m);
    if (s && nb_ctx_status(ctx) == NB_ERR_NOT_FOUND && !step_dir)
      s = nb_train__wrapf(ctx, s, "init_from '%s' is neither a Hugging Face directory (config.json), a run dir "
                          "(checkpoints/), a checkpoint step (COMMIT) nor a checkpoint directory", source);
  }
  if (!s) s = nb_train__model_from(ctx, run, &m.cfg, source, model);
  if (!s && run->data.seq_len > model->max_seq_len)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "init_from '%s': data.seq_len (%lld) exceeds the model's max_seq_len (%lld)",
                  source, (long long)run->data.seq_len, (long long)model->max_seq_len);
  if (!s && params && !(*params = fresh_copy(ctx, m.params))) s = nb_ctx_status(ctx);
  nb_model_loaded_free(&m);
  return s;
}
