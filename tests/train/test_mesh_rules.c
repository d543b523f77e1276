/* mesh.rules in the trainer, in one process (the multi-process runs are
 * tests/dist/train_rules.sh): the key in YAML (block and flow) and as an
 * override, stored canonical and written back; the errors of a config the
 * trainer cannot run, named by rule and leaf (unknown axis, the data axis,
 * a spec longer than a leaf's rank, tensor rules on a leaf that is no
 * linear, a half-split attention, a column linear split by rows, a split
 * row bias, heads that a split attention cannot divide, expert rules other
 * than the MoE layers'); the layout of the optimizer state following its
 * parameters; and nb_train_print_layout. */
#include "test.h"
#include "train/internal.h"

static nb_status parse(nb_ctx *ctx, const char *yaml, int n, const char *const *over, nb_train_config *c) {
  return nb_train_config_parse(ctx, "run.yaml", yaml, strlen(yaml), n, over, c);
}

static void expect_err(nb_ctx *ctx, const char *yaml, int n, const char *const *over, nb_status want, const char *needle) {
  nb_train_config c;
  nb_status s = parse(ctx, yaml, n, over, &c);
  CHECK_MSG(s == want, "wanted %s for '%s' (%s): %s", nb_status_name(want), n ? over[n - 1] : yaml, nb_status_name(s),
            nb_ctx_error(ctx));
  CHECK_ERR(ctx, want, needle);
}

static const char gpt2[] = "model:\n  preset: gpt2-tiny\n";

static void test_key(nb_ctx *ctx) {
  const char *yaml = "model:\n  preset: gpt2-tiny\ngrad_accum: 2\nmesh:\n  fsdp: 2\n  rules:\n"
                     "    - ['.*embed.*', []]\n    - - \".*/kernel\"\n      - [~, fsdp]\n    - ['.*', [fsdp]]\n";
  nb_train_config c, back;
  CHECK_OK(ctx, parse(ctx, yaml, 0, NULL, &c));
  CHECK_MSG(!strcmp(c.mesh.rules, "[[\".*embed.*\", []], [\".*/kernel\", [null, fsdp]], [\".*\", [fsdp]]]"), "%s", c.mesh.rules);
  /* written and read back: the same text */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  nb_train_config_write(&c, f);
  fclose(f);
  CHECK_MSG(strstr(text, "  rules: [[\".*embed.*\", []], [\".*/kernel\", [null, fsdp]], [\".*\", [fsdp]]]\n"), "%s", text);
  CHECK_OK(ctx, nb_train_config_parse(ctx, "written", text, len, 0, NULL, &back));
  CHECK(!strcmp(back.mesh.rules, c.mesh.rules));
  free(text);
  char diff[256];
  nb_train_config_diff(&c, &back, "", diff, sizeof diff);
  CHECK_MSG(!diff[0], "%s", diff);
  /* an override; null is the built-in layout; a quoted "null" is an axis's name (refused: no such axis) */
  const char *over[] = {"grad_accum=2", "mesh.fsdp=2", "mesh.rules=[['layers/.*/kernel', [null, \"fsdp\"]]]"};
  CHECK_OK(ctx, parse(ctx, gpt2, 3, over, &c));
  CHECK_MSG(!strcmp(c.mesh.rules, "[[\"layers/.*/kernel\", [null, fsdp]]]"), "%s", c.mesh.rules);
  nb_train_config_diff(&c, &back, "mesh.", diff, sizeof diff);
  CHECK_MSG(!strcmp(diff, "mesh.rules"), "%s", diff);
  const char *unset[] = {"mesh.rules=null"};
  CHECK_OK(ctx, parse(ctx, "mesh:\n  rules: [['.*', []]]\n", 1, unset, &c));
  CHECK(c.mesh.rules[0] == 0);
  CHECK_OK(ctx, parse(ctx, "mesh:\n  rules:\n", 0, NULL, &c));
  CHECK(c.mesh.rules[0] == 0);
  CHECK_OK(ctx, parse(ctx, "mesh:\n  rules: []\n", 0, NULL, &c)); /* every leaf whole: not the built-in layout */
  CHECK(!strcmp(c.mesh.rules, "[]"));
  /* rules without a split axis are checked, then split nothing */
  const char *quiet[] = {"mesh.rules=[['.*', [tensor]]]"};
  CHECK_OK(ctx, parse(ctx, gpt2, 1, quiet, &c));
}

static void test_errors(nb_ctx *ctx) {
  expect_err(ctx, "mesh:\n  rules:\n    - {path: '.*', spec: [fsdp]}\n", 0, NULL, NB_ERR_INVALID_ARG,
             "run.yaml:2: mesh.rules[0]: a [regex, [axis|null, ...]] pair wanted, not a mapping");
  expect_err(ctx, "mesh:\n  rules: fsdp\n", 0, NULL, NB_ERR_INVALID_ARG,
             "run.yaml:2: mesh.rules: a list of [regex, [axis|null, ...]] pairs wanted");
  const char *bad_yaml[] = {"mesh.rules=[['.*', [fsdp]]"};
  expect_err(ctx, gpt2, 1, bad_yaml, NB_ERR_INVALID_ARG, "override 'mesh.rules=[['.*', [fsdp]]': mesh.rules: YAML error");
  const char *regex[] = {"mesh.rules=[['(', []]]"};
  expect_err(ctx, gpt2, 1, regex, NB_ERR_INVALID_ARG, "mesh.rules[0].path: '(': missing closing parenthesis");
  const char *model[] = {"mesh.rules=[['.*embed.*', []], ['.*', [model]]]"};
  expect_err(ctx, gpt2, 1, model, NB_ERR_INVALID_ARG,
             "mesh.rules[1].spec[0]: 'model' is not a mesh axis (data, fsdp, expert, tensor; null: replicated)");
  const char *data[] = {"mesh.rules=[['.*', [data]]]"};
  expect_err(ctx, gpt2, 1, data, NB_ERR_INVALID_ARG, "mesh.rules[0].spec[0]: 'data' splits the batch, not the state");
  const char *longer[] = {"grad_accum=2", "mesh.fsdp=2", "mesh.rules=[['.*', [null, null, fsdp]]]"};
  expect_err(ctx, gpt2, 3, longer, NB_ERR_SHAPE,
             "mesh.rules[0] ('.*': [null, null, fsdp]): 3 dims for 'params/embed/embedding' f32[256,128] of rank 2");
  /* fsdp's built-in rule on a model with a scalar parameter: none here, but the message names the rule */
  /* tensor parallel */
  const char *embed[] = {"mesh.tensor=2", "mesh.rules=[['.*embed.*', [tensor]]]"};
  expect_err(ctx, gpt2, 2, embed, NB_ERR_UNIMPLEMENTED,
             "mesh.tensor: 'embed/embedding' (mesh.rules[0]): split over tensor, but tensor parallelism splits only the "
             "attention's and the MLP's linears");
  const char *half[] = {"mesh.tensor=2", "mesh.rules=[['.*/attn/(wq|wk|wv)/(kernel|bias)', [null, tensor]]]"};
  expect_err(ctx, gpt2, 2, half, NB_ERR_UNIMPLEMENTED, "split over tensor, but 'layers/0/attn/wo/kernel' is whole");
  const char *mixed[] = {"mesh.tensor=2", "mesh.rules=[['.*/attn/wq/kernel', [null, tensor]]]"};
  expect_err(ctx, gpt2, 2, mixed, NB_ERR_UNIMPLEMENTED,
             "mesh.tensor: 'layers/0/attn/wq/kernel' (mesh.rules[0]): split over tensor, but 'layers/0/attn/wq/bias' is "
             "whole: tensor parallelism splits the attention (wq, wk, wv by columns, wo by rows) in every layer or in none");
  const char *layer0[] = {"mesh.tensor=2", "mesh.rules=[['layers/0/mlp/wi/kernel', [null, tensor]], ['layers/0/mlp/wi/bias', "
                                           "[tensor]], ['layers/0/mlp/wo/kernel', [tensor]]]"};
  expect_err(ctx, gpt2, 2, layer0, NB_ERR_UNIMPLEMENTED, "but 'layers/1/mlp/wi/kernel' is whole");
  const char *rows[] = {"mesh.tensor=2", "mesh.rules=[['.*/mlp/wi/kernel', [tensor]]]"};
  expect_err(ctx, gpt2, 2, rows, NB_ERR_UNIMPLEMENTED, "'layers/0/mlp/wi/kernel' (mesh.rules[0]): a column-parallel linear");
  const char *wo[] = {"mesh.tensor=2", "mesh.rules=[['.*/mlp/wo/kernel', [null, tensor]]]"};
  expect_err(ctx, gpt2, 2, wo, NB_ERR_UNIMPLEMENTED, "a row-parallel kernel is split along d_in (dim 0: [tensor]) or not at all");
  const char *bias[] = {"mesh.tensor=2", "mesh.rules=[['.*/attn/wo/bias', [tensor]]]"};
  expect_err(ctx, gpt2, 2, bias, NB_ERR_UNIMPLEMENTED, "'layers/0/attn/wo/bias' (mesh.rules[0]): a row-parallel linear's bias");
  /* the MLP alone: 3 heads are fine, d_ff must divide; attention dropout is fine with the attention whole */
  const char *mlp_rules = "mesh.rules=[['.*/mlp/wi/(kernel|bias)', [null, tensor]], ['.*/mlp/wi/bias', [tensor]], "
                          "['.*/mlp/wo/kernel', [tensor]]]";
  const char *kernel_first[] = {"mesh.tensor=2", mlp_rules};
  expect_err(ctx, gpt2, 2, kernel_first, NB_ERR_SHAPE, "2 dims for 'params/layers/0/mlp/wi/bias' f32[512] of rank 1");
  const char *mlp = "mesh.rules=[['.*/mlp/wi/kernel', [null, tensor]], ['.*/mlp/wi/bias', [tensor]], ['.*/mlp/wo/kernel', [tensor]]]";
  const char *odd_heads[] = {"model.n_heads=3", "model.n_kv_heads=3", "model.d_model=96", "mesh.tensor=2", "model.attn_dropout=0.1", mlp};
  nb_train_config c;
  CHECK_OK(ctx, parse(ctx, gpt2, 6, odd_heads, &c));
  const char *odd_ff[] = {"model.d_ff=510", "mesh.tensor=4", mlp};
  expect_err(ctx, gpt2, 3, odd_ff, NB_ERR_INVALID_ARG, "mesh.tensor=4 must divide model.d_ff (510): each process holds an equal slice");
  const char *heads[] = {"model.n_heads=3", "model.n_kv_heads=3", "model.d_model=96", "mesh.tensor=2"};
  expect_err(ctx, gpt2, 4, heads, NB_ERR_INVALID_ARG, "mesh.tensor=2 must divide model.n_heads (3), model.n_kv_heads (3) and model.d_ff");
  const char *attn_only[] = {"model.n_heads=3", "model.n_kv_heads=3", "model.d_model=96", "mesh.tensor=2",
                             ("mesh.rules=[['.*/attn/(wq|wk|wv)/kernel', [null, tensor]], ['.*/attn/(wq|wk|wv)/bias', [tensor]], "
                              "['.*/attn/wo/kernel', [tensor]]]")};
  expect_err(ctx, gpt2, 5, attn_only, NB_ERR_INVALID_ARG, "mesh.tensor=2 must divide model.n_heads (3) and model.n_kv_heads (3): each "
             "process holds whole heads (the rules split the attention)");
  const char *adrop[] = {"mesh.tensor=2", "model.attn_dropout=0.1"};
  expect_err(ctx, gpt2, 2, adrop, NB_ERR_UNIMPLEMENTED, "model.attn_dropout > 0 and the attention split");
  /* expert parallel: the MoE layers hold their experts' rows, nothing else over expert */
  const char *moe = "model:\n  preset: mixtral-tiny\n  capacity_factor: 2\nmesh:\n  expert: 2\ngrad_accum: 2\n";
  CHECK_OK(ctx, parse(ctx, moe, 0, NULL, &c));
  const char *router[] = {"mesh.rules=[['.*/moe/experts/.*', [expert]], ['.*/router/.*', [expert]]]"};
  expect_err(ctx, moe, 1, router, NB_ERR_UNIMPLEMENTED, "only the routed experts' leaves (.../moe/experts/...) are split over expert");
  const char *whole[] = {"mesh.rules=[]"};
  expect_err(ctx, moe, 1, whole, NB_ERR_UNIMPLEMENTED,
             "mesh.expert: 'layers/0/moe/experts/wi_0/kernel' is a routed experts' leaf and gets [] (no rule of mesh.rules)");
  const char *cols[] = {"mesh.rules=[['.*/moe/experts/.*', [null, expert]]]"};
  expect_err(ctx, moe, 1, cols, NB_ERR_UNIMPLEMENTED, "gets [null, expert] (mesh.rules[0]): the MoE layer holds its experts' rows");
}

/* The optimizer state follows its parameters; the count stays whole. */
static void test_layout(nb_ctx *ctx) {
  const char *over[] = {"grad_accum=2", "mesh.fsdp=2", "mesh.rules=[['.*embed.*', []], ['.*/kernel', [null, fsdp]], ['.*', [fsdp]]]"};
  nb_train_config c;
  CHECK_OK(ctx, parse(ctx, gpt2, 3, over, &c));
  nb_tree *params = nb_model_param_spec(ctx, &c.model, NB_F32), *opt = nb_train__opt_state_spec(ctx, &c, params);
  nb_train__layout L;
  CHECK_OK(ctx, nb_train__layout_make(ctx, &c, params, opt, &L));
  CHECK(!strcmp(L.axis, "fsdp") && L.count == 2);
  CHECK(nb_train__split_dim(&L, "params", "embed/embedding") == -1);
  CHECK(nb_train__split_dim(&L, "params", "layers/1/mlp/wo/kernel") == 1);
  CHECK(nb_train__split_dim(&L, "params", "layers/1/mlp/wo/bias") == 0);
  int mu = 0;
  for (size_t i = 0; i < nb_tree_size(opt); i++) {
    const char *p = nb_tree_path(opt, i), *slash = strstr(p, "/mu/");
    if (!slash) continue;
    mu++;
    CHECK_MSG(nb_train__split_dim(&L, "opt_state", p) == nb_train__split_dim(&L, "params", slash + 4), "'%s' does not follow its parameter", p);
  }
  CHECK_MSG(mu == (int)nb_tree_size(params), "%d moments of %zu parameters", mu, nb_tree_size(params));
  CHECK(nb_train__split_dim(&L, "opt_state", "1/0/count") == -1);
  nb_tree *blocks = nb_train__shard_spec(ctx, &L, "opt_state", opt);
  CHECK(blocks && nb_leaf_get_aval(nb_tree_get(blocks, "1/0/nu/layers/0/mlp/wi/kernel")).shape.dims[1] == 256);
  CHECK(blocks && nb_leaf_get_aval(nb_tree_get(blocks, "1/0/nu/pos_embed/embedding")).shape.dims[0] == 128);
  nb_tree_destroy(blocks);
  nb_train__layout_free(&L);
  /* printed: the rules, then each leaf with its rule */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CHECK_OK(ctx, nb_train_print_layout(ctx, &c, f));
  fclose(f);
  CHECK_MSG(text && strstr(text, "the state split over fsdp") && strstr(text, "  [1] '.*/kernel' -> [null, fsdp]") &&
                strstr(text, "mesh.rules[0] '.*embed.*'") && strstr(text, "opt_state/1/0/count") &&
                strstr(text, "no rule (replicated)") && strstr(text, "-> f32[128,256]"),
            "%s", text ? text : "");
  free(text);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_key(ctx);
  test_errors(ctx);
  test_layout(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("train/test_mesh_rules");
}
