/* Private to the core: struct layouts of the context and arrays, and the
 * helpers only the core's files share. Other libraries use include/nabla, and
 * the compiler and the transformations the IR contract, core/ir.h. */
#ifndef NABLA_CORE_INTERNAL_H
#define NABLA_CORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "nabla/core.h"

#define NB_ARRAY_ALIGN 64
#define NB_ERRMSG_CAP 2048

typedef struct nb_custom_call_entry nb_custom_call_entry;

struct nb_ctx {
  nb_alloc_fn alloc;
  void *alloc_ud;
  _Atomic size_t bytes_in_use, peak_bytes;
  _Atomic int64_t fail_alloc_countdown; /* 0 = off */
  nb_log_fn log;
  void *log_ud;
  int debug_level;
  bool debug_nans;
  nb_prng_impl prng;
  pthread_mutex_t err_lock;
  nb_status status;
  char errmsg[NB_ERRMSG_CAP];
  nb_custom_call_entry *custom_calls; /* registry, a linked list */
  struct {
    char name[NB_AXIS_NAME_MAX];
    nb_comm *comm; /* borrowed */
  } axes[NB_MAX_AXES]; /* mesh axes bound for collectives (collective.h) */
  int naxes;
};

/* Invariant: data is 64-byte aligned host memory (or wrapped memory aligned
 * to the dtype), never written after the array is shared. */
struct nb_array {
  nb_ctx *ctx;
  _Atomic int64_t refcount;
  nb_aval aval;
  nb_device device;
  void *data;
  size_t nbytes;
  void (*release)(void *ud); /* wrapped memory: called instead of freeing */
  void *release_ud;
};

struct nb_custom_call_entry {
  nb_custom_call_rules rules;
  char *name;
  nb_custom_call_entry *next;
};
const nb_custom_call_entry *nb__custom_call_find(const nb_ctx *ctx, const char *name);

#endif
