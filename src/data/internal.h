/* Private to the data library: the node layouts of map datasets and
 * iterators, the worker-thread error channel, and helpers shared between the
 * library's files. Nothing here is public API. */
#ifndef NABLA_DATA_INTERNAL_H
#define NABLA_DATA_INTERNAL_H

#include <stdatomic.h>

#include "nabla/data.h"
#include "util/util.h"

/* ---- errors --------------------------------------------------------------
 * Worker threads set nb_data__tls_err to a slot of their own; nb_data__err
 * then writes there instead of the shared context, and the consumer re-raises
 * it in order. Elsewhere nb_data__err is nb_errorf. */
typedef struct nb_data__errslot {
  nb_status status;
  char msg[1024];
} nb_data__errslot;
extern _Thread_local nb_data__errslot *nb_data__tls_err;
nb_status nb_data__err(nb_ctx *ctx, nb_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The first 8 bytes of a token shard and of a record file
 * (docs/token-shard-format.md, docs/record-format.md). */
#define NB_DATA__SHARD_MAGIC "NBTOKENS"
#define NB_DATA__RECORD_MAGIC "NBRECORD"
/* What a file's first n bytes say it is (format.c; never a directory). */
nb_data_format nb_data__format_of(const void *head, size_t n);
/* In a worker: the error of a failed call (the slot's, else the context's). */
void nb_data__capture(nb_ctx *ctx, nb_status s, nb_data__errslot *slot);

uint64_t nb_data__mix64(uint64_t x);

/* Little-endian fixed-width loads and stores for the file formats. */
static inline void nb_data__put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void nb_data__put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint32_t nb_data__get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t nb_data__get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Stacks n tree elements into one (see nb_data_batch_opts); `what` names the
 * stage in errors. */
nb_status nb_data__stack(nb_ctx *ctx, nb_data_elem *elems, int64_t n, const nb_data_batch_opts *o, const char *what,
                         nb_data_elem *out);
/* Tokenizes text into {"tokens": i32[n]} (eos appended when set). */
nb_status nb_data__tokenize(nb_ctx *ctx, const nb_data_tokenizer *tok, const char *text, size_t len, nb_data_elem *out);

/* ---- map datasets ---------------------------------------------------- */
typedef struct nb_data__map_ops {
  const char *name;
  /* out is NONE on entry; i >= 0, may be >= len (wraps into epochs). */
  nb_status (*get)(nb_data_map *ds, int64_t i, nb_data_elem *out);
  void (*destroy)(nb_data_map *ds); /* frees what impl points to */
} nb_data__map_ops;

struct nb_data_map {
  nb_ctx *ctx;
  const nb_data__map_ops *ops;
  _Atomic int64_t refs;
  int64_t len;
  nb_data_map *parent; /* owned reference or NULL */
  void *impl;          /* impl_size zeroed bytes, owned */
  size_t impl_size;
};
/* A node with one reference; takes parent (released on failure). */
nb_data_map *nb_data__map_new(nb_ctx *ctx, const nb_data__map_ops *ops, nb_data_map *parent, int64_t len,
                              size_t impl_size);
/* Bijective permutation of [0, n) keyed by key (Feistel + cycle walking). */
uint64_t nb_data__permute(uint64_t i, uint64_t n, uint64_t key);

/* ---- iterators ------------------------------------------------------- */
typedef struct nb_data__iter_ops {
  const char *name;
  nb_status (*next)(nb_data_iter *it, nb_data_elem *out);
  /* Per-element work that may run on prefetch workers (map, filter): sets
   * *keep false to drop. NULL for stateful stages. */
  nb_status (*apply)(nb_data_iter *it, nb_data_elem *e, bool *keep);
  int own_state;                                   /* int64 values of its own */
  /* The whole subtree's state: st[0..it->n_state). NULL: child's only. */
  void (*save)(nb_data_iter *it, int64_t *st);
  nb_status (*load)(nb_data_iter *it, const int64_t *st);
  void (*destroy)(nb_data_iter *it);               /* frees what impl points to */
  /* A stage that selects this process's part of a global element (rows):
   * left out of the saved state's stages, so every process of a job saves
   * the same state and it restores under another process count. */
  bool not_in_state;
} nb_data__iter_ops;

typedef struct nb_data__stats {
  _Atomic int64_t n_out, ns_self; /* ns_self: time in the stage minus its child */
  _Atomic int64_t ns_wait;        /* prefetch: consumer waiting */
  _Atomic int64_t occ_sum, occ_n; /* prefetch: buffer fill when asked */
  _Atomic int64_t t_first;
} nb_data__stats;

struct nb_data_iter {
  nb_ctx *ctx;
  const nb_data__iter_ops *ops;
  nb_data_iter *child; /* owned or NULL (the source) */
  int n_state;         /* own_state + child's */
  void *impl;
  size_t impl_size;
  nb_data__stats stats;
  int64_t ns_child;    /* time spent in the child during the current next() */
};
/* A node over child (taken; destroyed on failure). */
nb_data_iter *nb_data__iter_new(nb_ctx *ctx, const nb_data__iter_ops *ops, nb_data_iter *child, size_t impl_size);
/* next() of a child, timed (used by stages to call their upstream). */
nb_status nb_data__child_next(nb_data_iter *it, nb_data_elem *out);
/* The subtree's state / restore it (dispatches to ops or the child). */
void nb_data__save(nb_data_iter *it, int64_t *st);
nb_status nb_data__load(nb_data_iter *it, const int64_t *st);
/* The dataset of a source iterator (nb_data_iter_create), else NULL; and its
 * read position. */
nb_data_map *nb_data__iter_source(nb_data_iter *it);
int64_t *nb_data__iter_source_pos(nb_data_iter *it);
/* Marks a stage's first use and adds to its counters (any thread). */
void nb_data__stats_add(nb_data__stats *st, int64_t n_out, int64_t ns_self);

#endif
