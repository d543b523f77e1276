/* `nabla report RUN_DIR [--title TEXT]`: (re)draws RUN_DIR/report.html from
 * RUN_DIR/metrics.jsonl (nb_prof_report_html); the title defaults to the run
 * directory's name. Errors name the file and line. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] = "usage: nabla report RUN_DIR [--title TEXT]\n"
                                 "writes RUN_DIR/report.html from RUN_DIR/metrics.jsonl\n";

static int usage(void) { return nb_cli_usage(usage_text, false); }

int nb_cmd_report(int argc, char **argv) {
  const char *run = NULL, *title = NULL;
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--title") && i + 1 < argc) title = argv[++i];
    else if (argv[i][0] != '-' && !run) run = argv[i];
    else return usage();
  }
  if (!run) return usage();
  size_t n = strlen(run);
  while (n > 1 && run[n - 1] == '/') n--; /* "runs/x/" names run x */
  char in[4096], out[4096], name[4096];
  snprintf(name, sizeof name, "%.*s", (int)n, run);
  const char *slash = strrchr(name, '/');
  if (snprintf(in, sizeof in, "%s/metrics.jsonl", name) >= (int)sizeof in ||
      snprintf(out, sizeof out, "%s/report.html", name) >= (int)sizeof out) {
    fprintf(stderr, "nabla report: run directory path too long\n");
    return 1;
  }
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  int rc = 0;
  if (nb_prof_report_html(ctx, in, out, title ? title : slash && slash[1] ? slash + 1 : name) != NB_OK) {
    fprintf(stderr, "nabla report: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else {
    printf("wrote %s\n", out);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
