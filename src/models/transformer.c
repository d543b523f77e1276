/* The decoder-only transformer shared by every family: parameter init (or
 * abstract specs), the forward pass (with per-block remat and a KV cache),
 * the next-token loss, and the graph builders the trainer and the server
 * use. Upcycling a dense model into an MoE one is in upcycle.c. */
#include <math.h>
#include <string.h>

#include "nabla/models.h"

/* ---------------------------------------------------------------- init */

static nb_status init_into(nb_nn_init *in, const nb_model_config *c) {
  double std = c->init_std, std_out = c->scaled_init ? std / sqrt(2.0 * (double)c->n_layers) : std;
  nb_status s = nb_nn_embed_init(in, "embed", c->vocab_size, c->d_model, std);
  if (!s && c->learned_pos) s = nb_nn_embed_init(in, "pos_embed", c->max_seq_len, c->d_model, std);
  for (int64_t l = 0; l < c->n_layers && !s; l++) {
    char p[64];
    snprintf(p, sizeof p, "layers/%lld", (long long)l);
    nb_nn_block_cfg b = nb_model_block_cfg(c, l);
    s = nb_nn_block_init(in, p, &b, std, std_out, c->router_init_std);
  }
  nb_nn_norm_cfg fn = {.kind = c->norm, .eps = c->norm_eps, .bias = c->bias};
  if (!s) s = nb_nn_norm_init(in, "final_norm", &fn, c->d_model);
  if (!s && !c->tie_embeddings) s = nb_nn_linear_init(in, "lm_head", c->d_model, c->vocab_size, false, std);
  return s;
}

static nb_tree *init_tree(nb_ctx *ctx, const nb_model_config *c, nb_array *key, nb_dtype t, bool abstract) {
  if (nb_model_config_validate(ctx, c)) return NULL;
  if (!abstract && !key) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model init: NULL key"), NULL;
  nb_tree *params = nb_tree_create(ctx);
  if (!params) return NULL;
  nb_nn_init in = {.ctx = ctx, .params = params, .key = key, .dtype = t, .abstract = abstract};
  if (init_into(&in, c) != NB_OK) {
    nb_tree_destroy(params);
    return NULL;
  }
  return params;
}

nb_tree *nb_model_init_dtype(nb_ctx *ctx, const nb_model_config *c, nb_array *key, nb_dtype t) {
  return init_tree(ctx, c, key, t, false);
}
nb_tree *nb_model_init(nb_ctx *ctx, const nb_model_config *c, nb_array *key) { return init_tree(ctx, c, key, NB_F32, false); }
nb_tree *nb_model_param_spec(nb_ctx *ctx, const nb_model_config *c, nb_dtype t) { return init_tree(ctx, c, NULL, t, true); }

/* ---------------------------------------------------------------- forward */

typedef struct block_call {
  const nb_nn_block_cfg *bc;
  const nb_nn_apply *outer;
  const char *path;
} block_call;

/* the body of a remat region: one block on inputs "params/...", "x",
 * optional "positions", "segment_ids", "rng"; outputs "y" (+ "lb", "z") */
static nb_status block_body(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const block_call *bcall = u;
  nb_tree *p = nb_tree_select_prefix(in, "params", true);
  if (!p) return NB_ERR_NOMEM;
  nb_nn_apply a = *bcall->outer;
  a.g = g;
  a.params = p;
  a.rng = nb_tree_get_val(in, "rng");
  nb_nn_attn_io io = {.positions = nb_tree_get_val(in, "positions"), .segment_ids = nb_tree_get_val(in, "segment_ids")};
  nb_nn_moe_aux aux = {0};
  nb_val *y = nb_nn_block(&a, bcall->path, bcall->bc, nb_tree_get_val(in, "x"), &io, &aux);
  nb_status s = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "y", y);
  if (!s && aux.lb_loss) s = nb_tree_set_val(out, "lb", aux.lb_loss);
  if (!s && aux.z_loss) s = nb_tree_set_val(out, "z", aux.z_loss);
  nb_tree_destroy(p);
  return s;
}

static nb_val *remat_block(nb_nn_apply *a, const char *path, const nb_nn_block_cfg *bc, nb_val *x, nb_nn_attn_io *io,
                           nb_nn_moe_aux *aux) {
  nb_ctx *ctx = nb_graph_ctx(a->g);
  /* a hook may read parameters outside the block: give it all of them */
  nb_tree *sub = a->linear_hook ? nb_tree_copy(a->params) : nb_tree_select_prefix(a->params, path, false);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_status s = sub && in && out ? nb_tree_merge(in, "params", sub) : NB_ERR_NOMEM;
  if (!s) s = nb_tree_set_val(in, "x", x);
  if (!s && io->positions) s = nb_tree_set_val(in, "positions", io->positions);
  if (!s && io->segment_ids) s = nb_tree_set_val(in, "segment_ids", io->segment_ids);
  if (!s && a->rng) s = nb_tree_set_val(in, "rng", a->rng);
  block_call bcall = {bc, a, path};
  nb_graph *body = s ? NULL : nb_trace(ctx, block_body, &bcall, in);
  if (!s && !body) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (!s) s = nb_remat_call(a->g, body, in, out);
  nb_val *y = NULL;
  if (!s) {
    y = nb_tree_get_val(out, "y");
    aux->lb_loss = nb_tree_get_val(out, "lb");
    aux->z_loss = nb_tree_get_val(out, "z");
  }
  nb_graph_destroy(body);
  nb_tree_destroy(sub);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  if (y) return y;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
  return nb_nn_fail(a, s ? s : NB_ERR_INTERNAL, "model: remat of block '%s': %s", path, msg);
}

static nb_val *default_positions(nb_nn_apply *a, int64_t B, int64_t T, nb_val *offset) {
  nb_val *i = nb_iota(a->g, NB_I32, 1, &T, 0);
  if (offset) i = nb_add(i, nb_convert(offset, NB_I32));
  int64_t d[2] = {B, T};
  return nb_broadcast_to(i, 2, d);
}

static bool check_inputs(nb_nn_apply *a, const nb_model_config *c, const nb_model_fwd *in) {
  if (!in || !in->tokens || nb_val_rank(in->tokens) != 2 || !nb_dtype_is_int(nb_val_dtype(in->tokens)))
    return nb_nn_fail(a, NB_ERR_SHAPE, "model: tokens must be integers [B, T]"), false;
  if (nb_val_dim(in->tokens, 1) > c->max_seq_len && !in->cache)
    return nb_nn_fail(a, NB_ERR_SHAPE, "model: %lld tokens exceed model.max_seq_len %lld",
                      (long long)nb_val_dim(in->tokens, 1), (long long)c->max_seq_len),
           false;
  if (in->cache && (!in->cache_pos || !in->new_cache))
    return nb_nn_fail(a, NB_ERR_INVALID_ARG, "model: a cache needs cache_pos and new_cache"), false;
  return true;
}

nb_val *nb_model_forward(nb_nn_apply *a, const nb_model_config *c, const nb_model_fwd *in, nb_model_aux *aux) {
  if (!check_inputs(a, c, in)) return nb_nn_fail(a, NB_ERR_INTERNAL, "model: internal error"); /* already in error */
  int64_t B = nb_val_dim(in->tokens, 0), T = nb_val_dim(in->tokens, 1);
  nb_val *h = nb_nn_embed(a, "embed", in->tokens);
  if (c->learned_pos) {
    nb_val *pos = in->positions ? in->positions : default_positions(a, B, T, in->cache ? in->cache_pos : NULL);
    h = nb_add(h, nb_nn_embed(a, "pos_embed", pos));
  }
  h = nb_nn_dropout(a, "embed_dropout", h, c->dropout);
  nb_val *lb = NULL, *z = NULL;
  int n_moe = 0;
  for (int64_t l = 0; l < c->n_layers && !nb_graph_status(a->g); l++) {
    char p[64], pk[80], pv[80];
    snprintf(p, sizeof p, "layers/%lld", (long long)l);
    snprintf(pk, sizeof pk, "%s/k", p);
    snprintf(pv, sizeof pv, "%s/v", p);
    nb_nn_block_cfg bc = nb_model_block_cfg(c, l);
    nb_nn_attn_io io = {.positions = in->positions, .segment_ids = in->segment_ids};
    if (in->cache) {
      io.cache_k = nb_tree_get_val(in->cache, pk);
      io.cache_v = nb_tree_get_val(in->cache, pv);
      io.cache_pos = in->cache_pos;
      if (!io.cache_k || !io.cache_v) return nb_nn_fail(a, NB_ERR_NOT_FOUND, "model: cache lacks '%s' or '%s'", pk, pv);
    }
    nb_nn_moe_aux maux = {0};
    h = in->remat && !in->cache ? remat_block(a, p, &bc, h, &io, &maux) : nb_nn_block(a, p, &bc, h, &io, &maux);
    if (in->cache && !nb_graph_status(a->g) &&
        (nb_tree_set_val(in->new_cache, pk, io.new_cache_k) || nb_tree_set_val(in->new_cache, pv, io.new_cache_v)))
      return nb_nn_fail(a, NB_ERR_NOMEM, "model: out of memory");
    if (maux.lb_loss) {
      lb = lb ? nb_add(lb, maux.lb_loss) : maux.lb_loss;
      z = z ? nb_add(z, maux.z_loss) : maux.z_loss;
      n_moe++;
    }
  }
  nb_nn_norm_cfg fn = {.kind = c->norm, .eps = c->norm_eps, .bias = c->bias};
  h = nb_nn_norm_apply(a, "final_norm", &fn, h);
  if (in->logits_at) { /* one position: the output projection is the largest matmul of a prefill */
    nb_val *zero = nb_scalar(a->g, NB_I32, 0), *at = nb_convert(in->logits_at, NB_I32);
    nb_val *start[3] = {zero, at, zero};
    int64_t sizes[3] = {B, 1, nb_val_dim(h, 2)};
    h = nb_dynamic_slice(h, start, sizes);
  }
  nb_val *logits = c->tie_embeddings ? nb_nn_embed_attend(a, "embed", h) : nb_nn_linear(a, "lm_head", h);
  if (nb_val_dtype(logits) != NB_F32 && nb_val_dtype(logits) != NB_F64) logits = nb_convert(logits, NB_F32);
  if (aux) {
    aux->lb_loss = lb ? nb_div(lb, nb_scalar(a->g, nb_val_dtype(lb), n_moe)) : NULL;
    aux->z_loss = z ? nb_div(z, nb_scalar(a->g, nb_val_dtype(z), n_moe)) : NULL;
  }
  return logits;
}

nb_val *nb_model_loss(nb_nn_apply *a, const nb_model_config *c, const nb_tree *batch, bool remat, nb_tree *metrics) {
  nb_val *inputs = nb_tree_get_val(batch, "inputs"), *targets = nb_tree_get_val(batch, "targets");
  if (!inputs || !targets) return nb_nn_fail(a, NB_ERR_NOT_FOUND, "model loss: the batch needs 'inputs' and 'targets'");
  nb_model_fwd f = {.tokens = inputs, .positions = nb_tree_get_val(batch, "positions"),
                    .segment_ids = nb_tree_get_val(batch, "segment_ids"), .remat = remat};
  nb_model_aux aux = {0};
  nb_val *logits = nb_model_forward(a, c, &f, &aux);
  if (nb_graph_status(a->g)) return logits;
  nb_val *mask = nb_tree_get_val(batch, "mask");
  if (!mask && f.segment_ids) mask = nb_ne(f.segment_ids, nb_full_like(f.segment_ids, 0));
  nb_dtype lt = nb_val_dtype(logits);
  nb_val *ce = nb_nn_cross_entropy(logits, targets, mask);
  nb_val *loss = ce;
  if (aux.lb_loss) {
    loss = nb_add(loss, nb_mul(nb_scalar(a->g, lt, c->lb_loss_coef), nb_convert(aux.lb_loss, lt)));
    loss = nb_add(loss, nb_mul(nb_scalar(a->g, lt, c->z_loss_coef), nb_convert(aux.z_loss, lt)));
  }
  if (metrics) {
    nb_val *tokens = mask ? nb_reduce_sum(nb_convert(mask, lt), 0, NULL)
                          : nb_scalar(a->g, lt, (double)(nb_val_dim(inputs, 0) * nb_val_dim(inputs, 1)));
    nb_status s = nb_tree_set_val(metrics, "ce", ce);
    if (!s) s = nb_tree_set_val(metrics, "tokens", tokens);
    if (!s && aux.lb_loss) s = nb_tree_set_val(metrics, "moe_lb", aux.lb_loss);
    if (!s && aux.z_loss) s = nb_tree_set_val(metrics, "moe_z", aux.z_loss);
    if (s) return nb_nn_fail(a, s, "model loss: out of memory");
  }
  return loss;
}

/* ---------------------------------------------------------------- graph builders */

enum { TRACE_LOSS, TRACE_FORWARD, TRACE_DECODE };
typedef struct trace_job {
  int kind;
  const nb_model_config *cfg;
  nb_model_trace_opts opts;
} trace_job;

static nb_status traced(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const trace_job *job = u;
  nb_tree *params = nb_tree_select_prefix(in, "params", true);
  nb_tree *batch = nb_tree_select_prefix(in, job->kind == TRACE_DECODE ? "cache" : "batch", true);
  nb_tree *extra = nb_tree_create(nb_graph_ctx(g));
  if (!params || !batch || !extra) {
    nb_tree_destroy(params);
    nb_tree_destroy(batch);
    nb_tree_destroy(extra);
    return NB_ERR_NOMEM;
  }
  nb_nn_apply a = {.g = g, .params = params, .train = job->opts.train, .rng = nb_tree_get_val(in, "rng"),
                   .dtype = job->opts.dtype, .linear_hook = job->opts.linear_hook, .hook_ud = job->opts.hook_ud};
  nb_status s = NB_OK;
  if (job->kind == TRACE_LOSS) {
    nb_val *loss = nb_model_loss(&a, job->cfg, batch, job->opts.remat, extra);
    s = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "loss", loss);
    if (!s) s = nb_tree_merge(out, "metrics", extra);
  } else if (job->kind == TRACE_FORWARD) {
    nb_model_fwd f = {.tokens = nb_tree_get_val(batch, "inputs"), .positions = nb_tree_get_val(batch, "positions"),
                      .segment_ids = nb_tree_get_val(batch, "segment_ids")};
    nb_val *logits = nb_model_forward(&a, job->cfg, &f, NULL);
    s = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "logits", logits);
  } else {
    nb_model_fwd f = {.tokens = nb_tree_get_val(in, "tokens"), .cache = batch, .cache_pos = nb_tree_get_val(in, "pos"),
                      .new_cache = extra};
    nb_val *logits = nb_model_forward(&a, job->cfg, &f, NULL);
    s = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "logits", logits);
    if (!s) s = nb_tree_merge(out, "cache", extra);
  }
  nb_tree_destroy(params);
  nb_tree_destroy(batch);
  nb_tree_destroy(extra);
  return s;
}

static nb_graph *build(nb_ctx *ctx, int kind, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                       const nb_tree *param_spec, const nb_tree *second, const char *second_prefix, nb_tree *spec) {
  trace_job job = {.kind = kind, .cfg = cfg};
  if (opts) job.opts = *opts;
  nb_graph *g = NULL;
  if (!spec) return NULL;
  if (nb_model_config_validate(ctx, cfg) || !param_spec || !second) {
    if (!nb_ctx_status(ctx)) nb_errorf(ctx, NB_ERR_INVALID_ARG, "model trace: NULL parameter or batch spec");
    goto done;
  }
  if (nb_tree_merge(spec, "params", param_spec) || nb_tree_merge(spec, second_prefix, second)) goto done;
  if (job.opts.train) {
    int64_t two = 2;
    if (nb_tree_set(spec, "rng", nb_leaf_aval(nb_aval_make(NB_U32, 1, &two)))) goto done;
  }
  g = nb_trace(ctx, traced, &job, spec);
done:
  nb_tree_destroy(spec);
  return g;
}

nb_graph *nb_model_trace_loss(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                              const nb_tree *param_spec, const nb_tree *batch_spec) {
  return build(ctx, TRACE_LOSS, cfg, opts, param_spec, batch_spec, "batch", nb_tree_create(ctx));
}

nb_graph *nb_model_trace_forward(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                                 const nb_tree *param_spec, const nb_tree *batch_spec) {
  return build(ctx, TRACE_FORWARD, cfg, opts, param_spec, batch_spec, "batch", nb_tree_create(ctx));
}

nb_tree *nb_model_cache_create(nb_ctx *ctx, const nb_model_config *cfg, int64_t batch, int64_t max_len, nb_dtype t) {
  if (nb_model_config_validate(ctx, cfg)) return NULL;
  if (batch < 1 || max_len < 1 || !nb_dtype_is_float(t))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model cache: need batch >= 1, max_len >= 1 and a float dtype"), NULL;
  nb_tree *c = nb_tree_create(ctx);
  int64_t d[4] = {batch, cfg->n_kv_heads, max_len, nb_model_head_dim(cfg)};
  for (int64_t l = 0; c && l < cfg->n_layers; l++)
    for (int kv = 0; kv < 2; kv++) {
      char p[64];
      snprintf(p, sizeof p, "layers/%lld/%c", (long long)l, "kv"[kv]);
      nb_array *z = nb_array_zeros(ctx, t, 4, d);
      nb_status s = z ? nb_tree_set_array(c, p, z) : NB_ERR_NOMEM;
      nb_array_release(z);
      if (s) {
        nb_tree_destroy(c);
        return NULL;
      }
    }
  return c;
}

nb_graph *nb_model_trace_decode(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                                const nb_tree *param_spec, int64_t batch, int64_t tokens, int64_t max_len,
                                nb_dtype cache_dtype) {
  if (batch < 1 || tokens < 1 || max_len < tokens || !nb_dtype_is_float(cache_dtype))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "model decode: need batch >= 1, 1 <= tokens <= max_len, float cache"), NULL;
  nb_tree *spec = nb_tree_create(ctx), *cache = nb_tree_create(ctx);
  if (!spec || !cache) {
    nb_tree_destroy(spec);
    nb_tree_destroy(cache);
    return NULL;
  }
  int64_t dt[2] = {batch, tokens}, dc[4] = {batch, cfg->n_kv_heads, max_len, nb_model_head_dim(cfg)};
  nb_tree_set(spec, "tokens", nb_leaf_aval(nb_aval_make(NB_I32, 2, dt)));
  nb_tree_set(spec, "pos", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  for (int64_t l = 0; l < cfg->n_layers; l++)
    for (int kv = 0; kv < 2; kv++) {
      char p[64];
      snprintf(p, sizeof p, "layers/%lld/%c", (long long)l, "kv"[kv]);
      nb_tree_set(cache, p, nb_leaf_aval(nb_aval_make(cache_dtype, 4, dc)));
    }
  nb_graph *g = build(ctx, TRACE_DECODE, cfg, opts, param_spec, cache, "cache", spec);
  nb_tree_destroy(cache);
  return g;
}
