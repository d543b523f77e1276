/* The elementwise binary ops: the one list of them. nabla/core.h declares
 * nb_<op>_at(loc, a, b) for each (this file is part of it, not included on
 * its own); src/core/prims/prims.def makes each a primitive of the binary
 * family, whose rows (interpreter, C expression) and derivatives are in
 * src/core/prims/binary.c. Adding a binary op: a name here, its macro below,
 * its row and derivative there, and its test rows
 * (docs/adding-a-primitive.md). */
#ifndef NABLA_BINARY_H
#define NABLA_BINARY_H

#define NB_BINARY_OPS(X) \
  X(add) X(sub) X(mul) X(div) X(rem) X(pow) X(max) X(min) X(atan2) \
  X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(and) X(or) X(xor)

/* Location-capturing forms, called as nb_add(a, b). */
#define nb_add(a, b) nb_add_at(NB_HERE, a, b)
#define nb_sub(a, b) nb_sub_at(NB_HERE, a, b)
#define nb_mul(a, b) nb_mul_at(NB_HERE, a, b)
#define nb_div(a, b) nb_div_at(NB_HERE, a, b)
#define nb_rem(a, b) nb_rem_at(NB_HERE, a, b)
#define nb_pow(a, b) nb_pow_at(NB_HERE, a, b)
#define nb_max(a, b) nb_max_at(NB_HERE, a, b)
#define nb_min(a, b) nb_min_at(NB_HERE, a, b)
#define nb_atan2(a, b) nb_atan2_at(NB_HERE, a, b)
#define nb_eq(a, b) nb_eq_at(NB_HERE, a, b)
#define nb_ne(a, b) nb_ne_at(NB_HERE, a, b)
#define nb_lt(a, b) nb_lt_at(NB_HERE, a, b)
#define nb_le(a, b) nb_le_at(NB_HERE, a, b)
#define nb_gt(a, b) nb_gt_at(NB_HERE, a, b)
#define nb_ge(a, b) nb_ge_at(NB_HERE, a, b)
#define nb_and(a, b) nb_and_at(NB_HERE, a, b)
#define nb_or(a, b) nb_or_at(NB_HERE, a, b)
#define nb_xor(a, b) nb_xor_at(NB_HERE, a, b)

#endif
