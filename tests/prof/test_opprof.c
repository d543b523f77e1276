/* The op profile (<trace>.ops.json) of a small jitted program, against
 * hand-computed values: z = reduce_sum(exp(dot(x, w) + b), axis 1) with
 * x f32[8,16], params/w f32[16,4], params/b f32[4] compiles to one GEMM
 * (2*8*16*4 = 1024 FLOPs; (128 + 64 + 32) * 4 = 896 bytes) reading x and
 * params/w, and one reduction kernel add+exp+reduce_sum (32 + 32 + 32 = 96
 * FLOPs over its 8x4 loop; y 128 + b 16 + z 32 = 176 bytes) reading
 * params/b, traced where z was; run three times, each row counts 3; the
 * roofline's bound and share follow from the given peaks; the table prints
 * them; a second trace describes the executable again. */
#include <cjson/cJSON.h>

#include "jitcheck.h"
#include "testfs.h"

static int z_line;

static nb_graph *program(nb_ctx *ctx) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, (int64_t[]){8, 16}));
  nb_val *w = nb_graph_input(g, "params/w", nb_aval_make(NB_F32, 2, (int64_t[]){16, 4}));
  nb_val *b = nb_graph_input(g, "params/b", nb_aval_make(NB_F32, 1, (int64_t[]){4}));
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}};
  nb_val *y = nb_dot_general(x, w, &dn, NB_F32);
  static const int64_t yd[2] = {8, 4};
  static const int bd[1] = {1}, axis[1] = {1};
  nb_val *e = nb_exp(nb_add(y, nb_broadcast_in_dim(b, 2, yd, bd)));
  z_line = __LINE__ + 1;
  nb_graph_output(g, "z", nb_reduce_sum(e, 1, axis));
  return g;
}

static const cJSON *row_of(const cJSON *kernels, const char *cat) {
  const cJSON *k;
  cJSON_ArrayForEach(k, kernels) if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "cat")), cat)) return k;
  return NULL;
}

static double num(const cJSON *o, const char *key) { return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, key)); }

static bool has(const cJSON *arr, const char *s) {
  const cJSON *x;
  cJSON_ArrayForEach(x, arr) if (cJSON_GetStringValue(x) && !strcmp(cJSON_GetStringValue(x), s)) return true;
  return false;
}

static cJSON *load(const char *path) {
  char *text = nb_test_read_file(path, NULL);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  CHECK_MSG(j != NULL, "%s: %s", path, text ? "not JSON" : "missing");
  free(text);
  return j;
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[4096], path[4200], ops[4200];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "opprof");
  snprintf(path, sizeof path, "%s/trace.json", dir);
  snprintf(ops, sizeof ops, "%s/trace.ops.json", dir);
  nb_graph *g = program(ctx);
  CHECK_MSG(nb_graph_status(g) == NB_OK, "%s", nb_graph_error(g));
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.threads = 1;
  nb_exe *e = nb_jit(ctx, g, &o);
  CHECK_OK(ctx, e ? NB_OK : nb_ctx_status(ctx));
  nb_test_rng rng = {7};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){8, 16});
  nb_test_set_randn(in, &rng, "params/w", NB_F32, 2, (int64_t[]){16, 4});
  nb_test_set_randn(in, &rng, "params/b", NB_F32, 1, (int64_t[]){4});

  /* roofs 10 GFLOP/s and 4 GB/s: the ridge at 2.5 FLOP/byte, so the GEMM (1024/896) and the kernel (96/176) are memory bound */
  for (int session = 0; session < 2 && e; session++) {
    CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path, .peak_flops = 10e9, .peak_bytes_per_s = 4e9}));
    for (int r = 0; r < 3; r++) {
      nb_tree *out = nb_tree_create(ctx);
      CHECK_OK(ctx, nb_exe_run(e, in, out));
      nb_tree_destroy(out);
    }
    CHECK_OK(ctx, nb_prof_stop(ctx));
    cJSON *j = load(ops);
    const cJSON *ks = cJSON_GetObjectItem(j, "kernels"), *gemm = row_of(ks, "gemm"), *k = row_of(ks, "kernel");
    CHECK_MSG(cJSON_GetArraySize(ks) == 2 && gemm && k, "session %d: %d rows", session, cJSON_GetArraySize(ks));
    if (!gemm || !k) {
      cJSON_Delete(j);
      continue;
    }
    CHECK_MSG(num(gemm, "flops") == 1024 && num(gemm, "bytes") == 896 && num(gemm, "count") == 3, "gemm %g flops %g bytes x%g",
              num(gemm, "flops"), num(gemm, "bytes"), num(gemm, "count"));
    CHECK_MSG(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(gemm, "family")), "dot"), "gemm family");
    const cJSON *reads = cJSON_GetObjectItem(gemm, "reads");
    CHECK_MSG(cJSON_GetArraySize(reads) == 2 && has(reads, "x") && has(reads, "params/w"), "gemm reads %s", cJSON_PrintUnformatted(reads));
    CHECK_MSG(num(k, "flops") == 96 && num(k, "bytes") == 176 && num(k, "count") == 3, "kernel %g flops %g bytes x%g",
              num(k, "flops"), num(k, "bytes"), num(k, "count"));
    CHECK_MSG(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "ops")), "add+exp+reduce_sum"), "kernel ops %s",
              cJSON_GetStringValue(cJSON_GetObjectItem(k, "ops")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "family")), "reduction fusion"));
    reads = cJSON_GetObjectItem(k, "reads");
    CHECK_MSG(cJSON_GetArraySize(reads) == 1 && has(reads, "params/b"), "kernel reads");
    CHECK(has(cJSON_GetObjectItem(k, "writes"), "z"));
    char at[64];
    snprintf(at, sizeof at, "reduce_sum prof/test_opprof.c:%d", z_line);
    CHECK_MSG(has(cJSON_GetObjectItem(k, "source"), at), "kernel source %s, want %s",
              cJSON_PrintUnformatted(cJSON_GetObjectItem(k, "source")), at);
    /* rates and the roofline from the recorded time */
    double sec = num(k, "total_ns") * 1e-9;
    CHECK(sec > 0 && fabs(num(k, "gflops") - 3 * 96 / sec * 1e-9) <= 1e-9 * num(k, "gflops"));
    CHECK(fabs(num(k, "intensity") - 96.0 / 176) < 1e-12);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "bound")), "memory") &&
          fabs(num(k, "roof_pct") - 100 * num(k, "gbps") / 4) <= 1e-9 * num(k, "roof_pct"));
    CHECK(fabs(num(j, "floor_ns") - 3 * (896 + 176) / 4e9 * 1e9) < 1e-6);
    CHECK(num(cJSON_GetObjectItem(j, "peak"), "ridge") == 2.5);
    const cJSON *fam = cJSON_GetObjectItem(j, "families");
    CHECK_MSG(cJSON_GetArraySize(fam) == 2, "%d families", cJSON_GetArraySize(fam));
    cJSON_Delete(j);
  }
  /* the table: rows by time with the bound and the parameters read */
  char *table = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&table, &len);
  CHECK_OK(ctx, nb_prof_trace_table(ctx, path, f, 10, 0));
  fclose(f);
  CHECK_MSG(strstr(table, "roofs: 10.0 GFLOP/s, 4.0 GB/s") && strstr(table, "[x, params/w]") && strstr(table, "[params/b]") &&
                strstr(table, "memory") && strstr(table, "reduction fusion"),
            "%s", table);
  free(table);
  nb_tree_destroy(in);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(dir);
  return nb_test_summary("prof/opprof");
}
