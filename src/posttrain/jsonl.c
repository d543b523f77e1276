/* The line loop of posttrain's JSONL readers (sft examples, preference
 * pairs, GRPO prompts): open, read every line, hash it, skip blank ones,
 * hand the rest to the reader's parser with its 1-based line number. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/data.h"
#include "internal.h"

nb_status nb_pt__jsonl_each(nb_ctx *ctx, const char *what, const char *path, nb_pt__jsonl_line fn, void *ud,
                            uint64_t *xxh3) {
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot open '%s': %s", what, path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  nb_status s = NB_OK;
  uint64_t h = 0;
  for (int64_t ln = 1; !s && (len = getline(&line, &cap, f)) > 0; ln++) {
    /* the file's identity: a hash of the line hashes (one pass, no second read) */
    h = h * 0x9E3779B97F4A7C15ull + nb_data_checksum_bytes(NB_DATA_XXH3, line, (size_t)len);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    if ((ssize_t)strspn(line, " \t\r") >= len) continue; /* a blank line */
    s = fn(ud, ctx, ln, line, (size_t)len);
  }
  if (!s && ferror(f)) s = nb_errorf(ctx, NB_ERR_IO, "%s: reading '%s': %s", what, path, strerror(errno));
  free(line);
  fclose(f);
  if (!s && xxh3) *xxh3 = h;
  return s;
}
