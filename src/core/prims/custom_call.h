/* Cross-file entry into custom_call.c: the reverse-mode wiring of a custom
 * call, for any rule that needs a kernel's backward pass (custom_call_lin's
 * transpose uses it; call.c may too). */
#ifndef NABLA_PRIMS_CUSTOM_CALL_H
#define NABLA_PRIMS_CUSTOM_CALL_H

#include "core/prims/params.h"

/* Emits into g the cotangents of a custom call's operands: `primals` are its
 * p->nin operands (vals of g, with the leading batch axis when p->batch),
 * out_ct[p->nout] the cotangents of its outputs (zeros for float outputs
 * without one, NULL for the others). Writes in_ct[p->nin] (NULL: zero; only
 * float operands get one). The forward call is re-emitted (and hash-consed
 * with the existing one) so the kernel's vjp sees the outputs; a batched call
 * runs the vjp per item through vmap. Fails with a named error when the
 * kernel has no vjp. */
nb_status nb__custom_call_emit_vjp(nb_graph *g, nb_loc loc, const nb_custom_call_params *p, nb_val *const *primals,
                                   nb_val *const *out_ct, nb_val **in_ct);

#endif
