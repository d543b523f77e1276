/* The paged attention and cache write kernels (attention.c) as custom calls,
 * so that a traced model step can use them: the shape rules shared by the
 * calls' infer rules and the traced ops' checks (which name the operand),
 * and evals that hand the arrays to the kernels. Inference only: no vjp. */
#include <stdio.h>
#include <string.h>

#include "serve/internal.h"

#define ATTN_NAME NB_SERVE__ATTN_NAME
#define WRITE_NAME NB_SERVE__WRITE_NAME

/* ---------------------------------------------------------------- shape rules */

static bool is(const nb_aval *a, nb_dtype t, int rank) { return a->dtype == t && a->shape.rank == rank; }
static bool fits_i32(int64_t n) { return n >= 0 && n <= INT32_MAX; }

/* A cache pair: f32[num_blocks, block_size, KVH, D], the same for both. */
static bool check_caches(const nb_aval *kc, const nb_aval *vc, char *why, size_t cap) {
  if (!is(kc, NB_F32, 4)) return snprintf(why, cap, "k_cache must be f32[num_blocks, block_size, num_kv_heads, head_dim]"), false;
  if (!is(vc, NB_F32, 4) || !nb_shape_equal(&kc->shape, &vc->shape))
    return snprintf(why, cap, "v_cache must be f32 of k_cache's shape"), false;
  for (int d = 0; d < 4; d++)
    if (kc->shape.dims[d] <= 0 || !fits_i32(kc->shape.dims[d])) return snprintf(why, cap, "k_cache dim %d is empty or too large", d), false;
  return true;
}

/* q, k_cache, v_cache, block_tables, context_lens, query_start */
static bool check_attn_avals(int nin, const nb_aval *in, char *why, size_t cap) {
  if (nin != 6) return snprintf(why, cap, "takes 6 operands, got %d", nin), false;
  const nb_aval *q = &in[0], *bt = &in[3], *cl = &in[4], *qs = &in[5];
  if (!check_caches(&in[1], &in[2], why, cap)) return false;
  int64_t kvh = in[1].shape.dims[2], hd = in[1].shape.dims[3];
  if (!is(q, NB_F32, 3) || !fits_i32(q->shape.dims[0]) || q->shape.dims[2] != hd || q->shape.dims[1] <= 0 ||
      q->shape.dims[1] % kvh != 0)
    return snprintf(why, cap, "q must be f32[num_tokens, num_heads, %lld] with num_heads a positive multiple of num_kv_heads %lld",
                    (long long)hd, (long long)kvh), false;
  if (!is(bt, NB_I32, 2) || !fits_i32(bt->shape.dims[0]) || !fits_i32(bt->shape.dims[1]))
    return snprintf(why, cap, "block_tables must be i32[num_seqs, max_blocks_per_seq]"), false;
  if (!is(cl, NB_I32, 1) || cl->shape.dims[0] != bt->shape.dims[0])
    return snprintf(why, cap, "context_lens must be i32[%lld] (a length per block_tables row)", (long long)bt->shape.dims[0]), false;
  if (!is(qs, NB_I32, 1) || qs->shape.dims[0] != bt->shape.dims[0] + 1)
    return snprintf(why, cap, "query_start must be i32[%lld] (num_seqs + 1)", (long long)bt->shape.dims[0] + 1), false;
  return true;
}

/* k_cache, v_cache, k, v, slot_mapping */
static bool check_write_avals(int nin, const nb_aval *in, char *why, size_t cap) {
  if (nin != 5) return snprintf(why, cap, "takes 5 operands, got %d", nin), false;
  if (!check_caches(&in[0], &in[1], why, cap)) return false;
  const nb_aval *k = &in[2], *v = &in[3], *sm = &in[4];
  int64_t kvh = in[0].shape.dims[2], hd = in[0].shape.dims[3];
  if (!is(k, NB_F32, 3) || !fits_i32(k->shape.dims[0]) || k->shape.dims[1] != kvh || k->shape.dims[2] != hd)
    return snprintf(why, cap, "k must be f32[num_tokens, %lld, %lld] (the cache's heads and head_dim)", (long long)kvh,
                    (long long)hd), false;
  if (!is(v, NB_F32, 3) || !nb_shape_equal(&k->shape, &v->shape)) return snprintf(why, cap, "v must be f32 of k's shape"), false;
  if (!is(sm, NB_I32, 1) || sm->shape.dims[0] != k->shape.dims[0])
    return snprintf(why, cap, "slot_mapping must be i32[%lld] (a slot per token)", (long long)k->shape.dims[0]), false;
  return true;
}

/* ---------------------------------------------------------------- custom calls */

static nb_status attn_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out) {
  (void)ud, (void)attrs;
  char why[160];
  if (nout != 1 || attrs_size != sizeof(float) || !check_attn_avals(nin, in, why, sizeof why)) return NB_ERR_SHAPE;
  out[0] = in[0];
  return NB_OK;
}

static nb_status attn_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout,
                           nb_array **out) {
  (void)nin, (void)attrs_size, (void)nout;
  const nb_serve_pool_lend *lend = ud;
  const int64_t *qd = nb_array_dims(in[0]), *cd = nb_array_dims(in[1]), *bd = nb_array_dims(in[3]);
  float scale;
  memcpy(&scale, attrs, sizeof scale);
  nb_serve_attn a = {.num_seqs = (int32_t)bd[0], .num_tokens = (int32_t)qd[0], .num_heads = (int32_t)qd[1],
                     .num_kv_heads = (int32_t)cd[2], .head_dim = (int32_t)cd[3], .block_size = (int32_t)cd[1],
                     .num_blocks = (int32_t)cd[0], .max_blocks_per_seq = (int32_t)bd[1], .q = nb_array_data(in[0]),
                     .k_cache = nb_array_data(in[1]), .v_cache = nb_array_data(in[2]), .block_tables = nb_array_data(in[3]),
                     .context_lens = nb_array_data(in[4]), .query_start = nb_array_data(in[5]), .scale = scale,
                     .out = nb_array_data_mut(out[0]), .threads = !lend || !lend->par ? 1 : lend->threads ? lend->threads(lend->runner) : 0};
  return nb_serve_paged_attention(ctx, &a, lend ? lend->par : NULL, lend ? lend->runner : NULL);
}

static void attn_cost(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, double *flops, double *bytes) {
  (void)ud, (void)nin, (void)attrs, (void)attrs_size;
  /* unknown context lengths: count one block of keys per query row and head */
  double rows = (double)in[0].shape.dims[0] * (double)in[0].shape.dims[1], hd = (double)in[0].shape.dims[2];
  double bs = (double)in[1].shape.dims[1];
  *flops = 4 * rows * bs * hd;
  *bytes = 4 * (2 * rows * hd + 2 * bs * (double)in[1].shape.dims[2] * hd * (double)in[3].shape.dims[0]);
}

static nb_status write_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t attrs_size, int nout, nb_aval *out) {
  (void)ud, (void)attrs;
  char why[160];
  if (nout != 2 || attrs_size != 0 || !check_write_avals(nin, in, why, sizeof why)) return NB_ERR_SHAPE;
  out[0] = in[0], out[1] = in[1];
  return NB_OK;
}

static nb_status write_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t attrs_size, int nout,
                            nb_array **out) {
  (void)ud, (void)nin, (void)attrs, (void)attrs_size, (void)nout;
  const int64_t *cd = nb_array_dims(in[0]);
  float *kc = nb_array_data_mut(out[0]), *vc = nb_array_data_mut(out[1]); /* the caches, updated in place */
  nb_serve_kv_write w = {.num_tokens = (int32_t)nb_array_dims(in[2])[0], .num_kv_heads = (int32_t)cd[2],
                         .head_dim = (int32_t)cd[3], .block_size = (int32_t)cd[1], .num_blocks = (int32_t)cd[0],
                         .k = nb_array_data(in[2]), .v = nb_array_data(in[3]), .slot_mapping = nb_array_data(in[4]),
                         .k_cache = kc, .v_cache = vc};
  return nb_serve_kv_cache_write(ctx, &w);
}

nb_status nb_serve_register_kernels(nb_ctx *ctx, const nb_serve_pool_lend *lend) {
  nb_custom_call_rules attn = {.name = ATTN_NAME, .infer = attn_infer, .eval = attn_eval, .cost = attn_cost, .ud = (void *)lend};
  /* outputs 0 and 1 are the caches (operands 0 and 1) with the new slots:
   * a compiled step writes only those slots into donated caches */
  nb_custom_call_rules write = {.name = WRITE_NAME, .infer = write_infer, .eval = write_eval, .in_place = 0x3};
  nb_status st = nb_custom_call_register(ctx, &attn);
  if (st == NB_OK) st = nb_custom_call_register(ctx, &write);
  return st != NB_OK ? st : nb_serve__register_sampler(ctx);
}

/* ---------------------------------------------------------------- traced ops */

static nb_graph *graph_of(int n, nb_val *const *v) {
  for (int i = 0; i < n; i++)
    if (!v[i]) return NULL;
  return nb_val_graph(v[0]);
}

nb_val *nb_serve_paged_attention_op(nb_val *q, nb_val *k_cache, nb_val *v_cache, nb_val *block_tables, nb_val *context_lens,
                                    nb_val *query_start, float scale) {
  nb_val *in[6] = {q, k_cache, v_cache, block_tables, context_lens, query_start};
  nb_graph *g = graph_of(6, in);
  if (!g) return NULL;
  nb_aval av[6];
  for (int i = 0; i < 6; i++) av[i] = nb_val_aval(in[i]);
  char why[160];
  if (!check_attn_avals(6, av, why, sizeof why)) return nb_graph_fail_at(NB_HERE, g, NB_ERR_SHAPE, "nb_serve_paged_attention_op: %s", why);
  return nb_custom_call(g, ATTN_NAME, 6, in, &scale, sizeof scale, 1, NULL);
}

nb_status nb_serve_kv_cache_write_op(nb_val *k_cache, nb_val *v_cache, nb_val *k, nb_val *v, nb_val *slot_mapping, nb_val **k_out,
                                     nb_val **v_out) {
  nb_val *in[5] = {k_cache, v_cache, k, v, slot_mapping}, *out[2] = {NULL, NULL};
  nb_graph *g = graph_of(5, in);
  if (!g) return NB_ERR_INVALID_ARG;
  nb_aval av[5];
  for (int i = 0; i < 5; i++) av[i] = nb_val_aval(in[i]);
  char why[160];
  if (!check_write_avals(5, av, why, sizeof why)) {
    *k_out = *v_out = nb_graph_fail_at(NB_HERE, g, NB_ERR_SHAPE, "nb_serve_kv_cache_write_op: %s", why);
    return NB_ERR_SHAPE;
  }
  nb_custom_call(g, WRITE_NAME, 5, in, NULL, 0, 2, out);
  *k_out = out[0], *v_out = out[1];
  return nb_graph_status(g);
}
