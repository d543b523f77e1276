/* Hugging Face model folders in and out: config.json <-> a model config,
 * safetensors (one file or an index of shards) <-> nabla's parameter tree,
 * for the GPT-2, Llama, Mistral and Qwen2 architectures. One table (below,
 * "names and layouts") says, for every nabla parameter path, the Hugging Face
 * tensor name and how the layouts differ: PyTorch's nn.Linear weights are
 * [out, in] (nabla's kernels [in, out]), GPT-2's Conv1D weights are already
 * [in, out] with q, k, v fused into c_attn. Both directions read it. Other
 * architectures and options (other activations, RoPE scalings, biases
 * nabla has no place for) are refused by name rather than loaded wrongly.
 * nabla's rotary embedding rotates halves like Hugging Face's rotate_half,
 * so q/k rows need no permutation (GGUF's do: gguf.c). */
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

typedef enum hf_arch { HF_LLAMA, HF_MISTRAL, HF_QWEN2, HF_GPT2, HF_ARCH_COUNT } hf_arch;
static const struct {
  const char *model_type, *class_name;
} arch_names[HF_ARCH_COUNT] = {{"llama", "LlamaForCausalLM"},
                               {"mistral", "MistralForCausalLM"},
                               {"qwen2", "Qwen2ForCausalLM"},
                               {"gpt2", "GPT2LMHeadModel"}};

typedef struct hf_load {
  nb_ctx *ctx;
  hf_arch arch;
  const char *prefix;  /* of GPT-2's tensor names: "transformer." (save_pretrained) or "" (the original files) */
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

static const char *str_or(const cJSON *v, const char *def) { return cJSON_IsString(v) ? v->valuestring : def; }

/* model_type and architectures into L->arch; the switches every
 * architecture has but nabla does not implement are refused by name */
static nb_status check_arch(hf_load *L, const cJSON *j) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type"), *ar = cJSON_GetObjectItemCaseSensitive(j, "architectures");
  const char *list = "llama, mistral, qwen2, gpt2";
  if (!mt && !ar) return cfg_err(L, NB_ERR_FORMAT, "model_type", "is missing (and so is 'architectures')");
  int arch = -1;
  for (int a = 0; a < HF_ARCH_COUNT && mt; a++)
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, arch_names[a].model_type)) arch = a;
  if (mt && arch < 0)
    return cfg_err(L, NB_ERR_UNIMPLEMENTED, "model_type", "is '%s'; supported: %s", str_or(mt, "?"), list);
  const cJSON *a;
  cJSON_ArrayForEach(a, ar) {
    int k = -1;
    for (int b = 0; b < HF_ARCH_COUNT; b++)
      if (cJSON_IsString(a) && !strcmp(a->valuestring, arch_names[b].class_name)) k = b;
    if (k < 0 || (arch >= 0 && k != arch))
      return cfg_err(L, NB_ERR_UNIMPLEMENTED, "architectures", "names '%s'; supported: %s%s", str_or(a, "?"),
                     arch >= 0 ? arch_names[arch].class_name : "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel",
                     arch >= 0 ? " (model_type says so)" : "");
    arch = k;
  }
  if (arch < 0) return cfg_err(L, NB_ERR_FORMAT, "architectures", "names no architecture");
  L->arch = (hf_arch)arch;
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, L->arch == HF_GPT2 ? "activation_function" : "hidden_act");
  const char *want = L->arch == HF_GPT2 ? "gelu_new" : "silu";
  if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, want) &&
                                       !(L->arch == HF_GPT2 && !strcmp(act->valuestring, "gelu_pytorch_tanh")))))
    return cfg_err(L, NB_ERR_UNIMPLEMENTED, L->arch == HF_GPT2 ? "activation_function" : "hidden_act",
                   "is '%s'; only '%s' is supported", str_or(act, "?"), want);
  if (L->arch == HF_LLAMA) {
    const char *biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++)
      if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, biases[i])))
        return cfg_err(L, NB_ERR_UNIMPLEMENTED, biases[i], "is true; biases are not supported");
  }
  if (L->arch == HF_GPT2) {
    /* GPT-2's options that change what the attention computes */
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "scale_attn_weights");
    if (cJSON_IsFalse(sc)) return cfg_err(L, NB_ERR_UNIMPLEMENTED, "scale_attn_weights", "is false; nabla scales by 1/sqrt(head_dim)");
    const char *off[] = {"scale_attn_by_inverse_layer_idx", "add_cross_attention"};
    for (int i = 0; i < 2; i++)
      if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, off[i])))
        return cfg_err(L, NB_ERR_UNIMPLEMENTED, off[i], "is true; not supported");
  }
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

/* Mistral's and Qwen2's attention window (0: none) into m->sliding_window */
static nb_status parse_window(hf_load *L, const cJSON *j, nb_model_loaded *m) {
  if (L->arch == HF_QWEN2 && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window"))) return NB_OK;
  if (L->arch != HF_QWEN2 && L->arch != HF_MISTRAL) return NB_OK;
  int64_t w = 0;
  nb_status s = get_int(L, j, "sliding_window", 0, &w);
  if (!s && w && w < m->cfg.max_seq_len) {
    m->sliding_window = w;
    nb_logf(L->ctx, NB_LOG_WARN, "%s: sliding_window %lld is shorter than the context (%lld): nabla attends to every "
            "earlier position, so past %lld tokens it computes another model than this one", L->cfg_path, (long long)w,
            (long long)m->cfg.max_seq_len, (long long)w);
  }
  return s;
}

static nb_status parse_gpt2(hf_load *L, const cJSON *j, nb_model_config *c) {
  nb_model_config_preset(L->ctx, "gpt2-tiny", c); /* the family's switches; every size is set below */
  nb_status s = get_int(L, j, "n_embd", -1, &c->d_model);
  if (!s) s = get_int(L, j, "n_layer", -1, &c->n_layers);
  if (!s) s = get_int(L, j, "n_head", -1, &c->n_heads);
  if (!s) s = get_int(L, j, "vocab_size", -1, &c->vocab_size);
  if (!s) s = get_int(L, j, "n_positions", -1, &c->max_seq_len);
  if (!s) s = get_int(L, j, "n_inner", 4 * c->d_model, &c->d_ff);
  if (!s) s = get_num(L, j, "layer_norm_epsilon", 1e-5, false, &c->norm_eps);
  c->n_kv_heads = c->n_heads;
  const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
  if (!s && tie && !cJSON_IsBool(tie)) s = cfg_err(L, NB_ERR_FORMAT, "tie_word_embeddings", "must be true or false");
  c->tie_embeddings = !cJSON_IsFalse(tie); /* GPT-2's default: tied */
  return s;
}

static nb_status parse_llama(hf_load *L, const cJSON *j, nb_model_config *c) {
  nb_model_config_preset(L->ctx, "llama-tiny", c); /* the family's switches; every size is set below */
  int64_t head_dim = 0;
  nb_status s = get_int(L, j, "hidden_size", -1, &c->d_model);
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
  c->qkv_bias = L->arch == HF_QWEN2;
  return s;
}

/* config.json's text into m->cfg, bos_id, eos_ids, sliding_window */
static nb_status parse_config(hf_load *L, const char *text, size_t len, nb_model_loaded *m) {
  cJSON *j = cJSON_ParseWithLength(text, len);
  if (!j) return nb_errorf(L->ctx, NB_ERR_FORMAT, "%s: not valid JSON", L->cfg_path);
  nb_model_config *c = &m->cfg;
  nb_status s = cJSON_IsObject(j) ? check_arch(L, j) : cfg_err(L, NB_ERR_FORMAT, "(top level)", "must be an object");
  if (!s) s = L->arch == HF_GPT2 ? parse_gpt2(L, j, c) : parse_llama(L, j, c);
  c->init_std = 0.02;
  c->scaled_init = false;
  if (!s) s = parse_window(L, j, m);
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

/* ---------------------------------------------------------------- names and layouts */

/* How a Hugging Face tensor holds a nabla parameter:
 *   AS_IS   the same array (norms, embeddings, biases, GPT-2's Conv1D weights, already [in, out]);
 *   LINEAR  nn.Linear's [out, in], the transpose of nabla's [in, out] kernel;
 *   FUSED   GPT-2's c_attn: q, k, v concatenated on the last axis (part 0, 1, 2). */
typedef enum hf_layout { AS_IS, LINEAR, FUSED } hf_layout;

typedef struct hf_entry {
  const char *ours, *theirs; /* a nabla path suffix; the Hugging Face name after the layer's prefix */
  hf_layout layout;
  int part;                  /* FUSED: which third */
} hf_entry;

/* Llama, Mistral and Qwen2 (biases on q, k, v: in the table, read only when the config has them) */
static const hf_entry llama_layer[] = {
    {"attn_norm/scale", "input_layernorm.weight", AS_IS, 0},
    {"mlp_norm/scale", "post_attention_layernorm.weight", AS_IS, 0},
    {"attn/wq/kernel", "self_attn.q_proj.weight", LINEAR, 0},
    {"attn/wk/kernel", "self_attn.k_proj.weight", LINEAR, 0},
    {"attn/wv/kernel", "self_attn.v_proj.weight", LINEAR, 0},
    {"attn/wq/bias", "self_attn.q_proj.bias", AS_IS, 0},
    {"attn/wk/bias", "self_attn.k_proj.bias", AS_IS, 0},
    {"attn/wv/bias", "self_attn.v_proj.bias", AS_IS, 0},
    {"attn/wo/kernel", "self_attn.o_proj.weight", LINEAR, 0},
    {"mlp/wi_0/kernel", "mlp.gate_proj.weight", LINEAR, 0},
    {"mlp/wi_1/kernel", "mlp.up_proj.weight", LINEAR, 0},
    {"mlp/wo/kernel", "mlp.down_proj.weight", LINEAR, 0},
    {NULL, NULL, AS_IS, 0}};
static const hf_entry llama_top[] = {
    {"embed/embedding", "model.embed_tokens.weight", AS_IS, 0},
    {"final_norm/scale", "model.norm.weight", AS_IS, 0},
    {"lm_head/kernel", "lm_head.weight", LINEAR, 0},
    {NULL, NULL, AS_IS, 0}};
static const hf_entry gpt2_layer[] = {
    {"attn_norm/scale", "ln_1.weight", AS_IS, 0},       {"attn_norm/bias", "ln_1.bias", AS_IS, 0},
    {"attn/wq/kernel", "attn.c_attn.weight", FUSED, 0}, {"attn/wk/kernel", "attn.c_attn.weight", FUSED, 1},
    {"attn/wv/kernel", "attn.c_attn.weight", FUSED, 2}, {"attn/wq/bias", "attn.c_attn.bias", FUSED, 0},
    {"attn/wk/bias", "attn.c_attn.bias", FUSED, 1},     {"attn/wv/bias", "attn.c_attn.bias", FUSED, 2},
    {"attn/wo/kernel", "attn.c_proj.weight", AS_IS, 0}, {"attn/wo/bias", "attn.c_proj.bias", AS_IS, 0},
    {"mlp_norm/scale", "ln_2.weight", AS_IS, 0},        {"mlp_norm/bias", "ln_2.bias", AS_IS, 0},
    {"mlp/wi/kernel", "mlp.c_fc.weight", AS_IS, 0},     {"mlp/wi/bias", "mlp.c_fc.bias", AS_IS, 0},
    {"mlp/wo/kernel", "mlp.c_proj.weight", AS_IS, 0},   {"mlp/wo/bias", "mlp.c_proj.bias", AS_IS, 0},
    {NULL, NULL, AS_IS, 0}};
static const hf_entry gpt2_top[] = {
    {"embed/embedding", "wte.weight", AS_IS, 0},      {"pos_embed/embedding", "wpe.weight", AS_IS, 0},
    {"final_norm/scale", "ln_f.weight", AS_IS, 0},    {"final_norm/bias", "ln_f.bias", AS_IS, 0},
    {"lm_head/kernel", "lm_head.weight", LINEAR, 0},  {NULL, NULL, AS_IS, 0}};

/* The Hugging Face name of nabla's `path` and its entry; false when it has none. */
static bool hf_name(hf_arch arch, const char *prefix, const char *path, char *name, size_t cap, const hf_entry **out) {
  bool gpt2 = arch == HF_GPT2;
  const hf_entry *top = gpt2 ? gpt2_top : llama_top, *layer = gpt2 ? gpt2_layer : llama_layer;
  for (const hf_entry *e = top; e->ours; e++)
    if (!strcmp(path, e->ours)) {
      /* GPT-2's lm_head sits outside "transformer." */
      snprintf(name, cap, "%s%s", gpt2 && strcmp(e->ours, "lm_head/kernel") ? prefix : "", e->theirs);
      return *out = e, true;
    }
  long long l;
  int at = 0;
  if (sscanf(path, "layers/%lld/%n", &l, &at) != 1 || !at) return false;
  for (const hf_entry *e = layer; e->ours; e++)
    if (!strcmp(path + at, e->ours)) {
      if (gpt2) snprintf(name, cap, "%sh.%lld.%s", prefix, l, e->theirs);
      else snprintf(name, cap, "model.layers.%lld.%s", l, e->theirs);
      return *out = e, true;
    }
  return false;
}

bool nb_model_hf_name(const char *path, char *name, size_t cap, bool *transpose) {
  const hf_entry *e;
  if (!path || !name || !hf_name(HF_LLAMA, "", path, name, cap, &e)) return false;
  if (transpose) *transpose = e->layout == LINEAR;
  return true;
}

bool nb_model_hf_name_for(const nb_model_config *cfg, const char *path, char *name, size_t cap, bool *transpose,
                          int *fused_part) {
  const hf_entry *e;
  bool gpt2 = cfg && cfg->family == NB_MODEL_GPT2;
  if (!path || !name || !hf_name(gpt2 ? HF_GPT2 : HF_LLAMA, gpt2 ? "transformer." : "", path, name, cap, &e)) return false;
  if (transpose) *transpose = e->layout == LINEAR;
  if (fused_part) *fused_part = e->layout == FUSED ? e->part : -1;
  return true;
}

/* The Hugging Face shape of a parameter of shape `ours` */
static nb_shape hf_shape(const hf_entry *e, nb_shape ours) {
  if (e->layout == LINEAR) return nb_shape_make(2, (int64_t[2]){ours.dims[1], ours.dims[0]});
  if (e->layout == FUSED) ours.dims[ours.rank - 1] *= 3;
  return ours;
}

/* Part `part` of `parts` equal slices of x's last axis (a new host array) */
static nb_array *last_axis_part(nb_ctx *ctx, nb_array *x, int part, int parts) {
  nb_aval av = nb_array_aval(x);
  int64_t cols = av.shape.dims[av.shape.rank - 1], n = cols / parts, rows = nb_shape_size(&av.shape) / cols;
  nb_shape sh = av.shape;
  sh.dims[sh.rank - 1] = n;
  size_t es = nb_dtype_size(av.dtype);
  nb_array *y = nb_array_empty(ctx, av.dtype, sh.rank, sh.dims);
  if (!y) return NULL;
  const char *src = nb_array_data(x);
  char *dst = nb_array_data_mut(y);
  for (int64_t r = 0; r < rows; r++) memcpy(dst + (size_t)(r * n) * es, src + (size_t)(r * cols + part * n) * es, (size_t)n * es);
  return y;
}

/* parts[0..3) (same shape) concatenated on the last axis */
static nb_array *last_axis_concat(nb_ctx *ctx, nb_array *const parts[3]) {
  nb_aval av = nb_array_aval(parts[0]);
  int64_t n = av.shape.dims[av.shape.rank - 1], rows = nb_shape_size(&av.shape) / (n ? n : 1);
  nb_shape sh = av.shape;
  sh.dims[sh.rank - 1] = 3 * n;
  size_t es = nb_dtype_size(av.dtype);
  nb_array *y = nb_array_empty(ctx, av.dtype, sh.rank, sh.dims);
  if (!y) return NULL;
  char *dst = nb_array_data_mut(y);
  for (int k = 0; k < 3; k++) {
    const char *src = nb_array_data(parts[k]);
    for (int64_t r = 0; r < rows; r++) memcpy(dst + (size_t)(r * 3 * n + k * n) * es, src + (size_t)(r * n) * es, (size_t)n * es);
  }
  return y;
}

/* ---------------------------------------------------------------- import */

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

/* tensors nothing reads that are not weights: RoPE's cached frequencies,
 * GPT-2's causal-mask buffers, a tied lm_head saved beside the embedding */
static bool benign(hf_load *L, const nb_model_config *c, const char *name) {
  size_t n = strlen(name);
  bool ends_rotary = n >= 19 && !strcmp(name + n - 19, "rotary_emb.inv_freq");
  bool mask = L->arch == HF_GPT2 && ((n >= 10 && !strcmp(name + n - 10, ".attn.bias")) ||
                                     (n >= 17 && !strcmp(name + n - 17, ".attn.masked_bias")));
  return ends_rotary || mask || (c->tie_embeddings && !strcmp(name, "lm_head.weight"));
}

static nb_status convert_weights(hf_load *L, nb_model_loaded *m, nb_tree *raw) {
  nb_ctx *ctx = L->ctx;
  if (L->arch == HF_GPT2) /* save_pretrained's names, or the original GPT-2 files' */
    L->prefix = nb_tree_find(raw, "transformer.wte.weight") >= 0 || nb_tree_find(raw, "wte.weight") < 0 ? "transformer." : "";
  nb_tree *spec = nb_model_param_spec(ctx, &m->cfg, NB_F32);
  m->params = spec ? nb_tree_create(ctx) : NULL;
  bool *used = m->params ? calloc(nb_tree_size(raw) + 1, 1) : NULL;
  nb_status s = used ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    char name[256];
    const hf_entry *e = NULL;
    if (!hf_name(L->arch, L->prefix, p, name, sizeof name, &e)) {
      s = nb_errorf(ctx, NB_ERR_INTERNAL, "hf: no Hugging Face name for parameter '%s'", p);
      break;
    }
    nb_shape want = hf_shape(e, nb_leaf_get_aval(nb_tree_leaf(spec, i)).shape);
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
    nb_array *f = nb_array_astype(ctx, x, NB_F32), *y = f;
    if (f && e->layout == LINEAR) y = nb_array_transpose2d(ctx, f);
    if (f && e->layout == FUSED) y = last_axis_part(ctx, f, e->part, 3);
    if (y && y != f) nb_array_release(f);
    s = y ? nb_tree_set_array(m->params, p, y) : NB_ERR_NOMEM;
    nb_array_release(y);
  }
  /* a tensor nothing reads means an architecture we do not implement
   * (biases, extra norms): refuse it rather than compute something else */
  for (size_t i = 0; !s && i < nb_tree_size(raw); i++) {
    const char *name = nb_tree_path(raw, i);
    if (!used[i] && !benign(L, &m->cfg, name))
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s/%s: tensor '%s' is not part of the %s architecture nabla implements",
                    L->dir, file_of(L, name), name, arch_names[L->arch].class_name);
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

static nb_status load_hf(nb_ctx *ctx, const char *dir, bool weights, nb_model_loaded *out) {
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
  if (!s && weights) s = load_weights(&L, out);
  char tj[4200];
  snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
  if (!s && weights && access(tj, F_OK) == 0 && !(out->tok = nb_tok_load_hf(ctx, tj))) s = nb_ctx_status(ctx);
  if (!s && out->n_eos == 0) nb_model__tok_stops(out);
  if (s) nb_model_loaded_free(out);
  return s;
}

nb_status nb_model_load_hf(nb_ctx *ctx, const char *dir, nb_model_loaded *out) { return load_hf(ctx, dir, true, out); }
nb_status nb_model_load_hf_config(nb_ctx *ctx, const char *dir, nb_model_loaded *out) { return load_hf(ctx, dir, false, out); }

/* ---------------------------------------------------------------- export */

static nb_status not_arch(nb_ctx *ctx, hf_arch a, const char *key, const char *why) {
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "hf export: %s %s (the %s architecture)", key, why, arch_names[a].class_name);
}

/* The architecture a nabla model is written as: opts' (when given), else
 * GPT-2 for the gpt2 family, Qwen2 with q/k/v biases, Llama otherwise. A
 * model that architecture does not compute is refused naming the key. */
static nb_status export_arch(nb_ctx *ctx, const nb_model_config *c, const char *name, hf_arch *out) {
  hf_arch a = c->family == NB_MODEL_GPT2 ? HF_GPT2 : c->qkv_bias ? HF_QWEN2 : HF_LLAMA;
  if (name && name[0]) {
    int k = -1;
    for (int b = 0; b < HF_ARCH_COUNT; b++)
      if (!strcmp(name, arch_names[b].model_type)) k = b;
    if (k < 0) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "hf export: arch '%s' is not one of llama, mistral, qwen2, gpt2", name);
    a = (hf_arch)k;
  }
  *out = a;
  if (c->n_experts) return not_arch(ctx, a, "model.n_experts", "is not 0: mixtures of experts are not written");
  if (a == HF_GPT2) {
    if (c->family != NB_MODEL_GPT2) return not_arch(ctx, a, "model.family", "is not gpt2");
    if (c->norm != NB_NN_LAYERNORM || !c->bias) return not_arch(ctx, a, "model.norm / model.bias", "must be layernorm with biases");
    if (c->act != NB_NN_GELU_TANH || c->gated_mlp) return not_arch(ctx, a, "model.act / model.gated_mlp", "must be gelu_tanh, not gated");
    if (!c->learned_pos || c->rope) return not_arch(ctx, a, "model.learned_pos / model.rope", "must be true / false");
    if (c->n_kv_heads != c->n_heads || nb_model_head_dim(c) * c->n_heads != c->d_model)
      return not_arch(ctx, a, "model.n_kv_heads / model.head_dim", "must be n_heads / d_model / n_heads");
    return NB_OK;
  }
  if (c->family != NB_MODEL_LLAMA) return not_arch(ctx, a, "model.family", "is not llama");
  if (c->norm != NB_NN_RMSNORM) return not_arch(ctx, a, "model.norm", "is not rmsnorm");
  if (c->bias) return not_arch(ctx, a, "model.bias", "is true");
  if (c->act != NB_NN_SILU || !c->gated_mlp) return not_arch(ctx, a, "model.act / model.gated_mlp", "must be silu, gated");
  if (!c->rope || c->rope_cfg.interleaved || c->learned_pos)
    return not_arch(ctx, a, "model.rope / rope_interleaved / learned_pos", "must be true / false / false");
  if (c->qkv_bias != (a == HF_QWEN2))
    return not_arch(ctx, a, "model.qkv_bias", a == HF_QWEN2 ? "is false; Qwen2 has q/k/v biases" : "is true (write it as qwen2)");
  return NB_OK;
}

static void add_ids(cJSON *j, const nb_model_loaded *m) {
  if (m->bos_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", m->bos_id);
  if (m->n_eos == 1) cJSON_AddNumberToObject(j, "eos_token_id", m->eos_ids[0]);
  if (m->n_eos > 1) cJSON_AddItemToObject(j, "eos_token_id", cJSON_CreateIntArray(m->eos_ids, m->n_eos));
}

/* config.json of model m as architecture a */
static cJSON *export_config(const nb_model_loaded *m, hf_arch a, nb_dtype dtype) {
  const nb_model_config *c = &m->cfg;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray((const char *[]){arch_names[a].class_name}, 1));
  cJSON_AddStringToObject(j, "model_type", arch_names[a].model_type);
  if (a == HF_GPT2) {
    cJSON_AddNumberToObject(j, "n_embd", (double)c->d_model);
    cJSON_AddNumberToObject(j, "n_layer", (double)c->n_layers);
    cJSON_AddNumberToObject(j, "n_head", (double)c->n_heads);
    cJSON_AddNumberToObject(j, "n_inner", (double)c->d_ff);
    cJSON_AddNumberToObject(j, "n_positions", (double)c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", (double)c->max_seq_len);
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", c->norm_eps);
    const char *zero[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    for (int i = 0; i < 3; i++) cJSON_AddNumberToObject(j, zero[i], 0);
    cJSON_AddTrueToObject(j, "scale_attn_weights");
  } else {
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->d_model);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->d_ff);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->n_kv_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->n_layers);
    cJSON_AddNumberToObject(j, "head_dim", (double)nb_model_head_dim(c));
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_seq_len);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_cfg.theta);
    const nb_nn_rope_cfg *r = &c->rope_cfg;
    if (r->scaling == NB_NN_ROPE_NONE) {
      cJSON_AddNullToObject(j, "rope_scaling");
    } else {
      cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
      cJSON_AddStringToObject(rs, "rope_type", r->scaling == NB_NN_ROPE_LINEAR ? "linear" : "llama3");
      cJSON_AddNumberToObject(rs, "factor", r->factor);
      if (r->scaling == NB_NN_ROPE_LLAMA3) {
        cJSON_AddNumberToObject(rs, "low_freq_factor", r->low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", r->high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", (double)r->original_max_pos);
      }
    }
    cJSON_AddNumberToObject(j, "attention_dropout", 0);
    if (a == HF_LLAMA) cJSON_AddFalseToObject(j, "attention_bias"), cJSON_AddFalseToObject(j, "mlp_bias");
    if (a == HF_MISTRAL) cJSON_AddNullToObject(j, "sliding_window");
    if (a == HF_QWEN2) {
      cJSON_AddFalseToObject(j, "use_sliding_window");
      cJSON_AddNumberToObject(j, "sliding_window", (double)c->max_seq_len);
      cJSON_AddNumberToObject(j, "max_window_layers", (double)c->n_layers);
    }
  }
  cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
  cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
  cJSON_AddNumberToObject(j, "initializer_range", 0.02);
  cJSON_AddTrueToObject(j, "use_cache");
  cJSON_AddStringToObject(j, "torch_dtype", dtype == NB_BF16 ? "bfloat16" : dtype == NB_F16 ? "float16" : "float32");
  add_ids(j, m);
  return j;
}

/* nabla's parameters as Hugging Face tensors of dtype t (a new tree) */
static nb_tree *export_tensors(nb_ctx *ctx, const nb_model_loaded *m, hf_arch a, nb_dtype t) {
  nb_tree *spec = nb_model_param_spec(ctx, &m->cfg, NB_F32), *out = spec ? nb_tree_create(ctx) : NULL;
  nb_status s = out ? NB_OK : nb_ctx_status(ctx);
  const char *prefix = a == HF_GPT2 ? "transformer." : "";
  for (size_t i = 0; !s && i < nb_tree_size(spec); i++) {
    const char *p = nb_tree_path(spec, i);
    char name[256];
    const hf_entry *e = NULL;
    if (!hf_name(a, prefix, p, name, sizeof name, &e)) {
      s = nb_errorf(ctx, NB_ERR_INTERNAL, "hf export: no Hugging Face name for parameter '%s'", p);
      break;
    }
    if (e->layout == FUSED && e->part) continue; /* written with part 0 */
    nb_array *parts[3] = {NULL, NULL, NULL}, *y = NULL;
    int n = e->layout == FUSED ? 3 : 1;
    for (int k = 0; k < n && !s; k++) {
      char q[NB_NN_PATH_MAX];
      const char *path = p;
      if (e->layout == FUSED) { /* the entry of the same tensor's part k, in the same layer */
        const hf_entry *f = gpt2_layer;
        while (f->ours && !(!strcmp(f->theirs, e->theirs) && f->part == k)) f++;
        snprintf(q, sizeof q, "%.*s%s", (int)(strstr(p, e->ours) - p), p, f->ours);
        path = q;
      }
      nb_array *x = nb_tree_get_array(m->params, path);
      nb_aval want = nb_leaf_get_aval(nb_tree_leaf(spec, i)), have = x ? nb_array_aval(x) : want;
      char hs[96], ws[96];
      if (!x || !nb_shape_equal(&have.shape, &want.shape) || !nb_dtype_is_float(have.dtype))
        s = nb_errorf(ctx, NB_ERR_SHAPE, "hf export: parameter '%s' is %s, the model config wants %s", path,
                      x ? nb_aval_str(&have, hs, sizeof hs) : "missing", nb_aval_str(&want, ws, sizeof ws));
      else if (!(parts[k] = nb_array_astype(ctx, x, t)))
        s = nb_ctx_status(ctx);
    }
    if (!s) y = e->layout == LINEAR ? nb_array_transpose2d(ctx, parts[0])
              : e->layout == FUSED  ? last_axis_concat(ctx, parts)
                                    : (nb_array_retain(parts[0]), parts[0]);
    for (int k = 0; k < n; k++) nb_array_release(parts[k]);
    if (!s) s = y ? nb_tree_set_array(out, name, y) : nb_ctx_status(ctx);
    nb_array_release(y);
  }
  nb_tree_destroy(spec);
  if (s) nb_tree_destroy(out);
  return s ? NULL : out;
}

static nb_status write_json(nb_ctx *ctx, const char *path, const cJSON *j) {
  char *text = cJSON_Print(j);
  FILE *f = text ? fopen(path, "w") : NULL;
  bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f)) ok = false;
  free(text);
  return ok ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "hf export: cannot write %s: %s", path, strerror(errno));
}

nb_status nb_model_save_hf(nb_ctx *ctx, const nb_model_loaded *m, const char *dir, const nb_model_hf_opts *opts) {
  static const nb_model_hf_opts defaults;
  const nb_model_hf_opts *o = opts ? opts : &defaults;
  if (!m || !m->params || !dir) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "hf export: NULL model or directory");
  nb_dtype t = o->dtype ? o->dtype : NB_F32;
  if (t != NB_F32 && t != NB_BF16 && t != NB_F16)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "hf export: dtype %s is not f32, bf16 or f16", nb_dtype_name(t));
  hf_arch a = HF_LLAMA;
  nb_status s = export_arch(ctx, &m->cfg, o->arch, &a);
  if (s) return s;
  char failed[4200], path[4200];
  int err = nb_util__mkdir_p(dir, 0777, NULL, failed, sizeof failed);
  if (err) return nb_errorf(ctx, NB_ERR_IO, "hf export: mkdir %s: %s", failed, strerror(err));
  nb_tree *w = export_tensors(ctx, m, a, t);
  if (!w) return nb_ctx_status(ctx);
  size_t total = 0;
  for (size_t i = 0; i < nb_tree_size(w); i++) total += nb_array_nbytes(nb_tree_leaf(w, i)->array);
  size_t limit = o->shard_bytes ? o->shard_bytes : (size_t)5000000000u; /* save_pretrained's default, 5 GB */
  const char *meta = "{\"format\":\"pt\"}"; /* transformers reads only files that say so */
  /* one layout or the other: a stale file of the other would be read instead */
  snprintf(path, sizeof path, "%s/%s", dir, total > limit ? "model.safetensors" : "model.safetensors.index.json");
  unlink(path);
  if (total > limit) {
    s = nb_ckpt_safetensors_save_sharded(ctx, dir, "model", w, meta, limit, NULL);
  } else {
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    s = nb_ckpt_safetensors_save(ctx, path, w, meta, NULL);
  }
  nb_tree_destroy(w);
  cJSON *j = s ? NULL : export_config(m, a, t);
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (j) s = write_json(ctx, path, j);
  cJSON_Delete(j);
  return s;
}
