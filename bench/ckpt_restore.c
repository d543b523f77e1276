/* Claim: restoring a 1 GiB checkpoint by mmap reads at >= 70% of the
 * disk's read throughput when cold, and near memory speed when cached.
 * Cold = the data file evicted with POSIX_FADV_DONTNEED (drop_caches needs
 * privileges); the disk peer is dd iflag=direct (O_DIRECT) of the same file.
 * A restore "reads" its data by verifying checksums (every byte) or, without
 * checksums, by touching every page. The cached peers are XXH3 and memcpy
 * over 1 GiB already in memory. Usage: bench_ckpt_restore [DIR] [RUNS] */
#include <xxhash.h>

#include "ckpt_common.h"

static double touch_pages(const nb_tree *t) {
  volatile uint64_t sum = 0;
  for (size_t i = 0; i < nb_tree_size(t); i++) {
    const nb_array *a = nb_tree_leaf(t, i)->array;
    const uint8_t *p = nb_array_data(a);
    for (size_t k = 0; k < nb_array_nbytes(a); k += 4096) sum += p[k];
  }
  return (double)sum;
}

/* One timed restore; cold evicts the data file first. */
static double restore_once(nb_ctx *ctx, nb_ckpt_manager *m, const char *data, bool cold, bool verify) {
  if (cold) evict(data);
  nb_ckpt_restore_opts ro = {.skip_checksums = !verify};
  double t0 = now_s();
  nb_tree *r = nb_ckpt_restore(m, 1, &ro);
  if (!r) {
    fprintf(stderr, "restore failed: %s\n", nb_ctx_error(ctx));
    exit(1);
  }
  if (!verify) touch_pages(r);
  double dt = now_s() - t0;
  nb_tree_destroy(r);
  return dt;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp/nabla_bench_restore";
  int runs = argc > 2 ? atoi(argv[2]) : 5;
  if (runs > 16) runs = 16;
  nb_ctx *ctx = nb_ctx_create();
  nb_tree *t = nb_tree_create(ctx);
  int64_t dims[1] = {16 << 20};
  for (int i = 0; i < 16; i++) {
    char p[32];
    snprintf(p, sizeof p, "layers/%d/w", i);
    nb_array *a = filled(ctx, 1, dims, (uint32_t)i + 1);
    nb_tree_set_array(t, p, a);
    nb_array_release(a);
  }
  rm_rf(dir);
  nb_ckpt_options o = {.directory = dir};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_ckpt_item it = {"params", t};
  if (nb_ckpt_save(m, 1, &it, 1, NULL, NULL) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  char data[4200], cmd[8400];
  snprintf(data, sizeof data, "%s/step_00000001/params.00000.bin", dir);
  double gib = 1.0, v[6][16];
  for (int r = 0; r < runs; r++) {
    snprintf(cmd, sizeof cmd, "dd if='%s' of=/dev/null bs=8M iflag=direct status=none", data);
    v[0][r] = time_cmd(cmd);
    evict(data);
    snprintf(cmd, sizeof cmd, "dd if='%s' of=/dev/null bs=8M status=none", data);
    v[1][r] = time_cmd(cmd);
    v[2][r] = restore_once(ctx, m, data, true, true);
    v[3][r] = restore_once(ctx, m, data, true, false);
    restore_once(ctx, m, data, false, true); /* warm the cache */
    v[4][r] = restore_once(ctx, m, data, false, true);
    v[5][r] = restore_once(ctx, m, data, false, false);
  }
  /* cached peers: XXH3 and memcpy of 1 GiB in memory */
  size_t n = (size_t)1 << 30;
  uint8_t *a = malloc(n), *b = malloc(n);
  memset(a, 1, n), memset(b, 2, n);
  double hx[16], mc[16];
  for (int r = 0; r < runs; r++) {
    double t0 = now_s();
    volatile uint64_t h = XXH3_64bits(a, n);
    (void)h;
    hx[r] = now_s() - t0;
    t0 = now_s();
    memcpy(b, a, n);
    mc[r] = now_s() - t0;
  }
  const char *names[6] = {"disk: dd O_DIRECT", "disk: dd after FADV_DONTNEED", "cold restore (mmap + verify)",
                          "cold restore (mmap, touch pages)", "cached restore (mmap + verify)",
                          "cached restore (mmap, touch pages)"};
  printf("1 GiB checkpoint, median of %d runs:\n", runs);
  for (int k = 0; k < 6; k++) printf("  %-36s %6.2f GiB/s\n", names[k], gib / median(v[k], runs));
  printf("  %-36s %6.2f GiB/s\n  %-36s %6.2f GiB/s\n", "memory: XXH3 of 1 GiB", gib / median(hx, runs),
         "memory: memcpy of 1 GiB", gib / median(mc, runs));
  printf("cold restore / disk (O_DIRECT): verify %.0f%%, touch %.0f%%\n", 100 * median(v[0], runs) / median(v[2], runs),
         100 * median(v[0], runs) / median(v[3], runs));
  free(a);
  free(b);
  nb_ckpt_manager_destroy(m);
  nb_tree_destroy(t);
  rm_rf(dir);
  nb_ctx_destroy(ctx);
  return 0;
}
