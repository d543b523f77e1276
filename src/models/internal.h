/* Shared by the model loaders (load.c, hf.c) and the generator; not a public header. */
#ifndef NABLA_MODELS_INTERNAL_H
#define NABLA_MODELS_INTERNAL_H

#include "nabla/models.h"

/* A new tree with exactly the paths of the model's param spec, in its order,
 * as f32 arrays taken from `loaded` (converted when another float dtype).
 * A missing path or a wrong shape is an error naming `where` and the path. */
nb_tree *nb_model__params_f32(nb_ctx *ctx, const nb_model_config *cfg, const nb_tree *loaded, const char *where);

/* Stop ids of a tokenizer: its special tokens that end text (endoftext, eos,
 * end_of_text, eot_id, </s>), appended to m->eos_ids. */
void nb_model__tok_stops(nb_model_loaded *m);

/* A Hugging Face config.json's text (len bytes, borrowed; `name` for
 * messages) into out->cfg, bos_id and eos_ids (out is zeroed first; no
 * params, no tokenizer). What hf.c's loader runs; exposed for the fuzzer. */
nb_status nb_model__hf_config_parse(nb_ctx *ctx, const char *name, const char *text, size_t len, nb_model_loaded *out);

#endif
