/* Fuzzes the Hugging Face config.json reader of the models library: any
 * bytes must either give a model config that validates (and can be traced:
 * its parameter spec builds) or fail with a message naming the file; never
 * crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 0;
  nb_model_loaded m;
  nb_status s = nb_model__hf_config_parse(ctx, "fuzz/config.json", (const char *)data, size, &m);
  if (s == NB_OK) {
    if (nb_model_config_validate(ctx, &m.cfg) != NB_OK) abort();
    /* sizes are untrusted: only build the spec of a config that is small */
    if (m.cfg.d_model * m.cfg.vocab_size < (1 << 24) && m.cfg.n_layers < 64) {
      nb_tree *spec = nb_model_param_spec(ctx, &m.cfg, NB_F32);
      if (!spec && nb_ctx_status(ctx) == NB_OK) abort();
      nb_tree_destroy(spec);
    }
  } else if (!strstr(nb_ctx_error(ctx), "fuzz/config.json")) {
    abort();
  }
  nb_model_loaded_free(&m);
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
