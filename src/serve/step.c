/* The model step over a scheduled batch: the reference transformer
 * (models.h's configuration and parameter paths, nn's layers) traced over
 * a batch's flat tokens with the paged cache write and paged attention in
 * place of dense attention, logits only for the rows that draw a token (a
 * sequence's last token, once per sample that takes it), and the sampler
 * (sample.c) on them. Compiled once per shape bucket. */
#include <math.h>
#include <string.h>

#include "nabla/compile.h"
#include "nabla/nn.h"
#include "serve/internal.h"
#include "util/util.h"

/* ---------------------------------------------------------------- the step graph */

/* Inputs "params/<path>", "tokens", "positions", "slots" i32[T],
 * "block_tables" i32[S, MB], "context_lens" i32[S], "query_start" i32[S + 1],
 * "logits_idx" i32[S] (per drawn row: the token whose logits it samples),
 * "sample/..." (nb_serve__sample_in's per-row inputs; bias, counts, seen and
 * penalties only when the bucket adjusts), "cache/layers/<l>/{k,v}"; outputs
 * "token", "logprob", "top_ids", "top_logprobs" per row, and "cache/...". */
#define PANEL 64 /* output features a panel of the decode layout holds (held_layout, below) */

typedef struct step_job {
  const nb_model_config *cfg;
  bool adjust;
  nb_nn_linear_hook hook;
  void *hook_ud;
  bool table_panels;            /* the tied embedding table is held as the head's panels (HELD_TABLE) */
} step_job;

/* The linear of a model whose 2-D kernels are held in the decode layout
 * (opts.pack_kernels); stacked kernels (an MoE's experts) stay as they are. */
static nb_val *linear_held(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  (void)ud;
  return stacked ? nb_nn_linear_default(a, path, x, true) : nb_nn_linear_held(a, path, x);
}

/* Rows ids [1, T] of a tied embedding table held as the head's panels
 * [P, d, PANEL] (HELD_TABLE below): row r is lane r % PANEL of panel
 * r / PANEL. [1, T, d] */
static nb_val *embed_rows(nb_nn_apply *a, nb_val *ids) {
  nb_val *table = nb_nn_param(a, "embed/embedding");
  if (nb_graph_status(a->g)) return table;
  nb_val *w = nb_scalar(a->g, nb_val_dtype(ids), PANEL);
  int64_t d3[3] = {nb_val_dim(ids, 0), nb_val_dim(ids, 1), 1};
  nb_val *at[2] = {nb_reshape(nb_div(ids, w), 3, d3), nb_reshape(nb_rem(ids, w), 3, d3)};
  nb_gather_dims dn = {.n_offset = 1, .offset_dims = {2}, .n_collapsed = 2, .collapsed_slice_dims = {0, 2},
                       .n_start_index_map = 2, .start_index_map = {0, 2}, .index_vector_dim = 2};
  int64_t sizes[3] = {1, nb_val_dim(table, 1), 1};
  return nb_gather(table, nb_concatenate(2, at, 2), &dn, sizes);
}

/* h [S, d] against that table: logits [S, vocab], the padding's columns dropped */
static nb_val *head_logits(nb_nn_apply *a, nb_val *h, int64_t vocab) {
  nb_val *table = nb_nn_param(a, "embed/embedding");
  if (nb_graph_status(a->g)) return table;
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {1}};
  int64_t S = nb_val_dim(h, 0), full[2] = {S, nb_val_dim(table, 0) * PANEL};
  nb_val *y = nb_reshape(nb_dot_general(h, table, &dn, NB_DTYPE_COUNT), 2, full); /* [S, P, PANEL] -> [S, P * PANEL] */
  if (full[1] == vocab) return y;
  int64_t start[2] = {0, 0}, limit[2] = {S, vocab};
  return nb_slice(y, start, limit, NULL);
}

static nb_status step_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const step_job *job = u;
  const nb_model_config *c = job->cfg;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *caches = nb_tree_create(ctx);
  if (!params || !caches) {
    nb_tree_destroy(params);
    nb_tree_destroy(caches);
    return NB_ERR_NOMEM;
  }
  nb_nn_apply a = {.g = g, .params = params, .linear_hook = job->hook, .hook_ud = job->hook_ud};
  nb_val *tokens = nb_tree_get_val(in, "tokens"), *slots = nb_tree_get_val(in, "slots");
  nb_val *bt = nb_tree_get_val(in, "block_tables"), *cl = nb_tree_get_val(in, "context_lens");
  nb_val *qs = nb_tree_get_val(in, "query_start");
  int64_t T = nb_val_dim(tokens, 0), d = c->d_model, H = c->n_heads, KVH = c->n_kv_heads, hd = nb_model_head_dim(c);
  int64_t bt2[2] = {1, T};
  nb_val *tok2 = nb_reshape(tokens, 2, bt2), *pos2 = nb_reshape(nb_tree_get_val(in, "positions"), 2, bt2);
  nb_val *x = job->table_panels ? embed_rows(&a, tok2) : nb_nn_embed(&a, "embed", tok2); /* [1, T, d] */
  if (c->learned_pos) x = nb_add(x, nb_nn_embed(&a, "pos_embed", pos2));
  nb_status s = NB_OK;
  for (int64_t l = 0; l < c->n_layers && !s && !nb_graph_status(g); l++) {
    nb_nn_block_cfg bc = nb_model_block_cfg(c, l);
    char p[64], q[128], pk[80], pv[80];
    snprintf(p, sizeof p, "layers/%lld", (long long)l);  /* caches: "cache/<p>/k" in, "<p>/k" under "cache" out */
    snprintf(pk, sizeof pk, "cache/%s/k", p);
    snprintf(pv, sizeof pv, "cache/%s/v", p);
    snprintf(q, sizeof q, "%s/attn_norm", p);
    nb_val *n1 = nb_nn_norm_apply(&a, q, &bc.norm, x);
    nb_val *proj[3];
    int64_t heads[3] = {H, KVH, KVH};
    for (int i = 0; i < 3; i++) {
      snprintf(q, sizeof q, "%s/attn/w%c", p, "qkv"[i]);
      int64_t d4[4] = {1, T, heads[i], hd};
      proj[i] = nb_reshape(nb_nn_linear(&a, q, n1), 4, d4);
    }
    if (bc.attn.rope) {
      proj[0] = nb_nn_rope(proj[0], pos2, &bc.attn.rope_cfg);
      proj[1] = nb_nn_rope(proj[1], pos2, &bc.attn.rope_cfg);
    }
    for (int i = 0; i < 3; i++) {
      int64_t d3[3] = {T, heads[i], hd};
      proj[i] = nb_reshape(proj[i], 3, d3);
    }
    nb_val *kc = NULL, *vc = NULL;
    s = nb_serve_kv_cache_write_op(nb_tree_get_val(in, pk), nb_tree_get_val(in, pv), proj[1], proj[2], slots, &kc, &vc);
    if (s) break;
    double scale = bc.attn.softmax_scale > 0 ? bc.attn.softmax_scale : 1 / sqrt((double)hd);
    nb_val *o = nb_serve_paged_attention_op(proj[0], kc, vc, bt, cl, qs, (float)scale);
    snprintf(q, sizeof q, "%s/attn/wo", p);
    int64_t do3[3] = {1, T, H * hd};
    x = nb_add(x, nb_nn_linear(&a, q, nb_reshape(o, 3, do3)));
    snprintf(q, sizeof q, "%s/mlp_norm", p);
    nb_val *n2 = nb_nn_norm_apply(&a, q, &bc.norm, x);
    snprintf(q, sizeof q, "%s/%s", p, bc.use_moe ? "moe" : "mlp");
    x = nb_add(x, bc.use_moe ? nb_nn_moe(&a, q, &bc.moe, n2, NULL) : nb_nn_mlp(&a, q, &bc.mlp, n2));
    if (nb_tree_set_val(caches, pk + 6, kc) || nb_tree_set_val(caches, pv + 6, vc)) s = NB_ERR_NOMEM;
  }
  if (!s && !nb_graph_status(g)) {
    /* the last token of each sequence only: the output projection is the step's largest matmul */
    int64_t td[2] = {T, d};
    nb_val *h = nb_take(nb_reshape(x, 2, td), nb_tree_get_val(in, "logits_idx")); /* [S, d] */
    nb_nn_norm_cfg fn = {.kind = c->norm, .eps = c->norm_eps, .bias = c->bias};
    h = nb_nn_norm_apply(&a, "final_norm", &fn, h);
    nb_val *logits = !c->tie_embeddings ? nb_nn_linear(&a, "lm_head", h)
                     : job->table_panels ? head_logits(&a, h, c->vocab_size)
                                         : nb_nn_embed_attend(&a, "embed", h);
    nb_serve__sample_in si = {.logits = logits, .fparams = nb_tree_get_val(in, "sample/f"),
                              .iparams = nb_tree_get_val(in, "sample/i"), .keys = nb_tree_get_val(in, "sample/keys")};
    if (job->adjust)
      si.bias = nb_tree_get_val(in, "sample/bias"), si.counts = nb_tree_get_val(in, "sample/counts"),
      si.seen = nb_tree_get_val(in, "sample/seen"), si.penalties = nb_tree_get_val(in, "sample/penalties");
    nb_serve__sample_out so;
    s = nb_graph_status(g) ? nb_graph_status(g) : nb_serve__sample_op(&si, &so);
    if (!s) s = nb_tree_set_val(out, "token", so.token);
    if (!s) s = nb_tree_set_val(out, "logprob", so.logprob);
    if (!s) s = nb_tree_set_val(out, "top_ids", so.top_ids);
    if (!s) s = nb_tree_set_val(out, "top_logprobs", so.top_logprobs);
    if (!s) s = nb_tree_merge(out, "cache", caches);
  }
  nb_tree_destroy(params);
  nb_tree_destroy(caches);
  return s ? s : nb_graph_status(g);
}

/* ---------------------------------------------------------------- the model */

enum {
  IN_PARAM, IN_CACHE, IN_TOKENS, IN_POSITIONS, IN_SLOTS, IN_TABLES, IN_LENS, IN_STARTS, IN_LOGITS_IDX,
  IN_SAMPLE_F, IN_SAMPLE_I, IN_KEYS, IN_BIAS, IN_COUNTS, IN_SEEN, IN_PENALTIES, IN_COUNT
};
static const char *const in_names[IN_COUNT] = {
    NULL, NULL, "tokens", "positions", "slots", "block_tables", "context_lens", "query_start", "logits_idx",
    "sample/f", "sample/i", "sample/keys", "sample/bias", "sample/counts", "sample/seen", "sample/penalties"};
enum { OUT_TOKEN, OUT_LOGPROB, OUT_TOP_IDS, OUT_TOP_LOGPROBS, OUT_COUNT };
static const char *const out_names[OUT_COUNT] = {"token", "logprob", "top_ids", "top_logprobs"};

typedef struct bucket {
  int32_t T, S, MB;
  bool adjust;                  /* takes the logits processors' inputs (bias, counts, seen, penalties) */
  nb_graph *graph;
  nb_exe *exe;                  /* NULL: the interpreter runs graph */
  size_t nin, nout;
  int *in_kind, *in_index;      /* where input i comes from */
  int out_at[OUT_COUNT];        /* output indices of out_names */
  int *out_cache;               /* cache slot of output i or -1 */
} bucket;

struct nb_serve_model {
  nb_ctx *ctx;
  nb_model_config cfg;
  nb_tree *params;
  int32_t block_size, num_blocks, max_tokens, max_seqs, max_blocks;
  nb_serve_model_opts opts;
  bool packed;                  /* the 2-D kernels in params are in the decode layout (opts.pack_kernels took) */
  bool table_panels;            /* and so is the tied embedding table (HELD_TABLE) */
  nb_array **cache;             /* 2 * n_layers: layers/<l>/k, layers/<l>/v, held only here */
  bucket **buckets;
  int n_buckets, cap_buckets;
  double compile_s;             /* tracing and compiling buckets, so far */
};

/* The block tables' width of the smallest bucket. The width only sizes the
 * tables (the attention reads each sequence's own blocks), so short contexts
 * share one bucket: with widths 1, 2, 4, ... a decode compiled (or loaded
 * from the disk cache, 10-16 ms each) a new step at 16, 32, 64 and 128
 * tokens of context, a few percent of a short generation. */
#define MIN_TABLE_BLOCKS 64

static int32_t pow2_at_least(int32_t n, int32_t lo) {
  int32_t b = lo;
  while (b < n) b *= 2;
  return b;
}

/* The paged attention's tasks on the threads of the executable running it
 * (the compiled step's pool), or in order when interpreted. */
static void on_step_threads(void *runner, int ntasks, void (*task)(void *arg, int i), void *arg) {
  (void)runner;
  nb_jit_parallel_for(ntasks, task, arg);
}

static int step_thread_count(void *runner) {
  (void)runner;
  return nb_jit_parallel_threads();
}

static const nb_serve_pool_lend step_threads = {on_step_threads, NULL, step_thread_count};

/* The custom calls on ctx: registered here unless the caller did already. */
static nb_status ensure_kernels(nb_ctx *ctx) {
  if (!nb_custom_call_registered(ctx, NB_SERVE__ATTN_NAME) || !nb_custom_call_registered(ctx, NB_SERVE__WRITE_NAME))
    return nb_serve_register_kernels(ctx, &step_threads);
  return nb_custom_call_registered(ctx, NB_SERVE__SAMPLE_NAME) ? NB_OK : nb_serve__register_sampler(ctx);
}

/* "<path>/kernel" or "kernel" of rank 2: a linear's kernel (nn names no other leaf so) */
static bool is_kernel_2d(const char *path, const nb_array *a) {
  size_t n = strlen(path);
  return nb_array_rank(a) == 2 && n >= 6 && !strcmp(path + n - 6, "kernel") && (n == 6 || path[n - 7] == '/');
}

/* The decode layout (opts.pack_kernels) of a kernel [in, out]: panels of
 * PANEL output features, [out / PANEL, in, PANEL] (panel q: columns
 * q*PANEL .. q*PANEL + PANEL - 1, row after row), when out is a multiple of
 * PANEL; else [out, in]. A decode step's few rows then read each thread's
 * share of a weight as one contiguous run (whole panels), which follows the
 * memory's rate where bands of columns of [in, out] do not; panels also
 * hand the CPU's vector units each row's PANEL values as they lie, where
 * [out, in] needs register transposes. PANEL is the width the CPU backend
 * reads in place (NB_SGEMM_PANEL, src/backend/cpu/sgemm.h); any other width
 * gives the same bits, repacked on every call.
 *
 * A tied embedding table [vocab, d] is the output head's kernel transposed:
 * f32, it is held as the head's panels, [ceil(vocab / PANEL), d, PANEL],
 * zero past the vocabulary (gpt2's head is 154 MB of the 501 MB a token
 * reads); the step gathers its embedding rows from them (embed_rows) and
 * drops the padding's logits (head_logits). */

enum { HELD_NONE, HELD_KERNEL, HELD_TABLE };

/* What the decode layout does with the parameter `a` at `path` */
static int held_kind(const nb_model_config *c, const char *path, const nb_array *a) {
  if (is_kernel_2d(path, a)) return HELD_KERNEL;
  return c->tie_embeddings && !strcmp(path, "embed/embedding") && nb_array_rank(a) == 2 && nb_array_dtype(a) == NB_F32
             ? HELD_TABLE
             : HELD_NONE;
}

/* The held shape of a parameter of that kind given with dims `in`: its rank */
static int held_shape(int kind, const int64_t *in, int64_t *dims) {
  if (kind == HELD_TABLE) return dims[0] = (in[0] + PANEL - 1) / PANEL, dims[1] = in[1], dims[2] = PANEL, 3;
  if (in[1] % PANEL) return dims[0] = in[1], dims[1] = in[0], 2;
  return dims[0] = in[1] / PANEL, dims[1] = in[0], dims[2] = PANEL, 3;
}

/* a (a host array; any dtype for a kernel) in the decode layout, a new array */
static nb_array *held_layout(nb_ctx *ctx, int kind, const nb_array *a) {
  const int64_t *io = nb_array_dims(a);
  int64_t dims[3];
  if (held_shape(kind, io, dims) == 2) return nb_array_transpose2d(ctx, a);
  nb_array *y = nb_array_empty(ctx, nb_array_dtype(a), 3, dims);
  if (!y) return NULL;
  const char *src = nb_array_data(a);
  char *dst = nb_array_data_mut(y);
  if (kind == HELD_KERNEL) {
    size_t es = (size_t)nb_dtype_size(nb_array_dtype(a)), row = PANEL * es;
    int64_t in = io[0], out = io[1];
    for (int64_t q = 0; q < out / PANEL; q++)
      for (int64_t p = 0; p < in; p++) memcpy(dst + (size_t)(q * in + p) * row, src + (size_t)(p * out + q * PANEL) * es, row);
    return y;
  }
  /* the table [vocab, d]: row r is lane r % PANEL of panel r / PANEL */
  const float *t = (const float *)src;
  float *p = (float *)dst;
  int64_t vocab = io[0], d = io[1];
  memset(p, 0, (size_t)(dims[0] * d * PANEL) * sizeof(float));
  for (int64_t r = 0; r < vocab; r++)
    for (int64_t k = 0; k < d; k++) p[(r / PANEL * d + k) * PANEL + r % PANEL] = t[r * d + k];
  return y;
}

/* opts.pack_kernels: every 2-D kernel of m->params (and a tied f32
 * embedding table) replaced by its decode layout; nothing (the plain layout
 * kept) when one is not a host array. */
static nb_status pack_kernels(nb_serve_model *m) {
  size_t n = nb_tree_size(m->params);
  for (size_t i = 0; i < n; i++) {
    const nb_array *a = nb_tree_leaf(m->params, i)->array;
    if (a && held_kind(&m->cfg, nb_tree_path(m->params, i), a) && !nb_array_data(a)) return NB_OK;
  }
  for (size_t i = 0; i < n; i++) {
    char p[NB_NN_PATH_MAX];
    const nb_array *a = nb_tree_leaf(m->params, i)->array;
    int kind = a ? held_kind(&m->cfg, nb_tree_path(m->params, i), a) : HELD_NONE;
    if (!kind) continue;
    if (snprintf(p, sizeof p, "%s", nb_tree_path(m->params, i)) >= (int)sizeof p) /* the tree's own string may move */
      return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "serve model: parameter path '%s' is too long", nb_tree_path(m->params, i));
    nb_array *t = held_layout(m->ctx, kind, a);
    nb_status s = t ? nb_tree_set_array(m->params, p, t) : nb_ctx_status(m->ctx) ? nb_ctx_status(m->ctx) : NB_ERR_NOMEM;
    nb_array_release(t);
    if (s) return s;
    m->table_panels |= kind == HELD_TABLE;
  }
  m->packed = true;
  return NB_OK;
}

nb_serve_model *nb_serve_model_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                      const nb_serve_config *ec, const nb_serve_model_opts *opts) {
  if (!cfg || !params || !ec) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: NULL config, params or engine config"), NULL;
  if (nb_model_config_validate(ctx, cfg)) return NULL;
  if (ec->block_size < 1 || ec->num_blocks < 1 || ec->num_blocks > INT32_MAX / ec->block_size || ec->max_num_batched_tokens < 1 ||
      ec->max_num_seqs < 1 || ec->max_model_len < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "serve model: the engine config needs block_size, num_blocks, max_num_batched_tokens, max_num_seqs and "
                     "max_model_len filled in (pass nb_serve_engine_config)"),
           NULL;
  if (ec->max_model_len > cfg->max_seq_len && cfg->learned_pos)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: max_model_len %d exceeds model.max_seq_len %lld (learned positions)",
                     ec->max_model_len, (long long)cfg->max_seq_len),
           NULL;
  if (ensure_kernels(ctx)) return NULL;
  nb_serve_model *m = nb_calloc(ctx, sizeof *m);
  if (!m) return NULL;
  m->ctx = ctx;
  m->cfg = *cfg;
  /* MoE is served dropless, as inference engines do: an expert capacity makes
   * a token's experts depend on the rest of the batch (and a capacity is a
   * training-time device for balanced expert load) */
  m->cfg.capacity_factor = 0;
  m->opts = opts ? *opts : (nb_serve_model_opts){0};
  m->block_size = ec->block_size;
  m->num_blocks = (int32_t)ec->num_blocks;
  m->max_tokens = ec->max_num_batched_tokens;
  m->max_seqs = ec->max_num_seqs;
  m->max_blocks = (ec->max_model_len + ec->block_size - 1) / ec->block_size;
  m->params = nb_tree_copy(params);
  if (m->params && m->opts.pack_kernels && !m->opts.linear_hook && pack_kernels(m)) {
    nb_serve_model_destroy(m);
    return NULL;
  }
  size_t n = (size_t)(2 * cfg->n_layers);
  m->cache = m->params ? nb_calloc(ctx, n * sizeof *m->cache) : NULL;
  int64_t dims[4] = {m->num_blocks, m->block_size, cfg->n_kv_heads, nb_model_head_dim(cfg)};
  for (size_t i = 0; m->cache && i < n; i++)
    if (!(m->cache[i] = nb_array_zeros(ctx, NB_F32, 4, dims))) {
      nb_serve_model_destroy(m);
      return NULL;
    }
  if (!m->cache) {
    nb_serve_model_destroy(m);
    return NULL;
  }
  return m;
}

static void bucket_free(nb_ctx *ctx, bucket *b) {
  if (!b) return;
  nb_exe_destroy(b->exe);
  nb_graph_destroy(b->graph);
  nb_dealloc(ctx, b->in_kind, b->nin * sizeof(int));
  nb_dealloc(ctx, b->in_index, b->nin * sizeof(int));
  nb_dealloc(ctx, b->out_cache, b->nout * sizeof(int));
  nb_dealloc(ctx, b, sizeof *b);
}

void nb_serve_model_destroy(nb_serve_model *m) {
  if (!m) return;
  for (int i = 0; i < m->n_buckets; i++) bucket_free(m->ctx, m->buckets[i]);
  nb_dealloc(m->ctx, m->buckets, (size_t)m->cap_buckets * sizeof *m->buckets);
  for (int64_t i = 0; m->cache && i < 2 * m->cfg.n_layers; i++) nb_array_release(m->cache[i]);
  nb_dealloc(m->ctx, m->cache, (size_t)(2 * m->cfg.n_layers) * sizeof *m->cache);
  nb_tree_destroy(m->params);
  nb_dealloc(m->ctx, m, sizeof *m);
}

int nb_serve_model_num_executables(const nb_serve_model *m) { return m ? m->n_buckets : 0; }
bool nb_serve_model_kernels_packed(const nb_serve_model *m) { return m && m->packed; }
double nb_serve_model_compile_s(const nb_serve_model *m) { return m ? m->compile_s : 0; }

/* How set_params converts a parameter given as loaded: as pack_kernels did */
static int given_kind(const nb_serve_model *m, const char *path, const nb_array *a) {
  int kind = m->packed ? held_kind(&m->cfg, path, a) : HELD_NONE;
  return kind == HELD_TABLE && !m->table_panels ? HELD_NONE : kind;
}

nb_status nb_serve_model_set_params(nb_serve_model *m, const nb_tree *params) {
  if (!m) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = m->ctx;
  if (!params || nb_tree_size(params) != nb_tree_size(m->params))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: set_params: %zu parameters given, the model has %zu",
                     params ? nb_tree_size(params) : 0, nb_tree_size(m->params));
  /* all checked before any is swapped: a refused call changes nothing */
  for (size_t i = 0; i < nb_tree_size(m->params); i++) {
    const char *p = nb_tree_path(m->params, i);
    nb_array *a = nb_tree_get_array(params, p);
    if (!a) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: set_params: no array '%s'", p);
    const nb_array *mine = nb_tree_leaf(m->params, i)->array;
    nb_aval want = nb_array_aval(mine), got = nb_array_aval(a), held = got;
    int kind = given_kind(m, p, a);
    bool convert = kind != HELD_NONE; /* given as loaded, held in the decode layout */
    if (convert && !nb_array_data(a))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: set_params: '%s' is not a host array (the model keeps kernels in its decode layout)", p);
    if (convert) held.shape.rank = held_shape(kind, got.shape.dims, held.shape.dims);
    if (!nb_aval_equal(&want, &held)) {
      char w[96], g[96];
      if (!convert)
        return nb_errorf(ctx, NB_ERR_SHAPE, "serve model: set_params: '%s' is %s, the model's is %s", p,
                         nb_aval_str(&got, g, sizeof g), nb_aval_str(&want, w, sizeof w));
      return nb_errorf(ctx, NB_ERR_SHAPE,
                       "serve model: set_params: '%s' is %s, which does not give the model's %s (its decode layout: [out, in], "
                       "panels [out / %d, in, %d], or a tied table's [vocab / %d, d, %d])",
                       p, nb_aval_str(&got, g, sizeof g), nb_aval_str(&want, w, sizeof w), PANEL, PANEL, PANEL, PANEL);
    }
  }
  /* same paths, so each keeps its position: the buckets' input indices stay right */
  for (size_t i = 0; i < nb_tree_size(m->params); i++) {
    char p[NB_NN_PATH_MAX];
    if (snprintf(p, sizeof p, "%s", nb_tree_path(m->params, i)) >= (int)sizeof p) /* the tree's own string may move */
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve model: set_params: path '%s' is too long", nb_tree_path(m->params, i));
    nb_array *a = nb_tree_get_array(params, p), *t = NULL;
    int kind = given_kind(m, p, a);
    if (kind && !(t = held_layout(ctx, kind, a))) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    nb_status s = nb_tree_set_array(m->params, p, t ? t : a);
    nb_array_release(t);
    if (s) return s;
  }
  return NB_OK;
}

/* "cache/layers/<l>/k" -> 2l, ".../v" -> 2l + 1; -1 otherwise */
static int cache_slot(const char *path, int64_t n_layers) {
  long long l;
  char kv, end;
  if (sscanf(path, "cache/layers/%lld/%c%c", &l, &kv, &end) != 2 || l < 0 || l >= n_layers || (kv != 'k' && kv != 'v'))
    return -1;
  return (int)(2 * l + (kv == 'v'));
}

static nb_status bind_io(nb_serve_model *m, bucket *b) {
  nb_ctx *ctx = m->ctx;
  const nb_graph *run = b->exe ? nb_exe_graph(b->exe) : b->graph;
  b->nin = nb_graph_num_inputs(run);
  b->nout = nb_graph_num_outputs(run);
  b->in_kind = nb_calloc(ctx, b->nin * sizeof(int));
  b->in_index = nb_calloc(ctx, b->nin * sizeof(int));
  b->out_cache = nb_calloc(ctx, b->nout * sizeof(int));
  if (!b->in_kind || !b->in_index || !b->out_cache) return NB_ERR_NOMEM;
  for (size_t i = 0; i < b->nin; i++) {
    const char *p = nb_graph_input_path(run, i);
    int slot = cache_slot(p, m->cfg.n_layers), kind = -1;
    int64_t at = strncmp(p, "params/", 7) ? -1 : nb_tree_find(m->params, p + 7);
    if (at >= 0) kind = IN_PARAM, b->in_index[i] = (int)at;
    else if (slot >= 0) kind = IN_CACHE, b->in_index[i] = slot;
    for (int k = IN_TOKENS; kind < 0 && k < IN_COUNT; k++)
      if (!strcmp(p, in_names[k])) kind = k;
    if (kind < 0) return nb_errorf(ctx, NB_ERR_INTERNAL, "serve model: unexpected graph input '%s'", p);
    b->in_kind[i] = kind;
  }
  for (int k = 0; k < OUT_COUNT; k++) b->out_at[k] = -1;
  for (size_t i = 0; i < b->nout; i++) {
    const char *p = nb_graph_output_path(run, i);
    b->out_cache[i] = cache_slot(p, m->cfg.n_layers);
    for (int k = 0; k < OUT_COUNT; k++)
      if (!strcmp(p, out_names[k])) b->out_at[k] = (int)i;
  }
  for (int k = 0; k < OUT_COUNT; k++)
    if (b->out_at[k] < 0) return nb_errorf(ctx, NB_ERR_INTERNAL, "serve model: the step graph lacks its '%s' output", out_names[k]);
  return NB_OK;
}

/* The per-step inputs of a bucket (T, S, MB, adjust) for a vocabulary of V. */
static nb_aval input_aval(int k, int32_t T, int32_t S, int32_t MB, int64_t V) {
  int64_t dT = T, dS = S, dS1 = S + 1, dt[2] = {S, MB}, d3[2] = {S, 3}, d4[2] = {S, 4}, dv[2] = {S, V};
  switch (k) {
  case IN_TOKENS: case IN_POSITIONS: case IN_SLOTS: return nb_aval_make(NB_I32, 1, &dT);
  case IN_TABLES: return nb_aval_make(NB_I32, 2, dt);
  case IN_LENS: case IN_LOGITS_IDX: return nb_aval_make(NB_I32, 1, &dS);
  case IN_STARTS: return nb_aval_make(NB_I32, 1, &dS1);
  case IN_SAMPLE_F: case IN_PENALTIES: return nb_aval_make(NB_F32, 2, d3);
  case IN_SAMPLE_I: return nb_aval_make(NB_I32, 2, d3);
  case IN_KEYS: return nb_aval_make(NB_U32, 2, d4);
  case IN_BIAS: case IN_COUNTS: return nb_aval_make(NB_F32, 2, dv);
  default: return nb_aval_make(NB_BOOL, 2, dv); /* IN_SEEN */
  }
}

static bool is_adjust_input(int k) { return k >= IN_BIAS && k <= IN_PENALTIES; }

static bucket *get_bucket(nb_serve_model *m, int32_t T, int32_t S, int32_t MB, bool adjust) {
  for (int i = 0; i < m->n_buckets; i++) {
    const bucket *b = m->buckets[i];
    if (b->T == T && b->S == S && b->MB == MB && b->adjust == adjust) return m->buckets[i];
  }
  nb_ctx *ctx = m->ctx;
  if (m->n_buckets == m->cap_buckets) {
    int cap = m->cap_buckets ? 2 * m->cap_buckets : 8;
    bucket **grown = nb_calloc(ctx, (size_t)cap * sizeof *grown);
    if (!grown) return NULL;
    if (m->n_buckets) memcpy(grown, m->buckets, (size_t)m->n_buckets * sizeof *grown);
    nb_dealloc(ctx, m->buckets, (size_t)m->cap_buckets * sizeof *m->buckets);
    m->buckets = grown;
    m->cap_buckets = cap;
  }
  bucket *b = nb_calloc(ctx, sizeof *b);
  if (!b) return NULL;
  b->T = T, b->S = S, b->MB = MB, b->adjust = adjust;
  nb_tree *spec = nb_tree_create(ctx);
  nb_status s = spec ? nb_tree_merge(spec, "params", m->params) : NB_ERR_NOMEM;
  for (int k = IN_TOKENS; !s && k < IN_COUNT; k++)
    if (adjust || !is_adjust_input(k)) s = nb_tree_set(spec, in_names[k], nb_leaf_aval(input_aval(k, T, S, MB, m->cfg.vocab_size)));
  for (int64_t i = 0; !s && i < 2 * m->cfg.n_layers; i++) {
    char p[64];
    snprintf(p, sizeof p, "cache/layers/%lld/%c", (long long)(i / 2), "kv"[i % 2]);
    s = nb_tree_set(spec, p, nb_leaf_aval(nb_array_aval(m->cache[i])));
  }
  step_job job = {.cfg = &m->cfg, .adjust = adjust, .hook = m->packed ? linear_held : m->opts.linear_hook,
                  .hook_ud = m->packed ? NULL : m->opts.hook_ud, .table_panels = m->table_panels};
  double t0 = nb_util__now_s();
  if (!s) b->graph = nb_trace(ctx, step_fn, &job, spec);
  nb_tree_destroy(spec);
  if (!s && !b->graph) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (!s && !m->opts.interpret) {
    const char *donate[] = {"cache", NULL};
    nb_jit_opts jo = {.donate = donate, .threads = m->opts.threads};
    b->exe = nb_jit(ctx, b->graph, &jo);
    if (!b->exe) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  }
  if (!s) s = bind_io(m, b);
  m->compile_s += nb_util__now_s() - t0;
  if (s) {
    bucket_free(ctx, b);
    return NULL;
  }
  m->buckets[m->n_buckets++] = b;
  return b;
}

/* copy-on-write: block src into dst in every layer's keys and values */
static nb_status do_copies(nb_serve_model *m, const nb_serve_batch *b) {
  size_t blk = (size_t)m->block_size * (size_t)(m->cfg.n_kv_heads * nb_model_head_dim(&m->cfg));
  for (int32_t c = 0; c < b->num_copies; c++) {
    int32_t src = b->copies[c].src, dst = b->copies[c].dst;
    if (src < 0 || src >= m->num_blocks || dst < 0 || dst >= m->num_blocks)
      return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "serve model: copies[%d] = {%d, %d} is out of range [0, %d)", c, src, dst,
                       m->num_blocks);
    for (int64_t i = 0; i < 2 * m->cfg.n_layers; i++) {
      float *d = nb_array_data_mut(m->cache[i]);
      memmove(d + (size_t)dst * blk, d + (size_t)src * blk, blk * sizeof(float));
    }
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- sampling inputs */

static const nb_serve_sampling greedy_sampling;

static const nb_serve_sampling *sampling_of(const nb_serve_seq_batch *q) { return q->sampling ? q->sampling : &greedy_sampling; }

nb_status nb_serve_model_check_sampling(const nb_serve_model *m, int64_t id, const nb_serve_sampling *sp) {
  if (!m) return NB_ERR_INVALID_ARG;
  if (!sp) return NB_OK;
  int64_t V = m->cfg.vocab_size;
  for (int32_t i = 0; i < sp->num_logit_bias; i++)
    if (sp->logit_bias_ids[i] < 0 || sp->logit_bias_ids[i] >= V)
      return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "serve request %lld: sampling.logit_bias_ids[%d] = %d is outside the vocabulary [0, %lld)",
                       (long long)id, i, sp->logit_bias_ids[i], (long long)V);
  for (int32_t i = 0; i < sp->num_stop_token_ids; i++)
    if (sp->stop_token_ids[i] < 0 || sp->stop_token_ids[i] >= V)
      return nb_errorf(m->ctx, NB_ERR_INVALID_ARG, "serve request %lld: sampling.stop_token_ids[%d] = %d is outside the vocabulary [0, %lld)",
                       (long long)id, i, sp->stop_token_ids[i], (long long)V);
  return NB_OK;
}

/* Tokens generated so far by the sequence when it draws: the index j of its key. */
static int32_t generated(const nb_serve_seq_batch *q) { return q->context_len - q->prompt_len; }

static bool penalized(const nb_serve_sampling *sp) {
  return sp->presence_penalty != 0 || sp->frequency_penalty != 0 || (sp->repetition_penalty != 0 && sp->repetition_penalty != 1);
}

/* Whether a drawing sequence needs the logits processors' inputs this step. */
static bool adjusts(const nb_serve_seq_batch *q) {
  const nb_serve_sampling *sp = sampling_of(q);
  return sp->num_logit_bias > 0 || penalized(sp) || (sp->num_stop_token_ids > 0 && generated(q) < sp->min_tokens);
}

/* Row r's logits processors' inputs: bias (logit_bias, -inf on the stop
 * tokens min_tokens masks), counts among the generated tokens, seen in
 * the prompt or output (for repetition only), penalties. */
static void fill_adjust(const nb_serve_seq_batch *q, int64_t V, int32_t r, float *bias, float *counts, uint8_t *seen, float *pen) {
  const nb_serve_sampling *sp = sampling_of(q);
  float *b = bias + (size_t)r * (size_t)V, *c = counts + (size_t)r * (size_t)V;
  uint8_t *sn = seen + (size_t)r * (size_t)V;
  for (int32_t i = 0; i < sp->num_logit_bias; i++) b[sp->logit_bias_ids[i]] += sp->logit_bias_values[i];
  if (generated(q) < sp->min_tokens)
    for (int32_t i = 0; i < sp->num_stop_token_ids; i++) b[sp->stop_token_ids[i]] = -INFINITY;
  bool rep = sp->repetition_penalty != 0 && sp->repetition_penalty != 1;
  if (penalized(sp))
    for (int32_t t = 0; t < q->context_len; t++) {
      int32_t id = q->tokens[t];
      if (id < 0 || id >= V) continue; /* the engine's tokens are the model's; stay in bounds regardless */
      if (t >= q->prompt_len) c[id] += 1;
      if (rep) sn[id] = 1;
    }
  pen[3 * r] = rep ? sp->repetition_penalty : 1;
  pen[3 * r + 1] = sp->frequency_penalty;
  pen[3 * r + 2] = sp->presence_penalty;
}

nb_status nb_serve_model_step(nb_serve_model *m, const nb_serve_batch *b, nb_serve_sample_out *outs, int32_t *num_out) {
  if (!m || !b || !num_out || (b->num_seqs > 0 && !outs)) return NB_ERR_INVALID_ARG;
  *num_out = 0;
  if (b->num_seqs == 0) return NB_OK;
  nb_ctx *ctx = m->ctx;
  int32_t draws = 0;
  bool adjust = false;
  for (int32_t i = 0; i < b->num_seqs; i++) {
    const nb_serve_seq_batch *q = &b->seqs[i];
    if (!q->needs_logits) continue;
    nb_status s = nb_serve_model_check_sampling(m, q->request_id, q->sampling);
    if (s) return s;
    draws += q->num_samples;
    adjust = adjust || adjusts(q);
  }
  if (b->num_tokens > m->max_tokens || b->num_seqs > m->max_seqs || draws > m->max_seqs)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                     "serve model: a batch of %d tokens, %d sequences and %d draws exceeds the engine's %d tokens and %d sequences",
                     b->num_tokens, b->num_seqs, draws, m->max_tokens, m->max_seqs);
  int32_t need = 1;
  for (int32_t i = 0; i < b->num_seqs; i++)
    if (b->seqs[i].num_table_blocks > need) need = b->seqs[i].num_table_blocks;
  /* S counts sequences and drawn rows alike: padding sequences own no tokens,
   * padding rows draw nothing. A lone decode gets a bucket of its own: padded
   * to 8 tokens, single-stream decode ran every product of the step on 8 rows */
  int32_t T = b->num_tokens == 1 ? 1 : pow2_at_least(b->num_tokens, 8);
  int32_t S = pow2_at_least(b->num_seqs > draws ? b->num_seqs : draws, 1), MB = pow2_at_least(need, MIN_TABLE_BLOCKS);
  if (MB > m->max_blocks) MB = m->max_blocks > need ? m->max_blocks : need;
  nb_status s = do_copies(m, b);
  if (s) return s;
  bucket *bk = get_bucket(m, T, S, MB, adjust);
  if (!bk) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  int64_t V = m->cfg.vocab_size;
  nb_array *arr[IN_COUNT] = {0};
  for (int k = IN_TOKENS; k < IN_COUNT; k++) {
    if (!adjust && is_adjust_input(k)) continue;
    nb_aval av = input_aval(k, T, S, MB, V);
    if (!(arr[k] = nb_array_zeros(ctx, av.dtype, av.shape.rank, av.shape.dims))) s = NB_ERR_NOMEM;
  }
  if (!s) {
    int32_t *tok = nb_array_data_mut(arr[IN_TOKENS]), *pos = nb_array_data_mut(arr[IN_POSITIONS]);
    int32_t *slot = nb_array_data_mut(arr[IN_SLOTS]), *qs = nb_array_data_mut(arr[IN_STARTS]);
    int32_t *cl = nb_array_data_mut(arr[IN_LENS]), *li = nb_array_data_mut(arr[IN_LOGITS_IDX]);
    float *fp = nb_array_data_mut(arr[IN_SAMPLE_F]);
    int32_t *ip = nb_array_data_mut(arr[IN_SAMPLE_I]);
    uint32_t *keys = nb_array_data_mut(arr[IN_KEYS]);
    memcpy(tok, b->token_ids, (size_t)b->num_tokens * sizeof *tok);
    memcpy(pos, b->positions, (size_t)b->num_tokens * sizeof *pos);
    /* the real rows; padding tokens write nowhere, padding sequences own no rows */
    s = nb_serve_batch_operands(ctx, b, m->block_size, MB, nb_array_data_mut(arr[IN_TABLES]), cl, qs, slot);
    for (int32_t t = b->num_tokens; t < T; t++) slot[t] = -1;
    for (int32_t i = b->num_seqs + 1; i <= S; i++) qs[i] = b->num_tokens;
    float *pen = adjust ? nb_array_data_mut(arr[IN_PENALTIES]) : NULL;
    for (int32_t r = 0; pen && r < S; r++) pen[3 * r] = 1;
    /* one row per draw, in batch order */
    for (int32_t i = 0, r = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *q = &b->seqs[i];
      const nb_serve_sampling *sp = sampling_of(q);
      for (int32_t k = 0; q->needs_logits && k < q->num_samples; k++, r++) {
        li[r] = q->token_start + q->num_tokens - 1;
        fp[3 * r] = sp->temperature, fp[3 * r + 1] = sp->top_p, fp[3 * r + 2] = sp->min_p;
        ip[3 * r] = sp->top_k, ip[3 * r + 1] = sp->num_logprobs, ip[3 * r + 2] = 1;
        keys[4 * r] = (uint32_t)(sp->seed >> 32), keys[4 * r + 1] = (uint32_t)sp->seed;
        keys[4 * r + 2] = (uint32_t)q->sample_indices[k], keys[4 * r + 3] = (uint32_t)generated(q);
        if (adjust)
          fill_adjust(q, V, r, nb_array_data_mut(arr[IN_BIAS]), nb_array_data_mut(arr[IN_COUNTS]),
                      nb_array_data_mut(arr[IN_SEEN]), pen);
      }
    }
  }
  nb_array **in = nb_calloc(ctx, (bk->nin + 1) * sizeof *in), **out = nb_calloc(ctx, (bk->nout + 1) * sizeof *out);
  if (!s && (!in || !out)) s = NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < bk->nin; i++) {
    int k = bk->in_kind[i];
    in[i] = k == IN_PARAM ? nb_tree_leaf(m->params, (size_t)bk->in_index[i])->array
            : k == IN_CACHE ? m->cache[bk->in_index[i]]
                            : arr[k];
  }
  if (!s) s = bk->exe ? nb_exe_run_flat(bk->exe, in, out) : nb_graph_run_flat(ctx, bk->graph, in, out);
  if (!s) {
    const int32_t *sampled = nb_array_data(out[bk->out_at[OUT_TOKEN]]), *top_ids = nb_array_data(out[bk->out_at[OUT_TOP_IDS]]);
    const float *logprob = nb_array_data(out[bk->out_at[OUT_LOGPROB]]), *top_lp = nb_array_data(out[bk->out_at[OUT_TOP_LOGPROBS]]);
    for (int32_t i = 0, r = 0; i < b->num_seqs; i++) {
      const nb_serve_seq_batch *q = &b->seqs[i];
      int32_t n_top = sampling_of(q)->num_logprobs; /* the engine keeps it in [0, 20]; the kernel caps it there */
      n_top = n_top < 0 ? 0 : n_top > NB_SERVE_MAX_LOGPROBS ? NB_SERVE_MAX_LOGPROBS : n_top;
      for (int32_t k = 0; q->needs_logits && k < q->num_samples; k++, r++) {
        nb_serve_sample_out *o = &outs[(*num_out)++];
        *o = (nb_serve_sample_out){.request_id = q->request_id, .sample_index = q->sample_indices[k], .token = sampled[r],
                                   .logprob = logprob[r], .num_top = n_top};
        memcpy(o->top_ids, top_ids + (size_t)r * NB_SERVE_MAX_LOGPROBS, (size_t)n_top * sizeof *o->top_ids);
        memcpy(o->top_logprobs, top_lp + (size_t)r * NB_SERVE_MAX_LOGPROBS, (size_t)n_top * sizeof *o->top_logprobs);
      }
    }
    for (size_t i = 0; i < bk->nout; i++) {
      int c = bk->out_cache[i];
      if (c < 0) continue;
      nb_array_release(m->cache[c]); /* the output may be this very array, updated in place */
      m->cache[c] = out[i];
      out[i] = NULL;
    }
  }
  for (size_t i = 0; out && i < bk->nout; i++) nb_array_release(out[i]);
  nb_dealloc(ctx, in, (bk->nin + 1) * sizeof *in);
  nb_dealloc(ctx, out, (bk->nout + 1) * sizeof *out);
  for (int k = 0; k < IN_COUNT; k++) nb_array_release(arr[k]);
  if (s == NB_ERR_NOMEM && !nb_ctx_status(ctx)) nb_errorf(ctx, NB_ERR_NOMEM, "serve model: out of memory");
  return s;
}
