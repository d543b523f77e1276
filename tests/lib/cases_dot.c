/* Primitive-table rows for dot_general: plain matrix product, batch dims,
 * several contracting dims out of order, no contraction (outer product), a
 * full contraction to a scalar, negative dims, and nb_matmul's broadcasting
 * and 1-D promotion. Inputs are named a (lhs) and b (rhs). */
#include "primcheck.h"

typedef struct dot_case {
  int ra, rb;
  int64_t da[NB_MAX_RANK], db[NB_MAX_RANK];
  bool matmul; /* nb_matmul instead of dn */
  nb_dot_dims dn;
} dot_case;

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status f_dot(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const dot_case *c = user;
  nb_val *a = nb_tree_get_val(in, "a"), *b = nb_tree_get_val(in, "b");
  nb_val *y = c->matmul ? nb_matmul(a, b) : nb_dot_general(a, b, &c->dn, NB_DTYPE_COUNT);
  return nb_tree_set_val(out, "y", y);
}

#define DOT_INPUTS(id)                                                                \
  static nb_status in_##id(nb_ctx *c, nb_test_rng *r, nb_tree *in) {                  \
    nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, k_##id.ra, k_##id.da));    \
    return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, k_##id.rb, k_##id.db));   \
  }

/* [3,4] x [4,5] -> [3,5] */
static const dot_case k_mm = {2, 2, {3, 4}, {4, 5}, false, {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}}};
/* batch 0/0, contract 2/1: [2,3,4] x [2,4,5] -> [2,3,5] */
static const dot_case k_bmm = {3, 3, {2, 3, 4}, {2, 4, 5}, false,
                               {.n_batch = 1, .n_contract = 1, .lhs_batch = {0}, .rhs_batch = {0}, .lhs_contract = {2}, .rhs_contract = {1}}};
/* batch lhs 1 / rhs 2, contract lhs (3,0) / rhs (0,1): [3,2,4,5] x [5,3,2,2] -> [2,4,2] */
static const dot_case k_multi = {4, 4, {3, 2, 4, 5}, {5, 3, 2, 2}, false,
                                 {.n_batch = 1, .n_contract = 2, .lhs_batch = {1}, .rhs_batch = {2}, .lhs_contract = {3, 0}, .rhs_contract = {0, 1}}};
/* no contraction: [3] x [4] -> [3,4] */
static const dot_case k_outer = {1, 1, {3}, {4}, false, {0}};
/* full contraction: [3,4] x [4,3] contract both pairs -> [] */
static const dot_case k_full = {2, 2, {3, 4}, {4, 3}, false, {.n_contract = 2, .lhs_contract = {0, 1}, .rhs_contract = {1, 0}}};
/* negative dims: contract -1 / -2, batch -3 / 0: [2,3,4] x [2,4,3] -> [2,3,3] */
static const dot_case k_neg = {3, 3, {2, 3, 4}, {2, 4, 3}, false,
                               {.n_batch = 1, .n_contract = 1, .lhs_batch = {-3}, .rhs_batch = {0}, .lhs_contract = {-1}, .rhs_contract = {-2}}};
/* matmul with broadcast batch dims: [2,1,3,4] @ [5,4,2] -> [2,5,3,2] */
static const dot_case k_bcast = {4, 3, {2, 1, 3, 4}, {5, 4, 2}, true, {0}};
/* matmul of a matrix with a batch of matrices: [3,4] @ [2,4,5] -> [2,3,5] */
static const dot_case k_mat_batch = {2, 3, {3, 4}, {2, 4, 5}, true, {0}};
/* matmul 1-D promotion: [4] @ [2,4,3] -> [2,3] and [2,3,4] @ [4] -> [2,3] */
static const dot_case k_vec_l = {1, 3, {4}, {2, 4, 3}, true, {0}};
static const dot_case k_vec_r = {3, 1, {2, 3, 4}, {4}, true, {0}};

DOT_INPUTS(mm)
DOT_INPUTS(bmm)
DOT_INPUTS(multi)
DOT_INPUTS(outer)
DOT_INPUTS(full)
DOT_INPUTS(neg)
DOT_INPUTS(bcast)
DOT_INPUTS(mat_batch)
DOT_INPUTS(vec_l)
DOT_INPUTS(vec_r)

static const nb_prim_case cases[] = {
    {"dot_general", "matrix product [3,4]x[4,5]", f_dot, (void *)&k_mm, in_mm, 0, 0},
    {"dot_general", "batched matrix product", f_dot, (void *)&k_bmm, in_bmm, 0, 0},
    {"dot_general", "two contracting dims out of order, batch dims at different positions", f_dot, (void *)&k_multi,
     in_multi, 0, 0},
    {"dot_general", "no contraction (outer product)", f_dot, (void *)&k_outer, in_outer, 0, 0},
    {"dot_general", "full contraction to a scalar", f_dot, (void *)&k_full, in_full, 0, 0},
    {"dot_general", "negative dims", f_dot, (void *)&k_neg, in_neg, 0, 0},
    {"dot_general", "matmul broadcasting batch dims", f_dot, (void *)&k_bcast, in_bcast, 0, 0},
    {"dot_general", "matmul matrix @ batch of matrices", f_dot, (void *)&k_mat_batch, in_mat_batch, 0, 0},
    {"dot_general", "matmul 1-D lhs", f_dot, (void *)&k_vec_l, in_vec_l, 0, 0},
    {"dot_general", "matmul 1-D rhs", f_dot, (void *)&k_vec_r, in_vec_r, 0, 0},
};

const nb_prim_case *nb_cases_dot(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
