/* dot_general (XLA's DotGeneral: batch and contracting dims, result dims
 * (batch..., lhs free..., rhs free...)) and nb_matmul, NumPy's matmul built on
 * it. The reference eval copies both operands into canonical [B, M, K] and
 * [B, N, K] buffers (f64 for floats, i64 with wraparound for integers) and
 * runs contiguous dot products. Also here: the accumulation buffers that
 * conv.c shares (contraction.h). Not here: convolutions, fast kernels. */
#include <string.h>

#include "core/prims/contraction.h"
#include "core/prims/elementwise.h"

/* ---------------------------------------------------------------- accumulation buffers */

bool nb__acc_alloc(nb_ctx *ctx, nb__acc_buf *b, bool is_float, int64_t n) {
  b->is_float = is_float;
  b->n = n;
  b->p = nb_alloc(ctx, (size_t)n * 8);
  return b->p != NULL;
}

void nb__acc_free(nb_ctx *ctx, nb__acc_buf *b) {
  nb_dealloc(ctx, b->p, (size_t)b->n * 8);
  b->p = NULL;
}

void nb__acc_load_permuted(nb__acc_buf *b, const nb_array *a, const int *perm) {
  nb_aval av = nb_array_aval(a);
  int r = av.shape.rank;
  int64_t str[NB_MAX_RANK], dims[NB_MAX_RANK], pstr[NB_MAX_RANK], idx[NB_MAX_RANK] = {0};
  nb__strides(&av.shape, str);
  for (int j = 0; j < r; j++) {
    dims[j] = av.shape.dims[perm[j]];
    pstr[j] = str[perm[j]];
  }
  const void *x = nb_array_data(a);
  int64_t n = nb_shape_size(&av.shape), src = 0;
  for (int64_t o = 0; o < n; o++) {
    if (b->is_float) ((double *)b->p)[o] = nb__load_f64(av.dtype, x, src);
    else ((int64_t *)b->p)[o] = nb__load_i64(av.dtype, x, src);
    for (int j = r - 1; j >= 0; j--) { /* odometer over the destination's dims */
      src += pstr[j];
      if (++idx[j] < dims[j]) break;
      src -= pstr[j] * dims[j];
      idx[j] = 0;
    }
  }
}

double nb__dot_f64(const double *x, const double *y, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; k++) s += x[k] * y[k];
  return s;
}

int64_t nb__dot_i64(const int64_t *x, const int64_t *y, int64_t n) {
  uint64_t s = 0;
  for (int64_t k = 0; k < n; k++) s += (uint64_t)x[k] * (uint64_t)y[k];
  return (int64_t)s;
}

/* ---------------------------------------------------------------- dimension bookkeeping */

/* One operand's view of the dot: its batch, contracting and free dims (free
 * dims ascending), as the result and the canonical buffers order them. */
typedef struct side {
  int rank, nb, nc, nf;
  int batch[NB_MAX_RANK], contract[NB_MAX_RANK], free[NB_MAX_RANK];
} side;

static side side_of(const nb_dot_dims *dn, int rank, bool lhs) {
  side s;
  memset(&s, 0, sizeof s);
  s.rank = rank;
  s.nb = dn->n_batch;
  s.nc = dn->n_contract;
  bool used[NB_MAX_RANK] = {false};
  for (int i = 0; i < dn->n_batch; i++) used[s.batch[i] = lhs ? dn->lhs_batch[i] : dn->rhs_batch[i]] = true;
  for (int i = 0; i < dn->n_contract; i++) used[s.contract[i] = lhs ? dn->lhs_contract[i] : dn->rhs_contract[i]] = true;
  for (int d = 0; d < rank; d++)
    if (!used[d]) s.free[s.nf++] = d;
  return s;
}

/* Canonical buffer order of one operand: batch..., free..., contract... */
static void canonical_perm(const side *s, int *perm) {
  int k = 0;
  for (int i = 0; i < s->nb; i++) perm[k++] = s->batch[i];
  for (int i = 0; i < s->nf; i++) perm[k++] = s->free[i];
  for (int i = 0; i < s->nc; i++) perm[k++] = s->contract[i];
}

static int64_t prod_dims(const nb_shape *s, int n, const int *dims) {
  int64_t p = 1;
  for (int i = 0; i < n; i++) p *= s->dims[dims[i]];
  return p;
}

/* Checks one operand's dim lists: in range, no dim used twice. */
static bool check_side(const nb_dot_dims *dn, int rank, bool lhs, char *why, size_t cap) {
  const char *name = lhs ? "lhs" : "rhs";
  bool used[NB_MAX_RANK] = {false};
  for (int i = 0; i < dn->n_batch + dn->n_contract; i++) {
    bool is_batch = i < dn->n_batch;
    int d = is_batch ? (lhs ? dn->lhs_batch[i] : dn->rhs_batch[i])
                     : (lhs ? dn->lhs_contract[i - dn->n_batch] : dn->rhs_contract[i - dn->n_batch]);
    if (d < 0 || d >= rank)
      return snprintf(why, cap, "%s %s dim %d out of range for rank %d", name, is_batch ? "batch" : "contracting", d, rank), false;
    if (used[d]) return snprintf(why, cap, "%s dim %d is used twice", name, d), false;
    used[d] = true;
  }
  return true;
}

static bool same_kind(nb_dtype a, nb_dtype b) { return nb_dtype_is_float(a) == nb_dtype_is_float(b); }

/* ---------------------------------------------------------------- dot_general rules */

static nb_status dot_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                           size_t cap) {
  const nb_dot_params *p = params;
  const nb_dot_dims *dn = &p->dn;
  *nout = 1;
  if (nin != 2) return snprintf(why, cap, "takes 2 operands, got %d", nin), NB_ERR_INVALID_ARG;
  if (in[0].dtype != in[1].dtype)
    return snprintf(why, cap, "operand dtypes differ (%s vs %s)", nb_dtype_name(in[0].dtype), nb_dtype_name(in[1].dtype)),
           NB_ERR_DTYPE;
  if (in[0].dtype == NB_BOOL) return snprintf(why, cap, "bool operands are not allowed (convert first)"), NB_ERR_DTYPE;
  if (p->out_dtype < 0 || p->out_dtype >= NB_DTYPE_COUNT || p->out_dtype == NB_BOOL || !same_kind(p->out_dtype, in[0].dtype))
    return snprintf(why, cap, "out_dtype must be %s dtype like the operands", nb_dtype_is_float(in[0].dtype) ? "a float" : "an integer"),
           NB_ERR_DTYPE;
  int rl = in[0].shape.rank, rr = in[1].shape.rank;
  if (dn->n_batch < 0 || dn->n_contract < 0 || dn->n_batch + dn->n_contract > (rl < rr ? rl : rr))
    return snprintf(why, cap, "%d batch + %d contracting dims do not fit the ranks", dn->n_batch, dn->n_contract), NB_ERR_INVALID_ARG;
  if (!check_side(dn, rl, true, why, cap) || !check_side(dn, rr, false, why, cap)) return NB_ERR_INVALID_ARG;
  for (int i = 0; i < dn->n_batch; i++)
    if (in[0].shape.dims[dn->lhs_batch[i]] != in[1].shape.dims[dn->rhs_batch[i]])
      return snprintf(why, cap, "batch dims lhs %d (%lld) and rhs %d (%lld) differ", dn->lhs_batch[i],
                      (long long)in[0].shape.dims[dn->lhs_batch[i]], dn->rhs_batch[i],
                      (long long)in[1].shape.dims[dn->rhs_batch[i]]), NB_ERR_SHAPE;
  for (int i = 0; i < dn->n_contract; i++)
    if (in[0].shape.dims[dn->lhs_contract[i]] != in[1].shape.dims[dn->rhs_contract[i]])
      return snprintf(why, cap, "contracting dims lhs %d (%lld) and rhs %d (%lld) differ", dn->lhs_contract[i],
                      (long long)in[0].shape.dims[dn->lhs_contract[i]], dn->rhs_contract[i],
                      (long long)in[1].shape.dims[dn->rhs_contract[i]]), NB_ERR_SHAPE;
  side l = side_of(dn, rl, true), r = side_of(dn, rr, false);
  int ro = l.nb + l.nf + r.nf;
  if (ro > NB_MAX_RANK) return snprintf(why, cap, "result rank %d exceeds %d", ro, NB_MAX_RANK), NB_ERR_SHAPE;
  out[0].dtype = p->out_dtype;
  memset(&out[0].shape, 0, sizeof out[0].shape);
  out[0].shape.rank = ro;
  for (int i = 0; i < l.nb; i++) out[0].shape.dims[i] = in[0].shape.dims[l.batch[i]];
  for (int i = 0; i < l.nf; i++) out[0].shape.dims[l.nb + i] = in[0].shape.dims[l.free[i]];
  for (int i = 0; i < r.nf; i++) out[0].shape.dims[l.nb + l.nf + i] = in[1].shape.dims[r.free[i]];
  return NB_OK;
}

/* out[b, m, n] = sum_k lhs[b, m, k] * rhs[b, n, k] in the canonical buffers;
 * the result's row-major order is exactly [b, m, n]. */
static nb_status dot_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_dot_params *p = e->params;
  const nb_shape *ls = &e->in[0]->aval.shape, *rs = &e->in[1]->aval.shape;
  side l = side_of(&p->dn, ls->rank, true), r = side_of(&p->dn, rs->rank, false);
  int64_t B = prod_dims(ls, l.nb, l.batch), M = prod_dims(ls, l.nf, l.free), N = prod_dims(rs, r.nf, r.free);
  int64_t K = prod_dims(ls, l.nc, l.contract);
  int lperm[NB_MAX_RANK], rperm[NB_MAX_RANK];
  canonical_perm(&l, lperm);
  canonical_perm(&r, rperm);
  bool fl = nb_dtype_is_float(e->in[0]->aval.dtype);
  nb__acc_buf a, b;
  if (!nb__acc_alloc(ctx, &a, fl, B * M * K)) return NB_ERR_NOMEM;
  if (!nb__acc_alloc(ctx, &b, fl, B * N * K)) return nb__acc_free(ctx, &a), NB_ERR_NOMEM;
  nb__acc_load_permuted(&a, in[0], lperm);
  nb__acc_load_permuted(&b, in[1], rperm);
  nb_dtype to = nb_array_dtype(out[0]);
  void *y = nb_array_data_mut(out[0]);
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        int64_t o = (bi * M + m) * N + n, ao = (bi * M + m) * K, bo = (bi * N + n) * K;
        if (fl) nb__store_f64(to, y, o, nb__dot_f64((const double *)a.p + ao, (const double *)b.p + bo, K));
        else nb__store_i64(to, y, o, nb__dot_i64((const int64_t *)a.p + ao, (const int64_t *)b.p + bo, K));
      }
  nb__acc_free(ctx, &a);
  nb__acc_free(ctx, &b);
  return NB_OK;
}

static nb_val *emit_dot(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_dot_params *p) {
  nb_val *ops[2] = {lhs, rhs};
  return nb__emit1(lhs->g, loc, NB_PRIM_dot_general, 2, ops, p, sizeof *p);
}

/* The float dtype both of a and b convert to exactly (f32 for bf16 with f16). */
static nb_dtype wider_float(nb_dtype a, nb_dtype b) {
  if (a == b) return a;
  if (a == NB_F64 || b == NB_F64) return NB_F64;
  if (nb_dtype_size(a) != nb_dtype_size(b)) return nb_dtype_size(a) > nb_dtype_size(b) ? a : b;
  return NB_F32;
}

/* Cotangent of operand `me` given the result's cotangent ct and the other
 * operand y (a primal). With nb batch dims and nf_l, nf_r free dims, ct's dims
 * are [batch | lhs free | rhs free]. We compute
 *     z = dot_general(ct, y)  batch: ct[0..nb) with y's batch dims,
 *                             contract: ct's dims holding y's free dims with them,
 * so z's dims are [batch | me's free dims, in order | y's contracting dims,
 * ascending]. z's dim r is me's dim src[r]: batch i -> me.batch[i], free j ->
 * me.free[j], and y's contracting dim y.contract[p] -> me.contract[p] (the
 * pairing of the original dot). A transpose with perm[src[r]] = r puts z back
 * in me's layout. The dot runs in the wider of ct's and y's float dtypes and
 * produces me's dtype. */
static nb_val *dot_cotangent(nb_loc loc, const nb_eqn *e, nb_val *ct, nb_val *y, bool me_is_lhs) {
  const nb_dot_params *dp = e->params;
  side l = side_of(&dp->dn, e->in[0]->aval.shape.rank, true), r = side_of(&dp->dn, e->in[1]->aval.shape.rank, false);
  const side *me = me_is_lhs ? &l : &r, *other = me_is_lhs ? &r : &l;
  int y_free_at = l.nb + (me_is_lhs ? l.nf : 0); /* where y's free dims sit in ct */
  nb_dot_params q;
  memset(&q, 0, sizeof q);
  q.dn.n_batch = l.nb;
  q.dn.n_contract = other->nf;
  for (int i = 0; i < l.nb; i++) {
    q.dn.lhs_batch[i] = i;
    q.dn.rhs_batch[i] = other->batch[i];
  }
  for (int j = 0; j < other->nf; j++) {
    q.dn.lhs_contract[j] = y_free_at + j;
    q.dn.rhs_contract[j] = other->free[j];
  }
  q.out_dtype = e->in[me_is_lhs ? 0 : 1]->aval.dtype;
  int src[NB_MAX_RANK], perm[NB_MAX_RANK], k = 0;
  for (int i = 0; i < me->nb; i++) src[k++] = me->batch[i];
  for (int j = 0; j < me->nf; j++) src[k++] = me->free[j];
  for (int d = 0; d < other->rank; d++)
    for (int c = 0; c < other->nc; c++)
      if (other->contract[c] == d) src[k++] = me->contract[c];
  for (int i = 0; i < k; i++) perm[src[i]] = i;
  nb_dtype t = wider_float(ct->aval.dtype, y->aval.dtype);
  nb_val *z = emit_dot(loc, nb_convert_at(loc, ct, t), nb_convert_at(loc, y, t), &q);
  return nb_transpose_at(loc, z, perm);
}

static nb_status dot_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                               nb_val *const *ct, nb_val **ct_in) {
  ct_in[0] = ct_in[1] = NULL;
  if (linear[0] && linear[1])
    return nb__fail(g, e->loc, NB_ERR_INTERNAL, "dot_general: transpose with both operands linear"), NB_ERR_INTERNAL;
  if (!ct[0]) return NB_OK;
  if (linear[0]) ct_in[0] = dot_cotangent(e->loc, e, ct[0], in[1], true);
  if (linear[1]) ct_in[1] = dot_cotangent(e->loc, e, ct[0], in[0], false);
  return nb_graph_status(g);
}

/* vmap: a batched operand gets its batch axis moved to 0 (its other dims
 * shift by one). Both batched: the axis pair becomes the first batch dim, so
 * the result is batched at 0. One side batched: the axis is that side's first
 * free dim, so it lands at n_batch (lhs) or n_batch + lhs free (rhs). */
static nb_status dot_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n,
                           nb_val **out, int *out_bdims) {
  const nb_dot_params *p = e->params;
  nb_dot_params q;
  memset(&q, 0, sizeof q);
  q.out_dtype = p->out_dtype;
  bool bl = bdims[0] >= 0, br = bdims[1] >= 0;
  int shift = bl && br ? 1 : 0;
  q.dn.n_batch = p->dn.n_batch + shift;
  q.dn.n_contract = p->dn.n_contract;
  for (int i = 0; i < p->dn.n_batch; i++) {
    q.dn.lhs_batch[i + shift] = p->dn.lhs_batch[i] + bl;
    q.dn.rhs_batch[i + shift] = p->dn.rhs_batch[i] + br;
  }
  for (int i = 0; i < p->dn.n_contract; i++) {
    q.dn.lhs_contract[i] = p->dn.lhs_contract[i] + bl;
    q.dn.rhs_contract[i] = p->dn.rhs_contract[i] + br;
  }
  nb_val *l = bl ? nb__move_axis(e->loc, in[0], bdims[0], 0) : in[0];
  nb_val *r = br ? nb__move_axis(e->loc, in[1], bdims[1], 0) : in[1];
  int lfree = e->in[0]->aval.shape.rank - p->dn.n_batch - p->dn.n_contract;
  out[0] = emit_dot(e->loc, l, r, &q);
  out_bdims[0] = shift ? 0 : bl ? p->dn.n_batch : p->dn.n_batch + lfree;
  (void)n;
  return nb_graph_status(g);
}

static void dot_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_dot_params *p = e->params;
  const nb_shape *ls = &e->in[0]->aval.shape;
  double k = (double)prod_dims(ls, p->dn.n_contract, p->dn.lhs_contract);
  double no = (double)nb_shape_size(&e->out[0]->aval.shape), es = (double)nb_dtype_size(e->in[0]->aval.dtype);
  *flops = 2 * no * k;
  *bytes = ((double)nb_shape_size(ls) + (double)nb_shape_size(&e->in[1]->aval.shape)) * es +
           no * (double)nb_dtype_size(e->out[0]->aval.dtype);
}

static void append_ints(char *buf, size_t cap, const char *label, int n, const int *d) {
  size_t k = strlen(buf);
  if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "%s%s=(", k ? " " : "", label);
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", d[i]);
  if (k < cap) snprintf(buf + k, cap - k, ")");
}

static void dot_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_dot_params *p = e->params;
  append_ints(buf, cap, "lhs_contract", p->dn.n_contract, p->dn.lhs_contract);
  append_ints(buf, cap, "rhs_contract", p->dn.n_contract, p->dn.rhs_contract);
  append_ints(buf, cap, "lhs_batch", p->dn.n_batch, p->dn.lhs_batch);
  append_ints(buf, cap, "rhs_batch", p->dn.n_batch, p->dn.rhs_batch);
  size_t k = strlen(buf);
  if (k < cap) snprintf(buf + k, cap - k, " out=%s", nb_dtype_name(p->out_dtype));
}

const nb_prim_rules nb__prim_dot_general = {
    .name = "dot_general",
    .gemm = true,
    .kind = NB_KIND_CONTRACTION,
    .params_size = sizeof(nb_dot_params),
    .infer = dot_infer,
    .eval = dot_eval,
    .jvp = nb__bilinear_jvp,
    .transpose = dot_transpose,
    .batch = dot_batch,
    .cost = dot_cost,
    .print_params = dot_print,
};

/* ---------------------------------------------------------------- public ops */

static bool norm_dims(nb_graph *g, nb_loc loc, int n, const int *dims, int rank, int *outd, const char *what) {
  for (int i = 0; i < n; i++) {
    int d = nb__norm_axis(dims[i], rank);
    if (d < 0) {
      nb__fail(g, loc, NB_ERR_INVALID_ARG, "dot_general: %s dim %d out of range for rank %d", what, dims[i], rank);
      return false;
    }
    outd[i] = d;
  }
  return true;
}

nb_val *nb_dot_general_at(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_dot_dims *dn, nb_dtype out_dtype) {
  nb_val *ops[2] = {lhs, rhs};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!lhs || !rhs) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "dot_general: NULL operand");
  if (nb_graph_status(g)) return nb__poison(g);
  if (!dn) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "dot_general: NULL dimension numbers");
  int rl = lhs->aval.shape.rank, rr = rhs->aval.shape.rank;
  if (dn->n_batch < 0 || dn->n_contract < 0 || dn->n_batch > NB_MAX_RANK || dn->n_contract > NB_MAX_RANK ||
      dn->n_batch + dn->n_contract > (rl < rr ? rl : rr))
    return nb__fail(g, loc, NB_ERR_INVALID_ARG, "dot_general: %d batch + %d contracting dims for ranks %d and %d",
                    dn->n_batch, dn->n_contract, rl, rr);
  if (out_dtype != NB_DTYPE_COUNT && (out_dtype < 0 || out_dtype > NB_DTYPE_COUNT))
    return nb__fail(g, loc, NB_ERR_DTYPE, "dot_general: invalid out_dtype %d", (int)out_dtype);
  nb_dot_params p;
  memset(&p, 0, sizeof p);
  p.dn.n_batch = dn->n_batch;
  p.dn.n_contract = dn->n_contract;
  p.out_dtype = out_dtype == NB_DTYPE_COUNT ? lhs->aval.dtype : out_dtype;
  if (!norm_dims(g, loc, dn->n_batch, dn->lhs_batch, rl, p.dn.lhs_batch, "lhs batch") ||
      !norm_dims(g, loc, dn->n_batch, dn->rhs_batch, rr, p.dn.rhs_batch, "rhs batch") ||
      !norm_dims(g, loc, dn->n_contract, dn->lhs_contract, rl, p.dn.lhs_contract, "lhs contracting") ||
      !norm_dims(g, loc, dn->n_contract, dn->rhs_contract, rr, p.dn.rhs_contract, "rhs contracting"))
    return nb__poison(g);
  return nb__emit1(g, loc, NB_PRIM_dot_general, 2, ops, &p, sizeof p);
}

/* NumPy broadcast of two batch shapes (leading dims of a and b); false on a
 * mismatch. */
static bool broadcast_batch(const nb_shape *a, int na, const nb_shape *b, int nb, int64_t *dims, int *n, int *bad) {
  *n = na > nb ? na : nb;
  for (int i = 0; i < *n; i++) {
    int64_t da = i - (*n - na) >= 0 ? a->dims[i - (*n - na)] : 1;
    int64_t db = i - (*n - nb) >= 0 ? b->dims[i - (*n - nb)] : 1;
    if (da != db && da != 1 && db != 1) return *bad = i, false;
    dims[i] = da == 1 ? db : da;
  }
  return true;
}

/* numpy.matmul: [..., M, K] @ [..., K, N] -> [..., M, N] with the leading
 * dims broadcast; a 1-D a is [1, K] and a 1-D b is [K, 1], the added dim
 * dropped from the result. A rank-2 b (the common x @ W) contracts against a
 * as is, without broadcasting b; a rank-2 a with a batched b contracts and
 * moves M behind b's batch dims. */
nb_val *nb_matmul_at(nb_loc loc, nb_val *a, nb_val *b) {
  nb_val *ops[2] = {a, b};
  nb_graph *g = nb__graph_of(loc, 2, ops);
  if (!g) return NULL;
  if (!a || !b) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "matmul: NULL operand");
  if (nb_graph_status(g)) return nb__poison(g);
  char s1[128], s2[128];
  int ra = a->aval.shape.rank, rb = b->aval.shape.rank;
  if (ra == 0 || rb == 0)
    return nb__fail(g, loc, NB_ERR_SHAPE, "matmul: operands must have rank >= 1, got %s and %s (use mul for scalars)",
                    nb_aval_str(&a->aval, s1, sizeof s1), nb_aval_str(&b->aval, s2, sizeof s2));
  bool a_vec = ra == 1, b_vec = rb == 1;
  int64_t d2[2];
  if (a_vec) a = nb_reshape_at(loc, a, 2, (d2[0] = 1, d2[1] = a->aval.shape.dims[0], d2));
  if (b_vec) b = nb_reshape_at(loc, b, 2, (d2[0] = b->aval.shape.dims[0], d2[1] = 1, d2));
  if (nb_graph_status(g)) return nb__poison(g);
  ra = a->aval.shape.rank;
  rb = b->aval.shape.rank;
  if (a->aval.shape.dims[ra - 1] != b->aval.shape.dims[rb - 2])
    return nb__fail(g, loc, NB_ERR_SHAPE, "matmul: contracting dims differ: %s @ %s", nb_aval_str(&a->aval, s1, sizeof s1),
                    nb_aval_str(&b->aval, s2, sizeof s2));
  nb_dot_dims dn;
  memset(&dn, 0, sizeof dn);
  dn.n_contract = 1;
  dn.lhs_contract[0] = ra - 1;
  dn.rhs_contract[0] = rb - 2;
  nb_val *y;
  if (rb == 2) {
    y = nb_dot_general_at(loc, a, b, &dn, NB_DTYPE_COUNT);
  } else if (ra == 2) { /* [M, bb..., N] -> [bb..., M, N] */
    y = nb_dot_general_at(loc, a, b, &dn, NB_DTYPE_COUNT);
    int perm[NB_MAX_RANK], nbb = rb - 2;
    for (int i = 0; i < nbb; i++) perm[i] = i + 1;
    perm[nbb] = 0;
    perm[nbb + 1] = nbb + 1;
    y = nb_transpose_at(loc, y, perm);
  } else {
    int64_t dims[NB_MAX_RANK];
    int n, bad;
    if (!broadcast_batch(&a->aval.shape, ra - 2, &b->aval.shape, rb - 2, dims, &n, &bad))
      return nb__fail(g, loc, NB_ERR_SHAPE, "matmul: batch dims of %s and %s do not broadcast (batch axis %d)",
                      nb_aval_str(&a->aval, s1, sizeof s1), nb_aval_str(&b->aval, s2, sizeof s2), bad);
    dims[n] = a->aval.shape.dims[ra - 2];
    dims[n + 1] = a->aval.shape.dims[ra - 1];
    a = nb_broadcast_to_at(loc, a, n + 2, dims);
    dims[n] = b->aval.shape.dims[rb - 2];
    dims[n + 1] = b->aval.shape.dims[rb - 1];
    b = nb_broadcast_to_at(loc, b, n + 2, dims);
    dn.n_batch = n;
    for (int i = 0; i < n; i++) dn.lhs_batch[i] = dn.rhs_batch[i] = i;
    dn.lhs_contract[0] = n + 1;
    dn.rhs_contract[0] = n;
    y = nb_dot_general_at(loc, a, b, &dn, NB_DTYPE_COUNT);
  }
  if (!a_vec && !b_vec) return y;
  if (!y || nb__is_poison(y)) return y;
  int r = y->aval.shape.rank, k = 0;
  int64_t dims[NB_MAX_RANK];
  for (int i = 0; i < r; i++)
    if (!((a_vec && i == r - 2) || (b_vec && i == r - 1))) dims[k++] = y->aval.shape.dims[i];
  return nb_reshape_at(loc, y, k, dims);
}
