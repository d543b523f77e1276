/* Static activation ranges: a calibration pass observes the inputs of the
 * int8_static linears while the f32 model runs over calibration batches
 * (the observe hook adds their min, max and sum of squares as outputs of the
 * traced graph), the totals are kept in f64 on the host, and each linear's
 * act_scale follows from its rule's act_calibration. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/quant.h"

typedef struct observed_entry {
  char *module;
  int64_t per_run; /* elements of x in one run of the traced graph */
  int64_t count;
  double min, max, sumsq;
} observed_entry;

struct nb_quant_observer {
  nb_ctx *ctx;
  const nb_quant_rules *rules;
  int64_t n, cap;
  observed_entry *e;
};

nb_quant_observer *nb_quant_observer_create(nb_ctx *ctx, const nb_quant_rules *rules) {
  if (!rules) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "quant observer: rules: NULL"), NULL;
  nb_quant_observer *o = calloc(1, sizeof *o);
  if (!o) return nb_errorf(ctx, NB_ERR_NOMEM, "quant observer: out of memory"), NULL;
  o->ctx = ctx, o->rules = rules;
  return o;
}

void nb_quant_observer_destroy(nb_quant_observer *o) {
  if (!o) return;
  for (int64_t i = 0; i < o->n; i++) free(o->e[i].module);
  free(o->e);
  free(o);
}

static observed_entry *find(const nb_quant_observer *o, const char *module) {
  for (int64_t i = 0; i < o->n; i++)
    if (!strcmp(o->e[i].module, module)) return &o->e[i];
  return NULL;
}

/* The rule of module when its inputs need observing (int8_static, a data
 * calibration), else NULL. */
static const nb_quant_rule *observed_rule(const nb_quant_rules *rules, const char *module) {
  const nb_quant_rule *r = nb_quant_rules_at(rules, nb_quant_rules_match(rules, module, NB_QUANT_OP_DOT_GENERAL));
  return r && r->act_qtype == NB_QUANT_ACT_INT8_STATIC && r->act_calibration.kind != NB_QUANT_FIXED ? r : NULL;
}

nb_val *nb_quant_observe_hook(void *observer, nb_nn_apply *a, const char *path, nb_val *x, bool stacked) {
  nb_quant_observer *o = observer;
  if (stacked || !observed_rule(o->rules, path)) return nb_nn_linear_default(a, path, x, stacked);
  observed_entry *e = find(o, path);
  if (!e) {
    if (o->n == o->cap) {
      int64_t cap = o->cap ? 2 * o->cap : 16;
      observed_entry *ne = realloc(o->e, sizeof *ne * (size_t)cap);
      if (!ne) return nb_nn_fail(a, NB_ERR_NOMEM, "quant observer: out of memory");
      o->e = ne, o->cap = cap;
    }
    e = &o->e[o->n];
    *e = (observed_entry){.module = strdup(path), .min = INFINITY, .max = -INFINITY};
    if (!e->module) return nb_nn_fail(a, NB_ERR_NOMEM, "quant observer: out of memory");
    o->n++;
  }
  nb_val *xf = nb_val_dtype(x) == NB_F32 ? x : nb_convert(x, NB_F32);
  int r = nb_val_rank(xf);
  int axes[NB_MAX_RANK];
  e->per_run = 1;
  for (int d = 0; d < r; d++) axes[d] = d, e->per_run *= nb_val_dim(xf, d);
  char p[NB_NN_PATH_MAX + 32];
  nb_val *stats[3] = {nb_reduce_min(xf, r, axes), nb_reduce_max(xf, r, axes), nb_reduce_sum(nb_mul(xf, xf), r, axes)};
  static const char *const names[3] = {"min", "max", "sumsq"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "observe/%s/%s", path, names[i]);
    if (nb_graph_output(a->g, p, stats[i])) return nb_nn_fail(a, NB_ERR_INVALID_ARG, "quant observer: cannot output '%s'", p);
  }
  return nb_nn_linear_default(a, path, x, stacked);
}

nb_status nb_quant_observer_add(nb_quant_observer *o, const nb_tree *outputs) {
  for (int64_t i = 0; i < o->n; i++) {
    observed_entry *e = &o->e[i];
    double v[3];
    static const char *const names[3] = {"min", "max", "sumsq"};
    for (int k = 0; k < 3; k++) {
      char p[NB_NN_PATH_MAX + 32];
      snprintf(p, sizeof p, "observe/%s/%s", e->module, names[k]);
      nb_array *a = nb_tree_get_array(outputs, p);
      if (!a || nb_array_size(a) != 1) return nb_errorf(o->ctx, NB_ERR_INVALID_ARG, "quant observer: output '%s' missing", p);
      v[k] = nb_array_get(a, 0);
      if (!isfinite(v[k])) return nb_errorf(o->ctx, NB_ERR_NUMERIC, "quant observer: %s: the inputs of '%s' are not finite", p, e->module);
    }
    e->min = fmin(e->min, v[0]), e->max = fmax(e->max, v[1]), e->sumsq += v[2], e->count += e->per_run;
  }
  return NB_OK;
}

bool nb_quant_observer_get(const nb_quant_observer *o, const char *module, nb_quant_observed *out) {
  const observed_entry *e = o ? find(o, module) : NULL;
  if (!e || e->count == 0) return false;
  *out = (nb_quant_observed){.count = e->count, .min = e->min, .max = e->max, .rms = sqrt(e->sumsq / (double)e->count)};
  return true;
}

nb_status nb_quant_observer_apply(const nb_quant_observer *o, nb_tree *t) {
  static const char suffix[] = "/kernel/act_scale";
  size_t ls = strlen(suffix);
  for (size_t i = 0; i < nb_tree_size(t); i++) {
    const char *path = nb_tree_path(t, i);
    size_t len = strlen(path);
    if (len <= ls || strcmp(path + len - ls, suffix)) continue;
    char m[1024];
    snprintf(m, sizeof m, "%.*s", (int)(len - ls), path);
    nb_quant_linear l;
    bool found;
    nb_status s = nb_quant_tree_linear(o->ctx, t, m, &l, &found);
    if (s) return s;
    if (!found || l.act != NB_QUANT_ACT_INT8_STATIC) continue;
    nb_quant_op op = l.experts ? NB_QUANT_OP_STACKED_DOT_GENERAL : NB_QUANT_OP_DOT_GENERAL;
    const nb_quant_rule *r = nb_quant_rules_at(o->rules, nb_quant_rules_match(o->rules, m, op));
    if (!r || r->act_qtype != NB_QUANT_ACT_INT8_STATIC)
      return nb_errorf(o->ctx, NB_ERR_INVALID_ARG, "calibration: '%s' is int8_static but no int8_static rule matches it", m);
    const nb_quant_calib *c = &r->act_calibration;
    double amax;
    nb_quant_observed ob;
    if (c->kind == NB_QUANT_FIXED) {
      amax = fmax(fabs(c->min), fabs(c->max));
    } else if (!nb_quant_observer_get(o, m, &ob)) {
      return nb_errorf(o->ctx, NB_ERR_INVALID_ARG, "calibration: the inputs of '%s' were never observed (no calibration batch ran it)", m);
    } else {
      amax = c->kind == NB_QUANT_RMS ? c->k * ob.rms : fmax(-ob.min, ob.max); /* absmax and minmax: symmetric codes */
    }
    if ((s = nb_quant_tree_set_act_scale(t, m, (float)(amax / 127)))) return s;
  }
  return NB_OK;
}
