/* shard_map for the per-process SPMD case (nabla/collective.h): a graph over
 * global values around f, which sees each process's block. An input split
 * over axis A is taken from the (same on every process) global value as
 * dynamic_slice(pbroadcast(x), axis_index(A) * block): pbroadcast marks it
 * per-process, so its transpose sums the blocks' cotangents over A. A split
 * output is put back as psum(dynamic_update_slice(zeros, y, start)) over A:
 * the blocks are disjoint, so the sum only adds zeros (exact), and psum's
 * transpose (pbroadcast) hands each process the cotangent of its block. */
#include <string.h>

#include "core/ir.h"

/* Per dim: the axis spec names (or NULL) and its size; false after the error. */
static bool spec_sizes(nb_ctx *ctx, const char *what, size_t i, const char *path, const nb_part_spec spec, int rank,
                       int64_t *sizes) {
  for (int k = 0; k < rank; k++) {
    sizes[k] = 1;
    if (!spec || !spec[k]) continue;
    nb_comm *c = nb_ctx_axis(ctx, spec[k]);
    if (!c) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "shard_map: %s %zu ('%s') dim %d: axis '%s' is not bound on this context", what,
                i, path, k, spec[k]);
      return false;
    }
    for (int j = 0; j < k; j++)
      if (spec[j] && !strcmp(spec[j], spec[k])) {
        nb_errorf(ctx, NB_ERR_INVALID_ARG, "shard_map: %s %zu ('%s'): axis '%s' splits dims %d and %d", what, i, path,
                  spec[k], j, k);
        return false;
      }
    sizes[k] = c->ops->size(c);
  }
  return true;
}

/* The block's start along each dim: axis_index * block size (0 where not split). */
static void block_starts(nb_graph *d, const nb_part_spec spec, const nb_aval *local, nb_val **starts) {
  for (int k = 0; k < local->shape.rank; k++)
    starts[k] = spec && spec[k] ? nb_mul(nb_axis_index(d, spec[k]), nb_scalar(d, NB_I32, (double)local->shape.dims[k]))
                                : nb_scalar(d, NB_I32, 0);
}

nb_graph *nb_shard_map(nb_ctx *ctx, const nb_graph *f, const nb_part_spec *in_specs, const nb_part_spec *out_specs) {
  if (!f) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "shard_map: NULL graph"), NULL;
  if (nb_graph_status(f)) return nb_errorf(ctx, nb_graph_status(f), "shard_map: graph is in error"), NULL;
  size_t nin = nb_graph_num_inputs(f), nout = nb_graph_num_outputs(f);
  nb_graph *d = nb_graph_create(ctx);
  nb_val **in = nb_calloc(ctx, (nin + nout + 1) * sizeof(nb_val *)), **out = in ? in + nin : NULL;
  bool ok = d && in;
  for (size_t i = 0; ok && i < nin; i++) {
    nb_aval a = nb__graph_input(f, i)->aval;
    nb_part_spec spec = in_specs ? in_specs[i] : NULL;
    int64_t n[NB_MAX_RANK];
    if (!(ok = spec_sizes(ctx, "input", i, nb_graph_input_path(f, i), spec, a.shape.rank, n))) break;
    nb_aval global = a;
    for (int k = 0; k < a.shape.rank; k++) global.shape.dims[k] *= n[k];
    nb_val *x = nb__graph_add_input(d, nb_graph_input_path(f, i), global);
    bool split = false;
    for (int k = 0; spec && k < a.shape.rank; k++)
      if (spec[k]) {
        x = nb_pbroadcast(x, spec[k]);
        split = true;
      }
    if (split) {
      nb_val *starts[NB_MAX_RANK];
      block_starts(d, spec, &a, starts);
      x = nb_dynamic_slice_at(NB_HERE, x, starts, a.shape.dims);
    }
    in[i] = x;
  }
  nb_status st = ok ? nb__graph_inline(d, f, in, out) : NB_ERR_INVALID_ARG;
  for (size_t i = 0; st == NB_OK && i < nout; i++) {
    nb_val *y = out[i];
    nb_aval a = y->aval;
    nb_part_spec spec = out_specs ? out_specs[i] : NULL;
    int64_t n[NB_MAX_RANK];
    if (!spec_sizes(ctx, "output", i, nb_graph_output_path(f, i), spec, a.shape.rank, n)) {
      st = NB_ERR_INVALID_ARG;
      break;
    }
    bool split = false;
    for (int k = 0; spec && k < a.shape.rank; k++) split = split || spec[k];
    if (split) {
      nb_aval global = a;
      for (int k = 0; k < a.shape.rank; k++) global.shape.dims[k] *= n[k];
      nb_val *starts[NB_MAX_RANK];
      block_starts(d, spec, &a, starts);
      y = nb_dynamic_update_slice_at(NB_HERE, nb__zeros(d, global), y, starts);
      for (int k = 0; k < a.shape.rank; k++)
        if (spec[k]) y = nb_psum(y, spec[k]);
    }
    st = nb__graph_add_output(d, nb_graph_output_path(f, i), y);
  }
  if (st == NB_OK && d) st = nb_graph_status(d);
  nb_dealloc(ctx, in, (nin + nout + 1) * sizeof(nb_val *));
  if (st != NB_OK || !d) {
    if (d && nb_graph_status(d) && nb_ctx_status(ctx) == NB_OK)
      nb_errorf(ctx, nb_graph_status(d), "shard_map: %s", nb_graph_error(d));
    nb_graph_destroy(d);
    return NULL;
  }
  return nb__checked(d);
}
