/* src/util: mkdir -p (parents, an existing directory, a file in the way
 * named), whole-file reads (size limit, directories), CRC-32C against its
 * check value, and the clocks. */
#include <errno.h>
#include <sys/stat.h>

#include "testfs.h"
#include "util/util.h"

static int ticks_left;
static int tick(void) { return ticks_left-- > 0 ? 0 : 1; }

int main(void) {
  char dir[4096], path[4300], failed[4400];
  nb_test_scratch_dir(dir, sizeof dir, "util", "util");

  snprintf(path, sizeof path, "%s/a/b/c/", dir);
  CHECK(nb_util__mkdir_p(path, 0755, NULL, failed, sizeof failed) == 0);
  struct stat st;
  snprintf(path, sizeof path, "%s/a/b/c", dir);
  CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
  CHECK(nb_util__mkdir_p(path, 0755, NULL, NULL, 0) == 0); /* exists: fine */

  snprintf(path, sizeof path, "%s/a/file", dir);
  nb_test_write_text(path, "0123456789");
  snprintf(path, sizeof path, "%s/a/file/d/e", dir);
  CHECK(nb_util__mkdir_p(path, 0755, NULL, failed, sizeof failed) == ENOTDIR);
  snprintf(path, sizeof path, "%s/a/file", dir);
  CHECK_MSG(!strcmp(failed, path), "failed prefix '%s'", failed);
  CHECK(nb_util__mkdir_p("", 0755, NULL, NULL, 0) == ENOENT);

  /* the hook fails the second mkdir: the first directory stays */
  ticks_left = 1;
  snprintf(path, sizeof path, "%s/h1/h2", dir);
  CHECK(nb_util__mkdir_p(path, 0755, tick, failed, sizeof failed) == EIO && !strcmp(failed, path));
  snprintf(path, sizeof path, "%s/h1", dir);
  CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));

  char *data = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/a/file", dir);
  CHECK(nb_util__read_file(path, 10, &data, &len) == 0 && len == 10 && !strcmp(data, "0123456789"));
  free(data);
  CHECK(nb_util__read_file(path, 9, &data, &len) == EFBIG);
  snprintf(path, sizeof path, "%s/a", dir);
  CHECK(nb_util__read_file(path, 100, &data, &len) == EISDIR);
  snprintf(path, sizeof path, "%s/none", dir);
  CHECK(nb_util__read_file(path, 100, &data, &len) == ENOENT);

  CHECK(nb_util__crc32c("123456789", 9) == 0xe3069283u); /* the CRC-32C check value */
  CHECK(nb_util__crc32c("", 0) == 0);
  char big[1000];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i * 7);
  uint32_t c = 0xffffffffu; /* bytewise reference for the sliced loop */
  for (size_t i = 0; i < sizeof big; i++) {
    c ^= (uint8_t)big[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  CHECK(nb_util__crc32c(big, sizeof big) == (c ^ 0xffffffffu));

  int64_t t0 = nb_util__now_ns();
  CHECK(nb_util__now_ns() >= t0 && nb_util__now_s() > 0 && nb_util__wall_s() > 1.6e9);
  nb_test_rm_rf(dir);
  return nb_test_summary("util/test_util");
}
