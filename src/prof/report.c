/* The training report: metrics.jsonl (one JSON object per line) in, one
 * self-contained HTML page out, with an inline SVG line plot per quantity and
 * a summary table. Deliberately not here: JavaScript, fonts or anything
 * fetched over the network, log scales, reading TensorBoard files. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "prof/internal.h"

#define MAX_METRICS_BYTES ((size_t)1 << 30)

/* ---- growable arrays and a string builder, through the ctx allocator ---- */

/* Grows *p (elem-sized items, *cap of them) to hold at least need items. */
static nb_status grow(nb_ctx *ctx, void **p, size_t *cap, size_t elem, size_t need) {
  if (need <= *cap) return NB_OK;
  size_t ncap = *cap ? *cap : 16;
  while (ncap < need) ncap *= 2;
  void *q = nb_alloc(ctx, ncap * elem);
  if (!q) return NB_ERR_NOMEM;
  if (*p) {
    memcpy(q, *p, *cap * elem);
    nb_dealloc(ctx, *p, *cap * elem);
  }
  *p = q, *cap = ncap;
  return NB_OK;
}

typedef struct sbuf {
  nb_ctx *ctx;
  char *p;
  size_t n, cap;
  bool oom; /* sticky: the page is incomplete */
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->oom || grow(b->ctx, (void **)&b->p, &b->cap, 1, b->n + n + 1) != NB_OK) {
    b->oom = true;
    return;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    sb_add(b, small, (size_t)n);
    return;
  }
  char *big = nb_alloc(b->ctx, (size_t)n + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb_add(b, big, (size_t)n);
  nb_dealloc(b->ctx, big, (size_t)n + 1);
}

/* Text as HTML (also safe inside attributes and SVG). */
static void sb_esc(sbuf *b, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': sb_puts(b, "&amp;"); break;
    case '<': sb_puts(b, "&lt;"); break;
    case '>': sb_puts(b, "&gt;"); break;
    case '"': sb_puts(b, "&quot;"); break;
    case '\'': sb_puts(b, "&#39;"); break;
    default: sb_add(b, s, 1);
    }
  }
}

/* ---- metrics: one series (step, value) per numeric field ---------------- */

typedef struct series {
  char *name; /* nb_alloc'ed, strlen + 1 bytes */
  double *x, *y;
  size_t n, xcap, ycap;
} series;

typedef struct metrics {
  series *s;
  size_t ns, cap;
  int64_t records, skipped_nonfinite;
  double min_step, max_step;
} metrics;

static void metrics_free(nb_ctx *ctx, metrics *m) {
  for (size_t i = 0; i < m->ns; i++) {
    series *s = &m->s[i];
    nb_strfree(ctx, s->name);
    if (s->x) nb_dealloc(ctx, s->x, s->xcap * sizeof(double));
    if (s->y) nb_dealloc(ctx, s->y, s->ycap * sizeof(double));
  }
  if (m->s) nb_dealloc(ctx, m->s, m->cap * sizeof(series));
}

static const series *find_series(const metrics *m, const char *name) {
  for (size_t i = 0; i < m->ns; i++)
    if (!strcmp(m->s[i].name, name)) return &m->s[i];
  return NULL;
}

static nb_status add_point(nb_ctx *ctx, metrics *m, const char *name, double x, double y) {
  series *s = (series *)find_series(m, name);
  if (!s) {
    if (grow(ctx, (void **)&m->s, &m->cap, sizeof(series), m->ns + 1) != NB_OK) return NB_ERR_NOMEM;
    s = &m->s[m->ns];
    memset(s, 0, sizeof *s);
    if (!(s->name = nb_strdup(ctx, name))) return NB_ERR_NOMEM;
    m->ns++;
  }
  if (grow(ctx, (void **)&s->x, &s->xcap, sizeof(double), s->n + 1) != NB_OK ||
      grow(ctx, (void **)&s->y, &s->ycap, sizeof(double), s->n + 1) != NB_OK)
    return NB_ERR_NOMEM;
  s->x[s->n] = x, s->y[s->n] = y, s->n++;
  return NB_OK;
}

static const char *json_kind(const cJSON *j) {
  return cJSON_IsArray(j) ? "an array" : cJSON_IsString(j) ? "a string" : cJSON_IsNumber(j) ? "a number"
       : cJSON_IsBool(j)  ? "a boolean" : "null";
}

/* One non-blank line [line, line + n): adds its numeric fields. */
static nb_status parse_line(nb_ctx *ctx, metrics *m, const char *file, int64_t lineno, const char *line, size_t n) {
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithLengthOpts(line, n, &end, false);
  if (!j) {
    size_t col = end && end >= line ? (size_t)(end - line) + 1 : 1;
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: not valid JSON (column %zu)", file, (long long)lineno, col);
  }
  while (end < line + n && (*end == ' ' || *end == '\t' || *end == '\r')) end++;
  nb_status s = NB_OK;
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
  if (end != line + n)
    s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: text after the JSON value (column %zu)", file, (long long)lineno,
                  (size_t)(end - line) + 1);
  else if (!cJSON_IsObject(j))
    s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: expected a JSON object, got %s", file, (long long)lineno, json_kind(j));
  else if (!cJSON_IsNumber(step) || !isfinite(step->valuedouble))
    s = nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: no numeric \"step\" field", file, (long long)lineno);
  for (const cJSON *f = s == NB_OK ? j->child : NULL; f && s == NB_OK; f = f->next) {
    if (!cJSON_IsNumber(f) || !f->string || !strcmp(f->string, "step")) continue;
    if (!isfinite(f->valuedouble)) {
      m->skipped_nonfinite++;
      continue;
    }
    s = add_point(ctx, m, f->string, step->valuedouble, f->valuedouble);
  }
  if (s == NB_OK) {
    double x = step->valuedouble;
    m->min_step = m->records == 0 ? x : fmin(m->min_step, x);
    m->max_step = m->records == 0 ? x : fmax(m->max_step, x);
    m->records++;
  }
  cJSON_Delete(j);
  return s;
}

static nb_status read_metrics(nb_ctx *ctx, const char *path, metrics *m) {
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "cannot open metrics file '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size > MAX_METRICS_BYTES) {
    fclose(f);
    return nb_errorf(ctx, NB_ERR_IO, "metrics file '%s' cannot be sized or is over %zu bytes", path, MAX_METRICS_BYTES);
  }
  size_t size = (size_t)st.st_size;
  char *text = nb_alloc(ctx, size + 1);
  if (!text) {
    fclose(f);
    return NB_ERR_NOMEM;
  }
  size_t got = fread(text, 1, size, f);
  fclose(f);
  nb_status s = got == size ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "cannot read metrics file '%s'", path);
  int64_t lineno = 0;
  for (size_t at = 0; s == NB_OK && at < size;) {
    const char *nl = memchr(text + at, '\n', size - at);
    size_t len = nl ? (size_t)(nl - (text + at)) : size - at;
    lineno++;
    size_t k = 0;
    while (k < len && (text[at + k] == ' ' || text[at + k] == '\t' || text[at + k] == '\r')) k++;
    if (k < len) s = parse_line(ctx, m, path, lineno, text + at, len);
    at += len + 1;
  }
  nb_dealloc(ctx, text, size + 1);
  return s;
}

/* ---- axes ---------------------------------------------------------------- */

/* A 1-2-5 tick spacing giving about `target` intervals over [lo, hi]. */
static double nice_step(double lo, double hi, int target) {
  double raw = (hi - lo) / target, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* A tick label: one style for the whole axis (amax is its largest |value|):
 * enough decimals for the spacing, k/M for large values, a shared exponent
 * for tiny ones. */
static void fmt_tick(char *out, size_t cap, double v, double step, double amax) {
  if (fabs(v) < step * 1e-6) {
    snprintf(out, cap, "0");
    return;
  }
  double scale = 1;
  const char *suffix = "";
  char exp_suffix[16] = "";
  if (amax > 0 && amax < 1e-2) {
    int e = (int)floor(log10(amax));
    scale = pow(10, e);
    snprintf(exp_suffix, sizeof exp_suffix, "e%d", e);
    suffix = exp_suffix;
  } else if (amax >= 1e6) {
    scale = 1e6, suffix = "M";
  } else if (amax >= 1e4) {
    scale = 1e3, suffix = "k";
  }
  int decimals = (int)fmax(0, ceil(-log10(step / scale) - 1e-9));
  snprintf(out, cap, "%.*f%s", decimals, v / scale, suffix);
}

/* A value in the summary table. */
static void fmt_value(char *out, size_t cap, double v) {
  if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e7)) snprintf(out, cap, "%.4g", v);
  else snprintf(out, cap, "%.6g", v);
}

typedef struct axis {
  double lo, hi, step;
} axis;

/* Widens [lo, hi] to whole tick steps (and a flat range to a visible one). */
static axis make_axis(double lo, double hi, int target, bool integer) {
  if (hi - lo <= fabs(hi) * 1e-12) {
    double pad = lo != 0 ? fabs(lo) * 0.05 : 1;
    lo -= pad, hi += pad;
  }
  axis a = {.step = nice_step(lo, hi, target)};
  if (integer && a.step < 1) a.step = 1;
  a.lo = floor(lo / a.step + 1e-9) * a.step;
  a.hi = ceil(hi / a.step - 1e-9) * a.step;
  return a;
}

/* ---- plots ---------------------------------------------------------------- */

#define PLOT_W 560
#define PLOT_H 300
#define M_LEFT 74
#define M_RIGHT 16
#define M_TOP 30
#define M_BOTTOM 44

typedef struct plot_def {
  const char *title, *ylabel;
  const char *fields[2];
  bool smooth; /* noisy per-step quantities: draw an average over the raw line */
} plot_def;

/* The standard plots, in page order; every other field gets one of its own. */
static const plot_def standard_plots[] = {
    {"Loss", "loss (nats/token)", {"loss", "eval_loss"}, true},
    {"Learning rate", "learning rate", {"lr"}, false},
    {"Gradient norm", "global L2 norm", {"grad_norm"}, true},
    {"Throughput", "tokens / s", {"tokens_per_s"}, true},
    {"Model FLOPs utilization", "fraction of peak", {"mfu"}, true},
};
#define N_STANDARD (sizeof standard_plots / sizeof standard_plots[0])

static const char *const palette[] = {"#1f6fb4", "#d1495b", "#2a9d5c", "#8e5bb8"};

static bool is_standard_field(const char *name) {
  for (size_t i = 0; i < N_STANDARD; i++)
    for (int k = 0; k < 2; k++)
      if (standard_plots[i].fields[k] && !strcmp(standard_plots[i].fields[k], name)) return true;
  return false;
}

typedef struct frame {
  axis x, y;
  double px0, px1, py0, py1; /* plot area in SVG units; py0 is the bottom */
} frame;

static double fx(const frame *f, double x) { return f->px0 + (x - f->x.lo) / (f->x.hi - f->x.lo) * (f->px1 - f->px0); }
static double fy(const frame *f, double y) { return f->py0 - (y - f->y.lo) / (f->y.hi - f->y.lo) * (f->py0 - f->py1); }

/* The number of ticks from lo to hi; 0 for an axis that absurd input (a
 * range that overflows) left without finite numbers. */
static int ticks(const axis *a) {
  double n = (a->hi - a->lo) / a->step + 1.5;
  return n >= 1 && n <= 64 ? (int)n : 0;
}

/* The pixel column of step x, clamped to [0, cols] (and 0 for NaN). */
static int column(const frame *f, double x, int cols) {
  double c = fx(f, x) - f->px0;
  return c >= 0 ? c <= cols ? (int)c : cols : 0;
}

static void draw_axes(sbuf *b, const frame *f, const char *ylabel) {
  char t[64];
  double xmax = fmax(fabs(f->x.lo), fabs(f->x.hi)), ymax = fmax(fabs(f->y.lo), fabs(f->y.hi));
  sb_printf(b, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' class='area'/>\n", f->px0, f->py1, f->px1 - f->px0,
            f->py0 - f->py1);
  for (int i = 0, n = ticks(&f->y); i < n; i++) {
    double v = f->y.lo + i * f->y.step, y = fy(f, v);
    fmt_tick(t, sizeof t, v, f->y.step, ymax);
    sb_printf(b, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' class='grid'/>", f->px0, f->px1, y, y);
    sb_printf(b, "<text x='%.1f' y='%.1f' class='yt'>%s</text>\n", f->px0 - 6, y + 4, t);
  }
  for (int i = 0, n = ticks(&f->x); i < n; i++) {
    double v = f->x.lo + i * f->x.step, x = fx(f, v);
    fmt_tick(t, sizeof t, v, f->x.step, xmax);
    sb_printf(b, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' class='grid'/>", x, x, f->py0, f->py1);
    sb_printf(b, "<text x='%.1f' y='%.1f' class='xt'>%s</text>\n", x, f->py0 + 16, t);
  }
  sb_printf(b, "<text x='%.1f' y='%d' class='xl'>step</text>\n", (f->px0 + f->px1) / 2, PLOT_H - 6);
  sb_printf(b, "<text transform='translate(13 %.1f) rotate(-90)' class='yl'>", (f->py0 + f->py1) / 2);
  sb_esc(b, ylabel);
  sb_puts(b, "</text>\n");
}

/* The line of one series. Long series are thinned to the first, lowest,
 * highest and last point per pixel column, which keeps spikes visible. */
static void draw_series(sbuf *b, const frame *f, const series *s, const char *color, const char *cls, bool markers) {
  sb_printf(b, "<polyline class='%s' stroke='%s' points='", cls, color);
  int cols = (int)(f->px1 - f->px0);
  for (size_t i = 0; i < s->n;) {
    size_t j = i + 1;
    if (s->n > (size_t)cols * 4) {
      int col = column(f, s->x[i], cols);
      while (j < s->n && column(f, s->x[j], cols) == col) j++;
    }
    size_t lo = i, hi = i;
    for (size_t k = i; k < j; k++) {
      if (s->y[k] < s->y[lo]) lo = k;
      if (s->y[k] > s->y[hi]) hi = k;
    }
    size_t pick[4] = {i, lo < hi ? lo : hi, lo < hi ? hi : lo, j - 1};
    for (int k = 0; k < 4; k++)
      if (k == 0 || pick[k] != pick[k - 1]) sb_printf(b, "%.1f,%.1f ", fx(f, s->x[pick[k]]), fy(f, s->y[pick[k]]));
    i = j;
  }
  sb_puts(b, "'/>\n");
  if (markers && s->n <= 400)
    for (size_t i = 0; i < s->n; i++)
      sb_printf(b, "<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>", fx(f, s->x[i]), fy(f, s->y[i]), color);
}

#define SMOOTH_MIN_POINTS 200

/* TensorBoard's smoothing: a debiased exponential moving average, here with
 * a time constant of 1% of the series' points. Returns s with new y values
 * (out->y is nb_alloc'ed, s->n doubles), or false when out of memory. */
static bool smoothed(sbuf *b, const series *s, series *out) {
  double *y = nb_alloc(b->ctx, s->n * sizeof(double));
  if (!y) return b->oom = true, false;
  double a = exp(-100.0 / (double)s->n), ema = 0, weight = 1;
  for (size_t i = 0; i < s->n; i++) {
    ema = a * ema + (1 - a) * s->y[i];
    weight *= a;
    y[i] = ema / (1 - weight);
  }
  *out = *s;
  out->y = y;
  return true;
}

/* One card: title, SVG with axes, lines and a legend. With smooth, series of
 * at least SMOOTH_MIN_POINTS points are drawn faint with their average over
 * them. */
static void draw_plot(sbuf *b, const char *title, const char *ylabel, const series *const *ss, int n, bool smooth) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < ss[k]->n; i++) {
      xlo = fmin(xlo, ss[k]->x[i]), xhi = fmax(xhi, ss[k]->x[i]);
      ylo = fmin(ylo, ss[k]->y[i]), yhi = fmax(yhi, ss[k]->y[i]);
    }
  frame f = {.x = make_axis(xlo, xhi, 6, true), .y = make_axis(ylo, yhi, 5, false), .px0 = M_LEFT,
             .px1 = PLOT_W - M_RIGHT, .py0 = PLOT_H - M_BOTTOM, .py1 = M_TOP};
  sb_puts(b, "<figure class='card'><figcaption>");
  sb_esc(b, title);
  sb_printf(b, "</figcaption>\n<svg viewBox='0 0 %d %d' role='img'>\n", PLOT_W, PLOT_H);
  draw_axes(b, &f, ylabel);
  bool any_smoothed = false;
  for (int k = 0; k < n; k++) {
    const char *color = palette[k % 4];
    series avg;
    if (smooth && ss[k]->n >= SMOOTH_MIN_POINTS && smoothed(b, ss[k], &avg)) {
      draw_series(b, &f, ss[k], color, "line raw", false);
      draw_series(b, &f, &avg, color, "line", false);
      nb_dealloc(b->ctx, avg.y, avg.n * sizeof(double));
      any_smoothed = true;
    } else { /* markers on short or sparse (eval) series */
      draw_series(b, &f, ss[k], color, "line", ss[k]->n <= 60 || (k > 0 && ss[k]->n * 4 <= ss[0]->n));
    }
  }
  double lx = f.px0 + 8; /* legend, in the top margin */
  for (int k = 0; k < n; k++) {
    sb_printf(b, "<line x1='%.1f' x2='%.1f' y1='14' y2='14' stroke='%s' class='key'/>", lx, lx + 18, palette[k % 4]);
    sb_printf(b, "<text x='%.1f' y='18' class='lg'>", lx + 24);
    sb_esc(b, ss[k]->name);
    sb_puts(b, "</text>\n");
    lx += 40 + 7.5 * (double)strlen(ss[k]->name);
  }
  if (any_smoothed)
    sb_printf(b, "<text x='%.1f' y='18' class='note'>faint: every step; bold: moving average</text>\n", f.px1);
  sb_puts(b, "</svg></figure>\n");
}

/* ---- the page -------------------------------------------------------------- */

static const char page_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1d2733;"
    "background:#f4f6f9;margin:0;padding:24px 32px}\n"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 10px}\n"
    ".sub{color:#5b6675;margin:0 0 18px}\n"
    ".grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:16px}\n"
    ".card{background:#fff;border:1px solid #dde3ea;border-radius:8px;margin:0;padding:10px 12px 4px}\n"
    "figcaption{font-weight:600;margin-bottom:2px}svg{width:100%;max-width:760px;height:auto;display:block}\n"
    "svg text{font:11px system-ui,Helvetica,Arial,sans-serif;fill:#4a5563}\n"
    ".area{fill:#fbfcfd;stroke:#c9d1da}.grid{stroke:#e6eaef;stroke-width:1}\n"
    ".yt{text-anchor:end}.xt{text-anchor:middle}.xl,.yl{text-anchor:middle;font-size:12px;fill:#2f3a47}\n"
    ".lg{font-size:12px;fill:#1d2733}.key{stroke-width:3}\n"
    ".line{fill:none;stroke-width:1.6;stroke-linejoin:round}.raw{stroke-width:1;opacity:.3}\n"
    ".note{text-anchor:end;font-size:10.5px;fill:#7a8594}\n"
    "table{border-collapse:collapse;background:#fff;border:1px solid #dde3ea}\n"
    "th,td{padding:5px 12px;border-bottom:1px solid #e6eaef;text-align:right;font-variant-numeric:tabular-nums}\n"
    "th:first-child,td:first-child{text-align:left}thead th{background:#eef2f6}\n"
    ".kv td:first-child{color:#5b6675}.empty{color:#5b6675;font-style:italic}\n";

static double mean_of(const series *s) {
  double sum = 0;
  for (size_t i = 0; i < s->n; i++) sum += s->y[i];
  return sum / (double)s->n;
}

static size_t argmin(const series *s) {
  size_t k = 0;
  for (size_t i = 1; i < s->n; i++)
    if (s->y[i] < s->y[k]) k = i;
  return k;
}

static void kv_row(sbuf *b, const char *key, const char *value) {
  sb_printf(b, "<tr><td>%s</td><td>", key);
  sb_esc(b, value);
  sb_puts(b, "</td></tr>\n");
}

static void write_summary(sbuf *b, const metrics *m) {
  char v[128], w[64];
  sb_puts(b, "<h2>Summary</h2>\n<table class='kv'>\n");
  fmt_value(v, sizeof v, m->min_step);
  fmt_value(w, sizeof w, m->max_step);
  char steps[256];
  snprintf(steps, sizeof steps, "%lld records, steps %s to %s", (long long)m->records, v, w);
  kv_row(b, "steps", steps);
  const series *loss = find_series(m, "loss"), *eval = find_series(m, "eval_loss"), *tps = find_series(m, "tokens_per_s");
  for (int k = 0; k < 2; k++) {
    const series *s = k ? eval : loss;
    if (!s) continue;
    fmt_value(v, sizeof v, s->y[s->n - 1]);
    kv_row(b, k ? "last eval loss" : "last loss", v);
    size_t i = argmin(s);
    fmt_value(v, sizeof v, s->y[i]);
    fmt_value(w, sizeof w, s->x[i]);
    snprintf(steps, sizeof steps, "%s (step %s)", v, w);
    kv_row(b, k ? "min eval loss" : "min loss", steps);
  }
  if (tps) {
    fmt_value(v, sizeof v, mean_of(tps));
    kv_row(b, "mean tokens/s", v);
  }
  if (m->skipped_nonfinite) {
    snprintf(v, sizeof v, "%lld", (long long)m->skipped_nonfinite);
    kv_row(b, "non-finite values skipped", v);
  }
  sb_puts(b, "</table>\n<h2>Fields</h2>\n<table>\n<thead><tr><th>field</th><th>points</th><th>last</th>"
             "<th>min</th><th>max</th><th>mean</th></tr></thead>\n");
  for (size_t i = 0; i < m->ns; i++) {
    const series *s = &m->s[i];
    double mx = s->y[0];
    for (size_t k = 1; k < s->n; k++) mx = fmax(mx, s->y[k]);
    double cols[4] = {s->y[s->n - 1], s->y[argmin(s)], mx, mean_of(s)};
    sb_puts(b, "<tr><td>");
    sb_esc(b, s->name);
    sb_printf(b, "</td><td>%zu</td>", s->n);
    for (int k = 0; k < 4; k++) {
      fmt_value(v, sizeof v, cols[k]);
      sb_printf(b, "<td>%s</td>", v);
    }
    sb_puts(b, "</tr>\n");
  }
  sb_puts(b, "</table>\n");
}

static void write_page(sbuf *b, const metrics *m, const char *title, const char *source) {
  sb_puts(b, "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n<title>");
  sb_esc(b, title);
  sb_printf(b, "</title>\n<style>\n%s</style></head>\n<body>\n<h1>", page_css);
  sb_esc(b, title);
  sb_puts(b, "</h1>\n<p class='sub'>nabla training report from <code>");
  sb_esc(b, source);
  sb_puts(b, "</code></p>\n");
  if (m->records == 0) {
    sb_puts(b, "<p class='empty'>No metrics yet: the file has no records.</p>\n</body></html>\n");
    return;
  }
  sb_puts(b, "<div class='grid2'>\n");
  for (size_t i = 0; i < N_STANDARD; i++) {
    const series *ss[2];
    int n = 0;
    for (int k = 0; k < 2; k++) {
      const series *s = standard_plots[i].fields[k] ? find_series(m, standard_plots[i].fields[k]) : NULL;
      if (s) ss[n++] = s;
    }
    if (n) draw_plot(b, standard_plots[i].title, standard_plots[i].ylabel, ss, n, standard_plots[i].smooth);
  }
  for (size_t i = 0; i < m->ns; i++) {
    const series *s = &m->s[i];
    if (!is_standard_field(s->name)) draw_plot(b, s->name, s->name, &s, 1, false);
  }
  sb_puts(b, "</div>\n");
  write_summary(b, m);
  sb_puts(b, "</body></html>\n");
}

/* ---- public API ------------------------------------------------------------ */

nb_status nb_prof_report_html(nb_ctx *ctx, const char *metrics_jsonl, const char *out_html, const char *title) {
  if (!ctx) return NB_ERR_INVALID_ARG;
  if (!metrics_jsonl || !out_html)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_prof_report_html: %s is NULL", metrics_jsonl ? "out_html" : "metrics_jsonl");
  metrics m = {0};
  nb_status s = read_metrics(ctx, metrics_jsonl, &m);
  if (s == NB_OK) {
    const char *base = strrchr(metrics_jsonl, '/');
    sbuf b = {.ctx = ctx};
    write_page(&b, &m, title ? title : base ? base + 1 : metrics_jsonl, metrics_jsonl);
    s = b.oom ? nb_errorf(ctx, NB_ERR_NOMEM, "out of memory while drawing the report for '%s'", metrics_jsonl)
              : nb_prof__write_atomic(ctx, out_html, b.p, b.n);
    if (b.p) nb_dealloc(ctx, b.p, b.cap);
  }
  metrics_free(ctx, &m);
  return s;
}
