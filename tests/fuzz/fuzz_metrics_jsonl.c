/* Fuzzes the report's metrics.jsonl reader and the page it draws: any bytes
 * must give a complete page or an error that names the file (and, for a
 * malformed record, the line); never a crash, a leak or a partial page. The
 * input goes through a file because the API reads one. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  static char in[64], out[80];
  if (!in[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(in, sizeof in, "%.40s/nbfuzzXXXXXX", base && *base ? base : "/tmp");
    int fd = mkstemp(in);
    if (fd < 0) abort();
    close(fd);
    snprintf(out, sizeof out, "%s.html", in);
  }
  FILE *f = fopen(in, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
  nb_ctx *ctx = nb_ctx_create();
  remove(out);
  nb_status s = nb_prof_report_html(ctx, in, out, "fuzz");
  if (s == NB_OK) {
    f = fopen(out, "rb");
    char tail[16] = {0};
    if (!f || fseek(f, -15, SEEK_END) != 0 || fread(tail, 1, 15, f) != 15 || strcmp(tail, "</body></html>\n")) abort();
    fclose(f);
  } else {
    char where[96];
    snprintf(where, sizeof where, "%s:", in);
    if (s != NB_ERR_FORMAT || strncmp(nb_ctx_error(ctx), where, strlen(where)) != 0) abort();
    if (access(out, F_OK) == 0) abort();
  }
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
