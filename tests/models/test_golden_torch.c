/* nabla's GPT-2 against Hugging Face's PyTorch GPT2LMHeadModel with the same
 * weights (those of the Flax golden, tests/models/golden/gpt2_tiny.safetensors):
 * the masked mean next-token loss of one batch and its gradient for every
 * parameter, computed by torch.autograd in float64
 * (tests/models/golden/make_gpt2_torch_golden.py). nabla runs twice: in f32
 * (the training path), held to f32 rounding, and in f64 (the same f32
 * weights widened), held to f64 rounding. A run with one weight perturbed
 * must fail the same comparison. */
#include "golden_st.h"

/* Tolerances. Gradient differences are taken relative to the largest
 * |gradient| of their tensor (the largest are 0.01 to 0.3), with a floor for
 * the key biases, whose true gradient is zero (softmax ignores a per-query
 * constant) and whose computed one is rounding noise (~1e-17 in f64, ~7e-9
 * in f32). Measured: f32 loss 5e-8, gradients <= 4e-7 (key biases 7e-7);
 * f64 loss 4e-16, gradients <= 2e-15. */
#define F32_LOSS_TOL 1e-6 /* relative */
#define F32_GRAD_TOL 2e-6
#define F64_LOSS_TOL 1e-13
#define F64_GRAD_TOL 1e-12
#define GRAD_FLOOR 1e-2

typedef struct golden {
  cJSON *json;
  nb_tree *weights; /* "<path>" f32 (the Flax golden's file; its "grad/..." are ignored) */
  nb_tree *grads;   /* "<path>" f64 */
  nb_model_config cfg;
  double loss;
} golden;

static bool golden_load(nb_ctx *ctx, golden *g) {
  memset(g, 0, sizeof *g);
  g->json = nb_test_golden_load("tests/models/golden/gpt2_tiny_torch.json");
  if (!g->json) return false;
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(g->json, "weights");
  CHECK_MSG(cJSON_IsString(w), "gpt2_tiny_torch.json names no weights file");
  if (!cJSON_IsString(w)) return false;
  g->weights = golden_safetensors(ctx, w->valuestring);
  g->grads = golden_safetensors(ctx, "tests/models/golden/gpt2_tiny_torch_grads.safetensors");
  if (!g->weights || !g->grads) return false;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(g->json, "config");
  golden_gpt2_config(ctx, c, &g->cfg);
  g->loss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(g->json, "loss"));
  return true;
}

static void golden_free(golden *g) {
  nb_tree_destroy(g->weights);
  nb_tree_destroy(g->grads);
  cJSON_Delete(g->json);
}

/* The model's parameters in the order of its spec, as dtype t (checking
 * that the golden has exactly the model's paths and shapes). */
static nb_tree *golden_params(nb_ctx *ctx, const golden *g, nb_dtype t) {
  nb_tree *spec = nb_model_param_spec(ctx, &g->cfg, NB_F32);
  CHECK_MSG(spec, "%s", nb_ctx_error(ctx));
  if (!spec) return NULL;
  size_t n_weights = 0, n_grads = nb_tree_size(g->grads);
  for (size_t i = 0; i < nb_tree_size(g->weights); i++) n_weights += strncmp(nb_tree_path(g->weights, i), "grad/", 5) != 0;
  CHECK_MSG(n_weights == nb_tree_size(spec) && n_grads == nb_tree_size(spec),
            "golden has %zu weights and %zu gradients, the model %zu parameters", n_weights, n_grads,
            nb_tree_size(spec));
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    nb_array *a = nb_tree_get_array(g->weights, p), *gr = nb_tree_get_array(g->grads, p);
    nb_aval want = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    CHECK_MSG(a && gr, "golden lacks the weight or the gradient of %s", p);
    if (!a || !gr) continue;
    nb_aval have = nb_array_aval(a), have_g = nb_array_aval(gr);
    CHECK_MSG(nb_aval_equal(&have, &want), "%s: weight shape differs from the model's", p);
    CHECK_MSG(nb_shape_equal(&have_g.shape, &want.shape), "%s: gradient shape differs from the model's", p);
    nb_array *c = nb_array_astype(ctx, a, t);
    nb_tree_set_array(out, p, c);
    nb_array_release(c);
  }
  nb_tree_destroy(spec);
  return out;
}

/* A copy of params with element `at` of leaf `path` increased by delta. */
static nb_tree *perturbed(nb_ctx *ctx, const nb_tree *params, const char *path, int64_t at, double delta) {
  nb_tree *out = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    nb_array *a = nb_tree_get_array(params, nb_tree_path(params, i));
    if (strcmp(nb_tree_path(params, i), path)) {
      nb_tree_set_array(out, nb_tree_path(params, i), a);
      continue;
    }
    int64_t n = nb_array_size(a);
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) v[k] = nb_array_get(a, k);
    v[at] += delta;
    nb_array *b = nb_array_from_f64(ctx, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a), v);
    nb_tree_set_array(out, path, b);
    nb_array_release(b);
    free(v);
  }
  return out;
}

typedef struct result {
  double loss_rel;             /* |loss - reference| / |reference| */
  double worst_rel, worst_abs; /* over the gradient tensors */
  char worst_path[128];
  size_t n_grads;
} result;

/* Runs value_and_grad of the loss in compute dtype t on params and compares
 * with the golden. verbose: print the comparison; tol >= 0: also print the
 * first values of every gradient beyond tol. */
static result run_and_compare(nb_ctx *ctx, const golden *gd, const nb_tree *params, nb_dtype t, bool verbose,
                              double tol) {
  result r = {.loss_rel = INFINITY, .worst_rel = INFINITY, .worst_abs = INFINITY};
  const char *tn = t == NB_F64 ? "f64" : "f32";
  nb_tree *batch = golden_batch(ctx, gd->json);
  nb_model_trace_opts opts = {.dtype = t};
  nb_tree *out = nb_tree_create(ctx);
  bool ran = golden_loss_and_grads(ctx, &gd->cfg, &opts, params, batch, out);
  nb_array *loss = ran ? nb_tree_get_array(out, "loss") : NULL;
  CHECK_MSG(loss, "%s: no loss", tn);
  if (loss) {
    r.loss_rel = fabs(nb_array_get(loss, 0) - gd->loss) / fabs(gd->loss);
    if (verbose)
      printf("gpt2 vs torch (%s): loss nabla %.15g, torch %.15g, relative difference %.3g\n", tn,
             nb_array_get(loss, 0), gd->loss, r.loss_rel);
  }
  r.worst_rel = r.worst_abs = 0;
  for (size_t i = 0; loss && i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i);
    char gp[300];
    snprintf(gp, sizeof gp, "grad/params/%s", p);
    nb_array *got = nb_tree_get_array(out, gp), *ref = nb_tree_get_array(gd->grads, p);
    CHECK_MSG(got && ref && nb_array_size(got) == nb_array_size(ref), "%s: gradient of %s missing", tn, p);
    if (!got || !ref || nb_array_size(got) != nb_array_size(ref)) {
      r.worst_rel = INFINITY;
      continue;
    }
    double scale = 0, d = 0;
    int64_t n = nb_array_size(ref), at = 0;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(nb_array_get(ref, k)));
    for (int64_t k = 0; k < n; k++) {
      double e = fabs(nb_array_get(got, k) - nb_array_get(ref, k));
      if (!(e <= d)) d = e, at = k; /* NaN counts as worst */
    }
    double rel = d / fmax(scale, GRAD_FLOOR);
    if (rel != rel) rel = INFINITY;
    if (tol >= 0 && rel > tol) {
      printf("  %s: gradient %s differs: max |diff| %.3g at %lld (nabla %.9g, torch %.9g), max |torch| %.3g, "
             "relative %.3g > %.3g\n",
             tn, p, d, (long long)at, nb_array_get(got, at), nb_array_get(ref, at), scale, rel, tol);
      printf("    first values nabla:");
      for (int64_t k = 0; k < n && k < 4; k++) printf(" %.9g", nb_array_get(got, k));
      printf("\n    first values torch:");
      for (int64_t k = 0; k < n && k < 4; k++) printf(" %.9g", nb_array_get(ref, k));
      printf("\n");
    }
    r.worst_abs = fmax(r.worst_abs, d);
    if (!(rel <= r.worst_rel)) {
      r.worst_rel = rel;
      snprintf(r.worst_path, sizeof r.worst_path, "%s", p);
    }
    r.n_grads++;
  }
  if (verbose)
    printf("gpt2 vs torch (%s): %zu gradients, max |diff| %.3g, worst relative difference %.3g (%s)\n", tn,
           r.n_grads, r.worst_abs, r.worst_rel, r.worst_path);
  nb_tree_destroy(out);
  nb_tree_destroy(batch);
  return r;
}

static void check(const result *r, size_t n_params, double loss_tol, double grad_tol, const char *tn) {
  CHECK_MSG(r->loss_rel <= loss_tol, "%s: loss differs by %.3g (relative) > %.3g", tn, r->loss_rel, loss_tol);
  CHECK_MSG(r->n_grads == n_params, "%s: %zu of %zu gradients compared", tn, r->n_grads, n_params);
  CHECK_MSG(r->worst_rel <= grad_tol, "%s: gradient %s differs by %.3g (relative) > %.3g", tn, r->worst_path,
            r->worst_rel, grad_tol);
}

static bool passes(const result *r, size_t n_params, double loss_tol, double grad_tol) {
  return r->loss_rel <= loss_tol && r->n_grads == n_params && r->worst_rel <= grad_tol;
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  golden gd;
  if (golden_load(ctx, &gd)) {
    nb_tree *p32 = golden_params(ctx, &gd, NB_F32), *p64 = golden_params(ctx, &gd, NB_F64);
    if (p32 && p64) {
      size_t n = nb_tree_size(p32);
      result r32 = run_and_compare(ctx, &gd, p32, NB_F32, true, F32_GRAD_TOL);
      check(&r32, n, F32_LOSS_TOL, F32_GRAD_TOL, "f32");
      result r64 = run_and_compare(ctx, &gd, p64, NB_F64, true, F64_GRAD_TOL);
      check(&r64, n, F64_LOSS_TOL, F64_GRAD_TOL, "f64");
      /* the comparison sees one weight moved by 1e-3 (weights are ~0.2) */
      nb_tree *q32 = perturbed(ctx, p32, "layers/1/mlp/wi/kernel", 5, 1e-3);
      nb_tree *q64 = perturbed(ctx, p64, "layers/1/mlp/wi/kernel", 5, 1e-3);
      result s32 = run_and_compare(ctx, &gd, q32, NB_F32, false, -1);
      result s64 = run_and_compare(ctx, &gd, q64, NB_F64, false, -1);
      printf("one weight perturbed by 1e-3: f32 loss %.3g / gradient %.3g (%s), f64 loss %.3g / gradient %.3g "
             "relative differences\n",
             s32.loss_rel, s32.worst_rel, s32.worst_path, s64.loss_rel, s64.worst_rel);
      CHECK_MSG(!passes(&s32, n, F32_LOSS_TOL, F32_GRAD_TOL), "f32: a perturbed weight passes the comparison");
      CHECK_MSG(!passes(&s64, n, F64_LOSS_TOL, F64_GRAD_TOL), "f64: a perturbed weight passes the comparison");
      nb_tree_destroy(q32);
      nb_tree_destroy(q64);
    }
    nb_tree_destroy(p32);
    nb_tree_destroy(p64);
  } else {
    CHECK_MSG(false, "cannot load the PyTorch GPT-2 golden");
  }
  golden_free(&gd);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/golden_torch");
}
