/* quant.matmul as a custom call (its operand checks, shared by the infer
 * rule and the traced op, which names the field; the eval that runs the
 * kernels; the vjp for x; the cost), and the same product as ordinary
 * traced ops: nb_quant_dequantize_traced and nb_quant_matmul_reference. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/internal.h"

#define MM_NAME NB_QUANT__MATMUL_NAME

/* The call's attributes: the layout and the activation mode. */
typedef struct mm_attrs {
  int32_t qtype, asymmetric, act;
  float act_scale; /* int8_static */
  int64_t n, k, tile;
} mm_attrs;

static nb_quant_layout layout_of(const mm_attrs *a) {
  return (nb_quant_layout){.qtype = (nb_quant_type)a->qtype, .n = a->n, .k = a->k, .tile = a->tile, .asymmetric = a->asymmetric != 0};
}

static bool aval_is(const nb_aval *got, nb_aval want) { return got->dtype == want.dtype && nb_shape_equal(&got->shape, &want.shape); }

static bool want_aval(const char *field, const nb_aval *got, nb_aval want, char *why, size_t cap) {
  if (aval_is(got, want)) return true;
  snprintf(why, cap, "%s: %s[%lld, %lld] wanted, got %s of rank %d", field, nb_dtype_name(want.dtype), (long long)want.shape.dims[0],
           (long long)want.shape.dims[1], nb_dtype_name(got->dtype), got->shape.rank);
  return false;
}

/* x, values, scales (, zero_points) against the attributes */
static bool check_operands(const mm_attrs *a, int nin, const nb_aval *in, char *why, size_t cap) {
  nb_quant_layout l = layout_of(a);
  if (!nb_quant__layout_ok(&l, why, cap)) return false;
  if (!nb_quant__act_ok(&l, (nb_quant_act)a->act, why, cap)) return false;
  if (a->act == NB_QUANT_ACT_INT8_STATIC && !(a->act_scale >= 0 && isfinite(a->act_scale)))
    return snprintf(why, cap, "act_scale: %g is not a finite scale >= 0 (int8_static needs a calibrated one)", (double)a->act_scale), false;
  int want = 3 + (l.asymmetric ? 1 : 0);
  if (nin != want)
    return snprintf(why, cap, "operands: x, values, scales%s wanted (%d), got %d", l.asymmetric ? ", zero_points" : "", want, nin), false;
  const nb_aval *x = &in[0];
  if (x->dtype != NB_F32 || x->shape.rank < 1 || x->shape.dims[x->shape.rank - 1] != l.k)
    return snprintf(why, cap, "x: f32[..., %lld] wanted (k inputs last), got %s of rank %d", (long long)l.k, nb_dtype_name(x->dtype),
                    x->shape.rank), false;
  if (!want_aval("values", &in[1], nb_quant_values_aval(&l), why, cap)) return false;
  if (!want_aval("scales", &in[2], nb_quant_scales_aval(&l), why, cap)) return false;
  if (l.asymmetric && !want_aval("zero_points", &in[3], nb_quant_zero_points_aval(&l), why, cap)) return false;
  return true;
}

/* ---------------------------------------------------------------- custom call */

static nb_status mm_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out) {
  (void)ud;
  char why[240];
  if (nout != 1 || attrs_size != sizeof(mm_attrs)) return NB_ERR_INVALID_ARG;
  mm_attrs a;
  memcpy(&a, attrs, sizeof a);
  if (!check_operands(&a, nin, in, why, sizeof why)) return NB_ERR_SHAPE;
  out[0] = in[0];
  out[0].shape.dims[out[0].shape.rank - 1] = a.n;
  return NB_OK;
}

static nb_status mm_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout,
                         nb_array **out) {
  (void)ud, (void)attrs_size, (void)nout;
  mm_attrs a;
  memcpy(&a, attrs, sizeof a);
  nb_quant__mm p = {.l = layout_of(&a), .m = nb_array_size(in[0]) / a.k, .x = nb_array_data(in[0]), .values = nb_array_data(in[1]),
                    .scales = nb_array_data(in[2]), .zero_points = nin > 3 ? nb_array_data(in[3]) : NULL,
                    .act = (nb_quant_act)a.act, .act_scale = a.act_scale, .y = nb_array_data_mut(out[0])};
  return p.m == 0 ? NB_OK : nb_quant__matmul(ctx, &p);
}

/* dx = ct @ dequant(W): the weight is frozen (QLoRA's base), so its arrays
 * get no cotangent; W8A8's rounding of x passes the gradient straight
 * through. */
static nb_status mm_vjp(void *ud, nb_graph *g, int nin, nb_val *const *in, int nout, nb_val *const *out, nb_val *const *out_ct,
                        const void *attrs, size_t attrs_size, nb_val **in_ct) {
  (void)ud, (void)nout, (void)out, (void)attrs_size;
  mm_attrs a;
  memcpy(&a, attrs, sizeof a);
  nb_quant_layout l = layout_of(&a);
  for (int i = 0; i < nin; i++) in_ct[i] = NULL;
  nb_val *w = nb_quant_dequantize_traced(in[1], in[2], nin > 3 ? in[3] : NULL, &l);
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(out_ct[0]) - 1}, .rhs_contract = {0}};
  in_ct[0] = nb_dot_general(out_ct[0], w, &dn, NB_F32);
  return nb_graph_status(g);
}

static void mm_cost(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, double *flops, double *bytes) {
  (void)ud, (void)attrs_size;
  mm_attrs a;
  memcpy(&a, attrs, sizeof a);
  double m = 1;
  for (int d = 0; d + 1 < in[0].shape.rank; d++) m *= (double)in[0].shape.dims[d];
  nb_quant_layout l = layout_of(&a);
  double wbytes = (double)(l.n * nb_quant__row_bytes(&l)) + (double)(l.n * nb_quant_num_tiles(&l)) * (nin > 3 ? 5 : 4);
  *flops = 2 * m * (double)a.n * (double)a.k;
  *bytes = wbytes + 4 * m * (double)(a.k + a.n);
}

nb_status nb_quant_register(nb_ctx *ctx) {
  if (nb_custom_call_registered(ctx, MM_NAME)) return NB_OK;
  nb_custom_call_rules r = {.name = MM_NAME, .infer = mm_infer, .eval = mm_eval, .vjp = mm_vjp, .cost = mm_cost};
  return nb_custom_call_register(ctx, &r);
}

/* ---------------------------------------------------------------- traced ops */

/* The operands' avals checked as the call will (NULL values poison). */
static nb_graph *checked(nb_loc loc, const char *op, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                         const nb_quant_layout *layout, nb_quant_act act, float act_scale, mm_attrs *a) {
  nb_val *any = values ? values : scales ? scales : x;
  if (!any) return NULL;
  nb_graph *g = nb_val_graph(any);
  char why[240];
  if (!layout) {
    nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "%s: layout: NULL", op);
    return NULL;
  }
  *a = (mm_attrs){.qtype = layout->qtype, .asymmetric = layout->asymmetric, .act = act, .act_scale = act_scale, .n = layout->n,
                  .k = layout->k, .tile = layout->tile};
  nb_val *v[4] = {x, values, scales, zero_points};
  const char *names[4] = {"x", "values", "scales", "zero_points"};
  int nin = 3 + (layout->asymmetric ? 1 : 0);
  nb_aval av[4];
  for (int i = 0; i < nin; i++) {
    if (!v[i]) {
      nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "%s: %s: missing", op, names[i]);
      return NULL;
    }
    av[i] = nb_val_aval(v[i]);
  }
  if (!layout->asymmetric && zero_points) {
    nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "%s: zero_points: given for a symmetric layout", op);
    return NULL;
  }
  if (!check_operands(a, nin, av, why, sizeof why)) {
    nb_graph_fail_at(loc, g, NB_ERR_SHAPE, "%s: %s", op, why);
    return NULL;
  }
  return g;
}

static nb_val *matmul(nb_loc loc, const char *op, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                      const nb_quant_layout *layout, nb_quant_act act, float act_scale) {
  mm_attrs a;
  nb_graph *g = checked(loc, op, x, values, scales, zero_points, layout, act, act_scale, &a);
  if (!g) return x ? nb_graph_fail_at(loc, nb_val_graph(x), NB_ERR_INVALID_ARG, "%s: bad operands", op) : NULL;
  nb_status st = nb_quant_register(nb_graph_ctx(g));
  if (st != NB_OK) return nb_graph_fail_at(loc, g, st, "nb_quant_matmul: registering %s failed", MM_NAME);
  nb_val *in[4] = {x, values, scales, zero_points};
  return nb_custom_call_at(loc, g, MM_NAME, 3 + (layout->asymmetric ? 1 : 0), in, &a, sizeof a, 1, NULL);
}

nb_val *nb_quant_matmul_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points, const nb_quant_layout *layout,
                           nb_quant_act act) {
  if (act == NB_QUANT_ACT_INT8_STATIC && x)
    return nb_graph_fail_at(loc, nb_val_graph(x), NB_ERR_INVALID_ARG, "nb_quant_matmul: act: int8_static needs its scale: "
                            "nb_quant_matmul_static");
  return matmul(loc, "nb_quant_matmul", x, values, scales, zero_points, layout, act, 0);
}

nb_val *nb_quant_matmul_static_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, const nb_quant_layout *layout, float act_scale) {
  return matmul(loc, "nb_quant_matmul_static", x, values, scales, NULL, layout, NB_QUANT_ACT_INT8_STATIC, act_scale);
}

/* [n, T] per-tile values spread over k: [n, T, tile] -> [n, T*tile] -> [n, k] */
static nb_val *per_k(nb_loc loc, nb_val *t, const nb_quant_layout *l) {
  int64_t T = nb_quant_num_tiles(l);
  if (T == 1) return t; /* [n, 1] broadcasts */
  nb_val *b = nb_broadcast_in_dim_at(loc, t, 3, (int64_t[]){l->n, T, l->tile}, (int[]){0, 1});
  nb_val *r = nb_reshape_at(loc, b, 2, (int64_t[]){l->n, T * l->tile});
  return nb_slice_at(loc, r, (int64_t[]){0, 0}, (int64_t[]){l->n, l->k}, NULL);
}

/* the 4-bit codes of [n, ceil(k/2)] bytes as i32[n, k], low nibble first */
static nb_val *unpack_nibbles(nb_loc loc, nb_val *values, const nb_quant_layout *l) {
  nb_graph *g = nb_val_graph(values);
  int64_t rb = nb_quant__row_bytes(l);
  nb_val *v = nb_convert_at(loc, values, NB_I32), *sixteen = nb_scalar_at(loc, g, NB_I32, 16);
  nb_val *lo = nb_expand_dims_at(loc, nb_rem_at(loc, v, sixteen), 2), *hi = nb_expand_dims_at(loc, nb_div_at(loc, v, sixteen), 2);
  nb_val *both = nb_concatenate_at(loc, 2, (nb_val *[]){lo, hi}, 2);
  nb_val *codes = nb_reshape_at(loc, both, 2, (int64_t[]){l->n, 2 * rb});
  return nb_slice_at(loc, codes, (int64_t[]){0, 0}, (int64_t[]){l->n, l->k}, NULL);
}

/* a table of f32 values indexed by codes (i32) */
static nb_val *lookup(nb_loc loc, nb_graph *g, const float *table, int64_t size, nb_val *codes) {
  nb_array *t = nb_array_create(nb_graph_ctx(g), NB_F32, 1, &size, table);
  if (!t) return nb_graph_fail_at(loc, g, NB_ERR_NOMEM, "nb_quant_dequantize_traced: out of memory");
  nb_val *tv = nb_const_at(loc, g, t);
  nb_array_release(t);
  return nb_take_at(loc, tv, codes);
}

nb_val *nb_quant_dequantize_traced_at(nb_loc loc, nb_val *values, nb_val *scales, nb_val *zero_points, const nb_quant_layout *layout) {
  if (!values || !scales) return NULL;
  nb_graph *g = nb_val_graph(values);
  char why[240];
  if (!nb_quant__layout_ok(layout, why, sizeof why)) return nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "nb_quant_dequantize_traced: %s", why);
  const nb_quant_layout *l = layout;
  nb_aval va = nb_val_aval(values), sa = nb_val_aval(scales);
  if (!want_aval("values", &va, nb_quant_values_aval(l), why, sizeof why) ||
      !want_aval("scales", &sa, nb_quant_scales_aval(l), why, sizeof why))
    return nb_graph_fail_at(loc, g, NB_ERR_SHAPE, "nb_quant_dequantize_traced: %s", why);
  if (l->asymmetric != (zero_points != NULL))
    return nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "nb_quant_dequantize_traced: zero_points: %s",
                            l->asymmetric ? "missing (asymmetric layout)" : "given for a symmetric layout");
  if (zero_points) {
    nb_aval za = nb_val_aval(zero_points);
    if (!want_aval("zero_points", &za, nb_quant_zero_points_aval(l), why, sizeof why))
      return nb_graph_fail_at(loc, g, NB_ERR_SHAPE, "nb_quant_dequantize_traced: %s", why);
  }
  nb_val *codes; /* f32[n, k] without the scale */
  switch (l->qtype) {
  case NB_QUANT_INT8:
  case NB_QUANT_INT4: {
    nb_val *c = l->qtype == NB_QUANT_INT8 ? nb_convert_at(loc, values, NB_F32) : nb_convert_at(loc, unpack_nibbles(loc, values, l), NB_F32);
    nb_val *z = zero_points ? per_k(loc, nb_convert_at(loc, zero_points, NB_F32), l)
                            : l->qtype == NB_QUANT_INT4 ? nb_scalar_at(loc, g, NB_F32, 8) : NULL;
    codes = z ? nb_sub_at(loc, c, z) : c;
    break;
  }
  case NB_QUANT_NF4: codes = lookup(loc, g, nb_quant__nf4_table, 16, unpack_nibbles(loc, values, l)); break;
  default: {
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = nb_quant_fp8_decode((uint8_t)c, l->qtype);
    codes = lookup(loc, g, table, 256, nb_convert_at(loc, values, NB_I32));
    break;
  }
  }
  return nb_mul_at(loc, codes, per_k(loc, scales, l));
}

/* round half to even, for |v| < 2^22: floor, then up past the half or at
 * the half of an odd floor */
static nb_val *round_even(nb_loc loc, nb_val *v) {
  nb_graph *g = nb_val_graph(v);
  nb_val *f = nb_floor_at(loc, v), *d = nb_sub_at(loc, v, f), *half = nb_scalar_at(loc, g, NB_F32, 0.5);
  nb_val *odd = nb_ne_at(loc, nb_rem_at(loc, f, nb_scalar_at(loc, g, NB_F32, 2)), nb_scalar_at(loc, g, NB_F32, 0));
  nb_val *up = nb_or_at(loc, nb_gt_at(loc, d, half), nb_and_at(loc, nb_eq_at(loc, d, half), odd));
  return nb_select_at(loc, up, nb_add_at(loc, f, nb_scalar_at(loc, g, NB_F32, 1)), f);
}

/* x -> clamp(round(x / s), -127, 127) * s with a fixed s (0: zeros) */
static nb_val *round_static(nb_loc loc, nb_val *x, float act_scale) {
  nb_graph *g = nb_val_graph(x);
  if (act_scale == 0) return nb_mul_at(loc, x, nb_scalar_at(loc, g, NB_F32, 0));
  nb_val *s = nb_scalar_at(loc, g, NB_F32, act_scale);
  nb_val *v = nb_max_at(loc, nb_min_at(loc, nb_div_at(loc, x, s), nb_scalar_at(loc, g, NB_F32, 127)), nb_scalar_at(loc, g, NB_F32, -127));
  return nb_mul_at(loc, round_even(loc, v), s);
}

/* x -> round(x / s) * s along the last axis, s = max |x| / 127 (1 for zeros) */
static nb_val *round_int8(nb_loc loc, nb_val *x) {
  nb_graph *g = nb_val_graph(x);
  int last = nb_val_rank(x) - 1;
  nb_val *s = nb_div_at(loc, nb_reduce_max_at(loc, nb_abs_at(loc, x), 1, &last), nb_scalar_at(loc, g, NB_F32, 127));
  s = nb_expand_dims_at(loc, s, last);
  nb_val *safe = nb_select_at(loc, nb_gt_at(loc, s, nb_scalar_at(loc, g, NB_F32, 0)), s, nb_full_like_at(loc, s, 1));
  nb_val *v = nb_max_at(loc, nb_min_at(loc, nb_div_at(loc, x, safe), nb_scalar_at(loc, g, NB_F32, 127)), nb_scalar_at(loc, g, NB_F32, -127));
  return nb_mul_at(loc, round_even(loc, v), s);
}

/* x rounded as the W8A8 kernels round it (act: per row or per 32-element
 * block of the last axis), still f32. */
nb_val *nb_quant__round_act_at(nb_loc loc, nb_val *x, nb_quant_act act) {
  if (act == NB_QUANT_ACT_INT8_DYNAMIC) return round_int8(loc, x);
  if (act != NB_QUANT_ACT_INT8_BLOCK) return x;
  /* per 32 elements: [M, K] zero-padded to [M, B, 32] */
  nb_graph *g = nb_val_graph(x);
  nb_aval xa = nb_val_aval(x);
  int last = xa.shape.rank - 1;
  int64_t K = xa.shape.dims[last], B = (K + NB_QUANT__ACT_BLOCK - 1) / NB_QUANT__ACT_BLOCK, M = 1;
  for (int d = 0; d < last; d++) M *= xa.shape.dims[d];
  nb_val *flat = nb_reshape_at(loc, x, 2, (int64_t[]){M, K});
  nb_val *pad = nb_pad_at(loc, flat, nb_scalar_at(loc, g, NB_F32, 0), (int64_t[]){0, 0}, (int64_t[]){0, B * NB_QUANT__ACT_BLOCK - K}, NULL);
  nb_val *r = round_int8(loc, nb_reshape_at(loc, pad, 3, (int64_t[]){M, B, NB_QUANT__ACT_BLOCK}));
  r = nb_slice_at(loc, nb_reshape_at(loc, r, 2, (int64_t[]){M, B * NB_QUANT__ACT_BLOCK}), (int64_t[]){0, 0}, (int64_t[]){M, K}, NULL);
  return nb_reshape_at(loc, r, xa.shape.rank, xa.shape.dims);
}

static nb_val *reference(nb_loc loc, const char *op, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                         const nb_quant_layout *layout, nb_quant_act act, float act_scale) {
  mm_attrs a;
  nb_graph *g = checked(loc, op, x, values, scales, zero_points, layout, act, act_scale, &a);
  if (!g) return x ? nb_graph_fail_at(loc, nb_val_graph(x), NB_ERR_INVALID_ARG, "%s: bad operands", op) : NULL;
  int last = nb_val_rank(x) - 1;
  x = act == NB_QUANT_ACT_INT8_STATIC ? round_static(loc, x, act_scale) : nb_quant__round_act_at(loc, x, act);
  nb_val *w = nb_quant_dequantize_traced_at(loc, values, scales, zero_points, layout);
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {last}, .rhs_contract = {1}};
  return nb_dot_general_at(loc, x, w, &dn, NB_F32);
}

nb_val *nb_quant_matmul_reference_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                                     const nb_quant_layout *layout, nb_quant_act act) {
  if (act == NB_QUANT_ACT_INT8_STATIC && x)
    return nb_graph_fail_at(loc, nb_val_graph(x), NB_ERR_INVALID_ARG, "nb_quant_matmul_reference: act: int8_static needs its "
                            "scale: nb_quant_matmul_reference_static");
  return reference(loc, "nb_quant_matmul_reference", x, values, scales, zero_points, layout, act, 0);
}

nb_val *nb_quant_matmul_reference_static_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, const nb_quant_layout *layout,
                                            float act_scale) {
  return reference(loc, "nb_quant_matmul_reference_static", x, values, scales, NULL, layout, NB_QUANT_ACT_INT8_STATIC, act_scale);
}
