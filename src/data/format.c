/* What a data file holds, told by its first bytes and never by its name: a
 * `.tok` shard named like text, or notes named `.tshard`, must not be read
 * as the other. Used wherever text or shards are opened for training
 * (build.c, src/train/data.c). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"

/* Bytes read to tell text from binary (a NUL among them), as git does. */
#define SNIFF_BYTES 8192

const char *nb_data_format_name(nb_data_format f) {
  switch (f) {
    case NB_DATA_FORMAT_TEXT: return "text";
    case NB_DATA_FORMAT_TOKENS: return "a token shard";
    case NB_DATA_FORMAT_RECORDS: return "a record file";
    case NB_DATA_FORMAT_BINARY: return "binary (not text: it holds NUL bytes)";
    case NB_DATA_FORMAT_DIR: return "a directory";
  }
  return "?";
}

nb_status nb_data_detect_format(nb_ctx *ctx, const char *path, nb_data_format *out) {
  struct stat st;
  if (stat(path, &st) != 0)
    return nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "'%s': %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return *out = NB_DATA_FORMAT_DIR, NB_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nb_data__err(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "'%s': %s", path, strerror(errno));
  char head[SNIFF_BYTES];
  size_t n = 0;
  while (n < sizeof head) {
    ssize_t k = read(fd, head + n, sizeof head - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      close(fd);
      return nb_data__err(ctx, NB_ERR_IO, "'%s': read failed: %s", path, strerror(e));
    }
    if (k == 0) break;
    n += (size_t)k;
  }
  close(fd);
  *out = nb_data__format_of(head, n);
  return NB_OK;
}

nb_data_format nb_data__format_of(const void *head, size_t n) {
  if (n >= 8 && !memcmp(head, NB_DATA__SHARD_MAGIC, 8)) return NB_DATA_FORMAT_TOKENS;
  if (n >= 8 && !memcmp(head, NB_DATA__RECORD_MAGIC, 8)) return NB_DATA_FORMAT_RECORDS;
  if (memchr(head, 0, n < SNIFF_BYTES ? n : SNIFF_BYTES)) return NB_DATA_FORMAT_BINARY;
  return NB_DATA_FORMAT_TEXT;
}
