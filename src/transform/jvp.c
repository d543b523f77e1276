/* Forward mode: re-emits every equation and, beside it, its JVP rule's
 * tangent equations. A NULL tangent is a symbolic zero and costs nothing.
 * The same driver feeds reverse mode (grad.c), which transposes the tangent
 * half. */
#include <stdio.h>
#include <string.h>

#include "transform/transform.h"

static bool any_float_output(const nb_eqn *e) {
  for (int i = 0; i < e->nout; i++)
    if (nb_dtype_is_float(e->out[i]->aval.dtype)) return true;
  return false;
}

nb_status nb__jvp_into(nb_graph *dst, const nb_graph *src, nb_val *const *primal_in, nb_val *const *tangent_in,
                       nb_val **primal_out, nb_val **tangent_out) {
  nb_ctx *ctx = nb_graph_ctx(dst);
  size_t nv = nb__graph_nvals(src);
  nb_val **pm = nb_calloc(ctx, (nv + 1) * sizeof(nb_val *)), **tm = nb_calloc(ctx, (nv + 1) * sizeof(nb_val *));
  nb_status st = pm && tm ? NB_OK : NB_ERR_NOMEM;
  for (size_t i = 0; st == NB_OK && i < nb_graph_num_inputs(src); i++) {
    uint32_t id = nb__graph_input(src, i)->id;
    pm[id] = primal_in[i];
    tm[id] = tangent_in ? tangent_in[i] : NULL;
  }
  nb_val *small_in[64], *small_t[64], *outs[256], *touts[256];
  for (size_t k = 0; st == NB_OK && k < nb__graph_neqns(src); k++) {
    const nb_eqn *e = nb__graph_eqn(src, k);
    const nb_prim_rules *r = nb__rules(e->prim);
    nb_val **in = e->nin <= 64 ? small_in : nb_alloc(ctx, (size_t)e->nin * sizeof(nb_val *));
    nb_val **tin = e->nin <= 64 ? small_t : nb_alloc(ctx, (size_t)e->nin * sizeof(nb_val *));
    if (!in || !tin) {
      st = NB_ERR_NOMEM;
      break;
    }
    bool any_tangent = false;
    for (int i = 0; i < e->nin; i++) {
      in[i] = pm[e->in[i]->id];
      tin[i] = tm[e->in[i]->id];
      any_tangent = any_tangent || tin[i];
    }
    for (int i = 0; i < e->nout; i++) touts[i] = NULL;
    if (r->linearize && any_tangent && any_float_output(e)) {
      r->linearize(dst, e, in, tin, outs, touts); /* emits the primal outputs too */
    } else {
      nb__emit(dst, e->loc, e->prim, e->nin, in, e->params, e->params_size, NULL, outs);
    }
    if (!nb_graph_status(dst) && any_tangent && any_float_output(e) && !r->linearize) {
      if (!r->jvp) {
        nb__fail(dst, e->loc, NB_ERR_UNIMPLEMENTED, "jvp rule for '%s' not implemented", r->name);
      } else {
        r->jvp(dst, e, in, tin, outs, touts);
      }
    }
    st = nb_graph_status(dst);
    for (int i = 0; st == NB_OK && i < e->nout; i++) {
      pm[e->out[i]->id] = outs[i];
      if (touts[i] && !nb_dtype_is_float(e->out[i]->aval.dtype)) touts[i] = NULL;
      if (touts[i] && !nb_aval_equal(&touts[i]->aval, &outs[i]->aval)) {
        char a[128], b[128];
        nb__fail(dst, e->loc, NB_ERR_INTERNAL, "jvp rule for '%s' made a %s tangent for a %s output", r->name,
                 nb_aval_str(&touts[i]->aval, a, sizeof a), nb_aval_str(&outs[i]->aval, b, sizeof b));
        st = nb_graph_status(dst);
      }
      tm[e->out[i]->id] = touts[i];
    }
    if (in != small_in) nb_dealloc(ctx, in, (size_t)e->nin * sizeof(nb_val *));
    if (tin != small_t) nb_dealloc(ctx, tin, (size_t)e->nin * sizeof(nb_val *));
  }
  for (size_t i = 0; st == NB_OK && i < nb_graph_num_outputs(src); i++) {
    uint32_t id = nb__graph_output(src, i)->id;
    primal_out[i] = pm[id];
    tangent_out[i] = tm[id];
  }
  nb_dealloc(ctx, pm, (nv + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tm, (nv + 1) * sizeof(nb_val *));
  return st;
}

nb_graph *nb__jvp_graph(nb_ctx *ctx, const nb_graph *g) {
  size_t nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  nb_graph *d = nb_graph_create(ctx);
  nb_val **pin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *)), **tin = nb_calloc(ctx, (nin + 1) * sizeof(nb_val *));
  nb_val **pout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *)), **tout = nb_calloc(ctx, (nout + 1) * sizeof(nb_val *));
  nb_status st = d && pin && tin && pout && tout ? NB_OK : NB_ERR_NOMEM;
  char path[1024];
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    snprintf(path, sizeof path, "primal/%s", nb_graph_input_path(g, i));
    pin[i] = nb__graph_add_input(d, path, nb__graph_input(g, i)->aval);
  }
  for (size_t i = 0; st == NB_OK && i < nin; i++) {
    nb_aval a = nb__graph_input(g, i)->aval;
    if (!nb_dtype_is_float(a.dtype)) continue;
    snprintf(path, sizeof path, "tangent/%s", nb_graph_input_path(g, i));
    tin[i] = nb__graph_add_input(d, path, a);
  }
  if (st == NB_OK) st = nb_graph_status(d);
  if (st == NB_OK) st = nb__jvp_into(d, g, pin, tin, pout, tout);
  for (size_t i = 0; st == NB_OK && i < nout; i++) {
    snprintf(path, sizeof path, "primal/%s", nb_graph_output_path(g, i));
    st = nb__graph_add_output(d, path, pout[i]);
  }
  for (size_t i = 0; st == NB_OK && i < nout; i++) {
    if (!nb_dtype_is_float(pout[i]->aval.dtype)) continue;
    snprintf(path, sizeof path, "tangent/%s", nb_graph_output_path(g, i));
    st = nb__graph_add_output(d, path, tout[i] ? tout[i] : nb__zeros(d, pout[i]->aval));
  }
  nb_dealloc(ctx, pin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tin, (nin + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, pout, (nout + 1) * sizeof(nb_val *));
  nb_dealloc(ctx, tout, (nout + 1) * sizeof(nb_val *));
  if (st != NB_OK) {
    if (st == NB_ERR_NOMEM && nb_ctx_status(ctx) == NB_OK) nb_errorf(ctx, st, "out of memory in jvp");
    nb_graph_destroy(d);
    return NULL;
  }
  return nb__checked(d);
}

nb_graph *nb_jvp(nb_ctx *ctx, const nb_graph *g) {
  if (!g) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_jvp: NULL graph"), NULL;
  return nb__jvp_graph(ctx, g);
}
