/* A tiny test harness: CHECK macros that count failures and print the file,
 * line and values, and a main-style summary line that ctest and CI read. */
#ifndef NABLA_TEST_H
#define NABLA_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

extern int nb_test_failures, nb_test_checks;

#define CHECK(cond)                                                           \
  do {                                                                        \
    nb_test_checks++;                                                         \
    if (!(cond)) {                                                            \
      nb_test_failures++;                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                         \
  } while (0)

#define CHECK_MSG(cond, ...)                                                  \
  do {                                                                        \
    nb_test_checks++;                                                         \
    if (!(cond)) {                                                            \
      nb_test_failures++;                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                           \
      fputc('\n', stderr);                                                    \
    }                                                                         \
  } while (0)

/* a status call that must succeed; prints the context's error otherwise */
#define CHECK_OK(ctx, expr)                                                    \
  do {                                                                         \
    nb_status s_ = (expr);                                                     \
    CHECK_MSG(s_ == NB_OK, "%s -> %s: %s", #expr, nb_status_name(s_), nb_ctx_error(ctx)); \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                  \
  do {                                                                         \
    double a_ = (a), b_ = (b);                                                 \
    CHECK_MSG(fabs(a_ - b_) <= (tol) * (1 + fabs(b_)), "%.9g vs %.9g (tol %g)", a_, b_, (double)(tol)); \
  } while (0)

/* the error message must contain `needle` */
#define CHECK_ERR(ctx, expected_status, needle)                                \
  do {                                                                         \
    CHECK_MSG(nb_ctx_status(ctx) == (expected_status), "status %s, wanted %s (%s)", \
              nb_status_name(nb_ctx_status(ctx)), nb_status_name(expected_status), nb_ctx_error(ctx)); \
    CHECK_MSG(strstr(nb_ctx_error(ctx), (needle)) != NULL, "message '%s' lacks '%s'", nb_ctx_error(ctx), (needle)); \
    nb_ctx_clear_error(ctx);                                                   \
  } while (0)

/* Prints "N passed, M failed" and returns the exit code. */
int nb_test_summary(const char *name);

/* Random numbers for tests: a fixed-seed xorshift stream. */
typedef struct nb_test_rng { uint64_t s; } nb_test_rng;
double nb_test_uniform(nb_test_rng *r);          /* [0, 1) */
double nb_test_normal(nb_test_rng *r);
int64_t nb_test_int(nb_test_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */

#endif
