/* Fuzzes the YAML run-config parser: any bytes, with and without a
 * key=value override taken from the input's first line, must parse into a
 * valid config or fail with a message; never crash or leak. A parsed config
 * must also write out and parse back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 0;
  nb_train_config c;
  char *text = malloc(size + 1);
  if (!text) {
    nb_ctx_destroy(ctx);
    return 0;
  }
  memcpy(text, data, size);
  text[size] = 0;
  const char *ov[1] = {text};
  char *nl = memchr(text, '\n', size);
  int n_ov = 0;
  if (size > 2 && text[0] == '=' && nl) { /* "=key=value\n<yaml>": an override line */
    *nl = 0;
    ov[0] = text + 1;
    n_ov = 1;
  }
  const char *yaml = n_ov ? nl + 1 : text;
  size_t len = n_ov ? size - (size_t)(nl + 1 - text) : size;
  if (nb_train_config_parse(ctx, "fuzz", yaml, len, n_ov, ov, &c) == NB_OK) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (f) {
      nb_train_config_write(&c, f);
      fclose(f);
      nb_train_config d;
      if (nb_train_config_parse(ctx, "written", out, n, 0, NULL, &d) != NB_OK) abort();
      free(out);
    }
  }
  free(text);
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
