/* Fuzzes the token-shard reader and the window source over it: any bytes
 * must open with an error or read, window and verify without crashing. The
 * header checksum is recomputed half of the time so the checks behind it
 * are reached. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 20)) return 0;
  static uint8_t buf[1 << 20];
  memcpy(buf, data, size);
  if (size >= 64 && (data[size - 1] & 1)) {
    uint64_t h = XXH3_64bits(buf, 56);
    memcpy(buf + 56, &h, 8);
  }
  char path[64];
  snprintf(path, sizeof path, "/tmp/nabla_fuzz_shard_%d.tok", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(buf, 1, size, f);
  fclose(f);
  nb_ctx *ctx = nb_ctx_create();
  nb_data_shard *s = nb_data_shard_open(ctx, path);
  if (s) {
    int32_t ids[64];
    int64_t n = nb_data_shard_count(s);
    nb_data_shard_read(s, 0, n < 64 ? n : 64, ids);
    nb_data_shard_read(s, n > 64 ? n - 64 : 0, n < 64 ? n : 64, ids);
    nb_data_shard_verify(s, NULL, NULL);
    nb_data_shard_close(s);
    const char *paths[1] = {path};
    nb_data_map *ds = nb_data_map_tokens(ctx, 1, paths, 3);
    nb_data_elem e = NB_DATA_ELEM_INIT;
    for (int64_t i = 0; ds && i < nb_data_map_len(ds) && i < 256; i++) nb_data_map_get(ds, i, &e);
    nb_data_elem_clear(ctx, &e);
    nb_data_map_release(ds);
  }
  nb_ctx_destroy(ctx);
  remove(path);
  return 0;
}
