/* exp, tanh and logistic of 32-bit (and narrower) floats, computed in float.
 * One definition for the interpreter (prims/unary.c) and for the generated C
 * (backend/cpu/codegen_c.c stringizes it into its prelude, with the prefix
 * nbx_), so compiled and interpreted results agree bit for bit, and so do
 * AVX-512, AVX2 and plain C builds: every product that feeds a sum is an
 * explicit fmaf (one rounding whether or not the compiler may contract), the
 * rest is +, -, *, / and bit operations, which IEEE arithmetic rounds alike
 * everywhere. Branch-free, so the compiler vectorizes loops over them (twice
 * the lanes of the double formulas these replace).
 *
 * Accuracy against libm's double results, over every 97th float bit pattern
 * (44 M floats, every binade; tests/core/test_numerics.c checks every
 * 4093rd): exp 0.92 ulp, tanh 1.34 ulp, logistic 1.87 ulp at most; 97-99.8%
 * of results are libm's rounded to float.
 *
 * exp: Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2 (ln2's head has
 * 12 trailing zero bits), a degree-7 Taylor polynomial of e^r (truncation
 * 0.1 ulp), scaled by 2^k in two halves so that subnormal results round
 * once; inf above 88.72; 0 below -104 (where e^x < 2^-150), selected
 * rather than computed: a product that underflows costs a microcode assist
 * on Intel cores (8x the time of the whole exp), and a causal mask sends
 * half of every attention softmax there.
 * tanh: below |x| = 0.625 the odd polynomial x + x^3 P(x^2), P a weighted
 * least-squares fit (0.1 ulp); above, 1 - 2 / (e^{2|x|} + 1), where the
 * subtraction cannot cancel (the quotient is below 0.45; 1 where e^{2|x|} overflows).
 * logistic: 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|) <= 1,
 * the quotient corrected for the rounding of 1 + e (2.4 ulp -> 1.9 ulp).
 * Only functions, no macros or comments inside, so the stringized text
 * compiles the same anywhere. */
#ifndef NABLA_CORE_PRIMS_FLOAT_MATH_H
#define NABLA_CORE_PRIMS_FLOAT_MATH_H

#include "core/prims/erf_inv.h" /* NB__XSTRINGIZE */

#define NB__FLOAT_MATH_DEF(p)                                                                         \
  static inline float p##pow2if(int32_t k) {                                                           \
    int32_t b = (k + 127) * (1 << 23);                                                                 \
    float f;                                                                                           \
    memcpy(&f, &b, 4);                                                                                 \
    return f;                                                                                          \
  }                                                                                                    \
  static inline float p##expf(float x) {                                                               \
    float c = x != x || x < -104.0f ? 0.0f : x > 89.0f ? 89.0f : x;                                   \
    float kf = fmaf(c, 1.44269504f, 0x1.8p+23f) - 0x1.8p+23f;                                      \
    float r = fmaf(kf, -0.693145751953125f, c);                                                              \
    r = fmaf(kf, -1.428606765330187e-06f, r);                                                                 \
    float q = 1.0f / 5040.0f;                                                                         \
    q = fmaf(q, r, 1.0f / 720.0f);                                                                   \
    q = fmaf(q, r, 1.0f / 120.0f);                                                                    \
    q = fmaf(q, r, 1.0f / 24.0f);                                                                    \
    q = fmaf(q, r, 1.0f / 6.0f);                                                                    \
    q = fmaf(q, r, 0.5f);                                                                              \
    q = fmaf(q, r, 1.0f);                                                                              \
    q = fmaf(q, r, 1.0f);                                                                              \
    int32_t k = (int32_t)kf, k1 = k / 2;                                                               \
    float y = q * p##pow2if(k1) * p##pow2if(k - k1);                                                   \
    return x != x ? x : x < -104.0f ? 0.0f : y;                                                        \
  }                                                                                                    \
  static inline float p##tanhf(float x) {                                                              \
    float a = fabsf(x), s = a * a;                                                                     \
    float q = -0x1.756db4p-8f;                                                                         \
    q = fmaf(q, s, 0x1.520af4p-6f);                                                                    \
    q = fmaf(q, s, -0x1.b837d0p-5f);                                                                   \
    q = fmaf(q, s, 0x1.110702p-3f);                                                                    \
    q = fmaf(q, s, -0x1.555532p-2f);                                                                   \
    float near0 = fmaf(a * s, q, a);                                                                   \
    float far = 1.0f - 2.0f / (p##expf(2.0f * a) + 1.0f);                                              \
    return copysignf(a < 0.625f ? near0 : far, x);                                                     \
  }                                                                                                    \
  static inline float p##logisticf(float x) {                                                          \
    float e = p##expf(-fabsf(x)), d = 1.0f + e, lost = (1.0f - d) + e;                                 \
    float y = (x >= 0.0f ? 1.0f : e) / d;                                                              \
    y = fmaf(-y, lost / d, y);                                                                         \
    return x == x ? y : x;                                                                             \
  }

/* The definitions as C source text, one line (NB__XSTRINGIZE: erf_inv.h). */
#define NB__FLOAT_MATH_SOURCE(p) NB__XSTRINGIZE(NB__FLOAT_MATH_DEF(p))

#endif
