/* GGUF: a golden file written by ggml's gguf-py (make_gguf_goldens.py) reads
 * with every metadata type; nabla's block codecs match gguf-py's quants bit
 * for bit (encode F16/BF16/Q8_0/Q4_0, decode those and Q4_K/Q6_K); files
 * nabla writes read back; and every malformed field of a hand-built file is
 * refused with a message naming it (truncation at every length, magic,
 * version, counts, lengths, types, dims, offsets, overlaps, UTF-8, alignment,
 * nesting). */
#include "ckpt_test_util.h"

/* ---- the golden file ------------------------------------------------------------- */

static bool bits_equal(const float *a, const float *b, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], 4)) {
      fprintf(stderr, "%s: element %lld: %.9g vs %.9g\n", what, (long long)i, a[i], b[i]);
      return false;
    }
  return true;
}

static void check_metadata(nb_ctx *ctx, nb_gguf *g) {
  int64_t i;
  double f;
  bool b;
  const char *s;
  size_t n;
  CHECK(nb_gguf_version(g) == 3);
  CHECK(nb_gguf_alignment(g) == 64);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.u8", &i)); CHECK(i == 200);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.i8", &i)); CHECK(i == -100);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.u16", &i)); CHECK(i == 60000);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.i16", &i)); CHECK(i == -30000);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.u32", &i)); CHECK(i == 4000000000LL);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.i32", &i)); CHECK(i == -2000000000LL);
  CHECK_OK(ctx, nb_gguf_get_int(g, "t.i64", &i)); CHECK(i == -(1LL << 62));
  CHECK(nb_gguf_get(g, "t.u64") && nb_gguf_get(g, "t.u64")->u == (1ULL << 63) + 5);
  CHECK(nb_gguf_get_int(g, "t.u64", &i) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "beyond int64");
  CHECK_OK(ctx, nb_gguf_get_float(g, "t.f32", &f)); CHECK(f == 0.15625);
  CHECK_OK(ctx, nb_gguf_get_float(g, "t.f64", &f)); CHECK(f == -2.5e-300);
  CHECK_OK(ctx, nb_gguf_get_bool(g, "t.bool", &b)); CHECK(b);
  CHECK_OK(ctx, nb_gguf_get_string(g, "t.str", &s, &n)); CHECK(n == 6 && !memcmp(s, "h\xc3\xa9llo", 6));
  CHECK_OK(ctx, nb_gguf_get_string(g, "general.architecture", &s, &n)); CHECK(n == 10 && !memcmp(s, "nabla-test", 10));
  CHECK(nb_gguf_get_string(g, "t.u8", &s, &n) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "key 't.u8' is a UINT8, expected a string");
  CHECK(nb_gguf_get_int(g, "no.such", &i) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "key 'no.such' is missing");
  const nb_gguf_value *v = nb_gguf_get(g, "t.strs");
  CHECK(v && v->type == NB_GGUF_ARRAY && v->elem == NB_GGUF_STRING && v->n == 3);
  if (v && v->n == 3) CHECK(v->items[0].len == 1 && v->items[1].len == 0 && v->items[2].len == 2 && !memcmp(v->items[2].str, "\xc3\xb1", 2));
  v = nb_gguf_get(g, "t.nested");
  CHECK(v && v->elem == NB_GGUF_ARRAY && v->n == 3);
  if (v && v->n == 3) {
    CHECK(v->items[0].elem == NB_GGUF_INT32 && v->items[0].n == 2 && nb_gguf_array_i64(&v->items[0], 1) == 2);
    CHECK(v->items[2].n == 3 && nb_gguf_array_i64(&v->items[2], 0) == -4 && nb_gguf_array_i64(&v->items[2], 2) == 6);
  }
  v = nb_gguf_get(g, "t.f32s");
  CHECK(v && v->elem == NB_GGUF_FLOAT32 && v->n == 2 && nb_gguf_array_f64(v, 1) == -1.25);
}

static nb_array *tensor(nb_gguf *g, const char *prefix, const char *type) {
  char name[64];
  snprintf(name, sizeof name, "%s.%s", prefix, type);
  const nb_gguf_tensor *t = nb_gguf_find_tensor(g, name);
  CHECK_MSG(t != NULL, "tensor %s missing", name);
  return t ? nb_gguf_tensor_f32(g, t) : NULL;
}

static void check_codecs(nb_ctx *ctx, nb_gguf *g) {
  static const nb_gguf_type enc_types[] = {NB_GGUF_F16, NB_GGUF_BF16, NB_GGUF_Q8_0, NB_GGUF_Q4_0};
  static const nb_gguf_type dec_types[] = {NB_GGUF_Q4_K, NB_GGUF_Q6_K};
  for (size_t k = 0; k < 6; k++) {
    nb_gguf_type ty = k < 4 ? enc_types[k] : dec_types[k - 4];
    const char *tn = nb_gguf_type_name(ty);
    char name[64];
    snprintf(name, sizeof name, "enc.%s", tn);
    const nb_gguf_tensor *enc = nb_gguf_find_tensor(g, name);
    CHECK_MSG(enc && enc->type == ty && enc->n_dims == 2 && enc->ne[0] == 256 && enc->ne[1] == 2, "%s", name);
    nb_array *dec = tensor(g, "dec", tn), *got = enc ? nb_gguf_tensor_f32(g, enc) : NULL;
    CHECK_MSG(got && nb_array_dims(got)[0] == 2 && nb_array_dims(got)[1] == 256, "%s shape", name);
    if (got && dec) CHECK_MSG(bits_equal(nb_array_data(got), nb_array_data(dec), 512, name), "decode %s", tn);
    if (k < 4 && enc) {
      nb_array *src = tensor(g, "src", tn);
      uint8_t out[2048];
      CHECK_OK(ctx, nb_gguf_encode(ctx, ty, nb_array_data(src), out, 512));
      bool same = !memcmp(out, enc->data, enc->nbytes);
      for (size_t i = 0; !same && i < enc->nbytes; i++)
        if (out[i] != ((const uint8_t *)enc->data)[i]) {
          fprintf(stderr, "encode %s: byte %zu: %02x vs %02x\n", tn, i, out[i], ((const uint8_t *)enc->data)[i]);
          break;
        }
      CHECK_MSG(same, "encode %s is not bit-exact with gguf-py", tn);
      nb_array_release(src);
    }
    nb_array_release(dec);
    nb_array_release(got);
  }
  float x[32] = {0};
  uint8_t o[64];
  CHECK(nb_gguf_encode(ctx, NB_GGUF_Q8_0, x, o, 31) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "not a multiple of the block size 32");
  x[5] = NAN;
  CHECK(nb_gguf_encode(ctx, NB_GGUF_Q8_0, x, o, 32) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "Q8_0: element 5 is nan; quantized blocks hold finite values only");
  CHECK_OK(ctx, nb_gguf_encode(ctx, NB_GGUF_F16, x, o, 32)); /* F16 holds NaN */
  x[5] = 0;
  CHECK(nb_gguf_encode(ctx, NB_GGUF_Q5_0, x, o, 32) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "encoding Q5_0");
}

/* K-quant blocks llama.cpp's quantizer wrote (make_gguf_q4k_golden.py):
 * nabla's encoders give the same bytes */
static void test_kquant_golden(nb_ctx *ctx, const char *src) {
  char path[4200];
  snprintf(path, sizeof path, "%s/tests/ckpt/golden/q4k_llamacpp.gguf", src);
  nb_gguf *g = nb_gguf_open(ctx, path);
  CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
  static const struct {
    const char *prefix;
    nb_gguf_type type;
    int bytes;
  } kinds[] = {{"enc.", NB_GGUF_Q4_K, 144}, {"enc6.", NB_GGUF_Q6_K, 210}};
  for (int k = 0; g && k < 2; k++) {
    int tensors = 0, blocks = 0, same = 0;
    size_t np = strlen(kinds[k].prefix);
    for (size_t i = 0; i < nb_gguf_n_tensors(g); i++) {
      const nb_gguf_tensor *enc = nb_gguf_tensor_at(g, i);
      if (strncmp(enc->name, kinds[k].prefix, np)) continue;
      char name[300];
      snprintf(name, sizeof name, "src.%s", enc->name + np);
      const nb_gguf_tensor *t = nb_gguf_find_tensor(g, name);
      CHECK(t && t->type == NB_GGUF_F32 && enc->type == kinds[k].type && t->n_elems == enc->n_elems && t->n_elems <= 1024);
      if (!t || t->n_elems > 1024) continue;
      float x[1024];
      uint8_t out[4 * 210];
      memcpy(x, t->data, (size_t)t->n_elems * 4);
      CHECK_OK(ctx, nb_gguf_encode(ctx, kinds[k].type, x, out, t->n_elems));
      for (int64_t b = 0; b < t->n_elems / 256; b++, blocks++) {
        bool eq = !memcmp(out + kinds[k].bytes * b, (const uint8_t *)enc->data + kinds[k].bytes * b, (size_t)kinds[k].bytes);
        same += eq;
        if (!eq) fprintf(stderr, "%s block %lld differs from llama.cpp's\n", enc->name, (long long)b);
      }
      tensors++;
    }
    printf("%s: %d of %d blocks (%d tensors) equal llama.cpp's\n", nb_gguf_type_name(kinds[k].type), same, blocks, tensors);
    CHECK(tensors == 9 && blocks == 36 && same == blocks);
  }
  nb_gguf_close(g);
}

static void test_golden(nb_ctx *ctx, const char *src) {
  char path[4200];
  snprintf(path, sizeof path, "%s/tests/ckpt/golden/codecs.gguf", src);
  nb_gguf *g = nb_gguf_open(ctx, path);
  CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
  if (!g) return;
  check_metadata(ctx, g);
  check_codecs(ctx, g);
  nb_gguf_close(g);
}

/* ---- nabla's own files read back --------------------------------------------------- */

static void test_roundtrip(nb_ctx *ctx, const char *tmp) {
  char path[4200];
  snprintf(path, sizeof path, "%s/rt.gguf", tmp);
  nb_gguf_writer *w = nb_gguf_writer_create(ctx);
  const char *strs[] = {"x", "yz"};
  float fs[] = {1.5f, -2};
  int32_t is[] = {7, -8, 9};
  CHECK_OK(ctx, nb_gguf_write_string(w, "general.architecture", "llama", 5));
  CHECK_OK(ctx, nb_gguf_write_u32(w, "a.u32", 77));
  CHECK_OK(ctx, nb_gguf_write_i32(w, "a.i32", -5));
  CHECK_OK(ctx, nb_gguf_write_f32(w, "a.f32", 0.25f));
  CHECK_OK(ctx, nb_gguf_write_bool(w, "a.bool", true));
  CHECK_OK(ctx, nb_gguf_write_strings(w, "a.strs", strs, NULL, 2));
  CHECK_OK(ctx, nb_gguf_write_f32s(w, "a.f32s", fs, 2));
  CHECK_OK(ctx, nb_gguf_write_i32s(w, "a.i32s", is, 3));
  CHECK(nb_gguf_write_u32(w, "a.u32", 1) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "written twice");
  nb_test_rng rng = {42};
  static const nb_gguf_type ts[] = {NB_GGUF_F32, NB_GGUF_F16, NB_GGUF_BF16, NB_GGUF_Q8_0, NB_GGUF_Q4_0};
  nb_array *x[5];
  for (int k = 0; k < 5; k++) {
    int64_t dims[3] = {2, 3, 64};
    x[k] = nb_array_empty(ctx, NB_F32, 3, dims);
    float *p = nb_array_data_mut(x[k]);
    for (int i = 0; i < 384; i++) p[i] = (float)nb_test_normal(&rng);
    char name[32];
    snprintf(name, sizeof name, "t.%s", nb_gguf_type_name(ts[k]));
    CHECK_OK(ctx, nb_gguf_write_tensor(w, name, ts[k], x[k]));
  }
  int64_t odd[1] = {33};
  nb_array *bad = nb_array_empty(ctx, NB_F32, 1, odd);
  CHECK(nb_gguf_write_tensor(w, "odd", NB_GGUF_Q8_0, bad) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "last dim 33 is not a multiple of Q8_0's block of 32");
  nb_array_release(bad);
  int64_t d32[1] = {32};
  bad = nb_array_empty(ctx, NB_F32, 1, d32);
  for (int i = 0; i < 32; i++) ((float *)nb_array_data_mut(bad))[i] = i == 7 ? INFINITY : 1;
  CHECK(nb_gguf_write_tensor(w, "inf", NB_GGUF_Q4_0, bad) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "gguf writer: tensor 'inf': gguf: Q4_0: element 7 is inf");
  nb_array_release(bad);
  CHECK_OK(ctx, nb_gguf_writer_save(w, path));
  nb_gguf_writer_destroy(w);
  nb_gguf *g = nb_gguf_open(ctx, path);
  CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
  if (g) {
    int64_t i;
    const char *s;
    size_t n;
    CHECK_OK(ctx, nb_gguf_get_int(g, "a.u32", &i)); CHECK(i == 77);
    CHECK_OK(ctx, nb_gguf_get_int(g, "a.i32", &i)); CHECK(i == -5);
    CHECK_OK(ctx, nb_gguf_get_string(g, "general.architecture", &s, &n)); CHECK(n == 5);
    const nb_gguf_value *v = nb_gguf_get(g, "a.i32s");
    CHECK(v && v->n == 3 && nb_gguf_array_i64(v, 1) == -8);
    v = nb_gguf_get(g, "a.strs");
    CHECK(v && v->n == 2 && v->items[1].len == 2);
    for (int k = 0; k < 5; k++) {
      const nb_gguf_tensor *t = nb_gguf_tensor_at(g, (size_t)k);
      CHECK(t && t->type == ts[k] && t->n_dims == 3 && t->ne[0] == 64 && t->ne[1] == 3 && t->ne[2] == 2);
      CHECK(t && t->offset % 32 == 0);
      nb_array *y = t ? nb_gguf_tensor_f32(g, t) : NULL;
      /* what encode then decode gives */
      float want[384];
      uint8_t enc[384 * 4];
      nb_gguf_encode(ctx, ts[k], nb_array_data(x[k]), enc, 384);
      nb_gguf_decode(ctx, ts[k], enc, want, 384);
      CHECK(y && nb_array_rank(y) == 3 && bits_equal(nb_array_data(y), want, 384, "roundtrip"));
      if (ts[k] == NB_GGUF_F32) CHECK(y && bits_equal(nb_array_data(y), nb_array_data(x[k]), 384, "f32"));
      nb_array_release(y);
    }
    nb_gguf_close(g);
  }
  for (int k = 0; k < 5; k++) nb_array_release(x[k]);
}

/* ---- hostile files ---------------------------------------------------------------------- */

typedef struct bb {
  uint8_t p[8192];
  size_t n;
} bb;

static void b_le(bb *b, uint64_t v, int n) {
  for (int i = 0; i < n; i++) b->p[b->n++] = (uint8_t)(v >> (8 * i));
}
static void b_str(bb *b, const char *s) {
  b_le(b, strlen(s), 8);
  memcpy(b->p + b->n, s, strlen(s));
  b->n += strlen(s);
}

/* The knobs of the hand-built file; zero = a valid default. */
typedef struct knobs {
  const char *magic;
  uint32_t version;
  uint64_t n_tensors, n_kv;         /* 0: the real counts */
  uint32_t kv_type;                 /* 0: STRING */
  uint64_t str_len;                 /* 0: the real length */
  const char *key;
  uint32_t arr_elem;                /* the array's element type (0: INT32) */
  uint64_t arr_len;
  int nest;                         /* nested array depth of key "n" */
  uint32_t align_type;              /* 0: UINT32 */
  uint32_t align;                   /* 0: no general.alignment key */
  uint8_t bool_val;
  const char *tname;
  uint32_t n_dims;                  /* 0: 2 */
  bool no_dims;                     /* n_dims = 0 */
  uint64_t dim0, dim1;              /* 0: 32, 2 */
  uint32_t ttype;                   /* 0: F32 (tensor w) */
  uint64_t off_w, off_v;            /* offsets of w and v (0, 256 default) */
  bool set_off;
  size_t data_bytes;                /* 0: 512 */
} knobs;

static void build(const knobs *k, bb *b) {
  b->n = 0;
  memcpy(b->p, k->magic ? k->magic : "GGUF", 4), b->n = 4;
  b_le(b, k->version ? k->version : 3, 4);
  b_le(b, k->n_tensors ? k->n_tensors : 2, 8);
  b_le(b, k->n_kv ? k->n_kv : 4u + (k->align ? 1u : 0u) + (k->nest ? 1u : 0u), 8);
  /* kv 0: a string */
  b_str(b, k->key ? k->key : "general.name");
  b_le(b, k->kv_type ? k->kv_type : 8, 4);
  b_le(b, k->str_len ? k->str_len : 4, 8);
  memcpy(b->p + b->n, "tiny", 4), b->n += 4;
  /* kv 1: an array */
  b_str(b, "a.arr");
  b_le(b, 9, 4);
  b_le(b, k->arr_elem ? k->arr_elem : 5, 4);
  b_le(b, k->arr_len ? k->arr_len : 2, 8);
  b_le(b, 1, 4), b_le(b, 2, 4);
  /* kv 2: a bool */
  b_str(b, "a.bool");
  b_le(b, 7, 4);
  b_le(b, k->bool_val, 1);
  /* kv 3: a u64 */
  b_str(b, "a.u64");
  b_le(b, 10, 4);
  b_le(b, 9, 8);
  if (k->align) {
    b_str(b, "general.alignment");
    b_le(b, k->align_type ? k->align_type : 4, 4);
    b_le(b, k->align, 4);
  }
  if (k->nest) {
    b_str(b, "n");
    b_le(b, 9, 4);
    for (int d = 0; d < k->nest; d++) b_le(b, 9, 4), b_le(b, 1, 8);
    b_le(b, 5, 4), b_le(b, 0, 8); /* the innermost: an empty INT32 array */
  }
  /* tensor w: F32 [2, 32]; tensor v: Q8_0 [32] */
  b_str(b, k->tname ? k->tname : "w");
  uint32_t nd = k->no_dims ? 0 : k->n_dims ? k->n_dims : 2;
  b_le(b, nd, 4);
  for (uint32_t d = 0; d < nd && d < 6; d++) b_le(b, d == 0 ? (k->dim0 ? k->dim0 : 32) : d == 1 ? (k->dim1 ? k->dim1 : 2) : 1, 8);
  b_le(b, k->ttype, 4);
  b_le(b, k->set_off ? k->off_w : 0, 8);
  b_str(b, "v");
  b_le(b, 1, 4), b_le(b, 32, 8), b_le(b, 8, 4);
  b_le(b, k->set_off ? k->off_v : 256, 8);
  size_t a = k->align ? k->align : 32;
  if (a <= 4096) while (b->n % a) b->p[b->n++] = 0;
  size_t nd_bytes = k->data_bytes ? k->data_bytes : 512;
  memset(b->p + b->n, 0, nd_bytes);
  b->n += nd_bytes;
}

static void expect_bad(nb_ctx *ctx, const knobs *k, const char *needle) {
  bb b;
  build(k, &b);
  nb_gguf *g = nb_gguf_parse(ctx, b.p, b.n, "m.gguf");
  CHECK_MSG(g == NULL, "accepted a file that should fail with '%s'", needle);
  nb_gguf_close(g);
  CHECK_ERR(ctx, NB_ERR_FORMAT, needle);
}

static void test_hostile(nb_ctx *ctx) {
  bb b;
  knobs ok = {0};
  build(&ok, &b);
  nb_gguf *g = nb_gguf_parse(ctx, b.p, b.n, "m.gguf");
  CHECK_MSG(g && nb_gguf_n_tensors(g) == 2 && nb_gguf_n_kv(g) == 4, "the valid file: %s", nb_ctx_error(ctx));
  size_t end = 0; /* the last tensor byte: what follows is padding */
  for (size_t i = 0; g && i < 2; i++) {
    const nb_gguf_tensor *t = nb_gguf_tensor_at(g, i);
    if (t->offset + t->nbytes > end) end = (size_t)(t->offset + t->nbytes);
  }
  CHECK(end == b.n - 512 + 290);
  nb_gguf_close(g);
  /* every truncation is refused, none reads out of bounds (ASan watches) */
  for (size_t n = 0; n < end; n++) {
    g = nb_gguf_parse(ctx, b.p, n, "m.gguf");
    CHECK_MSG(g == NULL, "truncated to %zu bytes accepted", n);
    nb_gguf_close(g);
    if (nb_ctx_status(ctx) != NB_ERR_FORMAT) CHECK_MSG(0, "truncated to %zu: %s", n, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
  }
  expect_bad(ctx, &(knobs){.magic = "GGML"}, "header: magic is not \"GGUF\"");
  expect_bad(ctx, &(knobs){.version = 1}, "version 1 is not supported (2 and 3 are; version 1 used 32-bit counts)");
  expect_bad(ctx, &(knobs){.version = 0x03000000}, "a big-endian file?");
  expect_bad(ctx, &(knobs){.n_kv = 1ULL << 60}, "metadata count 1152921504606846976 is larger than the file could hold");
  expect_bad(ctx, &(knobs){.n_tensors = 1ULL << 40}, "tensor count 1099511627776 is larger than the file could hold");
  expect_bad(ctx, &(knobs){.n_tensors = 3}, "tensor_infos[2]");
  expect_bad(ctx, &(knobs){.str_len = 1ULL << 62}, "key 'general.name': string value: length 4611686018427387904 exceeds the");
  expect_bad(ctx, &(knobs){.kv_type = 13}, "key 'general.name': value type 13 is unknown");
  expect_bad(ctx, &(knobs){.arr_elem = 99}, "key 'a.arr': array element type 99 is unknown");
  expect_bad(ctx, &(knobs){.arr_len = 1ULL << 61}, "key 'a.arr': array length 2305843009213693952 of INT32");
  expect_bad(ctx, &(knobs){.bool_val = 2}, "key 'a.bool': BOOL value is 2");
  expect_bad(ctx, &(knobs){.nest = 9}, "key 'n': arrays nested deeper than 8");
  expect_bad(ctx, &(knobs){.key = "bad\xff"}, "metadata[0]: key is not valid UTF-8");
  expect_bad(ctx, &(knobs){.key = "a.bool"}, "key 'a.bool': given twice");
  expect_bad(ctx, &(knobs){.align = 48}, "key 'general.alignment': 48 is not a power of two");
  expect_bad(ctx, &(knobs){.align = 64, .align_type = 5}, "key 'general.alignment': is a INT32, expected UINT32");
  expect_bad(ctx, &(knobs){.tname = "w\xc0\x80"}, "tensor_infos[0]: name is not valid UTF-8");
  expect_bad(ctx, &(knobs){.tname = "v"}, "tensor 'v': name given twice");
  expect_bad(ctx, &(knobs){.n_dims = 5}, "tensor 'w': n_dims 5 is not in 1..4");
  expect_bad(ctx, &(knobs){.no_dims = true}, "tensor 'w': n_dims 0 is not in 1..4");
  expect_bad(ctx, &(knobs){.dim0 = 1ULL << 40, .dim1 = 1ULL << 40}, "tensor 'w': the product of the dims overflows int64 at dim 1");
  expect_bad(ctx, &(knobs){.dim0 = 1ULL << 63}, "tensor 'w': dim 0 is 9223372036854775808, beyond int64");
  expect_bad(ctx, &(knobs){.ttype = 4}, "tensor 'w': ggml type 4 is unknown");
  expect_bad(ctx, &(knobs){.ttype = 8, .dim0 = 16}, "tensor 'w': ne[0] = 16 is not a multiple of Q8_0's block of 32");
  expect_bad(ctx, &(knobs){.set_off = true, .off_w = 0, .off_v = 4096},
             "tensor 'v': offset 4096 + 34 bytes beyond the file");
  expect_bad(ctx, &(knobs){.set_off = true, .off_w = 0, .off_v = UINT64_MAX - 31}, "tensor 'v': offset 18446744073709551584 + 34 bytes beyond the file");
  expect_bad(ctx, &(knobs){.set_off = true, .off_w = 0, .off_v = 8}, "tensor 'v': offset 8 is not a multiple of the alignment 32");
  expect_bad(ctx, &(knobs){.set_off = true, .off_w = 0, .off_v = 224}, "overlaps tensor 'w'");
  expect_bad(ctx, &(knobs){.data_bytes = 200}, "tensor 'w': offset 0 + 256 bytes beyond the file");
  /* a known type nabla cannot decode: parses, decoding is refused by name */
  knobs q5 = {.ttype = 6};
  build(&q5, &b);
  g = nb_gguf_parse(ctx, b.p, b.n, "m.gguf");
  CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
  if (g) {
    CHECK(nb_gguf_tensor_f32(g, nb_gguf_tensor_at(g, 0)) == NULL);
    CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "m.gguf: tensor 'w': type Q5_0 cannot be decoded");
    nb_gguf_close(g);
  }
  CHECK(nb_gguf_open(ctx, "/nonexistent/x.gguf") == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "/nonexistent/x.gguf");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  const char *src = getenv("NABLA_SOURCE_DIR") ? getenv("NABLA_SOURCE_DIR") : ".";
  char tmp[4096];
  nb_test_scratch_dir(tmp, sizeof tmp, "ckpt", "gguf");
  test_golden(ctx, src);
  test_kquant_golden(ctx, src);
  test_roundtrip(ctx, tmp);
  test_hostile(ctx);
  nb_test_rm_rf(tmp);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_gguf");
}
