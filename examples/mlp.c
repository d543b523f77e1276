/* A two-layer MLP trained on synthetic data with value_and_grad through the
 * reference interpreter: the smallest complete use of nabla's core API.
 *
 *   build/example_mlp [steps]
 *
 * The data: x ~ N(0, 1) in R^8, targets from a fixed random "teacher"
 * network y = tanh(x A) b. The student is tanh(x W1 + b1) W2 + b2 with 32
 * hidden units, trained by plain SGD on the mean squared error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

enum { BATCH = 64, IN = 8, HIDDEN = 32, TEACHER = 4 };

/* loss(params, batch) = mean((mlp(x) - y)^2) */
static nb_status loss_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *x = nb_tree_get_val(in, "batch/x"), *y = nb_tree_get_val(in, "batch/y");
  nb_val *h = nb_tanh(nb_add(nb_matmul(x, nb_tree_get_val(in, "params/w1")), nb_tree_get_val(in, "params/b1")));
  nb_val *pred = nb_add(nb_matmul(h, nb_tree_get_val(in, "params/w2")), nb_tree_get_val(in, "params/b2"));
  nb_val *err = nb_sub(pred, y);
  nb_val *mse = nb_div(nb_reduce_sum(nb_mul(err, err), 0, NULL), nb_scalar(g, NB_F32, BATCH));
  return nb_tree_set_val(out, "loss", mse);
}

/* The teacher: y = tanh(x A) b, evaluated with the same machinery. */
static nb_status teacher_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  nb_val *h = nb_tanh(nb_matmul(nb_tree_get_val(in, "x"), nb_tree_get_val(in, "a")));
  return nb_tree_set_val(out, "y", nb_matmul(h, nb_tree_get_val(in, "b")));
}

/* sgd(params, grads) = params - lr * grads, one leaf at a time. */
static nb_status sgd_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *user) {
  float lr = *(const float *)user;
  for (size_t i = 0; i < nb_tree_size(in); i++) {
    const char *path = nb_tree_path(in, i);
    if (strncmp(path, "params/", 7) != 0) continue;
    char gpath[256];
    snprintf(gpath, sizeof gpath, "grad/%s", path);
    nb_val *p = nb_tree_leaf(in, i)->val, *dp = nb_tree_get_val(in, gpath);
    nb_status st = nb_tree_set_val(out, path, nb_sub(p, nb_mul(nb_scalar(g, NB_F32, lr), dp)));
    if (st) return st;
  }
  return NB_OK;
}

static nb_array *normal(nb_ctx *ctx, nb_array *key, uint32_t stream, int rank, const int64_t *dims, double scale) {
  nb_array *k = nb_key_fold_in(ctx, key, stream);
  nb_array *z = nb_array_random_normal(ctx, k, NB_F32, rank, dims);
  nb_array *s = nb_array_empty(ctx, NB_F32, rank, dims);
  for (int64_t i = 0; i < nb_array_size(z); i++) ((float *)nb_array_data_mut(s))[i] = (float)(scale * nb_array_get(z, i));
  nb_array_release(k);
  nb_array_release(z);
  return s;
}

static void put(nb_tree *t, const char *path, nb_array *a) {
  nb_tree_set_array(t, path, a);
  nb_array_release(a);
}

#define TRY(x)                                                         \
  do {                                                                 \
    if (!(x)) {                                                        \
      fprintf(stderr, "example_mlp: %s\n", nb_ctx_error(ctx));         \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 300;
  float lr = 0.1f;
  nb_ctx *ctx = nb_ctx_create();
  nb_array *key = nb_key(ctx, 0);

  /* parameters, initialized from the key (deterministic) */
  nb_tree *params = nb_tree_create(ctx);
  put(params, "params/w1", normal(ctx, key, 1, 2, (int64_t[]){IN, HIDDEN}, 1.0 / sqrt(IN)));
  put(params, "params/b1", nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){HIDDEN}));
  put(params, "params/w2", normal(ctx, key, 2, 2, (int64_t[]){HIDDEN, 1}, 1.0 / sqrt(HIDDEN)));
  put(params, "params/b2", nb_array_zeros(ctx, NB_F32, 1, (int64_t[]){1}));

  /* trace once: the loss, its value_and_grad, and the SGD update */
  nb_tree *spec = nb_tree_copy(params);
  nb_tree_set(spec, "batch/x", nb_leaf_aval(nb_aval_make(NB_F32, 2, (int64_t[]){BATCH, IN})));
  nb_tree_set(spec, "batch/y", nb_leaf_aval(nb_aval_make(NB_F32, 2, (int64_t[]){BATCH, 1})));
  nb_graph *loss = nb_trace(ctx, loss_fn, NULL, spec);
  TRY(loss);
  nb_graph *step = nb_value_and_grad(ctx, loss, &(nb_grad_opts){.wrt = "params"});
  TRY(step);
  nb_tree *sgd_spec = nb_tree_copy(params);
  nb_tree_merge(sgd_spec, "grad", params);
  nb_graph *sgd = nb_trace(ctx, sgd_fn, &lr, sgd_spec);
  TRY(sgd);
  nb_tree *teacher_spec = nb_tree_create(ctx);
  put(teacher_spec, "a", normal(ctx, key, 3, 2, (int64_t[]){IN, TEACHER}, 1.0));
  put(teacher_spec, "b", normal(ctx, key, 4, 2, (int64_t[]){TEACHER, 1}, 1.0));
  nb_tree_set(teacher_spec, "x", nb_leaf_aval(nb_aval_make(NB_F32, 2, (int64_t[]){BATCH, IN})));
  nb_graph *teacher = nb_trace(ctx, teacher_fn, NULL, teacher_spec);
  TRY(teacher);

  double first = 0, last = 0;
  for (int s = 0; s < steps; s++) {
    /* a fresh batch from the step's key */
    nb_tree *batch = nb_tree_copy(teacher_spec);
    put(batch, "x", normal(ctx, key, 1000 + (uint32_t)s, 2, (int64_t[]){BATCH, IN}, 1.0));
    nb_tree *ty = nb_tree_create(ctx);
    TRY(nb_graph_run(ctx, teacher, batch, ty) == NB_OK);
    nb_tree *in = nb_tree_copy(params);
    nb_tree_set_array(in, "batch/x", nb_tree_get_array(batch, "x"));
    nb_tree_set_array(in, "batch/y", nb_tree_get_array(ty, "y"));
    nb_tree *res = nb_tree_create(ctx);
    TRY(nb_graph_run(ctx, step, in, res) == NB_OK);
    double l = nb_array_get(nb_tree_get_array(res, "loss"), 0);
    if (s == 0) first = l;
    last = l;
    if (s % 50 == 0 || s == steps - 1) printf("step %4d  loss %.5f\n", s, l);
    /* params <- params - lr * grads */
    nb_tree *upd_in = nb_tree_copy(params), *new_params = nb_tree_create(ctx);
    nb_tree_merge(upd_in, NULL, res); /* adds loss and grad/params/... */
    TRY(nb_graph_run(ctx, sgd, upd_in, new_params) == NB_OK);
    nb_tree_destroy(params);
    params = new_params;
    nb_tree_destroy(upd_in);
    nb_tree_destroy(res);
    nb_tree_destroy(in);
    nb_tree_destroy(ty);
    nb_tree_destroy(batch);
  }
  printf("loss %.5f -> %.5f over %d steps (%s)\n", first, last, steps, last < 0.5 * first ? "learned" : "did not learn");
  int rc = last < 0.5 * first ? 0 : 1;

  nb_graph_destroy(loss);
  nb_graph_destroy(step);
  nb_graph_destroy(sgd);
  nb_graph_destroy(teacher);
  nb_tree_destroy(params);
  nb_tree_destroy(spec);
  nb_tree_destroy(sgd_spec);
  nb_tree_destroy(teacher_spec);
  nb_array_release(key);
  nb_ctx_destroy(ctx);
  return rc;
}
