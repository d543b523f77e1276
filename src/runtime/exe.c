/* Executables at run time: checks the inputs, binds buffers (inputs,
 * constants, the arena of intermediates, fresh or donated outputs) in the
 * backend's memory, runs the schedule through the backend (kernels, library
 * calls; other equations through their reference implementation, on the
 * host) and records per-step times. Without a compiled module it runs the
 * optimized graph on the interpreter. Not here: deciding any of the plan
 * (src/compile/) or how a backend runs a step (src/backend/). */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "runtime/exe.h"
#include "util/trace.h"
#include "util/util.h"

static void noop_release(void *ud) { (void)ud; }

/* ---------------------------------------------------------------- reference steps */

static nb_array *view(nb_exe *e, const nb_val *v, char **ptr, nb_array *const *in, nb_array **out) {
  const nb_jbuf *b = &e->plan.bufs[v->id];
  switch (b->cls) { /* in, out: NULL on bound memory (nb_rt__run_frame) */
  case NB_BUF_INPUT: if (in) return nb_array_retain(in[b->index]), in[b->index]; break;
  case NB_BUF_CONST: nb_array_retain(b->constant); return b->constant;
  case NB_BUF_OUTPUT: if (out) return nb_array_retain(out[b->index]), out[b->index]; break;
  default: break;
  }
  return nb_array_wrap(e->ctx, v->aval.dtype, v->aval.shape.rank, v->aval.shape.dims, ptr[v->id], noop_release, NULL);
}

/* arr: q's inputs, then its outputs to fill */
static nb_status eval_eqn(nb_ctx *ctx, const nb_eqn *q, nb_array **arr) {
  nb_status st = nb__rules(q->prim)->eval(ctx, q, arr, arr + q->nin);
  if (st != NB_OK && nb_ctx_status(ctx) == NB_OK)
    nb_errorf(ctx, st, "%s failed at run time (traced at %s:%d)", nb__rules(q->prim)->name, q->loc.file ? q->loc.file : "?", q->loc.line);
  return st;
}

/* The executable whose evaluated step runs on this thread (nb_jit_parallel_for
 * lends its threads to that step's kernel); NULL outside of one. */
static _Thread_local const nb_exe *lender;

void nb_jit_parallel_for(int ntasks, void (*task)(void *arg, int i), void *arg) {
  const nb_exe *e = lender;
  if (e && e->mod && e->cfg.backend->parallel) {
    e->cfg.backend->parallel(e->mod, ntasks, task, arg);
    return;
  }
  for (int i = 0; i < ntasks; i++) task(arg, i);
}

int nb_jit_parallel_threads(void) {
  const nb_exe *e = lender;
  return e && e->mod && e->cfg.backend->threads ? e->cfg.backend->threads(e->mod) : 1;
}

/* Arrays over the step's memory for an equation's operands then results
 * (new; *st is NB_ERR_NOMEM when one could not be made); free with
 * views_free. */
static nb_array **eqn_views(nb_exe *e, const nb_eqn *q, char **ptr, nb_array *const *in, nb_array **out, nb_status *st) {
  int n = q->nin + q->nout;
  nb_array **arr = nb_calloc(e->ctx, sizeof(nb_array *) * (size_t)(n + 1));
  *st = arr ? NB_OK : NB_ERR_NOMEM;
  for (int i = 0; arr && i < n && *st == NB_OK; i++)
    if (!(arr[i] = view(e, i < q->nin ? q->in[i] : q->out[i - q->nin], ptr, in, out))) *st = NB_ERR_NOMEM;
  return arr;
}

static void views_free(nb_ctx *ctx, const nb_eqn *q, nb_array **arr) {
  int n = q->nin + q->nout;
  for (int i = 0; arr && i < n; i++) nb_array_release(arr[i]);
  if (arr) nb_dealloc(ctx, arr, sizeof(nb_array *) * (size_t)(n + 1));
}

static nb_status run_eval(nb_exe *e, const nb_eqn *q, char **ptr, nb_array *const *in, nb_array **out) {
  nb_status st;
  nb_array **arr = eqn_views(e, q, ptr, in, out, &st);
  const nb_exe *outer = lender; /* a loop's body runs inside its executable's step */
  lender = e;
  if (st == NB_OK) st = eval_eqn(e->ctx, q, arr);
  lender = outer;
  views_free(e->ctx, q, arr);
  return st;
}

/* The same on a backend whose memory is not the host's: the operands are
 * copied into host arrays and the results back. */
static nb_status run_eval_staged(nb_exe *e, const nb_eqn *q, char **ptr) {
  nb_ctx *ctx = e->ctx;
  const nb_backend *bk = e->cfg.backend;
  int n = q->nin + q->nout;
  nb_array **arr = nb_calloc(ctx, sizeof(nb_array *) * (size_t)(n + 1));
  if (!arr) return NB_ERR_NOMEM;
  /* the operands may come from steps still running (a GPU's stream) */
  nb_status st = bk->synchronize(ctx, e->mod);
  for (int i = 0; i < n && st == NB_OK; i++) {
    const nb_val *v = i < q->nin ? q->in[i] : q->out[i - q->nin];
    if (!(arr[i] = nb_array_empty(ctx, v->aval.dtype, v->aval.shape.rank, v->aval.shape.dims))) st = NB_ERR_NOMEM;
    else if (i < q->nin) st = bk->to_host(ctx, nb_array_data_mut(arr[i]), ptr[v->id], nb_array_nbytes(arr[i]));
  }
  if (st == NB_OK) st = eval_eqn(ctx, q, arr);
  for (int i = q->nin; i < n && st == NB_OK; i++)
    st = bk->to_device(ctx, ptr[q->out[i - q->nin]->id], nb_array_data(arr[i]), nb_array_nbytes(arr[i]));
  for (int i = 0; i < n; i++) nb_array_release(arr[i]);
  nb_dealloc(ctx, arr, sizeof(nb_array *) * (size_t)(n + 1));
  return st;
}

/* ---------------------------------------------------------------- collectives in flight */

/* The collectives one run of a plan has started and not yet waited for
 * (pending[s] for start step s), chained to the run whose control step it
 * runs inside, so that a loop body's steps move its parent's collectives on
 * too. */
typedef struct inflight {
  nb_ctx *ctx;
  const nb_jstep *steps;
  void **pending;   /* per step */
  uint8_t *through; /* its messages are through: only the wait's work is left */
  int lo, n;        /* pending[lo..n) may be in flight */
  struct inflight *outer;
} inflight;

static _Thread_local inflight *flying;

/* Between steps: MPI moves large messages only inside MPI calls (Open MPI
 * over shared memory), so each run tests its oldest collective still in
 * flight; one test moves every message of the process on. */
static nb_status progress(void) {
  for (inflight *f = flying; f; f = f->outer) {
    while (f->lo < f->n && (!f->pending[f->lo] || f->through[f->lo])) f->lo++;
    if (f->lo == f->n) continue;
    bool done = false;
    nb_status st = nb__rules(f->steps[f->lo].eqn->prim)->async->test(f->ctx, f->pending[f->lo], &done);
    if (st != NB_OK) return st;
    f->through[f->lo] = done;
  }
  return NB_OK;
}

static nb_status start_step(nb_exe *e, inflight *f, int s, char **ptr, nb_array *const *in, nb_array **out) {
  const nb_eqn *q = e->plan.steps[s].eqn;
  nb_ctx *ctx = e->ctx;
  nb_status st;
  nb_array **arr = eqn_views(e, q, ptr, in, out, &st);
  if (st == NB_OK) st = nb__rules(q->prim)->async->start(ctx, q, arr, arr + q->nin, &f->pending[s]);
  if (st != NB_OK && nb_ctx_status(ctx) == NB_OK)
    nb_errorf(ctx, st, "%s failed at run time (traced at %s:%d)", nb__rules(q->prim)->name, q->loc.file ? q->loc.file : "?", q->loc.line);
  views_free(ctx, q, arr);
  return st;
}

static nb_status wait_step(nb_exe *e, inflight *f, int s) {
  int from = e->plan.steps[s].start;
  void *p = f->pending[from];
  f->pending[from] = NULL;
  return p ? nb__rules(e->plan.steps[s].eqn->prim)->async->finish(e->ctx, p) : NB_OK; /* NULL: it finished at once */
}

/* After a failed step: what is still in flight is waited for (its buffers
 * are about to go) and freed. */
static void land_all(nb_exe *e, inflight *f) {
  for (int s = 0; s < f->n; s++)
    if (f->pending[s]) {
      nb__rules(f->steps[s].eqn->prim)->async->finish(e->ctx, f->pending[s]);
      f->pending[s] = NULL;
    }
}

/* ---------------------------------------------------------------- binding */

static nb_status check_inputs(nb_exe *e, nb_array *const *in) {
  const nb_graph *g = e->graph;
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) {
    nb_aval want = nb_val_aval(nb__graph_input(g, i)), got;
    if (!in[i]) return nb_errorf(e->ctx, NB_ERR_INVALID_ARG, "nb_exe_run: no array for input '%s'", nb_graph_input_path(g, i));
    got = nb_array_aval(in[i]);
    if (!nb_aval_equal(&want, &got)) {
      char a[128], b[128];
      return nb_errorf(e->ctx, want.dtype != got.dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE, "nb_exe_run: input '%s' is %s, the executable wants %s",
                       nb_graph_input_path(g, i), nb_aval_str(&got, a, sizeof a), nb_aval_str(&want, b, sizeof b));
    }
    if (nb_array_device(in[i]).kind != NB_DEVICE_CPU)
      return nb_errorf(e->ctx, NB_ERR_UNIMPLEMENTED, "nb_exe_run: input '%s' is not a host array", nb_graph_input_path(g, i));
  }
  return NB_OK;
}

/* May an output take donated input d's memory now? Only when nobody else
 * holds it, not even through another input of this run (the same array, or
 * a wrapped view of its memory). */
static bool can_take(const nb_exe *e, nb_array *const *in, int d) {
  nb_array *x = in[d];
  if (!nb__array_is_sole_owner(x)) return false;
  uintptr_t lo = (uintptr_t)nb_array_data(x), hi = lo + nb_array_nbytes(x);
  for (size_t i = 0; i < nb_graph_num_inputs(e->graph); i++) {
    uintptr_t a = (uintptr_t)nb_array_data(in[i]), b = a + nb_array_nbytes(in[i]);
    if ((int)i != d && (in[i] == x || (a < hi && lo < b))) return false;
  }
  return true;
}

static nb_status bind_outputs(nb_exe *e, nb_array *const *in, nb_array **out) {
  const nb_graph *g = e->graph;
  for (size_t i = 0; i < nb_graph_num_outputs(g); i++) {
    const nb_val *v = nb__graph_output(g, i);
    const nb_jbuf *b = &e->plan.bufs[v->id];
    nb_array *a = NULL;
    if (b->cls == NB_BUF_INPUT) a = in[b->index];
    else if (b->cls == NB_BUF_CONST) a = b->constant;
    else if (b->index != (int)i) a = out[b->index];
    if (a) {
      nb_array_retain(a);
    } else if (b->donor >= 0 && can_take(e, in, b->donor)) {
      a = in[b->donor];
      nb_array_retain(a);
    } else if (!(a = nb_array_empty(e->ctx, v->aval.dtype, v->aval.shape.rank, v->aval.shape.dims))) {
      return NB_ERR_NOMEM;
    }
    out[i] = a;
  }
  return NB_OK;
}

/* intermediates of an in-place chain that ends in an output live in it;
 * views (a reshape, a contiguous slice) in their operand's memory */
static void bind_aliases(nb_exe *e, char **ptr) {
  for (size_t v = 0; v < e->plan.nvals; v++)
    if (e->plan.bufs[v].cls == NB_BUF_TEMP && e->plan.bufs[v].alias >= 0) ptr[v] = ptr[e->plan.bufs[v].alias];
  for (size_t v = 0; v < e->plan.nvals; v++)
    if (e->plan.bufs[v].cls == NB_BUF_TEMP && e->plan.bufs[v].view >= 0) ptr[v] = ptr[e->plan.bufs[v].view] + e->plan.bufs[v].view_offset;
}

static void bind_pointers(nb_exe *e, char *arena, nb_array *const *in, nb_array **out, char **ptr) {
  for (size_t v = 0; v < e->plan.nvals; v++) {
    const nb_jbuf *b = &e->plan.bufs[v];
    switch (b->cls) {
    case NB_BUF_INPUT: ptr[v] = (char *)nb_array_data(in[b->index]); break;
    case NB_BUF_CONST: ptr[v] = (char *)nb_array_data(b->constant); break;
    case NB_BUF_TEMP: ptr[v] = arena + b->offset; break;
    case NB_BUF_OUTPUT: ptr[v] = nb_array_data_mut(out[b->index]); break;
    default: ptr[v] = NULL; break;
    }
  }
  bind_aliases(e, ptr);
}

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/* On a backend whose memory is not the host's, inputs, constants and
 * outputs get device buffers (one allocation, *io) in place of the host
 * pointers in ptr, and inputs and constants are copied in. */
static nb_status bind_device(nb_exe *e, char **ptr, char **io, size_t *io_bytes) {
  const nb_backend *bk = e->cfg.backend;
  size_t total = 0;
  for (size_t v = 0; v < e->plan.nvals; v++) {
    nb_buf_class c = e->plan.bufs[v].cls;
    if (c == NB_BUF_INPUT || c == NB_BUF_CONST || c == NB_BUF_OUTPUT) total += ALIGN64(e->plan.bufs[v].nbytes);
  }
  if (total && !(*io = bk->alloc(e->ctx, total))) return nb_ctx_status(e->ctx) ? nb_ctx_status(e->ctx) : NB_ERR_NOMEM;
  *io_bytes = total;
  nb_status st = NB_OK;
  size_t off = 0;
  for (size_t v = 0; v < e->plan.nvals && st == NB_OK; v++) {
    const nb_jbuf *b = &e->plan.bufs[v];
    if (b->cls != NB_BUF_INPUT && b->cls != NB_BUF_CONST && b->cls != NB_BUF_OUTPUT) continue;
    char *d = *io + off;
    if (b->cls != NB_BUF_OUTPUT) st = bk->to_device(e->ctx, d, ptr[v], b->nbytes);
    ptr[v] = d;
    off += ALIGN64(b->nbytes);
  }
  bind_aliases(e, ptr);
  return st;
}

/* ... and the outputs come back once the steps are done. */
static nb_status copy_outputs(nb_exe *e, char **ptr, nb_array **out) {
  nb_status st = NB_OK;
  for (size_t v = 0; v < e->plan.nvals && st == NB_OK; v++) {
    const nb_jbuf *b = &e->plan.bufs[v];
    if (b->cls == NB_BUF_OUTPUT) st = e->cfg.backend->to_host(e->ctx, nb_array_data_mut(out[b->index]), ptr[v], b->nbytes);
  }
  return st;
}

/* A step as a span of a trace (src/util/trace.h): "k12 add+mul+exp" (a
 * fused kernel) or the primitive's name and result type ("dot_general
 * f32[128,768]"), with its source ops, where they
 * were traced and its cost. On a backend with a stream (CUDA) it spans the
 * launch, not the kernel. */
static void trace_step(const nb_jstep *step, int64_t t0, int64_t t1, int64_t ref) {
  static const char *const cats[NB_EXE_STEP_KIND_COUNT] = {
      [NB_EXE_STEP_KERNEL] = "kernel", [NB_EXE_STEP_EVAL] = "eval", [NB_EXE_STEP_BLAS] = "gemm", [NB_EXE_STEP_CONTROL] = "control",
      [NB_EXE_STEP_START] = "collective", [NB_EXE_STEP_WAIT] = "collective"};
  char name[sizeof step->name + sizeof step->ops + 96], at[NB_UTIL_TRACE_STR + 16]; /* the recorder keeps what fits */
  char aval[96] = "";
  if (step->kind != NB_EXE_STEP_KERNEL && step->eqn && step->eqn->nout) nb_aval_str(&step->eqn->out[0]->aval, aval, sizeof aval);
  if (step->kind == NB_EXE_STEP_KERNEL) snprintf(name, sizeof name, "%s %s", step->name, step->ops);
  else snprintf(name, sizeof name, "%s %s", step->name, aval); /* "dot_general f32[128,768]": one row per shape in a table */
  const char *file = step->loc.file ? step->loc.file : ""; /* its folder and name: "nn/apply.c" */
  for (const char *p = file, *last = NULL; *p; p++)
    if (*p == '/') file = last ? last + 1 : file, last = p;
  snprintf(at, sizeof at, "%s:%d", file, step->loc.line);
  /* "at" last, left out when unknown (a copy into an output that no equation computes) */
  nb_util__trace_arg args[] = {{"ops", step->ops, 0}, {"flops", NULL, step->flops}, {"bytes", NULL, step->bytes}, {"at", at, 0}};
  const char *cat = step->kind < NB_EXE_STEP_KIND_COUNT && cats[step->kind] ? cats[step->kind] : "step";
  nb_util__trace_span_ref(cat, name, t0, t1, args, step->loc.file ? 4 : 3, ref);
}

static nb_status run_steps(nb_exe *e, char **ptr, char **args, nb_array *const *in, nb_array **out, double *ms) {
  const nb_backend *bk = e->cfg.backend;
  nb_status st = NB_OK;
  int64_t ref = 0; /* e's steps in this trace, once a step is traced */
  inflight *fl = NULL; /* a plan with collectives to start: what is in flight (heap: `flying` points to it) */
  size_t nfl = (size_t)e->plan.nsteps + 1;
  if (e->plan.nstarts) {
    fl = nb_calloc(e->ctx, sizeof *fl + nfl * (sizeof *fl->pending + 1));
    if (!fl) return NB_ERR_NOMEM;
    *fl = (inflight){e->ctx, e->plan.steps, (void **)(fl + 1), NULL, 0, e->plan.nsteps, flying};
    fl->through = (uint8_t *)(fl->pending + nfl);
    flying = fl;
  }
  for (int s = 0; s < e->plan.nsteps && st == NB_OK; s++) {
    const nb_jstep *step = &e->plan.steps[s];
    const nb_eqn *q = step->eqn;
    bool traced = nb_util__tracing();
    int64_t t0 = nb_util__now_ns();
    switch (step->kind) {
    case NB_EXE_STEP_KERNEL: {
      const nb_kernel *k = &e->plan.kernels[step->kernel];
      for (int a = 0; a < k->nargs; a++) args[a] = ptr[k->args[a]];
      st = bk->launch(e->ctx, e->mod, step->kernel, args);
      break;
    }
    case NB_EXE_STEP_BLAS:
      for (int i = 0; i < q->nin + q->nout; i++) args[i] = ptr[(i < q->nin ? q->in[i] : q->out[i - q->nin])->id];
      st = bk->library(e->ctx, e->mod, q, args);
      break;
    case NB_EXE_STEP_CONTROL: st = nb_rt__run_control(e, step, ptr); break;
    case NB_EXE_STEP_START: st = start_step(e, fl, s, ptr, in, out); break;
    case NB_EXE_STEP_WAIT: st = wait_step(e, fl, s); break;
    default: st = bk->host_memory ? run_eval(e, q, ptr, in, out) : run_eval_staged(e, q, ptr); break;
    }
    int64_t t1 = nb_util__now_ns();
    if (st == NB_OK && flying && step->kind != NB_EXE_STEP_WAIT) st = progress(); /* not the step's time */
    ms[s] += (double)(t1 - t0) * 1e-6;
    if (traced && !ref) nb_rt__trace_note(e), ref = nb_rt__trace_ref(e);
    if (traced) trace_step(step, t0, t1, ref + s);
  }
  if (fl) {
    land_all(e, fl);
    flying = fl->outer;
    nb_dealloc(e->ctx, fl, sizeof *fl + nfl * (sizeof *fl->pending + 1));
  }
  return st;
}

/* ---------------------------------------------------------------- run */

static nb_status run_native(nb_exe *e, nb_array *const *in, nb_array **out) {
  nb_ctx *ctx = e->ctx;
  const nb_backend *bk = e->cfg.backend;
  size_t nout = nb_graph_num_outputs(e->graph), nv = e->plan.nvals;
  size_t nargs = (size_t)e->max_args + 1, nsteps = (size_t)e->plan.nsteps + 1;
  char **ptr = nb_calloc(ctx, sizeof(char *) * (nv + 1));
  char **args = nb_calloc(ctx, sizeof(char *) * nargs);
  double *ms = nb_calloc(ctx, sizeof(double) * nsteps);
  nb_status st = ptr && args && ms ? NB_OK : NB_ERR_NOMEM;
  if (st == NB_OK) st = bind_outputs(e, in, out);
  /* one run at a time uses the executable's arena; others bring their own */
  bool own = pthread_mutex_trylock(&e->mu) == 0;
  char *arena = NULL;
  size_t need = e->plan.arena_bytes;
  if (st == NB_OK && own && e->arena_cap < need) {
    bk->free(ctx, e->arena, e->arena_cap);
    e->arena = bk->alloc(ctx, need);
    e->arena_cap = e->arena ? need : 0;
  }
  if (st == NB_OK) arena = own ? e->arena : need ? bk->alloc(ctx, need) : NULL;
  if (st == NB_OK && need && !arena) st = NB_ERR_NOMEM;
  char *io = NULL;
  size_t io_bytes = 0;
  if (st == NB_OK) {
    bind_pointers(e, arena, in, out, ptr);
    if (!bk->host_memory) st = bind_device(e, ptr, &io, &io_bytes);
  }
  if (st == NB_OK) st = run_steps(e, ptr, args, in, out, ms);
  if (st == NB_OK) st = bk->synchronize(ctx, e->mod);
  if (st == NB_OK && !bk->host_memory) st = copy_outputs(e, ptr, out);
  if (io) bk->free(ctx, io, io_bytes);
  if (!own) {
    bk->free(ctx, arena, need);
    pthread_mutex_lock(&e->mu);
  }
  for (int s = 0; st == NB_OK && s < e->plan.nsteps; s++) {
    e->plan.steps[s].last_ms = ms[s];
    e->plan.steps[s].total_ms += ms[s];
  }
  pthread_mutex_unlock(&e->mu);
  if (st != NB_OK)
    for (size_t i = 0; i < nout; i++) {
      nb_array_release(out[i]);
      out[i] = NULL;
    }
  nb_dealloc(ctx, ptr, sizeof(char *) * (nv + 1));
  nb_dealloc(ctx, args, sizeof(char *) * nargs);
  nb_dealloc(ctx, ms, sizeof(double) * nsteps);
  if (st == NB_ERR_NOMEM && nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, NB_ERR_NOMEM, "nb_exe_run: out of memory");
  return st;
}

nb_status nb_rt__run(nb_exe *e, nb_array *const *in, nb_array **out) {
  size_t nout = nb_graph_num_outputs(e->graph);
  for (size_t i = 0; i < nout; i++) out[i] = NULL;
  nb_status st = check_inputs(e, in);
  if (st != NB_OK) return st;
  int64_t t0 = nb_util__trace_start();
  st = e->native ? run_native(e, in, out) : nb_graph_run_flat(e->ctx, e->graph, in, out);
  if (t0 && st == NB_OK && e->native) nb_util__trace_run(e, e->key, nb_util__now_ns() - t0); /* the memory and graph viewers */
  pthread_mutex_lock(&e->mu);
  bool first = e->runs++ == 0;
  pthread_mutex_unlock(&e->mu);
  if (st == NB_OK && first && e->cfg.debug >= 2) nb_rt__log_steps(e);
  return st;
}

nb_status nb_exe_run_flat(nb_exe *e, nb_array *const *in, nb_array **out) {
  if (!e || (!in && nb_graph_num_inputs(e->graph)) || !out)
    return e ? nb_errorf(e->ctx, NB_ERR_INVALID_ARG, "nb_exe_run_flat: NULL argument") : NB_ERR_INVALID_ARG;
  return nb_rt__run(e, in, out);
}

nb_status nb_exe_run(nb_exe *e, const nb_tree *inputs, nb_tree *outputs) {
  if (!e) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = e->ctx;
  if (!inputs || !outputs) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_exe_run: NULL argument");
  size_t nin = nb_graph_num_inputs(e->graph), nout = nb_graph_num_outputs(e->graph);
  nb_array **in = nb_calloc(ctx, (nin + 1) * sizeof(nb_array *));
  nb_array **out = nb_calloc(ctx, (nout + 1) * sizeof(nb_array *));
  nb_status st = in && out ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    const char *path = nb_graph_input_path(e->graph, i);
    if (!(in[i] = nb_tree_get_array(inputs, path)))
      st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_exe_run: inputs have no array at '%s'", path);
  }
  if (st == NB_OK) st = nb_rt__run(e, in, out);
  for (size_t i = 0; st == NB_OK && i < nout; i++) st = nb_tree_set_array(outputs, nb_graph_output_path(e->graph, i), out[i]);
  for (size_t i = 0; out && i < nout; i++) nb_array_release(out[i]);
  nb_dealloc(ctx, in, (nin + 1) * sizeof(nb_array *));
  nb_dealloc(ctx, out, (nout + 1) * sizeof(nb_array *));
  if (st == NB_ERR_NOMEM && nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, NB_ERR_NOMEM, "nb_exe_run: out of memory");
  return st;
}

/* ---------------------------------------------------------------- bound memory */

/* A body's constants, bound once per frame: the host arrays in place, or
 * (memory not the host's) device copies made when the frame opens, so that
 * iterations copy nothing in. */
static nb_status bind_constants(nb_exe *e, nb_rt_frame *f) {
  const nb_backend *bk = e->cfg.backend;
  for (size_t v = 0; v < e->plan.nvals; v++)
    if (e->plan.bufs[v].cls == NB_BUF_CONST) {
      f->ptr[v] = (char *)nb_array_data(e->plan.bufs[v].constant);
      f->consts_bytes += ALIGN64(e->plan.bufs[v].nbytes);
    }
  if (bk->host_memory || !f->consts_bytes) {
    f->consts_bytes = 0;
    return NB_OK;
  }
  if (!(f->consts = bk->alloc(e->ctx, f->consts_bytes))) {
    f->consts_bytes = 0;
    return nb_ctx_status(e->ctx) ? nb_ctx_status(e->ctx) : NB_ERR_NOMEM;
  }
  nb_status st = NB_OK;
  size_t off = 0;
  for (size_t v = 0; v < e->plan.nvals && st == NB_OK; v++)
    if (e->plan.bufs[v].cls == NB_BUF_CONST) {
      st = bk->to_device(e->ctx, f->consts + off, f->ptr[v], e->plan.bufs[v].nbytes);
      f->ptr[v] = f->consts + off;
      off += ALIGN64(e->plan.bufs[v].nbytes);
    }
  return st;
}

nb_status nb_rt__frame_open(nb_exe *e, nb_rt_frame *f) {
  nb_ctx *ctx = e->ctx;
  memset(f, 0, sizeof *f);
  f->nptr = e->plan.nvals + 1;
  f->nargs = (size_t)e->max_args + 1;
  f->nms = (size_t)e->plan.nsteps + 1;
  f->arena_bytes = e->plan.arena_bytes;
  f->ptr = nb_calloc(ctx, sizeof(char *) * f->nptr);
  f->args = nb_calloc(ctx, sizeof(char *) * f->nargs);
  f->ms = nb_calloc(ctx, sizeof(double) * f->nms);
  f->arena = f->arena_bytes ? e->cfg.backend->alloc(ctx, f->arena_bytes) : NULL;
  if (!f->ptr || !f->args || !f->ms || (!f->arena && f->arena_bytes)) {
    nb_rt__frame_close(e, f);
    return nb_errorf(ctx, NB_ERR_NOMEM, "nb_exe_run: out of memory for a loop body's buffers");
  }
  nb_status st = bind_constants(e, f);
  if (st != NB_OK) nb_rt__frame_close(e, f);
  return st;
}

nb_status nb_rt__run_frame(nb_exe *e, nb_rt_frame *f, char *const *in, char *const *out) {
  const nb_graph *g = e->graph;
  char **ptr = f->ptr;
  for (size_t v = 0; v < e->plan.nvals; v++) {
    const nb_jbuf *b = &e->plan.bufs[v];
    switch (b->cls) {
    case NB_BUF_INPUT: ptr[v] = in[b->index]; break;
    case NB_BUF_CONST: break; /* bound when the frame opened */
    case NB_BUF_TEMP: ptr[v] = f->arena + b->offset; break;
    case NB_BUF_OUTPUT: ptr[v] = out[b->index]; break;
    default: ptr[v] = NULL; break;
    }
  }
  bind_aliases(e, ptr);
  /* no synchronize: the next iteration's steps and copies queue behind these */
  nb_status st = run_steps(e, ptr, f->args, NULL, NULL, f->ms);
  /* outputs that are inputs, constants or another output's value: copied */
  for (size_t i = 0; st == NB_OK && i < nb_graph_num_outputs(g); i++) {
    const nb_val *v = nb__graph_output(g, i);
    const nb_jbuf *b = &e->plan.bufs[v->id];
    if (b->cls == NB_BUF_OUTPUT && b->index == (int)i) continue;
    size_t n = nb_shape_size(&v->aval.shape) * nb_dtype_size(v->aval.dtype);
    if (n && out[i] != ptr[v->id]) st = e->cfg.backend->copy(e->ctx, out[i], ptr[v->id], n);
  }
  return st;
}

void nb_rt__frame_flush(nb_exe *e, nb_rt_frame *f, uint64_t runs) {
  if (!f->ms) return;
  pthread_mutex_lock(&e->mu);
  for (int s = 0; s < e->plan.nsteps; s++) {
    e->plan.steps[s].last_ms = f->ms[s];
    e->plan.steps[s].total_ms += f->ms[s];
    f->ms[s] = 0;
  }
  e->runs += runs;
  pthread_mutex_unlock(&e->mu);
}

void nb_rt__frame_close(nb_exe *e, nb_rt_frame *f) {
  nb_ctx *ctx = e->ctx;
  nb_dealloc(ctx, f->ptr, sizeof(char *) * f->nptr);
  nb_dealloc(ctx, f->args, sizeof(char *) * f->nargs);
  nb_dealloc(ctx, f->ms, sizeof(double) * f->nms);
  if (f->arena) e->cfg.backend->free(ctx, f->arena, f->arena_bytes);
  if (f->consts) e->cfg.backend->free(ctx, f->consts, f->consts_bytes);
  memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------- stats */

void nb_exe_get_stats(const nb_exe *e, nb_exe_stats *s) {
  memset(s, 0, sizeof *s);
  if (!e) return;
  s->peak_bytes = e->plan.peak_bytes;
  s->arena_bytes = e->plan.arena_bytes;
  s->output_bytes = e->plan.output_bytes;
  s->nsteps = (size_t)e->plan.nsteps;
  for (int i = 0; i < e->plan.nsteps; i++) {
    nb_exe_step_kind k = e->plan.steps[i].kind;
    s->nkernels += k == NB_EXE_STEP_KERNEL;
    s->neval += k == NB_EXE_STEP_EVAL;
    s->nblas += k == NB_EXE_STEP_BLAS;
  }
  s->native = e->native;
  s->from_disk_cache = e->build.from_cache;
  s->backend = e->cfg.backend ? e->cfg.backend->name : NULL;
  s->compile_ms = e->compile_ms;
  s->runs = e->runs;
}

size_t nb_exe_num_steps(const nb_exe *e) { return e ? (size_t)e->plan.nsteps : 0; }

nb_status nb_exe_step(const nb_exe *e, size_t i, nb_exe_step_info *out) {
  if (!e || !out) return NB_ERR_INVALID_ARG;
  if (i >= (size_t)e->plan.nsteps)
    return nb_errorf(e->ctx, NB_ERR_INVALID_ARG, "nb_exe_step: step %zu out of range (%d steps)", i, e->plan.nsteps);
  const nb_jstep *s = &e->plan.steps[i];
  *out = (nb_exe_step_info){s->kind, s->name, s->neqns, s->flops, s->bytes, s->last_ms, s->total_ms};
  return NB_OK;
}

/* ---------------------------------------------------------------- the buffer plan, for profilers */

size_t nb_exe_num_values(const nb_exe *e) { return e ? e->plan.nvals : 0; }

nb_status nb_exe_buffer(const nb_exe *e, size_t v, nb_exe_buffer_info *out) {
  if (!e || !out) return NB_ERR_INVALID_ARG;
  if (v >= e->plan.nvals) return nb_errorf(e->ctx, NB_ERR_INVALID_ARG, "nb_exe_buffer: value %zu out of range (%zu values)", v, e->plan.nvals);
  static const nb_exe_buffer_kind kinds[] = {[NB_BUF_NONE] = NB_EXE_BUF_NONE, [NB_BUF_INPUT] = NB_EXE_BUF_INPUT,
                                             [NB_BUF_CONST] = NB_EXE_BUF_CONST, [NB_BUF_TEMP] = NB_EXE_BUF_TEMP,
                                             [NB_BUF_OUTPUT] = NB_EXE_BUF_OUTPUT};
  const nb_jbuf *b = &e->plan.bufs[v];
  bool temp = b->cls == NB_BUF_TEMP;
  *out = (nb_exe_buffer_info){.kind = kinds[b->cls],
                              .value = e->plan.vals ? e->plan.vals[v] : NULL,
                              .index = b->index,
                              .offset = temp ? b->offset : 0,
                              .nbytes = b->nbytes,
                              .def_step = b->cls == NB_BUF_INPUT || b->cls == NB_BUF_CONST ? -1 : b->def_step,
                              .last_step = b->last_step,
                              .donor = b->cls == NB_BUF_OUTPUT ? b->donor : -1,
                              .shares = !temp ? -1 : b->view >= 0 ? b->view : b->alias};
  return NB_OK;
}

size_t nb_exe_step_operands(const nb_exe *e, size_t i, nb_exe_operand *out, size_t cap) {
  if (!e || i >= (size_t)e->plan.nsteps) return 0;
  const nb_jstep *st = &e->plan.steps[i];
  size_t n = 0;
  if (st->kind == NB_EXE_STEP_KERNEL) {
    const nb_kernel *k = &e->plan.kernels[st->kernel];
    for (int a = 0; a < k->nargs; a++, n++)
      if (n < cap) out[n] = (nb_exe_operand){k->args[a], k->arg_written[a]};
  } else {
    for (int j = 0; j < st->eqn->nin + st->eqn->nout; j++, n++)
      if (n < cap) {
        bool w = j >= st->eqn->nin;
        out[n] = (nb_exe_operand){(w ? st->eqn->out[j - st->eqn->nin] : st->eqn->in[j])->id, w};
      }
  }
  return n;
}

const char *nb_exe_step_ops(const nb_exe *e, size_t i, nb_loc *loc) {
  if (!e || i >= (size_t)e->plan.nsteps) return NULL;
  if (loc) *loc = e->plan.steps[i].loc;
  return e->plan.steps[i].ops;
}

const char *nb_exe_source_path(const nb_exe *e) { return e && e->native && e->build.source[0] ? e->build.source : NULL; }
const nb_graph *nb_exe_graph(const nb_exe *e) { return e ? e->graph : NULL; }

void nb_rt__log_steps(const nb_exe *e) {
  for (int i = 0; i < e->plan.nsteps; i++) {
    const nb_jstep *s = &e->plan.steps[i];
    double gbs = s->last_ms > 0 ? s->bytes / (s->last_ms * 1e6) : 0, gfl = s->last_ms > 0 ? s->flops / (s->last_ms * 1e6) : 0;
    nb_logf(e->ctx, NB_LOG_INFO, "jit step %d %-12s %8.3f ms  %10.3g flops %10.3g bytes  %6.2f GB/s %6.2f GFLOP/s", i, s->name,
            s->last_ms, s->flops, s->bytes, gbs, gfl);
  }
}

void nb_rt__exe_free(nb_exe *e) {
  nb_ctx *ctx = e->ctx;
  nb_jit__control_free(e);
  if (e->mod) e->cfg.backend->release(e->mod);
  nb_graph_destroy(e->graph);
  if (e->arena) e->cfg.backend->free(ctx, e->arena, e->arena_cap);
  nb_jit__arena_free(&e->ar);
  pthread_mutex_destroy(&e->mu);
  nb_dealloc(ctx, e, sizeof *e);
}
