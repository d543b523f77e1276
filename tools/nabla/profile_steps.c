/* --profile-steps A-B of `nabla generate` and `nabla serve`: both drive the
 * serving engine step by step (nb_serve_llm_step), so the trace of a range
 * of its steps is started and stopped here, around that call, once for both.
 * The serve library may not use prof (docs/design.md), hence the command
 * side; the range parser is prof's, shared with the trainer's profile.steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

bool nb_cli_prof_steps_parse(const char *cmd, const char *v, nb_cli_prof_steps *p) {
  if (nb_prof_parse_steps(v, &p->first, &p->last)) return true;
  fprintf(stderr, "nabla %s: --profile-steps: '%s' is not a step range A-B or a step A (1 <= A <= B)\n", cmd, v ? v : "");
  return false;
}

static const char *trace_path(const nb_cli_prof_steps *p) { return p->path ? p->path : "profile/trace.json"; }

static void start(const char *cmd, nb_cli_prof_steps *p, nb_ctx *ctx) {
  p->state = 2;
  if (nb_prof_tracing()) {
    fprintf(stderr, "nabla %s: --profile-steps: a trace is already being recorded; not starting another\n", cmd);
    return;
  }
  if (nb_prof_start(ctx, &(nb_prof_trace_opts){.path = trace_path(p)})) {
    fprintf(stderr, "nabla %s: --profile-steps: %s (going on without it)\n", cmd, nb_ctx_error(ctx));
    nb_ctx_clear_error(ctx);
    return;
  }
  p->state = 1;
}

void nb_cli_prof_steps_finish(const char *cmd, nb_cli_prof_steps *p, nb_ctx *ctx) {
  if (p->state != 1) return;
  p->state = 2;
  nb_status was = nb_ctx_status(ctx); /* the command's own error stays the one it reports */
  char *err = was ? strdup(nb_ctx_error(ctx)) : NULL;
  if (nb_prof_stop(ctx)) fprintf(stderr, "nabla %s: writing the profile: %s\n", cmd, nb_ctx_error(ctx));
  else {
    fprintf(stderr, "nabla %s: trace of engine steps %lld-%lld in %s\n", cmd, (long long)p->first, (long long)p->last,
            trace_path(p));
    nb_cli_print_viewers(stderr, cmd, trace_path(p));
  }
  if (was) nb_errorf(ctx, was, "%s", err ? err : "(out of memory for the message)");
  else nb_ctx_clear_error(ctx);
  free(err);
}

nb_status nb_cli_llm_step(const char *cmd, nb_cli_prof_steps *p, nb_ctx *ctx, nb_serve_llm *l, const nb_serve_event **ev,
                          int32_t *n) {
  int64_t next = nb_serve_llm_steps(l) + 1;
  if (p->state == 0 && p->first && next >= p->first && next <= p->last) start(cmd, p, ctx);
  nb_status s = nb_serve_llm_step(l, ev, n);
  if (p->state == 1 && nb_serve_llm_steps(l) >= p->last) nb_cli_prof_steps_finish(cmd, p, ctx);
  return s;
}
