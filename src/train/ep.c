/* Expert parallel (mesh.expert): the config's rules and what a layout
 * must be for the MoE layers. The token exchange itself is nb_nn_moe's
 * (nb_nn_apply's expert_axis); docs/dist.md has the whole design.
 *
 * The layout (the built-in rule: paths with /moe/experts/ -> [expert]; the
 * only one the layers run): the routed experts' stacked leaves ("/moe/experts/"
 * in the path: kernels [E, d_in, d_out], and Adam's moments of them) split
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

/* "[expert]" or "[expert, null, ...]": dim 0 split over expert and no other split dim. */
static bool rows_over_expert(int n, nb_part_spec sp) {
  if (n < 1 || !sp[0] || strcmp(sp[0], "expert")) return false;
  for (int d = 1; d < n; d++)
    if (sp[d]) return false;
  return true;
}

nb_status nb_train__ep_check_rules(nb_ctx *ctx, const nb_dist_rules *r, const nb_tree *params) {
  for (size_t i = 0; params && i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i);
    int k = nb_dist_rules_match(r, p), n;
    nb_part_spec sp = nb_dist_rules_spec(r, k, &n);
    if (n > nb_leaf_get_aval(nb_tree_leaf(params, i)).shape.rank) continue; /* the layout refuses it, naming the rank */
    char spec[160], rule[96];
    nb_dist_spec_str(n, sp, spec, sizeof spec);
    if (k >= 0) snprintf(rule, sizeof rule, "%s[%d]", nb_dist_rules_label(r), k);
    else snprintf(rule, sizeof rule, "no rule of %s", nb_dist_rules_label(r));
    bool over = false;
    for (int d = 0; d < n; d++) over |= sp[d] && !strcmp(sp[d], "expert");
    if (nb_train__ep_is_expert(p) && !rows_over_expert(n, sp))
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.expert: '%s' is a routed experts' leaf and gets %s (%s): the MoE "
                       "layer holds its experts' rows, so it must be split along dim 0 over expert: [expert]", p, spec, rule);
    if (!nb_train__ep_is_expert(p) && over)
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "mesh.expert: %s splits '%s' over expert (%s): only the routed experts' "
                       "leaves (.../moe/experts/...) are split over expert; use fsdp to split others", rule, p, spec);
  }
  return NB_OK;
}
