/* Helpers of the compiler tests: jit options pointing at the test cache,
 * running a graph both ways (jit and interpreter) and comparing the outputs
 * (NaNs equal; tolerance relative to the values' magnitude, by dtype). */
#ifndef NABLA_JITCHECK_H
#define NABLA_JITCHECK_H

#include "primcheck.h"

/* Options for tests: the disk cache under $NABLA_BUILD_DIR (or /tmp), and
 * `disable` (may be NULL). */
nb_jit_opts nb_test_jit_opts(const char *disable);
/* Largest |a-b| / (1 + |b|) over all elements (INFINITY when shapes,
 * dtypes or NaN positions differ). */
double nb_test_max_rel_diff(const nb_array *a, const nb_array *b);
/* Tolerance for comparing a compiled result with the interpreter. */
double nb_test_jit_tol(nb_dtype t);
/* Runs g with the interpreter and with nb_jit(opts); returns true when every
 * output matches; prints the first mismatching path. With stats_out, the
 * executable's stats. */
bool nb_test_jit_matches(nb_ctx *ctx, const nb_graph *g, const nb_tree *in, const nb_jit_opts *opts, const char *what,
                         nb_exe_stats *stats_out);
/* Every row of the primitive table (tests/lib/cases_*.c) inlined into one
 * graph, its inputs set in `inputs` (custom calls registered on ctx first);
 * *rows: how many rows. */
nb_graph *nb_test_prim_table_graph(nb_ctx *ctx, nb_tree *inputs, int *rows);
/* Can graphs be run on the "cuda" backend here? If not, why (not built, no
 * driver, no device): tests print it as SKIPPED. Probed once. */
bool nb_test_cuda_usable(nb_ctx *ctx, char *why, size_t cap);

#endif
