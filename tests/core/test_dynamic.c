/* Values of dynamic_slice and dynamic_update_slice: clamping by hand and
 * against JAX goldens (tests/core/golden/make_dynamic.py) over float, int
 * and bool operands and every integer index dtype; vmap with per-row starts
 * on integer and bool operands (the table rows cover f64); gradients of the
 * update; vmap of grad and grad of vmap with per-row starts; printed params
 * and misuse. */
#include "json_golden.h"
#include "primcheck.h"

/* ---------------------------------------------------------------- running small graphs */

typedef struct dyn_args {
  bool update;                 /* dynamic_update_slice, else dynamic_slice */
  int64_t sizes[NB_MAX_RANK];  /* dynamic_slice */
} dyn_args;

/* inputs: x, (u), s0, s1, ... */
static nb_status f_dyn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const dyn_args *a = user;
  nb_val *x = nb_tree_get_val(in, "x"), *st[NB_MAX_RANK];
  char path[16];
  for (int d = 0; d < nb_val_rank(x); d++) {
    snprintf(path, sizeof path, "s%d", d);
    st[d] = nb_tree_get_val(in, path);
  }
  nb_val *y = a->update ? nb_dynamic_update_slice(x, nb_tree_get_val(in, "u"), st) : nb_dynamic_slice(x, st, a->sizes);
  return nb_tree_set_val(out, "y", y);
}

/* Builds the input tree for f_dyn: starts as scalars of dtype t. */
static nb_tree *dyn_inputs(nb_ctx *ctx, nb_array *x, nb_array *u, int n, const int64_t *starts, nb_dtype t) {
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_set_array(in, "x", x);
  if (u) nb_tree_set_array(in, "u", u);
  char path[16];
  for (int d = 0; d < n; d++) {
    snprintf(path, sizeof path, "s%d", d);
    nb_array *s = nb_array_scalar(ctx, t, (double)starts[d]);
    nb_tree_set_array(in, path, s);
    nb_array_release(s);
  }
  return in;
}

static nb_array *run_dyn(nb_ctx *ctx, const dyn_args *a, nb_array *x, nb_array *u, const int64_t *starts, nb_dtype t) {
  nb_tree *in = dyn_inputs(ctx, x, u, nb_array_rank(x), starts, t);
  nb_array *y = nb_test_eval_output(ctx, f_dyn, (void *)a, in, "y");
  nb_tree_destroy(in);
  return y;
}

/* ---------------------------------------------------------------- hand-computed */

static void test_clamping(nb_ctx *ctx) {
  nb_array *x = nb_array_arange(ctx, NB_F32, 0, 10, 1);
  dyn_args ds = {.update = false, .sizes = {3}};
  nb_test_check_values(ctx, "start 8 clamps to 7", run_dyn(ctx, &ds, x, NULL, (int64_t[]){8}, NB_I32), NB_F32, 1, (int64_t[]){3},
               (double[]){7, 8, 9});
  nb_test_check_values(ctx, "start -5 clamps to 0", run_dyn(ctx, &ds, x, NULL, (int64_t[]){-5}, NB_I8), NB_F32, 1, (int64_t[]){3},
               (double[]){0, 1, 2});
  nb_test_check_values(ctx, "u32 start 4000000000", run_dyn(ctx, &ds, x, NULL, (int64_t[]){4000000000}, NB_U32), NB_F32, 1,
               (int64_t[]){3}, (double[]){7, 8, 9});
  nb_array_release(x);

  nb_array *z = nb_array_zeros(ctx, NB_I32, 1, (int64_t[]){5});
  nb_array *u = nb_array_from_f64(ctx, NB_I32, 1, (int64_t[]){2}, (double[]){1, 2});
  dyn_args dus = {.update = true};
  nb_test_check_values(ctx, "update at 4 clamps to 3", run_dyn(ctx, &dus, z, u, (int64_t[]){4}, NB_I64), NB_I32, 1,
               (int64_t[]){5}, (double[]){0, 0, 0, 1, 2});
  nb_test_check_values(ctx, "update at 1", run_dyn(ctx, &dus, z, u, (int64_t[]){1}, NB_U8), NB_I32, 1, (int64_t[]){5},
               (double[]){0, 1, 2, 0, 0});
  nb_array_release(z);
  nb_array_release(u);
}

/* grad of sum(w * dus(x, u, s)): x gets w outside the window, u the window. */
static nb_status f_dus_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *st[2] = {nb_tree_get_val(in, "i"), nb_tree_get_val(in, "j")};
  nb_val *y = nb_dynamic_update_slice(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "u"), st);
  nb_val *w = nb_iota(g, NB_F64, 2, ((int64_t[]){3, 3}), 1);
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, nb_add(w, nb_full_like(w, 1))), 0, NULL));
}

static void test_update_grad(nb_ctx *ctx) {
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *x = nb_array_zeros(ctx, NB_F64, 2, (int64_t[]){3, 3}), *u = nb_array_ones(ctx, NB_F64, 2, (int64_t[]){2, 2});
  nb_array *i = nb_array_scalar(ctx, NB_I32, 5), *j = nb_array_scalar(ctx, NB_I32, 0);
  nb_tree_set_array(in, "x", x), nb_tree_set_array(in, "u", u), nb_tree_set_array(in, "i", i), nb_tree_set_array(in, "j", j);
  nb_graph *g = nb_trace(ctx, f_dus_loss, NULL, in);
  nb_graph *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  CHECK_OK(ctx, dg ? nb_graph_run(ctx, dg, in, out) : nb_ctx_status(ctx));
  nb_array *gx = nb_tree_get_array(out, "grad/x"), *gu = nb_tree_get_array(out, "grad/u");
  nb_array *wx = nb_array_from_f64(ctx, NB_F64, 2, (int64_t[]){3, 3}, (double[]){1, 2, 3, 0, 0, 3, 0, 0, 3});
  nb_array *wu = nb_array_from_f64(ctx, NB_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 1, 2});
  CHECK(gx && nb_test_arrays_close("grad x (window at clamped (1,0))", gx, wx, 0));
  CHECK(gu && nb_test_arrays_close("grad u", gu, wu, 0));
  nb_array_release(wx), nb_array_release(wu);
  nb_array_release(x), nb_array_release(u), nb_array_release(i), nb_array_release(j);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

/* ---------------------------------------------------------------- vmap on ints and bools */

/* vmap with per-row starts over a non-float operand (the one-hot path
 * converts bools to u8 and back). */
static void test_vmap_dtypes(nb_ctx *ctx) {
  nb_test_rng rng = {99};
  const int64_t n = 4;
  for (int k = 0; k < 2; k++) {
    bool update = k == 1;
    nb_dtype t = update ? NB_BOOL : NB_I32;
    dyn_args a = {.update = update, .sizes = {2, 3}};
    nb_tree *b = nb_tree_create(ctx);
    nb_array *x = update ? nb_test_randn(ctx, &rng, t, 3, (int64_t[]){n, 4, 5})
                         : nb_test_randint(ctx, &rng, t, 3, (int64_t[]){n, 4, 5}, -1000, 1000);
    nb_tree_set_array(b, "x", x);
    nb_array_release(x);
    if (update) {
      nb_array *u = nb_test_randn(ctx, &rng, t, 3, (int64_t[]){n, 2, 3});
      nb_tree_set_array(b, "u", u);
      nb_array_release(u);
    }
    for (int d = 0; d < 2; d++) {
      nb_array *s = nb_test_randint(ctx, &rng, NB_I8, 1, &n, -2, 5);
      nb_tree_set_array(b, d ? "s1" : "s0", s);
      nb_array_release(s);
    }
    CHECK(nb_test_check_vmap(ctx, update ? "vmap dynamic_update_slice of bool" : "vmap dynamic_slice of i32", f_dyn, &a, b,
                             NULL, n));
    nb_tree_destroy(b);
  }
}

/* At rank 7 the batched operand has the maximum rank, so even a one-element
 * window (normally one-hot) is moved by shifts. */
static void test_vmap_max_rank(nb_ctx *ctx) {
  nb_test_rng rng = {7};
  const int64_t n = 2, dims[8] = {n, 3, 1, 2, 1, 1, 1, 4};
  dyn_args a = {.update = false, .sizes = {1, 1, 2, 1, 1, 1, 1}};
  nb_tree *b = nb_tree_create(ctx);
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 8, dims);
  nb_tree_set_array(b, "x", x);
  nb_array_release(x);
  for (int d = 0; d < 7; d++) {
    char path[8];
    snprintf(path, sizeof path, "s%d", d);
    nb_array *st = nb_test_randint(ctx, &rng, NB_I32, 1, &n, -1, 4);
    nb_tree_set_array(b, path, st);
    nb_array_release(st);
  }
  CHECK(nb_test_check_vmap(ctx, "vmap dynamic_slice at the maximum rank", f_dyn, &a, b, NULL, n));
  nb_tree_destroy(b);
}

/* ---------------------------------------------------------------- compositions */

/* loss = sum(sin(dus(x, ds(x, (i,j)) * 2, (j,i)))): both primitives, starts
 * batched per row under vmap. */
static nb_status f_both(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *x = nb_tree_get_val(in, "x"), *i = nb_tree_get_val(in, "i"), *j = nb_tree_get_val(in, "j");
  nb_val *w = nb_dynamic_slice(x, ((nb_val *[]){i, j}), ((int64_t[]){2, 3}));
  nb_val *y = nb_dynamic_update_slice(x, nb_mul(w, nb_full_like(w, 2)), ((nb_val *[]){j, i}));
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_sin(y), 0, NULL));
}

static nb_status f_call(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  return nb_graph_call(g, user, in, out);
}

/* vmap(grad f) against grad f per row, and grad of vmap f against finite
 * differences: the one-hot batching ops must transpose and batch too. */
static void test_compositions(nb_ctx *ctx) {
  nb_test_rng rng = {4242};
  const int64_t n = 3;
  nb_tree *b = nb_tree_create(ctx), *spec = nb_tree_create(ctx);
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 3, (int64_t[]){n, 5, 6});
  nb_array *i = nb_test_randint(ctx, &rng, NB_I32, 1, &n, -1, 5), *j = nb_test_randint(ctx, &rng, NB_I32, 1, &n, 0, 6);
  nb_tree_set_array(b, "x", x), nb_tree_set_array(b, "i", i), nb_tree_set_array(b, "j", j);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 2, (int64_t[]){5, 6})));
  nb_tree_set(spec, "i", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  nb_tree_set(spec, "j", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  nb_graph *g = nb_trace(ctx, f_both, NULL, spec);
  nb_graph *dg = g ? nb_grad(ctx, g, NULL) : NULL;
  CHECK(dg && nb_test_check_vmap(ctx, "vmap(grad(dynamic slices))", f_call, dg, b, NULL, n));
  nb_vmap_opts o = {.in_axis = 0, .out_axis = 0, .axis_size = n};
  nb_graph *vg = g ? nb_vmap(ctx, g, &o) : NULL;
  CHECK(vg && nb_test_check_grads(ctx, "grad(vmap(dynamic slices))", f_call, vg, b, 1e-5, true));
  nb_graph_destroy(vg);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_array_release(x), nb_array_release(i), nb_array_release(j);
  nb_tree_destroy(b);
  nb_tree_destroy(spec);
}

/* ---------------------------------------------------------------- goldens */

static void test_goldens(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load("tests/core/golden/dynamic.json");
  CHECK(j != NULL);
  if (!j) return;
  for (int upd = 0; upd < 2; upd++) {
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, upd ? "dynamic_update_slice" : "dynamic_slice")) {
      dyn_args a;
      memset(&a, 0, sizeof a);
      a.update = upd;
      int64_t starts[NB_MAX_RANK];
      nb_dtype t = NB_I32;
      nb_test_golden_ints(c, "starts", starts, NB_MAX_RANK);
      nb_test_golden_ints(c, "sizes", a.sizes, NB_MAX_RANK);
      CHECK(nb_dtype_from_name(cJSON_GetStringValue(cJSON_GetObjectItem(c, "index_dtype")), &t));
      nb_array *x = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "x"));
      nb_array *u = upd ? nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "u")) : NULL;
      nb_array *want = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "y"));
      nb_array *got = x ? run_dyn(ctx, &a, x, u, starts, t) : NULL;
      char what[64];
      snprintf(what, sizeof what, "golden %s %d", upd ? "dynamic_update_slice" : "dynamic_slice", k++);
      CHECK_MSG(got && want && nb_test_arrays_close(what, got, want, 0), "%s", what);
      nb_array_release(x), nb_array_release(u), nb_array_release(got), nb_array_release(want);
    }
  }
  cJSON_Delete(j);
}

/* ---------------------------------------------------------------- identities, print, misuse */

static void test_identities_and_print(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {3, 4};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d)), *u = nb_graph_input(g, "u", nb_aval_make(NB_F32, 2, d));
  nb_val *i = nb_graph_input(g, "i", nb_aval_make(NB_I32, 0, NULL)), *st[2] = {i, i};
  CHECK(nb_dynamic_slice(x, st, d) == x);            /* the whole array: starts clamp to 0 */
  CHECK(nb_dynamic_update_slice(x, u, st) == u);     /* the update covers everything */
  nb_val *y = nb_dynamic_update_slice(x, nb_dynamic_slice(u, st, ((int64_t[]){2, 1})), st);
  nb_graph_output(g, "y", y);
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "dynamic_slice[sizes=(2,1)]"), "%s", text);
  CHECK_MSG(text && strstr(text, "dynamic_update_slice "), "%s", text);
  free(text);
  nb_graph_destroy(g);
}

typedef void (*misuse_fn)(nb_graph *g, nb_val *x, nb_val *i);

/* Fresh graph: x f32[3,4], i i32 scalar. */
static void expect_error(nb_ctx *ctx, misuse_fn f, nb_status want, const char *needle) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t d[2] = {3, 4};
  f(g, nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, d)), nb_graph_input(g, "i", nb_aval_make(NB_I32, 0, NULL)));
  CHECK_MSG(nb_graph_status(g) == want, "graph status %s, wanted %s", nb_status_name(nb_graph_status(g)), nb_status_name(want));
  CHECK_ERR(ctx, want, needle);
  nb_graph_destroy(g);
}

static const int64_t S21[2] = {2, 1};
static void m_ds_size(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_slice(x, ((nb_val *[]){i, i}), ((int64_t[]){4, 1})); }
static void m_ds_neg(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_slice(x, ((nb_val *[]){i, i}), ((int64_t[]){1, -1})); }
static void m_ds_float(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_slice(x, ((nb_val *[]){i, nb_scalar(g, NB_F32, 1)}), S21);
}
static void m_ds_mixed(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_slice(x, ((nb_val *[]){i, nb_convert(i, NB_I64)}), S21);
}
static void m_ds_vector(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_slice(x, ((nb_val *[]){nb_full(g, NB_I32, 1, ((int64_t[]){1}), 0), i}), S21);
}
static void m_ds_null_start(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_slice(x, ((nb_val *[]){i, NULL}), S21); }
static void m_ds_null_sizes(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_slice(x, ((nb_val *[]){i, i}), NULL); }
static void m_ds_other_graph(nb_graph *g, nb_val *x, nb_val *i) {
  nb_graph *h = nb_graph_create(nb_graph_ctx(g));
  nb_val *j = nb_graph_input(h, "j", nb_aval_make(NB_I32, 0, NULL));
  nb_dynamic_slice(x, ((nb_val *[]){i, j}), S21);
  nb_graph_destroy(h);
}
static void m_dus_big(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_update_slice(x, nb_full(g, NB_F32, 2, ((int64_t[]){1, 5}), 0), ((nb_val *[]){i, i}));
}
static void m_dus_dtype(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_update_slice(x, nb_full(g, NB_F64, 2, S21, 0), ((nb_val *[]){i, i}));
}
static void m_dus_rank(nb_graph *g, nb_val *x, nb_val *i) {
  nb_dynamic_update_slice(x, nb_full(g, NB_F32, 1, ((int64_t[]){2}), 0), ((nb_val *[]){i, i}));
}
static void m_dus_null(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_update_slice(x, NULL, ((nb_val *[]){i, i})); }
static void m_dus_starts(nb_graph *g, nb_val *x, nb_val *i) { nb_dynamic_update_slice(x, x, NULL); }

static void test_misuse(nb_ctx *ctx) {
  expect_error(ctx, m_ds_size, NB_ERR_SHAPE, "axis 0: size 4 must be in [0, 3]");
  expect_error(ctx, m_ds_neg, NB_ERR_SHAPE, "axis 1: size -1");
  expect_error(ctx, m_ds_float, NB_ERR_DTYPE, "start index 1 is f32[]");
  expect_error(ctx, m_ds_mixed, NB_ERR_DTYPE, "integer scalars of one dtype");
  expect_error(ctx, m_ds_vector, NB_ERR_DTYPE, "start index 0 is i32[1]");
  expect_error(ctx, m_ds_null_start, NB_ERR_INVALID_ARG, "start index 1 is NULL");
  expect_error(ctx, m_ds_null_sizes, NB_ERR_INVALID_ARG, "sizes is NULL");
  expect_error(ctx, m_ds_other_graph, NB_ERR_INVALID_ARG, "belongs to another graph");
  expect_error(ctx, m_dus_big, NB_ERR_SHAPE, "axis 1: update extent 5 exceeds the operand's 4");
  expect_error(ctx, m_dus_dtype, NB_ERR_DTYPE, "update dtype f64 differs");
  expect_error(ctx, m_dus_rank, NB_ERR_SHAPE, "update rank 1 differs");
  expect_error(ctx, m_dus_null, NB_ERR_INVALID_ARG, "the update is NULL");
  expect_error(ctx, m_dus_starts, NB_ERR_INVALID_ARG, "start is NULL");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_clamping(ctx);
  test_update_grad(ctx);
  test_vmap_dtypes(ctx);
  test_vmap_max_rank(ctx);
  test_compositions(ctx);
  test_goldens(ctx);
  test_identities_and_print(ctx);
  test_misuse(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/dynamic");
}
