/* The nn library's foundation: parameter lookup by path in the apply
 * context, errors that poison the graph, deterministic per-leaf init keys,
 * the single linear entry point (with its hook), embeddings, and parameter
 * tree edits. Modules built on these live in the other files. */
#include <stdarg.h>
#include <string.h>

#include "nn/internal.h"

/* ---------------------------------------------------------------- helpers */

nb_val *nb_nn__scalar(nb_val *x, double v) { return nb_scalar(nb_val_graph(x), nb_val_dtype(x), v); }

nb_val *nb_nn__sum_last(nb_val *x) {
  int r = nb_val_rank(x), ax[1] = {r - 1};
  return nb_expand_dims(nb_reduce_sum(x, 1, ax), r - 1);
}

nb_val *nb_nn__mean_last(nb_val *x) {
  return nb_div(nb_nn__sum_last(x), nb_nn__scalar(x, (double)nb_val_dim(x, -1)));
}

nb_val *nb_nn__upcast(nb_val *x) {
  nb_dtype t = nb_val_dtype(x);
  return t == NB_BF16 || t == NB_F16 ? nb_convert(x, NB_F32) : x;
}

nb_val *nb_nn__dot_last_first(nb_val *x, nb_val *w) {
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(x) - 1}, .rhs_contract = {0}};
  return nb_dot_general(x, w, &dn, NB_DTYPE_COUNT);
}

nb_val *nb_nn__reshape(nb_val *x, int rank, const int64_t *dims) { return nb_reshape(x, rank, dims); }
nb_val *nb_nn__broadcast_to(nb_val *x, int rank, const int64_t *dims) { return nb_broadcast_to(x, rank, dims); }
nb_val *nb_nn__broadcast_in_dim(nb_val *x, int rank, const int64_t *dims, const int *bdims) {
  return nb_broadcast_in_dim(x, rank, dims, bdims);
}

char *nb_nn_join(char *buf, const char *prefix, const char *name) {
  int n = prefix && *prefix ? snprintf(buf, NB_NN_PATH_MAX, "%s/%s", prefix, name)
                            : snprintf(buf, NB_NN_PATH_MAX, "%s", name);
  return n < 0 || n >= NB_NN_PATH_MAX ? NULL : buf;
}

const char *nb_nn__path(nb_nn_apply *a, char *buf, const char *prefix, const char *name) {
  if (nb_nn_join(buf, prefix, name)) return buf;
  nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: parameter path '%s/%s' is longer than %d bytes", prefix, name,
             NB_NN_PATH_MAX - 1);
  return NULL;
}

const char *nb_nn__init_path(nb_nn_init *in, char *buf, const char *prefix, const char *name) {
  if (nb_nn_join(buf, prefix, name)) return buf;
  nb_errorf(in->ctx, NB_ERR_INVALID_ARG, "nn init: parameter path '%s/%s' is longer than %d bytes", prefix, name,
            NB_NN_PATH_MAX - 1);
  return NULL;
}

/* ---------------------------------------------------------------- errors, params */

nb_val *nb_nn_fail(nb_nn_apply *a, nb_status s, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nb_graph_fail_at((nb_loc){NULL, 0}, a->g, s, "%s", msg); /* the message as given, no location */
}

nb_val *nb_nn__poison(nb_nn_apply *a) { return nb_nn_fail(a, NB_ERR_INTERNAL, "nn: internal error"); }

nb_val *nb_nn_param_opt(nb_nn_apply *a, const char *path) {
  nb_val *v = path && a->params ? nb_tree_get_val(a->params, path) : NULL;
  if (v && a->param_hook) v = a->param_hook(a->param_ud, a, path, v);
  if (v && nb_dtype_is_float(nb_val_dtype(v)) && nb_val_dtype(v) != a->dtype) v = nb_convert(v, a->dtype);
  return v;
}

nb_val *nb_nn_param(nb_nn_apply *a, const char *path) {
  if (!path) return nb_nn_fail(a, NB_ERR_INVALID_ARG, "nn: NULL parameter path");
  nb_val *v = nb_nn_param_opt(a, path);
  if (!v) {
    const nb_leaf *l = a->params ? nb_tree_get(a->params, path) : NULL;
    return nb_nn_fail(a, NB_ERR_NOT_FOUND, "nn: parameter '%s' %s", path,
                      l ? "is not a traced value (pass params as graph inputs)" : "is missing from the parameter tree");
  }
  return v;
}

/* ---------------------------------------------------------------- init leaves */

uint32_t nb_nn_path_hash(const char *path) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)path; *p; p++) h = (h ^ *p) * 16777619u;
  return h;
}

nb_array *nb_nn_leaf_key(nb_ctx *ctx, nb_array *root, const char *path) {
  if (!root || !path) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nn init: NULL key or path"), NULL;
  return nb_key_fold_in(ctx, root, nb_nn_path_hash(path));
}

static nb_status check_init(nb_nn_init *in, const char *path) {
  if (!in || !in->ctx || !in->params || !path) return NB_ERR_INVALID_ARG;
  if (!nb_dtype_is_float(in->dtype))
    return nb_errorf(in->ctx, NB_ERR_DTYPE, "nn init: parameter dtype %s of '%s' is not a float dtype",
                     nb_dtype_name(in->dtype), path);
  return NB_OK;
}

/* An abstract parameter (a shape, no data), held to the size bound every
 * array has, so a spec's count cannot overflow where real arrays could not
 * be made. */
static nb_status put_abstract(nb_nn_init *in, const char *path, int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    if (dims[i] < 0 || (dims[i] && n > (INT64_MAX / 16) / dims[i]))
      return nb_errorf(in->ctx, NB_ERR_SHAPE, "nn init: parameter '%s' is too large (dim %d = %lld)", path, i,
                       (long long)dims[i]);
    else n *= dims[i];
  return nb_tree_set(in->params, path, nb_leaf_aval(nb_aval_make(in->dtype, rank, dims)));
}

static nb_status put(nb_nn_init *in, const char *path, nb_array *a) {
  if (!a) return nb_ctx_status(in->ctx) ? nb_ctx_status(in->ctx) : NB_ERR_NOMEM;
  nb_status s = nb_tree_set_array(in->params, path, a);
  nb_array_release(a);
  return s;
}

nb_status nb_nn_init_normal(nb_nn_init *in, const char *path, int rank, const int64_t *dims, double std) {
  nb_status s = check_init(in, path);
  if (s) return s;
  if (in->abstract) return put_abstract(in, path, rank, dims);
  if (std == 0) return put(in, path, nb_array_zeros(in->ctx, in->dtype, rank, dims));
  if (!in->key) return nb_errorf(in->ctx, NB_ERR_INVALID_ARG, "nn init: no key for random parameter '%s'", path);
  nb_array *k = nb_nn_leaf_key(in->ctx, in->key, path);
  nb_array *z = k ? nb_array_random_normal(in->ctx, k, NB_F32, rank, dims) : NULL;
  nb_array_release(k);
  if (!z) return nb_ctx_status(in->ctx) ? nb_ctx_status(in->ctx) : NB_ERR_NOMEM;
  /* scale in f64, then store in the parameter dtype */
  int64_t n = nb_array_size(z);
  nb_array *out = nb_array_empty(in->ctx, NB_F64, rank, dims);
  if (!out) {
    nb_array_release(z);
    return NB_ERR_NOMEM;
  }
  double *o = nb_array_data_mut(out);
  for (int64_t i = 0; i < n; i++) o[i] = std * nb_array_get(z, i);
  nb_array_release(z);
  nb_array *cast = in->dtype == NB_F64 ? out : nb_array_astype(in->ctx, out, in->dtype);
  if (cast != out) nb_array_release(out);
  return put(in, path, cast);
}

nb_status nb_nn_init_const(nb_nn_init *in, const char *path, int rank, const int64_t *dims, double value) {
  nb_status s = check_init(in, path);
  if (s) return s;
  if (in->abstract) return put_abstract(in, path, rank, dims);
  return put(in, path, nb_array_full(in->ctx, in->dtype, rank, dims, value));
}

/* ---------------------------------------------------------------- linear */

nb_status nb_nn_linear_init(nb_nn_init *in, const char *path, int64_t d_in, int64_t d_out, bool bias, double std) {
  char p[NB_NN_PATH_MAX];
  int64_t dk[2] = {d_in, d_out};
  if (!nb_nn__init_path(in, p, path, "kernel")) return NB_ERR_INVALID_ARG;
  nb_status s = nb_nn_init_normal(in, p, 2, dk, std);
  if (s || !bias) return s;
  if (!nb_nn__init_path(in, p, path, "bias")) return NB_ERR_INVALID_ARG;
  return nb_nn_init_const(in, p, 1, &d_out, 0);
}

nb_status nb_nn_linear_stacked_init(nb_nn_init *in, const char *path, int64_t e, int64_t d_in, int64_t d_out,
                                    bool bias, double std) {
  char p[NB_NN_PATH_MAX];
  int64_t dk[3] = {e, d_in, d_out}, db[2] = {e, d_out};
  if (!nb_nn__init_path(in, p, path, "kernel")) return NB_ERR_INVALID_ARG;
  nb_status s = nb_nn_init_normal(in, p, 3, dk, std);
  if (s || !bias) return s;
  if (!nb_nn__init_path(in, p, path, "bias")) return NB_ERR_INVALID_ARG;
  return nb_nn_init_const(in, p, 2, db, 0);
}

/* x @ kernel (+ bias); `held`: an unstacked kernel held in the serving
 * layout, [d_out, d_in] (contracted along its rows) or panels
 * [d_out / w, d_in, w] (contracted along its middle dim, the result's two
 * dims merged back into d_out). */
static nb_val *linear(nb_nn_apply *a, const char *path, nb_val *x, bool stacked, bool held) {
  char pk[NB_NN_PATH_MAX], pb[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, pk, path, "kernel") || !nb_nn__path(a, pb, path, "bias")) return nb_nn__poison(a);
  nb_val *w = nb_nn_param(a, pk);
  if (nb_graph_status(a->g)) return w;
  bool panels = held && nb_val_rank(w) == 3;
  int wr = stacked || panels ? 3 : 2, xr = nb_val_rank(x), in_axis = held ? 1 : -2;
  if (nb_val_rank(w) != wr || xr < (stacked ? 2 : 1) || nb_val_dim(x, -1) != nb_val_dim(w, in_axis) ||
      (stacked && nb_val_dim(x, 0) != nb_val_dim(w, 0))) {
    char sx[96], sw[96];
    nb_aval ax = nb_val_aval(x), aw = nb_val_aval(w);
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: linear '%s': input %s does not fit kernel %s%s", path,
                      nb_aval_str(&ax, sx, sizeof sx), nb_aval_str(&aw, sw, sizeof sw),
                      stacked  ? " (stacked: [E, ..., d_in] against [E, d_in, d_out])"
                      : held   ? " ([..., d_in] against [d_out, d_in] or panels [d_out / w, d_in, w])"
                               : " ([..., d_in] against [d_in, d_out])");
  }
  if (nb_val_dtype(x) != nb_val_dtype(w)) x = nb_convert(x, nb_val_dtype(w));
  nb_val *y;
  if (!stacked) {
    nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {xr - 1}, .rhs_contract = {held ? 1 : 0}};
    y = nb_dot_general(x, w, &dn, NB_DTYPE_COUNT);
    if (panels) { /* [..., d_out / w, w] -> [..., d_out] */
      int64_t dims[NB_MAX_RANK];
      for (int i = 0; i < xr - 1; i++) dims[i] = nb_val_dim(x, i);
      dims[xr - 1] = nb_val_dim(w, 0) * nb_val_dim(w, 2);
      y = nb_reshape(y, xr, dims);
    }
  } else {
    nb_dot_dims dn = {.n_contract = 1, .n_batch = 1, .lhs_contract = {xr - 1}, .rhs_contract = {1},
                      .lhs_batch = {0}, .rhs_batch = {0}};
    y = nb_dot_general(x, w, &dn, NB_DTYPE_COUNT);
  }
  nb_val *b = nb_nn_param_opt(a, pb);
  if (!b) return y;
  if (!stacked) return nb_add(y, b);
  /* bias [E, d_out] -> [E, 1, ..., 1, d_out] */
  int64_t dims[NB_MAX_RANK];
  int r = nb_val_rank(y);
  for (int i = 0; i < r; i++) dims[i] = i == 0 || i == r - 1 ? nb_val_dim(y, i) : 1;
  return nb_add(y, nb_reshape(b, r, dims));
}

nb_val *nb_nn_linear_default(nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  return linear(a, path, x, stacked, false);
}

nb_val *nb_nn_linear_held(nb_nn_apply *a, const char *path, nb_val *x) { return linear(a, path, x, false, true); }

nb_val *nb_nn_linear(nb_nn_apply *a, const char *path, nb_val *x) {
  return a->linear_hook ? a->linear_hook(a->hook_ud, a, path, x, false) : nb_nn_linear_default(a, path, x, false);
}

nb_val *nb_nn_linear_stacked(nb_nn_apply *a, const char *path, nb_val *x) {
  return a->linear_hook ? a->linear_hook(a->hook_ud, a, path, x, true) : nb_nn_linear_default(a, path, x, true);
}

/* ---------------------------------------------------------------- embeddings */

nb_status nb_nn_embed_init(nb_nn_init *in, const char *path, int64_t vocab, int64_t d, double std) {
  char p[NB_NN_PATH_MAX];
  int64_t dims[2] = {vocab, d};
  if (!nb_nn__init_path(in, p, path, "embedding")) return NB_ERR_INVALID_ARG;
  return nb_nn_init_normal(in, p, 2, dims, std);
}

nb_val *nb_nn_embed(nb_nn_apply *a, const char *path, nb_val *ids) {
  char p[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, p, path, "embedding")) return nb_nn__poison(a);
  nb_val *table = nb_nn_param(a, p);
  if (nb_graph_status(a->g)) return table;
  if (nb_val_rank(table) != 2 || !nb_dtype_is_int(nb_val_dtype(ids)))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: embedding '%s' must be [vocab, d] and its ids integers (got %s ids)", p,
                      nb_dtype_name(nb_val_dtype(ids)));
  return nb_take(table, ids);
}

nb_val *nb_nn_embed_attend(nb_nn_apply *a, const char *path, nb_val *x) {
  char p[NB_NN_PATH_MAX];
  if (!nb_nn__path(a, p, path, "embedding")) return nb_nn__poison(a);
  nb_val *table = nb_nn_param(a, p);
  if (nb_graph_status(a->g)) return table;
  if (nb_val_rank(table) != 2 || nb_val_dim(table, 1) != nb_val_dim(x, -1))
    return nb_nn_fail(a, NB_ERR_SHAPE, "nn: tied projection '%s': input features %lld, embedding width %lld", p,
                      (long long)nb_val_dim(x, -1), (long long)nb_val_dim(table, -1));
  if (nb_val_dtype(x) != nb_val_dtype(table)) x = nb_convert(x, nb_val_dtype(table));
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {nb_val_rank(x) - 1}, .rhs_contract = {1}};
  return nb_dot_general(x, table, &dn, NB_DTYPE_COUNT);
}

/* ---------------------------------------------------------------- trees */

static bool under(const char *path, const char *prefix) {
  size_t n = strlen(prefix);
  return strncmp(path, prefix, n) == 0 && (path[n] == 0 || path[n] == '/');
}

nb_status nb_nn_params_replace(nb_tree *params, const char *prefix, const nb_tree *src) {
  nb_ctx *ctx = nb_tree_ctx(params);
  if (!prefix || !*prefix || !src) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nn: params_replace needs a prefix and a tree");
  for (size_t i = nb_tree_size(params); i-- > 0;) {
    const char *p = nb_tree_path(params, i);
    if (under(p, prefix)) {
      char copy[NB_NN_PATH_MAX];
      snprintf(copy, sizeof copy, "%s", p);
      nb_status s = nb_tree_remove(params, copy);
      if (s) return s;
    }
  }
  return nb_tree_merge(params, prefix, src);
}

int64_t nb_nn_params_count(const nb_tree *params) {
  int64_t n = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(params, i));
    if (__builtin_add_overflow(n, nb_shape_size(&av.shape), &n)) return INT64_MAX;
  }
  return n;
}
