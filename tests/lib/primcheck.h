/* Checks shared by the primitive tests: eager evaluation of a traced
 * function, derivatives against central finite differences (f64), reverse
 * mode against forward mode, and vmap against a loop over the batch.
 *
 * The primitive table test (tests/core/test_prims.c) runs every case of
 * every family through all three and fails when a primitive has no case. */
#ifndef NABLA_PRIMCHECK_H
#define NABLA_PRIMCHECK_H

#include "test.h"

/* Traces fn on the avals of `in` and runs it with the interpreter; outputs
 * (arrays) go into `out`. */
nb_status nb_test_eval(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *in, nb_tree *out);

/* nb_test_eval, returning only the output at `path` (a new reference), or
 * NULL after printing the error. */
nb_array *nb_test_eval_output(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *in, const char *path);

/* Random arrays: normal entries (floats), uniform integers in [lo, hi] (ints),
 * or coin flips (bool). New references. */
nb_array *nb_test_randn(nb_ctx *ctx, nb_test_rng *rng, nb_dtype t, int rank, const int64_t *dims);
nb_array *nb_test_randint(nb_ctx *ctx, nb_test_rng *rng, nb_dtype t, int rank, const int64_t *dims, int64_t lo, int64_t hi);
/* Sets tree[path] to a new nb_test_randn array (the tree holds it). */
void nb_test_set_randn(nb_tree *tree, nb_test_rng *rng, const char *path, nb_dtype t, int rank, const int64_t *dims);

/* Derivative checks of fn at `in` (float leaves must be f64; other leaves are
 * held fixed): for random directions v and cotangents u,
 *   jvp(v)            == (f(x + eps v) - f(x - eps v)) / 2 eps   (eps = 1e-6)
 *   <u, jvp(v)>       == <vjp(u), v>
 * also through grad(grad) when second_order (f's float outputs are reduced
 * with random weights to a scalar first). Returns true when all hold within
 * tol (relative); prints what differs otherwise. */
bool nb_test_check_grads(nb_ctx *ctx, const char *name, nb_trace_fn fn, void *user, const nb_tree *in, double tol,
                         bool second_order);

/* vmap check: `batched` holds every input with a batch axis of size n at
 * axis 0 (inputs listed in `unbatched` are passed whole, unbatched). Runs
 * vmap(fn) once and compares each output slice with fn run on the slices. */
bool nb_test_check_vmap(nb_ctx *ctx, const char *name, nb_trace_fn fn, void *user, const nb_tree *batched,
                        const nb_tree *unbatched, int64_t n);

/* One row of the primitive table. make_inputs fills `in` with random inputs
 * for one call (float inputs as f64, so finite differences are accurate). */
enum { NB_CASE_NO_GRAD = 1, NB_CASE_NO_VMAP = 2, NB_CASE_NO_SECOND_ORDER = 4 };
typedef struct nb_prim_case {
  const char *prim; /* the primitive covered: its name in src/core/prims/prims.def */
  const char *name; /* what the case exercises */
  nb_trace_fn fn;
  void *user;
  nb_status (*make_inputs)(nb_ctx *ctx, nb_test_rng *rng, nb_tree *in);
  unsigned flags;
  double tol;       /* 0: the default 1e-5 */
} nb_prim_case;

/* Each family test file under tests/lib/cases_<family>.c exports its rows. */
typedef const nb_prim_case *(*nb_case_list_fn)(size_t *n);
/* All the families (tests/lib/cases_all.c): a new family adds its line there. */
const nb_case_list_fn *nb_test_case_families(size_t *n);

/* Registers the test kernels of cases_custom_call.c (softplus, polar,
 * cube_nograd) on ctx, once; they stay on the context until it is destroyed. */
nb_status nb_test_register_custom_calls(nb_ctx *ctx);

#endif
