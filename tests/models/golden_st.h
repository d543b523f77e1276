/* Reading the model goldens: a minimal safetensors reader (F32 and F64
 * tensors into a tree of arrays, by name) for the files the make_*_golden.py scripts
 * write, and the JSON config of those goldens as a model config. */
#ifndef NABLA_TEST_GOLDEN_ST_H
#define NABLA_TEST_GOLDEN_ST_H

#include "json_golden.h"

/* name -> f32 / f64 array; NULL after printing why. */
static nb_tree *golden_safetensors(nb_ctx *ctx, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open (run from the repository root)\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)size);
  size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
  fclose(f);
  uint64_t hlen = 0;
  for (int i = 7; got >= 8 && i >= 0; i--) hlen = (hlen << 8) | buf[i];
  if (got != (size_t)size || size < 8 || hlen > (uint64_t)size - 8) {
    fprintf(stderr, "%s: truncated safetensors file\n", path);
    free(buf);
    return NULL;
  }
  cJSON *h = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
  nb_tree *t = h ? nb_tree_create(ctx) : NULL;
  const unsigned char *data = buf + 8 + hlen;
  const cJSON *e;
  cJSON_ArrayForEach(e, h) {
    if (!strcmp(e->string, "__metadata__")) continue;
    int64_t dims[NB_MAX_RANK], off[2];
    int rank = nb_test_golden_ints(e, "shape", dims, NB_MAX_RANK);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    bool f64 = cJSON_IsString(dt) && !strcmp(dt->valuestring, "F64");
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= dims[d];
    if (rank < 0 || nb_test_golden_ints(e, "data_offsets", off, 2) != 2 || !cJSON_IsString(dt) ||
        (strcmp(dt->valuestring, "F32") && !f64) || off[0] < 0 || off[1] > size - 8 - (long)hlen ||
        off[1] - off[0] != n * (f64 ? 8 : 4)) {
      fprintf(stderr, "%s: tensor %s: bad entry\n", path, e->string);
      nb_tree_destroy(t);
      t = NULL;
      break;
    }
    nb_array *a = nb_array_create(ctx, f64 ? NB_F64 : NB_F32, rank, dims, data + off[0]);
    nb_tree_set_array(t, e->string, a);
    nb_array_release(a);
  }
  cJSON_Delete(h);
  free(buf);
  return t;
}

static int64_t cfg_int(const cJSON *c, const char *k) {
  return (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, k));
}

/* The i32 [rows, cols] array of a JSON list of lists. */
static nb_array *golden_int_matrix(nb_ctx *ctx, const cJSON *j, nb_dtype t) {
  int rows = cJSON_GetArraySize(j), cols = rows ? cJSON_GetArraySize(cJSON_GetArrayItem(j, 0)) : 0;
  double *v = malloc(sizeof(double) * (size_t)(rows * cols + 1));
  int n = 0;
  const cJSON *r, *x;
  cJSON_ArrayForEach(r, j) cJSON_ArrayForEach(x, r) v[n++] = cJSON_GetNumberValue(x);
  nb_array *a = nb_array_from_f64(ctx, t, 2, (int64_t[2]){rows, cols}, v);
  free(v);
  return a;
}

/* The GPT-2 goldens' model: the gpt2-tiny preset with the shape fields of
 * the JSON's "config" object. */
static void golden_gpt2_config(nb_ctx *ctx, const cJSON *c, nb_model_config *cfg) {
  CHECK_OK(ctx, nb_model_config_preset(ctx, "gpt2-tiny", cfg));
  cfg->vocab_size = cfg_int(c, "vocab_size");
  cfg->d_model = cfg_int(c, "d_model");
  cfg->n_layers = cfg_int(c, "n_layers");
  cfg->n_heads = cfg->n_kv_heads = cfg_int(c, "n_heads");
  cfg->d_ff = cfg_int(c, "d_ff");
  cfg->max_seq_len = cfg_int(c, "max_seq_len");
  cfg->norm_eps = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "norm_eps"));
}

/* The goldens' batch (new tree): "inputs" and "targets" as i32, "mask" as
 * f32, from the JSON's matrices of those names. */
static nb_tree *golden_batch(nb_ctx *ctx, const cJSON *j) {
  nb_tree *batch = nb_tree_create(ctx);
  const char *names[3] = {"inputs", "targets", "mask"};
  for (int k = 0; k < 3; k++) {
    nb_array *a = golden_int_matrix(ctx, cJSON_GetObjectItemCaseSensitive(j, names[k]), k == 2 ? NB_F32 : NB_I32);
    nb_tree_set_array(batch, names[k], a);
    nb_array_release(a);
  }
  return batch;
}

/* value_and_grad of the model's loss (traced with opts, which may be NULL)
 * on params and batch: "loss" and "grad/params/..." into out. False (after a
 * failed CHECK naming the error) when it could not run. */
static bool golden_loss_and_grads(nb_ctx *ctx, const nb_model_config *cfg, const nb_model_trace_opts *opts,
                                  const nb_tree *params, const nb_tree *batch, nb_tree *out) {
  nb_graph *g = nb_model_trace_loss(ctx, cfg, opts, params, batch);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  nb_tree *in = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", batch);
  bool ok = vg && nb_graph_run(ctx, vg, in, out) == NB_OK;
  CHECK_MSG(!vg || ok, "%s", nb_ctx_error(ctx));
  nb_tree_destroy(in);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  return ok;
}

#endif
