/* The memory viewer and the graph viewer on programs small enough to work
 * out by hand: y = tanh(x @ w) @ v runs as a GEMM, a tanh kernel and a
 * GEMM, and at the tanh step x, w, v, y (held for the run) and both
 * intermediates are live: the peak, its step, the live set, the arena
 * offsets and each buffer's name (input paths, the equation) are checked
 * against numbers computed here; a donated update counts its memory once,
 * as the input; a scan's step adds its body's arena; the graph is one node
 * per step and parses as XML; a trace
 * keeps every executable that ran and writes both viewers beside it. */
#include <cjson/cJSON.h>

#include "primcheck.h"
#include "test.h"
#include "testfs.h"

static nb_ctx *ctx;
static char work[512];

static nb_aval f32(int64_t a, int64_t b) { return nb_aval_make(NB_F32, 2, (int64_t[]){a, b}); }

static char *render(nb_status (*fn)(nb_ctx *, const nb_exe *, FILE *), const nb_exe *e) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  CHECK_OK(ctx, fn(ctx, e, f));
  fclose(f);
  return buf;
}

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(item(o, k)); }
static const char *str(const cJSON *o, const char *k) {
  const char *s = cJSON_GetStringValue(item(o, k));
  return s ? s : "";
}

/* the buffer named name (exactly) */
static const cJSON *buffer(const cJSON *exe, const char *name) {
  const cJSON *b;
  cJSON_ArrayForEach(b, item(exe, "buffers")) if (!strcmp(str(b, "name"), name)) return b;
  return NULL;
}

static bool live_at_peak(const cJSON *exe, const char *name, double bytes) {
  const cJSON *b;
  cJSON_ArrayForEach(b, item(exe, "live_at_peak")) if (!strcmp(str(b, "name"), name)) return num(b, "bytes") == bytes;
  return false;
}

/* python3's XML parser reads the SVG and counts its nodes (class "step") */
static void check_svg(const char *svg, int steps) {
  char path[700], cmd[1600], out[256];
  snprintf(path, sizeof path, "%s/graph.svg", work);
  FILE *f = fopen(path, "w");
  CHECK(f && fputs(svg, f) >= 0);
  if (f) fclose(f);
  const char *py = getenv("NABLA_PYTHON") ? getenv("NABLA_PYTHON") : "python3";
  snprintf(cmd, sizeof cmd,
           "%s -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); "
           "print(sum(1 for g in r.iter(\"{http://www.w3.org/2000/svg}g\") if g.get(\"class\") == \"step\"))' %s 2>&1",
           py, path);
  int rc = nb_test_run(cmd, out, sizeof out);
  CHECK_MSG(rc == 0 && atoi(out) == steps, "rc %d, nodes '%s', want %d", rc, out, steps);
}

/* y = tanh(x @ w) @ v */
static nb_exe *mlp(void) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", f32(8, 16)), *w = nb_graph_input(g, "params/w", f32(16, 32));
  nb_val *v = nb_graph_input(g, "params/v", f32(32, 4));
  nb_graph_output(g, "y", nb_matmul(nb_tanh(nb_matmul(x, w)), v));
  nb_exe *e = nb_jit(ctx, g, NULL);
  nb_graph_destroy(g);
  return e;
}

static void hand_computed(void) {
  nb_exe *e = mlp();
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  if (!e) return;
  CHECK_MSG(nb_exe_num_steps(e) == 3, "%zu steps (want gemm, tanh, gemm)", nb_exe_num_steps(e));
  char *text = render(nb_prof_memory_json, e);
  cJSON *j = cJSON_Parse(text);
  const cJSON *x = cJSON_GetArrayItem(item(j, "executables"), 0);
  CHECK_MSG(x && !strcmp(str(j, "format"), "nabla-memory/1"), "%s", text);
  /* held for the run: x 8x16, w 16x32, v 32x4 and y 8x4 floats; a = x@w and b = tanh(a) are 8x32 */
  const double held = 4 * (8 * 16 + 16 * 32 + 32 * 4 + 8 * 4), a = 4 * 8 * 32;
  CHECK_MSG(num(x, "held_bytes") == held, "held %g, want %g", num(x, "held_bytes"), held);
  const cJSON *peak = item(x, "peak"), *live = item(x, "live_bytes");
  CHECK_MSG(num(peak, "bytes") == held + 2 * a && num(peak, "step") == 1, "peak %g at %g, want %g at 1", num(peak, "bytes"),
            num(peak, "step"), held + 2 * a);
  CHECK_MSG(!strncmp(str(peak, "step_name"), "k", 1) && strstr(str(peak, "step_name"), "tanh"), "peak step '%s'",
            str(peak, "step_name"));
  CHECK(cJSON_GetArraySize(live) == 3 && cJSON_GetArrayItem(live, 0)->valuedouble == held + a &&
        cJSON_GetArrayItem(live, 2)->valuedouble == held + a);
  CHECK_MSG(cJSON_GetArraySize(item(x, "live_at_peak")) == 6, "%d live at the peak", cJSON_GetArraySize(item(x, "live_at_peak")));
  CHECK(live_at_peak(x, "x", 512) && live_at_peak(x, "params/w", 2048) && live_at_peak(x, "params/v", 512) && live_at_peak(x, "y", 128));
  /* the intermediates: named by their equation and where it was traced, a in [0, 1] at offset 0, b in [1, 2] above it */
  const cJSON *ba = NULL, *bb = NULL, *b;
  cJSON_ArrayForEach(b, item(x, "buffers")) {
    if (strcmp(str(b, "kind"), "temp")) continue;
    if (!strcmp(str(b, "op"), "dot_general")) ba = b;
    if (!strcmp(str(b, "op"), "tanh")) bb = b;
  }
  CHECK_MSG(ba && bb, "%s", text);
  if (ba && bb) {
    CHECK(num(ba, "bytes") == a && num(ba, "first") == 0 && num(ba, "last") == 1 && num(ba, "offset") == 0);
    CHECK(num(bb, "bytes") == a && num(bb, "first") == 1 && num(bb, "last") == 2 && num(bb, "offset") == a);
    CHECK_MSG(strstr(str(ba, "name"), "dot_general f32[8,32] at prof/test_memory.c:"), "name '%s'", str(ba, "name"));
    CHECK_MSG(strstr(str(bb, "at"), "test_memory.c:"), "at '%s'", str(bb, "at"));
    CHECK(live_at_peak(x, str(ba, "name"), a) && live_at_peak(x, str(bb, "name"), a));
  }
  CHECK(num(x, "arena_bytes") == 2 * a);
  const cJSON *w = buffer(x, "params/w");
  CHECK(w && !strcmp(str(w, "kind"), "input") && num(w, "first") == 0 && num(w, "last") == 2 && cJSON_IsNull(item(w, "offset")));
  /* grouped by source: the inputs under their first path component */
  bool params = false;
  cJSON_ArrayForEach(b, item(x, "peak_by_source")) params |= !strcmp(str(b, "source"), "input params") && num(b, "bytes") == 2560;
  CHECK_MSG(params, "no 'input params' of 2560 bytes in peak_by_source");
  cJSON_Delete(j);
  free(text);

  text = render(nb_prof_graph_svg, e);
  check_svg(text, 3);
  CHECK(strstr(text, "f32[8,32] 1.0 KiB")); /* the edges a and b */
  free(text);
  text = render(nb_prof_memory_html, e);
  CHECK(!strncmp(text, "<section class=\"nb-memory\">", 27) && strstr(text, "class=\"peak\"") && strstr(text, "params/w"));
  free(text);
  text = render(nb_prof_graph_html, e);
  CHECK(!strncmp(text, "<section class=\"nb-graph\">", 26) && strstr(text, "<svg") && !strstr(text, "<?xml"));
  free(text);
  nb_exe_destroy(e);
}

/* w' = 2 w, donated: the output takes w's memory, counted once */
static void donated(void) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(g, "params/w", f32(64, 64));
  nb_graph_output(g, "params/w", nb_add(w, w));
  const char *donate[] = {"params", NULL};
  nb_exe *e = nb_jit(ctx, g, &(nb_jit_opts){.donate = donate});
  nb_graph_destroy(g);
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  if (!e) return;
  char *text = render(nb_prof_memory_json, e);
  cJSON *j = cJSON_Parse(text);
  const cJSON *x = cJSON_GetArrayItem(item(j, "executables"), 0), *b = buffer(x, "params/w");
  CHECK_MSG(cJSON_GetArraySize(item(x, "buffers")) == 1 && b && !strcmp(str(b, "donated_to"), "params/w"), "%s", text);
  CHECK(num(item(x, "peak"), "bytes") == 64 * 64 * 4);
  cJSON_Delete(j);
  free(text);
  nb_exe_destroy(e);
}

/* a scan: its step adds its body's arena while it runs */
static void control_body(void) {
  nb_graph *body = nb_graph_create(ctx);
  nb_val *w = nb_graph_input(body, "a_w", f32(16, 16)), *h = nb_graph_input(body, "b_h", f32(1, 16));
  nb_val *x = nb_graph_input(body, "c_x", f32(1, 16));
  nb_val *h2 = nb_tanh(nb_add(nb_matmul(h, w), x));
  nb_graph_output(body, "a_h", h2);
  nb_graph_output(body, "b_y", nb_mul(h2, h2));
  nb_graph *g = nb_graph_create(ctx);
  nb_val *gw = nb_graph_input(g, "w", f32(16, 16)), *gh = nb_graph_input(g, "h", f32(1, 16));
  nb_val *xs = nb_graph_input(g, "xs", nb_aval_make(NB_F32, 3, (int64_t[]){5, 1, 16})), *hout, *ys;
  CHECK_OK(ctx, nb_scan(g, body, 1, &gw, 1, &gh, 1, &xs, &(nb_scan_opts){.length = 5}, &hout, &ys));
  nb_graph_output(g, "h", hout);
  nb_graph_output(g, "ys", ys);
  nb_exe *e = nb_jit(ctx, g, NULL);
  nb_graph_destroy(body);
  nb_graph_destroy(g);
  CHECK_MSG(e, "%s", nb_ctx_error(ctx));
  if (!e) return;
  size_t scan_step = 0, bodies = 0;
  nb_exe_stats st = {0};
  for (size_t s = 0; s < nb_exe_num_steps(e); s++)
    if (nb_exe_step_body(e, s, 0)) scan_step = s, bodies++, nb_exe_get_stats(nb_exe_step_body(e, s, 0), &st);
  CHECK_MSG(bodies == 1 && st.arena_bytes > 0, "%zu control steps, body arena %zu", bodies, st.arena_bytes);
  char *text = render(nb_prof_memory_json, e);
  cJSON *j = cJSON_Parse(text);
  const cJSON *x0 = cJSON_GetArrayItem(item(j, "executables"), 0), *b;
  size_t found = 0;
  cJSON_ArrayForEach(b, item(x0, "buffers")) if (!strcmp(str(b, "kind"), "body")) {
    found++;
    CHECK_MSG(num(b, "bytes") == (double)st.arena_bytes && num(b, "first") == (double)scan_step && num(b, "last") == (double)scan_step &&
                  strstr(str(b, "name"), "scan"),
              "%s", cJSON_PrintUnformatted(b));
  }
  CHECK_MSG(found == 1, "%zu body blocks in %s", found, text);
  cJSON_Delete(j);
  free(text);
  nb_exe_destroy(e);
}

static void errors(void) {
  CHECK(nb_prof_memory_json(ctx, NULL, stdout) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "nb_prof_memory_json: exe is NULL");
  nb_exe_buffer_info info;
  nb_exe *e = mlp();
  CHECK(e && nb_exe_buffer(e, 1u << 30, &info) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "nb_exe_buffer: value 1073741824 out of range");
  CHECK(nb_exe_step_operands(e, 99, NULL, 0) == 0 && nb_exe_step_ops(e, 99, NULL) == NULL);
  nb_exe_destroy(e);
}

/* a trace keeps what ran and writes the viewers beside it */
static void traced(void) {
  nb_exe *e = mlp();
  if (!e) return;
  nb_test_rng rng = {5};
  nb_array *in[3] = {nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){8, 16}), nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){16, 32}),
                     nb_test_randn(ctx, &rng, NB_F32, 2, (int64_t[]){32, 4})};
  nb_array *out[1] = {NULL};
  CHECK_OK(ctx, nb_exe_run_flat(e, in, out)); /* before the trace: not kept */
  nb_array_release(out[0]);
  char path[700];
  snprintf(path, sizeof path, "%s/t/trace.json", work);
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path}));
  for (int i = 0; i < 2; i++) {
    CHECK_OK(ctx, nb_exe_run_flat(e, in, out));
    nb_array_release(out[0]);
  }
  CHECK_OK(ctx, nb_prof_stop(ctx));
  for (int i = 0; i < 3; i++) nb_array_release(in[i]);
  nb_exe_destroy(e);
  snprintf(path, sizeof path, "%s/t/trace.memory.json", work);
  char *text = nb_test_read_file(path, NULL);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  const cJSON *x = cJSON_GetArrayItem(item(j, "executables"), 0);
  CHECK_MSG(cJSON_GetArraySize(item(j, "executables")) == 1 && num(x, "runs") == 2 && num(x, "run_ms") > 0, "%s",
            text ? text : "(no file)");
  CHECK(num(item(x, "peak"), "bytes") == 4 * (8 * 16 + 16 * 32 + 32 * 4 + 8 * 4) + 2 * 1024);
  cJSON_Delete(j);
  free(text);
  snprintf(path, sizeof path, "%s/t/trace.graph.svg", work);
  text = nb_test_read_file(path, NULL);
  CHECK_MSG(text, "no %s", path);
  if (text) check_svg(text, 3);
  free(text);
  snprintf(path, sizeof path, "%s/t/trace.memory.html", work);
  char *page = nb_test_read_file(path, NULL);
  CHECK(page && strstr(page, "<!DOCTYPE html>") && strstr(page, "<section class=\"nb-memory\">") && strstr(page, "Ran 2 times"));
  /* the sections for a report, read back from the files: the page's, byte for byte */
  snprintf(path, sizeof path, "%s/t/trace.json", work);
  char *sec = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&sec, &n);
  CHECK_OK(ctx, nb_prof_trace_memory_html(ctx, path, 0, f));
  fclose(f);
  CHECK_MSG(n > 1000 && !strncmp(sec, "<section class=\"nb-memory\">", 27) && page && strstr(page, sec), "%zu bytes read back, not the page's", n);
  free(sec);
  f = open_memstream(&sec, &n);
  CHECK_OK(ctx, nb_prof_trace_graph_html(ctx, path, f));
  fclose(f);
  CHECK(!strncmp(sec, "<section class=\"nb-graph\">", 26) && strstr(sec, "<svg") && !strstr(sec, "<?xml") && strstr(sec, "</svg>\n</div>\n</section>\n"));
  free(sec);
  free(page);
  /* a trace under which nothing ran has nothing to show; a file that is not ours is refused by name */
  snprintf(path, sizeof path, "%s/none.json", work);
  f = open_memstream(&sec, &n);
  CHECK_OK(ctx, nb_prof_trace_memory_html(ctx, path, 0, f));
  CHECK_OK(ctx, nb_prof_trace_graph_html(ctx, path, f));
  fclose(f);
  CHECK(n == 0);
  free(sec);
  snprintf(path, sizeof path, "%s/none.memory.json", work);
  f = fopen(path, "w");
  if (f) fputs("{\"format\":\"other\"}", f), fclose(f);
  snprintf(path, sizeof path, "%s/none.json", work);
  CHECK(nb_prof_trace_memory_html(ctx, path, 0, stdout) == NB_ERR_FORMAT);
  CHECK_ERR(ctx, NB_ERR_FORMAT, "none.memory.json' is not a nabla-memory/1 file");
}

int main(void) {
  ctx = nb_ctx_create();
  nb_test_scratch_dir(work, sizeof work, "prof", "memory");
  hand_computed();
  donated();
  control_body();
  errors();
  traced();
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("prof/test_memory");
}
