/* The memory and graph viewers' HTML sections from the files nb_prof_stop
 * wrote beside a trace (TRACE.memory.json, TRACE.graph.svg), for reports
 * drawn after the trace: memory.json is read back into the views
 * memory.c draws (steps by name, blocks, live bytes, the KV timeline).
 * Not here: the drawing (memory.c, kv.c, graph.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "prof/view.h"
#include "util/util.h"

#define MAX_FILE ((size_t)1 << 30)

static double num(const cJSON *o, const char *k) {
  double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
  return v == v ? v : 0; /* NaN: absent */
}

/* a count or size from the file, clamped (the file may be anything) */
static size_t size_of(double v) { return v > 0 ? v < 9e15 ? (size_t)v : (size_t)9e15 : 0; }
static int int_of(double v) { return v > -1e9 ? v < 1e9 ? (int)v : (int)1e9 : (int)-1e9; }

static void copy(char *dst, size_t cap, const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
  snprintf(dst, cap, "%s", s ? s : "");
}

static int kind_of(const char *name) {
  for (int k = 0; k <= NB_PROF__BODY; k++)
    if (!strcmp(name, nb_prof__kind_name(k))) return k;
  return NB_EXE_BUF_NONE;
}

/* one executable of memory.json; false when out of memory */
static bool read_view(const cJSON *x, nb_prof__view *v) {
  memset(v, 0, sizeof *v);
  copy(v->title, sizeof v->title, x, "title");
  const cJSON *names = cJSON_GetObjectItemCaseSensitive(x, "step_names"), *live = cJSON_GetObjectItemCaseSensitive(x, "live_bytes");
  const cJSON *bufs = cJSON_GetObjectItemCaseSensitive(x, "buffers"), *peak = cJSON_GetObjectItemCaseSensitive(x, "peak"), *e;
  v->nsteps = cJSON_GetArraySize(names);
  if (cJSON_GetArraySize(live) != v->nsteps) v->nsteps = 0;
  v->steps = calloc((size_t)v->nsteps + 1, sizeof *v->steps);
  v->live = calloc((size_t)v->nsteps + 1, sizeof *v->live);
  v->blocks = calloc((size_t)cJSON_GetArraySize(bufs) + 1, sizeof *v->blocks);
  if (!v->steps || !v->live || !v->blocks) return false;
  int s = 0;
  cJSON_ArrayForEach(e, names) if (s < v->nsteps) {
    snprintf(v->steps[s].name, sizeof v->steps[s].name, "%s", cJSON_IsString(e) ? e->valuestring : "");
    v->steps[s++].kind = "step";
  }
  s = 0;
  cJSON_ArrayForEach(e, live) if (s < v->nsteps) v->live[s++] = size_of(cJSON_IsNumber(e) ? e->valuedouble : 0);
  cJSON_ArrayForEach(e, bufs) {
    nb_prof__block *b = &v->blocks[v->nblocks++];
    char kind[16];
    copy(kind, sizeof kind, e, "kind");
    b->kind = kind_of(kind);
    copy(b->name, sizeof b->name, e, "name");
    copy(b->op, sizeof b->op, e, "op");
    copy(b->at, sizeof b->at, e, "at");
    copy(b->type, sizeof b->type, e, "type");
    copy(b->donated_to, sizeof b->donated_to, e, "donated_to");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "offset");
    b->offset = cJSON_IsNumber(off) && off->valuedouble >= 0 ? (int64_t)size_of(off->valuedouble) : -1;
    b->bytes = size_of(num(e, "bytes"));
    b->first = int_of(num(e, "first")), b->last = int_of(num(e, "last")), b->written = int_of(num(e, "written"));
  }
  v->arena_bytes = size_of(num(x, "arena_bytes"));
  v->held = size_of(num(x, "held_bytes"));
  v->runs = size_of(num(x, "runs"));
  v->run_ms = num(x, "run_ms");
  v->peak = size_of(num(peak, "bytes"));
  v->peak_step = int_of(num(peak, "step"));
  if (v->peak_step >= v->nsteps || v->peak_step < -1) v->peak_step = v->nsteps - 1;
  return true;
}

/* the kv_cache object; false when out of memory */
static bool read_kv(const cJSON *j, nb_prof__kv *kv) {
  memset(kv, 0, sizeof *kv);
  const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "timeline"), *peak = cJSON_GetObjectItemCaseSensitive(j, "peak");
  const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(peak, "sequences"), *e;
  kv->samples = calloc((size_t)cJSON_GetArraySize(tl) + 1, sizeof *kv->samples);
  kv->seqs = calloc((size_t)cJSON_GetArraySize(seqs) + 1, sizeof *kv->seqs);
  if (!kv->samples || !kv->seqs) return false;
  double t_peak = num(peak, "ts_us");
  cJSON_ArrayForEach(e, tl) {
    double f[5] = {0};
    for (int i = 0; i < 5; i++) f[i] = cJSON_GetNumberValue(cJSON_GetArrayItem(e, i));
    kv->samples[kv->nsamples] = (nb_prof__kv_sample){f[0], f[1], f[2], f[3], f[4]};
    if (f[0] <= t_peak) kv->peak = kv->nsamples; /* the sample at the peak's time */
    kv->nsamples++;
  }
  cJSON_ArrayForEach(e, seqs) {
    copy(kv->seqs[kv->nseqs].name, sizeof kv->seqs->name, e, "name");
    kv->seqs[kv->nseqs++].blocks = num(e, "blocks");
  }
  return true;
}

nb_status nb_prof_trace_memory_html(nb_ctx *ctx, const char *trace_path, int max_executables, FILE *out) {
  if (!trace_path || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_trace_memory_html: NULL argument");
  char path[NB_PROF__PATH_CAP + 32], *text = NULL;
  nb_prof__sibling_path(trace_path, ".memory.json", path, sizeof path);
  size_t len;
  int err = nb_util__read_file(path, MAX_FILE, &text, &len);
  if (err == ENOENT) return NB_OK; /* nothing ran under the trace */
  if (err) return nb_errorf(ctx, NB_ERR_IO, "nb_prof_trace_memory_html: cannot read '%s': %s", path, strerror(err));
  cJSON *j = cJSON_Parse(text);
  free(text);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format"), *exes = cJSON_GetObjectItemCaseSensitive(j, "executables"), *x;
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "nabla-memory/1") || (exes && !cJSON_IsArray(exes))) {
    cJSON_Delete(j);
    return nb_errorf(ctx, NB_ERR_FORMAT, "nb_prof_trace_memory_html: '%s' is not a nabla-memory/1 file", path);
  }
  nb_status s = NB_OK;
  const cJSON *kvj = cJSON_GetObjectItemCaseSensitive(j, "kv_cache");
  if (cJSON_IsObject(kvj)) {
    nb_prof__kv kv;
    if (read_kv(kvj, &kv)) nb_prof__kv_html(out, &kv);
    else s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_trace_memory_html: out of memory");
    nb_prof__kv_free(&kv);
  }
  int k = 0;
  cJSON_ArrayForEach(x, exes) { /* written most run time first */
    if (s || (max_executables > 0 && k++ >= max_executables)) break;
    nb_prof__view v;
    if (read_view(x, &v)) nb_prof__memory_html(out, &v);
    else s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_trace_memory_html: out of memory");
    nb_prof__view_free(&v);
  }
  cJSON_Delete(j);
  if (!s && ferror(out)) s = nb_errorf(ctx, NB_ERR_IO, "nb_prof_trace_memory_html: write error");
  return s;
}

nb_status nb_prof_trace_graph_html(nb_ctx *ctx, const char *trace_path, FILE *out) {
  if (!trace_path || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_trace_graph_html: NULL argument");
  char path[NB_PROF__PATH_CAP + 32], *text = NULL;
  nb_prof__sibling_path(trace_path, ".graph.svg", path, sizeof path);
  size_t len;
  int err = nb_util__read_file(path, MAX_FILE, &text, &len);
  if (err == ENOENT) return NB_OK;
  if (err) return nb_errorf(ctx, NB_ERR_IO, "nb_prof_trace_graph_html: cannot read '%s': %s", path, strerror(err));
  const char *svg = strstr(text, "<svg");
  if (!svg) {
    free(text);
    return nb_errorf(ctx, NB_ERR_FORMAT, "nb_prof_trace_graph_html: '%s' holds no <svg>", path);
  }
  nb_prof__graph_section(out, "the executable that ran longest", svg);
  fputs("</div>\n</section>\n", out);
  free(text);
  return ferror(out) ? nb_errorf(ctx, NB_ERR_IO, "nb_prof_trace_graph_html: write error") : NB_OK;
}
