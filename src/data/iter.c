/* Iterators: the node life cycle, timed next(), the source iterator over a
 * map dataset, the per-element stages (map, filter), padded batching, state
 * save/restore as JSON, and statistics. Not here: pack (pack.c) and
 * prefetch (prefetch.c). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

nb_data_iter *nb_data__iter_new(nb_ctx *ctx, const nb_data__iter_ops *ops, nb_data_iter *child, size_t impl_size) {
  nb_data_iter *it = nb_calloc(ctx, sizeof *it);
  void *impl = it ? nb_calloc(ctx, impl_size ? impl_size : 1) : NULL;
  if (!impl) {
    nb_dealloc(ctx, it, sizeof *it);
    nb_data_iter_destroy(child);
    return NULL;
  }
  it->ctx = ctx;
  it->ops = ops;
  it->child = child;
  it->n_state = ops->own_state + (child ? child->n_state : 0);
  it->impl = impl;
  it->impl_size = impl_size ? impl_size : 1;
  return it;
}

void nb_data_iter_destroy(nb_data_iter *it) {
  if (!it) return;
  if (it->ops->destroy) it->ops->destroy(it);
  nb_data_iter_destroy(it->child);
  nb_dealloc(it->ctx, it->impl, it->impl_size);
  nb_dealloc(it->ctx, it, sizeof *it);
}

void nb_data__stats_add(nb_data__stats *st, int64_t n_out, int64_t ns_self) {
  if (!atomic_load(&st->t_first)) {
    int64_t zero = 0;
    atomic_compare_exchange_strong(&st->t_first, &zero, nb_util__now_ns());
  }
  atomic_fetch_add(&st->n_out, n_out);
  atomic_fetch_add(&st->ns_self, ns_self);
}

nb_status nb_data_iter_next(nb_data_iter *it, nb_data_elem *out) {
  nb_data_elem_clear(it->ctx, out);
  int64_t t0 = nb_util__now_ns();
  if (!atomic_load(&it->stats.t_first)) atomic_store(&it->stats.t_first, t0);
  int64_t saved_child = it->ns_child; /* next() may nest (pack's load reads ahead) */
  it->ns_child = 0;
  nb_status s = it->ops->next(it, out);
  if (s) nb_data_elem_clear(it->ctx, out);
  nb_data__stats_add(&it->stats, out->kind != NB_DATA_NONE, nb_util__now_ns() - t0 - it->ns_child);
  it->ns_child = saved_child;
  return s;
}

nb_status nb_data__child_next(nb_data_iter *it, nb_data_elem *out) {
  int64_t t0 = nb_util__now_ns();
  nb_status s = nb_data_iter_next(it->child, out);
  it->ns_child += nb_util__now_ns() - t0;
  return s;
}

void nb_data__save(nb_data_iter *it, int64_t *st) {
  if (it->ops->save) it->ops->save(it, st);
  else if (it->child) nb_data__save(it->child, st);
}

nb_status nb_data__load(nb_data_iter *it, const int64_t *st) {
  if (it->ops->load) return it->ops->load(it, st);
  return it->child ? nb_data__load(it->child, st) : NB_OK;
}

/* ---- source ------------------------------------------------------------------ */

typedef struct source_impl {
  nb_data_map *ds;
  int64_t pos;
} source_impl;

static nb_status source_next(nb_data_iter *it, nb_data_elem *out) {
  source_impl *s = it->impl;
  while (s->pos < s->ds->len) {
    nb_status st = nb_data_map_get(s->ds, s->pos++, out);
    if (st || out->kind != NB_DATA_NONE) return st;
  }
  return NB_OK;
}

static void source_save(nb_data_iter *it, int64_t *st) { st[0] = ((source_impl *)it->impl)->pos; }

static nb_status source_load(nb_data_iter *it, const int64_t *st) {
  source_impl *s = it->impl;
  if (st[0] < 0 || st[0] > s->ds->len)
    return nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "set_state: source position %lld outside the dataset [0, %lld]",
                        (long long)st[0], (long long)s->ds->len);
  s->pos = st[0];
  return NB_OK;
}

static void source_destroy(nb_data_iter *it) { nb_data_map_release(((source_impl *)it->impl)->ds); }

static const nb_data__iter_ops source_ops = {"source", source_next, NULL, 1, source_save, source_load, source_destroy, false};

nb_data_iter *nb_data_iter_create(nb_data_map *ds) {
  if (!ds) return NULL;
  nb_data_iter *it = nb_data__iter_new(ds->ctx, &source_ops, NULL, sizeof(source_impl));
  if (!it) return nb_data_map_release(ds), NULL;
  ((source_impl *)it->impl)->ds = ds;
  return it;
}

nb_data_map *nb_data__iter_source(nb_data_iter *it) {
  return it->ops == &source_ops ? ((source_impl *)it->impl)->ds : NULL;
}

int64_t *nb_data__iter_source_pos(nb_data_iter *it) {
  return it->ops == &source_ops ? &((source_impl *)it->impl)->pos : NULL;
}

/* ---- map, filter ------------------------------------------------------------- */

typedef struct fn_impl {
  nb_data_map_fn map;
  nb_data_filter_fn filter;
  void *ud;
} fn_impl;

static nb_status fn_apply(nb_data_iter *it, nb_data_elem *e, bool *keep) {
  const fn_impl *f = it->impl;
  *keep = true;
  return f->map ? f->map(f->ud, it->ctx, e) : f->filter(f->ud, it->ctx, e, keep);
}

static nb_status elementwise_next(nb_data_iter *it, nb_data_elem *out) {
  for (;;) {
    nb_status s = nb_data__child_next(it, out);
    if (s || out->kind == NB_DATA_NONE) return s;
    bool keep = true;
    s = it->ops->apply(it, out, &keep);
    if (s || keep) return s;
    nb_data_elem_clear(it->ctx, out);
  }
}

static const nb_data__iter_ops map_ops = {"map", elementwise_next, fn_apply, 0, NULL, NULL, NULL, false};
static const nb_data__iter_ops filter_ops = {"filter", elementwise_next, fn_apply, 0, NULL, NULL, NULL, false};

static nb_data_iter *fn_node(nb_data_iter *it, const nb_data__iter_ops *ops, fn_impl f, bool have_fn) {
  if (!it) return NULL;
  if (!have_fn) {
    nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "iterator %s: the function is NULL", ops->name);
    return nb_data_iter_destroy(it), NULL;
  }
  nb_data_iter *n = nb_data__iter_new(it->ctx, ops, it, sizeof(fn_impl));
  if (n) *(fn_impl *)n->impl = f;
  return n;
}

nb_data_iter *nb_data_iter_map(nb_data_iter *it, nb_data_map_fn fn, void *ud) {
  return fn_node(it, &map_ops, (fn_impl){.map = fn, .ud = ud}, fn != NULL);
}

nb_data_iter *nb_data_iter_filter(nb_data_iter *it, nb_data_filter_fn fn, void *ud) {
  return fn_node(it, &filter_ops, (fn_impl){.filter = fn, .ud = ud}, fn != NULL);
}

/* ---- batch ------------------------------------------------------------------ */

typedef struct batch_impl {
  nb_data_batch_opts opts;
  nb_data_elem *elems; /* [batch_size] scratch */
} batch_impl;

static nb_status batch_next(nb_data_iter *it, nb_data_elem *out) {
  batch_impl *b = it->impl;
  int64_t n = 0;
  nb_status s = NB_OK;
  while (!s && n < b->opts.batch_size) {
    s = nb_data__child_next(it, &b->elems[n]);
    if (!s && b->elems[n].kind == NB_DATA_NONE) break;
    n++;
  }
  if (!s && n > 0 && (n == b->opts.batch_size || !b->opts.drop_remainder))
    s = nb_data__stack(it->ctx, b->elems, n, &b->opts, "iterator batch", out);
  for (int64_t k = 0; k <= n && k < b->opts.batch_size; k++) nb_data_elem_clear(it->ctx, &b->elems[k]);
  return s;
}

static void batch_destroy(nb_data_iter *it) {
  batch_impl *b = it->impl;
  nb_dealloc(it->ctx, b->elems, (size_t)b->opts.batch_size * sizeof *b->elems);
}

static const nb_data__iter_ops batch_ops = {"batch", batch_next, NULL, 0, NULL, NULL, batch_destroy, false};

nb_data_iter *nb_data_iter_batch(nb_data_iter *it, const nb_data_batch_opts *opts) {
  if (!it) return NULL;
  if (!opts || opts->batch_size < 1 || opts->pad_to < 0) {
    nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "iterator batch: batch_size must be >= 1 and pad_to >= 0");
    return nb_data_iter_destroy(it), NULL;
  }
  nb_data_iter *n = nb_data__iter_new(it->ctx, &batch_ops, it, sizeof(batch_impl));
  if (!n) return NULL;
  batch_impl *b = n->impl;
  b->opts = *opts;
  b->elems = nb_calloc(n->ctx, (size_t)opts->batch_size * sizeof *b->elems);
  if (!b->elems) {
    b->opts.batch_size = 0;
    return nb_data_iter_destroy(n), NULL;
  }
  return n;
}

/* ---- rows of a global element --------------------------------------------------- */

typedef struct rows_impl {
  int64_t start, count;
} rows_impl;

static nb_status rows_apply(nb_data_iter *it, nb_data_elem *e, bool *keep) {
  const rows_impl *r = it->impl;
  nb_ctx *ctx = it->ctx;
  *keep = true;
  if (e->kind != NB_DATA_TREE) return nb_data__err(ctx, NB_ERR_INVALID_ARG, "iterator rows: the element is not a tree of arrays");
  for (size_t i = 0; i < nb_tree_size(e->tree); i++) {
    const char *path = nb_tree_path(e->tree, i);
    const nb_array *a = nb_tree_leaf(e->tree, i)->array;
    if (!a || nb_array_rank(a) < 1 || !nb_array_data(a))
      return nb_data__err(ctx, NB_ERR_SHAPE, "iterator rows: leaf '%s' is not a host array with a first axis", path);
    int rank = nb_array_rank(a);
    int64_t dims[8];
    if (rank > 8) return nb_data__err(ctx, NB_ERR_SHAPE, "iterator rows: leaf '%s' has rank %d (at most 8)", path, rank);
    memcpy(dims, nb_array_dims(a), (size_t)rank * sizeof *dims);
    if (r->start + r->count > dims[0])
      return nb_data__err(ctx, NB_ERR_SHAPE, "iterator rows: rows [%lld, %lld) of leaf '%s', which has %lld",
                          (long long)r->start, (long long)(r->start + r->count), path, (long long)dims[0]);
    size_t row = nb_dtype_size(nb_array_dtype(a));
    for (int d = 1; d < rank; d++) row *= (size_t)dims[d];
    dims[0] = r->count;
    nb_array *b = nb_array_create(ctx, nb_array_dtype(a), rank, dims, (const char *)nb_array_data(a) + (size_t)r->start * row);
    nb_status s = b ? nb_tree_set_array(e->tree, path, b) : nb_data__err(ctx, NB_ERR_NOMEM, "iterator rows: out of memory");
    nb_array_release(b);
    if (s) return s;
  }
  return NB_OK;
}

static const nb_data__iter_ops rows_ops = {"rows", elementwise_next, rows_apply, 0, NULL, NULL, NULL, true};

nb_data_iter *nb_data_iter_rows(nb_data_iter *it, int64_t start, int64_t count) {
  if (!it) return NULL;
  if (start < 0 || count < 1) {
    nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "iterator rows: start %lld and count %lld (want start >= 0, count >= 1)",
                 (long long)start, (long long)count);
    return nb_data_iter_destroy(it), NULL;
  }
  nb_data_iter *n = nb_data__iter_new(it->ctx, &rows_ops, it, sizeof(rows_impl));
  if (n) *(rows_impl *)n->impl = (rows_impl){start, count};
  return n;
}

/* ---- state ------------------------------------------------------------------ */

#define STATE_FORMAT "nabla.data.iter"
#define STATE_VERSION 1

char *nb_data_iter_get_state(nb_data_iter *it) {
  nb_ctx *ctx = it->ctx;
  int64_t *st = nb_calloc(ctx, (size_t)(it->n_state + 1) * sizeof *st);
  if (!st) return NULL;
  nb_data__save(it, st);
  cJSON *root = cJSON_CreateObject(), *stages = cJSON_AddArrayToObject(root, "stages"),
        *vals = cJSON_AddArrayToObject(root, "state");
  cJSON_AddStringToObject(root, "format", STATE_FORMAT);
  cJSON_AddNumberToObject(root, "version", STATE_VERSION);
  for (nb_data_iter *n = it; n && stages; n = n->child)
    if (!n->ops->not_in_state) cJSON_AddItemToArray(stages, cJSON_CreateString(n->ops->name));
  for (int i = 0; i < it->n_state && vals; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)st[i]); /* strings: exact past 2^53 */
    cJSON_AddItemToArray(vals, cJSON_CreateString(buf));
  }
  nb_dealloc(ctx, st, (size_t)(it->n_state + 1) * sizeof *st);
  char *txt = root && stages && vals ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  char *out = txt ? nb_strdup(ctx, txt) : NULL;
  cJSON_free(txt);
  if (!out) nb_data__err(ctx, NB_ERR_NOMEM, "get_state: out of memory");
  return out;
}

void nb_data_state_free(nb_ctx *ctx, char *state) { nb_strfree(ctx, state); }

static nb_status parse_state(nb_data_iter *it, const cJSON *root, int64_t *st) {
  nb_ctx *ctx = it->ctx;
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format"),
              *ver = cJSON_GetObjectItemCaseSensitive(root, "version"),
              *stages = cJSON_GetObjectItemCaseSensitive(root, "stages"),
              *vals = cJSON_GetObjectItemCaseSensitive(root, "state");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) || !cJSON_IsNumber(ver) || !cJSON_IsArray(stages) ||
      !cJSON_IsArray(vals))
    return nb_data__err(ctx, NB_ERR_FORMAT, "set_state: not a nabla data iterator state");
  if (ver->valueint != STATE_VERSION)
    return nb_data__err(ctx, NB_ERR_FORMAT, "set_state: state version %d; this nabla reads version %d", ver->valueint,
                        STATE_VERSION);
  const cJSON *s = stages->child;
  int k = 0;
  for (nb_data_iter *n = it; n; n = n->child) {
    if (n->ops->not_in_state) continue;
    if (!cJSON_IsString(s) || strcmp(s->valuestring, n->ops->name))
      return nb_data__err(ctx, NB_ERR_INVALID_ARG, "set_state: the state was saved from a different pipeline: stage %d "
                          "is '%s' here but '%s' in the state", k, n->ops->name,
                          cJSON_IsString(s) ? s->valuestring : "(none)");
    s = s ? s->next : NULL;
    k++;
  }
  if (s) return nb_data__err(ctx, NB_ERR_INVALID_ARG, "set_state: the state has more stages than this pipeline");
  if (cJSON_GetArraySize(vals) != it->n_state)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "set_state: %d state values, this pipeline has %d",
                        cJSON_GetArraySize(vals), it->n_state);
  int i = 0;
  for (const cJSON *v = vals->child; v; v = v->next, i++) {
    char *end = NULL;
    st[i] = cJSON_IsString(v) ? strtoll(v->valuestring, &end, 10) : 0;
    if (!end || *end || end == v->valuestring)
      return nb_data__err(ctx, NB_ERR_FORMAT, "set_state: state value %d is not an integer string", i);
  }
  return NB_OK;
}

nb_status nb_data_iter_set_state(nb_data_iter *it, const char *json) {
  nb_ctx *ctx = it->ctx;
  cJSON *root = json ? cJSON_Parse(json) : NULL;
  if (!root) return nb_data__err(ctx, NB_ERR_FORMAT, "set_state: the state is not valid JSON");
  int64_t *st = nb_calloc(ctx, (size_t)(it->n_state + 1) * sizeof *st);
  nb_status s = st ? parse_state(it, root, st) : NB_ERR_NOMEM;
  cJSON_Delete(root);
  if (!s) s = nb_data__load(it, st);
  nb_dealloc(ctx, st, (size_t)(it->n_state + 1) * sizeof *st);
  return s;
}

/* ---- statistics --------------------------------------------------------------- */

void nb_data_iter_print_stats(const nb_data_iter *it, FILE *f) {
  int64_t now = nb_util__now_ns();
  fprintf(f, "%-10s %12s %14s %12s %12s %8s\n", "stage", "elements", "elements/s", "self ms", "wait ms", "buffer");
  for (const nb_data_iter *n = it; n; n = n->child) {
    const nb_data__stats *s = &n->stats;
    int64_t t0 = atomic_load(&s->t_first), cnt = atomic_load(&s->n_out), occ_n = atomic_load(&s->occ_n);
    double secs = t0 ? (double)(now - t0) * 1e-9 : 0;
    char buf[32] = "-";
    if (occ_n) snprintf(buf, sizeof buf, "%.1f", (double)atomic_load(&s->occ_sum) / (double)occ_n);
    fprintf(f, "%-10s %12lld %14.1f %12.2f %12.2f %8s\n", n->ops->name, (long long)cnt, secs > 0 ? (double)cnt / secs : 0,
            (double)atomic_load(&s->ns_self) * 1e-6, (double)atomic_load(&s->ns_wait) * 1e-6, buf);
  }
}
