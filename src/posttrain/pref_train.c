/* Preference optimization as a task of the trainer (nb_train_task): the
 * `pref:` keys of a run config, the batch (pairs [B, 2, T]), the loss
 * graph (policy forward; the reference model's forward on the frozen
 * starting parameters, or none for ORPO), the data pipelines and the start
 * from a base run or checkpoint. The loop, checkpoints and run dir are the
 * trainer's (nb_train_run). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "nabla/compile.h"
#include "internal.h"
#include "nabla/posttrain.h"
#include "nabla/tokenizer.h"
#include "util/util.h"

/* ---------------------------------------------------------------- config */

void nb_pt_pref_config_defaults(nb_pt_pref_config *c) {
  memset(c, 0, sizeof *c);
  c->loss = (nb_pt_pref_opts){.loss_type = NB_PT_PREF_SIGMOID, .beta = 0.1, .orpo_lambda = 0.1};
  c->chat = NB_SERVE_CHAT_CHATML;
}

static const char *const pref_keys = "loss_type, beta, label_smoothing, orpo_lambda, base, precompute_ref, chat_template";

/* key: without "pref."; where: "file:line" or "override 'k=v'" */
static nb_status set_key(nb_ctx *ctx, nb_pt_pref_config *c, const char *where, const char *key, const char *val) {
  char why[256];
  if (!strcmp(key, "loss_type")) {
    for (int t = 0; t < NB_PT_PREF_COUNT; t++)
      if (!strcmp(val, nb_pt_pref_loss_name((nb_pt_pref_loss_type)t))) {
        c->loss.loss_type = (nb_pt_pref_loss_type)t;
        return NB_OK;
      }
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: pref.loss_type: '%s' is not one of: sigmoid, ipo, hinge, orpo", where, val);
  }
  struct { const char *name; double *p, lo, hi; } nums[] = {{"beta", &c->loss.beta, 1e-12, 1e6},
                                                             {"label_smoothing", &c->loss.label_smoothing, 0, 0.499999},
                                                             {"orpo_lambda", &c->loss.orpo_lambda, 1e-12, 1e6}};
  for (size_t i = 0; i < sizeof nums / sizeof *nums; i++)
    if (!strcmp(key, nums[i].name)) {
      if (!nb_parse_float(val, nums[i].lo, nums[i].hi, nums[i].p, why, sizeof why))
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: pref.%s: %s", where, key, why);
      return NB_OK;
    }
  if (!strcmp(key, "precompute_ref")) {
    if (!strcmp(val, "true")) c->precompute_ref = true;
    else if (!strcmp(val, "false")) c->precompute_ref = false;
    else return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: pref.precompute_ref: '%s' is not a boolean (true or false)", where, val);
    return NB_OK;
  }
  if (!strcmp(key, "chat_template")) {
    nb_serve_chat_format f = nb_serve_chat_format_parse(val);
    if (f == NB_SERVE_CHAT_NONE)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: pref.chat_template: '%s' is not one of: %s", where, val, nb_serve_chat_known());
    c->chat = f;
    return NB_OK;
  }
  if (!strcmp(key, "base")) {
    if (strlen(val) >= sizeof c->base) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: pref.base: too long", where);
    snprintf(c->base, sizeof c->base, "%s", val);
    return NB_OK;
  }
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key 'pref.%s' (keys of pref: %s)", where, key, pref_keys);
}

nb_status nb_pt_pref_config_set(nb_ctx *ctx, nb_pt_pref_config *c, const char *assignment) {
  const char *eq = assignment ? strchr(assignment, '=') : NULL;
  char where[600];
  snprintf(where, sizeof where, "override '%s'", assignment ? assignment : "(null)");
  if (!eq || strncmp(assignment, "pref.", 5) || eq == assignment + 5)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: expected pref.<key>=value", where);
  char key[64];
  snprintf(key, sizeof key, "%.*s", (int)(eq - assignment - 5), assignment + 5);
  return set_key(ctx, c, where, key, eq + 1);
}

/* The pref: mapping of a YAML document (the rest is the trainer's). */
static nb_status parse_yaml(nb_ctx *ctx, const char *name, const char *text, size_t len, nb_pt_pref_config *c) {
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", name);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  if (!yaml_parser_load(&parser, &doc)) {
    nb_status s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: YAML error: %s", name, parser.problem_mark.line + 1,
                            parser.problem ? parser.problem : "malformed");
    yaml_parser_delete(&parser);
    return s;
  }
  nb_status s = NB_OK;
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  for (yaml_node_pair_t *p = root && root->type == YAML_MAPPING_NODE ? root->data.mapping.pairs.start : NULL;
       p && p < root->data.mapping.pairs.top && !s; p++) {
    yaml_node_t *k = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
    if (k->type != YAML_SCALAR_NODE || strcmp((const char *)k->data.scalar.value, "pref")) continue;
    if (v->type != YAML_MAPPING_NODE) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: 'pref' is a section: it needs a mapping of keys (%s)", name,
                    k->start_mark.line + 1, pref_keys);
      break;
    }
    for (yaml_node_pair_t *q = v->data.mapping.pairs.start; q < v->data.mapping.pairs.top && !s; q++) {
      yaml_node_t *qk = yaml_document_get_node(&doc, q->key), *qv = yaml_document_get_node(&doc, q->value);
      char where[600];
      snprintf(where, sizeof where, "%s:%zu", name, qk->start_mark.line + 1);
      if (qk->type != YAML_SCALAR_NODE || qv->type != YAML_SCALAR_NODE)
        s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: pref keys take plain values", where);
      else
        s = set_key(ctx, c, where, (const char *)qk->data.scalar.value, (const char *)qv->data.scalar.value);
    }
  }
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  return s;
}

nb_status nb_pt_pref_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                 nb_pt_pref_config *out) {
  nb_pt_pref_config c;
  nb_pt_pref_config_defaults(&c);
  nb_status s = NB_OK;
  if (path) {
    char *buf = NULL;
    size_t len = 0;
    int err = nb_util__read_file(path, (size_t)64 << 20, &buf, &len);
    if (err) s = nb_errorf(ctx, err == ENOMEM ? NB_ERR_NOMEM : NB_ERR_IO, "%s: cannot read: %s", path, strerror(err));
    if (!s) s = parse_yaml(ctx, path, buf ? buf : "", len, &c);
    free(buf);
  }
  for (int i = 0; !s && i < n_overrides; i++) s = nb_pt_pref_config_set(ctx, &c, overrides[i]);
  /* the same checks the loss makes when traced, named by key now */
  if (!s && c.loss.label_smoothing > 0 && c.loss.loss_type != NB_PT_PREF_SIGMOID)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref.label_smoothing (%g) applies to pref.loss_type sigmoid only, not %s",
                  c.loss.label_smoothing, nb_pt_pref_loss_name(c.loss.loss_type));
  if (!s) *out = c;
  return s;
}

static void write_float(FILE *f, const char *key, double v) {
  char buf[40];
  for (int prec = 6; prec <= 17; prec++) { /* the shortest text that reads back exactly */
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  fprintf(f, "  %s: %s\n", key, buf);
}

void nb_pt_pref_config_write(const nb_pt_pref_config *c, FILE *f) {
  fprintf(f, "pref:\n  loss_type: %s\n", nb_pt_pref_loss_name(c->loss.loss_type));
  write_float(f, "beta", c->loss.beta);
  write_float(f, "label_smoothing", c->loss.label_smoothing);
  write_float(f, "orpo_lambda", c->loss.orpo_lambda);
  fputs("  base: ", f);
  nb_pt__yaml_str(f, c->base);
  fputc('\n', f);
  fprintf(f, "  precompute_ref: %s\n", c->precompute_ref ? "true" : "false");
  fprintf(f, "  chat_template: %s\n", nb_serve_chat_format_name(c->chat));
}

/* ---------------------------------------------------------------- the task */

typedef struct pref_task {
  const nb_pt_pref_config *pc;
  const nb_model_config *model;
  const nb_tree *start;        /* the reference's parameters (precompute_ref) */
  int threads;
  nb_data_tokenizer tok;
  nb_pt_pref_data_opts data;   /* the chat template and BOS id for rows given as messages */
  nb_pt_pref_data_info train_info, eval_info;
} pref_task;

static const char *const leaves[4] = {"inputs", "targets", "mask", "valid"};

static bool precomputed(const nb_pt_pref_config *pc) { return pc->precompute_ref && pc->loss.loss_type != NB_PT_PREF_ORPO; }

static nb_tree *batch_spec(void *ud, nb_ctx *ctx, const nb_train_config *c, int64_t rows) {
  const pref_task *t = ud;
  nb_tree *b = nb_tree_create(ctx);
  int64_t d[3] = {rows, 2, c->data.seq_len};
  for (int i = 0; b && i < 4; i++)
    if (nb_tree_set(b, leaves[i], nb_leaf_aval(nb_aval_make(i < 2 ? NB_I32 : NB_F32, 3, d)))) {
      nb_tree_destroy(b);
      return NULL;
    }
  if (b && precomputed(t->pc) && nb_tree_set(b, "ref_logps", nb_leaf_aval(nb_aval_make(NB_F32, 2, d)))) {
    nb_tree_destroy(b);
    return NULL;
  }
  return b;
}

typedef struct loss_job {
  const nb_pt_pref_config *pc;
  const nb_train_config *cfg;
  nb_model_trace_opts mo;
} loss_job;

static nb_val *mean_of(nb_val *v) {
  return nb_div(nb_reduce_sum(v, 0, NULL), nb_scalar(nb_val_graph(v), nb_val_dtype(v), (double)nb_val_dim(v, 0)));
}

static nb_status loss_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const loss_job *j = u;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *frozen = nb_tree_select_prefix(in, "frozen", true);
  nb_status s = params && frozen ? NB_OK : NB_ERR_NOMEM;
  nb_val *x = nb_pt_pref_rows(nb_tree_get_val(in, "batch/inputs")), *y = nb_pt_pref_rows(nb_tree_get_val(in, "batch/targets"));
  nb_val *m = nb_pt_pref_rows(nb_tree_get_val(in, "batch/mask")), *v = nb_pt_pref_rows(nb_tree_get_val(in, "batch/valid"));
  nb_nn_apply a = {.g = g, .params = params, .train = j->mo.train, .rng = nb_tree_get_val(in, "rng"),
                   .dtype = j->mo.dtype, .linear_hook = j->mo.linear_hook, .hook_ud = j->mo.hook_ud};
  nb_val *logits = s ? NULL : nb_model_forward(&a, &j->cfg->model, &(nb_model_fwd){.tokens = x, .remat = j->mo.remat}, NULL);
  nb_val *ref = nb_tree_get_val(in, "batch/ref_logps") ? nb_pt_pref_rows(nb_tree_get_val(in, "batch/ref_logps")) : NULL;
  if (!s && !ref && j->pc->loss.loss_type != NB_PT_PREF_ORPO) { /* the reference model: the frozen start, no dropout */
    nb_nn_apply r = {.g = g, .params = frozen, .dtype = j->mo.dtype};
    ref = nb_pt_seq_logps(nb_model_forward(&r, &j->cfg->model, &(nb_model_fwd){.tokens = x}, NULL), y, m, false);
  }
  nb_pt_pref_out po;
  if (!s) s = nb_graph_status(g);
  if (!s) s = nb_pt_pref_loss(&j->pc->loss, &(nb_pt_pref_in){.logits = logits, .targets = y, .mask = m, .valid = v,
                                                              .ref_logps = ref}, &po);
  struct { const char *name; nb_val *v; } ms[] = {
      {"rewards/chosen", po.chosen_rewards ? mean_of(po.chosen_rewards) : NULL},
      {"rewards/rejected", po.rejected_rewards ? mean_of(po.rejected_rewards) : NULL},
      {"rewards/accuracies", po.accuracy}, {"rewards/margins", po.margin},
      {"logps/chosen", po.chosen_logps ? mean_of(po.chosen_logps) : NULL},
      {"logps/rejected", po.rejected_logps ? mean_of(po.rejected_logps) : NULL},
      {"nll_loss", po.nll}, {"log_odds_ratio", po.log_odds_ratio}, {"log_odds_chosen", po.log_odds}};
  if (!s) s = nb_tree_set_val(out, "loss", po.loss);
  for (size_t i = 0; !s && i < sizeof ms / sizeof *ms; i++) {
    char p[64];
    snprintf(p, sizeof p, "metrics/%s", ms[i].name);
    if (ms[i].v) s = nb_tree_set_val(out, p, ms[i].v);
  }
  nb_tree_destroy(params);
  nb_tree_destroy(frozen);
  return s ? s : nb_ctx_status(ctx);
}

static nb_graph *trace_loss(void *ud, nb_ctx *ctx, const nb_train_config *c, const nb_model_trace_opts *mo,
                            const nb_tree *param_spec, const nb_tree *frozen_spec, const nb_tree *bs) {
  const pref_task *t = ud;
  loss_job j = {.pc = t->pc, .cfg = c, .mo = *mo};
  nb_tree *spec = nb_tree_create(ctx);
  nb_graph *g = NULL;
  int64_t two = 2;
  if (spec && !nb_tree_merge(spec, "params", param_spec) && !nb_tree_merge(spec, "frozen", frozen_spec) &&
      !nb_tree_merge(spec, "batch", bs) && !(mo->train && nb_tree_set(spec, "rng", nb_leaf_aval(nb_aval_make(NB_U32, 1, &two)))))
    g = nb_trace(ctx, loss_fn, &j, spec);
  nb_tree_destroy(spec);
  return g;
}

/* ref_logps [n, 2] of pairs [n, 2, T]: the reference's sequence log-probs */
static nb_status ref_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const pref_task *t = u;
  nb_tree *params = nb_tree_select_prefix(in, "params", true);
  nb_nn_apply a = {.g = g, .params = params};
  nb_val *x = nb_pt_pref_rows(nb_tree_get_val(in, "inputs")), *y = nb_pt_pref_rows(nb_tree_get_val(in, "targets"));
  nb_val *m = nb_pt_pref_rows(nb_tree_get_val(in, "mask"));
  nb_val *lp = nb_pt_seq_logps(nb_model_forward(&a, t->model, &(nb_model_fwd){.tokens = x}, NULL), y, m, false);
  int64_t dims[2] = {2, nb_val_dim(x, 0) / 2};
  static const int swap[2] = {1, 0};
  nb_tree_destroy(params);
  nb_status s = nb_graph_status(g);
  return s ? s : nb_tree_set_val(out, "ref_logps", nb_transpose(nb_reshape(lp, 2, dims), swap));
}

/* Adds "ref_logps" [P, 2] to pairs (TRL's precompute_ref_log_probs): the
 * reference's forward over chunks of `chunk` pairs, compiled once (the last
 * chunk padded with the first pairs, their results dropped). */
static nb_status precompute_ref(pref_task *t, nb_ctx *ctx, nb_tree *pairs, int64_t chunk) {
  const nb_array *in0 = nb_tree_get_array(pairs, "inputs");
  int64_t P = nb_array_dims(in0)[0], T = nb_array_dims(in0)[2];
  if (chunk > P) chunk = P;
  nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  int64_t d[3] = {chunk, 2, T};
  nb_status s = spec && in && out ? nb_tree_merge(spec, "params", t->start) : NB_ERR_NOMEM;
  for (int i = 0; !s && i < 3; i++) s = nb_tree_set(spec, leaves[i], nb_leaf_aval(nb_aval_make(i < 2 ? NB_I32 : NB_F32, 3, d)));
  nb_graph *g = s ? NULL : nb_trace(ctx, ref_fn, t, spec);
  nb_exe *e = g ? nb_jit(ctx, g, &(nb_jit_opts){.threads = t->threads}) : NULL;
  nb_array *all = e ? nb_array_empty(ctx, NB_F32, 2, (int64_t[]){P, 2}) : NULL;
  if (!s && !all) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (!s) s = nb_tree_merge(in, "params", t->start);
  float *dst = all ? nb_array_data_mut(all) : NULL;
  for (int64_t lo = 0; !s && lo < P; lo += chunk) {
    for (int i = 0; !s && i < 3; i++) { /* pairs [lo, lo + chunk), wrapping to the first ones past P */
      const nb_array *src = nb_tree_get_array(pairs, leaves[i]);
      size_t row = (size_t)(2 * T) * 4; /* i32 and f32 alike */
      nb_array *c = nb_array_empty(ctx, nb_array_dtype(src), 3, d);
      if (!c) s = nb_ctx_status(ctx);
      for (int64_t k = 0; !s && k < chunk; k++)
        memcpy((char *)nb_array_data_mut(c) + (size_t)k * row, (const char *)nb_array_data(src) + (size_t)((lo + k) % P) * row, row);
      if (!s) s = nb_tree_set_array(in, leaves[i], c);
      nb_array_release(c);
    }
    if (!s) s = nb_exe_run(e, in, out);
    const nb_array *r = s ? NULL : nb_tree_get_array(out, "ref_logps");
    for (int64_t k = 0; r && k < chunk && lo + k < P; k++)
      for (int j = 0; j < 2; j++) dst[(lo + k) * 2 + j] = (float)nb_array_get(r, k * 2 + j);
  }
  if (!s) s = nb_tree_set_array(pairs, "ref_logps", all);
  nb_array_release(all);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return s ? nb_errorf(ctx, s, "pref: precomputing the reference log-probs: %s", nb_ctx_error(ctx)) : NB_OK;
}

static nb_status open_data(void *ud, nb_ctx *ctx, const nb_train_config *c, const char *run_dir, nb_train_task_data *out) {
  pref_task *t = ud;
  memset(out, 0, sizeof *out);
  nb_tree *tr = nb_pt_pref_data_load_opts(ctx, c->data.train, &t->tok, c->data.seq_len, c->model.vocab_size, &t->data,
                                        &t->train_info);
  if (!tr) return nb_errorf(ctx, nb_ctx_status(ctx), "pref: data.train: %s", nb_ctx_error(ctx));
  if (t->train_info.pairs < c->batch_size) {
    nb_tree_destroy(tr);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref: data.train '%s' holds %lld pairs, fewer than batch_size %lld",
                     c->data.train, (long long)t->train_info.pairs, (long long)c->batch_size);
  }
  nb_status s = precomputed(t->pc) ? precompute_ref(t, ctx, tr, c->batch_size) : NB_OK;
  nb_data_map *ds = s ? NULL : nb_data_map_arrays(ctx, tr);
  nb_tree_destroy(tr);
  if (s) return s;
  ds = nb_data_map_batch(nb_data_map_repeat(nb_data_map_shuffle(ds, (uint64_t)c->seed), 0), c->batch_size, true);
  out->train = ds ? nb_data_iter_create(ds) : NULL;
  if (out->train && c->data.workers > 0)
    out->train = nb_data_iter_prefetch(out->train, (int)c->data.workers, 2 * (int)c->data.workers + 2);
  if (!out->train) return nb_ctx_status(ctx);
  out->n_train = t->train_info.pairs;
  out->tokens = t->train_info.tokens;
  out->xxh3 = t->train_info.xxh3;
  if (!c->data.eval[0]) return NB_OK; /* no eval data: no eval */
  nb_tree *ev = nb_pt_pref_data_load_opts(ctx, c->data.eval, &t->tok, c->data.seq_len, c->model.vocab_size, &t->data,
                                        &t->eval_info);
  if (!ev) return nb_errorf(ctx, nb_ctx_status(ctx), "pref: data.eval: %s", nb_ctx_error(ctx));
  out->n_eval = t->eval_info.pairs;
  if (precomputed(t->pc) && (s = precompute_ref(t, ctx, ev, c->batch_size))) {
    nb_tree_destroy(ev);
    return s;
  }
  if (c->eval_every > 0 && c->eval_steps * c->batch_size > out->n_eval) {
    nb_tree_destroy(ev);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref: eval_steps = %lld batches of batch_size %lld, but data.eval '%s' holds "
                     "%lld pairs: lower eval_steps, give more eval pairs, or set eval_every=0",
                     (long long)c->eval_steps, (long long)c->batch_size, c->data.eval, (long long)out->n_eval);
  }
  out->eval = nb_data_map_batch(nb_data_map_arrays(ctx, ev), c->batch_size, true);
  nb_tree_destroy(ev);
  return out->eval ? NB_OK : nb_ctx_status(ctx);
}

static void write_config(void *ud, FILE *f) { nb_pt_pref_config_write(((const pref_task *)ud)->pc, f); }

nb_status nb_pt_pref_run(nb_ctx *ctx, const nb_train_config *cfg_in, const nb_pt_pref_config *pc,
                         const nb_train_opts *opts_in, nb_train_result *out) {
  if (!cfg_in || !pc || !opts_in) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref: NULL config or options");
  nb_train_config cfg = *cfg_in;
  nb_model_loaded m = {0};
  nb_tok *own_tok = NULL;
  nb_tree *start = NULL;
  nb_status s = NB_OK;
  /* init_from= (as in nabla train) names the base too; nb_train_run then loads the policy from it itself */
  const char *base = pc->base[0] ? pc->base : cfg_in->init_from;
  if (pc->base[0] && cfg_in->init_from[0] && strcmp(pc->base, cfg_in->init_from))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "init_from '%s' and pref.base '%s' name different models: give one",
                     cfg_in->init_from, pc->base);
  if (base[0]) {
    /* the policy and the reference start from the base's weights, its model and (unless data.tokenizer
     * names one) its tokenizer */
    if (!(s = nb_pt__load_base(ctx, pc->base[0] ? "pref.base" : "init_from", base, &m))) {
      cfg.model = m.cfg;
      cfg.model.scan_layers = cfg_in->model.scan_layers;
      start = m.params;
      m.params = NULL;
    }
  } else {
    nb_array *key = nb_key(ctx, (uint64_t)cfg.seed); /* what nb_train_run would start from */
    start = key ? nb_model_init(ctx, &cfg.model, key) : NULL;
    nb_array_release(key);
    if (!start) s = nb_ctx_status(ctx);
  }
  pref_task t = {.pc = pc, .model = &cfg.model, .start = start, .threads = opts_in->threads, .tok = nb_data_tokenizer_bytes(),
                 .data = {.chat = pc->chat, .bos_id = base[0] ? m.bos_id : -1}};
  if (!s && cfg.data.tokenizer[0]) {
    if (!(own_tok = nb_tok_load(ctx, cfg.data.tokenizer)))
      s = nb_errorf(ctx, nb_ctx_status(ctx), "pref: data.tokenizer '%s': %s", cfg.data.tokenizer, nb_ctx_error(ctx));
    else t.tok = nb_data_tokenizer_bpe(own_tok);
  } else if (!s && m.tok) {
    t.tok = nb_data_tokenizer_bpe(m.tok);
  }
  nb_train_task task = {.name = "dpo", .rows_per_example = 2, .batch_spec = batch_spec, .trace_loss = trace_loss,
                        .open_data = open_data,
                        .init_params = start, .write_config = write_config, .ud = &t,
                        .frozen = pc->loss.loss_type == NB_PT_PREF_ORPO || precomputed(pc) ? NULL : start};
  nb_train_opts o = *opts_in;
  o.task = &task;
  if (!s) s = nb_train_run(ctx, &cfg, &o, out);
  nb_tree_destroy(start);
  nb_tok_destroy(own_tok);
  nb_model_loaded_free(&m);
  return s;
}
