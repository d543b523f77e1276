/* Replays a fuzz corpus through a fuzz target without libFuzzer, so every
 * finding kept in tests/fuzz/corpus/<name>/ is a regression test of the normal
 * run (and of the sanitizer run). Usage: fuzz_<name>_replay DIR_OR_FILE... */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "cannot open %s\n", path), 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (!buf) return 1;
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0, failures = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) continue; /* an empty corpus folder is fine */
    if (!S_ISDIR(st.st_mode)) {
      failures += replay_file(argv[i]);
      files++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      failures += replay_file(path);
      files++;
    }
    if (d) closedir(d);
  }
  printf("%d passed, %d failed\n", files - failures, failures);
  return failures ? 1 : 0;
}
