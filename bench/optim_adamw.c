/* AdamW update over a GPT-2-small parameter tree (124M f32 parameters, 148
 * leaves): bytes the update must move against the machine's copy bandwidth,
 * measured in the same run, through the reference interpreter or (--jit)
 * nb_jit with params and optimizer state donated, as the trainer does: each
 * run's outputs are the next run's inputs, so the update runs in place.
 *
 * The floor: one fused pass reads param, grad, mu, nu and writes param, mu,
 * nu = 28 bytes per parameter. The interpreter instead materializes every
 * elementwise intermediate; nb_graph_cost reports those bytes too.
 *
 *   ./build/bench_optim_adamw [--jit] [--layers N] [--reps R]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"
#include "bench_util.h"

static void add(nb_ctx *ctx, nb_tree *p, nb_tree *g, const char *path, int rank, int64_t d0, int64_t d1) {
  int64_t d[2] = {d0, d1};
  nb_array *a = nb_array_full(ctx, NB_F32, rank, d, 0.02), *b = nb_array_full(ctx, NB_F32, rank, d, 1e-3);
  if (!a || !b) {
    fprintf(stderr, "out of memory at %s\n", path);
    exit(1);
  }
  nb_tree_set_array(p, path, a);
  nb_tree_set_array(g, path, b);
  nb_array_release(a);
  nb_array_release(b);
}

/* GPT-2 small: vocab 50257, context 1024, width 768, 12 layers */
static void gpt2(nb_ctx *ctx, nb_tree *p, nb_tree *g, int layers) {
  const int64_t V = 50257, T = 1024, C = 768;
  char s[128];
  add(ctx, p, g, "wte", 2, V, C);
  add(ctx, p, g, "wpe", 2, T, C);
  for (int l = 0; l < layers; l++) {
    struct { const char *n; int r; int64_t a, b; } leaves[] = {
        {"ln_1/scale", 1, C, 0},         {"ln_1/bias", 1, C, 0},       {"attn/c_attn/w", 2, C, 3 * C},
        {"attn/c_attn/b", 1, 3 * C, 0},  {"attn/c_proj/w", 2, C, C},   {"attn/c_proj/b", 1, C, 0},
        {"ln_2/scale", 1, C, 0},         {"ln_2/bias", 1, C, 0},       {"mlp/c_fc/w", 2, C, 4 * C},
        {"mlp/c_fc/b", 1, 4 * C, 0},     {"mlp/c_proj/w", 2, 4 * C, C}, {"mlp/c_proj/b", 1, C, 0}};
    for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
      snprintf(s, sizeof s, "h/%d/%s", l, leaves[i].n);
      add(ctx, p, g, s, leaves[i].r, leaves[i].a, leaves[i].b);
    }
  }
  add(ctx, p, g, "ln_f/scale", 1, C, 0);
  add(ctx, p, g, "ln_f/bias", 1, C, 0);
}

/* memcpy bandwidth: (read + write) bytes / second, median of reps */
static double copy_bandwidth(size_t bytes, int reps) {
  char *a = malloc(bytes), *b = malloc(bytes);
  double t[32];
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    memcpy(b, a, bytes);
    t[r] = now_s() - t0;
    a[r] = b[bytes - 1 - (size_t)r]; /* keep the copy observable */
  }
  free(a);
  free(b);
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  return 2.0 * (double)bytes / t[reps / 2];
}

int main(int argc, char **argv) {
  int layers = 12, reps = 5;
  bool jit = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--jit")) jit = true;
    else if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
  }
  if (reps < 1 || reps > 31 || layers < 0) return 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_tree *params = nb_tree_create(ctx), *grads = nb_tree_create(ctx);
  gpt2(ctx, params, grads, layers);
  int64_t n = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) n += nb_array_size(nb_tree_leaf(params, i)->array);
  nb_optim_tx *tx = nb_optim_adamw(ctx, nb_optim_constant(ctx, 3e-4), 0.9, 0.95, 1e-8, 0.1, NULL);
  double t0 = now_s();
  nb_tree *state = nb_optim_init_arrays(ctx, tx, params);
  double t_init = now_s() - t0;
  t0 = now_s();
  nb_graph *g = state ? nb_optim_step_graph(ctx, tx, params, state) : NULL;
  double t_trace = now_s() - t0;
  if (!g) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  double flops, cost_bytes;
  nb_graph_cost(g, &flops, &cost_bytes);
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "grads", grads);
  nb_tree_merge(in, "state", state);
  size_t nleaves = nb_tree_size(params);
  /* `in` alone holds the arrays from here on, so donated ones are held once */
  nb_tree_destroy(params);
  nb_tree_destroy(state);
  nb_exe *exe = NULL;
  double t_compile = 0;
  if (jit) {
    static const char *const donate[] = {"params", "state", NULL};
    nb_jit_opts o = {.donate = donate};
    t0 = now_s();
    exe = nb_jit(ctx, g, &o);
    t_compile = now_s() - t0;
    if (!exe) {
      fprintf(stderr, "jit: %s\n", nb_ctx_error(ctx));
      return 1;
    }
  }
  double t[32];
  char probe[300];
  snprintf(probe, sizeof probe, "params/%s", nb_tree_path(grads, 0));
  const void *before = nb_array_data(nb_tree_get_array(in, probe));
  bool in_place = true;
  for (int r = 0; r < reps; r++) {
    nb_tree *out = nb_tree_create(ctx);
    t0 = now_s();
    if ((exe ? nb_exe_run(exe, in, out) : nb_graph_run(ctx, g, in, out)) != NB_OK) {
      fprintf(stderr, "run: %s\n", nb_ctx_error(ctx));
      return 1;
    }
    t[r] = now_s() - t0;
    in_place &= nb_array_data(nb_tree_get_array(out, probe)) == before;
    /* the trainer's loop: the new params and state are the next step's inputs */
    for (size_t i = 0; i < nb_tree_size(out); i++) nb_tree_set_array(in, nb_tree_path(out, i), nb_tree_leaf(out, i)->array);
    nb_tree_destroy(out);
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  double floor_bytes = 28.0 * (double)n, bw = copy_bandwidth((size_t)256 << 20, 9);
  printf("AdamW update, %lld f32 parameters in %zu leaves, executor: %s\n", (long long)n, nleaves,
         exe ? "nb_jit (params and state donated)" : "reference interpreter");
  if (exe) {
    nb_exe_stats st;
    nb_exe_get_stats(exe, &st);
    printf("  jit: compile %.3f s, %zu kernels, %zu reference evals; arena (temporaries) %zu bytes, outputs %zu bytes, "
           "peak estimate (arena + outputs not donated) %zu bytes\n",
           t_compile, (size_t)st.nkernels, (size_t)st.neval, st.arena_bytes, st.output_bytes, st.peak_bytes);
    printf("  in place: params/%s is %s\n", nb_tree_path(grads, 0), in_place ? "updated in place" : "a fresh array");
  }
  printf("  graph: %zu equations; trace %.3f s; init %.3f s\n", nb_graph_num_eqns(g), t_trace, t_init);
  printf("  update median %.3f s (min %.3f, max %.3f, %d runs)\n", t[reps / 2], t[0], t[reps - 1], reps);
  printf("  fused floor: %.2f GB (28 B/param); model cost of the unfused graph: %.2f GB, %.2f GFLOP\n",
         floor_bytes / 1e9, cost_bytes / 1e9, flops / 1e9);
  printf("  memcpy bandwidth (read + write): %.2f GB/s -> floor time %.3f s\n", bw / 1e9, floor_bytes / bw);
  printf("  effective: %.2f GB/s of the floor's bytes = %.1f%% of copy bandwidth; %.2f GB/s of the graph's bytes\n",
         floor_bytes / t[reps / 2] / 1e9, 100.0 * floor_bytes / t[reps / 2] / bw, cost_bytes / t[reps / 2] / 1e9);
  printf("  peak host memory %.2f GB\n", (double)nb_ctx_peak_bytes(ctx) / 1e9);
  nb_tree_destroy(in);
  nb_tree_destroy(grads);
  nb_exe_destroy(exe);
  nb_graph_destroy(g);
  nb_optim_tx_destroy(tx);
  nb_ctx_destroy(ctx);
  return 0;
}
