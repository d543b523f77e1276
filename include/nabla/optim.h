/* nabla optim: gradient transformations, optimizers, schedules, losses and
 * tree utilities (the analogue of Optax).
 *
 * Everything numerical is traced: a gradient transformation (nb_optim_tx)
 * has an `init` that maps a tree of parameter values to a tree of state
 * values, and an `update` that maps (grads, state, params) to (updates, new
 * state), all trees of nb_val in one graph. So an optimizer step traces into
 * the same graph as the gradient computation and compiles with it.
 *
 * State trees have stable paths, so checkpoints store them by name:
 *   scale_by_adam:   "count", "mu/<param path>", "nu/<param path>"
 *   chain(a, b):     "0/<a's paths>", "1/<b's paths>"
 *   wrappers:        "inner/<...>" plus their own leaves (named per function)
 * Counters are i32 scalars; moments have the parameter's dtype.
 *
 * Host conveniences run init/update through the reference interpreter
 * (nb_optim_init_arrays, nb_optim_update_arrays, nb_optim_step_graph).
 *
 * Example: AdamW with a warmup-cosine learning rate, one step on host arrays.
 *
 *   nb_optim_schedule *lr = nb_optim_warmup_cosine_decay(ctx, 0, 3e-4, 100, 10000, 3e-5, 1);
 *   nb_optim_tx *tx = nb_optim_chain(ctx, 2, (nb_optim_tx *[]){
 *       nb_optim_clip_by_global_norm(ctx, 1.0),
 *       nb_optim_adamw(ctx, lr, 0.9, 0.999, 1e-8, 0.1, NULL)});
 *   nb_tree *state = nb_optim_init_arrays(ctx, tx, params);     // arrays
 *   nb_tree *new_params = NULL, *new_state = NULL;
 *   nb_optim_update_arrays(ctx, tx, grads, state, params, &new_params, &new_state);
 *   ...
 *   nb_optim_tx_destroy(tx);                                    // and lr with it
 *
 * Inside a traced step the same tx is used with nb_optim_init/nb_optim_update
 * on trees of values, followed by nb_optim_apply_updates.
 *
 * Ownership: constructors that receive a transformation or schedule *take* it
 * (it is destroyed with the new object, and also when the constructor fails),
 * so nested calls never leak. A NULL argument that comes from a failed inner
 * constructor keeps that constructor's error message.
 */
#ifndef NABLA_OPTIM_H
#define NABLA_OPTIM_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

typedef struct nb_optim_tx nb_optim_tx;
typedef struct nb_optim_schedule nb_optim_schedule;

/* ------------------------------------------------------------------------ */
/* Schedules: a function of the step, on the host and traced                 */
/* ------------------------------------------------------------------------ */

/* All schedules return a new object (NULL with an error for negative, NaN or
 * inconsistent arguments). Steps count from 0. */
nb_optim_schedule *nb_optim_constant(nb_ctx *ctx, double value);
/* init -> end linearly over transition_steps, starting at transition_begin. */
nb_optim_schedule *nb_optim_linear(nb_ctx *ctx, double init, double end, int64_t transition_steps,
                                   int64_t transition_begin);
nb_optim_schedule *nb_optim_polynomial(nb_ctx *ctx, double init, double end, double power, int64_t transition_steps,
                                       int64_t transition_begin);
/* init * rate^((step - begin) / transition_steps), floored exponent with
 * staircase; clipped at end_value unless end_value is NaN (no bound). */
nb_optim_schedule *nb_optim_exponential_decay(nb_ctx *ctx, double init, int64_t transition_steps, double decay_rate,
                                              int64_t transition_begin, bool staircase, double end_value);
/* init * ((1 - alpha) * (0.5 (1 + cos(pi min(step, decay_steps) / decay_steps)))^exponent + alpha) */
nb_optim_schedule *nb_optim_cosine_decay(nb_ctx *ctx, double init, int64_t decay_steps, double alpha, double exponent);
/* linear init -> peak over warmup_steps, then cosine peak -> end_value until
 * decay_steps (counted from step 0, warmup included). */
nb_optim_schedule *nb_optim_warmup_cosine_decay(nb_ctx *ctx, double init, double peak, int64_t warmup_steps,
                                                int64_t decay_steps, double end_value, double exponent);
nb_optim_schedule *nb_optim_warmup_constant(nb_ctx *ctx, double init, double peak, int64_t warmup_steps);
/* init, multiplied by scales[i] from step boundaries[i] on (boundaries
 * increasing). Arrays borrowed. */
nb_optim_schedule *nb_optim_piecewise_constant(nb_ctx *ctx, double init, int n, const int64_t *boundaries,
                                               const double *scales);
/* One-cycle policies as Optax (defaults there: pct_start 0.3, pct_final
 * 0.85, div_factor 25, final_div_factor 1e4). */
nb_optim_schedule *nb_optim_linear_onecycle(nb_ctx *ctx, int64_t transition_steps, double peak, double pct_start,
                                            double pct_final, double div_factor, double final_div_factor);
nb_optim_schedule *nb_optim_cosine_onecycle(nb_ctx *ctx, int64_t transition_steps, double peak, double pct_start,
                                            double div_factor, double final_div_factor);
/* schedules[0] before boundaries[0], then schedules[i + 1](step -
 * boundaries[i]) from boundaries[i] on. Takes the n schedules; n - 1
 * boundaries (borrowed). */
nb_optim_schedule *nb_optim_join_schedules(nb_ctx *ctx, int n, nb_optim_schedule **schedules,
                                           const int64_t *boundaries);
/* SGDR: warm restarts, one warmup-cosine cycle after another. */
typedef struct nb_optim_sgdr_cycle {
  double init, peak, end_value;
  int64_t warmup_steps, decay_steps;
} nb_optim_sgdr_cycle;
nb_optim_schedule *nb_optim_sgdr(nb_ctx *ctx, int n, const nb_optim_sgdr_cycle *cycles);

/* The value at `step` on the host, in double precision. */
double nb_optim_schedule_eval(const nb_optim_schedule *s, double step);
/* The value at a traced step (an integer or float scalar) as a traced scalar
 * in step's graph: f64 for an f64 step, else f32. The transformations pass
 * their step in f64 when a gradient leaf is f64, so schedules follow the
 * parameters' precision. */
nb_val *nb_optim_schedule_trace(const nb_optim_schedule *s, nb_val *step);
/* Hyper-parameters as runtime inputs. A schedule traced in the graph of
 * *cell (set *cell before tracing: a 1-D f64 input of that graph) takes
 * every number of its formula (the learning rate, warmup and decay lengths,
 * ...) from that vector instead of baking them in as constants, so graphs
 * for different numbers are the same graph (one compile, one disk cache
 * entry), except where a number picks the formula (a zero warmup, steps <= 0
 * or a decay rate of 0 or 1 in exponential decay); anywhere else, and on the
 * host, it is `inner`. The values are those the constants would have had:
 * bit-identical results for f32 and f64 steps (tests/train/test_hparams.c;
 * bf16/f16 leaves are not tested). Takes inner.
 * Borrows cell: it must outlive the schedule, and *cell must be NULL or a
 * value of a live graph whenever the schedule is traced or evaluated. */
nb_optim_schedule *nb_optim_schedule_from_input(nb_ctx *ctx, nb_optim_schedule *inner, nb_val *const *cell);
/* The vector an input-bound schedule (or s itself, bound) reads (new f64
 * [n], converted where used as the constants would be): feed it as the
 * input *cell names. */
nb_array *nb_optim_schedule_inputs(nb_ctx *ctx, const nb_optim_schedule *s);
/* True when the value does not depend on the step. */
bool nb_optim_schedule_is_constant(const nb_optim_schedule *s);
void nb_optim_schedule_destroy(nb_optim_schedule *s); /* NULL ok */

/* ------------------------------------------------------------------------ */
/* Gradient transformations                                                  */
/* ------------------------------------------------------------------------ */

/* Traced init and update of a transformation. All trees hold nb_val leaves
 * of graph g. init fills `state` (an empty tree). update fills `updates` (same
 * paths as grads) and `new_state` (same paths as state); params may be NULL
 * for transformations that do not need them. */
typedef nb_status (*nb_optim_init_fn)(void *ud, nb_graph *g, const nb_tree *params, nb_tree *state);
typedef nb_status (*nb_optim_update_fn)(void *ud, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                                        const nb_tree *params, nb_tree *updates, nb_tree *new_state);
/* A user-defined transformation; `free_ud(ud)` (optional) runs on destroy. */
nb_optim_tx *nb_optim_tx_create(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                                void *ud, void (*free_ud)(void *ud));
void nb_optim_tx_destroy(nb_optim_tx *tx); /* NULL ok; destroys what it took */
const char *nb_optim_tx_name(const nb_optim_tx *tx);

/* Traced entry points. update checks that grads and params (when given) have
 * the same paths, dtypes and shapes, and that state has the paths init
 * gives, and reports the first difference. Errors go to the graph's context. */
nb_status nb_optim_init(const nb_optim_tx *tx, nb_graph *g, const nb_tree *params, nb_tree *state);
nb_status nb_optim_update(const nb_optim_tx *tx, nb_graph *g, const nb_tree *grads, const nb_tree *state,
                          const nb_tree *params, nb_tree *updates, nb_tree *new_state);
/* new_params = params + updates (updates converted to each param's dtype). */
nb_status nb_optim_apply_updates(nb_graph *g, const nb_tree *params, const nb_tree *updates, nb_tree *new_params);

/* Host conveniences (reference interpreter). params/grads/state: trees of
 * arrays (borrowed). Return new trees of arrays (the caller destroys them),
 * or NULL / an error status. */
nb_tree *nb_optim_init_arrays(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *params);
nb_status nb_optim_update_arrays(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *grads, const nb_tree *state,
                                 const nb_tree *params, nb_tree **new_params, nb_tree **new_state);
/* The traced step graph for reuse across steps: inputs "params/<p>",
 * "grads/<p>", "state/<s>"; outputs "params/<p>" (updated) and "state/<s>".
 * params and state may hold arrays, values or avals (only avals are used). */
nb_graph *nb_optim_step_graph(nb_ctx *ctx, const nb_optim_tx *tx, const nb_tree *params, const nb_tree *state);
/* Sets a scalar leaf of a state tree of arrays in place (for injected
 * hyperparameters: path "hyperparams/learning_rate", possibly under a chain
 * prefix), keeping its dtype. Reads are nb_tree_get_array + nb_array_get. */
nb_status nb_optim_state_set_scalar(nb_ctx *ctx, nb_tree *state, const char *path, double value);

/* Input-bound hyperparameters: binds tx (taken and returned) so that the
 * numbers of its built-in blocks listed below are read from the f64 vector
 * at *cell when that is a value of the graph being traced (a graph input),
 * instead of being constants: graphs that differ only in those numbers are
 * one graph (one compile). Each number (and 1 - b of a decay) is computed
 * in f64 and rounded once to the leaf's dtype, as the constant is:
 * bit-identical results for f32 and f64 leaves (tests/train/test_hparams.c;
 * bf16/f16 leaves, where a constant rounds through f32 first, are not tested). Anywhere else (another graph, *cell NULL) the
 * numbers are the constants. The blocks: scale (and so a constant learning
 * rate, folded into one: u = -lr g), scale_by_adam (b1, b2, eps, eps_root;
 * adam, adamw, amsgrad, nadam(w), lamb), add_decayed_weights, trace
 * (momentum), clip_by_global_norm; every other block keeps constants.
 * Whether a weight decay or momentum is 0, and which blocks there are,
 * still shape the graph. The state is the same as unbound. Borrows cell, as
 * nb_optim_schedule_from_input does (same lifetime rule). */
nb_optim_tx *nb_optim_tx_from_input(nb_ctx *ctx, nb_optim_tx *tx, nb_val *const *cell);
/* The vector a bound tx reads (new f64 [n]: the listed blocks' numbers, each
 * block before its kids, in chain order): feed it as the input *cell names.
 * The values are the constructors' (already validated). */
nb_array *nb_optim_tx_inputs(nb_ctx *ctx, const nb_optim_tx *tx);

/* Composition. chain applies txs in order (n >= 1); takes them. */
nb_optim_tx *nb_optim_chain(nb_ctx *ctx, int n, nb_optim_tx *const *txs);

/* Building blocks (Optax's names; updates u, gradients g). */
nb_optim_tx *nb_optim_identity(nb_ctx *ctx);
nb_optim_tx *nb_optim_scale(nb_ctx *ctx, double factor);                   /* u = factor g */
/* u = -lr(count) g; takes lr. State "count" when lr is not constant. */
nb_optim_tx *nb_optim_scale_by_learning_rate(nb_ctx *ctx, nb_optim_schedule *lr);
/* u = s(count) g, without the sign flip; takes s. State "count". */
nb_optim_tx *nb_optim_scale_by_schedule(nb_ctx *ctx, nb_optim_schedule *s);
/* Adam's direction. amsgrad keeps the running maximum "nu_max"; nesterov
 * uses Nesterov momentum (NAdam). */
nb_optim_tx *nb_optim_scale_by_adam(nb_ctx *ctx, double b1, double b2, double eps, double eps_root, bool nesterov,
                                    bool amsgrad);
nb_optim_tx *nb_optim_scale_by_adamax(nb_ctx *ctx, double b1, double b2, double eps);
nb_optim_tx *nb_optim_scale_by_radam(nb_ctx *ctx, double b1, double b2, double eps, double eps_root,
                                     double threshold);
/* u = g / sqrt(nu + eps) with nu an EMA of g^2 started at initial_scale. */
nb_optim_tx *nb_optim_scale_by_rms(nb_ctx *ctx, double decay, double eps, double initial_scale);
/* u = g / sqrt(nu - mu^2 + eps) (centered RMS). */
nb_optim_tx *nb_optim_scale_by_stddev(nb_ctx *ctx, double decay, double eps, double initial_scale);
/* Momentum: trace = g + decay trace; u = trace (or g + decay trace, nesterov). */
nb_optim_tx *nb_optim_trace(nb_ctx *ctx, double decay, bool nesterov);
nb_optim_tx *nb_optim_scale_by_lion(nb_ctx *ctx, double b1, double b2);
nb_optim_tx *nb_optim_scale_by_rss(nb_ctx *ctx, double initial_accumulator, double eps); /* Adagrad */
nb_optim_tx *nb_optim_scale_by_adadelta(nb_ctx *ctx, double rho, double eps);
/* Trust ratio ||param|| / ||u|| per leaf (1 where either norm is 0). */
nb_optim_tx *nb_optim_scale_by_trust_ratio(nb_ctx *ctx, double min_norm, double trust_coefficient, double eps);
/* Adafactor's factored second moments for rank >= 2 leaves whose two last
 * dims are >= min_dim_size_to_factor; full moments otherwise. decay_rate:
 * decay = 1 - (count + 1)^-decay_rate. */
nb_optim_tx *nb_optim_scale_by_factored_rms(nb_ctx *ctx, bool factored, double decay_rate, double step_offset,
                                            int64_t min_dim_size_to_factor, double epsilon);
/* u = g + weight_decay * param, on the leaves matched by mask_regex (NULL:
 * all). */
nb_optim_tx *nb_optim_add_decayed_weights(nb_ctx *ctx, double weight_decay, const char *mask_regex);
nb_optim_tx *nb_optim_clip(nb_ctx *ctx, double max_delta);                /* clamp to [-max, max] */
nb_optim_tx *nb_optim_clip_by_global_norm(nb_ctx *ctx, double max_norm);
nb_optim_tx *nb_optim_clip_by_block_rms(nb_ctx *ctx, double threshold);    /* per leaf */
/* Adaptive gradient clipping: a unit's gradient norm is capped at clipping *
 * max(its parameter norm, eps). Units as Optax: the whole leaf for (squeezed)
 * rank <= 1, columns (norm over axis 0) for rank 2 and 3, the last axis's
 * slices (norm over the others) for rank 4 and 5; other ranks are an error. */
nb_optim_tx *nb_optim_adaptive_grad_clip(nb_ctx *ctx, double clipping, double eps);
/* EMA of the incoming updates (apply to parameters to keep their EMA):
 * state "count", "ema/<p>"; debias divides by 1 - decay^count. */
nb_optim_tx *nb_optim_ema(nb_ctx *ctx, double decay, bool debias);
nb_optim_tx *nb_optim_zero_nans(nb_ctx *ctx);                              /* state "found_nan/<p>" */
nb_optim_tx *nb_optim_set_to_zero(nb_ctx *ctx);                            /* freeze */

/* Wrappers. masked: inner sees only the leaves matched by the regex (or by
 * pred, when regex is NULL); the others pass through unchanged. State
 * "inner/<...>". Takes inner. */
typedef bool (*nb_optim_path_pred)(void *ud, const char *path);
nb_optim_tx *nb_optim_masked(nb_ctx *ctx, nb_optim_tx *inner, const char *regex, nb_optim_path_pred pred, void *ud);
/* multi_transform: label(ud, path) returns an index in [0, n) choosing
 * txs[index] for the leaf; state "<index>/<...>". Takes the txs. */
typedef int (*nb_optim_label_fn)(void *ud, const char *path);
nb_optim_tx *nb_optim_multi_transform(nb_ctx *ctx, int n, nb_optim_tx *const *txs, nb_optim_label_fn label,
                                      void *ud);
/* Same with labels by regex: a leaf goes to the first regexes[i] it matches
 * (a leaf matching none is an error at init). Regexes borrowed. */
nb_optim_tx *nb_optim_multi_transform_regex(nb_ctx *ctx, int n, nb_optim_tx *const *txs,
                                            const char *const *regexes);
/* Gradient accumulation over k micro-steps: updates are zero except every
 * k-th step, which applies inner to the mean of the k gradients. State
 * "mini_step", "gradient_step", "acc_grads/<p>", "inner/<...>". */
nb_optim_tx *nb_optim_multi_steps(nb_ctx *ctx, nb_optim_tx *inner, int64_t every_k);
/* Skips steps whose gradients hold NaN/Inf (zero updates, inner state kept),
 * unless more than max_consecutive_errors happened in a row. State
 * "notfinite_count", "last_finite", "total_notfinite", "inner/<...>". */
nb_optim_tx *nb_optim_apply_if_finite(nb_ctx *ctx, nb_optim_tx *inner, int64_t max_consecutive_errors);
/* Lookahead: params are the fast weights; the slow weights live in state
 * "slow/<p>"; every sync_period steps slow += alpha (fast - slow) and the
 * fast weights are reset to slow. State "steps", "slow/<p>", "inner/<...>". */
nb_optim_tx *nb_optim_lookahead(nb_ctx *ctx, nb_optim_tx *inner, int64_t sync_period, double slow_step_size);
/* inject_hyperparams: make(ctx, hp, ud) builds the inner transformation from
 * n schedules hp[i] that read "hyperparams/<names[i]>" (f32) of the state;
 * the factory takes them. A constant values[i] is stored at init and
 * changeable from the host between steps (nb_optim_state_set_scalar); other
 * schedules are evaluated at "count" every step and stored. Takes values;
 * names borrowed. */
typedef nb_optim_tx *(*nb_optim_factory)(nb_ctx *ctx, nb_optim_schedule *const *hp, void *ud);
nb_optim_tx *nb_optim_inject_hyperparams(nb_ctx *ctx, nb_optim_factory make, void *ud, int n,
                                         const char *const *names, nb_optim_schedule *const *values);

/* Optimizers (one call each; they take lr). weight_decay_mask: a regex of
 * the paths that decay (NULL: all). */
nb_optim_tx *nb_optim_sgd(nb_ctx *ctx, nb_optim_schedule *lr, double momentum, bool nesterov);
nb_optim_tx *nb_optim_adam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps);
nb_optim_tx *nb_optim_adamw(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                            double weight_decay, const char *weight_decay_mask);
nb_optim_tx *nb_optim_amsgrad(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps);
nb_optim_tx *nb_optim_nadam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps);
nb_optim_tx *nb_optim_nadamw(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                             double weight_decay, const char *weight_decay_mask);
nb_optim_tx *nb_optim_adamax(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps);
nb_optim_tx *nb_optim_radam(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                            double threshold);
nb_optim_tx *nb_optim_rmsprop(nb_ctx *ctx, nb_optim_schedule *lr, double decay, double eps, double initial_scale,
                              bool centered, double momentum, bool nesterov);
nb_optim_tx *nb_optim_adagrad(nb_ctx *ctx, nb_optim_schedule *lr, double initial_accumulator, double eps);
nb_optim_tx *nb_optim_adadelta(nb_ctx *ctx, nb_optim_schedule *lr, double rho, double eps, double weight_decay);
/* Adafactor with Optax's defaults apart from lr: factored, decay_rate 0.8,
 * clipping_threshold 1 (NaN: off), momentum off (NaN) or b1, eps 1e-30,
 * multiply_by_parameter_scale, weight_decay_rate (0: off). */
nb_optim_tx *nb_optim_adafactor(nb_ctx *ctx, nb_optim_schedule *lr, int64_t min_dim_size_to_factor,
                                double decay_rate, double clipping_threshold, double momentum,
                                bool multiply_by_parameter_scale, double eps, double weight_decay_rate);
nb_optim_tx *nb_optim_lamb(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double eps,
                           double weight_decay, const char *weight_decay_mask);
nb_optim_tx *nb_optim_lars(nb_ctx *ctx, nb_optim_schedule *lr, double weight_decay, const char *weight_decay_mask,
                           double trust_coefficient, double eps, double momentum, bool nesterov);
nb_optim_tx *nb_optim_lion(nb_ctx *ctx, nb_optim_schedule *lr, double b1, double b2, double weight_decay,
                           const char *weight_decay_mask);
/* Muon (Optax's contrib.muon defaults): for 2-D leaves, Nesterov momentum
 * (beta) orthogonalized by ns_steps Newton-Schulz iterations (quintic
 * coefficients 3.4445, -4.7750, 2.0315) after Frobenius normalization,
 * scaled by sqrt(max(1, cols/rows)), plus weight_decay * param; other leaves
 * use NAdam(adam_b1, adam_b2, eps) with the same lr. State "muon/count",
 * "muon/mu/<p>", "adam/<...>". */
nb_optim_tx *nb_optim_muon(nb_ctx *ctx, nb_optim_schedule *lr, double beta, int ns_steps, double eps,
                           double adam_b1, double adam_b2, double weight_decay);

/* ------------------------------------------------------------------------ */
/* Losses (traced; per-example results, reduce as you like)                  */
/* ------------------------------------------------------------------------ */

/* -sum(labels * log_softmax(logits)) over the last axis. */
nb_val *nb_optim_softmax_cross_entropy(nb_val *logits, nb_val *labels);
/* logits [..., C], labels integer [...]. weights (optional, [...]) multiply
 * the result (a 0/1 mask, say); label_smoothing spreads that much mass
 * uniformly; z_loss adds z_loss * logsumexp^2. Labels outside [0, C) give
 * a loss of logsumexp (no target mass). */
nb_val *nb_optim_softmax_cross_entropy_int(nb_val *logits, nb_val *labels, nb_val *weights, double label_smoothing,
                                           double z_loss);
nb_val *nb_optim_sigmoid_binary_cross_entropy(nb_val *logits, nb_val *labels);
nb_val *nb_optim_sigmoid_focal_loss(nb_val *logits, nb_val *labels, double alpha, double gamma); /* alpha<0: none */
nb_val *nb_optim_l2_loss(nb_val *predictions, nb_val *targets);        /* 0.5 (p - t)^2 */
nb_val *nb_optim_squared_error(nb_val *predictions, nb_val *targets);  /* (p - t)^2 */
nb_val *nb_optim_huber_loss(nb_val *predictions, nb_val *targets, double delta);
nb_val *nb_optim_log_cosh(nb_val *predictions, nb_val *targets);
nb_val *nb_optim_hinge_loss(nb_val *scores, nb_val *labels);           /* labels in {-1, 1} */
nb_val *nb_optim_cosine_similarity(nb_val *predictions, nb_val *targets, double eps); /* last axis */
nb_val *nb_optim_cosine_distance(nb_val *predictions, nb_val *targets, double eps);
/* sum(targets * (log targets - log_predictions)) over the last axis (0 log 0 = 0). */
nb_val *nb_optim_kl_divergence(nb_val *log_predictions, nb_val *targets);
nb_val *nb_optim_log_softmax(nb_val *logits);                          /* last axis */
nb_val *nb_optim_logsumexp(nb_val *x);                                 /* nb_logsumexp over the last axis */

/* ------------------------------------------------------------------------ */
/* Tree utilities (traced; trees of nb_val; results are new trees)           */
/* ------------------------------------------------------------------------ */

/* Scalars in f64 when a leaf is f64, else f32; 0 for an empty tree. */
nb_val *nb_optim_global_norm(nb_graph *g, const nb_tree *t);
nb_val *nb_optim_tree_vdot(nb_graph *g, const nb_tree *a, const nb_tree *b);
nb_tree *nb_optim_tree_add(nb_graph *g, const nb_tree *a, const nb_tree *b);
nb_tree *nb_optim_tree_sub(nb_graph *g, const nb_tree *a, const nb_tree *b);
nb_tree *nb_optim_tree_scale(nb_graph *g, const nb_tree *t, nb_val *s);   /* s: any float scalar */
nb_tree *nb_optim_tree_zeros_like(nb_graph *g, const nb_tree *t);

NB_END_DECLS
#endif /* NABLA_OPTIM_H */
