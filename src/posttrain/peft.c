/* LoRA adapters in PEFT's format (adapter_config.json +
 * adapter_model.safetensors), so a nabla adapter loads onto a Hugging Face
 * model with `peft` and a PEFT adapter runs on nabla. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nabla/ckpt.h"
#include "nabla/posttrain.h"

/* "layers/0/attn/wq" -> "model.layers.0.self_attn.q_proj" */
static bool hf_module(const char *module, char *out, size_t cap) {
  char path[NB_NN_PATH_MAX + 16], name[NB_NN_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/kernel", module);
  size_t n;
  if (!nb_model_hf_name(path, name, sizeof name, NULL) || (n = strlen(name)) < 8 || strcmp(name + n - 7, ".weight"))
    return false;
  snprintf(out, cap, "%.*s", (int)(n - 7), name);
  return true;
}

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

nb_status nb_pt_lora_save_peft(nb_ctx *ctx, const char *dir, const nb_pt_lora_config *c, const nb_tree *adapters,
                               const char *base_model_name) {
  if (!dir || !c || !adapters) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft save: NULL argument");
  if (mkdir(dir, 0777) && errno != EEXIST) return nb_errorf(ctx, NB_ERR_IO, "peft save: cannot create %s: %s", dir, strerror(errno));
  nb_tree *st = nb_tree_create(ctx);
  size_t cap = 64 + 96 * nb_tree_size(adapters), at = 0;
  char *regex = malloc(cap);
  nb_status s = st && regex ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "peft save: out of memory");
  if (regex) regex[0] = 0;
  int64_t rank = c->rank;
  for (size_t i = 0; !s && i < nb_tree_size(adapters); i++) {
    const char *p = nb_tree_path(adapters, i);
    char module[NB_NN_PATH_MAX + 16], hf[NB_NN_PATH_MAX + 64], name[NB_NN_PATH_MAX + 128];
    int which;
    nb_array *a = nb_tree_get_array(adapters, p);
    if (!split(p, module, sizeof module, &which) || !a || nb_array_rank(a) != 2) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft save: '%s' is no adapter array (<module>/lora_a or lora_b, rank 2)", p);
      break;
    }
    if (!hf_module(module, hf, sizeof hf)) {
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "peft save: '%s' has no Hugging Face module name (Llama-architecture names only)", module);
      break;
    }
    if (!which) {
      if (at) regex[at++] = '|';
      add_escaped(regex, cap, &at, hf);
      rank = nb_array_dims(a)[1];
    }
    snprintf(name, sizeof name, "base_model.model.%s.lora_%c.weight", hf, which ? 'B' : 'A');
    nb_array *f = nb_array_astype(ctx, a, NB_F32), *t = f ? nb_array_transpose2d(ctx, f) : NULL;
    s = t ? nb_tree_set_array(st, name, t) : nb_ctx_status(ctx);
    nb_array_release(f), nb_array_release(t);
  }
  char path[4200];
  if (!s) {
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    s = nb_ckpt_safetensors_save(ctx, path, st, NULL, NULL);
  }
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
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", false);
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
  free(regex);
  nb_tree_destroy(st);
  return s;
}

/* ---------------------------------------------------------------- load */

static nb_status read_config(nb_ctx *ctx, const char *path, nb_pt_lora_config *c) {
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
  else if (cJSON_IsTrue(fifo)) s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: fan_in_fan_out: true (GPT-2 Conv1D layout) is not supported", path);
  else if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "rank_pattern")) ||
           cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "alpha_pattern")))
    s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: rank_pattern / alpha_pattern (per-module ranks) are not supported", path);
  else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_dora")))
    s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "%s: use_dora: DoRA adapters are not supported", path);
  if (!s) {
    *c = (nb_pt_lora_config){.rank = (int64_t)r->valuedouble, .alpha = alpha->valuedouble,
                             .dropout = cJSON_IsNumber(drop) ? drop->valuedouble : 0, .rslora = cJSON_IsTrue(rs)};
  }
  cJSON_Delete(j);
  return s;
}

nb_tree *nb_pt_lora_load_peft(nb_ctx *ctx, const char *dir, const nb_tree *base, nb_pt_lora_config *c) {
  if (!dir || !base || !c) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "peft load: NULL argument"), NULL;
  char path[4200];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  if (read_config(ctx, path, c)) return NULL;
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  nb_tree *st = nb_ckpt_safetensors_load(ctx, path, NULL, NULL);
  if (!st) return NULL;
  nb_tree *ad = nb_tree_create(ctx);
  bool *used = calloc(nb_tree_size(st) + 1, 1);
  nb_status s = ad && used ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "peft load: out of memory");
  /* every linear of the base with a Hugging Face name, in the base's order */
  for (size_t i = 0; !s && i < nb_tree_size(base); i++) {
    const char *p = nb_tree_path(base, i);
    size_t n = strlen(p);
    if (n < 8 || strcmp(p + n - 7, "/kernel")) continue;
    char module[NB_NN_PATH_MAX + 16], hf[NB_NN_PATH_MAX + 64];
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), p);
    if (!hf_module(module, hf, sizeof hf)) continue;
    for (int which = 0; which < 2 && !s; which++) {
      char name[NB_NN_PATH_MAX + 128], ours[NB_NN_PATH_MAX + 32];
      snprintf(name, sizeof name, "base_model.model.%s.lora_%c.weight", hf, which ? 'B' : 'A');
      int64_t k = nb_tree_find(st, name);
      if (k < 0) {
        if (which) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: '%s' is missing (its lora_A is there)", path, name);
        break;
      }
      used[k] = true;
      nb_array *a = nb_tree_get_array(st, name);
      nb_aval w = nb_leaf_get_aval(nb_tree_leaf(base, i));
      int64_t want0 = which ? w.shape.dims[1] : c->rank, want1 = which ? c->rank : w.shape.dims[0];
      if (!a || nb_array_rank(a) != 2 || nb_array_dims(a)[0] != want0 || nb_array_dims(a)[1] != want1) {
        s = nb_errorf(ctx, NB_ERR_SHAPE, "%s: '%s': [%lld, %lld] wanted (r %lld)", path, name, (long long)want0,
                      (long long)want1, (long long)c->rank);
        break;
      }
      nb_array *f = nb_array_astype(ctx, a, NB_F32), *t = f ? nb_array_transpose2d(ctx, f) : NULL;
      snprintf(ours, sizeof ours, "%s/lora_%c", module, which ? 'b' : 'a');
      s = t ? nb_tree_set_array(ad, ours, t) : nb_ctx_status(ctx);
      nb_array_release(f), nb_array_release(t);
    }
  }
  for (size_t i = 0; !s && i < nb_tree_size(st); i++)
    if (!used[i]) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: '%s' is no LoRA weight of a linear of this base", path, nb_tree_path(st, i));
  if (!s && !nb_tree_size(ad)) s = nb_errorf(ctx, NB_ERR_FORMAT, "%s: holds no adapter", path);
  free(used);
  nb_tree_destroy(st);
  if (s) nb_tree_destroy(ad);
  return s ? NULL : ad;
}
