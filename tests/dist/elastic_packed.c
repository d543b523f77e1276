/* The trainer's packed path (nb_train_source: caller's examples packed
 * into rows, what SFT uses) across process counts: examples of 2..40
 * tokens packed into batch_size = 4 rows of 16, grad_accum 2, dropout on.
 * Usage: dist_elastic_packed RUN_DIR STEPS, as 1 process or as 2 under
 * mpirun (mesh.data = 2); it trains RUN_DIR to STEPS, resuming what is
 * there. tests/dist/train_elastic.sh runs 2 then 1 process (and 1 then 2)
 * and compares the losses with an uninterrupted run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

enum { VOCAB = 64, N_TRAIN = 400, N_EVAL = 40 };

/* Example i: tokens t_j = (i*31 + j*7) % VOCAB, inputs t[0..n), targets
 * t[1..n], the first two targets masked out (a prompt). */
static nb_status example(void *ud, nb_ctx *ctx, int64_t i, nb_data_elem *out) {
  int64_t n = 2 + (int64_t)((((uint64_t)i + (uint64_t)(uintptr_t)ud) * 0x9e3779b97f4a7c15ull >> 40) % 39);
  nb_array *in = nb_array_empty(ctx, NB_I32, 1, &n), *tg = nb_array_empty(ctx, NB_I32, 1, &n);
  nb_array *mk = nb_array_empty(ctx, NB_F32, 1, &n);
  nb_tree *t = nb_tree_create(ctx);
  nb_status s = in && tg && mk && t ? NB_OK : NB_ERR_NOMEM;
  for (int64_t j = 0; !s && j < n; j++) {
    ((int32_t *)nb_array_data_mut(in))[j] = (int32_t)((i * 31 + j * 7) % VOCAB);
    ((int32_t *)nb_array_data_mut(tg))[j] = (int32_t)((i * 31 + (j + 1) * 7) % VOCAB);
    ((float *)nb_array_data_mut(mk))[j] = j < 2 ? 0.0f : 1.0f;
  }
  if (!s) s = nb_tree_set_array(t, "inputs", in);
  if (!s) s = nb_tree_set_array(t, "targets", tg);
  if (!s) s = nb_tree_set_array(t, "mask", mk);
  nb_array_release(in), nb_array_release(tg), nb_array_release(mk);
  if (s) return nb_tree_destroy(t), s;
  nb_data_elem_set_tree(ctx, out, t);
  return NB_OK;
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: %s RUN_DIR STEPS\n", argv[0]), 2;
  nb_ctx *ctx = nb_ctx_create();
  const char *world = getenv("OMPI_COMM_WORLD_SIZE");
  int D = world ? atoi(world) : 1;
  nb_dist_mesh *mesh = NULL;
  if (D > 1 && (nb_dist_init(ctx, &argc, &argv) || !(mesh = nb_dist_mesh_create(ctx, 1, (const char *[]){"data"}, (int64_t[]){D})) ||
                nb_dist_mesh_bind(mesh, ctx))) {
    fprintf(stderr, "mesh: %s\n", nb_ctx_error(ctx));
    return 1;
  }
  nb_train_config cfg;
  nb_train_config_defaults(&cfg);
  char steps[64], mesh_data[64];
  snprintf(steps, sizeof steps, "steps=%s", argv[2]);
  snprintf(mesh_data, sizeof mesh_data, "mesh.data=%d", D);
  const char *sets[] = {"model.preset=gpt2-tiny", "model.n_layers=2", "model.d_model=32", "model.n_heads=2",
                        "model.n_kv_heads=2", "model.d_ff=64", "model.max_seq_len=16", "model.vocab_size=64",
                        "model.dropout=0.1", "data.seq_len=16", "data.train=(examples)", "data.workers=0",
                        "batch_size=4", "grad_accum=2", "log_every=1", "eval_every=0", "eval_steps=1",
                        "checkpoint_every=4", "schedule.kind=constant", steps, mesh_data};
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < sizeof sets / sizeof sets[0]; i++) s = nb_train_config_set(ctx, &cfg, sets[i]);
  nb_array *key = s ? NULL : nb_key(ctx, 7);
  nb_tree *params = key ? nb_model_init(ctx, &cfg.model, key) : NULL;
  nb_data_map *train = nb_data_map_source(ctx, N_TRAIN, example, NULL);
  nb_data_map *eval = nb_data_map_source(ctx, N_EVAL, example, (void *)(uintptr_t)12345);
  nb_train_source src = {.train = train, .eval = eval, .train_id = 42, .train_tokens = N_TRAIN, .train_name = "(examples)",
                         .params = params};
  nb_train_opts o = {.run_dir = argv[1], .threads = 1, .source = &src};
  nb_train_result r;
  if (!s && !params) s = nb_ctx_status(ctx);
  if (!s) s = nb_train_run(ctx, &cfg, &o, &r);
  if (s) fprintf(stderr, "rank %d: %s\n", nb_dist_rank(), nb_ctx_error(ctx));
  else if (nb_dist_rank() == 0) printf("trained steps %lld..%lld\n", (long long)r.start_step + 1, (long long)r.final_step);
  nb_data_map_release(train);
  nb_data_map_release(eval);
  nb_tree_destroy(params);
  nb_array_release(key);
  if (mesh && s) nb_dist_abort(1, "elastic_packed failed on this rank");
  nb_dist_mesh_destroy(mesh);
  nb_ctx_destroy(ctx);
  if (mesh) nb_dist_finalize();
  return s ? 1 : 0;
}
