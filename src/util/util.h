/* Small helpers that every library shares: clocks, directories, whole files,
 * CRC-32C. libc and threads only, below the core (no nb_ctx: callers turn
 * the errno values into their own errors). Internal: not in include/nabla. */
#ifndef NABLA_UTIL_H
#define NABLA_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC, for durations. */
int64_t nb_util__now_ns(void);
double nb_util__now_s(void);
double nb_util__now_ms(void);
/* CLOCK_REALTIME in seconds since the epoch, for timestamps. */
double nb_util__wall_s(void);

/* Creates path and its missing parents with mode (existing directories are
 * fine). Returns 0, or an errno value with the prefix that failed in
 * failed[cap] (ENOTDIR: a file of that name is in the way; ENAMETOOLONG).
 * before_mkdir, when not NULL, runs before each mkdir and fails it (EIO)
 * when it returns nonzero: the checkpoint crash tests inject faults there. */
int nb_util__mkdir_p(const char *path, unsigned mode, int (*before_mkdir)(void), char *failed, size_t cap);

/* The whole of a regular file in a new malloc'ed, NUL-terminated buffer
 * (free() it). Returns 0, or an errno value: EISDIR / EINVAL (not a regular
 * file), EFBIG (over max bytes), ENOMEM, or fopen's / fread's. */
int nb_util__read_file(const char *path, size_t max, char **data, size_t *len);

/* CRC-32C (Castagnoli), as TFRecord and the record files use. */
uint32_t nb_util__crc32c(const void *p, size_t n);

/* Compiler portability for kernels (gcc and clang; scripts/fuzz.sh builds
 * with clang). NB_FP_CONTRACT_OFF, at file scope: no fusing of a * b + c
 * into one rounding in the functions that follow (gcc contracts by default
 * in C), so a kernel's vector and scalar forms give the same bits.
 * NB_TARGET_BEGIN("avx2,fma") ... NB_TARGET_END: the functions between are
 * compiled for that ISA (gcc's target pragma, clang's attribute push). */
#define NB__PRAGMA(x) _Pragma(#x)
#ifdef __clang__
#define NB_FP_CONTRACT_OFF _Pragma("STDC FP_CONTRACT OFF")
#define NB_TARGET_BEGIN(t) NB__PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define NB_TARGET_END _Pragma("clang attribute pop")
#else
#define NB_FP_CONTRACT_OFF _Pragma("GCC optimize(\"fp-contract=off\")")
#define NB_TARGET_BEGIN(t) _Pragma("GCC push_options") NB__PRAGMA(GCC target(t))
#define NB_TARGET_END _Pragma("GCC pop_options")
#endif

#endif
