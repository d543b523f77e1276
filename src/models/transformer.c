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

/* ---------------------------------------------------------------- scanned layers */

/* Layers [l0, l1) of one block configuration as one scan (scan_layers):
 * the body is one block traced once at layer l0's paths, the carry the
 * hidden state, the xs every parameter of the block stacked over the layers
 * in the graph (the parameter tree keeps its per-layer paths, so checkpoints
 * and optimizer states are the same as unrolled), consts the positions and
 * segment ids. In train mode with dropout each layer's key is the step's
 * key folded with the layer index (the unrolled model folds its path: the
 * masks differ, their distribution does not). */
typedef struct scan_call {
  const nb_nn_block_cfg *bc;
  const nb_nn_apply *outer;
  const char *path;
  bool remat, rng;
} scan_call;

static nb_status scan_body(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const scan_call *sc = u;
  nb_tree *p = nb_tree_select_prefix(in, "params", true);
  if (!p) return NB_ERR_NOMEM;
  nb_nn_apply a = *sc->outer;
  a.g = g;
  a.params = p;
  a.rng = sc->rng ? nb_tree_get_val(in, "rng") : NULL;
  nb_nn_attn_io io = {.positions = nb_tree_get_val(in, "positions"), .segment_ids = nb_tree_get_val(in, "segment_ids")};
  nb_nn_moe_aux aux = {0};
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *y = sc->remat ? remat_block(&a, sc->path, sc->bc, x, &io, &aux) : nb_nn_block(&a, sc->path, sc->bc, x, &io, &aux);
  nb_status s = nb_graph_status(g) ? nb_graph_status(g) : nb_tree_set_val(out, "y", y);
  if (!s && aux.lb_loss) s = nb_tree_set_val(out, "lb", aux.lb_loss);
  if (!s && aux.z_loss) s = nb_tree_set_val(out, "z", aux.z_loss);
  nb_tree_destroy(p);
  return s;
}

/* v [d...] of every layer stacked into [l1 - l0, d...] */
static nb_val *stack_layers(nb_nn_apply *a, const char *rest, int64_t l0, int64_t l1) {
  nb_val *parts[256];
  if (l1 - l0 > 256) return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "model: scan_layers over more than 256 layers of one kind");
  for (int64_t l = l0; l < l1; l++) {
    char path[256];
    snprintf(path, sizeof path, "layers/%lld/%s", (long long)l, rest);
    nb_val *v = nb_tree_get_val(a->params, path);
    if (!v) return nb_nn_fail(a, NB_ERR_NOT_FOUND, "model: scan_layers: no parameter '%s'", path);
    nb_aval av = nb_val_aval(v);
    int64_t d[NB_MAX_RANK];
    if (av.shape.rank + 1 > NB_MAX_RANK) return nb_nn_fail(a, NB_ERR_SHAPE, "model: scan_layers: '%s' has too many dims", path);
    d[0] = 1;
    memcpy(d + 1, av.shape.dims, sizeof(int64_t) * (size_t)av.shape.rank);
    parts[l - l0] = nb_reshape(v, av.shape.rank + 1, d);
  }
  return l1 - l0 == 1 ? parts[0] : nb_concatenate((int)(l1 - l0), parts, 0);
}

static nb_val *scan_blocks(nb_nn_apply *a, int64_t l0, int64_t l1, const nb_nn_block_cfg *bc, nb_val *h, nb_nn_attn_io *io,
                           bool remat, nb_nn_moe_aux *aux) {
  nb_ctx *ctx = nb_graph_ctx(a->g);
  char path[64];
  snprintf(path, sizeof path, "layers/%lld", (long long)l0);
  bool rng = a->train && a->rng && (bc->resid_dropout > 0 || bc->attn.dropout > 0);
  nb_tree *layer = nb_tree_select_prefix(a->params, path, false), *spec = nb_tree_create(ctx);
  nb_val *consts[2], *xs[512], *ys[2] = {NULL, NULL}, *y = NULL;
  int nc = 0, nx = 0;
  nb_status s = layer && spec ? NB_OK : NB_ERR_NOMEM;
  /* the body's inputs by position: consts, the carry, the xs */
  if (!s && io->positions) s = nb_tree_set_val(spec, "positions", consts[nc++] = io->positions);
  if (!s && io->segment_ids) s = nb_tree_set_val(spec, "segment_ids", consts[nc++] = io->segment_ids);
  if (!s) s = nb_tree_set_val(spec, "x", h);
  if (!s && rng) {
    nb_val *keys[256];
    int64_t one_key[2] = {1, 2};
    for (int64_t l = l0; l < l1 && l - l0 < 256; l++)
      keys[l - l0] = nb_reshape(nb_random_fold_in(a->rng, nb_scalar(a->g, NB_U32, (double)l)), 2, one_key);
    xs[nx++] = nb_concatenate((int)(l1 - l0), keys, 0);
    s = nb_tree_set_val(spec, "rng", a->rng);
  }
  size_t plen = strlen(path) + 1;
  for (size_t i = 0; !s && i < nb_tree_size(layer) && nx < 512; i++) {
    const char *full = nb_tree_path(layer, i);
    char key[320];
    snprintf(key, sizeof key, "params/%s", full);
    xs[nx++] = stack_layers(a, full + plen, l0, l1);
    s = nb_graph_status(a->g) ? nb_graph_status(a->g) : nb_tree_set(spec, key, *nb_tree_leaf(layer, i));
  }
  if (!s && nb_tree_size(layer) >= 512) s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "model: scan_layers: a block of 512 or more parameters");
  scan_call sc = {bc, a, path, remat, rng};
  nb_graph *body = s ? NULL : nb_trace(ctx, scan_body, &sc, spec);
  if (!s && !body) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (!s) {
    nb_scan_opts so = {.length = l1 - l0};
    s = nb_scan(a->g, body, nc, consts, 1, &h, nx, xs, &so, &y, ys);
  }
  if (!s && nb_graph_num_outputs(body) > 1) {
    static const int axis0[1] = {0};
    aux->lb_loss = nb_reduce_sum(ys[0], 1, axis0);
    aux->z_loss = nb_graph_num_outputs(body) > 2 ? nb_reduce_sum(ys[1], 1, axis0) : NULL;
  }
  nb_graph_destroy(body);
  nb_tree_destroy(layer);
  nb_tree_destroy(spec);
  if (!s && y) return y;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
  return nb_nn_fail(a, s ? s : NB_ERR_INTERNAL, "model: scan of layers %lld..%lld: %s", (long long)l0, (long long)l1 - 1, msg);
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
  /* scan_layers: runs of layers with one block configuration (a linear hook
   * may read parameters outside the block, a param hook sees whole leaves, a
   * cache is per layer: all three unrolled) */
  bool scan = c->scan_layers && !in->cache && !a->linear_hook && !a->param_hook;
  for (int64_t l = 0; l < c->n_layers && !nb_graph_status(a->g); l++) {
    int64_t l1 = l + 1;
    nb_nn_block_cfg sbc = nb_model_block_cfg(c, l);
    while (scan && l1 < c->n_layers && nb_model_block_cfg(c, l1).use_moe == sbc.use_moe) l1++;
    if (scan && l1 - l > 1) {
      nb_nn_attn_io io = {.positions = in->positions, .segment_ids = in->segment_ids};
      nb_nn_moe_aux maux = {0};
      h = scan_blocks(a, l, l1, &sbc, h, &io, in->remat, &maux);
      if (maux.lb_loss) {
        lb = lb ? nb_add(lb, maux.lb_loss) : maux.lb_loss;
        z = z ? nb_add(z, maux.z_loss) : maux.z_loss;
        n_moe += (int)(l1 - l);
      }
      l = l1 - 1;
      continue;
    }
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
  nb_tree *frozen = job->opts.frozen_spec ? nb_tree_select_prefix(in, "frozen", true) : NULL;
  if (params && frozen && nb_tree_merge(params, NULL, frozen)) nb_tree_destroy(params), params = NULL;
  nb_tree_destroy(frozen);
  if (!params || !batch || !extra) {
    nb_tree_destroy(params);
    nb_tree_destroy(batch);
    nb_tree_destroy(extra);
    return NB_ERR_NOMEM;
  }
  nb_nn_apply a = {.g = g, .params = params, .train = job->opts.train, .rng = nb_tree_get_val(in, "rng"),
                   .dtype = job->opts.dtype, .linear_hook = job->opts.linear_hook, .hook_ud = job->opts.hook_ud,
                   .param_hook = job->opts.param_hook, .param_ud = job->opts.param_ud,
                   .expert_axis = job->opts.expert_axis};
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
  if (job.opts.frozen_spec) {
    for (size_t i = 0; i < nb_tree_size(job.opts.frozen_spec); i++)
      if (nb_tree_find(param_spec, nb_tree_path(job.opts.frozen_spec, i)) >= 0) {
        nb_errorf(ctx, NB_ERR_INVALID_ARG, "model trace: '%s' is both a parameter and a frozen parameter",
                  nb_tree_path(job.opts.frozen_spec, i));
        goto done;
      }
    if (nb_tree_merge(spec, "frozen", job.opts.frozen_spec)) goto done;
  }
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
