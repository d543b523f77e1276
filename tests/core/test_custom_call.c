/* Custom calls: registration, evaluation, attributes (copied, hashed by
 * value, kept alive by every graph holding the call), reverse mode through
 * the kernel's vjp (grad, grad of grad, vjp with an integer output, grad of
 * vmap), vmap (looped, nested), cost, and misuse: unknown names, wrong
 * arity, forward mode, kernels that fail or lie about their outputs; kernels
 * that update an operand in place (interpreted, batched, misdeclared). The test
 * kernels (softplus, polar, cube_nograd) are in tests/lib/cases_custom_call.c. */
#include "primcheck.h"

static const int64_t D4[1] = {4}, D34[2] = {3, 4};

static nb_tree *one(nb_ctx *ctx, const char *path, nb_array *a) {
  nb_tree *t = nb_tree_create(ctx);
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
  return t;
}

static nb_array *vec(nb_ctx *ctx, int rank, const int64_t *dims, double scale) {
  nb_shape s = nb_shape_make(rank, dims);
  double v[64];
  for (int64_t i = 0; i < nb_shape_size(&s); i++) v[i] = scale * (double)(i % 7 - 3) + 0.25;
  return nb_array_from_f64(ctx, NB_F64, rank, dims, v);
}

static double softplus(double x, double b) { return log1p(exp(b * x)) / b; }
static double logistic(double x) { return 1 / (1 + exp(-x)); }

/* ---------------------------------------------------------------- traced functions */

typedef struct sp_args {
  double beta;
  bool twice; /* call it twice (hash-consing) */
} sp_args;

/* loss = sum(softplus_beta(x) * w) */
static nb_status f_sp(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const sp_args *a = u;
  nb_val *x = nb_tree_get_val(in, "x");
  nb_val *y = nb_custom_call(g, "softplus", 1, &x, &a->beta, sizeof a->beta, 1, NULL);
  if (a->twice) y = nb_add(y, nb_custom_call(g, "softplus", 1, &x, &a->beta, sizeof a->beta, 1, NULL));
  nb_val *w = nb_tree_get_val(in, "w");
  return nb_tree_set_val(out, "loss", nb_reduce_sum(w ? nb_mul(y, w) : y, 0, NULL));
}

static nb_status f_sp_vec(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  return nb_tree_set_val(out, "y", nb_custom_call(g, "softplus", 1, &x, NULL, 0, 1, NULL));
}

static nb_status f_polar(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *ops[2] = {nb_tree_get_val(in, "r"), nb_tree_get_val(in, "theta")}, *res[3];
  nb_custom_call(g, "polar", 2, ops, NULL, 0, 3, res);
  nb_status s = nb_tree_set_val(out, "x", res[0]);
  if (!s) s = nb_tree_set_val(out, "y", res[1]);
  return s ? s : nb_tree_set_val(out, "q", res[2]);
}

/* ---------------------------------------------------------------- tests */

/* Kernels that misbehave on purpose: ud 1 fails, 0 returns the wrong aval, 2
 * infers a negative dim. */
static nb_status lying_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  out[0] = in[0];
  if (ud == (void *)2) out[0].shape.dims[0] = -5;
  return NB_OK;
}
static nb_status lying_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                            nb_array **out) {
  if (ud == (void *)1) return nb_errorf(ctx, NB_ERR_IO, "lying kernel: the device went away");
  nb_array_release(out[0]);
  out[0] = nb_array_zeros(ctx, NB_F32, 0, NULL); /* not what infer said */
  return NB_OK;
}


static void test_register(nb_ctx *ctx) {
  CHECK_OK(ctx, nb_test_register_custom_calls(ctx));
  nb_custom_call_rules dup = {.name = "softplus", .infer = NULL, .eval = NULL};
  CHECK(nb_custom_call_register(ctx, &dup) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "custom call 'softplus' needs infer and eval rules");
  nb_custom_call_rules copy = {0};
  CHECK(nb_custom_call_register(ctx, &copy) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "rules with a non-empty name are required");
  /* the name is copied: the caller's buffer may go away */
  char name[16] = "scratch";
  nb_custom_call_rules r = {name, lying_infer, lying_eval, NULL, NULL, NULL, 0};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &r));
  strcpy(name, "other");
  CHECK(nb_custom_call_register(ctx, &r) == NB_OK); /* "other" is new */
  CHECK(nb_custom_call_registered(ctx, "scratch") && nb_custom_call_registered(ctx, "other"));
  CHECK(!nb_custom_call_registered(ctx, "never-registered") && !nb_custom_call_registered(ctx, NULL));
  strcpy(name, "scratch");
  CHECK(nb_custom_call_register(ctx, &r) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "custom call 'scratch' is already registered");
}

static void test_eval_and_attrs(nb_ctx *ctx) {
  nb_tree *in = one(ctx, "x", vec(ctx, 2, D34, 0.7)), *out = nb_tree_create(ctx);
  sp_args a = {2.0, true};
  nb_graph *g = nb_trace(ctx, f_sp, &a, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (!g) return;
  /* two identical calls are one equation; the text names the kernel and its attributes */
  char *text = nb_graph_to_string(g);
  const char *first = strstr(text, "custom_call[softplus attrs=8B#");
  CHECK_MSG(first && !strstr(first + 1, "custom_call["), "%s", text);
  free(text);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  double want = 0;
  nb_array *x = nb_tree_get_array(in, "x");
  for (int i = 0; i < 12; i++) want += 2 * softplus(nb_array_get(x, i), 2.0);
  CHECK_NEAR(nb_array_get(nb_tree_get_array(out, "loss"), 0), want, 1e-12);
  nb_graph_destroy(g);
  nb_tree_destroy(out);
  /* different attributes are different calls, equal bytes the same call */
  nb_graph *h = nb_graph_create(ctx);
  nb_val *xv = nb_graph_input(h, "x", nb_aval_make(NB_F64, 2, D34));
  double b1 = 1.5, b2 = 1.5, b3 = 3;
  nb_val *y1 = nb_custom_call(h, "softplus", 1, &xv, &b1, sizeof b1, 1, NULL);
  nb_val *y2 = nb_custom_call(h, "softplus", 1, &xv, &b2, sizeof b2, 1, NULL);
  b1 = 99; /* the attributes were copied at the call */
  nb_val *y3 = nb_custom_call(h, "softplus", 1, &xv, &b3, sizeof b3, 1, NULL);
  CHECK(y1 == y2 && y1 != y3);
  nb_graph_output(h, "y1", y1);
  nb_tree *o = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, h, in, o));
  CHECK_NEAR(nb_array_get(nb_tree_get_array(o, "y1"), 5), softplus(nb_array_get(x, 5), 1.5), 1e-12);
  /* cost: the kernel's own rule */
  double flops, bytes;
  nb_graph_cost(h, &flops, &bytes);
  CHECK(flops == 2 * 4 * 12); /* two distinct calls, 4 flops per element */
  nb_graph_destroy(h);
  nb_tree_destroy(o);
  nb_tree_destroy(in);
}

static void test_grad(nb_ctx *ctx) {
  nb_tree *in = one(ctx, "x", vec(ctx, 2, D34, 0.7));
  nb_array *w0 = vec(ctx, 2, D34, -0.3);
  nb_tree_set_array(in, "w", w0);
  nb_array_release(w0);
  sp_args a = {2.0, false};
  nb_graph *g = nb_trace(ctx, f_sp, &a, in);
  nb_graph *dg = nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "x"});
  CHECK_MSG(dg, "%s", nb_ctx_error(ctx));
  nb_graph_destroy(g); /* the gradient graph must keep the attributes alive on its own */
  nb_tree *out = nb_tree_create(ctx);
  if (dg) CHECK_OK(ctx, nb_graph_run(ctx, dg, in, out));
  nb_array *x = nb_tree_get_array(in, "x"), *w = nb_tree_get_array(in, "w"), *gx = nb_tree_get_array(out, "grad/x");
  CHECK(gx != NULL);
  for (int i = 0; gx && i < 12; i++)
    CHECK_NEAR(nb_array_get(gx, i), nb_array_get(w, i) * logistic(2 * nb_array_get(x, i)), 1e-12);
  nb_tree_destroy(out);

  /* grad of grad: the vjp's own ops are differentiated (sum of dloss/dx) */
  nb_graph *g2 = nb_trace(ctx, f_sp, &a, in), *d1 = nb_grad(ctx, g2, &(nb_grad_opts){.wrt = "x"});
  nb_graph *s = nb_graph_create(ctx);
  nb_tree *sin_ = nb_tree_create(ctx), *sres = nb_tree_create(ctx);
  nb_tree_set_val(sin_, "x", nb_graph_input(s, "x", nb_array_aval(x)));
  nb_tree_set_val(sin_, "w", nb_graph_input(s, "w", nb_array_aval(w)));
  CHECK_OK(ctx, nb_graph_call(s, d1, sin_, sres));
  nb_graph_output(s, "total", nb_reduce_sum(nb_tree_get_val(sres, "grad/x"), 0, NULL));
  nb_graph *d2 = nb_grad(ctx, s, &(nb_grad_opts){.wrt = "x"});
  out = nb_tree_create(ctx);
  CHECK_MSG(d2 && nb_graph_run(ctx, d2, in, out) == NB_OK, "%s", nb_ctx_error(ctx));
  nb_array *h = nb_tree_get_array(out, "grad/x");
  for (int i = 0; h && i < 12; i++) {
    double sx = logistic(2 * nb_array_get(x, i));
    CHECK_NEAR(nb_array_get(h, i), nb_array_get(w, i) * 2 * sx * (1 - sx), 1e-12);
  }
  nb_graph_destroy(dg);
  nb_graph_destroy(g2);
  nb_graph_destroy(d1);
  nb_graph_destroy(s);
  nb_graph_destroy(d2);
  nb_tree_destroy(sin_);
  nb_tree_destroy(sres);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
}

static void test_vjp_multi_output(nb_ctx *ctx) {
  nb_tree *in = one(ctx, "r", vec(ctx, 1, D4, 0.5));
  nb_array *th0 = vec(ctx, 1, D4, 0.9);
  nb_tree_set_array(in, "theta", th0);
  nb_array_release(th0);
  nb_graph *g = nb_trace(ctx, f_polar, NULL, in), *vg = g ? nb_vjp(ctx, g) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  nb_tree *vin = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_array *r = nb_tree_get_array(in, "r"), *th = nb_tree_get_array(in, "theta");
  nb_tree_set_array(vin, "primal/r", r);
  nb_tree_set_array(vin, "primal/theta", th);
  nb_array *cx = vec(ctx, 1, D4, 0.3), *cy = vec(ctx, 1, D4, -0.6);
  nb_tree_set_array(vin, "ct/x", cx);
  nb_tree_set_array(vin, "ct/y", cy);
  if (vg) CHECK_OK(ctx, nb_graph_run(ctx, vg, vin, out));
  nb_array *gr = nb_tree_get_array(out, "grad/r"), *gt = nb_tree_get_array(out, "grad/theta"),
           *q = nb_tree_get_array(out, "primal/q");
  CHECK(gr && gt && q && nb_array_dtype(q) == NB_I32);
  for (int i = 0; gr && gt && i < 4; i++) {
    double rr = nb_array_get(r, i), t = nb_array_get(th, i), a = nb_array_get(cx, i), b = nb_array_get(cy, i);
    CHECK_NEAR(nb_array_get(gr, i), a * cos(t) + b * sin(t), 1e-12);
    CHECK_NEAR(nb_array_get(gt, i), rr * (b * cos(t) - a * sin(t)), 1e-12);
  }
  nb_array_release(cx);
  nb_array_release(cy);
  nb_graph_destroy(g);
  nb_graph_destroy(vg);
  nb_tree_destroy(vin);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
}

/* vmap runs the kernel per item; nested vmap folds both axes into one loop;
 * grad of vmap transposes a batched call (its vjp vmapped). */
static void test_vmap(nb_ctx *ctx) {
  int64_t d234[3] = {2, 3, 4};
  nb_array *x = vec(ctx, 3, d234, 0.4);
  nb_tree *in = one(ctx, "x", nb_array_create(ctx, NB_F64, 1, D4, nb_array_data(x)));
  nb_graph *g = nb_trace(ctx, f_sp_vec, NULL, in);
  nb_vmap_opts o = {.axis_size = 3};
  nb_graph *v1 = g ? nb_vmap(ctx, g, &o) : NULL;
  o.axis_size = 2;
  nb_graph *v2 = v1 ? nb_vmap(ctx, v1, &o) : NULL;
  CHECK_MSG(v2, "%s", nb_ctx_error(ctx));
  char *text = v2 ? nb_graph_to_string(v2) : NULL;
  CHECK_MSG(text && strstr(text, "custom_call[softplus batch=6]"), "%s", text ? text : "");
  free(text);
  nb_tree *vin = one(ctx, "x", x), *out = nb_tree_create(ctx);
  nb_array_retain(x);
  if (v2) CHECK_OK(ctx, nb_graph_run(ctx, v2, vin, out));
  nb_array *y = nb_tree_get_array(out, "y");
  CHECK(y && nb_array_rank(y) == 3 && nb_array_dims(y)[0] == 2 && nb_array_dims(y)[1] == 3);
  for (int i = 0; y && i < 24; i++) CHECK_NEAR(nb_array_get(y, i), softplus(nb_array_get(x, i), 1), 1e-12);

  /* grad of sum(vmap(softplus)) == logistic(x), through the batched vjp */
  nb_graph *s = nb_graph_create(ctx);
  nb_tree *sin_ = nb_tree_create(ctx), *sres = nb_tree_create(ctx);
  int64_t d34b[2] = {3, 4};
  nb_tree_set_val(sin_, "x", nb_graph_input(s, "x", nb_aval_make(NB_F64, 2, d34b)));
  CHECK_OK(ctx, nb_graph_call(s, v1, sin_, sres));
  nb_graph_output(s, "loss", nb_reduce_sum(nb_tree_get_val(sres, "y"), 0, NULL));
  nb_graph *ds = nb_grad(ctx, s, NULL);
  CHECK_MSG(ds, "%s", nb_ctx_error(ctx));
  nb_tree *gin = one(ctx, "x", nb_array_create(ctx, NB_F64, 2, d34b, nb_array_data(x))), *gout = nb_tree_create(ctx);
  if (ds) CHECK_OK(ctx, nb_graph_run(ctx, ds, gin, gout));
  nb_array *gx = nb_tree_get_array(gout, "grad/x");
  for (int i = 0; gx && i < 12; i++) CHECK_NEAR(nb_array_get(gx, i), logistic(nb_array_get(x, i)), 1e-12);
  CHECK(gx != NULL);

  nb_array_release(x);
  nb_graph_destroy(g);
  nb_graph_destroy(v1);
  nb_graph_destroy(v2);
  nb_graph_destroy(s);
  nb_graph_destroy(ds);
  nb_tree_destroy(sin_);
  nb_tree_destroy(sres);
  nb_tree_destroy(gin);
  nb_tree_destroy(gout);
  nb_tree_destroy(vin);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- misuse */

typedef enum misuse { M_UNKNOWN, M_ARITY, M_DTYPE, M_ATTR_SIZE, M_NOUT, M_ATTRS, M_BAD_AVAL, M_COUNT } misuse;

static nb_status f_misuse(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *two[2] = {x, x}, *res[2] = {NULL, NULL};
  nb_val *y = NULL;
  switch (*(misuse *)u) {
  case M_UNKNOWN: y = nb_custom_call(g, "no_such_kernel", 1, &x, NULL, 0, 1, NULL); break;
  case M_ARITY: y = nb_custom_call(g, "softplus", 2, two, NULL, 0, 1, NULL); break;
  case M_DTYPE: y = nb_convert(x, NB_I32), y = nb_custom_call(g, "softplus", 1, &y, NULL, 0, 1, NULL); break;
  case M_ATTR_SIZE: y = nb_custom_call(g, "softplus", 1, &x, "abc", 3, 1, NULL); break;
  case M_NOUT: y = nb_custom_call(g, "softplus", 1, &x, NULL, 0, 0, res); break;
  case M_ATTRS: y = nb_custom_call(g, "softplus", 1, &x, NULL, 8, 1, NULL); break;
  case M_BAD_AVAL: y = nb_custom_call(g, "lying_shape", 1, &x, NULL, 0, 1, NULL); break;
  default: break;
  }
  return nb_tree_set_val(out, "y", y);
}

static void test_misuse(nb_ctx *ctx) {
  nb_custom_call_rules fail = {"lying_fail", lying_infer, lying_eval, NULL, NULL, (void *)1, 0};
  nb_custom_call_rules wrong = {"lying_aval", lying_infer, lying_eval, NULL, NULL, (void *)0, 0};
  nb_custom_call_rules shape = {"lying_shape", lying_infer, lying_eval, NULL, NULL, (void *)2, 0};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &fail));
  CHECK_OK(ctx, nb_custom_call_register(ctx, &wrong));
  CHECK_OK(ctx, nb_custom_call_register(ctx, &shape));
  struct { nb_status st; const char *msg; } want[M_COUNT] = {
      [M_UNKNOWN] = {NB_ERR_NOT_FOUND, "custom call 'no_such_kernel' is not registered on this context"},
      [M_ARITY] = {NB_ERR_INVALID_ARG, "custom_call: custom call 'softplus' refused its operands (its infer rule returned "
                                       "invalid argument) (operands: f64[4], f64[4])"},
      [M_DTYPE] = {NB_ERR_INVALID_ARG, "custom call 'softplus' refused its operands (its infer rule returned invalid argument) (operands: i32[4])"},
      [M_ATTR_SIZE] = {NB_ERR_INVALID_ARG, "custom call 'softplus' refused its operands"},
      [M_NOUT] = {NB_ERR_INVALID_ARG, "custom call 'softplus': needs 0 to 64 operands and 1 to 64 outputs, got 1 and 0"},
      [M_ATTRS] = {NB_ERR_INVALID_ARG, "custom call 'softplus': NULL attrs of 8 bytes"},
      [M_BAD_AVAL] = {NB_ERR_INVALID_ARG, "custom call 'lying_shape': its infer rule made an invalid aval for output 0"},
  };
  nb_tree *in = one(ctx, "x", vec(ctx, 1, D4, 1));
  for (int m = 0; m < M_COUNT; m++) {
    misuse which = (misuse)m;
    nb_graph *g = nb_trace(ctx, f_misuse, &which, in);
    CHECK_MSG(g == NULL, "misuse %d accepted", m);
    CHECK_MSG(strstr(nb_ctx_error(ctx), "test_custom_call.c:"), "misuse %d: no caller location: %s", m, nb_ctx_error(ctx));
    CHECK_ERR(ctx, want[m].st, want[m].msg);
    nb_graph_destroy(g);
  }

  /* run-time failures of a kernel: its own message, or a named mismatch */
  const char *names[2] = {"lying_fail", "lying_aval"};
  const char *msgs[2] = {"lying kernel: the device went away",
                         "custom call 'lying_aval': eval made f32[] for output 0, its infer rule said f64[4]"};
  nb_status codes[2] = {NB_ERR_IO, NB_ERR_INVALID_ARG};
  for (int k = 0; k < 2; k++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F64, 1, D4));
    nb_graph_output(g, "y", nb_custom_call(g, names[k], 1, &x, NULL, 0, 1, NULL));
    nb_tree *out = nb_tree_create(ctx);
    CHECK(nb_graph_run(ctx, g, in, out) == codes[k]);
    CHECK_ERR(ctx, codes[k], msgs[k]);
    nb_tree_destroy(out);
    nb_graph_destroy(g);
  }

  /* differentiation: forward mode is refused at run time, kernels without a vjp at transform time */
  nb_graph *g = nb_trace(ctx, f_sp_vec, NULL, in), *jg = g ? nb_jvp(ctx, g) : NULL;
  CHECK_MSG(jg, "%s", nb_ctx_error(ctx));
  nb_tree *jin = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(jin, "primal/x", nb_tree_get_array(in, "x"));
  nb_tree_set_array(jin, "tangent/x", nb_tree_get_array(in, "x"));
  CHECK(jg && nb_graph_run(ctx, jg, jin, out) == NB_ERR_UNIMPLEMENTED);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "custom call 'softplus' has no forward-mode rule (only a vjp): differentiate it with grad");
  nb_graph *c = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(c, "x", nb_aval_make(NB_F64, 1, D4));
  nb_graph_output(c, "loss", nb_reduce_sum(nb_custom_call(c, "cube_nograd", 1, &x, NULL, 0, 1, NULL), 0, NULL));
  CHECK(nb_grad(ctx, c, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_UNIMPLEMENTED, "custom call 'cube_nograd' cannot be differentiated: it was registered without a vjp rule");
  nb_graph_destroy(c);
  nb_graph_destroy(g);
  nb_graph_destroy(jg);
  nb_tree_destroy(jin);
  nb_tree_destroy(out);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- in place */

/* set_first: x with x[0] = v[0]. Declared in place (output 0 updates
 * operand 0), so it writes only x[0]; ud != NULL: an infer rule that lies. */
static nb_status set_first_infer(void *ud, int nin, const nb_aval *in, const void *attrs, size_t size, int nout, nb_aval *out) {
  out[0] = ud ? nb_aval_make(NB_F32, 0, NULL) : in[0];
  return nin == 2 && nout == 1 ? NB_OK : NB_ERR_SHAPE;
}

static nb_status set_first_eval(void *ud, nb_ctx *ctx, int nin, nb_array *const *in, const void *attrs, size_t size, int nout,
                                nb_array **out) {
  ((double *)nb_array_data_mut(out[0]))[0] = ((const double *)nb_array_data(in[1]))[0];
  return NB_OK;
}

static void test_in_place(nb_ctx *ctx) {
  nb_custom_call_rules r = {.name = "set_first", .infer = set_first_infer, .eval = set_first_eval, .in_place = 1};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &r));
  int64_t d1 = 1;
  nb_graph *g = nb_graph_create(ctx);
  nb_val *ops[2] = {nb_graph_input(g, "x", nb_aval_make(NB_F64, 1, D4)), nb_graph_input(g, "v", nb_aval_make(NB_F64, 1, &d1))};
  nb_graph_output(g, "y", nb_custom_call(g, "set_first", 2, ops, NULL, 0, 1, NULL));
  /* interpreted: the kernel gets a copy of x (not donated), x is kept */
  nb_array *x = vec(ctx, 1, D4, 1.0), *in[2] = {x, nb_array_from_f64(ctx, NB_F64, 1, &d1, (double[]){9})}, *y = NULL;
  CHECK_OK(ctx, nb_graph_run_flat(ctx, g, in, &y));
  for (int i = 0; y && i < 4; i++) CHECK_NEAR(nb_array_get(y, i), i ? nb_array_get(x, i) : 9, 0);
  CHECK(nb_array_get(x, 0) == 0.25 - 3);
  nb_array_release(y);
  /* batched: each item gets its own copy */
  nb_vmap_opts o = {.axis_size = 2};
  nb_graph *v = nb_vmap(ctx, g, &o);
  CHECK_MSG(v, "%s", nb_ctx_error(ctx));
  int64_t d24[2] = {2, 4}, d21[2] = {2, 1};
  nb_array *bin[2] = {vec(ctx, 2, d24, 1.0), nb_array_from_f64(ctx, NB_F64, 2, d21, (double[]){7, 8})}, *by = NULL;
  if (v) CHECK_OK(ctx, nb_graph_run_flat(ctx, v, bin, &by));
  for (int i = 0; by && i < 8; i++) CHECK_NEAR(nb_array_get(by, i), i % 4 ? nb_array_get(bin[0], i) : 7 + i / 4, 0);
  CHECK(by != NULL);
  /* an in-place output must have its operand's aval, and name an output there is */
  r = (nb_custom_call_rules){.name = "set_first_lying", .infer = set_first_infer, .eval = set_first_eval, .in_place = 1, .ud = ctx};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &r));
  r = (nb_custom_call_rules){.name = "set_first_beyond", .infer = set_first_infer, .eval = set_first_eval, .in_place = 2};
  CHECK_OK(ctx, nb_custom_call_register(ctx, &r));
  const char *bad[2] = {"set_first_lying", "set_first_beyond"}, *why[2] = {"another aval", "beyond"};
  for (int b = 0; b < 2; b++) {
    nb_graph *h = nb_graph_create(ctx);
    nb_val *hops[2] = {nb_graph_input(h, "x", nb_aval_make(NB_F64, 1, D4)), nb_graph_input(h, "v", nb_aval_make(NB_F64, 1, &d1))};
    nb_custom_call(h, bad[b], 2, hops, NULL, 0, 1, NULL);
    CHECK_MSG(nb_graph_status(h) == NB_ERR_INVALID_ARG && strstr(nb_graph_error(h), why[b]), "%s: %s", bad[b], nb_graph_error(h));
    nb_graph_destroy(h);
  }
  for (int i = 0; i < 2; i++) {
    nb_array_release(in[i]);
    nb_array_release(bin[i]);
  }
  nb_array_release(by);
  nb_graph_destroy(v);
  nb_graph_destroy(g);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_register(ctx);
  test_eval_and_attrs(ctx);
  test_grad(ctx);
  test_vjp_multi_output(ctx);
  test_vmap(ctx);
  test_misuse(ctx);
  test_in_place(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("core/custom_call");
}
