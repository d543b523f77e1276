/* The op profile: the compiled steps of a trace (kernels, GEMMs, evaluated
 * equations), each with its time, the source ops and parameter paths the
 * runtime noted for it (src/runtime/describe.c), its cost (the cost rules'
 * FLOPs and bytes), the rates achieved and its place on the roofline of
 * this machine's measured peaks; then the time per primitive family and a
 * summary of the other spans (the step timeline). Written at nb_prof_stop
 * as <trace>.ops.json (docs/prof.md, "Op profile"), printed by
 * nb_prof_trace_table, drawn by nb_prof_profile_html (html.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "util/util.h"

/* the steps of compiled programs: their times do not nest in one another
 * (a control step's do: its bodies' steps are counted instead) */
static bool is_step(const char *cat) { return !strcmp(cat, "kernel") || !strcmp(cat, "gemm") || !strcmp(cat, "eval"); }

void nb_prof__ops_path(const char *trace_path, char *out, size_t cap) { nb_prof__sibling_path(trace_path, ".ops.json", out, cap); }

/* ---- joining spans with the notes ------------------------------------------ */

typedef struct notes {
  cJSON **exe; /* parsed notes */
  size_t n, cap;
} notes;

static void take_note(void *ud, int64_t key, const char *text) {
  (void)key;
  notes *ns = ud;
  if (ns->n == ns->cap) {
    size_t cap = ns->cap ? 2 * ns->cap : 16;
    cJSON **p = realloc(ns->exe, cap * sizeof *p);
    if (!p) return;
    ns->exe = p, ns->cap = cap;
  }
  cJSON *j = cJSON_Parse(text);
  if (j) ns->exe[ns->n++] = j;
}

/* the note of step (ref & 0xffffff) of executable (ref >> 24), or NULL */
static const cJSON *step_note(const notes *ns, int64_t ref) {
  if (!ref) return NULL;
  double exe = (double)(ref >> 24), step = (double)(ref & 0xffffff);
  for (size_t i = 0; i < ns->n; i++) {
    if (cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(ns->exe[i], "exe")) != exe) continue;
    const cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ns->exe[i], "steps"), (int)step);
    return s && cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(s, "step")) == step ? s : NULL;
  }
  return NULL;
}

static double arg_num(const nb_util__trace_event *e, const char *key) {
  for (int a = 0; a < e->nargs; a++)
    if (!e->args[a].is_str && e->args[a].key && !strcmp(e->args[a].key, key) && isfinite(e->args[a].num)) return e->args[a].num;
  return 0;
}

static const char *arg_str(const nb_util__trace_event *e, const char *key) {
  for (int a = 0; a < e->nargs; a++)
    if (e->args[a].is_str && e->args[a].key && !strcmp(e->args[a].key, key)) return e->args[a].str;
  return NULL;
}

/* by reference, then (for spans without one) by name */
static int by_ref_name(const void *a, const void *b) {
  const nb_util__trace_event *x = *(const nb_util__trace_event *const *)a, *y = *(const nb_util__trace_event *const *)b;
  if (x->ref != y->ref) return x->ref < y->ref ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int by_total_ns(const void *a, const void *b) {
  double x = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(*(cJSON *const *)a, "total_ns"));
  double y = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(*(cJSON *const *)b, "total_ns"));
  return (x < y) - (x > y);
}

static void copy_item(cJSON *to, const cJSON *from, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(from, key);
  if (v) cJSON_AddItemToObject(to, key, cJSON_Duplicate(v, true));
}

/* Where a step sits on the roofline of peaks (flops, bytes/s): its
 * arithmetic intensity, which roof bounds it at that intensity and what
 * share of that roof it reached. */
static void add_roofline(cJSON *k, double flops, double bytes, double sec, const nb_prof__peaks *pk) {
  double gf = sec > 0 ? flops / sec : 0, bw = sec > 0 ? bytes / sec : 0;
  cJSON_AddNumberToObject(k, "gflops", gf * 1e-9);
  cJSON_AddNumberToObject(k, "gbps", bw * 1e-9);
  double ai = bytes > 0 ? flops / bytes : 0;
  cJSON_AddNumberToObject(k, "intensity", ai);
  if (pk->flops <= 0 || pk->bytes_per_s <= 0) return;
  bool memory = ai * pk->bytes_per_s < pk->flops;
  cJSON_AddStringToObject(k, "bound", memory ? "memory" : "compute");
  cJSON_AddNumberToObject(k, "roof_pct", 100 * (memory ? bw / pk->bytes_per_s : gf / pk->flops));
}

/* one row of the op table: spans ix[i..j) of one step */
static cJSON *step_row(const nb_util__trace_event *const *ix, size_t i, size_t j, const notes *ns, const nb_prof__peaks *pk) {
  const nb_util__trace_event *e = ix[i];
  cJSON *k = cJSON_CreateObject();
  const cJSON *note = step_note(ns, e->ref);
  double ns_total = 0, flops = 0, bytes = 0;
  for (size_t a = i; a < j; a++) ns_total += (double)ix[a]->dur;
  if (e->ref) {
    cJSON_AddNumberToObject(k, "exe", (double)(e->ref >> 24));
    cJSON_AddNumberToObject(k, "step", (double)(e->ref & 0xffffff));
  }
  cJSON_AddStringToObject(k, "name", e->name);
  cJSON_AddStringToObject(k, "cat", e->cat);
  if (note) {
    copy_item(k, note, "kind");
    copy_item(k, note, "family");
    copy_item(k, note, "ops");
    copy_item(k, note, "eqns");
    copy_item(k, note, "source");
    copy_item(k, note, "reads");
    copy_item(k, note, "writes");
    flops = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(note, "flops"));
    bytes = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(note, "bytes"));
  } else { /* a span no executable noted: what its args say */
    cJSON_AddStringToObject(k, "family", e->cat);
    const char *ops = arg_str(e, "ops"), *at = arg_str(e, "at");
    if (ops) cJSON_AddStringToObject(k, "ops", ops);
    if (at) cJSON_AddItemToObject(k, "source", cJSON_CreateStringArray(&at, 1));
    for (size_t a = i; a < j; a++) flops += arg_num(ix[a], "flops"), bytes += arg_num(ix[a], "bytes");
    flops /= (double)(j - i), bytes /= (double)(j - i);
  }
  cJSON_AddNumberToObject(k, "count", (double)(j - i));
  cJSON_AddNumberToObject(k, "total_ns", ns_total);
  cJSON_AddNumberToObject(k, "mean_ns", ns_total / (double)(j - i));
  cJSON_AddNumberToObject(k, "flops", isfinite(flops) ? flops : 0);
  cJSON_AddNumberToObject(k, "bytes", isfinite(bytes) ? bytes : 0);
  add_roofline(k, flops * (double)(j - i), bytes * (double)(j - i), ns_total * 1e-9, pk);
  return k;
}

/* ---- the other views ------------------------------------------------------- */

/* time per family, slowest first */
static cJSON *families(cJSON *const *rows, int n, double all_ns, const nb_prof__peaks *pk) {
  cJSON *out = cJSON_CreateArray();
  cJSON **fam = calloc((size_t)n + 1, sizeof *fam);
  int nf = 0;
  for (int i = 0; fam && i < n; i++) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rows[i], "family"));
    if (!name) name = "other";
    int f = 0;
    while (f < nf && strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fam[f], "family")), name)) f++;
    if (f == nf) {
      fam[nf] = cJSON_CreateObject();
      cJSON_AddStringToObject(fam[nf], "family", name);
      for (const char *const *key = (const char *const[]){"steps", "count", "total_ns", "flops", "bytes", NULL}; *key; key++)
        cJSON_AddNumberToObject(fam[nf], *key, 0);
      nf++;
    }
    double count = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[i], "count"));
    double add[5] = {1, count, cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[i], "total_ns")),
                     count * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[i], "flops")),
                     count * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[i], "bytes"))};
    const char *keys[5] = {"steps", "count", "total_ns", "flops", "bytes"};
    for (int a = 0; a < 5; a++) {
      cJSON *v = cJSON_GetObjectItemCaseSensitive(fam[f], keys[a]);
      cJSON_SetNumberValue(v, v->valuedouble + add[a]);
    }
  }
  for (int f = 0; f < nf; f++) {
    double t = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(fam[f], "total_ns"));
    cJSON_AddNumberToObject(fam[f], "share", all_ns > 0 ? t / all_ns : 0);
    add_roofline(fam[f], cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(fam[f], "flops")),
                 cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(fam[f], "bytes")), t * 1e-9, pk);
  }
  if (fam) qsort(fam, (size_t)nf, sizeof *fam, by_total_ns);
  for (int f = 0; f < nf; f++) cJSON_AddItemToArray(out, fam[f]);
  free(fam);
  return out;
}

/* The step timeline: every span that is not a compiled step, per name
 * (train step, next batch, step executable, nb_jit, data wait, ...), and
 * the trainer's steps one by one. */
static cJSON *timeline(const nb_prof__collection *c) {
  cJSON *t = cJSON_CreateObject(), *spans = cJSON_AddObjectToObject(t, "spans"), *steps = cJSON_AddArrayToObject(t, "train_steps");
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (size_t i = 0; i < c->n; i++) {
    const nb_util__trace_event *e = &c->ev[i];
    lo = e->t0 < lo ? e->t0 : lo;
    hi = e->t0 + e->dur > hi ? e->t0 + e->dur : hi;
    if (is_step(e->cat) || !strcmp(e->cat, "pool")) continue;
    cJSON *s = cJSON_GetObjectItemCaseSensitive(spans, e->name);
    if (!s) {
      s = cJSON_AddObjectToObject(spans, e->name);
      cJSON_AddStringToObject(s, "cat", e->cat);
      cJSON_AddNumberToObject(s, "count", 0);
      cJSON_AddNumberToObject(s, "total_ns", 0);
    }
    cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "count"), *tn = cJSON_GetObjectItemCaseSensitive(s, "total_ns");
    cJSON_SetNumberValue(cn, cn->valuedouble + 1);
    cJSON_SetNumberValue(tn, tn->valuedouble + (double)e->dur);
    if (!strcmp(e->cat, "train") && !strcmp(e->name, "train step")) {
      cJSON *row = cJSON_CreateObject();
      cJSON_AddNumberToObject(row, "step", arg_num(e, "step"));
      cJSON_AddNumberToObject(row, "start_ns", (double)(e->t0 - c->t_start));
      cJSON_AddNumberToObject(row, "dur_ns", (double)e->dur);
      cJSON_AddItemToArray(steps, row);
    }
  }
  cJSON_AddNumberToObject(t, "span_ns", c->n ? (double)(hi - lo) : 0);
  return t;
}

/* ---- the file --------------------------------------------------------------- */

char *nb_prof__op_profile(const nb_prof__collection *c, const nb_prof__peaks *pk) {
  notes ns = {0};
  nb_util__trace_notes(take_note, &ns);
  const nb_util__trace_event **ix = malloc((c->n + 1) * sizeof *ix);
  size_t m = 0;
  for (size_t i = 0; ix && i < c->n; i++)
    if (is_step(c->ev[i].cat)) ix[m++] = &c->ev[i];
  cJSON *root = cJSON_CreateObject(), **rows = calloc(m + 1, sizeof *rows);
  char *text = NULL;
  if (ix && rows && root) {
    qsort(ix, m, sizeof *ix, by_ref_name);
    int nrows = 0;
    double all_ns = 0;
    for (size_t i = 0, j; i < m; i = j) {
      for (j = i + 1; j < m && ix[j]->ref == ix[i]->ref && (ix[i]->ref || !strcmp(ix[j]->name, ix[i]->name)); j++) {
      }
      rows[nrows] = step_row(ix, i, j, &ns, pk);
      all_ns += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[nrows++], "total_ns"));
    }
    qsort(rows, (size_t)nrows, sizeof *rows, by_total_ns);
    cJSON_AddStringToObject(root, "format", "nabla-op-profile/1");
    cJSON *peak = cJSON_AddObjectToObject(root, "peak");
    cJSON_AddNumberToObject(peak, "gflops", pk->flops * 1e-9);
    cJSON_AddStringToObject(peak, "gflops_source", pk->flops_source);
    cJSON_AddNumberToObject(peak, "gbps", pk->bytes_per_s * 1e-9);
    cJSON_AddStringToObject(peak, "gbps_source", pk->bytes_source);
    cJSON_AddNumberToObject(peak, "ridge", pk->bytes_per_s > 0 ? pk->flops / pk->bytes_per_s : 0);
    cJSON_AddNumberToObject(root, "steps_ns", all_ns);
    double fl = 0, by = 0;
    for (int r = 0; r < nrows; r++) {
      double n = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "count"));
      fl += n * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "flops"));
      by += n * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "bytes"));
    }
    /* the floor: each step at its roof (the larger of its compute and memory times) */
    double floor_ns = 0;
    for (int r = 0; r < nrows && pk->flops > 0 && pk->bytes_per_s > 0; r++) {
      double n = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "count"));
      double f = n * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "flops"));
      double b = n * cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rows[r], "bytes"));
      double at = fmax(f / pk->flops, b / pk->bytes_per_s) * 1e9;
      cJSON_AddNumberToObject(rows[r], "floor_ns", at);
      floor_ns += at;
    }
    cJSON_AddNumberToObject(root, "flops", fl);
    cJSON_AddNumberToObject(root, "bytes", by);
    cJSON_AddNumberToObject(root, "floor_ns", floor_ns);
    cJSON *fam = families(rows, nrows, all_ns, pk);
    cJSON *ks = cJSON_AddArrayToObject(root, "kernels");
    for (int r = 0; r < nrows; r++) cJSON_AddItemToArray(ks, rows[r]);
    cJSON_AddItemToObject(root, "families", fam);
    cJSON_AddItemToObject(root, "timeline", timeline(c));
    text = cJSON_Print(root);
  }
  cJSON_Delete(root);
  free(rows);
  free(ix);
  for (size_t i = 0; i < ns.n; i++) cJSON_Delete(ns.exe[i]);
  free(ns.exe);
  return text;
}
