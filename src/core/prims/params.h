/* Typed params structs of the primitives, one per primitive that has params.
 * Shared by the rules, the transformations and the compiler. Params are
 * hashed and compared by bytes unless the rules say otherwise, so they must be
 * fully initialized (zero the struct first: padding and unused slots too). */
#ifndef NABLA_PRIMS_PARAMS_H
#define NABLA_PRIMS_PARAMS_H

#include "core/ir.h"

typedef struct nb_constant_params {
  nb_array *value;
} nb_constant_params;

typedef struct nb_iota_params {
  nb_aval aval;
  int axis;
} nb_iota_params;

typedef struct nb_convert_params { /* convert, bitcast */
  nb_dtype dtype;
} nb_convert_params;

typedef struct nb_reduce_params { /* reduce_*: axes sorted ascending, no repeats */
  int naxes;
  int axes[NB_MAX_RANK];
} nb_reduce_params;

typedef struct nb_argreduce_params { /* argmax, argmin */
  int axis;
  nb_dtype index_dtype;
} nb_argreduce_params;

typedef struct nb_cumulative_params { /* cumsum, cummax */
  int axis;
  bool reverse;
} nb_cumulative_params;

typedef struct nb_reshape_params {
  nb_shape shape;
} nb_reshape_params;

typedef struct nb_broadcast_params { /* operand dim i -> result dim bdims[i] */
  nb_shape shape;
  int bdims[NB_MAX_RANK];
} nb_broadcast_params;

typedef struct nb_transpose_params { /* result dim i = operand dim perm[i] */
  int perm[NB_MAX_RANK];
} nb_transpose_params;

typedef struct nb_slice_params {
  int64_t start[NB_MAX_RANK], limit[NB_MAX_RANK], strides[NB_MAX_RANK];
} nb_slice_params;

typedef struct nb_pad_params { /* operands: x, scalar pad value */
  int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK], interior[NB_MAX_RANK];
} nb_pad_params;

typedef struct nb_concatenate_params {
  int axis;
} nb_concatenate_params;

typedef struct nb_dynamic_slice_params { /* operands: x, rank scalar start indices */
  int64_t sizes[NB_MAX_RANK];
} nb_dynamic_slice_params;
/* dynamic_update_slice has no params: operands x, update, rank scalar starts */

typedef struct nb_gather_params {
  nb_gather_dims dn;
  int64_t slice_sizes[NB_MAX_RANK];
} nb_gather_params;

typedef struct nb_scatter_params {
  nb_scatter_dims dn;
} nb_scatter_params;

typedef struct nb_sort_params { /* sort: outputs values and i32 indices */
  int axis;
  bool descending;
} nb_sort_params;

typedef struct nb_top_k_params {
  int k;
} nb_top_k_params;

typedef struct nb_dot_params {
  nb_dot_dims dn;
  nb_dtype out_dtype;
} nb_dot_params;

typedef struct nb_conv_prim_params {
  nb_conv_params p;
} nb_conv_prim_params;

typedef struct nb_rev_params { /* rev: axes sorted ascending, no repeats, none of size 1 */
  int naxes;
  int axes[NB_MAX_RANK];
} nb_rev_params;

/* custom_call(inputs) -> outputs through a registered host kernel;
 * custom_call_lin(primals, tangents of the float primals) -> tangents of the
 * float outputs, whose transpose emits the kernel's vjp. With batch > 0 every
 * operand and output carries a leading axis of that size and the kernel runs
 * once per item (vmap of a kernel that has no batching rule of its own). The
 * attributes are a u8 array, not arena memory, so that a copied equation in
 * another graph (inlining, transformations) keeps them alive by holding it. */
typedef struct nb_custom_call_entry nb_custom_call_entry; /* opaque here: core/internal.h */
typedef struct nb_custom_call_params {
  const nb_custom_call_entry *entry; /* registry entry on the context (outlives the graphs) */
  nb_array *attrs;                   /* u8[attrs_size] copy of the attributes, NULL when empty */
  size_t attrs_size;
  int nin, nout;                     /* of the kernel (custom_call_lin has more operands, fewer outputs) */
  int64_t batch;                     /* 0, or the size of the leading batch axis */
} nb_custom_call_params;

/* remat_call(body)(inputs) -> outputs; remat_lin(body, jvp)(primals,
 * tangents of the float inputs) -> tangents of the float outputs, linear in
 * the tangents; jvp is nb_jvp(body) (NULL for remat_call). */
typedef struct nb_remat_params {
  const nb_graph *body, *jvp;
} nb_remat_params;

/* custom_vjp_call(fwd, bwd)(inputs) -> outputs; custom_lin(fwd, bwd)(primals,
 * tangents of the float inputs) -> tangents of the float outputs, whose
 * transpose runs bwd. */
typedef struct nb_custom_vjp_params {
  const nb_graph *fwd, *bwd;
} nb_custom_vjp_params;

typedef struct nb_barrier_params { /* identity that is never merged or folded */
  uint64_t nonce;
} nb_barrier_params;

/* Control flow (control.c). Operands are consts first, then carry, then xs,
 * as in JAX; the carried graphs are held by the equation (hold_params) and
 * take their inputs in that order. */
/* cond(index, ops...) -> branches[clamp(index, 0, nbranches - 1)](ops...):
 * index is an i32 scalar; every branch has the same signature.
 * NB_COND_MAX_BRANCHES is in nabla/core.h. */
typedef struct nb_cond_params {
  int nbranches;
  const nb_graph *branches[NB_COND_MAX_BRANCHES];
} nb_cond_params;

/* while_loop(cond consts, body consts, carry) -> carry: while
 * cond(cond consts, carry) (a bool scalar), carry = body(body consts, carry). */
typedef struct nb_while_params {
  const nb_graph *cond, *body;
  int ncond_consts, nbody_consts;
} nb_while_params;

/* scan(consts, carry, xs) -> (carry, ys): for t in [0, length) (from the end
 * when reverse), (carry, y_t) = body(consts, carry, x_t), where x_t is row t
 * of each xs (leading dimension `length`) and ys stack the y_t. unroll is a
 * hint to compilers (iterations per trip); it does not change the result. */
typedef struct nb_scan_params {
  const nb_graph *body;
  int64_t length;
  int nconsts, ncarry;
  bool reverse;
  int unroll;
} nb_scan_params;

/* The collectives (collective.c): the axis they run over and its size when
 * traced (checked against the communicator's when run); dim/dim2 are
 * all_gather's and psum_scatter's dim (with tiled), all_to_all's split and
 * concat dims; ppermute's pairs send src[i]'s value to dst[i]. */
typedef struct nb_collective_params {
  char axis[NB_AXIS_NAME_MAX];
  int64_t axis_size;
  int dim, dim2;
  bool tiled;
  int npairs;
  int src[NB_PPERMUTE_MAX], dst[NB_PPERMUTE_MAX];
} nb_collective_params;

#endif
