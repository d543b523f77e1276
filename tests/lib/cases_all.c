/* The list of primitive-table families: one line per tests/lib/cases_<family>.c.
 * Both the interpreter table test and the jit table test read it. */
#include "primcheck.h"

const nb_prim_case *nb_cases_core(size_t *n);
const nb_prim_case *nb_cases_call(size_t *n);
const nb_prim_case *nb_cases_slicing(size_t *n);
const nb_prim_case *nb_cases_dynamic(size_t *n);
const nb_prim_case *nb_cases_cumulative(size_t *n);
const nb_prim_case *nb_cases_dot(size_t *n);
const nb_prim_case *nb_cases_conv(size_t *n);
const nb_prim_case *nb_cases_gather(size_t *n);
const nb_prim_case *nb_cases_sort(size_t *n);
const nb_prim_case *nb_cases_random(size_t *n);
const nb_prim_case *nb_cases_custom_call(size_t *n);
const nb_prim_case *nb_cases_control(size_t *n);
const nb_prim_case *nb_cases_collective(size_t *n);

static const nb_case_list_fn families[] = {
    nb_cases_core,  nb_cases_call, nb_cases_slicing, nb_cases_dynamic, nb_cases_cumulative, nb_cases_dot,
    nb_cases_conv,  nb_cases_gather, nb_cases_sort, nb_cases_random,  nb_cases_custom_call, nb_cases_control,
    nb_cases_collective,
};

const nb_case_list_fn *nb_test_case_families(size_t *n) {
  *n = sizeof families / sizeof families[0];
  return families;
}
