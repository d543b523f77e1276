/* Losses: values and gradients against Optax in f64
 * (tests/optim/golden/losses.json), derivatives against finite differences
 * (including second order), stability at huge logits, and bad input. */
#include "json_golden.h"
#include "primcheck.h"

typedef enum which {
  SCE, SCE_INT, SCE_INT_SMOOTH_Z, BCE, FOCAL, L2, SQ, HUBER, LOGCOSH, HINGE, COSSIM, COSDIST, KL, N_LOSSES
} which;
static const char *names[N_LOSSES] = {"softmax_cross_entropy", "softmax_cross_entropy_int",
                                      "softmax_cross_entropy_int_smooth_z", "sigmoid_binary_cross_entropy",
                                      "sigmoid_focal_loss", "l2_loss", "squared_error", "huber_loss", "log_cosh",
                                      "hinge_loss", "cosine_similarity", "cosine_distance", "kl_divergence"};
/* the differentiated input of each loss, and the fixed one */
static const char *xname[N_LOSSES] = {"logits", "logits", "logits", "bin_logits", "bin_logits", "pred", "pred",
                                      "pred", "pred", "pred", "pred", "pred", "log_probs"};
static const char *yname[N_LOSSES] = {"probs", "int_labels", "int_labels", "bin_labels", "bin_labels", "targ", "targ",
                                      "targ", "targ", "signs", "targ", "targ", "probs"};

static nb_val *loss_of(which w, nb_val *x, nb_val *y, nb_val *wt) {
  switch (w) {
  case SCE: return nb_optim_softmax_cross_entropy(x, y);
  case SCE_INT: return nb_optim_softmax_cross_entropy_int(x, y, NULL, 0, 0);
  case SCE_INT_SMOOTH_Z: return nb_optim_softmax_cross_entropy_int(x, y, wt, 0.1, 1e-3);
  case BCE: return nb_optim_sigmoid_binary_cross_entropy(x, y);
  case FOCAL: return nb_optim_sigmoid_focal_loss(x, y, 0.25, 2.0);
  case L2: return nb_optim_l2_loss(x, y);
  case SQ: return nb_optim_squared_error(x, y);
  case HUBER: return nb_optim_huber_loss(x, y, 0.7);
  case LOGCOSH: return nb_optim_log_cosh(x, y);
  case HINGE: return nb_optim_hinge_loss(x, y);
  case COSSIM: return nb_optim_cosine_similarity(x, y, 1e-8);
  case COSDIST: return nb_optim_cosine_distance(x, y, 1e-8);
  case KL: return nb_optim_kl_divergence(x, y);
  default: return NULL;
  }
}

/* out "loss": the per-example values; "total": sum(loss * (1, 2, 3, ...)) as
 * the golden script weights them */
static nb_status loss_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  which w = (which)(intptr_t)u;
  nb_val *l = loss_of(w, nb_tree_get_val(in, "x"), nb_tree_get_val(in, "y"), nb_tree_get_val(in, "w"));
  if (!l) return nb_ctx_status(nb_graph_ctx(g)) ? nb_ctx_status(nb_graph_ctx(g)) : NB_ERR_INTERNAL;
  nb_aval a = nb_val_aval(l);
  int64_t n = nb_shape_size(&a.shape);
  nb_val *ramp = nb_reshape(nb_add(nb_iota(g, a.dtype, 1, &n, 0), nb_scalar(g, a.dtype, 1)), a.shape.rank, a.shape.dims);
  return nb_tree_set_val(out, "total", nb_reduce_sum(nb_mul(l, ramp), 0, NULL));
}

static nb_status value_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  which w = (which)(intptr_t)u;
  return nb_tree_set_val(out, "loss", loss_of(w, nb_tree_get_val(in, "x"), nb_tree_get_val(in, "y"), nb_tree_get_val(in, "w")));
}

static void test_goldens(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/optim/golden/losses.json");
  CHECK(j != NULL);
  if (!j) return;
  const cJSON *inputs = cJSON_GetObjectItem(j, "inputs");
  for (int w = 0; w < N_LOSSES; w++) {
    const cJSON *c = cJSON_GetObjectItem(j, names[w]);
    CHECK_MSG(c, "golden lacks %s", names[w]);
    if (!c) continue;
    nb_tree *in = nb_tree_create(ctx);
    nb_array *x = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, xname[w]));
    nb_array *y = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, yname[w]));
    nb_array *wt = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, "weights"));
    nb_tree_set_array(in, "x", x);
    nb_tree_set_array(in, "y", y);
    nb_tree_set_array(in, "w", wt);
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_test_eval(ctx, value_fn, (void *)(intptr_t)w, in, out));
    nb_array *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "value"));
    nb_array *got = nb_tree_get_array(out, "loss");
    CHECK_MSG(got && want && nb_test_arrays_close(names[w], got, want, 1e-12), "%s value", names[w]);
    /* gradient wrt x */
    nb_graph *g = nb_trace(ctx, loss_fn, (void *)(intptr_t)w, in);
    nb_graph *dg = g ? nb_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
    nb_tree *go = nb_tree_create(ctx);
    CHECK_MSG(dg && nb_graph_run(ctx, dg, in, go) == NB_OK, "%s grad: %s", names[w], nb_ctx_error(ctx));
    nb_array *gwant = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "grad"));
    nb_array *ggot = nb_tree_get_array(go, "grad/x");
    CHECK_MSG(ggot && gwant && nb_test_arrays_close(names[w], ggot, gwant, 1e-11), "%s grad", names[w]);
    /* and against finite differences, second order too (not through the
     * piecewise-linear losses' kinks) */
    nb_tree *fin = nb_tree_create(ctx);
    nb_tree_set_array(fin, "x", x);
    nb_tree_set_array(fin, "y", y);
    nb_tree_set_array(fin, "w", wt);
    CHECK(nb_test_check_grads(ctx, names[w], value_fn, (void *)(intptr_t)w, fin, 1e-5, w != HINGE && w != HUBER));
    nb_tree_destroy(fin);
    nb_array_release(x);
    nb_array_release(y);
    nb_array_release(wt);
    nb_array_release(want);
    nb_array_release(gwant);
    nb_tree_destroy(in);
    nb_tree_destroy(out);
    nb_tree_destroy(go);
    nb_graph_destroy(g);
    nb_graph_destroy(dg);
  }
  cJSON_Delete(j);
}

/* Logits of +-1e4 (f32): finite losses and gradients, right values. */
static void test_large_logits(nb_ctx *ctx) {
  double lv[6] = {1e4, -1e4, 0, 3e4, 3e4, -2e4}, pv[6] = {0, 1, 0, 0.5, 0.5, 0};
  int64_t d[2] = {2, 3};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_from_f64(ctx, NB_F32, 2, d, lv), *p = nb_array_from_f64(ctx, NB_F32, 2, d, pv);
  nb_array *lab = nb_array_from_f64(ctx, NB_I32, 1, d, (double[]){1, 0});
  nb_tree_set_array(in, "x", x);
  struct { which w; nb_array *y; double v0, v1; } cases[] = {
      {SCE, p, 2e4, M_LN2}, {SCE_INT, lab, 2e4, M_LN2}, {BCE, p, NAN, NAN}, {FOCAL, p, NAN, NAN}};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    nb_tree_set_array(in, "y", cases[k].y);
    nb_tree *out = nb_tree_create(ctx);
    nb_graph *g = nb_trace(ctx, loss_fn, (void *)(intptr_t)cases[k].w, in);
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
    CHECK_MSG(vg && nb_graph_run(ctx, vg, in, out) == NB_OK, "%s: %s", names[cases[k].w], nb_ctx_error(ctx));
    nb_array *gx = nb_tree_get_array(out, "grad/x");
    double total = nb_array_get(nb_tree_get_array(out, "loss"), 0);
    CHECK_MSG(isfinite(total), "%s at large logits: %g", names[cases[k].w], total);
    for (int i = 0; gx && i < 6; i++) CHECK_MSG(isfinite(nb_array_get(gx, i)), "%s grad[%d]", names[cases[k].w], i);
    if (!isnan(cases[k].v0)) CHECK_NEAR(total, cases[k].v0 + 2 * cases[k].v1, 1e-6); /* f32 at 3e4: ulp 2e-3 */
    nb_tree_destroy(out);
    nb_graph_destroy(g);
    nb_graph_destroy(vg);
  }
  nb_array_release(x);
  nb_array_release(p);
  nb_array_release(lab);
  nb_tree_destroy(in);
}

static nb_status bad_labels(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *y = nb_tree_get_val(in, "y");
  nb_val *l = u ? nb_optim_softmax_cross_entropy_int(x, y, NULL, 1.5, 0) : nb_optim_softmax_cross_entropy_int(x, y, NULL, 0, 0);
  if (!l) return nb_ctx_status(nb_graph_ctx(g));
  return nb_tree_set_val(out, "l", l);
}

static void test_misuse(nb_ctx *ctx) {
  int64_t d[2] = {2, 3};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_zeros(ctx, NB_F32, 2, d), *yf = nb_array_zeros(ctx, NB_F32, 1, d);
  nb_array *y3 = nb_array_zeros(ctx, NB_I32, 1, (int64_t[]){3}), *y2 = nb_array_zeros(ctx, NB_I32, 1, d);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "y", yf);
  CHECK(nb_trace(ctx, bad_labels, NULL, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "labels must be integers");
  nb_tree_set_array(in, "y", y3);
  CHECK(nb_trace(ctx, bad_labels, NULL, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "do not match logits");
  nb_tree_set_array(in, "y", y2);
  CHECK(nb_trace(ctx, bad_labels, (void *)1, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "label_smoothing");
  nb_array_release(x);
  nb_array_release(yf);
  nb_array_release(y3);
  nb_array_release(y2);
  nb_tree_destroy(in);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_goldens(ctx);
  test_large_logits(ctx);
  test_misuse(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("optim/test_loss");
}
