/* Which OpenBLAS kernels dot_general runs on (nb_jit_blas_core). Each mode
 * runs in a child process, since OpenBLAS's kernels are chosen once per
 * process: by default, kernels no weaker than the CPU's vector ISA (an
 * AVX-512 CPU must not run on SSE3 kernels, as Debian's OpenBLAS 0.3.21
 * picks on Emerald Rapids); NABLA_BLAS_CORETYPE=Haswell forces a core,
 * =keep and OPENBLAS_CORETYPE leave OpenBLAS's own choice, an unknown
 * name is reported and ignored. Unless OPENBLAS_THREAD_TIMEOUT is set,
 * OpenBLAS's idle threads are told to sleep at once instead of spinning.
 * Every mode's matmul must still match the interpreter. */
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jitcheck.h"

static bool contains(const char *s, const char *word) {
  for (size_t n = strlen(word); *s; s++)
    if (strncasecmp(s, word, n) == 0) return true;
  return false;
}

/* A 2-thread 260x256x256 matmul (in tiles on the pool) against the interpreter, then the kernels chosen. Exit status 0 when both
 * are as expected. */
static int child(const char *mode, const char *openblas_env) {
  if (mode) setenv("NABLA_BLAS_CORETYPE", mode, 1);
  else unsetenv("NABLA_BLAS_CORETYPE");
  if (openblas_env) setenv("OPENBLAS_CORETYPE", openblas_env, 1);
  else unsetenv("OPENBLAS_CORETYPE");
  nb_ctx *ctx = nb_ctx_create();
  nb_test_rng rng = {7};
  int64_t ad[2] = {260, 256}, bd[2] = {256, 256};
  nb_graph *g = nb_graph_create(ctx);
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}};
  nb_graph_output(g, "y", nb_dot_general(nb_graph_input(g, "a", nb_aval_make(NB_F32, 2, ad)),
                                         nb_graph_input(g, "b", nb_aval_make(NB_F32, 2, bd)), &dn, NB_F32));
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "a", NB_F32, 2, ad);
  nb_test_set_randn(in, &rng, "b", NB_F32, 2, bd);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.threads = 2;
  bool ok = nb_test_jit_matches(ctx, g, in, &o, mode ? mode : "default", NULL);
  const char *core = nb_jit_blas_core();
  printf("  NABLA_BLAS_CORETYPE=%s OPENBLAS_CORETYPE=%s: %s\n", mode ? mode : "(unset)", openblas_env ? openblas_env : "(unset)",
         core);
  if (!contains(core, "OpenBLAS")) ok = false;
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!mode && !openblas_env && avx512 && !contains(core, "SkylakeX") && !contains(core, "Cooperlake") &&
      !contains(core, "SapphireRapids")) {
    printf("  an AVX-512 CPU runs on weaker kernels: %s\n", core);
    ok = false;
  }
  if (!getenv("OPENBLAS_THREAD_TIMEOUT") && !contains(core, "idle threads sleep at once")) {
    printf("  OpenBLAS's idle threads still spin after a threaded call\n");
    ok = false;
  }
  if (mode && strcmp(mode, "Haswell") == 0 && !contains(core, "OpenBLAS Haswell")) ok = false;
  if (mode && strcmp(mode, "no-such-core") == 0 && !contains(core, "is not a core it has")) ok = false;
  if (openblas_env && contains(core, "it picked")) ok = false; /* the user's choice is left alone */
  nb_tree_destroy(in);
  nb_graph_destroy(g);
  nb_ctx_destroy(ctx);
  fflush(stdout); /* the child leaves by _exit */
  return ok ? 0 : 1;
}

static bool in_child(const char *mode, const char *openblas_env) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(child(mode, openblas_env));
  int st = 0;
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
  /* OpenBLAS read OPENBLAS_CORETYPE when this process loaded it: the
   * default-mode child can only check the selection when it was unset */
  if (!getenv("OPENBLAS_CORETYPE")) CHECK_MSG(in_child(NULL, NULL), "default kernels");
  CHECK_MSG(in_child("Haswell", NULL), "NABLA_BLAS_CORETYPE=Haswell");
  CHECK_MSG(in_child("keep", NULL), "NABLA_BLAS_CORETYPE=keep");
  CHECK_MSG(in_child("no-such-core", NULL), "NABLA_BLAS_CORETYPE=no-such-core");
  CHECK_MSG(in_child(NULL, "Haswell"), "OPENBLAS_CORETYPE set");
  return nb_test_summary("compile/test_jit_blas_core");
}
