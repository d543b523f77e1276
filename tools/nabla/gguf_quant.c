/* A GGUF Llama's Q8_0 / Q4_0 linears kept quantized: after the model loader
 * (which decodes every tensor to f32), each such kernel is replaced by the
 * int8 / int4 g32 quant tree of the file's own blocks (nb_quant_from_ggml),
 * so generate and serve run it on the quant kernels, by default with int8
 * per-32-block activations (int8_block: what llama.cpp computes for these
 * types); act NB_QUANT_ACT_NONE keeps them weight-only (f32 activations).
 * Q6_K (llama.cpp's output.weight in Q4_0 files) becomes int8 g16 with the
 * same act (int8_block scales each 16 of a 32-block by its own tile, as
 * llama.cpp's Q6_K x Q8_K product does). Other types stay f32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

/* The file's row of nabla's (Hugging Face's) row r of a q/k weight whose
 * heads have hd rows: llama.cpp's converter pairs each head's halves
 * (docs/gguf.md, "The q/k permutation"). */
static int64_t ggml_row(int64_t r, int64_t hd) {
  int64_t h = r / hd, rem = r % hd, half = hd / 2;
  return h * hd + 2 * (rem % half) + rem / half;
}

static nb_status one(nb_ctx *ctx, const nb_gguf *g, nb_model_loaded *m, const char *theirs, const char *ours, int64_t heads,
                     nb_quant_act act, int64_t *done) {
  const nb_gguf_tensor *t = nb_gguf_find_tensor(g, theirs);
  if (!t || (t->type != NB_GGUF_Q8_0 && t->type != NB_GGUF_Q4_0 && t->type != NB_GGUF_Q6_K) || t->n_dims != 2) return NB_OK;
  char kp[300];
  snprintf(kp, sizeof kp, "%s/kernel", ours);
  nb_array *f32 = nb_tree_get_array(m->params, kp);
  int64_t k = t->ne[0], n = t->ne[1];
  /* the loader's kernel [in, out] must be this tensor's (else leave it) */
  if (!f32 || nb_array_rank(f32) != 2 || nb_array_dims(f32)[0] != k || nb_array_dims(f32)[1] != n || k % (t->type == NB_GGUF_Q6_K ? 256 : 32))
    return NB_OK;
  int64_t *rows = NULL;
  if (heads) {
    rows = malloc((size_t)n * sizeof *rows);
    if (!rows) return nb_errorf(ctx, NB_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < n; r++) rows[r] = ggml_row(r, n / heads);
  }
  nb_quant_weight q;
  nb_status s = nb_quant_from_ggml(ctx, (int)t->type, t->data, n, k, rows, &q);
  free(rows);
  if (s) return nb_errorf(ctx, s, "%s: tensor '%s': %s", nb_gguf_name(g), theirs, nb_ctx_error(ctx));
  s = nb_quant_tree_set_linear(m->params, ours, &q, act, -1);
  nb_quant_weight_release(&q);
  if (!s) ++*done;
  return s;
}

int nb_cli_gguf_keep_quantized(nb_ctx *ctx, const char *path, nb_model_loaded *m, nb_quant_act act, int64_t *n_quantized) {
  *n_quantized = 0;
  nb_gguf *g = nb_gguf_open(ctx, path);
  if (!g) return nb_ctx_status(ctx);
  const char *arch = NULL;
  size_t alen = 0;
  nb_status s = NB_OK;
  if (nb_gguf_get_string(g, "general.architecture", &arch, &alen) || alen != 5 || memcmp(arch, "llama", 5)) {
    nb_ctx_clear_error(ctx); /* GPT-2's fused qkv stays f32 */
    nb_gguf_close(g);
    return NB_OK;
  }
  static const struct { const char *theirs, *ours; int heads; } lin[] = {
      {"attn_q", "attn/wq", 1}, {"attn_k", "attn/wk", 2}, {"attn_v", "attn/wv", 0}, {"attn_output", "attn/wo", 0},
      {"ffn_gate", "mlp/wi_0", 0}, {"ffn_up", "mlp/wi_1", 0}, {"ffn_down", "mlp/wo", 0}};
  for (int64_t l = 0; !s && l < m->cfg.n_layers; l++)
    for (size_t i = 0; !s && i < sizeof lin / sizeof *lin; i++) {
      char theirs[96], ours[96];
      snprintf(theirs, sizeof theirs, "blk.%lld.%s.weight", (long long)l, lin[i].theirs);
      snprintf(ours, sizeof ours, "layers/%lld/%s", (long long)l, lin[i].ours);
      int64_t heads = lin[i].heads == 1 ? m->cfg.n_heads : lin[i].heads == 2 ? m->cfg.n_kv_heads : 0;
      s = one(ctx, g, m, theirs, ours, heads, act, n_quantized);
    }
  if (!s && !m->cfg.tie_embeddings) s = one(ctx, g, m, "output.weight", "lm_head", 0, act, n_quantized);
  nb_gguf_close(g);
  return s;
}
