/* Traces (nb_prof_start/stop, scopes, thread names): nested scopes on two
 * threads come out as nested spans on two named tracks whose durations add
 * up, the summary agrees with the spans, nothing is recorded while tracing
 * is off, the event cap drops and counts, and misuse is refused by name. */
#include <pthread.h>
#include <time.h>

#include "testfs.h"
#include "tracecheck.h"
#include "util/trace.h"

static void sleep_ms(int ms) { nanosleep(&(struct timespec){.tv_nsec = (long)ms * 1000000}, NULL); }

static void *second_thread(void *arg) {
  (void)arg;
  nb_prof_thread_name("worker-1");
  nb_prof_scope_begin("w-outer");
  nb_prof_scope_begin("w-inner");
  sleep_ms(3);
  nb_prof_scope_end();
  sleep_ms(1);
  nb_prof_scope_end();
  return NULL;
}

static void count_events(void *ud, int tid, const char *name, const nb_util__trace_event *ev, size_t n) {
  (void)tid, (void)name, (void)ev;
  *(size_t *)ud += n;
}

/* a recorded span inside [outer.ts, outer.ts + outer.dur] on the same thread */
static bool inside(const nb_test_span *in, const nb_test_span *out) {
  return in && out && in->tid == out->tid && in->ts >= out->ts && in->ts + in->dur <= out->ts + out->dur;
}

static void nested_on_two_threads(nb_ctx *ctx, const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/sub/trace.json", dir);
  /* off: none of these may appear */
  nb_prof_scope_begin("off-scope");
  nb_prof_scope_end();
  nb_util__trace_span("test", "off-span", nb_util__trace_start(), nb_util__now_ns(), NULL, 0);
  CHECK(!nb_prof_tracing());

  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path}));
  CHECK(nb_prof_tracing());
  nb_prof_thread_name("main-thread");
  pthread_t th;
  CHECK(pthread_create(&th, NULL, second_thread, NULL) == 0);
  nb_prof_scope_begin("outer");
  nb_prof_scope_begin("inner-a");
  sleep_ms(2);
  nb_prof_scope_end();
  nb_prof_scope_begin("inner-b");
  nb_prof_scope_begin("innermost");
  sleep_ms(1);
  nb_prof_scope_end();
  nb_prof_scope_end();
  nb_prof_scope_end();
  nb_util__trace_arg args[] = {{"flops", NULL, 1e6}, {"ops", "add+mul", 0}};
  int64_t t0 = nb_util__trace_start();
  CHECK(t0 != 0);
  nb_util__trace_span("kernel", "k1 add+mul", t0, t0 + 1500, args, 2);
  /* the next span must not start inside that one's made-up 1.5 us (spans of a thread nest) */
  while (nb_util__now_ns() < t0 + 1500) {
  }
  nb_prof_scope_begin("tab\there\n"); /* Perfetto's reader takes no \u escapes: control characters become spaces */
  nb_prof_scope_end();
  pthread_join(th, NULL);
  CHECK_OK(ctx, nb_prof_stop(ctx));
  CHECK(!nb_prof_tracing());
  /* off again: the recorder holds nothing (stop cleared it) and takes nothing */
  nb_prof_scope_begin("after-stop");
  nb_prof_scope_end();
  int64_t now = nb_util__now_ns();
  nb_util__trace_span("test", "after-stop", now, now + 10, NULL, 0);
  size_t held = 0;
  CHECK(nb_util__trace_collect(count_events, &held) == 0);
  CHECK_MSG(held == 0, "%zu events recorded while off", held);

  nb_test_trace t;
  CHECK(nb_test_trace_load(path, &t) == 0);
  CHECK_MSG(t.n == 8, "%zu spans", t.n);
  CHECK(nb_test_trace_count(&t, "tab here ", "user", NULL) == 1);
  const nb_test_span *outer = nb_test_trace_find(&t, "outer"), *a = nb_test_trace_find(&t, "inner-a");
  const nb_test_span *b = nb_test_trace_find(&t, "inner-b"), *most = nb_test_trace_find(&t, "innermost");
  const nb_test_span *wo = nb_test_trace_find(&t, "w-outer"), *wi = nb_test_trace_find(&t, "w-inner");
  const nb_test_span *k = nb_test_trace_find(&t, "k1 add+mul");
  CHECK(outer && a && b && most && wo && wi && k);
  if (outer && a && b && most && wo && wi && k) {
    CHECK(inside(a, outer) && inside(b, outer) && inside(most, b) && inside(wi, wo));
    CHECK(a->ts + a->dur <= b->ts);
    CHECK_MSG(a->dur + b->dur <= outer->dur, "%lld + %lld > %lld", (long long)a->dur, (long long)b->dur, (long long)outer->dur);
    CHECK_MSG(a->dur >= 2000000 && most->dur >= 1000000 && wi->dur >= 3000000 && wo->dur >= wi->dur + 1000000,
              "durations %lld %lld %lld %lld", (long long)a->dur, (long long)most->dur, (long long)wi->dur, (long long)wo->dur);
    CHECK(wo->tid != outer->tid);
    CHECK(!strcmp(outer->cat, "user") && !strcmp(k->cat, "kernel"));
    CHECK_MSG(k->dur == 1500 && strstr(k->args, "\"flops\":1000000") && strstr(k->args, "\"ops\":\"add+mul\""), "%lld %s",
              (long long)k->dur, k->args);
    const char *n1 = nb_test_trace_thread(&t, outer->tid), *n2 = nb_test_trace_thread(&t, wo->tid);
    CHECK_MSG(n1 && !strcmp(n1, "main-thread") && n2 && !strcmp(n2, "worker-1"), "%s %s", n1 ? n1 : "-", n2 ? n2 : "-");
  }
  CHECK(nb_test_trace_count(&t, "off-scope", NULL, NULL) == 0 && nb_test_trace_count(&t, "off-span", NULL, NULL) == 0);
  CHECK(nb_test_trace_count(&t, "after-stop", NULL, NULL) == 0);
  CHECK(t.dropped == 0);
  nb_test_trace_free(&t);

  /* the op table: only compiled steps, with the rate their cost implies (1e6 flops in 1.5 us) */
  char *table = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&table, &len);
  CHECK_OK(ctx, nb_prof_trace_table(ctx, path, f, 10, 1e12));
  fclose(f);
  CHECK_MSG(strstr(table, "kernel 100.0%") && strstr(table, "666.67") && strstr(table, "66.7%") && strstr(table, "k1 add+mul") &&
                !strstr(table, "outer"),
            "%s", table);
  free(table);
  CHECK(nb_prof_trace_table(ctx, dir, stdout, 10, 0) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_IO, "ops.json");
}

/* a scope left open when a trace stops does not close one of the next */
static void sessions_and_cap(nb_ctx *ctx, const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/cap.json", dir);
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path, .max_events = 3}));
  nb_prof_scope_begin("left-open");
  CHECK_OK(ctx, nb_prof_stop(ctx));
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path, .max_events = 3}));
  nb_prof_scope_end(); /* closes left-open of the earlier trace: ignored */
  for (int i = 0; i < 5; i++) {
    nb_prof_scope_begin("capped");
    nb_prof_scope_end();
  }
  for (int i = 0; i < 40; i++) nb_prof_scope_begin("deep"); /* deeper than the stack: still pairs up */
  for (int i = 0; i < 40; i++) nb_prof_scope_end();
  CHECK_OK(ctx, nb_prof_stop(ctx));
  nb_test_trace t;
  CHECK(nb_test_trace_load(path, &t) == 0);
  CHECK_MSG(nb_test_trace_count(&t, "capped", NULL, NULL) == 3 && t.n == 3, "%zu spans", t.n);
  CHECK_MSG(t.dropped == 2 + 32, "dropped %lld", t.dropped);
  CHECK(nb_test_trace_count(&t, "left-open", NULL, NULL) == 0);
  nb_test_trace_free(&t);
}

static void misuse(nb_ctx *ctx, const char *dir) {
  char path[4200], file[4200];
  CHECK(nb_prof_stop(ctx) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "no trace is being recorded");
  CHECK(nb_prof_start(ctx, NULL) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "opts.path");
  CHECK(nb_prof_start(ctx, &(nb_prof_trace_opts){.path = ""}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "opts.path");
  snprintf(file, sizeof file, "%s/a-file", dir);
  nb_test_write_text(file, "x");
  snprintf(path, sizeof path, "%s/a-file/trace.json", dir);
  CHECK(nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_IO, "a-file");
  CHECK(!nb_prof_tracing());
  snprintf(path, sizeof path, "%s/twice.json", dir);
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path}));
  CHECK(nb_prof_start(ctx, &(nb_prof_trace_opts){.path = file}) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "already being recorded into");
  CHECK_OK(ctx, nb_prof_stop(ctx));
  nb_test_trace t;
  CHECK(nb_test_trace_load(path, &t) == 0 && t.n == 0);
  nb_test_trace_free(&t);
}

int main(void) {
  char dir[4096];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "trace");
  nb_ctx *ctx = nb_ctx_create();
  nested_on_two_threads(ctx, dir);
  sessions_and_cap(ctx, dir);
  misuse(ctx, dir);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(dir);
  return nb_test_summary("prof/test_trace");
}
