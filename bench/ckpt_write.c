/* Claim: a synchronous save of a 1 GiB tree writes at >= 70% of dd's
 * throughput to the same directory, both with fsync. Tree: 16 f32 arrays of
 * 64 MiB. Peer: dd if=/dev/zero bs=8M count=128 conv=fsync. Runs alternate;
 * medians. Usage: bench_ckpt_write [DIR] [RUNS] */
#include <sys/stat.h>

#include "ckpt_common.h"

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp/nabla_bench_write";
  int runs = argc > 2 ? atoi(argv[2]) : 5;
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
  double gib = 16.0 * 64 / 1024, ours[32], dd[32];
  char cmd[8192], ck[4200];
  rm_rf(dir);
  mkdir(dir, 0755);
  snprintf(ck, sizeof ck, "%s/ck", dir);
  for (int r = 0; r < runs && r < 32; r++) {
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of='%s/dd.bin' bs=8M count=128 conv=fsync status=none", dir);
    dd[r] = time_cmd(cmd);
    snprintf(cmd, sizeof cmd, "%s/dd.bin", dir);
    unlink(cmd);
    nb_ckpt_options o = {.directory = ck};
    nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
    nb_ckpt_item it = {"params", t};
    double t0 = now_s();
    if (nb_ckpt_save(m, 1, &it, 1, NULL, NULL) != NB_OK) {
      fprintf(stderr, "save failed: %s\n", nb_ctx_error(ctx));
      return 1;
    }
    ours[r] = now_s() - t0;
    nb_ckpt_manager_destroy(m);
    rm_rf(ck);
    printf("run %d: dd %.3f s, nabla save %.3f s\n", r, dd[r], ours[r]);
  }
  double md = median(dd, runs), mo = median(ours, runs);
  printf("1 GiB with fsync, median of %d: dd %.2f GiB/s, nabla save %.2f GiB/s, ratio %.0f%%\n", runs, gib / md,
         gib / mo, 100 * md / mo);
  nb_tree_destroy(t);
  rm_rf(dir);
  nb_ctx_destroy(ctx);
  return 0;
}
