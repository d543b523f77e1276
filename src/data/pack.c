/* Sequence packing: first-fit of variable-length examples into R rows of T
 * tokens with segment ids and positions. Between calls the only pending
 * work is the example that did not fit (the "carry"); the state records the
 * upstream state from before that example was read and how many of its
 * pieces were already placed, so a restore re-reads it. Not here: batching
 * of already-equal-length elements (iter.c). */
#include <string.h>

#include "data/internal.h"

typedef struct pack_impl {
  int64_t T, R;
  bool has_carry;
  nb_data_elem carry;
  int64_t carry_piece, carry_len;
  int64_t *pre, *tmp; /* [n_child]: upstream state before the carry / before the last read */
  int n_child;
} pack_impl;

typedef struct pack_out {
  nb_tree *tree;   /* structure of the first example (paths, dtypes) */
  nb_array *leaves[64];
  size_t n_leaves;
  nb_array *seg, *pos;
  int64_t fill[4096], nseg[4096];
} pack_out;

/* Checks an example: a tree of rank-1 host arrays of one length. */
static nb_status check_example(nb_ctx *ctx, const nb_data_elem *e, int64_t *len) {
  if (e->kind != NB_DATA_TREE || nb_tree_size(e->tree) == 0 || nb_tree_size(e->tree) > 64)
    return nb_data__err(ctx, NB_ERR_INVALID_ARG, "pack: an example must be a tree of 1..64 arrays (got %s)",
                        e->kind == NB_DATA_BYTES ? "bytes" : "another kind of element");
  *len = -1;
  for (size_t i = 0; i < nb_tree_size(e->tree); i++) {
    const nb_leaf *l = nb_tree_leaf(e->tree, i);
    const char *p = nb_tree_path(e->tree, i);
    if (l->kind != NB_LEAF_ARRAY || nb_array_rank(l->array) != 1 || !nb_array_data(l->array))
      return nb_data__err(ctx, NB_ERR_SHAPE, "pack: leaf '%s' must be a rank-1 host array", p);
    if (!strcmp(p, "segment_ids") || !strcmp(p, "positions"))
      return nb_data__err(ctx, NB_ERR_INVALID_ARG, "pack: an example may not have a leaf named '%s'", p);
    int64_t n = nb_array_dims(l->array)[0];
    if (*len >= 0 && n != *len)
      return nb_data__err(ctx, NB_ERR_SHAPE, "pack: leaves of one example differ in length (%lld and %lld at '%s')",
                          (long long)*len, (long long)n, p);
    *len = n;
  }
  return NB_OK;
}

static nb_status out_init(nb_ctx *ctx, pack_impl *k, pack_out *o, const nb_tree *like) {
  int64_t dims[2] = {k->R, k->T};
  o->tree = nb_tree_create(ctx);
  o->n_leaves = nb_tree_size(like);
  if (!o->tree) return NB_ERR_NOMEM;
  for (size_t i = 0; i < o->n_leaves; i++) {
    nb_array *a = nb_array_zeros(ctx, nb_array_dtype(nb_tree_leaf(like, i)->array), 2, dims);
    if (!a || nb_tree_set_array(o->tree, nb_tree_path(like, i), a)) return nb_array_release(a), NB_ERR_NOMEM;
    o->leaves[i] = a;
    nb_array_release(a); /* the tree holds it */
  }
  o->seg = nb_array_zeros(ctx, NB_I32, 2, dims);
  o->pos = nb_array_zeros(ctx, NB_I32, 2, dims);
  nb_status s = o->seg && o->pos ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = nb_tree_set_array(o->tree, "segment_ids", o->seg);
  if (!s) s = nb_tree_set_array(o->tree, "positions", o->pos);
  nb_array_release(o->seg);
  nb_array_release(o->pos);
  return s;
}

/* Places piece [off, off+n) of the carry at row r; false if the example's
 * structure differs from the output's. */
static bool place(pack_impl *k, pack_out *o, int64_t r, int64_t off, int64_t n) {
  const nb_tree *t = k->carry.tree;
  if (nb_tree_size(t) != o->n_leaves) return false;
  for (size_t i = 0; i < o->n_leaves; i++)
    if (strcmp(nb_tree_path(t, i), nb_tree_path(o->tree, i)) ||
        nb_array_dtype(nb_tree_leaf(t, i)->array) != nb_array_dtype(o->leaves[i]))
      return false;
  int64_t at = r * k->T + o->fill[r];
  for (size_t i = 0; i < o->n_leaves; i++) {
    size_t esz = nb_dtype_size(nb_array_dtype(o->leaves[i]));
    memcpy((uint8_t *)nb_array_data_mut(o->leaves[i]) + (size_t)at * esz,
           (const uint8_t *)nb_array_data(nb_tree_leaf(t, i)->array) + (size_t)off * esz, (size_t)n * esz);
  }
  int32_t *seg = nb_array_data_mut(o->seg), *pos = nb_array_data_mut(o->pos);
  o->nseg[r]++;
  for (int64_t j = 0; j < n; j++) seg[at + j] = (int32_t)o->nseg[r], pos[at + j] = (int32_t)j;
  o->fill[r] += n;
  return true;
}

/* Reads the next non-empty example into the carry; false at the end. */
static nb_status read_carry(nb_data_iter *it, bool *got) {
  pack_impl *k = it->impl;
  *got = false;
  for (;;) {
    nb_data__save(it->child, k->tmp);
    nb_status s = nb_data__child_next(it, &k->carry);
    if (s || k->carry.kind == NB_DATA_NONE) return s;
    s = check_example(it->ctx, &k->carry, &k->carry_len);
    if (s) return nb_data_elem_clear(it->ctx, &k->carry), s;
    if (k->carry_len == 0) continue;
    memcpy(k->pre, k->tmp, (size_t)k->n_child * sizeof *k->pre);
    k->has_carry = *got = true;
    k->carry_piece = 0;
    return NB_OK;
  }
}

static nb_status pack_next(nb_data_iter *it, nb_data_elem *out) {
  pack_impl *k = it->impl;
  nb_ctx *ctx = it->ctx;
  pack_out *o = nb_calloc(ctx, sizeof *o);
  if (!o) return nb_data__err(ctx, NB_ERR_NOMEM, "pack: out of memory");
  nb_status s = NB_OK;
  bool placed = false;
  for (;;) {
    bool got = k->has_carry;
    if (!got && (s = read_carry(it, &got))) break;
    if (!got) break;
    if (!o->tree && (s = out_init(ctx, k, o, k->carry.tree))) {
      s = nb_data__err(ctx, NB_ERR_NOMEM, "pack: out of memory");
      break;
    }
    int64_t off = k->carry_piece * k->T, n = k->carry_len - off < k->T ? k->carry_len - off : k->T, r = 0;
    while (r < k->R && k->T - o->fill[r] < n) r++;
    if (r == k->R) break; /* the rows are full: emit, keep the carry */
    if (!place(k, o, r, off, n)) {
      s = nb_data__err(ctx, NB_ERR_SHAPE, "pack: an example's leaves (paths or dtypes) differ from the first example's");
      break;
    }
    placed = true;
    if (++k->carry_piece * k->T >= k->carry_len) {
      k->has_carry = false;
      nb_data_elem_clear(ctx, &k->carry);
    }
  }
  if (!s && placed) nb_data_elem_set_tree(ctx, out, o->tree);
  else nb_tree_destroy(o->tree);
  nb_dealloc(ctx, o, sizeof *o);
  return s;
}

static void pack_save(nb_data_iter *it, int64_t *st) {
  pack_impl *k = it->impl;
  st[0] = k->has_carry;
  st[1] = k->has_carry ? k->carry_piece : 0;
  if (k->has_carry) memcpy(st + 2, k->pre, (size_t)k->n_child * sizeof *st);
  else nb_data__save(it->child, st + 2);
}

static nb_status pack_load(nb_data_iter *it, const int64_t *st) {
  pack_impl *k = it->impl;
  nb_data_elem_clear(it->ctx, &k->carry);
  k->has_carry = false;
  nb_status s = nb_data__load(it->child, st + 2);
  if (s || !st[0]) return s;
  bool got;
  s = read_carry(it, &got);
  if (s) return s;
  if (!got || st[1] < 0 || st[1] * k->T >= k->carry_len) {
    nb_data_elem_clear(it->ctx, &k->carry);
    k->has_carry = false;
    return nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "set_state: the packed example to resume (piece %lld) is not "
                        "there: the state does not belong to this data", (long long)st[1]);
  }
  k->carry_piece = st[1];
  return NB_OK;
}

static void pack_destroy(nb_data_iter *it) {
  pack_impl *k = it->impl;
  nb_data_elem_clear(it->ctx, &k->carry);
  nb_dealloc(it->ctx, k->pre, (size_t)(k->n_child + 1) * sizeof *k->pre);
  nb_dealloc(it->ctx, k->tmp, (size_t)(k->n_child + 1) * sizeof *k->tmp);
}

static const nb_data__iter_ops pack_ops = {"pack", pack_next, NULL, 2, pack_save, pack_load, pack_destroy, false};

nb_data_iter *nb_data_iter_pack(nb_data_iter *it, const nb_data_pack_opts *opts) {
  if (!it) return NULL;
  int64_t R = opts && opts->rows ? opts->rows : 1;
  if (!opts || opts->seq_len < 1 || R < 1 || R > 4096) {
    nb_data__err(it->ctx, NB_ERR_INVALID_ARG, "pack: seq_len must be >= 1 and rows in 1..4096");
    return nb_data_iter_destroy(it), NULL;
  }
  int n_child = it->n_state;
  nb_data_iter *n = nb_data__iter_new(it->ctx, &pack_ops, it, sizeof(pack_impl));
  if (!n) return NULL;
  pack_impl *k = n->impl;
  k->T = opts->seq_len;
  k->R = R;
  k->n_child = n_child;
  k->pre = nb_calloc(n->ctx, (size_t)(n_child + 1) * sizeof *k->pre);
  k->tmp = nb_calloc(n->ctx, (size_t)(n_child + 1) * sizeof *k->tmp);
  if (!k->pre || !k->tmp) return nb_data_iter_destroy(n), NULL;
  return n;
}
