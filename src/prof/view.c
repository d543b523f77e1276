/* The viewers' copy of an executable (view.h): steps with their operands,
 * buffers as blocks of memory with live ranges over the schedule, live
 * bytes per step and the peak. The model is the runtime's (runtime/exe.c):
 * inputs, constants and outputs are held for the whole run (outputs are
 * allocated before the first step), an output written into a donated input
 * takes that input's memory, an intermediate occupies its arena range from
 * the step that writes it to the last step that reads it (a chain of
 * in-place updates or a view lives in its head's range), and a control
 * step's compiled bodies use their own arenas during that step. Not here:
 * drawing (memory.c, graph.c). */
#include <stdlib.h>
#include <string.h>

#include "prof/names.h"
#include "prof/view.h"

const char *nb_prof__kind_name(int kind) {
  static const char *const names[] = {"none", "input", "constant", "temp", "output", "body"};
  return kind >= 0 && kind <= NB_PROF__BODY ? names[kind] : "?";
}

static void step_name(const nb_exe *e, size_t s, const nb_prof__view *v, nb_prof__step *st) {
  static const char *const kinds[NB_EXE_STEP_KIND_COUNT] = {"kernel", "eval", "gemm", "control", "start", "wait"};
  nb_exe_step_info info;
  nb_loc loc = {0};
  const char *ops = nb_exe_step_ops(e, s, &loc);
  if (nb_exe_step(e, s, &info) != NB_OK) return;
  st->kind = info.kind < NB_EXE_STEP_KIND_COUNT ? kinds[info.kind] : "step";
  st->flops = info.flops, st->bytes = info.bytes;
  nb_prof__loc_str(loc, st->at, sizeof st->at);
  if (info.kind == NB_EXE_STEP_KERNEL) {
    snprintf(st->name, sizeof st->name, "%s %s", info.name, ops ? ops : "");
    return;
  }
  const char *type = ""; /* the first result's type, as the trace names the step */
  for (size_t i = 0; i < st->noperands && !type[0]; i++)
    if (st->written[i] && st->values[i] < v->nvalues) type = v->value_type[st->values[i]];
  snprintf(st->name, sizeof st->name, "%s %s", info.name, type);
}

/* "312 steps; inputs params, opt_state, batch": the inputs' first path components */
static void make_title(const nb_graph *g, int nsteps, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%d steps; inputs", nsteps);
  char seen[8][48];
  int nseen = 0;
  for (size_t i = 0; i < nb_graph_num_inputs(g) && n > 0 && (size_t)n < cap; i++) {
    const char *p = nb_graph_input_path(g, i), *slash = strchr(p, '/');
    int len = slash ? (int)(slash - p) : (int)strlen(p);
    bool dup = false;
    for (int k = 0; k < nseen; k++) dup |= (int)strlen(seen[k]) == len && !strncmp(seen[k], p, (size_t)len);
    if (dup) continue;
    if (nseen == 8) {
      n += snprintf(buf + n, cap - (size_t)n, ", ...");
      break;
    }
    snprintf(seen[nseen++], sizeof seen[0], "%.*s", len > 47 ? 47 : len, p);
    n += snprintf(buf + n, cap - (size_t)n, "%s %.*s", nseen > 1 ? "," : "", len, p);
  }
  if (nb_graph_num_inputs(g) == 0 && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " none");
}

static void describe(const nb_graph *g, const nb_exe_buffer_info *b, nb_prof__block *k) {
  const nb_val *val = b->value;
  nb_prof__value_name(g, val, k->name, sizeof k->name);
  snprintf(k->op, sizeof k->op, "%s", nb_prof__value_op(val));
  if (val && val->def) nb_prof__loc_str(val->def->loc, k->at, sizeof k->at);
  if (val) nb_aval_str(&val->aval, k->type, sizeof k->type);
}

/* each value's type, size and the value whose memory it lives in (the graph's edges) */
static void add_values(const nb_exe *e, nb_prof__view *v) {
  for (size_t id = 0; id < v->nvalues; id++) {
    nb_exe_buffer_info b;
    if (nb_exe_buffer(e, id, &b) != NB_OK) continue;
    if (b.value) nb_aval_str(&b.value->aval, v->value_type[id], sizeof v->value_type[0]);
    v->value_bytes[id] = b.nbytes;
    v->value_shares[id] = b.shares;
  }
}

/* the blocks of memory, after the steps (a control step's block is named after it) */
static nb_status add_blocks(nb_ctx *ctx, const nb_exe *e, nb_prof__view *v) {
  const nb_graph *g = nb_exe_graph(e);
  size_t nv = v->nvalues, cap = nv + (size_t)v->nsteps + 1;
  v->blocks = calloc(cap, sizeof *v->blocks);
  if (!v->blocks) return nb_errorf(ctx, NB_ERR_NOMEM, "prof: out of memory for the memory view");
  int last = v->nsteps > 0 ? v->nsteps - 1 : 0;
  for (size_t id = 0; id < nv; id++) {
    nb_exe_buffer_info b;
    if (nb_exe_buffer(e, id, &b) != NB_OK) return nb_ctx_status(ctx);
    /* memory of its own: an output written into a donated input lives in the input's block */
    bool own = b.kind == NB_EXE_BUF_INPUT || b.kind == NB_EXE_BUF_CONST || (b.kind == NB_EXE_BUF_OUTPUT && b.donor < 0) ||
               (b.kind == NB_EXE_BUF_TEMP && b.shares < 0);
    if (!own || !b.nbytes) continue;
    nb_prof__block *k = &v->blocks[v->nblocks++];
    k->kind = b.kind;
    k->value = (uint32_t)id;
    k->bytes = b.nbytes;
    k->offset = b.kind == NB_EXE_BUF_TEMP ? (int64_t)b.offset : -1;
    k->written = b.def_step;
    k->first = b.kind == NB_EXE_BUF_TEMP ? b.def_step : 0;
    k->last = b.kind == NB_EXE_BUF_TEMP ? (b.last_step < v->nsteps ? b.last_step : last) : last;
    if (k->first < 0) k->first = 0;
    describe(g, &b, k);
  }
  /* donated inputs: the outputs that take their memory */
  for (size_t id = 0; id < nv; id++) {
    nb_exe_buffer_info b;
    if (nb_exe_buffer(e, id, &b) != NB_OK || b.kind != NB_EXE_BUF_OUTPUT || b.donor < 0) continue;
    const nb_val *x = nb__graph_input(g, (size_t)b.donor);
    const char *out = nb_prof__output_path(g, b.value);
    for (size_t i = 0; x && i < v->nblocks; i++)
      if (v->blocks[i].kind == NB_EXE_BUF_INPUT && v->blocks[i].value == x->id)
        snprintf(v->blocks[i].donated_to, sizeof v->blocks[i].donated_to, "%s", out ? out : "?");
  }
  /* control steps: their bodies' arenas */
  for (int s = 0; s < v->nsteps; s++) {
    size_t bytes = 0;
    for (size_t i = 0;; i++) {
      const nb_exe *body = nb_exe_step_body(e, (size_t)s, i);
      if (!body) break;
      nb_exe_stats st;
      nb_exe_get_stats(body, &st);
      bytes += st.arena_bytes;
    }
    if (!bytes) continue;
    nb_prof__block *k = &v->blocks[v->nblocks++];
    *k = (nb_prof__block){.kind = NB_PROF__BODY, .offset = -1, .bytes = bytes, .first = s, .last = s, .written = s};
    snprintf(k->name, sizeof k->name, "arenas of %s's bodies", v->steps[s].name);
    snprintf(k->op, sizeof k->op, "%s", "control");
    snprintf(k->at, sizeof k->at, "%s", v->steps[s].at);
  }
  return NB_OK;
}

static nb_status add_steps(nb_ctx *ctx, const nb_exe *e, nb_prof__view *v) {
  v->steps = calloc((size_t)v->nsteps + 1, sizeof *v->steps);
  if (!v->steps) return nb_errorf(ctx, NB_ERR_NOMEM, "prof: out of memory for the memory view");
  for (int s = 0; s < v->nsteps; s++) {
    nb_prof__step *st = &v->steps[s];
    size_t n = nb_exe_step_operands(e, (size_t)s, NULL, 0);
    nb_exe_operand *ops = calloc(n + 1, sizeof *ops);
    st->values = calloc(n + 1, sizeof *st->values);
    st->written = calloc(n + 1, sizeof *st->written);
    if (!ops || !st->values || !st->written) {
      free(ops);
      return nb_errorf(ctx, NB_ERR_NOMEM, "prof: out of memory for the memory view");
    }
    st->noperands = nb_exe_step_operands(e, (size_t)s, ops, n);
    for (size_t i = 0; i < st->noperands; i++) st->values[i] = ops[i].value, st->written[i] = ops[i].written;
    free(ops);
  }
  return NB_OK;
}

static void add_live(nb_prof__view *v) {
  for (size_t i = 0; i < v->nblocks; i++) {
    const nb_prof__block *b = &v->blocks[i];
    if (b->kind != NB_EXE_BUF_TEMP && b->kind != NB_PROF__BODY) v->held += b->bytes;
    for (int s = b->first; s <= b->last && s < v->nsteps; s++) v->live[s] += b->bytes;
  }
  v->peak = v->nsteps ? 0 : v->held;
  v->peak_step = -1;
  for (int s = 0; s < v->nsteps; s++)
    if (v->live[s] > v->peak || v->peak_step < 0) v->peak = v->live[s], v->peak_step = s;
}

nb_status nb_prof__view_build(nb_ctx *ctx, const nb_exe *e, nb_prof__view *v) {
  memset(v, 0, sizeof *v);
  if (!e) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "prof: no executable");
  nb_exe_stats stats;
  nb_exe_get_stats(e, &stats);
  v->nsteps = (int)nb_exe_num_steps(e);
  v->nvalues = nb_exe_num_values(e);
  v->arena_bytes = stats.arena_bytes;
  make_title(nb_exe_graph(e), v->nsteps, v->title, sizeof v->title);
  v->value_type = calloc(v->nvalues + 1, sizeof *v->value_type);
  v->value_bytes = calloc(v->nvalues + 1, sizeof *v->value_bytes);
  v->value_shares = calloc(v->nvalues + 1, sizeof *v->value_shares);
  v->live = calloc((size_t)v->nsteps + 1, sizeof *v->live);
  nb_status st = v->value_type && v->value_bytes && v->value_shares && v->live ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "prof: out of memory for the memory view");
  if (!st) add_values(e, v);
  if (!st) st = add_steps(ctx, e, v);
  for (int s = 0; !st && s < v->nsteps; s++) step_name(e, (size_t)s, v, &v->steps[s]);
  if (!st) st = add_blocks(ctx, e, v);
  if (!st) add_live(v);
  if (st) nb_prof__view_free(v);
  return st;
}

void nb_prof__view_free(nb_prof__view *v) {
  if (!v) return;
  for (int s = 0; v->steps && s < v->nsteps; s++) free(v->steps[s].values), free(v->steps[s].written);
  free(v->steps);
  free(v->blocks);
  free(v->value_type);
  free(v->value_bytes);
  free(v->value_shares);
  free(v->live);
  memset(v, 0, sizeof *v);
}

typedef struct ranked {
  size_t bytes, index;
} ranked;

/* larger first, then in block order */
static int by_bytes(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return (x->index > y->index) - (x->index < y->index);
}

size_t *nb_prof__view_peak_set(const nb_prof__view *v, size_t *n) {
  *n = 0;
  ranked *r = malloc((v->nblocks + 1) * sizeof *r);
  size_t *ix = malloc((v->nblocks + 1) * sizeof *ix);
  if (!r || !ix) return free(r), free(ix), NULL;
  for (size_t i = 0; i < v->nblocks; i++) {
    const nb_prof__block *b = &v->blocks[i];
    if (v->peak_step < 0 || (b->first <= v->peak_step && v->peak_step <= b->last)) r[(*n)++] = (ranked){b->bytes, i};
  }
  qsort(r, *n, sizeof *r, by_bytes);
  for (size_t i = 0; i < *n; i++) ix[i] = r[i].index;
  free(r);
  return ix;
}

nb_status nb_prof__view_draw(nb_ctx *ctx, const nb_exe *exe, FILE *out, const char *api,
                             void (*draw)(FILE *f, const nb_prof__view *v)) {
  if (!exe || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s is NULL", api, exe ? "out" : "exe");
  nb_prof__view v;
  nb_status s = nb_prof__view_build(ctx, exe, &v);
  if (s) return s;
  draw(out, &v);
  nb_prof__view_free(&v);
  return ferror(out) ? nb_errorf(ctx, NB_ERR_IO, "%s: write error", api) : NB_OK;
}
