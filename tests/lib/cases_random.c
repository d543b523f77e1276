/* Primitive-table rows for random.c: the threefry2x32 block itself, and the
 * samplers built on it (they are all threefry2x32 equations plus ordinary
 * ones), run through eval and vmap over keys. Every output is an integer or
 * depends on no float input, so there are no derivatives to check. Inputs:
 * keys u32[2] named key, counters and key words u32 named k0 k1 x0 x1. */
#include "primcheck.h"

static const int64_t D2[1] = {2}, D34[2] = {3, 4}, D3[1] = {3}, D5[1] = {5};

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_array *u32s(nb_ctx *c, nb_test_rng *r, int rank, const int64_t *dims) {
  return nb_test_randint(c, r, NB_U32, rank, dims, 0, 0xFFFFFFFFll);
}

static nb_status in_block(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  const char *names[4] = {"x0", "x1", "k0", "k1"};
  nb_status s = NB_OK;
  for (int i = 0; i < 4 && !s; i++) s = put(in, names[i], u32s(c, r, 2, D34));
  return s;
}
static nb_status in_block_scalar_key(nb_ctx *c, nb_test_rng *r, nb_tree *in) { /* counters first: batched alone */
  nb_status s = put(in, "x0", u32s(c, r, 1, D5));
  if (!s) s = put(in, "x1", u32s(c, r, 1, D5));
  if (!s) s = put(in, "k0", u32s(c, r, 0, NULL));
  return s ? s : put(in, "k1", u32s(c, r, 0, NULL));
}
static nb_status in_key(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "key", u32s(c, r, 1, D2)); }
static nb_status in_key_logits(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_status s = in_key(c, r, in);
  return s ? s : put(in, "logits", nb_test_randn(c, r, NB_F64, 2, D34));
}
static nb_status in_key_p(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  nb_array *p = nb_test_randn(c, r, NB_F64, 1, D3);
  double *d = nb_array_data_mut(p);
  for (int i = 0; i < 3; i++) d[i] = 0.5 + 0.4 * tanh(d[i]);
  nb_status s = in_key(c, r, in);
  return s ? s : put(in, "p", p);
}

#define V(name) nb_tree_get_val(in, name)
#define SET(name, v) \
  do { \
    nb_status s_ = nb_tree_set_val(out, name, (v)); \
    if (s_) return s_; \
  } while (0)

static nb_status f_block(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *y0, *y1;
  nb_threefry2x32(V("k0"), V("k1"), V("x0"), V("x1"), &y0, &y1);
  SET("y0", y0);
  SET("y1", y1);
  return NB_OK;
}

static nb_status f_keys(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *k = V("key");
  int64_t odd[2] = {3, 5};
  SET("split", nb_random_split(k, 3));
  SET("fold_in", nb_random_fold_in(k, nb_scalar(g, NB_U32, 12345)));
  SET("bits_even", nb_random_bits(k, 2, D34));
  SET("bits_odd", nb_random_bits(k, 2, odd));
  return NB_OK;
}

static nb_status f_uniform(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *k = V("key");
  SET("f32", nb_random_uniform(k, NB_F32, 2, D34, -1, 2));
  SET("f64", nb_random_uniform(k, NB_F64, 1, D5, 0, 1));
  SET("f16", nb_random_uniform(k, NB_F16, 1, D5, 0, 1));
  SET("bf16", nb_random_uniform(k, NB_BF16, 2, D34, 0, 1));
  return NB_OK;
}

static nb_status f_normal(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *k = V("key");
  SET("normal", nb_random_normal(k, NB_F32, 2, D34));
  SET("truncated", nb_random_truncated_normal(k, NB_F64, 1, D5, -2, 1));
  return NB_OK;
}

static nb_status f_categorical(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  SET("categorical", nb_random_categorical(V("key"), V("logits"), -1));
  return NB_OK;
}

static nb_status f_bernoulli(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int64_t d[2] = {4, 3};
  SET("bernoulli", nb_random_bernoulli(V("key"), V("p"), 2, d));
  return NB_OK;
}

#define NG NB_CASE_NO_GRAD
static const nb_prim_case cases[] = {
    {"threefry2x32", "the block on [3,4] keys and counters", f_block, NULL, in_block, NG, 0},
    {"threefry2x32", "scalar key words broadcast against [5] counters", f_block, NULL, in_block_scalar_key, NG, 0},
    {"threefry2x32", "split, fold_in, bits (even and odd sizes) of a key", f_keys, NULL, in_key, NG, 0},
    {"threefry2x32", "uniform f32/f64/f16/bf16 of a key", f_uniform, NULL, in_key, NG, 0},
    {"threefry2x32", "normal f32, truncated_normal f64 of a key", f_normal, NULL, in_key, NG, 0},
    {"threefry2x32", "categorical over [3,4] logits (axis -1)", f_categorical, NULL, in_key_logits, NG, 0},
    {"threefry2x32", "bernoulli with p [3] broadcast to [4,3]", f_bernoulli, NULL, in_key_p, NG, 0},
};

const nb_prim_case *nb_cases_random(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
