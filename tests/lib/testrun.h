/* What the trainer-based tests compare between two run dirs: the losses
 * metrics.jsonl logged and the final parameters (resume, stop/restart and
 * equivalence tests of sft, dpo, grpo). */
#ifndef NABLA_TEST_TESTRUN_H
#define NABLA_TEST_TESTRUN_H

#include <stdbool.h>
#include <stddef.h>

#include "nabla/core.h"

/* The "loss" of every record of RUN_DIR/metrics.jsonl, as its text, each
 * followed by ';', into out (empty when the file is missing). */
void nb_test_run_losses(const char *run_dir, char *out, size_t cap);

/* Whether the parameters of run dirs a and b (their latest checkpoints)
 * are the same paths with the same bytes. */
bool nb_test_run_same_params(nb_ctx *ctx, const char *a, const char *b);

#endif
