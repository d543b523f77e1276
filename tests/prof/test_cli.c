/* `nabla report RUN_DIR`: writes RUN_DIR/report.html titled by the run's
 * name or --title, and fails naming the file and line of a bad record, or
 * with the usage for bad arguments. */
#include <sys/wait.h>

#include "prof_test_util.h"

/* Runs a shell command; returns its exit status and its output in out. */
static int run(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
  const char *bin = getenv("NABLA_BIN");
  CHECK_MSG(bin != NULL, "NABLA_BIN is not set (ctest sets it)");
  if (!bin) return nb_test_summary("prof/test_cli");
  char dir[4096], run_dir[4200], path[4300], cmd[9000], out[4096];
  scratch_dir(dir, sizeof dir, "cli");
  snprintf(run_dir, sizeof run_dir, "%s/my-run", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", run_dir);
  CHECK(system(cmd) == 0);
  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  spit(path, "{\"step\": 0, \"loss\": 4.5, \"lr\": 0.001}\n{\"step\": 10, \"loss\": 3.25, \"lr\": 0.002}\n");

  snprintf(cmd, sizeof cmd, "%s report %s/ 2>&1", bin, run_dir);
  CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "report.html"));
  snprintf(path, sizeof path, "%s/report.html", run_dir);
  char *html = slurp(path, NULL);
  CHECK(html && strstr(html, "<title>my-run</title>") && strstr(html, "class='lg'>loss</text>") &&
        strstr(html, "<td>last loss</td><td>3.25</td>"));
  free(html);
  snprintf(cmd, sizeof cmd, "%s report --title 'A & B' %s 2>&1", bin, run_dir);
  CHECK(run(cmd, out, sizeof out) == 0);
  html = slurp(path, NULL);
  CHECK(html && strstr(html, "<title>A &amp; B</title>"));
  free(html);

  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  spit(path, "{\"step\": 0, \"loss\": 4.5}\n{\"step\": 1, \"loss\": nan}\n");
  snprintf(cmd, sizeof cmd, "%s report %s 2>&1", bin, run_dir);
  CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "metrics.jsonl:2: not valid JSON"));
  snprintf(cmd, sizeof cmd, "%s report %s/nothing 2>&1", bin, dir);
  CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "nothing/metrics.jsonl"));
  snprintf(cmd, sizeof cmd, "%s report 2>&1", bin);
  CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "usage: nabla report"));
  snprintf(cmd, sizeof cmd, "%s report a b 2>&1", bin);
  CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "usage: nabla report"));
  snprintf(cmd, sizeof cmd, "%s --help", bin);
  CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "report "));
  rm_rf(dir);
  return nb_test_summary("prof/test_cli");
}
