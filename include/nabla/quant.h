/* nabla quant: quantized weights and their CPU kernels (the core of the
 * analogue of Qwix; the rules, PTQ/QAT commands and GGUF build on it).
 *
 * A quantized weight is a small tree of ordinary arrays, so checkpoints,
 * trees and traced programs carry it without new machinery. For a linear
 * weight W[N, K] (N outputs, K inputs; the product contracts over K), each
 * row is cut along K into tiles of `tile` elements (the last one ragged when
 * K % tile != 0; tile = K is per-channel), and each tile has one scale:
 *
 *   values       the codes, row-major, one row per output:
 *                  int8 symmetric   i8[N, K]        w = v * s, v in [-127, 127]
 *                  int8 asymmetric  u8[N, K]        w = (v - z) * s
 *                  int4             u8[N, ceil(K/2)] two codes per byte: k = 2j in
 *                                   the low nibble of byte j, k = 2j + 1 in the high
 *                                   one (0 past an odd K); symmetric w = (c - 8) * s,
 *                                   c in [0, 15] (absmax: s = m / -8, m the tile's
 *                                   signed extreme, as GGUF Q4_0); asymmetric w = (c - z) * s
 *                  nf4              u8[N, ceil(K/2)] packed as int4; w = NF4[c] * s
 *                                   (the QLoRA table, nb_quant_nf4_value)
 *                  fp8 e4m3 / e5m2  u8[N, K]        w = fp8(v) * s (OCP float8
 *                                   e4m3fn / e5m2, as ml_dtypes)
 *   scales       f32[N, T], T = ceil(K / tile), scale of tile t of row n
 *   zero_points  u8[N, T], asymmetric int8/int4 only: the code of 0.0
 *
 * nb_quant_weight_to_tree stores them as "<prefix>/values", "/scales",
 * "/zero_points". What the arrays do not say (the qtype, K, the tile) is the
 * layout, static like a rule's configuration.
 *
 * Calibration picks each tile's range: absmax [-a, a] (a = max |w|),
 * minmax [min(w, 0), max(w, 0)] (asymmetric: zero points), rms,K [-K r, K r]
 * (r the tile's root mean square), fixed,MIN,MAX [MIN, MAX] (asymmetric for
 * the integer types). Weights outside the range saturate. Integer codes
 * round half to even; fp8 rounds to nearest even and saturates at the
 * format's largest finite value.
 *
 * The product y[..., N] = x[..., K] @ dequant(W)^T is the custom call
 * "quant.matmul" (nb_quant_matmul), whose kernel dequantizes in registers
 * (weight-only) or multiplies int8 by int8 into int32 (W8A8: x quantized per
 * token, symmetric absmax, at run time). nb_quant_matmul_reference is the
 * same product as ordinary traced ops (the oracle of the tests).
 *
 * Example: an int4 weight with 32-wide tiles, used in a traced step.
 *
 *   nb_quant_weight q;
 *   nb_quant_calib c = {.kind = NB_QUANT_ABSMAX};
 *   nb_quant_quantize(ctx, w, NB_QUANT_INT4, 32, &c, &q);   // w: f32[N, K]
 *   ...while tracing, with values/scales inputs of the step:
 *   nb_val *y = nb_quant_matmul(x, values, scales, NULL, &q.layout, NB_QUANT_ACT_NONE);
 *   ...
 *   nb_quant_weight_release(&q);
 */
#ifndef NABLA_QUANT_H
#define NABLA_QUANT_H

#include "nabla/core.h"
#include "nabla/nn.h"

NB_BEGIN_DECLS

typedef enum nb_quant_type {
  NB_QUANT_INT8,
  NB_QUANT_INT4,
  NB_QUANT_NF4,
  NB_QUANT_FP8_E4M3, /* float8_e4m3fn: no infinities, largest 448 */
  NB_QUANT_FP8_E5M2, /* float8_e5m2: largest finite 57344 */
  NB_QUANT_TYPE_COUNT
} nb_quant_type;

/* "int8", "int4", "nf4", "fp8_e4m3", "fp8_e5m2" (also read by _parse). */
const char *nb_quant_type_name(nb_quant_type t);
nb_status nb_quant_type_parse(nb_ctx *ctx, const char *s, nb_quant_type *out);

typedef enum nb_quant_calib_kind { NB_QUANT_ABSMAX, NB_QUANT_MINMAX, NB_QUANT_RMS, NB_QUANT_FIXED } nb_quant_calib_kind;
typedef struct nb_quant_calib {
  nb_quant_calib_kind kind;
  double k;        /* rms,K: K > 0 */
  double min, max; /* fixed,MIN,MAX: MIN < MAX, finite */
} nb_quant_calib;
/* "absmax", "minmax", "rms,K", "fixed,MIN,MAX". */
nb_status nb_quant_calib_parse(nb_ctx *ctx, const char *s, nb_quant_calib *out);

/* The static half of a quantized W[n, k]: the qtype, the tile (1 <= tile;
 * tile >= k is per-channel; otherwise a multiple of 16, so tiles start on
 * vector and byte boundaries) and whether zero points are present. */
typedef struct nb_quant_layout {
  nb_quant_type qtype;
  int64_t n, k, tile;
  bool asymmetric;
} nb_quant_layout;

/* Scale tiles per row: ceil(k / tile). */
int64_t nb_quant_num_tiles(const nb_quant_layout *l);
/* The avals the layout's arrays must have (values, scales, zero_points). */
nb_aval nb_quant_values_aval(const nb_quant_layout *l);
nb_aval nb_quant_scales_aval(const nb_quant_layout *l);
nb_aval nb_quant_zero_points_aval(const nb_quant_layout *l);
/* NB_OK, or NB_ERR_INVALID_ARG naming the field that is wrong. */
nb_status nb_quant_layout_check(nb_ctx *ctx, const nb_quant_layout *l);

typedef struct nb_quant_weight {
  nb_quant_layout layout;
  nb_array *values, *scales, *zero_points; /* zero_points NULL unless asymmetric */
} nb_quant_weight;

/* Quantizes w (f32[N, K], borrowed) tile by tile; tile 0 means per-channel.
 * minmax and fixed make int8/int4 asymmetric; nf4 and fp8 are symmetric
 * (minmax is refused for them, fixed uses max(|MIN|, |MAX|)). A weight with
 * a NaN or infinity is refused naming the element. *out holds new
 * references (nb_quant_weight_release). */
nb_status nb_quant_quantize(nb_ctx *ctx, const nb_array *w, nb_quant_type qtype, int64_t tile, const nb_quant_calib *calib,
                            nb_quant_weight *out);
/* dequant(W): f32[N, K], a new reference, or NULL with an error. */
nb_array *nb_quant_dequantize(nb_ctx *ctx, const nb_quant_weight *w);
/* NB_OK when the arrays have the layout's avals (error naming the field). */
nb_status nb_quant_weight_check(nb_ctx *ctx, const nb_quant_weight *w);
void nb_quant_weight_release(nb_quant_weight *w);
/* The arrays under "<prefix>/values", "<prefix>/scales" (and
 * "<prefix>/zero_points"); from_tree checks them against *layout and
 * retains them into *out. */
nb_status nb_quant_weight_to_tree(nb_tree *t, const char *prefix, const nb_quant_weight *w);
nb_status nb_quant_weight_from_tree(nb_ctx *ctx, const nb_tree *t, const char *prefix, const nb_quant_layout *layout,
                                    nb_quant_weight *out);

/* Elementwise codecs. fp8: t is NB_QUANT_FP8_E4M3 or _E5M2; encode rounds
 * to nearest even and saturates finite values at the largest finite code
 * (NaN stays NaN; e5m2 infinities stay infinite). */
uint8_t nb_quant_fp8_encode(float x, nb_quant_type t);
float nb_quant_fp8_decode(uint8_t code, nb_quant_type t);
float nb_quant_fp8_max(nb_quant_type t);
/* NF4 code (0..15) -> value in [-1, 1]; encode picks the nearest value
 * (ties to the lower code) of x in [-1, 1]. */
float nb_quant_nf4_value(int code);
uint8_t nb_quant_nf4_encode(float x);

/* ---------------------------------------------------------------- traced */

typedef enum nb_quant_act {
  NB_QUANT_ACT_NONE,         /* weight-only: f32 activations */
  NB_QUANT_ACT_INT8_DYNAMIC, /* W8A8: x row-wise absmax to int8 at run time (int8 symmetric weights) */
  NB_QUANT_ACT_INT8_BLOCK,   /* W8A8 per block ("int8_block", llama.cpp's Q8_0 activations): each 32
                                elements of a row of x absmax to int8 at run time (int8 or int4
                                symmetric weights, any tile: each 16 of a block takes its tile's scale) */
  NB_QUANT_ACT_INT8_STATIC,  /* W8A8 with a fixed activation scale from a calibration pass
                                ("int8_static"): x to int8 as round(x / s), saturating at
                                +-127 (int8 symmetric weights) */
  NB_QUANT_ACT_COUNT
} nb_quant_act;

/* "none", "int8_dynamic", "int8_block", "int8_static" (the rules' act_qtype). */
const char *nb_quant_act_name(nb_quant_act a);
/* Whether the kernels run act with weights of that layout: NB_OK, or
 * NB_ERR_INVALID_ARG naming the field ("act: ...", "tile: ..."). */
nb_status nb_quant_act_check(nb_ctx *ctx, const nb_quant_layout *l, nb_quant_act act);

/* Registers the custom call "quant.matmul" on ctx (nb_quant_matmul does it
 * on first use; call it first when tracing from several threads). */
nb_status nb_quant_register(nb_ctx *ctx);

/* y[..., n] = x[..., k] (f32) @ dequant(W)^T through the custom call; zero_points
 * NULL unless layout->asymmetric. With act = NB_QUANT_ACT_INT8_DYNAMIC each
 * row of x is quantized to int8 (scale max |x| / 127, round half to even)
 * and multiplied in int32. With NB_QUANT_ACT_INT8_BLOCK each 32-element
 * block of a row of x is (its own scale max |block| / 127), each block's
 * product is exact in int32 in 8 lanes of 4 elements, and the lanes are
 * combined in f32 by a fixed chain (docs/quant.md). Under grad, x gets ct @ dequant(W) (W8A8's
 * activation rounding passes the gradient straight through); the weight's
 * arrays get none. Bad operands or layouts poison the graph with an error
 * naming the field. */
nb_val *nb_quant_matmul_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                           const nb_quant_layout *layout, nb_quant_act act);
/* dequant(W) as traced ops (converts, a table take for nf4 and fp8, one
 * multiply by the scales broadcast over their tiles): f32[n, k]. */
nb_val *nb_quant_dequantize_traced_at(nb_loc loc, nb_val *values, nb_val *scales, nb_val *zero_points,
                                      const nb_quant_layout *layout);
/* The product as ordinary traced ops: the activation rounding (W8A8) and
 * dequantize_traced, then dot_general in f32. The custom call equals it
 * within the f32 rounding of a length-k dot product (docs/quant.md). */
nb_val *nb_quant_matmul_reference_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, nb_val *zero_points,
                                     const nb_quant_layout *layout, nb_quant_act act);

/* W8A8 with static activations (NB_QUANT_ACT_INT8_STATIC, int8 symmetric
 * weights): x's codes are round(x / act_scale) half to even, clamped to
 * [-127, 127] (values beyond 127 act_scale saturate; NaN gives NaN), each
 * tile's product exact in int32 and scaled as the dynamic mode.
 * act_scale >= 0, finite (0: every code 0). */
nb_val *nb_quant_matmul_static_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, const nb_quant_layout *layout,
                                  float act_scale);
nb_val *nb_quant_matmul_reference_static_at(nb_loc loc, nb_val *x, nb_val *values, nb_val *scales, const nb_quant_layout *layout,
                                            float act_scale);
#define nb_quant_matmul_static(x, v, s, l, as) nb_quant_matmul_static_at(NB_HERE, x, v, s, l, as)
#define nb_quant_matmul_reference_static(x, v, s, l, as) nb_quant_matmul_reference_static_at(NB_HERE, x, v, s, l, as)
#define nb_quant_matmul(x, v, s, z, l, a) nb_quant_matmul_at(NB_HERE, x, v, s, z, l, a)
#define nb_quant_dequantize_traced(v, s, z, l) nb_quant_dequantize_traced_at(NB_HERE, v, s, z, l)
#define nb_quant_matmul_reference(x, v, s, z, l, a) nb_quant_matmul_reference_at(NB_HERE, x, v, s, z, l, a)

/* ---------------------------------------------------------------- rules */
/* (docs/quant.md "Rules, PTQ and quantized models") */

/* The products the linear hook intercepts, by name (a rule's op_names, as
 * Qwix's QtRule.op_names name the jax ops it intercepts):
 *   dot_general          the plain linear x[..., d_in] @ kernel[d_in, d_out]
 *                        (nb_nn_linear: attention and MLP projections, the
 *                        MoE router, an untied lm_head)
 *   stacked_dot_general  the per-expert linear of MoE, x[E, ..., d_in] @
 *                        kernel[E, d_in, d_out] batched over the experts
 *                        (nb_nn_linear_stacked)
 * A tied LM head (the embedding table used as the output projection) is not
 * a linear the hook sees: no op names it and it stays f32. */
typedef enum nb_quant_op { NB_QUANT_OP_DOT_GENERAL, NB_QUANT_OP_STACKED_DOT_GENERAL, NB_QUANT_OP_COUNT } nb_quant_op;
const char *nb_quant_op_name(nb_quant_op op);
/* NB_ERR_INVALID_ARG "unknown op 'conv'; known: dot_general, ..." */
nb_status nb_quant_op_parse(nb_ctx *ctx, const char *s, nb_quant_op *out);

/* A rule: which linears to quantize and how. module_path is a PCRE2 regex
 * matched in full against a linear's module path, the path of its kernel
 * without "/kernel" ("layers/3/attn/wq"). op_names (n_op_names of them; none:
 * every op) restrict it to those ops. tile_size 0 is per-channel. */
typedef struct nb_quant_rule {
  const char *module_path;
  const char *const *op_names;
  int n_op_names;
  nb_quant_type weight_qtype;
  nb_quant_act act_qtype;
  int64_t tile_size;
  nb_quant_calib weight_calibration;
  /* int8_static: how the calibration pass turns a linear's observed inputs
   * into its activation range [-a, a] (scale a / 127): absmax (a = max |x|),
   * minmax (the observed [min, max]; the codes are symmetric, so a =
   * max(-min, max)), rms,K (a = K x the RMS of x), fixed,MIN,MAX (a =
   * max(|MIN|, |MAX|), no data needed). */
  nb_quant_calib act_calibration;
} nb_quant_rule;

/* An ordered list of rules: the first whose module_path matches and whose
 * op_names (if any) hold the op wins. */
typedef struct nb_quant_rules nb_quant_rules;
/* Copies rules[0 .. n); a bad regex, op name, tile or combination is
 * refused naming "rule I: FIELD" ("rule 2: op_names[0]: unknown op 'conv';
 * known: dot_general, stacked_dot_general"). */
nb_quant_rules *nb_quant_rules_create(nb_ctx *ctx, int n, const nb_quant_rule *rules);
/* From YAML: the list under quant.rules (other top-level keys are ignored,
 * so a run config works), each item a mapping of module_path (required),
 * op_names (a list of op names; default every op), weight_qtype (required), act_qtype (none | int8_dynamic | int8_block; default none),
 * tile_size (an integer or per_channel; default per_channel),
 * weight_calibration (absmax, minmax, "rms,K", "fixed,MIN,MAX"; default
 * absmax). Errors name `name`, the line, the rule index and the field. */
nb_quant_rules *nb_quant_rules_parse_yaml(nb_ctx *ctx, const char *name, const char *text, size_t len);
nb_quant_rules *nb_quant_rules_load_yaml(nb_ctx *ctx, const char *path);
void nb_quant_rules_destroy(nb_quant_rules *r); /* NULL ok */
int nb_quant_rules_count(const nb_quant_rules *r);
const nb_quant_rule *nb_quant_rules_at(const nb_quant_rules *r, int i);
/* The index of the first rule that matches module_path and applies to op
 * (a rule whose path matches but whose op_names lack op is skipped), or -1. */
int nb_quant_rules_match(const nb_quant_rules *r, const char *module_path, nb_quant_op op);
/* Whether rule i applies to op (it has no op_names, or op is one of them). */
bool nb_quant_rules_applies_to(const nb_quant_rules *r, int i, nb_quant_op op);

/* ---------------------------------------------------------------- PTQ */

/* In a quantized parameter tree a linear's f32 kernel "<m>/kernel"
 * [d_in, d_out] is replaced by the quantized tree of W = kernel^T
 * [N = d_out, K = d_in] under "<m>/kernel" (values, scales, zero_points) and
 * "<m>/kernel/quant", i64[6] = {qtype, k, tile, asymmetric, act, rule}:
 * the static layout, carried by the checkpoint as an ordinary array. */
typedef struct nb_quant_linear {
  nb_quant_layout layout;
  nb_quant_act act;
  int rule;
  float act_scale; /* int8_static: "<m>/kernel/act_scale" f32[1], NaN until calibrated */
  int64_t experts; /* a stacked (per-expert) kernel: E, its arrays [E, N, ...] and layout.n = E * N; 0: plain */
} nb_quant_linear;

/* Post-training quantization: a new tree with every rank-2 "<m>/kernel"
 * (op dot_general) and rank-3 stacked one [E, d_in, d_out] (op
 * stacked_dot_general: each expert quantized alone, the arrays with a
 * leading E) whose <m> and op a rule matches quantized by that rule;
 * everything else (embeddings, norms, biases, unmatched linears) shared
 * unchanged. An
 * int8_static linear also gets "<m>/kernel/act_scale" f32[1]: from a fixed
 * act_calibration, else NaN until a calibration pass (nb_quant_observer)
 * sets it; the hook refuses NaN. */
nb_tree *nb_quant_ptq(nb_ctx *ctx, const nb_tree *params, const nb_quant_rules *rules);
/* Whether "<module_path>/kernel" is quantized in t; *out filled when it
 * is. A malformed "quant" array or arrays that disagree with it are an
 * error naming the path (returns NB_ERR_FORMAT, *found false). */
nb_status nb_quant_tree_linear(nb_ctx *ctx, const nb_tree *t, const char *module_path, nb_quant_linear *out, bool *found);
/* The f32 tree: quantized kernels dequantized back to "<m>/kernel"
 * [d_in, d_out], the rest shared (the reference of the quantized model). */
nb_tree *nb_quant_dequantize_tree(nb_ctx *ctx, const nb_tree *t);
/* Puts w into t as the quantized kernel of module_path (replacing an f32
 * "<m>/kernel"); rule -1: none (e.g. read from a GGUF file). */
nb_status nb_quant_tree_set_linear(nb_tree *t, const char *module_path, const nb_quant_weight *w, nb_quant_act act, int rule);
/* Sets "<module_path>/kernel/act_scale" (f32[1]) of an int8_static linear. */
nb_status nb_quant_tree_set_act_scale(nb_tree *t, const char *module_path, float act_scale);
/* How many linears of t are quantized (an error gives -1). */
int64_t nb_quant_tree_count(nb_ctx *ctx, const nb_tree *t);

/* ---------------------------------------------------------------- QAT */
/* (docs/quant.md "QAT") */

/* kernel (f32[d_in, d_out], nabla's layout) fake-quantized by rule's weight
 * qtype, tile and calibration: dequant(quant(kernel)), computed by the host
 * codec (nb_quant_quantize, nb_quant_dequantize), so it is bit for bit the
 * weight PTQ of the same kernel by the same rule gives. Under grad, the
 * clipped straight-through estimator: the cotangent passes where the
 * element's code was not clamped (it lies within its tile's range, widened
 * by half a step for the integer types), 0 where it was. */
nb_val *nb_quant_fake_weight_at(nb_loc loc, nb_val *kernel, const nb_quant_rule *rule);
/* x (f32) rounded as act's W8A8 kernels round it (per row, or per 32
 * elements of the last axis), the gradient passing straight through;
 * NB_QUANT_ACT_NONE: x. */
nb_val *nb_quant_fake_act_at(nb_loc loc, nb_val *x, nb_quant_act act);
#define nb_quant_fake_weight(k, r) nb_quant_fake_weight_at(NB_HERE, k, r)
#define nb_quant_fake_act(x, a) nb_quant_fake_act_at(NB_HERE, x, a)

/* An nn linear hook for training (ud: the nb_quant_rules): a linear whose
 * module path a rule matches computes fake_act(x) @ fake_weight(kernel)
 * (+ bias) in f32; any other is nb_nn_linear_default. */
nb_val *nb_quant_qat_hook(void *rules, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);
/* How many "<m>/kernel" leaves of params (arrays or avals; rank 2:
 * dot_general, rank 3: stacked_dot_general) a rule matches. */
int64_t nb_quant_rules_count_linears(const nb_quant_rules *rules, const nb_tree *params);

/* ---------------------------------------------------------------- calibration */
/* (docs/quant.md "Static activation ranges") */

/* The inputs of the int8_static linears a rules list matches, observed
 * over calibration batches of the f32 model. */
typedef struct nb_quant_observer nb_quant_observer;
nb_quant_observer *nb_quant_observer_create(nb_ctx *ctx, const nb_quant_rules *rules);
void nb_quant_observer_destroy(nb_quant_observer *o); /* NULL ok */
/* An nn linear hook (ud: the observer) for tracing the f32 model: a linear
 * whose first matching rule is int8_static with a data calibration also
 * outputs "observe/<module>/{min,max,sumsq}" (f32 scalars over its input x)
 * from the graph being traced (no scanned layers: the outputs go to a->g),
 * then computes the plain linear. */
nb_val *nb_quant_observe_hook(void *observer, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);
/* Folds one run's outputs (the "observe/..." arrays) into the totals. */
nb_status nb_quant_observer_add(nb_quant_observer *o, const nb_tree *outputs);
/* What was observed of a module's inputs: elements, min, max, RMS (f64). */
typedef struct nb_quant_observed {
  int64_t count;
  double min, max, rms;
} nb_quant_observed;
bool nb_quant_observer_get(const nb_quant_observer *o, const char *module, nb_quant_observed *out);
/* Sets "<m>/kernel/act_scale" of every int8_static linear of the quantized
 * tree t from its rule's act_calibration and the observed inputs (an
 * observed max |x| of 0 gives scale 0: the codes are 0). A linear that
 * needs data and was never observed is an error naming it. */
nb_status nb_quant_observer_apply(const nb_quant_observer *o, nb_tree *t);

/* ---------------------------------------------------------------- running quantized */

/* The quantized linears of a tree (by module path), for the hook. */
typedef struct nb_quant_plan nb_quant_plan;
/* Reads every "<m>/kernel/quant" of t (host arrays), checking each against
 * its arrays; an error names the path. A tree without any gives an empty
 * plan (the hook then is the default linear). */
nb_quant_plan *nb_quant_plan_create(nb_ctx *ctx, const nb_tree *t);
void nb_quant_plan_destroy(nb_quant_plan *p); /* NULL ok */
int64_t nb_quant_plan_count(const nb_quant_plan *p);
/* An nn linear hook (ud: the plan): a quantized module becomes
 * nb_quant_matmul on "<m>/kernel/{values,scales,zero_points}" of a->params
 * (int8_static: nb_quant_matmul_static with the tree's act_scale; x
 * converted to f32 and y back to x's dtype), plus "<m>/bias" when present;
 * any other module is nb_nn_linear_default. */
nb_val *nb_quant_linear_hook(void *plan, nb_nn_apply *a, const char *path, nb_val *x, bool stacked);

/* ---------------------------------------------------------------- GGUF blocks */

/* A GGUF (ggml) Q8_0 or Q4_0 weight [n, k] (ggml_type 8 or 2: ggml's own
 * numbers; k a multiple of 32; data the n * k / 32 blocks, row-major) as a
 * symmetric 32-wide-tile quantized weight with the same dequantized values:
 *   Q8_0 {f16 d; i8 q[32]}       -> int8 g32: values q, scale f32(d)
 *   Q4_0 {f16 d; u8 q[16]}       -> int4 g32: element j of a block is the low
 *        nibble of q[j], element j + 16 the high one, w = (c - 8) d; nabla
 *        packs elements 2i, 2i + 1 into byte i: the codes are repacked, the
 *        scale is f32(d) (c = 0, which ggml allows, is -8 d here too)
 *   Q6_K (type 14; k a multiple of 256; 210-byte blocks of 256) -> int8 g16:
 *        values the 6-bit codes - 32, scale f32(d) * sc (exact)
 * Row r of the result is row row_of[r] of the file (NULL: r), for
 * permutations of whole rows. A Q8_0 code of -128 (outside int8's symmetric
 * range; ggml's quantizer never writes it) is refused naming the row. */
nb_status nb_quant_from_ggml(nb_ctx *ctx, int ggml_type, const void *data, int64_t n, int64_t k, const int64_t *row_of,
                             nb_quant_weight *out);

NB_END_DECLS
#endif /* NABLA_QUANT_H */
