/* The profile page: one self-contained HTML file (inline CSS, SVG and a
 * little script; nothing fetched) drawn from a trace's op profile
 * (<trace>.ops.json, opprof.c): the totals and the floor, the roofline
 * (log-log, a point per compiled step, the memory and compute roofs), the
 * time per family, the op table (sortable by any column: click its head)
 * and the step timeline's summary; then any extra sections. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "util/util.h"

static double num(const cJSON *o, const char *key) { return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, key)); }
static const char *str(const cJSON *o, const char *key) {
  const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
  return v ? v : "";
}

static void esc_list(FILE *f, const cJSON *arr) {
  const cJSON *x;
  int i = 0;
  cJSON_ArrayForEach(x, arr) {
    if (i++) fputs(", ", f);
    nb_prof__xml_text(f, cJSON_GetStringValue(x));
  }
}

/* ---- the roofline ------------------------------------------------------------ */

enum { RW = 720, RH = 440, ML = 70, MR = 20, MT = 20, MB = 50 };

typedef struct axis {
  double lo, hi; /* log10 of the ends */
  int a, b;      /* pixels of the ends */
} axis;

static double at(const axis *x, double v) { return x->a + (log10(v) - x->lo) / (x->hi - x->lo) * (x->b - x->a); }

static void decades(FILE *f, const axis *x, const axis *y, bool horizontal) {
  const axis *ax = horizontal ? x : y;
  for (int d = (int)floor(ax->lo); d <= (int)ceil(ax->hi); d++) {
    if (d < ax->lo - 1e-9 || d > ax->hi + 1e-9) continue;
    double p = at(ax, pow(10, d));
    if (horizontal)
      fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' class='grid'/><text x='%.1f' y='%d' class='tick' text-anchor='middle'>1e%d</text>\n",
              p, p, y->b, y->a, p, y->a + 16, d);
    else
      fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/><text x='%d' y='%.1f' class='tick' text-anchor='end'>1e%d</text>\n",
              x->a, x->b, p, p, x->a - 6, p + 4, d);
  }
}

static const char *cat_colour(const char *cat) {
  return !strcmp(cat, "gemm") ? "#d62728" : !strcmp(cat, "kernel") ? "#1f77b4" : "#2ca02c";
}

static void roofline(FILE *f, const cJSON *j) {
  const cJSON *pk = cJSON_GetObjectItemCaseSensitive(j, "peak"), *ks = cJSON_GetObjectItemCaseSensitive(j, "kernels"), *k;
  double peak = num(pk, "gflops"), bw = num(pk, "gbps"), all = num(j, "steps_ns");
  if (!(peak > 0 && bw > 0)) {
    fputs("<p>No roofline: the peaks are unknown.</p>\n", f);
    return;
  }
  double ridge = peak / bw, xlo = ridge, xhi = ridge, ylo = peak, yhi = peak;
  int off = 0;
  cJSON_ArrayForEach(k, ks) {
    double ai = num(k, "intensity"), gf = num(k, "gflops");
    if (!(ai > 0 && gf > 0)) {
      off++;
      continue;
    }
    xlo = fmin(xlo, ai), xhi = fmax(xhi, ai), ylo = fmin(ylo, gf), yhi = fmax(yhi, gf);
  }
  axis x = {floor(log10(xlo) - 0.3), ceil(log10(xhi) + 0.3), ML, RW - MR};
  axis y = {floor(log10(fmin(ylo, bw * pow(10, floor(log10(xlo) - 0.3)))) - 0.2), ceil(log10(yhi) + 0.3), RH - MB, MT};
  fprintf(f, "<svg id='roofline' width='%d' height='%d' viewBox='0 0 %d %d' xmlns='http://www.w3.org/2000/svg'>\n", RW, RH, RW, RH);
  fprintf(f, "<rect x='0' y='0' width='%d' height='%d' fill='#fff'/>\n", RW, RH);
  decades(f, &x, &y, true);
  decades(f, &x, &y, false);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' class='frame'/>\n", x.a, y.b, x.b - x.a, y.a - y.b);
  /* the roofs: bandwidth x intensity up to the ridge, then the FMA peak */
  double x0 = pow(10, x.lo), x1 = pow(10, x.hi);
  fprintf(f, "<polyline class='roof' points='%.1f,%.1f %.1f,%.1f %.1f,%.1f'/>\n", at(&x, x0), at(&y, fmax(bw * x0, pow(10, y.lo))),
          at(&x, ridge), at(&y, peak), at(&x, x1), at(&y, peak));
  fprintf(f, "<text x='%.1f' y='%.1f' class='rooflabel'>%.1f GFLOP/s</text>\n", at(&x, x1) - 110, at(&y, peak) - 6, peak);
  fprintf(f, "<text x='%.1f' y='%.1f' class='rooflabel'>%.1f GB/s</text>\n", at(&x, ridge) - 150, at(&y, peak) + 40, bw);
  cJSON_ArrayForEach(k, ks) {
    double ai = num(k, "intensity"), gf = num(k, "gflops"), share = all > 0 ? num(k, "total_ns") / all : 0;
    if (!(ai > 0 && gf > 0)) continue;
    fprintf(f, "<circle cx='%.1f' cy='%.1f' r='%.1f' fill='%s' fill-opacity='0.55' stroke='%s'><title>", at(&x, ai), at(&y, gf),
            3 + 12 * sqrt(share), cat_colour(str(k, "cat")), cat_colour(str(k, "cat")));
    nb_prof__xml_text(f, str(k, "name"));
    fprintf(f, ": %.2f GFLOP/s at %.3g FLOP/byte, %.1f%% of the time</title></circle>\n", gf, ai, 100 * share);
  }
  fprintf(f, "<text x='%d' y='%d' class='axis' text-anchor='middle'>arithmetic intensity (FLOP/byte)</text>\n", (x.a + x.b) / 2,
          RH - 10);
  fprintf(f, "<text x='16' y='%d' class='axis' text-anchor='middle' transform='rotate(-90 16 %d)'>GFLOP/s</text>\n", (y.a + y.b) / 2,
          (y.a + y.b) / 2);
  fputs("</svg>\n", f);
  fprintf(f, "<p class='note'>A point per compiled step (<span style='color:#1f77b4'>fused kernels</span>, "
             "<span style='color:#d62728'>GEMMs</span>, <span style='color:#2ca02c'>evaluated equations</span>), its area its share of "
             "the time; %d steps that do no arithmetic (copies) are not drawn.</p>\n",
          off);
}

/* ---- the tables --------------------------------------------------------------- */

/* a cell holding a number: shown with `decimals` (-1: 3 significant
 * digits) and then `unit`, sorted by its value */
static void cell(FILE *f, double v, int decimals, const char *unit) {
  if (!isfinite(v)) v = 0;
  fprintf(f, "<td data-v='%.17g'>", v);
  if (decimals < 0) fprintf(f, "%.3g%s</td>", v, unit);
  else fprintf(f, "%.*f%s</td>", decimals, v, unit);
}

static void op_table(FILE *f, const cJSON *j) {
  double all = num(j, "steps_ns");
  fputs("<table class='sortable' id='ops'><thead><tr>", f);
  static const char *const heads[] = {"total ms", "share", "count", "mean us", "GFLOP/s", "GB/s", "FLOP/byte", "bound", "% of roof",
                                      "at roof ms", "cat", "family", "step", "source ops", "reads", "writes", "where traced"};
  for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) fprintf(f, "<th>%s</th>", heads[i]);
  fputs("</tr></thead><tbody>\n", f);
  const cJSON *k;
  cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(j, "kernels")) {
    fputs("<tr>", f);
    double t = num(k, "total_ns");
    cell(f, t * 1e-6, 3, "");
    cell(f, all > 0 ? 100 * t / all : 0, 1, "%");
    cell(f, num(k, "count"), 0, "");
    cell(f, num(k, "mean_ns") * 1e-3, 2, "");
    cell(f, num(k, "gflops"), 2, "");
    cell(f, num(k, "gbps"), 2, "");
    cell(f, num(k, "intensity"), -1, "");
    fputs("<td>", f);
    nb_prof__xml_text(f, str(k, "bound"));
    fputs("</td>", f);
    cell(f, num(k, "roof_pct"), 1, "%");
    cell(f, num(k, "floor_ns") * 1e-6, 3, "");
    for (const char *const *key = (const char *const[]){"cat", "family", "name", "ops", NULL}; *key; key++) {
      fputs("<td>", f);
      nb_prof__xml_text(f, str(k, *key));
      fputs("</td>", f);
    }
    for (const char *const *key = (const char *const[]){"reads", "writes", "source", NULL}; *key; key++) {
      fputs("<td class='paths'>", f);
      esc_list(f, cJSON_GetObjectItemCaseSensitive(k, *key));
      fputs("</td>", f);
    }
    fputs("</tr>\n", f);
  }
  fputs("</tbody></table>\n", f);
}

static void family_table(FILE *f, const cJSON *j) {
  fputs("<table class='sortable' id='families'><thead><tr><th>family</th><th>total ms</th><th>share</th><th>steps</th>"
        "<th>runs</th><th>GFLOP/s</th><th>GB/s</th><th>bound</th><th>% of roof</th></tr></thead><tbody>\n",
        f);
  const cJSON *k;
  cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(j, "families")) {
    fputs("<tr><td>", f);
    nb_prof__xml_text(f, str(k, "family"));
    fputs("</td>", f);
    cell(f, num(k, "total_ns") * 1e-6, 3, "");
    cell(f, 100 * num(k, "share"), 1, "%");
    cell(f, num(k, "steps"), 0, "");
    cell(f, num(k, "count"), 0, "");
    cell(f, num(k, "gflops"), 2, "");
    cell(f, num(k, "gbps"), 2, "");
    fputs("<td>", f);
    nb_prof__xml_text(f, str(k, "bound"));
    fputs("</td>", f);
    cell(f, num(k, "roof_pct"), 1, "%");
    fputs("</tr>\n", f);
  }
  fputs("</tbody></table>\n", f);
}

/* the spans that are not compiled steps, per name, and the trainer's steps as bars */
static void timeline(FILE *f, const cJSON *j) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "timeline"), *s;
  const cJSON *steps = cJSON_GetObjectItemCaseSensitive(t, "train_steps");
  int n = cJSON_GetArraySize(steps);
  if (n > 0) {
    double most = 0;
    cJSON_ArrayForEach(s, steps) most = fmax(most, num(s, "dur_ns"));
    int bw = n > 60 ? 8 : 600 / n > 60 ? 60 : 600 / n, h = 160;
    fprintf(f, "<svg id='steps' width='%d' height='%d' xmlns='http://www.w3.org/2000/svg'>\n", 60 + n * bw + 20, h + 40);
    int i = 0;
    cJSON_ArrayForEach(s, steps) {
      double bh = most > 0 ? num(s, "dur_ns") / most * h : 0;
      fprintf(f, "<rect x='%d' y='%.1f' width='%d' height='%.1f' fill='#ff7f0e'><title>step %.0f: %.3f ms</title></rect>\n",
              60 + i * bw + 1, 10 + h - bh, bw - 2, bh, num(s, "step"), num(s, "dur_ns") * 1e-6);
      i++;
    }
    fprintf(f, "<text x='56' y='16' class='tick' text-anchor='end'>%.1f ms</text><text x='56' y='%d' class='tick' text-anchor='end'>0</text>",
            most * 1e-6, h + 10);
    fprintf(f, "<text x='%d' y='%d' class='axis' text-anchor='middle'>train steps (one bar each)</text></svg>\n", 60 + n * bw / 2, h + 34);
  }
  fprintf(f, "<p>The trace spans %.3f ms.</p>\n", num(t, "span_ns") * 1e-6);
  fputs("<table class='sortable' id='timeline'><thead><tr><th>span</th><th>category</th><th>count</th><th>total ms</th>"
        "<th>mean ms</th></tr></thead><tbody>\n",
        f);
  cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(t, "spans")) {
    fputs("<tr><td>", f);
    nb_prof__xml_text(f, s->string);
    fputs("</td><td>", f);
    nb_prof__xml_text(f, str(s, "cat"));
    fputs("</td>", f);
    cell(f, num(s, "count"), 0, "");
    cell(f, num(s, "total_ns") * 1e-6, 3, "");
    cell(f, num(s, "count") > 0 ? num(s, "total_ns") / num(s, "count") * 1e-6 : 0, 3, "");
    fputs("</tr>\n", f);
  }
  fputs("</tbody></table>\n", f);
}

/* ---- the page --------------------------------------------------------------- */

static const char style[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}h1{font-size:20px}h2{font-size:17px;margin-top:28px}"
    "nav a{margin-right:14px}table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;"
    "vertical-align:top}th{background:#f0f0f0;cursor:pointer;user-select:none}th:after{content:' \\2195';color:#999}"
    "td:nth-child(n+11){text-align:left}#families td:first-child,#timeline td:nth-child(-n+2){text-align:left}"
    "td.paths{max-width:360px;word-break:break-all}.grid{stroke:#e4e4e4}.frame{fill:none;stroke:#888}"
    ".roof{fill:none;stroke:#000;stroke-width:2.5}.tick{font-size:11px;fill:#555}.axis{font-size:13px;fill:#222}"
    ".rooflabel{font-size:12px;fill:#000}.note{color:#555;font-size:12px}dl{display:grid;grid-template-columns:max-content auto;"
    "gap:2px 14px}dt{color:#555}dd{margin:0}";

/* Click a column's head to sort by it (numbers by data-v), again to reverse. */
static const char script[] =
    "document.querySelectorAll('table.sortable').forEach(function(t){t.querySelectorAll('th').forEach(function(th,i){"
    "th.addEventListener('click',function(){var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows),"
    "up=th.getAttribute('data-dir')!=='up';t.querySelectorAll('th').forEach(function(h){h.removeAttribute('data-dir')});"
    "th.setAttribute('data-dir',up?'up':'down');rows.sort(function(x,y){var a=x.cells[i],c=y.cells[i],"
    "p=a.getAttribute('data-v'),q=c.getAttribute('data-v'),r=(p!==null&&q!==null)?parseFloat(p)-parseFloat(q):"
    "a.textContent.localeCompare(c.textContent);return up?r:-r});rows.forEach(function(r){b.appendChild(r)})})})});";

/* The sections every profile page gets from the trace's other viewers: the
 * memory viewer (with the KV cache) and the graph viewer, read back from
 * what nb_prof_stop wrote beside the trace (nothing when nothing ran). The
 * markup is malloc'ed into out[i].html; the caller frees it. */
static nb_status builtin_sections(nb_ctx *ctx, const char *trace_path, nb_prof_html_section out[2], size_t *n) {
  static const struct {
    const char *id, *title;
  } kinds[2] = {{"memory", "Memory viewer"}, {"graph", "Graph viewer"}};
  *n = 0;
  for (int k = 0; k < 2; k++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_profile_html: out of memory");
    nb_status s = k == 0 ? nb_prof_trace_memory_html(ctx, trace_path, 4, f) : nb_prof_trace_graph_html(ctx, trace_path, f);
    if (fclose(f) && !s) s = nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_profile_html: out of memory");
    if (s || !len) {
      free(buf);
      if (s) return s;
      continue;
    }
    out[(*n)++] = (nb_prof_html_section){kinds[k].id, kinds[k].title, buf};
  }
  return NB_OK;
}

static void section(FILE *f, const nb_prof_html_section *s) {
  fputs("<section id='", f);
  nb_prof__xml_text(f, s->id ? s->id : "extra");
  fputs("'><h2>", f);
  nb_prof__xml_text(f, s->title ? s->title : "");
  fputs("</h2>\n", f);
  if (s->html) fputs(s->html, f); /* the section's own markup, as given */
  fputs("\n</section>\n", f);
}

static void page(FILE *f, const cJSON *j, const char *title, const nb_prof_html_section *extra, size_t nextra) {
  fputs("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>", f);
  nb_prof__xml_text(f, title);
  fprintf(f, "</title><style>%s</style></head><body>\n<h1>", style);
  nb_prof__xml_text(f, title);
  fputs("</h1>\n<nav><a href='#summary'>summary</a><a href='#roof'>roofline</a><a href='#fam'>families</a><a href='#op'>op table</a>"
        "<a href='#time'>timeline</a>",
        f);
  for (size_t i = 0; i < nextra; i++) {
    fputs("<a href='#", f);
    nb_prof__xml_text(f, extra[i].id ? extra[i].id : "extra");
    fputs("'>", f);
    nb_prof__xml_text(f, extra[i].title ? extra[i].title : "");
    fputs("</a>", f);
  }
  const cJSON *pk = cJSON_GetObjectItemCaseSensitive(j, "peak");
  double all = num(j, "steps_ns"), fl = num(j, "floor_ns");
  fputs("</nav>\n<section id='summary'><h2>Summary</h2><dl>", f);
  fprintf(f, "<dt>compiled steps</dt><dd>%d distinct, %.3f ms in all</dd>", cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "kernels")),
          all * 1e-6);
  fprintf(f, "<dt>work</dt><dd>%.4g GFLOP, %.4g GB moved (the cost rules)</dd>", num(j, "flops") * 1e-9, num(j, "bytes") * 1e-9);
  fprintf(f, "<dt>compute roof</dt><dd>%.1f GFLOP/s (", num(pk, "gflops"));
  nb_prof__xml_text(f, str(pk, "gflops_source"));
  fprintf(f, ")</dd><dt>memory roof</dt><dd>%.1f GB/s (", num(pk, "gbps"));
  nb_prof__xml_text(f, str(pk, "gbps_source"));
  fprintf(f, ")</dd><dt>ridge</dt><dd>%.2f FLOP/byte</dd>", num(pk, "ridge"));
  fprintf(f, "<dt>floor</dt><dd>%.3f ms: every step at its roof; the steps took %.1fx that</dd></dl></section>\n", fl * 1e-6,
          fl > 0 ? all / fl : 0.0);
  fputs("<section id='roof'><h2>Roofline</h2>\n", f);
  roofline(f, j);
  fputs("</section>\n<section id='fam'><h2>Time per family</h2>\n", f);
  family_table(f, j);
  fputs("</section>\n<section id='op'><h2>Op table</h2><p class='note'>Click a column's head to sort by it.</p>\n", f);
  op_table(f, j);
  fputs("</section>\n<section id='time'><h2>Step timeline</h2>\n", f);
  timeline(f, j);
  fputs("</section>\n", f);
  for (size_t i = 0; i < nextra; i++) section(f, &extra[i]);
  fprintf(f, "<script>%s</script>\n</body></html>\n", script);
}

nb_status nb_prof_profile_html(nb_ctx *ctx, const char *trace_path, const char *out_html, const char *title,
                               const nb_prof_html_section *extra, size_t nextra) {
  if (!trace_path || !out_html) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_profile_html: NULL path");
  if (nextra && !extra) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_profile_html: extra: NULL with nextra %zu", nextra);
  char path[NB_PROF__PATH_CAP + 16], *text = NULL;
  nb_prof__ops_path(trace_path, path, sizeof path);
  size_t len;
  int err = nb_util__read_file(path, (size_t)1 << 30, &text, &len);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "nb_prof_profile_html: cannot read '%s': %s", path, strerror(err));
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "kernels"))) {
    cJSON_Delete(j);
    return nb_errorf(ctx, NB_ERR_FORMAT, "nb_prof_profile_html: '%s' is not an op profile (no \"kernels\" array)", path);
  }
  nb_prof_html_section builtin[2], *all = malloc((nextra + 2) * sizeof *all);
  size_t nb = 0, n = 0;
  nb_status bs = builtin_sections(ctx, trace_path, builtin, &nb);
  if (bs) {
    for (size_t i = 0; i < nb; i++) free((char *)builtin[i].html);
    free(all);
    cJSON_Delete(j);
    return bs;
  }
  for (size_t i = 0; all && i < nb; i++) all[n++] = builtin[i];
  for (size_t i = 0; all && i < nextra; i++) all[n++] = extra[i];
  char *buf = NULL;
  size_t blen = 0;
  FILE *f = all ? open_memstream(&buf, &blen) : NULL;
  if (f) page(f, j, title ? title : trace_path, all, n);
  nb_status s = f && !fclose(f) ? nb_prof__write_atomic(ctx, out_html, buf, blen)
                                 : nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_profile_html: out of memory writing '%s'", out_html);
  free(buf);
  free(all);
  for (size_t i = 0; i < nb; i++) free((char *)builtin[i].html);
  cJSON_Delete(j);
  return s;
}
