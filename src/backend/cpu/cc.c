/* CPU backend: builds generated C into a shared object with the system C
 * compiler and loads it. Objects are cached on disk by the hash of the
 * source and the compiler command (<cache>/nb_<hash>.so next to its .c), so
 * a second process with the same program compiles nothing; a new object is
 * written under a temporary name and renamed into place. A large source is
 * split at kernel boundaries into parts compiled in parallel (one per CPU),
 * then linked. Not here: what the source says (compile/codegen_c.c). */
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

#define MAX_PARTS 8
#define MIN_PART_BYTES (64 * 1024)

/* Splits src after its prelude (everything before the first kernel's
 * comment line) into up to MAX_PARTS chunks of similar size, each starting at a kernel;
 * cut[0] is the prelude's end, cut[n] == len. Returns n (1: do not split). */
static int split_source(const char *src, size_t len, size_t *cut) {
  const char *first = strstr(src, "\n/* k");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cpus < 1 ? 1 : cpus > MAX_PARTS ? MAX_PARTS : (int)cpus;
  if (!first) return 1;
  size_t pre = (size_t)(first - src), body = len - pre;
  while (n > 1 && body / (size_t)n < MIN_PART_BYTES) n--;
  if (n <= 1) return 1;
  cut[0] = pre;
  int k = 1;
  for (int i = 1; i < n; i++) {
    const char *at = strstr(src + pre + body * (size_t)i / (size_t)n, "\n/* k");
    if (!at) break;
    size_t c = (size_t)(at - src);
    if (c > cut[k - 1]) cut[k++] = c;
  }
  cut[k] = len;
  return k;
}

/* Compiles the parts of src (see split_source) in parallel into tmp_so.
 * Returns the shell's exit status. */
static int compile_parts(const nb_jit_config *cfg, const char *src, const size_t *cut, int n, const char *base,
                         const char *tmp_so, const char *log) {
  char part_c[MAX_PARTS][1400], part_o[MAX_PARTS][1400];
  char cmd[MAX_PARTS * 4200 + 4096];
  size_t m = (size_t)snprintf(cmd, sizeof cmd, "s=0;");
  int rc = -1;
  for (int i = 0; i < n; i++) {
    snprintf(part_c[i], sizeof part_c[i], "%s.p%d.c", base, i);
    snprintf(part_o[i], sizeof part_o[i], "%s.p%d.o", base, i);
    FILE *f = fopen(part_c[i], "wb");
    bool ok = f && fwrite(src, 1, cut[0], f) == cut[0] && fwrite(src + cut[i], 1, cut[i + 1] - cut[i], f) == cut[i + 1] - cut[i];
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) goto out;
    m += (size_t)snprintf(cmd + m, sizeof cmd - m, " %s -x c -c -o '%s' '%s' 2>>'%s' & p%d=$!;", cfg->cc, part_o[i], part_c[i], log, i);
  }
  for (int i = 0; i < n; i++) m += (size_t)snprintf(cmd + m, sizeof cmd - m, " wait $p%d || s=1;", i);
  m += (size_t)snprintf(cmd + m, sizeof cmd - m, " [ $s = 0 ] && %s -o '%s'", cfg->cc, tmp_so);
  for (int i = 0; i < n; i++) m += (size_t)snprintf(cmd + m, sizeof cmd - m, " '%s'", part_o[i]);
  m += (size_t)snprintf(cmd + m, sizeof cmd - m, " -lm 2>>'%s'", log);
  rc = m < sizeof cmd ? run_shell(cmd) : -1;
out:
  for (int i = 0; i < n; i++) {
    unlink(part_c[i]);
    unlink(part_o[i]);
  }
  return rc;
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
  size_t cut[MAX_PARTS + 1];
  int parts = split_source(src, len, cut);
  char base[1300];
  snprintf(base, sizeof base, "%s/nb_%016llx.%d", cfg->cache_dir, h, pid);
  int rc;
  if (parts > 1) {
    rc = compile_parts(cfg, src, cut, parts, base, tmp_so, log);
  } else {
    if (snprintf(cmd, sizeof cmd, "%s -x c -o '%s' '%s' -lm 2>'%s'", cfg->cc, tmp_so, src_path, log) >= (int)sizeof cmd)
      return snprintf(why, whycap, "compiler command too long"), NULL;
    rc = run_shell(cmd);
  }
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
