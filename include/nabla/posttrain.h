/* nabla posttrain: post-training of a trained model (the analogue of Tunix
 * and TRL): preference optimization (DPO, IPO, hinge, ORPO), with SFT, LoRA
 * and GRPO to come beside it. Everything numerical is traced, so the losses
 * compile into the step of the trainer (nabla/train.h) that runs them. */
#ifndef NABLA_POSTTRAIN_H
#define NABLA_POSTTRAIN_H

#include <stdio.h>

#include "nabla/export.h"
#include "nabla/core.h"
#include "nabla/data.h"
#include "nabla/models.h"
#include "nabla/nn.h"
#include "nabla/train.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* preference optimization                                                   */
/* ------------------------------------------------------------------------ */

/* A batch of B preference pairs is 2B rows: the B chosen completions, then
 * the B rejected ones, each row prompt + completion, right-padded to T.
 * Losses follow TRL (trl 1.16 DPOTrainer._compute_loss and ORPOTrainer;
 * docs/posttrain.md "Preference optimization"), with
 *   logratio_c = logp(chosen) - ref_logp(chosen),  the same for rejected,
 *   d = logratio_c - logratio_r:
 *   sigmoid  -(1 - ls) log sigmoid(beta d) - ls log sigmoid(-beta d)  (DPO; ls > 0 is cDPO)
 *   ipo      (d' - 1 / (2 beta))^2, d' the difference of the logratios
 *            divided by each completion's token count (TRL's normalization)
 *   hinge    max(0, 1 - beta d)
 *   orpo     NLL(chosen) - lambda log sigmoid(log_odds), log_odds =
 *            (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r)), a = the mean
 *            token log-prob of the completion; no reference model.
 * Rewards: beta * logratio (ORPO: lambda * a), accuracy = mean(reward_c >
 * reward_r), margin = mean(reward_c - reward_r). */
typedef enum nb_pt_pref_loss_type {
  NB_PT_PREF_SIGMOID, NB_PT_PREF_IPO, NB_PT_PREF_HINGE, NB_PT_PREF_ORPO, NB_PT_PREF_COUNT
} nb_pt_pref_loss_type;
/* "sigmoid", "ipo", "hinge", "orpo" (NULL out of range). */
const char *nb_pt_pref_loss_name(nb_pt_pref_loss_type t);

typedef struct nb_pt_pref_opts {
  nb_pt_pref_loss_type loss_type;
  double beta;             /* DPO's beta, IPO's tau; > 0 (TRL's default 0.1) */
  double label_smoothing;  /* sigmoid only: the probability that a label is flipped, in [0, 0.5) */
  double orpo_lambda;      /* ORPO: weight of the odds-ratio term, > 0 (TRL's ORPOConfig.beta, 0.1) */
} nb_pt_pref_opts;

/* Sequence log-probabilities: logits [N, T, V] (float), targets integer
 * [N, T] (the next tokens), mask [N, T] (bool or float: 1 on the completion's
 * targets) -> [N] sum over T of mask * log softmax(logits)[target]; with
 * mean, divided by the mask's count (at least 1). Logits' dtype. NULL with
 * the error on the graph for mismatched shapes or dtypes. */
nb_val *nb_pt_seq_logps(nb_val *logits, nb_val *targets, nb_val *mask, bool mean);

/* What the loss reads, all values of one graph. */
typedef struct nb_pt_pref_in {
  nb_val *logits;          /* the policy's [2B, T, V] */
  nb_val *targets, *mask;  /* [2B, T]: next tokens; 1 on completion targets */
  nb_val *valid;           /* [2B, T]: 1 on every non-padding target (ORPO's NLL, as TRL: prompt and
                              completion); NULL: mask */
  nb_val *ref_logps;       /* [2B] the reference model's sequence log-prob sums (of the same rows;
                              gradients stopped here); required but for ORPO */
} nb_pt_pref_in;

typedef struct nb_pt_pref_out {
  nb_val *loss;                                /* scalar: the mean over pairs */
  nb_val *chosen_rewards, *rejected_rewards;   /* [B], no gradient */
  nb_val *accuracy, *margin;                   /* scalars, no gradient */
  nb_val *chosen_logps, *rejected_logps;       /* [B] sums (ORPO: means), no gradient */
  nb_val *nll, *log_odds_ratio, *log_odds;     /* ORPO only (scalars: NLL, mean log sigmoid(log_odds),
                                                  mean log_odds), else NULL */
} nb_pt_pref_out;

/* Traces the preference loss of o over in into out. NB_ERR_INVALID_ARG for
 * options out of range (named), NB_ERR_SHAPE for mismatched inputs (an odd
 * row count, ref_logps not [2B]). */
nb_status nb_pt_pref_loss(const nb_pt_pref_opts *o, const nb_pt_pref_in *in, nb_pt_pref_out *out);

/* Preference data: JSONL, one pair per line, {"prompt": "...", "chosen":
 * "...", "rejected": "..."} (strings; TRL's "explicit prompt" format).
 * Prompt and completion are tokenized apart and joined (the tokenizer's eos,
 * if any, closes each completion), so pair i becomes two rows, chosen and
 * rejected, of T = seq_len next-token positions:
 *   "inputs", "targets"  i32 [P, 2, T]  tokens and next tokens, 0 after the end
 *   "mask"               f32 [P, 2, T]  1 where the target is a completion token
 *   "valid"              f32 [P, 2, T]  1 where the target is a token (prompt or completion)
 * Pair-major ([P, 2, T], not [2P, T]) so that any slice of pairs keeps its
 * chosen and rejected rows together; the loss takes [2B, T] (chosen rows,
 * then rejected: nb_pt_pref_rows). A completion longer than the room left
 * is cut at the end (counted in n_truncated). Refused with file:line and
 * the field: a line that is not a JSON object, a missing or empty field, a
 * field that is not a string (a "messages" list needs a chat template: not
 * supported yet), a prompt that leaves no room for a completion token in
 * seq_len, an id at or above vocab_size (> 0). */
typedef struct nb_pt_pref_data_info {
  int64_t pairs, n_truncated, tokens; /* tokens: of all rows, before padding */
  uint64_t xxh3;                      /* of the file's lines (XXH3 of each, combined in order) */
} nb_pt_pref_data_info;
nb_tree *nb_pt_pref_data_load(nb_ctx *ctx, const char *path, const nb_data_tokenizer *tok, int64_t seq_len,
                              int64_t vocab_size, nb_pt_pref_data_info *info);
/* x [B, 2, ...] (a value) -> [2B, ...]: the B chosen rows, then the B rejected. */
nb_val *nb_pt_pref_rows(nb_val *x);

/* `nabla dpo`: preference optimization as a task of the trainer
 * (nb_train_run: the run dir, checkpoints, resume, metrics.jsonl,
 * TensorBoard and report are train's). The run config is a train config
 * (data.train / data.eval: JSONL pairs as above, tokenized with
 * data.tokenizer, else the base's tokenizer, else bytes) plus a pref:
 * section, written back into the run dir's config.yaml:
 *   pref:
 *     loss_type: sigmoid        # sigmoid, ipo, hinge, orpo
 *     beta: 0.1
 *     label_smoothing: 0        # sigmoid only (cDPO)
 *     orpo_lambda: 0.1          # orpo only
 *     base: runs/sft            # a run dir or checkpoint step dir to start from ("": a fresh model)
 *     precompute_ref: false     # true: reference log-probs once per pair at the start, not per step
 * The policy starts from the base's parameters (model: its config) and the
 * reference model is a frozen copy of them, run in the same step (ORPO has
 * none). Metrics (means over the batch, TRL's names): rewards/chosen,
 * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
 * logps/rejected; ORPO also nll_loss, log_odds_ratio, log_odds_chosen;
 * eval records the same as eval_<name>. */
typedef struct nb_pt_pref_config {
  nb_pt_pref_opts loss;
  char base[NB_TRAIN_STR_MAX];
  bool precompute_ref;     /* the reference's log-probs computed once for every pair at the start (a
                              batch field, TRL's precompute_ref_log_probs) instead of in every step */
} nb_pt_pref_config;

/* sigmoid, beta 0.1, label_smoothing 0, orpo_lambda 0.1, no base. */
void nb_pt_pref_config_defaults(nb_pt_pref_config *c);
/* The pref: section of the YAML file at path (NULL: defaults; the file's
 * other keys are the trainer's) and "pref.<key>=value" overrides; errors
 * name file:line (or the override) and the key. */
nb_status nb_pt_pref_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                 nb_pt_pref_config *out);
nb_status nb_pt_pref_config_set(nb_ctx *ctx, nb_pt_pref_config *c, const char *assignment);
void nb_pt_pref_config_write(const nb_pt_pref_config *c, FILE *f);
/* Runs (or resumes) the preference training of cfg and pc in
 * opts->run_dir (opts->task is set here); as nb_train_run. */
nb_status nb_pt_pref_run(nb_ctx *ctx, const nb_train_config *cfg, const nb_pt_pref_config *pc, const nb_train_opts *opts,
                         nb_train_result *out);

NB_END_DECLS
#endif /* NABLA_POSTTRAIN_H */
