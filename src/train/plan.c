/* The step planner behind `nabla plan`: for a run config and N chips, every
 * mesh layout data x fsdp x tensor x expert = N estimated by rooflines in the
 * method of "How to Scale Your Model" (docs/dist.md, "nabla plan"): compute
 * time from the FLOPs, each collective's time from the bytes it moves over the
 * link its mesh axis runs on, memory per device from the parameter, gradient,
 * optimizer-state and activation bytes. Also the one model-FLOP count MFU is
 * measured against (the trainer's too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/prof.h"
#include "nabla/train.h"

/* ------------------------------------------------------------------------ */
/* Model FLOPs                                                               */
/* ------------------------------------------------------------------------ */

int64_t nb_train_active_params(const nb_train_config *cfg, const nb_tree *params) {
  const nb_model_config *m = &cfg->model;
  double n = 0;
  for (size_t i = 0; i < nb_tree_size(params); i++) {
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(params, i));
    double size = (double)nb_shape_size(&av.shape);
    /* a routed expert's weights are stacked [n_experts, ...]: a token runs top_k of them */
    if (m->n_experts > 0 && strstr(nb_tree_path(params, i), "/experts/")) size *= (double)m->top_k / (double)m->n_experts;
    n += size;
  }
  return n >= 9.2e18 ? INT64_MAX : (int64_t)llround(n);
}

double nb_train_model_flops(const nb_train_config *cfg, int64_t active_params) {
  const nb_model_config *m = &cfg->model;
  double tokens = (double)cfg->batch_size * (double)cfg->data.seq_len;
  double attention = 12.0 * (double)m->n_layers * (double)m->n_heads * (double)nb_model_head_dim(m) * (double)cfg->data.seq_len;
  return 6.0 * (double)active_params * tokens + attention * tokens;
}

/* ------------------------------------------------------------------------ */
/* Chips                                                                     */
/* ------------------------------------------------------------------------ */

static const char *const chip_names = "h100, tpu-v5p, cpu:this, custom";

nb_status nb_train_chip_spec(nb_ctx *ctx, const char *name, int64_t n_chips, nb_train_chip *out) {
  if (!name || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: NULL chip name or output");
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", name);
  out->efficiency = 0.6;
  out->overlap = true;
  if (!strcmp(name, "h100")) {
    /* H100 SXM5 datasheet: 989 TFLOP/s dense bf16, 495 dense TF32 (the
     * rates with sparsity are twice these), 3.35 TB/s HBM3, 80 GB; NVLink 4
     * 900 GB/s per GPU both ways; a DGX/HGX node of 8 with one 400 Gb/s
     * ConnectX-7 NIC per GPU */
    out->peak_flops_bf16 = 989e12;
    out->peak_flops_f32 = 495e12;
    out->hbm_bytes_per_s = 3.35e12;
    out->mem_bytes = 80e9;
    out->link_bytes_per_s = 450e9;
    out->node_link_bytes_per_s = 50e9;
    out->chips_per_node = 8;
    snprintf(out->source, sizeof out->source,
             "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s bf16 dense (f32 as TF32 495), HBM3 3.35 TB/s, 80 GB; "
             "NVLink 4: 900 GB/s per GPU both ways (450 one way), 8 GPUs a node; between nodes one 400 Gb/s "
             "NIC per GPU (50 GB/s)");
  } else if (!strcmp(name, "tpu-v5p")) {
    /* Cloud TPU v5p system architecture page: 459 TFLOP/s bf16, 95 GB HBM2e
     * at 2765 GB/s, 4800 Gbps ICI per chip over a 3D torus (6 links); one
     * mesh axis rides one torus axis, two links of 45 GB/s each way */
    out->peak_flops_bf16 = 459e12;
    out->peak_flops_f32 = 459e12;
    out->hbm_bytes_per_s = 2.765e12;
    out->mem_bytes = 95e9;
    out->link_bytes_per_s = 90e9;
    out->node_link_bytes_per_s = 90e9;
    snprintf(out->source, sizeof out->source,
             "Google Cloud TPU v5p: 459 TFLOP/s bf16 (f32 matmuls at JAX's default precision run as bf16), "
             "HBM2e 95 GB at 2765 GB/s, ICI 4800 Gbps per chip on a 3D torus: one mesh axis on one torus axis, "
             "2 links x 45 GB/s one way (scaling book); one slice (no DCN)");
  } else if (!strcmp(name, "cpu:this")) {
    if (n_chips < 1) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: cpu:this needs the chip count (>= 1)");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int threads = cpus > n_chips ? (int)(cpus / n_chips) : 1;
    nb_prof_peak f = nb_prof_peak_flops(threads), b = nb_prof_peak_bandwidth(threads);
    out->peak_flops_bf16 = out->peak_flops_f32 = f.flops;
    out->hbm_bytes_per_s = b.bytes_per_s;
    out->mem_bytes = pages > 0 && page > 0 ? (double)pages * (double)page / (double)n_chips : 0;
    /* processes on one machine exchange through Open MPI's shared memory: a
     * message is copied in and out, so a collective moves at about half of
     * one process's memory bandwidth (stated, not measured) */
    out->link_bytes_per_s = out->node_link_bytes_per_s = b.bytes_per_s / 2;
    out->efficiency = 0.6;
    out->overlap = false; /* nabla's collectives are synchronous steps today */
    snprintf(out->source, sizeof out->source,
             "this machine as %lld process(es) of %d thread(s): f32 FMA peak %.1f GFLOP/s (%.400s); memory bandwidth "
             "%.1f GB/s (%.400s); RAM / processes; links between processes: half the bandwidth (stated)",
             (long long)n_chips, threads, f.flops / 1e9, f.source, b.bytes_per_s / 1e9, b.source);
  } else if (!strcmp(name, "custom")) {
    snprintf(out->source, sizeof out->source, "given on the command line");
  } else {
    return nb_errorf(ctx, NB_ERR_NOT_FOUND, "plan: unknown chip '%s' (known: %s)", name, chip_names);
  }
  return NB_OK;
}

/* ------------------------------------------------------------------------ */
/* The estimate of one layout                                               */
/* ------------------------------------------------------------------------ */

/* What every layout shares, from the config. */
typedef struct model_sizes {
  double params, expert_params;   /* all parameters; of them, the routed experts' */
  double param_b, compute_b;      /* bytes per element */
  double opt_per_param;           /* optimizer-state elements per parameter */
  double tokens_per_row;
  int64_t moe_layers;
} model_sizes;

/* The link a mesh axis of `size` runs on, its groups `stride` chips apart. */
static double axis_bw(const nb_train_chip *c, int64_t stride, int64_t size) {
  if (size <= 1) return INFINITY;
  bool in_node = c->chips_per_node <= 0 || stride * size <= c->chips_per_node;
  return in_node ? c->link_bytes_per_s : c->node_link_bytes_per_s;
}

/* Saved-for-backward elements per token of one block (docs/dist.md): the
 * tensor-parallel share (sharded) and the rest (replicated: the residual
 * stream and the norms' inputs and outputs). */
static void block_act(const nb_train_config *cfg, double *replicated, double *sharded) {
  const nb_model_config *m = &cfg->model;
  double d = (double)m->d_model, hd = (double)nb_model_head_dim(m), T = (double)cfg->data.seq_len;
  double qd = (double)m->n_heads * hd, kvd = 2.0 * (double)m->n_kv_heads * hd;
  double ff = (double)m->d_ff;
  if (m->n_experts > 0) ff = (double)(m->top_k + m->n_shared_experts) * (double)m->moe_d_ff;
  *replicated = 4.0 * d;
  /* q, k, v, the attention probabilities (no flash attention: H x T per token), the
   * attention output, the MLP's up projection(s) and activation */
  *sharded = qd + kvd + (double)m->n_heads * T + qd + (m->gated_mlp ? 3.0 : 2.0) * ff;
}

static void estimate(const nb_train_config *cfg, const model_sizes *ms, const nb_train_plan *p, nb_train_plan_layout *l) {
  const nb_train_chip *c = &p->chip;
  const nb_model_config *m = &cfg->model;
  double D = (double)l->data, F = (double)l->fsdp, t = (double)l->tensor, E = (double)l->expert;
  int64_t batch_ways = l->data * l->fsdp * l->expert;
  bool remat = cfg->remat == NB_TRAIN_REMAT_BLOCK;
  /* micro-batches: the trainer runs grad_accum / (data fsdp) of them per process */
  l->micro_batches = cfg->grad_accum % batch_ways == 0 ? cfg->grad_accum / batch_ways : 1;
  l->micro_rows = cfg->batch_size / batch_ways / l->micro_batches;
  if (l->micro_rows < 1) l->micro_rows = 1;
  double k = (double)l->micro_batches, micro_tokens = (double)l->micro_rows * ms->tokens_per_row;

  /* memory: parameters (experts also split over expert), gradients, optimizer state */
  double dense = ms->params - ms->expert_params;
  double shard_elems = dense / (F * t) + ms->expert_params / (F * t * E);
  l->param_bytes = shard_elems * ms->param_b;
  l->grad_bytes = shard_elems * ms->param_b * (l->micro_batches > 1 ? 2.0 : 1.0); /* + the sum over micro-batches */
  l->opt_bytes = shard_elems * ms->opt_per_param * ms->param_b;
  /* FSDP's gathered weights: with remat a block's gathers are redone in its
   * backward (about two blocks live); without, nabla keeps them from a block's
   * forward to its backward (measured: bench/RESULTS.md, FSDP memory) */
  double whole = (dense / t + ms->expert_params / (t * E)) * ms->compute_b;
  l->gathered_bytes = l->fsdp == 1 ? 0 : remat ? 2.0 * whole / (double)m->n_layers : whole;
  double rep, shd;
  block_act(cfg, &rep, &shd);
  double per_layer = rep + shd / t, L = (double)m->n_layers;
  double saved = remat ? L * (double)m->d_model + per_layer /* block inputs + one block recomputed */ : L * per_layer;
  double logits = 2.0 * (double)m->vocab_size / t * 4.0; /* f32 logits and their gradient */
  l->act_bytes = micro_tokens * (saved * ms->compute_b + logits + (double)m->d_model * ms->compute_b);
  l->mem_bytes = l->param_bytes + l->grad_bytes + l->opt_bytes + l->gathered_bytes + l->act_bytes;
  l->fits = l->mem_bytes <= c->mem_bytes;

  /* compute: hardware FLOPs (remat recomputes the forward: 8 instead of 6) over
   * the chips, or the HBM traffic if that is longer: weights read in forward,
   * backward dX and dW per micro-batch, activations written and read back, the
   * optimizer reading parameter, gradient and state and writing parameter and state */
  double flops = p->hw_flops / (double)p->n_chips;
  double hbm = k * 3.0 * whole + 2.0 * k * l->act_bytes + shard_elems * ms->param_b * (3.0 + 2.0 * ms->opt_per_param);
  double t_flops = flops / (p->peak_flops * c->efficiency), t_hbm = c->hbm_bytes_per_s > 0 ? hbm / c->hbm_bytes_per_s : 0;
  l->compute_s = t_flops > t_hbm ? t_flops : t_hbm;

  /* collectives; axes from the innermost: tensor, expert, fsdp, data */
  double bw_t = axis_bw(c, 1, l->tensor), bw_e = axis_bw(c, l->tensor, l->expert);
  double bw_f = axis_bw(c, l->tensor * l->expert, l->fsdp), bw_d = axis_bw(c, l->tensor * l->expert * l->fsdp, l->data);
  /* tensor: 2 all-reduces of [tokens, d] per block forward, 2 backward (+2 re-run by remat) */
  double ar_t = 2.0 * (t - 1) / t * micro_tokens * (double)m->d_model * ms->compute_b;
  l->tp_bytes = k * L * (remat ? 6.0 : 4.0) * ar_t;
  /* expert: all_to_all dispatch and combine per MoE layer forward and backward (+2 by remat) */
  double a2a = (E - 1) / E * micro_tokens * (double)m->top_k * (double)m->d_model * ms->compute_b;
  l->ep_bytes = l->expert > 1 ? k * (double)ms->moe_layers * (remat ? 6.0 : 4.0) * a2a : 0;
  /* fsdp: per micro-batch the weights gathered for the forward and again for the
   * backward, the gradients reduce-scattered */
  double gathered = (F - 1) / F * whole, scattered = (F - 1) / F * (dense / t + ms->expert_params / (t * E)) * ms->param_b;
  l->fsdp_bytes = k * (2.0 * gathered + scattered);
  /* data (and expert, for the weights the expert axis does not split): one
   * all-reduce of each process's gradient shard per step */
  double DE = D * E;
  double dense_grad = dense / (F * t) * ms->param_b, expert_grad = ms->expert_params / (F * t * E) * ms->param_b;
  l->dp_bytes = (DE > 1 ? 2.0 * (DE - 1) / DE * dense_grad : 0) + (D > 1 ? 2.0 * (D - 1) / D * expert_grad : 0);
  l->tp_s = l->tp_bytes / bw_t;
  l->ep_s = l->ep_bytes / bw_e;
  l->fsdp_s = l->fsdp_bytes / bw_f;
  /* the dense gradients' all-reduce spans data and expert: the slower of their links */
  double bw_de = bw_d < bw_e ? bw_d : bw_e;
  l->dp_s = l->dp_bytes > 0 ? l->dp_bytes / (l->data > 1 ? bw_de : bw_e) : 0;
  if (!isfinite(l->tp_s)) l->tp_s = 0;
  if (!isfinite(l->ep_s)) l->ep_s = 0;
  if (!isfinite(l->fsdp_s)) l->fsdp_s = 0;
  if (!isfinite(l->dp_s)) l->dp_s = 0;
  /* overlap: data-parallel and FSDP collectives run beside the compute that does
   * not need them (async collectives); tensor and expert ones are on the path */
  double hideable = l->dp_s + l->fsdp_s;
  double exposed = c->overlap ? (hideable > l->compute_s ? hideable - l->compute_s : 0) : hideable;
  l->exposed_comm_s = exposed + l->tp_s + l->ep_s;
  l->step_s = l->compute_s + l->exposed_comm_s;
  l->tokens_per_s = p->tokens / l->step_s;
  l->mfu = p->model_flops / (l->step_s * (double)p->n_chips * p->peak_flops);

  /* what the trainer cannot run yet (the rules of nb_train__tp_check and nb_train__ep_validate) */
  char *n = l->note;
  size_t cap = sizeof l->note;
  const nb_model_config *mc = &cfg->model;
  n[0] = 0;
  if (l->tensor > 1 && (l->fsdp > 1 || mc->n_experts > 0 || mc->attn_dropout > 0))
    snprintf(n, cap, "nabla train: tensor parallel not with %s yet", l->fsdp > 1 ? "fsdp" : mc->n_experts > 0 ? "MoE"
                                                                                  : "attention dropout");
  else if (l->expert > 1 && l->fsdp > 1) snprintf(n, cap, "nabla train: expert parallel not with fsdp yet");
  else if (l->expert > 1 && mc->capacity_factor <= 0)
    snprintf(n, cap, "nabla train: expert parallel needs model.capacity_factor > 0");
  if (cfg->grad_accum % batch_ways) {
    size_t used = strlen(n);
    snprintf(n + used, cap - used, "%snabla train needs grad_accum (%lld) a multiple of %lld", used ? "; " : "",
             (long long)cfg->grad_accum, (long long)batch_ways);
  }
}

/* fastest first; on a tie (communication hidden alike) less time on the
 * links, then less memory */
static int by_step(const void *a, const void *b) {
  const nb_train_plan_layout *x = a, *y = b;
  double cx = x->dp_s + x->fsdp_s + x->tp_s + x->ep_s, cy = y->dp_s + y->fsdp_s + y->tp_s + y->ep_s;
  if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
  if (cx != cy) return cx < cy ? -1 : 1;
  return (x->mem_bytes > y->mem_bytes) - (x->mem_bytes < y->mem_bytes);
}

nb_status nb_train_plan_make(nb_ctx *ctx, const nb_train_config *cfg, const nb_train_chip *chip, int64_t n_chips,
                             nb_train_plan *out) {
  if (!cfg || !chip || !out) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: NULL argument");
  memset(out, 0, sizeof *out);
  out->best = -1;
  if (n_chips < 1) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: --chips must be >= 1 (got %lld)", (long long)n_chips);
  const char *bad = !(chip->peak_flops_bf16 > 0 && chip->peak_flops_f32 > 0) ? "peak FLOP/s (--peak-tflops)"
                    : !(chip->mem_bytes > 0)                                   ? "memory (--mem-gib)"
                    : !(chip->link_bytes_per_s > 0 && chip->node_link_bytes_per_s > 0) ? "link bandwidth (--link-gbs)"
                    : !(chip->hbm_bytes_per_s >= 0)                            ? "memory bandwidth (--hbm-gbs)"
                    : !(chip->efficiency > 0 && chip->efficiency <= 1)         ? "efficiency (--efficiency, in (0, 1])"
                                                                               : NULL;
  if (bad) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: chip '%s' has no valid %s", chip->name, bad);
  const nb_model_config *m = &cfg->model;
  nb_tree *spec = nb_model_param_spec(ctx, m, cfg->precision.params);
  if (!spec) return nb_ctx_status(ctx);
  model_sizes ms = {0};
  out->n_params = nb_nn_params_count(spec);
  out->active_params = nb_train_active_params(cfg, spec);
  for (size_t i = 0; i < nb_tree_size(spec); i++) {
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(spec, i));
    if (m->n_experts > 0 && strstr(nb_tree_path(spec, i), "/experts/")) ms.expert_params += (double)nb_shape_size(&av.shape);
  }
  nb_tree_destroy(spec);
  ms.params = (double)out->n_params;
  ms.param_b = (double)nb_dtype_size(cfg->precision.params);
  ms.compute_b = (double)nb_dtype_size(cfg->precision.compute);
  ms.opt_per_param = cfg->optim.name == NB_TRAIN_OPTIM_SGD ? (cfg->optim.momentum > 0 ? 1.0 : 0.0) : 2.0;
  ms.tokens_per_row = (double)cfg->data.seq_len;
  ms.moe_layers = m->n_experts > 0 ? m->n_layers - m->first_dense_layers : 0;

  out->chip = *chip;
  out->n_chips = n_chips;
  out->tokens = (double)cfg->batch_size * (double)cfg->data.seq_len;
  out->model_flops = nb_train_model_flops(cfg, out->active_params);
  out->hw_flops = out->model_flops * (cfg->remat == NB_TRAIN_REMAT_BLOCK ? 8.0 / 6.0 : 1.0);
  out->peak_flops = cfg->precision.compute == NB_BF16 ? chip->peak_flops_bf16 : chip->peak_flops_f32;

  /* every factorization; the first reason a divisor was refused, for the error */
  int cap = 0;
  char why[512] = "";
  int64_t max_e = m->n_experts > 0 ? (m->n_experts < n_chips ? m->n_experts : n_chips) : 1;
  for (int64_t t = 1; t <= n_chips; t++) {
    if (n_chips % t) continue;
    if (m->n_heads % t || m->n_kv_heads % t || m->d_ff % t || (m->n_experts > 0 && m->moe_d_ff % t)) {
      size_t used = strlen(why);
      if (!strstr(why, "tensor="))
        snprintf(why + used, sizeof why - used, "%stensor=%lld does not divide n_heads %lld, n_kv_heads %lld and d_ff %lld",
                 used ? "; " : "", (long long)t, (long long)m->n_heads, (long long)m->n_kv_heads, (long long)m->d_ff);
      continue;
    }
    for (int64_t e = 1; e <= max_e; e++) {
      if ((n_chips / t) % e || (e > 1 && m->n_experts % e)) continue;
      for (int64_t f = 1; f <= n_chips / (t * e); f++) {
        if ((n_chips / (t * e)) % f) continue;
        int64_t d = n_chips / (t * e * f);
        if (cfg->batch_size % (d * f * e)) {
          size_t used = strlen(why);
          if (!strstr(why, "batch_size"))
            snprintf(why + used, sizeof why - used, "%sbatch_size %lld is not divisible by data x fsdp x expert = %lld",
                     used ? "; " : "", (long long)cfg->batch_size, (long long)(d * f * e));
          continue;
        }
        if (out->n_layouts == cap) {
          cap = cap ? 2 * cap : 16;
          nb_train_plan_layout *nl = realloc(out->layouts, (size_t)cap * sizeof *nl);
          if (!nl) {
            nb_train_plan_free(out);
            return nb_errorf(ctx, NB_ERR_NOMEM, "plan: out of memory");
          }
          out->layouts = nl;
        }
        nb_train_plan_layout *l = &out->layouts[out->n_layouts++];
        memset(l, 0, sizeof *l);
        l->data = d, l->fsdp = f, l->tensor = t, l->expert = e;
        estimate(cfg, &ms, out, l);
      }
    }
  }
  if (!out->n_layouts) {
    nb_train_plan_free(out);
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "plan: --chips %lld: no mesh data x fsdp x tensor x expert = %lld is valid for this config (%s)",
                     (long long)n_chips, (long long)n_chips, why[0] ? why : "no factorization");
  }
  qsort(out->layouts, (size_t)out->n_layouts, sizeof *out->layouts, by_step);
  for (int i = 0; i < out->n_layouts && out->best < 0; i++)
    if (out->layouts[i].fits) out->best = i;
  return NB_OK;
}

void nb_train_plan_free(nb_train_plan *p) {
  if (!p) return;
  free(p->layouts);
  p->layouts = NULL;
  p->n_layouts = 0;
}
