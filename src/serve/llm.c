/* nb_serve_llm: an engine and its model step driven together. Requests go
 * in with their stop tokens; each step comes back as events, one per token
 * drawn or sample ended, with the end of each sample decided here
 * (max_tokens, an end-of-sequence or stop token once min_tokens are out, an
 * abort), so a server, the offline batch mode and rollouts share one loop. */
#include <string.h>

#include "serve/internal.h"
#include "util/trace.h"

/* What the loop keeps of a live request: its stop tokens and, per sample,
 * tokens generated so far (-1 once the sample ended). */
typedef struct llm_req {
  int64_t id;
  int32_t n, live;              /* samples, samples not ended */
  int32_t min_tokens;
  int32_t *stops, num_stops;
  int32_t *generated;           /* [n] */
  bool aborted;                 /* abort events are due at the next step */
} llm_req;

struct nb_serve_llm {
  nb_ctx *ctx;
  nb_serve_engine *engine;
  nb_serve_model *model;
  int32_t *eos, num_eos;
  llm_req **reqs;
  int32_t num_reqs, cap_reqs;
  nb_serve_sample_out *outs;    /* [max_num_seqs] */
  nb_serve_event *events;       /* [cap_events] */
  int32_t cap_events;
  int64_t steps; /* nb_serve_llm_step calls so far: the engine's step numbers */
};

static void req_free(nb_ctx *ctx, llm_req *r) {
  if (!r) return;
  nb_dealloc(ctx, r->stops, (size_t)r->num_stops * sizeof *r->stops);
  nb_dealloc(ctx, r->generated, (size_t)r->n * sizeof *r->generated);
  nb_dealloc(ctx, r, sizeof *r);
}

void nb_serve_llm_destroy(nb_serve_llm *l) {
  if (!l) return;
  nb_ctx *ctx = l->ctx;
  for (int32_t i = 0; i < l->num_reqs; i++) req_free(ctx, l->reqs[i]);
  nb_dealloc(ctx, l->reqs, (size_t)l->cap_reqs * sizeof *l->reqs);
  if (l->engine) nb_dealloc(ctx, l->outs, (size_t)nb_serve_engine_config(l->engine)->max_num_seqs * sizeof *l->outs);
  nb_dealloc(ctx, l->events, (size_t)l->cap_events * sizeof *l->events);
  nb_dealloc(ctx, l->eos, (size_t)l->num_eos * sizeof *l->eos);
  nb_serve_model_destroy(l->model);
  nb_serve_engine_destroy(l->engine);
  nb_dealloc(ctx, l, sizeof *l);
}

nb_serve_llm *nb_serve_llm_create(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *params,
                                  const nb_serve_llm_config *config) {
  if (!cfg || !params || !config)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve llm: NULL model config, params or config"), NULL;
  if (config->num_eos_token_ids < 0 || (config->num_eos_token_ids > 0 && !config->eos_token_ids))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve llm: num_eos_token_ids %d without eos_token_ids",
                     config->num_eos_token_ids),
           NULL;
  for (int32_t i = 0; i < config->num_eos_token_ids; i++)
    if (config->eos_token_ids[i] < 0 || config->eos_token_ids[i] >= cfg->vocab_size)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve llm: eos_token_ids[%d] = %d is outside the vocabulary [0, %lld)", i,
                       config->eos_token_ids[i], (long long)cfg->vocab_size),
             NULL;
  nb_serve_config ec = config->engine;
  if (!ec.kv.num_layers && !ec.kv.num_kv_heads && !ec.kv.head_dim && !ec.kv.dtype_size)
    ec.kv = (nb_serve_kv_geometry){.num_layers = cfg->n_layers, .num_kv_heads = cfg->n_kv_heads,
                                   .head_dim = nb_model_head_dim(cfg), .dtype_size = 4};
  nb_serve_llm *l = nb_calloc(ctx, sizeof *l);
  if (!l) return NULL;
  l->ctx = ctx;
  if (!(l->engine = nb_serve_engine_create(ctx, &ec)) ||
      !(l->model = nb_serve_model_create(ctx, cfg, params, nb_serve_engine_config(l->engine), &config->model))) {
    nb_serve_llm_destroy(l);
    return NULL;
  }
  int32_t ms = nb_serve_engine_config(l->engine)->max_num_seqs;
  l->outs = nb_calloc(ctx, (size_t)ms * sizeof *l->outs);
  l->num_eos = config->num_eos_token_ids;
  l->eos = l->num_eos ? nb_alloc(ctx, (size_t)l->num_eos * sizeof *l->eos) : NULL;
  if (!l->outs || (l->num_eos && !l->eos)) {
    l->num_eos = l->eos ? l->num_eos : 0;
    nb_serve_llm_destroy(l);
    return NULL;
  }
  if (l->num_eos) memcpy(l->eos, config->eos_token_ids, (size_t)l->num_eos * sizeof *l->eos);
  return l;
}

nb_serve_engine *nb_serve_llm_engine(nb_serve_llm *l) { return l ? l->engine : NULL; }
nb_serve_model *nb_serve_llm_model(nb_serve_llm *l) { return l ? l->model : NULL; }

static llm_req *find_req(const nb_serve_llm *l, int64_t id) {
  for (int32_t i = 0; i < l->num_reqs; i++)
    if (l->reqs[i]->id == id) return l->reqs[i];
  return NULL;
}

/* Forgets requests whose samples all ended and whose abort events went out. */
static void drop_ended(nb_serve_llm *l) {
  int32_t kept = 0;
  for (int32_t i = 0; i < l->num_reqs; i++) {
    llm_req *r = l->reqs[i];
    if (r->live == 0 && !r->aborted) req_free(l->ctx, r);
    else l->reqs[kept++] = r;
  }
  l->num_reqs = kept;
}

static nb_status reqs_reserve(nb_serve_llm *l) {
  if (l->num_reqs < l->cap_reqs) return NB_OK;
  int32_t cap = l->cap_reqs ? 2 * l->cap_reqs : 16;
  llm_req **g = nb_alloc(l->ctx, (size_t)cap * sizeof *g);
  if (!g) return NB_ERR_NOMEM;
  if (l->num_reqs) memcpy(g, l->reqs, (size_t)l->num_reqs * sizeof *g);
  nb_dealloc(l->ctx, l->reqs, (size_t)l->cap_reqs * sizeof *l->reqs);
  l->reqs = g;
  l->cap_reqs = cap;
  return NB_OK;
}

nb_status nb_serve_llm_add(nb_serve_llm *l, const nb_serve_llm_request *q) {
  if (!l || !q) return NB_ERR_INVALID_ARG;
  nb_ctx *ctx = l->ctx;
  drop_ended(l);
  if (find_req(l, q->r.id))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: the id is already in use", (long long)q->r.id);
  const nb_serve_sampling zero = {0}, *given = q->r.sampling ? q->r.sampling : &zero;
  if (given->num_stop_token_ids < 0 || (given->num_stop_token_ids > 0 && !given->stop_token_ids))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "serve request %lld: sampling.num_stop_token_ids %d without stop_token_ids",
                     (long long)q->r.id, given->num_stop_token_ids);
  llm_req *r = nb_calloc(ctx, sizeof *r);
  if (!r) return NB_ERR_NOMEM;
  r->id = q->r.id;
  r->n = r->live = q->r.n > 0 ? q->r.n : 1;
  r->min_tokens = given->min_tokens;
  int32_t eos = q->ignore_eos ? 0 : l->num_eos;
  r->num_stops = given->num_stop_token_ids + eos;
  r->stops = r->num_stops ? nb_alloc(ctx, (size_t)r->num_stops * sizeof *r->stops) : NULL;
  r->generated = nb_calloc(ctx, (size_t)r->n * sizeof *r->generated);
  nb_status s = (r->num_stops && !r->stops) || !r->generated ? NB_ERR_NOMEM : reqs_reserve(l);
  if (!s) {
    if (given->num_stop_token_ids)
      memcpy(r->stops, given->stop_token_ids, (size_t)given->num_stop_token_ids * sizeof *r->stops);
    if (eos) memcpy(r->stops + given->num_stop_token_ids, l->eos, (size_t)eos * sizeof *r->stops);
    /* the engine's copy names every token that ends the sample, so the
     * step masks all of them before min_tokens */
    nb_serve_sampling sp = *given;
    sp.stop_token_ids = r->stops;
    sp.num_stop_token_ids = r->num_stops;
    nb_serve_request er = q->r;
    er.sampling = &sp;
    s = nb_serve_model_check_sampling(l->model, er.id, &sp); /* refused alone, not in a step */
    if (!s) s = nb_serve_add_request(l->engine, &er);
  }
  if (s) {
    req_free(ctx, r);
    return s;
  }
  l->reqs[l->num_reqs++] = r;
  return NB_OK;
}

nb_status nb_serve_llm_abort(nb_serve_llm *l, int64_t id) {
  if (!l) return NB_ERR_INVALID_ARG;
  llm_req *r = find_req(l, id);
  if (!r || r->live == 0 || r->aborted)
    return nb_errorf(l->ctx, NB_ERR_NOT_FOUND, "serve: no unfinished request %lld to abort", (long long)id);
  nb_status s = nb_serve_abort_request(l->engine, id);
  if (s) return s;
  r->aborted = true;
  return NB_OK;
}

nb_status nb_serve_llm_finish(nb_serve_llm *l, int64_t id, int32_t k) {
  if (!l) return NB_ERR_INVALID_ARG;
  llm_req *r = find_req(l, id);
  if (!r || r->aborted || k < 0 || k >= r->n || r->generated[k] < 0)
    return nb_errorf(l->ctx, NB_ERR_NOT_FOUND, "serve: no unfinished request %lld sample %d", (long long)id, k);
  nb_status s = nb_serve_finish(l->engine, id, k);
  if (s) return s;
  r->generated[k] = -1;
  r->live--;
  return NB_OK;
}

bool nb_serve_llm_has_unfinished(const nb_serve_llm *l) {
  for (int32_t i = 0; l && i < l->num_reqs; i++)
    if (l->reqs[i]->live > 0 || l->reqs[i]->aborted) return true;
  return false;
}

static nb_serve_event *next_event(nb_serve_llm *l, int32_t *count) {
  if (*count == l->cap_events) {
    int32_t cap = l->cap_events ? 2 * l->cap_events : 64;
    nb_serve_event *g = nb_alloc(l->ctx, (size_t)cap * sizeof *g);
    if (!g) return NULL;
    if (*count) memcpy(g, l->events, (size_t)*count * sizeof *g);
    nb_dealloc(l->ctx, l->events, (size_t)l->cap_events * sizeof *l->events);
    l->events = g;
    l->cap_events = cap;
  }
  nb_serve_event *ev = &l->events[(*count)++];
  memset(ev, 0, sizeof *ev);
  return ev;
}

static bool is_stop(const llm_req *r, int32_t token) {
  for (int32_t i = 0; i < r->num_stops; i++)
    if (r->stops[i] == token) return true;
  return false;
}

static nb_status llm_step(nb_serve_llm *l, const nb_serve_event **events, int32_t *num_events) {
  *events = NULL;
  *num_events = 0;
  int32_t count = 0;
  /* aborts first: their samples take no token from this step */
  for (int32_t i = 0; i < l->num_reqs; i++) {
    llm_req *r = l->reqs[i];
    if (!r->aborted) continue;
    for (int32_t k = 0; k < r->n; k++) {
      if (r->generated[k] < 0) continue;
      nb_serve_event *ev = next_event(l, &count);
      if (!ev) return NB_ERR_NOMEM;
      *ev = (nb_serve_event){.s = {.request_id = r->id, .sample_index = k, .token = -1},
                             .num_generated = r->generated[k], .finish = NB_SERVE_FINISHED_ABORT};
      r->generated[k] = -1;
    }
    r->live = 0;
    r->aborted = false;
  }
  drop_ended(l);
  const nb_serve_batch *b;
  nb_status s = nb_serve_schedule(l->engine, &b);
  int32_t nout = 0;
  if (!s) s = nb_serve_model_step(l->model, b, l->outs, &nout);
  for (int32_t i = 0; !s && i < nout; i++) {
    const nb_serve_sample_out *o = &l->outs[i];
    llm_req *r = find_req(l, o->request_id);
    int32_t k = o->sample_index;
    if (!r || k < 0 || k >= r->n || r->generated[k] < 0) continue; /* ended while its step ran */
    bool length = false;
    s = nb_serve_append_token(l->engine, r->id, k, o->token, &length);
    if (s) break;
    int32_t gen = ++r->generated[k];
    nb_serve_finish_reason why = NB_SERVE_RUNNING;
    if (gen > r->min_tokens && is_stop(r, o->token)) why = NB_SERVE_FINISHED_STOP;
    else if (length) why = NB_SERVE_FINISHED_LENGTH;
    if (why == NB_SERVE_FINISHED_STOP && !length) s = nb_serve_finish(l->engine, r->id, k);
    nb_serve_event *ev = s ? NULL : next_event(l, &count);
    if (!s && !ev) s = NB_ERR_NOMEM;
    if (s) break;
    *ev = (nb_serve_event){.s = *o, .num_generated = gen, .finish = why};
    if (why != NB_SERVE_RUNNING) r->generated[k] = -1, r->live--;
  }
  *events = l->events;
  *num_events = count;
  return s;
}

/* Each step is one span in a trace ("serve", "engine step", its number), so
 * that a range of steps can be found and checked in it (--profile-steps). */
nb_status nb_serve_llm_step(nb_serve_llm *l, const nb_serve_event **events, int32_t *num_events) {
  if (!l || !events || !num_events) return NB_ERR_INVALID_ARG;
  int64_t t0 = nb_util__trace_start();
  nb_status s = llm_step(l, events, num_events);
  nb_util__trace_arg a = {"step", NULL, (double)++l->steps};
  nb_util__trace_span("serve", "engine step", t0, nb_util__now_ns(), &a, 1);
  return s;
}

int64_t nb_serve_llm_steps(const nb_serve_llm *l) { return l ? l->steps : 0; }
