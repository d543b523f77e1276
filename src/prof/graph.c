/* The graph viewer: an executable's steps (fused kernels, library calls,
 * evaluated and control steps) as nodes and the buffers between them as
 * edges labelled with type and size, laid out in layers (a step sits one
 * layer below the lowest of the steps whose results it reads; a layer of
 * many steps wraps into rows) and drawn as SVG by hand: no Graphviz, whose
 * library would be the one dependency of prof that a build must find for a
 * picture this regular. Not here: the model (view.c). */
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "prof/view.h"

#define NODE_H 26.0
#define ROW_GAP 46.0
#define COL_GAP 14.0
#define MARGIN 16.0
#define ROW_MAX 24 /* steps per row before a layer wraps */
#define CHAR_W 6.4 /* of the 11 px font, for widths */
#define LABEL_EDGES 600 /* more edges than this: sizes in tooltips only */

typedef struct node {
  int layer, row;
  double x, y, w;
} node;

/* the step that writes value id (through views and in-place updates: the
 * one writing the memory it lives in), or -1 */
static int producer(const nb_prof__view *v, const int *writer, uint32_t id) {
  for (int hops = 0; id < v->nvalues && hops < 64; hops++) {
    if (writer[id] >= 0) return writer[id];
    if (v->value_shares[id] < 0) return -1;
    id = (uint32_t)v->value_shares[id];
  }
  return -1;
}

static const char *fill_of(const char *kind) {
  if (!strcmp(kind, "gemm")) return "#f6d7a7";
  if (!strcmp(kind, "eval")) return "#d9d2e9";
  if (!strcmp(kind, "control")) return "#f4c7c3";
  return "#cfe2f3";
}

/* node positions; returns the drawing's size in *w, *h */
static void layout(const nb_prof__view *v, const int *writer, node *nd, double *w, double *h) {
  int nl = 0;
  for (int s = 0; s < v->nsteps; s++) {
    int layer = 0;
    for (size_t i = 0; i < v->steps[s].noperands; i++) {
      if (v->steps[s].written[i]) continue;
      int p = producer(v, writer, v->steps[s].values[i]);
      if (p >= 0 && p < s && nd[p].layer + 1 > layer) layer = nd[p].layer + 1;
    }
    nd[s].layer = layer;
    if (layer + 1 > nl) nl = layer + 1;
    size_t len = strlen(v->steps[s].name);
    nd[s].w = 16 + CHAR_W * (double)(len > 48 ? 48 : len);
  }
  /* rows: each layer's steps in step order, ROW_MAX to a row */
  int *count = calloc((size_t)nl + 1, sizeof *count), *first_row = calloc((size_t)nl + 1, sizeof *first_row);
  if (!count || !first_row) {
    free(count), free(first_row);
    for (int s = 0; s < v->nsteps; s++) nd[s].x = MARGIN, nd[s].y = MARGIN + s * (NODE_H + ROW_GAP); /* a column */
    *w = 400, *h = MARGIN * 2 + v->nsteps * (NODE_H + ROW_GAP);
    return;
  }
  for (int s = 0; s < v->nsteps; s++) count[nd[s].layer]++;
  int rows = 0;
  for (int l = 0; l < nl; l++) first_row[l] = rows, rows += (count[l] + ROW_MAX - 1) / ROW_MAX;
  double *row_w = calloc((size_t)rows + 1, sizeof *row_w);
  memset(count, 0, ((size_t)nl + 1) * sizeof *count);
  double widest = 0;
  for (int s = 0; s < v->nsteps; s++) {
    int l = nd[s].layer, r = first_row[l] + count[l]++ / ROW_MAX;
    nd[s].row = r;
    if (row_w) {
      nd[s].x = row_w[r];
      row_w[r] += nd[s].w + COL_GAP;
      if (row_w[r] > widest) widest = row_w[r];
    }
    nd[s].y = MARGIN + r * (NODE_H + ROW_GAP);
  }
  for (int s = 0; row_w && s < v->nsteps; s++) nd[s].x += MARGIN + (widest - row_w[nd[s].row]) / 2; /* rows centred */
  *w = widest + 2 * MARGIN;
  *h = 2 * MARGIN + rows * (NODE_H + ROW_GAP) - ROW_GAP;
  free(row_w), free(count), free(first_row);
}

/* an edge leaves its producer's bottom and enters its consumer's top at
 * points spread along them (the k-th of n), so that edges between the same
 * nodes stay apart; its type and size are written beside it when it spans
 * one row (longer ones cross other nodes: the size is in the tooltip) */
static void put_edge(FILE *f, const nb_prof__view *v, const node *a, int ka, int na, const node *b, int kb, int nb, uint32_t id,
                     bool label) {
  double x0 = a->x + a->w * (ka + 1) / (na + 1), y0 = a->y + NODE_H, x1 = b->x + b->w * (kb + 1) / (nb + 1), y1 = b->y;
  double dy = (y1 - y0) / 2;
  char size[32];
  nb_prof__bytes_str((double)v->value_bytes[id], size, sizeof size);
  fprintf(f, "<g class=\"edge\"><path d=\"M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f\" fill=\"none\" stroke=\"#7a869a\" "
             "stroke-width=\"1\" marker-end=\"url(#nb-arrow)\"/>",
          x0, y0, x0, y0 + dy, x1, y1 - dy, x1, y1);
  if (label && b->row == a->row + 1) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#444\">", (x0 + x1) / 2 + 3, (y0 + y1) / 2 + 3);
    nb_prof__xml_text(f, v->value_type[id]);
    fprintf(f, " %s</text>", size);
  }
  fputs("<title>", f);
  nb_prof__xml_text(f, v->value_type[id]);
  fprintf(f, ", %s (value %u)</title></g>\n", size, id);
}

static void put_node(FILE *f, const nb_prof__view *v, const node *n, int s) {
  const nb_prof__step *st = &v->steps[s];
  fprintf(f, "<g class=\"step\" id=\"step-%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"4\" fill=\"%s\" "
             "stroke=\"#4a5568\"/>",
          s, n->x, n->y, n->w, NODE_H, fill_of(st->kind));
  size_t len = strlen(st->name);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", n->x + 8, n->y + 17);
  char shown[64];
  snprintf(shown, sizeof shown, len > 48 ? "%.45s..." : "%s", st->name);
  nb_prof__xml_text(f, shown);
  fprintf(f, "</text><title>step %d: ", s);
  nb_prof__xml_text(f, st->name);
  fprintf(f, " (%s)%s", st->kind, st->at[0] ? " at " : "");
  nb_prof__xml_text(f, st->at);
  fprintf(f, "\n%.4g flops, %.4g bytes</title></g>\n", st->flops, st->bytes);
}

void nb_prof__graph_svg(FILE *f, const nb_prof__view *v, bool standalone) {
  node *nd = calloc((size_t)v->nsteps + 1, sizeof *nd);
  int *writer = malloc((v->nvalues + 1) * sizeof *writer);
  double w = 200, h = 60;
  if (nd && writer) {
    for (size_t i = 0; i < v->nvalues; i++) writer[i] = -1;
    for (int s = 0; s < v->nsteps; s++)
      for (size_t i = 0; i < v->steps[s].noperands; i++)
        if (v->steps[s].written[i] && v->steps[s].values[i] < v->nvalues) writer[v->steps[s].values[i]] = s;
    layout(v, writer, nd, &w, &h);
  }
  if (standalone) fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"nb-graph\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
             "font-family=\"sans-serif\">\n",
          w, h < 60 ? 60 : h, w, h < 60 ? 60 : h);
  fputs("<defs><marker id=\"nb-arrow\" viewBox=\"0 0 8 8\" refX=\"8\" refY=\"4\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\">"
        "<path d=\"M0 0 L8 4 L0 8 Z\" fill=\"#7a869a\"/></marker></defs>\n",
        f);
  int *in = nd && writer ? calloc(2 * (size_t)v->nsteps + 1, sizeof *in) : NULL, *out = in ? in + v->nsteps : NULL;
  if (!in || v->nsteps == 0) {
    fprintf(f, "<text x=\"10\" y=\"30\" font-size=\"12\">%s</text>\n", v->nsteps ? "out of memory drawing the graph" : "no compiled steps");
  } else {
    size_t nedges = 0;
    for (int s = 0; s < v->nsteps; s++)
      for (size_t i = 0; i < v->steps[s].noperands; i++) {
        int p = v->steps[s].written[i] ? -1 : producer(v, writer, v->steps[s].values[i]);
        if (p >= 0 && p < s) nedges++, in[s]++, out[p]++;
      }
    int *in_k = calloc(2 * (size_t)v->nsteps + 1, sizeof *in_k), *out_k = in_k ? in_k + v->nsteps : NULL;
    for (int s = 0; in_k && s < v->nsteps; s++)
      for (size_t i = 0; i < v->steps[s].noperands; i++) {
        int p = v->steps[s].written[i] ? -1 : producer(v, writer, v->steps[s].values[i]);
        if (p >= 0 && p < s)
          put_edge(f, v, &nd[p], out_k[p]++, out[p], &nd[s], in_k[s]++, in[s], v->steps[s].values[i], nedges <= LABEL_EDGES);
      }
    free(in_k);
    for (int s = 0; s < v->nsteps; s++) put_node(f, v, &nd[s], s);
  }
  free(in);
  fputs("</svg>\n", f);
  free(nd);
  free(writer);
}

void nb_prof__graph_section(FILE *f, const char *title, const char *svg) {
  fputs("<section class=\"nb-graph\">\n<h2>Graph: ", f);
  nb_prof__xml_text(f, title);
  fputs("</h2>\n<p>Steps in run order by layer: fused kernels (blue), library calls (orange), evaluated equations (violet), "
        "control steps (red); an edge is a buffer one step writes and a later one reads (type and size; hover for details)."
        "</p>\n<div style=\"overflow:auto;max-height:80vh\">\n",
        f);
  if (svg) fputs(svg, f);
}

void nb_prof__graph_html(FILE *f, const nb_prof__view *v) {
  nb_prof__graph_section(f, v->title, NULL);
  nb_prof__graph_svg(f, v, false);
  fputs("</div>\n</section>\n", f);
}

/* ---- the API ---------------------------------------------------------------- */

static void standalone_svg(FILE *f, const nb_prof__view *v) { nb_prof__graph_svg(f, v, true); }

nb_status nb_prof_graph_svg(nb_ctx *ctx, const nb_exe *exe, FILE *out) {
  return nb_prof__view_draw(ctx, exe, out, "nb_prof_graph_svg", standalone_svg);
}

nb_status nb_prof_graph_html(nb_ctx *ctx, const nb_exe *exe, FILE *out) {
  return nb_prof__view_draw(ctx, exe, out, "nb_prof_graph_html", nb_prof__graph_html);
}
