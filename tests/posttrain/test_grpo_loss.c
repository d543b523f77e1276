/* The GRPO loss (grpo, bnpo, dr_grpo, dapo; clipped ratio against the
 * rollout policy, asymmetric clipping, k3 KL) and the group-normalized
 * advantages against TRL's (tests/posttrain/golden/grpo_losses.json, made
 * by make_grpo_goldens.py from trl 1.16's code on torch, f64): advantages,
 * loss, KL and clip fractions and the gradient w.r.t. the policy logits, in
 * f64 (1e-11; the clip fractions are TRL's f32 means: 1e-7) and f32 (2e-5);
 * compiled == interpreted; gradients against finite differences in f64;
 * bad options and shapes refused by name. */
#include <math.h>
#include <string.h>

#include "jitcheck.h"
#include "json_golden.h"
#include "nabla/posttrain.h"

typedef struct job {
  nb_pt_grpo_opts o;
  bool loss_only;
  bool no_old;          /* old_logps NULL: the policy's own, gradient stopped */
  nb_array *old_const, *ref_const, *adv_const; /* constants of the graph (finite differences hold them fixed) */
} job;

static nb_status grpo_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const job *j = u;
  nb_pt_grpo_in gi = {.logits = nb_tree_get_val(in, "logits"), .targets = nb_tree_get_val(in, "targets"),
                      .mask = nb_tree_get_val(in, "mask"), .old_logps = nb_tree_get_val(in, "old_logps"),
                      .ref_logps = nb_tree_get_val(in, "ref_logps"), .advantages = nb_tree_get_val(in, "advantages")};
  if (j->old_const) gi.old_logps = nb_const(g, j->old_const);
  if (j->ref_const) gi.ref_logps = nb_const(g, j->ref_const);
  if (j->adv_const) gi.advantages = nb_const(g, j->adv_const);
  if (j->no_old) gi.old_logps = NULL;
  nb_pt_grpo_out go;
  nb_status s = nb_pt_grpo_loss(&j->o, &gi, &go);
  if (s) return s;
  s = nb_tree_set_val(out, "loss", go.loss);
  if (j->loss_only) return s;
  if (!s && go.kl) s = nb_tree_set_val(out, "kl", go.kl);
  if (!s) s = nb_tree_set_val(out, "clip_low", go.clip_low);
  if (!s) s = nb_tree_set_val(out, "clip_high", go.clip_high);
  if (!s) s = nb_tree_set_val(out, "clip_region", go.clip_region);
  return s;
}

static nb_array *as(nb_ctx *ctx, nb_array *a, nb_dtype t) {
  nb_array *r = nb_array_astype(ctx, a, t);
  nb_array_release(a);
  return r;
}

static nb_pt_grpo_loss_type type_of(const char *name) {
  for (int t = 0; t < NB_PT_GRPO_LOSS_COUNT; t++)
    if (!strcmp(name, nb_pt_grpo_loss_name((nb_pt_grpo_loss_type)t))) return (nb_pt_grpo_loss_type)t;
  return NB_PT_GRPO_LOSS_COUNT;
}

static void test_goldens(nb_ctx *ctx) {
  cJSON *gj = nb_test_golden_load("tests/posttrain/golden/grpo_losses.json");
  CHECK(gj != NULL);
  if (!gj) return;
  const cJSON *inputs = cJSON_GetObjectItem(gj, "inputs"), *cases = cJSON_GetObjectItem(gj, "cases");
  int64_t G = (int64_t)cJSON_GetObjectItem(inputs, "group_size")->valuedouble;
  nb_array *rw = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, "rewards"));
  const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(inputs, "mask"), "shape");
  int64_t N = nb_array_size(rw), T = (int64_t)cJSON_GetArrayItem(mj, 1)->valuedouble;
  const char *names[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = d ? NB_F32 : NB_F64;
    double tol = d ? 2e-5 : 1e-11;
    nb_tree *in = nb_tree_create(ctx);
    const char *floats[] = {"logits", "mask", "old_logps", "ref_logps"};
    for (int i = 0; i < 4; i++) {
      nb_array *a = as(ctx, nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, floats[i])), dt);
      nb_tree_set_array(in, floats[i], a);
      nb_array_release(a);
    }
    nb_array *y = nb_test_golden_array(ctx, cJSON_GetObjectItem(inputs, "tokens"));
    nb_tree_set_array(in, "targets", y);
    nb_array_release(y);
    for (int ci = 0; ci < 4; ci++) {
      const cJSON *c = cJSON_GetObjectItem(cases, names[ci]);
      CHECK_MSG(c, "golden lacks %s", names[ci]);
      if (!c) continue;
      /* the advantages, on the host, against TRL's */
      double r[64], adv[64];
      for (int64_t i = 0; i < N; i++) r[i] = nb_array_get(rw, i);
      bool scale = strcmp(cJSON_GetObjectItem(c, "scale_rewards")->valuestring, "none") != 0;
      nb_pt_grpo_advantages(r, N / G, G, scale, adv, NULL);
      nb_array *want_adv = nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "advantages"));
      double worst = 0;
      for (int64_t i = 0; i < N; i++) worst = fmax(worst, fabs(adv[i] - nb_array_get(want_adv, i)));
      CHECK_MSG(worst <= 1e-12, "%s advantages: worst difference %g", names[ci], worst);
      nb_array *a = nb_array_from_f64(ctx, dt, 1, &N, adv);
      nb_tree_set_array(in, "advantages", a);
      nb_array_release(a);
      nb_array_release(want_adv);
      job j = {.o = {.loss_type = type_of(names[ci]), .epsilon_low = cJSON_GetObjectItem(c, "epsilon_low")->valuedouble,
                     .epsilon_high = cJSON_GetObjectItem(c, "epsilon_high")->valuedouble,
                     .beta = cJSON_GetObjectItem(c, "beta")->valuedouble, .max_completion_length = T}};
      char what[96];
      snprintf(what, sizeof what, "%s %s", names[ci], nb_dtype_name(dt));
      nb_graph *g = nb_trace(ctx, grpo_fn, &j, in);
      nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "logits", .has_aux = true}) : NULL;
      nb_tree *out = nb_tree_create(ctx);
      CHECK_MSG(vg && nb_graph_run(ctx, vg, in, out) == NB_OK, "%s: %s", what, nb_ctx_error(ctx));
      struct { const char *name, *out; double tol; } sc[] = {{"loss", "loss", tol}, {"kl", "aux/kl", tol},
                                                              {"clip_low", "aux/clip_low", 1e-7}, {"clip_high", "aux/clip_high", 1e-7},
                                                              {"clip_region", "aux/clip_region", 1e-7}};
      for (int k = 0; k < 5; k++) {
        const cJSON *w = cJSON_GetObjectItem(c, sc[k].name);
        nb_array *got = nb_tree_get_array(out, sc[k].out);
        CHECK_MSG(!w == !got, "%s %s: present in one side only", what, sc[k].name);
        if (!w || !got) continue;
        double gv = nb_array_get(got, 0), ev = w->valuedouble;
        CHECK_MSG(fabs(gv - ev) <= fmax(sc[k].tol, tol) * (1 + fabs(ev)), "%s %s: %.17g, TRL %.17g", what, sc[k].name, gv, ev);
      }
      nb_array *gwant = as(ctx, nb_test_golden_array(ctx, cJSON_GetObjectItem(c, "grad")), dt);
      snprintf(what + strlen(what), sizeof what - strlen(what), " grad");
      nb_array *ggot = nb_tree_get_array(out, "grad/logits");
      CHECK_MSG(ggot && gwant && nb_test_arrays_close(what, ggot, gwant, tol), "%s", what);
      if (d) { /* the compiled step computes what the interpreter does */
        nb_jit_opts jo = nb_test_jit_opts(NULL);
        CHECK(nb_test_jit_matches(ctx, vg, in, &jo, what, NULL));
      }
      nb_array_release(gwant);
      nb_tree_destroy(out);
      nb_graph_destroy(g);
      nb_graph_destroy(vg);
    }
    nb_tree_destroy(in);
  }
  nb_array_release(rw);
  cJSON_Delete(gj);
}

static nb_status lp_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  (void)g, (void)u;
  return nb_tree_set_val(out, "lp", nb_pt_token_logps(nb_tree_get_val(in, "logits"), nb_tree_get_val(in, "targets")));
}

/* Finite differences (f64) of each loss w.r.t. the logits at random inputs:
 * old, ref and advantages are constants (the mask a bool), so only the
 * logits move. The on-policy form (old NULL: the policy's own log-probs,
 * gradient stopped) has a ratio of 1 whatever the logits, which finite
 * differences cannot see through: its gradient is checked against the
 * same loss with old given as the policy's log-probs, a constant. */
static void test_finite_differences(nb_ctx *ctx) {
  nb_test_rng rng = {11};
  int64_t N = 4, T = 5, V = 4, dl[3] = {N, T, V}, dt[2] = {N, T};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "logits", NB_F64, 3, dl);
  nb_array *y = nb_test_randint(ctx, &rng, NB_I32, 2, dt, 0, V - 1);
  double mv[20] = {1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  nb_array *m = nb_array_from_f64(ctx, NB_BOOL, 2, dt, mv); /* bool: only the logits are perturbed */
  nb_tree_set_array(in, "targets", y);
  nb_tree_set_array(in, "mask", m);
  nb_array *old = nb_test_randn(ctx, &rng, NB_F64, 2, dt), *ref = nb_test_randn(ctx, &rng, NB_F64, 2, dt);
  double av[4] = {1.3, -0.7, 0.2, -1.1};
  nb_array *adv = nb_array_from_f64(ctx, NB_F64, 1, &N, av);
  struct { const char *name; nb_pt_grpo_opts o; bool no_old; } cases[] = {
      {"grpo", {NB_PT_GRPO_GRPO, 0.2, 0.2, 0.04, 5}, false}, {"bnpo", {NB_PT_GRPO_BNPO, 0.2, 0.2, 0.1, 5}, false},
      {"dr_grpo", {NB_PT_GRPO_DR_GRPO, 0.2, 0.2, 0, 7}, false}, {"dapo", {NB_PT_GRPO_DAPO, 0.2, 0.28, 0.3, 5}, false}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    job j = {.o = cases[i].o, .loss_only = true, .no_old = cases[i].no_old, .old_const = old, .ref_const = ref, .adv_const = adv};
    CHECK_MSG(nb_test_check_grads(ctx, cases[i].name, grpo_fn, &j, in, 1e-6, false), "%s finite differences", cases[i].name);
  }
  /* on-policy: the gradient of old = stop_gradient(lp) is that of old = lp's values as a constant */
  nb_tree *li = nb_tree_create(ctx);
  nb_tree_set_array(li, "logits", nb_tree_get_array(in, "logits"));
  nb_tree_set_array(li, "targets", y);
  nb_array *lp = nb_test_eval_output(ctx, lp_fn, NULL, li, "lp");
  nb_tree_destroy(li);
  nb_array *g[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    job j = {.o = {NB_PT_GRPO_GRPO, 0.2, 0.2, 0.04, 5}, .loss_only = true, .no_old = k == 0, .old_const = lp, .ref_const = ref,
             .adv_const = adv};
    nb_graph *gr = nb_trace(ctx, grpo_fn, &j, in);
    nb_graph *vg = gr ? nb_value_and_grad(ctx, gr, &(nb_grad_opts){.wrt = "logits"}) : NULL;
    nb_tree *out = nb_tree_create(ctx);
    if (vg && !nb_graph_run(ctx, vg, in, out)) g[k] = nb_array_astype(ctx, nb_tree_get_array(out, "grad/logits"), NB_F64);
    nb_tree_destroy(out);
    nb_graph_destroy(gr);
    nb_graph_destroy(vg);
  }
  CHECK_MSG(g[0] && g[1] && nb_test_arrays_close("on-policy grad", g[0], g[1], 1e-12), "on-policy gradient: %s", nb_ctx_error(ctx));
  nb_array_release(g[0]);
  nb_array_release(g[1]);
  nb_array_release(lp);
  nb_array_release(old);
  nb_array_release(ref);
  nb_array_release(adv);
  nb_array_release(y);
  nb_array_release(m);
  nb_tree_destroy(in);
}

static void test_advantages(void) {
  /* a NaN reward (no score) is left out of its group and gets 0; G = 1 has std 0 */
  double r[6] = {1, NAN, 3, 5, 5, 5}, adv[6], sd[6];
  nb_pt_grpo_advantages(r, 2, 3, true, adv, sd);
  CHECK(fabs(adv[0] - (-1 / (sqrt(2.0) + 1e-4))) < 1e-12 && adv[1] == 0 && fabs(adv[2] - 1 / (sqrt(2.0) + 1e-4)) < 1e-12);
  CHECK(adv[3] == 0 && adv[4] == 0 && adv[5] == 0 && sd[3] == 0 && fabs(sd[0] - sqrt(2.0)) < 1e-15);
  double one[2] = {2, 7}, a1[2];
  nb_pt_grpo_advantages(one, 2, 1, true, a1, NULL);
  CHECK(a1[0] == 0 && a1[1] == 0);
}

static void test_misuse(nb_ctx *ctx) {
  int64_t dl[3] = {2, 3, 4}, dt[2] = {2, 3}, n = 2;
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_zeros(ctx, NB_F32, 3, dl), *y = nb_array_zeros(ctx, NB_I32, 2, dt), *m = nb_array_zeros(ctx, NB_F32, 2, dt);
  nb_array *a = nb_array_zeros(ctx, NB_F32, 1, &n), *a3 = nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){3});
  nb_tree_set_array(in, "logits", x);
  nb_tree_set_array(in, "targets", y);
  nb_tree_set_array(in, "mask", m);
  nb_tree_set_array(in, "advantages", a);
  struct { nb_pt_grpo_opts o; nb_status st; const char *msg; } cases[] = {
      {{NB_PT_GRPO_LOSS_COUNT, 0.2, 0.2, 0, 1}, NB_ERR_INVALID_ARG, "not one of grpo, bnpo, dr_grpo, dapo"},
      {{NB_PT_GRPO_GRPO, 1.5, 0.2, 0, 1}, NB_ERR_INVALID_ARG, "epsilon_low must be in [0, 1)"},
      {{NB_PT_GRPO_GRPO, 0.2, -1, 0, 1}, NB_ERR_INVALID_ARG, "epsilon_high must be >= 0"},
      {{NB_PT_GRPO_GRPO, 0.2, 0.2, -0.1, 1}, NB_ERR_INVALID_ARG, "beta must be >= 0"},
      {{NB_PT_GRPO_DR_GRPO, 0.2, 0.2, 0, 0}, NB_ERR_INVALID_ARG, "max_completion_length >= 1"},
      {{NB_PT_GRPO_GRPO, 0.2, 0.2, 0.1, 1}, NB_ERR_INVALID_ARG, "needs the reference's log-probs"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    job j = {.o = cases[i].o, .loss_only = true};
    CHECK(nb_trace(ctx, grpo_fn, &j, in) == NULL);
    CHECK_ERR(ctx, cases[i].st, cases[i].msg);
  }
  job j = {.o = {NB_PT_GRPO_GRPO, 0.2, 0.2, 0, 1}, .loss_only = true};
  nb_tree_set_array(in, "advantages", a3);
  CHECK(nb_trace(ctx, grpo_fn, &j, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "advantages must be [2]");
  nb_tree_set_array(in, "advantages", a);
  nb_tree_set_array(in, "ref_logps", a3);
  j.o.beta = 0.1;
  CHECK(nb_trace(ctx, grpo_fn, &j, in) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "ref_logps must be [2, 3]");
  nb_array_release(x);
  nb_array_release(y);
  nb_array_release(m);
  nb_array_release(a);
  nb_array_release(a3);
  nb_tree_destroy(in);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_goldens(ctx);
  test_finite_differences(ctx);
  test_advantages();
  test_misuse(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_grpo_loss");
}
