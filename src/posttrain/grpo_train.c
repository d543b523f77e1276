/* GRPO as an on-policy task of the trainer (nb_train_task with
 * before_batch and evaluate): the grpo: keys of a run config, the prompts
 * (JSONL), rollouts through the serve engine (nb_serve_llm: batched, paged;
 * the policy's arrays handed over before each rollout phase), rewards,
 * group-normalized advantages, the loss graph (policy forward, the
 * reference's on the frozen start when beta > 0) and the held-out eval
 * (greedy completions of data.eval's prompts, their mean reward). The loop,
 * checkpoints and run dir are the trainer's (nb_train_run). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nabla/posttrain.h"
#include "nabla/tokenizer.h"
#include "util/util.h"

/* ---------------------------------------------------------------- config */

void nb_pt_grpo_config_defaults(nb_pt_grpo_config *c) {
  memset(c, 0, sizeof *c);
  c->loss = (nb_pt_grpo_opts){.loss_type = NB_PT_GRPO_DAPO, .epsilon_low = 0.2, .epsilon_high = 0.28, .beta = 0,
                              .max_completion_length = 16};
  c->num_generations = 8;
  c->max_completion_length = 16;
  c->eval_prompts = 64;
  c->temperature = 1.0;
  c->top_p = 1.0;
  c->stop_token_id = -1;
  c->scale_rewards = true;
  c->lora = (nb_pt_lora_config){.rank = 8, .alpha = 16};
}

static const char grpo_keys[] =
    "base, num_generations, max_completion_length, temperature, top_k, top_p, stop_token_id, loss_type, epsilon_low, "
    "epsilon_high, beta, scale_rewards, eval_prompts, rewards (a list of {kind, pattern, field, weight, target, scale})";

static nb_status bad(nb_ctx *ctx, const char *where, const char *key, const char *why) {
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: %s", where, key, why);
}

static nb_status set_bool(nb_ctx *ctx, const char *where, const char *key, const char *v, bool *dst) {
  if (!strcmp(v, "true")) *dst = true;
  else if (!strcmp(v, "false")) *dst = false;
  else return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not a boolean (true or false)", where, key, v);
  return NB_OK;
}

/* grpo.rewards.<i>.<field> */
static nb_status set_reward(nb_ctx *ctx, nb_pt_grpo_config *c, const char *where, const char *key, const char *rest,
                            const char *v) {
  char *end;
  long i = strtol(rest, &end, 10);
  if (end == rest || *end != '.' || i < 0 || i >= NB_PT_REWARD_MAX)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: rewards take at most %d entries, each a mapping", where, key, NB_PT_REWARD_MAX);
  if (i > c->n_rewards)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: grpo.rewards.%d is not set yet (entries go in order)", where, key, c->n_rewards);
  nb_pt_reward_spec *r = &c->rewards[i];
  if (i == c->n_rewards) {
    memset(r, 0, sizeof *r);
    r->weight = 1;
    c->n_rewards++;
  }
  const char *f = end + 1;
  char why[256];
  if (!strcmp(f, "kind")) {
    for (int k = 0; k < NB_PT_REWARD_KIND_COUNT; k++)
      if (!strcmp(v, nb_pt_reward_kind_name((nb_pt_reward_kind)k))) {
        r->kind = (nb_pt_reward_kind)k;
        return NB_OK;
      }
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not one of exact, format, length", where, key, v);
  }
  if (!strcmp(f, "pattern") || !strcmp(f, "field")) {
    char *dst = f[0] == 'p' ? r->pattern : r->field;
    size_t cap = f[0] == 'p' ? sizeof r->pattern : sizeof r->field;
    if (strlen(v) >= cap) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: longer than %zu bytes", where, key, cap - 1);
    snprintf(dst, cap, "%s", v);
    return NB_OK;
  }
  double *num = !strcmp(f, "weight") ? &r->weight : !strcmp(f, "target") ? &r->target : !strcmp(f, "scale") ? &r->scale : NULL;
  if (!num)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (a reward's keys: kind, pattern, field, weight, target, scale)",
                     where, key);
  if (!nb_parse_float(v, -1e30, 1e30, num, why, sizeof why)) return bad(ctx, where, key, why);
  return NB_OK;
}

static nb_status set_key(void *ud, nb_ctx *ctx, const char *where, const char *key, const char *v) {
  nb_pt_grpo_config *c = ud;
  char why[256];
  if (!strncmp(key, "lora.", 5)) {
    nb_status s = nb_pt__set_lora_key(ctx, where, key, v, c->lora_target, &c->lora);
    if (s != NB_ERR_NOT_FOUND) return s;
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (keys of lora: target, rank, alpha, dropout, rslora, init)",
                     where, key);
  }
  if (strncmp(key, "grpo.", 5)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s'", where, key);
  const char *k = key + 5;
  if (!strncmp(k, "rewards.", 8)) return set_reward(ctx, c, where, key, k + 8, v);
  if (!strcmp(k, "base")) {
    if (strlen(v) >= sizeof c->base) return bad(ctx, where, key, "too long");
    snprintf(c->base, sizeof c->base, "%s", v);
    return NB_OK;
  }
  if (!strcmp(k, "loss_type")) {
    for (int t = 0; t < NB_PT_GRPO_LOSS_COUNT; t++)
      if (!strcmp(v, nb_pt_grpo_loss_name((nb_pt_grpo_loss_type)t))) {
        c->loss.loss_type = (nb_pt_grpo_loss_type)t;
        return NB_OK;
      }
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %s: '%s' is not one of grpo, bnpo, dr_grpo, dapo", where, key, v);
  }
  if (!strcmp(k, "scale_rewards")) return set_bool(ctx, where, key, v, &c->scale_rewards);
  struct { const char *name; int64_t *p, lo, hi; } ints[] = {
      {"num_generations", &c->num_generations, 1, 1024}, {"max_completion_length", &c->max_completion_length, 1, 1 << 20},
      {"top_k", &c->top_k, 0, 1 << 30}, {"stop_token_id", &c->stop_token_id, -1, INT32_MAX}, {"eval_prompts", &c->eval_prompts, 0, 1 << 20}};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
    if (!strcmp(k, ints[i].name)) {
      if (!nb_parse_int(v, ints[i].lo, ints[i].hi, ints[i].p, why, sizeof why)) return bad(ctx, where, key, why);
      return NB_OK;
    }
  struct { const char *name; double *p, lo, hi; } nums[] = {
      {"temperature", &c->temperature, 0, 100}, {"top_p", &c->top_p, 0, 1}, {"epsilon_low", &c->loss.epsilon_low, 0, 0.999999},
      {"epsilon_high", &c->loss.epsilon_high, 0, 1e6}, {"beta", &c->loss.beta, 0, 1e6}};
  for (size_t i = 0; i < sizeof nums / sizeof *nums; i++)
    if (!strcmp(k, nums[i].name)) {
      if (!nb_parse_float(v, nums[i].lo, nums[i].hi, nums[i].p, why, sizeof why)) return bad(ctx, where, key, why);
      return NB_OK;
    }
  return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: unknown key '%s' (keys of grpo: %s)", where, key, grpo_keys);
}

nb_status nb_pt_grpo_config_load(nb_ctx *ctx, const char *path, int n_overrides, const char *const *overrides,
                                 nb_pt_grpo_config *grpo, nb_train_config *train) {
  static const char *const sections[] = {"grpo", "lora", NULL};
  nb_pt_grpo_config c;
  nb_pt_grpo_config_defaults(&c);
  nb_train_config_ext ext = {.sections = sections, .set = set_key, .ud = &c, .no_validate = true};
  nb_status s = nb_train_config_load_ext(ctx, path, n_overrides, overrides, &ext, train);
  if (!s && c.base[0] && train->init_from[0] && strcmp(c.base, train->init_from))
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "init_from '%s' and grpo.base '%s' name different models: give one", train->init_from, c.base);
  if (!s && train->init_from[0]) { /* the base is loaded here (the reference, the rollout engine's start) */
    snprintf(c.base, sizeof c.base, "%s", train->init_from);
    train->init_from[0] = 0;
  }
  if (!s && c.n_rewards == 0)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo.rewards: none given (a list such as [{kind: exact, pattern: '(-?\\d+)'}])");
  if (!s) { /* the patterns compile (errors name grpo.rewards[i].pattern) */
    nb_pt_rewards *r = nb_pt_rewards_create(ctx, c.rewards, c.n_rewards, "grpo.rewards");
    if (!r) s = nb_ctx_status(ctx);
    nb_pt_rewards_destroy(r);
  }
  if (!s && c.lora_target[0]) {
    nb_pt_lora_config lc = c.lora;
    lc.target = c.lora_target;
    s = nb_pt_lora_config_check(ctx, &lc);
  }
  c.loss.max_completion_length = c.max_completion_length;
  if (!s) *grpo = c;
  return s;
}

void nb_pt_grpo_config_write(const nb_pt_grpo_config *c, FILE *f) {
  fputs("grpo:\n  base: ", f), nb_pt__yaml_str(f, c->base);
  fprintf(f, "\n  num_generations: %lld\n  max_completion_length: %lld\n  temperature: %.17g\n  top_k: %lld\n  top_p: %.17g\n"
             "  stop_token_id: %lld\n  loss_type: %s\n  epsilon_low: %.17g\n  epsilon_high: %.17g\n  beta: %.17g\n"
             "  scale_rewards: %s\n  eval_prompts: %lld\n  rewards:\n",
          (long long)c->num_generations, (long long)c->max_completion_length, c->temperature, (long long)c->top_k, c->top_p,
          (long long)c->stop_token_id, nb_pt_grpo_loss_name(c->loss.loss_type), c->loss.epsilon_low, c->loss.epsilon_high,
          c->loss.beta, c->scale_rewards ? "true" : "false", (long long)c->eval_prompts);
  for (int i = 0; i < c->n_rewards; i++) {
    const nb_pt_reward_spec *r = &c->rewards[i];
    fprintf(f, "    - kind: %s\n      pattern: ", nb_pt_reward_kind_name(r->kind)), nb_pt__yaml_str(f, r->pattern);
    fputs("\n      field: ", f), nb_pt__yaml_str(f, r->field);
    fprintf(f, "\n      weight: %.17g\n      target: %.17g\n      scale: %.17g\n", r->weight, r->target, r->scale);
  }
  if (!c->lora_target[0]) return;
  fputs("lora:\n  target: ", f), nb_pt__yaml_str(f, c->lora_target);
  fprintf(f, "\n  rank: %lld\n  alpha: %.17g\n  dropout: %.17g\n  rslora: %s\n  init: %s\n", (long long)c->lora.rank,
          c->lora.alpha, c->lora.dropout, c->lora.rslora ? "true" : "false", nb_pt_lora_init_name(c->lora.init));
}

/* ---------------------------------------------------------------- prompts */

typedef struct prompt {
  char *text;
  int32_t *ids;
  int64_t n;
  int nf;
  char **keys, **values;
} prompt;

typedef struct prompts {
  int64_t n;
  prompt *p;
  int64_t tokens;
  uint64_t xxh3;
} prompts;

static void prompts_free(prompts *ps) {
  for (int64_t i = 0; i < ps->n; i++) {
    prompt *p = &ps->p[i];
    free(p->text);
    free(p->ids);
    for (int k = 0; k < p->nf; k++) free(p->keys[k]), free(p->values[k]);
    free(p->keys);
    free(p->values);
  }
  free(ps->p);
  memset(ps, 0, sizeof *ps);
}

/* one line's object -> p; errors name path:line and the field */
static nb_status parse_prompt(nb_ctx *ctx, const char *path, int64_t ln, const cJSON *j, const nb_data_tokenizer *tok,
                              int32_t bos, int64_t room, int64_t vocab, prompt *p) {
  if (!cJSON_IsObject(j)) return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: not a JSON object", path, (long long)ln);
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
  if (!pr) return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: prompt: missing", path, (long long)ln);
  if (!cJSON_IsString(pr) || !pr->valuestring[0])
    return nb_errorf(ctx, NB_ERR_FORMAT, "%s:%lld: prompt: must be a non-empty string", path, (long long)ln);
  nb_data_ids ids = {.ctx = ctx};
  if (bos >= 0 && nb_data_ids_push(&ids, &bos, 1)) return NB_ERR_NOMEM;
  nb_status s = tok->encode(tok->ud, ctx, pr->valuestring, strlen(pr->valuestring), &ids);
  if (s) {
    nb_data_ids_free(&ids);
    return nb_errorf(ctx, s, "%s:%lld: prompt: tokenizing: %s", path, (long long)ln, nb_ctx_error(ctx));
  }
  p->n = (int64_t)ids.len;
  p->ids = malloc((size_t)(p->n ? p->n : 1) * sizeof *p->ids); /* the context's buffer goes back now */
  if (p->ids) memcpy(p->ids, ids.ids, (size_t)p->n * sizeof *p->ids);
  nb_data_ids_free(&ids);
  if (!p->ids) return NB_ERR_NOMEM;
  for (int64_t i = 0; i < p->n; i++)
    if (p->ids[i] < 0 || p->ids[i] >= vocab)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s:%lld: prompt: token id %d is not below the model's vocab_size %lld", path,
                       (long long)ln, p->ids[i], (long long)vocab);
  if (p->n > room)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s:%lld: prompt: %lld tokens, but data.seq_len + 1 - grpo.max_completion_length "
                     "leaves room for %lld (raise data.seq_len or shorten the prompt)", path, (long long)ln, (long long)p->n,
                     (long long)room);
  if (!(p->text = strdup(pr->valuestring))) return NB_ERR_NOMEM;
  int n = cJSON_GetArraySize(j);
  p->keys = calloc((size_t)n, sizeof *p->keys), p->values = calloc((size_t)n, sizeof *p->values);
  if (!p->keys || !p->values) return NB_ERR_NOMEM;
  for (const cJSON *it = j->child; it; it = it->next) {
    if (!strcmp(it->string, "prompt") || cJSON_IsObject(it) || cJSON_IsArray(it) || cJSON_IsNull(it)) continue;
    char *v = cJSON_IsString(it) ? strdup(it->valuestring) : cJSON_PrintUnformatted(it);
    p->keys[p->nf] = strdup(it->string);
    p->values[p->nf++] = v;
    if (!v || !p->keys[p->nf - 1]) return NB_ERR_NOMEM;
  }
  return NB_OK;
}

typedef struct prompts_reader {
  const char *path;
  const nb_data_tokenizer *tok;
  int32_t bos;
  int64_t room, vocab, cap;
  prompts *out;
} prompts_reader;

static nb_status prompt_line(void *ud, nb_ctx *ctx, int64_t ln, const char *text, size_t len) {
  prompts_reader *r = ud;
  prompts *out = r->out;
  if (out->n == r->cap) {
    int64_t cap = r->cap ? 2 * r->cap : 64;
    prompt *g = realloc(out->p, (size_t)cap * sizeof *g);
    if (!g) return NB_ERR_NOMEM;
    out->p = g, r->cap = cap;
  }
  memset(&out->p[out->n], 0, sizeof *out->p);
  cJSON *j = cJSON_ParseWithLength(text, len);
  nb_status s = parse_prompt(ctx, r->path, ln, j, r->tok, r->bos, r->room, r->vocab, &out->p[out->n++]);
  if (s == NB_ERR_NOMEM && !nb_ctx_status(ctx)) nb_errorf(ctx, s, "%s: out of memory", r->path);
  cJSON_Delete(j);
  if (!s) out->tokens += out->p[out->n - 1].n;
  return s;
}

static nb_status prompts_load(nb_ctx *ctx, const char *key, const char *path, const nb_data_tokenizer *tok, int32_t bos,
                              int64_t room, int64_t vocab, prompts *out) {
  prompts_reader r = {.path = path, .tok = tok, .bos = bos, .room = room, .vocab = vocab, .out = out};
  nb_status s = nb_pt__jsonl_each(ctx, key, path, prompt_line, &r, &out->xxh3);
  if (!s && out->n == 0) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: '%s' holds no prompts", key, path);
  return s;
}

/* ---------------------------------------------------------------- the task */

typedef struct completion {
  int32_t *ids;
  int64_t n;
  bool stopped;
} completion;

typedef struct grpo_task {
  const nb_pt_grpo_config *gc;
  nb_train_config cfg;         /* the run's, model from the base */
  nb_model_loaded m;           /* the base (its params: the start and the reference) */
  nb_data_tokenizer tok;
  prompts train, eval;
  nb_pt_rewards *rewards;
  int n_rewards;
  nb_pt_lora_config lc;        /* LoRA (lc.target set): the adapters are the trained parameters, the base frozen */
  nb_tree *adapters;           /* their start */
  nb_pt_lora *lora;            /* the hook's plan */
  int threads;
  nb_serve_llm *llm;           /* created at the first rollout */
  int64_t step;                /* updates done before the coming rollout */
  double sync_s;               /* parameter hand-overs to the engine, in total */
  int64_t syncs;
  double rollout_s;            /* training rollouts (generation only), in total */
  double compile_s;            /* of which the engine's compiles */
  int64_t rollout_tokens;      /* completion tokens generated */
} grpo_task;

/* The engine's parameters are the trainer's arrays (retained, no copy). */
static nb_status sync_params(grpo_task *t, nb_ctx *ctx, const nb_tree *params) {
  double t0 = nb_util__now_s();
  nb_status s = NB_OK;
  nb_tree *merged = NULL; /* LoRA: the engine runs the base with the adapters merged in (the adapted kernels copied) */
  if (t->lora && !(merged = nb_pt_lora_merge(ctx, &t->lc, t->m.params, params))) return nb_ctx_status(ctx);
  if (merged) params = merged;
  if (!t->llm) {
    int64_t N = t->cfg.batch_size * t->gc->num_generations;
    if (t->gc->eval_prompts > N) N = t->gc->eval_prompts;
    int32_t len = (int32_t)(t->cfg.data.seq_len + 1), bs = 16;
    nb_serve_llm_config lc = {.engine = {.block_size = bs, .num_blocks = N * ((len + bs - 1) / bs) + 1,
                                         .max_num_seqs = (int32_t)N, .max_num_batched_tokens = (int32_t)(N * len > 2048 ? N * len : 2048),
                                         .max_model_len = len, .enable_prefix_caching = false},
                              .model = {.threads = t->threads}, .eos_token_ids = t->m.eos_ids, .num_eos_token_ids = t->m.n_eos};
    t->llm = nb_serve_llm_create(ctx, &t->cfg.model, params, &lc);
    if (!t->llm) s = nb_errorf(ctx, nb_ctx_status(ctx), "grpo: the rollout engine: %s", nb_ctx_error(ctx));
  } else {
    s = nb_serve_model_set_params(nb_serve_llm_model(t->llm), params);
  }
  nb_tree_destroy(merged);
  t->sync_s += nb_util__now_s() - t0;
  t->syncs++;
  return s;
}

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t h = (a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2))) * 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/* n prompts (rows) x G completions into out[i * G + k]; greedy, or sampled with
 * the request seeds mix(seed, i) (the engine's draws depend on them alone). */
static nb_status generate(grpo_task *t, nb_ctx *ctx, const prompts *ps, const int64_t *rows, int64_t n, int64_t G, bool greedy,
                          uint64_t seed, completion *out) {
  const nb_pt_grpo_config *gc = t->gc;
  double c0 = nb_serve_model_compile_s(nb_serve_llm_model(t->llm));
  double t0 = nb_util__now_s();
  int32_t stop = (int32_t)gc->stop_token_id;
  nb_status s = NB_OK;
  for (int64_t i = 0; !s && i < n; i++) {
    const prompt *p = &ps->p[rows[i]];
    nb_serve_sampling sp = {.temperature = greedy ? 0 : (float)gc->temperature, .top_k = (int32_t)gc->top_k,
                            .top_p = (float)gc->top_p, .seed = mix(seed, (uint64_t)i),
                            .stop_token_ids = stop >= 0 ? &stop : NULL, .num_stop_token_ids = stop >= 0};
    nb_serve_llm_request r = {.r = {.id = i, .prompt = p->ids, .prompt_len = (int32_t)p->n,
                                    .max_tokens = (int32_t)gc->max_completion_length, .n = (int32_t)G, .sampling = &sp}};
    s = nb_serve_llm_add(t->llm, &r);
  }
  for (int64_t i = 0; i < n * G; i++) {
    out[i] = (completion){.ids = calloc((size_t)gc->max_completion_length, sizeof(int32_t))};
    if (!out[i].ids && !s) s = nb_errorf(ctx, NB_ERR_NOMEM, "grpo: out of memory");
  }
  while (!s && nb_serve_llm_has_unfinished(t->llm)) {
    const nb_serve_event *ev;
    int32_t ne;
    if ((s = nb_serve_llm_step(t->llm, &ev, &ne))) break;
    for (int32_t k = 0; k < ne; k++) {
      completion *c = &out[ev[k].s.request_id * G + ev[k].s.sample_index];
      if (ev[k].s.token >= 0 && c->n < gc->max_completion_length) c->ids[c->n++] = ev[k].s.token;
      if (ev[k].finish == NB_SERVE_FINISHED_STOP) c->stopped = true;
    }
  }
  if (s) s = nb_errorf(ctx, s, "grpo: rollout: %s", nb_ctx_error(ctx));
  if (!greedy) { /* the training rollouts' numbers (evals are greedy) */
    for (int64_t i = 0; i < n * G; i++) t->rollout_tokens += out[i].n;
    t->rollout_s += nb_util__now_s() - t0;
    t->compile_s += nb_serve_model_compile_s(nb_serve_llm_model(t->llm)) - c0;
  }
  return s;
}

/* the text of ids (bytes for a byte-level model), NUL-terminated, malloc'd */
static char *detok(const grpo_task *t, const int32_t *ids, int64_t n) {
  size_t cap = 64, len = 0;
  char *s = malloc(cap);
  for (int64_t i = 0; s && i < n; i++) {
    uint8_t b;
    const uint8_t *bytes = &b;
    size_t bl = 1;
    if (t->m.tok) bytes = nb_tok_token_bytes(t->m.tok, ids[i], &bl);
    else b = (uint8_t)ids[i];
    if (!bytes) continue;
    if (len + bl + 1 > cap) {
      while (len + bl + 1 > cap) cap *= 2;
      char *g = realloc(s, cap);
      if (!g) return free(s), NULL;
      s = g;
    }
    memcpy(s + len, bytes, bl);
    len += bl;
  }
  if (s) s[len] = 0;
  return s;
}

/* each completion's weighted reward (total[i]) and per-reward values (per[i * K + k]) */
static nb_status score(grpo_task *t, nb_ctx *ctx, const prompts *ps, const int64_t *rows, int64_t n, int64_t G,
                       const completion *c, double *total, double *per) {
  int K = t->n_rewards;
  for (int64_t i = 0; i < n * G; i++) {
    const prompt *p = &ps->p[rows[i / G]];
    char *text = detok(t, c[i].ids, c[i].n);
    if (!text) return nb_errorf(ctx, NB_ERR_NOMEM, "grpo: out of memory");
    nb_pt_reward_in in = {.prompt = p->text, .prompt_ids = p->ids, .n_prompt = p->n, .completion = text,
                          .completion_ids = c[i].ids, .n_completion = c[i].n, .stopped = c[i].stopped, .n_fields = p->nf,
                          .keys = (const char *const *)p->keys, .values = (const char *const *)p->values};
    total[i] = nb_pt_rewards_score(t->rewards, &in, per + i * K);
    free(text);
  }
  return NB_OK;
}

static void completions_free(completion *c, int64_t n) {
  for (int64_t i = 0; c && i < n; i++) free(c[i].ids);
  free(c);
}

static nb_status put(nb_ctx *ctx, nb_tree *t, const char *name, nb_dtype dt, int rank, const int64_t *dims, const void *data) {
  nb_array *a = nb_array_create(ctx, dt, rank, dims, data);
  nb_status s = a ? nb_tree_set_array(t, name, a) : nb_ctx_status(ctx);
  nb_array_release(a);
  return s;
}

/* The rollout batch of the prompts in e ("index" i32 [B]): [B, G, T] rows of
 * prompt + completion, the advantages and what the metrics read. */
static nb_status rollout(void *ud, nb_ctx *ctx, nb_data_elem *e) {
  grpo_task *t = ud;
  const nb_array *idx = nb_tree_get_array(e->tree, "index");
  int64_t B = nb_array_size(idx), G = t->gc->num_generations, N = B * G, T = t->cfg.data.seq_len, K = t->n_rewards;
  int64_t *rows = malloc((size_t)B * sizeof *rows);
  completion *c = calloc((size_t)N, sizeof *c);
  double *total = calloc((size_t)N, sizeof *total), *per = calloc((size_t)(N * (K ? K : 1)), sizeof *per);
  double *adv = calloc((size_t)N, sizeof *adv), *sd = calloc((size_t)N, sizeof *sd);
  int32_t *in = calloc((size_t)(N * T), 4), *tg = calloc((size_t)(N * T), 4);
  float *mask = calloc((size_t)(N * T), 4), *f_adv = calloc((size_t)N, 4), *f_items = calloc((size_t)N, 4);
  float *f_rew = calloc((size_t)N, 4), *f_sd = calloc((size_t)N, 4), *f_len = calloc((size_t)N, 4), *f_stop = calloc((size_t)N, 4);
  float *f_per = calloc((size_t)(N * (K ? K : 1)), 4);
  nb_status s = rows && c && total && per && adv && sd && in && tg && mask && f_adv && f_items && f_rew && f_sd && f_len && f_stop && f_per
                    ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "grpo: out of memory");
  for (int64_t b = 0; !s && b < B; b++) rows[b] = (int64_t)nb_array_get(idx, b);
  if (!s) s = generate(t, ctx, &t->train, rows, B, G, false, mix((uint64_t)t->cfg.seed, (uint64_t)t->step), c);
  if (!s) s = score(t, ctx, &t->train, rows, B, G, c, total, per);
  if (!s) nb_pt_grpo_advantages(total, B, G, t->gc->scale_rewards, adv, sd);
  double items = 0;
  for (int64_t i = 0; !s && i < N; i++) {
    const prompt *p = &t->train.p[rows[i / G]];
    int64_t np = p->n, len = np + c[i].n; /* row: prompt then completion, next-token pairs up to len - 1 */
    for (int64_t k = 0; k + 1 < len && k < T; k++) {
      in[i * T + k] = k < np ? p->ids[k] : c[i].ids[k - np];
      tg[i * T + k] = k + 1 < np ? p->ids[k + 1] : c[i].ids[k + 1 - np];
      mask[i * T + k] = k + 1 >= np ? 1.0f : 0.0f;
      items += mask[i * T + k];
    }
    f_adv[i] = (float)adv[i];
    f_rew[i] = (float)(isnan(total[i]) ? 0 : total[i]);
    f_sd[i] = (float)sd[i];
    f_len[i] = (float)c[i].n;
    f_stop[i] = c[i].stopped ? 1.0f : 0.0f;
    for (int64_t k = 0; k < K; k++) f_per[i * K + k] = (float)(isnan(per[i * K + k]) ? 0 : per[i * K + k]);
  }
  /* dapo: the batch's completion tokens per micro-batch, so that the trainer's mean over micro-batches is one token mean */
  for (int64_t i = 0; !s && i < N; i++) f_items[i] = (float)(items / (double)t->cfg.grad_accum);
  nb_tree *bt = s ? NULL : nb_tree_create(ctx);
  if (!s && !bt) s = NB_ERR_NOMEM;
  int64_t d3[3] = {B, G, T}, d2[2] = {B, G}, dk[3] = {B, G, K};
  if (!s) s = put(ctx, bt, "inputs", NB_I32, 3, d3, in);
  if (!s) s = put(ctx, bt, "targets", NB_I32, 3, d3, tg);
  if (!s) s = put(ctx, bt, "mask", NB_F32, 3, d3, mask);
  if (!s) s = put(ctx, bt, "advantages", NB_F32, 2, d2, f_adv);
  if (!s) s = put(ctx, bt, "num_items", NB_F32, 2, d2, f_items);
  if (!s) s = put(ctx, bt, "reward", NB_F32, 2, d2, f_rew);
  if (!s) s = put(ctx, bt, "reward_std", NB_F32, 2, d2, f_sd);
  if (!s) s = put(ctx, bt, "completion_length", NB_F32, 2, d2, f_len);
  if (!s) s = put(ctx, bt, "stopped", NB_F32, 2, d2, f_stop);
  if (!s && K) s = put(ctx, bt, "rewards", NB_F32, 3, dk, f_per);
  if (!s) nb_data_elem_set_tree(ctx, e, bt);
  else nb_tree_destroy(bt);
  completions_free(c, N);
  free(rows), free(total), free(per), free(adv), free(sd), free(in), free(tg), free(mask);
  free(f_adv), free(f_items), free(f_rew), free(f_sd), free(f_len), free(f_stop), free(f_per);
  return s;
}

static nb_status before_batch(void *ud, nb_ctx *ctx, const nb_tree *params, int64_t step) {
  grpo_task *t = ud;
  t->step = step;
  return sync_params(t, ctx, params);
}

/* Greedy completions of the first eval_prompts prompts of data.eval: the
 * mean reward (and each reward's) as eval_reward, eval_rewards/<name>;
 * the loss is minus the mean reward. */
static nb_status evaluate(void *ud, nb_ctx *ctx, const nb_tree *params, int64_t step, double *loss, nb_tree *metrics) {
  grpo_task *t = ud;
  (void)step;
  nb_status s = sync_params(t, ctx, params);
  int64_t n = t->eval.n < t->gc->eval_prompts ? t->eval.n : t->gc->eval_prompts, K = t->n_rewards;
  if (!s && n < 1) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo.eval_prompts: 0, but eval_every > 0 (set eval_every=0)");
  int64_t *rows = calloc((size_t)n, sizeof *rows);
  completion *c = calloc((size_t)n, sizeof *c);
  double *total = calloc((size_t)n, sizeof *total), *per = calloc((size_t)(n * (K ? K : 1)), sizeof *per);
  if (!s && (!rows || !c || !total || !per)) s = nb_errorf(ctx, NB_ERR_NOMEM, "grpo: out of memory");
  for (int64_t i = 0; !s && i < n; i++) rows[i] = i;
  if (!s) s = generate(t, ctx, &t->eval, rows, n, 1, true, 0, c);
  if (!s) s = score(t, ctx, &t->eval, rows, n, 1, c, total, per);
  double sum = 0, len = 0, ksum[NB_PT_REWARD_MAX + 8] = {0};
  for (int64_t i = 0; !s && i < n; i++) {
    sum += isnan(total[i]) ? 0 : total[i];
    len += (double)c[i].n;
    for (int64_t k = 0; k < K; k++) ksum[k] += isnan(per[i * K + k]) ? 0 : per[i * K + k];
  }
  struct { char name[96]; double v; } out[NB_PT_REWARD_MAX + 10];
  int no = 0;
  snprintf(out[no].name, sizeof out[no].name, "eval_reward"), out[no++].v = sum / (double)n;
  snprintf(out[no].name, sizeof out[no].name, "eval_completion_length"), out[no++].v = len / (double)n;
  for (int64_t k = 0; k < K; k++)
    snprintf(out[no].name, sizeof out[no].name, "eval_rewards/%s", nb_pt_rewards_name(t->rewards, (int)k)), out[no++].v = ksum[k] / (double)n;
  for (int i = 0; !s && i < no; i++) {
    nb_array *a = nb_array_scalar(ctx, NB_F64, out[i].v);
    s = a ? nb_tree_set_array(metrics, out[i].name, a) : nb_ctx_status(ctx);
    nb_array_release(a);
  }
  if (!s) *loss = -sum / (double)n;
  completions_free(c, n);
  free(rows), free(total), free(per);
  return s;
}

static const char *const f32_fields[] = {"reward", "reward_std", "completion_length", "stopped"};

static nb_tree *batch_spec(void *ud, nb_ctx *ctx, const nb_train_config *c, int64_t rows) {
  const grpo_task *t = ud;
  int64_t G = t->gc->num_generations, d3[3] = {rows, G, c->data.seq_len}, d2[2] = {rows, G}, dk[3] = {rows, G, t->n_rewards};
  nb_tree *b = nb_tree_create(ctx);
  nb_status s = b ? NB_OK : NB_ERR_NOMEM;
  if (!s) s = nb_tree_set(b, "inputs", nb_leaf_aval(nb_aval_make(NB_I32, 3, d3)));
  if (!s) s = nb_tree_set(b, "targets", nb_leaf_aval(nb_aval_make(NB_I32, 3, d3)));
  if (!s) s = nb_tree_set(b, "mask", nb_leaf_aval(nb_aval_make(NB_F32, 3, d3)));
  if (!s) s = nb_tree_set(b, "advantages", nb_leaf_aval(nb_aval_make(NB_F32, 2, d2)));
  if (!s) s = nb_tree_set(b, "num_items", nb_leaf_aval(nb_aval_make(NB_F32, 2, d2)));
  for (int i = 0; !s && i < 4; i++) s = nb_tree_set(b, f32_fields[i], nb_leaf_aval(nb_aval_make(NB_F32, 2, d2)));
  if (!s && t->n_rewards) s = nb_tree_set(b, "rewards", nb_leaf_aval(nb_aval_make(NB_F32, 3, dk)));
  if (s) nb_tree_destroy(b);
  return s ? NULL : b;
}

typedef struct loss_job {
  const grpo_task *t;
  const nb_train_config *cfg;
  nb_model_trace_opts mo;
} loss_job;

/* [B, G, ...] -> [B*G, ...] */
static nb_val *flat(nb_val *x) {
  int r = nb_val_rank(x);
  int64_t d[4] = {nb_val_dim(x, 0) * nb_val_dim(x, 1)};
  for (int i = 2; i < r; i++) d[i - 1] = nb_val_dim(x, i);
  return nb_reshape(x, r - 1, d);
}

static nb_val *mean_all(nb_val *v) {
  int64_t n = 1;
  for (int i = 0; i < nb_val_rank(v); i++) n *= nb_val_dim(v, i);
  return nb_div(nb_reduce_sum(v, 0, NULL), nb_scalar(nb_val_graph(v), nb_val_dtype(v), (double)n));
}

static nb_status loss_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  const loss_job *j = u;
  const grpo_task *t = j->t;
  nb_ctx *ctx = nb_graph_ctx(g);
  nb_tree *params = nb_tree_select_prefix(in, "params", true), *frozen = nb_tree_select_prefix(in, "frozen", true);
  nb_status s = params && frozen ? NB_OK : NB_ERR_NOMEM;
  nb_val *x = flat(nb_tree_get_val(in, "batch/inputs")), *y = flat(nb_tree_get_val(in, "batch/targets"));
  nb_val *m = flat(nb_tree_get_val(in, "batch/mask"));
  /* LoRA: the adapters (params) beside the frozen base, through the LoRA hook */
  nb_tree *policy = t->lora ? nb_tree_copy(params) : NULL;
  if (t->lora && (!policy || nb_tree_merge(policy, NULL, frozen))) s = NB_ERR_NOMEM;
  nb_nn_apply a = {.g = g, .params = t->lora ? policy : params, .train = j->mo.train, .rng = nb_tree_get_val(in, "rng"),
                   .dtype = j->mo.dtype, .linear_hook = t->lora ? nb_pt_lora_hook : j->mo.linear_hook,
                   .hook_ud = t->lora ? t->lora : j->mo.hook_ud};
  nb_val *logits = s ? NULL : nb_model_forward(&a, &j->cfg->model, &(nb_model_fwd){.tokens = x, .remat = j->mo.remat}, NULL);
  nb_val *ref = NULL;
  if (!s && t->gc->loss.beta > 0) { /* the reference: the frozen start, no dropout */
    nb_nn_apply r = {.g = g, .params = frozen, .dtype = j->mo.dtype};
    ref = nb_pt_token_logps(nb_model_forward(&r, &j->cfg->model, &(nb_model_fwd){.tokens = x}, NULL), y);
  }
  nb_pt_grpo_out go = {0};
  if (!s) s = nb_graph_status(g);
  if (!s) s = nb_pt_grpo_loss(&t->gc->loss, &(nb_pt_grpo_in){.logits = logits, .targets = y, .mask = m, .ref_logps = ref,
                                                             .advantages = flat(nb_tree_get_val(in, "batch/advantages")),
                                                             .num_items = flat(nb_tree_get_val(in, "batch/num_items"))}, &go);
  if (!s) s = nb_tree_set_val(out, "loss", go.loss);
  struct { const char *name; nb_val *v; } ms[] = {
      {"kl", go.kl}, {"clip_ratio/low_mean", go.clip_low}, {"clip_ratio/high_mean", go.clip_high},
      {"clip_ratio/region_mean", go.clip_region}};
  for (size_t i = 0; !s && i < sizeof ms / sizeof *ms; i++) {
    char p[96];
    snprintf(p, sizeof p, "metrics/%s", ms[i].name);
    if (ms[i].v) s = nb_tree_set_val(out, p, ms[i].v);
  }
  for (int i = 0; !s && i < 4; i++) { /* the rollout's numbers, means over the completions */
    char p[96];
    snprintf(p, sizeof p, "metrics/%s", f32_fields[i]);
    char b[96];
    snprintf(b, sizeof b, "batch/%s", f32_fields[i]);
    s = nb_tree_set_val(out, p, mean_all(nb_tree_get_val(in, b)));
  }
  for (int k = 0; !s && k < t->n_rewards; k++) {
    nb_val *r = nb_tree_get_val(in, "batch/rewards");
    int64_t lo[3] = {0, 0, k}, hi[3] = {nb_val_dim(r, 0), nb_val_dim(r, 1), k + 1};
    char p[128];
    snprintf(p, sizeof p, "metrics/rewards/%s", nb_pt_rewards_name(t->rewards, k));
    s = nb_tree_set_val(out, p, mean_all(nb_slice(r, lo, hi, NULL)));
  }
  nb_tree_destroy(policy);
  nb_tree_destroy(params);
  nb_tree_destroy(frozen);
  return s ? s : nb_ctx_status(ctx);
}

static nb_graph *trace_loss(void *ud, nb_ctx *ctx, const nb_train_config *c, const nb_model_trace_opts *mo,
                            const nb_tree *param_spec, const nb_tree *frozen_spec, const nb_tree *bs) {
  loss_job j = {.t = ud, .cfg = c, .mo = *mo};
  nb_tree *spec = nb_tree_create(ctx);
  nb_graph *g = NULL;
  int64_t two = 2;
  if (spec && !nb_tree_merge(spec, "params", param_spec) && !nb_tree_merge(spec, "frozen", frozen_spec) &&
      !nb_tree_merge(spec, "batch", bs) && !(mo->train && nb_tree_set(spec, "rng", nb_leaf_aval(nb_aval_make(NB_U32, 1, &two)))))
    g = nb_trace(ctx, loss_fn, &j, spec);
  nb_tree_destroy(spec);
  return g;
}

/* the train prompts' indices, shuffled per epoch by seed, batch_size at a time, each batch rolled out */
static nb_status open_data(void *ud, nb_ctx *ctx, const nb_train_config *c, const char *run_dir, nb_train_task_data *out) {
  grpo_task *t = ud;
  (void)run_dir;
  if (t->train.n < c->batch_size)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo: data.train '%s' holds %lld prompts, fewer than batch_size %lld",
                     c->data.train, (long long)t->train.n, (long long)c->batch_size);
  int32_t *ix = malloc((size_t)t->train.n * sizeof *ix);
  if (!ix) return nb_errorf(ctx, NB_ERR_NOMEM, "grpo: out of memory");
  for (int64_t i = 0; i < t->train.n; i++) ix[i] = (int32_t)i;
  nb_tree *tr = nb_tree_create(ctx);
  nb_status s = tr ? put(ctx, tr, "index", NB_I32, 1, &t->train.n, ix) : NB_ERR_NOMEM;
  free(ix);
  nb_data_map *ds = s ? NULL : nb_data_map_arrays(ctx, tr);
  nb_tree_destroy(tr);
  if (s) return s;
  ds = nb_data_map_batch(nb_data_map_repeat(nb_data_map_shuffle(ds, (uint64_t)c->seed), 0), c->batch_size, true);
  /* no prefetch: a batch must be rolled out by the parameters of its own step */
  out->train = ds ? nb_data_iter_map(nb_data_iter_create(ds), rollout, t) : NULL;
  if (!out->train) return nb_ctx_status(ctx);
  out->n_train = t->train.n;
  out->n_eval = t->eval.n;
  out->tokens = t->train.tokens;
  out->xxh3 = t->train.xxh3;
  out->eval = NULL; /* eval is the task's own (evaluate) */
  return NB_OK;
}

static void write_config(void *ud, FILE *f) { nb_pt_grpo_config_write(((const grpo_task *)ud)->gc, f); }

nb_status nb_pt_grpo_run(nb_ctx *ctx, const nb_pt_grpo_config *gc, const nb_train_config *cfg_in, const nb_train_opts *opts_in,
                         nb_pt_rewards *extra, nb_train_result *out, nb_pt_grpo_stats *stats) {
  if (!gc || !cfg_in || !opts_in) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo: NULL config or options");
  grpo_task t = {.gc = gc, .cfg = *cfg_in, .threads = opts_in->threads, .tok = nb_data_tokenizer_bytes()};
  nb_status s = NB_OK;
  nb_tree *start = NULL;
  if (gc->base[0]) {
    if (!(s = nb_pt__load_base(ctx, "grpo.base", gc->base, &t.m))) {
      t.cfg.model = t.m.cfg;
      t.cfg.model.scan_layers = cfg_in->model.scan_layers;
      if (t.m.tok) t.tok = nb_data_tokenizer_bpe(t.m.tok);
      start = t.m.params;
    }
  } else {
    t.m.bos_id = -1;
    nb_array *key = nb_key(ctx, (uint64_t)t.cfg.seed);
    start = t.m.params = key ? nb_model_init(ctx, &t.cfg.model, key) : NULL;
    nb_array_release(key);
    if (!start) s = nb_ctx_status(ctx);
  }
  if (!s) s = nb_train_config_validate(ctx, &t.cfg);
  if (!s && t.cfg.mesh.data > 1) /* each process would roll out and score its own prompts: not wired yet */
    s = nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "grpo: mesh.data %lld: data-parallel GRPO is not supported yet (one process)",
                  (long long)t.cfg.mesh.data);
  int64_t room = t.cfg.data.seq_len + 1 - gc->max_completion_length;
  if (!s && room < 1)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo.max_completion_length %lld leaves no room for a prompt in data.seq_len %lld + 1",
                  (long long)gc->max_completion_length, (long long)t.cfg.data.seq_len);
  if (!s && !t.cfg.data.train[0]) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "data.train: not set (a JSONL file of prompts)");
  if (!s) s = prompts_load(ctx, "data.train", t.cfg.data.train, &t.tok, t.m.bos_id, room, t.cfg.model.vocab_size, &t.train);
  if (!s && t.cfg.eval_every > 0) {
    if (!t.cfg.data.eval[0]) s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "data.eval: not set (held-out prompts; or eval_every=0)");
    else s = prompts_load(ctx, "data.eval", t.cfg.data.eval, &t.tok, t.m.bos_id, room, t.cfg.model.vocab_size, &t.eval);
  }
  if (!s && !(t.rewards = nb_pt_rewards_create(ctx, gc->rewards, gc->n_rewards, "grpo.rewards"))) s = nb_ctx_status(ctx);
  for (int i = 0; !s && extra && i < nb_pt_rewards_count(extra); i++) /* the caller's callbacks join the built-ins */
    s = nb_pt__rewards_share(t.rewards, extra, i);
  t.n_rewards = nb_pt_rewards_count(t.rewards);
  if (!s && gc->lora_target[0]) { /* as nabla sft: A from the seed's "LoRA" stream, B zeros, so the start is the base */
    t.lc = gc->lora;
    t.lc.target = gc->lora_target;
    nb_array *root = nb_key(ctx, (uint64_t)t.cfg.seed);
    nb_array *key = root ? nb_key_fold_in(ctx, root, 0x4c6f5241u) : NULL;
    t.adapters = key ? nb_pt_lora_init(ctx, &t.lc, start, key, NB_F32) : NULL;
    nb_array_release(root);
    nb_array_release(key);
    t.lora = t.adapters ? nb_pt_lora_create(ctx, &t.lc, start, t.adapters) : NULL;
    if (!t.lora) s = nb_ctx_status(ctx);
  }
  /* the frozen tree: the LoRA base (also the reference), or the reference of a full fine-tuning with beta > 0 */
  nb_train_task task = {.name = "grpo", .rows_per_example = gc->num_generations, .batch_spec = batch_spec,
                        .trace_loss = trace_loss, .open_data = open_data,
                        .init_params = t.lora ? t.adapters : start, .frozen = t.lora || gc->loss.beta > 0 ? start : NULL,
                        .write_config = write_config,
                        .before_batch = before_batch, .evaluate = evaluate, .ud = &t};
  nb_train_opts o = *opts_in;
  o.task = &task;
  if (!s) s = nb_train_run(ctx, &t.cfg, &o, out);
  if (stats) *stats = (nb_pt_grpo_stats){.syncs = t.syncs, .sync_s = t.sync_s, .rollout_tokens = t.rollout_tokens,
                                         .rollout_s = t.rollout_s, .compile_s = t.compile_s, .merged = t.lora != NULL};
  nb_serve_llm_destroy(t.llm);
  nb_pt_lora_destroy(t.lora);
  nb_tree_destroy(t.adapters);
  nb_pt_rewards_destroy(t.rewards);
  prompts_free(&t.train);
  prompts_free(&t.eval);
  nb_model_loaded_free(&t.m);
  return s;
}
