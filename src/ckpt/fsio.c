/* File-system helpers of the ckpt library: durable writes (write, fsync,
 * rename, fsync of the directory), recursive removal, bounded reads,
 * reference-counted read-only mappings, name validation, and the I/O fault
 * injection that the crash tests drive. Not here: any format knowledge. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/internal.h"
#include "util/util.h"

/* ---- fault injection ---------------------------------------------------- */

static _Atomic int64_t io_countdown, io_ops;
static _Atomic bool io_kill;

void nb_ckpt__io_fault(int64_t n, bool kill) {
  atomic_store(&io_kill, kill);
  atomic_store(&io_countdown, n);
}

int64_t nb_ckpt__io_count(void) { return atomic_load(&io_ops); }

int nb_ckpt__io_tick(void) {
  atomic_fetch_add(&io_ops, 1);
  if (atomic_load(&io_countdown) <= 0 || atomic_fetch_sub(&io_countdown, 1) != 1) return 0;
  if (atomic_load(&io_kill)) raise(SIGKILL);
  errno = EIO;
  return -1;
}

/* ---- paths and directories ---------------------------------------------- */

nb_status nb_ckpt__pathf(nb_ctx *ctx, char *buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, NB_CKPT__PATH_CAP, fmt, ap);
  va_end(ap);
  if (n < 0 || n >= NB_CKPT__PATH_CAP)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint path too long (%d bytes, at most %d)", n,
                     NB_CKPT__PATH_CAP - 1);
  return NB_OK;
}

bool nb_ckpt__exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static nb_status io_error(nb_ctx *ctx, const char *what, const char *path) {
  return nb_errorf(ctx, NB_ERR_IO, "%s '%s': %s", what, path, strerror(errno));
}

nb_status nb_ckpt__mkdirs(nb_ctx *ctx, const char *path) {
  char buf[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, buf, "%s", path) != NB_OK) return NB_ERR_INVALID_ARG;
  char failed[NB_CKPT__PATH_CAP];
  int err = nb_util__mkdir_p(buf, 0755, nb_ckpt__io_tick, failed, sizeof failed);
  if (err == ENOTDIR) return nb_errorf(ctx, NB_ERR_IO, "'%s' exists and is not a directory", failed);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "cannot create directory '%s': %s", failed, strerror(err));
  return NB_OK;
}

nb_status nb_ckpt__fsync_dir(nb_ctx *ctx, const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(ctx, "cannot open directory", path);
  nb_status s = nb_ckpt__fsync_fd(ctx, fd, path);
  close(fd);
  return s;
}

nb_status nb_ckpt__rename(nb_ctx *ctx, const char *from, const char *to) {
  if (nb_ckpt__io_tick() != 0 || rename(from, to) != 0)
    return nb_errorf(ctx, NB_ERR_IO, "cannot rename '%s' to '%s': %s", from, to, strerror(errno));
  return NB_OK;
}

nb_status nb_ckpt__remove_tree(nb_ctx *ctx, const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? NB_OK : io_error(ctx, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return io_error(ctx, "cannot open directory", path);
    struct dirent *e;
    nb_status s = NB_OK;
    while (s == NB_OK && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char child[NB_CKPT__PATH_CAP];
      s = nb_ckpt__pathf(ctx, child, "%s/%s", path, e->d_name);
      if (s == NB_OK) s = nb_ckpt__remove_tree(ctx, child);
    }
    closedir(d);
    if (s != NB_OK) return s;
    if (nb_ckpt__io_tick() != 0 || rmdir(path) != 0) return io_error(ctx, "cannot remove directory", path);
    return NB_OK;
  }
  if (nb_ckpt__io_tick() != 0 || unlink(path) != 0) return io_error(ctx, "cannot remove", path);
  return NB_OK;
}

/* ---- reading and writing ------------------------------------------------ */

nb_status nb_ckpt__write_all(nb_ctx *ctx, int fd, const void *buf, size_t n, const char *path) {
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    if (nb_ckpt__io_tick() != 0) return io_error(ctx, "cannot write", path);
    ssize_t w = write(fd, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? io_error(ctx, "cannot write", path)
                             : nb_errorf(ctx, NB_ERR_IO, "cannot write '%s': no progress", path);
    p += w;
    n -= (size_t)w;
  }
  return NB_OK;
}

nb_status nb_ckpt__fsync_fd(nb_ctx *ctx, int fd, const char *path) {
  if (nb_ckpt__io_tick() != 0 || fsync(fd) != 0) return io_error(ctx, "cannot fsync", path);
  return NB_OK;
}

nb_status nb_ckpt__write_file_durable(nb_ctx *ctx, const char *dir, const char *name, const void *data, size_t n) {
  char tmp[NB_CKPT__PATH_CAP], final[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, tmp, "%s/%s.tmp", dir, name) != NB_OK ||
      nb_ckpt__pathf(ctx, final, "%s/%s", dir, name) != NB_OK)
    return NB_ERR_INVALID_ARG;
  if (nb_ckpt__io_tick() != 0) return io_error(ctx, "cannot create", tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(ctx, "cannot create", tmp);
  nb_status s = nb_ckpt__write_all(ctx, fd, data, n, tmp);
  if (s == NB_OK) s = nb_ckpt__fsync_fd(ctx, fd, tmp);
  close(fd);
  if (s == NB_OK) s = nb_ckpt__rename(ctx, tmp, final);
  if (s == NB_OK) s = nb_ckpt__fsync_dir(ctx, dir);
  if (s != NB_OK) unlink(tmp);
  return s;
}

nb_status nb_ckpt__pread_all(nb_ctx *ctx, int fd, void *buf, size_t n, uint64_t offset, const char *path) {
  char *p = buf;
  while (n > 0) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t r = pread(fd, p, chunk, (off_t)offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error(ctx, "cannot read", path);
    if (r == 0) return nb_errorf(ctx, NB_ERR_FORMAT, "'%s' is truncated (ends before byte %llu)", path,
                                 (unsigned long long)offset);
    p += r;
    n -= (size_t)r;
    offset += (uint64_t)r;
  }
  return NB_OK;
}

nb_status nb_ckpt__read_file(nb_ctx *ctx, const char *path, size_t max, char **out, size_t *n) {
  *out = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? nb_errorf(ctx, NB_ERR_NOT_FOUND, "'%s' does not exist", path)
                           : io_error(ctx, "cannot open", path);
  struct stat st;
  nb_status s = NB_OK;
  if (fstat(fd, &st) != 0) s = io_error(ctx, "cannot stat", path);
  else if (!S_ISREG(st.st_mode)) s = nb_errorf(ctx, NB_ERR_FORMAT, "'%s' is not a regular file", path);
  else if ((uint64_t)st.st_size > max)
    s = nb_errorf(ctx, NB_ERR_FORMAT, "'%s' is %lld bytes, more than the %zu allowed", path, (long long)st.st_size, max);
  char *buf = NULL;
  size_t len = s == NB_OK ? (size_t)st.st_size : 0;
  if (s == NB_OK && !(buf = nb_alloc(ctx, len + 1))) s = NB_ERR_NOMEM;
  if (s == NB_OK) s = nb_ckpt__pread_all(ctx, fd, buf, len, 0, path);
  close(fd);
  if (s != NB_OK) {
    if (buf) nb_dealloc(ctx, buf, len + 1);
    return s;
  }
  buf[len] = 0;
  *out = buf;
  *n = len;
  return NB_OK;
}

/* ---- mappings ------------------------------------------------------------ */

struct nb_ckpt__map {
  nb_ctx *ctx;
  _Atomic int64_t refs;
  uint8_t *base;
  uint64_t size;
};

nb_ckpt__map *nb_ckpt__map_open(nb_ctx *ctx, const char *path, uint64_t min_size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) nb_errorf(ctx, NB_ERR_FORMAT, "data file '%s' is missing", path);
    else io_error(ctx, "cannot open", path);
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    nb_errorf(ctx, NB_ERR_FORMAT, "data file '%s' is not a regular file", path);
    close(fd);
    return NULL;
  }
  if ((uint64_t)st.st_size < min_size) {
    nb_errorf(ctx, NB_ERR_FORMAT, "data file '%s' is truncated: %lld bytes, the manifest needs %llu", path,
              (long long)st.st_size, (unsigned long long)min_size);
    close(fd);
    return NULL;
  }
  nb_ckpt__map *m = nb_calloc(ctx, sizeof *m);
  if (!m) {
    close(fd);
    return NULL;
  }
  m->ctx = ctx;
  atomic_init(&m->refs, 1);
  m->size = (uint64_t)st.st_size;
  if (m->size > 0) {
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      io_error(ctx, "cannot map", path);
      nb_dealloc(ctx, m, sizeof *m);
      close(fd);
      return NULL;
    }
    m->base = p;
  }
  close(fd);
  return m;
}

const uint8_t *nb_ckpt__map_data(const nb_ckpt__map *m) { return m->base; }
uint64_t nb_ckpt__map_size(const nb_ckpt__map *m) { return m->size; }
void nb_ckpt__map_retain(nb_ckpt__map *m) { atomic_fetch_add(&m->refs, 1); }

void nb_ckpt__map_release(nb_ckpt__map *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
  if (m->base) munmap(m->base, m->size);
  nb_dealloc(m->ctx, m, sizeof *m);
}

void nb_ckpt__map_release_cb(void *ud) { nb_ckpt__map_release(ud); }

void nb_ckpt__map_willneed(nb_ckpt__map *m, uint64_t offset, uint64_t len) {
  long page = sysconf(_SC_PAGESIZE);
  if (!m->base || len == 0 || page <= 0) return;
  uint64_t lo = offset / (uint64_t)page * (uint64_t)page;
  madvise(m->base + lo, (size_t)(offset + len - lo), MADV_WILLNEED);
}

nb_array *nb_ckpt__map_array(nb_ctx *ctx, nb_ckpt__map *m, uint64_t offset, nb_dtype t, const nb_shape *shape) {
  size_t nbytes = (size_t)nb_shape_size(shape) * nb_dtype_size(t);
  const uint8_t *p = m->base ? m->base + offset : NULL;
  if (nbytes == 0 || (uintptr_t)p % nb_dtype_size(t) != 0)
    return nb_array_create(ctx, t, shape->rank, shape->dims, p);
  nb_ckpt__map_retain(m);
  nb_array *a = nb_array_wrap(ctx, t, shape->rank, shape->dims, p, nb_ckpt__map_release_cb, m);
  if (!a) nb_ckpt__map_release(m);
  return a;
}

/* ---- names and small helpers --------------------------------------------- */

bool nb_ckpt__valid_item_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 64 || s[0] == '.') return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  }
  return true;
}

bool nb_ckpt__valid_file_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 255 || s[0] == '.') return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] < 0x20) return false;
  return true;
}

bool nb_ckpt__valid_tree_path(const char *s) {
  if (!s || !*s || *s == '/') return false;
  for (const char *c = s; *c; c++)
    if (*c == '/' && (c[1] == '/' || c[1] == 0)) return false;
  return true;
}

void nb_ckpt_string_free(nb_ctx *ctx, char *s) { nb_strfree(ctx, s); }

void nb_ckpt__hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

bool nb_ckpt__parse_hex64(const char *s, uint64_t *v) {
  if (!s || strlen(s) != 16) return false;
  uint64_t r = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    r = r << 4 | (uint64_t)d;
  }
  *v = r;
  return true;
}

uint64_t nb_ckpt__xxh3(const void *p, size_t n) { return XXH3_64bits(p, n); }

bool nb_ckpt__json_int(double d, double lo, int64_t *out) {
  if (!(d >= lo && d <= 9007199254740992.0) || d != (double)(int64_t)d) return false;
  *out = (int64_t)d;
  return true;
}
