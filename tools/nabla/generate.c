/* `nabla generate`: sample text from a trained nabla run (its directory or
 * one checkpoint step) or a Hugging Face Llama-architecture folder, with
 * the KV-cached generator of the models library. Text streams to stdout as
 * tokens arrive (an incomplete UTF-8 sequence is held back until its last
 * byte comes); timings go to stderr at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
          "usage: nabla generate (--run-dir DIR | --checkpoint STEP_DIR | --hf DIR) --prompt TEXT [options]\n"
          "  --run-dir DIR        a nabla run: DIR/config.yaml and the latest step of DIR/checkpoints\n"
          "  --checkpoint DIR     one checkpoint step (config: DIR/../../config.yaml, or --config)\n"
          "  --hf DIR             a Hugging Face Llama folder (config.json, safetensors, tokenizer.json)\n"
          "  --config FILE        the run config for --run-dir / --checkpoint\n"
          "  --prompt TEXT        the text to continue\n"
          "  --max-tokens N       new tokens at most (default 128)\n"
          "  --temperature T      0 is greedy (default 0.8)\n"
          "  --top-k K            keep the K most likely tokens (default 0: off)\n"
          "  --top-p P            nucleus sampling (default 1: off)\n"
          "  --seed S             the sampling seed (default 0); a run is reproducible\n"
          "  --max-seq-len N      context bound for prompt + output (default: prompt + max tokens\n"
          "                       rounded up to a power of two >= 256, at most the model's)\n"
          "  --prefill-chunk N    prompt tokens per prefill call (default 64)\n"
          "  --no-bos             do not prepend the model's beginning-of-text token\n"
          "  --show-ids           print the prompt and generated token ids to stderr\n"
          "  --threads N          compute threads (default: all CPUs)\n";

static int usage(void) { return nb_cli_usage(usage_text, false); }

typedef struct options {
  const char *run_dir, *checkpoint, *hf, *config, *prompt;
  int64_t max_tokens, top_k, max_seq_len, chunk;
  double temperature, top_p;
  uint64_t seed;
  bool no_bos, show_ids;
  int threads;
} options;

/* 0 ok, 2 usage */
static int parse(int argc, char **argv, options *o) {
  *o = (options){.max_tokens = 128, .temperature = 0.8, .top_p = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t n = 0;
    bool ok = true;
    if (!strcmp(a, "--no-bos")) o->no_bos = true;
    else if (!strcmp(a, "--show-ids")) o->show_ids = true;
    else if (!v && a[0] == '-' && a[1] == '-') return fprintf(stderr, "nabla generate: %s needs a value\n", a), usage();
    else if (!strcmp(a, "--run-dir")) o->run_dir = v;
    else if (!strcmp(a, "--checkpoint")) o->checkpoint = v;
    else if (!strcmp(a, "--hf")) o->hf = v;
    else if (!strcmp(a, "--config")) o->config = v;
    else if (!strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--max-tokens")) ok = nb_cli_int("generate", a, v, 0, 1000000000, &o->max_tokens);
    else if (!strcmp(a, "--temperature")) ok = nb_cli_float("generate", a, v, 0, 1e6, &o->temperature);
    else if (!strcmp(a, "--top-k")) ok = nb_cli_int("generate", a, v, 0, 1000000000, &o->top_k);
    else if (!strcmp(a, "--top-p")) ok = nb_cli_float("generate", a, v, 0, 1, &o->top_p);
    else if (!strcmp(a, "--seed")) ok = nb_cli_int("generate", a, v, 0, INT64_MAX, &n), o->seed = (uint64_t)n;
    else if (!strcmp(a, "--max-seq-len")) ok = nb_cli_int("generate", a, v, 2, 1000000000, &o->max_seq_len);
    else if (!strcmp(a, "--prefill-chunk")) ok = nb_cli_int("generate", a, v, 1, 1000000, &o->chunk);
    else if (!strcmp(a, "--threads")) ok = nb_cli_int("generate", a, v, 1, 4096, &n), o->threads = (int)n;
    else return fprintf(stderr, "nabla generate: unknown argument '%s'\n", a), usage();
    if (!ok) return 2;
    if (strcmp(a, "--no-bos") && strcmp(a, "--show-ids")) i++;
  }
  int sources = !!o->run_dir + !!o->checkpoint + !!o->hf;
  if (sources != 1) return fprintf(stderr, "nabla generate: give exactly one of --run-dir, --checkpoint, --hf\n"), usage();
  if (!o->prompt) return fprintf(stderr, "nabla generate: --prompt is required\n"), usage();
  if (o->config && o->hf) return fprintf(stderr, "nabla generate: --config goes with --run-dir or --checkpoint\n"), usage();
  return 0;
}

/* ---------------------------------------------------------------- streaming text */

typedef struct stream {
  const nb_tok *tok;  /* NULL: token i is byte i */
  int32_t prev;       /* the previous token, for context-dependent decoders */
  nb_tok_text a, b;   /* scratch */
  char pending[64];   /* bytes of an incomplete UTF-8 sequence */
  size_t n_pending;
  bool failed;
} stream;

/* The length of s[0..n) without a trailing UTF-8 sequence that is valid so
 * far but incomplete (it waits for its next bytes). */
static size_t complete_prefix(const unsigned char *s, size_t n) {
  for (size_t k = 1; k <= 3 && k <= n; k++) {
    unsigned char c = s[n - k];
    if ((c & 0xC0) == 0x80) continue;
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    return need > k ? n - k : n;
  }
  return n;
}

static void emit(stream *st, const char *bytes, size_t n) {
  while (n) { /* through pending, which may overflow only on garbage: then flush it */
    size_t take = n < sizeof st->pending - st->n_pending ? n : sizeof st->pending - st->n_pending;
    memcpy(st->pending + st->n_pending, bytes, take);
    st->n_pending += take;
    bytes += take;
    n -= take;
    size_t ok = st->n_pending == sizeof st->pending ? st->n_pending
                                                    : complete_prefix((const unsigned char *)st->pending, st->n_pending);
    fwrite(st->pending, 1, ok, stdout);
    memmove(st->pending, st->pending + ok, st->n_pending - ok);
    st->n_pending -= ok;
  }
  fflush(stdout);
}

/* The token's text in context: decode([prev, t]) minus decode([prev]), so
 * decoders that treat the first token specially (a SentencePiece leading
 * space) print what the whole sequence would. */
static bool on_token(void *ud, int32_t t) {
  stream *st = ud;
  if (!st->tok) {
    char c = (char)t;
    if (t >= 0 && t < 256) emit(st, &c, 1);
    return true;
  }
  nb_tok_decode_opts o = {.skip_special = true};
  st->a.len = st->b.len = 0;
  int32_t pair[2] = {st->prev, t};
  bool have_prev = st->prev >= 0;
  if (nb_tok_decode(st->tok, have_prev ? pair : pair + 1, have_prev ? 2 : 1, &o, &st->a) ||
      (have_prev && nb_tok_decode(st->tok, pair, 1, &o, &st->b))) {
    st->failed = true;
    return false;
  }
  size_t skip = have_prev && st->b.len <= st->a.len && !memcmp(st->a.data, st->b.data, st->b.len) ? st->b.len : 0;
  emit(st, st->a.data + skip, st->a.len - skip);
  st->prev = t;
  return true;
}

/* ---------------------------------------------------------------- the command */

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
  fprintf(stderr, "%s:", what);
  for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
  fputc('\n', stderr);
}

static int run(nb_ctx *ctx, const options *o) {
  nb_model_loaded m;
  nb_status s = o->hf           ? nb_model_load_hf(ctx, o->hf, &m)
                : o->checkpoint ? nb_train_load_checkpoint(ctx, o->checkpoint, o->config, &m)
                                : nb_train_load_run_dir(ctx, o->run_dir, o->config, &m);
  if (s) return fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx)), 1;
  /* the prompt's ids: [bos] + the tokenizer's, or its bytes */
  size_t plen = strlen(o->prompt), n_ids = 0;
  nb_tok_ids enc = {0};
  int rc = 1;
  int32_t *ids = NULL, *out = NULL;
  nb_model_generator *gen = NULL;
  if (!m.tok && o->hf) {
    fprintf(stderr, "nabla generate: %s/tokenizer.json is missing: cannot encode the prompt\n", o->hf);
    goto done;
  }
  if (m.tok && nb_tok_encode(m.tok, o->prompt, plen, NULL, &enc)) {
    fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx));
    goto done;
  }
  ids = malloc((plen + enc.len + 2) * sizeof *ids);
  if (!ids) goto done;
  if (!o->no_bos && m.bos_id >= 0) ids[n_ids++] = m.bos_id;
  for (size_t i = 0; i < (m.tok ? enc.len : plen); i++) ids[n_ids++] = m.tok ? enc.ids[i] : (unsigned char)o->prompt[i];
  nb_model_gen_opts go = {.max_seq_len = o->max_seq_len, .prefill_chunk = o->chunk, .threads = o->threads};
  if (!go.max_seq_len) {
    /* the cache (and every decode step's attention) spans the whole context,
     * and models declare contexts of up to 128k tokens: size it to this job,
     * rounded up to a power of two (>= 256) so the compiled executables of
     * similar jobs are shared through the disk cache */
    int64_t need = (int64_t)n_ids + o->max_tokens, ctx_len = 256;
    while (ctx_len < need) ctx_len *= 2;
    go.max_seq_len = ctx_len < m.cfg.max_seq_len ? ctx_len : m.cfg.max_seq_len;
  }
  if (go.max_seq_len > m.cfg.max_seq_len) {
    fprintf(stderr, "nabla generate: --max-seq-len %lld exceeds the model's max_seq_len %lld\n", (long long)go.max_seq_len,
            (long long)m.cfg.max_seq_len);
    goto done;
  }
  gen = nb_model_generator_create(ctx, &m.cfg, m.params, &go);
  out = malloc((size_t)(o->max_tokens + 1) * sizeof *out);
  if (!gen || !out) {
    fprintf(stderr, "nabla generate: %s\n", gen ? "out of memory" : nb_ctx_error(ctx));
    goto done;
  }
  stream st = {.tok = m.tok, .prev = n_ids ? ids[n_ids - 1] : -1};
  nb_model_gen_request r = {.prompt = ids, .n_prompt = (int64_t)n_ids, .max_tokens = o->max_tokens,
                            .sample = {.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p},
                            .seed = o->seed, .stop = m.eos_ids, .n_stop = m.n_eos, .on_token = on_token, .ud = &st, .out = out};
  nb_model_gen_result res = {0};
  s = nb_model_generate(gen, &r, &res);
  if (st.n_pending) fwrite(st.pending, 1, st.n_pending, stdout); /* an unfinished sequence at the very end */
  fputc('\n', stdout);
  fflush(stdout);
  nb_tok_text_free(m.tok, &st.a);
  nb_tok_text_free(m.tok, &st.b);
  if (s || st.failed) {
    fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx));
    goto done;
  }
  if (o->show_ids) {
    print_ids("prompt ids", ids, (int64_t)n_ids);
    print_ids("generated ids", out, res.n_tokens);
  }
  int64_t steps = res.n_tokens > 1 ? res.n_tokens - 1 : 0;
  fprintf(stderr, "nabla generate: %s; context %lld, prompt %lld tokens, generated %lld (%s)\n", m.what,
          (long long)nb_model_generator_max_seq_len(gen), (long long)n_ids, (long long)res.n_tokens,
          res.stopped ? "end of text" : res.truncated ? "context full: raise --max-seq-len or shorten the prompt" : "max tokens");
  fprintf(stderr, "  compile         %9.1f ms\n", 1e3 * res.compile_s);
  fprintf(stderr, "  prefill         %9.1f ms  %10.1f tokens/s\n", 1e3 * res.prefill_s,
          res.prefill_s > 0 ? (double)res.prefill_tokens / res.prefill_s : 0.0);
  fprintf(stderr, "  first token     %9.1f ms  (compile + prefill)\n", 1e3 * (res.compile_s + res.prefill_s));
  fprintf(stderr, "  decode          %9.1f ms  %10.1f tokens/s (%lld steps)\n", 1e3 * res.decode_s,
          res.decode_s > 0 ? (double)steps / res.decode_s : 0.0, (long long)steps);
  rc = 0;
done:
  free(out);
  free(ids);
  if (m.tok) nb_tok_ids_free(m.tok, &enc);
  nb_model_generator_destroy(gen);
  nb_model_loaded_free(&m);
  return rc;
}

int nb_cmd_generate(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  options o;
  int u = parse(argc, argv, &o);
  if (u) return u;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  int rc = run(ctx, &o);
  nb_ctx_destroy(ctx);
  return rc;
}
