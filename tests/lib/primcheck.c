/* The derivative and vmap checks of primcheck.h. Everything runs through the
 * reference interpreter in f64. */
#include "primcheck.h"

#include <stdlib.h>

nb_status nb_test_eval(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *in, nb_tree *out) {
  nb_graph *g = nb_trace(ctx, fn, user, in);
  if (!g) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  nb_status st = nb_graph_run(ctx, g, in, out);
  nb_graph_destroy(g);
  return st;
}

nb_array *nb_test_eval_output(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *in, const char *path) {
  nb_tree *out = nb_tree_create(ctx);
  nb_array *y = NULL;
  if (nb_test_eval(ctx, fn, user, in, out) == NB_OK && (y = nb_tree_get_array(out, path))) {
    nb_array_retain(y);
  } else {
    fprintf(stderr, "run failed: %s\n", nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
  }
  nb_tree_destroy(out);
  return y;
}

nb_array *nb_test_randn(nb_ctx *ctx, nb_test_rng *rng, nb_dtype t, int rank, const int64_t *dims) {
  nb_shape s = nb_shape_make(rank, dims);
  int64_t n = nb_shape_size(&s);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = t == NB_BOOL ? (double)(nb_test_uniform(rng) < 0.5) : nb_test_normal(rng);
  nb_array *a = nb_array_from_f64(ctx, t, rank, dims, v);
  free(v);
  return a;
}

void nb_test_set_randn(nb_tree *tree, nb_test_rng *rng, const char *path, nb_dtype t, int rank, const int64_t *dims) {
  nb_array *a = nb_test_randn(nb_tree_ctx(tree), rng, t, rank, dims);
  nb_tree_set_array(tree, path, a);
  nb_array_release(a);
}

nb_array *nb_test_randint(nb_ctx *ctx, nb_test_rng *rng, nb_dtype t, int rank, const int64_t *dims, int64_t lo, int64_t hi) {
  nb_shape s = nb_shape_make(rank, dims);
  int64_t n = nb_shape_size(&s);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = (double)nb_test_int(rng, lo, hi);
  nb_array *a = nb_array_from_f64(ctx, t, rank, dims, v);
  free(v);
  return a;
}

/* ---------------------------------------------------------------- small array helpers */

static nb_array *axpy(nb_ctx *ctx, nb_array *x, double alpha, nb_array *v) { /* x + alpha v */
  int64_t n = nb_array_size(x);
  nb_array *r = nb_array_empty(ctx, nb_array_dtype(x), nb_array_rank(x), nb_array_dims(x));
  for (int64_t i = 0; i < n; i++) {
    double val = nb_array_get(x, i) + alpha * nb_array_get(v, i);
    if (nb_array_dtype(x) == NB_F64) ((double *)nb_array_data_mut(r))[i] = val;
    else ((float *)nb_array_data_mut(r))[i] = (float)val;
  }
  return r;
}

static double dot(const nb_array *a, const nb_array *b) {
  double s = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) s += nb_array_get(a, i) * nb_array_get(b, i);
  return s;
}

static double max_abs(const nb_array *a) {
  double m = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) m = fmax(m, fabs(nb_array_get(a, i)));
  return m;
}

/* Compares two arrays elementwise: |a - b| <= tol * (1 + scale). */
static bool close(const char *name, const char *what, const nb_array *a, const nb_array *b, double tol) {
  if (nb_array_size(a) != nb_array_size(b)) {
    fprintf(stderr, "%s: %s: sizes differ (%lld vs %lld)\n", name, what, (long long)nb_array_size(a), (long long)nb_array_size(b));
    return false;
  }
  double scale = fmax(max_abs(a), max_abs(b));
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    double x = nb_array_get(a, i), y = nb_array_get(b, i);
    if (isnan(x) && isnan(y)) continue;
    if (!(fabs(x - y) <= tol * (1 + scale))) {
      fprintf(stderr, "%s: %s: element %lld: %.12g vs %.12g (tol %g, scale %g)\n", name, what, (long long)i, x, y, tol, scale);
      return false;
    }
  }
  return true;
}

/* ---------------------------------------------------------------- derivatives */

static bool check_graph_grads(nb_ctx *ctx, const char *name, const nb_graph *g, const nb_tree *in, double tol,
                              nb_test_rng *rng) {
  bool ok = true;
  nb_graph *jg = nb_jvp(ctx, g), *vg = nb_vjp(ctx, g);
  if (!jg || !vg) {
    fprintf(stderr, "%s: building jvp/vjp failed: %s\n", name, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    nb_graph_destroy(jg);
    nb_graph_destroy(vg);
    return false;
  }
  nb_tree *jin = nb_tree_create(ctx), *plus = nb_tree_copy(in), *minus = nb_tree_copy(in);
  const double eps = 1e-6;
  char path[512];
  nb_tree_merge(jin, "primal", in);
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) {
    const char *p = nb_graph_input_path(g, i);
    nb_array *x = nb_tree_get_array(in, p);
    if (!nb_dtype_is_float(nb_array_dtype(x))) continue;
    nb_array *v = nb_test_randn(ctx, rng, nb_array_dtype(x), nb_array_rank(x), nb_array_dims(x));
    snprintf(path, sizeof path, "tangent/%s", p);
    nb_tree_set_array(jin, path, v);
    nb_array *xp = axpy(ctx, x, eps, v), *xm = axpy(ctx, x, -eps, v);
    nb_tree_set_array(plus, p, xp);
    nb_tree_set_array(minus, p, xm);
    nb_array_release(xp);
    nb_array_release(xm);
    nb_array_release(v);
  }
  nb_tree *jout = nb_tree_create(ctx), *fp = nb_tree_create(ctx), *fm = nb_tree_create(ctx);
  if (nb_graph_run(ctx, jg, jin, jout) || nb_graph_run(ctx, g, plus, fp) || nb_graph_run(ctx, g, minus, fm)) {
    fprintf(stderr, "%s: running jvp / perturbed graphs failed: %s\n", name, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    ok = false;
  }
  /* jvp against central differences; collect <u, Jv> with random u */
  nb_tree *vin = nb_tree_create(ctx);
  nb_tree_merge(vin, "primal", in);
  double u_jv = 0;
  for (size_t i = 0; ok && i < nb_graph_num_outputs(g); i++) {
    const char *p = nb_graph_output_path(g, i);
    nb_array *a = nb_tree_get_array(fp, p), *b = nb_tree_get_array(fm, p);
    if (!nb_dtype_is_float(nb_array_dtype(a))) continue;
    nb_array *fd = nb_array_empty(ctx, NB_F64, nb_array_rank(a), nb_array_dims(a));
    for (int64_t k = 0; k < nb_array_size(a); k++)
      ((double *)nb_array_data_mut(fd))[k] = (nb_array_get(a, k) - nb_array_get(b, k)) / (2 * eps);
    snprintf(path, sizeof path, "tangent/%s", p);
    nb_array *jv = nb_tree_get_array(jout, path);
    char what[600];
    snprintf(what, sizeof what, "jvp vs finite differences of output '%s'", p);
    ok = close(name, what, jv, fd, tol) && ok;
    nb_array *u = nb_test_randn(ctx, rng, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a));
    snprintf(path, sizeof path, "ct/%s", p);
    nb_tree_set_array(vin, path, u);
    u_jv += dot(u, jv);
    nb_array_release(u);
    nb_array_release(fd);
  }
  /* vjp: <vjp(u), v> must equal <u, jvp(v)> */
  nb_tree *vout = nb_tree_create(ctx);
  if (ok && nb_graph_run(ctx, vg, vin, vout)) {
    fprintf(stderr, "%s: running vjp failed: %s\n", name, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    ok = false;
  }
  double vjp_v = 0, mag = fabs(u_jv);
  for (size_t i = 0; ok && i < nb_graph_num_inputs(g); i++) {
    const char *p = nb_graph_input_path(g, i);
    if (!nb_dtype_is_float(nb_array_dtype(nb_tree_get_array(in, p)))) continue;
    snprintf(path, sizeof path, "grad/%s", p);
    nb_array *gr = nb_tree_get_array(vout, path);
    snprintf(path, sizeof path, "tangent/%s", p);
    nb_array *v = nb_tree_get_array(jin, path);
    vjp_v += dot(gr, v);
    mag = fmax(mag, sqrt(dot(gr, gr) * dot(v, v)));
  }
  if (ok && !(fabs(vjp_v - u_jv) <= tol * (1 + mag))) {
    fprintf(stderr, "%s: <vjp(u), v> = %.12g but <u, jvp(v)> = %.12g\n", name, vjp_v, u_jv);
    ok = false;
  }
  nb_tree_destroy(jin);
  nb_tree_destroy(plus);
  nb_tree_destroy(minus);
  nb_tree_destroy(jout);
  nb_tree_destroy(fp);
  nb_tree_destroy(fm);
  nb_tree_destroy(vin);
  nb_tree_destroy(vout);
  nb_graph_destroy(jg);
  nb_graph_destroy(vg);
  return ok;
}

/* h(x) = sum_i <w_i, f_i(x)> over f's float outputs, with fixed random w_i. */
typedef struct weighted {
  const nb_graph *g;
  nb_tree *weights;
} weighted;

static nb_status weighted_sum(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  weighted *w = user;
  nb_tree *res = nb_tree_create(nb_graph_ctx(g));
  nb_status st = nb_graph_call(g, w->g, in, res);
  nb_val *total = NULL;
  for (size_t i = 0; st == NB_OK && i < nb_tree_size(res); i++) {
    const char *p = nb_tree_path(res, i);
    nb_array *wi = nb_tree_get_array(w->weights, p);
    if (!wi) continue;
    nb_val *term = nb_reduce_sum(nb_mul(nb_tree_leaf(res, i)->val, nb_const(g, wi)), 0, NULL);
    total = total ? nb_add(total, term) : term;
  }
  if (st == NB_OK) st = nb_tree_set_val(out, "h", total ? total : nb_scalar(g, NB_F64, 0));
  nb_tree_destroy(res);
  return st;
}

bool nb_test_check_grads(nb_ctx *ctx, const char *name, nb_trace_fn fn, void *user, const nb_tree *in, double tol,
                         bool second_order) {
  nb_test_rng rng = {0x5eed1234u};
  nb_graph *g = nb_trace(ctx, fn, user, in);
  if (!g) {
    fprintf(stderr, "%s: trace failed: %s\n", name, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    return false;
  }
  bool ok = check_graph_grads(ctx, name, g, in, tol, &rng);
  if (ok && second_order) {
    weighted w = {g, nb_tree_create(ctx)};
    nb_tree *outs = nb_tree_create(ctx);
    nb_graph_run(ctx, g, in, outs);
    for (size_t i = 0; i < nb_tree_size(outs); i++) {
      nb_array *o = nb_tree_leaf(outs, i)->array;
      if (!nb_dtype_is_float(nb_array_dtype(o))) continue;
      nb_array *wi = nb_test_randn(ctx, &rng, nb_array_dtype(o), nb_array_rank(o), nb_array_dims(o));
      nb_tree_set_array(w.weights, nb_tree_path(outs, i), wi);
      nb_array_release(wi);
    }
    nb_graph *h = nb_tree_size(w.weights) ? nb_trace(ctx, weighted_sum, &w, in) : NULL;
    nb_graph *gh = h ? nb_grad(ctx, h, NULL) : NULL;
    if (nb_tree_size(w.weights) && !gh) {
      fprintf(stderr, "%s: building grad of the weighted sum failed: %s\n", name, nb_ctx_error(ctx));
      nb_ctx_clear_error(ctx);
      ok = false;
    } else if (gh) {
      char name2[512];
      snprintf(name2, sizeof name2, "%s (second order)", name);
      ok = check_graph_grads(ctx, name2, gh, in, tol * 10, &rng);
    }
    nb_graph_destroy(gh);
    nb_graph_destroy(h);
    nb_tree_destroy(outs);
    nb_tree_destroy(w.weights);
  }
  nb_graph_destroy(g);
  return ok;
}

/* ---------------------------------------------------------------- vmap */

static nb_array *row(nb_ctx *ctx, nb_array *a, int64_t b) {
  int r = nb_array_rank(a);
  const int64_t *d = nb_array_dims(a);
  size_t bytes = nb_array_nbytes(a) / (size_t)(d[0] ? d[0] : 1);
  return nb_array_create(ctx, nb_array_dtype(a), r - 1, d + 1, (const char *)nb_array_data(a) + (size_t)b * bytes);
}

bool nb_test_check_vmap(nb_ctx *ctx, const char *name, nb_trace_fn fn, void *user, const nb_tree *batched,
                        const nb_tree *unbatched, int64_t n) {
  nb_tree *spec = nb_tree_create(ctx), *all = nb_tree_copy(batched), *axes = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(batched); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(batched, i));
    nb_aval s = nb_aval_make(a.dtype, a.shape.rank - 1, a.shape.dims + 1);
    nb_tree_set(spec, nb_tree_path(batched, i), nb_leaf_aval(s));
  }
  nb_array *minus1 = nb_array_scalar(ctx, NB_I32, -1);
  for (size_t i = 0; unbatched && i < nb_tree_size(unbatched); i++) {
    nb_tree_set(spec, nb_tree_path(unbatched, i), *nb_tree_leaf(unbatched, i));
    nb_tree_set(all, nb_tree_path(unbatched, i), *nb_tree_leaf(unbatched, i));
    nb_tree_set_array(axes, nb_tree_path(unbatched, i), minus1);
  }
  nb_array_release(minus1);
  bool ok = true;
  nb_graph *g = nb_trace(ctx, fn, user, spec);
  nb_vmap_opts o = {.in_axis = 0, .out_axis = 0, .in_axes = axes, .axis_size = n};
  nb_graph *vg = g ? nb_vmap(ctx, g, &o) : NULL;
  nb_tree *vout = nb_tree_create(ctx);
  if (!vg || nb_graph_run(ctx, vg, all, vout)) {
    fprintf(stderr, "%s: vmap failed: %s\n", name, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    ok = false;
  }
  for (int64_t b = 0; ok && b < n; b++) {
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    for (size_t i = 0; i < nb_tree_size(batched); i++) {
      nb_array *r = row(ctx, nb_tree_leaf(batched, i)->array, b);
      nb_tree_set_array(in, nb_tree_path(batched, i), r);
      nb_array_release(r);
    }
    for (size_t i = 0; unbatched && i < nb_tree_size(unbatched); i++)
      nb_tree_set(in, nb_tree_path(unbatched, i), *nb_tree_leaf(unbatched, i));
    if (nb_graph_run(ctx, g, in, out)) {
      fprintf(stderr, "%s: unbatched run failed: %s\n", name, nb_ctx_error(ctx));
      nb_ctx_clear_error(ctx);
      ok = false;
    }
    for (size_t i = 0; ok && i < nb_tree_size(out); i++) {
      const char *p = nb_tree_path(out, i);
      nb_array *want = nb_tree_leaf(out, i)->array, *got = row(ctx, nb_tree_get_array(vout, p), b);
      char what[600];
      snprintf(what, sizeof what, "vmap output '%s' row %lld", p, (long long)b);
      ok = close(name, what, got, want, 1e-12) && ok;
      nb_array_release(got);
    }
    nb_tree_destroy(in);
    nb_tree_destroy(out);
  }
  nb_tree_destroy(vout);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_tree_destroy(all);
  nb_tree_destroy(axes);
  return ok;
}
