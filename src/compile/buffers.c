/* Pass 3, buffer assignment: the live range of every buffer over the
 * schedule (a collective's operands and results from its start step to its
 * wait), in-place updates (an evaluated dynamic_update_slice or
 * scatter_add writing into its dead operand's memory), arena offsets for
 * intermediates (a freed range is reused by later intermediates), which
 * outputs may be written into donated inputs, and the peak-memory estimate.
 * Not here: deciding what gets a buffer (fuse.c) or allocating anything at
 * run time (runtime/exe.c). */
#include <string.h>

#include "compile/jit.h"

#define ALIGN 64

typedef struct live {
  size_t off, size;
  int last;
} live;

static void live_ranges(nb_jplan *p) {
  for (int s = 0; s < p->nsteps; s++) {
    const nb_jstep *st = &p->steps[s];
    if (st->kind == NB_EXE_STEP_KERNEL) {
      const nb_kernel *k = &p->kernels[st->kernel];
      for (int a = 0; a < k->nargs; a++) {
        nb_jbuf *b = &p->bufs[k->args[a]];
        if (k->arg_written[a]) b->def_step = s;
        else b->last_step = s;
      }
    } else if (st->kind == NB_EXE_STEP_WAIT) {
      /* a collective in flight: its operands are still being sent and its
       * results being received from the start step to this one, so both
       * stay live (and unshared) over the whole span */
      for (int i = 0; i < st->eqn->nin; i++) p->bufs[st->eqn->in[i]->id].last_step = s;
      for (int i = 0; i < st->eqn->nout; i++) p->bufs[st->eqn->out[i]->id].last_step = s;
    } else {
      for (int i = 0; i < st->eqn->nin; i++) p->bufs[st->eqn->in[i]->id].last_step = s;
      for (int i = 0; i < st->eqn->nout; i++) p->bufs[st->eqn->out[i]->id].def_step = s;
    }
  }
  for (size_t v = 0; v < p->nvals; v++) {
    nb_jbuf *b = &p->bufs[v];
    if (b->cls == NB_BUF_OUTPUT) b->last_step = p->nsteps;
    if (b->last_step < b->def_step) b->last_step = b->def_step;
  }
  /* a view's readers keep its memory alive */
  for (size_t v = 0; v < p->nvals; v++) {
    const nb_jbuf *b = &p->bufs[v];
    if (b->view >= 0 && p->bufs[b->view].last_step < b->last_step) p->bufs[b->view].last_step = b->last_step;
  }
}

/* Lowest offset where `size` bytes fit between the live ranges. */
static size_t first_fit(const live *l, int n, size_t size) {
  size_t at = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int i = 0; i < n; i++)
      if (at < l[i].off + l[i].size && l[i].off < at + size) {
        at = (l[i].off + l[i].size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
        moved = true;
      }
  }
  return at;
}

/* ---------------------------------------------------------------- in-place chains */

/* A step whose rule is in_place (y = dynamic_update_slice(x, ...),
 * scatter_add; a custom call's output declared in place, per
 * in_place_operand) may write y into x's memory when x dies there. Such edges
 * x -> y form chains (x's last use is one step; y has one defining step),
 * and each chain lives in one piece of memory:
 *  - ending in a graph output: that output's array, from the first member's
 *    definition on; when the chain starts at a donated input, the output
 *    takes that input's memory (at run time only if it is held once;
 *    otherwise the first update copies the input into the fresh output);
 *  - ending in an intermediate: one arena range from the first member's
 *    definition to the last one's last use (a chain from a donated input
 *    ending in an intermediate starts after the input: the input is not
 *    written unless an output takes its place).
 * Invariant: the members of a chain are defined by evaluated steps, except
 * an intermediate head (any step), so no kernel reads one member's memory
 * while writing another's. `reuse` off: no chains through intermediates;
 * `donate` off: none from inputs. */

static bool is_graph_output(const nb_jplan *p, const nb_val *x) {
  for (size_t o = 0; o < nb_graph_num_outputs(p->g); o++)
    if (nb__graph_output(p->g, o) == x) return true;
  return false;
}

/* The operand that output o of step s updates in place by its rule
 * (in_place, in_place_operand), or -1. */
static int updated_operand(const nb_jstep *st, int o) {
  if (st->kind != NB_EXE_STEP_EVAL) return -1;
  const nb_prim_rules *r = nb__rules(st->eqn->prim);
  int j = r->in_place_operand ? r->in_place_operand(st->eqn, o) : r->in_place && st->eqn->nout == 1 && o == 0 ? 0 : -1;
  return j < st->eqn->nin ? j : -1;
}

/* Is output o of step s an update of a dead operand that may write in place? */
static bool updates_in_place(const nb_jplan *p, const nb_jit_config *cfg, int s, int o) {
  const nb_jstep *st = &p->steps[s];
  int j = updated_operand(st, o);
  if (j < 0) return false;
  const nb_eqn *q = st->eqn;
  const nb_val *x = q->in[j], *y = q->out[o];
  const nb_jbuf *bx = &p->bufs[x->id], *by = &p->bufs[y->id];
  if (bx->last_step != s || !nb_aval_equal(&x->aval, &y->aval) || bx->nbytes != by->nbytes) return false;
  if ((by->cls != NB_BUF_TEMP && by->cls != NB_BUF_OUTPUT) || bx->view >= 0) return false;
  for (int i = 0; i < q->nin; i++)
    if (i != j && q->in[i] == x) return false;
  if (bx->cls == NB_BUF_TEMP) return !cfg->off[NB_SW_reuse];
  if (bx->cls == NB_BUF_INPUT) return !cfg->off[NB_SW_donate] && p->donated[bx->index] && !is_graph_output(p, x);
  return false;
}

/* The step's model cost without the copies of the updated operands: the
 * windows written are no larger than the other operands. */
static void in_place_cost(nb_jstep *st) {
  const nb_eqn *q = st->eqn;
  double by = st->bytes;
  for (int i = 0; i < q->nin; i++) {
    bool updated = false;
    for (int o = 0; o < q->nout; o++) updated |= updated_operand(st, o) == i;
    double size = (double)nb_shape_size(&q->in[i]->aval.shape) * (double)nb_dtype_size(q->in[i]->aval.dtype);
    by += updated ? -2.0 * size : size;
  }
  if (by > 0) st->bytes = by;
}

static nb_status plan_in_place(nb_ctx *ctx, nb_jplan *p, const nb_jit_config *cfg) {
  size_t n = p->nvals + 1;
  int *next = nb_alloc(ctx, n * sizeof *next), *step = nb_alloc(ctx, n * sizeof *step);
  bool *has_prev = nb_calloc(ctx, n * sizeof *has_prev);
  nb_status st = next && step && has_prev ? NB_OK : NB_ERR_NOMEM;
  for (size_t v = 0; st == NB_OK && v < n; v++) next[v] = step[v] = -1;
  for (int s = 0; st == NB_OK && s < p->nsteps; s++)
    for (int o = 0; p->steps[s].kind == NB_EXE_STEP_EVAL && o < p->steps[s].eqn->nout; o++)
      if (updates_in_place(p, cfg, s, o)) {
        const nb_eqn *q = p->steps[s].eqn;
        next[q->in[updated_operand(&p->steps[s], o)]->id] = (int)q->out[o]->id;
        step[q->out[o]->id] = s;
        has_prev[q->out[o]->id] = true;
      }
  for (size_t h0 = 0; st == NB_OK && h0 < p->nvals; h0++) {
    if (next[h0] < 0 || has_prev[h0]) continue;
    int h = (int)h0, t = h;
    while (next[t] >= 0) t = next[t];
    bool to_output = p->bufs[t].cls == NB_BUF_OUTPUT;
    if (p->bufs[h].cls == NB_BUF_INPUT) {
      if (to_output) p->bufs[t].donor = p->bufs[h].index;
      h = next[h]; /* the input is not a member: the output takes it whole */
      p->steps[step[h]].in_place |= to_output;
    }
    /* h: the first member that is not an input */
    if (to_output) {
      if (h != t) p->bufs[t].def_step = p->bufs[h].def_step; /* its memory is in use from there */
      for (int m = h; m != t; m = next[m]) p->bufs[m].alias = t;
    } else {
      p->bufs[h].last_step = p->bufs[t].last_step;
      for (int m = next[h]; m >= 0; m = next[m]) p->bufs[m].alias = h;
    }
    for (int m = next[h]; m >= 0; m = next[m]) p->steps[step[m]].in_place = true;
  }
  for (int s = 0; s < p->nsteps; s++)
    if (p->steps[s].in_place) in_place_cost(&p->steps[s]);
  nb_dealloc(ctx, next, n * sizeof *next);
  nb_dealloc(ctx, step, n * sizeof *step);
  nb_dealloc(ctx, has_prev, n * sizeof *has_prev);
  return st;
}

/* ---------------------------------------------------------------- arena */

static nb_status assign_arena(nb_ctx *ctx, nb_jplan *p, bool reuse) {
  size_t cap = p->nvals + 1;
  live *l = nb_alloc(ctx, cap * sizeof *l);
  if (!l) return NB_ERR_NOMEM;
  int n = 0;
  size_t top = 0;
  for (int s = 0; s < p->nsteps; s++) {
    for (size_t v = 0; v < p->nvals; v++) {
      nb_jbuf *b = &p->bufs[v];
      if (b->cls != NB_BUF_TEMP || b->alias >= 0 || b->view >= 0 || b->def_step != s) continue;
      size_t size = (b->nbytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
      b->offset = reuse ? first_fit(l, n, size) : top;
      if (b->offset + size > top) top = b->offset + size;
      l[n++] = (live){b->offset, size, b->last_step};
    }
    for (int i = 0; i < n;)
      if (reuse && l[i].last <= s) l[i] = l[--n];
      else i++;
  }
  nb_dealloc(ctx, l, cap * sizeof *l);
  for (size_t v = 0; v < p->nvals; v++)
    if (p->bufs[v].cls == NB_BUF_TEMP && p->bufs[v].alias >= 0) p->bufs[v].offset = p->bufs[p->bufs[v].alias].offset;
  p->arena_bytes = top;
  return NB_OK;
}

static bool same_map(const nb_kaffine *a, const nb_kaffine *b) { return memcmp(a, b, sizeof *a) == 0; }

/* In the kernel that stores output `out`, is input `in` read only at the
 * element being written (so writing in place is safe)? Safe because code
 * generation computes every stored value of a loop iteration (all roots'
 * cones) before the iteration's first store, and the phases of a row
 * kernel before its stores (backend/cpu/codegen_c.c emit_body, emit_tiled). */
static bool in_place_ok(const nb_jplan *p, const nb_jstep *st, uint32_t in, uint32_t out) {
  if (st->kind == NB_EXE_STEP_CONTROL) return nb_jit__control_in_place_ok(st, in, out);
  if (st->kind != NB_EXE_STEP_KERNEL) return false;
  const nb_kernel *k = &p->kernels[st->kernel];
  int ain = -1, aout = -1;
  for (int a = 0; a < k->nargs; a++) {
    if (k->args[a] == in) ain = a;
    if (k->args[a] == out) aout = a;
  }
  const nb_kaffine *store = NULL;
  for (int i = 0; i < k->nstores; i++)
    if (k->stores[i].arg == aout) store = &k->stores[i].map;
  if (ain < 0 || !store) return false;
  for (int i = 0; i < k->nnodes; i++)
    if (k->nodes[i].kind == NB_KN_LOAD && k->nodes[i].arg == ain && !same_map(&k->nodes[i].map, store)) return false;
  return true;
}

/* Is x's memory also read as a view (a reshape) by some step? */
static bool viewed(const nb_jplan *p, uint32_t x) {
  for (size_t v = 0; v < p->nvals; v++)
    if (p->bufs[v].view == (int)x) return true;
  return false;
}

static bool donates(const nb_jplan *p, size_t i) {
  for (size_t o = 0; o < nb_graph_num_outputs(p->g); o++)
    if (p->bufs[nb__graph_output(p->g, o)->id].donor == (int)i) return true;
  return false;
}

static void assign_donations(nb_jplan *p) {
  size_t nin = nb_graph_num_inputs(p->g);
  for (size_t i = 0; i < nin; i++) {
    if (!p->donated[i]) continue;
    const nb_val *x = nb__graph_input(p->g, i);
    const nb_jbuf *bx = &p->bufs[x->id];
    if (bx->cls != NB_BUF_INPUT || is_graph_output(p, x) || donates(p, i)) continue;
    for (size_t o = 0; o < nb_graph_num_outputs(p->g); o++) {
      const nb_val *y = nb__graph_output(p->g, o);
      nb_jbuf *by = &p->bufs[y->id];
      if (by->cls != NB_BUF_OUTPUT || by->donor >= 0 || !nb_aval_equal(&x->aval, &y->aval) || by->def_step < 0) continue;
      bool before = bx->last_step < by->def_step;
      bool same = bx->last_step == by->def_step && in_place_ok(p, &p->steps[by->def_step], x->id, y->id) && !viewed(p, x->id);
      if (before || same) {
        by->donor = (int)i;
        break;
      }
    }
  }
}

nb_status nb_jit__assign_buffers(nb_ctx *ctx, nb_jplan *p, const nb_jit_config *cfg) {
  for (size_t v = 0; v < p->nvals; v++) p->bufs[v].alias = -1;
  live_ranges(p);
  if (plan_in_place(ctx, p, cfg) != NB_OK || assign_arena(ctx, p, !cfg->off[NB_SW_reuse]) != NB_OK)
    return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory assigning buffers");
  if (!cfg->off[NB_SW_donate]) assign_donations(p);
  p->output_bytes = 0;
  size_t kept = 0;
  for (size_t v = 0; v < p->nvals; v++) {
    const nb_jbuf *b = &p->bufs[v];
    if (b->cls != NB_BUF_OUTPUT) continue;
    p->output_bytes += b->nbytes;
    if (b->donor < 0) kept += b->nbytes;
  }
  p->peak_bytes = p->arena_bytes + kept;
  return NB_OK;
}
