/* SFT runs: the sft/lora config sections, the base and the data prepared
 * for the trainer's loop (nb_train_run with a source: the adapters as the
 * trainable parameters, the base frozen), and merging a run's adapters into
 * a run dir of the merged model. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "nabla/ckpt.h"
#include "nabla/posttrain.h"
#include "nabla/quant.h"
#include "nabla/tokenizer.h"

/* ---------------------------------------------------------------- config */

void nb_pt_sft_config_defaults(nb_pt_sft_config *c) {
  *c = (nb_pt_sft_config){.chat = NB_SERVE_CHAT_CHATML, .lora = {.rank = 8, .alpha = 16}};
}

static const char sft_keys[] = "sft.base, sft.chat_template, sft.quant_rules, lora.target, lora.rank, lora.alpha, "
                               "lora.dropout, lora.rslora, lora.init, lora.merge_at_end";

static nb_status set_str(nb_ctx *ctx, const char *where, const char *key, const char *v, char *dst) {
  if (strlen(v) >= NB_TRAIN_STR_MAX) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: longer than %d bytes", where, key, NB_TRAIN_STR_MAX - 1);
  snprintf(dst, NB_TRAIN_STR_MAX, "%s", v);
  return NB_OK;
}

static nb_status set_key(void *ud, nb_ctx *ctx, const char *where, const char *key, const char *v) {
  nb_pt_sft_config *c = ud;
  if (!strcmp(key, "sft.base")) return set_str(ctx, where, key, v, c->base);
  if (!strcmp(key, "sft.quant_rules")) return set_str(ctx, where, key, v, c->quant_rules);
  if (!strcmp(key, "lora.merge_at_end")) {
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) c->merge_at_end = true;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) c->merge_at_end = false;
    else return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not a boolean (true or false)", where, key, v);
    return NB_OK;
  }
  if (!strcmp(key, "sft.chat_template")) {
    c->chat = nb_serve_chat_format_parse(v);
    if (c->chat == NB_SERVE_CHAT_NONE)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not one of: %s", where, key, v, nb_serve_chat_known());
    return NB_OK;
  }
  nb_status s = nb_pt__set_lora_key(ctx, where, key, v, c->lora_target, &c->lora);
  if (s != NB_ERR_NOT_FOUND) return s;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (keys of sft and lora: %s)", where, key, sft_keys);
}

nb_status nb_pt_sft_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                nb_pt_sft_config *sft, nb_train_config *train) {
  static const char *const sections[] = {"sft", "lora", NULL};
  nb_pt_sft_config c;
  nb_pt_sft_config_defaults(&c);
  /* validated once the base's model replaces the file's (prepare) */
  nb_train_config_ext ext = {.sections = sections, .set = set_key, .ud = &c, .no_validate = true};
  nb_status s = nb_train_config_load_ext(ctx, path, n_overrides, overrides, &ext, train);
  /* init_from= names the base as in nabla train; the trainer's own init_from
   * would load it as the trainable parameters, which are the adapters here */
  if (!s && train->init_from[0]) {
    if (c.base[0] && strcmp(c.base, train->init_from))
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "init_from '%s' and sft.base '%s' name different models: give one", train->init_from,
                    c.base);
    else snprintf(c.base, sizeof c.base, "%s", train->init_from);
    train->init_from[0] = 0;
  }
  if (!s && !c.base[0])
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft.base (or init_from): not set (the run dir, checkpoint or Hugging Face folder to fine-tune)");
  if (!s && c.lora_target[0]) {
    nb_pt_lora_config lc = c.lora;
    lc.target = c.lora_target;
    s = nb_pt_lora_config_check(ctx, &lc);
  }
  if (!s && c.quant_rules[0] && !c.lora_target[0])
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft.quant_rules: a quantized base trains only adapters: set lora.target");
  if (!s && c.merge_at_end && !c.lora_target[0])
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.merge_at_end: there are no adapters to merge without lora.target");
  if (!s) *sft = c;
  return s;
}

/* a YAML double-quoted scalar */
void nb_pt__yaml_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

char *nb_pt_sft_config_yaml(const nb_pt_sft_config *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  fputs("sft:\n  base: ", f), nb_pt__yaml_str(f, c->base);
  fprintf(f, "\n  chat_template: %s\n  quant_rules: ", nb_serve_chat_format_name(c->chat)), nb_pt__yaml_str(f, c->quant_rules);
  fputs("\nlora:\n  target: ", f), nb_pt__yaml_str(f, c->lora_target);
  fprintf(f, "\n  rank: %lld\n  alpha: %.17g\n  dropout: %.17g\n  rslora: %s\n  init: %s\n  merge_at_end: %s\n",
          (long long)c->lora.rank, c->lora.alpha, c->lora.dropout, c->lora.rslora ? "true" : "false",
          nb_pt_lora_init_name(c->lora.init), c->merge_at_end ? "true" : "false");
  return fclose(f) ? (free(buf), NULL) : buf;
}

/* ---------------------------------------------------------------- the base */

/* the base tree training sees: quantized by the rules (QLoRA) or as loaded */
static nb_tree *base_tree(nb_ctx *ctx, const nb_pt_sft_config *sft, const nb_tree *params) {
  if (!sft->quant_rules[0]) return nb_tree_copy(params);
  nb_quant_rules *r = nb_quant_rules_load_yaml(ctx, sft->quant_rules);
  nb_tree *q = r ? nb_quant_ptq(ctx, params, r) : NULL;
  nb_quant_rules_destroy(r);
  if (q && nb_quant_tree_count(ctx, q) == 0) {
    nb_tree_destroy(q);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft.quant_rules: no rule of %s matches a linear of the base", sft->quant_rules), NULL;
  }
  return q;
}

/* ---------------------------------------------------------------- data */

/* A view of examples [lo, hi) of d (not owning them). */
static nb_pt_sft_data view(const nb_pt_sft_data *d, int64_t lo, int64_t hi) {
  nb_pt_sft_data v = {.n = hi - lo, .ex = d->ex + lo};
  for (int64_t i = 0; i < v.n; i++) {
    v.tokens += v.ex[i].len;
    for (int64_t k = 0; k < v.ex[i].len; k++) v.train_tokens += v.ex[i].train[k];
  }
  return v;
}

/* FNV-1a over the ids and their train flags: what a checkpoint's data position depends on */
static uint64_t data_id(const nb_pt_sft_data *d) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < d->n; i++)
    for (int64_t k = 0; k < d->ex[i].len; k++) {
      uint64_t v = (uint64_t)(uint32_t)d->ex[i].ids[k] << 1 | d->ex[i].train[k];
      for (int b = 0; b < 5; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
  return h;
}

static nb_status check_vocab(nb_ctx *ctx, const char *path, const nb_pt_sft_data *d, int64_t vocab) {
  for (int64_t i = 0; i < d->n; i++)
    for (int64_t k = 0; k < d->ex[i].len; k++)
      if (d->ex[i].ids[k] < 0 || d->ex[i].ids[k] >= vocab)
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: example %lld: token id %d is outside the model's vocabulary (%lld)",
                         path, (long long)i + 1, d->ex[i].ids[k], (long long)vocab);
  return NB_OK;
}

typedef struct prepared {
  nb_model_loaded m;
  nb_pt_sft_data train_all, eval_all, train, eval;
  nb_tree *base;       /* frozen (LoRA) or trainable (full) */
  nb_tree *adapters;
  nb_pt_lora *lora;
  nb_pt_lora_config lc;
  nb_train_config cfg; /* the run's config, model from the base */
} prepared;

static void prepared_free(prepared *p) {
  nb_pt_lora_destroy(p->lora);
  nb_tree_destroy(p->adapters);
  nb_tree_destroy(p->base);
  nb_pt_sft_data_free(&p->train_all);
  nb_pt_sft_data_free(&p->eval_all);
  nb_model_loaded_free(&p->m);
}

/* The base, the adapters and (with_data) the examples of a run. */
static nb_status prepare(nb_ctx *ctx, const nb_pt_sft_config *sft, const nb_train_config *cfg, bool with_data, prepared *p) {
  nb_status s = nb_pt__load_base(ctx, "sft.base", sft->base, &p->m);
  if (s) return s;
  p->cfg = *cfg;
  p->cfg.model = p->m.cfg; /* the base defines the model */
  if ((s = nb_train_config_validate(ctx, &p->cfg))) return s;
  if (with_data) {
    nb_pt_sft_data_opts o = {.chat = sft->chat, .tok = p->m.tok, .bos_id = p->m.bos_id,
                             .eos_id = p->m.n_eos ? p->m.eos_ids[0] : -1, .max_len = cfg->data.seq_len + 1};
    if (!cfg->data.train[0]) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "data.train: not set (a JSONL file of examples)");
    if ((s = nb_pt_sft_load(ctx, cfg->data.train, &o, &p->train_all))) return s;
    if ((s = check_vocab(ctx, cfg->data.train, &p->train_all, p->m.cfg.vocab_size))) return s;
    if (cfg->data.eval[0]) {
      if ((s = nb_pt_sft_load(ctx, cfg->data.eval, &o, &p->eval_all))) return s;
      if ((s = check_vocab(ctx, cfg->data.eval, &p->eval_all, p->m.cfg.vocab_size))) return s;
      p->train = view(&p->train_all, 0, p->train_all.n), p->eval = view(&p->eval_all, 0, p->eval_all.n);
    } else { /* hold out the last 5% (at least one example) */
      int64_t n = p->train_all.n, ne = n / 20 > 0 ? n / 20 : 1;
      if (n < 2) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "data.train: %s has 1 example: give data.eval too", cfg->data.train);
      p->train = view(&p->train_all, 0, n - ne), p->eval = view(&p->train_all, n - ne, n);
    }
  }
  p->base = base_tree(ctx, sft, p->m.params);
  if (!p->base) return nb_ctx_status(ctx);
  if (!sft->lora_target[0]) return NB_OK;
  p->lc = sft->lora;
  p->lc.target = sft->lora_target;
  nb_array *root = nb_key(ctx, (uint64_t)cfg->seed);
  nb_array *key = root ? nb_key_fold_in(ctx, root, 0x4c6f5241u) : NULL; /* "LoRA": not the model init's stream */
  p->adapters = key ? nb_pt_lora_init(ctx, &p->lc, p->base, key, NB_F32) : NULL;
  nb_array_release(root);
  nb_array_release(key);
  p->lora = p->adapters ? nb_pt_lora_create(ctx, &p->lc, p->base, p->adapters) : NULL;
  if (!p->lora) return nb_ctx_status(ctx);
  return NB_OK;
}

/* ---------------------------------------------------------------- merged run dirs */

/* DIR/config.yaml (cfg with the tokenizer beside it), DIR/tokenizer.json,
 * DIR/checkpoints/step_<step> with item "params". */
static nb_status write_model_dir(nb_ctx *ctx, const char *dir, const nb_train_config *cfg, const nb_tok *tok,
                                 const nb_tree *params, int64_t step, const char *what) {
  if (mkdir(dir, 0777)) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot create %s: %s", what, dir, strerror(errno));
  nb_train_config rc = *cfg;
  snprintf(rc.data.tokenizer, sizeof rc.data.tokenizer, "%s", tok ? "tokenizer.json" : "");
  rc.data.train[0] = rc.data.eval[0] = 0;
  char path[NB_TRAIN_STR_MAX + 64];
  if (tok) {
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (nb_tok_save_hf(tok, path)) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot write %s", what, path);
  }
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  FILE *f = fopen(path, "w");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot write %s: %s", what, path, strerror(errno));
  nb_train_config_write(&rc, f);
  if (fclose(f)) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot write %s", what, path);
  snprintf(path, sizeof path, "%s/checkpoints", dir);
  nb_ckpt_manager *cm = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = path});
  nb_ckpt_item item = {"params", params};
  char meta[128];
  snprintf(meta, sizeof meta, "{\"step\": %lld, \"merged\": true}", (long long)step);
  nb_ckpt_save_opts so = {.metadata_json = meta, .force = true};
  nb_status s = cm ? nb_ckpt_save(cm, step, &item, 1, &so, NULL) : nb_ctx_status(ctx);
  if (!s) s = nb_ckpt_wait_until_finished(cm);
  nb_ckpt_manager_destroy(cm);
  return s;
}

/* the latest "params" of DIR/checkpoints (the adapters of a LoRA run) */
static nb_tree *latest_params(nb_ctx *ctx, const char *run_dir, const nb_tree *like, int64_t *step) {
  char path[NB_TRAIN_STR_MAX + 64];
  snprintf(path, sizeof path, "%s/checkpoints", run_dir);
  nb_ckpt_manager *cm = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = path, .read_only = true});
  nb_status s = cm ? nb_ckpt_latest_step(cm, step) : nb_ctx_status(ctx);
  if (!s && *step < 0) s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "lora merge: %s holds no checkpoint", path);
  nb_tree *target = s ? NULL : nb_tree_create(ctx);
  for (size_t i = 0; target && i < nb_tree_size(like); i++) {
    char p[600];
    snprintf(p, sizeof p, "params/%s", nb_tree_path(like, i));
    nb_tree_set(target, p, nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(like, i))));
  }
  static const char *const items[] = {"params"};
  nb_ckpt_restore_opts ro = {.items = items, .n_items = 1, .target = target, .no_mmap = true};
  nb_tree *r = target ? nb_ckpt_restore(cm, *step, &ro) : NULL;
  nb_tree *params = r ? nb_tree_select_prefix(r, "params", true) : NULL;
  nb_tree_destroy(r);
  nb_tree_destroy(target);
  nb_ckpt_manager_destroy(cm);
  if (!params && !s) {
    char cause[2048];
    snprintf(cause, sizeof cause, "%s", nb_ctx_error(ctx));
    nb_errorf(ctx, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_FORMAT, "lora merge: the adapters of %s: %s", run_dir, cause);
  }
  return params;
}

static nb_status merge_into(nb_ctx *ctx, prepared *p, const char *run_dir, const char *out_dir) {
  int64_t step;
  nb_tree *ad = latest_params(ctx, run_dir, p->adapters, &step);
  nb_tree *merged = ad ? nb_pt_lora_merge(ctx, &p->lc, p->base, ad) : NULL;
  nb_status s = merged ? write_model_dir(ctx, out_dir, &p->cfg, p->m.tok, merged, step, "lora merge") : nb_ctx_status(ctx);
  nb_tree_destroy(merged);
  nb_tree_destroy(ad);
  return s;
}

/* A LoRA SFT run's config and prepared base and adapters, for `what` (lora
 * merge, lora export) writing into out_dir, which must not exist. */
static nb_status open_lora_run(nb_ctx *ctx, const char *what, const char *run_dir, const char *out_dir, nb_pt_sft_config *sft,
                               prepared *p) {
  if (!run_dir || !out_dir) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: NULL run dir or output", what);
  struct stat st;
  if (!stat(out_dir, &st)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s exists: give a new directory", what, out_dir);
  char path[NB_TRAIN_STR_MAX + 64];
  snprintf(path, sizeof path, "%s/config.yaml", run_dir);
  nb_train_config cfg;
  nb_status s = nb_pt_sft_config_load(ctx, path, 0, NULL, sft, &cfg);
  if (!s && !sft->lora_target[0])
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s is a full fine-tuning run (no lora.target): its checkpoints are the model",
                  what, run_dir);
  return s ? s : prepare(ctx, sft, &cfg, false, p);
}

nb_status nb_pt_lora_merge_run(nb_ctx *ctx, const char *run_dir, const char *out_dir) {
  nb_pt_sft_config sft;
  prepared p = {0};
  nb_status s = open_lora_run(ctx, "lora merge", run_dir, out_dir, &sft, &p);
  if (!s) s = merge_into(ctx, &p, run_dir, out_dir);
  prepared_free(&p);
  return s;
}

nb_status nb_pt_lora_export_peft_run(nb_ctx *ctx, const char *run_dir, const char *out_dir) {
  nb_pt_sft_config sft;
  prepared p = {0};
  nb_status s = open_lora_run(ctx, "lora export", run_dir, out_dir, &sft, &p);
  if (!s && sft.quant_rules[0]) nb_logf(ctx, NB_LOG_WARN, "lora export: the adapters were trained on a quantized base (%s)", sft.quant_rules);
  int64_t step;
  nb_tree *ad = s ? NULL : latest_params(ctx, run_dir, p.adapters, &step);
  if (!s) s = ad ? nb_pt_lora_save_peft(ctx, out_dir, &p.lc, &p.m.cfg, ad, sft.base) : nb_ctx_status(ctx);
  nb_tree_destroy(ad);
  prepared_free(&p);
  return s;
}

/* ---------------------------------------------------------------- the run */

nb_status nb_pt_sft_run(nb_ctx *ctx, const nb_pt_sft_config *sft, const nb_train_config *cfg, const nb_train_opts *opts,
                        nb_train_result *out) {
  if (!sft || !cfg || !opts || !opts->run_dir) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "sft: NULL config or options");
  prepared p = {0};
  nb_status s = prepare(ctx, sft, cfg, true, &p);
  nb_data_map *train = s ? NULL : nb_pt_sft_map(ctx, &p.train), *eval = train ? nb_pt_sft_map(ctx, &p.eval) : NULL;
  char *extra = eval ? nb_pt_sft_config_yaml(sft) : NULL;
  if (!s && !extra) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : nb_errorf(ctx, NB_ERR_NOMEM, "sft: out of memory");
  if (!s) {
    bool lora = p.lora != NULL;
    nb_train_source src = {.train = train, .eval = eval, .train_id = data_id(&p.train), .train_tokens = p.train.tokens,
                           .train_name = cfg->data.train, .params = lora ? p.adapters : p.base,
                           .frozen = lora ? p.base : NULL, .linear_hook = lora ? nb_pt_lora_hook : NULL,
                           .hook_ud = p.lora, .config_extra = extra};
    nb_train_opts o = *opts;
    o.source = &src;
    nb_train_result r;
    s = nb_train_run(ctx, &p.cfg, &o, &r);
    if (out) *out = r;
    if (!s && sft->merge_at_end && r.final_step == p.cfg.steps) {
      char dir[NB_TRAIN_STR_MAX + 64];
      struct stat st;
      snprintf(dir, sizeof dir, "%s/merged", opts->run_dir);
      if (!stat(dir, &st)) nb_logf(ctx, NB_LOG_WARN, "sft: %s exists (an earlier merge): left as it is", dir);
      else s = merge_into(ctx, &p, opts->run_dir, dir);
    }
  }
  free(extra);
  nb_data_map_release(train);
  nb_data_map_release(eval);
  prepared_free(&p);
  return s;
}
