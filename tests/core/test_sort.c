/* sort and top_k: values and positions against NumPy/JAX goldens (NaNs,
 * ties, -0/+0), every dtype, empty and length-1 axes, the gradient by hand,
 * vmap with the batch axis on either side of the sorted axis, and misuse
 * giving named errors. Derivatives and vmap of random cases run in the
 * primitive table (cases_sort.c). */
#include "core/ir.h"
#include "json_golden.h"
#include "primcheck.h"

static cJSON *gold; /* tests/core/golden/gather.json, made by make_gather.py */

/* Golden array `name` (a new reference), or NULL after printing why. */
static nb_array *golden(nb_ctx *ctx, const char *name) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(gold, name);
  if (!j) return fprintf(stderr, "golden %s is missing\n", name), NULL;
  return nb_test_golden_array(ctx, j);
}

/* Same dtype, shape and values (NaN equals NaN; -0 equals +0). */
static bool same(const char *what, const nb_array *got, const nb_array *want) {
  if (!got || !want) return fprintf(stderr, "%s: missing array\n", what), false;
  return nb_test_arrays_close(what, got, want, 0);
}

typedef struct sort_call {
  int axis, k; /* k > 0: top_k */
  bool descending;
} sort_call;

static nb_status f_sort(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sort_call *c = u;
  nb_val *idx = NULL, *x = nb_tree_get_val(in, "x");
  nb_val *y = c->k > 0 ? nb_top_k(x, c->k, &idx) : nb_sort(x, c->axis, c->descending, &idx);
  nb_status s = nb_tree_set_val(out, "values", y);
  return s ? s : nb_tree_set_val(out, "indices", idx);
}

/* Runs c on x; the outputs go into *values / *indices (new references). */
static void run(nb_ctx *ctx, const sort_call *c, nb_array *x, nb_array **values, nb_array **indices) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x);
  CHECK_OK(ctx, nb_test_eval(ctx, f_sort, (void *)c, in, out));
  *values = nb_tree_get_array(out, "values");
  *indices = nb_tree_get_array(out, "indices");
  if (*values) nb_array_retain(*values);
  if (*indices) nb_array_retain(*indices);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

static void check_golden(nb_ctx *ctx, const char *xname, const char *prefix, sort_call c) {
  char kv[64], ki[64];
  snprintf(kv, sizeof kv, "%s_values", prefix);
  snprintf(ki, sizeof ki, "%s_indices", prefix);
  nb_array *x = golden(ctx, xname), *wv = golden(ctx, kv), *wi = golden(ctx, ki), *v = NULL, *i = NULL;
  if (x) run(ctx, &c, x, &v, &i);
  CHECK_MSG(same(kv, v, wv), "%s", kv);
  CHECK_MSG(same(ki, i, wi), "%s", ki);
  CHECK(i && nb_array_dtype(i) == NB_I32);
  nb_array *arrays[5] = {x, wv, wi, v, i};
  for (int k = 0; k < 5; k++) nb_array_release(arrays[k]);
}

static void test_goldens(nb_ctx *ctx) {
  check_golden(ctx, "o1_x", "o1", (sort_call){1, 0, false});
  check_golden(ctx, "o1_x", "o2", (sort_call){0, 0, true});
  check_golden(ctx, "o1_x", "o2", (sort_call){-2, 0, true});
  check_golden(ctx, "o3_x", "o3", (sort_call){-1, 0, false});
  check_golden(ctx, "k1_x", "k1", (sort_call){0, 3, false});
}

/* Every dtype sorts, in both directions, with stable ties. */
static void test_dtypes(nb_ctx *ctx) {
  static const nb_dtype types[] = {NB_F32, NB_F64, NB_BF16, NB_F16, NB_I8, NB_U8, NB_I32, NB_I64, NB_U32, NB_BOOL};
  double xv[6] = {3, 0, 2, 0, 3, 1};
  int64_t d[1] = {6};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    nb_dtype t = types[k];
    bool b = t == NB_BOOL;
    nb_array *x = nb_array_from_f64(ctx, t, 1, d, xv), *v, *i;
    run(ctx, &(sort_call){0, 0, false}, x, &v, &i);
    int up[6] = {1, 3, 5, 2, 0, 4}, up_b[6] = {1, 3, 0, 2, 4, 5};
    for (int j = 0; v && i && j < 6; j++) {
      CHECK_MSG(nb_array_get(i, j) == (b ? up_b : up)[j], "%s ascending position %d", nb_dtype_name(t), j);
      CHECK_MSG(nb_array_get(v, j) == nb_array_get(x, (b ? up_b : up)[j]), "%s value %d", nb_dtype_name(t), j);
    }
    nb_array_release(v);
    nb_array_release(i);
    run(ctx, &(sort_call){0, 0, true}, x, &v, &i);
    int down[6] = {0, 4, 2, 5, 1, 3}, down_b[6] = {0, 2, 4, 5, 1, 3};
    for (int j = 0; v && i && j < 6; j++) CHECK_MSG(nb_array_get(i, j) == (b ? down_b : down)[j], "%s descending %d", nb_dtype_name(t), j);
    nb_array_release(v);
    nb_array_release(i);
    run(ctx, &(sort_call){0, 2, false}, x, &v, &i);
    CHECK_MSG(i && nb_array_size(i) == 2 && nb_array_get(i, 0) == (b ? 0 : 0) && nb_array_get(i, 1) == (b ? 2 : 4),
              "%s top_k", nb_dtype_name(t));
    CHECK(v && nb_array_dtype(v) == t);
    nb_array_release(v);
    nb_array_release(i);
    nb_array_release(x);
  }
  /* large magnitudes keep their order (no rounding through double for i64) */
  int64_t big[3] = {INT64_MAX, INT64_MAX - 1, INT64_MIN};
  int64_t d3[1] = {3};
  nb_array *x = nb_array_create(ctx, NB_I64, 1, d3, big), *v, *i;
  run(ctx, &(sort_call){0, 0, false}, x, &v, &i);
  CHECK(i && nb_array_get(i, 0) == 2 && nb_array_get(i, 1) == 1 && nb_array_get(i, 2) == 0);
  nb_array_release(v);
  nb_array_release(i);
  nb_array_release(x);
}

static void test_shapes(nb_ctx *ctx) {
  int64_t d0[2] = {3, 0}, d1[2] = {2, 1}, d00[2] = {0, 4};
  nb_array *x = nb_array_zeros(ctx, NB_F32, 2, d0), *v, *i;
  run(ctx, &(sort_call){1, 0, false}, x, &v, &i);
  CHECK(v && nb_array_size(v) == 0 && nb_array_dims(v)[0] == 3);
  nb_array_release(v);
  nb_array_release(i);
  run(ctx, &(sort_call){0, 0, false}, x, &v, &i); /* lanes of length 3, none of them */
  CHECK(i && nb_array_size(i) == 0);
  nb_array_release(v);
  nb_array_release(i);
  nb_array_release(x);
  x = nb_array_full(ctx, NB_F64, 2, d1, 4.0);
  run(ctx, &(sort_call){1, 0, true}, x, &v, &i);
  CHECK(i && nb_array_get(i, 0) == 0 && nb_array_get(i, 1) == 0 && v && nb_array_get(v, 1) == 4.0);
  nb_array_release(v);
  nb_array_release(i);
  run(ctx, &(sort_call){0, 1, false}, x, &v, &i); /* top_k with k = n = 1 */
  CHECK(i && nb_array_size(i) == 2 && nb_array_get(i, 1) == 0);
  nb_array_release(v);
  nb_array_release(i);
  nb_array_release(x);
  x = nb_array_zeros(ctx, NB_F64, 2, d00);
  run(ctx, &(sort_call){1, 0, false}, x, &v, &i);
  CHECK(v && nb_array_size(v) == 0);
  nb_array_release(v);
  nb_array_release(i);
  nb_array_release(x);
  /* top_k with k = 0 */
  nb_graph *g = nb_graph_create(ctx);
  int64_t d5[1] = {5};
  nb_val *idx, *y = nb_top_k(nb_graph_input(g, "x", nb_aval_make(NB_F64, 1, d5)), 0, &idx);
  CHECK(nb_graph_status(g) == NB_OK && nb_val_dim(y, 0) == 0 && nb_val_dim(idx, 0) == 0 && nb_val_dtype(idx) == NB_I32);
  nb_graph_destroy(g);
}

/* d/dx sum(w * sort(x)) = w put back at the positions: grad[perm[j]] = w[j]. */
static nb_status f_sort_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sort_call *c = u;
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *y = c->k > 0 ? nb_top_k(x, c->k, NULL) : nb_sort(x, c->axis, c->descending, NULL);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, nb_tree_get_val(in, "w")), 0, NULL));
}

static void check_grad(nb_ctx *ctx, sort_call c, const double *xv, const double *wv, int nw, const double *want) {
  int64_t dx[1] = {5}, dw[1] = {nw};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *x = nb_array_from_f64(ctx, NB_F64, 1, dx, xv), *w = nb_array_from_f64(ctx, NB_F64, 1, dw, wv);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "w", w);
  nb_array_release(x);
  nb_array_release(w);
  nb_graph *g = nb_trace(ctx, f_sort_loss, &c, in);
  nb_graph *dg = g ? nb_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
  CHECK_OK(ctx, dg ? nb_graph_run(ctx, dg, in, out) : NB_ERR_INTERNAL);
  nb_array *gr = nb_tree_get_array(out, "grad/x");
  CHECK(gr != NULL);
  for (int j = 0; gr && j < 5; j++) CHECK_NEAR(nb_array_get(gr, j), want[j], 0);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

static void test_grads(nb_ctx *ctx) {
  double x[5] = {0.5, -1, 2, 0.5, 7}, w[5] = {10, 20, 30, 40, 50};
  /* ascending order: positions 1, 0, 3, 2, 4 (the tie keeps 0 before 3) */
  check_grad(ctx, (sort_call){0, 0, false}, x, w, 5, (double[]){20, 10, 40, 30, 50});
  /* descending: 4, 2, 0, 3, 1 */
  check_grad(ctx, (sort_call){0, 0, true}, x, w, 5, (double[]){30, 50, 20, 40, 10});
  /* top 2: 4, 2 */
  check_grad(ctx, (sort_call){0, 2, false}, x, w, 2, (double[]){0, 0, 20, 0, 10});
}

/* ---------------------------------------------------------------- vmap */

/* vmap over axis `b` of x [n=2 at b] for the batch axis before, at and after
 * the sorted axis, against sorting each slice. */
static void test_vmap_axes(nb_ctx *ctx) {
  nb_test_rng rng = {99};
  int64_t dx[3] = {3, 4, 2}; /* unbatched [4, 2] after the batch axis is taken out */
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, dx);
  const double *xv = nb_array_data(x);
  for (int b = 0; b < 3; b++) {
    for (int axis = 0; axis < 2; axis++) {
      for (int k = 0; k < 2; k++) {
        sort_call c = {axis, k, axis == 1};
        if (k && axis == 0) continue;
        nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx), *axes = nb_tree_create(ctx);
        /* the unbatched shape: dx without dim b */
        int64_t ud[2];
        for (int i = 0, j = 0; i < 3; i++)
          if (i != b) ud[j++] = dx[i];
        nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 2, ud)));
        nb_tree_set_array(in, "x", x);
        nb_array *ax = nb_array_scalar(ctx, NB_I32, b);
        nb_tree_set_array(axes, "x", ax);
        nb_array_release(ax);
        nb_graph *g = nb_trace(ctx, f_sort, &c, spec);
        nb_graph *vg = g ? nb_vmap(ctx, g, &(nb_vmap_opts){.in_axes = axes, .out_axis = 0, .axis_size = dx[b]}) : NULL;
        CHECK_OK(ctx, vg ? nb_graph_run(ctx, vg, in, out) : NB_ERR_INTERNAL);
        nb_array *vv = nb_tree_get_array(out, "values"), *vi = nb_tree_get_array(out, "indices");
        for (int64_t s = 0; vv && vi && s < dx[b]; s++) {
          /* slice s along b, then sort it directly */
          double sl[24];
          int n = 0;
          for (int i0 = 0; i0 < 3; i0++)
            for (int i1 = 0; i1 < 4; i1++)
              for (int i2 = 0; i2 < 2; i2++) {
                int id[3] = {i0, i1, i2};
                if (id[b] == s) sl[n++] = xv[i0 * 8 + i1 * 2 + i2];
              }
          nb_array *xs = nb_array_from_f64(ctx, NB_F64, 2, ud, sl), *ws, *wi;
          run(ctx, &c, xs, &ws, &wi);
          int64_t per = nb_array_size(ws);
          for (int64_t j = 0; ws && wi && j < per; j++) {
            CHECK_MSG(nb_array_get(vv, s * per + j) == nb_array_get(ws, j), "vmap b=%d axis=%d k=%d", b, axis, k);
            CHECK_MSG(nb_array_get(vi, s * per + j) == nb_array_get(wi, j), "vmap b=%d axis=%d k=%d", b, axis, k);
          }
          nb_array_release(xs);
          nb_array_release(ws);
          nb_array_release(wi);
        }
        CHECK(vv && vi);
        nb_graph_destroy(vg);
        nb_graph_destroy(g);
        nb_tree_destroy(spec);
        nb_tree_destroy(in);
        nb_tree_destroy(out);
        nb_tree_destroy(axes);
      }
    }
  }
  nb_array_release(x);
}

/* ---------------------------------------------------------------- misuse */

static void test_misuse(nb_ctx *ctx) {
  int64_t d[2] = {3, 4};
  struct {
    int what, arg;
    nb_status st;
    const char *needle;
  } bad[] = {
      {0, 2, NB_ERR_INVALID_ARG, "sort: axis 2 out of range for rank 2"},
      {0, -3, NB_ERR_INVALID_ARG, "sort: axis -3 out of range"},
      {1, 5, NB_ERR_INVALID_ARG, "top_k: k = 5 is outside [0, 4] (the last axis)"},
      {1, -1, NB_ERR_INVALID_ARG, "top_k: k = -1"},
      {2, 0, NB_ERR_SHAPE, "top_k: the operand must have rank >= 1"},
      {3, 0, NB_ERR_INVALID_ARG, "sort: axis 0 out of range for rank 0"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F64, 2, d)), *s = nb_graph_input(g, "s", nb_aval_make(NB_F64, 0, NULL));
    nb_val *idx = NULL, *y;
    switch (bad[k].what) {
    case 0: y = nb_sort(x, bad[k].arg, false, &idx); break;
    case 1: y = nb_top_k(x, bad[k].arg, &idx); break;
    case 2: y = nb_top_k(s, 1, &idx); break;
    default: y = nb_sort(s, 0, false, &idx); break;
    }
    CHECK_MSG(nb__is_poison(y) && idx && nb__is_poison(idx), "case %zu: outputs not poisoned", k);
    CHECK_MSG(nb_graph_status(g) == bad[k].st, "case %zu", k);
    CHECK_MSG(strstr(nb_ctx_error(ctx), bad[k].needle) && strstr(nb_ctx_error(ctx), "test_sort.c:"), "case %zu: '%s'", k,
              nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    CHECK(nb__is_poison(nb_sort(x, 0, false, NULL))); /* sticky */
    nb_graph_destroy(g);
  }
  nb_val *idx = (nb_val *)&idx;
  CHECK(nb_sort(NULL, 0, false, &idx) == NULL && idx == NULL);
  CHECK(nb_top_k(NULL, 1, NULL) == NULL);
}

static void test_text(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {3, 4};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d)), *i1, *i2;
  nb_graph_output(g, "a", nb_sort(x, -1, true, &i1));
  nb_graph_output(g, "b", i1);
  nb_graph_output(g, "c", nb_top_k(x, 2, &i2));
  nb_graph_output(g, "d", i2);
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "axis=1 descending=1") && strstr(text, "k=2"), "%s", text);
  free(text);
  double flops, bytes;
  nb_graph_cost(g, &flops, &bytes);
  CHECK_NEAR(flops, 2 * 12 * 2, 1e-12); /* 12 elements * log2(4), twice */
  CHECK_NEAR(bytes, 12 * (8 + 4) + 12 * 4 + 6 * (4 + 4), 0);
  nb_graph_destroy(g);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  gold = nb_test_golden_load("tests/core/golden/gather.json");
  CHECK(gold != NULL);
  test_goldens(ctx);
  test_dtypes(ctx);
  test_shapes(ctx);
  test_grads(ctx);
  test_vmap_axes(ctx);
  test_misuse(ctx);
  test_text(ctx);
  cJSON_Delete(gold);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/sort");
}
