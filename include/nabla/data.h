/* nabla data: record files, token shards, a tokenizer hook, and input
 * pipelines (the analogue of Grain + ArrayRecord).
 *
 * Files. A record file (docs/record-format.md) holds byte strings in
 * checksummed, optionally zstd-compressed chunks with a footer index, so that
 * record i is read with O(1) seeks; a writer that dies leaves a file that
 * readers reject. A token shard (docs/token-shard-format.md) is a header plus
 * packed uint16/uint32 token ids, memory-mapped.
 *
 * Elements. Everything flowing through a pipeline is an nb_data_elem: either
 * bytes (a record, a line of text) or a tree of arrays (a token window
 * {"tokens": i32[T+1]}, a batch {"tokens": i32[B,T+1]}, a packed row
 * {"tokens","segment_ids","positions": i32[R,T]}). An element owns what it
 * holds; nb_data_elem_clear frees it.
 *
 * Pipelines. A map dataset (nb_data_map) is random access: len and get(i),
 * pure functions of the index, so they can run on any thread in any order.
 * Indexes past len wrap around into the next epoch (index = epoch*len + i),
 * which is how repeat and per-epoch reshuffling work. An iterator
 * (nb_data_iter) is a stream with state: map, filter, padded batch, sequence
 * packing and ordered prefetch. Its state serializes to a small JSON string;
 * set on a freshly built, identical pipeline it resumes bit-identically.
 *
 * Ownership: every transform *takes* its input dataset/iterator (a NULL input
 * gives a NULL result, the error already on the context), so calls chain.
 * Map datasets are reference counted (retain to use one in two places).
 *
 * Threads: the record and shard readers and every built-in map dataset are
 * safe to call from many threads. User callbacks given to a map dataset, and
 * iterator map/filter callbacks below a multi-worker prefetch, run on worker
 * threads and must be thread-safe. A worker's error is reported, with its
 * message, by the consumer's next call to nb_data_iter_next.
 *
 * Example: shuffled batches of 8 windows of 128+1 tokens, 2 reader threads.
 *
 *   const char *shards[] = {"train.tok"};
 *   nb_data_map *ds = nb_data_map_tokens(ctx, 1, shards, 128);
 *   ds = nb_data_map_repeat(nb_data_map_shuffle(ds, 42), 0);  // reshuffled per epoch
 *   ds = nb_data_map_batch(ds, 8, true);                      // tokens: i32[8,129]
 *   nb_data_iter *it = nb_data_iter_prefetch(nb_data_iter_create(ds), 2, 16);
 *   nb_data_elem b = NB_DATA_ELEM_INIT;
 *   for (int step = 0; step < 100 && nb_data_iter_next(it, &b) == NB_OK && b.kind; step++) {
 *     nb_array *tok = nb_tree_get_array(b.tree, "tokens");
 *     ...
 *   }
 *   char *state = nb_data_iter_get_state(it);   // save with the checkpoint
 *   nb_data_state_free(ctx, state);
 *   nb_data_elem_clear(ctx, &b);
 *   nb_data_iter_destroy(it);
 */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Elements                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum nb_data_kind {
  NB_DATA_NONE,  /* empty: end of an iterator, or a map element filtered out */
  NB_DATA_BYTES, /* bytes[len] (owned, followed by a NUL not counted in len) */
  NB_DATA_TREE,  /* tree (owned) of arrays */
  NB_DATA_KIND_COUNT
} nb_data_kind;

typedef struct nb_data_elem {
  nb_data_kind kind;
  uint8_t *bytes;
  size_t len;
  nb_tree *tree;
} nb_data_elem;
#define NB_DATA_ELEM_INIT {NB_DATA_NONE, NULL, 0, NULL}

/* Frees what e holds and sets it to NONE. */
void nb_data_elem_clear(nb_ctx *ctx, nb_data_elem *e);
/* Clears e, then holds a copy of data[len]. */
nb_status nb_data_elem_set_bytes(nb_ctx *ctx, nb_data_elem *e, const void *data, size_t len);
/* Clears e, then holds t (takes t). */
void nb_data_elem_set_tree(nb_ctx *ctx, nb_data_elem *e, nb_tree *t);
/* dst (cleared first) gets a copy of src; tree leaves are shared. */
nb_status nb_data_elem_copy(nb_ctx *ctx, const nb_data_elem *src, nb_data_elem *dst);
/* Same kind and equal bytes, or equal tree paths and arrays. */
bool nb_data_elem_equal(const nb_data_elem *a, const nb_data_elem *b);

/* ------------------------------------------------------------------------ */
/* Checksums, progress                                                       */
/* ------------------------------------------------------------------------ */

typedef enum nb_data_checksum { NB_DATA_XXH3, NB_DATA_CRC32C, NB_DATA_CHECKSUM_COUNT } nb_data_checksum;
const char *nb_data_checksum_name(nb_data_checksum c); /* "xxh3", "crc32c" */
bool nb_data_checksum_from_name(const char *name, nb_data_checksum *out);
/* XXH3-64 (libxxhash), or CRC32C (Castagnoli) zero-extended to 64 bits. */
uint64_t nb_data_checksum_bytes(nb_data_checksum c, const void *p, size_t n);

/* Called now and then by long operations: done of total units (bytes). */
typedef void (*nb_data_progress_fn)(void *ud, uint64_t done, uint64_t total);

/* What a file holds, from its first bytes (never its name): a token shard
 * (magic "NBTOKENS"), a record file ("NBRECORD"), a directory, binary (a
 * NUL byte in the first 64 KiB) or text. Errors name the path. */
typedef enum nb_data_format {
  NB_DATA_FORMAT_TEXT, NB_DATA_FORMAT_TOKENS, NB_DATA_FORMAT_RECORDS, NB_DATA_FORMAT_BINARY, NB_DATA_FORMAT_DIR
} nb_data_format;
nb_status nb_data_detect_format(nb_ctx *ctx, const char *path, nb_data_format *out);
const char *nb_data_format_name(nb_data_format f); /* "a token shard", ... for messages */

/* ------------------------------------------------------------------------ */
/* Record files                                                              */
/* ------------------------------------------------------------------------ */

typedef struct nb_data_rec_writer nb_data_rec_writer;
typedef struct nb_data_rec_reader nb_data_rec_reader;

typedef struct nb_data_rec_opts {
  size_t chunk_bytes;         /* target raw bytes per chunk; 0: 1 MiB. A bigger record gets a chunk of its own */
  int zstd_level;             /* 0: store chunks raw; 1..19: zstd level */
  nb_data_checksum checksum;  /* per chunk and for the footer */
} nb_data_rec_opts;

/* Opens path for writing (truncates). opts may be NULL for the defaults. */
nb_data_rec_writer *nb_data_rec_create(nb_ctx *ctx, const char *path, const nb_data_rec_opts *opts);
/* Appends one record (borrows data). */
nb_status nb_data_rec_write(nb_data_rec_writer *w, const void *data, size_t len);
int64_t nb_data_rec_writer_count(const nb_data_rec_writer *w);
/* Writes the last chunk, the footer index and the trailer, closes and frees
 * w (always, even on error: then the file has no valid trailer). */
nb_status nb_data_rec_finish(nb_data_rec_writer *w);
/* Closes and frees w without a footer: the file is what a crash leaves. */
void nb_data_rec_abandon(nb_data_rec_writer *w);

/* Opens (mmap) and validates header, trailer and footer index; errors name
 * the file and what is wrong. Chunk checksums are checked on first use. */
nb_data_rec_reader *nb_data_rec_open(nb_ctx *ctx, const char *path);
void nb_data_rec_close(nb_data_rec_reader *r);
int64_t nb_data_rec_count(const nb_data_rec_reader *r);
/* out (cleared first) gets record i as bytes. Thread-safe. */
nb_status nb_data_rec_read(nb_data_rec_reader *r, int64_t i, nb_data_elem *out);

typedef struct nb_data_rec_info {
  int64_t records, chunks, compressed_chunks;
  uint64_t file_bytes, raw_bytes, stored_bytes; /* chunk payloads before/after compression */
  nb_data_checksum checksum;
  uint32_t version;
} nb_data_rec_info;
void nb_data_rec_get_info(const nb_data_rec_reader *r, nb_data_rec_info *out);
/* Checks every chunk's checksum and structure; the first bad one is an
 * NB_ERR_FORMAT naming the file, chunk and record range. */
nb_status nb_data_rec_verify(nb_data_rec_reader *r, nb_data_progress_fn progress, void *ud);

/* ------------------------------------------------------------------------ */
/* Token shards                                                              */
/* ------------------------------------------------------------------------ */

typedef struct nb_data_shard_writer nb_data_shard_writer;
typedef struct nb_data_shard nb_data_shard;

/* token_bytes: 2 (uint16 ids, vocab <= 65536) or 4; 0 picks by vocab_size. */
nb_data_shard_writer *nb_data_shard_create(nb_ctx *ctx, const char *path, int token_bytes, int64_t vocab_size);
/* Appends ids (each in [0, vocab_size)); end_document counts a document. */
nb_status nb_data_shard_write(nb_data_shard_writer *w, const int32_t *ids, size_t n);
void nb_data_shard_end_document(nb_data_shard_writer *w);
int64_t nb_data_shard_writer_count(const nb_data_shard_writer *w);
/* Finalizes the header (count, checksum), closes and frees w (always). */
nb_status nb_data_shard_finish(nb_data_shard_writer *w);
void nb_data_shard_abandon(nb_data_shard_writer *w);

/* Opens (mmap) and validates the header against the file size. */
nb_data_shard *nb_data_shard_open(nb_ctx *ctx, const char *path);
void nb_data_shard_close(nb_data_shard *s);
int64_t nb_data_shard_count(const nb_data_shard *s);     /* tokens */
int64_t nb_data_shard_documents(const nb_data_shard *s);
int64_t nb_data_shard_vocab(const nb_data_shard *s);
int nb_data_shard_token_bytes(const nb_data_shard *s);
/* The XXH3-64 of the token data the header records (what verify checks). */
uint64_t nb_data_shard_checksum(const nb_data_shard *s);
/* Copies tokens [start, start+n) into out as int32. Thread-safe. */
nb_status nb_data_shard_read(const nb_data_shard *s, int64_t start, int64_t n, int32_t *out);
/* Checks the data checksum and that every id is below the vocab size. */
nb_status nb_data_shard_verify(const nb_data_shard *s, nb_data_progress_fn progress, void *ud);

/* ------------------------------------------------------------------------ */
/* Tokenizer hook and building files from text                               */
/* ------------------------------------------------------------------------ */

/* A growable id vector the tokenizer appends to. */
typedef struct nb_data_ids {
  nb_ctx *ctx;
  int32_t *ids;
  size_t len, cap;
} nb_data_ids;
nb_status nb_data_ids_push(nb_data_ids *v, const int32_t *ids, size_t n);
void nb_data_ids_free(nb_data_ids *v);

/* Any tokenizer: encode appends the ids of text[0..len) to out (borrowing
 * text). It must be thread-safe when used below prefetch workers. */
typedef struct nb_data_tokenizer {
  nb_status (*encode)(void *ud, nb_ctx *ctx, const char *text, size_t len, nb_data_ids *out);
  void *ud;
  int64_t vocab_size;
  int32_t eos_id; /* appended after each document when >= 0 */
} nb_data_tokenizer;
/* The built-in byte-level tokenizer: ids are the bytes, vocab 256, no eos. */
nb_data_tokenizer nb_data_tokenizer_bytes(void);
/* A BPE tokenizer (include/nabla/tokenizer.h; borrowed: it must outlive the
 * result); eos is its "<|endoftext|>" token when it has one, else none. */
struct nb_tok;
nb_data_tokenizer nb_data_tokenizer_bpe(const struct nb_tok *tok);

typedef enum nb_data_unit { NB_DATA_UNIT_LINE, NB_DATA_UNIT_FILE, NB_DATA_UNIT_COUNT } nb_data_unit;

/* Inputs are files or directories (walked recursively, in sorted order,
 * hidden entries skipped). A file ending in .jsonl gives one document per
 * line: the string value of jsonl_field (default "text"); other files give
 * one document per line or one per file (unit). */
typedef struct nb_data_build_opts {
  const char *jsonl_field;
  nb_data_unit unit;
  bool keep_empty;                 /* keep empty documents (default: skipped) */
  nb_data_progress_fn progress;    /* bytes of input read, of the total */
  void *progress_ud;
} nb_data_build_opts;

/* One record per document. n_out (optional) gets the record count. */
nb_status nb_data_build_records(nb_ctx *ctx, const char *out_path, int n_inputs, const char *const *inputs,
                                const nb_data_build_opts *opts, const nb_data_rec_opts *rec, int64_t *n_out);
/* All documents tokenized into one shard (eos after each when set).
 * tok NULL: the byte-level tokenizer. n_out (optional): token count. */
nb_status nb_data_build_shard(nb_ctx *ctx, const char *out_path, int n_inputs, const char *const *inputs,
                              const nb_data_build_opts *opts, const nb_data_tokenizer *tok, int token_bytes,
                              int64_t *n_out);

/* ------------------------------------------------------------------------ */
/* Per-record random numbers                                                 */
/* ------------------------------------------------------------------------ */

/* xoshiro256** seeded by a hash of (seed, index): a record's stream depends
 * only on its index, never on threads or order. */
typedef struct nb_data_rng {
  uint64_t s[4];
} nb_data_rng;
nb_data_rng nb_data_rng_make(uint64_t seed, uint64_t index);
uint64_t nb_data_rng_next(nb_data_rng *r);
double nb_data_rng_uniform(nb_data_rng *r);             /* [0, 1) */
uint64_t nb_data_rng_below(nb_data_rng *r, uint64_t n); /* [0, n), unbiased; n > 0 */

/* ------------------------------------------------------------------------ */
/* Map datasets: random access                                               */
/* ------------------------------------------------------------------------ */

typedef struct nb_data_map nb_data_map;

/* Callback types. All borrow ud; e is in/out. */
typedef nb_status (*nb_data_get_fn)(void *ud, nb_ctx *ctx, int64_t index, nb_data_elem *out);
typedef nb_status (*nb_data_map_fn)(void *ud, nb_ctx *ctx, nb_data_elem *e);
typedef nb_status (*nb_data_random_map_fn)(void *ud, nb_ctx *ctx, nb_data_rng *rng, nb_data_elem *e);
typedef nb_status (*nb_data_filter_fn)(void *ud, nb_ctx *ctx, const nb_data_elem *e, bool *keep);

/* Sources (each returns a new dataset with one reference, or NULL). */
/* Many record files as one indexable source of bytes elements (borrows paths). */
nb_data_map *nb_data_map_records(nb_ctx *ctx, int n, const char *const *paths);
/* Windows of seq_len+1 tokens, {"tokens": i32[seq_len+1]}, window i starting
 * at token i*seq_len of its shard (consecutive windows share one token, the
 * last target of one is the first input of the next); windows never cross
 * shards. */
nb_data_map *nb_data_map_tokens(nb_ctx *ctx, int n, const char *const *paths, int64_t seq_len);
/* Lines of a text file as bytes (without the newline), or with jsonl_field,
 * the string value of that field of each JSONL line (other JSON values give
 * their JSON text). */
nb_data_map *nb_data_map_lines(nb_ctx *ctx, const char *path, const char *jsonl_field);
/* In-memory arrays: every leaf of `arrays` (borrowed; leaves retained) has the
 * same first dim N; element i is the tree of slices [i]. */
nb_data_map *nb_data_map_arrays(nb_ctx *ctx, const nb_tree *arrays);
/* A user source of len elements: fn(ud, ctx, i, out) for i in [0, len).
 * ud is borrowed for the dataset's life. */
nb_data_map *nb_data_map_source(nb_ctx *ctx, int64_t len, nb_data_get_fn fn, void *ud);

/* Transforms (take ds). */
/* A global permutation, different per epoch, from (seed, epoch): a Feistel
 * network over the index with cycle-walking, O(1) memory. Put repeat after
 * shuffle to reshuffle every epoch (shuffle after repeat permutes the whole
 * repeated range as one). */
nb_data_map *nb_data_map_shuffle(nb_data_map *ds, uint64_t seed);
/* Elements start, start+step, ... below stop (clamped to len); step >= 1. */
nb_data_map *nb_data_map_slice(nb_data_map *ds, int64_t start, int64_t stop, int64_t step);
/* len*epochs elements (epochs <= 0: unbounded, len INT64_MAX). */
nb_data_map *nb_data_map_repeat(nb_data_map *ds, int64_t epochs);
nb_data_map *nb_data_map_map(nb_data_map *ds, nb_data_map_fn fn, void *ud);
/* fn gets an RNG made from (seed, index). */
nb_data_map *nb_data_map_random_map(nb_data_map *ds, nb_data_random_map_fn fn, void *ud, uint64_t seed);
/* Dropped elements read as NONE (a hole); iterators skip holes. */
nb_data_map *nb_data_map_filter(nb_data_map *ds, nb_data_filter_fn fn, void *ud);
/* Element i stacks elements [i*size, (i+1)*size): tree leaves get a leading
 * batch axis (shapes must agree; holes are an error). */
nb_data_map *nb_data_map_batch(nb_data_map *ds, int64_t size, bool drop_remainder);
/* Weighted mixture (takes all of dss; weights > 0, normalized): a fixed
 * interleaving in which every window of n positions holds within 2 elements
 * of n*w_k from dataset k (weights are rounded to 1/10000). Its len ends
 * where the first dataset would start a second epoch; indexes past len go on
 * (each dataset wraps into its own next epoch). */
nb_data_map *nb_data_map_mix(nb_ctx *ctx, int n, nb_data_map **dss, const double *weights);
/* This process's contiguous part of ds out of count: the parts are disjoint
 * and, without drop_remainder, cover ds exactly; with it, every part has
 * len/count elements. */
nb_data_map *nb_data_map_shard(nb_data_map *ds, int64_t index, int64_t count, bool drop_remainder);
/* Bytes elements to {"tokens": i32[n]} (tok copied; NULL: byte level). */
nb_data_map *nb_data_map_tokenize(nb_data_map *ds, const nb_data_tokenizer *tok);

int64_t nb_data_map_len(const nb_data_map *ds);
/* out (cleared first) gets element i (i >= len wraps into later epochs). */
nb_status nb_data_map_get(nb_data_map *ds, int64_t i, nb_data_elem *out);
void nb_data_map_retain(nb_data_map *ds);
void nb_data_map_release(nb_data_map *ds); /* NULL ok */

/* A map function for either stage: {"tokens": [..., T+1]} to {"inputs":
 * [..., T], "targets": [..., T]} (tokens[:-1] and tokens[1:]), other leaves
 * kept. ud unused. */
nb_status nb_data_fn_lm_targets(void *ud, nb_ctx *ctx, nb_data_elem *e);

/* ------------------------------------------------------------------------ */
/* Iterators                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct nb_data_iter nb_data_iter;

/* Reads ds in index order, skipping holes (takes ds). */
nb_data_iter *nb_data_iter_create(nb_data_map *ds);
nb_data_iter *nb_data_iter_map(nb_data_iter *it, nb_data_map_fn fn, void *ud);
nb_data_iter *nb_data_iter_filter(nb_data_iter *it, nb_data_filter_fn fn, void *ud);

typedef struct nb_data_batch_opts {
  int64_t batch_size;
  bool drop_remainder; /* else the last batch may be smaller */
  bool pad;            /* leaves may differ in their first dim: pad it, add "mask" bool[B, L] */
  int64_t pad_to;      /* with pad: L (a longer element is an error); 0: the longest in the batch */
  double pad_value;
} nb_data_batch_opts;
/* Stacks batch_size tree elements (leaves get a leading batch axis). With
 * pad, every rank>=1 leaf of one element must share its first dim n; mask
 * [b, j] is j < n of element b. */
nb_data_iter *nb_data_iter_batch(nb_data_iter *it, const nb_data_batch_opts *opts);

typedef struct nb_data_pack_opts {
  int64_t seq_len; /* T */
  int64_t rows;    /* R rows per output (0: 1) */
} nb_data_pack_opts;
/* First-fit packing of variable-length examples (trees whose leaves are all
 * rank 1 of one length n) into R rows of T: each leaf becomes [R, T] (zero
 * padded) plus "segment_ids" (1, 2, ... per row; 0 for padding) and
 * "positions" (0..n-1 within the example), both i32. An example longer than
 * T is cut into pieces of T, each its own segment (first fit may put a later
 * piece in an earlier row). When the next piece fits in no row the rows are
 * emitted and it starts the next output. */
nb_data_iter *nb_data_iter_pack(nb_data_iter *it, const nb_data_pack_opts *opts);

/* Rows [start, start + count) of every leaf's first axis: the part of a
 * global batch one process of a data-parallel job computes, each process
 * running the whole global pipeline (packing, mixing) and keeping its rows.
 * The stage is left out of the saved state, so every process saves the
 * same, global state (the global stream's positions, the packer's carry),
 * and it restores under another process count (elastic restore,
 * docs/dist.md). Put it after every stateful stage (before prefetch). */
nb_data_iter *nb_data_iter_rows(nb_data_iter *it, int64_t start, int64_t count);

/* Computes upstream elements ahead on `workers` threads into a buffer of
 * `buffer` elements, delivering them in exactly upstream order. When the
 * upstream is nb_data_iter_create(ds) followed only by iterator map/filter,
 * the workers compute different elements at once (the output does not
 * depend on the number of workers); otherwise (batch, pack, another
 * prefetch upstream) one thread runs the upstream ahead of the consumer. */
nb_data_iter *nb_data_iter_prefetch(nb_data_iter *it, int workers, int buffer);

/* out (cleared first) gets the next element; at the end, NB_OK with out->kind
 * == NB_DATA_NONE. */
nb_status nb_data_iter_next(nb_data_iter *it, nb_data_elem *out);
/* The position as a JSON string (free with nb_data_state_free), NULL on
 * error. Set on a fresh pipeline built the same way, the following elements
 * are identical to those of an uninterrupted run. */
char *nb_data_iter_get_state(nb_data_iter *it);
nb_status nb_data_iter_set_state(nb_data_iter *it, const char *json);
void nb_data_state_free(nb_ctx *ctx, char *state);
/* Per stage: elements out, elements/s since the first call, time in the
 * stage itself, time the consumer waited and mean buffer fill (prefetch). */
void nb_data_iter_print_stats(const nb_data_iter *it, FILE *f);
void nb_data_iter_destroy(nb_data_iter *it); /* stops threads; NULL ok */

NB_END_DECLS
#endif /* NABLA_DATA_H */
