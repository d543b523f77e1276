/* Shared by the ckpt benchmarks: shell peers, big trees (timers and medians
 * are bench_util.h's). Header-only; each bench_ckpt_*.c is one claim of
 * bench/RESULTS.md. */
#ifndef NABLA_BENCH_CKPT_COMMON_H
#define NABLA_BENCH_CKPT_COMMON_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"

/* Seconds a shell command takes (it must succeed). */
static inline double time_cmd(const char *cmd) {
  double t0 = now_s();
  if (system(cmd) != 0) {
    fprintf(stderr, "command failed: %s\n", cmd);
    exit(1);
  }
  return now_s() - t0;
}

static inline void rm_rf(const char *path) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "command failed: %s\n", cmd);
}

/* An f32 array with every byte written (so it is resident and not zero). */
static inline nb_array *filled(nb_ctx *ctx, int rank, const int64_t *dims, uint32_t seed) {
  nb_array *a = nb_array_empty(ctx, NB_F32, rank, dims);
  uint32_t *p = nb_array_data_mut(a), x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = x;
  }
  return a;
}

/* Evicts a file from the page cache (drop_caches needs privileges this
 * container lacks): fsync, then POSIX_FADV_DONTNEED on the whole file. */
static inline void evict(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

#endif
