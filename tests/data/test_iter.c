/* Iterators: the same batches for any worker count, bit-identical resume
 * from get_state at random cut points (through shuffle, mix, filter, pack,
 * batch and both prefetch modes), packing correctness (every token once,
 * segment ids, positions, first fit), padded batches and masks, worker
 * errors surfacing in order, empty inputs, bad states, statistics, and
 * elastic restore of a mixed, packed pipeline split by rows. */
#include "data_util.h"

static int64_t ex_len(int64_t i) { return 1 + (int64_t)(((uint64_t)i * 0x9e3779b97f4a7c15ull >> 32) % 40); }

/* Example i: {"tokens": i32[ex_len(i)]} with values i*1000 + j. */
static nb_status ex_source(void *ud, nb_ctx *ctx, int64_t i, nb_data_elem *out) {
  if (ud && i == *(const int64_t *)ud) return nb_errorf(ctx, NB_ERR_FORMAT, "boom at %lld", (long long)i);
  int64_t n = ex_len(i);
  nb_array *a = nb_array_empty(ctx, NB_I32, 1, &n);
  if (!a) return NB_ERR_NOMEM;
  int32_t *d = nb_array_data_mut(a);
  for (int64_t j = 0; j < n; j++) d[j] = (int32_t)(i * 1000 + j);
  nb_tree *t = nb_tree_create(ctx);
  nb_status s = t ? nb_tree_set_array(t, "tokens", a) : NB_ERR_NOMEM;
  nb_array_release(a);
  if (s) return nb_tree_destroy(t), s;
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

/* Drops a random tail (per-record RNG). */
static nb_status cut_tail(void *ud, nb_ctx *ctx, nb_data_rng *rng, nb_data_elem *e) {
  const nb_array *a = nb_tree_get_array(e->tree, "tokens");
  int64_t n = nb_array_size(a), keep = n - (int64_t)nb_data_rng_below(rng, (uint64_t)(n + 1) / 2);
  nb_array *b = nb_array_create(ctx, NB_I32, 1, &keep, nb_array_data(a));
  nb_status s = b ? nb_tree_set_array(e->tree, "tokens", b) : NB_ERR_NOMEM;
  nb_array_release(b);
  return s;
}

static nb_status drop_fifths(void *ud, nb_ctx *ctx, const nb_data_elem *e, bool *keep) {
  *keep = ((int64_t)nb_array_get(nb_tree_get_array(e->tree, "tokens"), 0) / 1000) % 5 != 0;
  return NB_OK;
}

static nb_status add_one(void *ud, nb_ctx *ctx, nb_data_elem *e) {
  const nb_array *a = nb_tree_get_array(e->tree, "tokens");
  int64_t n = nb_array_size(a);
  nb_array *b = nb_array_empty(ctx, NB_I32, 1, &n);
  if (!b) return NB_ERR_NOMEM;
  for (int64_t j = 0; j < n; j++) ((int32_t *)nb_array_data_mut(b))[j] = ((const int32_t *)nb_array_data(a))[j] + 1;
  nb_status s = nb_tree_set_array(e->tree, "tokens", b);
  nb_array_release(b);
  return s;
}

enum { PIPE_PACK, PIPE_MIX_BATCH, PIPE_WINDOWS, PIPE_COUNT };
static char shard_path[512];

static nb_data_iter *build(nb_ctx *ctx, int kind, int workers) {
  if (kind == PIPE_PACK) {
    nb_data_map *ds = nb_data_map_source(ctx, 300, ex_source, NULL);
    ds = nb_data_map_random_map(nb_data_map_repeat(nb_data_map_shuffle(ds, 5), 2), cut_tail, NULL, 11);
    nb_data_iter *it = nb_data_iter_filter(nb_data_iter_create(ds), drop_fifths, NULL);
    it = nb_data_iter_prefetch(nb_data_iter_map(it, add_one, NULL), workers, 8);
    it = nb_data_iter_pack(it, &(nb_data_pack_opts){.seq_len = 16, .rows = 4});
    return nb_data_iter_prefetch(it, 1, 3);
  }
  if (kind == PIPE_MIX_BATCH) {
    nb_data_map *dss[2] = {nb_data_map_shuffle(nb_data_map_source(ctx, 200, ex_source, NULL), 1),
                           nb_data_map_slice(nb_data_map_source(ctx, 1000, ex_source, NULL), 500, 1000, 1)};
    nb_data_map *ds = nb_data_map_mix(ctx, 2, dss, (double[]){0.7, 0.3});
    nb_data_iter *it = nb_data_iter_prefetch(nb_data_iter_create(ds), workers, 5);
    it = nb_data_iter_filter(it, drop_fifths, NULL);
    it = nb_data_iter_batch(it, &(nb_data_batch_opts){.batch_size = 3, .pad = true, .pad_value = -1});
    return nb_data_iter_prefetch(it, 2, 4); /* sequential mode: the 2 is one thread */
  }
  nb_data_map *ds = nb_data_map_tokens(ctx, 1, (const char *[]){shard_path}, 8);
  ds = nb_data_map_batch(nb_data_map_repeat(nb_data_map_shuffle(ds, 3), 0), 4, true);
  ds = nb_data_map_map(ds, nb_data_fn_lm_targets, NULL);
  return nb_data_iter_prefetch(nb_data_iter_create(ds), workers, 6);
}

/* Takes up to n elements into out[]; returns how many (stops at the end). */
static int take(nb_ctx *ctx, nb_data_iter *it, nb_data_elem *out, int n) {
  for (int k = 0; k < n; k++) {
    nb_status s = nb_data_iter_next(it, &out[k]);
    CHECK_MSG(s == NB_OK, "%s", nb_ctx_error(ctx));
    if (s || out[k].kind == NB_DATA_NONE) return k;
  }
  return n;
}

static void clear_all(nb_ctx *ctx, nb_data_elem *e, int n) {
  for (int k = 0; k < n; k++) nb_data_elem_clear(ctx, &e[k]);
}

enum { K = 40 };

static void test_determinism_and_resume(nb_ctx *ctx) {
  nb_test_rng rng = {77};
  for (int kind = 0; kind < PIPE_COUNT; kind++) {
    static nb_data_elem ref[K], got[K];
    nb_data_iter *it = build(ctx, kind, 1);
    int n = take(ctx, it, ref, K);
    CHECK_MSG(n == K, "pipeline %d gave %d elements", kind, n);
    nb_data_elem end = NB_DATA_ELEM_INIT;
    if (kind == PIPE_MIX_BATCH) { /* it ends: afterwards it keeps saying so */
      int extra = take(ctx, it, got, K);
      clear_all(ctx, got, K);
      CHECK(nb_data_iter_next(it, &end) == NB_OK && end.kind == NB_DATA_NONE && extra < K);
    }
    nb_data_iter_destroy(it);
    for (int workers = 2; workers <= 4; workers += 2) {
      it = build(ctx, kind, workers);
      int m = take(ctx, it, got, K), same = 0;
      for (int k = 0; k < m && k < n; k++) same += nb_data_elem_equal(&ref[k], &got[k]);
      CHECK_MSG(m == n && same == n, "pipeline %d, %d workers: %d of %d equal", kind, workers, same, n);
      clear_all(ctx, got, K);
      nb_data_iter_destroy(it);
    }
    for (int trial = 0; trial < 6; trial++) {
      int cut = trial == 0 ? 0 : (int)nb_test_int(&rng, 1, n - 1);
      it = build(ctx, kind, (int)nb_test_int(&rng, 1, 3));
      int m = take(ctx, it, got, cut);
      clear_all(ctx, got, m);
      char *state = nb_data_iter_get_state(it);
      nb_data_iter_destroy(it);
      CHECK(state != NULL);
      it = build(ctx, kind, (int)nb_test_int(&rng, 1, 3));
      CHECK_OK(ctx, nb_data_iter_set_state(it, state));
      m = take(ctx, it, got, n - cut);
      int same = 0;
      for (int k = 0; k < m; k++) same += nb_data_elem_equal(&ref[cut + k], &got[k]);
      CHECK_MSG(m == n - cut && same == m, "pipeline %d resumed at %d: %d of %d equal (state %s)", kind, cut, same,
                n - cut, state);
      clear_all(ctx, got, K);
      /* a state restored twice on the same pipeline rewinds it */
      if (trial == 1) {
        CHECK_OK(ctx, nb_data_iter_set_state(it, state));
        m = take(ctx, it, got, 1);
        CHECK(m == 1 && nb_data_elem_equal(&ref[cut], &got[0]));
        clear_all(ctx, got, 1);
      }
      nb_data_state_free(ctx, state);
      nb_data_iter_destroy(it);
    }
    clear_all(ctx, ref, K);
  }
}

static void test_pack(nb_ctx *ctx) {
  enum { N = 200, T = 16, R = 3 };
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(nb_data_map_source(ctx, N, ex_source, NULL)),
                                       &(nb_data_pack_opts){T, R});
  static uint8_t seen[N][40];
  memset(seen, 0, sizeof seen);
  int64_t bad = 0, outputs = 0, prev_fill[R] = {0};
  nb_data_elem e = NB_DATA_ELEM_INIT;
  while (nb_data_iter_next(it, &e) == NB_OK && e.kind == NB_DATA_TREE) {
    const nb_array *tok = nb_tree_get_array(e.tree, "tokens"), *seg = nb_tree_get_array(e.tree, "segment_ids"),
                   *pos = nb_tree_get_array(e.tree, "positions");
    CHECK(tok && seg && pos && nb_array_rank(tok) == 2 && nb_array_dims(tok)[0] == R && nb_array_dims(tok)[1] == T);
    if (!tok || !seg || !pos) break;
    int64_t fill[R];
    for (int r = 0; r < R; r++) {
      int32_t cur = 0;
      fill[r] = 0;
      for (int j = 0; j < T; j++) {
        int32_t s = (int32_t)nb_array_get(seg, r * T + j), p = (int32_t)nb_array_get(pos, r * T + j);
        int64_t v = (int64_t)nb_array_get(tok, r * T + j);
        if (s == 0) { /* padding: only at the end, zeros */
          bad += v != 0 || p != 0;
          cur = -1;
          continue;
        }
        bad += cur < 0 || s < cur || s > cur + 1; /* ids 1, 2, ... in order, no gaps */
        bad += (s == cur + 1) != (p == 0);        /* a segment starts at position 0 */
        if (j > 0 && s == cur) bad += p != (int32_t)nb_array_get(pos, r * T + j - 1) + 1;
        cur = s;
        int64_t ex = v / 1000;
        /* every token exactly once; consecutive within a segment (pieces of a long
         * example may land in any row) */
        bad += ex < 0 || ex >= N || v % 1000 >= 40 || seen[ex][v % 1000]++;
        if (j > 0 && s == (int32_t)nb_array_get(seg, r * T + j - 1)) bad += v != (int64_t)nb_array_get(tok, r * T + j - 1) + 1;
        fill[r]++;
      }
    }
    /* first fit: this output started because its first piece fit no row of the last one */
    int64_t first = 0;
    for (int j = 0; j < T && nb_array_get(seg, j) == 1; j++) first++;
    if (outputs > 0)
      for (int r = 0; r < R; r++) bad += T - prev_fill[r] >= first;
    memcpy(prev_fill, fill, sizeof fill);
    outputs++;
  }
  CHECK_MSG(bad == 0, "%lld packing violations", (long long)bad);
  int64_t missing = 0, total = 0;
  for (int64_t i = 0; i < N; i++) {
    for (int64_t j = 0; j < 40; j++) missing += seen[i][j] != (j < ex_len(i));
    total += ex_len(i);
  }
  CHECK_MSG(missing == 0, "%lld tokens lost or duplicated", (long long)missing);
  CHECK_MSG(outputs * R * T < total * 13 / 10, "%lld outputs for %lld tokens: poor packing", (long long)outputs,
            (long long)total);
  nb_data_elem_clear(ctx, &e);
  nb_data_iter_destroy(it);
  /* misuse: bytes elements */
  nb_test_write_text(tpath(shard_path + 256, "x.txt"), "abc\n");
  it = nb_data_iter_pack(nb_data_iter_create(nb_data_map_lines(ctx, shard_path + 256, NULL)), &(nb_data_pack_opts){4, 1});
  CHECK(nb_data_iter_next(it, &e) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "pack: an example must be a tree");
  nb_data_iter_destroy(it);
}

static void test_padded_batch(nb_ctx *ctx) {
  nb_data_iter *it = nb_data_iter_batch(nb_data_iter_create(nb_data_map_source(ctx, 5, ex_source, NULL)),
                                        &(nb_data_batch_opts){.batch_size = 2, .pad = true, .pad_value = -7});
  nb_data_elem e = NB_DATA_ELEM_INIT;
  int batches = 0, bad = 0;
  while (nb_data_iter_next(it, &e) == NB_OK && e.kind == NB_DATA_TREE) {
    const nb_array *t = nb_tree_get_array(e.tree, "tokens"), *m = nb_tree_get_array(e.tree, "mask");
    int64_t B = nb_array_dims(t)[0], L = nb_array_dims(t)[1];
    CHECK(nb_array_dtype(m) == NB_BOOL && nb_array_dims(m)[0] == B && nb_array_dims(m)[1] == L);
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) {
      int64_t i = batches * 2 + b, n = ex_len(i);
      longest = n > longest ? n : longest;
      for (int64_t j = 0; j < L; j++) {
        bad += nb_array_get(m, b * L + j) != (j < n);
        bad += nb_array_get(t, b * L + j) != (j < n ? (double)(i * 1000 + j) : -7);
      }
    }
    bad += L != longest;
    batches++;
  }
  CHECK(batches == 3 && bad == 0); /* the last batch holds one element */
  nb_data_iter_destroy(it);
  it = nb_data_iter_batch(nb_data_iter_create(nb_data_map_source(ctx, 5, ex_source, NULL)),
                          &(nb_data_batch_opts){.batch_size = 2, .pad = true, .pad_to = 1});
  CHECK(nb_data_iter_next(it, &e) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "longer than pad_to 1");
  nb_data_iter_destroy(it);
  it = nb_data_iter_batch(nb_data_iter_create(nb_data_map_source(ctx, 5, ex_source, NULL)),
                          &(nb_data_batch_opts){.batch_size = 2});
  CHECK(nb_data_iter_next(it, &e) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "set pad");
  nb_data_iter_destroy(it);
  nb_data_elem_clear(ctx, &e);
}

static void test_errors_and_empty(nb_ctx *ctx) {
  int64_t fail_at = 37;
  nb_data_iter *it = nb_data_iter_prefetch(nb_data_iter_create(nb_data_map_source(ctx, 60, ex_source, &fail_at)), 3, 8);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  int ok = 0;
  nb_status s;
  while ((s = nb_data_iter_next(it, &e)) == NB_OK && e.kind != NB_DATA_NONE) ok++;
  CHECK(ok == 37 && s == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "boom at 37");
  CHECK(nb_data_iter_next(it, &e) == NB_OK && nb_array_get(nb_tree_get_array(e.tree, "tokens"), 0) == 38000);
  nb_data_iter_destroy(it);
  /* sequential mode: the error ends the stream and is repeated */
  it = nb_data_iter_prefetch(nb_data_iter_pack(nb_data_iter_create(nb_data_map_source(ctx, 60, ex_source, &fail_at)),
                                               &(nb_data_pack_opts){64, 1}), 1, 2);
  while ((s = nb_data_iter_next(it, &e)) == NB_OK && e.kind != NB_DATA_NONE) {
  }
  CHECK(s == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "boom at 37");
  CHECK(nb_data_iter_next(it, &e) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "failed earlier");
  nb_data_iter_destroy(it);
  /* empty inputs end at once, through every stage */
  nb_data_map *empty = nb_data_map_shuffle(nb_data_map_source(ctx, 0, ex_source, NULL), 1);
  it = nb_data_iter_prefetch(nb_data_iter_create(empty), 2, 4);
  it = nb_data_iter_pack(it, &(nb_data_pack_opts){8, 2});
  it = nb_data_iter_prefetch(nb_data_iter_batch(it, &(nb_data_batch_opts){.batch_size = 2}), 1, 1);
  CHECK(nb_data_iter_next(it, &e) == NB_OK && e.kind == NB_DATA_NONE);
  CHECK(nb_data_iter_next(it, &e) == NB_OK && e.kind == NB_DATA_NONE);
  char *st = nb_data_iter_get_state(it);
  CHECK(st && nb_data_iter_set_state(it, st) == NB_OK);
  nb_data_state_free(ctx, st);
  /* statistics name every stage */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  nb_data_iter_print_stats(it, f);
  fclose(f);
  CHECK(buf && strstr(buf, "prefetch") && strstr(buf, "pack") && strstr(buf, "source") && strstr(buf, "wait ms"));
  free(buf);
  /* states from elsewhere are refused */
  nb_data_iter *other = build(ctx, PIPE_WINDOWS, 1);
  st = nb_data_iter_get_state(other);
  CHECK(nb_data_iter_set_state(it, st) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "different pipeline");
  nb_data_state_free(ctx, st);
  CHECK(nb_data_iter_set_state(other, "{\"format\": \"nabla.data.iter\"") == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "not valid JSON");
  CHECK(nb_data_iter_set_state(other, "{\"format\":\"nabla.data.iter\",\"version\":1,\"stages\":[\"prefetch\","
                                      "\"source\"],\"state\":[\"-4\"]}") == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "outside the dataset");
  nb_data_iter_destroy(other);
  nb_data_iter_destroy(it);
  CHECK(nb_data_iter_prefetch(nb_data_iter_create(nb_data_map_source(ctx, 3, ex_source, NULL)), 0, 4) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "workers 0");
  nb_data_elem_clear(ctx, &e);
}

/* Elastic restore: a job of D processes, each running the global pipeline
 * (a weighted mix of two sources of variable-length examples, packed into
 * 4 rows) and keeping its 4/D rows. Every process saves the same state,
 * and a state saved at D = 2 resumes at D = 1 and D = 4 (and D = 1 at 2)
 * with the same global stream: the rows the processes of the new job get
 * are those of the uninterrupted one-process run. */
static nb_data_iter *build_global(nb_ctx *ctx, int64_t D, int64_t r) {
  nb_data_map *dss[2] = {nb_data_map_shuffle(nb_data_map_source(ctx, 150, ex_source, NULL), 1),
                         nb_data_map_slice(nb_data_map_source(ctx, 1000, ex_source, NULL), 500, 1000, 1)};
  nb_data_map *ds = nb_data_map_mix(ctx, 2, dss, (double[]){0.7, 0.3});
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(ds), &(nb_data_pack_opts){.seq_len = 16, .rows = 4});
  if (D > 1) it = nb_data_iter_rows(it, r * 4 / D, 4 / D);
  return nb_data_iter_prefetch(it, 1, 3);
}

/* Whether part holds rows [start, start + count) of every leaf of whole. */
static bool rows_of(const nb_data_elem *whole, const nb_data_elem *part, int64_t start, int64_t count) {
  if (whole->kind != NB_DATA_TREE || part->kind != NB_DATA_TREE || nb_tree_size(whole->tree) != nb_tree_size(part->tree))
    return false;
  for (size_t i = 0; i < nb_tree_size(whole->tree); i++) {
    const nb_array *a = nb_tree_leaf(whole->tree, i)->array, *b = nb_tree_get_array(part->tree, nb_tree_path(whole->tree, i));
    if (!b || nb_array_dims(b)[0] != count || nb_array_size(a) / nb_array_dims(a)[0] != nb_array_size(b) / count) return false;
    size_t row = nb_dtype_size(nb_array_dtype(a)) * (size_t)(nb_array_size(a) / nb_array_dims(a)[0]);
    if (memcmp((const char *)nb_array_data(a) + (size_t)start * row, nb_array_data(b), (size_t)count * row)) return false;
  }
  return true;
}

/* Runs a D-process job from state (NULL: the start) for n global batches,
 * checking each process's rows against ref[first..]; returns the state
 * after them (every process's, checked equal). */
static char *run_job(nb_ctx *ctx, int64_t D, const char *state, const nb_data_elem *ref, int first, int n) {
  char *out = NULL;
  for (int64_t r = 0; r < D; r++) {
    nb_data_iter *it = build_global(ctx, D, r);
    if (state) CHECK_OK(ctx, nb_data_iter_set_state(it, state));
    int same = 0;
    for (int k = 0; k < n; k++) {
      nb_data_elem e = NB_DATA_ELEM_INIT;
      CHECK_OK(ctx, nb_data_iter_next(it, &e));
      same += rows_of(&ref[first + k], &e, r * 4 / D, 4 / D);
      nb_data_elem_clear(ctx, &e);
    }
    CHECK_MSG(same == n, "D = %lld, rank %lld, from batch %d: %d of %d batches hold the global stream's rows",
              (long long)D, (long long)r, first, same, n);
    char *st = nb_data_iter_get_state(it);
    CHECK(st != NULL);
    if (!out) out = st;
    else {
      CHECK_MSG(!strcmp(out, st), "D = %lld: rank %lld saved another state than rank 0:\n%s\n%s", (long long)D,
                (long long)r, st, out);
      nb_data_state_free(ctx, st);
    }
    nb_data_iter_destroy(it);
  }
  return out;
}

static void test_elastic(nb_ctx *ctx) {
  static nb_data_elem ref[K];
  nb_data_iter *it = build_global(ctx, 1, 0);
  CHECK(take(ctx, it, ref, K) == K);
  nb_data_iter_destroy(it);
  char *s2 = run_job(ctx, 2, NULL, ref, 0, 13);      /* 2 processes from the start */
  char *s1 = run_job(ctx, 1, s2, ref, 13, 9);        /* 2 -> 1 */
  char *s4 = run_job(ctx, 4, s1, ref, 22, 7);        /* 1 -> 4 */
  char *s2b = run_job(ctx, 2, s4, ref, 29, K - 29);  /* 4 -> 2, to the end of ref */
  nb_data_state_free(ctx, s2);
  nb_data_state_free(ctx, s1);
  nb_data_state_free(ctx, s4);
  nb_data_state_free(ctx, s2b);
  clear_all(ctx, ref, K);
  /* rows outside the element, bad arguments */
  it = nb_data_iter_rows(build_global(ctx, 1, 0), 3, 2);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  CHECK(nb_data_iter_next(it, &e) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "rows [3, 5) of leaf");
  nb_data_iter_destroy(it);
  CHECK(nb_data_iter_rows(build_global(ctx, 1, 0), 0, 0) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "count 0");
}

int main(void) {
  tdir_make();
  nb_ctx *ctx = nb_ctx_create();
  nb_data_shard_writer *w = nb_data_shard_create(ctx, tpath(shard_path, "w.tok"), 2, 1000);
  for (int32_t i = 0; i < 5000; i++) {
    int32_t id = (i * 7) % 1000;
    nb_data_shard_write(w, &id, 1);
  }
  CHECK_OK(ctx, nb_data_shard_finish(w));
  test_determinism_and_resume(ctx);
  test_pack(ctx);
  test_padded_batch(ctx);
  test_errors_and_empty(ctx);
  test_elastic(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes still allocated", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  tdir_remove();
  return nb_test_summary("data/test_iter");
}
