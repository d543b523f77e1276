/* `nabla serve`'s private header: what its files share. serve.c: options,
 * the model, start-up and shutdown; serve_text.c: byte buffers, UTF-8, the
 * tokenizer and chat templates; serve_api.c: OpenAI request fields and
 * response JSON, and the text of each choice (stop strings, logprobs);
 * serve_engine.c: the engine thread, jobs and metrics; serve_http.c: the
 * HTTP endpoints (libmicrohttpd); serve_batch.c: --batch files. */
#ifndef NABLA_TOOL_SERVE_INT_H
#define NABLA_TOOL_SERVE_INT_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cli.h"
#include "nabla/nabla.h"

/* ---------------------------------------------------------------- text (serve_text.c) */

typedef struct buf {
  char *data;
  size_t len, cap;
} buf;

bool buf_add(buf *b, const void *p, size_t n);
bool buf_str(buf *b, const char *s);
bool utf8_valid(const char *s, size_t n);
/* How much of s[0..n) can be released: all but a trailing sequence that may
 * still complete with the next token's bytes. */
size_t utf8_complete_prefix(const char *s, size_t n);
/* Appends s[0..n) with every invalid byte replaced by U+FFFD. */
bool utf8_append_lossy(buf *out, const char *s, size_t n);


/* ---------------------------------------------------------------- the server */

typedef struct options {
  const char *model, *config, *host, *api_key, *name, *chat_template, *batch, *output;
  int64_t port, max_body, timeout, max_model_len;
  int64_t max_num_seqs, max_num_batched_tokens, block_size, kv_cache_bytes;
  double kv_cache_fraction;
  bool prefix_caching;
  int threads;
  nb_cli_prof_steps prof; /* --profile-steps, --profile-out */
} options;

/* Prometheus histogram: counts per upper bound (cumulative when printed). */
#define HIST_MAX 24
typedef struct histogram {
  const double *le;
  int n;
  uint64_t count[HIST_MAX + 1]; /* [n]: above every bound */
  double sum;
} histogram;

typedef struct metrics {
  nb_serve_stats stats;         /* the engine's, after the last step */
  int num_executables;
  uint64_t prompt_tokens, generation_tokens, requests;
  uint64_t finished[4];         /* by nb_serve_finish_reason (stop strings count as stop) */
  histogram ttft, itl, e2e;
} metrics;

typedef struct job job;
typedef struct finish_cmd {
  job *j;
  int32_t prompt, sample;
} finish_cmd;

typedef struct server {
  options opt;
  nb_ctx *ctx;
  nb_model_loaded m;
  nb_quant_plan *plan;          /* a quantized model's linears (NULL: plain) */
  int64_t max_model_len;
  nb_serve_chat_format chat;  /* nabla/serve.h's chat templates */
  char chat_why[4400];          /* why chat is off (NB_SERVE_CHAT_NONE) */
  int32_t im_end_id;            /* the chat format's end-of-turn token, -1: none */
  time_t created;
  atomic_ulong next_id;         /* response ids */
  atomic_bool stopping;         /* SIGTERM: in-flight requests end now */
  atomic_int active;            /* HTTP requests begun and not yet completed */
  /* the engine, owned by the engine thread; the rest under mu */
  nb_serve_llm *llm;
  pthread_t engine;
  bool engine_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;            /* the engine thread sleeps here when idle */
  job **adds;                   /* jobs to submit */
  int n_adds, cap_adds;
  job **aborts;                 /* jobs whose client went away */
  int n_aborts, cap_aborts;
  finish_cmd *finishes;         /* samples a stop string ended */
  int n_finishes, cap_finishes;
  bool abort_all, quit;
  metrics met;
} server;

/* ---------------------------------------------------------------- requests (serve_api.c) */

/* A completion request, validated. */
typedef struct creq {
  bool chat, stream, include_usage, echo;
  int32_t n, num_prompts;
  nb_tok_ids *prompts;          /* [num_prompts] */
  buf *echo_text;               /* [num_prompts] when echo */
  int64_t max_tokens;
  nb_serve_sampling sp;         /* its arrays point at the fields below */
  int32_t *bias_ids, *stop_ids;
  float *bias_values;
  bool ignore_eos;
  char *stop[5];                /* stop strings (owned): up to 4, and the chat format's end of turn */
  int n_stop;
  int logprobs;                 /* -1: none; else the top-logprobs count */
  char id[48];
  time_t created;
} creq;

/* A bad request: status, param, message. */
typedef struct bad {
  unsigned status;
  char param[64];
  char msg[5000];
} bad;

bool fail(bad *b, unsigned status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
bool absent(const cJSON *v);
bool get_bool(const cJSON *o, const char *k, bool *out, bad *b);
bool check_model(server *sv, const cJSON *o, bad *b);
bool get_ids(server *sv, const cJSON *arr, const char *k, nb_tok_ids *ids, bad *b);
/* Reads and checks a completions (chat false) or chat request body into *q. */
bool parse_request(server *sv, const cJSON *body, bool chat, creq *q, bad *b);
void creq_free(creq *q);
cJSON *error_json(const char *type, const char *param, const char *code, const char *msg);
const char *error_type(unsigned status);

/* Prompt text to ids ([bos] + the tokenizer's, or its bytes), ids to bytes
 * (appended, special tokens left out). */
bool encode(server *sv, const char *text, size_t n, bool add_bos, nb_tok_ids *ids);
bool decode(server *sv, const int32_t *ids, size_t n, buf *out);
/* Renders messages with the server's chat format (serve_text.c). */
bool render_chat(server *sv, const cJSON *messages, bool gen_prompt, buf *out, bool *add_bos, bad *b);

/* ---------------------------------------------------------------- choices (serve_api.c) */

/* One choice's text: the generated ids, their text so far (decoded in the
 * context of the last prompt token, incrementally: each new token decodes
 * with the window of ids since the one before the last step's, as Hugging
 * Face's streamers do), how much was released, stop strings never released
 * partially, and its tokens' logprobs. */
typedef struct choice {
  int32_t *ids;                 /* [ctx_tok] + generated (stop tokens left out) */
  int64_t n_ids, cap_ids;
  int32_t ctx_tok;
  int64_t n_tokens;             /* completion tokens */
  buf window, text, out;        /* decode(ids[win_from, win_to)); the generated bytes; released text (lossy UTF-8) */
  int64_t win_from, win_to;
  size_t released, searched;    /* bytes of text released; searched for stop strings */
  nb_serve_sample_out *lp;      /* logprobs, one per completion token */
  int64_t n_lp, cap_lp;
  const char *finish;           /* NULL while running */
  bool stop_sent;               /* told the engine a stop string ended it */
  /* streaming: what went out already */
  size_t sent_text;
  int64_t sent_lp;
  size_t text_offset;           /* completions logprobs: offset of the next token */
  bool started, finish_sent;
} choice;

/* ---------------------------------------------------------------- jobs (serve_engine.c) */

/* A request on its way through the engine: one engine request per prompt,
 * n samples each (choice prompt * n + sample). The consumer (an HTTP
 * handler thread, or the batch loop) holds one reference, the engine
 * thread another while any sample runs. */
struct job {
  server *sv;
  atomic_int refs;
  pthread_mutex_t *mu;          /* own_mu, or one shared by a batch */
  pthread_cond_t *cv;
  pthread_mutex_t own_mu;
  pthread_cond_t own_cv;
  creq q;
  choice *ch;                   /* [num_prompts * n], the consumer's */
  double t_arrival;
  int64_t first_id;             /* engine request ids first_id + prompt */
  /* under *mu */
  nb_serve_event *ev;           /* engine events not yet taken */
  int32_t n_ev, cap_ev;
  char *error;                  /* the engine failed it */
  /* the consumer's */
  const char *failed;           /* error, as job_pump last saw it (set once, never changed) */
  /* the engine thread's */
  int32_t live;                 /* samples not ended in the engine */
  double *t_last;               /* [choices]: last token time, 0: none yet */
  bool *first_seen;             /* [num_prompts] */
};

/* The request in q moves into a new job (q is zeroed); mu/cv NULL: its own. */
job *job_new(server *sv, creq *q, pthread_mutex_t *mu, pthread_cond_t *cv);
void job_unref(job *j);
/* Hands the job to the engine thread. */
void job_submit(job *j);
/* The client went away: abort what still runs. */
void job_cancel(job *j);
/* Applies the events that arrived (at most max when max > 0: streaming
 * sends one chunk per token) to the choices; asks the engine to end samples
 * whose text hit a stop string. Returns true when every choice has ended
 * (or the job failed: j->failed). */
bool job_pump(job *j, int32_t max);
bool job_done(job *j);

/* Choice text (serve_api.c). */
void choice_init(server *sv, choice *c, const creq *q, int32_t prompt);
void choice_free(choice *c);
/* One engine event for the choice; returns true when a stop string ended it
 * here (the engine must be told). */
bool choice_event(server *sv, choice *c, const creq *q, const nb_serve_event *ev);
/* The response of a finished job (non-streaming). */
cJSON *job_response(job *j);
/* Streaming: appends the server-sent events that are due (text released,
 * finish reasons; at the end the usage chunk and [DONE] once, when final). */
void job_stream(job *j, buf *out, bool final);
cJSON *usage_json(int64_t prompt, int64_t completion);

/* The engine thread (serve_engine.c). */
bool engine_start(server *sv);
void engine_stop(server *sv);
/* Prometheus text of the metrics. */
char *metrics_text(server *sv);
double now_s(void);

/* HTTP (serve_http.c) and batch (serve_batch.c). */
int serve_http(server *sv);
int serve_batch(server *sv);

#endif
