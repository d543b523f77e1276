/* Private to src/train: the trainer's data set-up (data.c) shared with the
 * loop (run.c). Not public API. */
#ifndef NABLA_TRAIN_INTERNAL_H
#define NABLA_TRAIN_INTERNAL_H

#include "nabla/data.h"
#include "nabla/dist.h"
#include "nabla/train.h"

#define NB_TRAIN_PATH_MAX 1024

/* What a checkpoint's data position depends on, of a shard. */
typedef struct nb_train__shard_id {
  int64_t tokens;
  uint64_t xxh3;              /* of the token data (the shard header's) */
} nb_train__shard_id;

typedef struct nb_train__data {
  char train_shard[NB_TRAIN_PATH_MAX], eval_shard[NB_TRAIN_PATH_MAX];
  nb_train__shard_id train_id;
  nb_data_map *train_windows; /* {"tokens": i32[T+1]}, the train part (one reference) */
  nb_data_map *eval_windows;  /* the eval part: the eval shard, or the held-out tail */
  int64_t vocab, n_train, n_eval;
  double entropy;             /* unigram entropy (nats/token) of the training shard */
} nb_train__data;

/* Resolves cfg's data (text inputs tokenized into shards cached under
 * run_dir/data/), opens the windows and splits off the eval part. */
nb_status nb_train__data_open(nb_ctx *ctx, const nb_train_config *cfg, const char *run_dir, nb_train__data *d);
void nb_train__data_close(nb_train__data *d);
/* Wraps the error on ctx as "<formatted prefix>: <cause>" (status s, or
 * INTERNAL when s is OK). */
nb_status nb_train__wrapf(nb_ctx *ctx, nb_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* mkdir -p */
nb_status nb_train__mkdir_p(nb_ctx *ctx, const char *path);
/* init_from's model (config.c, which knows the keys): src with run's
 * training-time model keys; an architecture key run sets to another value
 * is an error naming it, both values and src_name. */
nb_status nb_train__model_from(nb_ctx *ctx, const nb_train_config *run, const nb_model_config *src, const char *src_name,
                               nb_model_config *out);
/* windows -> shuffle(seed) -> repeat -> batch -> {inputs, targets} -> prefetch;
 * with mesh.data = D > 1, process `rank`'s B/D rows of every batch */
nb_data_iter *nb_train__data_iter(nb_ctx *ctx, const nb_train__data *d, const nb_train_config *cfg, int rank);
/* Eval batches: element i is the i-th batch of eval windows (wrapping). */
nb_data_map *nb_train__eval_batches(nb_ctx *ctx, const nb_train__data *d, const nb_train_config *cfg);

/* The processes a batch is split over: mesh.data x mesh.fsdp x mesh.expert. */
static inline int64_t nb_train__batch_procs(const nb_train_config *c) { return c->mesh.data * c->mesh.fsdp * c->mesh.expert; }
/* How many blocks the split leaves have (mesh.fsdp, mesh.expert or mesh.tensor; 1: none). */
static inline int64_t nb_train__shard_count(const nb_train_config *c) {
  return c->mesh.fsdp * c->mesh.expert * c->mesh.tensor;
}

/* ---------------------------------------------------------------- the sharded state (layout.c) */

/* The mesh axis the state is split over: "fsdp", "expert" or "tensor" (the
 * config's refusals leave at most one above 1); NULL: none. */
const char *nb_train__shard_axis(const nb_train_config *c);
/* The config's sharding rules: mesh.rules (labelled "mesh.rules"), or the
 * built-in rules of the split axis (none without one). New. */
nb_dist_rules *nb_train__rules(nb_ctx *ctx, const nb_train_config *c);
/* mesh.rules without a model: it parses, names mesh axes, never "data". */
nb_status nb_train__rules_check(nb_ctx *ctx, const nb_train_config *c);
/* The layout of the config's model (nb_model_param_spec) under its rules,
 * with what the trainer cannot run refused (config validation). */
nb_status nb_train__layout_check(nb_ctx *ctx, const nb_train_config *c);
/* The optimizer state's avals for params (a new tree). */
nb_tree *nb_train__opt_state_spec(nb_ctx *ctx, const nb_train_config *c, const nb_tree *params);

/* The state's layout: per leaf ("params/<p>", "opt_state/<s>") its spec. */
typedef struct nb_train__layout {
  const char *axis;      /* the split axis (nb_train__shard_axis), NULL: nothing split */
  int64_t count;         /* its size: the blocks of a split leaf */
  nb_dist_rules *rules;
  nb_dist_layout *l;
  bool tp_attn, tp_mlp;  /* tensor parallel: the attention / the MLP split (tp.c) */
} nb_train__layout;
/* The layout of params (and of opt_state, NULL: none; its leaves follow
 * their parameter's spec) under c's rules; refuses what the trainer cannot
 * run (ep.c, tp.c). Free with nb_train__layout_free. */
nb_status nb_train__layout_make(nb_ctx *ctx, const nb_train_config *c, const nb_tree *params, const nb_tree *opt_state,
                                nb_train__layout *out);
void nb_train__layout_free(nb_train__layout *L);
/* The dim of leaf "item/path" (item NULL or "": path is the state's) split over the axis, or -1. */
int nb_train__split_dim(const nb_train__layout *L, const char *item, const char *path);
/* The blocks' avals of a tree whose paths are under item (new tree). */
nb_tree *nb_train__shard_spec(nb_ctx *ctx, const nb_train__layout *L, const char *item, const nb_tree *t);
/* Block `index` (along the axis) of each leaf of a tree of host arrays
 * under item: a new tree (whole leaves shared). */
nb_tree *nb_train__shard(nb_ctx *ctx, const nb_train__layout *L, const char *item, const nb_tree *t, int64_t index);
/* The gradient's global norm when the leaves split over the axis are
 * blocks (the others whole on every process): the blocks' squares psummed
 * over the axis, plus the whole leaves' once. */
nb_val *nb_train__sharded_global_norm(nb_graph *g, const nb_tree *grads, const nb_train__layout *L);
/* The parameter hook (nb_nn_param_hook) that gathers a split parameter's
 * blocks into the whole one where a layer reads it (all_gather over the
 * axis, FSDP's padding sliced off); L borrowed, outlives it. */
typedef struct nb_train__gather nb_train__gather;
nb_train__gather *nb_train__gather_create(const nb_train__layout *L);
void nb_train__gather_destroy(nb_train__gather *h);
nb_val *nb_train__gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v);

/* ---------------------------------------------------------------- expert parallel (ep.c) */

/* The routed experts' stacked leaves, which nb_nn_moe reads as this
 * process's experts under expert_axis: "/moe/experts/" in the path. */
bool nb_train__ep_is_expert(const char *path);
/* mesh.expert's rules: an MoE model, n_experts a multiple of it, a capacity factor, no fsdp. */
nb_status nb_train__ep_validate(nb_ctx *ctx, const nb_train_config *c);
/* The rules split every routed experts' leaf of params along dim 0 over
 * expert, and nothing else over it (what nb_nn_moe runs). */
nb_status nb_train__ep_check_rules(nb_ctx *ctx, const nb_dist_rules *r, const nb_tree *params);

/* ---------------------------------------------------------------- tensor parallel (tp.c) */

/* The model each of T processes runs: with the attention split n_heads/T
 * and n_kv_heads/T (head_dim made explicit), with the MLP split d_ff/T. */
nb_model_config nb_train__tp_model(const nb_model_config *c, int64_t T, bool attn, bool mlp);
/* mesh.tensor's refusals that need no layout: no FSDP or MoE with it. */
nb_status nb_train__tp_check(nb_ctx *ctx, const nb_train_config *c);
/* What the rules split over tensor in params, checked: only the
 * attention's and MLP's linears (column-parallel wq/wk/wv, wi/wi_0/wi_1
 * kernels and biases along d_out; row-parallel wo kernels along d_in),
 * each group in every layer or in none; mesh.tensor divides the heads of a
 * split attention and d_ff of a split MLP. *attn, *mlp: which are split. */
nb_status nb_train__tp_check_rules(nb_ctx *ctx, const nb_train_config *c, const nb_dist_rules *r, const nb_tree *params,
                                   bool *attn, bool *mlp);
/* The linear hook (nb_nn_linear_hook, ud a nb_train__tp_hook): from the
 * kernel's spec in L, pbroadcast before a column-parallel linear (split
 * along d_out), psum after a row-parallel one (along d_in; then its bias);
 * a linear whose kernel is whole runs as it is. L borrowed. */
typedef struct nb_train__tp_hook nb_train__tp_hook;
nb_train__tp_hook *nb_train__tp_hook_create(const nb_train__layout *L);
void nb_train__tp_hook_destroy(nb_train__tp_hook *h);
nb_val *nb_train__tp_linear(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);

#endif
