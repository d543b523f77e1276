/* The `nabla` command: dispatches to one subcommand per file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"

#define X(name, help) int nb_cmd_##name(int argc, char **argv);
#include "commands.def"
#undef X

typedef struct command {
  const char *name, *help;
  int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
#define X(name, help) {#name, help, nb_cmd_##name},
#include "commands.def"
#undef X
};

static int usage(bool asked) {
  FILE *f = asked ? stdout : stderr;
  fprintf(f, "usage: nabla <command> [args]   (nabla <command> --help: its options; nabla --version)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
  return asked ? 0 : 2;
}

/* argv[0] is the command's name */
static int dispatch(int argc, char **argv) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[0], commands[i].name)) continue;
    /* -h/--help anywhere after the command ("nabla ckpt export --help"): the
     * command's usage, whatever else the line holds */
    char help[] = "--help", *just_help[] = {argv[0], help, NULL};
    if (nb_cli_help_asked(argc, argv)) return commands[i].run(2, just_help);
    return commands[i].run(argc, argv);
  }
  fprintf(stderr, "nabla: unknown command '%s'\n", argv[0]);
  return usage(false);
}

void nb_cli_print_viewers(FILE *f, const char *cmd, const char *trace) {
  char stem[4096], mem[4200], graph[4200];
  size_t n = strlen(trace);
  snprintf(stem, sizeof stem, "%.*s", (int)(n >= 5 && !strcmp(trace + n - 5, ".json") ? n - 5 : n), trace);
  snprintf(mem, sizeof mem, "%s.memory.html", stem);
  snprintf(graph, sizeof graph, "%s.graph.svg", stem);
  bool m = access(mem, R_OK) == 0, g = access(graph, R_OK) == 0;
  if (m || g)
    fprintf(f, "%s: memory viewer %s%s%s%s\n", cmd, m ? mem : "-", g ? ", graph of the longest-running executable " : "",
            g ? graph : "", m ? " (.memory.json beside it)" : "");
}

int nb_cli_run_traced(const char *path, int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  if (nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path})) {
    fprintf(stderr, "nabla %s: cannot record a trace: %s\n", argv[0], nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return 1;
  }
  int rc = dispatch(argc, argv);
  if (nb_prof_stop(ctx)) {
    fprintf(stderr, "nabla %s: cannot write the trace: %s\n", argv[0], nb_ctx_error(ctx));
    if (!rc) rc = 1;
  } else {
    const char *slash = strrchr(path, '/');
    fprintf(stderr, "nabla %s: trace written to %s (open it in ui.perfetto.dev), the profile page to %.*s%sprofile.html; "
                    "its slowest compiled steps:\n",
            argv[0], path, slash ? (int)(slash - path) : 0, path, slash ? "/" : "");
    /* the roofs nb_prof_stop used: the peaks at $NABLA_THREADS or all CPUs (cached per machine); a command's --threads is not seen here */
    if (nb_prof_trace_table(ctx, path, stderr, 15, 0))
      fprintf(stderr, "nabla %s: %s\n", argv[0], nb_ctx_error(ctx));
    char cmd[64];
    snprintf(cmd, sizeof cmd, "nabla %s", argv[0]);
    nb_cli_print_viewers(stderr, cmd, path);
  }
  nb_ctx_destroy(ctx);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(false);
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return usage(true);
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) return nb_cmd_version(1, argv + 1);
  /* NABLA_PROFILE=PATH: the whole command is traced into PATH (nabla profile does the same) */
  const char *trace = getenv("NABLA_PROFILE");
  if (trace && *trace && strcmp(argv[1], "profile")) return nb_cli_run_traced(trace, argc - 1, argv + 1);
  return dispatch(argc - 1, argv + 1);
}
