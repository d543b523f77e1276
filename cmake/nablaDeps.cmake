# The libraries libnabla links, as imported targets, listed in NABLA_DEPS.
# Included by the build (CMakeLists.txt) and by the installed
# nablaConfig.cmake, because nabla::nabla_static names them in its link
# interface. NABLA_WITH_OPENBLAS: ON requires OpenBLAS, OFF leaves it out,
# unset uses it when pkg-config finds it (the build's default).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc) # tokenizer normalizers (NFC, NFKC, ...)
# xxhash ships no pkg-config file on every distribution: an imported target
# keeps the found path out of the exported link interface.
find_library(XXHASH_LIB xxhash REQUIRED)
if(NOT TARGET nabla::xxhash)
  add_library(nabla::xxhash INTERFACE IMPORTED)
  set_target_properties(nabla::xxhash PROPERTIES INTERFACE_LINK_LIBRARIES "${XXHASH_LIB}")
endif()
if(NOT DEFINED NABLA_WITH_OPENBLAS)
  pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
  set(NABLA_WITH_OPENBLAS ${OPENBLAS_FOUND})
elseif(NABLA_WITH_OPENBLAS)
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
endif()

# MPI (Open MPI: libopenmpi-dev openmpi-bin) for the dist library's
# transport. NABLA_WITH_MPI: ON requires it, OFF leaves it out, unset uses it
# when found. Without it, dist's functions fail with a clear message and its
# multi-process tests are reported as skipped.
if(NOT DEFINED NABLA_WITH_MPI)
  find_package(MPI COMPONENTS C QUIET)
  set(NABLA_WITH_MPI ${MPI_C_FOUND})
elseif(NABLA_WITH_MPI)
  find_package(MPI COMPONENTS C REQUIRED)
endif()

set(NABLA_DEPS Threads::Threads m ${CMAKE_DL_LIBS} PkgConfig::ZSTD PkgConfig::PCRE2
    PkgConfig::CJSON PkgConfig::YAML PkgConfig::UTF8PROC nabla::xxhash)
if(NABLA_WITH_OPENBLAS)
  list(APPEND NABLA_DEPS PkgConfig::OPENBLAS)
endif()
if(NABLA_WITH_MPI)
  list(APPEND NABLA_DEPS MPI::MPI_C)
endif()
