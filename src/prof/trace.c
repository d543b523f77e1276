/* Traces: nb_prof_start/stop around the recorder of src/util/trace.h, and
 * the two files a trace leaves: Chrome trace-event JSON ("X" complete events
 * and "M" thread names, docs/prof.md "Traces") and a summary of slice counts
 * and total durations per name, which scripts/prof_trace_peer.py compares
 * with what Perfetto's trace processor reads from the JSON. Not here:
 * recording (util), where the spans come from (their libraries). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prof/internal.h"
#include "util/trace.h"

static struct {
  pthread_mutex_t mu;
  bool on;
  int64_t t_start; /* ns: ts 0 of the file */
  double wall_start;
  char path[NB_PROF__PATH_CAP];
} session = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- collecting ------------------------------------------------------------ */

typedef struct track {
  int tid;
  char name[32];
  size_t first, n; /* its events in the collection's array */
} track;

typedef struct collection {
  nb_util__trace_event *ev;
  size_t n, cap;
  track *tracks;
  size_t ntracks, cap_tracks;
  bool oom;
} collection;

static void take_thread(void *ud, int tid, const char *name, const nb_util__trace_event *ev, size_t n) {
  collection *c = ud;
  if (c->oom) return;
  if (c->n + n > c->cap) {
    size_t cap = (c->cap ? 2 * c->cap : 1024) + n;
    nb_util__trace_event *p = realloc(c->ev, cap * sizeof *p);
    if (!p) return (void)(c->oom = true);
    c->ev = p, c->cap = cap;
  }
  if (c->ntracks == c->cap_tracks) {
    size_t cap = c->cap_tracks ? 2 * c->cap_tracks : 16;
    track *t = realloc(c->tracks, cap * sizeof *t);
    if (!t) return (void)(c->oom = true);
    c->tracks = t, c->cap_tracks = cap;
  }
  track *t = &c->tracks[c->ntracks++];
  t->tid = tid;
  snprintf(t->name, sizeof t->name, "%s", name);
  t->first = c->n;
  t->n = n;
  memcpy(c->ev + c->n, ev, n * sizeof *ev);
  c->n += n;
}

/* within a track: by start, the enclosing span (longer) first */
static int by_start(const void *a, const void *b) {
  const nb_util__trace_event *x = a, *y = b;
  if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
  return (x->dur < y->dur) - (x->dur > y->dur);
}

/* ---- the JSON --------------------------------------------------------------- */

static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void put_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.17g", v);
  else fputs("null", f);
}

/* ns since the start as microseconds, exactly (three decimals) */
static void put_us(FILE *f, int64_t ns) {
  if (ns < 0) fprintf(f, "-%lld.%03lld", (long long)(-ns / 1000), (long long)(-ns % 1000));
  else fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

static void put_event(FILE *f, int pid, int tid, const nb_util__trace_event *e, int64_t t_start) {
  fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", pid, tid);
  put_us(f, e->t0 - t_start);
  fputs(",\"dur\":", f);
  put_us(f, e->dur);
  fputs(",\"name\":", f);
  put_str(f, e->name);
  fputs(",\"cat\":", f);
  put_str(f, e->cat);
  if (e->nargs) {
    fputs(",\"args\":{", f);
    for (int i = 0; i < e->nargs; i++) {
      if (i) fputc(',', f);
      put_str(f, e->args[i].key ? e->args[i].key : "?");
      fputc(':', f);
      if (e->args[i].is_str) put_str(f, e->args[i].str);
      else put_num(f, e->args[i].num);
    }
    fputc('}', f);
  }
  fputc('}', f);
}

static void put_trace(FILE *f, const collection *c, int64_t dropped) {
  int pid = (int)getpid();
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"nabla\",\"wall_start_s\":%.6f,\"dropped_events\":%lld},\n",
          session.wall_start, (long long)dropped);
  fprintf(f, "\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"nabla\"}}", pid,
          pid);
  for (size_t i = 0; i < c->ntracks; i++) {
    const track *t = &c->tracks[i];
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", pid, t->tid);
    put_str(f, t->name);
    fputs("}}", f);
    for (size_t k = 0; k < t->n; k++) put_event(f, pid, t->tid, &c->ev[t->first + k], session.t_start);
  }
  fputs("\n]}\n", f);
}

/* ---- the summary --------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp((*(const nb_util__trace_event *const *)a)->name, (*(const nb_util__trace_event *const *)b)->name);
}

/* {"events": N, "dropped_events": D, "threads": T, "slices": {name: {"count", "total_ns", "cat"}}} */
static bool put_summary(FILE *f, const collection *c, int64_t dropped) {
  const nb_util__trace_event **ix = malloc((c->n + 1) * sizeof *ix);
  if (!ix) return false;
  for (size_t i = 0; i < c->n; i++) ix[i] = &c->ev[i];
  qsort(ix, c->n, sizeof *ix, by_name);
  fprintf(f, "{\"format\":\"nabla-trace-summary/1\",\"events\":%zu,\"dropped_events\":%lld,\"threads\":%zu,\"slices\":{", c->n,
          (long long)dropped, c->ntracks);
  for (size_t i = 0; i < c->n;) {
    size_t j = i;
    int64_t total = 0;
    for (; j < c->n && !strcmp(ix[j]->name, ix[i]->name); j++) total += ix[j]->dur;
    fputs(i ? ",\n" : "\n", f);
    put_str(f, ix[i]->name);
    fprintf(f, ":{\"count\":%zu,\"total_ns\":%lld,\"cat\":", j - i, (long long)total);
    put_str(f, ix[i]->cat);
    fputc('}', f);
    i = j;
  }
  fputs("\n}}\n", f);
  free(ix);
  return true;
}

/* ---- writing ---------------------------------------------------------------------- */

typedef bool (*writer)(FILE *f, const collection *c, int64_t dropped);

static bool put_trace_ok(FILE *f, const collection *c, int64_t dropped) { return put_trace(f, c, dropped), true; }

static nb_status write_file(nb_ctx *ctx, const char *path, writer w, const collection *c, int64_t dropped) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  bool ok = f && w(f, c, dropped);
  if (f && fclose(f)) ok = false;
  nb_status s = ok ? nb_prof__write_atomic(ctx, path, buf, n)
                   : nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory writing '%s'", path);
  free(buf);
  return s;
}

static void summary_path(const char *path, char *out, size_t cap) {
  size_t n = strlen(path);
  if (n >= 5 && !strcmp(path + n - 5, ".json")) snprintf(out, cap, "%.*s.summary.json", (int)(n - 5), path);
  else snprintf(out, cap, "%s.summary.json", path);
}

/* ---- the API ------------------------------------------------------------------------ */

nb_status nb_prof_start(nb_ctx *ctx, const nb_prof_trace_opts *opts) {
  if (!opts || !opts->path || !opts->path[0]) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_start: opts.path: no trace file given");
  size_t n = strlen(opts->path);
  if (n + 16 >= NB_PROF__PATH_CAP)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_start: opts.path: %zu bytes (at most %d)", n, NB_PROF__PATH_CAP - 17);
  pthread_mutex_lock(&session.mu);
  nb_status s = NB_OK;
  if (session.on) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_start: a trace is already being recorded into '%s'", session.path);
  char dir[NB_PROF__PATH_CAP];
  snprintf(dir, sizeof dir, "%s", opts->path);
  char *slash = strrchr(dir, '/');
  if (!s && slash && slash != dir) {
    *slash = 0;
    s = nb_prof__mkdirs(ctx, dir);
  }
  if (!s) {
    snprintf(session.path, sizeof session.path, "%s", opts->path);
    session.on = true;
    session.wall_start = nb_util__wall_s();
    session.t_start = nb_util__trace_enable(opts->max_events);
  }
  pthread_mutex_unlock(&session.mu);
  return s;
}

nb_status nb_prof_stop(nb_ctx *ctx) {
  pthread_mutex_lock(&session.mu);
  if (!session.on) {
    pthread_mutex_unlock(&session.mu);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_stop: no trace is being recorded");
  }
  nb_util__trace_disable();
  session.on = false;
  collection c = {0};
  int64_t dropped = nb_util__trace_collect(take_thread, &c);
  nb_util__trace_clear();
  nb_status s = NB_OK;
  if (c.oom) s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory collecting %zu events", c.n);
  for (size_t i = 0; !s && i < c.ntracks; i++) qsort(c.ev + c.tracks[i].first, c.tracks[i].n, sizeof *c.ev, by_start);
  char sp[NB_PROF__PATH_CAP + 16];
  summary_path(session.path, sp, sizeof sp);
  if (!s) s = write_file(ctx, session.path, put_trace_ok, &c, dropped);
  if (!s) s = write_file(ctx, sp, put_summary, &c, dropped);
  free(c.ev);
  free(c.tracks);
  pthread_mutex_unlock(&session.mu);
  return s;
}

bool nb_prof_tracing(void) { return nb_util__tracing(); }

void nb_prof_scope_begin(const char *name) { nb_util__trace_begin("user", name); }
void nb_prof_scope_end(void) { nb_util__trace_end(); }
void nb_prof_thread_name(const char *name) { nb_util__trace_thread_name(name); }
