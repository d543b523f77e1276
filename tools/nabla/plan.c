/* `nabla plan CONFIG --chips N --chip-spec NAME`: the step time, memory per
 * device, communication and MFU of every mesh layout of a run config on N
 * chips, from rooflines (nb_train_plan_make; docs/dist.md, "nabla plan"). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla plan CONFIG.yaml [key=value ...] --chips N --chip-spec (h100|tpu-v5p|cpu:this|custom)\n"
    "                  [--peak-tflops T] [--hbm-gbs B] [--mem-gib M] [--link-gbs L] [--node-link-gbs L]\n"
    "                  [--chips-per-node K] [--efficiency E] [--overlap | --no-overlap] [--top K] [--json]\n"
    "Estimates, for every mesh layout data x fsdp x tensor x expert = N, the step time (compute + the\n"
    "communication overlap does not hide), memory per device, bytes each device sends and MFU, fastest\n"
    "first; '*' marks the fastest layout that fits in memory, '!' one that does not fit.\n"
    "  CONFIG          the run config `nabla train` takes ('-': the defaults), key=value overrides after it\n"
    "  --chips N       chips (processes for cpu:this) in the job\n"
    "  --chip-spec S   h100 (SXM, 8 a node), tpu-v5p (one slice), cpu:this (this machine shared by N\n"
    "                  processes: its measured peaks), custom (needs --peak-tflops, --hbm-gbs, --mem-gib,\n"
    "                  --link-gbs)\n"
    "  --peak-tflops, --hbm-gbs, --mem-gib, --link-gbs, --node-link-gbs, --chips-per-node: replace the\n"
    "                  chip's numbers (peak: dense, at the config's precision.compute; link: GB/s one way)\n"
    "  --efficiency E  the fraction of peak the FLOPs run at (default 0.6)\n"
    "  --overlap, --no-overlap  hide data-parallel and FSDP collectives behind compute (default: on,\n"
    "                  off for cpu:this, whose collectives are synchronous today)\n"
    "  --top K         print the K fastest layouts (default all)\n"
    "  --json          the whole plan as JSON on stdout\n";

/* the library's message without its "plan: " (the command names itself) */
static const char *plan_error(nb_ctx *ctx) {
  const char *e = nb_ctx_error(ctx);
  return strncmp(e, "plan: ", 6) ? e : e + 6;
}

static void human_bytes(double b, char *buf, size_t cap) {
  if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else snprintf(buf, cap, "%.1f MiB", b / (1024.0 * 1024));
}

static void human_s(double s, char *buf, size_t cap) {
  if (s >= 1) snprintf(buf, cap, "%.3g s", s);
  else if (s >= 1e-3) snprintf(buf, cap, "%.3g ms", s * 1e3);
  else snprintf(buf, cap, "%.3g us", s * 1e6);
}

static void print_table(const char *config, const nb_train_config *cfg, const nb_train_plan *p, int top) {
  const nb_train_chip *c = &p->chip;
  printf("plan: %s (%s), %lld chips of %s\n", config, cfg->preset, (long long)p->n_chips, c->name);
  printf("model: %lld parameters (%lld active per token); batch %lld x %lld = %.0f tokens a step, grad_accum %lld, "
         "remat %s, params %s, compute %s\n",
         (long long)p->n_params, (long long)p->active_params, (long long)cfg->batch_size, (long long)cfg->data.seq_len,
         p->tokens, (long long)cfg->grad_accum, cfg->remat == NB_TRAIN_REMAT_BLOCK ? "block" : "none",
         nb_dtype_name(cfg->precision.params), nb_dtype_name(cfg->precision.compute));
  printf("model FLOPs a step %.4g (hardware, with remat's recomputation, %.4g)\n", p->model_flops, p->hw_flops);
  char mem[32];
  human_bytes(c->mem_bytes, mem, sizeof mem);
  printf("chip: peak %.4g TFLOP/s at %s x efficiency %.2f; memory %s at %.4g GB/s; links %.4g GB/s",
         p->peak_flops / 1e12, nb_dtype_name(cfg->precision.compute), c->efficiency, mem, c->hbm_bytes_per_s / 1e9,
         c->link_bytes_per_s / 1e9);
  if (c->chips_per_node > 0) printf(" in a node of %lld, %.4g GB/s between nodes", (long long)c->chips_per_node, c->node_link_bytes_per_s / 1e9);
  printf("\nsource: %s\n", c->source);
  printf("step = compute + %s\n\n",
         c->overlap ? "tensor/expert collectives + the data/FSDP collectives' excess over compute (overlapped)"
                    : "all collectives (no overlap)");
  printf("  %-22s %10s %10s %10s %11s %6s %11s %11s  %s\n", "data fsdp tensor expert", "step", "compute", "exposed",
         "tokens/s", "MFU", "sent/dev", "mem/dev", "note");
  int n = top > 0 && top < p->n_layouts ? top : p->n_layouts;
  for (int i = 0; i < n; i++) {
    const nb_train_plan_layout *l = &p->layouts[i];
    char lay[48], st[24], cs[24], xs[24], sent[24], md[24];
    snprintf(lay, sizeof lay, "%lld %lld %lld %lld", (long long)l->data, (long long)l->fsdp, (long long)l->tensor,
             (long long)l->expert);
    human_s(l->step_s, st, sizeof st);
    human_s(l->compute_s, cs, sizeof cs);
    human_s(l->exposed_comm_s, xs, sizeof xs);
    human_bytes(l->dp_bytes + l->fsdp_bytes + l->tp_bytes + l->ep_bytes, sent, sizeof sent);
    human_bytes(l->mem_bytes, md, sizeof md);
    printf("%c %-22s %10s %10s %10s %11.4g %5.1f%% %11s %11s  %s%s%s\n", i == p->best ? '*' : l->fits ? ' ' : '!', lay, st,
           cs, xs, l->tokens_per_s, 100.0 * l->mfu, sent, md, l->fits ? "" : "does not fit",
           !l->fits && l->note[0] ? "; " : "", l->note);
  }
  if (n < p->n_layouts) printf("  (%d more layouts; --top 0 for all)\n", p->n_layouts - n);
  if (p->best < 0) printf("\nno layout fits in %s per chip\n", mem);
}

static int print_json(const char *config, const nb_train_config *cfg, const nb_train_plan *p) {
  const nb_train_chip *c = &p->chip;
  cJSON *j = cJSON_CreateObject(), *ch = cJSON_AddObjectToObject(j, "chip"), *ls = NULL;
  cJSON_AddStringToObject(j, "config", config);
  cJSON_AddStringToObject(j, "preset", cfg->preset);
  cJSON_AddNumberToObject(j, "chips", (double)p->n_chips);
  cJSON_AddStringToObject(ch, "name", c->name);
  cJSON_AddNumberToObject(ch, "peak_flops", p->peak_flops);
  cJSON_AddNumberToObject(ch, "efficiency", c->efficiency);
  cJSON_AddNumberToObject(ch, "hbm_bytes_per_s", c->hbm_bytes_per_s);
  cJSON_AddNumberToObject(ch, "mem_bytes", c->mem_bytes);
  cJSON_AddNumberToObject(ch, "link_bytes_per_s", c->link_bytes_per_s);
  cJSON_AddNumberToObject(ch, "node_link_bytes_per_s", c->node_link_bytes_per_s);
  cJSON_AddNumberToObject(ch, "chips_per_node", (double)c->chips_per_node);
  cJSON_AddBoolToObject(ch, "overlap", c->overlap);
  cJSON_AddStringToObject(ch, "source", c->source);
  cJSON_AddNumberToObject(j, "params", (double)p->n_params);
  cJSON_AddNumberToObject(j, "active_params", (double)p->active_params);
  cJSON_AddNumberToObject(j, "model_flops_per_step", p->model_flops);
  cJSON_AddNumberToObject(j, "hw_flops_per_step", p->hw_flops);
  cJSON_AddNumberToObject(j, "tokens_per_step", p->tokens);
  cJSON_AddNumberToObject(j, "best", p->best);
  ls = cJSON_AddArrayToObject(j, "layouts");
  for (int i = 0; ls && i < p->n_layouts; i++) {
    const nb_train_plan_layout *l = &p->layouts[i];
    cJSON *o = cJSON_CreateObject();
    const struct {
      const char *k;
      double v;
    } f[] = {{"data", (double)l->data}, {"fsdp", (double)l->fsdp}, {"tensor", (double)l->tensor},
             {"expert", (double)l->expert}, {"micro_batches", (double)l->micro_batches},
             {"micro_rows", (double)l->micro_rows}, {"step_s", l->step_s}, {"compute_s", l->compute_s},
             {"exposed_comm_s", l->exposed_comm_s}, {"dp_s", l->dp_s}, {"fsdp_s", l->fsdp_s}, {"tp_s", l->tp_s},
             {"ep_s", l->ep_s}, {"dp_bytes", l->dp_bytes}, {"fsdp_bytes", l->fsdp_bytes}, {"tp_bytes", l->tp_bytes},
             {"ep_bytes", l->ep_bytes}, {"tokens_per_s", l->tokens_per_s}, {"mfu", l->mfu},
             {"param_bytes", l->param_bytes}, {"grad_bytes", l->grad_bytes}, {"opt_bytes", l->opt_bytes},
             {"gathered_bytes", l->gathered_bytes}, {"act_bytes", l->act_bytes}, {"mem_bytes", l->mem_bytes}};
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) cJSON_AddNumberToObject(o, f[k].k, f[k].v);
    cJSON_AddBoolToObject(o, "fits", l->fits);
    cJSON_AddBoolToObject(o, "best", i == p->best);
    cJSON_AddStringToObject(o, "note", l->note);
    cJSON_AddItemToArray(ls, o);
  }
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  if (!s) {
    fprintf(stderr, "nabla plan: out of memory\n");
    return 1;
  }
  printf("%s\n", s);
  free(s);
  return 0;
}

int nb_cmd_plan(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  const char *config = NULL, *spec = NULL;
  const char **over = calloc((size_t)argc, sizeof *over);
  int n_over = 0, rc = 2;
  int64_t chips = 0, top = 0, per_node = -1;
  double peak = 0, hbm = -1, mem = 0, link = 0, node_link = 0, eff = 0;
  int overlap = -1;
  bool json = false, chips_given = false;
  nb_ctx *ctx = NULL;
  if (!over) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool ok = true;
    if (!strcmp(a, "--chips")) ok = nb_cli_int("plan", a, v, 1, 1 << 20, &chips), chips_given = true, i++;
    else if (!strcmp(a, "--chip-spec")) {
      if (!v) {
        fprintf(stderr, "nabla plan: --chip-spec needs a value (h100, tpu-v5p, cpu:this, custom)\n");
        goto out;
      }
      spec = v, i++;
    } else if (!strcmp(a, "--peak-tflops")) ok = nb_cli_float("plan", a, v, 1e-9, 1e9, &peak), peak *= 1e12, i++;
    else if (!strcmp(a, "--hbm-gbs")) ok = nb_cli_float("plan", a, v, 0, 1e9, &hbm), hbm *= 1e9, i++;
    else if (!strcmp(a, "--mem-gib")) ok = nb_cli_float("plan", a, v, 1e-9, 1e9, &mem), mem *= 1073741824.0, i++;
    else if (!strcmp(a, "--link-gbs")) ok = nb_cli_float("plan", a, v, 1e-9, 1e9, &link), link *= 1e9, i++;
    else if (!strcmp(a, "--node-link-gbs")) ok = nb_cli_float("plan", a, v, 1e-9, 1e9, &node_link), node_link *= 1e9, i++;
    else if (!strcmp(a, "--chips-per-node")) ok = nb_cli_int("plan", a, v, 0, 1 << 30, &per_node), i++;
    else if (!strcmp(a, "--efficiency")) ok = nb_cli_float("plan", a, v, 1e-6, 1, &eff), i++;
    else if (!strcmp(a, "--top")) ok = nb_cli_int("plan", a, v, 0, 1 << 30, &top), i++;
    else if (!strcmp(a, "--overlap")) overlap = 1;
    else if (!strcmp(a, "--no-overlap")) overlap = 0;
    else if (!strcmp(a, "--json")) json = true;
    else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "nabla plan: unknown flag %s\n", a);
      nb_cli_usage(usage_text, false);
      goto out;
    } else if (!config) config = a;
    else if (strchr(a, '=')) over[n_over++] = a;
    else {
      fprintf(stderr, "nabla plan: unexpected argument '%s' (overrides are key=value)\n", a);
      goto out;
    }
    if (!ok) goto out;
  }
  if (!config) {
    fprintf(stderr, "nabla plan: CONFIG is required (a run config; '-' for the defaults)\n");
    nb_cli_usage(usage_text, false);
    goto out;
  }
  if (!chips_given) {
    fprintf(stderr, "nabla plan: --chips N is required (the number of chips, or processes for cpu:this)\n");
    goto out;
  }
  if (!spec) {
    fprintf(stderr, "nabla plan: --chip-spec is required (h100, tpu-v5p, cpu:this, custom)\n");
    goto out;
  }
  if (!strcmp(spec, "custom")) {
    const char *missing = !(peak > 0) ? "--peak-tflops" : !(hbm >= 0) ? "--hbm-gbs" : !(mem > 0) ? "--mem-gib"
                          : !(link > 0) ? "--link-gbs" : NULL;
    if (missing) {
      fprintf(stderr, "nabla plan: --chip-spec custom needs %s (custom takes --peak-tflops, --hbm-gbs, --mem-gib, --link-gbs)\n",
              missing);
      goto out;
    }
  }
  rc = 1;
  ctx = nb_ctx_create();
  if (!ctx) goto out;
  nb_train_config cfg;
  if (nb_train_config_load(ctx, strcmp(config, "-") ? config : NULL, n_over, over, &cfg)) {
    fprintf(stderr, "nabla plan: %s\n", nb_ctx_error(ctx));
    goto out;
  }
  nb_train_chip chip;
  if (nb_train_chip_spec(ctx, spec, chips, &chip)) {
    fprintf(stderr, "nabla plan: --chip-spec: %s\n", plan_error(ctx));
    rc = 2;
    goto out;
  }
  if (peak > 0) chip.peak_flops_bf16 = chip.peak_flops_f32 = peak;
  if (hbm >= 0) chip.hbm_bytes_per_s = hbm;
  if (mem > 0) chip.mem_bytes = mem;
  if (link > 0) chip.link_bytes_per_s = link;
  if (node_link > 0) chip.node_link_bytes_per_s = node_link;
  else if (link > 0 && !strcmp(spec, "custom")) chip.node_link_bytes_per_s = link;
  if (per_node >= 0) chip.chips_per_node = per_node;
  if (eff > 0) chip.efficiency = eff;
  if (overlap >= 0) chip.overlap = overlap;
  nb_train_plan p;
  if (nb_train_plan_make(ctx, &cfg, &chip, chips, &p)) {
    fprintf(stderr, "nabla plan: %s\n", plan_error(ctx));
    goto out;
  }
  if (json) rc = print_json(config, &cfg, &p);
  else print_table(config, &cfg, &p, (int)top), rc = 0;
  nb_train_plan_free(&p);
out:
  nb_ctx_destroy(ctx);
  free(over);
  return rc;
}
