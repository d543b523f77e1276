/* Rotary position embeddings (plain, linear and Llama-3 scaling; half or
 * interleaved rotation) and multi-head / grouped-query / multi-query
 * attention with causal and segment masks and an optional KV cache.
 * Shapes: x [B, T, d]; q [B, T, Hkv, G, hd] (G = H / Hkv query heads per
 * key/value head); k, v [B, Hkv, S, hd]; scores [B, Hkv, T, G, S]. */
#include <math.h>
#include <string.h>

#include "nn/internal.h"

const char *nb_nn_rope_scaling_name(nb_nn_rope_scaling s) {
  static const char *names[NB_NN_ROPE_SCALING_COUNT] = {"none", "linear", "llama3"};
  return s >= 0 && s < NB_NN_ROPE_SCALING_COUNT ? names[s] : "?";
}

/* ---------------------------------------------------------------- RoPE */

nb_status nb_nn_rope_freqs(nb_ctx *ctx, const nb_nn_rope_cfg *cfg, int64_t head_dim, double *out) {
  if (head_dim <= 0 || head_dim % 2)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nn: rope needs an even head_dim, not %lld", (long long)head_dim);
  if (!(cfg->theta > 1))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nn: rope theta must be > 1, not %g", cfg->theta);
  bool scaled = cfg->scaling != NB_NN_ROPE_NONE;
  if (scaled && !(cfg->factor > 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nn: rope scaling '%s' needs factor > 0, not %g",
                     nb_nn_rope_scaling_name(cfg->scaling), cfg->factor);
  if (cfg->scaling == NB_NN_ROPE_LLAMA3 &&
      (!(cfg->high_freq_factor > cfg->low_freq_factor) || !(cfg->low_freq_factor > 0) || cfg->original_max_pos <= 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "nn: rope scaling 'llama3' needs high_freq_factor > low_freq_factor > 0 and original_max_pos > 0");
  int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; i++) {
    double f = pow(cfg->theta, -2.0 * (double)i / (double)head_dim);
    if (cfg->scaling == NB_NN_ROPE_LINEAR) f /= cfg->factor;
    if (cfg->scaling == NB_NN_ROPE_LLAMA3) {
      /* long wavelengths scaled by 1/factor, short ones kept, a smooth ramp
       * between (Llama 3.1) */
      double old = (double)cfg->original_max_pos, wavelen = 2 * M_PI / f;
      double low_wl = old / cfg->low_freq_factor, high_wl = old / cfg->high_freq_factor;
      if (wavelen > low_wl) {
        f /= cfg->factor;
      } else if (wavelen >= high_wl) {
        double smooth = (old / wavelen - cfg->low_freq_factor) / (cfg->high_freq_factor - cfg->low_freq_factor);
        f = (1 - smooth) * f / cfg->factor + smooth * f;
      }
    }
    out[i] = f;
  }
  return NB_OK;
}

/* x [..., half, 2] pairs as two [..., half] halves, or back */
static nb_val *last_slice(nb_val *x, int64_t lo, int64_t hi) {
  int r = nb_val_rank(x);
  int64_t start[NB_MAX_RANK] = {0}, limit[NB_MAX_RANK];
  for (int i = 0; i < r; i++) limit[i] = nb_val_dim(x, i);
  start[r - 1] = lo;
  limit[r - 1] = hi;
  return nb_slice(x, start, limit, NULL);
}

nb_val *nb_nn_rope(nb_val *x, nb_val *positions, const nb_nn_rope_cfg *cfg) {
  nb_graph *g = nb_val_graph(x);
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_nn_apply fa_ctx = {.g = g}; /* for errors */
  if (nb_val_rank(x) != 4 || nb_val_rank(positions) != 2 || nb_val_dim(positions, 0) != nb_val_dim(x, 0) ||
      nb_val_dim(positions, 1) != nb_val_dim(x, 1) || !nb_dtype_is_int(nb_val_dtype(positions)))
    return nb_nn_fail(&fa_ctx, NB_ERR_SHAPE, "nn: rope needs x [B, T, H, hd] and integer positions [B, T]");
  int64_t hd = nb_val_dim(x, 3), half = hd / 2;
  double freqs[1024];
  if (half > 1024) return nb_nn_fail(&fa_ctx, NB_ERR_SHAPE, "nn: rope head_dim %lld exceeds 2048", (long long)hd);
  if (nb_nn_rope_freqs(ctx, cfg, hd, freqs) != NB_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
    return nb_nn_fail(&fa_ctx, nb_ctx_status(ctx), "%s", msg);
  }
  nb_val *xf = nb_nn__upcast(x);
  nb_dtype cd = nb_val_dtype(xf);
  nb_array *fa = nb_array_from_f64(ctx, cd, 1, &half, freqs);
  if (!fa) return nb_nn_fail(&fa_ctx, NB_ERR_NOMEM, "nn: rope: out of memory");
  nb_val *fv = nb_const(g, fa);
  nb_array_release(fa);
  int64_t B = nb_val_dim(x, 0), T = nb_val_dim(x, 1);
  nb_val *pos = nb_expand_dims(nb_convert(positions, cd), 2);           /* [B, T, 1] */
  nb_val *ang = nb_mul(pos, fv);                                        /* [B, T, half] */
  int64_t d4[4] = {B, T, 1, half};
  nb_val *c = nb_reshape(nb_cos(ang), 4, d4), *s = nb_reshape(nb_sin(ang), 4, d4);
  nb_val *out;
  if (!cfg->interleaved) {
    nb_val *x1 = last_slice(xf, 0, half), *x2 = last_slice(xf, half, hd);
    nb_val *parts[2] = {nb_sub(nb_mul(x1, c), nb_mul(x2, s)), nb_add(nb_mul(x2, c), nb_mul(x1, s))};
    out = nb_concatenate(2, parts, 3);
  } else {
    int64_t d5[5] = {B, T, nb_val_dim(x, 2), half, 2}, d5h[5] = {B, T, nb_val_dim(x, 2), half, 1};
    nb_val *xr = nb_reshape(xf, 5, d5);
    nb_val *x1 = nb_nn__reshape(last_slice(xr, 0, 1), 4, (int64_t[4]){B, T, nb_val_dim(x, 2), half});
    nb_val *x2 = nb_nn__reshape(last_slice(xr, 1, 2), 4, (int64_t[4]){B, T, nb_val_dim(x, 2), half});
    nb_val *parts[2] = {nb_reshape(nb_sub(nb_mul(x1, c), nb_mul(x2, s)), 5, d5h),
                        nb_reshape(nb_add(nb_mul(x2, c), nb_mul(x1, s)), 5, d5h)};
    out = nb_nn__reshape(nb_concatenate(2, parts, 4), 4, (int64_t[4]){B, T, nb_val_dim(x, 2), hd});
  }
  return nb_val_dtype(out) == nb_val_dtype(x) ? out : nb_convert(out, nb_val_dtype(x));
}

/* ---------------------------------------------------------------- attention */

nb_status nb_nn_attention_init(nb_nn_init *in, const char *path, const nb_nn_attn_cfg *cfg, double std, double std_out) {
  char p[NB_NN_PATH_MAX];
  int64_t dq = cfg->n_heads * cfg->head_dim, dkv = cfg->n_kv_heads * cfg->head_dim;
  const char *names[4] = {"wq", "wk", "wv", "wo"};
  for (int i = 0; i < 4; i++) {
    if (!nb_nn__init_path(in, p, path, names[i])) return NB_ERR_INVALID_ARG;
    bool bias = cfg->bias || (i < 3 && cfg->qkv_bias);
    nb_status s = i == 3   ? nb_nn_linear_init(in, p, dq, cfg->d_model, bias, std_out)
                  : i == 0 ? nb_nn_linear_init(in, p, cfg->d_model, dq, bias, std)
                           : nb_nn_linear_init(in, p, cfg->d_model, dkv, bias, std);
    if (s) return s;
  }
  return NB_OK;
}

/* i32 [n] = 0..n-1 (+ offset when given) */
static nb_val *index_vec(nb_graph *g, int64_t n, nb_val *offset) {
  nb_val *i = nb_iota(g, NB_I32, 1, &n, 0);
  return offset ? nb_add(i, nb_convert(offset, NB_I32)) : i;
}

/* bool [B or 1, T, S]: which keys each query sees, or NULL for all */
static nb_val *attention_mask(nb_nn_apply *a, const nb_nn_attn_cfg *cfg, const nb_nn_attn_io *io, int64_t B, int64_t T,
                              int64_t S) {
  nb_graph *g = a->g;
  bool cache = io && io->cache_k;
  nb_val *qi = index_vec(g, T, cache ? io->cache_pos : NULL), *ki = index_vec(g, S, NULL);
  nb_val *mask = NULL;
  if (cfg->causal) mask = nb_le(nb_expand_dims(ki, 0), nb_expand_dims(qi, 1)); /* [T, S] */
  else if (cache) /* only the filled part of the cache */
    mask = nb_nn__broadcast_to(nb_lt(nb_expand_dims(ki, 0), nb_add(io->cache_pos, nb_scalar(g, NB_I32, (double)T))), 2,
                           (int64_t[2]){T, S});
  if (mask) mask = nb_expand_dims(mask, 0);
  if (io && io->segment_ids) {
    nb_val *sq = nb_expand_dims(io->segment_ids, 2), *sk = nb_expand_dims(io->segment_ids, 1);
    nb_val *same = nb_eq(sq, sk); /* [B, T, T] */
    mask = mask ? nb_and(nb_nn__broadcast_to(mask, 3, (int64_t[3]){B, T, S}), same) : same;
  }
  return mask;
}

static bool check_io(nb_nn_apply *a, const char *path, const nb_nn_attn_cfg *cfg, nb_nn_attn_io *io, int64_t B, int64_t T) {
  if (!io) return true;
  if (io->positions && (nb_val_rank(io->positions) != 2 || nb_val_dim(io->positions, 0) != B ||
                        nb_val_dim(io->positions, 1) != T || !nb_dtype_is_int(nb_val_dtype(io->positions))))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: attention '%s': positions must be integers [%lld, %lld]", path,
                      (long long)B, (long long)T), false;
  if (io->segment_ids && (nb_val_rank(io->segment_ids) != 2 || nb_val_dim(io->segment_ids, 0) != B ||
                          nb_val_dim(io->segment_ids, 1) != T || !nb_dtype_is_int(nb_val_dtype(io->segment_ids))))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: attention '%s': segment_ids must be integers [%lld, %lld]", path,
                      (long long)B, (long long)T), false;
  if (!io->cache_k && !io->cache_v) return true;
  if (io->segment_ids)
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: attention '%s': segment_ids cannot be combined with a KV cache", path),
           false;
  nb_val *c[2] = {io->cache_k, io->cache_v};
  for (int i = 0; i < 2; i++)
    if (!c[i] || nb_val_rank(c[i]) != 4 || nb_val_dim(c[i], 0) != B || nb_val_dim(c[i], 1) != cfg->n_kv_heads ||
        nb_val_dim(c[i], 3) != cfg->head_dim || nb_val_dim(c[i], 2) < T)
      return nb_nn_fail(a, NB_ERR_SHAPE,
                        "nn: attention '%s': cache_%c must be [B=%lld, n_kv_heads=%lld, T_max>=%lld, head_dim=%lld]", path,
                        "kv"[i], (long long)B, (long long)cfg->n_kv_heads, (long long)T, (long long)cfg->head_dim),
             false;
  if (!io->cache_pos || nb_val_rank(io->cache_pos) != 0 || !nb_dtype_is_int(nb_val_dtype(io->cache_pos)))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: attention '%s': cache_pos must be an integer scalar", path), false;
  return true;
}

/* [B, T, n*hd] -> [B, T, n, hd] after checking the projection's width */
static nb_val *split_heads(nb_nn_apply *a, const char *path, nb_val *y, int64_t n, int64_t hd) {
  if (nb_graph_status(a->g)) return y;
  if (nb_val_dim(y, -1) != n * hd)
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: attention projection '%s' has %lld outputs, wanted %lld heads x %lld", path,
                      (long long)nb_val_dim(y, -1), (long long)n, (long long)hd);
  return nb_nn__reshape(y, 4, (int64_t[4]){nb_val_dim(y, 0), nb_val_dim(y, 1), n, hd});
}

nb_val *nb_nn_attention(nb_nn_apply *a, const char *path, const nb_nn_attn_cfg *cfg, nb_val *x, nb_nn_attn_io *io) {
  char pq[NB_NN_PATH_MAX], pk[NB_NN_PATH_MAX], pv[NB_NN_PATH_MAX], po[NB_NN_PATH_MAX], pd[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, pq, path, "wq") || !nb_nn__path(a, pk, path, "wk") || !nb_nn__path(a, pv, path, "wv") ||
      !nb_nn__path(a, po, path, "wo") || !nb_nn__path(a, pd, path, "dropout"))
    return nb_nn__poison(a);
  int64_t H = cfg->n_heads, Hkv = cfg->n_kv_heads, hd = cfg->head_dim;
  if (H <= 0 || Hkv <= 0 || hd <= 0 || H % Hkv)
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: attention '%s': n_heads %lld must be a positive multiple of n_kv_heads %lld",
                      path, (long long)H, (long long)Hkv);
  if (nb_val_rank(x) != 3) return nb_nn_fail(a, NB_ERR_SHAPE, "nn: attention '%s': input must be [B, T, d]", path);
  int64_t B = nb_val_dim(x, 0), T = nb_val_dim(x, 1), G = H / Hkv;
  if (!check_io(a, path, cfg, io, B, T)) return nb_nn__poison(a);
  bool cache = io && io->cache_k;
  nb_val *q = split_heads(a, pq, nb_nn_linear(a, pq, x), H, hd);
  nb_val *k = split_heads(a, pk, nb_nn_linear(a, pk, x), Hkv, hd);
  nb_val *v = split_heads(a, pv, nb_nn_linear(a, pv, x), Hkv, hd);
  if (nb_graph_status(a->g)) return nb_nn__poison(a);
  if (cfg->rope) {
    nb_val *pos = io && io->positions ? io->positions
                                      : nb_nn__broadcast_to(index_vec(a->g, T, cache ? io->cache_pos : NULL), 2, (int64_t[2]){B, T});
    q = nb_nn_rope(q, pos, &cfg->rope_cfg);
    k = nb_nn_rope(k, pos, &cfg->rope_cfg);
  }
  static const int to_bhtd[4] = {0, 2, 1, 3};
  k = nb_transpose(k, to_bhtd); /* [B, Hkv, T, hd] */
  v = nb_transpose(v, to_bhtd);
  if (cache) {
    nb_val *z = nb_scalar(a->g, NB_I32, 0), *pos = nb_convert(io->cache_pos, NB_I32);
    nb_val *start[4] = {z, z, pos, z};
    io->new_cache_k = k = nb_dynamic_update_slice(io->cache_k, nb_convert(k, nb_val_dtype(io->cache_k)), start);
    io->new_cache_v = v = nb_dynamic_update_slice(io->cache_v, nb_convert(v, nb_val_dtype(io->cache_v)), start);
  }
  int64_t S = nb_val_dim(k, 2);
  q = nb_nn__upcast(nb_nn__reshape(q, 5, (int64_t[5]){B, T, Hkv, G, hd}));
  k = nb_convert(k, nb_val_dtype(q));
  v = nb_convert(v, nb_val_dtype(q));
  nb_dot_dims qk = {.n_contract = 1, .n_batch = 2, .lhs_contract = {4}, .rhs_contract = {3},
                    .lhs_batch = {0, 2}, .rhs_batch = {0, 1}};
  nb_val *scores = nb_dot_general(q, k, &qk, NB_DTYPE_COUNT); /* [B, Hkv, T, G, S] */
  double scale = cfg->softmax_scale > 0 ? cfg->softmax_scale : 1 / sqrt((double)hd);
  scores = nb_mul(scores, nb_nn__scalar(scores, scale));
  nb_val *mask = attention_mask(a, cfg, io, B, T, S);
  if (mask) {
    int64_t sd[5] = {B, Hkv, T, G, S};
    int bd[3] = {0, 2, 4};
    int64_t mb = nb_val_dim(mask, 0);
    if (mb != B) mask = nb_nn__broadcast_to(mask, 3, (int64_t[3]){B, T, S});
    mask = nb_broadcast_in_dim(mask, 5, sd, bd);
    double big = nb_val_dtype(scores) == NB_F16 ? -6e4 : -1e30;
    scores = nb_select(mask, scores, nb_full_like(scores, big));
  }
  nb_val *probs = nb_nn_dropout(a, pd, nb_nn_softmax(scores, -1), cfg->dropout);
  nb_dot_dims pv_dims = {.n_contract = 1, .n_batch = 2, .lhs_contract = {4}, .rhs_contract = {2},
                         .lhs_batch = {0, 1}, .rhs_batch = {0, 1}};
  nb_val *o = nb_dot_general(probs, v, &pv_dims, NB_DTYPE_COUNT); /* [B, Hkv, T, G, hd] */
  static const int to_btkgd[5] = {0, 2, 1, 3, 4};
  o = nb_nn__reshape(nb_transpose(o, to_btkgd), 3, (int64_t[3]){B, T, H * hd});
  if (nb_val_dtype(o) != nb_val_dtype(x)) o = nb_convert(o, nb_val_dtype(x));
  return nb_nn_linear(a, po, o);
}
