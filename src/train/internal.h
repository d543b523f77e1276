/* Private to src/train: the trainer's data set-up (data.c) shared with the
 * loop (run.c). Not public API. */
#ifndef NABLA_TRAIN_INTERNAL_H
#define NABLA_TRAIN_INTERNAL_H

#include "nabla/data.h"
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

/* FSDP layout (fsdp.c): every leaf of rank >= 1 split along dim 0 into
 * fsdp blocks of ceil(dim0 / fsdp) rows, zero-padded; rank 0 leaves whole. */
int64_t nb_train__fsdp_rows(int64_t dim0, int64_t fsdp);
nb_aval nb_train__fsdp_shard_aval(nb_aval full, int64_t fsdp);
/* The shards' avals of a tree of any leaf kind (new tree). */
nb_tree *nb_train__fsdp_shard_spec(nb_ctx *ctx, const nb_tree *full, int64_t fsdp);
/* Rows [lo, lo + n) of a (zeros past its end) as a new array. */
nb_array *nb_train__rows_of(nb_ctx *ctx, const nb_array *a, int64_t lo, int64_t n);
/* Process r's shards of a tree of host arrays (new tree of new arrays). */
nb_tree *nb_train__fsdp_shard(nb_ctx *ctx, const nb_tree *full, int64_t fsdp, int64_t r);
/* The parameter hook (nb_nn_param_hook) that gathers a shard into the whole
 * parameter where a layer reads it; full_spec (borrowed, outlives it) gives
 * the whole shapes. */
typedef struct nb_train__fsdp_gather nb_train__fsdp_gather;
nb_train__fsdp_gather *nb_train__fsdp_gather_create(const nb_tree *full_spec);
void nb_train__fsdp_gather_destroy(nb_train__fsdp_gather *h);
nb_val *nb_train__fsdp_gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v);

/* The processes a batch is split over: mesh.data x mesh.fsdp x mesh.expert. */
static inline int64_t nb_train__batch_procs(const nb_train_config *c) { return c->mesh.data * c->mesh.fsdp * c->mesh.expert; }

/* Expert parallel layout (ep.c): the routed experts' stacked leaves
 * ("/moe/experts/" in the path, [E, ...]) split along dim 0 into
 * mesh.expert blocks of E / mesh.expert rows; every other leaf whole. */
bool nb_train__ep_is_expert(const char *path);
/* mesh.expert's rules: an MoE model, n_experts a multiple of it, a capacity factor, no fsdp. */
nb_status nb_train__ep_validate(nb_ctx *ctx, const nb_train_config *c);
/* The gradient's global norm when the leaves that `sharded` says are split
 * over `axis` (the others whole on every process): the sharded leaves'
 * squares psummed over the axis, plus the whole leaves' once. */
nb_val *nb_train__sharded_global_norm(nb_graph *g, const nb_tree *grads, const char *axis,
                                      bool (*sharded)(const char *path, nb_val *v));
/* The parameter hook that gathers an expert leaf's blocks into the whole
 * [E, ...] (all_gather over "expert"): eval runs every expert on every process. */
nb_val *nb_train__ep_gather_param(void *ud, nb_nn_apply *a, const char *path, nb_val *v);

/* Tensor parallel layout (tp.c): the dim along which the leaf at `path`
 * (a parameter or its optimizer state: the path ends with the parameter's)
 * of that rank is split over mesh.tensor, or -1 when it is whole on every
 * process: column-parallel kernels and biases (attn wq/wk/wv, mlp
 * wi/wi_0/wi_1) along their last dim, row-parallel kernels (attn wo, mlp
 * wo) along dim 0. */
int nb_train__tp_dim(const char *path, int rank);
bool nb_train__tp_sharded(const char *path, int rank);
/* The model each of T processes runs: n_heads/T, n_kv_heads/T, d_ff/T
 * (head_dim made explicit). */
nb_model_config nb_train__tp_model(const nb_model_config *c, int64_t T);
/* mesh.tensor's rules: T divides the heads, kv heads and d_ff; no FSDP,
 * MoE or attention dropout with it (errors name the keys). */
nb_status nb_train__tp_check(nb_ctx *ctx, const nb_train_config *c);
/* The shards' avals of a tree (new tree), and process r's shards of a tree
 * of host arrays (new tree; whole leaves shared). */
nb_tree *nb_train__tp_shard_spec(nb_ctx *ctx, const nb_tree *full, int64_t T);
nb_tree *nb_train__tp_shard(nb_ctx *ctx, const nb_tree *full, int64_t T, int64_t r);
/* The linear hook (nb_nn_linear_hook, ud a nb_train__tp_hook): pbroadcast
 * before a column-parallel linear, psum after a row-parallel one (then its
 * bias). */
typedef struct nb_train__tp_hook nb_train__tp_hook;
nb_train__tp_hook *nb_train__tp_hook_create(void);
void nb_train__tp_hook_destroy(nb_train__tp_hook *h);
nb_val *nb_train__tp_linear(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);

/* The state's sharded layout of the config (FSDP's, expert or tensor
 * parallel's: at most one of them; a copy of the avals when there is none):
 * the shards' avals of a tree (new). */
nb_tree *nb_train__shard_spec(nb_ctx *ctx, const nb_train_config *c, const nb_tree *full);
/* Process `index`'s shards (its fsdp, expert or tensor index) of a tree of host arrays (new tree). */
nb_tree *nb_train__shard(nb_ctx *ctx, const nb_train_config *c, const nb_tree *full, int64_t index);
/* How many blocks the sharded leaves have (mesh.fsdp, mesh.expert or mesh.tensor; 1: none). */
static inline int64_t nb_train__shard_count(const nb_train_config *c) {
  return c->mesh.fsdp * c->mesh.expert * c->mesh.tensor;
}

#endif
