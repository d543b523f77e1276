/* CPU backend: builds generated C into a shared object with the system C
 * compiler and loads it. Objects are cached on disk by the hash of the
 * source and the compiler command (<cache>/nb_<hash>.so next to its .c), so
 * a second process with the same program compiles nothing; a new object is
 * written under a temporary name and renamed into place. Not here: what the
 * source says (compile/codegen_c.c). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "compile/jit.h"

extern char **environ;

static bool mkdirs(const char *path) {
  char buf[1024];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return false;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return false;
    *p = '/';
  }
  return mkdir(buf, 0755) == 0 || errno == EEXIST;
}

static bool write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(data, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  return ok;
}

static void read_head(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
  for (char *p = buf; *p; p++)
    if (*p == '\n') *p = ' ';
}

/* Runs `sh -c cmd`; returns its exit status (or -1). */
static int run_shell(const char *cmd) {
  pid_t pid;
  char *argv[] = {"sh", "-c", (char *)cmd, NULL};
  if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0) return -1;
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void *try_open(const char *so, char *why, size_t whycap) {
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h && why) snprintf(why, whycap, "dlopen %s: %s", so, dlerror());
  return h;
}

void *nb_cpu__load(nb_ctx *ctx, const nb_jit_config *cfg, const char *src, size_t len, char *src_path, size_t path_cap,
                   bool *from_cache, char *why, size_t whycap) {
  XXH64_state_t *st = XXH64_createState();
  if (!st) return snprintf(why, whycap, "out of memory"), NULL;
  XXH64_reset(st, 0x6e61626c61ull);
  XXH64_update(st, cfg->cc, strlen(cfg->cc));
  XXH64_update(st, src, len);
  unsigned long long h = XXH64_digest(st);
  XXH64_freeState(st);
  char so[1200], tmp_so[1300], tmp_c[1300], log[1300], cmd[4096];
  snprintf(src_path, path_cap, "%s/nb_%016llx.c", cfg->cache_dir, h);
  snprintf(so, sizeof so, "%s/nb_%016llx.so", cfg->cache_dir, h);
  *from_cache = false;
  if (access(so, R_OK) == 0) {
    void *hd = try_open(so, NULL, 0);
    if (hd) {
      *from_cache = true;
      return hd;
    }
  }
  if (!mkdirs(cfg->cache_dir)) return snprintf(why, whycap, "cannot create cache directory %s: %s", cfg->cache_dir, strerror(errno)), NULL;
  int pid = (int)getpid();
  snprintf(tmp_c, sizeof tmp_c, "%s.%d.tmp", src_path, pid);
  snprintf(tmp_so, sizeof tmp_so, "%s.%d.tmp", so, pid);
  snprintf(log, sizeof log, "%s/nb_%016llx.%d.log", cfg->cache_dir, h, pid);
  if (!write_file(tmp_c, src, len) || rename(tmp_c, src_path) != 0) {
    unlink(tmp_c);
    return snprintf(why, whycap, "cannot write %s: %s", src_path, strerror(errno)), NULL;
  }
  if (snprintf(cmd, sizeof cmd, "%s -x c -o '%s' '%s' -lm 2>'%s'", cfg->cc, tmp_so, src_path, log) >= (int)sizeof cmd)
    return snprintf(why, whycap, "compiler command too long"), NULL;
  int rc = run_shell(cmd);
  if (rc != 0) {
    char head[600];
    read_head(log, head, sizeof head);
    snprintf(why, whycap, "'%s' failed (exit %d): %s", cfg->cc, rc, head[0] ? head : "no output");
    unlink(log);
    unlink(tmp_so);
    return NULL;
  }
  unlink(log);
  if (rename(tmp_so, so) != 0) {
    unlink(tmp_so);
    return snprintf(why, whycap, "cannot rename %s: %s", tmp_so, strerror(errno)), NULL;
  }
  (void)ctx;
  return try_open(so, why, whycap);
}

void nb_cpu__unload(void *handle) {
  if (handle) dlclose(handle);
}

void *nb_cpu__sym(void *handle, const char *name) { return dlsym(handle, name); }
