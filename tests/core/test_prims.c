/* The primitive table: every row of every family runs through evaluation,
 * JVP against central finite differences, VJP against JVP, second order
 * (grad of grad), and vmap against a loop, fully and partially batched.
 * Fails when a primitive in prims.def has no row. */
#include "core/ir.h"
#include "primcheck.h"

/* Stacks three independent draws of the case's inputs along a new axis 0;
 * with only_first, inputs after the first stay unbatched (one draw). */
static nb_status stacked_inputs(nb_ctx *ctx, const nb_prim_case *c, nb_test_rng *rng, bool only_first,
                                nb_tree *batched, nb_tree *unbatched) {
  nb_tree *draws[3];
  for (int k = 0; k < 3; k++) {
    draws[k] = nb_tree_create(ctx);
    if (c->make_inputs(ctx, rng, draws[k]) != NB_OK) return NB_ERR_INTERNAL;
  }
  for (size_t i = 0; i < nb_tree_size(draws[0]); i++) {
    nb_array *a0 = nb_tree_leaf(draws[0], i)->array;
    const char *p = nb_tree_path(draws[0], i);
    if (only_first && i > 0) {
      nb_tree_set_array(unbatched, p, a0);
      continue;
    }
    int64_t dims[NB_MAX_RANK];
    dims[0] = 3;
    memcpy(dims + 1, nb_array_dims(a0), sizeof(int64_t) * (size_t)nb_array_rank(a0));
    nb_array *s = nb_array_empty(ctx, nb_array_dtype(a0), nb_array_rank(a0) + 1, dims);
    for (int k = 0; k < 3; k++)
      memcpy((char *)nb_array_data_mut(s) + (size_t)k * nb_array_nbytes(a0), nb_array_data(nb_tree_leaf(draws[k], i)->array),
             nb_array_nbytes(a0));
    nb_tree_set_array(batched, p, s);
    nb_array_release(s);
  }
  for (int k = 0; k < 3; k++) nb_tree_destroy(draws[k]);
  return NB_OK;
}

static void run_case(nb_ctx *ctx, const nb_prim_case *c) {
  char name[256];
  snprintf(name, sizeof name, "%s: %s", c->prim, c->name);
  nb_test_rng rng = {0x1234567u + (uint64_t)strlen(c->name) * 7919u};
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  CHECK_MSG(c->make_inputs(ctx, &rng, in) == NB_OK, "%s: making inputs", name);
  nb_status st = nb_test_eval(ctx, c->fn, c->user, in, out);
  CHECK_MSG(st == NB_OK, "%s: eval failed: %s", name, nb_ctx_error(ctx));
  nb_ctx_clear_error(ctx);
  if (st == NB_OK && !(c->flags & NB_CASE_NO_GRAD))
    CHECK_MSG(nb_test_check_grads(ctx, name, c->fn, c->user, in, c->tol ? c->tol : 1e-5,
                                  !(c->flags & NB_CASE_NO_SECOND_ORDER)),
              "%s: derivatives", name);
  if (st == NB_OK && !(c->flags & NB_CASE_NO_VMAP)) {
    for (int partial = 0; partial < 2; partial++) {
      if (partial && nb_tree_size(in) < 2) break;
      nb_tree *b = nb_tree_create(ctx), *u = nb_tree_create(ctx);
      stacked_inputs(ctx, c, &rng, partial, b, u);
      CHECK_MSG(nb_test_check_vmap(ctx, name, c->fn, c->user, b, u, 3), "%s: vmap (%s)", name,
                partial ? "first input batched" : "all batched");
      nb_tree_destroy(b);
      nb_tree_destroy(u);
    }
  }
  nb_tree_destroy(in);
  nb_tree_destroy(out);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  bool covered[NB_PRIM_COUNT] = {false};
  nb_test_register_custom_calls(ctx); /* the registry lives on the context, not in any graph */
  size_t base = nb_ctx_bytes_in_use(ctx);
  size_t nfamilies;
  const nb_case_list_fn *families = nb_test_case_families(&nfamilies);
  for (size_t f = 0; f < nfamilies; f++) {
    size_t n;
    const nb_prim_case *cases = families[f](&n);
    for (size_t i = 0; i < n; i++) {
      for (int p = 0; p < NB_PRIM_COUNT; p++)
        if (strcmp(nb__rules((nb_prim)p)->name, cases[i].prim) == 0) covered[p] = true;
      run_case(ctx, &cases[i]);
    }
  }
  for (int p = 0; p < NB_PRIM_COUNT; p++)
    CHECK_MSG(covered[p], "primitive '%s' has no row in the primitive table", nb__rules((nb_prim)p)->name);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes leaked", nb_ctx_bytes_in_use(ctx) - base);
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/prims");
}
