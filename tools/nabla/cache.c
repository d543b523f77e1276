/* `nabla cache info|clear`: the disk cache of compiled programs (the
 * directory nb_jit uses: $NABLA_CACHE_DIR, ~/.cache/nabla/jit, or
 * /tmp/nabla-jit-<uid> without $HOME). `info` prints the directory, the
 * entries, their bytes and the size limit ($NABLA_CACHE_MAX_MB); `clear`
 * removes every entry. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla cache info|clear\n"
    "  info   print the JIT cache directory, its entries, their size and the size limit\n"
    "  clear  remove every compiled program from the JIT cache\n"
    "the directory: $NABLA_CACHE_DIR, else ~/.cache/nabla/jit, else /tmp/nabla-jit-<uid>;\n"
    "the limit: $NABLA_CACHE_MAX_MB megabytes (default 1024), least recently used evicted first\n";

int nb_cmd_cache(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  if (argc != 2 || (strcmp(argv[1], "info") && strcmp(argv[1], "clear"))) return nb_cli_usage(usage_text, false);
  bool clear = !strcmp(argv[1], "clear");
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_jit_cache_info info;
  nb_status s = clear ? nb_jit_cache_clear(ctx, NULL, &info) : nb_jit_cache_stat(ctx, NULL, &info);
  int rc = 0;
  if (s != NB_OK) {
    fprintf(stderr, "nabla cache %s: %s\n", argv[1], nb_ctx_error(ctx));
    rc = 1;
  } else if (clear) {
    printf("removed %zu entries (%.1f MiB) from %s\n", info.entries, (double)info.bytes / (1 << 20), info.dir);
  } else {
    printf("dir: %s\nentries: %zu\nbytes: %llu (%.1f MiB)\nlimit: %llu MiB\n", info.dir, info.entries,
           (unsigned long long)info.bytes, (double)info.bytes / (1 << 20), (unsigned long long)(info.max_bytes >> 20));
    if (info.problem[0]) printf("refused: %s (nabla compiles in a private temporary directory instead)\n", info.problem);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
