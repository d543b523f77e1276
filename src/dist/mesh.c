/* Meshes (nabla/dist.h): named axes over the job's ranks in row-major
 * order, each with the communicator of the ranks that differ only along it
 * (MPI_Comm_split). */
#ifdef NABLA_HAVE_MPI
#include <string.h>

#include "dist/internal.h"

struct nb_dist_mesh {
  nb_ctx *ctx;
  int naxes;
  char names[NB_MAX_AXES][NB_AXIS_NAME_MAX];
  int64_t sizes[NB_MAX_AXES];
  nb_comm *comms[NB_MAX_AXES];
};

nb_dist_mesh *nb_dist_mesh_create(nb_ctx *ctx, int naxes, const char *const *names, const int64_t *sizes) {
  int up = 0;
  MPI_Initialized(&up);
  if (!up) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: MPI is not started (nb_dist_init)"), NULL;
  if (naxes < 1 || naxes > NB_MAX_AXES || !names || !sizes)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: %d axes (1 to %d, with names and sizes)", naxes, NB_MAX_AXES), NULL;
  int world = nb_dist_size(), rank = nb_dist_rank(), rest = -1;
  int64_t known = 1, sz[NB_MAX_AXES];
  for (int a = 0; a < naxes; a++) {
    size_t n = names[a] ? strlen(names[a]) : 0;
    if (n == 0 || n >= NB_AXIS_NAME_MAX)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: axis %d: name must have 1 to %d characters", a,
                       NB_AXIS_NAME_MAX - 1), NULL;
    for (int b = 0; b < a; b++)
      if (!strcmp(names[a], names[b])) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: axis '%s' twice", names[a]), NULL;
    sz[a] = sizes[a];
    if (sz[a] == -1 && rest < 0) rest = a;
    else if (sz[a] < 1)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: axis '%s' has size %lld (>= 1, or one -1)", names[a],
                       (long long)sz[a]), NULL;
    else known *= sz[a];
  }
  if (rest >= 0) sz[rest] = world % known ? -1 : world / known;
  int64_t total = 1;
  for (int a = 0; a < naxes; a++) total *= sz[a];
  if (total != world || (rest >= 0 && sz[rest] < 1)) {
    char buf[256] = "";
    for (int a = 0, k = 0; a < naxes && k < (int)sizeof buf; a++)
      k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%s=%lld", a ? ", " : "", names[a], (long long)sizes[a]);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh: axes %s do not multiply to the job's %d processes", buf, world),
           NULL;
  }
  nb_dist_mesh *m = nb_calloc(ctx, sizeof *m);
  if (!m) return NULL;
  m->ctx = ctx;
  m->naxes = naxes;
  int64_t stride = 1;
  for (int a = naxes - 1; a >= 0; a--) {
    strcpy(m->names[a], names[a]);
    m->sizes[a] = sz[a];
    int coord = (int)(rank / stride % sz[a]);
    MPI_Comm sub;
    if (MPI_Comm_split(MPI_COMM_WORLD, (int)(rank - coord * stride), coord, &sub) != MPI_SUCCESS) {
      nb_errorf(ctx, NB_ERR_IO, "dist mesh: MPI_Comm_split for axis '%s' failed", names[a]);
      nb_dist_mesh_destroy(m);
      return NULL;
    }
    char label[96];
    snprintf(label, sizeof label, "axis '%s'", names[a]);
    if (!(m->comms[a] = nb_dist__comm_wrap(ctx, sub, label))) {
      MPI_Comm_free(&sub);
      nb_dist_mesh_destroy(m);
      return NULL;
    }
    stride *= sz[a];
  }
  return m;
}

void nb_dist_mesh_destroy(nb_dist_mesh *m) {
  if (!m) return;
  for (int a = 0; a < m->naxes; a++) nb_dist_comm_destroy(m->comms[a]);
  nb_dealloc(m->ctx, m, sizeof *m);
}

int nb_dist_mesh_naxes(const nb_dist_mesh *m) { return m ? m->naxes : 0; }
const char *nb_dist_mesh_axis_name(const nb_dist_mesh *m, int i) { return m && i >= 0 && i < m->naxes ? m->names[i] : NULL; }
int64_t nb_dist_mesh_axis_size(const nb_dist_mesh *m, int i) { return m && i >= 0 && i < m->naxes ? m->sizes[i] : 0; }

nb_comm *nb_dist_mesh_axis(const nb_dist_mesh *m, const char *name) {
  for (int a = 0; m && name && a < m->naxes; a++)
    if (!strcmp(m->names[a], name)) return m->comms[a];
  return NULL;
}

nb_status nb_dist_mesh_bind(const nb_dist_mesh *m, nb_ctx *ctx) {
  if (!m) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist mesh bind: NULL mesh");
  nb_status s = NB_OK;
  for (int a = 0; !s && a < m->naxes; a++) s = nb_ctx_bind_axis(ctx, m->names[a], m->comms[a]);
  return s;
}

#endif /* NABLA_HAVE_MPI (else no_mpi.c) */
