/* gather, scatter_add, take and take_along_axis: values against JAX/NumPy
 * goldens (tests/core/golden/make_gather.py), every dtype, empty shapes,
 * the embedding gradient by hand, vmap with the batch axis off the front,
 * the IR text and cost, and misuse giving named errors. Derivatives and
 * vmap of random cases run in the primitive table (cases_gather.c). */
#include "core/ir.h"
#include "json_golden.h"
#include "primcheck.h"

/* ---------------------------------------------------------------- goldens */

static cJSON *gold; /* tests/core/golden/gather.json, made by make_gather.py */

/* Golden array `name` (a new reference), or NULL after printing why. */
static nb_array *golden(nb_ctx *ctx, const char *name) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(gold, name);
  if (!j) return fprintf(stderr, "golden %s is missing\n", name), NULL;
  return nb_test_golden_array(ctx, j);
}

static bool same(const char *what, const nb_array *got, const nb_array *want, double tol) {
  if (!got || !want) return fprintf(stderr, "%s: missing array\n", what), false;
  return nb_test_arrays_close(what, got, want, tol);
}

typedef struct gather_call {
  nb_gather_dims dn;
  int64_t ss[NB_MAX_RANK];
} gather_call;

static nb_status f_gather(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const gather_call *c = u;
  return nb_tree_set_val(out, "y", nb_gather(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "i"), &c->dn, c->ss));
}

static nb_status f_scatter(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_scatter_add(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "i"),
                                                  nb_tree_get_val(in, "u"), (const nb_scatter_dims *)u));
}

static nb_status f_take(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_take(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "i")));
}

static nb_status f_along(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "y", nb_take_along_axis(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "i"), (int)(intptr_t)u));
}

/* Runs fn on the golden arrays <prefix>_<x|i|u> (named by `names`, NULL to
 * skip) and compares "y" with <prefix>_result. */
static void check_golden(nb_ctx *ctx, const char *prefix, const char *const names[3], nb_trace_fn fn, void *user) {
  static const char *const paths[3] = {"x", "i", "u"};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  char key[128];
  for (int k = 0; k < 3; k++) {
    if (!names[k]) continue;
    snprintf(key, sizeof key, "%s_%s", prefix, names[k]);
    nb_array *a = golden(ctx, key);
    CHECK_MSG(a, "%s", key);
    if (a) nb_tree_set_array(in, paths[k], a);
    nb_array_release(a);
  }
  snprintf(key, sizeof key, "%s_result", prefix);
  nb_array *want = golden(ctx, key);
  CHECK_OK(ctx, nb_test_eval(ctx, fn, user, in, out));
  CHECK_MSG(same(key, nb_tree_get_array(out, "y"), want, 1e-14), "%s", key);
  nb_array_release(want);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

static const nb_scatter_dims s_rows = {.n_update_window = 1, .n_inserted_window = 1, .n_scatter_to_operand = 1,
                                       .update_window_dims = {1}, .inserted_window_dims = {0},
                                       .scatter_dims_to_operand_dims = {0}, .index_vector_dim = 1};

static void test_goldens(nb_ctx *ctx) {
  static const char *const xi[3] = {"operand", "indices", NULL}, *const xiu[3] = {"operand", "indices", "updates"};
  gather_call g1 = {{.n_offset = 2, .n_collapsed = 1, .n_start_index_map = 2, .n_operand_batching = 1,
                     .offset_dims = {3, 4}, .collapsed_slice_dims = {1}, .start_index_map = {2, 1},
                     .operand_batching_dims = {0}, .start_indices_batching_dims = {1}, .index_vector_dim = 3},
                    {1, 1, 2, 2}};
  check_golden(ctx, "g1", xi, f_gather, &g1);
  gather_call g2 = {{.n_offset = 2, .n_start_index_map = 2, .offset_dims = {1, 2}, .start_index_map = {0, 1},
                     .index_vector_dim = 1},
                    {2, 3}};
  check_golden(ctx, "g2", xi, f_gather, &g2);
  gather_call g3 = {{.n_offset = 2, .n_collapsed = 1, .n_start_index_map = 2, .offset_dims = {1, 2},
                     .collapsed_slice_dims = {0}, .start_index_map = {0, 1}, .index_vector_dim = 0},
                    {1, 2, 3}};
  check_golden(ctx, "g3", xi, f_gather, &g3);
  nb_scatter_dims s1 = {.n_update_window = 2, .n_inserted_window = 1, .n_scatter_to_operand = 2,
                        .n_operand_batching = 1, .update_window_dims = {3, 4}, .inserted_window_dims = {1},
                        .scatter_dims_to_operand_dims = {2, 1}, .operand_batching_dims = {0},
                        .scatter_indices_batching_dims = {1}, .index_vector_dim = 3};
  check_golden(ctx, "s1", xiu, f_scatter, &s1);
  nb_scatter_dims s2 = {.n_update_window = 2, .n_scatter_to_operand = 2, .update_window_dims = {1, 2},
                        .scatter_dims_to_operand_dims = {0, 1}, .index_vector_dim = 1};
  check_golden(ctx, "s2", xiu, f_scatter, &s2);
  check_golden(ctx, "s3", xiu, f_scatter, (void *)&s_rows);
  static const char *const t1[3] = {"table", "ids", NULL}, *const t2[3] = {"x", "idx", NULL};
  check_golden(ctx, "t1", t1, f_take, NULL);
  check_golden(ctx, "t2", t2, f_along, (void *)(intptr_t)2);
  check_golden(ctx, "t2", t2, f_along, (void *)(intptr_t)-1);
}

/* ---------------------------------------------------------------- by hand */

static nb_tree *inputs(nb_ctx *ctx, nb_array *x, nb_array *i, nb_array *u) {
  nb_tree *t = nb_tree_create(ctx);
  if (x) nb_tree_set_array(t, "x", x);
  if (i) nb_tree_set_array(t, "i", i);
  if (u) nb_tree_set_array(t, "u", u);
  nb_array_release(x);
  nb_array_release(i);
  nb_array_release(u);
  return t;
}

/* y = fn(in) as a new reference, or NULL. */
static nb_array *run_y(nb_ctx *ctx, nb_trace_fn fn, void *user, nb_tree *in) {
  nb_tree *out = nb_tree_create(ctx);
  nb_status st = nb_test_eval(ctx, fn, user, in, out);
  CHECK_MSG(st == NB_OK, "%s", nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  nb_array *y = nb_tree_get_array(out, "y");
  if (y) nb_array_retain(y);
  nb_tree_destroy(out);
  return y;
}

/* take and scatter_add agree with an f64 reference in every dtype. */
static void test_dtypes(nb_ctx *ctx) {
  static const nb_dtype types[] = {NB_F32, NB_F64, NB_BF16, NB_F16, NB_I8, NB_U8, NB_I32, NB_I64, NB_U32, NB_BOOL};
  static const nb_dtype id_types[] = {NB_I8, NB_U8, NB_I32, NB_I64, NB_U32};
  double tv[8] = {1, 0, 3, 4, 0, 6, 7, 1}, iv[3] = {3, 0, 3};
  int64_t dt[2] = {4, 2}, di[1] = {3};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    nb_dtype t = types[k], it = id_types[k % 5];
    nb_tree *in = inputs(ctx, nb_array_from_f64(ctx, t, 2, dt, tv), nb_array_from_f64(ctx, it, 1, di, iv), NULL);
    nb_array *y = run_y(ctx, f_take, NULL, in);
    double want[6] = {7, 1, 1, 0, 7, 1};
    for (int j = 0; y && j < 6; j++) CHECK_MSG(nb_array_get(y, j) == (t == NB_BOOL ? want[j] != 0 : want[j]), "%s", nb_dtype_name(t));
    CHECK(y && nb_array_dtype(y) == t);
    nb_array_release(y);
    nb_tree_destroy(in);
    if (t == NB_BOOL) continue;
    /* rows 3, 0, 3 of x get u added: row 3 twice */
    double uv[6] = {1, 2, 3, 4, 5, 6};
    int64_t du[2] = {3, 2};
    in = inputs(ctx, nb_array_from_f64(ctx, t, 2, dt, tv), nb_array_from_f64(ctx, it, 1, di, iv),
                nb_array_from_f64(ctx, t, 2, du, uv));
    y = run_y(ctx, f_scatter, (void *)&s_rows, in);
    double sw[8] = {4, 4, 3, 4, 0, 6, 13, 9};
    for (int j = 0; y && j < 8; j++) CHECK_MSG(nb_array_get(y, j) == sw[j], "scatter_add %s element %d", nb_dtype_name(t), j);
    nb_array_release(y);
    nb_tree_destroy(in);
  }
  /* integer scatter-add wraps around */
  int64_t d1[1] = {1};
  double big[1] = {120}, z[1] = {0}, add[1] = {10};
  nb_tree *in = inputs(ctx, nb_array_from_f64(ctx, NB_I8, 1, d1, big), nb_array_from_f64(ctx, NB_I32, 1, d1, z),
                       nb_array_from_f64(ctx, NB_I8, 1, d1, add));
  nb_scatter_dims s_elem = {.n_inserted_window = 1, .n_scatter_to_operand = 1, .inserted_window_dims = {0},
                            .scatter_dims_to_operand_dims = {0}, .index_vector_dim = 1};
  nb_array *y = run_y(ctx, f_scatter, &s_elem, in);
  CHECK(y && nb_array_get(y, 0) == -126);
  nb_array_release(y);
  nb_tree_destroy(in);
}

/* Ids beyond any dtype's reach of the table: i64 extremes clamp; a narrow
 * signed id wraps through a wider type when the table is longer. */
static void test_extreme_ids(nb_ctx *ctx) {
  int64_t dt[1] = {300}, di[3] = {3};
  double tv[300];
  for (int i = 0; i < 300; i++) tv[i] = i;
  int64_t ids[3] = {INT64_MIN, INT64_MAX, -1};
  nb_tree *in = inputs(ctx, nb_array_from_f64(ctx, NB_F64, 1, dt, tv), nb_array_create(ctx, NB_I64, 1, di, ids), NULL);
  nb_array *y = run_y(ctx, f_take, NULL, in);
  /* INT64_MIN + 300 is still negative: clamped to 0 */
  CHECK(y && nb_array_get(y, 0) == 0 && nb_array_get(y, 1) == 299 && nb_array_get(y, 2) == 299);
  nb_array_release(y);
  nb_tree_destroy(in);
  int8_t small[3] = {-1, -128, 127};
  in = inputs(ctx, nb_array_from_f64(ctx, NB_F64, 1, dt, tv), nb_array_create(ctx, NB_I8, 1, di, small), NULL);
  y = run_y(ctx, f_take, NULL, in);
  CHECK(y && nb_array_get(y, 0) == 299 && nb_array_get(y, 1) == 172 && nb_array_get(y, 2) == 127);
  nb_array_release(y);
  nb_tree_destroy(in);
}

static void test_empty(nb_ctx *ctx) {
  int64_t dt[2] = {4, 3}, d0[1] = {0}, dt0[2] = {4, 0}, du0[2] = {0, 3};
  /* no ids: an empty result */
  nb_tree *in = inputs(ctx, nb_array_zeros(ctx, NB_F64, 2, dt), nb_array_zeros(ctx, NB_I32, 1, d0), NULL);
  nb_array *y = run_y(ctx, f_take, NULL, in);
  CHECK(y && nb_array_rank(y) == 2 && nb_array_dims(y)[0] == 0 && nb_array_dims(y)[1] == 3);
  nb_array_release(y);
  nb_tree_destroy(in);
  /* rows of width 0 */
  int64_t di[1] = {2};
  in = inputs(ctx, nb_array_zeros(ctx, NB_F64, 2, dt0), nb_array_zeros(ctx, NB_I32, 1, di), NULL);
  y = run_y(ctx, f_take, NULL, in);
  CHECK(y && nb_array_dims(y)[0] == 2 && nb_array_dims(y)[1] == 0);
  nb_array_release(y);
  nb_tree_destroy(in);
  /* no updates: the operand unchanged */
  in = inputs(ctx, nb_array_full(ctx, NB_F64, 2, dt, 2.5), nb_array_zeros(ctx, NB_I32, 1, d0), nb_array_zeros(ctx, NB_F64, 2, du0));
  y = run_y(ctx, f_scatter, (void *)&s_rows, in);
  CHECK(y && nb_array_size(y) == 12 && nb_array_get(y, 11) == 2.5);
  nb_array_release(y);
  /* and its gradient: ones for the operand, an empty one for the updates */
  nb_graph *g = nb_trace(ctx, f_scatter, (void *)&s_rows, in);
  nb_graph *vg = g ? nb_vjp(ctx, g) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  nb_tree *vin = nb_tree_create(ctx), *vout = nb_tree_create(ctx);
  nb_tree_merge(vin, "primal", in);
  nb_tree_set_array(vin, "ct/y", nb_tree_get_array(in, "x"));
  CHECK_OK(ctx, vg ? nb_graph_run(ctx, vg, vin, vout) : NB_ERR_INTERNAL);
  nb_array *gx = nb_tree_get_array(vout, "grad/x"), *gu = nb_tree_get_array(vout, "grad/u");
  CHECK(gx && nb_array_get(gx, 5) == 2.5 && gu && nb_array_size(gu) == 0);
  nb_tree_destroy(vin);
  nb_tree_destroy(vout);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* d/dtable sum(w * take(table, ids)) puts w's rows back, summed over repeats. */
static nb_status f_embed_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *y = nb_take(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "i"));
  return nb_tree_set_val(out, "loss", nb_reduce_sum(nb_mul(y, nb_tree_get_val(in, "u")), 0, NULL));
}

static void test_embedding_grad(nb_ctx *ctx) {
  int64_t dt[2] = {4, 2}, di[2] = {2, 2}, dw[3] = {2, 2, 2};
  double ids[4] = {1, -1, 1, 9}, w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  nb_tree *in = inputs(ctx, nb_array_zeros(ctx, NB_F64, 2, dt), nb_array_from_f64(ctx, NB_I32, 2, di, ids),
                       nb_array_from_f64(ctx, NB_F64, 3, dw, w));
  nb_graph *g = nb_trace(ctx, f_embed_loss, NULL, in);
  nb_graph *dg = g ? nb_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
  nb_tree *out = nb_tree_create(ctx);
  CHECK_OK(ctx, dg ? nb_graph_run(ctx, dg, in, out) : NB_ERR_INTERNAL);
  /* id 1 twice (w rows 0 and 2), id -1 -> row 3, id 9 clamps to row 3 */
  double want[8] = {0, 0, 1 + 5, 2 + 6, 0, 0, 3 + 7, 4 + 8};
  nb_array *gr = nb_tree_get_array(out, "grad/x");
  for (int j = 0; gr && j < 8; j++) CHECK_NEAR(nb_array_get(gr, j), want[j], 0);
  CHECK(gr != NULL);
  /* reverse mode turned the gather into a scatter_add */
  char *text = dg ? nb_graph_to_string(dg) : NULL;
  CHECK(text && strstr(text, "scatter_add"));
  free(text);
  nb_tree_destroy(out);
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

static nb_status f_call(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_graph_call(g, (const nb_graph *)u, in, out);
}

/* Per-example embedding gradients: vmap of the gradient over ids and weights
 * (the table shared) against a loop; batches the transposed scatter_add. */
static void test_per_example_grads(nb_ctx *ctx) {
  nb_test_rng rng = {5};
  int64_t dt[2] = {4, 2}, di[3] = {3, 2, 2}, dw[4] = {3, 2, 2, 2};
  nb_tree *spec = nb_tree_create(ctx), *b = nb_tree_create(ctx), *u = inputs(ctx, nb_test_randn(ctx, &rng, NB_F64, 2, dt), NULL, NULL);
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F64, 2, dt)));
  nb_tree_set(spec, "i", nb_leaf_aval(nb_aval_make(NB_I32, 2, di + 1)));
  nb_tree_set(spec, "u", nb_leaf_aval(nb_aval_make(NB_F64, 3, dw + 1)));
  nb_array *ids = nb_test_randint(ctx, &rng, NB_I32, 3, di, -5, 5), *w = nb_test_randn(ctx, &rng, NB_F64, 4, dw);
  nb_tree_set_array(b, "i", ids);
  nb_tree_set_array(b, "u", w);
  nb_array_release(ids);
  nb_array_release(w);
  nb_graph *g = nb_trace(ctx, f_embed_loss, NULL, spec);
  nb_graph *dg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "x"}) : NULL;
  CHECK_MSG(dg && nb_test_check_vmap(ctx, "per-example embedding grads", f_call, dg, b, u, 3), "%s", nb_ctx_error(ctx));
  nb_graph_destroy(dg);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_tree_destroy(b);
  nb_tree_destroy(u);
}

/* ---------------------------------------------------------------- vmap off the front */

/* a with its axis 0 moved to `axis` (a host copy). */
static nb_array *move_front_to(nb_ctx *ctx, nb_array *a, int axis) {
  int r = nb_array_rank(a), perm[NB_MAX_RANK];
  int64_t dims[NB_MAX_RANK], istr[NB_MAX_RANK], ostr[NB_MAX_RANK];
  for (int i = 0, k = 1; i < r; i++) perm[i] = i == axis ? 0 : k++; /* out dim i <- in dim perm[i] */
  for (int i = 0; i < r; i++) dims[i] = nb_array_dims(a)[perm[i]];
  nb_shape is = nb_shape_make(r, nb_array_dims(a)), os = nb_shape_make(r, dims);
  nb__strides(&is, istr);
  nb__strides(&os, ostr);
  nb_array *b = nb_array_empty(ctx, nb_array_dtype(a), r, dims);
  size_t es = nb_dtype_size(nb_array_dtype(a));
  for (int64_t o = 0; o < nb_array_size(a); o++) {
    int64_t src = 0;
    for (int i = 0; i < r; i++) src += ((o / ostr[i]) % dims[i]) * istr[perm[i]];
    memcpy((char *)nb_array_data_mut(b) + o * (int64_t)es, (const char *)nb_array_data(a) + src * (int64_t)es, es);
  }
  return b;
}

/* vmap over batch axis `axis` of the listed inputs (the others unbatched)
 * gives what vmap over axis 0 gives (which the table checks against a loop). */
static void check_vmap_axis(nb_ctx *ctx, const char *name, nb_trace_fn fn, void *user, nb_tree *front,
                            nb_tree *unbatched, int axis) {
  nb_tree *spec = nb_tree_create(ctx), *moved = nb_tree_create(ctx), *axes0 = nb_tree_create(ctx),
          *axesk = nb_tree_create(ctx), *all0 = nb_tree_copy(front);
  nb_array *m1 = nb_array_scalar(ctx, NB_I32, -1), *k = nb_array_scalar(ctx, NB_I32, axis);
  for (size_t i = 0; i < nb_tree_size(front); i++) {
    nb_array *a = nb_tree_leaf(front, i)->array, *b = move_front_to(ctx, a, axis);
    nb_tree_set(spec, nb_tree_path(front, i), nb_leaf_aval(nb_aval_make(nb_array_dtype(a), nb_array_rank(a) - 1, nb_array_dims(a) + 1)));
    nb_tree_set_array(moved, nb_tree_path(front, i), b);
    nb_tree_set_array(axesk, nb_tree_path(front, i), k);
    nb_array_release(b);
  }
  for (size_t i = 0; i < nb_tree_size(unbatched); i++) {
    const char *p = nb_tree_path(unbatched, i);
    nb_tree_set(spec, p, *nb_tree_leaf(unbatched, i));
    nb_tree_set(moved, p, *nb_tree_leaf(unbatched, i));
    nb_tree_set(all0, p, *nb_tree_leaf(unbatched, i));
    nb_tree_set_array(axes0, p, m1);
    nb_tree_set_array(axesk, p, m1);
  }
  int64_t n = nb_array_dims(nb_tree_leaf(front, 0)->array)[0];
  nb_graph *g = nb_trace(ctx, fn, user, spec);
  nb_graph *v0 = g ? nb_vmap(ctx, g, &(nb_vmap_opts){.in_axes = axes0, .axis_size = n}) : NULL;
  nb_graph *vk = g ? nb_vmap(ctx, g, &(nb_vmap_opts){.in_axes = axesk, .axis_size = n}) : NULL;
  nb_tree *o0 = nb_tree_create(ctx), *ok = nb_tree_create(ctx);
  CHECK_MSG(v0 && vk && !nb_graph_run(ctx, v0, all0, o0) && !nb_graph_run(ctx, vk, moved, ok), "%s: %s", name,
            nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  for (size_t i = 0; i < nb_tree_size(o0); i++)
    CHECK_MSG(same(name, nb_tree_get_array(ok, nb_tree_path(o0, i)), nb_tree_leaf(o0, i)->array, 0), "%s axis %d", name, axis);
  CHECK(nb_tree_size(o0) > 0);
  nb_tree_destroy(o0);
  nb_tree_destroy(ok);
  nb_graph_destroy(vk);
  nb_graph_destroy(v0);
  nb_graph_destroy(g);
  nb_array_release(m1);
  nb_array_release(k);
  nb_tree_destroy(spec);
  nb_tree_destroy(moved);
  nb_tree_destroy(axes0);
  nb_tree_destroy(axesk);
  nb_tree_destroy(all0);
}

/* The gather/scatter of the batching-dims goldens, batched at axes 1..rank
 * with every subset of inputs batched. */
static void test_vmap_axes(nb_ctx *ctx) {
  nb_test_rng rng = {77};
  int64_t dx[5] = {3, 2, 3, 4, 2}, di[5] = {3, 2, 2, 3, 2}, du[6] = {3, 2, 2, 3, 2, 2};
  nb_array *x = nb_test_randn(ctx, &rng, NB_F64, 5, dx), *i = nb_test_randint(ctx, &rng, NB_I32, 5, di, -1, 4);
  nb_array *u = nb_test_randn(ctx, &rng, NB_F64, 6, du);
  nb_array *x1 = golden(ctx, "g1_operand"), *i1 = golden(ctx, "g1_indices");
  nb_array *u1 = golden(ctx, "s1_updates");
  nb_array *xf = nb_array_astype(ctx, x1, NB_F64), *uf = nb_array_astype(ctx, u1, NB_F64);
  gather_call g1 = {{.n_offset = 2, .n_collapsed = 1, .n_start_index_map = 2, .n_operand_batching = 1,
                     .offset_dims = {3, 4}, .collapsed_slice_dims = {1}, .start_index_map = {2, 1},
                     .operand_batching_dims = {0}, .start_indices_batching_dims = {1}, .index_vector_dim = 3},
                    {1, 1, 2, 2}};
  nb_scatter_dims s1 = {.n_update_window = 2, .n_inserted_window = 1, .n_scatter_to_operand = 2,
                        .n_operand_batching = 1, .update_window_dims = {3, 4}, .inserted_window_dims = {1},
                        .scatter_dims_to_operand_dims = {2, 1}, .operand_batching_dims = {0},
                        .scatter_indices_batching_dims = {1}, .index_vector_dim = 3};
  nb_array *bx[3] = {x, i, u}, *ux[3] = {xf, i1, uf};
  static const char *const paths[3] = {"x", "i", "u"};
  for (int mask = 1; mask < 8; mask++) {
    for (int axis = 1; axis <= 4; axis++) {
      for (int op = 0; op < 2; op++) {
        int nin = op == 0 ? 2 : 3;
        if (op == 0 && (mask & 4)) continue;
        nb_tree *front = nb_tree_create(ctx), *unb = nb_tree_create(ctx);
        for (int k = 0; k < nin; k++) nb_tree_set_array((mask >> k) & 1 ? front : unb, paths[k], (mask >> k) & 1 ? bx[k] : ux[k]);
        char name[96];
        snprintf(name, sizeof name, "%s, inputs mask %d, axis %d", op ? "scatter_add" : "gather", mask, axis);
        check_vmap_axis(ctx, name, op ? f_scatter : f_gather, op ? (void *)&s1 : (void *)&g1, front, unb, axis);
        nb_tree_destroy(front);
        nb_tree_destroy(unb);
      }
    }
  }
  nb_array_release(x);
  nb_array_release(i);
  nb_array_release(u);
  nb_array_release(x1);
  nb_array_release(i1);
  nb_array_release(u1);
  nb_array_release(xf);
  nb_array_release(uf);
}

/* ---------------------------------------------------------------- IR text and cost */

static void test_text_and_cost(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  int64_t dx[2] = {5, 6}, di[2] = {4, 2}, du[3] = {4, 2, 3};
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, dx)), *i = nb_graph_input(g, "i", nb_aval_make(NB_I32, 2, di));
  nb_val *u = nb_graph_input(g, "u", nb_aval_make(NB_F32, 3, du));
  nb_gather_dims dn = {.n_offset = 2, .n_start_index_map = 2, .offset_dims = {1, 2}, .start_index_map = {0, 1},
                       .index_vector_dim = 1};
  int64_t ss[2] = {2, 3};
  nb_scatter_dims sd = {.n_update_window = 2, .n_scatter_to_operand = 2, .update_window_dims = {1, 2},
                        .scatter_dims_to_operand_dims = {0, 1}, .index_vector_dim = 1};
  nb_graph_output(g, "y", nb_gather(x, i, &dn, ss));
  nb_graph_output(g, "z", nb_scatter_add(x, i, u, &sd));
  char *text = nb_graph_to_string(g);
  CHECK_MSG(text && strstr(text, "offset_dims=(1,2) collapsed=() start_index_map=(0,1) operand_batching=() "
                                 "indices_batching=() index_vector_dim=1 slice_sizes=(2,3)"), "%s", text);
  CHECK_MSG(text && strstr(text, "update_window_dims=(1,2) inserted=() to_operand=(0,1)"), "%s", text);
  free(text);
  double flops, bytes;
  nb_graph_cost(g, &flops, &bytes);
  /* gather: 24 elements read and written + 8 indices; scatter: 30*2 + 24*2 elements + 8 indices; 24 adds */
  CHECK_NEAR(flops, 24, 0);
  CHECK_NEAR(bytes, (48 + 8 + 60 + 48 + 8) * 4.0, 0);
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- misuse */

typedef struct fixture {
  nb_graph *g;
  nb_val *x, *i, *u, *f, *s, *b;
} fixture;

static fixture fix(nb_ctx *ctx) {
  fixture t;
  t.g = nb_graph_create(ctx);
  int64_t dx[2] = {5, 6}, di[2] = {4, 2}, du[3] = {4, 2, 3}, df[1] = {4};
  t.x = nb_graph_input(t.g, "x", nb_aval_make(NB_F64, 2, dx));
  t.i = nb_graph_input(t.g, "i", nb_aval_make(NB_I32, 2, di));
  t.u = nb_graph_input(t.g, "u", nb_aval_make(NB_F64, 3, du));
  t.f = nb_graph_input(t.g, "f", nb_aval_make(NB_F64, 1, df));
  t.s = nb_graph_input(t.g, "s", nb_aval_make(NB_F64, 0, NULL));
  t.b = nb_graph_input(t.g, "b", nb_aval_make(NB_BOOL, 2, dx));
  return t;
}

/* The error stuck in the graph and the context, and later ops are no-ops. */
static void expect(nb_ctx *ctx, fixture *t, nb_val *v, nb_status st, const char *needle, int line) {
  CHECK_MSG(v && nb__is_poison(v), "line %d: no poison", line);
  CHECK_MSG(nb_graph_status(t->g) == st, "line %d: graph status %s", line, nb_status_name(nb_graph_status(t->g)));
  CHECK_MSG(strstr(nb_ctx_error(ctx), needle), "line %d: '%s' lacks '%s'", line, nb_ctx_error(ctx), needle);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "test_gather.c:"), "line %d: no caller location in '%s'", line, nb_ctx_error(ctx));
  CHECK(nb__is_poison(nb_take(t->x, t->i)));
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(t->g);
}
#define EXPECT(expr, st, needle)             \
  do {                                       \
    fixture t = fix(ctx);                    \
    expect(ctx, &t, (expr), st, needle, __LINE__); \
  } while (0)

static const nb_gather_dims gwin = {.n_offset = 2, .n_start_index_map = 2, .offset_dims = {1, 2},
                                    .start_index_map = {0, 1}, .index_vector_dim = 1};
static const nb_scatter_dims swin = {.n_update_window = 2, .n_scatter_to_operand = 2, .update_window_dims = {1, 2},
                                     .scatter_dims_to_operand_dims = {0, 1}, .index_vector_dim = 1};
static const int64_t ss23[2] = {2, 3};

static nb_gather_dims gmod(int which) {
  nb_gather_dims d = gwin;
  switch (which) {
  case 0: d.index_vector_dim = 3; break;
  case 1: d.n_start_index_map = 1; break;
  case 2: d.offset_dims[0] = 2, d.offset_dims[1] = 1; break;
  case 3: d.n_offset = 1; break;
  case 4: d.start_index_map[1] = 0; break;
  case 5: d.n_offset = 9; break;
  case 6: d.offset_dims[1] = 3; break;
  default: break;
  }
  return d;
}

static void test_misuse(nb_ctx *ctx) {
  nb_gather_dims d;
  EXPECT(nb_gather(t.x, NULL, &gwin, ss23), NB_ERR_INVALID_ARG, "gather: NULL");
  EXPECT(nb_gather(t.x, t.i, NULL, ss23), NB_ERR_INVALID_ARG, "gather: NULL");
  EXPECT(nb_gather(t.x, t.i, &gwin, NULL), NB_ERR_INVALID_ARG, "slice_sizes is NULL");
  EXPECT(nb_gather(t.x, t.f, &gwin, ss23), NB_ERR_DTYPE, "indices must have an integer dtype, not f64");
  EXPECT((d = gmod(0), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_INVALID_ARG, "index_vector_dim 3 is outside [0, 2]");
  EXPECT((d = gmod(1), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_SHAPE, "start_index_map has 1 entries but the index vector has 2");
  EXPECT((d = gmod(2), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_INVALID_ARG, "offset_dims must be increasing");
  EXPECT((d = gmod(3), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_SHAPE, "operand rank 2 is not 1 offset_dims");
  EXPECT((d = gmod(4), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_INVALID_ARG, "start_index_map must be distinct");
  EXPECT((d = gmod(5), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_INVALID_ARG, "counts must be in [0, 8]");
  EXPECT((d = gmod(6), nb_gather(t.x, t.i, &d, ss23)), NB_ERR_INVALID_ARG, "offset_dims must be increasing and in [0, 3)");
  EXPECT(nb_gather(t.x, t.i, &gwin, ((int64_t[]){6, 3})), NB_ERR_SHAPE, "slice_sizes[0] = 6 is outside [0, 5]");
  EXPECT(nb_gather(t.x, t.i, &gwin, ((int64_t[]){-1, 3})), NB_ERR_SHAPE, "slice_sizes[0] = -1");
  nb_gather_dims coll = {.n_offset = 1, .n_collapsed = 1, .n_start_index_map = 2, .offset_dims = {1},
                         .collapsed_slice_dims = {0}, .start_index_map = {0, 1}, .index_vector_dim = 1};
  EXPECT(nb_gather(t.x, t.i, &coll, ss23), NB_ERR_SHAPE, "slice_sizes[0] = 2 for a collapsed or batching dim");
  EXPECT(nb_gather(t.x, t.i, &coll, ((int64_t[]){0, 3})), NB_ERR_SHAPE, "slice_sizes[0] = 0 for a collapsed");
  nb_gather_dims bat = {.n_offset = 1, .n_start_index_map = 1, .n_operand_batching = 1, .offset_dims = {1},
                        .start_index_map = {1}, .operand_batching_dims = {0}, .start_indices_batching_dims = {0},
                        .index_vector_dim = 1};
  EXPECT(nb_gather(t.x, t.f, &bat, ((int64_t[]){1, 2})), NB_ERR_DTYPE, "integer dtype");
  EXPECT((bat.start_index_map[0] = 1, bat.n_start_index_map = 2, nb_gather(t.x, t.i, &bat, ((int64_t[]){1, 2}))),
         NB_ERR_SHAPE, "batching dims differ: operand dim 0 is 5, indices dim 0 is 4");
  nb_gather_dims bat2 = {.n_offset = 1, .n_start_index_map = 2, .n_operand_batching = 1, .offset_dims = {1},
                         .start_index_map = {0, 1}, .operand_batching_dims = {0}, .start_indices_batching_dims = {0},
                         .index_vector_dim = 1};
  EXPECT(nb_gather(nb_reshape(t.u, 2, ((int64_t[]){4, 6})), t.i, &bat2, ((int64_t[]){1, 2})), NB_ERR_INVALID_ARG,
         "operand dim 0 is in both start_index_map and operand_batching_dims");
  bat2.start_indices_batching_dims[0] = 1;
  EXPECT(nb_gather(nb_reshape(t.u, 2, ((int64_t[]){4, 6})), t.i, &bat2, ((int64_t[]){1, 2})), NB_ERR_INVALID_ARG,
         "index_vector_dim 1 is also in start_indices_batching_dims");
  /* scatter_add */
  EXPECT(nb_scatter_add(t.x, t.i, NULL, &swin), NB_ERR_INVALID_ARG, "scatter_add: NULL");
  EXPECT(nb_scatter_add(t.x, t.i, t.u, NULL), NB_ERR_INVALID_ARG, "scatter_add: NULL");
  EXPECT(nb_scatter_add(t.x, t.i, nb_convert(t.u, NB_F32), &swin), NB_ERR_DTYPE, "updates dtype f32 differs from the operand's f64");
  EXPECT(nb_scatter_add(t.b, t.i, nb_convert(t.u, NB_BOOL), &swin), NB_ERR_DTYPE, "cannot scatter-add bool");
  EXPECT(nb_scatter_add(t.x, t.i, nb_reshape(t.u, 2, ((int64_t[]){4, 6})), &swin), NB_ERR_SHAPE, "updates have rank 2");
  EXPECT(nb_scatter_add(t.x, t.i, nb_reshape(t.u, 3, ((int64_t[]){2, 4, 3})), &swin), NB_ERR_SHAPE,
         "updates shape [2,4,3] does not match [4,4,3]");
  EXPECT(nb_scatter_add(t.x, t.i, nb_broadcast_to(t.s, 3, ((int64_t[]){4, 6, 3})), &swin), NB_ERR_SHAPE,
         "update window of 6 exceeds operand dim 0 (5)");
  EXPECT(nb_scatter_add(t.x, t.f, t.u, &swin), NB_ERR_DTYPE, "integer dtype");
  nb_scatter_dims sbad = swin;
  sbad.scatter_dims_to_operand_dims[1] = 2;
  EXPECT(nb_scatter_add(t.x, t.i, t.u, &sbad), NB_ERR_INVALID_ARG, "scatter_dims_to_operand_dims must be distinct and in [0, 2)");
  sbad = swin;
  sbad.n_operand_batching = -1;
  EXPECT(nb_scatter_add(t.x, t.i, t.u, &sbad), NB_ERR_INVALID_ARG, "counts must be in [0, 8]");
  /* take / take_along_axis */
  EXPECT(nb_take(t.s, t.i), NB_ERR_SHAPE, "take: the table must have rank >= 1");
  EXPECT(nb_take(t.x, t.f), NB_ERR_DTYPE, "take: indices must have an integer dtype, not f64");
  EXPECT(nb_take(NULL, t.i), NB_ERR_INVALID_ARG, "take: NULL");
  EXPECT(nb_take(t.u, nb_reshape(nb_convert(t.u, NB_I32), 7, ((int64_t[]){1, 2, 2, 3, 2, 1, 1}))), NB_ERR_SHAPE,
         "take: result rank 9 exceeds 8");
  EXPECT(nb_take_along_axis(t.x, t.i, 2), NB_ERR_INVALID_ARG, "take_along_axis: axis 2 out of range for rank 2");
  EXPECT(nb_take_along_axis(t.x, t.f, 0), NB_ERR_DTYPE, "take_along_axis: indices must have an integer dtype");
  EXPECT(nb_take_along_axis(t.x, nb_convert(t.u, NB_I32), 0), NB_ERR_SHAPE, "indices have rank 3, the operand 2");
  EXPECT(nb_take_along_axis(t.x, t.i, 0), NB_ERR_SHAPE, "do not broadcast (axis 1)");
  EXPECT(nb_take_along_axis(t.x, NULL, 0), NB_ERR_INVALID_ARG, "take_along_axis: NULL");
  /* NULL everywhere: nothing to record the error in */
  CHECK(nb_take(NULL, NULL) == NULL && nb_gather(NULL, NULL, &gwin, ss23) == NULL);
  CHECK(nb_take_along_axis(NULL, NULL, 0) == NULL && nb_scatter_add(NULL, NULL, NULL, &swin) == NULL);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  gold = nb_test_golden_load("tests/core/golden/gather.json");
  CHECK(gold != NULL);
  test_goldens(ctx);
  test_dtypes(ctx);
  test_extreme_ids(ctx);
  test_empty(ctx);
  test_embedding_grad(ctx);
  test_per_example_grads(ctx);
  test_vmap_axes(ctx);
  test_text_and_cost(ctx);
  test_misuse(ctx);
  cJSON_Delete(gold);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/gather");
}
