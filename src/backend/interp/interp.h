/* The interpreter as a backend (interp.c), private to src/backend/ and its
 * tests: the backend itself and counters of what went through it. */
#ifndef NABLA_BACKEND_INTERP_H
#define NABLA_BACKEND_INTERP_H

#include <stdint.h>

extern const struct nb_backend nb_interp__backend;

/* Process-wide, since the process started. */
typedef struct nb_interp_counters {
  uint64_t compiles, launches, library_calls, library_asked;
  uint64_t allocs, frees, bytes_to_device, bytes_to_host;
  uint64_t host_reads;           /* to_host calls (outputs, staged operands, a loop's predicate, a cond's index) */
  uint64_t copies, bytes_copied; /* device to device (a loop's carry, a body's passed-through outputs) */
  uint64_t foreign_pointers; /* pointers given to a step that are not in its memory (a runtime bug) */
} nb_interp_counters;
void nb_interp__counters(nb_interp_counters *out);

#endif
