/* Helpers shared by the models tests (header-only, static): the tiny model
 * config they build on, and a run config written as a run dir's
 * config.yaml. */
#ifndef NABLA_TEST_MODEL_TEST_UTIL_H
#define NABLA_TEST_MODEL_TEST_UTIL_H

#include "testfs.h"

/* preset shrunk to 2 layers of width 16, vocab 32, 4 heads (GQA with 2 KV
 * heads but for GPT-2), d_ff 24, init std 0.3, max_seq_len positions; an MoE
 * preset keeps 4 experts of which 2 are routed to. */
static inline nb_model_config tiny_config(const char *preset, int64_t max_seq_len) {
  nb_model_config c;
  nb_model_config_preset(NULL, preset, &c);
  c.vocab_size = 32;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = strstr(preset, "gpt2") ? 4 : 2;
  c.d_ff = 24;
  c.max_seq_len = max_seq_len;
  if (c.n_experts) {
    c.n_experts = 4;
    c.top_k = 2;
    c.moe_d_ff = strstr(preset, "deepseek") ? 8 : 24;
  }
  c.init_std = 0.3;
  c.router_init_std = 0.3;
  return c;
}

/* Writes rc to path (a run dir's config.yaml); exits when it cannot. */
static inline void write_run_config(const char *path, const nb_train_config *rc) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  nb_train_config_write(rc, f);
  fclose(f);
}

#endif
