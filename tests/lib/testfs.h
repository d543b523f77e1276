/* Files, scratch directories and child commands for the tests: what the
 * library tests and the `nabla` command-line tests of every folder share.
 * Test code, not library code: a failure to make scratch space or write a
 * fixture prints why and exits, since the test cannot go on. */
#ifndef NABLA_TEST_TESTFS_H
#define NABLA_TEST_TESTFS_H

#include <stddef.h>

#include "test.h"

/* Makes a fresh directory $TMPDIR/nabla_<lib>_<tag>_XXXXXX (TMPDIR unset or
 * empty: /tmp) and writes its path into buf[cap]; exits when it cannot. */
void nb_test_scratch_dir(char *buf, size_t cap, const char *lib, const char *tag);
/* Removes path and everything below it; returns 0, or non-zero after
 * printing that it could not. */
int nb_test_rm_rf(const char *path);

/* The whole file as a new NUL-terminated malloc'ed buffer (the caller
 * frees it) with its length in *n_out when not NULL; NULL when unreadable. */
char *nb_test_read_file(const char *path, size_t *n_out);
/* Writes n bytes (nb_test_write_text: a string) as the whole file at path;
 * exits when it cannot. */
void nb_test_write_file(const char *path, const void *data, size_t n);
void nb_test_write_text(const char *path, const char *text);
/* Flips one byte of a file (xor 0x5a) at offset, from the end when
 * negative; exits when the file cannot be opened. */
void nb_test_flip_byte(const char *path, long offset);

/* The `nabla` command ctest built ($NABLA_BIN), or NULL after printing
 * that the test is skipped (run it through ctest). */
const char *nb_test_nabla_bin(void);
/* Runs a shell command, its stdout into out[cap] (NUL-terminated, cut at
 * cap - 1 bytes); returns its exit status, or -1 when it could not be run
 * or did not exit normally. Add " 2>&1" to the command to see stderr too. */
int nb_test_run(const char *cmd, char *out, size_t cap);
/* The same with stderr kept apart, in err[ecap]. */
int nb_test_run2(const char *cmd, char *out, size_t cap, char *err, size_t ecap);
/* nb_test_run2 of "cd 'dir' && prefix ARGS </dev/null", ARGS formatted from
 * fmt (the CLI tests' `nabla(...)`: prefix is the binary, perhaps after
 * environment settings). */
int nb_test_run_in(const char *dir, const char *prefix, char *out, size_t cap, char *err, size_t ecap, const char *fmt,
                   ...) __attribute__((format(printf, 7, 8)));

/* Seconds on the monotonic clock. */
double nb_test_now(void);
/* A TCP connection to 127.0.0.1:port, or -1. */
int nb_test_connect_loopback(int port);

#endif
