/* The trace recorder: timed spans ("complete events") that any library can
 * record, kept in per-thread buffers until the profiler (src/prof/trace.c,
 * nb_prof_start/stop) collects them. It lives here, below the core, so that
 * the runtime, data and ckpt libraries record without depending on prof.
 *
 * Off is the common case and costs one relaxed load and a branch: callers
 * test nb_util__tracing() (or take a start time with nb_util__trace_start,
 * which is 0 when off) before building anything. On, a span is two clock
 * reads and a copy into the thread's buffer under its own (uncontended)
 * mutex. Names and string arguments are copied (they may die before the
 * trace is written); categories and argument keys must be static strings.
 * Internal: not in include/nabla. */
#ifndef NABLA_UTIL_TRACE_H
#define NABLA_UTIL_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

extern atomic_int nb_util__trace_flag;

static inline bool nb_util__tracing(void) { return atomic_load_explicit(&nb_util__trace_flag, memory_order_relaxed) != 0; }

/* The clock (CLOCK_MONOTONIC ns) when tracing, else 0: the start of a span
 * that nb_util__trace_span records only when it is not 0. */
static inline int64_t nb_util__trace_start(void) { return nb_util__tracing() ? nb_util__now_ns() : 0; }

#define NB_UTIL_TRACE_NAME 64 /* bytes kept of a name, NUL included */
#define NB_UTIL_TRACE_STR 80  /* ... of a string argument */
#define NB_UTIL_TRACE_ARGS 4

/* One argument of a span: key (static), and str (copied) or, when str is
 * NULL, the number num. */
typedef struct nb_util__trace_arg {
  const char *key;
  const char *str;
  double num;
} nb_util__trace_arg;

/* Records the span [t0, t1) named name in category cat (static) on this
 * thread's track, with nargs (<= NB_UTIL_TRACE_ARGS) arguments. Nothing
 * when t0 is 0 or tracing is off. */
void nb_util__trace_span(const char *cat, const char *name, int64_t t0, int64_t t1, const nb_util__trace_arg *args,
                         int nargs);
/* The same with a reference: a number (not 0) that names what the span ran
 * in a note of this session (nb_util__trace_note), so the profiler can join
 * the two: the runtime's steps are (executable << 24 | step). */
void nb_util__trace_span_ref(const char *cat, const char *name, int64_t t0, int64_t t1, const nb_util__trace_arg *args,
                             int nargs, int64_t ref);

/* Notes: text (JSON, by convention) that describes what spans refer to,
 * kept once per session and key (the runtime's: an executable's steps,
 * their source ops and parameter paths, written at its first run in a
 * session). nb_util__trace_session is the session's number (it changes at
 * every enable), so that a writer notes once per session. */
uint64_t nb_util__trace_session(void);
void nb_util__trace_note(int64_t key, const char *text);

/* Records a counter sample (a Chrome trace "C" event) named name in
 * category cat (static) at time t (the clock, nb_util__now_ns): each
 * numeric argument is one series of the counter (keys static). Nothing
 * when t is 0 or tracing is off. Samples with one t form one snapshot. */
void nb_util__trace_counter(const char *cat, const char *name, int64_t t, const nb_util__trace_arg *args, int nargs);

/* Scoped spans: begin pushes (name, now) on this thread's stack, end pops
 * the innermost and records it. Ends without a begin of this session (a
 * scope opened before tracing started) are ignored; scopes nest up to 32
 * deep (deeper ones are not recorded, but still pair up). */
void nb_util__trace_begin(const char *cat, const char *name);
void nb_util__trace_end(void);

/* Names this thread's track (and the thread, for debuggers: the first 15
 * bytes), whether or not tracing is on. */
void nb_util__trace_thread_name(const char *name);

/* Executables that ran while tracing: the runtime calls nb_util__trace_run
 * after each run of one (exe: the nb_exe, alive during the call; key: its
 * content hash; ns: the run's time), and the profiler, which sets the hook
 * at nb_prof_start, copies what its memory and graph viewers show of it.
 * Nothing when tracing is off or no hook is set. */
typedef void (*nb_util__trace_run_hook)(const void *exe, uint64_t key, int64_t ns);
void nb_util__trace_set_run_hook(nb_util__trace_run_hook fn);
void nb_util__trace_run(const void *exe, uint64_t key, int64_t ns);

/* ---- the session (src/prof/trace.c) ---------------------------------------- */

typedef struct nb_util__trace_event {
  int64_t t0, dur; /* ns */
  int64_t ref;     /* 0, or nb_util__trace_span_ref's */
  bool counter;    /* a counter sample at t0 (dur 0), not a span */
  const char *cat;
  int nargs;
  char name[NB_UTIL_TRACE_NAME];
  struct {
    const char *key;
    double num;
    bool is_str;
    char str[NB_UTIL_TRACE_STR];
  } args[NB_UTIL_TRACE_ARGS];
} nb_util__trace_event;

/* Drops every recorded event and turns tracing on, keeping at most
 * max_events (<= 0: 1 << 20) until the next start; later ones are dropped
 * and counted. Returns the clock at the start. */
int64_t nb_util__trace_enable(int64_t max_events);
/* Turns tracing off; the events stay until the next enable or clear. */
void nb_util__trace_disable(void);
/* Calls fn once per thread that recorded events since the last enable,
 * with that thread's events in the order they ended. Returns
 * the number of events dropped for want of room. Call after disable. */
int64_t nb_util__trace_collect(void (*fn)(void *ud, int tid, const char *thread_name, const nb_util__trace_event *ev,
                                          size_t n),
                               void *ud);
/* Calls fn once per note of the session, in the order they were made.
 * Call after disable. */
void nb_util__trace_notes(void (*fn)(void *ud, int64_t key, const char *text), void *ud);
/* Frees the recorded events and notes. */
void nb_util__trace_clear(void);

#endif
