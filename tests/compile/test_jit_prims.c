/* Every row of the primitive table (tests/lib/cases_*.c) through nb_jit
 * against the interpreter, with optimizations on and all off: fused
 * primitives through generated kernels, the others through their reference
 * implementation inside the executable; on the cpu backend and on the
 * interp backend (src/backend/interp), and on the cuda backend where a GPU
 * is (else SKIPPED). All rows are inlined into one graph
 * (one shared object). The families come from tests/lib/cases_all.c. */
#include "jitcheck.h"

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_test_register_custom_calls(ctx);
  nb_tree *inputs = nb_tree_create(ctx);
  int rows = 0;
  nb_graph *all = nb_test_prim_table_graph(ctx, inputs, &rows);
  CHECK_MSG(nb_graph_status(all) == NB_OK, "%s", nb_graph_error(all));
  static const char *const modes[] = {NULL, "all"};
  /* interp: the plan behind the backend interface; cuda where a device is */
  static const char *const backends[] = {"cpu", "interp", "cuda"};
  char why[512];
  int nbackends = nb_test_cuda_usable(ctx, why, sizeof why) ? 3 : 2;
  if (nbackends < 3) printf("table on cuda: SKIPPED (%s)\n", why);
  for (int b = 0; b < nbackends; b++)
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
