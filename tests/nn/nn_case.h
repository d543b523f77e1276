/* Shared by the nn tests: one traced function that applies a module chosen
 * by a case struct to inputs {"params/...", "x", ...}, so values, masks and
 * finite-difference gradient checks all run the same code. */
#ifndef NABLA_TEST_NN_CASE_H
#define NABLA_TEST_NN_CASE_H

#include "primcheck.h"

enum { M_LINEAR, M_LAYERNORM, M_RMSNORM, M_MLP, M_ATTN, M_MOE, M_BLOCK, M_CE, M_EMBED, M_SOFTMAX };

typedef struct nn_case {
  int kind;
  const void *cfg;
  nb_dtype dtype;      /* compute dtype of the apply context */
  bool use_cache;      /* attention: inputs cache_k, cache_v, cache_pos */
  bool aux_out;        /* moe: also output the aux values */
  nb_nn_linear_hook hook;
  void *hook_ud;
  bool train;          /* with input "rng" */
  const char *expert_axis; /* moe: nb_nn_apply.expert_axis */
} nn_case;

static nb_status nn_case_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const nn_case *c = u;
  nb_tree *p = nb_tree_select_prefix(in, "params", true);
  nb_nn_apply a = {.g = g, .params = p, .dtype = c->dtype, .linear_hook = c->hook, .hook_ud = c->hook_ud,
                   .train = c->train, .rng = nb_tree_get_val(in, "rng"), .expert_axis = c->expert_axis};
  nb_val *x = nb_tree_get_val(in, "x"), *y = NULL;
  nb_status st = NB_OK;
  nb_nn_moe_aux aux = {0};
  nb_nn_attn_io io = {.positions = nb_tree_get_val(in, "positions"), .segment_ids = nb_tree_get_val(in, "segment_ids")};
  if (c->use_cache) {
    io.cache_k = nb_tree_get_val(in, "cache_k");
    io.cache_v = nb_tree_get_val(in, "cache_v");
    io.cache_pos = nb_tree_get_val(in, "cache_pos");
  }
  switch (c->kind) {
    case M_LINEAR: y = nb_nn_linear(&a, "lin", x); break;
    case M_LAYERNORM: y = nb_nn_layernorm(&a, "ln", x, 1e-5); break;
    case M_RMSNORM: y = nb_nn_rmsnorm(&a, "rms", x, 1e-6); break;
    case M_MLP: y = nb_nn_mlp(&a, "mlp", c->cfg, x); break;
    case M_ATTN: y = nb_nn_attention(&a, "attn", c->cfg, x, &io); break;
    case M_MOE: y = nb_nn_moe(&a, "moe", c->cfg, x, c->aux_out ? &aux : NULL); break;
    case M_BLOCK: y = nb_nn_block(&a, "block", c->cfg, x, &io, &aux); break;
    case M_CE: y = nb_nn_cross_entropy(x, nb_tree_get_val(in, "targets"), nb_tree_get_val(in, "mask")); break;
    case M_EMBED: y = nb_nn_embed(&a, "emb", nb_tree_get_val(in, "ids")); break;
    case M_SOFTMAX: y = nb_nn_softmax(x, -1); break;
  }
  st = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "y", y);
  if (!st && c->use_cache) st = nb_tree_set_val(out, "cache_k", io.new_cache_k);
  if (!st && c->use_cache) st = nb_tree_set_val(out, "cache_v", io.new_cache_v);
  if (!st && c->aux_out) {
    st = nb_tree_set_val(out, "lb", aux.lb_loss);
    if (!st) st = nb_tree_set_val(out, "z", aux.z_loss);
    if (!st) st = nb_tree_set_val(out, "dropped", aux.dropped);
    if (!st) st = nb_tree_set_val(out, "load", aux.load);
  }
  nb_tree_destroy(p);
  return st;
}

/* Sets a (new reference) into t at path and releases it. */
static inline void put(nb_tree *t, const char *path, nb_array *a) {
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

/* The inputs tree {"params/<p>": params..., "x": x} (x taken). */
static inline nb_tree *with_params(nb_ctx *ctx, const nb_tree *params, nb_array *x) {
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_merge(t, "params", params);
  if (x) put(t, "x", x);
  return t;
}

/* Runs the case; returns the output "y" (new reference) or NULL. */
static inline nb_array *run_case(nb_ctx *ctx, nn_case *c, const nb_tree *in, nb_tree *out_or_null) {
  nb_tree *out = out_or_null ? out_or_null : nb_tree_create(ctx);
  nb_status st = nb_test_eval(ctx, nn_case_fn, c, in, out);
  nb_array *y = st == NB_OK ? nb_tree_get_array(out, "y") : NULL;
  if (y) nb_array_retain(y);
  else fprintf(stderr, "run_case: %s\n", nb_ctx_error(ctx));
  if (!out_or_null) nb_tree_destroy(out);
  return y;
}

/* Largest |a - b| over the elements. */
static inline double max_diff(const nb_array *a, const nb_array *b) {
  if (!a || !b || nb_array_size(a) != nb_array_size(b)) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) m = fmax(m, fabs(nb_array_get(a, i) - nb_array_get(b, i)));
  return m;
}

#endif
