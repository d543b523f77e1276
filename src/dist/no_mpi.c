/* The dist library of a build without MPI: one process, and every function
 * that needs more fails with a message that says so. */
#ifndef NABLA_HAVE_MPI
#include <stdio.h>
#include <stdlib.h>

#include "nabla/dist.h"

#define NO_MPI "nabla was built without MPI (install libopenmpi-dev openmpi-bin and rebuild)"

nb_status nb_dist_init(nb_ctx *ctx, int *argc, char ***argv) { return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist: " NO_MPI); }
void nb_dist_finalize(void) {}
int nb_dist_rank(void) { return 0; }
int nb_dist_size(void) { return 1; }
void nb_dist_abort(int code, const char *msg) {
  fprintf(stderr, "nabla dist: rank 0: %s\n", msg);
  exit(code ? code : 1);
}
nb_comm *nb_dist_world(nb_ctx *ctx) { return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist: " NO_MPI), NULL; }
void nb_dist_comm_destroy(nb_comm *c) {}
nb_dist_mesh *nb_dist_mesh_create(nb_ctx *ctx, int naxes, const char *const *names, const int64_t *sizes) {
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist mesh: " NO_MPI), NULL;
}
void nb_dist_mesh_destroy(nb_dist_mesh *m) {}
int nb_dist_mesh_naxes(const nb_dist_mesh *m) { return 0; }
const char *nb_dist_mesh_axis_name(const nb_dist_mesh *m, int i) { return NULL; }
int64_t nb_dist_mesh_axis_size(const nb_dist_mesh *m, int i) { return 0; }
nb_comm *nb_dist_mesh_axis(const nb_dist_mesh *m, const char *name) { return NULL; }
nb_status nb_dist_mesh_bind(const nb_dist_mesh *m, nb_ctx *ctx) { return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist mesh: " NO_MPI); }
#endif
