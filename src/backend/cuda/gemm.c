/* dot_general through cuBLASLt: f32 (CUBLAS_COMPUTE_32F, which is IEEE
 * single precision: no TF32) and f64 (CUBLAS_COMPUTE_64F), operands and
 * result of one dtype, each operand a batch of matrices that a strided
 * batched GEMM takes as it lies (backend/dot_layout.h: its free and
 * contracting dims each one strided axis, one of the two unit-stride, its
 * batch dims one strided axis). The rest is not supported here, so the
 * fusion pass leaves it to dot_general's reference rule (an evaluated step
 * the runtime stages through host memory): integer, f16/bf16, mixed
 * dtypes, layouts that would need packing. Row-major products are the
 * column-major product of the transposes: C^T (n x m) = B (n x k) A^T. */
#ifdef NABLA_HAVE_CUDA
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/cuda.h"
#include "backend/dot_layout.h"

/* batch stride of operand o (elements), or false when its batch dims do not collapse */
static bool batch_stride(const nb_dot_plan *p, const nb_dot_operand *o, int64_t *stride) {
  return nb_dot__collapse(p->nb, p->bext, o->bstr, stride);
}

static bool takes(const nb_dot_plan *p, const nb_dot_operand *o) {
  bool t;
  int64_t ld, bs;
  return o->merged && nb_dot__as_blas(o->rows, o->cols, o->rs, o->cs, &t, &ld) && batch_stride(p, o, &bs);
}

bool nb_cuda__gemm_supported(const nb_eqn *e) {
  if (!nb__rules(e->prim)->gemm || e->nin != 2 || e->nout != 1 || !e->params) return false;
  nb_dtype t = e->in[0]->aval.dtype;
  if ((t != NB_F32 && t != NB_F64) || e->in[1]->aval.dtype != t || e->out[0]->aval.dtype != t) return false;
  nb_dot_plan p;
  nb_dot__plan_of(e, &p);
  return takes(&p, &p.a) && takes(&p, &p.b) && p.batch < INT32_MAX;
}

/* the largest power of two (up to 256) that divides the address */
static uint32_t alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

typedef struct lt_objs {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t x, y, d;
  cublasLtMatmulPreference_t pref;
} lt_objs;

static cublasStatus_t layout(const nb_cuda_api *a, cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols,
                             int64_t ld, int64_t batch, int64_t stride) {
  cublasStatus_t s = a->ltMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  int32_t count = (int32_t)batch;
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = a->ltMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = a->ltMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return s;
}

nb_status nb_cuda__gemm_run(nb_ctx *ctx, const nb_cuda_api *a, cublasLtHandle_t lt, CUstream stream, void *workspace,
                            size_t workspace_bytes, const nb_eqn *e, const void *lhs, const void *rhs, void *out) {
  nb_dot_plan p;
  nb_dot__plan_of(e, &p);
  size_t es = p.ct == NB_F64 ? 8 : 4;
  if (p.batch == 0 || p.m == 0 || p.n == 0) return NB_OK;
  if (p.k == 0) { /* +0.0 in every element */
    CUresult r = a->MemsetD8Async((CUdeviceptr)(uintptr_t)out, 0, (size_t)(p.batch * p.m * p.n) * es, stream);
    return r == CUDA_SUCCESS ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "cuda: cuMemsetD8Async failed (%d)", (int)r);
  }
  bool ta, tb;
  int64_t lda, ldb, sa = 0, sb = 0;
  if (!nb_dot__as_blas(p.m, p.k, p.a.rs, p.a.cs, &ta, &lda) || !nb_dot__as_blas(p.n, p.k, p.b.rs, p.b.cs, &tb, &ldb) ||
      !batch_stride(&p, &p.a, &sa) || !batch_stride(&p, &p.b, &sb))
    return nb_errorf(ctx, NB_ERR_INTERNAL, "cuda: dot_general's layout is not one cuBLASLt takes (gemm_supported said it was)");
  cudaDataType_t dt = p.ct == NB_F64 ? CUDA_R_64F : CUDA_R_32F;
  cublasComputeType_t ct = p.ct == NB_F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  /* X = the rhs as op(X) = B (n x k); Y = the lhs as op(Y) = A^T (k x m) */
  cublasOperation_t opx = tb ? CUBLAS_OP_N : CUBLAS_OP_T, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_objs o = {0};
  cublasStatus_t s = a->ltMatmulDescCreate(&o.desc, ct, dt);
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx);
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.x, dt, tb ? p.n : p.k, tb ? p.k : p.n, ldb, p.batch, sb);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.y, dt, ta ? p.m : p.k, ta ? p.k : p.m, lda, p.batch, sa);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.d, dt, p.n, p.m, p.n, p.batch, p.m * p.n);
  uint64_t ws = workspace_bytes;
  uint32_t alx = alignment(rhs), aly = alignment(lhs), ald = alignment(out);
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulPreferenceCreate(&o.pref);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a->ltMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a->ltMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alx, sizeof alx);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a->ltMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aly, sizeof aly);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a->ltMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ald, sizeof ald);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a->ltMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ald, sizeof ald);
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulAlgoGetHeuristic(lt, o.desc, o.x, o.y, o.d, o.d, o.pref, 1, &h, &found);
  nb_status st = NB_OK;
  if (s != CUBLAS_STATUS_SUCCESS || found < 1)
    st = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "cuda: cuBLASLt has no algorithm for a %s dot_general (batch %lld, %lld x %lld x %lld; status %d)",
                   p.ct == NB_F64 ? "f64" : "f32", (long long)p.batch, (long long)p.m, (long long)p.n, (long long)p.k, (int)s);
  double one = 1, zero = 0;
  float onef = 1, zerof = 0;
  const void *alpha = p.ct == NB_F64 ? (const void *)&one : (const void *)&onef, *beta = p.ct == NB_F64 ? (const void *)&zero : (const void *)&zerof;
  if (st == NB_OK) {
    s = a->ltMatmul(lt, o.desc, alpha, rhs, o.x, lhs, o.y, beta, out, o.d, out, o.d, &h.algo, workspace, workspace_bytes,
                    (cudaStream_t)stream);
    if (s != CUBLAS_STATUS_SUCCESS) st = nb_errorf(ctx, NB_ERR_IO, "cuda: cublasLtMatmul failed (status %d)", (int)s);
  }
  if (o.pref) a->ltMatmulPreferenceDestroy(o.pref);
  if (o.x) a->ltMatrixLayoutDestroy(o.x);
  if (o.y) a->ltMatrixLayoutDestroy(o.y);
  if (o.d) a->ltMatrixLayoutDestroy(o.d);
  if (o.desc) a->ltMatmulDescDestroy(o.desc);
  return st;
}
#endif
