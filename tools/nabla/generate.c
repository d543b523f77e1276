/* `nabla generate`: sample text from a trained nabla run (its directory or
 * one checkpoint step) or a Hugging Face Llama-architecture folder, as a
 * client of the serving engine (nb_serve_llm) with one request: the same
 * scheduler, paged KV cache and traced sampler as `nabla serve`, no decode
 * loop of its own. Text streams to stdout as tokens arrive (an incomplete
 * UTF-8 sequence is held back until its last byte comes); with --n > 1 each
 * sample is printed whole, in order, at the end. Timings go to stderr. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "nabla/nabla.h"
#include "util/util.h"

static const char usage_text[] =
          "usage: nabla generate (--run-dir DIR | --checkpoint STEP_DIR | --hf DIR | --gguf FILE) --prompt TEXT [options]\n"
          "  --run-dir DIR        a nabla run: DIR/config.yaml and the latest step of DIR/checkpoints\n"
          "  --checkpoint DIR     one checkpoint step (config: DIR/../../config.yaml, or --config)\n"
          "  --hf DIR             a Hugging Face GPT-2, Llama, Mistral or Qwen2 folder (config.json, safetensors, tokenizer.json)\n"
          "  --gguf FILE          a Llama GGUF file (llama.cpp's format; Q8_0 / Q4_0 / Q6_K linears run as int8 g32 /\n"
          "                       int4 g32 / int8 g16, other types dequantized to f32)\n"
          "  --gguf-act MODE      activations of the Q8_0 / Q4_0 / Q6_K linears: int8_block (default: int8 per 32, as\n"
          "                       llama.cpp computes them) or none (weight-only, f32 activations)\n"
          "  --config FILE        the run config for --run-dir / --checkpoint\n"
          "  --prompt TEXT        the text to continue\n"
          "  --max-tokens N       new tokens at most (default 128)\n"
          "  --temperature T      0 is greedy (default 0.8)\n"
          "  --top-k K            keep the K most likely tokens (default 0: off)\n"
          "  --top-p P            nucleus sampling (default 1: off)\n"
          "  --min-p P            drop tokens below P times the most likely one's probability (default 0: off)\n"
          "  --presence-penalty X subtracted once from each token already generated, [-2, 2] (default 0)\n"
          "  --frequency-penalty X subtracted per occurrence among the generated tokens, [-2, 2] (default 0)\n"
          "  --repetition-penalty R on prompt and generated tokens: logit / R when positive, logit * R\n"
          "                       otherwise (default 1: off)\n"
          "  --n N                samples of the prompt (default 1); each is printed after the run\n"
          "  --seed S             the sampling seed (default 0); a run is reproducible\n"
          "  --max-seq-len N      context bound for prompt + output (default: prompt + max tokens\n"
          "                       rounded up to a power of two >= 256, at most the model's)\n"
          "  --prefill-chunk N    prompt tokens per prefill call (default 64)\n"
          "  --no-bos             do not prepend the model's beginning-of-text token\n"
          "  --show-ids           print the prompt and generated token ids to stderr\n"
          "  --threads N          compute threads (default: all CPUs)\n"
          "  --profile-steps A-B  trace the engine's steps A..B (1-based: prefill chunks, then decode steps)\n"
          "  --profile-out FILE   that trace's file (default profile/trace.json), the op profile and profile.html beside it\n";

static int usage(void) { return nb_cli_usage(usage_text, false); }

typedef struct options {
  const char *run_dir, *checkpoint, *hf, *gguf, *config, *prompt;
  nb_quant_act gguf_act;
  int64_t max_tokens, top_k, max_seq_len, chunk, n;
  double temperature, top_p, min_p, presence, frequency, repetition;
  uint64_t seed;
  bool no_bos, show_ids;
  int threads;
  nb_cli_prof_steps prof;
} options;

/* 0 ok, 2 usage */
static int parse(int argc, char **argv, options *o) {
  *o = (options){.gguf_act = NB_QUANT_ACT_INT8_BLOCK, .max_tokens = 128, .temperature = 0.8, .top_p = 1, .repetition = 1, .n = 1, .chunk = 64};
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
    else if (!strcmp(a, "--gguf")) o->gguf = v;
    else if (!strcmp(a, "--gguf-act")) {
      if (!strcmp(v, "int8_block")) o->gguf_act = NB_QUANT_ACT_INT8_BLOCK;
      else if (!strcmp(v, "none")) o->gguf_act = NB_QUANT_ACT_NONE;
      else return fprintf(stderr, "nabla generate: --gguf-act: '%s' is not int8_block or none\n", v), usage();
    }
    else if (!strcmp(a, "--config")) o->config = v;
    else if (!strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--max-tokens")) ok = nb_cli_int("generate", a, v, 0, 1000000000, &o->max_tokens);
    else if (!strcmp(a, "--temperature")) ok = nb_cli_float("generate", a, v, 0, 1e6, &o->temperature);
    else if (!strcmp(a, "--top-k")) ok = nb_cli_int("generate", a, v, 0, 1000000000, &o->top_k);
    else if (!strcmp(a, "--top-p")) ok = nb_cli_float("generate", a, v, 0, 1, &o->top_p);
    else if (!strcmp(a, "--min-p")) ok = nb_cli_float("generate", a, v, 0, 1, &o->min_p);
    else if (!strcmp(a, "--presence-penalty")) ok = nb_cli_float("generate", a, v, -2, 2, &o->presence);
    else if (!strcmp(a, "--frequency-penalty")) ok = nb_cli_float("generate", a, v, -2, 2, &o->frequency);
    else if (!strcmp(a, "--repetition-penalty")) ok = nb_cli_float("generate", a, v, 0, 1e6, &o->repetition);
    else if (!strcmp(a, "--n")) ok = nb_cli_int("generate", a, v, 1, 256, &o->n);
    else if (!strcmp(a, "--seed")) ok = nb_cli_int("generate", a, v, 0, INT64_MAX, &n), o->seed = (uint64_t)n;
    else if (!strcmp(a, "--max-seq-len")) ok = nb_cli_int("generate", a, v, 2, 1000000000, &o->max_seq_len);
    else if (!strcmp(a, "--prefill-chunk")) ok = nb_cli_int("generate", a, v, 1, 1000000, &o->chunk);
    else if (!strcmp(a, "--threads")) ok = nb_cli_int("generate", a, v, 1, 4096, &n), o->threads = (int)n;
    else if (!strcmp(a, "--profile-steps")) ok = nb_cli_prof_steps_parse("generate", v, &o->prof);
    else if (!strcmp(a, "--profile-out")) o->prof.path = v;
    else return fprintf(stderr, "nabla generate: unknown argument '%s'\n", a), usage();
    if (!ok) return 2;
    if (strcmp(a, "--no-bos") && strcmp(a, "--show-ids")) i++;
  }
  int sources = !!o->run_dir + !!o->checkpoint + !!o->hf + !!o->gguf;
  if (sources != 1) return fprintf(stderr, "nabla generate: give exactly one of --run-dir, --checkpoint, --hf, --gguf\n"), usage();
  if (!o->prompt) return fprintf(stderr, "nabla generate: --prompt is required\n"), usage();
  if (o->config && (o->hf || o->gguf)) return fprintf(stderr, "nabla generate: --config goes with --run-dir or --checkpoint\n"), usage();
  if (o->prof.path && !o->prof.first) return fprintf(stderr, "nabla generate: --profile-out goes with --profile-steps\n"), usage();
  return 0;
}

/* ---------------------------------------------------------------- streaming text */

typedef struct stream {
  FILE *out;          /* stdout, or a sample's buffer when there are several */
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
    fwrite(st->pending, 1, ok, st->out);
    memmove(st->pending, st->pending + ok, st->n_pending - ok);
    st->n_pending -= ok;
  }
  fflush(st->out);
}

/* The token's text in context: decode([prev, t]) minus decode([prev]), so
 * decoders that treat the first token specially (a SentencePiece leading
 * space) print what the whole sequence would. An id the tokenizer lacks (a
 * model's vocabulary padded past the tokenizer's) prints nothing, as ids
 * past 255 do for a byte-level model. */
static bool on_token(stream *st, int32_t t) {
  if (!st->tok) {
    char c = (char)t;
    if (t >= 0 && t < 256) emit(st, &c, 1);
    return true;
  }
  size_t len;
  if (!nb_tok_token_bytes(st->tok, t, &len)) return true;
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

/* The context (every sample's KV blocks, and the largest block table the
 * step executables are compiled for): --max-seq-len, else prompt + max
 * tokens rounded up to a power of two >= 256 so that similar jobs share
 * compiled executables through the disk cache, at most the model's (models
 * declare up to 128k tokens, gigabytes of cache for a short job). */
static int64_t context_len(const options *o, int64_t n_prompt, int64_t model_max) {
  if (o->max_seq_len) return o->max_seq_len;
  int64_t need = n_prompt + o->max_tokens, len = 256;
  while (len < need) len *= 2;
  return len < model_max ? len : model_max;
}

/* What the run measured. Tracing and compiling happen inside the step that
 * first needs an executable; they are counted apart. */
typedef struct timings {
  double compile_s, prefill_s, first_token_s, decode_s;
  double decode_cpu_s; /* this process's CPU time in the decode steps: the rate a loaded machine does not stretch */
  int64_t decode_steps, decode_tokens;
} timings;

static double cpu_s(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) ? 0 : (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One request of o->n samples through the engine until every sample ended;
 * sample k's ids go to out + k * max_tokens, its count to n_out[k], why it
 * ended to why[k]. */
static nb_status drive(nb_ctx *ctx, nb_cli_prof_steps *prof, nb_serve_llm *l, const nb_serve_llm_request *req, stream *st,
                       int32_t *out, int32_t *n_out, nb_serve_finish_reason *why, timings *t) {
  nb_status s = nb_serve_llm_add(l, req);
  const nb_serve_model *model = nb_serve_llm_model(l);
  bool first = true;
  double t0 = nb_util__now_s();
  while (!s && nb_serve_llm_has_unfinished(l)) {
    double c0 = nb_serve_model_compile_s(model), s0 = nb_util__now_s(), p0 = cpu_s();
    const nb_serve_event *ev;
    int32_t n_ev = 0, drawn = 0;
    s = nb_cli_llm_step("generate", prof, ctx, l, &ev, &n_ev);
    double c = nb_serve_model_compile_s(model) - c0, run = nb_util__now_s() - s0 - c;
    t->compile_s += c;
    if (first) t->prefill_s += run; /* prompt chunks, the last of which draws the first tokens */
    else t->decode_s += run, t->decode_cpu_s += cpu_s() - p0, t->decode_steps++;
    for (int32_t i = 0; !s && i < n_ev; i++) {
      int32_t k = ev[i].s.sample_index;
      if (ev[i].s.token < 0) continue; /* aborts: none here */
      if (k < 0 || k >= req->r.n || n_out[k] >= req->r.max_tokens) { /* never: the engine keeps to the request */
        fprintf(stderr, "nabla generate: the engine gave sample %d a token past its request\n", k);
        return NB_ERR_INTERNAL;
      }
      out[(size_t)k * (size_t)req->r.max_tokens + (size_t)n_out[k]++] = ev[i].s.token;
      why[k] = ev[i].finish;
      drawn++;
      if (!on_token(&st[k], ev[i].s.token)) s = NB_ERR_INVALID_ARG;
    }
    if (!first) t->decode_tokens += drawn;
    else if (drawn) first = false, t->first_token_s = nb_util__now_s() - t0;
  }
  return s;
}

static int run(nb_ctx *ctx, options *o) {
  nb_model_loaded m;
  nb_status s = o->hf           ? nb_model_load_hf(ctx, o->hf, &m)
                : o->gguf       ? nb_model_load_gguf(ctx, o->gguf, &m)
                : o->checkpoint ? nb_train_load_checkpoint(ctx, o->checkpoint, o->config, &m)
                                : nb_train_load_run_dir(ctx, o->run_dir, o->config, &m);
  int64_t n_quantized = 0;
  if (!s && o->gguf && (s = nb_cli_gguf_keep_quantized(ctx, o->gguf, &m, o->gguf_act, &n_quantized))) nb_model_loaded_free(&m);
  if (s) return fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx)), 1;
  if (n_quantized)
    fprintf(stderr, "nabla generate: %lld Q8_0/Q4_0/Q6_K linears of %s run quantized (int8 g32/int4 g32/int8 g16, %s activations)\n",
            (long long)n_quantized, o->gguf, o->gguf_act == NB_QUANT_ACT_INT8_BLOCK ? "int8 per-32-block" : "f32");
  /* the prompt's ids: [bos] + the tokenizer's, or its bytes */
  size_t plen = strlen(o->prompt), n_ids = 0;
  nb_tok_ids enc = {0};
  int rc = 1;
  int32_t n = (int32_t)o->n, *ids = NULL, *out = NULL, *n_out = NULL;
  nb_serve_finish_reason *why = NULL;
  stream *st = NULL;
  char **text = NULL;
  size_t *text_len = NULL;
  nb_serve_llm *l = NULL;
  nb_quant_plan *plan = NULL;
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
  int64_t ctx_len = context_len(o, (int64_t)n_ids, m.cfg.max_seq_len);
  if (ctx_len > m.cfg.max_seq_len) {
    fprintf(stderr, "nabla generate: --max-seq-len %lld exceeds the model's max_seq_len %lld\n", (long long)ctx_len,
            (long long)m.cfg.max_seq_len);
    goto done;
  }
  if (n_ids < 1 || (int64_t)n_ids >= ctx_len) {
    fprintf(stderr,
            "nabla generate: the prompt has %zu tokens but the context holds %lld (--max-seq-len), prompt and output "
            "together; shorten the prompt to at most %lld tokens\n",
            n_ids, (long long)ctx_len, (long long)ctx_len - 1);
    goto done;
  }
  /* the output stops where the context is full, as a length limit */
  int64_t room = ctx_len - (int64_t)n_ids, max_new = o->max_tokens < room ? o->max_tokens : room;
  /* one request: n sequences, each with blocks for the whole context; a
   * step takes at most a prefill chunk of the prompt */
  int32_t block = 16, blocks_per_seq = (int32_t)((ctx_len + block - 1) / block);
  nb_serve_llm_config lc = {
      .engine = {.block_size = block, .num_blocks = (int64_t)n * blocks_per_seq, .max_num_seqs = n,
                 .max_num_batched_tokens = (int32_t)(o->chunk > n ? o->chunk : n), .max_model_len = (int32_t)ctx_len},
      .model = {.threads = o->threads, .pack_kernels = true},
      .eos_token_ids = m.eos_ids,
      .num_eos_token_ids = m.n_eos};
  out = malloc((size_t)n * (size_t)(max_new + 1) * sizeof *out);
  n_out = calloc((size_t)n, sizeof *n_out);
  why = calloc((size_t)n, sizeof *why);
  st = calloc((size_t)n, sizeof *st);
  text = calloc((size_t)n, sizeof *text);
  text_len = calloc((size_t)n, sizeof *text_len);
  if (!out || !n_out || !why || !st || !text || !text_len) {
    fprintf(stderr, "nabla generate: out of memory\n");
    goto done;
  }
  for (int32_t k = 0; k < n; k++) {
    st[k] = (stream){.out = n > 1 ? open_memstream(&text[k], &text_len[k]) : stdout, .tok = m.tok, .prev = ids[n_ids - 1]};
    if (!st[k].out) {
      fprintf(stderr, "nabla generate: out of memory\n");
      goto done;
    }
  }
  if (!nb_cli_quant_hook("generate", ctx, m.params, &lc.model, &plan)) goto done;
  l = nb_serve_llm_create(ctx, &m.cfg, m.params, &lc);
  /* the engine holds its kernels in its decode layout, in arrays of its own: the loaded ones would be a second copy */
  if (l && nb_serve_model_kernels_packed(nb_serve_llm_model(l))) nb_tree_destroy(m.params), m.params = NULL;
  if (!l) {
    fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx));
    goto done;
  }
  nb_serve_sampling sp = {.temperature = (float)o->temperature, .top_k = (int32_t)o->top_k, .top_p = (float)o->top_p,
                          .min_p = (float)o->min_p, .presence_penalty = (float)o->presence,
                          .frequency_penalty = (float)o->frequency, .repetition_penalty = (float)o->repetition,
                          .seed = o->seed};
  nb_serve_llm_request req = {.r = {.id = 0, .prompt = ids, .prompt_len = (int32_t)n_ids, .max_tokens = (int32_t)max_new,
                                    .n = n, .sampling = &sp}};
  timings t = {0};
  bool failed = false;
  s = max_new > 0 ? drive(ctx, &o->prof, l, &req, st, out, n_out, why, &t) : NB_OK;
  nb_cli_prof_steps_finish("generate", &o->prof, ctx); /* the run ended before the range's last step */
  for (int32_t k = 0; k < n; k++) {
    if (st[k].n_pending) fwrite(st[k].pending, 1, st[k].n_pending, st[k].out); /* an unfinished sequence at the very end */
    failed |= st[k].failed;
    nb_tok_text_free(m.tok, &st[k].a);
    nb_tok_text_free(m.tok, &st[k].b);
    if (n == 1) continue;
    fclose(st[k].out);
    st[k].out = NULL;
    printf("--- sample %d\n", k);
    fwrite(text[k], 1, text_len[k], stdout);
    fputc('\n', stdout);
  }
  if (n == 1) fputc('\n', stdout);
  fflush(stdout);
  if (s || failed) {
    fprintf(stderr, "nabla generate: %s\n", nb_ctx_error(ctx));
    goto done;
  }
  if (o->show_ids) {
    print_ids("prompt ids", ids, (int64_t)n_ids);
    for (int32_t k = 0; k < n; k++) {
      char what[64];
      snprintf(what, sizeof what, n > 1 ? "generated ids [sample %d]" : "generated ids", k);
      print_ids(what, out + (size_t)k * (size_t)max_new, n_out[k]);
    }
  }
  int64_t total = 0;
  for (int32_t k = 0; k < n; k++) total += n_out[k];
  fprintf(stderr, "nabla generate: %s; context %lld, prompt %lld tokens, generated %lld", m.what, (long long)ctx_len,
          (long long)n_ids, (long long)total);
  for (int32_t k = 0; k < n; k++) {
    const char *reason = why[k] == NB_SERVE_FINISHED_STOP ? "end of text"
                         : n_out[k] == o->max_tokens       ? "max tokens"
                                                           : "context full: raise --max-seq-len or shorten the prompt";
    fprintf(stderr, "%s%s", k ? ", " : " (", reason);
  }
  fprintf(stderr, ")\n");
  fprintf(stderr, "  compile         %9.1f ms\n", 1e3 * t.compile_s);
  fprintf(stderr, "  prefill         %9.1f ms  %10.1f tokens/s\n", 1e3 * t.prefill_s,
          t.prefill_s > 0 ? (double)n_ids / t.prefill_s : 0.0);
  fprintf(stderr, "  first token     %9.1f ms  (compile + prefill)\n", 1e3 * t.first_token_s);
  fprintf(stderr, "  decode          %9.1f ms  %10.1f tokens/s (%lld steps)\n", 1e3 * t.decode_s,
          t.decode_s > 0 ? (double)t.decode_tokens / t.decode_s : 0.0, (long long)t.decode_steps);
  fprintf(stderr, "  decode CPU      %9.1f ms  %10.1f tokens per CPU-s (all threads)\n", 1e3 * t.decode_cpu_s,
          t.decode_cpu_s > 0 ? (double)t.decode_tokens / t.decode_cpu_s : 0.0);
  rc = 0;
done:
  for (int32_t k = 0; st && k < n; k++)
    if (st[k].out && st[k].out != stdout) fclose(st[k].out);
  for (int32_t k = 0; text && k < n; k++) free(text[k]);
  free(text);
  free(text_len);
  free(st);
  free(why);
  free(n_out);
  free(out);
  free(ids);
  if (m.tok) nb_tok_ids_free(m.tok, &enc);
  nb_serve_llm_destroy(l);
  nb_quant_plan_destroy(plan);
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
