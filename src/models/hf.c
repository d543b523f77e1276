/* Hugging Face Llama-architecture folders as nabla models: config.json into
 * a model config, safetensors weights (one file or an index of shards)
 * renamed to nabla's parameter paths with PyTorch's [out, in] linear
 * weights transposed to [in, out] kernels and converted to f32, and the
 * tokenizer.json. Other architectures (biases, other activations, other
 * RoPE scalings) are refused by name rather than loaded wrongly. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/internal.h"
#include "nabla/ckpt.h"
#include "util/util.h"

typedef struct hf_load {
  nb_ctx *ctx;
  const char *dir;
  char cfg_path[4200];
  cJSON *weight_map;   /* the index's "weight_map" (tensor -> shard file), or NULL */
  char weights[4200];  /* model.safetensors or the index */
} hf_load;

static nb_status cfg_err(hf_load *L, nb_status s, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static nb_status cfg_err(hf_load *L, nb_status s, const char *field, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nb_errorf(L->ctx, s, "%s: field '%s' %s", L->cfg_path, field, msg);
}

/* a required positive integer (or optional with a default when def >= 0) */
static nb_status get_int(hf_load *L, const cJSON *j, const char *field, int64_t def, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, field);
  if (!v || cJSON_IsNull(v)) {
    if (def >= 0) return *out = def, NB_OK;
    return cfg_err(L, NB_ERR_FORMAT, field, "is missing");
  }
  double d = cJSON_GetNumberValue(v);
  if (!cJSON_IsNumber(v) || !(d >= 1 && d <= 9007199254740992.0) || d != floor(d))
    return cfg_err(L, NB_ERR_FORMAT, field, "must be a positive integer");
  *out = (int64_t)d;
  return NB_OK;
}

static nb_status get_num(hf_load *L, const cJSON *j, const char *field, double def, bool required, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, field);
  if (!v || cJSON_IsNull(v)) {
    if (required) return cfg_err(L, NB_ERR_FORMAT, field, "is missing");
    return *out = def, NB_OK;
  }
  if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) return cfg_err(L, NB_ERR_FORMAT, field, "must be a positive number");
  *out = v->valuedouble;
  return NB_OK;
}

static bool is_id(double d) { return d >= 0 && d < 2147483648.0 && d == floor(d); }

/* a token id or null (-1); for eos also a list */
static nb_status get_ids(hf_load *L, const cJSON *j, const char *field, int32_t *ids, int cap, int *n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, field);
  *n = 0;
  if (!v || cJSON_IsNull(v)) return NB_OK;
  const cJSON *e;
  if (cJSON_IsNumber(v)) {
    if (!is_id(v->valuedouble)) return cfg_err(L, NB_ERR_FORMAT, field, "must be a token id in [0, 2^31)");
    ids[(*n)++] = (int32_t)v->valuedouble;
    return NB_OK;
  }
  if (!cJSON_IsArray(v) || cap == 1) return cfg_err(L, NB_ERR_FORMAT, field, "must be a token id%s", cap > 1 ? " or a list of them" : "");
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsNumber(e) || !is_id(e->valuedouble) || *n == cap)
      return cfg_err(L, NB_ERR_FORMAT, field, "must be a list of at most 8 token ids");
    ids[(*n)++] = (int32_t)e->valuedouble;
  }
  return NB_OK;
}

static nb_status check_arch(hf_load *L, const cJSON *j) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type"), *ar = cJSON_GetObjectItemCaseSensitive(j, "architectures");
  if (!mt && !ar) return cfg_err(L, NB_ERR_FORMAT, "model_type", "is missing (and so is 'architectures')");
  if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama")))
    return cfg_err(L, NB_ERR_UNIMPLEMENTED, "model_type", "is '%s'; only 'llama' is supported",
                   cJSON_IsString(mt) ? mt->valuestring : "?");
  const cJSON *a;
  cJSON_ArrayForEach(a, ar) if (!cJSON_IsString(a) || strcmp(a->valuestring, "LlamaForCausalLM"))
      return cfg_err(L, NB_ERR_UNIMPLEMENTED, "architectures", "names '%s'; only LlamaForCausalLM is supported",
                     cJSON_IsString(a) ? a->valuestring : "?");
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
  if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
    return cfg_err(L, NB_ERR_UNIMPLEMENTED, "hidden_act", "is '%s'; only 'silu' is supported",
                   cJSON_IsString(act) ? act->valuestring : "?");
  const char *biases[] = {"attention_bias", "mlp_bias"};
  for (int i = 0; i < 2; i++)
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, biases[i])))
      return cfg_err(L, NB_ERR_UNIMPLEMENTED, biases[i], "is true; biases are not supported");
  return NB_OK;
}

static nb_status parse_rope(hf_load *L, const cJSON *j, nb_nn_rope_cfg *r) {
  nb_status s = get_num(L, j, "rope_theta", 10000, false, &r->theta);
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
  if (s || !rs || cJSON_IsNull(rs)) return s;
  if (!cJSON_IsObject(rs)) return cfg_err(L, NB_ERR_FORMAT, "rope_scaling", "must be an object or null");
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
  if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
  if (!cJSON_IsString(ty)) return cfg_err(L, NB_ERR_FORMAT, "rope_scaling.rope_type", "is missing");
  const char *t = ty->valuestring;
  if (!strcmp(t, "default")) return NB_OK;
  if (strcmp(t, "linear") && strcmp(t, "llama3"))
    return cfg_err(L, NB_ERR_UNIMPLEMENTED, "rope_scaling.rope_type", "is '%s'; supported: default, linear, llama3", t);
  r->scaling = !strcmp(t, "linear") ? NB_NN_ROPE_LINEAR : NB_NN_ROPE_LLAMA3;
  /* the fields inside rope_scaling, named with their prefix in messages */
  struct {
    const char *name;
    double *dst;
  } f[3] = {{"factor", &r->factor}, {"low_freq_factor", &r->low_freq_factor}, {"high_freq_factor", &r->high_freq_factor}};
  int nf = r->scaling == NB_NN_ROPE_LINEAR ? 1 : 3;
  for (int i = 0; i < nf; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, f[i].name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
      return cfg_err(L, NB_ERR_FORMAT, "rope_scaling", "needs a positive number '%s'", f[i].name);
    *f[i].dst = v->valuedouble;
  }
  if (r->scaling == NB_NN_ROPE_LLAMA3) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings");
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= 9007199254740992.0))
      return cfg_err(L, NB_ERR_FORMAT, "rope_scaling", "needs a positive integer '%s'", "original_max_position_embeddings");
    r->original_max_pos = (int64_t)v->valuedouble;
  }
  return NB_OK;
}

/* a whole file (at most 16 MB; a config or an index) into a new malloc'ed
 * string, or NULL with an error */
static char *read_text(hf_load *L, const char *path, size_t *len) {
  char *buf = NULL;
  int err = nb_util__read_file(path, (size_t)1 << 24, &buf, len);
  if (err == ENOENT) return nb_errorf(L->ctx, NB_ERR_NOT_FOUND, "%s: cannot open", path), NULL;
  if (err == EFBIG) return nb_errorf(L->ctx, NB_ERR_IO, "%s: larger than 16 MB", path), NULL;
  if (err) return nb_errorf(L->ctx, NB_ERR_IO, "%s: cannot read it: %s", path, strerror(err)), NULL;
  return buf;
}

static cJSON *read_json(hf_load *L, const char *path) {
  size_t n;
  char *text = read_text(L, path, &n);
  cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
  free(text);
  if (text && !j) nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: not valid JSON", path);
  return j;
}

/* config.json's text into m->cfg, bos_id, eos_ids */
static nb_status parse_config(hf_load *L, const char *text, size_t len, nb_model_loaded *m) {
  cJSON *j = cJSON_ParseWithLength(text, len);
  if (!j) return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: not valid JSON", L->cfg_path);
  nb_model_config *c = &m->cfg;
  nb_model_config_preset(L->ctx, "llama-tiny", c); /* the family's switches; every size is set below */
  c->init_std = 0.02;
  int64_t head_dim = 0;
  nb_status s = cJSON_IsObject(j) ? check_arch(L, j) : cfg_err(L, NB_ERR_FORMAT, "(top level)", "must be an object");
  if (!s) s = get_int(L, j, "hidden_size", -1, &c->d_model);
  if (!s) s = get_int(L, j, "intermediate_size", -1, &c->d_ff);
  if (!s) s = get_int(L, j, "num_attention_heads", -1, &c->n_heads);
  if (!s) s = get_int(L, j, "num_key_value_heads", c->n_heads, &c->n_kv_heads);
  if (!s) s = get_int(L, j, "num_hidden_layers", -1, &c->n_layers);
  if (!s) s = get_int(L, j, "vocab_size", -1, &c->vocab_size);
  if (!s) s = get_int(L, j, "max_position_embeddings", -1, &c->max_seq_len);
  if (!s) s = get_int(L, j, "head_dim", 0, &head_dim);
  if (!s) s = get_num(L, j, "rms_norm_eps", 0, true, &c->norm_eps);
  if (!s) s = parse_rope(L, j, &c->rope_cfg);
  const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
  if (!s && tie && !cJSON_IsBool(tie)) s = cfg_err(L, NB_ERR_FORMAT, "tie_word_embeddings", "must be true or false");
  c->tie_embeddings = cJSON_IsTrue(tie);
  c->head_dim = head_dim && c->n_heads && head_dim != c->d_model / c->n_heads ? head_dim : 0;
  int n_bos = 0;
  if (!s) s = get_ids(L, j, "bos_token_id", &m->bos_id, 1, &n_bos);
  if (!n_bos) m->bos_id = -1;
  if (!s) s = get_ids(L, j, "eos_token_id", m->eos_ids, 8, &m->n_eos);
  cJSON_Delete(j);
  if (!s && nb_model_config_validate(L->ctx, c)) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_ctx_error(L->ctx));
    s = nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: %s", L->cfg_path, msg);
  }
  return s;
}

/* ---------------------------------------------------------------- weights */

/* Hugging Face tensor name (after "model.layers.<i>." for layers) and whether it
 * is a linear weight to transpose, for each nabla path suffix. */
typedef struct name_map {
  const char *ours, *theirs;
  bool transpose;
} name_map;

static const name_map layer_names[] = {
    {"attn_norm/scale", "input_layernorm.weight", false},
    {"mlp_norm/scale", "post_attention_layernorm.weight", false},
    {"attn/wq/kernel", "self_attn.q_proj.weight", true},
    {"attn/wk/kernel", "self_attn.k_proj.weight", true},
    {"attn/wv/kernel", "self_attn.v_proj.weight", true},
    {"attn/wo/kernel", "self_attn.o_proj.weight", true},
    {"mlp/wi_0/kernel", "mlp.gate_proj.weight", true},
    {"mlp/wi_1/kernel", "mlp.up_proj.weight", true},
    {"mlp/wo/kernel", "mlp.down_proj.weight", true},
};
static const name_map top_names[] = {
    {"embed/embedding", "model.embed_tokens.weight", false},
    {"final_norm/scale", "model.norm.weight", false},
    {"lm_head/kernel", "lm_head.weight", true},
};

/* the nabla path's Hugging Face name; false when it has none */
static bool hf_name(const char *path, char *name, size_t cap, bool *transpose);

bool nb_model_hf_name(const char *path, char *name, size_t cap, bool *transpose) {
  bool t;
  return path && name && hf_name(path, name, cap, transpose ? transpose : &t);
}

static bool hf_name(const char *path, char *name, size_t cap, bool *transpose) {
  for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
    if (!strcmp(path, top_names[i].ours)) {
      snprintf(name, cap, "%s", top_names[i].theirs);
      return *transpose = top_names[i].transpose, true;
    }
  long long l;
  int at = 0;
  if (sscanf(path, "layers/%lld/%n", &l, &at) != 1 || !at) return false;
  for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
    if (!strcmp(path + at, layer_names[i].ours)) {
      snprintf(name, cap, "model.layers.%lld.%s", l, layer_names[i].theirs);
      return *transpose = layer_names[i].transpose, true;
    }
  return false;
}

/* the file holding tensor `name`, for messages */
static const char *file_of(hf_load *L, const char *name) {
  const cJSON *f = L->weight_map ? cJSON_GetObjectItemCaseSensitive(L->weight_map, name) : NULL;
  return cJSON_IsString(f) ? f->valuestring : L->weights;
}

static void shape_str(const nb_shape *s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < s->rank && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)s->dims[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

static nb_status convert_weights(hf_load *L, nb_model_loaded *m, nb_tree *raw) {
  nb_ctx *ctx = L->ctx;
  nb_tree *spec = nb_model_param_spec(ctx, &m->cfg, NB_F32);
  m->params = spec ? nb_tree_create(ctx) : NULL;
  bool *used = m->params ? calloc(nb_tree_size(raw) + 1, 1) : NULL;
  nb_status s = used ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    char name[256];
    bool tr = false;
    if (!hf_name(p, name, sizeof name, &tr)) {
      s = nb_errorf(ctx, NB_ERR_INTERNAL, "hf: no Hugging Face name for parameter '%s'", p);
      break;
    }
    /* the shape Hugging Face stores: linear weights are [out, in] */
    nb_shape want = nb_leaf_get_aval(nb_tree_leaf(spec, i)).shape;
    if (tr) want = nb_shape_make(2, (int64_t[2]){want.dims[1], want.dims[0]});
    int64_t at = nb_tree_find(raw, name);
    char ws[96], hs[96];
    shape_str(&want, ws, sizeof ws);
    if (at < 0) {
      s = nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s/%s: tensor '%s' %s is missing (nabla's '%s')", L->dir, L->weights, name, ws, p);
      break;
    }
    used[at] = true;
    nb_array *x = nb_tree_leaf(raw, (size_t)at)->array;
    nb_aval have = nb_array_aval(x);
    if (!nb_shape_equal(&have.shape, &want) || !nb_dtype_is_float(have.dtype)) {
      s = nb_errorf(ctx, NB_ERR_SHAPE, "%s/%s: tensor '%s' is %s, expected a float tensor of shape %s (from %s)", L->dir,
                    file_of(L, name), name, nb_aval_str(&have, hs, sizeof hs), ws, L->cfg_path);
      break;
    }
    nb_array *f = nb_array_astype(ctx, x, NB_F32), *y = f && tr ? nb_array_transpose2d(ctx, f) : f;
    if (y && y != f) nb_array_release(f);
    s = y ? nb_tree_set_array(m->params, p, y) : NB_ERR_NOMEM;
    nb_array_release(y);
  }
  /* a tensor nothing reads means an architecture we do not implement
   * (biases, extra norms): refuse it rather than compute something else */
  for (size_t i = 0; !s && i < nb_tree_size(raw); i++) {
    const char *name = nb_tree_path(raw, i);
    size_t n = strlen(name);
    bool benign = (n > 20 && !strcmp(name + n - 20, "rotary_emb.inv_freq")) ||
                  (m->cfg.tie_embeddings && !strcmp(name, "lm_head.weight"));
    if (!used[i] && !benign)
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s/%s: tensor '%s' is not part of the Llama architecture nabla implements",
                    L->dir, file_of(L, name), name);
  }
  free(used);
  nb_tree_destroy(spec);
  return s ? (nb_ctx_status(ctx) ? nb_ctx_status(ctx) : s) : NB_OK;
}

static nb_status load_weights(hf_load *L, nb_model_loaded *m) {
  char idx[4200], single[4200];
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", L->dir);
  snprintf(single, sizeof single, "%s/model.safetensors", L->dir);
  cJSON *index = NULL;
  if (access(idx, F_OK) == 0) {
    index = read_json(L, idx);
    if (!index) return nb_ctx_status(L->ctx);
    L->weight_map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(L->weight_map)) {
      cJSON_Delete(index);
      return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: field 'weight_map' is missing or not an object", idx);
    }
    snprintf(L->weights, sizeof L->weights, "model.safetensors.index.json");
  } else if (access(single, F_OK) == 0) {
    snprintf(L->weights, sizeof L->weights, "model.safetensors");
  } else {
    return nb_errorf(L->ctx, NB_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", L->dir);
  }
  nb_tree *raw = nb_ckpt_safetensors_load(L->ctx, index ? idx : single, NULL, NULL);
  nb_status s = raw ? convert_weights(L, m, raw) : nb_ctx_status(L->ctx);
  nb_tree_destroy(raw);
  cJSON_Delete(index);
  L->weight_map = NULL;
  return s;
}

nb_status nb_model__hf_config_parse(nb_ctx *ctx, const char *name, const char *text, size_t len, nb_model_loaded *out) {
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  hf_load L = {.ctx = ctx};
  snprintf(L.cfg_path, sizeof L.cfg_path, "%s", name);
  return parse_config(&L, text, len, out);
}

nb_status nb_model_load_hf(nb_ctx *ctx, const char *dir, nb_model_loaded *out) {
  if (!dir || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "load hf: NULL argument");
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  snprintf(out->what, sizeof out->what, "Hugging Face model %s", dir);
  hf_load L = {.ctx = ctx, .dir = dir};
  snprintf(L.cfg_path, sizeof L.cfg_path, "%s/config.json", dir);
  if (access(dir, F_OK) != 0) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "Hugging Face model dir '%s' does not exist", dir);
  if (access(L.cfg_path, F_OK) != 0) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: missing (a Hugging Face model needs config.json)", L.cfg_path);
  size_t n = 0;
  char *text = read_text(&L, L.cfg_path, &n);
  nb_status s = text ? parse_config(&L, text, n, out) : nb_ctx_status(ctx);
  free(text);
  if (!s) s = load_weights(&L, out);
  char tj[4200];
  snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
  if (!s && access(tj, F_OK) == 0 && !(out->tok = nb_tok_load_hf(ctx, tj))) s = nb_ctx_status(ctx);
  if (!s && out->n_eos == 0) nb_model__tok_stops(out);
  if (s) nb_model_loaded_free(out);
  return s;
}
