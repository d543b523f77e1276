/* The GRPO loss as traced ops (TRL 1.16 GRPOTrainer._compute_loss, token-
 * level importance sampling: clipped ratio, k3 KL, the grpo / bnpo / dr_grpo /
 * dapo aggregations) and the group-normalized advantages, on the host, as
 * TRL computes them from the rewards before the loss. */
#include <math.h>
#include <string.h>

#include "nabla/posttrain.h"

static const char *const loss_names[NB_PT_GRPO_LOSS_COUNT] = {"grpo", "bnpo", "dr_grpo", "dapo"};

const char *nb_pt_grpo_loss_name(nb_pt_grpo_loss_type t) {
  return (int)t >= 0 && t < NB_PT_GRPO_LOSS_COUNT ? loss_names[t] : NULL;
}

static nb_val *k(nb_val *like, double c) { return nb_scalar(nb_val_graph(like), nb_val_dtype(like), c); }

static nb_val *sum_all(nb_val *x) { return nb_reduce_sum(x, 0, NULL); }

/* sum(x * m) / max(sum(m), 1): a mean over the completion tokens */
static nb_val *masked_mean(nb_val *x, nb_val *m) { return nb_div(sum_all(nb_mul(x, m)), nb_max(sum_all(m), k(m, 1))); }

static bool same_nt(nb_val *v, nb_val *logits) {
  return v && nb_val_rank(v) == 2 && nb_val_dim(v, 0) == nb_val_dim(logits, 0) && nb_val_dim(v, 1) == nb_val_dim(logits, 1);
}

static nb_status check(const nb_pt_grpo_opts *o, const nb_pt_grpo_in *in, nb_pt_grpo_out *out) {
  nb_graph *g = in && in->logits ? nb_val_graph(in->logits) : NULL;
  if (!g) return NB_ERR_INVALID_ARG; /* no graph, so no context to hold a message */
  nb_ctx *ctx = nb_graph_ctx(g);
  if (!o || !out || !in->targets || !in->mask || !in->advantages)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: need options, an output, the targets, mask and advantages");
  if ((int)o->loss_type < 0 || o->loss_type >= NB_PT_GRPO_LOSS_COUNT)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: loss_type %d is not one of grpo, bnpo, dr_grpo, dapo", o->loss_type);
  if (!(o->epsilon_low >= 0 && o->epsilon_low < 1))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: epsilon_low must be in [0, 1) (got %g)", o->epsilon_low);
  if (!(o->epsilon_high >= 0 && isfinite(o->epsilon_high)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: epsilon_high must be >= 0 (got %g)", o->epsilon_high);
  if (!(o->beta >= 0 && isfinite(o->beta)))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: beta must be >= 0 (got %g)", o->beta);
  if (o->loss_type == NB_PT_GRPO_DR_GRPO && o->max_completion_length < 1)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: dr_grpo needs max_completion_length >= 1 (got %lld)",
                     (long long)o->max_completion_length);
  if (nb_val_rank(in->logits) != 3 || !nb_dtype_is_float(nb_val_dtype(in->logits)))
    return nb_errorf(ctx, NB_ERR_SHAPE, "grpo loss: logits must be float [N, T, V]");
  int64_t n = nb_val_dim(in->logits, 0);
  struct { const char *name; nb_val *v; } nt[] = {{"targets", in->targets}, {"mask", in->mask}, {"old_logps", in->old_logps},
                                                   {"ref_logps", in->ref_logps}};
  for (size_t i = 0; i < sizeof nt / sizeof *nt; i++)
    if (nt[i].v && !same_nt(nt[i].v, in->logits))
      return nb_errorf(ctx, NB_ERR_SHAPE, "grpo loss: %s must be [%lld, %lld] (the logits without the vocabulary axis)",
                       nt[i].name, (long long)n, (long long)nb_val_dim(in->logits, 1));
  if (o->beta > 0 && !in->ref_logps)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "grpo loss: beta %g > 0 needs the reference's log-probs (ref_logps)", o->beta);
  if (nb_val_rank(in->advantages) != 1 || nb_val_dim(in->advantages, 0) != n)
    return nb_errorf(ctx, NB_ERR_SHAPE, "grpo loss: advantages must be [%lld] (one per completion)", (long long)n);
  if (in->num_items && !(nb_val_rank(in->num_items) == 0 || (nb_val_rank(in->num_items) == 1 && nb_val_dim(in->num_items, 0) == n)))
    return nb_errorf(ctx, NB_ERR_SHAPE, "grpo loss: num_items must be a scalar or [%lld]", (long long)n);
  memset(out, 0, sizeof *out);
  return NB_OK;
}

nb_status nb_pt_grpo_loss(const nb_pt_grpo_opts *o, const nb_pt_grpo_in *in, nb_pt_grpo_out *out) {
  nb_status s = check(o, in, out);
  if (s) return s;
  nb_graph *g = nb_val_graph(in->logits);
  nb_dtype dt = nb_val_dtype(in->logits);
  int64_t n = nb_val_dim(in->logits, 0);
  nb_val *m = nb_convert(in->mask, dt);
  nb_val *lp = nb_pt_token_logps(in->logits, in->targets);
  nb_val *old = in->old_logps ? nb_stop_gradient(nb_convert(in->old_logps, dt)) : nb_stop_gradient(lp);
  nb_val *adv = nb_expand_dims(nb_stop_gradient(nb_convert(in->advantages, dt)), 1); /* [N, 1] */
  nb_val *r = nb_exp(nb_sub(lp, old));
  nb_val *lo = k(r, 1 - o->epsilon_low), *hi = k(r, 1 + o->epsilon_high);
  nb_val *rc = nb_clamp(lo, r, hi);
  nb_val *per_tok = nb_neg(nb_min(nb_mul(r, adv), nb_mul(rc, adv)));
  if (o->beta > 0) {
    nb_val *d = nb_sub(nb_stop_gradient(nb_convert(in->ref_logps, dt)), lp); /* ref - lp */
    nb_val *kl = nb_sub(nb_sub(nb_exp(d), d), k(d, 1));
    per_tok = nb_add(per_tok, nb_mul(k(kl, o->beta), kl));
    out->kl = nb_stop_gradient(masked_mean(kl, m));
  }
  nb_val *tok_sum = sum_all(nb_mul(per_tok, m));
  switch (o->loss_type) {
  case NB_PT_GRPO_GRPO: {
    nb_val *per_seq = nb_div(nb_reduce_sum(nb_mul(per_tok, m), 1, (int[]){1}), nb_max(nb_reduce_sum(m, 1, (int[]){1}), k(m, 1)));
    out->loss = nb_div(sum_all(per_seq), k(per_seq, (double)n));
    break;
  }
  case NB_PT_GRPO_BNPO: out->loss = nb_div(tok_sum, nb_max(sum_all(m), k(m, 1))); break;
  case NB_PT_GRPO_DR_GRPO: out->loss = nb_div(tok_sum, k(tok_sum, (double)n * (double)o->max_completion_length)); break;
  default: { /* dapo */
    nb_val *items = sum_all(m);
    if (in->num_items) {
      items = nb_convert(in->num_items, dt);
      if (nb_val_rank(items) == 1) items = nb_div(sum_all(items), k(items, (double)n)); /* every entry the same */
    }
    out->loss = nb_div(tok_sum, nb_max(nb_stop_gradient(items), k(m, 1)));
    break;
  }
  }
  nb_val *neg = nb_lt(adv, k(adv, 0)), *pos = nb_gt(adv, k(adv, 0));
  nb_val *low = nb_and(nb_lt(r, lo), neg), *high = nb_and(nb_gt(r, hi), pos);
  out->clip_low = nb_stop_gradient(masked_mean(nb_convert(low, dt), m));
  out->clip_high = nb_stop_gradient(masked_mean(nb_convert(high, dt), m));
  out->clip_region = nb_stop_gradient(masked_mean(nb_convert(nb_or(low, high), dt), m));
  s = nb_graph_status(g);
  return s ? s : out->loss ? NB_OK : NB_ERR_INTERNAL;
}

void nb_pt_grpo_advantages(const double *rewards, int64_t n_groups, int64_t G, bool scale_std, double *adv,
                           double *std_out) {
  for (int64_t gi = 0; gi < n_groups; gi++) {
    const double *r = rewards + gi * G;
    double sum = 0, ss = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < G; i++)
      if (!isnan(r[i])) sum += r[i], cnt++;
    double mean = cnt ? sum / (double)cnt : NAN;
    for (int64_t i = 0; i < G; i++)
      if (!isnan(r[i])) ss += (r[i] - mean) * (r[i] - mean);
    /* TRL's nanstd: Bessel's correction; one completion (G = 1) has std 0 */
    double std = G > 1 && cnt > 1 ? sqrt(ss / (double)(cnt - 1)) : 0;
    for (int64_t i = 0; i < G; i++) {
      double a = isnan(r[i]) ? 0 : r[i] - mean;
      if (scale_std) a /= std + 1e-4;
      adv[gi * G + i] = isnan(a) ? 0 : a;
      if (std_out) std_out[gi * G + i] = std;
    }
  }
}
