/* One GPT-2 training step through nb_jit: value_and_grad of the model's
 * loss plus an AdamW update (include/nabla/optim.h) traced into one graph,
 * compiled once with params and optimizer state donated, then run on a
 * fixed batch. Reports tokens/s (median of the timed steps), MFU against
 * the machine's f32 FMA peak at that thread count (nb_prof_peak_flops:
 * measured once, cached per CPU model), and the compile
 * time: cold (the cache directory given, which the caller empties) and warm
 * (this program run again on the same cache directory, in a second process).
 * The peers bench/gpt2_step_torch.py and bench/gpt2_step_jax.py run the
 * same model and step; bench/gpt2_step.sh runs all three interleaved.
 *
 *   ./build/bench_gpt2_step [--preset gpt2-124m] [--vocab 50304] [--batch 4] [--seq 256]
 *                           [--steps 3] [--threads 2] [--profile N] [--trace PATH] [--compile-only]
 *
 * --trace PATH records the timed steps (not the warm-up) with nb_prof and
 * prints the op table (every compiled step by time, with its shapes, rates
 * and roofline position; PATH's .ops.json beside it, docs/prof.md).
 *
 * Model flops per step (PaLM's appendix B): 6 * N * tokens for the weights
 * (N counts the tied embedding once, as the output head, and not the
 * position table) plus 12 * layers * d_model * seq * tokens for attention. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "nabla/nabla.h"

static int die(nb_ctx *ctx, const char *what) {
  fprintf(stderr, "%s: %s\n", what, nb_ctx_error(ctx));
  return 1;
}

typedef struct step_ud {
  const nb_graph *vg;
  const nb_optim_tx *tx;
} step_ud;

/* (params, opt, batch) -> (loss, params, opt): the loss's value_and_grad
 * inlined, then the optimizer's update. */
static nb_status step_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  const step_ud *u = user;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *opt = nb_tree_select_prefix(in, "opt", true);
  nb_tree *vgo = nb_tree_create(ctx), *upd = nb_tree_create(ctx), *nopt = nb_tree_create(ctx), *np = nb_tree_create(ctx);
  nb_status s = params && opt && vgo && upd && nopt && np ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = nb_graph_call(g, u->vg, in, vgo);
  nb_tree *grads = s ? NULL : nb_tree_select_prefix(vgo, "grad/params", true);
  if (!s && !grads) s = NB_ERR_NOMEM;
  if (!s) s = nb_optim_update(u->tx, g, grads, opt, params, upd, nopt);
  if (!s) s = nb_optim_apply_updates(g, params, upd, np);
  if (!s) s = nb_tree_set_val(out, "loss", nb_tree_get_val(vgo, "loss"));
  if (!s) s = nb_tree_merge(out, "params", np);
  if (!s) s = nb_tree_merge(out, "opt", nopt);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  nb_tree_destroy(grads);
  nb_tree_destroy(vgo);
  nb_tree_destroy(upd);
  nb_tree_destroy(nopt);
  nb_tree_destroy(np);
  return s;
}

int main(int argc, char **argv) {
  const char *preset = "gpt2-124m";
  int64_t vocab = 0, B = 4, T = 256;
  int steps = 3, threads = 2, profile = 0;
  const char *trace = NULL;
  bool compile_only = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--compile-only")) compile_only = true;
    else if (i + 1 < argc && !strcmp(argv[i], "--preset")) preset = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--vocab")) vocab = atoll(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--batch")) B = atoll(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--seq")) T = atoll(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--profile")) profile = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--trace")) trace = argv[++i];
    else return fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
  }
  if (steps < 1 || steps > 100 || B < 1 || T < 1 || threads < 1) return 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_model_config cfg;
  if (nb_model_config_preset(ctx, preset, &cfg)) return die(ctx, "preset");
  if (vocab > 0) cfg.vocab_size = vocab;
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &cfg, key);
  if (!params) return die(ctx, "init");
  nb_tree *batch = bench_lm_batch(ctx, B, T, cfg.vocab_size);
  if (!batch) return die(ctx, "batch");
  nb_optim_tx *tx = nb_optim_adamw(ctx, nb_optim_constant(ctx, 3e-4), 0.9, 0.95, 1e-8, 0.1, NULL);
  nb_tree *opt = tx ? nb_optim_init_arrays(ctx, tx, params) : NULL;
  if (!opt) return die(ctx, "optimizer init");

  double t0 = now_s();
  nb_graph *lg = nb_model_trace_loss(ctx, &cfg, NULL, params, batch);
  nb_graph *vg = lg ? nb_value_and_grad(ctx, lg, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  if (!vg) return die(ctx, "trace");
  nb_tree *spec = nb_tree_create(ctx);
  nb_tree_merge(spec, "params", params);
  nb_tree_merge(spec, "opt", opt);
  nb_tree_merge(spec, "batch", batch);
  step_ud ud = {vg, tx};
  nb_graph *g = nb_trace(ctx, step_fn, &ud, spec);
  if (!g) return die(ctx, "trace step");
  double t_trace = now_s() - t0;
  const char *donate[] = {"params", "opt", NULL};
  nb_jit_opts o = {.donate = donate, .threads = threads};
  t0 = now_s();
  nb_exe *exe = nb_jit(ctx, g, &o);
  double t_jit = now_s() - t0;
  if (!exe) return die(ctx, "jit");
  nb_exe_stats st;
  nb_exe_get_stats(exe, &st);
  printf("compile: trace+grad %.3f s, nb_jit %.3f s (from disk cache: %s), %zu kernels, %zu blas, %zu eval\n", t_trace, t_jit,
         st.from_disk_cache ? "yes" : "no", st.nkernels, st.nblas, st.neval);
  if (compile_only) return 0;

  int64_t n = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    const char *p = nb_tree_path(params, i);
    if (!strstr(p, "pos")) n += nb_array_size(nb_tree_leaf(params, i)->array);
  }
  double tokens = (double)(B * T);
  double model_flops = 6.0 * (double)n * tokens + 12.0 * (double)cfg.n_layers * (double)cfg.d_model * (double)T * tokens;
  double graph_flops, graph_bytes;
  nb_graph_cost(g, &graph_flops, &graph_bytes);
  double peak = nb_prof_peak_flops(threads).flops;

  /* the step owns params and opt: each run takes the last run's outputs */
  nb_tree *state = nb_tree_create(ctx);
  nb_tree_merge(state, "params", params);
  nb_tree_merge(state, "opt", opt);
  nb_tree_merge(state, "batch", batch);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  double t[101], tc[101], loss0 = 0, loss = 0, last = 0;
  for (int r = 0; r <= steps; r++) { /* run 0 is the warm-up */
    if (r == 1 && trace && nb_prof_start(ctx, &(nb_prof_trace_opts){.path = trace, .peak_flops = peak}))
      return die(ctx, "trace");
    nb_tree *out = nb_tree_create(ctx);
    t0 = now_s();
    double c0 = cpu_s();
    if (nb_exe_run(exe, state, out) != NB_OK) return die(ctx, "run");
    double dt = now_s() - t0;
    if (r > 0) t[r - 1] = dt, tc[r - 1] = cpu_s() - c0;
    last = dt;
    loss = nb_array_get(nb_tree_get_array(out, "loss"), 0);
    if (r == 0) loss0 = loss;
    nb_tree *next = nb_tree_create(ctx);
    nb_tree_merge(next, "batch", batch);
    nb_tree *np = nb_tree_select_prefix(out, "params", true), *no = nb_tree_select_prefix(out, "opt", true);
    if (!np || !no || nb_tree_merge(next, "params", np) || nb_tree_merge(next, "opt", no)) return die(ctx, "next state");
    nb_tree_destroy(np);
    nb_tree_destroy(no);
    nb_tree_destroy(out);
    nb_tree_destroy(state);
    state = next;
    printf("step %d: %.3f s, loss %.5f\n", r, dt, loss);
  }
  if (trace && (nb_prof_stop(ctx) || nb_prof_trace_table(ctx, trace, stdout, 0, peak))) return die(ctx, "trace");
  double per_step = median(t, steps);
  printf("RESULT nabla %s B=%lld T=%lld vocab=%lld params=%lld threads=%d: step %.4f s (median of %d), %.0f tokens/s, "
         "model %.1f GFLOP/step, %.2f GFLOP/s, FMA peak %.2f GFLOP/s, MFU %.1f%%, loss %.4f -> %.4f, compile %.2f s, "
         "cpu %.4f s/step\n",
         preset, (long long)B, (long long)T, (long long)cfg.vocab_size, (long long)n, threads, per_step, steps, tokens / per_step,
         model_flops / 1e9, model_flops / per_step / 1e9, peak / 1e9, 100 * model_flops / per_step / peak, loss0, loss, t_jit,
         median(tc, steps));
  printf("graph cost: %.1f GFLOP, %.2f GB per step; dot_general on %s\n", graph_flops / 1e9, graph_bytes / 1e9,
         nb_jit_blas_core());
  if (profile > 0) {
    double by_kind[NB_EXE_STEP_KIND_COUNT] = {0};
    size_t ns = nb_exe_num_steps(exe);
    for (size_t i = 0; i < ns; i++) {
      nb_exe_step_info s;
      nb_exe_step(exe, i, &s);
      by_kind[s.kind] += s.last_ms;
    }
    double sum = by_kind[NB_EXE_STEP_KERNEL] + by_kind[NB_EXE_STEP_EVAL] + by_kind[NB_EXE_STEP_BLAS];
    printf("last step by kind: kernels %.1f ms, eval %.1f ms, blas %.1f ms; %zu steps; outside the steps (binding, "
           "dispatch): %.1f ms of %.1f ms\n",
           by_kind[NB_EXE_STEP_KERNEL], by_kind[NB_EXE_STEP_EVAL], by_kind[NB_EXE_STEP_BLAS], ns, 1e3 * last - sum, 1e3 * last);
    double cap = 1e300;
    for (int k = 0; k < profile; k++) { /* the k-th slowest step of the last run */
      size_t best = ns;
      double bms = -1;
      for (size_t i = 0; i < ns; i++) {
        nb_exe_step_info s;
        nb_exe_step(exe, i, &s);
        if (s.last_ms > bms && s.last_ms < cap) bms = s.last_ms, best = i;
      }
      if (best == ns) break;
      nb_exe_step_info s;
      nb_exe_step(exe, best, &s);
      printf("  step %4zu %-12s %8.2f ms %7.2f GFLOP/s %6.2f GB/s\n", best, s.name, s.last_ms, s.flops / s.last_ms / 1e6,
             s.bytes / s.last_ms / 1e6);
      cap = bms;
    }
  }
  nb_tree_destroy(state);
  nb_tree_destroy(batch);
  nb_tree_destroy(spec);
  nb_exe_destroy(exe);
  nb_graph_destroy(g);
  nb_graph_destroy(vg);
  nb_graph_destroy(lg);
  nb_optim_tx_destroy(tx);
  nb_array_release(key);
  nb_ctx_destroy(ctx);
  return 0;
}
