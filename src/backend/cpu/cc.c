/* CPU backend: builds generated C into a shared object with the system C
 * compiler, keeps it in the disk cache and loads it. Objects are cached by
 * the hash of the source and the compiler command (the key):
 * <cache>/nb_<key>.so next to its nb_<key>.c, so a second process with the
 * same program compiles nothing. A cache entry is trusted only when
 *   - the directory is private (ours, not writable by group or others, and
 *     so is every directory above it unless it is sticky, like /tmp);
 *     otherwise nothing is loaded from it: we compile in a fresh private
 *     temporary directory instead, with a warning;
 *   - the file's seal checks out (a trailer written after compiling: magic,
 *     key, length and an XXH64 of the bytes before it);
 *   - once loaded, the library's own nbx_cache_key symbol equals the key.
 * A bad entry is removed and compiled again with a one-line warning. New
 * files are written under temporary names (nb_<key>.<pid>-<n>.tmp.*) and
 * renamed into place; the compiler runs under a supervisor process that
 * kills the compiler's whole process group when nabla dies, and temporary
 * files of dead processes are removed by later runs. The cache is kept
 * under a size limit by evicting the least recently used entries (a hit
 * touches the entry's mtime). A large source is split at kernel boundaries
 * into parts compiled in parallel (one per CPU), then linked. Not here:
 * what the source says (codegen_c.c). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "backend/cpu/cpu.h"
#include "util/util.h"

extern char **environ;

#define KEY_SYMBOL "nbx_cache_key"
#define SEAL_MAGIC "NBJITSO1"
#define SEAL_BYTES 32
/* a temporary file of a process that is alive this long is stale anyway (pid reuse) */
#define STALE_SECONDS (24 * 3600)

/* ---------------------------------------------------------------- the directory */

/* Creates path and missing parents, private (0700). */
static bool mkdirs(const char *path) { return nb_util__mkdir_p(path, 0700, NULL, NULL, 0) == 0; }

/* Resolves dir (symbolic links and all) into real, and checks that nobody
 * else can put files there: the directory itself owned by us and not
 * writable by group or others, every directory above it owned by us or
 * root and not writable by others unless sticky. The resolved path is the
 * one used afterwards, so a link changed later does not matter. */
static bool private_dir(const char *dir, char *real, char *why, size_t whycap) {
  char *r = realpath(dir, NULL);
  if (!r) return snprintf(why, whycap, "cannot resolve %s: %s", dir, strerror(errno)), false;
  bool ok = strlen(r) < 1024;
  if (ok) snprintf(real, 1024, "%s", r);
  else snprintf(why, whycap, "%s: path too long", dir);
  uid_t me = geteuid();
  struct stat st;
  if (ok && (stat(r, &st) != 0 || !S_ISDIR(st.st_mode)))
    ok = false, snprintf(why, whycap, "%s is not a directory", r);
  else if (ok && st.st_uid != me)
    ok = false, snprintf(why, whycap, "%s is owned by uid %u, not by this user (uid %u)", r, (unsigned)st.st_uid, (unsigned)me);
  else if (ok && (st.st_mode & 022))
    ok = false, snprintf(why, whycap, "%s is writable by group or others (mode %03o)", r, (unsigned)(st.st_mode & 0777));
  for (char *p = strrchr(r, '/'); ok && p; p = strrchr(r, '/')) {
    *p = 0;
    const char *up = p == r ? "/" : r;
    if (stat(up, &st) != 0) ok = false, snprintf(why, whycap, "cannot stat %s: %s", up, strerror(errno));
    else if (st.st_uid != me && st.st_uid != 0)
      ok = false, snprintf(why, whycap, "%s (above the cache) is owned by uid %u", up, (unsigned)st.st_uid);
    else if ((st.st_mode & 002) && !(st.st_mode & S_ISVTX))
      ok = false, snprintf(why, whycap, "%s (above the cache) is writable by others and not sticky", up);
    if (p == r) break;
  }
  free(r);
  return ok;
}

/* The cache directory to use: cfg's when it is (or can be made) private;
 * otherwise a fresh private temporary directory (*fresh = true; the caller
 * removes it), with one warning per process. */
static bool pick_dir(nb_ctx *ctx, const nb_jit_config *cfg, char *dir, bool *fresh, char *why, size_t whycap) {
  static atomic_bool warned;
  char reason[1400];
  *fresh = false;
  if (!mkdirs(cfg->cache_dir)) snprintf(reason, sizeof reason, "cannot create %s: %s", cfg->cache_dir, strerror(errno));
  else if (!private_dir(cfg->cache_dir, dir, reason, sizeof reason)) (void)0;
  else if (strchr(dir, '\'')) snprintf(reason, sizeof reason, "%s contains a quote", dir);
  else return true;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, 1024, "%s/nabla-jit-private-XXXXXX", tmp && *tmp && !strchr(tmp, '\'') && strlen(tmp) < 900 ? tmp : "/tmp");
  if (!mkdtemp(dir)) return snprintf(why, whycap, "cache directory refused (%s), and cannot make a private one: %s", reason, strerror(errno)), false;
  *fresh = true;
  if (!atomic_exchange(&warned, true))
    nb_logf(ctx, NB_LOG_WARN, "jit: not using the disk cache: %s; compiling in a private temporary directory instead", reason);
  return true;
}

/* ---------------------------------------------------------------- sealed files */

/* XXH64 of the first n bytes of fd. */
static bool hash_fd(int fd, off_t n, uint64_t *out) {
  XXH64_state_t *st = XXH64_createState();
  char buf[1 << 16];
  bool ok = st != NULL;
  if (ok) XXH64_reset(st, 0);
  for (off_t at = 0; ok && at < n;) {
    size_t want = n - at < (off_t)sizeof buf ? (size_t)(n - at) : sizeof buf;
    ssize_t got = pread(fd, buf, want, at);
    if (got < 0 && errno == EINTR) continue;
    ok = got > 0;
    if (ok) XXH64_update(st, buf, (size_t)got), at += got;
  }
  if (ok) *out = XXH64_digest(st);
  XXH64_freeState(st);
  return ok;
}

static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

bool nb_cpu__seal(const char *path, uint64_t key) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  uint64_t h;
  bool ok = fd >= 0 && fstat(fd, &st) == 0 && hash_fd(fd, st.st_size, &h);
  if (ok) {
    unsigned char t[SEAL_BYTES];
    memcpy(t, SEAL_MAGIC, 8);
    put64(t + 8, key);
    put64(t + 16, (uint64_t)st.st_size);
    put64(t + 24, h);
    ok = pwrite(fd, t, SEAL_BYTES, st.st_size) == SEAL_BYTES;
  }
  if (fd >= 0) ok = close(fd) == 0 && ok;
  return ok;
}

typedef enum { ENTRY_OK, ENTRY_MISSING, ENTRY_BAD } entry_state;

/* Checks so's seal for key; why says what is wrong with a bad one. */
static entry_state check_seal(const char *so, uint64_t key, char *why, size_t whycap) {
  int fd = open(so, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? ENTRY_MISSING : (snprintf(why, whycap, "cannot open it: %s", strerror(errno)), ENTRY_BAD);
  struct stat st;
  unsigned char t[SEAL_BYTES];
  uint64_t h = 0;
  entry_state s = ENTRY_BAD;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) snprintf(why, whycap, "not a regular file");
  else if (st.st_size < SEAL_BYTES || pread(fd, t, SEAL_BYTES, st.st_size - SEAL_BYTES) != SEAL_BYTES || memcmp(t, SEAL_MAGIC, 8))
    snprintf(why, whycap, "no seal at its end (%lld bytes; truncated or not written by nabla)", (long long)st.st_size);
  else if (get64(t + 16) != (uint64_t)(st.st_size - SEAL_BYTES))
    snprintf(why, whycap, "sealed at %llu bytes, now %lld", (unsigned long long)get64(t + 16), (long long)st.st_size - SEAL_BYTES);
  else if (get64(t + 8) != key)
    snprintf(why, whycap, "sealed for key %016llx", (unsigned long long)get64(t + 8));
  else if (!hash_fd(fd, st.st_size - SEAL_BYTES, &h)) snprintf(why, whycap, "cannot read it: %s", strerror(errno));
  else if (h != get64(t + 24)) snprintf(why, whycap, "checksum mismatch (corrupted)");
  else s = ENTRY_OK;
  close(fd);
  return s;
}

/* dlopens so and checks that it is the library of key. */
static void *open_checked(const char *so, uint64_t key, char *why, size_t whycap) {
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) return snprintf(why, whycap, "dlopen: %s", dlerror()), NULL;
  const unsigned long long *k = dlsym(h, KEY_SYMBOL);
  if (!k || *k != key) {
    if (k) snprintf(why, whycap, "it is the library of key %016llx", *k);
    else snprintf(why, whycap, "it has no %s symbol", KEY_SYMBOL);
    dlclose(h);
    return NULL;
  }
  return h;
}

/* ---------------------------------------------------------------- the compiler process */

/* The child of run_shell: starts `sh -c cmd` in a new process group and
 * waits for it; when nabla dies first (PR_SET_PDEATHSIG) or the child is
 * told to stop, kills the whole group (the shell, compilers, linker). Only
 * async-signal-safe calls here: the parent may have other threads. */
static _Noreturn void supervise(char *const *argv, pid_t parent, const sigset_t *parent_mask) {
  if (setpgid(0, 0) != 0) _exit(126); /* never kill(0) in nabla's own group */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &dfl, NULL);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(126); /* nabla died before the prctl */
  pid_t w = fork();
  if (w == 0) {
    sigprocmask(SIG_SETMASK, parent_mask, NULL);
    execve("/bin/sh", argv, environ);
    _exit(127);
  }
  if (w < 0) _exit(126);
  sigset_t wait_for;
  sigemptyset(&wait_for);
  sigaddset(&wait_for, SIGCHLD);
  sigaddset(&wait_for, SIGTERM);
  sigaddset(&wait_for, SIGINT);
  sigaddset(&wait_for, SIGHUP);
  for (;;) {
    int sig = sigwaitinfo(&wait_for, NULL), status;
    if (sig == SIGCHLD) {
      if (waitpid(w, &status, WNOHANG) == w) _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    } else if (sig > 0) {
      kill(0, SIGKILL); /* the group, this process included */
    }
  }
}

/* Runs `sh -c cmd`; returns its exit status (or -1). */
static int run_shell(const char *cmd) {
  char *argv[] = {"sh", "-c", (char *)cmd, NULL};
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the supervisor starts with every signal blocked */
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) supervise(argv, parent, &old);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) return -1;
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

/* ---------------------------------------------------------------- upkeep */

/* "nb_<16 hex>" then rest; returns the rest or NULL. */
static const char *entry_rest(const char *name) {
  if (strncmp(name, "nb_", 3)) return NULL;
  for (int i = 3; i < 19; i++)
    if (!strchr("0123456789abcdef", name[i]) || !name[i]) return NULL;
  return name + 19;
}

/* A temporary file whose writer is gone: nb_<key>.<pid>-<n>.tmp.* (and
 * the names older versions used: .<pid>.log, .<pid>.p<i>.[co],
 * .c.<pid>.tmp, .so.<pid>.tmp). */
static bool stale_temp(const char *rest, const struct stat *st) {
  char *end;
  if (!strncmp(rest, ".c.", 3) || !strncmp(rest, ".so.", 4)) rest = strchr(rest + 1, '.');
  if (*rest != '.' || !strchr("0123456789", rest[1])) return false;
  long pid = strtol(rest + 1, &end, 10);
  if (*end != '-' && *end != '.') return false;
  if (time(NULL) - st->st_mtime > STALE_SECONDS) return true;
  return pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

typedef struct entry {
  char key[17];
  uint64_t bytes;
  time_t used;    /* the .so's mtime (touched on every hit) */
} entry;

static int by_key(const void *a, const void *b) { return strcmp(((const entry *)a)->key, ((const entry *)b)->key); }
static int by_use(const void *a, const void *b) {
  time_t x = ((const entry *)a)->used, y = ((const entry *)b)->used;
  return x < y ? -1 : x > y;
}

/* Lists the entries of dir (an .so and its .c are one entry) into *out
 * (sorted by key); with tidy, stale temporary files are removed on the way
 * (not when only looking: nabla cache info). Returns the count, or -1. */
static long scan(const char *dir, bool tidy, entry **out) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  entry *v = NULL;
  long n = 0, cap = 0;
  struct dirent *de;
  char path[1400];
  while ((de = readdir(d))) {
    const char *rest = entry_rest(de->d_name);
    struct stat st;
    if (!rest || snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path || lstat(path, &st) != 0) continue;
    if (stale_temp(rest, &st)) {
      if (tidy) unlink(path);
      continue;
    }
    bool so = !strcmp(rest, ".so");
    if (!so && strcmp(rest, ".c")) continue;
    if (n == cap) {
      entry *w = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 64));
      if (!w) break;
      v = w;
    }
    entry *e = &v[n++];
    snprintf(e->key, sizeof e->key, "%.16s", de->d_name + 3);
    e->bytes = (uint64_t)st.st_size;
    e->used = so ? st.st_mtime : 0; /* a .c alone: its .so is gone, first to go */
  }
  closedir(d);
  if (n) qsort(v, (size_t)n, sizeof *v, by_key);
  long m = 0; /* merge each .so with its .c */
  for (long i = 0; i < n; i++) {
    if (m && !strcmp(v[m - 1].key, v[i].key)) {
      v[m - 1].bytes += v[i].bytes;
      if (v[i].used > v[m - 1].used) v[m - 1].used = v[i].used;
    } else {
      v[m++] = v[i];
    }
  }
  *out = v;
  return m;
}

static void remove_entry(const char *dir, const char *key) {
  char path[1400];
  snprintf(path, sizeof path, "%s/nb_%s.so", dir, key);
  unlink(path);
  snprintf(path, sizeof path, "%s/nb_%s.c", dir, key);
  unlink(path);
}

/* Removes stale temporary files, then the least recently used entries
 * (never `keep`) until the cache holds at most max_bytes. */
static void upkeep(const char *dir, const char *keep, uint64_t max_bytes) {
  entry *v = NULL;
  long n = scan(dir, true, &v);
  uint64_t total = 0;
  for (long i = 0; i < n; i++) total += v[i].bytes;
  if (n > 0) qsort(v, (size_t)n, sizeof *v, by_use);
  for (long i = 0; i < n && total > max_bytes; i++)
    if (strcmp(v[i].key, keep)) {
      remove_entry(dir, v[i].key);
      total -= v[i].bytes;
    }
  free(v);
}

nb_status nb_cpu__cache_usage(nb_ctx *ctx, const nb_jit_config *cfg, bool clear, nb_jit_cache_info *out) {
  const char *dir = cfg->cache_dir;
  char real[1024];
  snprintf(out->dir, sizeof out->dir, "%s", dir);
  out->max_bytes = cfg->cache_max_bytes;
  struct stat st;
  if (stat(dir, &st) != 0 && errno == ENOENT) return NB_OK; /* nothing cached yet */
  char why[1400];
  if (private_dir(dir, real, why, sizeof why)) snprintf(out->dir, sizeof out->dir, "%s", real);
  else snprintf(out->problem, sizeof out->problem, "%.500s", why);
  entry *v = NULL;
  long n = scan(out->dir, clear, &v);
  if (n < 0) return nb_errorf(ctx, NB_ERR_IO, "jit cache: cannot read %s: %s", out->dir, strerror(errno));
  for (long i = 0; i < n; i++) {
    if (clear) remove_entry(out->dir, v[i].key);
    out->entries++;
    out->bytes += v[i].bytes;
  }
  free(v);
  return NB_OK;
}

/* ---------------------------------------------------------------- loading */

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

/* Compiles src (which defines KEY_SYMBOL) into the sealed object `so`,
 * through temporary files under `base`. */
static bool build(const nb_jit_config *cfg, const char *src, size_t len, uint64_t key, const char *src_path,
                  const char *so, const char *base, char *why, size_t whycap) {
  char tmp_c[1400], tmp_so[1400], log[1400], cmd[4096];
  snprintf(tmp_c, sizeof tmp_c, "%s.c", base);
  snprintf(tmp_so, sizeof tmp_so, "%s.so", base);
  snprintf(log, sizeof log, "%s.log", base);
  if (!write_file(tmp_c, src, len) || rename(tmp_c, src_path) != 0) {
    unlink(tmp_c);
    return snprintf(why, whycap, "cannot write %s: %s", src_path, strerror(errno)), false;
  }
  size_t cut[MAX_PARTS + 1];
  int parts = split_source(src, len, cut), rc;
  if (parts > 1) {
    rc = compile_parts(cfg, src, cut, parts, base, tmp_so, log);
  } else {
    if (snprintf(cmd, sizeof cmd, "%s -x c -o '%s' '%s' -lm 2>'%s'", cfg->cc, tmp_so, src_path, log) >= (int)sizeof cmd)
      return snprintf(why, whycap, "compiler command too long"), false;
    rc = run_shell(cmd);
  }
  if (rc != 0) {
    char head[600];
    read_head(log, head, sizeof head);
    snprintf(why, whycap, "'%s' failed (exit %d): %s", cfg->cc, rc, head[0] ? head : "no output");
  } else if (!nb_cpu__seal(tmp_so, key)) {
    snprintf(why, whycap, "cannot seal %s: %s", tmp_so, strerror(errno));
    rc = -1;
  } else if (rename(tmp_so, so) != 0) {
    snprintf(why, whycap, "cannot rename %s: %s", tmp_so, strerror(errno));
    rc = -1;
  }
  unlink(log);
  unlink(tmp_so);
  return rc == 0;
}

void *nb_cpu__load(nb_ctx *ctx, const nb_jit_config *cfg, const char *src, size_t len, char *src_path, size_t path_cap,
                   bool *from_cache, char *why, size_t whycap) {
  static atomic_uint serial;
  static atomic_bool tidied; /* stale temporary files and the size limit: after each compile, or once per process on hits */
  XXH64_state_t *st = XXH64_createState();
  if (!st) return snprintf(why, whycap, "out of memory"), NULL;
  XXH64_reset(st, 0x6e61626c61ull);
  XXH64_update(st, cfg->cc, strlen(cfg->cc));
  XXH64_update(st, src, len);
  unsigned long long key = XXH64_digest(st);
  XXH64_freeState(st);
  *from_cache = false;
  char dir[1024], so[1200], keyhex[17];
  bool fresh;
  if (!pick_dir(ctx, cfg, dir, &fresh, why, whycap)) return NULL;
  snprintf(keyhex, sizeof keyhex, "%016llx", key);
  snprintf(src_path, path_cap, "%s/nb_%s.c", dir, keyhex);
  snprintf(so, sizeof so, "%s/nb_%s.so", dir, keyhex);
  char bad[600];
  entry_state es = fresh ? ENTRY_MISSING : check_seal(so, key, bad, sizeof bad);
  if (es == ENTRY_OK) {
    void *h = open_checked(so, key, bad, sizeof bad);
    if (h) {
      utimensat(AT_FDCWD, so, NULL, 0); /* last use, for eviction */
      if (!atomic_exchange(&tidied, true)) upkeep(dir, keyhex, cfg->cache_max_bytes);
      *from_cache = true;
      return h;
    }
    es = ENTRY_BAD;
  }
  if (es == ENTRY_BAD) {
    nb_logf(ctx, NB_LOG_WARN, "jit: bad cache entry %s (%s): removed, compiling it again", so, bad);
    unlink(so);
  }
  /* the source as compiled: the program, then the key that ties the library to its entry */
  char *full = malloc(len + 80);
  if (!full) return snprintf(why, whycap, "out of memory"), NULL;
  memcpy(full, src, len);
  size_t flen = len + (size_t)snprintf(full + len, 80, "\nconst unsigned long long %s = 0x%sull;\n", KEY_SYMBOL, keyhex);
  char base[1300];
  snprintf(base, sizeof base, "%s/nb_%s.%d-%u.tmp", dir, keyhex, (int)getpid(), atomic_fetch_add(&serial, 1));
  bool ok = build(cfg, full, flen, key, src_path, so, base, why, whycap);
  free(full);
  void *h = ok ? open_checked(so, key, why, whycap) : NULL;
  if (fresh) { /* nothing is kept: the loaded library stays mapped */
    unlink(so);
    unlink(src_path);
    rmdir(dir);
  } else if (ok) {
    upkeep(dir, keyhex, cfg->cache_max_bytes);
    atomic_store(&tidied, true);
  }
  return h;
}

void nb_cpu__unload(void *handle) {
  if (handle) dlclose(handle);
}

void *nb_cpu__sym(void *handle, const char *name) { return dlsym(handle, name); }
