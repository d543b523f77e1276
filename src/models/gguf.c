/* Llama- and GPT-2-architecture GGUF files (llama.cpp's format) as nabla
 * models, and nabla models as such files.
 *
 * In: the config from the `llama.*` (`gpt2.*`) metadata, the tensors renamed from
 * llama.cpp's names (token_embd, blk.N.attn_q, ..., output) and decoded to
 * f32 (quantized execution comes with the quant kernels), ggml's linears
 * (ne = [in, out]: `out` rows of `in` values) transposed to nabla's
 * row-major [in, out] kernels,
 * and the rows of attn_q / attn_k put back in Hugging Face order: llama.cpp's
 * converter permutes them so that its RoPE, which rotates adjacent pairs,
 * computes what HF's rotate-half does; nabla rotates halves like HF.
 * GPT-2's fused attn_qkv is split into wq, wk, wv (and stacked back). The
 * tokenizer comes from `tokenizer.ggml.*`: "llama" (SentencePiece BPE with
 * scores and byte fallback) or "gpt2" (byte-level BPE with merges).
 *
 * Out: the same mapping backwards; 1-D tensors (norms) stay F32 as
 * llama.cpp's converter keeps them. docs/gguf.md has the tables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/internal.h"
#include "nabla/ckpt.h"

/* ---------------------------------------------------------------- names */

/* How a nabla parameter sits in a GGUF tensor: as is (embeddings, norms,
 * biases), a linear (transposed), a q/k linear (transposed, rows permuted
 * for llama.cpp's RoPE), or the part'th third of GPT-2's fused attn_qkv
 * (weight rows or bias elements). */
enum { AS_IS, LINEAR, LINEAR_Q, LINEAR_K, QKV, QKV_BIAS };

typedef struct name_map {
  const char *ours, *theirs;
  int kind, part;
} name_map;

static const name_map llama_layer[] = {
    {"attn_norm/scale", "attn_norm.weight", AS_IS, 0},  {"mlp_norm/scale", "ffn_norm.weight", AS_IS, 0},
    {"attn/wq/kernel", "attn_q.weight", LINEAR_Q, 0},   {"attn/wk/kernel", "attn_k.weight", LINEAR_K, 0},
    {"attn/wv/kernel", "attn_v.weight", LINEAR, 0},     {"attn/wo/kernel", "attn_output.weight", LINEAR, 0},
    {"mlp/wi_0/kernel", "ffn_gate.weight", LINEAR, 0},  {"mlp/wi_1/kernel", "ffn_up.weight", LINEAR, 0},
    {"mlp/wo/kernel", "ffn_down.weight", LINEAR, 0},    {NULL, NULL, 0, 0},
};
static const name_map llama_top[] = {
    {"embed/embedding", "token_embd.weight", AS_IS, 0}, {"final_norm/scale", "output_norm.weight", AS_IS, 0},
    {"lm_head/kernel", "output.weight", LINEAR, 0},     {NULL, NULL, 0, 0},
};
static const name_map gpt2_layer[] = {
    {"attn_norm/scale", "attn_norm.weight", AS_IS, 0}, {"attn_norm/bias", "attn_norm.bias", AS_IS, 0},
    {"attn/wq/kernel", "attn_qkv.weight", QKV, 0},     {"attn/wk/kernel", "attn_qkv.weight", QKV, 1},
    {"attn/wv/kernel", "attn_qkv.weight", QKV, 2},     {"attn/wq/bias", "attn_qkv.bias", QKV_BIAS, 0},
    {"attn/wk/bias", "attn_qkv.bias", QKV_BIAS, 1},    {"attn/wv/bias", "attn_qkv.bias", QKV_BIAS, 2},
    {"attn/wo/kernel", "attn_output.weight", LINEAR, 0}, {"attn/wo/bias", "attn_output.bias", AS_IS, 0},
    {"mlp_norm/scale", "ffn_norm.weight", AS_IS, 0},   {"mlp_norm/bias", "ffn_norm.bias", AS_IS, 0},
    {"mlp/wi/kernel", "ffn_up.weight", LINEAR, 0},     {"mlp/wi/bias", "ffn_up.bias", AS_IS, 0},
    {"mlp/wo/kernel", "ffn_down.weight", LINEAR, 0},   {"mlp/wo/bias", "ffn_down.bias", AS_IS, 0},
    {NULL, NULL, 0, 0},
};
static const name_map gpt2_top[] = {
    {"embed/embedding", "token_embd.weight", AS_IS, 0}, {"pos_embed/embedding", "position_embd.weight", AS_IS, 0},
    {"final_norm/scale", "output_norm.weight", AS_IS, 0}, {"final_norm/bias", "output_norm.bias", AS_IS, 0},
    {"lm_head/kernel", "output.weight", LINEAR, 0},     {NULL, NULL, 0, 0},
};

/* the llama.cpp name, kind and part of a nabla path; false when it has none */
static bool gguf_name(nb_model_family fam, const char *path, char *name, size_t cap, int *kind, int *part) {
  const name_map *top = fam == NB_MODEL_GPT2 ? gpt2_top : llama_top, *layer = fam == NB_MODEL_GPT2 ? gpt2_layer : llama_layer;
  for (const name_map *m = top; m->ours; m++)
    if (!strcmp(path, m->ours)) {
      snprintf(name, cap, "%s", m->theirs);
      return *kind = m->kind, *part = m->part, true;
    }
  long long l;
  int at = 0;
  if (sscanf(path, "layers/%lld/%n", &l, &at) != 1 || !at) return false;
  for (const name_map *m = layer; m->ours; m++)
    if (!strcmp(path + at, m->ours)) {
      snprintf(name, cap, "blk.%lld.%s", l, m->theirs);
      return *kind = m->kind, *part = m->part, true;
    }
  return false;
}

/* llama.cpp's row of Hugging Face row r of a q/k weight with `heads` heads
 * of hd rows: within a head, HF's halves [x0..x(hd/2-1) | y0..] become
 * pairs (x0 y0 x1 y1 ...) (convert_hf_to_gguf's LlamaModel.permute). */
static int64_t ggml_row(int64_t r, int64_t hd) {
  int64_t h = r / hd, rem = r % hd, half = hd / 2;
  return h * hd + 2 * (rem % half) + rem / half;
}

/* w [out, in] (ggml row-major) -> nabla kernel [in, out]; heads > 0 undoes
 * the q/k permutation */
static nb_array *kernel_from_rows(nb_ctx *ctx, const nb_array *w, int64_t heads) {
  const int64_t *d = nb_array_dims(w);
  int64_t out = d[0], in = d[1], hd = heads ? out / heads : 0, kd[2] = {in, out};
  nb_array *y = nb_array_empty(ctx, NB_F32, 2, kd);
  if (!y) return NULL;
  const float *src = nb_array_data(w);
  float *dst = nb_array_data_mut(y);
  enum { TILE = 32 };
  for (int64_t r0 = 0; r0 < out; r0 += TILE)
    for (int64_t c0 = 0; c0 < in; c0 += TILE)
      for (int64_t r = r0; r < r0 + TILE && r < out; r++) {
        const float *row = src + (heads ? ggml_row(r, hd) : r) * in;
        for (int64_t c = c0; c < c0 + TILE && c < in; c++) dst[c * out + r] = row[c];
      }
  return y;
}

/* nabla kernel [in, out] -> ggml rows [out, in]; heads > 0 applies the q/k
 * permutation */
static nb_array *rows_from_kernel(nb_ctx *ctx, const nb_array *k, int64_t heads) {
  const int64_t *d = nb_array_dims(k);
  int64_t in = d[0], out = d[1], hd = heads ? out / heads : 0, rd[2] = {out, in};
  nb_array *y = nb_array_empty(ctx, NB_F32, 2, rd);
  if (!y) return NULL;
  const float *src = nb_array_data(k);
  float *dst = nb_array_data_mut(y);
  enum { TILE = 32 };
  for (int64_t r0 = 0; r0 < out; r0 += TILE)
    for (int64_t c0 = 0; c0 < in; c0 += TILE)
      for (int64_t r = r0; r < r0 + TILE && r < out; r++) {
        float *row = dst + (heads ? ggml_row(r, hd) : r) * in;
        for (int64_t c = c0; c < c0 + TILE && c < in; c++) row[c] = src[c * out + r];
      }
  return y;
}

/* ---------------------------------------------------------------- config */

typedef struct gg_load {
  nb_ctx *ctx;
  nb_gguf *g;
  const char *path;
  bool rope_freqs;   /* rope_freqs.weight was read into the config */
} gg_load;

/* a required (def < 0) or optional positive integer key */
static nb_status key_int(gg_load *L, const char *key, int64_t def, int64_t *out) {
  if (!nb_gguf_get(L->g, key) && def >= 0) return *out = def, NB_OK;
  nb_status s = nb_gguf_get_int(L->g, key, out);
  if (!s && *out < 1) s = nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key '%s' is %lld, expected a positive integer", L->path, key, (long long)*out);
  return s;
}

static nb_status key_float(gg_load *L, const char *key, double def, double *out) {
  if (!nb_gguf_get(L->g, key) && def >= 0) return *out = def, NB_OK;
  nb_status s = nb_gguf_get_float(L->g, key, out);
  if (!s && !(*out > 0)) s = nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key '%s' is %g, expected a positive number", L->path, key, *out);
  return s;
}

static bool key_is(gg_load *L, const char *key, const char *want) {
  const nb_gguf_value *v = nb_gguf_get(L->g, key);
  return v && v->type == NB_GGUF_STRING && v->len == strlen(want) && !memcmp(v->str, want, v->len);
}

/* The per-frequency divisors of Llama-3.1's RoPE scaling for cfg:
 * unscaled frequency over scaled one, as llama.cpp's converter computes
 * them into rope_freqs.weight. */
static nb_status llama3_factors(nb_ctx *ctx, const nb_nn_rope_cfg *cfg, int64_t hd, float *out) {
  double scaled[2048];
  nb_nn_rope_cfg plain = *cfg;
  plain.scaling = NB_NN_ROPE_NONE;
  double base[2048];
  nb_status s = hd / 2 > 2048 ? nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "gguf: head_dim %lld exceeds 4096", (long long)hd) : NB_OK;
  if (!s) s = nb_nn_rope_freqs(ctx, cfg, hd, scaled);
  if (!s) s = nb_nn_rope_freqs(ctx, &plain, hd, base);
  for (int64_t i = 0; !s && i < hd / 2; i++) out[i] = (float)(base[i] / scaled[i]);
  return s;
}

/* rope_freqs.weight holds only the divisors; nabla's config holds Llama
 * 3.1's parameters. The divisors depend on (factor, original context,
 * low and high frequency factors) only through the largest divisor and the
 * ramp between, so the first of the usual parameter sets that reproduces
 * every divisor (to 1e-5) computes the same model; none is refused. */
static nb_status llama3_from_factors(gg_load *L, const nb_gguf_tensor *t, nb_model_config *c, int64_t hd) {
  nb_ctx *ctx = L->ctx;
  if (t->n_dims != 1 || t->ne[0] != hd / 2)
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: tensor 'rope_freqs.weight' has %lld values, the heads need %lld", L->path,
                     (long long)t->n_elems, (long long)(hd / 2));
  nb_array *fa = nb_gguf_tensor_f32(L->g, t);
  if (!fa) return nb_ctx_status(ctx);
  const float *want = nb_array_data(fa);
  float top = 0, got[2048];
  for (int64_t i = 0; i < hd / 2; i++) top = want[i] > top ? want[i] : top;
  nb_status s = NB_ERR_UNIMPLEMENTED;
  bool ones = true;
  for (int64_t i = 0; i < hd / 2; i++) ones &= fabsf(want[i] - 1) <= 1e-6f;
  if (ones) s = NB_OK;
  static const double highs[] = {4, 2, 8, 3};
  for (int h = 0; s && h < 4; h++)
    for (int k = 0; s && k <= 20; k++) {
      nb_nn_rope_cfg r = c->rope_cfg;
      r.scaling = NB_NN_ROPE_LLAMA3, r.factor = top, r.low_freq_factor = 1, r.high_freq_factor = highs[h];
      r.original_max_pos = (int64_t)1 << k;
      if (llama3_factors(ctx, &r, hd, got)) break;
      bool same = true;
      for (int64_t i = 0; same && i < hd / 2; i++) same = fabsf(got[i] - want[i]) <= 1e-5f * want[i];
      if (same) c->rope_cfg = r, s = NB_OK;
    }
  nb_array_release(fa);
  if (s) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: tensor 'rope_freqs.weight': these RoPE divisors are not a Llama-3.1 "
                          "scaling nabla can express (largest %g)", L->path, top);
  L->rope_freqs = true;
  return NB_OK;
}

/* the llama.* keys beyond the common ones: GQA, head size, RoPE */
static nb_status parse_llama(gg_load *L, nb_model_config *c) {
  nb_ctx *ctx = L->ctx;
  int64_t key_len = 0, rope_dims = 0, experts = 0;
  nb_status s = key_int(L, "llama.attention.head_count_kv", c->n_heads, &c->n_kv_heads);
  if (!s) s = key_float(L, "llama.attention.layer_norm_rms_epsilon", -1, &c->norm_eps);
  if (!s) s = key_float(L, "llama.rope.freq_base", 10000, &c->rope_cfg.theta);
  if (!s) s = key_int(L, "llama.attention.key_length", 0, &key_len);
  if (!s) s = key_int(L, "llama.rope.dimension_count", 0, &rope_dims);
  if (!s && nb_gguf_get(L->g, "llama.expert_count")) s = nb_gguf_get_int(L->g, "llama.expert_count", &experts);
  if (s) return s;
  if (experts > 0)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'llama.expert_count' is %lld; mixture-of-experts GGUF files are not supported",
                     L->path, (long long)experts);
  int64_t hd = key_len ? key_len : c->d_model / c->n_heads;
  c->head_dim = key_len && key_len != c->d_model / c->n_heads ? key_len : 0;
  if (rope_dims && rope_dims != hd)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'llama.rope.dimension_count' is %lld but heads have %lld dims; partial "
                     "rotary embeddings are not supported", L->path, (long long)rope_dims, (long long)hd);
  const nb_gguf_value *rs = nb_gguf_get(L->g, "llama.rope.scaling.type");
  if (rs && !key_is(L, "llama.rope.scaling.type", "none")) {
    if (!key_is(L, "llama.rope.scaling.type", "linear"))
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'llama.rope.scaling.type' is '%.*s'; supported: none, linear", L->path,
                       rs->type == NB_GGUF_STRING ? (int)(rs->len < 64 ? rs->len : 64) : 1, rs->type == NB_GGUF_STRING ? rs->str : "?");
    c->rope_cfg.scaling = NB_NN_ROPE_LINEAR;
    if ((s = key_float(L, "llama.rope.scaling.factor", -1, &c->rope_cfg.factor))) return s;
  }
  const nb_gguf_tensor *rf = nb_gguf_find_tensor(L->g, "rope_freqs.weight");
  return rf ? llama3_from_factors(L, rf, c, hd) : NB_OK;
}

/* gpt2.*: one head count (no GQA), LayerNorm epsilon */
static nb_status parse_gpt2(gg_load *L, nb_model_config *c) {
  int64_t kv = c->n_heads;
  nb_status s = key_int(L, "gpt2.attention.head_count_kv", c->n_heads, &kv);
  if (!s && kv != c->n_heads)
    return nb_errorf(L->ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'gpt2.attention.head_count_kv' is %lld; GPT-2 models have as many KV heads "
                     "as heads (%lld)", L->path, (long long)kv, (long long)c->n_heads);
  if (!s) s = key_float(L, "gpt2.attention.layer_norm_epsilon", -1, &c->norm_eps);
  return s;
}

static nb_status parse_config(gg_load *L, nb_model_loaded *m) {
  nb_ctx *ctx = L->ctx;
  const char *arch;
  size_t n;
  nb_status s = nb_gguf_get_string(L->g, "general.architecture", &arch, &n);
  if (s) return s;
  bool llama = n == 5 && !memcmp(arch, "llama", 5), gpt2 = n == 4 && !memcmp(arch, "gpt2", 4);
  if (!llama && !gpt2)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'general.architecture' is '%.*s'; supported: llama, gpt2", L->path,
                     (int)(n < 64 ? n : 64), arch);
  nb_model_config *c = &m->cfg;
  nb_model_config_preset(ctx, llama ? "llama-tiny" : "gpt2-tiny", c); /* the family's switches; every size is set below */
  char key[64];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", llama ? "llama" : "gpt2", suffix), key)
  if (!s) s = key_int(L, KEY("embedding_length"), -1, &c->d_model);
  if (!s) s = key_int(L, KEY("block_count"), -1, &c->n_layers);
  if (!s) s = key_int(L, KEY("feed_forward_length"), -1, &c->d_ff);
  if (!s) s = key_int(L, KEY("attention.head_count"), -1, &c->n_heads);
  if (!s) s = key_int(L, KEY("context_length"), -1, &c->max_seq_len);
  if (!s) c->n_kv_heads = c->n_heads;
  if (!s) s = llama ? parse_llama(L, c) : parse_gpt2(L, c);
  if (s) return s;
  const nb_gguf_tensor *emb = nb_gguf_find_tensor(L->g, "token_embd.weight");
  if (!emb || emb->n_dims != 2)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: tensor 'token_embd.weight' is %s", L->path, emb ? "not 2-D" : "missing");
  c->vocab_size = emb->ne[1];
  int64_t vs = 0;
  if (nb_gguf_get(L->g, KEY("vocab_size")) && !(s = key_int(L, key, -1, &vs)) && vs != c->vocab_size)
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: key '%s' is %lld but tensor 'token_embd.weight' has %lld rows", L->path, key,
                     (long long)vs, (long long)c->vocab_size);
#undef KEY
  if (s) return s;
  c->tie_embeddings = !nb_gguf_find_tensor(L->g, "output.weight");
  if (nb_model_config_validate(ctx, c)) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s", L->path, msg);
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- weights */

static void shape_str(const nb_shape *s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < s->rank && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)s->dims[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* rows [r0, r0 + n) of x (rank 1: elements) as a new array */
static nb_array *slice_rows(nb_ctx *ctx, const nb_array *x, int64_t r0, int64_t n) {
  int rank = nb_array_rank(x);
  int64_t cols = rank == 2 ? nb_array_dims(x)[1] : 1, d[2] = {n, cols};
  nb_array *y = nb_array_empty(ctx, NB_F32, rank, d);
  if (y) memcpy(nb_array_data_mut(y), (const float *)nb_array_data(x) + r0 * cols, (size_t)(n * cols) * sizeof(float));
  return y;
}

static nb_status load_weights(gg_load *L, nb_model_loaded *m) {
  nb_ctx *ctx = L->ctx;
  nb_tree *spec = nb_model_param_spec(ctx, &m->cfg, NB_F32);
  m->params = spec ? nb_tree_create(ctx) : NULL;
  size_t nt = nb_gguf_n_tensors(L->g);
  bool *used = m->params ? calloc(nt + 1, 1) : NULL;
  nb_status s = used ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "gguf: out of memory");
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    char name[256];
    int kind = AS_IS, part = 0;
    if (!gguf_name(m->cfg.family, p, name, sizeof name, &kind, &part)) {
      s = nb_errorf(ctx, NB_ERR_INTERNAL, "gguf: no llama.cpp name for parameter '%s'", p);
      break;
    }
    /* the tensor's decoded (row-major) shape: linears [out, in], a fused
     * q/k/v three of them stacked */
    nb_shape want = nb_leaf_get_aval(nb_tree_leaf(spec, i)).shape;
    int64_t out = kind == QKV ? want.dims[1] : want.dims[0];
    if (kind == LINEAR || kind == LINEAR_Q || kind == LINEAR_K) want = nb_shape_make(2, (int64_t[2]){want.dims[1], want.dims[0]});
    if (kind == QKV) want = nb_shape_make(2, (int64_t[2]){3 * want.dims[1], want.dims[0]});
    if (kind == QKV_BIAS) want.dims[0] *= 3;
    const nb_gguf_tensor *t = nb_gguf_find_tensor(L->g, name);
    char ws[96], hs[96];
    shape_str(&want, ws, sizeof ws);
    if (!t) {
      s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: tensor '%s' (nabla's '%s', ggml ne reversed: %s) is missing", L->path, name, p, ws);
      break;
    }
    used[t - nb_gguf_tensor_at(L->g, 0)] = true;
    nb_shape have = {.rank = t->n_dims};
    for (int d = 0; d < t->n_dims; d++) have.dims[d] = t->ne[t->n_dims - 1 - d];
    if (!nb_shape_equal(&have, &want)) {
      shape_str(&have, hs, sizeof hs);
      s = nb_errorf(ctx, NB_ERR_SHAPE, "%s: tensor '%s' is %s (ggml ne reversed), the metadata wants %s", L->path, name, hs, ws);
      break;
    }
    nb_array *x = nb_gguf_tensor_f32(L->g, t), *y = x;
    if (x && (kind == QKV || kind == QKV_BIAS)) y = slice_rows(ctx, x, part * out, out);
    if (y != x) nb_array_release(x), x = y;
    int64_t heads = kind == LINEAR_Q ? m->cfg.n_heads : kind == LINEAR_K ? m->cfg.n_kv_heads : 0;
    if (x && kind != AS_IS && kind != QKV_BIAS) y = kernel_from_rows(ctx, x, heads);
    if (y != x) nb_array_release(x);
    s = y ? nb_tree_set_array(m->params, p, y) : nb_ctx_status(ctx);
    nb_array_release(y);
  }
  const nb_gguf_tensor *rf = L->rope_freqs ? nb_gguf_find_tensor(L->g, "rope_freqs.weight") : NULL;
  if (rf && used) used[rf - nb_gguf_tensor_at(L->g, 0)] = true;
  for (size_t i = 0; !s && i < nt; i++)
    if (!used[i])
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: tensor '%s' is not part of the %s architecture nabla implements", L->path,
                    nb_gguf_tensor_at(L->g, i)->name, m->cfg.family == NB_MODEL_GPT2 ? "GPT-2" : "Llama");
  free(used);
  nb_tree_destroy(spec);
  return s;
}

/* ---------------------------------------------------------------- tokenizer */

/* the string array `key` with n entries, or NULL with an error */
static const nb_gguf_value *str_array(gg_load *L, const char *key, uint64_t n) {
  const nb_gguf_value *v = nb_gguf_get(L->g, key);
  if (!v) return nb_errorf(L->ctx, NB_ERR_NOT_FOUND, "%s: key '%s' is missing", L->path, key), NULL;
  if (v->type != NB_GGUF_ARRAY || v->elem != NB_GGUF_STRING || (n && v->n != n))
    return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key '%s' is not an array of %llu strings", L->path, key, (unsigned long long)n), NULL;
  return v;
}

/* the optional numeric array `key` of n entries into *out (NULL when
 * absent); an error when it is something else */
static nb_status num_array(gg_load *L, const char *key, uint64_t n, const nb_gguf_value **out) {
  const nb_gguf_value *v = *out = nb_gguf_get(L->g, key);
  if (v && (v->type != NB_GGUF_ARRAY || !v->raw || v->elem == NB_GGUF_BOOL || v->n != n))
    return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key '%s' is not an array of %llu numbers", L->path, key, (unsigned long long)n);
  return NB_OK;
}

static nb_tok *spm_tokenizer(gg_load *L, const nb_gguf_value *tokens) {
  uint64_t n = tokens->n;
  const nb_gguf_value *scores, *types;
  if (num_array(L, "tokenizer.ggml.scores", n, &scores) || num_array(L, "tokenizer.ggml.token_type", n, &types)) return NULL;
  nb_tok_spm_piece *p = calloc(n ? n : 1, sizeof *p);
  if (!p) return nb_errorf(L->ctx, NB_ERR_NOMEM, "gguf: out of memory"), NULL;
  for (uint64_t i = 0; i < n; i++) {
    p[i].text = tokens->items[i].str;
    p[i].len = (size_t)tokens->items[i].len;
    p[i].score = scores ? (float)nb_gguf_array_f64(scores, i) : 0;
    p[i].type = types ? (int)nb_gguf_array_i64(types, i) : 1;
  }
  bool prefix = true;
  if (nb_gguf_get(L->g, "tokenizer.ggml.add_space_prefix") && nb_gguf_get_bool(L->g, "tokenizer.ggml.add_space_prefix", &prefix)) {
    free(p);
    return NULL;
  }
  nb_tok_spm_opts o = {.byte_fallback = true, .add_dummy_prefix = prefix};
  nb_tok *t = nb_tok_create_sentencepiece(L->ctx, p, (size_t)n, &o, L->path);
  free(p);
  return t;
}

/* a growing text buffer (a vocab.json or merges.txt being written) */
typedef struct sbuf {
  char *p;
  size_t n, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

/* bytes s[0..n) as a JSON string */
static void sb_json(sbuf *b, const char *s, size_t n) {
  sb_put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') esc[0] = '\\', esc[1] = (char)c, sb_put(b, esc, 2);
    else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c), sb_put(b, esc, 6);
    else sb_put(b, (const char *)&c, 1);
  }
  sb_put(b, "\"", 1);
}

static nb_tok *gpt2_tokenizer(gg_load *L, const nb_gguf_value *tokens) {
  uint64_t n = tokens->n;
  const nb_gguf_value *merges = str_array(L, "tokenizer.ggml.merges", 0), *types;
  if (!merges || num_array(L, "tokenizer.ggml.token_type", n, &types)) return NULL;
  const char *pattern = NULL;
  if (key_is(L, "tokenizer.ggml.pre", "gpt-2"))
    pattern = NB_TOK_PATTERN_GPT2;
  else if (key_is(L, "tokenizer.ggml.pre", "llama-bpe") || key_is(L, "tokenizer.ggml.pre", "llama3") ||
           key_is(L, "tokenizer.ggml.pre", "llama-v3"))
    pattern = NB_TOK_PATTERN_CL100K;
  else
    return nb_errorf(L->ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'tokenizer.ggml.pre': missing or a pre-tokenizer nabla does not "
                     "implement (supported: gpt-2, llama-bpe, llama3, llama-v3)", L->path), NULL;
  /* a vocab.json and merges.txt in memory: the tokenizer library's GPT-2 loader */
  sbuf v = {0}, mg = {0};
  char **special = calloc(n + 1, sizeof *special); /* control tokens (3), NUL-terminated copies */
  int n_special = 0;
  bool oom = !special;
  sb_put(&v, "{", 1);
  for (uint64_t i = 0; i < n; i++) {
    const nb_gguf_value *it = &tokens->items[i];
    char num[32];
    if (i) sb_put(&v, ",", 1);
    sb_json(&v, it->str, (size_t)it->len);
    int len = snprintf(num, sizeof num, ":%llu", (unsigned long long)i);
    sb_put(&v, num, (size_t)len);
    if (special && types && nb_gguf_array_i64(types, i) == 3 && !memchr(it->str, 0, (size_t)it->len))
      oom |= !(special[n_special++] = strndup(it->str, (size_t)it->len));
  }
  sb_put(&v, "}", 1);
  sb_put(&mg, "#version: 0.2\n", 14);
  for (uint64_t i = 0; i < merges->n; i++) {
    sb_put(&mg, merges->items[i].str, (size_t)merges->items[i].len);
    sb_put(&mg, "\n", 1);
  }
  nb_tok *t = NULL;
  nb_tok_gpt2_opts o = {.pattern = pattern, .special = (const char *const *)special, .n_special = n_special};
  if (v.oom || mg.oom || oom) nb_errorf(L->ctx, NB_ERR_NOMEM, "gguf: out of memory");
  else t = nb_tok_load_gpt2_strings(L->ctx, v.p, v.n, mg.p, mg.n, &o);
  for (int i = 0; special && i < n_special; i++) free(special[i]);
  free(special);
  free(v.p);
  free(mg.p);
  return t;
}

static nb_status load_tokenizer(gg_load *L, nb_model_loaded *m) {
  if (!nb_gguf_get(L->g, "tokenizer.ggml.model")) return NB_OK; /* ids only */
  const char *model;
  size_t n;
  nb_status s = nb_gguf_get_string(L->g, "tokenizer.ggml.model", &model, &n);
  if (s) return s;
  bool spm = n == 5 && !memcmp(model, "llama", 5), bpe = n == 4 && !memcmp(model, "gpt2", 4);
  if ((n == 8 && !memcmp(model, "no_vocab", 8)) || (n == 4 && !memcmp(model, "none", 4))) return NB_OK;
  if (!spm && !bpe)
    return nb_errorf(L->ctx, NB_ERR_UNIMPLEMENTED, "%s: key 'tokenizer.ggml.model' is '%.*s'; supported: llama, gpt2, no_vocab", L->path,
                     (int)(n < 64 ? n : 64), model);
  const nb_gguf_value *tokens = str_array(L, "tokenizer.ggml.tokens", 0);
  if (!tokens) return nb_ctx_status(L->ctx);
  if ((int64_t)tokens->n > m->cfg.vocab_size)
    return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens' has %llu tokens, more than the model's %lld", L->path,
                     (unsigned long long)tokens->n, (long long)m->cfg.vocab_size);
  m->tok = spm ? spm_tokenizer(L, tokens) : gpt2_tokenizer(L, tokens);
  if (!m->tok) return nb_ctx_status(L->ctx);
  /* special ids: bos is prepended when add_bos_token says so (SentencePiece's default: yes) */
  int64_t id;
  bool add_bos = spm;
  if (nb_gguf_get(L->g, "tokenizer.ggml.add_bos_token") && (s = nb_gguf_get_bool(L->g, "tokenizer.ggml.add_bos_token", &add_bos))) return s;
  m->bos_id = -1;
  if (add_bos && nb_gguf_get(L->g, "tokenizer.ggml.bos_token_id")) {
    if ((s = nb_gguf_get_int(L->g, "tokenizer.ggml.bos_token_id", &id))) return s;
    if (id < 0 || id >= m->cfg.vocab_size) return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key 'tokenizer.ggml.bos_token_id' is %lld, not a token id", L->path, (long long)id);
    m->bos_id = (int32_t)id;
  }
  static const char *const stops[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (int k = 0; k < 3; k++) {
    if (!nb_gguf_get(L->g, stops[k])) continue;
    if ((s = nb_gguf_get_int(L->g, stops[k], &id))) return s;
    if (id < 0 || id >= m->cfg.vocab_size) return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: key '%s' is %lld, not a token id", L->path, stops[k], (long long)id);
    bool have = false;
    for (int j = 0; j < m->n_eos; j++) have |= m->eos_ids[j] == id;
    if (!have && m->n_eos < 8) m->eos_ids[m->n_eos++] = (int32_t)id;
  }
  if (m->n_eos == 0) nb_model__tok_stops(m);
  return NB_OK;
}

nb_status nb_model_load_gguf(nb_ctx *ctx, const char *path, nb_model_loaded *out) {
  if (!path || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "load gguf: NULL argument");
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  snprintf(out->what, sizeof out->what, "GGUF model %s", path);
  gg_load L = {.ctx = ctx, .path = path, .g = nb_gguf_open(ctx, path)};
  if (!L.g) return nb_ctx_status(ctx);
  nb_status s = parse_config(&L, out);
  if (!s) s = load_weights(&L, out);
  if (!s) s = load_tokenizer(&L, out);
  nb_gguf_close(L.g);
  if (s) {
    s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : s;
    nb_model_loaded_free(out);
  }
  return s;
}

/* ---------------------------------------------------------------- out */

/* GPT-2's byte-to-unicode alphabet: the code point standing for byte b */
static uint32_t byte_cp(uint8_t b) {
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
  int k = 0; /* the bytes outside those ranges, in order, map to 256, 257, ... */
  for (int c = 0; c < b; c++)
    if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) k++;
  return 256 + (uint32_t)k;
}

static size_t put_cp(uint32_t cp, char *o) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F));
  return 2; /* the alphabet stays below U+0800 */
}

typedef struct gg_save {
  nb_ctx *ctx;
  nb_gguf_writer *w;
  const nb_model_loaded *m;
  nb_gguf_type type;
} gg_save;

/* the special ids and whether bos is added, shared by both vocabularies */
static nb_status save_special_ids(gg_save *S) {
  const nb_model_loaded *m = S->m;
  nb_status s = NB_OK;
  if (m->n_eos) s = nb_gguf_write_u32(S->w, "tokenizer.ggml.eos_token_id", (uint32_t)m->eos_ids[0]);
  if (!s && m->bos_id >= 0) s = nb_gguf_write_u32(S->w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos_id);
  if (!s) s = nb_gguf_write_bool(S->w, "tokenizer.ggml.add_bos_token", m->bos_id >= 0);
  return s;
}

/* a char-level BPE tokenizer as llama.cpp's "llama" vocabulary: pieces,
 * scores (merge ranks, negated), SentencePiece token types */
static nb_status save_spm_tokenizer(gg_save *S) {
  const nb_model_loaded *m = S->m;
  int32_t nv = (int32_t)m->cfg.vocab_size, nt = nb_tok_vocab_size(m->tok);
  if (nt > nv)
    return nb_errorf(S->ctx, NB_ERR_SHAPE, "gguf export: the tokenizer has %d tokens, the model %d", nt, nv);
  nb_tok_spm_piece *p = calloc((size_t)nv + 1, sizeof *p);
  const char **text = calloc((size_t)nv + 1, sizeof *text);
  size_t *lens = calloc((size_t)nv + 1, sizeof *lens);
  float *scores = calloc((size_t)nv + 1, sizeof *scores);
  int32_t *types = calloc((size_t)nv + 1, sizeof *types);
  char (*pad)[24] = calloc((size_t)nv + 1, sizeof *pad);
  nb_tok_spm_opts o;
  nb_status s = p && text && lens && scores && types && pad ? NB_OK : nb_errorf(S->ctx, NB_ERR_NOMEM, "gguf export: out of memory");
  if (!s && (s = nb_tok_sentencepiece_pieces(m->tok, p, (size_t)nv, &o))) {
    char why[512];
    snprintf(why, sizeof why, "%s", nb_ctx_error(S->ctx));
    s = nb_errorf(S->ctx, s, "gguf export: %s", why);
  }
  for (int32_t id = 0; !s && id < nv; id++) {
    /* ids the tokenizer does not use (and the model's padding rows) get
     * unique unused pieces: llama.cpp wants one piece per row */
    bool unused = id >= nt || (p[id].type == 5 && !p[id].len);
    if (unused) snprintf(pad[id], sizeof pad[id], "[PAD%d]", id);
    text[id] = unused ? pad[id] : p[id].text;
    lens[id] = unused ? strlen(pad[id]) : p[id].len;
    scores[id] = unused ? 0 : p[id].score;
    types[id] = unused ? 5 : p[id].type;
  }
  if (!s) s = nb_gguf_write_string(S->w, "tokenizer.ggml.model", "llama", 5);
  if (!s) s = nb_gguf_write_strings(S->w, "tokenizer.ggml.tokens", text, lens, (size_t)nv);
  if (!s) s = nb_gguf_write_f32s(S->w, "tokenizer.ggml.scores", scores, (size_t)nv);
  if (!s) s = nb_gguf_write_i32s(S->w, "tokenizer.ggml.token_type", types, (size_t)nv);
  if (!s) s = nb_gguf_write_bool(S->w, "tokenizer.ggml.add_space_prefix", o.add_dummy_prefix);
  if (!s && !o.byte_fallback)
    s = nb_errorf(S->ctx, NB_ERR_UNIMPLEMENTED, "gguf export: llama.cpp's SentencePiece vocabulary always falls back to bytes; "
                  "this tokenizer does not");
  for (int32_t id = 0; !s && id < nt; id++)
    if (p[id].type == 2) s = nb_gguf_write_u32(S->w, "tokenizer.ggml.unknown_token_id", (uint32_t)id);
  if (!s) s = save_special_ids(S);
  free(p), free(text), free(lens), free(scores), free(types), free(pad);
  return s;
}

static nb_status save_tokenizer(gg_save *S) {
  const nb_model_loaded *m = S->m;
  nb_gguf_writer *w = S->w;
  if (!m->tok) { /* ids only: llama.cpp's vocabulary-less mode with dummy tokens */
    nb_status s = nb_gguf_write_string(w, "tokenizer.ggml.model", "no_vocab", 8);
    const char *key = m->cfg.family == NB_MODEL_GPT2 ? "gpt2.vocab_size" : "llama.vocab_size";
    return s ? s : nb_gguf_write_u32(w, key, (uint32_t)m->cfg.vocab_size);
  }
  if (nb_tok_get_kind(m->tok) != NB_TOK_BYTE_LEVEL) return save_spm_tokenizer(S);
  int32_t nv = (int32_t)m->cfg.vocab_size, nm = nb_tok_num_merges(m->tok);
  char **toks = calloc((size_t)nv + 1, sizeof *toks), **merges = calloc((size_t)nm + 1, sizeof *merges);
  int32_t *types = calloc((size_t)nv + 1, sizeof *types), *pairs = calloc(2 * (size_t)nm + 1, sizeof *pairs);
  nb_status s = toks && merges && types && pairs ? NB_OK : nb_errorf(S->ctx, NB_ERR_NOMEM, "gguf export: out of memory");
  for (int32_t id = 0; !s && id < nv; id++) {
    size_t len = 0;
    const uint8_t *b = nb_tok_token_bytes(m->tok, id, &len);
    /* llama.cpp's token types: 1 normal, 3 control (special), 4 user-defined (other added), 5 unused */
    bool normal = b && nb_tok_token_id(m->tok, b, len) == id;
    if (!(toks[id] = malloc(2 * len + 32))) s = nb_errorf(S->ctx, NB_ERR_NOMEM, "gguf export: out of memory");
    else if (!b) snprintf(toks[id], 32, "[PAD%d]", id), types[id] = 5;
    else if (!normal) memcpy(toks[id], b, len), toks[id][len] = 0, types[id] = nb_tok_is_special(m->tok, id) ? 3 : 4;
    else {
      size_t k = 0;
      for (size_t i = 0; i < len; i++) k += put_cp(byte_cp(b[i]), toks[id] + k);
      toks[id][k] = 0;
      types[id] = 1;
    }
  }
  if (!s) s = nb_tok_merges(m->tok, pairs, (size_t)nm);
  for (int32_t i = 0; !s && i < nm; i++) {
    const char *l = toks[pairs[2 * i]], *r = toks[pairs[2 * i + 1]];
    if (!(merges[i] = malloc(strlen(l) + strlen(r) + 2))) s = nb_errorf(S->ctx, NB_ERR_NOMEM, "gguf export: out of memory");
    else sprintf(merges[i], "%s %s", l, r);
  }
  if (!s) s = nb_gguf_write_string(w, "tokenizer.ggml.model", "gpt2", 4);
  const char *pat = nb_tok_pattern(m->tok), *pre = !pat ? NULL : !strcmp(pat, NB_TOK_PATTERN_GPT2) ? "gpt-2"
                                                     : !strcmp(pat, NB_TOK_PATTERN_CL100K) ? "llama-bpe" : NULL;
  if (!s && !pre)
    s = nb_errorf(S->ctx, NB_ERR_UNIMPLEMENTED, "gguf export: the tokenizer's split pattern has no llama.cpp pre-tokenizer name "
                  "(GPT-2's and Llama-3's have)");
  if (!s) s = nb_gguf_write_string(w, "tokenizer.ggml.pre", pre, strlen(pre));
  if (!s) s = nb_gguf_write_strings(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL, (size_t)nv);
  if (!s) s = nb_gguf_write_i32s(w, "tokenizer.ggml.token_type", types, (size_t)nv);
  if (!s) s = nb_gguf_write_strings(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL, (size_t)nm);
  if (!s) s = save_special_ids(S);
  for (int32_t i = 0; toks && i < nv; i++) free(toks[i]);
  for (int32_t i = 0; merges && i < nm; i++) free(merges[i]);
  free(toks), free(merges), free(types), free(pairs);
  return s;
}

static nb_status save_config(gg_save *S, const char *name) {
  const nb_model_config *c = &S->m->cfg;
  nb_gguf_writer *w = S->w;
  bool llama = c->family == NB_MODEL_LLAMA && !c->n_experts && !c->bias && !c->qkv_bias && c->gated_mlp && c->act == NB_NN_SILU &&
               c->norm == NB_NN_RMSNORM && c->rope && !c->learned_pos && !c->rope_cfg.interleaved;
  bool gpt2 = c->family == NB_MODEL_GPT2 && !c->n_experts && c->bias && !c->gated_mlp && c->act == NB_NN_GELU_TANH &&
              c->norm == NB_NN_LAYERNORM && !c->rope && c->learned_pos && c->n_kv_heads == c->n_heads && !c->head_dim;
  if (!llama && !gpt2)
    return nb_errorf(S->ctx, NB_ERR_UNIMPLEMENTED, "gguf export: only dense Llama models (RMSNorm, SwiGLU, no biases, rotate-half "
                     "RoPE) and GPT-2 models (LayerNorm, GELU, biases, learned positions) are written");
  /* llama.cpp's file types: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7, MOSTLY_Q4_K_S 14, MOSTLY_BF16 32 */
  uint32_t ftype = S->type == NB_GGUF_F16 ? 1 : S->type == NB_GGUF_Q4_0 ? 2 : S->type == NB_GGUF_Q8_0 ? 7
                   : S->type == NB_GGUF_Q4_K ? 14 : S->type == NB_GGUF_BF16 ? 32 : 0;
  const char *arch = llama ? "llama" : "gpt2";
  nb_status s = nb_gguf_write_string(w, "general.architecture", arch, strlen(arch));
  if (!s && name) s = nb_gguf_write_string(w, "general.name", name, strlen(name));
  if (!s) s = nb_gguf_write_u32(w, "general.file_type", ftype);
  if (!s) s = nb_gguf_write_u32(w, "general.quantization_version", 2);
  if (gpt2) {
    if (!s) s = nb_gguf_write_u32(w, "gpt2.context_length", (uint32_t)c->max_seq_len);
    if (!s) s = nb_gguf_write_u32(w, "gpt2.embedding_length", (uint32_t)c->d_model);
    if (!s) s = nb_gguf_write_u32(w, "gpt2.block_count", (uint32_t)c->n_layers);
    if (!s) s = nb_gguf_write_u32(w, "gpt2.feed_forward_length", (uint32_t)c->d_ff);
    if (!s) s = nb_gguf_write_u32(w, "gpt2.attention.head_count", (uint32_t)c->n_heads);
    if (!s) s = nb_gguf_write_f32(w, "gpt2.attention.layer_norm_epsilon", (float)c->norm_eps);
    return s;
  }
  int64_t hd = nb_model_head_dim(c);
  if (!s) s = nb_gguf_write_u32(w, "llama.context_length", (uint32_t)c->max_seq_len);
  if (!s) s = nb_gguf_write_u32(w, "llama.embedding_length", (uint32_t)c->d_model);
  if (!s) s = nb_gguf_write_u32(w, "llama.block_count", (uint32_t)c->n_layers);
  if (!s) s = nb_gguf_write_u32(w, "llama.feed_forward_length", (uint32_t)c->d_ff);
  if (!s) s = nb_gguf_write_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
  if (!s) s = nb_gguf_write_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads);
  if (!s) s = nb_gguf_write_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
  if (!s && c->head_dim) s = nb_gguf_write_u32(w, "llama.attention.key_length", (uint32_t)hd);
  if (!s && c->head_dim) s = nb_gguf_write_u32(w, "llama.attention.value_length", (uint32_t)hd);
  if (!s) s = nb_gguf_write_f32(w, "llama.attention.layer_norm_rms_epsilon", (float)c->norm_eps);
  if (!s) s = nb_gguf_write_f32(w, "llama.rope.freq_base", (float)c->rope_cfg.theta);
  if (!s && c->rope_cfg.scaling == NB_NN_ROPE_LINEAR) s = nb_gguf_write_string(w, "llama.rope.scaling.type", "linear", 6);
  if (!s && c->rope_cfg.scaling == NB_NN_ROPE_LINEAR) s = nb_gguf_write_f32(w, "llama.rope.scaling.factor", (float)c->rope_cfg.factor);
  return s;
}

/* the type a tensor is written in, as llama.cpp's quantizer and converter
 * choose: 1-D ones stay F32; the output projection (and a tied embedding,
 * which is it) is Q6_K in a Q4_0 or Q4_K file (Q8_0 when its rows are not
 * a multiple of 256); rows not a multiple of 256 in a Q4_K file are Q4_0;
 * a row length that is not a multiple of the block falls back to F16 */
static nb_gguf_type tensor_type(gg_save *S, const char *name, const nb_array *rows) {
  if (nb_array_rank(rows) < 2) return NB_GGUF_F32;
  nb_gguf_type t = S->type;
  bool head = !strcmp(name, "output.weight") || (S->m->cfg.tie_embeddings && !strcmp(name, "token_embd.weight"));
  int64_t row = nb_array_dims(rows)[nb_array_rank(rows) - 1];
  if ((t == NB_GGUF_Q4_0 || t == NB_GGUF_Q4_K) && head) t = row % 256 ? NB_GGUF_Q8_0 : NB_GGUF_Q6_K;
  if (t == NB_GGUF_Q4_K && row % 256) t = NB_GGUF_Q4_0; /* llama.cpp falls back to a 32-block type too */
  int64_t block = 1;
  nb_gguf_type_block(t, &block, NULL);
  if (row % block) t = NB_GGUF_F16;
  return t;
}

/* parameter p (any float dtype) as f32, or NULL with an error */
static nb_array *param_f32(gg_save *S, const char *p) {
  nb_array *x = nb_tree_get_array(S->m->params, p);
  if (!x) return nb_errorf(S->ctx, NB_ERR_NOT_FOUND, "gguf export: parameter '%s' is missing", p), NULL;
  return nb_array_astype(S->ctx, x, NB_F32);
}

/* the GGUF tensor (ggml rows) of nabla parameter p; for a fused q/k/v,
 * p's siblings wk and wv are stacked under it */
static nb_array *tensor_rows(gg_save *S, const char *p, int kind) {
  nb_ctx *ctx = S->ctx;
  if (kind == QKV || kind == QKV_BIAS) {
    char sib[256];
    size_t n = strlen(p), at = n - strlen(kind == QKV ? "wq/kernel" : "wq/bias");
    nb_array *part[3] = {0}, *y = NULL;
    for (int k = 0; k < 3; k++) {
      snprintf(sib, sizeof sib, "%.*sw%c%s", (int)at, p, "qkv"[k], p + at + 2);
      nb_array *f = param_f32(S, sib);
      part[k] = f && kind == QKV ? rows_from_kernel(ctx, f, 0) : f;
      if (part[k] != f) nb_array_release(f);
    }
    if (part[0] && part[1] && part[2]) {
      int rank = nb_array_rank(part[0]);
      int64_t out = nb_array_dims(part[0])[0], cols = rank == 2 ? nb_array_dims(part[0])[1] : 1, d[2] = {3 * out, cols};
      if ((y = nb_array_empty(ctx, NB_F32, rank, d)))
        for (int k = 0; k < 3; k++)
          memcpy((float *)nb_array_data_mut(y) + k * out * cols, nb_array_data(part[k]), (size_t)(out * cols) * sizeof(float));
    }
    for (int k = 0; k < 3; k++) nb_array_release(part[k]);
    return y;
  }
  nb_array *f = param_f32(S, p), *rows = f;
  int64_t heads = kind == LINEAR_Q ? S->m->cfg.n_heads : kind == LINEAR_K ? S->m->cfg.n_kv_heads : 0;
  if (f && kind != AS_IS) rows = rows_from_kernel(ctx, f, heads);
  if (rows != f) nb_array_release(f);
  return rows;
}

nb_status nb_model_save_gguf(nb_ctx *ctx, const nb_model_loaded *m, const char *path, const nb_model_gguf_opts *opts) {
  if (!m || !path || !m->params) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf export: NULL argument");
  nb_gguf_type type = opts ? opts->type : NB_GGUF_F32;
  if (type != NB_GGUF_F32 && type != NB_GGUF_F16 && type != NB_GGUF_BF16 && type != NB_GGUF_Q8_0 && type != NB_GGUF_Q4_0 &&
      type != NB_GGUF_Q4_K)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "gguf export: type %s is not written (F32, F16, BF16, Q8_0, Q4_0, Q4_K are)",
                     nb_gguf_type_name(type) ? nb_gguf_type_name(type) : "(unknown)");
  gg_save S = {.ctx = ctx, .m = m, .type = type, .w = nb_gguf_writer_create(ctx)};
  if (!S.w) return nb_ctx_status(ctx);
  nb_status s = save_config(&S, opts ? opts->name : NULL);
  if (!s) s = save_tokenizer(&S);
  nb_tree *spec = s ? NULL : nb_model_param_spec(ctx, &m->cfg, NB_F32);
  if (!s && !spec) s = nb_ctx_status(ctx);
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    char name[256];
    int kind = AS_IS, part = 0;
    if (!gguf_name(m->cfg.family, p, name, sizeof name, &kind, &part))
      s = nb_errorf(ctx, NB_ERR_INTERNAL, "gguf export: no llama.cpp name for '%s'", p);
    if (s || part > 0) continue; /* a fused q/k/v is written with its first part */
    nb_array *rows = tensor_rows(&S, p, kind);
    s = rows ? nb_gguf_write_tensor(S.w, name, tensor_type(&S, name, rows), rows) : nb_ctx_status(ctx);
    nb_array_release(rows);
  }
  nb_tree_destroy(spec);
  if (!s && m->cfg.family == NB_MODEL_LLAMA && m->cfg.rope_cfg.scaling == NB_NN_ROPE_LLAMA3) {
    /* Llama 3.1's scaling as llama.cpp's converter writes it: the divisors */
    int64_t hd = nb_model_head_dim(&m->cfg), n = hd / 2;
    nb_array *f = nb_array_empty(ctx, NB_F32, 1, &n);
    s = f ? llama3_factors(ctx, &m->cfg.rope_cfg, hd, nb_array_data_mut(f)) : nb_ctx_status(ctx);
    if (!s) s = nb_gguf_write_tensor(S.w, "rope_freqs.weight", NB_GGUF_F32, f);
    nb_array_release(f);
  }
  if (!s) s = nb_gguf_writer_save(S.w, path);
  nb_gguf_writer_destroy(S.w);
  return s;
}
