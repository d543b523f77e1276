/* Record files: round trips (raw and zstd chunks, both checksums, records
 * larger than a chunk, empty records, empty files), rejection of crashed,
 * truncated and corrupted files with the file and record named, concurrent
 * readers, and allocation-failure injection. */
#include <pthread.h>

#include "data_util.h"

static size_t rec_len(int64_t i) { return i == 100 ? 5000 : i == 200 ? 0 : i == 300 ? 70000 : (size_t)((i * 37) % 300); }

static void rec_bytes(int64_t i, uint8_t *buf) {
  size_t n = rec_len(i);
  for (size_t j = 0; j < n; j++) buf[j] = (uint8_t)(i * 31 + j * 7 + (j >> 8));
}

static bool rec_matches(int64_t i, const nb_data_elem *e) {
  static _Thread_local uint8_t buf[70000];
  rec_bytes(i, buf);
  return e->kind == NB_DATA_BYTES && e->len == rec_len(i) && !memcmp(e->bytes, buf, e->len) && e->bytes[e->len] == 0;
}

static void write_records(nb_ctx *ctx, const char *path, int64_t n, const nb_data_rec_opts *o) {
  nb_data_rec_writer *w = nb_data_rec_create(ctx, path, o);
  CHECK(w != NULL);
  static uint8_t buf[70000];
  for (int64_t i = 0; w && i < n; i++) {
    rec_bytes(i, buf);
    CHECK_OK(ctx, nb_data_rec_write(w, buf, rec_len(i)));
  }
  if (w) CHECK_OK(ctx, nb_data_rec_finish(w));
}

static void test_round_trip(nb_ctx *ctx) {
  nb_data_rec_opts cfgs[3] = {{1024, 0, NB_DATA_XXH3}, {1024, 3, NB_DATA_CRC32C}, {0, 1, NB_DATA_XXH3}};
  char p[512];
  for (int c = 0; c < 3; c++) {
    write_records(ctx, tpath(p, "rt.rec"), 500, &cfgs[c]);
    nb_data_rec_reader *r = nb_data_rec_open(ctx, p);
    CHECK_MSG(r != NULL, "%s", nb_ctx_error(ctx));
    if (!r) continue;
    CHECK(nb_data_rec_count(r) == 500);
    nb_data_rec_info info;
    nb_data_rec_get_info(r, &info);
    CHECK(info.records == 500 && info.version == 1 && info.checksum == cfgs[c].checksum);
    if (c < 2) CHECK(info.chunks > 50);
    if (c >= 1) CHECK(info.compressed_chunks > 0 && info.stored_bytes < info.raw_bytes);
    nb_data_elem e = NB_DATA_ELEM_INIT;
    int bad = 0;
    for (int64_t k = 0; k < 500; k++) { /* a scattered order */
      int64_t i = (k * 211) % 500;
      if (nb_data_rec_read(r, i, &e) != NB_OK || !rec_matches(i, &e)) bad++;
    }
    CHECK_MSG(bad == 0, "config %d: %d records differ", c, bad);
    CHECK(nb_data_rec_read(r, 500, &e) == NB_ERR_INVALID_ARG);
    CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "record 500 out of range");
    CHECK(nb_data_rec_read(r, -1, &e) == NB_ERR_INVALID_ARG);
    nb_ctx_clear_error(ctx);
    CHECK_OK(ctx, nb_data_rec_verify(r, NULL, NULL));
    nb_data_elem_clear(ctx, &e);
    nb_data_rec_close(r);
  }
}

static void test_empty_and_crash(nb_ctx *ctx) {
  char p[512];
  write_records(ctx, tpath(p, "empty.rec"), 0, NULL);
  nb_data_rec_reader *r = nb_data_rec_open(ctx, p);
  CHECK(r && nb_data_rec_count(r) == 0);
  if (r) CHECK_OK(ctx, nb_data_rec_verify(r, NULL, NULL));
  nb_data_rec_close(r);
  /* a writer that dies leaves no footer */
  nb_data_rec_writer *w = nb_data_rec_create(ctx, tpath(p, "crash.rec"), &(nb_data_rec_opts){512, 0, NB_DATA_XXH3});
  uint8_t buf[400] = {1, 2, 3};
  for (int i = 0; i < 50; i++) nb_data_rec_write(w, buf, sizeof buf);
  nb_data_rec_abandon(w);
  CHECK(file_size(p) > 10000);
  CHECK(nb_data_rec_open(ctx, p) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "no footer");
  CHECK(nb_data_rec_open(ctx, tpath(p, "missing.rec")) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "missing.rec");
}

static void test_corruption(nb_ctx *ctx) {
  char p[512], q[512];
  write_records(ctx, tpath(p, "good.rec"), 400, &(nb_data_rec_opts){2048, 0, NB_DATA_XXH3});
  long size = file_size(p);
  /* truncated by one byte, or to a stub */
  copy_file(p, tpath(q, "bad.rec"));
  truncate_to(q, size - 1);
  CHECK(nb_data_rec_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "bad.rec");
  truncate_to(q, 10);
  CHECK(nb_data_rec_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "not a record file");
  /* a flipped byte inside chunk 0's records: found on read and by verify */
  copy_file(p, q);
  nb_test_flip_byte(q, 64 + 40 + 8 * 3 + 5);
  nb_data_rec_reader *r = nb_data_rec_open(ctx, q);
  CHECK(r != NULL);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  if (r) {
    CHECK(nb_data_rec_read(r, 2, &e) == NB_ERR_FORMAT);
    CHECK_MSG(strstr(nb_ctx_error(ctx), "bad.rec") && strstr(nb_ctx_error(ctx), "chunk 0 (records 0..") &&
              strstr(nb_ctx_error(ctx), "reading record 2"), "%s", nb_ctx_error(ctx));
    CHECK_ERR(ctx, NB_ERR_FORMAT, "checksum mismatch");
    CHECK(nb_data_rec_read(r, 399, &e) == NB_OK && rec_matches(399, &e)); /* other chunks still read */
    CHECK(nb_data_rec_verify(r, NULL, NULL) == NB_ERR_FORMAT);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "chunk 0 (records 0..");
    nb_data_rec_close(r);
  }
  /* a flipped byte in the footer index */
  copy_file(p, q);
  nb_test_flip_byte(q, size - 32 - 20);
  CHECK(nb_data_rec_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "footer checksum mismatch");
  /* a newer version */
  copy_file(p, q);
  nb_test_flip_byte(q, 8);
  CHECK(nb_data_rec_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "newer nabla");
  /* a flipped byte in a chunk header */
  copy_file(p, q);
  nb_test_flip_byte(q, 64 + 9);
  r = nb_data_rec_open(ctx, q);
  CHECK(r && nb_data_rec_read(r, 0, &e) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "does not match the footer");
  nb_data_rec_close(r);
  nb_data_elem_clear(ctx, &e);
}

static void test_crc32c(void) {
  CHECK(nb_data_checksum_bytes(NB_DATA_CRC32C, "123456789", 9) == 0xe3069283u);
  CHECK(nb_data_checksum_bytes(NB_DATA_CRC32C, "", 0) == 0);
  uint8_t zeros[32] = {0};
  CHECK(nb_data_checksum_bytes(NB_DATA_CRC32C, zeros, 32) == 0x8a9136aau);
  nb_data_checksum c;
  CHECK(nb_data_checksum_from_name("crc32c", &c) && c == NB_DATA_CRC32C && !nb_data_checksum_from_name("md5", &c));
}

typedef struct reader_job {
  nb_ctx *ctx;
  nb_data_rec_reader *r;
  int seed, bad;
} reader_job;

static void *reader_thread(void *arg) {
  reader_job *j = arg;
  nb_test_rng rng = {(uint64_t)j->seed * 7919 + 1};
  nb_data_elem e = NB_DATA_ELEM_INIT;
  for (int k = 0; k < 600; k++) {
    int64_t i = nb_test_int(&rng, 0, 499);
    if (nb_data_rec_read(j->r, i, &e) != NB_OK || !rec_matches(i, &e)) j->bad++;
  }
  nb_data_elem_clear(j->ctx, &e);
  return NULL;
}

static void test_threads(nb_ctx *ctx) {
  char p[512];
  write_records(ctx, tpath(p, "mt.rec"), 500, &(nb_data_rec_opts){4096, 3, NB_DATA_XXH3});
  nb_data_rec_reader *r = nb_data_rec_open(ctx, p);
  CHECK(r != NULL);
  if (!r) return;
  pthread_t th[4];
  reader_job jobs[4];
  for (int t = 0; t < 4; t++) {
    jobs[t] = (reader_job){ctx, r, t, 0};
    pthread_create(&th[t], NULL, reader_thread, &jobs[t]);
  }
  int bad = 0;
  for (int t = 0; t < 4; t++) pthread_join(th[t], NULL), bad += jobs[t].bad;
  CHECK_MSG(bad == 0, "%d concurrent reads differ", bad);
  nb_data_rec_close(r);
}

static void test_alloc_failures(void) {
  char p[512];
  tpath(p, "oom.rec");
  for (int n = 1; n < 400; n++) {
    nb_ctx *ctx = nb_ctx_create();
    nb_ctx_fail_alloc_after(ctx, n);
    nb_data_rec_writer *w = nb_data_rec_create(ctx, p, &(nb_data_rec_opts){256, 1, NB_DATA_XXH3});
    bool ok = w != NULL;
    uint8_t buf[300];
    for (int64_t i = 0; ok && i < 40; i++) {
      rec_bytes(i, buf);
      ok = nb_data_rec_write(w, buf, rec_len(i)) == NB_OK;
    }
    if (w) ok = nb_data_rec_finish(w) == NB_OK && ok;
    nb_data_rec_reader *r = ok ? nb_data_rec_open(ctx, p) : NULL;
    nb_data_elem e = NB_DATA_ELEM_INIT;
    ok = ok && r;
    for (int64_t i = 0; ok && i < 40; i++) ok = nb_data_rec_read(r, i, &e) == NB_OK && rec_matches(i, &e);
    nb_data_elem_clear(ctx, &e);
    nb_data_rec_close(r);
    if (!ok) CHECK_MSG(nb_ctx_status(ctx) == NB_ERR_NOMEM, "n=%d: %s", n, nb_ctx_error(ctx));
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "n=%d: %zu bytes leaked", n, nb_ctx_bytes_in_use(ctx));
    nb_ctx_fail_alloc_after(ctx, 0);
    nb_ctx_destroy(ctx);
    if (ok) break;
  }
}

int main(void) {
  tdir_make();
  nb_ctx *ctx = nb_ctx_create();
  test_crc32c();
  test_round_trip(ctx);
  test_empty_and_crash(ctx);
  test_corruption(ctx);
  test_threads(ctx);
  test_alloc_failures();
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes still allocated", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  tdir_remove();
  return nb_test_summary("data/test_records");
}
