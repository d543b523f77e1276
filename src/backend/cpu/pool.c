/* The runtime's thread pool: a fixed set of worker threads created once and
 * shared by every executable that asks for the same thread count (kept
 * while any of them is alive). A parallel region hands out task indices
 * through an atomic claim word (the region's generation and the next task),
 * and the calling thread works too. The caller waits for the region's tasks
 * to be done, never for the workers to show up: on a machine that other
 * processes load, a worker may not be scheduled for milliseconds, and a
 * region that waited for every worker to check in ran a tiny model's decode
 * 5x slower at two threads than at one (2 cores, load 3-4). A worker that
 * comes late finds the claim word moved on and claims nothing, so the
 * caller alone still finishes the region. But a worker descheduled while it
 * holds a task makes the caller wait. The pool keeps a running balance of
 * what the workers bring (the caller's time their tasks would have taken)
 * against what they cost (the caller's wait for them), decaying by DECAY
 * a region; when it falls below -BALANCE_MIN_MS (parallel work lost more than
 * it gained), or when the workers ran no task in IDLE_RUN regions in a row
 * (they are not getting the CPU, and waking them costs a system call a
 * region), the pool backs off:
 * fewer workers take part (none for a 2-thread pool: the caller runs the
 * tasks inline, as one thread would) until a probe with all of them, after
 * BACKOFF_MIN_MS, doubling while probes fail, up to BACKOFF_MAX_MS. Which
 * thread runs a task never changes a result (tasks are cut by the work, not
 * by the threads). Between regions a worker spins briefly (SPIN_NS, by
 * the clock: a pause is 10-40 ns depending on the CPU) and then sleeps on a
 * condition variable: waking a sleeping thread costs tens of microseconds on
 * a VM (the idle vCPU is descheduled), which dominated small steps, while a
 * short spin does not compete with other work for long. The spin outlasts
 * the host steps between a decode step's products (50-90 us of small
 * kernels before its attention): 2000 pauses (53 us on AMD Zen 4) let the
 * worker fall asleep there and join the attention 25-40 us late. Not here:
 * how work is split into tasks (backend/cpu/cpu.c, blas.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "util/trace.h"
#include "util/util.h"

#define SPIN_NS 200000 /* 0.2 ms */
#define DECAY 0.95
#define BALANCE_MIN_MS 2.0  /* a descheduled thread costs a time slice, 1 ms or more */
#define BACKOFF_MIN_MS 20.0
#define BACKOFF_MAX_MS 1000.0
#define CLEAN_RESET 256     /* clean regions with every worker after which backoff is BACKOFF_MIN_MS again */
#define IDLE_RUN 16         /* regions in a row in which no worker ran a task: back off too */

typedef void (*task_fn)(void *, int);

typedef struct worker_arg {
  nb_pool *p;
  int index;
} worker_arg;

struct nb_pool {
  int nthreads; /* including the caller */
  int refs;
  pthread_t *workers;
  worker_arg *wargs;
  int nworkers;
  pthread_mutex_t mu, run_mu;
  pthread_cond_t work_cv, done_cv;
  /* The current region: its generation in the high 32 bits, the next
   * unclaimed task in the low 32 (CLOSED between regions). A task is claimed
   * by a compare-and-swap of this word, so only while the region that fn,
   * arg and ntasks were read for is open: see nb_cpu__pool_run and work. */
  _Atomic uint64_t claim;
  uint32_t gen;        /* generations published so far (under run_mu) */
  _Atomic task_fn fn;
  _Atomic(void *) arg;
  _Atomic uint32_t ntasks;
  _Atomic uint32_t done; /* tasks of the current region finished */
  _Atomic int allowed;   /* workers with a lower index take part in the current region */
  /* back-off state (under run_mu) */
  int participants;      /* workers that take part from now on */
  double probe_at_ms, backoff_ms;
  int clean, idle;
  double balance;        /* ms the workers saved the caller lately, less its waits for them */
  int sleepers;        /* workers waiting on work_cv (under mu) */
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

#define CLOSED UINT32_MAX /* a claim index no region reaches (ntasks <= INT_MAX) */

static uint32_t gen_of(uint64_t claim) { return (uint32_t)(claim >> 32); }

/* A spin's clock: true once SPIN_NS have passed since its first call
 * (i == 0; the clock is read every 64th pause). */
static bool spin_over(int64_t *end, int i) {
  if (i & 63) return false;
  int64_t now = nb_util__now_ns();
  if (i == 0) *end = now + SPIN_NS;
  return now >= *end;
}

/* Claims and runs tasks of the open region until none is left; returns how
 * many it ran. fn, arg and ntasks are read after the claim word (acquire)
 * and may already belong to the next region if it is being published
 * meanwhile; but that region's publisher closed this one's claim word
 * first, and the acquire loads make that close visible here, so the
 * compare-and-swap then fails: a task runs only with the fields of the
 * region it was claimed from. */
static int work(nb_pool *p) {
  uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
  uint32_t gen = gen_of(c);
  uint32_t n = atomic_load_explicit(&p->ntasks, memory_order_acquire);
  task_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
  void *arg = atomic_load_explicit(&p->arg, memory_order_acquire);
  int ran = 0;
  while (gen_of(c) == gen && (uint32_t)c < n) {
    if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire)) continue;
    fn(arg, (int)(uint32_t)c);
    ran++;
    if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n) {
      pthread_mutex_lock(&p->mu); /* the caller checks `done` under mu before it sleeps */
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
    c = atomic_load_explicit(&p->claim, memory_order_acquire);
  }
  return ran;
}

/* Waits until a region other than `seen` is published (or stop): spins
 * (when `spin`), then sleeps. Returns the new generation. */
static uint32_t wait_work(nb_pool *p, uint32_t seen, bool spin) {
  uint32_t g = gen_of(atomic_load_explicit(&p->claim, memory_order_acquire));
  int64_t end = 0;
  for (int i = 0; spin && g == seen && !atomic_load(&p->stop) && !spin_over(&end, i); i++) {
    cpu_relax();
    g = gen_of(atomic_load_explicit(&p->claim, memory_order_acquire));
  }
  if (g != seen) return g;
  pthread_mutex_lock(&p->mu);
  p->sleepers++;
  while (!atomic_load(&p->stop) && (g = gen_of(atomic_load(&p->claim))) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
  p->sleepers--;
  pthread_mutex_unlock(&p->mu);
  return g;
}

static void *worker(void *arg) {
  const worker_arg *w = arg;
  nb_pool *p = w->p;
  uint32_t seen = 0;
  bool taking_part = true;
  char name[32];
  snprintf(name, sizeof name, "nabla-pool-%d", w->index + 1); /* the caller is the region's thread 0 */
  nb_util__trace_thread_name(name);
  for (;;) {
    /* a worker left out while the pool backs off sleeps at once: its spin
     * would take the CPU the back-off gives back */
    seen = wait_work(p, seen, taking_part);
    if (atomic_load(&p->stop)) break;
    taking_part = w->index < atomic_load_explicit(&p->allowed, memory_order_acquire);
    if (!taking_part) continue;
    int64_t t0 = nb_util__trace_start();
    int ran = work(p);
    if (t0 && ran) { /* a trace shows the tasks this worker took of a region */
      nb_util__trace_arg a = {"tasks", NULL, ran};
      nb_util__trace_span("pool", "pool tasks", t0, nb_util__now_ns(), &a, 1);
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
  free(p->wargs);
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
  p->wargs = calloc((size_t)threads, sizeof(worker_arg));
  if (!p->workers || !p->wargs) {
    pool_free(p);
    return NULL;
  }
  for (int i = 0; i + 1 < threads; i++) {
    p->wargs[i] = (worker_arg){p, i};
    if (pthread_create(&p->workers[i], NULL, worker, &p->wargs[i]) != 0) break;
    p->nworkers++;
  }
  p->nthreads = p->nworkers + 1;
  p->participants = p->nworkers;
  p->backoff_ms = BACKOFF_MIN_MS;
  return p;
}

nb_pool *nb_cpu__pool_get(int threads) {
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

void nb_cpu__pool_put(nb_pool *p) {
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

int nb_cpu__pool_threads(const nb_pool *p) { return p ? p->nthreads : 1; }

/* After a region of ntasks, of which the caller ran own_tasks in own_ms and
 * then waited wait_ms: back off when the balance of the workers' help is
 * too negative or they sat idle (see the top of the file). Under run_mu. */
static void adapt(nb_pool *p, int ntasks, double own_ms, int own_tasks, double wait_ms, double end_ms) {
  p->idle = own_tasks == ntasks ? p->idle + 1 : 0;
  if (own_tasks > 0) p->balance = p->balance * DECAY + (ntasks - own_tasks) * (own_ms / own_tasks) - wait_ms;
  if (p->balance < -BALANCE_MIN_MS || p->idle >= IDLE_RUN) {
    p->idle = 0;
    p->balance = 0;
    p->participants /= 2;
    p->probe_at_ms = end_ms + p->backoff_ms;
    p->backoff_ms = p->backoff_ms * 2 < BACKOFF_MAX_MS ? p->backoff_ms * 2 : BACKOFF_MAX_MS;
    p->clean = 0;
  } else if (p->participants == p->nworkers && ++p->clean >= CLEAN_RESET) {
    p->backoff_ms = BACKOFF_MIN_MS;
    p->clean = 0;
  }
}

int nb_cpu__pool_participants(nb_pool *p) {
  if (!p) return 0;
  pthread_mutex_lock(&p->run_mu);
  int n = p->participants;
  pthread_mutex_unlock(&p->run_mu);
  return n;
}

void nb_cpu__pool_run(nb_pool *p, int ntasks, void (*fn)(void *arg, int task), void *arg) {
  if (!p || p->nworkers == 0 || ntasks <= 1) {
    for (int t = 0; t < ntasks; t++) fn(arg, t);
    return;
  }
  pthread_mutex_lock(&p->run_mu);
  double t0 = nb_util__now_ms();
  if (p->participants < p->nworkers && t0 >= p->probe_at_ms) p->participants = p->nworkers; /* probe */
  if (p->participants == 0) { /* backed off: as one thread */
    for (int t = 0; t < ntasks; t++) fn(arg, t);
    pthread_mutex_unlock(&p->run_mu);
    return;
  }
  /* close the last region before its fields change (see work) */
  atomic_store_explicit(&p->claim, (uint64_t)p->gen << 32 | CLOSED, memory_order_relaxed);
  atomic_store_explicit(&p->fn, fn, memory_order_release);
  atomic_store_explicit(&p->arg, arg, memory_order_release);
  atomic_store_explicit(&p->ntasks, (uint32_t)ntasks, memory_order_release);
  atomic_store_explicit(&p->allowed, p->participants, memory_order_release);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  uint32_t gen = ++p->gen;
  if (gen == 0) gen = ++p->gen; /* 0 is what a new worker has seen */
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_release); /* opens it */
  if (p->sleepers) pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  int own_tasks = work(p);
  double t1 = nb_util__now_ms();
  /* only tasks a worker claimed and is still running are left */
  int64_t end = 0;
  for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < (uint32_t)ntasks && !spin_over(&end, i); i++) cpu_relax();
  if (atomic_load_explicit(&p->done, memory_order_acquire) < (uint32_t)ntasks) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->done) < (uint32_t)ntasks) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  double t2 = nb_util__now_ms();
  adapt(p, ntasks, t1 - t0, own_tasks, t2 - t1, t2);
  pthread_mutex_unlock(&p->run_mu);
}
