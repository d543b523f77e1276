/* The kernel body generator shared by the backends that generate code from
 * the plan's kernel IR (backend/cpu/codegen_c.c: C; backend/cuda/codegen_cu.c:
 * CUDA C): the C types of the dtypes, a node's expression (the primitive's
 * own C template, ir.h's nb_c_expr, or a dtype conversion), the phases of a
 * row kernel with their accumulators, and the stores. A generator frames
 * these in its own loops or threads and picks the schedule; the helper
 * functions the expressions call (nbx_*) are nb_kgen__helpers, which each
 * generator puts after its own prelude.
 * Arithmetic follows the interpreter's rules (integer wrap-around, x/0, NaN
 * propagation of max/min, saturating float->int converts); libm functions
 * are called in double and rounded, as the interpreter does (exp, tanh and
 * logistic of floats narrower than f64: the interpreter's float functions,
 * core/prims/float_math.h), and sums are accumulated in double, in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kgen.h"
#include "core/prims/erf_inv.h"
#include "core/prims/float_math.h"

/* plain C (memcpy, fmaf, the double libm functions, NAN, isfinite,
 * INT64_MAX/MIN): the CUDA generator compiles them as device functions */
const char nb_kgen__helpers[] =
    "static inline float nbx_ld_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline uint16_t nbx_st_bf16(float x) { uint32_t u; memcpy(&u, &x, 4);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);\n"
    "  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
    "static inline float nbx_r_bf16(float x) { return nbx_ld_bf16(nbx_st_bf16(x)); }\n"
    "static inline float nbx_ld_f16(uint16_t h) { uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;\n"
    "  if (e == 0) { if (m == 0) u = s; else { int k = -1; do { k++; m <<= 1; } while (!(m & 0x400u));\n"
    "      u = s | ((uint32_t)(127 - 15 - k) << 23) | ((m & 0x3ffu) << 13); } }\n"
    "  else if (e == 31) u = s | 0x7f800000u | (m << 13); else u = s | ((e + 127 - 15) << 23) | (m << 13);\n"
    "  float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline uint16_t nbx_st_f16(float x) { uint32_t u; memcpy(&u, &x, 4); uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n"
    "  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu));\n"
    "  if (a >= 0x47800000u) return (uint16_t)(s | 0x7c00u);\n"
    "  if (a < 0x38800000u) { if (a < 0x33000000u) return (uint16_t)s; uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u,\n"
    "      sh = 126 - e, q = m >> sh, r = m & ((1u << sh) - 1), h = 1u << (sh - 1);\n"
    "    if (r > h || (r == h && (q & 1u))) q++; return (uint16_t)(s | q); }\n"
    "  uint32_t v = a - ((127u - 15u) << 23), q = v >> 13, r = v & 0x1fffu;\n"
    "  if (r > 0x1000u || (r == 0x1000u && (q & 1u))) q++; return (uint16_t)(s | q); }\n"
    "static inline float nbx_r_f16(float x) { return nbx_ld_f16(nbx_st_f16(x)); }\n"
    "static inline float nbx_r_f16d(double v) { float f = (float)v;\n"
    "  if ((double)f != v && v == v && isfinite(v)) { uint32_t u; memcpy(&u, &f, 4); if (((double)f > v) == (v > 0)) u -= 1; u |= 1; memcpy(&f, &u, 4); }\n"
    "  return nbx_r_f16(f); }\n"
    "static inline float nbx_maxf(float a, float b) { return a != a || b != b ? NAN : a > b ? a : b; }\n"
    "static inline float nbx_minf(float a, float b) { return a != a || b != b ? NAN : a < b ? a : b; }\n"
    "static inline double nbx_max(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }\n"
    "static inline double nbx_min(double a, double b) { return a != a || b != b ? NAN : a < b ? a : b; }\n"
    "static inline float nbx_clampf(float l, float x, float h) { return x != x ? x : x < l ? l : x > h ? h : x; }\n"
    "static inline double nbx_clamp(double l, double x, double h) { return x != x ? x : x < l ? l : x > h ? h : x; }\n"
    "static inline double nbx_logistic(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }\n"
    "static inline double nbx_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : x; }\n"
    /* exp, tanh and logistic of 32-bit and narrower floats: the interpreter's
     * own float definitions, vectorizable */
    NB__FLOAT_MATH_SOURCE(nbx_) "\n"
    NB__ERF_INV_SOURCE(nbx_erf_inv) "\n"
    "static inline int64_t nbx_idiv(int64_t a, int64_t b) { return b == 0 ? -1 : b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b; }\n"
    "static inline int64_t nbx_irem(int64_t a, int64_t b) { return b == 0 ? a : b == -1 ? 0 : a % b; }\n"
    "static inline int64_t nbx_ipow(int64_t a, int64_t b) { if (b < 0) return a == 1 ? 1 : a == -1 ? (b % 2 ? -1 : 1) : 0;\n"
    "  uint64_t r = 1, x = (uint64_t)a; while (b) { if (b & 1) r *= x; x *= x; b >>= 1; } return (int64_t)r; }\n"
    "static inline int64_t nbx_sat(double v, double lo, double hi) { return v != v ? 0 : v <= lo ? (int64_t)lo : v >= hi ? (int64_t)hi : (int64_t)v; }\n"
    "static inline int64_t nbx_f2i64(double v) { return v != v ? 0 : v >= 9.2233720368547758e18 ? INT64_MAX : v <= -9.2233720368547758e18 ? INT64_MIN : (int64_t)v; }\n";


/* ---------------------------------------------------------------- types */

bool nb_kgen__is_float(nb_dtype t) { return t == NB_F32 || t == NB_F64 || t == NB_BF16 || t == NB_F16; }

/* The C type a value is computed in. */
const char *nb_kgen__ctype(nb_dtype t) {
  switch (t) {
  case NB_F32: case NB_BF16: case NB_F16: return "float";
  case NB_F64: return "double";
  case NB_I8: return "int8_t";
  case NB_U8: case NB_BOOL: return "uint8_t";
  case NB_I32: return "int32_t";
  case NB_I64: return "int64_t";
  case NB_U32: return "uint32_t";
  default: return "int";
  }
}

/* The C type a value is stored in. */
const char *nb_kgen__stype(nb_dtype t) { return t == NB_BF16 || t == NB_F16 ? "uint16_t" : nb_kgen__ctype(t); }

nb_dtype nb_kgen__arg_dtype(const nb_kernel *k, int a) {
  nb_dtype d = NB_F32;
  for (int i = 0; i < k->nnodes; i++)
    if (k->nodes[i].kind == NB_KN_LOAD && k->nodes[i].arg == a) d = k->nodes[i].dtype;
  for (int s = 0; s < k->nstores; s++)
    if (k->stores[s].arg == a) d = k->nodes[k->stores[s].node].dtype;
  return d;
}

/* Rounds a float expression to the value's dtype (bf16/f16 are computed in
 * float and rounded after every operation, as the interpreter stores them). */
static void round_open(nb_jit_text *t, nb_dtype d) {
  if (d == NB_BF16) nb_jit__printf(t, "nbx_r_bf16(");
  else if (d == NB_F16) nb_jit__printf(t, "nbx_r_f16(");
  else nb_jit__printf(t, "(%s)(", nb_kgen__ctype(d));
}

/* ---------------------------------------------------------------- expressions */

static void affine(nb_jit_text *t, const nb_kernel *k, const nb_kaffine *a) {
  nb_jit__printf(t, "(INT64_C(%lld)", (long long)a->base);
  for (int v = 0; v < k->ro + k->rr; v++) {
    if (!a->coef[v]) continue;
    const char *name = v < k->ro ? "i" : "r";
    int idx = v < k->ro ? v : v - k->ro;
    if (a->coef[v] == 1) nb_jit__printf(t, " + %s%d", name, idx);
    else nb_jit__printf(t, " + INT64_C(%lld) * %s%d", (long long)a->coef[v], name, idx);
  }
  nb_jit__printf(t, ")");
}

static void float_literal(nb_jit_text *t, double x, nb_dtype d) {
  const char *s = d == NB_F64 ? "" : "f";
  if (x != x) nb_jit__printf(t, "__builtin_nan%s(\"\")", s);
  else if (isinf(x)) nb_jit__printf(t, "(%s__builtin_inf%s())", x < 0 ? "-" : "", s);
  else if (d == NB_F64) nb_jit__printf(t, "%a", x);
  else nb_jit__printf(t, "%af", (double)(float)x);
}

/* value of node n converted from dtype `from` (held in variable `x`) to `to` */
static void convert_expr(nb_jit_text *t, const char *x, nb_dtype from, nb_dtype to) {
  if (from == to) {
    nb_jit__printf(t, "%s", x);
  } else if (nb_kgen__is_float(from)) {
    switch (to) {
    case NB_F32: nb_jit__printf(t, "(float)%s", x); break;
    case NB_F64: nb_jit__printf(t, "(double)%s", x); break;
    case NB_BF16: nb_jit__printf(t, "nbx_r_bf16((float)%s)", x); break;
    case NB_F16: nb_jit__printf(t, from == NB_F64 ? "nbx_r_f16d(%s)" : "nbx_r_f16((float)%s)", x); break;
    case NB_BOOL: nb_jit__printf(t, "(uint8_t)(%s != 0)", x); break;
    case NB_I8: nb_jit__printf(t, "(int8_t)nbx_sat((double)%s, -128, 127)", x); break;
    case NB_U8: nb_jit__printf(t, "(uint8_t)nbx_sat((double)%s, 0, 255)", x); break;
    case NB_I32: nb_jit__printf(t, "(int32_t)nbx_sat((double)%s, -2147483648.0, 2147483647.0)", x); break;
    case NB_U32: nb_jit__printf(t, "(uint32_t)nbx_sat((double)%s, 0, 4294967295.0)", x); break;
    case NB_I64: nb_jit__printf(t, "nbx_f2i64((double)%s)", x); break;
    default: break;
    }
  } else {
    switch (to) {
    case NB_F32: nb_jit__printf(t, "(float)(double)(int64_t)%s", x); break;
    case NB_F64: nb_jit__printf(t, "(double)(int64_t)%s", x); break;
    case NB_BF16: nb_jit__printf(t, "nbx_r_bf16((float)(double)(int64_t)%s)", x); break;
    case NB_F16: nb_jit__printf(t, "nbx_r_f16((float)(double)(int64_t)%s)", x); break;
    case NB_BOOL: nb_jit__printf(t, "(uint8_t)(%s != 0)", x); break;
    default: nb_jit__printf(t, "(%s)(int64_t)%s", nb_kgen__ctype(to), x); break;
    }
  }
}

/* Writes a primitive's C template (ir.h's nb_c_expr): $0..$2 are the
 * operands, $T the result's C type. */
static void expand(nb_jit_text *t, const char *tmpl, const char *T, const char *const *x, int nx) {
  for (const char *p = tmpl; *p;) {
    const char *d = strchr(p, '$');
    if (!d) {
      nb_jit__printf(t, "%s", p);
      return;
    }
    nb_jit__printf(t, "%.*s", (int)(d - p), p);
    if (d[1] == 'T') nb_jit__printf(t, "%s", T);
    else if (d[1] >= '0' && d[1] < '0' + nx) nb_jit__printf(t, "%s", x[d[1] - '0']);
    else nb_jit__printf(t, "%.2s", d);
    p = d[1] ? d + 2 : d + 1;
  }
}

/* ---------------------------------------------------------------- statements */

typedef nb_kgen cg;

static void indent(cg *g, int depth) { nb_jit__printf(g->t, "%*s", 2 * depth, ""); }

/* An array over the strip (COLUMN schedule) rather than a scalar. */
static bool in_strip(const cg *g, int i) { return g->strip && g->arr[i]; }

/* Marks the loop-invariant nodes: constants, loads and indices at a fixed
 * offset, and operations on those only (a scalar hyperparameter's pow,
 * loaded once rather than per element). */
void nb_kgen__mark_invariant(cg *g) {
  const nb_kernel *k = g->k;
  for (int i = 0; i < k->nnodes; i++) {
    const nb_knode *n = &k->nodes[i];
    bool inv = n->kind != NB_KN_REDUCE;
    if (n->kind == NB_KN_LOAD || n->kind == NB_KN_INDEX)
      for (int v = 0; v < k->ro + k->rr; v++) inv &= n->map.coef[v] == 0;
    for (int j = 0; j < n->nin; j++) inv &= g->inv[n->in[j]] != 0;
    g->inv[i] = inv;
  }
}

static const char *acc_type(const nb_knode *r);

static void mark_array_cone(cg *g, int i) {
  const nb_knode *n = &g->k->nodes[i];
  if (g->inv[i] || n->inner || g->arr[i]) return;
  g->arr[i] = 1;
  for (int j = 0; j < n->nin && n->kind != NB_KN_REDUCE; j++) mark_array_cone(g, n->in[j]);
}

/* The arrays of a strip: the reductions (accumulator and result), and the
 * outer values an inner loop reads (a mean that centers the rows of a
 * variance), with the outer values they are computed from; these are
 * computed before the loops that read them. Every other outer value is
 * computed per point in the strip's last loop, just before the stores, so
 * that a wide strip (whole rows: the reduced loops then read memory in
 * order) needs little stack. With stores inside the reduced loops every
 * outer value is an array, computed before them (as in the ROW schedule). */
size_t nb_kgen__mark_strip_arrays(cg *g, size_t *acc_bytes) {
  const nb_kernel *k = g->k;
  bool inner_stores = false;
  for (int s = 0; s < k->nstores; s++) inner_stores |= k->stores[s].inner;
  memset(g->arr, 0, (size_t)k->nnodes + 1);
  for (int i = 0; i < k->nnodes; i++) {
    const nb_knode *n = &k->nodes[i];
    if (inner_stores || n->kind == NB_KN_REDUCE) g->arr[i] = !n->inner && !g->inv[i];
    for (int j = 0; j < n->nin && n->inner; j++) mark_array_cone(g, n->in[j]);
  }
  size_t bytes = 0;
  *acc_bytes = 0;
  for (int i = 0; i < k->nnodes; i++) {
    if (!g->arr[i]) continue;
    const char *ct = nb_kgen__ctype(k->nodes[i].dtype);
    bytes += !strcmp(ct, "double") || !strcmp(ct, "int64_t") ? 8 : 4;
    if (k->nodes[i].kind == NB_KN_REDUCE) *acc_bytes += !strcmp(acc_type(&k->nodes[i]), "float") ? 4 : 8;
  }
  return bytes + *acc_bytes;
}

static void ref(const cg *g, int i, char *buf, size_t cap) {
  snprintf(buf, cap, in_strip(g, i) ? "v%d[j_]" : "v%d", i);
}

static bool op_expr(const cg *g, const nb_knode *n) {
  nb_jit_text *t = g->t;
  const nb_kernel *k = g->k;
  char a[32] = "", b[32] = "", c[32] = "";
  if (n->nin > 0) ref(g, n->in[0], a, sizeof a);
  if (n->nin > 1) ref(g, n->in[1], b, sizeof b);
  if (n->nin > 2) ref(g, n->in[2], c, sizeof c);
  nb_dtype src = n->nin ? k->nodes[n->in[0]].dtype : n->dtype;
  const nb_prim_rules *r = nb__rules(n->prim);
  if (r->fusion == NB_FUSE_CONVERT) {
    convert_expr(t, a, src, n->dtype);
    return true;
  }
  const char *tmpl = r->fusion == NB_FUSE_EXPR && r->c ? nb__c_template(r->c, src) : NULL;
  if (!tmpl) return false;
  const char *x[3] = {a, b, c};
  bool round = nb_kgen__is_float(n->dtype) && !r->c->exact;
  if (round) round_open(t, n->dtype);
  expand(t, tmpl, nb_kgen__ctype(n->dtype), x, n->nin < 3 ? n->nin : 3);
  if (round) nb_jit__printf(t, ")");
  return true;
}

void nb_kgen__emit_node(cg *g, int i, int depth) {
  const nb_knode *n = &g->k->nodes[i];
  nb_jit_text *t = g->t;
  indent(g, depth);
  if (in_strip(g, i)) nb_jit__printf(t, "v%d[j_] = ", i);
  else nb_jit__printf(t, "const %s v%d = ", nb_kgen__ctype(n->dtype), i);
  switch (n->kind) {
  case NB_KN_LOAD:
    if (n->dtype == NB_BF16 || n->dtype == NB_F16) nb_jit__printf(t, "nbx_ld_%s(a%d[", n->dtype == NB_BF16 ? "bf16" : "f16", n->arg);
    else if (n->dtype == NB_BOOL) nb_jit__printf(t, "(uint8_t)(a%d[", n->arg);
    else nb_jit__printf(t, "a%d[", n->arg);
    affine(t, g->k, &n->map);
    nb_jit__printf(t, n->dtype == NB_BF16 || n->dtype == NB_F16 ? "])" : n->dtype == NB_BOOL ? "] != 0)" : "]");
    break;
  case NB_KN_CONST:
    if (nb_kgen__is_float(n->dtype)) float_literal(t, n->cf, n->dtype);
    else if (n->dtype == NB_BOOL) nb_jit__printf(t, "%d", n->ci != 0);
    else nb_jit__printf(t, "(%s)INT64_C(%lld)", nb_kgen__ctype(n->dtype), (long long)n->ci);
    break;
  case NB_KN_INDEX: {
    nb_jit_text idx = {t->ctx, NULL, 0, 0, false};
    affine(&idx, g->k, &n->map);
    if (idx.oom || !idx.s) g->ok = false;
    else convert_expr(t, idx.s, NB_I64, n->dtype);
    nb_jit__text_free(&idx);
    break;
  }
  case NB_KN_OP:
    if (!op_expr(g, n)) g->ok = false;
    break;
  case NB_KN_REDUCE: g->ok = false; break;
  }
  nb_jit__printf(t, ";\n");
}

/* ---------------------------------------------------------------- row arrays */

/* A row kernel's loops over R (one per phase, then the stores') each
 * compute the inner values their results need, so a value two loops need
 * (a softmax's exponentials: summed in the second phase, divided in the
 * stores) was computed twice. The first loop that computes such a value
 * keeps it in an array over the row (R floats on the stack, in L1); the
 * later ones read it there. Only at the frontier: what a later loop would
 * compute again and is an operation (a load is read again as it is). */
static uint32_t loop_bit(int loop) { return loop < 32 ? 1u << loop : 0; }

static void mark_loop_cone(const cg *g, int i, int loop, uint32_t *in_loop) {
  const nb_knode *n = &g->k->nodes[i];
  if (!n->inner || g->inv[i] || (in_loop[i] & loop_bit(loop))) return;
  in_loop[i] |= loop_bit(loop);
  for (int j = 0; j < n->nin; j++) mark_loop_cone(g, n->in[j], loop, in_loop);
}

static void mark_frontier(cg *g, int i, int loop, const uint32_t *in_loop, uint8_t *seen, size_t *bytes, size_t max) {
  const nb_knode *n = &g->k->nodes[i];
  if (!n->inner || g->inv[i] || seen[i]) return;
  seen[i] = 1;
  uint32_t earlier = in_loop[i] & (loop_bit(loop) - 1);
  size_t b = (size_t)g->k->dims[g->k->ro] * (!strcmp(nb_kgen__ctype(n->dtype), "double") || !strcmp(nb_kgen__ctype(n->dtype), "int64_t") ? 8 : 4);
  if (earlier && n->kind == NB_KN_OP && (g->row_keep[i] || *bytes + b <= max)) {
    if (!g->row_keep[i]) *bytes += b;
    g->row_keep[i] = __builtin_ctz(earlier);
    return;
  }
  for (int j = 0; j < n->nin; j++) mark_frontier(g, n->in[j], loop, in_loop, seen, bytes, max);
}

/* The roots of loop `loop`: the operands of its phase's reductions, or the inner stores. */
static int loop_roots(const nb_kernel *k, int loop, int *out) {
  int n = 0;
  if (loop <= k->nphases) {
    for (int i = 0; i < k->nnodes; i++)
      if (k->nodes[i].kind == NB_KN_REDUCE && k->nodes[i].phase == loop) out[n++] = k->nodes[i].in[0];
  } else {
    for (int s = 0; s < k->nstores; s++)
      if (k->stores[s].inner) out[n++] = k->stores[s].node;
  }
  return n;
}

void nb_kgen__mark_row_arrays(cg *g, size_t max_bytes) {
  const nb_kernel *k = g->k;
  int nloops = k->nphases + 1;
  int *keep = g->row_keep;
  g->row_keep = NULL;
  if (!keep || k->rr != 1 || k->nphases < 1 || nloops >= 32) return;
  uint32_t *in_loop = calloc((size_t)k->nnodes + 1, sizeof *in_loop);
  uint8_t *seen = calloc((size_t)k->nnodes + 1, 1);
  int *roots = malloc(sizeof(int) * ((size_t)k->nnodes + (size_t)k->nstores + 1));
  bool any = false;
  if (in_loop && seen && roots) {
    memset(keep, 0, sizeof *keep * ((size_t)k->nnodes + 1));
    g->row_keep = keep;
    for (int loop = 1; loop <= nloops; loop++) {
      int n = loop_roots(k, loop, roots);
      for (int r = 0; r < n; r++) mark_loop_cone(g, roots[r], loop, in_loop);
    }
    size_t bytes = 0;
    for (int loop = 2; loop <= nloops; loop++) {
      memset(seen, 0, (size_t)k->nnodes + 1);
      int n = loop_roots(k, loop, roots);
      for (int r = 0; r < n; r++) mark_frontier(g, roots[r], loop, in_loop, seen, &bytes, max_bytes);
    }
    for (int i = 0; i < k->nnodes; i++) any |= keep[i] != 0;
  }
  if (!any) g->row_keep = NULL;
  free(in_loop);
  free(seen);
  free(roots);
}

/* Emits the inner cone of node i (stopping at outer nodes, emitted before;
 * a value an earlier loop kept is read from its row array). */
static void emit_inner(cg *g, int i, int depth) {
  const nb_knode *n = &g->k->nodes[i];
  if (!n->inner || g->emitted[i]) return;
  g->emitted[i] = 1;
  int keep = g->row_keep ? g->row_keep[i] : 0;
  if (keep && keep < g->cur_loop) {
    indent(g, depth);
    nb_jit__printf(g->t, "const %s v%d = row%d[r0];\n", nb_kgen__ctype(n->dtype), i, i);
    return;
  }
  for (int j = 0; j < n->nin; j++) emit_inner(g, n->in[j], depth);
  nb_kgen__emit_node(g, i, depth);
  if (keep && keep == g->cur_loop) {
    indent(g, depth);
    nb_jit__printf(g->t, "row%d[r0] = v%d;\n", i, i);
  }
}

/* Float max/min under a simd reduction track NaNs in a flag, so that the
 * comparison itself is a plain max/min that vectorizes. */
static const nb_reduce_lowering *lowering(const nb_knode *r) { return nb__rules(r->prim)->reduce; }

static bool nan_flag(const cg *g, const nb_knode *r) {
  return g->simd && nb_kgen__is_float(r->dtype) && lowering(r)->extremum;
}

/* Sums and products accumulate wide; extrema in the operand's dtype. */
static const char *acc_type(const nb_knode *r) {
  if (nb_kgen__is_float(r->dtype)) return lowering(r)->extremum ? nb_kgen__ctype(r->dtype) : "double";
  return lowering(r)->extremum ? "int64_t" : "uint64_t";
}

static void acc_init(cg *g, int i, int depth) {
  const nb_knode *r = &g->k->nodes[i];
  indent(g, depth);
  if (g->strip) nb_jit__printf(g->t, "acc%d[j_] = ", i);
  else nb_jit__printf(g->t, "%s acc%d = ", acc_type(r), i);
  nb_jit__printf(g->t, "%s;\n", nb_kgen__is_float(r->dtype) ? lowering(r)->id_f : lowering(r)->id_i);
  if (nan_flag(g, r)) {
    indent(g, depth);
    nb_jit__printf(g->t, "int acc%d_n = 0;\n", i);
  }
}

static void acc_update(cg *g, int i, int depth) {
  const nb_knode *r = &g->k->nodes[i];
  const nb_reduce_lowering *l = lowering(r);
  bool f = nb_kgen__is_float(r->dtype);
  char x[32], a[32];
  ref(g, r->in[0], x, sizeof x);
  snprintf(a, sizeof a, g->strip ? "acc%d[j_]" : "acc%d", i);
  indent(g, depth);
  const char *op = l->op;
  if (!l->extremum)
    nb_jit__printf(g->t, f ? "%s %s= (double)%s;\n" : "%s %s= (uint64_t)(int64_t)%s;\n", a, op, x);
  else if (nan_flag(g, r))
    nb_jit__printf(g->t, "%s = %s %s %s ? %s : %s;\n%*sacc%d_n |= %s != %s;\n", a, x, op, a, x, a, 2 * depth, "", i, x, x);
  else if (f) nb_jit__printf(g->t, "%s = (%s != %s || %s != %s) ? NAN : (%s %s %s ? %s : %s);\n", a, x, x, a, a, x, op, a, x, a);
  else nb_jit__printf(g->t, "%s = (int64_t)%s %s %s ? (int64_t)%s : %s;\n", a, x, op, a, x, a);
}

static void acc_final(cg *g, int i, int depth) {
  const nb_knode *r = &g->k->nodes[i];
  char a[32];
  snprintf(a, sizeof a, g->strip ? "acc%d[j_]" : "acc%d", i);
  if (g->block) { /* every thread's partial, combined (the generator's nbx_bred_<op>_<acc type>) */
    const nb_reduce_lowering *l = lowering(r);
    const char *op = !l->extremum ? (l->op[0] == '*' ? "mul" : "add") : l->op[0] == '>' ? "max" : "min";
    const char *at = acc_type(r), *ty = !strcmp(at, "double") ? "d" : !strcmp(at, "float") ? "f" : !strcmp(at, "int64_t") ? "i" : "u";
    indent(g, depth);
    nb_jit__printf(g->t, "%s = nbx_bred_%s_%s(%s);\n", a, op, ty, a);
  }
  indent(g, depth);
  if (g->strip) nb_jit__printf(g->t, "v%d[j_] = ", i);
  else nb_jit__printf(g->t, "const %s v%d = ", nb_kgen__ctype(r->dtype), i);
  if (nb_kgen__is_float(r->dtype)) {
    round_open(g->t, r->dtype);
    if (nan_flag(g, r)) nb_jit__printf(g->t, r->dtype == NB_F64 ? "acc%d_n ? NAN : %s)" : "acc%d_n ? NAN : (float)%s)", i, a);
    else nb_jit__printf(g->t, r->dtype == NB_F64 ? "%s)" : "(float)%s)", a);
  } else {
    nb_jit__printf(g->t, "(%s)(int64_t)%s", nb_kgen__ctype(r->dtype), a);
  }
  nb_jit__printf(g->t, ";\n");
}

/* COLUMN: a loop over the strip; the last outer variable is defined in it. */
static int open_strip(cg *g, int depth) {
  if (!g->strip) return depth;
  indent(g, depth);
  nb_jit__printf(g->t, "NBX_IVDEP for (int64_t j_ = 0; j_ < w_; j_++) {\n");
  indent(g, depth + 1);
  nb_jit__printf(g->t, "const int64_t i%d = s_ + b_ + j_;\n", g->k->ro - 1);
  return depth + 1;
}

static void close_strip(cg *g, int depth) {
  if (!g->strip) return;
  indent(g, depth - 1);
  nb_jit__printf(g->t, "}\n");
}

/* Opens the loops over the R variables (and the strip inside them);
 * returns the new depth. */
static int open_inner(cg *g, int depth) {
  indent(g, depth);
  nb_jit__printf(g->t, "{\n");
  if (g->block) { /* the R space flattened, strided over the block's threads */
    int64_t n = 1;
    for (int v = 0; v < g->k->rr; v++) n *= g->k->dims[g->k->ro + v];
    indent(g, depth + 1);
    nb_jit__printf(g->t, "for (int64_t f_ = threadIdx.x; f_ < INT64_C(%lld); f_ += blockDim.x) {\n", (long long)n);
    indent(g, depth + 2);
    nb_jit__printf(g->t, "int64_t fq_ = f_;\n");
    for (int v = g->k->rr - 1; v >= 0; v--) {
      indent(g, depth + 2);
      nb_jit__printf(g->t, "const int64_t r%d = fq_ %% INT64_C(%lld);\n", v, (long long)g->k->dims[g->k->ro + v]);
      indent(g, depth + 2);
      nb_jit__printf(g->t, "fq_ /= INT64_C(%lld);\n", (long long)g->k->dims[g->k->ro + v]);
    }
    memset(g->emitted, 0, (size_t)g->k->nnodes + 1);
    return depth + 2;
  }
  for (int v = 0; v < g->k->rr; v++) {
    if (v == g->k->rr - 1 && g->pragma) nb_jit__printf(g->t, "%s\n", g->pragma);
    indent(g, depth + 1 + v);
    nb_jit__printf(g->t, "for (int64_t r%d = 0; r%d < INT64_C(%lld); r%d++) {\n", v, v, (long long)g->k->dims[g->k->ro + v], v);
  }
  memset(g->emitted, 0, (size_t)g->k->nnodes + 1);
  return open_strip(g, depth + 1 + g->k->rr);
}

static void close_inner(cg *g, int depth, int inner_depth) {
  close_strip(g, inner_depth);
  for (int v = g->block ? 1 : g->k->rr; v >= 0; v--) {
    indent(g, depth + v);
    nb_jit__printf(g->t, "}\n");
  }
}

void nb_kgen__emit_store(cg *g, const nb_kstore *s, int depth) {
  nb_dtype d = g->k->nodes[s->node].dtype;
  char v[32];
  ref(g, s->node, v, sizeof v);
  indent(g, depth);
  nb_jit__printf(g->t, "a%d[", s->arg);
  affine(g->t, g->k, &s->map);
  if (d == NB_BF16) nb_jit__printf(g->t, "] = nbx_st_bf16(%s);\n", v);
  else if (d == NB_F16) nb_jit__printf(g->t, "] = nbx_st_f16(%s);\n", v);
  else nb_jit__printf(g->t, "] = %s;\n", v);
}

static bool is_outer_at(const cg *g, int i, int phase) {
  const nb_knode *n = &g->k->nodes[i];
  return !n->inner && n->kind != NB_KN_REDUCE && n->phase == phase && !g->inv[i] && (!g->strip || g->arr[i]);
}

/* COLUMN: the scalar outer values in node i's cone (and i), in the strip's last loop. */
static void emit_outer_cone(cg *g, int i, int depth) {
  const nb_knode *n = &g->k->nodes[i];
  if (!g->strip || g->inv[i] || g->arr[i] || g->emitted[i] || n->inner) return;
  for (int j = 0; j < n->nin; j++) emit_outer_cone(g, n->in[j], depth);
  g->emitted[i] = 1;
  nb_kgen__emit_node(g, i, depth);
}

/* Outer nodes of a phase (in the strip loop under COLUMN). */
static void emit_outer_nodes(cg *g, int phase, int depth) {
  bool any = false;
  for (int i = 0; i < g->k->nnodes; i++) any |= is_outer_at(g, i, phase);
  if (!any) return;
  int d = open_strip(g, depth);
  for (int i = 0; i < g->k->nnodes; i++)
    if (is_outer_at(g, i, phase)) nb_kgen__emit_node(g, i, d);
  close_strip(g, d);
}

static void emit_reduces(cg *g, int phase, int depth, void (*fn)(cg *, int, int)) {
  bool any = false;
  for (int i = 0; i < g->k->nnodes; i++) any |= g->k->nodes[i].kind == NB_KN_REDUCE && g->k->nodes[i].phase == phase;
  if (!any) return;
  int d = open_strip(g, depth);
  for (int i = 0; i < g->k->nnodes; i++)
    if (g->k->nodes[i].kind == NB_KN_REDUCE && g->k->nodes[i].phase == phase) fn(g, i, d);
  close_strip(g, d);
}

/* The reduction clause of phase p's innermost loop (ROW with simd). */
static void simd_clause(cg *g, int p, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "#pragma omp simd");
  for (int i = 0; i < g->k->nnodes && n < cap; i++) {
    const nb_knode *r = &g->k->nodes[i];
    if (r->kind != NB_KN_REDUCE || r->phase != p) continue;
    n += (size_t)snprintf(buf + n, cap - n, " reduction(%s:acc%d)", lowering(r)->omp, i);
    if (nan_flag(g, r) && n < cap) n += (size_t)snprintf(buf + n, cap - n, " reduction(|:acc%d_n)", i);
  }
}

/* The body run once per outer point (ROW) or per strip (COLUMN): phases,
 * then the stores. */
void nb_kgen__emit_body(cg *g, int depth) {
  const nb_kernel *k = g->k;
  if (g->strip) {
    /* strip arrays (invariant values are scalars, emitted before the loops) */
    for (int i = 0; i < k->nnodes; i++) {
      const nb_knode *n = &k->nodes[i];
      if (!in_strip(g, i)) continue;
      indent(g, depth);
      nb_jit__printf(g->t, "%s v%d[W_];\n", nb_kgen__ctype(n->dtype), i);
      if (n->kind == NB_KN_REDUCE) {
        indent(g, depth);
        nb_jit__printf(g->t, "%s acc%d[W_];\n", acc_type(n), i);
      }
    }
  }
  for (int i = 0; g->row_keep && i < k->nnodes; i++)
    if (g->row_keep[i]) {
      indent(g, depth);
      nb_jit__printf(g->t, "%s row%d[%lld];\n", nb_kgen__ctype(k->nodes[i].dtype), i, (long long)k->dims[k->ro]);
    }
  emit_outer_nodes(g, 0, depth);
  for (int p = 1; p <= k->nphases; p++) {
    g->cur_loop = p;
    if (!g->strip)
      for (int i = 0; i < k->nnodes; i++)
        if (k->nodes[i].kind == NB_KN_REDUCE && k->nodes[i].phase == p) acc_init(g, i, depth);
    if (g->strip) emit_reduces(g, p, depth, acc_init);
    char clause[1024];
    if (g->simd) simd_clause(g, p, clause, sizeof clause);
    g->pragma = g->simd ? clause : NULL;
    int d = open_inner(g, depth);
    g->pragma = NULL;
    for (int i = 0; i < k->nnodes; i++)
      if (k->nodes[i].kind == NB_KN_REDUCE && k->nodes[i].phase == p) {
        emit_inner(g, k->nodes[i].in[0], d);
        acc_update(g, i, d);
      }
    close_inner(g, depth, d);
    if (g->strip) emit_reduces(g, p, depth, acc_final);
    else
      for (int i = 0; i < k->nnodes; i++)
        if (k->nodes[i].kind == NB_KN_REDUCE && k->nodes[i].phase == p) acc_final(g, i, depth);
    emit_outer_nodes(g, p, depth);
  }
  bool any_inner = false, any_outer = false;
  for (int s = 0; s < k->nstores; s++) {
    any_inner |= k->stores[s].inner;
    any_outer |= !k->stores[s].inner;
  }
  if (any_inner) {
    /* every value before any store: a store may overwrite a donated input
     * that another store's cone reads at the same element */
    g->cur_loop = k->nphases + 1;
    g->pragma = g->store_pragma;
    int d = open_inner(g, depth);
    g->pragma = NULL;
    for (int s = 0; s < k->nstores; s++)
      if (k->stores[s].inner) emit_inner(g, k->stores[s].node, d);
    for (int s = 0; s < k->nstores; s++)
      if (k->stores[s].inner) nb_kgen__emit_store(g, &k->stores[s], d);
    close_inner(g, depth, d);
  }
  if (any_outer) {
    int d = open_strip(g, depth);
    if (g->strip) { /* every value before any store, as above */
      memset(g->emitted, 0, (size_t)k->nnodes + 1);
      for (int s = 0; s < k->nstores; s++)
        if (!k->stores[s].inner) emit_outer_cone(g, k->stores[s].node, d);
    }
    if (g->block) { /* every thread holds the outer values: one stores them */
      indent(g, d);
      nb_jit__printf(g->t, "if (threadIdx.x == 0) {\n");
    }
    for (int s = 0; s < k->nstores; s++)
      if (!k->stores[s].inner) nb_kgen__emit_store(g, &k->stores[s], d + g->block);
    if (g->block) {
      indent(g, d);
      nb_jit__printf(g->t, "}\n");
    }
    close_strip(g, d);
  }
}

