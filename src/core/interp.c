/* The reference interpreter: runs a graph's equations in order on the host,
 * freeing each value after its last use. It is the oracle every fast path is
 * checked against: clear and complete, not fast. In debug-nans mode it checks
 * every floating output and names the first primitive that made a NaN/Inf. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

static bool has_nonfinite(const nb_array *a) {
  nb_dtype t = nb_array_dtype(a);
  if (!nb_dtype_is_float(t)) return false;
  int64_t n = nb_array_size(a);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(nb__load_f64(t, nb_array_data(a), i))) return true;
  return false;
}

nb_status nb_graph_run_flat(nb_ctx *ctx, const nb_graph *g, nb_array *const *in, nb_array **out) {
  if (!g) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_graph_run: NULL graph");
  if (nb_graph_status(g)) return nb_errorf(ctx, nb_graph_status(g), "nb_graph_run: graph is in error: %s", nb_graph_error(g));
  size_t nv = nb__graph_nvals(g), ne = nb__graph_neqns(g), nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  nb_array **vals = nb_calloc(ctx, (nv + 1) * sizeof(nb_array *));
  uint32_t *last_use = nb_calloc(ctx, (nv + 1) * sizeof(uint32_t)); /* eqn index + 1; UINT32_MAX: graph output */
  if (!vals || !last_use) {
    nb_dealloc(ctx, vals, (nv + 1) * sizeof(nb_array *));
    nb_dealloc(ctx, last_use, (nv + 1) * sizeof(uint32_t));
    return NB_ERR_NOMEM;
  }
  for (size_t k = 0; k < ne; k++) {
    const nb_eqn *e = nb__graph_eqn(g, k);
    for (int i = 0; i < e->nin; i++) last_use[e->in[i]->id] = (uint32_t)k + 1;
  }
  for (size_t i = 0; i < nout; i++) last_use[nb__graph_output(g, i)->id] = UINT32_MAX;

  nb_status st = NB_OK;
  for (size_t i = 0; i < nin && st == NB_OK; i++) {
    nb_val *v = nb__graph_input(g, i);
    nb_aval want = nb_val_aval(v), got;
    if (!in[i]) {
      st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_graph_run: no array for input '%s'", nb_graph_input_path(g, i));
      break;
    }
    got = nb_array_aval(in[i]);
    if (!nb_aval_equal(&want, &got)) {
      char a[128], b[128];
      st = nb_errorf(ctx, want.dtype != got.dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE, "nb_graph_run: input '%s' is %s, the graph wants %s",
                     nb_graph_input_path(g, i), nb_aval_str(&got, a, sizeof a), nb_aval_str(&want, b, sizeof b));
      break;
    }
    nb_array_retain(in[i]);
    vals[v->id] = in[i];
  }
  nb_array *ins_small[64];
  for (size_t k = 0; k < ne && st == NB_OK; k++) {
    const nb_eqn *e = nb__graph_eqn(g, k);
    const nb_prim_rules *r = nb__rules(e->prim);
    nb_array **ins = e->nin <= 64 ? ins_small : nb_alloc(ctx, (size_t)e->nin * sizeof(nb_array *));
    nb_array **outs = nb_calloc(ctx, (size_t)(e->nout ? e->nout : 1) * sizeof(nb_array *));
    if (!ins || !outs) st = NB_ERR_NOMEM;
    for (int i = 0; st == NB_OK && i < e->nin; i++) ins[i] = vals[e->in[i]->id];
    for (int i = 0; st == NB_OK && i < e->nout; i++) {
      nb_aval a = e->out[i]->aval;
      if (!(outs[i] = nb_array_empty(ctx, a.dtype, a.shape.rank, a.shape.dims))) st = NB_ERR_NOMEM;
    }
    if (st == NB_OK) {
      st = r->eval(ctx, e, ins, outs);
      if (st != NB_OK && nb_ctx_status(ctx) == NB_OK)
        nb_errorf(ctx, st, "%s failed at run time (traced at %s:%d)", r->name, e->loc.file ? e->loc.file : "?", e->loc.line);
    }
    for (int i = 0; outs && i < e->nout; i++) {
      if (st == NB_OK && ctx->debug_nans && has_nonfinite(outs[i]) && e->prim != NB_PRIM_constant) {
        bool inputs_finite = true;
        for (int j = 0; j < e->nin; j++) inputs_finite = inputs_finite && !has_nonfinite(ins[j]);
        if (inputs_finite)
          st = nb_errorf(ctx, NB_ERR_NUMERIC, "debug-nans: %s produced a NaN/Inf in output %d (traced at %s:%d)", r->name, i,
                         e->loc.file ? e->loc.file : "?", e->loc.line);
      }
      if (st == NB_OK) vals[e->out[i]->id] = outs[i];
      else nb_array_release(outs[i]);
    }
    if (ins && ins != ins_small) nb_dealloc(ctx, ins, (size_t)e->nin * sizeof(nb_array *));
    nb_dealloc(ctx, outs, (size_t)(e->nout ? e->nout : 1) * sizeof(nb_array *));
    /* free what this equation used for the last time */
    for (int i = 0; st == NB_OK && i < e->nin; i++) {
      uint32_t id = e->in[i]->id;
      if (last_use[id] == (uint32_t)k + 1 && vals[id]) {
        nb_array_release(vals[id]);
        vals[id] = NULL;
      }
    }
  }
  for (size_t i = 0; i < nout; i++) {
    out[i] = NULL;
    if (st != NB_OK) continue;
    out[i] = vals[nb__graph_output(g, i)->id];
    nb_array_retain(out[i]);
  }
  for (size_t i = 0; i < nv; i++) nb_array_release(vals[i]);
  nb_dealloc(ctx, vals, (nv + 1) * sizeof(nb_array *));
  nb_dealloc(ctx, last_use, (nv + 1) * sizeof(uint32_t));
  return st;
}

nb_status nb_graph_run(nb_ctx *ctx, const nb_graph *g, const nb_tree *inputs, nb_tree *outputs) {
  if (!g || !inputs || !outputs) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_graph_run: NULL argument");
  size_t nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  nb_array **in = nb_calloc(ctx, (nin + 1) * sizeof(nb_array *));
  nb_array **out = nb_calloc(ctx, (nout + 1) * sizeof(nb_array *));
  nb_status st = in && out ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    const char *path = nb_graph_input_path(g, i);
    if (!(in[i] = nb_tree_get_array(inputs, path)))
      st = nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_graph_run: inputs have no array at '%s'", path);
  }
  if (st == NB_OK) st = nb_graph_run_flat(ctx, g, in, out);
  for (size_t i = 0; st == NB_OK && i < nout; i++) st = nb_tree_set_array(outputs, nb_graph_output_path(g, i), out[i]);
  for (size_t i = 0; out && i < nout; i++) nb_array_release(out[i]);
  nb_dealloc(ctx, in, (nin + 1) * sizeof(nb_array *));
  nb_dealloc(ctx, out, (nout + 1) * sizeof(nb_array *));
  return st;
}
