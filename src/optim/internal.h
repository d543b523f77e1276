/* Private to src/optim: the transformation object, the shared config struct
 * the built-in transformations hang off it, and small traced helpers (state
 * lookups, moments, counters) used by every file. Not public API. */
#ifndef NABLA_OPTIM_INTERNAL_H
#define NABLA_OPTIM_INTERNAL_H

#include <regex.h>

#include "nabla/optim.h"

#define NB_OPTIM_PATH_MAX 512

struct nb_optim_tx {
  nb_ctx *ctx;
  char name[48];
  nb_optim_init_fn init;
  nb_optim_update_fn update;
  void *ud;
  void (*free_ud)(void *ud);
};

/* The config of a built-in transformation (its ud). Fields are used as each
 * constructor documents; cfg_free releases everything non-NULL. */
typedef struct nb_optim__cfg {
  nb_ctx *ctx;
  double h[8];                 /* hyperparameters */
  int64_t k[2];                /* integer hyperparameters */
  bool f[4];                   /* flags */
  nb_optim_schedule *sched;    /* taken */
  nb_optim_tx **kids;          /* taken */
  int nkids;
  regex_t *regexes;            /* compiled, nregex of them */
  int nregex;
  nb_optim_path_pred pred;
  nb_optim_label_fn label;
  void *pred_ud;
  char **names;                /* owned copies */
  int nnames;
  nb_optim_schedule **values;  /* taken (inject_hyperparams) */
  nb_val **cells;              /* traced values read by slot schedules */
  /* Input-bound numbers (nb_optim_tx_from_input): h[0..nh) are read through
   * nb_optim__hp, from elements at..at+nh of the f64 vector *hcell (hlen long)
   * when that is a value of the graph being traced. nh = 0: h is constant. */
  int nh, at, hlen;
  nb_val *const *hcell;
} nb_optim__cfg;

nb_optim__cfg *nb_optim__cfg_new(nb_ctx *ctx);
void nb_optim__cfg_free(void *cfg);
/* Wraps a config as a transformation; frees cfg when that fails. */
nb_optim_tx *nb_optim__make(nb_ctx *ctx, const char *name, nb_optim_init_fn init, nb_optim_update_fn update,
                            nb_optim__cfg *cfg);
/* Takes kids (destroys them on failure); false with an error. */
bool nb_optim__cfg_take_kids(nb_optim__cfg *c, int n, nb_optim_tx *const *kids);
/* Compiles regex into c (appending); false with an error naming `what`. */
bool nb_optim__cfg_add_regex(nb_optim__cfg *c, const char *regex, const char *what);
bool nb_optim__cfg_match(const nb_optim__cfg *c, int i, const char *path);

/* Validates a hyperparameter: finite and >= lo (or > lo when strict). */
bool nb_optim__check(nb_ctx *ctx, const char *fn, const char *name, double v, double lo, bool strict);
/* True when every pointer is non-NULL; otherwise destroys the non-NULL ones
 * and records an error (unless ctx already holds one from an inner call). */
bool nb_optim__args_ok(nb_ctx *ctx, const char *fn, int ntx, nb_optim_tx *const *txs, int nsched,
                       nb_optim_schedule *const *scheds);

/* "a/b" into buf (false when too long). */
bool nb_optim__join(char *buf, const char *a, const char *b);
/* State leaf "<prefix>/<path>" (or "<prefix>" when path is NULL); NULL with
 * an error when missing. */
nb_val *nb_optim__state(nb_ctx *ctx, const nb_tree *state, const char *prefix, const char *path);
nb_status nb_optim__put(nb_tree *t, const char *prefix, const char *path, nb_val *v);
/* Error when params is NULL ("<name> needs params"). */
nb_status nb_optim__need_params(nb_ctx *ctx, const char *name, const nb_tree *params);
/* The graph's error, if any, copied to ctx. */
nb_status nb_optim__graph_status(nb_ctx *ctx, nb_graph *g);

/* Traced helpers. k(x, c): constant c of x's dtype (rank 0). */
nb_val *nb_optim__k(nb_val *x, double c);
nb_val *nb_optim__count_zero(nb_graph *g);               /* i32 0 */
nb_val *nb_optim__count_inc(nb_val *count);              /* saturating + 1 */
/* (1 - decay) g^order + decay m */
nb_val *nb_optim__moment(nb_val *g, nb_val *m, double decay, int order);
/* m / (1 - decay^count) */
nb_val *nb_optim__bias_correct(nb_val *m, double decay, nb_val *count);
/* A hyperparameter, two ways: the host double d, and when its cfg is bound
 * to an input of the graph being traced, v, the same number as a traced f64
 * scalar. Arithmetic on it (1 - b) is done in f64 either way, and
 * nb_optim__hk rounds the result once to the leaf's dtype: the constant's bits. */
typedef struct nb_optim__hp {
  double d;
  nb_val *v; /* NULL: a constant */
} nb_optim__hp;
nb_optim__hp nb_optim__hp_get(const nb_optim__cfg *c, nb_graph *g, int i); /* h[i] */
nb_optim__hp nb_optim__hp_rsub(double a, nb_optim__hp x);                        /* a - x */
nb_val *nb_optim__hk(nb_val *like, nb_optim__hp x);                        /* x as a scalar of like's dtype */
/* nb_optim__moment and nb_optim__bias_correct with a two-way decay */
nb_val *nb_optim__moment_hp(nb_val *g, nb_val *m, nb_optim__hp decay, int order);
nb_val *nb_optim__bias_correct_hp(nb_val *m, nb_optim__hp decay, nb_val *count);

/* The dtype of a tree's scalars (norms, schedules, step counts as floats):
 * f64 when a float leaf is f64, else f32 (bf16/f16 leaves too). */
nb_dtype nb_optim__scalar_dtype(const nb_tree *t);
nb_dtype nb_optim__scalar_dtype_of(nb_dtype leaf);       /* the same for one leaf dtype */
nb_val *nb_optim__sum_sq(nb_val *x);                     /* scalar sum of squares in x's scalar dtype */
/* A scalar as dtype t. */
nb_val *nb_optim__as(nb_val *s, nb_dtype t);

/* Adafactor's u * max(rms(param), min_scale). */
nb_optim_tx *nb_optim__scale_by_param_block_rms(nb_ctx *ctx, double min_scale);

/* Schedules: slot schedules read a traced value set by inject_hyperparams. */
nb_optim_schedule *nb_optim__slot(nb_ctx *ctx, nb_val **cell, double host_value);

#endif
