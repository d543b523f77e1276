/* Fuzz target: the safetensors parser (header validation and tensor
 * extraction) on arbitrary bytes, with and without HF-style names. */
#include <stdint.h>
#include <stddef.h>

#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static nb_ctx *ctx;
  if (!ctx) ctx = nb_ctx_create();
  nb_ckpt_st_opts o = {.hf_names = (size & 1) != 0};
  char *meta = NULL;
  nb_tree *t = nb_ckpt_safetensors_parse(ctx, data, size, &o, &meta);
  volatile uint64_t sum = 0; /* touch every byte of every tensor */
  for (size_t i = 0; t && i < nb_tree_size(t); i++) {
    const nb_array *a = nb_tree_leaf(t, i)->array;
    const uint8_t *p = nb_array_data(a);
    for (size_t k = 0; k < nb_array_nbytes(a); k++) sum += p[k];
  }
  if (sum == 1) nb_ctx_clear_error(ctx);
  nb_tree_destroy(t);
  nb_ckpt_string_free(ctx, meta);
  nb_ctx_clear_error(ctx);
  return 0;
}
