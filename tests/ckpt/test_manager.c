/* The checkpoint manager: retention policies (recent, periodic, best by
 * metric), save intervals, reopening and clean-up of leftovers, the
 * directory lock, read-only managers, async saves overlapping with work,
 * background errors surfacing on the next call, I/O failures at every
 * operation of a save, and preemption (flag, emergency save, SIGTERM to a
 * forked trainer). */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "ckpt/internal.h"
#include "ckpt_test_util.h"

static nb_tree *small_tree(nb_ctx *ctx, int64_t step) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t dims[1] = {100};
  nb_array *a = pattern_array(ctx, NB_F32, 1, dims, (uint64_t)step);
  nb_tree_set_array(t, "w", a);
  nb_array_release(a);
  return t;
}

static nb_status save_step(nb_ckpt_manager *m, nb_ctx *ctx, int64_t step, const nb_ckpt_save_opts *so, bool *saved) {
  nb_tree *t = small_tree(ctx, step);
  nb_ckpt_item it = {"params", t};
  nb_status s = nb_ckpt_save(m, step, &it, 1, so, saved);
  nb_tree_destroy(t);
  return s;
}

/* "0,2,4" -> compares with the manager's steps */
static bool steps_are(nb_ckpt_manager *m, const char *want) {
  int64_t steps[64];
  size_t n = 0;
  if (nb_ckpt_all_steps(m, steps, 64, &n) != NB_OK) return false;
  char got[512] = "";
  for (size_t i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)steps[i]);
  if (strcmp(got, want) != 0) fprintf(stderr, "steps: got %s, want %s\n", got, want);
  return strcmp(got, want) == 0;
}

static void test_retention(nb_ctx *ctx) {
  char dir[4096];
  struct {
    nb_ckpt_options o;
    const char *want;
  } cases[] = {
      {{.max_to_keep = 2}, "8,9"},
      {{.max_to_keep = 0}, "0,1,2,3,4,5,6,7,8,9"},
      {{.max_to_keep = 1, .keep_period = 4}, "0,4,8,9"},
      /* metric = (step - 4)^2: smallest at 4, then 3 and 5 */
      {{.max_to_keep = 1, .keep_best = 3}, "3,4,5,9"},
      {{.max_to_keep = 2, .keep_best = 2, .best_mode_max = true}, "0,8,9"},
      {{.max_to_keep = 3, .async = true}, "7,8,9"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    nb_test_scratch_dir(dir, sizeof dir, "ckpt", "keep");
    cases[c].o.directory = dir;
    nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &cases[c].o);
    for (int64_t s = 0; s < 10; s++) {
      nb_ckpt_save_opts so = {.has_metric = true, .metric = (double)((s - 4) * (s - 4)) + (s == 0 ? 0.5 : 0)};
      CHECK_OK(ctx, save_step(m, ctx, s, &so, NULL));
    }
    CHECK_OK(ctx, nb_ckpt_wait_until_finished(m));
    CHECK_MSG(steps_are(m, cases[c].want), "case %zu", c);
    nb_ckpt_manager_destroy(m);
    /* the same set survives a reopen (metrics read back from manifests) */
    m = nb_ckpt_manager_create(ctx, &cases[c].o);
    CHECK_MSG(m && steps_are(m, cases[c].want), "case %zu after reopen", c);
    nb_ckpt_manager_destroy(m);
    nb_test_rm_rf(dir);
  }
}

static void test_interval_and_reopen(nb_ctx *ctx) {
  char dir[4096], path[4300];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "interval");
  nb_ckpt_options o = {.directory = dir, .save_interval_steps = 5};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  CHECK(nb_ckpt_should_save(m, 10) && !nb_ckpt_should_save(m, 11));
  for (int64_t s = 0; s < 12; s++) {
    bool saved = true;
    CHECK_OK(ctx, save_step(m, ctx, s, NULL, &saved));
    CHECK(saved == (s % 5 == 0));
  }
  nb_ckpt_save_opts force = {.force = true};
  CHECK_OK(ctx, save_step(m, ctx, 13, &force, NULL));
  CHECK(steps_are(m, "0,5,10,13"));
  /* a second manager on the same directory is refused */
  CHECK(nb_ckpt_manager_create(ctx, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_IO, "in use by another manager");
  /* read-only managers see new steps */
  nb_ckpt_options ro = {.directory = dir, .read_only = true};
  nb_ckpt_manager *r = nb_ckpt_manager_create(ctx, &ro);
  CHECK(r && steps_are(r, "0,5,10,13"));
  CHECK_OK(ctx, save_step(m, ctx, 15, NULL, NULL));
  CHECK(steps_are(r, "0,5,10,13,15"));
  CHECK(save_step(r, ctx, 20, NULL, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "read-only");
  nb_ckpt_manager_destroy(r);
  nb_ckpt_manager_destroy(m);

  /* leftovers: a temporary dir, a deleted dir, a step never committed; an
   * unrelated folder is left alone and a step with a damaged marker is set
   * aside as step_N.damaged (so that step can be saved again) */
  const char *junk[] = {".tmp-step_00000020-1-0", ".del-step_00000005-1", "step_00000021", "notes", "step_00000022"};
  for (int i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, junk[i]);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/x", dir, junk[i]);
    nb_test_write_file(path, "x", 1);
  }
  snprintf(path, sizeof path, "%s/step_00000022/COMMIT", dir);
  nb_test_write_file(path, "{garbage", 8);
  m = nb_ckpt_manager_create(ctx, &o);
  CHECK(m && steps_are(m, "0,5,10,13,15"));
  for (int i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, junk[i]);
    CHECK_MSG(nb_ckpt__exists(path) == (i == 3), "%s", junk[i]);
  }
  snprintf(path, sizeof path, "%s/step_00000022.damaged/COMMIT", dir);
  CHECK(nb_ckpt__exists(path));
  CHECK_OK(ctx, save_step(m, ctx, 22, &(nb_ckpt_save_opts){.force = true}, NULL)); /* not "already exists" */
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(m));
  CHECK(steps_are(m, "0,5,10,13,15,22"));
  /* a committed step found damaged later is set aside the same way */
  char aside[1024];
  CHECK_OK(ctx, nb_ckpt_set_aside(m, 22, aside, sizeof aside));
  CHECK_MSG(strstr(aside, "step_00000022.damaged.2"), "%s", aside);
  CHECK(steps_are(m, "0,5,10,13,15"));
  CHECK(nb_ckpt_set_aside(m, 22, NULL, 0) == NB_ERR_NOT_FOUND);
  nb_tree *t = nb_ckpt_restore(m, NB_CKPT_LATEST, NULL);
  nb_tree *want = small_tree(ctx, 15);
  CHECK(t && item_equal(t, "params", want));
  nb_tree_destroy(t);
  nb_tree_destroy(want);
  nb_ckpt_manager_destroy(m);
  nb_test_rm_rf(dir);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Async: the caller drops its trees right after save and keeps working
 * (new arrays under the same paths); every step restores to what was saved. */
static void test_async_overlap(nb_ctx *ctx) {
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "async");
  nb_ckpt_options o = {.directory = dir, .async = true, .max_to_keep = 10};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  int64_t dims[2] = {512, 1024}; /* 2 MB per array */
  nb_tree *state = nb_tree_create(ctx);
  for (int64_t step = 0; step < 6; step++) {
    for (int k = 0; k < 4; k++) {
      char p[16];
      snprintf(p, sizeof p, "w%d", k);
      nb_array *a = pattern_array(ctx, NB_F32, 2, dims, (uint64_t)(step * 10 + k));
      nb_tree_set_array(state, p, a); /* replaces the previous step's array */
      nb_array_release(a);
    }
    nb_ckpt_item it = {"params", state};
    CHECK_OK(ctx, nb_ckpt_save(m, step, &it, 1, NULL, NULL));
    if (step == 5) { /* the same step again while it is (probably) in flight */
      CHECK(nb_ckpt_save(m, step, &it, 1, NULL, NULL) == NB_ERR_INVALID_ARG);
      CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "step 5 is already saved");
    }
    volatile double acc = 0; /* "training" while the save is written */
    for (int i = 0; i < 200000; i++) acc = acc + i * 1e-9;
    CHECK(acc > 0);
  }
  nb_tree_destroy(state);
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(m));
  CHECK(steps_are(m, "0,1,2,3,4,5"));
  for (int64_t step = 0; step < 6; step++) {
    nb_tree *r = nb_ckpt_restore(m, step, NULL);
    bool ok = r && nb_tree_size(r) == 4;
    for (int k = 0; ok && k < 4; k++) {
      char p[32];
      snprintf(p, sizeof p, "params/w%d", k);
      nb_array *want = pattern_array(ctx, NB_F32, 2, dims, (uint64_t)(step * 10 + k));
      ok = nb_array_equal(nb_tree_get_array(r, p), want);
      nb_array_release(want);
    }
    CHECK_MSG(ok, "step %lld", (long long)step);
    nb_tree_destroy(r);
  }
  nb_ckpt_manager_destroy(m);
  nb_test_rm_rf(dir);
}

/* A background write failure surfaces on the next call, once, and leaves
 * nothing behind. */
static void test_async_errors(nb_ctx *ctx) {
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "asyncerr");
  nb_ckpt_options o = {.directory = dir, .async = true};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  CHECK_OK(ctx, save_step(m, ctx, 1, NULL, NULL));
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(m));
  nb_ckpt__io_fault(3, false);
  CHECK_OK(ctx, save_step(m, ctx, 2, NULL, NULL)); /* queued: fails in the background */
  nb_status s = NB_OK;
  int64_t latest = 0;
  double t0 = now_s();
  while (s == NB_OK && now_s() - t0 < 10) s = nb_ckpt_latest_step(m, &latest);
  CHECK(s == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "background checkpoint save failed");
  CHECK_OK(ctx, nb_ckpt_latest_step(m, &latest)); /* reported once */
  CHECK(latest == 1);
  /* a failing save is reported by the next save, which does not start */
  nb_ckpt__io_fault(1, false);
  CHECK_OK(ctx, save_step(m, ctx, 3, NULL, NULL));
  CHECK(save_step(m, ctx, 4, NULL, NULL) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "background checkpoint save failed");
  CHECK_OK(ctx, save_step(m, ctx, 4, NULL, NULL));
  CHECK_OK(ctx, nb_ckpt_wait_until_finished(m));
  nb_ckpt__io_fault(2, false);
  CHECK_OK(ctx, save_step(m, ctx, 5, NULL, NULL));
  CHECK(nb_ckpt_wait_until_finished(m) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "cannot");
  CHECK(steps_are(m, "1,4"));
  nb_ckpt_manager_destroy(m);
  nb_ckpt__io_fault(0, false);
  nb_test_rm_rf(dir);
}

/* Sync saves failing at each I/O operation in turn: a clear error, the old
 * steps intact, no leftovers; the save succeeds once n passes its ops. */
static void test_io_failure_sweep(nb_ctx *ctx) {
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "iofail");
  nb_ckpt_options o = {.directory = dir, .max_to_keep = 2};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  CHECK_OK(ctx, save_step(m, ctx, 0, NULL, NULL));
  CHECK_OK(ctx, save_step(m, ctx, 1, NULL, NULL));
  int failures = 0;
  for (int64_t n = 1; n < 500; n++) {
    int64_t latest = -1;
    CHECK_OK(ctx, nb_ckpt_latest_step(m, &latest));
    int64_t before = nb_ckpt__io_count();
    nb_ckpt__io_fault(n, false);
    nb_status s = save_step(m, ctx, latest + 1, NULL, NULL);
    bool fired = n <= nb_ckpt__io_count() - before;
    nb_ckpt__io_fault(0, false);
    if (!fired) { /* n is past the last operation of a save */
      CHECK_OK(ctx, s);
      break;
    }
    failures++;
    CHECK_MSG(s == NB_ERR_IO, "n=%lld: %s", (long long)n, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    /* a fresh manager cleans leftovers; every listed step restores
     * bit-identically and the latest never goes back */
    nb_ckpt_manager_destroy(m);
    m = nb_ckpt_manager_create(ctx, &o);
    int64_t steps[8], now = -1;
    size_t k = 0;
    CHECK_OK(ctx, nb_ckpt_all_steps(m, steps, 8, &k));
    CHECK_OK(ctx, nb_ckpt_latest_step(m, &now));
    CHECK(now >= latest && k >= 2 && k <= 3);
    for (size_t i = 0; i < k && i < 8; i++) {
      nb_tree *r = nb_ckpt_restore(m, steps[i], NULL), *want = small_tree(ctx, steps[i]);
      CHECK_MSG(r && item_equal(r, "params", want), "n=%lld step %lld: %s", (long long)n, (long long)steps[i],
                nb_ctx_error(ctx));
      nb_tree_destroy(r);
      nb_tree_destroy(want);
    }
  }
  CHECK_MSG(failures >= 10, "only %d injected failures", failures);
  nb_ckpt_manager_destroy(m);
  /* nothing but committed steps and the lock remain */
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s' | grep -v '^step_' | grep -v '^.lock$')\"", dir);
  CHECK(system(cmd) == 0);
  nb_test_rm_rf(dir);
}

static void test_preemption(nb_ctx *ctx) {
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "preempt");
  CHECK_OK(ctx, nb_ckpt_preemption_install(ctx));
  CHECK(!nb_ckpt_preemption_requested());
  raise(SIGTERM);
  CHECK(nb_ckpt_preemption_requested());
  nb_ckpt_preemption_clear();
  raise(SIGINT);
  CHECK(nb_ckpt_preemption_requested());
  nb_ckpt_preemption_clear();
  nb_ckpt_preemption_uninstall();

  /* a forked trainer: saves every 1000 steps asynchronously; on SIGTERM it
   * saves the current step at once and exits 0 */
  int ready[2];
  CHECK(pipe(ready) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    nb_ctx *c = nb_ctx_create();
    nb_ckpt_options o = {.directory = dir, .async = true, .save_interval_steps = 1000};
    nb_ckpt_manager *m = nb_ckpt_manager_create(c, &o);
    if (!m || nb_ckpt_preemption_install(c) != NB_OK) _exit(3);
    for (int64_t step = 1;; step++) {
      if (step == 5 && write(ready[1], "r", 1) != 1) _exit(4);
      if (nb_ckpt_preemption_requested()) {
        nb_tree *t = small_tree(c, step);
        nb_ckpt_item it = {"params", t};
        nb_status s = nb_ckpt_emergency_save(m, step, &it, 1, NULL);
        nb_tree_destroy(t);
        nb_ckpt_manager_destroy(m);
        _exit(s == NB_OK ? 0 : 5);
      }
      if (nb_ckpt_should_save(m, step) && save_step(m, c, step, NULL, NULL) != NB_OK) _exit(6);
      usleep(100);
    }
  }
  char b;
  CHECK(read(ready[0], &b, 1) == 1);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "trainer status %d", status);
  close(ready[0]);
  close(ready[1]);
  nb_ckpt_options o = {.directory = dir, .max_to_keep = 5};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  int64_t latest = -1;
  CHECK_OK(ctx, nb_ckpt_latest_step(m, &latest));
  CHECK(latest >= 5);
  nb_tree *r = nb_ckpt_restore(m, latest, NULL), *want = small_tree(ctx, latest);
  CHECK(r && item_equal(r, "params", want));
  nb_tree_destroy(r);
  nb_tree_destroy(want);
  /* an emergency save of a step already saved is a no-op */
  nb_tree *t = small_tree(ctx, 0);
  nb_ckpt_item it = {"params", t};
  CHECK_OK(ctx, nb_ckpt_emergency_save(m, latest, &it, 1, NULL));
  nb_tree_destroy(t);
  nb_ckpt_manager_destroy(m);
  nb_test_rm_rf(dir);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_retention(ctx);
  test_interval_and_reopen(ctx);
  test_async_overlap(ctx);
  test_async_errors(ctx);
  test_io_failure_sweep(ctx);
  test_preemption(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_manager");
}
