/* `nabla tok`: train, encode, decode and inspect BPE tokenizers.
 *   nabla tok train --vocab-size N --out DIR [--pattern gpt2|cl100k|REGEX]
 *                   [--special TOKEN]... [--min-frequency N] FILES...
 *   nabla tok encode TOKENIZER [--no-special|--error-special] [FILE|-]   ids, one line
 *   nabla tok decode TOKENIZER [--skip-special] [FILE|-]                 ids in, bytes out
 *   nabla tok info TOKENIZER
 * TOKENIZER is a tokenizer.json, a tokenizer.model, or a directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "nabla/nabla.h"
#include "util/util.h"

static const char usage_text[] =
          "usage: nabla tok train --vocab-size N --out DIR [--pattern gpt2|cl100k|REGEX] [--special TOK]...\n"
          "                       [--min-frequency N] FILE...\n"
          "       nabla tok encode TOKENIZER [--no-special | --error-special] [FILE|-]\n"
          "       nabla tok decode TOKENIZER [--skip-special] [FILE|-]\n"
          "       nabla tok info TOKENIZER\n";

static bool help_asked;
static int usage(void) { return nb_cli_usage(usage_text, help_asked); }

static int fail(nb_ctx *ctx) {
  fprintf(stderr, "nabla tok: %s\n", nb_ctx_error(ctx));
  nb_ctx_destroy(ctx);
  return 1;
}

static int cmd_train(int argc, char **argv) {
  nb_tok_train_opts o = {0};
  const char *out = NULL, *special[64];
  int n_special = 0, first_file = -1;
  o.pattern = NB_TOK_PATTERN_GPT2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t x;
    if (!strcmp(a, "--vocab-size")) {
      if (!nb_cli_int("tok train", a, v, 1, INT32_MAX, &x)) return 2;
      o.vocab_size = (int32_t)x, i++;
    } else if (!strcmp(a, "--out") && v) out = argv[++i];
    else if (!strcmp(a, "--min-frequency")) {
      if (!nb_cli_int("tok train", a, v, 0, INT64_MAX, &x)) return 2;
      o.min_frequency = x, i++;
    }
    else if (!strcmp(a, "--pattern") && v) {
      i++;
      o.pattern = !strcmp(v, "gpt2") ? NB_TOK_PATTERN_GPT2 : !strcmp(v, "cl100k") || !strcmp(v, "llama3") ? NB_TOK_PATTERN_CL100K : v;
    } else if (!strcmp(a, "--special") && v && n_special < 64) special[n_special++] = argv[++i];
    else if (a[0] == '-' && a[1]) return usage();
    else { first_file = i; break; }
  }
  if (!out || o.vocab_size <= 0 || first_file < 0) return usage();
  char path[4096];
  if (snprintf(path, sizeof path, "%s/tokenizer.json", out) >= (int)sizeof path)
    return fprintf(stderr, "nabla tok train: --out path too long\n"), 2;
  if (!nb_cli_output_ok("tok train", path, false, argc - first_file, (const char *const *)argv + first_file)) return 2;
  o.special = special;
  o.n_special = n_special;
  nb_ctx *ctx = nb_ctx_create();
  nb_tok_trainer *tr = nb_tok_trainer_create(ctx, &o);
  if (!tr) return fail(ctx);
  for (int i = first_file; i < argc; i++) {
    size_t n;
    char *text = nb_cli_read_input("tok train", argv[i], &n);
    if (!text) {
      nb_tok_trainer_destroy(tr);
      nb_ctx_destroy(ctx);
      return 1;
    }
    nb_status s = nb_tok_trainer_feed(tr, text, n);
    free(text);
    if (s) {
      nb_tok_trainer_destroy(tr);
      return fail(ctx);
    }
  }
  nb_tok *t = nb_tok_trainer_finish(tr);
  nb_tok_trainer_destroy(tr);
  if (!t) return fail(ctx);
  nb_util__mkdir_p(out, 0777, NULL, NULL, 0); /* nb_tok_save_hf reports what fails */
  if (nb_tok_save_hf(t, path)) {
    nb_tok_destroy(t);
    return fail(ctx);
  }
  printf("wrote %s: %d tokens, %d merges\n", path, nb_tok_vocab_size(t), nb_tok_num_merges(t));
  nb_tok_destroy(t);
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_encode(int argc, char **argv, bool decode) {
  if (argc < 2) return usage();
  nb_tok_encode_opts eo = {.special = NB_TOK_SPECIAL_ALLOW};
  nb_tok_decode_opts dopt = {false};
  const char *file = NULL;
  for (int i = 2; i < argc; i++) {
    if (!decode && !strcmp(argv[i], "--no-special")) eo.special = NB_TOK_SPECIAL_AS_TEXT;
    else if (!decode && !strcmp(argv[i], "--error-special")) eo.special = NB_TOK_SPECIAL_ERROR;
    else if (decode && !strcmp(argv[i], "--skip-special")) dopt.skip_special = true;
    else if (!file && (argv[i][0] != '-' || !strcmp(argv[i], "-"))) file = argv[i];
    else return usage();
  }
  nb_ctx *ctx = nb_ctx_create();
  nb_tok *t = nb_tok_load(ctx, argv[1]);
  if (!t) return fail(ctx);
  size_t n;
  char *text = nb_cli_read_input(decode ? "tok decode" : "tok encode", file, &n);
  if (!text) {
    nb_tok_destroy(t);
    nb_ctx_destroy(ctx);
    return 1;
  }
  nb_status s = NB_OK;
  if (!decode && !s) {
    nb_tok_ids ids = {0};
    s = nb_tok_encode(t, text, n, &eo, &ids);
    for (size_t i = 0; !s && i < ids.len; i++) printf(i ? " %d" : "%d", ids.ids[i]);
    if (!s) printf("\n");
    nb_tok_ids_free(t, &ids);
  } else if (!s) {
    int32_t *ids = NULL;
    size_t k = 0, cap = 0;
    char *p = text, *end = text + n;
    while (p < end) {
      if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') { p++; continue; }
      size_t len = strcspn(p, " \n\t\r,");
      char word[32], why[160];
      int64_t v;
      snprintf(word, sizeof word, "%.*s", (int)(len < sizeof word - 1 ? len : sizeof word - 1), p);
      if (len >= sizeof word - 1 || !nb_parse_int(word, 0, INT32_MAX, &v, why, sizeof why)) {
        s = nb_errorf(ctx, NB_ERR_FORMAT, "decode input: byte %td: %s", p - text,
                      len >= sizeof word - 1 ? "not an id (too long)" : why);
        break;
      }
      if (k == cap) {
        int32_t *grown = realloc(ids, (cap = cap ? cap * 2 : 1024) * sizeof *ids);
        if (!grown) {
          s = nb_errorf(ctx, NB_ERR_NOMEM, "decode input: out of memory");
          break;
        }
        ids = grown;
      }
      ids[k++] = (int32_t)v;
      p += len;
    }
    nb_tok_text out = {0};
    if (!s) s = nb_tok_decode(t, ids, k, &dopt, &out);
    if (!s) fwrite(out.data, 1, out.len, stdout);
    nb_tok_text_free(t, &out);
    free(ids);
  }
  free(text);
  nb_tok_destroy(t);
  if (s) return fail(ctx);
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_info(int argc, char **argv) {
  if (argc != 2) return usage();
  nb_ctx *ctx = nb_ctx_create();
  nb_tok *t = nb_tok_load(ctx, argv[1]);
  if (!t) return fail(ctx);
  printf("kind: %s\n", nb_tok_get_kind(t) == NB_TOK_BYTE_LEVEL ? "byte-level" : "char-level (SentencePiece style)");
  printf("vocab size: %d\nmerges: %d\nall 256 bytes: %s\n", nb_tok_vocab_size(t), nb_tok_num_merges(t),
         nb_tok_covers_all_bytes(t) ? "yes" : "no");
  printf("pattern: %s\n", nb_tok_pattern(t) ? nb_tok_pattern(t) : "(none)");
  printf("added tokens: %d\n", nb_tok_num_added(t));
  for (int32_t i = 0; i < nb_tok_num_added(t) && i < 20; i++) {
    int32_t id = nb_tok_added_at(t, i);
    size_t len;
    const uint8_t *b = nb_tok_token_bytes(t, id, &len);
    printf("  %d %.*s%s\n", id, (int)len, (const char *)b, nb_tok_is_special(t, id) ? " (special)" : "");
  }
  nb_tok_destroy(t);
  nb_ctx_destroy(ctx);
  return 0;
}

int nb_cmd_tok(int argc, char **argv) {
  help_asked = nb_cli_help_asked(argc, argv);
  if (argc < 2 || help_asked) return usage();
  if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(argv[1], "encode")) return cmd_encode(argc - 1, argv + 1, false);
  if (!strcmp(argv[1], "decode")) return cmd_encode(argc - 1, argv + 1, true);
  if (!strcmp(argv[1], "info")) return cmd_info(argc - 1, argv + 1);
  fprintf(stderr, "nabla tok: unknown subcommand '%s'\n", argv[1]);
  return usage();
}
