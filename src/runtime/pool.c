/* The runtime's thread pool: a fixed set of worker threads created once and
 * shared by every executable that asks for the same thread count (kept
 * while any of them is alive). A parallel region hands out task indices
 * through an atomic counter; the calling thread works too. Between regions
 * a worker spins briefly (SPIN_ITERS pauses, about a tenth of a millisecond)
 * and then sleeps on a condition variable: waking a sleeping thread costs
 * tens of microseconds on a VM (the idle vCPU is descheduled), which
 * dominated small steps (a tiny model's decode ran several times slower
 * when nothing kept the other vCPU busy), while a short spin does not compete with
 * OpenBLAS's threads during a long matmul. Not here: how work is split into
 * tasks (runtime/exe.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "compile/jit.h"

#define SPIN_ITERS 2000

struct nb_pool {
  int nthreads; /* including the caller */
  int refs;
  pthread_t *workers;
  int nworkers;
  pthread_mutex_t mu, run_mu;
  pthread_cond_t work_cv, done_cv;
  _Atomic uint64_t gen; /* bumped under mu when a region starts */
  int sleepers;         /* workers waiting on work_cv (under mu) */
  void (*fn)(void *, int);
  void *arg;
  int ntasks;
  _Atomic int next;
  _Atomic int active; /* workers still in the current region */
  _Atomic bool stop;
  nb_pool *link;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static nb_pool *registry;

static void drain(nb_pool *p) {
  for (int t; (t = atomic_fetch_add(&p->next, 1)) < p->ntasks;) p->fn(p->arg, t);
}

/* Waits until gen moves past `seen` (or stop): spins, then sleeps. */
static uint64_t wait_work(nb_pool *p, uint64_t seen) {
  uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
  for (int i = 0; i < SPIN_ITERS && g == seen && !atomic_load(&p->stop); i++) {
    cpu_relax();
    g = atomic_load_explicit(&p->gen, memory_order_acquire);
  }
  if (g != seen) return g;
  pthread_mutex_lock(&p->mu);
  p->sleepers++;
  while (!atomic_load(&p->stop) && (g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
  p->sleepers--;
  pthread_mutex_unlock(&p->mu);
  return g;
}

static void *worker(void *arg) {
  nb_pool *p = arg;
  uint64_t seen = 0;
  for (;;) {
    seen = wait_work(p, seen);
    if (atomic_load(&p->stop)) break;
    drain(p);
    if (atomic_fetch_sub(&p->active, 1) == 1) {
      pthread_mutex_lock(&p->mu); /* the caller checks `active` under mu before it sleeps */
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

static void pool_free(nb_pool *p) {
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, true);
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
  p->fn = fn;
  p->arg = arg;
  p->ntasks = ntasks;
  atomic_store(&p->next, 0);
  atomic_store(&p->active, p->nworkers);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release); /* publishes fn, arg, ntasks */
  if (p->sleepers) pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  drain(p);
  for (int i = 0; i < SPIN_ITERS && atomic_load(&p->active) > 0; i++) cpu_relax();
  if (atomic_load(&p->active) > 0) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->active) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&p->run_mu);
}
