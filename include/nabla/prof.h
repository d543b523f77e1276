/* nabla prof: what a training run leaves behind for people to look at (the
 * analogue of XProf's TensorBoard side): TensorBoard event files of scalars,
 * and a self-contained HTML report drawn from a run's metrics.jsonl.
 *
 * Event files. nb_prof_tb_create opens a new file in logdir named as
 * TensorBoard's own writers name theirs, so `tensorboard --logdir` (or any
 * reader of the format) picks it up; each nb_prof_tb_scalar appends one Event
 * record. The format (TFRecord framing around Event protobufs, encoded by
 * hand) is described in docs/prof.md.
 *
 * Report. nb_prof_report_html turns a metrics.jsonl (one JSON object per line,
 * with "step" and numeric fields) into one HTML file with inline SVG plots and
 * a summary table; it needs no network and no JavaScript to read.
 *
 * Example: log two scalars per step, then draw the report.
 *
 *   nb_prof_tb *tb = nb_prof_tb_create(ctx, "runs/x/tb");
 *   if (!tb) fail(nb_ctx_error(ctx));
 *   for (int64_t step = 0; step < n_steps; step++) {
 *     ... train, append {"step":..,"loss":..,"lr":..} to runs/x/metrics.jsonl ...
 *     nb_prof_tb_scalar(tb, "train/loss", step, loss);
 *     nb_prof_tb_scalar(tb, "train/lr", step, lr);
 *   }
 *   nb_prof_tb_destroy(tb);
 *   nb_prof_report_html(ctx, "runs/x/metrics.jsonl", "runs/x/report.html", "run x");
 *
 * Threads: a writer is used from one thread at a time.
 */
#ifndef NABLA_PROF_H
#define NABLA_PROF_H

#include "nabla/export.h"
#include "nabla/compile.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* TensorBoard event files                                                   */
/* ------------------------------------------------------------------------ */

typedef struct nb_prof_tb nb_prof_tb;

/* Creates logdir (and its parents) if needed and a new event file in it named
 * events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<counter>,
 * where counter is the smallest number >= 0 that makes the name new (the file
 * is created exclusively, so two writers never share a file). The first record
 * is the file_version event "brain.Event:2". Borrows ctx (it must outlive the
 * writer) and logdir. Returns a new writer, or NULL with an error on ctx
 * (NB_ERR_IO naming the path when logdir cannot be created or written). */
nb_prof_tb *nb_prof_tb_create(nb_ctx *ctx, const char *logdir);

/* Appends one scalar event: wall time now, step, Summary{tag, simple_value}.
 * value is stored as a 32-bit float (the format's simple_value); NaN and
 * infinities are stored as they are. tag is a non-empty UTF-8 string (borrowed;
 * TensorBoard cannot read a file with any other).
 * Writes are buffered: call nb_prof_tb_flush to make them visible to readers.
 * After a write error the writer stays in error: later calls return it again. */
nb_status nb_prof_tb_scalar(nb_prof_tb *w, const char *tag, int64_t step, double value);

/* Hands the buffered records to the operating system (fflush), so a reader
 * such as TensorBoard sees them and a crash of this process loses nothing.
 * No fsync: that is done once, by nb_prof_tb_destroy. */
nb_status nb_prof_tb_flush(nb_prof_tb *w);

/* The event file's path; returns a pointer valid until nb_prof_tb_destroy. */
const char *nb_prof_tb_path(const nb_prof_tb *w);

/* Flushes, fsyncs, closes and frees w. NULL is a no-op. A failure here is
 * recorded on the writer's context (nothing is returned). */
void nb_prof_tb_destroy(nb_prof_tb *w);

/* ------------------------------------------------------------------------ */
/* HTML report                                                               */
/* ------------------------------------------------------------------------ */

/* Reads metrics_jsonl, one JSON object per line, each with a numeric "step"
 * and any numeric fields (loss, eval_loss, lr, grad_norm, tokens_per_s, mfu,
 * and others, which get plots of their own); strings, booleans and nulls are
 * skipped and blank lines ignored (JSON has no NaN: write null). Writes out_html: a self-contained page
 * (inline SVG and CSS, no script, no network) titled `title` (NULL: the file
 * name), with plots against step of loss with eval_loss, learning rate,
 * gradient norm, throughput and every other field, and a summary table (records,
 * step range, last and minimum loss, mean tokens/s, and last/min/max/mean of each field).
 * An empty file gives a page that says there are no metrics yet. The page is
 * written atomically (a temporary file in the same directory, then rename).
 * Errors: NB_ERR_IO naming the path; NB_ERR_FORMAT as
 * "<metrics_jsonl>:<line>: <what is wrong>" for a malformed line. Borrows all
 * arguments. */
nb_status nb_prof_report_html(nb_ctx *ctx, const char *metrics_jsonl, const char *out_html, const char *title);

/* ------------------------------------------------------------------------ */
/* Traces (the trace viewer's input)                                         */
/* ------------------------------------------------------------------------ */

/* A trace records timed spans on a track per thread while it is on: every
 * step of every executable that runs (a fused kernel "k12 add+mul+exp", a
 * GEMM "dot_general", an evaluated or control step: category "kernel",
 * "gemm", "eval", "control", with the step's source ops, where the first of
 * them was traced, its FLOPs and bytes as args), nb_jit's compiles
 * ("compile"), the data pipeline's waits for a batch ("data"), checkpoint
 * saves ("ckpt"), the trainer's steps ("train") and the spans user code
 * opens with nb_prof_scope_begin/end ("user"). nb_prof_stop writes them as
 * Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open,
 * and beside it a summary (slices and total time per name) that
 * scripts/prof_trace_peer.py checks against Perfetto's trace processor.
 * Format and names: docs/prof.md, "Traces".
 *
 * Example: trace three steps of a loop, with a span of one's own.
 *
 *   if (nb_prof_start(ctx, &(nb_prof_trace_opts){.path = "out/trace.json"})) fail(nb_ctx_error(ctx));
 *   for (int i = 0; i < 3; i++) {
 *     nb_prof_scope_begin("my step");
 *     nb_exe_run(exe, in, out);
 *     nb_prof_scope_end();
 *   }
 *   if (nb_prof_stop(ctx)) fail(nb_ctx_error(ctx));
 *
 * Off (the default), recording costs one relaxed atomic load and a branch
 * per site. One trace at a time per process; any thread may start or stop it. */

typedef struct nb_prof_trace_opts {
  const char *path;   /* the trace file nb_prof_stop writes (its directory is created now) */
  int64_t max_events; /* events kept, at about 400 bytes each (<= 0: 1 << 20); later ones are
                       * dropped and counted in the summary */
  double peak_flops;       /* the roofline's compute roof in the op profile (<= 0: nb_prof_peak_flops(0)) */
  double peak_bytes_per_s; /* ... its memory roof (<= 0: nb_prof_peak_bandwidth(0)) */
  const char *html_path;   /* the profile page nb_prof_stop draws (nb_prof_profile_html); NULL:
                            * profile.html in the trace's folder */
} nb_prof_trace_opts;

/* Starts recording: drops what an earlier trace left and turns tracing on.
 * Errors: NB_ERR_INVALID_ARG (no path, or a trace is already on: "a trace
 * is already being recorded into PATH"), NB_ERR_IO (the directory of path
 * cannot be created). Copies what it keeps of opts. */
nb_status nb_prof_start(nb_ctx *ctx, const nb_prof_trace_opts *opts);

/* Stops recording and writes the trace file (atomically) and beside it
 * the summary: PATH with its ".json" replaced by ".summary.json" (or with
 * that appended), the op profile (".ops.json": every compiled step's time,
 * source ops, parameter paths, cost, rates and roofline position against
 * the peaks of opts; docs/prof.md) and the profile page (html_path). Errors: NB_ERR_INVALID_ARG when no trace is on, NB_ERR_IO
 * that appended); when compiled executables ran or the serving engine
 * planned steps, also .memory.json, .memory.html and .graph.svg (the
 * memory and graph viewers, below). Errors: NB_ERR_INVALID_ARG when no trace is on, NB_ERR_IO
 * naming the file; tracing is off after either. */
nb_status nb_prof_stop(nb_ctx *ctx);

/* Whether a trace is being recorded. */
bool nb_prof_tracing(void);

/* A step range "A-B" or one step "A" (1 <= A <= B; decimal) into
 * *first..*last: the trainer's profile.steps, generate's and serve's
 * --profile-steps. False (both 0) when s is NULL, empty or malformed. */
bool nb_prof_parse_steps(const char *s, int64_t *first, int64_t *last);

/* A span of one's own on this thread's track, category "user": begin
 * opens it, end closes the innermost one open (scopes nest, up to 32 deep).
 * name is copied (63 bytes kept). No-ops when no trace is on. */
void nb_prof_scope_begin(const char *name);
void nb_prof_scope_end(void);

/* Names this thread's track (and, 15 bytes of it, the thread). */
void nb_prof_thread_name(const char *name);

/* The op table of a written trace, from its op profile (<trace>.ops.json):
 * a line with each family's share and one with the roofs and the floor,
 * then the compiled steps (kernels, GEMMs, evaluated equations), slowest
 * first (top > 0: that many rows), with total ms, share, count, mean us,
 * achieved GFLOP/s (and its share of peak_flops; <= 0: the profile's
 * roof), GB/s, FLOP/byte, the bound (memory or compute) and the share of
 * that roof reached, the name and source ops, and the parameter paths
 * read. Errors: NB_ERR_IO (no op profile beside trace_path), NB_ERR_FORMAT
 * (not one). */
nb_status nb_prof_trace_table(nb_ctx *ctx, const char *trace_path, FILE *out, int top, double peak_flops);

/* ------------------------------------------------------------------------ */
/* The profile page                                                          */
/* ------------------------------------------------------------------------ */

/* A section of the profile page from another viewer: an anchor id, a
 * heading and its markup (HTML, inserted as it is: self-contained, no
 * scripts or styles fetched from elsewhere). */
typedef struct nb_prof_html_section {
  const char *id, *title, *html;
} nb_prof_html_section;

/* Draws the profile of a written trace (its op profile, <trace>.ops.json)
 * as one self-contained HTML page (inline CSS, SVG and script; nothing
 * fetched, so it opens offline): the totals and the floor (every step at
 * its roof), the roofline (log-log: a point per compiled step, the memory
 * and compute roofs of the measured peaks), time per family, the op table
 * (sortable by any column) with each step's source ops and parameter
 * paths, the step timeline's summary, then the extra sections in order.
 * Written atomically. nb_prof_stop draws one (nb_prof_trace_opts.html_path).
 * Errors: NB_ERR_IO (no op profile beside trace_path), NB_ERR_FORMAT (not
 * one), NB_ERR_INVALID_ARG. */
nb_status nb_prof_profile_html(nb_ctx *ctx, const char *trace_path, const char *out_html, const char *title,
                               const nb_prof_html_section *extra, size_t nextra);
/* Memory viewer and graph viewer                                            */
/* ------------------------------------------------------------------------ */

/* The memory an executable's run uses over its schedule of steps (the
 * analogue of XProf's memory viewer): each buffer with its kind (input,
 * constant, temp: an intermediate in the arena, output; body: the arenas of
 * a control step's bodies), arena offset, size, the steps it is live over
 * and what it is (the input path it is or is a layout copy of, else the
 * equation that computes it and where that was traced); the live bytes at
 * each step, the peak (bytes and the first step at it) and what is live
 * there, largest first and summed by source. Inputs, constants and outputs
 * count for the whole run (outputs are allocated before the first step);
 * an output written into a donated input counts once, as the input.
 * Format: docs/prof.md, "Memory viewer". While a trace is recorded, every
 * executable that runs is kept this way (copied at its first run) and
 * nb_prof_stop writes them beside the trace: TRACE.memory.json (with the
 * serving engine's KV blocks), TRACE.memory.html (a page of the sections
 * below) and TRACE.graph.svg (the executable that ran longest). Borrow their arguments. Errors:
 * NB_ERR_INVALID_ARG (NULL), NB_ERR_NOMEM, NB_ERR_IO (a write error on out).
 *
 * nb_prof_memory_json: {"format":"nabla-memory/1","executables":[one]}.
 * nb_prof_memory_html: an HTML fragment (a <section>, no page around it):
 *   the live bytes per step with the peak marked and the arena as
 *   rectangles over step x offset (inline SVG), and tables of what is live
 *   at the peak. */
nb_status nb_prof_memory_json(nb_ctx *ctx, const nb_exe *exe, FILE *out);
nb_status nb_prof_memory_html(nb_ctx *ctx, const nb_exe *exe, FILE *out);

/* The executable's steps as a graph (the analogue of XProf's graph viewer):
 * a node per step (fused kernel, library call, evaluated or control step,
 * named as in traces), an edge per buffer one step writes and a later one
 * reads, labelled with its type and size, in layers from the inputs down.
 * nb_prof_graph_svg writes a standalone SVG document; nb_prof_graph_html an
 * HTML <section> with the same SVG inline. Same arguments and errors as
 * nb_prof_memory_json. */
nb_status nb_prof_graph_svg(nb_ctx *ctx, const nb_exe *exe, FILE *out);
nb_status nb_prof_graph_html(nb_ctx *ctx, const nb_exe *exe, FILE *out);

/* The same sections from what nb_prof_stop wrote beside a trace, for a
 * report drawn after it (the profile's HTML page): nb_prof_trace_memory_html
 * reads TRACE.memory.json and writes the KV cache's section (when the
 * serving engine ran) and one memory section per executable, most run time
 * first (max_executables > 0: at most that many); nb_prof_trace_graph_html
 * writes TRACE.graph.svg (the executable that ran longest) inside a
 * section. A trace under which nothing ran has no such files: they write
 * nothing and return NB_OK. Errors: NB_ERR_IO (unreadable), NB_ERR_FORMAT
 * (not what nb_prof_stop writes), both naming the file. */
nb_status nb_prof_trace_memory_html(nb_ctx *ctx, const char *trace_path, int max_executables, FILE *out);
nb_status nb_prof_trace_graph_html(nb_ctx *ctx, const char *trace_path, FILE *out);

/* ------------------------------------------------------------------------ */
/* Peak FLOP/s (what MFU is relative to)                                     */
/* ------------------------------------------------------------------------ */

/* The widest vector ISA this CPU has and nabla's generated kernels use
 * (they are compiled with -march=native): "avx512f", "avx2+fma", "sse2",
 * "neon" or "scalar". */
const char *nb_prof_isa(void);

typedef struct nb_prof_peak {
  double flops;       /* f32 FLOP/s (nb_prof_peak_flops; 0 from nb_prof_peak_bandwidth) */
  double bytes_per_s; /* memory bandwidth (nb_prof_peak_bandwidth; 0 from nb_prof_peak_flops) */
  int threads;        /* threads it was measured with */
  char source[1200];  /* "env NABLA_PEAK_GFLOPS", "measured (...), cached in PATH", "cached in PATH" */
} nb_prof_peak;

/* The f32 FMA peak of this machine with `threads` threads (<= 0:
 * $NABLA_THREADS, else the CPU count): $NABLA_PEAK_GFLOPS x 1e9 when set
 * (a positive number); else the value cached for this CPU model, ISA and
 * thread count in $XDG_CACHE_HOME/nabla/peak_flops.v3 (or ~/.cache/nabla/);
 * else measured by a short FMA-throughput loop (about 0.3 s: independent
 * fused multiply-adds at the vector width of nb_prof_isa, on every thread at
 * once, seven rounds, each thread timed by its own CPU clock so that a busy
 * machine does not lower it; the best round) and cached there. The
 * measurement counts the FMA units a core really has, so MFU is right on
 * AVX2 and AVX-512 machines alike. Never fails: a cache that cannot be read
 * or written only costs a new measurement. */
nb_prof_peak nb_prof_peak_flops(int threads);

/* The memory bandwidth (bytes/s) of this machine with `threads` threads,
 * in .bytes_per_s: $NABLA_PEAK_GBPS x 1e9 when set; else cached as above
 * in peak_bandwidth.v1; else measured (STREAM's scale kernel, counted as
 * bytes read + written like the cost rules, over twice the last-level
 * cache, five rounds timed as above, the best) and cached. The roofline's
 * memory roof. */
nb_prof_peak nb_prof_peak_bandwidth(int threads);

NB_END_DECLS

#endif
