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

static void copy_into(nb_array *dst, const nb_array *src) {
  memcpy(nb_array_data_mut(dst), nb_array_data(src), nb_array_nbytes(dst));
}

/* The print form of a carried graph: its structural hash, so that graphs with
 * different bodies print (and hash, nb_graph_hash) differently. */
static int print_graph(char *buf, size_t cap, const char *name, const nb_graph *callee) {
  return snprintf(buf, cap, "%s=#%016llx", name, (unsigned long long)nb_graph_hash(callee));
}

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
    n += (size_t)print_graph(buf + n, cap - n, name, p->branches[k]);
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
  if (n < cap) n += (size_t)print_graph(buf + n, cap - n, "cond", p->cond);
  if (n < cap) n += (size_t)snprintf(buf + n, cap - n, " ");
  if (n < cap) print_graph(buf + n, cap - n, "body", p->body);
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
      memcpy(nb_array_data_mut(rows[j]), (const char *)nb_array_data(in[nc + nk + j]) + (size_t)t * rb, rb);
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
      memcpy((char *)nb_array_data_mut(out[nk + j]) + (size_t)t * yb, nb_array_data(res[nk + j]), yb);
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
  if (n < cap) print_graph(buf + n, cap - n, "body", p->body);
}

/* ---------------------------------------------------------------- rules */

const nb_prim_rules nb__prim_cond = {
    .name = "cond",
    .kind = NB_KIND_OTHER,
    .params_size = sizeof(nb_cond_params),
    .infer = cond_infer,
    .eval = cond_eval,
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
  memcpy(all + 1, ops, sizeof(nb_val *) * (size_t)nops);
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

/* A graph with fresh inputs of the given avals, named <prefix><i>. */
static nb_graph *graph_with_inputs(nb_ctx *ctx, int n, const nb_aval *avals, const char *prefix, nb_val **ins) {
  nb_graph *w = nb_graph_create(ctx);
  char path[64];
  for (int i = 0; w && i < n; i++) {
    snprintf(path, sizeof path, "%s%d", prefix, i);
    ins[i] = nb__graph_add_input(w, path, avals[i]);
  }
  return w;
}

static nb_status add_outputs(nb_graph *w, int n, nb_val *const *vals, const char *prefix) {
  char path[64];
  nb_status st = nb_graph_status(w);
  for (int i = 0; st == NB_OK && i < n; i++) {
    snprintf(path, sizeof path, "%s%d", prefix, i);
    st = nb__graph_add_output(w, path, vals[i]);
  }
  return st ? st : nb_graph_status(w);
}

/* fori's step as a graph (consts..., i, carry...) -> (i + 1, carry...): the
 * scan body (no consts split: the wrapper's consts are body's). */
static nb_graph *fori_step(nb_ctx *ctx, const nb_graph *body, int nconsts, int ncarry) {
  int n = nconsts + 1 + ncarry;
  nb_aval av[512];
  nb_val *ins[512], *outs[512];
  for (int i = 0; i < n; i++) av[i] = nb__graph_input(body, (size_t)i)->aval;
  nb_graph *w = graph_with_inputs(ctx, n, av, "in", ins);
  if (!w) return NULL;
  nb_val *next[257];
  if (nb__graph_inline(w, body, ins, outs) == NB_OK) {
    next[0] = nb_add_at((nb_loc){0}, ins[nconsts], nb_scalar_at((nb_loc){0}, w, NB_I32, 1));
    memcpy(next + 1, outs, sizeof(nb_val *) * (size_t)ncarry);
  }
  if (add_outputs(w, ncarry + 1, next, "out") != NB_OK) {
    nb_errorf(ctx, nb_graph_status(w) ? nb_graph_status(w) : NB_ERR_INTERNAL, "fori_loop: %s", nb_graph_error(w));
    nb_graph_destroy(w);
    return NULL;
  }
  return w;
}

/* (upper, i, carry...) -> i < upper */
static nb_graph *fori_cond(nb_ctx *ctx, const nb_graph *body, int nconsts, int ncarry) {
  nb_aval av[512];
  nb_val *ins[512];
  av[0] = av[1] = nb_aval_make(NB_I32, 0, NULL);
  for (int i = 0; i < ncarry; i++) av[2 + i] = nb__graph_input(body, (size_t)(nconsts + 1 + i))->aval;
  nb_graph *w = graph_with_inputs(ctx, ncarry + 2, av, "in", ins);
  if (!w) return NULL;
  nb_val *go = nb_lt_at((nb_loc){0}, ins[1], ins[0]);
  if (add_outputs(w, 1, &go, "go") != NB_OK) {
    nb_graph_destroy(w);
    return NULL;
  }
  return w;
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
  memcpy(carry + 1, init, sizeof(nb_val *) * (size_t)ncarry);
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
