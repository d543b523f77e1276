/* The IR: graphs of equations over SSA values, and the primitive rules table.
 * Shared by the core, the transformations and the compiler; not public.
 *
 * Invariants (checked by nb_graph_verify):
 *  - g->eqns is in definition order: every operand of eqns[i] is a graph
 *    input or an output of some eqns[j], j < i, of the same graph;
 *  - every value's aval is what its primitive's infer rule says;
 *  - equations are hash-consed: no two pure equations with the same primitive,
 *    operands and params exist in one graph.
 */
#ifndef NABLA_CORE_IR_H
#define NABLA_CORE_IR_H

#include "nabla/core.h"

typedef enum nb_prim {
#define NB_PRIM(name, family) NB_PRIM_##name,
#include "core/prims/prims.def"
#undef NB_PRIM
  NB_PRIM_COUNT
} nb_prim;

typedef struct nb_eqn nb_eqn;

struct nb_val {
  nb_graph *g;
  uint32_t id;         /* index in g->vals */
  int32_t input_index; /* >= 0 for graph inputs */
  nb_aval aval;
  nb_eqn *def;         /* defining equation, NULL for inputs and the poison */
  int out_index;
};

struct nb_eqn {
  nb_prim prim;
  int nin, nout;
  nb_val **in;
  nb_val **out;
  void *params; /* the primitive's typed params struct (arena-owned), or NULL */
  size_t params_size;
  nb_loc loc;
  uint64_t hash;
  uint32_t index; /* position in g->eqns */
  nb_eqn *hnext;  /* hash-cons chain */
};

/* Classes of primitives, for cost estimates (graph.c) and constant folding
 * (simplify.c); what the compiler fuses is `fusion` below. */
typedef enum nb_prim_kind {
  NB_KIND_ELEMENTWISE, /* out[i] = f(in[i]...) over equal shapes */
  NB_KIND_REDUCE,      /* reduction over axes */
  NB_KIND_LAYOUT,      /* reshape, broadcast, transpose, slice, ...: index maps */
  NB_KIND_CONTRACTION, /* dot_general, conv */
  NB_KIND_OTHER,       /* gather, scatter, sort, calls, ... */
  NB_KIND_COUNT
} nb_prim_kind;

/* What the compiler may do with a primitive beyond running its eval rule. */
typedef enum nb_fusion {
  NB_FUSE_NONE,   /* a step of its own (eval, or a backend routine: see gemm) */
  NB_FUSE_EXPR,   /* elementwise, inlined into loop kernels as its `c` templates */
  NB_FUSE_CONVERT,/* elementwise dtype conversion, written by the compiler */
  NB_FUSE_INDEX,  /* an index map or literal the compiler knows: reshape,
                     broadcast_in_dim, transpose, iota, scalar constants */
  NB_FUSE_REDUCE, /* a reduction over axes (nb_reduce_params), by its `reduce` rule */
} nb_fusion;

/* An elementwise primitive's C expression, as templates where $0, $1, $2 are
 * the operands and $T the C type of the result. The template is picked by
 * the first operand's dtype: `f` for floats (`f32` instead, when set, for
 * f32/bf16/f16, which are computed in float), `i` for integers, `b` (when
 * set, else `i`) for bool; NULL: not fused for that dtype (eval runs it). Floating results are
 * rounded to their dtype after the expression, unless `exact` (the result is
 * one of the operands). Use the double libm functions (exp, not expf) for
 * every float dtype, so that results round like the interpreter's. */
typedef struct nb_c_expr {
  const char *f, *f32, *i, *b;
  bool exact;
} nb_c_expr;

static inline const char *nb__c_template(const nb_c_expr *c, nb_dtype operand) {
  if (nb_dtype_is_float(operand)) return operand != NB_F64 && c->f32 ? c->f32 : c->f;
  return operand == NB_BOOL && c->b ? c->b : c->i;
}

/* A fusable reduction: an accumulator starting at the identity (`id_f` for
 * floats, `id_i` for integers). Sums and products (`extremum` false)
 * accumulate `acc op= x` in double / uint64_t; extrema keep x when
 * `x op acc` ("<" or ">"), propagating NaN, in the operand's dtype. `omp` is
 * the OpenMP reduction identifier of the combiner. */
typedef struct nb_reduce_lowering {
  bool extremum;
  const char *op, *omp, *id_f, *id_i;
} nb_reduce_lowering;

/* The rules of one primitive. Only name, kind, infer and eval are required.
 * Rules that emit ops emit them into `g` (the graph being built); vals passed
 * in belong to g; `e` is the source equation (for params and avals).
 * A NULL tangent / cotangent is a symbolic zero. */
/* Asynchronous evaluation (the collectives): what `eval` does, started by
 * one step of a compiled executable and finished by a later one, so that
 * other steps run in between. Between the two, the operands must stay
 * unchanged and the results are neither read nor written by anyone else
 * (the buffer planner keeps both alive). */
typedef struct nb_async_rules {
  /* At compile time: would start run asynchronously on ctx (the
   * communicator bound there offers it)? false: the equation stays one
   * synchronous step. */
  bool (*available)(nb_ctx *ctx, const nb_eqn *e);
  /* Begins e on in/out (arrays over the buffers; they may be released once
   * it returns: *pending keeps the data pointers it needs). *pending NULL:
   * it finished already. */
  nb_status (*start)(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out, void **pending);
  /* Moves it on without blocking; *done when only finish's work is left. */
  nb_status (*test)(nb_ctx *ctx, void *pending, bool *done);
  /* Completes it (results written) and frees pending, also on error. */
  nb_status (*finish)(nb_ctx *ctx, void *pending);
} nb_async_rules;

typedef struct nb_prim_rules {
  const char *name;
  nb_prim_kind kind;
  size_t params_size;
  /* Shape/dtype rule: fills *nout and out avals; on error writes the reason
   * into why (the caller adds primitive, shapes and location). */
  nb_status (*infer)(const void *params, int nin, const nb_aval *in, int *nout, nb_aval *out, char *why,
                     size_t whycap);
  /* Reference implementation: out arrays are allocated (writable) with the
   * inferred avals. */
  nb_status (*eval)(nb_ctx *ctx, const nb_eqn *e, nb_array *const *in, nb_array **out);
  nb_status (*jvp)(nb_graph *g, const nb_eqn *e, nb_val *const *primals, nb_val *const *tangents,
                   nb_val *const *outs, nb_val **out_tangents);
  /* Optional, used instead of jvp when some tangent is non-zero: emits the
   * primal outputs too (into outs), for primitives whose linearization
   * computes them anyway (scan and cond: a primal part that also returns the
   * residuals, and a linear part over them), so that the primal equation is
   * not emitted a second time. The primal outputs must not depend on the
   * tangents (reverse mode splits the two parts). */
  nb_status (*linearize)(nb_graph *g, const nb_eqn *e, nb_val *const *primals, nb_val *const *tangents, nb_val **outs,
                         nb_val **out_tangents);
  /* For primitives linear in some operands: linear[i] marks them (their
   * entries in `in` are NULL); writes ct_in[i] for the linear ones. */
  nb_status (*transpose)(nb_graph *g, const nb_eqn *e, nb_val *const *in, const bool *linear,
                         nb_val *const *ct_out, nb_val **ct_in);
  /* vmap: bdims[i] is the batch axis of in[i] or -1; writes out and their
   * batch axes. At least one input is batched. */
  nb_status (*batch)(nb_graph *g, const nb_eqn *e, nb_val *const *in, const int *bdims, int64_t axis_size,
                     nb_val **out, int *out_bdims);
  void (*cost)(const nb_eqn *e, double *flops, double *bytes);
  /* Appends the params as text ("axes=(0,1)"); default: none. */
  void (*print_params)(const nb_eqn *e, char *buf, size_t cap);
  uint64_t (*hash_params)(const void *params, size_t size);        /* default: bytes */
  bool (*params_equal)(const void *a, const void *b, size_t size);   /* default: memcmp */
  /* Keeps what params point to (arrays, graphs) alive as long as g. */
  nb_status (*hold_params)(nb_graph *g, const void *params);
  bool impure;   /* never hash-consed or removed (custom calls with effects, barriers) */
  /* out[0] has in[0]'s aval and may be given in[0]'s memory by a compiler
   * (an update of a dead or donated operand): eval must then find their data
   * pointers equal and write only what changes, instead of copying in[0]. */
  bool in_place;
  /* The same contract per output, for primitives with several outputs or
   * operands updated (custom calls that declare it): the operand that output
   * `out` updates in place, or -1. NULL: in_place's out[0] <- in[0] only. */
  int (*in_place_operand)(const nb_eqn *e, int out);
  /* Lowering, read by the compiler (default: NB_FUSE_NONE, not a gemm). */
  nb_fusion fusion;
  const nb_c_expr *c;                /* NB_FUSE_EXPR */
  const nb_reduce_lowering *reduce;  /* NB_FUSE_REDUCE */
  /* A contraction with nb_dot_params that a backend may run as matrix
   * products (BLAS). */
  bool gemm;
  const nb_async_rules *async; /* optional: a compiled step may start and finish it apart */
} nb_prim_rules;

extern const nb_prim_rules *const nb__prim_table[NB_PRIM_COUNT];
static inline const nb_prim_rules *nb__rules(nb_prim p) { return nb__prim_table[p]; }
/* The family a primitive is declared in (its file in core/prims/: "binary",
 * "dot", "reduce", ...), for the profiler's time per family. */
const char *nb__prim_family(nb_prim p);

#define NB_PRIM(name, family) extern const nb_prim_rules nb__prim_##name;
#include "core/prims/prims.def"
#undef NB_PRIM

/* Element access by dtype (rules' eval, constant folding, BLAS glue). */
double nb__load_f64(nb_dtype t, const void *base, int64_t i);
void nb__store_f64(nb_dtype t, void *base, int64_t i, double v);
int64_t nb__load_i64(nb_dtype t, const void *base, int64_t i);
void nb__store_i64(nb_dtype t, void *base, int64_t i, int64_t v);

/* gather and scatter_add as one flat walk (core/prims/gather.c), the form
 * their reference rules run and a backend may run on a device. Batch
 * position b in [0, nbatch) (row-major over bext) and window position v in
 * [0, nwin) (row-major over wext) pair window-array element
 *   sum_j bc_j bw[j] + sum_k c_k ww[k]
 * with operand element
 *   sum_k start_k mo[k] + sum_i bc_{batj[i]} bato[i] + sum_k c_k wo[k],
 * where start_k = indices[sum_j bc_j bi[j] + k iv] clamped to [0, mhi[k]]
 * (gather) or, out of it, the whole window skipped (scatter_add). */
typedef struct nb_walk {
  int nbd, nm, nbat, nwd;
  /* every operand dim an index starts has a window of 1: two window
   * positions never reach one operand element (a scatter over the window
   * positions in parallel, each walking the batch in order, does not race) */
  bool disjoint;
  int64_t nbatch, nwin;
  int64_t bext[NB_MAX_RANK], bw[NB_MAX_RANK], bi[NB_MAX_RANK]; /* batch dims */
  int64_t mo[NB_MAX_RANK], mhi[NB_MAX_RANK], iv;              /* index vector entries */
  int batj[NB_MAX_RANK];                                      /* batching dims */
  int64_t bato[NB_MAX_RANK];
  int64_t wext[NB_MAX_RANK], ww[NB_MAX_RANK], wo[NB_MAX_RANK]; /* window dims */
} nb_walk;
/* The walk of e, a gather or a scatter_add equation. */
void nb__walk_of(const nb_eqn *e, nb_walk *w);

/* Row-major strides in elements for shape s. */
void nb__strides(const nb_shape *s, int64_t *strides);
uint64_t nb__hash_bytes(const void *p, size_t n, uint64_t seed);
uint64_t nb__hash_combine(uint64_t h, uint64_t v);

/* True when a is the only reference to host memory its context allocated
 * (not wrapped memory): a compiled step may then write an output into it. */
bool nb__array_is_sole_owner(const nb_array *a);

/* Emits an equation into g: checks operands (same graph, not poisoned), runs
 * the infer rule (reporting primitive, avals and loc on error), hash-conses,
 * and writes the outputs to outs[*nout] (outs may be NULL when only the first
 * is wanted). Params are copied into the graph's arena. Returns the first
 * output, or the poison value. */
nb_val *nb__emit(nb_graph *g, nb_loc loc, nb_prim p, int nin, nb_val *const *in, const void *params,
                 size_t params_size, int *nout, nb_val **outs);
nb_val *nb__emit1(nb_graph *g, nb_loc loc, nb_prim p, int nin, nb_val *const *in, const void *params,
                  size_t params_size);

/* Graph errors: records the first error in g (and its context) and returns the
 * poison value. */
nb_val *nb__fail(nb_graph *g, nb_loc loc, nb_status s, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
nb_val *nb__poison(nb_graph *g);
bool nb__is_poison(const nb_val *v);
/* The graph of the first non-NULL operand; reports mixing of graphs. NULL
 * when every operand is NULL (nothing to record the error in). */
nb_graph *nb__graph_of(nb_loc loc, int n, nb_val *const *vals);

/* Arena allocation owned by g (freed with it). */
void *nb__arena_alloc(nb_graph *g, size_t bytes);
/* Keeps a reference to an array / a graph alive as long as g. */
nb_status nb__graph_hold_array(nb_graph *g, nb_array *a);
nb_status nb__graph_hold_graph(nb_graph *g, const nb_graph *sub);
void nb__graph_retain(const nb_graph *g);

/* Read-only iteration for passes and transformations. */
size_t nb__graph_neqns(const nb_graph *g);
nb_eqn *nb__graph_eqn(const nb_graph *g, size_t i);
nb_val *nb__graph_input(const nb_graph *g, size_t i);
nb_val *nb__graph_output(const nb_graph *g, size_t i);
size_t nb__graph_nvals(const nb_graph *g);
/* Adds an input / output with the given path (copied). */
nb_val *nb__graph_add_input(nb_graph *g, const char *path, nb_aval aval);
nb_status nb__graph_add_output(nb_graph *g, const char *path, nb_val *v);

/* Re-emits src's equations into dst with src's inputs mapped to map_in[i]
 * (vals of dst); writes src's outputs, as vals of dst, to map_out. */
nb_status nb__graph_inline(nb_graph *dst, const nb_graph *src, nb_val *const *map_in, nb_val **map_out);

/* Debug builds (no NDEBUG): verifies g after a transformation and, when it
 * fails, destroys g and returns NULL with the error. Release builds: g. */
nb_graph *nb__checked(nb_graph *g);

/* A copy of g without the equations no output depends on (new graph, or NULL
 * with the error on g's context). */
nb_graph *nb__graph_dce(const nb_graph *g);

/* print_params of a carried graph: "name=#<structural hash>", so that graphs
 * calling different graphs print, hash and compare differently. Returns the
 * snprintf count. */
int nb__print_graph_param(char *buf, size_t cap, const char *name, const nb_graph *callee);

/* Shape helpers for rules. */
int nb__norm_axis(int axis, int rank); /* -1 when out of range */
char *nb__avals_str(int n, const nb_aval *a, char *buf, size_t cap);

/* Convenience builders used by rules: zeros/ones like an aval; summing a
 * value down to a shape it was broadcast from (NumPy rules). */
nb_val *nb__zeros(nb_graph *g, nb_aval a);
/* The JVP rule of any primitive bilinear in its two operands (dot_general,
 * conv): d f(x, y) = f(dx, y) + f(x, dy), same params. */
nb_status nb__bilinear_jvp(nb_graph *g, const nb_eqn *e, nb_val *const *primals, nb_val *const *tangents,
                           nb_val *const *outs, nb_val **out_tangents);
/* Sum of two possibly-zero (NULL) tangents or cotangents. */
nb_val *nb__add_tangents(nb_loc loc, nb_val *a, nb_val *b);
nb_val *nb__sum_to_shape(nb_loc loc, nb_val *x, const nb_shape *shape);
/* Moves batch dim `from` of x to axis `to` (a transpose; no-op when equal). */
nb_val *nb__move_axis(nb_loc loc, nb_val *x, int from, int to);
/* x with a new batch axis 0 of size n (broadcast), for unbatched operands. */
nb_val *nb__bcast_batch(nb_loc loc, nb_val *x, int64_t n);
/* x with its batch axis at `bdim` (or -1) moved/broadcast to axis 0. */
nb_val *nb__batch_to_front(nb_loc loc, nb_val *x, int bdim, int64_t n);

/* Transformations used by the higher-order primitives (remat, custom_vjp,
 * custom calls). They are the core library's too, in src/transform/; the
 * primitives reach them through these declarations only. */
nb_graph *nb__vjp_graph(nb_ctx *ctx, const nb_graph *g);
nb_graph *nb__jvp_graph(nb_ctx *ctx, const nb_graph *g);
nb_graph *nb__vmap_graph(nb_ctx *ctx, const nb_graph *g, const int *in_bdims, int64_t axis_size, int out_axis);
nb_graph *nb__vmap_graph_axes(nb_ctx *ctx, const nb_graph *g, const int *in_bdims, int64_t axis_size, const int *out_axes);

/* Emits src into dst with forward-mode tangents: primal_in[i] / tangent_in[i]
 * (NULL tangent: zero; tangent_in NULL: all zero) for src's inputs; writes
 * src's outputs and their tangents (NULL: zero). */
nb_status nb__jvp_into(nb_graph *dst, const nb_graph *src, nb_val *const *primal_in, nb_val *const *tangent_in,
                       nb_val **primal_out, nb_val **tangent_out);

/* Reverse mode into dst: emits src's primal computation on primal_in, writes
 * its outputs to primal_out, then back-propagates the output cotangents
 * ct_out[i] (NULL: zero) and writes input cotangents to ct_in[i] for the
 * inputs with wrt[i] (others NULL). ct_out may be NULL: all zero but for
 * seed_first, a cotangent of one for output 0. */
nb_status nb__vjp_into(nb_graph *dst, const nb_graph *src, const bool *wrt, nb_val *const *primal_in,
                       nb_val *const *ct_out, bool seed_first, nb_val **primal_out, nb_val **ct_in);

/* Partial evaluation of src's linearization (JAX's partial_eval of a jvp),
 * with tangents for the inputs where tan_in[i] (float inputs only):
 *   known:   src's inputs -> (src's outputs as primal/<i>, then the computed
 *            residuals as residual/<r>)
 *   lin:     (the nres residuals, then the tangents in input order) -> the
 *            tangents of the outputs where want_out[i] (zeros where none)
 *   hoisted: (the inputs where inv_in[i]) -> the loop-invariant residuals;
 *            NULL when inv_in is NULL
 * Residuals are the primal values that lin reads; res_input[r] says where
 * residual r comes from: src's input i >= 0 when fwd_in[i] (passed as it
 * is), NB__RES_HOISTED when it depends on inv_in inputs only (a scan's
 * consts: computed once, before the loop), else NB__RES_COMPUTED (an output
 * of known after src's, in order). Values with no operands (constants) are
 * recomputed in lin rather than passed, and so are (from their operands)
 * values of elementwise and index-map primitives (transcendentals excepted) that are not
 * invariant or are computed from constants alone. tout_nonzero (may be NULL) receives
 * which outputs have a non-zero tangent. On error, the context holds it and
 * *out is empty. */
enum { NB__RES_COMPUTED = -1, NB__RES_HOISTED = -2 };
typedef struct nb__partial {
  nb_graph *known, *lin, *hoisted;
  int nres;
  int *res_input; /* [nres] */
} nb__partial;
nb_status nb__partial_eval(nb_ctx *ctx, const nb_graph *src, const bool *tan_in, const bool *fwd_in, const bool *inv_in,
                           const bool *want_out, bool *tout_nonzero, nb__partial *out);
void nb__partial_free(nb_ctx *ctx, nb__partial *p);

#endif
