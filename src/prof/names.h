/* How profiles name what compiled steps touch: a value of an executable's
 * optimized graph is named by the input path it comes from (the trainer's
 * inputs are "params/layers/0/attn/wq", "opt_state/...", "batch/tokens")
 * when it is that input or a layout copy or conversion of it, else by the
 * equation that computes it and where that was traced. One place for the
 * op profile, the memory viewer and the graph viewer, so that one buffer
 * has one name in all of them. Private to library prof. */
#ifndef NABLA_PROF_NAMES_H
#define NABLA_PROF_NAMES_H

#include <stddef.h>

#include "core/ir.h"

/* The path of the graph input v is, or is a reshape, transpose, broadcast,
 * conversion (or a chain of them) of; NULL when v is computed from
 * anything else. Borrowed from g. */
const char *nb_prof__input_path(const nb_graph *g, const nb_val *v);

/* The path of the first graph output v is, or NULL. Borrowed from g. */
const char *nb_prof__output_path(const nb_graph *g, const nb_val *v);

/* "nn/apply.c:12": where an equation was traced, with its file's last
 * folder only; "" when unknown. */
void nb_prof__loc_str(nb_loc loc, char *buf, size_t cap);

/* The source op of v: its primitive's name ("dot_general"), "input" or
 * "constant". */
const char *nb_prof__value_op(const nb_val *v);

/* The name profiles show for v: its input path (with " (transpose)" and the
 * like when it is a copy of one), else its output path, else "<op>
 * <type> at <loc>" ("dot_general f32[8,32] at nn/apply.c:12"). */
void nb_prof__value_name(const nb_graph *g, const nb_val *v, char *buf, size_t cap);

#endif
