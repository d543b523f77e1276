/* The KV block pool: which blocks are held and by how many block tables,
 * which are free, and which hold cached prefix contents nobody uses (the
 * eviction candidates, least recently used first). Blocks are indices only;
 * the memory behind them is the backend's. */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "serve/internal.h"

/* ---- intrusive lists ---------------------------------------------------- */

static void list_push_tail(nb_serve__pool *p, nb_serve__list *l, int32_t b) {
  p->prev[b] = l->tail;
  p->next[b] = -1;
  if (l->tail >= 0) p->next[l->tail] = b;
  else l->head = b;
  l->tail = b;
  l->len++;
}

static void list_remove(nb_serve__pool *p, nb_serve__list *l, int32_t b) {
  if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
  else l->head = p->next[b];
  if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
  else l->tail = p->prev[b];
  p->prev[b] = p->next[b] = -1;
  l->len--;
}

/* ---- hash table: chained hash -> block ---------------------------------- */

static uint32_t tab_home(const nb_serve__pool *p, uint64_t h) { return (uint32_t)(h ^ (h >> 32)) & p->tab_mask; }

static uint32_t tab_find(const nb_serve__pool *p, uint64_t h) {
  uint32_t i = tab_home(p, h);
  while (p->tab_val[i] >= 0 && p->tab_key[i] != h) i = (i + 1) & p->tab_mask;
  return i;
}

/* Removes the entry at slot i, shifting later entries of the probe run
 * back so lookups never stop early (no tombstones). */
static void tab_delete(nb_serve__pool *p, uint32_t i) {
  uint32_t j = i;
  for (;;) {
    p->tab_val[i] = -1;
    for (;;) {
      j = (j + 1) & p->tab_mask;
      if (p->tab_val[j] < 0) return;
      uint32_t home = tab_home(p, p->tab_key[j]);
      /* entry j may move to i unless its home lies cyclically in (i, j] */
      bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) break;
    }
    p->tab_key[i] = p->tab_key[j];
    p->tab_val[i] = p->tab_val[j];
    i = j;
  }
}

/* ---- pool ----------------------------------------------------------------- */

#define POOL_ARRAYS(X)                                                  \
  X(ref, int32_t, n) X(prev, int32_t, n) X(next, int32_t, n) X(where, uint8_t, n) \
  X(cached, uint8_t, n) X(hash, uint64_t, n) X(parent, uint64_t, n)      \
  X(tokens, int32_t, n * bs) X(tab_key, uint64_t, tab) X(tab_val, int32_t, tab)

nb_status nb_serve__pool_init(nb_serve__pool *p, nb_ctx *ctx, int32_t num_blocks, int32_t block_size) {
  memset(p, 0, sizeof *p);
  p->ctx = ctx;
  p->num_blocks = num_blocks;
  p->block_size = block_size;
  size_t n = (size_t)num_blocks, bs = (size_t)block_size, tab = 2;
  while (tab < 2 * n) tab *= 2;
  p->tab_mask = (uint32_t)(tab - 1);
#define ALLOC(f, T, count)                                           \
  if (!(p->f = nb_alloc(ctx, (count) * sizeof(T)))) {                \
    nb_serve__pool_free(p);                                          \
    return nb_errorf(ctx, NB_ERR_NOMEM, "KV block pool of %zu blocks: %s", n, nb_ctx_error(ctx)); \
  }
  POOL_ARRAYS(ALLOC)
#undef ALLOC
  memset(p->ref, 0, n * sizeof *p->ref);
  memset(p->cached, 0, n);
  for (size_t i = 0; i < tab; i++) p->tab_val[i] = -1;
  p->free = p->lru = (nb_serve__list){-1, -1, 0};
  for (int32_t b = 0; b < num_blocks; b++) {
    p->where[b] = NB_SERVE__FREE;
    list_push_tail(p, &p->free, b);
  }
  return NB_OK;
}

void nb_serve__pool_free(nb_serve__pool *p) {
  size_t n = (size_t)p->num_blocks, bs = (size_t)p->block_size, tab = (size_t)p->tab_mask + 1;
#define FREE(f, T, count) \
  if (p->f) nb_dealloc(p->ctx, p->f, (count) * sizeof(T));
  POOL_ARRAYS(FREE)
#undef FREE
  memset(p, 0, sizeof *p);
}

static void uncache(nb_serve__pool *p, int32_t b) {
  uint32_t i = tab_find(p, p->hash[b]);
  if (p->tab_val[i] == b) tab_delete(p, i);
  p->cached[b] = 0;
  p->num_cached--;
}

int32_t nb_serve__pool_alloc(nb_serve__pool *p) {
  int32_t b;
  if (p->free.len > 0) {
    b = p->free.head;
    list_remove(p, &p->free, b);
  } else if (p->lru.len > 0) {
    b = p->lru.head; /* least recently used cached block: its contents go */
    list_remove(p, &p->lru, b);
    uncache(p, b);
  } else {
    return -1;
  }
  p->where[b] = NB_SERVE__HELD;
  p->ref[b] = 1;
  return b;
}

void nb_serve__pool_incref(nb_serve__pool *p, int32_t b) {
  if (p->where[b] == NB_SERVE__LRU) list_remove(p, &p->lru, b);
  else if (p->where[b] == NB_SERVE__FREE) list_remove(p, &p->free, b);
  p->where[b] = NB_SERVE__HELD;
  p->ref[b]++;
}

void nb_serve__pool_decref(nb_serve__pool *p, int32_t b) {
  if (--p->ref[b] > 0) return;
  p->where[b] = p->cached[b] ? NB_SERVE__LRU : NB_SERVE__FREE;
  list_push_tail(p, p->cached[b] ? &p->lru : &p->free, b);
}

/* ---- prefix cache ----------------------------------------------------------- */

uint64_t nb_serve__block_hash(uint64_t parent, const int32_t *tokens, int32_t block_size) {
  return XXH3_64bits_withSeed(tokens, (size_t)block_size * sizeof *tokens, parent);
}

int32_t nb_serve__pool_lookup(const nb_serve__pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
  uint32_t i = tab_find(p, hash);
  int32_t b = p->tab_val[i];
  if (b < 0 || p->parent[b] != parent) return -1;
  if (memcmp(p->tokens + (size_t)b * p->block_size, tokens, (size_t)p->block_size * sizeof *tokens) != 0) return -1;
  return b;
}

void nb_serve__pool_register(nb_serve__pool *p, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens) {
  if (p->cached[b]) return;
  uint32_t i = tab_find(p, hash);
  if (p->tab_val[i] >= 0) return; /* the same contents (or a colliding hash) are cached in another block */
  p->tab_key[i] = hash;
  p->tab_val[i] = b;
  p->cached[b] = 1;
  p->hash[b] = hash;
  p->parent[b] = parent;
  memcpy(p->tokens + (size_t)b * p->block_size, tokens, (size_t)p->block_size * sizeof *tokens);
  p->num_cached++;
  if (p->where[b] == NB_SERVE__FREE) {
    list_remove(p, &p->free, b);
    p->where[b] = NB_SERVE__LRU;
    list_push_tail(p, &p->lru, b);
  }
}

static bool list_check(const nb_serve__pool *p, const nb_serve__list *l, uint8_t where, const char *name, char *why,
                       size_t cap) {
  int32_t n = 0, prev = -1;
  for (int32_t b = l->head; b >= 0; prev = b, b = p->next[b]) {
    if (++n > p->num_blocks || p->prev[b] != prev || p->where[b] != where || p->ref[b] != 0) {
      snprintf(why, cap, "%s list broken at block %d", name, b);
      return false;
    }
  }
  if (n != l->len || l->tail != prev) {
    snprintf(why, cap, "%s list holds %d blocks, its length says %d", name, n, l->len);
    return false;
  }
  return true;
}

bool nb_serve__pool_check(const nb_serve__pool *p, char *why, size_t cap) {
  if (!list_check(p, &p->free, NB_SERVE__FREE, "free", why, cap) || !list_check(p, &p->lru, NB_SERVE__LRU, "LRU", why, cap))
    return false;
  int32_t held = 0, cached = 0;
  for (int32_t b = 0; b < p->num_blocks; b++) {
    if (p->where[b] == NB_SERVE__HELD) held++;
    if ((p->where[b] == NB_SERVE__HELD) != (p->ref[b] > 0)) {
      snprintf(why, cap, "block %d has refcount %d but is %s", b, p->ref[b], p->where[b] == NB_SERVE__HELD ? "held" : "listed");
      return false;
    }
    if ((p->where[b] == NB_SERVE__LRU && !p->cached[b]) || (p->where[b] == NB_SERVE__FREE && p->cached[b])) {
      snprintf(why, cap, "block %d: cached %d but on the %s list", b, p->cached[b], p->cached[b] ? "free" : "LRU");
      return false;
    }
    if (p->cached[b]) {
      cached++;
      if (p->tab_val[tab_find(p, p->hash[b])] != b) {
        snprintf(why, cap, "cached block %d is not in the table under its hash", b);
        return false;
      }
    }
  }
  if (held + p->free.len + p->lru.len != p->num_blocks || cached != p->num_cached) {
    snprintf(why, cap, "held %d + free %d + evictable %d != %d blocks (cached %d, counter %d)", held, p->free.len,
             p->lru.len, p->num_blocks, cached, p->num_cached);
    return false;
  }
  int32_t entries = 0;
  for (uint32_t i = 0; i <= p->tab_mask; i++)
    if (p->tab_val[i] >= 0) entries++;
  if (entries != cached) {
    snprintf(why, cap, "the table has %d entries for %d cached blocks", entries, cached);
    return false;
  }
  return true;
}
