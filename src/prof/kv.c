/* The serving engine's KV blocks in a trace: the engine records counters
 * (src/serve/engine.c: "kv blocks" with used, free, cached and sequences
 * after each planned step, "kv blocks: request ID/SAMPLE" per sequence, 0
 * when it gives its blocks back); at nb_prof_stop they become the KV part
 * of the memory viewer: the timeline, the peak of used blocks and what
 * each sequence held then (its latest sample at or before the peak). Not
 * here: recording (serve, util). */
#include <stdlib.h>
#include <string.h>

#include "prof/internal.h"
#include "prof/view.h"
#include "util/trace.h"

#define SEQ_PREFIX "kv blocks: "

static double arg(const nb_util__trace_event *e, const char *key) {
  for (int i = 0; i < e->nargs; i++)
    if (e->args[i].key && !e->args[i].is_str && !strcmp(e->args[i].key, key)) return e->args[i].num;
  return 0;
}

static int by_time(const void *a, const void *b) {
  const nb_util__trace_event *x = *(const nb_util__trace_event *const *)a, *y = *(const nb_util__trace_event *const *)b;
  return (x->t0 > y->t0) - (x->t0 < y->t0);
}

static int by_blocks(const void *a, const void *b) {
  const nb_prof__kv_seq *x = a, *y = b;
  if (x->blocks != y->blocks) return x->blocks < y->blocks ? 1 : -1;
  return strcmp(x->name, y->name);
}

void nb_prof__kv_free(nb_prof__kv *kv) {
  free(kv->samples);
  free(kv->seqs);
  memset(kv, 0, sizeof *kv);
}

nb_status nb_prof__kv_build(nb_ctx *ctx, const nb_util__trace_event *ev, size_t n, int64_t t_start, nb_prof__kv *kv) {
  memset(kv, 0, sizeof *kv);
  size_t nc = 0;
  for (size_t i = 0; i < n; i++) nc += ev[i].counter && !strncmp(ev[i].name, "kv blocks", 9);
  if (!nc) return NB_OK;
  const nb_util__trace_event **ix = malloc(nc * sizeof *ix);
  kv->samples = calloc(nc, sizeof *kv->samples);
  kv->seqs = calloc(nc, sizeof *kv->seqs);
  if (!ix || !kv->samples || !kv->seqs) {
    free(ix);
    nb_prof__kv_free(kv);
    return nb_errorf(ctx, NB_ERR_NOMEM, "nb_prof_stop: out of memory for the KV blocks");
  }
  nc = 0;
  for (size_t i = 0; i < n; i++)
    if (ev[i].counter && !strncmp(ev[i].name, "kv blocks", 9)) ix[nc++] = &ev[i];
  qsort(ix, nc, sizeof *ix, by_time);
  int64_t t_peak = 0;
  for (size_t i = 0; i < nc; i++) {
    if (strcmp(ix[i]->name, "kv blocks")) continue;
    nb_prof__kv_sample *s = &kv->samples[kv->nsamples++];
    *s = (nb_prof__kv_sample){(double)(ix[i]->t0 - t_start) * 1e-3, arg(ix[i], "used"), arg(ix[i], "free"), arg(ix[i], "cached"),
                              arg(ix[i], "sequences")};
    if (kv->nsamples == 1 || s->used > kv->samples[kv->peak].used) kv->peak = kv->nsamples - 1, t_peak = ix[i]->t0;
  }
  /* each sequence's latest sample at or before the peak (samples of one time come together) */
  for (size_t i = 0; kv->nsamples && i < nc && ix[i]->t0 <= t_peak; i++) {
    if (strncmp(ix[i]->name, SEQ_PREFIX, strlen(SEQ_PREFIX))) continue;
    const char *name = ix[i]->name + strlen(SEQ_PREFIX);
    size_t k = 0;
    while (k < kv->nseqs && strcmp(kv->seqs[k].name, name)) k++;
    if (k == kv->nseqs) snprintf(kv->seqs[kv->nseqs++].name, sizeof kv->seqs->name, "%s", name);
    kv->seqs[k].blocks = arg(ix[i], "blocks");
  }
  size_t held = 0;
  for (size_t k = 0; k < kv->nseqs; k++)
    if (kv->seqs[k].blocks > 0) kv->seqs[held++] = kv->seqs[k];
  kv->nseqs = held;
  qsort(kv->seqs, kv->nseqs, sizeof *kv->seqs, by_blocks);
  free(ix);
  return NB_OK;
}

void nb_prof__kv_json(FILE *f, const nb_prof__kv *kv) {
  if (!kv->nsamples) {
    fputs("null", f);
    return;
  }
  const nb_prof__kv_sample *p = &kv->samples[kv->peak];
  fprintf(f, "{\"samples\":%zu,\"series\":[\"ts_us\",\"used\",\"free\",\"cached\",\"sequences\"],\"timeline\":[", kv->nsamples);
  for (size_t i = 0; i < kv->nsamples; i++) {
    const nb_prof__kv_sample *s = &kv->samples[i];
    fprintf(f, "%s[%.3f,%.0f,%.0f,%.0f,%.0f]", i ? "," : "", s->t_us, s->used, s->free, s->cached, s->sequences);
  }
  fprintf(f, "],\n \"peak\":{\"used\":%.0f,\"free\":%.0f,\"cached\":%.0f,\"ts_us\":%.3f,\"sequences\":[", p->used, p->free, p->cached,
          p->t_us);
  for (size_t i = 0; i < kv->nseqs; i++) {
    fprintf(f, "%s{\"name\":\"", i ? "," : "");
    for (const char *c = kv->seqs[i].name; *c; c++)
      if (*c != '"' && *c != '\\' && (unsigned char)*c >= 0x20) fputc(*c, f); /* "request 3/0": nothing to escape */
    fprintf(f, "\",\"blocks\":%.0f}", kv->seqs[i].blocks);
  }
  fputs("]}}", f);
}

#define W 960.0
#define LEFT 70.0
#define H 200.0

void nb_prof__kv_html(FILE *f, const nb_prof__kv *kv) {
  if (!kv->nsamples) return;
  const nb_prof__kv_sample *p = &kv->samples[kv->peak], *last = &kv->samples[kv->nsamples - 1];
  double total = p->used + p->free + p->cached, t1 = last->t_us > 0 ? last->t_us : 1;
  fprintf(f, "<section class=\"nb-kv\">\n<h2>KV cache blocks</h2>\n<p>%zu samples; peak <b>%.0f</b> of %.0f blocks used at %.3f ms "
             "(%.0f cached for the prefix cache, %.0f free), by %zu sequences.</p>\n",
          kv->nsamples, p->used, total, p->t_us * 1e-3, p->cached, p->free, kv->nseqs);
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
          W, H + 30, W, H + 30);
  fprintf(f, "<text x=\"4\" y=\"14\" font-size=\"11\">%.0f</text><text x=\"4\" y=\"%.0f\" font-size=\"11\">0</text>\n", total, H);
  /* used (bottom), cached on top of it, as steps over time */
  static const char *const fills[2] = {"#d1495b", "#f2c14e"};
  for (int layer = 1; layer >= 0; layer--) {
    fprintf(f, "<path class=\"kv-%s\" fill=\"%s\" fill-opacity=\"0.8\" d=\"M%.1f %.1f", layer ? "cached" : "used", fills[layer],
            LEFT + kv->samples[0].t_us / t1 * (W - LEFT - 10), H); /* nothing drawn before the first sample */
    for (size_t i = 0; i < kv->nsamples; i++) {
      const nb_prof__kv_sample *s = &kv->samples[i];
      double v = s->used + (layer ? s->cached : 0), x = LEFT + s->t_us / t1 * (W - LEFT - 10), y = H - v / (total > 0 ? total : 1) * (H - 10);
      double xn = i + 1 < kv->nsamples ? LEFT + kv->samples[i + 1].t_us / t1 * (W - LEFT - 10) : W - 10;
      fprintf(f, " L%.1f %.1f L%.1f %.1f", x, y, xn, y);
    }
    fprintf(f, " L%.1f %.1f Z\"><title>%s blocks</title></path>\n", W - 10, H, layer ? "cached (unheld, prefix cache)" : "used");
  }
  double px = LEFT + p->t_us / t1 * (W - LEFT - 10);
  fprintf(f, "<line class=\"peak\" x1=\"%.1f\" x2=\"%.1f\" y1=\"0\" y2=\"%.0f\" stroke=\"#222\" stroke-dasharray=\"3 2\"/>"
             "<text x=\"%.1f\" y=\"12\" font-size=\"11\">peak %.0f</text>\n",
          px, px, H, px + 3, p->used);
  fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">0 ms</text><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"end\">%.3f ms</text>\n",
          LEFT, H + 20, W - 10, H + 20, t1 * 1e-3);
  fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">used</text>"
             "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">cached "
             "(prefix cache, nobody holds them)</text>\n",
          W / 2 - 160, H + 11, fills[0], W / 2 - 146, H + 20, W / 2 - 100, H + 11, fills[1], W / 2 - 86, H + 20);
  fputs("</svg>\n<table class=\"nb-kv-seqs\"><tr><th>sequence at the peak</th><th>blocks</th></tr>\n", f);
  for (size_t i = 0; i < kv->nseqs && i < 40; i++) {
    fputs("<tr><td>", f);
    nb_prof__xml_text(f, kv->seqs[i].name);
    fprintf(f, "</td><td>%.0f</td></tr>\n", kv->seqs[i].blocks);
  }
  fputs("</table>\n</section>\n", f);
}
