/* Tensor parallelism (Megatron-style) of the trainer's model over the mesh
 * axis "tensor": which parameters are split and along which dim, the
 * per-process model config, the shards of a host tree, and the linear hook
 * that puts the collectives around the split linears.
 *
 * The layout, for T = mesh.tensor processes (process r):
 *  - column-parallel: attn wq, wk, wv and mlp wi, wi_0, wi_1. Their kernels
 *    [d_in, d_out] and biases [d_out] are split along d_out: process r holds
 *    columns [r d_out/T, (r+1) d_out/T). For q, k, v those are whole heads
 *    (heads r H/T .. and kv heads r Hkv/T ..: the query heads of a kv head
 *    stay with it), for the MLP a slice of d_ff.
 *  - row-parallel: attn wo and mlp wo. Kernels [d_in, d_out] split along
 *    d_in (the rows that meet the column-parallel outputs); the bias whole.
 *  - everything else (embeddings, norms, the LM head) whole on every
 *    process.
 * So each process runs the model of heads/T, kv_heads/T and d_ff/T (its
 * own config, nb_train__tp_model) on its shards, and the hook adds
 * Megatron's two collectives, in shard_map's terms:
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

int nb_train__tp_dim(const char *path, int rank) {
  const char *leaf = strrchr(path, '/');
  if (!leaf || rank < 1) return -1;
  bool kernel = !strcmp(leaf, "/kernel"), bias = !strcmp(leaf, "/bias");
  if (!kernel && !bias) return -1;
  char module[NB_TRAIN_PATH_MAX];
  snprintf(module, sizeof module, "%.*s", (int)(leaf - path), path);
  switch (linear_kind(module)) {
  case TP_COLUMN: return rank - 1;           /* d_out: kernel dim 1, bias dim 0 */
  case TP_ROW: return kernel ? 0 : -1;       /* d_in; the bias is added once, whole */
  default: return -1;
  }
}

nb_model_config nb_train__tp_model(const nb_model_config *c, int64_t T) {
  nb_model_config m = *c;
  m.head_dim = nb_model_head_dim(c);
  m.n_heads = c->n_heads / T;
  m.n_kv_heads = c->n_kv_heads / T;
  m.d_ff = c->d_ff / T;
  return m;
}

nb_status nb_train__tp_check(nb_ctx *ctx, const nb_train_config *c) {
  int64_t T = c->mesh.tensor;
  const nb_model_config *m = &c->model;
  if (T == 1) return NB_OK;
  if (m->n_heads % T || m->n_kv_heads % T || m->d_ff % T)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "mesh.tensor=%lld must divide model.n_heads (%lld), model.n_kv_heads (%lld) and model.d_ff (%lld): "
                     "each process holds whole heads and an equal slice of the MLP",
                     (long long)T, (long long)m->n_heads, (long long)m->n_kv_heads, (long long)m->d_ff);
  const char *what = c->mesh.fsdp > 1     ? "mesh.fsdp > 1"
                     : m->n_experts > 0   ? "a mixture of experts (model.n_experts > 0)"
                     : m->attn_dropout > 0 ? "model.attn_dropout > 0 (each process would draw its heads' masks alike)"
                                           : NULL;
  if (what)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.tensor=%lld with %s is not supported yet", (long long)T, what);
  return NB_OK;
}

nb_tree *nb_train__tp_shard_spec(nb_ctx *ctx, const nb_tree *full, int64_t T) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && full && i < nb_tree_size(full); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(full, i));
    int d = nb_train__tp_dim(nb_tree_path(full, i), a.shape.rank);
    if (d >= 0) a.shape.dims[d] /= T;
    if (nb_tree_set(out, nb_tree_path(full, i), nb_leaf_aval(a))) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

/* Block r of T of a along dim d, as a new array. */
static nb_array *block_of(nb_ctx *ctx, const nb_array *a, int d, int64_t T, int64_t r) {
  int rank = nb_array_rank(a);
  int64_t dims[NB_MAX_RANK];
  memcpy(dims, nb_array_dims(a), sizeof(int64_t) * (size_t)rank);
  size_t outer = 1, inner = nb_dtype_size(nb_array_dtype(a));
  for (int i = 0; i < d; i++) outer *= (size_t)dims[i];
  for (int i = d + 1; i < rank; i++) inner *= (size_t)dims[i];
  size_t whole = (size_t)dims[d] * inner, part = whole / (size_t)T;
  dims[d] /= T;
  nb_array *s = nb_array_empty(ctx, nb_array_dtype(a), rank, dims);
  if (!s) return NULL;
  const char *src = (const char *)nb_array_data(a) + (size_t)r * part;
  char *dst = nb_array_data_mut(s);
  for (size_t o = 0; o < outer; o++) memcpy(dst + o * part, src + o * whole, part);
  return s;
}

nb_tree *nb_train__tp_shard(nb_ctx *ctx, const nb_tree *full, int64_t T, int64_t r) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(full); i++) {
    const char *p = nb_tree_path(full, i);
    const nb_array *a = nb_tree_leaf(full, i)->array;
    int d = a ? nb_train__tp_dim(p, nb_array_rank(a)) : -1;
    nb_status s;
    if (!a) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "train tensor parallel: '%s' is not a host array", p);
    } else if (d < 0) {
      s = nb_tree_set_array(out, p, (nb_array *)a);
    } else if (nb_array_dims(a)[d] % T) {
      s = nb_errorf(ctx, NB_ERR_SHAPE, "train tensor parallel: dim %d of '%s' (%lld) is not a multiple of mesh.tensor=%lld",
                    d, p, (long long)nb_array_dims(a)[d], (long long)T);
    } else {
      nb_array *b = block_of(ctx, a, d, T, r);
      s = b ? nb_tree_set_array(out, p, b) : nb_ctx_status(ctx);
      nb_array_release(b);
    }
    if (s) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

bool nb_train__tp_sharded(const char *path, int rank) { return nb_train__tp_dim(path, rank) >= 0; }

/* ---------------------------------------------------------------- the hook */

/* The last pbroadcast made, so that the linears reading one input (q, k and
 * v; wi_0 and wi_1) share it: one psum of the input's cotangent per
 * attention and per MLP, as Megatron's "f". The key holds the module's
 * parent path, so an entry of a graph since destroyed (a remat body) whose
 * value's address comes back in the next block's body never matches. */
struct nb_train__tp_hook {
  nb_graph *g;
  nb_val *x, *fx;
  char parent[NB_TRAIN_PATH_MAX];
};

nb_train__tp_hook *nb_train__tp_hook_create(void) { return calloc(1, sizeof(nb_train__tp_hook)); }
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
  int kind = stacked ? TP_NONE : linear_kind(path);
  if (kind == TP_COLUMN) return nb_nn_linear_default(a, path, f_of(h, a, path, x), false);
  if (kind == TP_NONE) return nb_nn_linear_default(a, path, x, stacked);
  /* row-parallel: x [..., d_in/T] against the kernel's rows [d_in/T, d_out], summed over the processes, then the bias */
  char pk[NB_NN_PATH_MAX], pb[NB_NN_PATH_MAX];
  if (!nb_nn_join(pk, path, "kernel") || !nb_nn_join(pb, path, "bias"))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "train tensor parallel: path '%s' too long", path);
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
