/* Private to the nn library: small traced helpers shared by the module
 * files (scalars in a value's dtype, keepdims reductions, upcasting, path
 * joins that poison the graph when a path is too long). Not public API. */
#ifndef NABLA_NN_INTERNAL_H
#define NABLA_NN_INTERNAL_H

#include "nabla/nn.h"

/* A scalar constant of x's dtype (broadcasts in binary ops). */
nb_val *nb_nn__scalar(nb_val *x, double v);
/* Sum / mean over the last axis, kept as a size-1 axis. */
nb_val *nb_nn__sum_last(nb_val *x);
nb_val *nb_nn__mean_last(nb_val *x);
/* bf16/f16 -> f32; other dtypes unchanged. */
nb_val *nb_nn__upcast(nb_val *x);
/* x [..., k] contracted with w [k, n] -> [..., n]. */
nb_val *nb_nn__dot_last_first(nb_val *x, nb_val *w);
/* nb_nn_join into buf, or NULL after poisoning a->g naming the path. */
const char *nb_nn__path(nb_nn_apply *a, char *buf, const char *prefix, const char *name);
/* Same for init: NULL with an error on in->ctx. */
const char *nb_nn__init_path(nb_nn_init *in, char *buf, const char *prefix, const char *name);
/* The poison value after an error already recorded on a->g. */
nb_val *nb_nn__poison(nb_nn_apply *a);
/* x reshaped with one dimension list. */
nb_val *nb_nn__reshape(nb_val *x, int rank, const int64_t *dims);
/* Function forms of the op macros, for compound-literal arguments. */
nb_val *nb_nn__broadcast_to(nb_val *x, int rank, const int64_t *dims);
nb_val *nb_nn__broadcast_in_dim(nb_val *x, int rank, const int64_t *dims, const int *bdims);

#endif
