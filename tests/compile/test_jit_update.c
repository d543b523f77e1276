/* In-place updates through nb_jit: dynamic_update_slice and scatter_add
 * write into their operand's memory when it is a donated input held once or
 * an intermediate that dies there (src/compile/buffers.c), so a KV cache
 * step touches only the new window. Checked: the output is the input's
 * memory and nothing fresh is planned; results equal the interpreter on
 * random shapes, dtypes and starts (clamped ones too), over decode-like
 * loops fed back; not in place when the input is held twice or passed as
 * another input, or when the old value is read after the update; chains of
 * updates (one buffer); readers after the update (a reduction, a BLAS dot)
 * see the new values. Every check runs with everything on, and with
 * `donate`, `reuse` and all off; $NABLA_JIT_DISABLE adds to that. */
#include "jitcheck.h"

static nb_ctx *ctx;
static nb_test_rng rng = {4242};
static const char *const donate_cache[] = {"cache", NULL};

/* Is switch `name` off, by `disable` or by $NABLA_JIT_DISABLE ("all" is
 * every switch but native)? */
static bool sw_off(const char *disable, const char *name) {
  const char *lists[2] = {disable, getenv("NABLA_JIT_DISABLE")};
  for (int k = 0; k < 2; k++) {
    const char *s = lists[k];
    size_t n = strlen(name);
    while (s && *s) {
      size_t w = strcspn(s, ",");
      if ((w == n && !strncmp(s, name, n)) || (w == 3 && !strncmp(s, "all", 3) && strcmp(name, "native"))) return true;
      s += w + (s[w] == ',');
    }
  }
  return false;
}

static const char *label(const char *disable) { return disable ? disable : "on"; }

static nb_array *copy_of(const nb_array *a) {
  nb_array *b = nb_array_empty(ctx, nb_array_dtype(a), nb_array_rank(a), nb_array_dims(a));
  if (b) memcpy(nb_array_data_mut(b), nb_array_data(a), nb_array_nbytes(a));
  return b;
}

static bool same_bytes(const nb_array *a, const nb_array *b) {
  return nb_array_nbytes(a) == nb_array_nbytes(b) && !memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a));
}

static nb_array *rand_array(nb_dtype t, int rank, const int64_t *dims) {
  if (nb_dtype_is_float(t)) return nb_test_randn(ctx, &rng, t, rank, dims);
  return nb_test_randint(ctx, &rng, t, rank, dims, nb_dtype_is_unsigned(t) ? 0 : -50, 50);
}

static void release_all(nb_array **a, size_t n) {
  for (size_t i = 0; i < n; i++) {
    nb_array_release(a[i]);
    a[i] = NULL;
  }
}

/* Runs g on `in` (held by the caller; in[donated] may be consumed) with e
 * and on copies with the interpreter; every output must match. Outputs of
 * the run stay in got[]. */
static bool run_both(nb_exe *e, const nb_graph *g, nb_array **in, nb_array **got, const char *what) {
  size_t nin = nb_graph_num_inputs(g), nout = nb_graph_num_outputs(g);
  nb_array *ref_in[16] = {NULL}, *want[16] = {NULL};
  for (size_t i = 0; i < nin; i++) ref_in[i] = copy_of(in[i]);
  bool ok = nb_graph_run_flat(ctx, g, ref_in, want) == NB_OK;
  CHECK_MSG(ok, "%s: interpreter: %s", what, nb_ctx_error(ctx));
  if (ok) {
    nb_status st = nb_exe_run_flat(e, in, got);
    CHECK_MSG(st == NB_OK, "%s: nb_exe_run_flat: %s", what, nb_ctx_error(ctx));
    ok = st == NB_OK;
    for (size_t o = 0; ok && o < nout; o++) {
      double d = nb_test_max_rel_diff(got[o], want[o]);
      CHECK_MSG(d <= nb_test_jit_tol(nb_array_dtype(want[o])), "%s: output %s differs by %g", what, nb_graph_output_path(g, o), d);
      ok = d <= nb_test_jit_tol(nb_array_dtype(want[o]));
    }
    if (!ok) release_all(got, nout);
  }
  release_all(ref_in, nin);
  release_all(want, nout);
  nb_ctx_clear_error(ctx);
  return ok;
}

static nb_exe *jit(const nb_graph *g, const char *disable, nb_exe_stats *s) {
  nb_jit_opts o = nb_test_jit_opts(disable);
  o.donate = donate_cache;
  nb_exe *e = nb_jit(ctx, g, &o);
  CHECK_MSG(e != NULL, "nb_jit (%s): %s", label(disable), nb_ctx_error(ctx));
  if (e && s) nb_exe_get_stats(e, s);
  return e;
}

/* ---------------------------------------------------------------- the KV-cache step */

/* out["cache"] = dynamic_update_slice(cache, x, (0, pos)), cache f32[4,1024],
 * x f32[4,w]: a decode loop feeds the output back; pos walks past the end
 * (clamped) and below 0. */
static void test_cache_step(const char *disable) {
  const int64_t W = 3, cd[2] = {4, 1024}, xd[2] = {4, W};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *cache = nb_graph_input(g, "cache", nb_aval_make(NB_F32, 2, cd));
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, xd));
  nb_val *pos = nb_graph_input(g, "pos", nb_aval_make(NB_I32, 0, NULL));
  nb_val *start[2] = {nb_scalar(g, NB_I32, 0), pos};
  nb_graph_output(g, "cache", nb_dynamic_update_slice(cache, x, start));
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_exe_stats s;
  nb_exe *e = jit(g, disable, &s);
  if (!e) return nb_graph_destroy(g);
  bool donate = !sw_off(disable, "donate");
  CHECK_MSG(s.neval == 1 && s.nkernels == 0, "(%s) %zu evals, %zu kernels", label(disable), s.neval, s.nkernels);
  /* no fresh output planned: the peak is the arena alone */
  CHECK_MSG(!donate || s.peak_bytes == s.arena_bytes, "(%s) peak %zu, arena %zu: the output is not the donated cache", label(disable),
            s.peak_bytes, s.arena_bytes);
  CHECK_MSG(donate || s.peak_bytes == s.arena_bytes + (size_t)(4 * 1024 * 4), "(%s) peak %zu", label(disable), s.peak_bytes);
  nb_exe_step_info si;
  CHECK_OK(ctx, nb_exe_step(e, 0, &si));
  CHECK_MSG(!donate || si.bytes < 4096, "(%s) the in-place step is modelled as %g bytes", label(disable), si.bytes);
  nb_array *in[3] = {rand_array(NB_F32, 2, cd), NULL, NULL}, *out[1] = {NULL};
  const int positions[] = {0, 1, 7, 1020, 1021, 1022, 5000, -3, 512};
  for (size_t k = 0; k < sizeof positions / sizeof *positions; k++) {
    in[1] = rand_array(NB_F32, 2, xd);
    in[2] = nb_array_scalar(ctx, NB_I32, positions[k]);
    const void *before = nb_array_data(in[0]);
    char what[96];
    snprintf(what, sizeof what, "cache step (%s) pos %d", label(disable), positions[k]);
    if (!run_both(e, g, in, out, what)) break;
    CHECK_MSG((nb_array_data(out[0]) == before) == donate, "%s: output %s the input's memory", what, donate ? "is not" : "is");
    nb_array_release(in[0]);
    nb_array_release(in[1]);
    nb_array_release(in[2]);
    in[0] = out[0]; /* fed back, held once */
    out[0] = in[1] = in[2] = NULL;
  }
  nb_array_release(in[0]);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
}

/* The caller still holds the cache (refcount 2), or passes the same array
 * again as another input: a fresh output, the input unchanged. */
static void test_shared(const char *disable) {
  const int64_t cd[2] = {8, 64}, xd[2] = {2, 5};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *cache = nb_graph_input(g, "cache", nb_aval_make(NB_F32, 2, cd));
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, xd));
  nb_val *other = nb_graph_input(g, "other", nb_aval_make(NB_F32, 2, cd));
  nb_val *pos = nb_graph_input(g, "pos", nb_aval_make(NB_I32, 0, NULL));
  nb_val *start[2] = {pos, pos};
  nb_val *y = nb_dynamic_update_slice(cache, x, start);
  static const int axes[1] = {1};
  nb_graph_output(g, "cache", y);
  nb_graph_output(g, "r", nb_reduce_sum(nb_mul(y, other), 1, axes)); /* other read after the update */
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_exe *e = jit(g, disable, NULL);
  if (!e) return nb_graph_destroy(g);
  nb_array *cache_a = rand_array(NB_F32, 2, cd), *keep = copy_of(cache_a), *out[2] = {NULL, NULL};
  nb_array *in[4] = {cache_a, rand_array(NB_F32, 2, xd), rand_array(NB_F32, 2, cd), nb_array_scalar(ctx, NB_I32, 3)};
  nb_array_retain(cache_a); /* held twice */
  if (run_both(e, g, in, out, "shared: held twice")) {
    CHECK_MSG(nb_array_data(out[0]) != nb_array_data(cache_a), "(%s) wrote into a cache held twice", label(disable));
    CHECK_MSG(same_bytes(cache_a, keep), "(%s) the cache held twice changed", label(disable));
  }
  release_all(out, 2);
  nb_array_release(cache_a); /* held once again, but also passed as "other" */
  nb_array_release(in[2]);
  in[2] = cache_a;
  if (run_both(e, g, in, out, "shared: passed twice")) {
    CHECK_MSG(nb_array_data(out[0]) != nb_array_data(cache_a), "(%s) wrote into a cache also passed as another input", label(disable));
    CHECK_MSG(same_bytes(cache_a, keep), "(%s) the cache passed twice changed", label(disable));
  }
  release_all(out, 2);
  nb_array_release(in[0]);
  nb_array_release(in[1]);
  nb_array_release(in[3]);
  nb_array_release(keep);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
}

/* The old value is read after the update (an elementwise kernel, a
 * dynamic_slice, or as another output): it must still be the old one. */
static void test_read_old_after(const char *disable) {
  const int64_t cd[2] = {6, 40}, xd[2] = {6, 4}, wd[2] = {6, 8};
  for (int variant = 0; variant < 3; variant++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *cache = nb_graph_input(g, "cache", nb_aval_make(NB_F32, 2, cd));
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, xd));
    nb_val *pos = nb_graph_input(g, "pos", nb_aval_make(NB_I32, 0, NULL));
    nb_val *start[2] = {nb_scalar(g, NB_I32, 0), pos};
    nb_val *y = nb_dynamic_update_slice(cache, x, start);
    nb_graph_output(g, "cache", y);
    if (variant == 0) nb_graph_output(g, "mix", nb_sub(y, cache));
    if (variant == 1) nb_graph_output(g, "old", nb_dynamic_slice(cache, start, wd));
    if (variant == 2) nb_graph_output(g, "same", cache);
    CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
    nb_exe *e = jit(g, disable, NULL);
    if (!e) {
      nb_graph_destroy(g);
      continue;
    }
    nb_array *in[3] = {rand_array(NB_F32, 2, cd), rand_array(NB_F32, 2, xd), nb_array_scalar(ctx, NB_I32, 30)};
    nb_array *out[2] = {NULL, NULL}, *keep = copy_of(in[0]);
    char what[64];
    snprintf(what, sizeof what, "old value read after (%s), variant %d", label(disable), variant);
    /* the values say whether the read saw the old value; and unless an
     * output took the donated input's memory (the update when the read was
     * scheduled before it, or `mix`, a kernel reading the input only at the
     * element it writes), the input is untouched */
    if (run_both(e, g, in, out, what) && nb_array_data(out[0]) != nb_array_data(in[0]) && nb_array_data(out[1]) != nb_array_data(in[0]))
      CHECK_MSG(same_bytes(in[0], keep), "%s: the input changed", what);
    release_all(out, 2);
    release_all(in, 3);
    nb_array_release(keep);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
}

/* ---------------------------------------------------------------- chains and readers */

static nb_val *rows_scatter(nb_val *operand, nb_val *idx, nb_val *upd) {
  nb_scatter_dims dn = {.n_update_window = 1, .n_inserted_window = 1, .n_scatter_to_operand = 1,
                        .update_window_dims = {1}, .inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0},
                        .index_vector_dim = 1};
  return nb_scatter_add(operand, idx, upd, &dn);
}

/* cache -> dus -> dus -> scatter_add -> output: one buffer, the input's. */
static void test_chain(const char *disable) {
  const int64_t cd[2] = {16, 32}, ad[2] = {3, 7}, bd[2] = {16, 2}, id[2] = {4, 1}, ud[2] = {4, 32};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *cache = nb_graph_input(g, "cache", nb_aval_make(NB_F32, 2, cd));
  nb_val *a = nb_graph_input(g, "a", nb_aval_make(NB_F32, 2, ad));
  nb_val *b = nb_graph_input(g, "b", nb_aval_make(NB_F32, 2, bd));
  nb_val *idx = nb_graph_input(g, "idx", nb_aval_make(NB_I32, 2, id));
  nb_val *upd = nb_graph_input(g, "upd", nb_aval_make(NB_F32, 2, ud));
  nb_val *p = nb_graph_input(g, "p", nb_aval_make(NB_I32, 0, NULL));
  nb_val *q = nb_graph_input(g, "q", nb_aval_make(NB_I32, 0, NULL));
  nb_val *s1[2] = {p, q}, *s2[2] = {nb_scalar(g, NB_I32, 0), p};
  nb_val *c = nb_dynamic_update_slice(cache, a, s1);
  c = nb_dynamic_update_slice(c, b, s2);
  c = rows_scatter(c, idx, upd);
  nb_graph_output(g, "cache", c);
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_exe_stats s;
  nb_exe *e = jit(g, disable, &s);
  if (!e) return nb_graph_destroy(g);
  bool donate = !sw_off(disable, "donate"), reuse = !sw_off(disable, "reuse");
  CHECK_MSG(s.neval == 3, "(%s) %zu evals", label(disable), s.neval);
  CHECK_MSG(!reuse || s.arena_bytes == 0, "(%s) arena %zu bytes: a chain member got its own buffer", label(disable), s.arena_bytes);
  CHECK_MSG(!(donate && reuse) || s.peak_bytes == 0, "(%s) peak %zu bytes", label(disable), s.peak_bytes);
  for (int it = 0; it < 6; it++) {
    /* windows overlap, starts clamp, some scatter rows fall outside (skipped) or repeat */
    nb_array *in[7] = {rand_array(NB_F32, 2, cd), rand_array(NB_F32, 2, ad), rand_array(NB_F32, 2, bd),
                       nb_test_randint(ctx, &rng, NB_I32, 2, id, -2, 17), rand_array(NB_F32, 2, ud),
                       nb_array_scalar(ctx, NB_I32, (double)nb_test_int(&rng, -4, 40)),
                       nb_array_scalar(ctx, NB_I32, (double)nb_test_int(&rng, -4, 40))};
    nb_array *out[1] = {NULL}, *keep = copy_of(in[0]);
    const void *before = nb_array_data(in[0]);
    bool held_twice = it == 5; /* then the first update copies into a fresh output */
    if (held_twice) nb_array_retain(in[0]);
    char what[64];
    snprintf(what, sizeof what, "chain (%s) #%d", label(disable), it);
    if (run_both(e, g, in, out, what)) { /* reuse off: the output still takes the input, after copies */
      bool want = donate && !held_twice;
      CHECK_MSG((nb_array_data(out[0]) == before) == want, "%s: output %s the input's memory", what, want ? "is not" : "is");
      CHECK_MSG(want || same_bytes(in[0], keep), "%s: the input changed", what);
    }
    if (held_twice) nb_array_release(in[0]);
    nb_array_release(keep);
    release_all(out, 1);
    release_all(in, 7);
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
}

/* Chains through intermediates: t = x*2 updated twice, then read by a
 * kernel (the chain ends in the arena), or then the output (the chain lives
 * in the output). */
static void test_temp_chain(const char *disable) {
  const int64_t xd[2] = {32, 64}, ud[2] = {5, 64};
  for (int to_output = 0; to_output < 2; to_output++) {
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, xd));
    nb_val *u = nb_graph_input(g, "u", nb_aval_make(NB_F32, 2, ud));
    nb_val *p = nb_graph_input(g, "p", nb_aval_make(NB_I32, 0, NULL));
    nb_val *z = nb_scalar(g, NB_I32, 0), *s1[2] = {p, z}, *s2[2] = {nb_add(p, nb_scalar(g, NB_I32, 9)), z};
    nb_val *t = nb_mul(x, nb_full_like(x, 2.0));
    t = nb_dynamic_update_slice(t, u, s1);
    t = nb_dynamic_update_slice(t, nb_neg(u), s2);
    nb_graph_output(g, "y", to_output ? t : nb_add(t, nb_full_like(t, 1.0)));
    CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
    nb_exe_stats s;
    nb_exe *e = jit(g, disable, &s);
    if (!e) {
      nb_graph_destroy(g);
      continue;
    }
    size_t full = 32 * 64 * 4;
    bool reuse = !sw_off(disable, "reuse"), fuse = !sw_off(disable, "fuse");
    /* on: one arena buffer for t and its updates (plus u's negation), or none when they live in y */
    if (reuse && fuse)
      CHECK_MSG(to_output ? s.arena_bytes < full : s.arena_bytes < 2 * full, "(%s) %s: arena %zu bytes", label(disable),
                to_output ? "to output" : "to arena", s.arena_bytes);
    for (int it = 0; it < 4; it++) {
      nb_array *in[3] = {rand_array(NB_F32, 2, xd), rand_array(NB_F32, 2, ud), nb_array_scalar(ctx, NB_I32, (double)nb_test_int(&rng, -3, 35))};
      nb_array *out[1] = {NULL};
      char what[64];
      snprintf(what, sizeof what, "temp chain (%s) to %s #%d", label(disable), to_output ? "output" : "arena", it);
      run_both(e, g, in, out, what);
      release_all(out, 1);
      release_all(in, 3);
    }
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
}

/* One attention layer's cache use: k, v updated at pos, then read by a
 * BLAS dot (scores), a softmax and a second dot, and by a reduction: the
 * readers must see the new entries. */
static void test_attention_reads(const char *disable) {
  const int64_t B = 1, H = 2, S = 16, D = 8;
  const int64_t cd[4] = {B, H, S, D}, kd[4] = {B, H, 1, D}, qd[4] = {B, H, 1, D};
  nb_graph *g = nb_graph_create(ctx);
  nb_val *ck = nb_graph_input(g, "cache/k", nb_aval_make(NB_F32, 4, cd));
  nb_val *cv = nb_graph_input(g, "cache/v", nb_aval_make(NB_F32, 4, cd));
  nb_val *q = nb_graph_input(g, "q", nb_aval_make(NB_F32, 4, qd));
  nb_val *k = nb_graph_input(g, "k", nb_aval_make(NB_F32, 4, kd));
  nb_val *v = nb_graph_input(g, "v", nb_aval_make(NB_F32, 4, kd));
  nb_val *pos = nb_graph_input(g, "pos", nb_aval_make(NB_I32, 0, NULL));
  nb_val *z = nb_scalar(g, NB_I32, 0), *start[4] = {z, z, pos, z};
  nb_val *nk = nb_dynamic_update_slice(ck, k, start), *nv = nb_dynamic_update_slice(cv, v, start);
  nb_dot_dims qk = {.n_contract = 1, .n_batch = 2, .lhs_contract = {3}, .rhs_contract = {3}, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}};
  nb_val *scores = nb_dot_general(q, nk, &qk, NB_DTYPE_COUNT); /* [B,H,1,S] */
  nb_val *probs = nb_nn_softmax(scores, -1);
  nb_dot_dims pv = {.n_contract = 1, .n_batch = 2, .lhs_contract = {3}, .rhs_contract = {2}, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}};
  static const int axes[2] = {2, 3};
  nb_graph_output(g, "cache/k", nk);
  nb_graph_output(g, "cache/v", nv);
  nb_graph_output(g, "o", nb_dot_general(probs, nv, &pv, NB_DTYPE_COUNT));
  nb_graph_output(g, "ksum", nb_reduce_sum(nk, 2, axes));
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_exe_stats s;
  nb_exe *e = jit(g, disable, &s);
  if (!e) return nb_graph_destroy(g);
  bool donate = !sw_off(disable, "donate");
  CHECK_MSG(!donate || s.peak_bytes - s.arena_bytes < (size_t)(B * H * S * D * 4), "(%s) peak %zu arena %zu: the caches are copied",
            label(disable), s.peak_bytes, s.arena_bytes);
  nb_array *in[6] = {rand_array(NB_F32, 4, cd), rand_array(NB_F32, 4, cd), NULL, NULL, NULL, NULL}, *out[4] = {NULL};
  for (int step = 0; step < 5; step++) {
    in[2] = rand_array(NB_F32, 4, qd);
    in[3] = rand_array(NB_F32, 4, kd);
    in[4] = rand_array(NB_F32, 4, kd);
    in[5] = nb_array_scalar(ctx, NB_I32, step == 4 ? 99 : 3 * step);
    const void *bk = nb_array_data(in[0]), *bv = nb_array_data(in[1]);
    char what[64];
    snprintf(what, sizeof what, "attention (%s) step %d", label(disable), step);
    if (!run_both(e, g, in, out, what)) break;
    CHECK_MSG((nb_array_data(out[0]) == bk && nb_array_data(out[1]) == bv) == donate, "%s: caches %s in place", what,
              donate ? "not" : "wrongly");
    for (int i = 0; i < 6; i++) nb_array_release(in[i]);
    in[0] = out[0];
    in[1] = out[1];
    nb_array_release(out[2]);
    nb_array_release(out[3]);
    for (int i = 0; i < 4; i++) out[i] = NULL;
  }
  nb_array_release(in[0]);
  nb_array_release(in[1]);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
}

/* ---------------------------------------------------------------- random */

/* Random ranks, shapes, dtypes, update extents and starts (beyond both
 * ends), optionally a second update and a reader of the new value. */
static void test_random(const char *disable) {
  static const nb_dtype types[] = {NB_F32, NB_F64, NB_BF16, NB_I32, NB_U8, NB_I64};
  bool donate = !sw_off(disable, "donate");
  for (int it = 0; it < 24; it++) {
    int r = (int)nb_test_int(&rng, 1, 4);
    nb_dtype t = types[nb_test_int(&rng, 0, 5)];
    int64_t xd[NB_MAX_RANK], ud[NB_MAX_RANK];
    for (int d = 0; d < r; d++) {
      xd[d] = nb_test_int(&rng, 1, 9);
      ud[d] = nb_test_int(&rng, 0, xd[d]);
    }
    bool twice = nb_test_int(&rng, 0, 1), reader = nb_test_int(&rng, 0, 1);
    nb_graph *g = nb_graph_create(ctx);
    nb_val *x = nb_graph_input(g, "cache", nb_aval_make(t, r, xd));
    nb_val *u = nb_graph_input(g, "u", nb_aval_make(t, r, ud));
    nb_val *st = nb_graph_input(g, "starts", nb_aval_make(NB_I32, 1, (int64_t[1]){r}));
    nb_val *s1[NB_MAX_RANK], *s2[NB_MAX_RANK];
    for (int d = 0; d < r; d++) {
      s1[d] = nb_reshape(nb_slice(st, (int64_t[1]){d}, (int64_t[1]){d + 1}, NULL), 0, NULL);
      s2[d] = nb_sub(nb_scalar(g, NB_I32, (double)(xd[d] - 1)), s1[d]);
    }
    nb_val *y = nb_dynamic_update_slice(x, u, s1);
    if (twice) y = nb_dynamic_update_slice(y, nb_neg(u), s2);
    nb_graph_output(g, "cache", y);
    if (reader) nb_graph_output(g, "r", nb_reduce_sum(nb_convert(y, NB_F64), 0, NULL));
    CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
    nb_exe *e = jit(g, disable, NULL);
    if (!e) {
      nb_graph_destroy(g);
      continue;
    }
    int32_t sv[NB_MAX_RANK];
    for (int d = 0; d < r; d++) sv[d] = (int32_t)nb_test_int(&rng, -3, xd[d] + 3);
    nb_array *in[3] = {rand_array(t, r, xd), rand_array(t, r, ud), nb_array_create(ctx, NB_I32, 1, (int64_t[1]){r}, sv)};
    nb_array *out[2] = {NULL, NULL};
    const void *before = nb_array_data(in[0]);
    bool whole = true; /* an update of the whole operand is the update itself: no step */
    for (int d = 0; d < r; d++) whole = whole && ud[d] == xd[d];
    bool empty = nb_array_nbytes(in[0]) == 0;
    char what[96];
    snprintf(what, sizeof what, "random #%d (%s) %s rank %d%s%s", it, label(disable), nb_dtype_name(t), r, twice ? " twice" : "",
             reader ? " read" : "");
    if (run_both(e, g, in, out, what) && !whole && !empty) {
      bool want = donate; /* reuse off: the output still takes the input, after a copy */
      CHECK_MSG((nb_array_data(out[0]) == before) == want, "%s: output %s the input's memory", what, want ? "is not" : "is");
    }
    release_all(out, 2);
    release_all(in, 3);
    nb_exe_destroy(e);
    nb_graph_destroy(g);
  }
}

int main(void) {
  ctx = nb_ctx_create();
  const char *modes[] = {NULL, "donate", "reuse", "all"};
  for (int m = 0; m < 4; m++) {
    test_cache_step(modes[m]);
    test_shared(modes[m]);
    test_read_old_after(modes[m]);
    test_chain(modes[m]);
    test_temp_chain(modes[m]);
    test_attention_reads(modes[m]);
    test_random(modes[m]);
  }
  nb_ctx_destroy(ctx);
  return nb_test_summary("compile/test_jit_update");
}
