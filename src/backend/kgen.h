/* The kernel body generator shared by the code-generating backends (kgen.c):
 * the C and CUDA generators frame these statements in their own loops or
 * threads. Private to src/backend/. */
#ifndef NABLA_BACKEND_KGEN_H
#define NABLA_BACKEND_KGEN_H

#include "compile/jit.h"

/* The state of one kernel's generation. The emitters name the outer loop
 * variables i0.., the reduced ones r0.., the kernel's arguments a0.. (typed
 * pointers the generator declares), node values v<n>. */
typedef struct nb_kgen {
  nb_jit_text *t;
  const nb_kernel *k;
  uint8_t *emitted; /* per node, for the current inner block */
  bool ok;          /* false: a node had no C form */
  bool strip;       /* COLUMN: the loops run over a strip of the last outer variable, j_ in [0, w_), i<ro-1> = s_ + b_ + j_ */
  uint8_t *arr;     /* COLUMN: per node, held in an array over the strip (nb_kgen__mark_strip_arrays); the other
                     * outer values are scalars of the last loop over the strip */
  uint8_t *inv;     /* per node: depends on no loop variable (emitted once, before the loops) */
  int *scratch;     /* stores + 4 * nodes + 1 ints, for store_groups */
  bool simd;        /* ROW: the innermost reduced loop is a simd reduction (reassociated) */
  const char *pragma; /* printed before the innermost R loop that open_inner opens next */
  /* printed before the innermost R loop of the stores (C: NBX_IVDEP, as
   * the outer loops: a kernel reads what it writes only at the element it
   * writes; without it gcc versions the loop for aliasing, gives up past
   * ten pointer pairs and leaves it scalar) */
  const char *store_pragma;
  /* ROW with one reduced loop: per node, the loop (phase 1.., nphases + 1
   * for the stores) that keeps it in a row array for the later loops, which
   * read it there instead of computing it again (nb_kgen__mark_row_arrays);
   * NULL: none */
  int *row_keep;
  int cur_loop; /* the loop being emitted, as row_keep counts them */
  /* CUDA: the threads of a block share one outer point; each walks the R
   * space strided by the block size, and every accumulator is combined
   * across the block (nbx_bred_<add|mul|max|min>_<d|f|i|u>, which the
   * generator defines) before its phase's outer values */
  bool block;
} nb_kgen;

/* The nbx_* functions the expressions call, as C source. */
extern const char nb_kgen__helpers[];

bool nb_kgen__is_float(nb_dtype t);
const char *nb_kgen__ctype(nb_dtype t); /* the C type a value is computed in */
const char *nb_kgen__stype(nb_dtype t); /* the C type it is stored in */
/* The dtype of kernel argument a (what its loads read or its stores write). */
nb_dtype nb_kgen__arg_dtype(const nb_kernel *k, int a);

/* Fills g->inv. */
void nb_kgen__mark_invariant(nb_kgen *g);
/* COLUMN: fills g->arr (after g->inv) and returns the bytes one point of
 * the strip takes in its arrays, *acc_bytes those of its accumulators. */
size_t nb_kgen__mark_strip_arrays(nb_kgen *g, size_t *acc_bytes);
/* ROW: fills g->row_keep (nnodes + 1 ints, after g->inv), or sets it NULL
 * when the kernel has no value that a later loop of a row would compute
 * again. At most max_bytes of row arrays per row. */
void nb_kgen__mark_row_arrays(nb_kgen *g, size_t max_bytes);
/* `const T v<i> = <expression>;` (g->ok false when node i has no C form). */
void nb_kgen__emit_node(nb_kgen *g, int i, int depth);
void nb_kgen__emit_store(nb_kgen *g, const nb_kstore *s, int depth);
/* Everything one outer point (or strip) computes: the phases, their
 * accumulators and the outer values after each, then the stores. The outer
 * variables and the invariant nodes must be defined before. */
void nb_kgen__emit_body(nb_kgen *g, int depth);

#endif
