/* Quantization-aware training: fake quantization with a straight-through
 * estimator, and the nn linear hook that applies it to the linears a rule
 * matches (nabla train ... quant.rules=FILE).
 *
 * The weight's fake quantization is the custom call "quant.fake", whose
 * kernel is the host codec itself (nb_quant_quantize, then
 * nb_quant_dequantize): the forward sees exactly the weights PTQ of the same
 * parameters with the same rule gives, bit for bit. Its gradient is the
 * clipped straight-through estimator (PyTorch's FakeQuantize): the
 * cotangent passes unchanged where the weight quantizes without saturating
 * and is 0 where its code was clamped; the scales (functions of the weight)
 * get none. Activations (act_qtype int8_dynamic / int8_block) are rounded
 * as the W8A8 kernels round them, the gradient passing straight through. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/internal.h"

#define FAKE_NAME "quant.fake"

typedef struct fake_attrs {
  int32_t qtype, calib;
  int64_t tile;
  double k, min, max;
} fake_attrs;

static nb_quant_calib calib_of(const fake_attrs *a) {
  return (nb_quant_calib){.kind = (nb_quant_calib_kind)a->calib, .k = a->k, .min = a->min, .max = a->max};
}

static nb_status fake_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out) {
  (void)ud, (void)attrs;
  if (nin != 1 || nout != 2 || attrs_size != sizeof(fake_attrs)) return NB_ERR_INVALID_ARG;
  if (in[0].dtype != NB_F32 || in[0].shape.rank != 2) return NB_ERR_SHAPE;
  out[0] = out[1] = in[0];
  return NB_OK;
}

/* Whether w's code in its tile (scale s, zero point z) is inside the code
 * range before clamping: the element does not saturate. */
static bool in_range(const nb_quant_layout *l, float w, float s, int z) {
  if (s == 0) return true; /* a tile of zeros */
  double r = (double)w / s; /* symmetric int4's scale can be negative (absmax: the signed extreme is code -8) */
  switch (l->qtype) {
  case NB_QUANT_INT8:
  case NB_QUANT_INT4: {
    int qmax = l->qtype == NB_QUANT_INT8 ? 127 : 7, qmin = l->qtype == NB_QUANT_INT8 ? -127 : -8;
    int umax = l->qtype == NB_QUANT_INT8 ? 255 : 15;
    double c = nearbyint(r) + (l->asymmetric ? z : 0);
    return l->asymmetric ? c >= 0 && c <= umax : c >= qmin && c <= qmax;
  }
  case NB_QUANT_NF4: return fabs(r) <= 1;
  default: return fabs(r) <= nb_quant_fp8_max(l->qtype);
  }
}

/* in: the kernel [d_in, d_out]; out: dequant(quant(kernel^T))^T and the
 * mask of its elements that do not saturate (1 / 0). */
static nb_status fake_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout,
                           nb_array **out) {
  (void)ud, (void)nin, (void)attrs_size, (void)nout;
  fake_attrs a;
  memcpy(&a, attrs, sizeof a);
  nb_quant_calib c = calib_of(&a);
  nb_array *w = nb_array_transpose2d(ctx, in[0]);
  if (!w) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  nb_quant_weight q;
  nb_status s = nb_quant_quantize(ctx, w, (nb_quant_type)a.qtype, a.tile, &c, &q);
  nb_array *d = s ? NULL : nb_quant_dequantize(ctx, &q);
  if (!s && !d) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (!s) {
    const nb_quant_layout *l = &q.layout;
    int64_t N = l->n, K = l->k, T = nb_quant_num_tiles(l), tile = l->tile < K ? l->tile : K;
    const float *wv = nb_array_data(w), *dv = nb_array_data(d), *sc = nb_array_data(q.scales);
    const uint8_t *zp = q.zero_points ? nb_array_data(q.zero_points) : NULL;
    float *y = nb_array_data_mut(out[0]), *mask = nb_array_data_mut(out[1]);
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < K; k++) {
        int64_t t = n * T + k / tile;
        y[k * N + n] = dv[n * K + k];
        mask[k * N + n] = in_range(l, wv[n * K + k], sc[t], zp ? zp[t] : 0) ? 1.0f : 0.0f;
      }
  }
  nb_array_release(d);
  nb_quant_weight_release(&q);
  nb_array_release(w);
  return s;
}

/* The clipped straight-through estimator: ct where the weight did not
 * saturate, 0 where it did. */
static nb_status fake_vjp(void *ud, nb_graph *g, int nin, nb_val *const *in, int nout, nb_val *const *out, nb_val *const *out_ct,
                          const void *attrs, size_t attrs_size, nb_val **in_ct) {
  (void)ud, (void)nin, (void)in, (void)nout, (void)attrs, (void)attrs_size;
  in_ct[0] = out_ct[0] ? nb_mul(out_ct[0], out[1]) : NULL;
  return nb_graph_status(g);
}

static void fake_cost(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, double *flops, double *bytes) {
  (void)ud, (void)nin, (void)attrs, (void)attrs_size;
  double n = (double)in[0].shape.dims[0] * (double)in[0].shape.dims[1];
  *flops = 8 * n;
  *bytes = 12 * n;
}

static nb_status fake_register(nb_ctx *ctx) {
  if (nb_custom_call_registered(ctx, FAKE_NAME)) return NB_OK;
  nb_custom_call_rules r = {.name = FAKE_NAME, .infer = fake_infer, .eval = fake_eval, .vjp = fake_vjp, .cost = fake_cost};
  return nb_custom_call_register(ctx, &r);
}

nb_val *nb_quant_fake_weight_at(nb_loc loc, nb_val *kernel, const nb_quant_rule *rule) {
  if (!kernel) return NULL;
  nb_graph *g = nb_val_graph(kernel);
  if (!rule) return nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "nb_quant_fake_weight: rule: NULL");
  nb_aval ka = nb_val_aval(kernel);
  if (ka.dtype != NB_F32 || ka.shape.rank != 2)
    return nb_graph_fail_at(loc, g, NB_ERR_SHAPE, "nb_quant_fake_weight: kernel: f32[d_in, d_out] wanted, got %s of rank %d",
                            nb_dtype_name(ka.dtype), ka.shape.rank);
  const nb_quant_calib *c = &rule->weight_calibration;
  bool integer = rule->weight_qtype == NB_QUANT_INT8 || rule->weight_qtype == NB_QUANT_INT4;
  nb_quant_layout l = {.qtype = rule->weight_qtype, .n = ka.shape.dims[1], .k = ka.shape.dims[0],
                       .tile = rule->tile_size ? rule->tile_size : ka.shape.dims[0],
                       .asymmetric = integer && (c->kind == NB_QUANT_MINMAX || c->kind == NB_QUANT_FIXED)};
  char why[240];
  if (!nb_quant__layout_ok(&l, why, sizeof why)) return nb_graph_fail_at(loc, g, NB_ERR_INVALID_ARG, "nb_quant_fake_weight: %s", why);
  nb_status st = fake_register(nb_graph_ctx(g));
  if (st) return nb_graph_fail_at(loc, g, st, "nb_quant_fake_weight: registering %s failed", FAKE_NAME);
  fake_attrs a = {.qtype = rule->weight_qtype, .calib = c->kind, .tile = rule->tile_size, .k = c->k, .min = c->min, .max = c->max};
  return nb_custom_call_at(loc, g, FAKE_NAME, 1, &kernel, &a, sizeof a, 2, NULL);
}

nb_val *nb_quant_fake_act_at(nb_loc loc, nb_val *x, nb_quant_act act) {
  if (!x || act == NB_QUANT_ACT_NONE) return x;
  nb_val *r = nb_quant__round_act_at(loc, x, act);
  /* forward: r + (x - x) = r exactly; gradient: 1 */
  return nb_add_at(loc, nb_stop_gradient_at(loc, r), nb_sub_at(loc, x, nb_stop_gradient_at(loc, x)));
}

/* ---------------------------------------------------------------- the hook */

nb_val *nb_quant_qat_hook(void *rules, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  int r = nb_quant_rules_match(rules, path, stacked ? NB_QUANT_OP_STACKED_DOT_GENERAL : NB_QUANT_OP_DOT_GENERAL);
  if (r < 0) return nb_nn_linear_default(a, path, x, stacked);
  const nb_quant_rule *rule = nb_quant_rules_at(rules, r);
  if (stacked)
    return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "quant: '%s' (rule %d): QAT of stacked (per-expert) linears is not implemented yet "
                      "(give the rule op_names: [dot_general] to train the experts in f32)", path, r);
  if (rule->act_qtype == NB_QUANT_ACT_INT8_STATIC)
    return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "quant: '%s' (rule %d): int8_static activations have no range while training: "
                      "train with int8_dynamic (or none), then calibrate (nabla quantize --calibrate)", path, r);
  char p[NB_NN_PATH_MAX + 16];
  snprintf(p, sizeof p, "%s/kernel", path);
  nb_val *w = nb_nn_param(a, p);
  if (nb_graph_status(a->g)) return w;
  if (nb_val_rank(w) != 2 || nb_val_dim(x, -1) != nb_val_dim(w, 0))
    return nb_nn_fail(a, NB_ERR_SHAPE, "quant: '%s': input [..., %lld] does not fit kernel [%lld, %lld]", path,
                      (long long)nb_val_dim(x, -1), (long long)nb_val_dim(w, 0), (long long)nb_val_dim(w, -1));
  nb_dtype xt = nb_val_dtype(x);
  nb_val *xf = nb_quant_fake_act(xt == NB_F32 ? x : nb_convert(x, NB_F32), rule->act_qtype);
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(x) - 1}, .rhs_contract = {0}};
  nb_val *y = nb_dot_general(xf, nb_quant_fake_weight(w, rule), &dn, NB_F32);
  if (xt != NB_F32) y = nb_convert(y, xt);
  snprintf(p, sizeof p, "%s/bias", path);
  nb_val *b = nb_nn_param_opt(a, p);
  return b ? nb_add(y, b) : y;
}

int64_t nb_quant_rules_count_linears(const nb_quant_rules *rules, const nb_tree *params) {
  int64_t n = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    const char *path = nb_tree_path(params, i);
    const nb_leaf *leaf = nb_tree_leaf(params, i);
    size_t len = strlen(path), kl = strlen("/kernel");
    char m[1024];
    if (leaf->kind != NB_LEAF_ARRAY && leaf->kind != NB_LEAF_AVAL) continue;
    nb_aval av = leaf->kind == NB_LEAF_ARRAY ? nb_array_aval(leaf->array) : leaf->aval;
    if ((av.shape.rank != 2 && av.shape.rank != 3) || len <= kl || len - kl >= sizeof m || strcmp(path + len - kl, "/kernel")) continue;
    memcpy(m, path, len - kl), m[len - kl] = 0;
    if (nb_quant_rules_match(rules, m, av.shape.rank == 3 ? NB_QUANT_OP_STACKED_DOT_GENERAL : NB_QUANT_OP_DOT_GENERAL) >= 0) n++;
  }
  return n;
}
