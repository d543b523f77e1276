/* Private to the ckpt library: file-system helpers (durable writes, directory
 * fsync, fault injection), shared read-only file mappings, the parsed
 * manifest, and the snapshot a save writes. The public API is
 * include/nabla/ckpt.h; the on-disk format is docs/checkpoint-format.md. */
#ifndef NABLA_CKPT_INTERNAL_H
#define NABLA_CKPT_INTERNAL_H

#include <stdatomic.h>

#include "nabla/ckpt.h"

#define NB_CKPT__FORMAT "nabla-checkpoint"
#define NB_CKPT__VERSION 1
#define NB_CKPT__MANIFEST "manifest.json"
#define NB_CKPT__COMMIT "COMMIT"
#define NB_CKPT__MAX_MANIFEST ((size_t)256 << 20)
#define NB_CKPT__PATH_CAP 4096
#define NB_CKPT__MAX_SHARDS 4096
#define NB_CKPT__DATA_FILE "%s.%05d.bin" /* an item's data file, written by process %05d */

/* ---- fault injection (tests only) ------------------------------------- */
/* Every mutating file-system call (create, write, fsync, rename, mkdir,
 * unlink) counts as one I/O operation. nb_ckpt__io_fault(n, kill): the n-th
 * operation from now fails with EIO, or with kill the process SIGKILLs
 * itself right before it. n = 0 turns injection off. */
void nb_ckpt__io_fault(int64_t n, bool kill);
int64_t nb_ckpt__io_count(void);
/* 0, or -1 with errno = EIO when this operation is the injected failure. */
int nb_ckpt__io_tick(void);

/* ---- file system -------------------------------------------------------- */
/* Formats a path into buf[NB_CKPT__PATH_CAP]; an error if it does not fit. */
nb_status nb_ckpt__pathf(nb_ctx *ctx, char *buf, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool nb_ckpt__exists(const char *path);
nb_status nb_ckpt__mkdirs(nb_ctx *ctx, const char *path);
nb_status nb_ckpt__fsync_dir(nb_ctx *ctx, const char *path);
nb_status nb_ckpt__rename(nb_ctx *ctx, const char *from, const char *to);
/* rm -rf: the directory and everything below it (no symlink is followed). */
nb_status nb_ckpt__remove_tree(nb_ctx *ctx, const char *path);
nb_status nb_ckpt__write_all(nb_ctx *ctx, int fd, const void *buf, size_t n, const char *path);
nb_status nb_ckpt__fsync_fd(nb_ctx *ctx, int fd, const char *path);
/* Writes dir/name durably and atomically: dir/name.tmp, fsync, rename,
 * fsync dir. */
nb_status nb_ckpt__write_file_durable(nb_ctx *ctx, const char *dir, const char *name, const void *data, size_t n);
/* Reads a whole file (at most max bytes, else NB_ERR_FORMAT) into a new
 * NUL-terminated buffer of *n + 1 bytes (free with nb_dealloc(ctx, p, *n + 1)). */
nb_status nb_ckpt__read_file(nb_ctx *ctx, const char *path, size_t max, char **out, size_t *n);
/* Reads exactly n bytes at offset; a short file is NB_ERR_FORMAT. */
nb_status nb_ckpt__pread_all(nb_ctx *ctx, int fd, void *buf, size_t n, uint64_t offset, const char *path);

/* ---- shared read-only mappings ----------------------------------------- */
/* A whole file mapped read-only, reference counted; arrays wrapping parts of
 * it hold one reference each (released through nb_ckpt__map_release_cb). */
typedef struct nb_ckpt__map nb_ckpt__map;
/* Maps path; NB_ERR_FORMAT naming the file when it is shorter than
 * min_size. Returns a new reference. */
nb_ckpt__map *nb_ckpt__map_open(nb_ctx *ctx, const char *path, uint64_t min_size);
const uint8_t *nb_ckpt__map_data(const nb_ckpt__map *m);
uint64_t nb_ckpt__map_size(const nb_ckpt__map *m);
void nb_ckpt__map_retain(nb_ckpt__map *m);
void nb_ckpt__map_release(nb_ckpt__map *m);
void nb_ckpt__map_release_cb(void *ud);
/* Starts read-ahead of [offset, offset + len). */
void nb_ckpt__map_willneed(nb_ckpt__map *m, uint64_t offset, uint64_t len);
/* A new array wrapping [offset, offset + nbytes) of the mapping (which it
 * retains), or a fresh copy when the bytes are not aligned for t. */
nb_array *nb_ckpt__map_array(nb_ctx *ctx, nb_ckpt__map *m, uint64_t offset, nb_dtype t, const nb_shape *shape);

/* ---- names and small helpers -------------------------------------------- */
bool nb_ckpt__valid_item_name(const char *s);
bool nb_ckpt__valid_file_name(const char *s);
bool nb_ckpt__valid_tree_path(const char *s);
void nb_ckpt__hex64(uint64_t v, char out[17]);
bool nb_ckpt__parse_hex64(const char *s, uint64_t *v);
/* XXH3-64 of a buffer, in chunks (any size). */
uint64_t nb_ckpt__xxh3(const void *p, size_t n);
/* Whether a double read from JSON is an integer in [lo, 2^53]. */
bool nb_ckpt__json_int(double d, double lo, int64_t *out);

/* ---- the parsed manifest ------------------------------------------------ */
typedef struct nb_ckpt__shard {
  char *file;                     /* a file name in the step directory */
  uint64_t offset, nbytes, xxh3;
  int64_t start[NB_MAX_RANK];     /* index of the shard's first element */
  int64_t extent[NB_MAX_RANK];    /* the shard's shape */
} nb_ckpt__shard;

typedef struct nb_ckpt__array {
  nb_ckpt_entry e;                /* e.item points into info->items, e.path owned */
  nb_ckpt__shard *shards;         /* e.n_shards of them */
} nb_ckpt__array;

struct nb_ckpt_info {
  nb_ctx *ctx;
  char *dir;                      /* the step directory, or NULL when parsed from memory */
  int64_t step;
  bool has_metric;
  double metric;
  char *metadata;                 /* compact JSON or NULL */
  size_t n_items;
  char **items;
  size_t n, cap_arrays;           /* arrays[0..n) parsed, cap_arrays allocated */
  nb_ckpt__array *arrays;
  size_t total_bytes;
};

/* Parses and validates manifest text (what names the file in messages).
 * Returns a new info (dir NULL) or NULL with an NB_ERR_FORMAT error. */
nb_ckpt_info *nb_ckpt__manifest_parse(nb_ctx *ctx, const char *text, size_t n, const char *what);

/* ---- snapshots: what one save writes ------------------------------------ */
typedef struct nb_ckpt__snap_array {
  char *path;
  nb_array *array;                /* a reference, host memory */
  uint64_t offset, xxh3;          /* filled by the writer */
  nb_shape whole;                 /* the whole array's shape (a sharded save: array is the block at start) */
  int64_t start[NB_MAX_RANK];
} nb_ckpt__snap_array;

typedef struct nb_ckpt__snap_item {
  char *name;
  size_t n;
  nb_ckpt__snap_array *arrays;
} nb_ckpt__snap_item;

typedef struct nb_ckpt__snapshot {
  nb_ctx *ctx;                    /* the context that allocated it */
  int64_t step;
  size_t n_items;
  nb_ckpt__snap_item *items;
  char *metadata;                 /* compact JSON or NULL */
  bool has_metric;
  double metric;
  int process;                    /* the writing process: its data files are <item>.<process>.bin */
} nb_ckpt__snapshot;

/* Validates items (names, leaves) and takes the snapshot: host arrays are
 * retained, device arrays copied to host. */
nb_ckpt__snapshot *nb_ckpt__snapshot_take(nb_ctx *ctx, int64_t step, const nb_ckpt_item *items, int n_items,
                                          const nb_ckpt_save_opts *opts);
void nb_ckpt__snapshot_free(nb_ckpt__snapshot *s);
/* The manifest text for a written snapshot (offsets and checksums filled).
 * Returns a string to free with nb_ckpt_string_free, or NULL. */
char *nb_ckpt__manifest_build(nb_ctx *ctx, const nb_ckpt__snapshot *s);
/* Writes the snapshot's data files into dir (fsynced), filling offsets and
 * checksums. */
nb_status nb_ckpt__write_items(nb_ctx *ctx, const char *dir, nb_ckpt__snapshot *s);
/* Writes the snapshot as root/step_<step>, atomically and durably, ending
 * with the commit marker. Leaves nothing behind on failure (best effort). */
nb_status nb_ckpt__write_step(nb_ctx *ctx, const char *root, nb_ckpt__snapshot *s);
/* The directory name of a step: "step_%08lld". */
void nb_ckpt__step_name(int64_t step, char out[32]);
/* Parses "step_<digits>"; false for anything else. */
bool nb_ckpt__parse_step_name(const char *name, int64_t *step);
/* The commit (steps 2-3 of the protocol): renames the filled temporary
 * directory tmp (manifest included, hash mh) to root/step_<step> and writes
 * the commit marker. */
nb_status nb_ckpt__commit(nb_ctx *ctx, const char *root, const char *tmp, int64_t step, uint64_t mh);
/* Sharded saves (sharded.c): the whole shape and first row of each array
 * of a process's snapshot, then the save by every process of c (failed: this
 * process's error before it, which fails the save everywhere). */
nb_status nb_ckpt__snapshot_place(nb_ctx *ctx, nb_ckpt__snapshot *snap, const nb_ckpt_shards *sh);
nb_status nb_ckpt__save_sharded(nb_ctx *ctx, const char *root, nb_ckpt__snapshot *snap, nb_comm *c, nb_status failed);
/* Reads and checks step_dir/COMMIT: NB_ERR_NOT_FOUND without one. */
nb_status nb_ckpt__read_commit(nb_ctx *ctx, const char *step_dir, int64_t *step, uint64_t *manifest_xxh3);
/* Restores (out != NULL) or only verifies (out == NULL) the arrays of an
 * opened step. Returns a new tree in *out. */
nb_status nb_ckpt__restore(nb_ctx *ctx, const nb_ckpt_info *info, const nb_ckpt_restore_opts *opts, nb_tree **out);

#endif
