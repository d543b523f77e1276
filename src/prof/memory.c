/* The memory viewer: an executable's buffers over its schedule of steps
 * (view.h) as JSON ("nabla-memory/1", docs/prof.md) and as an HTML section
 * whose inline SVG draws the live bytes per step with the peak marked and
 * the arena as rectangles over step x offset. Not here: the model (view.c),
 * which executables a trace keeps (session.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "prof/view.h"

void nb_prof__bytes_str(double bytes, char *buf, size_t cap) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (fabs(bytes) >= 1024 && u < 4) bytes /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

/* ---- what is live at the peak, by source ------------------------------------ */

/* inputs by their path's first component ("params"), the rest by op and place */
static void source_of(const nb_prof__block *b, char *buf, size_t cap) {
  if (b->kind == NB_EXE_BUF_INPUT) {
    const char *slash = strchr(b->name, '/');
    snprintf(buf, cap, "input %.*s", slash ? (int)(slash - b->name) : (int)strlen(b->name), b->name);
  } else {
    snprintf(buf, cap, "%s%s%s", b->op, b->at[0] ? " at " : "", b->at);
  }
}

typedef struct source {
  char key[128];
  size_t bytes, count;
} source;

static int by_source_bytes(const void *a, const void *b) {
  const source *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return strcmp(x->key, y->key);
}

/* the peak's blocks grouped by source, largest first; *n of them (malloc'ed) */
static source *peak_sources(const nb_prof__view *v, const size_t *ix, size_t n, size_t *nsrc) {
  source *s = calloc(n + 1, sizeof *s);
  *nsrc = 0;
  if (!s) return NULL;
  for (size_t i = 0; i < n; i++) {
    char key[128];
    source_of(&v->blocks[ix[i]], key, sizeof key);
    size_t k = 0;
    while (k < *nsrc && strcmp(s[k].key, key)) k++;
    if (k == *nsrc) snprintf(s[(*nsrc)++].key, sizeof s->key, "%s", key);
    s[k].bytes += v->blocks[ix[i]].bytes;
    s[k].count++;
  }
  qsort(s, *nsrc, sizeof *s, by_source_bytes);
  return s;
}

/* ---- JSON ------------------------------------------------------------------- */

static void put_block(FILE *f, const nb_prof__block *b) {
  fputs("{\"kind\":", f);
  nb_prof__json_str(f, nb_prof__kind_name(b->kind));
  fputs(",\"name\":", f);
  nb_prof__json_str(f, b->name);
  fputs(",\"op\":", f);
  nb_prof__json_str(f, b->op);
  fputs(",\"at\":", f);
  nb_prof__json_str(f, b->at);
  fputs(",\"type\":", f);
  nb_prof__json_str(f, b->type);
  if (b->offset >= 0) fprintf(f, ",\"offset\":%lld", (long long)b->offset);
  else fputs(",\"offset\":null", f);
  fprintf(f, ",\"bytes\":%zu,\"first\":%d,\"last\":%d,\"written\":%d", b->bytes, b->first, b->last, b->written);
  if (b->donated_to[0]) {
    fputs(",\"donated_to\":", f);
    nb_prof__json_str(f, b->donated_to);
  }
  fputc('}', f);
}

static void put_view(FILE *f, const nb_prof__view *v) {
  fputs("{\"title\":", f);
  nb_prof__json_str(f, v->title);
  fprintf(f, ",\"steps\":%d,\"runs\":%llu,\"run_ms\":%.3f,\"arena_bytes\":%zu,\"held_bytes\":%zu,", v->nsteps,
          (unsigned long long)v->runs, v->run_ms, v->arena_bytes, v->held);
  fprintf(f, "\n \"peak\":{\"bytes\":%zu,\"step\":%d,\"step_name\":", v->peak, v->peak_step);
  nb_prof__json_str(f, v->peak_step >= 0 ? v->steps[v->peak_step].name : "");
  fputs("},\n \"step_names\":[", f);
  for (int s = 0; s < v->nsteps; s++) {
    if (s) fputc(',', f);
    nb_prof__json_str(f, v->steps[s].name);
  }
  fputs("],\n \"live_bytes\":[", f);
  for (int s = 0; s < v->nsteps; s++) fprintf(f, "%s%zu", s ? "," : "", v->live[s]);
  fputs("],\n \"buffers\":[", f);
  for (size_t i = 0; i < v->nblocks; i++) {
    fputs(i ? ",\n  " : "\n  ", f);
    put_block(f, &v->blocks[i]);
  }
  size_t n = 0, nsrc = 0;
  size_t *ix = nb_prof__view_peak_set(v, &n);
  source *src = ix ? peak_sources(v, ix, n, &nsrc) : NULL;
  fputs("],\n \"live_at_peak\":[", f);
  for (size_t i = 0; ix && i < n; i++) {
    const nb_prof__block *b = &v->blocks[ix[i]];
    fprintf(f, "%s{\"buffer\":%zu,\"name\":", i ? ",\n  " : "\n  ", ix[i]);
    nb_prof__json_str(f, b->name);
    fputs(",\"kind\":", f);
    nb_prof__json_str(f, nb_prof__kind_name(b->kind));
    fprintf(f, ",\"bytes\":%zu}", b->bytes);
  }
  fputs("],\n \"peak_by_source\":[", f);
  for (size_t i = 0; src && i < nsrc; i++) {
    fputs(i ? ",\n  {\"source\":" : "\n  {\"source\":", f);
    nb_prof__json_str(f, src[i].key);
    fprintf(f, ",\"bytes\":%zu,\"buffers\":%zu}", src[i].bytes, src[i].count);
  }
  fputs("]}", f);
  free(ix);
  free(src);
}

void nb_prof__memory_json(FILE *f, const nb_prof__view *const *v, size_t n, const nb_prof__kv *kv) {
  fputs("{\"format\":\"nabla-memory/1\",\"executables\":[", f);
  for (size_t i = 0; i < n; i++) {
    fputs(i ? ",\n" : "\n", f);
    put_view(f, v[i]);
  }
  fputs("\n]", f);
  if (kv) {
    fputs(",\n\"kv_cache\":", f);
    nb_prof__kv_json(f, kv);
  }
  fputs("}\n", f);
}

/* ---- HTML --------------------------------------------------------------------- */

#define W 960.0   /* the SVG's width */
#define LEFT 70.0 /* room for the y labels */
#define RIGHT 10.0
#define LIVE_H 150.0
#define ARENA_H 320.0

static const char *const palette[] = {"#1f6fb4", "#d1495b", "#2a9d5c", "#8e5bb8", "#e08a1e", "#2aa1b3", "#7a6a4f", "#c55a9b"};

static const char *color_of(const char *op) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)op; *p; p++) h = (h ^ *p) * 16777619u;
  return palette[h % (sizeof palette / sizeof *palette)];
}

static double step_x(const nb_prof__view *v, double s) { return LEFT + s * (W - LEFT - RIGHT) / (v->nsteps > 0 ? v->nsteps : 1); }

static void svg_live(FILE *f, const nb_prof__view *v, double y0) {
  double top = (double)v->peak > 0 ? (double)v->peak : 1, bottom = y0 + LIVE_H;
  char b[32];
  nb_prof__bytes_str(top, b, sizeof b);
  fprintf(f, "<text x=\"4\" y=\"%.1f\" font-size=\"11\">%s</text><text x=\"4\" y=\"%.1f\" font-size=\"11\">0</text>\n", y0 + 10,
          b, bottom);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">live bytes per step</text>\n", LEFT + 4, y0 + 12);
  fprintf(f, "<path class=\"live\" fill=\"#9ec3e6\" stroke=\"#1f6fb4\" stroke-width=\"1\" d=\"M%.1f %.1f", step_x(v, 0), bottom);
  for (int s = 0; s < v->nsteps; s++) {
    double y = bottom - (double)v->live[s] / top * (LIVE_H - 16);
    fprintf(f, " L%.1f %.1f L%.1f %.1f", step_x(v, s), y, step_x(v, s + 1), y);
  }
  fprintf(f, " L%.1f %.1f Z\"/>\n", step_x(v, v->nsteps), bottom);
  double held = bottom - (double)v->held / top * (LIVE_H - 16);
  fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" stroke-dasharray=\"4 3\"><title>held for the whole run: "
             "inputs, constants, outputs</title></line>\n",
          LEFT, W - RIGHT, held, held);
}

static void svg_arena(FILE *f, const nb_prof__view *v, double y0) {
  double top = v->arena_bytes > 0 ? (double)v->arena_bytes : 1;
  char b[32];
  nb_prof__bytes_str(top, b, sizeof b);
  fprintf(f, "<text x=\"4\" y=\"%.1f\" font-size=\"11\">%s</text><text x=\"4\" y=\"%.1f\" font-size=\"11\">0</text>\n", y0 + 10,
          b, y0 + ARENA_H);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">arena: offset over steps</text>\n", LEFT + 4, y0 - 4);
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#bbb\"/>\n", LEFT, y0, W - LEFT - RIGHT,
          ARENA_H);
  for (size_t i = 0; i < v->nblocks; i++) {
    const nb_prof__block *k = &v->blocks[i];
    if (k->kind != NB_EXE_BUF_TEMP || k->offset < 0) continue;
    double x0 = step_x(v, k->first), x1 = step_x(v, k->last + 1);
    double ya = y0 + ARENA_H - ((double)k->offset + (double)k->bytes) / top * ARENA_H;
    double h = (double)k->bytes / top * ARENA_H;
    char sz[32];
    nb_prof__bytes_str((double)k->bytes, sz, sizeof sz);
    fprintf(f, "<rect class=\"buf\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" fill-opacity=\"0.75\" stroke=\"#fff\" "
               "stroke-width=\"0.3\"><title>",
            x0, ya, x1 - x0 > 0.5 ? x1 - x0 : 0.5, h > 0.5 ? h : 0.5, color_of(k->op));
    nb_prof__xml_text(f, k->name);
    fprintf(f, "\n%s, offset %lld, steps %d-%d</title></rect>\n", sz, (long long)k->offset, k->first, k->last);
  }
}

void nb_prof__memory_html(FILE *f, const nb_prof__view *v) {
  char peak[32], held[32], arena[32];
  nb_prof__bytes_str((double)v->peak, peak, sizeof peak);
  nb_prof__bytes_str((double)v->held, held, sizeof held);
  nb_prof__bytes_str((double)v->arena_bytes, arena, sizeof arena);
  fputs("<section class=\"nb-memory\">\n<h2>Memory: ", f);
  nb_prof__xml_text(f, v->title);
  fprintf(f, "</h2>\n<p>Peak <b>%s</b>", peak);
  if (v->peak_step >= 0) {
    fprintf(f, " at step %d (<code>", v->peak_step);
    nb_prof__xml_text(f, v->steps[v->peak_step].name);
    fputs("</code>)", f);
  }
  fprintf(f, "; %s of it held for the whole run (inputs, constants, outputs); the arena of intermediates is %s.", held, arena);
  if (v->runs) fprintf(f, " Ran %llu times in the trace, %.3f ms in all.", (unsigned long long)v->runs, v->run_ms);
  fputs("</p>\n", f);
  if (v->nsteps > 0) {
    double y_arena = LIVE_H + 40, h = y_arena + ARENA_H + 24;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
            W, h, W, h);
    svg_live(f, v, 8);
    svg_arena(f, v, y_arena);
    double px = step_x(v, v->peak_step + 0.5);
    fprintf(f, "<line class=\"peak\" x1=\"%.1f\" x2=\"%.1f\" y1=\"8\" y2=\"%.1f\" stroke=\"#d1495b\" stroke-width=\"1.5\"/>\n", px, px,
            y_arena + ARENA_H);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#d1495b\"%s>peak %s, step %d</text>\n", px + (px > W / 2 ? -4 : 4),
            20.0, px > W / 2 ? " text-anchor=\"end\"" : "", peak, v->peak_step);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">step 0</text><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
               "text-anchor=\"end\">step %d</text>\n",
            LEFT, h - 6, W - RIGHT, h - 6, v->nsteps - 1);
    fputs("</svg>\n", f);
  }
  size_t n = 0, nsrc = 0;
  size_t *ix = nb_prof__view_peak_set(v, &n);
  source *src = ix ? peak_sources(v, ix, n, &nsrc) : NULL;
  fputs("<h3>Live at the peak, by source</h3>\n<table class=\"nb-peak-sources\"><tr><th>source</th><th>buffers</th><th>bytes</th><th>share</th></tr>\n", f);
  for (size_t i = 0; src && i < nsrc && i < 30; i++) {
    char b[32];
    nb_prof__bytes_str((double)src[i].bytes, b, sizeof b);
    fputs("<tr><td>", f);
    nb_prof__xml_text(f, src[i].key);
    fprintf(f, "</td><td>%zu</td><td>%s</td><td>%.1f%%</td></tr>\n", src[i].count, b,
            v->peak ? 100.0 * (double)src[i].bytes / (double)v->peak : 0.0);
  }
  fputs("</table>\n<h3>Live at the peak, largest first</h3>\n<table class=\"nb-peak-buffers\"><tr><th>buffer</th><th>kind</th><th>type</th><th>bytes</th><th>steps</th></tr>\n", f);
  for (size_t i = 0; ix && i < n && i < 40; i++) {
    const nb_prof__block *b = &v->blocks[ix[i]];
    char sz[32];
    nb_prof__bytes_str((double)b->bytes, sz, sizeof sz);
    fputs("<tr><td>", f);
    nb_prof__xml_text(f, b->name);
    fprintf(f, "</td><td>%s</td><td>", nb_prof__kind_name(b->kind));
    nb_prof__xml_text(f, b->type);
    fprintf(f, "</td><td>%s</td><td>%d-%d</td></tr>\n", sz, b->first, b->last);
  }
  if (n > 40) fprintf(f, "<tr><td colspan=\"5\">... and %zu more</td></tr>\n", n - 40);
  fputs("</table>\n</section>\n", f);
  free(ix);
  free(src);
}

/* ---- the API ---------------------------------------------------------------- */

static void one_json(FILE *f, const nb_prof__view *v) { nb_prof__memory_json(f, &v, 1, NULL); }

nb_status nb_prof_memory_json(nb_ctx *ctx, const nb_exe *exe, FILE *out) {
  return nb_prof__view_draw(ctx, exe, out, "nb_prof_memory_json", one_json);
}

nb_status nb_prof_memory_html(nb_ctx *ctx, const nb_exe *exe, FILE *out) {
  return nb_prof__view_draw(ctx, exe, out, "nb_prof_memory_html", nb_prof__memory_html);
}
