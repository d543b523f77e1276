/* The backend interface: what the compiler and the runtime need from a
 * target, and nothing about how it does it. The plan (compile/jit.h: the
 * kernel IR, the steps, the buffers) is backend-neutral; a backend turns its
 * kernels into code and runs its steps on memory it owns. The fusion pass
 * asks the backend which contractions it runs as library calls; nb_jit asks
 * it to compile the plan into a module; the runtime (runtime/exe.c) binds
 * buffers in the backend's memory and runs the step list through it. Nothing
 * outside src/backend/<name>/ calls a backend's functions directly.
 *
 * Backends: "cpu" (backend/cpu: C from the kernel IR built by the system C
 * compiler, cblas GEMMs, the thread pool) and "interp" (backend/interp: the
 * reference rules behind the same interface, with device memory apart from
 * host memory, so that the tests run the seam without the CPU's shortcuts)
 * and, when built with the CUDA toolkit's headers, "cuda" (backend/cuda:
 * CUDA C through NVRTC, cuBLASLt, device memory; docs/compiler.md,
 * "Backends"). */
#ifndef NABLA_BACKEND_H
#define NABLA_BACKEND_H

#include "compile/jit.h"

/* A plan's compiled code and whatever the backend keeps to run it (the CPU
 * backend: the loaded shared object, its kernel functions, the thread pool).
 * Lives as long as the executable; the plan it was compiled from outlives it. */
typedef struct nb_backend_module nb_backend_module;

/* What compiling did, for the executable's statistics and debug output. */
typedef struct nb_backend_build {
  bool from_cache;        /* nothing was compiled: the code came from a cache */
  char source[1200];      /* the generated source's path, or "" */
  double codegen_ms;      /* generating the code */
  double build_ms;        /* compiling (or finding in a cache) and loading it */
} nb_backend_build;

typedef struct nb_backend {
  const char *name;
  /* Device memory is host memory: the runtime binds the host arrays of
   * inputs, constants and outputs in place (and outputs may take donated
   * inputs). Otherwise it copies inputs and constants in and outputs out
   * around every run, and stages the operands of reference steps. */
  bool host_memory;

  /* ---- memory. alloc: bytes of device memory, NULL + error on ctx. */
  void *(*alloc)(nb_ctx *ctx, size_t bytes);
  void (*free)(nb_ctx *ctx, void *p, size_t bytes);
  nb_status (*to_device)(nb_ctx *ctx, void *dst, const void *src, size_t bytes);
  /* Returns when the bytes are on the host; the runtime calls synchronize
   * first when a step it launched writes them (a loop's predicate). */
  nb_status (*to_host)(nb_ctx *ctx, void *dst, const void *src, size_t bytes);
  /* Device to device: bytes from src to dst, which are equal (nothing to
   * do) or disjoint. Both are device addresses, a buffer's plus an offset
   * (a scan's slice), as every pointer the runtime hands a backend; the
   * runtime never dereferences one. Ordered with the steps launched on ctx
   * before and after it, as a launch is (a GPU queues it on the stream): it
   * need not have finished when it returns. The runtime moves a loop's
   * carry and a body's passed-through outputs with it. */
  nb_status (*copy)(nb_ctx *ctx, void *dst, const void *src, size_t bytes);

  /* ---- planning. Can e (an equation the kernel IR does not express: a
   * contraction, a gather) run as one library call (a GEMM, a routine of the
   * backend's own)? Asked by the fusion pass (fuse.c) for every such
   * equation; a yes makes it an NB_EXE_STEP_BLAS step that `library` runs,
   * a no an evaluated step (its reference rule, on the host). */
  bool (*library_supported)(const nb_eqn *e);

  /* ---- compiling. Turns the plan's kernels into a module. *out NULL with
   * NB_OK: no code could be made (a reason was logged); the executable then
   * runs the graph on the interpreter. An error status is a real error. */
  nb_status (*compile)(nb_ctx *ctx, const nb_jit_config *cfg, const nb_jplan *plan, nb_backend_module **out,
                       nb_backend_build *build);
  void (*release)(nb_backend_module *m); /* NULL is allowed */

  /* ---- running. args: the device pointers of plan->kernels[kernel].args,
   * in order. */
  nb_status (*launch)(nb_ctx *ctx, nb_backend_module *m, int kernel, char *const *args);
  /* args: the device pointers of e's inputs, then of its outputs. */
  nb_status (*library)(nb_ctx *ctx, nb_backend_module *m, const nb_eqn *e, char *const *args);
  /* Runs task(arg, i) for every i in [0, ntasks) on the module's host
   * threads and returns when all are done: lent to an evaluated step (a
   * custom call's kernel) through nb_jit_parallel_for. NULL: the runtime
   * runs them in order on the calling thread. threads: how many. */
  void (*parallel)(nb_backend_module *m, int ntasks, void (*task)(void *arg, int i), void *arg);
  int (*threads)(const nb_backend_module *m);
  /* Returns when every step and copy launched on ctx has finished, through
   * any module (a loop's bodies are modules of their own; a GPU keeps one
   * stream per context), a no-op for synchronous backends. The runtime calls
   * it before copying outputs out and before reading a cond's index or a
   * while loop's predicate with to_host. */
  nb_status (*synchronize)(nb_ctx *ctx, nb_backend_module *m);

  /* ---- the disk cache of compiled code, NULL when the backend keeps none:
   * what cfg's cache directory holds (zeroed first by the caller) and, with
   * clear, removes it (nb_jit_cache_stat, nb_jit_cache_clear). */
  nb_status (*cache_usage)(nb_ctx *ctx, const nb_jit_config *cfg, bool clear, nb_jit_cache_info *out);
} nb_backend;

/* The backend called name, or NULL. */
const nb_backend *nb_backend__find(const char *name);
/* The known names, comma separated (for error messages). */
const char *nb_backend__names(void);

#endif
