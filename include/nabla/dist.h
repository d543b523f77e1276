/* nabla dist: many processes as one job (the analogue of JAX's
 * multi-controller runtime), over MPI (Open MPI from Debian). Every process
 * runs the same program (SPMD, launched by `mpirun -np N`); a mesh names
 * axes over the processes (data=2, ...) and gives each axis a communicator,
 * which nb_dist_mesh_bind binds to a context for the collectives of
 * nabla/collective.h (psum, all_gather, ... and shard_map).
 *
 * The communicators implement the core's nb_comm interface
 * (nabla/collective.h); an NCCL implementation for GPUs will implement the
 * same interface later. Their collectives are point-to-point messages on a
 * private duplicate of the communicator, waited for with a deadline:
 *  - deterministic: reductions gather every rank's values and fold them in
 *    rank order (never MPI_Allreduce, whose order MPI does not fix), so a sum
 *    is bit-identical on every rank and from run to run;
 *  - bounded: a collective that waits longer than the communicator's
 *    timeout_s (NABLA_DIST_TIMEOUT seconds, default 120; nb_comm.timeout_s)
 *    ends the whole job (MPI_Abort) with a message naming the rank(s) it
 *    waited for. A process that exits is noticed by mpirun, which ends the
 *    job and names it.
 * Only this library links MPI; the core calls it through nb_comm.
 * Asynchronous too (allgather/allreduce/reduce_scatter _start, test, wait):
 * a compiled step starts them early and waits late, polling between steps
 * (NABLA_DIST_PROGRESS=none: no polling, for measurements; docs/dist.md).
 *
 *   nb_dist_init(ctx, &argc, &argv);
 *   const char *axes[] = {"data"};
 *   int64_t sizes[] = {-1};                         // -1: all the processes
 *   nb_dist_mesh *m = nb_dist_mesh_create(ctx, 1, axes, sizes);
 *   nb_dist_mesh_bind(m, ctx);                      // psum(x, "data") now runs over MPI
 *   ...
 *   nb_dist_mesh_destroy(m);
 *   nb_dist_finalize();
 */
#ifndef NABLA_DIST_H
#define NABLA_DIST_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* Starts MPI once per process (later calls do nothing); argc/argv may be
 * NULL. Fails when the process was not started in a way MPI accepts. */
nb_status nb_dist_init(nb_ctx *ctx, int *argc, char ***argv);
/* Ends MPI (after every communicator is destroyed). */
void nb_dist_finalize(void);
/* The job's rank and size (0 and 1 before nb_dist_init). */
int nb_dist_rank(void);
int nb_dist_size(void);
/* Ends every process of the job with msg on stderr (MPI_Abort). */
void nb_dist_abort(int code, const char *msg);

/* A communicator over all the job's processes (its own duplicate: its
 * messages never meet another's). Destroy with nb_dist_comm_destroy. */
nb_comm *nb_dist_world(nb_ctx *ctx);
void nb_dist_comm_destroy(nb_comm *c);

/* A mesh: named axes whose sizes multiply to the job's size (one size may
 * be -1: what is left), over the ranks in row-major order (the last axis
 * varies fastest), with one communicator per axis (the processes that
 * differ only along it). */
typedef struct nb_dist_mesh nb_dist_mesh;
nb_dist_mesh *nb_dist_mesh_create(nb_ctx *ctx, int naxes, const char *const *names, const int64_t *sizes);
void nb_dist_mesh_destroy(nb_dist_mesh *m);
int nb_dist_mesh_naxes(const nb_dist_mesh *m);
const char *nb_dist_mesh_axis_name(const nb_dist_mesh *m, int i);
int64_t nb_dist_mesh_axis_size(const nb_dist_mesh *m, int i);
/* The communicator of the named axis (owned by the mesh), or NULL. */
nb_comm *nb_dist_mesh_axis(const nb_dist_mesh *m, const char *name);
/* Binds every axis of m on ctx (nb_ctx_bind_axis). */
nb_status nb_dist_mesh_bind(const nb_dist_mesh *m, nb_ctx *ctx);

NB_END_DECLS
#endif
