/* Reading the JSON golden files of the value tests (see json_golden.h). */
#include "json_golden.h"

cJSON *nb_test_golden_load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "golden file %s: cannot open (run the tests from the repository root)\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!text || got != (size_t)n) {
    fprintf(stderr, "golden file %s: read failed\n", path);
    free(text);
    return NULL;
  }
  text[n] = 0;
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) fprintf(stderr, "golden file %s: not valid JSON\n", path);
  return j;
}

int nb_test_golden_ints(const cJSON *j, const char *name, int64_t *out, int cap) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, name);
  if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) > cap) return -1;
  int n = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, l) out[n++] = (int64_t)cJSON_GetNumberValue(v);
  return n;
}

nb_array *nb_test_golden_array(nb_ctx *ctx, const cJSON *j) {
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype"), *data = cJSON_GetObjectItemCaseSensitive(j, "data");
  nb_dtype t;
  int64_t dims[NB_MAX_RANK];
  int rank = nb_test_golden_ints(j, "shape", dims, NB_MAX_RANK);
  if (!cJSON_IsString(dt) || !nb_dtype_from_name(dt->valuestring, &t) || rank < 0 || !cJSON_IsArray(data)) {
    fprintf(stderr, "golden array: bad dtype, shape or data\n");
    return NULL;
  }
  nb_shape s = nb_shape_make(rank, dims);
  int64_t n = nb_shape_size(&s);
  if (cJSON_GetArraySize(data) != n) {
    fprintf(stderr, "golden array: %d values for %lld elements\n", cJSON_GetArraySize(data), (long long)n);
    return NULL;
  }
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  int64_t i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, data) v[i++] = cJSON_GetNumberValue(e);
  nb_array *a = nb_array_from_f64(ctx, t, rank, dims, v);
  free(v);
  return a;
}

bool nb_test_arrays_close(const char *what, const nb_array *a, const nb_array *b, double tol) {
  nb_aval x = nb_array_aval(a), y = nb_array_aval(b);
  if (!nb_aval_equal(&x, &y)) {
    char s1[128], s2[128];
    fprintf(stderr, "%s: got %s, want %s\n", what, nb_aval_str(&x, s1, sizeof s1), nb_aval_str(&y, s2, sizeof s2));
    return false;
  }
  for (int64_t i = 0; i < nb_array_size(a); i++) {
    double u = nb_array_get(a, i), v = nb_array_get(b, i);
    bool ok = tol == 0 ? (u == v || (u != u && v != v)) : fabs(u - v) <= tol * (1 + fabs(v));
    if (!ok) {
      fprintf(stderr, "%s: element %lld: got %.9g, want %.9g\n", what, (long long)i, u, v);
      return false;
    }
  }
  return true;
}

void nb_test_check_values(nb_ctx *ctx, const char *what, nb_array *got, nb_dtype t, int rank, const int64_t *dims,
                          const double *want) {
  nb_array *w = nb_array_from_f64(ctx, t, rank, dims, want);
  CHECK_MSG(got && nb_test_arrays_close(what, got, w, 0), "%s", what);
  nb_array_release(w);
  nb_array_release(got);
}
