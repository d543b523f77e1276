/* Tensor parallelism's model split (src/train/tp.c) as 2 processes
 * (tests/dist/mpirun.sh 2), in f64 so that reduction order does not hide a
 * wrong gradient: a gpt2-like model (biases, tied embedding) and a
 * llama-like one (4 heads over 2 kv heads, SwiGLU), each traced per process
 * with half the heads and d_ff on its shards and the hook's collectives,
 * against the whole model in one process:
 *  - the loss is the whole model's (within 1e-12 relative);
 *  - the gradient of every split leaf is its block of the whole gradient,
 *    and of every whole leaf the whole gradient, on both processes (1e-10
 *    of the leaf's largest entry): without the pbroadcast before the
 *    column-parallel linears the norms' and embeddings' gradients miss the
 *    other process's heads; without the psum after the row-parallel ones
 *    the loss is wrong;
 *  - two central differences (a split and a whole leaf) agree with them;
 * and the layout's checkpoint: each process's blocks (split leaves along
 * their dim, whole leaves by process 0) saved as one checkpoint restore as
 * the whole arrays bit for bit (tensor 2 -> 1), and the blocks of those are
 * each process's shards bit for bit (1 -> tensor 2). The layout is the
 * trainer's (its built-in tensor rules); the gpt2-like model also runs
 * under rules that split only the MLP (the attention then runs whole on
 * both processes, its heads undivided). */
#include <stdlib.h>

#include "nabla/dist.h"
#include "test.h"
#include "testfs.h"
#include "train/internal.h"

static int rank;

/* The trainer's layout of a model's params for mesh.tensor=2 under rules ("": the built-in ones). */
static void layout_of(nb_ctx *ctx, const nb_model_config *cfg, const char *rules, const nb_tree *params, nb_train__layout *L) {
  nb_train_config c;
  nb_train_config_defaults(&c);
  c.model = *cfg;
  c.mesh.tensor = 2;
  snprintf(c.mesh.rules, sizeof c.mesh.rules, "%s", rules);
  CHECK_OK(ctx, nb_train__layout_make(ctx, &c, params, NULL, L));
}

static nb_tree *batch(nb_ctx *ctx, int64_t V) {
  int64_t d[2] = {2, 8};
  double in[16], tg[16];
  uint64_t x = 12345;
  for (int i = 0; i < 16; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    in[i] = (double)((x >> 33) % (uint64_t)V);
    tg[i] = (double)((x >> 17) % (uint64_t)V);
  }
  nb_tree *b = nb_tree_create(ctx);
  nb_array *a = nb_array_from_f64(ctx, NB_I32, 2, d, in), *t = nb_array_from_f64(ctx, NB_I32, 2, d, tg);
  nb_tree_set_array(b, "inputs", a);
  nb_tree_set_array(b, "targets", t);
  nb_array_release(a);
  nb_array_release(t);
  return b;
}

/* loss and "grad/params/..." of the model on params (tp: this process's part, through the hook) */
static nb_tree *loss_and_grads(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const nb_tree *b,
                               const nb_train__layout *tp) {
  nb_train__tp_hook *hook = tp ? nb_train__tp_hook_create(tp) : NULL;
  nb_model_trace_opts mo = {.dtype = NB_F64, .linear_hook = tp ? nb_train__tp_linear : NULL, .hook_ud = hook};
  nb_graph *g = nb_model_trace_loss(ctx, cfg, &mo, params, b);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params", .has_aux = true}) : NULL;
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", b);
  nb_status s = vg ? nb_graph_run(ctx, vg, in, out) : nb_ctx_status(ctx);
  CHECK_MSG(s == NB_OK, "rank %d: %s", rank, nb_ctx_error(ctx));
  nb_graph_destroy(g);
  nb_graph_destroy(vg);
  nb_tree_destroy(in);
  nb_train__tp_hook_destroy(hook);
  return out;
}

static double loss_of(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params, const nb_tree *b, const nb_train__layout *tp) {
  nb_train__tp_hook *hook = tp ? nb_train__tp_hook_create(tp) : NULL;
  nb_model_trace_opts mo = {.dtype = NB_F64, .linear_hook = tp ? nb_train__tp_linear : NULL, .hook_ud = hook};
  nb_graph *g = nb_model_trace_loss(ctx, cfg, &mo, params, b);
  nb_tree *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_merge(in, "params", params);
  nb_tree_merge(in, "batch", b);
  double v = g && !nb_graph_run(ctx, g, in, out) ? nb_array_get(nb_tree_get_array(out, "loss"), 0) : NAN;
  nb_graph_destroy(g);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_train__tp_hook_destroy(hook);
  return v;
}

/* a copy of params with element i of leaf `path` moved by h */
static nb_tree *nudged(nb_ctx *ctx, const nb_tree *params, const char *path, int64_t i, double h) {
  nb_tree *p = nb_tree_copy(params);
  nb_array *a = nb_tree_get_array(p, path), *c = nb_array_empty(ctx, NB_F64, nb_array_rank(a), nb_array_dims(a));
  memcpy(nb_array_data_mut(c), nb_array_data(a), nb_array_nbytes(a)); /* a fresh copy: the tree shares a */
  ((double *)nb_array_data_mut(c))[i] += h;
  nb_tree_set_array(p, path, c);
  nb_array_release(c);
  return p;
}

static double max_abs(const nb_array *a) {
  double m = 0;
  for (int64_t i = 0; i < nb_array_size(a); i++) m = fmax(m, fabs(nb_array_get(a, i)));
  return m;
}

static void check_model(nb_ctx *ctx, const char *name, const nb_model_config *cfg, const char *rules, int min_split) {
  nb_array *key = nb_key(ctx, 7);
  nb_tree *full = nb_model_init_dtype(ctx, cfg, key, NB_F64), *b = batch(ctx, cfg->vocab_size);
  nb_array_release(key);
  nb_train__layout L;
  layout_of(ctx, cfg, rules, full, &L);
  nb_model_config local = nb_train__tp_model(cfg, 2, L.tp_attn, L.tp_mlp);
  CHECK_MSG(L.tp_mlp && L.tp_attn == !rules[0], "%s: attention %d, MLP %d split", name, L.tp_attn, L.tp_mlp);
  nb_tree *mine = nb_train__shard(ctx, &L, "params", full, rank);
  CHECK_MSG(full && mine, "%s: %s", name, nb_ctx_error(ctx));
  nb_tree *ref = loss_and_grads(ctx, cfg, full, b, NULL), *got = loss_and_grads(ctx, &local, mine, b, &L);
  double l0 = nb_array_get(nb_tree_get_array(ref, "loss"), 0), l1 = nb_array_get(nb_tree_get_array(got, "loss"), 0);
  CHECK_MSG(fabs(l0 - l1) <= 1e-12 * fabs(l0), "%s rank %d: loss %.17g, one process %.17g", name, rank, l1, l0);
  /* the whole gradient's blocks: what each process must have */
  nb_tree *rg = nb_tree_select_prefix(ref, "grad/params", true), *want = nb_train__shard(ctx, &L, "params", rg, rank);
  int split = 0, whole = 0;
  for (size_t i = 0; want && i < nb_tree_size(want); i++) {
    const char *p = nb_tree_path(want, i);
    char gp[512];
    snprintf(gp, sizeof gp, "grad/params/%s", p);
    nb_array *w = nb_tree_leaf(want, i)->array, *g = nb_tree_get_array(got, gp);
    CHECK_MSG(g && nb_array_size(g) == nb_array_size(w), "%s: no gradient of '%s' of its shape", name, p);
    if (!g || nb_array_size(g) != nb_array_size(w)) continue;
    double tol = 1e-10 * max_abs(w) + 1e-15, err = 0; /* k's bias: a zero gradient, rounding noise of 1e-21 */
    for (int64_t k = 0; k < nb_array_size(w); k++) err = fmax(err, fabs(nb_array_get(g, k) - nb_array_get(w, k)));
    CHECK_MSG(err <= tol, "%s rank %d: gradient of '%s' off by %.3g (largest entry %.3g)", name, rank, p, err, max_abs(w));
    if (nb_train__split_dim(&L, "params", p) >= 0) split++;
    else whole++;
  }
  CHECK_MSG(split >= min_split && whole >= 5, "%s: %d split and %d whole leaves", name, split, whole);
  /* central differences of the split model's loss (every process moves its own copy) */
  const char *fd[2] = {L.tp_attn ? "layers/0/attn/wq/kernel" : "layers/0/mlp/wi/kernel", "layers/1/attn_norm/scale"};
  for (int k = 0; k < 2; k++) {
    char gp[512];
    snprintf(gp, sizeof gp, "grad/params/%s", fd[k]);
    int64_t at = 3;
    double h = 1e-5, an = nb_array_get(nb_tree_get_array(got, gp), at);
    /* a split leaf: process 0's element alone moves (process 1's is another entry of the whole kernel);
     * a whole leaf: the same element on both */
    bool moves = k == 1 || rank == 0;
    nb_tree *up = nudged(ctx, mine, fd[k], at, moves ? h : 0), *dn = nudged(ctx, mine, fd[k], at, moves ? -h : 0);
    double fdv = (loss_of(ctx, &local, up, b, &L) - loss_of(ctx, &local, dn, b, &L)) / (2 * h);
    if (moves)
      CHECK_MSG(fabs(fdv - an) <= 1e-6 * (fabs(an) + 1e-3), "%s rank %d: d loss / d %s[%lld]: %.10g, finite difference %.10g",
                name, rank, fd[k], (long long)at, an, fdv);
    nb_tree_destroy(up);
    nb_tree_destroy(dn);
  }
  nb_tree_destroy(rg);
  nb_tree_destroy(want);
  nb_tree_destroy(ref);
  nb_tree_destroy(got);
  nb_tree_destroy(full);
  nb_tree_destroy(mine);
  nb_tree_destroy(b);
  nb_train__layout_free(&L);
}

/* The checkpoint of the layout: blocks as the trainer writes them. */
static void check_ckpt(nb_ctx *ctx, nb_comm *world, const nb_model_config *cfg, const char *dir) {
  nb_array *key = nb_key(ctx, 3);
  nb_tree *full = nb_model_init(ctx, cfg, key);
  nb_array_release(key);
  nb_train__layout L;
  layout_of(ctx, cfg, "", full, &L);
  nb_tree *mine = nb_train__shard(ctx, &L, "params", full, rank);
  nb_tree *blocks = nb_tree_create(ctx), *whole = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(mine); i++) {
    const char *p = nb_tree_path(mine, i);
    nb_array *a = nb_tree_leaf(mine, i)->array;
    char wp[512];
    snprintf(wp, sizeof wp, "params/%s", p);
    nb_tree_set(whole, wp, nb_leaf_aval(nb_array_aval(nb_tree_get_array(full, p))));
    if (nb_train__split_dim(&L, "params", p) >= 0 || rank == 0) nb_tree_set_array(blocks, p, a);
  }
  nb_ckpt_manager *m = rank == 0 ? nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = dir}) : NULL;
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  if (rank == 1) m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = dir, .read_only = true});
  nb_ckpt_item items[1] = {{"params", blocks}};
  nb_ckpt_shards sh = {.comm = world, .whole = whole, .index = rank, .count = 2};
  CHECK_OK(ctx, nb_ckpt_save_sharded(m, 1, items, 1, NULL, &sh));
  nb_tree *r = nb_ckpt_restore(m, 1, NULL), *rp = r ? nb_tree_select_prefix(r, "params", true) : NULL;
  nb_tree *again = rp ? nb_train__shard(ctx, &L, "params", rp, rank) : NULL;
  CHECK_MSG(again, "rank %d: %s", rank, nb_ctx_error(ctx));
  for (size_t i = 0; again && i < nb_tree_size(full); i++) {
    const char *p = nb_tree_path(full, i);
    CHECK_MSG(nb_array_equal(nb_tree_get_array(rp, p), nb_tree_leaf(full, i)->array), "rank %d: '%s' restored whole differs",
              rank, p);
    CHECK_MSG(nb_array_equal(nb_tree_get_array(again, p), nb_tree_get_array(mine, p)), "rank %d: '%s' re-split differs", rank, p);
  }
  nb_ckpt_info *info = nb_ckpt_info_load(m, 1);
  for (size_t i = 0; info && i < nb_ckpt_info_count(info); i++) {
    const nb_ckpt_entry *e = nb_ckpt_info_entry(info, i);
    int want = nb_train__split_dim(&L, "params", e->path) >= 0 ? 2 : 1;
    CHECK_MSG(e->n_shards == want, "'%s' has %d shards, want %d", e->path, e->n_shards, want);
  }
  nb_ckpt_info_destroy(info);
  nb_ckpt_manager_destroy(m);
  nb_tree_destroy(r);
  nb_tree_destroy(rp);
  nb_tree_destroy(again);
  nb_tree_destroy(blocks);
  nb_tree_destroy(whole);
  nb_tree_destroy(full);
  nb_tree_destroy(mine);
  nb_train__layout_free(&L);
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (nb_dist_init(ctx, &argc, &argv)) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  rank = nb_dist_rank();
  nb_comm *world = nb_dist_world(ctx);
  if (!world || nb_dist_size() != 2) {
    fprintf(stderr, "needs 2 processes (tests/dist/mpirun.sh 2 ...): %s\n", nb_ctx_error(ctx));
    return 1;
  }
  CHECK_OK(ctx, nb_ctx_bind_axis(ctx, "tensor", world));
  nb_model_config gpt2, llama;
  CHECK_OK(ctx, nb_model_config_preset(ctx, "gpt2-tiny", &gpt2));
  CHECK_OK(ctx, nb_model_config_preset(ctx, "llama-tiny", &llama));
  gpt2.vocab_size = llama.vocab_size = 32;
  gpt2.d_model = llama.d_model = 16;
  gpt2.n_layers = llama.n_layers = 2;
  gpt2.d_ff = llama.d_ff = 24;
  gpt2.max_seq_len = llama.max_seq_len = 8;
  check_model(ctx, "gpt2", &gpt2, "", 10);
  check_model(ctx, "llama", &llama, "", 10);
  /* the MLP alone: 3 heads (not a multiple of 2) are fine, the attention is whole */
  nb_model_config odd = gpt2;
  odd.n_heads = odd.n_kv_heads = 3;
  odd.d_model = 18;
  check_model(ctx, "gpt2 MLP only", &odd, "[['.*/mlp/wi/kernel', [null, tensor]], ['.*/mlp/wi/bias', [tensor]], "
              "['.*/mlp/wo/kernel', [tensor]]]", 6);

  char dir[512] = {0};
  if (rank == 0) nb_test_scratch_dir(dir, sizeof dir, "dist", "tp-ckpt");
  CHECK_OK(ctx, world->ops->sendrecv(world, ctx, dir, rank == 0 ? 1 : -1, dir, rank == 1 ? 0 : -1, sizeof dir));
  check_ckpt(ctx, world, &gpt2, dir);
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  if (rank == 0) nb_test_rm_rf(dir);

  char name[64];
  snprintf(name, sizeof name, "dist/tp rank %d", rank);
  int rc = nb_test_summary(name);
  nb_ctx_bind_axis(ctx, "tensor", NULL);
  nb_dist_comm_destroy(world);
  nb_ctx_destroy(ctx);
  nb_dist_finalize();
  return rc;
}
