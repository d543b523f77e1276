/* Damaged checkpoints: flipped, truncated and missing data files, damaged
 * manifests and commit markers each give an error naming the file (and the
 * array path for data); the manifest validator rejects every malformed
 * field with a message saying which. */
#include "ckpt/internal.h"
#include "ckpt_test_util.h"

static nb_ckpt_manager *fresh(nb_ctx *ctx, const char *dir, nb_tree **saved) {
  nb_ckpt_options o = {.directory = dir};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_tree *t = nb_tree_create(ctx);
  int64_t d1[1] = {50000}, d2[2] = {3, 4};
  nb_array *a = pattern_array(ctx, NB_F32, 1, d1, 1), *b = pattern_array(ctx, NB_I64, 2, d2, 2);
  nb_tree_set_array(t, "big", a);
  nb_tree_set_array(t, "small", b);
  nb_array_release(a);
  nb_array_release(b);
  nb_ckpt_item it = {"params", t};
  CHECK_OK(ctx, nb_ckpt_save(m, 1, &it, 1, NULL, NULL));
  *saved = t;
  return m;
}

static void test_data_damage(nb_ctx *ctx) {
  char dir[4096], data[4300], cmd[4400];
  nb_tree *t;
  for (int mode = 0; mode < 2; mode++) {
    nb_ckpt_restore_opts ro = {.no_mmap = mode};
    nb_test_scratch_dir(dir, sizeof dir, "ckpt", "damage");
    nb_ckpt_manager *m = fresh(ctx, dir, &t);
    snprintf(data, sizeof data, "%s/step_00000001/params.00000.bin", dir);
    /* a flipped byte in "small" (the last array) */
    nb_test_flip_byte(data, -3);
    CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "params.00000.bin' is damaged: checksum mismatch for array 'params/small'");
    CHECK(nb_ckpt_verify(m, 1) == NB_ERR_FORMAT);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "'params/small'");
    /* unverified restores go through (that is what skipping means) */
    ro.skip_checksums = true;
    nb_tree *r = nb_ckpt_restore(m, 1, &ro);
    CHECK(r && nb_array_equal(nb_tree_get_array(r, "params/big"), nb_tree_get_array(t, "big")));
    CHECK(r && !nb_array_equal(nb_tree_get_array(r, "params/small"), nb_tree_get_array(t, "small")));
    nb_tree_destroy(r);
    ro.skip_checksums = false;
    /* a partial restore that avoids the damaged array works */
    const char *paths[] = {"params/big"};
    ro.paths = paths, ro.n_paths = 1;
    r = nb_ckpt_restore(m, 1, &ro);
    CHECK(r && nb_tree_size(r) == 1);
    nb_tree_destroy(r);
    ro.paths = NULL, ro.n_paths = 0;
    /* truncated: cut into "small" */
    snprintf(cmd, sizeof cmd, "truncate -s -40 '%s'", data);
    CHECK(system(cmd) == 0);
    CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "is truncated: array 'params/small' needs bytes");
    /* missing */
    unlink(data);
    CHECK(nb_ckpt_restore(m, 1, &ro) == NULL);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "params.00000.bin");
    nb_ckpt_manager_destroy(m);
    nb_tree_destroy(t);
    nb_test_rm_rf(dir);
  }
}

static void test_manifest_damage(nb_ctx *ctx) {
  char dir[4096], path[4300];
  nb_tree *t;
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "mdamage");
  nb_ckpt_manager *m = fresh(ctx, dir, &t);
  snprintf(path, sizeof path, "%s/step_00000001/manifest.json", dir);
  nb_test_flip_byte(path, 40);
  CHECK(nb_ckpt_restore(m, 1, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "manifest.json' is damaged: its checksum differs from the commit marker's");
  CHECK(nb_ckpt_info_load(m, 1) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "manifest.json' is damaged");
  unlink(path);
  CHECK(nb_ckpt_restore(m, 1, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "manifest.json' is missing");
  snprintf(path, sizeof path, "%s/step_00000001/COMMIT", dir);
  nb_test_write_file(path, "{\"format\": \"nabla-checkpoint\", \"step\": 1}", 41);
  CHECK(nb_ckpt_restore(m, 1, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "commit marker");
  unlink(path);
  CHECK(nb_ckpt_restore(m, 1, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "has no commit marker");
  nb_ckpt_manager_destroy(m);
  nb_tree_destroy(t);
  nb_test_rm_rf(dir);
}

/* A valid manifest with one field replaced: (field text, replacement,
 * expected message fragment). */
static const char *good =
    "{\"format\": \"nabla-checkpoint\", \"version\": 1, \"step\": 3, \"metric\": 1.5, \"metadata\": {\"a\": [1]},"
    " \"items\": [{\"name\": \"params\", \"arrays\": [{\"path\": \"l/w\", \"dtype\": \"bf16\", \"shape\": [2, 3],"
    " \"nbytes\": 12, \"shards\": [{\"file\": \"params.00000.bin\", \"offset\": 64, \"nbytes\": 12, \"start\": [0, 0],"
    " \"shape\": [2, 3], \"xxh3\": \"0123456789abcdef\"}]}]}]}";

static void test_manifest_validation(nb_ctx *ctx) {
  nb_ckpt_info *info = nb_ckpt__manifest_parse(ctx, good, strlen(good), "m.json");
  CHECK_MSG(info != NULL, "%s", nb_ctx_error(ctx));
  if (info) {
    const nb_ckpt_entry *e = nb_ckpt_info_entry(info, 0);
    CHECK(e->dtype == NB_BF16 && e->nbytes == 12 && !strcmp(e->path, "l/w") && info->arrays[0].shards[0].xxh3 == 0x0123456789abcdefull);
    nb_ckpt_info_destroy(info);
  }
  static const struct {
    const char *from, *to, *msg;
  } cases[] = {
      {"\"nabla-checkpoint\"", "\"orbax\"", "'format'"},
      {"\"version\": 1", "\"version\": 2", "written by a newer nabla"},
      {"\"step\": 3", "\"step\": -3", "'step' must be an integer"},
      {"\"step\": 3", "\"step\": 3.5", "'step' must be an integer"},
      {"\"metric\": 1.5", "\"metric\": \"x\"", "'metric' must be a number"},
      {"\"items\": [", "\"items\": {\"x\": [", "not valid JSON"},
      {"\"name\": \"params\"", "\"name\": \"../p\"", "item 'name'"},
      {"\"path\": \"l/w\"", "\"path\": \"l//w\"", "'path' must be a tree path"},
      {"\"dtype\": \"bf16\"", "\"dtype\": \"f8\"", "unknown 'dtype'"},
      {"\"shape\": [2, 3],", "\"shape\": [2, -3],", "'shape'[1] must be an integer"},
      {"\"shape\": [2, 3],", "\"shape\": [1,1,1,1,1,1,1,1,1],", "at most 8"},
      {"\"nbytes\": 12, \"shards\"", "\"nbytes\": 13, \"shards\"", "'nbytes' does not match"},
      {"\"shape\": [2, 3],", "\"shape\": [4000000000, 4000000000, 4000000000],", "'nbytes' does not match"},
      {"\"file\": \"params.00000.bin\"", "\"file\": \"../etc/passwd\"", "plain file name"},
      {"\"file\": \"params.00000.bin\"", "\"file\": \".hidden\"", "plain file name"},
      {"\"offset\": 64", "\"offset\": 63", "not aligned"},
      {"\"offset\": 64", "\"offset\": 1e300", "'offset' must be an integer"},
      {"\"start\": [0, 0]", "\"start\": [1, 0]", "exceeds the array's shape"},
      {"\"start\": [0, 0]", "\"start\": [0]", "rank differs"},
      {"\"xxh3\": \"0123456789abcdef\"", "\"xxh3\": \"0123\"", "'xxh3'"},
      {"\"shards\": [{", "\"shards\": [], \"x\": [{", "'shards' must be a non-empty array"},
      {"\"nbytes\": 12, \"start\"", "\"nbytes\": 4, \"start\"", "shard 'nbytes' does not match"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char text[2048];
    const char *at = strstr(good, cases[i].from);
    CHECK_MSG(at != NULL, "case %zu", i);
    if (!at) continue;
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, cases[i].to, at + strlen(cases[i].from));
    nb_ckpt_info *bad = nb_ckpt__manifest_parse(ctx, text, strlen(text), "m.json");
    CHECK_MSG(bad == NULL, "case %zu accepted", i);
    nb_ckpt_info_destroy(bad);
    CHECK_MSG(strstr(nb_ctx_error(ctx), cases[i].msg) && strstr(nb_ctx_error(ctx), "m.json"), "case %zu: '%s'", i,
              nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
  }
  /* shards: overlapping, or not covering the array */
#define TWO_SHARDS \
      "{\"format\": \"nabla-checkpoint\", \"version\": 1, \"step\": 0, \"items\": [{\"name\": \"p\", \"arrays\": [{\"path\":" \
      " \"w\", \"dtype\": \"u8\", \"shape\": [4], \"nbytes\": 4, \"shards\": [{\"file\": \"a\", \"offset\": 0, \"nbytes\": 2," \
      " \"start\": [0], \"shape\": [2], \"xxh3\": \"0000000000000000\"}, {\"file\": \"a\", \"offset\": 2, \"nbytes\": 2, " \
      "\"start\": [%d], \"shape\": [2], \"xxh3\": \"0000000000000000\"}]}, {\"path\": \"%s\", \"dtype\": \"u8\", \"shape\": []," \
      " \"nbytes\": 1, \"shards\": [{\"file\": \"a\", \"offset\": 9, \"nbytes\": 1, \"start\": [], \"shape\": [], \"xxh3\": " \
      "\"0000000000000000\"}]}]}]}"
  struct {
    int start;
    const char *second, *msg;
  } shard_cases[] = {{2, "v", NULL}, {1, "v", "shards overlap"}, {2, "w", "path given twice"}, {3, "v", "exceeds"}};
  for (size_t i = 0; i < 4; i++) {
    char text[2048];
    snprintf(text, sizeof text, TWO_SHARDS, shard_cases[i].start, shard_cases[i].second);
    nb_ckpt_info *info2 = nb_ckpt__manifest_parse(ctx, text, strlen(text), "m.json");
    CHECK_MSG((info2 != NULL) == (shard_cases[i].msg == NULL), "shard case %zu: %s", i, nb_ctx_error(ctx));
    if (shard_cases[i].msg) CHECK_ERR(ctx, NB_ERR_FORMAT, shard_cases[i].msg);
    nb_ckpt_info_destroy(info2);
  }
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_data_damage(ctx);
  test_manifest_damage(ctx);
  test_manifest_validation(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_corrupt");
}
