/* Writing one step: data files (arrays at aligned offsets, hashed while they
 * are written), the manifest, and the commit protocol (temporary directory,
 * fsync of files and directories, rename into place, durable COMMIT marker).
 * Also the step-directory names and the commit marker's reader. Not here:
 * retention, threads (manager.c) or reading data (read.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/internal.h"

#define WRITE_CHUNK ((size_t)8 << 20)
#define BIG_ARRAY ((size_t)64 << 10) /* arrays this big start on a 4096-byte boundary */

void nb_ckpt__step_name(int64_t step, char out[32]) { snprintf(out, 32, "step_%08lld", (long long)step); }

bool nb_ckpt__parse_step_name(const char *name, int64_t *step) {
  if (strncmp(name, "step_", 5) != 0) return false;
  const char *d = name + 5;
  size_t n = strlen(d);
  if (n == 0 || n > 18 || strspn(d, "0123456789") != n) return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) v = v * 10 + (d[i] - '0');
  char canon[32];
  nb_ckpt__step_name(v, canon);
  if (strcmp(canon, name) != 0) return false; /* one spelling per step */
  *step = v;
  return true;
}

/* ---- the commit marker ---------------------------------------------------- */

nb_status nb_ckpt__read_commit(nb_ctx *ctx, const char *step_dir, int64_t *step, uint64_t *manifest_xxh3) {
  char path[NB_CKPT__PATH_CAP], *txt;
  size_t n;
  if (nb_ckpt__pathf(ctx, path, "%s/%s", step_dir, NB_CKPT__COMMIT) != NB_OK) return NB_ERR_INVALID_ARG;
  nb_status s = nb_ckpt__read_file(ctx, path, 4096, &txt, &n);
  if (s == NB_ERR_NOT_FOUND)
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "'%s' has no commit marker (an interrupted or deleted save)", step_dir);
  if (s != NB_OK) return s;
  cJSON *j = cJSON_ParseWithLength(txt, n);
  nb_dealloc(ctx, txt, n + 1);
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step"), *h = cJSON_GetObjectItemCaseSensitive(j, "manifest_xxh3");
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  bool ok = cJSON_IsString(fmt) && !strcmp(fmt->valuestring, NB_CKPT__FORMAT) && cJSON_IsNumber(st) &&
            nb_ckpt__json_int(st->valuedouble, 0, step) && cJSON_IsString(h) &&
            nb_ckpt__parse_hex64(h->valuestring, manifest_xxh3);
  cJSON_Delete(j);
  if (!ok) return nb_errorf(ctx, NB_ERR_FORMAT, "commit marker '%s' is damaged", path);
  return NB_OK;
}

/* ---- data files --------------------------------------------------------------- */

static nb_status write_zeros(nb_ctx *ctx, int fd, size_t n, const char *path) {
  static const uint8_t zeros[4096];
  while (n > 0) {
    size_t k = n < sizeof zeros ? n : sizeof zeros;
    nb_status s = nb_ckpt__write_all(ctx, fd, zeros, k, path);
    if (s != NB_OK) return s;
    n -= k;
  }
  return NB_OK;
}

/* Writes one array at the current end (pos), hashing it chunk by chunk. */
static nb_status write_array(nb_ctx *ctx, int fd, XXH3_state_t *h, nb_ckpt__snap_array *sa, uint64_t *pos,
                             const char *path) {
  size_t nbytes = nb_array_nbytes(sa->array), align = nbytes >= BIG_ARRAY ? 4096 : 64;
  uint64_t at = (*pos + align - 1) / align * align;
  nb_status s = write_zeros(ctx, fd, (size_t)(at - *pos), path);
  const uint8_t *data = nb_array_data(sa->array);
  XXH3_64bits_reset(h);
  for (size_t done = 0; s == NB_OK && done < nbytes; done += WRITE_CHUNK) {
    size_t k = nbytes - done < WRITE_CHUNK ? nbytes - done : WRITE_CHUNK;
    XXH3_64bits_update(h, data + done, k);
    s = nb_ckpt__write_all(ctx, fd, data + done, k, path);
    /* start write-back now, so the disk works while we hash the next chunk
     * and the final fsync has little left to do (a hint: errors show there) */
    if (s == NB_OK && k == WRITE_CHUNK) sync_file_range(fd, (off64_t)(at + done), (off64_t)k, SYNC_FILE_RANGE_WRITE);
  }
  sa->offset = at;
  sa->xxh3 = XXH3_64bits_digest(h);
  *pos = at + nbytes;
  return s;
}

static nb_status write_item(nb_ctx *ctx, const char *dir, nb_ckpt__snap_item *it, int process) {
  char path[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, path, "%s/" NB_CKPT__DATA_FILE, dir, it->name, process) != NB_OK) return NB_ERR_INVALID_ARG;
  XXH3_state_t *h = XXH3_createState();
  if (!h) return nb_errorf(ctx, NB_ERR_NOMEM, "out of memory for a hash state");
  int fd = nb_ckpt__io_tick() == 0 ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
  nb_status s = fd < 0 ? nb_errorf(ctx, NB_ERR_IO, "cannot create '%s': %s", path, strerror(errno)) : NB_OK;
  uint64_t pos = 0;
  for (size_t j = 0; s == NB_OK && j < it->n; j++) s = write_array(ctx, fd, h, &it->arrays[j], &pos, path);
  if (s == NB_OK) s = nb_ckpt__fsync_fd(ctx, fd, path);
  if (fd >= 0) close(fd);
  XXH3_freeState(h);
  return s;
}

static nb_status write_plain(nb_ctx *ctx, const char *dir, const char *name, const char *text) {
  char path[NB_CKPT__PATH_CAP];
  if (nb_ckpt__pathf(ctx, path, "%s/%s", dir, name) != NB_OK) return NB_ERR_INVALID_ARG;
  int fd = nb_ckpt__io_tick() == 0 ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
  if (fd < 0) return nb_errorf(ctx, NB_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
  nb_status s = nb_ckpt__write_all(ctx, fd, text, strlen(text), path);
  if (s == NB_OK) s = nb_ckpt__fsync_fd(ctx, fd, path);
  close(fd);
  return s;
}

nb_status nb_ckpt__write_items(nb_ctx *ctx, const char *dir, nb_ckpt__snapshot *s) {
  nb_status st = NB_OK;
  for (size_t i = 0; st == NB_OK && i < s->n_items; i++) st = write_item(ctx, dir, &s->items[i], s->process);
  return st;
}

/* ---- one step ------------------------------------------------------------------- */

/* Fills the temporary directory: data files, then the manifest. Returns the
 * manifest's hash in *mh. */
static nb_status fill_tmp(nb_ctx *ctx, const char *tmp, nb_ckpt__snapshot *s, uint64_t *mh) {
  if (nb_ckpt__io_tick() != 0 || mkdir(tmp, 0755) != 0)
    return nb_errorf(ctx, NB_ERR_IO, "cannot create directory '%s': %s", tmp, strerror(errno));
  nb_status st = nb_ckpt__write_items(ctx, tmp, s);
  if (st != NB_OK) return st;
  char *manifest = nb_ckpt__manifest_build(ctx, s);
  if (!manifest) return nb_ctx_status(ctx);
  *mh = nb_ckpt__xxh3(manifest, strlen(manifest));
  st = write_plain(ctx, tmp, NB_CKPT__MANIFEST, manifest);
  nb_ckpt_string_free(ctx, manifest);
  if (st == NB_OK) st = nb_ckpt__fsync_dir(ctx, tmp);
  return st;
}

static nb_status write_commit(nb_ctx *ctx, const char *final, int64_t step, uint64_t mh) {
  char hex[17], text[256];
  nb_ckpt__hex64(mh, hex);
  int n = snprintf(text, sizeof text, "{\"format\": \"%s\", \"step\": %lld, \"manifest_xxh3\": \"%s\"}\n",
                   NB_CKPT__FORMAT, (long long)step, hex);
  return nb_ckpt__write_file_durable(ctx, final, NB_CKPT__COMMIT, text, (size_t)n);
}

nb_status nb_ckpt__write_step(nb_ctx *ctx, const char *root, nb_ckpt__snapshot *s) {
  static _Atomic uint64_t seq;
  char name[32], tmp[NB_CKPT__PATH_CAP], final[NB_CKPT__PATH_CAP];
  nb_ckpt__step_name(s->step, name);
  if (nb_ckpt__pathf(ctx, final, "%s/%s", root, name) != NB_OK ||
      nb_ckpt__pathf(ctx, tmp, "%s/.tmp-%s-%d-%llu", root, name, (int)getpid(),
                     (unsigned long long)atomic_fetch_add(&seq, 1)) != NB_OK)
    return NB_ERR_INVALID_ARG;
  if (nb_ckpt__exists(final))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "step %lld already exists in '%s'", (long long)s->step, root);
  uint64_t mh = 0;
  nb_status st = fill_tmp(ctx, tmp, s, &mh);
  if (st != NB_OK) {
    nb_ckpt__remove_tree(NULL, tmp);
    return st;
  }
  return nb_ckpt__commit(ctx, root, tmp, s->step, mh);
}

nb_status nb_ckpt__commit(nb_ctx *ctx, const char *root, const char *tmp, int64_t step, uint64_t mh) {
  char name[32], final[NB_CKPT__PATH_CAP];
  nb_ckpt__step_name(step, name);
  if (nb_ckpt__pathf(ctx, final, "%s/%s", root, name) != NB_OK) return NB_ERR_INVALID_ARG;
  nb_status st = nb_ckpt__rename(ctx, tmp, final);
  if (st != NB_OK) {
    nb_ckpt__remove_tree(NULL, tmp);
    return st;
  }
  st = nb_ckpt__fsync_dir(ctx, root);
  if (st == NB_OK) st = write_commit(ctx, final, step, mh);
  if (st != NB_OK) nb_ckpt__remove_tree(NULL, final);
  return st;
}
