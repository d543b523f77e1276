/* Shared machinery of the elementwise primitives: dtype classes, the
 * same-shape rule and the generic batching rule. */
#include <string.h>

#include "core/prims/elementwise.h"

bool nb__dtype_in_class(nb_dtype t, nb_dtype_class c) {
  switch (c) {
  case NB_CLASS_FLOAT: return nb_dtype_is_float(t);
  case NB_CLASS_NUMERIC: return t != NB_BOOL;
  case NB_CLASS_INTBOOL: return nb_dtype_is_int(t) || t == NB_BOOL;
  default: return true;
  }
}

const char *nb__class_name(nb_dtype_class c) {
  static const char *const names[] = {"a floating dtype", "a numeric (non-bool) dtype", "an integer or bool dtype",
                                      "any dtype"};
  return names[c];
}

nb_status nb__ew_infer(int nin, const nb_aval *in, nb_dtype_class c, bool bool_out, nb_aval *out, char *why,
                       size_t cap) {
  for (int i = 1; i < nin; i++) {
    if (in[i].dtype != in[0].dtype)
      return snprintf(why, cap, "operand dtypes differ (%s vs %s)", nb_dtype_name(in[0].dtype),
                      nb_dtype_name(in[i].dtype)), NB_ERR_DTYPE;
    if (!nb_shape_equal(&in[i].shape, &in[0].shape)) return snprintf(why, cap, "operand shapes differ"), NB_ERR_SHAPE;
  }
  if (!nb__dtype_in_class(in[0].dtype, c))
    return snprintf(why, cap, "dtype %s is not allowed: needs %s", nb_dtype_name(in[0].dtype), nb__class_name(c)),
           NB_ERR_DTYPE;
  out[0] = in[0];
  if (bool_out) out[0].dtype = NB_BOOL;
  return NB_OK;
}

nb_val *nb__reemit(nb_graph *g, const nb_eqn *e, nb_val *const *in) {
  return nb__emit1(g, e->loc, e->prim, e->nin, in, e->params, e->params_size);
}

nb_status nb__ew_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t axis_size,
                       nb_val **out, int *out_bdims) {
  nb_val *moved[8];
  if (e->nin > 8) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "elementwise batching: too many operands"), NB_ERR_INTERNAL;
  for (int i = 0; i < e->nin; i++) moved[i] = nb__batch_to_front(e->loc, in[i], bdims[i], axis_size);
  nb_val *outs[8];
  nb__emit(g, e->loc, e->prim, e->nin, moved, e->params, e->params_size, NULL, outs);
  for (int i = 0; i < e->nout; i++) {
    out[i] = outs[i];
    out_bdims[i] = 0;
  }
  return nb_graph_status(g);
}
