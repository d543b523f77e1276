/* What an executable's steps are, for the profiler: at an executable's
 * first run in a trace session the runtime notes (src/util/trace.h) one
 * JSON object per executable, and every step's span refers to it
 * (executable << 24 | step), so the op profile (src/prof/opprof.c) can map
 * a span back to the source ops the step computes and the parameter paths
 * it reads. The object:
 *
 *   {"exe":N,"steps":[{"step":i,"name":"k3","kind":"kernel","family":"loop fusion",
 *     "ops":"mul+add+exp","eqns":3,"flops":F,"bytes":B,
 *     "source":["exp nn/apply.c:12", ...],   (the equations it materializes, where traced)
 *     "reads":["params/layers/0/attn/wq", ...],  (inputs it reads, through layout ops)
 *     "writes":["params/layers/0/attn/wq", ...]}, ...]}  (outputs it writes)
 *
 * Not here: the timing (exe.c records the spans), the file formats (prof). */
#include <stdatomic.h>
#include <string.h>

#include "runtime/exe.h"
#include "util/trace.h"

/* ---------------------------------------------------------------- names */

/* A value's source input: the graph input it is, or is a layout or
 * conversion of (a reshape, transpose, broadcast, slice or convert of one
 * input), so that a GEMM on a transposed weight still names the weight;
 * -1 for anything else. */
static void input_origins(const nb_graph *g, int *origin, const nb_eqn **def, size_t nvals) {
  for (size_t v = 0; v < nvals; v++) origin[v] = -1, def[v] = NULL;
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) {
    const nb_val *x = nb__graph_input(g, i);
    if (x->id < nvals) origin[x->id] = (int)i;
  }
  for (size_t k = 0; k < nb__graph_neqns(g); k++) {
    const nb_eqn *q = nb__graph_eqn(g, k);
    for (int i = 0; i < q->nout; i++)
      if (q->out[i]->id < nvals) def[q->out[i]->id] = q;
    if (q->nout != 1 || (nb__rules(q->prim)->kind != NB_KIND_LAYOUT && q->prim != NB_PRIM_convert)) continue;
    int o = -1;
    for (int i = 0; i < q->nin && o != -2; i++) {
      int x = origin[q->in[i]->id];
      if (x >= 0) o = o < 0 ? x : o == x ? o : -2; /* two inputs: a mix, not a view of either */
    }
    if (o >= 0) origin[q->out[0]->id] = o;
  }
}

static void put_json_str(nb_jit_text *t, const char *s) {
  nb_jit__printf(t, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') nb_jit__printf(t, "\\%c", *p);
    else nb_jit__printf(t, "%c", *p < 0x20 ? ' ' : *p);
  }
  nb_jit__printf(t, "\"");
}

/* a list of distinct strings (few: a step's operands) */
typedef struct names {
  const char *s[64];
  int n;
} names;

static void add_name(names *l, const char *s) {
  if (!s || !*s) return;
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->s[i], s)) return;
  if (l->n < 64) l->s[l->n++] = s;
}

static void put_names(nb_jit_text *t, const char *key, const names *l) {
  nb_jit__printf(t, ",\"%s\":[", key);
  for (int i = 0; i < l->n; i++) {
    if (i) nb_jit__printf(t, ",");
    put_json_str(t, l->s[i]);
  }
  nb_jit__printf(t, "]");
}

/* "prim file:line", the file as its folder and name ("nn/apply.c") */
static void put_source(nb_jit_text *t, const nb_eqn *q, bool comma) {
  const char *file = q->loc.file ? q->loc.file : "";
  for (const char *p = file, *last = NULL; *p; p++)
    if (*p == '/') file = last ? last + 1 : file, last = p;
  char buf[256];
  if (q->loc.file) snprintf(buf, sizeof buf, "%s %s:%d", nb__rules(q->prim)->name, file, q->loc.line);
  else snprintf(buf, sizeof buf, "%s", nb__rules(q->prim)->name);
  if (comma) nb_jit__printf(t, ",");
  put_json_str(t, buf);
}

static void value_names(const nb_exe *e, const int *origin, uint32_t id, bool written, names *reads, names *writes) {
  const nb_jbuf *b = &e->plan.bufs[id];
  if (!written && origin[id] >= 0) add_name(reads, nb_graph_input_path(e->graph, (size_t)origin[id]));
  if (written && b->cls == NB_BUF_OUTPUT && b->index >= 0) add_name(writes, nb_graph_output_path(e->graph, (size_t)b->index));
}

/* ---------------------------------------------------------------- a step */

static const char *step_kind(nb_exe_step_kind k) {
  switch (k) {
  case NB_EXE_STEP_KERNEL: return "kernel";
  case NB_EXE_STEP_BLAS: return "gemm";
  case NB_EXE_STEP_CONTROL: return "control";
  case NB_EXE_STEP_START: return "start";
  case NB_EXE_STEP_WAIT: return "wait";
  default: return "eval";
  }
}

/* A kernel's time is one family's: a loop with a reduction phase is a
 * reduction fusion, others a loop fusion (XProf's names). */
static const char *step_family(const nb_exe *e, const nb_jstep *s) {
  if (s->kind == NB_EXE_STEP_KERNEL) return e->plan.kernels[s->kernel].rr > 0 ? "reduction fusion" : "loop fusion";
  if (s->kind == NB_EXE_STEP_CONTROL) return "control";
  return s->eqn ? nb__prim_family(s->eqn->prim) : "other";
}

/* every distinct primitive a kernel computes, in node order (the step's
 * `ops` is cut at 80 bytes for the trace) */
static void put_kernel_ops(nb_jit_text *t, const nb_kernel *k) {
  nb_jit__printf(t, ",\"ops\":\"");
  int n = 0;
  for (int i = 0; i < k->nnodes; i++)
    if (nb_jit__kernel_first_op(k, i)) nb_jit__printf(t, "%s%s", n++ ? "+" : "", nb__rules(k->nodes[i].prim)->name);
  nb_jit__printf(t, "%s\"", n ? "" : "copy");
}

static void put_step(nb_jit_text *t, const nb_exe *e, const int *origin, const nb_eqn *const *def, int i) {
  const nb_jstep *s = &e->plan.steps[i];
  nb_jit__printf(t, "%s{\"step\":%d,\"name\":", i ? ",\n" : "\n", i);
  put_json_str(t, s->name);
  nb_jit__printf(t, ",\"kind\":\"%s\",\"family\":\"%s\"", step_kind(s->kind), step_family(e, s));
  names reads = {0}, writes = {0};
  if (s->kind == NB_EXE_STEP_KERNEL) {
    const nb_kernel *k = &e->plan.kernels[s->kernel];
    put_kernel_ops(t, k);
    nb_jit__printf(t, ",\"eqns\":%zu,\"flops\":%.17g,\"bytes\":%.17g,\"source\":[", s->neqns, s->flops, s->bytes);
    int n = 0;
    for (int r = 0; r < k->nroots; r++) {
      if (k->roots[r] < e->plan.nvals && def[k->roots[r]]) put_source(t, def[k->roots[r]], n++ > 0);
    }
    nb_jit__printf(t, "]");
    for (int a = 0; a < k->nargs; a++) value_names(e, origin, k->args[a], k->arg_written[a], &reads, &writes);
  } else {
    nb_jit__printf(t, ",\"ops\":");
    put_json_str(t, s->ops);
    nb_jit__printf(t, ",\"eqns\":%zu,\"flops\":%.17g,\"bytes\":%.17g,\"source\":[", s->neqns, s->flops, s->bytes);
    if (s->eqn) put_source(t, s->eqn, false);
    nb_jit__printf(t, "]");
    for (int a = 0; s->eqn && a < s->eqn->nin + s->eqn->nout; a++) {
      bool out = a >= s->eqn->nin;
      value_names(e, origin, (out ? s->eqn->out[a - s->eqn->nin] : s->eqn->in[a])->id, out, &reads, &writes);
    }
  }
  put_names(t, "reads", &reads);
  put_names(t, "writes", &writes);
  nb_jit__printf(t, "}");
}

/* ---------------------------------------------------------------- the note */

static atomic_llong serials;

int64_t nb_rt__trace_ref(nb_exe *e) {
  int64_t s = atomic_load(&e->trace_serial);
  if (!s) {
    int64_t mine = atomic_fetch_add(&serials, 1) + 1, zero = 0;
    s = atomic_compare_exchange_strong(&e->trace_serial, &zero, mine) ? mine : zero;
  }
  return s << 24;
}

void nb_rt__trace_note(nb_exe *e) {
  uint64_t session = nb_util__trace_session(), seen = atomic_load(&e->trace_noted);
  if (seen == session || !atomic_compare_exchange_strong(&e->trace_noted, &seen, session)) return;
  int64_t serial = nb_rt__trace_ref(e) >> 24;
  size_t nvals = e->plan.nvals;
  int *origin = nb_alloc(e->ctx, sizeof(int) * (nvals + 1));
  const nb_eqn **def = nb_alloc(e->ctx, sizeof(nb_eqn *) * (nvals + 1));
  nb_jit_text t = {.ctx = e->ctx};
  if (origin && def) {
    input_origins(e->graph, origin, def, nvals);
    nb_jit__printf(&t, "{\"exe\":%lld,\"steps\":[", (long long)serial);
    for (int i = 0; i < e->plan.nsteps; i++) put_step(&t, e, origin, def, i);
    nb_jit__printf(&t, "]}");
  }
  if (origin && def && !t.oom && t.s) nb_util__trace_note(serial, t.s);
  nb_jit__text_free(&t);
  nb_dealloc(e->ctx, origin, sizeof(int) * (nvals + 1));
  nb_dealloc(e->ctx, def, sizeof(nb_eqn *) * (nvals + 1));
}
