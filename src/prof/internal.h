/* Private to the prof library: the two file-system helpers both halves need
 * (creating a directory with its parents, writing a file atomically). The
 * public API is include/nabla/prof.h; the formats are in docs/prof.md. */
#ifndef NABLA_PROF_INTERNAL_H
#define NABLA_PROF_INTERNAL_H

#include <pthread.h>

#include "nabla/prof.h"
#include "util/trace.h"

#define NB_PROF__PATH_CAP 4096

/* mkdir -p path: NB_ERR_IO naming the component that cannot be created or
 * that exists and is not a directory. */
nb_status nb_prof__mkdirs(nb_ctx *ctx, const char *path);

/* Writes n bytes to path through path.tmp.<pid> (write, fsync, rename), so a
 * reader sees the old file or the new one, never a part. */
nb_status nb_prof__write_atomic(nb_ctx *ctx, const char *path, const void *data, size_t n);

/* ---- traces (trace.c) and the op profile (opprof.c) ---- */

typedef struct nb_prof__track {
  int tid;
  char name[32];
  size_t first, n; /* its events in the collection's array */
} nb_prof__track;

/* What a trace recorded, collected at nb_prof_stop. */
typedef struct nb_prof__collection {
  nb_util__trace_event *ev;
  size_t n, cap;
  nb_prof__track *tracks;
  size_t ntracks, cap_tracks;
  bool oom;
  int64_t t_start; /* ns: the trace's ts 0 */
} nb_prof__collection;

/* The roofs of the roofline (0: unknown) and where they came from. */
typedef struct nb_prof__peaks {
  double flops, bytes_per_s;
  char flops_source[1200], bytes_source[1200];
} nb_prof__peaks;

/* <trace>.ops.json: trace_path with ".json" replaced (or that appended). */
void nb_prof__ops_path(const char *trace_path, char *out, size_t cap);
/* The op profile of c and the session's notes as JSON text (malloc'ed; NULL
 * when out of memory). Format: docs/prof.md, "Op profile". */
char *nb_prof__op_profile(const nb_prof__collection *c, const nb_prof__peaks *pk);
/* path with its ".json" replaced by suffix (".summary.json"), or suffix
 * appended when it does not end in ".json". */
void nb_prof__sibling_path(const char *path, const char *suffix, char *out, size_t cap);

/* kept.c: the executables that run while a trace is recorded, copied for
 * the memory and graph viewers. begin clears them and starts keeping
 * (nb_prof_start), end stops (nb_prof_stop), write writes PATH's siblings
 * .memory.json, .memory.html (with the KV blocks, view.h) and .graph.svg
 * (nothing when there is nothing to show), clear frees them. */
struct nb_prof__kv;
void nb_prof__kept_begin(void);
void nb_prof__kept_end(void);
nb_status nb_prof__kept_write(nb_ctx *ctx, const char *trace_path, const struct nb_prof__kv *kv);
void nb_prof__kept_clear(void);

/* text.c: s as a JSON string (quoted; control characters as spaces), and
 * as HTML/SVG text or attribute value (<>&"' escaped, control characters
 * as spaces); NULL writes nothing (JSON: ""). */
void nb_prof__json_str(FILE *f, const char *s);
void nb_prof__xml_text(FILE *f, const char *s);

#endif
