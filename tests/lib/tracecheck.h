/* Reading back a trace nb_prof_stop wrote (Chrome trace-event JSON, and
 * its summary beside it) and checking that it is consistent on its own:
 * what every test that makes a trace shares. */
#ifndef NABLA_TEST_TRACECHECK_H
#define NABLA_TEST_TRACECHECK_H

#include <stddef.h>
#include <stdint.h>

typedef struct nb_test_span {
  int tid;
  int64_t ts, dur; /* ns, from the file's microseconds with 3 decimals */
  char name[64], cat[16];
  char args[256];  /* the args object as JSON text ("" when none) */
} nb_test_span;

/* A counter's sample ("C" event): each numeric argument one series. */
typedef struct nb_test_counter {
  int64_t ts;      /* ns */
  char name[64];
  char args[256];  /* the args object as JSON text */
} nb_test_counter;

typedef struct nb_test_trace {
  nb_test_span *spans;
  size_t n;
  nb_test_counter *counters; /* in file order */
  size_t ncounters;
  int tids[64];
  char thread_names[64][32];
  int ntids;
  long long dropped; /* otherData.dropped_events */
} nb_test_trace;

/* Loads trace_path, counting a CHECK failure (with why) for anything
 * malformed: not JSON, a displayTimeUnit (ts and dur are microseconds), an event without ph/pid/tid/ts/dur/name/cat, a
 * negative duration, spans of one thread that overlap without nesting, a
 * thread with spans but no thread_name, a counter sample ("C") with a
 * duration or a non-numeric series, a summary (the path with .json
 * replaced by .summary.json) whose per-name counts and total ns differ from
 * the spans', or whose counters' sample counts differ from the samples'. Returns 0 when it could load the file (even with failures). */
int nb_test_trace_load(const char *trace_path, nb_test_trace *t);
void nb_test_trace_free(nb_test_trace *t);

/* Spans named name (cat NULL: any category); *total_ns gets their durations summed. */
size_t nb_test_trace_count(const nb_test_trace *t, const char *name, const char *cat, int64_t *total_ns);
/* Counter samples named name. */
size_t nb_test_trace_samples(const nb_test_trace *t, const char *name);
/* The first span named name, or NULL. */
const nb_test_span *nb_test_trace_find(const nb_test_trace *t, const char *name);
/* The thread name of tid, or NULL. */
const char *nb_test_trace_thread(const nb_test_trace *t, int tid);

#endif
