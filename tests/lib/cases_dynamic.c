/* Primitive-table rows for dynamic_slice and dynamic_update_slice. Start
 * indices are random integers, often out of range (so clamping is exercised)
 * and of several integer dtypes. The table's vmap check batches all inputs
 * (per-row starts: the one-hot path) and then only the first input, so the
 * order of inputs chooses which operand is batched alone. */
#include "primcheck.h"

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}
static nb_status randn(nb_ctx *c, nb_test_rng *r, nb_tree *in, const char *path, int rank, const int64_t *dims) {
  return put(in, path, nb_test_randn(c, r, NB_F64, rank, dims));
}
static nb_status start_index(nb_ctx *c, nb_test_rng *r, nb_tree *in, const char *path, nb_dtype t, int64_t lo, int64_t hi) {
  return put(in, path, nb_test_randint(c, r, t, 0, NULL, lo, hi));
}

#define V(p) nb_tree_get_val(in, p)
#define OUT(v) return nb_tree_set_val(out, "y", (v))

/* ---------------------------------------------------------------- dynamic_slice */

static const int64_t D56[2] = {5, 6}, D453[3] = {4, 5, 3}, D7[1] = {7};

static nb_status in_56_ij(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 2, D56);
  if (!s) s = start_index(c, r, in, "i", NB_I32, -2, 6);
  return s ? s : start_index(c, r, in, "j", NB_I32, -2, 7);
}
static nb_status in_453_u8(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 3, D453);
  if (!s) s = start_index(c, r, in, "i", NB_U8, 0, 5);
  if (!s) s = start_index(c, r, in, "j", NB_U8, 0, 5);
  return s ? s : start_index(c, r, in, "k", NB_U8, 0, 3);
}
static nb_status in_i_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* the start alone is batched */
  nb_status s = start_index(c, r, in, "i", NB_I64, -3, 9);
  return s ? s : randn(c, r, in, "a", 1, D7);
}

static nb_status f_ds_2d(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[2] = {V("i"), V("j")};
  OUT(nb_dynamic_slice(V("a"), st, ((int64_t[]){2, 3})));
}
static nb_status f_ds_3d(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[3] = {V("i"), V("j"), V("k")};
  OUT(nb_sin(nb_dynamic_slice(V("a"), st, ((int64_t[]){1, 5, 2}))));
}
static nb_status f_ds_start_batched(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[1] = {V("i")};
  OUT(nb_dynamic_slice(nb_mul(V("a"), V("a")), st, ((int64_t[]){3})));
}

/* ---------------------------------------------------------------- dynamic_update_slice */

static nb_status in_56_u_ij(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 2, D56);
  if (!s) s = randn(c, r, in, "u", 2, ((int64_t[]){2, 3}));
  if (!s) s = start_index(c, r, in, "i", NB_I32, -2, 6);
  return s ? s : start_index(c, r, in, "j", NB_I32, -2, 7);
}
static nb_status in_u_first(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* the update alone is batched */
  nb_status s = randn(c, r, in, "u", 3, ((int64_t[]){2, 5, 1}));
  if (!s) s = randn(c, r, in, "a", 3, D453);
  if (!s) s = start_index(c, r, in, "i", NB_I64, -1, 4);
  if (!s) s = start_index(c, r, in, "j", NB_I64, 0, 2);
  return s ? s : start_index(c, r, in, "k", NB_I64, -5, 5);
}
static nb_status in_i_first_u(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = start_index(c, r, in, "i", NB_U32, 0, 8);
  if (!s) s = randn(c, r, in, "a", 1, D7);
  return s ? s : randn(c, r, in, "u", 1, ((int64_t[]){2}));
}

static nb_status f_dus_2d(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[2] = {V("i"), V("j")};
  OUT(nb_dynamic_update_slice(V("a"), V("u"), st));
}
static nb_status f_dus_3d(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[3] = {V("i"), V("j"), V("k")};
  OUT(nb_exp(nb_dynamic_update_slice(V("a"), nb_mul(V("u"), V("u")), st)));
}
static nb_status f_dus_start_batched(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[1] = {V("i")};
  OUT(nb_dynamic_update_slice(V("a"), V("u"), st));
}

static nb_status in_empty(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* [4,0] with a [2,0] update */
  nb_status s = randn(c, r, in, "a", 2, ((int64_t[]){4, 0}));
  if (!s) s = randn(c, r, in, "u", 2, ((int64_t[]){2, 0}));
  if (!s) s = start_index(c, r, in, "i", NB_I32, -1, 5);
  return s ? s : start_index(c, r, in, "j", NB_I32, -1, 5);
}
static nb_status f_empty(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *st[2] = {V("i"), V("j")};
  nb_val *a = nb_dynamic_update_slice(V("a"), V("u"), st);
  OUT(nb_dynamic_slice(a, st, ((int64_t[]){3, 0})));
}

static const nb_prim_case cases[] = {
    {"dynamic_slice", "[5,6] window [2,3], i32 starts in [-2,7] (clamped)", f_ds_2d, NULL, in_56_ij, 0, 0},
    {"dynamic_slice", "[4,5,3] window [1,5,2] (one full axis), u8 starts", f_ds_3d, NULL, in_453_u8, 0, 0},
    {"dynamic_slice", "i64 start batched alone", f_ds_start_batched, NULL, in_i_first, 0, 0},
    {"dynamic_update_slice", "[5,6] with a [2,3] update, i32 starts (clamped)", f_dus_2d, NULL, in_56_u_ij, 0, 0},
    {"dynamic_update_slice", "[4,5,3] with a [2,5,1] update, update batched alone", f_dus_3d, NULL, in_u_first, 0, 0},
    {"dynamic_update_slice", "zero-size operand and update, then a zero-size window", f_empty, NULL, in_empty, 0, 0},
    {"dynamic_update_slice", "u32 start batched alone", f_dus_start_batched, NULL, in_i_first_u, 0, 0},
};

const nb_prim_case *nb_cases_dynamic(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
