/* Arrays (creation, dtypes, conversions, printing) and trees (lookup, order,
 * selection, map/zip, flatten/unflatten, misuse). */
#include "test.h"

static void test_dtype_conversions(void) {
  /* bf16: round to nearest even on the dropped half */
  CHECK(nb_f32_to_bf16(1.0f) == 0x3f80);
  float x;
  uint32_t u = 0x3f808000u; /* exactly halfway between 0x3f80 and 0x3f81: to even */
  memcpy(&x, &u, 4);
  CHECK(nb_f32_to_bf16(x) == 0x3f80);
  u = 0x3f818000u; /* halfway, odd below: rounds up */
  memcpy(&x, &u, 4);
  CHECK(nb_f32_to_bf16(x) == 0x3f82);
  CHECK(nb_bf16_to_f32(0x3f80) == 1.0f);
  CHECK(isnan(nb_bf16_to_f32(nb_f32_to_bf16(NAN))));
  /* f16: exact values, overflow, subnormals, ties to even */
  CHECK(nb_f32_to_f16(1.0f) == 0x3c00);
  CHECK(nb_f32_to_f16(65504.0f) == 0x7bff);
  CHECK(nb_f32_to_f16(65520.0f) == 0x7c00); /* halfway to 65536 rounds to even: inf */
  CHECK(nb_f32_to_f16(1e6f) == 0x7c00);
  CHECK(nb_f32_to_f16(-2.0f) == 0xc000);
  CHECK(nb_f32_to_f16(5.960464477539063e-08f) == 0x0001); /* smallest subnormal */
  CHECK(nb_f32_to_f16(2.9802322387695312e-08f) == 0x0000); /* half of it: ties to even (0) */
  CHECK(nb_f32_to_f16(8.940696716308594e-08f) == 0x0002); /* 1.5 units: ties to even (2) */
  CHECK(nb_f16_to_f32(0x0001) == 5.960464477539063e-08f);
  CHECK(nb_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(isinf(nb_f16_to_f32(0x7c00)));
  /* every f16 round-trips through f32 */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = nb_f16_to_f32((uint16_t)h);
    if (!isnan(f) && nb_f32_to_f16(f) != h) bad++;
  }
  CHECK_MSG(bad == 0, "%d f16 values do not round-trip", bad);
  nb_dtype t;
  CHECK(nb_dtype_from_name("bfloat16", &t) && t == NB_BF16);
  CHECK(nb_dtype_from_name("i32", &t) && t == NB_I32);
  CHECK(!nb_dtype_from_name("f8", &t));
  /* float -> int saturates and truncates; NaN -> 0 */
  double src[4] = {3.7, -3.7, 1e10, NAN};
  int32_t dst[4];
  nb_convert_elements(NB_I32, dst, NB_F64, src, 4);
  CHECK(dst[0] == 3 && dst[1] == -3 && dst[2] == 2147483647 && dst[3] == 0);
}

static void test_arrays(nb_ctx *ctx) {
  int64_t dims[2] = {2, 3};
  float data[6] = {1, 2, 3, 4, 5, 6};
  nb_array *a = nb_array_create(ctx, NB_F32, 2, dims, data);
  CHECK(a && nb_array_size(a) == 6 && nb_array_nbytes(a) == 24 && nb_array_rank(a) == 2);
  CHECK(((uintptr_t)nb_array_data(a) % 64) == 0);
  CHECK(nb_array_get(a, 4) == 5);
  nb_array *b = nb_array_astype(ctx, a, NB_BF16);
  CHECK(nb_array_dtype(b) == NB_BF16 && nb_array_get(b, 5) == 6);
  nb_array *io = nb_array_iota(ctx, NB_I32, 2, dims, 1);
  CHECK(nb_array_get(io, 0) == 0 && nb_array_get(io, 4) == 1 && nb_array_get(io, 5) == 2);
  nb_array *ar = nb_array_arange(ctx, NB_F64, 0, 1, 0.25);
  CHECK(nb_array_size(ar) == 4 && nb_array_get(ar, 3) == 0.75);
  nb_array *full = nb_array_full(ctx, NB_I64, 2, dims, 7);
  CHECK(nb_array_get(full, 5) == 7);
  float out[6];
  CHECK_OK(ctx, nb_array_copy_out(ctx, a, out, sizeof out));
  CHECK(out[2] == 3);
  CHECK(nb_array_copy_out(ctx, a, out, 5) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "destination holds 5 bytes");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  nb_array_print(a, f);
  fclose(f);
  CHECK_MSG(strcmp(buf, "f32[2,3] [[1, 2, 3], [4, 5, 6]]\n") == 0, "printed '%s'", buf);
  free(buf);
  /* misuse */
  int64_t neg[1] = {-1};
  CHECK(nb_array_zeros(ctx, NB_F32, 1, neg) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "negative dim");
  CHECK(nb_array_zeros(ctx, NB_F32, 9, dims) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "rank 9");
  CHECK(nb_array_iota(ctx, NB_I32, 2, dims, 2) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "axis 2");
  nb_array_release(a);
  nb_array_release(b);
  nb_array_release(io);
  nb_array_release(ar);
  nb_array_release(full);
}

static nb_status double_leaf(void *ud, const char *path, const nb_leaf *in, nb_leaf *out) {
  nb_ctx *ctx = ud;
  nb_array *a = in->array;
  int64_t n = nb_array_size(a);
  nb_array *r = nb_array_empty(ctx, NB_F64, nb_array_rank(a), nb_array_dims(a));
  if (!r) return NB_ERR_NOMEM;
  for (int64_t i = 0; i < n; i++) ((double *)nb_array_data_mut(r))[i] = 2 * nb_array_get(a, i);
  *out = nb_leaf_array(r);
  return NB_OK;
}

static void test_trees(nb_ctx *ctx) {
  nb_tree *t = nb_tree_create(ctx);
  const char *paths[] = {"layers/0/attn/wq", "layers/0/attn/wk", "layers/1/attn/wq", "embed", "layers/10/mlp/w"};
  for (int i = 0; i < 5; i++) {
    nb_array *a = nb_array_full(ctx, NB_F64, 0, NULL, i);
    CHECK_OK(ctx, nb_tree_set_array(t, paths[i], a));
    nb_array_release(a);
  }
  CHECK(nb_tree_size(t) == 5);
  for (int i = 0; i < 5; i++) CHECK(strcmp(nb_tree_path(t, (size_t)i), paths[i]) == 0);
  CHECK(nb_array_get(nb_tree_get_array(t, "embed"), 0) == 3);
  CHECK(nb_tree_find(t, "layers/0") == -1);
  /* replacing keeps the position */
  nb_array *r = nb_array_full(ctx, NB_F64, 0, NULL, 42);
  CHECK_OK(ctx, nb_tree_set_array(t, "layers/0/attn/wk", r));
  nb_array_release(r);
  CHECK(nb_tree_find(t, "layers/0/attn/wk") == 1 && nb_array_get(nb_tree_leaf(t, 1)->array, 0) == 42);
  /* prefix selection: "layers/1" must not select "layers/10" */
  nb_tree *s = nb_tree_select_prefix(t, "layers/1", true);
  CHECK(s && nb_tree_size(s) == 1 && nb_tree_find(s, "attn/wq") == 0);
  nb_tree_destroy(s);
  s = nb_tree_select_regex(t, "attn/w[qk]$");
  CHECK(s && nb_tree_size(s) == 3);
  nb_tree_destroy(s);
  CHECK(nb_tree_select_regex(t, "([") == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "bad path regex");
  /* map, zip, check_same */
  nb_tree *m = nb_tree_map(t, double_leaf, ctx);
  CHECK(m && nb_array_get(nb_tree_get_array(m, "embed"), 0) == 6);
  CHECK_OK(ctx, nb_tree_check_same(ctx, t, m, true, "params and grads"));
  CHECK_OK(ctx, nb_tree_remove(m, "embed"));
  CHECK(nb_tree_find(m, "layers/10/mlp/w") == 3);
  CHECK(nb_tree_check_same(ctx, t, m, false, "params and grads") != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "params and grads differ");
  /* flatten / unflatten */
  nb_leaf leaves[5];
  nb_tree_flatten(t, leaves);
  nb_tree *u = nb_tree_unflatten(t, leaves);
  CHECK(u && nb_tree_size(u) == 5 && nb_tree_get_array(u, "embed") == nb_tree_get_array(t, "embed"));
  nb_tree_destroy(u);
  nb_tree_destroy(m);
  /* bad paths */
  nb_array *z = nb_array_scalar(ctx, NB_F32, 0);
  CHECK(nb_tree_set_array(t, "a//b", z) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "invalid");
  CHECK(nb_tree_set_array(t, "", z) == NB_ERR_INVALID_ARG);
  nb_ctx_clear_error(ctx);
  CHECK(nb_tree_set_array(t, "x", NULL) == NB_ERR_INVALID_ARG);
  nb_ctx_clear_error(ctx);
  nb_array_release(z);
  /* many entries: index growth */
  for (int i = 0; i < 1000; i++) {
    char p[32];
    snprintf(p, sizeof p, "many/%d", i);
    nb_array *a = nb_array_scalar(ctx, NB_I32, i);
    nb_tree_set_array(t, p, a);
    nb_array_release(a);
  }
  CHECK(nb_array_get(nb_tree_get_array(t, "many/777"), 0) == 777);
  nb_tree_destroy(t);
}

static void test_alloc_failures(void) {
  /* Every allocation in building a tree of arrays may fail: no crash, no leak. */
  for (int n = 1; n < 40; n++) {
    nb_ctx *ctx = nb_ctx_create();
    nb_ctx_fail_alloc_after(ctx, n);
    nb_tree *t = nb_tree_create(ctx);
    for (int i = 0; t && i < 5; i++) {
      char p[16];
      snprintf(p, sizeof p, "w%d", i);
      nb_array *a = nb_array_zeros(ctx, NB_F32, 0, NULL);
      if (a) nb_tree_set_array(t, p, a);
      nb_array_release(a);
    }
    nb_tree_destroy(t);
    nb_ctx_fail_alloc_after(ctx, 0);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "n=%d: %zu bytes leaked", n, nb_ctx_bytes_in_use(ctx));
    nb_ctx_destroy(ctx);
  }
}

/* nb_array_transpose2d: every element of every element size lands at [j, i]
 * (sizes past one 32-wide tile on both sides, ragged edges), and misuse is an
 * error naming the function. */
static void test_transpose2d(nb_ctx *ctx) {
  const nb_dtype types[] = {NB_I8, NB_F16, NB_F32, NB_F64};
  int64_t r = 37, c = 70, dims[2] = {r, c};
  for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
    size_t es = nb_dtype_size(types[t]);
    unsigned char *data = malloc((size_t)(r * c) * es);
    for (size_t b = 0; b < (size_t)(r * c) * es; b++) data[b] = (unsigned char)(b * 131 + 7);
    nb_array *x = nb_array_create(ctx, types[t], 2, dims, data);
    nb_array *y = nb_array_transpose2d(ctx, x);
    CHECK(y && nb_array_dims(y)[0] == c && nb_array_dims(y)[1] == r && nb_array_dtype(y) == types[t]);
    int bad = 0;
    for (int64_t i = 0; y && i < r; i++)
      for (int64_t j = 0; j < c; j++)
        bad += memcmp((const char *)nb_array_data(y) + (size_t)(j * r + i) * es, data + (size_t)(i * c + j) * es, es) != 0;
    CHECK_MSG(bad == 0, "%s: %d elements misplaced", nb_dtype_name(types[t]), bad);
    nb_array_release(y);
    nb_array_release(x);
    free(data);
  }
  int64_t d3[3] = {2, 3, 4};
  nb_array *x3 = nb_array_zeros(ctx, NB_F32, 3, d3);
  CHECK(nb_array_transpose2d(ctx, x3) == NULL && strstr(nb_ctx_error(ctx), "nb_array_transpose2d: rank is not 2"));
  nb_array_release(x3);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_dtype_conversions();
  test_arrays(ctx);
  test_trees(ctx);
  test_transpose2d(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes still allocated", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  test_alloc_failures();
  return nb_test_summary("core/array_tree");
}
