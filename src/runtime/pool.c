/* The runtime's thread pool: a fixed set of worker threads created once and
 * shared by every executable that asks for the same thread count (kept
 * while any of them is alive). A parallel region hands out task indices
 * through an atomic counter; the calling thread works too. Workers sleep on
 * a condition variable between regions, so they never compete with
 * OpenBLAS's threads while a matmul runs. Not here: how work is split into
 * tasks (runtime/exe.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "compile/jit.h"

struct nb_pool {
  int nthreads; /* including the caller */
  int refs;
  pthread_t *workers;
  int nworkers;
  pthread_mutex_t mu, run_mu;
  pthread_cond_t work_cv, done_cv;
  uint64_t gen;
  void (*fn)(void *, int);
  void *arg;
  int ntasks;
  _Atomic int next;
  int active;
  bool stop;
  nb_pool *link;
};

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static nb_pool *registry;

static void drain(nb_pool *p) {
  for (int t; (t = atomic_fetch_add(&p->next, 1)) < p->ntasks;) p->fn(p->arg, t);
}

static void *worker(void *arg) {
  nb_pool *p = arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->work_cv, &p->mu);
    if (p->stop) break;
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    if (--p->active == 0) pthread_cond_signal(&p->done_cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void pool_free(nb_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->run_mu);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  free(p->workers);
  free(p);
}

static nb_pool *pool_new(int threads) {
  nb_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->nthreads = threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->run_mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  p->workers = calloc((size_t)threads, sizeof(pthread_t));
  if (!p->workers) {
    pool_free(p);
    return NULL;
  }
  for (int i = 0; i + 1 < threads; i++) {
    if (pthread_create(&p->workers[i], NULL, worker, p) != 0) break;
    p->nworkers++;
  }
  p->nthreads = p->nworkers + 1;
  return p;
}

nb_pool *nb_rt__pool_get(int threads) {
  if (threads < 1) threads = 1;
  pthread_mutex_lock(&registry_mu);
  nb_pool *p = registry;
  while (p && p->nthreads != threads) p = p->link;
  if (!p && (p = pool_new(threads))) {
    p->link = registry;
    registry = p;
  }
  if (p) p->refs++;
  pthread_mutex_unlock(&registry_mu);
  return p;
}

void nb_rt__pool_put(nb_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&registry_mu);
  bool last = --p->refs == 0;
  if (last)
    for (nb_pool **q = &registry; *q; q = &(*q)->link)
      if (*q == p) {
        *q = p->link;
        break;
      }
  pthread_mutex_unlock(&registry_mu);
  if (last) pool_free(p);
}

int nb_rt__pool_threads(const nb_pool *p) { return p ? p->nthreads : 1; }

void nb_rt__pool_run(nb_pool *p, int ntasks, void (*fn)(void *arg, int task), void *arg) {
  if (!p || p->nworkers == 0 || ntasks <= 1) {
    for (int t = 0; t < ntasks; t++) fn(arg, t);
    return;
  }
  pthread_mutex_lock(&p->run_mu);
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->arg = arg;
  p->ntasks = ntasks;
  atomic_store(&p->next, 0);
  p->active = p->nworkers;
  p->gen++;
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  drain(p);
  pthread_mutex_lock(&p->mu);
  while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_unlock(&p->run_mu);
}
