/* The CUDA backend behind backend/backend.h: device memory from cuMemAlloc
 * (plain allocations), the plan's kernels as CUDA C (codegen_cu.c) compiled
 * by NVRTC for the device's compute capability and loaded as a module,
 * contractions through cuBLASLt (gemm.c), gather and scatter_add through
 * kernels of their own (walk.c). Everything is queued on one stream
 * of the device's primary context, in the order the runtime calls (copies,
 * launches, GEMMs); to_host and synchronize wait for it. One device (the
 * first) and one stream per process for now: every nb_ctx shares them, so
 * work from two threads is serialized on the device. The libraries are
 * loaded on first use (loader.c); without a driver or a device every entry
 * point fails with the reason, and nb_jit with it. */
#ifdef NABLA_HAVE_CUDA
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "util/util.h"

#define WORKSPACE_BYTES (32u << 20) /* cuBLASLt's workspace: what its Hopper kernels ask for */

static struct {
  const nb_cuda_api *api;
  CUdevice dev;
  CUcontext cuctx;
  CUstream stream;
  int arch; /* compute capability, major * 10 + minor */
  cublasLtHandle_t lt;
  CUdeviceptr workspace;
  bool poison; /* $NABLA_CUDA_POISON: new allocations filled with 0xff bytes (NaN), so tests see unwritten outputs */
  bool ok;
  char why[600];
} dev;

static _Thread_local bool ctx_current; /* the primary context is this thread's */

static bool cu_ok(CUresult r, const char *what, char *why, size_t cap) {
  if (r == CUDA_SUCCESS) return true;
  const char *s = NULL;
  if (dev.api && dev.api->GetErrorString) dev.api->GetErrorString(r, &s);
  snprintf(why, cap, "cuda: %s failed: %s (%d)", what, s ? s : "unknown error", (int)r);
  return false;
}

static void init_device(void) {
  const nb_cuda_api *a = nb_cuda__load(dev.why, sizeof dev.why);
  if (!a) return;
  dev.api = a;
  int n = 0, major = 0, minor = 0;
  CUresult r = a->Init(0);
  if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && a->DeviceGetCount(&n) == CUDA_SUCCESS && n == 0)) {
    snprintf(dev.why, sizeof dev.why, "cuda: no device (the CUDA driver found no GPU)");
    return;
  }
  if (!cu_ok(r, "cuInit", dev.why, sizeof dev.why) || !cu_ok(a->DeviceGet(&dev.dev, 0), "cuDeviceGet", dev.why, sizeof dev.why) ||
      !cu_ok(a->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev.dev), "cuDeviceGetAttribute", dev.why,
             sizeof dev.why) ||
      !cu_ok(a->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev.dev), "cuDeviceGetAttribute", dev.why,
             sizeof dev.why) ||
      !cu_ok(a->DevicePrimaryCtxRetain(&dev.cuctx, dev.dev), "cuDevicePrimaryCtxRetain", dev.why, sizeof dev.why) ||
      !cu_ok(a->CtxSetCurrent(dev.cuctx), "cuCtxSetCurrent", dev.why, sizeof dev.why) ||
      !cu_ok(a->StreamCreate(&dev.stream, CU_STREAM_DEFAULT), "cuStreamCreate", dev.why, sizeof dev.why) ||
      !cu_ok(a->MemAlloc(&dev.workspace, WORKSPACE_BYTES), "cuMemAlloc (cuBLASLt workspace)", dev.why, sizeof dev.why))
    return;
  cublasStatus_t s = a->ltCreate(&dev.lt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    snprintf(dev.why, sizeof dev.why, "cuda: cublasLtCreate failed (status %d)", (int)s);
    return;
  }
  dev.arch = major * 10 + minor;
  const char *poison = getenv("NABLA_CUDA_POISON");
  dev.poison = poison && *poison && strcmp(poison, "0") != 0;
  ctx_current = true;
  dev.ok = true;
}

/* The device, ready on this thread, or false with the reason on ctx. */
static bool enter(nb_ctx *ctx) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_device);
  if (!dev.ok) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s", dev.why), false;
  if (!ctx_current) {
    char why[300];
    if (!cu_ok(dev.api->CtxSetCurrent(dev.cuctx), "cuCtxSetCurrent", why, sizeof why))
      return nb_errorf(ctx, NB_ERR_IO, "%s", why), false;
    ctx_current = true;
  }
  return true;
}

static nb_status check(nb_ctx *ctx, CUresult r, const char *what) {
  char why[300];
  return cu_ok(r, what, why, sizeof why) ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "%s", why);
}

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* ---------------------------------------------------------------- memory */

static void *cuda_alloc(nb_ctx *ctx, size_t bytes) {
  if (!enter(ctx)) return NULL;
  CUdeviceptr p = 0;
  CUresult r = dev.api->MemAlloc(&p, bytes ? bytes : 1);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of device memory for %zu bytes", bytes), NULL;
  if (check(ctx, r, "cuMemAlloc") != NB_OK) return NULL;
  if (dev.poison && bytes && check(ctx, dev.api->MemsetD8Async(p, 0xff, bytes, dev.stream), "cuMemsetD8Async") != NB_OK) {
    dev.api->MemFree(p);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void cuda_free(nb_ctx *ctx, void *p, size_t bytes) {
  (void)bytes;
  if (!p || !enter(ctx)) return;
  /* work queued on the stream may still use it */
  if (check(ctx, dev.api->StreamSynchronize(dev.stream), "cuStreamSynchronize") == NB_OK)
    check(ctx, dev.api->MemFree(dptr(p)), "cuMemFree");
}

static nb_status cuda_to_device(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (!bytes) return NB_OK;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  /* from pageable memory the call returns once src is staged: the caller may reuse it */
  return check(ctx, dev.api->MemcpyHtoDAsync(dptr(dst), src, bytes, dev.stream), "cuMemcpyHtoDAsync");
}

static nb_status cuda_to_host(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (!bytes) return NB_OK;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  nb_status st = check(ctx, dev.api->MemcpyDtoHAsync(dst, dptr(src), bytes, dev.stream), "cuMemcpyDtoHAsync");
  return st ? st : check(ctx, dev.api->StreamSynchronize(dev.stream), "cuStreamSynchronize");
}

static nb_status cuda_copy(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return NB_OK;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  return check(ctx, dev.api->MemcpyDtoDAsync(dptr(dst), dptr(src), bytes, dev.stream), "cuMemcpyDtoDAsync");
}

/* ---------------------------------------------------------------- compiling */

struct nb_backend_module {
  const nb_jplan *plan;
  CUmodule mod;      /* 0 when the plan has no kernels */
  CUfunction *fns;   /* per kernel */
  int64_t *blocks;   /* per kernel: the launch's grid */
};

static void cuda_release(nb_backend_module *m) {
  if (!m) return;
  if (m->mod && dev.ok && dev.api->CtxSetCurrent(dev.cuctx) == CUDA_SUCCESS) { /* release has no nb_ctx: this thread's context set here */
    ctx_current = true;
    dev.api->StreamSynchronize(dev.stream);
    dev.api->ModuleUnload(m->mod);
  }
  free(m->fns);
  free(m->blocks);
  free(m);
}

static nb_status load_kernels(nb_ctx *ctx, const nb_jplan *plan, nb_backend_module *m, nb_backend_build *b) {
  int nk = plan->nkernels;
  nb_jit_text src = {ctx, NULL, 0, 0, false};
  int *alias = calloc((size_t)nk, sizeof *alias);
  m->fns = calloc((size_t)nk, sizeof *m->fns);
  m->blocks = calloc((size_t)nk, sizeof *m->blocks);
  if (!alias || !m->fns || !m->blocks) return free(alias), nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
  double t0 = nb_util__now_ms();
  nb_status st = nb_cuda__codegen(ctx, plan, &src, alias, m->blocks);
  b->codegen_ms = nb_util__now_ms() - t0;
  t0 = nb_util__now_ms();
  char *bin = NULL;
  size_t bin_len = 0;
  if (st == NB_OK) st = nb_cuda__nvrtc_compile(ctx, src.s, src.n, dev.arch, &bin, &bin_len, &b->from_cache);
  if (st == NB_OK) st = check(ctx, dev.api->ModuleLoadData(&m->mod, bin), "cuModuleLoadData");
  for (int k = 0; k < nk && st == NB_OK; k++) {
    if (alias[k] != k) {
      m->fns[k] = m->fns[alias[k]];
      continue;
    }
    char name[32];
    snprintf(name, sizeof name, "nbk_%d", k);
    st = check(ctx, dev.api->ModuleGetFunction(&m->fns[k], m->mod, name), "cuModuleGetFunction");
  }
  b->build_ms = nb_util__now_ms() - t0;
  free(bin);
  free(alias);
  nb_jit__text_free(&src);
  return st;
}

static nb_status cuda_compile(nb_ctx *ctx, const nb_jit_config *cfg, const nb_jplan *plan, nb_backend_module **out,
                              nb_backend_build *b) {
  (void)cfg;
  *out = NULL;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  nb_backend_module *m = calloc(1, sizeof *m);
  if (!m) return nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
  m->plan = plan;
  nb_status st = plan->nkernels ? load_kernels(ctx, plan, m, b) : NB_OK;
  if (st != NB_OK) {
    cuda_release(m);
    return st;
  }
  *out = m;
  return NB_OK;
}

/* ---------------------------------------------------------------- running */

static nb_status cuda_launch(nb_ctx *ctx, nb_backend_module *m, int kernel, char *const *args) {
  const nb_kernel *k = &m->plan->kernels[kernel];
  int64_t block = nb_cuda__block_size(), grid = m->blocks[kernel];
  if (grid == 0) return NB_OK; /* no points */
  if (!enter(ctx)) return nb_ctx_status(ctx);
  if (grid > INT32_MAX) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "cuda: kernel %d needs %lld blocks, more than one launch takes", kernel, (long long)grid);
  void *params[2 * NB_MAX_RANK + 64];
  void **p = k->nargs <= (int)(sizeof params / sizeof params[0]) ? params : malloc(sizeof(void *) * (size_t)k->nargs);
  if (!p) return nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
  for (int a = 0; a < k->nargs; a++) p[a] = (void *)&args[a];
  nb_status st = check(ctx, dev.api->LaunchKernel(m->fns[kernel], (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, dev.stream, p, NULL),
                       "cuLaunchKernel");
  if (p != params) free(p);
  return st;
}

/* the fusion pass asks for every equation the kernel IR does not express */
static bool cuda_library_supported(const nb_eqn *e) { return nb_cuda__gemm_supported(e) || nb_cuda__walk_supported(e); }

static nb_status cuda_library(nb_ctx *ctx, nb_backend_module *m, const nb_eqn *e, char *const *args) {
  (void)m;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  if (e->prim == NB_PRIM_gather || e->prim == NB_PRIM_scatter_add) return nb_cuda__walk_run(ctx, dev.api, dev.stream, dev.arch, e, args);
  return nb_cuda__gemm_run(ctx, dev.api, dev.lt, dev.stream, (void *)(uintptr_t)dev.workspace, WORKSPACE_BYTES, e, args[0], args[1],
                           args[2]);
}

static nb_status cuda_synchronize(nb_ctx *ctx, nb_backend_module *m) {
  (void)m;
  if (!enter(ctx)) return nb_ctx_status(ctx);
  return check(ctx, dev.api->StreamSynchronize(dev.stream), "cuStreamSynchronize");
}

const nb_backend nb_cuda__backend = {
    .name = "cuda",
    .host_memory = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .library_supported = cuda_library_supported,
    .compile = cuda_compile,
    .release = cuda_release,
    .launch = cuda_launch,
    .library = cuda_library,
    .synchronize = cuda_synchronize,
};
#endif
