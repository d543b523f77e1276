/* One checkpoint written by several processes (FSDP): each process writes
 * the data files of its own blocks into one temporary directory, the
 * processes' partial manifests are gathered, and process 0 merges them (every
 * array with the shards of every writer, in rank order), checks the result
 * as a reader would (the shards must tile each array) and commits it by the
 * one-process protocol (write.c). A process that fails makes every process
 * fail: after each phase the processes agree on the first error. Not here:
 * the step index and retention (manager.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/internal.h"

/* The first error of any process in rank order (OK when none): every
 * process returns the same status; a process that did not fail itself
 * reports which one did. */
static nb_status agree(nb_comm *c, nb_ctx *ctx, nb_status mine, const char *phase) {
  int n = c->ops->size(c), me = c->ops->rank(c);
  int32_t *all = calloc((size_t)n, sizeof *all), v = (int32_t)mine;
  if (!all) return nb_errorf(ctx, NB_ERR_NOMEM, "checkpoint: out of memory");
  nb_status s = c->ops->allgather(c, ctx, &v, all, sizeof v);
  for (int r = 0; !s && r < n; r++)
    if (all[r] != NB_OK) {
      s = (nb_status)all[r];
      if (r != me) nb_errorf(ctx, s, "checkpoint: process %d of %d failed %s (see its log)", r, n, phase);
      break;
    }
  free(all);
  return s;
}

/* Every process's text, in rank order (new strings in *texts[n]; free each and the array). */
static nb_status gather_texts(nb_comm *c, nb_ctx *ctx, const char *mine, char ***texts) {
  int n = c->ops->size(c);
  uint64_t len = strlen(mine), *lens = calloc((size_t)n, sizeof *lens), max = 0;
  nb_status s = lens ? c->ops->allgather(c, ctx, &len, lens, sizeof len) : NB_ERR_NOMEM;
  for (int r = 0; !s && r < n; r++) max = lens[r] > max ? lens[r] : max;
  char *send = s ? NULL : calloc(1, max + 1), *all = s ? NULL : calloc((size_t)n, max + 1);
  char **out = s ? NULL : calloc((size_t)n, sizeof *out);
  if (!s && (!send || !all || !out)) s = nb_errorf(ctx, NB_ERR_NOMEM, "checkpoint: out of memory for the manifests");
  if (!s) {
    memcpy(send, mine, len);
    s = c->ops->allgather(c, ctx, send, all, max + 1);
  }
  for (int r = 0; !s && r < n; r++)
    if (!(out[r] = strndup(all + (size_t)r * (max + 1), lens[r]))) s = NB_ERR_NOMEM;
  if (s && out)
    for (int r = 0; r < n; r++) free(out[r]);
  if (s) free(out);
  else *texts = out;
  free(lens);
  free(send);
  free(all);
  return s;
}

static cJSON *find_named(const cJSON *list, const char *key, const char *value) {
  const cJSON *e;
  cJSON_ArrayForEach(e, list) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, key);
    if (cJSON_IsString(k) && !strcmp(k->valuestring, value)) return (cJSON *)e;
  }
  return NULL;
}

/* Process 0's manifest with every other process's shards appended to its
 * arrays (new string). An array another process has and process 0 lacks is
 * an error: process 0 writes a part of every array. */
static char *merge(nb_ctx *ctx, char **texts, int n) {
  cJSON *root = cJSON_Parse(texts[0]);
  nb_status s = root ? NB_OK : nb_errorf(ctx, NB_ERR_INTERNAL, "checkpoint: process 0's manifest does not parse");
  cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
  for (int r = 1; !s && r < n; r++) {
    cJSON *other = cJSON_Parse(texts[r]);
    const cJSON *it;
    if (!other) s = nb_errorf(ctx, NB_ERR_INTERNAL, "checkpoint: process %d's manifest does not parse", r);
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(other, "items")) {
      const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
      cJSON *mine = find_named(items, "name", name), *arrays = cJSON_GetObjectItemCaseSensitive(mine, "arrays");
      const cJSON *a;
      cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(it, "arrays")) {
        if (s) break;
        const char *path = cJSON_GetObjectItemCaseSensitive(a, "path")->valuestring;
        cJSON *into = find_named(arrays, "path", path);
        if (!into) {
          s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "checkpoint: array '%s/%s' is written by process %d but not by process 0",
                        name, path, r);
          break;
        }
        cJSON *shards = cJSON_GetObjectItemCaseSensitive(into, "shards");
        const cJSON *sh;
        cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(a, "shards"))
          cJSON_AddItemToArray(shards, cJSON_Duplicate(sh, true));
      }
    }
    cJSON_Delete(other);
  }
  char *txt = s ? NULL : cJSON_Print(root);
  cJSON_Delete(root);
  if (!s && !txt) nb_errorf(ctx, NB_ERR_NOMEM, "checkpoint: out of memory merging the manifests");
  return txt;
}

/* Process 0: the merged manifest checked as a reader would, written, committed. */
static nb_status commit_merged(nb_ctx *ctx, const char *root, const char *tmp, int64_t step, char **texts, int n) {
  char *manifest = merge(ctx, texts, n);
  if (!manifest) return nb_ctx_status(ctx);
  size_t len = strlen(manifest);
  nb_ckpt_info *check = nb_ckpt__manifest_parse(ctx, manifest, len, "the merged manifest");
  nb_status s = check ? NB_OK : nb_ctx_status(ctx);
  nb_ckpt_info_destroy(check);
  if (!s) s = nb_ckpt__write_file_durable(ctx, tmp, NB_CKPT__MANIFEST, manifest, len);
  uint64_t mh = nb_ckpt__xxh3(manifest, len);
  free(manifest);
  if (!s) return nb_ckpt__commit(ctx, root, tmp, step, mh);
  return s;
}

nb_status nb_ckpt__save_sharded(nb_ctx *ctx, const char *root, nb_ckpt__snapshot *snap, nb_comm *c, nb_status failed) {
  int me = c->ops->rank(c), n = c->ops->size(c);
  /* the temporary directory is named by process 0's pid */
  int64_t pid = (int64_t)getpid(), *pids = calloc((size_t)n, sizeof *pids);
  nb_status s = pids ? c->ops->allgather(c, ctx, &pid, pids, sizeof pid) : nb_errorf(ctx, NB_ERR_NOMEM, "checkpoint: out of memory");
  char name[32], tmp[NB_CKPT__PATH_CAP], final[NB_CKPT__PATH_CAP];
  nb_ckpt__step_name(snap->step, name);
  if (!s) s = nb_ckpt__pathf(ctx, tmp, "%s/.tmp-%s-%lld-sharded", root, name, (long long)pids[0]);
  if (!s) s = nb_ckpt__pathf(ctx, final, "%s/%s", root, name);
  free(pids);
  if (s) return s;
  nb_status mine = failed;
  if (!mine && me == 0) {
    if (nb_ckpt__exists(final))
      mine = nb_errorf(ctx, NB_ERR_INVALID_ARG, "step %lld already exists in '%s'", (long long)snap->step, root);
    else if (nb_ckpt__exists(tmp)) mine = nb_ckpt__remove_tree(ctx, tmp);
    if (!mine && (nb_ckpt__io_tick() != 0 || mkdir(tmp, 0755) != 0))
      mine = nb_errorf(ctx, NB_ERR_IO, "cannot create directory '%s': %s", tmp, strerror(errno));
  }
  if ((s = agree(c, ctx, mine, "to prepare the save"))) {
    if (me == 0 && !failed) nb_ckpt__remove_tree(NULL, tmp);
    return s;
  }
  s = agree(c, ctx, nb_ckpt__write_items(ctx, tmp, snap), "to write its data files");
  char *partial = s ? NULL : nb_ckpt__manifest_build(ctx, snap), **texts = NULL;
  if (!s) s = agree(c, ctx, partial ? NB_OK : nb_ctx_status(ctx), "to build its part of the manifest");
  if (!s) s = gather_texts(c, ctx, partial, &texts);
  nb_ckpt_string_free(ctx, partial);
  mine = !s && me == 0 ? commit_merged(ctx, root, tmp, snap->step, texts, n) : NB_OK;
  for (int r = 0; texts && r < n; r++) free(texts[r]);
  free(texts);
  if (!s) s = agree(c, ctx, mine, "to commit the step");
  if (s && me == 0) nb_ckpt__remove_tree(NULL, tmp); /* never committed: the previous step stays the latest */
  return s;
}

/* Where each of this process's arrays lies in its whole array: the whole
 * shape from sh->whole, and a leaf that is smaller along one dim d is block
 * sh->index of sh->count along d (FSDP: d = 0, the padding past the whole
 * array's end cut off by the caller; tensor parallel: the dim a linear is
 * split along). */
nb_status nb_ckpt__snapshot_place(nb_ctx *ctx, nb_ckpt__snapshot *snap, const nb_ckpt_shards *sh) {
  snap->process = sh->comm->ops->rank(sh->comm);
  for (size_t i = 0; i < snap->n_items; i++) {
    nb_ckpt__snap_item *it = &snap->items[i];
    for (size_t j = 0; j < it->n; j++) {
      nb_ckpt__snap_array *sa = &it->arrays[j];
      char full[NB_CKPT__PATH_CAP];
      if (nb_ckpt__pathf(ctx, full, "%s/%s", it->name, sa->path)) return NB_ERR_INVALID_ARG;
      const nb_leaf *l = sh->whole ? nb_tree_get(sh->whole, full) : NULL;
      if (!l) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "sharded checkpoint: '%s' has no whole shape in the layout", full);
      nb_shape w = nb_leaf_get_aval(l).shape, b = nb_array_aval(sa->array).shape;
      sa->whole = w;
      memset(sa->start, 0, sizeof sa->start);
      if (nb_shape_equal(&w, &b)) continue;
      /* the one dim d where the block is smaller */
      int d = -1, ndiff = 0;
      for (int k = 0; w.rank == b.rank && k < w.rank; k++)
        if (w.dims[k] != b.dims[k]) d = k, ndiff++;
      bool one_dim = ndiff == 1 && sh->count > 0;
      int64_t per = one_dim ? (w.dims[d] + sh->count - 1) / sh->count : 0;
      if (one_dim) sa->start[d] = sh->index * per;
      if (!one_dim || b.dims[d] > per || sa->start[d] + b.dims[d] > w.dims[d]) {
        char ws[64], bs[64];
        nb_aval wa = {nb_array_dtype(sa->array), w}, ba = nb_array_aval(sa->array);
        return nb_errorf(ctx, NB_ERR_SHAPE, "sharded checkpoint: '%s' is %s, not block %lld of %lld along one dim of %s",
                         full, nb_aval_str(&ba, bs, sizeof bs), (long long)sh->index, (long long)sh->count,
                         nb_aval_str(&wa, ws, sizeof ws));
      }
    }
  }
  return NB_OK;
}
