/* `nabla serve`'s engine thread: one thread owns the nb_serve_llm (engine +
 * model step). Consumers (HTTP handler threads, the batch loop) hand it jobs
 * through a queue under the server's mutex and wait on their job's own
 * condition variable for its events; the engine thread adds what was
 * queued, applies aborts and stop-string finishes, steps while anything is
 * unfinished, routes each event to its job, keeps the metrics, and sleeps
 * on the server's condition variable when there is nothing to do. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"
#include "util/trace.h"

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------- jobs */

job *job_new(server *sv, creq *q, pthread_mutex_t *mu, pthread_cond_t *cv) {
  job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  int32_t nch = q->num_prompts * q->n;
  j->ch = calloc((size_t)nch, sizeof *j->ch);
  j->t_last = calloc((size_t)nch, sizeof *j->t_last);
  j->first_seen = calloc((size_t)q->num_prompts, sizeof *j->first_seen);
  if (!j->ch || !j->t_last || !j->first_seen) {
    free(j->ch), free(j->t_last), free(j->first_seen), free(j);
    return NULL;
  }
  j->sv = sv;
  atomic_init(&j->refs, 1);
  if (mu) {
    j->mu = mu, j->cv = cv;
  } else {
    pthread_mutex_init(&j->own_mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&j->own_cv, &a);
    pthread_condattr_destroy(&a);
    j->mu = &j->own_mu, j->cv = &j->own_cv;
  }
  j->q = *q;
  *q = (creq){0};
  for (int32_t i = 0; i < nch; i++) choice_init(sv, &j->ch[i], &j->q, i / j->q.n);
  j->t_arrival = now_s();
  return j;
}

void job_unref(job *j) {
  if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
  for (int32_t i = 0; i < j->q.num_prompts * j->q.n; i++) choice_free(&j->ch[i]);
  free(j->ch);
  free(j->t_last);
  free(j->first_seen);
  free(j->ev);
  free(j->error);
  creq_free(&j->q);
  if (j->mu == &j->own_mu) {
    pthread_mutex_destroy(&j->own_mu);
    pthread_cond_destroy(&j->own_cv);
  }
  free(j);
}

static bool push(void *arr, int *n, int *cap, size_t size, const void *item) {
  void **a = arr;
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 16;
    void *g = realloc(*a, (size_t)c * size);
    if (!g) return false;
    *a = g, *cap = c;
  }
  memcpy((char *)*a + (size_t)(*n)++ * size, item, size);
  return true;
}

void job_submit(job *j) {
  server *sv = j->sv;
  if (j->q.max_tokens == 0) { /* nothing to generate: done at once */
    for (int32_t i = 0; i < j->q.num_prompts * j->q.n; i++) j->ch[i].finish = "length";
    return;
  }
  atomic_fetch_add(&j->refs, 1); /* the engine's */
  pthread_mutex_lock(&sv->mu);
  bool ok = push(&sv->adds, &sv->n_adds, &sv->cap_adds, sizeof j, &j);
  pthread_cond_signal(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
  if (!ok) {
    pthread_mutex_lock(j->mu);
    j->error = strdup("out of memory");
    pthread_mutex_unlock(j->mu);
    job_unref(j);
  }
}

void job_cancel(job *j) {
  server *sv = j->sv;
  pthread_mutex_lock(&sv->mu);
  atomic_fetch_add(&j->refs, 1); /* until the engine thread took the command */
  if (!push(&sv->aborts, &sv->n_aborts, &sv->cap_aborts, sizeof j, &j)) atomic_fetch_sub(&j->refs, 1);
  pthread_cond_signal(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
}

bool job_done(job *j) {
  if (j->failed) return true;
  for (int32_t i = 0; i < j->q.num_prompts * j->q.n; i++)
    if (!j->ch[i].finish) return false;
  return true;
}

bool job_pump(job *j, int32_t max) {
  server *sv = j->sv;
  pthread_mutex_lock(j->mu);
  nb_serve_event one, *ev = j->ev;
  int32_t n = j->n_ev;
  if (max > 0 && n > max) { /* the first max events; the rest stay queued */
    n = max;
    ev = max == 1 ? &one : malloc((size_t)max * sizeof *ev);
    if (ev) {
      memcpy(ev, j->ev, (size_t)max * sizeof *ev);
      memmove(j->ev, j->ev + max, (size_t)(j->n_ev - max) * sizeof *ev);
      j->n_ev -= max;
    } else {
      n = 0;
    }
  } else {
    j->ev = NULL, j->n_ev = j->cap_ev = 0;
  }
  j->failed = j->error;
  bool failed = j->failed != NULL;
  pthread_mutex_unlock(j->mu);
  for (int32_t e = 0; !failed && e < n; e++) {
    int32_t p = (int32_t)(ev[e].s.request_id - j->first_id), k = ev[e].s.sample_index;
    if (p < 0 || p >= j->q.num_prompts || k < 0 || k >= j->q.n) continue;
    if (choice_event(sv, &j->ch[p * j->q.n + k], &j->q, &ev[e])) { /* a stop string: the engine ends the sample */
      finish_cmd f = {.j = j, .prompt = p, .sample = k};
      pthread_mutex_lock(&sv->mu);
      atomic_fetch_add(&j->refs, 1);
      if (!push(&sv->finishes, &sv->n_finishes, &sv->cap_finishes, sizeof f, &f)) atomic_fetch_sub(&j->refs, 1);
      pthread_cond_signal(&sv->cv);
      pthread_mutex_unlock(&sv->mu);
    }
  }
  if (ev != &one) free(ev);
  return job_done(j);
}

/* ---------------------------------------------------------------- metrics */

static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                 2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
static const double e2e_le[] = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,    2.5,   5.0,
                                10.0, 15.0,  20.0, 30.0, 40.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static void hist_init(histogram *h, const double *le, int n) { *h = (histogram){.le = le, .n = n}; }

static void hist_add(histogram *h, double v) {
  int i = 0;
  while (i < h->n && v > h->le[i]) i++;
  h->count[i]++;
  h->sum += v;
}

static void metric_head(buf *o, const char *name, const char *type, const char *help) {
  char line[512];
  snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  buf_str(o, line);
}

static void metric(buf *o, const char *name, const char *type, const char *help, double v) {
  char line[256];
  metric_head(o, name, type, help);
  snprintf(line, sizeof line, "%s %.17g\n", name, v);
  buf_str(o, line);
}

static void hist_text(buf *o, const char *name, const char *help, const histogram *h) {
  char line[256];
  metric_head(o, name, "histogram", help);
  uint64_t cum = 0;
  for (int i = 0; i <= h->n; i++) {
    cum += h->count[i];
    if (i < h->n) snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    else snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    buf_str(o, line);
  }
  snprintf(line, sizeof line, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)cum);
  buf_str(o, line);
}

char *metrics_text(server *sv) {
  pthread_mutex_lock(&sv->mu);
  metrics m = sv->met;
  pthread_mutex_unlock(&sv->mu);
  const nb_serve_stats *s = &m.stats;
  buf o = {0};
  int64_t used = s->num_blocks - s->num_free_blocks;
  metric(&o, "nabla:num_requests_running", "gauge", "Sequences holding KV blocks in the engine.", s->num_running);
  metric(&o, "nabla:num_requests_waiting", "gauge", "Sequences waiting for the engine (new or preempted).", s->num_waiting);
  metric(&o, "nabla:kv_cache_blocks_used", "gauge", "KV cache blocks held by sequences.", (double)used);
  metric(&o, "nabla:kv_cache_blocks_total", "gauge", "KV cache blocks in all.", (double)s->num_blocks);
  metric(&o, "nabla:kv_cache_usage_perc", "gauge", "Fraction of the KV cache blocks held (0 to 1).",
         s->num_blocks ? (double)used / (double)s->num_blocks : 0);
  metric(&o, "nabla:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         (double)s->prefix_cache_queries);
  metric(&o, "nabla:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", (double)s->prefix_cache_hits);
  metric(&o, "nabla:num_preemptions_total", "counter", "Sequences preempted (to be recomputed) for lack of KV blocks.",
         (double)s->num_preemptions);
  metric(&o, "nabla:engine_steps_total", "counter", "Engine steps run.", (double)s->num_steps);
  metric(&o, "nabla:step_executables", "gauge", "Model step executables compiled (shape buckets).", m.num_executables);
  metric(&o, "nabla:prompt_tokens_total", "counter", "Prompt tokens of the requests submitted.", (double)m.prompt_tokens);
  metric(&o, "nabla:generation_tokens_total", "counter", "Tokens generated.", (double)m.generation_tokens);
  metric(&o, "nabla:requests_total", "counter", "Engine requests submitted (one per prompt).", (double)m.requests);
  metric_head(&o, "nabla:request_success_total", "counter",
              "Samples (choices) finished, by reason: stop (end of sequence, stop token or string), length, abort.");
  static const char *const why[] = {"", "length", "stop", "abort"};
  for (int i = 1; i < 4; i++) {
    char line[128];
    snprintf(line, sizeof line, "nabla:request_success_total{finished_reason=\"%s\"} %llu\n", why[i],
             (unsigned long long)m.finished[i]);
    buf_str(&o, line);
  }
  hist_text(&o, "nabla:time_to_first_token_seconds", "Time from a request's arrival to its first token, per prompt.", &m.ttft);
  hist_text(&o, "nabla:inter_token_latency_seconds", "Time between consecutive tokens of a sample.", &m.itl);
  hist_text(&o, "nabla:e2e_request_latency_seconds", "Time from a request's arrival to the end of its last sample.", &m.e2e);
  return o.data;
}

/* ---------------------------------------------------------------- the engine thread */

/* Jobs the engine is running, by first_id (ids grow with submission, so
 * appending keeps the list sorted). */
typedef struct running {
  job **jobs;
  int n, cap;
} running;

static job *find_job(running *r, int64_t id) {
  int lo = 0, hi = r->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    job *j = r->jobs[mid];
    if (id < j->first_id) hi = mid - 1;
    else if (id >= j->first_id + j->q.num_prompts) lo = mid + 1;
    else return j;
  }
  return NULL;
}

static void drop_finished(running *r) {
  int kept = 0;
  for (int i = 0; i < r->n; i++) {
    job *j = r->jobs[i];
    if (j->live > 0) r->jobs[kept++] = j;
    else job_unref(j);
  }
  r->n = kept;
}

/* Hands events to their job (under its lock) and wakes its consumer. */
static void deliver(job *j, const nb_serve_event *ev, int32_t n, const char *error) {
  pthread_mutex_lock(j->mu);
  if (error && !j->error) j->error = strdup(error);
  for (int32_t i = 0; i < n; i++) {
    if (j->n_ev == j->cap_ev) {
      int32_t cap = j->cap_ev ? 2 * j->cap_ev : 16;
      nb_serve_event *g = realloc(j->ev, (size_t)cap * sizeof *g);
      if (!g) {
        if (!j->error) j->error = strdup("out of memory");
        break;
      }
      j->ev = g, j->cap_ev = cap;
    }
    j->ev[j->n_ev++] = ev[i];
  }
  pthread_cond_broadcast(j->cv);
  pthread_mutex_unlock(j->mu);
}

/* A sample ended: counted (under sv->mu, held by the caller). */
static void ended(server *sv, job *j, nb_serve_finish_reason why, double t) {
  sv->met.finished[why]++;
  if (j->live == 1) hist_add(&sv->met.e2e, t - j->t_arrival);
  j->live--;
}

/* The engine's counters, refreshed before any event goes out, so that a
 * client that saw an event sees metrics at least that new. Under sv->mu. */
static void refresh_stats(server *sv) {
  nb_serve_get_stats(nb_serve_llm_engine(sv->llm), &sv->met.stats);
  sv->met.num_executables = nb_serve_model_num_executables(nb_serve_llm_model(sv->llm));
}

static void add_job(server *sv, running *r, job *j, int64_t *next_id) {
  j->first_id = *next_id;
  *next_id += j->q.num_prompts;
  j->live = 0;
  for (int32_t p = 0; p < j->q.num_prompts; p++) {
    nb_serve_llm_request rq = {.r = {.id = j->first_id + p, .prompt = j->q.prompts[p].ids,
                                     .prompt_len = (int32_t)j->q.prompts[p].len, .max_tokens = (int32_t)j->q.max_tokens,
                                     .n = j->q.n, .sampling = &j->q.sp},
                               .ignore_eos = j->q.ignore_eos};
    if (nb_serve_llm_add(sv->llm, &rq)) {
      char msg[1200];
      snprintf(msg, sizeof msg, "the engine refused prompt %d: %s", p, nb_ctx_error(sv->ctx));
      deliver(j, NULL, 0, msg);
      for (int32_t q = 0; q < p; q++) nb_serve_llm_abort(sv->llm, j->first_id + q); /* their abort events follow */
      break;
    }
    j->live += j->q.n;
    pthread_mutex_lock(&sv->mu);
    sv->met.prompt_tokens += j->q.prompts[p].len;
    sv->met.requests++;
    pthread_mutex_unlock(&sv->mu);
  }
  if (!j->live || !push(&r->jobs, &r->n, &r->cap, sizeof j, &j)) {
    if (!j->live) job_unref(j);
    else deliver(j, NULL, 0, "out of memory"), job_unref(j);
  }
}

static void abort_job(server *sv, job *j) {
  for (int32_t p = 0; p < j->q.num_prompts; p++) nb_serve_llm_abort(sv->llm, j->first_id + p);
  nb_ctx_clear_error(sv->ctx);
}

/* Counts a step's events, then hands each run of events of one job over. */
static void route(server *sv, running *r, const nb_serve_event *ev, int32_t n) {
  double t = now_s();
  pthread_mutex_lock(&sv->mu);
  refresh_stats(sv);
  for (int32_t e = 0; e < n; e++) {
    const nb_serve_event *x = &ev[e];
    job *j = find_job(r, x->s.request_id);
    if (!j) continue;
    int32_t p = (int32_t)(x->s.request_id - j->first_id), c = p * j->q.n + x->s.sample_index;
    if (x->s.token >= 0) {
      sv->met.generation_tokens++;
      if (!j->first_seen[p]) j->first_seen[p] = true, hist_add(&sv->met.ttft, t - j->t_arrival);
      if (j->t_last[c] > 0) hist_add(&sv->met.itl, t - j->t_last[c]);
      j->t_last[c] = t;
    }
    if (x->finish != NB_SERVE_RUNNING) ended(sv, j, x->finish, t);
  }
  pthread_mutex_unlock(&sv->mu);
  for (int32_t i = 0; i < n;) {
    job *j = find_job(r, ev[i].s.request_id);
    int32_t k = i + 1; /* a run of events of the same job goes at once */
    while (k < n && j && ev[k].s.request_id >= j->first_id && ev[k].s.request_id < j->first_id + j->q.num_prompts) k++;
    if (j) deliver(j, ev + i, k - i, NULL);
    i = k;
  }
}

static void *engine_main(void *arg) {
  server *sv = arg;
  nb_util__trace_thread_name("nabla-engine");
  running r = {0};
  int64_t next_id = 1;
  job **adds = NULL, **aborts = NULL;
  finish_cmd *fins = NULL;
  int n_adds = 0, n_aborts = 0, n_fins = 0, cap_adds = 0, cap_aborts = 0, cap_fins = 0;
  pthread_mutex_lock(&sv->mu);
  for (;;) {
    while (!sv->n_adds && !sv->n_aborts && !sv->n_finishes && !sv->quit && !sv->abort_all &&
           !nb_serve_llm_has_unfinished(sv->llm))
      pthread_cond_wait(&sv->cv, &sv->mu);
    if (sv->quit && !sv->n_adds && !nb_serve_llm_has_unfinished(sv->llm)) break;
    /* take the commands: swap the queues with this thread's empty ones */
    job **ta = sv->adds, **tb = sv->aborts;
    finish_cmd *tf = sv->finishes;
    int ca = sv->cap_adds, cb = sv->cap_aborts, cf = sv->cap_finishes;
    n_adds = sv->n_adds, n_aborts = sv->n_aborts, n_fins = sv->n_finishes;
    sv->adds = adds, sv->aborts = aborts, sv->finishes = fins;
    sv->cap_adds = cap_adds, sv->cap_aborts = cap_aborts, sv->cap_finishes = cap_fins;
    sv->n_adds = sv->n_aborts = sv->n_finishes = 0;
    adds = ta, aborts = tb, fins = tf, cap_adds = ca, cap_aborts = cb, cap_fins = cf;
    bool abort_all = sv->abort_all || sv->quit || atomic_load(&sv->stopping);
    sv->abort_all = false;
    pthread_mutex_unlock(&sv->mu);

    for (int i = 0; i < n_adds; i++) add_job(sv, &r, adds[i], &next_id);
    for (int i = 0; i < n_fins; i++) {
      finish_cmd *f = &fins[i];
      if (f->j->live > 0 && !nb_serve_llm_finish(sv->llm, f->j->first_id + f->prompt, f->sample)) {
        pthread_mutex_lock(&sv->mu);
        ended(sv, f->j, NB_SERVE_FINISHED_STOP, now_s());
        pthread_mutex_unlock(&sv->mu);
      }
      nb_ctx_clear_error(sv->ctx); /* NOT_FOUND: it ended on its own meanwhile */
      job_unref(f->j);
    }
    for (int i = 0; i < n_aborts; i++) {
      if (aborts[i]->live > 0) abort_job(sv, aborts[i]);
      job_unref(aborts[i]);
    }
    if (abort_all)
      for (int i = 0; i < r.n; i++) abort_job(sv, r.jobs[i]);
    drop_finished(&r);
    if (n_adds || n_aborts || n_fins || abort_all) { /* admissions show before a long step (a compile) */
      pthread_mutex_lock(&sv->mu);
      refresh_stats(sv);
      pthread_mutex_unlock(&sv->mu);
    }

    if (nb_serve_llm_has_unfinished(sv->llm)) {
      const nb_serve_event *ev = NULL;
      int32_t n = 0;
      nb_status s = nb_cli_llm_step("serve", &sv->opt.prof, sv->ctx, sv->llm, &ev, &n);
      route(sv, &r, ev, n);
      if (s) { /* the step failed: every running job gets the error and ends */
        char msg[1200];
        snprintf(msg, sizeof msg, "generation failed: %s", nb_ctx_error(sv->ctx));
        fprintf(stderr, "nabla serve: %s\n", msg);
        for (int i = 0; i < r.n; i++) {
          deliver(r.jobs[i], NULL, 0, msg);
          abort_job(sv, r.jobs[i]);
        }
      }
      drop_finished(&r);
    }
    pthread_mutex_lock(&sv->mu);
    refresh_stats(sv);
  }
  pthread_mutex_unlock(&sv->mu);
  for (int i = 0; i < r.n; i++) {
    deliver(r.jobs[i], NULL, 0, "the server is shutting down");
    job_unref(r.jobs[i]);
  }
  free(r.jobs);
  free(adds), free(aborts), free(fins);
  return NULL;
}

bool engine_start(server *sv) {
  hist_init(&sv->met.ttft, ttft_le, (int)(sizeof ttft_le / sizeof *ttft_le));
  hist_init(&sv->met.itl, itl_le, (int)(sizeof itl_le / sizeof *itl_le));
  hist_init(&sv->met.e2e, e2e_le, (int)(sizeof e2e_le / sizeof *e2e_le));
  nb_serve_get_stats(nb_serve_llm_engine(sv->llm), &sv->met.stats);
  sv->engine_started = !pthread_create(&sv->engine, NULL, engine_main, sv);
  return sv->engine_started;
}

void engine_stop(server *sv) {
  if (!sv->engine_started) return;
  pthread_mutex_lock(&sv->mu);
  sv->quit = true;
  pthread_cond_signal(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
  pthread_join(sv->engine, NULL);
  sv->engine_started = false;
  for (int i = 0; i < sv->n_adds; i++) job_unref(sv->adds[i]);
  for (int i = 0; i < sv->n_aborts; i++) job_unref(sv->aborts[i]);
  for (int i = 0; i < sv->n_finishes; i++) job_unref(sv->finishes[i].j);
  free(sv->adds), free(sv->aborts), free(sv->finishes);
  sv->adds = sv->aborts = NULL, sv->finishes = NULL;
  sv->n_adds = sv->n_aborts = sv->n_finishes = 0;
}
