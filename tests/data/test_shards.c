/* Token shards: uint16 and uint32 round trips, vocab checks, rejection of
 * crashed, truncated and corrupted shards, the window source over several
 * shards, and building shards and record files from text, JSONL and
 * directories with the byte-level tokenizer and a custom one. */
#include "data_util.h"

static void write_shard(nb_ctx *ctx, const char *path, int tb, int64_t vocab, int64_t n, int64_t base) {
  nb_data_shard_writer *w = nb_data_shard_create(ctx, path, tb, vocab);
  CHECK(w != NULL);
  for (int64_t i = 0; w && i < n; i++) {
    int32_t id = (int32_t)((base + i) % vocab);
    if (nb_data_shard_write(w, &id, 1) != NB_OK) CHECK_OK(ctx, nb_ctx_status(ctx));
    if (i % 10 == 9) nb_data_shard_end_document(w);
  }
  if (w) CHECK_OK(ctx, nb_data_shard_finish(w));
}

static void test_round_trip(nb_ctx *ctx) {
  char p[512];
  int64_t vocabs[2] = {50000, 100000};
  for (int k = 0; k < 2; k++) {
    write_shard(ctx, tpath(p, "a.tok"), 0, vocabs[k], 100000, 7);
    nb_data_shard *s = nb_data_shard_open(ctx, p);
    CHECK_MSG(s != NULL, "%s", nb_ctx_error(ctx));
    if (!s) continue;
    CHECK(nb_data_shard_count(s) == 100000 && nb_data_shard_vocab(s) == vocabs[k]);
    CHECK(nb_data_shard_token_bytes(s) == (k ? 4 : 2) && nb_data_shard_documents(s) == 10000);
    CHECK(file_size(p) == 64 + 100000L * (k ? 4 : 2));
    int32_t buf[100];
    CHECK_OK(ctx, nb_data_shard_read(s, 99900, 100, buf));
    int bad = 0;
    for (int i = 0; i < 100; i++) bad += buf[i] != (int32_t)((7 + 99900 + i) % vocabs[k]);
    CHECK(bad == 0);
    CHECK(nb_data_shard_read(s, 99950, 100, buf) == NB_ERR_INVALID_ARG);
    CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "out of range");
    CHECK_OK(ctx, nb_data_shard_verify(s, NULL, NULL));
    nb_data_shard_close(s);
  }
  /* ids outside the vocab, widths that cannot hold it */
  nb_data_shard_writer *w = nb_data_shard_create(ctx, tpath(p, "v.tok"), 2, 100);
  int32_t ids[3] = {1, 100, 2};
  CHECK(nb_data_shard_write(w, ids, 3) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "token id 100 at position 1");
  CHECK_OK(ctx, nb_data_shard_finish(w));
  nb_data_shard *s = nb_data_shard_open(ctx, p);
  CHECK(s && nb_data_shard_count(s) == 0);
  nb_data_shard_close(s);
  CHECK(nb_data_shard_create(ctx, p, 2, 70000) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "cannot hold vocab");
}

static void test_bad_shards(nb_ctx *ctx) {
  char p[512], q[512];
  write_shard(ctx, tpath(p, "good.tok"), 2, 1000, 5000, 0);
  nb_data_shard_writer *w = nb_data_shard_create(ctx, tpath(q, "crash.tok"), 2, 1000);
  int32_t ids[100] = {0};
  nb_data_shard_write(w, ids, 100);
  nb_data_shard_abandon(w);
  CHECK(nb_data_shard_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "did not finish");
  copy_file(p, q);
  truncate_to(q, file_size(q) - 2);
  CHECK(nb_data_shard_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "truncated");
  copy_file(p, q);
  nb_test_flip_byte(q, 20);
  CHECK(nb_data_shard_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "header checksum");
  copy_file(p, q);
  nb_test_flip_byte(q, 64 + 2 * 1234);
  nb_data_shard *s = nb_data_shard_open(ctx, q);
  CHECK(s != NULL);
  if (s) {
    CHECK(nb_data_shard_verify(s, NULL, NULL) == NB_ERR_FORMAT);
    CHECK_ERR(ctx, NB_ERR_FORMAT, "data checksum mismatch");
    nb_data_shard_close(s);
  }
  nb_test_write_text(q, "hello");
  CHECK(nb_data_shard_open(ctx, q) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "not a token shard");
}

static void test_windows(nb_ctx *ctx) {
  char p1[512], p2[512], p3[512];
  write_shard(ctx, tpath(p1, "w1.tok"), 2, 60000, 1001, 0);   /* (1001-1)/10 = 100 windows */
  write_shard(ctx, tpath(p2, "w2.tok"), 4, 60000, 5, 5000);   /* too short: none */
  write_shard(ctx, tpath(p3, "w3.tok"), 2, 60000, 25, 20000); /* 2 windows */
  const char *paths[3] = {p1, p2, p3};
  nb_data_map *ds = nb_data_map_tokens(ctx, 3, paths, 10);
  CHECK(ds && nb_data_map_len(ds) == 102);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  int64_t probes[4] = {0, 99, 100, 101};
  int64_t firsts[4] = {0, 990, 20000, 20010};
  for (int k = 0; ds && k < 4; k++) {
    CHECK_OK(ctx, nb_data_map_get(ds, probes[k], &e));
    nb_array *a = e.kind == NB_DATA_TREE ? nb_tree_get_array(e.tree, "tokens") : NULL;
    CHECK(a && nb_array_dtype(a) == NB_I32 && nb_array_size(a) == 11);
    if (a) CHECK_MSG(nb_array_get(a, 0) == firsts[k] && nb_array_get(a, 10) == firsts[k] + 10, "window %lld",
                     (long long)probes[k]);
  }
  CHECK_OK(ctx, nb_data_map_get(ds, 102 + 99, &e)); /* the next epoch wraps */
  CHECK(nb_array_get(nb_tree_get_array(e.tree, "tokens"), 0) == 990);
  /* lm_targets splits [T+1] into inputs/targets */
  CHECK_OK(ctx, nb_data_fn_lm_targets(NULL, ctx, &e));
  nb_array *in = nb_tree_get_array(e.tree, "inputs"), *tg = nb_tree_get_array(e.tree, "targets");
  CHECK(in && tg && nb_array_size(in) == 10 && nb_array_get(in, 0) == 990 && nb_array_get(tg, 0) == 991 &&
        nb_array_get(tg, 9) == 1000 && !nb_tree_get_array(e.tree, "tokens"));
  nb_data_elem_clear(ctx, &e);
  nb_data_map_release(ds);
  CHECK(nb_data_map_tokens(ctx, 1, (const char *[]){"/nonexistent.tok"}, 10) == NULL);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "nonexistent.tok");
}

/* A toy tokenizer: one id per word (its length), eos 99. */
static nb_status word_encode(void *ud, nb_ctx *ctx, const char *text, size_t len, nb_data_ids *out) {
  (void)ud, (void)ctx;
  size_t i = 0;
  while (i < len) {
    while (i < len && strchr(" \r\n", text[i])) i++;
    size_t j = i;
    while (j < len && !strchr(" \r\n", text[j])) j++;
    int32_t id = (int32_t)(j - i);
    if (j > i && nb_data_ids_push(out, &id, 1)) return NB_ERR_NOMEM;
    i = j;
  }
  return NB_OK;
}

static void test_build(nb_ctx *ctx) {
  char d[512], p[512], out[512];
  tpath(d, "corpus");
  mkdir(d, 0755);
  nb_test_write_text(tpath(p, "corpus/b.txt"), "hello world\r\n\nsecond line\n");
  nb_test_write_text(tpath(p, "corpus/a.jsonl"), "{\"text\": \"abc\", \"id\": 1}\n\n{\"text\": \"de\"}\n");
  nb_test_write_text(tpath(p, "corpus/.hidden"), "never read");
  const char *inputs[1] = {d};
  int64_t n = 0;
  CHECK_OK(ctx, nb_data_build_shard(ctx, tpath(out, "b.tok"), 1, inputs, NULL, NULL, 0, &n));
  CHECK(n == 3 + 2 + 11 + 11); /* a.jsonl first (sorted), then b.txt's two non-empty lines */
  nb_data_shard *s = nb_data_shard_open(ctx, out);
  int32_t ids[27];
  CHECK(s && nb_data_shard_vocab(s) == 256 && nb_data_shard_documents(s) == 4);
  if (s) CHECK_OK(ctx, nb_data_shard_read(s, 0, 27, ids));
  CHECK(ids[0] == 'a' && ids[3] == 'd' && ids[5] == 'h' && ids[15] == 'd' && ids[16] == 's');
  nb_data_shard_close(s);
  nb_data_tokenizer tok = {word_encode, NULL, 100, 99};
  nb_data_build_opts o = {.unit = NB_DATA_UNIT_FILE};
  CHECK_OK(ctx, nb_data_build_shard(ctx, out, 1, (const char *[]){tpath(p, "corpus/a.jsonl")}, &o, &tok, 0, &n));
  CHECK(n == 4);
  inputs[0] = tpath(p, "corpus/b.txt");
  CHECK_OK(ctx, nb_data_build_shard(ctx, out, 1, inputs, &o, &tok, 0, &n)); /* whole file: 4 words + eos */
  CHECK(n == 5);
  /* records from text lines, then a bad JSONL file */
  CHECK_OK(ctx, nb_data_build_records(ctx, tpath(out, "b.rec"), 1, (const char *[]){d}, NULL, NULL, &n));
  CHECK(n == 4);
  nb_data_rec_reader *r = nb_data_rec_open(ctx, out);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  CHECK(r && nb_data_rec_read(r, 2, &e) == NB_OK && e.len == 11 && !memcmp(e.bytes, "hello world", 11));
  nb_data_elem_clear(ctx, &e);
  nb_data_rec_close(r);
  nb_test_write_text(tpath(p, "bad.jsonl"), "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
  CHECK(nb_data_build_records(ctx, out, 1, (const char *[]){p}, NULL, NULL, &n) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "bad.jsonl' line 2: no string field 'text'");
  CHECK(nb_data_rec_open(ctx, out) == NULL); /* the failed build left no valid file */
  nb_ctx_clear_error(ctx);
  CHECK(nb_data_build_shard(ctx, tpath(out, "bad.tok"), 1, (const char *[]){p}, NULL, NULL, 0, &n) == NB_ERR_FORMAT);
  CHECK(nb_data_shard_open(ctx, out) == NULL);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "did not finish");
  CHECK(nb_data_build_records(ctx, out, 1, (const char *[]){"/nonexistent/dir"}, NULL, NULL, &n) == NB_ERR_NOT_FOUND);
  nb_ctx_clear_error(ctx);
}

/* Files are told by their magic bytes, not their names: a token shard or
 * record file among a build's inputs (whatever it is called) is refused. */
static void test_formats_by_magic(nb_ctx *ctx) {
  char d[512], p[512], q[512], out[512];
  tpath(d, "magic");
  mkdir(d, 0755);
  nb_test_write_text(tpath(p, "magic/notes.txt"), "plain text\n");
  write_shard(ctx, tpath(q, "magic/zz.txt"), 2, 300, 50, 0); /* a shard named like text */
  struct {
    const char *name;
    nb_data_format want;
  } cases[] = {{"magic", NB_DATA_FORMAT_DIR}, {"magic/notes.txt", NB_DATA_FORMAT_TEXT}, {"magic/zz.txt", NB_DATA_FORMAT_TOKENS}};
  for (int i = 0; i < 3; i++) {
    nb_data_format f = NB_DATA_FORMAT_BINARY;
    CHECK_OK(ctx, nb_data_detect_format(ctx, tpath(p, cases[i].name), &f));
    CHECK_MSG(f == cases[i].want, "%s: %s", cases[i].name, nb_data_format_name(f));
  }
  CHECK_OK(ctx, nb_data_build_records(ctx, tpath(out, "magic.rec"), 1, (const char *[]){tpath(p, "magic/notes.txt")},
                                      NULL, NULL, NULL));
  nb_data_format f;
  CHECK_OK(ctx, nb_data_detect_format(ctx, out, &f));
  CHECK(f == NB_DATA_FORMAT_RECORDS);
  nb_test_write_file(tpath(p, "magic.bin"), "ab\0cd", 5);
  CHECK_OK(ctx, nb_data_detect_format(ctx, p, &f));
  CHECK(f == NB_DATA_FORMAT_BINARY);
  CHECK(nb_data_detect_format(ctx, tpath(p, "magic/none"), &f) == NB_ERR_NOT_FOUND);
  CHECK_ERR(ctx, NB_ERR_NOT_FOUND, "magic/none'");
  /* building from the directory reaches zz.txt: refused, naming it */
  CHECK(nb_data_build_shard(ctx, tpath(out, "magic.tok"), 1, (const char *[]){d}, NULL, NULL, 0, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "zz.txt' is a token shard, not text");
  CHECK(nb_data_build_records(ctx, tpath(out, "magic2.rec"), 1, (const char *[]){tpath(p, "magic.rec")}, NULL, NULL,
                              NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "magic.rec' is a record file, not text");
}

int main(void) {
  tdir_make();
  nb_ctx *ctx = nb_ctx_create();
  test_round_trip(ctx);
  test_bad_shards(ctx);
  test_windows(ctx);
  test_build(ctx);
  test_formats_by_magic(ctx);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == 0, "%zu bytes still allocated", nb_ctx_bytes_in_use(ctx));
  nb_ctx_destroy(ctx);
  tdir_remove();
  return nb_test_summary("data/test_shards");
}
