/* The backend seam (src/backend/backend.h): the same graphs compiled for the
 * "cpu" and the "interp" backends give the interpreter's results (the
 * interp backend bit for bit: it runs the same reference rules), and
 * everything the plan needs goes through the interface: the interp
 * backend's counters show that the fusion pass asked it which contractions
 * are library calls (it takes integer ones, the CPU backend does not), that
 * every kernel and library step ran through it, only on memory it
 * allocated, with inputs copied in and outputs out, and that all of its
 * memory is freed. Control flow (scan with xs and ys, while_loop, switch,
 * loops nested, a donated carry) runs as CONTROL steps on both: on interp
 * every iteration's kernels and library calls, the carries' copies and the
 * predicate's and index's reads go through the interface (no reference
 * fallback), with the interpreter's bits. Where a GPU is, the same graphs
 * run on "cuda" too (its buffers poisoned with NaN before the runs), within
 * float tolerance; elsewhere that part prints SKIPPED. Unknown backend names
 * are errors. */
#include "backend/backend.h"
#include "backend/interp/interp.h"
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {2718};
static const char *const backends[] = {"cpu", "interp", "cuda"};
static int nbackends = 2; /* 3 where the cuda backend has a device */

/* ---------------------------------------------------------------- graphs */

static nb_val *bcast_rows(nb_val *r, const nb_val *like) {
  int64_t dims[2] = {nb_val_dim(like, 0), nb_val_dim(like, 1)};
  int bd[1] = {0};
  return nb_broadcast_in_dim(r, 2, dims, bd);
}

/* A tiny model's loss: layer norm, a dense layer with tanh, softmax
 * cross-entropy against one-hot targets. */
static nb_status f_loss(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "params/w"), *t = nb_tree_get_val(in, "t");
  int ax[1] = {1};
  double n = (double)nb_val_dim(x, 1);
  nb_val *mean = nb_div(nb_reduce_sum(x, 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *xc = nb_sub(x, bcast_rows(mean, x));
  nb_val *var = nb_div(nb_reduce_sum(nb_mul(xc, xc), 1, ax), nb_scalar(g, NB_F32, n));
  nb_val *h = nb_div(xc, bcast_rows(nb_sqrt(nb_add(var, nb_scalar(g, NB_F32, 1e-5))), x));
  nb_val *z = nb_tanh(nb_matmul(h, w));
  nb_val *m = nb_reduce_max(z, 1, ax);
  nb_val *lse = nb_add(nb_log(nb_reduce_sum(nb_exp(nb_sub(z, bcast_rows(m, z))), 1, ax)), m);
  nb_val *nll = nb_sub(lse, nb_reduce_sum(nb_mul(z, t), 1, ax));
  int all[1] = {0};
  return nb_tree_set_val(out, "loss", nb_div(nb_reduce_sum(nll, 1, all), nb_scalar(g, NB_F32, (double)nb_val_dim(x, 0))));
}

/* A decode step: the new key written into the cache at `pos` (in place
 * when the cache is donated), then attention scores of q over it. */
static nb_status f_kv(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *cache = nb_tree_get_val(in, "cache"), *k = nb_tree_get_val(in, "k"), *q = nb_tree_get_val(in, "q");
  nb_val *start[2] = {nb_tree_get_val(in, "pos"), nb_scalar(g, NB_I32, 0)};
  nb_val *c = nb_dynamic_update_slice(cache, k, start);
  nb_val *s = nb_matmul(q, nb_transpose(c, ((int[]){1, 0})));
  nb_status st = nb_tree_set_val(out, "cache", c);
  return st ? st : nb_tree_set_val(out, "scores", nb_exp(nb_mul(s, nb_scalar(g, NB_F32, 0.25))));
}

/* An integer contraction and an elementwise op after it. */
static nb_status f_int_dot(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *a = nb_tree_get_val(in, "a"), *b = nb_tree_get_val(in, "b");
  return nb_tree_set_val(out, "y", nb_add(nb_matmul(a, b), nb_scalar(g, NB_I32, 3)));
}

/* Elementwise work and a contraction over arrays with no elements. */
static nb_status f_empty(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *w = nb_tree_get_val(in, "w");
  nb_status st = nb_tree_set_val(out, "y", nb_mul(nb_tanh(x), nb_scalar(g, NB_F32, 2)));
  return st ? st : nb_tree_set_val(out, "z", nb_exp(nb_matmul(x, w)));
}

/* Long rows and whole-array reductions (the cuda backend gives such a row
 * a block of threads): softmax along rows of 700, a column sum, a sum of
 * everything, extrema in f64 and i32, an integer sum, a bf16 sum and a
 * product. */
static nb_status f_rows(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x"), *n = nb_tree_get_val(in, "n"), *m = nb_tree_get_val(in, "m");
  int ax1[1] = {1}, ax0[1] = {0}, all[2] = {0, 1};
  nb_val *e = nb_exp(nb_sub(x, bcast_rows(nb_reduce_max(x, 1, ax1), x)));
  nb_status st = nb_tree_set_val(out, "softmax", nb_div(e, bcast_rows(nb_reduce_sum(e, 1, ax1), e)));
  if (!st) st = nb_tree_set_val(out, "colsum", nb_reduce_sum(x, 1, ax0));
  if (!st) st = nb_tree_set_val(out, "total", nb_reduce_sum(nb_mul(x, x), 2, all));
  nb_val *xd = nb_convert(x, NB_F64);
  if (!st) st = nb_tree_set_val(out, "min64", nb_reduce_min(xd, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "imax", nb_reduce_max(n, 1, ax1));
  if (!st) st = nb_tree_set_val(out, "isum", nb_reduce_sum(n, 2, all));
  if (!st) st = nb_tree_set_val(out, "bsum", nb_reduce_sum(nb_convert(x, NB_BF16), 1, ax1));
  if (!st) st = nb_tree_set_val(out, "prod", nb_reduce_prod(m, 1, ax1));
  return st;
}

/* gather and scatter_add: an embedding lookup with repeated and
 * out-of-range ids (clamped), the scatter of rows into a table (repeats
 * accumulate; out-of-range windows skipped), in f32 and i32, a gather with
 * batching dims, and a scatter of windows 3 wide along the indexed dim
 * (windows overlap: the cuda backend leaves it to the reference rule). */
static nb_status f_walk(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *t = nb_tree_get_val(in, "table"), *ids = nb_tree_get_val(in, "ids"), *rows = nb_tree_get_val(in, "rows");
  nb_val *ti = nb_tree_get_val(in, "itable"), *irows = nb_tree_get_val(in, "irows");
  nb_status st = nb_tree_set_val(out, "take", nb_take(t, ids));
  nb_scatter_dims sd = {.n_update_window = 1, .n_inserted_window = 1, .n_scatter_to_operand = 1,
                        .update_window_dims = {1}, .inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0},
                        .index_vector_dim = 1};
  int64_t idims[2] = {nb_val_dim(ids, 0), 1};
  nb_val *ix = nb_reshape(ids, 2, idims);
  if (!st) st = nb_tree_set_val(out, "scatter", nb_scatter_add(t, ix, rows, &sd));
  if (!st) st = nb_tree_set_val(out, "iscatter", nb_scatter_add(ti, ix, irows, &sd));
  /* per batch b (dim 0 of table3 and of bidx): row bidx[b] of table3[b] */
  nb_val *t3 = nb_tree_get_val(in, "table3"), *bidx = nb_tree_get_val(in, "bidx");
  nb_gather_dims gd = {.n_offset = 1, .n_collapsed = 1, .n_start_index_map = 1, .n_operand_batching = 1,
                       .offset_dims = {1}, .collapsed_slice_dims = {1}, .start_index_map = {1}, .operand_batching_dims = {0},
                       .start_indices_batching_dims = {0}, .index_vector_dim = 1};
  int64_t ss[3] = {1, 1, nb_val_dim(t3, 2)};
  int64_t bdims[2] = {nb_val_dim(bidx, 0), 1};
  if (!st) st = nb_tree_set_val(out, "batched", nb_gather(t3, nb_reshape(bidx, 2, bdims), &gd, ss));
  /* windows of 3 rows starting at ids: overlapping */
  nb_scatter_dims wd = {.n_update_window = 2, .n_scatter_to_operand = 1, .update_window_dims = {1, 2},
                        .scatter_dims_to_operand_dims = {0}, .index_vector_dim = 1};
  nb_val *wide = nb_tree_get_val(in, "wide");
  if (!st) st = nb_tree_set_val(out, "overlap", nb_scatter_add(t, ix, wide, &wd));
  return st;
}

/* ---------------------------------------------------------------- checks */

static nb_tree *loss_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){24, 40});
  nb_test_set_randn(in, &rng, "params/w", NB_F32, 2, (int64_t[]){40, 16});
  nb_array *t = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){24, 16});
  float *td = nb_array_data_mut(t);
  memset(td, 0, nb_array_nbytes(t));
  for (int i = 0; i < 24; i++) td[i * 16 + (i * 7) % 16] = 1;
  nb_tree_set_array(in, "t", t);
  nb_array_release(t);
  return in;
}

static nb_tree *kv_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "cache", NB_F32, 2, (int64_t[]){16, 8});
  nb_test_set_randn(in, &rng, "k", NB_F32, 2, (int64_t[]){1, 8});
  nb_test_set_randn(in, &rng, "q", NB_F32, 2, (int64_t[]){3, 8});
  nb_array *pos = nb_array_scalar(ctx, NB_I32, 5);
  nb_tree_set_array(in, "pos", pos);
  nb_array_release(pos);
  return in;
}

static nb_tree *int_dot_inputs(void) {
  nb_tree *in = nb_tree_create(ctx);
  nb_array *a = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){6, 5}, -20, 20);
  nb_array *b = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){5, 7}, -20, 20);
  nb_tree_set_array(in, "a", a);
  nb_tree_set_array(in, "b", b);
  nb_array_release(a);
  nb_array_release(b);
  return in;
}

static uint64_t diff(uint64_t after, uint64_t before) { return after - before; }

/* Kernel launches (library: library calls) e's runs so far made, its
 * control steps' bodies included (a body's runs count its iterations). */
static uint64_t step_runs(const nb_exe *e, bool library) {
  nb_exe_stats s;
  nb_exe_get_stats(e, &s);
  uint64_t n = (library ? s.nblas : s.nkernels) * s.runs;
  for (size_t i = 0; i < nb_exe_num_steps(e); i++)
    for (size_t k = 0; nb_exe_step_body(e, i, k); k++) n += step_runs(nb_exe_step_body(e, i, k), library);
  return n;
}

/* A copy of in whose arrays nobody else holds (a run may take a donated one). */
static nb_tree *fresh_copy(const nb_tree *in) {
  nb_tree *t = nb_tree_create(ctx);
  for (size_t i = 0; i < nb_tree_size(in); i++) {
    const nb_array *a = nb_tree_get_array(in, nb_tree_path(in, i));
    nb_array *b = nb_array_empty(ctx, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a));
    if (nb_array_nbytes(a)) memcpy(nb_array_data_mut(b), nb_array_data(a), nb_array_nbytes(a));
    nb_tree_set_array(t, nb_tree_path(in, i), b);
    nb_array_release(b);
  }
  return t;
}

static int control_steps(const nb_exe *e) {
  int n = 0;
  for (size_t i = 0; i < nb_exe_num_steps(e); i++) {
    nb_exe_step_info si;
    n += nb_exe_step(e, i, &si) == NB_OK && si.kind == NB_EXE_STEP_CONTROL;
  }
  return n;
}

/* Runs g on every backend (with everything on, and with fusion off) against
 * the interpreter; on interp, checks what its counters say went through it.
 * ncontrol: the CONTROL steps the plan must have (its loops and conds, run
 * natively, not as reference steps); copies: its loops copy a carry in. */
static void check_graph(const char *what, const nb_graph *g, const nb_tree *in, const char *const *donate, int ncontrol, bool copies) {
  static const char *const modes[] = {NULL, "fuse"};
  nb_tree *want = nb_tree_create(ctx);
  CHECK_OK(ctx, nb_graph_run(ctx, g, in, want));
  size_t out_bytes = 0;
  for (size_t i = 0; i < nb_tree_size(want); i++) out_bytes += nb_array_nbytes(nb_tree_get_array(want, nb_tree_path(want, i)));
  for (int b = 0; b < nbackends; b++)
    for (int m = 0; m < 2; m++) {
      nb_jit_opts o = nb_test_jit_opts(modes[m]);
      o.backend = backends[b];
      o.donate = donate;
      nb_interp_counters c0, c1, c2;
      nb_interp__counters(&c0);
      nb_exe *e = nb_jit(ctx, g, &o);
      CHECK_MSG(e, "%s on %s: %s", what, backends[b], nb_ctx_error(ctx));
      if (!e) continue;
      nb_interp__counters(&c1);
      nb_exe_stats s;
      nb_exe_get_stats(e, &s);
      CHECK_MSG(s.backend && !strcmp(s.backend, backends[b]), "%s: stats name backend %s", what, s.backend ? s.backend : "(null)");
      CHECK_MSG(s.native, "%s on %s runs the plan, not the interpreter fallback", what, backends[b]);
      CHECK_MSG(control_steps(e) == ncontrol, "%s on %s [off: %s]: %d control steps, not %d", what, backends[b],
                modes[m] ? modes[m] : "none", control_steps(e), ncontrol);
      uint64_t k0 = step_runs(e, false), l0 = step_runs(e, true);
      const int runs = 2;
      for (int r = 0; r < runs; r++) {
        nb_tree *got = nb_tree_create(ctx), *run_in = donate ? fresh_copy(in) : NULL;
        CHECK_OK(ctx, nb_exe_run(e, run_in ? run_in : in, got));
        nb_tree_destroy(run_in);
        for (size_t i = 0; i < nb_tree_size(want); i++) {
          const char *p = nb_tree_path(want, i);
          nb_array *x = nb_tree_get_array(got, p), *y = nb_tree_get_array(want, p);
          double d = x ? nb_test_max_rel_diff(x, y) : INFINITY;
          /* interp runs the interpreter's own rules: the same bits */
          double tol = b == 1 ? 0 : nb_test_jit_tol(nb_array_dtype(y));
          CHECK_MSG(d <= tol, "%s on %s [off: %s] run %d: '%s' differs by %g", what, backends[b], modes[m] ? modes[m] : "none",
                    r, p, d);
        }
        nb_tree_destroy(got);
      }
      nb_interp__counters(&c2);
      if (b == 1) {
        CHECK_MSG(diff(c1.compiles, c0.compiles) >= 1, "%s: nb_jit compiled through the interp backend", what); /* and each loop body */
        CHECK_MSG(diff(c1.library_asked, c0.library_asked) > 0 || s.nblas + s.neval == 0,
                  "%s: the fusion pass asked the interp backend about its contractions", what);
        uint64_t k = diff(step_runs(e, false), k0), l = diff(step_runs(e, true), l0);
        CHECK_MSG(diff(c2.launches, c1.launches) == k && k >= runs * s.nkernels, "%s: %llu launches for %llu kernel runs", what,
                  (unsigned long long)diff(c2.launches, c1.launches), (unsigned long long)k);
        CHECK_MSG(diff(c2.library_calls, c1.library_calls) == l && l >= runs * s.nblas, "%s: %llu library calls for %llu", what,
                  (unsigned long long)diff(c2.library_calls, c1.library_calls), (unsigned long long)l);
        CHECK_MSG(!copies || diff(c2.copies, c1.copies) > 0, "%s: no carry was copied through the interface", what);
        CHECK_MSG(diff(c2.bytes_to_device, c1.bytes_to_device) > 0 && (diff(c2.bytes_to_host, c1.bytes_to_host) > 0 || !out_bytes),
                  "%s: inputs copied in and outputs out", what);
        CHECK_MSG(diff(c2.foreign_pointers, c0.foreign_pointers) == 0, "%s: a step got memory the backend did not allocate", what);
      } else {
        CHECK_MSG(diff(c2.compiles, c0.compiles) == 0 && diff(c2.launches, c0.launches) == 0 &&
                      diff(c2.library_asked, c0.library_asked) == 0,
                  "%s: the %s executable went through the interp backend", what, backends[b]);
      }
      nb_exe_destroy(e);
      if (b == 1) {
        nb_interp_counters c3;
        nb_interp__counters(&c3);
        CHECK_MSG(c3.allocs - c3.frees == c0.allocs - c0.frees, "%s: the interp backend's memory was not all freed (%llu allocs, %llu frees)",
                  what, (unsigned long long)diff(c3.allocs, c0.allocs), (unsigned long long)diff(c3.frees, c0.frees));
      }
    }
  nb_tree_destroy(want);
}

static void test_graphs(void) {
  nb_tree *in = loss_inputs();
  nb_graph *g = nb_trace(ctx, f_loss, NULL, in);
  nb_graph *vg = g ? nb_value_and_grad(ctx, g, &(nb_grad_opts){.wrt = "params"}) : NULL;
  CHECK_MSG(vg, "%s", nb_ctx_error(ctx));
  if (vg) check_graph("loss and grad", vg, in, NULL, 0, false);
  nb_graph_destroy(vg);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){0, 5});
  nb_test_set_randn(in, &rng, "w", NB_F32, 2, (int64_t[]){5, 3});
  g = nb_trace(ctx, f_empty, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) check_graph("no elements", g, in, NULL, 0, false);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){3, 700});
  nb_array *ints = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){3, 700}, -1000, 1000);
  nb_tree_set_array(in, "n", ints);
  nb_array_release(ints);
  nb_array *near1 = nb_array_empty(ctx, NB_F32, 2, (int64_t[]){3, 700});
  float *nd = nb_array_data_mut(near1);
  for (int i = 0; i < 3 * 700; i++) nd[i] = 1.0f + 0.001f * (float)((i * 37) % 19 - 9);
  nb_tree_set_array(in, "m", near1);
  nb_array_release(near1);
  g = nb_trace(ctx, f_rows, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) check_graph("long rows", g, in, NULL, 0, false);
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "table", NB_F32, 2, (int64_t[]){11, 300});
  nb_test_set_randn(in, &rng, "rows", NB_F32, 2, (int64_t[]){9, 300});
  nb_test_set_randn(in, &rng, "wide", NB_F32, 3, (int64_t[]){9, 3, 300});
  nb_test_set_randn(in, &rng, "table3", NB_F32, 3, (int64_t[]){4, 6, 5});
  int32_t idv[9] = {3, 0, 10, 3, 12, -2, 7, 3, 9}, bv[4] = {5, 0, 2, 9};
  nb_array *ida = nb_array_create(ctx, NB_I32, 1, (int64_t[]){9}, idv), *ba = nb_array_create(ctx, NB_I32, 1, (int64_t[]){4}, bv);
  nb_array *ti = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){11, 300}, -50, 50);
  nb_array *ir = nb_test_randint(ctx, &rng, NB_I32, 2, (int64_t[]){9, 300}, -50, 50);
  nb_tree_set_array(in, "ids", ida);
  nb_tree_set_array(in, "bidx", ba);
  nb_tree_set_array(in, "itable", ti);
  nb_tree_set_array(in, "irows", ir);
  nb_array_release(ida);
  nb_array_release(ba);
  nb_array_release(ti);
  nb_array_release(ir);
  g = nb_trace(ctx, f_walk, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) check_graph("gather and scatter_add", g, in, NULL, 0, false);
  if (g && nbackends == 3) { /* on the device: all but the overlapping scatter */
    nb_jit_opts o = nb_test_jit_opts(NULL);
    o.backend = "cuda";
    nb_exe *e = nb_jit(ctx, g, &o);
    nb_exe_stats s = {0};
    nb_exe_get_stats(e, &s);
    CHECK_MSG(e && s.nblas == 4 && s.neval == 1, "gather and scatter_add on cuda: %zu library steps, %zu evaluated (want 4, 1)",
              s.nblas, s.neval);
    nb_exe_destroy(e);
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);

  in = kv_inputs();
  g = nb_trace(ctx, f_kv, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  static const char *const donate_cache[] = {"cache", NULL};
  if (g) check_graph("kv step", g, in, donate_cache, 0, false);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* Which contractions are library calls is the backend's answer, asked
 * through the interface: interp takes integer ones too. A fusion pass that
 * asked the CPU backend directly makes this one an eval step on interp. */
static void test_library_question(void) {
  nb_tree *in = int_dot_inputs();
  nb_graph *g = nb_trace(ctx, f_int_dot, NULL, in);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  if (g) {
    check_graph("integer dot", g, in, NULL, 0, false);
    for (int b = 0; b < nbackends; b++) {
      nb_jit_opts o = nb_test_jit_opts(NULL);
      o.backend = backends[b];
      nb_exe *e = nb_jit(ctx, g, &o);
      nb_exe_stats s = {0};
      nb_exe_get_stats(e, &s);
      CHECK_MSG(e && s.nblas == (size_t)(b == 1), "integer dot on %s: %zu library steps, %zu eval steps", backends[b], s.nblas, s.neval);
      nb_exe_destroy(e);
    }
  }
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

/* ---------------------------------------------------------------- control flow */

#define N 12

static nb_aval f32(int rank, const int64_t *dims) { return nb_aval_make(NB_F32, rank, dims); }
static nb_aval i32(void) { return nb_aval_make(NB_I32, 0, NULL); }

/* (w, h, x) -> (tanh(h w + x), h'h' - x, x): a library call in the body, a
 * carry, a y and a y passed through from the xs */
static nb_graph *rnn_body(bool with_dot) {
  nb_graph *b = nb_graph_create(ctx);
  int64_t d[1] = {N}, dw[2] = {N, N}, row[2] = {1, N};
  nb_val *w = nb_graph_input(b, "a_w", with_dot ? f32(2, dw) : f32(1, d));
  nb_val *h = nb_graph_input(b, "b_h", f32(1, d)), *x = nb_graph_input(b, "c_x", f32(1, d));
  nb_val *hw = with_dot ? nb_reshape(nb_matmul(nb_reshape(h, 2, row), w), 1, d) : nb_mul(h, w);
  nb_val *h2 = nb_tanh(nb_add(hw, x));
  nb_graph_output(b, "a_h", h2);
  nb_graph_output(b, "b_y", nb_sub(nb_mul(h2, h2), x));
  nb_graph_output(b, "c_x", x);
  return b;
}

static nb_graph *scan_graph(int64_t len, bool reverse) {
  nb_graph *body = rnn_body(true), *g = nb_graph_create(ctx);
  int64_t d[1] = {N}, dw[2] = {N, N}, dx[2] = {len, N};
  nb_val *w = nb_graph_input(g, "w", f32(2, dw)), *h = nb_graph_input(g, "h", f32(1, d)), *xs = nb_graph_input(g, "xs", f32(2, dx));
  nb_val *hout, *ys[2];
  nb_scan_opts so = {.length = len, .reverse = reverse};
  CHECK_OK(ctx, nb_scan(g, body, 1, &w, 1, &h, 1, &xs, &so, &hout, ys));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "ys", ys[0]);
  static const int ax0[1] = {0};
  nb_graph_output(g, "xsum", nb_reduce_sum(ys[1], 1, ax0)); /* the passed-through xs, read */
  nb_graph_destroy(body);
  return g;
}

/* i, v = 0, v; while i < n: i, v = i + 1, v / 2 + k */
static nb_graph *while_graph(void) {
  int64_t d[1] = {N};
  nb_graph *cond = nb_graph_create(ctx), *body = nb_graph_create(ctx), *g = nb_graph_create(ctx);
  nb_val *n = nb_graph_input(cond, "a_n", i32()), *i = nb_graph_input(cond, "b_i", i32());
  nb_graph_input(cond, "c_v", f32(1, d));
  nb_graph_output(cond, "go", nb_lt(i, n));
  nb_val *k = nb_graph_input(body, "a_k", f32(1, d)), *bi = nb_graph_input(body, "b_i", i32());
  nb_val *v = nb_graph_input(body, "c_v", f32(1, d));
  nb_graph_output(body, "a_i", nb_add(bi, nb_scalar(body, NB_I32, 1)));
  nb_graph_output(body, "b_v", nb_add(nb_mul(v, nb_scalar(body, NB_F32, 0.5)), k));
  nb_val *gn = nb_graph_input(g, "n", i32()), *gk = nb_graph_input(g, "k", f32(1, d));
  nb_val *init[2] = {nb_scalar(g, NB_I32, 0), nb_graph_input(g, "v", f32(1, d))}, *outs[2];
  CHECK_OK(ctx, nb_while_loop(g, cond, body, 1, &gn, 1, &gk, 2, init, outs));
  nb_graph_output(g, "i", outs[0]);
  nb_graph_output(g, "v", outs[1]);
  nb_graph_destroy(cond);
  nb_graph_destroy(body);
  return g;
}

/* switch(index, a + b, exp(a b), a) and -a: branch 2 passes its operand through */
static nb_graph *switch_graph(void) {
  int64_t d[2] = {5, 7};
  nb_graph *br[3], *g = nb_graph_create(ctx);
  for (int k = 0; k < 3; k++) {
    br[k] = nb_graph_create(ctx);
    nb_val *a = nb_graph_input(br[k], "a", f32(2, d)), *b = nb_graph_input(br[k], "b", f32(2, d));
    nb_graph_output(br[k], "a_y", k == 0 ? nb_add(a, b) : k == 1 ? nb_exp(nb_mul(a, b)) : a);
    nb_graph_output(br[k], "b_z", nb_neg(a));
  }
  nb_val *idx = nb_graph_input(g, "index", i32());
  nb_val *ops[2] = {nb_graph_input(g, "a", f32(2, d)), nb_graph_input(g, "b", f32(2, d))}, *outs[2];
  CHECK_OK(ctx, nb_switch(g, idx, 3, (const nb_graph *const *)br, 2, ops, outs));
  nb_graph_output(g, "y", outs[0]);
  nb_graph_output(g, "z", outs[1]);
  for (int k = 0; k < 3; k++) nb_graph_destroy(br[k]);
  return g;
}

/* a reverse scan over xs [L, M, N] whose body scans the M rows and then
 * takes a cond on the sign of the carry's sum */
static nb_graph *nested_graph(int64_t L, int64_t M) {
  int64_t d[1] = {N}, dr[2] = {M, N}, dx[3] = {L, M, N};
  nb_graph *inner = rnn_body(false), *pos = nb_graph_create(ctx), *neg = nb_graph_create(ctx), *outer = nb_graph_create(ctx);
  nb_graph_output(pos, "h", nb_mul(nb_graph_input(pos, "h", f32(1, d)), nb_scalar(pos, NB_F32, 0.5)));
  nb_graph_output(neg, "h", nb_neg(nb_graph_input(neg, "h", f32(1, d))));
  nb_val *c = nb_graph_input(outer, "a_c", f32(1, d)), *h = nb_graph_input(outer, "b_h", f32(1, d));
  nb_val *r = nb_graph_input(outer, "c_r", f32(2, dr)), *h2, *ys[2], *h3;
  nb_scan_opts so = {.length = M};
  CHECK_OK(ctx, nb_scan(outer, inner, 1, &c, 1, &h, 1, &r, &so, &h2, ys));
  static const int ax0[1] = {0};
  nb_val *p = nb_gt(nb_reduce_sum(h2, 1, ax0), nb_scalar(outer, NB_F32, 0));
  CHECK_OK(ctx, nb_cond(outer, p, pos, neg, 1, &h2, &h3));
  nb_graph_output(outer, "a_h", h3);
  nb_graph_output(outer, "b_y", nb_reduce_sum(ys[0], 1, ax0));
  nb_graph *g = nb_graph_create(ctx);
  nb_val *gc = nb_graph_input(g, "c", f32(1, d)), *gh = nb_graph_input(g, "h", f32(1, d)), *xs = nb_graph_input(g, "xs", f32(3, dx));
  nb_val *hout, *yout;
  nb_scan_opts lo = {.length = L, .reverse = true};
  CHECK_OK(ctx, nb_scan(g, outer, 1, &gc, 1, &gh, 1, &xs, &lo, &hout, &yout));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "ys", yout);
  nb_graph_destroy(inner);
  nb_graph_destroy(pos);
  nb_graph_destroy(neg);
  nb_graph_destroy(outer);
  return g;
}

static void set_i32(nb_tree *in, const char *path, int32_t v) {
  nb_array *a = nb_array_scalar(ctx, NB_I32, v);
  nb_tree_set_array(in, path, a);
  nb_array_release(a);
}

static void test_control(void) {
  static const char *const donate_h[] = {"h", NULL};
  for (int64_t len = 4; len <= 5; len++) /* even and odd: the carry ends in a different buffer */
    for (int rev = 0; rev < 2; rev++) {
      nb_graph *g = scan_graph(len, rev);
      nb_tree *in = nb_tree_create(ctx);
      nb_test_set_randn(in, &rng, "w", NB_F32, 2, (int64_t[]){N, N});
      nb_test_set_randn(in, &rng, "h", NB_F32, 1, (int64_t[]){N});
      nb_test_set_randn(in, &rng, "xs", NB_F32, 2, (int64_t[]){len, N});
      char what[64];
      snprintf(what, sizeof what, "scan len %d%s", (int)len, rev ? " reverse" : "");
      check_graph(what, g, in, NULL, 1, true);
      snprintf(what, sizeof what, "scan len %d%s, carry donated", (int)len, rev ? " reverse" : "");
      check_graph(what, g, in, donate_h, 1, false);
      nb_tree_destroy(in);
      nb_graph_destroy(g);
    }
  nb_graph *g = while_graph();
  for (int32_t n = 0; n <= 3; n += 3) {
    nb_tree *in = nb_tree_create(ctx);
    set_i32(in, "n", n);
    nb_test_set_randn(in, &rng, "k", NB_F32, 1, (int64_t[]){N});
    nb_test_set_randn(in, &rng, "v", NB_F32, 1, (int64_t[]){N});
    char what[64];
    snprintf(what, sizeof what, "while, %d trips", n);
    check_graph(what, g, in, NULL, 1, true);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(g);
  g = switch_graph();
  for (int32_t i = 1; i <= 7; i += 6) { /* 7: clamped to the last branch, which passes a through */
    nb_tree *in = nb_tree_create(ctx);
    set_i32(in, "index", i);
    nb_test_set_randn(in, &rng, "a", NB_F32, 2, (int64_t[]){5, 7});
    nb_test_set_randn(in, &rng, "b", NB_F32, 2, (int64_t[]){5, 7});
    char what[64];
    snprintf(what, sizeof what, "switch, index %d", i);
    check_graph(what, g, in, NULL, 1, i == 7);
    nb_tree_destroy(in);
  }
  nb_graph_destroy(g);
  g = nested_graph(3, 4);
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "c", NB_F32, 1, (int64_t[]){N});
  nb_test_set_randn(in, &rng, "h", NB_F32, 1, (int64_t[]){N});
  nb_test_set_randn(in, &rng, "xs", NB_F32, 3, (int64_t[]){3, 4, N});
  check_graph("scan in scan, cond in scan", g, in, NULL, 1, true);
  nb_tree_destroy(in);
  nb_graph_destroy(g);
}

static void test_names(void) {
  nb_tree *in = int_dot_inputs();
  nb_graph *g = nb_trace(ctx, f_int_dot, NULL, in);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.backend = "tpu";
  CHECK(nb_jit(ctx, g, &o) == NULL);
  char msg[200];
  snprintf(msg, sizeof msg, "unknown backend 'tpu' in nb_jit_opts.backend (known: %s)", nb_backend__names());
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, msg);
  /* $NABLA_BACKEND picks the default; the option wins over it */
  const char *old = getenv("NABLA_BACKEND");
  char *saved = old ? strdup(old) : NULL;
  setenv("NABLA_BACKEND", "nope", 1);
  o.backend = NULL;
  CHECK(nb_jit(ctx, g, &o) == NULL);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "unknown backend 'nope' in $NABLA_BACKEND");
  setenv("NABLA_BACKEND", "interp", 1);
  nb_exe *e = nb_jit(ctx, g, &o);
  nb_exe_stats s = {0};
  nb_exe_get_stats(e, &s);
  CHECK(e && s.backend && !strcmp(s.backend, "interp"));
  o.backend = "cpu";
  nb_exe *c = nb_jit(ctx, g, &o);
  CHECK_MSG(c && c != e, "one graph compiled for two backends is two executables");
  nb_exe_destroy(c);
  nb_exe_destroy(e);
  if (saved) setenv("NABLA_BACKEND", saved, 1);
  else unsetenv("NABLA_BACKEND");
  free(saved);
  nb_graph_destroy(g);
  nb_tree_destroy(in);
}

int main(void) {
  ctx = nb_ctx_create();
  setenv("NABLA_CUDA_POISON", "1", 1); /* device buffers start as NaN: an unwritten output fails */
  char why[512];
  if (nb_test_cuda_usable(ctx, why, sizeof why)) nbackends = 3;
  else printf("backend cuda: SKIPPED (%s)\n", why);
  test_graphs();
  test_library_question();
  test_control();
  test_names();
  nb_ctx_destroy(ctx);
  return nb_test_summary("backend/test_backend");
}
