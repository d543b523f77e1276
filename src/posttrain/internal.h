/* posttrain's internal helpers shared by its commands (sft, dpo, grpo). */
#ifndef NABLA_POSTTRAIN_INTERNAL_H
#define NABLA_POSTTRAIN_INTERNAL_H

#include "nabla/models.h"

/* The model a post-training run starts from: a Hugging Face directory
 * (config.json + safetensors: GPT-2, Llama, Mistral, Qwen2), a nabla run
 * dir (config.yaml or checkpoints/) or one checkpoint step dir. Errors are
 * "<key> '<path>': <cause>". */
nb_status nb_pt__load_base(nb_ctx *ctx, const char *key, const char *path, nb_model_loaded *m);

/* One lora.<key>=v of a config (target, rank, alpha, dropout, rslora,
 * init) into target / lc; errors "<where>: <key>: <why>"; NB_ERR_NOT_FOUND
 * (no message) for a key that is not one of those. */
#include "nabla/posttrain.h"
nb_status nb_pt__set_lora_key(nb_ctx *ctx, const char *where, const char *key, const char *v, char target[NB_TRAIN_STR_MAX],
                              nb_pt_lora_config *lc);

/* A config value as a YAML double-quoted scalar (" and \ escaped), for the
 * commands' config.yaml writers. */
#include <stdio.h>
void nb_pt__yaml_str(FILE *f, const char *s);

/* Adds reward i of src (a callback) to dst; a built-in of src is refused. */
struct nb_pt_rewards;
nb_status nb_pt__rewards_share(struct nb_pt_rewards *dst, const struct nb_pt_rewards *src, int i);

/* Calls fn on every non-blank line of the JSONL file at path (line: 1-based;
 * text without its line end), stopping at the first error, which it
 * returns. Errors of its own: "<what>: cannot open '<path>': <cause>",
 * "<what>: reading '<path>': <cause>". *xxh3 (may be NULL) gets the file's
 * identity, a hash over the xxh3 of every line (blank ones too). */
#include <stdint.h>
typedef nb_status (*nb_pt__jsonl_line)(void *ud, nb_ctx *ctx, int64_t line, const char *text, size_t len);
nb_status nb_pt__jsonl_each(nb_ctx *ctx, const char *what, const char *path, nb_pt__jsonl_line fn, void *ud,
                            uint64_t *xxh3);

#endif
