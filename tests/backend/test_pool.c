/* The runtime's thread pool: every task of every region runs exactly once
 * and the region returns only after all of them, across the pool's two
 * waiting modes (a worker still spinning from the previous region, and one
 * asleep after a pause longer than the spin), with regions of 2 to 64 tasks
 * (some slower than the caller's spin, so returning early shows), from
 * several thread counts, and two pools of one size shared by reference.
 * And a region finishes without a worker that is not running (as when
 * other processes load the machine): the caller does its tasks itself; when
 * a worker holds a task for long, the pool backs off to the caller alone
 * and probes with the workers again later. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "test.h"

typedef struct region {
  _Atomic int hits[64];
  int ntasks;
  bool slow; /* each task takes 0.3 ms, longer than the caller's spin */
} region;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void task(void *arg, int t) {
  region *r = arg;
  if (r->slow)
    for (double t0 = now_ms(); now_ms() - t0 < 0.3;) {
    }
  atomic_fetch_add(&r->hits[t], 1);
}

static bool run_once(nb_pool *p, int ntasks, bool slow) {
  region r = {.ntasks = ntasks, .slow = slow};
  for (int i = 0; i < 64; i++) atomic_store(&r.hits[i], 0);
  nb_cpu__pool_run(p, ntasks, task, &r);
  for (int i = 0; i < 64; i++)
    if (atomic_load(&r.hits[i]) != (i < ntasks)) return false;
  return true;
}

static void pause_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- a stalled worker */

static _Atomic bool stalled, release_worker;
static pthread_t main_thread;
static _Atomic int worker_seen;
static pthread_t worker_thread;

static void stall(int sig) {
  (void)sig;
  atomic_store(&stalled, true);
  while (!atomic_load(&release_worker)) usleep(1000);
}

static void note_worker(void *arg, int t) {
  (void)arg, (void)t;
  if (!pthread_equal(pthread_self(), main_thread) && atomic_exchange(&worker_seen, 1) == 0) worker_thread = pthread_self();
  pause_ms(1);
}

static _Atomic bool region_returned;

static void *watchdog(void *arg) {
  (void)arg;
  for (int i = 0; i < 2000 && !atomic_load(&region_returned); i++) usleep(1000);
  atomic_store(&release_worker, true); /* the old pool waited for it: let it go after 2 s */
  return NULL;
}

/* The worker of a 2-thread pool is stopped inside a signal handler (as if
 * descheduled); a region of 200 tasks must return without it. */
static void test_stalled_worker(void) {
  nb_pool *p = nb_cpu__pool_get(2);
  main_thread = pthread_self();
  for (int i = 0; i < 200 && !atomic_load(&worker_seen); i++) nb_cpu__pool_run(p, 8, note_worker, NULL);
  CHECK_MSG(atomic_load(&worker_seen), "no task ran on the worker");
  if (!atomic_load(&worker_seen)) return;
  struct sigaction sa = {.sa_handler = stall};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  pthread_kill(worker_thread, SIGUSR1);
  while (!atomic_load(&stalled)) usleep(100);
  pthread_t dog;
  pthread_create(&dog, NULL, watchdog, NULL);
  bool ok = run_once(p, 64, false);
  double t0 = now_ms();
  for (int i = 0; i < 200; i++) ok &= run_once(p, 2 + i % 63, false);
  double ms = now_ms() - t0;
  bool in_time = !atomic_load(&release_worker);
  atomic_store(&region_returned, true);
  pthread_join(dog, NULL);
  atomic_store(&release_worker, true);
  CHECK_MSG(ok, "a region lost or repeated a task while the worker was stalled");
  CHECK_MSG(in_time, "regions waited for the stalled worker (201 regions took over 2 s)");
  printf("201 regions with the worker stalled: %.1f ms\n", ms);
  CHECK(run_once(p, 64, true)); /* the worker is back */
  nb_cpu__pool_put(p);
}

/* ---------------------------------------------------------------- back-off */

static _Atomic int on_worker;
static _Atomic bool worker_sleeps;

/* While worker_sleeps: the caller's first task waits (up to 100 ms) for the
 * worker to claim a task, which then takes 20 ms, as if the worker were
 * descheduled while it holds it. */
static void maybe_slow(void *arg, int t) {
  (void)arg;
  if (pthread_equal(pthread_self(), main_thread)) {
    for (int i = 0; t == 0 && i < 1000 && atomic_load(&worker_sleeps) && atomic_load(&on_worker) == 0; i++) usleep(100);
    return;
  }
  atomic_fetch_add(&on_worker, 1);
  if (atomic_load(&worker_sleeps)) pause_ms(20);
}

static void test_backoff(void) {
  nb_pool *p = nb_cpu__pool_get(2);
  main_thread = pthread_self();
  CHECK(nb_cpu__pool_participants(p) == 1);
  atomic_store(&worker_sleeps, true);
  atomic_store(&on_worker, 0);
  for (int i = 0; i < 20 && atomic_load(&on_worker) == 0; i++) nb_cpu__pool_run(p, 8, maybe_slow, NULL);
  atomic_store(&worker_sleeps, false);
  CHECK_MSG(atomic_load(&on_worker) > 0, "the worker never took a task");
  CHECK_MSG(nb_cpu__pool_participants(p) == 0, "the pool did not back off after a worker held a task for 20 ms");
  atomic_store(&on_worker, 0);
  double t0 = now_ms();
  for (int i = 0; i < 50; i++) nb_cpu__pool_run(p, 8, maybe_slow, NULL);
  if (now_ms() - t0 < 15) /* still inside the first back-off (20 ms) */
    CHECK_MSG(atomic_load(&on_worker) == 0, "%d tasks ran on the worker while backed off", atomic_load(&on_worker));
  pause_ms(30);
  atomic_store(&on_worker, 0);
  nb_cpu__pool_run(p, 8, maybe_slow, NULL); /* the probe (the worker may straggle again on a loaded machine) */
  CHECK_MSG(nb_cpu__pool_participants(p) == 1 || atomic_load(&on_worker) > 0, "no probe with the worker after the back-off");
  nb_cpu__pool_put(p);
}

int main(void) {
  for (int threads = 1; threads <= 4; threads++) {
    nb_pool *p = nb_cpu__pool_get(threads), *q = nb_cpu__pool_get(threads);
    CHECK_MSG(p && p == q, "%d threads: one shared pool", threads);
    CHECK(nb_cpu__pool_threads(p) == threads);
    int bad = 0;
    for (int i = 0; i < 3000; i++) /* back to back: workers are still spinning */
      bad += !run_once(p, 2 + i % 63, i % 50 == 0);
    CHECK_MSG(bad == 0, "%d threads, back to back: %d regions lost or repeated a task", threads, bad);
    bad = 0;
    for (int i = 0; i < 20; i++) { /* after a pause: workers have gone to sleep */
      pause_ms(2);
      bad += !run_once(q, 2 + i % 7, true);
    }
    CHECK_MSG(bad == 0, "%d threads, after pauses: %d regions lost or repeated a task", threads, bad);
    nb_cpu__pool_put(q);
    CHECK(run_once(p, 64, false)); /* still alive while one reference is held */
    nb_cpu__pool_put(p);
  }
  test_stalled_worker();
  test_backoff();
  return nb_test_summary("backend/test_pool");
}
