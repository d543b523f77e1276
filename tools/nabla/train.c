/* `nabla train`: runs (or resumes) a training into a run directory.
 *   nabla train [CONFIG.yaml] [--run-dir DIR] [--peak-gflops X] [--threads N] [key=value ...]
 * Without CONFIG: the default tiny GPT on data/corpus/kjv.txt (scripts/corpus.sh)
 * in runs/default. One line per log_every steps; Ctrl-C checkpoints and
 * exits (the same command resumes). The loop itself is nb_train_run.
 * Data parallel: `mpirun -np N nabla train ... mesh.data=N` (docs/dist.md):
 * the mesh axis "data" over the N processes; rank 0 prints and owns the run
 * dir and the job's checkpoints, rank r > 0 writes DIR/rank<r>, restores
 * from DIR/checkpoints and prints only errors. `nabla launch` (launch.c)
 * starts such a job and restarts it from its last checkpoint. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"
#include "util/util.h"

/* The default run: gpt2-tiny (byte-level vocabulary) on the default corpus,
 * about two minutes on a 2-core CPU (bench/RESULTS.md has the numbers). */
static const char default_yaml[] =
    "model:\n"
    "  preset: gpt2-tiny\n"
    "data:\n"
    "  train: data/corpus/kjv.txt\n"
    "  eval: \"\"\n"
    "  tokenizer: \"\"\n"
    "  seq_len: 128\n"
    "  workers: 1\n"
    "optim:\n"
    "  name: adamw\n"
    "  lr: 2.0e-3\n"
    "  b1: 0.9\n"
    "  b2: 0.95\n"
    "  weight_decay: 0.1\n"
    "  grad_clip: 1.0\n"
    "schedule:\n"
    "  kind: cosine\n"
    "  warmup_steps: 20\n"
    "  min_lr_ratio: 0.1\n"
    "batch_size: 16\n"
    "steps: 1000\n"
    "eval_every: 250\n"
    "eval_steps: 8\n"
    "log_every: 10\n"
    "checkpoint_every: 250\n"
    "checkpoint_keep: 2\n"
    "seed: 0\n";

static const char usage_text[] =
    "usage: nabla train [CONFIG.yaml] [--run-dir DIR] [--peak-gflops X] [--threads N] [--layout] [key=value ...]\n"
    "  CONFIG      a run config (configs/*.yaml); without it, the default tiny GPT on data/corpus/kjv.txt\n"
    "  --run-dir   where config.yaml, metrics.jsonl and checkpoints/ go (default runs/default, or\n"
    "              runs/<config name>); an existing run there is resumed from its latest checkpoint\n"
    "  --threads N compute threads (default: $NABLA_THREADS, else all CPUs)\n"
    "  --peak-gflops  the peak FLOP/s that MFU is relative to (default: $NABLA_PEAK_GFLOPS, else an\n"
    "              f32 FMA peak measured once per machine and thread count, cached in ~/.cache/nabla)\n"
    "  --layout    print how the parameters and optimizer state are split over the mesh (mesh.* and\n"
    "              mesh.rules: each leaf's spec, the rule that gave it, one process's block) and exit\n"
    "  key=value   config overrides: steps=100 optim.lr=1e-3 model.n_layers=2 ...\n"
    "data parallel: mpirun -np N nabla train ... mesh.data=N grad_accum=N, or nabla launch -n N [--max-restarts K]\n"
    "              -- nabla train ... mesh.data=N grad_accum=N (docs/dist.md)\n"
    "expert parallel (MoE): mpirun -np N nabla train ... mesh.expert=N grad_accum=N model.capacity_factor=C\n"
    "sharding rules: mesh.rules='[[\".*embed.*\", []], [\".*\", [fsdp]]]' replaces the axis's built-in layout\n"
    "              ([regex, [axis|null, ...]] pairs, the first full match wins; docs/dist.md)\n";

double nb_cli_progress_peak(nb_cli_progress *c, nb_prof_peak *pk, int threads, double flag_peak) {
  c->peak_source = "--peak-gflops";
  if (flag_peak > 0) return flag_peak;
  *pk = nb_prof_peak_flops(threads);
  c->peak_source = pk->source;
  return pk->flops;
}

void nb_cli_progress_start(void *ud, const nb_train_start_info *in) {
  nb_cli_progress *c = ud;
  c->t_start = nb_util__now_s();
  c->entropy = in->unigram_entropy;
  c->start_step = in->start_step;
  if (in->start_step > 0) printf("resumed from the checkpoint at step %lld\n", (long long)in->start_step);
  printf("model: %lld parameters; data: %s (%lld train windows), eval %s (%lld windows), vocabulary %lld\n",
         (long long)in->n_params, in->train_shard, (long long)in->train_windows, in->eval_shard,
         (long long)in->eval_windows, (long long)in->vocab_size);
  if (isfinite(in->unigram_entropy))
    printf("unigram entropy of the training tokens: %.4f nats/token (%.4f bits): the loss to beat\n",
           in->unigram_entropy, in->unigram_entropy / log(2.0));
  printf("model FLOPs/step %.3g (6 N tokens + attention; graph cost %.3g); MFU against a peak of %.1f GFLOP/s (%s)\n",
         in->flops_per_step, in->graph_flops_per_step, in->peak_flops / 1e9, c->peak_source);
  printf("set up and compiled in %.1f s; training steps %lld..%lld\n", in->compile_s, (long long)in->start_step + 1,
         (long long)in->total_steps);
  printf("memory per process: params + optimizer state %.1f MiB; step buffers planned %.1f MiB (intermediates %.1f MiB)\n",
         in->state_bytes / 1048576.0, in->step_peak_bytes / 1048576.0, in->step_arena_bytes / 1048576.0);
  fflush(stdout);
}

static void hms(double s, char *buf, size_t cap) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void nb_cli_progress_step(void *ud, const nb_train_step_info *si) {
  nb_cli_progress *c = ud;
  if (si->logged) {
    enum { W = 20 };
    char bar[W + 1], el[32], eta[32];
    int fill = (int)(W * si->step / (si->total_steps ? si->total_steps : 1));
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    double done = (double)(si->step - c->start_step);
    hms(si->elapsed_s, el, sizeof el);
    /* the rate of this process's steps (elapsed_s also counts earlier runs) */
    hms(done > 0 ? (double)(si->total_steps - si->step) * (nb_util__now_s() - c->t_start) / done : 0, eta, sizeof eta);
    printf("step %6lld/%lld [%s] loss %.4f  lr %.2e  gnorm %.3f | %7.0f tok/s  MFU %5.2f%% | %s elapsed, ETA %s\n",
           (long long)si->step, (long long)si->total_steps, bar, si->loss, si->lr, si->grad_norm, si->tokens_per_s,
           100 * si->mfu, el, eta);
  }
  if (si->has_eval && isfinite(c->entropy))
    printf("eval  %6lld  eval_loss %.4f (unigram entropy %.4f)\n", (long long)si->step, si->eval_loss, c->entropy);
  else if (si->has_eval)
    printf("eval  %6lld  eval_loss %.4f\n", (long long)si->step, si->eval_loss);
  fflush(stdout);
}

int nb_cli_threads(const char *cmd, int threads) {
  const char *env_threads = getenv("NABLA_THREADS");
  int64_t t;
  if (threads <= 0 && env_threads && *env_threads) {
    if (!nb_cli_int(cmd, "$NABLA_THREADS", env_threads, 1, 65536, &t)) return 0;
    threads = (int)t;
  }
  return threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

int nb_cli_train_args_parse(const char *cmd, const char *usage, const char *section, int argc, char **argv,
                            nb_cli_train_args *a) {
  memset(a, 0, sizeof *a);
  a->over = calloc((size_t)argc + 1, sizeof *a->over);
  a->sec_over = calloc((size_t)argc + 1, sizeof *a->sec_over);
  if (!a->over || !a->sec_over) return nb_cli_train_args_free(a), 1;
  int rc = -1;
  for (int i = 1; i < argc && rc < 0; i++) {
    const char *x = argv[i];
    bool has_next = i + 1 < argc;
    int64_t t;
    if (!strcmp(x, "-h") || !strcmp(x, "--help")) rc = nb_cli_usage(usage, true);
    else if (!strcmp(x, "--run-dir") && has_next) a->run_dir = argv[++i];
    else if (!strcmp(x, "--peak-gflops")) {
      if (!nb_cli_float(cmd, x, has_next ? argv[++i] : NULL, 1e-6, 1e12, &a->peak_flops)) rc = 2;
      a->peak_flops *= 1e9;
    } else if (!strcmp(x, "--threads")) {
      if (!nb_cli_int(cmd, x, has_next ? argv[++i] : NULL, 1, 65536, &t)) rc = 2;
      a->threads = (int)t;
    } else if (!strcmp(x, "--layout") && !strcmp(cmd, "train")) {
      a->layout = true;
    } else if (x[0] == '-') {
      fprintf(stderr, "nabla %s: unknown or incomplete option '%s'\n", cmd, x);
      rc = nb_cli_usage(usage, false);
    } else if (strchr(x, '=')) {
      if (section && !strncmp(x, section, strlen(section))) a->sec_over[a->n_sec_over++] = x;
      else a->over[a->n_over++] = x;
    } else if (!a->config) {
      a->config = x;
    } else {
      fprintf(stderr, "nabla %s: a second config '%s' (overrides are key=value)\n", cmd, x);
      rc = nb_cli_usage(usage, false);
    }
  }
  if (rc >= 0) nb_cli_train_args_free(a);
  return rc;
}

void nb_cli_train_args_free(nb_cli_train_args *a) {
  free(a->over);
  free(a->sec_over);
  a->over = a->sec_over = NULL;
}

void nb_cli_train_run_dir(const nb_cli_train_args *a, char *dir, size_t cap) {
  if (a->run_dir) {
    snprintf(dir, cap, "%s", a->run_dir);
    return;
  }
  if (!a->config) {
    snprintf(dir, cap, "runs/default");
    return;
  }
  const char *b = strrchr(a->config, '/') ? strrchr(a->config, '/') + 1 : a->config;
  snprintf(dir, cap, "runs/%.*s", (int)strcspn(b, "."), b);
}

int nb_cmd_train(int argc, char **argv) {
  nb_cli_train_args args;
  int prc = nb_cli_train_args_parse("train", usage_text, NULL, argc, argv, &args);
  if (prc >= 0) return prc;
  const char *config = args.config, **over = args.over;
  int n_over = args.n_over, threads = args.threads;
  bool layout = args.layout;
  double peak = args.peak_flops;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return nb_cli_train_args_free(&args), 1;
  nb_train_config cfg;
  nb_status s = config ? nb_train_config_load(ctx, config, n_over, over, &cfg)
                       : nb_train_config_parse(ctx, "<default config>", default_yaml, sizeof default_yaml - 1, 0, NULL, &cfg);
  if (!config && !s) {
    /* the default's model keys are no claim about an init_from model: only the overrides' are */
    cfg.model_keys_set = 0;
    for (int i = 0; !s && i < n_over; i++) s = nb_train_config_set(ctx, &cfg, over[i]);
    if (!s) s = nb_train_config_validate(ctx, &cfg);
  }
  nb_cli_train_args_free(&args);
  if (s) {
    fprintf(stderr, "nabla train: %s\n", nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return 1;
  }
  if (layout) { /* one process, no MPI: the layout is the config's */
    s = nb_train_print_layout(ctx, &cfg, stdout);
    if (s) fprintf(stderr, "nabla train: %s\n", nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return s ? 1 : 0;
  }
  /* data parallel / FSDP / expert / tensor parallel: the job's processes as the mesh axes "data" x "fsdp" x
   * "expert" x "tensor" */
  nb_dist_mesh *mesh = NULL;
  const char *world = getenv("OMPI_COMM_WORLD_SIZE");
  long long procs = (long long)(cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.expert * cfg.mesh.tensor);
  if (procs == 1 && world && atoi(world) > 1) {
    fprintf(stderr, "nabla train: started as %s MPI processes but mesh.data=1, mesh.fsdp=1, mesh.expert=1, mesh.tensor=1: "
            "set mesh.data=%s, mesh.fsdp=%s, mesh.expert=%s or mesh.tensor=%s (and grad_accum to a multiple of "
            "mesh.data x mesh.fsdp x mesh.expert), or run one process\n",
            world, world, world, world, world);
    nb_ctx_destroy(ctx);
    return 1;
  }
  if (procs > 1) {
    const char *axes[4] = {"data", "fsdp", "expert", "tensor"};
    int64_t sizes[4] = {cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.expert, cfg.mesh.tensor};
    if (nb_dist_init(ctx, NULL, NULL) || !(mesh = nb_dist_mesh_create(ctx, 4, axes, sizes)) || nb_dist_mesh_bind(mesh, ctx)) {
      fprintf(stderr, "nabla train: mesh.data=%lld, mesh.fsdp=%lld, mesh.expert=%lld, mesh.tensor=%lld: %s\n",
              (long long)cfg.mesh.data, (long long)cfg.mesh.fsdp, (long long)cfg.mesh.expert, (long long)cfg.mesh.tensor,
              nb_ctx_error(ctx));
      if (nb_dist_size() > 1) nb_dist_abort(1, "nabla train: the mesh could not be set up");
      nb_ctx_destroy(ctx);
      return 1;
    }
  }
  /* the whole job as one axis: its checkpoints are one (every process writes its shards) */
  nb_comm *job = mesh ? nb_dist_world(ctx) : NULL;
  if (job) nb_ctx_bind_axis(ctx, "job", job);
  int rank = nb_dist_rank();
  char dir[1024];
  nb_cli_train_run_dir(&args, dir, sizeof dir);
  threads = nb_cli_threads("train", threads);
  if (!threads) return nb_ctx_destroy(ctx), 2;
  nb_cli_progress c = {0};
  nb_prof_peak pk; /* c.peak_source may point into it for the whole run */
  peak = nb_cli_progress_peak(&c, &pk, threads, peak);
  if (rank == 0)
    printf("nabla train: run dir %s, config %s, %d threads%s\n", dir,
           config ? config : "<default: gpt2-tiny on data/corpus/kjv.txt>", threads,
           !mesh                 ? ""
           : cfg.mesh.fsdp > 1   ? " per process, FSDP over the mesh.data x mesh.fsdp processes"
           : cfg.mesh.expert > 1 ? " per process, experts split over mesh.expert, the batch over mesh.data x mesh.expert"
           : cfg.mesh.tensor > 1 ? " per process, tensor parallel over mesh.tensor processes (x mesh.data replicas)"
                                 : " per process, data parallel over the processes of mesh.data");
  nb_train_opts o = {.run_dir = dir, .peak_flops = peak, .threads = threads, .handle_signals = true,
                     .on_start = rank ? NULL : nb_cli_progress_start, .on_step = rank ? NULL : nb_cli_progress_step, .ud = &c};
  nb_train_result r;
  s = nb_train_run(ctx, &cfg, &o, &r);
  int rc = 0;
  if (s) {
    if (mesh) fprintf(stderr, "nabla train: rank %d: %s\n", rank, nb_ctx_error(ctx));
    else fprintf(stderr, "nabla train: %s\n", nb_ctx_error(ctx));
    if (!config && strstr(nb_ctx_error(ctx), "data/corpus/kjv.txt"))
      fprintf(stderr, "hint: scripts/corpus.sh installs the default corpus\n");
    rc = 1;
  } else if (rank > 0) {
    /* rank 0 reports */
  } else if (r.preempted && r.steps_run == 0) {
    printf("interrupted during set-up: nothing trained, checkpoints in %s/checkpoints unchanged\n", dir);
  } else if (r.preempted) {
    printf("interrupted: checkpoint at step %lld in %s/checkpoints; run the same command to resume\n",
           (long long)r.final_step, dir);
  } else {
    printf("done: step %lld, loss %.4f, eval loss %.4f, unigram entropy %.4f nats/token; step %.1f ms (median), "
           "loop iteration %.1f ms (median)\n",
           (long long)r.final_step, r.final_loss, r.last_eval_loss, c.entropy, r.exe_ms_median, r.iter_ms_median);
  }
  char trace[1100];
  snprintf(trace, sizeof trace, "%s/profile/trace.json", dir);
  if (!s && cfg.profile.steps[0] && access(trace, F_OK) == 0) { /* profile.steps wrote one: its op table */
    printf("profile of steps %s: %s (open it in ui.perfetto.dev), %s/profile.html; its slowest compiled steps:\n", cfg.profile.steps,
           trace, dir);
    if (nb_prof_trace_table(ctx, trace, stdout, 15, peak)) fprintf(stderr, "nabla train: %s\n", nb_ctx_error(ctx));
    nb_cli_print_viewers(stdout, "profile", trace);
  }
  if (mesh && rc) nb_dist_abort(rc, "nabla train failed on this rank: ending the job"); /* the others would wait */
  if (job) nb_ctx_bind_axis(ctx, "job", NULL);
  nb_dist_comm_destroy(job);
  nb_dist_mesh_destroy(mesh);
  nb_ctx_destroy(ctx);
  if (mesh) nb_dist_finalize();
  return rc;
}
