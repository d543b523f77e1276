/* The trainer's input data: config paths resolved to token shards (text is
 * tokenized once into a shard cached under DIR/data/, keyed by the input's
 * path, size, mtime and tokenizer), windows of seq_len+1 tokens, the eval
 * split (an eval shard, or the last ~1% of windows held out) and the
 * pipelines. Not the loop: that is run.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nabla/tokenizer.h"
#include "train/internal.h"

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

nb_status nb__train_mkdir_p(nb_ctx *ctx, const char *path) {
  char buf[NB_TRAIN_PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: path too long: %s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0777) && errno != EEXIST) return nb_errorf(ctx, NB_ERR_IO, "train: mkdir %s: %s", buf, strerror(errno));
      *p = '/';
    }
  if (mkdir(buf, 0777) && errno != EEXIST) return nb_errorf(ctx, NB_ERR_IO, "train: mkdir %s: %s", buf, strerror(errno));
  return NB_OK;
}

/* Text at `input` tokenized into DIR/data/<name>-<key>.tshard unless that
 * file exists already (a finished build is renamed into place, so a file
 * there is complete). */
static nb_status text_to_shard(nb_ctx *ctx, const char *key_name, const char *input, const char *tokenizer,
                               const char *run_dir, char *out, size_t cap) {
  struct stat st;
  if (stat(input, &st)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "train: %s: '%s': %s", key_name, input, strerror(errno));
  char real[PATH_MAX], desc[PATH_MAX + 1200];
  if (!realpath(input, real)) snprintf(real, sizeof real, "%s", input);
  snprintf(desc, sizeof desc, "%s|%lld|%lld|%s", real, (long long)st.st_size, (long long)st.st_mtime, tokenizer);
  uint64_t h = nb_data_checksum_bytes(NB_DATA_XXH3, desc, strlen(desc));
  const char *base = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
  char dir[NB_TRAIN_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/data", run_dir);
  nb_status s = nb__train_mkdir_p(ctx, dir);
  if (s) return s;
  if (snprintf(out, cap, "%s/%.100s-%016llx.tshard", dir, base, (unsigned long long)h) >= (int)cap)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: run dir path too long: %s", run_dir);
  if (!access(out, R_OK)) return NB_OK;
  nb_tok *bpe = NULL;
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  if (tokenizer[0]) {
    bpe = nb_tok_load(ctx, tokenizer);
    if (!bpe) return nb_errorf(ctx, nb_ctx_status(ctx), "train: data.tokenizer '%s': %s", tokenizer, nb_ctx_error(ctx));
    tok = nb_data_tokenizer_bpe(bpe);
  }
  char tmp[NB_TRAIN_PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  /* whole files as documents: newlines stay in the token stream */
  nb_data_build_opts bo = {.unit = NB_DATA_UNIT_FILE};
  const char *inputs[1] = {input};
  s = nb_data_build_shard(ctx, tmp, 1, inputs, &bo, &tok, 0, NULL);
  nb_tok_destroy(bpe);
  if (s) return nb_errorf(ctx, s, "train: %s: tokenizing '%s': %s", key_name, input, nb_ctx_error(ctx));
  if (rename(tmp, out)) return nb_errorf(ctx, NB_ERR_IO, "train: rename %s: %s", tmp, strerror(errno));
  return NB_OK;
}

static nb_status resolve(nb_ctx *ctx, const char *key_name, const char *path, const nb_model_run_config *c,
                         const char *run_dir, char *out, size_t cap) {
  if (!path[0]) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: %s is empty: give a token shard or a text file/dir", key_name);
  if (ends_with(path, ".tshard")) {
    if (access(path, R_OK)) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "train: %s: '%s': %s", key_name, path, strerror(errno));
    snprintf(out, cap, "%s", path);
    return NB_OK;
  }
  return text_to_shard(ctx, key_name, path, c->data.tokenizer, run_dir, out, cap);
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

nb_status nb__train_data_open(nb_ctx *ctx, const nb_model_run_config *c, const char *run_dir, nb__train_data *d) {
  memset(d, 0, sizeof *d);
  int64_t T = c->data.seq_len;
  nb_status s = resolve(ctx, "data.train", c->data.train, c, run_dir, d->train_shard, sizeof d->train_shard);
  if (!s && c->data.eval[0]) s = resolve(ctx, "data.eval", c->data.eval, c, run_dir, d->eval_shard, sizeof d->eval_shard);
  if (!s) s = shard_stats(ctx, d->train_shard, &d->vocab, &d->entropy);
  if (s) return s;
  if (d->vocab > c->model.vocab_size)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "train: data.train '%s' has vocabulary %lld, more than model.vocab_size %lld (use a matching "
                     "data.tokenizer or model.vocab_size)",
                     d->train_shard, (long long)d->vocab, (long long)c->model.vocab_size);
  const char *tp[1] = {d->train_shard};
  nb_data_map *all = nb_data_map_tokens(ctx, 1, tp, T);
  if (!all) return nb_ctx_status(ctx);
  int64_t N = nb_data_map_len(all);
  if (c->data.eval[0]) {
    const char *ep[1] = {d->eval_shard};
    d->train_windows = all;
    d->eval_windows = nb_data_map_tokens(ctx, 1, ep, T);
    if (!d->eval_windows) return nb__train_data_close(d), nb_ctx_status(ctx);
    d->n_train = N;
    d->n_eval = nb_data_map_len(d->eval_windows);
    if (d->n_eval < 1) {
      nb__train_data_close(d);
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
    if (!d->train_windows || !d->eval_windows) return nb__train_data_close(d), nb_ctx_status(ctx);
    d->n_train = N - n_eval - 1;
    d->n_eval = n_eval;
  }
  if (d->n_train < 1) {
    nb__train_data_close(d);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: data.train '%s' holds no window of seq_len+1 = %lld tokens",
                     c->data.train, (long long)(T + 1));
  }
  return NB_OK;
}

void nb__train_data_close(nb__train_data *d) {
  nb_data_map_release(d->train_windows);
  nb_data_map_release(d->eval_windows);
  d->train_windows = d->eval_windows = NULL;
}

nb_data_iter *nb__train_data_iter(nb_ctx *ctx, const nb__train_data *d, const nb_model_run_config *c) {
  nb_data_map_retain(d->train_windows);
  nb_data_map *ds = nb_data_map_shuffle(d->train_windows, (uint64_t)c->seed);
  ds = nb_data_map_batch(nb_data_map_repeat(ds, 0), c->batch_size, true);
  ds = nb_data_map_map(ds, nb_data_fn_lm_targets, NULL);
  nb_data_iter *it = nb_data_iter_create(ds);
  if (it && c->data.workers > 0) it = nb_data_iter_prefetch(it, (int)c->data.workers, 2 * (int)c->data.workers + 2);
  return it;
}

nb_data_map *nb__train_eval_batches(nb_ctx *ctx, const nb__train_data *d, const nb_model_run_config *c) {
  nb_data_map_retain(d->eval_windows);
  nb_data_map *ds = nb_data_map_batch(nb_data_map_repeat(d->eval_windows, 0), c->batch_size, true);
  return nb_data_map_map(ds, nb_data_fn_lm_targets, NULL);
}
