/* gather and scatter_add on the device, as library steps: the walk their
 * reference rules run (core/ir.h's nb_walk, built by core/prims/gather.c)
 * in two hand-written kernels, compiled by NVRTC once per process. gather:
 * one thread per element of the result. scatter_add: the operand copied to
 * the result, then one thread per window position, each adding the batch's
 * windows in order, so the sums are the reference's, bit for bit, and no
 * two threads touch one element; that needs nb_walk.disjoint (an embedding
 * gradient has it), and f32, f64, i32, u32 or i64 elements. The rest stays
 * with the reference rule (a staged evaluated step). */
#ifdef NABLA_HAVE_CUDA
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"

/* nb_walk's layout, field for field (the static_assert checks the size) */
static const char walk_src[] =
    "typedef long long i64;\n"
    "struct W { int nbd, nm, nbat, nwd; bool disjoint; i64 nbatch, nwin;\n"
    "  i64 bext[NBX_R], bw[NBX_R], bi[NBX_R]; i64 mo[NBX_R], mhi[NBX_R], iv; int batj[NBX_R]; i64 bato[NBX_R];\n"
    "  i64 wext[NBX_R], ww[NBX_R], wo[NBX_R]; };\n"
    "static_assert(sizeof(W) == NBX_WALK_BYTES, \"nb_walk's layout\");\n"
    "__device__ i64 ld_ix(const char *p, int it, i64 i) {\n"
    "  switch (it) { case 0: return ((const int *)p)[i]; case 1: return ((const i64 *)p)[i];\n"
    "  case 2: return ((const unsigned *)p)[i]; case 3: return ((const signed char *)p)[i]; default: return ((const unsigned char *)p)[i]; } }\n"
    /* batch position b: its window-array base and operand base; false when scatter's window does not fit */
    "__device__ bool bases(const W &w, i64 b, const char *ix, int it, bool gather, i64 *wb, i64 *ob) {\n"
    "  i64 bc[NBX_R], rest = b, wbase = 0, ibase = 0, obase = 0;\n"
    "  for (int j = w.nbd - 1; j >= 0; j--) { bc[j] = rest % w.bext[j]; rest /= w.bext[j]; wbase += bc[j] * w.bw[j]; ibase += bc[j] * w.bi[j]; }\n"
    "  bool fits = true;\n"
    "  for (int k = 0; k < w.nm; k++) { i64 v = ld_ix(ix, it, ibase + k * w.iv);\n"
    "    if (gather) v = v < 0 ? 0 : v > w.mhi[k] ? w.mhi[k] : v; else fits = fits && v >= 0 && v <= w.mhi[k];\n"
    "    obase += v * w.mo[k]; }\n"
    "  for (int i = 0; i < w.nbat; i++) obase += bc[w.batj[i]] * w.bato[i];\n"
    "  *wb = wbase; *ob = obase; return fits; }\n"
    "__device__ void offsets(const W &w, i64 v, i64 *wo, i64 *oo) {\n"
    "  i64 r = v, a = 0, o = 0;\n"
    "  for (int k = w.nwd - 1; k >= 0; k--) { i64 c = r % w.wext[k]; r /= w.wext[k]; a += c * w.ww[k]; o += c * w.wo[k]; }\n"
    "  *wo = a; *oo = o; }\n"
    "extern \"C\" __global__ void nbx_gather(W w, int it, int es, const char *op, const char *ix, char *out) {\n"
    "  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (t >= w.nbatch * w.nwin) return;\n"
    "  i64 wb, ob, wo, oo;\n"
    "  bases(w, t / w.nwin, ix, it, true, &wb, &ob);\n"
    "  offsets(w, t % w.nwin, &wo, &oo);\n"
    "  i64 d = wb + wo, s = ob + oo;\n"
    "  switch (es) { case 1: out[d] = op[s]; break;\n"
    "  case 2: ((unsigned short *)out)[d] = ((const unsigned short *)op)[s]; break;\n"
    "  case 4: ((unsigned *)out)[d] = ((const unsigned *)op)[s]; break;\n"
    "  default: ((unsigned long long *)out)[d] = ((const unsigned long long *)op)[s]; } }\n"
    "extern \"C\" __global__ void nbx_scatter_add(W w, int it, int ty, const char *ix, const char *upd, char *out) {\n"
    "  i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (v >= w.nwin) return;\n"
    "  i64 wo, oo;\n"
    "  offsets(w, v, &wo, &oo);\n"
    "  for (i64 b = 0; b < w.nbatch; b++) {\n"
    "    i64 wb, ob;\n"
    "    if (!bases(w, b, ix, it, false, &wb, &ob)) continue;\n"
    "    i64 d = ob + oo, s = wb + wo;\n"
    "    switch (ty) { case 0: ((float *)out)[d] += ((const float *)upd)[s]; break;\n"
    "    case 1: ((double *)out)[d] += ((const double *)upd)[s]; break;\n"
    "    case 2: ((unsigned *)out)[d] += ((const unsigned *)upd)[s]; break;\n"
    "    default: ((unsigned long long *)out)[d] += ((const unsigned long long *)upd)[s]; } } }\n";

#define THREADS 256

static int index_code(nb_dtype t) {
  switch (t) {
  case NB_I32: return 0;
  case NB_I64: return 1;
  case NB_U32: return 2;
  case NB_I8: return 3;
  case NB_U8: return 4;
  default: return -1;
  }
}

/* scatter_add's element types: integer sums wrap, as the reference's */
static int add_code(nb_dtype t) {
  switch (t) {
  case NB_F32: return 0;
  case NB_F64: return 1;
  case NB_I32: case NB_U32: return 2;
  case NB_I64: return 3;
  default: return -1;
  }
}

bool nb_cuda__walk_supported(const nb_eqn *e) {
  if (e->prim == NB_PRIM_gather)
    return e->nin == 2 && index_code(e->in[1]->aval.dtype) >= 0 && nb_dtype_size(e->in[0]->aval.dtype) <= 8;
  if (e->prim != NB_PRIM_scatter_add || e->nin != 3 || index_code(e->in[1]->aval.dtype) < 0 || add_code(e->in[0]->aval.dtype) < 0)
    return false;
  nb_walk w;
  nb__walk_of(e, &w);
  return w.disjoint;
}

nb_status nb_cuda__walk_compile(nb_ctx *ctx, int arch, char **bin, size_t *bin_len) {
  char head[160];
  size_t len = (size_t)snprintf(head, sizeof head, "#define NBX_R %d\n#define NBX_WALK_BYTES %zu\n", NB_MAX_RANK, sizeof(nb_walk));
  char *src = malloc(len + sizeof walk_src);
  if (!src) return nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
  memcpy(src, head, len);
  memcpy(src + len, walk_src, sizeof walk_src);
  bool cached;
  nb_status st = nb_cuda__nvrtc_compile(ctx, src, len + sizeof walk_src - 1, arch, bin, bin_len, &cached);
  free(src);
  return st;
}

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
static CUmodule mod;
static CUfunction f_gather, f_scatter;

static nb_status load(nb_ctx *ctx, const nb_cuda_api *a, int arch) {
  pthread_mutex_lock(&mod_mu);
  nb_status st = NB_OK;
  if (!mod) {
    char *bin = NULL;
    size_t n = 0;
    st = nb_cuda__walk_compile(ctx, arch, &bin, &n);
    CUmodule m = 0;
    CUresult r = st == NB_OK ? a->ModuleLoadData(&m, bin) : CUDA_SUCCESS;
    if (st == NB_OK && r == CUDA_SUCCESS) r = a->ModuleGetFunction(&f_gather, m, "nbx_gather");
    if (st == NB_OK && r == CUDA_SUCCESS) r = a->ModuleGetFunction(&f_scatter, m, "nbx_scatter_add");
    if (st == NB_OK && r != CUDA_SUCCESS) st = nb_errorf(ctx, NB_ERR_IO, "cuda: loading the gather/scatter kernels failed (%d)", (int)r);
    if (st == NB_OK) mod = m;
    free(bin);
  }
  pthread_mutex_unlock(&mod_mu);
  return st;
}

nb_status nb_cuda__walk_run(nb_ctx *ctx, const nb_cuda_api *a, CUstream stream, int arch, const nb_eqn *e, char *const *args) {
  nb_status st = load(ctx, a, arch);
  if (st != NB_OK) return st;
  nb_walk w;
  nb__walk_of(e, &w);
  int it = index_code(e->in[1]->aval.dtype);
  CUresult r = CUDA_SUCCESS;
  if (e->prim == NB_PRIM_gather) {
    int es = (int)nb_dtype_size(e->in[0]->aval.dtype);
    int64_t n = w.nbatch * w.nwin;
    void *p[] = {&w, &it, &es, (void *)&args[0], (void *)&args[1], (void *)&args[2]};
    if (n > 0) r = a->LaunchKernel(f_gather, (unsigned)((n + THREADS - 1) / THREADS), 1, 1, THREADS, 1, 1, 0, stream, p, NULL);
  } else {
    int ty = add_code(e->in[0]->aval.dtype);
    size_t bytes = (size_t)nb_shape_size(&e->in[0]->aval.shape) * nb_dtype_size(e->in[0]->aval.dtype);
    if (bytes && args[3] != args[0])
      r = a->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)args[3], (CUdeviceptr)(uintptr_t)args[0], bytes, stream);
    void *p[] = {&w, &it, &ty, (void *)&args[1], (void *)&args[2], (void *)&args[3]};
    if (r == CUDA_SUCCESS && w.nwin > 0 && w.nbatch > 0)
      r = a->LaunchKernel(f_scatter, (unsigned)((w.nwin + THREADS - 1) / THREADS), 1, 1, THREADS, 1, 1, 0, stream, p, NULL);
  }
  return r == CUDA_SUCCESS ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "cuda: %s's kernel failed to launch (%d)", nb__rules(e->prim)->name, (int)r);
}
#endif
