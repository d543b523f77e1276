/* Control steps at run time, on any backend: a cond runs the taken
 * branch's executable on the step's buffers; a while_loop or scan runs its
 * body's executable once per iteration on the same frame (pointer table,
 * arena) so iterations allocate nothing. The carry lives in two buffers, the step's results and
 * one scratch buffer, that swap roles every iteration (the body reads one
 * and writes the other); a scan starts in the buffer that makes its last
 * iteration end in the results, a while loop copies at the end when it has
 * to. A scan's xs are read and its ys written in place, as the slice at the
 * iteration index. Everything goes through the backend (backend.h): the
 * buffers are device memory, never read or written here; carries move with
 * its copy, and a cond's index and a while loop's predicate come to the host
 * with to_host after a synchronize. Not here: compiling the bodies
 * (compile/control.c). */
#include <string.h>

#include "compile/control.h"

#define MAX_OPERANDS 512

static size_t val_bytes(const nb_val *v) { return nb_shape_size(&v->aval.shape) * nb_dtype_size(v->aval.dtype); }
static size_t aligned(size_t n) { return (n + 63) & ~(size_t)63; }

/* The frames and scratch of one run of the step: the cached ones, or (while
 * another thread runs the same executable) fresh ones. */
typedef struct state {
  nb_jcontrol *c;
  bool own;
  nb_rt_frame *frames, local[2];
  char *scratch;
} state;

static nb_status open_state(nb_exe *e, nb_jcontrol *c, bool cond, state *s) {
  memset(s, 0, sizeof *s);
  s->c = c;
  s->own = pthread_mutex_trylock(&c->mu) == 0;
  bool fresh = !s->own || !c->opened;
  nb_rt_frame *frames = s->own ? c->frames : s->local;
  int nopen = s->own ? c->nsub : cond ? 0 : c->nsub; /* not own: a cond opens the taken branch's later */
  nb_status st = NB_OK;
  if (fresh) {
    char *scratch = c->scratch_bytes ? e->cfg.backend->alloc(e->ctx, c->scratch_bytes) : NULL;
    if (c->scratch_bytes && !scratch && nb_ctx_status(e->ctx) == NB_OK)
      nb_errorf(e->ctx, NB_ERR_NOMEM, "nb_exe_run: out of memory for a loop's carry");
    if (c->scratch_bytes && !scratch) st = nb_ctx_status(e->ctx);
    int i = 0;
    for (; st == NB_OK && i < nopen; i++) st = nb_rt__frame_open(c->sub[i], &frames[i]);
    if (st != NB_OK) {
      while (i-- > 0) nb_rt__frame_close(c->sub[i], &frames[i]);
      if (scratch) e->cfg.backend->free(e->ctx, scratch, c->scratch_bytes);
      if (s->own) pthread_mutex_unlock(&c->mu);
      return st;
    }
    if (s->own) {
      c->scratch = scratch;
      c->opened = true;
    } else {
      s->scratch = scratch;
    }
  }
  s->frames = frames;
  if (s->own) s->scratch = c->scratch;
  return NB_OK;
}

static void close_state(nb_exe *e, state *s, int nopened) {
  if (s->own) {
    pthread_mutex_unlock(&s->c->mu);
    return;
  }
  for (int i = 0; i < nopened; i++) nb_rt__frame_close(s->c->sub[i], &s->frames[i]);
  if (s->scratch) e->cfg.backend->free(e->ctx, s->scratch, s->c->scratch_bytes);
}

/* bytes of device memory at src on the host, once the steps writing them are done */
static nb_status read_back(nb_exe *e, void *dst, const char *src, size_t bytes) {
  nb_status st = e->cfg.backend->synchronize(e->ctx, e->mod);
  return st == NB_OK ? e->cfg.backend->to_host(e->ctx, dst, src, bytes) : st;
}

/* The initial carry into the buffer of the first iteration (nothing to do
 * when it already is there: a donated carry). */
static nb_status carry_in(nb_exe *e, const nb_eqn *q, int first, int ncarry, char *const *ptr, char *const *cur) {
  nb_status st = NB_OK;
  for (int j = 0; j < ncarry && st == NB_OK; j++) {
    const nb_val *init = q->in[first + j];
    if (val_bytes(init) && cur[j] != ptr[init->id]) st = e->cfg.backend->copy(e->ctx, cur[j], ptr[init->id], val_bytes(init));
  }
  return st;
}

/* ---------------------------------------------------------------- cond */

static nb_status run_cond(nb_exe *e, const nb_jstep *step, char **ptr, state *s) {
  const nb_eqn *q = step->eqn;
  nb_jcontrol *c = step->control;
  const nb_val *index = q->in[0];
  int64_t k;
  if (index->aval.dtype == NB_BOOL) {
    uint8_t b = 0;
    nb_status st = read_back(e, &b, ptr[index->id], 1);
    if (st != NB_OK) return st;
    k = b != 0;
  } else {
    int32_t i = 0;
    nb_status st = read_back(e, &i, ptr[index->id], sizeof i);
    if (st != NB_OK) return st;
    k = i;
  }
  k = k < 0 ? 0 : k >= c->nsub ? c->nsub - 1 : k; /* switch clamps, as lax.switch */
  char *in[MAX_OPERANDS], *out[MAX_OPERANDS];
  for (int i = 1; i < q->nin; i++) in[i - 1] = ptr[q->in[i]->id];
  for (int i = 0; i < q->nout; i++) out[i] = ptr[q->out[i]->id];
  nb_exe *b = c->sub[k];
  nb_rt_frame *f = &s->frames[k];
  nb_status st = NB_OK;
  if (!s->own) { /* a concurrent run: a frame of its own for the taken branch */
    f = &s->local[0];
    if ((st = nb_rt__frame_open(b, f)) != NB_OK) return st;
  }
  st = nb_rt__run_frame(b, f, in, out);
  nb_rt__frame_flush(b, f, 1);
  if (!s->own) nb_rt__frame_close(b, f);
  return st;
}

/* ---------------------------------------------------------------- loops */

/* The carry's two buffers: res[j] (the step's results) and tmp[j] (scratch,
 * which after the carry holds a while loop's predicate). */
static void carry_buffers(const nb_eqn *q, char **ptr, char *scratch, int ncarry, char **res, char **tmp) {
  size_t off = 0;
  for (int j = 0; j < ncarry; j++) {
    res[j] = ptr[q->out[j]->id];
    tmp[j] = scratch + off;
    off += aligned(val_bytes(q->out[j]));
  }
}

static void swap(char **a, char **b, int n) {
  for (int j = 0; j < n; j++) {
    char *t = a[j];
    a[j] = b[j];
    b[j] = t;
  }
}

static nb_status run_while(nb_exe *e, const nb_jstep *step, char **ptr, state *s) {
  const nb_eqn *q = step->eqn;
  const nb_while_params *p = q->params;
  nb_exe *pred = s->c->sub[0], *body = s->c->sub[1];
  int nc = p->ncond_consts, nb = p->nbody_consts, ncarry = q->nin - nc - nb;
  char *cur[MAX_OPERANDS], *next[MAX_OPERANDS], *res[MAX_OPERANDS];
  char *pin[MAX_OPERANDS], *bin[MAX_OPERANDS];
  carry_buffers(q, ptr, s->scratch, ncarry, res, next);
  memcpy(cur, res, sizeof(char *) * (size_t)ncarry);
  nb_status st = carry_in(e, q, nc + nb, ncarry, ptr, cur);
  for (int i = 0; i < nc; i++) pin[i] = ptr[q->in[i]->id];
  for (int i = 0; i < nb; i++) bin[i] = ptr[q->in[nc + i]->id];
  uint8_t go = 0;
  char *pout[1] = {s->scratch + s->c->pred_offset};
  uint64_t iters = 0;
  while (st == NB_OK) {
    memcpy(pin + nc, cur, sizeof(char *) * (size_t)ncarry);
    if ((st = nb_rt__run_frame(pred, &s->frames[0], pin, pout)) != NB_OK) break;
    if ((st = read_back(pred, &go, pout[0], 1)) != NB_OK || !go) break;
    memcpy(bin + nb, cur, sizeof(char *) * (size_t)ncarry);
    if ((st = nb_rt__run_frame(body, &s->frames[1], bin, next)) != NB_OK) break;
    swap(cur, next, ncarry);
    iters++;
  }
  for (int j = 0; st == NB_OK && j < ncarry; j++)
    if (cur[j] != res[j] && val_bytes(q->out[j])) st = e->cfg.backend->copy(e->ctx, res[j], cur[j], val_bytes(q->out[j]));
  nb_rt__frame_flush(pred, &s->frames[0], iters + 1);
  nb_rt__frame_flush(body, &s->frames[1], iters);
  return st;
}

static nb_status run_scan(nb_exe *e, const nb_jstep *step, char **ptr, state *s) {
  const nb_eqn *q = step->eqn;
  const nb_scan_params *p = q->params;
  nb_exe *body = s->c->sub[0];
  int nk = p->nconsts, ncarry = p->ncarry, nx = q->nin - nk - ncarry, ny = q->nout - ncarry;
  int64_t n = p->length;
  char *cur[MAX_OPERANDS], *next[MAX_OPERANDS], *res[MAX_OPERANDS], *in[MAX_OPERANDS], *out[MAX_OPERANDS];
  size_t xb[MAX_OPERANDS], yb[MAX_OPERANDS];
  carry_buffers(q, ptr, s->scratch, ncarry, res, next);
  /* after n swaps the carry is back where it started when n is even */
  if (n % 2) swap(res, next, ncarry);
  memcpy(cur, res, sizeof(char *) * (size_t)ncarry);
  nb_status st = carry_in(e, q, nk, ncarry, ptr, cur);
  for (int i = 0; i < nk; i++) in[i] = ptr[q->in[i]->id];
  for (int i = 0; i < nx; i++) xb[i] = n ? val_bytes(q->in[nk + ncarry + i]) / (size_t)n : 0;
  for (int i = 0; i < ny; i++) yb[i] = n ? val_bytes(q->out[ncarry + i]) / (size_t)n : 0;
  for (int64_t it = 0; it < n && st == NB_OK; it++) {
    int64_t t = p->reverse ? n - 1 - it : it;
    memcpy(in + nk, cur, sizeof(char *) * (size_t)ncarry);
    for (int i = 0; i < nx; i++) in[nk + ncarry + i] = ptr[q->in[nk + ncarry + i]->id] + (size_t)t * xb[i];
    memcpy(out, next, sizeof(char *) * (size_t)ncarry);
    for (int i = 0; i < ny; i++) out[ncarry + i] = ptr[q->out[ncarry + i]->id] + (size_t)t * yb[i];
    st = nb_rt__run_frame(body, &s->frames[0], in, out);
    swap(cur, next, ncarry);
  }
  nb_rt__frame_flush(body, &s->frames[0], (uint64_t)n);
  return st;
}

nb_status nb_rt__run_control(nb_exe *e, const nb_jstep *step, char **ptr) {
  const nb_eqn *q = step->eqn;
  if (q->nin > MAX_OPERANDS || q->nout > MAX_OPERANDS)
    return nb_errorf(e->ctx, NB_ERR_UNIMPLEMENTED, "jit: %s with more than %d operands or results", nb__rules(q->prim)->name, MAX_OPERANDS);
  state s;
  bool cond = q->prim == NB_PRIM_cond;
  nb_status st = open_state(e, step->control, cond, &s);
  if (st != NB_OK) return st;
  st = cond ? run_cond(e, step, ptr, &s) : q->prim == NB_PRIM_scan ? run_scan(e, step, ptr, &s) : run_while(e, step, ptr, &s);
  close_state(e, &s, cond ? 0 : step->control->nsub);
  return st;
}
