/* Shared by the contraction families (dot.c, conv.c): the accumulation
 * buffers their reference evaluators loop over. An operand is copied once
 * into a contiguous, permuted buffer of f64 (float dtypes) or i64 (integer
 * dtypes), so the inner loops run over contiguous memory in one type. */
#ifndef NABLA_PRIMS_CONTRACTION_H
#define NABLA_PRIMS_CONTRACTION_H

#include "core/prims/params.h"

/* A host buffer of n accumulator values: f64 when is_float, else i64. */
typedef struct nb__acc_buf {
  bool is_float;
  int64_t n;
  void *p;
} nb__acc_buf;

/* Allocates n values (n may be 0); false on OOM (the error is on ctx). */
bool nb__acc_alloc(nb_ctx *ctx, nb__acc_buf *b, bool is_float, int64_t n);
void nb__acc_free(nb_ctx *ctx, nb__acc_buf *b);

/* Copies array a (borrowed) into b, converted, in the row-major layout whose
 * dim j is a's dim perm[j]. b must hold nb_array_size(a) values. */
void nb__acc_load_permuted(nb__acc_buf *b, const nb_array *a, const int *perm);

/* sum_k x[k] * y[k]; the integer form wraps modulo 2^64. */
double nb__dot_f64(const double *x, const double *y, int64_t n);
int64_t nb__dot_i64(const int64_t *x, const int64_t *y, int64_t n);

#endif
