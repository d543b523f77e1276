/* The `nabla` command: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

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

int main(int argc, char **argv) {
  if (argc < 2) return usage(false);
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return usage(true);
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) return nb_cmd_version(1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name)) continue;
    /* -h/--help anywhere after the command ("nabla ckpt export --help"): the
     * command's usage, whatever else the line holds */
    char help[] = "--help", *just_help[] = {argv[1], help, NULL};
    if (nb_cli_help_asked(argc - 1, argv + 1)) return commands[i].run(2, just_help);
    return commands[i].run(argc - 1, argv + 1);
  }
  fprintf(stderr, "nabla: unknown command '%s'\n", argv[1]);
  return usage(false);
}
