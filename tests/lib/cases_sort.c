/* Primitive-table rows for sort.c: sort (ascending and descending, first,
 * middle and last axes) and top_k (k < n, k = n, k = 1). Inputs are random
 * normals, so ties (where the derivative jumps) have probability zero. Both
 * outputs are checked; only the values carry a derivative. */
#include "primcheck.h"

static nb_status put_randn(nb_ctx *c, nb_test_rng *r, nb_tree *in, int rank, const int64_t *d) {
  nb_array *a = nb_test_randn(c, r, NB_F64, rank, d);
  nb_status s = a ? nb_tree_set_array(in, "x", a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status in_35(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 2, (int64_t[]){3, 5}); }
static nb_status in_43(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 2, (int64_t[]){4, 3}); }
static nb_status in_243(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 3, (int64_t[]){2, 4, 3}); }
static nb_status in_36(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 2, (int64_t[]){3, 6}); }
static nb_status in_5(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 1, (int64_t[]){5}); }
static nb_status in_234(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put_randn(c, r, in, 3, (int64_t[]){2, 3, 4}); }

typedef struct sort_case {
  int axis;
  bool descending;
} sort_case;

static nb_status f_sort(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sort_case *c = u;
  nb_val *idx = NULL, *y = nb_sort(nb_tree_get_val(in, "x"), c->axis, c->descending, &idx);
  nb_status s = nb_tree_set_val(out, "values", nb_sin(y)); /* nonlinear after, for second order */
  return s ? s : nb_tree_set_val(out, "indices", idx);
}

static nb_status f_top_k(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *idx = NULL, *x = nb_tree_get_val(in, "x"), *y = nb_top_k(nb_mul(x, x), (int)(intptr_t)u, &idx);
  nb_status s = nb_tree_set_val(out, "values", y);
  return s ? s : nb_tree_set_val(out, "indices", idx);
}

static const sort_case s_last = {-1, false}, s_first_desc = {0, true}, s_mid = {1, false}, s_mid_desc = {-2, true};

static const nb_prim_case cases[] = {
    {"sort", "[3,5] along -1, ascending", f_sort, (void *)&s_last, in_35, 0, 0},
    {"sort", "[4,3] along 0, descending", f_sort, (void *)&s_first_desc, in_43, 0, 0},
    {"sort", "[2,4,3] along 1, ascending", f_sort, (void *)&s_mid, in_243, 0, 0},
    {"sort", "[2,4,3] along -2, descending", f_sort, (void *)&s_mid_desc, in_243, 0, 0},
    {"top_k", "k=2 of [3,6] (of x*x)", f_top_k, (void *)(intptr_t)2, in_36, 0, 0},
    {"top_k", "k=n=5 of [5]", f_top_k, (void *)(intptr_t)5, in_5, 0, 0},
    {"top_k", "k=1 of [2,3,4]", f_top_k, (void *)(intptr_t)1, in_234, 0, 0},
};

const nb_prim_case *nb_cases_sort(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
