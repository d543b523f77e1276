/* The executable, private to the compiler driver (compile/jit.c) and the
 * runtime (runtime/exe.c): the plan nb_jit built, the backend module it was
 * compiled into, and what running it needs. */
#ifndef NABLA_RUNTIME_EXE_H
#define NABLA_RUNTIME_EXE_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/backend.h"
#include "compile/jit.h"

struct nb_exe {
  nb_ctx *ctx;
  int refs;               /* guarded by the memory cache's lock (compile/jit.c) */
  uint64_t key;
  nb_exe *link;           /* memory cache list */
  nb_jit_config cfg;
  nb_jit_arena ar;
  nb_jplan plan;
  nb_graph *graph;        /* the simplified graph (owned) */
  nb_backend_module *mod; /* the plan compiled by cfg.backend; NULL: the graph runs on the interpreter */
  nb_backend_build build;
  bool native;            /* mod != NULL */
  double compile_ms;
  double phase_ms[5];     /* simplify, fuse, buffers, codegen, C compiler or disk cache + load */
  int max_args;           /* the most device pointers one step takes */
  pthread_mutex_t mu;     /* guards the arena, the stats and `runs` */
  void *arena;
  size_t arena_cap;
  uint64_t runs;
  _Atomic int64_t trace_serial;   /* its number in traces (describe.c), from its first traced run */
  _Atomic uint64_t trace_noted;   /* the trace session it was last described in */
};

/* runtime/describe.c: the reference of e's step 0 in trace spans (step i
 * adds i), and e's note of its steps (source ops, parameter paths), made
 * once per trace session. */
int64_t nb_rt__trace_ref(nb_exe *e);
void nb_rt__trace_note(nb_exe *e);

/* runtime/exe.c */
nb_status nb_rt__run(nb_exe *e, nb_array *const *in, nb_array **out);
/* Frees what nb_jit built (not the memory-cache entry). */
void nb_rt__exe_free(nb_exe *e);
/* Logs the per-step table of the last run at NB_LOG_INFO. */
void nb_rt__log_steps(const nb_exe *e);

/* Running a plan on bound memory (a control step's body, once per
 * iteration): a frame holds what one run needs (pointer table, arena, step
 * times, the body's constants in device memory) so that iterations
 * allocate and copy in nothing. in[i]/out[i]: the device memory of
 * input/output i; outputs must not overlap the inputs or each other. */
typedef struct nb_rt_frame {
  char **ptr, **args;
  double *ms;       /* per step, summed over the runs since the frame opened */
  char *arena;
  char *consts;     /* device copies of the constants, when memory is not the host's */
  size_t nptr, nargs, nms, arena_bytes, consts_bytes;
} nb_rt_frame;
nb_status nb_rt__frame_open(nb_exe *e, nb_rt_frame *f);
nb_status nb_rt__run_frame(nb_exe *e, nb_rt_frame *f, char *const *in, char *const *out);
/* Moves the frame's step times into e's statistics (last: the runs since
 * the previous flush, summed), counting `runs` runs. */
void nb_rt__frame_flush(nb_exe *e, nb_rt_frame *f, uint64_t runs);
void nb_rt__frame_close(nb_exe *e, nb_rt_frame *f);
/* runtime/control.c: runs a CONTROL step on the parent's buffers. */
nb_status nb_rt__run_control(nb_exe *e, const nb_jstep *step, char **ptr);

#endif
