/* The manifest: building its JSON from a written snapshot, parsing and fully
 * validating it back into an nb_ckpt_info (every field a damaged or hostile
 * file could get wrong is checked here, before any data is touched), and the
 * snapshot a save takes of its items. Not here: reading data files. */
#include <cjson/cJSON.h>
#include <string.h>

#include "ckpt/internal.h"

/* ---- snapshots ------------------------------------------------------------ */

void nb_ckpt__snapshot_free(nb_ckpt__snapshot *s) {
  if (!s) return;
  nb_ctx *ctx = s->ctx;
  for (size_t i = 0; i < s->n_items; i++) {
    nb_ckpt__snap_item *it = &s->items[i];
    for (size_t j = 0; j < it->n; j++) {
      nb_ckpt_string_free(ctx, it->arrays[j].path);
      nb_array_release(it->arrays[j].array);
    }
    if (it->arrays) nb_dealloc(ctx, it->arrays, it->n * sizeof *it->arrays);
    nb_ckpt_string_free(ctx, it->name);
  }
  if (s->items) nb_dealloc(ctx, s->items, s->n_items * sizeof *s->items);
  nb_ckpt_string_free(ctx, s->metadata);
  nb_dealloc(ctx, s, sizeof *s);
}

/* A host array holding a's data: a itself (retained) when on the host. */
static nb_array *host_snapshot(nb_ctx *ctx, nb_array *a) {
  if (nb_array_device(a).kind == NB_DEVICE_CPU) {
    nb_array_retain(a);
    return a;
  }
  nb_array *h = nb_array_empty(ctx, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a));
  if (h && nb_array_copy_out(ctx, a, nb_array_data_mut(h), nb_array_nbytes(h)) != NB_OK) {
    nb_array_release(h);
    return NULL;
  }
  return h;
}

static nb_status snap_item(nb_ctx *ctx, const nb_ckpt_item *in, nb_ckpt__snap_item *out) {
  if (!in->tree) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint item '%s': tree is NULL", in->name);
  size_t n = nb_tree_size(in->tree);
  if (!(out->name = nb_strdup(ctx, in->name))) return NB_ERR_NOMEM;
  if (n && !(out->arrays = nb_calloc(ctx, n * sizeof *out->arrays))) return NB_ERR_NOMEM;
  out->n = n; /* entries not yet filled stay NULL */
  for (size_t j = 0; j < n; j++) {
    const nb_leaf *l = nb_tree_leaf(in->tree, j);
    const char *path = nb_tree_path(in->tree, j);
    if (l->kind != NB_LEAF_ARRAY)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint item '%s': leaf '%s' is not an array", in->name, path);
    nb_ckpt__snap_array *sa = &out->arrays[j];
    if (!(sa->path = nb_strdup(ctx, path))) return NB_ERR_NOMEM;
    if (!(sa->array = host_snapshot(ctx, l->array))) return nb_ctx_status(ctx);
    sa->whole = nb_array_aval(sa->array).shape;
  }
  return NB_OK;
}

static nb_status check_metadata(nb_ctx *ctx, const char *json, char **compact) {
  *compact = NULL;
  if (!json) return NB_OK;
  cJSON *j = cJSON_ParseWithOpts(json, NULL, true);
  if (!j) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint metadata is not valid JSON: '%.60s'", json);
  char *txt = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!txt) return nb_errorf(ctx, NB_ERR_NOMEM, "out of memory printing checkpoint metadata");
  *compact = nb_strdup(ctx, txt);
  cJSON_free(txt);
  return *compact ? NB_OK : NB_ERR_NOMEM;
}

nb_ckpt__snapshot *nb_ckpt__snapshot_take(nb_ctx *ctx, int64_t step, const nb_ckpt_item *items, int n_items,
                                          const nb_ckpt_save_opts *opts) {
  if (n_items < 0 || (n_items > 0 && !items))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint save: %d items but items is NULL", n_items), NULL;
  for (int i = 0; i < n_items; i++) {
    if (!nb_ckpt__valid_item_name(items[i].name))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                       "checkpoint item name '%s' is invalid (1-64 of [A-Za-z0-9_.-], not starting with '.')",
                       items[i].name ? items[i].name : "(null)"), NULL;
    for (int k = 0; k < i; k++)
      if (!strcmp(items[i].name, items[k].name))
        return nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint item '%s' is given twice", items[i].name), NULL;
  }
  nb_ckpt__snapshot *s = nb_calloc(ctx, sizeof *s);
  if (!s) return NULL;
  s->ctx = ctx;
  s->step = step;
  if (opts) {
    s->has_metric = opts->has_metric;
    s->metric = opts->metric;
  }
  nb_status st = check_metadata(ctx, opts ? opts->metadata_json : NULL, &s->metadata);
  if (st == NB_OK && n_items > 0 && !(s->items = nb_calloc(ctx, (size_t)n_items * sizeof *s->items)))
    st = NB_ERR_NOMEM;
  if (st == NB_OK) s->n_items = (size_t)n_items;
  for (int i = 0; st == NB_OK && i < n_items; i++) st = snap_item(ctx, &items[i], &s->items[i]);
  if (st != NB_OK) {
    nb_ckpt__snapshot_free(s);
    return NULL;
  }
  return s;
}

/* ---- building ---------------------------------------------------------------- */

static cJSON *int_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

/* The array with this process's one shard: the block at start of the whole
 * shape (all of it in a one-process save). */
static cJSON *array_json(const char *item, const nb_ckpt__snap_array *sa, int process) {
  nb_aval av = nb_array_aval(sa->array);
  char hex[17], file[96];
  nb_ckpt__hex64(sa->xxh3, hex);
  snprintf(file, sizeof file, NB_CKPT__DATA_FILE, item, process);
  cJSON *a = cJSON_CreateObject(), *shards = cJSON_CreateArray(), *sh = cJSON_CreateObject();
  cJSON_AddStringToObject(a, "path", sa->path);
  cJSON_AddStringToObject(a, "dtype", nb_dtype_name(av.dtype));
  cJSON_AddItemToObject(a, "shape", int_array(sa->whole.dims, sa->whole.rank));
  cJSON_AddNumberToObject(a, "nbytes", (double)(nb_shape_size(&sa->whole) * (int64_t)nb_dtype_size(av.dtype)));
  cJSON_AddStringToObject(sh, "file", file);
  cJSON_AddNumberToObject(sh, "offset", (double)sa->offset);
  cJSON_AddNumberToObject(sh, "nbytes", (double)nb_array_nbytes(sa->array));
  cJSON_AddItemToObject(sh, "start", int_array(sa->start, av.shape.rank));
  cJSON_AddItemToObject(sh, "shape", int_array(av.shape.dims, av.shape.rank));
  cJSON_AddStringToObject(sh, "xxh3", hex);
  cJSON_AddItemToArray(shards, sh);
  cJSON_AddItemToObject(a, "shards", shards);
  return a;
}

char *nb_ckpt__manifest_build(nb_ctx *ctx, const nb_ckpt__snapshot *s) {
  cJSON *root = cJSON_CreateObject(), *items = cJSON_CreateArray();
  cJSON_AddStringToObject(root, "format", NB_CKPT__FORMAT);
  cJSON_AddNumberToObject(root, "version", NB_CKPT__VERSION);
  cJSON_AddNumberToObject(root, "step", (double)s->step);
  if (s->has_metric) cJSON_AddNumberToObject(root, "metric", s->metric);
  if (s->metadata) cJSON_AddItemToObject(root, "metadata", cJSON_Parse(s->metadata));
  for (size_t i = 0; i < s->n_items; i++) {
    const nb_ckpt__snap_item *it = &s->items[i];
    cJSON *item = cJSON_CreateObject(), *arrays = cJSON_CreateArray();
    cJSON_AddStringToObject(item, "name", it->name);
    for (size_t j = 0; j < it->n; j++) cJSON_AddItemToArray(arrays, array_json(it->name, &it->arrays[j], s->process));
    cJSON_AddItemToObject(item, "arrays", arrays);
    cJSON_AddItemToArray(items, item);
  }
  cJSON_AddItemToObject(root, "items", items);
  char *txt = cJSON_Print(root);
  cJSON_Delete(root);
  if (!txt) return nb_errorf(ctx, NB_ERR_NOMEM, "out of memory building the manifest of step %lld",
                             (long long)s->step), NULL;
  char *out = nb_strdup(ctx, txt);
  cJSON_free(txt);
  return out;
}

/* ---- parsing ------------------------------------------------------------------ */

typedef struct parser {
  nb_ctx *ctx;
  const char *what;    /* the file, for messages */
  nb_ckpt_info *info;
} parser;

static nb_status bad(parser *p, const char *where, const char *why) {
  return nb_errorf(p->ctx, NB_ERR_FORMAT, "manifest '%s': %s: %s", p->what, where, why);
}

static nb_status get_int(parser *p, const cJSON *obj, const char *key, const char *where, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(v) || !nb_ckpt__json_int(v->valuedouble, 0, out))
    return nb_errorf(p->ctx, NB_ERR_FORMAT, "manifest '%s': %s: '%s' must be an integer >= 0", p->what, where, key);
  return NB_OK;
}

/* shape-like arrays: n entries (n <= NB_MAX_RANK), each an integer >= 0 */
static nb_status get_dims(parser *p, const cJSON *obj, const char *key, const char *where, int64_t *dims, int *n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  int k = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  if (k < 0 || k > NB_MAX_RANK)
    return nb_errorf(p->ctx, NB_ERR_FORMAT, "manifest '%s': %s: '%s' must be an array of at most %d integers",
                     p->what, where, key, NB_MAX_RANK);
  int i = 0;
  for (const cJSON *e = v->child; e; e = e->next, i++)
    if (!cJSON_IsNumber(e) || !nb_ckpt__json_int(e->valuedouble, 0, &dims[i]))
      return nb_errorf(p->ctx, NB_ERR_FORMAT, "manifest '%s': %s: '%s'[%d] must be an integer >= 0", p->what, where,
                       key, i);
  *n = k;
  return NB_OK;
}

/* product of dims times elem, or false on overflow past 2^53 */
static bool volume(const int64_t *dims, int rank, uint64_t elem, uint64_t *out) {
  uint64_t v = elem;
  for (int i = 0; i < rank; i++) {
    if (dims[i] && v > (UINT64_C(1) << 53) / (uint64_t)dims[i]) return false;
    v *= (uint64_t)dims[i];
  }
  *out = v;
  return true;
}

static nb_status parse_shard(parser *p, const cJSON *j, nb_ckpt__array *a, nb_ckpt__shard *sh, const char *where) {
  if (!cJSON_IsObject(j)) return bad(p, where, "a shard must be an object");
  const cJSON *file = cJSON_GetObjectItemCaseSensitive(j, "file");
  if (!cJSON_IsString(file) || !nb_ckpt__valid_file_name(file->valuestring))
    return bad(p, where, "shard 'file' must be a plain file name");
  if (!(sh->file = nb_strdup(p->ctx, file->valuestring))) return NB_ERR_NOMEM;
  int64_t off, nbytes;
  int rs, re;
  nb_status s = get_int(p, j, "offset", where, &off);
  if (s == NB_OK) s = get_int(p, j, "nbytes", where, &nbytes);
  if (s == NB_OK) s = get_dims(p, j, "start", where, sh->start, &rs);
  if (s == NB_OK) s = get_dims(p, j, "shape", where, sh->extent, &re);
  if (s != NB_OK) return s;
  if (rs != a->e.shape.rank || re != a->e.shape.rank) return bad(p, where, "shard 'start'/'shape' rank differs from the array's");
  for (int i = 0; i < rs; i++)
    if (sh->start[i] > a->e.shape.dims[i] || sh->extent[i] > a->e.shape.dims[i] - sh->start[i])
      return bad(p, where, "shard exceeds the array's shape");
  uint64_t vol;
  if (!volume(sh->extent, re, nb_dtype_size(a->e.dtype), &vol) || vol != (uint64_t)nbytes)
    return bad(p, where, "shard 'nbytes' does not match its shape and dtype");
  if ((uint64_t)off % nb_dtype_size(a->e.dtype) != 0) return bad(p, where, "shard 'offset' is not aligned to the dtype");
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
  if (!cJSON_IsString(h) || !nb_ckpt__parse_hex64(h->valuestring, &sh->xxh3))
    return bad(p, where, "shard 'xxh3' must be 16 lowercase hex digits");
  sh->offset = (uint64_t)off;
  sh->nbytes = (uint64_t)nbytes;
  return NB_OK;
}

static bool boxes_overlap(const nb_ckpt__shard *a, const nb_ckpt__shard *b, int rank) {
  for (int i = 0; i < rank; i++)
    if (a->start[i] + a->extent[i] <= b->start[i] || b->start[i] + b->extent[i] <= a->start[i]) return false;
  return true;
}

/* The shards must tile the array: volumes sum to the whole, none overlap. */
static nb_status check_tiling(parser *p, const nb_ckpt__array *a, const char *where) {
  uint64_t total = 0;
  for (int i = 0; i < a->e.n_shards; i++) {
    total += a->shards[i].nbytes;
    for (int k = 0; k < i; k++)
      if (a->shards[i].nbytes && a->shards[k].nbytes && boxes_overlap(&a->shards[i], &a->shards[k], a->e.shape.rank))
        return bad(p, where, "shards overlap");
  }
  if (total != a->e.nbytes) return bad(p, where, "shards do not cover the array");
  return NB_OK;
}

static nb_status parse_array(parser *p, const cJSON *j, const char *item, nb_ckpt__array *a, const char *where) {
  a->e.item = item;
  if (!cJSON_IsObject(j)) return bad(p, where, "an array entry must be an object");
  const cJSON *path = cJSON_GetObjectItemCaseSensitive(j, "path"), *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  if (!cJSON_IsString(path) || !nb_ckpt__valid_tree_path(path->valuestring))
    return bad(p, where, "'path' must be a tree path (non-empty, no empty component)");
  if (!(a->e.path = nb_strdup(p->ctx, path->valuestring))) return NB_ERR_NOMEM;
  char w[256];
  snprintf(w, sizeof w, "array '%s/%s'", item, a->e.path);
  if (!cJSON_IsString(dt) || !nb_dtype_from_name(dt->valuestring, &a->e.dtype))
    return bad(p, w, "unknown 'dtype'");
  int64_t nbytes;
  nb_status s = get_dims(p, j, "shape", w, a->e.shape.dims, &a->e.shape.rank);
  if (s == NB_OK) s = get_int(p, j, "nbytes", w, &nbytes);
  if (s != NB_OK) return s;
  uint64_t vol;
  if (!volume(a->e.shape.dims, a->e.shape.rank, nb_dtype_size(a->e.dtype), &vol) || vol != (uint64_t)nbytes)
    return bad(p, w, "'nbytes' does not match shape and dtype");
  a->e.nbytes = (size_t)nbytes;
  const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
  int ns = cJSON_IsArray(shards) ? cJSON_GetArraySize(shards) : 0;
  if (ns < 1 || ns > NB_CKPT__MAX_SHARDS) return bad(p, w, "'shards' must be a non-empty array");
  if (!(a->shards = nb_calloc(p->ctx, (size_t)ns * sizeof *a->shards))) return NB_ERR_NOMEM;
  a->e.n_shards = ns;
  int k = 0;
  for (const cJSON *e = shards->child; e; e = e->next, k++)
    if ((s = parse_shard(p, e, a, &a->shards[k], w)) != NB_OK) return s;
  return check_tiling(p, a, w);
}

static nb_status parse_items(parser *p, const cJSON *items) {
  nb_ckpt_info *info = p->info;
  if (!cJSON_IsArray(items)) return bad(p, "top level", "'items' must be an array");
  size_t n_items = (size_t)cJSON_GetArraySize(items), n = 0;
  for (const cJSON *it = items->child; it; it = it->next) {
    const cJSON *arrays = cJSON_GetObjectItemCaseSensitive(it, "arrays");
    if (!cJSON_IsArray(arrays)) return bad(p, "items", "every item needs an 'arrays' array");
    n += (size_t)cJSON_GetArraySize(arrays);
  }
  if (n_items && !(info->items = nb_calloc(p->ctx, n_items * sizeof(char *)))) return NB_ERR_NOMEM;
  info->n_items = n_items;
  if (n && !(info->arrays = nb_calloc(p->ctx, n * sizeof *info->arrays))) return NB_ERR_NOMEM;
  info->cap_arrays = n;
  nb_tree *seen = nb_tree_create(p->ctx); /* full paths, to find duplicates */
  if (!seen) return NB_ERR_NOMEM;
  nb_status s = NB_OK;
  size_t i = 0, k = 0;
  for (const cJSON *it = items->child; s == NB_OK && it; it = it->next, i++) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
    if (!cJSON_IsString(name) || !nb_ckpt__valid_item_name(name->valuestring)) {
      s = bad(p, "items", "item 'name' must be 1-64 of [A-Za-z0-9_.-]");
      break;
    }
    for (size_t q = 0; q < i && s == NB_OK; q++)
      if (!strcmp(info->items[q], name->valuestring)) s = bad(p, name->valuestring, "item given twice");
    if (s != NB_OK || !(info->items[i] = nb_strdup(p->ctx, name->valuestring))) {
      s = s != NB_OK ? s : NB_ERR_NOMEM;
      break;
    }
    const cJSON *arrays = cJSON_GetObjectItemCaseSensitive(it, "arrays");
    for (const cJSON *a = arrays->child; s == NB_OK && a; a = a->next) {
      nb_ckpt__array *arr = &info->arrays[k++];
      info->n = k;
      s = parse_array(p, a, info->items[i], arr, info->items[i]);
      char full[NB_CKPT__PATH_CAP];
      if (s == NB_OK) s = nb_ckpt__pathf(p->ctx, full, "%s/%s", arr->e.item, arr->e.path);
      size_t before = nb_tree_size(seen);
      if (s == NB_OK) s = nb_tree_set(seen, full, nb_leaf_aval(nb_aval_make(NB_U8, 0, NULL)));
      if (s == NB_OK && nb_tree_size(seen) == before) s = bad(p, full, "path given twice");
      if (s == NB_OK) info->total_bytes += arr->e.nbytes;
    }
  }
  nb_tree_destroy(seen);
  return s;
}

static nb_status parse_root(parser *p, const cJSON *root) {
  nb_ckpt_info *info = p->info;
  if (!cJSON_IsObject(root)) return bad(p, "top level", "not a JSON object");
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, NB_CKPT__FORMAT) != 0)
    return bad(p, "top level", "'format' is not \"" NB_CKPT__FORMAT "\"");
  int64_t version;
  nb_status s = get_int(p, root, "version", "top level", &version);
  if (s != NB_OK) return s;
  if (version != NB_CKPT__VERSION)
    return nb_errorf(p->ctx, NB_ERR_FORMAT,
                     "manifest '%s': format version %lld, this nabla reads version %d (hint: this checkpoint was "
                     "written by a %s nabla)", p->what, (long long)version, NB_CKPT__VERSION,
                     version > NB_CKPT__VERSION ? "newer" : "different");
  if ((s = get_int(p, root, "step", "top level", &info->step)) != NB_OK) return s;
  const cJSON *metric = cJSON_GetObjectItemCaseSensitive(root, "metric");
  if (metric) {
    if (!cJSON_IsNumber(metric)) return bad(p, "top level", "'metric' must be a number");
    info->has_metric = true;
    info->metric = metric->valuedouble;
  }
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
  if (meta) {
    char *txt = cJSON_PrintUnformatted(meta);
    if (!txt) return nb_errorf(p->ctx, NB_ERR_NOMEM, "out of memory reading manifest metadata");
    info->metadata = nb_strdup(p->ctx, txt);
    cJSON_free(txt);
    if (!info->metadata) return NB_ERR_NOMEM;
  }
  return parse_items(p, cJSON_GetObjectItemCaseSensitive(root, "items"));
}

nb_ckpt_info *nb_ckpt__manifest_parse(nb_ctx *ctx, const char *text, size_t n, const char *what) {
  nb_ckpt_info *info = nb_calloc(ctx, sizeof *info);
  if (!info) return NULL;
  info->ctx = ctx;
  parser p = {ctx, what, info};
  cJSON *root = cJSON_ParseWithLength(text, n);
  nb_status s = root ? parse_root(&p, root) : bad(&p, "top level", "not valid JSON");
  cJSON_Delete(root);
  if (s != NB_OK) {
    nb_ckpt_info_destroy(info);
    return NULL;
  }
  return info;
}

/* ---- info accessors ------------------------------------------------------------ */

void nb_ckpt_info_destroy(nb_ckpt_info *info) {
  if (!info) return;
  nb_ctx *ctx = info->ctx;
  for (size_t i = 0; i < info->n; i++) {
    nb_ckpt__array *a = &info->arrays[i];
    nb_ckpt_string_free(ctx, (char *)a->e.path);
    for (int k = 0; a->shards && k < a->e.n_shards; k++) nb_ckpt_string_free(ctx, a->shards[k].file);
    if (a->shards) nb_dealloc(ctx, a->shards, (size_t)a->e.n_shards * sizeof *a->shards);
  }
  if (info->arrays) nb_dealloc(ctx, info->arrays, info->cap_arrays * sizeof *info->arrays);
  for (size_t i = 0; i < info->n_items; i++) nb_ckpt_string_free(ctx, info->items[i]);
  if (info->items) nb_dealloc(ctx, info->items, info->n_items * sizeof(char *));
  nb_ckpt_string_free(ctx, info->metadata);
  nb_ckpt_string_free(ctx, info->dir);
  nb_dealloc(ctx, info, sizeof *info);
}

int64_t nb_ckpt_info_step(const nb_ckpt_info *info) { return info->step; }
size_t nb_ckpt_info_count(const nb_ckpt_info *info) { return info->n; }
const nb_ckpt_entry *nb_ckpt_info_entry(const nb_ckpt_info *info, size_t i) {
  return i < info->n ? &info->arrays[i].e : NULL;
}
const char *nb_ckpt_info_metadata(const nb_ckpt_info *info) { return info->metadata; }
bool nb_ckpt_info_metric(const nb_ckpt_info *info, double *metric) {
  if (info->has_metric && metric) *metric = info->metric;
  return info->has_metric;
}
size_t nb_ckpt_info_total_bytes(const nb_ckpt_info *info) { return info->total_bytes; }
