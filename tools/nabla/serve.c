/* `nabla serve`: an OpenAI-compatible HTTP/1.1 server, or an offline batch
 * run (--batch), over a model loaded as `nabla generate` loads it, on the
 * serving engine of src/serve: continuous batching over a paged KV cache,
 * one engine thread (serve_engine.c) for all requests. This file: the
 * options, loading the model and its chat format, the engine's
 * configuration, then HTTP (serve_http.c) or the batch file
 * (serve_batch.c). docs/serve.md has the user's view. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "serve_int.h"

static const char usage_text[] =
    "usage: nabla serve MODEL [options]\n"
    "  MODEL                a nabla run dir (config.yaml), a checkpoint step dir, a Hugging Face\n"
    "                       Llama folder (config.json), or a Llama GGUF file (llama.cpp's format)\n"
    "  --config FILE        the run config for a run dir / checkpoint\n"
    "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
    "  --port N             TCP port (default 8000; 0 picks a free one; the port is printed)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' (every route but /health and /metrics)\n"
    "  --max-body BYTES     largest request body (default 1048576; larger: 413)\n"
    "  --timeout S          close a connection idle (or half-sent) for S seconds (default 30)\n"
    "  --served-model-name NAME  the model's id in the API (default: MODEL as given)\n"
    "  --max-model-len N    context bound for prompt + output (default: the model's, at most 4096)\n"
    "  --chat-template NAME chatml, llama-3, gemma, llama-2 or mistral (default: the one\n"
    "                       tokenizer_config.json's chat_template is, else chatml)\n"
    "  --threads N          compute threads (default: all CPUs)\n"
    "engine:\n"
    "  --max-num-seqs N     sequences running at once (default 16)\n"
    "  --max-num-batched-tokens N  tokens per engine step, at least --max-num-seqs (default 512)\n"
    "  --block-size N       tokens per KV cache block (default 16)\n"
    "  --kv-cache-bytes N   KV cache budget in bytes (default: what --max-num-seqs sequences of\n"
    "                       --max-model-len need, at most 1 GiB)\n"
    "  --kv-cache-memory-fraction F  or this fraction (0, 1] of physical memory\n"
    "  --enable-prefix-caching / --no-enable-prefix-caching  reuse the KV blocks of earlier\n"
    "                       prompts' common prefixes (default on)\n"
    "profile:\n"
    "  --profile-steps A-B  trace the engine's steps A..B (1-based: prefill chunks and decode steps of the\n"
    "                       batch); written after step B, or at exit (SIGTERM) if B never comes\n"
    "  --profile-out FILE   that trace's file (default profile/trace.json), the op profile and profile.html beside it\n"
    "offline:\n"
    "  --batch FILE         answer an OpenAI batch file (JSONL) instead of listening\n"
    "  --output FILE        where the batch's answers go (JSONL, one per input line)\n";

/* 0 ok, 2 usage */
static int parse(int argc, char **argv, options *o) {
  *o = (options){.host = "127.0.0.1", .port = 8000, .max_body = 1 << 20, .timeout = 30, .max_num_seqs = 16,
                 .max_num_batched_tokens = 512, .block_size = 16, .prefix_caching = true};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t n = 0;
    bool ok = true;
    if (a[0] != '-') {
      if (o->model) return fprintf(stderr, "nabla serve: one MODEL only ('%s' and '%s')\n", o->model, a), nb_cli_usage(usage_text, false);
      o->model = a;
      continue;
    }
    if (!strcmp(a, "--enable-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) { /* flags */
      o->prefix_caching = a[2] == 'e';
      continue;
    }
    if (!v) return fprintf(stderr, "nabla serve: %s needs a value\n", a), nb_cli_usage(usage_text, false);
    if (!strcmp(a, "--config")) o->config = v;
    else if (!strcmp(a, "--host")) o->host = v;
    else if (!strcmp(a, "--api-key")) o->api_key = v;
    else if (!strcmp(a, "--served-model-name")) o->name = v;
    else if (!strcmp(a, "--chat-template")) o->chat_template = v;
    else if (!strcmp(a, "--batch")) o->batch = v;
    else if (!strcmp(a, "--output")) o->output = v;
    else if (!strcmp(a, "--profile-steps")) ok = nb_cli_prof_steps_parse("serve", v, &o->prof);
    else if (!strcmp(a, "--profile-out")) o->prof.path = v;
    else if (!strcmp(a, "--port")) ok = nb_cli_int("serve", a, v, 0, 65535, &o->port);
    else if (!strcmp(a, "--max-body")) ok = nb_cli_int("serve", a, v, 1, INT64_C(1) << 32, &o->max_body);
    else if (!strcmp(a, "--timeout")) ok = nb_cli_int("serve", a, v, 1, 86400, &o->timeout);
    else if (!strcmp(a, "--max-model-len")) ok = nb_cli_int("serve", a, v, 2, 1000000000, &o->max_model_len);
    else if (!strcmp(a, "--threads")) ok = nb_cli_int("serve", a, v, 1, 4096, &n), o->threads = (int)n;
    else if (!strcmp(a, "--max-num-seqs")) ok = nb_cli_int("serve", a, v, 1, 65536, &o->max_num_seqs);
    else if (!strcmp(a, "--max-num-batched-tokens")) ok = nb_cli_int("serve", a, v, 1, 1 << 24, &o->max_num_batched_tokens);
    else if (!strcmp(a, "--block-size")) ok = nb_cli_int("serve", a, v, 1, 1024, &o->block_size);
    else if (!strcmp(a, "--kv-cache-bytes")) ok = nb_cli_int("serve", a, v, 1, INT64_MAX, &o->kv_cache_bytes);
    else if (!strcmp(a, "--kv-cache-memory-fraction")) ok = nb_cli_float("serve", a, v, 1e-9, 1, &o->kv_cache_fraction);
    else return fprintf(stderr, "nabla serve: unknown argument '%s'\n", a), nb_cli_usage(usage_text, false);
    if (!ok) return 2;
    i++;
  }
  if (!o->model) return fprintf(stderr, "nabla serve: MODEL is required\n"), nb_cli_usage(usage_text, false);
  if (!o->name) o->name = o->model;
  if (o->chat_template) {
    if (nb_serve_chat_format_parse(o->chat_template) == NB_SERVE_CHAT_NONE)
      return fprintf(stderr, "nabla serve: --chat-template: unknown template '%s' (known: %s)\n", o->chat_template,
                     nb_serve_chat_known()), 2;
  }
  if (o->max_num_batched_tokens < o->max_num_seqs)
    return fprintf(stderr, "nabla serve: --max-num-batched-tokens %lld is below --max-num-seqs %lld\n",
                   (long long)o->max_num_batched_tokens, (long long)o->max_num_seqs), 2;
  if (!o->batch != !o->output) return fprintf(stderr, "nabla serve: --batch and --output go together\n"), 2;
  if (o->prof.path && !o->prof.first) return fprintf(stderr, "nabla serve: --profile-out goes with --profile-steps\n"), 2;
  if (o->batch) {
    const char *inputs[] = {o->batch, o->model, o->config};
    if (!nb_cli_output_ok("serve", o->output, false, o->config ? 3 : 2, inputs)) return 2;
  }
  return 0;
}

/* ---------------------------------------------------------------- the command */

static bool is_file(const char *dir, const char *name) {
  char p[4096];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return !stat(p, &st) && S_ISREG(st.st_mode);
}

/* A GGUF file's tokenizer.chat_template as a new string (NULL: none). */
static char *gguf_chat_template(const char *path) {
  nb_ctx *ctx = nb_ctx_create();
  nb_gguf *g = ctx ? nb_gguf_open(ctx, path) : NULL;
  const char *t = NULL;
  size_t n = 0;
  char *copy = NULL;
  if (g && nb_gguf_get(g, "tokenizer.chat_template") && !nb_gguf_get_string(g, "tokenizer.chat_template", &t, &n) &&
      (copy = malloc(n + 1)))
    memcpy(copy, t, n), copy[n] = 0;
  nb_gguf_close(g);
  nb_ctx_destroy(ctx);
  return copy;
}

/* The chat format a declared template is (markers of the known ones), or
 * CHAT_NONE with why. */
static void match_template(server *sv, const char *tmpl, const char *where) {
  sv->chat = nb_serve_chat_detect(tmpl);
  if (sv->chat == NB_SERVE_CHAT_NONE)
    snprintf(sv->chat_why, sizeof sv->chat_why, "%s's chat_template is none nabla knows (known: %s); pass --chat-template NAME",
             where, nb_serve_chat_known());
}

/* The chat format: --chat-template, else the one tokenizer_config.json's
 * (or a GGUF file's tokenizer.chat_template) is, else ChatML when the
 * model declares none. A declared template nabla does not know turns chat
 * off (requests say why). */
static void pick_chat_template(server *sv) {
  sv->chat = NB_SERVE_CHAT_CHATML;
  if (sv->opt.chat_template) { /* a known name: parse() refused the others */
    sv->chat = nb_serve_chat_format_parse(sv->opt.chat_template);
  } else if (nb_cli_is_gguf(sv->opt.model)) {
    char *tmpl = gguf_chat_template(sv->opt.model);
    if (tmpl) match_template(sv, tmpl, sv->opt.model);
    free(tmpl);
  } else {
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", sv->opt.model);
    size_t n = 0;
    char *text = is_file(sv->opt.model, "tokenizer_config.json") ? nb_cli_read_input("serve", p, &n) : NULL;
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    if (text && !j) {
      sv->chat = NB_SERVE_CHAT_NONE;
      snprintf(sv->chat_why, sizeof sv->chat_why, "%s is not valid JSON; pass --chat-template NAME", p);
    } else if (!absent(t)) {
      match_template(sv, cJSON_IsString(t) ? t->valuestring : "", p);
    }
    cJSON_Delete(j);
    free(text);
  }
  sv->im_end_id = -1;
  if (nb_serve_chat_end(sv->chat) && sv->m.tok) {
    sv->im_end_id = nb_tok_added_id(sv->m.tok, nb_serve_chat_end(sv->chat));
    if (sv->im_end_id < 0) sv->im_end_id = -1;
  }
}


/* The engine and model step: the options, the model's end-of-sequence
 * tokens and the chat format's end of turn. */
static bool make_engine(server *sv) {
  const options *o = &sv->opt;
  const nb_model_config *cfg = &sv->m.cfg;
  nb_serve_llm_config lc = {.engine = {.block_size = (int32_t)o->block_size, .max_num_seqs = (int32_t)o->max_num_seqs,
                                       .max_num_batched_tokens = (int32_t)o->max_num_batched_tokens,
                                       .max_model_len = (int32_t)sv->max_model_len,
                                       .enable_prefix_caching = o->prefix_caching},
                            .model = {.threads = o->threads, .pack_kernels = true}};
  nb_serve_kv_geometry g = {.num_layers = cfg->n_layers, .num_kv_heads = cfg->n_kv_heads,
                            .head_dim = nb_model_head_dim(cfg), .dtype_size = 4};
  lc.engine.kv = g;
  if (o->kv_cache_fraction > 0) {
    lc.engine.kv_cache_memory_fraction = o->kv_cache_fraction;
  } else if (o->kv_cache_bytes > 0) {
    lc.engine.kv_cache_bytes = (uint64_t)o->kv_cache_bytes;
  } else { /* what max_num_seqs full sequences need, at most 1 GiB */
    uint64_t per_seq = nb_serve_bytes_per_block(&g, (int32_t)o->block_size) *
                       (uint64_t)((sv->max_model_len + o->block_size - 1) / o->block_size);
    uint64_t want = per_seq * (uint64_t)o->max_num_seqs, cap = UINT64_C(1) << 30;
    lc.engine.kv_cache_bytes = want < cap ? want : cap;
  }
  int32_t eos[9];
  int n_eos = 0;
  for (int i = 0; i < sv->m.n_eos && n_eos < 8; i++) eos[n_eos++] = sv->m.eos_ids[i];
  if (sv->im_end_id >= 0) eos[n_eos++] = sv->im_end_id;
  lc.eos_token_ids = eos;
  lc.num_eos_token_ids = n_eos;
  if (!nb_cli_quant_hook("serve", sv->ctx, sv->m.params, &lc.model, &sv->plan)) return false;
  sv->llm = nb_serve_llm_create(sv->ctx, cfg, sv->m.params, &lc);
  /* the engine holds its kernels in its decode layout, in arrays of its own: the loaded ones would be a second copy */
  if (sv->llm && nb_serve_model_kernels_packed(nb_serve_llm_model(sv->llm))) nb_tree_destroy(sv->m.params), sv->m.params = NULL;
  if (!sv->llm) return fprintf(stderr, "nabla serve: %s\n", nb_ctx_error(sv->ctx)), false;
  return true;
}

static int serve(server *sv) {
  const options *o = &sv->opt;
  nb_model_loaded *m = &sv->m;
  nb_status s = nb_cli_load_model(sv->ctx, o->model, o->config, m);
  if (s) return fprintf(stderr, "nabla serve: %s\n", nb_ctx_error(sv->ctx)), 1;
  sv->max_model_len = o->max_model_len ? o->max_model_len : m->cfg.max_seq_len < 4096 ? m->cfg.max_seq_len : 4096;
  if (sv->max_model_len > m->cfg.max_seq_len)
    return fprintf(stderr, "nabla serve: --max-model-len %lld exceeds the model's max_seq_len %lld\n",
                   (long long)sv->max_model_len, (long long)m->cfg.max_seq_len), 1;
  pick_chat_template(sv);
  if (!make_engine(sv)) return 1;
  return o->batch ? serve_batch(sv) : serve_http(sv);
}

int nb_cmd_serve(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  server *sv = calloc(1, sizeof *sv);
  if (!sv) return 1;
  int rc = parse(argc, argv, &sv->opt);
  if (!rc) {
    sv->ctx = nb_ctx_create();
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->cv, NULL);
    sv->created = time(NULL);
    rc = sv->ctx ? serve(sv) : 1;
    if (sv->ctx) nb_cli_prof_steps_finish("serve", &sv->opt.prof, sv->ctx); /* step B never came: what was recorded */
    nb_serve_llm_destroy(sv->llm);
    nb_quant_plan_destroy(sv->plan);
    nb_model_loaded_free(&sv->m);
    nb_ctx_destroy(sv->ctx);
    pthread_cond_destroy(&sv->cv);
    pthread_mutex_destroy(&sv->mu);
  }
  free(sv);
  return rc;
}
