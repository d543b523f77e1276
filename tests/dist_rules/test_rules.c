/* The sharding rules engine (nabla/dist.h: nb_dist_rules, nb_dist_layout),
 * in one process without MPI: first match wins, the match is a full match
 * (not a search), a short spec leaves the trailing dims replicated, every
 * refusal names the rule and the leaf, the YAML form and its malformed
 * entries, blocks of a split dim (zero padding on padded axes), and
 * allocation failures. */
#include "test.h"

static const nb_dist_axis axes[] = {{"data", 2, false}, {"fsdp", 2, true}, {"tensor", 4, false}};
#define NAXES 3

static nb_tree *avals(nb_ctx *ctx) {
  nb_tree *t = nb_tree_create(ctx);
  int64_t emb[2] = {33, 8}, k[2] = {8, 12}, b[1] = {12};
  nb_tree_set(t, "embed/embedding", nb_leaf_aval(nb_aval_make(NB_F32, 2, emb)));
  nb_tree_set(t, "layers/0/mlp/wi/kernel", nb_leaf_aval(nb_aval_make(NB_F32, 2, k)));
  nb_tree_set(t, "layers/0/mlp/wi/bias", nb_leaf_aval(nb_aval_make(NB_F32, 1, b)));
  nb_tree_set(t, "count", nb_leaf_aval(nb_aval_make(NB_I32, 0, NULL)));
  return t;
}

static void test_match(nb_ctx *ctx) {
  nb_dist_rules *r = nb_dist_rules_create(ctx, "rules");
  const char *rows[] = {"fsdp"}, *cols[] = {NULL, "tensor"};
  CHECK_OK(ctx, nb_dist_rules_add(r, "layers/.*/kernel", 2, cols));
  CHECK_OK(ctx, nb_dist_rules_add(r, ".*embed.*", 0, NULL));
  CHECK_OK(ctx, nb_dist_rules_add(r, "mlp", 1, rows)); /* a search would match the kernel and bias; a full match neither */
  CHECK_OK(ctx, nb_dist_rules_add(r, ".*", 1, rows));
  CHECK(nb_dist_rules_count(r) == 4);
  CHECK(nb_dist_rules_match(r, "layers/0/mlp/wi/kernel") == 0); /* rules 0 and 3 match: the first wins */
  CHECK(nb_dist_rules_match(r, "embed/embedding") == 1);
  CHECK(nb_dist_rules_match(r, "layers/0/mlp/wi/bias") == 3);
  CHECK(nb_dist_rules_match(r, "mlp") == 2);
  CHECK(nb_dist_rules_match(r, "xlayers/0/w/kernel") == 3); /* anchored at the start */
  int n;
  nb_part_spec s = nb_dist_rules_spec(r, 0, &n);
  CHECK(n == 2 && s[0] == NULL && !strcmp(s[1], "tensor"));
  char buf[64];
  CHECK(!strcmp(nb_dist_spec_str(n, s, buf, sizeof buf), "[null, tensor]"));
  CHECK(!strcmp(nb_dist_spec_str(0, NULL, buf, sizeof buf), "[]"));

  /* the layout: rule 1 replicates the table, the kernel splits its columns, the bias and count take rule 3 */
  nb_tree *t = avals(ctx);
  nb_dist_layout *l = nb_dist_rules_apply(r, ctx, t, NAXES, axes);
  CHECK_MSG(l == NULL, "the scalar count has rank 0 < [fsdp]'s 1 dim");
  CHECK_ERR(ctx, NB_ERR_SHAPE, "rules[3] ('.*': [fsdp]): 1 dims for 'count' i32[] of rank 0");
  nb_tree_remove(t, "count");
  l = nb_dist_rules_apply(r, ctx, t, NAXES, axes);
  CHECK_MSG(l != NULL, "%s", nb_ctx_error(ctx));
  CHECK(nb_dist_layout_size(l) == 3);
  int64_t k = nb_dist_layout_find(l, "layers/0/mlp/wi/kernel"), e = nb_dist_layout_find(l, "embed/embedding");
  int64_t b = nb_dist_layout_find(l, "layers/0/mlp/wi/bias");
  CHECK(k == 1 && e == 0 && b == 2 && nb_dist_layout_find(l, "nope") == -1);
  nb_part_spec ks = nb_dist_layout_spec(l, (size_t)k);
  CHECK(nb_dist_layout_rule(l, (size_t)k) == 0 && ks[0] == NULL && !strcmp(ks[1], "tensor"));
  CHECK(nb_dist_layout_dim(l, (size_t)k, "tensor") == 1 && nb_dist_layout_dim(l, (size_t)k, "fsdp") == -1);
  CHECK(nb_dist_layout_block(l, (size_t)k).shape.dims[0] == 8 && nb_dist_layout_block(l, (size_t)k).shape.dims[1] == 3);
  CHECK(nb_dist_layout_rule(l, (size_t)e) == 1 && nb_dist_layout_dim(l, (size_t)e, "fsdp") == -1);
  CHECK(nb_dist_layout_block(l, (size_t)e).shape.dims[0] == 33);
  nb_part_spec bs = nb_dist_layout_spec(l, (size_t)b);
  CHECK(nb_dist_layout_rule(l, (size_t)b) == 3 && !strcmp(bs[0], "fsdp"));
  CHECK(nb_dist_layout_block(l, (size_t)b).shape.dims[0] == 6);
  nb_dist_layout_destroy(l);

  /* trailing dims replicated: [fsdp] on the 33-row table splits its rows (padded: 17 + 16) only */
  nb_dist_rules *rr = nb_dist_rules_create(ctx, "mesh.rules");
  CHECK_OK(ctx, nb_dist_rules_add(rr, ".*", 1, rows));
  nb_tree_remove(t, "layers/0/mlp/wi/bias");
  l = nb_dist_rules_apply(rr, ctx, t, NAXES, axes);
  e = nb_dist_layout_find(l, "embed/embedding");
  nb_part_spec es = nb_dist_layout_spec(l, (size_t)e);
  CHECK(es && !strcmp(es[0], "fsdp") && es[1] == NULL);
  nb_aval blk = nb_dist_layout_block(l, (size_t)e);
  CHECK(blk.shape.rank == 2 && blk.shape.dims[0] == 17 && blk.shape.dims[1] == 8);
  /* the block avals of the tree, and of a tree under a prefix */
  nb_tree *sh = nb_dist_layout_shards(l, ctx, t, NULL, NULL);
  CHECK_MSG(sh && nb_tree_size(sh) == 2, "%s", nb_ctx_error(ctx));
  CHECK(sh && nb_leaf_get_aval(nb_tree_get(sh, "embed/embedding")).shape.dims[0] == 17);
  nb_tree_destroy(sh);
  nb_tree *under = nb_tree_select_prefix(t, "layers", true);
  CHECK(nb_dist_layout_shards(l, ctx, under, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'0/mlp/wi/kernel' is not in the layout");
  sh = nb_dist_layout_shards(l, ctx, under, "layers", NULL);
  CHECK_MSG(sh && nb_leaf_get_aval(nb_tree_get(sh, "0/mlp/wi/kernel")).shape.dims[0] == 4, "%s", nb_ctx_error(ctx));
  nb_tree_destroy(sh);
  nb_tree_destroy(under);
  nb_dist_layout_destroy(l);
  nb_dist_rules_destroy(rr);
  nb_tree_destroy(t);
  nb_dist_rules_destroy(r);
}

static void test_errors(nb_ctx *ctx) {
  nb_dist_rules *r = nb_dist_rules_create(ctx, "mesh.rules");
  const char *twice[] = {"fsdp", NULL, "fsdp"}, *empty[] = {""}, *model[] = {NULL, "model"}, *cols[] = {NULL, "tensor"};
  CHECK(nb_dist_rules_add(r, ".*", 3, twice) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[0].spec: axis 'fsdp' splits dims 0 and 2");
  CHECK(nb_dist_rules_add(r, "(", 0, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[0].path: '(': missing closing parenthesis");
  CHECK(nb_dist_rules_add(r, ".*", 1, empty) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[0].spec[0]: an axis name has 1 to");
  CHECK(nb_dist_rules_add(r, ".*", NB_MAX_RANK + 1, twice) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[0].spec: 9 dims");
  CHECK(nb_dist_rules_count(r) == 0);
  /* an unknown axis: named by the check and by the layout */
  CHECK_OK(ctx, nb_dist_rules_add(r, "a", 2, cols));
  CHECK_OK(ctx, nb_dist_rules_add(r, "b", 2, model));
  CHECK(nb_dist_rules_check_axes(r, ctx, NAXES, axes) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[1].spec[1]: 'model' is not a mesh axis (data, fsdp, tensor; null: replicated)");
  nb_dist_layout *l = nb_dist_layout_create(ctx, NAXES, axes);
  int64_t d[2] = {8, 6}, odd[2] = {8, 10}, v[1] = {8};
  CHECK(nb_dist_layout_add(l, "b", nb_aval_make(NB_F32, 2, d), r, 1) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "mesh.rules[1] ('b': [null, model]) for 'b': 'model' is not a mesh axis (data, fsdp, tensor)");
  /* not divisible on an unpadded axis: 10 columns over tensor=4 */
  CHECK(nb_dist_layout_add(l, "a", nb_aval_make(NB_F32, 2, odd), r, 0) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "mesh.rules[0] ('a': [null, tensor]) for 'a' f32[8,10]: dim 1 (10) is not a multiple of axis 'tensor' (4 processes)");
  /* longer than the rank */
  CHECK(nb_dist_layout_add(l, "a", nb_aval_make(NB_F32, 1, v), r, 0) == NB_ERR_SHAPE);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "mesh.rules[0] ('a': [null, tensor]): 2 dims for 'a' f32[8] of rank 1");
  CHECK_OK(ctx, nb_dist_layout_add(l, "a", nb_aval_make(NB_F32, 2, d), NULL, -1));
  CHECK(nb_dist_layout_add(l, "a", nb_aval_make(NB_F32, 2, d), NULL, -1) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'a' is there already");
  CHECK(nb_dist_layout_rule(l, 0) == -1 && nb_dist_layout_spec(l, 0)[0] == NULL && nb_dist_layout_spec(l, 0)[1] == NULL);
  nb_dist_layout_destroy(l);
  nb_dist_rules_destroy(r);
}

static void yaml_err(nb_ctx *ctx, const char *text, const char *needle) {
  nb_dist_rules *r = nb_dist_rules_parse_yaml(ctx, "mesh.rules", text, strlen(text));
  CHECK_MSG(r == NULL, "'%s' parsed", text);
  nb_dist_rules_destroy(r);
  CHECK_ERR(ctx, NB_ERR_FORMAT, needle);
}

static void test_yaml(nb_ctx *ctx) {
  const char *flow = "[[\".*embed.*\", []], [\".*/kernel\", [null, tensor]], ['.*', [fsdp, ~, \"null\"]]]";
  nb_dist_rules *r = nb_dist_rules_parse_yaml(ctx, "mesh.rules", flow, strlen(flow));
  CHECK_MSG(r && nb_dist_rules_count(r) == 3, "%s", nb_ctx_error(ctx));
  int n;
  nb_part_spec s = nb_dist_rules_spec(r, 2, &n);
  CHECK(n == 3 && !strcmp(s[0], "fsdp") && s[1] == NULL && !strcmp(s[2], "null")); /* a quoted "null" is an axis's name */
  CHECK(nb_dist_rules_spec(r, 0, &n) && n == 0);
  CHECK(!strcmp(nb_dist_rules_regex(r, 1), ".*/kernel") && !strcmp(nb_dist_rules_label(r), "mesh.rules"));
  nb_dist_rules_destroy(r);
  const char *block = "- ['.*embed.*', []]\n- - '.*'\n  - [fsdp]\n";
  r = nb_dist_rules_parse_yaml(ctx, "mesh.rules", block, strlen(block));
  CHECK_MSG(r && nb_dist_rules_count(r) == 2 && nb_dist_rules_match(r, "pos_embed/embedding") == 0, "%s", nb_ctx_error(ctx));
  nb_dist_rules_destroy(r);
  r = nb_dist_rules_parse_yaml(ctx, "mesh.rules", "[]", 2);
  CHECK(r && nb_dist_rules_count(r) == 0);
  nb_dist_rules_destroy(r);
  yaml_err(ctx, "[{path: '.*', spec: [fsdp]}]", "mesh.rules[0]: a [regex, [axis|null, ...]] pair wanted, not a mapping");
  yaml_err(ctx, "[['.*', fsdp]]", "mesh.rules[0].spec: a list of axis names or null wanted");
  yaml_err(ctx, "[['a', []], ['.*']]", "mesh.rules[1]: a [regex, [axis|null, ...]] pair wanted (got a list of another length)");
  yaml_err(ctx, "[['a', [], []]]", "mesh.rules[0]: a [regex, [axis|null, ...]] pair wanted");
  yaml_err(ctx, "[[~, [fsdp]]]", "mesh.rules[0].path: a regex wanted");
  yaml_err(ctx, "[['.*', [[fsdp]]]]", "mesh.rules[0].spec[0]: an axis name or null wanted");
  yaml_err(ctx, "[['.*', [fsdp, fsdp]]]", "mesh.rules[0].spec: axis 'fsdp' splits dims 0 and 1");
  yaml_err(ctx, "[['(', []]]", "mesh.rules[0].path: '(':");
  yaml_err(ctx, "fsdp", "mesh.rules: a list of [regex, [axis|null, ...]] pairs wanted");
  yaml_err(ctx, "[['a', [fsdp]", "mesh.rules: YAML error");
  yaml_err(ctx, "[a]", "mesh.rules[0]: a [regex, [axis|null, ...]] pair wanted (got a scalar)");
}

/* Blocks of arrays: dim 1 over tensor (4), dim 0 over the padded fsdp (2): process (f, t) */
static void test_blocks(nb_ctx *ctx) {
  int64_t d[2] = {3, 8};
  double x[24];
  for (int i = 0; i < 24; i++) x[i] = i + 1;
  nb_array *a = nb_array_from_f64(ctx, NB_F32, 2, d, x);
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, "w", a);
  nb_tree_set_array(t, "whole", a);
  nb_dist_rules *r = nb_dist_rules_create(ctx, NULL);
  const char *both[] = {"fsdp", "tensor"};
  CHECK_OK(ctx, nb_dist_rules_add(r, "w", 2, both));
  nb_dist_layout *l = nb_dist_rules_apply(r, ctx, t, NAXES, axes);
  for (int64_t f = 0; f < 2; f++)
    for (int64_t c = 0; c < 4; c++) {
      int64_t coords[NAXES] = {1, f, c};
      nb_tree *sh = nb_dist_layout_shards(l, ctx, t, NULL, coords);
      nb_array *w = nb_tree_get_array(sh, "w");
      CHECK_MSG(w && nb_array_dims(w)[0] == 2 && nb_array_dims(w)[1] == 2, "%s", nb_ctx_error(ctx));
      for (int64_t i = 0; w && i < 2; i++)
        for (int64_t j = 0; j < 2; j++) {
          int64_t row = f * 2 + i, col = c * 2 + j;
          double want = row < 3 ? x[row * 8 + col] : 0; /* row 3 is padding */
          CHECK_MSG(nb_array_get(w, i * 2 + j) == want, "block (%lld, %lld)[%lld, %lld] = %g, want %g", (long long)f,
                    (long long)c, (long long)i, (long long)j, nb_array_get(w, i * 2 + j), want);
        }
      CHECK(nb_tree_get_array(sh, "whole") == a); /* unsplit leaves are shared */
      nb_tree_destroy(sh);
    }
  int64_t bad[NAXES] = {0, 2, 0};
  CHECK(nb_dist_layout_shards(l, ctx, t, NULL, bad) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "coordinate 2 along axis 'fsdp' of 2");
  CHECK(nb_dist_layout_shards(l, ctx, t, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "'w': an array and no coords");
  /* a padded block cut to its size: rows [2, 3) of the 3 rows */
  nb_array *cut = nb_dist_block(ctx, a, 0, 2, 1);
  CHECK(cut && nb_array_dims(cut)[0] == 1 && nb_array_get(cut, 0) == 17 && nb_array_get(cut, 7) == 24);
  nb_array_release(cut);
  int64_t four[2] = {4, 8};
  nb_tree *other = nb_tree_create(ctx);
  nb_tree_set(other, "w", nb_leaf_aval(nb_aval_make(NB_F32, 2, four)));
  CHECK(nb_dist_layout_shards(l, ctx, other, NULL, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_SHAPE, "'w' is f32[4,8], the layout's f32[3,8]");
  /* print: one line per leaf */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  nb_dist_layout_print(l, r, f);
  fclose(f);
  CHECK_MSG(text && !strncmp(text, "w         f32[3,8]         [fsdp, tensor]           rules[0] 'w'", 60) &&
                strstr(text, "-> f32[2,2]") && strstr(text, "no rule (replicated)"),
            "%s", text ? text : "");
  free(text);
  nb_tree_destroy(other);
  nb_dist_layout_destroy(l);
  nb_dist_rules_destroy(r);
  nb_tree_destroy(t);
  nb_array_release(a);
}

/* Every allocation of the parse, the layout and the blocks failing in turn: an error, never a crash or leak. */
static void test_alloc_failures(nb_ctx *ctx) {
  const char *flow = "[['.*embed.*', []], ['.*', [fsdp]]]";
  int64_t d[2] = {5, 4};
  nb_array *a = nb_array_from_f64(ctx, NB_F32, 2, d, (double[20]){0});
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, "embed/embedding", a);
  nb_tree_set_array(t, "w", a);
  size_t before = nb_ctx_bytes_in_use(ctx);
  int n;
  for (n = 1; n < 10000; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_dist_rules *r = nb_dist_rules_parse_yaml(ctx, "mesh.rules", flow, strlen(flow));
    nb_dist_layout *l = r ? nb_dist_rules_apply(r, ctx, t, NAXES, axes) : NULL;
    int64_t coords[NAXES] = {0, 1, 0};
    nb_tree *sh = l ? nb_dist_layout_shards(l, ctx, t, NULL, coords) : NULL;
    nb_ctx_fail_alloc_after(ctx, 0);
    bool done = sh != NULL;
    CHECK_MSG(done || nb_ctx_status(ctx) != NB_OK, "allocation %d failed without an error", n);
    nb_ctx_clear_error(ctx);
    nb_tree_destroy(sh);
    nb_dist_layout_destroy(l);
    nb_dist_rules_destroy(r);
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == before, "allocation %d: %zu bytes left", n, nb_ctx_bytes_in_use(ctx) - before);
    if (done) break;
  }
  CHECK_MSG(n > 5 && n < 10000, "%d allocations", n);
  nb_tree_destroy(t);
  nb_array_release(a);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_match(ctx);
  test_errors(ctx);
  test_yaml(ctx);
  test_blocks(ctx);
  test_alloc_failures(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("dist_rules/test_rules");
}
