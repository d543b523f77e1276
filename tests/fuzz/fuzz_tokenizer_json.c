/* Fuzzes the tokenizer.json loader: any input must load or fail with a
 * message, never crash or leak; a tokenizer that loads must encode its own
 * file's bytes and a few fixed strings (also with the post-processor's
 * special tokens), and a byte-level one that covers all bytes and has no
 * normalizer must decode them back exactly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

static void roundtrip(nb_tok *t, const uint8_t *s, size_t n) {
  nb_tok_ids ids = {0};
  nb_tok_text out = {0};
  if (nb_tok_encode(t, s, n, NULL, &ids) != NB_OK) { /* a pattern may hit PCRE2's match limit: an error, said */
    if (nb_ctx_status(nb_tok_ctx(t)) == NB_OK) abort();
    nb_ctx_clear_error(nb_tok_ctx(t));
    nb_tok_ids_free(t, &ids);
    return;
  }
  if (nb_tok_decode(t, ids.ids, ids.len, NULL, &out) != NB_OK) abort();
  bool exact = nb_tok_get_kind(t) == NB_TOK_BYTE_LEVEL && nb_tok_covers_all_bytes(t) && nb_tok_num_added(t) == 0 &&
               !nb_tok_has_normalizer(t);
  /* add_prefix_space may put one ' ' in front */
  bool same = out.len == n && (n == 0 || !memcmp(out.data, s, n));
  bool prefixed = out.len == n + 1 && out.data[0] == ' ' && (n == 0 || !memcmp(out.data + 1, s, n));
  if (exact && !same && !prefixed) abort();
  /* with the post-processor's special tokens: the same ids, wrapped */
  nb_tok_ids wrapped = {0};
  nb_tok_encode_opts o = {.add_special_tokens = true};
  if (nb_tok_encode(t, s, n, &o, &wrapped) != NB_OK || wrapped.len < ids.len) abort();
  nb_tok_ids_free(t, &wrapped);
  nb_tok_ids_free(t, &ids);
  nb_tok_text_free(t, &out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  nb_ctx *ctx = nb_ctx_create();
  nb_tok *t = nb_tok_load_hf_string(ctx, (const char *)data, size, "fuzz.json");
  if (!t && nb_ctx_status(ctx) == NB_OK) abort(); /* a failure must say why */
  if (t) {
    static const char *fixed[] = {"", "hello world", "  \n\t x", "\xff\xfe\x80", "<s>a</s><|endoftext|>", "\xe2\x96\x81 \xe2\x96",
                                  "e\xcc\x81 \xef\xac\x81 \xc4\xb0\t\xe4\xb8\xad\x01 a,b"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) roundtrip(t, (const uint8_t *)fixed[i], strlen(fixed[i]));
    roundtrip(t, data, size < 2048 ? size : 2048);
    nb_tok_destroy(t);
  }
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
