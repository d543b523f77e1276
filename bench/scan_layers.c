/* Claim (issue 13): with scan_layers the cold compile of a 48-layer model is
 * within 1.5x of the 12-layer one, and the scanned step runs within 5% of
 * the unrolled step. For 12 and 48 layers, unrolled and scanned, prints the
 * median cold compile (nb_jit into an empty cache directory, so the C
 * compiler runs; trace and value_and_grad are timed apart) and the median
 * step time, then the ratios. The step is the training step's loss and
 * gradients (value_and_grad); where the core cannot differentiate a scan it
 * falls back to the loss alone and says so.
 *   ./build/bench_scan_layers [--preset gpt2-tiny] [--batch 4] [--seq 64] [--compiles 3] [--steps 7] [--threads N]
 *                             [--layers N (one depth, no ratios)]; BENCH_PROFILE=1: the last step's per-step profile
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"

typedef struct result {
  double trace_ms, compile_ms, step_ms;
} result;

static void rm_rf(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* One variant of one depth: its config, traced graph and executable. */
typedef struct variant {
  nb_model_config cfg;
  nb_graph *g;
  nb_exe *exe;
  double tt[16], ct[16], st[64];
} variant;

/* Traces (loss and gradients, or the loss alone) and compiles v into an
 * empty cache directory; the c-th timings. */
static int compile_cold(nb_ctx *ctx, variant *v, const nb_tree *params, const nb_tree *batch, bool loss_only, int threads, int c) {
  double t0 = now_ms();
  nb_graph *g = nb_model_trace_loss(ctx, &v->cfg, NULL, params, batch);
  nb_graph *vg = g && !loss_only ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : g;
  if (vg != g) nb_graph_destroy(g);
  v->tt[c] = now_ms() - t0;
  if (!vg) return fprintf(stderr, "trace: %s\n", nb_ctx_error(ctx)), 1;
  char dir[] = "/tmp/nabla-bench-scan-XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  nb_jit_opts o = {.cache_dir = dir, .threads = threads};
  nb_exe_destroy(v->exe);
  nb_graph_destroy(v->g);
  v->g = vg;
  t0 = now_ms();
  v->exe = nb_jit(ctx, vg, &o);
  v->ct[c] = now_ms() - t0;
  rm_rf(dir);
  if (!v->exe) return fprintf(stderr, "nb_jit: %s\n", nb_ctx_error(ctx)), 1;
  return 0;
}

static int run_step(nb_ctx *ctx, variant *v, const nb_tree *in, double *ms) {
  nb_tree *out = nb_tree_create(ctx);
  double t0 = now_ms();
  nb_status st = nb_exe_run(v->exe, in, out);
  *ms = now_ms() - t0;
  nb_tree_destroy(out);
  if (st != NB_OK) fprintf(stderr, "run: %s\n", nb_ctx_error(ctx));
  return st != NB_OK;
}

/* Unrolled (r[0]) and scanned (r[1]) at one depth, interleaved (compiles
 * and steps alternate between the two), so that the load of a shared
 * machine drifting over time weighs on both alike. */
static int measure(const char *preset, int64_t layers, bool loss_only, int64_t B, int64_t T, int compiles, int steps, int threads,
                   result *r) {
  nb_ctx *ctx = nb_ctx_create();
  variant v[2];
  memset(v, 0, sizeof v);
  for (int s = 0; s < 2; s++) {
    nb_model_config_preset(ctx, preset, &v[s].cfg);
    v[s].cfg.n_layers = layers;
    v[s].cfg.scan_layers = s;
  }
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &v[0].cfg, key), *batch = bench_lm_batch(ctx, B, T, v[0].cfg.vocab_size);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  int rc = 0;
  for (int c = 0; c < compiles && !rc; c++)
    for (int s = 0; s < 2 && !rc; s++) rc = compile_cold(ctx, &v[s], params, batch, loss_only, threads, c);
  double warm;
  for (int s = 0; s < 2 && !rc; s++) rc = run_step(ctx, &v[s], in, &warm);
  for (int i = 0; i < steps && !rc; i++)
    for (int s = 0; s < 2 && !rc; s++) rc = run_step(ctx, &v[s], in, &v[s].st[i]);
  for (int s = 0; s < 2; s++) {
    if (!rc && getenv("BENCH_PROFILE")) { /* the last step's per-step times, bodies indented, and what each body writes */
      nb_exe_print(v[s].exe, stderr);
      for (size_t i = 0; i < nb_exe_num_steps(v[s].exe); i++)
        for (size_t b = 0; nb_exe_step_body(v[s].exe, i, b); b++) {
          const nb_graph *bg = nb_exe_graph(nb_exe_step_body(v[s].exe, i, b));
          double bytes = 0;
          nb_tree *spec = nb_graph_output_spec(bg);
          for (size_t o = 0; spec && o < nb_tree_size(spec); o++) {
            nb_aval a = nb_leaf_get_aval(nb_tree_leaf(spec, o));
            bytes += (double)nb_shape_size(&a.shape) * (double)nb_dtype_size(a.dtype);
            fprintf(stderr, "  out %s %s\n", nb_tree_path(spec, o), nb_aval_str(&a, (char[96]){0}, 96));
          }
          nb_tree_destroy(spec);
          fprintf(stderr, "step %zu body %zu: %zu inputs, %zu outputs, %.3g bytes written per iteration\n", i, b,
                  nb_graph_num_inputs(bg), nb_graph_num_outputs(bg), bytes);
        }
    }
    if (!rc) r[s] = (result){median(v[s].tt, compiles), median(v[s].ct, compiles), median(v[s].st, steps)};
    nb_exe_destroy(v[s].exe);
    nb_graph_destroy(v[s].g);
  }
  nb_tree_destroy(in);
  nb_tree_destroy(batch);
  nb_tree_destroy(params);
  nb_array_release(key);
  nb_ctx_destroy(ctx);
  return rc;
}

int main(int argc, char **argv) {
  const char *preset = "gpt2-tiny";
  int64_t B = 4, T = 64;
  int compiles = 3, steps = 7, threads = 0;
  int64_t only_layers = 0; /* --layers N: that depth alone (both variants), no ratios */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!strcmp(argv[i], "--batch")) B = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--seq")) T = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--compiles")) compiles = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--layers")) only_layers = atoll(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (compiles < 1 || compiles > 16 || steps < 1 || steps > 64 || B < 1 || T < 1) {
    fprintf(stderr, "need 1 <= --compiles <= 16, 1 <= --steps <= 64, --batch and --seq >= 1\n");
    return 2;
  }
  /* can the core differentiate a scan? (otherwise every variant times the loss alone) */
  bool loss_only = false;
  {
    nb_ctx *ctx = nb_ctx_create();
    nb_model_config cfg;
    nb_model_config_preset(ctx, preset, &cfg);
    cfg.n_layers = 2;
    cfg.scan_layers = true;
    nb_tree *spec = nb_model_param_spec(ctx, &cfg, NB_F32), *batch = bench_lm_batch(ctx, 1, 4, cfg.vocab_size);
    nb_graph *g = nb_model_trace_loss(ctx, &cfg, NULL, spec, batch);
    nb_graph *v = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
    if (!g) {
      fprintf(stderr, "%s: %s\n", preset, nb_ctx_error(ctx));
      return 1;
    }
    if (!v) fprintf(stderr, "no gradient through scan in this build (%s): timing the loss alone\n", nb_ctx_error(ctx));
    loss_only = !v;
    nb_graph_destroy(g);
    nb_graph_destroy(v);
    nb_tree_destroy(spec);
    nb_tree_destroy(batch);
    nb_ctx_destroy(ctx);
  }
  static const int64_t depth[2] = {12, 48};
  result r[2][2]; /* [depth][scan] */
  printf("%s, B=%lld, T=%lld, %s: median of %d cold compiles (empty cache directory) and %d steps, the variants interleaved\n",
         preset, (long long)B, (long long)T, loss_only ? "loss only" : "loss and gradients", compiles, steps);
  printf("| layers | scan_layers | trace + grad ms | cold compile ms | step ms |\n|---|---|---|---|---|\n");
  for (int d = 0; d < 2; d++) {
    if (only_layers && d) break;
    int64_t L = only_layers ? only_layers : depth[d];
    if (measure(preset, L, loss_only, B, T, compiles, steps, threads, r[d])) return 1;
    for (int s = 0; s < 2; s++)
      printf("| %lld | %s | %.0f | %.0f | %.2f |\n", (long long)L, s ? "true" : "false", r[d][s].trace_ms, r[d][s].compile_ms,
             r[d][s].step_ms);
    fflush(stdout);
  }
  if (only_layers) return 0;
  printf("cold compile 48 / 12 layers: scanned %.2fx, unrolled %.2fx\n", r[1][1].compile_ms / r[0][1].compile_ms,
         r[1][0].compile_ms / r[0][0].compile_ms);
  printf("step scanned / unrolled: %.3fx at 12 layers, %.3fx at 48\n", r[0][1].step_ms / r[0][0].step_ms,
         r[1][1].step_ms / r[1][0].step_ms);
  return 0;
}
