#include "testrun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/train.h"
#include "testfs.h"

void nb_test_run_losses(const char *run_dir, char *out, size_t cap) {
  char path[4200];
  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  char *t = nb_test_read_file(path, NULL);
  out[0] = 0;
  for (char *p = t; p && (p = strstr(p, "\"loss\":")); p += 7) {
    size_t n = strlen(out);
    snprintf(out + n, cap - n, "%.*s;", (int)strcspn(p + 7, ","), p + 7);
  }
  free(t);
}

bool nb_test_run_same_params(nb_ctx *ctx, const char *a, const char *b) {
  nb_model_loaded ma, mb;
  if (nb_train_load_run_dir(ctx, a, NULL, &ma)) return false;
  if (nb_train_load_run_dir(ctx, b, NULL, &mb)) return nb_model_loaded_free(&ma), false;
  bool same = nb_tree_size(ma.params) == nb_tree_size(mb.params);
  for (size_t i = 0; same && i < nb_tree_size(ma.params); i++) {
    const nb_array *x = nb_tree_leaf(ma.params, i)->array, *y = nb_tree_get_array(mb.params, nb_tree_path(ma.params, i));
    same = y && nb_array_nbytes(x) == nb_array_nbytes(y) && !memcmp(nb_array_data(x), nb_array_data(y), nb_array_nbytes(x));
  }
  nb_model_loaded_free(&ma);
  nb_model_loaded_free(&mb);
  return same;
}
