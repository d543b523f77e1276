/* Private to the dist library: the MPI communicator's layout. */
#ifndef NABLA_DIST_INTERNAL_H
#define NABLA_DIST_INTERNAL_H

#include <mpi.h>

#include "nabla/dist.h"

typedef struct nb_dist__comm {
  nb_comm base; /* first: an nb_comm * is an nb_dist__comm * */
  nb_ctx *ctx;  /* that allocated it */
  MPI_Comm comm; /* owned (a dup or a split) */
  int rank, size, tag;
  char label[96]; /* "axis 'data'", for messages */
} nb_dist__comm;

/* Wraps comm (taken) as an nb_comm. */
nb_comm *nb_dist__comm_wrap(nb_ctx *ctx, MPI_Comm comm, const char *label);

#endif
