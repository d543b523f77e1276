/* CUDA C to a cubin through NVRTC, for one compute capability, with the
 * cubins kept in memory by the source's content (a loop body compiled again,
 * the same graph jitted twice, every layer's identical kernels in a second
 * executable). Needs NVRTC only, not a driver or a device. */
#ifdef NABLA_HAVE_CUDA
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"

typedef struct entry {
  uint64_t hash;
  int arch;
  char *src; /* the whole source: a hash collision must not load other code */
  size_t src_len;
  char *bin;
  size_t bin_len;
  struct entry *next;
} entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static entry *cache;

static bool cached(uint64_t h, int arch, const char *src, size_t len, char **bin, size_t *bin_len) {
  bool found = false;
  pthread_mutex_lock(&cache_mu);
  for (entry *e = cache; e && !found; e = e->next)
    if (e->hash == h && e->arch == arch && e->src_len == len && memcmp(e->src, src, len) == 0 && (*bin = malloc(e->bin_len))) {
      memcpy(*bin, e->bin, e->bin_len);
      *bin_len = e->bin_len;
      found = true;
    }
  pthread_mutex_unlock(&cache_mu);
  return found;
}

static void remember(uint64_t h, int arch, const char *src, size_t len, const char *bin, size_t bin_len) {
  entry *e = calloc(1, sizeof *e);
  char *s = malloc(len + 1), *b = malloc(bin_len);
  if (!e || !s || !b) {
    free(e), free(s), free(b);
    return;
  }
  memcpy(s, src, len);
  memcpy(b, bin, bin_len);
  *e = (entry){h, arch, s, len, b, bin_len, NULL};
  pthread_mutex_lock(&cache_mu);
  e->next = cache;
  cache = e;
  pthread_mutex_unlock(&cache_mu);
}

nb_status nb_cuda__nvrtc_compile(nb_ctx *ctx, const char *src, size_t len, int arch, char **bin, size_t *bin_len,
                                 bool *from_cache) {
  *bin = NULL;
  *bin_len = 0;
  *from_cache = false;
  char why[512];
  const nb_cuda_api *a = nb_cuda__nvrtc(why, sizeof why);
  if (!a) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s", why);
  uint64_t h = nb__hash_bytes(src, len, (uint64_t)arch);
  if (cached(h, arch, src, len, bin, bin_len)) return *from_cache = true, NB_OK;
  char *text = malloc(len + 1); /* NVRTC takes a NUL-terminated string */
  if (!text) return nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
  memcpy(text, src, len);
  text[len] = 0;
  char archopt[48];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=sm_%d", arch);
  /* -default-device: the shared helpers (plain C) become device functions;
   * --fmad=false: no contraction, as the interpreter rounds each operation */
  const char *opts[] = {archopt, "-default-device", "--fmad=false", "-w"};
  nvrtcProgram prog = NULL;
  nvrtcResult r = a->rtcCreateProgram(&prog, text, "nabla_kernels.cu", 0, NULL, NULL);
  nb_status st = NB_OK;
  if (r != NVRTC_SUCCESS) st = nb_errorf(ctx, NB_ERR_INTERNAL, "cuda: nvrtcCreateProgram failed: %s", a->rtcGetErrorString(r));
  if (st == NB_OK && (r = a->rtcCompileProgram(prog, (int)(sizeof opts / sizeof opts[0]), opts)) != NVRTC_SUCCESS) {
    size_t n = 0;
    char *log = a->rtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n ? malloc(n + 1) : NULL;
    if (log && a->rtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = 0;
    if (log) log[n] = 0;
    st = nb_errorf(ctx, NB_ERR_INTERNAL, "cuda: NVRTC could not compile the generated kernels for sm_%d (%s): %.1500s", arch,
                   a->rtcGetErrorString(r), log ? log : "(no log)");
    free(log);
  }
  size_t n = 0;
  if (st == NB_OK && (r = a->rtcGetCUBINSize(prog, &n)) == NVRTC_SUCCESS && (*bin = malloc(n ? n : 1)))
    r = a->rtcGetCUBIN(prog, *bin);
  if (st == NB_OK && (r != NVRTC_SUCCESS || !*bin)) {
    st = *bin ? nb_errorf(ctx, NB_ERR_INTERNAL, "cuda: nvrtcGetCUBIN failed: %s", a->rtcGetErrorString(r))
              : nb_errorf(ctx, NB_ERR_NOMEM, "cuda: out of memory");
    free(*bin);
    *bin = NULL;
  }
  if (st == NB_OK) {
    *bin_len = n;
    remember(h, arch, src, len, *bin, n);
  }
  if (prog) a->rtcDestroyProgram(&prog);
  free(text);
  return st;
}
#endif
