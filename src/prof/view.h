/* What the memory and graph viewers show of one executable, copied out of
 * it (nb_prof__view_build) so that a trace can keep it after the executable
 * is gone: the steps, the buffers with their live ranges over the steps,
 * the live bytes per step and the peak. Built by view.c from the buffer
 * plan (nb_exe_buffer, nb_exe_step_operands); drawn by memory.c (JSON and
 * the timeline) and graph.c (the dataflow graph). Private to library prof. */
#ifndef NABLA_PROF_VIEW_H
#define NABLA_PROF_VIEW_H

#include <stdio.h>

#include "nabla/compile.h"

/* A block of memory over the schedule: a buffer, or (kind BODY) the
 * arenas of a control step's compiled bodies. */
enum { NB_PROF__BODY = NB_EXE_BUF_KIND_COUNT };

typedef struct nb_prof__block {
  int kind;            /* nb_exe_buffer_kind, or NB_PROF__BODY */
  uint32_t value;      /* the value id (BODY: none) */
  int64_t offset;      /* TEMP: arena offset; -1 for memory outside the arena */
  size_t bytes;
  int first, last;     /* live over steps first..last (inputs, constants, outputs: the whole run) */
  int written;         /* the step that writes it, or -1 */
  char name[192];      /* names.h's name */
  char op[32];         /* the source op: "input", "dot_general", ... */
  char at[64];         /* where that op was traced, or "" */
  char type[64];       /* "f32[8,32]" */
  char donated_to[96]; /* INPUT: the output that takes its memory, or "" */
} nb_prof__block;

typedef struct nb_prof__step {
  char name[128];      /* as the trace names it: "k3 add+mul", "dot_general f32[8,32]" */
  char at[64];
  const char *kind;    /* "kernel", "gemm", "eval", "control" (static) */
  double flops, bytes;
  size_t noperands;
  uint32_t *values;    /* [noperands] */
  bool *written;       /* [noperands] */
} nb_prof__step;

typedef struct nb_prof__view {
  char title[160];     /* "312 steps; inputs params, opt_state, batch" */
  int nsteps;
  nb_prof__step *steps;
  size_t nblocks;
  nb_prof__block *blocks;
  size_t nvalues;
  char (*value_type)[64];  /* per value id: its type, for the graph's edge labels */
  size_t *value_bytes;     /* per value id */
  int32_t *value_shares;   /* per value id: the value whose memory it lives in (a view, an in-place update), or -1 */
  size_t arena_bytes;
  size_t *live;        /* [nsteps]: bytes of the blocks live at each step */
  size_t peak;         /* the largest of live (no steps: the blocks held for the run) */
  int peak_step;       /* the first step at the peak, -1 without steps */
  size_t held;         /* bytes held for the whole run: inputs, constants, outputs */
  uint64_t runs;       /* how often it ran while a trace was recorded (sessions) */
  double run_ms;
} nb_prof__view;

/* Copies out what the viewers need of e. NB_ERR_NOMEM on ctx. */
nb_status nb_prof__view_build(nb_ctx *ctx, const nb_exe *e, nb_prof__view *v);
void nb_prof__view_free(nb_prof__view *v);
/* The public viewers' one body: builds exe's view, draws it on out, frees
 * it; errors are named after api ("nb_prof_graph_svg"). */
nb_status nb_prof__view_draw(nb_ctx *ctx, const nb_exe *exe, FILE *out, const char *api,
                             void (*draw)(FILE *f, const nb_prof__view *v));
/* Blocks live at the peak, by bytes (largest first): indices into v->blocks, *n of them (malloc'ed; NULL on OOM). */
size_t *nb_prof__view_peak_set(const nb_prof__view *v, size_t *n);
const char *nb_prof__kind_name(int kind);

struct nb_prof__kv;

/* memory.c: the document {"format":"nabla-memory/1","executables":[...]}
 * over n views, and the HTML section of one view (the timeline as inline
 * SVG: buffers as rectangles over step x offset, the live bytes with the
 * peak marked, the table of what is live at the peak). */
void nb_prof__memory_json(FILE *f, const nb_prof__view *const *v, size_t n, const struct nb_prof__kv *kv);
void nb_prof__memory_html(FILE *f, const nb_prof__view *v);
/* graph.c: the steps as a layered graph (a node per step, an edge per
 * buffer one step writes and a later one reads), as an SVG document
 * (standalone: with the XML declaration; else to be inlined in HTML), and
 * as an HTML section holding it. */
void nb_prof__graph_svg(FILE *f, const nb_prof__view *v, bool standalone);
void nb_prof__graph_html(FILE *f, const nb_prof__view *v);
/* The section's opening (heading, legend, a scrolling <div>) and svg after
 * it (NULL: none); the caller closes with "</div></section>". */
void nb_prof__graph_section(FILE *f, const char *title, const char *svg);

/* kv.c: the serving engine's KV blocks, from the counters of a trace
 * (docs/prof.md, "KV cache"): the timeline of "kv blocks" samples, the
 * peak of used blocks and the blocks each sequence held then. */
typedef struct nb_prof__kv_sample {
  double t_us, used, free, cached, sequences;
} nb_prof__kv_sample;
typedef struct nb_prof__kv_seq {
  char name[64]; /* "request 3/0" */
  double blocks;
} nb_prof__kv_seq;
typedef struct nb_prof__kv {
  nb_prof__kv_sample *samples;
  size_t nsamples, peak; /* peak: the first sample with the most used */
  nb_prof__kv_seq *seqs; /* holding blocks at the peak, most first */
  size_t nseqs;
} nb_prof__kv;
struct nb_util__trace_event;
nb_status nb_prof__kv_build(nb_ctx *ctx, const struct nb_util__trace_event *ev, size_t n, int64_t t_start, nb_prof__kv *kv);
void nb_prof__kv_free(nb_prof__kv *kv);
void nb_prof__kv_json(FILE *f, const nb_prof__kv *kv); /* null without samples */
void nb_prof__kv_html(FILE *f, const nb_prof__kv *kv); /* nothing without samples */

/* "1.5 MiB" */
void nb_prof__bytes_str(double bytes, char *buf, size_t cap);

#endif
