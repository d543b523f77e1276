/* Fuzzes reading a trace's memory.json back into the memory viewer's HTML
 * sections (nb_prof_trace_memory_html): any bytes must give sections or an
 * error that names the file; never a crash, a hang or a leak. The input
 * goes through a file because the API reads one (TRACE.memory.json beside
 * TRACE.json). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  static char dir[64], trace[96], mem[112];
  if (!dir[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%.40s/nbfuzzXXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) abort();
    snprintf(trace, sizeof trace, "%s/t.json", dir);
    snprintf(mem, sizeof mem, "%s/t.memory.json", dir);
  }
  FILE *f = fopen(mem, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
  nb_ctx *ctx = nb_ctx_create();
  char *out = NULL;
  size_t n = 0;
  FILE *o = open_memstream(&out, &n);
  if (!o) abort();
  nb_status s = nb_prof_trace_memory_html(ctx, trace, 0, o);
  fclose(o);
  if (s != NB_OK && (s != NB_ERR_FORMAT || !strstr(nb_ctx_error(ctx), "t.memory.json"))) abort();
  if (s == NB_OK && n && strncmp(out, "<section", 8)) abort();
  free(out);
  if (nb_ctx_bytes_in_use(ctx) != 0) abort();
  nb_ctx_destroy(ctx);
  return 0;
}
