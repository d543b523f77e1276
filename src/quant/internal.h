/* quant's private interface: the product kernels (kernels.c) and the
 * codecs they share with the host quantizer (codec.c). */
#ifndef NABLA_QUANT_INTERNAL_H
#define NABLA_QUANT_INTERNAL_H

#include "nabla/quant.h"

#define NB_QUANT__MATMUL_NAME "quant.matmul"
/* int8_block's activation block: 32 elements, as llama.cpp's Q8_0. */
#define NB_QUANT__ACT_BLOCK 32
/* W8A8's int32 tile sums stay exact up to this many products of 127 * 127. */
#define NB_QUANT__MAX_INT_TILE 131072

/* The kernels built for each instruction set. Weight-only products use the
 * float kernels (f32 FMA over 16 lanes of k); W8A8 the integer ones. */
typedef enum nb_quant__fisa { NB_QUANT__F_C, NB_QUANT__F_AVX2, NB_QUANT__F_AVX512, NB_QUANT__F_COUNT } nb_quant__fisa;
typedef enum nb_quant__iisa {
  NB_QUANT__I_C,
  NB_QUANT__I_AVX2,       /* vpmaddubsw + vpmaddwd */
  NB_QUANT__I_AVXVNNI,    /* 256-bit vpdpbusd (VEX) */
  NB_QUANT__I_AVX512VNNI, /* 512-bit vpdpbusd */
  NB_QUANT__I_COUNT
} nb_quant__iisa;

/* Whether this CPU runs the kernel; the names ("c", "avx2", "avx512",
 * "avxvnni", "avx512vnni"). */
bool nb_quant__fisa_supported(nb_quant__fisa f);
bool nb_quant__iisa_supported(nb_quant__iisa i);
const char *nb_quant__fisa_name(nb_quant__fisa f);
const char *nb_quant__iisa_name(nb_quant__iisa i);
/* Test hook: run the given kernels from now on (false, and no change, when
 * the CPU lacks one); f < 0 / i < 0 go back to the best ($NABLA_QUANT_ISA,
 * "c", "avx2" or "avxvnni", caps both at that level). */
bool nb_quant__force_isa(int f, int i);
void nb_quant__current_isa(nb_quant__fisa *f, nb_quant__iisa *i);

/* One product y[m, n] = x[m, k] @ dequant(W)^T, W as in quant.h (values
 * row stride: bytes per row). */
typedef struct nb_quant__mm {
  nb_quant_layout l;
  int64_t m;
  const float *x;
  const uint8_t *values;
  const float *scales;
  const uint8_t *zero_points; /* NULL: symmetric */
  nb_quant_act act;
  float act_scale; /* int8_static */
  float *y;
} nb_quant__mm;

/* Runs it on the current kernels, split over n with nb_jit_parallel_for.
 * Fails only when out of memory (W8A8's quantized activations). */
nb_status nb_quant__matmul(nb_ctx *ctx, const nb_quant__mm *p);

/* The NF4 values (nb_quant_nf4_value). */
extern const float nb_quant__nf4_table[16];
/* nb_quant_act_check's test (act with a layout), the reason into why. */
bool nb_quant__act_ok(const nb_quant_layout *l, nb_quant_act act, char *why, size_t cap);
/* nb_quant_layout_check's test, the reason (naming the field) into why. */
bool nb_quant__layout_ok(const nb_quant_layout *l, char *why, size_t cap);

/* Bytes per row of values; a code's decoded value (no scale) for the
 * float kernels' tables and the reference. */
int64_t nb_quant__row_bytes(const nb_quant_layout *l);
/* W8A8's activation rounding of one row: q[k] in [-127, 127], returns the
 * scale max |x| / 127 (0 for a zero row; NaN when x has a NaN/inf). */
float nb_quant__quantize_row_i8(const float *x, int64_t k, int8_t *q);

/* x (f32, k inputs last) rounded as the W8A8 kernels round it for act
 * (none: x itself), as traced ops: the reference's and QAT's rounding. */
nb_val *nb_quant__round_act_at(nb_loc loc, nb_val *x, nb_quant_act act);

#endif
