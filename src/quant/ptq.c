/* Post-training quantization of a parameter tree by rules, and reading the
 * quantized linears of such a tree back (their static layout is the i64[6]
 * array "<m>/kernel/quant", so a checkpoint carries it as it carries any
 * array). nabla's kernels are [d_in, d_out]; quant's W is [N = d_out,
 * K = d_in]: the kernel is transposed on the way in and out. A stacked
 * (per-expert) kernel [E, d_in, d_out] is quantized as the E * N rows of its
 * experts' W one after the other (tiles never cross a row, so this is each
 * expert quantized alone), its arrays stored with a leading E:
 * values [E, N, ...], scales and zero_points [E, N, T]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/quant.h"

enum { Q_QTYPE, Q_K, Q_TILE, Q_ASYM, Q_ACT, Q_RULE, Q_LEN };

/* "<m>/kernel" -> m in buf; false when path is not a kernel's. */
static bool module_of_kernel(const char *path, char *buf, size_t cap) {
  size_t n = strlen(path), k = strlen("/kernel");
  if (n <= k || strcmp(path + n - k, "/kernel") || n - k >= cap) return false;
  memcpy(buf, path, n - k), buf[n - k] = 0;
  return true;
}

/* [E, d_in, d_out] -> W [E * d_out, d_in]: row e * d_out + n is expert e's
 * output n. */
static nb_array *experts_transposed(nb_ctx *ctx, const nb_array *kernel) {
  const int64_t *d = nb_array_dims(kernel);
  int64_t E = d[0], K = d[1], N = d[2];
  nb_array *w = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){E * N, K});
  if (!w) return NULL;
  const float *src = nb_array_data(kernel);
  float *dst = nb_array_data_mut(w);
  for (int64_t e = 0; e < E; e++)
    for (int64_t k = 0; k < K; k++)
      for (int64_t n = 0; n < N; n++) dst[(e * N + n) * K + k] = src[(e * K + k) * N + n];
  return w;
}

/* a's bytes under the shape [lead, dims of a] with dims[0] split by lead:
 * [E * N, x] -> [E, N, x] (split) or back (lead 0: merge the first two) */
static nb_array *regroup(nb_ctx *ctx, const nb_array *a, int64_t lead) {
  const int64_t *d = nb_array_dims(a);
  int64_t dims[3];
  int rank;
  if (lead) dims[0] = lead, dims[1] = d[0] / lead, dims[2] = d[1], rank = 3;
  else dims[0] = d[0] * d[1], dims[1] = d[2], rank = 2;
  return nb_array_create(ctx, nb_array_dtype(a), rank, dims, nb_array_data(a));
}

static nb_status put_array(nb_tree *t, const char *kp, const char *name, nb_array *a) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s", kp, name);
  nb_status s = a ? nb_tree_set_array(t, p, a) : nb_ctx_status(nb_tree_ctx(t)) ? nb_ctx_status(nb_tree_ctx(t)) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

/* The stacked kernel of module_path: w's rows are the experts' one after
 * the other (layout.n = E * N); the arrays get a leading E. */
static nb_status set_stacked(nb_tree *t, const char *module_path, const nb_quant_weight *w, int64_t experts, nb_quant_act act,
                             int rule) {
  nb_ctx *ctx = nb_tree_ctx(t);
  char kp[1100];
  snprintf(kp, sizeof kp, "%s/kernel", module_path);
  int64_t meta[Q_LEN] = {w->layout.qtype, w->layout.k, w->layout.tile, w->layout.asymmetric, act, rule}, len = Q_LEN;
  nb_status s = nb_tree_find(t, kp) >= 0 ? nb_tree_remove(t, kp) : NB_OK;
  if (!s) s = put_array(t, kp, "values", regroup(ctx, w->values, experts));
  if (!s) s = put_array(t, kp, "scales", regroup(ctx, w->scales, experts));
  if (!s && w->zero_points) s = put_array(t, kp, "zero_points", regroup(ctx, w->zero_points, experts));
  if (!s) s = put_array(t, kp, "quant", nb_array_create(ctx, NB_I64, 1, &len, meta));
  return s;
}

/* A quantized kernel's arrays as one quant weight: a stacked one's regrouped
 * to [E * N, ...] (new arrays), a plain one's retained; checked against
 * l->layout (whose n is then E * N). */
static nb_status weight_of(nb_ctx *ctx, const nb_tree *t, const char *kp, const nb_quant_linear *l, nb_quant_weight *out) {
  if (!l->experts) return nb_quant_weight_from_tree(ctx, t, kp, &l->layout, out);
  char p[1100];
  const char *names[3] = {"values", "scales", "zero_points"};
  nb_array *a[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", kp, names[i]);
    nb_array *src = nb_tree_get_array(t, p);
    if (!src) continue;
    if (nb_array_rank(src) != 3 || nb_array_dims(src)[0] != l->experts) {
      for (int j = 0; j < i; j++) nb_array_release(a[j]);
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s: a stacked kernel's [%lld, ...] array wanted", p, (long long)l->experts);
    }
    if (!(a[i] = regroup(ctx, src, 0))) {
      for (int j = 0; j < i; j++) nb_array_release(a[j]);
      return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    }
  }
  nb_quant_weight w = {.layout = l->layout, .values = a[0], .scales = a[1], .zero_points = a[2]};
  nb_status s = nb_quant_weight_check(ctx, &w);
  if (s) {
    nb_quant_weight_release(&w);
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s", kp, nb_ctx_error(ctx));
  }
  *out = w;
  return NB_OK;
}

static nb_status quantize_kernel(nb_ctx *ctx, nb_tree *out, const char *path, const nb_array *kernel, int rule_index,
                                 const nb_quant_rule *rule) {
  if (nb_array_dtype(kernel) != NB_F32)
    return nb_errorf(ctx, NB_ERR_DTYPE, "ptq: %s: an f32 kernel wanted (rule %d)", path, rule_index);
  int64_t experts = nb_array_rank(kernel) == 3 ? nb_array_dims(kernel)[0] : 0;
  if (experts && rule->act_qtype == NB_QUANT_ACT_INT8_STATIC)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "ptq: %s (rule %d): int8_static activations of stacked (per-expert) kernels are not "
                     "calibrated yet: give the rule op_names: [dot_general], or int8_dynamic", path, rule_index);
  nb_array *w = experts ? experts_transposed(ctx, kernel) : nb_array_transpose2d(ctx, kernel);
  if (!w) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  nb_quant_weight q;
  nb_status s = nb_quant_quantize(ctx, w, rule->weight_qtype, rule->tile_size, &rule->weight_calibration, &q);
  nb_array_release(w);
  if (s) return nb_errorf(ctx, s, "ptq: %s (rule %d): %s", path, rule_index, nb_ctx_error(ctx));
  char m[1024];
  module_of_kernel(path, m, sizeof m);
  s = experts ? set_stacked(out, m, &q, experts, rule->act_qtype, rule_index)
              : nb_quant_tree_set_linear(out, m, &q, rule->act_qtype, rule_index);
  nb_quant_weight_release(&q);
  if (!s && rule->act_qtype == NB_QUANT_ACT_INT8_STATIC) { /* fixed: known now; the others after a calibration pass */
    const nb_quant_calib *c = &rule->act_calibration;
    s = nb_quant_tree_set_act_scale(out, m, c->kind == NB_QUANT_FIXED ? (float)(fmax(fabs(c->min), fabs(c->max)) / 127) : NAN);
  }
  return s;
}

nb_status nb_quant_tree_set_act_scale(nb_tree *t, const char *module_path, float act_scale) {
  char p[1100];
  snprintf(p, sizeof p, "%s/kernel/act_scale", module_path);
  int64_t one = 1;
  nb_array *a = nb_array_create(nb_tree_ctx(t), NB_F32, 1, &one, &act_scale);
  if (!a) return nb_ctx_status(nb_tree_ctx(t)) ? nb_ctx_status(nb_tree_ctx(t)) : NB_ERR_NOMEM;
  nb_status s = nb_tree_set_array(t, p, a);
  nb_array_release(a);
  return s;
}

nb_status nb_quant_tree_set_linear(nb_tree *t, const char *module_path, const nb_quant_weight *w, nb_quant_act act, int rule) {
  nb_ctx *ctx = nb_tree_ctx(t);
  char kp[1024], qp[1100];
  snprintf(kp, sizeof kp, "%s/kernel", module_path);
  snprintf(qp, sizeof qp, "%s/quant", kp);
  nb_status s = nb_quant_weight_check(ctx, w);
  if (s) return s;
  int64_t meta[Q_LEN] = {w->layout.qtype, w->layout.k, w->layout.tile, w->layout.asymmetric, act, rule}, len = Q_LEN;
  nb_array *m = nb_array_create(ctx, NB_I64, 1, &len, meta);
  if (!m) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (nb_tree_find(t, kp) >= 0) s = nb_tree_remove(t, kp);
  if (!s) s = nb_quant_weight_to_tree(t, kp, w);
  if (!s) s = nb_tree_set_array(t, qp, m);
  nb_array_release(m);
  return s;
}

nb_tree *nb_quant_ptq(nb_ctx *ctx, const nb_tree *params, const nb_quant_rules *rules) {
  if (!params || !rules) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "ptq: params and rules are required"), NULL;
  nb_tree *out = nb_tree_create(ctx);
  if (!out) return NULL;
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < nb_tree_size(params); i++) {
    const char *path = nb_tree_path(params, i);
    const nb_leaf *leaf = nb_tree_leaf(params, i);
    char m[1024];
    int r = -1;
    int rank = leaf->kind == NB_LEAF_ARRAY ? nb_array_rank(leaf->array) : 0;
    if ((rank == 2 || rank == 3) && module_of_kernel(path, m, sizeof m))
      r = nb_quant_rules_match(rules, m, rank == 3 ? NB_QUANT_OP_STACKED_DOT_GENERAL : NB_QUANT_OP_DOT_GENERAL);
    if (r >= 0) s = quantize_kernel(ctx, out, path, leaf->array, r, nb_quant_rules_at(rules, r));
    else s = nb_tree_set(out, path, *leaf);
  }
  if (s) return nb_tree_destroy(out), NULL;
  return out;
}

nb_status nb_quant_tree_linear(nb_ctx *ctx, const nb_tree *t, const char *module_path, nb_quant_linear *out, bool *found) {
  *found = false;
  char kp[1024], qp[1100];
  snprintf(kp, sizeof kp, "%s/kernel", module_path);
  snprintf(qp, sizeof qp, "%s/quant", kp);
  const nb_leaf *leaf = nb_tree_get(t, qp);
  if (!leaf) return NB_OK;
  if (leaf->kind != NB_LEAF_ARRAY || nb_array_dtype(leaf->array) != NB_I64 || nb_array_rank(leaf->array) != 1 ||
      nb_array_dims(leaf->array)[0] != Q_LEN)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: an i64[%d] array {qtype, k, tile, asymmetric, act, rule} wanted", qp, Q_LEN);
  const int64_t *q = nb_array_data(leaf->array);
  if (q[Q_QTYPE] < 0 || q[Q_QTYPE] >= NB_QUANT_TYPE_COUNT)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: qtype %lld is not a quant type", qp, (long long)q[Q_QTYPE]);
  if (q[Q_ACT] < 0 || q[Q_ACT] >= NB_QUANT_ACT_COUNT)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: act %lld is not an activation type", qp, (long long)q[Q_ACT]);
  if (q[Q_ASYM] != 0 && q[Q_ASYM] != 1)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: asymmetric %lld is not 0 or 1", qp, (long long)q[Q_ASYM]);
  snprintf(qp, sizeof qp, "%s/values", kp);
  nb_array *values = nb_tree_get_array(t, qp);
  if (!values || (nb_array_rank(values) != 2 && nb_array_rank(values) != 3))
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: missing or not 2-D (3-D: stacked)", qp);
  const int64_t *vd = nb_array_dims(values);
  bool stacked = nb_array_rank(values) == 3;
  nb_quant_linear l = {.layout = {.qtype = (nb_quant_type)q[Q_QTYPE], .n = stacked ? vd[0] * vd[1] : vd[0], .k = q[Q_K],
                                  .tile = q[Q_TILE], .asymmetric = q[Q_ASYM]},
                       .act = (nb_quant_act)q[Q_ACT], .rule = (int)q[Q_RULE], .experts = stacked ? vd[0] : 0};
  nb_status s = nb_quant_layout_check(ctx, &l.layout);
  if (s) return nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s", kp, nb_ctx_error(ctx));
  nb_quant_weight w;
  s = weight_of(ctx, t, kp, &l, &w);
  if (s) return nb_errorf(ctx, NB_ERR_FORMAT, "%s", nb_ctx_error(ctx));
  nb_quant_weight_release(&w);
  if (nb_quant_act_check(ctx, &l.layout, l.act)) return nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s", kp, nb_ctx_error(ctx));
  if (l.act == NB_QUANT_ACT_INT8_STATIC) {
    snprintf(qp, sizeof qp, "%s/act_scale", kp);
    nb_array *as = nb_tree_get_array(t, qp);
    if (!as || nb_array_dtype(as) != NB_F32 || nb_array_size(as) != 1 || nb_array_rank(as) != 1)
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s: int8_static activations need an f32[1] act_scale", qp);
    l.act_scale = *(const float *)nb_array_data(as);
    if (!(l.act_scale >= 0) && !isnan(l.act_scale)) /* NaN: not calibrated yet (the hook says so) */
      return nb_errorf(ctx, NB_ERR_FORMAT, "%s: %g is not a scale >= 0", qp, (double)l.act_scale);
  }
  *out = l, *found = true;
  return NB_OK;
}

/* Whether path is one of the arrays of a quantized kernel of t; the
 * kernel's path into kp. */
static bool in_quantized_kernel(const nb_tree *t, const char *path, char *kp, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash || (size_t)(slash - path) >= cap) return false;
  const char *leaf = slash + 1;
  if (strcmp(leaf, "values") && strcmp(leaf, "scales") && strcmp(leaf, "zero_points") && strcmp(leaf, "quant") &&
      strcmp(leaf, "act_scale"))
    return false;
  memcpy(kp, path, (size_t)(slash - path)), kp[slash - path] = 0;
  char m[1024], qp[1100];
  if (!module_of_kernel(kp, m, sizeof m)) return false;
  snprintf(qp, sizeof qp, "%s/quant", kp);
  return nb_tree_get(t, qp) != NULL;
}

/* experts_transposed's inverse: W [E * N, K] -> [E, K, N]. */
static nb_array *experts_untransposed(nb_ctx *ctx, const nb_array *w, int64_t E) {
  int64_t N = nb_array_dims(w)[0] / E, K = nb_array_dims(w)[1];
  nb_array *k = nb_array_empty(ctx, NB_F32, 3, (int64_t[]){E, K, N});
  if (!k) return NULL;
  const float *src = nb_array_data(w);
  float *dst = nb_array_data_mut(k);
  for (int64_t e = 0; e < E; e++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t kk = 0; kk < K; kk++) dst[(e * K + kk) * N + n] = src[(e * N + n) * K + kk];
  return k;
}

nb_tree *nb_quant_dequantize_tree(nb_ctx *ctx, const nb_tree *t) {
  nb_tree *out = nb_tree_create(ctx);
  if (!out) return NULL;
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < nb_tree_size(t); i++) {
    const char *path = nb_tree_path(t, i);
    char kp[1024], m[1024];
    if (!in_quantized_kernel(t, path, kp, sizeof kp)) {
      s = nb_tree_set(out, path, *nb_tree_leaf(t, i));
      continue;
    }
    if (nb_tree_find(out, kp) >= 0) continue; /* the kernel's other arrays */
    module_of_kernel(kp, m, sizeof m);
    nb_quant_linear l;
    bool found;
    s = nb_quant_tree_linear(ctx, t, m, &l, &found);
    nb_quant_weight w;
    if (!s) s = weight_of(ctx, t, kp, &l, &w);
    if (s) break;
    nb_array *d = nb_quant_dequantize(ctx, &w);
    nb_quant_weight_release(&w);
    nb_array *k = d ? (l.experts ? experts_untransposed(ctx, d, l.experts) : nb_array_transpose2d(ctx, d)) : NULL;
    nb_array_release(d);
    s = k ? nb_tree_set_array(out, kp, k) : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    nb_array_release(k);
  }
  if (s) return nb_tree_destroy(out), NULL;
  return out;
}

int64_t nb_quant_tree_count(nb_ctx *ctx, const nb_tree *t) {
  int64_t n = 0;
  for (size_t i = 0; i < nb_tree_size(t); i++) {
    const char *path = nb_tree_path(t, i);
    char kp[1024], m[1024];
    size_t len = strlen(path);
    if (len < 6 || strcmp(path + len - 6, "/quant") || !in_quantized_kernel(t, path, kp, sizeof kp)) continue;
    module_of_kernel(kp, m, sizeof m);
    nb_quant_linear l;
    bool found;
    if (nb_quant_tree_linear(ctx, t, m, &l, &found)) return -1;
    n++;
  }
  return n;
}
