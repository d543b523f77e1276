/* Private to the transformations: the drivers they share. */
#ifndef NABLA_TRANSFORM_H
#define NABLA_TRANSFORM_H

#include "core/ir.h"

/* Emits src into dst with forward-mode tangents: primal_in[i] / tangent_in[i]
 * (NULL tangent: zero; tangent_in NULL: all zero) for src's inputs; writes
 * src's outputs and their tangents (NULL: zero). */
nb_status nb__jvp_into(nb_graph *dst, const nb_graph *src, nb_val *const *primal_in, nb_val *const *tangent_in,
                       nb_val **primal_out, nb_val **tangent_out);

/* Reverse mode into dst: emits src's primal computation on primal_in, writes
 * its outputs to primal_out, then back-propagates the output cotangents
 * ct_out[i] (NULL: zero) and writes input cotangents to ct_in[i] for the
 * inputs with wrt[i] (others NULL). ct_out may be NULL: all zero but for
 * seed_first, a cotangent of one for output 0. */
nb_status nb__vjp_into(nb_graph *dst, const nb_graph *src, const bool *wrt, nb_val *const *primal_in,
                       nb_val *const *ct_out, bool seed_first, nb_val **primal_out, nb_val **ct_in);

/* Partial evaluation of src's linearization (JAX's partial_eval of a jvp),
 * with tangents for the inputs where tan_in[i] (float inputs only):
 *   known:   src's inputs -> (src's outputs as primal/<i>, then the computed
 *            residuals as residual/<r>)
 *   lin:     (the nres residuals, then the tangents in input order) -> the
 *            tangents of the outputs where want_out[i] (zeros where none)
 *   hoisted: (the inputs where inv_in[i]) -> the loop-invariant residuals;
 *            NULL when inv_in is NULL
 * Residuals are the primal values that lin reads; res_input[r] says where
 * residual r comes from: src's input i >= 0 when fwd_in[i] (passed as it
 * is), NB__RES_HOISTED when it depends on inv_in inputs only (a scan's
 * consts: computed once, before the loop), else NB__RES_COMPUTED (an output
 * of known after src's, in order). Values with no operands (constants) are
 * recomputed in lin rather than passed. tout_nonzero (may be NULL) receives
 * which outputs have a non-zero tangent. On error, the context holds it and
 * *out is empty. */
enum { NB__RES_COMPUTED = -1, NB__RES_HOISTED = -2 };
typedef struct nb__partial {
  nb_graph *known, *lin, *hoisted;
  int nres;
  int *res_input; /* [nres] */
} nb__partial;
nb_status nb__partial_eval(nb_ctx *ctx, const nb_graph *src, const bool *tan_in, const bool *fwd_in, const bool *inv_in,
                           const bool *want_out, bool *tout_nonzero, nb__partial *out);
void nb__partial_free(nb_ctx *ctx, nb__partial *p);

#endif
