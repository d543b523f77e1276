/* PEFT's adapter format against PyPI peft's own files
 * (tests/posttrain/golden, made by make_peft.py): a tiny Hugging Face
 * Llama and a LoRA adapter peft saved. nabla loads the adapter onto the
 * base and matches peft's logits (and the base's without it); saving the
 * adapter again writes peft's tensor names, shapes and values bit for bit
 * and a config whose target_modules regex names exactly the adapted
 * modules; bad adapters are refused naming the tensor or field. */
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

static void test_against_peft(nb_ctx *ctx) {
  cJSON *j = nb_test_golden_load(GOLDEN "peft_logits.json");
  nb_model_loaded m = {0};
  CHECK_OK(ctx, nb_model_load_hf(ctx, GOLDEN "peft_base", &m));
  if (!j || !m.params) goto done;
  int32_t ids[20];
  int n = 0;
  const cJSON *row, *x;
  cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(j, "ids")) cJSON_ArrayForEach(x, row) if (n < 20) ids[n++] = (int32_t)x->valuedouble;
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){2, 10}, ids);
  nb_pt_lora_config lc;
  nb_tree *ad = nb_pt_lora_load_peft(ctx, GOLDEN "peft_adapter", m.params, &lc);
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
  nb_array_release(yb), nb_array_release(yl);

  /* saved again: peft's tensors bit for bit, the config's regex naming the modules */
  char dir[512];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "peft");
  CHECK_OK(ctx, nb_pt_lora_save_peft(ctx, dir, &lc, ad, "peft_base"));
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
  if (yl || true) {
    nb_array *y = l ? logits(ctx, &m, ad, l, tok) : NULL;
    snprintf(p, sizeof p, "%s/nabla_logits.json", dir);
    FILE *f = y ? fopen(p, "w") : NULL;
    if (f) {
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
    nb_array_release(y);
  }
  if (getenv("NABLA_KEEP_PEFT_EXPORT")) fprintf(stderr, "export left in %s\n", dir);
  else nb_test_rm_rf(dir);

  /* refusals */
  nb_tree *wrong = nb_tree_copy(m.params);
  nb_array *small = nb_array_zeros(ctx, NB_F32, 2, (int64_t[2]){16, 32});
  nb_tree_set_array(wrong, "layers/0/attn/wq/kernel", small);
  nb_array_release(small);
  nb_pt_lora_config c2;
  CHECK(!nb_pt_lora_load_peft(ctx, GOLDEN "peft_adapter", wrong, &c2));
  CHECK_ERR(ctx, NB_ERR_SHAPE, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': [4, 16] wanted");
  nb_tree_destroy(wrong);
  CHECK(!nb_pt_lora_load_peft(ctx, GOLDEN "no_such_adapter", m.params, &c2));
  CHECK_ERR(ctx, NB_ERR_IO, "no_such_adapter/adapter_config.json");
  nb_tree *odd = nb_tree_create(ctx);
  nb_tree_set_array(odd, "embed/lora_a", nb_tree_get_array(ad, "layers/0/attn/wq/lora_a"));
  CHECK(nb_pt_lora_save_peft(ctx, "/tmp", &lc, odd, NULL) != NB_OK);
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

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_against_peft(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_peft");
}
