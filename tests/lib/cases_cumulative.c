/* Primitive-table rows for cumsum and cummax: both directions, negative
 * axes, lengths that need several levels of cummax's tangent scan, and an
 * integer scan (values and vmap only). Random normal inputs have no ties. */
#include "primcheck.h"

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static const int64_t D34[2] = {3, 4}, D35[2] = {3, 5}, D239[3] = {2, 3, 9}, D30[2] = {3, 0};

static nb_status in_34(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 2, D34)); }
static nb_status in_35(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 2, D35)); }
static nb_status in_239(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 3, D239)); }
static nb_status in_empty(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 2, D30)); }
static nb_status in_ints(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  return put(in, "a", nb_test_randint(c, r, NB_I32, 2, D35, -20, 20));
}

typedef struct scan_case {
  nb_val *(*op)(nb_loc, nb_val *, int, bool);
  int axis;
  bool reverse;
} scan_case;

static nb_status f_scan(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const scan_case *c = u;
  return nb_tree_set_val(out, "y", c->op(NB_HERE, nb_tree_get_val(in, "a"), c->axis, c->reverse));
}
/* cummax inside a nonlinear function, so second order sees its tangent scan */
static nb_status f_cummax_sq(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *y = nb_cummax(nb_tree_get_val(in, "a"), -1, false);
  return nb_tree_set_val(out, "y", nb_mul(y, y));
}

static const scan_case sum1 = {nb_cumsum_at, 1, false}, sum_rev = {nb_cumsum_at, -2, true},
                       sum3 = {nb_cumsum_at, 2, false}, max1 = {nb_cummax_at, 1, false},
                       max_rev = {nb_cummax_at, 0, true}, max3 = {nb_cummax_at, -1, true},
                       max_int = {nb_cummax_at, 1, false}, sum_int = {nb_cumsum_at, 0, true};

#define NG NB_CASE_NO_GRAD
static const nb_prim_case cases[] = {
    {"cumsum", "axis 1", f_scan, (void *)&sum1, in_34, 0, 0},
    {"cumsum", "axis -2, reverse", f_scan, (void *)&sum_rev, in_34, 0, 0},
    {"cumsum", "rank 3, axis 2 of length 9", f_scan, (void *)&sum3, in_239, 0, 0},
    {"cumsum", "i32, axis 0, reverse", f_scan, (void *)&sum_int, in_ints, NG, 0},
    {"cummax", "axis 1", f_scan, (void *)&max1, in_35, 0, 0},
    {"cummax", "axis 0, reverse", f_scan, (void *)&max_rev, in_35, 0, 0},
    {"cummax", "rank 3, axis -1 of length 9, reverse", f_scan, (void *)&max3, in_239, 0, 0},
    {"cummax", "squared running max, length 9", f_cummax_sq, NULL, in_239, 0, 0},
    {"cummax", "i32, axis 1", f_scan, (void *)&max_int, in_ints, NG, 0},
    {"cummax", "an empty axis", f_scan, (void *)&max1, in_empty, 0, 0},
    {"cumsum", "an empty axis, reverse", f_scan, (void *)&sum_rev, in_empty, 0, 0},
};

const nb_prim_case *nb_cases_cumulative(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
