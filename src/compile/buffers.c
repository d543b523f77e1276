/* Pass 3, buffer assignment: the live range of every buffer over the
 * schedule, arena offsets for intermediates (a freed range is reused by
 * later intermediates), which outputs may be written into donated inputs,
 * and the peak-memory estimate. Not here: deciding what gets a buffer
 * (fuse.c) or allocating anything at run time (runtime/exe.c). */
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

static nb_status assign_arena(nb_ctx *ctx, nb_jplan *p, bool reuse) {
  size_t cap = p->nvals + 1;
  live *l = nb_alloc(ctx, cap * sizeof *l);
  if (!l) return NB_ERR_NOMEM;
  int n = 0;
  size_t top = 0;
  for (int s = 0; s < p->nsteps; s++) {
    for (size_t v = 0; v < p->nvals; v++) {
      nb_jbuf *b = &p->bufs[v];
      if (b->cls != NB_BUF_TEMP || b->def_step != s) continue;
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
  p->arena_bytes = top;
  return NB_OK;
}

static bool same_map(const nb_kaffine *a, const nb_kaffine *b) { return memcmp(a, b, sizeof *a) == 0; }

/* In the kernel that stores output `out`, is input `in` read only at the
 * element being written (so writing in place is safe)? */
static bool in_place_ok(const nb_jplan *p, const nb_jstep *st, uint32_t in, uint32_t out) {
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

static void assign_donations(nb_jplan *p) {
  size_t nin = nb_graph_num_inputs(p->g);
  for (size_t i = 0; i < nin; i++) {
    if (!p->donated[i]) continue;
    const nb_val *x = nb__graph_input(p->g, i);
    const nb_jbuf *bx = &p->bufs[x->id];
    bool is_output = false;
    for (size_t o = 0; o < nb_graph_num_outputs(p->g); o++) is_output |= nb__graph_output(p->g, o) == x;
    if (bx->cls != NB_BUF_INPUT || is_output) continue;
    for (size_t o = 0; o < nb_graph_num_outputs(p->g); o++) {
      const nb_val *y = nb__graph_output(p->g, o);
      nb_jbuf *by = &p->bufs[y->id];
      if (by->cls != NB_BUF_OUTPUT || by->donor >= 0 || !nb_aval_equal(&x->aval, &y->aval) || by->def_step < 0) continue;
      bool before = bx->last_step < by->def_step;
      bool same = bx->last_step == by->def_step && in_place_ok(p, &p->steps[by->def_step], x->id, y->id);
      if (before || same) {
        by->donor = (int)i;
        break;
      }
    }
  }
}

nb_status nb_jit__assign_buffers(nb_ctx *ctx, nb_jplan *p, const nb_jit_config *cfg) {
  live_ranges(p);
  if (assign_arena(ctx, p, !cfg->off[NB_SW_reuse]) != NB_OK) return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory assigning buffers");
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
