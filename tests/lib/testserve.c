/* The `nabla serve` child and loopback HTTP of testserve.h. */
#include "testserve.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testfs.h"

bool nb_test_serve_start(nb_test_server *s, const char *bin, const char *dir, const char *env, const char *model,
                         const char *args) {
  char cmd[8192], out_path[4200], err_path[4200];
  snprintf(out_path, sizeof out_path, "%s/serve.out", dir);
  snprintf(err_path, sizeof err_path, "%s/serve.err", dir);
  snprintf(cmd, sizeof cmd, "cd '%s' && %sexec %s serve '%s' --port 0 --threads 1 %s >serve.out 2>serve.err", dir,
           env ? env : "", bin, model, args ? args : "");
  unlink(out_path);
  s->port = 0;
  s->pid = fork();
  if (s->pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  /* the port, once it is listening (model load, then the first line) */
  static const char mark[] = "http://127.0.0.1:";
  bool exited = false;
  for (double t0 = nb_test_now(); nb_test_now() - t0 < 60; usleep(50000)) {
    char *o = nb_test_read_file(out_path, NULL);
    const char *at = o ? strstr(o, mark) : NULL;
    if (at) s->port = atoi(at + strlen(mark));
    free(o);
    if (s->port) return true;
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      exited = true;
      break;
    }
  }
  if (!exited) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
  }
  s->pid = -1;
  char *e = nb_test_read_file(err_path, NULL);
  CHECK_MSG(false, "the server did not start%s: %s", exited ? " (it exited)" : " within 60 s", e ? e : "");
  free(e);
  return false;
}

void nb_test_serve_stop(nb_test_server *s) {
  if (s->pid <= 0) return;
  kill(s->pid, SIGTERM);
  double t0 = nb_test_now();
  int st = 0;
  pid_t w = 0;
  while (nb_test_now() - t0 < 20 && (w = waitpid(s->pid, &st, WNOHANG)) == 0) usleep(20000);
  if (w != s->pid) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    CHECK_MSG(false, "the server did not exit within 20 s of SIGTERM");
  } else {
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: exit status %d", st);
    fprintf(stderr, "  exited %.2f s after SIGTERM\n", nb_test_now() - t0);
  }
  CHECK_MSG(nb_test_connect_loopback(s->port) < 0, "the port still accepts connections after the server exited");
  s->pid = -1;
}

size_t nb_test_read_until_closed(int fd, char *dst, size_t cap, double timeout_s) {
  size_t n = 0;
  double t0 = nb_test_now();
  while (n + 1 < cap && nb_test_now() - t0 < timeout_s) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t k = read(fd, dst + n, cap - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
  }
  dst[n] = 0;
  return n;
}

int nb_test_http(int port, const char *method, const char *path, const char *headers, const char *body, size_t body_len,
                 char *dst, size_t cap, const char **body_out, double timeout_s) {
  dst[0] = 0;
  *body_out = dst;
  int fd = nb_test_connect_loopback(port);
  if (fd < 0) return -1;
  char head[2048];
  int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                    method, path, headers ? headers : "", body ? body_len : 0);
  bool ok = write(fd, head, (size_t)hn) == hn && (!body || write(fd, body, body_len) == (ssize_t)body_len);
  if (ok) nb_test_read_until_closed(fd, dst, cap, timeout_s);
  close(fd);
  int status = -1;
  sscanf(dst, "HTTP/1.1 %d", &status);
  const char *b = strstr(dst, "\r\n\r\n");
  *body_out = b ? b + 4 : dst + strlen(dst);
  return status;
}

double nb_test_metric(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *at = text; (at = strstr(at, name)); at += n)
    if ((at == text || at[-1] == '\n') && at[n] == ' ') return strtod(at + n + 1, NULL);
  return -1;
}
