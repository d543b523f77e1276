/* Dtype changes and identities: convert (value conversion), bitcast
 * (reinterpretation of same-size dtypes) and stop_gradient (identity with a
 * zero derivative). */
#include <string.h>

#include "core/prims/elementwise.h"

static nb_status convert_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  const nb_convert_params *p = params;
  *nout = 1;
  if (p->dtype < 0 || p->dtype >= NB_DTYPE_COUNT) return snprintf(why, cap, "invalid target dtype"), NB_ERR_DTYPE;
  out[0] = in[0];
  out[0].dtype = p->dtype;
  return NB_OK;
}

static nb_status convert_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  nb_convert_elements(nb_array_dtype(out[0]), nb_array_data_mut(out[0]), nb_array_dtype(in[0]), nb_array_data(in[0]),
                      nb_array_size(in[0]));
  return NB_OK;
}

static nb_status convert_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                             nb_val **ot) {
  const nb_convert_params *cp = e->params;
  ot[0] = t[0] && nb_dtype_is_float(cp->dtype) ? nb_convert_at(e->loc, t[0], cp->dtype) : NULL;
  return nb_graph_status(g);
}

static nb_status convert_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                   nb_val *const *ct_out, nb_val **ct_in) {
  ct_in[0] = ct_out[0] ? nb_convert_at(e->loc, ct_out[0], e->in[0]->aval.dtype) : NULL;
  return nb_graph_status(g);
}

static void convert_print(const nb_eqn *e, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", nb_dtype_name(((const nb_convert_params *)e->params)->dtype));
}

const nb_prim_rules nb__prim_convert = {
    .name = "convert",
    .kind = NB_KIND_ELEMENTWISE,
    .params_size = sizeof(nb_convert_params),
    .infer = convert_infer,
    .eval = convert_eval,
    .jvp = convert_jvp,
    .transpose = convert_transpose,
    .batch = nb__ew_batch,
    .print_params = convert_print,
    .fusion = NB_FUSE_CONVERT,
};

static nb_status bitcast_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                               size_t cap) {
  nb_status s = convert_infer(params, nin, in, nout, out, why, cap);
  if (s == NB_OK && nb_dtype_size(out[0].dtype) != nb_dtype_size(in[0].dtype))
    return snprintf(why, cap, "bitcast between dtypes of different sizes (%s to %s)", nb_dtype_name(in[0].dtype),
                    nb_dtype_name(out[0].dtype)), NB_ERR_DTYPE;
  return s;
}

static nb_status copy_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  memcpy(nb_array_data_mut(out[0]), nb_array_data(in[0]), nb_array_nbytes(in[0]));
  return NB_OK;
}

static nb_status zero_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                          nb_val **ot) {
  ot[0] = NULL;
  return NB_OK;
}

const nb_prim_rules nb__prim_bitcast = {
    .name = "bitcast",
    .kind = NB_KIND_ELEMENTWISE,
    .params_size = sizeof(nb_convert_params),
    .infer = bitcast_infer,
    .eval = copy_eval,
    .jvp = zero_jvp,
    .batch = nb__ew_batch,
    .print_params = convert_print,
};

static nb_status identity_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                size_t cap) {
  *nout = 1;
  out[0] = in[0];
  return NB_OK;
}

const nb_prim_rules nb__prim_stop_gradient = {
    .name = "stop_gradient",
    .kind = NB_KIND_ELEMENTWISE,
    .infer = identity_infer,
    .eval = copy_eval,
    .jvp = zero_jvp,
    .batch = nb__ew_batch,
    .fusion = NB_FUSE_EXPR,
    .c = &(const nb_c_expr){.f = "$0", .i = "$0", .exact = true},
};

nb_val *nb_convert_at(nb_loc loc, nb_val *x, nb_dtype t) {
  if (!x) return NULL;
  if (x->aval.dtype == t) return x;
  nb_convert_params p;
  memset(&p, 0, sizeof p);
  p.dtype = t;
  return nb__emit1(x->g, loc, NB_PRIM_convert, 1, &x, &p, sizeof p);
}

nb_val *nb_bitcast_at(nb_loc loc, nb_val *x, nb_dtype t) {
  if (!x) return NULL;
  if (x->aval.dtype == t) return x;
  nb_convert_params p;
  memset(&p, 0, sizeof p);
  p.dtype = t;
  return nb__emit1(x->g, loc, NB_PRIM_bitcast, 1, &x, &p, sizeof p);
}

nb_val *nb_stop_gradient_at(nb_loc loc, nb_val *x) {
  if (!x) return NULL;
  return nb__emit1(x->g, loc, NB_PRIM_stop_gradient, 1, &x, NULL, 0);
}
