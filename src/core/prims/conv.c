/* conv (XLA's conv_general_dilated: N spatial dims, window strides, padding,
 * lhs and rhs dilation, feature and batch groups, any layout given by dim
 * numbers) and rev (reversal along axes, which the conv transposes need to
 * flip kernels). The reference eval copies the operands to channels-last f64
 * / i64 buffers and loops over output positions and valid kernel taps; the
 * derivation of the transposes and the batching rule is written beside them.
 * Not here: fast convolution kernels (the compiler's). */
#include <stdarg.h>
#include <string.h>

#include "core/prims/contraction.h"
#include "core/prims/elementwise.h"

#define CONV_MAX_SPATIAL (NB_MAX_RANK - 2)
#define CONV_MAX_PARAM ((int64_t)1 << 40) /* bound on strides and dilations */
#define CONV_MAX_SIZE ((int64_t)1 << 56)  /* bound on |padding| and dilated sizes: every sum the rules form fits int64 */

/* ---------------------------------------------------------------- geometry */

/* One spatial dim: input W, kernel K, output Y with stride s, padding lo/hi,
 * lhs dilation a, rhs dilation d. The dilated input has (W-1)a+1 positions
 * (0 when W = 0), the padded one lo + that + hi, the dilated kernel
 * (K-1)d+1, and the output floor((padded - kernel)/s) + 1, or 0 when the
 * kernel does not fit. Output y reads, through kernel tap k, the padded
 * position y*s + k*d, which is input element x when y*s + k*d - lo = x*a. */
static int64_t dilated(int64_t n, int64_t dil) { return n == 0 ? 0 : (n - 1) * dil + 1; }

static int64_t out_size(int64_t w, int64_t k, int64_t s, int64_t lo, int64_t hi, int64_t a, int64_t d) {
  int64_t padded = dilated(w, a) + lo + hi, ke = dilated(k, d);
  return padded < ke ? 0 : (padded - ke) / s + 1;
}

/* The sizes a conv equation works with, read from its operand shapes. */
typedef struct conv_geom {
  int ns;
  int64_t N, C, O, I, G, B, Nout;
  int64_t W[CONV_MAX_SPATIAL], K[CONV_MAX_SPATIAL], Y[CONV_MAX_SPATIAL];
} conv_geom;

static conv_geom geom_of(const nb_conv_params *p, const nb_shape *ls, const nb_shape *rs) {
  conv_geom g;
  memset(&g, 0, sizeof g);
  g.ns = p->n_spatial;
  g.N = ls->dims[p->lhs_batch_dim];
  g.C = ls->dims[p->lhs_feature_dim];
  g.O = rs->dims[p->rhs_out_feature_dim];
  g.I = rs->dims[p->rhs_in_feature_dim];
  g.G = p->feature_group_count;
  g.B = p->batch_group_count;
  g.Nout = g.N / g.B;
  for (int j = 0; j < g.ns; j++) {
    g.W[j] = ls->dims[p->lhs_spatial[j]];
    g.K[j] = rs->dims[p->rhs_spatial[j]];
    g.Y[j] = out_size(g.W[j], g.K[j], p->strides[j], p->pad_lo[j], p->pad_hi[j], p->lhs_dilation[j], p->rhs_dilation[j]);
  }
  return g;
}

/* A copy with every unused slot zeroed, so equal convolutions hash equal. */
static nb_conv_prim_params canon(const nb_conv_params *src) {
  nb_conv_prim_params q;
  memset(&q, 0, sizeof q);
  nb_conv_params *p = &q.p;
  p->n_spatial = src->n_spatial;
  int ns = src->n_spatial < 0 ? 0 : src->n_spatial > CONV_MAX_SPATIAL ? CONV_MAX_SPATIAL : src->n_spatial;
  for (int j = 0; j < ns; j++) {
    p->strides[j] = src->strides[j];
    p->pad_lo[j] = src->pad_lo[j];
    p->pad_hi[j] = src->pad_hi[j];
    p->lhs_dilation[j] = src->lhs_dilation[j];
    p->rhs_dilation[j] = src->rhs_dilation[j];
    p->lhs_spatial[j] = src->lhs_spatial[j];
    p->rhs_spatial[j] = src->rhs_spatial[j];
    p->out_spatial[j] = src->out_spatial[j];
  }
  p->feature_group_count = src->feature_group_count;
  p->batch_group_count = src->batch_group_count;
  p->lhs_batch_dim = src->lhs_batch_dim;
  p->lhs_feature_dim = src->lhs_feature_dim;
  p->rhs_out_feature_dim = src->rhs_out_feature_dim;
  p->rhs_in_feature_dim = src->rhs_in_feature_dim;
  p->out_batch_dim = src->out_batch_dim;
  p->out_feature_dim = src->out_feature_dim;
  return q;
}

/* ---------------------------------------------------------------- shape rule */

/* a, b, spatial[0..ns) must be a permutation of 0..ns+1. */
static bool is_layout(int a, int b, const int *spatial, int ns) {
  bool seen[NB_MAX_RANK] = {false};
  int r = ns + 2;
  int all[NB_MAX_RANK];
  all[0] = a;
  all[1] = b;
  for (int j = 0; j < ns; j++) all[j + 2] = spatial[j];
  for (int i = 0; i < r; i++) {
    if (all[i] < 0 || all[i] >= r || seen[all[i]]) return false;
    seen[all[i]] = true;
  }
  return true;
}

static nb_status check_params(const nb_conv_params *p, char *why, size_t cap) {
  int ns = p->n_spatial;
  if (ns < 0 || ns > CONV_MAX_SPATIAL) return snprintf(why, cap, "n_spatial %d is not in [0, %d]", ns, CONV_MAX_SPATIAL), NB_ERR_INVALID_ARG;
  if (!is_layout(p->lhs_batch_dim, p->lhs_feature_dim, p->lhs_spatial, ns))
    return snprintf(why, cap, "lhs dim numbers (batch, feature, spatial) are not a permutation of 0..%d", ns + 1), NB_ERR_INVALID_ARG;
  if (!is_layout(p->rhs_out_feature_dim, p->rhs_in_feature_dim, p->rhs_spatial, ns))
    return snprintf(why, cap, "rhs dim numbers (out feature, in feature, spatial) are not a permutation of 0..%d", ns + 1), NB_ERR_INVALID_ARG;
  if (!is_layout(p->out_batch_dim, p->out_feature_dim, p->out_spatial, ns))
    return snprintf(why, cap, "out dim numbers (batch, feature, spatial) are not a permutation of 0..%d", ns + 1), NB_ERR_INVALID_ARG;
  for (int j = 0; j < ns; j++) {
    if (p->strides[j] < 1 || p->lhs_dilation[j] < 1 || p->rhs_dilation[j] < 1 || p->strides[j] > CONV_MAX_PARAM ||
        p->lhs_dilation[j] > CONV_MAX_PARAM || p->rhs_dilation[j] > CONV_MAX_PARAM)
      return snprintf(why, cap, "spatial dim %d: strides and dilations must be in [1, 2^40]", j), NB_ERR_INVALID_ARG;
    if (p->pad_lo[j] < -CONV_MAX_SIZE || p->pad_lo[j] > CONV_MAX_SIZE || p->pad_hi[j] < -CONV_MAX_SIZE ||
        p->pad_hi[j] > CONV_MAX_SIZE)
      return snprintf(why, cap, "spatial dim %d: padding out of range", j), NB_ERR_INVALID_ARG;
  }
  if (p->feature_group_count < 1 || p->batch_group_count < 1)
    return snprintf(why, cap, "feature_group_count and batch_group_count must be >= 1"), NB_ERR_INVALID_ARG;
  if (p->feature_group_count > 1 && p->batch_group_count > 1)
    return snprintf(why, cap, "feature_group_count and batch_group_count cannot both exceed 1"), NB_ERR_INVALID_ARG;
  return NB_OK;
}

/* (n-1)*dil + 1 stays below CONV_MAX_SIZE. */
static bool span_fits(int64_t n, int64_t dil) {
  int64_t m;
  return n <= 0 || (!__builtin_mul_overflow(n - 1, dil, &m) && m < CONV_MAX_SIZE);
}

static nb_status conv_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                            size_t cap) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)params)->p;
  *nout = 1;
  if (nin != 2) return snprintf(why, cap, "takes 2 operands, got %d", nin), NB_ERR_INVALID_ARG;
  nb_status st = check_params(p, why, cap);
  if (st) return st;
  int r = p->n_spatial + 2;
  if (in[0].shape.rank != r || in[1].shape.rank != r)
    return snprintf(why, cap, "lhs and rhs must have rank n_spatial + 2 = %d", r), NB_ERR_SHAPE;
  if (in[0].dtype != in[1].dtype)
    return snprintf(why, cap, "operand dtypes differ (%s vs %s)", nb_dtype_name(in[0].dtype), nb_dtype_name(in[1].dtype)), NB_ERR_DTYPE;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "bool operands are not allowed (convert first)"), NB_ERR_DTYPE;
  for (int j = 0; j < p->n_spatial; j++)
    if (!span_fits(in[0].shape.dims[p->lhs_spatial[j]], p->lhs_dilation[j]) ||
        !span_fits(in[1].shape.dims[p->rhs_spatial[j]], p->rhs_dilation[j]))
      return snprintf(why, cap, "spatial dim %d: dilated sizes exceed 2^56", j), NB_ERR_SHAPE;
  conv_geom g = geom_of(p, &in[0].shape, &in[1].shape);
  if (g.C != g.I * g.G)
    return snprintf(why, cap, "lhs features (%lld) must equal rhs in-features (%lld) * feature_group_count (%lld)",
                    (long long)g.C, (long long)g.I, (long long)g.G), NB_ERR_SHAPE;
  if (g.O % g.G || g.O % g.B)
    return snprintf(why, cap, "rhs out-features (%lld) must be divisible by the group count (%lld)", (long long)g.O,
                    (long long)(g.G > g.B ? g.G : g.B)), NB_ERR_SHAPE;
  if (g.N % g.B)
    return snprintf(why, cap, "lhs batch (%lld) must be divisible by batch_group_count (%lld)", (long long)g.N,
                    (long long)g.B), NB_ERR_SHAPE;
  for (int j = 0; j < g.ns; j++)
    if (g.K[j] < 1) return snprintf(why, cap, "kernel spatial dim %d is empty", j), NB_ERR_SHAPE;
  out[0].dtype = in[0].dtype;
  memset(&out[0].shape, 0, sizeof out[0].shape);
  out[0].shape.rank = r;
  out[0].shape.dims[p->out_batch_dim] = g.Nout;
  out[0].shape.dims[p->out_feature_dim] = g.O;
  for (int j = 0; j < g.ns; j++) out[0].shape.dims[p->out_spatial[j]] = g.Y[j];
  return NB_OK;
}

/* ---------------------------------------------------------------- reference eval */

/* For output position y (row-major over Y), the taps that hit the input:
 * kernel offsets (row-major over K) and input offsets (row-major over W).
 * Returns their count. */
static int64_t valid_taps(const nb_conv_params *p, const conv_geom *g, int64_t y, int64_t ktot, int64_t *kk, int64_t *xx) {
  int64_t yc[CONV_MAX_SPATIAL], n = 0;
  for (int j = g->ns - 1; j >= 0; j--) {
    yc[j] = y % g->Y[j];
    y /= g->Y[j];
  }
  for (int64_t k = 0; k < ktot; k++) {
    int64_t rest = k, x = 0, stride = 1;
    bool ok = true;
    for (int j = g->ns - 1; j >= 0 && ok; j--) {
      int64_t kj = rest % g->K[j];
      rest /= g->K[j];
      int64_t pos = yc[j] * p->strides[j] + kj * p->rhs_dilation[j] - p->pad_lo[j];
      ok = pos >= 0 && pos % p->lhs_dilation[j] == 0 && pos / p->lhs_dilation[j] < g->W[j];
      x += (ok ? pos / p->lhs_dilation[j] : 0) * stride;
      stride *= g->W[j];
    }
    if (ok) {
      kk[n] = k;
      xx[n++] = x;
    }
  }
  return n;
}

/* out[n', o, y] = sum over taps (k, x) and i < I of
 *   lhs[b*Nout + n', g*I + i, x] * rhs[o, i, k],  g = o / (O/G), b = o / (O/B),
 * with lhs held as [N, W..., C] and rhs as [O, K..., I]. */
static nb_status conv_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  conv_geom g = geom_of(p, &e->in[0]->aval.shape, &e->in[1]->aval.shape);
  int lperm[NB_MAX_RANK], rperm[NB_MAX_RANK], ns = g.ns;
  lperm[0] = p->lhs_batch_dim;
  rperm[0] = p->rhs_out_feature_dim;
  for (int j = 0; j < ns; j++) {
    lperm[j + 1] = p->lhs_spatial[j];
    rperm[j + 1] = p->rhs_spatial[j];
  }
  lperm[ns + 1] = p->lhs_feature_dim;
  rperm[ns + 1] = p->rhs_in_feature_dim;
  int64_t wtot = 1, ktot = 1, ytot = 1;
  for (int j = 0; j < ns; j++) wtot *= g.W[j], ktot *= g.K[j], ytot *= g.Y[j];
  bool fl = nb_dtype_is_float(e->in[0]->aval.dtype);
  nb__acc_buf lb = {0}, rb = {0}, taps = {0};
  bool ok = nb__acc_alloc(ctx, &lb, fl, nb_array_size(in[0])) && nb__acc_alloc(ctx, &rb, fl, nb_array_size(in[1])) &&
            nb__acc_alloc(ctx, &taps, false, 2 * ktot);
  if (!ok) {
    nb__acc_free(ctx, &lb);
    nb__acc_free(ctx, &rb);
    nb__acc_free(ctx, &taps);
    return NB_ERR_NOMEM;
  }
  nb__acc_load_permuted(&lb, in[0], lperm);
  nb__acc_load_permuted(&rb, in[1], rperm);
  int64_t ostr[NB_MAX_RANK], *kk = taps.p, *xx = kk + ktot;
  nb__strides(&e->out[0]->aval.shape, ostr);
  nb_dtype to = nb_array_dtype(out[0]);
  void *dst = nb_array_data_mut(out[0]);
  int64_t og = g.O / g.G, ob = g.O / g.B;
  for (int64_t y = 0; y < ytot; y++) {
    int64_t ntaps = valid_taps(p, &g, y, ktot, kk, xx), yoff = 0, rest = y;
    for (int j = ns - 1; j >= 0; j--) {
      yoff += (rest % g.Y[j]) * ostr[p->out_spatial[j]];
      rest /= g.Y[j];
    }
    for (int64_t n = 0; n < g.Nout; n++)
      for (int64_t o = 0; o < g.O; o++) {
        int64_t cbase = (o / og) * g.I, nin = (o / ob) * g.Nout + n;
        double acc = 0;
        uint64_t iacc = 0;
        for (int64_t t = 0; t < ntaps; t++) {
          int64_t lo = (nin * wtot + xx[t]) * g.C + cbase, ro = (o * ktot + kk[t]) * g.I;
          if (fl) acc += nb__dot_f64((const double *)lb.p + lo, (const double *)rb.p + ro, g.I);
          else iacc += (uint64_t)nb__dot_i64((const int64_t *)lb.p + lo, (const int64_t *)rb.p + ro, g.I);
        }
        int64_t at = n * ostr[p->out_batch_dim] + o * ostr[p->out_feature_dim] + yoff;
        if (fl) nb__store_f64(to, dst, at, acc);
        else nb__store_i64(to, dst, at, (int64_t)iacc);
      }
  }
  nb__acc_free(ctx, &lb);
  nb__acc_free(ctx, &rb);
  nb__acc_free(ctx, &taps);
  return NB_OK;
}

/* ---------------------------------------------------------------- derivatives */

static nb_val *emit_conv(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_conv_prim_params *q) {
  nb_val *ops[2] = {lhs, rhs};
  return nb__emit1(lhs->g, loc, NB_PRIM_conv, 2, ops, q, sizeof *q);
}

/* x with dim d (size h*m) split into [h, m] (rank + 1). */
static nb_val *split_dim(nb_loc loc, nb_val *x, int d, int64_t h) {
  int r = x->aval.shape.rank;
  int64_t dims[NB_MAX_RANK + 1];
  for (int i = 0, k = 0; i < r; i++) {
    if (i == d) {
      dims[k++] = h;
      dims[k++] = x->aval.shape.dims[i] / h;
    } else {
      dims[k++] = x->aval.shape.dims[i];
    }
  }
  return nb_reshape_at(loc, x, r + 1, dims);
}

/* x with dims d and d+1 merged into one (rank - 1). */
static nb_val *merge_dims(nb_loc loc, nb_val *x, int d) {
  int r = x->aval.shape.rank;
  int64_t dims[NB_MAX_RANK];
  for (int i = 0, k = 0; i < r; i++) {
    if (i == d + 1) continue;
    dims[k++] = i == d ? x->aval.shape.dims[d] * x->aval.shape.dims[d + 1] : x->aval.shape.dims[i];
  }
  return nb_reshape_at(loc, x, r - 1, dims);
}

/* x with dims d and d+1 exchanged. */
static nb_val *swap_dims(nb_loc loc, nb_val *x, int d) {
  int perm[NB_MAX_RANK];
  for (int i = 0; i < x->aval.shape.rank; i++) perm[i] = i;
  perm[d] = d + 1;
  perm[d + 1] = d;
  return nb_transpose_at(loc, x, perm);
}

static bool rank_fits(nb_graph *g, nb_loc loc, int rank, const char *what) {
  if (rank <= NB_MAX_RANK) return true;
  nb__fail(g, loc, NB_ERR_UNIMPLEMENTED, "conv: %s needs a rank-%d intermediate, above NB_MAX_RANK (%d)", what, rank, NB_MAX_RANK);
  return false;
}

/* Cotangent of lhs. Per spatial dim, out[y] = sum over x*a + lo = y*s + k*d of
 * x[x] w[k]. Transposed: ct_x[x] = sum over y*s = x*a + lo - k*d of ct[y] w[k].
 * Flipping the kernel (k' = K-1-k) turns the condition into
 * y*s = x*a + k'*d - (Ke-1-lo), Ke = (K-1)d+1: a conv of ct (lhs dilation s)
 * with the flipped kernel (rhs dilation d), stride a and low padding Ke-1-lo;
 * the high padding is chosen so the output has exactly W positions:
 * hi = (W-1)a + Ke - (Y-1)s - 1 - lo'. Padding that is negative only crops ct
 * positions no output reads.
 * Features: ct's O features contract, the kernel maps them to lhs features.
 * With G = B = 1 that is w itself with its two feature dims exchanged. With
 * feature groups, lhs feature c = g*I + i receives ct features g*(O/G) + j
 * through w[g*(O/G) + j, i]: a grouped conv (G groups) whose kernel
 * [G*I, O/G, K...] is w reshaped to [G, O/G, I, K...] with the middle pair
 * exchanged. Batch groups (B) work the same way with B groups over ct's
 * features, producing [Nout, B*C, ...]; lhs batch b*Nout + n is output batch
 * n, feature block b, so the B factor is moved from the feature dim to the
 * front of the batch dim. */
static nb_val *conv_ct_lhs(nb_graph *gr, const nb_eqn *e, nb_val *ct, nb_val *w) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  nb_loc loc = e->loc;
  const nb_shape *ls = &e->in[0]->aval.shape;
  conv_geom g = geom_of(p, ls, &e->in[1]->aval.shape);
  if (nb_shape_size(ls) == 0 || nb_shape_size(&ct->aval.shape) == 0 || nb_shape_size(&w->aval.shape) == 0)
    return nb__zeros(gr, e->in[0]->aval);
  int ns = g.ns, r = ns + 2, spatial[CONV_MAX_SPATIAL];
  int64_t H = g.G > g.B ? g.G : g.B;
  nb_conv_prim_params q = canon(p);
  nb_conv_params *t = &q.p;
  t->feature_group_count = H;
  t->batch_group_count = 1;
  for (int j = 0; j < ns; j++) {
    int64_t ke = dilated(g.K[j], p->rhs_dilation[j]);
    t->strides[j] = p->lhs_dilation[j];
    t->lhs_dilation[j] = p->strides[j];
    t->pad_lo[j] = ke - 1 - p->pad_lo[j];
    t->pad_hi[j] = (g.W[j] - 1) * p->lhs_dilation[j] + ke - dilated(g.Y[j], p->strides[j]) - t->pad_lo[j];
    t->lhs_spatial[j] = p->out_spatial[j];
  }
  t->lhs_batch_dim = p->out_batch_dim;
  t->lhs_feature_dim = p->out_feature_dim;
  nb_val *k;
  if (H == 1) { /* w as is, its feature dims exchanged */
    for (int j = 0; j < ns; j++) spatial[j] = p->rhs_spatial[j];
    k = nb_rev_at(loc, w, ns, spatial);
    t->rhs_out_feature_dim = p->rhs_in_feature_dim;
    t->rhs_in_feature_dim = p->rhs_out_feature_dim;
  } else { /* [O, I, K...] -> [H, O/H, I, K...] -> [H, I, O/H, K...] -> [H*I, O/H, K...] */
    if (!rank_fits(gr, loc, r + 1, "the transpose of a grouped conv")) return nb__poison(gr);
    int perm[NB_MAX_RANK];
    perm[0] = p->rhs_out_feature_dim;
    perm[1] = p->rhs_in_feature_dim;
    for (int j = 0; j < ns; j++) perm[j + 2] = p->rhs_spatial[j], spatial[j] = j + 2;
    k = merge_dims(loc, swap_dims(loc, split_dim(loc, nb_transpose_at(loc, w, perm), 0, H), 1), 0);
    k = nb_rev_at(loc, k, ns, spatial);
    t->rhs_out_feature_dim = 0;
    t->rhs_in_feature_dim = 1;
  }
  for (int j = 0; j < ns; j++) t->rhs_spatial[j] = (H == 1 ? p->rhs_spatial[j] : j + 2);
  if (g.B == 1) { /* the result comes out in lhs's layout */
    t->out_batch_dim = p->lhs_batch_dim;
    t->out_feature_dim = p->lhs_feature_dim;
    for (int j = 0; j < ns; j++) t->out_spatial[j] = p->lhs_spatial[j];
    return emit_conv(loc, ct, k, &q);
  }
  /* canonical [Nout, B*C, W...] -> [Nout, B, C, W...] -> [B, Nout, C, W...] -> [N, C, W...] -> lhs layout */
  t->out_batch_dim = 0;
  t->out_feature_dim = 1;
  for (int j = 0; j < ns; j++) t->out_spatial[j] = j + 2;
  nb_val *z = emit_conv(loc, ct, k, &q);
  z = merge_dims(loc, swap_dims(loc, split_dim(loc, z, 1, g.B), 0), 0);
  int back[NB_MAX_RANK];
  back[p->lhs_batch_dim] = 0;
  back[p->lhs_feature_dim] = 1;
  for (int j = 0; j < ns; j++) back[p->lhs_spatial[j]] = j + 2;
  return nb_transpose_at(loc, z, back);
}

/* Cotangent of rhs. Per spatial dim, ct_w[k] = sum over x*a + lo = y*s + k*d
 * of ct[y] x[x]: a conv of x (lhs dilation a, padding lo) with ct as the
 * kernel (rhs dilation s) at stride d, with high padding making exactly K
 * outputs: hi = (K-1)d + (Y-1)s + 1 - ((W-1)a + 1) - lo.
 * Roles of the non-spatial dims: the sum over the batch n becomes the
 * contraction, so x's batch dim is the new feature dim and ct's batch dim the
 * kernel's in-feature dim; x's feature dim becomes the new batch dim and ct's
 * features the new out-features; the result [I, O, K...] is written straight
 * into rhs's layout. Feature groups G: out-feature o only pairs with lhs
 * features g(o)*I + i, which is what batch_group_count = G does to the new
 * batch dim. Batch groups B: o only pairs with lhs batch b(o)*Nout + n, which
 * is feature_group_count = B over the new feature dim. So G and B swap. */
static nb_val *conv_ct_rhs(nb_graph *gr, const nb_eqn *e, nb_val *ct, nb_val *x) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  const nb_shape *rs = &e->in[1]->aval.shape;
  conv_geom g = geom_of(p, &e->in[0]->aval.shape, rs);
  if (nb_shape_size(rs) == 0 || nb_shape_size(&ct->aval.shape) == 0 || nb_shape_size(&x->aval.shape) == 0)
    return nb__zeros(gr, e->in[1]->aval);
  nb_conv_prim_params q = canon(p);
  nb_conv_params *t = &q.p;
  t->feature_group_count = g.B;
  t->batch_group_count = g.G;
  for (int j = 0; j < g.ns; j++) {
    t->strides[j] = p->rhs_dilation[j];
    t->rhs_dilation[j] = p->strides[j];
    t->pad_hi[j] = dilated(g.K[j], p->rhs_dilation[j]) - 1 + dilated(g.Y[j], p->strides[j]) -
                   dilated(g.W[j], p->lhs_dilation[j]) - p->pad_lo[j];
    t->rhs_spatial[j] = p->out_spatial[j];
    t->out_spatial[j] = p->rhs_spatial[j];
  }
  t->lhs_batch_dim = p->lhs_feature_dim;
  t->lhs_feature_dim = p->lhs_batch_dim;
  t->rhs_out_feature_dim = p->out_feature_dim;
  t->rhs_in_feature_dim = p->out_batch_dim;
  t->out_batch_dim = p->rhs_in_feature_dim;
  t->out_feature_dim = p->rhs_out_feature_dim;
  return emit_conv(e->loc, x, ct, &q);
}

static nb_status conv_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                                nb_val *const *ct, nb_val **ct_in) {
  ct_in[0] = ct_in[1] = NULL;
  if (linear[0] && linear[1])
    return nb__fail(g, e->loc, NB_ERR_INTERNAL, "conv: transpose with both operands linear"), NB_ERR_INTERNAL;
  if (!ct[0]) return NB_OK;
  if (linear[0]) ct_in[0] = conv_ct_lhs(g, e, ct[0], in[1]);
  if (linear[1]) ct_in[1] = conv_ct_rhs(g, e, ct[0], in[0]);
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- vmap */

/* Folds the vmap axis (at bdim of x, size V) into x's dim d (unbatched
 * numbering, size n) as [h, V, n/h] merged: V sits inside each of h
 * contiguous groups (h = 1: V outermost). */
static nb_val *fold_in(nb_graph *g, nb_loc loc, nb_val *x, int bdim, int d, int64_t h) {
  x = nb__move_axis(loc, x, bdim, d); /* [.., V, n, ..] */
  if (h == 1) return merge_dims(loc, x, d);
  if (!rank_fits(g, loc, x->aval.shape.rank + 1, "vmap of a grouped conv")) return nb__poison(g);
  x = split_dim(loc, x, d + 1, h); /* [.., V, h, n/h, ..] */
  return merge_dims(loc, merge_dims(loc, swap_dims(loc, x, d), d), d);
}

/* Inverse of fold_in on a result: dim d of size h*V*m becomes [V, h*m]. */
static nb_val *split_out(nb_graph *g, nb_loc loc, nb_val *y, int d, int64_t v, int64_t h) {
  if (h == 1) return split_dim(loc, y, d, v);
  if (!rank_fits(g, loc, y->aval.shape.rank + 2, "vmap of a grouped conv")) return nb__poison(g);
  y = split_dim(loc, split_dim(loc, y, d, h), d + 1, v); /* [.., h, V, m, ..] */
  return merge_dims(loc, swap_dims(loc, y, d), d + 1);
}

/* lhs batched: V joins the batch dim (inside each of the B batch groups), the
 * result's batch dim splits back. rhs batched: V joins the out-features
 * (inside each of the G or B groups), the result's feature dim splits back.
 * Both batched: V becomes extra groups, V outermost in the lhs feature (or,
 * with batch groups, batch) dim and in the rhs out-feature dim, so group
 * v*G + g pairs lhs block v with kernel block v. */
static nb_status conv_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t v,
                            nb_val **out, int *out_bdims) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  nb_loc loc = e->loc;
  nb_conv_prim_params q = canon(p);
  int64_t G = p->feature_group_count, B = p->batch_group_count, H = G > B ? G : B;
  nb_val *x = in[0], *w = in[1], *y;
  if (bdims[1] < 0) {
    x = fold_in(g, loc, x, bdims[0], p->lhs_batch_dim, B);
    y = split_out(g, loc, emit_conv(loc, x, w, &q), p->out_batch_dim, v, 1);
    out_bdims[0] = p->out_batch_dim;
  } else if (bdims[0] < 0) {
    w = fold_in(g, loc, w, bdims[1], p->rhs_out_feature_dim, H);
    y = split_out(g, loc, emit_conv(loc, x, w, &q), p->out_feature_dim, v, H);
    out_bdims[0] = p->out_feature_dim;
  } else {
    x = fold_in(g, loc, x, bdims[0], B == 1 ? p->lhs_feature_dim : p->lhs_batch_dim, 1);
    w = fold_in(g, loc, w, bdims[1], p->rhs_out_feature_dim, 1);
    if (B == 1) q.p.feature_group_count = v * G;
    else q.p.batch_group_count = v * B;
    y = split_out(g, loc, emit_conv(loc, x, w, &q), p->out_feature_dim, v, 1);
    out_bdims[0] = p->out_feature_dim;
  }
  out[0] = y;
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- cost, printing, rules */

static void conv_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  const nb_shape *ls = &e->in[0]->aval.shape, *rs = &e->in[1]->aval.shape, *os = &e->out[0]->aval.shape;
  double taps = (double)rs->dims[p->rhs_in_feature_dim];
  for (int j = 0; j < p->n_spatial; j++) taps *= (double)rs->dims[p->rhs_spatial[j]];
  double es = (double)nb_dtype_size(e->in[0]->aval.dtype);
  *flops = 2 * (double)nb_shape_size(os) * taps;
  *bytes = ((double)nb_shape_size(ls) + (double)nb_shape_size(rs) + (double)nb_shape_size(os)) * es;
}

static void catf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void catf(char *buf, size_t cap, const char *fmt, ...) {
  size_t k = strlen(buf);
  if (k + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + k, cap - k, fmt, ap);
  va_end(ap);
}

/* Appends " label=(a0,a1)" or, with b, " label=((a0,b0),(a1,b1))". */
static void append_list(char *buf, size_t cap, const char *label, int n, const int64_t *a, const int64_t *b) {
  catf(buf, cap, "%s%s=(", buf[0] ? " " : "", label);
  for (int i = 0; i < n; i++) {
    if (b) catf(buf, cap, "%s(%lld,%lld)", i ? "," : "", (long long)a[i], (long long)b[i]);
    else catf(buf, cap, "%s%lld", i ? "," : "", (long long)a[i]);
  }
  catf(buf, cap, ")");
}

static void append_layout(char *buf, size_t cap, const char *label, int a, int b, const int *sp, int ns) {
  int64_t all[NB_MAX_RANK];
  all[0] = a;
  all[1] = b;
  for (int j = 0; j < ns; j++) all[j + 2] = sp[j];
  append_list(buf, cap, label, ns + 2, all, NULL);
}

static void conv_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_conv_params *p = &((const nb_conv_prim_params *)e->params)->p;
  int ns = p->n_spatial;
  append_list(buf, cap, "strides", ns, p->strides, NULL);
  append_list(buf, cap, "padding", ns, p->pad_lo, p->pad_hi);
  append_list(buf, cap, "lhs_dilation", ns, p->lhs_dilation, NULL);
  append_list(buf, cap, "rhs_dilation", ns, p->rhs_dilation, NULL);
  catf(buf, cap, " feature_groups=%lld batch_groups=%lld", (long long)p->feature_group_count,
       (long long)p->batch_group_count);
  append_layout(buf, cap, "lhs", p->lhs_batch_dim, p->lhs_feature_dim, p->lhs_spatial, ns);
  append_layout(buf, cap, "rhs", p->rhs_out_feature_dim, p->rhs_in_feature_dim, p->rhs_spatial, ns);
  append_layout(buf, cap, "out", p->out_batch_dim, p->out_feature_dim, p->out_spatial, ns);
}

const nb_prim_rules nb__prim_conv = {
    .name = "conv",
    .kind = NB_KIND_CONTRACTION,
    .params_size = sizeof(nb_conv_prim_params),
    .infer = conv_infer,
    .eval = conv_eval,
    .jvp = nb__bilinear_jvp,
    .transpose = conv_transpose,
    .batch = conv_batch,
    .cost = conv_cost,
    .print_params = conv_print,
};

/* ---------------------------------------------------------------- rev */

static nb_status rev_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_rev_params *p = params;
  *nout = 1;
  if (nin != 1) return snprintf(why, cap, "takes 1 operand, got %d", nin), NB_ERR_INVALID_ARG;
  for (int i = 0; i < p->naxes; i++)
    if (p->axes[i] < 0 || p->axes[i] >= in[0].shape.rank || (i && p->axes[i] <= p->axes[i - 1]))
      return snprintf(why, cap, "axes must be distinct, increasing and in [0, %d)", in[0].shape.rank), NB_ERR_INVALID_ARG;
  out[0] = in[0];
  return NB_OK;
}

static nb_status rev_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_rev_params *p = e->params;
  const nb_shape *s = &e->in[0]->aval.shape;
  bool flip[NB_MAX_RANK] = {false};
  for (int i = 0; i < p->naxes; i++) flip[p->axes[i]] = true;
  int64_t str[NB_MAX_RANK], n = nb_shape_size(s);
  nb__strides(s, str);
  size_t es = nb_dtype_size(nb_array_dtype(out[0]));
  const char *x = nb_array_data(in[0]);
  char *y = nb_array_data_mut(out[0]);
  for (int64_t o = 0; o < n; o++) {
    int64_t src = 0;
    for (int d = 0; d < s->rank; d++) {
      int64_t c = (o / str[d]) % s->dims[d];
      src += (flip[d] ? s->dims[d] - 1 - c : c) * str[d];
    }
    memcpy(y + o * (int64_t)es, x + src * (int64_t)es, es);
  }
  return NB_OK;
}

static nb_status rev_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs,
                         nb_val **ot) {
  ot[0] = t[0] ? nb__reemit(g, e, t) : NULL;
  return nb_graph_status(g);
}

static nb_status rev_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct,
                               nb_val **ct_in) {
  ct_in[0] = ct[0] ? nb__reemit(g, e, ct) : NULL; /* its own inverse and transpose */
  return nb_graph_status(g);
}

static nb_status rev_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                           int *out_bdims) {
  nb_rev_params q = *(const nb_rev_params *)e->params;
  for (int i = 0; i < q.naxes; i++) q.axes[i]++;
  nb_val *x = nb__move_axis(e->loc, in[0], bdims[0], 0);
  out[0] = nb__emit1(g, e->loc, NB_PRIM_rev, 1, &x, &q, sizeof q);
  out_bdims[0] = 0;
  return nb_graph_status(g);
}

static void rev_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_rev_params *p = e->params;
  int64_t a[NB_MAX_RANK];
  for (int i = 0; i < p->naxes; i++) a[i] = p->axes[i];
  append_list(buf, cap, "axes", p->naxes, a, NULL);
}

const nb_prim_rules nb__prim_rev = {
    .name = "rev",
    .kind = NB_KIND_LAYOUT,
    .params_size = sizeof(nb_rev_params),
    .infer = rev_infer,
    .eval = rev_eval,
    .jvp = rev_jvp,
    .transpose = rev_transpose,
    .batch = rev_batch,
    .print_params = rev_print,
};

/* ---------------------------------------------------------------- public ops */

nb_conv_params nb_conv_params_default(int n_spatial, const int64_t *strides, const int64_t *padding) {
  nb_conv_params p;
  memset(&p, 0, sizeof p);
  p.n_spatial = n_spatial;
  int ns = n_spatial < 0 ? 0 : n_spatial > CONV_MAX_SPATIAL ? CONV_MAX_SPATIAL : n_spatial;
  for (int j = 0; j < ns; j++) {
    p.strides[j] = strides ? strides[j] : 1;
    p.pad_lo[j] = p.pad_hi[j] = padding ? padding[j] : 0;
    p.lhs_dilation[j] = p.rhs_dilation[j] = 1;
    p.lhs_spatial[j] = p.rhs_spatial[j] = p.out_spatial[j] = j + 2;
  }
  p.feature_group_count = p.batch_group_count = 1;
  p.lhs_batch_dim = 0;
  p.lhs_feature_dim = 1;
  p.rhs_out_feature_dim = 0;
  p.rhs_in_feature_dim = 1;
  p.out_batch_dim = 0;
  p.out_feature_dim = 1;
  return p;
}

nb_val *nb_conv_at(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_conv_params *p) {
  nb_val *ops[2] = {lhs, rhs};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!lhs || !rhs) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "conv: NULL operand");
  if (nb_graph_status(g)) return nb__poison(g);
  if (!p) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "conv: NULL params");
  nb_conv_prim_params q = canon(p);
  return emit_conv(loc, lhs, rhs, &q);
}

nb_val *nb_rev_at(nb_loc loc, nb_val *x, int naxes, const int *axes) {
  if (!x || nb__is_poison(x)) return x;
  int r = x->aval.shape.rank;
  if (naxes < 0 || naxes > r || (naxes && !axes))
    return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "rev: %d axes for a rank-%d operand", naxes, r);
  bool sel[NB_MAX_RANK] = {false};
  for (int i = 0; i < naxes; i++) {
    int a = nb__norm_axis(axes[i], r);
    if (a < 0) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "rev: axis %d out of range for rank %d", axes[i], r);
    if (sel[a]) return nb__fail(x->g, loc, NB_ERR_INVALID_ARG, "rev: axis %d repeated", axes[i]);
    sel[a] = true;
  }
  nb_rev_params p;
  memset(&p, 0, sizeof p);
  for (int d = 0; d < r; d++)
    if (sel[d] && x->aval.shape.dims[d] > 1) p.axes[p.naxes++] = d; /* flipping a size-1 dim is a no-op */
  if (p.naxes == 0) return x;
  return nb__emit1(x->g, loc, NB_PRIM_rev, 1, &x, &p, sizeof p);
}
