/* nabla train: the trainer (the analogue of MaxText's train loop). One call
 * runs a whole training from a validated run configuration
 * (nb_train_config, below) into a run directory.
 *
 * The step is one traced graph: the model loss (nb_model_trace_loss) under
 * value_and_grad w.r.t. the parameters, summed over grad_accum micro-batches
 * (row slices of the batch, inside the graph), the global gradient norm, the
 * optimizer from cfg.optim / cfg.schedule (clip_by_global_norm, then AdamW,
 * Adam or SGD whose learning rate is traced from the step counter), compiled
 * once by nb_jit with the parameters and optimizer state donated, so each
 * run updates them in place. Inputs "params/<p>", "opt_state/<s>",
 * "batch/inputs", "batch/targets" (i32 [batch_size, seq_len]), "step"
 * (i32 scalar: updates done before this one), "hparams/schedule" (the
 * learning-rate schedule's numbers), "hparams/optim" (the optimizer's:
 * b1, b2, eps, weight_decay, momentum, grad_clip, a constant lr) and
 * "hparams/key" (the seed's PRNG key), all set by nb_train_set_hparams: a
 * run that differs only in those numbers, steps, the schedule's lengths and
 * ratio or the seed runs the same compiled step; outputs the same
 * "params/<p>", "opt_state/<s>" plus "loss", "grad_norm", "lr" and
 * "metrics/<name>" (the model's). Dropout draws from
 * fold_in(PRNGKey(seed), step) (and the micro-batch index), so a resumed run
 * repeats an uninterrupted one bit for bit. Nothing in the step is host
 * code: only batches, the step scalar and the hparams come from the host.
 * Still part of the step (a change compiles a new one): optim.name, the
 * schedule's kind, whether there is a warmup, and whether grad_clip,
 * weight_decay or momentum is 0.
 *
 * Run directory (docs/train.md has the full contract):
 *   DIR/config.yaml     the resolved config (nb_train_config_write),
 *                       written once the run is accepted (never by a refused one)
 *   DIR/metrics.jsonl   one JSON object per logged step, eval records
 *   DIR/checkpoints/    nb_ckpt manager: items "params", "opt_state";
 *                       metadata {"step", "seed", "data_state", "data" (what
 *                       the data position depends on), "config", ...}
 *   DIR/data/           text inputs tokenized into cached token shards
 *   DIR/events.out.tfevents.*  TensorBoard scalars (train/loss, train/lr,
 *                       train/grad_norm, train/tokens_per_s, train/mfu, eval/loss)
 *   DIR/report.html     nb_prof_report_html of metrics.jsonl
 * Running again on the same DIR resumes from the latest good checkpoint (a
 * damaged one is set aside as step_N.damaged); other training tokens,
 * batch_size, data.seq_len or seed than the checkpoint's are refused unless
 * cfg.resume.allow_data_change. A non-finite loss or gradient norm is
 * handled per cfg.on_nonfinite (default: stop with NB_ERR_NUMERIC); a
 * non-finite state is never checkpointed.
 *
 * Example:
 *
 *   nb_train_config cfg;
 *   nb_train_config_load(ctx, "configs/gpt2_tiny.yaml", 0, NULL, &cfg);
 *   nb_train_opts o = {.run_dir = "runs/tiny", .handle_signals = true};
 *   nb_train_result r;
 *   if (nb_train_run(ctx, &cfg, &o, &r) != NB_OK) fprintf(stderr, "%s\n", nb_ctx_error(ctx));
 */
#ifndef NABLA_TRAIN_H
#define NABLA_TRAIN_H

#include "nabla/export.h"
#include "nabla/core.h"
#include "nabla/data.h"
#include "nabla/models.h"
#include "nabla/optim.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Run configuration: the YAML file the trainer reads                        */
/* (model: the architecture, nb_model_config in models.h; the rest: the run)  */
/* ------------------------------------------------------------------------ */

typedef enum nb_train_optim { NB_TRAIN_OPTIM_ADAMW, NB_TRAIN_OPTIM_ADAM, NB_TRAIN_OPTIM_SGD, NB_TRAIN_OPTIM_COUNT } nb_train_optim;
typedef enum nb_train_schedule_kind { NB_TRAIN_SCHEDULE_CONSTANT, NB_TRAIN_SCHEDULE_LINEAR, NB_TRAIN_SCHEDULE_COSINE, NB_TRAIN_SCHEDULE_COUNT } nb_train_schedule_kind;
typedef enum nb_train_remat { NB_TRAIN_REMAT_NONE, NB_TRAIN_REMAT_BLOCK, NB_TRAIN_REMAT_COUNT } nb_train_remat;
/* What the trainer does after a step with a non-finite loss or gradient norm:
 * stop with an error (nothing of it saved), skip (the update is not applied),
 * or continue (logged; a non-finite state is still never checkpointed). */
typedef enum nb_train_on_nonfinite { NB_TRAIN_NONFINITE_STOP, NB_TRAIN_NONFINITE_SKIP, NB_TRAIN_NONFINITE_CONTINUE, NB_TRAIN_NONFINITE_COUNT } nb_train_on_nonfinite;

#define NB_TRAIN_STR_MAX 512
#define NB_TRAIN_RULES_MAX 4096 /* mesh.rules as text */

typedef struct nb_train_config {
  char preset[64];         /* the model preset the file started from */
  nb_model_config model;
  /* Start from existing weights (nb_train_init_from): a run dir, a
   * checkpoint (a step dir or a checkpoint manager dir) or a Hugging Face
   * directory; "": a fresh init from seed. */
  char init_from[NB_TRAIN_STR_MAX];
  /* Which model.* keys the file or the overrides set (bit i: the i-th
   * model key of the key table in src/train/config.c; model.preset sets
   * all): with init_from, those must agree with the source's model. */
  uint64_t model_keys_set;
  struct {
    char train[NB_TRAIN_STR_MAX], eval[NB_TRAIN_STR_MAX]; /* token shard / record paths */
    char tokenizer[NB_TRAIN_STR_MAX];                      /* "" : byte level */
    int64_t seq_len;
    bool pack;
    int64_t workers;
  } data;
  struct {
    nb_train_optim name;
    double lr, b1, b2, eps, weight_decay, grad_clip, momentum; /* grad_clip 0: none */
  } optim;
  struct {
    nb_train_schedule_kind kind;
    int64_t warmup_steps, decay_steps; /* decay_steps 0: steps - warmup_steps */
    double min_lr_ratio;
  } schedule;
  struct {
    nb_dtype params, compute; /* f32 or bf16 */
  } precision;
  nb_train_remat remat;
  int64_t batch_size, grad_accum, steps, eval_every, eval_steps, log_every;
  struct {
    /* processes the batch is split over (data parallel): the context must
     * bind the mesh axis "data" to that many processes (nb_dist_mesh_bind;
     * `nabla train` under mpirun does). batch_size and grad_accum are the
     * whole job's; each process runs grad_accum / data micro-batches. */
    int64_t data;
    /* processes the parameters and optimizer state are sharded over
     * (FSDP, ZeRO-3; docs/dist.md): each holds rows [r n, (r+1) n) of every
     * parameter's leading dim (n = ceil(dim0 / fsdp), the last shard padded
     * with zeros), gathers them per layer in the step and gets its rows of the
     * gradient by psum_scatter. It splits the batch as well: the job's
     * processes are data x fsdp (axis "fsdp" fastest) and each runs
     * grad_accum / (data fsdp) micro-batches. */
    int64_t fsdp;
    /* processes the MoE layers' routed experts are split over (expert
     * parallel; docs/dist.md): each holds model.n_experts / expert of them
     * (the stacked kernels' rows along dim 0; everything else whole) and
     * the MoE layers exchange tokens with all_to_all over the axis
     * "expert". It splits the batch as well (axis "expert" after "fsdp"):
     * each of the data x expert processes runs grad_accum / (data expert)
     * micro-batches. Needs model.capacity_factor > 0; not with fsdp. */
    int64_t expert;
    /* processes each layer's attention and MLP are split over (tensor
     * parallel, Megatron-style; docs/dist.md): heads and d_ff divided by it,
     * q/k/v and the MLP's input linears split by columns, the output linears
     * by rows (psum over "tensor"). The processes of a tensor group read the
     * same rows: the job is data x tensor processes (axis "tensor" fastest).
     * Not with fsdp, expert or MoE models. */
    int64_t tensor;
    /* Sharding rules (docs/dist.md, "Sharding rules"): which dims of the
     * parameters (and so of their optimizer state) are split over the
     * mesh's axes, as canonical flow YAML: a list of [regex, [axis|null,
     * ...]] pairs, the first whose regex matches a parameter's whole path
     * wins, a leaf none matches is whole on every process. "" (the key
     * unset, or null): the built-in layout of the axis above 1 (fsdp,
     * expert or tensor). nb_dist_rules_parse_yaml reads it. */
    char rules[NB_TRAIN_RULES_MAX];
  } mesh;
  int64_t checkpoint_every, checkpoint_keep;
  char checkpoint_dir[NB_TRAIN_STR_MAX];
  int64_t seed;
  nb_train_on_nonfinite on_nonfinite;
  struct {
    /* resume although data.train's content, batch_size, data.seq_len or
     * seed differ from the checkpoint's (its data position then means other batches) */
    bool allow_data_change;
  } resume;
  struct {
    /* "A-B" or "A" (1 <= A <= B): record a trace of training steps A..B into
     * <run_dir>/profile/trace.json (nb_prof_start/stop); "" (default): none */
    char steps[NB_TRAIN_STR_MAX];
  } profile;
  struct {
    /* quantization-aware training: a YAML file of quantization rules
     * (quant.rules, docs/quant.md); the linears they match train with fake
     * quantized weights (and activations) in the step and the eval; "": none */
    char rules[NB_TRAIN_STR_MAX];
  } quant;
} nb_train_config;

/* The steps of cfg->profile.steps in *first..*last; false (with both 0)
 * when it is empty or malformed (nb_train_config_validate names why). */
bool nb_train_profile_steps(const nb_train_config *cfg, int64_t *first, int64_t *last);

/* Defaults: the llama-tiny model and small training settings. */
void nb_train_config_defaults(nb_train_config *cfg);
/* Loads a YAML file (path NULL: defaults only), applies the overrides
 * ("key=value" with dotted keys: "steps=10", "model.n_layers=2",
 * "optim.lr=1e-3") and validates. In the file, model.preset (applied before
 * the other model keys) picks the starting model. Unknown keys, values of
 * the wrong type or outside their range, and unknown enum values are
 * errors naming the file:line, the key path and the allowed keys/values. */
nb_status nb_train_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                   nb_train_config *out);
/* Same from YAML text in memory (`name` for messages). */
nb_status nb_train_config_parse(nb_ctx *ctx, const char *name, const char *text, size_t len, int n_overrides,
                                    const char *const *overrides, nb_train_config *out);
/* Sections of a run configuration that belong to a caller (posttrain's
 * "lora", "sft"): their keys, from the file (where = "file.yaml:12") or an
 * override (where = "override 'k=v'"), go to set(ud, ...) with the dotted
 * key and the scalar value; set reports its errors prefixed with where. */
typedef struct nb_train_config_ext {
  const char *const *sections; /* NULL-terminated top-level names */
  nb_status (*set)(void *ud, nb_ctx *ctx, const char *where, const char *key, const char *value);
  void *ud;
  bool no_validate;            /* the caller validates (its model comes from elsewhere, e.g. a base run) */
} nb_train_config_ext;
nb_status nb_train_config_load_ext(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                   const nb_train_config_ext *ext, nb_train_config *out);
nb_status nb_train_config_parse_ext(nb_ctx *ctx, const char *name, const char *text, size_t len, int n_overrides,
                                    const char *const *overrides, const nb_train_config_ext *ext, nb_train_config *out);
/* One "key=value" override on a loaded config (not validated again). */
nb_status nb_train_config_set(nb_ctx *ctx, nb_train_config *cfg, const char *assignment);
nb_status nb_train_config_validate(nb_ctx *ctx, const nb_train_config *cfg);
/* Writes every key as YAML (loads back to the same config). */
void nb_train_config_write(const nb_train_config *cfg, FILE *f);
/* The sharded layout cfg's mesh and rules give the model's parameters and
 * optimizer state, one line per leaf to f (its spec, the rule that gave it,
 * one process's block), with the rules first: what `nabla train --layout`
 * prints. Errors as the trainer's (a rule it cannot run is refused). */
nb_status nb_train_print_layout(nb_ctx *ctx, const nb_train_config *cfg, FILE *f);
/* The keys starting with prefix ("model." for the model; "" for all) whose
 * values differ between a and b, comma-separated into buf[cap] ("" when
 * none; cut at cap). */
void nb_train_config_diff(const nb_train_config *a, const nb_train_config *b, const char *prefix, char *buf,
                              size_t cap);
/* The same with both values: "model.d_model: 32 <a_name>, 64 <b_name>; ...". */
void nb_train_config_diff_values(const nb_train_config *a, const nb_train_config *b, const char *prefix,
                                     const char *a_name, const char *b_name, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Building blocks                                                           */
/* ------------------------------------------------------------------------ */

/* The learning-rate schedule of cfg (new object): linear warmup from 0 to
 * optim.lr over schedule.warmup_steps, then constant, linear or cosine decay
 * to lr * min_lr_ratio over decay_steps (0: steps - warmup_steps). */
nb_optim_schedule *nb_train_schedule(nb_ctx *ctx, const nb_train_config *cfg);
/* The optimizer of cfg (new object): clip_by_global_norm(grad_clip) when
 * grad_clip > 0, then adamw / adam / sgd (momentum) with nb_train_schedule. */
nb_optim_tx *nb_train_optimizer(nb_ctx *ctx, const nb_train_config *cfg);
/* Sets the step graph's "hparams/..." inputs of cfg into `inputs`. */
nb_status nb_train_set_hparams(nb_ctx *ctx, const nb_train_config *cfg, nb_tree *inputs);
/* What a step or eval graph sees beyond the model's own parameters (all
 * zero: the plain trainer). */
typedef struct nb_train_graph_opts {
  const nb_tree *frozen_spec;      /* inputs "frozen/<p>": seen by the model, never differentiated or updated */
  nb_nn_linear_hook linear_hook;   /* the model's linear hook (LoRA, quantized bases) */
  void *hook_ud;
  bool packed;                     /* the batch also has "mask" f32, "segment_ids" and "positions" i32
                                      [batch_size, seq_len] (packed examples, loss on masked tokens) */
} nb_train_graph_opts;
nb_graph *nb_train_trace_step_opts(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_graph_opts *go,
                                   const nb_tree *param_spec, const nb_tree *opt_state_spec);
nb_graph *nb_train_trace_eval_opts(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_graph_opts *go,
                                   const nb_tree *param_spec);
/* The step graph described above (new; destroy it). param_spec and
 * opt_state_spec: trees of arrays or avals (borrowed), the whole state; with
 * mesh.fsdp, mesh.expert or mesh.tensor > 1 the graph's "params/..." and
 * "opt_state/..." inputs and outputs are this process's shards of them
 * (docs/dist.md), and the eval graph's "params/..." inputs too.
 * NB_ERR_UNIMPLEMENTED for configs the trainer does not support (precision
 * other than f32; FSDP, expert or tensor parallel with a task, frozen tree or linear
 * hook). */
nb_graph *nb_train_trace_step(nb_ctx *ctx, const nb_train_config *cfg, const nb_tree *param_spec,
                              const nb_tree *opt_state_spec);
/* The eval graph: inputs "params/<p>", "batch/inputs", "batch/targets"
 * [batch_size, seq_len]; outputs "loss", "metrics/<name>" (no dropout). */
nb_graph *nb_train_trace_eval(nb_ctx *ctx, const nb_train_config *cfg, const nb_tree *param_spec);

/* ------------------------------------------------------------------------ */
/* Tasks: another loss and batch in the same loop (post-training)            */
/* ------------------------------------------------------------------------ */

/* The data a task trains on (what data.train's token windows are for
 * language modeling); the trainer takes train and eval. */
typedef struct nb_train_task_data {
  nb_data_iter *train;      /* batches of batch_size (trees matching batch_spec), endless; its state is
                               saved in every checkpoint */
  nb_data_map *eval;        /* element i: the i-th eval batch; NULL: no eval */
  int64_t n_train, n_eval;  /* examples */
  int64_t tokens;           /* of the training data; with xxh3 its identity: a resume with other */
  uint64_t xxh3;            /* data is refused (as for token shards) */
} nb_train_task_data;

/* A task replaces the language-model loss, batch and data of nb_train_run;
 * everything else (optimizer, schedule, grad_accum, checkpoints, resume,
 * metrics.jsonl, TensorBoard, report) is the trainer's. */
typedef struct nb_train_task {
  const char *name;         /* for messages ("dpo") */
  int64_t rows_per_example; /* sequences of seq_len an example puts in the batch (dpo 2, grpo G), for tokens/s and
                               MFU; 0 means 1 */
  /* Avals of the batch's leaves for `rows` examples (new tree): every leaf's
   * axis 0 is the example, so grad_accum slices rows. */
  nb_tree *(*batch_spec)(void *ud, nb_ctx *ctx, const nb_train_config *cfg, int64_t rows);
  /* The loss of a micro-batch (new graph): inputs "params/<p>",
   * "frozen/<f>" (frozen_spec, may be empty), "batch/<b>" and "rng" when
   * mo->train; outputs "loss" (scalar) and "metrics/<name>" (scalars,
   * means over the micro-batch). */
  nb_graph *(*trace_loss)(void *ud, nb_ctx *ctx, const nb_train_config *cfg, const nb_model_trace_opts *mo,
                          const nb_tree *param_spec, const nb_tree *frozen_spec, const nb_tree *batch_spec);
  nb_status (*open_data)(void *ud, nb_ctx *ctx, const nb_train_config *cfg, const char *run_dir,
                         nb_train_task_data *out);
  const nb_tree *init_params; /* borrowed: the parameters a fresh run starts from; NULL: nb_model_init */
  const nb_tree *frozen;      /* borrowed: inputs "frozen/<p>" of every step and eval, never updated
                                 nor saved (a reference model); NULL: none */
  void (*write_config)(void *ud, FILE *f); /* the task's own keys, appended to config.yaml; may be NULL */
  /* On-policy tasks (GRPO), both may be NULL. before_batch: called before
   * each step draws its batch, with the current parameters ("<p>", borrowed
   * for the call; what the step will update) and the updates done so far, so
   * that the batch the iterator makes next can come from the policy being
   * trained. evaluate: replaces the eval graph (eval then runs every
   * eval_every steps whatever eval_steps is, and once before the first step
   * of a fresh run, recorded as step 0): *loss and "eval_<name>" scalars. */
  nb_status (*before_batch)(void *ud, nb_ctx *ctx, const nb_tree *params, int64_t step);
  nb_status (*evaluate)(void *ud, nb_ctx *ctx, const nb_tree *params, int64_t step, double *loss, nb_tree *metrics);
  void *ud;
} nb_train_task;

/* The step and eval graphs of a task (task NULL: language modeling, as
 * nb_train_trace_step / nb_train_trace_eval). */
nb_graph *nb_train_trace_task_step(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_task *task,
                                   const nb_tree *param_spec, const nb_tree *opt_state_spec);
nb_graph *nb_train_trace_task_eval(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_task *task,
                                   const nb_tree *param_spec);

/* ------------------------------------------------------------------------ */
/* The training loop                                                         */
/* ------------------------------------------------------------------------ */

/* What the trainer knows before its first step. */
typedef struct nb_train_start_info {
  int64_t start_step;           /* > 0 when resumed from a checkpoint */
  int64_t total_steps;
  int64_t n_params;
  int64_t train_windows, eval_windows; /* windows of seq_len+1 tokens */
  int64_t vocab_size;           /* of the training shard */
  double unigram_entropy;       /* nats/token of the training shard's tokens */
  double flops_per_step;        /* nb_train_model_flops: 6 N tokens + attention, N the active parameters */
  double graph_flops_per_step;  /* nb_graph_cost of the step graph */
  double peak_flops;            /* as given in the options (0: no MFU) */
  double compile_s;             /* tracing + nb_jit of the step and eval graphs */
  double state_bytes;           /* this process's params + optimizer state (FSDP: its shards) */
  double step_peak_bytes;       /* the step executable's planned buffer peak (nb_exe_stats.peak_bytes) */
  double step_arena_bytes;      /* its intermediates after liveness-based reuse (arena_bytes) */
  const char *train_shard, *eval_shard; /* valid during the callback */
} nb_train_start_info;

/* One step's numbers. tokens_per_s and mfu cover the steps since the last
 * logged one and are set when `logged`. */
typedef struct nb_train_step_info {
  int64_t step;                 /* updates done, counting this one: 1..total_steps */
  int64_t total_steps;
  double loss, lr, grad_norm;   /* lr: the rate this step's update used */
  double tokens_per_s, mfu;
  double elapsed_s;             /* since this nb_train_run started */
  double step_ms;               /* wall time of this step (data, step, checkpoint) */
  bool logged;                  /* written to metrics.jsonl (every log_every steps and the last) */
  bool has_eval;                /* eval ran after this step */
  double eval_loss;
  const nb_tree *metrics;       /* with a task: the step's "<name>" scalars (and "eval_<name>" after an
                                   eval), valid during on_step; NULL otherwise */
} nb_train_step_info;

/* What a caller (posttrain's SFT) gives the trainer instead of its own
 * data and parameters; the loop, logging, checkpoints and resume are the
 * trainer's. */
typedef struct nb_train_source {
  /* Examples instead of data.train / data.eval: map datasets (borrowed; the
   * trainer takes references) of {"inputs", "targets" i32[n], "mask" f32[n]},
   * shuffled per epoch by seed and packed (nb_data_iter_pack) into batch_size
   * rows of data.seq_len with "segment_ids" and "positions"; eval: the first
   * eval_steps packed batches. train_id and train_tokens identify the
   * training data in checkpoints (a resume with others is refused). */
  nb_data_map *train, *eval;
  uint64_t train_id;
  int64_t train_tokens;
  const char *train_name;
  /* The trainable parameters' initial values instead of nb_model_init
   * (borrowed; "params" in checkpoints). */
  const nb_tree *params;
  /* Step and eval graph extras: frozen parameters (inputs "frozen/<p>",
   * never saved), the linear hook. */
  const nb_tree *frozen;
  nb_nn_linear_hook linear_hook;
  void *hook_ud;
  const char *config_extra;      /* YAML appended to DIR/config.yaml (the caller's sections) */
} nb_train_source;

typedef struct nb_train_opts {
  const char *run_dir;          /* required */
  double peak_flops;            /* FLOP/s the MFU is relative to; 0: MFU not computed */
  int threads;                  /* jit threads; 0: $NABLA_THREADS or the CPU count */
  bool handle_signals;          /* SIGINT/SIGTERM: checkpoint the current step and return
                                   (installed before set-up; during set-up: return with
                                   nothing trained; during the last save: wait for it) */
  /* Called after every step (and its checkpoint); true stops the run after
   * a checkpoint of that step. */
  bool (*should_stop)(void *ud, int64_t step);
  void (*on_start)(void *ud, const nb_train_start_info *info);
  void (*on_step)(void *ud, const nb_train_step_info *info);
  void *ud;
  const nb_train_task *task;    /* NULL: language modeling on data.train's tokens */
  const nb_train_source *source; /* NULL: data, init and graphs from the config alone */
} nb_train_opts;

typedef struct nb_train_result {
  int64_t start_step, final_step;
  bool stopped;                 /* by should_stop */
  bool preempted;               /* by a signal (handle_signals) */
  double final_loss, last_eval_loss; /* NaN when none */
  /* Timings of this call's steps (eval excluded): medians of the step
   * executable alone and of the whole loop iteration (data wait, step,
   * checkpoint hand-off, metrics). */
  double exe_ms_median, iter_ms_median;
  double wall_s, exe_s, data_s, ckpt_s, eval_s;
  int64_t steps_run;
} nb_train_result;

/* Runs (or resumes) the training of cfg (borrowed) in opts->run_dir: data
 * set-up, init or restore, compile, the loop with logging, eval,
 * checkpoints (every checkpoint_every steps, async; at the end; on stop and
 * on a signal), metrics.jsonl, TensorBoard scalars and report.html (redrawn
 * at each eval, checkpoint and at the end; their failures are logged as
 * warnings, training goes on). Errors (bad data
 * paths, a damaged shard or ids beyond the vocabulary, vocabulary larger
 * than the model's, eval_steps beyond the eval data, a changed data on
 * resume, divergence, unsupported config) return a status with the message
 * on ctx; out (may be NULL) is filled either way. */
nb_status nb_train_run(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_opts *opts, nb_train_result *out);

/* The peak FLOP/s of this CPU to give as opts.peak_flops (what `nabla
 * train` uses without --peak-gflops): nb_prof_peak_flops(threads).flops,
 * $NABLA_PEAK_GFLOPS or a measured (and cached) f32 FMA peak. */
double nb_train_peak_flops_estimate(int threads);

/* ------------------------------------------------------------------------ */
/* Model FLOPs and the step planner (`nabla plan`, docs/dist.md)             */
/* ------------------------------------------------------------------------ */

/* The parameters one token goes through: every leaf of params (arrays or
 * avals) except that an MoE layer's routed experts (leaves under
 * ".../experts/") count top_k / n_experts of their size. */
int64_t nb_train_active_params(const nb_train_config *cfg, const nb_tree *params);
/* Model FLOPs of one training step, what MFU is measured against (the
 * trainer's and the planner's, one count): 6 N tokens + 12 L H hd T tokens
 * (the attention products, forward and backward), tokens = batch_size x
 * data.seq_len, N = active_params. Remat's recomputation is not counted. */
double nb_train_model_flops(const nb_train_config *cfg, int64_t active_params);

/* One chip (one process on a CPU) as the planner sees it. Rates per chip;
 * links one direction. */
typedef struct nb_train_chip {
  char name[64];
  double peak_flops_bf16, peak_flops_f32; /* dense matmul FLOP/s at each compute dtype */
  double hbm_bytes_per_s;
  double mem_bytes;
  double link_bytes_per_s;      /* between chips of one node (NVLink, one ICI torus axis, shared memory) */
  double node_link_bytes_per_s; /* between nodes: a mesh axis whose group spans nodes runs at this */
  int64_t chips_per_node;       /* 0: all chips are on the fast link */
  double efficiency;            /* the stated fraction of peak the step's FLOPs run at */
  bool overlap;                 /* data-parallel and FSDP collectives hidden behind compute */
  char source[1024];            /* where the numbers come from */
} nb_train_chip;

/* "h100" (SXM, 8 per node), "tpu-v5p", "cpu:this" (this machine shared by
 * n_chips processes of CPUs / n_chips threads each: the measured and cached
 * peaks of nabla/prof.h, RAM / n_chips), or "custom" (all rates zero: the
 * caller fills them). NB_ERR_NOT_FOUND naming the known ones otherwise. */
nb_status nb_train_chip_spec(nb_ctx *ctx, const char *name, int64_t n_chips, nb_train_chip *out);

/* One mesh layout's estimate. Bytes and seconds per device per step. */
typedef struct nb_train_plan_layout {
  int64_t data, fsdp, tensor, expert;
  int64_t micro_batches, micro_rows;  /* per device: grad_accum / (data fsdp expert) of micro_rows rows */
  double compute_s;                   /* max(hardware FLOPs / (peak eff), HBM bytes / bandwidth) */
  double dp_s, fsdp_s, tp_s, ep_s;    /* each kind of collective's time */
  double dp_bytes, fsdp_bytes, tp_bytes, ep_bytes; /* bytes each device sends */
  double exposed_comm_s;              /* what overlap does not hide */
  double step_s, tokens_per_s, mfu;
  double param_bytes, grad_bytes, opt_bytes, gathered_bytes, act_bytes, mem_bytes;
  bool fits;                          /* mem_bytes <= the chip's memory */
  char note[256];                     /* what nabla train cannot run of it yet, "" when nothing */
} nb_train_plan_layout;

typedef struct nb_train_plan {
  nb_train_chip chip;
  int64_t n_chips, n_params, active_params;
  double model_flops, hw_flops;       /* per step, whole job (hw: with remat's recomputation) */
  double tokens;                      /* per step */
  double peak_flops;                  /* per chip, at the compute dtype */
  int n_layouts;
  nb_train_plan_layout *layouts;      /* fastest first */
  int best;                           /* the fastest that fits; -1: none fits */
} nb_train_plan;

/* Every layout data x fsdp x tensor x expert = n_chips that the config
 * allows (tensor divides the heads, KV heads and d_ff; expert > 1 only for
 * MoE and divides n_experts; data fsdp expert divides batch_size), each
 * estimated by rooflines (docs/dist.md, "nabla plan"), sorted by step
 * time. NB_ERR_INVALID_ARG naming --chips when none is valid (and why). */
nb_status nb_train_plan_make(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_chip *chip, int64_t n_chips,
                             nb_train_plan *out);
void nb_train_plan_free(nb_train_plan *p);

/* ------------------------------------------------------------------------ */
/* Starting from existing weights                                            */
/* ------------------------------------------------------------------------ */

/* The model and parameters a run with init_from=source starts from (what
 * nb_train_run does with cfg.init_from; post-training commands call it too).
 * source is one of:
 *   - a Hugging Face directory (config.json + safetensors: nb_model_load_hf;
 *     GPT-2, Llama, Mistral, Qwen2; a sliding_window shorter than
 *     data.seq_len is refused, nabla has no windowed attention);
 *   - a nabla run directory (config.yaml + checkpoints/: the latest committed
 *     step's params);
 *   - a checkpoint: a step directory (DIR/COMMIT) or a checkpoint manager
 *     directory (its latest step); the model config is the one stored in the
 *     checkpoint's metadata, else the run config two levels (step) or one
 *     level (manager) up, else (a `nabla ckpt import`ed checkpoint) run's own.
 * Only parameters are taken (no optimizer state, data position or step).
 * *model receives the source's model config with run's training-time model
 * keys (dropout, attn_dropout, init_std, scaled_init, router_init_std,
 * lb_loss_coef, z_loss_coef, capacity_factor, scan_layers); an architecture
 * key that run sets (run->model_keys_set) to another value than the
 * source's is an error naming the key and both values. *params receives a
 * new tree of fresh f32 host arrays with exactly the paths of
 * nb_model_param_spec(*model); a missing, extra or mis-shaped tensor is an
 * error naming it. params NULL: the model only, from the source's configs
 * and checkpoint metadata, no weights read (what a resumed run needs). */
nb_status nb_train_init_from(nb_ctx *ctx, const char *source, const nb_train_config *run, nb_model_config *model,
                             nb_tree **params);

/* ------------------------------------------------------------------------ */
/* Loading a trained model                                                   */
/* ------------------------------------------------------------------------ */

/* A nabla run directory: DIR/config.yaml (nb_train_config_load), the
 * latest step of the checkpoint manager at DIR/checkpoints (item "params"),
 * and the tokenizer named by data.tokenizer (as given, else relative to DIR;
 * "" is byte-level). config_path, when not NULL, replaces DIR/config.yaml.
 * Fills *out (free with nb_model_loaded_free) or returns an error naming the
 * file and what was wrong. */
nb_status nb_train_load_run_dir(nb_ctx *ctx, const char *dir, const char *config_path, nb_model_loaded *out);
/* One checkpoint step directory (DIR/checkpoints/step_N): the config is
 * config_path or, when NULL, config.yaml two levels up. */
nb_status nb_train_load_checkpoint(nb_ctx *ctx, const char *step_dir, const char *config_path, nb_model_loaded *out);

NB_END_DECLS
#endif /* NABLA_TRAIN_H */
