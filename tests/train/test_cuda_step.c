/* A gpt2-tiny training step on the "cuda" backend: the trainer's whole step
 * graph (loss, its gradient, global-norm clipping, AdamW, with grad_accum 2
 * so the micro-batches run as a scan) and the model loss's value_and_grad,
 * each run on "cuda" and on "cpu" against the interpreter: loss, grad norm,
 * gradients, updated parameters and optimizer state agree within f32
 * tolerance (cuBLASLt in IEEE f32, no TF32). SKIPPED where the cuda backend
 * has no device. */
#include "jitcheck.h"
#include "nabla/models.h"
#include "nabla/optim.h"
#include "nabla/train.h"

static nb_ctx *ctx;

/* The largest relative difference (|a-b| / (1 + |b|)) between got's and
 * want's arrays; every path of want must be in got. */
static double worst_diff(const char *what, const nb_tree *got, const nb_tree *want, char *worst_path, size_t cap) {
  double worst = 0;
  for (size_t i = 0; i < nb_tree_size(want); i++) {
    const char *p = nb_tree_path(want, i);
    nb_array *x = nb_tree_get_array(got, p);
    CHECK_MSG(x, "%s: no output %s", what, p);
    double d = x ? nb_test_max_rel_diff(x, nb_tree_leaf(want, i)->array) : INFINITY;
    if (!(d <= worst)) worst = d, snprintf(worst_path, cap, "%s", p);
  }
  return worst;
}

/* g on "cpu" and "cuda", each against the interpreter (tol), and cuda against cpu */
static void check_backends(const char *what, const nb_graph *g, const nb_tree *in, double tol) {
  nb_tree *want = nb_tree_create(ctx), *got[2];
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want));
  static const char *const backends[] = {"cpu", "cuda"};
  for (int b = 0; b < 2; b++) {
    got[b] = nb_tree_create(ctx);
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.backend = backends[b];
    nb_exe *e = nb_jit(ctx, g, &o);
    CHECK_MSG(e, "%s on %s: %s", what, backends[b], nb_ctx_error(ctx));
    if (!e) continue;
    nb_exe_stats s;
    nb_exe_get_stats(e, &s);
    CHECK_OK(ctx, nb_exe_run(e, in, got[b]));
    char p[256] = "";
    double d = worst_diff(what, got[b], want, p, sizeof p);
    printf("%s on %s: %zu kernels, %zu library, %zu evaluated; worst rel diff vs interpreter %.3g (%s)\n", what,
           backends[b], s.nkernels, s.nblas, s.neval, d, p);
    CHECK_MSG(d <= tol, "%s on %s: '%s' differs from the interpreter by %g", what, backends[b], p, d);
    nb_exe_destroy(e);
  }
  char p[256] = "";
  double d = worst_diff(what, got[1], got[0], p, sizeof p);
  printf("%s: cuda vs cpu worst rel diff %.3g (%s)\n", what, d, p);
  CHECK_MSG(d <= tol, "%s: cuda's '%s' differs from cpu's by %g", what, p, d);
  nb_tree_destroy(got[0]);
  nb_tree_destroy(got[1]);
  nb_tree_destroy(want);
}

static void set_tokens(nb_tree *in, const char *path, int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  nb_test_rng r = {seed};
  nb_array *a = nb_test_randint(ctx, &r, NB_I32, 2, (int64_t[]){b, t}, 0, vocab - 1);
  nb_tree_set_array(in, path, a);
  nb_array_release(a);
}

int main(void) {
  ctx = nb_ctx_create();
  setenv("NABLA_CUDA_POISON", "1", 1);
  char why[512];
  if (!nb_test_cuda_usable(ctx, why, sizeof why)) {
    printf("gpt2-tiny step on cuda: SKIPPED (%s)\n", why);
    nb_ctx_destroy(ctx);
    return nb_test_summary("train/test_cuda_step");
  }
  nb_train_config cfg;
  nb_train_config_defaults(&cfg);
  const char *sets[] = {"model.preset=gpt2-tiny", "model.n_layers=2", "model.d_model=32", "model.n_heads=2",
                        "model.n_kv_heads=2", "model.d_ff=64", "model.max_seq_len=16", "data.seq_len=16",
                        "batch_size=4", "grad_accum=2", "optim.name=adamw", "optim.grad_clip=0.5", "optim.lr=1e-3"};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) CHECK_OK(ctx, nb_train_config_set(ctx, &cfg, sets[i]));
  nb_array *key = nb_key(ctx, 11);
  nb_tree *params = nb_model_init(ctx, &cfg.model, key);
  nb_optim_tx *tx = nb_train_optimizer(ctx, &cfg);
  nb_tree *opt = params && tx ? nb_optim_init_arrays(ctx, tx, params) : NULL;
  CHECK_MSG(opt, "%s", nb_ctx_error(ctx));

  /* the model loss's gradient */
  nb_tree *batch = nb_tree_create(ctx);
  set_tokens(batch, "inputs", 4, 16, cfg.model.vocab_size, 1);
  set_tokens(batch, "targets", 4, 16, cfg.model.vocab_size, 2);
  nb_graph *lg = params ? nb_model_trace_loss(ctx, &cfg.model, NULL, params, batch) : NULL;
  nb_graph *vg = lg ? nb_value_and_grad(ctx, lg, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  if (vg) {
    nb_tree *in = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    nb_tree_merge(in, "batch", batch);
    check_backends("gpt2-tiny loss and grad", vg, in, 1e-4);
    nb_tree_destroy(in);
  }

  /* the trainer's step: micro-batches in a scan, clipping, AdamW */
  nb_graph *step = opt ? nb_train_trace_step(ctx, &cfg, params, opt) : NULL;
  CHECK_MSG(step, "%s", nb_ctx_error(ctx));
  if (step) {
    nb_tree *in = nb_tree_create(ctx);
    nb_tree_merge(in, "params", params);
    nb_tree_merge(in, "opt_state", opt);
    set_tokens(in, "batch/inputs", 4, 16, cfg.model.vocab_size, 3);
    set_tokens(in, "batch/targets", 4, 16, cfg.model.vocab_size, 4);
    nb_array *s = nb_array_scalar(ctx, NB_I32, 3);
    nb_tree_set_array(in, "step", s);
    nb_array_release(s);
    CHECK_OK(ctx, nb_train_set_hparams(ctx, &cfg, in));
    check_backends("gpt2-tiny train step", step, in, 1e-4);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(step);
  nb_graph_destroy(vg);
  nb_graph_destroy(lg);
  nb_tree_destroy(batch);
  nb_tree_destroy(opt);
  nb_optim_tx_destroy(tx);
  nb_tree_destroy(params);
  nb_array_release(key);
  nb_ctx_destroy(ctx);
  return nb_test_summary("train/test_cuda_step");
}
