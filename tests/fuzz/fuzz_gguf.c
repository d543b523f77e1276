/* Fuzz target: the GGUF reader (header, metadata of every type, nested
 * arrays, tensor infos, offsets) on arbitrary bytes, then decoding every
 * tensor it accepted and reading every metadata value. */
#include <stdint.h>
#include <stdlib.h>

#include "nabla/nabla.h"

static uint64_t touch_value(const nb_gguf_value *v) {
  uint64_t sum = v->u + (uint64_t)v->i;
  for (uint64_t j = 0; j < v->len; j++) sum += (uint8_t)v->str[j];
  if (v->type == NB_GGUF_ARRAY && v->raw)
    for (uint64_t j = 0; j < v->n; j++) sum += (uint64_t)nb_gguf_array_i64(v, j);
  if (v->type == NB_GGUF_ARRAY && v->items)
    for (uint64_t j = 0; j < v->n; j++) sum += touch_value(&v->items[j]);
  return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static nb_ctx *ctx;
  if (!ctx) ctx = nb_ctx_create();
  nb_gguf *g = nb_gguf_parse(ctx, data, size, "fuzz.gguf");
  volatile uint64_t sum = 0;
  for (size_t i = 0; g && i < nb_gguf_n_kv(g); i++) sum += touch_value(nb_gguf_kv_value(g, i));
  for (size_t i = 0; g && i < nb_gguf_n_tensors(g); i++) {
    const nb_gguf_tensor *t = nb_gguf_tensor_at(g, i);
    if (t->n_elems > (1 << 20)) continue; /* bounded work per input */
    nb_array *a = nb_gguf_tensor_f32(g, t);
    if (a && nb_array_size(a) > 0) sum += (uint64_t)((const float *)nb_array_data(a))[0];
    nb_array_release(a);
    nb_ctx_clear_error(ctx);
  }
  nb_gguf_close(g);
  nb_ctx_clear_error(ctx);
  (void)sum;
  return 0;
}
