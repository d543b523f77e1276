/* PEFT's adapter format against PyPI peft's own files
 * (tests/posttrain/golden, made by make_peft.py): a tiny Hugging Face
 * Llama and a LoRA adapter peft saved. nabla loads the adapter onto the
 * base and matches peft's logits (and the base's without it); saving the
 * adapter again writes peft's tensor names, shapes and values bit for bit
 * and a config whose target_modules regex names exactly the adapted
 * modules; bad adapters are refused naming the tensor or field. */
#include <sys/stat.h>
#include <unistd.h>

#include "json_golden.h"
#include "testfs.h"

#include "nabla/ckpt.h"
#include "nabla/posttrain.h"

#define GOLDEN "tests/posttrain/golden/"

static nb_array *logits(nb_ctx *ctx, const nb_model_loaded *m, const nb_tree *ad, nb_pt_lora *l, const nb_array *ids) {
  nb_tree *batch = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", (nb_array *)ids);
  nb_model_trace_opts o = {0};
  if (l) o = (nb_model_trace_opts){.linear_hook = nb_pt_lora_hook, .hook_ud = l, .frozen_spec = m->params};
  const nb_tree *params = l ? ad : m->params;
  nb_graph *g = nb_model_trace_forward(ctx, &m->cfg, &o, params, batch);
  nb_exe *e = g ? nb_jit(ctx, g, NULL) : NULL;
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  nb_array *out = NULL;
  if (e) {
    nb_tree *in = nb_tree_create(ctx), *res = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    if (l) nb_tree_merge(in, "frozen", m->params);
    nb_tree_merge(in, "batch", batch);
    CHECK_OK(ctx, nb_exe_run(e, in, res));
    out = nb_tree_get_array(res, "logits");
    if (out) nb_array_retain(out);
    nb_tree_destroy(in), nb_tree_destroy(res);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(batch);
  return out;
}

/* max |got - want[b][t][v]| over the golden's nested list, and max |want| */
static double diff_nested(const nb_array *got, const cJSON *want, double *scale) {
  double m = 0, s = 0;
  int64_t k = 0;
  const cJSON *b, *t, *v;
  cJSON_ArrayForEach(b, want) cJSON_ArrayForEach(t, b) cJSON_ArrayForEach(v, t) {
    double w = v->valuedouble, g = k < nb_array_size(got) ? nb_array_get(got, k) : NAN;
    m = fmax(m, isnan(g) ? INFINITY : fabs(g - w));
    s = fmax(s, fabs(w));
    k++;
  }
  *scale = s;
  return k == nb_array_size(got) ? m : INFINITY;
}

/* logits [2, 10, 64] as {"logits": nested lists}, what make_peft*.py OUT_DIR compares peft's with */
static void write_logits(const char *path, const nb_array *y) {
  FILE *f = y ? fopen(path, "w") : NULL;
  if (!f) return;
  fputs("{\"logits\": [", f);
  for (int b = 0; b < 2; b++) {
    fputs(b ? ", [" : "[", f);
    for (int t = 0; t < 10; t++) {
      fputs(t ? ", [" : "[", f);
      for (int v = 0; v < 64; v++) fprintf(f, "%s%.9g", v ? ", " : "", nb_array_get(y, (b * 10 + t) * 64 + v));
      fputs("]", f);
    }
    fputs("]", f);
  }
  fputs("]}\n", f);
  fclose(f);
}

/* the ids of a golden's "ids" [2, 10] */
static nb_array *golden_ids(nb_ctx *ctx, const cJSON *j) {
  int32_t ids[20];
  int n = 0;
  const cJSON *row, *x;
  cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(j, "ids")) cJSON_ArrayForEach(x, row) if (n < 20) ids[n++] = (int32_t)x->valuedouble;
  return nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 10}, ids);
}

static void test_against_peft(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load(GOLDEN "peft_logits.json");
  nb_model_loaded m = {0};
  CHECK_OK(ctx, nb_model_load_hf(ctx, GOLDEN "peft_base", &m));
  if (!j || !m.params) goto done;
  nb_array *tok = golden_ids(ctx, j);
  nb_pt_lora_config lc;
  nb_tree *ad = nb_pt_lora_load_peft(ctx, GOLDEN "peft_adapter", &m.cfg, m.params, &lc);
  CHECK_MSG(ad, "%s", nb_ctx_error(ctx));
  if (!ad) goto done_tok;
  CHECK(lc.rank == 4 && lc.alpha == 8 && !lc.rslora && nb_tree_size(ad) == 2 * 4);
  CHECK(nb_tree_find(ad, "layers/0/attn/wq/lora_a") >= 0 && nb_tree_find(ad, "layers/1/attn/wo/lora_b") >= 0 &&
        nb_tree_find(ad, "layers/0/mlp/wo/lora_a") >= 0 && nb_tree_find(ad, "layers/1/attn/wq/lora_a") < 0);
  nb_pt_lora *l = nb_pt_lora_create(ctx, &lc, m.params, ad);
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  nb_array *yb = logits(ctx, &m, NULL, NULL, tok), *yl = l ? logits(ctx, &m, ad, l, tok) : NULL;
  if (yb && yl) {
    double sb, sl, db = diff_nested(yb, cJSON_GetObjectItemCaseSensitive(j, "base_logits"), &sb),
                   dl = diff_nested(yl, cJSON_GetObjectItemCaseSensitive(j, "lora_logits"), &sl),
                   moved = diff_nested(yb, cJSON_GetObjectItemCaseSensitive(j, "lora_logits"), &sl);
    fprintf(stderr, "vs peft: base logits %.3g, base + adapter %.3g (max |logit| %.3g); the adapter moves them by %.3g\n", db,
            dl, sl, moved);
    CHECK_MSG(db <= 1e-5 * sb, "base logits vs transformers: %g (scale %g)", db, sb);
    CHECK_MSG(dl <= 1e-5 * sl, "base + adapter logits vs peft: %g (scale %g)", dl, sl);
    CHECK_MSG(moved > 100 * 1e-5 * sl, "the adapter moved the logits by only %g", moved);
  }
  nb_array_release(yb);

  /* saved again: peft's tensors bit for bit, the config's regex naming the modules */
  char dir[512];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft");
  CHECK_OK(ctx, nb_pt_lora_save_peft(ctx, dir, &lc, &m.cfg, ad, "peft_base"));
  char p[600];
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  nb_tree *ours = nb_ckpt_safetensors_load(ctx, p, NULL, NULL),
          *theirs = nb_ckpt_safetensors_load(ctx, GOLDEN "peft_adapter/adapter_model.safetensors", NULL, NULL);
  CHECK_MSG(ours && theirs && nb_tree_size(ours) == nb_tree_size(theirs), "%s", nb_ctx_error(ctx));
  for (size_t i = 0; ours && theirs && i < nb_tree_size(theirs); i++) {
    const char *name = nb_tree_path(theirs, i);
    nb_array *a = nb_tree_get_array(ours, name), *b = nb_tree_get_array(theirs, name);
    CHECK_MSG(a && nb_test_arrays_close(name, a, b, 0), "%s differs or is missing", name);
  }
  nb_tree_destroy(ours), nb_tree_destroy(theirs);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  cJSON *cfg = nb_test_golden_load(p);
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(cfg, "target_modules");
  CHECK_MSG(cJSON_IsString(tm) && !strcmp(tm->valuestring, "model\\.layers\\.0\\.self_attn\\.q_proj|model\\.layers\\.0\\.self_attn\\.v_proj|"
                                                           "model\\.layers\\.0\\.mlp\\.down_proj|model\\.layers\\.1\\.self_attn\\.o_proj"),
            "target_modules %s", cJSON_IsString(tm) ? tm->valuestring : "?");
  CHECK(cJSON_GetObjectItemCaseSensitive(cfg, "r")->valuedouble == 4);
  cJSON_Delete(cfg);
  /* nabla's logits beside it, for make_peft.py OUT_DIR (peft loads the export) */
  snprintf(p, sizeof p, "%s/nabla_logits.json", dir);
  write_logits(p, yl);
  nb_array_release(yl);
  if (getenv("NABLA_KEEP_PEFT_EXPORT")) fprintf(stderr, "export left in %s\n", dir);
  else nb_test_rm_rf(dir);

  /* refusals */
  nb_tree *wrong = nb_tree_copy(m.params);
  nb_array *small = nb_array_zeros(ctx, NB_F32, 2, (int64_t[2]){16, 32});
  nb_tree_set_array(wrong, "layers/0/attn/wq/kernel", small);
  nb_array_release(small);
  nb_pt_lora_config c2;
  CHECK(!nb_pt_lora_load_peft(ctx, GOLDEN "peft_adapter", &m.cfg, wrong, &c2));
  CHECK_ERR(ctx, NB_ERR_SHAPE, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': [4, 16] wanted");
  nb_tree_destroy(wrong);
  CHECK(!nb_pt_lora_load_peft(ctx, GOLDEN "no_such_adapter", &m.cfg, m.params, &c2));
  CHECK_ERR(ctx, NB_ERR_IO, "no_such_adapter/adapter_config.json");
  nb_tree *odd = nb_tree_create(ctx);
  nb_tree_set_array(odd, "embed/lora_a", nb_tree_get_array(ad, "layers/0/attn/wq/lora_a"));
  CHECK(nb_pt_lora_save_peft(ctx, "/tmp", &lc, &m.cfg, odd, NULL) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "'embed' has no Hugging Face module name");
  nb_tree_destroy(odd);
  nb_pt_lora_destroy(l);
  nb_tree_destroy(ad);
done_tok:
  nb_array_release(tok);
done:
  nb_model_loaded_free(&m);
  cJSON_Delete(j);
}

/* the same paths holding the same bytes (any order) */
static bool same_adapters(const nb_tree *a, const nb_tree *b) {
  if (!a || !b || nb_tree_size(a) != nb_tree_size(b)) return false;
  for (size_t i = 0; i < nb_tree_size(a); i++) {
    nb_array *x = nb_tree_get_array(a, nb_tree_path(a, i)), *y = nb_tree_get_array(b, nb_tree_path(a, i));
    if (!x || !y || !nb_array_equal(x, y)) return false;
  }
  return true;
}

/* an adapter folder written by hand: config text and tensors */
static void write_adapter(nb_ctx *ctx, const char *dir, const char *config, const nb_tree *tensors) {
  char p[600];
  mkdir(dir, 0777);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  nb_test_write_text(p, config);
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  CHECK_OK(ctx, nb_ckpt_safetensors_save(ctx, p, tensors, NULL, NULL));
}

static const cJSON *item(const cJSON *j, const char *a, const char *b) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
  return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

/* GPT-2: nabla's q, k, v adapters stacked into one c_attn LoRA (make_peft_gpt2.py
 * writes the rule down in Python and peft runs it), and PEFT's own GPT-2
 * adapter (one A shared by q, k, v) run on nabla. */
static void test_gpt2(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load(GOLDEN "peft_gpt2_logits.json");
  nb_model_loaded m = {0};
  CHECK_OK(ctx, nb_model_load_hf(ctx, GOLDEN "peft_gpt2_base", &m));
  nb_tree *ours = nb_ckpt_safetensors_load(ctx, GOLDEN "peft_gpt2_nabla.safetensors", NULL, NULL);
  CHECK_MSG(ours, "%s", nb_ctx_error(ctx));
  if (!j || !m.params || !ours) goto done;
  nb_array *tok = golden_ids(ctx, j);
  nb_pt_lora_config lc = {.rank = 4, .alpha = 8};
  nb_pt_lora *l = nb_pt_lora_create(ctx, &lc, m.params, ours);
  CHECK_MSG(l, "%s", nb_ctx_error(ctx));
  nb_array *yb = logits(ctx, &m, NULL, NULL, tok), *yl = l ? logits(ctx, &m, ours, l, tok) : NULL;
  if (yb && yl) {
    double sb, sl, db = diff_nested(yb, item(j, "base_logits", NULL), &sb), dl = diff_nested(yl, item(j, "stacked_logits", NULL), &sl),
                   moved = diff_nested(yb, item(j, "stacked_logits", NULL), &sl);
    fprintf(stderr, "GPT-2 vs peft: base logits %.3g, base + q/k/v adapters vs peft's stacked c_attn %.3g (max |logit| %.3g); "
            "the adapters move them by %.3g\n", db, dl, sl, moved);
    CHECK_MSG(db <= 1e-5 * sb, "GPT-2 base logits vs transformers: %g (scale %g)", db, sb);
    CHECK_MSG(dl <= 1e-5 * sl, "GPT-2 base + adapters vs peft's stacked adapter: %g (scale %g)", dl, sl);
    CHECK_MSG(moved > 100 * 1e-5 * sl, "the adapters moved the logits by only %g", moved);
  }
  nb_array_release(yb);

  /* the export: peft's own files of the stacked adapter, bit for bit */
  char dir[512], p[600];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft_gpt2");
  CHECK_OK(ctx, nb_pt_lora_save_peft(ctx, dir, &lc, &m.cfg, ours, "peft_gpt2_base"));
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  nb_tree *got = nb_ckpt_safetensors_load(ctx, p, NULL, NULL),
          *want = nb_ckpt_safetensors_load(ctx, GOLDEN "peft_gpt2_adapter/adapter_model.safetensors", NULL, NULL);
  CHECK_MSG(got && want && nb_tree_size(got) == nb_tree_size(want) && same_adapters(got, want),
            "the GPT-2 export differs from peft's files of the same adapter");
  nb_tree_destroy(got), nb_tree_destroy(want);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  cJSON *cfg = nb_test_golden_load(p), *gold = nb_test_golden_load(GOLDEN "peft_gpt2_adapter/adapter_config.json");
  const char *keys[] = {"r", "lora_alpha", "fan_in_fan_out", "use_rslora", "target_modules", "rank_pattern", "alpha_pattern"};
  for (size_t k = 0; cfg && gold && k < sizeof keys / sizeof *keys; k++)
    CHECK_MSG(cJSON_Compare(item(cfg, keys[k], NULL), item(gold, keys[k], NULL), true), "adapter_config.json: %s differs from peft's",
              keys[k]);
  cJSON_Delete(cfg), cJSON_Delete(gold);
  snprintf(p, sizeof p, "%s/README.md", dir);
  char *readme = nb_test_read_file(p, NULL);
  CHECK_MSG(readme && strstr(readme, "rank k r for c_attn"), "README.md says the stacking rule");
  free(readme);
  snprintf(p, sizeof p, "%s/nabla_logits.json", dir);
  write_logits(p, yl);
  nb_array_release(yl);
  /* and back: the same adapters, bit for bit */
  nb_pt_lora_config back_c;
  nb_tree *back = nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &back_c);
  CHECK_MSG(same_adapters(back, ours) && back_c.rank == 4 && back_c.alpha == 8, "GPT-2 export does not load back: %s", nb_ctx_error(ctx));
  nb_tree_destroy(back);
  back = nb_pt_lora_load_peft(ctx, GOLDEN "peft_gpt2_adapter", &m.cfg, m.params, &back_c);
  CHECK_MSG(same_adapters(back, ours), "peft's files of the stacked adapter do not load as nabla's: %s", nb_ctx_error(ctx));
  nb_tree_destroy(back);
  if (getenv("NABLA_KEEP_PEFT_EXPORT")) fprintf(stderr, "GPT-2 export left in %s (make_peft_gpt2.py %s)\n", dir, dir);
  else nb_test_rm_rf(dir);

  /* peft's own GPT-2 adapter: c_attn of rank r, one A for q, k and v */
  nb_pt_lora_config nc;
  nb_tree *native = nb_pt_lora_load_peft(ctx, GOLDEN "peft_gpt2_native", &m.cfg, m.params, &nc);
  CHECK_MSG(native, "%s", nb_ctx_error(ctx));
  nb_pt_lora *ln = native ? nb_pt_lora_create(ctx, &nc, m.params, native) : NULL;
  nb_array *yn = ln ? logits(ctx, &m, native, ln, tok) : NULL;
  if (yn) {
    double sn, dn = diff_nested(yn, item(j, "native_logits", NULL), &sn);
    fprintf(stderr, "GPT-2: peft's own c_attn adapter on nabla vs peft %.3g (max |logit| %.3g)\n", dn, sn);
    CHECK_MSG(dn <= 1e-5 * sn, "peft's GPT-2 adapter on nabla vs peft: %g (scale %g)", dn, sn);
    CHECK(nb_tree_size(native) == 2 * 8 && nb_array_equal(nb_tree_get_array(native, "layers/1/attn/wq/lora_a"),
                                                           nb_tree_get_array(native, "layers/1/attn/wv/lora_a")));
  }
  nb_array_release(yn);
  nb_pt_lora_destroy(ln);
  nb_tree_destroy(native);

  /* every layer alike, rsLoRA: one "c_attn" key, alpha sqrt(3) alpha */
  nb_tree *all = nb_tree_copy(ours);
  const char *qkv[] = {"wq", "wk", "wv"};
  for (int k = 0; k < 3; k++)
    for (int w = 0; w < 2; w++) {
      char from[64], to[64];
      snprintf(from, sizeof from, "layers/0/attn/%s/lora_%c", qkv[k], "ab"[w]);
      snprintf(to, sizeof to, "layers/1/attn/%s/lora_%c", qkv[k], "ab"[w]);
      nb_tree_set_array(all, to, nb_tree_get_array(ours, from));
    }
  nb_pt_lora_config rs = {.rank = 4, .alpha = 8, .rslora = true};
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft_gpt2_rs");
  CHECK_OK(ctx, nb_pt_lora_save_peft(ctx, dir, &rs, &m.cfg, all, NULL));
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  cfg = nb_test_golden_load(p);
  const cJSON *rp = item(cfg, "rank_pattern", NULL), *ap = item(cfg, "alpha_pattern", "c_attn");
  CHECK_MSG(cJSON_GetArraySize(rp) == 1 && item(rp, "c_attn", NULL) && item(rp, "c_attn", NULL)->valuedouble == 12 &&
                ap && fabs(ap->valuedouble - 8 * sqrt(3.0)) < 1e-12,
            "one rank_pattern key c_attn: 12, alpha 8 sqrt(3)");
  cJSON_Delete(cfg);
  back = nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &back_c);
  CHECK_MSG(same_adapters(back, all) && back_c.rslora, "rsLoRA GPT-2 export does not load back: %s", nb_ctx_error(ctx));
  nb_tree_destroy(back);
  nb_tree_destroy(all);
  nb_test_rm_rf(dir);

  /* refusals, each naming what cannot be expressed */
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft_gpt2_bad");
  nb_tree *t = nb_tree_create(ctx);
  nb_test_rng rng = {7};
  double va[8 * 32], vb[96 * 8];
  for (int i = 0; i < 8 * 32; i++) va[i] = nb_test_normal(&rng);
  for (int i = 0; i < 96 * 8; i++) vb[i] = nb_test_normal(&rng);
  nb_array *A = nb_array_from_f64(ctx, NB_F32, 2, (int64_t[2]){8, 32}, va), *B = nb_array_from_f64(ctx, NB_F32, 2, (int64_t[2]){96, 8}, vb);
  nb_tree_set_array(t, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", A);
  nb_tree_set_array(t, "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight", B);
  nb_array_release(A), nb_array_release(B);
  write_adapter(ctx, dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"fan_in_fan_out\": true, "
                "\"rank_pattern\": {\"c_attn\": 8}, \"alpha_pattern\": {\"c_attn\": 16}}", t);
  CHECK(!nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &back_c));
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "'transformer.h.0.attn.c_attn': a LoRA of rank 8 = 2 x r whose B is not block-structured");
  write_adapter(ctx, dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"fan_in_fan_out\": true, "
                "\"rank_pattern\": {\"c_attn\": 8}}", t);
  CHECK(!nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &back_c));
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "rank_pattern / alpha_pattern 'c_attn' gives transformer.h.0.attn.c_attn rank 8, alpha 8");
  nb_tree_destroy(t);
  nb_test_rm_rf(dir);
  nb_pt_lora_destroy(l);
  nb_array_release(tok);
done:
  nb_tree_destroy(ours);
  nb_model_loaded_free(&m);
  cJSON_Delete(j);
}

/* a GPT-2 adapter on a Llama base, and per-module ranks where nabla has one rank */
static void test_refusals(nb_ctx *ctx) {
  nb_model_loaded m = {0};
  CHECK_OK(ctx, nb_model_load_hf(ctx, GOLDEN "peft_base", &m));
  nb_pt_lora_config c;
  CHECK(!nb_pt_lora_load_peft(ctx, GOLDEN "peft_gpt2_native", &m.cfg, m.params, &c));
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "fan_in_fan_out: true (GPT-2's Conv1D layout) but the base is not GPT-2");
  char dir[512];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft_bad");
  nb_tree *t = nb_ckpt_safetensors_load(ctx, GOLDEN "peft_adapter/adapter_model.safetensors", NULL, NULL);
  write_adapter(ctx, dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"rank_pattern\": {\"q_proj\": 8}}", t);
  CHECK(!nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &c));
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "rank_pattern / alpha_pattern 'q_proj' gives model.layers.0.self_attn.q_proj rank 8");
  /* a pattern that changes nothing is no reason to refuse */
  write_adapter(ctx, dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"alpha_pattern\": {\"q_proj\": 8}}", t);
  nb_tree *ok = nb_pt_lora_load_peft(ctx, dir, &m.cfg, m.params, &c);
  CHECK_MSG(ok, "%s", nb_ctx_error(ctx));
  nb_tree_destroy(ok);
  nb_tree_destroy(t);
  nb_test_rm_rf(dir);
  nb_model_loaded_free(&m);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_against_peft(ctx);
  test_gpt2(ctx);
  test_refusals(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_peft");
}
