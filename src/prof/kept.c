/* The executables a trace saw run: the runtime reports each run
 * (util/trace.h, nb_util__trace_run); the first run of each copies what the
 * memory and graph viewers show of it (view.h), later ones add to its run
 * count and time, and nb_prof_stop writes the viewers' files beside the
 * trace. Copied at once because an executable may be gone by the time the
 * trace stops. Not here: the trace itself (trace.c). */
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "prof/view.h"
#include "util/trace.h"

#define KEPT_MAX 64 /* executables whose views a trace keeps (later ones are counted, not kept) */

typedef struct kept {
  uint64_t key;
  nb_prof__view view;
} kept;

static struct {
  pthread_mutex_t mu;
  kept *k;
  size_t n, cap;
  size_t missed; /* beyond KEPT_MAX, or out of memory */
} kept_set = {.mu = PTHREAD_MUTEX_INITIALIZER};

static kept *find(uint64_t key) {
  for (size_t i = 0; i < kept_set.n; i++)
    if (kept_set.k[i].key == key) return &kept_set.k[i];
  return NULL;
}

static void on_run(const void *exe, uint64_t key, int64_t ns) {
  pthread_mutex_lock(&kept_set.mu);
  kept *k = find(key);
  if (!k && kept_set.n < KEPT_MAX) {
    /* first run: copy the view (under the lock: two threads running it at once copy it once) */
    nb_prof__view v;
    if (kept_set.n == kept_set.cap) {
      size_t cap = kept_set.cap ? 2 * kept_set.cap : 8;
      kept *p = realloc(kept_set.k, cap * sizeof *p);
      if (p) kept_set.k = p, kept_set.cap = cap;
    }
    if (kept_set.n < kept_set.cap && nb_prof__view_build(NULL, exe, &v) == NB_OK) {
      k = &kept_set.k[kept_set.n++];
      k->key = key;
      k->view = v;
    }
  }
  if (k) {
    k->view.runs++;
    k->view.run_ms += (double)ns * 1e-6;
  } else {
    kept_set.missed++;
  }
  pthread_mutex_unlock(&kept_set.mu);
}

void nb_prof__kept_clear(void) {
  pthread_mutex_lock(&kept_set.mu);
  for (size_t i = 0; i < kept_set.n; i++) nb_prof__view_free(&kept_set.k[i].view);
  free(kept_set.k);
  kept_set.k = NULL;
  kept_set.n = kept_set.cap = kept_set.missed = 0;
  pthread_mutex_unlock(&kept_set.mu);
}

void nb_prof__kept_begin(void) {
  nb_prof__kept_clear();
  nb_util__trace_set_run_hook(on_run);
}

void nb_prof__kept_end(void) { nb_util__trace_set_run_hook(NULL); }

/* most run time first */
static int by_time(const void *a, const void *b) {
  const nb_prof__view *x = *(const nb_prof__view *const *)a, *y = *(const nb_prof__view *const *)b;
  return (x->run_ms < y->run_ms) - (x->run_ms > y->run_ms);
}

static const char page_head[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>nabla memory</title>\n<style>\n"
    "body{font-family:sans-serif;margin:16px;color:#222}table{border-collapse:collapse;margin:6px 0 18px}"
    "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:left}th{background:#f0f0f0}"
    "section{margin-bottom:32px}code{font-size:12px}\n</style></head><body>\n<h1>Memory of the traced executables</h1>\n";

typedef void (*drawer)(FILE *f, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv);

static void draw_json(FILE *f, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv) { nb_prof__memory_json(f, v, n, kv); }

static void draw_page(FILE *f, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv) {
  fputs(page_head, f);
  fprintf(f, "<p>%zu executables ran while the trace was recorded, most run time first.</p>\n", n);
  nb_prof__kv_html(f, kv);
  for (size_t i = 0; i < n; i++) nb_prof__memory_html(f, v[i]);
  fputs("</body></html>\n", f);
}

static void draw_graph(FILE *f, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv) {
  (void)kv;
  nb_prof__graph_svg(f, v[0], true);
}

static nb_status write_one(nb_ctx *ctx, const char *path, drawer d, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory writing '%s'", path);
  d(f, v, n, kv);
  nb_status s = fclose(f) ? nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory writing '%s'", path)
                          : nb_prof__write_atomic(ctx, path, buf, len);
  free(buf);
  return s;
}

nb_status nb_prof__kept_write(nb_ctx *ctx, const char *trace_path, const nb_prof__kv *kv) {
  pthread_mutex_lock(&kept_set.mu);
  size_t n = kept_set.n;
  nb_status s = NB_OK;
  const nb_prof__view **v = malloc((n + 1) * sizeof *v);
  if (!v) s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory");
  for (size_t i = 0; v && i < n; i++) v[i] = &kept_set.k[i].view;
  if (v) qsort(v, n, sizeof *v, by_time);
  static const struct {
    const char *suffix;
    drawer d;
    bool needs_exe;
  } files[] = {{".memory.json", draw_json, false}, {".memory.html", draw_page, false}, {".graph.svg", draw_graph, true}};
  char path[NB_PROF__PATH_CAP + 32];
  for (size_t i = 0; v && !s && i < sizeof files / sizeof *files; i++) {
    if (!n && (files[i].needs_exe || !kv->nsamples)) continue; /* nothing to show */
    nb_prof__sibling_path(trace_path, files[i].suffix, path, sizeof path);
    s = write_one(ctx, path, files[i].d, v, n, kv);
  }
  free(v);
  pthread_mutex_unlock(&kept_set.mu);
  return s;
}
