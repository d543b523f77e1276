/* Safetensors interop: golden files written by the reference Python package
 * (every dtype, bf16 included; a sharded set with its index) load with the
 * expected values; nabla's files round-trip and, when the package is
 * importable, pass the reference reader; hostile headers (sizes, offsets,
 * overlaps, holes, dtypes, shapes) are rejected with named errors. */
#include "ckpt_test_util.h"

/* Mirrors make_safetensors_goldens.py's TENSORS and value formula. */
static const struct {
  const char *name;
  nb_dtype dtype;
  int rank;
  int64_t dims[3];
} golden[] = {
    {"w.f32", NB_F32, 2, {2, 3}}, {"w.f64", NB_F64, 1, {5}},       {"w.bf16", NB_BF16, 2, {3, 4}},
    {"w.f16", NB_F16, 1, {4}},    {"w.i8", NB_I8, 1, {6}},         {"w.u8", NB_U8, 3, {2, 2, 2}},
    {"w.i32", NB_I32, 1, {3}},    {"w.i64", NB_I64, 2, {2, 2}},    {"w.u32", NB_U32, 1, {4}},
    {"w.bool", NB_BOOL, 1, {5}},  {"scalar", NB_F32, 0, {0}},      {"empty", NB_F32, 1, {0}},
    {"empty2", NB_I32, 2, {2, 0}},
};
#define N_GOLDEN (sizeof golden / sizeof *golden)

static nb_array *expected(nb_ctx *ctx, int k, nb_dtype t, int rank, const int64_t *dims) {
  nb_shape s = nb_shape_make(rank, dims);
  int64_t n = nb_shape_size(&s);
  double v[64];
  for (int64_t i = 0; i < n && i < 64; i++) {
    int64_t base = (7 * i + 3 * k) % 23;
    if (t == NB_BOOL) v[i] = (i + k) % 3 == 0;
    else if (nb_dtype_is_float(t)) v[i] = (double)(base - 11) / 4;
    else if (nb_dtype_is_unsigned(t)) v[i] = (double)base;
    else v[i] = (double)(base - 11);
  }
  return nb_array_from_f64(ctx, t, rank, dims, v);
}

static void path_of(const char *dir, const char *rel, char *buf, size_t cap) { snprintf(buf, cap, "%s/%s", dir, rel); }

static bool check_golden_tree(nb_ctx *ctx, const nb_tree *t, bool hf) {
  bool ok = t && nb_tree_size(t) == N_GOLDEN;
  for (size_t k = 0; ok && k < N_GOLDEN; k++) {
    char name[64];
    snprintf(name, sizeof name, "%s", golden[k].name);
    if (hf) name[strcspn(name, ".")] = name[strcspn(name, ".")] ? '/' : 0;
    nb_array *want = expected(ctx, (int)k, golden[k].dtype, golden[k].rank, golden[k].dims);
    nb_array *got = nb_tree_get_array(t, name);
    ok = got && nb_array_equal(got, want);
    if (!ok) fprintf(stderr, "golden tensor '%s' differs\n", name);
    nb_array_release(want);
  }
  return ok;
}

static void test_goldens(nb_ctx *ctx, const char *src, const char *tmp) {
  char path[4200], out[4200];
  path_of(src, "tests/ckpt/golden/all_dtypes.safetensors", path, sizeof path);
  char *meta = NULL;
  for (int mode = 0; mode < 2; mode++) {
    nb_ckpt_st_opts o = {.no_mmap = mode};
    nb_tree *t = nb_ckpt_safetensors_load(ctx, path, &o, &meta);
    CHECK_MSG(t && check_golden_tree(ctx, t, false), "mode %d: %s", mode, nb_ctx_error(ctx));
    CHECK(meta && strstr(meta, "\"by\":\"goldens\""));
    nb_ckpt_string_free(ctx, meta);
    nb_tree_destroy(t);
  }
  nb_ckpt_st_opts hf = {.hf_names = true};
  nb_tree *t = nb_ckpt_safetensors_load(ctx, path, &hf, NULL);
  CHECK(t && check_golden_tree(ctx, t, true));
  /* save with nabla (dotted names back), reload, compare; then the reference reader */
  path_of(tmp, "nabla.safetensors", out, sizeof out);
  CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, out, t, "{\"format\": \"nabla\"}", &hf));
  nb_tree *back = nb_ckpt_safetensors_load(ctx, out, NULL, &meta);
  CHECK(back && check_golden_tree(ctx, back, false));
  CHECK(meta && !strcmp(meta, "{\"format\":\"nabla\"}"));
  nb_ckpt_string_free(ctx, meta);
  nb_tree_destroy(back);
  /* the file in memory parses the same */
  FILE *f = fopen(out, "rb");
  uint8_t buf[8192];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  back = nb_ckpt_safetensors_parse(ctx, buf, n, NULL, NULL);
  CHECK(back && check_golden_tree(ctx, back, false));
  nb_tree_destroy(back);
  const char *py = getenv("NABLA_PYTHON") ? getenv("NABLA_PYTHON") : "python3";
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "%s -c 'import safetensors, numpy, ml_dtypes' 2>/dev/null", py);
  if (system(cmd) == 0) {
    snprintf(cmd, sizeof cmd, "%s %s/tests/ckpt/make_safetensors_goldens.py --check %s", py, src, out);
    CHECK_MSG(system(cmd) == 0, "the safetensors package rejects nabla's file %s", out);
  } else {
    printf("skipping the reference-reader check: %s cannot import safetensors, numpy, ml_dtypes (set NABLA_PYTHON)\n", py);
  }

  /* sharded: the golden set, via directory, index path; then nabla's own */
  path_of(src, "tests/ckpt/golden/sharded", path, sizeof path);
  for (int via = 0; via < 2; via++) {
    char p[4300];
    snprintf(p, sizeof p, via ? "%s/model.safetensors.index.json" : "%s", path);
    nb_tree *s = nb_ckpt_safetensors_load(ctx, p, &hf, &meta);
    CHECK_MSG(s && nb_tree_size(s) == 4, "%s", nb_ctx_error(ctx));
    CHECK(meta && strstr(meta, "\"total_size\":110"));
    nb_ckpt_string_free(ctx, meta);
    nb_array *w = s ? nb_tree_get_array(s, "model/layers/0/w") : NULL, *want = expected(ctx, 1, NB_BF16, 1, (int64_t[]){3});
    CHECK(w && nb_array_equal(w, want));
    CHECK(s && !strcmp(nb_tree_path(s, 0), "lm_head/weight") && !strcmp(nb_tree_path(s, 1), "model/embed/weight") &&
          !strcmp(nb_tree_path(s, 3), "model/layers/1/w")); /* weight_map order */
    nb_array_release(want);
    nb_tree_destroy(s);
  }
  path_of(tmp, "shards", out, sizeof out);
  CHECK_OK(ctx, nb_ckpt_safetensors_save_sharded(ctx, out, NULL, t, NULL, 64, &hf));
  char idx[4300];
  snprintf(idx, sizeof idx, "%s/model-00004-of-00004.safetensors", out);
  CHECK(access(idx, F_OK) == 0);
  nb_tree *s = nb_ckpt_safetensors_load(ctx, out, &hf, NULL);
  CHECK_MSG(s && trees_equal(s, t), "%s", nb_ctx_error(ctx));
  nb_tree_destroy(s);
  /* told by their bytes, not their names: the index as index.txt, a shard as shard.json */
  const char *renamed[][2] = {{"model.safetensors.index.json", "index.txt"}, {"model-00004-of-00004.safetensors", "shard.json"}};
  for (int k = 0; k < 2; k++) {
    char from[4400], to[4400];
    snprintf(from, sizeof from, "%s/%s", out, renamed[k][0]);
    snprintf(to, sizeof to, "%s/%s", out, renamed[k][1]);
    size_t len = 0;
    char *bytes = nb_test_read_file(from, &len);
    if (bytes) nb_test_write_file(to, bytes, len);
    free(bytes);
    nb_tree *a = nb_ckpt_safetensors_load(ctx, from, &hf, NULL), *b = nb_ckpt_safetensors_load(ctx, to, &hf, NULL);
    CHECK_MSG(a && b && trees_equal(a, b), "%s loaded as %s: %s", renamed[k][0], renamed[k][1], nb_ctx_error(ctx));
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    unlink(to);
  }
  /* an index naming a tensor its file lacks */
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
  const char *bad_index = "{\"weight_map\": {\"w.f32\": \"model-00002-of-00004.safetensors\"}}";
  nb_test_write_file(idx, bad_index, strlen(bad_index));
  CHECK(nb_ckpt_safetensors_load(ctx, out, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "tensor 'w.f32' is not in");
  bad_index = "{\"weight_map\": {\"w.f32\": \"../model-00001-of-00004.safetensors\"}}";
  nb_test_write_file(idx, bad_index, strlen(bad_index));
  CHECK(nb_ckpt_safetensors_load(ctx, out, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "not a plain file name");
  nb_tree_destroy(t);
}

/* ---- hostile headers ------------------------------------------------------- */

static size_t make_file(uint8_t *buf, const char *header, uint64_t claimed_len, size_t data_bytes) {
  size_t n = strlen(header);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(claimed_len >> (8 * i));
  memcpy(buf + 8, header, n);
  memset(buf + 8 + n, 0x3f, data_bytes);
  return 8 + n + data_bytes;
}

static void test_hostile(nb_ctx *ctx) {
  static const struct {
    const char *header;
    size_t data;
    const char *msg;
    nb_status status;
  } cases[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, NULL, NB_OK},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "bytes no tensor covers", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "larger than the file", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, "out of the data section", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "size does not match", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "out of the data section", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
       6, "overlaps", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "a hole precedes", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "dtype F8_E4M3 is not supported", NB_ERR_DTYPE},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "at most 8 dims", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
       "larger than the file", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "not an integer", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "'data_offsets'", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "bytes after its JSON", NB_ERR_FORMAT},
      {"[1,2]", 0, "not a JSON object", NB_ERR_FORMAT},
      {"{\"a\":3}", 0, "not an object", NB_ERR_FORMAT},
      {"{\"__metadata__\":{\"k\":1}}", 0, "values must be strings", NB_ERR_FORMAT},
      {"{\"//\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "not a valid tree path", NB_ERR_FORMAT},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]}}",
       2, "name given twice", NB_ERR_FORMAT},
      {"{}    ", 0, NULL, NB_OK},
  };
  uint8_t buf[1024];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t n = make_file(buf, cases[i].header, strlen(cases[i].header), cases[i].data);
    nb_tree *t = nb_ckpt_safetensors_parse(ctx, buf, n, NULL, NULL);
    CHECK_MSG((t != NULL) == (cases[i].msg == NULL), "case %zu: %s", i, nb_ctx_error(ctx));
    if (cases[i].msg) CHECK_ERR(ctx, cases[i].status, cases[i].msg);
    nb_tree_destroy(t);
  }
  /* the header size itself */
  const char *h = "{}";
  size_t n = make_file(buf, h, 100000001, 0);
  CHECK(nb_ckpt_safetensors_parse(ctx, buf, n, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "exceeds 100 MB");
  n = make_file(buf, h, 3, 0);
  CHECK(nb_ckpt_safetensors_parse(ctx, buf, n, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "exceeds the file");
  CHECK(nb_ckpt_safetensors_parse(ctx, buf, 5, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "shorter than");
  const char *dup = "{\"a.b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
                    "\"a/b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]}}";
  n = make_file(buf, dup, strlen(dup), 2);
  nb_ckpt_st_opts hf = {.hf_names = true};
  CHECK(nb_ckpt_safetensors_parse(ctx, buf, n, &hf, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "name given twice");
  /* misuse on save */
  nb_tree *t = nb_tree_create(ctx);
  nb_array *a = nb_array_scalar(ctx, NB_F32, 1);
  nb_tree_set_array(t, "a.b/c", a);
  CHECK(nb_ckpt_safetensors_save(ctx, "/tmp/unused.safetensors", t, NULL, &hf) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "ambiguous");
  CHECK(nb_ckpt_safetensors_save(ctx, "/tmp/unused.safetensors", t, "{\"a\": 1}", NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "object of string values");
  CHECK(nb_ckpt_safetensors_load(ctx, "/nonexistent/x.safetensors", NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "does not exist");
  nb_array_release(a);
  nb_tree_destroy(t);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  const char *src = getenv("NABLA_SOURCE_DIR") ? getenv("NABLA_SOURCE_DIR") : ".";
  char tmp[4096];
  nb_test_scratch_dir(tmp, sizeof tmp, "ckpt", "st");
  test_goldens(ctx, src, tmp);
  test_hostile(ctx);
  nb_test_rm_rf(tmp);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_safetensors");
}
