/* `nabla model config|params`: the resolved config with overrides, the
 * parameter count of a preset, and a bad key reported with its path. */
#include "testfs.h"

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("models/cli");
  static char out[1 << 16];
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s model config configs/gpt2_124m.yaml steps=7 model.n_layers=3 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  CHECK_MSG(strstr(out, "steps: 7\n") && strstr(out, "  n_layers: 3\n") && strstr(out, "preset: \"gpt2-124m\""), "%s", out);
  snprintf(cmd, sizeof cmd, "%s model params configs/gpt2_124m.yaml 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  CHECK_MSG(strstr(out, "total 124439808 parameters") && strstr(out, "layers/11/mlp/wo/kernel"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s model config - model.n_layer=2 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0);
  CHECK_MSG(strstr(out, "unknown key 'model.n_layer'"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s model 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) != 0 && strstr(out, "usage: nabla model"));
  return nb_test_summary("models/cli");
}
