/* The CPU backend's own header, private to src/backend/cpu/ (and its tests):
 * C code generation from the plan's kernel IR, building and loading the
 * generated C through the system C compiler and the disk cache, GEMMs
 * through cblas, and the thread pool that kernels and GEMM tiles run on. */
#ifndef NABLA_BACKEND_CPU_H
#define NABLA_BACKEND_CPU_H

#include "compile/jit.h"

/* cpu.c: the backend (backend/backend.h) */
extern const struct nb_backend nb_cpu__backend;

typedef void (*nb_kernel_fn)(int64_t lo, int64_t hi, char *const *bufs);

/* codegen_c.c: C source for every kernel of the plan (kernel i is the
 * function nbk_<i>(int64_t lo, int64_t hi, char *const *bufs) iterating
 * the flattened outer indices [lo, hi)). */
nb_status nb_cpu__codegen_c(nb_ctx *ctx, const nb_jplan *plan, nb_jit_text *out);

/* cc.c: builds (or finds in the disk cache) the shared object
 * for `src` and loads it. Returns the dlopen handle or NULL with a reason in
 * why (not an error on ctx: the caller falls back). */
void *nb_cpu__load(nb_ctx *ctx, const nb_jit_config *cfg, const char *src, size_t len, char *src_path, size_t path_cap,
                   bool *from_cache, char *why, size_t whycap);
void nb_cpu__unload(void *handle);
/* Appends the disk cache's seal for key to the object file at path (what
 * nb_cpu__load checks before loading an entry). */
bool nb_cpu__seal(const char *path, uint64_t key);
/* What cfg's cache directory holds (and with clear, removes it). */
nb_status nb_cpu__cache_usage(nb_ctx *ctx, const nb_jit_config *cfg, bool clear, nb_jit_cache_info *out);
void *nb_cpu__sym(void *handle, const char *name);

/* blas.c: dot_general through cblas when the layout allows. */
typedef struct nb_pool nb_pool;
bool nb_cpu__blas_supported(const nb_eqn *e);
/* Runs e on the buffers: batch items and tiles of each item's result, cut
 * by the shape alone (bit-identical at any thread count), on the pool with
 * OpenBLAS on one thread, so the two never oversubscribe the cores. NOMEM (+ error)
 * when the packing scratch cannot be allocated. */
nb_status nb_cpu__blas_run(nb_ctx *ctx, nb_pool *pool, const nb_eqn *e, const void *lhs, const void *rhs, void *out);

/* pool.c: a persistent thread pool shared by executables. */
nb_pool *nb_cpu__pool_get(int threads); /* a reference to the shared pool of that size; NULL on failure */
void nb_cpu__pool_put(nb_pool *p);
/* Runs fn(arg, t) for t in [0, ntasks) on the pool and the calling thread;
 * returns when all are done. */
void nb_cpu__pool_run(nb_pool *p, int ntasks, void (*fn)(void *arg, int task), void *arg);
int nb_cpu__pool_threads(const nb_pool *p);
int nb_cpu__pool_participants(nb_pool *p); /* workers taking part now (fewer while it backs off) */

#endif
