/* CPU backend: dot_general through OpenBLAS's cblas_sgemm / cblas_dgemm.
 * The primitive is looked up by name in the rules table, so this file
 * builds whether or not dot_general exists yet. Handled layouts: batch dims
 * leading and in order on both sides, the contracting dims consecutive on
 * each side (before or after the free dims: the transposes become the
 * call's flags), f32 or f64 throughout; anything else runs the reference
 * implementation. Batches are a loop of calls. */
#include <stdatomic.h>
#include <string.h>

#include "compile/jit.h"
#ifdef NABLA_HAVE_CBLAS
#include <cblas.h>
#endif

int nb_cpu__dot_prim(void) {
  static _Atomic int cached = -2;
  int c = atomic_load(&cached);
  if (c != -2) return c;
  c = -1;
  for (int p = 0; p < NB_PRIM_COUNT; p++)
    if (nb__prim_table[p] && strcmp(nb__prim_table[p]->name, "dot_general") == 0) c = p;
  atomic_store(&cached, c);
  return c;
}

typedef struct gemm_shape {
  int64_t batch, m, n, k;
  bool ta, tb;
} gemm_shape;

/* dims [from, from+n) of the operand, in order, are `list` */
static bool consecutive(const int *list, int n, int from) {
  for (int i = 0; i < n; i++)
    if (list[i] != from + i) return false;
  return true;
}

static bool shape_of(const nb_eqn *e, gemm_shape *g) {
  const nb_dot_params *p = e->params;
  const nb_dot_dims *dn = &p->dn;
  const nb_shape *ls = &e->in[0]->aval.shape, *rs = &e->in[1]->aval.shape;
  int nb = dn->n_batch, nc = dn->n_contract;
  if (!consecutive(dn->lhs_batch, nb, 0) || !consecutive(dn->rhs_batch, nb, 0)) return false;
  int lfree = ls->rank - nb - nc, rfree = rs->rank - nb - nc;
  if (lfree < 0 || rfree < 0) return false;
  if (consecutive(dn->lhs_contract, nc, ls->rank - nc)) g->ta = false;      /* [b, M, K] */
  else if (consecutive(dn->lhs_contract, nc, nb)) g->ta = true;             /* [b, K, M] */
  else return false;
  if (consecutive(dn->rhs_contract, nc, nb)) g->tb = false;                 /* [b, K, N] */
  else if (consecutive(dn->rhs_contract, nc, rs->rank - nc)) g->tb = true;  /* [b, N, K] */
  else return false;
  g->batch = g->m = g->n = g->k = 1;
  for (int i = 0; i < nb; i++) g->batch *= ls->dims[i];
  for (int i = 0; i < nc; i++) g->k *= ls->dims[dn->lhs_contract[i]];
  for (int i = nb; i < ls->rank; i++) g->m *= ls->dims[i];
  g->m /= g->k ? g->k : 1;
  for (int i = nb; i < rs->rank; i++) g->n *= rs->dims[i];
  g->n /= g->k ? g->k : 1;
  if (g->k == 0) { /* sizes from the free dims directly */
    g->m = g->n = 1;
    for (int i = 0; i < ls->rank; i++) {
      bool c = false;
      for (int j = 0; j < nb + nc; j++) c |= (j < nb ? dn->lhs_batch[j] : dn->lhs_contract[j - nb]) == i;
      if (!c) g->m *= ls->dims[i];
    }
    for (int i = 0; i < rs->rank; i++) {
      bool c = false;
      for (int j = 0; j < nb + nc; j++) c |= (j < nb ? dn->rhs_batch[j] : dn->rhs_contract[j - nb]) == i;
      if (!c) g->n *= rs->dims[i];
    }
  }
  return true;
}

bool nb_cpu__blas_supported(const nb_eqn *e) {
#ifdef NABLA_HAVE_CBLAS
  if ((int)e->prim != nb_cpu__dot_prim() || e->nin != 2 || e->nout != 1 || !e->params) return false;
  nb_dtype t = e->in[0]->aval.dtype;
  if ((t != NB_F32 && t != NB_F64) || e->in[1]->aval.dtype != t || e->out[0]->aval.dtype != t) return false;
  gemm_shape g;
  return shape_of(e, &g) && g.m < (1ll << 31) && g.n < (1ll << 31) && g.k < (1ll << 31);
#else
  (void)e;
  return false;
#endif
}

void nb_cpu__blas_run(const nb_eqn *e, const void *lhs, const void *rhs, void *out) {
#ifdef NABLA_HAVE_CBLAS
  gemm_shape g;
  if (!shape_of(e, &g) || g.m == 0 || g.n == 0) return;
  bool f32 = e->out[0]->aval.dtype == NB_F32;
  size_t es = f32 ? 4 : 8;
  if (g.k == 0) {
    memset(out, 0, (size_t)(g.batch * g.m * g.n) * es);
    return;
  }
  int lda = (int)(g.ta ? g.m : g.k), ldb = (int)(g.tb ? g.k : g.n);
  for (int64_t b = 0; b < g.batch; b++) {
    const char *A = (const char *)lhs + (size_t)(b * g.m * g.k) * es, *B = (const char *)rhs + (size_t)(b * g.k * g.n) * es;
    char *C = (char *)out + (size_t)(b * g.m * g.n) * es;
    if (f32)
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, (int)g.m, (int)g.n,
                  (int)g.k, 1.0f, (const float *)A, lda, (const float *)B, ldb, 0.0f, (float *)C, (int)g.n);
    else
      cblas_dgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, (int)g.m, (int)g.n,
                  (int)g.k, 1.0, (const double *)A, lda, (const double *)B, ldb, 0.0, (double *)C, (int)g.n);
  }
#else
  (void)e, (void)lhs, (void)rhs, (void)out;
#endif
}

void nb_cpu__blas_threads(int n) {
#ifdef NABLA_HAVE_CBLAS
  openblas_set_num_threads(n > 0 ? n : 1);
#else
  (void)n;
#endif
}
