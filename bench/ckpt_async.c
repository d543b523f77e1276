/* Claim: an async save of a GPT-2-small training state (124M params + AdamW
 * m and v, f32: ~1.49 GB) blocks the training loop for a few ms: save()
 * only retains the arrays and starts the writer. Reports the blocking time
 * of each save (median), and how long the background write took.
 * Usage: bench_ckpt_async [DIR] [SAVES] */
#include "ckpt_common.h"

/* GPT-2 small: wte, wpe, 12 blocks, ln_f. */
static void gpt2_tree(nb_ctx *ctx, nb_tree *t, uint32_t seed, int64_t *n_params) {
  struct {
    const char *name;
    int rank;
    int64_t d0, d1;
  } block[] = {{"ln_1/w", 1, 768, 0},         {"ln_1/b", 1, 768, 0},        {"attn/c_attn/w", 2, 768, 2304},
               {"attn/c_attn/b", 1, 2304, 0}, {"attn/c_proj/w", 2, 768, 768}, {"attn/c_proj/b", 1, 768, 0},
               {"ln_2/w", 1, 768, 0},         {"ln_2/b", 1, 768, 0},        {"mlp/c_fc/w", 2, 768, 3072},
               {"mlp/c_fc/b", 1, 3072, 0},    {"mlp/c_proj/w", 2, 3072, 768}, {"mlp/c_proj/b", 1, 768, 0}};
  char p[128];
  int64_t d[2];
  *n_params = 0;
#define ADD(path, r, a, b)                             \
  do {                                                 \
    d[0] = a, d[1] = b;                                \
    nb_array *x = filled(ctx, r, d, seed++);           \
    nb_tree_set_array(t, path, x);                     \
    *n_params += nb_array_size(x);                     \
    nb_array_release(x);                               \
  } while (0)
  ADD("wte", 2, 50257, 768);
  ADD("wpe", 2, 1024, 768);
  for (int l = 0; l < 12; l++)
    for (size_t k = 0; k < sizeof block / sizeof *block; k++) {
      snprintf(p, sizeof p, "h/%d/%s", l, block[k].name);
      ADD(p, block[k].rank, block[k].d0, block[k].d1);
    }
  ADD("ln_f/w", 1, 768, 0);
  ADD("ln_f/b", 1, 768, 0);
#undef ADD
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp/nabla_bench_async";
  int saves = argc > 2 ? atoi(argv[2]) : 5;
  nb_ctx *ctx = nb_ctx_create();
  nb_tree *params = nb_tree_create(ctx), *m = nb_tree_create(ctx), *v = nb_tree_create(ctx);
  int64_t n;
  gpt2_tree(ctx, params, 1, &n);
  gpt2_tree(ctx, m, 1000, &n);
  gpt2_tree(ctx, v, 2000, &n);
  double gb = 3.0 * (double)n * 4 / 1e9;
  printf("state: %lld params x 3 (params, m, v) = %.2f GB\n", (long long)n, gb);
  rm_rf(dir);
  nb_ckpt_options o = {.directory = dir, .async = true, .max_to_keep = 2};
  nb_ckpt_manager *mgr = nb_ckpt_manager_create(ctx, &o);
  double block[32], write[32];
  for (int s = 0; s < saves && s < 32; s++) {
    nb_ckpt_item items[] = {{"params", params}, {"opt_state_m", m}, {"opt_state_v", v}};
    double t0 = now_s();
    if (nb_ckpt_save(mgr, s, items, 3, NULL, NULL) != NB_OK) {
      fprintf(stderr, "save failed: %s\n", nb_ctx_error(ctx));
      return 1;
    }
    double t1 = now_s();
    if (nb_ckpt_wait_until_finished(mgr) != NB_OK) {
      fprintf(stderr, "background save failed: %s\n", nb_ctx_error(ctx));
      return 1;
    }
    block[s] = t1 - t0;
    write[s] = now_s() - t0;
    printf("save %d: blocked %.3f ms, written in %.2f s (%.2f GB/s)\n", s, 1e3 * block[s], write[s], gb / write[s]);
  }
  printf("median of %d: save() blocked %.3f ms; background write %.2f s\n", saves, 1e3 * median(block, saves),
         median(write, saves));
  nb_ckpt_manager_destroy(mgr);
  nb_tree_destroy(params);
  nb_tree_destroy(m);
  nb_tree_destroy(v);
  rm_rf(dir);
  nb_ctx_destroy(ctx);
  return 0;
}
