/* Fuzzes the record-file reader: any bytes written to a file must open
 * with an error or read every record (and verify) without crashing. The
 * checksums are recomputed over fuzzed chunk payloads half of the time, so
 * the structure checks behind them are reached too. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"

/* Rewrites the header, chunk and footer checksums (xxh3 files only) so that
 * fuzzed content gets past them. Best effort on malformed input. */
static void fix_checksums(uint8_t *d, size_t n) {
  if (n < 96 || memcmp(d, "NBRECORD", 8) || d[12] != 0) return;
  uint64_t h = nb_data_checksum_bytes(NB_DATA_XXH3, d, 56);
  memcpy(d + 56, &h, 8);
  uint64_t foff;
  memcpy(&foff, d + n - 32, 8);
  if (foff < 64 || foff > n - 32) return;
  for (size_t off = 64; off + 40 <= foff;) {
    uint64_t stored;
    memcpy(&stored, d + off + 24, 8);
    if (stored > foff - off - 40) break;
    uint64_t c = nb_data_checksum_bytes(NB_DATA_XXH3, d + off + 40, (size_t)stored);
    memcpy(d + off + 32, &c, 8);
    off += 40 + (size_t)stored;
  }
  uint64_t f = nb_data_checksum_bytes(NB_DATA_XXH3, d + foff, (size_t)(n - 32 - foff));
  memcpy(d + n - 16, &f, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 20)) return 0;
  static uint8_t buf[1 << 20];
  memcpy(buf, data, size);
  if (size && (data[size - 1] & 1)) fix_checksums(buf, size);
  char path[64];
  snprintf(path, sizeof path, "/tmp/nabla_fuzz_records_%d.rec", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(buf, 1, size, f);
  fclose(f);
  nb_ctx *ctx = nb_ctx_create();
  nb_data_rec_reader *r = nb_data_rec_open(ctx, path);
  if (r) {
    nb_data_elem e = NB_DATA_ELEM_INIT;
    int64_t n = nb_data_rec_count(r);
    for (int64_t i = 0; i < n && i < 4096; i++) nb_data_rec_read(r, i, &e);
    nb_data_rec_verify(r, NULL, NULL);
    nb_data_elem_clear(ctx, &e);
    nb_data_rec_close(r);
  }
  nb_ctx_destroy(ctx);
  remove(path);
  return 0;
}
