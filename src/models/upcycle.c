/* Sparse upcycling: an MoE model's parameters from a dense model's. Every
 * expert of an MoE layer starts as a copy of that layer's dense MLP and the
 * router is small and random, so with renormalized top-k gates the
 * upcycled model computes exactly what the dense one did. */
#include <string.h>

#include "nabla/models.h"

static bool same_trunk(const nb_model_config *d, const nb_model_config *m) {
  return d->family == m->family && d->vocab_size == m->vocab_size && d->d_model == m->d_model &&
         d->n_layers == m->n_layers && d->n_heads == m->n_heads && d->n_kv_heads == m->n_kv_heads &&
         nb_model_head_dim(d) == nb_model_head_dim(m) && d->norm == m->norm && d->act == m->act &&
         d->gated_mlp == m->gated_mlp && d->bias == m->bias && d->qkv_bias == m->qkv_bias && d->learned_pos == m->learned_pos &&
         d->rope == m->rope && d->tie_embeddings == m->tie_embeddings && d->max_seq_len == m->max_seq_len;
}

/* E copies of a [a, b] kernel as [E, a, b] (new reference) */
static nb_array *stack_copies(nb_ctx *ctx, nb_array *k, int64_t e) {
  const int64_t *d = nb_array_dims(k);
  int64_t dims[3] = {e, d[0], d[1]};
  nb_array *out = nb_array_empty(ctx, nb_array_dtype(k), 3, dims);
  if (!out) return NULL;
  size_t n = nb_array_nbytes(k);
  for (int64_t i = 0; i < e; i++) memcpy((char *)nb_array_data_mut(out) + (size_t)i * n, nb_array_data(k), n);
  return out;
}

/* the value of MoE leaf `path` (layer l's experts or a dense-model copy) */
static nb_status fill_leaf(nb_ctx *ctx, const nb_model_config *moe, const nb_tree *dense_params, nb_nn_init *rin,
                           const char *path, nb_tree *out) {
  long long l;
  int at = 0;
  char rest[NB_NN_PATH_MAX];
  if (sscanf(path, "layers/%lld/moe/%n", &l, &at) == 1 && at > 0) {
    snprintf(rest, sizeof rest, "%s", path + at);
    if (!strcmp(rest, "router/kernel")) {
      const nb_leaf *spec = nb_tree_get(out, path);
      nb_aval av = nb_leaf_get_aval(spec);
      return nb_nn_init_normal(rin, path, av.shape.rank, av.shape.dims, moe->router_init_std);
    }
    char name[64], src[NB_NN_PATH_MAX];
    if (sscanf(rest, "experts/%63[^/]/kernel", name) != 1)
      return nb_errorf(ctx, NB_ERR_INTERNAL, "upcycle: unexpected MoE parameter '%s'", path);
    snprintf(src, sizeof src, "layers/%lld/mlp/%s/kernel", l, name);
    nb_array *k = nb_tree_get_array(dense_params, src);
    if (!k || nb_array_rank(k) != 2)
      return nb_errorf(ctx, NB_ERR_NOT_FOUND, "upcycle: the dense parameters lack '%s' (a [d_in, d_out] kernel)", src);
    nb_array *st = stack_copies(ctx, k, moe->n_experts);
    nb_status s = st ? nb_tree_set_array(out, path, st) : NB_ERR_NOMEM;
    nb_array_release(st);
    return s;
  }
  nb_array *a = nb_tree_get_array(dense_params, path);
  if (!a) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "upcycle: the dense parameters lack '%s'", path);
  nb_aval want = nb_leaf_get_aval(nb_tree_get(out, path)), have = nb_array_aval(a);
  if (!nb_shape_equal(&want.shape, &have.shape)) {
    char s1[96], s2[96];
    return nb_errorf(ctx, NB_ERR_SHAPE, "upcycle: dense parameter '%s' is %s, the MoE model wants %s", path,
                     nb_aval_str(&have, s1, sizeof s1), nb_aval_str(&want, s2, sizeof s2));
  }
  return nb_tree_set_array(out, path, a);
}

nb_tree *nb_model_upcycle(nb_ctx *ctx, const nb_model_config *dense, const nb_tree *dense_params,
                          const nb_model_config *moe, nb_array *key) {
  if (!dense || !dense_params || !moe || !key) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "upcycle: NULL argument"), NULL;
  if (nb_model_config_validate(ctx, dense) || nb_model_config_validate(ctx, moe)) return NULL;
  if (dense->n_experts != 0 || moe->n_experts < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "upcycle: needs a dense model (n_experts 0) and an MoE one (n_experts >= 1)"), NULL;
  if (!same_trunk(dense, moe) || moe->moe_d_ff != dense->d_ff)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "upcycle: the MoE config must match the dense one except for its MoE keys, with model.moe_d_ff "
                     "(%lld) = the dense model.d_ff (%lld)",
                     (long long)moe->moe_d_ff, (long long)dense->d_ff),
           NULL;
  if (moe->n_shared_experts > 0)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "upcycle: shared experts (model.n_shared_experts > 0) are not supported"),
           NULL;
  if (dense->bias)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "upcycle: dense MLPs with biases (model.bias) cannot become experts (no biases)"),
           NULL;
  nb_dtype t = nb_tree_size(dense_params) ? nb_leaf_get_aval(nb_tree_leaf(dense_params, 0)).dtype : NB_F32;
  nb_tree *out = nb_model_param_spec(ctx, moe, t); /* the MoE paths in init order */
  if (!out) return NULL;
  nb_nn_init rin = {.ctx = ctx, .params = out, .key = key, .dtype = t};
  for (size_t i = 0; i < nb_tree_size(out); i++) {
    char path[NB_NN_PATH_MAX];
    snprintf(path, sizeof path, "%s", nb_tree_path(out, i));
    if (fill_leaf(ctx, moe, dense_params, &rin, path, out)) {
      nb_tree_destroy(out);
      return NULL;
    }
  }
  return out;
}
