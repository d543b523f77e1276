/* Collectives: the communicator interface the core calls, the axes a
 * context binds to communicators, and the collective ops (psum, pmean, pmax,
 * all_gather, psum_scatter, all_to_all, ppermute, axis_index) with
 * shard_map. Part of the core (included by nabla/core.h); the core links no
 * transport: the dist library (nabla/dist.h) implements nb_comm over MPI,
 * and a GPU library will implement the same interface over NCCL.
 *
 * The model is JAX's multi-controller SPMD: every process runs the same
 * program on its own shard; a collective names a mesh axis ("data") and runs
 * over the processes along it. The axis's size is known when tracing (the
 * context's binding), so shapes stay static. A compiled step starts psum,
 * pmax, all_gather and psum_scatter as early as their operands allow and
 * waits for them just before their first reader, when the communicator
 * offers the asynchronous operations below (docs/dist.md, "Compiled
 * steps"); the others run as steps of their own, synchronously.
 *
 * Determinism: a sum's result is the fold of the ranks' values in rank
 * order, ((x_0 + x_1) + x_2) + ..., rounded to the dtype after each add, on
 * every rank, bit for bit, whatever the arrival order (nb_comm_fold).
 *
 * Derivatives follow jax.shard_map: every value inside the SPMD program is
 * per-process (device-varying); psum's output is the same everywhere
 * (replicated), so its transpose is pbroadcast (an identity that marks a
 * replicated value as varying) and pbroadcast's is psum; all_gather and
 * psum_scatter transpose into each other, all_to_all into the all_to_all
 * with the two dims swapped, ppermute into the inverse permutation. */
#ifndef NABLA_COLLECTIVE_H
#define NABLA_COLLECTIVE_H

/* Included by nabla/core.h after its types. */

typedef enum nb_comm_reduce { NB_COMM_SUM, NB_COMM_MAX } nb_comm_reduce;

typedef struct nb_comm nb_comm;
/* One asynchronous collective in flight (the communicator's own). */
typedef struct nb_comm_req nb_comm_req;

/* A communicator's operations. Every rank of the communicator calls the
 * same collectives in the same order. Buffers are host memory. Errors go to
 * ctx (nb_errorf); a collective that waits past the communicator's timeout
 * ends the whole job (abort) with a message naming the rank(s) it waited
 * for, so that a dead or hung process never hangs the others. */
typedef struct nb_comm_ops {
  const char *name; /* "self", "mpi", later "nccl" */
  int (*rank)(const nb_comm *c);
  int (*size)(const nb_comm *c);
  /* recv[size * bytes]: each rank's `bytes` of send, in rank order */
  nb_status (*allgather)(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes);
  /* In place over count elements of dtype t: the fold in rank order */
  nb_status (*allreduce)(nb_comm *c, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op);
  /* send[size * count]: block r (count elements) reduced over the ranks, in
   * rank order, into recv[count] of rank r */
  nb_status (*reduce_scatter)(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                              nb_comm_reduce op);
  /* block j of send (bytes each) goes to rank j; recv's block i came from rank i */
  nb_status (*all_to_all)(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes);
  /* sends `send` to rank dst and receives `recv` from rank src (-1: none) */
  nb_status (*sendrecv)(nb_comm *c, nb_ctx *ctx, const void *send, int dst, void *recv, int src, size_t bytes);
  nb_status (*barrier)(nb_comm *c, nb_ctx *ctx);
  /* Ends the whole job (every process) with msg on stderr; does not return. */
  void (*abort)(nb_comm *c, int code, const char *msg);
  /* Optional (NULL: this communicator runs every collective synchronously):
   * allgather, allreduce and reduce_scatter started, *req what to wait on.
   * Until wait returns, send (allreduce: buf) must not change and recv
   * (buf) must not be read. The result is the synchronous call's, bit for
   * bit (the same rank-order fold, at wait). Every rank starts the same
   * collectives in the same order, as for the synchronous ones. */
  nb_status (*allgather_start)(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes, nb_comm_req **req);
  nb_status (*allreduce_start)(nb_comm *c, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op,
                               nb_comm_req **req);
  nb_status (*reduce_scatter_start)(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                                    nb_comm_reduce op, nb_comm_req **req);
  /* Moves req's messages on (MPI progress) without blocking; *done when
   * they are all through. Called by a running executable between steps. */
  nb_status (*test)(nb_comm *c, nb_ctx *ctx, nb_comm_req *req, bool *done);
  /* Finishes req (the fold of a reduction) and frees it, also on error;
   * past the timeout it ends the job naming the rank(s) waited for, as the
   * synchronous collectives do. */
  nb_status (*wait)(nb_comm *c, nb_ctx *ctx, nb_comm_req *req);
} nb_comm_ops;

/* Implementations embed this as their first member. */
struct nb_comm {
  const nb_comm_ops *ops;
  double timeout_s; /* a collective waits at most this long for a peer */
};

/* The one-process communicator (size 1: every collective is a copy). */
nb_comm *nb_comm_self(void);
/* dst[i] = dst[i] op src[i] for count elements of t, rounded to t (sums of
 * integers wrap; max propagates NaN): the step of every deterministic fold. */
nb_status nb_comm_fold(nb_ctx *ctx, nb_dtype t, void *dst, const void *src, size_t count, nb_comm_reduce op);

#define NB_AXIS_NAME_MAX 32
#define NB_MAX_AXES 8
/* Binds a mesh axis name to a communicator (borrowed: it must outlive the
 * graphs traced and run on ctx; NULL unbinds). Collectives naming the axis
 * trace with its size and run over it. */
nb_status nb_ctx_bind_axis(nb_ctx *ctx, const char *axis, nb_comm *comm);
/* The communicator bound to axis, or NULL. */
nb_comm *nb_ctx_axis(const nb_ctx *ctx, const char *axis);

/* The collective ops. x is this process's value; `axis` a bound axis. */
nb_val *nb_psum_at(nb_loc loc, nb_val *x, const char *axis);
nb_val *nb_pmean_at(nb_loc loc, nb_val *x, const char *axis);
nb_val *nb_pmax_at(nb_loc loc, nb_val *x, const char *axis);
/* Identity that marks a replicated value as per-process (psum's transpose). */
nb_val *nb_pbroadcast_at(nb_loc loc, nb_val *x, const char *axis);
/* The ranks' x along dim: tiled concatenates (dims[dim] * size), else stacks
 * on a new axis at dim (size). */
nb_val *nb_all_gather_at(nb_loc loc, nb_val *x, const char *axis, int dim, bool tiled);
/* The sum over the ranks of block r of x along dim, on rank r: tiled splits
 * dims[dim] (a multiple of size) into size blocks, else dims[dim] == size
 * and the dim is removed. */
nb_val *nb_psum_scatter_at(nb_loc loc, nb_val *x, const char *axis, int dim, bool tiled);
/* x split along split_dim into size blocks, block j sent to rank j; the
 * blocks received concatenated along concat_dim in rank order. */
nb_val *nb_all_to_all_at(nb_loc loc, nb_val *x, const char *axis, int split_dim, int concat_dim);
/* Rank dst[i] receives x of rank src[i]; a rank no pair sends to gets zeros.
 * The sources are distinct and so are the destinations. */
#define NB_PPERMUTE_MAX 64
nb_val *nb_ppermute_at(nb_loc loc, nb_val *x, const char *axis, int npairs, const int *src, const int *dst);
/* This process's index along axis (i32 scalar). */
nb_val *nb_axis_index_at(nb_loc loc, nb_graph *g, const char *axis);

/* shard_map for the per-process SPMD case: a graph over global values that
 * runs f on each process's shard. in_specs[i] / out_specs[i] give, per dim of
 * input / output i (in f's input / output order), the axis that dim is split
 * over, or NULL (not split); a NULL spec: replicated. f is traced on the
 * local shapes (a split dim divided by its axis's size); every process
 * passes the same global inputs and takes its block (so gradients flow back
 * summed over the processes), and split outputs are reassembled on every
 * process (a psum of the blocks placed in zeros: exact). A replicated output
 * must be the same on every process (a psum, pmean or pmax of something):
 * its cotangent is taken to be replicated too, as in JAX. Returns the new
 * graph, or NULL with the error on ctx. */
typedef const char *const *nb_part_spec; /* [rank of the value] */
nb_graph *nb_shard_map(nb_ctx *ctx, const nb_graph *f, const nb_part_spec *in_specs, const nb_part_spec *out_specs);

#define nb_psum(x, ax) nb_psum_at(NB_HERE, x, ax)
#define nb_pmean(x, ax) nb_pmean_at(NB_HERE, x, ax)
#define nb_pmax(x, ax) nb_pmax_at(NB_HERE, x, ax)
#define nb_pbroadcast(x, ax) nb_pbroadcast_at(NB_HERE, x, ax)
#define nb_all_gather(x, ax, d, t) nb_all_gather_at(NB_HERE, x, ax, d, t)
#define nb_psum_scatter(x, ax, d, t) nb_psum_scatter_at(NB_HERE, x, ax, d, t)
#define nb_all_to_all(x, ax, s, c) nb_all_to_all_at(NB_HERE, x, ax, s, c)
#define nb_ppermute(x, ax, n, s, d) nb_ppermute_at(NB_HERE, x, ax, n, s, d)
#define nb_axis_index(g, ax) nb_axis_index_at(NB_HERE, g, ax)

#endif
