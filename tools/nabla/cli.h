/* What every `nabla` command shares: its usage text (to stdout with exit 0
 * when asked for with -h/--help, to stderr with exit 2 after a mistake),
 * strict numbers for flags, whole input files, and the refusal to write an
 * output over one of the command's own inputs. */
#ifndef NABLA_TOOL_CLI_H
#define NABLA_TOOL_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/quant.h"
#include "nabla/serve.h"

/* Whether argv[1..argc) holds -h or --help before any "--" (what follows "--" is another command's). */
bool nb_cli_help_asked(int argc, char **argv);
/* Prints text: to stdout returning 0 when asked, else to stderr returning 2. */
int nb_cli_usage(const char *text, bool asked);

/* Flag values through nb_parse_int / nb_parse_float; on failure prints
 * "nabla CMD: FLAG: why" (v NULL: "FLAG needs a value") and returns false. */
bool nb_cli_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
bool nb_cli_float(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);

/* The whole of a regular file (or stdin for NULL or "-") as a malloc'ed
 * buffer (NUL-terminated, length in *n); NULL after printing why ("is a
 * directory", a read error) with the command's name. */
char *nb_cli_read_input(const char *cmd, const char *path, size_t *n);

/* Refuses (prints why, returns false) an output path that is one of the
 * inputs or lies inside one (an input directory), compared by resolved path
 * (symlinks, "..") and by device and inode (hard links); an output that does
 * not exist yet is resolved through its nearest existing parent. With
 * out_is_dir (the command writes a whole directory), an input inside the
 * output is refused too. Inputs that do not exist are skipped. */
bool nb_cli_output_ok(const char *cmd, const char *out, bool out_is_dir, int n_in, const char *const *inputs);

/* Runs the command argv[0] (argc, argv as it takes them) with a trace
 * recorded into path (nb_prof_start/stop); returns its exit status (1 when
 * the trace cannot be started or written). tools/nabla/main.c. */
int nb_cli_run_traced(const char *path, int argc, char **argv);
/* Prints "CMD: memory viewer TRACE.memory.html, graph ... TRACE.graph.svg"
 * when nb_prof_stop wrote them beside trace (docs/prof.md). */
void nb_cli_print_viewers(FILE *f, const char *cmd, const char *trace);

/* --profile-steps A-B [--profile-out FILE] of generate and serve: a trace of
 * the serving engine's steps A..B (1-based, nb_serve_llm_steps), started
 * before step A and stopped after step B, or at exit when B never came
 * (tools/nabla/profile_steps.c; docs/prof.md, "Capturing one"). */
typedef struct nb_cli_prof_steps {
  int64_t first, last; /* 0: off */
  const char *path;    /* the trace; NULL: profile/trace.json */
  int state;           /* 0 not started, 1 recording, 2 done */
} nb_cli_prof_steps;
/* Parses the value of --profile-steps; false after printing
 * "nabla CMD: --profile-steps: ..." */
bool nb_cli_prof_steps_parse(const char *cmd, const char *v, nb_cli_prof_steps *p);
/* nb_serve_llm_step with p's trace started before and stopped after it
 * when its step is the range's first / last. A trace that cannot be
 * started or written is a warning on stderr; the step goes on. */
nb_status nb_cli_llm_step(const char *cmd, nb_cli_prof_steps *p, nb_ctx *ctx, nb_serve_llm *l, const nb_serve_event **ev,
                          int32_t *n);
/* Writes p's trace if it is still being recorded (the command ends before step B). */
void nb_cli_prof_steps_finish(const char *cmd, nb_cli_prof_steps *p, nb_ctx *ctx);

/* Whether path is a regular file starting with GGUF's magic. */
bool nb_cli_is_gguf(const char *path);
/* A model as the commands take one: a GGUF file, a run dir (config.yaml),
 * a Hugging Face folder (config.json, unless --config is given) or a
 * checkpoint step dir (config from --config or the run dir above it). */
typedef struct nb_model_loaded nb_model_loaded;
typedef struct nb_ctx nb_ctx;
int nb_cli_load_model(nb_ctx *ctx, const char *model, const char *config, nb_model_loaded *out);

/* The token ids of a text file as the model reads it: its tokenizer's ids
 * (no special tokens added), or the bytes when it has none (*ids malloc'ed). */
int nb_cli_text_ids(nb_ctx *ctx, const char *path, const nb_model_loaded *m, int32_t **ids, size_t *n);
/* A quantized model (linears as quant trees, nabla/quant.h) runs through
 * quant's linear hook: sets it in *mo with a plan of the model's quantized
 * linears in *plan (destroy it after the engine; NULL for a plain model).
 * Prints why and returns false on a malformed quantized tree. */
typedef struct nb_tree nb_tree;
typedef struct nb_ctx nb_ctx;
typedef struct nb_quant_plan nb_quant_plan;
typedef struct nb_serve_model_opts nb_serve_model_opts;
bool nb_cli_quant_hook(const char *cmd, nb_ctx *ctx, const nb_tree *params, nb_serve_model_opts *mo, nb_quant_plan **plan);
/* After nb_model_load_gguf: a Llama file's Q8_0 / Q4_0 / Q6_K linears are
 * put back into m->params as int8 g32 / int4 g32 / int8 g16 quant trees of
 * the file's own codes and scales, run with activations act (NB_QUANT_ACT_INT8_BLOCK: llama.cpp's
 * arithmetic, the default of generate and serve; NB_QUANT_ACT_NONE:
 * weight-only); the others stay f32. *n_quantized says how many. */
typedef struct nb_model_loaded nb_model_loaded;
int nb_cli_gguf_keep_quantized(nb_ctx *ctx, const char *path, nb_model_loaded *m, nb_quant_act act, int64_t *n_quantized);

/* The trainer's progress lines (`nabla train`, `nabla sft`): on_start and
 * on_step of nb_train_opts with ud a progress (peak_source set by the caller). */
typedef struct nb_cli_progress {
  const char *peak_source;
  double t_start;
  double entropy;
  int64_t start_step;
} nb_cli_progress;
typedef struct nb_train_start_info nb_train_start_info;
typedef struct nb_train_step_info nb_train_step_info;
void nb_cli_progress_start(void *ud, const nb_train_start_info *in);
/* The peak FLOP/s MFU is against: flag_peak (--peak-gflops) when > 0, else
 * this machine's measured one (cached) into *pk; c->peak_source names it
 * (it may point into *pk: keep pk alive as long as c). */
typedef struct nb_prof_peak nb_prof_peak;
double nb_cli_progress_peak(nb_cli_progress *c, nb_prof_peak *pk, int threads, double flag_peak);
void nb_cli_progress_step(void *ud, const nb_train_step_info *si);
/* --threads N, else $NABLA_THREADS, else the CPU count; 0 after printing why. */
int nb_cli_threads(const char *cmd, int flag_threads);

/* The arguments of the training commands (train, sft, dpo): CONFIG,
 * --run-dir DIR, --threads N, --peak-gflops G and key=value overrides;
 * those that start with section (e.g. "pref."; NULL: none) are kept apart
 * in sec_over. The strings are argv's. */
typedef struct nb_cli_train_args {
  const char *config, *run_dir;
  int threads;       /* 0: not given */
  double peak_flops; /* --peak-gflops x 1e9; 0: not given */
  const char **over, **sec_over;
  int n_over, n_sec_over;
  bool layout;       /* nabla train --layout: print the sharded layout and exit */
} nb_cli_train_args;
/* Parses argv[1..] into *a; returns -1 to go on, else the command's exit
 * status (0 after --help, 2 after a usage message). */
int nb_cli_train_args_parse(const char *cmd, const char *usage, const char *section, int argc, char **argv,
                            nb_cli_train_args *a);
void nb_cli_train_args_free(nb_cli_train_args *a);
/* --run-dir, else runs/<the config's file name up to its first dot>, else
 * runs/default. */
void nb_cli_train_run_dir(const nb_cli_train_args *a, char *dir, size_t cap);

#endif
