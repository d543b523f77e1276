/* Tensor parallelism (Megatron-style) of the trainer's model over the mesh
 * axis "tensor": what the sharding rules may split over it, the
 * per-process model config, and the linear hook that puts the collectives
 * around the split linears.
 *
 * The layout (the built-in rules; docs/dist.md writes them out), for T =
 * mesh.tensor processes (process r):
 *  - column-parallel: attn wq, wk, wv and mlp wi, wi_0, wi_1. Their kernels
 *    [d_in, d_out] and biases [d_out] are split along d_out: process r holds
 *    columns [r d_out/T, (r+1) d_out/T). For q, k, v those are whole heads
 *    (heads r H/T .. and kv heads r Hkv/T ..: the query heads of a kv head
 *    stay with it), for the MLP a slice of d_ff.
 *  - row-parallel: attn wo and mlp wo. Kernels [d_in, d_out] split along
 *    d_in (the rows that meet the column-parallel outputs); the bias whole.
 *  - everything else (embeddings, norms, the LM head) whole on every
 *    process.
 * Rules may leave the attention or the MLP whole (in every layer): then it
 * runs replicated, as on one process. So each process runs the model of
 * heads/T, kv_heads/T (a split attention) and d_ff/T (a split MLP) on its
 * shards (nb_train__tp_model), and the hook adds Megatron's two
 * collectives, in shard_map's terms, where the kernel's spec says so:
 *  - "f": the replicated input of a column-parallel linear goes through
 *    pbroadcast (identity; its transpose psums the input's cotangent),
 *  - "g": a row-parallel linear's output is psum'ed (its transpose is the
 *    identity), then its bias added, once.
 * Everything outside the split linears is replicated and computed alike on
 * every process, so the replicated parameters get the same gradient bits on
 * every process without an all-reduce, and the loss is the same on all. */
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"

/* ---------------------------------------------------------------- the layout */

enum { TP_NONE, TP_COLUMN, TP_ROW };

/* The kind of the linear at module path `path` ("layers/3/attn/wq"). */
static int linear_kind(const char *path) {
  static const char *const column[] = {"attn/wq", "attn/wk", "attn/wv", "mlp/wi", "mlp/wi_0", "mlp/wi_1"};
  static const char *const row[] = {"attn/wo", "mlp/wo"};
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof column / sizeof *column; i++) {
    size_t k = strlen(column[i]);
    if (n > k && path[n - k - 1] == '/' && !strcmp(path + n - k, column[i])) return TP_COLUMN;
  }
  for (size_t i = 0; i < sizeof row / sizeof *row; i++) {
    size_t k = strlen(row[i]);
    if (n > k && path[n - k - 1] == '/' && !strcmp(path + n - k, row[i])) return TP_ROW;
  }
  return TP_NONE;
}

nb_model_config nb_train__tp_model(const nb_model_config *c, int64_t T, bool attn, bool mlp) {
  nb_model_config m = *c;
  m.head_dim = nb_model_head_dim(c);
  if (attn) m.n_heads = c->n_heads / T, m.n_kv_heads = c->n_kv_heads / T;
  if (mlp) m.d_ff = c->d_ff / T;
  return m;
}

nb_status nb_train__tp_check(nb_ctx *ctx, const nb_train_config *c) {
  int64_t T = c->mesh.tensor;
  if (T == 1) return NB_OK;
  const char *what = c->mesh.fsdp > 1 ? "mesh.fsdp > 1" : c->model.n_experts > 0 ? "a mixture of experts (model.n_experts > 0)" : NULL;
  if (what)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.tensor=%lld with %s is not supported yet", (long long)T, what);
  return NB_OK;
}

/* A parameter leaf as the rules split it: its path, the rule that matched (-1: none), the dim split over tensor (-1: none). */
typedef struct tp_leaf {
  const char *path;
  int rule, dim;
} tp_leaf;

static nb_status tp_refuse(nb_ctx *ctx, const nb_dist_rules *r, const tp_leaf *l, const char *why) {
  char rule[96];
  if (l->rule >= 0) snprintf(rule, sizeof rule, "%s[%d]", nb_dist_rules_label(r), l->rule);
  else snprintf(rule, sizeof rule, "no rule of %s", nb_dist_rules_label(r));
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.tensor: '%s' (%s): %s", l->path, rule, why);
}

nb_status nb_train__tp_check_rules(nb_ctx *ctx, const nb_train_config *c, const nb_dist_rules *r, const nb_tree *params,
                                   bool *attn, bool *mlp) {
  tp_leaf split[2] = {{NULL}, {NULL}}, whole[2] = {{NULL}, {NULL}}; /* the first of each, per group */
  for (size_t i = 0; params && i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i), *leaf = strrchr(p, '/');
    int rank = nb_leaf_get_aval(nb_tree_leaf(params, i)).shape.rank, n;
    tp_leaf l = {p, nb_dist_rules_match(r, p), -1};
    nb_part_spec sp = nb_dist_rules_spec(r, l.rule, &n);
    if (n > rank) continue; /* the layout refuses it, naming the rank */
    for (int d = 0; d < n; d++)
      if (sp[d] && !strcmp(sp[d], "tensor")) l.dim = d;
    bool kernel = leaf && !strcmp(leaf, "/kernel"), bias = leaf && !strcmp(leaf, "/bias");
    char module[NB_TRAIN_PATH_MAX];
    snprintf(module, sizeof module, "%.*s", leaf ? (int)(leaf - p) : 0, p);
    int kind = kernel || bias ? linear_kind(module) : TP_NONE, group = strstr(module, "/attn/") || !strncmp(module, "attn/", 5) ? 0 : 1;
    if (kind == TP_NONE) {
      if (l.dim >= 0)
        return tp_refuse(ctx, r, &l, "split over tensor, but tensor parallelism splits only the attention's and the MLP's "
                         "linears (attn/wq, wk, wv, wo; mlp/wi, wi_0, wi_1, wo): keep it whole");
      continue;
    }
    if (kind == TP_ROW && bias) {
      if (l.dim >= 0) return tp_refuse(ctx, r, &l, "a row-parallel linear's bias is added once after the psum: keep it whole");
      continue;
    }
    int want = kind == TP_COLUMN ? rank - 1 : 0; /* column: d_out (a kernel's dim 1, a bias's 0); row: d_in */
    if (l.dim >= 0 && (l.dim != want || (kernel && rank != 2)))
      return tp_refuse(ctx, r, &l, kind == TP_COLUMN ? "a column-parallel linear is split along d_out (the kernel's dim 1: "
                                                       "[null, tensor]; its bias: [tensor]) or not at all"
                                                     : "a row-parallel kernel is split along d_in (dim 0: [tensor]) or not at all");
    tp_leaf *first = l.dim >= 0 ? &split[group] : &whole[group];
    if (!first->path) *first = l;
  }
  for (int g = 0; g < 2; g++)
    if (split[g].path && whole[g].path) {
      char why[NB_TRAIN_PATH_MAX + 256];
      snprintf(why, sizeof why, "split over tensor, but '%s' is whole: tensor parallelism splits %s in every layer or in none",
               whole[g].path, g == 0 ? "the attention (wq, wk, wv by columns, wo by rows)" : "the MLP (wi, wi_0, wi_1 by columns, wo by rows)");
      return tp_refuse(ctx, r, &split[g], why);
    }
  *attn = split[0].path != NULL, *mlp = split[1].path != NULL;
  int64_t T = c->mesh.tensor;
  const nb_model_config *m = &c->model;
  bool heads = *attn && (m->n_heads % T || m->n_kv_heads % T), ff = *mlp && m->d_ff % T;
  if (heads && *mlp)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "mesh.tensor=%lld must divide model.n_heads (%lld), model.n_kv_heads (%lld) and model.d_ff (%lld): "
                     "each process holds whole heads and an equal slice of the MLP",
                     (long long)T, (long long)m->n_heads, (long long)m->n_kv_heads, (long long)m->d_ff);
  if (heads)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "mesh.tensor=%lld must divide model.n_heads (%lld) and model.n_kv_heads (%lld): "
                     "each process holds whole heads (the rules split the attention)", (long long)T, (long long)m->n_heads,
                     (long long)m->n_kv_heads);
  if (ff)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "mesh.tensor=%lld must divide model.d_ff (%lld): each process holds an equal "
                     "slice of the MLP (the rules split it)", (long long)T, (long long)m->d_ff);
  if (*attn && m->attn_dropout > 0)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.tensor=%lld with model.attn_dropout > 0 and the attention split is not "
                     "supported yet (each process would draw its heads' masks alike)", (long long)T);
  return NB_OK;
}

/* ---------------------------------------------------------------- the hook */

/* The last pbroadcast made, so that the linears reading one input (q, k and
 * v; wi_0 and wi_1) share it: one psum of the input's cotangent per
 * attention and per MLP, as Megatron's "f". The key holds the module's
 * parent path, so an entry of a graph since destroyed (a remat body) whose
 * value's address comes back in the next block's body never matches. */
struct nb_train__tp_hook {
  const nb_train__layout *L;
  nb_graph *g;
  nb_val *x, *fx;
  char parent[NB_TRAIN_PATH_MAX];
};

nb_train__tp_hook *nb_train__tp_hook_create(const nb_train__layout *L) {
  nb_train__tp_hook *h = calloc(1, sizeof(nb_train__tp_hook));
  if (h) h->L = L;
  return h;
}
void nb_train__tp_hook_destroy(nb_train__tp_hook *h) { free(h); }

static nb_val *f_of(nb_train__tp_hook *h, nb_nn_apply *a, const char *path, nb_val *x) {
  const char *slash = strrchr(path, '/');
  int plen = slash ? (int)(slash - path) : 0;
  if (h->g == a->g && h->x == x && (int)strlen(h->parent) == plen && !strncmp(h->parent, path, (size_t)plen)) return h->fx;
  h->g = a->g, h->x = x, h->fx = nb_pbroadcast(x, "tensor");
  snprintf(h->parent, sizeof h->parent, "%.*s", plen, path);
  return h->fx;
}

nb_val *nb_train__tp_linear(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  nb_train__tp_hook *h = ud;
  char pk[NB_NN_PATH_MAX], pb[NB_NN_PATH_MAX];
  if (!nb_nn_join(pk, path, "kernel") || !nb_nn_join(pb, path, "bias"))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "train tensor parallel: path '%s' too long", path);
  /* the kernel's split: d_out (dim 1) column-parallel, d_in (dim 0) row-parallel, none: whole */
  int d = stacked ? -1 : nb_train__split_dim(h->L, "params", pk);
  if (d == 1) return nb_nn_linear_default(a, path, f_of(h, a, path, x), false);
  if (d != 0) return nb_nn_linear_default(a, path, x, stacked);
  /* row-parallel: x [..., d_in/T] against the kernel's rows [d_in/T, d_out], summed over the processes, then the bias */
  nb_val *w = nb_nn_param(a, pk);
  if (nb_graph_status(a->g)) return w;
  if (nb_val_rank(w) != 2 || nb_val_dim(x, -1) != nb_val_dim(w, 0))
    return nb_nn_fail(a, NB_ERR_SHAPE, "train tensor parallel: row-parallel '%s': input width %lld, kernel rows %lld", path,
                      (long long)nb_val_dim(x, -1), (long long)nb_val_dim(w, 0));
  if (nb_val_dtype(x) != nb_val_dtype(w)) x = nb_convert(x, nb_val_dtype(w));
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(x) - 1}, .rhs_contract = {0}};
  nb_val *y = nb_psum(nb_dot_general(x, w, &dn, NB_DTYPE_COUNT), "tensor");
  nb_val *b = nb_nn_param_opt(a, pb);
  return b ? nb_add(y, b) : y;
}
