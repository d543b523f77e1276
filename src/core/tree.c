/* nb_tree: an insertion-ordered map from '/'-separated paths to leaves, with
 * a hash index for lookup. Parameters, optimizer states, gradients, batches
 * and traced values all live in trees. Not here: any numerical work. */
#include <regex.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

typedef struct entry {
  char *path;
  nb_leaf leaf;
} entry;

/* Invariant: index has cap_index slots (a power of two, > 2 * n), each -1 or
 * the position of an entry; entries[0..n) are in insertion order. */
struct nb_tree {
  nb_ctx *ctx;
  entry *entries;
  size_t n, cap;
  int64_t *index;
  size_t cap_index;
};

nb_leaf nb_leaf_array(nb_array *a) { return (nb_leaf){.kind = NB_LEAF_ARRAY, .array = a}; }
nb_leaf nb_leaf_val(nb_val *v) { return (nb_leaf){.kind = NB_LEAF_VAL, .val = v}; }
nb_leaf nb_leaf_aval(nb_aval a) { return (nb_leaf){.kind = NB_LEAF_AVAL, .aval = a}; }

nb_aval nb_leaf_get_aval(const nb_leaf *l) {
  switch (l->kind) {
  case NB_LEAF_ARRAY: return nb_array_aval(l->array);
  case NB_LEAF_VAL: return nb_val_aval(l->val);
  case NB_LEAF_AVAL: return l->aval;
  default: return nb_aval_make(NB_F32, 0, NULL);
  }
}

nb_tree *nb_tree_create(nb_ctx *ctx) {
  nb_tree *t = nb_calloc(ctx, sizeof *t);
  if (t) t->ctx = ctx;
  return t;
}

static void leaf_drop(nb_leaf *l) {
  if (l->kind == NB_LEAF_ARRAY) nb_array_release(l->array);
}

void nb_tree_destroy(nb_tree *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) {
    leaf_drop(&t->entries[i].leaf);
    nb_strfree(t->ctx, t->entries[i].path);
  }
  nb_dealloc(t->ctx, t->entries, t->cap * sizeof(entry));
  nb_dealloc(t->ctx, t->index, t->cap_index * sizeof(int64_t));
  nb_dealloc(t->ctx, t, sizeof *t);
}

nb_ctx *nb_tree_ctx(const nb_tree *t) { return t->ctx; }
size_t nb_tree_size(const nb_tree *t) { return t ? t->n : 0; }

static uint64_t path_hash(const char *p) { return nb__hash_bytes(p, strlen(p), 0); }

/* Slot of path in the index: either the slot holding it or the empty slot
 * where it would go. */
static size_t slot_of(const nb_tree *t, const char *path) {
  size_t mask = t->cap_index - 1, s = (size_t)path_hash(path) & mask;
  while (t->index[s] >= 0 && strcmp(t->entries[t->index[s]].path, path) != 0) s = (s + 1) & mask;
  return s;
}

static nb_status rebuild_index(nb_tree *t, size_t cap_index) {
  int64_t *idx = nb_alloc(t->ctx, cap_index * sizeof(int64_t));
  if (!idx) return NB_ERR_NOMEM;
  nb_dealloc(t->ctx, t->index, t->cap_index * sizeof(int64_t));
  t->index = idx;
  t->cap_index = cap_index;
  for (size_t i = 0; i < cap_index; i++) idx[i] = -1;
  for (size_t i = 0; i < t->n; i++) idx[slot_of(t, t->entries[i].path)] = (int64_t)i;
  return NB_OK;
}

int64_t nb_tree_find(const nb_tree *t, const char *path) {
  if (!t || !path || t->n == 0) return -1;
  return t->index[slot_of(t, path)];
}

static bool valid_path(const char *p) {
  if (!p || !*p || *p == '/') return false;
  for (const char *c = p; *c; c++)
    if (*c == '/' && (c[1] == '/' || c[1] == 0)) return false;
  return true;
}

nb_status nb_tree_set(nb_tree *t, const char *path, nb_leaf leaf) {
  if (!t) return NB_ERR_INVALID_ARG;
  if (!valid_path(path))
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tree path '%s' is invalid (empty, or an empty component)",
                     path ? path : "(null)");
  if ((leaf.kind == NB_LEAF_ARRAY && !leaf.array) || (leaf.kind == NB_LEAF_VAL && !leaf.val) ||
      leaf.kind <= NB_LEAF_NONE || leaf.kind >= NB_LEAF_KIND_COUNT)
    return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tree path '%s': leaf is empty or of an invalid kind", path);
  int64_t at = nb_tree_find(t, path);
  if (leaf.kind == NB_LEAF_ARRAY) nb_array_retain(leaf.array);
  if (at >= 0) {
    leaf_drop(&t->entries[at].leaf);
    t->entries[at].leaf = leaf;
    return NB_OK;
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 8;
    entry *e = nb_alloc(t->ctx, cap * sizeof(entry));
    if (!e) goto oom;
    if (t->n) memcpy(e, t->entries, t->n * sizeof(entry));
    nb_dealloc(t->ctx, t->entries, t->cap * sizeof(entry));
    t->entries = e;
    t->cap = cap;
  }
  char *p = nb_strdup(t->ctx, path);
  if (!p) goto oom;
  if (2 * (t->n + 1) >= t->cap_index && rebuild_index(t, t->cap_index ? t->cap_index * 2 : 16) != NB_OK) {
    nb_strfree(t->ctx, p);
    goto oom;
  }
  t->entries[t->n] = (entry){p, leaf};
  t->index[slot_of(t, p)] = (int64_t)t->n;
  t->n++;
  return NB_OK;
oom:
  leaf_drop(&leaf);
  return NB_ERR_NOMEM;
}

nb_status nb_tree_set_array(nb_tree *t, const char *path, nb_array *a) {
  if (!a) return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tree path '%s': NULL array", path ? path : "(null)");
  return nb_tree_set(t, path, nb_leaf_array(a));
}

nb_status nb_tree_set_val(nb_tree *t, const char *path, nb_val *v) {
  if (!v) return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tree path '%s': NULL value", path ? path : "(null)");
  return nb_tree_set(t, path, nb_leaf_val(v));
}

nb_status nb_tree_remove(nb_tree *t, const char *path) {
  int64_t at = nb_tree_find(t, path);
  if (at < 0) return nb_errorf(t->ctx, NB_ERR_NOT_FOUND, "tree has no path '%s'", path ? path : "(null)");
  leaf_drop(&t->entries[at].leaf);
  nb_strfree(t->ctx, t->entries[at].path);
  memmove(t->entries + at, t->entries + at + 1, (t->n - (size_t)at - 1) * sizeof(entry));
  t->n--;
  return rebuild_index(t, t->cap_index);
}

const nb_leaf *nb_tree_get(const nb_tree *t, const char *path) {
  int64_t at = nb_tree_find(t, path);
  return at < 0 ? NULL : &t->entries[at].leaf;
}

nb_array *nb_tree_get_array(const nb_tree *t, const char *path) {
  const nb_leaf *l = nb_tree_get(t, path);
  return l && l->kind == NB_LEAF_ARRAY ? l->array : NULL;
}

nb_val *nb_tree_get_val(const nb_tree *t, const char *path) {
  const nb_leaf *l = nb_tree_get(t, path);
  return l && l->kind == NB_LEAF_VAL ? l->val : NULL;
}

const char *nb_tree_path(const nb_tree *t, size_t i) { return i < t->n ? t->entries[i].path : NULL; }
const nb_leaf *nb_tree_leaf(const nb_tree *t, size_t i) { return i < t->n ? &t->entries[i].leaf : NULL; }

/* Copies the entries for which keep(path) holds, with `strip` leading bytes
 * removed from each path. */
static nb_tree *filtered_copy(const nb_tree *t, bool (*keep)(const char *, const void *), const void *arg,
                              size_t strip) {
  nb_tree *r = nb_tree_create(t->ctx);
  if (!r) return NULL;
  for (size_t i = 0; i < t->n; i++) {
    const char *p = t->entries[i].path;
    if (keep && !keep(p, arg)) continue;
    if (nb_tree_set(r, p + strip, t->entries[i].leaf) != NB_OK) {
      nb_tree_destroy(r);
      return NULL;
    }
  }
  return r;
}

nb_tree *nb_tree_copy(const nb_tree *t) { return filtered_copy(t, NULL, NULL, 0); }

static bool has_prefix(const char *path, const void *arg) {
  const char *prefix = arg;
  size_t n = strlen(prefix);
  return strncmp(path, prefix, n) == 0 && path[n] == '/';
}

nb_tree *nb_tree_select_prefix(const nb_tree *t, const char *prefix, bool strip) {
  if (!prefix || !*prefix) return nb_tree_copy(t);
  size_t n = strlen(prefix);
  while (n && prefix[n - 1] == '/') n--;
  char buf[1024];
  if (n >= sizeof buf) return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tree prefix too long"), NULL;
  memcpy(buf, prefix, n);
  buf[n] = 0;
  nb_tree *r = filtered_copy(t, has_prefix, buf, strip ? n + 1 : 0);
  /* An exact match of the whole prefix is a leaf of its own: keep it (under
   * its own last component when stripping would leave nothing). */
  int64_t at = nb_tree_find(t, buf);
  if (r && at >= 0) {
    const char *p = t->entries[at].path;
    const char *slash = strrchr(p, '/');
    if (nb_tree_set(r, strip ? (slash ? slash + 1 : p) : p, t->entries[at].leaf) != NB_OK) {
      nb_tree_destroy(r);
      return NULL;
    }
  }
  return r;
}

static bool matches(const char *path, const void *arg) { return regexec(arg, path, 0, NULL, 0) == 0; }

nb_tree *nb_tree_select_regex(const nb_tree *t, const char *regex) {
  regex_t re;
  int rc = regcomp(&re, regex ? regex : "", REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char msg[256];
    regerror(rc, &re, msg, sizeof msg);
    nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "bad path regex '%s': %s", regex ? regex : "(null)", msg);
    return NULL;
  }
  nb_tree *r = filtered_copy(t, matches, &re, 0);
  regfree(&re);
  return r;
}

nb_status nb_tree_merge(nb_tree *dst, const char *prefix, const nb_tree *src) {
  char buf[4096];
  for (size_t i = 0; i < src->n; i++) {
    const char *p = src->entries[i].path;
    if (prefix && *prefix) {
      if ((size_t)snprintf(buf, sizeof buf, "%s/%s", prefix, p) >= sizeof buf)
        return nb_errorf(dst->ctx, NB_ERR_INVALID_ARG, "tree path '%s/%s' too long", prefix, p);
      p = buf;
    }
    nb_status s = nb_tree_set(dst, p, src->entries[i].leaf);
    if (s != NB_OK) return s;
  }
  return NB_OK;
}

nb_status nb_tree_check_same(nb_ctx *ctx, const nb_tree *a, const nb_tree *b, bool check_avals, const char *what) {
  if (!what) what = "trees";
  size_t n = a->n < b->n ? a->n : b->n;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(a->entries[i].path, b->entries[i].path) != 0)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s differ at leaf %zu: path '%s' vs '%s'", what, i,
                       a->entries[i].path, b->entries[i].path);
    if (check_avals) {
      nb_aval x = nb_leaf_get_aval(&a->entries[i].leaf), y = nb_leaf_get_aval(&b->entries[i].leaf);
      if (!nb_aval_equal(&x, &y)) {
        char s1[128], s2[128];
        return nb_errorf(ctx, x.dtype != y.dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE, "%s differ at '%s': %s vs %s", what,
                         a->entries[i].path, nb_aval_str(&x, s1, sizeof s1), nb_aval_str(&y, s2, sizeof s2));
      }
    }
  }
  if (a->n != b->n) {
    const nb_tree *longer = a->n > b->n ? a : b;
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s differ: %zu vs %zu leaves (first extra path '%s')", what, a->n,
                     b->n, longer->entries[n].path);
  }
  return NB_OK;
}

nb_tree *nb_tree_map(const nb_tree *t, nb_tree_map_fn fn, void *ud) {
  nb_tree *r = nb_tree_create(t->ctx);
  for (size_t i = 0; r && i < t->n; i++) {
    nb_leaf out = {0};
    if (fn(ud, t->entries[i].path, &t->entries[i].leaf, &out) != NB_OK) goto fail;
    nb_status s = nb_tree_set(r, t->entries[i].path, out);
    if (out.kind == NB_LEAF_ARRAY) nb_array_release(out.array); /* the tree holds its own */
    if (s != NB_OK) goto fail;
  }
  return r;
fail:
  nb_tree_destroy(r);
  return NULL;
}

nb_tree *nb_tree_zip(const nb_tree *a, const nb_tree *b, nb_tree_zip_fn fn, void *ud) {
  if (nb_tree_check_same(a->ctx, a, b, false, "zipped trees") != NB_OK) return NULL;
  nb_tree *r = nb_tree_create(a->ctx);
  for (size_t i = 0; r && i < a->n; i++) {
    nb_leaf out = {0};
    if (fn(ud, a->entries[i].path, &a->entries[i].leaf, &b->entries[i].leaf, &out) != NB_OK) goto fail;
    nb_status s = nb_tree_set(r, a->entries[i].path, out);
    if (out.kind == NB_LEAF_ARRAY) nb_array_release(out.array);
    if (s != NB_OK) goto fail;
  }
  return r;
fail:
  nb_tree_destroy(r);
  return NULL;
}

void nb_tree_flatten(const nb_tree *t, nb_leaf *out) {
  for (size_t i = 0; i < t->n; i++) out[i] = t->entries[i].leaf;
}

nb_tree *nb_tree_unflatten(const nb_tree *structure, const nb_leaf *leaves) {
  nb_tree *r = nb_tree_create(structure->ctx);
  for (size_t i = 0; r && i < structure->n; i++)
    if (nb_tree_set(r, structure->entries[i].path, leaves[i]) != NB_OK) {
      nb_tree_destroy(r);
      return NULL;
    }
  return r;
}

void nb_tree_print(const nb_tree *t, FILE *f) {
  static const char *const kinds[NB_LEAF_KIND_COUNT] = {"none", "array", "value", "aval"};
  for (size_t i = 0; i < t->n; i++) {
    nb_aval a = nb_leaf_get_aval(&t->entries[i].leaf);
    char buf[128];
    fprintf(f, "%s: %s %s\n", t->entries[i].path, kinds[t->entries[i].leaf.kind], nb_aval_str(&a, buf, sizeof buf));
  }
}
