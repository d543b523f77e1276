/* Files, scratch directories and child commands for the tests (see
 * testfs.h). */
#include "testfs.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void nb_test_scratch_dir(char *buf, size_t cap, const char *lib, const char *tag) {
  const char *base = getenv("TMPDIR");
  snprintf(buf, cap, "%s/nabla_%s_%s_XXXXXX", base && *base ? base : "/tmp", lib, tag);
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    exit(1);
  }
}

int nb_test_rm_rf(const char *path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "could not remove %s\n", path);
  return rc;
}

char *nb_test_read_file(const char *path, size_t *n_out) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *p = malloc(cap + 1);
  size_t k;
  while (p && (k = fread(p + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      char *q = realloc(p, 2 * cap + 1);
      if (!q) free(p);
      p = q, cap *= 2;
    }
  }
  fclose(f);
  if (p) p[n] = 0;
  if (n_out) *n_out = n;
  return p;
}

void nb_test_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

void nb_test_write_text(const char *path, const char *text) { nb_test_write_file(path, text, strlen(text)); }

void nb_test_flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
  int c = fgetc(f);
  fseek(f, -1, SEEK_CUR);
  fputc(c ^ 0x5a, f);
  fclose(f);
}

const char *nb_test_nabla_bin(void) {
  const char *bin = getenv("NABLA_BIN");
  if (!bin) printf("NABLA_BIN not set (run through ctest): skipped\n");
  return bin;
}

static int exit_status(int st) { return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1; }

int nb_test_run(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  return exit_status(pclose(p));
}

int nb_test_run2(const char *cmd, char *out, size_t cap, char *err, size_t ecap) {
  char errfile[4200], full[8500];
  const char *base = getenv("TMPDIR");
  snprintf(errfile, sizeof errfile, "%s/nabla_test_stderr_XXXXXX", base && *base ? base : "/tmp");
  int fd = mkstemp(errfile);
  if (fd < 0) return -1;
  close(fd);
  snprintf(full, sizeof full, "%s 2>'%s'", cmd, errfile);
  int rc = nb_test_run(full, out, cap);
  FILE *f = fopen(errfile, "r");
  size_t n = f ? fread(err, 1, ecap - 1, f) : 0;
  err[n] = 0;
  if (f) fclose(f);
  unlink(errfile);
  return rc;
}

int nb_test_run_in(const char *dir, const char *prefix, char *out, size_t cap, char *err, size_t ecap, const char *fmt,
                   ...) {
  char args[4096], cmd[12288];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "cd '%s' && %s %s </dev/null", dir, prefix, args);
  return nb_test_run2(cmd, out, cap, err, ecap);
}

double nb_test_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int nb_test_connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}
