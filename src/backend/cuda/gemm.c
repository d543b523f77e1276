/* dot_general through cuBLASLt: f32 (CUBLAS_COMPUTE_32F, which is IEEE
 * single precision: no TF32) and f64 (CUBLAS_COMPUTE_64F) in and out, bf16
 * and f16 in with the result in the same dtype or f32 (f32 compute, rounded
 * once at the end, as backend/cpu/blas.c does), each operand a batch of
 * matrices that cuBLASLt takes as it lies (backend/dot_layout.h: its free
 * and contracting dims each one strided axis, one of the two unit-stride).
 * Batch dims become the call's strided batch, those that do not fold into
 * one stride a loop of calls. Not supported here, so the fusion pass leaves
 * it to dot_general's reference rule (an evaluated step the runtime stages
 * through host memory): integer dots, f32<->f64 mixes, layouts that would
 * need packing (a batch dim between free dims). Row-major products are the
 * column-major product of the transposes: C^T (n x m) = B (n x k) A^T. */
#ifdef NABLA_HAVE_CUDA
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/cuda.h"
#include "backend/dot_layout.h"

/* The batch dims [split, nb) that every operand walks as one strided axis
 * (the call's strided batch); the dims before split are looped over on the
 * host, one call each. GPT-2's attention has batch dims (B, H) that are not
 * one axis of q ([B,T,H,1,hd]): B calls of H-batched products. */
static int batch_split(const nb_dot_plan *p, int64_t *sa, int64_t *sb) {
  int split = 0;
  while (split < p->nb && !(nb_dot__collapse(p->nb - split, p->bext + split, p->a.bstr + split, sa) &&
                            nb_dot__collapse(p->nb - split, p->bext + split, p->b.bstr + split, sb)))
    split++;
  if (split == p->nb) *sa = *sb = 0;
  return split;
}

static bool takes(const nb_dot_operand *o) {
  bool t;
  int64_t ld;
  return o->merged && nb_dot__as_blas(o->rows, o->cols, o->rs, o->cs, &t, &ld);
}

/* cuBLASLt's type of a dtype, and whether its f32 compute takes it */
static bool lt_type(nb_dtype t, cudaDataType_t *out) {
  switch (t) {
  case NB_F32: *out = CUDA_R_32F; return true;
  case NB_F64: *out = CUDA_R_64F; return true;
  case NB_BF16: *out = CUDA_R_16BF; return true;
  case NB_F16: *out = CUDA_R_16F; return true;
  default: return false;
  }
}

/* f32 and f64 in and out; bf16 and f16 in, out in the same dtype or f32 */
static bool dtypes_ok(nb_dtype in, nb_dtype out) {
  if (in == NB_F32 || in == NB_F64) return out == in;
  return (in == NB_BF16 || in == NB_F16) && (out == in || out == NB_F32);
}

bool nb_cuda__gemm_supported(const nb_eqn *e) {
  if (!nb__rules(e->prim)->gemm || e->nin != 2 || e->nout != 1 || !e->params) return false;
  nb_dtype t = e->in[0]->aval.dtype;
  if (e->in[1]->aval.dtype != t || !dtypes_ok(t, e->out[0]->aval.dtype)) return false;
  nb_dot_plan p;
  nb_dot__plan_of(e, &p);
  if (p.batch == 0 || p.m == 0 || p.n == 0 || p.k == 0) return true; /* nothing to multiply */
  return takes(&p.a) && takes(&p.b) && p.batch < INT32_MAX;
}

/* the largest power of two (up to 256) that divides the address */
static uint32_t alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

/* The alignment every call's pointer has: the base's and each host-looped
 * batch stride's. */
static uint32_t alignment_all(const void *base, const int64_t *bstr, int split, size_t es) {
  uint32_t al = alignment(base);
  for (int i = 0; i < split; i++) {
    uint32_t s = alignment((const void *)(uintptr_t)((uint64_t)bstr[i] * es));
    al = s < al ? s : al;
  }
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
  nb_dtype it = e->in[0]->aval.dtype;
  size_t ies = (size_t)nb_dtype_size(it), oes = (size_t)nb_dtype_size(p.ot);
  if (p.batch == 0 || p.m == 0 || p.n == 0) return NB_OK;
  if (p.k == 0) { /* +0.0 in every element */
    CUresult r = a->MemsetD8Async((CUdeviceptr)(uintptr_t)out, 0, (size_t)(p.batch * p.m * p.n) * oes, stream);
    return r == CUDA_SUCCESS ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "cuda: cuMemsetD8Async failed (%d)", (int)r);
  }
  bool ta, tb;
  int64_t lda, ldb, sa = 0, sb = 0;
  cudaDataType_t dti, dto;
  if (!nb_dot__as_blas(p.m, p.k, p.a.rs, p.a.cs, &ta, &lda) || !nb_dot__as_blas(p.n, p.k, p.b.rs, p.b.cs, &tb, &ldb) ||
      !lt_type(it, &dti) || !lt_type(p.ot, &dto))
    return nb_errorf(ctx, NB_ERR_INTERNAL, "cuda: dot_general's layout is not one cuBLASLt takes (gemm_supported said it was)");
  int split = batch_split(&p, &sa, &sb);
  int64_t inner = 1, outer = 1;
  for (int i = 0; i < p.nb; i++) *(i < split ? &outer : &inner) *= p.bext[i];
  bool f64 = p.ct == NB_F64;
  cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  /* X = the rhs as op(X) = B (n x k); Y = the lhs as op(Y) = A^T (k x m) */
  cublasOperation_t opx = tb ? CUBLAS_OP_N : CUBLAS_OP_T, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_objs o = {0};
  cublasStatus_t s = a->ltMatmulDescCreate(&o.desc, ct, scale);
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx);
  if (s == CUBLAS_STATUS_SUCCESS) s = a->ltMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.x, dti, tb ? p.n : p.k, tb ? p.k : p.n, ldb, inner, sb);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.y, dti, ta ? p.m : p.k, ta ? p.k : p.m, lda, inner, sa);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(a, &o.d, dto, p.n, p.m, p.n, inner, p.m * p.n);
  uint64_t ws = workspace_bytes;
  int64_t cstr[NB_MAX_RANK]; /* the result's batch strides: contiguous */
  int64_t acc = p.m * p.n;
  for (int i = p.nb - 1; i >= 0; i--) cstr[i] = acc, acc *= p.bext[i];
  uint32_t alx = alignment_all(rhs, p.b.bstr, split, ies), aly = alignment_all(lhs, p.a.bstr, split, ies),
           ald = alignment_all(out, cstr, split, oes);
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
    st = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "cuda: cuBLASLt has no algorithm for a %s->%s dot_general (batch %lld, %lld x %lld x %lld; status %d)",
                   nb_dtype_name(it), nb_dtype_name(p.ot), (long long)p.batch, (long long)p.m, (long long)p.n, (long long)p.k, (int)s);
  double one = 1, zero = 0;
  float onef = 1, zerof = 0;
  const void *alpha = f64 ? (const void *)&one : (const void *)&onef, *beta = f64 ? (const void *)&zero : (const void *)&zerof;
  for (int64_t q = 0; q < outer && st == NB_OK; q++) {
    int64_t oa = 0, ob = 0, oc = q * inner * p.m * p.n, rest = q;
    for (int i = split - 1; i >= 0; i--) {
      oa += rest % p.bext[i] * p.a.bstr[i];
      ob += rest % p.bext[i] * p.b.bstr[i];
      rest /= p.bext[i];
    }
    const char *x = (const char *)rhs + (size_t)ob * ies, *y = (const char *)lhs + (size_t)oa * ies;
    char *d = (char *)out + (size_t)oc * oes;
    s = a->ltMatmul(lt, o.desc, alpha, x, o.x, y, o.y, beta, d, o.d, d, o.d, &h.algo, workspace, workspace_bytes, (cudaStream_t)stream);
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
