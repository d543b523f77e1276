/* Preference losses as traced ops (DPO sigmoid/cDPO, IPO, hinge; ORPO),
 * with TRL's definitions (trl 1.16: DPOTrainer._compute_loss,
 * ORPOTrainer.odds_ratio_loss and its chosen NLL). Everything that
 * exponentiates is written for both signs (log sigmoid, log(1 - e^x)), so a
 * confident policy neither overflows nor loses its gradient. Rows are 2B:
 * the chosen completions, then the rejected ones. */
#include <math.h>
#include <string.h>

#include "nabla/posttrain.h"

static const char *const loss_names[NB_PT_PREF_COUNT] = {"sigmoid", "ipo", "hinge", "orpo"};

const char *nb_pt_pref_loss_name(nb_pt_pref_loss_type t) {
  return (int)t >= 0 && t < NB_PT_PREF_COUNT ? loss_names[t] : NULL;
}

static nb_val *k(nb_val *like, double c) { return nb_scalar(nb_val_graph(like), nb_val_dtype(like), c); }

static nb_val *mean_all(nb_val *x) {
  return nb_div(nb_reduce_sum(x, 0, NULL), k(x, (double)nb_val_dim(x, 0)));
}

/* log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) (PyTorch's F.logsigmoid) */
static nb_val *log_sigmoid(nb_val *x) {
  return nb_sub(nb_min(x, k(x, 0)), nb_log1p(nb_exp(nb_neg(nb_abs(x)))));
}

/* log(1 - e^x) for x <= 0: log1p(-e^x) below -ln 2, log(-expm1(x)) above
 * (no cancellation either side). Each branch sees only inputs of its side,
 * so the branch not taken cannot put a NaN into the gradient. x is capped
 * just below 0 (1e-30; 1e-300 in f64): a completion of probability 1 in
 * the dtype would give log 0 and an infinite slope (TRL gives NaN there). */
static nb_val *log1mexp(nb_val *x) {
  x = nb_min(x, k(x, nb_val_dtype(x) == NB_F64 ? -1e-300 : -1e-30));
  nb_val *t = k(x, -M_LN2), *low = nb_lt(x, t);
  nb_val *a = nb_select(low, x, t), *b = nb_select(low, t, x);
  return nb_select(low, nb_log1p(nb_neg(nb_exp(a))), nb_log(nb_neg(nb_expm1(b))));
}

static nb_graph *graph_of(nb_val *v) { return v ? nb_val_graph(v) : NULL; }

nb_val *nb_pt_token_logps(nb_val *logits, nb_val *targets) {
  nb_val *picked = nb_squeeze(nb_take_along_axis(logits, nb_expand_dims(nb_convert(targets, NB_I32), 2), 2), 1, (int[]){2});
  return nb_sub(picked, nb_logsumexp(logits, 2)); /* log softmax at the target */
}

nb_val *nb_pt_seq_logps(nb_val *logits, nb_val *targets, nb_val *mask, bool mean) {
  if (!logits || !targets || !mask) return NULL;
  nb_ctx *ctx = nb_graph_ctx(nb_val_graph(logits));
  nb_aval la = nb_val_aval(logits), ta = nb_val_aval(targets), ma = nb_val_aval(mask);
  if (la.shape.rank != 3 || !nb_dtype_is_float(la.dtype))
    return nb_errorf(ctx, NB_ERR_SHAPE, "pref seq_logps: logits must be float [N, T, V]"), NULL;
  if (!nb_dtype_is_int(ta.dtype))
    return nb_errorf(ctx, NB_ERR_DTYPE, "pref seq_logps: targets must be integers, got %s", nb_dtype_name(ta.dtype)), NULL;
  for (int i = 0; i < 2; i++)
    if (ta.shape.rank != 2 || ma.shape.rank != 2 || ta.shape.dims[i] != la.shape.dims[i] || ma.shape.dims[i] != la.shape.dims[i]) {
      char s1[96], s2[96], s3[96];
      nb_errorf(ctx, NB_ERR_SHAPE, "pref seq_logps: targets %s and mask %s must be logits %s without the vocabulary axis",
                nb_aval_str(&ta, s2, sizeof s2), nb_aval_str(&ma, s3, sizeof s3), nb_aval_str(&la, s1, sizeof s1));
      return NULL;
    }
  nb_val *m = nb_convert(mask, la.dtype);
  nb_val *sum = nb_reduce_sum(nb_mul(nb_pt_token_logps(logits, targets), m), 1, (int[]){1});
  if (!mean) return sum;
  return nb_div(sum, nb_max(nb_reduce_sum(m, 1, (int[]){1}), k(m, 1)));
}

/* rows [lo, hi) of a [2B] vector */
static nb_val *rows(nb_val *v, int64_t lo, int64_t hi) { return nb_slice(v, &lo, &hi, NULL); }

static nb_status check(const nb_pt_pref_opts *o, const nb_pt_pref_in *in, nb_pt_pref_out *out) {
  nb_graph *g = in ? graph_of(in->logits) : NULL;
  if (!g) return NB_ERR_INVALID_ARG; /* no graph, so no context to hold a message */
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!o || !out || !in->targets || !in->mask)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: need options, an output and the targets and mask");
  if ((int)o->loss_type < 0 || o->loss_type >= NB_PT_PREF_COUNT)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: loss_type %d is not one of sigmoid, ipo, hinge, orpo", o->loss_type);
  if (o->loss_type != NB_PT_PREF_ORPO && !(o->beta > 0 && isfinite(o->beta)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: beta must be > 0 (got %g)", o->beta);
  if (!(o->label_smoothing >= 0 && o->label_smoothing < 0.5))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: label_smoothing must be in [0, 0.5) (got %g)", o->label_smoothing);
  if (o->label_smoothing > 0 && o->loss_type != NB_PT_PREF_SIGMOID)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: label_smoothing (%g) applies to loss_type sigmoid only, not %s",
                     o->label_smoothing, loss_names[o->loss_type]);
  if (o->loss_type == NB_PT_PREF_ORPO && !(o->orpo_lambda > 0 && isfinite(o->orpo_lambda)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: orpo_lambda must be > 0 (got %g)", o->orpo_lambda);
  if (nb_val_rank(in->logits) != 3 || nb_val_dim(in->logits, 0) % 2)
    return nb_errorf(ctx, NB_ERR_SHAPE, "pref loss: logits must be [2B, T, V] (B chosen rows, then B rejected), got %d "
                     "dims, %lld rows", nb_val_rank(in->logits), (long long)nb_val_dim(in->logits, 0));
  int64_t n = nb_val_dim(in->logits, 0);
  if (o->loss_type != NB_PT_PREF_ORPO) {
    if (!in->ref_logps)
      return nb_errorf(ctx, NB_ERR_INVALID_ARG, "pref loss: %s needs the reference log-probs (ref_logps)", loss_names[o->loss_type]);
    if (nb_val_rank(in->ref_logps) != 1 || nb_val_dim(in->ref_logps, 0) != n)
      return nb_errorf(ctx, NB_ERR_SHAPE, "pref loss: ref_logps must be [%lld] (one per row)", (long long)n);
  }
  memset(out, 0, sizeof *out);
  return NB_OK;
}

nb_status nb_pt_pref_loss(const nb_pt_pref_opts *o, const nb_pt_pref_in *in, nb_pt_pref_out *out) {
  nb_status s = check(o, in, out);
  if (s) return s;
  nb_graph *g = nb_val_graph(in->logits);
  int64_t n = nb_val_dim(in->logits, 0), B = n / 2;
  nb_dtype dt = nb_val_dtype(in->logits);
  bool orpo = o->loss_type == NB_PT_PREF_ORPO;
  /* ORPO compares mean token log-probs (TRL: average_log_prob=True); DPO sums */
  nb_val *logps = nb_pt_seq_logps(in->logits, in->targets, in->mask, orpo);
  if (!logps) return nb_graph_status(g) ? nb_graph_status(g) : nb_ctx_status(nb_graph_ctx(g));
  nb_val *lc = rows(logps, 0, B), *lr = rows(logps, B, n);
  nb_val *losses, *rc, *rr;
  if (orpo) {
    nb_val *log_odds = nb_sub(nb_sub(lc, lr), nb_sub(log1mexp(lc), log1mexp(lr)));
    nb_val *ratio = log_sigmoid(log_odds);
    /* NLL of the chosen rows over their valid targets: one token mean over all of them */
    nb_val *valid = nb_convert(in->valid ? in->valid : in->mask, dt);
    int64_t lo[2] = {0, 0}, hi[2] = {B, nb_val_dim(valid, 1)};
    nb_val *vc = nb_slice(valid, lo, hi, NULL);
    nb_val *tok = nb_pt_seq_logps(in->logits, in->targets, valid, false);
    nb_val *nll = nb_neg(nb_div(nb_reduce_sum(rows(tok, 0, B), 0, NULL), nb_max(nb_reduce_sum(vc, 0, NULL), k(vc, 1))));
    out->loss = nb_sub(nll, nb_mul(k(ratio, o->orpo_lambda), mean_all(ratio)));
    out->nll = nb_stop_gradient(nll);
    out->log_odds_ratio = nb_stop_gradient(mean_all(ratio));
    out->log_odds = nb_stop_gradient(mean_all(log_odds));
    rc = nb_mul(k(lc, o->orpo_lambda), lc);
    rr = nb_mul(k(lr, o->orpo_lambda), lr);
    losses = NULL;
  } else {
    nb_val *ref = nb_stop_gradient(nb_convert(in->ref_logps, dt));
    nb_val *ratio_c = nb_sub(lc, rows(ref, 0, B)), *ratio_r = nb_sub(lr, rows(ref, B, n));
    nb_val *d = nb_sub(ratio_c, ratio_r), *bd = nb_mul(k(d, o->beta), d);
    switch (o->loss_type) {
    case NB_PT_PREF_SIGMOID:
      losses = nb_neg(log_sigmoid(bd));
      if (o->label_smoothing > 0) /* cDPO: the label is wrong with probability ls */
        losses = nb_sub(nb_mul(k(bd, 1 - o->label_smoothing), losses), nb_mul(k(bd, o->label_smoothing), log_sigmoid(nb_neg(bd))));
      break;
    case NB_PT_PREF_IPO: { /* per-token logratios: each divided by its completion's token count */
      nb_val *cnt = nb_max(nb_reduce_sum(nb_convert(in->mask, dt), 1, (int[]){1}), k(d, 1));
      nb_val *e = nb_sub(nb_sub(nb_div(ratio_c, rows(cnt, 0, B)), nb_div(ratio_r, rows(cnt, B, n))), k(d, 1 / (2 * o->beta)));
      losses = nb_mul(e, e);
      break;
    }
    default: /* hinge */
      losses = nb_max(nb_sub(k(bd, 1), bd), k(bd, 0));
      break;
    }
    out->loss = mean_all(losses);
    rc = nb_mul(k(ratio_c, o->beta), ratio_c);
    rr = nb_mul(k(ratio_r, o->beta), ratio_r);
  }
  rc = nb_stop_gradient(rc);
  rr = nb_stop_gradient(rr);
  out->chosen_rewards = rc;
  out->rejected_rewards = rr;
  out->accuracy = mean_all(nb_convert(nb_gt(rc, rr), dt));
  out->margin = mean_all(nb_sub(rc, rr));
  out->chosen_logps = nb_stop_gradient(lc);
  out->rejected_logps = nb_stop_gradient(lr);
  s = nb_graph_status(g);
  return s ? s : (out->loss && out->accuracy && out->margin ? NB_OK : NB_ERR_INTERNAL);
}
