/* `nabla quantize`: a model written in another format. So far: GGUF out
 * (llama.cpp's format) as F32, F16, BF16, Q8_0, Q4_0 or Q4_K, from any model
 * `nabla generate` loads (run dir, checkpoint, Hugging Face folder, GGUF
 * file). docs/gguf.md says what is written. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla quantize MODEL --format gguf --type TYPE -o OUT.gguf [options]\n"
    "  MODEL                a nabla run dir (config.yaml), a checkpoint step dir, a Hugging Face\n"
    "                       Llama folder (config.json), or a GGUF file\n"
    "  --format gguf        llama.cpp's file format (the only one so far)\n"
    "  --type TYPE          f32, f16, bf16, q8_0, q4_0 or q4_k: the 2-D weights' type (default f16).\n"
    "                       Norms stay f32; q4_0 and q4_k files keep the output projection at q6_k\n"
    "                       (q8_0 when its rows are not a multiple of 256);\n"
    "                       in q4_k, rows not a multiple of 256 are q4_0; rows not a multiple of 32\n"
    "                       fall back to f16 (as llama.cpp's converter)\n"
    "  -o, --output FILE    the file to write (atomically)\n"
    "  --config FILE        the run config for a run dir / checkpoint\n"
    "  --name NAME          general.name in the file (default: none)\n"
    "The tokenizer is written when it is BPE (byte-level as GPT-2 / Llama-3, or SentencePiece-style\n"
    "as Llama-2); a model without one gets llama.cpp's vocabulary-less mode (ids only).\n"
    "Dense Llama and GPT-2 models.\n";

static const struct {
  const char *name;
  nb_gguf_type type;
} types[] = {{"f32", NB_GGUF_F32}, {"f16", NB_GGUF_F16}, {"bf16", NB_GGUF_BF16}, {"q8_0", NB_GGUF_Q8_0}, {"q4_0", NB_GGUF_Q4_0}, {"q4_k", NB_GGUF_Q4_K}};

int nb_cmd_quantize(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  const char *model = NULL, *format = NULL, *type = "f16", *out = NULL, *config = NULL, *name = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    const char **dst = !strcmp(a, "--format") ? &format : !strcmp(a, "--type") ? &type
                       : !strcmp(a, "-o") || !strcmp(a, "--output") ? &out : !strcmp(a, "--config") ? &config
                       : !strcmp(a, "--name") ? &name : NULL;
    if (dst) {
      if (!v) return fprintf(stderr, "nabla quantize: %s needs a value\n", a), nb_cli_usage(usage_text, false);
      *dst = v, i++;
    } else if (a[0] == '-' || model) {
      return fprintf(stderr, "nabla quantize: unexpected argument '%s'\n", a), nb_cli_usage(usage_text, false);
    } else {
      model = a;
    }
  }
  if (!model || !out) return fprintf(stderr, "nabla quantize: MODEL and -o are required\n"), nb_cli_usage(usage_text, false);
  if (!format || strcmp(format, "gguf"))
    return fprintf(stderr, "nabla quantize: --format must be gguf (the quantization rules of the quant library are not "
                   "here yet)\n"), nb_cli_usage(usage_text, false);
  int t = -1;
  for (int k = 0; k < (int)(sizeof types / sizeof *types); k++)
    if (!strcmp(type, types[k].name)) t = k;
  if (t < 0) return fprintf(stderr, "nabla quantize: --type '%s': one of f32, f16, bf16, q8_0, q4_0, q4_k\n", type), 2;
  const char *inputs[] = {model, config};
  if (!nb_cli_output_ok("quantize", out, false, config ? 2 : 1, inputs)) return 1;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_model_loaded m;
  int rc = 0;
  if (nb_cli_load_model(ctx, model, config, &m)) {
    fprintf(stderr, "nabla quantize: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else {
    nb_model_gguf_opts o = {.type = types[t].type, .name = name};
    if (nb_model_save_gguf(ctx, &m, out, &o)) fprintf(stderr, "nabla quantize: %s: %s\n", out, nb_ctx_error(ctx)), rc = 1;
    else fprintf(stderr, "nabla quantize: wrote %s (%s, %s)\n", out, types[t].name, m.tok ? "with its tokenizer" : "ids only");
    nb_model_loaded_free(&m);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
