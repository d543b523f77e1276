/* Quantization rules: an ordered list of (module path regex [, op names] ->
 * how to quantize), from the C API or YAML (quant.rules). The regexes are
 * PCRE2 (Python's re syntax, as Qwix's), compiled anchored at both ends: a
 * full match, like re.fullmatch. Op names restrict a rule to the products the
 * linear hook intercepts (Qwix's QtRule.op_names). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "nabla/quant.h"

struct nb_quant_rules {
  nb_ctx *ctx;
  int n;
  nb_quant_rule *rules; /* module_path and the op_names array owned (its strings: op_names below) */
  unsigned *ops;        /* per rule: the bit 1 << op of each op it applies to */
  pcre2_code **re;
};

static const char *const op_names[NB_QUANT_OP_COUNT] = {"dot_general", "stacked_dot_general"};
#define KNOWN_OPS "dot_general, stacked_dot_general"

const char *nb_quant_op_name(nb_quant_op op) { return (unsigned)op < NB_QUANT_OP_COUNT ? op_names[op] : "?"; }

nb_status nb_quant_op_parse(nb_ctx *ctx, const char *s, nb_quant_op *out) {
  for (int i = 0; s && i < NB_QUANT_OP_COUNT; i++)
    if (!strcmp(s, op_names[i])) return *out = (nb_quant_op)i, NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "unknown op '%s'; known: " KNOWN_OPS, s ? s : "(null)");
}

void nb_quant_rules_destroy(nb_quant_rules *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    free((char *)r->rules[i].module_path);
    free((void *)r->rules[i].op_names);
    if (r->re[i]) pcre2_code_free(r->re[i]);
  }
  free(r->rules);
  free(r->ops);
  free(r->re);
  free(r);
}

int nb_quant_rules_count(const nb_quant_rules *r) { return r ? r->n : 0; }
const nb_quant_rule *nb_quant_rules_at(const nb_quant_rules *r, int i) {
  return r && i >= 0 && i < r->n ? &r->rules[i] : NULL;
}

/* A rule's fields that do not depend on the weight: the tile, the act/weight
 * combination the kernels support, the calibration's parameters. */
static nb_status check_rule(nb_ctx *ctx, int i, const nb_quant_rule *q) {
  if (!q->module_path) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: module_path: missing", i);
  if (q->n_op_names < 0 || (q->n_op_names > 0 && !q->op_names))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: op_names: %d names and no array", i, q->n_op_names);
  for (int j = 0; j < q->n_op_names; j++) {
    nb_quant_op op;
    if (nb_quant_op_parse(ctx, q->op_names[j], &op)) {
      char msg[200];
      snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
      nb_ctx_clear_error(ctx);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: op_names[%d]: %s", i, j, msg);
    }
  }
  if ((unsigned)q->weight_qtype >= NB_QUANT_TYPE_COUNT)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: weight_qtype: %d is not a quant type", i, (int)q->weight_qtype);
  if ((unsigned)q->act_qtype >= NB_QUANT_ACT_COUNT)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_qtype: %d is not an activation type", i, (int)q->act_qtype);
  if (q->tile_size < 0 || q->tile_size % 16)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: tile_size: %lld is not a positive multiple of 16 (0: per-channel)",
                     i, (long long)q->tile_size);
  const nb_quant_calib *c = &q->weight_calibration;
  bool integer = q->weight_qtype == NB_QUANT_INT8 || q->weight_qtype == NB_QUANT_INT4;
  if ((unsigned)c->kind > NB_QUANT_FIXED) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: weight_calibration: unknown kind", i);
  if (c->kind == NB_QUANT_RMS && !(c->k > 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: weight_calibration: rms,K needs K > 0", i);
  if (c->kind == NB_QUANT_FIXED && !(c->min < c->max))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: weight_calibration: fixed,MIN,MAX needs MIN < MAX", i);
  if (c->kind == NB_QUANT_MINMAX && !integer)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: weight_calibration: minmax is asymmetric; %s is symmetric", i,
                     nb_quant_type_name(q->weight_qtype));
  bool asymmetric = integer && (c->kind == NB_QUANT_MINMAX || c->kind == NB_QUANT_FIXED);
  if ((q->act_qtype == NB_QUANT_ACT_INT8_DYNAMIC || q->act_qtype == NB_QUANT_ACT_INT8_STATIC) &&
      (q->weight_qtype != NB_QUANT_INT8 || asymmetric))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_qtype: %s needs int8 symmetric weights (absmax or rms calibration)", i,
                     nb_quant_act_name(q->act_qtype));
  const nb_quant_calib *ac = &q->act_calibration;
  if ((unsigned)ac->kind > NB_QUANT_FIXED) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_calibration: unknown kind", i);
  if (ac->kind != NB_QUANT_ABSMAX && q->act_qtype != NB_QUANT_ACT_INT8_STATIC)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_calibration: only int8_static activations are calibrated (act_qtype is %s)",
                     i, nb_quant_act_name(q->act_qtype));
  if (ac->kind == NB_QUANT_RMS && !(ac->k > 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_calibration: rms,K needs K > 0", i);
  if (ac->kind == NB_QUANT_FIXED && !(ac->min < ac->max && isfinite(ac->min) && isfinite(ac->max)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: act_calibration: fixed,MIN,MAX needs finite MIN < MAX", i);
  if (q->act_qtype == NB_QUANT_ACT_INT8_BLOCK && ((q->weight_qtype != NB_QUANT_INT8 && q->weight_qtype != NB_QUANT_INT4) || asymmetric))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "rule %d: act_qtype: int8_block needs int8 or int4 symmetric weights (absmax or rms calibration)", i);
  return NB_OK;
}

nb_quant_rules *nb_quant_rules_create(nb_ctx *ctx, int n, const nb_quant_rule *rules) {
  if (n < 0 || (n > 0 && !rules)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "rules: %d rules and no array", n), NULL;
  nb_quant_rules *r = calloc(1, sizeof *r);
  if (r)
    r->rules = calloc((size_t)n + 1, sizeof *r->rules), r->re = calloc((size_t)n + 1, sizeof *r->re),
    r->ops = calloc((size_t)n + 1, sizeof *r->ops);
  if (!r || !r->rules || !r->re || !r->ops) return nb_quant_rules_destroy(r), nb_errorf(ctx, NB_ERR_NOMEM, "rules: out of memory"), NULL;
  r->ctx = ctx;
  for (int i = 0; i < n; i++) {
    if (check_rule(ctx, i, &rules[i])) return nb_quant_rules_destroy(r), NULL;
    r->rules[i] = rules[i];
    r->rules[i].module_path = strdup(rules[i].module_path);
    r->rules[i].op_names = NULL;
    r->n = i + 1;
    int no = rules[i].n_op_names;
    const char **names = no ? calloc((size_t)no, sizeof *names) : NULL;
    r->rules[i].op_names = names;
    r->ops[i] = no ? 0 : (1u << NB_QUANT_OP_COUNT) - 1; /* no names: every op */
    for (int j = 0; names && j < no; j++) {
      nb_quant_op op;
      nb_quant_op_parse(ctx, rules[i].op_names[j], &op); /* checked above */
      r->ops[i] |= 1u << op, names[j] = op_names[op];
    }
    if (!r->rules[i].module_path || (no && !names))
      return nb_quant_rules_destroy(r), nb_errorf(ctx, NB_ERR_NOMEM, "rules: out of memory"), NULL;
    int err;
    PCRE2_SIZE off;
    r->re[i] = pcre2_compile((PCRE2_SPTR)rules[i].module_path, PCRE2_ZERO_TERMINATED,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &err, &off, NULL);
    if (!r->re[i]) {
      char msg[256];
      pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "rule %d: module_path: '%s': %s at offset %zu", i, rules[i].module_path, msg,
                (size_t)off);
      return nb_quant_rules_destroy(r), NULL;
    }
  }
  return r;
}

bool nb_quant_rules_applies_to(const nb_quant_rules *r, int i, nb_quant_op op) {
  return r && i >= 0 && i < r->n && (unsigned)op < NB_QUANT_OP_COUNT && (r->ops[i] >> op & 1);
}

int nb_quant_rules_match(const nb_quant_rules *r, const char *module_path, nb_quant_op op) {
  if (!r || !module_path) return -1;
  for (int i = 0; i < r->n; i++) {
    if (!nb_quant_rules_applies_to(r, i, op)) continue; /* the path may match; the op does not: the next rule */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->re[i], NULL);
    if (!md) return -1;
    int rc = pcre2_match(r->re[i], (PCRE2_SPTR)module_path, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    if (rc >= 0) return i;
  }
  return -1;
}

/* ---------------------------------------------------------------- YAML */

typedef struct yaml_in {
  nb_ctx *ctx;
  const char *name;
  yaml_document_t *doc;
} yaml_in;

static const char *scalar(yaml_node_t *n) { return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL; }
static size_t line_of(yaml_node_t *n) { return n->start_mark.line + 1; }

/* The value node of key in a mapping, or NULL. */
static yaml_node_t *lookup(yaml_document_t *doc, yaml_node_t *map, const char *key) {
  if (!map || map->type != YAML_MAPPING_NODE) return NULL;
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    const char *k = scalar(yaml_document_get_node(doc, p->key));
    if (k && !strcmp(k, key)) return yaml_document_get_node(doc, p->value);
  }
  return NULL;
}

/* op_names: a list of names (a single name is taken as a list of one), into
 * names[] (room for the list's length); unknown names are refused here,
 * with the file's line. */
static nb_status rule_op_names(yaml_in *in, int i, yaml_node_t *vn, nb_quant_rule *q, const char ***names) {
  yaml_node_item_t *start = NULL, *top = NULL;
  if (vn->type == YAML_SEQUENCE_NODE) start = vn->data.sequence.items.start, top = vn->data.sequence.items.top;
  int n = vn->type == YAML_SEQUENCE_NODE ? (int)(top - start) : 1;
  free(*names);
  *names = calloc((size_t)n + 1, sizeof **names);
  if (!*names) return nb_errorf(in->ctx, NB_ERR_NOMEM, "%s: out of memory", in->name);
  for (int j = 0; j < n; j++) {
    yaml_node_t *item = start ? yaml_document_get_node(in->doc, start[j]) : vn;
    const char *v = scalar(item);
    nb_quant_op op;
    if (!v) return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: op_names[%d]: a name wanted", in->name, line_of(item), i, j);
    if (nb_quant_op_parse(in->ctx, v, &op)) {
      nb_ctx_clear_error(in->ctx);
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: op_names[%d]: unknown op '%s'; known: " KNOWN_OPS, in->name,
                       line_of(item), i, j, v);
    }
    (*names)[j] = v;
  }
  q->op_names = *names, q->n_op_names = n;
  return NB_OK;
}

static nb_status rule_field(yaml_in *in, int i, yaml_node_t *kn, yaml_node_t *vn, nb_quant_rule *q, const char ***names) {
  const char *k = scalar(kn), *v = scalar(vn);
  size_t line = line_of(vn);
  if (!k) return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: keys must be scalars", in->name, line_of(kn), i);
  if (!strcmp(k, "op_names")) return rule_op_names(in, i, vn, q, names);
  if (!v) return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: %s: a scalar wanted", in->name, line, i, k);
  if (!strcmp(k, "module_path")) {
    q->module_path = v;
  } else if (!strcmp(k, "weight_qtype")) {
    if (nb_quant_type_parse(in->ctx, v, &q->weight_qtype)) {
      nb_ctx_clear_error(in->ctx);
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: weight_qtype: '%s' is not one of int8, int4, nf4, "
                       "fp8_e4m3, fp8_e5m2", in->name, line, i, v);
    }
  } else if (!strcmp(k, "act_qtype")) {
    if (!strcmp(v, "none")) q->act_qtype = NB_QUANT_ACT_NONE;
    else if (!strcmp(v, "int8_dynamic") || !strcmp(v, "int8")) q->act_qtype = NB_QUANT_ACT_INT8_DYNAMIC;
    else if (!strcmp(v, "int8_block")) q->act_qtype = NB_QUANT_ACT_INT8_BLOCK;
    else if (!strcmp(v, "int8_static")) q->act_qtype = NB_QUANT_ACT_INT8_STATIC;
    else
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: act_qtype: '%s' is not none, int8_dynamic, int8_block or "
                       "int8_static", in->name, line, i, v);
  } else if (!strcmp(k, "tile_size")) {
    char *end;
    long long t = strtoll(v, &end, 10);
    if (!strcmp(v, "per_channel") || !strcmp(v, "null") || !strcmp(v, "~")) t = 0;
    else if (end == v || *end || t <= 0)
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: tile_size: '%s' is not a positive integer or per_channel",
                       in->name, line, i, v);
    q->tile_size = t;
  } else if (!strcmp(k, "weight_calibration")) {
    if (nb_quant_calib_parse(in->ctx, v, &q->weight_calibration)) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", nb_ctx_error(in->ctx));
      nb_ctx_clear_error(in->ctx);
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: weight_calibration: %s", in->name, line, i, msg);
    }
  } else if (!strcmp(k, "act_calibration")) {
    if (nb_quant_calib_parse(in->ctx, v, &q->act_calibration)) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", nb_ctx_error(in->ctx));
      nb_ctx_clear_error(in->ctx);
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: act_calibration: %s", in->name, line, i, msg);
    }
  } else {
    return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: unknown field '%s' (module_path, op_names, weight_qtype, act_qtype, "
                     "tile_size, weight_calibration, act_calibration)", in->name, line_of(kn), i, k);
  }
  return NB_OK;
}

static nb_quant_rules *rules_from_doc(yaml_in *in) {
  nb_ctx *ctx = in->ctx;
  yaml_node_t *root = yaml_document_get_root_node(in->doc);
  if (!root || root->type != YAML_MAPPING_NODE)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: the top level must be a mapping with quant.rules", in->name), NULL;
  yaml_node_t *quant = lookup(in->doc, root, "quant");
  yaml_node_t *list = lookup(in->doc, quant, "rules");
  if (!list) return nb_errorf(ctx, NB_ERR_FORMAT, "%s: quant.rules: missing", in->name), NULL;
  if (list->type != YAML_SEQUENCE_NODE)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: quant.rules: a list of rules wanted", in->name, line_of(list)), NULL;
  int n = (int)(list->data.sequence.items.top - list->data.sequence.items.start);
  nb_quant_rule *rules = calloc((size_t)n + 1, sizeof *rules);
  const char ***names = calloc((size_t)n + 1, sizeof *names); /* each rule's op_names, alive until the rules are made */
  if (!rules || !names) return free(rules), free(names), nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", in->name), NULL;
  nb_status s = NB_OK;
  for (int i = 0; !s && i < n; i++) {
    yaml_node_t *item = yaml_document_get_node(in->doc, list->data.sequence.items.start[i]);
    rules[i] = (nb_quant_rule){.weight_qtype = NB_QUANT_TYPE_COUNT, .weight_calibration = {.kind = NB_QUANT_ABSMAX},
                               .act_calibration = {.kind = NB_QUANT_ABSMAX}};
    if (item->type != YAML_MAPPING_NODE) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: a mapping of fields wanted", in->name, line_of(item), i);
      break;
    }
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; !s && p < item->data.mapping.pairs.top; p++)
      s = rule_field(in, i, yaml_document_get_node(in->doc, p->key), yaml_document_get_node(in->doc, p->value), &rules[i], &names[i]);
    if (s) break;
    const char *missing = !rules[i].module_path ? "module_path" : rules[i].weight_qtype == NB_QUANT_TYPE_COUNT ? "weight_qtype" : NULL;
    if (missing) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: rule %d: %s: missing", in->name, line_of(item), i, missing);
  }
  nb_quant_rules *r = NULL;
  if (!s) {
    r = nb_quant_rules_create(ctx, n, rules);
    if (!r) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
      nb_status e = nb_ctx_status(ctx);
      nb_ctx_clear_error(ctx);
      nb_errorf(ctx, e, "%s: %s", in->name, msg);
    }
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  free(rules);
  return r;
}

nb_quant_rules *nb_quant_rules_parse_yaml(nb_ctx *ctx, const char *name, const char *text, size_t len) {
  if (!name) name = "<rules>";
  if (!text) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: no text", name), NULL;
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", name), NULL;
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  if (!yaml_parser_load(&parser, &doc)) {
    nb_errorf(ctx, NB_ERR_FORMAT, "%s:%zu: YAML error: %s", name, parser.problem_mark.line + 1,
              parser.problem ? parser.problem : "malformed");
    yaml_parser_delete(&parser);
    return NULL;
  }
  yaml_in in = {ctx, name, &doc};
  nb_quant_rules *r = rules_from_doc(&in);
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  return r;
}

nb_quant_rules *nb_quant_rules_load_yaml(nb_ctx *ctx, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot open", path), NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      char *b = realloc(buf, cap = cap ? 2 * cap : 4096);
      if (!b) return free(buf), fclose(f), nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", path), NULL;
      buf = b;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (!got) break;
    n += got;
  }
  bool err = ferror(f);
  fclose(f);
  nb_quant_rules *r = err ? (nb_errorf(ctx, NB_ERR_IO, "%s: read error", path), NULL) : nb_quant_rules_parse_yaml(ctx, path, buf, n);
  free(buf);
  return r;
}
