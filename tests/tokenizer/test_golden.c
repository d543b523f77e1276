/* Encoded ids against the reference tokenizers (tiktoken, tokenizers,
 * sentencepiece) on the golden text set written by make_goldens.py, for
 * every vocabulary and file format there; plus decode round trips. */
#include <cjson/cJSON.h>

#include "test.h"

static cJSON *read_json(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  buf[got] = 0;
  cJSON *j = cJSON_ParseWithLength(buf, got);
  free(buf);
  return j;
}

typedef struct text {
  unsigned char *data;
  size_t len;
} text;

static text unhex(const char *h) {
  size_t n = strlen(h) / 2;
  text t = {malloc(n + 1), n};
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    sscanf(h + 2 * i, "%2x", &v);
    t.data[i] = (unsigned char)v;
  }
  return t;
}

static int n_texts, n_invalid;
static text texts[64], invalid[16];

static void load_texts(void) {
  cJSON *j = read_json("tests/tokenizer/golden/texts.json");
  CHECK(j != NULL);
  if (!j) return;
  cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "texts")) texts[n_texts++] = unhex(it->valuestring);
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "invalid_utf8")) invalid[n_invalid++] = unhex(it->valuestring);
  cJSON_Delete(j);
}

/* Encodes every text with tok and compares with refs[ref]; checks decode
 * gives the text back when `roundtrip`, or (char-level) what the reference's
 * decode gives (refs["<ref>:decoded"], skipping specials) when it has one. */
static void compare_opts(nb_ctx *ctx, nb_tok *tok, const char *vocab, const char *ref, bool roundtrip,
                         const nb_tok_encode_opts *eo) {
  CHECK_MSG(tok != NULL, "%s: %s", vocab, nb_ctx_error(ctx));
  if (!tok) return;
  char path[256];
  snprintf(path, sizeof path, "tests/tokenizer/golden/%s/ids.json", vocab);
  cJSON *j = read_json(path);
  cJSON *lists = cJSON_GetObjectItem(j, ref);
  char dname[128];
  snprintf(dname, sizeof dname, "%s:decoded", ref);
  cJSON *decoded = cJSON_GetObjectItem(j, dname);
  CHECK_MSG(cJSON_GetArraySize(lists) == n_texts, "%s/%s: %d id lists for %d texts", vocab, ref, cJSON_GetArraySize(lists), n_texts);
  int bad = 0;
  for (int i = 0; i < n_texts && i < cJSON_GetArraySize(lists); i++) {
    nb_tok_ids ids = {0};
    CHECK_OK(ctx, nb_tok_encode(tok, texts[i].data, texts[i].len, eo, &ids));
    cJSON *want = cJSON_GetArrayItem(lists, i);
    bool same = (int)ids.len == cJSON_GetArraySize(want);
    for (size_t k = 0; same && k < ids.len; k++) same = ids.ids[k] == cJSON_GetArrayItem(want, (int)k)->valueint;
    if (!same && bad++ < 3) {
      fprintf(stderr, "%s/%s text %d '%.40s': got %zu ids [", vocab, ref, i, texts[i].data, ids.len);
      for (size_t k = 0; k < ids.len && k < 24; k++) fprintf(stderr, "%d ", ids.ids[k]);
      fprintf(stderr, "] want %d [", cJSON_GetArraySize(want));
      for (int k = 0; k < cJSON_GetArraySize(want) && k < 24; k++) fprintf(stderr, "%d ", cJSON_GetArrayItem(want, k)->valueint);
      fprintf(stderr, "]\n");
    }
    CHECK_MSG(same, "%s/%s: text %d differs", vocab, ref, i);
    if (decoded) {
      nb_tok_text out = {0};
      nb_tok_decode_opts o = {.skip_special = true};
      CHECK_OK(ctx, nb_tok_decode(tok, ids.ids, ids.len, &o, &out));
      const char *w = cJSON_GetArrayItem(decoded, i)->valuestring;
      CHECK_MSG(out.len == strlen(w) && !memcmp(out.data, w, out.len), "%s: text %d decodes to '%s', reference '%s'", vocab, i, out.data, w);
      nb_tok_text_free(tok, &out);
    } else if (roundtrip) {
      nb_tok_text out = {0};
      CHECK_OK(ctx, nb_tok_decode(tok, ids.ids, ids.len, NULL, &out));
      CHECK_MSG(out.len == texts[i].len && !memcmp(out.data, texts[i].data, out.len), "%s: text %d does not round-trip: '%s'", vocab, i, out.data);
      nb_tok_text_free(tok, &out);
    }
    nb_tok_ids_free(tok, &ids);
  }
  cJSON_Delete(j);
}

static void compare(nb_ctx *ctx, nb_tok *tok, const char *vocab, const char *ref, bool roundtrip) {
  compare_opts(ctx, tok, vocab, ref, roundtrip, NULL);
}

/* A tokenizer.json in golden/<vocab>/: ids without and (refs "<file>+special")
 * with the post-processor's special tokens, and decodes where refs have them. */
static void compare_hf(nb_ctx *ctx, const char *vocab, const char *file) {
  char path[256], ref[128];
  snprintf(path, sizeof path, "tests/tokenizer/golden/%s/%s", vocab, file);
  nb_tok *t = nb_tok_load(ctx, path);
  compare_opts(ctx, t, vocab, file, false, NULL);
  snprintf(ref, sizeof ref, "%s+special", file);
  nb_tok_encode_opts eo = {.add_special_tokens = true};
  compare_opts(ctx, t, vocab, ref, false, &eo);
  nb_tok_destroy(t);
}

/* Byte-level tokenizers round-trip any bytes, invalid UTF-8 included. */
static void invalid_roundtrip(nb_ctx *ctx, nb_tok *tok, const char *name) {
  if (!tok) return;
  CHECK(nb_tok_covers_all_bytes(tok));
  for (int i = 0; i < n_invalid; i++) {
    nb_tok_ids ids = {0};
    nb_tok_text out = {0};
    CHECK_OK(ctx, nb_tok_encode(tok, invalid[i].data, invalid[i].len, NULL, &ids));
    CHECK_OK(ctx, nb_tok_decode(tok, ids.ids, ids.len, NULL, &out));
    CHECK_MSG(out.len == invalid[i].len && !memcmp(out.data, invalid[i].data, out.len), "%s: invalid text %d", name, i);
    nb_tok_ids_free(tok, &ids);
    nb_tok_text_free(tok, &out);
  }
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  load_texts();
  CHECK(n_texts > 20 && n_invalid > 3);

  nb_tok *t = nb_tok_load_gpt2(ctx, "tests/tokenizer/golden/gpt2/vocab.json", "tests/tokenizer/golden/gpt2/merges.txt", NULL);
  compare(ctx, t, "gpt2", "tiktoken", true);
  compare(ctx, t, "gpt2", "tokenizers", true);
  invalid_roundtrip(ctx, t, "gpt2 vocab.json");
  CHECK(t && nb_tok_num_merges(t) == 3000 && nb_tok_vocab_size(t) == 3257 && nb_tok_is_special(t, 3256));
  nb_tok_destroy(t);

  t = nb_tok_load(ctx, "tests/tokenizer/golden/gpt2/tokenizer.json");
  compare(ctx, t, "gpt2", "tokenizers", true);
  nb_tok_destroy(t);

  t = nb_tok_load(ctx, "tests/tokenizer/golden/cl100k");
  compare(ctx, t, "cl100k", "tokenizers", true);
  compare(ctx, t, "cl100k", "tiktoken", true);
  invalid_roundtrip(ctx, t, "cl100k");
  nb_tok_destroy(t);

  t = nb_tok_load(ctx, "tests/tokenizer/golden/llama/tokenizer.json");
  CHECK(t && nb_tok_get_kind(t) == NB_TOK_CHAR_LEVEL);
  compare(ctx, t, "llama", "tokenizer.json", true);
  nb_tok_destroy(t);
  t = nb_tok_load(ctx, "tests/tokenizer/golden/llama/tokenizer_metaspace.json");
  compare(ctx, t, "llama", "tokenizer_metaspace.json", true);
  nb_tok_destroy(t);

  t = nb_tok_load(ctx, "tests/tokenizer/golden/spm");
  compare(ctx, t, "spm", "sentencepiece", true);
  nb_tok_destroy(t);

  /* allow_whitespace_only_pieces: runs of spaces become "▁▁▁▁" pieces */
  t = nb_tok_load(ctx, "tests/tokenizer/golden/spm_ws/tokenizer.model");
  compare(ctx, t, "spm_ws", "sentencepiece", true);
  nb_tok_destroy(t);
  /* Unigram models with precompiled nfkc charsmaps */
  t = nb_tok_load(ctx, "tests/tokenizer/golden/spm_unigram/tokenizer.model");
  compare(ctx, t, "spm_unigram", "sentencepiece", false);
  nb_tok_destroy(t);
  t = nb_tok_load(ctx, "tests/tokenizer/golden/spm_unigram_bf/tokenizer.model");
  compare(ctx, t, "spm_unigram_bf", "sentencepiece", false);
  nb_tok_destroy(t);

  compare_hf(ctx, "qwen", "tokenizer.json");      /* NFC, byte-level */
  compare_hf(ctx, "qwen", "tokenizer_nfkc.json"); /* NFKC, BOS/EOS template */
  compare_hf(ctx, "hf_unigram", "tokenizer.json");
  compare_hf(ctx, "hf_unigram", "tokenizer_bytes.json");
  compare_hf(ctx, "wordpiece", "tokenizer.json");
  compare_hf(ctx, "wordpiece", "tokenizer_cased.json");

  for (int i = 0; i < n_texts; i++) free(texts[i].data);
  for (int i = 0; i < n_invalid; i++) free(invalid[i].data);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("tokenizer/golden");
}
