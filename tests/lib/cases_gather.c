/* Primitive-table rows for gather.c: gather (through take, take_along_axis
 * and explicit dimension numbers: windows with clamped starts, batching
 * dims, index_vector_dim in front) and scatter_add (repeated ids, skipped
 * windows, batching dims). Indices are drawn partly out of range. The order
 * of the inputs varies between rows so the table's "first input batched"
 * vmap pass batches the operand in some rows and the indices in others. */
#include "primcheck.h"

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status put_randn(nb_ctx *c, nb_test_rng *r, nb_tree *in, const char *path, int rank, const int64_t *d) {
  return put(in, path, nb_test_randn(c, r, NB_F64, rank, d));
}

static nb_status put_ints(nb_ctx *c, nb_test_rng *r, nb_tree *in, const char *path, nb_dtype t, int rank,
                          const int64_t *d, int64_t lo, int64_t hi) {
  return put(in, path, nb_test_randint(c, r, t, rank, d, lo, hi));
}

#define X nb_tree_get_val(in, "x")
#define I nb_tree_get_val(in, "i")
#define U nb_tree_get_val(in, "u")
#define OUT(v) return nb_tree_set_val(out, "y", (v))

/* ---------------------------------------------------------------- take */

static nb_status in_take(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* ids in [-7, 7] of 5 rows */
  int64_t dt[2] = {5, 3}, di[2] = {2, 4};
  nb_status s = put_randn(c, r, in, "x", 2, dt);
  return s ? s : put_ints(c, r, in, "i", NB_I32, 2, di, -7, 7);
}
static nb_status in_take_ids_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t dt[3] = {4, 2, 3}, di[1] = {5};
  nb_status s = put_ints(c, r, in, "i", NB_U8, 1, di, 0, 5);
  return s ? s : put_randn(c, r, in, "x", 3, dt);
}
static nb_status f_take(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_take(X, I)); }
static nb_status f_take_scalar_id(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  OUT(nb_take(X, nb_scalar(g, NB_I64, -2)));
}

/* ---------------------------------------------------------------- take_along_axis */

static nb_status in_along_bcast(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* x [3,1,5], idx [3,4,2] */
  int64_t dx[3] = {3, 1, 5}, di[3] = {3, 4, 2};
  nb_status s = put_randn(c, r, in, "x", 3, dx);
  return s ? s : put_ints(c, r, in, "i", NB_I64, 3, di, -5, 4);
}
static nb_status in_along_idx_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* idx [2,1], x [4,3] */
  int64_t dx[2] = {4, 3}, di[2] = {2, 1};
  nb_status s = put_ints(c, r, in, "i", NB_I32, 2, di, -4, 3);
  return s ? s : put_randn(c, r, in, "x", 2, dx);
}
static nb_status f_along_last(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_take_along_axis(X, I, -1)); }
static nb_status f_along_first(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { OUT(nb_take_along_axis(X, I, 0)); }

/* ---------------------------------------------------------------- gather, explicit dims */

static nb_status in_window(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* operand [5,6], 4 starts in [-2,7]^2 */
  int64_t dx[2] = {5, 6}, di[2] = {4, 2};
  nb_status s = put_randn(c, r, in, "x", 2, dx);
  return s ? s : put_ints(c, r, in, "i", NB_I64, 2, di, -2, 7);
}
static nb_status f_window(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_gather_dims dn = {.n_offset = 2, .n_start_index_map = 2, .offset_dims = {1, 2}, .start_index_map = {0, 1},
                       .index_vector_dim = 1};
  int64_t ss[2] = {2, 3};
  OUT(nb_gather(X, I, &dn, ss));
}

/* StableHLO's example layout: operand [2,3,4,2], indices [2,2,3,2] (vector
 * last), operand dim 0 batched with indices dim 1. */
static nb_status in_batching(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t dx[4] = {2, 3, 4, 2}, di[4] = {2, 2, 3, 2};
  nb_status s = put_randn(c, r, in, "x", 4, dx);
  return s ? s : put_ints(c, r, in, "i", NB_I32, 4, di, -1, 4);
}
static nb_status in_batching_idx_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t dx[4] = {2, 3, 4, 2}, di[4] = {2, 2, 3, 2};
  nb_status s = put_ints(c, r, in, "i", NB_I32, 4, di, -1, 4);
  return s ? s : put_randn(c, r, in, "x", 4, dx);
}
static nb_status f_batching(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_gather_dims dn = {.n_offset = 2, .n_collapsed = 1, .n_start_index_map = 2, .n_operand_batching = 1,
                       .offset_dims = {3, 4}, .collapsed_slice_dims = {1}, .start_index_map = {2, 1},
                       .operand_batching_dims = {0}, .start_indices_batching_dims = {1}, .index_vector_dim = 3};
  int64_t ss[4] = {1, 1, 2, 2};
  OUT(nb_gather(X, I, &dn, ss));
}

/* Index vectors along dim 0 of [2,3]; operand [4,5,3], dim 0 collapsed. */
static nb_status in_ivd0(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t dx[3] = {4, 5, 3}, di[2] = {2, 3};
  nb_status s = put_ints(c, r, in, "i", NB_I32, 2, di, -1, 5);
  return s ? s : put_randn(c, r, in, "x", 3, dx);
}
static nb_status f_ivd0(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_gather_dims dn = {.n_offset = 2, .n_collapsed = 1, .n_start_index_map = 2, .offset_dims = {1, 2},
                       .collapsed_slice_dims = {0}, .start_index_map = {0, 1}, .index_vector_dim = 0};
  int64_t ss[3] = {1, 2, 3};
  OUT(nb_mul(nb_gather(X, I, &dn, ss), nb_gather(nb_sin(X), I, &dn, ss))); /* nonlinear use */
}

/* ---------------------------------------------------------------- scatter_add */

static nb_status in_rows(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* operand [5,3], 6 ids in [-1,5] */
  int64_t dx[2] = {5, 3}, di[1] = {6}, du[2] = {6, 3};
  nb_status s = put_randn(c, r, in, "x", 2, dx);
  if (!s) s = put_ints(c, r, in, "i", NB_I32, 1, di, -1, 5);
  return s ? s : put_randn(c, r, in, "u", 2, du);
}
static nb_status in_rows_updates_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  int64_t dx[2] = {5, 3}, di[1] = {6}, du[2] = {6, 3};
  nb_status s = put_randn(c, r, in, "u", 2, du);
  if (!s) s = put_ints(c, r, in, "i", NB_I64, 1, di, 0, 4);
  return s ? s : put_randn(c, r, in, "x", 2, dx);
}
static nb_status f_rows(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_scatter_dims dn = {.n_update_window = 1, .n_inserted_window = 1, .n_scatter_to_operand = 1,
                        .update_window_dims = {1}, .inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0},
                        .index_vector_dim = 1};
  OUT(nb_scatter_add(X, I, U, &dn));
}
static nb_status f_rows_squared(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) { /* nonlinear around it */
  nb_scatter_dims dn = {.n_update_window = 1, .n_inserted_window = 1, .n_scatter_to_operand = 1,
                        .update_window_dims = {1}, .inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0},
                        .index_vector_dim = 1};
  nb_val *y = nb_scatter_add(nb_mul(X, X), I, nb_tanh(U), &dn);
  OUT(nb_mul(y, y));
}

static nb_status in_swin(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* windows [2,3] into [5,6], some skipped */
  int64_t dx[2] = {5, 6}, di[2] = {7, 2}, du[3] = {7, 2, 3};
  nb_status s = put_ints(c, r, in, "i", NB_I32, 2, di, -1, 4);
  if (!s) s = put_randn(c, r, in, "x", 2, dx);
  return s ? s : put_randn(c, r, in, "u", 3, du);
}
static nb_status f_swin(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_scatter_dims dn = {.n_update_window = 2, .n_scatter_to_operand = 2, .update_window_dims = {1, 2},
                        .scatter_dims_to_operand_dims = {0, 1}, .index_vector_dim = 1};
  OUT(nb_scatter_add(X, I, U, &dn));
}

static nb_status in_sbatch(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* StableHLO's scatter example layout */
  int64_t dx[4] = {2, 3, 4, 2}, di[4] = {2, 2, 3, 2}, du[5] = {2, 2, 3, 2, 2};
  nb_status s = put_randn(c, r, in, "x", 4, dx);
  if (!s) s = put_ints(c, r, in, "i", NB_I64, 4, di, -1, 3);
  return s ? s : put_randn(c, r, in, "u", 5, du);
}
static nb_status f_sbatch(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_scatter_dims dn = {.n_update_window = 2, .n_inserted_window = 1, .n_scatter_to_operand = 2,
                        .n_operand_batching = 1, .update_window_dims = {3, 4}, .inserted_window_dims = {1},
                        .scatter_dims_to_operand_dims = {2, 1}, .operand_batching_dims = {0},
                        .scatter_indices_batching_dims = {1}, .index_vector_dim = 3};
  OUT(nb_scatter_add(X, I, U, &dn));
}

static const nb_prim_case cases[] = {
    {"gather", "take: rows of [5,3] by ids [2,4] in [-7,7] (wrapped, clamped)", f_take, NULL, in_take, 0, 0},
    {"gather", "take: u8 ids first, table [4,2,3]", f_take, NULL, in_take_ids_first, 0, 0},
    {"gather", "take: a scalar id -2", f_take_scalar_id, NULL, in_take, 0, 0},
    {"gather", "take_along_axis -1: [3,1,5] by [3,4,2] (broadcast)", f_along_last, NULL, in_along_bcast, 0, 0},
    {"gather", "take_along_axis 0: indices [2,1] first, x [4,3]", f_along_first, NULL, in_along_idx_first, 0, 0},
    {"gather", "2-d windows [2,3] of [5,6], clamped starts", f_window, NULL, in_window, 0, 0},
    {"gather", "batching dims (StableHLO's example layout)", f_batching, NULL, in_batching, 0, 0},
    {"gather", "batching dims, indices first", f_batching, NULL, in_batching_idx_first, 0, 0},
    {"gather", "index_vector_dim 0, a collapsed dim, nonlinear use", f_ivd0, NULL, in_ivd0, 0, 0},
    {"scatter_add", "rows by ids with repeats and out-of-range ids", f_rows, NULL, in_rows, 0, 0},
    {"scatter_add", "rows, updates first, nonlinear around it", f_rows_squared, NULL, in_rows_updates_first, 0, 0},
    {"scatter_add", "2-d windows, partly out of range (skipped)", f_swin, NULL, in_swin, 0, 0},
    {"scatter_add", "batching dims (StableHLO's example layout)", f_sbatch, NULL, in_sbatch, 0, 0},
};

const nb_prim_case *nb_cases_gather(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
