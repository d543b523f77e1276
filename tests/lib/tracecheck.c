/* Loads and checks a trace and its summary (tracecheck.h). */
#include "tracecheck.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testfs.h"

/* "123.456" microseconds -> 123456 ns, from the number's text */
static int64_t us_to_ns(const cJSON *j) { return (int64_t)llround(j->valuedouble * 1000.0); }

static int by_tid_start(const void *a, const void *b) {
  const nb_test_span *x = a, *y = b;
  if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return (x->dur < y->dur) - (x->dur > y->dur);
}

/* spans of one thread must nest: a stack of the open ones */
static void check_nesting(const nb_test_trace *t) {
  int64_t end[256];
  int depth = 0, tid = -1;
  for (size_t i = 0; i < t->n; i++) {
    const nb_test_span *s = &t->spans[i];
    if (s->tid != tid) depth = 0, tid = s->tid;
    while (depth > 0 && end[depth - 1] <= s->ts) depth--;
    CHECK_MSG(depth == 0 || s->ts + s->dur <= end[depth - 1], "span '%s' on thread %d [%lld, %lld) overlaps its parent, "
              "which ends at %lld", s->name, s->tid, (long long)s->ts, (long long)(s->ts + s->dur), (long long)end[depth - 1]);
    if (depth < 256) end[depth++] = s->ts + s->dur;
  }
}

static void check_summary(const char *trace_path, const nb_test_trace *t) {
  char sp[4200];
  size_t n = strlen(trace_path);
  snprintf(sp, sizeof sp, "%.*s.summary.json", (int)(n > 5 ? n - 5 : n), trace_path);
  char *text = nb_test_read_file(sp, NULL);
  CHECK_MSG(text != NULL, "no summary at %s", sp);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  free(text);
  if (!text) return;
  CHECK_MSG(j != NULL, "%s is not JSON", sp);
  const cJSON *slices = cJSON_GetObjectItemCaseSensitive(j, "slices"), *ev = cJSON_GetObjectItemCaseSensitive(j, "events");
  CHECK_MSG(cJSON_IsNumber(ev) && (size_t)ev->valuedouble == t->n, "summary events %g, trace %zu", cJSON_IsNumber(ev) ? ev->valuedouble : -1.0, t->n);
  size_t total_count = 0;
  const cJSON *s;
  cJSON_ArrayForEach(s, slices) {
    int64_t ns = 0;
    size_t c = nb_test_trace_count(t, s->string, NULL, &ns);
    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(s, "count"), *jt = cJSON_GetObjectItemCaseSensitive(s, "total_ns");
    CHECK_MSG(cJSON_IsNumber(jc) && (size_t)jc->valuedouble == c, "'%s': summary count %g, trace %zu", s->string,
              cJSON_IsNumber(jc) ? jc->valuedouble : -1.0, c);
    CHECK_MSG(cJSON_IsNumber(jt) && (int64_t)jt->valuedouble == ns, "'%s': summary total %g ns, trace %lld", s->string,
              cJSON_IsNumber(jt) ? jt->valuedouble : -1.0, (long long)ns);
    total_count += c;
  }
  CHECK_MSG(total_count == t->n, "the summary's names cover %zu of %zu spans", total_count, t->n);
  size_t samples = 0;
  cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "counters")) {
    size_t c = nb_test_trace_samples(t, s->string);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(s, "samples");
    CHECK_MSG(cJSON_IsNumber(js) && (size_t)js->valuedouble == c, "counter '%s': summary %g samples, trace %zu", s->string,
              cJSON_IsNumber(js) ? js->valuedouble : -1.0, c);
    samples += c;
  }
  CHECK_MSG(samples == t->ncounters, "the summary's counters cover %zu of %zu samples", samples, t->ncounters);
  cJSON_Delete(j);
}

int nb_test_trace_load(const char *path, nb_test_trace *t) {
  memset(t, 0, sizeof *t);
  char *text = nb_test_read_file(path, NULL);
  CHECK_MSG(text != NULL, "cannot read the trace %s", path);
  if (!text) return -1;
  cJSON *j = cJSON_Parse(text);
  free(text);
  CHECK_MSG(j != NULL, "%s is not JSON", path);
  if (!j) return -1;
  const cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
  /* ts and dur are microseconds, the format's default: a displayTimeUnit would make Perfetto read them in another unit */
  CHECK_MSG(!cJSON_GetObjectItemCaseSensitive(j, "displayTimeUnit"), "%s declares a displayTimeUnit", path);
  const cJSON *dr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "otherData"), "dropped_events");
  t->dropped = cJSON_IsNumber(dr) ? (long long)dr->valuedouble : -1;
  CHECK_MSG(cJSON_IsArray(evs), "%s has no traceEvents array", path);
  t->spans = calloc((size_t)cJSON_GetArraySize(evs) + 1, sizeof *t->spans);
  t->counters = calloc((size_t)cJSON_GetArraySize(evs) + 1, sizeof *t->counters);
  const cJSON *e;
  cJSON_ArrayForEach(e, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"), *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    CHECK_MSG(cJSON_IsString(ph) && cJSON_IsNumber(tid) && cJSON_IsNumber(pid) && cJSON_IsString(name), "an event lacks ph/pid/tid/name");
    if (!cJSON_IsString(ph) || !cJSON_IsNumber(tid) || !cJSON_IsString(name)) continue;
    if (!strcmp(ph->valuestring, "M")) {
      const cJSON *an = cJSON_GetObjectItemCaseSensitive(args, "name");
      if (!strcmp(name->valuestring, "thread_name") && cJSON_IsString(an) && t->ntids < 64) {
        t->tids[t->ntids] = tid->valueint;
        snprintf(t->thread_names[t->ntids++], 32, "%s", an->valuestring);
      }
      continue;
    }
    if (!strcmp(ph->valuestring, "C")) {
      const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"), *a;
      bool numeric = cJSON_IsObject(args) && cJSON_GetArraySize(args) > 0;
      cJSON_ArrayForEach(a, args) numeric &= cJSON_IsNumber(a);
      CHECK_MSG(cJSON_IsNumber(ts) && !cJSON_GetObjectItemCaseSensitive(e, "dur") && numeric,
                "counter '%s' lacks ts, has a dur or a series that is not a number", name->valuestring);
      nb_test_counter *c = &t->counters[t->ncounters++];
      c->ts = cJSON_IsNumber(ts) ? us_to_ns(ts) : 0;
      snprintf(c->name, sizeof c->name, "%s", name->valuestring);
      char *series = args ? cJSON_PrintUnformatted(args) : NULL;
      snprintf(c->args, sizeof c->args, "%s", series ? series : "");
      cJSON_free(series);
      continue;
    }
    CHECK_MSG(!strcmp(ph->valuestring, "X"), "event phase '%s' (nabla writes X, C and M)", ph->valuestring);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"), *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    CHECK_MSG(cJSON_IsNumber(ts) && cJSON_IsNumber(dur) && cJSON_IsString(cat), "span '%s' lacks ts/dur/cat", name->valuestring);
    if (!cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) || !cJSON_IsString(cat)) continue;
    nb_test_span *s = &t->spans[t->n++];
    s->tid = tid->valueint;
    s->ts = us_to_ns(ts);
    s->dur = us_to_ns(dur);
    CHECK_MSG(s->dur >= 0, "span '%s' has a negative duration", name->valuestring);
    snprintf(s->name, sizeof s->name, "%s", name->valuestring);
    snprintf(s->cat, sizeof s->cat, "%s", cat->valuestring);
    char *a = args ? cJSON_PrintUnformatted(args) : NULL;
    snprintf(s->args, sizeof s->args, "%s", a ? a : "");
    cJSON_free(a);
  }
  cJSON_Delete(j);
  qsort(t->spans, t->n, sizeof *t->spans, by_tid_start);
  for (size_t i = 0; i < t->n; i++)
    CHECK_MSG(nb_test_trace_thread(t, t->spans[i].tid) != NULL, "thread %d has spans but no thread_name", t->spans[i].tid);
  check_nesting(t);
  check_summary(path, t);
  return 0;
}

void nb_test_trace_free(nb_test_trace *t) {
  free(t->spans);
  free(t->counters);
  memset(t, 0, sizeof *t);
}

size_t nb_test_trace_count(const nb_test_trace *t, const char *name, const char *cat, int64_t *total_ns) {
  size_t c = 0;
  int64_t ns = 0;
  for (size_t i = 0; i < t->n; i++)
    if (!strcmp(t->spans[i].name, name) && (!cat || !strcmp(t->spans[i].cat, cat))) c++, ns += t->spans[i].dur;
  if (total_ns) *total_ns = ns;
  return c;
}

size_t nb_test_trace_samples(const nb_test_trace *t, const char *name) {
  size_t c = 0;
  for (size_t i = 0; i < t->ncounters; i++) c += !strcmp(t->counters[i].name, name);
  return c;
}

const nb_test_span *nb_test_trace_find(const nb_test_trace *t, const char *name) {
  for (size_t i = 0; i < t->n; i++)
    if (!strcmp(t->spans[i].name, name)) return &t->spans[i];
  return NULL;
}

const char *nb_test_trace_thread(const nb_test_trace *t, int tid) {
  for (int i = 0; i < t->ntids; i++)
    if (t->tids[i] == tid) return t->thread_names[i];
  return NULL;
}
