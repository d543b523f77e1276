/* The run configuration file: one table of keys (dotted path, type, place
 * in nb_train_config, range or allowed values) drives the YAML loader
 * (libyaml's document API), the key=value overrides, the writer and the
 * error messages. Cross-key rules are in nb_train_config_validate.
 * This file does not know what the trainer does with the values. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "nabla/prof.h"
#include "nabla/train.h"
#include "train/internal.h"
#include "util/util.h"

_Static_assert(sizeof(nb_nn_act) == sizeof(int) && sizeof(nb_train_optim) == sizeof(int), "enums are ints");

typedef enum kind { K_INT, K_FLOAT, K_BOOL, K_STR, K_ENUM, K_DTYPE, K_PRESET, K_RULES } kind;

typedef struct key_def {
  const char *key;
  kind k;
  size_t off;
  double lo, hi;               /* K_INT, K_FLOAT: inclusive range */
  const char *const *choices;  /* K_ENUM (index = value), K_DTYPE (dtype names) */
} key_def;

static const char *const families[] = {"gpt2", "llama", NULL};
static const char *const norms[] = {"layernorm", "rmsnorm", NULL};
static const char *const acts[] = {"gelu_tanh", "gelu", "relu", "silu", NULL};
static const char *const scalings[] = {"none", "linear", "llama3", NULL};
static const char *const scores[] = {"softmax", "sigmoid", NULL};
static const char *const optims[] = {"adamw", "adam", "sgd", NULL};
static const char *const schedules[] = {"constant", "linear", "cosine", NULL};
static const char *const remats[] = {"none", "block", NULL};
static const char *const nonfinites[] = {"stop", "skip", "continue", NULL};
static const char *const dtypes[] = {"f32", "bf16", NULL};

#define O(field) offsetof(nb_train_config, field)
#define BIG 1e15
static const key_def keys[] = {
    {"model.preset", K_PRESET, O(preset), 0, 0, NULL},
    {"model.family", K_ENUM, O(model.family), 0, 0, families},
    {"model.vocab_size", K_INT, O(model.vocab_size), 1, BIG, NULL},
    {"model.d_model", K_INT, O(model.d_model), 1, BIG, NULL},
    {"model.n_layers", K_INT, O(model.n_layers), 1, 100000, NULL},
    {"model.n_heads", K_INT, O(model.n_heads), 1, 100000, NULL},
    {"model.n_kv_heads", K_INT, O(model.n_kv_heads), 1, 100000, NULL},
    {"model.head_dim", K_INT, O(model.head_dim), 0, 100000, NULL},
    {"model.d_ff", K_INT, O(model.d_ff), 1, BIG, NULL},
    {"model.max_seq_len", K_INT, O(model.max_seq_len), 1, BIG, NULL},
    {"model.norm", K_ENUM, O(model.norm), 0, 0, norms},
    {"model.norm_eps", K_FLOAT, O(model.norm_eps), 0, 1, NULL},
    {"model.act", K_ENUM, O(model.act), 0, 0, acts},
    {"model.gated_mlp", K_BOOL, O(model.gated_mlp), 0, 0, NULL},
    {"model.bias", K_BOOL, O(model.bias), 0, 0, NULL},
    {"model.qkv_bias", K_BOOL, O(model.qkv_bias), 0, 0, NULL},
    {"model.learned_pos", K_BOOL, O(model.learned_pos), 0, 0, NULL},
    {"model.rope", K_BOOL, O(model.rope), 0, 0, NULL},
    {"model.rope_theta", K_FLOAT, O(model.rope_cfg.theta), 1, BIG, NULL},
    {"model.rope_scaling", K_ENUM, O(model.rope_cfg.scaling), 0, 0, scalings},
    {"model.rope_factor", K_FLOAT, O(model.rope_cfg.factor), 0, BIG, NULL},
    {"model.rope_low_freq_factor", K_FLOAT, O(model.rope_cfg.low_freq_factor), 0, BIG, NULL},
    {"model.rope_high_freq_factor", K_FLOAT, O(model.rope_cfg.high_freq_factor), 0, BIG, NULL},
    {"model.rope_original_max_pos", K_INT, O(model.rope_cfg.original_max_pos), 0, BIG, NULL},
    {"model.rope_interleaved", K_BOOL, O(model.rope_cfg.interleaved), 0, 0, NULL},
    {"model.tie_embeddings", K_BOOL, O(model.tie_embeddings), 0, 0, NULL},
    {"model.dropout", K_FLOAT, O(model.dropout), 0, 0.999, NULL},
    {"model.attn_dropout", K_FLOAT, O(model.attn_dropout), 0, 0.999, NULL},
    {"model.init_std", K_FLOAT, O(model.init_std), 0, 100, NULL},
    {"model.scaled_init", K_BOOL, O(model.scaled_init), 0, 0, NULL},
    {"model.n_experts", K_INT, O(model.n_experts), 0, 100000, NULL},
    {"model.top_k", K_INT, O(model.top_k), 0, 100000, NULL},
    {"model.n_shared_experts", K_INT, O(model.n_shared_experts), 0, 100000, NULL},
    {"model.moe_d_ff", K_INT, O(model.moe_d_ff), 0, BIG, NULL},
    {"model.first_dense_layers", K_INT, O(model.first_dense_layers), 0, 100000, NULL},
    {"model.router_score", K_ENUM, O(model.router_score), 0, 0, scores},
    {"model.router_renormalize", K_BOOL, O(model.router_renormalize), 0, 0, NULL},
    {"model.route_scale", K_FLOAT, O(model.route_scale), 0, BIG, NULL},
    {"model.capacity_factor", K_FLOAT, O(model.capacity_factor), 0, 1000, NULL},
    {"model.lb_loss_coef", K_FLOAT, O(model.lb_loss_coef), 0, BIG, NULL},
    {"model.z_loss_coef", K_FLOAT, O(model.z_loss_coef), 0, BIG, NULL},
    {"model.router_init_std", K_FLOAT, O(model.router_init_std), 0, 100, NULL},
    {"data.train", K_STR, O(data.train), 0, 0, NULL},
    {"data.eval", K_STR, O(data.eval), 0, 0, NULL},
    {"data.tokenizer", K_STR, O(data.tokenizer), 0, 0, NULL},
    {"data.seq_len", K_INT, O(data.seq_len), 1, BIG, NULL},
    {"data.pack", K_BOOL, O(data.pack), 0, 0, NULL},
    {"data.workers", K_INT, O(data.workers), 0, 1024, NULL},
    {"optim.name", K_ENUM, O(optim.name), 0, 0, optims},
    {"optim.lr", K_FLOAT, O(optim.lr), 0, 100, NULL},
    {"optim.b1", K_FLOAT, O(optim.b1), 0, 0.999999, NULL},
    {"optim.b2", K_FLOAT, O(optim.b2), 0, 0.999999999, NULL},
    {"optim.eps", K_FLOAT, O(optim.eps), 0, 1, NULL},
    {"optim.weight_decay", K_FLOAT, O(optim.weight_decay), 0, 100, NULL},
    {"optim.grad_clip", K_FLOAT, O(optim.grad_clip), 0, BIG, NULL},
    {"optim.momentum", K_FLOAT, O(optim.momentum), 0, 0.999999, NULL},
    {"schedule.kind", K_ENUM, O(schedule.kind), 0, 0, schedules},
    {"schedule.warmup_steps", K_INT, O(schedule.warmup_steps), 0, BIG, NULL},
    {"schedule.decay_steps", K_INT, O(schedule.decay_steps), 0, BIG, NULL},
    {"schedule.min_lr_ratio", K_FLOAT, O(schedule.min_lr_ratio), 0, 1, NULL},
    {"precision.params", K_DTYPE, O(precision.params), 0, 0, dtypes},
    {"precision.compute", K_DTYPE, O(precision.compute), 0, 0, dtypes},
    {"remat", K_ENUM, O(remat), 0, 0, remats},
    {"scan_layers", K_BOOL, O(model.scan_layers), 0, 0, NULL},
    {"batch_size", K_INT, O(batch_size), 1, BIG, NULL},
    {"grad_accum", K_INT, O(grad_accum), 1, BIG, NULL},
    {"mesh.data", K_INT, O(mesh.data), 1, 65536, NULL},
    {"mesh.fsdp", K_INT, O(mesh.fsdp), 1, 65536, NULL},
    {"mesh.expert", K_INT, O(mesh.expert), 1, 65536, NULL},
    {"mesh.tensor", K_INT, O(mesh.tensor), 1, 65536, NULL},
    {"mesh.rules", K_RULES, O(mesh.rules), 0, 0, NULL},
    {"steps", K_INT, O(steps), 0, BIG, NULL},
    {"eval_every", K_INT, O(eval_every), 0, BIG, NULL},
    {"eval_steps", K_INT, O(eval_steps), 0, BIG, NULL},
    {"log_every", K_INT, O(log_every), 1, BIG, NULL},
    {"checkpoint_every", K_INT, O(checkpoint_every), 0, BIG, NULL},
    {"checkpoint_keep", K_INT, O(checkpoint_keep), 0, 100000, NULL},
    {"checkpoint_dir", K_STR, O(checkpoint_dir), 0, 0, NULL},
    {"seed", K_INT, O(seed), 0, 9.2e18, NULL},
    {"on_nonfinite", K_ENUM, O(on_nonfinite), 0, 0, nonfinites},
    {"init_from", K_STR, O(init_from), 0, 0, NULL},
    {"resume.allow_data_change", K_BOOL, O(resume.allow_data_change), 0, 0, NULL},
    {"profile.steps", K_STR, O(profile.steps), 0, 0, NULL},
    {"quant.rules", K_STR, O(quant.rules), 0, 0, NULL},
};
#define NKEYS (sizeof keys / sizeof keys[0])

void nb_train_config_defaults(nb_train_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->preset, sizeof c->preset, "llama-tiny");
  nb_model_config_preset(NULL, "llama-tiny", &c->model);
  c->data.seq_len = 128;
  c->data.workers = 1;
  c->optim = (__typeof__(c->optim)){.name = NB_TRAIN_OPTIM_ADAMW, .lr = 3e-4, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8,
                                    .weight_decay = 0.1, .grad_clip = 1.0, .momentum = 0.9};
  c->schedule = (__typeof__(c->schedule)){.kind = NB_TRAIN_SCHEDULE_COSINE, .warmup_steps = 10, .min_lr_ratio = 0.1};
  c->precision.params = c->precision.compute = NB_F32;
  c->remat = NB_TRAIN_REMAT_NONE;
  c->batch_size = 8;
  c->grad_accum = 1;
  c->mesh.data = 1;
  c->mesh.fsdp = 1;
  c->mesh.expert = 1;
  c->mesh.tensor = 1;
  c->steps = 100;
  c->eval_every = 50;
  c->eval_steps = 4;
  c->log_every = 10;
  c->checkpoint_every = 100;
  c->checkpoint_keep = 3;
  snprintf(c->checkpoint_dir, sizeof c->checkpoint_dir, "checkpoints");
  c->seed = 0;
}

/* ---------------------------------------------------------------- values */

static const key_def *find_key(const char *key) {
  for (size_t i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].key, key)) return &keys[i];
  return NULL;
}

static void join_choices(const char *const *ch, char *buf, size_t cap) {
  buf[0] = 0;
  for (int i = 0; ch[i]; i++) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", ch[i]);
  }
}

/* The direct children of a section ("" for the top level), for messages. */
static void section_keys(const char *section, char *buf, size_t cap) {
  size_t pl = strlen(section);
  buf[0] = 0;
  for (size_t i = 0; i < NKEYS; i++) {
    const char *k = keys[i].key;
    if (pl && (strncmp(k, section, pl) || k[pl] != '.')) continue;
    const char *rest = pl ? k + pl + 1 : k;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(rest, "."), rest);
    if (strstr(buf, name) && (strstr(buf, name) == buf || strstr(buf, name)[-1] == ' ')) continue;
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
  }
}

static bool is_section(const char *key) {
  size_t n = strlen(key);
  for (size_t i = 0; i < NKEYS; i++)
    if (!strncmp(keys[i].key, key, n) && keys[i].key[n] == '.') return true;
  return false;
}

static nb_status set_value_(nb_ctx *ctx, nb_train_config *c, const char *where, const key_def *d, const char *key,
                            const char *val);

/* ---------------------------------------------------------------- YAML values (mesh.rules) */

static bool plain_null(const yaml_node_t *n) {
  if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
  const char *v = (const char *)n->data.scalar.value;
  return !*v || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL") || !strcmp(v, "~");
}

/* A scalar that reads back as the same string when written plain: an identifier that YAML takes for no other type. */
static bool plain_safe(const char *v) {
  static const char *const words[] = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", NULL};
  if (!(*v == '_' || (*v >= 'a' && *v <= 'z') || (*v >= 'A' && *v <= 'Z'))) return false;
  for (const char *p = v; *p; p++)
    if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))) return false;
  for (int i = 0; words[i]; i++)
    if (!strcasecmp(v, words[i])) return false;
  return true;
}

/* n as flow YAML appended to out[*k ..] ([a, b], {k: v}, plain null, scalars plain when plain_safe, else double-quoted);
 * false when it does not fit in cap */
static bool emit_flow(yaml_document_t *doc, yaml_node_t *n, char *out, size_t cap, size_t *k, int depth) {
#define PUT(...) (*k < cap && (*k += (size_t)snprintf(out + *k, cap - *k, __VA_ARGS__)) < cap)
  if (depth > 32) return false;
  if (n->type == YAML_SEQUENCE_NODE || n->type == YAML_MAPPING_NODE) {
    bool seq = n->type == YAML_SEQUENCE_NODE;
    if (!PUT("%c", seq ? '[' : '{')) return false;
    if (seq)
      for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++)
        if ((it > n->data.sequence.items.start && !PUT(", ")) ||
            !emit_flow(doc, yaml_document_get_node(doc, *it), out, cap, k, depth + 1))
          return false;
    for (yaml_node_pair_t *p = seq ? NULL : n->data.mapping.pairs.start; p && p < n->data.mapping.pairs.top; p++)
      if ((p > n->data.mapping.pairs.start && !PUT(", ")) ||
          !emit_flow(doc, yaml_document_get_node(doc, p->key), out, cap, k, depth + 1) || !PUT(": ") ||
          !emit_flow(doc, yaml_document_get_node(doc, p->value), out, cap, k, depth + 1))
        return false;
    return PUT("%c", seq ? ']' : '}');
  }
  const char *v = (const char *)n->data.scalar.value;
  if (plain_null(n)) return PUT("null");
  if (plain_safe(v)) return PUT("%s", v);
  if (!PUT("\"")) return false;
  for (const unsigned char *p = (const unsigned char *)v; *p; p++)
    if (!(*p == '"' || *p == '\\' ? PUT("\\%c", *p) : *p < 0x20 ? PUT("\\x%02x", *p) : PUT("%c", *p))) return false;
  return PUT("\"");
#undef PUT
}

/* A YAML value as canonical flow text into out[cap] ("" for a plain null). */
static nb_status flow_text(nb_ctx *ctx, const char *where, const char *key, yaml_document_t *doc, yaml_node_t *n, char *out,
                           size_t cap) {
  size_t k = 0;
  out[0] = 0;
  if (plain_null(n)) return NB_OK;
  if (!emit_flow(doc, n, out, cap, &k, 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: longer than %zu bytes (or nested deeper than 32) as flow YAML", where, key,
                     cap - 1);
  return NB_OK;
}

/* bit of a model key in model_keys_set (the model keys lead the table) */
static uint64_t model_bit(const key_def *d) {
  size_t i = (size_t)(d - keys);
  return !strncmp(d->key, "model.", 6) && i < 64 ? (uint64_t)1 << i : 0;
}

/* `where` prefixes messages ("file.yaml:12" or "override 'a=b'"). */
static nb_status set_value(nb_ctx *ctx, nb_train_config *c, const char *where, const char *key, const char *val) {
  const key_def *d = find_key(key);
  if (!d) {
    char list[1024], section[128];
    const char *dot = strrchr(key, '.');
    snprintf(section, sizeof section, "%.*s", dot ? (int)(dot - key) : 0, key);
    if (section[0] && !is_section(section)) {
      section_keys("", list, sizeof list);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (top-level keys: %s)", where, key, list);
    }
    section_keys(section, list, sizeof list);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (keys of %s: %s)", where, key,
                     section[0] ? section : "the top level", list);
  }
  nb_status s = set_value_(ctx, c, where, d, key, val);
  if (!s) c->model_keys_set |= d->k == K_PRESET ? ~(uint64_t)0 : model_bit(d);
  return s;
}

static nb_status set_value_(nb_ctx *ctx, nb_train_config *c, const char *where, const key_def *d, const char *key,
                            const char *val) {
  char *p = (char *)c + d->off;
  char allowed[512];
  switch (d->k) {
    case K_PRESET: {
      nb_model_config m;
      if (nb_model_config_preset(ctx, val, &m)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s", where, msg);
      }
      m.scan_layers = c->model.scan_layers; /* how the layers are traced, not the model: a top-level key */
      c->model = m;
      snprintf(c->preset, sizeof c->preset, "%s", val);
      return NB_OK;
    }
    case K_INT: {
      int64_t x;
      if (!nb_parse_int(val, (int64_t)d->lo, (int64_t)d->hi, &x, allowed, sizeof allowed))
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: %s", where, key, allowed);
      memcpy(p, &x, sizeof x);
      return NB_OK;
    }
    case K_FLOAT: {
      double v;
      if (!nb_parse_float(val, d->lo, d->hi, &v, allowed, sizeof allowed))
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: %s", where, key, allowed);
      memcpy(p, &v, sizeof v);
      return NB_OK;
    }
    case K_BOOL: {
      bool v;
      if (!strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "on")) v = true;
      else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "off")) v = false;
      else return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not a boolean (true or false)", where, key, val);
      memcpy(p, &v, sizeof v);
      return NB_OK;
    }
    case K_RULES: { /* YAML text (the file's node as flow text, or an override's value): stored canonical, checked */
      yaml_parser_t parser;
      yaml_document_t doc;
      char text[NB_TRAIN_RULES_MAX];
      if (!yaml_parser_initialize(&parser)) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", where);
      yaml_parser_set_input_string(&parser, (const unsigned char *)val, strlen(val));
      nb_status s = NB_OK;
      if (!yaml_parser_load(&parser, &doc)) {
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: YAML error: %s", where, key, parser.problem ? parser.problem : "malformed");
      } else {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        text[0] = 0;
        if (root) s = flow_text(ctx, where, key, &doc, root, text, sizeof text);
        yaml_document_delete(&doc);
      }
      yaml_parser_delete(&parser);
      nb_dist_rules *r = s || !text[0] ? NULL : nb_dist_rules_parse_yaml(ctx, key, text, strlen(text));
      if (!s && text[0] && !r) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s", where, nb_ctx_error(ctx));
      nb_dist_rules_destroy(r);
      if (!s) memcpy(p, text, strlen(text) + 1);
      return s;
    }
    case K_STR: {
      if (strlen(val) >= NB_TRAIN_STR_MAX)
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: longer than %d bytes", where, key, NB_TRAIN_STR_MAX - 1);
      snprintf(p, NB_TRAIN_STR_MAX, "%s", val);
      return NB_OK;
    }
    case K_ENUM:
    case K_DTYPE:
      for (int i = 0; d->choices[i]; i++)
        if (!strcmp(val, d->choices[i])) {
          int v = i;
          if (d->k == K_DTYPE) nb_dtype_from_name(val, (nb_dtype *)&v);
          memcpy(p, &v, sizeof v);
          return NB_OK;
        }
      join_choices(d->choices, allowed, sizeof allowed);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not one of: %s", where, key, val, allowed);
  }
  return NB_ERR_INTERNAL;
}

/* Whether key ("lora.rank") lies in one of the caller's sections. */
static bool ext_owns(const nb_train_config_ext *ext, const char *key) {
  for (int i = 0; ext && ext->sections && ext->sections[i]; i++) {
    size_t n = strlen(ext->sections[i]);
    if (!strncmp(key, ext->sections[i], n) && (key[n] == '.' || key[n] == 0)) return true;
  }
  return false;
}

static nb_status set_any(nb_ctx *ctx, nb_train_config *c, const nb_train_config_ext *ext, const char *where, const char *key,
                         const char *val) {
  return ext_owns(ext, key) ? ext->set(ext->ud, ctx, where, key, val) : set_value(ctx, c, where, key, val);
}

static nb_status config_set(nb_ctx *ctx, nb_train_config *c, const nb_train_config_ext *ext, const char *assignment) {
  const char *eq = assignment ? strchr(assignment, '=') : NULL;
  char where[600];
  snprintf(where, sizeof where, "override '%s'", assignment ? assignment : "(null)");
  if (!eq || eq == assignment) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: expected key=value", where);
  char key[128];
  snprintf(key, sizeof key, "%.*s", (int)(eq - assignment), assignment);
  return set_any(ctx, c, ext, where, key, eq + 1);
}

nb_status nb_train_config_set(nb_ctx *ctx, nb_train_config *c, const char *assignment) {
  return config_set(ctx, c, NULL, assignment);
}

/* ---------------------------------------------------------------- YAML */

typedef struct walk {
  nb_ctx *ctx;
  const char *name;
  yaml_document_t *doc;
  nb_train_config *cfg;
  const nb_train_config_ext *ext;
} walk;

static nb_status walk_mapping(walk *w, yaml_node_t *map, const char *prefix);

/* Top-level sections of the post-training commands' own keys (`nabla dpo`
 * reads pref:), stored in the same config.yaml: the trainer skips them, so a
 * post-training run dir loads like any other (generate, serve, resume). */
static const char *const foreign_sections[] = {"pref", "grpo", NULL};

static bool is_foreign(const char *key) {
  for (int i = 0; foreign_sections[i]; i++)
    if (!strcmp(key, foreign_sections[i])) return true;
  return false;
}

static nb_status walk_pair(walk *w, yaml_node_pair_t *pr, const char *prefix) {
  yaml_node_t *k = yaml_document_get_node(w->doc, pr->key), *v = yaml_document_get_node(w->doc, pr->value);
  char where[600], key[256];
  snprintf(where, sizeof where, "%s:%zu", w->name, k->start_mark.line + 1);
  if (k->type != YAML_SCALAR_NODE) return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s: keys must be plain names", where);
  snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", (const char *)k->data.scalar.value);
  if (ext_owns(w->ext, key)) { /* the caller's section: its keys go to its setter */
    if (v->type == YAML_MAPPING_NODE) return walk_mapping(w, v, key);
    if (v->type == YAML_SEQUENCE_NODE) { /* a list of mappings: item i's keys as <key>.<i>.<name> */
      int i = 0;
      for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = yaml_document_get_node(w->doc, *it);
        char sub[300];
        snprintf(sub, sizeof sub, "%s.%d", key, i);
        if (item->type != YAML_MAPPING_NODE)
          return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s:%zu: %s: each item of '%s' must be a mapping of keys", w->name,
                           item->start_mark.line + 1, sub, key);
        nb_status s = walk_mapping(w, item, sub);
        if (s) return s;
      }
      return NB_OK;
    }
    if (v->type != YAML_SCALAR_NODE) return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s: '%s' cannot be a list", where, key);
    return w->ext->set(w->ext->ud, w->ctx, where, key, (const char *)v->data.scalar.value);
  }
  if (!*prefix && v->type == YAML_MAPPING_NODE && is_foreign(key)) return NB_OK;
  const key_def *kd = find_key(key);
  if (kd && kd->k == K_RULES) { /* a YAML value: its node as flow text */
    char text[NB_TRAIN_RULES_MAX];
    nb_status s = flow_text(w->ctx, where, key, w->doc, v, text, sizeof text);
    return s ? s : set_value(w->ctx, w->cfg, where, key, text[0] ? text : "null");
  }
  if (v->type == YAML_MAPPING_NODE) {
    if (!is_section(key)) {
      if (find_key(key)) return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s: '%s' takes a value, not a mapping", where, key);
      return set_value(w->ctx, w->cfg, where, key, ""); /* reports the unknown key */
    }
    return walk_mapping(w, v, key);
  }
  if (v->type != YAML_SCALAR_NODE) return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s: '%s' cannot be a list", where, key);
  if (is_section(key)) return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s: '%s' is a section: it needs a mapping of keys", where, key);
  return set_value(w->ctx, w->cfg, where, key, (const char *)v->data.scalar.value);
}

static nb_status walk_mapping(walk *w, yaml_node_t *map, const char *prefix) {
  yaml_node_pair_t *b = map->data.mapping.pairs.start, *e = map->data.mapping.pairs.top;
  for (yaml_node_pair_t *i = b; i < e; i++) /* duplicates are errors */
    for (yaml_node_pair_t *j = b; j < i; j++) {
      yaml_node_t *ki = yaml_document_get_node(w->doc, i->key), *kj = yaml_document_get_node(w->doc, j->key);
      if (ki->type == YAML_SCALAR_NODE && kj->type == YAML_SCALAR_NODE &&
          !strcmp((char *)ki->data.scalar.value, (char *)kj->data.scalar.value))
        return nb_errorf(w->ctx, NB_ERR_FORMAT, "%s:%zu: duplicate key '%s%s%s'", w->name, ki->start_mark.line + 1,
                         prefix, *prefix ? "." : "", (char *)ki->data.scalar.value);
    }
  /* model.preset first: it resets the other model keys */
  for (int pass = 0; pass < 2; pass++)
    for (yaml_node_pair_t *i = b; i < e; i++) {
      yaml_node_t *k = yaml_document_get_node(w->doc, i->key);
      bool preset = !strcmp(prefix, "model") && k->type == YAML_SCALAR_NODE && !strcmp((char *)k->data.scalar.value, "preset");
      if (preset != (pass == 0)) continue;
      nb_status s = walk_pair(w, i, prefix);
      if (s) return s;
    }
  return NB_OK;
}

nb_status nb_train_config_parse(nb_ctx *ctx, const char *name, const char *text, size_t len, int n_overrides,
                                    const char *const *overrides, nb_train_config *out) {
  return nb_train_config_parse_ext(ctx, name, text, len, n_overrides, overrides, NULL, out);
}

nb_status nb_train_config_parse_ext(nb_ctx *ctx, const char *name, const char *text, size_t len, int n_overrides,
                                    const char *const *overrides, const nb_train_config_ext *ext, nb_train_config *out) {
  nb_train_config c;
  nb_train_config_defaults(&c);
  if (!name) name = "<config>";
  nb_status s = NB_OK;
  if (text) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: YAML error: %s", name, parser.problem_mark.line + 1,
                    parser.problem ? parser.problem : "malformed");
      yaml_parser_delete(&parser);
      return s;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    walk w = {ctx, name, &doc, &c, ext};
    if (root && root->type == YAML_MAPPING_NODE) s = walk_mapping(&w, root, "");
    else if (root && !(root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0))
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: the top level must be a mapping of keys", name);
    yaml_document_delete(&doc);
    /* a config is one document: keys after a second "---" would be ignored */
    if (!s && !yaml_parser_load(&parser, &doc))
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: YAML error: %s", name, parser.problem_mark.line + 1,
                    parser.problem ? parser.problem : "malformed");
    else if (!s) {
      root = yaml_document_get_root_node(&doc);
      if (root)
        s = nb_errorf(ctx, NB_ERR_FORMAT,
                      "%s:%zu: a second YAML document: a config is one document (remove the '---' and merge the keys)",
                      name, doc.start_mark.line + 1);
      yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
  }
  for (int i = 0; !s && i < n_overrides; i++) s = config_set(ctx, &c, ext, overrides[i]);
  if (!s && !(ext && ext->no_validate)) s = nb_train_config_validate(ctx, &c);
  if (!s) *out = c;
  return s;
}

nb_status nb_train_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                   nb_train_config *out) {
  return nb_train_config_load_ext(ctx, path, n_overrides, overrides, NULL, out);
}

nb_status nb_train_config_load_ext(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                   const nb_train_config_ext *ext, nb_train_config *out) {
  if (!path) return nb_train_config_parse_ext(ctx, NULL, NULL, 0, n_overrides, overrides, ext, out);
  char *buf = NULL;
  size_t len = 0;
  int err = nb_util__read_file(path, (size_t)64 << 20, &buf, &len);
  nb_status s = NB_OK;
  if (err == EFBIG) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: larger than 64 MiB: not a config file", path);
  else if (err == ENOMEM) s = nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", path);
  else if (err) s = nb_errorf(ctx, NB_ERR_IO, "%s: cannot open: %s", path, strerror(err));
  if (!s) s = nb_train_config_parse_ext(ctx, path, buf ? buf : "", len, n_overrides, overrides, ext, out);
  free(buf);
  return s;
}

/* ---------------------------------------------------------------- validation, writing */

#define RULE(cond, ...) \
  do {                  \
    if (!(cond)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, __VA_ARGS__); \
  } while (0)

nb_status nb_train_config_validate(nb_ctx *ctx, const nb_train_config *c) {
  nb_status s = nb_model_config_validate(ctx, &c->model);
  if (s) return s;
  RULE(c->data.seq_len <= c->model.max_seq_len, "data.seq_len (%lld) exceeds model.max_seq_len (%lld)",
       (long long)c->data.seq_len, (long long)c->model.max_seq_len);
  RULE(c->batch_size % c->grad_accum == 0, "batch_size (%lld) must be a multiple of grad_accum (%lld)",
       (long long)c->batch_size, (long long)c->grad_accum);
  int64_t procs = nb_train__batch_procs(c);
  RULE(c->grad_accum % procs == 0,
       "grad_accum (%lld) must be a multiple of mesh.data x mesh.fsdp x mesh.expert (%lld x %lld x %lld): each process "
       "runs whole micro-batches (set grad_accum=%lld for one micro-batch per process)",
       (long long)c->grad_accum, (long long)c->mesh.data, (long long)c->mesh.fsdp, (long long)c->mesh.expert,
       (long long)procs);
  if ((s = nb_train__ep_validate(ctx, c))) return s;
  if ((s = nb_train__tp_check(ctx, c))) return s;
  if ((s = nb_train__rules_check(ctx, c))) return s;
  if ((s = nb_train__layout_check(ctx, c))) return s; /* the model's layout under the rules: what the trainer runs */
  /* warmup_steps may exceed steps: a short run (steps=N override) of a
   * long config stays valid and simply ends inside the warmup */
  RULE(c->optim.lr > 0, "optim.lr must be > 0");
  RULE(c->optim.eps > 0, "optim.eps must be > 0");
  RULE(c->precision.params == NB_F32 || c->precision.params == NB_BF16, "precision.params must be f32 or bf16");
  RULE(c->precision.compute == NB_F32 || c->precision.compute == NB_BF16, "precision.compute must be f32 or bf16");
  RULE(c->remat >= 0 && c->remat < NB_TRAIN_REMAT_COUNT, "remat: invalid value");
  RULE(c->optim.name >= 0 && c->optim.name < NB_TRAIN_OPTIM_COUNT, "optim.name: invalid value");
  RULE(c->schedule.kind >= 0 && c->schedule.kind < NB_TRAIN_SCHEDULE_COUNT, "schedule.kind: invalid value");
  RULE(c->on_nonfinite >= 0 && c->on_nonfinite < NB_TRAIN_NONFINITE_COUNT, "on_nonfinite: invalid value");
  int64_t first, last;
  RULE(!c->profile.steps[0] || nb_train_profile_steps(c, &first, &last),
       "profile.steps: '%s' is not a step range A-B or a step A (1 <= A <= B)", c->profile.steps);
  return NB_OK;
}

bool nb_train_profile_steps(const nb_train_config *c, int64_t *first, int64_t *last) {
  return nb_prof_parse_steps(c->profile.steps, first, last);
}

static void write_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\x%02x", (unsigned char)*s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

/* A key's value as the YAML nb_train_config_write writes. */
static void write_value(FILE *f, const key_def *d, const nb_train_config *c) {
  const char *p = (const char *)c + d->off;
  int iv;
  int64_t lv;
  double dv;
  bool bv;
  switch (d->k) {
    case K_PRESET: write_str(f, c->preset); break;
    case K_INT: memcpy(&lv, p, sizeof lv); fprintf(f, "%lld", (long long)lv); break;
    case K_FLOAT: {
      char buf[40];
      memcpy(&dv, p, sizeof dv);
      for (int prec = 6; prec <= 17; prec++) { /* the shortest text that reads back exactly */
        snprintf(buf, sizeof buf, "%.*g", prec, dv);
        if (strtod(buf, NULL) == dv) break;
      }
      fputs(buf, f);
      break;
    }
    case K_BOOL: memcpy(&bv, p, sizeof bv); fputs(bv ? "true" : "false", f); break;
    case K_STR: write_str(f, p); break;
    case K_RULES: fputs(*p ? p : "null", f); break;
    case K_ENUM: memcpy(&iv, p, sizeof iv); fputs(d->choices[iv], f); break;
    case K_DTYPE: memcpy(&iv, p, sizeof iv); fputs(nb_dtype_name((nb_dtype)iv), f); break;
  }
}

void nb_train_config_write(const nb_train_config *c, FILE *f) {
  char section[64] = "";
  for (size_t i = 0; i < NKEYS; i++) {
    const key_def *d = &keys[i];
    const char *dot = strchr(d->key, '.'), *name = dot ? dot + 1 : d->key;
    char sec[64];
    snprintf(sec, sizeof sec, "%.*s", dot ? (int)(dot - d->key) : 0, d->key);
    if (strcmp(sec, section)) {
      if (sec[0]) fprintf(f, "%s:\n", sec);
      snprintf(section, sizeof section, "%s", sec);
    }
    fprintf(f, "%s%s: ", sec[0] ? "  " : "", name);
    write_value(f, d, c);
    fputc('\n', f);
  }
}

void nb_train_config_diff(const nb_train_config *a, const nb_train_config *b, const char *prefix, char *buf,
                              size_t cap) {
  nb_train_config_diff_values(a, b, prefix, NULL, NULL, buf, cap);
}

void nb_train_config_diff_values(const nb_train_config *a, const nb_train_config *b, const char *prefix,
                                     const char *a_name, const char *b_name, char *buf, size_t cap) {
  static const size_t size[] = {[K_INT] = sizeof(int64_t), [K_FLOAT] = sizeof(double), [K_BOOL] = sizeof(bool),
                                [K_STR] = NB_TRAIN_STR_MAX, [K_ENUM] = sizeof(int), [K_DTYPE] = sizeof(int),
                                [K_PRESET] = 0, [K_RULES] = NB_TRAIN_RULES_MAX};
  size_t pl = strlen(prefix), len = 0;
  char *text = NULL;
  FILE *f = open_memstream(&text, &len);
  if (cap) buf[0] = 0;
  if (!f) return;
  bool first = true;
  for (size_t i = 0; i < NKEYS; i++) {
    const key_def *d = &keys[i];
    const char *pa = (const char *)a + d->off, *pb = (const char *)b + d->off;
    if (strncmp(d->key, prefix, pl) || !size[d->k]) continue; /* the preset is a name, its values are compared */
    if (d->k == K_STR || d->k == K_RULES ? !strcmp(pa, pb) : !memcmp(pa, pb, size[d->k])) continue;
    fprintf(f, "%s%s", first ? "" : a_name ? "; " : ", ", d->key);
    if (a_name) {
      fputs(": ", f);
      write_value(f, d, a);
      fprintf(f, " %s, ", a_name);
      write_value(f, d, b);
      fprintf(f, " %s", b_name);
    }
    first = false;
  }
  if (fclose(f) == 0 && cap) snprintf(buf, cap, "%s", text); /* cut at cap */
  free(text);
}

/* ---------------------------------------------------------------- init_from */

/* model keys that say how to train, not what the model computes: init_from
 * takes them from the run */
static bool training_key(const char *key) {
  static const char *const k[] = {"model.dropout", "model.attn_dropout", "model.init_std", "model.scaled_init",
                                  "model.router_init_std", "model.lb_loss_coef", "model.z_loss_coef",
                                  "model.capacity_factor", NULL};
  for (int i = 0; k[i]; i++)
    if (!strcmp(key, k[i])) return true;
  return false;
}

nb_status nb_train__model_from(nb_ctx *ctx, const nb_train_config *run, const nb_model_config *src, const char *src_name,
                               nb_model_config *out) {
  static const size_t size[] = {[K_INT] = sizeof(int64_t), [K_FLOAT] = sizeof(double), [K_BOOL] = sizeof(bool),
                                [K_ENUM] = sizeof(int)};
  nb_train_config theirs = *run;
  theirs.model = *src;
  nb_model_config m = *src;
  for (size_t i = 0; i < NKEYS; i++) {
    const key_def *d = &keys[i];
    if (strncmp(d->key, "model.", 6) || d->k == K_PRESET) continue;
    const char *ours = (const char *)run + d->off;
    char *mine = (char *)&m + (d->off - O(model));
    if (training_key(d->key)) {
      memcpy(mine, ours, size[d->k]);
      continue;
    }
    if (!(run->model_keys_set & model_bit(d)) || !memcmp(ours, (const char *)&theirs + d->off, size[d->k])) continue;
    char a[64] = "", b[64] = "";
    FILE *fa = fmemopen(a, sizeof a - 1, "w"), *fb = fmemopen(b, sizeof b - 1, "w");
    if (fa) write_value(fa, d, run), fclose(fa);
    if (fb) write_value(fb, d, &theirs), fclose(fb);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "init_from '%s': %s is %s in the run config but %s in the model it starts from (the model comes "
                     "from init_from: drop the key%s or make it agree)",
                     src_name, d->key, a, b, run->model_keys_set == ~(uint64_t)0 ? " (model.preset sets every model key)" : "");
  }
  m.scan_layers = run->model.scan_layers; /* how the layers are traced: the run's */
  *out = m;
  return NB_OK;
}
