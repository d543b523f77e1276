/* Golden files written by the tests/core/golden/make_*.py scripts: JSON with
 * arrays as {"dtype": "f32", "shape": [...], "data": [...]} (row-major). */
#ifndef NABLA_TEST_JSON_GOLDEN_H
#define NABLA_TEST_JSON_GOLDEN_H

#include <cjson/cJSON.h>

#include "test.h"

/* Parses the file at `path` (relative to the repository root, the tests'
 * working directory). Returns a tree the caller frees with cJSON_Delete, or
 * NULL after printing why. */
cJSON *nb_test_golden_load(const char *path);
/* The array described by `j` (a new reference), or NULL after printing why. */
nb_array *nb_test_golden_array(nb_ctx *ctx, const cJSON *j);
/* An integer list member `name` of `j` into out[cap]; returns its length, or
 * -1 when missing or too long. */
int nb_test_golden_ints(const cJSON *j, const char *name, int64_t *out, int cap);
/* True when a and b have one dtype and shape and elements within
 * tol * (1 + |b|) (tol 0: exactly equal); prints the first difference. */
bool nb_test_arrays_close(const char *what, const nb_array *a, const nb_array *b, double tol);

/* Checks that got (taken: released here) equals the values want[] converted
 * to dtype t and shape dims exactly. */
void nb_test_check_values(nb_ctx *ctx, const char *what, nb_array *got, nb_dtype t, int rank, const int64_t *dims,
                          const double *want);

#endif
