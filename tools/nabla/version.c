/* `nabla version` (also `nabla --version`): the version and what this build
 * runs with: the git commit, the compiler, the BLAS kernels and the vector
 * ISA the generated kernels and the MFU peak use. */
#include <stdio.h>

#include "cli.h"
#include "nabla/nabla.h"
#include "nabla_build_info.h"

static const char usage_text[] = "usage: nabla version   (or nabla --version)\n"
                                 "prints nabla's version, git commit, compiler, BLAS and vector ISA\n";

int nb_cmd_version(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  if (argc > 1) return nb_cli_usage(usage_text, false);
  printf("nabla %s\n", NB_VERSION_STRING);
  printf("commit    %s\n", NB_BUILD_COMMIT);
#if defined(__clang__)
  printf("compiler  clang %s\n", __clang_version__);
#elif defined(__GNUC__)
  printf("compiler  gcc %s\n", __VERSION__);
#else
  printf("compiler  unknown\n");
#endif
  printf("blas      %s\n", nb_jit_blas_core());
  printf("isa       %s\n", nb_prof_isa());
  return 0;
}
