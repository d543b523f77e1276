/* Map datasets: the shuffle is a permutation (per seed and epoch), slice,
 * repeat, shard disjointness and coverage, mixture proportions over every
 * 10k window, random_map determinism, filter holes, batching, and the
 * sources (arrays, lines, JSONL, callbacks, many record files, tokenize). */
#include "data/internal.h" /* nb_data__permute */
#include "data_util.h"

/* A callback source: element i is {"x": i64 scalar i}. */
static nb_status index_source(void *ud, nb_ctx *ctx, int64_t i, nb_data_elem *out) {
  int64_t base = ud ? *(const int64_t *)ud : 0;
  nb_array *a = nb_array_scalar(ctx, NB_I64, (double)(base + i));
  nb_tree *t = nb_tree_create(ctx);
  if (!a || !t || nb_tree_set_array(t, "x", a)) return nb_array_release(a), nb_tree_destroy(t), NB_ERR_NOMEM;
  nb_array_release(a);
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

static int64_t x_of(const nb_data_elem *e) { return (int64_t)nb_array_get(nb_tree_get_array(e->tree, "x"), 0); }

static int64_t get_x(nb_ctx *ctx, nb_data_map *ds, int64_t i) {
  nb_data_elem e = NB_DATA_ELEM_INIT;
  nb_status s = nb_data_map_get(ds, i, &e);
  int64_t x = s || e.kind != NB_DATA_TREE ? -1 : x_of(&e);
  nb_data_elem_clear(ctx, &e);
  return x;
}

static void test_permutation(nb_ctx *ctx) {
  int64_t sizes[6] = {1, 2, 3, 17, 1000, (1 << 17) + 3};
  for (int k = 0; k < 6; k++) {
    uint64_t n = (uint64_t)sizes[k];
    uint8_t *seen = calloc(n, 1);
    int64_t bad = 0, fixed = 0;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t j = nb_data__permute(i, n, 12345);
      if (j >= n || seen[j]++) bad++;
      fixed += j == i;
    }
    CHECK_MSG(bad == 0, "n=%llu: not a permutation (%lld bad)", (unsigned long long)n, (long long)bad);
    if (n >= 1000) CHECK_MSG(fixed < 20, "n=%llu: %lld fixed points", (unsigned long long)n, (long long)fixed);
    free(seen);
  }
  /* as a dataset: each epoch is a permutation, epochs and seeds differ */
  nb_data_map *ds = nb_data_map_repeat(nb_data_map_shuffle(nb_data_map_source(ctx, 100, index_source, NULL), 7), 3);
  nb_data_map *ds2 = nb_data_map_shuffle(nb_data_map_source(ctx, 100, index_source, NULL), 8);
  CHECK(nb_data_map_len(ds) == 300);
  int64_t sum[3] = {0}, same_epoch = 0, same_seed = 0;
  for (int64_t i = 0; i < 300; i++) {
    int64_t x = get_x(ctx, ds, i);
    sum[i / 100] += x;
    if (i < 100) same_epoch += x == get_x(ctx, ds, i + 100), same_seed += x == get_x(ctx, ds2, i);
  }
  CHECK(sum[0] == 4950 && sum[1] == 4950 && sum[2] == 4950);
  CHECK(same_epoch < 10 && same_seed < 10);
  nb_data_map_release(ds);
  nb_data_map_release(ds2);
}

static void test_slice_repeat_shard(nb_ctx *ctx) {
  nb_data_map *src = nb_data_map_source(ctx, 10, index_source, NULL);
  nb_data_map_retain(src);
  nb_data_map *s = nb_data_map_slice(src, 2, 9, 3); /* 2, 5, 8 */
  CHECK(nb_data_map_len(s) == 3 && get_x(ctx, s, 0) == 2 && get_x(ctx, s, 2) == 8 && get_x(ctx, s, 3) == 2);
  nb_data_map_release(s);
  nb_data_map_retain(src);
  nb_data_map *r = nb_data_map_repeat(src, 0);
  CHECK(nb_data_map_len(r) == INT64_MAX && get_x(ctx, r, 123) == 3);
  /* every D-th element of an endless map is endless too (the length once overflowed to < 0: a data-parallel
   * run of one row per process read "the training data ended" at its first step) */
  nb_data_map *every2 = nb_data_map_slice(r, 0, INT64_MAX, 2);
  CHECK(nb_data_map_len(every2) == INT64_MAX / 2 + 1 && get_x(ctx, every2, 4) == 8 && get_x(ctx, every2, 5) == 0);
  nb_data_map_release(every2);
  nb_data_map_retain(src);
  CHECK(nb_data_map_slice(src, 0, 5, 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "step 0");
  /* shards: disjoint, union is everything; with drop_remainder equal sizes */
  for (int64_t n = 0; n < 30; n += 7)
    for (int64_t count = 1; count <= 4; count++)
      for (int drop = 0; drop < 2; drop++) {
        int64_t hits[32] = {0}, total = 0;
        for (int64_t p = 0; p < count; p++) {
          nb_data_map *sh = nb_data_map_shard(nb_data_map_source(ctx, n ? n : 1, index_source, NULL), p, count, drop);
          if (!n) { /* an empty dataset shards into empties */
            nb_data_map_release(sh);
            sh = nb_data_map_shard(nb_data_map_slice(nb_data_map_source(ctx, 1, index_source, NULL), 0, 0, 1), p, count, drop);
          }
          int64_t len = nb_data_map_len(sh);
          if (drop) CHECK(len == n / count);
          for (int64_t i = 0; i < len; i++) hits[get_x(ctx, sh, i)]++, total++;
          nb_data_map_release(sh);
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += hits[i] > 1 || (!drop && hits[i] != 1);
        CHECK_MSG(bad == 0 && total == (drop ? n / count * count : n), "n=%lld count=%lld drop=%d", (long long)n,
                  (long long)count, drop);
      }
  CHECK(nb_data_map_shard(src, 3, 3, false) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "process index 3");
}

static void test_mix(nb_ctx *ctx) {
  double w[3] = {0.6, 0.3, 0.1};
  int64_t bases[3] = {0, 1000000, 2000000};
  nb_data_map *dss[3];
  for (int k = 0; k < 3; k++) dss[k] = nb_data_map_source(ctx, 1000000, index_source, &bases[k]);
  nb_data_map *m = nb_data_map_mix(ctx, 3, dss, w);
  CHECK(m && nb_data_map_len(m) > 1600000);
  enum { N = 40000, W = 10000 };
  static int8_t which[N];
  int64_t next[3] = {0, 0, 0}, order_bad = 0;
  for (int64_t i = 0; i < N; i++) {
    int64_t x = get_x(ctx, m, i), k = x / 1000000;
    which[i] = (int8_t)k;
    order_bad += x % 1000000 != next[k]++; /* each dataset is read in order, nothing skipped */
  }
  CHECK(order_bad == 0);
  double worst = 0;
  int64_t cnt[3] = {0};
  for (int64_t i = 0; i < N; i++) {
    cnt[which[i]]++;
    if (i >= W) cnt[which[i - W]]--;
    if (i >= W - 1)
      for (int k = 0; k < 3; k++) {
        double dev = fabs((double)cnt[k] / W - w[k]);
        if (dev > worst) worst = dev;
      }
  }
  CHECK_MSG(worst <= 0.01, "worst window deviation %.5f", worst);
  CHECK_MSG(worst <= 2.0 / W, "worst window deviation %.5f is more than 2 elements", worst);
  nb_data_map_release(m);
  /* len: ends where the first dataset runs out; odd weights */
  double w2[2] = {1, 2};
  nb_data_map *d2[2] = {nb_data_map_source(ctx, 10, index_source, &bases[0]),
                        nb_data_map_source(ctx, 100, index_source, &bases[1])};
  m = nb_data_map_mix(ctx, 2, d2, w2);
  CHECK_MSG(nb_data_map_len(m) >= 29 && nb_data_map_len(m) <= 31, "len %lld", (long long)nb_data_map_len(m));
  nb_data_map_release(m);
  d2[0] = nb_data_map_source(ctx, 10, index_source, NULL);
  d2[1] = nb_data_map_source(ctx, 10, index_source, NULL);
  w2[1] = 0;
  CHECK(nb_data_map_mix(ctx, 2, d2, w2) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "weights must be > 0");
}

static nb_status add_noise(void *ud, nb_ctx *ctx, nb_data_rng *rng, nb_data_elem *e) {
  int64_t x = x_of(e) * 1000 + (int64_t)nb_data_rng_below(rng, 1000);
  nb_array *a = nb_array_scalar(ctx, NB_I64, (double)x);
  nb_status s = nb_tree_set_array(e->tree, "x", a);
  nb_array_release(a);
  return s;
}

static nb_status keep_even(void *ud, nb_ctx *ctx, const nb_data_elem *e, bool *keep) {
  *keep = x_of(e) % 2 == 0;
  return NB_OK;
}

static void test_map_filter_batch(nb_ctx *ctx) {
  nb_data_map *a = nb_data_map_random_map(nb_data_map_source(ctx, 50, index_source, NULL), add_noise, NULL, 99);
  nb_data_map *b = nb_data_map_random_map(nb_data_map_source(ctx, 50, index_source, NULL), add_noise, NULL, 99);
  int64_t diff = 0, distinct = 0;
  for (int64_t i = 49; i >= 0; i--) { /* order does not matter */
    int64_t xa = get_x(ctx, a, i), xb = get_x(ctx, b, i);
    diff += xa != xb || xa / 1000 != i;
    distinct += xa % 1000 != get_x(ctx, a, i + 50) % 1000; /* the next epoch draws again */
  }
  CHECK(diff == 0 && distinct > 40);
  nb_data_map_release(a);
  nb_data_map_release(b);
  nb_data_map *f = nb_data_map_filter(nb_data_map_source(ctx, 10, index_source, NULL), keep_even, NULL);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  CHECK_OK(ctx, nb_data_map_get(f, 3, &e));
  CHECK(e.kind == NB_DATA_NONE);
  CHECK(get_x(ctx, f, 4) == 4);
  nb_data_map *fb = nb_data_map_batch(f, 4, false);
  CHECK(nb_data_map_get(fb, 0, &e) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "filtered out");
  nb_data_map_release(fb);
  nb_data_map *bt = nb_data_map_batch(nb_data_map_source(ctx, 10, index_source, NULL), 4, false);
  CHECK(nb_data_map_len(bt) == 3);
  CHECK_OK(ctx, nb_data_map_get(bt, 2, &e));
  nb_array *x = nb_tree_get_array(e.tree, "x");
  CHECK(x && nb_array_rank(x) == 1 && nb_array_dims(x)[0] == 2 && nb_array_get(x, 0) == 8 && nb_array_get(x, 1) == 9);
  nb_data_map_release(bt);
  bt = nb_data_map_batch(nb_data_map_source(ctx, 10, index_source, NULL), 4, true);
  CHECK(nb_data_map_len(bt) == 2);
  nb_data_map_release(bt);
  nb_data_elem_clear(ctx, &e);
  CHECK(nb_data_map_batch(NULL, 4, true) == NULL); /* NULL propagates */
}

static void test_sources(nb_ctx *ctx) {
  char p[512];
  /* arrays */
  int64_t dims[2] = {5, 3};
  nb_array *m = nb_array_iota(ctx, NB_F32, 2, dims, 0), *v = nb_array_arange(ctx, NB_I32, 0, 5, 1);
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, "m", m);
  nb_tree_set_array(t, "v", v);
  nb_data_map *ds = nb_data_map_arrays(ctx, t);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  CHECK(ds && nb_data_map_len(ds) == 5 && nb_data_map_get(ds, 3, &e) == NB_OK);
  nb_array *row = nb_tree_get_array(e.tree, "m");
  CHECK(row && nb_array_rank(row) == 1 && nb_array_size(row) == 3 && nb_array_get(row, 2) == 3);
  CHECK(nb_array_get(nb_tree_get_array(e.tree, "v"), 0) == 3);
  nb_data_map_release(ds);
  int64_t d4 = 4;
  nb_array *w = nb_array_zeros(ctx, NB_F32, 1, &d4);
  nb_tree_set_array(t, "w", w);
  CHECK(nb_data_map_arrays(ctx, t) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "'w' has 4 rows");
  nb_array_release(m), nb_array_release(v), nb_array_release(w);
  nb_tree_destroy(t);
  /* text lines and JSONL */
  nb_test_write_text(tpath(p, "l.txt"), "one\r\n\nthree");
  ds = nb_data_map_lines(ctx, p, NULL);
  CHECK(ds && nb_data_map_len(ds) == 3);
  CHECK(nb_data_map_get(ds, 0, &e) == NB_OK && e.len == 3 && !strcmp((char *)e.bytes, "one"));
  CHECK(nb_data_map_get(ds, 1, &e) == NB_OK && e.len == 0);
  CHECK(nb_data_map_get(ds, 2, &e) == NB_OK && !strcmp((char *)e.bytes, "three"));
  nb_data_map_release(ds);
  nb_test_write_text(tpath(p, "l.jsonl"), "{\"t\": \"a\\nb\"}\n\n{\"t\": [1, 2]}\n{\"u\": 1}\nnot json\n");
  ds = nb_data_map_lines(ctx, p, "t");
  CHECK(ds && nb_data_map_len(ds) == 4);
  CHECK(nb_data_map_get(ds, 0, &e) == NB_OK && !strcmp((char *)e.bytes, "a\nb"));
  CHECK(nb_data_map_get(ds, 1, &e) == NB_OK && !strcmp((char *)e.bytes, "[1,2]"));
  CHECK(nb_data_map_get(ds, 2, &e) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "l.jsonl' line 4: no field 't'");
  CHECK(nb_data_map_get(ds, 3, &e) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "line 5: not valid JSON");
  /* tokenize bytes to {"tokens"} */
  ds = nb_data_map_tokenize(ds, NULL);
  CHECK(nb_data_map_get(ds, 0, &e) == NB_OK && e.kind == NB_DATA_TREE);
  nb_array *tok = nb_tree_get_array(e.tree, "tokens");
  CHECK(tok && nb_array_size(tok) == 3 && nb_array_get(tok, 1) == '\n');
  nb_data_map_release(ds);
  nb_test_write_text(tpath(p, "empty.txt"), "");
  ds = nb_data_map_lines(ctx, p, NULL);
  CHECK(ds && nb_data_map_len(ds) == 0);
  CHECK(nb_data_map_get(ds, 0, &e) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "empty");
  nb_data_map_release(ds);
  /* many record files as one source (one of them empty) */
  char p1[512], p2[512], p3[512];
  for (int f = 0; f < 3; f++) {
    nb_data_rec_writer *rw = nb_data_rec_create(ctx, tpath(f == 0 ? p1 : f == 1 ? p2 : p3, f == 0 ? "1.rec" : f == 1 ? "2.rec" : "3.rec"), NULL);
    for (int i = 0; f != 1 && i < 5; i++) {
      char buf[16];
      int n = snprintf(buf, sizeof buf, "f%d-%d", f, i);
      nb_data_rec_write(rw, buf, (size_t)n);
    }
    nb_data_rec_finish(rw);
  }
  ds = nb_data_map_records(ctx, 3, (const char *[]){p1, p2, p3});
  CHECK(ds && nb_data_map_len(ds) == 10);
  CHECK(nb_data_map_get(ds, 4, &e) == NB_OK && !strcmp((char *)e.bytes, "f0-4"));
  CHECK(nb_data_map_get(ds, 5, &e) == NB_OK && !strcmp((char *)e.bytes, "f2-0"));
  CHECK(nb_data_map_get(ds, 19, &e) == NB_OK && !strcmp((char *)e.bytes, "f2-4"));
  nb_data_map_release(ds);
  nb_data_elem_clear(ctx, &e);
}

int main(void) {
  tdir_make();
  nb_ctx *ctx = nb_ctx_create();
  test_permutation(ctx);
  test_slice_repeat_shard(ctx);
  test_mix(ctx);
  test_map_filter_batch(ctx);
  test_sources(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes still allocated", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  tdir_remove();
  return nb_test_summary("data/test_pipeline");
}
