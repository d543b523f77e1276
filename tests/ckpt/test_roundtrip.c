/* Checkpoint round trips: every dtype, scalars and empty arrays, both
 * restore paths (mmap, read) with and without checksums, metadata and
 * metric, reading the manifest without data, partial restore by item and
 * path, target trees (order, mismatch messages), multi-shard arrays, misuse. */
#include <xxhash.h>

#include "ckpt_test_util.h"

static nb_tree *dtype_tree(nb_ctx *ctx, uint64_t seed) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t d23[2] = {2, 3}, d0[1] = {0}, d30[2] = {3, 0}, big[1] = {20000}, odd[3] = {3, 1, 5};
  for (int k = 0; k < NB_DTYPE_COUNT; k++) {
    nb_dtype dt = (nb_dtype)k;
    struct {
      const char *name;
      int rank;
      const int64_t *dims;
    } shapes[] = {{"scalar", 0, NULL}, {"m", 2, d23}, {"empty", 1, d0}, {"empty2", 2, d30}, {"odd", 3, odd},
                  {"big", 1, big}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      char path[64];
      snprintf(path, sizeof path, "%s/%s", nb_dtype_name(dt), shapes[s].name);
      nb_array *a = pattern_array(ctx, dt, shapes[s].rank, shapes[s].dims, seed + (uint64_t)(k * 10 + (int)s));
      CHECK_OK(ctx, nb_tree_set_array(t, path, a));
      nb_array_release(a);
    }
  }
  return t;
}

static void test_every_dtype(nb_ctx *ctx, const char *dir) {
  nb_ckpt_options o = {.directory = dir};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  CHECK(m != NULL);
  nb_tree *params = dtype_tree(ctx, 1), *other = dtype_tree(ctx, 2);
  nb_ckpt_item items[] = {{"params", params}, {"opt_state", other}};
  nb_ckpt_save_opts so = {.metadata_json = "{\"lr\": 0.001, \"data\": {\"epoch\": 3, \"pos\": 12345}}",
                          .has_metric = true, .metric = 2.5};
  bool saved = false;
  CHECK_OK(ctx, nb_ckpt_save(m, 7, items, 2, &so, &saved));
  CHECK(saved);
  int64_t latest = -2;
  CHECK_OK(ctx, nb_ckpt_latest_step(m, &latest));
  CHECK(latest == 7);
  for (int mode = 0; mode < 4; mode++) {
    nb_ckpt_restore_opts ro = {.no_mmap = mode & 1, .skip_checksums = (mode & 2) != 0};
    nb_tree *r = nb_ckpt_restore(m, NB_CKPT_LATEST, &ro);
    CHECK_MSG(r != NULL, "mode %d: %s", mode, nb_ctx_error(ctx));
    CHECK_MSG(r && item_equal(r, "params", params) && item_equal(r, "opt_state", other), "mode %d", mode);
    CHECK(r && nb_tree_size(r) == nb_tree_size(params) * 2);
    /* mapped arrays are aligned for their dtype and big ones page aligned */
    nb_array *big = r ? nb_tree_get_array(r, "params/f64/big") : NULL;
    CHECK(big && (uintptr_t)nb_array_data(big) % 64 == 0);
    nb_tree_destroy(r);
  }
  nb_ckpt_info *info = nb_ckpt_info_load(m, 7);
  CHECK(info != NULL);
  if (info) {
    CHECK(nb_ckpt_info_step(info) == 7);
    CHECK(nb_ckpt_info_count(info) == 2 * nb_tree_size(params));
    const nb_ckpt_entry *e = nb_ckpt_info_entry(info, 1);
    CHECK(!strcmp(e->item, "params") && !strcmp(e->path, "f32/m") && e->dtype == NB_F32 && e->shape.rank == 2 &&
          e->shape.dims[1] == 3 && e->nbytes == 24 && e->n_shards == 1);
    double metric = 0;
    CHECK(nb_ckpt_info_metric(info, &metric) && metric == 2.5);
    const char *md = nb_ckpt_info_metadata(info);
    CHECK_MSG(md && strstr(md, "\"pos\":12345"), "metadata %s", md ? md : "(null)");
    CHECK(nb_ckpt_info_entry(info, 100000) == NULL);
  }
  nb_ckpt_info_destroy(info);
  CHECK_OK(ctx, nb_ckpt_verify(m, 7));
  nb_tree_destroy(params);
  nb_tree_destroy(other);
  nb_ckpt_manager_destroy(m);
}

static void test_partial_and_target(nb_ctx *ctx, const char *dir) {
  nb_ckpt_options o = {.directory = dir};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_tree *p = nb_tree_create(ctx), *d = nb_tree_create(ctx);
  int64_t d2[2] = {4, 5};
  nb_array *w = pattern_array(ctx, NB_F32, 2, d2, 3), *b = pattern_array(ctx, NB_BF16, 1, d2, 4);
  nb_array *blob = nb_array_create(ctx, NB_U8, 1, (int64_t[]){5}, "abcde");
  nb_tree_set_array(p, "layers/0/w", w);
  nb_tree_set_array(p, "layers/0/b", b);
  nb_tree_set_array(p, "layers/1/w", w);
  nb_tree_set_array(p, "layers/10/w", b);
  nb_tree_set_array(d, "iterator", blob);
  nb_ckpt_item items[] = {{"params", p}, {"data_state", d}};
  CHECK_OK(ctx, nb_ckpt_save(m, 1, items, 2, NULL, NULL));

  const char *only_data[] = {"data_state"};
  nb_ckpt_restore_opts ro = {.items = only_data, .n_items = 1};
  nb_tree *r = nb_ckpt_restore(m, 1, &ro);
  CHECK(r && nb_tree_size(r) == 1 && nb_array_equal(nb_tree_get_array(r, "data_state/iterator"), blob));
  nb_tree_destroy(r);

  const char *paths[] = {"params/layers/1"}; /* not layers/10 */
  ro = (nb_ckpt_restore_opts){.paths = paths, .n_paths = 1};
  r = nb_ckpt_restore(m, 1, &ro);
  CHECK(r && nb_tree_size(r) == 1 && nb_tree_get_array(r, "params/layers/1/w"));
  nb_tree_destroy(r);

  const char *missing[] = {"nope"};
  ro = (nb_ckpt_restore_opts){.items = missing, .n_items = 1};
  CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "no item 'nope'");
  ro = (nb_ckpt_restore_opts){.paths = missing, .n_paths = 1};
  CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "'nope'");

  /* target: its order, its paths only; avals checked */
  nb_tree *target = nb_tree_create(ctx);
  nb_tree_set(target, "params/layers/1/w", nb_leaf_aval(nb_array_aval(w)));
  nb_tree_set_array(target, "params/layers/0/b", b);
  ro = (nb_ckpt_restore_opts){.target = target};
  r = nb_ckpt_restore(m, 1, &ro);
  CHECK(r && nb_tree_size(r) == 2 && !strcmp(nb_tree_path(r, 0), "params/layers/1/w"));
  CHECK(r && nb_array_equal(nb_tree_get_array(r, "params/layers/0/b"), b));
  nb_tree_destroy(r);
  nb_tree_set(target, "params/layers/1/w", nb_leaf_aval(nb_aval_make(NB_F32, 2, (int64_t[]){5, 4})));
  CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "'params/layers/1/w' is f32[4,5] in step 1 but the target wants f32[5,4]");
  nb_tree_set(target, "params/layers/1/w", nb_leaf_aval(nb_aval_make(NB_F16, 2, d2)));
  CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "target wants f16[4,5]");
  nb_tree_remove(target, "params/layers/1/w");
  nb_tree_set(target, "params/layers/2/w", nb_leaf_aval(nb_array_aval(w)));
  CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "target path 'params/layers/2/w'");
  nb_tree_destroy(target);

  /* misuse */
  CHECK(nb_ckpt_save(m, 1, items, 2, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "already saved");
  nb_ckpt_item bad_name[] = {{"../x", p}};
  CHECK(nb_ckpt_save(m, 2, bad_name, 1, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "item name '../x' is invalid");
  nb_ckpt_item twice[] = {{"a", p}, {"a", d}};
  CHECK(nb_ckpt_save(m, 2, twice, 2, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "given twice");
  nb_tree *avals = nb_tree_create(ctx);
  nb_tree_set(avals, "x", nb_leaf_aval(nb_array_aval(w)));
  nb_ckpt_item not_arrays[] = {{"a", avals}};
  CHECK(nb_ckpt_save(m, 2, not_arrays, 1, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "leaf 'x' is not an array");
  nb_ckpt_save_opts bad_json = {.metadata_json = "{oops"};
  CHECK(nb_ckpt_save(m, 2, items, 2, &bad_json, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "not valid JSON");
  CHECK(nb_ckpt_save(m, -3, items, 2, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "negative");
  CHECK(nb_ckpt_restore(m, 99, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "step 99 is not a committed checkpoint");
  size_t n = 0;
  CHECK_OK(ctx, nb_ckpt_all_steps(m, NULL, 0, &n));
  CHECK(n == 1);
  /* an empty save (no items) is a valid checkpoint */
  CHECK_OK(ctx, nb_ckpt_save(m, 3, NULL, 0, NULL, NULL));
  r = nb_ckpt_restore(m, 3, NULL);
  CHECK(r && nb_tree_size(r) == 0);
  nb_tree_destroy(r);
  nb_tree_destroy(avals);
  nb_tree_destroy(p);
  nb_tree_destroy(d);
  nb_array_release(w);
  nb_array_release(b);
  nb_array_release(blob);
  nb_ckpt_manager_destroy(m);
}

/* ---- arrays split into shards (the distributed layout), written by hand ---- */

static void write_sharded_step(const char *root, const char *shards_json, const void *data, size_t n) {
  char dir[4200], path[4300], manifest[4096], commit[256];
  snprintf(dir, sizeof dir, "%s/step_00000005", root);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/w.00001.bin", dir);
  nb_test_write_file(path, data, n);
  int len = snprintf(manifest, sizeof manifest,
                     "{\"format\": \"nabla-checkpoint\", \"version\": 1, \"step\": 5, \"items\": [{\"name\": \"p\", "
                     "\"arrays\": [{\"path\": \"w\", \"dtype\": \"i32\", \"shape\": [4, 3], \"nbytes\": 48, "
                     "\"shards\": %s}]}]}",
                     shards_json);
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  nb_test_write_file(path, manifest, (size_t)len);
  len = snprintf(commit, sizeof commit, "{\"format\": \"nabla-checkpoint\", \"step\": 5, \"manifest_xxh3\": \"%016llx\"}",
                 (unsigned long long)XXH3_64bits(manifest, strlen(manifest)));
  snprintf(path, sizeof path, "%s/COMMIT", dir);
  nb_test_write_file(path, commit, (size_t)len);
}

static void test_sharded_arrays(nb_ctx *ctx, const char *root) {
  /* w = arange(12).reshape(4, 3), split into rows [0,2) and [2,4) x cols
   * [0,1) and [1,3): four blocks stored in one file, in a shuffled order. */
  int32_t w[12], file[12];
  for (int i = 0; i < 12; i++) w[i] = i;
  int32_t b00[2] = {0, 3}, b01[4] = {1, 2, 4, 5}, b10[2] = {6, 9}, b11[4] = {7, 8, 10, 11};
  memcpy(file, b11, 16), memcpy(file + 4, b00, 8), memcpy(file + 6, b10, 8), memcpy(file + 8, b01, 16);
  char shards[2048];
  uint64_t h00 = XXH3_64bits(b00, 8), h01 = XXH3_64bits(b01, 16), h10 = XXH3_64bits(b10, 8), h11 = XXH3_64bits(b11, 16);
  snprintf(shards, sizeof shards,
           "[{\"file\": \"w.00001.bin\", \"offset\": 16, \"nbytes\": 8, \"start\": [0, 0], \"shape\": [2, 1], \"xxh3\": \"%016llx\"},"
           " {\"file\": \"w.00001.bin\", \"offset\": 32, \"nbytes\": 16, \"start\": [0, 1], \"shape\": [2, 2], \"xxh3\": \"%016llx\"},"
           " {\"file\": \"w.00001.bin\", \"offset\": 24, \"nbytes\": 8, \"start\": [2, 0], \"shape\": [2, 1], \"xxh3\": \"%016llx\"},"
           " {\"file\": \"w.00001.bin\", \"offset\": 0, \"nbytes\": 16, \"start\": [2, 1], \"shape\": [2, 2], \"xxh3\": \"%016llx\"}]",
           (unsigned long long)h00, (unsigned long long)h01, (unsigned long long)h10, (unsigned long long)h11);
  write_sharded_step(root, shards, file, sizeof file);
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/step_00000005", root);
  nb_array *want = nb_array_create(ctx, NB_I32, 2, (int64_t[]){4, 3}, w);
  for (int mode = 0; mode < 2; mode++) {
    nb_ckpt_restore_opts ro = {.no_mmap = mode};
    nb_tree *r = nb_ckpt_read_dir(ctx, dir, &ro);
    CHECK_MSG(r && nb_array_equal(nb_tree_get_array(r, "p/w"), want), "mode %d: %s", mode, nb_ctx_error(ctx));
    nb_tree_destroy(r);
  }
  nb_ckpt_info *info = nb_ckpt_info_open(ctx, dir);
  CHECK(info && nb_ckpt_info_entry(info, 0)->n_shards == 4);
  nb_ckpt_info_destroy(info);
  /* a damaged block is named by its shard */
  file[5] ^= 1;
  char path[4300];
  snprintf(path, sizeof path, "%s/w.00001.bin", dir);
  nb_test_write_file(path, file, sizeof file);
  CHECK(nb_ckpt_read_dir(ctx, dir, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "checksum mismatch for array 'p/w' (shard 0)");
  nb_array_release(want);
}


/* Allocation failures at every point of create/save/restore/info/parse:
 * an error (never a crash), and nothing leaked once everything is freed. */
static void test_oom_sweep(nb_ctx *ctx, const char *root) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t d[2] = {3, 4};
  nb_array *a = pattern_array(ctx, NB_F32, 2, d, 1), *b = pattern_array(ctx, NB_BF16, 1, d, 2);
  nb_tree_set_array(t, "a", a);
  nb_tree_set_array(t, "x/b", b);
  nb_array_release(a);
  nb_array_release(b);
  size_t base = nb_ctx_bytes_in_use(ctx);
  char path[4200], st_path[4300];
  snprintf(st_path, sizeof st_path, "%s/oom.safetensors", root);
  CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, st_path, t, NULL, NULL));
  base = nb_ctx_bytes_in_use(ctx);
  int failures = 0;
  for (int64_t n = 1; n < 400; n++) {
    snprintf(path, sizeof path, "%s/oom%lld", root, (long long)n);
    nb_ctx_fail_alloc_after(ctx, n);
    nb_ckpt_options o = {.directory = path, .async = n % 2 == 0};
    nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
    nb_ckpt_item it = {"p", t};
    bool ok = m && nb_ckpt_save(m, 1, &it, 1, NULL, NULL) == NB_OK && nb_ckpt_wait_until_finished(m) == NB_OK;
    nb_tree *r = ok ? nb_ckpt_restore(m, 1, NULL) : NULL;
    nb_ckpt_info *info = r ? nb_ckpt_info_load(m, 1) : NULL;
    nb_tree *st = info ? nb_ckpt_safetensors_load(ctx, st_path, NULL, NULL) : NULL;
    ok = st != NULL;
    nb_ctx_fail_alloc_after(ctx, 0);
    if (ok) CHECK(item_equal(r, "p", t) && trees_equal(st, t));
    nb_ckpt_manager_destroy(m);
    nb_tree_destroy(r);
    nb_tree_destroy(st);
    nb_ckpt_info_destroy(info);
    nb_ctx_fail_alloc_after(ctx, 0);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "n=%lld: %zu bytes leaked", (long long)n, nb_ctx_bytes_in_use(ctx) - base);
    nb_ctx_clear_error(ctx);
    if (ok) break;
    failures++;
  }
  CHECK_MSG(failures > 20, "only %d allocation failures injected", failures);
  nb_tree_destroy(t);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "rt");
  test_every_dtype(ctx, dir);
  nb_test_rm_rf(dir);
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "partial");
  test_partial_and_target(ctx, dir);
  nb_test_rm_rf(dir);
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "oom");
  test_oom_sweep(ctx, dir);
  nb_test_rm_rf(dir);
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "shards");
  test_sharded_arrays(ctx, dir);
  nb_test_rm_rf(dir);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_roundtrip");
}
