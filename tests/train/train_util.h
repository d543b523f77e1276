/* Shared by the trainer tests: a tiny corpus, a tiny GPT run config, and a
 * run that records every step's numbers. Header-only (static functions). */
#ifndef NABLA_TEST_TRAIN_UTIL_H
#define NABLA_TEST_TRAIN_UTIL_H

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"

enum { MAX_STEPS = 256 };

typedef struct recorder {
  int64_t first_step, last_step;
  double loss[MAX_STEPS + 1], grad_norm[MAX_STEPS + 1], lr[MAX_STEPS + 1];
  int64_t stop_at;    /* should_stop at this step (0: never) */
  int64_t raise_at;   /* raise(raise_sig) in on_step at this step (0: never) */
  int raise_sig;
  int n_eval;
  int threads;        /* jit threads (0: 1) */
} recorder;

static inline void rec_start(void *ud, const nb_train_start_info *in) {
  recorder *r = ud;
  r->first_step = in->start_step + 1;
}

static inline void rec_step(void *ud, const nb_train_step_info *si) {
  recorder *r = ud;
  if (si->step >= 0 && si->step <= MAX_STEPS) {
    r->loss[si->step] = si->loss;
    r->grad_norm[si->step] = si->grad_norm;
    r->lr[si->step] = si->lr;
  }
  r->last_step = si->step;
  r->n_eval += si->has_eval;
  if (r->raise_at && si->step == r->raise_at) raise(r->raise_sig);
}

static inline bool rec_stop(void *ud, int64_t step) {
  const recorder *r = ud;
  return r->stop_at && step == r->stop_at;
}

/* A made-up text with some structure (so a model can learn it), about 24 KB. */
static inline void write_corpus(const char *path) {
  static const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "big", "house"};
  FILE *f = fopen(path, "w");
  uint64_t x = 12345;
  for (int line = 0; line < 800; line++) {
    int n = 4 + line % 5;
    for (int i = 0; i < n; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      fprintf(f, "%s%s", i ? " " : "", w[(x >> 33) % 13]);
    }
    fputs(".\n", f);
  }
  fclose(f);
}

/* A temp dir holding corpus.txt; *dir gets its path. */
static inline void make_workdir(char *dir, size_t cap) {
  nb_test_scratch_dir(dir, cap, "train", "test");
  char p[512];
  snprintf(p, sizeof p, "%s/corpus.txt", dir);
  write_corpus(p);
}

/* The tiny config: a 1-layer GPT, d=32, T=16, B=4, byte-level data. */
static inline nb_status tiny_config(nb_ctx *ctx, const char *workdir, int n_extra, const char *const *extra,
                             nb_train_config *cfg) {
  char train[600];
  snprintf(train, sizeof train, "data.train=%s/corpus.txt", workdir);
  const char *base[] = {train, "model.preset=gpt2-tiny", "model.n_layers=1", "model.d_model=32",
                        "model.n_heads=2", "model.n_kv_heads=2", "model.d_ff=64", "model.max_seq_len=16",
                        "data.seq_len=16", "data.workers=1", "batch_size=4", "steps=8", "log_every=2",
                        "eval_every=4", "eval_steps=2", "checkpoint_every=3", "schedule.warmup_steps=2",
                        "optim.lr=3e-3"};
  int nb = (int)(sizeof base / sizeof base[0]);
  const char *all[64];
  for (int i = 0; i < nb; i++) all[i] = base[i];
  for (int i = 0; i < n_extra; i++) all[nb + i] = extra[i];
  return nb_train_config_parse(ctx, "<tiny>", "", 0, nb + n_extra, all, cfg);
}

static inline nb_status run_recorded(nb_ctx *ctx, const nb_train_config *cfg, const char *run_dir, recorder *r,
                              bool signals, nb_train_result *res) {
  nb_train_opts o = {.run_dir = run_dir, .threads = r->threads ? r->threads : 1, .handle_signals = signals, .should_stop = rec_stop,
                     .on_start = rec_start, .on_step = rec_step, .ud = r};
  return nb_train_run(ctx, cfg, &o, res);
}

/* The newest committed checkpoint step of a run dir (-1: none, -2: no manager). */
static inline int64_t latest_ckpt(nb_ctx *ctx, const char *dir) {
  char p[1100];
  snprintf(p, sizeof p, "%s/checkpoints", dir);
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = p, .read_only = true});
  int64_t step = -2;
  if (m) nb_ckpt_latest_step(m, &step);
  nb_ckpt_manager_destroy(m);
  return step;
}

#endif
