/* Crash injection: a forked child saves step after step (sync or async,
 * with retention) and is SIGKILLed at a random point — either by the parent
 * after a random delay, or by itself right before a randomly chosen I/O
 * operation. After every kill the directory must open, list only complete
 * steps, never lose the newest step committed before, leave no leftovers,
 * and restore every step bit-identically with checksums verified. */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "ckpt/internal.h"
#include "ckpt_test_util.h"

/* The state saved at a step: a function of the step only. */
static nb_tree *state_at(nb_ctx *ctx, int64_t step) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t dw[2] = {64, 300}, db[1] = {7}, dblob[1] = {13};
  nb_array *w = pattern_array(ctx, NB_F32, 2, dw, (uint64_t)step * 3);
  nb_array *b = pattern_array(ctx, NB_BF16, 1, db, (uint64_t)step * 3 + 1);
  nb_array *blob = pattern_array(ctx, NB_U8, 1, dblob, (uint64_t)step * 3 + 2);
  nb_tree_set_array(t, "params/w", w);
  nb_tree_set_array(t, "params/b", b);
  nb_tree_set_array(t, "data/iterator", blob);
  nb_array_release(w);
  nb_array_release(b);
  nb_array_release(blob);
  return t;
}

static nb_status save_state(nb_ckpt_manager *m, nb_ctx *ctx, int64_t step) {
  nb_tree *t = state_at(ctx, step);
  nb_tree *p = nb_tree_select_prefix(t, "params", true), *d = nb_tree_select_prefix(t, "data", true);
  nb_ckpt_item items[] = {{"params", p}, {"data_state", d}};
  char meta[64];
  snprintf(meta, sizeof meta, "{\"step\": %lld}", (long long)step);
  nb_ckpt_save_opts so = {.metadata_json = meta};
  nb_status s = nb_ckpt_save(m, step, items, 2, &so, NULL);
  nb_tree_destroy(t);
  nb_tree_destroy(p);
  nb_tree_destroy(d);
  return s;
}

static bool restores_exactly(nb_ckpt_manager *m, nb_ctx *ctx, int64_t step) {
  nb_tree *r = nb_ckpt_restore(m, step, NULL), *t = state_at(ctx, step);
  bool ok = r && nb_tree_size(r) == 3;
  ok = ok && nb_array_equal(nb_tree_get_array(r, "params/w"), nb_tree_get_array(t, "params/w"));
  ok = ok && nb_array_equal(nb_tree_get_array(r, "params/b"), nb_tree_get_array(t, "params/b"));
  ok = ok && nb_array_equal(nb_tree_get_array(r, "data_state/iterator"), nb_tree_get_array(t, "data/iterator"));
  nb_ckpt_info *info = ok ? nb_ckpt_info_load(m, step) : NULL;
  char want[64];
  snprintf(want, sizeof want, "{\"step\":%lld}", (long long)step);
  ok = ok && info && nb_ckpt_info_metadata(info) && !strcmp(nb_ckpt_info_metadata(info), want);
  nb_ckpt_info_destroy(info);
  if (!ok) fprintf(stderr, "step %lld: %s\n", (long long)step, nb_ctx_error(ctx));
  nb_tree_destroy(r);
  nb_tree_destroy(t);
  return ok;
}

/* The child: saves steps from `first` on until it is killed. */
static void child(const char *dir, int64_t first, bool async, int64_t kill_at_op) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ckpt_options o = {.directory = dir, .max_to_keep = 3, .keep_period = 10, .async = async};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  if (!m) _exit(2);
  if (kill_at_op > 0) nb_ckpt__io_fault(kill_at_op, true);
  for (int64_t step = first; step < first + 100000; step++)
    if (save_state(m, ctx, step) != NB_OK) _exit(3);
  _exit(4);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "crash");
  nb_test_rng rng = {12345};
  int64_t committed = -1; /* the newest step known committed */
  int kills = 0, self_kills = 0;
  double t0 = now_s(), budget = getenv("NABLA_SANITIZED") ? 12.0 : 8.0;
  for (int round = 0; round < 400 && now_s() - t0 < budget; round++) {
    bool async = round % 2 == 1, self = round % 3 != 0;
    int64_t kill_at = self ? nb_test_int(&rng, 1, 120) : 0;
    pid_t pid = fork();
    if (pid == 0) child(dir, committed + 1, async, kill_at);
    if (!self) usleep((useconds_t)nb_test_int(&rng, 0, 20000));
    if (!self) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "round %d: child status %d", round, status);
    kills++;
    self_kills += self;

    nb_ckpt_options o = {.directory = dir, .max_to_keep = 3, .keep_period = 10};
    nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
    CHECK_MSG(m != NULL, "round %d: %s", round, nb_ctx_error(ctx));
    if (!m) break;
    int64_t steps[256], latest = -1;
    size_t n = 0;
    CHECK_OK(ctx, nb_ckpt_all_steps(m, steps, 256, &n));
    CHECK_OK(ctx, nb_ckpt_latest_step(m, &latest));
    CHECK_MSG(latest >= committed, "round %d: latest %lld went back from %lld", round, (long long)latest,
              (long long)committed);
    for (size_t i = 0; i < n && i < 256; i++) CHECK_MSG(restores_exactly(m, ctx, steps[i]), "round %d", round);
    committed = latest;
    nb_ckpt_manager_destroy(m);
    char cmd[4200]; /* clean-up left only committed steps and the lock */
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s' | grep -v '^step_' | grep -v '^.lock$')\"", dir);
    CHECK_MSG(system(cmd) == 0, "round %d: leftovers", round);
  }
  printf("%d kills (%d at an I/O operation), newest step %lld\n", kills, self_kills, (long long)committed);
  CHECK(kills >= 20 && committed > 10);
  nb_test_rm_rf(dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_crash");
}
