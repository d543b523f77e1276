/* Schedules: functions of the step written once over a two-mode scalar (a
 * host double, or a traced value in the step's float dtype: f64 for f64
 * parameters), so the value logged on the host and
 * the value used inside the traced step come from the same code. Optax's
 * formulas. An input-bound schedule (nb_optim_schedule_from_input) takes
 * every number of its formula from a vector input of the graph instead of
 * constants, so the graph does not change with the learning rate or the
 * number of steps. Not here: the transformations that consume schedules. */
#include <math.h>
#include <string.h>

#include "optim/internal.h"

typedef enum kind { K_CONST, K_POLY, K_EXP, K_COS, K_PIECEWISE, K_INTERP_LIN, K_INTERP_COS, K_JOIN, K_SLOT, K_INPUT } kind;

/* Invariant: bounds/vals hold n entries (K_PIECEWISE: n boundaries and
 * scales; K_INTERP_*: n + 1 bounds from 0 and n + 1 cumulative values;
 * K_JOIN: n - 1 bounds and n kids). */
struct nb_optim_schedule {
  nb_ctx *ctx;
  kind kind;
  double a[6];
  int n;
  int64_t *bounds;
  double *vals;
  nb_optim_schedule **kids;
  nb_val *const *cell; /* K_SLOT: the traced value; K_INPUT: the vector of numbers */
};

/* ---- two-mode scalars ----------------------------------------------------- */

/* The numbers of an input-bound schedule, in the order the formula asks for
 * them (K calls): traced, read from `vec`; on the host, recorded into `rec`
 * (nb_optim_schedule_inputs). The same code runs both ways, so the order
 * is the same. */
typedef struct numbers {
  nb_val *vec;
  double *rec;
  int n, cap;
} numbers;

typedef struct sx {
  nb_graph *g; /* NULL: host */
  double d;
  nb_val *v;
  numbers *num; /* NULL: numbers are constants */
  nb_dtype t;   /* traced: v's dtype */
} sx;

static sx K(sx r, double c) {
  if (r.num) {
    int i = r.num->n++;
    if (!r.g) {
      if (i < r.num->cap) r.num->rec[i] = c;
      return (sx){NULL, c, NULL, r.num, r.t};
    }
    int64_t lo[1] = {i}, hi[1] = {i + 1}; /* f64 rounded as the constant would be */
    nb_val *x = nb_reshape(nb_slice(r.num->vec, lo, hi, NULL), 0, NULL);
    return (sx){r.g, 0, nb_convert(x, r.t), r.num, r.t};
  }
  if (!r.g) return (sx){NULL, c, NULL, NULL, r.t};
  return (sx){r.g, 0, nb_scalar(r.g, r.t, c), NULL, r.t};
}
#define BIN(name, hostexpr, op)                                                \
  static sx name(sx a, sx b) {                                                 \
    if (!a.g) return (sx){NULL, hostexpr, NULL, a.num, a.t};                   \
    return (sx){a.g, 0, op(a.v, b.v), a.num, a.t};                             \
  }
BIN(add, a.d + b.d, nb_add)
BIN(sub, a.d - b.d, nb_sub)
BIN(mul, a.d * b.d, nb_mul)
BIN(dv, a.d / b.d, nb_div)
BIN(pw, pow(a.d, b.d), nb_pow)
BIN(mn, fmin(a.d, b.d), nb_min)
BIN(mx, fmax(a.d, b.d), nb_max)
static sx cosx(sx a) { return a.g ? (sx){a.g, 0, nb_cos(a.v), a.num, a.t} : (sx){NULL, cos(a.d), NULL, a.num, a.t}; }
static sx floorx(sx a) { return a.g ? (sx){a.g, 0, nb_floor(a.v), a.num, a.t} : (sx){NULL, floor(a.d), NULL, a.num, a.t}; }
static sx signx(sx a) {
  return a.g ? (sx){a.g, 0, nb_sign(a.v), a.num, a.t} : (sx){NULL, (double)((a.d > 0) - (a.d < 0)), NULL, a.num, a.t};
}
/* a < b ? x : y (or a <= b with le) */
static sx sel(sx a, sx b, bool le, sx x, sx y) {
  if (!a.g) return (sx){NULL, (le ? a.d <= b.d : a.d < b.d) ? x.d : y.d, NULL, a.num, a.t};
  return (sx){a.g, 0, nb_select(le ? nb_le(a.v, b.v) : nb_lt(a.v, b.v), x.v, y.v), a.num, a.t};
}
static sx clipx(sx x, double lo, double hi) { return mn(mx(x, K(x, lo)), K(x, hi)); }

/* ---- evaluation ----------------------------------------------------------- */

static sx eval(const nb_optim_schedule *s, sx t);

static sx eval_poly(const nb_optim_schedule *s, sx t) {
  double init = s->a[0], end = s->a[1], power = s->a[2], steps = s->a[3], begin = s->a[4];
  if (steps <= 0) return K(t, init);
  sx c = clipx(sub(t, K(t, begin)), 0, steps);
  sx frac = sub(K(t, 1), dv(c, K(t, steps)));
  return add(mul(K(t, init - end), pw(frac, K(t, power))), K(t, end));
}

static sx eval_exp(const nb_optim_schedule *s, sx t) {
  double init = s->a[0], steps = s->a[1], rate = s->a[2], begin = s->a[3], end = s->a[5];
  bool staircase = s->a[4] != 0;
  if (steps <= 0 || rate == 0) return K(t, init);
  sx dec = sub(t, K(t, begin));
  sx p = dv(dec, K(t, steps));
  if (staircase) p = floorx(p);
  sx v = sel(dec, K(t, 0), true, K(t, init), mul(K(t, init), pw(K(t, rate), p)));
  if (!isnan(end)) v = rate < 1 ? mx(v, K(t, end)) : mn(v, K(t, end));
  return v;
}

static sx eval_cos(const nb_optim_schedule *s, sx t) {
  double init = s->a[0], steps = s->a[1], alpha = s->a[2], expo = s->a[3];
  sx c = mn(t, K(t, steps));
  sx cd = mul(K(t, 0.5), add(K(t, 1), cosx(dv(mul(K(t, M_PI), c), K(t, steps)))));
  sx dec = add(mul(K(t, 1 - alpha), pw(cd, K(t, expo))), K(t, alpha));
  return mul(K(t, init), dec);
}

static sx eval_piecewise(const nb_optim_schedule *s, sx t) {
  sx v = K(t, s->a[0]);
  for (int i = 0; i < s->n; i++) {
    sx ind = mx(K(t, 0), signx(sub(K(t, (double)s->bounds[i]), t)));
    v = add(mul(v, ind), mul(mul(sub(K(t, 1), ind), K(t, s->vals[i])), v));
  }
  return v;
}

static sx eval_interp(const nb_optim_schedule *s, sx t) {
  sx acc = K(t, 0);
  for (int i = 0; i < s->n; i++) {
    double b0 = (double)s->bounds[i], b1 = (double)s->bounds[i + 1], v0 = s->vals[i], v1 = s->vals[i + 1];
    sx pct = dv(sub(t, K(t, b0)), K(t, fmax(b1 - b0, 1)));
    sx val = s->kind == K_INTERP_LIN
                 ? add(mul(K(t, v1 - v0), pct), K(t, v0))
                 : add(K(t, v1), mul(K(t, (v0 - v1) / 2), add(cosx(mul(K(t, M_PI), pct)), K(t, 1))));
    /* b0 <= t < b1 */
    sx in = sel(t, K(t, b0), false, K(t, 0), sel(t, K(t, b1), false, K(t, 1), K(t, 0)));
    acc = add(acc, mul(in, val));
  }
  sx last = sel(t, K(t, (double)s->bounds[s->n]), false, K(t, 0), K(t, s->vals[s->n]));
  return add(acc, last);
}

static sx eval_join(const nb_optim_schedule *s, sx t) {
  sx out = eval(s->kids[0], t);
  for (int i = 1; i < s->n; i++) {
    double b = (double)s->bounds[i - 1];
    out = sel(t, K(t, b), false, out, eval(s->kids[i], sub(t, K(t, b))));
  }
  return out;
}

/* The number of values the formula of s takes (its K calls). */
static int count_numbers(const nb_optim_schedule *s) {
  numbers num = {0};
  eval(s, (sx){NULL, 0, NULL, &num, NB_F64});
  return num.n;
}

static sx eval_input(const nb_optim_schedule *s, sx t) {
  nb_val *vec = *s->cell;
  if (!t.g || t.num || !vec || nb_val_graph(vec) != t.g) return eval(s->kids[0], t); /* not bound here: constants */
  int n = count_numbers(s->kids[0]);
  if (nb_val_rank(vec) != 1 || nb_val_dim(vec, 0) != n || nb_val_dtype(vec) != NB_F64)
    return (sx){t.g, 0, nb_graph_fail_at(NB_HERE, t.g, NB_ERR_SHAPE, "schedule: its input must be an f64 vector of %d numbers "
                                 "(nb_optim_schedule_inputs)", n), NULL, t.t};
  numbers num = {.vec = vec};
  sx r = eval(s->kids[0], (sx){t.g, 0, t.v, &num, t.t});
  r.num = NULL;
  return r;
}

static sx eval(const nb_optim_schedule *s, sx t) {
  switch (s->kind) {
  case K_CONST: return K(t, s->a[0]);
  case K_POLY: return eval_poly(s, t);
  case K_EXP: return eval_exp(s, t);
  case K_COS: return eval_cos(s, t);
  case K_PIECEWISE: return eval_piecewise(s, t);
  case K_INTERP_LIN:
  case K_INTERP_COS: return eval_interp(s, t);
  case K_JOIN: return eval_join(s, t);
  case K_SLOT:
    if (t.g && *s->cell) return (sx){t.g, 0, nb_convert(*s->cell, t.t), t.num, t.t};
    return K((sx){t.g, t.d, t.v, NULL, t.t}, s->a[0]);
  case K_INPUT: return eval_input(s, t);
  }
  return K(t, NAN);
}

double nb_optim_schedule_eval(const nb_optim_schedule *s, double step) {
  if (!s) return NAN;
  return eval(s, (sx){NULL, step, NULL, NULL, NB_F64}).d;
}

nb_array *nb_optim_schedule_inputs(nb_ctx *ctx, const nb_optim_schedule *s) {
  if (!s) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "schedule inputs: NULL schedule"), NULL;
  if (s->kind == K_INPUT) s = s->kids[0];
  int64_t n = count_numbers(s);
  double *vals = nb_alloc(ctx, sizeof(double) * (size_t)(n + 1));
  if (!vals) return NULL;
  numbers num = {.rec = vals, .cap = (int)n};
  eval(s, (sx){NULL, 0, NULL, &num, NB_F64});
  nb_array *a = nb_array_empty(ctx, NB_F64, 1, &n);
  double *f = a ? nb_array_data_mut(a) : NULL;
  for (int64_t i = 0; f && i < n; i++) f[i] = vals[i];
  nb_dealloc(ctx, vals, sizeof(double) * (size_t)(n + 1));
  return a;
}

nb_val *nb_optim_schedule_trace(const nb_optim_schedule *s, nb_val *step) {
  if (!s || !step) return NULL;
  nb_graph *g = nb_val_graph(step);
  if (nb_val_rank(step) != 0 || nb_val_dtype(step) == NB_BOOL) {
    nb_errorf(nb_graph_ctx(g), NB_ERR_SHAPE, "schedule: the step must be a numeric scalar");
    return NULL;
  }
  nb_dtype t = nb_val_dtype(step) == NB_F64 ? NB_F64 : NB_F32;
  return eval(s, (sx){g, 0, nb_convert(step, t), NULL, t}).v;
}

/* An input-bound constant stays constant: transformations fold it into a
 * plain scale (and their state keeps its layout). */
bool nb_optim_schedule_is_constant(const nb_optim_schedule *s) {
  return s && (s->kind == K_CONST || (s->kind == K_INPUT && s->kids[0]->kind == K_CONST));
}

void nb_optim_schedule_destroy(nb_optim_schedule *s) {
  if (!s) return;
  if (s->kids) {
    int nk = s->kind == K_INPUT ? 1 : s->n;
    for (int i = 0; i < nk; i++) nb_optim_schedule_destroy(s->kids[i]);
    nb_dealloc(s->ctx, s->kids, sizeof(nb_optim_schedule *) * (size_t)nk);
  }
  if (s->bounds) nb_dealloc(s->ctx, s->bounds, sizeof(int64_t) * (size_t)(s->n + 1));
  if (s->vals) nb_dealloc(s->ctx, s->vals, sizeof(double) * (size_t)(s->n + 1));
  nb_dealloc(s->ctx, s, sizeof *s);
}

/* ---- constructors --------------------------------------------------------- */

static nb_optim_schedule *mk(nb_ctx *ctx, kind k, int n, bool arrays) {
  nb_optim_schedule *s = nb_calloc(ctx, sizeof *s);
  if (!s) return NULL;
  s->ctx = ctx;
  s->kind = k;
  s->n = n;
  if (arrays) {
    s->bounds = nb_calloc(ctx, sizeof(int64_t) * (size_t)(n + 1));
    s->vals = nb_calloc(ctx, sizeof(double) * (size_t)(n + 1));
    if (!s->bounds || !s->vals) {
      nb_optim_schedule_destroy(s);
      return NULL;
    }
  }
  return s;
}

static bool fin(nb_ctx *ctx, const char *fn, const char *name, double v) {
  if (isfinite(v)) return true;
  nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s must be finite, got %g", fn, name, v);
  return false;
}

static bool nonneg_steps(nb_ctx *ctx, const char *fn, const char *name, int64_t v) {
  if (v >= 0) return true;
  nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s must be >= 0, got %lld", fn, name, (long long)v);
  return false;
}

nb_optim_schedule *nb_optim_constant(nb_ctx *ctx, double value) {
  if (!fin(ctx, "constant schedule", "value", value)) return NULL;
  nb_optim_schedule *s = mk(ctx, K_CONST, 0, false);
  if (s) s->a[0] = value;
  return s;
}

nb_optim_schedule *nb_optim_polynomial(nb_ctx *ctx, double init, double end, double power, int64_t transition_steps,
                                       int64_t transition_begin) {
  const char *fn = "polynomial schedule";
  if (!fin(ctx, fn, "init", init) || !fin(ctx, fn, "end", end) || !fin(ctx, fn, "power", power) ||
      !nonneg_steps(ctx, fn, "transition_steps", transition_steps) ||
      !nonneg_steps(ctx, fn, "transition_begin", transition_begin))
    return NULL;
  nb_optim_schedule *s = mk(ctx, K_POLY, 0, false);
  if (s) memcpy(s->a, (double[]){init, end, power, (double)transition_steps, (double)transition_begin}, 5 * sizeof(double));
  return s;
}

nb_optim_schedule *nb_optim_linear(nb_ctx *ctx, double init, double end, int64_t transition_steps,
                                   int64_t transition_begin) {
  return nb_optim_polynomial(ctx, init, end, 1, transition_steps, transition_begin);
}

nb_optim_schedule *nb_optim_exponential_decay(nb_ctx *ctx, double init, int64_t transition_steps, double decay_rate,
                                              int64_t transition_begin, bool staircase, double end_value) {
  const char *fn = "exponential_decay";
  if (!fin(ctx, fn, "init", init) || !nonneg_steps(ctx, fn, "transition_steps", transition_steps) ||
      !nb_optim__check(ctx, fn, "decay_rate", decay_rate, 0, false) ||
      !nonneg_steps(ctx, fn, "transition_begin", transition_begin) ||
      (!isnan(end_value) && !fin(ctx, fn, "end_value", end_value)))
    return NULL;
  nb_optim_schedule *s = mk(ctx, K_EXP, 0, false);
  if (s)
    memcpy(s->a, (double[]){init, (double)transition_steps, decay_rate, (double)transition_begin, staircase, end_value},
           6 * sizeof(double));
  return s;
}

nb_optim_schedule *nb_optim_cosine_decay(nb_ctx *ctx, double init, int64_t decay_steps, double alpha,
                                         double exponent) {
  const char *fn = "cosine_decay";
  if (decay_steps <= 0) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: decay_steps must be > 0, got %lld", fn, (long long)decay_steps);
    return NULL;
  }
  if (!fin(ctx, fn, "init", init) || !fin(ctx, fn, "alpha", alpha) || !fin(ctx, fn, "exponent", exponent))
    return NULL;
  nb_optim_schedule *s = mk(ctx, K_COS, 0, false);
  if (s) memcpy(s->a, (double[]){init, (double)decay_steps, alpha, exponent}, 4 * sizeof(double));
  return s;
}

nb_optim_schedule *nb_optim_join_schedules(nb_ctx *ctx, int n, nb_optim_schedule **schedules,
                                           const int64_t *boundaries) {
  if (n <= 0 || !schedules) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "join_schedules: needs at least one schedule (got %d)", n);
    return NULL;
  }
  if (!nb_optim__args_ok(ctx, "join_schedules", 0, NULL, n, schedules)) return NULL;
  for (int i = 0; i + 1 < n; i++)
    if (!boundaries || boundaries[i] < 0 || (i && boundaries[i] < boundaries[i - 1])) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "join_schedules: boundaries must be >= 0 and non-decreasing (index %d)", i);
      for (int j = 0; j < n; j++) nb_optim_schedule_destroy(schedules[j]);
      return NULL;
    }
  nb_optim_schedule *s = mk(ctx, K_JOIN, n, true);
  if (s) s->kids = nb_calloc(ctx, sizeof(nb_optim_schedule *) * (size_t)n);
  if (!s || !s->kids) {
    for (int j = 0; j < n; j++) nb_optim_schedule_destroy(schedules[j]);
    nb_optim_schedule_destroy(s);
    return NULL;
  }
  memcpy(s->kids, schedules, sizeof(nb_optim_schedule *) * (size_t)n);
  for (int i = 0; i + 1 < n; i++) s->bounds[i] = boundaries[i];
  return s;
}

nb_optim_schedule *nb_optim_warmup_cosine_decay(nb_ctx *ctx, double init, double peak, int64_t warmup_steps,
                                                int64_t decay_steps, double end_value, double exponent) {
  const char *fn = "warmup_cosine_decay";
  if (!fin(ctx, fn, "peak", peak) || !fin(ctx, fn, "end_value", end_value) ||
      !nonneg_steps(ctx, fn, "warmup_steps", warmup_steps))
    return NULL;
  if (decay_steps <= warmup_steps) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: decay_steps (%lld) must exceed warmup_steps (%lld)", fn,
              (long long)decay_steps, (long long)warmup_steps);
    return NULL;
  }
  double alpha = peak == 0 ? 0 : end_value / peak;
  nb_optim_schedule *kids[2] = {nb_optim_linear(ctx, init, peak, warmup_steps, 0),
                                nb_optim_cosine_decay(ctx, peak, decay_steps - warmup_steps, alpha, exponent)};
  return nb_optim_join_schedules(ctx, 2, kids, &warmup_steps);
}

nb_optim_schedule *nb_optim_warmup_constant(nb_ctx *ctx, double init, double peak, int64_t warmup_steps) {
  return nb_optim_linear(ctx, init, peak, warmup_steps, 0);
}

nb_optim_schedule *nb_optim_piecewise_constant(nb_ctx *ctx, double init, int n, const int64_t *boundaries,
                                               const double *scales) {
  const char *fn = "piecewise_constant";
  if (!fin(ctx, fn, "init", init)) return NULL;
  if (n < 0 || (n && (!boundaries || !scales))) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: bad boundary count %d", fn, n);
    return NULL;
  }
  for (int i = 0; i < n; i++)
    if (!nb_optim__check(ctx, fn, "scale", scales[i], 0, false) || (i && boundaries[i] <= boundaries[i - 1])) {
      if (nb_ctx_status(ctx) == NB_OK)
        nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: boundaries must increase (index %d)", fn, i);
      return NULL;
    }
  nb_optim_schedule *s = mk(ctx, K_PIECEWISE, n, true);
  if (!s) return NULL;
  s->a[0] = init;
  for (int i = 0; i < n; i++) {
    s->bounds[i] = boundaries[i];
    s->vals[i] = scales[i];
  }
  return s;
}

/* Optax's piecewise_interpolate_schedule: bounds (0, b...), values cumulative
 * products of (init, scales...). */
static nb_optim_schedule *interp(nb_ctx *ctx, kind k, double init, int n, const int64_t *b, const double *sc) {
  nb_optim_schedule *s = mk(ctx, k, n, true);
  if (!s) return NULL;
  s->vals[0] = init;
  for (int i = 0; i < n; i++) {
    s->bounds[i + 1] = b[i];
    s->vals[i + 1] = s->vals[i] * sc[i];
  }
  return s;
}

static bool onecycle_ok(nb_ctx *ctx, const char *fn, int64_t steps, double peak, double div, double fdiv) {
  if (steps <= 0) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: transition_steps must be > 0, got %lld", fn, (long long)steps);
    return false;
  }
  return fin(ctx, fn, "peak", peak) && nb_optim__check(ctx, fn, "div_factor", div, 0, true) &&
         nb_optim__check(ctx, fn, "final_div_factor", fdiv, 0, true);
}

nb_optim_schedule *nb_optim_linear_onecycle(nb_ctx *ctx, int64_t transition_steps, double peak, double pct_start,
                                            double pct_final, double div_factor, double final_div_factor) {
  const char *fn = "linear_onecycle";
  if (!onecycle_ok(ctx, fn, transition_steps, peak, div_factor, final_div_factor) ||
      !nb_optim__check(ctx, fn, "pct_start", pct_start, 0, false) ||
      !nb_optim__check(ctx, fn, "pct_final", pct_final, pct_start, true))
    return NULL;
  int64_t b[3] = {(int64_t)(pct_start * (double)transition_steps), (int64_t)(pct_final * (double)transition_steps),
                  transition_steps};
  double sc[3] = {div_factor, 1 / div_factor, 1 / final_div_factor};
  return interp(ctx, K_INTERP_LIN, peak / div_factor, 3, b, sc);
}

nb_optim_schedule *nb_optim_cosine_onecycle(nb_ctx *ctx, int64_t transition_steps, double peak, double pct_start,
                                            double div_factor, double final_div_factor) {
  const char *fn = "cosine_onecycle";
  if (!onecycle_ok(ctx, fn, transition_steps, peak, div_factor, final_div_factor) ||
      !nb_optim__check(ctx, fn, "pct_start", pct_start, 0, false))
    return NULL;
  int64_t b[2] = {(int64_t)(pct_start * (double)transition_steps), transition_steps};
  double sc[2] = {div_factor, 1 / (div_factor * final_div_factor)};
  return interp(ctx, K_INTERP_COS, peak / div_factor, 2, b, sc);
}

nb_optim_schedule *nb_optim_sgdr(nb_ctx *ctx, int n, const nb_optim_sgdr_cycle *cycles) {
  if (n <= 0 || !cycles || n > 4096) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "sgdr: needs 1..4096 cycles (got %d)", n);
    return NULL;
  }
  nb_optim_schedule **kids = nb_calloc(ctx, sizeof(nb_optim_schedule *) * (size_t)n);
  int64_t *b = nb_calloc(ctx, sizeof(int64_t) * (size_t)n);
  nb_optim_schedule *s = NULL;
  if (kids && b) {
    int64_t step = 0;
    for (int i = 0; i < n; i++) {
      const nb_optim_sgdr_cycle *c = &cycles[i];
      kids[i] = nb_optim_warmup_cosine_decay(ctx, c->init, c->peak, c->warmup_steps, c->decay_steps, c->end_value, 1);
      step += c->decay_steps;
      b[i] = step;
    }
    s = nb_optim_join_schedules(ctx, n, kids, b);
  }
  if (kids) nb_dealloc(ctx, kids, sizeof(nb_optim_schedule *) * (size_t)n);
  if (b) nb_dealloc(ctx, b, sizeof(int64_t) * (size_t)n);
  return s;
}

nb_optim_schedule *nb_optim__slot(nb_ctx *ctx, nb_val **cell, double host_value) {
  nb_optim_schedule *s = mk(ctx, K_SLOT, 0, false);
  if (s) {
    s->cell = cell;
    s->a[0] = host_value;
  }
  return s;
}

nb_optim_schedule *nb_optim_schedule_from_input(nb_ctx *ctx, nb_optim_schedule *inner, nb_val *const *cell) {
  if (!inner || !cell) {
    nb_optim_schedule_destroy(inner);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "schedule_from_input: NULL schedule or cell"), NULL;
  }
  nb_optim_schedule *s = mk(ctx, K_INPUT, 0, false);
  if (s) s->kids = nb_calloc(ctx, sizeof(nb_optim_schedule *));
  if (!s || !s->kids) {
    nb_optim_schedule_destroy(inner);
    nb_optim_schedule_destroy(s);
    return NULL;
  }
  s->kids[0] = inner;
  s->cell = cell;
  return s;
}
