/* `nabla profile`: runs another nabla command with a trace recorded.
 *   nabla profile [--out PATH] -- COMMAND [ARGS...]
 * The same as NABLA_PROFILE=PATH nabla COMMAND ARGS...; the trace's format
 * and what it holds: docs/prof.md, "Traces". */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char usage_text[] =
    "usage: nabla profile [--out PATH] -- COMMAND [ARGS...]\n"
    "  runs `nabla COMMAND ARGS...` with a trace recorded: every compiled step (fused kernels, GEMMs),\n"
    "  compiles, data waits, checkpoint saves, training steps, on a track per thread\n"
    "  --out PATH  the trace file (Chrome trace-event JSON; default profile/trace.json), with a summary\n"
    "              beside it (PATH.summary.json); open the trace in ui.perfetto.dev or chrome://tracing\n"
    "  (NABLA_PROFILE=PATH nabla COMMAND ... does the same; for some steps only: train/sft/dpo/grpo\n"
    "  profile.steps=A-B, generate/serve --profile-steps A-B)\n";

int nb_cmd_profile(int argc, char **argv) {
  const char *out = "profile/trace.json";
  int i = 1;
  for (; i < argc && strcmp(argv[i], "--"); i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return nb_cli_usage(usage_text, true);
    if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else {
      fprintf(stderr, "nabla profile: unknown or incomplete option '%s'\n", argv[i]);
      return nb_cli_usage(usage_text, false);
    }
  }
  if (i + 1 >= argc) {
    fprintf(stderr, "nabla profile: no command to run after --\n");
    return nb_cli_usage(usage_text, false);
  }
  if (!strcmp(argv[i + 1], "profile")) {
    fprintf(stderr, "nabla profile: cannot profile `nabla profile`\n");
    return 2;
  }
  return nb_cli_run_traced(out, argc - i - 1, argv + i + 1);
}
