/* `nabla eval`: the held-out loss and perplexity of a model on a text file:
 * the text as the model's token ids (bytes without a tokenizer), cut into
 * consecutive windows of seq_len + 1 tokens (stride seq_len), each window's
 * seq_len next-token predictions scored from the forward's logits (log
 * softmax in f64 on the host). Quantized models (a run dir from `nabla
 * quantize --rules`, a GGUF file) run their linears on the quant kernels,
 * as generate and serve do. Also printed: the score of each window's second
 * half only (llama-perplexity's convention: the first half is context). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla eval MODEL --data TEXT [options]\n"
    "  MODEL              a run dir, a checkpoint step, a Hugging Face folder or a GGUF file; quantized\n"
    "                     linears (nabla quantize --rules, GGUF Q8_0 / Q4_0) run on the quant kernels\n"
    "  --data FILE        held-out text, tokenized with the model's tokenizer (bytes when it has none)\n"
    "  --seq-len T        tokens of context per window (default: the model's max_seq_len, at most 512)\n"
    "  --max-windows N    score at most N windows (default: all)\n"
    "  --batch B          windows per forward (default 8)\n"
    "  --gguf-act MODE    a GGUF file's Q8_0 / Q4_0 / Q6_K activations: int8_block (default, llama.cpp's) or none\n"
    "  --config FILE      the run config for a checkpoint step\n"
    "  --threads N        compute threads (default: $NABLA_THREADS, else all CPUs)\n"
    "prints: nll (nats/token) and perplexity over all predictions and over each window's second half\n";

typedef struct sums {
  double nll, nll_half;
  int64_t n, n_half;
} sums;

/* Scores rows [0, rows) of logits [B, T, V] against targets [B, T]. */
static void score(const float *logits, const int32_t *targets, int64_t rows, int64_t T, int64_t V, sums *s) {
  for (int64_t b = 0; b < rows; b++)
    for (int64_t t = 0; t < T; t++) {
      const float *l = logits + (b * T + t) * V;
      double mx = -INFINITY, z = 0;
      for (int64_t v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
      for (int64_t v = 0; v < V; v++) z += exp((double)l[v] - mx);
      double nll = mx + log(z) - (double)l[targets[b * T + t]];
      s->nll += nll, s->n++;
      if (t >= T / 2) s->nll_half += nll, s->n_half++;
    }
}

int nb_cmd_eval(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  const char *model = NULL, *data = NULL, *config = NULL;
  int64_t T = 0, max_windows = 0, B = 8, threads = 0;
  nb_quant_act gguf_act = NB_QUANT_ACT_INT8_BLOCK;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool ok = true;
    if (!strcmp(a, "--data") && v) data = v, i++;
    else if (!strcmp(a, "--config") && v) config = v, i++;
    else if (!strcmp(a, "--seq-len")) ok = nb_cli_int("eval", a, v, 1, 1 << 20, &T), i++;
    else if (!strcmp(a, "--max-windows")) ok = nb_cli_int("eval", a, v, 1, INT64_MAX, &max_windows), i++;
    else if (!strcmp(a, "--batch")) ok = nb_cli_int("eval", a, v, 1, 4096, &B), i++;
    else if (!strcmp(a, "--threads")) ok = nb_cli_int("eval", a, v, 1, 65536, &threads), i++;
    else if (!strcmp(a, "--gguf-act") && v) {
      if (!strcmp(v, "none")) gguf_act = NB_QUANT_ACT_NONE;
      else if (!strcmp(v, "int8_block")) gguf_act = NB_QUANT_ACT_INT8_BLOCK;
      else return fprintf(stderr, "nabla eval: --gguf-act '%s': none or int8_block\n", v), 2;
      i++;
    } else if (a[0] == '-' || model) {
      return fprintf(stderr, "nabla eval: unexpected or incomplete argument '%s'\n", a), nb_cli_usage(usage_text, false);
    } else {
      model = a;
    }
    if (!ok) return 2;
  }
  if (!model || !data) return fprintf(stderr, "nabla eval: MODEL and --data are required\n"), nb_cli_usage(usage_text, false);
  int nthreads = nb_cli_threads("eval", (int)threads);
  if (!nthreads) return 2;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_model_loaded m = {0};
  int32_t *ids = NULL;
  size_t n_ids = 0;
  nb_quant_plan *plan = NULL;
  nb_graph *g = NULL;
  nb_exe *e = NULL;
  int rc = 1;
  nb_status s;
  int64_t nq = 0;
  if (nb_cli_is_gguf(model)) {
    s = config ? nb_errorf(ctx, NB_ERR_INVALID_ARG, "--config goes with a checkpoint, not a GGUF file") : nb_model_load_gguf(ctx, model, &m);
    if (!s && (s = nb_cli_gguf_keep_quantized(ctx, model, &m, gguf_act, &nq))) nb_model_loaded_free(&m);
  } else {
    s = nb_cli_load_model(ctx, model, config, &m);
  }
  if (s) goto fail;
  if (T == 0) T = m.cfg.max_seq_len < 512 ? m.cfg.max_seq_len : 512;
  if (T > m.cfg.max_seq_len) {
    fprintf(stderr, "nabla eval: --seq-len %lld exceeds the model's max_seq_len %lld\n", (long long)T, (long long)m.cfg.max_seq_len);
    goto done;
  }
  if (nb_cli_text_ids(ctx, data, &m, &ids, &n_ids)) goto fail;
  int64_t windows = n_ids > 1 ? (int64_t)(n_ids - 1) / T : 0;
  if (max_windows && windows > max_windows) windows = max_windows;
  if (windows < 1) {
    fprintf(stderr, "nabla eval: %s: %zu tokens, fewer than one window of --seq-len %lld + 1\n", data, n_ids, (long long)T);
    goto done;
  }
  if (B > windows) B = windows;
  int64_t n_plan = nb_quant_tree_count(ctx, m.params);
  if (n_plan < 0 || (n_plan > 0 && !(plan = nb_quant_plan_create(ctx, m.params)))) goto fail;
  nb_tree *bspec = nb_tree_create(ctx);
  nb_tree_set(bspec, "inputs", nb_leaf_aval(nb_aval_make(NB_I32, 2, (int64_t[]){B, T})));
  nb_model_trace_opts mo = {.linear_hook = plan ? nb_quant_linear_hook : NULL, .hook_ud = plan};
  g = nb_model_trace_forward(ctx, &m.cfg, &mo, m.params, bspec);
  nb_tree_destroy(bspec);
  e = g ? nb_jit(ctx, g, &(nb_jit_opts){.threads = nthreads}) : NULL;
  if (!e) goto fail;
  int32_t *in = malloc(sizeof *in * (size_t)(B * T)), *tg = malloc(sizeof *tg * (size_t)(B * T));
  sums sm = {0};
  s = in && tg ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "out of memory");
  for (int64_t w0 = 0; !s && w0 < windows; w0 += B) {
    int64_t rows = windows - w0 < B ? windows - w0 : B;
    for (int64_t b = 0; b < B; b++) { /* a short last batch repeats its last window (not scored) */
      const int32_t *src = ids + (w0 + (b < rows ? b : rows - 1)) * T;
      memcpy(in + b * T, src, sizeof *in * (size_t)T), memcpy(tg + b * T, src + 1, sizeof *tg * (size_t)T);
    }
    nb_tree *inputs = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_array *a = nb_array_create(ctx, NB_I32, 2, (int64_t[]){B, T}, in);
    s = inputs && out && a ? nb_tree_merge(inputs, "params", m.params) : NB_ERR_NOMEM;
    if (!s) s = nb_tree_set_array(inputs, "batch/inputs", a);
    if (!s) s = nb_exe_run(e, inputs, out);
    nb_array *logits = s ? NULL : nb_tree_get_array(out, "logits");
    if (!s && (!logits || nb_array_dtype(logits) != NB_F32)) s = nb_errorf(ctx, NB_ERR_INTERNAL, "eval: no f32 logits");
    if (!s) score(nb_array_data(logits), tg, rows, T, nb_array_dims(logits)[2], &sm);
    nb_array_release(a);
    nb_tree_destroy(inputs), nb_tree_destroy(out);
  }
  free(in), free(tg);
  if (s) goto fail;
  double nll = sm.nll / (double)sm.n, half = sm.nll_half / (double)sm.n_half;
  printf("nabla eval: %s on %s: %lld windows of %lld tokens (%lld predictions)%s\n", model, data, (long long)windows, (long long)T,
         (long long)sm.n, n_plan > 0 ? ", quantized linears on the quant kernels" : "");
  printf("nll %.6f nats/token, perplexity %.4f; second halves: nll %.6f, perplexity %.4f\n", nll, exp(nll), half, exp(half));
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "nabla eval: %s\n", nb_ctx_error(ctx));
done:
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_quant_plan_destroy(plan);
  free(ids);
  nb_model_loaded_free(&m);
  nb_ctx_destroy(ctx);
  return rc;
}
