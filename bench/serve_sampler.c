/* The model step's sampler (the custom call "serve.sample", src/serve/sample.c)
 * on 16 rows of a 32000-token vocabulary, compiled, one thread: per-step
 * time for greedy rows, temperature alone, top_k 50, top_p 0.9, and all of
 * top_k/top_p/min_p with 20 top logprobs; beside it the step's previous
 * traced greedy path (argmax and log_softmax primitives, compiled), which
 * the kernel replaces. Logits are N(0, 3^2) (a spread distribution: top_p
 * 0.9 keeps thousands of tokens, the sampler's worst case short of a flat
 * one). Medians of 21 runs after 2 warm-ups; the thread's CPU time beside
 * the wall time (the machine is shared).
 *
 * Floor: one pass over the logits to read them (2 MB at 16 x 32000 f32,
 * about 0.1 ms at 20 GB/s) plus exp for the log-normalizer and for the
 * draw's weights (2 x 512k exps; about 0.5 ms scalar in double, well under
 * with vector exp).
 *
 * Build and run (from the repository root, after scripts/build.sh build):
 *   build/bench_serve_sampler
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "nabla/compile.h"
#include "nabla/serve.h"

enum { R = 16, V = 32000, REPS = 21 };

static double cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* Medians of wall and thread-CPU milliseconds of REPS runs. */
static void time_exe(nb_exe *e, nb_array **in, int nout, double *wall, double *cpu) {
  double w[REPS], c[REPS];
  nb_array *out[8];
  for (int r = -2; r < REPS; r++) {
    double t0 = now_ms(), c0 = cpu_ms();
    if (nb_exe_run_flat(e, in, out)) {
      fprintf(stderr, "run failed\n");
      exit(1);
    }
    if (r >= 0) w[r] = now_ms() - t0, c[r] = cpu_ms() - c0;
    for (int i = 0; i < nout; i++) nb_array_release(out[i]);
  }
  *wall = median(w, REPS), *cpu = median(c, REPS);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, NULL, NULL);
  if (nb_serve_register_kernels(ctx, NULL)) return 1;
  int64_t rv[2] = {R, V}, r3[2] = {R, 3}, r1 = R;
  nb_array *key = nb_key(ctx, 1), *z = nb_array_random_normal(ctx, key, NB_F32, 2, rv);
  nb_array_release(key);
  nb_array *z3 = nb_array_create(ctx, NB_F32, 2, rv, NULL);
  {
    const float *s = nb_array_data(z);
    float *d = nb_array_data_mut(z3);
    for (int64_t i = 0; i < R * V; i++) d[i] = 3 * s[i];
  }
  nb_jit_opts jo = {.threads = 1};

  /* the previous step's traced greedy path */
  nb_graph *g = nb_graph_create(ctx);
  nb_val *lg = nb_graph_input(g, "logits", nb_aval_make(NB_F32, 2, rv));
  nb_val *tok = nb_argmax(lg, 1, NB_I32);
  nb_val *lsm = nb_sub(lg, nb_expand_dims(nb_logsumexp(lg, 1), 1));
  nb_graph_output(g, "token", tok);
  nb_graph_output(g, "logprob", nb_take_along_axis(lsm, nb_expand_dims(tok, 1), 1));
  nb_exe *old = nb_jit(ctx, g, &jo);
  double w, c;
  time_exe(old, &z3, 2, &w, &c);
  printf("| previous traced greedy (argmax + log_softmax) | %.3f | %.3f |\n", w, c);

  /* the kernel: logits, processed logits (the same here), fparams, iparams, u */
  nb_graph *k = nb_graph_create(ctx);
  nb_val *ops[5] = {nb_graph_input(k, "a", nb_aval_make(NB_F32, 2, rv)), NULL,
                    nb_graph_input(k, "c", nb_aval_make(NB_F32, 2, r3)), nb_graph_input(k, "d", nb_aval_make(NB_I32, 2, r3)),
                    nb_graph_input(k, "e", nb_aval_make(NB_F64, 1, &r1))};
  ops[1] = ops[0];
  nb_val *outs[4];
  nb_custom_call(k, "serve.sample", 5, ops, NULL, 0, 4, outs);
  const char *names[4] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++) nb_graph_output(k, names[i], outs[i]);
  nb_exe *e = nb_jit(ctx, k, &jo);
  if (!old || !e) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  struct { const char *name; float T, top_p, min_p; int32_t top_k, nlp; } mixes[] = {
      {"greedy", 0, 1, 0, 0, 0},          {"temperature 0.8", 0.8f, 1, 0, 0, 0}, {"T 0.8, top_k 50", 0.8f, 1, 0, 50, 0},
      {"T 0.8, top_p 0.9", 0.8f, 0.9f, 0, 0, 0}, {"T 0.8, top_k 50, top_p 0.9, min_p 0.05, 20 logprobs", 0.8f, 0.9f, 0.05f, 50, 20},
      {"greedy, 20 logprobs", 0, 1, 0, 0, 20}};
  for (size_t m = 0; m < sizeof mixes / sizeof *mixes; m++) {
    float fp[R * 3];
    int32_t ip[R * 3];
    double u[R];
    for (int r = 0; r < R; r++) {
      fp[3 * r] = mixes[m].T, fp[3 * r + 1] = mixes[m].top_p, fp[3 * r + 2] = mixes[m].min_p;
      ip[3 * r] = mixes[m].top_k, ip[3 * r + 1] = mixes[m].nlp, ip[3 * r + 2] = 1;
      u[r] = (r + 0.5) / R;
    }
    nb_array *in[4] = {z3, nb_array_create(ctx, NB_F32, 2, r3, fp), nb_array_create(ctx, NB_I32, 2, r3, ip),
                       nb_array_create(ctx, NB_F64, 1, &r1, u)};
    time_exe(e, in, 4, &w, &c);
    printf("| serve.sample: %s | %.3f | %.3f |\n", mixes[m].name, w, c);
    for (int i = 1; i < 4; i++) nb_array_release(in[i]);
  }
  nb_exe_destroy(old);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_graph_destroy(k);
  nb_array_release(z);
  nb_array_release(z3);
  nb_ctx_destroy(ctx);
  return 0;
}
