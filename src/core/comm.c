/* The context's mesh axes (name -> communicator), the one-process
 * communicator, and the fold step every deterministic reduction is made of.
 * The collective primitives (prims/collective.c) run through these; the
 * transports (MPI, later NCCL) live in other libraries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

/* f32 and f64 in their own type: the same bits as the double path below (a
 * sum of two floats rounded to double, then to float, is the float sum:
 * 53 >= 2 * 24 + 2 bits), in loops the compiler vectorizes (the generic
 * loads made a 16 MiB psum's fold ~8x slower than its messages). */
#define FOLD_LOOP(T)                                                                                    \
  do {                                                                                                  \
    T *restrict d = dst;                                                                                \
    const T *restrict s = src;                                                                          \
    if (op == NB_COMM_SUM)                                                                              \
      for (size_t i = 0; i < count; i++) d[i] = d[i] + s[i];                                            \
    else                                                                                                \
      for (size_t i = 0; i < count; i++) d[i] = (d[i] != d[i] || s[i] != s[i]) ? d[i] + s[i] : d[i] > s[i] ? d[i] : s[i]; \
  } while (0)

nb_status nb_comm_fold(nb_ctx *ctx, nb_dtype t, void *dst, const void *src, size_t count, nb_comm_reduce op) {
  if (op != NB_COMM_SUM && op != NB_COMM_MAX) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "comm fold: reduce op %d unknown", op);
  if (t == NB_BOOL) return nb_errorf(ctx, NB_ERR_DTYPE, "comm fold: cannot reduce bool (convert first)");
  if (t == NB_F32) {
    FOLD_LOOP(float);
  } else if (t == NB_F64) {
    FOLD_LOOP(double);
  } else if (nb_dtype_is_float(t)) {
    for (size_t i = 0; i < count; i++) {
      /* one add in double, then one rounding to t: the correctly rounded
       * sum for f32, bf16, f16 (double holds their sums exactly or rounds
       * innocuously), the plain one for f64 */
      double a = nb__load_f64(t, dst, (int64_t)i), b = nb__load_f64(t, src, (int64_t)i);
      double r = op == NB_COMM_SUM ? a + b : (a != a || b != b) ? a + b : a > b ? a : b;
      nb__store_f64(t, dst, (int64_t)i, r);
    }
  } else {
    for (size_t i = 0; i < count; i++) {
      int64_t a = nb__load_i64(t, dst, (int64_t)i), b = nb__load_i64(t, src, (int64_t)i);
      int64_t r = op == NB_COMM_SUM ? (int64_t)((uint64_t)a + (uint64_t)b) : a > b ? a : b;
      nb__store_i64(t, dst, (int64_t)i, r);
    }
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- self */

static int self_rank(const nb_comm *c) { return 0; }
static int self_size(const nb_comm *c) { return 1; }
static nb_status self_copy(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t bytes) {
  if (bytes && send != recv) memmove(recv, send, bytes);
  return NB_OK;
}
static nb_status self_allreduce(nb_comm *c, nb_ctx *ctx, void *buf, size_t count, nb_dtype t, nb_comm_reduce op) {
  return NB_OK;
}
static nb_status self_reduce_scatter(nb_comm *c, nb_ctx *ctx, const void *send, void *recv, size_t count, nb_dtype t,
                                     nb_comm_reduce op) {
  return self_copy(c, ctx, send, recv, count * nb_dtype_size(t));
}
static nb_status self_sendrecv(nb_comm *c, nb_ctx *ctx, const void *send, int dst, void *recv, int src, size_t bytes) {
  if ((dst != -1 && dst != 0) || (src != -1 && src != 0))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "comm self: sendrecv with rank %d/%d of 1", dst, src);
  if (src == 0 && dst == 0) return self_copy(c, ctx, send, recv, bytes);
  return NB_OK;
}
static nb_status self_barrier(nb_comm *c, nb_ctx *ctx) { return NB_OK; }
static void self_abort(nb_comm *c, int code, const char *msg) {
  fprintf(stderr, "nabla: abort: %s\n", msg);
  exit(code ? code : 1);
}

static const nb_comm_ops self_ops = {
    .name = "self",
    .rank = self_rank,
    .size = self_size,
    .allgather = self_copy,
    .allreduce = self_allreduce,
    .reduce_scatter = self_reduce_scatter,
    .all_to_all = self_copy,
    .sendrecv = self_sendrecv,
    .barrier = self_barrier,
    .abort = self_abort,
};

static nb_comm self_comm = {.ops = &self_ops, .timeout_s = 0};

nb_comm *nb_comm_self(void) { return &self_comm; }

/* ---------------------------------------------------------------- axes */

nb_status nb_ctx_bind_axis(nb_ctx *ctx, const char *axis, nb_comm *comm) {
  if (!ctx || !axis) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "bind axis: NULL context or axis name");
  size_t n = strlen(axis);
  if (n == 0 || n >= NB_AXIS_NAME_MAX)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "bind axis: axis name '%s' must have 1 to %d characters", axis,
                     NB_AXIS_NAME_MAX - 1);
  int i = 0;
  while (i < ctx->naxes && strcmp(ctx->axes[i].name, axis)) i++;
  if (!comm) { /* unbind */
    if (i < ctx->naxes) {
      memmove(&ctx->axes[i], &ctx->axes[i + 1], (size_t)(ctx->naxes - i - 1) * sizeof ctx->axes[0]);
      ctx->naxes--;
    }
    return NB_OK;
  }
  if (!comm->ops) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "bind axis '%s': communicator without operations", axis);
  if (i == ctx->naxes) {
    if (ctx->naxes == NB_MAX_AXES)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "bind axis '%s': already %d axes bound", axis, NB_MAX_AXES);
    memcpy(ctx->axes[i].name, axis, n + 1);
    ctx->naxes++;
  }
  ctx->axes[i].comm = comm;
  return NB_OK;
}

nb_comm *nb_ctx_axis(const nb_ctx *ctx, const char *axis) {
  for (int i = 0; ctx && axis && i < ctx->naxes; i++)
    if (!strcmp(ctx->axes[i].name, axis)) return ctx->axes[i].comm;
  return NULL;
}
