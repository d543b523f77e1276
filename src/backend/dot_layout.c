/* How dot_general's operands lie in memory as batches of matrices, for the
 * backends that run contractions as library GEMMs (backend/cpu/blas.c,
 * backend/cuda/gemm.c). */
#include <string.h>

#include "backend/dot_layout.h"

/* Can dims (ext, str) in this order be walked as one axis? Its stride in
 * *stride. Dims of extent 1 do not count. */
bool nb_dot__collapse(int n, const int64_t *ext, const int64_t *str, int64_t *stride) {
  int64_t expect = -1;
  *stride = 1;
  for (int i = n - 1; i >= 0; i--) {
    if (ext[i] == 1) continue;
    if (expect < 0) *stride = str[i];
    else if (str[i] != expect) return false;
    expect = str[i] * ext[i];
  }
  return true;
}

static void operand_of(const nb_val *v, int nb, const int *batch, int nc, const int *con, nb_dot_operand *o) {
  const nb_shape *s = &v->aval.shape;
  int64_t str[NB_MAX_RANK];
  int64_t acc = 1;
  for (int i = s->rank - 1; i >= 0; i--) str[i] = acc, acc *= s->dims[i];
  memset(o, 0, sizeof *o);
  o->dt = v->aval.dtype;
  o->rows = o->cols = 1;
  bool used[NB_MAX_RANK] = {false};
  for (int i = 0; i < nb; i++) o->bstr[i] = str[batch[i]], used[batch[i]] = true;
  for (int i = 0; i < nc; i++) {
    o->cext[o->ncon] = s->dims[con[i]], o->cstr[o->ncon++] = str[con[i]], used[con[i]] = true;
    o->cols *= s->dims[con[i]];
  }
  for (int i = 0; i < s->rank; i++)
    if (!used[i]) o->fext[o->nfree] = s->dims[i], o->fstr[o->nfree++] = str[i], o->rows *= s->dims[i];
  o->merged = nb_dot__collapse(o->nfree, o->fext, o->fstr, &o->rs) && nb_dot__collapse(o->ncon, o->cext, o->cstr, &o->cs);
}

void nb_dot__plan_of(const nb_eqn *e, nb_dot_plan *p) {
  const nb_dot_params *dp = e->params;
  const nb_dot_dims *dn = &dp->dn;
  memset(p, 0, sizeof *p);
  p->nb = dn->n_batch;
  p->batch = 1;
  for (int i = 0; i < dn->n_batch; i++) p->bext[i] = e->in[0]->aval.shape.dims[dn->lhs_batch[i]], p->batch *= p->bext[i];
  operand_of(e->in[0], dn->n_batch, dn->lhs_batch, dn->n_contract, dn->lhs_contract, &p->a);
  operand_of(e->in[1], dn->n_batch, dn->rhs_batch, dn->n_contract, dn->rhs_contract, &p->b);
  p->m = p->a.rows, p->n = p->b.rows, p->k = p->a.cols;
  p->ot = e->out[0]->aval.dtype;
  p->ct = p->ot == NB_F64 || e->in[0]->aval.dtype == NB_F64 ? NB_F64 : NB_F32;
}

/* How a rows x cols matrix with strides (rs, cs) goes to BLAS as a row-major
 * rows x cols operand: as it is (trans false, ld the row stride) or as the
 * transpose of a cols x rows matrix (trans true, ld the col stride). The
 * stride of an axis of extent <= 1 does not matter. */
bool nb_dot__as_blas(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld) {
  int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
  if (cs == 1 || cols <= 1) {
    int64_t l = rows <= 1 ? c1 : rs;
    if (l >= c1 && l < (1ll << 31)) return *trans = false, *ld = l, true;
  }
  if (rs == 1 || rows <= 1) {
    int64_t l = cols <= 1 ? r1 : cs;
    if (l >= r1 && l < (1ll << 31)) return *trans = true, *ld = l, true;
  }
  return false;
}
