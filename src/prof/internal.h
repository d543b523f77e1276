/* Private to the prof library: the two file-system helpers both halves need
 * (creating a directory with its parents, writing a file atomically). The
 * public API is include/nabla/prof.h; the formats are in docs/prof.md. */
#ifndef NABLA_PROF_INTERNAL_H
#define NABLA_PROF_INTERNAL_H

#include "nabla/prof.h"

#define NB_PROF__PATH_CAP 4096

/* mkdir -p path: NB_ERR_IO naming the component that cannot be created or
 * that exists and is not a directory. */
nb_status nb_prof__mkdirs(nb_ctx *ctx, const char *path);

/* Writes n bytes to path through path.tmp.<pid> (write, fsync, rename), so a
 * reader sees the old file or the new one, never a part. */
nb_status nb_prof__write_atomic(nb_ctx *ctx, const char *path, const void *data, size_t n);

#endif
