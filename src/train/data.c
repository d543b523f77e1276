/* The trainer's input data: config paths resolved to token shards by what
 * the files hold (their magic bytes, not their names; text is tokenized
 * once into a shard cached under DIR/data/, keyed by the input's path,
 * sizes and mtimes and the tokenizer's content), every shard verified
 * (checksum, ids below its vocabulary, vocabulary within the model's),
 * windows of seq_len+1 tokens, the eval split (an eval shard, or the last
 * ~1% of windows held out) and the pipelines. Not the loop: that is run.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nabla/tokenizer.h"
#include "train/internal.h"
#include "util/util.h"

nb_status nb_train__wrapf(nb_ctx *ctx, nb_status s, const char *fmt, ...) {
  char prefix[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  return nb_errorf(ctx, s ? s : NB_ERR_INTERNAL, "%s: %s", prefix, nb_ctx_error(ctx)); /* nb_errorf may read its own message */
}

nb_status nb_train__mkdir_p(nb_ctx *ctx, const char *path) {
  if (strlen(path) >= NB_TRAIN_PATH_MAX) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: path too long: %s", path);
  char failed[NB_TRAIN_PATH_MAX];
  int err = nb_util__mkdir_p(path, 0777, NULL, failed, sizeof failed);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "train: mkdir %s: %s", failed, strerror(err));
  return NB_OK;
}

/* XXH3 of a file's bytes (an empty file hashes its zero bytes). */
static nb_status hash_file(nb_ctx *ctx, const char *path, uint64_t *h) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    return nb_errorf(ctx, NB_ERR_IO, "'%s': %s", path, strerror(errno));
  }
  size_t n = (size_t)st.st_size;
  void *p = n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (p == MAP_FAILED) return nb_errorf(ctx, NB_ERR_IO, "'%s': mmap: %s", path, strerror(errno));
  *h = nb_data_checksum_bytes(NB_DATA_XXH3, n ? p : "", n);
  if (n) munmap(p, n);
  return NB_OK;
}

/* The tokenizer's identity for the cache key: its content (a file, or the
 * files of a directory: vocab.json + merges.txt, tokenizer.json, ...), so a
 * tokenizer replaced at the same path re-tokenizes. */
static nb_status tokenizer_hash(nb_ctx *ctx, const char *path, uint64_t *h) {
  *h = 0;
  if (!path[0]) return NB_OK; /* byte level */
  struct stat st;
  if (stat(path, &st)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "train: data.tokenizer '%s': %s", path, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return hash_file(ctx, path, h) ? nb_train__wrapf(ctx, nb_ctx_status(ctx), "train: data.tokenizer") : NB_OK;
  DIR *d = opendir(path);
  if (!d) return nb_errorf(ctx, NB_ERR_IO, "train: data.tokenizer '%s': %s", path, strerror(errno));
  nb_status s = NB_OK;
  for (struct dirent *e; !s && (e = readdir(d));) {
    char f[PATH_MAX];
    uint64_t fh;
    if (e->d_name[0] == '.' || snprintf(f, sizeof f, "%s/%s", path, e->d_name) >= (int)sizeof f) continue;
    if (stat(f, &st) || !S_ISREG(st.st_mode)) continue;
    if ((s = hash_file(ctx, f, &fh))) s = nb_train__wrapf(ctx, s, "train: data.tokenizer");
    else /* a sum: the same whatever order readdir gives */
      *h += fh ^ nb_data_checksum_bytes(NB_DATA_XXH3, e->d_name, strlen(e->d_name));
  }
  closedir(d);
  return s;
}

/* The input's identity for the cache key: path, size and mtime (ns) of the
 * file, or of every file below a directory (editing a file in a directory
 * does not change the directory's own mtime). */
static _Thread_local uint64_t walk_sum;
static int walk_one(const char *p, const struct stat *st, int type, struct FTW *ftw) {
  (void)ftw;
  struct stat target; /* a symlink below a directory is tokenized as what it points to */
  if (type == FTW_SL && !stat(p, &target) && S_ISREG(target.st_mode)) {
    st = &target;
    type = FTW_F;
  }
  if (type == FTW_F) {
    char d[PATH_MAX + 64];
    int n = snprintf(d, sizeof d, "%s|%lld|%lld.%09ld", p, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
                     st->st_mtim.tv_nsec);
    walk_sum += nb_data_checksum_bytes(NB_DATA_XXH3, d, (size_t)(n < (int)sizeof d ? n : (int)sizeof d - 1));
  }
  return 0;
}

static nb_status input_hash(nb_ctx *ctx, const char *real, uint64_t *h) {
  walk_sum = 0;
  if (nftw(real, walk_one, 16, FTW_PHYS)) return nb_errorf(ctx, NB_ERR_IO, "'%s': %s", real, strerror(errno));
  *h = walk_sum;
  return NB_OK;
}

/* Text at `input` tokenized into DIR/data/<name>-<key>.tshard unless that
 * file exists already (a finished build is renamed into place, so a file
 * there is complete; a damaged one is rebuilt by the caller). */
static nb_status text_to_shard(nb_ctx *ctx, const char *key_name, const char *input, const char *tokenizer,
                               const char *run_dir, char *out, size_t cap, bool *cached) {
  char real[PATH_MAX], desc[256];
  if (!realpath(input, real)) snprintf(real, sizeof real, "%s", input);
  uint64_t ih = 0, th = 0;
  nb_status s = input_hash(ctx, real, &ih);
  if (s) return nb_train__wrapf(ctx, s, "train: %s", key_name);
  if ((s = tokenizer_hash(ctx, tokenizer, &th))) return s;
  snprintf(desc, sizeof desc, "v2|%016llx|%016llx", (unsigned long long)ih, (unsigned long long)th);
  uint64_t h = nb_data_checksum_bytes(NB_DATA_XXH3, desc, strlen(desc));
  const char *base = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
  char dir[NB_TRAIN_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/data", run_dir);
  if ((s = nb_train__mkdir_p(ctx, dir))) return s;
  if (snprintf(out, cap, "%s/%.100s-%016llx.tshard", dir, base, (unsigned long long)h) >= (int)cap)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: run dir path too long: %s", run_dir);
  *cached = !access(out, R_OK);
  if (*cached) return NB_OK;
  nb_tok *bpe = NULL;
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  if (tokenizer[0]) {
    bpe = nb_tok_load(ctx, tokenizer);
    if (!bpe) return nb_train__wrapf(ctx, nb_ctx_status(ctx), "train: data.tokenizer '%s'", tokenizer);
    tok = nb_data_tokenizer_bpe(bpe);
  }
  char tmp[NB_TRAIN_PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  /* whole files as documents: newlines stay in the token stream */
  nb_data_build_opts bo = {.unit = NB_DATA_UNIT_FILE};
  const char *inputs[1] = {input};
  s = nb_data_build_shard(ctx, tmp, 1, inputs, &bo, &tok, 0, NULL);
  nb_tok_destroy(bpe);
  if (s) return nb_train__wrapf(ctx, s, "train: %s: tokenizing '%s'", key_name, input);
  if (rename(tmp, out)) return nb_errorf(ctx, NB_ERR_IO, "train: rename %s: %s", tmp, strerror(errno));
  return NB_OK;
}

/* Opens a shard for training: the header, then a full pass over the data
 * (checksum, every id below the shard's vocabulary), the vocabulary within
 * the model's. Fills the identity a checkpoint records. */
static nb_status check_shard(nb_ctx *ctx, const char *key_name, const char *path, const nb_train_config *c,
                             nb_train__shard_id *id) {
  nb_data_shard *sh = nb_data_shard_open(ctx, path);
  nb_status s = sh ? nb_data_shard_verify(sh, NULL, NULL) : nb_ctx_status(ctx);
  if (s) {
    nb_data_shard_close(sh);
    return nb_train__wrapf(ctx, s, "train: %s", key_name);
  }
  int64_t vocab = nb_data_shard_vocab(sh);
  id->tokens = nb_data_shard_count(sh);
  id->xxh3 = nb_data_shard_checksum(sh);
  nb_data_shard_close(sh);
  if (vocab > c->model.vocab_size)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "train: %s '%s' has vocabulary %lld, more than model.vocab_size %lld (use a matching "
                     "data.tokenizer or model.vocab_size)",
                     key_name, path, (long long)vocab, (long long)c->model.vocab_size);
  return NB_OK;
}

/* A data path to a verified token shard: a shard as it is, text (a file or
 * a directory) through the cache. What the file holds decides, not its name. */
static nb_status resolve(nb_ctx *ctx, const char *key_name, const char *path, const nb_train_config *c,
                         const char *run_dir, char *out, size_t cap, nb_train__shard_id *id) {
  if (!path[0]) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: %s is empty: give a token shard or a text file/dir", key_name);
  nb_data_format fmt;
  nb_status s = nb_data_detect_format(ctx, path, &fmt);
  if (s) return nb_train__wrapf(ctx, s, "train: %s", key_name);
  if (fmt == NB_DATA_FORMAT_TOKENS) {
    if (snprintf(out, cap, "%s", path) >= (int)cap) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: %s: path too long", key_name);
    return check_shard(ctx, key_name, out, c, id);
  }
  if (fmt != NB_DATA_FORMAT_TEXT && fmt != NB_DATA_FORMAT_DIR)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: %s: '%s' is %s; training reads a token shard or text", key_name,
                     path, nb_data_format_name(fmt));
  bool cached;
  if ((s = text_to_shard(ctx, key_name, path, c->data.tokenizer, run_dir, out, cap, &cached))) return s;
  s = check_shard(ctx, key_name, out, c, id);
  if (s && cached && s != NB_ERR_INVALID_ARG) { /* a damaged cache entry: built again */
    nb_logf(ctx, NB_LOG_WARN, "%s; rebuilding it", nb_ctx_error(ctx));
    if (unlink(out)) return nb_errorf(ctx, NB_ERR_IO, "train: cannot remove %s: %s", out, strerror(errno));
    if ((s = text_to_shard(ctx, key_name, path, c->data.tokenizer, run_dir, out, cap, &cached))) return s;
    s = check_shard(ctx, key_name, out, c, id);
  }
  return s;
}

/* Unigram entropy in nats of a shard's tokens, and its vocabulary size. */
static nb_status shard_stats(nb_ctx *ctx, const char *path, int64_t *vocab, double *entropy) {
  nb_data_shard *sh = nb_data_shard_open(ctx, path);
  if (!sh) return nb_ctx_status(ctx);
  int64_t V = nb_data_shard_vocab(sh), n = nb_data_shard_count(sh);
  enum { CHUNK = 1 << 20 };
  int64_t *counts = nb_calloc(ctx, (size_t)V * sizeof *counts);
  int32_t *buf = nb_alloc(ctx, CHUNK * sizeof *buf);
  nb_status s = counts && buf ? NB_OK : NB_ERR_NOMEM;
  for (int64_t i = 0; !s && i < n; i += CHUNK) {
    int64_t m = n - i < CHUNK ? n - i : CHUNK;
    s = nb_data_shard_read(sh, i, m, buf);
    for (int64_t j = 0; !s && j < m; j++)
      if (buf[j] >= 0 && buf[j] < V) counts[buf[j]]++;
  }
  double H = 0;
  for (int64_t v = 0; !s && v < V; v++)
    if (counts[v]) {
      double p = (double)counts[v] / (double)n;
      H -= p * log(p);
    }
  if (counts) nb_dealloc(ctx, counts, (size_t)V * sizeof *counts);
  if (buf) nb_dealloc(ctx, buf, CHUNK * sizeof *buf);
  nb_data_shard_close(sh);
  *vocab = V;
  *entropy = H;
  return s;
}

nb_status nb_train__data_open(nb_ctx *ctx, const nb_train_config *c, const char *run_dir, nb_train__data *d) {
  memset(d, 0, sizeof *d);
  int64_t T = c->data.seq_len;
  nb_train__shard_id eval_id;
  nb_status s = resolve(ctx, "data.train", c->data.train, c, run_dir, d->train_shard, sizeof d->train_shard, &d->train_id);
  if (!s && c->data.eval[0])
    s = resolve(ctx, "data.eval", c->data.eval, c, run_dir, d->eval_shard, sizeof d->eval_shard, &eval_id);
  if (!s) s = shard_stats(ctx, d->train_shard, &d->vocab, &d->entropy);
  if (s) return s;
  const char *tp[1] = {d->train_shard};
  nb_data_map *all = nb_data_map_tokens(ctx, 1, tp, T);
  if (!all) return nb_ctx_status(ctx);
  int64_t N = nb_data_map_len(all);
  if (c->data.eval[0]) {
    const char *ep[1] = {d->eval_shard};
    d->train_windows = all;
    d->eval_windows = nb_data_map_tokens(ctx, 1, ep, T);
    if (!d->eval_windows) return nb_train__data_close(d), nb_ctx_status(ctx);
    d->n_train = N;
    d->n_eval = nb_data_map_len(d->eval_windows);
    if (d->n_eval < 1) {
      nb_train__data_close(d);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: data.eval '%s' holds no window of seq_len+1 = %lld tokens",
                       c->data.eval, (long long)(T + 1));
    }
  } else {
    /* hold out the last ~1% (at least one window); one window between the
     * parts is skipped so no token is shared (windows overlap by one) */
    int64_t n_eval = N / 100 > 0 ? N / 100 : 1;
    if (N < n_eval + 2) {
      nb_data_map_release(all);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                       "train: data.train '%s' holds %lld windows of seq_len+1 = %lld tokens: too few to hold out an "
                       "eval part (need 3; give data.eval or more text)",
                       c->data.train, (long long)N, (long long)(T + 1));
    }
    nb_data_map_retain(all);
    d->train_windows = nb_data_map_slice(all, 0, N - n_eval - 1, 1);
    d->eval_windows = nb_data_map_slice(all, N - n_eval, N, 1);
    if (!d->train_windows || !d->eval_windows) return nb_train__data_close(d), nb_ctx_status(ctx);
    d->n_train = N - n_eval - 1;
    d->n_eval = n_eval;
  }
  if (d->n_train < 1) {
    nb_train__data_close(d);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: data.train '%s' holds no window of seq_len+1 = %lld tokens",
                     c->data.train, (long long)(T + 1));
  }
  /* eval batches beyond the eval set would wrap around and count windows twice */
  int64_t eval_batches = d->n_eval / c->batch_size;
  if (c->eval_every > 0 && c->eval_steps > eval_batches) {
    nb_train__data_close(d);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "train: eval_steps = %lld, but the eval data (%s: %lld windows of seq_len+1 = %lld tokens) holds "
                     "only %lld batches of batch_size %lld: lower eval_steps, give more eval data, or set eval_every=0",
                     (long long)c->eval_steps, c->data.eval[0] ? c->data.eval : "the held-out 1% of data.train",
                     (long long)d->n_eval, (long long)(T + 1), (long long)eval_batches, (long long)c->batch_size);
  }
  return NB_OK;
}

void nb_train__data_close(nb_train__data *d) {
  nb_data_map_release(d->train_windows);
  nb_data_map_release(d->eval_windows);
  d->train_windows = d->eval_windows = NULL;
}

nb_data_iter *nb_train__data_iter(nb_ctx *ctx, const nb_train__data *d, const nb_train_config *c, int rank) {
  nb_data_map_retain(d->train_windows);
  nb_data_map *ds = nb_data_map_shuffle(d->train_windows, (uint64_t)c->seed);
  /* data parallel (and FSDP, which splits the batch too): process r of D
   * (D = mesh.data x mesh.fsdp x mesh.expert) reads rows [r B/D, (r+1) B/D) of the job's
   * batch s, that is its own batches of B/D: r, r + D, r + 2D, ... */
  int64_t D = nb_train__batch_procs(c);
  ds = nb_data_map_batch(nb_data_map_repeat(ds, 0), c->batch_size / D, true);
  if (D > 1) ds = nb_data_map_slice(ds, rank, INT64_MAX, D);
  ds = nb_data_map_map(ds, nb_data_fn_lm_targets, NULL);
  nb_data_iter *it = nb_data_iter_create(ds);
  if (it && c->data.workers > 0) it = nb_data_iter_prefetch(it, (int)c->data.workers, 2 * (int)c->data.workers + 2);
  return it;
}

nb_data_map *nb_train__eval_batches(nb_ctx *ctx, const nb_train__data *d, const nb_train_config *c) {
  nb_data_map_retain(d->eval_windows);
  nb_data_map *ds = nb_data_map_batch(nb_data_map_repeat(d->eval_windows, 0), c->batch_size, true);
  return nb_data_map_map(ds, nb_data_fn_lm_targets, NULL);
}
