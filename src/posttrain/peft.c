/* LoRA adapters in PEFT's format (adapter_config.json +
 * adapter_model.safetensors), so a nabla adapter loads onto a Hugging Face
 * model with `peft` and a PEFT adapter runs on nabla.
 *
 * Module names come from the models' Hugging Face table
 * (nb_model_hf_name_for). One module there may hold several of nabla's
 * linears: GPT-2's c_attn computes q, k and v side by side ("fused"). Its
 * one LoRA stands for nabla's per-projection adapters by rank stacking: the
 * k adapted projections' A side by side and a block-structured B, rank k r,
 * alpha scaled so that alpha / rank stays nabla's scale (the rule in
 * docs/posttrain.md, "GPT-2"). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nabla/ckpt.h"
#include "nabla/posttrain.h"

#define NAME_MAX_ (NB_NN_PATH_MAX + 128)

/* The Hugging Face module of nabla's linear `module` ("layers/0/attn/wq" ->
 * "model.layers.0.self_attn.q_proj"; GPT-2: "transformer.h.0.attn.c_attn",
 * *part 0); *conv1d: stored [in, out] (GPT-2's Conv1D, fan_in_fan_out). */
static bool hf_module(const nb_model_config *cfg, const char *module, char *out, size_t cap, int *part, bool *conv1d) {
  char path[NB_NN_PATH_MAX + 16], name[NAME_MAX_];
  bool transpose;
  size_t n;
  if (snprintf(path, sizeof path, "%s/kernel", module) >= (int)sizeof path ||
      !nb_model_hf_name_for(cfg, path, name, sizeof name, &transpose, part) || (n = strlen(name)) < 8 ||
      strcmp(name + n - 7, ".weight"))
    return false;
  snprintf(out, cap, "%.*s", (int)(n - 7), name);
  if (conv1d) *conv1d = !transpose;
  return true;
}

static bool gpt2(const nb_model_config *cfg) { return cfg && cfg->family == NB_MODEL_GPT2; }

/* "module/lora_a" -> module and which (0: A, 1: B) */
static bool split(const char *path, char *module, size_t cap, int *which) {
  size_t n = strlen(path);
  if (n < 8 || (strcmp(path + n - 7, "/lora_a") && strcmp(path + n - 7, "/lora_b"))) return false;
  *which = path[n - 1] == 'b';
  snprintf(module, cap, "%.*s", (int)(n - 7), path);
  return true;
}

/* regex metacharacters of a module name escaped ('.' only, in these names) */
static void add_escaped(char *buf, size_t cap, size_t *at, const char *s) {
  for (; *s && *at + 3 < cap; s++) {
    if (*s == '.') buf[(*at)++] = '\\';
    buf[(*at)++] = *s;
  }
  buf[*at] = 0;
}

/* x (rank 2, any float dtype) transposed, as f32 */
static nb_array *f32_transposed(nb_ctx *ctx, nb_array *x) {
  nb_array *f = nb_array_astype(ctx, x, NB_F32), *t = f ? nb_array_transpose2d(ctx, f) : NULL;
  nb_array_release(f);
  return t;
}

/* PEFT's alpha for a module whose rank is k times nabla's r, keeping alpha / rank
 * (rsLoRA: alpha / sqrt(rank)) */
static double stacked_alpha(const nb_pt_lora_config *c, int k) { return c->alpha * (c->rslora ? sqrt((double)k) : (double)k); }

/* ---------------------------------------------------------------- save */

/* One adapted linear of nabla's, named for PEFT. */
typedef struct entry {
  char module[NB_NN_PATH_MAX + 16], hf[NAME_MAX_];
  int part;        /* of a fused module (q, k, v: 0, 1, 2), else -1 */
  bool conv1d;
  nb_array *a, *b; /* borrowed: [d_in, r], [r, d_out] */
} entry;

/* The adapters' linears, in the tree's order; errors name the path. */
static nb_status collect(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *adapters, entry **out, int64_t *n_out) {
  size_t n = nb_tree_size(adapters);
  entry *e = calloc(n + 1, sizeof *e);
  int64_t k = 0;
  if (!e) return nb_errorf(ctx, NB_ERR_NOMEM, "peft save: out of memory");
  for (size_t i = 0; i < n; i++) {
    const char *p = nb_tree_path(adapters, i);
    char module[NB_NN_PATH_MAX + 16], pb[NB_NN_PATH_MAX + 32];
    int which;
    nb_array *a = nb_tree_get_array(adapters, p);
    if (!split(p, module, sizeof module, &which) || !a || nb_array_rank(a) != 2) {
      free(e);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft save: '%s' is no adapter array (<module>/lora_a or lora_b, rank 2)", p);
    }
    if (which) continue; /* with its lora_a */
    entry *x = &e[k];
    snprintf(x->module, sizeof x->module, "%s", module);
    if (!hf_module(cfg, module, x->hf, sizeof x->hf, &x->part, &x->conv1d)) {
      free(e);
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "peft save: '%s' has no Hugging Face module name (%s names)", module,
                       gpt2(cfg) ? "GPT-2" : "Llama-architecture");
    }
    snprintf(pb, sizeof pb, "%s/lora_b", module);
    x->a = a, x->b = nb_tree_get_array(adapters, pb);
    if (!x->b || nb_array_rank(x->b) != 2 || nb_array_dims(x->b)[0] != nb_array_dims(a)[1]) {
      free(e);
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft save: '%s' wants a lora_b [%lld, d_out] beside it", p,
                       (long long)nb_array_dims(a)[1]);
    }
    k++;
  }
  *out = e, *n_out = k;
  return NB_OK;
}

/* The fused module of es[first] (all entries with its name, in q, k, v
 * order) as one LoRA: A [k r, d_in] the parts' A^T stacked, B [3 d, k r]
 * with part p's B^T in its rows and its A's columns, zeros elsewhere. */
static nb_status stack_fused(nb_ctx *ctx, const entry *es, int64_t n, int64_t first, nb_array **A_out, nb_array **B_out, int *k_out) {
  const entry *parts[3] = {0};
  for (int64_t i = first; i < n; i++)
    if (!strcmp(es[i].hf, es[first].hf) && es[i].part >= 0 && es[i].part < 3) parts[es[i].part] = &es[i];
  int64_t r = nb_array_dims(es[first].a)[1], d_in = nb_array_dims(es[first].a)[0], d = nb_array_dims(es[first].b)[1];
  int k = 0;
  for (int p = 0; p < 3; p++) {
    if (!parts[p]) continue;
    if (nb_array_dims(parts[p]->a)[1] != r || nb_array_dims(parts[p]->a)[0] != d_in || nb_array_dims(parts[p]->b)[1] != d)
      return nb_errorf(ctx, NB_ERR_SHAPE, "peft save: '%s' and '%s' (both in %s) differ in shape", parts[p]->module,
                       es[first].module, es[first].hf);
    k++;
  }
  int64_t da[2] = {k * r, d_in}, db[2] = {3 * d, k * r};
  nb_array *A = nb_array_empty(ctx, NB_F32, 2, da), *B = nb_array_empty(ctx, NB_F32, 2, db);
  if (!A || !B) return nb_array_release(A), nb_array_release(B), nb_ctx_status(ctx);
  float *a = nb_array_data_mut(A), *b = nb_array_data_mut(B);
  memset(b, 0, (size_t)(3 * d * k * r) * sizeof *b);
  int j = 0; /* the column block of the next adapted part */
  for (int p = 0; p < 3; p++) {
    if (!parts[p]) continue;
    for (int64_t q = 0; q < r; q++)
      for (int64_t i = 0; i < d_in; i++) a[(j * r + q) * d_in + i] = (float)nb_array_get(parts[p]->a, i * r + q);
    for (int64_t o = 0; o < d; o++)
      for (int64_t q = 0; q < r; q++) b[(p * d + o) * k * r + j * r + q] = (float)nb_array_get(parts[p]->b, q * d + o);
    j++;
  }
  *A_out = A, *B_out = B, *k_out = k;
  return NB_OK;
}

/* README.md beside a stacked export: the rule, for whoever reads the folder */
static nb_status write_readme(nb_ctx *ctx, const char *dir, const nb_pt_lora_config *c) {
  char path[4200];
  snprintf(path, sizeof path, "%s/README.md", dir);
  FILE *f = fopen(path, "w");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "peft save: cannot write %s", path);
  fprintf(f,
          "# LoRA adapter exported by nabla\n\n"
          "GPT-2 computes q, k and v with one Conv1D, `c_attn` (output [q | k | v]); nabla trained an adapter on\n"
          "each projection. Each `c_attn` LoRA here stacks them: with k of q, k, v adapted (rank r = %lld each),\n"
          "`lora_A.weight` [k r, d] holds their A's rows in q, k, v order and `lora_B.weight` [3 d, k r] holds\n"
          "each B in the rows of its projection and the columns of its A (zeros elsewhere), so\n"
          "B A x = [B_q A_q x | B_k A_k x | B_v A_v x] exactly. Cost: rank k r for c_attn (`rank_pattern`), with\n"
          "`alpha_pattern` %s so that the scale stays alpha / %s.\n",
          (long long)c->rank, c->rslora ? "sqrt(k) alpha" : "k alpha", c->rslora ? "sqrt(r)" : "r");
  return fclose(f) ? nb_errorf(ctx, NB_ERR_IO, "peft save: cannot write %s", path) : NB_OK;
}

nb_status nb_pt_lora_save_peft(nb_ctx *ctx, const char *dir, const nb_pt_lora_config *c, const nb_model_config *model,
                               const nb_tree *adapters, const char *base_model_name) {
  if (!dir || !c || !adapters) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft save: NULL argument");
  entry *es = NULL;
  int64_t n = 0;
  nb_status s = collect(ctx, model, adapters, &es, &n);
  if (s) return s;
  if (mkdir(dir, 0777) && errno != EEXIST) {
    free(es);
    return nb_errorf(ctx, NB_ERR_IO, "peft save: cannot create %s: %s", dir, strerror(errno));
  }
  nb_tree *st = nb_tree_create(ctx);
  size_t cap = 64 + 96 * (size_t)n, at = 0;
  char *regex = malloc(cap);
  cJSON *ranks = cJSON_CreateObject(), *alphas = cJSON_CreateObject();
  if (!st || !regex || !ranks || !alphas) s = nb_errorf(ctx, NB_ERR_NOMEM, "peft save: out of memory");
  if (regex) regex[0] = 0;
  int64_t rank = n ? nb_array_dims(es[0].a)[1] : c->rank;
  bool conv1d = false;
  int fused_k = 0; /* the k every fused module shares (-1: they differ) */
  for (int64_t i = 0; !s && i < n; i++) {
    bool seen = false;
    for (int64_t j = 0; j < i && !seen; j++) seen = !strcmp(es[j].hf, es[i].hf);
    if (seen) continue; /* a part of a fused module written already */
    if (at) regex[at++] = '|';
    add_escaped(regex, cap, &at, es[i].hf);
    conv1d |= es[i].conv1d;
    nb_array *A = NULL, *B = NULL;
    int k = 1;
    if (es[i].part >= 0) {
      s = stack_fused(ctx, es, n, i, &A, &B, &k);
      /* "h.0.attn.c_attn": PEFT matches a pattern key as r".*\.{key}$" */
      const char *key = strchr(es[i].hf, '.') ? strchr(es[i].hf, '.') + 1 : es[i].hf;
      if (!s && k > 1) {
        cJSON_AddNumberToObject(ranks, key, (double)(k * rank));
        cJSON_AddNumberToObject(alphas, key, stacked_alpha(c, k));
      }
      fused_k = !fused_k || fused_k == k ? k : -1;
    } else {
      A = f32_transposed(ctx, es[i].a), B = f32_transposed(ctx, es[i].b);
      if (!A || !B) s = nb_ctx_status(ctx);
    }
    char name[NAME_MAX_ + 64];
    snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", es[i].hf);
    if (!s) s = nb_tree_set_array(st, name, A);
    snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", es[i].hf);
    if (!s) s = nb_tree_set_array(st, name, B);
    nb_array_release(A), nb_array_release(B);
  }
  if (!s && fused_k > 1) { /* every fused module stacked alike: one key, "c_attn" */
    const char *last = strrchr(es[0].hf, '.');
    for (int64_t i = 0; i < n; i++)
      if (es[i].part >= 0) last = strrchr(es[i].hf, '.');
    cJSON_Delete(ranks), cJSON_Delete(alphas);
    ranks = cJSON_CreateObject(), alphas = cJSON_CreateObject();
    cJSON_AddNumberToObject(ranks, last + 1, (double)(fused_k * rank));
    cJSON_AddNumberToObject(alphas, last + 1, stacked_alpha(c, fused_k));
  }
  char path[4200];
  if (!s) {
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    s = nb_ckpt_safetensors_save(ctx, path, st, NULL, NULL);
  }
  if (!s && cJSON_GetArraySize(ranks)) s = write_readme(ctx, dir, c);
  if (!s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_model_name ? base_model_name : "");
    cJSON_AddNumberToObject(j, "r", (double)rank);
    cJSON_AddNumberToObject(j, "lora_alpha", c->alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", c->dropout);
    cJSON_AddBoolToObject(j, "use_rslora", c->rslora);
    cJSON_AddStringToObject(j, "target_modules", regex); /* PEFT: a string is re.fullmatch'ed against module names */
    cJSON_AddItemToObject(j, "rank_pattern", ranks);
    cJSON_AddItemToObject(j, "alpha_pattern", alphas);
    ranks = alphas = NULL;
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", conv1d); /* GPT-2's Conv1D weights are [in, out] */
    cJSON_AddBoolToObject(j, "inference_mode", true);
    cJSON_AddBoolToObject(j, "init_lora_weights", true);
    cJSON_AddNullToObject(j, "modules_to_save");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = text ? fopen(path, "w") : NULL;
    if (!f || fputs(text, f) < 0 || fclose(f)) s = nb_errorf(ctx, NB_ERR_IO, "peft save: cannot write %s", path);
    cJSON_free(text);
  }
  cJSON_Delete(ranks), cJSON_Delete(alphas);
  free(regex);
  free(es);
  nb_tree_destroy(st);
  return s;
}

/* ---------------------------------------------------------------- load */

/* adapter_config.json: the global numbers into *c, the per-module patterns
 * (PEFT's rank_pattern / alpha_pattern) kept in *patterns */
static nb_status read_config(nb_ctx *ctx, const char *path, const nb_model_config *model, nb_pt_lora_config *c, cJSON **patterns) {
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "peft load: cannot open %s", path);
  char *text = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 > cap) {
      char *t = realloc(text, cap = 2 * cap + 4096);
      if (!t) break;
      text = t;
    }
    size_t k = fread(text + n, 1, cap - n, f);
    n += k;
    if (!k) break;
  }
  fclose(f);
  cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
  free(text);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "peft_type"), *r = cJSON_GetObjectItemCaseSensitive(j, "r"),
              *alpha = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha"),
              *drop = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout"), *rs = cJSON_GetObjectItemCaseSensitive(j, "use_rslora"),
              *fifo = cJSON_GetObjectItemCaseSensitive(j, "fan_in_fan_out");
  nb_status s = NB_OK;
  if (!cJSON_IsObject(j)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: not a JSON object", path);
  else if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA"))
    s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: peft_type: 'LORA' wanted", path);
  else if (!cJSON_IsNumber(r) || r->valuedouble < 1) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: r: a positive integer wanted", path);
  else if (!cJSON_IsNumber(alpha)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: lora_alpha: a number wanted", path);
  else if (cJSON_IsTrue(fifo) && !gpt2(model))
    s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: fan_in_fan_out: true (GPT-2's Conv1D layout) but the base is not GPT-2", path);
  else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_dora")))
    s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: use_dora: DoRA adapters are not supported", path);
  for (int k = 0; !s && k < 2; k++) {
    const char *key = k ? "alpha_pattern" : "rank_pattern";
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, key), *v;
    if (p && !cJSON_IsNull(p) && !cJSON_IsObject(p)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s: an object wanted", path, key);
    cJSON_ArrayForEach(v, p) if (!s && !cJSON_IsNumber(v))
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: %s.%s: a number wanted", path, key, v->string);
  }
  if (!s) {
    *c = (nb_pt_lora_config){.rank = (int64_t)r->valuedouble, .alpha = alpha->valuedouble,
                             .dropout = cJSON_IsNumber(drop) ? drop->valuedouble : 0, .rslora = cJSON_IsTrue(rs)};
    *patterns = cJSON_CreateObject();
    cJSON_AddItemToObject(*patterns, "rank_pattern", cJSON_DetachItemFromObjectCaseSensitive(j, "rank_pattern"));
    cJSON_AddItemToObject(*patterns, "alpha_pattern", cJSON_DetachItemFromObjectCaseSensitive(j, "alpha_pattern"));
  }
  cJSON_Delete(j);
  return s;
}

/* PEFT's rank and alpha of module `hf`: the first pattern key (rank_pattern's,
 * then alpha_pattern's) with re.match(r".*\.{key}$", hf), else the globals;
 * *key the key used (NULL: none) */
static void module_rank(const cJSON *patterns, const nb_pt_lora_config *c, const char *hf, int64_t *rank, double *alpha,
                        const char **key) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(patterns, "rank_pattern"),
              *ap = cJSON_GetObjectItemCaseSensitive(patterns, "alpha_pattern");
  *rank = c->rank, *alpha = c->alpha, *key = NULL;
  for (int k = 0; k < 2 && !*key; k++) {
    const cJSON *v, *pattern = k ? ap : rp;
    cJSON_ArrayForEach(v, pattern) {
      char re_text[NAME_MAX_ + 16];
      snprintf(re_text, sizeof re_text, ".*\\.%s$", v->string);
      int err;
      PCRE2_SIZE off;
      pcre2_code *re = pcre2_compile((PCRE2_SPTR)re_text, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &off, NULL);
      pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
      bool hit = md && pcre2_match(re, (PCRE2_SPTR)hf, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) >= 0;
      pcre2_match_data_free(md);
      pcre2_code_free(re);
      if (hit) {
        *key = v->string;
        break;
      }
    }
  }
  if (!*key) return;
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(rp, *key), *a = cJSON_GetObjectItemCaseSensitive(ap, *key);
  if (r) *rank = (int64_t)r->valuedouble;
  if (a) *alpha = a->valuedouble;
}

/* A linear of the base that PEFT names. */
typedef struct base_linear {
  char module[NB_NN_PATH_MAX + 16], hf[NAME_MAX_];
  int part;
  int64_t d_in, d_out;
} base_linear;

/* A [R, d_in] (PEFT's) rows [row0, row0 + r) -> nabla's [d_in, r]; B [out, R]
 * rows [o0, o0 + d) and columns [c0, c0 + r) -> nabla's [r, d] */
static nb_array *a_block(nb_ctx *ctx, const nb_array *A, int64_t row0, int64_t r) {
  int64_t d_in = nb_array_dims(A)[1];
  nb_array *o = nb_array_empty(ctx, NB_F32, 2, (int64_t[2]){d_in, r});
  if (!o) return NULL;
  float *y = nb_array_data_mut(o);
  for (int64_t i = 0; i < d_in; i++)
    for (int64_t q = 0; q < r; q++) y[i * r + q] = (float)nb_array_get(A, (row0 + q) * d_in + i);
  return o;
}

static nb_array *b_block(nb_ctx *ctx, const nb_array *B, int64_t o0, int64_t d, int64_t c0, int64_t r) {
  int64_t R = nb_array_dims(B)[1];
  nb_array *o = nb_array_empty(ctx, NB_F32, 2, (int64_t[2]){r, d});
  if (!o) return NULL;
  float *y = nb_array_data_mut(o);
  for (int64_t q = 0; q < r; q++)
    for (int64_t j = 0; j < d; j++) y[q * d + j] = (float)nb_array_get(B, (o0 + j) * R + c0 + q);
  return o;
}

static bool block_zero(const nb_array *B, int64_t o0, int64_t d, int64_t c0, int64_t r) {
  int64_t R = nb_array_dims(B)[1];
  for (int64_t j = 0; j < d; j++)
    for (int64_t q = 0; q < r; q++)
      if (nb_array_get(B, (o0 + j) * R + c0 + q) != 0) return false;
  return true;
}

static nb_status put_pair(nb_ctx *ctx, nb_tree *ad, const char *module, nb_array *a, nb_array *b) {
  char p[NB_NN_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/lora_a", module);
  nb_status s = a && b ? nb_tree_set_array(ad, p, a) : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  snprintf(p, sizeof p, "%s/lora_b", module);
  if (!s) s = nb_tree_set_array(ad, p, b);
  nb_array_release(a), nb_array_release(b);
  return s;
}

/* A fused module's LoRA (A [R, d_in], B [3 d, R], both PEFT's) back into
 * nabla's q, k, v adapters of rank r. R = r: one A for all three (as PEFT
 * trains it): each part gets A and its rows of B. R = k r (k = 2, 3): our
 * stacking; column block j belongs to the one part whose rows of B are
 * nonzero there (an all-zero block to the first part left, in order). */
static nb_status split_fused(nb_ctx *ctx, const char *path, const char *hf, const base_linear *parts[3], nb_array *A, nb_array *B,
                             int64_t r, nb_tree *ad) {
  int64_t R = nb_array_dims(A)[0], d = parts[0]->d_out;
  if (R == r) {
    nb_status s = NB_OK;
    for (int p = 0; p < 3 && !s; p++) s = put_pair(ctx, ad, parts[p]->module, a_block(ctx, A, 0, r), b_block(ctx, B, p * d, d, 0, r));
    return s;
  }
  int k = (int)(R / r), owner[3] = {-1, -1, -1}; /* owner[j]: the part of column block j */
  bool taken[3] = {0};
  for (int j = 0; j < k; j++) {
    int nonzero = 0;
    for (int p = 0; p < 3; p++)
      if (!block_zero(B, p * d, d, j * r, r)) owner[j] = p, nonzero++;
    if (nonzero > 1 || (nonzero == 1 && taken[owner[j]]))
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                       "%s: '%s': a LoRA of rank %lld = %d x r whose B is not block-structured (columns %lld..%lld feed more "
                       "than one of q, k, v): not expressible as nabla's per-projection adapters of one rank",
                       path, hf, (long long)R, k, (long long)(j * r), (long long)(j * r + r - 1));
    if (nonzero) taken[owner[j]] = true;
  }
  for (int j = 0; j < k; j++)
    for (int p = 0; p < 3 && owner[j] < 0; p++)
      if (!taken[p]) owner[j] = p, taken[p] = true;
  nb_status s = NB_OK;
  for (int p = 0; p < 3 && !s; p++) /* in q, k, v order, as the base */
    for (int j = 0; j < k && !s; j++)
      if (owner[j] == p) s = put_pair(ctx, ad, parts[p]->module, a_block(ctx, A, j * r, r), b_block(ctx, B, p * d, d, j * r, r));
  return s;
}

/* The base's linears that have a Hugging Face module, in the base's order */
static base_linear *base_linears(nb_ctx *ctx, const nb_model_config *model, const nb_tree *base, int64_t *n_out) {
  base_linear *ls = calloc(nb_tree_size(base) + 1, sizeof *ls);
  int64_t n = 0;
  if (!ls) return nb_errorf(ctx, NB_ERR_NOMEM, "peft load: out of memory"), NULL;
  for (size_t i = 0; i < nb_tree_size(base); i++) {
    const char *p = nb_tree_path(base, i);
    size_t len = strlen(p);
    nb_aval w = nb_leaf_get_aval(nb_tree_leaf(base, i));
    if (len < 8 || strcmp(p + len - 7, "/kernel") || w.shape.rank != 2) continue;
    base_linear *l = &ls[n];
    snprintf(l->module, sizeof l->module, "%.*s", (int)(len - 7), p);
    if (!hf_module(model, l->module, l->hf, sizeof l->hf, &l->part, NULL)) continue;
    l->d_in = w.shape.dims[0], l->d_out = w.shape.dims[1];
    n++;
  }
  *n_out = n;
  return ls;
}

/* The checks of one PEFT module: its tensors' shapes, its rank and alpha */
static nb_status check_module(nb_ctx *ctx, const char *cfg_path, const char *path, const cJSON *patterns, const nb_pt_lora_config *c, const char *hf,
                              int fused_parts, int64_t d_in, int64_t d_out, nb_array *A, nb_array *B, const char *an,
                              const char *bn) {
  int64_t R;
  double alpha;
  const char *key;
  module_rank(patterns, c, hf, &R, &alpha, &key);
  int k = R % c->rank ? 0 : (int)(R / c->rank);
  double want = stacked_alpha(c, k ? k : 1);
  bool bad = fused_parts ? !k || k > fused_parts || fabs(alpha - want) > 1e-9 * want : R != c->rank || alpha != c->alpha;
  if (key && bad)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED,
                     "%s: rank_pattern / alpha_pattern '%s' gives %s rank %lld, alpha %g: nabla's adapters share rank %lld and "
                     "scale (only a fused module such as GPT-2's c_attn may stack its parts: rank k x %lld, alpha %g x k%s)",
                     cfg_path, key, hf, (long long)R, alpha, (long long)c->rank, (long long)c->rank, c->alpha, c->rslora ? "^0.5" : "");
  int64_t out = d_out * (fused_parts ? fused_parts : 1);
  if (nb_array_rank(A) != 2 || nb_array_dims(A)[0] != R || nb_array_dims(A)[1] != d_in)
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: '%s': [%lld, %lld] wanted (r %lld)", path, an, (long long)R, (long long)d_in, (long long)R);
  if (nb_array_rank(B) != 2 || nb_array_dims(B)[0] != out || nb_array_dims(B)[1] != R)
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: '%s': [%lld, %lld] wanted (r %lld)", path, bn, (long long)out, (long long)R, (long long)R);
  return NB_OK;
}

nb_tree *nb_pt_lora_load_peft(nb_ctx *ctx, const char *dir, const nb_model_config *model, const nb_tree *base,
                              nb_pt_lora_config *c) {
  if (!dir || !base || !c) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft load: NULL argument"), NULL;
  char path[4200], cfg_path[4200];
  cJSON *patterns = NULL;
  snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
  if (read_config(ctx, cfg_path, model, c, &patterns)) return NULL;
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  nb_tree *st = nb_ckpt_safetensors_load(ctx, path, NULL, NULL);
  int64_t nl = 0;
  base_linear *ls = st ? base_linears(ctx, model, base, &nl) : NULL;
  nb_tree *ad = ls ? nb_tree_create(ctx) : NULL;
  bool *used = ad ? calloc(nb_tree_size(st) + 1, 1) : NULL;
  nb_status s = used ? NB_OK : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : nb_errorf(ctx, NB_ERR_NOMEM, "peft load: out of memory");
  for (int64_t i = 0; !s && i < nl; i++) {
    const base_linear *parts[3] = {0};
    int fused = 0;
    bool seen = false;
    for (int64_t j = 0; j < i && !seen; j++) seen = !strcmp(ls[j].hf, ls[i].hf);
    if (seen) continue; /* a part of a fused module done already */
    for (int64_t j = i; j < nl && ls[i].part >= 0; j++)
      if (!strcmp(ls[j].hf, ls[i].hf) && ls[j].part >= 0 && ls[j].part < 3 && !parts[ls[j].part]) parts[ls[j].part] = &ls[j], fused++;
    if (fused && fused != 3) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft load: %s: the base has %d of its 3 parts", ls[i].hf, fused);
      break;
    }
    char an[NAME_MAX_ + 64], bn[NAME_MAX_ + 64];
    snprintf(an, sizeof an, "base_model.model.%s.lora_A.weight", ls[i].hf);
    snprintf(bn, sizeof bn, "base_model.model.%s.lora_B.weight", ls[i].hf);
    int64_t ka = nb_tree_find(st, an), kb = nb_tree_find(st, bn);
    if (ka < 0 && kb < 0) continue; /* not adapted */
    if (ka < 0 || kb < 0) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: '%s' is missing (its %s is there)", path, ka < 0 ? an : bn, ka < 0 ? "lora_B" : "lora_A");
      break;
    }
    used[ka] = used[kb] = true;
    nb_array *A = nb_tree_get_array(st, an), *B = nb_tree_get_array(st, bn);
    if (!A || !B) {
      s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: '%s' is not an array", path, A ? bn : an);
      break;
    }
    s = check_module(ctx, cfg_path, path, patterns, c, ls[i].hf, fused, ls[i].d_in, ls[i].d_out, A, B, an, bn);
    if (!s && fused) s = split_fused(ctx, path, ls[i].hf, parts, A, B, c->rank, ad);
    else if (!s) s = put_pair(ctx, ad, ls[i].module, f32_transposed(ctx, A), f32_transposed(ctx, B));
  }
  for (size_t i = 0; !s && i < nb_tree_size(st); i++)
    if (!used[i]) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: '%s' is no LoRA weight of a linear of this base", path, nb_tree_path(st, i));
  if (!s && !nb_tree_size(ad)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: holds no adapter", path);
  free(used);
  free(ls);
  cJSON_Delete(patterns);
  nb_tree_destroy(st);
  if (s) nb_tree_destroy(ad);
  return s ? NULL : ad;
}
