/* Primitive-table rows for conv and rev: 1-, 2- and 3-D convolutions with
 * strides, asymmetric and negative padding, lhs (transposed) and rhs
 * (atrous) dilation, feature groups (grouped, depthwise), batch groups, and
 * non-default layouts. Inputs are named a (lhs) and b (rhs). */
#include "primcheck.h"

typedef struct conv_case {
  int r;
  int64_t da[NB_MAX_RANK], db[NB_MAX_RANK];
  nb_conv_params p;
} conv_case;

static nb_status put(nb_tree *in, const char *path, nb_array *a) {
  nb_status s = a ? nb_tree_set_array(in, path, a) : NB_ERR_NOMEM;
  nb_array_release(a);
  return s;
}

static nb_status f_conv(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const conv_case *c = user;
  return nb_tree_set_val(out, "y", nb_conv(nb_tree_get_val(in, "a"), nb_tree_get_val(in, "b"), &c->p));
}

#define CONV_INPUTS(id)                                                             \
  static nb_status in_##id(nb_ctx *c, nb_test_rng *r, nb_tree *in) {                \
    nb_status s = put(in, "a", nb_test_randn(c, r, NB_F64, k_##id.r, k_##id.da));   \
    return s ? s : put(in, "b", nb_test_randn(c, r, NB_F64, k_##id.r, k_##id.db));  \
  }

#define NC(...) .lhs_batch_dim = 0, .lhs_feature_dim = 1, .lhs_spatial = {__VA_ARGS__}, .rhs_out_feature_dim = 0, \
                .rhs_in_feature_dim = 1, .rhs_spatial = {__VA_ARGS__}, .out_batch_dim = 0, .out_feature_dim = 1,   \
                .out_spatial = {__VA_ARGS__}
#define ONES1 {1}
#define ONES2 {1, 1}

static const conv_case k_basic = {4, {2, 3, 5, 5}, {4, 3, 3, 3},
                                  {.n_spatial = 2, .strides = ONES2, .pad_lo = {1, 1}, .pad_hi = {1, 1}, .lhs_dilation = ONES2,
                                   .rhs_dilation = ONES2, .feature_group_count = 1, .batch_group_count = 1, NC(2, 3)}};
static const conv_case k_stride = {4, {1, 2, 7, 6}, {3, 2, 2, 3},
                                   {.n_spatial = 2, .strides = {2, 3}, .pad_lo = {0, 1}, .pad_hi = {1, 0}, .lhs_dilation = ONES2,
                                    .rhs_dilation = {2, 1}, .feature_group_count = 1, .batch_group_count = 1, NC(2, 3)}};
static const conv_case k_lhsdil = {4, {2, 2, 4, 3}, {2, 2, 3, 2},
                                   {.n_spatial = 2, .strides = {1, 2}, .pad_lo = {1, -1}, .pad_hi = {2, 1}, .lhs_dilation = {2, 3},
                                    .rhs_dilation = ONES2, .feature_group_count = 1, .batch_group_count = 1, NC(2, 3)}};
static const conv_case k_fgroups = {4, {2, 4, 5, 4}, {6, 2, 3, 2},
                                    {.n_spatial = 2, .strides = {2, 1}, .pad_lo = {1, 0}, .pad_hi = {1, 1}, .lhs_dilation = ONES2,
                                     .rhs_dilation = {1, 2}, .feature_group_count = 2, .batch_group_count = 1, NC(2, 3)}};
static const conv_case k_bgroups = {3, {4, 3, 6}, {4, 3, 2},
                                    {.n_spatial = 1, .strides = {2}, .pad_lo = {1}, .pad_hi = {1}, .lhs_dilation = {2},
                                     .rhs_dilation = ONES1, .feature_group_count = 1, .batch_group_count = 2, NC(2)}};
static const conv_case k_bgroups2d = {4, {6, 2, 4, 4}, {6, 2, 2, 2},
                                      {.n_spatial = 2, .strides = {1, 2}, .pad_lo = {0, 0}, .pad_hi = {0, 0}, .lhs_dilation = ONES2,
                                       .rhs_dilation = {2, 1}, .feature_group_count = 1, .batch_group_count = 3, NC(2, 3)}};
/* NHWC input, HWIO kernel, NHWC output */
static const conv_case k_nhwc = {4, {2, 5, 4, 3}, {3, 2, 3, 4},
                                 {.n_spatial = 2, .strides = {1, 2}, .pad_lo = {1, 0}, .pad_hi = {1, 1}, .lhs_dilation = ONES2,
                                  .rhs_dilation = ONES2, .feature_group_count = 1, .batch_group_count = 1, .lhs_batch_dim = 0,
                                  .lhs_feature_dim = 3, .lhs_spatial = {1, 2}, .rhs_out_feature_dim = 3, .rhs_in_feature_dim = 2,
                                  .rhs_spatial = {0, 1}, .out_batch_dim = 0, .out_feature_dim = 3, .out_spatial = {1, 2}}};
static const conv_case k_depthwise = {3, {2, 3, 7}, {6, 1, 3},
                                      {.n_spatial = 1, .strides = ONES1, .pad_lo = {2}, .pad_hi = {0}, .lhs_dilation = ONES1,
                                       .rhs_dilation = ONES1, .feature_group_count = 3, .batch_group_count = 1, NC(2)}};
static const conv_case k_3d = {5, {1, 2, 3, 4, 3}, {2, 2, 2, 2, 2},
                               {.n_spatial = 3, .strides = {1, 2, 1}, .pad_lo = {0, 0, 0}, .pad_hi = {0, 0, 0},
                                .lhs_dilation = {1, 1, 1}, .rhs_dilation = {1, 1, 1}, .feature_group_count = 1,
                                .batch_group_count = 1, NC(2, 3, 4)}};
/* lhs [C, W, N], rhs [K, O, I], out [N, W, O] */
static const conv_case k_layout = {3, {3, 6, 2}, {3, 4, 3},
                                   {.n_spatial = 1, .strides = ONES1, .pad_lo = {0}, .pad_hi = {0}, .lhs_dilation = ONES1,
                                    .rhs_dilation = ONES1, .feature_group_count = 1, .batch_group_count = 1, .lhs_batch_dim = 2,
                                    .lhs_feature_dim = 0, .lhs_spatial = {1}, .rhs_out_feature_dim = 1, .rhs_in_feature_dim = 2,
                                    .rhs_spatial = {0}, .out_batch_dim = 0, .out_feature_dim = 2, .out_spatial = {1}}};

CONV_INPUTS(basic)
CONV_INPUTS(stride)
CONV_INPUTS(lhsdil)
CONV_INPUTS(fgroups)
CONV_INPUTS(bgroups)
CONV_INPUTS(bgroups2d)
CONV_INPUTS(nhwc)
CONV_INPUTS(depthwise)
CONV_INPUTS(3d)
CONV_INPUTS(layout)

/* ---------------------------------------------------------------- rev */

typedef struct rev_case {
  int r, naxes;
  int64_t d[NB_MAX_RANK];
  int axes[NB_MAX_RANK];
} rev_case;

static nb_status f_rev(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const rev_case *c = user;
  return nb_tree_set_val(out, "y", nb_rev(nb_tree_get_val(in, "a"), c->naxes, c->axes));
}

static const rev_case k_rev = {3, 2, {2, 3, 4}, {0, 2}};
static const rev_case k_rev_neg = {3, 2, {3, 1, 2}, {-1, 1}};
static nb_status in_rev(nb_ctx *c, nb_test_rng *r, nb_tree *in) { return put(in, "a", nb_test_randn(c, r, NB_F64, 3, k_rev.d)); }
static nb_status in_rev_neg(nb_ctx *c, nb_test_rng *r, nb_tree *in) {
  return put(in, "a", nb_test_randn(c, r, NB_F64, 3, k_rev_neg.d));
}

static const nb_prim_case cases[] = {
    {"conv", "2-D NCHW, padding 1", f_conv, (void *)&k_basic, in_basic, 0, 0},
    {"conv", "strides, asymmetric padding, rhs dilation", f_conv, (void *)&k_stride, in_stride, 0, 0},
    {"conv", "lhs dilation (transposed conv), negative padding", f_conv, (void *)&k_lhsdil, in_lhsdil, 0, 0},
    {"conv", "feature groups with strides and rhs dilation", f_conv, (void *)&k_fgroups, in_fgroups, 0, 0},
    {"conv", "1-D batch groups with lhs dilation and stride", f_conv, (void *)&k_bgroups, in_bgroups, 0, 0},
    {"conv", "2-D batch groups (3) with rhs dilation", f_conv, (void *)&k_bgroups2d, in_bgroups2d, 0, 0},
    {"conv", "NHWC / HWIO layouts", f_conv, (void *)&k_nhwc, in_nhwc, 0, 0},
    {"conv", "1-D depthwise (feature groups = channels)", f_conv, (void *)&k_depthwise, in_depthwise, 0, 0},
    {"conv", "3-D with strides", f_conv, (void *)&k_3d, in_3d, 0, 0},
    {"conv", "1-D with permuted layouts (CWN / KOI / NWO)", f_conv, (void *)&k_layout, in_layout, 0, 0},
    {"rev", "axes 0 and 2", f_rev, (void *)&k_rev, in_rev, 0, 0},
    {"rev", "negative axis, a size-1 axis", f_rev, (void *)&k_rev_neg, in_rev_neg, 0, 0},
};

const nb_prim_case *nb_cases_conv(size_t *n) {
  *n = sizeof cases / sizeof cases[0];
  return cases;
}
