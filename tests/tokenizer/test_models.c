/* Unigram and WordPiece models, Unicode normalizers, post-processors and
 * SentencePiece normalizer_specs on small hand-made files whose results can
 * be worked out by hand; and their bad-file errors (file and field named).
 * test_golden.c checks the same code against the reference libraries. */
#include <stdarg.h>

#include "test.h"

static nb_tok *load_json(nb_ctx *ctx, const char *json) {
  nb_tok *t = nb_tok_load_hf_string(ctx, json, strlen(json), "m/tokenizer.json");
  CHECK_MSG(t != NULL, "%s\n  for %s", nb_ctx_error(ctx), json);
  return t;
}

/* Encodes text and compares with the n ids that follow. */
static void expect_ids(nb_ctx *ctx, nb_tok *t, const char *text, bool special, int n, ...) {
  if (!t) return;
  nb_tok_ids ids = {0};
  nb_tok_encode_opts o = {.add_special_tokens = special};
  CHECK_OK(ctx, nb_tok_encode(t, text, strlen(text), &o, &ids));
  va_list ap;
  va_start(ap, n);
  bool same = (int)ids.len == n;
  for (int i = 0; i < n; i++) {
    int want = va_arg(ap, int);
    same = same && ids.ids[i] == want;
  }
  va_end(ap);
  if (!same) {
    fprintf(stderr, "'%s' gave", text);
    for (size_t i = 0; i < ids.len; i++) fprintf(stderr, " %d", ids.ids[i]);
    fprintf(stderr, "\n");
  }
  CHECK_MSG(same, "ids of '%s'", text);
  nb_tok_ids_free(t, &ids);
}

static void expect_decode(nb_ctx *ctx, nb_tok *t, const char *want, int n, const int32_t *ids) {
  if (!t) return;
  nb_tok_text out = {0};
  CHECK_OK(ctx, nb_tok_decode(t, ids, (size_t)n, NULL, &out));
  CHECK_MSG(out.data && !strcmp(out.data, want), "decoded '%s', wanted '%s'", out.data, want);
  nb_tok_text_free(t, &out);
}

static void expect_load_error(nb_ctx *ctx, const char *json, nb_status st, const char *needle) {
  nb_tok *t = nb_tok_load_hf_string(ctx, json, strlen(json), "m/tokenizer.json");
  CHECK_MSG(t == NULL, "loaded: %s", json);
  nb_tok_destroy(t);
  CHECK_ERR(ctx, st, needle);
}

static void test_unigram(nb_ctx *ctx) {
  nb_tok *t = load_json(ctx, "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], [\"a\", -1], "
                             "[\"b\", -2], [\"ab\", -2.5], [\"abc\", -10], [\"c\", -3], [\"aa\", -2]]}}");
  expect_ids(ctx, t, "abc", false, 2, 3, 5);       /* ab + c (-5.5) beats a + b + c (-6) and abc (-10) */
  expect_ids(ctx, t, "abxyc", false, 3, 3, 0, 5);  /* x and y: one fused <unk> */
  expect_ids(ctx, t, "aaa", false, 2, 1, 6);       /* a+aa, aa+a and a+a+a tie at -3: the first found stays */
  nb_tok_destroy(t);
  /* no unk token: an unknown character is an error, not a silent drop */
  t = load_json(ctx, "{\"model\": {\"type\": \"Unigram\", \"unk_id\": null, \"vocab\": [[\"a\", -1]]}}");
  if (t) {
    nb_tok_ids ids = {0};
    CHECK(nb_tok_encode(t, "ax", 2, NULL, &ids) == NB_ERR_INVALID_ARG && ids.len == 0);
    CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "Unigram model has no unk token for 'x'");
    nb_tok_ids_free(t, &ids);
  }
  nb_tok_destroy(t);
  expect_load_error(ctx, "{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", NB_ERR_FORMAT,
                    "m/tokenizer.json: model.vocab: must be a non-empty array of [token, score] pairs");
  expect_load_error(ctx, "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1], [\"b\"]]}}", NB_ERR_FORMAT,
                    "m/tokenizer.json: model.vocab[1]: must be a [token, finite score] pair");
  expect_load_error(ctx, "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 5, \"vocab\": [[\"a\", -1]]}}", NB_ERR_FORMAT,
                    "m/tokenizer.json: model.unk_id: must be the index of a model.vocab entry");
}

static void test_wordpiece(nb_ctx *ctx) {
  const char *wp = "{\"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": true},"
                   " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, \"decoder\": {\"type\": \"WordPiece\"},"
                   " \"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 6], \"sep\": [\"[SEP]\", 7]},"
                   " \"model\": {\"type\": \"WordPiece\", \"max_input_chars_per_word\": 9, \"vocab\": {\"[UNK]\": 0, \"un\": 1,"
                   " \"##aff\": 2, \"##able\": 3, \"a\": 4, \"##a\": 5, \"[CLS]\": 6, \"[SEP]\": 7, \"e\": 8, \".\": 9, \"\xe4\xb8\xad\": 10}}}";
  nb_tok *t = load_json(ctx, wp);
  expect_ids(ctx, t, "UnAffable", false, 3, 1, 2, 3); /* lowercased, then longest first */
  expect_ids(ctx, t, "unaffable", true, 5, 6, 1, 2, 3, 7);
  expect_ids(ctx, t, "unaffablea", false, 1, 0);    /* 10 characters > max_input_chars_per_word */
  expect_ids(ctx, t, "unx a", false, 2, 0, 4);      /* one bad position: the whole word is [UNK] */
  expect_ids(ctx, t, "a.a\t\xc3\xa9\x01 \xe4\xb8\xad\xe4\xb8\xad", false, 6, 4, 9, 4, 8, 10, 10);
  static const int32_t ids[] = {1, 2, 3, 4, 9, 4, 5};
  expect_decode(ctx, t, "unaffable a. aa", 7, ids); /* "##" joins, " ." is cleaned up */
  nb_tok_destroy(t);
  expect_load_error(ctx, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", NB_ERR_FORMAT,
                    "m/tokenizer.json: model.unk_token: is not in the vocabulary");
  expect_load_error(ctx, "{\"model\": {\"type\": \"WordPiece\", \"max_input_chars_per_word\": -1, \"vocab\": {\"[UNK]\": 0}}}",
                    NB_ERR_FORMAT, "m/tokenizer.json: model.max_input_chars_per_word: must be an integer");
  expect_load_error(ctx, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[UNK]\": 0}}}",
                    NB_ERR_UNIMPLEMENTED, "m/tokenizer.json: model: a WordPiece model with a ByteLevel pre-tokenizer");
}

static void test_normalizers(nb_ctx *ctx) {
  /* char-level BPE without merges: one id per character */
#define NORM_JSON(norm) "{\"normalizer\": " norm ", \"model\": {\"type\": \"BPE\", \"unk_token\": \"?\", \"byte_fallback\": true, \"merges\": [],"  \
                        " \"vocab\": {\"?\": 0, \"e\": 1, \"\xc3\xa9\": 2, \"\xcc\x81\": 3, \"i\": 4, \"\xcc\x87\": 5, \"f\": 6, \"<0xFF>\": 7}}}"
  nb_tok *t = load_json(ctx, NORM_JSON("{\"type\": \"NFC\"}"));
  expect_ids(ctx, t, "e\xcc\x81\xff", false, 2, 2, 7); /* composed; the invalid byte passes through to byte fallback */
  nb_tok_destroy(t);
  t = load_json(ctx, NORM_JSON("{\"type\": \"NFD\"}"));
  expect_ids(ctx, t, "\xc3\xa9", false, 2, 1, 3);
  nb_tok_destroy(t);
  t = load_json(ctx, NORM_JSON("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"}]}"));
  expect_ids(ctx, t, "\xef\xac\x80\xc3\x89\xc4\xb0", false, 5, 6, 6, 2, 4, 5); /* ff ligature, É, İ -> i + U+0307 */
  nb_tok_destroy(t);
  t = load_json(ctx, NORM_JSON("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}, {\"type\": \"StripAccents\"}]}"));
  expect_ids(ctx, t, "\xc3\xa9\xc3\xa9", false, 2, 1, 1);
  nb_tok_destroy(t);
#undef NORM_JSON
}

static void test_post_processors(nb_ctx *ctx) {
  const char *bpe = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"<s>\": 1, \"</s>\": 2, \"x\": 3, \"y\": 4}, \"merges\": []}";
  char buf[1024];
  /* a later processor wraps the earlier: x <s> A </s> y */
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"TemplateProcessing\","
           " \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}, {\"SpecialToken\": {\"id\": \"</s>\"}}],"
           " \"special_tokens\": {\"<s>\": {\"ids\": [1]}, \"</s>\": {\"ids\": [2]}}}, {\"type\": \"ByteLevel\"},"
           " {\"type\": \"RobertaProcessing\", \"cls\": [\"x\", 3], \"sep\": [\"y\", 4]}]}, %s}", bpe);
  nb_tok *t = load_json(ctx, buf);
  expect_ids(ctx, t, "aa", true, 6, 3, 1, 0, 0, 2, 4);
  expect_ids(ctx, t, "aa", false, 2, 0, 0);
  expect_ids(ctx, t, "", true, 4, 3, 1, 2, 4);
  nb_tok_destroy(t);
}

/* ---- SentencePiece ModelProto bytes, written by hand ---- */

typedef struct pbw {
  uint8_t b[4096];
  size_t n;
} pbw;

static void varint(pbw *w, uint64_t v) {
  do {
    w->b[w->n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
    v >>= 7;
  } while (v);
}
static void field_bytes(pbw *w, int f, const void *p, size_t n) {
  varint(w, (uint64_t)f << 3 | 2);
  varint(w, n);
  memcpy(w->b + w->n, p, n);
  w->n += n;
}
static void field_int(pbw *w, int f, uint64_t v) {
  varint(w, (uint64_t)f << 3);
  varint(w, v);
}
static void piece(pbw *w, const char *text, float score, int type) {
  pbw p = {.n = 0};
  field_bytes(&p, 1, text, strlen(text));
  uint32_t u;
  memcpy(&u, &score, 4);
  varint(&p, 2 << 3 | 5);
  memcpy(p.b + p.n, &u, 4);
  p.n += 4;
  field_int(&p, 3, (uint64_t)type);
  field_bytes(w, 1, p.b, p.n);
}

/* A Unigram model: <unk>, "▁a", "a", "b", "▁"; normalizer_spec from args. */
static nb_tok *spm_unigram(nb_ctx *ctx, const void *charsmap, size_t cm_len, bool remove_extra) {
  pbw w = {.n = 0}, ts = {.n = 0}, ns = {.n = 0};
  piece(&w, "<unk>", 0, 2);
  piece(&w, "\xe2\x96\x81" "a", -1, 1);
  piece(&w, "a", -2, 1);
  piece(&w, "b", -3, 1);
  piece(&w, "\xe2\x96\x81", -4, 1);
  field_int(&ts, 3, 1); /* model_type UNIGRAM */
  field_bytes(&w, 2, ts.b, ts.n);
  if (cm_len) field_bytes(&ns, 2, charsmap, cm_len);
  field_int(&ns, 4, remove_extra);
  field_bytes(&w, 3, ns.b, ns.n);
  return nb_tok_load_sentencepiece_bytes(ctx, w.b, w.n, "u.model");
}

static void test_spm(nb_ctx *ctx) {
  nb_tok *t = spm_unigram(ctx, NULL, 0, true);
  CHECK_MSG(t != NULL, "%s", nb_ctx_error(ctx));
  expect_ids(ctx, t, "ab", false, 2, 1, 3);                 /* ▁a + b (-4) beats ▁ + a + b (-9) */
  expect_ids(ctx, t, "  ab   ab  ", false, 4, 1, 3, 1, 3); /* extra whitespace removed */
  expect_ids(ctx, t, "cc", false, 2, 4, 0);                /* ▁ then one fused <unk> (score -4 - 10 each) */
  static const int32_t ids[] = {0, 1, 3, 0};
  expect_decode(ctx, t, " \xe2\x81\x87  ab \xe2\x81\x87 ", 4, ids); /* <unk> decodes to " ⁇ " */
  nb_tok_destroy(t);
  t = spm_unigram(ctx, NULL, 0, false);
  expect_ids(ctx, t, " ab", false, 3, 4, 1, 3);
  nb_tok_destroy(t);
  /* damaged charsmaps: said, with the file and field */
  static const uint8_t too_big[] = {0x40, 0, 0, 0, 1, 2, 3, 4, 0};
  CHECK(!spm_unigram(ctx, too_big, sizeof too_big, true));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "u.model: normalizer_spec.precompiled_charsmap: trie size 64 does not fit its 9 bytes");
  static const uint8_t no_nul[] = {4, 0, 0, 0, 0, 0, 0, 0, 'a'};
  CHECK(!spm_unigram(ctx, no_nul, sizeof no_nul, true));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "u.model: normalizer_spec.precompiled_charsmap: replacement strings not NUL-terminated");
  /* a trie of garbage loads and matches nothing it cannot read */
  static const uint8_t garbage[] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x13, 0x57, 0x9b, 0xdf, 'x', 0};
  t = spm_unigram(ctx, garbage, sizeof garbage, true);
  CHECK_MSG(t != NULL, "%s", nb_ctx_error(ctx));
  if (t) {
    nb_tok_ids out = {0};
    CHECK_OK(ctx, nb_tok_encode(t, "ab\xff", 3, NULL, &out));
    nb_tok_ids_free(t, &out);
  }
  nb_tok_destroy(t);
}

/* Saving must not drop what the writer cannot write (a file that tokenizes differently). */
static void test_save_refuses(nb_ctx *ctx) {
  const char *files[] = {"tests/tokenizer/golden/qwen/tokenizer.json", "tests/tokenizer/golden/qwen/tokenizer_nfkc.json"};
  for (int i = 0; i < 2; i++) {
    nb_tok *t = nb_tok_load(ctx, files[i]);
    CHECK_MSG(t != NULL, "%s", nb_ctx_error(ctx));
    if (!t) continue;
    CHECK(nb_tok_save_hf(t, "/tmp/nabla-test-never-written.json" /* only on a regression */) == NB_ERR_UNIMPLEMENTED);
    CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "nb_tok_save_hf: tokenizers with a normalizer cannot be saved yet");
    nb_tok_destroy(t);
  }
}

/* A vocabulary with a very long token: matching stops where no token
 * continues the text, so a long text costs O(n x match), not O(n x token^2). */
static void test_long_tokens(nb_ctx *ctx) {
  enum { L = 4000 };
  char *json = malloc(2 * L + 512), *text = malloc(L + 1);
  memset(text, 'a', L);
  text[L] = 0;
  for (int wp = 0; wp < 2; wp++) {
    int k = sprintf(json, wp ? "{\"model\": {\"type\": \"WordPiece\", \"max_input_chars_per_word\": 100000, \"vocab\": {\"[UNK]\": 0, \"a\": 1, \"##a\": 2, \""
                             : "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], [\"a\", -1], [\"aa\", -1.5], [\"");
    memset(json + k, 'a', L - 1);
    k += L - 1;
    sprintf(json + k, wp ? "b\": 3}}}" : "b\", -1]]}}");
    nb_tok *t = load_json(ctx, json);
    if (!t) continue;
    nb_tok_ids ids = {0};
    CHECK_OK(ctx, nb_tok_encode(t, text, L, NULL, &ids));
    CHECK_MSG(ids.len == (wp ? L : L / 2), "%s: %zu ids", wp ? "WordPiece" : "Unigram", ids.len);
    nb_tok_ids_free(t, &ids);
    nb_tok_destroy(t);
  }
  free(json);
  free(text);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_long_tokens(ctx);
  test_save_refuses(ctx);
  test_unigram(ctx);
  test_wordpiece(ctx);
  test_normalizers(ctx);
  test_post_processors(ctx);
  test_spm(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("tokenizer/models");
}
