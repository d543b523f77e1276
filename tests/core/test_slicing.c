/* Values of slice, pad and concatenate: hand-computed cases, JAX goldens
 * (tests/core/golden/make_slicing.py) over several dtypes, gradients with
 * respect to the pad value, identities, printed params and misuse. The
 * derivative and vmap checks are rows of the primitive table (test_prims). */
#include "json_golden.h"
#include "primcheck.h"

/* ---------------------------------------------------------------- running small graphs */

typedef nb_val *(*build_fn)(nb_graph *g, nb_val *const *x, const void *u);
typedef struct run_spec {
  int n;
  build_fn build;
  const void *u;
} run_spec;

static nb_status trace_body(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const run_spec *s = user;
  nb_val *x[16];
  char path[16];
  for (int i = 0; i < s->n; i++) {
    snprintf(path, sizeof path, "x%d", i);
    x[i] = nb_tree_get_val(in, path);
  }
  return nb_tree_set_val(out, "y", s->build(g, x, s->u));
}

/* Runs build on arrays x[n]; returns y (new reference) or NULL. */
static nb_array *run(nb_ctx *ctx, int n, nb_array *const *x, build_fn build, const void *u) {
  run_spec s = {n, build, u};
  nb_tree *in = nb_tree_create(ctx);
  char path[16];
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "x%d", i);
    nb_tree_set_array(in, path, x[i]);
  }
  nb_array *y = nb_test_eval_output(ctx, trace_body, &s, in, "y");
  nb_tree_destroy(in);
  return y;
}

/* ---------------------------------------------------------------- ops with params */

typedef struct slice_args {
  int64_t start[NB_MAX_RANK], limit[NB_MAX_RANK], strides[NB_MAX_RANK];
} slice_args;
static nb_val *b_slice(nb_graph *g, nb_val *const *x, const void *u) {
  const slice_args *a = u;
  return nb_slice(x[0], a->start, a->limit, a->strides);
}

typedef struct pad_args {
  double value;
  int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK], interior[NB_MAX_RANK];
} pad_args;
static nb_val *b_pad(nb_graph *g, nb_val *const *x, const void *u) {
  const pad_args *a = u;
  return nb_pad(x[0], nb_scalar(g, nb_val_dtype(x[0]), a->value), a->lo, a->hi, a->interior);
}

typedef struct concat_args {
  int n, axis;
} concat_args;
static nb_val *b_concat(nb_graph *g, nb_val *const *x, const void *u) {
  const concat_args *a = u;
  return nb_concatenate(a->n, x, a->axis);
}

/* ---------------------------------------------------------------- hand-computed */

static void test_hand_values(nb_ctx *ctx) {
  int64_t d25[2] = {2, 5};
  nb_array *x = nb_array_iota(ctx, NB_I32, 2, d25, 1);
  slice_args s = {{0, 1}, {2, 5}, {1, 2}};
  nb_test_check_values(ctx, "slice (0,1):(2,5):(1,2)", run(ctx, 1, &x, b_slice, &s), NB_I32, 2, (int64_t[]){2, 2},
               (double[]){1, 3, 1, 3});
  nb_array_release(x);

  nb_array *v = nb_array_from_f64(ctx, NB_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  pad_args p = {.value = -1, .lo = {1}, .hi = {-1}, .interior = {1}};
  nb_test_check_values(ctx, "pad lo 1 hi -1 interior 1", run(ctx, 1, &v, b_pad, &p), NB_F32, 1, (int64_t[]){5},
               (double[]){-1, 1, -1, 2, -1});
  pad_args crop = {.value = 7, .lo = {-2}, .hi = {2}, .interior = {0}};
  nb_test_check_values(ctx, "pad lo -2 hi 2", run(ctx, 1, &v, b_pad, &crop), NB_F32, 1, (int64_t[]){3}, (double[]){3, 7, 7});
  nb_array_release(v);
  nb_array *empty = nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){0});
  pad_args pe = {.value = 4, .lo = {1}, .hi = {1}, .interior = {3}};
  nb_test_check_values(ctx, "pad of an empty array", run(ctx, 1, &empty, b_pad, &pe), NB_F32, 1, (int64_t[]){2}, (double[]){4, 4});
  nb_array_release(empty);

  nb_array *bools = nb_array_from_f64(ctx, NB_BOOL, 2, (int64_t[]){1, 2}, (double[]){1, 0});
  pad_args pb = {.value = 1, .lo = {1, 0}, .hi = {0, 1}, .interior = {0, 0}};
  nb_test_check_values(ctx, "pad of bool", run(ctx, 1, &bools, b_pad, &pb), NB_BOOL, 2, (int64_t[]){2, 3},
               (double[]){1, 1, 1, 1, 0, 1});
  nb_array_release(bools);

  nb_array *xs[2] = {nb_array_from_f64(ctx, NB_I64, 2, (int64_t[]){2, 1}, (double[]){1, 2}),
                     nb_array_from_f64(ctx, NB_I64, 2, (int64_t[]){2, 2}, (double[]){3, 4, 5, 6})};
  concat_args c = {2, -1};
  nb_test_check_values(ctx, "concatenate axis -1", run(ctx, 2, xs, b_concat, &c), NB_I64, 2, (int64_t[]){2, 3},
               (double[]){1, 3, 4, 2, 5, 6});
  nb_array_release(xs[0]);
  nb_array_release(xs[1]);
}

/* d/dv sum(pad(x, v)) counts the pad value's surviving positions; cropped
 * elements of x get a zero gradient. */
static nb_status f_pad_sum(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t lo[1] = {1}, hi[1] = {-2}, interior[1] = {1};
  nb_val *y = nb_pad(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "v"), lo, hi, interior); /* v x0 v x1 v x2 -> v x0 v x1 */
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, y), 0, NULL));
}

static void test_pad_grad(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *x = nb_array_from_f64(ctx, NB_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3}), *v = nb_array_scalar(ctx, NB_F64, 0.5);
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "v", v);
  nb_graph *g = nb_trace(ctx, f_pad_sum, NULL, in);
  nb_graph *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  CHECK_OK(ctx, dg ? nb_graph_run(ctx, dg, in, out) : nb_ctx_status(ctx));
  nb_array *gx = nb_tree_get_array(out, "grad/x"), *gv = nb_tree_get_array(out, "grad/v");
  CHECK(gx && gv);
  if (gx && gv) {
    CHECK_NEAR(nb_array_get(gx, 0), 2, 0);
    CHECK_NEAR(nb_array_get(gx, 1), 4, 0);
    CHECK_NEAR(nb_array_get(gx, 2), 0, 0); /* cropped */
    CHECK_NEAR(nb_array_get(gv, 0), 2 * 2 * 0.5, 0);
  }
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_array_release(x);
  nb_array_release(v);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* Trivial windows return the operand itself; the text form shows params. */
static void test_identities_and_print(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {2, 5};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d)), *zero = nb_scalar(g, NB_F32, 0);
  int64_t z[2] = {0, 0}, start[2] = {0, 1}, limit[2] = {2, 5}, strides[2] = {1, 2}, lo[2] = {1, 0}, hi[2] = {-1, 2};
  CHECK(nb_slice(x, z, d, NULL) == x);
  CHECK(nb_pad(x, zero, z, z, NULL) == x);
  CHECK(nb_concatenate(1, &x, 0) == x);
  nb_val *parts[2] = {nb_slice(x, start, limit, strides), nb_pad(x, zero, lo, hi, NULL)};
  int64_t widen[2] = {0, 5};
  nb_val *both[2] = {parts[1], nb_pad(parts[0], zero, z, widen, NULL)};
  nb_val *y = nb_concatenate(2, both, 1);
  nb_graph_output(g, "y", y);
  CHECK(nb_val_dim(y, 1) == 14);
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "slice[start=(0,1) limit=(2,5) strides=(1,2)]"), "%s", text);
  CHECK_MSG(text && strstr(text, "pad[lo=(1,0) hi=(-1,2) interior=(0,0)]"), "%s", text);
  CHECK_MSG(text && strstr(text, "concatenate[axis=1]"), "%s", text);
  free(text);
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- goldens */

static void test_goldens(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/core/golden/slicing.json");
  CHECK(j != NULL);
  if (!j) return;
  const cJSON *c;
  int k = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "slice")) {
    slice_args a;
    memset(&a, 0, sizeof a);
    nb_test_golden_ints(c, "start", a.start, NB_MAX_RANK);
    nb_test_golden_ints(c, "limit", a.limit, NB_MAX_RANK);
    nb_test_golden_ints(c, "strides", a.strides, NB_MAX_RANK);
    nb_array *x = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "x")), *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "y"));
    nb_array *got = x ? run(ctx, 1, &x, b_slice, &a) : NULL;
    char what[64];
    snprintf(what, sizeof what, "golden slice %d", k++);
    CHECK_MSG(got && want && nb_test_arrays_close(what, got, want, 0), "%s", what);
    nb_array_release(x), nb_array_release(got), nb_array_release(want);
  }
  k = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "pad")) {
    pad_args a;
    memset(&a, 0, sizeof a);
    a.value = cJSON_GetNumberValue(cJSON_GetObjectItem(c, "value"));
    nb_test_golden_ints(c, "lo", a.lo, NB_MAX_RANK);
    nb_test_golden_ints(c, "hi", a.hi, NB_MAX_RANK);
    nb_test_golden_ints(c, "interior", a.interior, NB_MAX_RANK);
    nb_array *x = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "x")), *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "y"));
    nb_array *got = x ? run(ctx, 1, &x, b_pad, &a) : NULL;
    char what[64];
    snprintf(what, sizeof what, "golden pad %d", k++);
    CHECK_MSG(got && want && nb_test_arrays_close(what, got, want, 0), "%s", what);
    nb_array_release(x), nb_array_release(got), nb_array_release(want);
  }
  k = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "concatenate")) {
    nb_array *xs[16];
    concat_args a = {0, (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "axis"))};
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(c, "xs")) if (a.n < 16) xs[a.n++] = nb_test_golden_array(ctx, e);
    nb_array *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "y"));
    nb_array *got = run(ctx, a.n, xs, b_concat, &a);
    char what[64];
    snprintf(what, sizeof what, "golden concatenate %d", k++);
    CHECK_MSG(got && want && nb_test_arrays_close(what, got, want, 0), "%s", what);
    for (int i = 0; i < a.n; i++) nb_array_release(xs[i]);
    nb_array_release(got), nb_array_release(want);
  }
  cJSON_Delete(j);
}

/* ---------------------------------------------------------------- misuse */

/* Each misuse runs on a fresh graph with x: f32[3,4], i: i32[4]. */
typedef void (*misuse_fn)(nb_graph *g, nb_val *x, nb_val *i);

static void expect_error(nb_ctx *ctx, misuse_fn f, nb_status want, const char *needle) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {3, 4}, d4[1] = {4};
  f(g, nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d)), nb_graph_input(g, "i", nb_aval_make(NB_I32, 1, d4)));
  CHECK_MSG(nb_graph_status(g) == want, "graph status %s, wanted %s", nb_status_name(nb_graph_status(g)), nb_status_name(want));
  CHECK_ERR(ctx, want, needle);
  /* the error sticks: later ops return the poison value */
  int64_t z[2] = {0, 0}, one[2] = {1, 1};
  nb_val *later = nb_slice(nb_graph_input(g, "later", nb_aval_make(NB_F32, 2, d)), z, one, NULL);
  CHECK(nb_graph_output(g, "y", later) != NB_OK);
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(g);
}

static const int64_t Z2[2] = {0, 0}, D34[2] = {3, 4};
static void m_slice_limit(nb_graph *g, nb_val *x, nb_val *i) { nb_slice(x, Z2, ((int64_t[]){3, 5}), NULL); }
static void m_slice_order(nb_graph *g, nb_val *x, nb_val *i) { nb_slice(x, ((int64_t[]){2, 0}), ((int64_t[]){1, 4}), NULL); }
static void m_slice_negative(nb_graph *g, nb_val *x, nb_val *i) { nb_slice(x, ((int64_t[]){-1, 0}), D34, NULL); }
static void m_slice_stride(nb_graph *g, nb_val *x, nb_val *i) { nb_slice(x, Z2, D34, ((int64_t[]){1, 0})); }
static void m_slice_null(nb_graph *g, nb_val *x, nb_val *i) { nb_slice(x, NULL, D34, NULL); }
static void m_pad_vector(nb_graph *g, nb_val *x, nb_val *i) {
  nb_pad(x, nb_full(g, NB_F32, 1, ((int64_t[]){1}), 0), Z2, Z2, NULL);
}
static void m_pad_dtype(nb_graph *g, nb_val *x, nb_val *i) { nb_pad(x, nb_scalar(g, NB_F64, 0), Z2, Z2, NULL); }
static void m_pad_interior(nb_graph *g, nb_val *x, nb_val *i) {
  nb_pad(x, nb_scalar(g, NB_F32, 0), Z2, Z2, ((int64_t[]){0, -1}));
}
static void m_pad_crop(nb_graph *g, nb_val *x, nb_val *i) { nb_pad(x, nb_scalar(g, NB_F32, 0), ((int64_t[]){-2, 0}), ((int64_t[]){-2, 0}), NULL); }
static void m_pad_huge(nb_graph *g, nb_val *x, nb_val *i) { nb_pad(x, nb_scalar(g, NB_F32, 0), ((int64_t[]){INT64_MAX, 0}), Z2, NULL); }
static void m_pad_null(nb_graph *g, nb_val *x, nb_val *i) { nb_pad(x, NULL, Z2, Z2, NULL); }
static void m_concat_axis(nb_graph *g, nb_val *x, nb_val *i) { nb_concatenate(2, ((nb_val *[]){x, x}), 2); }
static void m_concat_dtype(nb_graph *g, nb_val *x, nb_val *i) {
  nb_concatenate(2, ((nb_val *[]){i, nb_convert(i, NB_F32)}), 0);
}
static void m_concat_shape(nb_graph *g, nb_val *x, nb_val *i) {
  nb_concatenate(2, ((nb_val *[]){x, nb_reshape(x, 2, ((int64_t[]){4, 3}))}), 0);
}
static void m_concat_rank(nb_graph *g, nb_val *x, nb_val *i) { nb_concatenate(2, ((nb_val *[]){nb_convert(i, NB_F32), x}), 0); }
static void m_concat_null(nb_graph *g, nb_val *x, nb_val *i) { nb_concatenate(3, ((nb_val *[]){x, NULL, x}), 0); }

static void test_misuse(nb_ctx *ctx) {
  expect_error(ctx, m_slice_limit, NB_ERR_SHAPE, "limit (5) <= dim (4)");
  expect_error(ctx, m_slice_order, NB_ERR_SHAPE, "axis 0");
  expect_error(ctx, m_slice_negative, NB_ERR_SHAPE, "0 <= start (-1)");
  expect_error(ctx, m_slice_stride, NB_ERR_INVALID_ARG, "stride 0 must be positive");
  expect_error(ctx, m_slice_null, NB_ERR_INVALID_ARG, "start or limit is NULL");
  expect_error(ctx, m_pad_vector, NB_ERR_SHAPE, "pad value must be a scalar");
  expect_error(ctx, m_pad_dtype, NB_ERR_DTYPE, "pad value dtype f64 differs");
  expect_error(ctx, m_pad_interior, NB_ERR_INVALID_ARG, "interior padding must be >= 0");
  expect_error(ctx, m_pad_crop, NB_ERR_SHAPE, "crops more than the 3 elements");
  expect_error(ctx, m_pad_huge, NB_ERR_INVALID_ARG, "within +-2^40");
  expect_error(ctx, m_pad_null, NB_ERR_INVALID_ARG, "pad: the pad value is NULL");
  expect_error(ctx, m_concat_axis, NB_ERR_INVALID_ARG, "axis 2 out of range for rank 2");
  expect_error(ctx, m_concat_dtype, NB_ERR_DTYPE, "operand 1 is f32, operand 0 is i32");
  expect_error(ctx, m_concat_shape, NB_ERR_SHAPE, "differs from operand 0 in axis 1");
  expect_error(ctx, m_concat_rank, NB_ERR_SHAPE, "operand 1 has rank 2");
  expect_error(ctx, m_concat_null, NB_ERR_INVALID_ARG, "operand 1 is NULL");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_hand_values(ctx);
  test_pad_grad(ctx);
  test_identities_and_print(ctx);
  test_goldens(ctx);
  test_misuse(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/slicing");
}
