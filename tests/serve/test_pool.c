/* The KV block pool: allocation from the free list, reference counts,
 * eviction of unheld cached blocks (LRU, and only once the free list is
 * empty), chained block hashes, lookups that refuse a colliding hash, and
 * the hash table under random register/evict churn. */
#include "serve/internal.h"
#include "test.h"

static void check_pool(const nb_serve__pool *p) {
  char why[256] = "";
  CHECK_MSG(nb_serve__pool_check(p, why, sizeof why), "%s", why);
}

static void test_alloc_refcount(nb_ctx *ctx) {
  nb_serve__pool p;
  CHECK_OK(ctx, nb_serve__pool_init(&p, ctx, 4, 4));
  CHECK(nb_serve__pool_available(&p) == 4);
  int32_t b[4];
  for (int i = 0; i < 4; i++) b[i] = nb_serve__pool_alloc(&p);
  CHECK(b[0] == 0 && b[1] == 1 && b[2] == 2 && b[3] == 3);
  CHECK(nb_serve__pool_alloc(&p) == -1);
  CHECK(nb_serve__pool_available(&p) == 0);
  nb_serve__pool_incref(&p, b[1]); /* shared by two tables */
  CHECK(p.ref[b[1]] == 2);
  nb_serve__pool_decref(&p, b[1]);
  CHECK(nb_serve__pool_available(&p) == 0); /* still held once */
  nb_serve__pool_decref(&p, b[1]);
  nb_serve__pool_decref(&p, b[3]);
  CHECK(nb_serve__pool_available(&p) == 2);
  CHECK(nb_serve__pool_alloc(&p) == b[1]); /* the free list is FIFO */
  check_pool(&p);
  nb_serve__pool_free(&p);
}

static void test_eviction(nb_ctx *ctx) {
  nb_serve__pool p;
  int32_t bs = 2;
  CHECK_OK(ctx, nb_serve__pool_init(&p, ctx, 4, bs));
  int32_t tok[4][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  uint64_t h[4], parent = NB_SERVE__ROOT_HASH;
  for (int i = 0; i < 4; i++) {
    h[i] = nb_serve__block_hash(parent, tok[i], bs);
    parent = h[i];
  }
  int32_t a = nb_serve__pool_alloc(&p), b = nb_serve__pool_alloc(&p), c = nb_serve__pool_alloc(&p);
  nb_serve__pool_register(&p, a, h[0], NB_SERVE__ROOT_HASH, tok[0]);
  nb_serve__pool_register(&p, b, h[1], h[0], tok[1]);
  nb_serve__pool_register(&p, c, h[2], h[1], tok[2]);
  CHECK(p.num_cached == 3);
  /* released in the order b, a, c: the LRU order */
  nb_serve__pool_decref(&p, b);
  nb_serve__pool_decref(&p, a);
  nb_serve__pool_decref(&p, c);
  CHECK(nb_serve__pool_available(&p) == 4);
  check_pool(&p);
  /* the never-used block goes first: cached contents survive while the
   * free list has anything */
  int32_t d = nb_serve__pool_alloc(&p);
  CHECK(d == 3);
  CHECK(p.num_cached == 3);
  CHECK(nb_serve__pool_lookup(&p, h[0], NB_SERVE__ROOT_HASH, tok[0]) == a);
  /* a hit takes the block off the LRU list: it cannot be evicted */
  nb_serve__pool_incref(&p, b);
  CHECK(nb_serve__pool_available(&p) == 2);
  /* now eviction, least recently released first: a, then c */
  CHECK(nb_serve__pool_alloc(&p) == a);
  CHECK(nb_serve__pool_lookup(&p, h[0], NB_SERVE__ROOT_HASH, tok[0]) == -1);
  CHECK(nb_serve__pool_lookup(&p, h[1], h[0], tok[1]) == b);
  CHECK(nb_serve__pool_alloc(&p) == c);
  CHECK(nb_serve__pool_alloc(&p) == -1);
  CHECK(p.num_cached == 1);
  check_pool(&p);
  /* a freed block registered afterwards (its step ran) becomes evictable */
  nb_serve__pool_decref(&p, d);
  CHECK(p.where[d] == NB_SERVE__FREE);
  nb_serve__pool_register(&p, d, h[3], h[2], tok[3]);
  CHECK(p.where[d] == NB_SERVE__LRU);
  check_pool(&p);
  nb_serve__pool_free(&p);
}

static void test_hash_chain(nb_ctx *ctx) {
  int32_t t[4] = {10, 11, 12, 13};
  uint64_t h1 = nb_serve__block_hash(NB_SERVE__ROOT_HASH, t, 4);
  CHECK(h1 == nb_serve__block_hash(NB_SERVE__ROOT_HASH, t, 4));
  /* the same block after a different prefix is a different key */
  CHECK(nb_serve__block_hash(h1, t, 4) != h1);
  int32_t u[4] = {10, 11, 12, 14};
  CHECK(nb_serve__block_hash(NB_SERVE__ROOT_HASH, u, 4) != h1);

  nb_serve__pool p;
  CHECK_OK(ctx, nb_serve__pool_init(&p, ctx, 2, 4));
  int32_t b = nb_serve__pool_alloc(&p);
  nb_serve__pool_register(&p, b, h1, NB_SERVE__ROOT_HASH, t);
  CHECK(nb_serve__pool_lookup(&p, h1, NB_SERVE__ROOT_HASH, t) == b);
  /* a colliding hash (forced here) with other tokens or another parent is
   * a miss, not someone else's keys and values */
  CHECK(nb_serve__pool_lookup(&p, h1, NB_SERVE__ROOT_HASH, u) == -1);
  CHECK(nb_serve__pool_lookup(&p, h1, 12345, t) == -1);
  /* a second block with the same contents is not registered twice */
  int32_t b2 = nb_serve__pool_alloc(&p);
  nb_serve__pool_register(&p, b2, h1, NB_SERVE__ROOT_HASH, t);
  CHECK(!p.cached[b2] && p.num_cached == 1);
  check_pool(&p);
  nb_serve__pool_free(&p);
}

/* Random register / hold / release / evict over a small table whose probe
 * runs overlap; every cached block must stay findable. */
static void test_table_churn(nb_ctx *ctx) {
  enum { N = 48, BS = 1 };
  nb_serve__pool p;
  CHECK_OK(ctx, nb_serve__pool_init(&p, ctx, N, BS));
  nb_test_rng r = {7};
  int32_t held[N], tok[N];
  int n_held = 0, next_tok = 0;
  for (int step = 0; step < 20000; step++) {
    int op = (int)nb_test_int(&r, 0, 2);
    if (op == 0 || n_held == 0) {
      int32_t b = nb_serve__pool_alloc(&p);
      if (b >= 0) {
        held[n_held++] = b;
        tok[b] = next_tok++ % 200; /* repeats: some registrations find the hash taken */
        nb_serve__pool_register(&p, b, nb_serve__block_hash(NB_SERVE__ROOT_HASH, &tok[b], BS), NB_SERVE__ROOT_HASH, &tok[b]);
      }
    } else {
      int i = (int)nb_test_int(&r, 0, n_held - 1);
      nb_serve__pool_decref(&p, held[i]);
      held[i] = held[--n_held];
    }
    if (step % 97 == 0) {
      check_pool(&p);
      for (int32_t b = 0; b < N; b++)
        if (p.cached[b])
          CHECK(nb_serve__pool_lookup(&p, p.hash[b], NB_SERVE__ROOT_HASH, &tok[b]) == b);
    }
  }
  check_pool(&p);
  nb_serve__pool_free(&p);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_alloc_refcount(ctx);
  test_eviction(ctx);
  test_hash_chain(ctx);
  test_table_churn(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/pool");
}
