/* Shared rules for elementwise primitives: dtype classes, the same-shape
 * shape rule, the generic batching rule and the element loops. Used by
 * unary.c, binary.c, select.c and convert.c. */
#ifndef NABLA_PRIMS_ELEMENTWISE_H
#define NABLA_PRIMS_ELEMENTWISE_H

#include "core/prims/params.h"

typedef enum nb_dtype_class {
  NB_CLASS_FLOAT,   /* floating dtypes only */
  NB_CLASS_NUMERIC, /* floating and integer, not bool */
  NB_CLASS_INTBOOL, /* integer and bool (bitwise / logical) */
  NB_CLASS_ANY,
} nb_dtype_class;

bool nb__dtype_in_class(nb_dtype t, nb_dtype_class c);
const char *nb__class_name(nb_dtype_class c);

/* All operands of one shape and dtype in class c; out has that aval, or
 * bool when bool_out. */
nb_status nb__ew_infer(int nin, const nb_aval *in, nb_dtype_class c, bool bool_out, nb_aval *out, char *why, size_t cap);

/* vmap for elementwise primitives: batched operands get their batch axis
 * moved to 0, unbatched ones are broadcast; the result is batched at 0. */
nb_status nb__ew_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t axis_size,
                       nb_val **out, int *out_bdims);

/* Re-emits e with new operands (same primitive and params). */
nb_val *nb__reemit(nb_graph *g, const nb_eqn *e, nb_val *const *in);

/* Public-op helper: broadcasts a and b to their NumPy common shape. */
bool nb__broadcast_pair(nb_loc loc, nb_val **a, nb_val **b, const char *op);


#endif
