/* `nabla model`: inspect a run configuration without training.
 *   nabla model config FILE.yaml [key=value ...]   the validated config, every key, as YAML
 *   nabla model params FILE.yaml [key=value ...]   parameter paths, shapes and the total count
 * FILE may be "-" for the defaults. Errors name the file:line and key. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
    "usage: nabla model config FILE.yaml [key=value ...]\n"
    "       nabla model params FILE.yaml [key=value ...]\n"
    "FILE may be '-' for the built-in defaults (llama-tiny).\n";

int nb_cmd_model(int argc, char **argv) {
  if (nb_cli_help_asked(argc, argv)) return nb_cli_usage(usage_text, true);
  if (argc < 3 || (strcmp(argv[1], "config") && strcmp(argv[1], "params"))) return nb_cli_usage(usage_text, false);
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_train_config cfg;
  const char *path = strcmp(argv[2], "-") ? argv[2] : NULL;
  int rc = 0;
  if (nb_train_config_load(ctx, path, argc - 3, (const char *const *)argv + 3, &cfg) != NB_OK) {
    fprintf(stderr, "nabla model: %s\n", nb_ctx_error(ctx));
    rc = 1;
  } else if (!strcmp(argv[1], "config")) {
    nb_train_config_write(&cfg, stdout);
  } else {
    nb_tree *spec = nb_model_param_spec(ctx, &cfg.model, cfg.precision.params);
    if (!spec) {
      fprintf(stderr, "nabla model: %s\n", nb_ctx_error(ctx));
      rc = 1;
    } else {
      for (size_t i = 0; i < nb_tree_size(spec); i++) {
        char buf[128];
        nb_aval av = nb_leaf_get_aval(nb_tree_leaf(spec, i));
        printf("%-48s %s\n", nb_tree_path(spec, i), nb_aval_str(&av, buf, sizeof buf));
      }
      int64_t total = nb_nn_params_count(spec);
      if (total == INT64_MAX) fprintf(stderr, "nabla model: the parameter count does not fit in 64 bits\n"), rc = 1;
      else printf("total %lld parameters\n", (long long)total);
      nb_tree_destroy(spec);
    }
  }
  nb_ctx_destroy(ctx);
  return rc;
}
