/* The interpreter as a backend: a second, trivial implementation of
 * backend/backend.h that the tests run plans on, so that the interface
 * cannot quietly take the CPU backend's shape. Its device memory is host
 * memory it allocates and keeps track of, but it says that it is not host
 * memory: the runtime must copy inputs in and outputs out and stage the
 * operands of reference steps, as for a GPU, and every pointer a step or
 * a device copy is given is checked to lie in memory this backend allocated
 * (counted in foreign_pointers; a loop's carry moves by device copies). A kernel is "compiled" to nothing: launching it
 * evaluates, with their reference rules, the fused equations behind each of
 * its roots, reading only the kernel's arguments, and stores the roots once
 * all are computed (as the generated C does). Every contraction with a gemm
 * rule, integer ones included (the CPU backend takes floating ones only),
 * is a library call that dot_general's reference rule runs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/interp/interp.h"

/* ---------------------------------------------------------------- counters */

static _Atomic uint64_t n_compiles, n_launches, n_library_calls, n_library_asked, n_allocs, n_frees, n_to_device,
    n_to_host, n_host_reads, n_copies, n_copied, n_foreign;

void nb_interp__counters(nb_interp_counters *out) {
  *out = (nb_interp_counters){atomic_load(&n_compiles),  atomic_load(&n_launches),   atomic_load(&n_library_calls),
                              atomic_load(&n_library_asked), atomic_load(&n_allocs), atomic_load(&n_frees),
                              atomic_load(&n_to_device), atomic_load(&n_to_host),    atomic_load(&n_host_reads),
                              atomic_load(&n_copies),    atomic_load(&n_copied),     atomic_load(&n_foreign)};
}

/* ---------------------------------------------------------------- memory */

typedef struct block {
  char *p;
  size_t n;
  struct block *next;
} block;

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static block *blocks;

static void *interp_alloc(nb_ctx *ctx, size_t bytes) {
  block *b = malloc(sizeof *b);
  char *p = malloc(bytes ? bytes : 1);
  if (!b || !p) {
    free(b), free(p);
    return nb_errorf(ctx, NB_ERR_NOMEM, "interp backend: out of memory for %zu bytes", bytes), NULL;
  }
  *b = (block){p, bytes, NULL};
  pthread_mutex_lock(&mem_mu);
  b->next = blocks;
  blocks = b;
  pthread_mutex_unlock(&mem_mu);
  atomic_fetch_add(&n_allocs, 1);
  return p;
}

static void interp_free(nb_ctx *ctx, void *p, size_t bytes) {
  (void)ctx, (void)bytes;
  if (!p) return;
  block *b = NULL;
  pthread_mutex_lock(&mem_mu);
  for (block **q = &blocks; *q; q = &(*q)->next)
    if ((*q)->p == p) {
      b = *q;
      *q = b->next;
      break;
    }
  pthread_mutex_unlock(&mem_mu);
  if (b) atomic_fetch_add(&n_frees, 1);
  else atomic_fetch_add(&n_foreign, 1);
  free(b);
  free(p);
}

/* Is [p, p + bytes) inside one of our blocks? (Nothing to check for no bytes.) */
static bool ours(const void *p, size_t bytes) {
  if (bytes == 0) return true;
  bool found = false;
  pthread_mutex_lock(&mem_mu);
  for (block *b = blocks; b && !found; b = b->next)
    found = (const char *)p >= b->p && (const char *)p + bytes <= b->p + b->n;
  pthread_mutex_unlock(&mem_mu);
  return found;
}

static nb_status check_ours(nb_ctx *ctx, const void *p, size_t bytes, const char *what) {
  if (ours(p, bytes)) return NB_OK;
  atomic_fetch_add(&n_foreign, 1);
  return nb_errorf(ctx, NB_ERR_INTERNAL, "interp backend: %s %p (%zu bytes) is not device memory", what, p, bytes);
}

static nb_status interp_to_device(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  nb_status st = check_ours(ctx, dst, bytes, "copy destination");
  if (st == NB_OK && bytes) memcpy(dst, src, bytes);
  atomic_fetch_add(&n_to_device, bytes);
  return st;
}

static nb_status interp_to_host(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  nb_status st = check_ours(ctx, src, bytes, "copy source");
  if (st == NB_OK && bytes) memcpy(dst, src, bytes);
  atomic_fetch_add(&n_to_host, bytes);
  atomic_fetch_add(&n_host_reads, 1);
  return st;
}

/* Both ranges ours, and equal or disjoint (the interface's contract). */
static nb_status interp_copy(nb_ctx *ctx, void *dst, const void *src, size_t bytes) {
  nb_status st = check_ours(ctx, src, bytes, "copy source");
  if (st == NB_OK) st = check_ours(ctx, dst, bytes, "copy destination");
  const char *d = dst, *s = src;
  if (st == NB_OK && d != s && d < s + bytes && s < d + bytes)
    st = nb_errorf(ctx, NB_ERR_INTERNAL, "interp backend: device copy from %p to %p (%zu bytes) overlaps", src, dst, bytes);
  if (st == NB_OK && bytes && d != s) memcpy(dst, src, bytes);
  atomic_fetch_add(&n_copies, 1);
  atomic_fetch_add(&n_copied, bytes);
  return st;
}

/* ---------------------------------------------------------------- compiling */

struct nb_backend_module {
  const nb_jplan *plan;
  const nb_val **vals; /* by id */
};

static bool interp_library_supported(const nb_eqn *e) {
  atomic_fetch_add(&n_library_asked, 1);
  return nb__rules(e->prim)->gemm && e->nin == 2 && e->nout == 1;
}

static nb_status interp_compile(nb_ctx *ctx, const nb_jit_config *cfg, const nb_jplan *plan, nb_backend_module **out,
                                nb_backend_build *b) {
  (void)cfg, (void)b;
  *out = NULL;
  nb_backend_module *m = calloc(1, sizeof *m);
  const nb_val **vals = calloc(plan->nvals + 1, sizeof *vals);
  if (!m || !vals) {
    free(m), free(vals);
    return nb_errorf(ctx, NB_ERR_NOMEM, "interp backend: out of memory");
  }
  for (size_t i = 0; i < nb_graph_num_inputs(plan->g); i++) vals[nb__graph_input(plan->g, i)->id] = nb__graph_input(plan->g, i);
  for (size_t k = 0; k < nb__graph_neqns(plan->g); k++) {
    const nb_eqn *e = nb__graph_eqn(plan->g, k);
    for (int i = 0; i < e->nout; i++) vals[e->out[i]->id] = e->out[i];
  }
  m->plan = plan;
  m->vals = vals;
  atomic_fetch_add(&n_compiles, 1);
  *out = m;
  return NB_OK;
}

static void interp_release(nb_backend_module *m) {
  if (!m) return;
  free(m->vals);
  free(m);
}

/* ---------------------------------------------------------------- running */

static void noop_release(void *ud) { (void)ud; }

static size_t val_bytes(const nb_val *v) { return (size_t)nb_shape_size(&v->aval.shape) * nb_dtype_size(v->aval.dtype); }

static nb_array *wrap(nb_ctx *ctx, const nb_val *v, const void *p) {
  return nb_array_wrap(ctx, v->aval.dtype, v->aval.shape.rank, v->aval.shape.dims, p, noop_release, NULL);
}

/* v's value inside a kernel: an argument it reads, or computed from the
 * equation that defines it (memoized in have[]). */
static nb_array *value(nb_ctx *ctx, const nb_val *v, nb_array **have) {
  if (have[v->id]) return have[v->id];
  const nb_eqn *q = v->def;
  if (!q || q->nout != 1 || q->nin > 3)
    return nb_errorf(ctx, NB_ERR_INTERNAL, "interp backend: a kernel needs value %u, which is neither its argument nor fusable",
                     v->id), NULL;
  nb_array *in[3] = {NULL, NULL, NULL};
  for (int i = 0; i < q->nin; i++)
    if (!(in[i] = value(ctx, q->in[i], have))) return NULL;
  nb_array *out = nb_array_empty(ctx, v->aval.dtype, v->aval.shape.rank, v->aval.shape.dims);
  if (!out) return NULL;
  nb_status st = nb__rules(q->prim)->eval(ctx, q, in, &out);
  if (st != NB_OK) {
    if (nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "interp backend: %s failed", nb__rules(q->prim)->name);
    nb_array_release(out);
    return NULL;
  }
  return have[v->id] = out;
}

static nb_status interp_launch(nb_ctx *ctx, nb_backend_module *m, int kernel, char *const *args) {
  atomic_fetch_add(&n_launches, 1);
  const nb_kernel *k = &m->plan->kernels[kernel];
  nb_array **have = calloc(m->plan->nvals + 1, sizeof *have);
  if (!have) return nb_errorf(ctx, NB_ERR_NOMEM, "interp backend: out of memory");
  nb_status st = NB_OK;
  for (int a = 0; a < k->nargs && st == NB_OK; a++) {
    const nb_val *v = m->vals[k->args[a]];
    st = check_ours(ctx, args[a], val_bytes(v), "kernel argument");
    if (st == NB_OK && !k->arg_written[a] && !(have[v->id] = wrap(ctx, v, args[a]))) st = NB_ERR_NOMEM;
  }
  /* every root before any store: a root may be written over an argument another one reads */
  for (int r = 0; r < k->nroots && st == NB_OK; r++)
    if (!value(ctx, m->vals[k->roots[r]], have)) st = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  for (int a = 0; a < k->nargs && st == NB_OK; a++)
    if (k->arg_written[a]) {
      const nb_array *x = have[k->args[a]];
      if (!x) st = nb_errorf(ctx, NB_ERR_INTERNAL, "interp backend: kernel %d writes %%v%u, which is not its root", kernel, k->args[a]);
      else if (nb_array_nbytes(x)) memcpy(args[a], nb_array_data(x), nb_array_nbytes(x));
    }
  for (size_t i = 0; i < m->plan->nvals; i++) nb_array_release(have[i]);
  free(have);
  return st;
}

static nb_status interp_library(nb_ctx *ctx, nb_backend_module *m, const nb_eqn *e, char *const *args) {
  (void)m;
  atomic_fetch_add(&n_library_calls, 1);
  nb_array *arr[3] = {NULL, NULL, NULL};
  nb_status st = NB_OK;
  for (int i = 0; i < 3 && st == NB_OK; i++) {
    const nb_val *v = i < 2 ? e->in[i] : e->out[0];
    st = check_ours(ctx, args[i], val_bytes(v), "library operand");
    if (st == NB_OK && !(arr[i] = wrap(ctx, v, args[i]))) st = NB_ERR_NOMEM;
  }
  if (st == NB_OK) st = nb__rules(e->prim)->eval(ctx, e, arr, arr + 2);
  for (int i = 0; i < 3; i++) nb_array_release(arr[i]);
  return st;
}

static nb_status interp_synchronize(nb_ctx *ctx, nb_backend_module *m) {
  (void)ctx, (void)m;
  return NB_OK;
}

const nb_backend nb_interp__backend = {
    .name = "interp",
    .host_memory = false,
    .alloc = interp_alloc,
    .free = interp_free,
    .to_device = interp_to_device,
    .to_host = interp_to_host,
    .copy = interp_copy,
    .library_supported = interp_library_supported,
    .compile = interp_compile,
    .release = interp_release,
    .launch = interp_launch,
    .library = interp_library,
    .synchronize = interp_synchronize,
};
