/* Private to the core: struct layouts of the context, arrays and trees, and
 * the helpers the core's files share. Other libraries use include/nabla only. */
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

/* An owned copy of s (free with nb__strfree), or NULL on OOM. */
char *nb__strdup(nb_ctx *ctx, const char *s);
void nb__strfree(nb_ctx *ctx, char *s);

/* Element access by dtype, used by the interpreter and printing. */
double nb__load_f64(nb_dtype t, const void *base, int64_t i);
void nb__store_f64(nb_dtype t, void *base, int64_t i, double v);
int64_t nb__load_i64(nb_dtype t, const void *base, int64_t i);
void nb__store_i64(nb_dtype t, void *base, int64_t i, int64_t v);

/* Row-major strides in elements for shape s. */
void nb__strides(const nb_shape *s, int64_t *strides);
uint64_t nb__hash_bytes(const void *p, size_t n, uint64_t seed);
uint64_t nb__hash_combine(uint64_t h, uint64_t v);

#endif
