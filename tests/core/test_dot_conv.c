/* Value tests of dot_general, matmul, conv and rev: JAX goldens (outputs and
 * VJPs, tests/core/golden/make_dot_conv.py), hand-computed values, dtypes
 * (f32, bf16 -> f32, integer wraparound), zero-size operands, vmap with only
 * the kernel batched, cost and printing. Misuse errors and allocation
 * failures are in test_dot_conv_errors.c; finite differences, second order
 * and vmap of every configuration run in the primitive table
 * (tests/lib/cases_dot.c, cases_conv.c). */

#include "json_golden.h"
#include "primcheck.h"

/* ---------------------------------------------------------------- JSON goldens */

static int ints(const cJSON *list, int *out) {
  int n = cJSON_GetArraySize(list);
  for (int i = 0; i < n && i < NB_MAX_RANK; i++) out[i] = cJSON_GetArrayItem(list, i)->valueint;
  return n;
}

static nb_array *json_array(nb_ctx *ctx, const cJSON *a) {
  nb_dtype t;
  if (!a || !nb_dtype_from_name(cJSON_GetObjectItem(a, "dtype")->valuestring, &t)) return NULL;
  const cJSON *shape = cJSON_GetObjectItem(a, "shape"), *data = cJSON_GetObjectItem(a, "data");
  int64_t dims[NB_MAX_RANK];
  int rank = cJSON_GetArraySize(shape), n = cJSON_GetArraySize(data);
  for (int i = 0; i < rank; i++) dims[i] = (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) v[i] = cJSON_GetArrayItem(data, i)->valuedouble;
  nb_array *r = nb_array_from_f64(ctx, t, rank, dims, v);
  free(v);
  return r;
}

/* Compares got with the golden array: same dtype and shape, values within
 * tol * (1 + max |want|) (exactly for integers). */
static void compare(const char *name, const char *what, const nb_array *got, const nb_array *want, double tol) {
  CHECK_MSG(got && want, "%s %s: missing", name, what);
  if (!got || !want) return;
  nb_aval ga = nb_array_aval(got), wa = nb_array_aval(want);
  char s1[128], s2[128];
  CHECK_MSG(nb_aval_equal(&ga, &wa), "%s %s: %s vs golden %s", name, what, nb_aval_str(&ga, s1, sizeof s1),
            nb_aval_str(&wa, s2, sizeof s2));
  if (!nb_aval_equal(&ga, &wa)) return;
  double scale = 0;
  for (int64_t i = 0; i < nb_array_size(want); i++) scale = fmax(scale, fabs(nb_array_get(want, i)));
  int bad = 0;
  for (int64_t i = 0; i < nb_array_size(want) && bad < 3; i++) {
    double a = nb_array_get(got, i), b = nb_array_get(want, i);
    bool ok = nb_dtype_is_float(wa.dtype) ? fabs(a - b) <= tol * (1 + scale) : a == b;
    CHECK_MSG(ok, "%s %s[%lld]: nabla %.17g, jax %.17g", name, what, (long long)i, a, b);
    bad += !ok;
  }
}

static nb_status golden_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const cJSON *c = user;
  const char *kind = cJSON_GetObjectItem(c, "kind")->valuestring;
  nb_val *a = nb_tree_get_val(in, "a"), *b = nb_tree_get_val(in, "b"), *y;
  if (strcmp(kind, "matmul") == 0) {
    y = nb_matmul(a, b);
  } else if (strcmp(kind, "dot") == 0) {
    nb_dot_dims dn;
    memset(&dn, 0, sizeof dn);
    dn.n_contract = ints(cJSON_GetObjectItem(c, "lhs_contract"), dn.lhs_contract);
    ints(cJSON_GetObjectItem(c, "rhs_contract"), dn.rhs_contract);
    dn.n_batch = ints(cJSON_GetObjectItem(c, "lhs_batch"), dn.lhs_batch);
    ints(cJSON_GetObjectItem(c, "rhs_batch"), dn.rhs_batch);
    nb_dtype t = NB_DTYPE_COUNT;
    const cJSON *od = cJSON_GetObjectItem(c, "out_dtype");
    if (od) nb_dtype_from_name(od->valuestring, &t);
    y = nb_dot_general(a, b, &dn, t);
  } else {
    int spec[3][NB_MAX_RANK], v[NB_MAX_RANK];
    const cJSON *pad = cJSON_GetObjectItem(c, "padding");
    int ns = ints(cJSON_GetObjectItem(c, "strides"), v);
    nb_conv_params p = nb_conv_params_default(ns, NULL, NULL);
    for (int j = 0; j < ns; j++) {
      p.strides[j] = v[j];
      p.pad_lo[j] = cJSON_GetArrayItem(cJSON_GetArrayItem(pad, j), 0)->valueint;
      p.pad_hi[j] = cJSON_GetArrayItem(cJSON_GetArrayItem(pad, j), 1)->valueint;
    }
    ints(cJSON_GetObjectItem(c, "lhs_dilation"), v);
    for (int j = 0; j < ns; j++) p.lhs_dilation[j] = v[j];
    ints(cJSON_GetObjectItem(c, "rhs_dilation"), v);
    for (int j = 0; j < ns; j++) p.rhs_dilation[j] = v[j];
    p.feature_group_count = cJSON_GetObjectItem(c, "feature_group_count")->valueint;
    p.batch_group_count = cJSON_GetObjectItem(c, "batch_group_count")->valueint;
    ints(cJSON_GetObjectItem(c, "lhs_spec"), spec[0]);
    ints(cJSON_GetObjectItem(c, "rhs_spec"), spec[1]);
    ints(cJSON_GetObjectItem(c, "out_spec"), spec[2]);
    p.lhs_batch_dim = spec[0][0], p.lhs_feature_dim = spec[0][1];
    p.rhs_out_feature_dim = spec[1][0], p.rhs_in_feature_dim = spec[1][1];
    p.out_batch_dim = spec[2][0], p.out_feature_dim = spec[2][1];
    for (int j = 0; j < ns; j++) {
      p.lhs_spatial[j] = spec[0][j + 2];
      p.rhs_spatial[j] = spec[1][j + 2];
      p.out_spatial[j] = spec[2][j + 2];
    }
    y = nb_conv(a, b, &p);
  }
  return nb_tree_set_val(out, "y", y);
}

static void run_golden(nb_ctx *ctx, const cJSON *c) {
  const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
  nb_array *lhs = json_array(ctx, cJSON_GetObjectItem(c, "lhs")), *rhs = json_array(ctx, cJSON_GetObjectItem(c, "rhs"));
  nb_array *want = json_array(ctx, cJSON_GetObjectItem(c, "out")), *ct = json_array(ctx, cJSON_GetObjectItem(c, "ct"));
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "a", lhs);
  nb_tree_set_array(in, "b", rhs);
  nb_graph *g = nb_trace(ctx, golden_fn, (void *)c, in);
  CHECK_MSG(g, "%s: trace: %s", name, nb_ctx_error(ctx));
  double tol = nb_array_dtype(want) == NB_F64 ? 1e-12 : 1e-6;
  if (g && nb_graph_run(ctx, g, in, out) == NB_OK) compare(name, "out", nb_tree_get_array(out, "y"), want, tol);
  else CHECK_MSG(false, "%s: run: %s", name, nb_ctx_error(ctx));
  if (g && ct) { /* the VJP at ct, against jax.vjp */
    nb_graph *vg = nb_vjp(ctx, g);
    nb_tree *vin = nb_tree_create(ctx), *vout = nb_tree_create(ctx);
    nb_tree_merge(vin, "primal", in);
    nb_tree_set_array(vin, "ct/y", ct);
    CHECK_OK(ctx, nb_graph_run(ctx, vg, vin, vout));
    nb_array *gl = json_array(ctx, cJSON_GetObjectItem(c, "grad_lhs")), *gr = json_array(ctx, cJSON_GetObjectItem(c, "grad_rhs"));
    compare(name, "grad_lhs", nb_tree_get_array(vout, "grad/a"), gl, 1e-12);
    compare(name, "grad_rhs", nb_tree_get_array(vout, "grad/b"), gr, 1e-12);
    nb_array_release(gl);
    nb_array_release(gr);
    nb_tree_destroy(vin);
    nb_tree_destroy(vout);
    nb_graph_destroy(vg);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_array_release(lhs);
  nb_array_release(rhs);
  nb_array_release(want);
  nb_array_release(ct);
}

static void test_goldens(nb_ctx *ctx) {
  cJSON *root = nb_test_golden_load("tests/core/golden/dot_conv.json");
  CHECK(root);
  const cJSON *cases = root ? cJSON_GetObjectItem(root, "cases") : NULL;
  CHECK(cJSON_GetArraySize(cases) >= 20);
  for (int i = 0; i < cJSON_GetArraySize(cases); i++) run_golden(ctx, cJSON_GetArrayItem(cases, i));
  cJSON_Delete(root);
}

/* ---------------------------------------------------------------- hand-computed values */

typedef nb_val *(*op2_fn)(nb_val *a, nb_val *b, const void *u);

typedef struct op2 {
  op2_fn f;
  const void *u;
} op2;

static nb_status op2_trace(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const op2 *o = user;
  return nb_tree_set_val(out, "y", o->f(nb_tree_get_val(in, "a"), nb_tree_get_val(in, "b"), o->u));
}

/* Runs f(a, b) eagerly; returns the result (new reference) or NULL. */
static nb_array *run2(nb_ctx *ctx, op2_fn f, const void *u, nb_array *a, nb_array *b) {
  op2 o = {f, u};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_status st = nb_test_eval(ctx, op2_trace, &o, in, out);
  nb_array *y = st == NB_OK ? nb_tree_get_array(out, "y") : NULL;
  if (y) nb_array_retain(y);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return y;
}

typedef struct dot_spec {
  nb_dot_dims dn;
  nb_dtype out_dtype;
} dot_spec;

static nb_val *op_matmul(nb_val *a, nb_val *b, const void *u) { return nb_matmul(a, b); }
static nb_val *op_conv(nb_val *a, nb_val *b, const void *u) { return nb_conv(a, b, (const nb_conv_params *)u); }
static nb_val *op_dot(nb_val *a, nb_val *b, const void *u) {
  const dot_spec *p = u;
  return nb_dot_general(a, b, &p->dn, p->out_dtype);
}

static void expect(const char *what, nb_array *y, int rank, const int64_t *dims, const double *want) {
  CHECK_MSG(y, "%s: no result", what);
  if (!y) return;
  nb_shape s = nb_shape_make(rank, dims), got = nb_array_aval(y).shape;
  CHECK_MSG(nb_shape_equal(&s, &got), "%s: wrong shape", what);
  for (int64_t i = 0; nb_shape_equal(&s, &got) && i < nb_shape_size(&s); i++)
    CHECK_MSG(nb_array_get(y, i) == want[i], "%s[%lld]: %g, want %g", what, (long long)i, nb_array_get(y, i), want[i]);
  nb_array_release(y);
}

static nb_array *vec(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const double *v) {
  return nb_array_from_f64(ctx, t, rank, dims, v);
}

static void test_hand_values(nb_ctx *ctx) {
  int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d22[2] = {2, 2};
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, ab[4] = {58, 64, 139, 154};
  nb_array *x = vec(ctx, NB_F32, 2, d23, a), *w = vec(ctx, NB_F32, 2, d32, b);
  expect("matmul f32", run2(ctx, op_matmul, NULL, x, w), 2, d22, ab);
  nb_array_release(x);
  nb_array_release(w);

  /* 1-D conv, one channel: x = 1..5, w = (1, 2, 3) */
  int64_t dx[3] = {1, 1, 5}, dw[3] = {1, 1, 3};
  double xv[5] = {1, 2, 3, 4, 5}, wv[3] = {1, 2, 3};
  x = vec(ctx, NB_F64, 3, dx, xv);
  w = vec(ctx, NB_F64, 3, dw, wv);
  nb_conv_params p = nb_conv_params_default(1, NULL, NULL);
  double valid[3] = {14, 20, 26};
  expect("conv valid", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 3}, valid);
  p.strides[0] = 2, p.pad_lo[0] = 1, p.pad_hi[0] = 1; /* padded 0 1 2 3 4 5 0 */
  double strided[3] = {8, 20, 14};
  expect("conv stride 2 pad 1", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 3}, strided);
  p = nb_conv_params_default(1, NULL, NULL);
  p.lhs_dilation[0] = 2; /* 1 0 2 0 3 0 4 0 5 */
  double dil[7] = {7, 4, 11, 6, 15, 8, 19};
  expect("conv lhs dilation 2", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 7}, dil);
  p = nb_conv_params_default(1, NULL, NULL);
  p.rhs_dilation[0] = 2; /* taps at 0, 2, 4 */
  double atrous[1] = {22};
  expect("conv rhs dilation 2", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 1}, atrous);
  p = nb_conv_params_default(1, NULL, NULL);
  p.pad_lo[0] = -1, p.pad_hi[0] = 2; /* 2 3 4 5 0 0 */
  double crop[4] = {20, 26, 14, 5};
  expect("conv negative low padding", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 4}, crop);
  nb_array_release(x);
  nb_array_release(w);

  /* integer conv wraps like the integer dtype: i8 */
  double xi[5] = {100, 100, 100, 100, 100}, wi[3] = {1, 1, 1};
  x = vec(ctx, NB_I8, 3, dx, xi);
  w = vec(ctx, NB_I8, 3, dw, wi);
  p = nb_conv_params_default(1, NULL, NULL);
  double wrapped[3] = {44, 44, 44}; /* 300 mod 256 */
  expect("conv i8 wraps", run2(ctx, op_conv, &p, x, w), 3, (int64_t[]){1, 1, 3}, wrapped);
  nb_array_release(x);
  nb_array_release(w);
}

/* ---------------------------------------------------------------- dtypes */

static void test_dtypes(nb_ctx *ctx) {
  nb_test_rng rng = {42};
  int64_t da[2] = {6, 9}, db[2] = {9, 5};
  dot_spec p;
  memset(&p, 0, sizeof p);
  p.dn.n_contract = 1;
  p.dn.lhs_contract[0] = 1;
  p.out_dtype = NB_F64;
  /* small integers are exact in every float dtype: f16 / bf16 inputs with an
   * f64 (or f32) result must be exact, and agree with the f64 product */
  nb_array *a = nb_test_randint(ctx, &rng, NB_F64, 2, da, -8, 8), *b = nb_test_randint(ctx, &rng, NB_F64, 2, db, -8, 8);
  nb_array *ref = run2(ctx, op_dot, &p, a, b);
  const nb_dtype lows[3] = {NB_BF16, NB_F16, NB_F32};
  for (int k = 0; k < 3; k++) {
    nb_array *al = nb_array_astype(ctx, a, lows[k]), *bl = nb_array_astype(ctx, b, lows[k]);
    for (int out = 0; out < 2; out++) {
      p.out_dtype = out ? NB_F32 : NB_F64;
      nb_array *y = run2(ctx, op_dot, &p, al, bl);
      CHECK_MSG(y && nb_array_dtype(y) == p.out_dtype, "dot %s -> %s", nb_dtype_name(lows[k]), nb_dtype_name(p.out_dtype));
      for (int64_t i = 0; y && i < nb_array_size(y); i++) CHECK(nb_array_get(y, i) == nb_array_get(ref, i));
      nb_array_release(y);
    }
    nb_array_release(al);
    nb_array_release(bl);
  }
  /* bf16 result rounds the f32-or-better accumulation once */
  p.out_dtype = NB_BF16;
  nb_array *a16 = nb_array_astype(ctx, a, NB_BF16), *b16 = nb_array_astype(ctx, b, NB_BF16);
  nb_array *y = run2(ctx, op_dot, &p, a16, b16);
  for (int64_t i = 0; y && i < nb_array_size(y); i++)
    CHECK(nb_array_get(y, i) == (double)nb_bf16_to_f32(nb_f32_to_bf16((float)nb_array_get(ref, i))));
  nb_array_release(y);
  nb_array_release(a16);
  nb_array_release(b16);
  /* integer dot with an i64 result from i32 operands does not wrap at 32 bits */
  double big[2] = {2e9, 2e9};
  int64_t d1[1] = {2};
  nb_array *ai = vec(ctx, NB_I32, 1, d1, big);
  memset(&p, 0, sizeof p);
  p.dn.n_contract = 1;
  p.out_dtype = NB_I64;
  y = run2(ctx, op_dot, &p, ai, ai);
  CHECK(y && nb_array_dtype(y) == NB_I64 && ((const int64_t *)nb_array_data(y))[0] == 8000000000000000000LL);
  nb_array_release(y);
  nb_array_release(ai);
  nb_array_release(ref);
  nb_array_release(a);
  nb_array_release(b);
}

/* ---------------------------------------------------------------- zero sizes */

static nb_status f_dot_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const op2 *o = user;
  nb_val *y = o->f(nb_tree_get_val(in, "a"), nb_tree_get_val(in, "b"), o->u);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(y, 0, NULL));
}

/* grad of sum(f(a, b)) runs and gives zero gradients of a's and b's shapes. */
static void check_zero_grads(nb_ctx *ctx, const char *what, op2_fn f, const void *u, int ra, const int64_t *da, int rb,
                             const int64_t *db) {
  op2 o = {f, u};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *a = nb_array_ones(ctx, NB_F64, ra, da), *b = nb_array_ones(ctx, NB_F64, rb, db);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_graph *g = nb_trace(ctx, f_dot_loss, &o, in), *dg = g ? nb_value_and_grad(ctx, g, NULL) : NULL;
  CHECK_MSG(dg && nb_graph_run(ctx, dg, in, out) == NB_OK, "%s: %s", what, nb_ctx_error(ctx));
  nb_array *ga = nb_tree_get_array(out, "grad/a"), *gb = nb_tree_get_array(out, "grad/b");
  CHECK_MSG(ga && gb && nb_array_size(ga) == nb_array_size(a) && nb_array_size(gb) == nb_array_size(b), "%s: grad shapes", what);
  for (int64_t i = 0; ga && i < nb_array_size(ga); i++) CHECK(nb_array_get(ga, i) == 0);
  for (int64_t i = 0; gb && i < nb_array_size(gb); i++) CHECK(nb_array_get(gb, i) == 0);
  CHECK(nb_tree_get_array(out, "loss") && nb_array_get(nb_tree_get_array(out, "loss"), 0) == 0);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_array_release(a);
  nb_array_release(b);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

static void test_zero_sizes(nb_ctx *ctx) {
  int64_t d30[2] = {3, 0}, d04[2] = {0, 4}, d34[2] = {3, 4};
  nb_array *a = nb_array_ones(ctx, NB_F64, 2, d30), *b = nb_array_ones(ctx, NB_F64, 2, d04);
  double zeros[12] = {0};
  expect("empty contraction", run2(ctx, op_matmul, NULL, a, b), 2, d34, zeros);
  nb_array_release(a);
  nb_array_release(b);
  dot_spec p;
  memset(&p, 0, sizeof p);
  p.dn.n_contract = 1;
  p.dn.lhs_contract[0] = 1;
  p.out_dtype = NB_F64;
  check_zero_grads(ctx, "dot with K = 0", op_dot, &p, 2, d30, 2, d04);
  /* conv whose output has no spatial positions, and one with an empty batch */
  nb_conv_params c = nb_conv_params_default(1, NULL, NULL);
  c.pad_lo[0] = -2;
  check_zero_grads(ctx, "conv with an empty output", op_conv, &c, 3, (int64_t[]){2, 3, 3}, 3, (int64_t[]){4, 3, 2});
  c = nb_conv_params_default(1, NULL, NULL);
  check_zero_grads(ctx, "conv with an empty batch", op_conv, &c, 3, (int64_t[]){0, 3, 5}, 3, (int64_t[]){4, 3, 2});
  check_zero_grads(ctx, "conv with no out features", op_conv, &c, 3, (int64_t[]){2, 3, 5}, 3, (int64_t[]){0, 3, 2});
}

/* ---------------------------------------------------------------- vmap of the kernel only */

typedef struct kcase {
  const char *name;
  int r;
  int64_t da[NB_MAX_RANK], db[NB_MAX_RANK];
  nb_conv_params p;
} kcase;

static nb_status f_kconv(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const kcase *k = user;
  return nb_tree_set_val(out, "y", nb_conv(nb_tree_get_val(in, "a"), nb_tree_get_val(in, "b"), &k->p));
}

static void test_vmap_kernel(nb_ctx *ctx) {
  nb_test_rng rng = {7};
  kcase ks[4];
  memset(ks, 0, sizeof ks);
  ks[0] = (kcase){"plain 2-D", 4, {2, 3, 5, 4}, {4, 3, 3, 2}, nb_conv_params_default(2, NULL, (int64_t[]){1, 0})};
  ks[1] = (kcase){"feature groups", 4, {2, 4, 5, 4}, {6, 2, 3, 2}, nb_conv_params_default(2, (int64_t[]){2, 1}, NULL)};
  ks[1].p.feature_group_count = 2;
  ks[2] = (kcase){"batch groups", 3, {4, 3, 6}, {4, 3, 2}, nb_conv_params_default(1, NULL, NULL)};
  ks[2].p.batch_group_count = 2;
  ks[3] = (kcase){"depthwise, NWC / WIO", 3, {2, 7, 3}, {3, 1, 6}, nb_conv_params_default(1, NULL, (int64_t[]){1})};
  ks[3].p.feature_group_count = 3;
  ks[3].p.lhs_feature_dim = 2, ks[3].p.lhs_spatial[0] = 1;
  ks[3].p.rhs_out_feature_dim = 2, ks[3].p.rhs_in_feature_dim = 1, ks[3].p.rhs_spatial[0] = 0;
  ks[3].p.out_feature_dim = 2, ks[3].p.out_spatial[0] = 1;
  for (int i = 0; i < 4; i++) {
    int64_t db[NB_MAX_RANK];
    db[0] = 3;
    memcpy(db + 1, ks[i].db, sizeof(int64_t) * (size_t)ks[i].r);
    nb_tree *batched = nb_tree_create(ctx), *unbatched = nb_tree_create(ctx);
    nb_array *a = nb_test_randn(ctx, &rng, NB_F64, ks[i].r, ks[i].da), *b = nb_test_randn(ctx, &rng, NB_F64, ks[i].r + 1, db);
    nb_tree_set_array(unbatched, "a", a);
    nb_tree_set_array(batched, "b", b);
    CHECK_MSG(nb_test_check_vmap(ctx, ks[i].name, f_kconv, &ks[i], batched, unbatched, 3), "vmap of the kernel: %s", ks[i].name);
    nb_array_release(a);
    nb_array_release(b);
    nb_tree_destroy(batched);
    nb_tree_destroy(unbatched);
  }
}

/* ---------------------------------------------------------------- vmap at inner axes */

/* Element b along `axis` of a (a new array one rank lower). */
static nb_array *take_axis(nb_ctx *ctx, const nb_array *a, int axis, int64_t b) {
  int r = nb_array_rank(a);
  const int64_t *d = nb_array_dims(a);
  int64_t dims[NB_MAX_RANK], outer = 1, inner = 1;
  for (int i = 0, k = 0; i < r; i++)
    if (i != axis) dims[k++] = d[i];
  for (int i = 0; i < axis; i++) outer *= d[i];
  for (int i = axis + 1; i < r; i++) inner *= d[i];
  double *v = malloc(sizeof(double) * (size_t)(outer * inner + 1));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) v[o * inner + i] = nb_array_get(a, (o * d[axis] + b) * inner + i);
  nb_array *s = nb_array_from_f64(ctx, nb_array_dtype(a), r - 1, dims, v);
  free(v);
  return s;
}

static nb_array *with_axis(nb_ctx *ctx, nb_test_rng *rng, int r, const int64_t *d, int axis, int64_t n) {
  int64_t dims[NB_MAX_RANK];
  for (int i = 0, k = 0; i <= r; i++) dims[i] = i == axis ? n : d[k++];
  return nb_test_randn(ctx, rng, NB_F64, r + 1, dims);
}

/* vmap(f) with a batched at axis ia, b at axis ib (-1: unbatched) and the
 * result at axis oa, against f on each slice. */
static void check_vmap_axes(nb_ctx *ctx, const char *name, op2_fn f, const void *u, int ra, const int64_t *da, int rb,
                            const int64_t *db, int ia, int ib, int oa) {
  nb_test_rng rng = {11};
  const int64_t n = 3;
  op2 o = {f, u};
  nb_tree *spec = nb_tree_create(ctx), *axes = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set(spec, "a", nb_leaf_aval(nb_aval_make(NB_F64, ra, da)));
  nb_tree_set(spec, "b", nb_leaf_aval(nb_aval_make(NB_F64, rb, db)));
  nb_array *a = ia >= 0 ? with_axis(ctx, &rng, ra, da, ia, n) : nb_test_randn(ctx, &rng, NB_F64, ra, da);
  nb_array *b = ib >= 0 ? with_axis(ctx, &rng, rb, db, ib, n) : nb_test_randn(ctx, &rng, NB_F64, rb, db);
  nb_array *axa = nb_array_scalar(ctx, NB_I32, ia), *axb = nb_array_scalar(ctx, NB_I32, ib);
  nb_tree_set_array(axes, "a", axa);
  nb_tree_set_array(axes, "b", axb);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_graph *g = nb_trace(ctx, op2_trace, &o, spec);
  nb_vmap_opts vo = {.out_axis = oa, .in_axes = axes, .axis_size = n};
  nb_graph *vg = g ? nb_vmap(ctx, g, &vo) : NULL;
  CHECK_MSG(vg && nb_graph_run(ctx, vg, in, out) == NB_OK, "%s: %s", name, nb_ctx_error(ctx));
  nb_array *y = nb_tree_get_array(out, "y");
  for (int64_t k = 0; y && k < n; k++) {
    nb_array *ak = ia >= 0 ? take_axis(ctx, a, ia, k) : a, *bk = ib >= 0 ? take_axis(ctx, b, ib, k) : b;
    if (ia < 0) nb_array_retain(a);
    if (ib < 0) nb_array_retain(b);
    nb_array *want = run2(ctx, f, u, ak, bk), *got = take_axis(ctx, y, oa, k);
    CHECK_MSG(want && nb_array_size(want) == nb_array_size(got), "%s: slice %lld", name, (long long)k);
    for (int64_t i = 0; want && i < nb_array_size(want) && i < nb_array_size(got); i++)
      CHECK_MSG(fabs(nb_array_get(got, i) - nb_array_get(want, i)) <= 1e-12 * (1 + fabs(nb_array_get(want, i))),
                "%s: slice %lld element %lld", name, (long long)k, (long long)i);
    nb_array_release(ak);
    nb_array_release(bk);
    nb_array_release(want);
    nb_array_release(got);
  }
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_array_release(a);
  nb_array_release(b);
  nb_array_release(axa);
  nb_array_release(axb);
  nb_tree_destroy(spec);
  nb_tree_destroy(axes);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

static void test_vmap_axes(nb_ctx *ctx) {
  dot_spec p;
  memset(&p, 0, sizeof p);
  p.dn.n_batch = 1;
  p.dn.n_contract = 1;
  p.dn.lhs_contract[0] = 2;
  p.dn.rhs_contract[0] = 1;
  p.out_dtype = NB_F64;
  int64_t la[3] = {2, 3, 4}, lb[3] = {2, 4, 5};
  check_vmap_axes(ctx, "dot, both batched at inner axes", op_dot, &p, 3, la, 3, lb, 2, 3, 1);
  check_vmap_axes(ctx, "dot, lhs batched at axis 1", op_dot, &p, 3, la, 3, lb, 1, -1, 3);
  check_vmap_axes(ctx, "dot, rhs batched at axis 2", op_dot, &p, 3, la, 3, lb, -1, 2, 2);
  nb_conv_params c = nb_conv_params_default(2, (int64_t[]){1, 2}, (int64_t[]){1, 0});
  c.feature_group_count = 2;
  int64_t cx[4] = {2, 4, 5, 4}, cw[4] = {6, 2, 3, 2};
  check_vmap_axes(ctx, "conv, both batched at inner axes", op_conv, &c, 4, cx, 4, cw, 3, 2, 4);
  check_vmap_axes(ctx, "conv, lhs batched at axis 2", op_conv, &c, 4, cx, 4, cw, 2, -1, 1);
  check_vmap_axes(ctx, "conv, rhs batched at axis 4", op_conv, &c, 4, cx, 4, cw, -1, 4, 2);
}

/* ---------------------------------------------------------------- mixed-precision gradients */

static nb_status f_mixed(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const dot_spec *p = user;
  nb_val *a = nb_convert(nb_tree_get_val(in, "a"), NB_BF16), *b = nb_convert(nb_tree_get_val(in, "b"), NB_BF16);
  nb_val *y = nb_dot_general(a, b, &p->dn, p->out_dtype);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_convert(nb_mul(y, y), NB_F64), 0, NULL));
}

/* Gradients through a bf16 x bf16 -> f32 dot: the cotangent is f32, the
 * operands' cotangents come back in bf16 (here converted to the f64 inputs);
 * with small-integer inputs every step is exact, so they must equal the f64
 * gradient 2 y b^T, 2 a^T y exactly. */
static void test_mixed_grads(nb_ctx *ctx) {
  dot_spec p;
  memset(&p, 0, sizeof p);
  p.dn.n_contract = 1;
  p.dn.lhs_contract[0] = 1;
  p.out_dtype = NB_F32;
  nb_test_rng rng = {5};
  int64_t da[2] = {2, 3}, db[2] = {3, 2};
  nb_array *a = nb_test_randint(ctx, &rng, NB_F64, 2, da, -3, 3), *b = nb_test_randint(ctx, &rng, NB_F64, 2, db, -3, 3);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_graph *g = nb_trace(ctx, f_mixed, &p, in), *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  CHECK_MSG(dg && nb_graph_run(ctx, dg, in, out) == NB_OK, "mixed grads: %s", nb_ctx_error(ctx));
  double A[6], B[6], Y[4];
  for (int i = 0; i < 6; i++) A[i] = nb_array_get(a, i), B[i] = nb_array_get(b, i);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) Y[i * 2 + j] = A[i * 3] * B[j] + A[i * 3 + 1] * B[2 + j] + A[i * 3 + 2] * B[4 + j];
  nb_array *ga = nb_tree_get_array(out, "grad/a"), *gb = nb_tree_get_array(out, "grad/b");
  for (int i = 0; ga && gb && i < 2; i++)
    for (int k = 0; k < 3; k++) {
      CHECK(nb_array_get(ga, i * 3 + k) == 2 * (Y[i * 2] * B[k * 2] + Y[i * 2 + 1] * B[k * 2 + 1]));
      CHECK(nb_array_get(gb, k * 2 + i) == 2 * (A[k] * Y[i] + A[3 + k] * Y[2 + i]));
    }
  CHECK(ga && gb);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_array_release(a);
  nb_array_release(b);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* ---------------------------------------------------------------- cost and printing */

static void test_cost_and_print(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, (int64_t[]){64, 128}));
  nb_val *w = nb_graph_input(g, "w", nb_aval_make(NB_F32, 2, (int64_t[]){128, 32}));
  nb_graph_output(g, "y", nb_matmul(x, w));
  double flops, bytes;
  nb_graph_cost(g, &flops, &bytes);
  CHECK_NEAR(flops, 2.0 * 64 * 32 * 128, 0);
  CHECK_NEAR(bytes, 4.0 * (64 * 128 + 128 * 32 + 64 * 32), 0);
  char *s = nb_graph_to_string(g);
  CHECK_MSG(s && strstr(s, "dot_general") && strstr(s, "lhs_contract=(1) rhs_contract=(0) lhs_batch=() rhs_batch=() out=f32"),
            "%s", s ? s : "(null)");
  free(s);
  nb_graph_destroy(g);

  g = nb_graph_create(ctx);
  x = nb_graph_input(g, "x", nb_aval_make(NB_F64, 4, (int64_t[]){2, 3, 5, 5}));
  w = nb_graph_input(g, "w", nb_aval_make(NB_F64, 4, (int64_t[]){4, 3, 3, 3}));
  nb_conv_params p = nb_conv_params_default(2, NULL, (int64_t[]){1, 1});
  nb_graph_output(g, "y", nb_rev(nb_conv(x, w, &p), 1, (int[]){-1}));
  nb_graph_cost(g, &flops, &bytes);
  CHECK_NEAR(flops, 2.0 * (2 * 4 * 5 * 5) * (3 * 3 * 3), 0);
  s = nb_graph_to_string(g);
  CHECK_MSG(s && strstr(s, "conv") &&
                strstr(s, "strides=(1,1) padding=((1,1),(1,1)) lhs_dilation=(1,1) rhs_dilation=(1,1) feature_groups=1 "
                          "batch_groups=1 lhs=(0,1,2,3) rhs=(0,1,2,3) out=(0,1,2,3)") &&
                strstr(s, "rev") && strstr(s, "axes=(3)"),
            "%s", s ? s : "(null)");
  free(s);
  nb_graph_destroy(g);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_goldens(ctx);
  test_hand_values(ctx);
  test_dtypes(ctx);
  test_zero_sizes(ctx);
  test_vmap_kernel(ctx);
  test_vmap_axes(ctx);
  test_mixed_grads(ctx);
  test_cost_and_print(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/dot_conv");
}
