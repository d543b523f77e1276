/* Strict numbers from text: what every flag, config value and environment
 * variable goes through, so "abc", "2.5" or "1e99" for an integer is an
 * error that names the value, never a silent 0, truncation or saturation. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "core/internal.h"

bool nb_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, char *why, size_t cap) {
  if (!s || !*s || isspace((unsigned char)*s)) return snprintf(why, cap, "'%s' is not an integer", s ? s : ""), false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end) return snprintf(why, cap, "'%s' is not an integer", s), false;
  if (errno == ERANGE || v < lo || v > hi)
    return snprintf(why, cap, "%s is out of range [%lld, %lld]", s, (long long)lo, (long long)hi), false;
  *out = v;
  return true;
}

bool nb_parse_float(const char *s, double lo, double hi, double *out, char *why, size_t cap) {
  if (!s || !*s || isspace((unsigned char)*s)) return snprintf(why, cap, "'%s' is not a number", s ? s : ""), false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*end || !isfinite(v) || (errno == ERANGE && fabs(v) > 1))
    return snprintf(why, cap, "'%s' is not a finite number", s), false;
  if (!(v >= lo && v <= hi)) return snprintf(why, cap, "%s is out of range [%g, %g]", s, lo, hi), false;
  *out = v;
  return true;
}
