/* GRPO's rewards and config: the built-ins (exact after a pattern, format,
 * length) on hand-made completions, weights and NaN ("no score") in the
 * sum, a callback beside them, the grpo: section from YAML (a list of
 * rewards) and overrides, written back and read again, and bad input
 * refused with the field named. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "primcheck.h"
#include "testfs.h"
#include "nabla/posttrain.h"

static nb_pt_reward_in row(const char *completion, int64_t n, const char *answer) {
  static const char *keys[1] = {"answer"};
  static const char *vals[1];
  vals[0] = answer;
  return (nb_pt_reward_in){.prompt = "12+7=", .completion = completion, .n_completion = n, .n_fields = answer ? 1 : 0,
                           .keys = keys, .values = vals};
}

static double count_sevens(void *ud, const nb_pt_reward_in *in) {
  (*(int *)ud)++;
  double n = 0;
  for (const char *p = in->completion; *p; p++) n += *p == '7';
  return n;
}

static void test_builtins(nb_ctx *ctx) {
  nb_pt_reward_spec sp[3] = {{.kind = NB_PT_REWARD_EXACT, .pattern = "^\\s*(-?\\d+)", .weight = 1},
                             {.kind = NB_PT_REWARD_FORMAT, .pattern = "^-?\\d+\\n$", .weight = 0.5},
                             {.kind = NB_PT_REWARD_LENGTH, .target = 3, .scale = 0.1, .weight = 1}};
  nb_pt_rewards *r = nb_pt_rewards_create(ctx, sp, 3, "grpo.rewards");
  CHECK_MSG(r, "%s", nb_ctx_error(ctx));
  if (!r) return;
  CHECK(nb_pt_rewards_count(r) == 3 && !strcmp(nb_pt_rewards_name(r, 0), "exact") && !strcmp(nb_pt_rewards_name(r, 2), "length"));
  double per[4];
  nb_pt_reward_in in = row("19\n", 3, "19");
  double tot = nb_pt_rewards_score(r, &in, per);
  CHECK_MSG(per[0] == 1 && per[1] == 1 && per[2] == 0 && tot == 1.5, "19: %g %g %g = %g", per[0], per[1], per[2], tot);
  in = row(" 19 apples", 10, " 19 ");
  tot = nb_pt_rewards_score(r, &in, per);
  CHECK_MSG(per[0] == 1 && per[1] == 0 && fabs(per[2] + 0.7) < 1e-12 && fabs(tot - 0.3) < 1e-12, "19 apples: %g %g %g", per[0], per[1], per[2]);
  in = row("190\n", 4, "19"); /* the whole number is compared, not a prefix */
  nb_pt_rewards_score(r, &in, per);
  CHECK(per[0] == 0 && per[1] == 1);
  in = row("abc", 3, "19"); /* no match: 0 */
  nb_pt_rewards_score(r, &in, per);
  CHECK(per[0] == 0 && per[1] == 0);
  in = row("19\n", 3, NULL); /* no answer field: exact has no score, the others count */
  tot = nb_pt_rewards_score(r, &in, per);
  CHECK(isnan(per[0]) && tot == 0.5);
  int calls = 0;
  CHECK_OK(ctx, nb_pt_rewards_add(r, "sevens", count_sevens, &calls, 2));
  in = row("77\n", 3, "77");
  tot = nb_pt_rewards_score(r, &in, per);
  CHECK_MSG(calls == 1 && per[3] == 2 && tot == 1 + 0.5 + 0 + 4, "callback: %d calls, %g, total %g", calls, per[3], tot);
  CHECK(nb_pt_rewards_add(r, "sevens", count_sevens, &calls, 1) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'sevens' is already a reward");
  nb_pt_rewards_destroy(r);
  /* whole completion compared without a pattern; another field */
  nb_pt_reward_spec whole = {.kind = NB_PT_REWARD_EXACT, .field = "answer", .weight = 1};
  r = nb_pt_rewards_create(ctx, &whole, 1, NULL);
  in = row(" 19\n", 4, "19");
  CHECK(r && nb_pt_rewards_score(r, &in, NULL) == 1);
  nb_pt_rewards_destroy(r);
  /* refused, by name */
  nb_pt_reward_spec badre = {.kind = NB_PT_REWARD_FORMAT, .pattern = "(\\d+", .weight = 1};
  CHECK(!nb_pt_rewards_create(ctx, &badre, 1, "grpo.rewards"));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "grpo.rewards[0].pattern: '(\\d+': missing closing parenthesis");
  nb_pt_reward_spec nopat = {.kind = NB_PT_REWARD_FORMAT, .weight = 1};
  CHECK(!nb_pt_rewards_create(ctx, &nopat, 1, "grpo.rewards"));
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "grpo.rewards[0].pattern: a format reward needs a pattern");
}

static void test_config(nb_ctx *ctx, const char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/grpo.yaml", dir);
  const char *yaml = "model:\n  preset: llama-tiny\nbatch_size: 4\ngrpo:\n  num_generations: 4\n  beta: 0.04\n"
                     "  loss_type: grpo\n  rewards:\n    - kind: exact\n      pattern: '=\\s*(-?\\d+)'\n    - {kind: length, target: 2, scale: 0.5, weight: 0.25}\n";
  nb_test_write_text(path, yaml);
  nb_pt_grpo_config gc;
  nb_train_config tc;
  const char *ov[2] = {"grpo.rewards.1.weight=0.5", "steps=7"};
  CHECK_OK(ctx, nb_pt_grpo_config_load(ctx, path, 2, ov, &gc, &tc));
  CHECK(gc.num_generations == 4 && gc.loss.beta == 0.04 && gc.loss.loss_type == NB_PT_GRPO_GRPO && gc.n_rewards == 2);
  CHECK(gc.rewards[0].kind == NB_PT_REWARD_EXACT && !strcmp(gc.rewards[0].pattern, "=\\s*(-?\\d+)") && gc.rewards[0].weight == 1);
  CHECK(gc.rewards[1].kind == NB_PT_REWARD_LENGTH && gc.rewards[1].target == 2 && gc.rewards[1].weight == 0.5 && tc.steps == 7);
  /* written and read back: the same config */
  snprintf(path, sizeof path, "%s/back.yaml", dir);
  FILE *f = fopen(path, "w");
  nb_train_config_write(&tc, f);
  nb_pt_grpo_config_write(&gc, f);
  fclose(f);
  nb_pt_grpo_config g2;
  nb_train_config t2;
  CHECK_OK(ctx, nb_pt_grpo_config_load(ctx, path, 0, NULL, &g2, &t2));
  CHECK(!memcmp(&gc, &g2, sizeof gc));
  nb_train_config t3; /* the trainer alone skips the grpo: section (a run dir loads for generate, serve) */
  CHECK_OK(ctx, nb_train_config_load(ctx, path, 0, NULL, &t3));
  /* bad keys and values, by name */
  struct { const char *ov, *msg; } bad[] = {
      {"grpo.rewards.0.kind=fuzzy", "grpo.rewards.0.kind: 'fuzzy' is not one of exact, format, length"},
      {"grpo.rewards.0.pattern=(x", "grpo.rewards[0].pattern: '(x': missing closing parenthesis"},
      {"grpo.rewards.5.kind=exact", "grpo.rewards.2 is not set yet"},
      {"grpo.loss_type=ppo", "grpo.loss_type: 'ppo' is not one of grpo, bnpo, dr_grpo, dapo"},
      {"grpo.num_generations=0", "grpo.num_generations"},
      {"grpo.gamma=1", "unknown key 'grpo.gamma'"},
      {"lora.rank=0", "lora.rank"}, {"lora.targt=x", "unknown key 'lora.targt'"}, {"lora.target=(", "lora.target: '('"}};
  snprintf(path, sizeof path, "%s/grpo.yaml", dir);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK(nb_pt_grpo_config_load(ctx, path, 1, &bad[i].ov, &gc, &tc) != NB_OK);
    CHECK_MSG(strstr(nb_ctx_error(ctx), bad[i].msg), "%s: %s", bad[i].ov, nb_ctx_error(ctx));
  }
  nb_test_write_text(path, "grpo:\n  rewards:\n    - exact\n");
  CHECK(nb_pt_grpo_config_load(ctx, path, 0, NULL, &gc, &tc) != NB_OK);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "grpo.yaml:3: grpo.rewards.0: each item of 'grpo.rewards' must be a mapping"), "%s", nb_ctx_error(ctx));
  nb_test_write_text(path, "grpo:\n  beta: 0.1\n");
  CHECK(nb_pt_grpo_config_load(ctx, path, 0, NULL, &gc, &tc) != NB_OK);
  CHECK_MSG(strstr(nb_ctx_error(ctx), "grpo.rewards: none given"), "%s", nb_ctx_error(ctx));
}

int main(void) {
  char dir[512];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "grpo_reward");
  nb_ctx *ctx = nb_ctx_create();
  test_builtins(ctx);
  test_config(ctx, dir);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(dir);
  return nb_test_summary("posttrain/test_grpo_reward");
}
