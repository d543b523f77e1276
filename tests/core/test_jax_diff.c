/* Differential test against JAX: the composed functions of
 * tests/core/golden/make_jax_diff.py, built here with nabla ops, must give
 * JAX's values, gradients, Hessian-vector products and per-example gradients
 * (vmap of grad) in f64. The goldens are checked in, so CI needs no JAX;
 * re-run the script to regenerate them. */

#include "json_golden.h"
#include "primcheck.h"

#define X nb_tree_get_val(in, "x")
#define W nb_tree_get_val(in, "w")

static nb_val *keep_last(nb_val *v) { return nb_expand_dims(v, -1); }
static const int last[1] = {-1}, first[1] = {0};

static nb_val *mean_last(nb_val *x) {
  return nb_div(keep_last(nb_reduce_sum(x, 1, last)), nb_scalar(nb_val_graph(x), NB_F64, (double)nb_val_dim(x, -1)));
}

static nb_status softmax_xent(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = X, *z = nb_mul(x, W);
  nb_val *m = keep_last(nb_reduce_max(z, 1, last));
  nb_val *lse = nb_add(nb_log(keep_last(nb_reduce_sum(nb_exp(nb_sub(z, m)), 1, last))), m);
  /* one-hot labels: row i has class i % 5 (a single row has class 1), as the script */
  int rank = nb_val_rank(x);
  int64_t dims[2] = {rank == 2 ? nb_val_dim(x, 0) : 1, nb_val_dim(x, -1)};
  double y[64] = {0};
  for (int64_t i = 0; i < dims[0]; i++) y[i * dims[1] + (rank == 2 ? i % dims[1] : 1)] = 1;
  nb_array *ya = nb_array_from_f64(nb_graph_ctx(g), NB_F64, rank, rank == 2 ? dims : dims + 1, y);
  nb_val *loss = nb_neg(nb_reduce_sum(nb_mul(nb_const(g, ya), nb_sub(z, lse)), 0, NULL));
  nb_array_release(ya);
  return nb_tree_set_val(out, "f", loss);
}

static nb_status tanh_layer(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *t = nb_tanh(nb_add(nb_mul(X, W), nb_scalar(g, NB_F64, 0.5)));
  return nb_tree_set_val(out, "f", nb_reduce_sum(nb_mul(t, t), 0, NULL));
}

static nb_status gelu(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = X;
  nb_val *cdf = nb_add(nb_scalar(g, NB_F64, 1), nb_erf(nb_div(x, nb_scalar(g, NB_F64, sqrt(2.0)))));
  return nb_tree_set_val(out, "f", nb_reduce_sum(nb_mul(nb_mul(nb_mul(nb_scalar(g, NB_F64, 0.5), x), cdf), W), 0, NULL));
}

static nb_status layer_norm(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = X, *d = nb_sub(x, mean_last(x));
  nb_val *var = mean_last(nb_mul(d, d));
  nb_val *y = nb_mul(nb_div(d, nb_sqrt(nb_add(var, nb_scalar(g, NB_F64, 1e-5)))), W);
  int64_t n = nb_val_dim(x, -1);
  nb_val *ramp = nb_add(nb_iota(g, NB_F64, 1, &n, 0), nb_scalar(g, NB_F64, 1));
  return nb_tree_set_val(out, "f", nb_reduce_sum(nb_mul(nb_mul(y, y), ramp), 0, NULL));
}

static nb_status pow_atan(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = X, *w = W;
  nb_val *p = nb_pow(nb_add(nb_abs(x), nb_scalar(g, NB_F64, 1)), nb_broadcast_to(w, nb_val_rank(x), nb_val_aval(x).shape.dims));
  nb_val *a = nb_atan2(x, nb_add(w, nb_scalar(g, NB_F64, 2)));
  return nb_tree_set_val(out, "f", nb_reduce_sum(nb_add(p, a), 0, NULL));
}

static nb_status prod_max(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = X, *w = W, *xw = nb_mul(x, w);
  nb_val *s = nb_add(nb_reduce_sum(nb_reduce_prod(xw, 1, last), 0, NULL), nb_reduce_sum(nb_reduce_max(xw, 1, first), 0, NULL));
  return nb_tree_set_val(out, "f", nb_add(s, nb_reduce_sum(nb_logistic(nb_sub(x, w)), 0, NULL)));
}

static const struct {
  const char *name;
  nb_trace_fn fn;
} funcs[] = {
    {"softmax_xent", softmax_xent}, {"tanh_layer", tanh_layer}, {"gelu", gelu},
    {"layer_norm", layer_norm},     {"pow_atan", pow_atan},     {"prod_max", prod_max},
};

static nb_array *json_array(nb_ctx *ctx, const cJSON *list, int rank, const int64_t *dims) {
  double v[64];
  int n = cJSON_GetArraySize(list);
  for (int i = 0; i < n && i < 64; i++) v[i] = cJSON_GetArrayItem(list, i)->valuedouble;
  return nb_array_from_f64(ctx, NB_F64, rank, dims, v);
}

static void compare(const char *fname, const char *what, const nb_array *got, const cJSON *want) {
  int n = cJSON_GetArraySize(want);
  CHECK_MSG(got && nb_array_size(got) == n, "%s %s: size %lld vs %d", fname, what, got ? (long long)nb_array_size(got) : -1LL, n);
  for (int i = 0; got && i < n && i < nb_array_size(got); i++) {
    double a = nb_array_get(got, i), b = cJSON_GetArrayItem(want, i)->valuedouble;
    CHECK_MSG(fabs(a - b) <= 1e-9 * (1 + fabs(b)), "%s %s[%d]: nabla %.15g, jax %.15g", fname, what, i, a, b);
  }
}

static void run_case(nb_ctx *ctx, const char *name, nb_trace_fn fn, const cJSON *golden, nb_array *x, nb_array *w, nb_array *v) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "w", w);
  nb_graph *g = nb_trace(ctx, fn, NULL, in);
  CHECK_MSG(g, "%s: %s", name, nb_ctx_error(ctx));
  if (!g) return;
  /* value and gradients */
  nb_graph *vg = nb_value_and_grad(ctx, g, NULL);
  CHECK_OK(ctx, nb_graph_run(ctx, vg, in, out));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "loss"), 0), cJSON_GetObjectItem(golden, "value")->valuedouble, 1e-10);
  compare(name, "grad_x", nb_tree_get_array(out, "grad/x"), cJSON_GetObjectItem(golden, "grad_x"));
  compare(name, "grad_w", nb_tree_get_array(out, "grad/w"), cJSON_GetObjectItem(golden, "grad_w"));
  /* Hessian-vector product: jvp of grad_w along v (forward over reverse) */
  nb_graph *gw = nb_grad(ctx, g, &(nb_grad_opts){.wrt = "w"});
  nb_graph *hv = nb_jvp(ctx, gw);
  nb_tree *hin = nb_tree_create(ctx), *hout = nb_tree_create(ctx);
  nb_tree_merge(hin, "primal", in);
  nb_array *zx = nb_array_zeros(ctx, NB_F64, nb_array_rank(x), nb_array_dims(x));
  nb_tree_set_array(hin, "tangent/x", zx);
  nb_tree_set_array(hin, "tangent/w", v);
  nb_array_release(zx);
  CHECK_OK(ctx, nb_graph_run(ctx, hv, hin, hout));
  compare(name, "hvp_w", nb_tree_get_array(hout, "tangent/grad/w"), cJSON_GetObjectItem(golden, "hvp_w"));
  /* per-example gradients: vmap over the rows of x of grad_w of f(row, w) */
  nb_tree *rspec = nb_tree_create(ctx), *axes = nb_tree_create(ctx), *pout = nb_tree_create(ctx);
  nb_tree_set(rspec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 1, nb_array_dims(x) + 1)));
  nb_tree_set_array(rspec, "w", w);
  nb_array *m1 = nb_array_scalar(ctx, NB_I32, -1);
  nb_tree_set_array(axes, "w", m1);
  nb_array_release(m1);
  nb_graph *row = nb_trace(ctx, fn, NULL, rspec);
  nb_graph *rg = row ? nb_grad(ctx, row, &(nb_grad_opts){.wrt = "w"}) : NULL;
  nb_graph *per = rg ? nb_vmap(ctx, rg, &(nb_vmap_opts){.in_axes = axes, .axis_size = nb_array_dims(x)[0]}) : NULL;
  CHECK_MSG(per, "%s per-example: %s", name, nb_ctx_error(ctx));
  if (per) {
    CHECK_OK(ctx, nb_graph_run(ctx, per, in, pout));
    compare(name, "per_example_grad_w", nb_tree_get_array(pout, "grad/w"), cJSON_GetObjectItem(golden, "per_example_grad_w"));
  }
  nb_graph_destroy(per);
  nb_graph_destroy(rg);
  nb_graph_destroy(row);
  nb_graph_destroy(hv);
  nb_graph_destroy(gw);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(rspec);
  nb_tree_destroy(axes);
  nb_tree_destroy(pout);
  nb_tree_destroy(hin);
  nb_tree_destroy(hout);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

int main(void) {
  cJSON *root = nb_test_golden_load("tests/core/golden/jax_diff.json");
  CHECK(root);
  if (!root) return nb_test_summary("core/jax_diff");
  nb_ctx *ctx = nb_ctx_create();
  int64_t dx[2] = {4, 5}, dw[1] = {5};
  nb_array *x = json_array(ctx, cJSON_GetObjectItem(root, "x"), 2, dx);
  nb_array *w = json_array(ctx, cJSON_GetObjectItem(root, "w"), 1, dw);
  nb_array *v = json_array(ctx, cJSON_GetObjectItem(root, "v"), 1, dw);
  const cJSON *cases = cJSON_GetObjectItem(root, "cases");
  for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++) {
    const cJSON *golden = cJSON_GetObjectItem(cases, funcs[i].name);
    CHECK_MSG(golden, "no golden for %s", funcs[i].name);
    if (golden) run_case(ctx, funcs[i].name, funcs[i].fn, golden, x, w, v);
  }
  nb_array_release(x);
  nb_array_release(w);
  nb_array_release(v);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  cJSON_Delete(root);
  return nb_test_summary("core/jax_diff");
}
