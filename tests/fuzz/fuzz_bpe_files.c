/* Fuzzes the GPT-2 vocab.json/merges.txt and SentencePiece .model loaders,
 * and the encoder's round-trip property. The first byte picks the target:
 *   0: vocab.json NUL merges.txt (split at the first NUL byte)
 *   1: a SentencePiece ModelProto
 *   2+: the rest is text for two tokenizers trained in-process (GPT-2 and
 *       cl100k patterns, all 256 bytes): decode(encode(text)) == text, with
 *       specials allowed and as text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. It's 12:45; we'll see!\n"
    "def f(x):\n    return x * 2  # doubled\n\n\tint main(void) { return 0; }\r\n"
    "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\xf0\x9f\x98\x80   spaces   \n\n\n"
    "<|endoftext|>the the the then there their 1234567 3.14159\n";

static nb_ctx *g_ctx;
static nb_tok *g_tok[2];

static void setup(void) {
  if (g_ctx) return;
  g_ctx = nb_ctx_create();
  const char *pats[2] = {NB_TOK_PATTERN_GPT2, NB_TOK_PATTERN_CL100K};
  const char *sp[1] = {"<|endoftext|>"};
  for (int i = 0; i < 2; i++) {
    nb_tok_train_opts o = {.vocab_size = 400, .pattern = pats[i], .special = sp, .n_special = 1};
    nb_tok_trainer *tr = nb_tok_trainer_create(g_ctx, &o);
    if (!tr || nb_tok_trainer_feed(tr, corpus, sizeof corpus - 1)) abort();
    g_tok[i] = nb_tok_trainer_finish(tr);
    nb_tok_trainer_destroy(tr);
    if (!g_tok[i]) abort();
  }
}

static void roundtrip(nb_tok *t, const uint8_t *s, size_t n, nb_tok_special mode) {
  nb_tok_ids ids = {0};
  nb_tok_text out = {0};
  nb_tok_encode_opts o = {.special = mode};
  if (nb_tok_encode(t, s, n, &o, &ids) != NB_OK) abort();
  if (nb_tok_decode(t, ids.ids, ids.len, NULL, &out) != NB_OK) abort();
  if (out.len != n || (n && memcmp(out.data, s, n))) abort();
  nb_tok_ids_free(t, &ids);
  nb_tok_text_free(t, &out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 16) return 0;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  if (data[0] >= 2) {
    setup();
    for (int i = 0; i < 2; i++) {
      roundtrip(g_tok[i], p, n, NB_TOK_SPECIAL_ALLOW);
      roundtrip(g_tok[i], p, n, NB_TOK_SPECIAL_AS_TEXT);
    }
    return 0;
  }
  nb_ctx *ctx = nb_ctx_create();
  nb_tok *t;
  if (data[0] == 0) {
    const uint8_t *z = memchr(p, 0, n);
    size_t vn = z ? (size_t)(z - p) : n;
    const char *m = z ? (const char *)z + 1 : "";
    t = nb_tok_load_gpt2_strings(ctx, (const char *)p, vn, m, z ? n - vn - 1 : 0, NULL);
  } else {
    t = nb_tok_load_sentencepiece_bytes(ctx, p, n, "fuzz.model");
  }
  if (!t && nb_ctx_status(ctx) == NB_OK) abort();
  if (t) {
    nb_tok_ids ids = {0};
    nb_tok_text out = {0};
    if (nb_tok_encode(t, p, n < 4096 ? n : 4096, NULL, &ids) != NB_OK) abort();
    if (nb_tok_decode(t, ids.ids, ids.len, NULL, &out) != NB_OK) abort();
    nb_tok_ids_free(t, &ids);
    nb_tok_text_free(t, &out);
    nb_tok_destroy(t);
  }
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
