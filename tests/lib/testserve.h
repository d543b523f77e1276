/* A `nabla serve` child for the command-line tests, and HTTP/1.1 requests
 * to it over loopback: what the serve, load and quantization tests share.
 * The server listens on port 0 and prints its port; it is stopped by its
 * PID (SIGTERM), never by name. */
#ifndef NABLA_TEST_TESTSERVE_H
#define NABLA_TEST_TESTSERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
  pid_t pid; /* -1: not running */
  int port;  /* 0: not listening */
} nb_test_server;

/* Runs `cd dir && ENV exec bin serve MODEL --port 0 --threads 1 ARGS` with
 * stdout and stderr in dir/serve.out and dir/serve.err (env: a prefix of
 * assignments, or NULL) and waits up to 60 s for the port in its first
 * line. false after a failed check that quotes serve.err (the child is
 * reaped or killed). */
bool nb_test_serve_start(nb_test_server *s, const char *bin, const char *dir, const char *env, const char *model,
                         const char *args);
/* SIGTERM, then checks that the server exits 0 within 20 s (else SIGKILL
 * and a failed check) and that its port is closed. */
void nb_test_serve_stop(nb_test_server *s);

/* One request with Connection: close (headers: whole "Name: value\r\n"
 * lines or NULL), read into dst[cap] until the server closes or timeout_s
 * pass. Returns the status (-1: no connection or no status line); *body_out
 * points at the body inside dst (or at ""). Safe from any thread. */
int nb_test_http(int port, const char *method, const char *path, const char *headers, const char *body, size_t body_len,
                 char *dst, size_t cap, const char **body_out, double timeout_s);
/* Reads fd until it is closed or timeout_s pass into dst[cap] (NUL-ended);
 * returns the bytes read. */
size_t nb_test_read_until_closed(int fd, char *dst, size_t cap, double timeout_s);

/* The value of a Prometheus sample ("name" or "name{labels}") at the start
 * of a line of text, -1 when absent. */
double nb_test_metric(const char *text, const char *name);

#endif
