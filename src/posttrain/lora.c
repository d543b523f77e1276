/* LoRA: the adapter tree, the linear hook that adds the adapters' product to
 * the (frozen, possibly quantized) base's, and merging them into the base. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nabla/posttrain.h"
#include "nabla/quant.h"

static const char *const init_names[NB_PT_LORA_INIT_COUNT] = {"kaiming_uniform", "gaussian"};

const char *nb_pt_lora_init_name(nb_pt_lora_init_kind k) {
  return k >= 0 && k < NB_PT_LORA_INIT_COUNT ? init_names[k] : "?";
}

nb_status nb_pt_lora_init_parse(nb_ctx *ctx, const char *s, nb_pt_lora_init_kind *out) {
  for (int i = 0; i < NB_PT_LORA_INIT_COUNT; i++)
    if (s && !strcmp(s, init_names[i])) return *out = (nb_pt_lora_init_kind)i, NB_OK;
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.init: '%s' is not one of: kaiming_uniform, gaussian", s ? s : "(null)");
}

/* everything but the target (adapters loaded from a file say where they go) */
static nb_status check_numbers(nb_ctx *ctx, const nb_pt_lora_config *c) {
  if (!c) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: NULL config");
  if (c->rank < 1) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.rank: %lld is not >= 1", (long long)c->rank);
  if (!(c->alpha > 0) || !isfinite(c->alpha)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.alpha: %g is not > 0", c->alpha);
  if (!(c->dropout >= 0 && c->dropout < 1)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.dropout: %g is not in [0, 1)", c->dropout);
  if (c->init < 0 || c->init >= NB_PT_LORA_INIT_COUNT) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.init: %d unknown", (int)c->init);
  return NB_OK;
}

static pcre2_code *compile_target(nb_ctx *ctx, const char *target);

nb_status nb_pt_lora_config_check(nb_ctx *ctx, const nb_pt_lora_config *c) {
  nb_status s = check_numbers(ctx, c);
  if (!s && (!c->target || !*c->target)) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.target: empty (a regex over module paths)");
  pcre2_code *re = s ? NULL : compile_target(ctx, c->target); /* a bad regex is named when the config loads */
  if (!s && !re) s = nb_ctx_status(ctx);
  pcre2_code_free(re);
  return s;
}

double nb_pt_lora_scale(const nb_pt_lora_config *c) {
  return c->rslora ? c->alpha / sqrt((double)c->rank) : c->alpha / (double)c->rank;
}

/* ---------------------------------------------------------------- the linears of a base */

/* A linear of the base: its module path and [d_in, d_out]. */
typedef struct linear {
  char *module;
  int64_t d_in, d_out;
  bool stacked, quantized;
} linear;

typedef struct linears {
  int64_t n;
  linear *l;
} linears;

static void linears_free(linears *ls) {
  for (int64_t i = 0; i < ls->n; i++) free(ls->l[i].module);
  free(ls->l);
  *ls = (linears){0};
}

static bool ends_with(const char *s, const char *suffix, size_t *stem) {
  size_t n = strlen(s), m = strlen(suffix);
  if (n <= m || strcmp(s + n - m, suffix)) return false;
  *stem = n - m;
  return true;
}

/* Every "<m>/kernel" of rank 2 or 3 (stacked) and every quantized
 * "<m>/kernel/quant", in base's order. */
static nb_status find_linears(nb_ctx *ctx, const nb_tree *base, linears *out) {
  *out = (linears){0};
  size_t n = nb_tree_size(base);
  out->l = calloc(n + 1, sizeof *out->l);
  if (!out->l) return nb_errorf(ctx, NB_ERR_NOMEM, "lora: out of memory");
  for (size_t i = 0; i < n; i++) {
    const char *p = nb_tree_path(base, i);
    size_t stem;
    linear l = {0};
    if (ends_with(p, "/kernel", &stem)) {
      nb_aval av = nb_leaf_get_aval(nb_tree_leaf(base, i));
      if (av.shape.rank != 2 && av.shape.rank != 3) continue;
      l.stacked = av.shape.rank == 3;
      l.d_in = av.shape.dims[av.shape.rank - 2], l.d_out = av.shape.dims[av.shape.rank - 1];
    } else if (ends_with(p, "/kernel/quant", &stem)) {
      char *m = strndup(p, stem);
      nb_quant_linear q;
      bool found = false;
      nb_status s = m ? nb_quant_tree_linear(ctx, base, m, &q, &found) : NB_ERR_NOMEM;
      free(m);
      if (s) return linears_free(out), s;
      if (!found) continue;
      l.quantized = true, l.d_in = q.layout.k, l.d_out = q.layout.n;
    } else {
      continue;
    }
    l.module = strndup(p, stem);
    if (!l.module) return linears_free(out), nb_errorf(ctx, NB_ERR_NOMEM, "lora: out of memory");
    out->l[out->n++] = l;
  }
  return NB_OK;
}

static const linear *linear_find(const linears *ls, const char *module) {
  for (int64_t i = 0; i < ls->n; i++)
    if (!strcmp(ls->l[i].module, module)) return &ls->l[i];
  return NULL;
}

static pcre2_code *compile_target(nb_ctx *ctx, const char *target) {
  int err;
  PCRE2_SIZE off;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)target, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF,
                                 &err, &off, NULL);
  if (!re) {
    char msg[160];
    pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.target: '%s': %s at offset %zu", target, msg, (size_t)off);
  }
  return re;
}

static bool target_matches(pcre2_code *re, const char *module) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  int rc = md ? pcre2_match(re, (PCRE2_SPTR)module, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) : -1;
  pcre2_match_data_free(md);
  return rc >= 0;
}

static nb_status no_match(nb_ctx *ctx, const char *target, const linears *ls) {
  char list[512] = "";
  size_t at = 0;
  for (int64_t i = 0; i < ls->n && at + 1 < sizeof list; i++)
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", ls->l[i].module);
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora.target: '%s' matches no linear of the base (its linears: %s)", target,
                   ls->n ? list : "none");
}

/* ---------------------------------------------------------------- init */

static nb_status put(nb_ctx *ctx, nb_tree *t, const char *path, nb_array *a) {
  if (!a) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  nb_status s = nb_tree_set_array(t, path, a);
  nb_array_release(a);
  return s;
}

/* A [d_in, r] drawn in f32 from the leaf's key, scaled in f64, stored in dtype */
static nb_array *init_a(nb_ctx *ctx, const nb_pt_lora_config *c, nb_array *key, const char *path, int64_t d_in,
                        nb_dtype dtype) {
  int64_t dims[2] = {d_in, c->rank};
  nb_array *k = nb_nn_leaf_key(ctx, key, path);
  double bound = 1 / sqrt((double)d_in), std = 1 / (double)c->rank;
  nb_array *z = !k ? NULL
                : c->init == NB_PT_LORA_INIT_GAUSSIAN ? nb_array_random_normal(ctx, k, NB_F32, 2, dims)
                                                      : nb_array_random_uniform(ctx, k, NB_F32, 2, dims, -bound, bound);
  nb_array_release(k);
  nb_array *w = z ? nb_array_empty(ctx, NB_F64, 2, dims) : NULL;
  if (w) {
    double *o = nb_array_data_mut(w);
    for (int64_t i = 0; i < d_in * c->rank; i++) o[i] = nb_array_get(z, i) * (c->init == NB_PT_LORA_INIT_GAUSSIAN ? std : 1);
  }
  nb_array_release(z);
  nb_array *cast = w && dtype != NB_F64 ? nb_array_astype(ctx, w, dtype) : w;
  if (cast != w) nb_array_release(w);
  return cast;
}

nb_tree *nb_pt_lora_init(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, nb_array *key, nb_dtype dtype) {
  if (nb_pt_lora_config_check(ctx, c)) return NULL;
  if (!base || !key) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora init: NULL base or key"), NULL;
  if (!nb_dtype_is_float(dtype)) return nb_errorf(ctx, NB_ERR_DTYPE, "lora init: dtype %s is not a float dtype", nb_dtype_name(dtype)), NULL;
  linears ls;
  if (find_linears(ctx, base, &ls)) return NULL;
  pcre2_code *re = compile_target(ctx, c->target);
  nb_tree *t = re ? nb_tree_create(ctx) : NULL;
  nb_status s = t ? NB_OK : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  int64_t matched = 0;
  for (int64_t i = 0; !s && i < ls.n; i++) {
    const linear *l = &ls.l[i];
    if (!target_matches(re, l->module)) continue;
    if (l->stacked) {
      s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "lora.target: '%s' matches '%s', a stacked (per-expert) kernel: not adapted yet",
                    c->target, l->module);
      break;
    }
    char pa[NB_NN_PATH_MAX + 16], pb[NB_NN_PATH_MAX + 16];
    snprintf(pa, sizeof pa, "%s/lora_a", l->module);
    snprintf(pb, sizeof pb, "%s/lora_b", l->module);
    s = put(ctx, t, pa, init_a(ctx, c, key, pa, l->d_in, dtype));
    if (!s) s = put(ctx, t, pb, nb_array_zeros(ctx, dtype, 2, (int64_t[2]){c->rank, l->d_out}));
    matched++;
  }
  if (!s && !matched) s = no_match(ctx, c->target, &ls);
  if (re) pcre2_code_free(re);
  linears_free(&ls);
  if (s) nb_tree_destroy(t);
  return s ? NULL : t;
}

/* ---------------------------------------------------------------- the hook */

struct nb_pt_lora {
  int64_t n;
  char **modules;        /* adapted linears */
  double scale, dropout;
  nb_quant_plan *qplan;  /* the base's quantized linears (maybe none) */
};

void nb_pt_lora_destroy(nb_pt_lora *l) {
  if (!l) return;
  for (int64_t i = 0; i < l->n; i++) free(l->modules[i]);
  free(l->modules);
  nb_quant_plan_destroy(l->qplan);
  free(l);
}

int64_t nb_pt_lora_count(const nb_pt_lora *l) { return l ? l->n : 0; }

/* The adapter pair of module m in adapters, checked against its linear. */
static nb_status check_pair(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *adapters, const linear *l) {
  char pa[NB_NN_PATH_MAX + 16], pb[NB_NN_PATH_MAX + 16];
  snprintf(pa, sizeof pa, "%s/lora_a", l->module);
  snprintf(pb, sizeof pb, "%s/lora_b", l->module);
  const nb_leaf *a = nb_tree_get(adapters, pa), *b = nb_tree_get(adapters, pb);
  if (!a || !b) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: adapters: '%s' has no %s", l->module, a ? "lora_b" : "lora_a");
  nb_aval va = nb_leaf_get_aval(a), vb = nb_leaf_get_aval(b);
  if (va.shape.rank != 2 || va.shape.dims[0] != l->d_in || va.shape.dims[1] != c->rank)
    return nb_errorf(ctx, NB_ERR_SHAPE, "lora: adapters: '%s': [%lld, %lld] wanted (d_in, rank)", pa, (long long)l->d_in,
                     (long long)c->rank);
  if (vb.shape.rank != 2 || vb.shape.dims[0] != c->rank || vb.shape.dims[1] != l->d_out)
    return nb_errorf(ctx, NB_ERR_SHAPE, "lora: adapters: '%s': [%lld, %lld] wanted (rank, d_out)", pb, (long long)c->rank,
                     (long long)l->d_out);
  if (l->stacked) return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "lora: '%s' is a stacked (per-expert) kernel: not adapted yet", l->module);
  return NB_OK;
}

nb_pt_lora *nb_pt_lora_create(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, const nb_tree *adapters) {
  if (check_numbers(ctx, c)) return NULL;
  if (!base || !adapters) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: NULL base or adapters"), NULL;
  linears ls;
  if (find_linears(ctx, base, &ls)) return NULL;
  nb_pt_lora *l = calloc(1, sizeof *l);
  size_t n = nb_tree_size(adapters);
  if (l) l->modules = calloc(n + 1, sizeof *l->modules);
  nb_status s = l && l->modules ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "lora: out of memory");
  for (size_t i = 0; !s && i < n; i++) {
    const char *p = nb_tree_path(adapters, i);
    size_t stem;
    bool is_a = ends_with(p, "/lora_a", &stem);
    if (!is_a && ends_with(p, "/lora_b", &stem)) continue; /* checked with its lora_a */
    if (!is_a) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: adapters: '%s' is neither <module>/lora_a nor <module>/lora_b", p);
      break;
    }
    char *m = strndup(p, stem);
    const linear *lin = m ? linear_find(&ls, m) : NULL;
    if (!m) s = NB_ERR_NOMEM;
    else if (!lin) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: adapters: '%s': the base has no linear '%s'", p, m);
    else s = check_pair(ctx, c, adapters, lin);
    if (s) free(m);
    else l->modules[l->n++] = m;
  }
  /* a lora_b without its lora_a */
  for (size_t i = 0; !s && i < n; i++) {
    const char *p = nb_tree_path(adapters, i);
    size_t stem;
    if (!ends_with(p, "/lora_b", &stem)) continue;
    bool paired = false;
    for (int64_t j = 0; j < l->n && !paired; j++) paired = strlen(l->modules[j]) == stem && !strncmp(l->modules[j], p, stem);
    if (!paired) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora: adapters: '%s' has no lora_a beside it", p);
  }
  if (!s) {
    l->scale = nb_pt_lora_scale(c), l->dropout = c->dropout;
    l->qplan = nb_quant_plan_create(ctx, base);
    if (!l->qplan) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  }
  linears_free(&ls);
  if (s) nb_pt_lora_destroy(l), l = NULL;
  return l;
}

static bool adapted(const nb_pt_lora *l, const char *module) {
  for (int64_t i = 0; i < l->n; i++)
    if (!strcmp(l->modules[i], module)) return true;
  return false;
}

/* x [..., k] @ w [k, n] */
static nb_val *dot_last_first(nb_val *x, nb_val *w) {
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(x) - 1}, .rhs_contract = {0}};
  return nb_dot_general(x, w, &dn, NB_DTYPE_COUNT);
}

nb_val *nb_pt_lora_hook(void *ud, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  const nb_pt_lora *l = ud;
  /* the base product: quant's hook runs a quantized kernel and falls back
   * to the plain x @ kernel (+ bias) for the others */
  nb_val *y = nb_quant_linear_hook(l->qplan, a, path, x, stacked);
  if (!adapted(l, path) || nb_graph_status(a->g)) return y;
  if (stacked) return nb_nn_fail(a, NB_ERR_UNIMPLEMENTED, "lora: '%s': stacked (per-expert) linears are not adapted yet", path);
  char pa[NB_NN_PATH_MAX + 16], pb[NB_NN_PATH_MAX + 16], pd[NB_NN_PATH_MAX + 16];
  snprintf(pa, sizeof pa, "%s/lora_a", path);
  snprintf(pb, sizeof pb, "%s/lora_b", path);
  snprintf(pd, sizeof pd, "%s/lora_dropout", path);
  nb_val *A = nb_nn_param(a, pa), *B = nb_nn_param(a, pb);
  if (nb_graph_status(a->g)) return A;
  nb_dtype t = nb_val_dtype(A);
  nb_val *xa = nb_val_dtype(x) == t ? x : nb_convert(x, t);
  nb_val *h = dot_last_first(nb_nn_dropout(a, pd, xa, l->dropout), A);
  nb_val *d = nb_mul(dot_last_first(h, B), nb_scalar(a->g, t, l->scale));
  if (nb_val_dtype(d) != nb_val_dtype(y)) d = nb_convert(d, nb_val_dtype(y));
  return nb_add(y, d);
}

/* ---------------------------------------------------------------- merge */

/* W [d_in, d_out] + s * A [d_in, r] @ B [r, d_out], in f64, as dtype */
static nb_array *merged_kernel(nb_ctx *ctx, const nb_array *W, const nb_array *A, const nb_array *B, double s, nb_dtype dtype) {
  const int64_t *wd = nb_array_dims(W);
  int64_t din = wd[0], dout = wd[1], r = nb_array_dims(A)[1];
  nb_array *o = nb_array_empty(ctx, NB_F64, 2, wd);
  if (!o) return NULL;
  double *out = nb_array_data_mut(o);
  double *arow = malloc((size_t)r * sizeof *arow);
  if (!arow) return nb_array_release(o), nb_errorf(ctx, NB_ERR_NOMEM, "lora merge: out of memory"), NULL;
  for (int64_t i = 0; i < din; i++) {
    for (int64_t k = 0; k < r; k++) arow[k] = nb_array_get(A, i * r + k);
    for (int64_t j = 0; j < dout; j++) {
      double acc = 0;
      for (int64_t k = 0; k < r; k++) acc += arow[k] * nb_array_get(B, k * dout + j);
      out[i * dout + j] = nb_array_get(W, i * dout + j) + s * acc;
    }
  }
  free(arow);
  nb_array *cast = dtype == NB_F64 ? o : nb_array_astype(ctx, o, dtype);
  if (cast != o) nb_array_release(o);
  return cast;
}

nb_tree *nb_pt_lora_merge(nb_ctx *ctx, const nb_pt_lora_config *c, const nb_tree *base, const nb_tree *adapters) {
  nb_pt_lora *l = nb_pt_lora_create(ctx, c, base, adapters);
  if (!l) return NULL;
  /* quantized kernels come back as f32 "<m>/kernel" at their place */
  nb_tree *plain = nb_quant_plan_count(l->qplan) ? nb_quant_dequantize_tree(ctx, base) : nb_tree_copy(base);
  nb_status s = plain ? NB_OK : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  for (int64_t i = 0; !s && i < l->n; i++) {
    char pk[NB_NN_PATH_MAX + 16], pa[NB_NN_PATH_MAX + 16], pb[NB_NN_PATH_MAX + 16];
    snprintf(pk, sizeof pk, "%s/kernel", l->modules[i]);
    snprintf(pa, sizeof pa, "%s/lora_a", l->modules[i]);
    snprintf(pb, sizeof pb, "%s/lora_b", l->modules[i]);
    nb_array *W = nb_tree_get_array(plain, pk), *A = nb_tree_get_array(adapters, pa), *B = nb_tree_get_array(adapters, pb);
    if (!W || !A || !B) {
      s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "lora merge: '%s': the base's kernel and both adapters must be arrays", l->modules[i]);
      break;
    }
    s = put(ctx, plain, pk, merged_kernel(ctx, W, A, B, l->scale, nb_array_dtype(W)));
  }
  nb_pt_lora_destroy(l);
  if (s) nb_tree_destroy(plain);
  return s ? NULL : plain;
}

nb_status nb_pt__set_lora_key(nb_ctx *ctx, const char *where, const char *key, const char *v, char target[NB_TRAIN_STR_MAX],
                              nb_pt_lora_config *lc) {
  char why[256];
  if (!strcmp(key, "lora.target")) {
    if (strlen(v) >= NB_TRAIN_STR_MAX)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: longer than %d bytes", where, key, NB_TRAIN_STR_MAX - 1);
    snprintf(target, NB_TRAIN_STR_MAX, "%s", v);
    return NB_OK;
  }
  if (!strcmp(key, "lora.rank")) {
    if (!nb_parse_int(v, 1, 1 << 16, &lc->rank, why, sizeof why)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: %s", where, key, why);
    return NB_OK;
  }
  if (!strcmp(key, "lora.alpha") || !strcmp(key, "lora.dropout")) {
    bool alpha = key[5] == 'a';
    double x;
    if (!nb_parse_float(v, alpha ? 1e-30 : 0, alpha ? 1e30 : 0.999999, &x, why, sizeof why))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: %s", where, key, why);
    *(alpha ? &lc->alpha : &lc->dropout) = x;
    return NB_OK;
  }
  if (!strcmp(key, "lora.rslora")) {
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) lc->rslora = true;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) lc->rslora = false;
    else return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not a boolean (true or false)", where, key, v);
    return NB_OK;
  }
  if (!strcmp(key, "lora.init")) {
    if (nb_pt_lora_init_parse(ctx, v, &lc->init)) {
      snprintf(why, sizeof why, "%s", nb_ctx_error(ctx));
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s", where, why);
    }
    return NB_OK;
  }
  return NB_ERR_NOT_FOUND;
}
