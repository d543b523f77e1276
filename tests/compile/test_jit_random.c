/* Randomized differential test of nb_jit against the interpreter: random
 * well-typed graphs over the elementwise, select, convert, broadcast,
 * reshape, transpose, iota and reduction primitives (fixed seeds), their
 * gradients (nb_grad) and their vmaps, with all optimizations on and all
 * off, and with each input donated in turn (outputs may be written into
 * it) and all at once; then graphs from fresh seeds for a few seconds. Many graphs are
 * inlined into one graph per jit so that one shared object holds all
 * their kernels (the test stays fast and the disk cache keeps reruns
 * cheap). A failure names the seed; NABLA_JIT_SEED=<n> replays one graph. */
#include <time.h>

#include "jitcheck.h"

static nb_ctx *ctx;

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct gen {
  nb_test_rng rng;
  nb_graph *g;
  nb_val *pool[64];
  int npool, ninputs;
  bool floats_only;
} gen;

static int pick(gen *r, int n) { return (int)nb_test_int(&r->rng, 0, n - 1); }

static nb_val *add_input(gen *r, nb_dtype t, int rank, const int64_t *dims) {
  char name[32];
  snprintf(name, sizeof name, "in%d", r->ninputs++);
  return nb_graph_input(r->g, name, nb_aval_make(t, rank, dims));
}

static void push(gen *r, nb_val *v) {
  if (r->npool < 64) r->pool[r->npool++] = v;
  else r->pool[pick(r, 64)] = v;
}

static nb_val *random_val(gen *r, bool want_float) {
  for (int tries = 0; tries < 16; tries++) {
    nb_val *v = r->pool[pick(r, r->npool)];
    if (!want_float || nb_dtype_is_float(nb_val_dtype(v))) return v;
  }
  return r->pool[0];
}

/* A value that broadcasts against x (NumPy rules) with x's dtype. */
static nb_val *partner(gen *r, nb_val *x) {
  for (int tries = 0; tries < 8; tries++) {
    nb_val *v = r->pool[pick(r, r->npool)];
    if (nb_val_dtype(v) != nb_val_dtype(x) || nb_val_rank(v) > nb_val_rank(x)) continue;
    bool ok = true;
    for (int i = 1; i <= nb_val_rank(v); i++) {
      int64_t a = nb_val_dim(v, -i), b = nb_val_dim(x, -i);
      ok &= a == b || a == 1;
    }
    if (ok) return v;
  }
  int rank = nb_val_rank(x) - pick(r, nb_val_rank(x) + 1);
  int64_t dims[NB_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    dims[i] = nb_val_dim(x, nb_val_rank(x) - rank + i);
    if (pick(r, 3) == 0) dims[i] = 1;
  }
  if (pick(r, 4) == 0) return nb_full(r->g, nb_val_dtype(x), rank, dims, 0.5 + pick(r, 3));
  return add_input(r, nb_val_dtype(x), rank, dims);
}

static nb_val *unary(gen *r, nb_val *x) {
  nb_graph *g = r->g;
  if (!nb_dtype_is_float(nb_val_dtype(x))) return nb_neg(x);
  nb_val *one = nb_full_like(x, 1);
  switch (pick(r, 11)) {
  case 0: return nb_neg(x);
  case 1: return nb_abs(x);
  case 2: return nb_tanh(x);
  case 3: return nb_sin(x);
  case 4: return nb_cos(x);
  case 5: return nb_logistic(x);
  case 6: return nb_exp(nb_tanh(x));
  case 7: return nb_sqrt(nb_add(nb_abs(x), one));
  case 8: return nb_log(nb_add(nb_abs(x), one));
  case 9: return nb_mul(x, nb_scalar(g, nb_val_dtype(x), 0.75));
  default: return nb_rsqrt(nb_add(nb_mul(x, x), one));
  }
}

static nb_val *binary(gen *r, nb_val *x) {
  nb_val *y = partner(r, x);
  bool fl = nb_dtype_is_float(nb_val_dtype(x));
  switch (pick(r, fl ? 7 : 5)) {
  case 0: return nb_add(x, y);
  case 1: return nb_sub(x, y);
  case 2: return nb_mul(x, y);
  case 3: return nb_max(x, y);
  case 4: return nb_min(x, y);
  case 5: return nb_div(x, nb_add(nb_abs(y), nb_full_like(y, 0.5)));
  default: {
    int64_t dims[NB_MAX_RANK];
    for (int i = 0; i < nb_val_rank(x); i++) dims[i] = nb_val_dim(x, i);
    return nb_select(nb_gt(x, nb_broadcast_to(y, nb_val_rank(x), dims)), x, nb_neg(x));
  }
  }
}

static nb_val *layout(gen *r, nb_val *x) {
  int rank = nb_val_rank(x);
  int64_t dims[NB_MAX_RANK] = {0};
  for (int i = 0; i < rank; i++) dims[i] = nb_val_dim(x, i);
  int choice = pick(r, 4);
  if (choice == 0 && rank < 4) { /* broadcast: a new dim */
    int at = pick(r, rank + 1), bd[NB_MAX_RANK];
    int64_t nd[NB_MAX_RANK];
    for (int i = 0, k = 0; i <= rank; i++) {
      if (i == at) nd[i] = 1 + pick(r, 4);
      else bd[k] = i, nd[i] = dims[k], k++;
    }
    return nb_broadcast_in_dim(x, rank + 1, nd, bd);
  }
  if (choice == 1 && rank >= 2) { /* transpose */
    int perm[NB_MAX_RANK];
    for (int i = 0; i < rank; i++) perm[i] = i;
    for (int i = rank - 1; i > 0; i--) {
      int j = pick(r, i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    return nb_transpose(x, perm);
  }
  if (choice == 2 && rank >= 2) { /* merge two adjacent dims */
    int at = pick(r, rank - 1);
    int64_t nd[NB_MAX_RANK];
    for (int i = 0, k = 0; i < rank; i++) {
      if (i == at + 1) continue;
      nd[k++] = i == at ? dims[i] * dims[i + 1] : dims[i];
    }
    return nb_reshape(x, rank - 1, nd);
  }
  if (rank >= 1 && rank < 4) { /* split a dim with a factor, or flatten */
    int at = pick(r, rank);
    for (int64_t f = 2; f <= dims[at]; f++)
      if (dims[at] % f == 0) {
        int64_t nd[NB_MAX_RANK];
        for (int i = 0, k = 0; i < rank; i++) {
          if (i == at) nd[k++] = f, nd[k++] = dims[i] / f;
          else nd[k++] = dims[i];
        }
        return nb_reshape(x, rank + 1, nd);
      }
    int64_t n = nb_shape_size(&(nb_shape){rank, {dims[0], rank > 1 ? dims[1] : 1, rank > 2 ? dims[2] : 1}});
    return nb_reshape(x, 1, &n);
  }
  return x;
}

static nb_val *reduction(gen *r, nb_val *x) {
  int rank = nb_val_rank(x), axes[NB_MAX_RANK], n = 0;
  if (rank == 0) return x;
  for (int i = 0; i < rank; i++)
    if (pick(r, 2)) axes[n++] = i;
  if (n == 0) axes[n++] = pick(r, rank);
  nb_val *y;
  switch (pick(r, 3)) {
  case 0: y = nb_reduce_max(x, n, axes); break;
  case 1: y = nb_reduce_min(x, n, axes); break;
  default: y = nb_reduce_sum(x, n, axes); break;
  }
  if (pick(r, 2)) return y;
  /* broadcast back and combined with x, as a softmax's row max and sum are:
   * row kernels that read x again after their reductions */
  int kept[NB_MAX_RANK], nk = 0;
  int64_t dims[NB_MAX_RANK];
  for (int i = 0, a = 0; i < rank; i++) {
    dims[i] = nb_val_dim(x, i);
    if (a < n && axes[a] == i) a++;
    else kept[nk++] = i;
  }
  nb_val *b = nb_broadcast_in_dim(y, rank, dims, kept);
  return pick(r, 2) ? nb_sub(x, b) : nb_mul(x, b);
}

static nb_val *misc(gen *r, nb_val *x) {
  nb_dtype t = nb_val_dtype(x);
  int rank = nb_val_rank(x);
  int64_t dims[NB_MAX_RANK];
  for (int i = 0; i < rank; i++) dims[i] = nb_val_dim(x, i);
  switch (pick(r, 4)) {
  case 0: /* convert round trip through another dtype */
    if (nb_dtype_is_float(t)) return nb_convert(nb_convert(x, t == NB_F32 ? NB_F64 : NB_F32), t);
    return nb_convert(x, NB_F32);
  case 1:
    if (rank == 0) return x;
    return nb_add(x, nb_convert(nb_iota(r->g, NB_I32, rank, dims, pick(r, rank)), t));
  case 2:
    if (!nb_dtype_is_float(t)) return x;
    return nb_clamp(nb_scalar(r->g, t, -0.5), x, nb_scalar(r->g, t, 0.8));
  default:
    if (r->floats_only || !nb_dtype_is_float(t)) return unary(r, x);
    return nb_convert(nb_mul(x, nb_full_like(x, 10)), NB_I32); /* an integer branch */
  }
}

/* A random graph: 1-2 float inputs, 4-13 operations, 1-3 outputs. */
static nb_graph *random_graph(uint64_t seed, bool floats_only) {
  gen r;
  memset(&r, 0, sizeof r);
  r.rng.s = seed * 0x9e3779b97f4a7c15ull + 1;
  r.floats_only = floats_only;
  r.g = nb_graph_create(ctx);
  nb_dtype t = pick(&r, 3) ? NB_F32 : NB_F64;
  int ninp = 1 + pick(&r, 2);
  for (int i = 0; i < ninp; i++) {
    int rank = pick(&r, 4);
    int64_t dims[NB_MAX_RANK];
    for (int d = 0; d < rank; d++) dims[d] = 1 + pick(&r, 5);
    push(&r, add_input(&r, t, rank, dims));
  }
  int nops = 4 + pick(&r, 10);
  for (int k = 0; k < nops && !nb_graph_status(r.g); k++) {
    nb_val *x = random_val(&r, floats_only), *y;
    switch (pick(&r, 6)) {
    case 0: y = unary(&r, x); break;
    case 1: case 2: y = binary(&r, x); break;
    case 3: y = layout(&r, x); break;
    case 4: y = reduction(&r, x); break;
    default: y = misc(&r, x); break;
    }
    push(&r, y);
  }
  int nout = 1 + pick(&r, 3);
  nb_graph_output(r.g, "out0", r.pool[r.npool - 1]);
  for (int i = 1; i < nout; i++) {
    char name[16];
    snprintf(name, sizeof name, "out%d", i);
    nb_graph_output(r.g, name, random_val(&r, floats_only));
  }
  if (nb_graph_status(r.g)) {
    fprintf(stderr, "seed %llu: generator made a bad graph: %s\n", (unsigned long long)seed, nb_graph_error(r.g));
    nb_graph_destroy(r.g);
    return NULL;
  }
  return r.g;
}

/* loss = sum of all float outputs, for nb_grad */
static nb_graph *with_loss(const nb_graph *g) {
  nb_graph *l = nb_graph_create(ctx);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_graph_num_inputs(g); i++) {
    nb_tree *spec = nb_graph_input_spec(g);
    nb_val *v = nb_graph_input(l, nb_graph_input_path(g, i), nb_leaf_get_aval(nb_tree_leaf(spec, i)));
    nb_tree_set_val(in, nb_graph_input_path(g, i), v);
    nb_tree_destroy(spec);
  }
  nb_graph_call(l, g, in, out);
  nb_val *loss = nb_scalar(l, NB_F64, 0);
  for (size_t i = 0; i < nb_tree_size(out); i++) {
    nb_val *v = nb_tree_leaf(out, i)->val;
    if (nb_dtype_is_float(nb_val_dtype(v))) loss = nb_add(loss, nb_reduce_sum(nb_convert(v, NB_F64), 0, NULL));
  }
  nb_graph_output(l, "loss", loss);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_grad_opts o = {NULL, false};
  nb_graph *d = nb_grad(ctx, l, &o);
  nb_graph_destroy(l);
  return d;
}

/* Inlines graphs[i] into one graph under "g<i>/" input and output paths. */
static nb_graph *combine(nb_graph **graphs, int n) {
  nb_graph *c = nb_graph_create(ctx);
  for (int k = 0; k < n; k++) {
    if (!graphs[k]) continue;
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_tree *spec = nb_graph_input_spec(graphs[k]);
    for (size_t i = 0; i < nb_tree_size(spec); i++) {
      char path[256];
      snprintf(path, sizeof path, "g%d/%s", k, nb_tree_path(spec, i));
      nb_tree_set_val(in, nb_tree_path(spec, i), nb_graph_input(c, path, nb_leaf_get_aval(nb_tree_leaf(spec, i))));
    }
    nb_graph_call(c, graphs[k], in, out);
    for (size_t i = 0; i < nb_tree_size(out); i++) {
      char path[256];
      snprintf(path, sizeof path, "g%d/%s", k, nb_tree_path(out, i));
      nb_graph_output(c, path, nb_tree_leaf(out, i)->val);
    }
    nb_tree_destroy(spec);
    nb_tree_destroy(in);
    nb_tree_destroy(out);
  }
  return c;
}

static nb_tree *random_inputs(const nb_graph *g, uint64_t seed) {
  nb_test_rng rng = {seed + 77};
  nb_tree *in = nb_tree_create(ctx), *spec = nb_graph_input_spec(g);
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    nb_aval a = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    nb_array *x = nb_test_randn(ctx, &rng, a.dtype, a.shape.rank, a.shape.dims);
    nb_tree_set_array(in, nb_tree_path(spec, i), x);
    nb_array_release(x);
  }
  nb_tree_destroy(spec);
  return in;
}

typedef enum { PLAIN, GRAD, VMAP } variant;

static nb_graph *make_variant(uint64_t seed, variant v) {
  nb_graph *g = random_graph(seed, v == GRAD);
  if (!g || v == PLAIN) return g;
  nb_graph *t = NULL;
  if (v == GRAD) {
    t = with_loss(g);
  } else {
    nb_vmap_opts o = {0, 0, NULL, NULL, 3};
    t = nb_vmap(ctx, g, &o);
  }
  if (!t) fprintf(stderr, "seed %llu: transformation failed: %s\n", (unsigned long long)seed, nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  nb_graph_destroy(g);
  return t;
}

/* Which inputs a run donates: none, every input, or input "in<k>" of every
 * graph (each input in turn: the planner gives it to the first output that
 * may take it). */
enum { DONATE_NONE = -1, DONATE_ALL = -2 };

/* The NULL-terminated donate list of a combined graph of n graphs. */
static const char **donate_list(nb_graph **gs, int n, int donate) {
  if (donate == DONATE_NONE) return NULL;
  const char **list = calloc((size_t)n + 2, sizeof *list);
  int m = 0;
  for (int k = 0; k < n; k++)
    if (gs[k] && (donate == DONATE_ALL || (size_t)donate < nb_graph_num_inputs(gs[k]))) {
      char *path = malloc(32);
      if (donate == DONATE_ALL) snprintf(path, 32, "g%d", k);
      else snprintf(path, 32, "g%d/in%d", k, donate);
      list[m++] = path;
    }
  return list;
}

static void free_donate_list(const char **list) {
  for (int i = 0; list && list[i]; i++) free((char *)list[i]);
  free(list);
}

static bool run_one(nb_graph **gs, nb_graph *c, int n, uint64_t first, variant v, const char *disable, const char *cc, int donate) {
  nb_tree *in = random_inputs(c, first);
  nb_jit_opts o = nb_test_jit_opts(disable);
  o.cc = cc;
  const char **list = donate_list(gs, n, donate);
  o.donate = list;
  char what[160], dn[32] = "";
  if (donate == DONATE_ALL) snprintf(dn, sizeof dn, ", all donated");
  else if (donate >= 0) snprintf(dn, sizeof dn, ", in%d donated", donate);
  snprintf(what, sizeof what, "seeds %llu..%llu %s [off: %s]%s", (unsigned long long)first, (unsigned long long)(first + (uint64_t)n - 1),
           v == PLAIN ? "plain" : v == GRAD ? "grad" : "vmap", disable ? disable : "none", dn);
  /* the interpreter runs first; the jit then may overwrite donated inputs */
  bool ok = nb_graph_status(c) == NB_OK && nb_test_jit_matches(ctx, c, in, &o, what, NULL);
  if (!ok && nb_graph_status(c)) fprintf(stderr, "%s: combined graph failed: %s\n", what, nb_graph_error(c));
  free_donate_list(list);
  nb_tree_destroy(in);
  return ok;
}

/* Seeds [first, first+n) of one variant in one executable: with
 * `disable` and nothing donated, then (donations) each input donated in
 * turn and all of them at once. */
static bool run_batch(uint64_t first, int n, variant v, const char *disable, const char *cc, bool donations) {
  nb_graph **gs = calloc((size_t)n, sizeof *gs);
  for (int i = 0; i < n; i++) gs[i] = make_variant(first + (uint64_t)i, v);
  nb_graph *c = combine(gs, n);
  int most = 0;
  for (int i = 0; i < n; i++)
    if (gs[i] && (int)nb_graph_num_inputs(gs[i]) > most) most = (int)nb_graph_num_inputs(gs[i]);
  bool ok = run_one(gs, c, n, first, v, disable, cc, DONATE_NONE);
  for (int d = DONATE_ALL; donations && d < most; d++)
    if (d != DONATE_NONE) ok &= run_one(gs, c, n, first, v, disable, cc, d);
  if (!ok && getenv("NABLA_TEST_VERBOSE"))
    for (int i = 0; i < n; i++)
      if (gs[i]) {
        fprintf(stderr, "--- seed %llu\n", (unsigned long long)(first + (uint64_t)i));
        nb_graph_print(gs[i], stderr);
      }
  for (int i = 0; i < n; i++) nb_graph_destroy(gs[i]);
  free(gs);
  nb_graph_destroy(c);
  return ok;
}

int main(void) {
  ctx = nb_ctx_create();
  const char *one = getenv("NABLA_JIT_SEED");
  if (one) {
    uint64_t s = strtoull(one, NULL, 10);
    for (int v = 0; v < 3; v++) {
      CHECK(run_batch(s, 1, (variant)v, NULL, NULL, true));
      CHECK(run_batch(s, 1, (variant)v, "all", NULL, false));
    }
    nb_ctx_destroy(ctx);
    return nb_test_summary("compile/test_jit_random");
  }
  /* fixed seeds: 300 plain graphs, 100 gradients, 100 vmaps, each set with
   * everything on and with everything off; compiled without optimization
   * (these shared objects are large), the fresh seeds below with the
   * default command */
  const char *quick = getenv("NABLA_CC") ? NULL : "cc -O0 -fPIC -shared";
  for (int v = 0; v < 3; v++) {
    int n = v == PLAIN ? 300 : 100;
    CHECK_MSG(run_batch(1000u * (unsigned)(v + 1), n, (variant)v, NULL, quick, true), "variant %d", v);
    CHECK_MSG(run_batch(1000u * (unsigned)(v + 1), n, (variant)v, "all", quick, false), "variant %d, all off", v);
  }
  /* fresh seeds for a few seconds */
  uint64_t base = (uint64_t)time(NULL) * 1000003u;
  double budget = getenv("NABLA_SANITIZED") ? 1.0 : 3.0, start = wall();
  int batches = 0;
  while (wall() - start < budget || batches == 0) {
    uint64_t first = base + (uint64_t)batches * 10;
    bool ok = run_batch(first, 10, (variant)(batches % 3), NULL, NULL, true);
    CHECK_MSG(ok, "fresh seeds from %llu (replay one with NABLA_JIT_SEED=<seed>)", (unsigned long long)first);
    batches++;
  }
  printf("test_jit_random: %d fresh batches of 10 graphs\n", batches);
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_random");
}
