/* Expert parallel layout of the trainer's state (mesh.expert): which leaves
 * are split, the shards of a host tree, the rules of the config, the
 * gradient norm over shards, and the parameter hook eval uses to gather the
 * experts back. The token exchange itself is nb_nn_moe's (nb_nn_apply's
 * expert_axis); docs/dist.md has the whole design.
 *
 * The rule: the routed experts' stacked leaves ("/moe/experts/" in the
 * path: kernels [E, d_in, d_out], and Adam's moments of them) are split
 * along dim 0 into mesh.expert blocks of E / mesh.expert rows; process i of
 * the axis "expert" holds experts [i E/E_p, (i+1) E/E_p). Every other leaf
 * (attention, router, shared experts, norms, embeddings, Adam's count) is
 * whole on every process. E is a multiple of E_p, so there is no padding. */
#include <string.h>

#include "train/internal.h"

bool nb_train__ep_is_expert(const char *path) { return strstr(path, "/moe/experts/") != NULL; }

nb_status nb_train__ep_validate(nb_ctx *ctx, const nb_train_config *c) {
  int64_t ep = c->mesh.expert, E = c->model.n_experts;
  if (ep == 1) return NB_OK;
  if (E < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "mesh.expert (%lld) needs a mixture-of-experts model: model.n_experts is 0",
                     (long long)ep);
  if (E % ep)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model.n_experts (%lld) must be a multiple of mesh.expert (%lld): each "
                     "process holds n_experts / mesh.expert of them", (long long)E, (long long)ep);
  if (c->model.capacity_factor <= 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "mesh.expert (%lld) needs model.capacity_factor > 0 (it is %g: dropless "
                     "routing is not split over processes); model.capacity_factor=%g (n_experts / top_k) drops no "
                     "token", (long long)ep, c->model.capacity_factor, (double)E / (double)(c->model.top_k ? c->model.top_k : 1));
  if (c->mesh.fsdp > 1)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.expert (%lld) with mesh.fsdp (%lld) is not supported yet: use "
                     "mesh.data x mesh.expert", (long long)ep, (long long)c->mesh.fsdp);
  return NB_OK;
}

static nb_tree *ep_shard_spec(nb_ctx *ctx, const nb_tree *full, int64_t ep) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && full && i < nb_tree_size(full); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(full, i));
    if (nb_train__ep_is_expert(nb_tree_path(full, i)) && a.shape.rank > 0) a.shape.dims[0] /= ep;
    if (nb_tree_set(out, nb_tree_path(full, i), nb_leaf_aval(a))) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

static nb_tree *ep_shard(nb_ctx *ctx, const nb_tree *full, int64_t ep, int64_t e) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; out && i < nb_tree_size(full); i++) {
    const char *p = nb_tree_path(full, i);
    const nb_array *a = nb_tree_leaf(full, i)->array;
    nb_status s;
    if (!a) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "train expert parallel: '%s' is not a host array", p);
    } else if (!nb_train__ep_is_expert(p) || nb_array_rank(a) == 0) {
      s = nb_tree_set_array(out, p, (nb_array *)a);
    } else {
      int64_t n = nb_array_dims(a)[0] / ep;
      nb_array *sh = nb_train__rows_of(ctx, a, e * n, n);
      s = sh ? nb_tree_set_array(out, p, sh) : nb_ctx_status(ctx);
      nb_array_release(sh);
    }
    if (s) out = (nb_tree_destroy(out), NULL);
  }
  return out;
}

nb_tree *nb_train__shard_spec(nb_ctx *ctx, const nb_train_config *c, const nb_tree *full) {
  if (c->mesh.expert > 1) return ep_shard_spec(ctx, full, c->mesh.expert);
  if (c->mesh.tensor > 1) return nb_train__tp_shard_spec(ctx, full, c->mesh.tensor);
  return nb_train__fsdp_shard_spec(ctx, full, c->mesh.fsdp); /* fsdp 1: the same avals */
}

nb_tree *nb_train__shard(nb_ctx *ctx, const nb_train_config *c, const nb_tree *full, int64_t index) {
  if (c->mesh.expert > 1) return ep_shard(ctx, full, c->mesh.expert, index);
  if (c->mesh.tensor > 1) return nb_train__tp_shard(ctx, full, c->mesh.tensor, index);
  return nb_train__fsdp_shard(ctx, full, c->mesh.fsdp, index);
}

nb_val *nb_train__sharded_global_norm(nb_graph *g, const nb_tree *grads, const char *axis,
                                      bool (*sharded)(const char *path, nb_val *v)) {
  nb_val *split = nb_scalar(g, NB_F32, 0), *whole = nb_scalar(g, NB_F32, 0);
  for (size_t i = 0; i < nb_tree_size(grads); i++) {
    nb_val *v = nb_convert(nb_tree_leaf(grads, i)->val, NB_F32);
    nb_val *sq = nb_reduce_sum(nb_mul(v, v), 0, NULL);
    if (sharded(nb_tree_path(grads, i), v)) split = nb_add(split, sq);
    else whole = nb_add(whole, sq);
  }
  return nb_sqrt(nb_add(nb_psum(split, axis), whole));
}

nb_val *nb_train__ep_gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v) {
  (void)ud, (void)a;
  return nb_train__ep_is_expert(path) && nb_val_rank(v) > 0 ? nb_all_gather(v, "expert", 0, true) : v;
}
