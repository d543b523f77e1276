/* Running a quantized tree: the nn linear hook that turns each quantized
 * module's product into quant.matmul (Qwix's interception of dot_general on
 * matching parameters, at the linear the model calls). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/quant.h"

typedef struct plan_entry {
  char *module; /* "layers/0/attn/wq" */
  nb_quant_linear linear;
} plan_entry;

struct nb_quant_plan {
  int64_t n;
  plan_entry *e;
};

void nb_quant_plan_destroy(nb_quant_plan *p) {
  if (!p) return;
  for (int64_t i = 0; i < p->n; i++) free(p->e[i].module);
  free(p->e);
  free(p);
}

int64_t nb_quant_plan_count(const nb_quant_plan *p) { return p ? p->n : 0; }

nb_quant_plan *nb_quant_plan_create(nb_ctx *ctx, const nb_tree *t) {
  nb_quant_plan *p = calloc(1, sizeof *p);
  size_t n = nb_tree_size(t);
  if (p) p->e = calloc(n + 1, sizeof *p->e);
  if (!p || !p->e) return nb_quant_plan_destroy(p), nb_errorf(ctx, NB_ERR_NOMEM, "quant plan: out of memory"), NULL;
  static const char suffix[] = "/kernel/quant";
  size_t ls = strlen(suffix);
  for (size_t i = 0; i < n; i++) {
    const char *path = nb_tree_path(t, i);
    size_t len = strlen(path);
    if (len <= ls || strcmp(path + len - ls, suffix)) continue;
    char *m = strndup(path, len - ls);
    if (!m) return nb_quant_plan_destroy(p), nb_errorf(ctx, NB_ERR_NOMEM, "quant plan: out of memory"), NULL;
    bool found;
    p->e[p->n].module = m;
    p->n++;
    if (nb_quant_tree_linear(ctx, t, m, &p->e[p->n - 1].linear, &found)) return nb_quant_plan_destroy(p), NULL;
  }
  return p;
}

static const nb_quant_linear *plan_find(const nb_quant_plan *p, const char *module) {
  for (int64_t i = 0; p && i < p->n; i++)
    if (!strcmp(p->e[i].module, module)) return &p->e[i].linear;
  return NULL;
}

/* Index e of x's first axis, that axis dropped. */
static nb_val *take_first(nb_val *x, int64_t e) {
  int r = nb_val_rank(x);
  int64_t start[NB_MAX_RANK] = {0}, limit[NB_MAX_RANK];
  for (int i = 0; i < r; i++) limit[i] = nb_val_dim(x, i);
  start[0] = e, limit[0] = e + 1;
  return nb_squeeze(nb_slice(x, start, limit, NULL), 1, (int[]){0});
}

/* The stacked product y[e] = x[e] @ dequant(W_e)^T, one quant.matmul per
 * expert (x [E, ..., K], values [E, N, ...]), the results stacked again. */
static nb_val *stacked_matmul(nb_nn_apply *a, const char *path, const nb_quant_linear *l, nb_val *x, nb_val *values, nb_val *scales,
                              nb_val *zero_points) {
  int64_t E = l->experts;
  if (nb_val_rank(x) < 2 || nb_val_dim(x, 0) != E)
    return nb_nn_fail(a, NB_ERR_SHAPE, "quant: '%s': a stacked input [%lld, ..., %lld] wanted", path, (long long)E, (long long)l->layout.k);
  nb_quant_layout le = l->layout;
  le.n /= E;
  nb_val **ys = calloc((size_t)E, sizeof *ys);
  if (!ys) return nb_nn_fail(a, NB_ERR_NOMEM, "quant: '%s': out of memory", path);
  for (int64_t e = 0; e < E; e++) {
    nb_val *z = zero_points ? take_first(zero_points, e) : NULL;
    nb_val *y = nb_quant_matmul(take_first(x, e), take_first(values, e), take_first(scales, e), z, &le, l->act);
    ys[e] = nb_expand_dims(y, 0);
  }
  nb_val *y = nb_concatenate((int)E, ys, 0);
  free(ys);
  return y;
}

nb_val *nb_quant_linear_hook(void *plan, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  const nb_quant_linear *l = plan_find(plan, path);
  if (!l) return nb_nn_linear_default(a, path, x, stacked);
  if (stacked != (l->experts > 0))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "quant: '%s': the model calls it as a %s linear; its quantized kernel is %s", path,
                      stacked ? "stacked (per-expert)" : "plain", l->experts ? "stacked" : "plain");
  if (stacked && l->act == NB_QUANT_ACT_INT8_STATIC)
    return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "quant: '%s': int8_static activations of stacked linears are not implemented", path);
  char p[NB_NN_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/kernel/values", path);
  nb_val *values = nb_tree_get_val(a->params, p);
  snprintf(p, sizeof p, "%s/kernel/scales", path);
  nb_val *scales = nb_tree_get_val(a->params, p);
  snprintf(p, sizeof p, "%s/kernel/zero_points", path);
  nb_val *zero_points = l->layout.asymmetric ? nb_tree_get_val(a->params, p) : NULL;
  if (!values || !scales || (l->layout.asymmetric && !zero_points))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "quant: '%s': the quantized kernel's arrays are not parameters of this step", path);
  if (l->act == NB_QUANT_ACT_INT8_STATIC && isnan(l->act_scale))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "quant: '%s': int8_static activations without a calibrated act_scale: quantize with "
                      "--calibrate DATA (or act_calibration: fixed,MIN,MAX)", path);
  nb_dtype xt = nb_val_dtype(x);
  nb_val *xf = xt == NB_F32 ? x : nb_convert(x, NB_F32);
  nb_val *y = stacked ? stacked_matmul(a, path, l, xf, values, scales, zero_points)
              : l->act == NB_QUANT_ACT_INT8_STATIC ? nb_quant_matmul_static(xf, values, scales, &l->layout, l->act_scale)
                                                   : nb_quant_matmul(xf, values, scales, zero_points, &l->layout, l->act);
  if (nb_graph_status(a->g)) return y;
  if (xt != NB_F32) y = nb_convert(y, xt);
  snprintf(p, sizeof p, "%s/bias", path);
  nb_val *b = nb_nn_param_opt(a, p);
  if (!b || !stacked) return b ? nb_add(y, b) : y;
  int64_t dims[NB_MAX_RANK]; /* bias [E, N] -> [E, 1, ..., 1, N] */
  int r = nb_val_rank(y);
  for (int i = 0; i < r; i++) dims[i] = i == 0 || i == r - 1 ? nb_val_dim(y, i) : 1;
  return nb_add(y, nb_reshape(b, r, dims));
}
