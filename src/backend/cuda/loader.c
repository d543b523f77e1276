/* The CUDA libraries, loaded with dlopen at the backend's first use so that
 * libnabla has no link-time (or load-time) dependency on a GPU stack: the
 * driver API from libcuda.so.1 (installed with the NVIDIA driver), NVRTC and
 * cuBLASLt from the toolkit (found by the loader's search path, then under
 * $CUDA_HOME, $CUDA_PATH and /usr/local/cuda). Versioned driver entry
 * points are looked up by their _v2 names, which cuda.h's macros give the
 * unversioned ones. */
#ifdef NABLA_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"

static nb_cuda_api api;
static char nvrtc_why[512], all_why[512];
static bool nvrtc_ok, all_ok;

/* dlopen of the first name that loads, tried bare (the loader's path) and
 * under the toolkit's folders. */
static void *open_lib(const char *const *names, char *tried, size_t cap) {
  const char *dirs[] = {"", getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  static const char *const sub[] = {"lib64", "lib"};
  for (const char *const *n = names; *n; n++)
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
      if (!dirs[d]) continue;
      for (size_t s = 0; s < (d ? 2u : 1u); s++) {
        char path[1024];
        if (d) snprintf(path, sizeof path, "%s/%s/%s", dirs[d], sub[s], *n);
        else snprintf(path, sizeof path, "%s", *n);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
      }
    }
  snprintf(tried, cap, "%s", names[0]);
  return NULL;
}

#define SYM(lib, field, name)                                                                 \
  do {                                                                                        \
    void *s_ = dlsym(lib, name);                                                              \
    if (!s_) return snprintf(why, cap, "cuda: %s has no %s", #lib, name), false;             \
    memcpy(&api.field, &s_, sizeof s_);                                                       \
  } while (0)

static bool load_nvrtc(char *why, size_t cap) {
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
  char tried[64];
  void *nvrtc = open_lib(names, tried, sizeof tried);
  if (!nvrtc) return snprintf(why, cap, "cuda: no NVRTC (%s not found)", tried), false;
  SYM(nvrtc, rtcVersion, "nvrtcVersion");
  SYM(nvrtc, rtcGetErrorString, "nvrtcGetErrorString");
  SYM(nvrtc, rtcCreateProgram, "nvrtcCreateProgram");
  SYM(nvrtc, rtcCompileProgram, "nvrtcCompileProgram");
  SYM(nvrtc, rtcGetProgramLogSize, "nvrtcGetProgramLogSize");
  SYM(nvrtc, rtcGetProgramLog, "nvrtcGetProgramLog");
  SYM(nvrtc, rtcGetCUBINSize, "nvrtcGetCUBINSize");
  SYM(nvrtc, rtcGetCUBIN, "nvrtcGetCUBIN");
  SYM(nvrtc, rtcDestroyProgram, "nvrtcDestroyProgram");
  return true;
}

static bool load_driver_and_blas(char *why, size_t cap) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) return snprintf(why, cap, "cuda: no CUDA driver (libcuda.so.1 not found)"), false;
  SYM(cuda, Init, "cuInit");
  SYM(cuda, GetErrorString, "cuGetErrorString");
  SYM(cuda, DeviceGetCount, "cuDeviceGetCount");
  SYM(cuda, DeviceGet, "cuDeviceGet");
  SYM(cuda, DeviceGetName, "cuDeviceGetName");
  SYM(cuda, DeviceGetAttribute, "cuDeviceGetAttribute");
  SYM(cuda, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuda, CtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuda, StreamCreate, "cuStreamCreate");
  SYM(cuda, StreamSynchronize, "cuStreamSynchronize");
  SYM(cuda, MemAlloc, "cuMemAlloc_v2");
  SYM(cuda, MemFree, "cuMemFree_v2");
  SYM(cuda, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  SYM(cuda, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  SYM(cuda, MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  SYM(cuda, MemsetD8Async, "cuMemsetD8Async");
  SYM(cuda, ModuleLoadData, "cuModuleLoadData");
  SYM(cuda, ModuleUnload, "cuModuleUnload");
  SYM(cuda, ModuleGetFunction, "cuModuleGetFunction");
  SYM(cuda, LaunchKernel, "cuLaunchKernel");
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so", NULL};
  char tried[64];
  void *lt = open_lib(names, tried, sizeof tried);
  if (!lt) return snprintf(why, cap, "cuda: no cuBLASLt (%s not found)", tried), false;
  SYM(lt, ltCreate, "cublasLtCreate");
  SYM(lt, ltMatmulDescCreate, "cublasLtMatmulDescCreate");
  SYM(lt, ltMatmulDescDestroy, "cublasLtMatmulDescDestroy");
  SYM(lt, ltMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  SYM(lt, ltMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  SYM(lt, ltMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  SYM(lt, ltMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  SYM(lt, ltMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  SYM(lt, ltMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  SYM(lt, ltMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  SYM(lt, ltMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  SYM(lt, ltMatmul, "cublasLtMatmul");
  return true;
}

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static void init_nvrtc(void) { nvrtc_ok = load_nvrtc(nvrtc_why, sizeof nvrtc_why); }

static void init_all(void) {
  pthread_once(&nvrtc_once, init_nvrtc);
  all_ok = load_driver_and_blas(all_why, sizeof all_why);
  if (all_ok && !nvrtc_ok) all_ok = false, snprintf(all_why, sizeof all_why, "%s", nvrtc_why);
}

const nb_cuda_api *nb_cuda__nvrtc(char *why, size_t cap) {
  pthread_once(&nvrtc_once, init_nvrtc);
  if (!nvrtc_ok) snprintf(why, cap, "%s", nvrtc_why);
  return nvrtc_ok ? &api : NULL;
}

const nb_cuda_api *nb_cuda__load(char *why, size_t cap) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_all);
  if (!all_ok) snprintf(why, cap, "%s", all_why);
  return all_ok ? &api : NULL;
}
#endif
