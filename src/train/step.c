/* The trainer's graphs: the learning-rate schedule and optimizer built from
 * a run config, the training step (value_and_grad over grad_accum
 * micro-batches + clipping + optimizer update, one graph) and the eval loss.
 * The schedule's numbers (lr, warmup, decay length from steps, min_lr_ratio),
 * the optimizer's (b1, b2, eps, weight_decay, momentum, grad_clip, a
 * constant lr) and the dropout key of the seed are inputs of the step
 * ("hparams/..."), not constants: runs that differ only in them share one
 * compiled step. No host work here: the loop that runs these lives in
 * run.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/train.h"
#include "train/internal.h"

/* Weight decay only on matrices (kernels, embeddings, LoRA adapters), not biases or norms. */
#define DECAY_MASK "(kernel|embedding|lora_a|lora_b)$"

static nb_optim_schedule *schedule(nb_ctx *ctx, const nb_train_config *c) {
  if (!c) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train schedule: NULL config"), NULL;
  double lr = c->optim.lr, end = lr * c->schedule.min_lr_ratio;
  int64_t warm = c->schedule.warmup_steps;
  int64_t decay = c->schedule.decay_steps ? c->schedule.decay_steps : c->steps - warm;
  if (decay < 1) decay = 1; /* the run ends inside the warmup: any decay length will do */
  nb_optim_schedule *after = NULL;
  switch (c->schedule.kind) {
  case NB_TRAIN_SCHEDULE_CONSTANT: after = nb_optim_constant(ctx, lr); break;
  case NB_TRAIN_SCHEDULE_LINEAR: after = nb_optim_linear(ctx, lr, end, decay, 0); break;
  case NB_TRAIN_SCHEDULE_COSINE: after = nb_optim_cosine_decay(ctx, lr, decay, c->schedule.min_lr_ratio, 1); break;
  default: return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train schedule: schedule.kind %d unknown", c->schedule.kind), NULL;
  }
  if (!after || warm == 0) return after;
  nb_optim_schedule *parts[2] = {nb_optim_linear(ctx, 0, lr, warm, 0), after};
  if (!parts[0]) {
    nb_optim_schedule_destroy(after);
    return NULL;
  }
  return nb_optim_join_schedules(ctx, 2, parts, &warm);
}

/* hp: where the step's "hparams/schedule" input will be while tracing */
static nb_optim_schedule *bound_schedule(nb_ctx *ctx, const nb_train_config *c, nb_val *const *hp) {
  nb_optim_schedule *s = schedule(ctx, c);
  return s ? nb_optim_schedule_from_input(ctx, s, hp) : NULL;
}

nb_optim_schedule *nb_train_schedule(nb_ctx *ctx, const nb_train_config *c) { return schedule(ctx, c); }

static nb_optim_tx *optimizer(nb_ctx *ctx, const nb_train_config *c, nb_val *const *hp);

nb_status nb_train_set_hparams(nb_ctx *ctx, const nb_train_config *c, nb_tree *inputs) {
  static nb_val *const unbound = NULL;
  nb_optim_schedule *s = schedule(ctx, c);
  nb_optim_tx *tx = s ? optimizer(ctx, c, &unbound) : NULL;
  nb_array *v = tx ? nb_optim_schedule_inputs(ctx, s) : NULL, *o = v ? nb_optim_tx_inputs(ctx, tx) : NULL;
  nb_array *key = o ? nb_key(ctx, (uint64_t)c->seed) : NULL;
  nb_status st = key ? nb_tree_set_array(inputs, "hparams/schedule", v) : nb_ctx_status(ctx);
  if (!st) st = nb_tree_set_array(inputs, "hparams/optim", o);
  if (!st) st = nb_tree_set_array(inputs, "hparams/key", key);
  nb_array_release(v);
  nb_array_release(o);
  nb_array_release(key);
  nb_optim_schedule_destroy(s);
  nb_optim_tx_destroy(tx);
  return st;
}

/* hp: where the "hparams/schedule" input will be while tracing (its
 * schedule's numbers); the optimizer's own numbers are bound by the caller
 * (nb_optim_tx_from_input) to "hparams/optim". */
static nb_optim_tx *optimizer(nb_ctx *ctx, const nb_train_config *c, nb_val *const *hp) {
  nb_optim_schedule *lr = bound_schedule(ctx, c, hp);
  if (!lr) return NULL;
  nb_optim_tx *txs[3];
  int n = 0;
  /* under FSDP, expert or tensor parallelism the step clips (sharded_clip: the norm is over every process's
   * shards); the chain keeps its place, so the state's paths, and a checkpoint, are the same on any mesh */
  if (c->optim.grad_clip > 0)
    txs[n++] = nb_train__shard_count(c) == 1 ? nb_optim_clip_by_global_norm(ctx, c->optim.grad_clip)
                                             : nb_optim_identity(ctx);
  double wd = c->optim.weight_decay;
  switch (c->optim.name) {
  case NB_TRAIN_OPTIM_ADAMW:
    txs[n++] = nb_optim_adamw(ctx, lr, c->optim.b1, c->optim.b2, c->optim.eps, wd, DECAY_MASK);
    break;
  case NB_TRAIN_OPTIM_ADAM: /* weight_decay as an L2 term on the gradient (PyTorch's Adam) */
    if (wd > 0) txs[n++] = nb_optim_add_decayed_weights(ctx, wd, DECAY_MASK);
    txs[n++] = nb_optim_adam(ctx, lr, c->optim.b1, c->optim.b2, c->optim.eps);
    break;
  case NB_TRAIN_OPTIM_SGD:
    if (wd > 0) txs[n++] = nb_optim_add_decayed_weights(ctx, wd, DECAY_MASK);
    txs[n++] = nb_optim_sgd(ctx, lr, c->optim.momentum, false);
    break;
  default:
    nb_optim_schedule_destroy(lr);
    while (n) nb_optim_tx_destroy(txs[--n]);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train optimizer: optim.name %d unknown", c->optim.name), NULL;
  }
  for (int i = 0; i < n; i++)
    if (!txs[i]) { /* a failed constructor already destroyed what it took */
      for (int j = 0; j < n; j++) nb_optim_tx_destroy(txs[j]);
      return NULL;
    }
  return n == 1 ? txs[0] : nb_optim_chain(ctx, n, txs);
}

nb_optim_tx *nb_train_optimizer(nb_ctx *ctx, const nb_train_config *c) {
  static nb_val *const unbound = NULL;
  return optimizer(ctx, c, &unbound);
}

/* ---------------------------------------------------------------- the step */

typedef struct step_job {
  const nb_train_config *cfg;
  const nb_graph *vg;          /* value_and_grad of the micro-batch loss */
  const nb_optim_tx *tx;
  const nb_optim_schedule *lr;
  nb_val **hp;                 /* what tx's and lr's schedules read: the "hparams/schedule" input */
  nb_val **hpo;                /* what tx's own numbers read: the "hparams/optim" input */
  bool rng;                    /* vg takes "rng" (dropout) */
  const nb_train__layout *layout; /* FSDP, expert, tensor parallel: which leaves are split (else NULL) */
} step_job;

static nb_val *add_or_set(nb_val *acc, nb_val *x) { return acc ? nb_add(acc, x) : x; }

/* A micro-batch's gradients behind an optimization barrier: each is
 * computed and rounded alone before the sum, as it is when
 * another process computes it (data parallel), so that one process with
 * grad_accum = mesh.data reproduces the job bit for bit (the compiler would
 * otherwise fuse the sum into the reductions that make them). */
static nb_status barrier_leaves(nb_tree *t) {
  enum { CHUNK = 256 };
  nb_val *v[CHUNK];
  size_t at[CHUNK], i = 0, size = nb_tree_size(t);
  nb_status s = NB_OK;
  while (!s && i < size) {
    int n = 0;
    for (; i < size && n < CHUNK; i++)
      if (!strncmp(nb_tree_path(t, i), "grad/", 5)) {
        at[n] = i;
        v[n++] = nb_tree_leaf(t, i)->val;
      }
    s = nb_optimization_barrier_at(NB_HERE, n, v);
    for (int k = 0; !s && k < n; k++) s = nb_tree_set_val(t, nb_tree_path(t, at[k]), v[k]);
  }
  return s;
}

/* on_nonfinite=skip: where ok is false (the loss or gradient norm is not
 * finite), each leaf of updated becomes the one of old, as optax's
 * apply_if_finite; in the graph, so that the state stays donated. */
static nb_status keep_old_unless(nb_graph *g, nb_val *ok, const nb_tree *old, nb_tree *updated) {
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < nb_tree_size(updated); i++) {
    const char *p = nb_tree_path(updated, i);
    nb_val *was = nb_tree_get_val(old, p);
    s = was ? nb_tree_set_val(updated, p, nb_select(ok, nb_tree_leaf(updated, i)->val, was))
            : nb_errorf(nb_graph_ctx(g), NB_ERR_INTERNAL, "train step: no old value for '%s'", p);
  }
  return s;
}

/* Whether a gradient leaf is whole on every process (not split over the layout's axis). */
static bool whole_leaf(const step_job *job, const nb_tree *grads, size_t i) {
  return nb_train__split_dim(job->layout, "params", nb_tree_path(grads, i)) < 0;
}

/* FSDP, expert, tensor parallel: clip_by_global_norm with the norm of the
 * whole gradient, as nb_optim_clip_by_global_norm does on one process
 * (g / norm * max_norm where norm >= max_norm). */
static nb_status sharded_clip(nb_graph *g, nb_tree *grads, nb_val *norm, double max_norm) {
  nb_val *keep = nb_lt(norm, nb_scalar(g, NB_F32, max_norm));
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < nb_tree_size(grads); i++) {
    nb_val *u = nb_tree_leaf(grads, i)->val;
    nb_dtype d = nb_val_dtype(u);
    nb_val *clipped = nb_mul(nb_div(u, nb_convert(norm, d)), nb_convert(nb_scalar(g, NB_F32, max_norm), d));
    nb_val *k = nb_broadcast_to(keep, nb_val_rank(u), nb_val_aval(u).shape.dims);
    s = nb_tree_set_val(grads, nb_tree_path(grads, i), nb_select(k, u, clipped));
  }
  return s;
}

static nb_status step_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const step_job *job = u;
  nb_ctx *ctx = nb_graph_ctx(g);
  const nb_train_config *c = job->cfg;
  /* A micro-batches of mb rows in the whole job; each of its D x F x X processes runs Al of them (its rows of the batch) */
  int64_t A = c->grad_accum, D = c->mesh.data, F = c->mesh.fsdp, X = c->mesh.expert, Al = A / (D * F * X);
  int64_t mb = c->batch_size / A;
  nb_val *step = nb_tree_get_val(in, "step");
  *job->hp = nb_tree_get_val(in, "hparams/schedule");
  *job->hpo = nb_tree_get_val(in, "hparams/optim");
  nb_tree *batch = nb_tree_select_prefix(in, "batch", true), *frozen = nb_tree_select_prefix(in, "frozen", true);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *state = nb_tree_select_prefix(in, "opt_state", true);
  nb_tree *grads = nb_tree_create(ctx), *metrics = nb_tree_create(ctx);
  nb_tree *updates = nb_tree_create(ctx), *new_state = nb_tree_create(ctx), *new_params = nb_tree_create(ctx);
  nb_status s = batch && frozen && params && state && grads && metrics && updates && new_state && new_params ? NB_OK : NB_ERR_NOMEM;
  nb_val *loss = NULL, *key = NULL;
  if (!s && job->rng) key = nb_random_fold_in(nb_tree_get_val(in, "hparams/key"), step);
  /* micro-batch k: rows [k*mb, (k+1)*mb) of the batch; grads and metrics summed, then averaged */
  for (int64_t k = 0; k < Al && !s; k++) {
    nb_tree *call_in = nb_tree_create(ctx), *call_out = nb_tree_create(ctx);
    if (!call_in || !call_out) s = NB_ERR_NOMEM;
    if (!s) s = nb_tree_merge(call_in, "params", params);
    if (!s) s = nb_tree_merge(call_in, "frozen", frozen);
    /* every batch leaf's rows [k*mb, (k+1)*mb) (axis 0 is the example) */
    for (size_t i = 0; !s && i < nb_tree_size(batch); i++) {
      nb_val *v = nb_tree_leaf(batch, i)->val;
      int r = nb_val_rank(v);
      int64_t lo[NB_MAX_RANK] = {k * mb}, hi[NB_MAX_RANK] = {(k + 1) * mb};
      for (int d = 1; d < r; d++) hi[d] = nb_val_dim(v, d);
      char p[256];
      snprintf(p, sizeof p, "batch/%s", nb_tree_path(batch, i));
      s = nb_tree_set_val(call_in, p, Al > 1 ? nb_slice(v, lo, hi, NULL) : v);
    }
    /* dropout of micro-batch (rank * Al + k) of the job, rank = (data index * F + fsdp index) * X + expert
     * index (the batch's order): the same as one process with grad_accum = A */
    nb_val *micro = nb_scalar(g, NB_U32, (double)k);
    if (D * F * X > 1) {
      nb_val *rank = nb_scalar(g, NB_U32, 0);
      if (D > 1) rank = nb_mul(nb_convert(nb_axis_index(g, "data"), NB_U32), nb_scalar(g, NB_U32, (double)(F * X)));
      if (F > 1) rank = nb_add(rank, nb_mul(nb_convert(nb_axis_index(g, "fsdp"), NB_U32), nb_scalar(g, NB_U32, (double)X)));
      if (X > 1) rank = nb_add(rank, nb_convert(nb_axis_index(g, "expert"), NB_U32));
      micro = nb_add(nb_mul(rank, nb_scalar(g, NB_U32, (double)Al)), micro);
    }
    if (!s && key) s = nb_tree_set_val(call_in, "rng", A > 1 ? nb_random_fold_in(key, micro) : key);
    if (!s) s = nb_graph_call(g, job->vg, call_in, call_out);
    if (!s && A > 1) s = barrier_leaves(call_out);
    for (size_t i = 0; !s && i < nb_tree_size(call_out); i++) {
      const char *p = nb_tree_path(call_out, i);
      nb_val *v = nb_tree_leaf(call_out, i)->val;
      if (!strcmp(p, "loss")) {
        loss = add_or_set(loss, v);
      } else if (!strncmp(p, "grad/params/", 12)) {
        s = nb_tree_set_val(grads, p + 12, add_or_set(k ? nb_tree_get_val(grads, p + 12) : NULL, v));
      } else if (!strncmp(p, "aux/metrics/", 12)) {
        s = nb_tree_set_val(metrics, p + 12, add_or_set(k ? nb_tree_get_val(metrics, p + 12) : NULL, v));
      }
    }
    nb_tree_destroy(call_in);
    nb_tree_destroy(call_out);
  }
  /* FSDP: the split gradients came out of vg summed over "fsdp" (the
   * transpose of the parameter's all_gather is psum_scatter, folded in rank
   * order); the loss, metrics and the gradients of whole leaves (scalars,
   * those the rules keep whole) are summed here */
  if (!s && F > 1) {
    loss = nb_psum(loss, "fsdp");
    for (size_t i = 0; !s && i < nb_tree_size(grads); i++)
      if (whole_leaf(job, grads, i))
        s = nb_tree_set_val(grads, nb_tree_path(grads, i), nb_psum(nb_tree_leaf(grads, i)->val, "fsdp"));
    for (size_t i = 0; !s && i < nb_tree_size(metrics); i++)
      s = nb_tree_set_val(metrics, nb_tree_path(metrics, i), nb_psum(nb_tree_leaf(metrics, i)->val, "fsdp"));
  }
  /* expert parallel: each process's loss, metrics and whole leaves' gradients are its own tokens', summed here;
   * the experts' gradients came out of vg already summed over the processes' tokens (the all_to_all's
   * transpose brought every process's cotangents to the experts' process): not summed again */
  if (!s && X > 1) {
    loss = nb_psum(loss, "expert");
    for (size_t i = 0; !s && i < nb_tree_size(grads); i++)
      if (whole_leaf(job, grads, i))
        s = nb_tree_set_val(grads, nb_tree_path(grads, i), nb_psum(nb_tree_leaf(grads, i)->val, "expert"));
    for (size_t i = 0; !s && i < nb_tree_size(metrics); i++)
      s = nb_tree_set_val(metrics, nb_tree_path(metrics, i), nb_psum(nb_tree_leaf(metrics, i)->val, "expert"));
  }
  /* data parallel: the sums over the processes, folded in rank order (psum),
   * so the sum of the job's micro-batches is the same bits as one process's
   * add of them when each process runs one (grad_accum = mesh.data) */
  if (!s && D > 1) {
    loss = nb_psum(loss, "data");
    for (size_t i = 0; !s && i < nb_tree_size(grads); i++)
      s = nb_tree_set_val(grads, nb_tree_path(grads, i), nb_psum(nb_tree_leaf(grads, i)->val, "data"));
    for (size_t i = 0; !s && i < nb_tree_size(metrics); i++)
      s = nb_tree_set_val(metrics, nb_tree_path(metrics, i), nb_psum(nb_tree_leaf(metrics, i)->val, "data"));
  }
  if (!s && A > 1) { /* means of means: equal micro-batches, so the big-batch mean */
    nb_val *inv = nb_scalar(g, NB_F32, 1.0 / (double)A);
    loss = nb_mul(loss, inv);
    for (size_t i = 0; !s && i < nb_tree_size(grads); i++) {
      nb_val *v = nb_tree_leaf(grads, i)->val;
      s = nb_tree_set_val(grads, nb_tree_path(grads, i), nb_mul(v, nb_convert(inv, nb_val_dtype(v))));
    }
    for (size_t i = 0; !s && i < nb_tree_size(metrics); i++) {
      const char *p = nb_tree_path(metrics, i);
      nb_val *v = nb_tree_leaf(metrics, i)->val;
      if (strcmp(p, "tokens") != 0 && nb_dtype_is_float(nb_val_dtype(v)))
        s = nb_tree_set_val(metrics, p, nb_mul(v, nb_convert(inv, nb_val_dtype(v))));
    }
  }
  /* tensor parallel: the gradients of whole leaves are the same on every process of "tensor" (the
   * collectives of the hook made them so), those of split leaves are the shards of the gradient.
   * The global norm sums the blocks' squares over the axis in rank order (FSDP's padding adds
   * zeros): another rounding than one process's sum over whole leaves */
  int64_t T = c->mesh.tensor;
  nb_val *grad_norm = s ? NULL : job->layout ? nb_train__sharded_global_norm(g, grads, job->layout) : nb_optim_global_norm(g, grads);
  if (!s && F * X * T > 1 && c->optim.grad_clip > 0) s = sharded_clip(g, grads, grad_norm, c->optim.grad_clip);
  if (!s) s = nb_tree_set_val(out, "loss", loss);
  if (!s) s = nb_tree_set_val(out, "grad_norm", grad_norm);
  if (!s) s = nb_tree_set_val(out, "lr", nb_optim_schedule_trace(job->lr, step));
  if (!s) s = nb_tree_merge(out, "metrics", metrics);
  if (!s) s = nb_optim_update(job->tx, g, grads, state, params, updates, new_state);
  if (!s) s = nb_optim_apply_updates(g, params, updates, new_params);
  if (!s && c->on_nonfinite == NB_TRAIN_NONFINITE_SKIP) {
    nb_val *ok = nb_and(nb_is_finite(loss), nb_is_finite(grad_norm));
    s = keep_old_unless(g, ok, params, new_params);
    if (!s) s = keep_old_unless(g, ok, state, new_state);
  }
  if (!s) s = nb_tree_merge(out, "params", new_params);
  if (!s) s = nb_tree_merge(out, "opt_state", new_state);
  nb_tree_destroy(batch);
  nb_tree_destroy(frozen);
  nb_tree_destroy(params);
  nb_tree_destroy(state);
  nb_tree_destroy(grads);
  nb_tree_destroy(metrics);
  nb_tree_destroy(updates);
  nb_tree_destroy(new_state);
  nb_tree_destroy(new_params);
  return s;
}

static nb_tree *batch_spec(nb_ctx *ctx, int64_t rows, int64_t T, bool packed) {
  nb_tree *b = nb_tree_create(ctx);
  int64_t d[2] = {rows, T};
  if (b && (nb_tree_set(b, "inputs", nb_leaf_aval(nb_aval_make(NB_I32, 2, d))) ||
            nb_tree_set(b, "targets", nb_leaf_aval(nb_aval_make(NB_I32, 2, d))) ||
            (packed && (nb_tree_set(b, "mask", nb_leaf_aval(nb_aval_make(NB_F32, 2, d))) ||
                        nb_tree_set(b, "segment_ids", nb_leaf_aval(nb_aval_make(NB_I32, 2, d))) ||
                        nb_tree_set(b, "positions", nb_leaf_aval(nb_aval_make(NB_I32, 2, d))))))) {
    nb_tree_destroy(b);
    return NULL;
  }
  return b;
}

static nb_status check_supported(nb_ctx *ctx, const nb_train_config *c) {
  if (c->precision.params != NB_F32 || c->precision.compute != NB_F32)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                     "train: precision.params=%s, precision.compute=%s: the trainer supports only f32 for both "
                     "(bf16 is not validated through the jit training path)",
                     nb_dtype_name(c->precision.params), nb_dtype_name(c->precision.compute));
  if (c->batch_size % c->grad_accum)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: batch_size (%lld) must be a multiple of grad_accum (%lld)",
                     (long long)c->batch_size, (long long)c->grad_accum);
  /* every mesh axis above 1 bound to that many processes */
  const char *const axes[] = {"data", "fsdp", "expert", "tensor"};
  const int64_t sizes[] = {c->mesh.data, c->mesh.fsdp, c->mesh.expert, c->mesh.tensor};
  for (int i = 0; i < 4; i++) {
    nb_comm *axis = nb_ctx_axis(ctx, axes[i]);
    if (sizes[i] > 1 && (!axis || axis->ops->size(axis) != sizes[i])) {
      char job[48] = "";
      if (i > 0) snprintf(job, sizeof job, " (mesh.data x mesh.%s)", axes[i]);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                       "train: mesh.%s=%lld needs the mesh axis '%s' bound to %lld processes on the context (it is %s): "
                       "run `nabla train` under `mpirun -np %lld`%s",
                       axes[i], (long long)sizes[i], axes[i], (long long)sizes[i],
                       axis ? "bound to another count" : "not bound", (long long)(c->mesh.data * (i > 0 ? sizes[i] : 1)),
                       job);
    }
  }
  return NB_OK;
}

/* FSDP, expert and tensor parallelism shard the language model's own
 * parameters; a task's loss, a frozen tree or a linear hook (LoRA,
 * quantization) is not sharded yet. */
static nb_status check_fsdp(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task, const nb_train_graph_opts *go) {
  if (nb_train__shard_count(c) == 1) return NB_OK;
  const char *what = task ? "a task's training (sft, dpo, ...)" : go->frozen_spec ? "a frozen parameter tree (LoRA)"
                     : go->linear_hook                           ? "a linear hook (LoRA, quantization)" : NULL;
  const char *key = c->mesh.fsdp > 1 ? "mesh.fsdp" : c->mesh.expert > 1 ? "mesh.expert" : "mesh.tensor";
  if (what) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "train: %s=%lld with %s is not supported yet: use mesh.data", key,
                             (long long)nb_train__shard_count(c), what);
  return NB_OK;
}

/* The step's or eval's view of a split state (FSDP, expert, tensor
 * parallel): its layout, the blocks' avals (the graph's "params/..." and
 * "opt_state/..." are this process's blocks), the model this process
 * traces and the hooks. FSDP reads each parameter through the gather hook;
 * expert parallel hands the MoE layers their experts' blocks (expert_axis),
 * and eval gathers them (the whole model on every process); tensor parallel
 * traces its share of the heads and d_ff with the collectives of the linear
 * hook (tp.c). The hooks borrow the layout: a sharded stays in place while
 * the graphs are traced. */
typedef struct sharded {
  nb_train__layout layout;
  nb_tree *params, *opt_state; /* new */
  nb_train_config local;       /* the config with this process's model */
  nb_train__gather *gather;
  nb_train__tp_hook *tp;
} sharded;

static void sharded_free(sharded *sh) {
  nb_tree_destroy(sh->params);
  nb_tree_destroy(sh->opt_state);
  nb_train__gather_destroy(sh->gather);
  nb_train__tp_hook_destroy(sh->tp);
  nb_train__layout_free(&sh->layout);
}

static nb_status sharded_setup(nb_ctx *ctx, const nb_train_config *c, const nb_tree *param_spec, const nb_tree *opt_spec,
                               bool eval, sharded *sh, nb_model_trace_opts *mo) {
  memset(sh, 0, sizeof *sh);
  sh->local = *c;
  nb_status s = nb_train__layout_make(ctx, c, param_spec, opt_spec, &sh->layout);
  if (s) return s;
  const char *axis = sh->layout.axis;
  sh->params = nb_train__shard_spec(ctx, &sh->layout, "params", param_spec);
  if (opt_spec) sh->opt_state = nb_train__shard_spec(ctx, &sh->layout, "opt_state", opt_spec);
  if (!sh->params || (opt_spec && !sh->opt_state)) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (!strcmp(axis, "fsdp") || (eval && !strcmp(axis, "expert"))) {
    if (!(sh->gather = nb_train__gather_create(&sh->layout))) return nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory");
    mo->param_hook = nb_train__gather_param, mo->param_ud = sh->gather;
  } else if (!strcmp(axis, "expert")) {
    mo->expert_axis = "expert";
  } else {
    sh->local.model = nb_train__tp_model(&c->model, c->mesh.tensor, sh->layout.tp_attn, sh->layout.tp_mlp);
    if (!(sh->tp = nb_train__tp_hook_create(&sh->layout))) return nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory");
    mo->linear_hook = nb_train__tp_linear, mo->hook_ud = sh->tp;
  }
  return NB_OK;
}

static const nb_train_graph_opts no_extras;

/* The micro-batch loss (rows of a batch) of the task, or the model's LM loss
 * with go's extras (frozen inputs, the linear hook, packed batches). */
static nb_graph *trace_loss(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task, const nb_train_graph_opts *go,
                            const nb_model_trace_opts *mo, const nb_tree *param_spec, int64_t rows) {
  nb_tree *bs = task ? task->batch_spec(task->ud, ctx, c, rows) : batch_spec(ctx, rows, c->data.seq_len, go->packed);
  nb_tree *fs = bs ? nb_tree_create(ctx) : NULL;
  nb_graph *g = NULL;
  if (fs && task && task->frozen && nb_tree_merge(fs, "", task->frozen)) fs = (nb_tree_destroy(fs), NULL);
  if (fs) g = task ? task->trace_loss(task->ud, ctx, c, mo, param_spec, fs, bs)
                   : nb_model_trace_loss(ctx, &c->model, mo, param_spec, bs);
  nb_tree_destroy(bs);
  nb_tree_destroy(fs);
  return g;
}

static bool task_ok(nb_ctx *ctx, const nb_train_task *task) {
  if (!task || (task->batch_spec && task->trace_loss && task->open_data)) return true;
  nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: task '%s' lacks batch_spec, trace_loss or open_data",
            task->name ? task->name : "?");
  return false;
}

/* The step of a task (NULL: language modeling) with go's extras (NULL: none). */
static nb_graph *trace_step(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task, const nb_train_graph_opts *go,
                            const nb_tree *param_spec, const nb_tree *opt_state_spec) {
  if (!c || !param_spec || !opt_state_spec)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train step: NULL config or spec"), NULL;
  if (!go) go = &no_extras;
  if (nb_train_config_validate(ctx, c) || check_supported(ctx, c) || !task_ok(ctx, task) || check_fsdp(ctx, c, task, go))
    return NULL;
  bool dropout = c->model.dropout > 0 || c->model.attn_dropout > 0;
  nb_model_trace_opts mo = {.train = dropout, .remat = c->remat == NB_TRAIN_REMAT_BLOCK, .dtype = NB_F32,
                            .linear_hook = go->linear_hook, .hook_ud = go->hook_ud, .frozen_spec = go->frozen_spec};
  sharded *sh = NULL; /* FSDP, expert, tensor parallel: the step's params and opt_state are this process's blocks */
  if (nb_train__shard_count(c) > 1) {
    if (!(sh = malloc(sizeof *sh))) return nb_errorf(ctx, NB_ERR_NOMEM, "train step: out of memory"), NULL;
    if (sharded_setup(ctx, c, param_spec, opt_state_spec, false, sh, &mo)) {
      sharded_free(sh);
      free(sh);
      return NULL;
    }
    param_spec = sh->params, opt_state_spec = sh->opt_state;
  }
  nb_graph *loss = trace_loss(ctx, sh ? &sh->local : c, task, go, &mo, param_spec, c->batch_size / c->grad_accum);
  nb_graph *vg = loss ? nb_value_and_grad(ctx, loss, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  nb_val *hp = NULL, *hpo = NULL;
  nb_optim_tx *tx = vg ? optimizer(ctx, c, &hp) : NULL;
  if (tx) tx = nb_optim_tx_from_input(ctx, tx, &hpo);
  nb_optim_schedule *lr = tx ? bound_schedule(ctx, c, &hp) : NULL;
  nb_tree *hparams = lr ? nb_tree_create(ctx) : NULL;
  nb_graph *g = NULL;
  nb_tree *bs = NULL, *spec = hparams && !nb_train_set_hparams(ctx, c, hparams) ? nb_tree_create(ctx) : NULL;
  const nb_tree *frozen = task && task->frozen && nb_tree_size(task->frozen) > 0 ? task->frozen : go->frozen_spec;
  if (spec && !nb_tree_merge(spec, "params", param_spec) && !nb_tree_merge(spec, "opt_state", opt_state_spec) &&
      !(frozen && nb_tree_merge(spec, "frozen", frozen)) &&
      !nb_tree_merge(spec, "", hparams) && !nb_tree_set(spec, "step", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)))) {
    int64_t rows = c->batch_size / nb_train__batch_procs(c); /* this process's rows */
    bs = task ? task->batch_spec(task->ud, ctx, c, rows) : batch_spec(ctx, rows, c->data.seq_len, go->packed);
    if (bs && !nb_tree_merge(spec, "batch", bs)) {
      step_job job = {.cfg = c, .vg = vg, .tx = tx, .lr = lr, .hp = &hp, .hpo = &hpo, .rng = dropout,
                      .layout = sh ? &sh->layout : NULL};
      g = nb_trace(ctx, step_fn, &job, spec);
    }
  }
  nb_tree_destroy(hparams);
  nb_tree_destroy(spec);
  nb_tree_destroy(bs);
  nb_graph_destroy(loss);
  nb_graph_destroy(vg);
  nb_optim_tx_destroy(tx);
  nb_optim_schedule_destroy(lr);
  if (sh) sharded_free(sh);
  free(sh);
  return g;
}

nb_graph *nb_train_trace_step(nb_ctx *ctx, const nb_train_config *c, const nb_tree *param_spec,
                              const nb_tree *opt_state_spec) {
  return trace_step(ctx, c, NULL, NULL, param_spec, opt_state_spec);
}

nb_graph *nb_train_trace_task_step(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task,
                                   const nb_tree *param_spec, const nb_tree *opt_state_spec) {
  return trace_step(ctx, c, task, NULL, param_spec, opt_state_spec);
}

nb_graph *nb_train_trace_step_opts(nb_ctx *ctx, const nb_train_config *c, const nb_train_graph_opts *go,
                                   const nb_tree *param_spec, const nb_tree *opt_state_spec) {
  return trace_step(ctx, c, NULL, go, param_spec, opt_state_spec);
}

static nb_graph *trace_eval(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task, const nb_train_graph_opts *go,
                            const nb_tree *param_spec) {
  if (!c || !param_spec) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train eval: NULL config or spec"), NULL;
  if (!go) go = &no_extras;
  if (nb_train_config_validate(ctx, c) || check_supported(ctx, c) || !task_ok(ctx, task) || check_fsdp(ctx, c, task, go))
    return NULL;
  nb_model_trace_opts mo = {.train = false, .dtype = NB_F32, .linear_hook = go->linear_hook, .hook_ud = go->hook_ud,
                            .frozen_spec = go->frozen_spec};
  if (nb_train__shard_count(c) == 1) return trace_loss(ctx, c, task, go, &mo, param_spec, c->batch_size);
  /* the whole batch on every process: FSDP and expert parallel on parameters gathered from the blocks, tensor
   * parallel on the model split as in the step */
  sharded *sh = malloc(sizeof *sh);
  if (!sh) return nb_errorf(ctx, NB_ERR_NOMEM, "train eval: out of memory"), NULL;
  nb_graph *g = sharded_setup(ctx, c, param_spec, NULL, true, sh, &mo) ? NULL
                : trace_loss(ctx, &sh->local, task, go, &mo, sh->params, c->batch_size);
  sharded_free(sh);
  free(sh);
  return g;
}

nb_graph *nb_train_trace_task_eval(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task,
                                   const nb_tree *param_spec) {
  return trace_eval(ctx, c, task, NULL, param_spec);
}

nb_graph *nb_train_trace_eval(nb_ctx *ctx, const nb_train_config *c, const nb_tree *param_spec) {
  return trace_eval(ctx, c, NULL, NULL, param_spec);
}

nb_graph *nb_train_trace_eval_opts(nb_ctx *ctx, const nb_train_config *c, const nb_train_graph_opts *go,
                                   const nb_tree *param_spec) {
  return trace_eval(ctx, c, NULL, go, param_spec);
}
