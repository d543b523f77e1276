/* The plan, private to the compiler, its backends and the runtime: the
 * compile configuration, the backend-neutral loop-nest IR of fused kernels,
 * the plan (steps and buffers) that the passes build in pipeline order, and
 * the entry points of each pass (simplify -> fuse -> buffers). A backend
 * (backend/backend.h) turns a plan into code; the runtime (runtime/exe.h)
 * runs its steps. */
#ifndef NABLA_COMPILE_JIT_H
#define NABLA_COMPILE_JIT_H

#include <pthread.h>

#include "core/prims/params.h"
#include "nabla/compile.h"

/* ---------------------------------------------------------------- config */

#define NB_JIT_SWITCHES(X) X(dce) X(fold) X(algebra) X(inline) X(fuse) X(reuse) X(donate) X(parallel) X(blas) X(async) X(native)
typedef enum nb_jit_switch {
#define NB_JIT_SW(n) NB_SW_##n,
  NB_JIT_SWITCHES(NB_JIT_SW)
#undef NB_JIT_SW
  NB_SW_COUNT
} nb_jit_switch;

typedef struct nb_jit_config {
  const struct nb_backend *backend; /* the target (backend/backend.h) */
  bool off[NB_SW_COUNT];
  int threads;
  int debug;
  char cache_dir[1024];
  char cc[1024];
  uint64_t cache_max_bytes; /* $NABLA_CACHE_MAX_MB */
} nb_jit_config;

/* ---------------------------------------------------------------- arena */

/* Compile-time memory owned by one executable, freed at once. */
typedef struct nb_jit_arena {
  nb_ctx *ctx;
  struct nb_jit_block *blocks;
} nb_jit_arena;
void *nb_jit__alloc(nb_jit_arena *a, size_t bytes); /* zeroed; NULL on OOM */
/* Grows an arena vector of n elements to hold n+1; returns false on OOM. */
bool nb_jit__push(nb_jit_arena *a, void **v, int *n, int *cap, size_t elem);
#define NB_PUSH(a, vec, n, cap) nb_jit__push((a), (void **)&(vec), &(n), &(cap), sizeof *(vec))
void nb_jit__arena_free(nb_jit_arena *a);
/* Moves src's blocks into dst (src becomes empty). */
void nb_jit__arena_adopt(nb_jit_arena *dst, nb_jit_arena *src);

/* Growable text (nb_alloc'ed); oom sticks. */
typedef struct nb_jit_text {
  nb_ctx *ctx;
  char *s;
  size_t n, cap;
  bool oom;
} nb_jit_text;
void nb_jit__printf(nb_jit_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nb_jit__text_free(nb_jit_text *t);

/* ---------------------------------------------------------------- kernel IR */

/* A kernel iterates an outer space O (ro dims, split across threads) and,
 * for row kernels, an inner reduction space R (rr dims) once per phase.
 * Loop variables are numbered O first, then R. Every memory access is an
 * affine map of the loop variables (element offset = base + sum coef*var). */
#define NB_KVARS (2 * NB_MAX_RANK)
typedef struct nb_kaffine {
  int64_t base;
  int64_t coef[NB_KVARS];
} nb_kaffine;

typedef enum nb_knode_kind { NB_KN_LOAD, NB_KN_CONST, NB_KN_INDEX, NB_KN_OP, NB_KN_REDUCE } nb_knode_kind;

/* One scalar SSA value of the kernel body; operands come earlier. inner:
 * depends on the R variables (evaluated inside a phase loop). A REDUCE node
 * is an outer value computed by phase `phase` (1-based) over its operand. */
typedef struct nb_knode {
  nb_knode_kind kind;
  nb_prim prim;        /* OP, REDUCE */
  nb_dtype dtype;      /* result dtype */
  nb_dtype src_dtype;  /* OP: dtype of operand 0 (convert) */
  int nin, in[3];
  int arg;             /* LOAD: kernel argument */
  nb_kaffine map;      /* LOAD: element offset; INDEX: the index value */
  double cf;           /* CONST (floats, bool) */
  int64_t ci;          /* CONST (integers) */
  bool inner;
  int phase;           /* REDUCE: 1-based phase; others: latest phase they need */
} nb_knode;

typedef struct nb_kstore {
  int node, arg;
  nb_kaffine map;
  bool inner;
} nb_kstore;

typedef struct nb_kernel {
  int ro, rr;
  int64_t dims[NB_KVARS];   /* O dims then R dims */
  nb_knode *nodes;
  int nnodes, cap_nodes;
  nb_kstore *stores;
  int nstores, cap_stores;
  uint32_t *args;           /* value ids of the buffers read or written */
  bool *arg_written;
  int nargs, cap_args;
  int nphases;
  uint32_t *roots;          /* value ids it materializes */
  int nroots, cap_roots;
  int neqns;                /* equations fused into it */
  double flops, bytes;
} nb_kernel;

/* Whether node i of k is the first of the kernel's op or reduce nodes to
 * compute its primitive: walking i = 0.. and keeping these gives the
 * distinct primitives a kernel computes, in node order (its name in
 * traces and the op profile). */
bool nb_jit__kernel_first_op(const nb_kernel *k, int i);

/* ---------------------------------------------------------------- plan */

typedef enum nb_buf_class { NB_BUF_NONE, NB_BUF_INPUT, NB_BUF_CONST, NB_BUF_TEMP, NB_BUF_OUTPUT } nb_buf_class;

typedef struct nb_jbuf {
  nb_buf_class cls;
  int index;          /* INPUT: input index; OUTPUT: first output index */
  nb_array *constant; /* CONST: held by the graph */
  size_t offset;      /* TEMP: arena offset */
  size_t nbytes;
  int def_step, last_step;
  int donor;          /* OUTPUT: donated input index whose buffer it may take, or -1 */
  int alias;          /* TEMP: the value whose memory it lives in (a chain of in-place
                       * updates, buffers.c): a TEMP with its own range or an OUTPUT; -1 */
  int view;           /* TEMP: lives in this value's buffer (not itself a view) at view_offset, no
                       * copy: a reshape read only by evaluated and control steps, a contiguous
                       * slice, a scan's ys passed through from its xs (fuse.c); -1 */
  size_t view_offset;
} nb_jbuf;

typedef struct nb_jstep {
  nb_exe_step_kind kind;
  int kernel;             /* KERNEL */
  const nb_eqn *eqn;      /* EVAL, BLAS */
  uint32_t order;         /* first equation index, for a stable schedule */
  size_t neqns;
  double flops, bytes;
  bool in_place;          /* EVAL: out[0] is planned in in[0]'s memory (equal pointers at run
                           * time, unless a donated input was not taken: then eval copies) */
  char name[40];
  char ops[80];           /* the source primitives, in order, "+"-joined ("add+mul+reduce_sum"): traces */
  nb_loc loc;             /* where its first (a kernel: first materialized) equation was traced */
  double last_ms, total_ms;
  struct nb_jcontrol *control; /* CONTROL: the compiled bodies (compile/control.c) */
  int start;              /* WAIT: the step that started its collective */
} nb_jstep;

typedef struct nb_jplan {
  nb_jit_arena *ar;
  const nb_graph *g;      /* the simplified graph */
  nb_jbuf *bufs;          /* per value id */
  const nb_val **vals;    /* per value id (NULL: an id no input or equation defines) */
  size_t nvals;
  nb_jstep *steps;
  int nsteps, cap_steps;
  nb_kernel *kernels;
  int nkernels, cap_kernels;
  bool *donated;          /* per input index */
  size_t arena_bytes, peak_bytes, output_bytes;
  int fuse_attempts;      /* fusion passes until no value had to be forced to memory */
  int nstarts;            /* START steps (collectives in flight between steps) */
} nb_jplan;

/* ---------------------------------------------------------------- passes */

/* simplify.c: a new graph (dce, fold, algebra, inline per cfg), or NULL + error. */
nb_graph *nb_jit__simplify(nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg);
/* fuse.c: fills plan->kernels, plan->steps (scheduled) and the buffer
 * classes of plan->bufs. */
nb_status nb_jit__fuse(nb_ctx *ctx, nb_jplan *plan, const nb_jit_config *cfg);
/* True when the kernel IR can express e (elementwise, layout, reductions). */
bool nb_jit__fusable(const nb_eqn *e);
/* buffers.c: liveness, arena offsets, donation, the peak estimate. */
nb_status nb_jit__assign_buffers(nb_ctx *ctx, nb_jplan *plan, const nb_jit_config *cfg);
/* ---------------------------------------------------------------- control flow */

/* compile/control.c: cond, while_loop and scan become one CONTROL step each
 * that owns its bodies compiled through this same pipeline (executables
 * with their own plans, runtime/exe.h), run as a loop or a branch by
 * runtime/control.c. */
typedef struct nb_jcontrol nb_jcontrol;
bool nb_jit__is_control(const nb_eqn *e);
/* Compiles the bodies of every CONTROL step of e's plan (recursively). */
nb_status nb_jit__control_compile(nb_exe *e);
void nb_jit__control_free(nb_exe *e);
/* Prints the bodies' steps (times summed over the last run's iterations). */
void nb_jit__control_print(const nb_jstep *st, FILE *f, int depth);
/* May the step's output `out` be written into its (dead) operand `in`'s
 * memory? True for a loop's initial carry and the matching final carry: it
 * is read once, before the first iteration writes anything. */
bool nb_jit__control_in_place_ok(const nb_jstep *st, uint32_t in, uint32_t out);
/* The operand whose memory output `out` of control equation e is, or -1: a
 * scan's ys that the body passes through unchanged from its xs. */
int nb_jit__control_output_operand(const nb_eqn *e, int out);
/* jit.c: an executable for a body graph under the parent's configuration
 * (not in the memory cache; the parent owns it). NULL + error on ctx. */
nb_exe *nb_jit__compile_sub(nb_ctx *ctx, const nb_graph *g, const nb_jit_config *cfg);

#endif
