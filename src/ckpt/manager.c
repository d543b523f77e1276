/* The checkpoint manager: one directory of steps, an exclusive lock on it,
 * clean-up of interrupted saves on start, the committed-step index,
 * retention (recent, periodic, best by metric), the background writer
 * (one save in flight; its errors surface on the next call), and the
 * preemption flag set by SIGTERM/SIGINT. Not here: the file formats. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <dirent.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "util/trace.h"

typedef struct step_rec {
  int64_t step;
  bool has_metric;
  double metric;
} step_rec;

/* Invariants: steps[0..n_steps) are committed, ascending and unique; mu
 * guards them and every rename/removal of step directories, so a restore
 * never races a deletion. At most one background save (busy); its result
 * (job_status, job_msg) is read only after joining the thread. */
struct nb_ckpt_manager {
  nb_ctx *ctx;
  nb_ckpt_options opts;
  char *dir;
  int lock_fd;
  pthread_mutex_t mu;
  step_rec *steps;
  size_t n_steps, cap_steps;
  /* background save */
  bool busy;
  pthread_t thread;
  _Atomic bool done;
  nb_ctx *wctx;                 /* the writer's context: its own errors, our allocator */
  nb_ctx *qctx;                 /* for probes whose errors are expected (main thread) */
  nb_ckpt__snapshot *job;
  nb_status job_status;
  /* an error of a finished background save not yet reported */
  nb_status pending;
  char pending_msg[1024];
};

/* ---- the committed-step index ---------------------------------------------- */

static nb_status add_step(nb_ckpt_manager *m, step_rec r) {
  if (m->n_steps == m->cap_steps) {
    size_t cap = m->cap_steps ? 2 * m->cap_steps : 16;
    step_rec *s = nb_alloc(m->ctx, cap * sizeof *s);
    if (!s) return NB_ERR_NOMEM;
    if (m->n_steps) memcpy(s, m->steps, m->n_steps * sizeof *s);
    if (m->steps) nb_dealloc(m->ctx, m->steps, m->cap_steps * sizeof *s);
    m->steps = s;
    m->cap_steps = cap;
  }
  size_t i = m->n_steps;
  while (i > 0 && m->steps[i - 1].step > r.step) i--;
  memmove(&m->steps[i + 1], &m->steps[i], (m->n_steps - i) * sizeof r);
  m->steps[i] = r;
  m->n_steps++;
  return NB_OK;
}

static int64_t find_step(const nb_ckpt_manager *m, int64_t step) {
  for (size_t i = 0; i < m->n_steps; i++)
    if (m->steps[i].step == step) return (int64_t)i;
  return -1;
}

static step_rec record_of(nb_ckpt_manager *m, const char *step_dir, int64_t step) {
  step_rec r = {step, false, 0};
  if (m->opts.keep_best <= 0) return r;
  nb_ckpt_info *info = nb_ckpt_info_open(m->qctx, step_dir);
  if (info) r.has_metric = nb_ckpt_info_metric(info, &r.metric);
  nb_ckpt_info_destroy(info);
  return r;
}

/* Renames a step directory to <path>.damaged (or .damaged.2, ...); fills
 * aside[NB_CKPT__PATH_CAP]. */
static nb_status move_aside(nb_ctx *ctx, const char *dir, const char *path, char *aside) {
  for (int k = 1; k < 1000; k++) {
    nb_status s = k == 1 ? nb_ckpt__pathf(ctx, aside, "%s.damaged", path) : nb_ckpt__pathf(ctx, aside, "%s.damaged.%d", path, k);
    if (s != NB_OK) return s;
    if (nb_ckpt__exists(aside)) continue;
    if ((s = nb_ckpt__rename(ctx, path, aside)) == NB_OK) s = nb_ckpt__fsync_dir(ctx, dir);
    return s;
  }
  return nb_errorf(ctx, NB_ERR_IO, "cannot set '%s' aside: too many .damaged copies", path);
}

/* Indexes committed steps; with cleanup, removes leftovers: temporary and
 * deleted directories, and step directories never committed, and sets
 * aside steps whose commit marker is damaged (they would block saving that
 * step again). */
static nb_status scan(nb_ckpt_manager *m, bool cleanup) {
  DIR *d = opendir(m->dir);
  if (!d) return nb_errorf(m->ctx, NB_ERR_IO, "cannot open checkpoint directory '%s': %s", m->dir, strerror(errno));
  m->n_steps = 0;
  nb_status s = NB_OK;
  struct dirent *e;
  while (s == NB_OK && (e = readdir(d))) {
    char path[NB_CKPT__PATH_CAP];
    int64_t step;
    if ((s = nb_ckpt__pathf(m->ctx, path, "%s/%s", m->dir, e->d_name)) != NB_OK) break;
    if (!strncmp(e->d_name, ".tmp-step_", 10) || !strncmp(e->d_name, ".del-step_", 10)) {
      if (cleanup) s = nb_ckpt__remove_tree(m->ctx, path);
    } else if (nb_ckpt__parse_step_name(e->d_name, &step)) {
      int64_t marked;
      uint64_t mh;
      nb_status c = nb_ckpt__read_commit(m->qctx, path, &marked, &mh);
      if (c == NB_OK && marked == step) s = add_step(m, record_of(m, path, step));
      else if (c == NB_ERR_NOT_FOUND && cleanup) s = nb_ckpt__remove_tree(m->ctx, path); /* never committed */
      else if (c != NB_ERR_NOT_FOUND && cleanup) { /* damaged by something else than us: kept for a human */
        char aside[NB_CKPT__PATH_CAP];
        if ((s = move_aside(m->ctx, m->dir, path, aside)) == NB_OK)
          nb_logf(m->ctx, NB_LOG_WARN, "checkpoint '%s' has a damaged commit marker: set aside as '%s'", path, aside);
      } else if (c != NB_ERR_NOT_FOUND)
        nb_logf(m->ctx, NB_LOG_WARN, "checkpoint '%s' has a damaged commit marker; ignored", path);
    }
  }
  closedir(d);
  if (s == NB_OK && cleanup) s = nb_ckpt__fsync_dir(m->ctx, m->dir);
  return s;
}

/* ---- retention ------------------------------------------------------------------ */

static int by_metric(const void *a, const void *b, void *max) {
  const step_rec *x = a, *y = b;
  double d = *(bool *)max ? y->metric - x->metric : x->metric - y->metric;
  return d < 0 ? -1 : d > 0 ? 1 : (x->step > y->step) - (x->step < y->step);
}

/* Marks in keep[] the steps some policy keeps. */
static nb_status mark_kept(nb_ckpt_manager *m, bool *keep) {
  const nb_ckpt_options *o = &m->opts;
  size_t n = m->n_steps;
  for (size_t i = 0; i < n; i++) {
    keep[i] = o->max_to_keep <= 0 || i + (size_t)o->max_to_keep >= n || i + 1 == n;
    if (o->keep_period > 0 && m->steps[i].step % o->keep_period == 0) keep[i] = true;
  }
  if (o->keep_best <= 0) return NB_OK;
  step_rec *best = nb_alloc(m->ctx, n * sizeof *best);
  if (!best) return NB_ERR_NOMEM;
  size_t nb = 0;
  for (size_t i = 0; i < n; i++)
    if (m->steps[i].has_metric) best[nb++] = m->steps[i];
  bool max = o->best_mode_max;
  qsort_r(best, nb, sizeof *best, by_metric, &max);
  for (size_t b = 0; b < nb && b < (size_t)o->keep_best; b++) keep[find_step(m, best[b].step)] = true;
  nb_dealloc(m->ctx, best, n * sizeof *best);
  return NB_OK;
}

/* Deletes one step: rename to .del-* (atomic: it stops being committed),
 * fsync the directory, then remove the files. Called with mu held. */
static nb_status delete_step(nb_ctx *ctx, nb_ckpt_manager *m, int64_t step) {
  char name[32], from[NB_CKPT__PATH_CAP], to[NB_CKPT__PATH_CAP];
  nb_ckpt__step_name(step, name);
  if (nb_ckpt__pathf(ctx, from, "%s/%s", m->dir, name) != NB_OK ||
      nb_ckpt__pathf(ctx, to, "%s/.del-%s-%d", m->dir, name, (int)getpid()) != NB_OK)
    return NB_ERR_INVALID_ARG;
  nb_status s = nb_ckpt__rename(ctx, from, to);
  if (s == NB_OK) s = nb_ckpt__fsync_dir(ctx, m->dir);
  if (s == NB_OK) s = nb_ckpt__remove_tree(ctx, to);
  return s;
}

/* Called with mu held, after a commit. ctx receives errors. */
static nb_status apply_retention(nb_ctx *ctx, nb_ckpt_manager *m) {
  bool *keep = nb_alloc(ctx, m->n_steps + 1);
  if (!keep) return NB_ERR_NOMEM;
  size_t n = m->n_steps, w = 0;
  nb_status s = mark_kept(m, keep);
  for (size_t i = 0; i < n; i++) {
    if (s != NB_OK || keep[i]) {
      m->steps[w++] = m->steps[i];
      continue;
    }
    s = delete_step(ctx, m, m->steps[i].step);
    if (s != NB_OK) {
      char name[32], path[NB_CKPT__PATH_CAP];
      nb_ckpt__step_name(m->steps[i].step, name);
      snprintf(path, sizeof path, "%s/%s", m->dir, name);
      if (nb_ckpt__exists(path)) m->steps[w++] = m->steps[i]; /* still committed */
    }
  }
  m->n_steps = w;
  nb_dealloc(ctx, keep, n + 1);
  return s;
}

/* Writes a snapshot and indexes it; ctx is the caller's or the writer's.
 * A trace shows it as "ckpt write" on the thread that wrote it. */
static nb_status write_and_index(nb_ctx *ctx, nb_ckpt_manager *m, nb_ckpt__snapshot *s) {
  int64_t t0 = nb_util__trace_start();
  nb_status st = nb_ckpt__write_step(ctx, m->dir, s);
  if (st == NB_OK) {
    pthread_mutex_lock(&m->mu);
    st = add_step(m, (step_rec){s->step, s->has_metric, s->metric});
    if (st == NB_OK) st = apply_retention(ctx, m);
    pthread_mutex_unlock(&m->mu);
  }
  nb_util__trace_arg a = {"step", NULL, (double)s->step};
  nb_util__trace_span("ckpt", "ckpt write", t0, nb_util__now_ns(), &a, 1);
  return st;
}

/* ---- the background writer ------------------------------------------------------ */

static void *forward_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
  nb_ctx *owner = ud;
  if (new_size == 0) {
    nb_dealloc(owner, ptr, old_size);
    return NULL;
  }
  void *p = nb_alloc(owner, new_size);
  if (p && ptr) {
    memcpy(p, ptr, old_size < new_size ? old_size : new_size);
    nb_dealloc(owner, ptr, old_size);
  }
  return p;
}

static void *writer_main(void *arg) {
  nb_ckpt_manager *m = arg;
  nb_util__trace_thread_name("nabla-ckpt");
  nb_ctx_clear_error(m->wctx);
  m->job_status = write_and_index(m->wctx, m, m->job);
  nb_ckpt__snapshot_free(m->job);
  m->job = NULL;
  atomic_store(&m->done, true);
  return NULL;
}

/* Joins a finished or running background save; keeps its error pending. */
static void join_writer(nb_ckpt_manager *m) {
  if (!m->busy) return;
  pthread_join(m->thread, NULL);
  m->busy = false;
  if (m->job_status != NB_OK && m->pending == NB_OK) {
    m->pending = m->job_status;
    snprintf(m->pending_msg, sizeof m->pending_msg, "%s", nb_ctx_error(m->wctx));
  }
}

/* Reports (once) the error of a background save that has finished. */
static nb_status surface(nb_ckpt_manager *m) {
  if (m->busy && atomic_load(&m->done)) join_writer(m);
  if (m->pending == NB_OK) return NB_OK;
  nb_status s = m->pending;
  m->pending = NB_OK;
  return nb_errorf(m->ctx, s, "background checkpoint save failed: %s", m->pending_msg);
}

/* ---- public API ------------------------------------------------------------------- */

static nb_status open_dir(nb_ckpt_manager *m) {
  if (m->opts.read_only) {
    DIR *d = opendir(m->dir);
    if (!d) return nb_errorf(m->ctx, NB_ERR_NOT_FOUND, "checkpoint directory '%s' cannot be opened: %s", m->dir,
                             strerror(errno));
    closedir(d);
    return scan(m, false);
  }
  nb_status s = nb_ckpt__mkdirs(m->ctx, m->dir);
  if (s != NB_OK) return s;
  char path[NB_CKPT__PATH_CAP];
  if ((s = nb_ckpt__pathf(m->ctx, path, "%s/.lock", m->dir)) != NB_OK) return s;
  m->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (m->lock_fd < 0) return nb_errorf(m->ctx, NB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  if (flock(m->lock_fd, LOCK_EX | LOCK_NB) != 0)
    return nb_errorf(m->ctx, NB_ERR_IO, "checkpoint directory '%s' is in use by another manager (%s)", m->dir,
                     strerror(errno));
  return scan(m, true);
}

nb_ckpt_manager *nb_ckpt_manager_create(nb_ctx *ctx, const nb_ckpt_options *opts) {
  if (!opts || !opts->directory || !*opts->directory)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_ckpt_manager_create: options need a directory"), NULL;
  if (opts->max_to_keep < 0 || opts->keep_period < 0 || opts->keep_best < 0 || opts->save_interval_steps < 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "nb_ckpt_manager_create: max_to_keep, keep_period, keep_best and save_interval_steps must be >= 0"),
           NULL;
  nb_ckpt_manager *m = nb_calloc(ctx, sizeof *m);
  if (!m) return NULL;
  m->ctx = ctx;
  m->opts = *opts;
  m->lock_fd = -1;
  pthread_mutex_init(&m->mu, NULL);
  m->dir = nb_strdup(ctx, opts->directory);
  m->opts.directory = m->dir;
  nb_status s = m->dir ? NB_OK : NB_ERR_NOMEM;
  if (s == NB_OK && !(m->wctx = nb_ctx_create_with_allocator(forward_alloc, ctx))) s = NB_ERR_NOMEM;
  if (s == NB_OK && !(m->qctx = nb_ctx_create_with_allocator(forward_alloc, ctx))) s = NB_ERR_NOMEM;
  if (s == NB_OK) nb_ctx_set_log(m->wctx, NULL, NULL), nb_ctx_set_log(m->qctx, NULL, NULL);
  if (s == NB_OK) s = open_dir(m);
  if (s != NB_OK) {
    nb_ckpt_manager_destroy(m);
    return NULL;
  }
  return m;
}

void nb_ckpt_manager_destroy(nb_ckpt_manager *m) {
  if (!m) return;
  join_writer(m);
  if (m->pending != NB_OK)
    nb_logf(m->ctx, NB_LOG_ERROR, "checkpoint manager destroyed with an unreported save error: %s", m->pending_msg);
  if (m->lock_fd >= 0) close(m->lock_fd);
  nb_ctx *ctx = m->ctx;
  nb_ctx_destroy(m->wctx);
  nb_ctx_destroy(m->qctx);
  if (m->steps) nb_dealloc(ctx, m->steps, m->cap_steps * sizeof *m->steps);
  nb_ckpt_string_free(ctx, m->dir);
  pthread_mutex_destroy(&m->mu);
  nb_dealloc(ctx, m, sizeof *m);
}

bool nb_ckpt_should_save(const nb_ckpt_manager *m, int64_t step) {
  return m->opts.save_interval_steps <= 1 || step % m->opts.save_interval_steps == 0;
}

/* Checks shared by save and emergency_save; *exists when already committed. */
static nb_status check_save(nb_ckpt_manager *m, int64_t step, bool *exists) {
  if (m->opts.read_only) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "checkpoint manager of '%s' is read-only", m->dir);
  if (step < 0) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "checkpoint step %lld is negative", (long long)step);
  pthread_mutex_lock(&m->mu);
  *exists = find_step(m, step) >= 0;
  pthread_mutex_unlock(&m->mu);
  return NB_OK;
}

nb_status nb_ckpt_save(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                       const nb_ckpt_save_opts *opts, bool *saved) {
  if (saved) *saved = false;
  bool exists = false;
  nb_status s = check_save(m, step, &exists);
  if (s != NB_OK) return s;
  if (!(opts && opts->force) && !nb_ckpt_should_save(m, step)) return surface(m);
  join_writer(m);
  if ((s = surface(m)) != NB_OK || (s = check_save(m, step, &exists)) != NB_OK) return s;
  if (exists) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "step %lld is already saved in '%s'", (long long)step, m->dir);
  int64_t t0 = nb_util__trace_start();
  nb_ckpt__snapshot *snap = nb_ckpt__snapshot_take(m->ctx, step, items, n_items, opts);
  if (!snap) return nb_ctx_status(m->ctx);
  nb_util__trace_arg a = {"step", NULL, (double)step};
  nb_util__trace_span("ckpt", "ckpt snapshot", t0, nb_util__now_ns(), &a, 1);
  if (!m->opts.async) {
    s = write_and_index(m->ctx, m, snap);
    nb_ckpt__snapshot_free(snap);
    if (s == NB_OK && saved) *saved = true;
    return s;
  }
  m->job = snap;
  atomic_store(&m->done, false);
  int rc = pthread_create(&m->thread, NULL, writer_main, m);
  if (rc != 0) {
    m->job = NULL;
    nb_ckpt__snapshot_free(snap);
    return nb_errorf(m->ctx, NB_ERR_INTERNAL, "cannot start the checkpoint writer thread: %s", strerror(rc));
  }
  m->busy = true;
  if (saved) *saved = true;
  return NB_OK;
}

nb_status nb_ckpt_save_sharded(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                               const nb_ckpt_save_opts *opts, const nb_ckpt_shards *shards) {
  if (!shards || !shards->comm) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "sharded checkpoint: no communicator");
  bool first = shards->comm->ops->rank(shards->comm) == 0, exists = false;
  join_writer(m);
  nb_status s = surface(m);
  if (!s && first) s = check_save(m, step, &exists);
  if (!s && exists) s = nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "step %lld is already saved in '%s'", (long long)step, m->dir);
  int64_t t0 = nb_util__trace_start();
  nb_ckpt__snapshot *snap = s ? NULL : nb_ckpt__snapshot_take(m->ctx, step, items, n_items, opts);
  if (!s && !snap) s = nb_ctx_status(m->ctx);
  if (!s) s = nb_ckpt__snapshot_place(m->ctx, snap, shards);
  /* a process that failed above still joins the save, which then fails on every process */
  nb_ckpt__snapshot empty = {.ctx = m->ctx, .step = step, .process = shards->comm->ops->rank(shards->comm)};
  nb_status w = nb_ckpt__save_sharded(m->ctx, m->dir, s ? &empty : snap, shards->comm, s);
  if (!s) s = w;
  if (!s && first) {
    pthread_mutex_lock(&m->mu);
    s = add_step(m, (step_rec){step, snap->has_metric, snap->metric});
    if (!s) s = apply_retention(m->ctx, m);
    pthread_mutex_unlock(&m->mu);
  }
  nb_ckpt__snapshot_free(snap);
  nb_util__trace_arg a = {"step", NULL, (double)step};
  nb_util__trace_span("ckpt", "ckpt sharded save", t0, nb_util__now_ns(), &a, 1);
  return s;
}

nb_status nb_ckpt_wait_until_finished(nb_ckpt_manager *m) {
  join_writer(m);
  return surface(m);
}

nb_status nb_ckpt_all_steps(nb_ckpt_manager *m, int64_t *steps, size_t cap, size_t *n) {
  nb_status s = surface(m);
  if (s != NB_OK) return s;
  pthread_mutex_lock(&m->mu);
  if (m->opts.read_only) s = scan(m, false);
  for (size_t i = 0; s == NB_OK && i < m->n_steps && i < cap; i++) steps[i] = m->steps[i].step;
  if (n) *n = m->n_steps;
  pthread_mutex_unlock(&m->mu);
  return s;
}

nb_status nb_ckpt_latest_step(nb_ckpt_manager *m, int64_t *step) {
  nb_status s = surface(m);
  if (s != NB_OK) return s;
  pthread_mutex_lock(&m->mu);
  if (m->opts.read_only) s = scan(m, false);
  *step = m->n_steps ? m->steps[m->n_steps - 1].step : -1;
  pthread_mutex_unlock(&m->mu);
  return s;
}

nb_status nb_ckpt_step_path(const nb_ckpt_manager *m, int64_t step, char *buf, size_t cap) {
  char name[32];
  nb_ckpt__step_name(step, name);
  int n = snprintf(buf, cap, "%s/%s", m->dir, name);
  if (n < 0 || (size_t)n >= cap) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "nb_ckpt_step_path: buffer too small");
  return NB_OK;
}

nb_status nb_ckpt_set_aside(nb_ckpt_manager *m, int64_t step, char *aside, size_t cap) {
  if (m->opts.read_only) return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "checkpoint manager of '%s' is read-only", m->dir);
  join_writer(m);
  char path[NB_CKPT__PATH_CAP], to[NB_CKPT__PATH_CAP];
  nb_status s = surface(m);
  if (s == NB_OK) s = nb_ckpt_step_path(m, step, path, sizeof path);
  if (s != NB_OK) return s;
  pthread_mutex_lock(&m->mu);
  int64_t i = find_step(m, step);
  if (i < 0) s = nb_errorf(m->ctx, NB_ERR_NOT_FOUND, "step %lld is not a committed checkpoint in '%s'", (long long)step, m->dir);
  if (s == NB_OK) s = move_aside(m->ctx, m->dir, path, to);
  if (s == NB_OK) {
    memmove(&m->steps[i], &m->steps[i + 1], (m->n_steps - (size_t)i - 1) * sizeof *m->steps);
    m->n_steps--;
  }
  pthread_mutex_unlock(&m->mu);
  if (s == NB_OK && aside && cap) snprintf(aside, cap, "%s", to);
  return s;
}

bool nb_ckpt_save_in_flight(nb_ckpt_manager *m) { return m->busy && !atomic_load(&m->done); }

/* With mu held: resolves NB_CKPT_LATEST and opens the step's manifest. */
static nb_ckpt_info *open_step(nb_ckpt_manager *m, int64_t step) {
  if (m->opts.read_only && scan(m, false) != NB_OK) return NULL;
  if (step == NB_CKPT_LATEST) {
    if (!m->n_steps) return nb_errorf(m->ctx, NB_ERR_NOT_FOUND, "no committed checkpoint in '%s'", m->dir), NULL;
    step = m->steps[m->n_steps - 1].step;
  }
  if (find_step(m, step) < 0)
    return nb_errorf(m->ctx, NB_ERR_NOT_FOUND, "step %lld is not a committed checkpoint in '%s'", (long long)step,
                     m->dir), NULL;
  char path[NB_CKPT__PATH_CAP];
  if (nb_ckpt_step_path(m, step, path, sizeof path) != NB_OK) return NULL;
  return nb_ckpt_info_open(m->ctx, path);
}

/* Runs restore or verify on a step with mu held (deletions wait). */
static nb_status with_step(nb_ckpt_manager *m, int64_t step, const nb_ckpt_restore_opts *o, nb_tree **out,
                           nb_ckpt_info **info_out) {
  nb_status s = surface(m);
  if (s != NB_OK) return s;
  pthread_mutex_lock(&m->mu);
  nb_ckpt_info *info = open_step(m, step);
  s = info ? NB_OK : nb_ctx_status(m->ctx);
  if (info && !info_out) s = nb_ckpt__restore(m->ctx, info, o, out);
  pthread_mutex_unlock(&m->mu);
  if (info_out) *info_out = info;
  else nb_ckpt_info_destroy(info);
  return s;
}

nb_tree *nb_ckpt_restore(nb_ckpt_manager *m, int64_t step, const nb_ckpt_restore_opts *opts) {
  nb_tree *t = NULL;
  with_step(m, step, opts, &t, NULL);
  return t;
}

nb_status nb_ckpt_verify(nb_ckpt_manager *m, int64_t step) { return with_step(m, step, NULL, NULL, NULL); }

nb_ckpt_info *nb_ckpt_info_load(nb_ckpt_manager *m, int64_t step) {
  nb_ckpt_info *info = NULL;
  with_step(m, step, NULL, NULL, &info);
  return info;
}

/* ---- preemption ---------------------------------------------------------------- */

static volatile sig_atomic_t preempt_flag;
static struct sigaction old_term, old_int;
static bool handlers_installed;

static void on_preempt(int sig) {
  if (preempt_flag) { /* a second signal: let it kill, as without handlers */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  preempt_flag = 1;
}

nb_status nb_ckpt_preemption_install(nb_ctx *ctx) {
  if (handlers_installed) return NB_OK;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_preempt;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, &old_term) != 0 || sigaction(SIGINT, &sa, &old_int) != 0)
    return nb_errorf(ctx, NB_ERR_INTERNAL, "cannot install SIGTERM/SIGINT handlers: %s", strerror(errno));
  handlers_installed = true;
  return NB_OK;
}

void nb_ckpt_preemption_uninstall(void) {
  if (!handlers_installed) return;
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGINT, &old_int, NULL);
  handlers_installed = false;
}

bool nb_ckpt_preemption_requested(void) { return preempt_flag != 0; }
void nb_ckpt_preemption_clear(void) { preempt_flag = 0; }

nb_status nb_ckpt_emergency_save(nb_ckpt_manager *m, int64_t step, const nb_ckpt_item *items, int n_items,
                                 const nb_ckpt_save_opts *opts) {
  join_writer(m);
  nb_status earlier = m->pending;
  char earlier_msg[sizeof m->pending_msg];
  snprintf(earlier_msg, sizeof earlier_msg, "%s", m->pending_msg);
  m->pending = NB_OK;
  bool exists = false;
  nb_status s = check_save(m, step, &exists);
  if (s == NB_OK && !exists) {
    nb_ckpt__snapshot *snap = nb_ckpt__snapshot_take(m->ctx, step, items, n_items, opts);
    s = snap ? write_and_index(m->ctx, m, snap) : nb_ctx_status(m->ctx);
    nb_ckpt__snapshot_free(snap);
  }
  if (s != NB_OK || earlier == NB_OK) return s;
  return nb_errorf(m->ctx, earlier, "emergency save of step %lld succeeded, but an earlier background save failed: %s",
                   (long long)step, earlier_msg);
}
