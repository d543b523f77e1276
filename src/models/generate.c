/* Token generation: the traced sampler (temperature, top-k, top-p, then a
 * categorical draw) and the generator, which runs a chunked prefill and
 * one-token decode steps as compiled executables over a donated KV cache,
 * each with the sampler fused in. Not here: text (tokenizing and streaming
 * are the caller's), loading models (load.c, hf.c), batching requests
 * (the server's job). `nabla generate` no longer uses it: the command is a
 * client of the serving engine (nb_serve_llm); this stays as the independent
 * reference the engine's tests compare against (tests/serve/test_step.c). */
#include <math.h>
#include <string.h>
#include <time.h>

#include "models/internal.h"
#include "nabla/compile.h"
#include "util/util.h"

/* ---------------------------------------------------------------- sampling */

nb_val *nb_model_sample(nb_val *logits, nb_val *key, const nb_model_sample_opts *o) {
  nb_graph *g = logits ? nb_val_graph(logits) : key ? nb_val_graph(key) : NULL;
  if (!g) return NULL;
  nb_nn_apply a = {.g = g}; /* for errors */
  if (!logits || !key || !o) return nb_nn_fail(&a, NB_ERR_INVALID_ARG, "sample: NULL logits, key or options");
  nb_aval la = nb_val_aval(logits);
  if (la.shape.rank != 2 || !nb_dtype_is_float(la.dtype) || la.shape.dims[1] < 1) {
    char s[128];
    return nb_nn_fail(&a, NB_ERR_SHAPE, "sample: logits must be float [B, V] with V >= 1, not %s", nb_aval_str(&la, s, sizeof s));
  }
  if (isnan(o->temperature) || isnan(o->top_p) || o->top_k < 0)
    return nb_nn_fail(&a, NB_ERR_INVALID_ARG, "sample: bad options (temperature %g, top_k %lld, top_p %g)", o->temperature,
                      (long long)o->top_k, o->top_p);
  if (!(o->temperature > 0)) return nb_argmax(logits, 1, NB_I32);
  int64_t B = la.shape.dims[0], V = la.shape.dims[1];
  nb_val *x = la.dtype == NB_F32 || la.dtype == NB_F64 ? logits : nb_convert(logits, NB_F32);
  nb_dtype t = nb_val_dtype(x);
  x = nb_div(x, nb_scalar(g, t, o->temperature));
  bool use_k = o->top_k > 0 && o->top_k < V, use_p = o->top_p > 0 && o->top_p < 1;
  nb_val *ids = NULL; /* candidate i's token id, when the candidates were reordered */
  if (use_k) x = nb_top_k(x, (int)o->top_k, &ids);
  else if (use_p) x = nb_sort(x, 1, true, &ids);
  if (use_p) {
    /* candidates are sorted descending: keep those whose preceding mass is
     * still below p (the first always: its preceding mass is exactly 0) */
    nb_val *p = nb_nn_softmax(x, 1);
    nb_val *before = nb_sub(nb_cumsum(p, 1, false), p);
    nb_val *keep = nb_lt(before, nb_scalar(g, t, o->top_p));
    x = nb_select(keep, x, nb_full_like(x, -INFINITY));
  }
  nb_val *j = nb_random_categorical(key, x, 1); /* [B] */
  if (!ids) return j;
  return nb_reshape(nb_take_along_axis(ids, nb_expand_dims(j, 1), 1), 1, &B);
}

/* ---------------------------------------------------------------- the step graph */

/* One call of the model on T tokens of row 0 written at `pos`, the logits of
 * token `last` of them, and the next token sampled with
 * fold_in(key, pos + last + 1). Inputs "params/...", "tokens" i32[1, T],
 * "pos", "last" i32[], "key" u32[2], "cache/layers/<i>/{k,v}"; outputs
 * "token" i32[1], "logits" [1, V], "cache/...". */
typedef struct step_job {
  const nb_model_config *cfg;
  nb_model_sample_opts sample;
} step_job;

static nb_status step_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const step_job *job = u;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *cache = nb_tree_select_prefix(in, "cache", true);
  nb_tree *new_cache = nb_tree_create(ctx);
  nb_status s = params && cache && new_cache ? NB_OK : NB_ERR_NOMEM;
  if (!s) {
    nb_nn_apply a = {.g = g, .params = params};
    nb_val *pos = nb_tree_get_val(in, "pos"), *last = nb_tree_get_val(in, "last");
    nb_model_fwd f = {.tokens = nb_tree_get_val(in, "tokens"), .cache = cache, .cache_pos = pos,
                      .new_cache = new_cache, .logits_at = last};
    nb_val *logits = nb_model_forward(&a, job->cfg, &f, NULL);
    int64_t ld[2] = {1, job->cfg->vocab_size};
    logits = nb_reshape(logits, 2, ld);
    nb_val *at = nb_add(nb_add(pos, last), nb_scalar(g, NB_I32, 1));
    nb_val *token = nb_model_sample(logits, nb_random_fold_in(nb_tree_get_val(in, "key"), at), &job->sample);
    s = nb_graph_status(g);
    if (!s) s = nb_tree_set_val(out, "token", token);
    if (!s) s = nb_tree_set_val(out, "logits", logits);
    if (!s) s = nb_tree_merge(out, "cache", new_cache);
  }
  nb_tree_destroy(params);
  nb_tree_destroy(cache);
  nb_tree_destroy(new_cache);
  return s;
}

/* ---------------------------------------------------------------- the generator */

enum { SRC_PARAM, SRC_TOKENS, SRC_POS, SRC_LAST, SRC_KEY, SRC_CACHE };

typedef struct step_exe {
  int64_t T;                    /* tokens per call */
  nb_model_sample_opts sample;
  nb_graph *graph;
  nb_exe *exe;                  /* NULL: the interpreter runs graph */
  size_t nin, nout;
  int *in_kind, *in_index;      /* where input i comes from */
  int out_token, *out_cache;    /* output index of "token"; cache slot of output i or -1 */
} step_exe;

struct nb_model_generator {
  nb_ctx *ctx;
  nb_model_config cfg;
  nb_tree *params;              /* f32, in the model's spec order */
  int64_t max_len, chunk, cache_len;
  bool interpret;
  int threads;
  nb_array **cache;             /* 2 * n_layers arrays held only here, so the executables may update them in place */
  step_exe **exes;              /* each allocated alone: pointers to them stay valid as the list grows */
  int n_exes, cap_exes;
};

nb_model_generator *nb_model_generator_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                              const nb_model_gen_opts *opts) {
  if (!cfg || !params) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "generator: NULL config or params"), NULL;
  if (nb_model_config_validate(ctx, cfg)) return NULL;
  nb_model_gen_opts o = opts ? *opts : (nb_model_gen_opts){0};
  int64_t max_len = o.max_seq_len ? o.max_seq_len : cfg->max_seq_len;
  if (max_len < 2 || max_len > cfg->max_seq_len)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "generator: max_seq_len %lld must be in [2, model.max_seq_len = %lld]",
                     (long long)max_len, (long long)cfg->max_seq_len),
           NULL;
  if (o.prefill_chunk < 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "generator: prefill_chunk must be >= 0"), NULL;
  nb_model_generator *g = nb_calloc(ctx, sizeof *g);
  if (!g) return NULL;
  g->ctx = ctx;
  g->cfg = *cfg;
  g->max_len = max_len;
  g->chunk = o.prefill_chunk ? o.prefill_chunk : 64;
  if (g->chunk > max_len) g->chunk = max_len;
  /* a chunk starts at a multiple of chunk below max_len, so its padded
   * tokens end within max_len rounded up to a chunk */
  g->cache_len = (max_len + g->chunk - 1) / g->chunk * g->chunk;
  g->interpret = o.interpret;
  g->threads = o.threads;
  g->params = nb_model__params_f32(ctx, cfg, params, "generator");
  nb_tree *cache = g->params ? nb_model_cache_create(ctx, cfg, 1, g->cache_len, NB_F32) : NULL;
  size_t n = (size_t)(2 * cfg->n_layers);
  g->cache = cache ? nb_calloc(ctx, n * sizeof *g->cache) : NULL;
  if (!g->cache) {
    nb_tree_destroy(cache);
    nb_model_generator_destroy(g);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) { /* cache_create's order: layers/<l>/k, layers/<l>/v */
    g->cache[i] = nb_tree_leaf(cache, i)->array;
    nb_array_retain(g->cache[i]);
  }
  nb_tree_destroy(cache);
  return g;
}

static void exe_free(nb_ctx *ctx, step_exe *e) {
  if (!e) return;
  nb_exe_destroy(e->exe);
  nb_graph_destroy(e->graph);
  nb_dealloc(ctx, e->in_kind, e->nin * sizeof(int));
  nb_dealloc(ctx, e->in_index, e->nin * sizeof(int));
  nb_dealloc(ctx, e->out_cache, e->nout * sizeof(int));
  nb_dealloc(ctx, e, sizeof *e);
}

void nb_model_generator_destroy(nb_model_generator *g) {
  if (!g) return;
  for (int i = 0; i < g->n_exes; i++) exe_free(g->ctx, g->exes[i]);
  nb_dealloc(g->ctx, g->exes, (size_t)g->cap_exes * sizeof *g->exes);
  for (int64_t i = 0; g->cache && i < 2 * g->cfg.n_layers; i++) nb_array_release(g->cache[i]);
  nb_dealloc(g->ctx, g->cache, (size_t)(2 * g->cfg.n_layers) * sizeof *g->cache);
  nb_tree_destroy(g->params);
  nb_dealloc(g->ctx, g, sizeof *g);
}

int64_t nb_model_generator_max_seq_len(const nb_model_generator *g) { return g ? g->max_len : 0; }

/* "cache/layers/<l>/k" -> 2l, ".../v" -> 2l + 1; -1 otherwise */
static int cache_slot(const char *path, int64_t n_layers) {
  long long l;
  char kv, end;
  if (sscanf(path, "cache/layers/%lld/%c%c", &l, &kv, &end) != 2 || l < 0 || l >= n_layers || (kv != 'k' && kv != 'v'))
    return -1;
  return (int)(2 * l + (kv == 'v'));
}

/* where each input of the graph the executable runs comes from */
static nb_status bind_io(nb_model_generator *gen, step_exe *e) {
  nb_ctx *ctx = gen->ctx;
  const nb_graph *run = e->exe ? nb_exe_graph(e->exe) : e->graph;
  e->nin = nb_graph_num_inputs(run);
  e->nout = nb_graph_num_outputs(run);
  e->in_kind = nb_calloc(ctx, e->nin * sizeof(int));
  e->in_index = nb_calloc(ctx, e->nin * sizeof(int));
  e->out_cache = nb_calloc(ctx, e->nout * sizeof(int));
  if (!e->in_kind || !e->in_index || !e->out_cache) return NB_ERR_NOMEM;
  for (size_t i = 0; i < e->nin; i++) {
    const char *p = nb_graph_input_path(run, i);
    int slot = cache_slot(p, gen->cfg.n_layers);
    int64_t at = strncmp(p, "params/", 7) ? -1 : nb_tree_find(gen->params, p + 7);
    if (at >= 0) e->in_kind[i] = SRC_PARAM, e->in_index[i] = (int)at;
    else if (slot >= 0) e->in_kind[i] = SRC_CACHE, e->in_index[i] = slot;
    else if (!strcmp(p, "tokens")) e->in_kind[i] = SRC_TOKENS;
    else if (!strcmp(p, "pos")) e->in_kind[i] = SRC_POS;
    else if (!strcmp(p, "last")) e->in_kind[i] = SRC_LAST;
    else if (!strcmp(p, "key")) e->in_kind[i] = SRC_KEY;
    else return nb_errorf(ctx, NB_ERR_INTERNAL, "generator: unexpected graph input '%s'", p);
  }
  e->out_token = -1;
  for (size_t i = 0; i < e->nout; i++) {
    const char *p = nb_graph_output_path(run, i);
    e->out_cache[i] = cache_slot(p, gen->cfg.n_layers);
    if (!strcmp(p, "token")) e->out_token = (int)i;
  }
  return e->out_token >= 0 ? NB_OK : nb_errorf(ctx, NB_ERR_INTERNAL, "generator: the step graph has no 'token' output");
}

static bool same_sample(const nb_model_sample_opts *a, const nb_model_sample_opts *b) {
  return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

/* The executable for T tokens per call with these sampling options, traced
 * and compiled on first use. */
static step_exe *get_exe(nb_model_generator *gen, int64_t T, const nb_model_sample_opts *so, double *compile_s) {
  for (int i = 0; i < gen->n_exes; i++)
    if (gen->exes[i]->T == T && same_sample(&gen->exes[i]->sample, so)) return gen->exes[i];
  nb_ctx *ctx = gen->ctx;
  if (gen->n_exes == gen->cap_exes) {
    int cap = gen->cap_exes ? 2 * gen->cap_exes : 8;
    step_exe **grown = nb_calloc(ctx, (size_t)cap * sizeof *grown);
    if (!grown) return NULL;
    if (gen->n_exes) memcpy(grown, gen->exes, (size_t)gen->n_exes * sizeof *grown);
    nb_dealloc(ctx, gen->exes, (size_t)gen->cap_exes * sizeof *gen->exes);
    gen->exes = grown;
    gen->cap_exes = cap;
  }
  double t0 = nb_util__now_s();
  step_exe *e = nb_calloc(ctx, sizeof *e);
  if (!e) return NULL;
  e->T = T;
  e->sample = *so;
  nb_tree *spec = nb_tree_create(ctx);
  nb_status s = spec ? nb_tree_merge(spec, "params", gen->params) : NB_ERR_NOMEM;
  int64_t two = 2, dt[2] = {1, T};
  if (!s) s = nb_tree_set(spec, "tokens", nb_leaf_aval(nb_aval_make(NB_I32, 2, dt)));
  if (!s) s = nb_tree_set(spec, "pos", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  if (!s) s = nb_tree_set(spec, "last", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  if (!s) s = nb_tree_set(spec, "key", nb_leaf_aval(nb_aval_make(NB_U32, 1, &two)));
  for (int64_t i = 0; !s && i < 2 * gen->cfg.n_layers; i++) {
    char p[64];
    snprintf(p, sizeof p, "cache/layers/%lld/%c", (long long)(i / 2), "kv"[i % 2]);
    s = nb_tree_set_array(spec, p, gen->cache[i]);
  }
  step_job job = {.cfg = &gen->cfg, .sample = *so};
  if (!s) e->graph = nb_trace(ctx, step_fn, &job, spec);
  nb_tree_destroy(spec);
  if (!s && !e->graph) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (!s && !gen->interpret) {
    const char *donate[] = {"cache", NULL};
    nb_jit_opts jo = {.donate = donate, .threads = gen->threads};
    e->exe = nb_jit(ctx, e->graph, &jo);
    if (!e->exe) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  }
  if (!s) s = bind_io(gen, e);
  if (s) {
    exe_free(ctx, e);
    return NULL;
  }
  gen->exes[gen->n_exes++] = e;
  *compile_s += nb_util__now_s() - t0;
  return e;
}

/* Runs one step: tokens[0..n) padded to e->T at cache position pos; the
 * sampled token of the last real one goes to *token. */
static nb_status run_step(nb_model_generator *gen, step_exe *e, const int32_t *tokens, int64_t n, int64_t pos,
                          nb_array *key, int32_t *token) {
  nb_ctx *ctx = gen->ctx;
  int32_t buf[512];
  int32_t *padded = e->T <= 512 ? buf : nb_calloc(ctx, (size_t)e->T * sizeof(int32_t));
  if (!padded) return NB_ERR_NOMEM;
  memset(padded, 0, (size_t)e->T * sizeof(int32_t));
  memcpy(padded, tokens, (size_t)n * sizeof(int32_t));
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, e->T}, padded);
  if (padded != buf) nb_dealloc(ctx, padded, (size_t)e->T * sizeof(int32_t));
  nb_array *posa = nb_array_scalar(ctx, NB_I32, (double)pos), *lasta = nb_array_scalar(ctx, NB_I32, (double)(n - 1));
  nb_array **in = nb_calloc(ctx, (e->nin + 1) * sizeof *in), **out = nb_calloc(ctx, (e->nout + 1) * sizeof *out);
  nb_status s = tok && posa && lasta && in && out ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < e->nin; i++) switch (e->in_kind[i]) {
    case SRC_PARAM: in[i] = nb_tree_leaf(gen->params, (size_t)e->in_index[i])->array; break;
    case SRC_CACHE: in[i] = gen->cache[e->in_index[i]]; break;
    case SRC_TOKENS: in[i] = tok; break;
    case SRC_POS: in[i] = posa; break;
    case SRC_LAST: in[i] = lasta; break;
    default: in[i] = key; break;
    }
  if (!s) s = e->exe ? nb_exe_run_flat(e->exe, in, out) : nb_graph_run_flat(ctx, e->graph, in, out);
  if (!s) {
    *token = (int32_t)nb_array_get(out[e->out_token], 0);
    for (size_t i = 0; i < e->nout; i++) {
      int slot = e->out_cache[i];
      if (slot < 0) continue;
      nb_array_release(gen->cache[slot]); /* the output may be this very array, updated in place */
      gen->cache[slot] = out[i];
      out[i] = NULL;
    }
  }
  for (size_t i = 0; out && i < e->nout; i++) nb_array_release(out[i]);
  nb_dealloc(ctx, in, (e->nin + 1) * sizeof *in);
  nb_dealloc(ctx, out, (e->nout + 1) * sizeof *out);
  nb_array_release(tok);
  nb_array_release(posa);
  nb_array_release(lasta);
  if (s == NB_ERR_NOMEM && !nb_ctx_status(ctx)) nb_errorf(ctx, NB_ERR_NOMEM, "generator: out of memory");
  return s;
}

/* tokens per call of the last prefill chunk holding n tokens: the smallest
 * power of two >= n (at least 8), at most the chunk */
static int64_t tail_bucket(const nb_model_generator *gen, int64_t n) {
  int64_t b = 8;
  while (b < n) b *= 2;
  return b < gen->chunk ? b : gen->chunk;
}

static nb_status check_request(nb_model_generator *gen, const nb_model_gen_request *r) {
  nb_ctx *ctx = gen->ctx;
  if (!r || !r->prompt || r->n_prompt < 1 || r->max_tokens < 0 || (r->n_stop > 0 && !r->stop))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "generate: need a prompt of >= 1 tokens, max_tokens >= 0, stop ids when n_stop > 0");
  if (r->n_prompt >= gen->max_len)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "generate: the prompt has %lld tokens but the context holds %lld (max_seq_len), prompt and output "
                     "together; shorten the prompt to at most %lld tokens",
                     (long long)r->n_prompt, (long long)gen->max_len, (long long)gen->max_len - 1);
  for (int64_t i = 0; i < r->n_prompt; i++)
    if (r->prompt[i] < 0 || r->prompt[i] >= gen->cfg.vocab_size)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "generate: prompt token %lld is id %d, outside the vocabulary [0, %lld)",
                       (long long)i, (int)r->prompt[i], (long long)gen->cfg.vocab_size);
  return NB_OK;
}

static bool is_stop(const nb_model_gen_request *r, int32_t t) {
  for (int i = 0; i < r->n_stop; i++)
    if (r->stop[i] == t) return true;
  return false;
}

nb_status nb_model_generate(nb_model_generator *gen, const nb_model_gen_request *r, nb_model_gen_result *res) {
  if (!gen) return NB_ERR_INVALID_ARG;
  nb_model_gen_result local = {0};
  if (!res) res = &local;
  memset(res, 0, sizeof *res);
  nb_status s = check_request(gen, r);
  if (s || r->max_tokens == 0) return s;
  /* every executable this request needs is compiled before the clock starts */
  int64_t n = r->n_prompt, C = gen->chunk, full = (n - 1) / C, tail = n - full * C;
  step_exe *chunk_exe = full ? get_exe(gen, C, &r->sample, &res->compile_s) : NULL;
  step_exe *tail_exe = get_exe(gen, tail_bucket(gen, tail), &r->sample, &res->compile_s);
  step_exe *dec_exe = r->max_tokens > 1 ? get_exe(gen, 1, &r->sample, &res->compile_s) : NULL;
  if ((full && !chunk_exe) || !tail_exe || (r->max_tokens > 1 && !dec_exe)) return nb_ctx_status(gen->ctx);
  nb_array *key = nb_key(gen->ctx, r->seed);
  if (!key) return NB_ERR_NOMEM;
  double t0 = nb_util__now_s();
  int32_t tok = 0;
  for (int64_t c = 0; !s && c < full; c++) s = run_step(gen, chunk_exe, r->prompt + c * C, C, c * C, key, &tok);
  if (!s) s = run_step(gen, tail_exe, r->prompt + full * C, tail, full * C, key, &tok);
  res->prefill_tokens = s ? 0 : n;
  res->prefill_s = nb_util__now_s() - t0;
  double t1 = nb_util__now_s();
  while (!s) {
    if (r->out) r->out[res->n_tokens] = tok;
    res->n_tokens++;
    bool go_on = r->on_token ? r->on_token(r->ud, tok) : true;
    if (is_stop(r, tok)) {
      res->stopped = true;
      break;
    }
    if (!go_on || res->n_tokens == r->max_tokens) break;
    if (n + res->n_tokens >= gen->max_len) {
      res->truncated = true;
      nb_logf(gen->ctx, NB_LOG_INFO, "generate: stopped after %lld tokens: the context of %lld tokens (max_seq_len) is full",
              (long long)res->n_tokens, (long long)gen->max_len);
      break;
    }
    s = run_step(gen, dec_exe, &tok, 1, n + res->n_tokens - 1, key, &tok);
  }
  res->decode_s = nb_util__now_s() - t1;
  nb_array_release(key);
  return s;
}
