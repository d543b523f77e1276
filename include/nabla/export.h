/* Which symbols libnabla exports. The library is built with
 * -fvisibility=hidden, so only what the public headers declare is visible to
 * programs linking libnabla.so; internal cross-file helpers (nb__*,
 * nb_<lib>__*) stay inside it.
 *
 * Each public header brackets its declarations with NB_BEGIN_DECLS /
 * NB_END_DECLS: C linkage for C++ callers, and default visibility for every
 * declaration in between, so a function or variable added to a public header
 * is exported without further marking. The definition in src/ inherits the
 * visibility of that declaration; a single declaration elsewhere can be
 * marked NB_API. Consumers see the same declarations (default visibility is
 * right for them too, also when they build with -fvisibility=hidden), and
 * the static library is unaffected: visibility only matters to a shared
 * object's dynamic symbol table. */
#ifndef NABLA_EXPORT_H
#define NABLA_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define NB_API __attribute__((visibility("default")))
#define NB_VISIBILITY_PUSH_DEFAULT _Pragma("GCC visibility push(default)")
#define NB_VISIBILITY_POP _Pragma("GCC visibility pop")
#else
#define NB_API
#define NB_VISIBILITY_PUSH_DEFAULT
#define NB_VISIBILITY_POP
#endif

#ifdef __cplusplus
#define NB_BEGIN_DECLS NB_VISIBILITY_PUSH_DEFAULT extern "C" {
#define NB_END_DECLS } NB_VISIBILITY_POP
#else
#define NB_BEGIN_DECLS NB_VISIBILITY_PUSH_DEFAULT
#define NB_END_DECLS NB_VISIBILITY_POP
#endif

#endif
