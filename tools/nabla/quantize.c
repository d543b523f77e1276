/* `nabla quantize`: a model quantized by rules into a nabla run dir
 * (docs/quant.md), or written as GGUF (llama.cpp's format) as F32, F16,
 * BF16, Q8_0, Q4_0 or Q4_K (docs/gguf.md), from any model `nabla generate`
 * loads (run dir, checkpoint, Hugging Face folder, GGUF file). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla quantize MODEL --rules RULES.yaml -o OUT_DIR [--config FILE] [--calibrate TEXT [--calib-batches N]]\n"
    "       nabla quantize MODEL --format gguf --type TYPE -o OUT.gguf [options]\n"
    "  --rules FILE         quantization rules (quant.rules: a list of module_path regex, weight_qtype\n"
    "                       int8|int4|nf4|fp8_e4m3|fp8_e5m2, act_qtype none|int8_dynamic|int8_block|\n"
    "                       int8_static, tile_size, weight_calibration, act_calibration (int8_static:\n"
    "                       absmax|minmax|rms,K|fixed,MIN,MAX); the first rule matching a linear's path wins;\n"
    "                       docs/quant.md). OUT_DIR becomes a run dir (config.yaml, checkpoints/step_0\n"
    "                       with the quantized weights and the rules in its metadata, tokenizer.json)\n"
    "                       that `nabla generate` and `nabla serve` run on the quant kernels\n"
    "  --calibrate FILE     text whose windows the f32 model runs to observe the inputs of the\n"
    "                       int8_static linears (their activation scales, recorded in the checkpoint)\n"
    "  --calib-batches N    calibration batches of 8 windows of the model's max_seq_len (at most 512)\n"
    "                       tokens (default 16)\n"
    "  MODEL                a nabla run dir (config.yaml), a checkpoint step dir, a Hugging Face\n"
    "                       Llama folder (config.json), or a GGUF file\n"
    "  --format gguf        llama.cpp's file format (the only one so far)\n"
    "  --type TYPE          f32, f16, bf16, q8_0, q4_0 or q4_k: the 2-D weights' type (default f16).\n"
    "                       Norms stay f32; q4_0 and q4_k files keep the output projection at q6_k\n"
    "                       (q8_0 when its rows are not a multiple of 256);\n"
    "                       in q4_k, rows not a multiple of 256 are q4_0; rows not a multiple of 32\n"
    "                       fall back to f16 (as llama.cpp's converter)\n"
    "  -o, --output FILE    the file to write (atomically)\n"
    "  --config FILE        the run config for a run dir / checkpoint\n"
    "  --name NAME          general.name in the file (default: none)\n"
    "The tokenizer is written when it is BPE (byte-level as GPT-2 / Llama-3, or SentencePiece-style\n"
    "as Llama-2); a model without one gets llama.cpp's vocabulary-less mode (ids only).\n"
    "Dense Llama and GPT-2 models.\n";

static const struct {
  const char *name;
  nb_gguf_type type;
} types[] = {{"f32", NB_GGUF_F32}, {"f16", NB_GGUF_F16}, {"bf16", NB_GGUF_BF16}, {"q8_0", NB_GGUF_Q8_0}, {"q4_0", NB_GGUF_Q4_0}, {"q4_k", NB_GGUF_Q4_K}};

static nb_status load_f32(nb_ctx *ctx, const char *model, const char *config, nb_model_loaded *m);

/* "int4 g32 asymmetric, weight-only, rule 0 'layers/0/mlp/.*'" */
static void describe(const nb_quant_linear *l, const nb_quant_rules *r, char *buf, size_t cap) {
  char tile[32];
  if (l->layout.tile >= l->layout.k) snprintf(tile, sizeof tile, "per-channel");
  else snprintf(tile, sizeof tile, "g%lld", (long long)l->layout.tile);
  const nb_quant_rule *rule = nb_quant_rules_at(r, l->rule);
  snprintf(buf, cap, "%s %s%s, %s, rule %d '%s'", nb_quant_type_name(l->layout.qtype), tile,
           l->layout.asymmetric ? " asymmetric" : "", l->act == NB_QUANT_ACT_INT8_DYNAMIC ? "int8 dynamic activations"
           : l->act == NB_QUANT_ACT_INT8_BLOCK                               ? "int8 per-32-block dynamic activations"
           : l->act == NB_QUANT_ACT_INT8_STATIC                              ? "int8 static activations"
                                                                             : "weight-only",
           l->rule, rule ? rule->module_path : "?");
  if (l->act == NB_QUANT_ACT_INT8_STATIC) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, ", act_scale %.6g", (double)l->act_scale);
  }
}

/* How a calibration pass went, for the metadata. */
typedef struct calib_info {
  const char *data;
  int64_t batches, windows, seq_len;
  const nb_quant_observer *obs;
} calib_info;

/* The calibration pass: the f32 model over the first batches of windows of
 * the text, the observe hook recording the int8_static linears' inputs;
 * then their act_scale into q. */
static nb_status calibrate(nb_ctx *ctx, const nb_model_loaded *m, const nb_quant_rules *r, nb_tree *q, calib_info *ci) {
  int32_t *ids = NULL;
  size_t n_ids = 0;
  nb_status s = nb_cli_text_ids(ctx, ci->data, m, &ids, &n_ids);
  if (s) return s;
  const int64_t B = 8, T = m->cfg.max_seq_len < 512 ? m->cfg.max_seq_len : 512;
  int64_t windows = n_ids > 1 ? (int64_t)(n_ids - 1) / T : 0;
  if (windows > ci->batches * B) windows = ci->batches * B;
  if (windows < B) {
    free(ids);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "--calibrate %s: %zu tokens: fewer than one batch of %lld windows of %lld tokens",
                     ci->data, n_ids, (long long)B, (long long)T);
  }
  ci->batches = windows / B, ci->windows = ci->batches * B, ci->seq_len = T;
  nb_quant_observer *o = nb_quant_observer_create(ctx, r);
  nb_model_config cfg = m->cfg;
  cfg.scan_layers = false; /* the hook's outputs go to the graph being traced */
  nb_tree *bspec = nb_tree_create(ctx);
  if (bspec) nb_tree_set(bspec, "inputs", nb_leaf_aval(nb_aval_make(NB_I32, 2, (int64_t[]){B, T})));
  nb_model_trace_opts mo = {.linear_hook = nb_quant_observe_hook, .hook_ud = o};
  nb_graph *g = o && bspec ? nb_model_trace_forward(ctx, &cfg, &mo, m->params, bspec) : NULL;
  nb_exe *e = g ? nb_jit(ctx, g, NULL) : NULL;
  s = e ? NB_OK : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  for (int64_t b = 0; !s && b < ci->batches; b++) {
    nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
    nb_array *a = nb_array_create(ctx, NB_I32, 2, (int64_t[]){B, T}, ids + b * B * T); /* B consecutive windows */
    s = in && out && a ? nb_tree_merge(in, "params", m->params) : NB_ERR_NOMEM;
    if (!s) s = nb_tree_set_array(in, "batch/inputs", a);
    if (!s) s = nb_exe_run(e, in, out);
    if (!s) s = nb_quant_observer_add(o, out);
    nb_array_release(a);
    nb_tree_destroy(in), nb_tree_destroy(out);
  }
  if (!s) s = nb_quant_observer_apply(o, q);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(bspec);
  free(ids);
  if (s) nb_quant_observer_destroy(o);
  else ci->obs = o;
  return s;
}

/* The first int8_static linear of q without a scale yet, into m (false: none). */
static bool uncalibrated(nb_ctx *ctx, const nb_tree *q, char *m, size_t cap) {
  static const char suffix[] = "/kernel/act_scale";
  for (size_t i = 0; i < nb_tree_size(q); i++) {
    const char *p = nb_tree_path(q, i);
    size_t n = strlen(p), ls = strlen(suffix);
    if (n <= ls || strcmp(p + n - ls, suffix)) continue;
    snprintf(m, cap, "%.*s", (int)(n - ls), p);
    nb_quant_linear l;
    bool found;
    if (!nb_quant_tree_linear(ctx, q, m, &l, &found) && found && isnan(l.act_scale)) return true;
  }
  return false;
}

/* {"quant": {"rules": the YAML text, "tensors": {"params/<m>/kernel": description}}} */
static char *quant_metadata(nb_ctx *ctx, const nb_tree *q, const nb_quant_rules *r, const char *rules_text, const calib_info *ci) {
  cJSON *root = cJSON_CreateObject(), *qj = cJSON_AddObjectToObject(root, "quant");
  cJSON_AddStringToObject(qj, "rules", rules_text);
  cJSON *tensors = cJSON_AddObjectToObject(qj, "tensors"), *ranges = NULL;
  if (ci->obs) {
    cJSON *cj = cJSON_AddObjectToObject(qj, "calibration");
    cJSON_AddStringToObject(cj, "data", ci->data);
    cJSON_AddNumberToObject(cj, "batches", (double)ci->batches);
    cJSON_AddNumberToObject(cj, "windows", (double)ci->windows);
    cJSON_AddNumberToObject(cj, "seq_len", (double)ci->seq_len);
    ranges = cJSON_AddObjectToObject(qj, "act_ranges");
  }
  static const char suffix[] = "/kernel/quant";
  for (size_t i = 0; i < nb_tree_size(q); i++) {
    const char *p = nb_tree_path(q, i);
    size_t n = strlen(p), ls = strlen(suffix);
    if (n <= ls || strcmp(p + n - ls, suffix)) continue;
    char m[1024], key[1100], d[512];
    snprintf(m, sizeof m, "%.*s", (int)(n - ls), p);
    nb_quant_linear l;
    bool found;
    if (nb_quant_tree_linear(ctx, q, m, &l, &found) || !found) continue;
    describe(&l, r, d, sizeof d);
    snprintf(key, sizeof key, "params/%s/kernel", m);
    cJSON_AddStringToObject(tensors, key, d);
    nb_quant_observed ob;
    if (ranges && l.act == NB_QUANT_ACT_INT8_STATIC && nb_quant_observer_get(ci->obs, m, &ob)) {
      cJSON *rj = cJSON_AddObjectToObject(ranges, key);
      cJSON_AddNumberToObject(rj, "min", ob.min);
      cJSON_AddNumberToObject(rj, "max", ob.max);
      cJSON_AddNumberToObject(rj, "rms", ob.rms);
      cJSON_AddNumberToObject(rj, "count", (double)ob.count);
      cJSON_AddNumberToObject(rj, "act_scale", l.act_scale);
    }
  }
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

static int quantize_by_rules(const char *model, const char *config, const char *rules_path, const char *out, calib_info *ci) {
  const char *inputs[] = {model, rules_path, config ? config : ci->data, ci->data};
  if (!nb_cli_output_ok("quantize", out, true, 2 + (config != NULL) + (ci->data != NULL), inputs)) return 1;
  struct stat st;
  if (!stat(out, &st)) return fprintf(stderr, "nabla quantize: %s exists: give a new directory\n", out), 1;
  size_t rules_len;
  char *rules_text = nb_cli_read_input("quantize", rules_path, &rules_len);
  if (!rules_text) return 1;
  nb_ctx *ctx = nb_ctx_create();
  nb_quant_rules *r = ctx ? nb_quant_rules_parse_yaml(ctx, rules_path, rules_text, rules_len) : NULL;
  nb_model_loaded m = {0};
  nb_tree *q = NULL;
  nb_ckpt_manager *cm = NULL;
  char *meta = NULL, path[4200];
  int rc = 1;
  if (!r) goto fail;
  if (load_f32(ctx, model, config, &m)) goto fail;
  q = nb_quant_ptq(ctx, m.params, r);
  if (!q) goto fail;
  int64_t nq = nb_quant_tree_count(ctx, q);
  if (nq == 0) {
    fprintf(stderr, "nabla quantize: no rule of %s matches a linear of the model (module paths such as "
            "'layers/0/attn/wq', 'layers/0/mlp/wi_0', 'lm_head')\n", rules_path);
    goto done;
  }
  char unc[1024];
  if (ci->data && calibrate(ctx, &m, r, q, ci)) goto fail;
  if (uncalibrated(ctx, q, unc, sizeof unc)) {
    fprintf(stderr, "nabla quantize: '%s' has int8_static activations calibrated from data: give --calibrate TEXT (or "
            "act_calibration: fixed,MIN,MAX)\n", unc);
    goto done;
  }
  if (mkdir(out, 0777)) {
    fprintf(stderr, "nabla quantize: %s: %s\n", out, strerror(errno));
    goto done;
  }
  /* the run config: this model, and its tokenizer beside it */
  nb_train_config rc_out;
  nb_train_config_defaults(&rc_out);
  rc_out.model = m.cfg;
  if (rc_out.data.seq_len > m.cfg.max_seq_len) rc_out.data.seq_len = m.cfg.max_seq_len; /* a valid config */
  snprintf(rc_out.data.tokenizer, sizeof rc_out.data.tokenizer, "%s", m.tok ? "tokenizer.json" : "");
  if (m.tok) {
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    if (nb_tok_save_hf(m.tok, path)) goto fail;
  }
  snprintf(path, sizeof path, "%s/config.yaml", out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "nabla quantize: %s: %s\n", path, strerror(errno));
    goto done;
  }
  nb_train_config_write(&rc_out, f);
  if (fclose(f)) {
    fprintf(stderr, "nabla quantize: %s: write error\n", path);
    goto done;
  }
  snprintf(path, sizeof path, "%s/checkpoints", out);
  nb_ckpt_options co = {.directory = path};
  cm = nb_ckpt_manager_create(ctx, &co);
  meta = cm ? quant_metadata(ctx, q, r, rules_text, ci) : NULL;
  nb_ckpt_item item = {"params", q};
  nb_ckpt_save_opts so = {.metadata_json = meta, .force = true};
  if (!cm || !meta || nb_ckpt_save(cm, 0, &item, 1, &so, NULL) || nb_ckpt_wait_until_finished(cm)) goto fail;
  fprintf(stderr, "nabla quantize: wrote %s (%lld of the linears quantized by %d rules%s)\n", out, (long long)nq,
          nb_quant_rules_count(r), m.tok ? ", with its tokenizer" : ", ids only");
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "nabla quantize: %s\n", nb_ctx_error(ctx));
done:
  nb_ckpt_manager_destroy(cm);
  free(meta);
  nb_tree_destroy(q);
  nb_model_loaded_free(&m);
  nb_quant_rules_destroy(r);
  nb_quant_observer_destroy((nb_quant_observer *)ci->obs);
  nb_ctx_destroy(ctx);
  free(rules_text);
  return rc;
}

/* A GGUF input's Q8_0 / Q4_0 linears come as quant trees (nb_cli_load_model):
 * back to f32, the input of both outputs. */
static nb_status load_f32(nb_ctx *ctx, const char *model, const char *config, nb_model_loaded *m) {
  nb_status s = nb_cli_load_model(ctx, model, config, m);
  if (s || nb_quant_tree_count(ctx, m->params) == 0) return s;
  nb_tree *f = nb_quant_dequantize_tree(ctx, m->params);
  if (!f) return nb_model_loaded_free(m), nb_ctx_status(ctx);
  nb_tree_destroy(m->params);
  m->params = f;
  return NB_OK;
}

int nb_cmd_quantize(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  const char *model = NULL, *format = NULL, *type = "f16", *out = NULL, *config = NULL, *name = NULL, *rules = NULL;
  calib_info ci = {.batches = 16};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--calib-batches")) {
      if (!nb_cli_int("quantize", a, v, 1, 1 << 20, &ci.batches)) return 2;
      i++;
      continue;
    }
    const char **dst = !strcmp(a, "--format") ? &format : !strcmp(a, "--type") ? &type
                       : !strcmp(a, "-o") || !strcmp(a, "--output") ? &out : !strcmp(a, "--config") ? &config
                       : !strcmp(a, "--name") ? &name : !strcmp(a, "--rules") ? &rules
                       : !strcmp(a, "--calibrate") ? &ci.data : NULL;
    if (dst) {
      if (!v) return fprintf(stderr, "nabla quantize: %s needs a value\n", a), nb_cli_usage(usage_text, false);
      *dst = v, i++;
    } else if (a[0] == '-' || model) {
      return fprintf(stderr, "nabla quantize: unexpected argument '%s'\n", a), nb_cli_usage(usage_text, false);
    } else {
      model = a;
    }
  }
  if (!model || !out) return fprintf(stderr, "nabla quantize: MODEL and -o are required\n"), nb_cli_usage(usage_text, false);
  if (rules && format)
    return fprintf(stderr, "nabla quantize: --rules writes a nabla run dir; --format gguf a GGUF file: give one\n"), 2;
  if (ci.data && !rules) return fprintf(stderr, "nabla quantize: --calibrate goes with --rules (int8_static activations)\n"), 2;
  if (rules) return quantize_by_rules(model, config, rules, out, &ci);
  if (!format || strcmp(format, "gguf"))
    return fprintf(stderr, "nabla quantize: give --rules RULES.yaml (a nabla run dir) or --format gguf\n"),
           nb_cli_usage(usage_text, false);
  int t = -1;
  for (int k = 0; k < (int)(sizeof types / sizeof *types); k++)
    if (!strcmp(type, types[k].name)) t = k;
  if (t < 0) return fprintf(stderr, "nabla quantize: --type '%s': one of f32, f16, bf16, q8_0, q4_0, q4_k\n", type), 2;
  const char *inputs[] = {model, config};
  if (!nb_cli_output_ok("quantize", out, false, config ? 2 : 1, inputs)) return 1;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_model_loaded m;
  int rc = 0;
  if (load_f32(ctx, model, config, &m)) {
    fprintf(stderr, "nabla quantize: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else {
    nb_model_gguf_opts o = {.type = types[t].type, .name = name};
    if (nb_model_save_gguf(ctx, &m, out, &o)) fprintf(stderr, "nabla quantize: %s: %s\n", out, nb_ctx_error(ctx)), rc = 1;
    else fprintf(stderr, "nabla quantize: wrote %s (%s, %s)\n", out, types[t].name, m.tok ? "with its tokenizer" : "ids only");
    nb_model_loaded_free(&m);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
