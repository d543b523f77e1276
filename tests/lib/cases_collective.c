/* Primitive-table rows for the collectives on a one-process axis ("i",
 * bound to nb_comm_self): every rule runs (shape, reference, JVP, transpose,
 * vmap) with size 1, where each collective is the identity or a reshape.
 * Two processes: tests/dist/test_collectives.c under mpirun. */
#include "primcheck.h"

static const int64_t D34[2] = {3, 4}, D314[3] = {3, 1, 4};

static nb_status put34(nb_ctx *c, nb_test_rng *r, nb_tree *in, const int64_t *dims, int rank) {
  nb_status s = nb_ctx_bind_axis(c, "i", nb_comm_self());
  nb_array *a = s ? NULL : nb_test_randn(c, r, NB_F64, rank, dims);
  s = a ? nb_tree_set_array(in, "a", a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}
static nb_status in_34(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put34(c, r, in, D34, 2); }
static nb_status in_314(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put34(c, r, in, D314, 3); }

static nb_val *a_of(const nb_tree *in) { return nb_tree_get_val(in, "a"); }
static nb_status set_y(nb_tree *out, nb_val *y) { return nb_tree_set_val(out, "y", y); }

/* sin() around the collective, so that second order sees its transpose */
static nb_status f_psum(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_psum(nb_sin(a_of(in)), "i")));
}
static nb_status f_pmean(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_mul(nb_pmean(a_of(in), "i"), a_of(in)));
}
static nb_status f_pmax(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_pmax(nb_sin(a_of(in)), "i")));
}
static nb_status f_pbroadcast(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_pbroadcast(nb_sin(a_of(in)), "i")));
}
static nb_status f_gather_tiled(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_all_gather(nb_sin(a_of(in)), "i", 1, true)));
}
static nb_status f_gather_stacked(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_all_gather(nb_sin(a_of(in)), "i", -1, false)));
}
static nb_status f_scatter_tiled(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_psum_scatter(nb_sin(a_of(in)), "i", 0, true)));
}
static nb_status f_scatter_dim(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_psum_scatter(nb_sin(a_of(in)), "i", 1, false)));
}
static nb_status f_all_to_all(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_sin(nb_all_to_all(nb_sin(a_of(in)), "i", 0, 1)));
}
static nb_status f_ppermute(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  static const int src[1] = {0}, dst[1] = {0};
  return set_y(out, nb_sin(nb_ppermute(nb_sin(a_of(in)), "i", 1, src, dst)));
}
static nb_status f_ppermute_none(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return set_y(out, nb_add(nb_ppermute(a_of(in), "i", 0, NULL, NULL), a_of(in))); /* nobody sends: zeros */
}
static nb_status f_axis_index(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *k = nb_convert(nb_add(nb_axis_index(g, "i"), nb_scalar(g, NB_I32, 2)), NB_F64);
  return set_y(out, nb_mul(a_of(in), k));
}

static const nb_prim_case cases[] = {
    {"psum", "sin(psum(sin x))", f_psum, NULL, in_34, 0, 0},
    {"psum", "pmean(x) * x", f_pmean, NULL, in_34, 0, 0},
    {"pmax", "sin(pmax(sin x))", f_pmax, NULL, in_34, 0, 0},
    {"pbroadcast", "sin(pbroadcast(sin x))", f_pbroadcast, NULL, in_34, 0, 0},
    {"all_gather", "tiled along dim 1", f_gather_tiled, NULL, in_34, 0, 0},
    {"all_gather", "stacked on a new last dim", f_gather_stacked, NULL, in_34, 0, 0},
    {"psum_scatter", "tiled along dim 0", f_scatter_tiled, NULL, in_34, 0, 0},
    {"psum_scatter", "dim 1 of size 1, removed", f_scatter_dim, NULL, in_314, 0, 0},
    {"all_to_all", "split 0, concat 1", f_all_to_all, NULL, in_34, 0, 0},
    {"ppermute", "0 -> 0", f_ppermute, NULL, in_34, 0, 0},
    {"ppermute", "no pairs: zeros", f_ppermute_none, NULL, in_34, 0, 0},
    {"axis_index", "x * (axis_index + 2)", f_axis_index, NULL, in_34, 0, 0},
};

const nb_prim_case *nb_cases_collective(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
