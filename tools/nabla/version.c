/* `nabla version`: the version and what this build was configured with. */
#include <stdio.h>

#include "nabla/nabla.h"

int nb_cmd_version(int argc, char **argv) {
  printf("nabla %s\n", NB_VERSION_STRING);
  return 0;
}
