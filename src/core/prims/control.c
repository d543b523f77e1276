/* Control flow: cond (switch over N branches), while_loop and scan, the
 * higher-order primitives that carry graphs, as lax.cond / while_loop / scan.
 * Operands are consts first, then the carry, then the scanned xs (JAX's
 * order); the carried graphs take their inputs in the same order and are held
 * by the equation. fori_loop is built on top: a scan when its bounds are
 * constants (so reverse mode works), else a while_loop.
 *
 * Reference evaluation runs the carried graphs with the interpreter, one
 * iteration at a time. Derivatives follow JAX: the JVP of scan and cond is
 * split (partial evaluation of the linearized body) into a primal part that
 * also emits the residuals the tangents need, and a linear part over those
 * residuals; reverse mode transposes the linear part (scan: a scan of the
 * transposed body in the other direction over the stored residuals; cond: the
 * transposed branch picked by the same index). while_loop has a JVP but no
 * transpose: its trip count is unknown, so nothing could store its residuals. */
#include <string.h>

#include "core/prims/elementwise.h"
#include "transform/transform.h"

/* ---------------------------------------------------------------- shared helpers */

static char *aval_text(nb_aval a, char *buf, size_t cap) { return nb_aval_str(&a, buf, cap); }

/* Checks that graph input `first + i` has aval want[i] for i < n. */
static nb_status check_inputs(const nb_graph *callee, const char *what, size_t first, int n, const nb_aval *want,
                              char *why, size_t cap) {
  for (int i = 0; i < n; i++) {
    nb_aval got = nb__graph_input(callee, first + (size_t)i)->aval;
    if (!nb_aval_equal(&got, &want[i])) {
      char a[128], b[128];
      return snprintf(why, cap, "%s input %zu ('%s') is %s but its operand is %s", what, first + (size_t)i,
                      nb_graph_input_path(callee, first + (size_t)i), aval_text(got, a, sizeof a), aval_text(want[i], b, sizeof b)),
             NB_ERR_SHAPE;
    }
  }
  return NB_OK;
}

static bool is_scalar(nb_aval a, nb_dtype t) { return a.dtype == t && a.shape.rank == 0; }

/* The aval of one row of a scanned array (its leading axis dropped). */
static nb_aval row_aval(nb_aval a) {
  memmove(a.shape.dims, a.shape.dims + 1, sizeof(int64_t) * (size_t)(a.shape.rank - 1));
  a.shape.rank--;
  return a;
}

/* The aval of `length` stacked rows. */
static nb_aval stacked_aval(nb_aval a, int64_t length) {
  memmove(a.shape.dims + 1, a.shape.dims, sizeof(int64_t) * (size_t)a.shape.rank);
  a.shape.dims[0] = length;
  a.shape.rank++;
  return a;
}

/* Runs callee on in[] (borrowed); res[] receives new references. */
static nb_status run_graph(nb_ctx *ctx, const nb_graph *callee, nb_array *const *in, nb_array **res) {
  return nb_graph_run_flat(ctx, callee, in, res);
}

static void release_all(int n, nb_array **a) {
  for (int i = 0; i < n; i++) {
    nb_array_release(a[i]);
    a[i] = NULL;
  }
}

/* memcpy that accepts empty (possibly NULL) buffers. */
static void copy_bytes(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}

static void copy_into(nb_array *dst, const nb_array *src) { copy_bytes(nb_array_data_mut(dst), nb_array_data(src), nb_array_nbytes(dst)); }

/* ---------------------------------------------------------------- cond */

static nb_status cond_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  const nb_cond_params *p = params;
  char a[128], b[128];
  if (p->nbranches < 1 || p->nbranches > NB_COND_MAX_BRANCHES)
    return snprintf(why, cap, "needs 1 to %d branches, got %d", NB_COND_MAX_BRANCHES, p->nbranches), NB_ERR_INVALID_ARG;
  if (nin < 1 || !is_scalar(in[0], NB_I32))
    return snprintf(why, cap, "the branch index must be an i32 scalar, not %s", nin < 1 ? "missing" : aval_text(in[0], a, sizeof a)),
           NB_ERR_DTYPE;
  const nb_graph *b0 = p->branches[0];
  for (int k = 0; k < p->nbranches; k++) {
    const nb_graph *bk = p->branches[k];
    char what[32];
    snprintf(what, sizeof what, "branch %d", k);
    if (nb_graph_num_inputs(bk) != (size_t)(nin - 1))
      return snprintf(why, cap, "branch %d takes %zu inputs but %d operands were given", k, nb_graph_num_inputs(bk), nin - 1),
             NB_ERR_INVALID_ARG;
    nb_status st = check_inputs(bk, what, 0, nin - 1, in + 1, why, cap);
    if (st) return st;
    if (nb_graph_num_outputs(bk) != nb_graph_num_outputs(b0))
      return snprintf(why, cap, "branch %d has %zu outputs but branch 0 has %zu (branches must return the same avals)", k,
                      nb_graph_num_outputs(bk), nb_graph_num_outputs(b0)),
             NB_ERR_SHAPE;
    for (size_t i = 0; i < nb_graph_num_outputs(bk); i++) {
      nb_aval x = nb__graph_output(bk, i)->aval, y = nb__graph_output(b0, i)->aval;
      if (!nb_aval_equal(&x, &y))
        return snprintf(why, cap, "branch %d output %zu ('%s') is %s but branch 0's is %s (branches must return the same avals)", k, i,
                        nb_graph_output_path(bk, i), aval_text(x, a, sizeof a), aval_text(y, b, sizeof b)),
               NB_ERR_SHAPE;
    }
  }
  *nout = (int)nb_graph_num_outputs(b0);
  for (int i = 0; i < *nout; i++) out[i] = nb__graph_output(b0, (size_t)i)->aval;
  return NB_OK;
}

static int clamp_index(int64_t i, int n) { return i < 0 ? 0 : i >= n ? n - 1 : (int)i; }

static nb_status cond_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_cond_params *p = e->params;
  const nb_graph *branch = p->branches[clamp_index((int64_t)nb_array_get(in[0], 0), p->nbranches)];
  nb_array **res = nb_calloc(ctx, (size_t)(e->nout + 1) * sizeof(nb_array *));
  if (!res) return NB_ERR_NOMEM;
  nb_status st = run_graph(ctx, branch, in + 1, res);
  for (int i = 0; st == NB_OK && i < e->nout; i++) copy_into(out[i], res[i]);
  release_all(e->nout, res);
  nb_dealloc(ctx, res, (size_t)(e->nout + 1) * sizeof(nb_array *));
  return st;
}

static nb_status cond_hold(nb_graph *g, const void *params) {
  const nb_cond_params *p = params;
  nb_status st = NB_OK;
  for (int k = 0; st == NB_OK && k < p->nbranches; k++) st = nb__graph_hold_graph(g, p->branches[k]);
  return st;
}

/* The most expensive branch (a compiler may run any of them). */
static void cond_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_cond_params *p = e->params;
  *flops = *bytes = 0;
  for (int k = 0; k < p->nbranches; k++) {
    double f, b;
    nb_graph_cost(p->branches[k], &f, &b);
    if (f > *flops) *flops = f;
    if (b > *bytes) *bytes = b;
  }
}

static void cond_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_cond_params *p = e->params;
  size_t n = (size_t)snprintf(buf, cap, "nbranches=%d", p->nbranches);
  for (int k = 0; k < p->nbranches && n < cap; k++) {
    char name[32];
    snprintf(name, sizeof name, " branch%d", k);
    n += (size_t)nb__print_graph_param(buf + n, cap - n, name, p->branches[k]);
  }
}

/* ---------------------------------------------------------------- while_loop */

static nb_status while_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  const nb_while_params *p = params;
  int ncarry = nin - p->ncond_consts - p->nbody_consts;
  char a[128];
  if (p->ncond_consts < 0 || p->nbody_consts < 0 || ncarry < 0)
    return snprintf(why, cap, "%d operands cannot hold %d cond consts and %d body consts", nin, p->ncond_consts, p->nbody_consts),
           NB_ERR_INVALID_ARG;
  const nb_aval *carry = in + p->ncond_consts + p->nbody_consts;
  if (nb_graph_num_inputs(p->cond) != (size_t)(p->ncond_consts + ncarry))
    return snprintf(why, cap, "cond takes %zu inputs, but there are %d cond consts and %d carry values", nb_graph_num_inputs(p->cond),
                    p->ncond_consts, ncarry),
           NB_ERR_INVALID_ARG;
  if (nb_graph_num_inputs(p->body) != (size_t)(p->nbody_consts + ncarry))
    return snprintf(why, cap, "body takes %zu inputs, but there are %d body consts and %d carry values", nb_graph_num_inputs(p->body),
                    p->nbody_consts, ncarry),
           NB_ERR_INVALID_ARG;
  nb_status st = check_inputs(p->cond, "cond", 0, p->ncond_consts, in, why, cap);
  if (!st) st = check_inputs(p->cond, "cond", (size_t)p->ncond_consts, ncarry, carry, why, cap);
  if (!st) st = check_inputs(p->body, "body", 0, p->nbody_consts, in + p->ncond_consts, why, cap);
  if (!st) st = check_inputs(p->body, "body", (size_t)p->nbody_consts, ncarry, carry, why, cap);
  if (st) return st;
  if (nb_graph_num_outputs(p->cond) != 1 || !is_scalar(nb__graph_output(p->cond, 0)->aval, NB_BOOL))
    return snprintf(why, cap, "cond must return one bool scalar, not %zu outputs%s%s", nb_graph_num_outputs(p->cond),
                    nb_graph_num_outputs(p->cond) ? " starting with " : "",
                    nb_graph_num_outputs(p->cond) ? aval_text(nb__graph_output(p->cond, 0)->aval, a, sizeof a) : ""),
           NB_ERR_DTYPE;
  if (nb_graph_num_outputs(p->body) != (size_t)ncarry)
    return snprintf(why, cap, "body returns %zu values but the carry has %d", nb_graph_num_outputs(p->body), ncarry), NB_ERR_SHAPE;
  for (int i = 0; i < ncarry; i++) {
    nb_aval o = nb__graph_output(p->body, (size_t)i)->aval;
    if (!nb_aval_equal(&o, &carry[i])) {
      char b[128];
      return snprintf(why, cap, "body output %d ('%s') is %s but the carry it replaces is %s (the carry keeps its avals)", i,
                      nb_graph_output_path(p->body, (size_t)i), aval_text(o, a, sizeof a), aval_text(carry[i], b, sizeof b)),
             NB_ERR_SHAPE;
    }
  }
  *nout = ncarry;
  for (int i = 0; i < ncarry; i++) out[i] = carry[i];
  return NB_OK;
}

static nb_status while_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_while_params *p = e->params;
  int nc = p->ncond_consts, nb = p->nbody_consts, nk = e->nout;
  size_t ncap = (size_t)(nc + nb + nk + 1);
  nb_array **cin = nb_calloc(ctx, ncap * sizeof(nb_array *)), **bin = nb_calloc(ctx, ncap * sizeof(nb_array *));
  nb_array **carry = nb_calloc(ctx, ncap * sizeof(nb_array *));
  nb_status st = cin && bin && carry ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; st == NB_OK && i < nk; i++) {
    carry[i] = in[nc + nb + i];
    nb_array_retain(carry[i]);
  }
  while (st == NB_OK) {
    nb_array *pred = NULL;
    for (int i = 0; i < nc; i++) cin[i] = in[i];
    for (int i = 0; i < nk; i++) cin[nc + i] = carry[i];
    st = run_graph(ctx, p->cond, cin, &pred);
    bool go = st == NB_OK && nb_array_get(pred, 0) != 0;
    nb_array_release(pred);
    if (!go) break;
    for (int i = 0; i < nb; i++) bin[i] = in[nc + i];
    for (int i = 0; i < nk; i++) bin[nb + i] = carry[i];
    nb_array **next = cin; /* reused as the output list */
    st = run_graph(ctx, p->body, bin, next);
    if (st == NB_OK) {
      release_all(nk, carry);
      memcpy(carry, next, sizeof(nb_array *) * (size_t)nk);
    }
  }
  for (int i = 0; st == NB_OK && i < nk; i++) copy_into(out[i], carry[i]);
  if (carry) release_all(nk, carry);
  nb_dealloc(ctx, cin, ncap * sizeof(nb_array *));
  nb_dealloc(ctx, bin, ncap * sizeof(nb_array *));
  nb_dealloc(ctx, carry, ncap * sizeof(nb_array *));
  return st;
}

static nb_status while_hold(nb_graph *g, const void *params) {
  const nb_while_params *p = params;
  nb_status st = nb__graph_hold_graph(g, p->cond);
  return st ? st : nb__graph_hold_graph(g, p->body);
}

/* One trip of cond and body (the trip count is unknown). */
static void while_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_while_params *p = e->params;
  double f, b;
  nb_graph_cost(p->cond, flops, bytes);
  nb_graph_cost(p->body, &f, &b);
  *flops += f;
  *bytes += b;
}

static void while_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_while_params *p = e->params;
  size_t n = (size_t)snprintf(buf, cap, "ncond_consts=%d nbody_consts=%d ", p->ncond_consts, p->nbody_consts);
  if (n < cap) n += (size_t)nb__print_graph_param(buf + n, cap - n, "cond", p->cond);
  if (n < cap) n += (size_t)snprintf(buf + n, cap - n, " ");
  if (n < cap) nb__print_graph_param(buf + n, cap - n, "body", p->body);
}

/* ---------------------------------------------------------------- scan */

static nb_status scan_infer(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why, size_t cap) {
  const nb_scan_params *p = params;
  int nxs = nin - p->nconsts - p->ncarry;
  char a[128], b[128];
  if (p->nconsts < 0 || p->ncarry < 0 || nxs < 0)
    return snprintf(why, cap, "%d operands cannot hold %d consts and %d carry values", nin, p->nconsts, p->ncarry), NB_ERR_INVALID_ARG;
  if (p->length < 0) return snprintf(why, cap, "length must be >= 0, got %lld", (long long)p->length), NB_ERR_INVALID_ARG;
  if (p->unroll < 1) return snprintf(why, cap, "unroll must be >= 1, got %d", p->unroll), NB_ERR_INVALID_ARG;
  const nb_graph *body = p->body;
  if (nb_graph_num_inputs(body) != (size_t)nin)
    return snprintf(why, cap, "body takes %zu inputs, but there are %d consts, %d carry values and %d xs", nb_graph_num_inputs(body),
                    p->nconsts, p->ncarry, nxs),
           NB_ERR_INVALID_ARG;
  if ((int)nb_graph_num_outputs(body) < p->ncarry)
    return snprintf(why, cap, "body returns %zu values but the carry has %d", nb_graph_num_outputs(body), p->ncarry), NB_ERR_SHAPE;
  nb_status st = check_inputs(body, "body", 0, p->nconsts + p->ncarry, in, why, cap);
  if (st) return st;
  const nb_aval *xs = in + p->nconsts + p->ncarry;
  for (int j = 0; j < nxs; j++) {
    if (xs[j].shape.rank < 1 || xs[j].shape.dims[0] != p->length)
      return snprintf(why, cap, "xs %d is %s: its leading dimension must be the scan length %lld", j, aval_text(xs[j], a, sizeof a),
                      (long long)p->length),
             NB_ERR_SHAPE;
    nb_aval row = row_aval(xs[j]);
    st = check_inputs(body, "body", (size_t)(p->nconsts + p->ncarry + j), 1, &row, why, cap);
    if (st) return st;
  }
  for (int i = 0; i < p->ncarry; i++) {
    nb_aval o = nb__graph_output(body, (size_t)i)->aval, c = in[p->nconsts + i];
    if (!nb_aval_equal(&o, &c))
      return snprintf(why, cap, "body carry output %d ('%s') is %s but the carry input is %s (the carry keeps its avals)", i,
                      nb_graph_output_path(body, (size_t)i), aval_text(o, a, sizeof a), aval_text(c, b, sizeof b)),
             NB_ERR_SHAPE;
  }
  *nout = (int)nb_graph_num_outputs(body);
  for (int i = 0; i < *nout; i++) {
    nb_aval o = nb__graph_output(body, (size_t)i)->aval;
    if (i >= p->ncarry && o.shape.rank + 1 > NB_MAX_RANK)
      return snprintf(why, cap, "body output %d is %s: stacking it exceeds rank %d", i, aval_text(o, a, sizeof a), NB_MAX_RANK),
             NB_ERR_SHAPE;
    out[i] = i < p->ncarry ? o : stacked_aval(o, p->length);
  }
  return NB_OK;
}

static nb_status scan_eval(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out) {
  const nb_scan_params *p = e->params;
  int nc = p->nconsts, nk = p->ncarry, nx = e->nin - nc - nk, ny = e->nout - nk;
  size_t ncap = (size_t)(e->nin + e->nout + 1);
  nb_array **bin = nb_calloc(ctx, ncap * sizeof(nb_array *)), **res = nb_calloc(ctx, ncap * sizeof(nb_array *));
  nb_array **carry = nb_calloc(ctx, ncap * sizeof(nb_array *)), **rows = nb_calloc(ctx, ncap * sizeof(nb_array *));
  nb_status st = bin && res && carry && rows ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; st == NB_OK && i < nk; i++) {
    carry[i] = in[nc + i];
    nb_array_retain(carry[i]);
  }
  for (int j = 0; st == NB_OK && j < nx; j++) {
    nb_aval r = nb__graph_input(p->body, (size_t)(nc + nk + j))->aval;
    if (!(rows[j] = nb_array_empty(ctx, r.dtype, r.shape.rank, r.shape.dims))) st = NB_ERR_NOMEM;
  }
  for (int64_t it = 0; st == NB_OK && it < p->length; it++) {
    int64_t t = p->reverse ? p->length - 1 - it : it;
    for (int j = 0; j < nx; j++) {
      size_t rb = nb_array_nbytes(rows[j]);
      if (rb) memcpy(nb_array_data_mut(rows[j]), (const char *)nb_array_data(in[nc + nk + j]) + (size_t)t * rb, rb);
    }
    for (int i = 0; i < nc; i++) bin[i] = in[i];
    for (int i = 0; i < nk; i++) bin[nc + i] = carry[i];
    for (int j = 0; j < nx; j++) bin[nc + nk + j] = rows[j];
    st = run_graph(ctx, p->body, bin, res);
    if (st != NB_OK) break;
    release_all(nk, carry);
    memcpy(carry, res, sizeof(nb_array *) * (size_t)nk);
    for (int j = 0; j < ny; j++) {
      size_t yb = nb_array_nbytes(res[nk + j]);
      if (yb) memcpy((char *)nb_array_data_mut(out[nk + j]) + (size_t)t * yb, nb_array_data(res[nk + j]), yb);
    }
    release_all(ny, res + nk);
  }
  for (int i = 0; st == NB_OK && i < nk; i++) copy_into(out[i], carry[i]);
  if (carry) release_all(nk, carry);
  if (rows) release_all(nx, rows);
  nb_dealloc(ctx, bin, ncap * sizeof(nb_array *));
  nb_dealloc(ctx, res, ncap * sizeof(nb_array *));
  nb_dealloc(ctx, carry, ncap * sizeof(nb_array *));
  nb_dealloc(ctx, rows, ncap * sizeof(nb_array *));
  return st;
}

static nb_status scan_hold(nb_graph *g, const void *params) { return nb__graph_hold_graph(g, ((const nb_scan_params *)params)->body); }

/* The body's cost times the trip count. */
static void scan_cost(const nb_eqn *e, double *flops, double *bytes) {
  const nb_scan_params *p = e->params;
  nb_graph_cost(p->body, flops, bytes);
  *flops *= (double)p->length;
  *bytes *= (double)p->length;
}

static void scan_print(const nb_eqn *e, char *buf, size_t cap) {
  const nb_scan_params *p = e->params;
  size_t n = (size_t)snprintf(buf, cap, "length=%lld nconsts=%d ncarry=%d reverse=%d unroll=%d ", (long long)p->length, p->nconsts,
                              p->ncarry, (int)p->reverse, p->unroll);
  if (n < cap) nb__print_graph_param(buf + n, cap - n, "body", p->body);
}

/* ---------------------------------------------------------------- building carried graphs */

/* A fresh graph with inputs of the given avals, named <prefix><i>. */
static nb_graph *graph_with_inputs(nb_ctx *ctx, int n, const nb_aval *avals, const char *prefix, nb_val **ins) {
  nb_graph *w = nb_graph_create(ctx);
  char path[64];
  for (int i = 0; w && i < n; i++) {
    snprintf(path, sizeof path, "%s%d", prefix, i);
    ins[i] = nb__graph_add_input(w, path, avals[i]);
  }
  return w;
}

/* Adds outputs <prefix><i>; on error destroys w and returns NULL with the
 * error on the context. */
static nb_graph *finish_graph(nb_graph *w, int n, nb_val *const *vals, const char *prefix) {
  char path[64];
  if (!w) return NULL;
  for (int i = 0; !nb_graph_status(w) && i < n; i++) {
    snprintf(path, sizeof path, "%s%d", prefix, i);
    nb__graph_add_output(w, path, vals[i]);
  }
  if (nb_graph_status(w)) {
    nb_errorf(nb_graph_ctx(w), nb_graph_status(w), "%s", nb_graph_error(w));
    nb_graph_destroy(w);
    return NULL;
  }
  nb_graph *d = nb__graph_dce(w);
  nb_graph_destroy(w);
  return d;
}

/* A graph whose input k is src's input from[k] (from is a permutation of
 * src's inputs), with src's outputs. */
static nb_graph *reorder_inputs(nb_ctx *ctx, const nb_graph *src, const int *from) {
  int n = (int)nb_graph_num_inputs(src), no = (int)nb_graph_num_outputs(src);
  nb_aval av[512] = {{0}};
  nb_val *ins[512], *map[512], *outs[256];
  if (n > 512 || no > 256) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "control flow: a carried graph with more than 512 inputs"), NULL;
  for (int k = 0; k < n; k++) av[k] = nb__graph_input(src, (size_t)from[k])->aval;
  nb_graph *w = graph_with_inputs(ctx, n, av, "in", ins);
  for (int k = 0; w && k < n; k++) map[from[k]] = ins[k];
  if (w && nb__graph_inline(w, src, map, outs) != NB_OK) no = 0;
  return finish_graph(w, no, outs, "out");
}

/* Records the context's error in g (a transformation of a carried graph failed). */
static nb_status fail_from_ctx(nb_graph *g, const nb_eqn *e, const char *what) {
  nb_ctx *ctx = nb_graph_ctx(g);
  nb__fail(g, e->loc, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM, "%s: %s", what, nb_ctx_error(ctx));
  return nb_graph_status(g);
}

/* The transpose of `lin` (linear in the inputs where linear[i]) as a graph:
 * inputs (the non-linear inputs, in order; then a cotangent for each output
 * where has_ct[o]) -> a cotangent for each linear input (zeros where none). */
static nb_graph *transpose_graph(nb_ctx *ctx, const nb_graph *lin, const bool *linear, const bool *has_ct) {
  int n = (int)nb_graph_num_inputs(lin), no = (int)nb_graph_num_outputs(lin);
  nb_aval av[768];
  nb_val *ins[768], *prim[512], *cto[256], *pout[256], *cti[512], *res[512];
  bool wrt[512];
  if (n > 512 || no > 256) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "control flow: a carried graph with more than 512 inputs"), NULL;
  int k = 0;
  for (int i = 0; i < n; i++)
    if (!linear[i]) av[k++] = nb__graph_input(lin, (size_t)i)->aval;
  for (int o = 0; o < no; o++)
    if (has_ct[o]) av[k++] = nb__graph_output(lin, (size_t)o)->aval;
  nb_graph *w = graph_with_inputs(ctx, k, av, "in", ins);
  if (!w) return NULL;
  k = 0;
  for (int i = 0; i < n; i++) {
    wrt[i] = linear[i];
    prim[i] = linear[i] ? nb__zeros(w, nb__graph_input(lin, (size_t)i)->aval) : ins[k++];
  }
  for (int o = 0; o < no; o++) cto[o] = has_ct[o] ? ins[k++] : NULL;
  int nr = 0;
  if (nb__vjp_into(w, lin, wrt, prim, cto, false, pout, cti) == NB_OK)
    for (int i = 0; i < n; i++)
      if (linear[i]) res[nr++] = cti[i] ? cti[i] : nb__zeros(w, nb__graph_input(lin, (size_t)i)->aval);
  return finish_graph(w, nr, res, "ct");
}

/* ---------------------------------------------------------------- scan: derivatives */

/* Which carry values get a tangent: those with one on entry, and those the
 * body gives one (a fixed point, as JAX's). tan[] is updated in place. */
static nb_status carry_fixpoint(nb_ctx *ctx, const nb_graph *body, int first, int ncarry, bool *tan, const bool *fwd) {
  int nout = (int)nb_graph_num_outputs(body);
  bool want[256] = {false}, nz[256];
  for (int round = 0; round <= ncarry; round++) {
    nb__partial pe;
    nb_status st = nb__partial_eval(ctx, body, tan, fwd, NULL, want, nz, &pe);
    if (st) return st;
    nb__partial_free(ctx, &pe);
    bool changed = false;
    for (int i = 0; i < ncarry && i < nout; i++)
      if (nz[i] && !tan[first + i]) tan[first + i] = changed = true;
    if (!changed) return NB_OK;
  }
  return NB_OK;
}

/* scan's JVP, JAX's way: known = the body's primal part, returning the
 * residuals its tangents need, scanned forward (the residuals stacked as
 * extra ys); lin = the body's tangent part, scanned over the stacked
 * residuals. Residuals that are consts or xs are passed as they are. */
static nb_status scan_linearize(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val **outs, nb_val **ot) {
  const nb_scan_params *sp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nin = e->nin, nc = sp->nconsts, nk = sp->ncarry, nout = e->nout;
  if (nin > 256 || nout > 256)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "scan: differentiating a scan with more than 256 operands or outputs"),
           NB_ERR_UNIMPLEMENTED;
  bool tan[256], fwd[256], inv[256], want[256], nz[256];
  for (int i = 0; i < nin; i++) {
    tan[i] = t[i] && nb_dtype_is_float(e->in[i]->aval.dtype);
    fwd[i] = i < nc || i >= nc + nk;
    inv[i] = i < nc;
  }
  nb__partial pe = {0};
  memset(want, 0, sizeof want);
  nb_status st = carry_fixpoint(ctx, sp->body, nc, nk, tan, fwd);
  if (!st) st = nb__partial_eval(ctx, sp->body, tan, fwd, NULL, want, nz, &pe), nb__partial_free(ctx, &pe);
  for (int i = 0; i < nout; i++) want[i] = i < nk ? tan[nc + i] : nz[i];
  if (!st) st = nb__partial_eval(ctx, sp->body, tan, fwd, inv, want, NULL, &pe);
  if (st) return fail_from_ctx(g, e, "scan: linearizing the body");

  /* the forward scan: outputs, then the stacked computed residuals */
  int ncomp = 0;
  for (int r = 0; r < pe.nres; r++) ncomp += pe.res_input[r] == NB__RES_COMPUTED;
  nb_scan_params kp = *sp;
  kp.body = pe.known;
  nb_val *kout[512];
  if (nout + ncomp > 256) {
    nb__partial_free(ctx, &pe);
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "scan: the body needs %d residuals (at most %d)", ncomp, 256 - nout),
           NB_ERR_UNIMPLEMENTED;
  }
  nb__emit(g, e->loc, NB_PRIM_scan, nin, p, &kp, sizeof kp, NULL, kout);
  /* the loop-invariant residuals, computed once from the consts */
  nb_val *hout[256];
  if (!nb_graph_status(g) && nb_graph_num_outputs(pe.hoisted) > 256)
    nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "scan: the body needs %zu loop-invariant residuals (at most 256)", nb_graph_num_outputs(pe.hoisted));
  if (!nb_graph_status(g)) nb__graph_inline(g, pe.hoisted, p, hout);

  /* the linear scan: consts (residual consts, tangent consts), carry
   * (tangent carry), xs (residual xs, tangent xs, stacked residuals) */
  int ntan_before[257], nt = 0;
  for (int i = 0; i < nin; i++) {
    ntan_before[i] = nt;
    nt += tan[i];
  }
  int from[768], n = 0, lnc = 0, lnk = 0, comp = 0;
  nb_val *ops[768];
  for (int r = 0; r < pe.nres; r++)
    if (pe.res_input[r] >= 0 && pe.res_input[r] < nc) from[n] = r, ops[n++] = p[pe.res_input[r]];
  for (int r = 0, h = 0; r < pe.nres && !nb_graph_status(g); r++)
    if (pe.res_input[r] == NB__RES_HOISTED) from[n] = r, ops[n++] = hout[h++];
  for (int i = 0; i < nc; i++)
    if (tan[i]) from[n] = pe.nres + ntan_before[i], ops[n++] = t[i];
  lnc = n;
  for (int i = nc; i < nc + nk; i++)
    if (tan[i]) from[n] = pe.nres + ntan_before[i], ops[n++] = t[i] ? t[i] : nb__zeros(g, e->in[i]->aval), lnk++;
  for (int r = 0; r < pe.nres; r++)
    if (pe.res_input[r] >= nc + nk) from[n] = r, ops[n++] = p[pe.res_input[r]];
  for (int i = nc + nk; i < nin; i++)
    if (tan[i]) from[n] = pe.nres + ntan_before[i], ops[n++] = t[i];
  for (int r = 0; r < pe.nres && !nb_graph_status(g); r++)
    if (pe.res_input[r] == NB__RES_COMPUTED) from[n] = r, ops[n++] = kout[nout + comp++];
  nb_graph *lbody = nb_graph_status(g) ? NULL : reorder_inputs(ctx, pe.lin, from);
  nb__partial_free(ctx, &pe);
  if (!lbody) return nb_graph_status(g) ? nb_graph_status(g) : fail_from_ctx(g, e, "scan: the linear body");
  nb_scan_params lp = *sp;
  lp.body = lbody;
  lp.nconsts = lnc;
  lp.ncarry = lnk;
  nb_val *lout[256];
  nb__emit(g, e->loc, NB_PRIM_scan, n, ops, &lp, sizeof lp, NULL, lout);
  nb_graph_destroy(lbody); /* held by the equation */
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int i = 0; i < nout; i++) outs[i] = kout[i];
  for (int i = 0, k = 0; i < nout; i++) ot[i] = want[i] ? lout[k++] : NULL;
  return NB_OK;
}

/* The transpose of a scan linear in some consts, all its carry and some xs:
 * a scan in the other direction of the transposed body, carrying the carry's
 * cotangent and the sums of the linear consts' cotangents, reading the ys'
 * cotangents and the non-linear xs (the residuals), returning the linear xs'
 * cotangents as ys. */
static nb_status scan_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct_out,
                                nb_val **ct_in) {
  const nb_scan_params *sp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nin = e->nin, nc = sp->nconsts, nk = sp->ncarry, nx = nin - nc - nk, nout = e->nout, ny = nout - nk;
  if (nin > 256 || nout > 256)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "scan: transposing a scan with more than 256 operands or outputs"), NB_ERR_UNIMPLEMENTED;
  /* A scan in the linear half is a linearized body's (scan_linearize): its
   * carry is all tangents, though one may be an instantiated zero, which
   * reverse mode does not count as linear. Every carry is transposed. */
  bool lin_mask[256];
  for (int i = 0; i < nin; i++) lin_mask[i] = linear[i] || (i >= nc && i < nc + nk);
  linear = lin_mask;
  /* the transposed body: (res consts, ct carry, acc, ct ys, res xs) -> (ct carry, acc + ct consts, ct xs) */
  bool has_ct[256];
  for (int o = 0; o < nout; o++) has_ct[o] = o < nk || ct_out[o];
  nb_graph *tb = transpose_graph(ctx, sp->body, linear, has_ct);
  if (!tb) return fail_from_ctx(g, e, "scan: transposing the body");
  /* tb: (non-linear inputs: res consts then res xs; cts: carry then ys) -> (cts of linear: consts, carry, xs) */
  int nrc = 0, nrx = 0, nlc = 0, nlx = 0, ncy = 0;
  for (int i = 0; i < nc; i++) linear[i] ? nlc++ : nrc++;
  for (int i = nc + nk; i < nin; i++) linear[i] ? nlx++ : nrx++;
  for (int o = nk; o < nout; o++) ncy += has_ct[o];
  /* wrapper inputs: res consts, ct carry, acc (nlc), ct ys, res xs */
  nb_aval av[768];
  nb_val *wi[768], *map[768], *tout[512], *wout[512];
  int n = 0;
  for (int i = 0; i < nrc; i++) av[n++] = nb__graph_input(tb, (size_t)i)->aval;
  for (int i = 0; i < nk; i++) av[n++] = nb__graph_input(tb, (size_t)(nrc + nrx + i))->aval;
  for (int i = 0; i < nc; i++)
    if (linear[i]) av[n++] = e->in[i]->aval;
  for (int j = 0; j < ncy; j++) av[n++] = nb__graph_input(tb, (size_t)(nrc + nrx + nk + j))->aval;
  for (int j = 0; j < nrx; j++) av[n++] = nb__graph_input(tb, (size_t)(nrc + j))->aval;
  nb_graph *w = graph_with_inputs(ctx, n, av, "in", wi);
  int wo = 0;
  if (w) {
    for (int i = 0; i < nrc; i++) map[i] = wi[i];
    for (int j = 0; j < nrx; j++) map[nrc + j] = wi[nrc + nk + nlc + ncy + j];
    for (int i = 0; i < nk; i++) map[nrc + nrx + i] = wi[nrc + i];
    for (int j = 0; j < ncy; j++) map[nrc + nrx + nk + j] = wi[nrc + nk + nlc + j];
    if (nb__graph_inline(w, tb, map, tout) == NB_OK) {
      /* tout: cts of linear inputs in input order: consts (nlc), carry (nk), xs (nlx) */
      for (int i = 0; i < nk; i++) wout[wo++] = tout[nlc + i];
      for (int c = 0; c < nlc; c++) wout[wo++] = nb_add_at(e->loc, wi[nrc + nk + c], tout[c]);
      for (int j = 0; j < nlx; j++) wout[wo++] = tout[nlc + nk + j];
    }
  }
  nb_graph_destroy(tb);
  nb_graph *body = finish_graph(w, wo, wout, "out");
  if (!body) return fail_from_ctx(g, e, "scan: transposing the body");
  nb_val *ops[768];
  n = 0;
  for (int i = 0; i < nc; i++)
    if (!linear[i]) ops[n++] = in[i];
  for (int i = 0; i < nk; i++) ops[n++] = ct_out[i] ? ct_out[i] : nb__zeros(g, e->out[i]->aval);
  for (int i = 0; i < nc; i++)
    if (linear[i]) ops[n++] = nb__zeros(g, e->in[i]->aval);
  for (int o = nk; o < nout; o++)
    if (has_ct[o]) ops[n++] = ct_out[o];
  for (int i = nc + nk; i < nin; i++)
    if (!linear[i]) ops[n++] = in[i];
  nb_scan_params tp = *sp;
  tp.body = body;
  tp.nconsts = nrc;
  tp.ncarry = nk + nlc;
  tp.reverse = !sp->reverse;
  nb_val *res[512];
  nb__emit(g, e->loc, NB_PRIM_scan, n, ops, &tp, sizeof tp, NULL, res);
  nb_graph_destroy(body);
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int i = 0; i < nk; i++) ct_in[nc + i] = res[i]; /* read only where the operand is linear */
  for (int i = 0, c = 0; i < nc; i++)
    if (linear[i]) ct_in[i] = res[nk + c++];
  for (int i = nc + nk, j = 0; i < nin; i++)
    if (linear[i]) ct_in[i] = res[nk + nlc + j++];
  (void)nx;
  (void)ny;
  return NB_OK;
}

/* vmap: every carry batched at 0 (a carry usually becomes batched after one
 * trip anyway), batched consts at 0, batched xs at 1 (their rows at 0); the
 * body vmapped to match. ys come out batched at axis 1. */
static nb_status scan_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                            int *out_bdims) {
  const nb_scan_params *sp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nc = sp->nconsts, nk = sp->ncarry, nin = e->nin;
  nb_val *ops[512];
  int inb[512], outb[256];
  if (nin > 512) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "vmap of a scan with more than 512 operands"), NB_ERR_UNIMPLEMENTED;
  for (int i = 0; i < nin; i++) {
    if (i >= nc && i < nc + nk) {
      ops[i] = nb__batch_to_front(e->loc, in[i], bdims[i], n);
      inb[i] = 0;
    } else if (bdims[i] < 0) {
      ops[i] = in[i];
      inb[i] = -1;
    } else {
      ops[i] = nb__move_axis(e->loc, in[i], bdims[i], i < nc ? 0 : 1);
      inb[i] = 0;
    }
  }
  for (int o = 0; o < e->nout; o++) outb[o] = 0;
  nb_graph *body = nb__vmap_graph_axes(ctx, sp->body, inb, n, outb);
  if (!body) return fail_from_ctx(g, e, "vmap of scan");
  nb_scan_params bp = *sp;
  bp.body = body;
  nb__emit(g, e->loc, NB_PRIM_scan, nin, ops, &bp, sizeof bp, NULL, out);
  nb_graph_destroy(body);
  for (int o = 0; o < e->nout; o++) out_bdims[o] = o < nk ? 0 : 1;
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- cond: derivatives */

/* cond's JVP: each branch split into known (returning the primal outputs
 * and its residuals, zeros in the other branches' residual slots) and lin;
 * both conds pick the branch by the same index. */
static nb_status cond_linearize(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val **outs, nb_val **ot) {
  const nb_cond_params *cp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nops = e->nin - 1, nout = e->nout, nb = cp->nbranches;
  if (nops > 256 || nout > 256)
    return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "cond: differentiating a cond with more than 256 operands or outputs"),
           NB_ERR_UNIMPLEMENTED;
  bool tan[256], fwd[256], want[256], used[256] = {false};
  for (int i = 0; i < nops; i++) {
    tan[i] = t[1 + i] && nb_dtype_is_float(e->in[1 + i]->aval.dtype);
    fwd[i] = true;
  }
  for (int o = 0; o < nout; o++) want[o] = nb_dtype_is_float(e->out[o]->aval.dtype);
  nb__partial pe[NB_COND_MAX_BRANCHES];
  memset(pe, 0, sizeof pe);
  nb_status st = NB_OK;
  int slot0[NB_COND_MAX_BRANCHES + 1], nslots = 0;
  for (int b = 0; st == NB_OK && b < nb; b++) {
    st = nb__partial_eval(ctx, cp->branches[b], tan, fwd, NULL, want, NULL, &pe[b]);
    slot0[b] = nslots;
    for (int r = 0; st == NB_OK && r < pe[b].nres; r++) {
      if (pe[b].res_input[r] >= 0) used[pe[b].res_input[r]] = true;
      else nslots++;
    }
  }
  slot0[nb] = nslots;
  nb_aval slot_av[512];
  nb_cond_params kp, lp;
  memset(&kp, 0, sizeof kp);
  memset(&lp, 0, sizeof lp);
  kp.nbranches = lp.nbranches = nb;
  if (st == NB_OK && nout + nslots > 256) st = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "the branches need %d residuals (at most %d)", nslots, 256 - nout);
  for (int b = 0; st == NB_OK && b < nb; b++)
    for (int r = 0, k = slot0[b]; r < pe[b].nres; r++)
      if (pe[b].res_input[r] < 0) slot_av[k++] = nb__graph_input(pe[b].lin, (size_t)r)->aval;
  int nused = 0, nt = 0;
  for (int i = 0; i < nops; i++) nused += used[i], nt += tan[i];
  for (int b = 0; st == NB_OK && b < nb; b++) {
    /* known branch b: ops -> (outputs, every slot: its own residuals, zeros elsewhere) */
    nb_aval av[256];
    nb_val *ins[768], *kout[512], *res[512], *map[768];
    for (int i = 0; i < nops; i++) av[i] = e->in[1 + i]->aval;
    nb_graph *w = graph_with_inputs(ctx, nops, av, "in", ins);
    int nr = 0;
    if (w && nb__graph_inline(w, pe[b].known, ins, kout) == NB_OK) {
      for (int o = 0; o < nout; o++) res[nr++] = kout[o];
      for (int k = 0; k < nslots; k++)
        res[nr++] = k >= slot0[b] && k < slot0[b + 1] ? kout[nout + k - slot0[b]] : nb__zeros(w, slot_av[k]);
    }
    if (!(kp.branches[b] = finish_graph(w, nr, res, "out"))) st = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    /* linear branch b: (slots, used ops, tangents) -> output tangents */
    nb_aval lav[768];
    int n = 0;
    for (int k = 0; k < nslots; k++) lav[n++] = slot_av[k];
    for (int i = 0; i < nops; i++)
      if (used[i]) lav[n++] = e->in[1 + i]->aval;
    for (int i = 0; i < nops; i++)
      if (tan[i]) lav[n++] = e->in[1 + i]->aval;
    w = st ? NULL : graph_with_inputs(ctx, n, lav, "in", ins);
    int uidx[256];
    for (int i = 0, u = 0; i < nops; i++) uidx[i] = used[i] ? nslots + u++ : -1;
    for (int r = 0, k = slot0[b]; w && r < pe[b].nres; r++) map[r] = pe[b].res_input[r] >= 0 ? ins[uidx[pe[b].res_input[r]]] : ins[k++];
    for (int i = 0; w && i < nt; i++) map[pe[b].nres + i] = ins[nslots + nused + i];
    int nlo = (int)nb_graph_num_outputs(pe[b].lin);
    if (w && nb__graph_inline(w, pe[b].lin, map, res) != NB_OK) nlo = 0;
    if (!st && !(lp.branches[b] = finish_graph(w, nlo, res, "out"))) st = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  }
  for (int b = 0; b < nb; b++) nb__partial_free(ctx, &pe[b]);
  nb_val *kout[512], *lout[256], *ops[768];
  if (st == NB_OK) {
    nb__emit(g, e->loc, NB_PRIM_cond, e->nin, p, &kp, sizeof kp, NULL, kout);
    int n = 0;
    ops[n++] = p[0];
    for (int k = 0; k < nslots && !nb_graph_status(g); k++) ops[n++] = kout[nout + k];
    for (int i = 0; i < nops; i++)
      if (used[i]) ops[n++] = p[1 + i];
    for (int i = 0; i < nops; i++)
      if (tan[i]) ops[n++] = t[1 + i];
    if (!nb_graph_status(g)) nb__emit(g, e->loc, NB_PRIM_cond, n, ops, &lp, sizeof lp, NULL, lout);
  }
  for (int b = 0; b < nb; b++) {
    nb_graph_destroy((nb_graph *)kp.branches[b]);
    nb_graph_destroy((nb_graph *)lp.branches[b]);
  }
  if (st) return fail_from_ctx(g, e, "cond: linearizing the branches");
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int o = 0; o < nout; o++) outs[o] = kout[o];
  for (int o = 0, k = 0; o < nout; o++) ot[o] = want[o] ? lout[k++] : NULL;
  return NB_OK;
}

/* The transpose of a cond linear in some operands: a cond of the transposed
 * branches, picked by the same index. */
static nb_status cond_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct_out,
                                nb_val **ct_in) {
  const nb_cond_params *cp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nops = e->nin - 1, nout = e->nout;
  if (linear[0]) return nb__fail(g, e->loc, NB_ERR_INTERNAL, "cond: a linear branch index"), NB_ERR_INTERNAL;
  bool has_ct[256];
  for (int o = 0; o < nout; o++) has_ct[o] = ct_out[o] != NULL;
  nb_cond_params tp;
  memset(&tp, 0, sizeof tp);
  tp.nbranches = cp->nbranches;
  nb_status st = NB_OK;
  for (int b = 0; st == NB_OK && b < cp->nbranches; b++)
    if (!(tp.branches[b] = transpose_graph(ctx, cp->branches[b], linear + 1, has_ct))) st = fail_from_ctx(g, e, "cond: transposing a branch");
  nb_val *ops[512], *res[256];
  int n = 0;
  ops[n++] = in[0];
  for (int i = 0; i < nops; i++)
    if (!linear[1 + i]) ops[n++] = in[1 + i];
  for (int o = 0; o < nout; o++)
    if (has_ct[o]) ops[n++] = ct_out[o];
  if (st == NB_OK) nb__emit(g, e->loc, NB_PRIM_cond, n, ops, &tp, sizeof tp, NULL, res);
  for (int b = 0; b < cp->nbranches; b++) nb_graph_destroy((nb_graph *)tp.branches[b]);
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int i = 0, k = 0; i < nops; i++)
    if (linear[1 + i]) ct_in[1 + i] = res[k++];
  return NB_OK;
}

/* vmap: with an unbatched index, a cond of the vmapped branches; with a
 * batched one, every branch runs on the whole batch and a select per branch
 * picks each item's result (as JAX turns cond into select). */
static nb_status cond_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                            int *out_bdims) {
  const nb_cond_params *cp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nops = e->nin - 1, nout = e->nout;
  nb_val *ops[512];
  int inb[512], outb[256];
  if (e->nin > 512) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "vmap of a cond with more than 511 operands"), NB_ERR_UNIMPLEMENTED;
  for (int i = 0; i < nops; i++) {
    ops[1 + i] = bdims[1 + i] < 0 ? in[1 + i] : nb__move_axis(e->loc, in[1 + i], bdims[1 + i], 0);
    inb[i] = bdims[1 + i] < 0 ? -1 : 0;
  }
  for (int o = 0; o < nout; o++) outb[o] = 0, out_bdims[o] = 0;
  nb_cond_params bp;
  memset(&bp, 0, sizeof bp);
  bp.nbranches = cp->nbranches;
  nb_status st = NB_OK;
  for (int b = 0; st == NB_OK && b < cp->nbranches; b++)
    if (!(bp.branches[b] = nb__vmap_graph_axes(ctx, cp->branches[b], inb, n, outb))) st = fail_from_ctx(g, e, "vmap of cond");
  if (st == NB_OK && bdims[0] < 0) {
    ops[0] = in[0];
    nb__emit(g, e->loc, NB_PRIM_cond, e->nin, ops, &bp, sizeof bp, NULL, out);
  } else if (st == NB_OK) {
    nb_val *idx = nb__move_axis(e->loc, in[0], bdims[0], 0), *res[256];
    idx = nb_clamp_at(e->loc, nb_scalar_at(e->loc, g, NB_I32, 0), idx, nb_scalar_at(e->loc, g, NB_I32, cp->nbranches - 1));
    for (int b = 0; b < cp->nbranches && !nb_graph_status(g); b++) {
      if (nb__graph_inline(g, bp.branches[b], ops + 1, res) != NB_OK) break;
      nb_val *pick = b ? nb_eq_at(e->loc, idx, nb_scalar_at(e->loc, g, NB_I32, b)) : NULL;
      for (int o = 0; o < nout; o++) {
        if (!b) {
          out[o] = res[o];
          continue;
        }
        nb_aval a = res[o]->aval;
        nb_val *m = nb_broadcast_in_dim_at(e->loc, pick, a.shape.rank, a.shape.dims, (int[]){0});
        out[o] = nb_select_at(e->loc, m, res[o], out[o]);
      }
    }
  }
  for (int b = 0; b < cp->nbranches; b++) nb_graph_destroy((nb_graph *)bp.branches[b]);
  return st ? st : nb_graph_status(g);
}

/* ---------------------------------------------------------------- while_loop: derivatives */

/* Forward mode: a while_loop of the JVP'd body, carrying the primal and the
 * tangent carry; cond reads the primal part. */
static nb_status while_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *p, nb_val *const *t, nb_val *const *outs, nb_val **ot) {
  const nb_while_params *wp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nc = wp->ncond_consts, nb = wp->nbody_consts, nk = e->nout, nbin = nb + nk;
  if (e->nin > 256) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "while_loop: differentiating more than 256 operands"), NB_ERR_UNIMPLEMENTED;
  bool tan[256], fwd[256] = {false};
  for (int i = 0; i < nbin; i++) tan[i] = t[nc + i] && nb_dtype_is_float(e->in[nc + i]->aval.dtype);
  if (carry_fixpoint(ctx, wp->body, nb, nk, tan, fwd) != NB_OK) return fail_from_ctx(g, e, "while_loop: the body's JVP");
  int ntb = 0, ntk = 0;
  for (int i = 0; i < nb; i++) ntb += tan[i];
  for (int i = nb; i < nbin; i++) ntk += tan[i];
  /* body: (consts, const tangents, carry, carry tangents) -> (carry, carry tangents) */
  nb_aval av[512];
  nb_val *ins[512], *pin[256], *tin[256], *pout[256], *tout[256], *res[512];
  int n = 0;
  for (int i = 0; i < nb; i++) av[n++] = e->in[nc + i]->aval;
  for (int i = 0; i < nb; i++)
    if (tan[i]) av[n++] = e->in[nc + i]->aval;
  for (int i = nb; i < nbin; i++) av[n++] = e->in[nc + i]->aval;
  for (int i = nb; i < nbin; i++)
    if (tan[i]) av[n++] = e->in[nc + i]->aval;
  nb_graph *w = graph_with_inputs(ctx, n, av, "in", ins);
  int nr = 0;
  if (w) {
    int k = 0;
    for (int i = 0; i < nb; i++) pin[i] = ins[k++];
    for (int i = 0; i < nb; i++) tin[i] = tan[i] ? ins[k++] : NULL;
    for (int i = nb; i < nbin; i++) pin[i] = ins[k++];
    for (int i = nb; i < nbin; i++) tin[i] = tan[i] ? ins[k++] : NULL;
    if (nb__jvp_into(w, wp->body, pin, tin, pout, tout) == NB_OK) {
      for (int i = 0; i < nk; i++) res[nr++] = pout[i];
      for (int i = 0; i < nk; i++)
        if (tan[nb + i]) res[nr++] = tout[i] ? tout[i] : nb__zeros(w, pout[i]->aval);
    }
  }
  nb_graph *body = finish_graph(w, nr, res, "out");
  /* cond: (consts, carry, carry tangents) -> cond(consts, carry) */
  n = 0;
  for (int i = 0; i < nc; i++) av[n++] = e->in[i]->aval;
  for (int i = nb; i < nbin; i++) av[n++] = e->in[nc + i]->aval;
  for (int i = nb; i < nbin; i++)
    if (tan[i]) av[n++] = e->in[nc + i]->aval;
  w = body ? graph_with_inputs(ctx, n, av, "in", ins) : NULL;
  nr = w && nb__graph_inline(w, wp->cond, ins, res) == NB_OK ? 1 : 0;
  nb_graph *cond = finish_graph(w, nr, res, "go");
  if (!body || !cond) {
    nb_graph_destroy(body);
    return fail_from_ctx(g, e, "while_loop: the body's JVP");
  }
  nb_val *ops[512], *jout[512];
  n = 0;
  for (int i = 0; i < nc + nb; i++) ops[n++] = p[i];
  for (int i = 0; i < nb; i++)
    if (tan[i]) ops[n++] = t[nc + i];
  for (int i = nb; i < nbin; i++) ops[n++] = p[nc + i];
  for (int i = nb; i < nbin; i++)
    if (tan[i]) ops[n++] = t[nc + i] ? t[nc + i] : nb__zeros(g, e->in[nc + i]->aval);
  nb_while_params jp = *wp;
  jp.cond = cond;
  jp.body = body;
  jp.nbody_consts = nb + ntb;
  nb__emit(g, e->loc, NB_PRIM_while_loop, n, ops, &jp, sizeof jp, NULL, jout);
  nb_graph_destroy(body);
  nb_graph_destroy(cond);
  if (nb_graph_status(g)) return nb_graph_status(g);
  for (int i = 0, k = nk; i < nk; i++) ot[i] = tan[nb + i] ? jout[k++] : NULL;
  (void)ntk;
  return NB_OK;
}

static nb_status while_transpose(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear, nb_val *const *ct_out,
                                 nb_val **ct_in) {
  return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED,
                  "reverse-mode differentiation of while_loop is not supported: its trip count is unknown, so its residuals cannot "
                  "be stored (as in JAX); use fori_loop with constant bounds, or scan with a fixed length"),
         NB_ERR_UNIMPLEMENTED;
}

/* vmap: the carry batched at 0 and the loop run under a mask, as JAX does
 * for a batched predicate: it goes on while any item's cond holds, and each
 * trip updates only the items whose cond holds. */
static nb_status while_batch(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t n, nb_val **out,
                             int *out_bdims) {
  const nb_while_params *wp = e->params;
  nb_ctx *ctx = nb_graph_ctx(g);
  int nc = wp->ncond_consts, nb = wp->nbody_consts, nk = e->nout;
  if (e->nin > 256) return nb__fail(g, e->loc, NB_ERR_UNIMPLEMENTED, "vmap of a while_loop with more than 256 operands"), NB_ERR_UNIMPLEMENTED;
  nb_val *ops[256];
  int inb[256], cinb[256], binb[256], one0[256] = {0};
  for (int i = 0; i < e->nin; i++) {
    bool carry = i >= nc + nb;
    ops[i] = carry ? nb__batch_to_front(e->loc, in[i], bdims[i], n) : bdims[i] < 0 ? in[i] : nb__move_axis(e->loc, in[i], bdims[i], 0);
    inb[i] = carry || bdims[i] >= 0 ? 0 : -1;
  }
  for (int i = 0; i < nc; i++) cinb[i] = inb[i];
  for (int i = 0; i < nk; i++) cinb[nc + i] = 0;
  for (int i = 0; i < nb; i++) binb[i] = inb[nc + i];
  for (int i = 0; i < nk; i++) binb[nb + i] = 0;
  nb_graph *vc = nb__vmap_graph_axes(ctx, wp->cond, cinb, n, one0);
  nb_graph *vb = vc ? nb__vmap_graph_axes(ctx, wp->body, binb, n, one0) : NULL;
  if (!vc || !vb) {
    nb_graph_destroy(vc);
    return fail_from_ctx(g, e, "vmap of while_loop");
  }
  nb_aval av[512];
  nb_val *ins[512], *res[256], *pred, *go;
  /* cond: (cond consts, carry) -> any(cond) */
  for (int i = 0; i < nc; i++) av[i] = ops[i]->aval;
  for (int i = 0; i < nk; i++) av[nc + i] = ops[nc + nb + i]->aval;
  nb_graph *w = graph_with_inputs(ctx, nc + nk, av, "in", ins);
  int nr = 0;
  if (w && nb__graph_inline(w, vc, ins, &pred) == NB_OK) {
    go = nb_ne_at(e->loc, nb_reduce_max_at(e->loc, nb_convert_at(e->loc, pred, NB_I32), 1, (int[]){0}), nb_scalar_at(e->loc, w, NB_I32, 0));
    nr = 1;
  }
  nb_graph *cond = finish_graph(w, nr, &go, "go");
  /* body: (cond consts, body consts, carry) -> where(cond, body, carry) */
  for (int i = 0; i < nc + nb + nk; i++) av[i] = ops[i]->aval;
  w = cond ? graph_with_inputs(ctx, nc + nb + nk, av, "in", ins) : NULL;
  nr = 0;
  nb_val *cin[256];
  for (int i = 0; w && i < nc; i++) cin[i] = ins[i];
  for (int i = 0; w && i < nk; i++) cin[nc + i] = ins[nc + nb + i];
  if (w && nb__graph_inline(w, vc, cin, &pred) == NB_OK && nb__graph_inline(w, vb, ins + nc, res) == NB_OK) {
    for (int i = 0; i < nk; i++) {
      nb_aval a = res[i]->aval;
      nb_val *m = nb_broadcast_in_dim_at(e->loc, pred, a.shape.rank, a.shape.dims, (int[]){0});
      res[i] = nb_select_at(e->loc, m, res[i], ins[nc + nb + i]);
    }
    nr = nk;
  }
  nb_graph *body = finish_graph(w, nr, res, "out");
  nb_graph_destroy(vc);
  nb_graph_destroy(vb);
  if (!cond || !body) {
    nb_graph_destroy(cond);
    return fail_from_ctx(g, e, "vmap of while_loop");
  }
  nb_val *all[512];
  int n2 = 0;
  for (int i = 0; i < nc; i++) all[n2++] = ops[i];
  for (int i = 0; i < nc + nb + nk; i++) all[n2++] = ops[i];
  nb_while_params bp = *wp;
  bp.cond = cond;
  bp.body = body;
  bp.nbody_consts = nc + nb;
  nb__emit(g, e->loc, NB_PRIM_while_loop, n2, all, &bp, sizeof bp, NULL, out);
  nb_graph_destroy(cond);
  nb_graph_destroy(body);
  for (int i = 0; i < nk; i++) out_bdims[i] = 0;
  return nb_graph_status(g);
}

/* ---------------------------------------------------------------- rules */

const nb_prim_rules nb__prim_cond = {
    .name = "cond",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_cond_params),
    .infer = cond_infer,
    .eval = cond_eval,
    .linearize = cond_linearize,
    .transpose = cond_transpose,
    .batch = cond_batch,
    .cost = cond_cost,
    .print_params = cond_print,
    .hold_params = cond_hold,
};

const nb_prim_rules nb__prim_while_loop = {
    .name = "while_loop",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_while_params),
    .infer = while_infer,
    .eval = while_eval,
    .jvp = while_jvp,
    .transpose = while_transpose,
    .batch = while_batch,
    .cost = while_cost,
    .print_params = while_print,
    .hold_params = while_hold,
};

const nb_prim_rules nb__prim_scan = {
    .name = "scan",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_scan_params),
    .infer = scan_infer,
    .eval = scan_eval,
    .linearize = scan_linearize,
    .transpose = scan_transpose,
    .batch = scan_batch,
    .cost = scan_cost,
    .print_params = scan_print,
    .hold_params = scan_hold,
};

/* ---------------------------------------------------------------- public */

/* The graph being built, or NULL after recording why not: every operand must
 * belong to g, and the carried graphs must be free of errors. */
static bool api_ready(nb_graph *g, nb_loc loc, const char *what, int ngraphs, const nb_graph *const *graphs, int nvals,
                      nb_val *const *vals) {
  if (nb_graph_status(g)) return false;
  for (int k = 0; k < ngraphs; k++) {
    if (!graphs[k]) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: graph %d is NULL", what, k), false;
    if (nb_graph_status(graphs[k]))
      return nb__fail(g, loc, nb_graph_status(graphs[k]), "%s: graph %d is in error: %s", what, k, nb_graph_error(graphs[k])), false;
  }
  for (int i = 0; i < nvals; i++) {
    if (!vals[i]) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: operand %d is NULL", what, i), false;
    if (nb__is_poison(vals[i])) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: operand %d is poisoned", what, i), false;
    if (nb_val_graph(vals[i]) != g) return nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: operand %d belongs to another graph", what, i), false;
  }
  return true;
}

/* Fills outs[0..n) with the poison value after an error. */
static nb_status finish(nb_graph *g, int n, nb_val **outs) {
  nb_status st = nb_graph_status(g);
  for (int i = 0; st && outs && i < n; i++) outs[i] = nb__poison(g);
  return st;
}

/* Gathers groups of operands into one array (at most 512). */
static int gather_ops(nb_val **ops, int ngroups, const int *counts, nb_val *const *const *groups) {
  int n = 0;
  for (int k = 0; k < ngroups; k++)
    for (int i = 0; i < counts[k]; i++) {
      if (n >= 512) return -1;
      ops[n++] = groups[k][i];
    }
  return n;
}

nb_status nb_switch_at(nb_loc loc, nb_graph *g, nb_val *index, int nbranches, const nb_graph *const *branches, int nops,
                       nb_val *const *ops, nb_val **outs) {
  if (!g) return NB_ERR_INVALID_ARG;
  int nout = nbranches > 0 && branches && branches[0] ? (int)nb_graph_num_outputs(branches[0]) : 0;
  if (nbranches < 1 || nbranches > NB_COND_MAX_BRANCHES || !branches || nops < 0 || nops > 511 || (nops && !ops) || (nout && !outs)) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "switch: needs 1 to %d branches and at most 511 operands (got %d branches, %d operands)",
             NB_COND_MAX_BRANCHES, nbranches, nops);
    return finish(g, nout, outs);
  }
  if (!api_ready(g, loc, "switch", nbranches, branches, nops, ops) || !api_ready(g, loc, "switch", 0, NULL, 1, &index))
    return finish(g, nout, outs);
  if (!nb_dtype_is_int(nb_val_dtype(index)) || nb_val_rank(index) != 0) {
    char a[128];
    nb__fail(g, loc, NB_ERR_DTYPE, "switch: the index must be an integer scalar, not %s", aval_text(nb_val_aval(index), a, sizeof a));
    return finish(g, nout, outs);
  }
  nb_cond_params p;
  memset(&p, 0, sizeof p);
  p.nbranches = nbranches;
  for (int k = 0; k < nbranches; k++) p.branches[k] = branches[k];
  nb_val *all[512];
  all[0] = nb_val_dtype(index) == NB_I32 ? index : nb_convert_at(loc, index, NB_I32);
  copy_bytes(all + 1, ops, sizeof(nb_val *) * (size_t)nops);
  nb__emit(g, loc, NB_PRIM_cond, nops + 1, all, &p, sizeof p, NULL, outs);
  return finish(g, nout, outs);
}

nb_status nb_cond_at(nb_loc loc, nb_graph *g, nb_val *pred, const nb_graph *on_true, const nb_graph *on_false, int nops,
                     nb_val *const *ops, nb_val **outs) {
  if (!g) return NB_ERR_INVALID_ARG;
  int nout = on_true ? (int)nb_graph_num_outputs(on_true) : 0;
  if (!api_ready(g, loc, "cond", 0, NULL, 1, &pred)) return finish(g, nout, outs);
  if (!is_scalar(nb_val_aval(pred), NB_BOOL)) {
    char a[128];
    nb__fail(g, loc, NB_ERR_DTYPE, "cond: the predicate must be a bool scalar, not %s", aval_text(nb_val_aval(pred), a, sizeof a));
    return finish(g, nout, outs);
  }
  const nb_graph *branches[2] = {on_false, on_true}; /* index 1 when pred holds */
  return nb_switch_at(loc, g, nb_convert_at(loc, pred, NB_I32), 2, branches, nops, ops, outs);
}

nb_status nb_while_loop_at(nb_loc loc, nb_graph *g, const nb_graph *cond, const nb_graph *body, int ncond_consts,
                           nb_val *const *cond_consts, int nbody_consts, nb_val *const *body_consts, int ncarry,
                           nb_val *const *init, nb_val **outs) {
  if (!g) return NB_ERR_INVALID_ARG;
  const nb_graph *graphs[2] = {cond, body};
  nb_val *ops[512];
  int counts[3] = {ncond_consts, nbody_consts, ncarry};
  nb_val *const *groups[3] = {cond_consts, body_consts, init};
  int n = ncond_consts < 0 || nbody_consts < 0 || ncarry < 0 || (ncarry && !outs) ? -1 : gather_ops(ops, 3, counts, groups);
  if (n < 0) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "while_loop: bad operand counts (%d cond consts, %d body consts, %d carry; at most 512 in all)",
             ncond_consts, nbody_consts, ncarry);
    return finish(g, ncarry > 0 ? ncarry : 0, outs);
  }
  if (!api_ready(g, loc, "while_loop", 2, graphs, n, ops)) return finish(g, ncarry, outs);
  nb_while_params p;
  memset(&p, 0, sizeof p);
  p.cond = cond;
  p.body = body;
  p.ncond_consts = ncond_consts;
  p.nbody_consts = nbody_consts;
  nb__emit(g, loc, NB_PRIM_while_loop, n, ops, &p, sizeof p, NULL, outs);
  return finish(g, ncarry, outs);
}

nb_status nb_scan_at(nb_loc loc, nb_graph *g, const nb_graph *body, int nconsts, nb_val *const *consts, int ncarry,
                     nb_val *const *init, int nxs, nb_val *const *xs, const nb_scan_opts *opts, nb_val **carry_out,
                     nb_val **ys) {
  if (!g) return NB_ERR_INVALID_ARG;
  nb_val *ops[512], *outs[256];
  int counts[3] = {nconsts, ncarry, nxs};
  nb_val *const *groups[3] = {consts, init, xs};
  int nys = body ? (int)nb_graph_num_outputs(body) - ncarry : 0;
  int n = nconsts < 0 || ncarry < 0 || nxs < 0 ? -1 : gather_ops(ops, 3, counts, groups);
  if (n < 0 || (ncarry > 0 && !carry_out) || (nys > 0 && !ys) || ncarry + (nys > 0 ? nys : 0) > 256) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG,
             "scan: bad operand counts or missing output arrays (%d consts, %d carry, %d xs; at most 512 operands and 256 outputs)", nconsts,
             ncarry, nxs);
    finish(g, ncarry > 0 ? ncarry : 0, carry_out);
    return finish(g, nys > 0 ? nys : 0, ys);
  }
  if (!api_ready(g, loc, "scan", 1, &body, n, ops)) {
    finish(g, ncarry, carry_out);
    return finish(g, nys > 0 ? nys : 0, ys);
  }
  nb_scan_params p;
  memset(&p, 0, sizeof p);
  p.body = body;
  p.nconsts = nconsts;
  p.ncarry = ncarry;
  p.reverse = opts && opts->reverse;
  p.unroll = opts && opts->unroll > 1 ? opts->unroll : 1;
  p.length = opts ? opts->length : 0;
  if (p.length == 0) {
    if (nxs == 0) nb__fail(g, loc, NB_ERR_INVALID_ARG, "scan: with no xs, opts->length must give the trip count");
    else p.length = nb_val_rank(xs[0]) > 0 ? nb_val_dim(xs[0], 0) : -1;
    if (p.length < 0) nb__fail(g, loc, NB_ERR_SHAPE, "scan: xs 0 is a scalar (xs are scanned over their leading axis)");
  }
  if (!nb_graph_status(g)) nb__emit(g, loc, NB_PRIM_scan, n, ops, &p, sizeof p, NULL, outs);
  for (int i = 0; !nb_graph_status(g) && i < ncarry; i++) carry_out[i] = outs[i];
  for (int j = 0; !nb_graph_status(g) && j < nys; j++) ys[j] = outs[ncarry + j];
  finish(g, ncarry, carry_out);
  return finish(g, nys > 0 ? nys : 0, ys);
}

/* ---------------------------------------------------------------- fori_loop */

/* The value of an integer scalar constant, if v is one. */
static bool const_int(const nb_val *v, int64_t *out) {
  if (!v->def || v->def->prim != NB_PRIM_constant || v->aval.shape.rank != 0 || !nb_dtype_is_int(v->aval.dtype)) return false;
  *out = (int64_t)nb_array_get(((const nb_constant_params *)v->def->params)->value, 0);
  return true;
}

/* fori's step as a graph (consts..., i, carry...) -> (i + 1, carry...): the
 * scan body (no consts split: the wrapper's consts are body's). */
static nb_graph *fori_step(nb_ctx *ctx, const nb_graph *body, int nconsts, int ncarry) {
  int n = nconsts + 1 + ncarry;
  nb_aval av[512];
  nb_val *ins[512], *outs[512], *next[257];
  for (int i = 0; i < n; i++) av[i] = nb__graph_input(body, (size_t)i)->aval;
  nb_graph *w = graph_with_inputs(ctx, n, av, "in", ins);
  int nr = 0;
  if (w && nb__graph_inline(w, body, ins, outs) == NB_OK) {
    next[0] = nb_add_at((nb_loc){0}, ins[nconsts], nb_scalar_at((nb_loc){0}, w, NB_I32, 1));
    copy_bytes(next + 1, outs, sizeof(nb_val *) * (size_t)ncarry);
    nr = ncarry + 1;
  }
  return finish_graph(w, nr, next, "out");
}

/* (upper, i, carry...) -> i < upper */
static nb_graph *fori_cond(nb_ctx *ctx, const nb_graph *body, int nconsts, int ncarry) {
  nb_aval av[512];
  nb_val *ins[512];
  av[0] = av[1] = nb_aval_make(NB_I32, 0, NULL);
  for (int i = 0; i < ncarry; i++) av[2 + i] = nb__graph_input(body, (size_t)(nconsts + 1 + i))->aval;
  nb_graph *w = graph_with_inputs(ctx, ncarry + 2, av, "in", ins);
  nb_val *go = w ? nb_lt_at((nb_loc){0}, ins[1], ins[0]) : NULL;
  return finish_graph(w, 1, &go, "go");
}

nb_status nb_fori_loop_at(nb_loc loc, nb_graph *g, nb_val *lower, nb_val *upper, const nb_graph *body, int nconsts,
                          nb_val *const *consts, int ncarry, nb_val *const *init, nb_val **outs) {
  if (!g) return NB_ERR_INVALID_ARG;
  nb_val *bounds[2] = {lower, upper};
  if (nconsts < 0 || ncarry < 0 || nconsts + ncarry > 254 || (ncarry && !outs)) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "fori_loop: bad operand counts (%d consts, %d carry; at most 254 in all)", nconsts, ncarry);
    return finish(g, ncarry > 0 ? ncarry : 0, outs);
  }
  if (!api_ready(g, loc, "fori_loop", 1, &body, 2, bounds)) return finish(g, ncarry, outs);
  for (int k = 0; k < 2; k++)
    if (!nb_dtype_is_int(nb_val_dtype(bounds[k])) || nb_val_rank(bounds[k]) != 0) {
      char a[128];
      nb__fail(g, loc, NB_ERR_DTYPE, "fori_loop: the %s bound must be an integer scalar, not %s", k ? "upper" : "lower",
               aval_text(nb_val_aval(bounds[k]), a, sizeof a));
      return finish(g, ncarry, outs);
    }
  if (nb_graph_num_inputs(body) != (size_t)(nconsts + 1 + ncarry) ||
      !is_scalar(nb__graph_input(body, (size_t)nconsts)->aval, NB_I32)) {
    nb__fail(g, loc, NB_ERR_INVALID_ARG, "fori_loop: body must take %d consts, the i32 scalar index, then %d carry values (it takes %zu inputs)",
             nconsts, ncarry, nb_graph_num_inputs(body));
    return finish(g, ncarry, outs);
  }
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_graph *step = fori_step(ctx, body, nconsts, ncarry);
  if (!step) {
    nb__fail(g, loc, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM, "fori_loop: %s", nb_ctx_error(ctx));
    return finish(g, ncarry, outs);
  }
  nb_val *lo = nb_convert_at(loc, lower, NB_I32), *hi = nb_convert_at(loc, upper, NB_I32);
  nb_val *carry[256], *res[256];
  carry[0] = lo;
  copy_bytes(carry + 1, init, sizeof(nb_val *) * (size_t)ncarry);
  int64_t a, b;
  if (const_int(lower, &a) && const_int(upper, &b)) {
    nb_scan_opts o = {.length = b > a ? b - a : 0};
    if (o.length > 0) nb_scan_at(loc, g, step, nconsts, consts, ncarry + 1, carry, 0, NULL, &o, res, NULL);
    else memcpy(res, carry, sizeof(nb_val *) * (size_t)(ncarry + 1)); /* no trips */
  } else {
    nb_graph *cond = fori_cond(ctx, body, nconsts, ncarry);
    if (!cond) nb__fail(g, loc, nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM, "fori_loop: %s", nb_ctx_error(ctx));
    else nb_while_loop_at(loc, g, cond, step, 1, &hi, nconsts, consts, ncarry + 1, carry, res);
    nb_graph_destroy(cond);
  }
  nb_graph_destroy(step);
  for (int i = 0; !nb_graph_status(g) && i < ncarry; i++) outs[i] = res[1 + i];
  return finish(g, ncarry, outs);
}
