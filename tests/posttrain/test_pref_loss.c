/* Preference losses (DPO sigmoid, cDPO, IPO, hinge; ORPO) against TRL's
 * (tests/posttrain/golden/pref_losses.json, made by make_pref_goldens.py
 * from trl 1.16's loss code on torch, f64): loss, rewards, accuracy,
 * margin, sequence log-probs and the gradient w.r.t. the policy logits, in
 * f64 (to 1e-11; ORPO 1e-6: TRL computes its odds ratio in f32) and f32 (to
 * 2e-5, relative to 1 + |value|: f32 rounding of sums over T*V terms); the reference log-probs given precomputed or from
 * the reference logits in the same graph; compiled == interpreted;
 * gradients against finite differences in f64; stability at huge logits;
 * bad options and shapes refused by name. */
#include <math.h>
#include <string.h>

#include "jitcheck.h"
#include "json_golden.h"
#include "nabla/posttrain.h"

typedef struct job {
  nb_pt_pref_opts o;
  bool ref_in_graph;  /* ref_logps from "ref_logits" (a frozen reference model's), not the batch */
  bool loss_only;
  nb_array *ref_const; /* ref_logps as a constant of the graph (finite differences hold it fixed) */
} job;

static nb_status pref_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const job *j = u;
  nb_val *logits = nb_tree_get_val(in, "logits"), *targets = nb_tree_get_val(in, "targets");
  nb_val *mask = nb_tree_get_val(in, "mask"), *ref = nb_tree_get_val(in, "ref_logps");
  if (j->ref_const) ref = nb_const(g, j->ref_const);
  if (j->ref_in_graph) ref = nb_pt_seq_logps(nb_tree_get_val(in, "ref_logits"), targets, mask, false);
  nb_pt_pref_in pi = {.logits = logits, .targets = targets, .mask = mask, .valid = nb_tree_get_val(in, "valid"),
                      .ref_logps = j->o.loss_type == NB_PT_PREF_ORPO ? NULL : ref};
  nb_pt_pref_out po;
  nb_status s = nb_pt_pref_loss(&j->o, &pi, &po);
  if (s) return s;
  s = nb_tree_set_val(out, "loss", po.loss);
  if (j->loss_only) return s;
  struct { const char *name; nb_val *v; } outs[] = {
      {"chosen_rewards", po.chosen_rewards}, {"rejected_rewards", po.rejected_rewards}, {"accuracy", po.accuracy},
      {"margin", po.margin}, {"chosen_logps", po.chosen_logps}, {"rejected_logps", po.rejected_logps},
      {"nll", po.nll}, {"log_odds_ratio", po.log_odds_ratio}, {"log_odds", po.log_odds}};
  for (size_t i = 0; !s && i < sizeof outs / sizeof *outs; i++)
    if (outs[i].v) s = nb_tree_set_val(out, outs[i].name, outs[i].v);
  return s;
}

static nb_array *as(nb_ctx *ctx, nb_array *a, nb_dtype t) {
  nb_array *r = nb_array_astype(ctx, a, t);
  nb_array_release(a);
  return r;
}

static nb_tree *golden_inputs(nb_ctx *ctx, const cJSON *inputs, nb_dtype t) {
  nb_tree *in = nb_tree_create(ctx);
  const char *floats[] = {"logits", "ref_logits", "mask", "valid", "ref_logps"};
  for (int i = 0; i < 5; i++) {
    nb_array *a = as(ctx, nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, floats[i])), t);
    nb_tree_set_array(in, floats[i], a);
    nb_array_release(a);
  }
  nb_array *y = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, "targets"));
  nb_tree_set_array(in, "targets", y);
  nb_array_release(y);
  return in;
}

/* got (a scalar or array of out) against the case's number or array */
static void check_value(nb_ctx *ctx, const char *what, const nb_tree *out, const cJSON *c, const char *name, nb_dtype t,
                        double tol) {
  const cJSON *w = cJSON_GetObjectItem(c, name);
  nb_array *got = nb_tree_get_array(out, name);
  CHECK_MSG(got && w, "%s: %s missing", what, name);
  if (!got || !w) return;
  if (cJSON_IsNumber(w)) {
    double g = nb_array_get(got, 0), e = w->valuedouble;
    CHECK_MSG(fabs(g - e) <= tol * (1 + fabs(e)), "%s %s: %.17g, TRL %.17g", what, name, g, e);
    return;
  }
  nb_array *want = as(ctx, nb_test_golden_array(ctx, w), t);
  char label[128];
  snprintf(label, sizeof label, "%s %s", what, name);
  CHECK_MSG(want && nb_test_arrays_close(label, got, want, tol), "%s", label);
  nb_array_release(want);
}

static const char *const case_names[] = {"sigmoid", "cdpo", "ipo", "hinge", "orpo"};

static job case_job(const cJSON *c, const char *name) {
  job j = {.o = {.loss_type = !strcmp(name, "ipo") ? NB_PT_PREF_IPO : !strcmp(name, "hinge") ? NB_PT_PREF_HINGE
                              : !strcmp(name, "orpo") ? NB_PT_PREF_ORPO : NB_PT_PREF_SIGMOID}};
  const cJSON *v;
  if ((v = cJSON_GetObjectItem(c, "beta"))) j.o.beta = v->valuedouble;
  if ((v = cJSON_GetObjectItem(c, "label_smoothing"))) j.o.label_smoothing = v->valuedouble;
  if ((v = cJSON_GetObjectItem(c, "orpo_lambda"))) j.o.orpo_lambda = v->valuedouble;
  return j;
}

static void test_goldens(nb_ctx *ctx) {
  cJSON *gj = nb_test_golden_load("tests/posttrain/golden/pref_losses.json");
  CHECK(gj != NULL);
  if (!gj) return;
  const cJSON *inputs = cJSON_GetObjectItem(gj, "inputs"), *cases = cJSON_GetObjectItem(gj, "cases");
  nb_dtype dts[2] = {NB_F64, NB_F32};
  for (int d = 0; d < 2; d++) {
    double tol = dts[d] == NB_F64 ? 1e-11 : 2e-5;
    nb_tree *in = golden_inputs(ctx, inputs, dts[d]);
    for (size_t ci = 0; ci < sizeof case_names / sizeof *case_names; ci++) {
      const cJSON *c = cJSON_GetObjectItem(cases, case_names[ci]);
      CHECK_MSG(c, "golden lacks %s", case_names[ci]);
      if (!c) continue;
      /* TRL's odds_ratio_loss computes in f32 (.float()) whatever the input, so ORPO's goldens hold f32
       * rounding: 1e-6 there */
      double ctol = !strcmp(case_names[ci], "orpo") && dts[d] == NB_F64 ? 1e-6 : tol;
      for (int ref_in_graph = 0; ref_in_graph < 2; ref_in_graph++) {
        job j = case_job(c, case_names[ci]);
        j.ref_in_graph = ref_in_graph;
        char what[96];
        snprintf(what, sizeof what, "%s %s ref %s", case_names[ci], nb_dtype_name(dts[d]),
                 ref_in_graph ? "model" : "precomputed");
        nb_graph *g = nb_trace(ctx, pref_fn, &j, in);
        nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "logits", .has_aux = true}) : NULL;
        nb_tree *out = nb_tree_create(ctx), *aux = nb_tree_create(ctx);
        CHECK_MSG(vg && nb_graph_run(ctx, vg, in, out) == NB_OK, "%s: %s", what, nb_ctx_error(ctx));
        for (size_t i = 0; i < nb_tree_size(out); i++) { /* "aux/<name>" as "<name>" */
          const char *p = nb_tree_path(out, i);
          nb_tree_set_array(aux, strncmp(p, "aux/", 4) ? p : p + 4, nb_tree_leaf(out, i)->array);
        }
        const char *names[] = {"loss", "chosen_rewards", "rejected_rewards", "accuracy", "margin", "chosen_logps",
                               "rejected_logps", "nll", "log_odds_ratio", "log_odds"};
        for (int k = 0; k < 10; k++)
          if (cJSON_GetObjectItem(c, names[k])) check_value(ctx, what, aux, c, names[k], dts[d], ctol);
        nb_array *gwant = as(ctx, nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "grad")), dts[d]);
        nb_array *ggot = nb_tree_get_array(out, "grad/logits");
        snprintf(what + strlen(what), sizeof what - strlen(what), " grad");
        CHECK_MSG(ggot && gwant && nb_test_arrays_close(what, ggot, gwant, ctol), "%s", what);
        if (!ref_in_graph && dts[d] == NB_F32) { /* the compiled step computes what the interpreter does */
          nb_jit_opts jo = nb_test_jit_opts(NULL);
          CHECK(nb_test_jit_matches(ctx, vg, in, &jo, what, NULL));
        }
        nb_array_release(gwant);
        nb_tree_destroy(out);
        nb_tree_destroy(aux);
        nb_graph_destroy(g);
        nb_graph_destroy(vg);
      }
    }
    nb_tree_destroy(in);
  }
  cJSON_Delete(gj);
}

/* Finite differences (f64) of each loss w.r.t. the logits, at random inputs
 * (mask and valid as bools and the reference log-probs a constant: only the
 * logits are perturbed). */
static void test_finite_differences(nb_ctx *ctx) {
  nb_test_rng rng = {7};
  int64_t N = 4, T = 5, V = 4, dl[3] = {N, T, V}, dt[2] = {N, T};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "logits", NB_F64, 3, dl);
  nb_array *ref = nb_test_randn(ctx, &rng, NB_F64, 1, &N);
  nb_array *y = nb_test_randint(ctx, &rng, NB_I32, 2, dt, 0, V - 1);
  double mv[20] = {0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1};
  double vv[20] = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  nb_array *m = nb_array_from_f64(ctx, NB_BOOL, 2, dt, mv), *va = nb_array_from_f64(ctx, NB_BOOL, 2, dt, vv);
  nb_tree_set_array(in, "targets", y);
  nb_tree_set_array(in, "mask", m);
  nb_tree_set_array(in, "valid", va);
  struct { const char *name; nb_pt_pref_opts o; bool second; } cases[] = {
      {"sigmoid", {NB_PT_PREF_SIGMOID, 0.7, 0, 0}, true}, {"cdpo", {NB_PT_PREF_SIGMOID, 0.7, 0.2, 0}, true},
      {"ipo", {NB_PT_PREF_IPO, 0.3, 0, 0}, true},         {"hinge", {NB_PT_PREF_HINGE, 0.2, 0, 0}, false},
      {"orpo", {NB_PT_PREF_ORPO, 0, 0, 0.5}, true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    job j = {.o = cases[i].o, .loss_only = true, .ref_const = ref};
    CHECK_MSG(nb_test_check_grads(ctx, cases[i].name, pref_fn, &j, in, 1e-6, cases[i].second), "%s finite differences",
              cases[i].name);
  }
  nb_array_release(ref);
  nb_array_release(y);
  nb_array_release(m);
  nb_array_release(va);
  nb_tree_destroy(in);
}

/* A policy far more (or less) sure than its reference, logits of +-1e4 and
 * ORPO completions of probability ~1 (log-prob ~ -1e-30): finite losses and
 * gradients, in f32. */
static void test_extremes(nb_ctx *ctx) {
  int64_t N = 2, T = 2, V = 3, dl[3] = {N, T, V}, dt[2] = {N, T};
  double lv[12] = {1e4, -1e4, 0, 80, 0, 0, -1e4, 1e4, 0, 0, 0, 90};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_from_f64(ctx, NB_F32, 3, dl, lv);
  nb_array *y = nb_array_from_f64(ctx, NB_I32, 2, dt, (double[]){0, 0, 0, 2});
  nb_array *m = nb_array_from_f64(ctx, NB_F32, 2, dt, (double[]){1, 1, 1, 1});
  nb_array *r = nb_array_from_f64(ctx, NB_F32, 1, &N, (double[]){-3e4, 0});
  nb_tree_set_array(in, "logits", x);
  nb_tree_set_array(in, "targets", y);
  nb_tree_set_array(in, "mask", m);
  nb_tree_set_array(in, "ref_logps", r);
  for (int t = 0; t < NB_PT_PREF_COUNT; t++) {
    job j = {.o = {(nb_pt_pref_loss_type)t, 0.5, 0, 0.5}, .loss_only = true};
    nb_graph *g = nb_trace(ctx, pref_fn, &j, in);
    nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "logits"}) : NULL;
    nb_tree *out = nb_tree_create(ctx);
    CHECK_MSG(vg && nb_graph_run(ctx, vg, in, out) == NB_OK, "%s: %s", nb_pt_pref_loss_name(t), nb_ctx_error(ctx));
    nb_array *gx = nb_tree_get_array(out, "grad/logits");
    double l = out ? nb_array_get(nb_tree_get_array(out, "loss"), 0) : NAN;
    CHECK_MSG(isfinite(l), "%s loss at extreme logits: %g", nb_pt_pref_loss_name(t), l);
    for (int i = 0; gx && i < 12; i++)
      CHECK_MSG(isfinite(nb_array_get(gx, i)), "%s grad[%d] at extreme logits", nb_pt_pref_loss_name(t), i);
    nb_tree_destroy(out);
    nb_graph_destroy(g);
    nb_graph_destroy(vg);
  }
  nb_array_release(x);
  nb_array_release(y);
  nb_array_release(m);
  nb_array_release(r);
  nb_tree_destroy(in);
}

static void test_misuse(nb_ctx *ctx) {
  int64_t dl[3] = {3, 2, 4}, dt[2] = {3, 2}, n = 3, dl2[3] = {2, 2, 4}, dt2[2] = {2, 2}, one = 1;
  struct { nb_pt_pref_opts o; int64_t rows; bool ref; nb_status st; const char *msg; } cases[] = {
      {{NB_PT_PREF_SIGMOID, 0.1, 0, 0}, 3, true, NB_ERR_SHAPE, "[2B, T, V]"},
      {{NB_PT_PREF_SIGMOID, 0, 0, 0}, 2, true, NB_ERR_INVALID_ARG, "beta must be > 0"},
      {{NB_PT_PREF_SIGMOID, 0.1, 0.5, 0}, 2, true, NB_ERR_INVALID_ARG, "label_smoothing must be in [0, 0.5)"},
      {{NB_PT_PREF_IPO, 0.1, 0.1, 0}, 2, true, NB_ERR_INVALID_ARG, "applies to loss_type sigmoid only"},
      {{NB_PT_PREF_ORPO, 0.1, 0, 0}, 2, false, NB_ERR_INVALID_ARG, "orpo_lambda must be > 0"},
      {{NB_PT_PREF_HINGE, 0.1, 0, 0}, 2, false, NB_ERR_INVALID_ARG, "needs the reference log-probs"},
      {{(nb_pt_pref_loss_type)9, 0.1, 0, 0}, 2, true, NB_ERR_INVALID_ARG, "loss_type 9"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    nb_tree *in = nb_tree_create(ctx);
    nb_array *x = nb_array_zeros(ctx, NB_F32, 3, cases[i].rows == 3 ? dl : dl2);
    nb_array *y = nb_array_zeros(ctx, NB_I32, 2, cases[i].rows == 3 ? dt : dt2);
    nb_array *m = nb_array_zeros(ctx, NB_F32, 2, cases[i].rows == 3 ? dt : dt2);
    nb_array *r = nb_array_zeros(ctx, NB_F32, 1, cases[i].rows == 3 ? &n : (int64_t[]){2});
    nb_tree_set_array(in, "logits", x);
    nb_tree_set_array(in, "targets", y);
    nb_tree_set_array(in, "mask", m);
    if (cases[i].ref) nb_tree_set_array(in, "ref_logps", r);
    job j = {.o = cases[i].o, .loss_only = true};
    CHECK(nb_trace(ctx, pref_fn, &j, in) == NULL);
    CHECK_ERR(ctx, cases[i].st, cases[i].msg);
    nb_array_release(x);
    nb_array_release(y);
    nb_array_release(m);
    nb_array_release(r);
    nb_tree_destroy(in);
  }
  /* targets of the wrong shape or dtype */
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_zeros(ctx, NB_F32, 3, dl2), *yf = nb_array_zeros(ctx, NB_F32, 2, dt2);
  nb_array *y1 = nb_array_zeros(ctx, NB_I32, 1, &one), *m = nb_array_zeros(ctx, NB_F32, 2, dt2);
  nb_array *r = nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){2});
  nb_tree_set_array(in, "logits", x);
  nb_tree_set_array(in, "mask", m);
  nb_tree_set_array(in, "ref_logps", r);
  job j = {.o = {NB_PT_PREF_SIGMOID, 0.1, 0, 0}, .loss_only = true};
  nb_tree_set_array(in, "targets", yf);
  CHECK(nb_trace(ctx, pref_fn, &j, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_DTYPE, "targets must be integers");
  nb_tree_set_array(in, "targets", y1);
  CHECK(nb_trace(ctx, pref_fn, &j, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "without the vocabulary axis");
  nb_array_release(x);
  nb_array_release(yf);
  nb_array_release(y1);
  nb_array_release(m);
  nb_array_release(r);
  nb_tree_destroy(in);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_goldens(ctx);
  test_finite_differences(ctx);
  test_extremes(ctx);
  test_misuse(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_pref_loss");
}
