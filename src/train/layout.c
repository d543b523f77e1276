/* The trainer's sharded state: which dims of the parameters and optimizer
 * state are split over the mesh axis a run splits (fsdp, expert or tensor),
 * from sharding rules (mesh.rules, or the axis's built-in rules below:
 * docs/dist.md has them written out), the blocks a process holds, the
 * gradient norm over blocks, and the parameter hook that gathers a block
 * back where a layer reads it (FSDP's step and eval, expert parallel eval).
 * What each axis can run is checked here and in ep.c / tp.c; the
 * collectives around tensor-parallel linears are tp.c's.
 *
 * The layout: the rules match a parameter's path ("layers/0/attn/wq/kernel");
 * a leaf of the optimizer state whose path ends with a parameter's (Adam's
 * "1/mu/layers/0/attn/wq/kernel") and has its shape takes the parameter's
 * spec, so a shard of the state is the state of the shard; other state
 * leaves (the step count) are whole on every process, as are the leaves no
 * rule matches. A dim split over fsdp is cut into blocks of
 * ceil(d / fsdp), the last padded with zeros; over expert or tensor it
 * must divide. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"

/* ---------------------------------------------------------------- rules */

/* The built-in layouts as rules: what a run without mesh.rules does. */
static const char fsdp_rules[] = "[['.*', [fsdp]]]";
static const char expert_rules[] = "[['.*/moe/experts/.*', [expert]]]";
static const char tensor_rules[] =
    "[['.*/attn/(wq|wk|wv)/kernel', [null, tensor]], ['.*/attn/(wq|wk|wv)/bias', [tensor]], ['.*/attn/wo/kernel', [tensor]],"
    " ['.*/mlp/(wi|wi_0|wi_1)/kernel', [null, tensor]], ['.*/mlp/(wi|wi_0|wi_1)/bias', [tensor]], ['.*/mlp/wo/kernel', [tensor]]]";

const char *nb_train__shard_axis(const nb_train_config *c) {
  return c->mesh.fsdp > 1 ? "fsdp" : c->mesh.expert > 1 ? "expert" : c->mesh.tensor > 1 ? "tensor" : NULL;
}

static int64_t axis_size(const nb_train_config *c, const char *axis) {
  return !axis ? 1 : !strcmp(axis, "fsdp") ? c->mesh.fsdp : !strcmp(axis, "expert") ? c->mesh.expert : c->mesh.tensor;
}

/* The mesh as the rules see it: the four axes, fsdp padded. */
static void mesh_axes(const nb_train_config *c, nb_dist_axis axes[4]) {
  axes[0] = (nb_dist_axis){"data", c->mesh.data, false};
  axes[1] = (nb_dist_axis){"fsdp", c->mesh.fsdp, true};
  axes[2] = (nb_dist_axis){"expert", c->mesh.expert, false};
  axes[3] = (nb_dist_axis){"tensor", c->mesh.tensor, false};
}

nb_dist_rules *nb_train__rules(nb_ctx *ctx, const nb_train_config *c) {
  if (c->mesh.rules[0]) return nb_dist_rules_parse_yaml(ctx, "mesh.rules", c->mesh.rules, strlen(c->mesh.rules));
  const char *axis = nb_train__shard_axis(c);
  const char *text = !axis ? "[]" : !strcmp(axis, "fsdp") ? fsdp_rules : !strcmp(axis, "expert") ? expert_rules : tensor_rules;
  char label[48];
  if (axis) snprintf(label, sizeof label, "the built-in %s rules", axis);
  else snprintf(label, sizeof label, "no rules (no split axis)");
  return nb_dist_rules_parse_yaml(ctx, label, text, strlen(text));
}

nb_status nb_train__rules_check(nb_ctx *ctx, const nb_train_config *c) {
  if (!c->mesh.rules[0]) return NB_OK;
  nb_dist_rules *r = nb_train__rules(ctx, c);
  nb_dist_axis axes[4];
  mesh_axes(c, axes);
  nb_status s = r ? nb_dist_rules_check_axes(r, ctx, 4, axes) : nb_ctx_status(ctx);
  for (int i = 0; !s && i < nb_dist_rules_count(r); i++) {
    int n;
    nb_part_spec sp = nb_dist_rules_spec(r, i, &n);
    for (int d = 0; !s && d < n; d++)
      if (sp[d] && !strcmp(sp[d], "data"))
        s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "mesh.rules[%d].spec[%d]: 'data' splits the batch, not the state: split "
                      "parameters over fsdp (data x fsdp processes hold one copy of the state per data index)", i, d);
  }
  nb_dist_rules_destroy(r);
  return s;
}

/* ---------------------------------------------------------------- the layout */

static nb_status init_state(nb_graph *g, const nb_tree *in, nb_tree *out, void *tx) { return nb_optim_init(tx, g, in, out); }

nb_tree *nb_train__opt_state_spec(nb_ctx *ctx, const nb_train_config *c, const nb_tree *params) {
  nb_tree *pspec = nb_tree_create(ctx);
  for (size_t i = 0; pspec && i < nb_tree_size(params); i++)
    if (nb_tree_set(pspec, nb_tree_path(params, i), nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(params, i)))))
      pspec = (nb_tree_destroy(pspec), NULL);
  nb_optim_tx *tx = pspec ? nb_train_optimizer(ctx, c) : NULL;
  nb_graph *init = tx ? nb_trace(ctx, init_state, tx, pspec) : NULL;
  nb_tree *ospec = init ? nb_graph_output_spec(init) : NULL;
  nb_graph_destroy(init);
  nb_optim_tx_destroy(tx);
  nb_tree_destroy(pspec);
  return ospec;
}

void nb_train__layout_free(nb_train__layout *L) {
  nb_dist_layout_destroy(L->l);
  nb_dist_rules_destroy(L->rules);
  *L = (nb_train__layout){0};
}

/* The index of the parameter an optimizer-state leaf belongs to (its path
 * ends with "/<parameter path>", the same shape), or -1. */
static int64_t param_of(const nb_dist_layout *l, const char *state_path, nb_aval a) {
  char p[NB_TRAIN_PATH_MAX + 8];
  for (const char *s = strchr(state_path, '/'); s; s = strchr(s + 1, '/')) {
    if (snprintf(p, sizeof p, "params/%s", s + 1) >= (int)sizeof p) continue;
    int64_t i = nb_dist_layout_find(l, p);
    nb_aval w = nb_dist_layout_whole(l, (size_t)(i < 0 ? 0 : i));
    if (i >= 0 && nb_shape_equal(&w.shape, &a.shape)) return i;
  }
  return -1;
}

nb_status nb_train__layout_make(nb_ctx *ctx, const nb_train_config *c, const nb_tree *params, const nb_tree *opt_state,
                                nb_train__layout *L) {
  *L = (nb_train__layout){.axis = nb_train__shard_axis(c)};
  L->count = axis_size(c, L->axis);
  nb_dist_axis axes[4];
  mesh_axes(c, axes);
  if (!(L->rules = nb_train__rules(ctx, c)) || !(L->l = nb_dist_layout_create(ctx, 4, axes))) {
    nb_status s = nb_ctx_status(ctx);
    nb_train__layout_free(L);
    return s ? s : NB_ERR_NOMEM;
  }
  /* what the trainer runs, checked on the rules' specs first: its messages say what a layout would need */
  nb_status s = L->axis && !strcmp(L->axis, "tensor")   ? nb_train__tp_check_rules(ctx, c, L->rules, params, &L->tp_attn, &L->tp_mlp)
                : L->axis && !strcmp(L->axis, "expert") ? nb_train__ep_check_rules(ctx, L->rules, params)
                                                        : NB_OK;
  char p[NB_TRAIN_PATH_MAX + 16];
  for (size_t i = 0; !s && params && i < nb_tree_size(params); i++) {
    const char *path = nb_tree_path(params, i);
    snprintf(p, sizeof p, "params/%s", path);
    s = nb_dist_layout_add(L->l, p, nb_leaf_get_aval(nb_tree_leaf(params, i)), L->rules, nb_dist_rules_match(L->rules, path));
  }
  for (size_t i = 0; !s && opt_state && i < nb_tree_size(opt_state); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(opt_state, i));
    int64_t of = param_of(L->l, nb_tree_path(opt_state, i), a);
    snprintf(p, sizeof p, "opt_state/%s", nb_tree_path(opt_state, i));
    s = nb_dist_layout_add(L->l, p, a, L->rules, of < 0 ? -1 : nb_dist_layout_rule(L->l, (size_t)of));
  }
  if (s) nb_train__layout_free(L);
  return s;
}

nb_status nb_train__layout_check(nb_ctx *ctx, const nb_train_config *c) {
  if (!nb_train__shard_axis(c)) return NB_OK;
  nb_tree *params = nb_model_param_spec(ctx, &c->model, NB_F32);
  nb_train__layout L;
  nb_status s = params ? nb_train__layout_make(ctx, c, params, NULL, &L) : nb_ctx_status(ctx);
  if (!s) nb_train__layout_free(&L);
  nb_tree_destroy(params);
  return s;
}

int nb_train__split_dim(const nb_train__layout *L, const char *item, const char *path) {
  if (!L->axis) return -1;
  char p[NB_TRAIN_PATH_MAX + 16];
  if (item && item[0]) snprintf(p, sizeof p, "%s/%s", item, path);
  else snprintf(p, sizeof p, "%s", path);
  int64_t i = nb_dist_layout_find(L->l, p);
  return i < 0 ? -1 : nb_dist_layout_dim(L->l, (size_t)i, L->axis);
}

nb_tree *nb_train__shard_spec(nb_ctx *ctx, const nb_train__layout *L, const char *item, const nb_tree *t) {
  return L->l ? nb_dist_layout_shards(L->l, ctx, t, item, NULL) : nb_tree_copy(t);
}

nb_tree *nb_train__shard(nb_ctx *ctx, const nb_train__layout *L, const char *item, const nb_tree *t, int64_t index) {
  if (!L->l) return nb_tree_copy(t);
  /* coordinates along data, fsdp, expert, tensor: only the split axis's matters (the others split nothing) */
  int64_t coords[4] = {0};
  coords[!strcmp(L->axis, "fsdp") ? 1 : !strcmp(L->axis, "expert") ? 2 : 3] = index;
  return nb_dist_layout_shards(L->l, ctx, t, item, coords);
}

/* ---------------------------------------------------------------- the gradient norm */

nb_val *nb_train__sharded_global_norm(nb_graph *g, const nb_tree *grads, const nb_train__layout *L) {
  nb_val *split = nb_scalar(g, NB_F32, 0), *whole = nb_scalar(g, NB_F32, 0);
  for (size_t i = 0; i < nb_tree_size(grads); i++) {
    nb_val *v = nb_convert(nb_tree_leaf(grads, i)->val, NB_F32);
    nb_val *sq = nb_reduce_sum(nb_mul(v, v), 0, NULL);
    if (nb_train__split_dim(L, "params", nb_tree_path(grads, i)) >= 0) split = nb_add(split, sq);
    else whole = nb_add(whole, sq);
  }
  return nb_sqrt(nb_add(nb_psum(split, L->axis), whole));
}

/* ---------------------------------------------------------------- the gather hook */

struct nb_train__gather {
  const nb_train__layout *L;
  struct {
    const nb_val *shard;
    nb_val *whole;
    char *path;
  } *seen;              /* gathers done, so that a parameter read twice in one graph (tied embeddings) is gathered once */
  size_t n, cap;
};

nb_train__gather *nb_train__gather_create(const nb_train__layout *L) {
  nb_train__gather *h = calloc(1, sizeof *h);
  if (h) h->L = L;
  return h;
}

void nb_train__gather_destroy(nb_train__gather *h) {
  for (size_t i = 0; h && i < h->n; i++) free(h->seen[i].path);
  if (h) free(h->seen);
  free(h);
}

/* The whole parameter of a block: all_gather over the axis along the split
 * dim (its transpose, psum_scatter, is the gradient's reduce-scatter), the
 * padding sliced off. The key is the block's value and the path: a remat
 * block's body reads its own input values, so its gathers are its own and
 * are redone in the backward pass. */
nb_val *nb_train__gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v) {
  nb_train__gather *h = ud;
  (void)a;
  int d = nb_train__split_dim(h->L, "params", path);
  if (d < 0) return v; /* whole on every process */
  for (size_t i = 0; i < h->n; i++)
    if (h->seen[i].shard == v && !strcmp(h->seen[i].path, path)) return h->seen[i].whole;
  char p[NB_TRAIN_PATH_MAX + 16];
  snprintf(p, sizeof p, "params/%s", path);
  nb_aval full = nb_dist_layout_whole(h->L->l, (size_t)nb_dist_layout_find(h->L->l, p));
  nb_val *w = nb_all_gather(v, h->L->axis, d, true);
  if (nb_val_dim(w, d) != full.shape.dims[d]) {
    int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK];
    memcpy(hi, full.shape.dims, sizeof hi);
    w = nb_slice(w, lo, hi, NULL);
  }
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 64;
    void *grown = realloc(h->seen, cap * sizeof *h->seen);
    if (!grown) return w; /* not remembered: a second read gathers again */
    h->seen = grown, h->cap = cap;
  }
  char *copy = strdup(path);
  if (copy) h->seen[h->n++] = (__typeof__(*h->seen)){v, w, copy};
  return w;
}

/* ---------------------------------------------------------------- printing */

nb_status nb_train_print_layout(nb_ctx *ctx, const nb_train_config *c, FILE *f) {
  nb_status s = nb_train_config_validate(ctx, c);
  nb_tree *params = s ? NULL : nb_model_param_spec(ctx, &c->model, NB_F32);
  nb_tree *ospec = params ? nb_train__opt_state_spec(ctx, c, params) : NULL;
  nb_train__layout L = {0};
  if (!s) s = ospec ? nb_train__layout_make(ctx, c, params, ospec, &L) : nb_ctx_status(ctx);
  if (!s) {
    const char *axis = L.axis;
    fprintf(f, "layout of %s over mesh data=%lld fsdp=%lld expert=%lld tensor=%lld: %s%s\n", c->preset,
            (long long)c->mesh.data, (long long)c->mesh.fsdp, (long long)c->mesh.expert, (long long)c->mesh.tensor,
            axis ? "the state split over " : "nothing split (mesh.fsdp, mesh.expert and mesh.tensor are 1)", axis ? axis : "");
    fprintf(f, "rules: %s (%d): first full match wins; no match: replicated\n", nb_dist_rules_label(L.rules),
            nb_dist_rules_count(L.rules));
    for (int i = 0; i < nb_dist_rules_count(L.rules); i++) {
      int n;
      char sp[160];
      nb_part_spec spec = nb_dist_rules_spec(L.rules, i, &n);
      fprintf(f, "  [%d] '%s' -> %s\n", i, nb_dist_rules_regex(L.rules, i), nb_dist_spec_str(n, spec, sp, sizeof sp));
    }
    if (L.axis && !strcmp(L.axis, "tensor"))
      fprintf(f, "tensor parallel: attention %s, MLP %s\n", L.tp_attn ? "split" : "replicated", L.tp_mlp ? "split" : "replicated");
    fprintf(f, "per leaf: its path, whole aval, spec, the rule that gave it -> one process's block\n");
    nb_dist_layout_print(L.l, L.rules, f);
  }
  nb_train__layout_free(&L);
  nb_tree_destroy(params);
  nb_tree_destroy(ospec);
  return s;
}
