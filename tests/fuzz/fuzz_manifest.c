/* Fuzz target: the checkpoint manifest parser and validator on arbitrary
 * text; every accepted manifest's entries and shards are walked. */
#include <stdint.h>
#include <stddef.h>

#include "ckpt/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static nb_ctx *ctx;
  if (!ctx) ctx = nb_ctx_create();
  nb_ckpt_info *info = nb_ckpt__manifest_parse(ctx, (const char *)data, size, "fuzz");
  volatile uint64_t sum = 0;
  for (size_t i = 0; info && i < nb_ckpt_info_count(info); i++) {
    const nb_ckpt__array *a = &info->arrays[i];
    sum += a->e.nbytes + (uint64_t)a->e.shape.rank;
    for (int k = 0; k < a->e.n_shards; k++) sum += a->shards[k].offset + a->shards[k].nbytes;
  }
  if (sum == 1) nb_ctx_clear_error(ctx);
  nb_ckpt_info_destroy(info);
  nb_ctx_clear_error(ctx);
  return 0;
}
