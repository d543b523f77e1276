/* The starting model of a post-training run, from any of the places
 * `init_from=` accepts (nb_pt__load_base). */
#include <stdio.h>
#include <sys/stat.h>

#include "internal.h"
#include "nabla/train.h"

static bool has(const char *dir, const char *name, bool want_dir) {
  char p[4200];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return !stat(p, &st) && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

nb_status nb_pt__load_base(nb_ctx *ctx, const char *key, const char *path, nb_model_loaded *m) {
  nb_status s = has(path, "config.json", false)                                        ? nb_model_load_hf(ctx, path, m)
                : has(path, "config.yaml", false) || has(path, "checkpoints", true) ? nb_train_load_run_dir(ctx, path, NULL, m)
                                                                                       : nb_train_load_checkpoint(ctx, path, NULL, m);
  if (!s) return NB_OK;
  char cause[2048];
  snprintf(cause, sizeof cause, "%s", nb_ctx_error(ctx));
  return nb_errorf(ctx, s, "%s '%s': %s", key, path, cause);
}
