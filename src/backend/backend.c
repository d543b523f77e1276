/* The backends nabla is built with, found by name (nb_jit_opts.backend,
 * $NABLA_BACKEND). */
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/interp/interp.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

static const nb_backend *const backends[] = {&nb_cpu__backend, &nb_interp__backend,
#ifdef NABLA_HAVE_CUDA
                                             &nb_cuda__backend
#endif
};

const nb_backend *nb_backend__find(const char *name) {
  for (size_t i = 0; name && i < sizeof backends / sizeof backends[0]; i++)
    if (strcmp(backends[i]->name, name) == 0) return backends[i];
  return NULL;
}

#ifdef NABLA_HAVE_CUDA
const char *nb_backend__names(void) { return "cpu, interp, cuda"; }
#else
const char *nb_backend__names(void) { return "cpu, interp"; }
#endif
