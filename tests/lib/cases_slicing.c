/* Primitive-table rows for slice, pad and concatenate: strides, empty
 * windows, negative (cropping) and interior padding with a traced pad value,
 * concatenation of several operands along positive and negative axes. */
#include "primcheck.h"

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status randn(nb_ctx *c, nb_test_rng *r, nb_tree *in, const char *path, int rank, const int64_t *dims) {
  return put(in, path, nb_test_randn(c, r, NB_F64, rank, dims));
}

#define A nb_tree_get_val(in, "a")
#define OUT(v) return nb_tree_set_val(out, "y", (v))

/* ---------------------------------------------------------------- slice */

static const int64_t D34[2] = {3, 4}, D537[3] = {5, 3, 7}, D7[1] = {7};

static nb_status in_34(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return randn(c, r, in, "a", 2, D34); }
static nb_status in_537(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return randn(c, r, in, "a", 3, D537); }

static nb_status f_slice_rows(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t start[2] = {1, 0}, limit[2] = {3, 4};
  OUT(nb_mul(nb_slice(A, start, limit, NULL), nb_iota(g, NB_F64, 2, ((int64_t[]){2, 4}), 1)));
}
static nb_status f_slice_strided(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t start[3] = {0, 1, 1}, limit[3] = {5, 3, 7}, strides[3] = {2, 1, 3};
  OUT(nb_sin(nb_slice(A, start, limit, strides)));
}
static nb_status f_slice_empty(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t start[2] = {2, 0}, limit[2] = {2, 4};
  nb_val *xs[2] = {nb_slice(A, start, limit, NULL), nb_exp(A)}; /* [0,4] and [3,4] */
  OUT(nb_concatenate(2, xs, 0));
}

/* ---------------------------------------------------------------- pad */

static nb_status in_34_v(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 2, D34);
  return s ? s : randn(c, r, in, "v", 0, NULL);
}
static nb_status in_7_v(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 1, D7);
  return s ? s : randn(c, r, in, "v", 0, NULL);
}

static nb_status f_pad_mixed(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t lo[2] = {1, -1}, hi[2] = {2, 0}, interior[2] = {0, 1};
  OUT(nb_pad(A, nb_tree_get_val(in, "v"), lo, hi, interior));
}
static nb_status f_pad_crop(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t lo[1] = {-3}, hi[1] = {-4}, interior[1] = {2}; /* 7 + 12 interior - 7 cropped = 12 */
  OUT(nb_mul(nb_pad(A, nb_tree_get_val(in, "v"), lo, hi, interior), nb_iota(g, NB_F64, 1, ((int64_t[]){12}), 0)));
}
static nb_status f_pad_const(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t lo[2] = {0, 2}, hi[2] = {-2, 1}, interior[2] = {1, 0};
  OUT(nb_tanh(nb_pad(A, nb_scalar(g, NB_F64, 0.5), lo, hi, interior)));
}

/* ---------------------------------------------------------------- concatenate */

static nb_status in_three_rows(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 2, ((int64_t[]){2, 4}));
  if (!s) s = randn(c, r, in, "b", 2, ((int64_t[]){1, 4}));
  return s ? s : randn(c, r, in, "c", 2, ((int64_t[]){3, 4}));
}
static nb_status in_two_cols(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = randn(c, r, in, "a", 2, ((int64_t[]){3, 1}));
  return s ? s : randn(c, r, in, "b", 2, ((int64_t[]){3, 2}));
}
static nb_status f_concat_rows(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *xs[3] = {A, nb_tree_get_val(in, "b"), nb_tree_get_val(in, "c")};
  OUT(nb_concatenate(3, xs, 0));
}
static nb_status f_concat_last(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *b = nb_tree_get_val(in, "b");
  nb_val *xs[3] = {nb_exp(b), A, b};
  OUT(nb_concatenate(3, xs, -1));
}

static const nb_prim_case cases[] = {
    {"slice", "rows 1..3 of [3,4]", f_slice_rows, NULL, in_34, 0, 0},
    {"slice", "strides (2,1,3) on [5,3,7]", f_slice_strided, NULL, in_537, 0, 0},
    {"slice", "an empty window [0,4], concatenated", f_slice_empty, NULL, in_34, 0, 0},
    {"pad", "lo (1,-1) hi (2,0) interior (0,1), traced pad value", f_pad_mixed, NULL, in_34_v, 0, 0},
    {"pad", "cropping into interior padding, traced pad value", f_pad_crop, NULL, in_7_v, 0, 0},
    {"pad", "constant pad value, negative hi", f_pad_const, NULL, in_34, 0, 0},
    {"concatenate", "three operands along axis 0", f_concat_rows, NULL, in_three_rows, 0, 0},
    {"concatenate", "axis -1, repeated operand", f_concat_last, NULL, in_two_cols, 0, 0},
};

const nb_prim_case *nb_cases_slicing(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
