/* nabla ckpt: checkpoints of named trees of arrays (the analogue of Orbax),
 * and Hugging Face safetensors import/export.
 *
 * A checkpoint manager owns one directory holding one sub-directory per step
 * (step_00000042/). A step holds named *items* (params, opt_state, data_state,
 * ...), each a tree of arrays, plus optional user metadata (any JSON value)
 * and an optional metric. Saves are atomic and crash-safe: a step is written
 * into a temporary directory, fsync'ed, renamed into place and committed by a
 * COMMIT marker; restore never sees a step without its marker. Saves may run
 * in a background thread (async); restores map the data files (mmap) and
 * verify per-array XXH3 checksums unless told not to. The on-disk format is
 * specified in docs/checkpoint-format.md.
 *
 * Non-array state (a data iterator's position, an RNG seed, a config) is
 * stored either as a u8 array leaf (opaque bytes: nb_array_create(ctx, NB_U8,
 * 1, &n, bytes)) or as the user-metadata JSON of the save.
 *
 * Example: save every 100 steps, keep the last 3, restore the latest.
 *
 *   nb_ckpt_options o = {.directory = "runs/x/ckpt", .max_to_keep = 3,
 *                        .save_interval_steps = 100, .async = true};
 *   nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
 *   for (int64_t step = 0; step < n_steps; step++) {
 *     ... train ...
 *     nb_ckpt_item items[] = {{"params", params}, {"opt_state", opt_state}};
 *     if (nb_ckpt_save(m, step, items, 2, NULL, NULL) != NB_OK) fail(nb_ctx_error(ctx));
 *   }
 *   nb_ckpt_wait_until_finished(m);
 *   nb_tree *t = nb_ckpt_restore(m, NB_CKPT_LATEST, NULL);  // "params/...", "opt_state/..."
 *   nb_tree *params = nb_tree_select_prefix(t, "params", true);
 *   nb_tree_destroy(t);
 *   nb_ckpt_manager_destroy(m);
 *
 * Threads: a manager may be used from one thread at a time (its background
 * writer is internal). The context's allocator hook must be thread-safe when
 * async saving is on (the default one is).
 */
#ifndef NABLA_CKPT_H
#define NABLA_CKPT_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Items, options                                                            */
/* ------------------------------------------------------------------------ */

/* A named tree to save. Names are 1..64 characters of [A-Za-z0-9_.-], not
 * starting with '.'; every leaf of the tree must be an array. */
typedef struct nb_ckpt_item {
  const char *name;
  const nb_tree *tree;
} nb_ckpt_item;

#define NB_CKPT_LATEST ((int64_t)-1)

typedef struct nb_ckpt_options {
  const char *directory;        /* created if missing */
  int max_to_keep;              /* keep the N most recent steps; 0 keeps all */
  int64_t keep_period;          /* also keep every step that is a multiple of this; 0: none */
  int keep_best;                /* also keep the N best steps by metric; 0: none */
  bool best_mode_max;           /* best = largest metric (default: smallest) */
  int64_t save_interval_steps;  /* nb_ckpt_save skips steps not a multiple of this; 0 or 1: every step */
  bool async;                   /* write in a background thread */
  bool read_only;               /* inspect only: no lock, no clean-up, no saves */
} nb_ckpt_options;

typedef struct nb_ckpt_save_opts {
  const char *metadata_json;    /* any JSON value, stored in the manifest; NULL: none */
  bool has_metric;              /* metric feeds keep_best */
  double metric;
  bool force;                   /* save even if save_interval_steps says skip */
} nb_ckpt_save_opts;

typedef struct nb_ckpt_restore_opts {
  const char *const *items;     /* restore only these items; NULL: all */
  int n_items;
  const char *const *paths;     /* restore only "<item>/<path>" equal to or under one of these; NULL: all */
  int n_paths;
  /* Optional: a tree with paths "<item>/<path>" whose leaves are arrays or
   * avals. Exactly its paths are restored (all must exist in the step, after
   * the items/paths filters) and each must match dtype and shape. */
  const nb_tree *target;
  bool skip_checksums;          /* don't verify XXH3 checksums (faster) */
  bool no_mmap;                 /* read into fresh host arrays instead of mapping the files */
} nb_ckpt_restore_opts;

/* ------------------------------------------------------------------------ */
/* The manager                                                               */
/* ------------------------------------------------------------------------ */

typedef struct nb_ckpt_manager nb_ckpt_manager;

/* Opens (creating it if needed) the directory, takes an exclusive lock on it
 * (unless read_only), removes leftovers of interrupted saves and deletions,
 * and indexes the committed steps. Returns a new manager or NULL with an
 * error on ctx. opts is borrowed (the directory string is copied). */
nb_ckpt_manager *nb_ckpt_manager_create(nb_ctx *ctx, const nb_ckpt_options *opts);
/* Waits for an in-flight save (an error it had is logged, since it cannot be
 * returned: call nb_ckpt_wait_until_finished first to see it), then frees.
 * NULL is allowed. */
void nb_ckpt_manager_destroy(nb_ckpt_manager *m);

/* Whether nb_ckpt_save(step) would save (save_interval_steps). */
bool nb_ckpt_should_save(const nb_ckpt_manager *m, int64_t step);

/* Saves items at step (>= 0, and not already committed). *saved (may be
 * NULL) tells whether a save happened (false when skipped by
 * save_interval_steps). Items and their trees are borrowed; arrays are
 * retained (host) or copied to host (device) before returning, so the caller
 * may change its trees right away. Async: waits for the previous save, then
 * returns once the new one is queued. If the previous background save
 * failed, returns that error and does not start this one. Retention runs
 * after each commit. opts may be NULL. */
nb_status nb_ckpt_save(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                       const nb_ckpt_save_opts *opts, bool *saved);
/* One checkpoint written by the processes of a job together (FSDP): every
 * process of comm calls nb_ckpt_save_sharded with the same step; each writes
 * the data files of its own blocks (<item>.<rank>.bin) into one temporary
 * directory, then process 0 merges the processes' parts of the manifest
 * (each array lists every process's shard), checks that the shards tile
 * every array, and commits as nb_ckpt_save does: a job that stops before
 * the commit leaves the previous step the latest. Synchronous; every process
 * returns the first error of any of them. Process 0's manager must be
 * writable (it indexes the step and applies retention); the others may be
 * read-only managers of the same directory. */
typedef struct nb_ckpt_shards {
  nb_comm *comm;          /* the processes writing the checkpoint */
  const nb_tree *whole;   /* "<item>/<path>" -> the whole array's aval, for each array this process writes */
  /* A leaf smaller than its whole array along one dim d is block `index` of
   * `count` along d: [index n, index n + its size) with n = ceil(whole[d] /
   * count) (FSDP: rows, d = 0; tensor parallel: a linear's columns or rows).
   * A leaf of the whole shape is the whole array (one process writes it). */
  int64_t index, count;
} nb_ckpt_shards;
nb_status nb_ckpt_save_sharded(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                               const nb_ckpt_save_opts *opts, const nb_ckpt_shards *shards);
/* Blocks until no save is in flight; returns the background save's error,
 * if any (once). */
nb_status nb_ckpt_wait_until_finished(nb_ckpt_manager *m);

/* Committed steps, ascending: writes up to cap of them to steps (may be NULL
 * when cap is 0) and their total count to *n. */
nb_status nb_ckpt_all_steps(nb_ckpt_manager *m, int64_t *steps, size_t cap, size_t *n);
/* The largest committed step, or -1 when there is none. */
nb_status nb_ckpt_latest_step(nb_ckpt_manager *m, int64_t *step);

/* Restores a committed step (or NB_CKPT_LATEST) into a new tree whose paths
 * are "<item>/<path>"; the caller destroys it. Mapped arrays keep their file
 * mapped until released (files of steps deleted meanwhile stay readable).
 * Damaged files give NB_ERR_FORMAT naming the file and the array path; a
 * target mismatch NB_ERR_SHAPE/NB_ERR_DTYPE naming the path and both avals.
 * opts may be NULL (all items, mmap, checksums verified). */
nb_tree *nb_ckpt_restore(nb_ckpt_manager *m, int64_t step, const nb_ckpt_restore_opts *opts);
/* Verifies every checksum of a step (reads all data, keeps none). */
nb_status nb_ckpt_verify(nb_ckpt_manager *m, int64_t step);
/* Writes the step's directory path into buf (NUL-terminated). */
nb_status nb_ckpt_step_path(const nb_ckpt_manager *m, int64_t step, char *buf, size_t cap);
/* Sets a committed step that turned out damaged aside: renames its
 * directory to step_N.damaged (.damaged.2, ... when taken; kept for a human,
 * never read or deleted by nabla) and drops it from the index, so the step
 * can be saved again. aside (may be NULL) gets the new path. A writable
 * manager does the same on open with a step whose commit marker is damaged. */
nb_status nb_ckpt_set_aside(nb_ckpt_manager *m, int64_t step, char *aside, size_t cap);
/* Whether a background save is still being written. */
bool nb_ckpt_save_in_flight(nb_ckpt_manager *m);

/* ------------------------------------------------------------------------ */
/* Reading a step's metadata without its data                                */
/* ------------------------------------------------------------------------ */

typedef struct nb_ckpt_info nb_ckpt_info;

typedef struct nb_ckpt_entry {
  const char *item;   /* "params" */
  const char *path;   /* "layers/0/w" (within the item) */
  nb_dtype dtype;
  nb_shape shape;
  size_t nbytes;
  int n_shards;       /* 1 for single-process saves */
} nb_ckpt_entry;

/* The manifest of a committed step (or NB_CKPT_LATEST). New object; the
 * caller destroys it. */
nb_ckpt_info *nb_ckpt_info_load(nb_ckpt_manager *m, int64_t step);
/* The same for a step directory given by path (for tools). */
nb_ckpt_info *nb_ckpt_info_open(nb_ctx *ctx, const char *step_dir);
void nb_ckpt_info_destroy(nb_ckpt_info *info);         /* NULL ok */
int64_t nb_ckpt_info_step(const nb_ckpt_info *info);
size_t nb_ckpt_info_count(const nb_ckpt_info *info);   /* arrays, all items */
/* Entries in saved order (item by item); pointers valid until destroy. */
const nb_ckpt_entry *nb_ckpt_info_entry(const nb_ckpt_info *info, size_t i);
/* The user metadata as compact JSON text, or NULL; valid until destroy. */
const char *nb_ckpt_info_metadata(const nb_ckpt_info *info);
bool nb_ckpt_info_metric(const nb_ckpt_info *info, double *metric);
size_t nb_ckpt_info_total_bytes(const nb_ckpt_info *info);

/* Restore / verify a step directory given by path (same contracts as
 * nb_ckpt_restore and nb_ckpt_verify). */
nb_tree *nb_ckpt_read_dir(nb_ctx *ctx, const char *step_dir, const nb_ckpt_restore_opts *opts);
nb_status nb_ckpt_verify_dir(nb_ctx *ctx, const char *step_dir);

/* ------------------------------------------------------------------------ */
/* Preemption: SIGTERM / SIGINT ask for an emergency save                    */
/* ------------------------------------------------------------------------ */

/* Installs handlers for SIGTERM and SIGINT that only set a process-wide flag
 * (signals are process-wide: this is the one global state of the library).
 * A second signal of the same kind while the flag is set restores the
 * default action and re-raises it, so a second Ctrl-C still kills. */
nb_status nb_ckpt_preemption_install(nb_ctx *ctx);
/* Restores the handlers that were there before install. */
void nb_ckpt_preemption_uninstall(void);
bool nb_ckpt_preemption_requested(void);
void nb_ckpt_preemption_clear(void);
/* The save a trainer calls when preemption was requested: waits for any
 * in-flight save, then saves step synchronously, ignoring
 * save_interval_steps and async. Succeeds without writing when step is
 * already committed. */
nb_status nb_ckpt_emergency_save(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                                 const nb_ckpt_save_opts *opts);

/* ------------------------------------------------------------------------ */
/* Safetensors                                                               */
/* ------------------------------------------------------------------------ */

typedef struct nb_ckpt_st_opts {
  /* Tensor names <-> tree paths: with hf_names, '.' in a name is '/' in the
   * path ("model.layers.0.weight" <-> model/layers/0/weight); otherwise
   * names are paths verbatim. */
  bool hf_names;
  bool no_mmap;    /* load: copy tensors into fresh arrays instead of mapping the file */
} nb_ckpt_st_opts;

/* Loads a .safetensors file, a sharded set's model.safetensors.index.json,
 * or a directory holding either (index first). Tensors are in data-offset
 * order per file. Validates the header fully before touching data: header
 * size bounded (100 MB), offsets in range, no overlaps or holes, sizes
 * matching shapes; unsupported dtypes are an error naming the tensor. With
 * metadata_json non-NULL, *metadata_json receives the __metadata__ object as
 * JSON text (or NULL when absent; free with nb_ckpt_string_free). Returns a
 * new tree or NULL with an error. opts may be NULL. */
nb_tree *nb_ckpt_safetensors_load(nb_ctx *ctx, const char *path, const nb_ckpt_st_opts *opts, char **metadata_json);
/* Parses a whole safetensors file held in memory (borrowed); arrays are
 * copies. */
nb_tree *nb_ckpt_safetensors_parse(nb_ctx *ctx, const void *data, size_t size, const nb_ckpt_st_opts *opts,
                                   char **metadata_json);
/* Writes tree (all leaves arrays) as one safetensors file, atomically
 * (temporary file, fsync, rename). metadata_json: NULL or a JSON object of
 * string values, stored as __metadata__. */
nb_status nb_ckpt_safetensors_save(nb_ctx *ctx, const char *path, const nb_tree *tree, const char *metadata_json,
                                   const nb_ckpt_st_opts *opts);
/* Writes a sharded set into dir: <base>-00001-of-0000N.safetensors, each at
 * most max_shard_bytes of tensor data (a bigger tensor gets a shard alone),
 * and <base>.safetensors.index.json. base NULL means "model". */
nb_status nb_ckpt_safetensors_save_sharded(nb_ctx *ctx, const char *dir, const char *base, const nb_tree *tree,
                                           const char *metadata_json, size_t max_shard_bytes,
                                           const nb_ckpt_st_opts *opts);
/* Frees a string returned by this library. NULL ok. */
void nb_ckpt_string_free(nb_ctx *ctx, char *s);

/* ------------------------------------------------------------------------ */
/* GGUF (ggml / llama.cpp model files)                                       */
/* ------------------------------------------------------------------------ */

/* GGUF versions 2 and 3, little-endian, as ggml's docs/gguf.md specifies:
 * a header, typed key/value metadata (arrays nested to any depth up to 8),
 * tensor infos (name, up to 4 dims, ggml type, offset) and the aligned data
 * section (general.alignment, default 32). Every count, length, offset,
 * size and type is checked against the file before it is used; an error
 * names the file, the field and the key or tensor ("m.gguf: tensor
 * 'blk.3.attn_q.weight': offset 123 + 4096 bytes beyond the file (size 100)").
 * docs/gguf.md says what is read and written. */

/* ggml tensor types (the numbers are the file's). The table knows the block
 * sizes of all ggml types, so any file parses; decode and encode cover the
 * types listed in nb_gguf_can_decode / nb_gguf_can_encode. */
typedef enum nb_gguf_type {
  NB_GGUF_F32 = 0, NB_GGUF_F16 = 1, NB_GGUF_Q4_0 = 2, NB_GGUF_Q4_1 = 3, NB_GGUF_Q5_0 = 6, NB_GGUF_Q5_1 = 7,
  NB_GGUF_Q8_0 = 8, NB_GGUF_Q8_1 = 9, NB_GGUF_Q2_K = 10, NB_GGUF_Q3_K = 11, NB_GGUF_Q4_K = 12, NB_GGUF_Q5_K = 13,
  NB_GGUF_Q6_K = 14, NB_GGUF_Q8_K = 15, NB_GGUF_BF16 = 30, NB_GGUF_TYPE_LIMIT = 64
} nb_gguf_type;

/* Metadata value types (the numbers are the file's). */
typedef enum nb_gguf_vtype {
  NB_GGUF_UINT8 = 0, NB_GGUF_INT8 = 1, NB_GGUF_UINT16 = 2, NB_GGUF_INT16 = 3, NB_GGUF_UINT32 = 4, NB_GGUF_INT32 = 5,
  NB_GGUF_FLOAT32 = 6, NB_GGUF_BOOL = 7, NB_GGUF_STRING = 8, NB_GGUF_ARRAY = 9, NB_GGUF_UINT64 = 10,
  NB_GGUF_INT64 = 11, NB_GGUF_FLOAT64 = 12, NB_GGUF_VTYPE_COUNT
} nb_gguf_vtype;

/* A metadata value; everything points into the opened file (valid until
 * nb_gguf_close). */
typedef struct nb_gguf_value {
  nb_gguf_vtype type;
  int64_t i;              /* signed integers; unsigned ones that fit; bool (0/1) */
  uint64_t u;             /* unsigned integers */
  double f;               /* floats (and every number, converted) */
  const char *str;        /* STRING: len bytes, not NUL-terminated */
  uint64_t len;
  nb_gguf_vtype elem;     /* ARRAY: element type and count */
  uint64_t n;
  const uint8_t *raw;     /* ARRAY of numbers or bools: n little-endian elements */
  const struct nb_gguf_value *items; /* ARRAY of STRING or ARRAY: n values */
} nb_gguf_value;

typedef struct nb_gguf_tensor {
  const char *name;       /* NUL-terminated, valid UTF-8 */
  nb_gguf_type type;
  int n_dims;             /* 1..4 */
  int64_t ne[4];          /* ggml order: ne[0] is contiguous; unused dims are 1 */
  int64_t n_elems;
  uint64_t offset;        /* of the data, from the start of the file */
  uint64_t nbytes;
  const void *data;       /* the mapped bytes */
} nb_gguf_tensor;

typedef struct nb_gguf nb_gguf;

/* Opens and validates a file (mapped read-only). NULL with NB_ERR_FORMAT (or
 * NB_ERR_IO / NB_ERR_NOT_FOUND) naming the file and field. */
nb_gguf *nb_gguf_open(nb_ctx *ctx, const char *path);
/* The same over size bytes in memory (borrowed until close); name is for
 * messages (NULL: "gguf"). */
nb_gguf *nb_gguf_parse(nb_ctx *ctx, const void *data, size_t size, const char *name);
void nb_gguf_close(nb_gguf *g); /* NULL ok */
uint32_t nb_gguf_version(const nb_gguf *g);
uint64_t nb_gguf_alignment(const nb_gguf *g);
const char *nb_gguf_name(const nb_gguf *g);

size_t nb_gguf_n_kv(const nb_gguf *g);
const char *nb_gguf_kv_key(const nb_gguf *g, size_t i);
const nb_gguf_value *nb_gguf_kv_value(const nb_gguf *g, size_t i);
/* The value of key, or NULL. */
const nb_gguf_value *nb_gguf_get(const nb_gguf *g, const char *key);
/* Typed reads of a key: NB_ERR_NOT_FOUND when absent, NB_ERR_FORMAT when of
 * another type (both naming the file and key). Integers accept every
 * integer type that fits int64; floats accept FLOAT32/FLOAT64. */
nb_status nb_gguf_get_int(const nb_gguf *g, const char *key, int64_t *out);
nb_status nb_gguf_get_float(const nb_gguf *g, const char *key, double *out);
nb_status nb_gguf_get_bool(const nb_gguf *g, const char *key, bool *out);
nb_status nb_gguf_get_string(const nb_gguf *g, const char *key, const char **s, size_t *len);
/* Element j < v->n of an array of numbers (any integer, float or bool type). */
double nb_gguf_array_f64(const nb_gguf_value *v, uint64_t j);
int64_t nb_gguf_array_i64(const nb_gguf_value *v, uint64_t j);

size_t nb_gguf_n_tensors(const nb_gguf *g);
const nb_gguf_tensor *nb_gguf_tensor_at(const nb_gguf *g, size_t i);
const nb_gguf_tensor *nb_gguf_find_tensor(const nb_gguf *g, const char *name);
/* The tensor decoded to a new f32 array of shape [ne[n_dims-1], ..., ne[0]]
 * (row-major, so a ggml [in, out] weight is nabla [out, in]). An undecodable
 * type is NB_ERR_UNIMPLEMENTED naming the tensor and type. */
nb_array *nb_gguf_tensor_f32(const nb_gguf *g, const nb_gguf_tensor *t);

/* Block codecs, bit-exact with ggml's reference (de)quantizers. */
const char *nb_gguf_type_name(nb_gguf_type t);   /* "Q8_0"; NULL for an unknown type */
/* Elements and bytes per block; false for an unknown type. */
bool nb_gguf_type_block(nb_gguf_type t, int64_t *block_elems, int64_t *block_bytes);
bool nb_gguf_can_decode(nb_gguf_type t);         /* F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K */
bool nb_gguf_can_encode(nb_gguf_type t);         /* F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K */
/* n elements (a multiple of the block size) from src to dst. */
nb_status nb_gguf_decode(nb_ctx *ctx, nb_gguf_type t, const void *src, float *dst, int64_t n);
nb_status nb_gguf_encode(nb_ctx *ctx, nb_gguf_type t, const float *src, void *dst, int64_t n);

/* Writing: metadata in the order added, tensors encoded when added (held in
 * memory until saved), alignment 32. Keys and tensor names must be unique
 * and valid UTF-8. */
typedef struct nb_gguf_writer nb_gguf_writer;
nb_gguf_writer *nb_gguf_writer_create(nb_ctx *ctx);
void nb_gguf_writer_destroy(nb_gguf_writer *w); /* NULL ok */
nb_status nb_gguf_write_u32(nb_gguf_writer *w, const char *key, uint32_t v);
nb_status nb_gguf_write_i32(nb_gguf_writer *w, const char *key, int32_t v);
nb_status nb_gguf_write_f32(nb_gguf_writer *w, const char *key, float v);
nb_status nb_gguf_write_bool(nb_gguf_writer *w, const char *key, bool v);
nb_status nb_gguf_write_string(nb_gguf_writer *w, const char *key, const char *s, size_t len);
/* Arrays: strings (lens NULL: NUL-terminated), f32, i32. */
nb_status nb_gguf_write_strings(nb_gguf_writer *w, const char *key, const char *const *s, const size_t *lens, size_t n);
nb_status nb_gguf_write_f32s(nb_gguf_writer *w, const char *key, const float *v, size_t n);
nb_status nb_gguf_write_i32s(nb_gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* A float array of rank 1..4, row-major (nabla [out, in] becomes ggml
 * ne = [in, out]), encoded as type; its last dim must be a multiple of the
 * type's block size. */
nb_status nb_gguf_write_tensor(nb_gguf_writer *w, const char *name, nb_gguf_type type, const nb_array *x);
/* Writes the file atomically (path.tmp, fsync, rename). */
nb_status nb_gguf_writer_save(nb_gguf_writer *w, const char *path);

NB_END_DECLS
#endif /* NABLA_CKPT_H */
