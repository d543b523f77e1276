/* Pass 2, fusion: decides which values get buffers ("materialized"), groups
 * the materialized values computed by fusable equations into loop kernels
 * of one iteration domain, lowers each kernel to the loop-nest IR of jit.h
 * (index maps through broadcast / transpose / reshape, reductions as phases
 * of a row kernel) and schedules kernels and the other equations. When a
 * value cannot be expressed in its consumer's kernel (a reshape that is not
 * affine, a reduction seen through a different index map, conflicting
 * reductions) it is materialized and fusion starts again. Not here: memory
 * offsets (buffers.c) or any target code (src/backend/). */
#include <string.h>

#include "backend/backend.h"

#define INLINE_COST_LIMIT 12 /* a value with several users is recomputed when its cone is this cheap */
#define MAX_DEPTH 1500       /* recursion guard: longer inlined chains are cut */
#define MERGE_CANDIDATES 8
#define MAX_ROOTS 16 /* independent roots merged into one kernel at most: bounds a kernel's body (the
                        C compiler's time grows faster than linearly in it; a GPU's registers) */

typedef struct sig {
  bool red;
  nb_shape f;      /* the full domain */
  int naxes;
  int axes[NB_MAX_RANK];
} sig;

typedef struct kmap {
  int rank;
  nb_kaffine c[NB_MAX_RANK];
} kmap;

typedef struct memo_entry {
  uint64_t hash;
  uint32_t vid;
  const kmap *m;
  int node;
} memo_entry;

typedef struct pstep {
  nb_exe_step_kind kind;
  int kernel;
  const nb_eqn *eqn;
  uint32_t order;
  int *deps;
  int ndeps, cap_deps;
} pstep;

typedef struct fz {
  nb_ctx *ctx;
  nb_jplan *p;
  const nb_jit_config *cfg;
  const nb_graph *g;
  nb_jit_arena *ar; /* this attempt's scratch */
  size_t nv, ne;
  uint8_t *mat, *force, *is_out;
  uint8_t *leaf; /* read from memory by consumers (mat, except cheap outputs, which are recomputed) */
  int *view;     /* a value that lives in another's memory (a value id, not itself a view), or -1 */
  size_t *view_off; /* at this byte offset */
  uint8_t *evaluated_only; /* read only by equations that are not fused (evaluated, control, BLAS) */
  uint8_t *reduced; /* a reduction in the value's inlined cone */
  uint8_t *reads_donated; /* a donated graph input in the value's inlined cone (or the value is one) */
  int *nusers, *cost, *step_of, *stamp;
  int cur_stamp;
  pstep *steps;
  int nsteps, cap_steps;
  sig *ksig; /* per kernel */
  int cap_ksig;
  /* lowering */
  nb_kernel *k;
  int kidx;
  int depth;
  uint32_t fail_val; /* UINT32_MAX: none */
  memo_entry *memo;
  size_t memo_cap, memo_n;
  int *reduce_kernel; /* per value: kernel holding an inlined reduce of it, or -1 */
  int *root_kernel;   /* per value: the kernel it is a root of, or -1 */
  uint8_t *no_join;   /* roots that may not join a kernel they read (kept across attempts) */
  bool join_failed;   /* lowering read a root of its own kernel at another index */
  const nb_val **vals; /* by id */
} fz;

enum { OK = 0, RETRY = 1, ERR = 2 };

/* ---------------------------------------------------------------- classification */

bool nb_jit__fusable(const nb_eqn *e) {
  const nb_prim_rules *r = nb__rules(e->prim);
  if (e->nout != 1 || r->impure) return false;
  switch (r->fusion) {
  case NB_FUSE_NONE: return false;
  case NB_FUSE_EXPR: return r->c && nb__c_template(r->c, e->nin ? e->in[0]->aval.dtype : e->out[0]->aval.dtype);
  case NB_FUSE_INDEX: return e->prim != NB_PRIM_constant || e->out[0]->aval.shape.rank == 0;
  case NB_FUSE_CONVERT:
  case NB_FUSE_REDUCE: return true;
  }
  return false;
}

static bool is_reduce(const nb_eqn *e) { return e && nb__rules(e->prim)->fusion == NB_FUSE_REDUCE; }

static bool is_scalar_const(const nb_val *v) { return v->def && v->def->prim == NB_PRIM_constant && v->aval.shape.rank == 0; }

static sig reduce_sig(const nb_eqn *e) {
  sig s;
  memset(&s, 0, sizeof s);
  const nb_reduce_params *p = e->params;
  s.red = true;
  s.f = e->in[0]->aval.shape;
  s.naxes = p->naxes;
  memcpy(s.axes, p->axes, sizeof(int) * (size_t)p->naxes);
  return s;
}

static sig plain_sig(const nb_shape *s) {
  sig r;
  memset(&r, 0, sizeof r);
  r.f = *s;
  return r;
}

static bool sig_equal(const sig *a, const sig *b) {
  return a->red == b->red && nb_shape_equal(&a->f, &b->f) && a->naxes == b->naxes &&
         memcmp(a->axes, b->axes, sizeof(int) * (size_t)a->naxes) == 0;
}

/* The kept (outer) shape of a signature. */
static nb_shape outer_shape(const sig *s) {
  nb_shape o;
  memset(&o, 0, sizeof o);
  bool drop[NB_MAX_RANK] = {false};
  for (int i = 0; i < s->naxes; i++) drop[s->axes[i]] = true;
  for (int d = 0; d < s->f.rank; d++)
    if (!drop[d]) o.dims[o.rank++] = s->f.dims[d];
  return o;
}

/* ---------------------------------------------------------------- materialization */

static void count_users(fz *f) {
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    for (int i = 0; i < e->nin; i++) {
      bool seen = false;
      for (int j = 0; j < i; j++) seen = seen || e->in[j] == e->in[i];
      if (!seen) f->nusers[e->in[i]->id]++;
    }
  }
  for (size_t i = 0; i < nb_graph_num_outputs(f->g); i++) f->is_out[nb__graph_output(f->g, i)->id] = 1;
}

/* v lives in x's memory at byte offset off (unless it is a graph output:
 * those are arrays of their own). */
static void make_view(fz *f, const nb_val *v, const nb_val *x, size_t off) {
  if (f->is_out[v->id] || !f->mat[x->id]) return;
  bool chained = f->view[x->id] >= 0;
  f->view[v->id] = chained ? f->view[x->id] : (int)x->id;
  f->view_off[v->id] = off + (chained ? f->view_off[x->id] : 0);
}

/* Is slice e one contiguous run of its operand (unit strides; single
 * indices, then one range, then whole dims)? *off: its byte offset. */
static bool contiguous_slice(const nb_eqn *e, size_t *off) {
  const nb_slice_params *p = e->params;
  const nb_shape *s = &e->in[0]->aval.shape;
  int64_t strides[NB_MAX_RANK], o = 0;
  nb__strides(s, strides);
  bool ranged = false;
  for (int d = 0; d < s->rank; d++) {
    int64_t n = p->limit[d] - p->start[d];
    if (p->strides[d] != 1) return false;
    if (ranged && n != s->dims[d]) return false;
    if (n != 1) ranged = true;
    o += p->start[d] * strides[d];
  }
  *off = (size_t)o * nb_dtype_size(e->in[0]->aval.dtype);
  return true;
}

static void decide_materialized(fz *f) {
  memset(f->mat, 0, f->nv);
  for (size_t i = 0; i < nb_graph_num_inputs(f->g); i++) f->mat[nb__graph_input(f->g, i)->id] = 1;
  for (size_t v = 0; v < f->nv; v++) f->mat[v] |= f->force[v];
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    bool fus = nb_jit__fusable(e);
    for (int i = 0; i < e->nout; i++)
      if (!fus || (e->prim == NB_PRIM_constant && !is_scalar_const(e->out[i])) ||
          (f->cfg->off[NB_SW_fuse] && e->prim != NB_PRIM_constant))
        f->mat[e->out[i]->id] = 1;
    if (!fus)
      for (int i = 0; i < e->nin; i++) f->mat[e->in[i]->id] = 1;
  }
  memcpy(f->leaf, f->mat, f->nv);
  memset(f->reads_donated, 0, f->nv);
  for (size_t i = 0; i < nb_graph_num_inputs(f->g); i++)
    if (f->p->donated[i]) f->reads_donated[nb__graph_input(f->g, i)->id] = 1;
  /* values with several users: recompute cheap cones, materialize the rest;
   * graph outputs are stored, and recomputed by consumers when cheap */
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    if (e->nout != 1) continue;
    uint32_t id = e->out[0]->id;
    /* a computed scalar broadcast over a larger domain (an optimizer's bias
     * correction, a schedule's learning rate) is computed once into its own
     * buffer, not once per element of every kernel that reads it */
    if (e->prim == NB_PRIM_broadcast_in_dim) {
      const nb_val *x = e->in[0];
      if (!f->leaf[x->id] && f->cost[x->id] > 1 && !f->reduced[x->id] && nb_shape_size(&x->aval.shape) == 1 &&
          nb_shape_size(&e->out[0]->aval.shape) > 1)
        f->mat[x->id] = f->leaf[x->id] = 1;
    }
    /* a reduction counts as one: inside one kernel it is computed once per
     * row; seen from two kernels it is materialized after lowering */
    int c = 1;
    f->reduced[id] = is_reduce(e);
    for (int i = 0; i < e->nin && !is_reduce(e); i++) {
      c += f->leaf[e->in[i]->id] ? 0 : f->cost[e->in[i]->id];
      f->reduced[id] |= !f->leaf[e->in[i]->id] && f->reduced[e->in[i]->id];
    }
    for (int i = 0; i < e->nin; i++) {
      const nb_val *x = e->in[i];
      f->reads_donated[id] |= (!x->def || !f->leaf[x->id]) && f->reads_donated[x->id];
    }
    f->cost[id] = c > (1 << 20) ? (1 << 20) : c;
    bool expensive = f->cost[id] > INLINE_COST_LIMIT && !is_scalar_const(e->out[0]);
    if (!f->mat[id] && f->nusers[id] > 1 && expensive) f->mat[id] = f->leaf[id] = 1;
    /* an output computed from a donated input is read back from memory by
     * its other consumers: recomputing it there would read the input after
     * the output's kernel may have overwritten it in place (an optimizer's
     * new moments, read again by the parameter update) */
    if (f->is_out[id]) {
      f->mat[id] = 1;
      if (expensive || !nb_jit__fusable(e) || f->reads_donated[id]) f->leaf[id] = 1;
    }
  }
  /* a reshape of a value in memory that only evaluated, control and BLAS
   * steps read (scan_layers' stacked parameters, a concatenate's operands,
   * attention's heads merged back into rows for the output projection) is
   * that memory: no copy kernel. Kernels read their own copy. */
  memset(f->evaluated_only, 1, f->nv);
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    if (nb_jit__fusable(e))
      for (int i = 0; i < e->nin; i++) f->evaluated_only[e->in[i]->id] = 0;
  }
  for (size_t v = 0; v < f->nv; v++) {
    f->view[v] = -1;
    f->view_off[v] = 0;
  }
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    size_t off;
    if (e->prim == NB_PRIM_reshape && f->mat[e->out[0]->id] && f->mat[e->in[0]->id] && f->evaluated_only[e->out[0]->id])
      make_view(f, e->out[0], e->in[0], 0);
    /* a slice of contiguous memory (scan_layers' per-layer gradients out of the stacked ones) */
    if (e->prim == NB_PRIM_slice && contiguous_slice(e, &off)) make_view(f, e->out[0], e->in[0], off);
    /* a barrier's results are its operands' memory: it only keeps the
     * simplifier from merging a remat region's recomputation with the
     * forward pass, and needs no copy here */
    for (int i = 0; i < e->nout && e->prim == NB_PRIM_barrier; i++) make_view(f, e->out[i], e->in[i], 0);
    /* a scan's ys that its body passes through from its xs are those xs
     * (residuals of a differentiated scan: the layers' parameters) */
    for (int o = 0; o < e->nout && nb_jit__is_control(e) && !f->cfg->off[NB_SW_native]; o++) {
      int k2 = nb_jit__control_output_operand(e, o);
      if (k2 >= 0) make_view(f, e->out[o], e->in[k2], 0);
    }
  }
}

/* ---------------------------------------------------------------- steps and dependencies */

static int new_step(fz *f, nb_exe_step_kind kind, int kernel, const nb_eqn *e) {
  if (!NB_PUSH(f->ar, f->steps, f->nsteps, f->cap_steps)) return -1;
  pstep *s = &f->steps[f->nsteps];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->kernel = kernel;
  s->eqn = e;
  s->order = e ? e->index : 0;
  return f->nsteps++;
}

static bool add_dep(fz *f, int step, int dep) {
  pstep *s = &f->steps[step];
  if (dep < 0 || dep == step) return true;
  for (int i = 0; i < s->ndeps; i++)
    if (s->deps[i] == dep) return true;
  if (!NB_PUSH(f->ar, s->deps, s->ndeps, s->cap_deps)) return false;
  s->deps[s->ndeps++] = dep;
  return true;
}

/* Is `target` reachable from any of deps (following dependencies)? */
static bool reaches(fz *f, const int *deps, int ndeps, int target) {
  int *stack = nb_alloc(f->ctx, sizeof(int) * ((size_t)f->nsteps + 1));
  uint8_t *seen = nb_calloc(f->ctx, (size_t)f->nsteps + 1);
  bool found = !stack || !seen; /* on OOM: refuse the merge */
  int sp = 0;
  for (int i = 0; i < ndeps && !found; i++)
    if (!seen[deps[i]]) seen[deps[i]] = 1, stack[sp++] = deps[i];
  while (sp > 0 && !found) {
    int s = stack[--sp];
    if (s == target) found = true;
    for (int i = 0; i < f->steps[s].ndeps; i++) {
      int d = f->steps[s].deps[i];
      if (!seen[d]) seen[d] = 1, stack[sp++] = d;
    }
  }
  nb_dealloc(f->ctx, stack, sizeof(int) * ((size_t)f->nsteps + 1));
  nb_dealloc(f->ctx, seen, (size_t)f->nsteps + 1);
  return found;
}

/* ---------------------------------------------------------------- root scan */

typedef struct scan {
  int nred;
  const nb_eqn *red[64];
  bool too_many;
  int *deps;
  int ndeps, cap_deps;
  /* steps whose memory the cone reads through a view (a barrier's results,
   * a slice of a root): a kernel reads such a leaf from memory when it
   * starts, so it must not join the kernel that writes that memory */
  int view_deps[8], nview_deps;
  bool many_view_deps;
} scan;

static bool scan_cone(fz *f, const nb_val *v, scan *s, bool top) {
  if (!top && (f->leaf[v->id] || !v->def)) {
    int st = f->step_of[v->id];
    if (st >= 0 && f->view[v->id] >= 0) {
      if (s->nview_deps < 8) s->view_deps[s->nview_deps++] = st;
      else s->many_view_deps = true;
    }
    if (st >= 0) {
      for (int i = 0; i < s->ndeps; i++)
        if (s->deps[i] == st) return true;
      if (!NB_PUSH(f->ar, s->deps, s->ndeps, s->cap_deps)) return false;
      s->deps[s->ndeps++] = st;
    }
    return true;
  }
  if (f->stamp[v->id] == f->cur_stamp) return true;
  f->stamp[v->id] = f->cur_stamp;
  const nb_eqn *e = v->def;
  if (is_reduce(e)) {
    if (s->nred < 64) s->red[s->nred++] = e;
    else s->too_many = true;
  }
  for (int i = 0; i < e->nin; i++)
    if (!scan_cone(f, e->in[i], s, false)) return false;
  return true;
}

/* ---------------------------------------------------------------- lowering */

static uint64_t map_hash(uint32_t vid, const kmap *m) {
  uint64_t h = nb__hash_bytes(m, sizeof(int) + sizeof(nb_kaffine) * (size_t)m->rank, vid * 0x9e3779b97f4a7c15ull + 1);
  return h ? h : 1;
}

static bool map_equal(const kmap *a, const kmap *b) {
  return a->rank == b->rank && memcmp(a->c, b->c, sizeof(nb_kaffine) * (size_t)a->rank) == 0;
}

static int memo_find(fz *f, uint32_t vid, const kmap *m, uint64_t h) {
  if (!f->memo_cap) return -1;
  for (size_t i = h & (f->memo_cap - 1);; i = (i + 1) & (f->memo_cap - 1)) {
    memo_entry *e = &f->memo[i];
    if (!e->hash) return -1;
    if (e->hash == h && e->vid == vid && map_equal(e->m, m)) return e->node;
  }
}

static bool memo_put(fz *f, uint32_t vid, const kmap *m, uint64_t h, int node) {
  if (2 * (f->memo_n + 1) > f->memo_cap) {
    size_t cap = f->memo_cap ? f->memo_cap * 2 : 256;
    memo_entry *t = nb_jit__alloc(f->ar, cap * sizeof *t);
    if (!t) return false;
    for (size_t i = 0; i < f->memo_cap; i++) {
      memo_entry *e = &f->memo[i];
      if (!e->hash) continue;
      size_t j = e->hash & (cap - 1);
      while (t[j].hash) j = (j + 1) & (cap - 1);
      t[j] = *e;
    }
    f->memo = t;
    f->memo_cap = cap;
  }
  kmap *copy = nb_jit__alloc(f->ar, sizeof *copy);
  if (!copy) return false;
  *copy = *m;
  size_t j = h & (f->memo_cap - 1);
  while (f->memo[j].hash) j = (j + 1) & (f->memo_cap - 1);
  f->memo[j] = (memo_entry){h, vid, copy, node};
  f->memo_n++;
  return true;
}

static bool has_inner_var(const fz *f, const nb_kaffine *a) {
  for (int v = f->k->ro; v < f->k->ro + f->k->rr; v++)
    if (a->coef[v]) return true;
  return false;
}

static int add_node(fz *f, nb_knode *n) {
  nb_kernel *k = f->k;
  if (!NB_PUSH(f->ar, k->nodes, k->nnodes, k->cap_nodes)) return -1;
  k->nodes[k->nnodes] = *n;
  return k->nnodes++;
}

static int arg_of(fz *f, uint32_t vid, bool written) {
  nb_kernel *k = f->k;
  for (int i = 0; i < k->nargs; i++)
    if (k->args[i] == vid) {
      k->arg_written[i] |= written;
      return i;
    }
  int n = k->nargs, cap = k->cap_args;
  if (!NB_PUSH(f->ar, k->args, n, cap)) return -1;
  int n2 = k->nargs, cap2 = k->cap_args;
  if (!NB_PUSH(f->ar, k->arg_written, n2, cap2)) return -1;
  k->cap_args = cap < cap2 ? cap : cap2;
  k->args[k->nargs] = vid;
  k->arg_written[k->nargs] = written;
  return k->nargs++;
}

static void strides_of(const nb_shape *s, int64_t *st) {
  int64_t acc = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    st[d] = acc;
    acc *= s->dims[d];
  }
}

/* Element offset of coords m in a row-major array of shape s. */
static nb_kaffine ravel(const kmap *m, const nb_shape *s) {
  int64_t st[NB_MAX_RANK];
  nb_kaffine r;
  memset(&r, 0, sizeof r);
  strides_of(s, st);
  for (int d = 0; d < m->rank; d++) {
    r.base += m->c[d].base * st[d];
    for (int v = 0; v < NB_KVARS; v++) r.coef[v] += m->c[d].coef[v] * st[d];
  }
  return r;
}

/* Coordinates in shape `to` of the element at offset L, when each is affine
 * (every variable's term stays within one dimension, without carries). */
static bool unravel(const fz *f, const nb_kaffine *L, const nb_shape *to, kmap *out) {
  int64_t st[NB_MAX_RANK];
  memset(out, 0, sizeof *out);
  out->rank = to->rank;
  if (nb_shape_size(to) == 0) return true;
  strides_of(to, st);
  for (int j = 0; j < to->rank; j++) out->c[j].base = (L->base / st[j]) % to->dims[j];
  if (L->base >= nb_shape_size(to)) return false;
  int nvars = f->k->ro + f->k->rr;
  for (int v = 0; v < nvars; v++) {
    int64_t c = L->coef[v];
    if (!c || f->k->dims[v] <= 1) continue;
    int j = -1;
    for (int d = 0; d < to->rank && j < 0; d++)
      if (to->dims[d] > 1 && st[d] <= c && c < st[d] * to->dims[d]) j = d;
    if (j < 0 || c % st[j]) return false;
    out->c[j].coef[v] = c / st[j];
  }
  for (int j = 0; j < to->rank; j++) {
    int64_t mx = out->c[j].base;
    for (int v = 0; v < nvars; v++) mx += out->c[j].coef[v] * (f->k->dims[v] - 1);
    if (mx >= to->dims[j]) return false;
  }
  return true;
}

static int lower(fz *f, const nb_val *v, const kmap *m);

static int lower_load(fz *f, const nb_val *buf, const nb_kaffine *off) {
  nb_knode n;
  memset(&n, 0, sizeof n);
  n.kind = NB_KN_LOAD;
  n.dtype = buf->aval.dtype;
  n.arg = arg_of(f, buf->id, false);
  if (n.arg < 0) return -1;
  n.map = *off;
  n.inner = has_inner_var(f, off);
  return add_node(f, &n);
}

static bool is_outer_identity(const fz *f, const kmap *m) {
  if (m->rank != f->k->ro) return false;
  for (int d = 0; d < m->rank; d++) {
    nb_kaffine want;
    memset(&want, 0, sizeof want);
    want.coef[d] = 1;
    if (memcmp(&want, &m->c[d], sizeof want) != 0) return false;
  }
  return true;
}

/* The operand coordinates of a reduce whose result is at the outer identity. */
static void reduce_operand_map(const fz *f, const nb_eqn *e, kmap *m) {
  const nb_reduce_params *p = e->params;
  bool drop[NB_MAX_RANK] = {false};
  for (int i = 0; i < p->naxes; i++) drop[p->axes[i]] = true;
  memset(m, 0, sizeof *m);
  m->rank = e->in[0]->aval.shape.rank;
  int o = 0, r = f->k->ro;
  for (int d = 0; d < m->rank; d++) m->c[d].coef[drop[d] ? r++ : o++] = 1;
}

static int fail(fz *f, const nb_val *v) {
  if (f->fail_val == UINT32_MAX) f->fail_val = v->id;
  return -1;
}

static int lower_eqn(fz *f, const nb_val *v, const kmap *m) {
  const nb_eqn *e = v->def;
  nb_knode n;
  memset(&n, 0, sizeof n);
  n.dtype = v->aval.dtype;
  switch (e->prim) {
  case NB_PRIM_constant: {
    const nb_array *a = ((const nb_constant_params *)e->params)->value;
    n.kind = NB_KN_CONST;
    n.cf = nb_array_get(a, 0);
    n.ci = nb__load_i64(n.dtype, nb_array_data(a), 0);
    return add_node(f, &n);
  }
  case NB_PRIM_iota: {
    const nb_iota_params *p = e->params;
    n.kind = NB_KN_INDEX;
    n.map = m->c[p->axis];
    n.inner = has_inner_var(f, &n.map);
    return add_node(f, &n);
  }
  case NB_PRIM_reshape: {
    const nb_val *x = e->in[0];
    nb_kaffine L = ravel(m, &v->aval.shape);
    if (f->leaf[x->id] && f->root_kernel[x->id] != f->kidx) return lower_load(f, x, &L);
    kmap mx;
    if (!unravel(f, &L, &x->aval.shape, &mx)) return fail(f, x);
    return lower(f, x, &mx);
  }
  case NB_PRIM_broadcast_in_dim: {
    const nb_broadcast_params *p = e->params;
    const nb_val *x = e->in[0];
    kmap mx;
    memset(&mx, 0, sizeof mx);
    mx.rank = x->aval.shape.rank;
    for (int i = 0; i < mx.rank; i++)
      if (x->aval.shape.dims[i] != 1) mx.c[i] = m->c[p->bdims[i]];
    return lower(f, x, &mx);
  }
  case NB_PRIM_transpose: {
    const nb_transpose_params *p = e->params;
    kmap mx;
    memset(&mx, 0, sizeof mx);
    mx.rank = m->rank;
    for (int i = 0; i < m->rank; i++) mx.c[p->perm[i]] = m->c[i];
    return lower(f, e->in[0], &mx);
  }
  default: break;
  }
  if (is_reduce(e)) {
    sig s = reduce_sig(e);
    if (!sig_equal(&s, &f->ksig[f->kidx]) || !is_outer_identity(f, m)) return fail(f, v);
    kmap mx;
    reduce_operand_map(f, e, &mx);
    int a = lower(f, e->in[0], &mx);
    if (a < 0) return -1;
    n.kind = NB_KN_REDUCE;
    n.prim = e->prim;
    n.nin = 1;
    n.in[0] = a;
    n.src_dtype = e->in[0]->aval.dtype;
    int id = add_node(f, &n);
    if (id >= 0) {
      if (f->reduce_kernel[v->id] >= 0 && f->reduce_kernel[v->id] != f->kidx) return fail(f, v);
      f->reduce_kernel[v->id] = f->kidx;
    }
    return id;
  }
  /* elementwise */
  if (e->nin > 3) return fail(f, v);
  n.kind = NB_KN_OP;
  n.prim = e->prim;
  n.nin = e->nin;
  n.src_dtype = e->nin ? e->in[0]->aval.dtype : n.dtype;
  for (int i = 0; i < e->nin; i++) {
    if ((n.in[i] = lower(f, e->in[i], m)) < 0) return -1;
    n.inner |= f->k->nodes[n.in[i]].inner;
  }
  return add_node(f, &n);
}

/* m without the terms of the kernel's loops of extent 1 (their variable is
 * always 0): the same element then has one map whichever way it is reached
 * (a broadcast leaves a size-1 dimension's coordinate 0, a root's or a
 * reduction operand's map names the loop), so the memo finds it. Without
 * it a root read by a later root of its kernel looked unwritten (the
 * attention softmax of gpt2, whose scores carry a size-1 kv-group axis,
 * was four kernels over the 4 MB scores instead of one). */
static kmap unit_free(const fz *f, const kmap *m) {
  kmap r = *m;
  for (int d = 0; d < r.rank; d++)
    for (int v = 0; v < f->k->ro + f->k->rr; v++)
      if (f->k->dims[v] == 1) r.c[d].coef[v] = 0;
  return r;
}

static int lower(fz *f, const nb_val *v, const kmap *m0) {
  kmap mu = unit_free(f, m0);
  const kmap *m = &mu;
  uint64_t h = map_hash(v->id, m);
  int found = memo_find(f, v->id, m, h);
  if (found >= 0) return found;
  if (f->leaf[v->id] && f->root_kernel[v->id] == f->kidx) {
    /* a root of this kernel read by a later root at another index than it
     * is computed at: its memory is not written yet (a cheap root that is
     * not a leaf is recomputed, as anywhere) */
    f->join_failed = true;
    return -1;
  }
  int id;
  if (f->leaf[v->id] && !is_scalar_const(v)) {
    nb_kaffine off = ravel(m, &v->aval.shape);
    id = lower_load(f, v, &off);
  } else {
    if (++f->depth > MAX_DEPTH) {
      f->depth--;
      return fail(f, v);
    }
    id = lower_eqn(f, v, m);
    f->depth--;
  }
  if (id >= 0 && !memo_put(f, v->id, m, h, id)) return -1;
  return id;
}

/* ---------------------------------------------------------------- kernel canonicalization */

typedef void (*map_visit)(nb_kaffine *a, void *ud);

static void each_map(nb_kernel *k, map_visit fn, void *ud) {
  for (int i = 0; i < k->nnodes; i++)
    if (k->nodes[i].kind == NB_KN_LOAD || k->nodes[i].kind == NB_KN_INDEX) fn(&k->nodes[i].map, ud);
  for (int i = 0; i < k->nstores; i++) fn(&k->stores[i].map, ud);
}

typedef struct merge_q {
  int v;
  int64_t inner_dim;
  bool ok;
} merge_q;

static void check_merge(nb_kaffine *a, void *ud) {
  merge_q *q = ud;
  if (a->coef[q->v] != a->coef[q->v + 1] * q->inner_dim) q->ok = false;
}

static void drop_var(nb_kaffine *a, void *ud) {
  int v = *(int *)ud;
  memmove(&a->coef[v], &a->coef[v + 1], sizeof(int64_t) * (size_t)(NB_KVARS - v - 1));
  a->coef[NB_KVARS - 1] = 0;
}

static void remove_var(nb_kernel *k, int v) {
  memmove(&k->dims[v], &k->dims[v + 1], sizeof(int64_t) * (size_t)(NB_KVARS - v - 1));
  k->dims[NB_KVARS - 1] = 0;
  each_map(k, drop_var, &v);
  if (v < k->ro) k->ro--;
  else k->rr--;
}

/* Drops size-1 loops and merges adjacent loops that every access walks
 * contiguously (a [64,1024] elementwise kernel becomes one loop of 65536). */
static void canonicalize(nb_kernel *k) {
  for (int v = 0; v < k->ro + k->rr; v++)
    if (k->dims[v] == 0) return;
  for (int v = k->ro + k->rr - 1; v >= 0; v--)
    if (k->dims[v] == 1) remove_var(k, v);
  for (int v = 0; v + 1 < k->ro + k->rr;) {
    bool same_space = (v + 1 < k->ro) || (v >= k->ro);
    merge_q q = {v, k->dims[v + 1], same_space};
    if (q.ok) each_map(k, check_merge, &q);
    if (q.ok) {
      int64_t d = k->dims[v] * k->dims[v + 1];
      /* the merged loop keeps the inner coefficient: drop the outer var */
      remove_var(k, v);
      k->dims[v] = d;
    } else {
      v++;
    }
  }
}

static void assign_phases(nb_kernel *k) {
  k->nphases = 0;
  for (int i = 0; i < k->nnodes; i++) {
    nb_knode *n = &k->nodes[i];
    int ph = 0;
    for (int j = 0; j < n->nin; j++) ph = k->nodes[n->in[j]].phase > ph ? k->nodes[n->in[j]].phase : ph;
    n->phase = n->kind == NB_KN_REDUCE ? ph + 1 : ph;
    if (n->phase > k->nphases) k->nphases = n->phase;
  }
}

static void kernel_cost(const fz *f, nb_kernel *k) {
  double outer = 1, inner = 1;
  for (int v = 0; v < k->ro; v++) outer *= (double)k->dims[v];
  for (int v = k->ro; v < k->ro + k->rr; v++) inner *= (double)k->dims[v];
  k->flops = 0;
  for (int i = 0; i < k->nnodes; i++) {
    const nb_knode *n = &k->nodes[i];
    if (n->kind == NB_KN_OP) k->flops += n->inner ? outer * inner : outer;
    if (n->kind == NB_KN_REDUCE) k->flops += outer * inner;
  }
  k->bytes = 0;
  for (int i = 0; i < k->nargs; i++) {
    nb_aval a = f->vals[k->args[i]]->aval;
    k->bytes += (double)nb_shape_size(&a.shape) * (double)nb_dtype_size(a.dtype);
  }
}

/* ---------------------------------------------------------------- the attempt */

static int lower_roots(fz *f, int ki) {
  nb_kernel *k = &f->p->kernels[ki];
  const sig *s = &f->ksig[ki];
  f->k = k;
  f->kidx = ki;
  f->memo = NULL;
  f->memo_cap = f->memo_n = 0;
  bool drop[NB_MAX_RANK] = {false};
  for (int i = 0; i < s->naxes; i++) drop[s->axes[i]] = true;
  k->ro = s->f.rank - s->naxes;
  k->rr = s->naxes;
  for (int d = 0, a = 0, b = k->ro; d < s->f.rank; d++) k->dims[drop[d] ? b++ : a++] = s->f.dims[d];
  for (int r = 0; r < k->nroots; r++) {
    const nb_val *v = f->vals[k->roots[r]];
    kmap m;
    memset(&m, 0, sizeof m);
    m.rank = v->aval.shape.rank;
    bool at_full = s->red && !is_reduce(v->def) && nb_shape_equal(&v->aval.shape, &s->f);
    for (int d = 0, a = 0, b = k->ro; d < m.rank; d++) m.c[d].coef[at_full && drop[d] ? b++ : a++] = 1;
    f->fail_val = UINT32_MAX;
    f->depth = 0;
    f->join_failed = false;
    int node = lower_eqn(f, v, &m); /* the root is computed here, not loaded */
    if (node < 0 && f->join_failed) {
      f->no_join[v->id] = 1;
      f->fail_val = UINT32_MAX;
      return RETRY;
    }
    if (node < 0) return f->fail_val != UINT32_MAX ? RETRY : ERR;
    /* later roots of this kernel that read v at the same index use this node */
    m = unit_free(f, &m);
    if (!memo_put(f, v->id, &m, map_hash(v->id, &m), node)) return ERR;
    nb_kstore st;
    memset(&st, 0, sizeof st);
    st.node = node;
    st.arg = arg_of(f, v->id, true);
    st.map = ravel(&m, &v->aval.shape);
    st.inner = has_inner_var(f, &st.map);
    if (st.arg < 0 || !NB_PUSH(f->ar, k->stores, k->nstores, k->cap_stores)) return ERR;
    k->stores[k->nstores++] = st;
  }
  return OK;
}

static int force_all(fz *f, const scan *s) {
  int n = 0;
  for (int i = 0; i < s->nred; i++)
    if (!f->leaf[s->red[i]->out[0]->id]) f->force[s->red[i]->out[0]->id] = 1, n++;
  return n ? RETRY : ERR;
}

/* Reductions of other domains in a root's cone. When they all feed the
 * reduction that gives the root its domain, that reduction's operand is
 * materialized (cross-entropy: per-row losses, then their mean); otherwise
 * the conflicting reductions are. */
static int resolve_conflicts(fz *f, const nb_eqn *e, const sig *rs, const scan *s) {
  const nb_eqn *r1 = is_reduce(e) ? e : s->nred ? s->red[0] : NULL;
  bool conflict = false, all_inside = true;
  scan inner;
  memset(&inner, 0, sizeof inner);
  f->cur_stamp++;
  if (r1 && !scan_cone(f, r1->in[0], &inner, false)) return ERR;
  for (int i = 0; i < s->nred; i++) {
    sig r2 = reduce_sig(s->red[i]);
    if (sig_equal(&r2, rs)) continue;
    conflict = true;
    bool in = false;
    for (int j = 0; j < inner.nred; j++) in |= inner.red[j] == s->red[i];
    all_inside &= in;
  }
  if (!conflict) return OK;
  if (all_inside && r1 && !f->leaf[r1->in[0]->id]) {
    f->force[r1->in[0]->id] = 1;
    return RETRY;
  }
  for (int i = 0; i < s->nred; i++) {
    sig r2 = reduce_sig(s->red[i]);
    if (!sig_equal(&r2, rs)) f->force[s->red[i]->out[0]->id] = 1;
  }
  return RETRY;
}

static int kernel_step(const fz *f, int kernel) {
  for (int i = 0; i < f->nsteps; i++)
    if (f->steps[i].kind == NB_EXE_STEP_KERNEL && f->steps[i].kernel == kernel) return i;
  return -1;
}

/* Can a root with signature rs and shape sh be computed in a kernel of
 * signature ks? The same domain, or a plain root at a reduction kernel's
 * full shape (per element) or kept shape (per row). */
static bool domain_fits(const sig *ks, const sig *rs, const nb_shape *sh) {
  if (sig_equal(ks, rs)) return true;
  if (!ks->red || rs->red) return false;
  nb_shape o = outer_shape(ks);
  return nb_shape_equal(sh, &ks->f) || nb_shape_equal(sh, &o);
}

/* Does root v depend on kernel step kstep only directly, through that
 * kernel's own roots (no path through other steps)? Then v can join the
 * kernel as a later root that reads those roots' nodes (a softmax's
 * exponentials after its max, then their sum and the quotient: one kernel,
 * where the roots are materialized because a backward pass reads them). */
static bool depends_only_directly(fz *f, const scan *s, int kstep) {
  if (s->many_view_deps) return false;
  for (int i = 0; i < s->nview_deps; i++)
    if (s->view_deps[i] == kstep) return false; /* it reads that kernel's memory, not its nodes */
  bool direct = false;
  int *others = nb_jit__alloc(f->ar, sizeof(int) * ((size_t)s->ndeps + 1));
  int n = 0;
  if (!others) return false;
  for (int i = 0; i < s->ndeps; i++)
    if (s->deps[i] == kstep) direct = true;
    else others[n++] = s->deps[i];
  return direct && !reaches(f, others, n, kstep);
}

/* Picks the kernel for root v: an earlier kernel of a domain that fits
 * that v does not depend on, or one that v reads only through its roots
 * (unless that failed to lower before: no_join), or a new one. Returns the
 * kernel index or -1. */
static int place_root(fz *f, const nb_eqn *e, const sig *rs, const scan *s) {
  int target = -1, tried = 0;
  const nb_val *v = e->out[0];
  for (int kk = f->p->nkernels - 1; kk >= 0 && tried < MERGE_CANDIDATES && !f->cfg->off[NB_SW_fuse]; kk--) {
    if (!domain_fits(&f->ksig[kk], rs, &v->aval.shape) || f->p->kernels[kk].nroots >= MAX_ROOTS) continue;
    tried++;
    int kstep = kernel_step(f, kk);
    if (sig_equal(&f->ksig[kk], rs) && !reaches(f, s->deps, s->ndeps, kstep)) target = kk;
    else if (!f->no_join[v->id] && depends_only_directly(f, s, kstep)) target = kk;
    if (target >= 0) break;
  }
  if (target < 0) {
    nb_kernel kz;
    memset(&kz, 0, sizeof kz);
    int nk = f->p->nkernels, cap = f->cap_ksig;
    if (!NB_PUSH(f->ar, f->p->kernels, f->p->nkernels, f->p->cap_kernels) || !NB_PUSH(f->ar, f->ksig, nk, cap)) return -1;
    f->cap_ksig = cap;
    target = f->p->nkernels++;
    f->p->kernels[target] = kz;
    f->ksig[target] = *rs;
    if (new_step(f, NB_EXE_STEP_KERNEL, target, e) < 0) return -1;
  }
  return target;
}

static int add_root(fz *f, const nb_eqn *e) {
  const nb_val *v = e->out[0];
  scan s;
  memset(&s, 0, sizeof s);
  f->cur_stamp++;
  if (!scan_cone(f, v, &s, true)) return ERR;
  if (s.too_many) return force_all(f, &s);
  sig rs = is_reduce(e) ? reduce_sig(e) : s.nred ? reduce_sig(s.red[0]) : plain_sig(&v->aval.shape);
  int r = resolve_conflicts(f, e, &rs, &s);
  if (r != OK) return r;
  if (rs.red && !is_reduce(e)) {
    nb_shape o = outer_shape(&rs);
    if (!nb_shape_equal(&v->aval.shape, &o) && !nb_shape_equal(&v->aval.shape, &rs.f)) return force_all(f, &s);
  }
  int kk = place_root(f, e, &rs, &s);
  if (kk < 0) return ERR;
  nb_kernel *k = &f->p->kernels[kk];
  if (!NB_PUSH(f->ar, k->roots, k->nroots, k->cap_roots)) return ERR;
  k->roots[k->nroots++] = v->id;
  f->root_kernel[v->id] = kk;
  int st = kernel_step(f, kk);
  for (int i = 0; i < s.ndeps; i++)
    if (!add_dep(f, st, s.deps[i])) return ERR;
  if (e->index < f->steps[st].order) f->steps[st].order = e->index;
  f->step_of[v->id] = st;
  return OK;
}

/* Every result of e lives in memory of another value (no step computes it). */
static bool all_views(const fz *f, const nb_eqn *e) {
  for (int i = 0; i < e->nout; i++)
    if (f->view[e->out[i]->id] < 0) return false;
  return true;
}

/* Does e run as a start step and a wait step apart (a collective whose
 * communicator can), so that the steps scheduled between overlap it? Not on
 * a backend whose memory is not the host's: its evaluated steps are staged
 * through host copies, which would have to live as long. */
static bool runs_async(const fz *f, const nb_eqn *e) {
  const nb_async_rules *a = nb__rules(e->prim)->async;
  return a && !f->cfg->off[NB_SW_async] && f->cfg->backend->host_memory && a->available(f->ctx, e);
}

/* The start as early as its operands allow (order 0 comes first among the
 * ready steps), the wait as late as its readers allow (last among them:
 * placed when nothing else is ready, i.e. just before its first reader or
 * at the end). */
static int async_steps(fz *f, const nb_eqn *e) {
  int st = new_step(f, NB_EXE_STEP_START, -1, e);
  if (st < 0) return ERR;
  f->steps[st].order = 0;
  for (int i = 0; i < e->nin; i++)
    if (!add_dep(f, st, f->step_of[e->in[i]->id])) return ERR;
  int wt = new_step(f, NB_EXE_STEP_WAIT, -1, e);
  if (wt < 0 || !add_dep(f, wt, st)) return ERR;
  f->steps[wt].order = UINT32_MAX;
  for (int i = 0; i < e->nout; i++) f->step_of[e->out[i]->id] = wt;
  return OK;
}

static int build_steps(fz *f) {
  int retry = OK;
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    if (e->prim == NB_PRIM_constant) continue;
    if (e->nout == 1 && f->view[e->out[0]->id] >= 0 && (e->prim == NB_PRIM_slice || e->prim == NB_PRIM_reshape)) {
      f->step_of[e->out[0]->id] = f->step_of[e->in[0]->id]; /* no step: the operand's memory */
      continue;
    }
    if (e->prim == NB_PRIM_barrier && all_views(f, e)) {
      for (int i = 0; i < e->nout; i++) f->step_of[e->out[i]->id] = f->step_of[e->in[i]->id];
      continue;
    }
    if (!nb_jit__fusable(e) && runs_async(f, e)) {
      if (async_steps(f, e) != OK) return ERR;
      continue;
    }
    if (!nb_jit__fusable(e)) {
      bool blas = !f->cfg->off[NB_SW_blas] && f->cfg->backend->library_supported(e); /* the backend runs it as a library call */
      nb_exe_step_kind kind = nb_jit__is_control(e) ? NB_EXE_STEP_CONTROL : blas ? NB_EXE_STEP_BLAS : NB_EXE_STEP_EVAL;
      int st = new_step(f, kind, -1, e);
      if (st < 0) return ERR;
      for (int i = 0; i < e->nin; i++)
        if (!add_dep(f, st, f->step_of[e->in[i]->id])) return ERR;
      for (int i = 0; i < e->nout; i++) f->step_of[e->out[i]->id] = st;
      continue;
    }
    if (!f->mat[e->out[0]->id]) continue;
    /* a conflict forces a value to memory; the rest of the graph is still
     * scanned so that one attempt collects every conflict it can see */
    int r = add_root(f, e);
    if (r == ERR) return ERR;
    if (r == RETRY) retry = RETRY;
  }
  return retry;
}

bool nb_jit__kernel_first_op(const nb_kernel *k, int i) {
  const nb_knode *nd = &k->nodes[i];
  if (nd->kind != NB_KN_OP && nd->kind != NB_KN_REDUCE) return false;
  for (int j = 0; j < i; j++)
    if ((k->nodes[j].kind == NB_KN_OP || k->nodes[j].kind == NB_KN_REDUCE) && k->nodes[j].prim == nd->prim) return false;
  return true;
}

/* The distinct primitives a kernel computes, in its node order, "+"-joined
 * into out[cap] (cut with "..." when longer; "copy" when it only moves data). */
static void kernel_ops(const nb_kernel *k, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (int i = 0; i < k->nnodes; i++) {
    if (!nb_jit__kernel_first_op(k, i)) continue;
    const char *name = nb__rules(k->nodes[i].prim)->name;
    size_t len = strlen(name) + (n ? 1 : 0);
    if (n + len + 4 > cap) {
      snprintf(out + n, cap - n, "...");
      return;
    }
    n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "+" : "", name);
  }
  if (!n) snprintf(out, cap, "copy");
}

/* Kahn's algorithm, earliest source equation first among the ready steps. */
static int schedule(fz *f) {
  nb_jplan *p = f->p;
  int n = f->nsteps;
  int *pending = nb_jit__alloc(f->ar, sizeof(int) * ((size_t)n + 1));
  uint8_t *done = nb_jit__alloc(f->ar, (size_t)n + 1);
  p->steps = nb_jit__alloc(p->ar, sizeof(nb_jstep) * ((size_t)n + 1));
  if (!pending || !done || !p->steps) return ERR;
  for (int i = 0; i < n; i++) pending[i] = f->steps[i].ndeps;
  p->nsteps = p->cap_steps = 0;
  for (int placed = 0; placed < n; placed++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!done[i] && pending[i] == 0 && (best < 0 || f->steps[i].order < f->steps[best].order)) best = i;
    if (best < 0) return nb_errorf(f->ctx, NB_ERR_INTERNAL, "jit: fusion produced a cyclic schedule"), ERR;
    done[best] = 1;
    for (int i = 0; i < n; i++)
      if (!done[i])
        for (int j = 0; j < f->steps[i].ndeps; j++)
          if (f->steps[i].deps[j] == best) pending[i]--;
    const pstep *s = &f->steps[best];
    nb_jstep *o = &p->steps[p->nsteps++];
    memset(o, 0, sizeof *o);
    o->kind = s->kind;
    o->kernel = s->kernel;
    o->eqn = s->eqn;
    o->order = s->order;
    if (s->kind == NB_EXE_STEP_KERNEL) {
      const nb_kernel *k = &p->kernels[s->kernel];
      snprintf(o->name, sizeof o->name, "k%d", s->kernel);
      kernel_ops(k, o->ops, sizeof o->ops);
      if (k->nroots && f->vals[k->roots[0]]->def) o->loc = f->vals[k->roots[0]]->def->loc;
      o->neqns = (size_t)k->neqns;
      o->flops = k->flops;
      o->bytes = k->bytes;
    } else {
      const char *half = s->kind == NB_EXE_STEP_START ? " start" : s->kind == NB_EXE_STEP_WAIT ? " wait" : "";
      snprintf(o->name, sizeof o->name, "%s%s", nb__rules(s->eqn->prim)->name, half);
      snprintf(o->ops, sizeof o->ops, "%s", nb__rules(s->eqn->prim)->name);
      o->loc = s->eqn->loc;
      o->neqns = 1;
      double fl = 0, by = 0;
      const nb_prim_rules *r = nb__rules(s->eqn->prim);
      if (r->cost) r->cost(s->eqn, &fl, &by);
      for (int i = 0; !r->cost && i < s->eqn->nin + s->eqn->nout; i++) {
        const nb_val *v = i < s->eqn->nin ? s->eqn->in[i] : s->eqn->out[i - s->eqn->nin];
        by += (double)nb_shape_size(&v->aval.shape) * (double)nb_dtype_size(v->aval.dtype);
      }
      o->flops = s->kind == NB_EXE_STEP_WAIT ? 0 : fl; /* the start step carries the cost */
      o->bytes = s->kind == NB_EXE_STEP_WAIT ? 0 : by;
    }
  }
  p->cap_steps = p->nsteps;
  p->nstarts = 0;
  for (int s = 0; s < p->nsteps; s++) p->nstarts += p->steps[s].kind == NB_EXE_STEP_START;
  for (int w = 0; w < p->nsteps; w++) /* each wait names its start */
    for (int s = 0; p->steps[w].kind == NB_EXE_STEP_WAIT && s < w; s++)
      if (p->steps[s].kind == NB_EXE_STEP_START && p->steps[s].eqn == p->steps[w].eqn) p->steps[w].start = s;
  return OK;
}

static bool count_eqns(fz *f) {
  const nb_val **stack = nb_jit__alloc(f->ar, sizeof(nb_val *) * (f->nv + 1));
  if (!stack) return false;
  for (int kk = 0; kk < f->p->nkernels; kk++) {
    nb_kernel *k = &f->p->kernels[kk];
    f->cur_stamp++;
    int n = 0;
    for (int r = 0; r < k->nroots; r++) {
      size_t sp = 0; /* each value is pushed at most once: the stack never overflows */
      stack[sp++] = f->vals[k->roots[r]];
      f->stamp[k->roots[r]] = f->cur_stamp;
      while (sp > 0) {
        const nb_val *v = stack[--sp];
        n++;
        for (int i = 0; i < v->def->nin; i++) {
          const nb_val *x = v->def->in[i];
          if (x->def && (!f->leaf[x->id] || is_scalar_const(x)) && f->stamp[x->id] != f->cur_stamp) {
            f->stamp[x->id] = f->cur_stamp;
            stack[sp++] = x;
          }
        }
      }
    }
    k->neqns = n;
  }
  return true;
}

static void classify_buffers(fz *f) {
  nb_jplan *p = f->p;
  for (size_t id = 0; id < f->nv; id++) {
    nb_jbuf *b = &p->bufs[id];
    memset(b, 0, sizeof *b);
    b->donor = -1;
    b->view = f->view[id];
    b->view_offset = f->view_off[id];
    b->def_step = b->last_step = -1;
    const nb_val *v = f->vals[id];
    if (!v || !f->mat[id]) continue;
    b->nbytes = (size_t)nb_shape_size(&v->aval.shape) * nb_dtype_size(v->aval.dtype);
    if (!v->def) {
      b->cls = NB_BUF_INPUT;
      b->index = v->input_index;
    } else if (v->def->prim == NB_PRIM_constant) {
      b->cls = NB_BUF_CONST;
      b->constant = ((const nb_constant_params *)v->def->params)->value;
    } else if (f->is_out[id]) {
      b->cls = NB_BUF_OUTPUT;
      b->index = -1;
      for (size_t i = 0; i < nb_graph_num_outputs(f->g) && b->index < 0; i++)
        if (nb__graph_output(f->g, i)->id == id) b->index = (int)i;
    } else {
      b->cls = NB_BUF_TEMP;
    }
  }
}

/* A root materialized because it has several users (and is too costly to
 * recompute) whose users all joined its own kernel is read there from its
 * node, never from memory: the store and the buffer go (GELU's backward
 * wrote a 4 MB intermediate per layer of the tiny gpt2 step that nothing
 * read). Kept: graph outputs, values other steps read (a kernel's load, an
 * equation's operand) or that a view lives in, and a kernel's last store. */
static bool drop_unread_stores(fz *f) {
  uint8_t *read = nb_jit__alloc(f->ar, f->nv + 1);
  if (!read) return false;
  memset(read, 0, f->nv + 1);
  for (int kk = 0; kk < f->p->nkernels; kk++) {
    const nb_kernel *k = &f->p->kernels[kk];
    for (int i = 0; i < k->nnodes; i++)
      if (k->nodes[i].kind == NB_KN_LOAD) read[k->args[k->nodes[i].arg]] = 1;
  }
  for (int st = 0; st < f->nsteps; st++)
    for (int i = 0; f->steps[st].kind != NB_EXE_STEP_KERNEL && i < f->steps[st].eqn->nin; i++)
      read[f->steps[st].eqn->in[i]->id] = 1;
  for (size_t v = 0; v < f->nv; v++)
    if (f->view[v] >= 0) read[f->view[v]] = 1; /* v lives in that value's memory */
  for (int kk = 0; kk < f->p->nkernels; kk++) {
    nb_kernel *k = &f->p->kernels[kk];
    for (int st = 0; st < k->nstores && k->nstores > 1;) {
      int a = k->stores[st].arg;
      uint32_t v = k->args[a];
      if (read[v] || f->is_out[v]) {
        st++;
        continue;
      }
      memmove(&k->stores[st], &k->stores[st + 1], sizeof *k->stores * (size_t)(k->nstores - st - 1));
      k->nstores--;
      memmove(&k->args[a], &k->args[a + 1], sizeof *k->args * (size_t)(k->nargs - a - 1));
      memmove(&k->arg_written[a], &k->arg_written[a + 1], sizeof *k->arg_written * (size_t)(k->nargs - a - 1));
      k->nargs--;
      for (int i = 0; i < k->nnodes; i++)
        if (k->nodes[i].kind == NB_KN_LOAD && k->nodes[i].arg > a) k->nodes[i].arg--;
      for (int i = 0; i < k->nstores; i++)
        if (k->stores[i].arg > a) k->stores[i].arg--;
      f->mat[v] = 0;
    }
  }
  return true;
}

static int attempt(fz *f) {
  f->nsteps = 0;
  f->p->nkernels = f->p->cap_kernels = 0;
  f->p->kernels = NULL;
  f->steps = NULL;
  f->cap_steps = 0;
  f->ksig = NULL;
  f->cap_ksig = 0;
  for (size_t i = 0; i < f->nv; i++) f->step_of[i] = f->reduce_kernel[i] = f->root_kernel[i] = -1;
  decide_materialized(f);
  int r = build_steps(f);
  if (r != OK) return r;
  for (int kk = 0; kk < f->p->nkernels; kk++) {
    int rk = lower_roots(f, kk);
    if (rk == ERR) return ERR;
    if (rk == RETRY) {
      r = RETRY;
      if (f->fail_val == UINT32_MAX) continue; /* a root that may not join its kernel (no_join) */
      if (f->leaf[f->fail_val]) return nb_errorf(f->ctx, NB_ERR_INTERNAL, "jit: fusion cannot place value %u", f->fail_val), ERR;
      f->force[f->fail_val] = 1;
    }
  }
  if (r != OK) return r;
  if (!f->cfg->off[NB_SW_fuse] && !drop_unread_stores(f)) return ERR;
  for (int kk = 0; kk < f->p->nkernels; kk++) {
    nb_kernel *k = &f->p->kernels[kk];
    assign_phases(k);
    canonicalize(k);
    kernel_cost(f, k);
  }
  if (!count_eqns(f) || schedule(f) != OK) return ERR;
  classify_buffers(f);
  return OK;
}

static bool fz_init(fz *f) {
  size_t nv = f->nv + 1;
  f->mat = nb_jit__alloc(f->p->ar, nv);
  f->force = nb_jit__alloc(f->p->ar, nv);
  f->is_out = nb_jit__alloc(f->p->ar, nv);
  f->leaf = nb_jit__alloc(f->p->ar, nv);
  f->view = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->view_off = nb_jit__alloc(f->p->ar, nv * sizeof(size_t));
  f->evaluated_only = nb_jit__alloc(f->p->ar, nv);
  f->reduced = nb_jit__alloc(f->p->ar, nv);
  f->reads_donated = nb_jit__alloc(f->p->ar, nv);
  f->nusers = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->cost = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->step_of = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->stamp = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->reduce_kernel = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->root_kernel = nb_jit__alloc(f->p->ar, nv * sizeof(int));
  f->no_join = nb_jit__alloc(f->p->ar, nv);
  f->vals = nb_jit__alloc(f->p->ar, nv * sizeof(nb_val *));
  f->p->bufs = nb_jit__alloc(f->p->ar, nv * sizeof(nb_jbuf));
  if (!f->mat || !f->force || !f->is_out || !f->leaf || !f->view || !f->view_off || !f->evaluated_only || !f->reduced || !f->reads_donated || !f->nusers || !f->cost || !f->step_of || !f->stamp || !f->reduce_kernel || !f->root_kernel || !f->no_join ||
      !f->vals || !f->p->bufs)
    return false;
  for (size_t i = 0; i < nb_graph_num_inputs(f->g); i++) f->vals[nb__graph_input(f->g, i)->id] = nb__graph_input(f->g, i);
  for (size_t k = 0; k < f->ne; k++) {
    const nb_eqn *e = nb__graph_eqn(f->g, k);
    for (int i = 0; i < e->nout; i++) f->vals[e->out[i]->id] = e->out[i];
  }
  count_users(f);
  return true;
}

nb_status nb_jit__fuse(nb_ctx *ctx, nb_jplan *plan, const nb_jit_config *cfg) {
  fz f;
  memset(&f, 0, sizeof f);
  f.ctx = ctx;
  f.p = plan;
  f.cfg = cfg;
  f.g = plan->g;
  f.nv = nb__graph_nvals(plan->g);
  f.ne = nb__graph_neqns(plan->g);
  plan->nvals = f.nv;
  if (!fz_init(&f)) return nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory in fusion");
  plan->vals = f.vals;
  for (size_t tries = 0; tries <= f.nv + 1; tries++) {
    nb_jit_arena scratch = {ctx, NULL};
    f.ar = &scratch;
    int r = attempt(&f);
    if (r == OK) {
      plan->fuse_attempts = (int)tries + 1;
      /* keep this attempt's objects: hand the scratch blocks to the plan */
      nb_jit__arena_adopt(plan->ar, &scratch);
      return NB_OK;
    }
    nb_jit__arena_free(&scratch);
    if (r == ERR) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : nb_errorf(ctx, NB_ERR_NOMEM, "jit: out of memory in fusion");
  }
  return nb_errorf(ctx, NB_ERR_INTERNAL, "jit: fusion did not converge");
}
