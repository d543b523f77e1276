/* The runtime's thread pool: every task of every region runs exactly once
 * and the region returns only after all of them, across the pool's two
 * waiting modes (a worker still spinning from the previous region, and one
 * asleep after a pause longer than the spin), with regions of 2 to 64 tasks
 * (some slower than the caller's spin, so returning early shows), from
 * several thread counts, and two pools of one size shared by reference. */
#include <stdatomic.h>
#include <time.h>

#include "compile/jit.h"
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
  nb_rt__pool_run(p, ntasks, task, &r);
  for (int i = 0; i < 64; i++)
    if (atomic_load(&r.hits[i]) != (i < ntasks)) return false;
  return true;
}

static void pause_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

int main(void) {
  for (int threads = 1; threads <= 4; threads++) {
    nb_pool *p = nb_rt__pool_get(threads), *q = nb_rt__pool_get(threads);
    CHECK_MSG(p && p == q, "%d threads: one shared pool", threads);
    CHECK(nb_rt__pool_threads(p) == threads);
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
    nb_rt__pool_put(q);
    CHECK(run_once(p, 64, false)); /* still alive while one reference is held */
    nb_rt__pool_put(p);
  }
  return nb_test_summary("runtime/test_pool");
}
