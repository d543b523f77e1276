/* nb_train_run: the training loop around the compiled step. Set-up (run
 * dir lock, data, init, restore, compile, then config.yaml once the run is
 * accepted), the loop (batch -> step -> non-finite check -> metrics -> eval
 * -> checkpoint), and the run-dir files: metrics.jsonl (truncated to the
 * restored step on resume) and checkpoints/ (nb_ckpt, items params +
 * opt_state, metadata {step, seed, elapsed_s, data_state, data, config}).
 * The numerics are all in step.c's graphs; this file only moves arrays.
 * Last, nb_train_peak_flops_estimate: the default peak MFU is relative to. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nabla/ckpt.h"
#include "nabla/compile.h"
#include "nabla/prof.h"
#include "nabla/quant.h"
#include "train/internal.h"
#include "util/trace.h"
#include "util/util.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int64_t n) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* JSON has no NaN/Inf: they are written as null */
static void jnum(FILE *f, const char *key, double v) {
  if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
  else fprintf(f, ",\"%s\":null", key);
}

/* ---------------------------------------------------------------- run-dir files */

/* The resolved config as YAML text (new string; free it). */
static char *config_text(nb_ctx *ctx, const nb_train_config *c, const nb_train_task *task) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory writing the config"), NULL;
  nb_train_config_write(c, f);
  if (task && task->write_config) task->write_config(task->ud, f);
  if (fclose(f)) return free(buf), nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory writing the config"), NULL;
  return buf;
}

static nb_status write_config(nb_ctx *ctx, const char *dir, const char *text) {
  char path[NB_TRAIN_PATH_MAX + 32], tmp[NB_TRAIN_PATH_MAX + 48];
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "train: cannot write %s: %s", tmp, strerror(errno));
  fputs(text, f);
  if (fclose(f) || rename(tmp, path)) return nb_errorf(ctx, NB_ERR_IO, "train: cannot write %s: %s", path, strerror(errno));
  return NB_OK;
}

/* Keeps the records of metrics.jsonl whose "step" is <= last (a resume
 * from step `last` redoes the later ones); unparsable lines are dropped. */
static nb_status truncate_metrics(nb_ctx *ctx, const char *path, int64_t last) {
  FILE *in = fopen(path, "r");
  if (!in) return errno == ENOENT ? NB_OK : nb_errorf(ctx, NB_ERR_IO, "train: %s: %s", path, strerror(errno));
  char tmp[NB_TRAIN_PATH_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    return nb_errorf(ctx, NB_ERR_IO, "train: cannot write %s: %s", tmp, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, in)) > 0) {
    cJSON *j = cJSON_Parse(line);
    const cJSON *st = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
    if (cJSON_IsNumber(st) && st->valuedouble <= (double)last) fputs(line, out);
    cJSON_Delete(j);
  }
  free(line);
  fclose(in);
  if (fclose(out) || rename(tmp, path)) return nb_errorf(ctx, NB_ERR_IO, "train: cannot rewrite %s: %s", path, strerror(errno));
  return NB_OK;
}

/* ---------------------------------------------------------------- the trainer's state */

typedef struct trainer {
  nb_ctx *ctx;
  const nb_train_config *cfg;
  const nb_train_opts *opts;
  const nb_train_task *task;   /* NULL: language modeling */
  nb_train__data data;         /* with a task: only train_id and train_shard (what checkpoints record) */
  nb_tree *st;                 /* "params/<p>", "opt_state/<s>" (sole holder: donation runs in place) */
  nb_exe *step_exe, *eval_exe;
  nb_data_iter *it;
  nb_data_map *eval_ds;
  nb_ckpt_manager *ckpt;
  FILE *metrics;
  nb_prof_tb *tb;              /* TensorBoard event file in DIR */
  bool warned;                 /* a TensorBoard/report failure was logged once */
  bool interrupted;            /* a signal arrived during set-up */
  char *config;                /* the resolved config as YAML (stored in every checkpoint) */
  nb_tree *init;               /* init_from's parameters (fresh arrays), or NULL: init from seed */
  nb_quant_rules *qat;         /* quant.rules: the linears trained fake-quantized, or NULL */
  int64_t step, last_saved;
  int64_t nonfinite_steps;     /* steps with a non-finite loss or gradient norm (skip, continue) */
  double elapsed_before;       /* seconds of earlier runs (from the checkpoint) */
  double t0;
  int rank;                    /* in the job's batch: (data index x mesh.fsdp + fsdp index) x mesh.expert + expert index */
  int tp;                      /* tensor index (0 without tensor parallelism): the processes of one rank differ in it */
  nb_tree *full_spec;          /* FSDP, expert, tensor parallel: the whole "params/..." and "opt_state/..." avals (t->st holds shards) */
  nb_train__layout layout;     /* and which of their dims are split (the rules' layout) */
  char dir[NB_TRAIN_PATH_MAX];
} trainer;

/* The first non-finite value of the state ("params/...", "opt_state/..."),
 * or NULL when all are finite: such a state is never checkpointed. */
static const char *nonfinite_leaf(const nb_tree *st) {
  for (size_t i = 0; i < nb_tree_size(st); i++) {
    const nb_array *a = nb_tree_leaf(st, i)->array;
    if (!a) continue;
    int64_t n = nb_array_size(a);
    if (nb_array_dtype(a) == NB_F32) {
      const float *p = nb_array_data(a);
      for (int64_t k = 0; k < n; k++)
        if (!isfinite(p[k])) return nb_tree_path(st, i);
    } else if (nb_array_dtype(a) == NB_F64) {
      const double *p = nb_array_data(a);
      for (int64_t k = 0; k < n; k++)
        if (!isfinite(p[k])) return nb_tree_path(st, i);
    }
  }
  return NULL;
}

/* sequences an example puts in the batch (a task's pairs or groups), for tokens/s and MFU */
static int64_t rows_per_example(const trainer *t) {
  return t->task && t->task->rows_per_example > 0 ? t->task->rows_per_example : 1;
}

/* "the last checkpoint is step N" / "no checkpoint yet", for messages */
static const char *last_ckpt_words(trainer *t) {
  static _Thread_local char buf[64];
  if (t->last_saved < 0) return "no checkpoint of this run yet";
  snprintf(buf, sizeof buf, "the last checkpoint is step %lld", (long long)t->last_saved);
  return buf;
}

static void hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* The checkpoint metadata: step, seed, elapsed time, the data position and
 * what it depends on (so a resume with other data is caught), the config. */
static char *build_metadata(trainer *t, const char *ds) {
  const nb_train_config *c = t->cfg;
  char hex[17], seed[32];
  hex64(t->data.train_id.xxh3, hex);
  snprintf(seed, sizeof seed, "%lld", (long long)c->seed);
  cJSON *j = cJSON_CreateObject(), *d = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "step", (double)t->step);
  cJSON_AddNumberToObject(j, "seed", (double)c->seed);
  cJSON_AddNumberToObject(j, "elapsed_s", round((t->elapsed_before + nb_util__now_s() - t->t0) * 1e3) / 1e3);
  cJSON *dsj = cJSON_Parse(ds);
  if (dsj) cJSON_AddItemToObject(j, "data_state", dsj);
  cJSON_AddStringToObject(d, "train_xxh3", hex);
  cJSON_AddNumberToObject(d, "train_tokens", (double)t->data.train_id.tokens);
  cJSON_AddStringToObject(d, "train_shard", t->data.train_shard);
  cJSON_AddNumberToObject(d, "batch_size", (double)c->batch_size);
  cJSON_AddNumberToObject(d, "seq_len", (double)c->data.seq_len);
  cJSON_AddStringToObject(d, "seed", seed);
  cJSON_AddItemToObject(j, "data", d);
  cJSON_AddStringToObject(j, "config", t->config);
  char *txt = dsj ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  return txt;
}

/* ---------------------------------------------------------------- one checkpoint per job */

/* A job of several processes keeps one checkpoint in the run dir's
 * checkpoints/ (docs/dist.md): FSDP processes write their rows of every
 * array, data-parallel replicas (data index > 0) write nothing, process 0
 * commits. The communicator over the whole job: the CLI binds "job"; a job
 * along one axis has it as that axis. */
static nb_comm *job_comm(const trainer *t) {
  const nb_train_config *c = t->cfg;
  int64_t n = c->mesh.data * nb_train__shard_count(c);
  if (n == 1) return NULL;
  nb_comm *j = nb_ctx_axis(t->ctx, "job");
  return j                         ? j
         : c->mesh.data == n   ? nb_ctx_axis(t->ctx, "data")
         : c->mesh.fsdp == n   ? nb_ctx_axis(t->ctx, "fsdp")
         : c->mesh.expert == n ? nb_ctx_axis(t->ctx, "expert")
         : c->mesh.tensor == n ? nb_ctx_axis(t->ctx, "tensor")
                               : NULL;
}

/* This process in the whole job (the mesh's row-major order, "tensor"
 * fastest): process 0 owns the run dir and the checkpoint. */
static int job_process(const trainer *t) { return t->rank * (int)t->cfg->mesh.tensor + t->tp; }

/* Which block of a sharded leaf this process holds, of how many: its fsdp,
 * expert or tensor index (at most one of the three axes is above 1). */
static int64_t shard_index(const trainer *t) {
  return t->cfg->mesh.tensor > 1 ? t->tp : t->rank % (t->cfg->mesh.fsdp * t->cfg->mesh.expert);
}
static int64_t shard_count(const trainer *t) { return nb_train__shard_count(t->cfg); }
/* Whether this process is a data-parallel replica (data index > 0): it writes nothing of a checkpoint. */
static bool data_replica(const trainer *t) { return t->rank / (t->cfg->mesh.fsdp * t->cfg->mesh.expert) != 0; }

/* This process's blocks of a whole state tree under item ("": its paths are the state's; new tree). */
static nb_tree *own_shards(const trainer *t, const char *item, const nb_tree *whole) {
  return nb_train__shard(t->ctx, &t->layout, item, whole, shard_index(t));
}

/* This process's blocks of item ("params", "opt_state"): its shards with
 * the padding past each whole array's end cut off along the split dim (a
 * shard all padding is not written), and with shard index 0 (fsdp, expert
 * or tensor) the arrays that are whole on every process; data replicas
 * (data index > 0) write none. A leaf of the whole array's shape is whole
 * (under FSDP also a dim of one row, whose other shards are padding). */
static nb_tree *blocks_to_write(trainer *t, const char *item) {
  nb_ctx *ctx = t->ctx;
  nb_tree *out = nb_tree_create(ctx);
  if (!out || data_replica(t)) return out;
  int64_t f = shard_index(t);
  size_t plen = strlen(item);
  for (size_t i = 0; out && i < nb_tree_size(t->st); i++) {
    const char *p = nb_tree_path(t->st, i);
    if (strncmp(p, item, plen) || p[plen] != '/') continue;
    nb_array *a = nb_tree_leaf(t->st, i)->array, *cut = NULL;
    const nb_leaf *w = t->full_spec ? nb_tree_get(t->full_spec, p) : NULL;
    nb_aval wa = w ? nb_leaf_get_aval(w) : nb_array_aval(a), aa = nb_array_aval(a);
    bool whole = nb_shape_equal(&wa.shape, &aa.shape);
    if (whole && f > 0) continue; /* a whole array (or FSDP's one-block leaf): index 0 writes it */
    int d = whole ? -1 : nb_train__split_dim(&t->layout, NULL, p);
    if (d >= 0) { /* FSDP's last blocks end in padding (other axes divide: keep == n) */
      int64_t n = nb_array_dims(a)[d], keep = wa.shape.dims[d] - f * n;
      keep = keep < 0 ? 0 : keep < n ? keep : n;
      if (keep == 0) continue;
      if (keep < n && !(cut = nb_dist_block(ctx, a, d, 0, keep))) out = (nb_tree_destroy(out), NULL);
    }
    if (out && nb_tree_set_array(out, p + plen + 1, cut ? cut : a)) out = (nb_tree_destroy(out), NULL);
    nb_array_release(cut);
  }
  return out;
}

/* The save of a job of several processes: every process calls it. */
static nb_status save_job(trainer *t, nb_comm *comm, const char *meta) {
  nb_ctx *ctx = t->ctx;
  nb_tree *params = blocks_to_write(t, "params"), *opt = params ? blocks_to_write(t, "opt_state") : NULL;
  nb_tree *whole = t->full_spec ? NULL : nb_tree_create(ctx); /* data parallel: the arrays are whole */
  for (size_t i = 0; whole && i < nb_tree_size(t->st); i++)
    if (nb_tree_set(whole, nb_tree_path(t->st, i), nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(t->st, i)))))
      whole = (nb_tree_destroy(whole), NULL);
  nb_status s = opt && (whole || t->full_spec) ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory saving a checkpoint");
  nb_ckpt_item items[2] = {{"params", params}, {"opt_state", opt}};
  nb_ckpt_shards sh = {.comm = comm, .whole = t->full_spec ? t->full_spec : whole, .index = shard_index(t),
                       .count = shard_count(t)};
  nb_ckpt_save_opts so = {.metadata_json = meta, .force = true};
  /* a failure here still joins the save, so that the other processes fail too rather than wait */
  nb_status w = nb_ckpt_save_sharded(t->ckpt, t->step, items, s || data_replica(t) ? 0 : 2, &so, &sh);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  nb_tree_destroy(whole);
  return s ? s : w;
}

static nb_status save(trainer *t, bool emergency) {
  if (t->step == t->last_saved) return NB_OK;
  nb_ctx *ctx = t->ctx;
  const char *bad = nonfinite_leaf(t->st);
  if (bad) {
    if (t->cfg->on_nonfinite == NB_TRAIN_NONFINITE_STOP)
      return nb_errorf(ctx, NB_ERR_NUMERIC,
                       "train: the state after step %lld holds non-finite values ('%s'): not checkpointed, stopped "
                       "(%s); lower optim.lr, or set on_nonfinite=skip",
                       (long long)t->step, bad, last_ckpt_words(t));
    nb_logf(ctx, NB_LOG_WARN, "train: the state after step %lld holds non-finite values ('%s'): not checkpointed",
            (long long)t->step, bad);
    return NB_OK;
  }
  char *ds = nb_data_iter_get_state(t->it);
  if (!ds) return nb_ctx_status(ctx);
  char *meta = build_metadata(t, ds);
  nb_tree *params = nb_tree_select_prefix(t->st, "params", true), *opt = nb_tree_select_prefix(t->st, "opt_state", true);
  nb_status s = meta && params && opt ? NB_OK : nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory saving a checkpoint");
  nb_comm *job = job_comm(t);
  if (job) {
    nb_status w = save_job(t, job, s ? NULL : meta);
    if (!s) s = w;
  } else if (!s) {
    nb_ckpt_item items[2] = {{"params", params}, {"opt_state", opt}};
    nb_ckpt_save_opts so = {.metadata_json = meta, .force = true};
    s = emergency ? nb_ckpt_emergency_save(t->ckpt, t->step, items, 2, &so)
                  : nb_ckpt_save(t->ckpt, t->step, items, 2, &so, NULL);
  }
  if (!s) t->last_saved = t->step;
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  cJSON_free(meta);
  nb_data_state_free(ctx, ds);
  return s;
}

/* ---------------------------------------------------------------- resume */

/* "model.d_model: 32 in the checkpoint, 64 now; ..." for the model keys
 * that differ between the config stored in a checkpoint and this run's ("":
 * none, or no stored config that parses). */
static void model_diff(nb_ctx *ctx, const char *saved, const nb_train_config *now, char *out, size_t cap) {
  nb_train_config stored;
  out[0] = 0;
  if (saved && nb_train_config_parse(ctx, "the checkpoint's config", saved, strlen(saved), 0, NULL, &stored) == NB_OK)
    nb_train_config_diff_values(&stored, now, "model.", "in the checkpoint", "now", out, cap);
}

/* Refuses (unless resume.allow_data_change) a resume whose data position
 * would mean other batches: another training text/shard content, batch
 * size, sequence length or seed than the checkpoint's. */
static nb_status check_data(trainer *t, int64_t step, const cJSON *d) {
  nb_ctx *ctx = t->ctx;
  const nb_train_config *c = t->cfg;
  if (!cJSON_IsObject(d)) {
    nb_logf(ctx, NB_LOG_WARN, "train: checkpoint step %lld does not record its data (an older nabla): the data, "
            "batch_size, data.seq_len and seed are not checked against it", (long long)step);
    return NB_OK;
  }
  const cJSON *xx = cJSON_GetObjectItemCaseSensitive(d, "train_xxh3"), *tok = cJSON_GetObjectItemCaseSensitive(d, "train_tokens");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(d, "train_shard"), *bs = cJSON_GetObjectItemCaseSensitive(d, "batch_size");
  const cJSON *sl = cJSON_GetObjectItemCaseSensitive(d, "seq_len"), *sd = cJSON_GetObjectItemCaseSensitive(d, "seed");
  char hex[17], seed[32], why[1024] = "";
  hex64(t->data.train_id.xxh3, hex);
  snprintf(seed, sizeof seed, "%lld", (long long)c->seed);
  size_t n = 0;
  if (!cJSON_IsString(xx) || strcmp(xx->valuestring, hex) || !cJSON_IsNumber(tok) ||
      tok->valuedouble != (double)t->data.train_id.tokens)
    n += (size_t)snprintf(why + n, sizeof why - n, "%sdata.train: the training tokens differ (%lld tokens, xxh3 %s now; "
                          "%.0f tokens, xxh3 %s saved from '%s')", n ? "; " : "", (long long)t->data.train_id.tokens,
                          hex, cJSON_IsNumber(tok) ? tok->valuedouble : -1.0,
                          cJSON_IsString(xx) ? xx->valuestring : "?", cJSON_IsString(sh) ? sh->valuestring : "?");
  if (n < sizeof why && (!cJSON_IsNumber(bs) || bs->valuedouble != (double)c->batch_size))
    n += (size_t)snprintf(why + n, sizeof why - n, "%sbatch_size: %lld now, %.0f saved", n ? "; " : "",
                          (long long)c->batch_size, cJSON_IsNumber(bs) ? bs->valuedouble : -1.0);
  if (n < sizeof why && (!cJSON_IsNumber(sl) || sl->valuedouble != (double)c->data.seq_len))
    n += (size_t)snprintf(why + n, sizeof why - n, "%sdata.seq_len: %lld now, %.0f saved", n ? "; " : "",
                          (long long)c->data.seq_len, cJSON_IsNumber(sl) ? sl->valuedouble : -1.0);
  if (n < sizeof why && (!cJSON_IsString(sd) || strcmp(sd->valuestring, seed)))
    n += (size_t)snprintf(why + n, sizeof why - n, "%sseed: %s now, %s saved", n ? "; " : "", seed,
                          cJSON_IsString(sd) ? sd->valuestring : "?");
  if (!n) return NB_OK;
  if (c->resume.allow_data_change) {
    nb_logf(ctx, NB_LOG_WARN, "train: resuming step %lld with other data (%s): allowed by resume.allow_data_change; "
            "the saved data position now points at other batches", (long long)step, why);
    return NB_OK;
  }
  return nb_errorf(ctx, NB_ERR_INVALID_ARG,
                   "train: cannot resume step %lld of %s/checkpoints with other data: %s. The saved data position "
                   "would point at other batches: use the checkpoint's values, another run dir, or "
                   "resume.allow_data_change=true to continue anyway",
                   (long long)step, t->dir, why);
}

/* FSDP, expert, tensor parallel: the restored whole state replaced by this process's shards. */
static nb_status keep_own_rows(trainer *t, nb_tree **state) {
  nb_tree *mine = own_shards(t, "", *state);
  if (!mine) return nb_ctx_status(t->ctx) ? nb_ctx_status(t->ctx) : NB_ERR_NOMEM;
  nb_tree_destroy(*state);
  *state = mine;
  return NB_OK;
}

/* Restores one committed step into t->st and the iterator. *damaged: the
 * checkpoint's files failed their checks (manifest, checksums), as opposed
 * to a mismatch with this run. */
static nb_status restore_step(trainer *t, int64_t step, bool *damaged) {
  nb_ctx *ctx = t->ctx;
  nb_ckpt_info *info = nb_ckpt_info_load(t->ckpt, step);
  *damaged = !info && nb_ctx_status(ctx) == NB_ERR_FORMAT;
  if (!info) return nb_train__wrapf(ctx, nb_ctx_status(ctx), "train: checkpoint step %lld", (long long)step);
  const char *meta = nb_ckpt_info_metadata(info);
  cJSON *j = meta ? cJSON_Parse(meta) : NULL;
  const cJSON *ds = cJSON_GetObjectItemCaseSensitive(j, "data_state");
  const cJSON *el = cJSON_GetObjectItemCaseSensitive(j, "elapsed_s");
  const cJSON *cf = cJSON_GetObjectItemCaseSensitive(j, "config");
  char *dstxt = ds ? cJSON_PrintUnformatted(ds) : NULL;
  bool has_opt = false;
  for (size_t i = 0; i < nb_ckpt_info_count(info); i++) has_opt |= !strcmp(nb_ckpt_info_entry(info, i)->item, "opt_state");
  /* a checkpoint of weights only (nabla ckpt import writes such) is no run to resume */
  nb_status s = dstxt && has_opt ? check_data(t, step, cJSON_GetObjectItemCaseSensitive(j, "data"))
                : nb_errorf(ctx, NB_ERR_INVALID_ARG,
                            "train: checkpoint step %lld in %s/checkpoints is not a training state to resume (it has %s): "
                            "weights written by `nabla ckpt import`? To start a run from them, give "
                            "init_from=%s/checkpoints in another run dir (or move them out of this one)",
                            (long long)step, t->dir, !has_opt ? "no item 'opt_state'" : "no data_state in its metadata",
                            t->dir);
  nb_tree *target = s ? NULL : nb_tree_create(ctx);
  if (!s && !target) s = NB_ERR_NOMEM;
  /* the whole arrays, whatever mesh wrote them (FSDP: this process keeps its rows below) */
  const nb_tree *now = t->full_spec ? t->full_spec : t->st;
  for (size_t i = 0; !s && i < nb_tree_size(now); i++)
    s = nb_tree_set(target, nb_tree_path(now, i), nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(now, i))));
  /* fresh host arrays, not file mappings: the step writes into them in place */
  nb_ckpt_restore_opts ro = {.target = target, .no_mmap = true};
  nb_tree *r = s ? NULL : nb_ckpt_restore(t->ckpt, step, &ro);
  nb_tree_destroy(target);
  if (!s && r && t->full_spec) s = keep_own_rows(t, &r);
  if (!s && !r) {
    *damaged = nb_ctx_status(ctx) == NB_ERR_FORMAT;
    char diff[1024], cause[2048];
    snprintf(cause, sizeof cause, "%s", nb_ctx_error(ctx)); /* parsing the stored config may set another error */
    nb_status why = nb_ctx_status(ctx);
    model_diff(ctx, cJSON_IsString(cf) ? cf->valuestring : NULL, t->cfg, diff, sizeof diff);
    nb_errorf(ctx, why, "%s", cause);
    s = nb_train__wrapf(ctx, nb_ctx_status(ctx), "train: restoring step %lld from %s/checkpoints (%s%s)", (long long)step,
                        t->dir, diff[0] ? "the model config differs: " : "delete it to start over, or check that the "
                        "model config matches", diff);
  }
  if (!s && (s = nb_data_iter_set_state(t->it, dstxt)))
    s = nb_train__wrapf(ctx, s, "train: the data position saved in step %lld does not fit this data pipeline (was "
                        "data.workers changed between 0 and more?)", (long long)step);
  if (!s) {
    nb_tree_destroy(t->st);
    t->st = r;
    r = NULL;
    if (cJSON_IsNumber(el)) t->elapsed_before = el->valuedouble;
    t->step = t->last_saved = step;
  }
  nb_tree_destroy(r);
  cJSON_free(dstxt);
  cJSON_Delete(j);
  nb_ckpt_info_destroy(info);
  return s;
}

/* Restores the newest good checkpoint, if any. A damaged one (its manifest
 * or checksums fail) is set aside as step_N.damaged with a warning and the
 * next older one tried; when every one is damaged the run is refused rather
 * than silently started over. */
static nb_status restore(trainer *t) {
  nb_ctx *ctx = t->ctx;
  int64_t n_damaged = 0;
  for (;;) {
    int64_t latest = -1;
    bool damaged = false;
    nb_status s = nb_ckpt_latest_step(t->ckpt, &latest);
    if (!s && latest < 0 && n_damaged)
      return nb_errorf(ctx, NB_ERR_FORMAT, "train: every checkpoint in %s/checkpoints is damaged (set aside as "
                       "step_*.damaged); move them away to start over", t->dir);
    if (s || latest < 0) return s;
    if (!(s = restore_step(t, latest, &damaged)) || !damaged) return s;
    char cause[2048], aside[NB_TRAIN_PATH_MAX + 64];
    snprintf(cause, sizeof cause, "%s", nb_ctx_error(ctx));
    if (nb_ckpt_set_aside(t->ckpt, latest, aside, sizeof aside))
      return nb_train__wrapf(ctx, NB_ERR_FORMAT, "train: checkpoint step %lld is damaged (%s), and setting it aside failed",
                             (long long)latest, cause);
    nb_logf(ctx, NB_LOG_WARN, "train: checkpoint step %lld is damaged (%s); set aside as %s, falling back to the "
            "previous checkpoint", (long long)latest, cause, aside);
    n_damaged++;
  }
}

/* ---------------------------------------------------------------- restoring a job */

/* Rank 0 restores (setting damaged steps aside), then every rank restores
 * the step rank 0 did: one allgather of the step (-1: none, -2: rank 0
 * failed and reports why). */
static nb_status job_restore(trainer *t) {
  nb_comm *c = job_comm(t);
  if (!c) return restore(t);
  nb_status s = job_process(t) == 0 ? restore(t) : NB_OK;
  int64_t mine = s ? -2 : t->last_saved, *all = calloc((size_t)c->ops->size(c), sizeof *all);
  if (!all) return nb_errorf(t->ctx, NB_ERR_NOMEM, "train: out of memory");
  char *why = s ? strdup(nb_ctx_error(t->ctx)) : NULL;
  nb_status cs = c->ops->allgather(c, t->ctx, &mine, all, sizeof mine);
  int64_t step = all[0];
  free(all);
  if (s) nb_errorf(t->ctx, s, "%s", why ? why : "train: restore failed");
  free(why);
  if (s || cs) return s ? s : cs;
  if (job_process(t) == 0) return NB_OK;
  if (step == -2) return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "train: rank 0 could not restore the job's checkpoint");
  bool damaged = false;
  return step >= 0 ? restore_step(t, step, &damaged) : NB_OK;
}

static double scalar_out(const nb_tree *out, const char *path) {
  nb_array *a = nb_tree_get_array(out, path);
  return a ? nb_array_get(a, 0) : NAN;
}

/* The mean eval loss over eval_steps batches; with `metrics`, the means of
 * the eval graph's "metrics/<name>" scalars as "eval_<name>". */
static nb_status run_eval(trainer *t, double *loss, nb_tree *metrics) {
  nb_ctx *ctx = t->ctx;
  if (t->task && t->task->evaluate) {
    nb_tree *params = nb_tree_select_prefix(t->st, "params", true);
    nb_status s = params ? t->task->evaluate(t->task->ud, ctx, params, t->step, loss, metrics) : NB_ERR_NOMEM;
    nb_tree_destroy(params);
    return s;
  }
  double sum = 0, msum[32] = {0};
  char names[32][64];
  int nm = 0;
  nb_status s = NB_OK;
  for (int64_t i = 0; i < t->cfg->eval_steps && !s; i++) {
    nb_data_elem b = NB_DATA_ELEM_INIT;
    nb_tree *in = nb_tree_select_prefix(t->st, "params", false), *out = nb_tree_create(ctx);
    nb_tree *frozen = nb_tree_select_prefix(t->st, "frozen", false);
    s = in && out && frozen ? nb_tree_merge(in, NULL, frozen) : NB_ERR_NOMEM;
    nb_tree_destroy(frozen);
    if (!s) s = nb_data_map_get(t->eval_ds, i, &b);
    if (!s) s = nb_tree_merge(in, "batch", b.tree);
    if (!s) s = nb_exe_run(t->eval_exe, in, out);
    if (!s) sum += scalar_out(out, "loss");
    for (size_t k = 0; !s && metrics && k < nb_tree_size(out); k++) {
      const char *p = nb_tree_path(out, k);
      if (strncmp(p, "metrics/", 8) || nm >= 32) continue;
      int m = 0;
      while (m < nm && strcmp(names[m], p + 8)) m++;
      if (m == nm) snprintf(names[nm++], sizeof names[0], "%s", p + 8);
      msum[m] += nb_array_get(nb_tree_leaf(out, k)->array, 0);
    }
    nb_data_elem_clear(ctx, &b);
    nb_tree_destroy(in);
    nb_tree_destroy(out);
  }
  *loss = sum / (double)t->cfg->eval_steps;
  for (int m = 0; !s && m < nm; m++) {
    char key[80];
    snprintf(key, sizeof key, "eval_%.63s", names[m]);
    nb_array *a = nb_array_scalar(ctx, NB_F64, msum[m] / (double)t->cfg->eval_steps);
    s = a ? nb_tree_set_array(metrics, key, a) : nb_ctx_status(ctx);
    nb_array_release(a);
  }
  return s;
}

/* ---------------------------------------------------------------- a caller's data */

/* The source's examples stand for the shards: what a checkpoint records of
 * the data comes from the source. */
static nb_status source_data(trainer *t, const nb_train_source *src) {
  nb_ctx *ctx = t->ctx;
  if (!src->train || !src->eval)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: a source needs train and eval examples");
  snprintf(t->data.train_shard, sizeof t->data.train_shard, "%s", src->train_name ? src->train_name : "(examples)");
  snprintf(t->data.eval_shard, sizeof t->data.eval_shard, "%s", t->cfg->data.eval[0] ? t->cfg->data.eval : "(eval examples)");
  t->data.train_id = (nb_train__shard_id){.tokens = src->train_tokens, .xxh3 = src->train_id};
  nb_data_map_retain(src->train);
  nb_data_map_retain(src->eval);
  t->data.train_windows = src->train, t->data.eval_windows = src->eval;
  t->data.n_train = nb_data_map_len(src->train), t->data.n_eval = nb_data_map_len(src->eval);
  t->data.vocab = t->cfg->model.vocab_size;
  t->data.entropy = NAN;
  return NB_OK;
}

/* examples -> shuffle(seed), a new permutation every epoch -> packed rows (this process's of a job of several) */
static nb_data_iter *source_iter(trainer *t) {
  const nb_train_config *c = t->cfg;
  nb_data_map_retain(t->data.train_windows);
  nb_data_map *ds = nb_data_map_repeat(nb_data_map_shuffle(t->data.train_windows, (uint64_t)c->seed), 0);
  nb_data_pack_opts po = {.seq_len = c->data.seq_len, .rows = c->batch_size};
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(ds), &po);
  /* data parallel: every process packs the job's rows and keeps its own, so
   * the saved position is the job's (elastic restore: docs/dist.md) */
  int64_t D = nb_train__batch_procs(c), rows = c->batch_size / D;
  if (D > 1) it = nb_data_iter_rows(it, t->rank * rows, rows);
  if (it && c->data.workers > 0) it = nb_data_iter_prefetch(it, (int)c->data.workers, 2 * (int)c->data.workers + 2);
  return it;
}

/* The first eval_steps packed batches of the eval examples (in order, no
 * wrap-around), held in memory as one stacked tree. */
static nb_data_map *source_eval_batches(trainer *t) {
  nb_ctx *ctx = t->ctx;
  const nb_train_config *c = t->cfg;
  int64_t want = c->eval_steps > 0 ? c->eval_steps : 1, got = 0; /* one batch even when eval is off */
  nb_data_map_retain(t->data.eval_windows);
  nb_data_pack_opts po = {.seq_len = c->data.seq_len, .rows = c->batch_size};
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(t->data.eval_windows), &po);
  nb_tree **b = calloc((size_t)(want > 0 ? want : 1), sizeof *b);
  nb_status s = it && b ? NB_OK : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  while (!s && got < want) {
    nb_data_elem e = NB_DATA_ELEM_INIT;
    if ((s = nb_data_iter_next(it, &e)) || e.kind != NB_DATA_TREE) break;
    b[got++] = e.tree; /* taken from e */
  }
  nb_data_iter_destroy(it);
  if (!s && got < want)
    s = nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: eval_steps (%lld) is more than the %lld packed batches of the eval "
                  "examples", (long long)want, (long long)got);
  nb_tree *stacked = s ? NULL : nb_tree_create(ctx);
  for (size_t i = 0; stacked && got && i < nb_tree_size(b[0]) && !s; i++) {
    const char *p = nb_tree_path(b[0], i);
    nb_array *first = nb_tree_get_array(b[0], p);
    int64_t dims[3] = {got, nb_array_dims(first)[0], nb_array_dims(first)[1]};
    size_t row = (size_t)(dims[1] * dims[2]) * nb_dtype_size(nb_array_dtype(first));
    nb_array *a = nb_array_empty(ctx, nb_array_dtype(first), 3, dims);
    if (!a) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
    for (int64_t k = 0; !s && k < got; k++) memcpy((char *)nb_array_data_mut(a) + (size_t)k * row, nb_array_data(nb_tree_get_array(b[k], p)), row);
    if (!s) s = nb_tree_set_array(stacked, p, a);
    nb_array_release(a);
  }
  for (int64_t k = 0; b && k < got; k++) nb_tree_destroy(b[k]);
  free(b);
  nb_data_map *m = !s && stacked ? nb_data_map_arrays(ctx, stacked) : NULL;
  nb_tree_destroy(stacked);
  return m;
}

/* ---------------------------------------------------------------- FSDP */

/* This process's place in the job's batch: (data index x mesh.fsdp + fsdp
 * index) x mesh.expert + expert index (the mesh's row-major order), 0 for
 * one process. */
static int job_rank(nb_ctx *ctx, const nb_train_config *c) {
  nb_comm *d = c->mesh.data > 1 ? nb_ctx_axis(ctx, "data") : NULL, *f = c->mesh.fsdp > 1 ? nb_ctx_axis(ctx, "fsdp") : NULL;
  nb_comm *e = c->mesh.expert > 1 ? nb_ctx_axis(ctx, "expert") : NULL;
  return ((d ? d->ops->rank(d) : 0) * (int)c->mesh.fsdp + (f ? f->ops->rank(f) : 0)) * (int)c->mesh.expert +
         (e ? e->ops->rank(e) : 0);
}

/* FSDP, expert, tensor parallel: keeps the whole state's avals in
 * t->full_spec (what the step and eval are traced for) and their layout in
 * t->layout, and replaces *params by this process's shards, so that the
 * optimizer state is made for the shards only. */
static nb_status shard_params(trainer *t, nb_tree **params) {
  nb_ctx *ctx = t->ctx;
  nb_tree *pspec = nb_tree_create(ctx);
  for (size_t i = 0; pspec && i < nb_tree_size(*params); i++)
    if (nb_tree_set(pspec, nb_tree_path(*params, i), nb_leaf_aval(nb_leaf_get_aval(nb_tree_leaf(*params, i)))))
      pspec = (nb_tree_destroy(pspec), NULL);
  nb_tree *ospec = pspec ? nb_train__opt_state_spec(ctx, t->cfg, pspec) : NULL;
  nb_status s = ospec ? nb_train__layout_make(ctx, t->cfg, pspec, ospec, &t->layout) : nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  nb_tree *shards = s ? NULL : own_shards(t, "params", *params);
  t->full_spec = shards ? nb_tree_create(ctx) : NULL;
  if (!s && !t->full_spec) s = nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_NOMEM;
  if (!s) s = nb_tree_merge(t->full_spec, "params", pspec);
  if (!s) s = nb_tree_merge(t->full_spec, "opt_state", ospec);
  if (!s) {
    nb_tree_destroy(*params);
    *params = shards;
    shards = NULL;
  }
  nb_tree_destroy(shards);
  nb_tree_destroy(pspec);
  nb_tree_destroy(ospec);
  return s;
}

/* What this process holds: its state's bytes and the step's planned buffers. */
static void memory_info(trainer *t, nb_train_start_info *info) {
  nb_exe_stats es;
  nb_exe_get_stats(t->step_exe, &es);
  info->step_peak_bytes = (double)es.peak_bytes;
  info->step_arena_bytes = (double)es.arena_bytes;
  for (size_t i = 0; i < nb_tree_size(t->st); i++)
    if (!strncmp(nb_tree_path(t->st, i), "params/", 7) || !strncmp(nb_tree_path(t->st, i), "opt_state/", 10))
      info->state_bytes += (double)nb_array_nbytes(nb_tree_leaf(t->st, i)->array);
}

/* The run's checkpoint manager: DIR/checkpoints. A job of several
 * processes keeps one checkpoint there: process 0 owns it (the lock,
 * retention), the others open it read-only to restore and to add their
 * shards to a save. */
static nb_ckpt_manager *open_checkpoints(trainer *t) {
  const nb_train_config *c = t->cfg;
  char ck[NB_TRAIN_PATH_MAX + 16];
  bool shared = job_comm(t) != NULL;
  snprintf(ck, sizeof ck, "%s/checkpoints", shared ? t->opts->run_dir : t->dir);
  if (shared && job_process(t) > 0 && nb_train__mkdir_p(t->ctx, ck)) return NULL;
  nb_ckpt_options co = {.directory = ck, .max_to_keep = (int)c->checkpoint_keep, .async = true,
                        .read_only = shared && job_process(t) > 0};
  return nb_ckpt_manager_create(t->ctx, &co);
}

/* ---------------------------------------------------------------- set-up */

/* Set-up stops early (t->interrupted, NB_OK) when a signal arrived. */
static bool interrupted(trainer *t) {
  if (t->opts->handle_signals && nb_ckpt_preemption_requested()) t->interrupted = true;
  return t->interrupted;
}

/* quant.rules: QAT, the rules' fake quantization on the linears they match
 * (quant's hook in the step and eval graphs). */
static nb_status qat_hook(trainer *t, const nb_tree *params, nb_train_graph_opts *go) {
  nb_ctx *ctx = t->ctx;
  const char *path = t->cfg->quant.rules;
  if (t->task || go->linear_hook)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "train: quant.rules (QAT) is for language-model training; %s has its own linear "
                     "hook or loss", t->task ? t->task->name : "this source");
  t->qat = nb_quant_rules_load_yaml(ctx, path);
  if (!t->qat) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nb_ctx_error(ctx));
    return nb_errorf(ctx, nb_ctx_status(ctx), "train: quant.rules: %s", msg);
  }
  for (int i = 0; i < nb_quant_rules_count(t->qat); i++)
    if (nb_quant_rules_at(t->qat, i)->act_qtype == NB_QUANT_ACT_INT8_STATIC)
      return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "train: quant.rules: %s: rule %d: int8_static activations have no range while "
                       "training: train with int8_dynamic (or none), then calibrate (nabla quantize --calibrate)", path, i);
  if (nb_quant_rules_count_linears(t->qat, params) == 0)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: quant.rules: no rule of %s matches a linear of the model (module paths "
                     "such as 'layers/0/attn/wq', 'layers/0/mlp/wi_0')", path);
  go->linear_hook = nb_quant_qat_hook, go->hook_ud = t->qat;
  return NB_OK;
}

static nb_status setup(trainer *t, nb_train_start_info *info) {
  nb_ctx *ctx = t->ctx;
  const nb_train_config *c = t->cfg;
  double t_setup = nb_util__now_s();
  /* the checkpoint directory's lock first: a second trainer on a live run is refused before it touches anything */
  t->ckpt = open_checkpoints(t);
  if (!t->ckpt) return nb_ctx_status(ctx);
  t->last_saved = -1;
  const nb_train_source *src = t->opts->source;
  nb_train_task_data td = {0};
  nb_status s = t->task ? t->task->open_data(t->task->ud, ctx, c, t->dir, &td)
                : src   ? source_data(t, src)
                        : nb_train__data_open(ctx, c, t->dir, &t->data);
  if (t->task) { /* the trainer owns the task's iterators now */
    t->it = td.train;
    t->eval_ds = td.eval;
    t->data.train_id = (nb_train__shard_id){.tokens = td.tokens, .xxh3 = td.xxh3};
    t->data.n_train = td.n_train;
    t->data.n_eval = td.n_eval;
    t->data.entropy = NAN;
    snprintf(t->data.train_shard, sizeof t->data.train_shard, "%s", c->data.train);
    snprintf(t->data.eval_shard, sizeof t->data.eval_shard, "%s", c->data.eval);
    if (!s && !t->it) s = nb_errorf(ctx, NB_ERR_INTERNAL, "train: task '%s' gave no training data", t->task->name);
  }
  if (s || interrupted(t)) return s;
  nb_tree *params = NULL;
  if (t->init) { /* the step takes its own tree: t->init stays until teardown */
    params = t->init;
    t->init = NULL;
  } else if (t->task && t->task->init_params) {
    params = nb_tree_copy(t->task->init_params);
  } else if (src && src->params) {
    params = nb_tree_copy(src->params);
  } else {
    nb_array *key = nb_key(ctx, (uint64_t)c->seed);
    params = key ? nb_model_init(ctx, &c->model, key) : NULL;
    nb_array_release(key);
  }
  nb_optim_tx *tx = params ? nb_train_optimizer(ctx, c) : NULL;
  info->n_params = params ? nb_nn_params_count(params) : 0;
  int64_t active_params = params ? nb_train_active_params(c, params) : 0;
  if (tx && nb_train__shard_count(c) > 1) s = shard_params(t, &params);
  nb_tree *opt = tx && !s ? nb_optim_init_arrays(ctx, tx, params) : NULL;
  nb_optim_tx_destroy(tx);
  t->st = opt ? nb_tree_create(ctx) : NULL;
  if (!t->st || nb_tree_merge(t->st, "params", params) || nb_tree_merge(t->st, "opt_state", opt)) s = s ? s : nb_ctx_status(ctx);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  if (s) return s;
  if (!t->task) {
    t->it = src ? source_iter(t) : nb_train__data_iter(ctx, &t->data, c, t->rank);
    t->eval_ds = t->it ? src ? source_eval_batches(t) : nb_train__eval_batches(ctx, &t->data, c) : NULL;
    if (!t->eval_ds) return nb_ctx_status(ctx);
  }
  /* restore before compiling: a resume refused (other data, other model shape) is refused at once */
  if ((s = job_restore(t)) || interrupted(t)) return s;
  /* frozen trees (a task's reference model, a source's LoRA base): inputs of
   * every step and eval, joined after the restore, never saved */
  if (t->task && t->task->frozen && (s = nb_tree_merge(t->st, "frozen", t->task->frozen))) return s;
  if (src && src->frozen && (s = nb_tree_merge(t->st, "frozen", src->frozen))) return s;
  /* traced for the whole state (FSDP: the step's inputs are the shards of it) */
  params = nb_tree_select_prefix(t->full_spec ? t->full_spec : t->st, "params", true);
  opt = nb_tree_select_prefix(t->full_spec ? t->full_spec : t->st, "opt_state", true);
  nb_train_graph_opts go = {0};
  if (src) go = (nb_train_graph_opts){.frozen_spec = src->frozen, .linear_hook = src->linear_hook, .hook_ud = src->hook_ud,
                                      .packed = true};
  if (params && c->quant.rules[0] && (s = qat_hook(t, params, &go))) {
    nb_tree_destroy(params);
    nb_tree_destroy(opt);
    return s;
  }
  nb_graph *g = !params || !opt ? NULL
                : t->task       ? nb_train_trace_task_step(ctx, c, t->task, params, opt)
                                : nb_train_trace_step_opts(ctx, c, &go, params, opt);
  nb_graph *eg = !g || !t->eval_ds ? NULL
                 : t->task         ? nb_train_trace_task_eval(ctx, c, t->task, params)
                                   : nb_train_trace_eval_opts(ctx, c, &go, params);
  const char *donate[] = {"params", "opt_state", NULL};
  nb_jit_opts jo = {.donate = donate, .threads = t->opts->threads};
  t->step_exe = eg || (g && !t->eval_ds) ? nb_jit(ctx, g, &jo) : NULL;
  t->eval_exe = t->step_exe && eg ? nb_jit(ctx, eg, &(nb_jit_opts){.threads = t->opts->threads}) : NULL;
  if (g) {
    double bytes;
    nb_graph_cost(g, &info->graph_flops_per_step, &bytes);
  }
  nb_graph_destroy(g);
  nb_graph_destroy(eg);
  nb_tree_destroy(params);
  nb_tree_destroy(opt);
  if (!t->step_exe || (t->eval_ds && !t->eval_exe)) return nb_ctx_status(ctx) ? nb_ctx_status(ctx) : NB_ERR_INTERNAL;
  if (interrupted(t)) return NB_OK;
  /* the run is accepted (locked, data checked, restored, compiled): only now does config.yaml change */
  if (src && src->config_extra) {
    size_t n = strlen(t->config) + strlen(src->config_extra) + 2;
    char *both = malloc(n);
    if (!both) return nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory");
    snprintf(both, n, "%s%s", t->config, src->config_extra);
    s = write_config(ctx, t->dir, both);
    free(both);
    if (s) return s;
  } else if ((s = write_config(ctx, t->dir, t->config))) {
    return s;
  }
  /* the step's "hparams" inputs come from the config: set once, kept in the state (not saved) */
  if ((s = nb_train_set_hparams(ctx, c, t->st))) return s;
  char mp[NB_TRAIN_PATH_MAX + 16];
  snprintf(mp, sizeof mp, "%s/metrics.jsonl", t->dir);
  if ((s = truncate_metrics(ctx, mp, t->step))) return s;
  t->metrics = fopen(mp, "a");
  if (!t->metrics) return nb_errorf(ctx, NB_ERR_IO, "train: cannot open %s: %s", mp, strerror(errno));
  t->tb = nb_prof_tb_create(ctx, t->dir);
  if (!t->tb) return nb_ctx_status(ctx);
  info->start_step = t->step;
  info->total_steps = c->steps;
  info->train_windows = t->data.n_train;
  info->eval_windows = t->data.n_eval;
  info->vocab_size = t->data.vocab;
  info->unigram_entropy = t->data.entropy;
  info->flops_per_step = (double)rows_per_example(t) * nb_train_model_flops(c, active_params);
  info->peak_flops = t->opts->peak_flops;
  info->compile_s = nb_util__now_s() - t_setup;
  memory_info(t, info);
  info->train_shard = t->data.train_shard;
  info->eval_shard = t->data.eval_shard[0] ? t->data.eval_shard : t->data.train_shard;
  return NB_OK;
}

static void teardown(trainer *t) {
  nb_tree_destroy(t->init);
  t->init = NULL;
  nb_quant_rules_destroy(t->qat);
  t->qat = NULL;
  if (t->ckpt) {
    nb_status s = nb_ckpt_wait_until_finished(t->ckpt);
    if (s) nb_logf(t->ctx, NB_LOG_ERROR, "train: background checkpoint save failed: %s", nb_ctx_error(t->ctx));
  }
  nb_ckpt_manager_destroy(t->ckpt);
  if (t->metrics) fclose(t->metrics);
  nb_prof_tb_destroy(t->tb);
  nb_data_iter_destroy(t->it);
  nb_data_map_release(t->eval_ds);
  nb_exe_destroy(t->step_exe);
  nb_exe_destroy(t->eval_exe);
  nb_tree_destroy(t->st);
  nb_tree_destroy(t->full_spec);
  nb_train__layout_free(&t->layout);
  nb_train__data_close(&t->data);
  free(t->config);
}

/* ---------------------------------------------------------------- the loop */

/* After a step: the outputs replace params/opt_state, unless the loss or
 * gradient norm is not finite; then per on_nonfinite: stop (an error; the
 * step is neither counted nor saved), skip (the step's graph returned the
 * old params and state: keep_old_unless in step.c) or continue. */
static nb_status check_finite(trainer *t, const nb_train_step_info *si, const nb_tree *out) {
  nb_ctx *ctx = t->ctx;
  bool finite = isfinite(si->loss) && isfinite(si->grad_norm);
  if (!finite && t->cfg->on_nonfinite == NB_TRAIN_NONFINITE_STOP)
    return nb_errorf(ctx, NB_ERR_NUMERIC,
                     "train: step %lld: loss %g, gradient norm %g (not finite: the training diverged); stopped "
                     "without saving it (%s). Lower optim.lr, or set on_nonfinite=skip (drop such updates) or "
                     "continue",
                     (long long)t->step + 1, si->loss, si->grad_norm, last_ckpt_words(t));
  t->step++;
  if (!finite) {
    if (t->nonfinite_steps++ < 10)
      nb_logf(ctx, NB_LOG_WARN, "train: step %lld: loss %g, gradient norm %g: %s", (long long)t->step, si->loss,
              si->grad_norm, t->cfg->on_nonfinite == NB_TRAIN_NONFINITE_SKIP ? "update skipped (on_nonfinite=skip)"
                                                                         : "applied (on_nonfinite=continue)");
  }
  nb_status s = NB_OK;
  for (size_t i = 0; !s && i < nb_tree_size(out); i++) {
    const char *p = nb_tree_path(out, i);
    if (!strncmp(p, "params/", 7) || !strncmp(p, "opt_state/", 10)) s = nb_tree_set_array(t->st, p, nb_tree_leaf(out, i)->array);
  }
  return s;
}

/* One step: next batch, the compiled step, the state swapped for the outputs. */
static nb_status one_step(trainer *t, nb_train_step_info *si, double *exe_ms, double *data_ms, nb_tree *metrics) {
  nb_ctx *ctx = t->ctx;
  double a = nb_util__now_s();
  int64_t ta = nb_util__trace_start();
  nb_data_elem b = NB_DATA_ELEM_INIT;
  nb_status s = NB_OK;
  if (t->task && t->task->before_batch) { /* an on-policy task sees the parameters its batch is to come from */
    nb_tree *params = nb_tree_select_prefix(t->st, "params", true);
    s = params ? t->task->before_batch(t->task->ud, ctx, params, t->step) : NB_ERR_NOMEM;
    nb_tree_destroy(params);
  }
  if (!s) s = nb_data_iter_next(t->it, &b);
  nb_util__trace_span("data", "next batch", ta, nb_util__now_ns(), NULL, 0);
  if (!s && b.kind != NB_DATA_TREE) s = nb_errorf(ctx, NB_ERR_INTERNAL, "train: the training data ended");
  nb_array *step = s ? NULL : nb_array_scalar(ctx, NB_I32, (double)t->step);
  if (!s && !step) s = nb_ctx_status(ctx);
  if (!s) s = nb_tree_merge(t->st, "batch", b.tree);
  if (!s) s = nb_tree_set_array(t->st, "step", step);
  nb_array_release(step);
  nb_data_elem_clear(ctx, &b);
  double m = nb_util__now_s();
  int64_t tm = nb_util__trace_start();
  nb_tree *out = nb_tree_create(ctx);
  if (!s) s = out ? nb_exe_run(t->step_exe, t->st, out) : NB_ERR_NOMEM;
  *exe_ms = (nb_util__now_s() - m) * 1e3;
  nb_util__trace_span("train", "step executable", tm, nb_util__now_ns(), NULL, 0);
  *data_ms = (m - a) * 1e3;
  /* the batch and step leave the state; check_finite puts the outputs in */
  for (int64_t i = (int64_t)nb_tree_size(t->st) - 1; !s && i >= 0; i--)
    if (!strncmp(nb_tree_path(t->st, (size_t)i), "batch/", 6)) s = nb_tree_remove(t->st, nb_tree_path(t->st, (size_t)i));
  if (!s) s = nb_tree_remove(t->st, "step");
  /* a task's metrics, and an MoE model's moe_lb and moe_z, as "<name>" */
  for (size_t i = 0; !s && metrics && i < nb_tree_size(out); i++)
    if (!strncmp(nb_tree_path(out, i), "metrics/", 8) && (t->task || !strncmp(nb_tree_path(out, i) + 8, "moe_", 4)))
      s = nb_tree_set_array(metrics, nb_tree_path(out, i) + 8, nb_tree_leaf(out, i)->array);
  if (!s) {
    si->loss = scalar_out(out, "loss");
    si->lr = scalar_out(out, "lr");
    si->grad_norm = scalar_out(out, "grad_norm");
    s = check_finite(t, si, out);
  }
  nb_tree_destroy(out);
  return s;
}

/* a task's metrics (scalars) as more keys of the record */
static void write_metrics(FILE *f, const nb_tree *m) {
  for (size_t i = 0; m && i < nb_tree_size(m); i++) {
    const nb_array *a = nb_tree_leaf(m, i)->array;
    if (a && nb_array_size(a) == 1) jnum(f, nb_tree_path(m, i), nb_array_get(a, 0));
  }
}

static void write_record(trainer *t, const nb_train_step_info *si) {
  FILE *f = t->metrics;
  fprintf(f, "{\"step\":%lld", (long long)si->step);
  jnum(f, "loss", si->loss);
  jnum(f, "lr", si->lr);
  jnum(f, "grad_norm", si->grad_norm);
  jnum(f, "tokens_per_s", si->tokens_per_s);
  jnum(f, "mfu", si->mfu);
  jnum(f, "elapsed_s", si->elapsed_s);
  write_metrics(f, si->metrics);
  fprintf(f, ",\"tokens\":%lld}\n", (long long)(si->step * t->cfg->batch_size * t->cfg->data.seq_len));
  fflush(f);
}

static void write_eval(trainer *t, int64_t step, double loss, const nb_tree *metrics) {
  fprintf(t->metrics, "{\"step\":%lld", (long long)step);
  jnum(t->metrics, "eval_loss", loss);
  for (size_t i = 0; metrics && i < nb_tree_size(metrics); i++)
    if (!strncmp(nb_tree_path(metrics, i), "eval_", 5))
      jnum(t->metrics, nb_tree_path(metrics, i), nb_array_get(nb_tree_leaf(metrics, i)->array, 0));
  fputs("}\n", t->metrics);
  fflush(t->metrics);
}

/* TensorBoard and the report are for people to look at: a failure is
 * logged (once) and training goes on. */
static void diag(trainer *t, nb_status s) {
  if (s && !t->warned) {
    nb_logf(t->ctx, NB_LOG_WARN, "train: TensorBoard/report: %s (training continues)", nb_ctx_error(t->ctx));
    t->warned = true;
  }
}

static void tb_train(trainer *t, const nb_train_step_info *si) {
  nb_status s = nb_prof_tb_scalar(t->tb, "train/loss", si->step, si->loss);
  if (!s) s = nb_prof_tb_scalar(t->tb, "train/lr", si->step, si->lr);
  if (!s) s = nb_prof_tb_scalar(t->tb, "train/grad_norm", si->step, si->grad_norm);
  if (!s) s = nb_prof_tb_scalar(t->tb, "train/tokens_per_s", si->step, si->tokens_per_s);
  for (size_t i = 0; !s && si->metrics && i < nb_tree_size(si->metrics); i++) {
    const char *p = nb_tree_path(si->metrics, i);
    char tag[96];
    if (!strncmp(p, "eval_", 5)) continue;
    snprintf(tag, sizeof tag, "train/%s", p);
    s = nb_prof_tb_scalar(t->tb, tag, si->step, nb_array_get(nb_tree_leaf(si->metrics, i)->array, 0));
  }
  if (!s && isfinite(si->mfu)) s = nb_prof_tb_scalar(t->tb, "train/mfu", si->step, si->mfu);
  if (!s) s = nb_prof_tb_flush(t->tb);
  diag(t, s);
}

static void tb_eval(trainer *t, int64_t step, double loss, const nb_tree *metrics) {
  nb_status s = nb_prof_tb_scalar(t->tb, "eval/loss", step, loss);
  for (size_t i = 0; !s && metrics && i < nb_tree_size(metrics); i++) {
    const char *p = nb_tree_path(metrics, i);
    char tag[96];
    if (strncmp(p, "eval_", 5)) continue;
    snprintf(tag, sizeof tag, "eval/%s", p + 5);
    s = nb_prof_tb_scalar(t->tb, tag, step, nb_array_get(nb_tree_leaf(metrics, i)->array, 0));
  }
  if (!s) s = nb_prof_tb_flush(t->tb);
  diag(t, s);
}

static void report(trainer *t) {
  char mp[NB_TRAIN_PATH_MAX + 16], rp[NB_TRAIN_PATH_MAX + 16];
  snprintf(mp, sizeof mp, "%s/metrics.jsonl", t->dir);
  snprintf(rp, sizeof rp, "%s/report.html", t->dir);
  diag(t, nb_prof_report_html(t->ctx, mp, rp, t->dir));
}

/* Whether evals run: an eval graph with eval_steps batches, or a task's own evaluate */
static bool evaluates(const trainer *t) {
  if (t->cfg->eval_every <= 0) return false;
  return t->task && t->task->evaluate ? true : t->eval_exe && t->cfg->eval_steps > 0;
}

/* Whether run_dir/checkpoints holds a committed step (the run resumes: init_from's weights are not read) */
static bool has_checkpoint(nb_ctx *ctx, const char *run_dir) {
  char ck[NB_TRAIN_PATH_MAX + 16];
  snprintf(ck, sizeof ck, "%s/checkpoints", run_dir);
  if (access(ck, F_OK) != 0) return false;
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = ck, .read_only = true});
  int64_t step = -1;
  if (m) nb_ckpt_latest_step(m, &step);
  nb_ckpt_manager_destroy(m);
  nb_ctx_clear_error(ctx); /* a failure here is the trainer's to report, at set-up */
  return step >= 0;
}

/* ---------------------------------------------------------------- profile.steps */

/* The trace of profile.steps: starts when the coming step is in its range
 * (a resume may begin inside it) and stops after its last step or when the
 * loop ends early. A trace already on (NABLA_PROFILE for the whole command)
 * is left alone; a failure is logged and training goes on. */
typedef enum { PROFILE_NOT_YET, PROFILE_ON, PROFILE_DONE } profile_state;

static void profile_begin(trainer *t, profile_state *ps) {
  int64_t first, last, next = t->step + 1;
  if (*ps != PROFILE_NOT_YET || !nb_train_profile_steps(t->cfg, &first, &last) || next < first || next > last) return;
  *ps = PROFILE_DONE;
  if (nb_prof_tracing()) {
    nb_logf(t->ctx, NB_LOG_WARN, "train: profile.steps=%s: a trace is already being recorded; not starting another",
            t->cfg->profile.steps);
    return;
  }
  char path[NB_TRAIN_PATH_MAX + 32], html[NB_TRAIN_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/profile/trace.json", t->dir);
  snprintf(html, sizeof html, "%s/profile.html", t->dir); /* beside report.html */
  nb_prof_trace_opts o = {.path = path, .html_path = html, .peak_flops = t->opts->peak_flops, .peak_bytes_per_s = 0};
  if (t->opts->threads > 0) o.peak_bytes_per_s = nb_prof_peak_bandwidth(t->opts->threads).bytes_per_s;
  if (nb_prof_start(t->ctx, &o) == NB_OK) *ps = PROFILE_ON;
  else {
    nb_logf(t->ctx, NB_LOG_WARN, "train: profile.steps=%s: %s (training continues)", t->cfg->profile.steps, nb_ctx_error(t->ctx));
    nb_ctx_clear_error(t->ctx);
  }
}

static void profile_end(trainer *t, profile_state *ps, bool loop_over) {
  int64_t first, last;
  if (*ps != PROFILE_ON || (!loop_over && nb_train_profile_steps(t->cfg, &first, &last) && t->step < last)) return;
  *ps = PROFILE_DONE;
  nb_status was = nb_ctx_status(t->ctx); /* the loop's error stays the one reported */
  char *err = was ? strdup(nb_ctx_error(t->ctx)) : NULL;
  if (nb_prof_stop(t->ctx)) nb_logf(t->ctx, NB_LOG_WARN, "train: writing the profile: %s", nb_ctx_error(t->ctx));
  if (was) nb_errorf(t->ctx, was, "%s", err ? err : "(out of memory for the message)");
  else nb_ctx_clear_error(t->ctx);
  free(err);
}

nb_status nb_train_run(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_opts *opts, nb_train_result *out) {
  nb_train_result res = {.final_loss = NAN, .last_eval_loss = NAN, .exe_ms_median = NAN, .iter_ms_median = NAN};
  if (out) *out = res;
  if (!cfg || !opts || !opts->run_dir || !opts->run_dir[0])
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: need a config and options with a run_dir");
  nb_status s = nb_train_config_validate(ctx, cfg);
  if (s) return s;
  /* init_from: the model (and its params) come from there; the config
   * written and stored in checkpoints is the resolved one */
  nb_train_config resolved = *cfg;
  nb_tree *init = NULL;
  if (cfg->init_from[0] &&
      (s = nb_train_init_from(ctx, cfg->init_from, cfg, &resolved.model, has_checkpoint(ctx, opts->run_dir) ? NULL : &init)))
    return s;
  if (cfg->init_from[0] && (s = nb_train_config_validate(ctx, &resolved))) return nb_tree_destroy(init), s;
  /* config.yaml names a preset of the model's family (every model key follows it), not the default's */
  if (cfg->init_from[0]) snprintf(resolved.preset, sizeof resolved.preset, "%s", resolved.model.family == NB_MODEL_GPT2 ? "gpt2-tiny" : "llama-tiny");
  cfg = &resolved;
  trainer t = {.ctx = ctx, .cfg = cfg, .opts = opts, .task = opts->task, .t0 = nb_util__now_s(), .init = init};
  t.rank = job_rank(ctx, cfg);
  nb_comm *tensor = cfg->mesh.tensor > 1 ? nb_ctx_axis(ctx, "tensor") : NULL;
  t.tp = tensor ? tensor->ops->rank(tensor) : 0;
  /* a job of several processes: process 0 owns the run dir; process p > 0
   * keeps its own files in DIR/rank<p> */
  int p = job_process(&t);
  int dn = p ? snprintf(t.dir, sizeof t.dir, "%s/rank%d", opts->run_dir, p) : snprintf(t.dir, sizeof t.dir, "%s", opts->run_dir);
  if (dn >= (int)sizeof t.dir) return nb_tree_destroy(init), nb_errorf(ctx, NB_ERR_INVALID_ARG, "train: run_dir too long");
  if ((s = nb_train__mkdir_p(ctx, t.dir))) return nb_tree_destroy(init), s;
  if (!(t.config = config_text(ctx, cfg, opts->task))) return nb_tree_destroy(init), nb_ctx_status(ctx);
  /* handlers before set-up: a signal there ends the run cleanly, not the process */
  if (opts->handle_signals && (s = nb_ckpt_preemption_install(ctx))) {
    free(t.config);
    nb_tree_destroy(init);
    return s;
  }
  nb_train_start_info info = {0};
  s = setup(&t, &info);
  if (s || t.interrupted) {
    if (t.interrupted && !s)
      nb_logf(ctx, NB_LOG_WARN, "train: interrupted by a signal during set-up: nothing trained, nothing to checkpoint");
    res.preempted = t.interrupted && !s;
    res.start_step = res.final_step = t.step;
    char *msg = s ? strdup(nb_ctx_error(ctx)) : NULL;
    teardown(&t);
    if (opts->handle_signals) {
      nb_ckpt_preemption_uninstall();
      nb_ckpt_preemption_clear();
    }
    if (s) nb_errorf(ctx, s, "%s", !msg ? "train: set-up failed (out of memory for the message)" : msg[0] ? msg : nb_status_name(s));
    free(msg);
    if (out) *out = res;
    return s;
  }
  res.start_step = res.final_step = t.step;
  if (opts->on_start) opts->on_start(opts->ud, &info);
  if (!s && t.step == 0 && t.task && t.task->evaluate && evaluates(&t)) { /* a task's own eval: the start, as step 0 */
    nb_tree *metrics = nb_tree_create(ctx);
    double loss = NAN;
    s = metrics ? run_eval(&t, &loss, metrics) : NB_ERR_NOMEM;
    if (!s) {
      write_eval(&t, 0, loss, metrics);
      tb_eval(&t, 0, loss, metrics);
    }
    nb_tree_destroy(metrics);
  }
  int64_t n = cfg->steps > t.step ? cfg->steps - t.step : 0;
  double *exe_ms = calloc((size_t)n + 1, sizeof *exe_ms), *iter_ms = calloc((size_t)n + 1, sizeof *iter_ms);
  if (!exe_ms || !iter_ms) s = nb_errorf(ctx, NB_ERR_NOMEM, "train: out of memory");
  double tokens = (double)(cfg->batch_size * rows_per_example(&t) * cfg->data.seq_len), t_log = nb_util__now_s();
  int64_t since_log = 0;
  double t_loop = nb_util__now_s();
  profile_state profiling = PROFILE_NOT_YET;
  while (!s && t.step < cfg->steps) {
    profile_begin(&t, &profiling);
    double a = nb_util__now_s(), ems = 0, dms = 0, eval_t = 0;
    int64_t t_step = nb_util__trace_start();
    nb_train_step_info si = {.total_steps = cfg->steps, .tokens_per_s = NAN, .mfu = NAN, .eval_loss = NAN};
    bool logs_metrics = t.task || cfg->model.n_experts > 0;
    nb_tree *metrics = logs_metrics ? nb_tree_create(ctx) : NULL;
    si.metrics = metrics;
    if (logs_metrics && !metrics) s = NB_ERR_NOMEM;
    if (s || (s = one_step(&t, &si, &ems, &dms, metrics))) {
      nb_tree_destroy(metrics);
      break;
    }
    si.step = t.step;
    since_log++;
    res.final_loss = si.loss;
    si.logged = t.step % cfg->log_every == 0 || t.step == cfg->steps;
    if (si.logged) {
      double dt = nb_util__now_s() - t_log;
      si.tokens_per_s = dt > 0 ? tokens * (double)since_log / dt : NAN;
      if (opts->peak_flops > 0 && dt > 0) si.mfu = info.flops_per_step * (double)since_log / dt / opts->peak_flops;
      si.elapsed_s = t.elapsed_before + nb_util__now_s() - t.t0;
      write_record(&t, &si);
      tb_train(&t, &si);
    }
    if (evaluates(&t) && (t.step % cfg->eval_every == 0 || t.step == cfg->steps)) {
      double e0 = nb_util__now_s();
      int64_t te = nb_util__trace_start();
      if ((s = run_eval(&t, &si.eval_loss, t.task ? metrics : NULL))) {
        nb_tree_destroy(metrics);
        break;
      }
      nb_util__trace_span("train", "eval", te, nb_util__now_ns(), NULL, 0);
      si.has_eval = true;
      res.last_eval_loss = si.eval_loss;
      write_eval(&t, t.step, si.eval_loss, metrics);
      tb_eval(&t, t.step, si.eval_loss, metrics);
      eval_t = nb_util__now_s() - e0;
      res.eval_s += eval_t;
    }
    bool stop = opts->should_stop && opts->should_stop(opts->ud, t.step);
    bool preempt = opts->handle_signals && nb_ckpt_preemption_requested();
    bool ckpt = (cfg->checkpoint_every > 0 && t.step % cfg->checkpoint_every == 0) || t.step == cfg->steps;
    double c0 = nb_util__now_s();
    int64_t tc = nb_util__trace_start();
    if (preempt) s = save(&t, true);
    else if (ckpt || stop) s = save(&t, false);
    if (tc && (preempt || ckpt || stop)) nb_util__trace_span("ckpt", "checkpoint save", tc, nb_util__now_ns(), NULL, 0);
    if (!s && (ckpt || stop || preempt || si.has_eval)) report(&t);
    res.ckpt_s += nb_util__now_s() - c0;
    si.elapsed_s = t.elapsed_before + nb_util__now_s() - t.t0;
    si.step_ms = (nb_util__now_s() - a - eval_t) * 1e3;
    exe_ms[res.steps_run] = ems;
    iter_ms[res.steps_run] = si.step_ms;
    res.steps_run++;
    res.exe_s += ems * 1e-3;
    res.data_s += dms * 1e-3;
    if (si.logged) {
      t_log = nb_util__now_s();
      since_log = 0;
    }
    if (t_step) {
      nb_util__trace_arg sa[] = {{"step", NULL, (double)t.step}, {"loss", NULL, si.loss}};
      nb_util__trace_span("train", "train step", t_step, nb_util__now_ns(), sa, 2);
    }
    profile_end(&t, &profiling, false);
    if (opts->on_step) opts->on_step(opts->ud, &si);
    nb_tree_destroy(metrics);
    if (preempt || stop) {
      res.preempted = preempt;
      res.stopped = stop && !preempt;
      break;
    }
  }
  profile_end(&t, &profiling, true);
  res.wall_s = nb_util__now_s() - t_loop;
  res.final_step = t.step;
  res.exe_ms_median = median(exe_ms, res.steps_run);
  res.iter_ms_median = median(iter_ms, res.steps_run);
  free(exe_ms);
  free(iter_ms);
  if (!s) {
    /* the handlers stay until the last save is on disk: a signal now waits for it */
    bool said = false;
    while (nb_ckpt_save_in_flight(t.ckpt)) {
      if (opts->handle_signals && nb_ckpt_preemption_requested() && !said) {
        nb_logf(ctx, NB_LOG_WARN, "train: signal received: waiting for the checkpoint of step %lld to be written",
                (long long)t.last_saved);
        said = true;
      }
      nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    s = nb_ckpt_wait_until_finished(t.ckpt);
    if (!s) report(&t);
  }
  /* teardown may record errors of its own: the caller gets the first one */
  char *msg = s ? strdup(nb_ctx_error(ctx)) : NULL;
  teardown(&t);
  if (opts->handle_signals) {
    nb_ckpt_preemption_uninstall();
    nb_ckpt_preemption_clear();
  }
  if (s) nb_errorf(ctx, s, "%s", !msg ? "train: failed (out of memory for the message)" : msg[0] ? msg : nb_status_name(s));
  free(msg);
  if (out) *out = res;
  return s;
}

double nb_train_peak_flops_estimate(int threads) { return nb_prof_peak_flops(threads).flops; }
