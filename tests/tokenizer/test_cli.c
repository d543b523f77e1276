/* `nabla tok`: train on a file, info, encode -> decode round trip through the
 * command line, and a clear error for a missing tokenizer. */
#include <unistd.h>

#include "test.h"

static int run(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int main(void) {
  const char *bin = getenv("NABLA_BIN"), *bdir = getenv("NABLA_BUILD_DIR");
  if (!bin || !bdir) {
    printf("skipping: NABLA_BIN / NABLA_BUILD_DIR not set (run through ctest)\n");
    return nb_test_summary("tokenizer/cli");
  }
  char dir[512], cmd[8192], text[600], ids[600], back[600];
  snprintf(dir, sizeof dir, "%s/tok_cli_%d", bdir, (int)getpid());
  snprintf(text, sizeof text, "%s.txt", dir);
  snprintf(ids, sizeof ids, "%s.ids", dir);
  snprintf(back, sizeof back, "%s.back", dir);
  FILE *f = fopen(text, "wb");
  fputs("the cat sat on the mat; the cat ate the rat.\n\tcaf\xc3\xa9 \xff\xfe 123456 <|endoftext|> end\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s tok train --vocab-size 270 --pattern cl100k --special '<|endoftext|>' --out %s %s >/dev/null", bin, dir, text);
  CHECK(run(cmd) == 0);
  snprintf(cmd, sizeof cmd, "%s tok info %s | grep -q 'vocab size: 270'", bin, dir);
  CHECK(run(cmd) == 0);
  snprintf(cmd, sizeof cmd, "%s tok encode %s %s > %s && %s tok decode %s %s > %s && cmp -s %s %s", bin, dir, text, ids, bin,
           dir, ids, back, text, back);
  CHECK(run(cmd) == 0);
  snprintf(cmd, sizeof cmd, "%s tok encode %s --error-special %s 2>/dev/null >/dev/null", bin, dir, text);
  CHECK(run(cmd) == 1);
  snprintf(cmd, sizeof cmd, "%s tok info %s/missing 2>&1 | grep -q 'no such file'", bin, dir);
  CHECK(run(cmd) == 0);
  snprintf(cmd, sizeof cmd, "%s tok train --out %s %s 2>/dev/null", bin, dir, text);
  CHECK(run(cmd) == 2);
  snprintf(cmd, sizeof cmd, "rm -rf %s %s %s %s", dir, text, ids, back);
  CHECK(run(cmd) == 0);
  return nb_test_summary("tokenizer/cli");
}
