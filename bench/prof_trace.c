/* Claim: recording a trace (nb_prof_start .. nb_prof_stop) costs under 2%
 * of a training step. One process, one compiled gpt2-tiny training step
 * (value_and_grad + AdamW, params and state donated) run on a fixed batch;
 * rounds alternate tracing off and on (which goes first alternates too), each
 * round `steps` steps timed one by one. Prints the median step with tracing
 * off and on, their ratio, the spans recorded per step, the cost per span
 * that implies, and the time nb_prof_stop takes to write the file (outside
 * the steps: it runs once per trace, and writes the memory and graph
 * viewers' files too), and what the viewers of this step cost: copying and
 * drawing its memory JSON and its graph SVG (nabla's first traced run of
 * an executable copies its view). The other half of the claim, that off
 * costs nothing measurable against a build without the recorder, is
 * bench/prof_trace_off.sh (two binaries, interleaved).
 *   ./build/bench_prof_trace [--preset gpt2-tiny] [--batch 16] [--seq 128] [--steps 10] [--rounds 8] [--threads 2]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "nabla/nabla.h"
#include "util/trace.h"

static int die(nb_ctx *ctx, const char *what) {
  fprintf(stderr, "bench_prof_trace: %s: %s\n", what, nb_ctx_error(ctx));
  return 1;
}

static void cpu_model(char *out, size_t cap) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(out, cap, "?");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(out, cap, "%s", strchr(line, ':') + 2);
      out[strcspn(out, "\n")] = 0;
      break;
    }
  if (f) fclose(f);
}

static double load1(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  double l = -1;
  if (f && fscanf(f, "%lf", &l) != 1) l = -1;
  if (f) fclose(f);
  return l;
}

/* n steps of exe on st, each one's wall ms into ms[] and CPU ms (the
 * process's, all threads) into cpu[] */
static int run_steps(nb_ctx *ctx, nb_exe *exe, nb_tree *st, int n, double *ms, double *cpu) {
  for (int r = 0; r < n; r++) {
    nb_tree *out = nb_tree_create(ctx);
    double a = now_ms(), c = cpu_s();
    if (nb_exe_run(exe, st, out)) return die(ctx, "nb_exe_run");
    ms[r] = now_ms() - a;
    cpu[r] = (cpu_s() - c) * 1e3;
    for (size_t i = 0; i < nb_tree_size(out); i++) { /* the new state replaces the donated one */
      const char *p = nb_tree_path(out, i);
      if (!strncmp(p, "params/", 7) || !strncmp(p, "opt_state/", 10)) nb_tree_set_array(st, p, nb_tree_leaf(out, i)->array);
    }
    nb_tree_destroy(out);
  }
  return 0;
}

static long count_spans(const char *summary) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = fopen(summary, "r");
  if (!f) return -1;
  long ev = -1;
  if (getdelim(&text, &n, 0, f) > 0) {
    const char *p = strstr(text, "\"events\":");
    if (p) ev = atol(p + 9);
  }
  free(text);
  fclose(f);
  return ev;
}

/* The recorder alone, where load matters least (no memory traffic, a
 * few ns per call): ns per site with tracing off (the check), and per span
 * on (two clock reads, the copy into the thread's buffer), best of 5. */
static void recorder_cost(nb_ctx *ctx, const char *path, double *off_ns, double *on_ns) {
  enum { N_OFF = 10000000, N_ON = 20000 };
  *off_ns = *on_ns = 1e30;
  volatile int64_t sink = 0;
  nb_util__trace_arg args[] = {{"ops", "add+mul+exp", 0}, {"flops", NULL, 1e6}, {"bytes", NULL, 4e6}, {"at", "nn/apply.c:16", 0}};
  for (int rep = 0; rep < 5; rep++) {
    double a = now_s();
    for (int i = 0; i < N_OFF; i++)
      if (nb_util__tracing()) sink += i;
    *off_ns = fmin(*off_ns, (now_s() - a) * 1e9 / N_OFF);
    nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path, .max_events = N_ON});
    a = now_s();
    for (int i = 0; i < N_ON; i++) {
      int64_t t0 = nb_util__trace_start();
      nb_util__trace_span("kernel", "k12 add+mul+exp", t0, nb_util__now_ns(), args, 4);
    }
    *on_ns = fmin(*on_ns, (now_s() - a) * 1e9 / N_ON);
    nb_util__trace_disable(); /* no file: nb_prof_stop would write them all */
    nb_prof_stop(ctx);
  }
  (void)sink;
}

int main(int argc, char **argv) {
  const char *preset = "gpt2-tiny";
  int B = 16, T = 128, steps = 10, rounds = 8, threads = 2;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--preset")) preset = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--batch")) B = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--seq")) T = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--rounds")) rounds = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
    else return fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
  }
  nb_ctx *ctx = nb_ctx_create();
  nb_train_config c;
  nb_train_config_defaults(&c);
  if (nb_model_config_preset(ctx, preset, &c.model)) return die(ctx, "preset");
  c.batch_size = B;
  c.data.seq_len = T;
  if (c.model.max_seq_len < T) c.model.max_seq_len = T;
  nb_array *key = nb_key(ctx, 0);
  nb_tree *params = nb_model_init(ctx, &c.model, key);
  nb_optim_tx *tx = params ? nb_train_optimizer(ctx, &c) : NULL;
  nb_tree *opt = tx ? nb_optim_init_arrays(ctx, tx, params) : NULL;
  nb_graph *g = opt ? nb_train_trace_step(ctx, &c, params, opt) : NULL;
  if (!g) return die(ctx, "tracing the step");
  const char *donate[] = {"params", "opt_state", NULL};
  nb_exe *exe = nb_jit(ctx, g, &(nb_jit_opts){.donate = donate, .threads = threads});
  if (!exe) return die(ctx, "nb_jit");
  nb_tree *st = nb_tree_create(ctx), *batch = bench_lm_batch(ctx, B, T, c.model.vocab_size);
  nb_array *step = nb_array_scalar(ctx, NB_I32, 0);
  if (!batch || nb_tree_merge(st, "params", params) || nb_tree_merge(st, "opt_state", opt) || nb_tree_merge(st, "batch", batch) ||
      nb_tree_set_array(st, "step", step) || nb_train_set_hparams(ctx, &c, st))
    return die(ctx, "the state");
  nb_array_release(step);
  nb_tree_destroy(params), nb_tree_destroy(opt), nb_tree_destroy(batch), nb_array_release(key), nb_optim_tx_destroy(tx);
  nb_graph_destroy(g);

  char dir[] = "/tmp/nabla_bench_prof_XXXXXX", path[64], summary[80];
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  snprintf(path, sizeof path, "%s/trace.json", dir);
  snprintf(summary, sizeof summary, "%s/trace.summary.json", dir);
  double *off = calloc((size_t)(rounds * steps), sizeof *off), *on = calloc((size_t)(rounds * steps), sizeof *on);
  double *off_cpu = calloc((size_t)(rounds * steps), sizeof *off), *on_cpu = calloc((size_t)(rounds * steps), sizeof *on);
  double *stop_ms = calloc((size_t)rounds, sizeof *stop_ms), warm[3], warm_cpu[3];
  if (run_steps(ctx, exe, st, 3, warm, warm_cpu)) return 1; /* warm-up: first-run costs out of both sides */
  long spans = 0;
  double load_start = load1();
  for (int r = 0; r < rounds; r++)
    for (int half = 0; half < 2; half++) {
      bool tracing = (half + r) % 2 == 1; /* off first in even rounds, on first in odd ones */
      if (tracing && nb_prof_start(ctx, &(nb_prof_trace_opts){.path = path})) return die(ctx, "nb_prof_start");
      if (run_steps(ctx, exe, st, steps, (tracing ? on : off) + r * steps, (tracing ? on_cpu : off_cpu) + r * steps)) return 1;
      if (!tracing) continue;
      double a = now_ms();
      if (nb_prof_stop(ctx)) return die(ctx, "nb_prof_stop");
      stop_ms[r] = now_ms() - a;
      spans = count_spans(summary);
    }
  double load_end = load1();
  double rec_off_ns, rec_on_ns;
  recorder_cost(ctx, path, &rec_off_ns, &rec_on_ns);
  int n = rounds * steps;
  double m_off = median(off, n), m_on = median(on, n), m_stop = median(stop_ms, rounds);
  double c_off = median(off_cpu, n), c_on = median(on_cpu, n);
  double per_step = (double)spans / steps, per_span_ns = (m_on - m_off) * 1e6 / per_step;
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("cpu: %s; %ld cores online; load %.2f -> %.2f\n", cpu, sysconf(_SC_NPROCESSORS_ONLN), load_start, load_end);
  printf("%s B=%d T=%d threads=%d: %d rounds x %d steps each side, interleaved\n", preset, B, T, threads, rounds, steps);
  printf("RESULT prof_trace: step off %.3f ms, on %.3f ms (medians), on/off %.4f; %.0f spans per step (%.0f ns each "
         "implied); nb_prof_stop %.1f ms for %ld spans\n",
         m_off, m_on, m_on / m_off, per_step, per_span_ns, m_stop, spans);
  printf("off min/max %.3f/%.3f ms, on min/max %.3f/%.3f ms\n", off[0], off[n - 1], on[0], on[n - 1]);
  printf("RESULT prof_trace cpu: step off %.3f CPU ms, on %.3f CPU ms (medians; all threads), on/off %.4f; mins %.3f / %.3f\n",
         c_off, c_on, c_on / c_off, off_cpu[0], on_cpu[0]);
  printf("RESULT recorder: off %.2f ns per site, on %.0f ns per span; x %.0f spans per step = %.4f%% (off) and %.4f%% "
         "(on) of the %.3f ms step with tracing off\n",
         rec_off_ns, rec_on_ns, per_step, 100 * rec_off_ns * per_step / (m_off * 1e6), 100 * rec_on_ns * per_step / (m_off * 1e6),
         m_off);
  /* the viewers of this executable: build + draw, best of 5 (the copy a trace makes at an executable's first run is the build) */
  double json_ms = 1e30, svg_ms = 1e30;
  size_t json_bytes = 0, svg_bytes = 0;
  for (int rep = 0; rep < 5; rep++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    double a = now_ms();
    if (nb_prof_memory_json(ctx, exe, f)) return die(ctx, "nb_prof_memory_json");
    fflush(f);
    json_ms = fmin(json_ms, now_ms() - a);
    fclose(f), free(buf), json_bytes = len;
    f = open_memstream(&buf, &len);
    a = now_ms();
    if (nb_prof_graph_svg(ctx, exe, f)) return die(ctx, "nb_prof_graph_svg");
    fflush(f);
    svg_ms = fmin(svg_ms, now_ms() - a);
    fclose(f), free(buf), svg_bytes = len;
  }
  printf("RESULT viewers: %zu steps, %zu values: memory JSON %.2f ms (%zu bytes), graph SVG %.2f ms (%zu bytes), once per "
         "executable per trace\n",
         nb_exe_num_steps(exe), nb_exe_num_values(exe), json_ms, json_bytes, svg_ms, svg_bytes);
  static const char *const beside[] = {"memory.json", "memory.html", "graph.svg"};
  for (int i = 0; i < 3; i++) {
    char p[128];
    snprintf(p, sizeof p, "%s/trace.%s", dir, beside[i]);
    unlink(p);
  }
  unlink(path), unlink(summary), rmdir(dir);
  free(off), free(on), free(off_cpu), free(on_cpu), free(stop_ms);
  nb_tree_destroy(st);
  nb_exe_destroy(exe);
  nb_ctx_destroy(ctx);
  return 0;
}
