/* The CUDA backend's own header, private to src/backend/cuda/ (and its
 * tests). Built only with the CUDA toolkit's headers (NABLA_HAVE_CUDA); the
 * driver (libcuda.so.1), NVRTC and cuBLASLt are loaded with dlopen at the
 * backend's first use (loader.c), so libnabla runs where they are absent. */
#ifndef NABLA_BACKEND_CUDA_H
#define NABLA_BACKEND_CUDA_H

#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>

#include "compile/jit.h"

/* cuda.c: the backend (backend/backend.h) */
extern const struct nb_backend nb_cuda__backend;

/* loader.c: the entry points we call, resolved by dlsym. */
typedef struct nb_cuda_api {
  /* driver */
  __typeof__(cuInit) *Init;
  __typeof__(cuGetErrorString) *GetErrorString;
  __typeof__(cuDeviceGetCount) *DeviceGetCount;
  __typeof__(cuDeviceGet) *DeviceGet;
  __typeof__(cuDeviceGetName) *DeviceGetName;
  __typeof__(cuDeviceGetAttribute) *DeviceGetAttribute;
  __typeof__(cuDevicePrimaryCtxRetain) *DevicePrimaryCtxRetain;
  __typeof__(cuCtxSetCurrent) *CtxSetCurrent;
  __typeof__(cuStreamCreate) *StreamCreate;
  __typeof__(cuStreamSynchronize) *StreamSynchronize;
  __typeof__(cuMemAlloc) *MemAlloc;
  __typeof__(cuMemFree) *MemFree;
  __typeof__(cuMemcpyHtoDAsync) *MemcpyHtoDAsync;
  __typeof__(cuMemcpyDtoHAsync) *MemcpyDtoHAsync;
  __typeof__(cuMemcpyDtoDAsync) *MemcpyDtoDAsync;
  __typeof__(cuMemsetD8Async) *MemsetD8Async;
  __typeof__(cuModuleLoadData) *ModuleLoadData;
  __typeof__(cuModuleUnload) *ModuleUnload;
  __typeof__(cuModuleGetFunction) *ModuleGetFunction;
  __typeof__(cuLaunchKernel) *LaunchKernel;
  /* NVRTC */
  __typeof__(nvrtcVersion) *rtcVersion;
  __typeof__(nvrtcGetErrorString) *rtcGetErrorString;
  __typeof__(nvrtcCreateProgram) *rtcCreateProgram;
  __typeof__(nvrtcCompileProgram) *rtcCompileProgram;
  __typeof__(nvrtcGetProgramLogSize) *rtcGetProgramLogSize;
  __typeof__(nvrtcGetProgramLog) *rtcGetProgramLog;
  __typeof__(nvrtcGetCUBINSize) *rtcGetCUBINSize;
  __typeof__(nvrtcGetCUBIN) *rtcGetCUBIN;
  __typeof__(nvrtcDestroyProgram) *rtcDestroyProgram;
  /* cuBLASLt */
  __typeof__(cublasLtCreate) *ltCreate;
  __typeof__(cublasLtMatmulDescCreate) *ltMatmulDescCreate;
  __typeof__(cublasLtMatmulDescDestroy) *ltMatmulDescDestroy;
  __typeof__(cublasLtMatmulDescSetAttribute) *ltMatmulDescSetAttribute;
  __typeof__(cublasLtMatrixLayoutCreate) *ltMatrixLayoutCreate;
  __typeof__(cublasLtMatrixLayoutDestroy) *ltMatrixLayoutDestroy;
  __typeof__(cublasLtMatrixLayoutSetAttribute) *ltMatrixLayoutSetAttribute;
  __typeof__(cublasLtMatmulPreferenceCreate) *ltMatmulPreferenceCreate;
  __typeof__(cublasLtMatmulPreferenceDestroy) *ltMatmulPreferenceDestroy;
  __typeof__(cublasLtMatmulPreferenceSetAttribute) *ltMatmulPreferenceSetAttribute;
  __typeof__(cublasLtMatmulAlgoGetHeuristic) *ltMatmulAlgoGetHeuristic;
  __typeof__(cublasLtMatmul) *ltMatmul;
} nb_cuda_api;

/* NVRTC alone (no driver needed): its entry points, or NULL with the reason
 * in why. Loaded once. */
const nb_cuda_api *nb_cuda__nvrtc(char *why, size_t cap);
/* Everything: the driver, NVRTC and cuBLASLt, or NULL with the reason. */
const nb_cuda_api *nb_cuda__load(char *why, size_t cap);

/* codegen_cu.c: CUDA C for the plan's kernels; kernel i is
 * extern "C" __global__ nbk_<alias[i]>(one pointer per argument), launched
 * as blocks[i] blocks of nb_cuda__block_size() threads. alias[i]: the
 * kernel whose function kernel i runs (an identical body is emitted once). */
nb_status nb_cuda__codegen(nb_ctx *ctx, const nb_jplan *plan, nb_jit_text *out, int *alias, int64_t *blocks);
int nb_cuda__block_size(void); /* threads per block of every kernel */
/* The CUDA C of codegen compiled by NVRTC into a cubin for sm_<arch>
 * (malloc'ed into *bin), or an error on ctx with NVRTC's log. Cached in
 * memory by the source's content hash and the arch. */
nb_status nb_cuda__nvrtc_compile(nb_ctx *ctx, const char *src, size_t len, int arch, char **bin, size_t *bin_len,
                                 bool *from_cache);

/* gemm.c: dot_general through cuBLASLt (f32 and f64 operands with a layout
 * a strided batched GEMM takes as it is). */
bool nb_cuda__gemm_supported(const nb_eqn *e);
nb_status nb_cuda__gemm_run(nb_ctx *ctx, const nb_cuda_api *api, cublasLtHandle_t lt, CUstream stream, void *workspace,
                            size_t workspace_bytes, const nb_eqn *e, const void *lhs, const void *rhs, void *out);

/* walk.c: gather and scatter_add through kernels of their own (library
 * steps, like the GEMMs), where their dtypes and geometry allow. */
bool nb_cuda__walk_supported(const nb_eqn *e);
/* Their kernels' cubin for sm_<arch> (malloc'ed), or an error. */
nb_status nb_cuda__walk_compile(nb_ctx *ctx, int arch, char **bin, size_t *bin_len);
nb_status nb_cuda__walk_run(nb_ctx *ctx, const nb_cuda_api *api, CUstream stream, int arch, const nb_eqn *e, char *const *args);

#endif
