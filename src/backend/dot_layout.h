/* How dot_general's operands lie in memory as batches of row-major
 * matrices (dot_layout.c), shared by the backends' GEMM glue. Private to
 * src/backend/. */
#ifndef NABLA_BACKEND_DOT_LAYOUT_H
#define NABLA_BACKEND_DOT_LAYOUT_H

#include "compile/jit.h"

/* One operand as a batch of rows x cols matrices: rows are its free dims in
 * order, cols its contracting dims in the dimension numbers' order. Strides
 * are in elements. */
typedef struct nb_dot_operand {
  const char *base;
  nb_dtype dt;
  int nfree, ncon;
  int64_t fext[NB_MAX_RANK], fstr[NB_MAX_RANK];
  int64_t cext[NB_MAX_RANK], cstr[NB_MAX_RANK];
  int64_t bstr[NB_MAX_RANK];
  int64_t rows, cols;
  bool merged;      /* free dims and contracting dims each collapse to one axis */
  int64_t rs, cs;   /* merged: the strides of those two axes */
} nb_dot_operand;

typedef struct nb_dot_plan {
  int nb;
  int64_t bext[NB_MAX_RANK];
  int64_t batch, m, n, k;
  nb_dot_operand a, b;     /* a is M x K, b is N x K */
  nb_dtype ct, ot;  /* compute dtype (f32/f64), output dtype */
} nb_dot_plan;

/* The layout of e (a dot_general): batch, m, n, k, both operands (bases
 * unset), the compute dtype (f64 when an operand or the result is, else f32)
 * and the output dtype. */
void nb_dot__plan_of(const nb_eqn *e, nb_dot_plan *p);
/* Can dims (ext, str) in this order be walked as one axis? Its stride in
 * *stride. Dims of extent 1 do not count. */
bool nb_dot__collapse(int n, const int64_t *ext, const int64_t *str, int64_t *stride);
/* How a rows x cols matrix with strides (rs, cs) goes to a row-major BLAS
 * call: as it is (trans false, ld the row stride) or as the transpose of a
 * cols x rows matrix (trans true, ld the col stride); false when neither. */
bool nb_dot__as_blas(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld);

#endif
