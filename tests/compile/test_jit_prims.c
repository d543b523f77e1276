/* Every row of the primitive table (tests/lib/cases_*.c) through nb_jit
 * against the interpreter, with optimizations on and all off: fused
 * primitives through generated kernels, the others through their reference
 * implementation inside the executable; on the cpu backend and on the
 * interp backend (src/backend/interp). All rows are inlined into one graph
 * (one shared object). The families come from tests/lib/cases_all.c. */
#include "jitcheck.h"

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_test_register_custom_calls(ctx);
  nb_graph *all = nb_graph_create(ctx);
  nb_tree *inputs = nb_tree_create(ctx);
  nb_test_rng rng = {4242};
  int rows = 0;
  size_t nfamilies;
  const nb_case_list_fn *families = nb_test_case_families(&nfamilies);
  for (size_t f = 0; f < nfamilies; f++) {
    size_t n;
    const nb_prim_case *cases = families[f](&n);
    for (size_t i = 0; i < n; i++) {
      const nb_prim_case *c = &cases[i];
      nb_tree *in = nb_tree_create(ctx), *vin = nb_tree_create(ctx), *out = nb_tree_create(ctx);
      CHECK_MSG(c->make_inputs(ctx, &rng, in) == NB_OK, "%s: inputs", c->name);
      nb_graph *g = nb_trace(ctx, c->fn, c->user, in);
      CHECK_MSG(g != NULL, "%s: %s", c->name, nb_ctx_error(ctx));
      for (size_t k = 0; g && k < nb_tree_size(in); k++) {
        char path[256];
        snprintf(path, sizeof path, "r%d/%s", rows, nb_tree_path(in, k));
        nb_array *a = nb_tree_leaf(in, k)->array;
        nb_tree_set_val(vin, nb_tree_path(in, k), nb_graph_input(all, path, nb_array_aval(a)));
        nb_tree_set_array(inputs, path, a);
      }
      if (g) CHECK_MSG(nb_graph_call(all, g, vin, out) == NB_OK, "%s: call", c->name);
      for (size_t k = 0; k < nb_tree_size(out); k++) {
        char path[256];
        snprintf(path, sizeof path, "r%d/%s %s/%s", rows, c->prim, c->name, nb_tree_path(out, k));
        for (char *p = path; *p; p++)
          if (*p == '/' && p > path && p[-1] == '/') *p = '_';
        nb_graph_output(all, path, nb_tree_leaf(out, k)->val);
      }
      nb_graph_destroy(g);
      nb_tree_destroy(in);
      nb_tree_destroy(vin);
      nb_tree_destroy(out);
      rows++;
    }
  }
  CHECK_MSG(nb_graph_status(all) == NB_OK, "%s", nb_graph_error(all));
  static const char *const modes[] = {NULL, "all"};
  static const char *const backends[] = {"cpu", "interp"}; /* interp: the plan behind the backend interface */
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < 2; m++) {
      nb_jit_opts o = nb_test_jit_opts(modes[m]);
      o.backend = backends[b];
      nb_exe_stats s;
      char what[64];
      snprintf(what, sizeof what, "table on %s%s", backends[b], modes[m] ? ", all off" : "");
      CHECK_MSG(nb_test_jit_matches(ctx, all, inputs, &o, what, &s), "%s", what);
      CHECK(s.native && s.nkernels > 10 && s.neval > 0);
      const char *env = getenv("NABLA_JIT_DISABLE"); /* may turn blas off for the whole suite */
      if (!modes[m] && !(env && *env)) CHECK_MSG(s.nblas > 0, "dot_general rows use BLAS");
    }
  printf("test_jit_prims: %d rows\n", rows);
  nb_graph_destroy(all);
  nb_tree_destroy(inputs);
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_prims");
}
