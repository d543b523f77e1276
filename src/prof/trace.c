/* Traces: nb_prof_start/stop around the recorder of src/util/trace.h, and
 * the two files a trace leaves: Chrome trace-event JSON ("X" complete events
 * and "M" thread names, docs/prof.md "Traces") and a summary of slice counts
 * and total durations per name, which scripts/prof_trace_peer.py compares
 * with what Perfetto's trace processor reads from the JSON. Not here:
 * recording (util), where the spans come from (their libraries). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prof/internal.h"
#include "prof/view.h"
#include "util/trace.h"
#include "util/util.h"

static struct {
  pthread_mutex_t mu;
  bool on;
  int64_t t_start; /* ns: ts 0 of the file */
  double wall_start;
  char path[NB_PROF__PATH_CAP];
  double peak_flops, peak_bytes_per_s; /* the caller's; 0: nb_prof_peak_* at nb_prof_stop */
  char html[NB_PROF__PATH_CAP];         /* the profile page */
} session = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- collecting ------------------------------------------------------------ */

typedef nb_prof__track track;
typedef nb_prof__collection collection;

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

/* A JSON string; control characters become spaces: Perfetto's JSON reader
 * refuses \u escapes (and the whole file with them) */
static void put_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.17g", v);
  else fputs("null", f);
}

/* ns since the start as microseconds, exactly (three decimals) */
static void put_us(FILE *f, int64_t ns) {
  if (ns < 0) fprintf(f, "-%lld.%03lld", (long long)(-ns / 1000), (long long)(-ns % 1000));
  else fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

/* a span ("X"), or a counter's sample ("C": each argument a series) */
static void put_event(FILE *f, int pid, int tid, const nb_util__trace_event *e, int64_t t_start) {
  fprintf(f, ",\n{\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":", e->counter ? "C" : "X", pid, tid);
  put_us(f, e->t0 - t_start);
  if (!e->counter) {
    fputs(",\"dur\":", f);
    put_us(f, e->dur);
  }
  fputs(",\"name\":", f);
  nb_prof__json_str(f, e->name);
  fputs(",\"cat\":", f);
  nb_prof__json_str(f, e->cat);
  if (e->nargs || e->ref) {
    fputs(",\"args\":{", f);
    if (e->ref) /* the row of the op profile (<trace>.ops.json) */
      fprintf(f, "\"exe\":%lld,\"step\":%lld%s", (long long)(e->ref >> 24), (long long)(e->ref & 0xffffff), e->nargs ? "," : "");
    for (int i = 0; i < e->nargs; i++) {
      if (i) fputc(',', f);
      nb_prof__json_str(f, e->args[i].key ? e->args[i].key : "?");
      fputc(':', f);
      if (e->args[i].is_str) nb_prof__json_str(f, e->args[i].str);
      else put_num(f, e->args[i].num);
    }
    fputc('}', f);
  }
  fputc('}', f);
}

static void put_trace(FILE *f, const collection *c, int64_t dropped) {
  int pid = (int)getpid();
  /* no "displayTimeUnit": Perfetto reads ts and dur in that unit when it is there (they are microseconds) */
  fprintf(f, "{\"otherData\":{\"producer\":\"nabla\",\"wall_start_s\":%.6f,\"dropped_events\":%lld},\n",
          session.wall_start, (long long)dropped);
  fprintf(f, "\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"nabla\"}}", pid,
          pid);
  for (size_t i = 0; i < c->ntracks; i++) {
    const track *t = &c->tracks[i];
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", pid, t->tid);
    nb_prof__json_str(f, t->name);
    fputs("}}", f);
    for (size_t k = 0; k < t->n; k++) put_event(f, pid, t->tid, &c->ev[t->first + k], session.t_start);
  }
  fputs("\n]}\n", f);
}

/* ---- the summary --------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp((*(const nb_util__trace_event *const *)a)->name, (*(const nb_util__trace_event *const *)b)->name);
}

/* the sum of numeric argument key over spans ix[i..j) */
static double arg_sum(const nb_util__trace_event *const *ix, size_t i, size_t j, const char *key) {
  double sum = 0;
  for (; i < j; i++)
    for (int a = 0; a < ix[i]->nargs; a++)
      if (!ix[i]->args[a].is_str && ix[i]->args[a].key && !strcmp(ix[i]->args[a].key, key) && isfinite(ix[i]->args[a].num))
        sum += ix[i]->args[a].num;
  return sum;
}

/* {"events": N spans, "dropped_events": D, "threads": T (with spans),
 *  "counters": {name: {"samples"}},
 *  "slices": {name: {"count", "total_ns", "cat", "flops", "bytes"}}} */
static bool put_summary(FILE *f, const collection *c, int64_t dropped) {
  const nb_util__trace_event **ix = malloc((c->n + 1) * sizeof *ix);
  if (!ix) return false;
  size_t n = 0, nc = 0; /* spans first, then the counters' samples */
  for (size_t i = 0; i < c->n; i++)
    if (!c->ev[i].counter) ix[n++] = &c->ev[i];
  for (size_t i = 0; i < c->n; i++)
    if (c->ev[i].counter) ix[n + nc++] = &c->ev[i];
  qsort(ix, n, sizeof *ix, by_name);
  qsort(ix + n, nc, sizeof *ix, by_name);
  size_t threads = 0; /* tracks with spans: counters belong to the process */
  for (size_t t = 0; t < c->ntracks; t++) {
    bool spans = false;
    for (size_t k = 0; k < c->tracks[t].n && !spans; k++) spans = !c->ev[c->tracks[t].first + k].counter;
    threads += spans;
  }
  fprintf(f, "{\"format\":\"nabla-trace-summary/1\",\"events\":%zu,\"dropped_events\":%lld,\"threads\":%zu,\"counters\":{", n,
          (long long)dropped, threads);
  for (size_t i = n; i < n + nc;) {
    size_t j = i;
    while (j < n + nc && !strcmp(ix[j]->name, ix[i]->name)) j++;
    fputs(i > n ? ",\n" : "\n", f);
    nb_prof__json_str(f, ix[i]->name);
    fprintf(f, ":{\"samples\":%zu}", j - i);
    i = j;
  }
  fputs("},\"slices\":{", f);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    int64_t total = 0;
    for (; j < n && !strcmp(ix[j]->name, ix[i]->name); j++) total += ix[j]->dur;
    fputs(i ? ",\n" : "\n", f);
    nb_prof__json_str(f, ix[i]->name);
    fprintf(f, ":{\"count\":%zu,\"total_ns\":%lld,\"cat\":", j - i, (long long)total);
    nb_prof__json_str(f, ix[i]->cat);
    fprintf(f, ",\"flops\":%.17g,\"bytes\":%.17g}", arg_sum(ix, i, j, "flops"), arg_sum(ix, i, j, "bytes"));
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

void nb_prof__sibling_path(const char *path, const char *suffix, char *out, size_t cap) {
  size_t n = strlen(path);
  if (n >= 5 && !strcmp(path + n - 5, ".json")) snprintf(out, cap, "%.*s%s", (int)(n - 5), path, suffix);
  else snprintf(out, cap, "%s%s", path, suffix);
}

/* the roofs: the caller's, else this machine's measured ones (cached) */
static void peaks(nb_prof__peaks *pk) {
  nb_prof_peak p;
  if (session.peak_flops > 0) pk->flops = session.peak_flops, snprintf(pk->flops_source, sizeof pk->flops_source, "given");
  else p = nb_prof_peak_flops(0), pk->flops = p.flops, snprintf(pk->flops_source, sizeof pk->flops_source, "%s", p.source);
  if (session.peak_bytes_per_s > 0)
    pk->bytes_per_s = session.peak_bytes_per_s, snprintf(pk->bytes_source, sizeof pk->bytes_source, "given");
  else p = nb_prof_peak_bandwidth(0), pk->bytes_per_s = p.bytes_per_s, snprintf(pk->bytes_source, sizeof pk->bytes_source, "%s", p.source);
}

static nb_status write_op_profile(nb_ctx *ctx, collection *c) {
  char path[NB_PROF__PATH_CAP + 16];
  nb_prof__ops_path(session.path, path, sizeof path);
  nb_prof__peaks pk = {0};
  peaks(&pk);
  c->t_start = session.t_start;
  char *text = nb_prof__op_profile(c, &pk);
  nb_status s = text ? nb_prof__write_atomic(ctx, path, text, strlen(text))
                     : nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory writing '%s'", path);
  free(text);
  return s;
}

static void summary_path(const char *path, char *out, size_t cap) { nb_prof__sibling_path(path, ".summary.json", out, cap); }

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
    session.peak_flops = opts->peak_flops > 0 ? opts->peak_flops : 0;
    if (opts->html_path) snprintf(session.html, sizeof session.html, "%s", opts->html_path);
    else if (slash) snprintf(session.html, sizeof session.html, "%.*s/profile.html", (int)(strrchr(opts->path, '/') - opts->path), opts->path);
    else snprintf(session.html, sizeof session.html, "profile.html");
    session.peak_bytes_per_s = opts->peak_bytes_per_s > 0 ? opts->peak_bytes_per_s : 0;
    session.wall_start = nb_util__wall_s();
    nb_prof__kept_begin();
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
  nb_prof__kept_end();
  session.on = false;
  collection c = {0};
  int64_t dropped = nb_util__trace_collect(take_thread, &c);
  nb_status s = NB_OK;
  if (c.oom) s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory collecting %zu events", c.n);
  for (size_t i = 0; !s && i < c.ntracks; i++) qsort(c.ev + c.tracks[i].first, c.tracks[i].n, sizeof *c.ev, by_start);
  char sp[NB_PROF__PATH_CAP + 16];
  summary_path(session.path, sp, sizeof sp);
  if (!s) s = write_file(ctx, session.path, put_trace_ok, &c, dropped);
  if (!s) s = write_file(ctx, sp, put_summary, &c, dropped);
  if (!s) s = write_op_profile(ctx, &c);
  nb_prof__kv kv = {0}; /* the memory and graph viewers, before the page that shows them */
  if (!s) s = nb_prof__kv_build(ctx, c.ev, c.n, session.t_start, &kv);
  if (!s) s = nb_prof__kept_write(ctx, session.path, &kv);
  nb_prof__kv_free(&kv);
  nb_prof__kept_clear();
  if (!s && session.html[0]) {
    char title[NB_PROF__PATH_CAP + 32];
    snprintf(title, sizeof title, "nabla profile: %s", session.path);
    s = nb_prof_profile_html(ctx, session.path, session.html, title, NULL, 0);
  }
  nb_util__trace_clear(); /* the events (copied into c) and the notes (read by the op profile) */
  free(c.ev);
  free(c.tracks);
  pthread_mutex_unlock(&session.mu);
  return s;
}

bool nb_prof_tracing(void) { return nb_util__tracing(); }

bool nb_prof_parse_steps(const char *s, int64_t *first, int64_t *last) {
  *first = *last = 0;
  if (!s) return false;
  char a[32], b[32], why[64];
  const char *dash = strchr(s, '-');
  size_t n = dash ? (size_t)(dash - s) : strlen(s);
  if (!n || n >= sizeof a || (dash && (!dash[1] || strlen(dash + 1) >= sizeof b))) return false;
  snprintf(a, sizeof a, "%.*s", (int)n, s);
  snprintf(b, sizeof b, "%s", dash ? dash + 1 : a);
  int64_t x, y;
  if (!nb_parse_int(a, 1, INT64_MAX, &x, why, sizeof why) || !nb_parse_int(b, 1, INT64_MAX, &y, why, sizeof why) || y < x)
    return false;
  *first = x, *last = y;
  return true;
}

void nb_prof_scope_begin(const char *name) { nb_util__trace_begin("user", name); }
void nb_prof_scope_end(void) { nb_util__trace_end(); }
void nb_prof_thread_name(const char *name) { nb_util__trace_thread_name(name); }

/* ---- the op table ------------------------------------------------------------------ */

static double num(const cJSON *o, const char *key) { return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, key)); }
static const char *str(const cJSON *o, const char *key) {
  const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
  return v ? v : "";
}

/* "a, b +3 more" of a JSON array of strings, into buf */
static const char *joined(const cJSON *arr, char *buf, size_t cap, int most) {
  size_t n = 0;
  int i = 0, total = cJSON_GetArraySize(arr);
  buf[0] = 0;
  const cJSON *x;
  cJSON_ArrayForEach(x, arr) {
    if (i == most) {
      snprintf(buf + n, cap - n, " +%d more", total - most);
      break;
    }
    int k = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", cJSON_GetStringValue(x) ? cJSON_GetStringValue(x) : "?");
    if (k < 0 || (size_t)k >= cap - n) break;
    n += (size_t)k, i++;
  }
  return buf;
}

nb_status nb_prof_trace_table(nb_ctx *ctx, const char *trace_path, FILE *out, int top, double peak_flops) {
  char path[NB_PROF__PATH_CAP + 16], *text = NULL;
  if (!trace_path || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_trace_table: NULL argument");
  nb_prof__ops_path(trace_path, path, sizeof path);
  size_t len;
  int err = nb_util__read_file(path, (size_t)1 << 30, &text, &len);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "nb_prof_trace_table: cannot read '%s': %s", path, strerror(err));
  cJSON *j = cJSON_Parse(text);
  free(text);
  const cJSON *ks = cJSON_GetObjectItemCaseSensitive(j, "kernels"), *fams = cJSON_GetObjectItemCaseSensitive(j, "families");
  const cJSON *pk = cJSON_GetObjectItemCaseSensitive(j, "peak");
  if (!cJSON_IsArray(ks) || !cJSON_IsArray(fams)) {
    cJSON_Delete(j);
    return nb_errorf(ctx, NB_ERR_FORMAT, "nb_prof_trace_table: '%s' is not an op profile (no \"kernels\" array)", path);
  }
  double all = num(j, "steps_ns"), floor_ns = num(j, "floor_ns");
  if (peak_flops <= 0) peak_flops = num(pk, "gflops") * 1e9;
  fprintf(out, "compiled steps: %.3f ms in all", all * 1e-6);
  const cJSON *f;
  cJSON_ArrayForEach(f, fams) fprintf(out, ", %s %.1f%%", str(f, "family"), 100 * num(f, "share"));
  fprintf(out, "\nroofs: %.1f GFLOP/s, %.1f GB/s (ridge %.1f FLOP/byte); at the roofs the steps would take %.3f ms (%.1f%% of their time)\n",
          num(pk, "gflops"), num(pk, "gbps"), num(pk, "ridge"), floor_ns * 1e-6, all > 0 ? 100 * floor_ns / all : 0.0);
  fprintf(out, "%10s %6s %7s %9s %8s %7s %8s %7s %-7s %6s  %-6s %s\n", "total ms", "share", "count", "mean us", "GFLOP/s", "%peak",
          "GB/s", "FLOP/B", "bound", "%roof", "cat", "name [reads]");
  int i = 0;
  cJSON_ArrayForEach(f, ks) {
    if (top > 0 && i++ >= top) break;
    double t = num(f, "total_ns"), rate = num(f, "gflops") * 1e9;
    char pct[16] = "-", roof[16] = "-", reads[200];
    if (peak_flops > 0) snprintf(pct, sizeof pct, "%.1f%%", 100 * rate / peak_flops);
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(f, "roof_pct"))) snprintf(roof, sizeof roof, "%.1f%%", num(f, "roof_pct"));
    /* a kernel as "k12" and its whole op list (the span's name cuts it) */
    const char *name = str(f, "name"), *ops = str(f, "ops");
    int cut = !strcmp(str(f, "cat"), "kernel") && *ops && strchr(name, ' ') ? (int)(strchr(name, ' ') - name) : (int)strlen(name);
    fprintf(out, "%10.3f %5.1f%% %7.0f %9.2f %8.2f %7s %8.2f %7.2f %-7s %6s  %-6s %.*s%s%s", t * 1e-6, all > 0 ? 100 * t / all : 0.0,
            num(f, "count"), num(f, "mean_ns") * 1e-3, rate * 1e-9, pct, num(f, "gbps"), num(f, "intensity"),
            str(f, "bound")[0] ? str(f, "bound") : "-", roof, str(f, "cat"), cut, name, name[cut] ? " " : "", name[cut] ? ops : "");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(f, "reads");
    if (cJSON_GetArraySize(r) > 0) fprintf(out, " [%s]", joined(r, reads, sizeof reads, 3));
    fputc('\n', out);
  }
  cJSON_Delete(j);
  return NB_OK;
}
