/* The nabla side of tests/prof/peer_tb.py: writes an event file of scalars
 * into argv[1] and prints what it wrote, one "scalar TAG STEP VALUE" line per
 * record (the value as %.17g, before float32 rounding), then "path PATH". */
#include <math.h>
#include <stdio.h>

#include "nabla/nabla.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s LOGDIR\n", argv[0]);
    return 2;
  }
  nb_ctx *ctx = nb_ctx_create();
  nb_prof_tb *w = ctx ? nb_prof_tb_create(ctx, argv[1]) : NULL;
  if (!w) {
    fprintf(stderr, "nb_prof_tb_create: %s\n", ctx ? nb_ctx_error(ctx) : "no context");
    return 1;
  }
  /* a short training run's worth: a decaying loss, a warmup-then-cosine lr,
   * an eval every 25 steps, steps well past 2^7 and 2^14 (multi-byte varints) */
  nb_status s = NB_OK;
  for (int64_t step = 0; step < 200 && s == NB_OK; step++) {
    int64_t at = step < 150 ? step : step * 137; /* the last 50 steps jump to large step numbers */
    double loss = 2.5 + 8.0 * exp(-(double)step / 40) + 0.01 * sin((double)step);
    double lr = 3e-4 * fmin(1.0, step / 20.0) * 0.5 * (1 + cos(M_PI * step / 200));
    const struct {
      const char *tag;
      double value;
    } vals[] = {{"train/loss", loss}, {"train/lr", lr}, {"train/tokens_per_s", 51234.5 + step}};
    for (int k = 0; k < 3 && s == NB_OK; k++) {
      s = nb_prof_tb_scalar(w, vals[k].tag, at, vals[k].value);
      printf("scalar %s %lld %.17g\n", vals[k].tag, (long long)at, vals[k].value);
    }
    if (step % 25 == 0 && s == NB_OK) {
      s = nb_prof_tb_scalar(w, "eval/loss", at, loss + 0.125);
      printf("scalar %s %lld %.17g\n", "eval/loss", (long long)at, loss + 0.125);
      if (s == NB_OK) s = nb_prof_tb_scalar(w, "eval/perplexité", at, exp(loss + 0.125)); /* a UTF-8 tag */
      printf("scalar %s %lld %.17g\n", "eval/perplexité", (long long)at, exp(loss + 0.125));
    }
  }
  printf("path %s\n", nb_prof_tb_path(w));
  nb_prof_tb_destroy(w);
  if (s == NB_OK) s = nb_ctx_status(ctx);
  if (s != NB_OK) fprintf(stderr, "writing events: %s\n", nb_ctx_error(ctx));
  nb_ctx_destroy(ctx);
  return s == NB_OK ? 0 : 1;
}
