/* Private to compile/control.c and runtime/control.c: what a CONTROL step
 * owns. */
#ifndef NABLA_COMPILE_CONTROL_H
#define NABLA_COMPILE_CONTROL_H

#include <pthread.h>

#include "compile/jit.h"
#include "runtime/exe.h"


struct nb_jcontrol {
  nb_exe **sub;           /* cond: the branches; while_loop: predicate, body; scan: body */
  int nsub;
  size_t scratch_bytes;   /* device memory: a loop's second carry buffer (each carry 64-byte aligned), then a while loop's predicate */
  size_t pred_offset;     /* where in scratch the predicate writes its bool */
  pthread_mutex_t mu;     /* one run at a time uses what follows; others bring their own */
  bool opened;            /* frames[i] of sub[i] and scratch are allocated */
  nb_rt_frame *frames;
  char *scratch;
};

#endif
