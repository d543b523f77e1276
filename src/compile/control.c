/* Control flow in the compiler: a cond, while_loop or scan equation is one
 * CONTROL step of its plan (fuse.c) whose operands and results are buffers
 * like an evaluated step's; its bodies (cond's branches; while's predicate
 * and body; scan's body) are compiled here through the same pipeline
 * (simplify, fuse, buffers, code generation, the disk cache) into
 * executables of their own, so a body's kernels and buffers are planned
 * once however many times it runs, and a loop of 48 layers compiles the
 * code of one. runtime/control.c runs them. Not here: the primitives' rules
 * (core/prims/control.c). */
#include <string.h>

#include "compile/control.h"

bool nb_jit__is_control(const nb_eqn *e) {
  return e->prim == NB_PRIM_cond || e->prim == NB_PRIM_while_loop || e->prim == NB_PRIM_scan;
}

/* The graphs a control equation runs, in the order of nb_jcontrol.sub. */
static int body_graphs(const nb_eqn *e, const nb_graph **out, int cap) {
  switch (e->prim) {
  case NB_PRIM_cond: {
    const nb_cond_params *p = e->params;
    int n = p->nbranches < cap ? p->nbranches : cap;
    for (int i = 0; i < n; i++) out[i] = p->branches[i];
    return n;
  }
  case NB_PRIM_while_loop: {
    const nb_while_params *p = e->params;
    out[0] = p->cond;
    out[1] = p->body;
    return 2;
  }
  case NB_PRIM_scan: out[0] = ((const nb_scan_params *)e->params)->body; return 1;
  default: return 0;
  }
}

/* The operands that are the loop's initial carry: [first, first + n). */
static void carry_operands(const nb_eqn *e, int *first, int *n) {
  *first = *n = 0;
  if (e->prim == NB_PRIM_while_loop) {
    const nb_while_params *p = e->params;
    *first = p->ncond_consts + p->nbody_consts;
    *n = e->nin - *first;
  } else if (e->prim == NB_PRIM_scan) {
    const nb_scan_params *p = e->params;
    *first = p->nconsts;
    *n = p->ncarry;
  }
}

bool nb_jit__control_in_place_ok(const nb_jstep *st, uint32_t in, uint32_t out) {
  const nb_eqn *e = st->eqn;
  int first, n;
  carry_operands(e, &first, &n);
  int uses = 0, slot = -1;
  for (int i = 0; i < e->nin; i++)
    if (e->in[i]->id == in) {
      uses++;
      if (i >= first && i < first + n) slot = i - first;
    }
  /* the runtime copies the initial carry into the result (or the second
   * buffer) before the first iteration, and never reads it again */
  return uses == 1 && slot >= 0 && slot < e->nout && e->out[slot]->id == out;
}

int nb_jit__control_output_operand(const nb_eqn *e, int out) {
  if (e->prim != NB_PRIM_scan) return -1;
  const nb_scan_params *p = e->params;
  if (out < p->ncarry) return -1;
  const nb_val *y = nb__graph_output(p->body, (size_t)out);
  for (int i = p->nconsts + p->ncarry; i < e->nin; i++)
    if (nb__graph_input(p->body, (size_t)i) == y && nb_aval_equal(&e->in[i]->aval, &e->out[out]->aval)) return i;
  return -1;
}

static size_t val_bytes(const nb_val *v) { return nb_shape_size(&v->aval.shape) * nb_dtype_size(v->aval.dtype); }

static nb_status compile_step(nb_exe *e, nb_jstep *st) {
  nb_ctx *ctx = e->ctx;
  const nb_graph *graphs[NB_COND_MAX_BRANCHES];
  int n = body_graphs(st->eqn, graphs, NB_COND_MAX_BRANCHES);
  nb_jcontrol *c = nb_jit__alloc(&e->ar, sizeof *c);
  nb_exe **sub = nb_jit__alloc(&e->ar, sizeof(nb_exe *) * ((size_t)n + 1));
  nb_rt_frame *frames = nb_jit__alloc(&e->ar, sizeof(nb_rt_frame) * ((size_t)n + 1));
  if (!c || !sub || !frames) return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory");
  c->sub = sub;
  c->frames = frames;
  pthread_mutex_init(&c->mu, NULL);
  st->control = c; /* owned from here: nb_jit__control_free frees what is compiled */
  bool native = true;
  for (int i = 0; i < n; i++) {
    if (!(c->sub[i] = nb_jit__compile_sub(ctx, graphs[i], &e->cfg))) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    c->nsub = i + 1;
    native &= c->sub[i]->native;
  }
  int first, ncarry;
  carry_operands(st->eqn, &first, &ncarry);
  for (int j = 0; j < ncarry; j++) c->scratch_bytes += (val_bytes(st->eqn->out[j]) + 63) & ~(size_t)63;
  c->pred_offset = c->scratch_bytes;
  if (st->eqn->prim == NB_PRIM_while_loop) c->scratch_bytes += 64;
  if (!native) { /* a body without native code: the whole equation runs on its reference */
    st->kind = NB_EXE_STEP_EVAL;
    return NB_OK;
  }
  /* the peak estimate: the bodies' arenas (kept by the step between runs) and the second carry */
  e->plan.peak_bytes += c->scratch_bytes;
  for (int i = 0; i < n; i++) e->plan.peak_bytes += c->sub[i]->plan.peak_bytes - c->sub[i]->plan.output_bytes;
  /* the model cost of one run: a scan's body times its length (a while
   * loop's trip count is not known: one iteration; a cond: its costliest branch) */
  double fl = 0, by = 0;
  for (int i = 0; i < n; i++) {
    double f1 = 0, b1 = 0;
    for (int s = 0; s < c->sub[i]->plan.nsteps; s++) {
      f1 += c->sub[i]->plan.steps[s].flops;
      b1 += c->sub[i]->plan.steps[s].bytes;
    }
    if (st->eqn->prim == NB_PRIM_cond) {
      fl = f1 > fl ? f1 : fl;
      by = b1 > by ? b1 : by;
    } else {
      fl += f1;
      by += b1;
    }
  }
  if (st->eqn->prim == NB_PRIM_scan) {
    double len = (double)((const nb_scan_params *)st->eqn->params)->length;
    fl *= len;
    by *= len;
  }
  st->flops = fl;
  st->bytes = by;
  return NB_OK;
}

nb_status nb_jit__control_compile(nb_exe *e) {
  if (e->cfg.off[NB_SW_native]) return NB_OK; /* the interpreter runs the whole graph */
  for (int s = 0; s < e->plan.nsteps; s++) {
    nb_jstep *st = &e->plan.steps[s];
    if (st->kind != NB_EXE_STEP_CONTROL) continue;
    nb_status r = compile_step(e, st);
    if (r != NB_OK) return r;
  }
  return NB_OK;
}

void nb_jit__control_free(nb_exe *e) {
  for (int s = 0; s < e->plan.nsteps; s++) {
    nb_jcontrol *c = e->plan.steps[s].control;
    if (!c) continue;
    for (int i = 0; i < c->nsub; i++) {
      if (c->opened) nb_rt__frame_close(c->sub[i], &c->frames[i]);
      nb_rt__exe_free(c->sub[i]);
    }
    if (c->scratch) e->cfg.backend->free(e->ctx, c->scratch, c->scratch_bytes);
    pthread_mutex_destroy(&c->mu);
    e->plan.steps[s].control = NULL;
  }
}

void nb_jit__control_print(const nb_jstep *st, FILE *f, int depth) {
  static const char *const roles[3][2] = {{"branch", "branch"}, {"predicate", "body"}, {"body", "body"}};
  int r = st->eqn->prim == NB_PRIM_cond ? 0 : st->eqn->prim == NB_PRIM_while_loop ? 1 : 2;
  for (int i = 0; st->control && i < st->control->nsub; i++) {
    const nb_exe *b = st->control->sub[i];
    fprintf(f, "%*s%s %d: %llu runs, source %s\n", 2 * depth, "", roles[r][i ? 1 : 0], i, (unsigned long long)b->runs,
            nb_exe_source_path(b) ? nb_exe_source_path(b) : "(none)");
    for (int s = 0; s < b->plan.nsteps; s++) {
      const nb_jstep *bs = &b->plan.steps[s];
      fprintf(f, "%*sstep %d %s: %zu eqns, %.3g flops, %.3g bytes, last %.3f ms (all iterations)\n", 2 * depth + 2, "", s, bs->name,
              bs->neqns, bs->flops, bs->bytes, bs->last_ms);
      if (bs->kind == NB_EXE_STEP_CONTROL) nb_jit__control_print(bs, f, depth + 2);
    }
  }
}

const nb_exe *nb_exe_step_body(const nb_exe *e, size_t step, size_t i) {
  if (!e || step >= (size_t)e->plan.nsteps) return NULL;
  const nb_jcontrol *c = e->plan.steps[step].control;
  return c && e->plan.steps[step].kind == NB_EXE_STEP_CONTROL && i < (size_t)c->nsub ? c->sub[i] : NULL;
}
