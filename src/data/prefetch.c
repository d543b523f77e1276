/* Ordered prefetch. Parallel mode: when the upstream is a source iterator
 * followed only by per-element stages, N workers compute elements by source
 * index into a ring buffer and the consumer takes them in index order, so
 * the output never depends on N. Sequential mode: one thread runs any other
 * upstream ahead and keeps, with each buffered element, the upstream's state
 * right after it (the state the consumer resumes from). Not here: anything
 * about what the elements are. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "data/internal.h"
#include "util/trace.h"

enum { EMPTY, BUSY, READY };

typedef struct slot {
  int64_t index;
  int state;
  nb_data_elem e;
  nb_data__errslot err;
} slot;

typedef struct prefetch_impl {
  int workers, buffer;
  bool parallel, running, stop;
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_ready;
  slot *slots;
  /* parallel */
  nb_data_map *ds;       /* borrowed from the source node */
  nb_data_iter **chain;  /* per-element stages, bottom up */
  int n_chain;
  int64_t next_claim, next_deliver, end;
  /* sequential */
  int64_t head, tail;    /* ring positions taken / filled */
  bool producer_done;    /* the end or an error is in the ring */
  bool finished;         /* the consumer took it */
  nb_data__errslot final_err;
  int64_t *snaps;        /* [buffer][n_child] state after each buffered element */
  int64_t *last_state;   /* state after the last element delivered */
  int n_child;
} prefetch_impl;

/* ---- trace spans (src/util/trace.h) ------------------------------------------ */

/* the consumer waited for the next element: the pipeline did not keep up */
static void trace_wait(int64_t t0, int64_t t1) { nb_util__trace_span("data", "data wait", t0, t1, NULL, 0); }

/* a worker made element `index` */
static void trace_element(int64_t t0, int64_t index) {
  nb_util__trace_arg a = {"index", NULL, (double)index};
  nb_util__trace_span("data", "data element", t0, nb_util__now_ns(), &a, 1);
}

static void name_worker(void) {
  static atomic_int counter;
  char name[32];
  snprintf(name, sizeof name, "nabla-data-%d", atomic_fetch_add(&counter, 1));
  nb_util__trace_thread_name(name);
}

/* ---- parallel workers --------------------------------------------------------- */

static void *parallel_worker(void *arg) {
  nb_data_iter *it = arg;
  prefetch_impl *p = it->impl;
  nb_data_iter *source = it->child;
  while (source->child) source = source->child;
  name_worker();
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    if (p->next_claim >= p->end || p->next_claim >= p->next_deliver + p->buffer) {
      pthread_cond_wait(&p->cv_work, &p->mu);
      continue;
    }
    int64_t i = p->next_claim++;
    slot *sl = &p->slots[i % p->buffer];
    sl->index = i;
    sl->state = BUSY;
    pthread_mutex_unlock(&p->mu);
    nb_data_elem e = NB_DATA_ELEM_INIT;
    nb_data__errslot err = {NB_OK, ""};
    nb_data__tls_err = &err;
    int64_t t0 = nb_util__now_ns(), t_elem = nb_util__trace_start();
    nb_status s = nb_data_map_get(p->ds, i, &e);
    nb_data__stats_add(&source->stats, !s && e.kind != NB_DATA_NONE, nb_util__now_ns() - t0);
    for (int k = 0; !s && k < p->n_chain && e.kind != NB_DATA_NONE; k++) {
      bool keep = true;
      t0 = nb_util__now_ns();
      s = p->chain[k]->ops->apply(p->chain[k], &e, &keep);
      if (!s && !keep) nb_data_elem_clear(it->ctx, &e);
      nb_data__stats_add(&p->chain[k]->stats, !s && keep, nb_util__now_ns() - t0);
    }
    if (s) {
      nb_data__capture(it->ctx, s, &err);
      nb_data_elem_clear(it->ctx, &e);
    }
    if (t_elem) trace_element(t_elem, i);
    nb_data__tls_err = NULL;
    pthread_mutex_lock(&p->mu);
    sl->e = e;
    sl->err = err;
    sl->state = READY;
    pthread_cond_broadcast(&p->cv_ready);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static nb_status parallel_next(nb_data_iter *it, nb_data_elem *out) {
  prefetch_impl *p = it->impl;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    if (p->next_deliver >= p->end) {
      pthread_mutex_unlock(&p->mu);
      return NB_OK;
    }
    slot *sl = &p->slots[p->next_deliver % p->buffer];
    atomic_fetch_add(&it->stats.occ_sum, p->next_claim - p->next_deliver);
    atomic_fetch_add(&it->stats.occ_n, 1);
    int64_t t0 = nb_util__now_ns();
    while (!(sl->state == READY && sl->index == p->next_deliver)) pthread_cond_wait(&p->cv_ready, &p->mu);
    int64_t t1 = nb_util__now_ns();
    atomic_fetch_add(&it->stats.ns_wait, t1 - t0);
    if (nb_util__tracing()) trace_wait(t0, t1);
    *out = sl->e;
    sl->e = (nb_data_elem)NB_DATA_ELEM_INIT;
    nb_data__errslot err = sl->err;
    sl->state = EMPTY;
    p->next_deliver++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    if (err.status) return nb_errorf(it->ctx, err.status, "%s", err.msg);
    if (out->kind != NB_DATA_NONE) return NB_OK;
  }
}

/* ---- sequential producer ---------------------------------------------------- */

static void *sequential_worker(void *arg) {
  nb_data_iter *it = arg;
  prefetch_impl *p = it->impl;
  name_worker();
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    if (p->producer_done || p->tail - p->head >= p->buffer) {
      pthread_cond_wait(&p->cv_work, &p->mu);
      continue;
    }
    pthread_mutex_unlock(&p->mu);
    nb_data_elem e = NB_DATA_ELEM_INIT;
    nb_data__errslot err = {NB_OK, ""};
    nb_data__tls_err = &err;
    int64_t t_elem = nb_util__trace_start();
    nb_status s = nb_data_iter_next(it->child, &e);
    if (t_elem) trace_element(t_elem, p->tail);
    if (s) nb_data__capture(it->ctx, s, &err);
    int64_t *row = p->snaps + (size_t)(p->tail % p->buffer) * (size_t)p->n_child;
    if (!s) nb_data__save(it->child, row); /* the slot is free: only this thread writes it */
    nb_data__tls_err = NULL;
    pthread_mutex_lock(&p->mu);
    slot *sl = &p->slots[p->tail % p->buffer];
    sl->e = e;
    sl->err = err;
    sl->state = READY;
    p->tail++;
    if (s || e.kind == NB_DATA_NONE) p->producer_done = true;
    pthread_cond_broadcast(&p->cv_ready);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static nb_status sequential_next(nb_data_iter *it, nb_data_elem *out) {
  prefetch_impl *p = it->impl;
  if (p->finished) {
    if (p->final_err.status)
      return nb_errorf(it->ctx, p->final_err.status, "prefetch: the upstream failed earlier: %s", p->final_err.msg);
    return NB_OK;
  }
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&it->stats.occ_sum, p->tail - p->head);
  atomic_fetch_add(&it->stats.occ_n, 1);
  int64_t t0 = nb_util__now_ns();
  while (p->head == p->tail) pthread_cond_wait(&p->cv_ready, &p->mu);
  int64_t t1 = nb_util__now_ns();
  atomic_fetch_add(&it->stats.ns_wait, t1 - t0);
  if (nb_util__tracing()) trace_wait(t0, t1);
  slot *sl = &p->slots[p->head % p->buffer];
  *out = sl->e;
  sl->e = (nb_data_elem)NB_DATA_ELEM_INIT;
  nb_data__errslot err = sl->err;
  sl->state = EMPTY;
  if (!err.status && out->kind != NB_DATA_NONE)
    memcpy(p->last_state, p->snaps + (size_t)(p->head % p->buffer) * (size_t)p->n_child,
           (size_t)p->n_child * sizeof *p->last_state);
  p->head++;
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  if (err.status || out->kind == NB_DATA_NONE) {
    p->finished = true;
    p->final_err = err;
  }
  if (err.status) return nb_errorf(it->ctx, err.status, "%s", err.msg);
  return NB_OK;
}

/* ---- threads, state ---------------------------------------------------------- */

static void stop_threads(nb_data_iter *it) {
  prefetch_impl *p = it->impl;
  if (!p->running) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  for (int k = 0; k < p->n_threads; k++) pthread_join(p->threads[k], NULL);
  p->running = p->stop = false;
  for (int k = 0; k < p->buffer; k++) {
    nb_data_elem_clear(it->ctx, &p->slots[k].e);
    p->slots[k].state = EMPTY;
  }
}

static nb_status start_threads(nb_data_iter *it) {
  prefetch_impl *p = it->impl;
  int n = p->parallel ? p->workers : 1;
  p->n_threads = 0;
  p->running = true;
  for (int k = 0; k < n; k++) {
    if (pthread_create(&p->threads[k], NULL, p->parallel ? parallel_worker : sequential_worker, it)) {
      stop_threads(it);
      return nb_errorf(it->ctx, NB_ERR_INTERNAL, "prefetch: cannot start worker thread %d", k);
    }
    p->n_threads++;
  }
  return NB_OK;
}

static nb_status prefetch_next(nb_data_iter *it, nb_data_elem *out) {
  prefetch_impl *p = it->impl;
  if (!p->running && !(p->finished && !p->parallel)) {
    nb_status s = start_threads(it);
    if (s) return s;
  }
  return p->parallel ? parallel_next(it, out) : sequential_next(it, out);
}

static void prefetch_save(nb_data_iter *it, int64_t *st) {
  prefetch_impl *p = it->impl;
  if (p->parallel) {
    nb_data__save(it->child, st); /* per-element stages keep no state: the layout is the source's */
    st[0] = p->next_deliver;
  } else {
    memcpy(st, p->last_state, (size_t)p->n_child * sizeof *st);
  }
}

static nb_status prefetch_load(nb_data_iter *it, const int64_t *st) {
  prefetch_impl *p = it->impl;
  stop_threads(it);
  nb_status s = nb_data__load(it->child, st);
  if (s) return s;
  if (p->parallel) {
    p->next_claim = p->next_deliver = st[0];
  } else {
    memcpy(p->last_state, st, (size_t)p->n_child * sizeof *st);
    p->head = p->tail = 0;
    p->producer_done = p->finished = false;
    p->final_err = (nb_data__errslot){NB_OK, ""};
  }
  return NB_OK;
}

static void prefetch_destroy(nb_data_iter *it) {
  prefetch_impl *p = it->impl;
  nb_ctx *ctx = it->ctx;
  stop_threads(it);
  nb_dealloc(ctx, p->threads, (size_t)p->workers * sizeof *p->threads);
  nb_dealloc(ctx, p->slots, (size_t)p->buffer * sizeof *p->slots);
  nb_dealloc(ctx, p->chain, (size_t)(p->n_chain + 1) * sizeof *p->chain);
  nb_dealloc(ctx, p->snaps, (size_t)p->buffer * (size_t)(p->n_child + 1) * sizeof *p->snaps);
  nb_dealloc(ctx, p->last_state, (size_t)(p->n_child + 1) * sizeof *p->last_state);
  pthread_cond_destroy(&p->cv_work);
  pthread_cond_destroy(&p->cv_ready);
  pthread_mutex_destroy(&p->mu);
}

static const nb_data__iter_ops prefetch_ops = {"prefetch", prefetch_next, NULL, 0, prefetch_save, prefetch_load,
                                               prefetch_destroy, false};

/* Finds the per-element stages between it and a source iterator: true when
 * the upstream is of that shape (parallel mode). */
static bool find_chain(nb_data_iter *child, prefetch_impl *p, nb_ctx *ctx) {
  int n = 0;
  nb_data_iter *n_it = child;
  while (n_it->ops->apply) n_it = n_it->child, n++;
  if (!nb_data__iter_source(n_it)) return false;
  p->chain = nb_alloc(ctx, (size_t)(n + 1) * sizeof *p->chain);
  if (!p->chain) return false;
  p->n_chain = n;
  n_it = child;
  for (int k = n - 1; k >= 0; k--, n_it = n_it->child) p->chain[k] = n_it;
  p->ds = nb_data__iter_source(n_it);
  p->next_claim = p->next_deliver = *nb_data__iter_source_pos(n_it);
  p->end = p->ds->len;
  return true;
}

nb_data_iter *nb_data_iter_prefetch(nb_data_iter *it, int workers, int buffer) {
  if (!it) return NULL;
  nb_ctx *ctx = it->ctx;
  if (workers < 1 || workers > 256 || buffer < 1) {
    nb_data__err(ctx, NB_ERR_INVALID_ARG, "prefetch: workers %d (want 1..256) and buffer %d (want >= 1)", workers, buffer);
    return nb_data_iter_destroy(it), NULL;
  }
  nb_data_iter *n = nb_data__iter_new(ctx, &prefetch_ops, it, sizeof(prefetch_impl));
  if (!n) return NULL;
  prefetch_impl *p = n->impl;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_ready, NULL);
  p->workers = workers;
  p->n_child = it->n_state;
  p->parallel = find_chain(it, p, ctx);
  if (p->parallel && buffer < workers) buffer = workers;
  p->buffer = buffer;
  p->threads = nb_calloc(ctx, (size_t)workers * sizeof *p->threads);
  p->snaps = nb_calloc(ctx, (size_t)buffer * (size_t)(p->n_child + 1) * sizeof *p->snaps);
  p->last_state = nb_calloc(ctx, (size_t)(p->n_child + 1) * sizeof *p->last_state);
  p->slots = nb_calloc(ctx, (size_t)buffer * sizeof *p->slots);
  if (!p->threads || !p->snaps || !p->last_state || !p->slots) return nb_data_iter_destroy(n), NULL;
  if (!p->parallel) nb_data__save(it, p->last_state);
  return n;
}
