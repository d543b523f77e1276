/* Small utilities of the compiler: the compile arena (all of an
 * executable's compile-time objects, freed at once) and growable text. */
#include <stdarg.h>
#include <string.h>

#include "compile/jit.h"

typedef struct nb_jit_block {
  struct nb_jit_block *next;
  size_t size, used;
  _Alignas(64) unsigned char data[];
} nb_jit_block;

void *nb_jit__alloc(nb_jit_arena *a, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  nb_jit_block *b = a->blocks;
  if (!b || b->used + bytes > b->size) {
    size_t size = bytes > 65536 ? bytes : 65536;
    b = nb_alloc(a->ctx, sizeof(nb_jit_block) + size);
    if (!b) return NULL;
    b->next = a->blocks;
    b->size = size;
    b->used = 0;
    a->blocks = b;
  }
  void *p = b->data + b->used;
  b->used += bytes;
  memset(p, 0, bytes);
  return p;
}

bool nb_jit__push(nb_jit_arena *a, void **v, int *n, int *cap, size_t elem) {
  if (*n < *cap) return true;
  int cap2 = *cap ? *cap * 2 : 8;
  void *p = nb_jit__alloc(a, (size_t)cap2 * elem);
  if (!p) return false;
  if (*n) memcpy(p, *v, (size_t)*n * elem);
  *v = p;
  *cap = cap2;
  return true;
}

void nb_jit__arena_adopt(nb_jit_arena *dst, nb_jit_arena *src) {
  nb_jit_block **tail = &dst->blocks;
  while (*tail) tail = &(*tail)->next;
  *tail = src->blocks;
  src->blocks = NULL;
}

void nb_jit__arena_free(nb_jit_arena *a) {
  nb_jit_block *b = a->blocks;
  while (b) {
    nb_jit_block *next = b->next;
    nb_dealloc(a->ctx, b, sizeof(nb_jit_block) + b->size);
    b = next;
  }
  a->blocks = NULL;
}

void nb_jit__printf(nb_jit_text *t, const char *fmt, ...) {
  if (t->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (t->s && t->n + (size_t)k < t->cap) {
      t->n += (size_t)k;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)k;
    char *s = nb_alloc(t->ctx, cap);
    if (!s) {
      t->oom = true;
      return;
    }
    if (t->s) memcpy(s, t->s, t->n + 1);
    nb_dealloc(t->ctx, t->s, t->cap);
    t->s = s;
    t->cap = cap;
  }
}

void nb_jit__text_free(nb_jit_text *t) {
  nb_dealloc(t->ctx, t->s, t->cap);
  t->s = NULL;
  t->n = t->cap = 0;
}
