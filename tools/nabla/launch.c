/* `nabla launch`: runs a command as N processes of one MPI job (Open MPI's
 * mpirun, or Slurm's srun), every line of every rank's output prefixed with
 * "[rank R] ", and restarts a failed job (--max-restarts) so that a
 * training resumes from its last committed checkpoint.
 *
 *   nabla launch -n N [--hosts FILE] [--slurm] [--threads-per-proc T]
 *                [--max-restarts K] [--dry-run] -- COMMAND [ARGS...]
 *
 * Each rank runs `nabla launch --as-rank -- COMMAND ...`: a wrapper that
 * starts COMMAND with pipes for its stdout and stderr, writes each complete
 * line in one write(), names the command's PID (a test kills a rank by it),
 * forwards SIGINT/SIGTERM/SIGHUP to it and exits with its status (128 +
 * signal when a signal ended it), which mpirun makes the job's.
 *
 * Whole lines. Open MPI forwards a rank's output in chunks of what it read,
 * which split lines when a rank writes fast (seen: 3 of 600 lines cut, the
 * pieces interleaved with the other rank's). So under mpirun the launcher
 * asks for --tag-output (every chunk and every line of it starts with
 * "[job,rank]<stdout>:") and the wrapper escapes every '[' of the command's
 * text (ESC 'L', ESC itself ESC ESC): then every '[' in mpirun's output
 * that starts a tag is a tag, the launcher reassembles each rank's lines
 * from the chunks and writes each whole, as "[rank R] line" (unescaped).
 * Open MPI's own messages (untagged) pass through as they are. Under srun
 * (line-buffered per task) the wrapper writes "[rank R] line" itself. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char usage_text[] =
    "usage: nabla launch -n N [--hosts FILE] [--slurm] [--threads-per-proc T] [--max-restarts K] [--dry-run]\n"
    "                    -- COMMAND [ARGS...]\n"
    "  runs COMMAND as N processes of one MPI job (Open MPI's mpirun; Slurm's srun with --slurm or when\n"
    "  $SLURM_JOB_ID is set); every line a rank prints comes out as \"[rank R] line\"; exits with the job's status\n"
    "  -n N                 processes (ranks)\n"
    "  --hosts FILE         an Open MPI hostfile (mpirun --hostfile; srun --nodefile)\n"
    "  --slurm              launch with srun (the default inside a Slurm allocation)\n"
    "  --threads-per-proc T NABLA_THREADS and OMP_NUM_THREADS of every process (default: this machine's\n"
    "                       CPUs / N, at least 1)\n"
    "  --max-restarts K     when the job fails (a rank died, a collective timed out), run it again, up to K\n"
    "                       times; `nabla train` resumes from its run dir's last committed checkpoint\n"
    "  --dry-run            print the command line and environment it would run, and exit\n"
    "example: nabla launch -n 2 --max-restarts 3 -- nabla train configs/gpt2-tiny.yaml --run-dir runs/dp "
    "mesh.data=2 grad_accum=2\n";

enum { LINE_MAX_BYTES = 4000 }; /* a line in one write, below PIPE_BUF (4096) */
enum { ESC = 1 };                 /* the escape of '[' (ESC 'L') and of itself (ESC ESC) under mpirun */

/* ---------------------------------------------------------------- the wrapper each rank runs */

static volatile pid_t wrapped_pid;

static void forward_signal(int sig) {
  if (wrapped_pid > 0) kill(wrapped_pid, sig);
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* nowhere to write: the output is lost, the command goes on */
    p += w;
    n -= (size_t)w;
  }
}

typedef struct line_buf {
  int in, out;      /* the command's pipe, and where its lines go (1 or 2) */
  bool escape;      /* under mpirun: '[' and ESC escaped, no prefix (the launcher adds it) */
  char buf[LINE_MAX_BYTES];
  size_t prefix;    /* "[rank R] " at the start of buf (0 when escaping) */
  size_t n;         /* bytes of the current line after the prefix */
} line_buf;

/* Writes the current line (prefix + text + newline) in one write. */
static void emit(line_buf *l) {
  l->buf[l->prefix + l->n] = '\n';
  write_all(l->out, l->buf, l->prefix + l->n + 1);
  l->n = 0;
}

/* Appends what was read; a line longer than the buffer goes out in pieces,
 * each a line of its own. */
static void take(line_buf *l, const char *p, size_t n) {
  size_t room = sizeof l->buf - l->prefix - 1;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\n') {
      emit(l);
      continue;
    }
    if (l->n + 2 > room) emit(l);
    if (l->escape && (c == '[' || c == ESC)) {
      l->buf[l->prefix + l->n++] = ESC;
      c = c == '[' ? 'L' : ESC;
    }
    l->buf[l->prefix + l->n++] = c;
  }
}

static const char *rank_from_env(void) {
  const char *keys[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const char *v = getenv(keys[i]);
    if (v && *v) return v;
  }
  return "?";
}

static int exit_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1; }

static int as_rank(char **cmd) {
  const char *rank = rank_from_env(), *attempt = getenv("NABLA_LAUNCH_ATTEMPT");
  int po[2], pe[2];
  if (pipe(po) || pipe(pe)) {
    fprintf(stderr, "[rank %s] nabla launch: pipe: %s\n", rank, strerror(errno));
    return 1;
  }
  struct sigaction sa = {.sa_handler = forward_signal};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "[rank %s] nabla launch: fork: %s\n", rank, strerror(errno));
    return 1;
  }
  if (pid == 0) {
    /* the command dies with its wrapper (mpirun may SIGKILL the wrapper) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
    execvp(cmd[0], cmd);
    fprintf(stderr, "nabla launch: cannot run '%s': %s\n", cmd[0], strerror(errno));
    _exit(127);
  }
  wrapped_pid = pid;
  close(po[1]);
  close(pe[1]);
  const char *esc = getenv("NABLA_LAUNCH_ESCAPE");
  static line_buf lines[2];
  for (int k = 0; k < 2; k++) {
    lines[k].in = k ? pe[0] : po[0];
    lines[k].out = k ? 2 : 1;
    lines[k].escape = esc && !strcmp(esc, "1");
    lines[k].prefix = lines[k].escape ? 0 : (size_t)snprintf(lines[k].buf, 64, "[rank %.20s] ", rank);
  }
  char hello[256];
  int hn = snprintf(hello, sizeof hello, "nabla launch: pid %d runs %.80s (attempt %s)\n", (int)pid, cmd[0],
                    attempt && *attempt ? attempt : "1");
  take(&lines[1], hello, (size_t)hn);
  int open_fds = 2;
  while (open_fds > 0) {
    struct pollfd pf[2];
    int np = 0;
    for (int k = 0; k < 2; k++)
      if (lines[k].in >= 0) pf[np++] = (struct pollfd){.fd = lines[k].in, .events = POLLIN};
    if (poll(pf, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < np; i++) {
      if (!pf[i].revents) continue;
      line_buf *l = pf[i].fd == lines[0].in ? &lines[0] : &lines[1];
      char tmp[4096];
      ssize_t r = read(l->in, tmp, sizeof tmp);
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) {
        take(l, tmp, (size_t)r);
        continue;
      }
      if (l->n) emit(l); /* a last line without its newline */
      close(l->in);
      l->in = -1;
      open_fds--;
    }
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return exit_status(st);
}

/* ---------------------------------------------------------------- the launcher */

/* The path of an executable named `name` on $PATH, into out; false if none. */
static bool find_on_path(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH");
  for (const char *p = path ? path : ""; *p;) {
    size_t n = strcspn(p, ":");
    if (n && snprintf(out, cap, "%.*s/%s", (int)n, p, name) < (int)cap && access(out, X_OK) == 0) return true;
    p += n + (p[n] == ':');
  }
  return false;
}

/* The shell's quoting of one word, for --dry-run and messages. */
static void print_quoted(FILE *f, const char *w) {
  if (*w && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+@%") == strlen(w)) {
    fputs(w, f);
    return;
  }
  fputc('\'', f);
  for (; *w; w++) *w == '\'' ? fputs("'\\''", f) : fputc(*w, f);
  fputc('\'', f);
}

static volatile pid_t job_pid;
static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
  interrupted = sig;
  if (job_pid > 0) kill(job_pid, sig);
}

/* ---------------------------------------------------------------- whole lines out of mpirun --tag-output */

typedef struct strbuf {
  char *p;
  size_t n, cap;
} strbuf;

static bool sb_put(strbuf *b, const char *p, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->n + n + 1) * 2;
    char *q = realloc(b->p, cap);
    if (!q) return false;
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return true;
}

/* One of mpirun's output pipes: bytes not parsed yet, the destination of
 * the bytes that follow (a rank's line, or -1: mpirun's own untagged text),
 * and a partial line per rank plus one untagged. */
typedef struct demux {
  int in, out;
  strbuf pend;
  int cur, n_ranks;
  strbuf *line; /* [n_ranks + 1]; the last: untagged */
} demux;

/* A tag "[J,R]<stdout>:" (stderr, stddiag) at p: 1 with its rank and
 * length, 0 if p holds no tag, -1 if p is a tag's beginning so far. */
static int parse_tag(const char *p, size_t n, int *rank, size_t *len) {
  size_t i = 1;
  long r = 0;
  for (int field = 0; field < 2; field++) {
    size_t d = i;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++)
      if (field == 1 && (r = r * 10 + (p[i] - '0')) > 1 << 24) return 0;
    if (i == n) return -1;
    if (i == d || p[i] != (field ? ']' : ',')) return 0;
    i++;
  }
  static const char *const kinds[] = {"<stdout>:", "<stderr>:", "<stddiag>:"};
  for (size_t k = 0; k < 3; k++) {
    size_t m = strlen(kinds[k]), have = n - i < m ? n - i : m;
    if (memcmp(p + i, kinds[k], have)) continue;
    if (have < m) return -1;
    *rank = (int)r;
    *len = i + m;
    return 1;
  }
  return 0;
}

/* Writes line k (a rank's, unescaped and prefixed; or untagged as it is) in one write. */
static void demux_emit(demux *d, int k) {
  strbuf *l = &d->line[k], out = {0};
  char pre[40];
  int pn = k < d->n_ranks ? snprintf(pre, sizeof pre, "[rank %d] ", k) : 0;
  bool ok = sb_put(&out, pre, (size_t)pn);
  for (size_t i = 0; ok && i < l->n; i++) {
    char c = l->p[i];
    if (k < d->n_ranks && c == ESC && i + 1 < l->n) c = l->p[++i] == 'L' ? '[' : l->p[i];
    ok = sb_put(&out, &c, 1);
  }
  if (ok && sb_put(&out, "\n", 1)) write_all(d->out, out.p, out.n);
  free(out.p);
  l->n = 0;
}

/* Parses what is pending; at eof, a tag cut short is text and partial lines go out. */
static void demux_run(demux *d, bool eof) {
  size_t i = 0;
  char *p = d->pend.p;
  while (i < d->pend.n) {
    if (p[i] == '[') {
      int r = 0;
      size_t len = 0;
      int t = parse_tag(p + i, d->pend.n - i, &r, &len);
      if (t < 0 && !eof) break;
      if (t > 0 && r < d->n_ranks) {
        d->cur = r;
        i += len;
        continue;
      }
    }
    int k = d->cur >= 0 ? d->cur : d->n_ranks;
    if (p[i] == '\n') {
      demux_emit(d, k);
      d->cur = -1; /* a rank's next line comes with its tag */
    } else if (!sb_put(&d->line[k], p + i, 1)) {
      break;
    }
    i++;
  }
  memmove(p, p + i, d->pend.n - i);
  d->pend.n -= i;
  for (int k = 0; eof && k <= d->n_ranks; k++)
    if (d->line[k].n) demux_emit(d, k);
}

/* Runs argv (the job) to its end, its output through the demultiplexer
 * when tagged; its exit status (128 + signal if one ended it). */
static int run_job(char **argv, int n_ranks, bool tagged) {
  int po[2] = {-1, -1}, pe[2] = {-1, -1};
  if (tagged && (pipe(po) || pipe(pe))) return fprintf(stderr, "nabla launch: pipe: %s\n", strerror(errno)), 1;
  pid_t pid = fork();
  if (pid < 0) return fprintf(stderr, "nabla launch: fork: %s\n", strerror(errno)), 1;
  if (pid == 0) {
    if (tagged) {
      dup2(po[1], 1);
      dup2(pe[1], 2);
      close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
    }
    execv(argv[0], argv);
    fprintf(stderr, "nabla launch: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  job_pid = pid;
  if (tagged) {
    close(po[1]);
    close(pe[1]);
    demux d[2];
    for (int k = 0; k < 2; k++) {
      d[k] = (demux){.in = k ? pe[0] : po[0], .out = k ? 2 : 1, .cur = -1, .n_ranks = n_ranks};
      d[k].line = calloc((size_t)n_ranks + 1, sizeof *d[k].line);
    }
    int open_fds = 2;
    while (open_fds > 0 && d[0].line && d[1].line) {
      struct pollfd pf[2];
      int np = 0;
      for (int k = 0; k < 2; k++)
        if (d[k].in >= 0) pf[np++] = (struct pollfd){.fd = d[k].in, .events = POLLIN};
      if (poll(pf, (nfds_t)np, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < np; i++) {
        if (!pf[i].revents) continue;
        demux *x = pf[i].fd == d[0].in ? &d[0] : &d[1];
        char tmp[8192];
        ssize_t r = read(x->in, tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        bool eof = r <= 0;
        if (!eof && !sb_put(&x->pend, tmp, (size_t)r)) eof = true;
        demux_run(x, eof);
        if (eof) {
          close(x->in);
          x->in = -1;
          open_fds--;
        }
      }
    }
    for (int k = 0; k < 2; k++) {
      if (d[k].in >= 0) close(d[k].in);
      for (int r = 0; d[k].line && r <= n_ranks; r++) free(d[k].line[r].p);
      free(d[k].line);
      free(d[k].pend.p);
    }
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  job_pid = 0;
  return exit_status(st);
}

typedef struct launch_args {
  int64_t n, threads, max_restarts;
  const char *hosts;
  bool slurm, dry_run;
  char **cmd; /* after "--" */
  int n_cmd;
} launch_args;

/* -1: go on; else the exit status (after a message). */
static int parse(int argc, char **argv, launch_args *a) {
  *a = (launch_args){.n = -1};
  int i = 1;
  for (; i < argc && strcmp(argv[i], "--"); i++) {
    const char *x = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(x, "-h") || !strcmp(x, "--help")) return nb_cli_usage(usage_text, true);
    if (!strcmp(x, "-n") || !strcmp(x, "--np")) {
      if (!v) return fprintf(stderr, "nabla launch: %s needs a value (the number of processes)\n", x), 2;
      if (!nb_cli_int("launch", x, v, INT64_MIN, INT64_MAX, &a->n)) return 2;
      if (a->n < 1) return fprintf(stderr, "nabla launch: -n %s: the number of processes must be at least 1\n", v), 2;
      if (a->n > 65536) return fprintf(stderr, "nabla launch: -n %s: at most 65536 processes\n", v), 2;
      i++;
    } else if (!strcmp(x, "--hosts")) {
      if (!v) return fprintf(stderr, "nabla launch: --hosts needs a file\n"), 2;
      if (access(v, R_OK)) return fprintf(stderr, "nabla launch: --hosts %s: %s\n", v, strerror(errno)), 2;
      a->hosts = argv[++i];
    } else if (!strcmp(x, "--threads-per-proc")) {
      if (!nb_cli_int("launch", x, v, 1, 65536, &a->threads)) return 2;
      i++;
    } else if (!strcmp(x, "--max-restarts")) {
      if (!nb_cli_int("launch", x, v, 0, 1000, &a->max_restarts)) return 2;
      i++;
    } else if (!strcmp(x, "--slurm")) {
      a->slurm = true;
    } else if (!strcmp(x, "--dry-run")) {
      a->dry_run = true;
    } else if (x[0] == '-') {
      fprintf(stderr, "nabla launch: unknown option '%s' (the command to run goes after --)\n", x);
      return nb_cli_usage(usage_text, false);
    } else {
      return fprintf(stderr, "nabla launch: missing '--' before the command '%s' (nabla launch -n N -- %s ...)\n", x, x), 2;
    }
  }
  if (a->n < 0) return fprintf(stderr, "nabla launch: -n N (the number of processes) is required\n"), 2;
  if (i >= argc)
    return fprintf(stderr, "nabla launch: missing '--' before the command (nabla launch -n %lld -- nabla train ...)\n",
                   (long long)a->n), 2;
  if (i + 1 >= argc) return fprintf(stderr, "nabla launch: no command after '--'\n"), 2;
  a->cmd = argv + i + 1;
  a->n_cmd = argc - i - 1;
  return -1;
}

int nb_cmd_launch(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--as-rank")) {
    if (argc < 4 || strcmp(argv[2], "--")) return fprintf(stderr, "nabla launch --as-rank: usage: --as-rank -- COMMAND ...\n"), 2;
    return as_rank(argv + 3);
  }
  launch_args a;
  int rc = parse(argc, argv, &a);
  if (rc >= 0) return rc;
  const char *slurm_job = getenv("SLURM_JOB_ID");
  bool slurm = a.slurm || (slurm_job && *slurm_job);
  const char *tool = slurm ? "srun" : "mpirun";
  char tool_path[PATH_MAX], self[PATH_MAX];
  if (!find_on_path(tool, tool_path, sizeof tool_path)) {
    if (!a.dry_run)
      return fprintf(stderr, "nabla launch: %s not found on $PATH (%s)\n", tool,
                     slurm ? "--slurm or $SLURM_JOB_ID asks for Slurm's srun" : "install Open MPI: apt-get install openmpi-bin"),
             1;
    snprintf(tool_path, sizeof tool_path, "%s", tool);
  }
  ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sn <= 0) return fprintf(stderr, "nabla launch: cannot find the nabla executable: %s\n", strerror(errno)), 1;
  self[sn] = 0;
  if (!a.threads) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    a.threads = cpus / a.n > 0 ? cpus / a.n : 1;
  }
  char threads[32], np[32], tasks[48], cpt[48], nodefile[PATH_MAX + 16];
  snprintf(threads, sizeof threads, "%lld", (long long)a.threads);
  snprintf(np, sizeof np, "%lld", (long long)a.n);
  snprintf(tasks, sizeof tasks, "--ntasks=%lld", (long long)a.n);
  snprintf(cpt, sizeof cpt, "--cpus-per-task=%lld", (long long)a.threads);
  setenv("NABLA_THREADS", threads, 1);
  setenv("OMP_NUM_THREADS", threads, 1);
  setenv("NABLA_LAUNCH_ESCAPE", slurm ? "0" : "1", 1);
  /* the job's command line: the launcher, then each rank's wrapper and the command */
  char **job = calloc((size_t)a.n_cmd + 32, sizeof *job);
  if (!job) return fprintf(stderr, "nabla launch: out of memory\n"), 1;
  int k = 0;
  job[k++] = tool_path;
  if (slurm) {
    job[k++] = tasks;
    job[k++] = cpt;
    job[k++] = (char *)"--kill-on-bad-exit=1"; /* one rank's failure ends the others */
    if (a.hosts) {
      snprintf(nodefile, sizeof nodefile, "--nodefile=%s", a.hosts);
      job[k++] = nodefile;
    }
  } else {
    /* threads of a process are not pinned to one core; the environment reaches other hosts */
    const char *m[] = {"-np", np, "--bind-to", "none", "--tag-output", "-x", "NABLA_THREADS", "-x", "OMP_NUM_THREADS",
                       "-x", "NABLA_LAUNCH_ATTEMPT", "-x", "NABLA_LAUNCH_ESCAPE"};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) job[k++] = (char *)m[i];
    if (a.hosts) job[k++] = (char *)"--hostfile", job[k++] = (char *)a.hosts;
  }
  job[k++] = self;
  job[k++] = (char *)"launch";
  job[k++] = (char *)"--as-rank";
  job[k++] = (char *)"--";
  for (int i = 0; i < a.n_cmd; i++) job[k++] = a.cmd[i];
  job[k] = NULL;
  if (a.dry_run) {
    printf("NABLA_THREADS=%s OMP_NUM_THREADS=%s NABLA_LAUNCH_ESCAPE=%s", threads, threads, slurm ? "0" : "1");
    for (int i = 0; i < k; i++) putchar(' '), print_quoted(stdout, job[i]);
    putchar('\n');
    free(job);
    return 0;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  for (int64_t attempt = 1;; attempt++) {
    char at[32];
    snprintf(at, sizeof at, "%lld", (long long)attempt);
    setenv("NABLA_LAUNCH_ATTEMPT", at, 1);
    fprintf(stderr, "nabla launch: %s processes x %s threads with %s (attempt %lld of %lld)\n", np, threads, tool,
            (long long)attempt, (long long)a.max_restarts + 1);
    rc = run_job(job, (int)a.n, !slurm);
    if (rc == 0 || interrupted) break;
    if (attempt > a.max_restarts) {
      if (a.max_restarts) fprintf(stderr, "nabla launch: the job failed (exit %d) after %lld restarts: giving up\n", rc,
                                  (long long)a.max_restarts);
      break;
    }
    fprintf(stderr, "nabla launch: the job failed (exit %d); restarting it (%lld of %lld restarts): a training resumes "
            "from its last committed checkpoint\n", rc, (long long)attempt, (long long)a.max_restarts);
    nanosleep(&(struct timespec){.tv_sec = 1}, NULL); /* let the dead job's ports and locks go */
    if (interrupted) break;
  }
  if (interrupted) fprintf(stderr, "nabla launch: interrupted by signal %d: not restarting\n", (int)interrupted);
  free(job);
  return rc;
}
