/* The harness's counters, summary line and test RNG. */
#include "test.h"

int nb_test_failures, nb_test_checks;

int nb_test_summary(const char *name) {
  printf("%s: %d checks\n", name, nb_test_checks);
  printf("%d passed, %d failed\n", nb_test_checks - nb_test_failures, nb_test_failures);
  return nb_test_failures ? 1 : 0;
}

double nb_test_uniform(nb_test_rng *r) {
  uint64_t x = r->s ? r->s : 0x9e3779b97f4a7c15ull;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  r->s = x;
  return (double)(x >> 11) / 9007199254740992.0;
}

double nb_test_normal(nb_test_rng *r) {
  double u = nb_test_uniform(r), v = nb_test_uniform(r);
  return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

int64_t nb_test_int(nb_test_rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(nb_test_uniform(r) * (double)(hi - lo + 1));
}
