/* The BPE tokenizer (include/nabla/tokenizer.h) seen through the data
 * pipeline's tokenizer interface, so shards and tokenize stages can use it. */
#include <string.h>

#include "nabla/data.h"
#include "nabla/tokenizer.h"

static nb_status bpe_encode(void *ud, nb_ctx *ctx, const char *text, size_t len, nb_data_ids *out) {
  const nb_tok *tok = ud;
  nb_tok_ids ids = {0};
  nb_status s = nb_tok_encode(tok, text, len, NULL, &ids);
  if (s == NB_OK) s = nb_data_ids_push(out, ids.ids, ids.len);
  nb_tok_ids_free(tok, &ids);
  return s;
}

nb_data_tokenizer nb_data_tokenizer_bpe(const nb_tok *tok) {
  nb_data_tokenizer t;
  memset(&t, 0, sizeof t);
  t.encode = bpe_encode;
  t.ud = (void *)tok;
  t.vocab_size = nb_tok_vocab_size(tok);
  t.eos_id = nb_tok_added_id(tok, "<|endoftext|>");
  return t;
}
