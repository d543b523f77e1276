/* erf^-1 in double precision, within an ulp of the correctly rounded value
 * over all of (-1, 1) (checked against mpmath in tests/core/test_numerics.c).
 * One definition for the interpreter (prims/unary.c) and for the generated
 * C (backend/cpu/codegen_c.c stringizes it into its prelude), so compiled and
 * interpreted results agree bit for bit.
 *
 * An initial guess (Giles' single-precision rational approximation, good to
 * about 1e-7 where 1 - |y| > 1e-7, to 0.1 at the last doubles below 1)
 * refined by Newton steps: on erf(x) = |y| near 0, where erf's rounding is
 * small relative to x; on log(erfc(x)) = log(1 - |y|) from |y| = 1/2 on,
 * where 1 - |y| is exact, erf(x) - y would cancel, and the logarithm keeps
 * the steps well scaled however small erfc is (more steps where the guess
 * is poor). Only functions, no macros, so the stringized text compiles the
 * same anywhere. */
#ifndef NABLA_CORE_PRIMS_ERF_INV_H
#define NABLA_CORE_PRIMS_ERF_INV_H

#define NB__ERF_INV_DEF(name)                                                                                   \
  static double name(double y) {                                                                                \
    if (!(y > -1.0 && y < 1.0)) return y == 1.0 || y == -1.0 ? y / 0.0 : (y - y) / 0.0;                        \
    double a = fabs(y), w = -log((1.0 - a) * (1.0 + a)), x;                                                     \
    const double two_over_sqrt_pi = 1.1283791670955126;                                                         \
    if (w < 5.0) {                                                                                              \
      w -= 2.5;                                                                                                 \
      x = 2.81022636e-08;                                                                                       \
      x = 3.43273939e-07 + x * w;                                                                               \
      x = -3.5233877e-06 + x * w;                                                                               \
      x = -4.39150654e-06 + x * w;                                                                              \
      x = 0.00021858087 + x * w;                                                                                \
      x = -0.00125372503 + x * w;                                                                               \
      x = -0.00417768164 + x * w;                                                                               \
      x = 0.246640727 + x * w;                                                                                  \
      x = 1.50140941 + x * w;                                                                                   \
    } else {                                                                                                    \
      double s = sqrt(w) - 3.0;                                                                                 \
      x = -0.000200214257;                                                                                      \
      x = 0.000100950558 + x * s;                                                                               \
      x = 0.00134934322 + x * s;                                                                                \
      x = -0.00367342844 + x * s;                                                                               \
      x = 0.00573950773 + x * s;                                                                                \
      x = -0.0076224613 + x * s;                                                                                \
      x = 0.00943887047 + x * s;                                                                                \
      x = 1.00167406 + x * s;                                                                                   \
      x = 2.83297682 + x * s;                                                                                   \
    }                                                                                                           \
    x *= a;                                                                                                     \
    if (a < 0.5) {                                                                                              \
      for (int i = 0; i < 2; i++) x -= (erf(x) - a) / (two_over_sqrt_pi * exp(-x * x));                         \
    } else {                                                                                                    \
      double q = 1.0 - a;                                                                                       \
      for (int i = 0, n = w < 16.0 ? 2 : 4; i < n; i++) {                                                       \
        double e = erfc(x);                                                                                     \
        x += log(e / q) * e / (two_over_sqrt_pi * exp(-x * x));                                                 \
      }                                                                                                         \
    }                                                                                                           \
    return copysign(x, y);                                                                                      \
  }

#define NB__STRINGIZE(...) #__VA_ARGS__
#define NB__XSTRINGIZE(...) NB__STRINGIZE(__VA_ARGS__)
/* The definition as C source text, one line. */
#define NB__ERF_INV_SOURCE(name) NB__XSTRINGIZE(NB__ERF_INV_DEF(name))

#endif
