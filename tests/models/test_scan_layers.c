/* scan_layers: the layers traced as scans over stacked parameters give the
 * unrolled model's loss, metrics and gradients (per-layer parameter paths,
 * so the same trees either way), on the interpreter and through nb_jit, for
 * GPT-2, Llama and DeepSeek (dense first layer, then a scan over the MoE
 * layers), with and without remat (whose forward scans store less); the scanned graph holds one scan per run
 * of equal blocks and its size does not grow with depth. (The YAML key:
 * tests/train/test_config.c.) */
#include "core/ir.h"
#include "core/prims/params.h"
#include "jitcheck.h"
#include "model_test_util.h"

static nb_ctx *ctx;

static nb_tree *batch_of(int64_t b, int64_t t, int seed) {
  nb_test_rng r = {(uint64_t)seed};
  int32_t v[2][256];
  for (int k = 0; k < 2; k++)
    for (int64_t i = 0; i < b * t; i++) v[k][i] = (int32_t)nb_test_int(&r, 0, 31);
  nb_tree *batch = nb_tree_create(ctx);
  int64_t d[2] = {b, t};
  nb_array *x = nb_array_create(ctx, NB_I32, 2, d, v[0]), *y = nb_array_create(ctx, NB_I32, 2, d, v[1]);
  nb_tree_set_array(batch, "inputs", x);
  nb_tree_set_array(batch, "targets", y);
  nb_array_release(x);
  nb_array_release(y);
  return batch;
}

static size_t count_prim(const nb_graph *g, const char *name) {
  size_t n = 0;
  for (size_t i = 0; i < nb_graph_num_eqns(g); i++) n += !strcmp(nb__rules(nb__graph_eqn(g, i)->prim)->name, name);
  return n;
}

/* value_and_grad of the loss */
static nb_graph *loss_graph(const nb_model_config *c, bool remat, const nb_tree *params, const nb_tree *batch) {
  nb_model_trace_opts o = {.remat = remat};
  nb_graph *g = nb_model_trace_loss(ctx, c, &o, params, batch);
  CHECK_MSG(g != NULL, "trace: %s", nb_ctx_error(ctx));
  if (!g) return NULL;
  nb_grad_opts go = {.wrt = "params", .has_aux = true};
  nb_graph *vg = nb_value_and_grad(ctx, g, &go);
  CHECK_MSG(vg != NULL, "value_and_grad: %s", nb_ctx_error(ctx));
  nb_graph_destroy(g);
  return vg;
}

/* What the forward scans of a value_and_grad graph store for the backward
 * pass: the elements of their outputs (final carries, ys and the stacked
 * residuals). */
static int64_t forward_scan_elems(const nb_graph *g) {
  int64_t n = 0;
  for (size_t i = 0; i < nb_graph_num_eqns(g); i++) {
    const nb_eqn *e = nb__graph_eqn(g, i);
    if (e->prim != NB_PRIM_scan || ((const nb_scan_params *)e->params)->reverse) continue;
    for (int o = 0; o < e->nout; o++) n += nb_shape_size(&e->out[o]->aval.shape);
  }
  return n;
}

static void compare(const nb_tree *want, const nb_tree *got, double tol, const char *what) {
  CHECK_MSG(nb_tree_size(want) == nb_tree_size(got), "%s: %zu vs %zu outputs", what, nb_tree_size(want), nb_tree_size(got));
  for (size_t i = 0; i < nb_tree_size(want); i++) {
    nb_array *a = nb_tree_get_array(got, nb_tree_path(want, i));
    double d = a ? nb_test_max_rel_diff(a, nb_tree_leaf(want, i)->array) : INFINITY;
    CHECK_MSG(d <= tol, "%s: %s differs by %g", what, nb_tree_path(want, i), d);
  }
}

static void test_same_as_unrolled(const char *preset, int64_t layers, bool remat) {
  nb_model_config c = tiny_config(preset, 16);
  c.n_layers = layers;
  c.z_loss_coef = 0.01;
  nb_array *key = nb_key(ctx, 3);
  nb_tree *params = nb_model_init(ctx, &c, key), *batch = batch_of(2, 6, 11);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  char what[128];
  snprintf(what, sizeof what, "%s, %lld layers%s", preset, (long long)layers, remat ? ", remat" : "");
  nb_graph *unrolled = loss_graph(&c, remat, params, batch);
  c.scan_layers = true;
  nb_graph *scanned = loss_graph(&c, remat, params, batch);
  if (unrolled && scanned) {
    /* one scan per run of two or more layers of one kind (dense, MoE), and
     * its transpose */
    int64_t dense = c.n_experts ? c.first_dense_layers : layers, moe = layers - dense;
    size_t scans = 2 * ((size_t)(dense >= 2) + (size_t)(moe >= 2));
    CHECK_MSG(count_prim(scanned, "scan") == scans, "%s: %zu scans, not %zu", what, count_prim(scanned, "scan"), scans);
    if (remat) { /* the scans store the blocks' inputs, not their insides */
      nb_graph *stored = loss_graph(&c, false, params, batch);
      int64_t with = forward_scan_elems(scanned), without = stored ? forward_scan_elems(stored) : 0;
      CHECK_MSG(with > 0 && with * 2 < without, "%s: the forward scans store %lld elements with remat, %lld without", what,
                (long long)with, (long long)without);
      if (getenv("NABLA_TEST_VERBOSE"))
        printf("%s: forward scans store %lld elements with remat, %lld without\n", what, (long long)with, (long long)without);
      nb_graph_destroy(stored);
    }
    nb_tree *want = nb_tree_create(ctx), *got = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_graph_run(ctx, unrolled, in, want));
    CHECK_OK(ctx, nb_graph_run(ctx, scanned, in, got));
    compare(want, got, 1e-5, what);
    /* through the compiler (against the unrolled model on the interpreter) */
    nb_jit_opts o = nb_test_jit_opts(NULL);
    nb_exe *e = nb_jit(ctx, scanned, &o);
    CHECK_MSG(e != NULL, "%s: nb_jit: %s", what, nb_ctx_error(ctx));
    nb_tree *jgot = nb_tree_create(ctx);
    if (e) CHECK_OK(ctx, nb_exe_run(e, in, jgot));
    char jwhat[160];
    snprintf(jwhat, sizeof jwhat, "%s (jit)", what);
    if (e) compare(want, jgot, 1e-4, jwhat);
    nb_exe_destroy(e);
    nb_tree_destroy(jgot);
    nb_tree_destroy(want);
    nb_tree_destroy(got);
  }
  nb_graph_destroy(unrolled);
  nb_graph_destroy(scanned);
  nb_tree_destroy(in);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_array_release(key);
}

/* The scanned graph's size does not depend on the depth. */
static void test_flat_in_depth(void) {
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    nb_model_config c = tiny_config("gpt2-tiny", 16);
    c.n_layers = i ? 12 : 3;
    c.scan_layers = true;
    nb_tree *spec = nb_model_param_spec(ctx, &c, NB_F32), *batch = batch_of(2, 6, 1);
    nb_graph *g = nb_model_trace_loss(ctx, &c, NULL, spec, batch);
    CHECK_MSG(g != NULL, "%s", nb_ctx_error(ctx));
    /* one reshape per parameter per layer and a concatenate per parameter stack them */
    n[i] = g ? nb_graph_num_eqns(g) - count_prim(g, "reshape") : 0;
    nb_graph_destroy(g);
    nb_tree_destroy(spec);
    nb_tree_destroy(batch);
  }
  CHECK_MSG(n[0] == n[1] && n[0] > 0, "equations other than the stacking reshapes: %zu at 3 layers, %zu at 12", n[0], n[1]);
}

/* The compiled train step of a scanned model needs about the memory of the
 * unrolled one (nb_exe_stats' peak estimate): the forward scan stacks what
 * the backward pass reads, the values the unrolled plan keeps too, not every
 * elementwise step and broadcast of the block (recomputed in the backward
 * scan, as the unrolled plan's fused kernels do). */
static void test_peak_near_unrolled(void) {
  size_t peak[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    nb_model_config c = tiny_config("gpt2-tiny", 64);
    c.d_model = 32;
    c.d_ff = 128;
    c.n_layers = 4;
    c.scan_layers = i == 1;
    nb_tree *spec = nb_model_param_spec(ctx, &c, NB_F32), *batch = batch_of(4, 64, 1);
    nb_graph *g = nb_model_trace_loss(ctx, &c, NULL, spec, batch);
    nb_grad_opts go = {.wrt = "params", .has_aux = true};
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &go) : NULL;
    nb_jit_opts o = nb_test_jit_opts(NULL);
    nb_exe *e = vg ? nb_jit(ctx, vg, &o) : NULL;
    CHECK_MSG(e != NULL, "%s", nb_ctx_error(ctx));
    nb_exe_stats s;
    nb_exe_get_stats(e, &s);
    peak[i] = s.peak_bytes;
    nb_exe_destroy(e);
    nb_graph_destroy(vg);
    nb_graph_destroy(g);
    nb_tree_destroy(spec);
    nb_tree_destroy(batch);
  }
  CHECK_MSG(peak[0] > 0 && peak[1] * 4 <= peak[0] * 5, "peak estimate %zu bytes scanned, %zu unrolled", peak[1], peak[0]);
  if (getenv("NABLA_TEST_VERBOSE")) printf("peak estimate %zu bytes scanned, %zu unrolled\n", peak[1], peak[0]);
}

int main(void) {
  ctx = nb_ctx_create();
  test_flat_in_depth();
  test_peak_near_unrolled();
  test_same_as_unrolled("gpt2-tiny", 3, false);
  test_same_as_unrolled("llama-tiny", 2, true);
  test_same_as_unrolled("deepseek-tiny", 3, false);
  nb_ctx_destroy(ctx);
  return nb_test_summary("scan_layers");
}
