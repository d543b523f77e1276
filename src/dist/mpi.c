/* The MPI communicator (nabla/dist.h): nb_comm's collectives as
 * point-to-point messages on a duplicated MPI communicator, waited for with
 * a deadline, and reductions folded in rank order. Not here: meshes
 * (mesh.c). */
#ifdef NABLA_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/internal.h"
#include "util/util.h"

static bool started_here; /* MPI_Init was ours, so MPI_Finalize is too */

nb_status nb_dist_init(nb_ctx *ctx, int *argc, char ***argv) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (down) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist: MPI was already finalized in this process");
  if (up) return NB_OK;
  int provided = 0;
  /* collectives run from one thread at a time (the step's), not always the main one */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return nb_errorf(ctx, NB_ERR_IO, "dist: MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED)
    nb_logf(ctx, NB_LOG_WARN, "dist: MPI gives thread level %d, below MPI_THREAD_SERIALIZED", provided);
  started_here = true;
  return NB_OK;
}

void nb_dist_finalize(void) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down && started_here) MPI_Finalize();
}

static bool mpi_up(void) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}

int nb_dist_rank(void) {
  int r = 0;
  if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int nb_dist_size(void) {
  int n = 1;
  if (mpi_up()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void nb_dist_abort(int code, const char *msg) {
  fprintf(stderr, "nabla dist: rank %d: %s\n", nb_dist_rank(), msg);
  fflush(stderr);
  if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
  exit(code ? code : 1);
}

/* ---------------------------------------------------------------- waiting */

enum { MAX_REQS = 2 * 1024 };

/* One collective's outstanding messages: peer[i] is the rank request i
 * talks to, recv[i] whether it receives. */
typedef struct pending {
  int n;
  MPI_Request req[MAX_REQS];
  int peer[MAX_REQS];
  bool recv[MAX_REQS];
} pending;

static nb_status post(nb_dist__comm *c, nb_ctx *ctx, pending *p, bool recv, void *buf, size_t bytes, int peer) {
  if (bytes > INT_MAX)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist: a message of %zu bytes (MPI counts stop at %d)", bytes, INT_MAX);
  if (p->n == MAX_REQS) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dist: more than %d messages in one collective", MAX_REQS);
  int rc = recv ? MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, c->tag, c->comm, &p->req[p->n])
                : MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, c->tag, c->comm, &p->req[p->n]);
  if (rc != MPI_SUCCESS) return nb_errorf(ctx, NB_ERR_IO, "dist: MPI_I%s to rank %d failed", recv ? "recv" : "send", peer);
  p->peer[p->n] = peer;
  p->recv[p->n++] = recv;
  return NB_OK;
}

/* Waits for every message of p; past the deadline, ends the job naming the
 * ranks whose messages did not come. */
static nb_status wait_all(nb_dist__comm *c, nb_ctx *ctx, pending *p, const char *what) {
  double start = nb_util__now_s(), pause = 1e-6;
  for (;;) {
    int done = 0;
    if (MPI_Testall(p->n, p->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      return nb_errorf(ctx, NB_ERR_IO, "dist: %s on %s: MPI_Testall failed", what, c->label);
    if (done) return NB_OK;
    double waited = nb_util__now_s() - start;
    if (c->base.timeout_s > 0 && waited > c->base.timeout_s) {
      char msg[1024], *q = msg, *end = msg + sizeof msg;
      q += snprintf(q, (size_t)(end - q), "%s on %s (rank %d of %d there) waited %.1f s (timeout %.1f s) for rank", what,
                    c->label, c->rank, c->size, waited, c->base.timeout_s);
      bool named[MAX_REQS] = {false}; /* by peer rank: each named once */
      for (int i = 0; i < p->n && q < end - 16; i++) {
        int flag = 0;
        MPI_Test(&p->req[i], &flag, MPI_STATUS_IGNORE);
        if (flag || p->peer[i] >= MAX_REQS || named[p->peer[i]]) continue;
        named[p->peer[i]] = true;
        q += snprintf(q, (size_t)(end - q), " %d", p->peer[i]);
      }
      snprintf(q, (size_t)(end - q), ": that process died or hangs; ending the job");
      nb_dist_abort(3, msg);
    }
    /* back off up to 1 ms: the peers share the cores with us */
    struct timespec ts = {0, (long)(pause * 1e9)};
    nanosleep(&ts, NULL);
    if (pause < 1e-3) pause *= 2;
  }
}

static void next_tag(nb_dist__comm *c) { c->tag = (c->tag + 1) & 0x7fff; }

/* ---------------------------------------------------------------- collectives */

static int mpi_rank(const nb_comm *b) { return ((const nb_dist__comm *)b)->rank; }
static int mpi_size(const nb_comm *b) { return ((const nb_dist__comm *)b)->size; }

/* Posts the messages of an exchange: recv[r] = rank r's block for this
 * rank, block r of its send when send_stride is bytes (all_to_all), its
 * whole send when 0 (allgather); this rank's own block is copied now. */
static nb_status exchange_post(nb_dist__comm *c, nb_ctx *ctx, pending *p, const void *send, size_t send_stride,
                               void *recv, size_t bytes) {
  next_tag(c);
  nb_status s = NB_OK;
  for (int r = 0; !s && r < c->size; r++)
    if (r != c->rank) s = post(c, ctx, p, true, (char *)recv + (size_t)r * bytes, bytes, r);
  for (int r = 0; !s && r < c->size; r++)
    if (r != c->rank) s = post(c, ctx, p, false, (char *)send + (size_t)r * send_stride, bytes, r);
  if (bytes) memmove((char *)recv + (size_t)c->rank * bytes, (const char *)send + (size_t)c->rank * send_stride, bytes);
  return s;
}

static nb_status exchange(nb_comm *b, nb_ctx *ctx, const void *send, size_t send_stride, void *recv, size_t bytes,
                          const char *what) {
  nb_dist__comm *c = (nb_dist__comm *)b;
  pending p = {0};
  nb_status s = exchange_post(c, ctx, &p, send, send_stride, recv, bytes);
  return s ? s : wait_all(c, ctx, &p, what);
}

static nb_status mpi_allgather(nb_comm *b, nb_ctx *ctx, const void *send, void *recv, size_t bytes) {
  return exchange(b, ctx, send, 0, recv, bytes, "allgather");
}

/* out = ((in[0] op in[1]) op in[2]) ...: the rank order, whatever the arrival order */
static nb_status fold_ranks(nb_ctx *ctx, int n, const char *blocks, void *out, size_t count, nb_dtype t,
                            nb_comm_reduce op) {
  size_t bytes = count * nb_dtype_size(t);
  if (bytes) memmove(out, blocks, bytes);
  nb_status s = NB_OK;
  for (int r = 1; !s && r < n; r++) s = nb_comm_fold(ctx, t, out, blocks + (size_t)r * bytes, count, op);
  return s;
}

/* ---------------------------------------------------------------- requests */

/* A collective in flight: its messages, and for a reduction every rank's
 * block (blocks) to fold into out at the end. The synchronous collectives
 * are a request started and waited for at once, so both give the same bits. */
struct nb_comm_req {
  pending p;
  const char *what;
  char *blocks; /* reductions: size * count elements, rank r's at r; else NULL */
  size_t blocks_bytes;
  void *out;
  size_t count;
  nb_dtype t;
  nb_comm_reduce op;
};

static void req_free(nb_ctx *ctx, nb_comm_req *q) {
  if (q->blocks) nb_dealloc(ctx, q->blocks, q->blocks_bytes);
  nb_dealloc(ctx, q, sizeof *q);
}

/* Starts an exchange (send_stride as in exchange_post) into recv, or, with
 * fold, into blocks of its own that wait folds in rank order into out. */
static nb_status req_start(nb_comm *b, nb_ctx *ctx, const void *send, size_t send_stride, void *recv, size_t bytes,
                           bool fold, void *out, size_t count, nb_dtype t, nb_comm_reduce op, const char *what,
                           nb_comm_req **req) {
  nb_dist__comm *c = (nb_dist__comm *)b;
  *req = NULL;
  nb_comm_req *q = nb_calloc(ctx, sizeof *q);
  if (!q) return NB_ERR_NOMEM;
  q->what = what;
  if (fold) {
    q->blocks_bytes = bytes * (size_t)c->size + 1;
    if (!(q->blocks = nb_alloc(ctx, q->blocks_bytes))) return req_free(ctx, q), NB_ERR_NOMEM;
    recv = q->blocks;
    q->out = out;
    q->count = count;
    q->t = t;
    q->op = op;
  }
  nb_status s = exchange_post(c, ctx, &q->p, send, send_stride, recv, bytes);
  if (s) {
    /* posted messages cannot be left behind: wait for them (or the timeout) */
    wait_all(c, ctx, &q->p, what);
    return req_free(ctx, q), s;
  }
  *req = q;
  return NB_OK;
}

static nb_status mpi_wait(nb_comm *b, nb_ctx *ctx, nb_comm_req *q) {
  nb_dist__comm *c = (nb_dist__comm *)b;
  nb_status s = wait_all(c, ctx, &q->p, q->what);
  if (!s && q->blocks) s = fold_ranks(ctx, c->size, q->blocks, q->out, q->count, q->t, q->op);
  req_free(ctx, q);
  return s;
}

/* NABLA_DIST_PROGRESS=none: test leaves the messages alone (only wait moves
 * them), to measure what polling between steps buys (bench/dist_overlap.sh). */
static bool progress_off(void) {
  static int off = -1;
  if (off < 0) {
    const char *e = getenv("NABLA_DIST_PROGRESS");
    off = e && !strcmp(e, "none");
  }
  return off;
}

static nb_status mpi_test(nb_comm *b, nb_ctx *ctx, nb_comm_req *q, bool *done) {
  *done = false;
  if (progress_off()) return NB_OK;
  int flag = 0;
  if (MPI_Testall(q->p.n, q->p.req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
    return nb_errorf(ctx, NB_ERR_IO, "dist: %s on %s: MPI_Testall failed", q->what, ((nb_dist__comm *)b)->label);
  *done = flag != 0;
  return NB_OK;
}

static nb_status mpi_allgather_start(nb_comm *b, nb_ctx *ctx, const void *send, void *recv, size_t bytes,
                                     nb_comm_req **req) {
  return req_start(b, ctx, send, 0, recv, bytes, false, NULL, 0, NB_F32, NB_COMM_SUM, "allgather", req);
}

static nb_status mpi_allreduce_start(nb_comm *b, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op,
                                     nb_comm_req **req) {
  return req_start(b, ctx, buf, 0, NULL, count * nb_dtype_size(t), true, buf, count, t, op, "allreduce", req);
}

/* Block r of every rank's send comes to rank r (an all_to_all), which folds them in rank order. */
static nb_status mpi_reduce_scatter_start(nb_comm *b, nb_ctx *ctx, const void *send, void *recv, size_t count,
                                          nb_dtype t, nb_comm_reduce op, nb_comm_req **req) {
  size_t bytes = count * nb_dtype_size(t);
  return req_start(b, ctx, send, bytes, NULL, bytes, true, recv, count, t, op, "reduce_scatter", req);
}

static nb_status mpi_allreduce(nb_comm *b, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op) {
  nb_comm_req *q;
  nb_status s = mpi_allreduce_start(b, ctx, buf, count, t, op, &q);
  return s ? s : mpi_wait(b, ctx, q);
}

static nb_status mpi_reduce_scatter(nb_comm *b, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                                    nb_comm_reduce op) {
  nb_comm_req *q;
  nb_status s = mpi_reduce_scatter_start(b, ctx, send, recv, count, t, op, &q);
  return s ? s : mpi_wait(b, ctx, q);
}

static nb_status mpi_all_to_all(nb_comm *b, nb_ctx *ctx, const void *send, void *recv, size_t bytes) {
  return exchange(b, ctx, send, bytes, recv, bytes, "all_to_all");
}

static nb_status mpi_sendrecv(nb_comm *b, nb_ctx *ctx, const void *send, int dst, void *recv, int src, size_t bytes) {
  nb_dist__comm *c = (nb_dist__comm *)b;
  if (dst < -1 || dst >= c->size || src < -1 || src >= c->size)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist: sendrecv with rank %d/%d of %d", dst, src, c->size);
  next_tag(c);
  pending p = {0};
  nb_status s = NB_OK;
  if (src >= 0 && src != c->rank) s = post(c, ctx, &p, true, recv, bytes, src);
  if (!s && dst >= 0 && dst != c->rank) s = post(c, ctx, &p, false, (void *)send, bytes, dst);
  if (!s && src == c->rank && dst == c->rank && bytes) memmove(recv, send, bytes);
  return s ? s : wait_all(c, ctx, &p, "ppermute");
}

static nb_status mpi_barrier(nb_comm *b, nb_ctx *ctx) {
  char none = 0, *all = nb_alloc(ctx, (size_t)((nb_dist__comm *)b)->size);
  if (!all) return NB_ERR_NOMEM;
  nb_status s = mpi_allgather(b, ctx, &none, all, 1); /* a barrier that names who is missing */
  nb_dealloc(ctx, all, (size_t)((nb_dist__comm *)b)->size);
  return s;
}

static void mpi_abort(nb_comm *b, int code, const char *msg) { nb_dist_abort(code, msg); }

static const nb_comm_ops mpi_ops = {
    .name = "mpi",
    .rank = mpi_rank,
    .size = mpi_size,
    .allgather = mpi_allgather,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .sendrecv = mpi_sendrecv,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .allgather_start = mpi_allgather_start,
    .allreduce_start = mpi_allreduce_start,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .test = mpi_test,
    .wait = mpi_wait,
};

static double default_timeout(void) {
  const char *e = getenv("NABLA_DIST_TIMEOUT");
  double t = e && *e ? strtod(e, NULL) : 0;
  return t > 0 ? t : 120;
}

nb_comm *nb_dist__comm_wrap(nb_ctx *ctx, MPI_Comm comm, const char *label) {
  nb_dist__comm *c = nb_calloc(ctx, sizeof *c);
  if (!c) return NULL;
  c->base.ops = &mpi_ops;
  c->base.timeout_s = default_timeout();
  c->ctx = ctx;
  c->comm = comm;
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  snprintf(c->label, sizeof c->label, "%s", label);
  return &c->base;
}

nb_comm *nb_dist_world(nb_ctx *ctx) {
  if (!mpi_up()) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "dist: MPI is not started (nb_dist_init)"), NULL;
  MPI_Comm dup;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) return nb_errorf(ctx, NB_ERR_IO, "dist: MPI_Comm_dup failed"), NULL;
  nb_comm *c = nb_dist__comm_wrap(ctx, dup, "the world");
  if (!c) MPI_Comm_free(&dup);
  return c;
}

void nb_dist_comm_destroy(nb_comm *b) {
  if (!b) return;
  nb_dist__comm *c = (nb_dist__comm *)b;
  if (mpi_up()) MPI_Comm_free(&c->comm);
  nb_dealloc(c->ctx, c, sizeof *c);
}

#endif /* NABLA_HAVE_MPI (else no_mpi.c) */
