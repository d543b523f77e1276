/* `nabla lora merge RUN_DIR OUT_DIR`: a LoRA SFT run's latest adapters
 * merged into its base, written as a run dir any command loads. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla lora merge RUN_DIR OUT_DIR\n"
    "       nabla lora export-peft RUN_DIR OUT_DIR\n"
    "  RUN_DIR   a LoRA run of nabla sft (its config.yaml names the base and the adapters' config)\n"
    "  OUT_DIR   a new directory: config.yaml, checkpoints/ with W + scale * A @ B in place of each\n"
    "            adapted kernel, tokenizer.json when the base has one; export-peft: adapter_config.json\n"
    "            and adapter_model.safetensors that PyPI peft loads onto the Hugging Face model\n";

int nb_cmd_lora(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  bool merge = argc == 4 && !strcmp(argv[1], "merge"), peft = argc == 4 && !strcmp(argv[1], "export-peft");
  if (!merge && !peft) return nb_cli_usage(usage_text, false);
  const char *inputs[] = {argv[2]};
  if (!nb_cli_output_ok(merge ? "lora merge" : "lora export-peft", argv[3], true, 1, inputs)) return 1;
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  int rc = 0;
  if (merge ? nb_pt_lora_merge_run(ctx, argv[2], argv[3]) : nb_pt_lora_export_peft_run(ctx, argv[2], argv[3])) {
    fprintf(stderr, "nabla lora %s: %s\n", argv[1], nb_ctx_error(ctx));
    rc = 1;
  } else {
    printf("nabla lora %s: wrote %s\n", argv[1], argv[3]);
  }
  nb_ctx_destroy(ctx);
  return rc;
}
