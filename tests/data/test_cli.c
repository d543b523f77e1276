/* `nabla data` end to end: build a record file and a token shard from a
 * generated directory, inspect and verify them, and see a corrupted file
 * fail verification with the chunk named. */
#include <stdarg.h>

#include "data_util.h"

/* Runs a printf-formatted shell command; returns its exit code and its
 * output (stdout and stderr) in out. */
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
  return nb_test_run(cmd, out, cap);
}

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("data/test_cli");
  tdir_make();
  char d[512], p[512], rec[512], tok[512], out[8192];
  mkdir(tpath(d, "in"), 0755);
  FILE *f = fopen(tpath(p, "in/a.txt"), "w");
  for (int i = 0; i < 3000; i++) fprintf(f, "line %d of the generated text\n", i);
  fclose(f);
  nb_test_write_text(tpath(p, "in/b.jsonl"), "{\"body\": \"from json\"}\n");
  tpath(rec, "c.rec");
  tpath(tok, "c.tok");
  int rc = run(out, sizeof out, "%s data build -o %s --field body --chunk-bytes 4096 --checksum crc32c %s", bin, rec, d);
  CHECK_MSG(rc == 0 && strstr(out, "3001 records"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data inspect %s --head 2", bin, rec);
  CHECK_MSG(rc == 0 && strstr(out, "records            3001") && strstr(out, "crc32c") &&
            strstr(out, "[0] line 0 of the generated text") && !strstr(out, "[2]"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data build -o %s %s/a.txt", bin, tok, d);
  CHECK_MSG(rc == 0 && strstr(out, "wrote"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data inspect %s", bin, tok);
  CHECK_MSG(rc == 0 && strstr(out, "vocab size         256") && strstr(out, "line 0 of"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data verify %s %s", bin, rec, tok);
  CHECK_MSG(rc == 0 && strstr(out, "ok ") && strstr(out, "3001 records"), "rc %d: %s", rc, out);
  nb_test_flip_byte(rec, 64 + 40 + 100);
  rc = run(out, sizeof out, "%s data verify %s", bin, rec);
  CHECK_MSG(rc == 1 && strstr(out, "chunk 0 (records 0..") && strstr(out, "checksum mismatch"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data build -o %s --eos 999 %s", bin, tok, d);
  CHECK_MSG(rc == 1 && strstr(out, "outside vocab"), "rc %d: %s", rc, out);
  /* a BPE tokenizer file: GPT-2's vocabulary (cut), from the tokenizer goldens */
  rc = run(out, sizeof out, "%s data build -o %s --tokenizer tests/tokenizer/golden/gpt2/tokenizer.json %s/a.txt", bin, tok, d);
  CHECK_MSG(rc == 0 && strstr(out, "wrote"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data inspect %s", bin, tok);
  /* "line" " 0" " of" " the" in GPT-2 ids */
  CHECK_MSG(rc == 0 && strstr(out, "vocab size         3257") && strstr(out, "1370 657 286 262"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data build -o %s --tokenizer /nonexistent/tokenizer.json %s/a.txt", bin, tok, d);
  CHECK_MSG(rc == 2 && strstr(out, "/nonexistent/tokenizer.json"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data frobnicate", bin);
  CHECK_MSG(rc == 2 && strstr(out, "unknown subcommand"), "rc %d: %s", rc, out);
  rc = run(out, sizeof out, "%s data inspect %s/a.txt", bin, d);
  CHECK_MSG(rc == 1 && strstr(out, "neither a record file nor a token shard"), "rc %d: %s", rc, out);
  tdir_remove();
  return nb_test_summary("data/test_cli");
}
