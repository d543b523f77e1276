/* Names of values in profiles (names.h): by parameter path where a value is
 * one, else by its source equation. Not here: what is reported about them. */
#include <stdio.h>
#include <string.h>

#include "prof/names.h"

/* the equation v is a pure relabelling or conversion of its one operand */
static const nb_eqn *copy_of_one(const nb_val *v) {
  const nb_eqn *e = v ? v->def : NULL;
  if (!e || e->nin != 1 || e->nout != 1) return NULL;
  nb_prim_kind k = nb__rules(e->prim)->kind;
  bool conv = e->prim == NB_PRIM_convert || e->prim == NB_PRIM_bitcast || e->prim == NB_PRIM_stop_gradient;
  return k == NB_KIND_LAYOUT || conv ? e : NULL;
}

const char *nb_prof__input_path(const nb_graph *g, const nb_val *v) {
  for (const nb_eqn *e; v && (e = copy_of_one(v));) v = e->in[0];
  return v && v->input_index >= 0 ? nb_graph_input_path(g, (size_t)v->input_index) : NULL;
}

const char *nb_prof__output_path(const nb_graph *g, const nb_val *v) {
  for (size_t o = 0; v && o < nb_graph_num_outputs(g); o++)
    if (nb__graph_output(g, o) == v) return nb_graph_output_path(g, o);
  return NULL;
}

void nb_prof__loc_str(nb_loc loc, char *buf, size_t cap) {
  if (!cap) return;
  if (!loc.file) {
    buf[0] = 0;
    return;
  }
  const char *file = loc.file;
  for (const char *p = loc.file, *last = NULL; *p; p++)
    if (*p == '/') file = last ? last + 1 : file, last = p;
  snprintf(buf, cap, "%s:%d", file, loc.line);
}

const char *nb_prof__value_op(const nb_val *v) {
  if (!v) return "?";
  if (v->input_index >= 0) return "input";
  return v->def ? nb__rules(v->def->prim)->name : "constant";
}

void nb_prof__value_name(const nb_graph *g, const nb_val *v, char *buf, size_t cap) {
  if (!cap) return;
  const char *in = nb_prof__input_path(g, v), *out = in ? NULL : nb_prof__output_path(g, v);
  if (in) {
    snprintf(buf, cap, "%s", in);
    if (v->input_index < 0) { /* a copy of the input: say which op made it */
      size_t n = strlen(buf);
      snprintf(buf + n, cap - n, " (%s)", nb_prof__value_op(v));
    }
    return;
  }
  if (out) {
    snprintf(buf, cap, "%s", out);
    return;
  }
  char type[96] = "", at[160] = "";
  if (v) nb_aval_str(&v->aval, type, sizeof type);
  if (v && v->def) nb_prof__loc_str(v->def->loc, at, sizeof at);
  snprintf(buf, cap, "%s %s%s%s", nb_prof__value_op(v), type, at[0] ? " at " : "", at);
}
