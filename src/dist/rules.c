/* Sharding rules (nabla/dist.h): an ordered list of (path regex, partition
 * spec), from the C API or YAML; layouts (a spec per leaf of a tree, checked
 * against its shape and the mesh's axes); and the blocks a process holds.
 * The regexes are PCRE2 compiled anchored at both ends (a full match), as
 * the quantization rules' (src/quant/rules.c). Needs no MPI: built with and
 * without it. Not here: what a trainer can run with a layout (src/train). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "nabla/dist.h"

typedef struct rule_t {
  char *regex;
  pcre2_code *re;
  int n;                                   /* the spec's length */
  char axes[NB_MAX_RANK][NB_AXIS_NAME_MAX]; /* "" where the dim is replicated */
  const char *spec[NB_MAX_RANK];           /* axes[d] or NULL */
} rule_t;

struct nb_dist_rules {
  nb_ctx *ctx;
  char label[64];
  int n, cap;
  rule_t *rules;
};

/* ---------------------------------------------------------------- rules */

nb_dist_rules *nb_dist_rules_create(nb_ctx *ctx, const char *label) {
  nb_dist_rules *r = nb_calloc(ctx, sizeof *r);
  if (!r) return NULL;
  r->ctx = ctx;
  snprintf(r->label, sizeof r->label, "%s", label ? label : "rules");
  return r;
}

void nb_dist_rules_destroy(nb_dist_rules *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    nb_strfree(r->ctx, r->rules[i].regex);
    pcre2_code_free(r->rules[i].re);
  }
  if (r->rules) nb_dealloc(r->ctx, r->rules, (size_t)r->cap * sizeof *r->rules);
  nb_dealloc(r->ctx, r, sizeof *r);
}

int nb_dist_rules_count(const nb_dist_rules *r) { return r ? r->n : 0; }
const char *nb_dist_rules_label(const nb_dist_rules *r) { return r ? r->label : "rules"; }
const char *nb_dist_rules_regex(const nb_dist_rules *r, int i) { return r && i >= 0 && i < r->n ? r->rules[i].regex : NULL; }

nb_part_spec nb_dist_rules_spec(const nb_dist_rules *r, int i, int *n) {
  bool ok = r && i >= 0 && i < r->n;
  if (n) *n = ok ? r->rules[i].n : 0;
  return ok ? r->rules[i].spec : NULL;
}

char *nb_dist_spec_str(int n, nb_part_spec spec, char *buf, size_t cap) {
  size_t k = 0;
  if (!cap) return buf;
  buf[0] = 0;
  k += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < n && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%s", d ? ", " : "", spec && spec[d] ? spec[d] : "null");
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

nb_status nb_dist_rules_add(nb_dist_rules *r, const char *regex, int n, const char *const *spec) {
  if (!r) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = r->ctx;
  int i = r->n;
  if (!regex) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].path: missing (a regex)", r->label, i);
  if (n < 0 || n > NB_MAX_RANK || (n > 0 && !spec))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].spec: %d dims (0 to %d, with an array of axes)", r->label, i, n,
                     NB_MAX_RANK);
  rule_t q = {.n = n};
  for (int d = 0; d < n; d++) {
    if (!spec[d]) continue;
    size_t len = strlen(spec[d]);
    if (len == 0 || len >= NB_AXIS_NAME_MAX)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].spec[%d]: an axis name has 1 to %d characters (null: replicated)",
                       r->label, i, d, NB_AXIS_NAME_MAX - 1);
    for (int e = 0; e < d; e++)
      if (spec[e] && !strcmp(spec[e], spec[d]))
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].spec: axis '%s' splits dims %d and %d: an axis splits one dim of a leaf",
                         r->label, i, spec[d], e, d);
    memcpy(q.axes[d], spec[d], len + 1);
  }
  int err;
  PCRE2_SIZE off;
  q.re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &err, &off, NULL);
  if (!q.re) {
    char msg[256];
    pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].path: '%s': %s at offset %zu", r->label, i, regex, msg, (size_t)off);
  }
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 8;
    rule_t *grown = nb_alloc(ctx, (size_t)cap * sizeof *grown);
    if (!grown) return pcre2_code_free(q.re), nb_ctx_status(ctx);
    if (r->n) memcpy(grown, r->rules, (size_t)r->n * sizeof *grown);
    if (r->rules) nb_dealloc(ctx, r->rules, (size_t)r->cap * sizeof *r->rules);
    r->rules = grown, r->cap = cap;
  }
  if (!(q.regex = nb_strdup(ctx, regex))) return pcre2_code_free(q.re), nb_ctx_status(ctx);
  rule_t *at = &r->rules[r->n++];
  *at = q;
  for (int d = 0; d < n; d++) at->spec[d] = at->axes[d][0] ? at->axes[d] : NULL; /* into its own storage */
  return NB_OK;
}

int nb_dist_rules_match(const nb_dist_rules *r, const char *path) {
  if (!r || !path) return -1;
  for (int i = 0; i < r->n; i++) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->rules[i].re, NULL);
    if (!md) return -1;
    int rc = pcre2_match(r->rules[i].re, (PCRE2_SPTR)path, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    if (rc >= 0) return i;
  }
  return -1;
}

/* "data, fsdp, expert, tensor" */
static void axis_list(int naxes, const char (*names)[NB_AXIS_NAME_MAX], const nb_dist_axis *axes, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = 0;
  for (int a = 0; a < naxes && k < cap; a++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%s", a ? ", " : "", names ? names[a] : axes[a].name);
}

nb_status nb_dist_rules_check_axes(const nb_dist_rules *r, nb_ctx *ctx, int naxes, const nb_dist_axis *axes) {
  for (int i = 0; r && i < r->n; i++)
    for (int d = 0; d < r->rules[i].n; d++) {
      const char *ax = r->rules[i].spec[d];
      bool known = !ax;
      for (int a = 0; !known && a < naxes; a++) known = !strcmp(axes[a].name, ax);
      if (known) continue;
      char list[256];
      axis_list(naxes, NULL, axes, list, sizeof list);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].spec[%d]: '%s' is not a mesh axis (%s; null: replicated)", r->label, i,
                       d, ax, list);
    }
  return NB_OK;
}

/* ---------------------------------------------------------------- YAML */

typedef struct yaml_in {
  nb_ctx *ctx;
  const char *label;
  yaml_document_t *doc;
} yaml_in;

static yaml_node_t *node(yaml_in *in, int id) { return yaml_document_get_node(in->doc, id); }
static bool is_null(const yaml_node_t *n) {
  if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
  const char *v = (const char *)n->data.scalar.value;
  return !*v || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL") || !strcmp(v, "~");
}
static int seq_len(const yaml_node_t *n) { return (int)(n->data.sequence.items.top - n->data.sequence.items.start); }

#define PAIR_FORM "a [regex, [axis|null, ...]] pair wanted"

/* Entry i: [regex, [axis|null, ...]]. */
static nb_status parse_entry(yaml_in *in, nb_dist_rules *r, int i, yaml_node_t *e) {
  const char *L = in->label;
  if (e->type == YAML_MAPPING_NODE)
    return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d]: %s, not a mapping (write {path: P, spec: S} as [P, S])", L, i, PAIR_FORM);
  if (e->type != YAML_SEQUENCE_NODE || seq_len(e) != 2)
    return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d]: %s (got %s)", L, i, PAIR_FORM,
                     e->type == YAML_SEQUENCE_NODE ? "a list of another length" : "a scalar");
  yaml_node_t *path = node(in, e->data.sequence.items.start[0]), *spec = node(in, e->data.sequence.items.start[1]);
  if (path->type != YAML_SCALAR_NODE || is_null(path))
    return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d].path: a regex wanted (a string)", L, i);
  if (spec->type != YAML_SEQUENCE_NODE)
    return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d].spec: a list of axis names or null wanted ([fsdp], [null, tensor]; "
                     "[] replicates every dim)", L, i);
  int n = seq_len(spec);
  if (n > NB_MAX_RANK) return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d].spec: %d dims (at most %d)", L, i, n, NB_MAX_RANK);
  const char *axes[NB_MAX_RANK];
  for (int d = 0; d < n; d++) {
    yaml_node_t *a = node(in, spec->data.sequence.items.start[d]);
    if (a->type != YAML_SCALAR_NODE)
      return nb_errorf(in->ctx, NB_ERR_FORMAT, "%s[%d].spec[%d]: an axis name or null wanted", L, i, d);
    axes[d] = is_null(a) ? NULL : (const char *)a->data.scalar.value;
  }
  nb_status s = nb_dist_rules_add(r, (const char *)path->data.scalar.value, n, axes);
  if (s == NB_ERR_INVALID_ARG) s = nb_errorf(in->ctx, NB_ERR_FORMAT, "%s", nb_ctx_error(in->ctx));
  return s;
}

nb_dist_rules *nb_dist_rules_parse_yaml(nb_ctx *ctx, const char *label, const char *text, size_t len) {
  if (!label) label = "rules";
  if (!text) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: no text", label), NULL;
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", label), NULL;
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  if (!yaml_parser_load(&parser, &doc)) {
    nb_errorf(ctx, NB_ERR_FORMAT, "%s: YAML error: %s (line %zu)", label, parser.problem ? parser.problem : "malformed",
              parser.problem_mark.line + 1);
    yaml_parser_delete(&parser);
    return NULL;
  }
  yaml_in in = {ctx, label, &doc};
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  nb_dist_rules *r = NULL;
  if (!root || root->type != YAML_SEQUENCE_NODE)
    nb_errorf(ctx, NB_ERR_FORMAT, "%s: a list of [regex, [axis|null, ...]] pairs wanted", label);
  else if ((r = nb_dist_rules_create(ctx, label)))
    for (int i = 0; r && i < seq_len(root); i++)
      if (parse_entry(&in, r, i, node(&in, root->data.sequence.items.start[i]))) r = (nb_dist_rules_destroy(r), NULL);
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  return r;
}

/* ---------------------------------------------------------------- layouts */

typedef struct entry {
  char *path;
  nb_aval whole, block;
  int rule;
  const char *spec[NB_MAX_RANK]; /* the layout's axis names or NULL */
} entry;

struct nb_dist_layout {
  nb_ctx *ctx;
  int naxes;
  char names[NB_MAX_AXES][NB_AXIS_NAME_MAX];
  int64_t sizes[NB_MAX_AXES];
  bool padded[NB_MAX_AXES];
  size_t n, cap;
  entry *e;
  nb_tree *index; /* path -> its block's aval, in the entries' order: nb_tree_find is the entry's index */
};

nb_dist_layout *nb_dist_layout_create(nb_ctx *ctx, int naxes, const nb_dist_axis *axes) {
  if (naxes < 0 || naxes > NB_MAX_AXES || (naxes && !axes))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout: %d axes (0 to %d)", naxes, NB_MAX_AXES), NULL;
  for (int a = 0; a < naxes; a++)
    if (!axes[a].name || !axes[a].name[0] || strlen(axes[a].name) >= NB_AXIS_NAME_MAX || axes[a].size < 1)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout: axis %d: a name of 1 to %d characters and a size >= 1 wanted", a,
                       NB_AXIS_NAME_MAX - 1), NULL;
  nb_dist_layout *l = nb_calloc(ctx, sizeof *l);
  if (!l) return NULL;
  l->ctx = ctx;
  l->naxes = naxes;
  for (int a = 0; a < naxes; a++) {
    snprintf(l->names[a], sizeof l->names[a], "%s", axes[a].name);
    l->sizes[a] = axes[a].size, l->padded[a] = axes[a].padded;
  }
  if (!(l->index = nb_tree_create(ctx))) return nb_dealloc(ctx, l, sizeof *l), NULL;
  return l;
}

void nb_dist_layout_destroy(nb_dist_layout *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) nb_strfree(l->ctx, l->e[i].path);
  if (l->e) nb_dealloc(l->ctx, l->e, l->cap * sizeof *l->e);
  nb_tree_destroy(l->index);
  nb_dealloc(l->ctx, l, sizeof *l);
}

static int axis_of(const nb_dist_layout *l, const char *name) {
  for (int a = 0; name && a < l->naxes; a++)
    if (!strcmp(l->names[a], name)) return a;
  return -1;
}

/* "mesh.rules[2] ('.*': [null, tensor])" or "no rule" */
static const char *rule_words(const nb_dist_rules *r, int i, char *buf, size_t cap) {
  char sp[160];
  int n;
  nb_part_spec s = nb_dist_rules_spec(r, i, &n);
  if (!r || i < 0) snprintf(buf, cap, "no rule");
  else snprintf(buf, cap, "%s[%d] ('%s': %s)", r->label, i, r->rules[i].regex, nb_dist_spec_str(n, s, sp, sizeof sp));
  return buf;
}

nb_status nb_dist_layout_add(nb_dist_layout *l, const char *path, nb_aval whole, const nb_dist_rules *r, int rule) {
  if (!l) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = l->ctx;
  if (!path || !path[0]) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout: a leaf without a path");
  if (nb_tree_find(l->index, path) >= 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout: '%s' is there already", path);
  if (r && (rule < -1 || rule >= r->n))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout: '%s': rule %d of %d", path, rule, r->n);
  entry e = {.whole = whole, .block = whole, .rule = r ? rule : -1};
  int n = 0;
  nb_part_spec spec = e.rule >= 0 ? nb_dist_rules_spec(r, rule, &n) : NULL;
  char words[320], av[96];
  if (n > whole.shape.rank)
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: %d dims for '%s' %s of rank %d (a spec may be shorter than the rank, its "
                     "trailing dims replicated, never longer)", rule_words(r, rule, words, sizeof words), n, path,
                     nb_aval_str(&whole, av, sizeof av), whole.shape.rank);
  for (int d = 0; d < n; d++) {
    if (!spec[d]) continue;
    int a = axis_of(l, spec[d]);
    if (a < 0) {
      char list[256];
      axis_list(l->naxes, l->names, NULL, list, sizeof list);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s for '%s': '%s' is not a mesh axis (%s)",
                       rule_words(r, rule, words, sizeof words), path, spec[d], list);
    }
    int64_t dim = whole.shape.dims[d], size = l->sizes[a];
    if (dim % size && !l->padded[a])
      return nb_errorf(ctx, NB_ERR_SHAPE, "%s for '%s' %s: dim %d (%lld) is not a multiple of axis '%s' (%lld processes)",
                       rule_words(r, rule, words, sizeof words), path, nb_aval_str(&whole, av, sizeof av), d, (long long)dim,
                       spec[d], (long long)size);
    e.spec[d] = l->names[a];
    e.block.shape.dims[d] = (dim + size - 1) / size;
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    entry *grown = nb_alloc(ctx, cap * sizeof *grown);
    if (!grown) return nb_ctx_status(ctx);
    if (l->n) memcpy(grown, l->e, l->n * sizeof *grown);
    if (l->e) nb_dealloc(ctx, l->e, l->cap * sizeof *l->e);
    l->e = grown, l->cap = cap;
  }
  if (!(e.path = nb_strdup(ctx, path))) return nb_ctx_status(ctx);
  nb_status s = nb_tree_set(l->index, path, nb_leaf_aval(e.block));
  if (s) return nb_strfree(ctx, e.path), s;
  l->e[l->n++] = e;
  return NB_OK;
}

nb_dist_layout *nb_dist_rules_apply(const nb_dist_rules *r, nb_ctx *ctx, const nb_tree *t, int naxes, const nb_dist_axis *axes) {
  nb_dist_layout *l = nb_dist_layout_create(ctx, naxes, axes);
  for (size_t i = 0; l && t && i < nb_tree_size(t); i++) {
    const char *p = nb_tree_path(t, i);
    if (nb_dist_layout_add(l, p, nb_leaf_get_aval(nb_tree_leaf(t, i)), r, nb_dist_rules_match(r, p)))
      l = (nb_dist_layout_destroy(l), NULL);
  }
  return l;
}

size_t nb_dist_layout_size(const nb_dist_layout *l) { return l ? l->n : 0; }
int64_t nb_dist_layout_find(const nb_dist_layout *l, const char *path) { return l && path ? nb_tree_find(l->index, path) : -1; }
const char *nb_dist_layout_path(const nb_dist_layout *l, size_t i) { return l && i < l->n ? l->e[i].path : NULL; }
int nb_dist_layout_rule(const nb_dist_layout *l, size_t i) { return l && i < l->n ? l->e[i].rule : -1; }
nb_part_spec nb_dist_layout_spec(const nb_dist_layout *l, size_t i) { return l && i < l->n ? l->e[i].spec : NULL; }
nb_aval nb_dist_layout_whole(const nb_dist_layout *l, size_t i) { return l && i < l->n ? l->e[i].whole : (nb_aval){0}; }
nb_aval nb_dist_layout_block(const nb_dist_layout *l, size_t i) { return l && i < l->n ? l->e[i].block : (nb_aval){0}; }

int nb_dist_layout_dim(const nb_dist_layout *l, size_t i, const char *axis) {
  for (int d = 0; l && axis && i < l->n && d < l->e[i].whole.shape.rank; d++)
    if (l->e[i].spec[d] && !strcmp(l->e[i].spec[d], axis)) return d;
  return -1;
}

nb_array *nb_dist_block(nb_ctx *ctx, const nb_array *a, int dim, int64_t lo, int64_t n) {
  int rank = nb_array_rank(a);
  if (dim < 0 || dim >= rank || lo < 0 || n < 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist block: dim %d of a rank-%d array, [%lld, +%lld)", dim, rank, (long long)lo,
                     (long long)n), NULL;
  int64_t dims[NB_MAX_RANK];
  memcpy(dims, nb_array_dims(a), sizeof(int64_t) * (size_t)rank);
  size_t outer = 1, inner = nb_dtype_size(nb_array_dtype(a));
  for (int d = 0; d < dim; d++) outer *= (size_t)dims[d];
  for (int d = dim + 1; d < rank; d++) inner *= (size_t)dims[d];
  int64_t have = dims[dim] - lo < 0 ? 0 : dims[dim] - lo < n ? dims[dim] - lo : n;
  size_t src_row = (size_t)dims[dim] * inner, dst_row = (size_t)n * inner, part = (size_t)have * inner;
  dims[dim] = n;
  nb_array *b = nb_array_empty(ctx, nb_array_dtype(a), rank, dims);
  if (!b) return NULL;
  const char *src = (const char *)nb_array_data(a) + (size_t)lo * inner;
  char *dst = nb_array_data_mut(b);
  for (size_t o = 0; o < outer; o++) {
    if (part) memcpy(dst + o * dst_row, src + o * src_row, part);
    memset(dst + o * dst_row + part, 0, dst_row - part);
  }
  return b;
}

/* The block of array a at coords (a new reference: a itself when no dim is split). */
static nb_array *block_at(const nb_dist_layout *l, nb_ctx *ctx, const entry *e, const nb_array *a, const int64_t *coords) {
  nb_array *cur = (nb_array *)a;
  nb_array_retain(cur);
  for (int d = 0; cur && d < e->whole.shape.rank; d++) {
    int ax = axis_of(l, e->spec[d]);
    if (ax < 0 || l->sizes[ax] == 1) continue;
    int64_t n = e->block.shape.dims[d];
    nb_array *next = nb_dist_block(ctx, cur, d, coords[ax] * n, n);
    nb_array_release(cur);
    cur = next;
  }
  return cur;
}

nb_tree *nb_dist_layout_shards(const nb_dist_layout *l, nb_ctx *ctx, const nb_tree *t, const char *prefix, const int64_t *coords) {
  if (!l || !t) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout shards: NULL layout or tree"), NULL;
  for (int a = 0; coords && a < l->naxes; a++)
    if (coords[a] < 0 || coords[a] >= l->sizes[a])
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout shards: coordinate %lld along axis '%s' of %lld",
                       (long long)coords[a], l->names[a], (long long)l->sizes[a]), NULL;
  nb_tree *out = nb_tree_create(ctx);
  bool pre = prefix && prefix[0];
  for (size_t i = 0; out && i < nb_tree_size(t); i++) {
    const char *p = nb_tree_path(t, i);
    const nb_leaf *leaf = nb_tree_leaf(t, i);
    char full[2048], av[96], wv[96];
    int w = pre ? snprintf(full, sizeof full, "%s/%s", prefix, p) : snprintf(full, sizeof full, "%s", p);
    int64_t at = w < (int)sizeof full ? nb_dist_layout_find(l, full) : -1;
    const entry *e = at >= 0 ? &l->e[at] : NULL;
    nb_aval have = nb_leaf_get_aval(leaf);
    nb_status s = NB_OK;
    if (!e) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout shards: '%s' is not in the layout", full);
    } else if (!nb_aval_equal(&have, &e->whole)) {
      s = nb_errorf(ctx, NB_ERR_SHAPE, "dist layout shards: '%s' is %s, the layout's %s", full, nb_aval_str(&have, av, sizeof av),
                    nb_aval_str(&e->whole, wv, sizeof wv));
    } else if (leaf->array) {
      nb_array *b = coords ? block_at(l, ctx, e, leaf->array, coords) : NULL;
      s = b ? nb_tree_set_array(out, p, b)
          : coords ? nb_ctx_status(ctx) : nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout shards: '%s': an array and no coords", full);
      nb_array_release(b);
    } else if (leaf->val) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist layout shards: '%s' is a traced value (arrays or avals wanted)", full);
    } else {
      s = nb_tree_set(out, p, nb_leaf_aval(e->block));
    }
    if (s) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

void nb_dist_layout_print(const nb_dist_layout *l, const nb_dist_rules *r, FILE *f) {
  size_t width = 8;
  for (size_t i = 0; l && i < l->n; i++)
    if (strlen(l->e[i].path) > width) width = strlen(l->e[i].path);
  for (size_t i = 0; l && i < l->n; i++) {
    const entry *e = &l->e[i];
    char whole[96], block[96], spec[160], rule[200];
    if (e->rule < 0) snprintf(rule, sizeof rule, "no rule (replicated)");
    else if (r && e->rule < r->n) snprintf(rule, sizeof rule, "%s[%d] '%s'", r->label, e->rule, r->rules[e->rule].regex);
    else snprintf(rule, sizeof rule, "rule %d", e->rule);
    fprintf(f, "%-*s  %-16s %-24s %-40s -> %s\n", (int)width, e->path, nb_aval_str(&e->whole, whole, sizeof whole),
            nb_dist_spec_str(e->whole.shape.rank, e->spec, spec, sizeof spec), rule,
            nb_aval_str(&e->block, block, sizeof block));
  }
}
