/* Tokenizer behaviour beyond the goldens: special-token modes, random byte
 * round trips, long pieces (heap merge) against the short-piece path,
 * malformed and unsupported files with their messages, training (determinism,
 * tie-break, save/reload, and loading by Python `tokenizers` when installed),
 * and allocation-failure injection. */
#include <unistd.h>

#include "test.h"
#include "testfs.h"

#define GOLD "tests/tokenizer/golden/"

static nb_tok *gpt2(nb_ctx *ctx) {
  return nb_tok_load_gpt2(ctx, GOLD "gpt2/vocab.json", GOLD "gpt2/merges.txt", NULL);
}

static bool roundtrip(nb_tok *t, const void *s, size_t n) {
  nb_tok_ids ids = {0};
  nb_tok_text out = {0};
  bool ok = nb_tok_encode(t, s, n, NULL, &ids) == NB_OK && nb_tok_decode(t, ids.ids, ids.len, NULL, &out) == NB_OK &&
            out.len == n && (n == 0 || !memcmp(out.data, s, n));
  nb_tok_ids_free(t, &ids);
  nb_tok_text_free(t, &out);
  return ok;
}

static void test_special_modes(nb_ctx *ctx) {
  nb_tok *t = gpt2(ctx);
  const char *s = "a<|endoftext|>b";
  int32_t eot = nb_tok_added_id(t, "<|endoftext|>");
  CHECK(eot == 3256 && nb_tok_is_special(t, eot) && nb_tok_num_added(t) == 1);
  nb_tok_ids ids = {0};
  CHECK_OK(ctx, nb_tok_encode(t, s, strlen(s), NULL, &ids));
  CHECK(ids.len == 3 && ids.ids[1] == eot);
  ids.len = 0;
  nb_tok_encode_opts text = {.special = NB_TOK_SPECIAL_AS_TEXT};
  CHECK_OK(ctx, nb_tok_encode(t, s, strlen(s), &text, &ids));
  bool has = false;
  for (size_t i = 0; i < ids.len; i++) has |= ids.ids[i] == eot;
  CHECK(ids.len > 3 && !has);
  nb_tok_text out = {0};
  CHECK_OK(ctx, nb_tok_decode(t, ids.ids, ids.len, NULL, &out));
  CHECK(!strcmp(out.data, s));
  ids.len = 0;
  nb_tok_encode_opts err = {.special = NB_TOK_SPECIAL_ERROR};
  CHECK(nb_tok_encode(t, s, strlen(s), &err, &ids) == NB_ERR_INVALID_ARG && ids.len == 0);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "special token '<|endoftext|>' at byte 1");
  CHECK_OK(ctx, nb_tok_encode(t, "no specials", 11, &err, &ids));
  /* decode skipping specials; bad ids are named */
  int32_t two[3] = {31, eot, 32}; /* "@", eot, "A" */
  out.len = 0;
  nb_tok_decode_opts skip = {true};
  CHECK_OK(ctx, nb_tok_decode(t, two, 3, &skip, &out));
  CHECK(!strcmp(out.data, "@A"));
  int32_t bad[2] = {5, 99999};
  CHECK(nb_tok_decode(t, bad, 2, NULL, &out) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "id 99999 at position 1");
  CHECK(!strcmp(out.data, "@A"));
  nb_tok_encode_opts weird = {.special = (nb_tok_special)7};
  CHECK(nb_tok_encode(t, "x", 1, &weird, &ids) == NB_ERR_INVALID_ARG);
  nb_ctx_clear_error(ctx);
  nb_tok_ids_free(t, &ids);
  nb_tok_text_free(t, &out);
  nb_tok_destroy(t);
}

/* Random bytes, random UTF-8 and whitespace soups all round-trip. */
static void test_random_roundtrip(nb_ctx *ctx) {
  nb_tok *t = gpt2(ctx), *c = nb_tok_load(ctx, GOLD "cl100k");
  nb_test_rng rng = {42};
  unsigned char buf[600];
  int bad = 0;
  for (int k = 0; k < 300; k++) {
    size_t n = (size_t)nb_test_int(&rng, 0, sizeof buf);
    int mode = k % 3;
    for (size_t i = 0; i < n; i++) {
      if (mode == 0) buf[i] = (unsigned char)nb_test_int(&rng, 0, 255);
      else if (mode == 1) buf[i] = " \t\n\r\xc2\xa0" "a'"[nb_test_int(&rng, 0, 8)];
      else buf[i] = (unsigned char)("ab \xe2\x96\x81\xf0\x9f\x98\x80<|>"[nb_test_int(&rng, 0, 13)]);
    }
    bad += !roundtrip(t, buf, n) + !roundtrip(c, buf, n);
  }
  CHECK_MSG(bad == 0, "%d random texts do not round-trip", bad);
  CHECK(roundtrip(t, "", 0));
  nb_tok_destroy(t);
  nb_tok_destroy(c);
}

/* Long pieces take the heap path: 100k letters (one regex piece), 4097
 * spaces, and 49 letters (just past the scan path's limit) round-trip, and
 * the heap path's ids cover the piece exactly. */
static void test_long_pieces(nb_ctx *ctx) {
  nb_tok *t = gpt2(ctx);
  static char s[100001];
  size_t lens[3] = {100000, 4097, 49};
  char fill[3] = {'x', ' ', 'a'};
  for (int rep = 0; rep < 3; rep++) {
    memset(s, fill[rep], lens[rep]);
    CHECK(roundtrip(t, s, lens[rep]));
  }
  /* the heap path and the scan path agree: "aaaa...a" of length 49 vs 48 + "a" */
  nb_tok_ids a = {0}, b = {0};
  memset(s, 'e', 300);
  CHECK_OK(ctx, nb_tok_encode(t, s, 300, NULL, &a)); /* heap (300 symbols) */
  size_t total = 0;
  for (size_t i = 0; i < a.len; i++) {
    size_t len = 0;
    nb_tok_token_bytes(t, a.ids[i], &len);
    total += len;
  }
  CHECK(total == 300);
  /* a piece of 40 'e' (scan path) gives the same first ids as the 300 one */
  CHECK_OK(ctx, nb_tok_encode(t, s, 40, NULL, &b));
  CHECK(b.len >= 1 && a.len >= b.len && a.ids[0] == b.ids[0]);
  nb_tok_ids_free(t, &a);
  nb_tok_ids_free(t, &b);
  nb_tok_destroy(t);
}

static void expect_load_error(nb_ctx *ctx, const char *json, nb_status st, const char *needle) {
  nb_tok *t = nb_tok_load_hf_string(ctx, json, strlen(json), "x/tokenizer.json");
  CHECK_MSG(t == NULL, "loaded: %s", json);
  nb_tok_destroy(t);
  CHECK_ERR(ctx, st, needle);
}

static void test_bad_files(nb_ctx *ctx) {
  const char *bpe = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}";
  char buf[1024];
  expect_load_error(ctx, "{", NB_ERR_FORMAT, "x/tokenizer.json: not valid JSON");
  expect_load_error(ctx, "[]", NB_ERR_FORMAT, "must be an object");
  expect_load_error(ctx, "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}", NB_ERR_UNIMPLEMENTED,
                    "x/tokenizer.json: model.type: model type 'WordLevel' is not supported");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", NB_ERR_FORMAT,
                    "model.vocab['a']: id must be an integer");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", NB_ERR_FORMAT,
                    "model.merges[0]: token 'c' is not in model.vocab");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}", NB_ERR_FORMAT,
                    "model.merges[0]: the merge's result is not in the vocabulary");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"aa\"]}}", NB_ERR_FORMAT,
                    "model.merges[0]: a merge string must be two tokens");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", NB_ERR_FORMAT,
                    "token id 0 appears twice");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", NB_ERR_FORMAT, "model.merges: missing");
  expect_load_error(ctx, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}",
                    NB_ERR_UNIMPLEMENTED, "model.dropout");
  snprintf(buf, sizeof buf, "{\"normalizer\": {\"type\": \"Strip\"}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "normalizer: normalizer type 'Strip' is not supported");
  snprintf(buf, sizeof buf, "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"x\"}, {\"type\": \"NFKC\"}]}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "normalizer.normalizers[1]: a Unicode normalizer step after Prepend/Replace");
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 7], \"sep\": [\"b\", 1]}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "x/tokenizer.json: post_processor: names a token id that is not in the vocabulary");
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"RobertaProcessing\", \"cls\": 0}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "post_processor: 'cls' must be a [token, id] pair");
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"a\"}}], "
           "\"special_tokens\": {\"a\": {\"ids\": [0]}}}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "post_processor: the single template must hold the sequence A once");
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\"}}, "
           "{\"SpecialToken\": {\"id\": \"z\"}}], \"special_tokens\": {}}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "post_processor.single[1]: a SpecialToken must name an entry of special_tokens");
  snprintf(buf, sizeof buf, "{\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Nope\"}]}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "post_processor.processors[1]: post-processor type 'Nope' is not supported");
  snprintf(buf, sizeof buf, "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "pre_tokenizer.pretokenizers[0]: pre-tokenizer type 'Digits'");
  snprintf(buf, sizeof buf, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "pattern does not compile");
  snprintf(buf, sizeof buf, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "behavior Isolated");
  snprintf(buf, sizeof buf, "{\"decoder\": {\"type\": \"CTC\"}, %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_UNIMPLEMENTED, "decoder: decoder type 'CTC'");
  snprintf(buf, sizeof buf, "{\"added_tokens\": [{\"id\": 5}], %s}", bpe);
  expect_load_error(ctx, buf, NB_ERR_FORMAT, "added_tokens[0]: needs an integer 'id'");
  snprintf(buf, sizeof buf, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, %s}", bpe);
  nb_tok *t = nb_tok_load_hf_string(ctx, buf, strlen(buf), NULL);
  CHECK_MSG(t != NULL, "%s", nb_ctx_error(ctx)); /* "a", "b", "ab" are valid byte-level strings */
  CHECK(t && nb_tok_get_kind(t) == NB_TOK_BYTE_LEVEL && !nb_tok_covers_all_bytes(t) && nb_tok_num_merges(t) == 1);
  nb_tok_ids ids = {0};
  CHECK_OK(ctx, nb_tok_encode(t, "abzab", 5, NULL, &ids)); /* 'z' has no token and no unk: dropped, as tokenizers */
  CHECK(ids.len == 2 && ids.ids[0] == 2 && ids.ids[1] == 2);
  nb_tok_ids_free(t, &ids);
  nb_tok_destroy(t);
  /* GPT-2 files */
  const char *v = "{\"a\": 0, \"b\": 1, \"ab\": 2}";
  CHECK(!nb_tok_load_gpt2_strings(ctx, v, strlen(v), "a b\nb c\n", 8, NULL));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "merges.txt line 2: token 'c' is not in the vocabulary");
  CHECK(!nb_tok_load_gpt2_strings(ctx, v, strlen(v), "#version: 0.2\na  b\n", 19, NULL));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "merges.txt line 2: expected two tokens");
  const char *v2 = "{\"a\": 0, \"\\u4e2d\": 1}";
  CHECK(!nb_tok_load_gpt2_strings(ctx, v2, strlen(v2), "", 0, NULL));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "vocab.json: token '\xe4\xb8\xad' has a character outside GPT-2's byte-to-unicode alphabet");
  CHECK(!nb_tok_load_gpt2_strings(ctx, "{\"a\": 1.5}", 10, "", 0, NULL));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "vocab.json: token 'a': id must be an integer");
  CHECK(!nb_tok_load(ctx, "tests/tokenizer/no-such-dir"));
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "tests/tokenizer/no-such-dir");
  CHECK(!nb_tok_load(ctx, "tests/tokenizer"));
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "holds no tokenizer.json");
  /* files are told apart by their bytes, not their names: a SentencePiece
   * model named .json and a tokenizer.json named .model load as what they are */
  {
    char dir[512], p[600];
    nb_test_scratch_dir(dir, sizeof dir, "tokenizer", "names");
    const char *pairs[][2] = {{GOLD "spm/tokenizer.model", "spm.json"}, {GOLD "cl100k/tokenizer.json", "hf.model"}};
    for (int k = 0; k < 2; k++) {
      size_t n = 0;
      char *bytes = nb_test_read_file(pairs[k][0], &n);
      snprintf(p, sizeof p, "%s/%s", dir, pairs[k][1]);
      FILE *f = fopen(p, "wb");
      if (f && bytes) fwrite(bytes, 1, n, f);
      if (f) fclose(f);
      free(bytes);
      nb_tok *a = nb_tok_load(ctx, pairs[k][0]), *b = nb_tok_load(ctx, p);
      CHECK_MSG(a && b && nb_tok_vocab_size(a) == nb_tok_vocab_size(b), "%s renamed %s: %s", pairs[k][0], pairs[k][1],
                nb_ctx_error(ctx));
      nb_tok_destroy(a);
      nb_tok_destroy(b);
    }
    snprintf(p, sizeof p, "%s/text.json", dir);
    nb_test_write_text(p, "hello");
    CHECK(!nb_tok_load(ctx, p));
    CHECK_ERR(ctx, NB_ERR_FORMAT, "neither a tokenizer.json (a JSON object) nor a SentencePiece model");
    nb_test_rm_rf(dir);
  }
  /* SentencePiece */
  CHECK(!nb_tok_load_sentencepiece_bytes(ctx, "\x0a\x05\x0a\x01", 4, "m.model"));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "m.model: not a SentencePiece model");
  const char word[] = "\x0a\x03\x0a\x01\x61\x12\x02\x18\x03";
  CHECK(!nb_tok_load_sentencepiece_bytes(ctx, word, sizeof word - 1, "m.model"));
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "m.model: trainer_spec.model_type: WORD models are not supported");
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
}

static const char *corpus =
    "the cat sat on the mat. the cat ate the rat! that's the thing, isn't it?\n"
    "int main(void) { return 0; }  // the end\n"
    "naïve café — déjà vu 😀😀 the the the<|endoftext|>the end\n";

static nb_tok *train(nb_ctx *ctx, int32_t vocab, const char *text, size_t chunk) {
  const char *sp[1] = {"<|endoftext|>"};
  nb_tok_train_opts o = {.vocab_size = vocab, .pattern = NB_TOK_PATTERN_CL100K, .special = sp, .n_special = 1};
  nb_tok_trainer *tr = nb_tok_trainer_create(ctx, &o);
  if (!tr) return NULL;
  size_t n = strlen(text);
  nb_status s = NB_OK;
  for (size_t i = 0; i < n && !s; i += chunk) s = nb_tok_trainer_feed(tr, text + i, i + chunk < n ? chunk : n - i);
  nb_tok *t = s ? NULL : nb_tok_trainer_finish(tr);
  nb_tok_trainer_destroy(tr);
  return t;
}

static void test_training(nb_ctx *ctx) {
  nb_tok *t = train(ctx, 300, corpus, strlen(corpus));
  CHECK_MSG(t != NULL, "%s", nb_ctx_error(ctx));
  if (!t) return;
  CHECK(nb_tok_vocab_size(t) == 300 && nb_tok_num_merges(t) == 299 - 256);
  CHECK(nb_tok_added_id(t, "<|endoftext|>") == 299);
  /* the first merge is the most frequent pair: "th" (count ties break on smaller ids) */
  size_t len;
  const uint8_t *b = nb_tok_token_bytes(t, 256, &len);
  CHECK(b && len == 2 && !memcmp(b, "th", 2));
  CHECK(roundtrip(t, corpus, strlen(corpus)));
  /* deterministic: same result when fed line by line */
  const char *lines[3] = {
      "the cat sat on the mat. the cat ate the rat! that's the thing, isn't it?\n",
      "int main(void) { return 0; }  // the end\n",
      "naïve café — déjà vu 😀😀 the the the<|endoftext|>the end\n"};
  const char *sp[1] = {"<|endoftext|>"};
  nb_tok_train_opts o = {.vocab_size = 300, .pattern = NB_TOK_PATTERN_CL100K, .special = sp, .n_special = 1};
  nb_tok_trainer *tr = nb_tok_trainer_create(ctx, &o);
  for (int i = 2; i >= 0; i--) CHECK_OK(ctx, nb_tok_trainer_feed(tr, lines[i], strlen(lines[i]))); /* other order too */
  nb_tok *t2 = nb_tok_trainer_finish(tr);
  CHECK(nb_tok_trainer_finish(tr) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "called twice");
  nb_tok_trainer_destroy(tr);
  CHECK(t2 && nb_tok_vocab_size(t2) == 300);
  for (int32_t id = 0; t2 && id < 300; id++) {
    size_t l1, l2;
    const uint8_t *x = nb_tok_token_bytes(t, id, &l1), *y = nb_tok_token_bytes(t2, id, &l2);
    CHECK_MSG(l1 == l2 && !memcmp(x, y, l1), "token %d differs between feed orders", id);
  }
  nb_tok_destroy(t2);
  /* save, reload, same ids */
  char path[256];
  snprintf(path, sizeof path, "%s/tok_test_%d.json", getenv("NABLA_BUILD_DIR") ? getenv("NABLA_BUILD_DIR") : "/tmp", (int)getpid());
  CHECK_OK(ctx, nb_tok_save_hf(t, path));
  nb_tok *r = nb_tok_load_hf(ctx, path);
  CHECK_MSG(r != NULL, "%s", nb_ctx_error(ctx));
  nb_tok_ids a = {0}, c = {0};
  CHECK_OK(ctx, nb_tok_encode(t, corpus, strlen(corpus), NULL, &a));
  if (r) CHECK_OK(ctx, nb_tok_encode(r, corpus, strlen(corpus), NULL, &c));
  CHECK(a.len == c.len && a.len > 0 && !memcmp(a.ids, c.ids, a.len * sizeof *a.ids));
  /* the Python `tokenizers` package loads it and agrees (skipped when absent) */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 -c 'import tokenizers' 2>/dev/null");
  if (system(cmd) == 0) {
    char ids_path[300];
    snprintf(ids_path, sizeof ids_path, "%s.ids", path);
    FILE *f = fopen(ids_path, "w");
    fputs(corpus, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys,tokenizers; t=tokenizers.Tokenizer.from_file(sys.argv[1]); "
             "s=open(sys.argv[2],encoding=\"utf-8\").read(); print(\" \".join(map(str,t.encode(s).ids)))' %s %s > %s.out",
             path, ids_path, path);
    CHECK(system(cmd) == 0);
    snprintf(ids_path, sizeof ids_path, "%s.out", path);
    f = fopen(ids_path, "r");
    size_t k = 0;
    int v, same = 1;
    while (f && fscanf(f, "%d", &v) == 1) same &= k < a.len && a.ids[k++] == v;
    if (f) fclose(f);
    CHECK_MSG(same && k == a.len, "python tokenizers disagrees with nabla on the trained tokenizer.json");
    remove(ids_path);
    snprintf(ids_path, sizeof ids_path, "%s.ids", path);
    remove(ids_path);
  } else {
    printf("skipping the Python `tokenizers` check: package not importable\n");
  }
  remove(path);
  nb_tok_ids_free(t, &a);
  nb_tok_ids_free(t, &c);
  nb_tok_destroy(r);
  /* options are checked */
  nb_tok_train_opts bad = {.vocab_size = 100};
  CHECK(!nb_tok_trainer_create(ctx, &bad));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "vocab_size 100");
  nb_tok_train_opts badre = {.vocab_size = 300, .pattern = "(?<"};
  CHECK(!nb_tok_trainer_create(ctx, &badre));
  CHECK_ERR(ctx, NB_ERR_FORMAT, "training options: pattern: pattern does not compile");
  /* a char-level tokenizer cannot be saved */
  nb_tok *spm = nb_tok_load(ctx, GOLD "spm/tokenizer.model");
  CHECK(spm && nb_tok_save_hf(spm, path) == NB_ERR_UNIMPLEMENTED);
  nb_ctx_clear_error(ctx);
  nb_tok_destroy(spm);
  nb_tok_destroy(t);
}

/* Fails the n-th allocation for n = 1.. until the operation succeeds: no
 * crash, no leak, a NOMEM error each time. */
static void test_alloc_failures(void) {
  int n;
  for (n = 1; n < 100000; n++) {
    nb_ctx *ctx = nb_ctx_create();
    nb_ctx_fail_alloc_after(ctx, n);
    nb_tok *t = nb_tok_load(ctx, GOLD "cl100k");
    nb_tok_ids ids = {0};
    nb_status s = t ? nb_tok_encode(t, corpus, strlen(corpus), NULL, &ids) : NB_ERR_NOMEM;
    bool done = t && s == NB_OK;
    if (t) nb_tok_ids_free(t, &ids);
    nb_tok_destroy(t);
    if (!done) CHECK_MSG(nb_ctx_status(ctx) == NB_ERR_NOMEM, "n=%d: %s", n, nb_ctx_error(ctx));
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "n=%d leaks %zu bytes", n, nb_ctx_bytes_in_use(ctx));
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_ctx_destroy(ctx);
    if (done) break;
  }
  CHECK(n > 5 && n < 100000);
  for (n = 1; n < 100000; n++) {
    nb_ctx *ctx = nb_ctx_create();
    nb_ctx_fail_alloc_after(ctx, n);
    nb_tok *t = train(ctx, 280, corpus, 64);
    bool done = t != NULL;
    nb_tok_destroy(t);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "training n=%d leaks %zu bytes", n, nb_ctx_bytes_in_use(ctx));
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_ctx_destroy(ctx);
    if (done) break;
  }
  CHECK(n > 5 && n < 100000);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_special_modes(ctx);
  test_random_roundtrip(ctx);
  test_long_pieces(ctx);
  test_bad_files(ctx);
  test_training(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  test_alloc_failures();
  return nb_test_summary("tokenizer/tokenizer");
}
