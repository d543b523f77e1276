/* The HTML report: every series of a synthetic metrics.jsonl is drawn and
 * summarized, names are escaped, long series are thinned without losing a
 * spike, malformed lines are named errors with line numbers, empty files give
 * a page, failures leave the old page and no temporary file, and allocation
 * failures are clean. */
#include <dirent.h>
#include <unistd.h>

#include "testfs.h"

static char dir[4096];

static const char *in_dir(char *buf, const char *name) {
  snprintf(buf, 4200, "%s/%s", dir, name);
  return buf;
}

/* Occurrences of needle in hay. */
static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* The k-th polyline of the page: *start gets its points='...' list; returns
 * its number of points. */
static int polyline_points(const char *html, int k, const char **start) {
  const char *p = html;
  for (int i = 0; i <= k; i++) {
    p = strstr(p, "<polyline");
    if (!p) return -1;
    p++;
  }
  p = strstr(p, "points='");
  if (!p) return -1;
  p += 8;
  *start = p;
  int n = 0;
  for (; *p && *p != '\''; p++) n += *p == ',';
  return n;
}

static int files_in_dir(void) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

#define NSTEPS 300

static void write_metrics(const char *path) {
  FILE *f = fopen(path, "wb");
  double tps_sum = 0;
  for (int s = 0; s < NSTEPS; s++) {
    double loss = 3 + 8.0 / (1 + s), tps = 1000 + s;
    tps_sum += tps;
    fprintf(f, "{\"step\": %d, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens_per_s\": %.17g, "
               "\"mfu\": 0.25, \"phase\": \"train\", \"weird<name>\": %d, \"skipped\": null, \"flag\": true}%s\n",
            s, loss, 1e-4 * s / NSTEPS, 1.0 + (s % 7), tps, s % 5, s % 2 ? "\r" : "");
    if (s % 50 == 49) fprintf(f, "{\"step\": %d, \"eval_loss\": %.17g}\n\n   \n", s, loss + 0.25);
    if (s == 7) fprintf(f, "{\"step\": 7, \"loss\": 1e999}\n"); /* overflows to inf: skipped, counted */
  }
  fclose(f);
  CHECK(tps_sum / NSTEPS == 1149.5);
}

static void test_report(nb_ctx *ctx) {
  char in[4200], out[4200];
  write_metrics(in_dir(in, "metrics.jsonl"));
  in_dir(out, "report.html");
  nb_test_write_text(out, "an older report\n");
  CHECK_OK(ctx, nb_prof_report_html(ctx, in, out, "Run <x> & y"));
  char *html = nb_test_read_file(out, NULL);
  CHECK(html != NULL);
  if (!html) return;
  CHECK(!strncmp(html, "<!DOCTYPE html>", 15) && strstr(html, "</html>"));
  CHECK(strstr(html, "<title>Run &lt;x&gt; &amp; y</title>") && strstr(html, "<h1>Run &lt;x&gt; &amp; y</h1>"));
  /* one plot per quantity, each series named in a legend */
  const char *titles[] = {"Loss", "Learning rate", "Gradient norm", "Throughput", "Model FLOPs utilization"};
  for (int i = 0; i < 5; i++) {
    char cap[128];
    snprintf(cap, sizeof cap, "<figcaption>%s</figcaption>", titles[i]);
    CHECK_MSG(strstr(html, cap), "no plot '%s'", titles[i]);
  }
  const char *names[] = {"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "weird&lt;name&gt;"};
  for (int i = 0; i < 7; i++) {
    char lg[128];
    snprintf(lg, sizeof lg, "class='lg'>%s</text>", names[i]);
    CHECK_MSG(count(html, lg) == 1, "legend '%s' appears %d times", names[i], count(html, lg));
    snprintf(lg, sizeof lg, "<tr><td>%s</td>", names[i]);
    CHECK_MSG(count(html, lg) == 1, "table row '%s' appears %d times", names[i], count(html, lg));
  }
  /* 11 lines: loss, grad_norm, tokens_per_s and mfu are drawn raw and averaged */
  CHECK(count(html, "<polyline") == 11 && count(html, "<svg") == 6);
  CHECK(count(html, "class='line raw'") == 4 && count(html, "bold: moving average</text>") == 4);
  CHECK(!strstr(html, "weird<name>") && !strstr(html, "phase") && !strstr(html, ">skipped<") && !strstr(html, ">flag<"));
  /* self-contained: no script, nothing fetched */
  CHECK(!strstr(html, "<script") && !strstr(html, "http:") && !strstr(html, "https:") && !strstr(html, "src="));
  /* axes: tick labels and axis titles */
  CHECK(count(html, "class='xl'>step</text>") == 6 && strstr(html, "tokens / s</text>"));
  CHECK(count(html, "class='yt'>") >= 6 * 3 && count(html, "class='xt'>") >= 6 * 3);
  /* every point of a short series is drawn: loss raw and averaged, then eval_loss */
  const char *pts, *avg;
  CHECK(polyline_points(html, 0, &pts) == NSTEPS && polyline_points(html, 1, &avg) == NSTEPS);
  CHECK(strncmp(pts, avg, 100) != 0); /* the average differs from a falling loss... */
  CHECK(polyline_points(html, 2, &pts) == NSTEPS / 50);
  /* ...but not from a constant: mfu is 0.25 throughout (the average is debiased) */
  CHECK(polyline_points(html, 8, &pts) == NSTEPS && polyline_points(html, 9, &avg) == NSTEPS);
  const char *end = strchr(pts, '\'');
  CHECK(end && !strncmp(pts, avg, (size_t)(end - pts) + 1));
  CHECK(count(html, "<circle") == NSTEPS / 50); /* sparse eval points get markers */
  /* summary */
  CHECK(strstr(html, "<td>steps</td><td>") && strstr(html, "307 records, steps 0 to 299"));
  char want[256];
  snprintf(want, sizeof want, "<td>last loss</td><td>%.6g</td>", 3 + 8.0 / NSTEPS);
  CHECK_MSG(strstr(html, want), "no '%s'", want);
  snprintf(want, sizeof want, "<td>min loss</td><td>%.6g (step 299)</td>", 3 + 8.0 / NSTEPS);
  CHECK_MSG(strstr(html, want), "no '%s'", want);
  snprintf(want, sizeof want, "<td>min eval loss</td><td>%.6g (step 299)</td>", 3.25 + 8.0 / NSTEPS);
  CHECK_MSG(strstr(html, want), "no '%s'", want);
  CHECK(strstr(html, "<td>mean tokens/s</td><td>1149.5</td>"));
  CHECK(strstr(html, "<td>non-finite values skipped</td><td>1</td>"));
  CHECK(strstr(html, "<tr><td>grad_norm</td><td>300</td><td>6</td><td>1</td><td>7</td>"));
  free(html);
  CHECK(files_in_dir() == 2); /* metrics + report: no temporary file left */

  /* no title: the file name */
  CHECK_OK(ctx, nb_prof_report_html(ctx, in, out, NULL));
  html = nb_test_read_file(out, NULL);
  CHECK(html && strstr(html, "<title>metrics.jsonl</title>"));
  free(html);
}

/* 20000 points, all 1 but one spike of 100: the line is thinned to a few
 * points per pixel column and still reaches the top of the plot. */
static void test_thinning(nb_ctx *ctx) {
  char in[4200], out[4200];
  FILE *f = fopen(in_dir(in, "long.jsonl"), "wb");
  for (int s = 0; s < 20000; s++) fprintf(f, "{\"step\":%d,\"loss\":%d}\n", s, s == 12345 ? 100 : 1);
  fclose(f);
  CHECK_OK(ctx, nb_prof_report_html(ctx, in, in_dir(out, "long.html"), "long"));
  char *html = nb_test_read_file(out, NULL);
  const char *pts = "";
  int n = html ? polyline_points(html, 0, &pts) : -1;
  CHECK_MSG(n > 100 && n < 4 * 600, "%d points", n);
  const char *end = pts ? strchr(pts, '\'') : NULL;
  const char *top = pts ? strstr(pts, ",30.0 ") : NULL; /* y of the plot's top edge */
  CHECK(top && end && top < end);
  free(html);
  remove(in);
  remove(out);
}

static void expect_format_error(nb_ctx *ctx, const char *text, int line, const char *what) {
  char in[4200], out[4200], needle[4400];
  nb_test_write_text(in_dir(in, "bad.jsonl"), text);
  in_dir(out, "bad.html");
  nb_test_write_text(out, "old page\n");
  CHECK(nb_prof_report_html(ctx, in, out, "t") == NB_ERR_FORMAT);
  snprintf(needle, sizeof needle, "%s:%d: %s", in, line, what);
  CHECK_ERR(ctx, NB_ERR_FORMAT, needle);
  char *old = nb_test_read_file(out, NULL);
  CHECK(old && !strcmp(old, "old page\n")); /* left alone */
  free(old);
  remove(in);
  remove(out);
}

static void test_errors(nb_ctx *ctx) {
  const char *ok = "{\"step\": 1, \"loss\": 2}\n";
  char text[512];
  snprintf(text, sizeof text, "%s\n%s{\"step\": 3, \"loss\": }\n%s", ok, ok, ok);
  expect_format_error(ctx, text, 4, "not valid JSON (column 21)"); /* line 2 is blank */
  snprintf(text, sizeof text, "%s[1, 2]\n", ok);
  expect_format_error(ctx, text, 2, "expected a JSON object, got an array");
  snprintf(text, sizeof text, "%s%s{\"loss\": 2}\n", ok, ok);
  expect_format_error(ctx, text, 3, "no numeric \"step\" field");
  expect_format_error(ctx, "{\"step\": \"7\", \"loss\": 2}", 1, "no numeric \"step\" field");
  snprintf(text, sizeof text, "%s{\"step\": 2} x\n", ok);
  expect_format_error(ctx, text, 2, "text after the JSON value (column 13)");
  expect_format_error(ctx, "{\"step\": 1,", 1, "not valid JSON");

  char in[4200], out[4200];
  CHECK(nb_prof_report_html(ctx, in_dir(in, "missing.jsonl"), in_dir(out, "x.html"), NULL) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, in);
  nb_test_write_text(in_dir(in, "fine.jsonl"), ok);
  CHECK(nb_prof_report_html(ctx, in, in_dir(out, "no/such/dir/r.html"), NULL) == NB_ERR_IO);
  CHECK_ERR(ctx, NB_ERR_IO, "no/such/dir/r.html");
  CHECK(nb_prof_report_html(ctx, NULL, out, NULL) == NB_ERR_INVALID_ARG);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "metrics_jsonl is NULL");
  remove(in);
}

static void test_empty(nb_ctx *ctx) {
  const char *texts[] = {"", "\n  \n\r\n"};
  for (int i = 0; i < 2; i++) {
    char in[4200], out[4200];
    nb_test_write_text(in_dir(in, "empty.jsonl"), texts[i]);
    CHECK_OK(ctx, nb_prof_report_html(ctx, in, in_dir(out, "empty.html"), "empty run"));
    char *html = nb_test_read_file(out, NULL);
    CHECK(html && strstr(html, "No metrics yet") && !strstr(html, "<svg") && strstr(html, "</html>"));
    free(html);
    remove(in);
    remove(out);
  }
}

static void test_alloc_failures(nb_ctx *ctx) {
  char in[4200], out[4200];
  nb_test_write_text(in_dir(in, "small.jsonl"), "{\"step\":0,\"loss\":3,\"lr\":1}\n{\"step\":1,\"loss\":2,\"eval_loss\":2.5,\"x\":1}\n");
  in_dir(out, "small.html");
  size_t base = nb_ctx_bytes_in_use(ctx);
  bool done = false;
  for (int64_t n = 1; n < 200 && !done; n++) {
    nb_ctx_fail_alloc_after(ctx, n);
    nb_status s = nb_prof_report_html(ctx, in, out, "oom");
    nb_ctx_fail_alloc_after(ctx, 0);
    CHECK_MSG(s == NB_OK || s == NB_ERR_NOMEM, "n=%lld: %s", (long long)n, nb_ctx_error(ctx));
    CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "n=%lld: %zu bytes leaked", (long long)n, nb_ctx_bytes_in_use(ctx) - base);
    CHECK(s == NB_OK || access(out, F_OK) != 0); /* no page, no temporary file */
    done = s == NB_OK;
    nb_ctx_clear_error(ctx);
  }
  CHECK(done && access(out, F_OK) == 0);
  remove(in);
  remove(out);
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_test_scratch_dir(dir, sizeof dir, "prof", "report");
  test_report(ctx);
  test_thinning(ctx);
  test_errors(ctx);
  test_empty(ctx);
  test_alloc_failures(ctx);
  nb_test_rm_rf(dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("prof/test_report");
}
