/* nabla core: contexts, dtypes, arrays, trees, traced graphs, primitives,
 * control flow (cond, switch, while_loop, scan, fori_loop) and the
 * transformations over graphs (grad, jvp, vjp, vmap, remat, custom_vjp).
 *
 * A program is an ordinary C function over symbolic values (nb_val). Tracing
 * it records a typed SSA graph; transformations map graphs to graphs, so they
 * compose in any order; the reference interpreter runs any graph on the host.
 *
 * Example: the gradient of sum(tanh(x * w)) with respect to w.
 *
 *   static nb_status f(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
 *     nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
 *     nb_val *y = nb_reduce_sum(nb_tanh(nb_mul(x, w)), 0, NULL);
 *     return nb_tree_set_val(out, "loss", y);
 *   }
 *   ...
 *   nb_graph *g = nb_trace(ctx, f, NULL, example_inputs);    // tree of arrays
 *   nb_grad_opts o = {.wrt = "w"};
 *   nb_graph *dg = nb_grad(ctx, g, &o);                   // outputs loss, grad/w
 *   nb_tree *res = nb_tree_create(ctx);
 *   nb_graph_run(ctx, dg, example_inputs, res);
 *
 * Ownership vocabulary used in every contract comment: *borrows* (the callee
 * keeps no reference), *takes* (the callee owns it from now on), *returns a new
 * reference* (the caller must release it), *returns a pointer valid until X*.
 *
 * Errors: fallible calls return nb_status (or NULL) and leave a message in the
 * context (nb_ctx_error). The library never exits or aborts on bad input.
 * Traced ops never return NULL: after an error, a graph is "poisoned" and every
 * later op on it returns the poison value; the error is reported once, by
 * nb_trace / nb_graph_check.
 */
#ifndef NABLA_CORE_H
#define NABLA_CORE_H

#include "nabla/export.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

NB_BEGIN_DECLS

#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0
#define NB_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------ */
/* Status, context, allocation, logging                                     */
/* ------------------------------------------------------------------------ */

typedef enum nb_status {
  NB_OK = 0,
  NB_ERR_INVALID_ARG,   /* caller misuse: NULL, out-of-range axis, bad option */
  NB_ERR_SHAPE,         /* shapes do not agree */
  NB_ERR_DTYPE,         /* dtypes do not agree or are not allowed */
  NB_ERR_NOMEM,         /* an allocation failed */
  NB_ERR_IO,            /* a file or socket operation failed */
  NB_ERR_FORMAT,        /* malformed input file or text */
  NB_ERR_UNIMPLEMENTED, /* a rule or feature is missing (named in the message) */
  NB_ERR_NUMERIC,       /* NaN/Inf found in debug-nans mode */
  NB_ERR_NOT_FOUND,     /* a path, key, step or file does not exist */
  NB_ERR_INTERNAL,      /* an invariant of nabla itself failed: a bug */
  NB_STATUS_COUNT
} nb_status;

const char *nb_status_name(nb_status s);

typedef struct nb_ctx nb_ctx;

/* Allocator hook, shaped like Lua's: new_size == 0 frees, ptr == NULL
 * allocates. Must return memory aligned to at least 64 bytes, or NULL. */
typedef void *(*nb_alloc_fn)(void *ud, void *ptr, size_t old_size, size_t new_size);

typedef enum nb_log_level { NB_LOG_DEBUG, NB_LOG_INFO, NB_LOG_WARN, NB_LOG_ERROR, NB_LOG_LEVEL_COUNT } nb_log_level;
typedef void (*nb_log_fn)(void *ud, nb_log_level level, const char *msg);

/* Returns a new context, or NULL when memory is exhausted. The default log
 * callback writes warnings and errors to stderr (and info/debug messages when
 * the debug level is above 0); the default allocator is
 * aligned malloc. NABLA_DEBUG=<level> in the environment sets the debug level
 * (0 off, 1 ops, 2 timings, 3 generated code, 4 IR after each pass). */
nb_ctx *nb_ctx_create(void);
nb_ctx *nb_ctx_create_with_allocator(nb_alloc_fn fn, void *ud);
void nb_ctx_destroy(nb_ctx *ctx);

/* The last error's message; returns a pointer valid until the next error on
 * ctx or nb_ctx_clear_error. "" when there is none. */
const char *nb_ctx_error(const nb_ctx *ctx);
nb_status nb_ctx_status(const nb_ctx *ctx);
void nb_ctx_clear_error(nb_ctx *ctx);
/* Records an error (printf-style message) and returns `status`. The
 * arguments may include nb_ctx_error(ctx): that wraps the current message
 * ("loading x: <cause>"), the way to add context to an error. */
nb_status nb_errorf(nb_ctx *ctx, nb_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void nb_ctx_set_log(nb_ctx *ctx, nb_log_fn fn, void *ud);
void nb_logf(nb_ctx *ctx, nb_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void nb_ctx_set_debug_level(nb_ctx *ctx, int level);
int nb_ctx_debug_level(const nb_ctx *ctx);
/* Debug-nans mode: the interpreter checks every primitive's floating outputs
 * for NaN/Inf and fails with NB_ERR_NUMERIC naming the first one. */
void nb_ctx_set_debug_nans(nb_ctx *ctx, bool on);
/* How the random ops (nb_random_*, nb_key_*) turn a key into streams, read
 * when an op is traced. Both are JAX's threefry2x32 streams bit for bit:
 *  - NB_PRNG_THREEFRY (the default): jax_threefry_partitionable=False, JAX's
 *    default before 0.5 (counters 0..n-1 split in two halves);
 *  - NB_PRNG_THREEFRY_PARTITIONABLE: jax_threefry_partitionable=True, JAX's
 *    default since 0.5 (element i from the counter pair (0, i); 32-bit
 *    values are the two output words xor-ed; split and random bits no
 *    longer share a layout).
 * keys and fold_in are the same in both. The environment variable
 * NABLA_PRNG=threefry|threefry_partitionable sets a new context's choice. */
typedef enum nb_prng_impl { NB_PRNG_THREEFRY, NB_PRNG_THREEFRY_PARTITIONABLE } nb_prng_impl;
void nb_ctx_set_prng_impl(nb_ctx *ctx, nb_prng_impl impl);
nb_prng_impl nb_ctx_prng_impl(const nb_ctx *ctx);

/* Host allocations, through the context's hook, with exact byte counts. */
void *nb_alloc(nb_ctx *ctx, size_t bytes);  /* 64-byte aligned; NULL (+ error) on failure */
void *nb_calloc(nb_ctx *ctx, size_t bytes); /* zeroed */
void nb_dealloc(nb_ctx *ctx, void *ptr, size_t bytes);
/* An owned copy of s in the context's memory (free with nb_strfree), or NULL
 * (+ error) on failure. nb_strfree(ctx, NULL) does nothing. */
char *nb_strdup(nb_ctx *ctx, const char *s);
void nb_strfree(nb_ctx *ctx, char *s);
size_t nb_ctx_bytes_in_use(const nb_ctx *ctx);
size_t nb_ctx_peak_bytes(const nb_ctx *ctx);
/* Fault injection for tests: the n-th allocation from now fails (n >= 1);
 * n = 0 turns it off. */
void nb_ctx_fail_alloc_after(nb_ctx *ctx, int64_t n);

/* Strict numbers from text (command-line flags, config values, environment
 * variables): the whole string must be one base-10 integer (nb_parse_int) or
 * one finite number (nb_parse_float), with no space, no trailing text and
 * no overflow, inside [lo, hi]. On failure *out is untouched and why[cap]
 * says what was wrong ("'2.5' is not an integer", "5000 is out of range
 * [1, 4096]"); the caller adds which flag or key it was. */
bool nb_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, char *why, size_t cap);
bool nb_parse_float(const char *s, double lo, double hi, double *out, char *why, size_t cap);

/* ------------------------------------------------------------------------ */
/* Dtypes, shapes, devices                                                   */
/* ------------------------------------------------------------------------ */

typedef enum nb_dtype {
  NB_F32, NB_F64, NB_BF16, NB_F16, NB_I8, NB_U8, NB_I32, NB_I64, NB_U32, NB_BOOL,
  NB_DTYPE_COUNT
} nb_dtype;

const char *nb_dtype_name(nb_dtype t);             /* "f32", "bf16", ... */
bool nb_dtype_from_name(const char *name, nb_dtype *out);
size_t nb_dtype_size(nb_dtype t);
bool nb_dtype_is_float(nb_dtype t);
bool nb_dtype_is_int(nb_dtype t);                  /* signed or unsigned, not bool */
bool nb_dtype_is_unsigned(nb_dtype t);

/* Round-to-nearest-even conversions, NaN preserved (as ml_dtypes). */
uint16_t nb_f32_to_bf16(float x);
float nb_bf16_to_f32(uint16_t x);
uint16_t nb_f32_to_f16(float x);
float nb_f16_to_f32(uint16_t x);
/* Converts n elements between any two dtypes (float->int truncates toward
 * zero and saturates; NaN -> 0; ->bool is x != 0). */
void nb_convert_elements(nb_dtype to, void *dst, nb_dtype from, const void *src, int64_t n);

#define NB_MAX_RANK 8

typedef struct nb_shape {
  int rank;
  int64_t dims[NB_MAX_RANK];
} nb_shape;

typedef struct nb_aval {
  nb_dtype dtype;
  nb_shape shape;
} nb_aval;

nb_shape nb_shape_make(int rank, const int64_t *dims);
int64_t nb_shape_size(const nb_shape *s);          /* product of dims; 1 for rank 0 */
bool nb_shape_equal(const nb_shape *a, const nb_shape *b);
nb_aval nb_aval_make(nb_dtype t, int rank, const int64_t *dims);
bool nb_aval_equal(const nb_aval *a, const nb_aval *b);
/* Writes "f32[2,3]" into buf (always NUL-terminated); returns buf. */
char *nb_aval_str(const nb_aval *a, char *buf, size_t cap);

typedef enum nb_device_kind { NB_DEVICE_CPU, NB_DEVICE_CUDA, NB_DEVICE_KIND_COUNT } nb_device_kind;
typedef struct nb_device {
  nb_device_kind kind;
  int index;
} nb_device;
#define NB_CPU ((nb_device){NB_DEVICE_CPU, 0})

/* ------------------------------------------------------------------------ */
/* Arrays: immutable, reference counted                                      */
/* ------------------------------------------------------------------------ */

typedef struct nb_array nb_array;

/* All creators return a new reference (refcount 1), or NULL with an error on
 * ctx. `data` is borrowed and copied; it holds nb_shape_size elements of
 * dtype in row-major order. */
nb_array *nb_array_create(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const void *data);
nb_array *nb_array_zeros(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims);
nb_array *nb_array_ones(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims);
nb_array *nb_array_full(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, double value);
nb_array *nb_array_scalar(nb_ctx *ctx, nb_dtype t, double value);
/* 1-D [start, start+step, ...) below stop (above, for negative step). */
nb_array *nb_array_arange(nb_ctx *ctx, nb_dtype t, double start, double stop, double step);
/* Values are the index along `axis`. */
nb_array *nb_array_iota(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, int axis);
/* Converts f64 values to dtype t. */
nb_array *nb_array_from_f64(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const double *values);
/* Uninitialized array whose data may be written through nb_array_data_mut
 * until it is shared (passed to any other nabla call). */
nb_array *nb_array_empty(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims);
/* Wraps memory owned elsewhere (an mmap'ed checkpoint, say): `release(ud)` is
 * called when the last reference goes. data must stay valid and unchanged
 * until then, and be aligned to the dtype's size. */
nb_array *nb_array_wrap(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const void *data,
                        void (*release)(void *ud), void *ud);
/* A host copy converted to dtype t (returns a new reference even if t is the
 * same dtype, unless it can share: then it retains a). */
nb_array *nb_array_astype(nb_ctx *ctx, nb_array *a, nb_dtype t);
/* A new host array [c, r] holding the rank-2 host array x [r, c] transposed
 * (any dtype): weight layouts between formats ([in, out] kernels against
 * [out, in] rows). */
nb_array *nb_array_transpose2d(nb_ctx *ctx, const nb_array *x);

void nb_array_retain(nb_array *a);
void nb_array_release(nb_array *a);                 /* NULL is allowed */

nb_dtype nb_array_dtype(const nb_array *a);
int nb_array_rank(const nb_array *a);
const int64_t *nb_array_dims(const nb_array *a);    /* valid while a is alive */
int64_t nb_array_size(const nb_array *a);           /* number of elements */
size_t nb_array_nbytes(const nb_array *a);
nb_aval nb_array_aval(const nb_array *a);
nb_device nb_array_device(const nb_array *a);
nb_ctx *nb_array_ctx(const nb_array *a);
/* Host data pointer valid while a is alive; NULL for device arrays. */
const void *nb_array_data(const nb_array *a);
void *nb_array_data_mut(nb_array *a);               /* only for nb_array_empty's result */
/* Copies the array's bytes to host memory dst (nbytes must equal
 * nb_array_nbytes). */
nb_status nb_array_copy_out(nb_ctx *ctx, const nb_array *a, void *dst, size_t nbytes);
/* Element i (row-major) converted to double. */
double nb_array_get(const nb_array *a, int64_t i);
/* True when dtype, shape and bytes are equal. */
bool nb_array_equal(const nb_array *a, const nb_array *b);
/* Prints "f32[2,3] [[1, 2, 3], [4, 5, 6]]" (large arrays elided). */
void nb_array_print(const nb_array *a, FILE *f);

/* ------------------------------------------------------------------------ */
/* Trees: ordered maps from path strings to leaves                           */
/* ------------------------------------------------------------------------ */

typedef struct nb_val nb_val;
typedef struct nb_graph nb_graph;
typedef struct nb_tree nb_tree;

typedef enum nb_leaf_kind { NB_LEAF_NONE, NB_LEAF_ARRAY, NB_LEAF_VAL, NB_LEAF_AVAL, NB_LEAF_KIND_COUNT } nb_leaf_kind;

/* A leaf: an array (the tree holds a reference), a traced value (owned by its
 * graph) or an abstract value (dtype and shape only, for tracing specs). */
typedef struct nb_leaf {
  nb_leaf_kind kind;
  nb_array *array;
  nb_val *val;
  nb_aval aval;
} nb_leaf;

nb_leaf nb_leaf_array(nb_array *a);
nb_leaf nb_leaf_val(nb_val *v);
nb_leaf nb_leaf_aval(nb_aval a);
/* The leaf's abstract value whatever its kind. */
nb_aval nb_leaf_get_aval(const nb_leaf *l);

/* Paths are '/'-separated, non-empty, with no empty component. */
nb_tree *nb_tree_create(nb_ctx *ctx);
void nb_tree_destroy(nb_tree *t);                   /* releases array leaves; NULL ok */
nb_ctx *nb_tree_ctx(const nb_tree *t);
size_t nb_tree_size(const nb_tree *t);
/* Inserts, or replaces in place (keeping the position) when path exists.
 * Array leaves are retained (the caller keeps its own reference). */
nb_status nb_tree_set(nb_tree *t, const char *path, nb_leaf leaf);
nb_status nb_tree_set_array(nb_tree *t, const char *path, nb_array *a);
nb_status nb_tree_set_val(nb_tree *t, const char *path, nb_val *v);
nb_status nb_tree_remove(nb_tree *t, const char *path);
/* Index of path in iteration order, or -1. */
int64_t nb_tree_find(const nb_tree *t, const char *path);
/* Borrowed leaves; NULL when the path is missing or holds another kind. */
nb_array *nb_tree_get_array(const nb_tree *t, const char *path);
nb_val *nb_tree_get_val(const nb_tree *t, const char *path);
const nb_leaf *nb_tree_get(const nb_tree *t, const char *path);
/* Iteration in insertion order: i in [0, nb_tree_size). Pointers valid until
 * the tree is next modified. */
const char *nb_tree_path(const nb_tree *t, size_t i);
const nb_leaf *nb_tree_leaf(const nb_tree *t, size_t i);

/* New trees (the caller destroys them), leaves shared (arrays retained). */
nb_tree *nb_tree_copy(const nb_tree *t);
/* Leaves whose path equals `prefix` or starts with "prefix/"; with strip, the
 * prefix and its '/' are removed from the paths. */
nb_tree *nb_tree_select_prefix(const nb_tree *t, const char *prefix, bool strip);
/* Leaves whose path matches the POSIX extended regex anywhere (anchor with
 * ^...$ for a full match). NULL with an error for a bad regex. */
nb_tree *nb_tree_select_regex(const nb_tree *t, const char *regex);
/* Inserts all of src into dst, with paths "prefix/<path>" (prefix may be
 * NULL or "" for none). */
nb_status nb_tree_merge(nb_tree *dst, const char *prefix, const nb_tree *src);
/* Error (NB_ERR_INVALID_ARG naming the first differing path) unless a and b
 * have the same paths in the same order and, with check_avals, leaves of the
 * same dtype and shape. `what` names the trees in the message. */
nb_status nb_tree_check_same(nb_ctx *ctx, const nb_tree *a, const nb_tree *b, bool check_avals, const char *what);

typedef nb_status (*nb_tree_map_fn)(void *ud, const char *path, const nb_leaf *in, nb_leaf *out);
typedef nb_status (*nb_tree_zip_fn)(void *ud, const char *path, const nb_leaf *a, const nb_leaf *b, nb_leaf *out);
/* Applies fn to every leaf. An array placed in *out by fn is a reference the
 * new tree takes over. Returns NULL with the error of the first failure. */
nb_tree *nb_tree_map(const nb_tree *t, nb_tree_map_fn fn, void *ud);
nb_tree *nb_tree_zip(const nb_tree *a, const nb_tree *b, nb_tree_zip_fn fn, void *ud);
/* Flatten: leaves in order into out[nb_tree_size] (borrowed). Unflatten: a
 * new tree with structure's paths and the given leaves. */
void nb_tree_flatten(const nb_tree *t, nb_leaf *out);
nb_tree *nb_tree_unflatten(const nb_tree *structure, const nb_leaf *leaves);
void nb_tree_print(const nb_tree *t, FILE *f);

/* ------------------------------------------------------------------------ */
/* Graphs and tracing                                                        */
/* ------------------------------------------------------------------------ */

/* Source location recorded with every traced op, for error messages. */
typedef struct nb_loc {
  const char *file;
  int line;
} nb_loc;
#define NB_HERE ((nb_loc){__FILE__, __LINE__})

/* Builds a graph by hand; nb_trace below is the usual way. */
nb_graph *nb_graph_create(nb_ctx *ctx);
void nb_graph_destroy(nb_graph *g);
nb_ctx *nb_graph_ctx(const nb_graph *g);
nb_val *nb_graph_input(nb_graph *g, const char *path, nb_aval aval);
nb_status nb_graph_output(nb_graph *g, const char *path, nb_val *v);
/* NB_OK, or the first error recorded while building g. */
nb_status nb_graph_status(const nb_graph *g);
const char *nb_graph_error(const nb_graph *g);
/* Records an error in g (the first one is kept, and reported through the
 * context) and returns the poison value: for code above the core that checks
 * its own arguments while tracing. */
nb_val *nb_graph_fail_at(nb_loc loc, nb_graph *g, nb_status s, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Checks the graph's invariants (SSA order, avals against shape rules). */
nb_status nb_graph_verify(const nb_graph *g);

/* The input and output signatures, as trees of abstract values (new trees). */
nb_tree *nb_graph_input_spec(const nb_graph *g);
nb_tree *nb_graph_output_spec(const nb_graph *g);
size_t nb_graph_num_inputs(const nb_graph *g);
size_t nb_graph_num_outputs(const nb_graph *g);
size_t nb_graph_num_eqns(const nb_graph *g);
const char *nb_graph_input_path(const nb_graph *g, size_t i);
const char *nb_graph_output_path(const nb_graph *g, size_t i);

typedef nb_status (*nb_trace_fn)(nb_graph *g, const nb_tree *in, nb_tree *out, void *user);
/* Traces fn: its inputs are values with the avals of spec's leaves (any leaf
 * kind: arrays and values of another trace contribute only their dtype and
 * shape, so a function can trace a region of itself), its outputs are the
 * values it puts in `out`. Returns a new graph, or NULL with the error (which
 * names the primitive, shapes, and the caller's file:line). */
nb_graph *nb_trace(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *spec);

/* Inlines callee into g: `in` maps callee input paths to values of g (every
 * input must be present); the outputs are set into `out` under the callee's
 * output paths. This is how a transformed graph is used inside a trace. */
nb_status nb_graph_call(nb_graph *g, const nb_graph *callee, const nb_tree *in, nb_tree *out);

/* Text form (stable, for golden tests); structural hash and equality
 * (independent of value names). */
void nb_graph_print(const nb_graph *g, FILE *f);
char *nb_graph_to_string(const nb_graph *g); /* free() the result */
uint64_t nb_graph_hash(const nb_graph *g);
bool nb_graph_equal(const nb_graph *a, const nb_graph *b);
/* Model cost of one run: floating-point operations and bytes moved by every
 * primitive (each primitive reading its inputs and writing its outputs). */
void nb_graph_cost(const nb_graph *g, double *flops, double *bytes);

/* Runs g with the reference interpreter. `inputs` holds an array for every
 * input path (extra paths are ignored); outputs are set into `outputs`
 * (new references held by the tree). */
nb_status nb_graph_run(nb_ctx *ctx, const nb_graph *g, const nb_tree *inputs, nb_tree *outputs);
/* Positional form: in[nb_graph_num_inputs] borrowed, out[nb_graph_num_outputs]
 * receive new references. */
nb_status nb_graph_run_flat(nb_ctx *ctx, const nb_graph *g, nb_array *const *in, nb_array **out);

/* ------------------------------------------------------------------------ */
/* Values and ops                                                            */
/* ------------------------------------------------------------------------ */

nb_aval nb_val_aval(const nb_val *v);
nb_dtype nb_val_dtype(const nb_val *v);
int nb_val_rank(const nb_val *v);
int64_t nb_val_dim(const nb_val *v, int axis);      /* negative axes count from the end */
nb_graph *nb_val_graph(const nb_val *v);

/* Constants. nb_const borrows a (the graph keeps its own reference). */
nb_val *nb_const_at(nb_loc loc, nb_graph *g, nb_array *a);
nb_val *nb_scalar_at(nb_loc loc, nb_graph *g, nb_dtype t, double value);
nb_val *nb_full_at(nb_loc loc, nb_graph *g, nb_dtype t, int rank, const int64_t *dims, double value);
nb_val *nb_full_like_at(nb_loc loc, nb_val *x, double value);
nb_val *nb_iota_at(nb_loc loc, nb_graph *g, nb_dtype t, int rank, const int64_t *dims, int axis);

/* Elementwise unary: nb_<op>_at for each op listed in nabla/unary.h. */
#include "nabla/unary.h"
#define NB_DECLARE_UNARY(name) nb_val *nb_##name##_at(nb_loc loc, nb_val *x);
NB_UNARY_OPS(NB_DECLARE_UNARY)
#undef NB_DECLARE_UNARY

/* Elementwise binary, with NumPy broadcasting of ranks and size-1 dims
 * (the primitives themselves take equal shapes). Dtypes must match, except
 * that the shift/compare results are bool. */
#include "nabla/binary.h"
#define NB_DECLARE_BINARY(name) nb_val *nb_##name##_at(nb_loc loc, nb_val *a, nb_val *b);
NB_BINARY_OPS(NB_DECLARE_BINARY)
#undef NB_DECLARE_BINARY

nb_val *nb_select_at(nb_loc loc, nb_val *pred, nb_val *on_true, nb_val *on_false);
nb_val *nb_clamp_at(nb_loc loc, nb_val *lo, nb_val *x, nb_val *hi);
nb_val *nb_convert_at(nb_loc loc, nb_val *x, nb_dtype t);
/* Same-size dtypes only. */
nb_val *nb_bitcast_at(nb_loc loc, nb_val *x, nb_dtype t);
nb_val *nb_stop_gradient_at(nb_loc loc, nb_val *x);

/* Reductions over the given axes (naxes == 0 with axes == NULL: all axes).
 * The reduced axes are removed. */
nb_val *nb_reduce_sum_at(nb_loc loc, nb_val *x, int naxes, const int *axes);
nb_val *nb_reduce_max_at(nb_loc loc, nb_val *x, int naxes, const int *axes);
nb_val *nb_reduce_min_at(nb_loc loc, nb_val *x, int naxes, const int *axes);
nb_val *nb_reduce_prod_at(nb_loc loc, nb_val *x, int naxes, const int *axes);
/* Index of the first maximum/minimum along axis (removed), as index_dtype. */
nb_val *nb_argmax_at(nb_loc loc, nb_val *x, int axis, nb_dtype index_dtype);
nb_val *nb_argmin_at(nb_loc loc, nb_val *x, int axis, nb_dtype index_dtype);
nb_val *nb_cumsum_at(nb_loc loc, nb_val *x, int axis, bool reverse);
nb_val *nb_cummax_at(nb_loc loc, nb_val *x, int axis, bool reverse);
/* log(sum(exp(x))) along axis (removed), float x, as jax.nn.logsumexp:
 * max-shifted; an all -inf row gives -inf, a row holding +inf gives +inf. */
nb_val *nb_logsumexp_at(nb_loc loc, nb_val *x, int axis);

/* Shape ops. */
nb_val *nb_reshape_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims); /* one dim may be -1 */
/* Operand dim i becomes result dim bdims[i]; other result dims broadcast. */
nb_val *nb_broadcast_in_dim_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims, const int *bdims);
/* NumPy-style: align trailing dims. */
nb_val *nb_broadcast_to_at(nb_loc loc, nb_val *x, int rank, const int64_t *dims);
nb_val *nb_transpose_at(nb_loc loc, nb_val *x, const int *perm);
nb_val *nb_squeeze_at(nb_loc loc, nb_val *x, int naxes, const int *axes);
nb_val *nb_expand_dims_at(nb_loc loc, nb_val *x, int axis);
/* strides may be NULL (all 1). */
nb_val *nb_slice_at(nb_loc loc, nb_val *x, const int64_t *start, const int64_t *limit, const int64_t *strides);
/* start[rank] are scalar integer values, clamped so the slice fits (as XLA). */
nb_val *nb_dynamic_slice_at(nb_loc loc, nb_val *x, nb_val *const *start, const int64_t *sizes);
nb_val *nb_dynamic_update_slice_at(nb_loc loc, nb_val *x, nb_val *update, nb_val *const *start);
nb_val *nb_concatenate_at(nb_loc loc, int n, nb_val *const *xs, int axis);
/* lo/hi may be negative (cropping); interior may be NULL (no interior padding). */
nb_val *nb_pad_at(nb_loc loc, nb_val *x, nb_val *pad_value, const int64_t *lo, const int64_t *hi, const int64_t *interior);

/* Gather and scatter-add with explicit dimension numbers (StableHLO's,
 * including batching dims: operand dim operand_batching_dims[i] is indexed
 * by the position along indices dim start_indices_batching_dims[i]).
 * Indices may have any integer dtype; index_vector_dim == rank(indices)
 * means an implicit trailing vector of length 1. Only the first n_* entries
 * of each array are read. */
typedef struct nb_gather_dims {
  int n_offset, n_collapsed, n_start_index_map, n_operand_batching;
  int offset_dims[NB_MAX_RANK];           /* result dims that hold the slice */
  int collapsed_slice_dims[NB_MAX_RANK];  /* operand dims of slice size 1 dropped */
  int start_index_map[NB_MAX_RANK];       /* index vector entry i indexes operand dim map[i] */
  int operand_batching_dims[NB_MAX_RANK];
  int start_indices_batching_dims[NB_MAX_RANK];
  int index_vector_dim;                   /* dim of indices holding the index vector */
} nb_gather_dims;
/* slice_sizes[rank(operand)]: 1 for collapsed and batching dims. Each start
 * index is clamped to [0, dim - slice size] so the slice fits (as XLA). */
nb_val *nb_gather_at(nb_loc loc, nb_val *operand, nb_val *indices, const nb_gather_dims *dn,
                     const int64_t *slice_sizes);
typedef struct nb_scatter_dims {
  int n_update_window, n_inserted_window, n_scatter_to_operand, n_operand_batching;
  int update_window_dims[NB_MAX_RANK];
  int inserted_window_dims[NB_MAX_RANK];
  int scatter_dims_to_operand_dims[NB_MAX_RANK];
  int operand_batching_dims[NB_MAX_RANK];
  int scatter_indices_batching_dims[NB_MAX_RANK];
  int index_vector_dim;
} nb_scatter_dims;
/* operand with updates added at the windows the indices start (repeats
 * accumulate). The window extents are the updates' update_window_dims. A
 * window that does not fit in full is skipped (as XLA). Not for bool. */
nb_val *nb_scatter_add_at(nb_loc loc, nb_val *operand, nb_val *indices, nb_val *updates, const nb_scatter_dims *dn);
/* Conveniences built on gather. Negative indices count from the end (as
 * NumPy); indices still out of range are clamped (as gather).
 * take: rows of table by integer ids of any shape (an embedding lookup);
 * the result is ids.shape + table.shape[1:]. */
nb_val *nb_take_at(nb_loc loc, nb_val *table, nb_val *ids);
/* numpy.take_along_axis: x and idx have one rank; y[..., j, ...] =
 * x[..., idx[..., j, ...], ...] along axis, the other dims broadcast (NumPy
 * rules). With idx [..., 1] of labels, logp[..., labels] for cross-entropy. */
nb_val *nb_take_along_axis_at(nb_loc loc, nb_val *x, nb_val *idx, int axis);

/* Stable sort along axis (equal elements keep their order, in both
 * directions). NaNs order above every number: last ascending (as NumPy),
 * first descending. values: sorted x; *indices (when indices != NULL): the
 * positions as i32. Any dtype. */
nb_val *nb_sort_at(nb_loc loc, nb_val *x, int axis, bool descending, nb_val **indices);
/* The k largest along the last axis (0 <= k <= its length), descending,
 * ties to the lower position, NaNs first; *indices as i32. */
nb_val *nb_top_k_at(nb_loc loc, nb_val *x, int k, nb_val **indices);

/* dot_general: contracting and batch dims of lhs and rhs. Result dims are
 * (batch..., lhs free..., rhs free...), as XLA. */
typedef struct nb_dot_dims {
  int n_contract, n_batch;
  int lhs_contract[NB_MAX_RANK], rhs_contract[NB_MAX_RANK];
  int lhs_batch[NB_MAX_RANK], rhs_batch[NB_MAX_RANK];
} nb_dot_dims;
/* out_dtype: the result dtype (accumulation is at least f32 for floats);
 * pass NB_DTYPE_COUNT for lhs's dtype. lhs and rhs share one non-bool dtype
 * and out_dtype is of the same kind (float or integer); integer products
 * accumulate in 64 bits and wrap to out_dtype. Negative dims count from the
 * end. */
nb_val *nb_dot_general_at(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_dot_dims *dn, nb_dtype out_dtype);
/* Matrix product with batch dims broadcast as numpy.matmul for rank >= 2. */
nb_val *nb_matmul_at(nb_loc loc, nb_val *a, nb_val *b);

/* conv_general_dilated, N spatial dims (0..6). Layouts are given by dim
 * numbers: which dim of each operand and of the result is batch, feature and
 * each spatial dim. Per spatial dim, the input is dilated by lhs_dilation
 * (transposed conv), padded by pad_lo/pad_hi (negative crops) and read by the
 * kernel dilated by rhs_dilation (atrous) at the stride; the output has
 * max(0, floor((padded - dilated kernel) / stride) + 1) positions. With
 * feature_group_count G, lhs features = G * rhs in-features and output
 * feature o uses group o / (O/G); with batch_group_count B, output batch is
 * lhs batch / B and output feature o uses lhs batch block o / (O/B). G and B
 * cannot both exceed 1; operands share one non-bool dtype, as does the result
 * (integers wrap). Kernel spatial dims must be non-empty. */
typedef struct nb_conv_params {
  int n_spatial;
  int64_t strides[NB_MAX_RANK];
  int64_t pad_lo[NB_MAX_RANK], pad_hi[NB_MAX_RANK];
  int64_t lhs_dilation[NB_MAX_RANK], rhs_dilation[NB_MAX_RANK];
  int64_t feature_group_count, batch_group_count;
  int lhs_batch_dim, lhs_feature_dim, lhs_spatial[NB_MAX_RANK];
  int rhs_out_feature_dim, rhs_in_feature_dim, rhs_spatial[NB_MAX_RANK];
  int out_batch_dim, out_feature_dim, out_spatial[NB_MAX_RANK];
} nb_conv_params;
/* Params for NCHW / OIHW / NCHW-style layouts with unit dilation and the
 * given strides and symmetric padding (either may be NULL: 1 and 0). */
nb_conv_params nb_conv_params_default(int n_spatial, const int64_t *strides, const int64_t *padding);
nb_val *nb_conv_at(nb_loc loc, nb_val *lhs, nb_val *rhs, const nb_conv_params *p);
/* x with the order of elements reversed along the given axes (negative axes
 * count from the end), as lax.rev; used to flip kernels. */
nb_val *nb_rev_at(nb_loc loc, nb_val *x, int naxes, const int *axes);

/* ------------------------------------------------------------------------ */
/* Random numbers: threefry2x32 keys (u32[2]), as JAX                        */
/* ------------------------------------------------------------------------ */

/* The threefry2x32 block function (20 rounds), elementwise over four u32
 * values (broadcast to one shape, NumPy rules); two outputs. The only random
 * primitive: everything below is built on it, so any stream depends only on
 * (key, shape, dtype) and the context's nb_prng_impl. The streams are JAX's
 * threefry ones bit for bit (jax_threefry_partitionable=False by default,
 * True with NB_PRNG_THREEFRY_PARTITIONABLE; see nb_ctx_set_prng_impl):
 * keys, split, fold_in, bits and uniform (f64
 * uniform over a range within an ulp: XLA fuses its multiply-add); normal
 * within XLA's erf_inv error (nabla's f64 erf_inv is within an ulp of the
 * correctly rounded value over all of (-1, 1), compiled and interpreted
 * alike). */
void nb_threefry2x32_at(nb_loc loc, nb_val *k0, nb_val *k1, nb_val *x0, nb_val *x1, nb_val **y0, nb_val **y1);
/* jax.random.PRNGKey(seed): u32[2] = (seed >> 32, seed & 0xffffffff). */
nb_val *nb_random_key_at(nb_loc loc, nb_graph *g, uint64_t seed);
nb_val *nb_random_split_at(nb_loc loc, nb_val *key, int64_t n);         /* u32[n,2], 1 <= n < 2^31 */
nb_val *nb_random_fold_in_at(nb_loc loc, nb_val *key, nb_val *data);    /* data: integer scalar, as u32 */
/* At most 2^32 - 2 values per call (2^31 - 1 for f64 samplers): split the
 * key for more. */
nb_val *nb_random_bits_at(nb_loc loc, nb_val *key, int rank, const int64_t *dims); /* u32 */
/* [minval, maxval), finite, minval <= maxval; any float dtype. */
nb_val *nb_random_uniform_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims, double minval, double maxval);
/* sqrt(2) erf_inv(u), u uniform in (-1, 1). */
nb_val *nb_random_normal_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims);
/* Standard normal conditioned on (lower, upper), lower < upper (may be
 * infinite); values stay inside the open interval. */
nb_val *nb_random_truncated_normal_at(nb_loc loc, nb_val *key, nb_dtype t, int rank, const int64_t *dims, double lower, double upper);
/* bool: uniform(p's dtype) < p, p (float) broadcast to dims. */
nb_val *nb_random_bernoulli_at(nb_loc loc, nb_val *key, nb_val *p, int rank, const int64_t *dims);
/* Samples along `axis` of logits (removed in the result), as i32, by
 * Gumbel-max: argmax(logits - log(-log(u))). */
nb_val *nb_random_categorical_at(nb_loc loc, nb_val *key, nb_val *logits, int axis);

/* Eager use: each returns a new reference, or NULL with an error. nb_key
 * makes a u32[2] key; the others trace one of the samplers above on `key`
 * (borrowed, u32[2]) and run it with the interpreter. nb_key_row copies row
 * i of a u32[n,2] array of keys (nb_key_split's result). */
nb_array *nb_key(nb_ctx *ctx, uint64_t seed);
nb_array *nb_key_split(nb_ctx *ctx, nb_array *key, int64_t n);
nb_array *nb_key_fold_in(nb_ctx *ctx, nb_array *key, uint32_t data);
nb_array *nb_key_row(nb_ctx *ctx, nb_array *keys, int64_t i);
nb_array *nb_array_random_uniform(nb_ctx *ctx, nb_array *key, nb_dtype t, int rank, const int64_t *dims, double minval, double maxval);
nb_array *nb_array_random_normal(nb_ctx *ctx, nb_array *key, nb_dtype t, int rank, const int64_t *dims);

/* ------------------------------------------------------------------------ */
/* Custom calls: kernels and user code plugged in as primitives             */
/* ------------------------------------------------------------------------ */

typedef struct nb_custom_call nb_custom_call;
/* A custom call is registered on the context once, by name (names are unique;
 * register before tracing from several threads). Its rules:
 *  infer  output avals (nout of them, the count given at the call) from the
 *         input avals and attributes; an error status refuses the operands.
 *  eval   the host implementation (the interpreter's): out[i] holds a fresh
 *         array of the inferred aval to fill through nb_array_data_mut, or to
 *         release and replace with a new reference of that aval.
 *  vjp    (optional) emits into g the input cotangents in_ct[i] (NULL: zero)
 *         from the inputs, outputs and output cotangents (zeros for float
 *         outputs without one, NULL for non-float outputs). Custom calls are
 *         differentiated in reverse mode only (grad/vjp; jvp fails when run);
 *         without a vjp they cannot be differentiated.
 *  cost   (optional) flops and bytes of one call.
 *  in_place (optional) bit i set: output i is operand i updated (the infer
 *         rule must give it operand i's aval). eval then finds out[i] already
 *         holding operand i's contents, often in operand i's own memory (a
 *         compiler gives it that memory when the operand is donated or dead),
 *         and writes only what changes, instead of copying a large operand.
 * Under vmap the kernel runs once per batch item. `attrs` is an opaque blob,
 * copied at the call and hashed and compared by value. The rules and name are
 * copied; ud is kept as given until the context is destroyed. */
typedef struct nb_custom_call_rules {
  const char *name;
  /* Output avals from input avals and attributes. */
  nb_status (*infer)(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out);
  nb_status (*eval)(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout, nb_array **out);
  nb_status (*vjp)(void *ud, nb_graph *g, int nin, nb_val *const *in, int nout, nb_val *const *out,
                   nb_val *const *out_ct, const void *attrs, size_t attrs_size, nb_val **in_ct);
  void (*cost)(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, double *flops, double *bytes);
  void *ud;
  uint64_t in_place;
} nb_custom_call_rules;
nb_status nb_custom_call_register(nb_ctx *ctx, const nb_custom_call_rules *rules);
/* Whether a custom call is registered on ctx as `name`. */
bool nb_custom_call_registered(const nb_ctx *ctx, const char *name);
/* Calls the kernel registered as `name` on nin operands (at most 64) for nout
 * outputs (1 to 64). Returns the first output; all outputs go to out[nout]
 * when out != NULL. An unknown name is NB_ERR_NOT_FOUND. */
nb_val *nb_custom_call_at(nb_loc loc, nb_graph *g, const char *name, int nin, nb_val *const *in,
                          const void *attrs, size_t attrs_size, int nout, nb_val **out);

/* ------------------------------------------------------------------------ */
/* Transformations: graph -> new graph                                       */
/* ------------------------------------------------------------------------ */

/* Reverse mode. The result graph has the same inputs as g and outputs:
 *   "loss"            g's first output (must be a float scalar),
 *   "aux/<path>"      with has_aux, g's other outputs,
 *   "grad/<path>"     for every input whose path matches `wrt`.
 * wrt is a path prefix ("params" selects params/...), or NULL for all float
 * inputs; integer inputs are never differentiated. nb_value_and_grad is this;
 * nb_grad leaves out "loss". */
typedef struct nb_grad_opts {
  const char *wrt;
  bool has_aux;
} nb_grad_opts;
nb_graph *nb_value_and_grad(nb_ctx *ctx, const nb_graph *g, const nb_grad_opts *opts);
nb_graph *nb_grad(nb_ctx *ctx, const nb_graph *g, const nb_grad_opts *opts);
/* Forward mode: inputs "primal/<path>" for g's inputs and "tangent/<path>"
 * for its float inputs; outputs "primal/<path>" and "tangent/<path>" (float
 * outputs). The two namespaces keep jvp(jvp(g)) unambiguous. */
nb_graph *nb_jvp(nb_ctx *ctx, const nb_graph *g);
/* Pullback: inputs "primal/<path>" for g's inputs and "ct/<path>" for its
 * float outputs; outputs "primal/<path>" for g's outputs and "grad/<path>"
 * for its float inputs. */
nb_graph *nb_vjp(nb_ctx *ctx, const nb_graph *g);

/* vmap: g is traced on unbatched shapes; the result takes every input with a
 * batch axis of size axis_size (> 0, required) inserted at in_axis (or no
 * batch axis: -1, JAX's None; unlike JAX's in_axes=-1, never the last axis) and returns outputs with it at out_axis. Per-path overrides
 * go in in_axes / out_axes: trees whose leaves are integer scalar arrays keyed
 * by path prefix (the longest matching prefix wins). */
typedef struct nb_vmap_opts {
  int in_axis, out_axis;
  const nb_tree *in_axes, *out_axes;
  int64_t axis_size;
} nb_vmap_opts;
nb_graph *nb_vmap(nb_ctx *ctx, const nb_graph *g, const nb_vmap_opts *opts);

/* remat: calls `callee` from g as one region whose intermediates are
 * recomputed in the backward pass instead of stored. Same contract as
 * nb_graph_call. */
nb_status nb_remat_call(nb_graph *g, const nb_graph *callee, const nb_tree *in, nb_tree *out);
/* jax.lax.optimization_barrier: replaces vals[0..n) (n <= 256, of one graph)
 * by the same values, which a compiler computes and stores as they are
 * before any use (nothing fuses or merges across): the trainer sums
 * micro-batch gradients after one, so that each partial sum is rounded as
 * it is when another process computes it. */
nb_status nb_optimization_barrier_at(nb_loc loc, int n, nb_val **vals);
/* custom_vjp: calls `fwd_primal` (inputs -> outputs) in g; under grad, the
 * backward pass runs `bwd` instead of differentiating fwd_primal. bwd's
 * inputs are fwd_primal's inputs (same paths) plus "ct/<out path>" for each
 * output; its outputs are "grad/<in path>" for each float input. */
nb_status nb_custom_vjp_call(nb_graph *g, const nb_graph *fwd_primal, const nb_graph *bwd,
                             const nb_tree *in, nb_tree *out);

/* Control flow, as lax.cond / switch / while_loop / scan / fori_loop. The
 * functions called are graphs (nb_trace or nb_graph_create) whose inputs are
 * taken by position: consts first, then the carry, then the per-iteration
 * slices, as in JAX. The primitives hold the graphs (the caller keeps its own
 * reference). Results are written to the output arrays (the poison value
 * after an error, which is also recorded in g and returned).
 *
 * switch: outs = branches[clamp(index, 0, nbranches - 1)](ops); index is an
 * integer scalar; every branch takes ops and returns outputs of the same
 * avals. At most NB_COND_MAX_BRANCHES branches. Under vmap with a batched
 * index, every branch runs and the results are selected. */
#define NB_COND_MAX_BRANCHES 32
nb_status nb_switch_at(nb_loc loc, nb_graph *g, nb_val *index, int nbranches, const nb_graph *const *branches, int nops,
                       nb_val *const *ops, nb_val **outs);
/* cond: on_true(ops) when pred (a bool scalar) holds, else on_false(ops). */
nb_status nb_cond_at(nb_loc loc, nb_graph *g, nb_val *pred, const nb_graph *on_true, const nb_graph *on_false, int nops,
                     nb_val *const *ops, nb_val **outs);
/* while_loop: carry = init; while cond(cond_consts, carry): carry =
 * body(body_consts, carry); outs = carry. cond returns a bool scalar; body
 * returns the carry with the same avals. Forward mode and vmap work; reverse
 * mode does not (the trip count is unknown): use nb_fori_loop with constant
 * bounds, or nb_scan. */
nb_status nb_while_loop_at(nb_loc loc, nb_graph *g, const nb_graph *cond, const nb_graph *body, int ncond_consts,
                           nb_val *const *cond_consts, int nbody_consts, nb_val *const *body_consts, int ncarry,
                           nb_val *const *init, nb_val **outs);
/* scan: body(consts, carry, x) -> (carry, y) over the leading axis of xs:
 *   carry = init; for t in 0..length-1 (length-1..0 when reverse):
 *     (carry, y[t]) = body(consts, carry, xs[t])
 * carry_out receives ncarry values, ys the stacked y (one per body output
 * after the carry, with a leading axis of `length`). opts may be NULL. */
typedef struct nb_scan_opts {
  int64_t length; /* trip count; 0: the leading dimension of xs (then xs are required) */
  bool reverse;
  int unroll;     /* iterations per trip in compiled code (a hint; 0 means 1) */
} nb_scan_opts;
nb_status nb_scan_at(nb_loc loc, nb_graph *g, const nb_graph *body, int nconsts, nb_val *const *consts, int ncarry,
                     nb_val *const *init, int nxs, nb_val *const *xs, const nb_scan_opts *opts, nb_val **carry_out,
                     nb_val **ys);
/* fori_loop: carry = init; for i in [lower, upper): carry = body(consts, i,
 * carry). lower and upper are integer scalars; body's i is an i32 scalar. As
 * in JAX, constant bounds (nb_scalar) make a scan of upper - lower steps, which
 * reverse mode can differentiate; other bounds make a while_loop. */
nb_status nb_fori_loop_at(nb_loc loc, nb_graph *g, nb_val *lower, nb_val *upper, const nb_graph *body, int nconsts,
                          nb_val *const *consts, int ncarry, nb_val *const *init, nb_val **outs);

/* ------------------------------------------------------------------------ */
/* Location-capturing macros: the ops above, called as nb_add(a, b).         */
/* (the unary and binary ones are in nabla/unary.h, nabla/binary.h)           */
/* ------------------------------------------------------------------------ */

#define nb_const(g, a) nb_const_at(NB_HERE, g, a)
#define nb_scalar(g, t, v) nb_scalar_at(NB_HERE, g, t, v)
#define nb_full(g, t, r, d, v) nb_full_at(NB_HERE, g, t, r, d, v)
#define nb_full_like(x, v) nb_full_like_at(NB_HERE, x, v)
#define nb_iota(g, t, r, d, ax) nb_iota_at(NB_HERE, g, t, r, d, ax)
#define nb_switch(g, ...) nb_switch_at(NB_HERE, g, __VA_ARGS__)
#define nb_cond(g, ...) nb_cond_at(NB_HERE, g, __VA_ARGS__)
#define nb_while_loop(g, ...) nb_while_loop_at(NB_HERE, g, __VA_ARGS__)
#define nb_scan(g, ...) nb_scan_at(NB_HERE, g, __VA_ARGS__)
#define nb_fori_loop(g, ...) nb_fori_loop_at(NB_HERE, g, __VA_ARGS__)
#define nb_select(p, a, b) nb_select_at(NB_HERE, p, a, b)
#define nb_clamp(lo, x, hi) nb_clamp_at(NB_HERE, lo, x, hi)
#define nb_convert(x, t) nb_convert_at(NB_HERE, x, t)
#define nb_bitcast(x, t) nb_bitcast_at(NB_HERE, x, t)
#define nb_stop_gradient(x) nb_stop_gradient_at(NB_HERE, x)
#define nb_reduce_sum(x, n, ax) nb_reduce_sum_at(NB_HERE, x, n, ax)
#define nb_reduce_max(x, n, ax) nb_reduce_max_at(NB_HERE, x, n, ax)
#define nb_reduce_min(x, n, ax) nb_reduce_min_at(NB_HERE, x, n, ax)
#define nb_reduce_prod(x, n, ax) nb_reduce_prod_at(NB_HERE, x, n, ax)
#define nb_argmax(x, ax, t) nb_argmax_at(NB_HERE, x, ax, t)
#define nb_argmin(x, ax, t) nb_argmin_at(NB_HERE, x, ax, t)
#define nb_cumsum(x, ax, rev) nb_cumsum_at(NB_HERE, x, ax, rev)
#define nb_cummax(x, ax, rev) nb_cummax_at(NB_HERE, x, ax, rev)
#define nb_logsumexp(x, ax) nb_logsumexp_at(NB_HERE, x, ax)
#define nb_reshape(x, r, d) nb_reshape_at(NB_HERE, x, r, d)
#define nb_broadcast_in_dim(x, r, d, b) nb_broadcast_in_dim_at(NB_HERE, x, r, d, b)
#define nb_broadcast_to(x, r, d) nb_broadcast_to_at(NB_HERE, x, r, d)
#define nb_transpose(x, p) nb_transpose_at(NB_HERE, x, p)
#define nb_squeeze(x, n, ax) nb_squeeze_at(NB_HERE, x, n, ax)
#define nb_expand_dims(x, ax) nb_expand_dims_at(NB_HERE, x, ax)
#define nb_slice(x, s, l, st) nb_slice_at(NB_HERE, x, s, l, st)
#define nb_dynamic_slice(x, s, sz) nb_dynamic_slice_at(NB_HERE, x, s, sz)
#define nb_dynamic_update_slice(x, u, s) nb_dynamic_update_slice_at(NB_HERE, x, u, s)
#define nb_concatenate(n, xs, ax) nb_concatenate_at(NB_HERE, n, xs, ax)
#define nb_pad(x, v, lo, hi, in) nb_pad_at(NB_HERE, x, v, lo, hi, in)
#define nb_gather(o, i, dn, ss) nb_gather_at(NB_HERE, o, i, dn, ss)
#define nb_scatter_add(o, i, u, dn) nb_scatter_add_at(NB_HERE, o, i, u, dn)
#define nb_take(t, ids) nb_take_at(NB_HERE, t, ids)
#define nb_take_along_axis(x, i, ax) nb_take_along_axis_at(NB_HERE, x, i, ax)
#define nb_sort(x, ax, desc, idx) nb_sort_at(NB_HERE, x, ax, desc, idx)
#define nb_top_k(x, k, idx) nb_top_k_at(NB_HERE, x, k, idx)
#define nb_dot_general(a, b, dn, t) nb_dot_general_at(NB_HERE, a, b, dn, t)
#define nb_matmul(a, b) nb_matmul_at(NB_HERE, a, b)
#define nb_conv(a, b, p) nb_conv_at(NB_HERE, a, b, p)
#define nb_rev(x, n, ax) nb_rev_at(NB_HERE, x, n, ax)
#define nb_threefry2x32(k0, k1, x0, x1, y0, y1) nb_threefry2x32_at(NB_HERE, k0, k1, x0, x1, y0, y1)
#define nb_random_key(g, s) nb_random_key_at(NB_HERE, g, s)
#define nb_random_split(k, n) nb_random_split_at(NB_HERE, k, n)
#define nb_random_fold_in(k, d) nb_random_fold_in_at(NB_HERE, k, d)
#define nb_random_bits(k, r, d) nb_random_bits_at(NB_HERE, k, r, d)
#define nb_random_uniform(k, t, r, d, lo, hi) nb_random_uniform_at(NB_HERE, k, t, r, d, lo, hi)
#define nb_random_normal(k, t, r, d) nb_random_normal_at(NB_HERE, k, t, r, d)
#define nb_random_truncated_normal(k, t, r, d, lo, hi) nb_random_truncated_normal_at(NB_HERE, k, t, r, d, lo, hi)
#define nb_random_bernoulli(k, p, r, d) nb_random_bernoulli_at(NB_HERE, k, p, r, d)
#define nb_random_categorical(k, l, ax) nb_random_categorical_at(NB_HERE, k, l, ax)
#define nb_custom_call(g, name, nin, in, attrs, sz, nout, out) nb_custom_call_at(NB_HERE, g, name, nin, in, attrs, sz, nout, out)

/* Collectives over mesh axes, the communicator interface, shard_map. */
#include "nabla/collective.h"

NB_END_DECLS
#endif /* NABLA_CORE_H */
