/* Graphs: the arena, values and hash-consed equations, inputs and outputs,
 * the sticky trace error, printing, structural hashing and equality, the
 * verifier and inlining. Not here: what any primitive means (prims/), how
 * graphs are run (interp.c) or transformed (src/transform/). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

const nb_prim_rules *const nb__prim_table[NB_PRIM_COUNT] = {
#define NB_PRIM(name, family) [NB_PRIM_##name] = &nb__prim_##name,
#include "core/prims/prims.def"
#undef NB_PRIM
};

const char *nb__prim_family(nb_prim p) {
  static const char *const family[NB_PRIM_COUNT] = {
#define NB_PRIM(name, fam) [NB_PRIM_##name] = #fam,
#include "core/prims/prims.def"
#undef NB_PRIM
  };
  return p >= 0 && p < NB_PRIM_COUNT && family[p] ? family[p] : "other";
}

typedef struct arena_block {
  struct arena_block *next;
  size_t size, used;
  _Alignas(64) unsigned char data[];
} arena_block;

typedef struct port {
  nb_val *val;
  char *path; /* arena-owned */
} port;

struct nb_graph {
  nb_ctx *ctx;
  int refcount;
  arena_block *arena;
  nb_eqn **eqns;
  size_t neqns, cap_eqns;
  nb_val **vals;
  size_t nvals, cap_vals;
  port *inputs, *outputs;
  size_t nin, nout, cap_in, cap_out;
  nb_eqn **buckets; /* hash-cons table, a power of two */
  size_t nbuckets;
  nb_array **held_arrays;
  size_t nheld_arrays, cap_held_arrays;
  const nb_graph **held_graphs;
  size_t nheld_graphs, cap_held_graphs;
  nb_status err;
  char *errmsg;
  nb_val poison;
};

/* ---------------------------------------------------------------- arena */

void *nb__arena_alloc(nb_graph *g, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  arena_block *b = g->arena;
  if (!b || b->used + bytes > b->size) {
    size_t size = bytes > 60000 ? bytes : 60000;
    b = nb_alloc(g->ctx, sizeof(arena_block) + size);
    if (!b) return NULL;
    b->next = g->arena;
    b->size = size;
    b->used = 0;
    g->arena = b;
  }
  void *p = b->data + b->used;
  b->used += bytes;
  memset(p, 0, bytes);
  return p;
}

static char *arena_strdup(nb_graph *g, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = nb__arena_alloc(g, n);
  if (p) memcpy(p, s, n);
  return p;
}

/* Grows a vector of elem-sized entries held in ctx memory to hold `need`. */
static bool grow(nb_ctx *ctx, void **v, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t cap2 = *cap ? *cap * 2 : 16;
  while (cap2 < need) cap2 *= 2;
  void *p = nb_alloc(ctx, cap2 * elem);
  if (!p) return false;
  if (*cap) memcpy(p, *v, *cap * elem);
  nb_dealloc(ctx, *v, *cap * elem);
  *v = p;
  *cap = cap2;
  return true;
}
#define GROW(g, field, capfield, need) \
  grow((g)->ctx, (void **)&(g)->field, &(g)->capfield, (need), sizeof *(g)->field)

/* ---------------------------------------------------------------- lifetime */

nb_graph *nb_graph_create(nb_ctx *ctx) {
  nb_graph *g = nb_calloc(ctx, sizeof *g);
  if (!g) return NULL;
  g->ctx = ctx;
  g->refcount = 1;
  g->poison.g = g;
  g->poison.id = UINT32_MAX;
  g->poison.input_index = -1;
  g->poison.aval = nb_aval_make(NB_F32, 0, NULL);
  g->nbuckets = 256;
  g->buckets = nb_calloc(ctx, g->nbuckets * sizeof(nb_eqn *));
  if (!g->buckets) {
    nb_dealloc(ctx, g, sizeof *g);
    return NULL;
  }
  return g;
}

void nb__graph_retain(const nb_graph *g) { ((nb_graph *)g)->refcount++; }

void nb_graph_destroy(nb_graph *g) {
  if (!g || --g->refcount > 0) return;
  nb_ctx *ctx = g->ctx;
  for (size_t i = 0; i < g->nheld_arrays; i++) nb_array_release(g->held_arrays[i]);
  for (size_t i = 0; i < g->nheld_graphs; i++) nb_graph_destroy((nb_graph *)g->held_graphs[i]);
  nb_dealloc(ctx, g->held_arrays, g->cap_held_arrays * sizeof(void *));
  nb_dealloc(ctx, g->held_graphs, g->cap_held_graphs * sizeof(void *));
  nb_dealloc(ctx, g->eqns, g->cap_eqns * sizeof(void *));
  nb_dealloc(ctx, g->vals, g->cap_vals * sizeof(void *));
  nb_dealloc(ctx, g->inputs, g->cap_in * sizeof(port));
  nb_dealloc(ctx, g->outputs, g->cap_out * sizeof(port));
  nb_dealloc(ctx, g->buckets, g->nbuckets * sizeof(nb_eqn *));
  nb_strfree(ctx, g->errmsg);
  arena_block *b = g->arena;
  while (b) {
    arena_block *next = b->next;
    nb_dealloc(ctx, b, sizeof(arena_block) + b->size);
    b = next;
  }
  nb_dealloc(ctx, g, sizeof *g);
}

nb_ctx *nb_graph_ctx(const nb_graph *g) { return g->ctx; }

nb_status nb__graph_hold_array(nb_graph *g, nb_array *a) {
  if (!GROW(g, held_arrays, cap_held_arrays, g->nheld_arrays + 1)) return NB_ERR_NOMEM;
  nb_array_retain(a);
  g->held_arrays[g->nheld_arrays++] = a;
  return NB_OK;
}

nb_status nb__graph_hold_graph(nb_graph *g, const nb_graph *sub) {
  if (!GROW(g, held_graphs, cap_held_graphs, g->nheld_graphs + 1)) return NB_ERR_NOMEM;
  nb__graph_retain(sub);
  g->held_graphs[g->nheld_graphs++] = sub;
  return NB_OK;
}

/* ---------------------------------------------------------------- errors */

nb_val *nb__poison(nb_graph *g) { return &g->poison; }
bool nb__is_poison(const nb_val *v) { return v->id == UINT32_MAX; }

__attribute__((format(printf, 4, 0))) static nb_val *fail_v(nb_graph *g, nb_loc loc, nb_status s, const char *fmt, va_list ap) {
  if (g->err != NB_OK) return &g->poison; /* sticky: keep the first error */
  char msg[NB_ERRMSG_CAP];
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  if (loc.file && n >= 0 && (size_t)n < sizeof msg)
    snprintf(msg + n, sizeof msg - (size_t)n, " (at %s:%d)", loc.file, loc.line);
  g->err = s;
  g->errmsg = nb_strdup(g->ctx, msg);
  nb_errorf(g->ctx, s, "%s", msg);
  return &g->poison;
}

nb_val *nb__fail(nb_graph *g, nb_loc loc, nb_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nb_val *v = fail_v(g, loc, s, fmt, ap);
  va_end(ap);
  return v;
}

nb_val *nb_graph_fail_at(nb_loc loc, nb_graph *g, nb_status s, const char *fmt, ...) {
  if (!g) return NULL;
  va_list ap;
  va_start(ap, fmt);
  nb_val *v = fail_v(g, loc, s, fmt, ap);
  va_end(ap);
  return v;
}

nb_status nb_graph_status(const nb_graph *g) { return g ? g->err : NB_ERR_INVALID_ARG; }
const char *nb_graph_error(const nb_graph *g) { return g && g->errmsg ? g->errmsg : ""; }

nb_graph *nb__graph_of(nb_loc loc, int n, nb_val *const *vals) {
  nb_graph *g = NULL;
  for (int i = 0; i < n; i++) {
    if (!vals[i]) continue;
    if (!g) g = vals[i]->g;
    else if (vals[i]->g != g) {
      nb__fail(g, loc, NB_ERR_INVALID_ARG, "operands %d and 0 belong to different graphs (a value used outside its trace)", i);
      return g;
    }
  }
  return g;
}

/* ---------------------------------------------------------------- values */

static nb_val *new_val(nb_graph *g, nb_aval aval, nb_eqn *def, int out_index) {
  nb_val *v = nb__arena_alloc(g, sizeof *v);
  if (!v || !GROW(g, vals, cap_vals, g->nvals + 1)) return NULL;
  v->g = g;
  v->id = (uint32_t)g->nvals;
  v->input_index = -1;
  v->aval = aval;
  v->def = def;
  v->out_index = out_index;
  g->vals[g->nvals++] = v;
  return v;
}

nb_aval nb_val_aval(const nb_val *v) { return v->aval; }
nb_dtype nb_val_dtype(const nb_val *v) { return v->aval.dtype; }
int nb_val_rank(const nb_val *v) { return v->aval.shape.rank; }
nb_graph *nb_val_graph(const nb_val *v) { return v->g; }
int64_t nb_val_dim(const nb_val *v, int axis) {
  int a = nb__norm_axis(axis, v->aval.shape.rank);
  return a < 0 ? -1 : v->aval.shape.dims[a];
}

int nb__norm_axis(int axis, int rank) {
  if (axis < 0) axis += rank;
  return axis >= 0 && axis < rank ? axis : -1;
}

char *nb__avals_str(int n, const nb_aval *a, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used + 1 < cap; i++) {
    char one[160];
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", nb_aval_str(&a[i], one, sizeof one));
  }
  return buf;
}

/* ---------------------------------------------------------------- inputs/outputs */

nb_val *nb__graph_add_input(nb_graph *g, const char *path, nb_aval aval) {
  if (g->err) return &g->poison;
  for (size_t i = 0; i < g->nin; i++)
    if (strcmp(g->inputs[i].path, path) == 0)
      return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph input '%s' declared twice", path);
  char *p = arena_strdup(g, path);
  nb_val *v = p ? new_val(g, aval, NULL, 0) : NULL;
  if (!v || !GROW(g, inputs, cap_in, g->nin + 1)) return nb__fail(g, (nb_loc){0}, NB_ERR_NOMEM, "out of memory");
  v->input_index = (int32_t)g->nin;
  g->inputs[g->nin++] = (port){v, p};
  return v;
}

nb_status nb__graph_add_output(nb_graph *g, const char *path, nb_val *v) {
  if (g->err) return g->err;
  if (!v) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph output '%s' is NULL", path), g->err;
  if (v->g != g)
    return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph output '%s' is a value of another graph", path), g->err;
  if (nb__is_poison(v)) return g->err ? g->err : NB_ERR_INTERNAL;
  for (size_t i = 0; i < g->nout; i++)
    if (strcmp(g->outputs[i].path, path) == 0)
      return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph output '%s' declared twice", path), g->err;
  char *p = arena_strdup(g, path);
  if (!p || !GROW(g, outputs, cap_out, g->nout + 1)) return nb__fail(g, (nb_loc){0}, NB_ERR_NOMEM, "out of memory"), g->err;
  g->outputs[g->nout++] = (port){v, p};
  return NB_OK;
}

nb_val *nb_graph_input(nb_graph *g, const char *path, nb_aval aval) {
  if (!path || !*path) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph input path is empty");
  return nb__graph_add_input(g, path, aval);
}
nb_status nb_graph_output(nb_graph *g, const char *path, nb_val *v) {
  if (!path || !*path) return nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "graph output path is empty"), g->err;
  return nb__graph_add_output(g, path, v);
}

size_t nb_graph_num_inputs(const nb_graph *g) { return g->nin; }
size_t nb_graph_num_outputs(const nb_graph *g) { return g->nout; }
size_t nb_graph_num_eqns(const nb_graph *g) { return g->neqns; }
const char *nb_graph_input_path(const nb_graph *g, size_t i) { return i < g->nin ? g->inputs[i].path : NULL; }
const char *nb_graph_output_path(const nb_graph *g, size_t i) { return i < g->nout ? g->outputs[i].path : NULL; }
size_t nb__graph_neqns(const nb_graph *g) { return g->neqns; }
nb_eqn *nb__graph_eqn(const nb_graph *g, size_t i) { return g->eqns[i]; }
nb_val *nb__graph_input(const nb_graph *g, size_t i) { return g->inputs[i].val; }
nb_val *nb__graph_output(const nb_graph *g, size_t i) { return g->outputs[i].val; }
size_t nb__graph_nvals(const nb_graph *g) { return g->nvals; }

static nb_tree *ports_spec(const nb_graph *g, const port *ports, size_t n) {
  nb_tree *t = nb_tree_create(g->ctx);
  for (size_t i = 0; t && i < n; i++)
    if (nb_tree_set(t, ports[i].path, nb_leaf_aval(ports[i].val->aval)) != NB_OK) {
      nb_tree_destroy(t);
      return NULL;
    }
  return t;
}
nb_tree *nb_graph_input_spec(const nb_graph *g) { return ports_spec(g, g->inputs, g->nin); }
nb_tree *nb_graph_output_spec(const nb_graph *g) { return ports_spec(g, g->outputs, g->nout); }

/* ---------------------------------------------------------------- emit */

static uint64_t params_hash(const nb_prim_rules *r, const void *params, size_t size) {
  if (!params || !size) return 0;
  return r->hash_params ? r->hash_params(params, size) : nb__hash_bytes(params, size, 7);
}

static bool params_equal(const nb_prim_rules *r, const void *a, size_t sa, const void *b, size_t sb) {
  if (sa != sb) return false;
  if (!sa) return true;
  return r->params_equal ? r->params_equal(a, b, sa) : memcmp(a, b, sa) == 0;
}

static nb_eqn *find_eqn(nb_graph *g, uint64_t h, nb_prim p, int nin, nb_val *const *in, const void *params,
                        size_t psize) {
  const nb_prim_rules *r = nb__rules(p);
  for (nb_eqn *e = g->buckets[h & (g->nbuckets - 1)]; e; e = e->hnext) {
    if (e->hash != h || e->prim != p || e->nin != nin) continue;
    bool same = true;
    for (int i = 0; i < nin && same; i++) same = e->in[i] == in[i];
    if (same && params_equal(r, e->params, e->params_size, params, psize)) return e;
  }
  return NULL;
}

static bool rehash(nb_graph *g) {
  size_t nb = g->nbuckets * 2;
  nb_eqn **b = nb_calloc(g->ctx, nb * sizeof(nb_eqn *));
  if (!b) return false;
  for (size_t i = 0; i < g->nbuckets; i++) {
    nb_eqn *e = g->buckets[i];
    while (e) {
      nb_eqn *next = e->hnext;
      e->hnext = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
      e = next;
    }
  }
  nb_dealloc(g->ctx, g->buckets, g->nbuckets * sizeof(nb_eqn *));
  g->buckets = b;
  g->nbuckets = nb;
  return true;
}

#define MAX_OUTS 256

nb_val *nb__emit(nb_graph *g, nb_loc loc, nb_prim p, int nin, nb_val *const *in, const void *params,
                 size_t params_size, int *nout, nb_val **outs) {
  if (nout) *nout = 0;
  if (!g) return NULL;
  if (g->err) return &g->poison;
  const nb_prim_rules *r = nb__rules(p);
  nb_aval small[16] = {0}, *avals = small; /* zeroed: gcc -O3 (Release) cannot see that nin == 0 never reads it */
  if (nin > 16 && !(avals = nb_alloc(g->ctx, (size_t)nin * sizeof(nb_aval))))
    return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
  nb_val *ret = NULL;
  for (int i = 0; i < nin && !ret; i++) {
    if (!in[i]) ret = nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: operand %d is NULL", r->name, i);
    else if (in[i]->g != g) ret = nb__fail(g, loc, NB_ERR_INVALID_ARG, "%s: operand %d belongs to another graph", r->name, i);
    else if (nb__is_poison(in[i])) ret = &g->poison;
    else avals[i] = in[i]->aval;
  }
  nb_aval out_avals[MAX_OUTS];
  int no = 1;
  if (!ret) {
    char why[1024] = "";
    nb_status st = r->infer(params, nin, avals, &no, out_avals, why, sizeof why);
    if (st == NB_OK && (no < 0 || no > MAX_OUTS)) st = NB_ERR_INTERNAL, snprintf(why, sizeof why, "bad output count %d", no);
    if (st != NB_OK) {
      char shapes[1024];
      ret = nb__fail(g, loc, st, "%s: %s (operands: %s)", r->name, why, nb__avals_str(nin, avals, shapes, sizeof shapes));
    }
  }
  if (avals != small) nb_dealloc(g->ctx, avals, (size_t)nin * sizeof(nb_aval));
  if (ret) return ret;

  uint64_t h = nb__hash_combine((uint64_t)p * 0x100000001b3ull, params_hash(r, params, params_size));
  for (int i = 0; i < nin; i++) h = nb__hash_combine(h, in[i]->id);
  nb_eqn *e = r->impure ? NULL : find_eqn(g, h, p, nin, in, params, params_size);
  if (!e) {
    e = nb__arena_alloc(g, sizeof *e);
    nb_val **ins = e ? nb__arena_alloc(g, (size_t)(nin ? nin : 1) * sizeof(nb_val *)) : NULL;
    nb_val **os = ins ? nb__arena_alloc(g, (size_t)(no ? no : 1) * sizeof(nb_val *)) : NULL;
    void *pcopy = os && params_size ? nb__arena_alloc(g, params_size) : NULL;
    if (!os || (params_size && !pcopy) || !GROW(g, eqns, cap_eqns, g->neqns + 1))
      return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
    if (r->hold_params && params && r->hold_params(g, params) != NB_OK)
      return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
    if (params_size) memcpy(pcopy, params, params_size);
    if (nin) memcpy(ins, in, (size_t)nin * sizeof(nb_val *)); /* in may be NULL for nin == 0 */
    *e = (nb_eqn){.prim = p, .nin = nin, .nout = no, .in = ins, .out = os, .params = pcopy,
                  .params_size = params_size, .loc = loc, .hash = h, .index = (uint32_t)g->neqns};
    for (int i = 0; i < no; i++)
      if (!(os[i] = new_val(g, out_avals[i], e, i))) return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
    g->eqns[g->neqns++] = e;
    if (!r->impure) {
      if (g->neqns > g->nbuckets && !rehash(g)) return nb__fail(g, loc, NB_ERR_NOMEM, "out of memory");
      size_t b = h & (g->nbuckets - 1);
      e->hnext = g->buckets[b];
      g->buckets[b] = e;
    }
  }
  if (nout) *nout = e->nout;
  if (outs)
    for (int i = 0; i < e->nout; i++) outs[i] = e->out[i];
  return e->nout ? e->out[0] : &g->poison;
}

nb_val *nb__emit1(nb_graph *g, nb_loc loc, nb_prim p, int nin, nb_val *const *in, const void *params,
                  size_t params_size) {
  return nb__emit(g, loc, p, nin, in, params, params_size, NULL, NULL);
}

/* ---------------------------------------------------------------- tracing */

nb_graph *nb_trace(nb_ctx *ctx, nb_trace_fn fn, void *user, const nb_tree *spec) {
  if (!fn || !spec) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_trace: NULL function or spec"), NULL;
  nb_graph *g = nb_graph_create(ctx);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  if (!g || !in || !out) goto fail;
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    const nb_leaf *l = nb_tree_leaf(spec, i);
    nb_val *v = nb__graph_add_input(g, nb_tree_path(spec, i), nb_leaf_get_aval(l));
    if (g->err || nb_tree_set_val(in, nb_tree_path(spec, i), v) != NB_OK) goto fail;
  }
  nb_status st = fn(g, in, out, user);
  if (g->err) goto fail; /* the op that failed already described the error */
  if (st != NB_OK) {
    if (nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "traced function returned %s", nb_status_name(st));
    goto fail;
  }
  for (size_t i = 0; i < nb_tree_size(out); i++) {
    const nb_leaf *l = nb_tree_leaf(out, i);
    nb_val *v = l->kind == NB_LEAF_VAL    ? l->val
                : l->kind == NB_LEAF_ARRAY ? nb_const_at((nb_loc){0}, g, l->array)
                                           : NULL;
    if (!v) {
      nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "nb_trace: output '%s' is not a value or array", nb_tree_path(out, i));
      goto fail;
    }
    if (nb__graph_add_output(g, nb_tree_path(out, i), v) != NB_OK) goto fail;
  }
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  return g;
fail:
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_graph_destroy(g);
  return NULL;
}

nb_status nb__graph_inline(nb_graph *dst, const nb_graph *src, nb_val *const *map_in, nb_val **map_out) {
  nb_val **map = nb_calloc(dst->ctx, (src->nvals ? src->nvals : 1) * sizeof(nb_val *));
  if (!map) return NB_ERR_NOMEM;
  for (size_t i = 0; i < src->nin; i++) {
    if (!nb_aval_equal(&map_in[i]->aval, &src->inputs[i].val->aval)) {
      char a[128], b[128];
      nb__fail(dst, (nb_loc){0}, NB_ERR_SHAPE, "call: input '%s' is %s, the callee wants %s", src->inputs[i].path,
               nb_aval_str(&map_in[i]->aval, a, sizeof a), nb_aval_str(&src->inputs[i].val->aval, b, sizeof b));
      break;
    }
    map[src->inputs[i].val->id] = map_in[i];
  }
  nb_val *small[64];
  for (size_t k = 0; k < src->neqns && !dst->err; k++) {
    const nb_eqn *e = src->eqns[k];
    nb_val **in = e->nin <= 64 ? small : nb_alloc(dst->ctx, (size_t)e->nin * sizeof(nb_val *));
    if (!in) break;
    for (int i = 0; i < e->nin; i++) in[i] = map[e->in[i]->id];
    nb_val *outs[MAX_OUTS];
    nb__emit(dst, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
    if (in != small) nb_dealloc(dst->ctx, in, (size_t)e->nin * sizeof(nb_val *));
    if (dst->err) break;
    for (int i = 0; i < e->nout; i++) map[e->out[i]->id] = outs[i];
  }
  for (size_t i = 0; i < src->nout; i++) map_out[i] = dst->err ? &dst->poison : map[src->outputs[i].val->id];
  nb_dealloc(dst->ctx, map, (src->nvals ? src->nvals : 1) * sizeof(nb_val *));
  return dst->err;
}

nb_status nb_graph_call(nb_graph *g, const nb_graph *callee, const nb_tree *in, nb_tree *out) {
  if (g->err) return g->err;
  nb_val **map_in = nb_alloc(g->ctx, (callee->nin + 1) * sizeof(nb_val *));
  nb_val **map_out = nb_alloc(g->ctx, (callee->nout + 1) * sizeof(nb_val *));
  nb_status st = NB_OK;
  if (!map_in || !map_out) st = NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < callee->nin; i++) {
    const nb_leaf *l = nb_tree_get(in, callee->inputs[i].path);
    nb_val *v = !l ? NULL : l->kind == NB_LEAF_VAL ? l->val : l->kind == NB_LEAF_ARRAY ? nb_const_at((nb_loc){0}, g, l->array) : NULL;
    if (!v) {
      nb__fail(g, (nb_loc){0}, NB_ERR_INVALID_ARG, "call: no value for callee input '%s'", callee->inputs[i].path);
      st = g->err;
    }
    map_in[i] = v;
  }
  if (st == NB_OK) st = nb__graph_inline(g, callee, map_in, map_out);
  for (size_t i = 0; st == NB_OK && i < callee->nout; i++) st = nb_tree_set_val(out, callee->outputs[i].path, map_out[i]);
  nb_dealloc(g->ctx, map_in, (callee->nin + 1) * sizeof(nb_val *));
  nb_dealloc(g->ctx, map_out, (callee->nout + 1) * sizeof(nb_val *));
  return st;
}

/* ---------------------------------------------------------------- printing, hashing */

typedef struct strbuf {
  nb_ctx *ctx;
  char *s;
  size_t n, cap;
  bool oom;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 1024) + (size_t)k;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = true;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

/* The canonical text: values are numbered in definition order, so two
 * structurally equal graphs print the same. */
static char *graph_text(const nb_graph *g) {
  strbuf b = {g->ctx, NULL, 0, 0, false};
  uint32_t *num = calloc(g->nvals + 1, sizeof(uint32_t));
  if (!num) return NULL;
  uint32_t next = 0;
  char av[160], params[2048];
  for (size_t i = 0; i < g->nin; i++) {
    num[g->inputs[i].val->id] = next++;
    sb_printf(&b, "in %%%u %s: %s\n", num[g->inputs[i].val->id], g->inputs[i].path,
              nb_aval_str(&g->inputs[i].val->aval, av, sizeof av));
  }
  for (size_t k = 0; k < g->neqns; k++) {
    const nb_eqn *e = g->eqns[k];
    const nb_prim_rules *r = nb__rules(e->prim);
    for (int i = 0; i < e->nout; i++) {
      num[e->out[i]->id] = next++;
      sb_printf(&b, "%s%%%u: %s", i ? ", " : "", num[e->out[i]->id], nb_aval_str(&e->out[i]->aval, av, sizeof av));
    }
    params[0] = 0;
    if (r->print_params) r->print_params(e, params, sizeof params);
    sb_printf(&b, " = %s%s%s%s", r->name, params[0] ? "[" : "", params, params[0] ? "]" : "");
    for (int i = 0; i < e->nin; i++) sb_printf(&b, " %%%u", num[e->in[i]->id]);
    sb_printf(&b, "\n");
  }
  for (size_t i = 0; i < g->nout; i++) sb_printf(&b, "out %s = %%%u\n", g->outputs[i].path, num[g->outputs[i].val->id]);
  free(num);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s ? b.s : calloc(1, 1);
}

char *nb_graph_to_string(const nb_graph *g) { return graph_text(g); }

void nb_graph_print(const nb_graph *g, FILE *f) {
  char *s = graph_text(g);
  if (s) fputs(s, f);
  free(s);
}

uint64_t nb_graph_hash(const nb_graph *g) {
  char *s = graph_text(g);
  uint64_t h = s ? nb__hash_bytes(s, strlen(s), 11) : 0;
  free(s);
  return h;
}

int nb__print_graph_param(char *buf, size_t cap, const char *name, const nb_graph *callee) {
  return snprintf(buf, cap, "%s=#%016llx", name, (unsigned long long)nb_graph_hash(callee));
}

bool nb_graph_equal(const nb_graph *a, const nb_graph *b) {
  char *x = graph_text(a), *y = graph_text(b);
  bool eq = x && y && strcmp(x, y) == 0;
  free(x);
  free(y);
  return eq;
}

/* ---------------------------------------------------------------- verify, cost */

nb_status nb_graph_verify(const nb_graph *g) {
  if (g->err) return g->err;
  char *defined = calloc(g->nvals + 1, 1);
  if (!defined) return nb_errorf(g->ctx, NB_ERR_NOMEM, "out of memory");
  nb_status st = NB_OK;
  for (size_t i = 0; i < g->nin; i++) defined[g->inputs[i].val->id] = 1;
  for (size_t k = 0; k < g->neqns && st == NB_OK; k++) {
    const nb_eqn *e = g->eqns[k];
    const nb_prim_rules *r = nb__rules(e->prim);
    nb_aval in[64], out[MAX_OUTS];
    int no = 0;
    char why[512] = "";
    for (int i = 0; i < e->nin && st == NB_OK; i++) {
      if (e->in[i]->g != g || !defined[e->in[i]->id])
        st = nb_errorf(g->ctx, NB_ERR_INTERNAL, "verify: eqn %zu (%s) uses value %u before its definition", k, r->name,
                       e->in[i]->id);
      else if (i < 64) in[i] = e->in[i]->aval;
    }
    if (st != NB_OK) break;
    if (e->nin <= 64) {
      if (r->infer(e->params, e->nin, in, &no, out, why, sizeof why) != NB_OK || no != e->nout)
        st = nb_errorf(g->ctx, NB_ERR_INTERNAL, "verify: eqn %zu (%s) fails its shape rule: %s", k, r->name, why);
      for (int i = 0; i < no && st == NB_OK; i++)
        if (!nb_aval_equal(&out[i], &e->out[i]->aval))
          st = nb_errorf(g->ctx, NB_ERR_INTERNAL, "verify: eqn %zu (%s) output %d has the wrong aval", k, r->name, i);
    }
    for (int i = 0; i < e->nout; i++) defined[e->out[i]->id] = 1;
  }
  for (size_t i = 0; i < g->nout && st == NB_OK; i++)
    if (!defined[g->outputs[i].val->id])
      st = nb_errorf(g->ctx, NB_ERR_INTERNAL, "verify: output '%s' is undefined", g->outputs[i].path);
  free(defined);
  return st;
}

nb_graph *nb__checked(nb_graph *g) {
#ifndef NDEBUG
  if (g && nb_graph_verify(g) != NB_OK) {
    nb_graph_destroy(g);
    return NULL;
  }
#endif
  return g;
}

static double aval_bytes(const nb_aval *a) { return (double)nb_shape_size(&a->shape) * (double)nb_dtype_size(a->dtype); }

void nb_graph_cost(const nb_graph *g, double *flops, double *bytes) {
  double f = 0, b = 0;
  for (size_t k = 0; k < g->neqns; k++) {
    const nb_eqn *e = g->eqns[k];
    const nb_prim_rules *r = nb__rules(e->prim);
    double ef = 0, eb = 0;
    if (r->cost) {
      r->cost(e, &ef, &eb);
    } else {
      for (int i = 0; i < e->nin; i++) eb += aval_bytes(&e->in[i]->aval);
      for (int i = 0; i < e->nout; i++) {
        eb += aval_bytes(&e->out[i]->aval);
        if (r->kind == NB_KIND_ELEMENTWISE || r->kind == NB_KIND_REDUCE)
          ef += (double)nb_shape_size(&(r->kind == NB_KIND_REDUCE ? e->in[0] : e->out[i])->aval.shape);
      }
    }
    f += ef;
    b += eb;
  }
  if (flops) *flops = f;
  if (bytes) *bytes = b;
}

/* ---------------------------------------------------------------- dead code */

nb_graph *nb__graph_dce(const nb_graph *g) {
  nb_graph *d = nb_graph_create(g->ctx);
  bool *live = nb_calloc(g->ctx, g->nvals + 1);
  nb_val **map = nb_calloc(g->ctx, (g->nvals + 1) * sizeof(nb_val *));
  if (!d || !live || !map) goto fail;
  for (size_t i = 0; i < g->nout; i++) live[g->outputs[i].val->id] = true;
  for (size_t k = g->neqns; k-- > 0;) {
    const nb_eqn *e = g->eqns[k];
    bool used = false;
    for (int i = 0; i < e->nout; i++) used = used || live[e->out[i]->id];
    for (int i = 0; used && i < e->nin; i++) live[e->in[i]->id] = true;
  }
  for (size_t i = 0; i < g->nin; i++) map[g->inputs[i].val->id] = nb__graph_add_input(d, g->inputs[i].path, g->inputs[i].val->aval);
  nb_val *small[64], *outs[MAX_OUTS];
  for (size_t k = 0; k < g->neqns && !d->err; k++) {
    const nb_eqn *e = g->eqns[k];
    bool used = false;
    for (int i = 0; i < e->nout; i++) used = used || live[e->out[i]->id];
    if (!used) continue;
    nb_val **in = e->nin <= 64 ? small : nb_alloc(g->ctx, (size_t)e->nin * sizeof(nb_val *));
    if (!in) goto fail;
    for (int i = 0; i < e->nin; i++) in[i] = map[e->in[i]->id];
    nb__emit(d, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
    if (in != small) nb_dealloc(g->ctx, in, (size_t)e->nin * sizeof(nb_val *));
    for (int i = 0; !d->err && i < e->nout; i++) map[e->out[i]->id] = outs[i];
  }
  for (size_t i = 0; i < g->nout && !d->err; i++) nb__graph_add_output(d, g->outputs[i].path, map[g->outputs[i].val->id]);
  if (d->err) goto fail;
  nb_dealloc(g->ctx, live, g->nvals + 1);
  nb_dealloc(g->ctx, map, (g->nvals + 1) * sizeof(nb_val *));
  return d;
fail:
  if (nb_ctx_status(g->ctx) == NB_OK) nb_errorf(g->ctx, NB_ERR_NOMEM, "out of memory removing dead code");
  nb_dealloc(g->ctx, live, g->nvals + 1);
  nb_dealloc(g->ctx, map, (g->nvals + 1) * sizeof(nb_val *));
  nb_graph_destroy(d);
  return NULL;
}
