/* FSDP (ZeRO-3) layout of the trainer's state: which rows of a leaf a
 * process holds, the shards of a host tree, and the parameter hook that
 * gathers a shard back into the whole parameter where a layer reads it.
 *
 * The rule: every leaf of rank >= 1 is split along its leading dim into
 * `fsdp` blocks of n = ceil(dim0 / fsdp) rows; process r holds rows
 * [r n, (r+1) n), the part past dim0 zeros (padding). Leaves of rank 0 are
 * whole on every process. The same rule serves params and optimizer state,
 * whose moments have the params' shapes: a shard of the state is the state
 * of the shard. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"

int64_t nb_train__fsdp_rows(int64_t dim0, int64_t fsdp) { return (dim0 + fsdp - 1) / fsdp; }

nb_aval nb_train__fsdp_shard_aval(nb_aval full, int64_t fsdp) {
  if (full.shape.rank > 0) full.shape.dims[0] = nb_train__fsdp_rows(full.shape.dims[0], fsdp);
  return full;
}

nb_tree *nb_train__fsdp_shard_spec(nb_ctx *ctx, const nb_tree *full, int64_t fsdp) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && full && i < nb_tree_size(full); i++) {
    nb_aval a = nb_train__fsdp_shard_aval(nb_leaf_get_aval(nb_tree_leaf(full, i)), fsdp);
    if (nb_tree_set(out, nb_tree_path(full, i), nb_leaf_aval(a))) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

nb_array *nb_train__rows_of(nb_ctx *ctx, const nb_array *a, int64_t lo, int64_t n) {
  int rank = nb_array_rank(a);
  int64_t dims[NB_MAX_RANK];
  memcpy(dims, nb_array_dims(a), sizeof(int64_t) * (size_t)rank);
  size_t row = nb_array_nbytes(a) / (size_t)(dims[0] ? dims[0] : 1);
  int64_t have = dims[0] - lo < 0 ? 0 : dims[0] - lo < n ? dims[0] - lo : n;
  dims[0] = n;
  nb_array *s = nb_array_empty(ctx, nb_array_dtype(a), rank, dims);
  if (!s) return NULL;
  char *dst = nb_array_data_mut(s);
  if (have > 0) memcpy(dst, (const char *)nb_array_data(a) + (size_t)lo * row, (size_t)have * row);
  memset(dst + (size_t)have * row, 0, (size_t)(n - have) * row);
  return s;
}

nb_tree *nb_train__fsdp_shard(nb_ctx *ctx, const nb_tree *full, int64_t fsdp, int64_t r) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(full); i++) {
    const nb_array *a = nb_tree_leaf(full, i)->array;
    nb_status s;
    if (!a) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "train fsdp: '%s' is not a host array", nb_tree_path(full, i));
    } else if (nb_array_rank(a) == 0) {
      s = nb_tree_set_array(out, nb_tree_path(full, i), (nb_array *)a);
    } else {
      int64_t n = nb_train__fsdp_rows(nb_array_dims(a)[0], fsdp);
      nb_array *sh = nb_train__rows_of(ctx, a, r * n, n);
      s = sh ? nb_tree_set_array(out, nb_tree_path(full, i), sh) : nb_ctx_status(ctx);
      nb_array_release(sh);
    }
    if (s) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

/* ---------------------------------------------------------------- the gather hook */

struct nb_train__fsdp_gather {
  const nb_tree *full;  /* the whole parameters' avals, by path */
  struct {
    const nb_val *shard;
    nb_val *whole;
    char *path;
  } *seen;              /* gathers done, so that a parameter read twice in one graph (tied embeddings) is gathered once */
  size_t n, cap;
};

nb_train__fsdp_gather *nb_train__fsdp_gather_create(const nb_tree *full_spec) {
  nb_train__fsdp_gather *h = calloc(1, sizeof *h);
  if (h) h->full = full_spec;
  return h;
}

void nb_train__fsdp_gather_destroy(nb_train__fsdp_gather *h) {
  for (size_t i = 0; h && i < h->n; i++) free(h->seen[i].path);
  if (h) free(h->seen);
  free(h);
}

/* The whole parameter of a shard: all_gather over "fsdp" (its transpose,
 * psum_scatter, is the gradient's reduce-scatter), the padding sliced off.
 * The key is the shard value and the path: a remat block's body reads its
 * own input values, so its gathers are its own and are redone in the
 * backward pass. */
nb_val *nb_train__fsdp_gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v) {
  nb_train__fsdp_gather *h = ud;
  (void)a;
  const nb_leaf *l = nb_tree_get(h->full, path);
  if (!l || nb_val_rank(v) == 0) return v; /* not a sharded parameter */
  for (size_t i = 0; i < h->n; i++)
    if (h->seen[i].shard == v && !strcmp(h->seen[i].path, path)) return h->seen[i].whole;
  nb_aval full = nb_leaf_get_aval(l);
  nb_val *w = nb_all_gather(v, "fsdp", 0, true);
  if (nb_val_dim(w, 0) != full.shape.dims[0]) {
    int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK];
    memcpy(hi, full.shape.dims, sizeof hi);
    w = nb_slice(w, lo, hi, NULL);
  }
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 64;
    void *p = realloc(h->seen, cap * sizeof *h->seen);
    if (!p) return w; /* not remembered: a second read gathers again */
    h->seen = p, h->cap = cap;
  }
  char *copy = strdup(path);
  if (copy) h->seen[h->n++] = (__typeof__(*h->seen)){v, w, copy};
  return w;
}
