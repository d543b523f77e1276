/* `nabla report RUN_DIR`: writes RUN_DIR/report.html titled by the run's
 * name or --title, and fails naming the file and line of a bad record, or
 * with the usage for bad arguments. */
#include "testfs.h"

int main(void) {
  const char *bin = getenv("NABLA_BIN");
  CHECK_MSG(bin != NULL, "NABLA_BIN is not set (ctest sets it)");
  if (!bin) return nb_test_summary("prof/test_cli");
  char dir[4096], run_dir[4200], path[4300], cmd[9000], out[4096];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "cli");
  snprintf(run_dir, sizeof run_dir, "%s/my-run", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", run_dir);
  CHECK(system(cmd) == 0);
  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  nb_test_write_text(path, "{\"step\": 0, \"loss\": 4.5, \"lr\": 0.001}\n{\"step\": 10, \"loss\": 3.25, \"lr\": 0.002}\n");

  snprintf(cmd, sizeof cmd, "%s report %s/ 2>&1", bin, run_dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "report.html"));
  snprintf(path, sizeof path, "%s/report.html", run_dir);
  char *html = nb_test_read_file(path, NULL);
  CHECK(html && strstr(html, "<title>my-run</title>") && strstr(html, "class='lg'>loss</text>") &&
        strstr(html, "<td>last loss</td><td>3.25</td>"));
  free(html);
  snprintf(cmd, sizeof cmd, "%s report --title 'A & B' %s 2>&1", bin, run_dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  html = nb_test_read_file(path, NULL);
  CHECK(html && strstr(html, "<title>A &amp; B</title>"));
  free(html);

  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  nb_test_write_text(path, "{\"step\": 0, \"loss\": 4.5}\n{\"step\": 1, \"loss\": nan}\n");
  snprintf(cmd, sizeof cmd, "%s report %s 2>&1", bin, run_dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 1 && strstr(out, "metrics.jsonl:2: not valid JSON"));
  snprintf(cmd, sizeof cmd, "%s report %s/nothing 2>&1", bin, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 1 && strstr(out, "nothing/metrics.jsonl"));
  snprintf(cmd, sizeof cmd, "%s report 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "usage: nabla report"));
  snprintf(cmd, sizeof cmd, "%s report a b 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "usage: nabla report"));
  snprintf(cmd, sizeof cmd, "%s --help", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "report "));
  nb_test_rm_rf(dir);
  return nb_test_summary("prof/test_cli");
}
