/* Overlap of a collective with computation, under mpirun -np 2
 * (bench/dist_overlap.sh): one executable with a large psum independent of
 * a large matmul, compiled with the collective as a start and a wait step
 * apart (async) and as one synchronous step (sync), and each alone; the
 * four are run interleaved, REPS times each after a barrier, and rank 0
 * prints the medians of the run's wall time and of the time its wait steps
 * (async) or collective step (sync) took.
 *   bench_dist_overlap [ELEMS (psum f32 elements, 4194304)] [N (matmul N x N x N, 768)] [REPS (15)] */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

static int64_t elems = 4 << 20, n = 768;

static nb_status f_both(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  int which = *(const int *)u; /* 0 both, 1 psum alone, 2 matmul alone */
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  if (which != 2) nb_tree_set_val(out, "sum", nb_psum(nb_mul(x, nb_scalar(g, NB_F32, 0.5)), "data"));
  if (which != 1) nb_tree_set_val(out, "prod", nb_matmul(w, w));
  return NB_OK;
}

/* ms spent in collective steps (wait steps; the collective's own step when synchronous) */
static double comm_ms(const nb_exe *e) {
  double ms = 0;
  for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info s;
    nb_exe_step(e, i, &s);
    if (s.kind == NB_EXE_STEP_WAIT || (s.kind == NB_EXE_STEP_EVAL && !strncmp(s.name, "psum", 4))) ms += s.last_ms;
  }
  return ms;
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (nb_dist_init(ctx, &argc, &argv)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  if (argc > 1) elems = atoll(argv[1]);
  if (argc > 2) n = atoll(argv[2]);
  int reps = argc > 3 ? atoi(argv[3]) : 15, rank = nb_dist_rank();
  nb_dist_mesh *m = nb_dist_mesh_create(ctx, 1, (const char *[]){"data"}, (int64_t[]){-1});
  if (!m || nb_dist_mesh_bind(m, ctx)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  nb_comm *c = nb_ctx_axis(ctx, "data");
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){elems});
  nb_array *w = nb_array_zeros(ctx, NB_F32, 2, (int64_t[]){n, n});
  float *xp = nb_array_data_mut(x), *wp = nb_array_data_mut(w);
  for (int64_t i = 0; i < elems; i++) xp[i] = (float)((i * 7 + rank) % 13) * 0.25f;
  for (int64_t i = 0; i < n * n; i++) wp[i] = (float)((i * 5) % 11) * 0.01f;
  nb_tree_set_array(in, "x", x);
  nb_tree_set_array(in, "w", w);
  static const char *const names[] = {"both async", "both sync", "psum alone", "matmul alone"};
  static const int which[] = {0, 0, 1, 2};
  nb_exe *exe[4];
  for (int k = 0; k < 4; k++) {
    nb_graph *g = nb_trace(ctx, f_both, (void *)&which[k], in);
    nb_jit_opts o = {.disable = k == 1 ? "async" : NULL};
    exe[k] = g ? nb_jit(ctx, g, &o) : NULL;
    nb_graph_destroy(g);
    if (!exe[k]) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  }
  double *wall = calloc((size_t)(4 * reps), sizeof *wall), *comm = calloc((size_t)(4 * reps), sizeof *comm);
  for (int r = -2; r < reps; r++) /* two warm-up rounds */
    for (int k = 0; k < 4; k++) {
      nb_tree *out = nb_tree_create(ctx);
      c->ops->barrier(c, ctx);
      double t0 = now_ms();
      if (nb_exe_run(exe[k], in, out)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
      double t1 = now_ms();
      if (r >= 0) wall[k * reps + r] = t1 - t0, comm[k * reps + r] = comm_ms(exe[k]);
      nb_tree_destroy(out);
    }
  if (rank == 0) {
    printf("psum of %lld f32 (%.1f MiB) | matmul %lld^3 (%.2f GFLOP) | 2 processes | %d reps, medians\n", (long long)elems,
           (double)elems * 4 / 1048576, (long long)n, 2e-9 * (double)(n * n * n), reps);
    double med[4];
    for (int k = 0; k < 4; k++) {
      med[k] = median(wall + k * reps, reps);
      double cm = median(comm + k * reps, reps);
      printf("%-13s run %8.2f ms   in collective steps %8.2f ms\n", names[k], med[k], cm);
    }
    printf("sum of the two alone %.2f ms; async/sync %.3f; saved by async %.2f ms of the %.2f ms hideable (min of the two alone)\n",
           med[2] + med[3], med[0] / med[1], med[1] - med[0], med[2] < med[3] ? med[2] : med[3]);
  }
  for (int k = 0; k < 4; k++) nb_exe_destroy(exe[k]);
  free(wall);
  free(comm);
  nb_array_release(x);
  nb_array_release(w);
  nb_tree_destroy(in);
  nb_dist_mesh_destroy(m);
  nb_ctx_destroy(ctx);
  nb_dist_finalize();
  return 0;
}
