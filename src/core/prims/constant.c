/* Constants and iota: the primitives with no operands. A constant holds a
 * reference to its array (kept alive by the graph); it is hashed by content,
 * so equal constants are one value. */
#include <string.h>

#include "core/ir.h"
#include "core/prims/params.h"

static nb_status constant_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                                size_t cap) {
  const nb_constant_params *p = params;
  *nout = 1;
  out[0] = nb_array_aval(p->value);
  return NB_OK;
}

static nb_status constant_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_constant_params *p = e->params;
  memcpy(nb_array_data_mut(out[0]), nb_array_data(p->value), nb_array_nbytes(p->value));
  return NB_OK;
}

static uint64_t constant_hash(const void *params, size_t size) {
  const nb_array *a = ((const nb_constant_params *)params)->value;
  nb_aval av = nb_array_aval(a);
  uint64_t h = nb__hash_bytes(&av.dtype, sizeof av.dtype, 3);
  h = nb__hash_combine(h, nb__hash_bytes(av.shape.dims, sizeof(int64_t) * (size_t)av.shape.rank, (uint64_t)av.shape.rank));
  return nb__hash_combine(h, nb__hash_bytes(nb_array_data(a), nb_array_nbytes(a), 5));
}

static bool constant_equal(const void *a, const void *b, size_t size) {
  const nb_constant_params *x = a, *y = b;
  return x->value == y->value || nb_array_equal(x->value, y->value);
}

static nb_status constant_hold(nb_graph *g, const void *params) {
  return nb__graph_hold_array(g, ((const nb_constant_params *)params)->value);
}

static void constant_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_array *a = ((const nb_constant_params *)e->params)->value;
  int64_t n = nb_array_size(a);
  if (n == 1) {
    snprintf(buf, cap, "%.9g", nb_array_get(a, 0));
  } else {
    uint64_t h = constant_hash(e->params, e->params_size);
    snprintf(buf, cap, "#%016llx", (unsigned long long)h);
  }
}

static void constant_cost(const nb_eqn *e, double *flops, double *bytes) {
  *flops = 0;
  *bytes = 0; /* constants live in the executable */
}

/* A constant's batching never happens (it has no operands); its derivative
 * is zero, which the transformations derive from "no float inputs". */
const nb_prim_rules nb__prim_constant = {
    .name = "constant",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_constant_params),
    .fusion = NB_FUSE_INDEX, /* scalars only: a literal */
    .infer = constant_infer,
    .eval = constant_eval,
    .cost = constant_cost,
    .print_params = constant_print,
    .hash_params = constant_hash,
    .params_equal = constant_equal,
    .hold_params = constant_hold,
};

static nb_status iota_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                            size_t cap) {
  const nb_iota_params *p = params;
  *nout = 1;
  out[0] = p->aval;
  if (p->aval.dtype == NB_BOOL) return snprintf(why, cap, "iota of bool"), NB_ERR_DTYPE;
  if (p->axis < 0 || p->axis >= p->aval.shape.rank)
    return snprintf(why, cap, "axis %d out of range for rank %d", p->axis, p->aval.shape.rank), NB_ERR_INVALID_ARG;
  for (int i = 0; i < p->aval.shape.rank; i++)
    if (p->aval.shape.dims[i] < 0) return snprintf(why, cap, "negative dim"), NB_ERR_SHAPE;
  return NB_OK;
}

static nb_status iota_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_iota_params *p = e->params;
  int64_t strides[NB_MAX_RANK], n = nb_shape_size(&p->aval.shape);
  nb__strides(&p->aval.shape, strides);
  void *d = nb_array_data_mut(out[0]);
  for (int64_t i = 0; i < n; i++)
    nb__store_i64(p->aval.dtype, d, i, (i / strides[p->axis]) % p->aval.shape.dims[p->axis]);
  return NB_OK;
}

static void iota_print(const nb_eqn *e, char *buf, size_t cap) {
  snprintf(buf, cap, "axis=%d", ((const nb_iota_params *)e->params)->axis);
}

const nb_prim_rules nb__prim_iota = {
    .name = "iota",
    .kind = NB_KIND_ELEMENTWISE,
    .params_size = sizeof(nb_iota_params),
    .fusion = NB_FUSE_INDEX,
    .infer = iota_infer,
    .eval = iota_eval,
    .print_params = iota_print,
};

/* ---------------------------------------------------------------- public */

nb_val *nb_const_at(nb_loc loc, nb_graph *g, nb_array *a) {
  if (!g) return NULL;
  if (!a) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "constant: NULL array");
  if (nb_array_device(a).kind != NB_DEVICE_CPU)
    return nb__fail(g, loc, NB_ERR_UNIMPLEMENTED, "constant: device arrays cannot be captured yet");
  nb_constant_params p = {a};
  return nb__emit1(g, loc, NB_PRIM_constant, 0, NULL, &p, sizeof p);
}
