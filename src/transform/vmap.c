/* vmap: re-emits every equation with a batch axis. Equations none of whose
 * operands is batched are copied as they are; the others go through their
 * primitive's batching rule, which says where the batch axis of each output
 * ends up. Outputs are then moved to the requested axis. */
#include <stdio.h>
#include <string.h>

#include "core/ir.h"

nb_graph *nb__vmap_graph(nb_ctx *ctx, const nb_graph *g, const int *in_bdims, int64_t n, int out_axis) {
  int *outs_axis = NULL;
  size_t nout = nb_graph_num_outputs(g);
  if (nout) {
    outs_axis = nb_alloc(ctx, nout * sizeof(int));
    if (!outs_axis) return NULL;
    for (size_t i = 0; i < nout; i++) outs_axis[i] = out_axis;
  }
  nb_graph *r = nb__vmap_graph_axes(ctx, g, in_bdims, n, outs_axis);
  nb_dealloc(ctx, outs_axis, nout * sizeof(int));
  return r;
}

static nb_status batch_eqn(nb_graph *d, const nb_eqn *e, nb_val *const *in, const int *bd, int64_t n, nb_val **outs,
                           int *obd) {
  const nb_prim_rules *r = nb__rules(e->prim);
  bool any = false;
  for (int i = 0; i < e->nin; i++) any = any || bd[i] >= 0;
  for (int i = 0; i < e->nout; i++) obd[i] = -1;
  if (!any) {
    nb__emit(d, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
    return nb_graph_status(d);
  }
  if (!r->batch) {
    nb__fail(d, e->loc, NB_ERR_UNIMPLEMENTED, "vmap rule for '%s' not implemented", r->name);
    return nb_graph_status(d);
  }
  nb_status st = r->batch(d, e, in, bd, n, outs, obd);
  if (st == NB_OK) st = nb_graph_status(d);
  for (int i = 0; st == NB_OK && i < e->nout; i++) {
    /* the rule's output must be the unbatched aval with n inserted at obd */
    nb_aval want = e->out[i]->aval, got = outs[i]->aval;
    bool ok = got.dtype == want.dtype && got.shape.rank == want.shape.rank + (obd[i] >= 0);
    for (int k = 0, j = 0; ok && k < got.shape.rank; k++) {
      if (k == obd[i]) ok = got.shape.dims[k] == n;
      else ok = got.shape.dims[k] == want.shape.dims[j++];
    }
    if (!ok) {
      char a[128], b[128];
      nb__fail(d, e->loc, NB_ERR_INTERNAL, "vmap rule for '%s' made %s (batch axis %d) for %s", r->name,
               nb_aval_str(&got, a, sizeof a), obd[i], nb_aval_str(&want, b, sizeof b));
      st = nb_graph_status(d);
    }
  }
  return st;
}

nb_graph *nb__vmap_graph_axes(nb_ctx *ctx, const nb_graph *g, const int *in_bdims, int64_t n, const int *out_axes) {
  size_t nin = nb_graph_num_inputs(g), nv = nb__graph_nvals(g);
  nb_graph *d = nb_graph_create(ctx);
  nb_val **map = nb_calloc(ctx, (nv + 1) * sizeof(nb_val *));
  int *bdim = nb_calloc(ctx, (nv + 1) * sizeof(int));
  nb_status st = d && map && bdim ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    nb_val *v = nb__graph_input(g, i);
    nb_aval a = v->aval;
    int b = in_bdims[i];
    if (b >= 0) {
      if (b > a.shape.rank || a.shape.rank + 1 > NB_MAX_RANK) {
        st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: in axis %d out of range for input '%s' of rank %d", b,
                       nb_graph_input_path(g, i), a.shape.rank);
        break;
      }
      memmove(a.shape.dims + b + 1, a.shape.dims + b, sizeof(int64_t) * (size_t)(a.shape.rank - b));
      a.shape.dims[b] = n;
      a.shape.rank++;
    }
    map[v->id] = nb__graph_add_input(d, nb_graph_input_path(g, i), a);
    bdim[v->id] = b;
  }
  int small_bd[64], obd[256];
  nb_val *small_in[64], *outs[256];
  for (size_t k = 0; st == NB_OK && k < nb__graph_neqns(g); k++) {
    const nb_eqn *e = nb__graph_eqn(g, k);
    bool big = e->nin > 64;
    nb_val **in = big ? nb_alloc(ctx, (size_t)e->nin * sizeof(nb_val *)) : small_in;
    int *bd = big ? nb_alloc(ctx, (size_t)e->nin * sizeof(int)) : small_bd;
    if (!in || !bd) {
      st = NB_ERR_NOMEM;
      break;
    }
    for (int i = 0; i < e->nin; i++) {
      in[i] = map[e->in[i]->id];
      bd[i] = bdim[e->in[i]->id];
    }
    st = batch_eqn(d, e, in, bd, n, outs, obd);
    for (int i = 0; st == NB_OK && i < e->nout; i++) {
      map[e->out[i]->id] = outs[i];
      bdim[e->out[i]->id] = obd[i];
    }
    if (big) {
      nb_dealloc(ctx, in, (size_t)e->nin * sizeof(nb_val *));
      nb_dealloc(ctx, bd, (size_t)e->nin * sizeof(int));
    }
  }
  for (size_t i = 0; st == NB_OK && i < nb_graph_num_outputs(g); i++) {
    nb_val *v = nb__graph_output(g, i), *o = map[v->id];
    int want = out_axes[i];
    if (want < 0) {
      if (bdim[v->id] >= 0) {
        st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: output '%s' is batched but its out axis is -1", nb_graph_output_path(g, i));
        break;
      }
    } else {
      if (want > v->aval.shape.rank) {
        st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: out axis %d out of range for output '%s' of rank %d", want,
                       nb_graph_output_path(g, i), v->aval.shape.rank);
        break;
      }
      o = nb__move_axis((nb_loc){0}, nb__batch_to_front((nb_loc){0}, o, bdim[v->id], n), 0, want);
    }
    st = nb__graph_add_output(d, nb_graph_output_path(g, i), o);
  }
  nb_dealloc(ctx, map, (nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, bdim, (nv + 1) * sizeof(int));
  if (st == NB_OK) st = nb_graph_status(d);
  if (st != NB_OK) {
    if (nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "vmap failed: %s", nb_status_name(st));
    nb_graph_destroy(d);
    return NULL;
  }
  return nb__checked(d);
}

/* The axis for `path` from an override tree (longest matching prefix wins),
 * else the default. */
static nb_status axis_for(nb_ctx *ctx, const nb_tree *over, const char *path, int dflt, int *axis) {
  *axis = dflt;
  size_t best = 0;
  for (size_t i = 0; over && i < nb_tree_size(over); i++) {
    const char *p = nb_tree_path(over, i);
    size_t n = strlen(p);
    if (strncmp(path, p, n) != 0 || (path[n] != 0 && path[n] != '/') || n < best) continue;
    const nb_leaf *l = nb_tree_leaf(over, i);
    if (l->kind != NB_LEAF_ARRAY || nb_array_size(l->array) != 1 || !nb_dtype_is_int(nb_array_dtype(l->array)))
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: axis override '%s' must be an integer scalar array", p);
    *axis = (int)nb_array_get(l->array, 0);
    best = n;
  }
  return NB_OK;
}

nb_graph *nb_vmap(nb_ctx *ctx, const nb_graph *g, const nb_vmap_opts *opts) {
  if (!g || !opts) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_vmap: NULL argument"), NULL;
  if (nb_graph_status(g)) return nb_errorf(ctx, nb_graph_status(g), "nb_vmap: graph is in error"), NULL;
  size_t nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  int *in_bd = nb_calloc(ctx, (nin + 1) * sizeof(int)), *out_ax = nb_calloc(ctx, (nout + 1) * sizeof(int));
  nb_status st = in_bd && out_ax ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    nb_aval a = nb__graph_input(g, i)->aval;
    st = axis_for(ctx, opts->in_axes, nb_graph_input_path(g, i), opts->in_axis, &in_bd[i]);
    if (st != NB_OK || in_bd[i] < 0) {
      in_bd[i] = -1;
      continue;
    }
    /* the batch axis may go anywhere in [0, rank] of the unbatched input */
    if (in_bd[i] > a.shape.rank) {
      st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: in axis %d out of range for input '%s' (%s)", in_bd[i],
                     nb_graph_input_path(g, i), nb_dtype_name(a.dtype));
      break;
    }
  }
  if (st == NB_OK && opts->axis_size <= 0) {
    st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "vmap: axis_size must be given (the graph holds only unbatched shapes)");
  }
  for (size_t i = 0; st == NB_OK && i < nout; i++)
    st = axis_for(ctx, opts->out_axes, nb_graph_output_path(g, i), opts->out_axis, &out_ax[i]);
  nb_graph *r = st == NB_OK ? nb__vmap_graph_axes(ctx, g, in_bd, opts->axis_size, out_ax) : NULL;
  nb_dealloc(ctx, in_bd, (nin + 1) * sizeof(int));
  nb_dealloc(ctx, out_ax, (nout + 1) * sizeof(int));
  return r;
}
