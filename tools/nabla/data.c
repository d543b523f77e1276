/* `nabla data`: build record files and token shards from text, JSONL and
 * directories; inspect a file (counts, sizes, first records); verify every
 * checksum. Progress bars go to stderr when it is a terminal. The library
 * does the work (include/nabla/data.h); this file parses arguments. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"
#include "util/util.h"

static const char usage_text[] =
          "usage: nabla data build -o OUT [options] INPUT...   files or directories (.jsonl: one JSON object a line)\n"
          "         --format records|tokens   (default: tokens when OUT ends in .tok, else records)\n"
          "         --field NAME              JSONL field holding the text (default: text)\n"
          "         --unit line|file          text files: one document per line or per file\n"
          "                                   (default: line for records, file for tokens)\n"
          "         --keep-empty              keep empty documents\n"
          "         records: --chunk-bytes N (default 1048576), --zstd LEVEL (0 = none, default 3),\n"
          "                  --checksum xxh3|crc32c (default xxh3)\n"
          "         tokens:  --tokenizer bytes|FILE (bytes: ids = bytes, vocab 256, the default; FILE: tokenizer.json,\n"
          "                  a vocab.json+merges.txt directory or tokenizer.model), --token-bytes 2|4,\n"
          "                  --eos ID (appended after every document; default: the tokenizer's, none for bytes)\n"
          "       nabla data inspect FILE [--head N]         counts, sizes and the first N records (default 5)\n"
          "       nabla data verify FILE...                  check every checksum; exit 1 on the first bad file\n";

static bool help_asked;
static int usage(void) { return nb_cli_usage(usage_text, help_asked); }

/* ---- progress bar -------------------------------------------------------------- */

typedef struct bar {
  const char *label;
  int64_t t0;
  bool on;
} bar;

static void bar_update(void *ud, uint64_t done, uint64_t total) {
  bar *b = ud;
  if (!b->on) return;
  double frac = total ? (double)done / (double)total : 1, secs = (double)(nb_util__now_ns() - b->t0) * 1e-9;
  char cells[31];
  int full = (int)(frac * 30);
  for (int i = 0; i < 30; i++) cells[i] = i < full ? '#' : '.';
  cells[30] = 0;
  fprintf(stderr, "\r%s [%s] %3d%% %8.1f MB/s", b->label, cells, (int)(frac * 100),
          secs > 0 ? (double)done / secs / 1e6 : 0.0);
  if (done >= total) fputc('\n', stderr);
}

static bar bar_make(const char *label) { return (bar){label, nb_util__now_ns(), isatty(2) != 0}; }

/* ---- tokenizers -------------------------------------------------------------- */

/* The tokenizer named by spec. Built in: "bytes". This is the one place a
 * real tokenizer (BPE from tokenizer.json) plugs into the command. */
/* "bytes", or a tokenizer file/directory (tokenizer.json, vocab.json +
 * merges.txt, tokenizer.model); *loaded is set to what must be destroyed. */
static int open_tokenizer(nb_ctx *ctx, const char *spec, nb_data_tokenizer *out, nb_tok **loaded) {
  *loaded = NULL;
  if (!strcmp(spec, "bytes")) return *out = nb_data_tokenizer_bytes(), 0;
  if (!(*loaded = nb_tok_load(ctx, spec))) {
    fprintf(stderr, "nabla data: tokenizer '%s': %s (or use 'bytes')\n", spec, nb_ctx_error(ctx));
    return 2;
  }
  *out = nb_data_tokenizer_bpe(*loaded);
  return 0;
}

/* ---- build ---------------------------------------------------------------- */

static bool arg_int(const char *flag, const char *v, long long lo, long long hi, long long *out) {
  int64_t x;
  if (!nb_cli_int("data", flag, v, lo, hi, &x)) return false;
  *out = x;
  return true;
}

static int cmd_build(nb_ctx *ctx, int argc, char **argv) {
  const char *out = NULL, *format = NULL, *tokenizer = "bytes";
  nb_data_build_opts bo = {.jsonl_field = "text"};
  nb_data_rec_opts ro = {1 << 20, 3, NB_DATA_XXH3};
  long long token_bytes = 0, eos = -2, v;
  int unit = -1;
  const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
  int n_in = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = true;
    if (!strcmp(a, "-o") || !strcmp(a, "--out")) out = next;
    else if (!strcmp(a, "--format")) format = next;
    else if (!strcmp(a, "--field")) bo.jsonl_field = next;
    else if (!strcmp(a, "--tokenizer")) tokenizer = next;
    else if (!strcmp(a, "--unit")) {
      if (!next || (strcmp(next, "line") && strcmp(next, "file"))) return free(inputs), usage();
      unit = strcmp(next, "file") ? NB_DATA_UNIT_LINE : NB_DATA_UNIT_FILE;
    } else if (!strcmp(a, "--eos")) {
      if (!arg_int(a, next, -1, 2147483647LL, &eos)) return free(inputs), 2;
    } else if (!strcmp(a, "--chunk-bytes")) {
      if (!arg_int(a, next, 1, 1LL << 29, &v)) return free(inputs), 2;
      ro.chunk_bytes = (size_t)v;
    } else if (!strcmp(a, "--zstd")) {
      if (!arg_int(a, next, 0, 19, &v)) return free(inputs), 2;
      ro.zstd_level = (int)v;
    } else if (!strcmp(a, "--token-bytes")) {
      if (!arg_int(a, next, 2, 4, &token_bytes)) return free(inputs), 2;
      if (token_bytes == 3) return fprintf(stderr, "nabla data: --token-bytes is 2 or 4\n"), free(inputs), 2;
    } else if (!strcmp(a, "--checksum")) {
      if (!next || !nb_data_checksum_from_name(next, &ro.checksum)) return free(inputs), usage();
    } else if (!strcmp(a, "--keep-empty")) bo.keep_empty = true, takes = false;
    else if (a[0] == '-' && a[1]) return fprintf(stderr, "nabla data: unknown option '%s'\n", a), free(inputs), usage();
    else inputs[n_in++] = a, takes = false;
    if (takes && !next) return fprintf(stderr, "nabla data: %s needs a value\n", a), free(inputs), 2;
    if (takes) i++;
  }
  if (!out || !n_in) return free(inputs), usage();
  if (!nb_cli_output_ok("data build", out, false, n_in, inputs)) return free(inputs), 2;
  size_t ol = strlen(out);
  if (!format) format = ol > 4 && !strcmp(out + ol - 4, ".tok") ? "tokens" : "records";
  bool tokens = !strcmp(format, "tokens");
  bo.unit = unit >= 0 ? (nb_data_unit)unit : tokens ? NB_DATA_UNIT_FILE : NB_DATA_UNIT_LINE;
  bar b = bar_make("build");
  bo.progress = bar_update;
  bo.progress_ud = &b;
  int64_t n = 0;
  nb_status s;
  if (tokens) {
    nb_data_tokenizer tok;
    nb_tok *bpe;
    int rc = open_tokenizer(ctx, tokenizer, &tok, &bpe);
    if (rc) return free(inputs), rc;
    if (eos != -2) tok.eos_id = (int32_t)eos;
    s = nb_data_build_shard(ctx, out, n_in, inputs, &bo, &tok, (int)token_bytes, &n);
    nb_tok_destroy(bpe);
    if (!s) printf("wrote %s: %lld tokens\n", out, (long long)n);
  } else if (!strcmp(format, "records")) {
    s = nb_data_build_records(ctx, out, n_in, inputs, &bo, &ro, &n);
    if (!s) printf("wrote %s: %lld records\n", out, (long long)n);
  } else {
    free(inputs);
    return fprintf(stderr, "nabla data: unknown format '%s' (records or tokens)\n", format), 2;
  }
  free(inputs);
  if (s) fprintf(stderr, "nabla data: %s\n", nb_ctx_error(ctx));
  return s ? 1 : 0;
}

/* ---- inspect -------------------------------------------------------------- */

/* Prints up to 120 characters of data, escaping what is not printable. */
static void print_escaped(const uint8_t *p, size_t n) {
  size_t shown = 0;
  for (size_t i = 0; i < n && shown < 120; i++, shown++) {
    if (p[i] == '\n') fputs("\\n", stdout);
    else if (p[i] == '\t') fputs("\\t", stdout);
    else if (p[i] == '\\') fputs("\\\\", stdout);
    else if (isprint(p[i])) putchar(p[i]);
    else printf("\\x%02x", p[i]);
  }
  if (n > 120) printf("... (%zu bytes)", n);
  putchar('\n');
}

static int inspect_records(nb_ctx *ctx, const char *path, long long head) {
  nb_data_rec_reader *r = nb_data_rec_open(ctx, path);
  if (!r) return fprintf(stderr, "nabla data inspect: %s\n", nb_ctx_error(ctx)), 1;
  nb_data_rec_info in;
  nb_data_rec_get_info(r, &in);
  printf("record file %s (version %u)\n", path, in.version);
  printf("  records            %lld\n  chunks             %lld (%lld zstd-compressed)\n", (long long)in.records,
         (long long)in.chunks, (long long)in.compressed_chunks);
  printf("  checksum           %s\n  file bytes         %llu\n  payload bytes      %llu raw, %llu stored (%.2fx)\n",
         nb_data_checksum_name(in.checksum), (unsigned long long)in.file_bytes, (unsigned long long)in.raw_bytes,
         (unsigned long long)in.stored_bytes, in.stored_bytes ? (double)in.raw_bytes / (double)in.stored_bytes : 1.0);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  size_t mn = SIZE_MAX, mx = 0;
  double sum = 0;
  bar b = bar_make("scan");
  nb_status s = NB_OK;
  for (int64_t i = 0; !s && i < in.records; i++) {
    s = nb_data_rec_read(r, i, &e);
    if (s) break;
    mn = e.len < mn ? e.len : mn;
    mx = e.len > mx ? e.len : mx;
    sum += (double)e.len;
    if ((i & 4095) == 4095 || i + 1 == in.records) bar_update(&b, (uint64_t)i + 1, (uint64_t)in.records);
  }
  if (!s && in.records)
    printf("  record bytes       min %zu, mean %.1f, max %zu\n", mn, sum / (double)in.records, mx);
  for (int64_t i = 0; !s && i < head && i < in.records; i++) {
    s = nb_data_rec_read(r, i, &e);
    if (!s) printf("  [%lld] ", (long long)i), print_escaped(e.bytes, e.len);
  }
  nb_data_elem_clear(ctx, &e);
  nb_data_rec_close(r);
  if (s) fprintf(stderr, "nabla data inspect: %s\n", nb_ctx_error(ctx));
  return s ? 1 : 0;
}

static int inspect_shard(nb_ctx *ctx, const char *path, long long head) {
  nb_data_shard *sh = nb_data_shard_open(ctx, path);
  if (!sh) return fprintf(stderr, "nabla data inspect: %s\n", nb_ctx_error(ctx)), 1;
  int64_t n = nb_data_shard_count(sh), lo = INT64_MAX, hi = -1;
  printf("token shard %s\n  tokens             %lld\n  documents          %lld\n  vocab size         %lld\n"
         "  token bytes        %d\n", path, (long long)n, (long long)nb_data_shard_documents(sh),
         (long long)nb_data_shard_vocab(sh), nb_data_shard_token_bytes(sh));
  int32_t buf[4096];
  bar b = bar_make("scan");
  for (int64_t at = 0; at < n; at += 4096) {
    int64_t k = n - at < 4096 ? n - at : 4096;
    nb_data_shard_read(sh, at, k, buf);
    for (int64_t i = 0; i < k; i++) lo = buf[i] < lo ? buf[i] : lo, hi = buf[i] > hi ? buf[i] : hi;
    if (((at >> 12) & 255) == 255 || at + k == n) bar_update(&b, (uint64_t)(at + k), (uint64_t)n);
  }
  if (n) printf("  token ids          min %lld, max %lld\n", (long long)lo, (long long)hi);
  int64_t show = head * 16 < n ? head * 16 : n;
  if (show > 4096) show = 4096;
  nb_data_shard_read(sh, 0, show, buf);
  printf("  first %lld ids     ", (long long)show);
  for (int64_t i = 0; i < show; i++) printf(" %d", buf[i]);
  putchar('\n');
  if (nb_data_shard_vocab(sh) <= 256) {
    uint8_t txt[4096];
    for (int64_t i = 0; i < show; i++) txt[i] = (uint8_t)buf[i];
    printf("  as bytes           ");
    print_escaped(txt, (size_t)show);
  }
  nb_data_shard_close(sh);
  return 0;
}

/* "records", "tokens" or NULL (after printing why) from the file's magic
 * (nb_data_detect_format). */
static const char *file_kind(nb_ctx *ctx, const char *path) {
  nb_data_format f;
  if (nb_data_detect_format(ctx, path, &f)) return fprintf(stderr, "nabla data: %s\n", nb_ctx_error(ctx)), NULL;
  if (f == NB_DATA_FORMAT_RECORDS) return "records";
  if (f == NB_DATA_FORMAT_TOKENS) return "tokens";
  fprintf(stderr, "nabla data: '%s' is %s, neither a record file nor a token shard\n", path, nb_data_format_name(f));
  return NULL;
}

static int cmd_inspect(nb_ctx *ctx, int argc, char **argv) {
  const char *path = NULL;
  long long head = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--head")) {
      if (!arg_int("--head", i + 1 < argc ? argv[i + 1] : NULL, 0, 1000000, &head)) return 2;
      i++;
    } else if (!path) path = argv[i];
    else return usage();
  }
  if (!path) return usage();
  const char *kind = file_kind(ctx, path);
  if (!kind) return 1;
  return !strcmp(kind, "records") ? inspect_records(ctx, path, head) : inspect_shard(ctx, path, head);
}

/* ---- verify ---------------------------------------------------------------- */

static int cmd_verify(nb_ctx *ctx, int argc, char **argv) {
  if (argc < 2) return usage();
  for (int i = 1; i < argc; i++) {
    const char *kind = file_kind(ctx, argv[i]);
    if (!kind) return 1;
    bar b = bar_make("verify");
    nb_status s;
    int64_t count = 0;
    if (!strcmp(kind, "records")) {
      nb_data_rec_reader *r = nb_data_rec_open(ctx, argv[i]);
      s = r ? nb_data_rec_verify(r, bar_update, &b) : nb_ctx_status(ctx);
      if (r) count = nb_data_rec_count(r);
      nb_data_rec_close(r);
    } else {
      nb_data_shard *sh = nb_data_shard_open(ctx, argv[i]);
      s = sh ? nb_data_shard_verify(sh, bar_update, &b) : nb_ctx_status(ctx);
      if (sh) count = nb_data_shard_count(sh);
      nb_data_shard_close(sh);
    }
    if (s) return fprintf(stderr, "nabla data verify: %s\n", nb_ctx_error(ctx)), 1;
    printf("ok %s (%lld %s)\n", argv[i], (long long)count, !strcmp(kind, "records") ? "records" : "tokens");
  }
  return 0;
}

int nb_cmd_data(int argc, char **argv) {
  help_asked = nb_cli_help_asked(argc, argv);
  if (argc < 2 || help_asked) return usage();
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  int rc;
  if (!strcmp(argv[1], "build")) rc = cmd_build(ctx, argc - 1, argv + 1);
  else if (!strcmp(argv[1], "inspect")) rc = cmd_inspect(ctx, argc - 1, argv + 1);
  else if (!strcmp(argv[1], "verify")) rc = cmd_verify(ctx, argc - 1, argv + 1);
  else rc = (fprintf(stderr, "nabla data: unknown subcommand '%s'\n", argv[1]), usage());
  nb_ctx_destroy(ctx);
  return rc;
}
