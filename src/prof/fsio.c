/* File-system helpers of the prof library: mkdir -p and atomic whole-file
 * writes. Not here: any knowledge of event files or reports. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prof/internal.h"
#include "util/util.h"

nb_status nb_prof__mkdirs(nb_ctx *ctx, const char *path) {
  size_t n = strlen(path);
  if (n == 0 || n >= NB_PROF__PATH_CAP)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "directory path of %zu bytes (1 to %d allowed)", n, NB_PROF__PATH_CAP - 1);
  char failed[NB_PROF__PATH_CAP];
  int err = nb_util__mkdir_p(path, 0755, NULL, failed, sizeof failed);
  if (err == ENOTDIR) return nb_errorf(ctx, NB_ERR_IO, "cannot create directory '%s': a file of that name exists", failed);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "cannot create directory '%s': %s", failed, strerror(err));
  return NB_OK;
}

nb_status nb_prof__write_atomic(nb_ctx *ctx, const char *path, const void *data, size_t n) {
  char tmp[NB_PROF__PATH_CAP];
  int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (len < 0 || (size_t)len >= sizeof tmp) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "output path too long: '%s'", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return nb_errorf(ctx, NB_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
  const char *p = data;
  size_t left = n;
  while (left > 0) {
    ssize_t k = write(fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    p += k, left -= (size_t)k;
  }
  const char *failed = left > 0 ? "write" : fsync(fd) != 0 ? "fsync" : NULL;
  int saved = errno;
  if (close(fd) != 0 && !failed) failed = "close", saved = errno;
  if (failed) {
    unlink(tmp);
    return nb_errorf(ctx, NB_ERR_IO, "cannot %s '%s': %s", failed, tmp, strerror(saved));
  }
  if (rename(tmp, path) != 0) {
    saved = errno;
    unlink(tmp);
    return nb_errorf(ctx, NB_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(saved));
  }
  return NB_OK;
}
