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

#endif
