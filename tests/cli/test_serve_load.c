/* `nabla serve` under load: 64 concurrent streaming clients for a bounded
 * time (60 s; NABLA_SERVE_LOAD_SECONDS sets it; 10 s under the sanitizer
 * build, NABLA_SANITIZED=1), each sending request after request on its own
 * connection (prompts and max_tokens varied, some with stop strings or
 * n = 2). Checks: zero failed requests, every response complete (status
 * 200, a finish reason for every choice, the usage chunk, data: [DONE]
 * last), the server's resident memory flat after warm-up (VmRSS from
 * /proc/PID/status, sampled every 0.5 s: the largest sample of the last
 * three quarters at most 16 MiB above the largest of the first quarter (32
 * MiB under the sanitizers, run with an 8 MiB ASan quarantine), plus 2 MiB
 * per step executable compiled after the first quarter: a shape bucket
 * first met late keeps its code), the engine idle and every KV block free
 * at the end, and exit 0 on SIGTERM. NABLA_SERVE_LOAD_VERBOSE=1 prints RSS
 * and executables every 0.5 s. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testfs.h"
#include "testserve.h"

enum { CLIENTS = 64 };

static char work[4096], out[1 << 16], err[1 << 16];
static nb_test_server srv = {.pid = -1};
static double deadline;
static atomic_long ok_requests, failed_requests, tokens;

/* One request into dst (read until the server closes, or 60 s pass). */
static void request(const char *method, const char *path, const char *body, char *dst, size_t cap) {
  const char *b;
  nb_test_http(srv.port, method, path, NULL, body, body ? strlen(body) : 0, dst, cap, &b, 60);
}

/* A streamed answer is complete: status 200, n finish reasons, the usage
 * chunk, and data: [DONE] as the last event. */
static bool complete(const char *r, int n, char *why, size_t cap) {
  if (strncmp(r, "HTTP/1.1 200", 12)) return snprintf(why, cap, "status: %.60s", r), false;
  int finishes = 0;
  for (const char *at = r; (at = strstr(at, "\"finish_reason\":\"")); at++) finishes++;
  const char *done = strstr(r, "data: [DONE]");
  if (finishes != n) return snprintf(why, cap, "%d finish reasons for %d choices", finishes, n), false;
  if (!strstr(r, "\"usage\":{\"prompt_tokens\"")) return snprintf(why, cap, "no usage chunk"), false;
  if (!done || strstr(done + 1, "data: ")) return snprintf(why, cap, "no data: [DONE] at the end"), false;
  if (strstr(r, "\"error\"")) return snprintf(why, cap, "an error event"), false;
  return true;
}

static void *client(void *arg) {
  int id = (int)(intptr_t)arg;
  static __thread char r[1 << 18];
  char body[512], why[128];
  for (int k = 0; nb_test_now() < deadline; k++) {
    int n = (id + k) % 7 == 0 ? 2 : 1, max_tokens = 8 + (id * 13 + k * 7) % 56;
    snprintf(body, sizeof body,
             "{\"prompt\": \"line %d of a\", \"max_tokens\": %d, \"temperature\": 0, \"n\": %d, \"stream\": true, "
             "\"stream_options\": {\"include_usage\": true}%s}",
             id * 31 + k, max_tokens, n, (id + k) % 5 == 0 ? ", \"stop\": [\"corpus\"]" : "");
    request("POST", "/v1/completions", body, r, sizeof r);
    if (complete(r, n, why, sizeof why)) {
      atomic_fetch_add(&ok_requests, 1);
      const char *u = strstr(r, "\"completion_tokens\":");
      if (u) atomic_fetch_add(&tokens, atol(u + strlen("\"completion_tokens\":")));
    } else {
      if (atomic_fetch_add(&failed_requests, 1) < 5) fprintf(stderr, "client %d request %d: %s\n", id, k, why);
    }
  }
  return NULL;
}

/* The server's resident set in KiB, -1 when unreadable. */
static long rss_kib(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)srv.pid);
  char *s = nb_test_read_file(path, NULL);
  const char *at = s ? strstr(s, "VmRSS:") : NULL;
  long v = at ? atol(at + 6) : -1;
  free(s);
  return v;
}

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/serve_load");
  bool sanitized = getenv("NABLA_SANITIZED") && !strcmp(getenv("NABLA_SANITIZED"), "1");
  const char *env = getenv("NABLA_SERVE_LOAD_SECONDS");
  double seconds = env && atof(env) > 0 ? atof(env) : sanitized ? 10 : 60;
  long bound_kib = sanitized ? 32 * 1024 : 16 * 1024;
  nb_test_scratch_dir(work, sizeof work, "cli", "serve_load");
  if (chdir(work) != 0) return fprintf(stderr, "cannot enter %s\n", work), 1;
  signal(SIGPIPE, SIG_IGN);
  FILE *f = fopen("corpus.txt", "w");
  for (int i = 0; f && i < 300; i++) fprintf(f, "line %d of a small corpus for the serve test\n", i);
  if (f) fclose(f);
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && NABLA_PEAK_GFLOPS=10 %s train --run-dir run data.train=corpus.txt model.preset=gpt2-tiny "
           "model.n_layers=1 model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.d_ff=64 model.max_seq_len=128 "
           "data.seq_len=32 batch_size=8 steps=30 optim.lr=0.01 eval_every=0 log_every=100 checkpoint_every=0 --threads 1 </dev/null",
           work, bin);
  int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
  CHECK_MSG(rc == 0, "train: rc %d: %s", rc, err);
  /* under ASan, a small quarantine: freed memory it holds back would
   * otherwise fill 256 MiB during the run and hide (or fake) growth */
  if (!nb_test_serve_start(&srv, bin, work,
                           sanitized ? "ASAN_OPTIONS=\"$ASAN_OPTIONS:quarantine_size_mb=8:thread_local_quarantine_size_kb=64\" " : NULL,
                           "run", ""))
    return nb_test_summary("cli/serve_load");

  double start = nb_test_now();
  deadline = start + seconds;
  pthread_t th[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) pthread_create(&th[i], NULL, client, (void *)(intptr_t)i);
  /* resident memory: the first quarter is warm-up (buckets compile, buffers
   * grow), after it the footprint must stay flat */
  long warm = 0, after = 0, quarter[4] = {0};
  double exe_warm = -1;
  int samples = 0;
  static char m[1 << 16];
  while (nb_test_now() < deadline) {
    usleep(500000);
    long v = rss_kib();
    if (v < 0) continue;
    samples++;
    int q = (int)(4 * (nb_test_now() - start) / seconds);
    if (q > 3) q = 3;
    if (v > quarter[q]) quarter[q] = v;
    if (q == 0) warm = v > warm ? v : warm;
    else after = v > after ? v : after;
    if (q == 0 || exe_warm < 0 || getenv("NABLA_SERVE_LOAD_VERBOSE")) {
      request("GET", "/metrics", NULL, m, sizeof m);
      if (q == 0 || exe_warm < 0) exe_warm = nb_test_metric(m, "nabla:step_executables");
      if (getenv("NABLA_SERVE_LOAD_VERBOSE"))
        fprintf(stderr, "%.1f s: RSS %ld KiB, %g executables\n", nb_test_now() - start, v, nb_test_metric(m, "nabla:step_executables"));
    }
  }
  printf("largest RSS per quarter of the run: %ld %ld %ld %ld KiB\n", quarter[0], quarter[1], quarter[2], quarter[3]);
  for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
  double elapsed = nb_test_now() - start;
  long done = atomic_load(&ok_requests), failed = atomic_load(&failed_requests);
  printf("%d clients, %.1f s: %ld requests complete, %ld failed, %ld tokens (%.0f tokens/s); RSS %ld KiB after warm-up, "
         "at most %ld KiB later (%d samples)\n",
         CLIENTS, elapsed, done, failed, (long)atomic_load(&tokens), (double)atomic_load(&tokens) / elapsed, warm, after, samples);
  CHECK_MSG(failed == 0 && done >= CLIENTS, "%ld requests failed, %ld complete", failed, done);
  request("GET", "/metrics", NULL, m, sizeof m);
  double exe_end = nb_test_metric(m, "nabla:step_executables");
  /* each step executable compiled after warm-up (a new shape bucket: at
   * most log2 T x log2 S x log2 MB of them) keeps its code and plan: about
   * 0.8 MiB for this model, allowed 2 MiB */
  long allowed = bound_kib + (long)(2048 * (exe_end - exe_warm));
  printf("step executables: %g after warm-up, %g at the end\n", exe_warm, exe_end);
  CHECK_MSG(warm > 0 && after > 0 && after <= warm + allowed, "RSS grew from %ld KiB to %ld KiB (bound: +%ld KiB)", warm, after,
            allowed);
  CHECK_MSG(nb_test_metric(m, "nabla:num_requests_running") == 0 && nb_test_metric(m, "nabla:num_requests_waiting") == 0 &&
                nb_test_metric(m, "nabla:kv_cache_blocks_used") == 0 && nb_test_metric(m, "nabla:request_success_total{finished_reason=\"abort\"}") == 0,
            "the engine after the load: %s", m);
  nb_test_serve_stop(&srv);
  return nb_test_summary("cli/serve_load");
}
