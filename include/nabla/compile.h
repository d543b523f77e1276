/* nabla compile: jit — a traced graph compiled into an executable for the
 * CPU (the analogue of XLA). nb_jit simplifies the graph (dead code,
 * constant folding, algebraic rewrites; common subexpressions are already
 * shared by the IR), fuses elementwise / broadcast / layout / reduction
 * chains into loop kernels, assigns buffers (liveness-based reuse, donated
 * inputs), generates C for the kernels, compiles it with the system C
 * compiler into a shared object cached on disk by content hash, and loads it.
 * Equations it does not fuse run through their reference implementation
 * (dot_general through BLAS), so every graph runs. Without a working C
 * compiler the executable runs on the interpreter (one warning is logged).
 *
 * Example:
 *
 *   nb_graph *g = nb_trace(ctx, step, NULL, spec);
 *   const char *donate[] = {"params", NULL};
 *   nb_jit_opts o = {.donate = donate};
 *   nb_exe *exe = nb_jit(ctx, g, &o);           // compiled once, cached
 *   nb_tree *out = nb_tree_create(ctx);
 *   if (!exe || nb_exe_run(exe, inputs, out) != NB_OK) fprintf(stderr, "%s\n", nb_ctx_error(ctx));
 *   nb_exe_destroy(exe);
 *
 * Switches (names for nb_jit_opts.disable and $NABLA_JIT_DISABLE, comma
 * separated; "all" turns off every optimization but keeps native code):
 *   dce, fold, algebra   simplification passes
 *   inline               inlining remat / custom_vjp calls (off: each runs
 *                        on the interpreter, as one evaluated step)
 *   fuse                 fusion (off: one kernel per equation)
 *   reuse, donate        buffer reuse between intermediates; donated inputs
 *   parallel, blas       the thread pool; library calls (OpenBLAS) for dot_general
 *   async                collectives as a start and a wait step apart (off: one
 *                        synchronous step each)
 *   native               generated code (off: run on the interpreter)
 * Environment: NABLA_BACKEND (the default of nb_jit_opts.backend),
 * NABLA_CC (compiler command), NABLA_CACHE_DIR (disk cache),
 * NABLA_CACHE_MAX_MB (its size limit, nb_jit_cache_stat),
 * NABLA_THREADS, NABLA_DEBUG (1: summary, 2: per-kernel timings of the first
 * run, 3: fusion groups and source path, 4: the optimized graph), all logged
 * through the context's log callback at NB_LOG_INFO.
 */
#ifndef NABLA_COMPILE_H
#define NABLA_COMPILE_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

typedef struct nb_exe nb_exe;

/* All fields may be zero / NULL for the defaults. */
typedef struct nb_jit_opts {
  const char *disable;        /* switches turned off (see above), added to $NABLA_JIT_DISABLE */
  const char *const *donate;  /* NULL-terminated input paths or path prefixes ("params" selects
                                 params/...): outputs may be written into these inputs' buffers */
  int threads;                /* 0: $NABLA_THREADS or the number of CPUs. Kernels run on this
                                 many pool threads; a single large matmul runs on this many
                                 OpenBLAS threads, a batch of them on the pool with OpenBLAS on one
                                 thread per task. OpenBLAS's thread count is process-wide:
                                 it is set to 1 between calls */
  const char *cache_dir;      /* NULL: $NABLA_CACHE_DIR, ~/.cache/nabla/jit, or
                                 /tmp/nabla-jit-<uid> without $HOME (see nb_jit_cache_stat) */
  const char *cc;             /* NULL: $NABLA_CC or "cc -O3 -march=native -fno-math-errno -fopenmp-simd -fPIC -shared" */
  int debug;                  /* 0: the context's debug level */
  nb_device device;           /* only the CPU for now */
  const char *backend;        /* NULL: $NABLA_BACKEND or "cpu" (generated C, BLAS). "interp": the
                                 plan's steps run by the reference rules behind the backend
                                 interface, in memory kept apart from the host's (for tests of
                                 the compiler; slow). Unknown names are errors */
} nb_jit_opts;

/* Compiles g (borrowed; the executable keeps what it needs) for inputs with
 * g's avals. Returns an executable (destroy it with nb_exe_destroy), or NULL
 * with the error on ctx (bad options, a graph in error, out of memory). A
 * second nb_jit of an equal graph with equal options on the same context,
 * while the first executable is alive, returns the same executable (one
 * more reference); across processes the disk cache makes it compile
 * nothing. Bad switch names are errors. */
nb_exe *nb_jit(nb_ctx *ctx, const nb_graph *g, const nb_jit_opts *opts);

/* Same contract as nb_graph_run: `inputs` holds an array for every input
 * path (extra paths are ignored); outputs are set into `outputs` (new
 * references held by the tree). A donated input whose array is held only
 * once (refcount 1: by the input tree, or the caller in the flat form) may
 * have its memory overwritten and be returned as an output; with more
 * holders it is copied instead. Runs of one executable from several threads
 * are allowed (they take turns on the thread pool). */
nb_status nb_exe_run(nb_exe *e, const nb_tree *inputs, nb_tree *outputs);
/* Positional form: in[num_inputs] borrowed, out[num_outputs] new references. */
nb_status nb_exe_run_flat(nb_exe *e, nb_array *const *in, nb_array **out);
/* Releases one reference (NULL is allowed). */
void nb_exe_destroy(nb_exe *e);

/* Runs task(arg, i) for every i in [0, ntasks), in any order and on any
 * threads, and returns when all are done. Called from a kernel that an
 * executable runs as an evaluated step (a custom call), the tasks run on
 * that executable's thread pool (nb_jit_opts.threads); anywhere else, in
 * order on the calling thread. nb_jit_parallel_threads: the threads the
 * tasks may use (1 outside such a step). How a custom call's kernel uses
 * the threads of the executable it is compiled into. */
void nb_jit_parallel_for(int ntasks, void (*task)(void *arg, int i), void *arg);
int nb_jit_parallel_threads(void);

/* The disk cache of compiled programs. An entry is loaded only from a
 * private directory (owned by the user, not writable by group or others;
 * the directories above it not writable by others unless sticky) and only
 * after its checksum and, once loaded, its key check out; a bad entry is
 * removed and compiled again with a warning. When the directory is refused,
 * nb_jit compiles in a private temporary directory (removed at once) with a
 * warning. Entries are evicted least recently used first beyond
 * $NABLA_CACHE_MAX_MB megabytes (default 1024). */
typedef struct nb_jit_cache_info {
  char dir[1024];      /* the directory (resolved) */
  size_t entries;      /* compiled programs (a .so and its .c) */
  uint64_t bytes;
  uint64_t max_bytes;  /* the size limit */
  char problem[512];   /* why the directory is refused, or "" */
} nb_jit_cache_info;
/* cache_dir NULL: as nb_jit picks it. Fills *out (zeroed first); a missing
 * directory has no entries. */
nb_status nb_jit_cache_stat(nb_ctx *ctx, const char *cache_dir, nb_jit_cache_info *out);
/* Removes every entry and stale temporary file (not the directory, nor
 * files nabla did not write); *out says what was there. */
nb_status nb_jit_cache_clear(nb_ctx *ctx, const char *cache_dir, nb_jit_cache_info *out);

/* The BLAS dot_general runs on, as text ("OpenBLAS Cooperlake (it picked
 * Prescott for this CPU)"). The first call (or the first matmul) checks the
 * kernels OpenBLAS chose at load time: when they use less of the vector ISA
 * than the CPU has (an OpenBLAS older than the CPU model falls back to SSE3
 * kernels), OpenBLAS's selection is re-run for the best core it knows for
 * the ISA. $OPENBLAS_CORETYPE set, or $NABLA_BLAS_CORETYPE=keep, leaves
 * OpenBLAS's choice alone; $NABLA_BLAS_CORETYPE=NAME forces one. Unless
 * $OPENBLAS_THREAD_TIMEOUT is set, OpenBLAS's idle threads are also told to
 * sleep at once instead of spinning (after a threaded call of the program's
 * own they took the cores from nabla's pool; nabla itself calls OpenBLAS on
 * one thread). Both are process-wide: call this before other
 * threads of the program use OpenBLAS, and before calling cblas directly to
 * get the same kernels. */
const char *nb_jit_blas_core(void);

typedef struct nb_exe_stats {
  size_t peak_bytes;       /* estimate: arena + outputs not written into donated inputs */
  size_t arena_bytes;      /* intermediates after liveness-based reuse */
  size_t output_bytes;
  size_t nsteps, nkernels, neval, nblas;
  bool native;             /* false: the whole graph runs on the interpreter (no compiled plan) */
  bool from_disk_cache;    /* the shared object existed: nothing was compiled */
  const char *backend;     /* the backend's name ("cpu", "interp"); static storage */
  double compile_ms;       /* nb_jit wall time of the first compile */
  uint64_t runs;
} nb_exe_stats;
void nb_exe_get_stats(const nb_exe *e, nb_exe_stats *out);

typedef enum nb_exe_step_kind {
  NB_EXE_STEP_KERNEL, /* a generated loop kernel */
  NB_EXE_STEP_EVAL,   /* one equation through its reference implementation */
  NB_EXE_STEP_BLAS,   /* dot_general as one library call of the backend (cpu: cblas_?gemm) */
  NB_EXE_STEP_CONTROL, /* cond, while_loop or scan: its bodies compiled as executables of their own,
                          run as a loop (buffers planned once) or as the taken branch */
  NB_EXE_STEP_START,  /* a collective started (psum, all_gather, psum_scatter over a communicator that can) */
  NB_EXE_STEP_WAIT,   /* ... and waited for, before its first reader: the steps between overlap it */
  NB_EXE_STEP_KIND_COUNT
} nb_exe_step_kind;

typedef struct nb_exe_step_info {
  nb_exe_step_kind kind;
  const char *name;       /* "k3" or the primitive's name; valid while e is alive */
  size_t neqns;           /* equations of the optimized graph the step computes */
  double flops, bytes;    /* model cost of one run (bytes read + written) */
  double last_ms, total_ms;
} nb_exe_step_info;
size_t nb_exe_num_steps(const nb_exe *e);
nb_status nb_exe_step(const nb_exe *e, size_t i, nb_exe_step_info *out);

/* The i-th compiled body of CONTROL step `step` (cond: branch i; while_loop:
 * 0 the predicate, 1 the body; scan: 0 the body), an executable of its own
 * whose steps (nb_exe_step) say what one iteration runs and, summed over the
 * iterations of the last run, how long it took; NULL for other steps or i out
 * of range. Borrowed: valid while e is alive. */
const nb_exe *nb_exe_step_body(const nb_exe *e, size_t step, size_t i);

/* The buffer plan, for profilers (the memory and graph viewers of library
 * prof): what memory each value of the optimized graph (nb_exe_graph; ids
 * 0 .. nb_exe_num_values - 1) has over the schedule of steps. */
typedef enum nb_exe_buffer_kind {
  NB_EXE_BUF_NONE,   /* no memory: computed inside a fused kernel, or unused */
  NB_EXE_BUF_INPUT,  /* the caller's array */
  NB_EXE_BUF_CONST,  /* a constant the executable holds */
  NB_EXE_BUF_TEMP,   /* an intermediate in the executable's arena */
  NB_EXE_BUF_OUTPUT, /* an output array, allocated before the first step */
  NB_EXE_BUF_KIND_COUNT
} nb_exe_buffer_kind;

typedef struct nb_exe_buffer_info {
  nb_exe_buffer_kind kind;
  const nb_val *value; /* the value (borrowed, valid while e is alive) */
  int index;           /* INPUT: the input's index; OUTPUT: the first output index it is */
  size_t offset;       /* TEMP: offset in the arena */
  size_t nbytes;
  int def_step;        /* the step that writes it (-1: none, an input or constant) */
  int last_step;       /* the last step that reads it; an output: nb_exe_num_steps */
  int donor;           /* OUTPUT: the donated input whose memory it takes when it may, or -1 */
  int shares;          /* TEMP: the value whose memory it lives in (an in-place update of it, or a
                          view: a reshape or contiguous slice of it), or -1 */
} nb_exe_buffer_info;
size_t nb_exe_num_values(const nb_exe *e);
/* Errors: NB_ERR_INVALID_ARG for an id out of range (named). */
nb_status nb_exe_buffer(const nb_exe *e, size_t value_id, nb_exe_buffer_info *out);

/* The values step i reads and writes (a kernel's arguments, an equation's
 * operands and results), in order. Writes up to cap of them into out and
 * returns how many there are (0 for i out of range). */
typedef struct nb_exe_operand {
  uint32_t value; /* value id */
  bool written;
} nb_exe_operand;
size_t nb_exe_step_operands(const nb_exe *e, size_t i, nb_exe_operand *out, size_t cap);
/* Step i's source primitives, "+"-joined ("add+mul+reduce_sum"), and where
 * its first (materialized) equation was traced (file NULL when unknown);
 * pointers valid while e is alive. NULL for i out of range. */
const char *nb_exe_step_ops(const nb_exe *e, size_t i, nb_loc *loc);

/* The generated C source file, or NULL (interpreter fallback); valid while
 * e is alive. */
const char *nb_exe_source_path(const nb_exe *e);
/* The optimized graph (borrowed, valid while e is alive). */
const nb_graph *nb_exe_graph(const nb_exe *e);
/* Prints the optimized graph, the fusion groups, the source path and the
 * per-step statistics of the last run. */
void nb_exe_print(const nb_exe *e, FILE *f);

NB_END_DECLS
#endif /* NABLA_COMPILE_H */
