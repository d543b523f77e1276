/* The disk cache of compiled programs cannot be poisoned: a truncated
 * library, one with a flipped bit, another program's library under the
 * expected name, a library planted in a directory others can write (or
 * owned by another user) are never run; bad entries are compiled again with
 * one warning; a killed nabla leaves no compiler running and no temporary
 * files behind; the size limit evicts the least recently used entries; and
 * `nabla cache info|clear`. Every run that might crash on a bad entry runs
 * in a child process, so a crash is a failed check, not a dead test. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "jitcheck.h"

static char root[512];

/* What a child saw. */
typedef struct report {
  bool ran, correct, from_cache;
  int warnings;
  char warning[600];
} report;
static report *rep; /* shared with the children */

/* 1: y = x * 1234.5678 + 1 (the constant is looked for in the library); 2: y = x * 3 - 1 */
static nb_status f_prog(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  nb_val *x = nb_tree_get_val(in, "x");
  bool one = *(const int *)u == 1;
  nb_val *y = nb_add(nb_mul(x, nb_scalar(g, NB_F32, one ? 1234.5678 : 3)), nb_scalar(g, NB_F32, one ? 1 : -1));
  return nb_tree_set_val(out, "y", y);
}

static void on_log(void *ud, nb_log_level level, const char *msg) {
  (void)ud;
  if (level != NB_LOG_WARN) return;
  rep->warnings++;
  snprintf(rep->warning, sizeof rep->warning, "%s", msg);
}

/* In this process: compiles program `prog` with cache `dir` (and compiler
 * `cc`, NULL: the default), runs it and compares with the interpreter bit
 * for bit; fills *rep. */
static void run_prog(int prog, const char *dir, const char *cc) {
  memset(rep, 0, sizeof *rep);
  nb_ctx *ctx = nb_ctx_create();
  nb_ctx_set_log(ctx, on_log, NULL);
  nb_tree *spec = nb_tree_create(ctx), *in = nb_tree_create(ctx), *want = nb_tree_create(ctx), *got = nb_tree_create(ctx);
  int64_t d[1] = {77};
  nb_test_rng rng = {7};
  nb_tree_set(spec, "x", nb_leaf_aval(nb_aval_make(NB_F32, 1, d)));
  nb_test_set_randn(in, &rng, "x", NB_F32, 1, d);
  nb_graph *g = nb_trace(ctx, f_prog, &prog, spec);
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.cache_dir = dir;
  o.cc = cc;
  nb_exe *e = g ? nb_jit(ctx, g, &o) : NULL;
  rep->ran = e && nb_exe_run(e, in, got) == NB_OK && nb_graph_run(ctx, g, in, want) == NB_OK;
  if (rep->ran) {
    nb_array *a = nb_tree_get_array(got, "y"), *b = nb_tree_get_array(want, "y");
    nb_exe_stats s;
    nb_exe_get_stats(e, &s);
    rep->from_cache = s.from_disk_cache;
    rep->correct = a && b && s.native && nb_array_nbytes(a) == nb_array_nbytes(b) &&
                   !memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(b));
  }
  nb_exe_destroy(e);
  nb_graph_destroy(g);
  nb_tree_destroy(spec);
  nb_tree_destroy(in);
  nb_tree_destroy(want);
  nb_tree_destroy(got);
  nb_ctx_destroy(ctx);
}

/* run_prog in a child; returns the child's wait status. */
static int run_in_child(int prog, const char *dir, const char *cc) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    run_prog(prog, dir, cc);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

static bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

static void fresh_dir(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", root, name);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && chmod 700 '%s'", out, out, out);
  CHECK(system(cmd) == 0);
}

/* The path of the only file in dir ending in suffix ("" when not exactly one). */
static void only_file(const char *dir, const char *suffix, char *out, size_t cap) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *de;
  out[0] = 0;
  while (d && (de = readdir(d))) {
    size_t a = strlen(de->d_name), b = strlen(suffix);
    if (a > b && !strcmp(de->d_name + a - b, suffix) && n++ == 0) snprintf(out, cap, "%s/%s", dir, de->d_name);
  }
  if (d) closedir(d);
  if (n != 1) out[0] = 0;
}

static long count_files(const char *dir) {
  DIR *d = opendir(dir);
  long n = 0;
  struct dirent *de;
  while (d && (de = readdir(d))) n += de->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static bool read_all(const char *path, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc(*len + 1);
  bool ok = *data && fread(*data, 1, *len, f) == *len;
  fclose(f);
  return ok;
}

static bool write_all(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(data, 1, len, f) == len;
  return f && fclose(f) == 0 && ok;
}

/* The bad entry was replaced: the run was right, warned once, compiled
 * again; the next run finds a good entry. */
static void check_recovered(const char *what, int status, const char *dir) {
  CHECK_MSG(exited_ok(status), "%s: the run died (wait status %#x)", what, status);
  CHECK_MSG(rep->ran && rep->correct, "%s: wrong results from a bad cache entry", what);
  CHECK_MSG(!rep->from_cache, "%s: the bad entry was used", what);
  CHECK_MSG(rep->warnings == 1 && strstr(rep->warning, "bad cache entry") && !strchr(rep->warning, '\n'),
            "%s: want one warning line about the bad entry, got %d (last: %s)", what, rep->warnings, rep->warning);
  status = run_in_child(1, dir, NULL);
  CHECK_MSG(exited_ok(status) && rep->correct && rep->from_cache && rep->warnings == 0,
            "%s: the entry compiled again is not a good one", what);
}

/* ---------------------------------------------------------------- damaged entries */

static void test_truncated(void) {
  char dir[1000], so[1200];
  fresh_dir(dir, sizeof dir, "truncated");
  CHECK(exited_ok(run_in_child(1, dir, NULL)) && rep->correct && !rep->from_cache);
  only_file(dir, ".so", so, sizeof so);
  struct stat st;
  CHECK(so[0] && stat(so, &st) == 0);
  CHECK(truncate(so, st.st_size / 2) == 0);
  check_recovered("truncated", run_in_child(1, dir, NULL), dir);
}

static void test_flipped_bit(void) {
  char dir[1000], so[1200], *data = NULL;
  size_t len = 0;
  fresh_dir(dir, sizeof dir, "flipped");
  CHECK(exited_ok(run_in_child(1, dir, NULL)) && rep->correct);
  only_file(dir, ".so", so, sizeof so);
  CHECK(so[0] && read_all(so, &data, &len));
  /* flip an exponent bit of every copy of the constant 1234.5678f: a wrong result when run */
  float c = 1234.5678f;
  unsigned char pat[4];
  memcpy(pat, &c, 4);
  int flips = 0;
  for (size_t i = 0; data && i + 4 <= len; i++)
    if (!memcmp(data + i, pat, 4)) data[i + 3] ^= 0x01, flips++;
  CHECK_MSG(flips > 0, "the constant is not in the library");
  CHECK(data && write_all(so, data, len));
  free(data);
  check_recovered("flipped bit", run_in_child(1, dir, NULL), dir);
}

static void test_swapped(void) {
  char dir[1000], so1[1200], so2[1200], *data = NULL;
  size_t len = 0;
  fresh_dir(dir, sizeof dir, "swapped");
  CHECK(exited_ok(run_in_child(1, dir, NULL)));
  only_file(dir, ".so", so1, sizeof so1);
  char keep[1300];
  snprintf(keep, sizeof keep, "%s.keep", so1);
  CHECK(rename(so1, keep) == 0); /* so that program 2's library is the only .so */
  CHECK(exited_ok(run_in_child(2, dir, NULL)) && rep->correct);
  only_file(dir, ".so", so2, sizeof so2);
  CHECK(rename(keep, so1) == 0);
  /* program 2's library (its seal included) under program 1's name */
  CHECK(so2[0] && read_all(so2, &data, &len) && write_all(so1, data, len));
  free(data);
  check_recovered("another program's library", run_in_child(1, dir, NULL), dir);
}

/* ---------------------------------------------------------------- directories others control */

/* Puts into `dir` a library for program 1 that passes every per-entry
 * check (the right name, seal and key symbol) and, when loaded, creates
 * `marker`: what another user could plant. */
static void plant(const char *dir, const char *marker) {
  char good[1000], so[1200], c[1200], cmd[8000];
  fresh_dir(good, sizeof good, "plant-src");
  CHECK(exited_ok(run_in_child(1, good, NULL)));
  only_file(good, ".c", c, sizeof c);
  CHECK(c[0] != 0);
  const char *base = strrchr(c, '/') + 1;
  unsigned long long key = strtoull(base + 3, NULL, 16);
  snprintf(so, sizeof so, "%s/%.*s.so", dir, (int)(strlen(base) - 2), base);
  snprintf(cmd, sizeof cmd,
           "(cat '%s'; printf '#include <stdio.h>\\n__attribute__((constructor)) static void nbx_evil(void) "
           "{ FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f); }\\n') > '%s/evil.c' && "
           "cc -O1 -fPIC -shared -o '%s' '%s/evil.c' -lm",
           c, marker, good, so, good);
  CHECK(system(cmd) == 0);
  CHECK(nb_cpu__seal(so, key));
}

static void check_not_loaded(const char *what, const char *dir, const char *marker) {
  unlink(marker);
  int status = run_in_child(1, dir, NULL);
  CHECK_MSG(access(marker, F_OK) != 0, "%s: a library planted in %s was run", what, dir);
  CHECK_MSG(exited_ok(status) && rep->correct && !rep->from_cache, "%s: wrong run", what);
  CHECK_MSG(rep->warnings == 1 && strstr(rep->warning, "not using the disk cache"), "%s: want a warning, got %d (%s)",
            what, rep->warnings, rep->warning);
  CHECK_MSG(count_files(dir) == 1, "%s: files were written into the refused directory", what);
}

static void test_group_writable(void) {
  char dir[1000], marker[1200];
  fresh_dir(dir, sizeof dir, "group-writable");
  snprintf(marker, sizeof marker, "%s/../planted-ran", dir);
  plant(dir, marker);
  /* the planted library runs where the directory is not checked */
  unlink(marker);
  CHECK(exited_ok(run_in_child(1, dir, NULL)) && rep->from_cache && access(marker, F_OK) == 0);
  CHECK(chmod(dir, 0770) == 0);
  check_not_loaded("group-writable directory", dir, marker);
  CHECK(chmod(dir, 0707) == 0);
  check_not_loaded("world-writable directory", dir, marker);
}

static void test_other_owner(void) {
  if (geteuid() != 0) {
    printf("skipped: a cache directory owned by another user (needs root to chown)\n");
    return;
  }
  char dir[1000], marker[1200];
  fresh_dir(dir, sizeof dir, "other-owner");
  snprintf(marker, sizeof marker, "%s/../planted-ran", dir);
  plant(dir, marker);
  CHECK(chown(dir, 12345, 12345) == 0);
  check_not_loaded("directory owned by another user", dir, marker);
}

static void test_new_dir_private(void) {
  char dir[1000], sub[1100];
  fresh_dir(dir, sizeof dir, "new");
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  CHECK(exited_ok(run_in_child(1, sub, NULL)) && rep->correct && rep->warnings == 0);
  struct stat st;
  CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
  /* without HOME: /tmp/nabla-jit-<uid> */
  char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL, *env = getenv("NABLA_CACHE_DIR") ? strdup(getenv("NABLA_CACHE_DIR")) : NULL;
  unsetenv("HOME");
  unsetenv("NABLA_CACHE_DIR");
  nb_ctx *ctx = nb_ctx_create();
  nb_jit_cache_info info;
  char want[64];
  snprintf(want, sizeof want, "/tmp/nabla-jit-%d", (int)getuid());
  CHECK_OK(ctx, nb_jit_cache_stat(ctx, NULL, &info));
  CHECK_MSG(!strcmp(info.dir, want), "without HOME: %s", info.dir);
  nb_ctx_destroy(ctx);
  if (home) setenv("HOME", home, 1);
  if (env) setenv("NABLA_CACHE_DIR", env, 1);
  free(home);
  free(env);
}

/* ---------------------------------------------------------------- a killed nabla */

static bool process_gone(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p && (p[2] == 'Z' || p[2] == 'X'); /* a zombie waits for init only */
}

static void test_killed_compile(void) {
  char dir[1000], cc[1200], pidfile[1200], script[4200];
  fresh_dir(dir, sizeof dir, "killed");
  snprintf(cc, sizeof cc, "%s/../fake-cc.sh", dir);
  snprintf(pidfile, sizeof pidfile, "%s/../fake-cc.pid", dir);
  unlink(pidfile);
  /* a compiler that writes part of its output, then hangs */
  snprintf(script, sizeof script,
           "#!/bin/sh\nprev=\nfor a; do [ \"$prev\" = -o ] && echo partial > \"$a\"; prev=$a; done\n"
           "echo $$ > '%s.tmp' && mv '%s.tmp' '%s'\nexec sleep 60\n",
           pidfile, pidfile, pidfile);
  CHECK(write_all(cc, script, strlen(script)) && chmod(cc, 0700) == 0);
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    run_prog(1, dir, cc);
    _exit(0);
  }
  long ccpid = 0;
  for (int i = 0; i < 2000 && !ccpid; i++) {
    FILE *f = fopen(pidfile, "r");
    if (f) {
      if (fscanf(f, "%ld", &ccpid) != 1) ccpid = 0;
      fclose(f);
    }
    if (!ccpid) usleep(5000);
  }
  CHECK_MSG(ccpid > 0, "the fake compiler did not start");
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  bool gone = false;
  for (int i = 0; i < 400 && ccpid > 0 && !gone; i++) {
    gone = process_gone((pid_t)ccpid);
    if (!gone) usleep(5000);
  }
  CHECK_MSG(gone, "the compiler of a killed nabla still runs (pid %ld)", ccpid);
  if (!gone && ccpid > 0) kill((pid_t)ccpid, SIGKILL);
  /* a later run cleans up what the killed one left */
  CHECK(exited_ok(run_in_child(1, dir, NULL)) && rep->correct);
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    const char *n = de->d_name;
    size_t l = strlen(n);
    bool entry = l > 3 && (!strcmp(n + l - 3, ".so") || !strcmp(n + l - 2, ".c"));
    CHECK_MSG(n[0] == '.' || entry, "left behind: %s/%s", dir, n);
  }
  if (d) closedir(d);
}

/* ---------------------------------------------------------------- size limit, info, clear */

static void make_fake_entry(const char *dir, int i, size_t bytes, time_t mtime) {
  char path[1200];
  snprintf(path, sizeof path, "%s/nb_%016x.so", dir, 0xfa0 + i);
  char *junk = calloc(1, bytes);
  CHECK(junk && write_all(path, junk, bytes));
  free(junk);
  struct timespec t[2] = {{mtime, 0}, {mtime, 0}};
  CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
}

static bool fake_exists(const char *dir, int i) {
  char path[1200];
  snprintf(path, sizeof path, "%s/nb_%016x.so", dir, 0xfa0 + i);
  return access(path, F_OK) == 0;
}

static void test_lru(void) {
  char dir[1000], so[1200];
  fresh_dir(dir, sizeof dir, "lru");
  time_t now = time(NULL);
  CHECK(exited_ok(run_in_child(1, dir, NULL)));
  only_file(dir, ".so", so, sizeof so);
  struct timespec old[2] = {{now - 5000, 0}, {now - 5000, 0}};
  CHECK(utimensat(AT_FDCWD, so, old, 0) == 0);
  CHECK(exited_ok(run_in_child(1, dir, NULL)) && rep->from_cache);
  struct stat st;
  CHECK_MSG(stat(so, &st) == 0 && st.st_mtime >= now - 60, "a hit does not mark the entry used");
  for (int i = 0; i < 4; i++) make_fake_entry(dir, i, 400 << 10, now - 4000 + 1000 * i);
  setenv("NABLA_CACHE_MAX_MB", "1", 1);
  CHECK(exited_ok(run_in_child(2, dir, NULL)) && rep->correct && !rep->from_cache); /* a new entry: evicts */
  /* 4 x 400 KiB + two programs over 1 MiB: the two oldest go, the used ones stay */
  CHECK_MSG(!fake_exists(dir, 0) && !fake_exists(dir, 1) && fake_exists(dir, 2) && fake_exists(dir, 3),
            "eviction is not least recently used first: %d %d %d %d", fake_exists(dir, 0), fake_exists(dir, 1),
            fake_exists(dir, 2), fake_exists(dir, 3));
  CHECK(access(so, F_OK) == 0);
  nb_ctx *ctx = nb_ctx_create();
  nb_jit_cache_info info;
  CHECK_OK(ctx, nb_jit_cache_stat(ctx, dir, &info));
  CHECK(info.entries == 4 && info.max_bytes == 1u << 20 && info.bytes > 800u << 10 && info.bytes <= 1u << 20 && !info.problem[0]);
  setenv("NABLA_CACHE_MAX_MB", "12abc", 1);
  CHECK(nb_jit_cache_stat(ctx, dir, &info) == NB_ERR_INVALID_ARG && strstr(nb_ctx_error(ctx), "NABLA_CACHE_MAX_MB"));
  nb_ctx_clear_error(ctx);
  unsetenv("NABLA_CACHE_MAX_MB");
  /* the command line */
  const char *bin = getenv("NABLA_BIN");
  if (bin) {
    char cmd[4000], out[4096] = "";
    snprintf(cmd, sizeof cmd, "NABLA_CACHE_DIR='%s' '%s' cache info", dir, bin);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    CHECK(p && pclose(p) == 0);
    CHECK_MSG(strstr(out, dir) && strstr(out, "entries: 4") && strstr(out, "limit: 1024 MiB"), "cache info said: %s", out);
    snprintf(cmd, sizeof cmd, "NABLA_CACHE_DIR='%s' '%s' cache clear >/dev/null", dir, bin);
    CHECK(system(cmd) == 0);
  } else {
    printf("skipped: nabla cache info|clear ($NABLA_BIN unset)\n");
    CHECK_OK(ctx, nb_jit_cache_clear(ctx, dir, NULL));
  }
  CHECK(count_files(dir) == 0);
  CHECK_OK(ctx, nb_jit_cache_stat(ctx, dir, &info));
  CHECK(info.entries == 0 && info.bytes == 0);
  nb_ctx_destroy(ctx);
}

int main(void) {
  /* the disk cache is the cpu backend's: test it even when the suite runs
   * under another one ($NABLA_BACKEND=interp) */
  setenv("NABLA_BACKEND", "cpu", 1);
  const char *b = getenv("NABLA_BUILD_DIR");
  snprintf(root, sizeof root, "%s/jit-cache-test", b && *b ? b : "/tmp/nabla-test");
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", root);
  if (system(cmd) != 0) return 1;
  rep = mmap(NULL, sizeof *rep, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (rep == MAP_FAILED) return 1;
  test_truncated();
  test_flipped_bit();
  test_swapped();
  test_group_writable();
  test_other_owner();
  test_new_dir_private();
  test_killed_compile();
  test_lru();
  return nb_test_summary("compile/test_jit_cache");
}
