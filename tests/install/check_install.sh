#!/usr/bin/env bash
# Installs nabla into a temporary prefix and builds examples/mlp.c against it
# the ways a C project would, then runs each program:
#   1. pkg-config: libnabla.so (nabla), libnabla.a (nabla-static); a C++ program
#      built with -fvisibility=hidden against libnabla.so;
#   2. find_package(nabla): nabla::nabla and nabla::nabla_static;
#   3. add_subdirectory(nabla) from a parent project (built from source).
# It also checks the installed tree: headers, the versioned SONAME, and that
# libnabla.so exports exactly the functions the public headers declare.
#   check_install.sh SOURCE_DIR BUILD_DIR C_COMPILER CXX_COMPILER [EXTRA_FLAGS]
# EXTRA_FLAGS (compile and link) carries the sanitizer flags of a sanitized
# build to the consumers. Needs no network; removes its temporary files.
set -euo pipefail
src=$1 build=$2 cc=$3 cxx=$4 flags=${5:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nabla-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "check_install: $*" >&2; exit 1; }
quiet() { "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; fail "failed: $*"; }; }

quiet cmake --install "$build" --prefix "$prefix"
version=$(sed -n 's/^#define NB_VERSION_STRING "\(.*\)"$/\1/p' "$src/include/nabla/core.h")
IFS=. read -r major minor _ <<<"$version"
soversion=$major; [ "$major" = 0 ] && soversion=0.$minor

# the installed tree
for f in bin/nabla lib/libnabla.a "lib/libnabla.so.$version" lib/pkgconfig/nabla.pc lib/pkgconfig/nabla-static.pc \
         lib/cmake/nabla/nablaConfig.cmake lib/cmake/nabla/nablaConfigVersion.cmake; do
  [ -e "$prefix/$f" ] || fail "missing $prefix/$f"
done
for h in "$src"/include/nabla/*.h; do
  cmp -s "$h" "$prefix/include/nabla/$(basename "$h")" || fail "header $(basename "$h") not installed"
done
soname=$(readelf -d "$prefix/lib/libnabla.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libnabla.so.$soversion" ] || fail "SONAME is '$soname', expected libnabla.so.$soversion"
[ -L "$prefix/lib/libnabla.so.$soversion" ] || fail "no $soname link"
"$prefix/bin/nabla" --version | grep -q "^nabla $version\$" || fail "installed nabla --version is not $version"

# exports: every function the public headers declare, nothing else
"$cc" -E -P -I"$prefix/include" "$prefix/include/nabla/nabla.h" \
  | grep -oP '\bnb_\w+(?=\s*\((?!\s*\*))' | sort -u >"$tmp/declared"
nm -D --defined-only "$prefix/lib/libnabla.so" | awk '{print $3}' | sort -u >"$tmp/exported"
if ! cmp -s "$tmp/declared" "$tmp/exported"; then
  echo "declared in include/nabla but not exported:" >&2; comm -23 "$tmp/declared" "$tmp/exported" | head >&2
  echo "exported but not in the public headers ($(comm -13 "$tmp/declared" "$tmp/exported" | wc -l)):" >&2
  comm -13 "$tmp/declared" "$tmp/exported" | head >&2
  fail "libnabla.so exports differ from the public API"
fi

run() { # run NAME: the program trains a few steps and must exit 0
  quiet "$@" 20
}
# 1. pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion nabla)" = "$version" ] || fail "pkg-config --modversion nabla is not $version"
# shellcheck disable=SC2046,SC2086
quiet "$cc" $flags -o "$tmp/pc_shared" "$src/examples/mlp.c" $(pkg-config --cflags --libs nabla) -lm \
  -Wl,-rpath,"$prefix/lib"
# shellcheck disable=SC2046,SC2086
quiet "$cc" $flags -o "$tmp/pc_static" "$src/examples/mlp.c" $(pkg-config --cflags --libs nabla-static) -lm
# nabla.pc's private part names what libnabla.a needs
static_libs=" $(pkg-config --static --libs nabla) "
for l in -lzstd -lpcre2-8 -lcjson -lyaml -lutf8proc -lxxhash; do
  [[ $static_libs == *" $l "* ]] || fail "pkg-config --static --libs nabla lacks $l"
done
# the headers' C linkage and default visibility hold for C++ callers that
# hide their own symbols
cat >"$tmp/uses_nabla.cc" <<'CXX'
#include "nabla/nabla.h"
int main() {
  nb_ctx *ctx = nb_ctx_create();
  if (!ctx) return 1;
  nb_ctx_destroy(ctx);
  return 0;
}
CXX
# shellcheck disable=SC2046,SC2086
quiet "$cxx" $flags -fvisibility=hidden -o "$tmp/pc_cxx" "$tmp/uses_nabla.cc" $(pkg-config --cflags --libs nabla) \
  -Wl,-rpath,"$prefix/lib"
quiet "$tmp/pc_cxx"
readelf -d "$tmp/pc_shared" | grep -q "NEEDED.*\[$soname\]" || fail "pkg-config build does not use $soname"
readelf -d "$tmp/pc_static" | grep -q "NEEDED.*libnabla" && fail "pkg-config nabla-static build needs libnabla.so"
run "$tmp/pc_shared"
run "$tmp/pc_static"

# 2. find_package and 3. add_subdirectory, one consumer project
cmake_consumer() { # cmake_consumer DIR [cmake args...]
  local dir=$1; shift
  quiet cmake -S "$src/tests/install/consumer" -B "$dir" -DEXAMPLES="$src/examples" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" -DCMAKE_BUILD_TYPE=Release "$@"
  quiet cmake --build "$dir" -j 2 --target mlp_shared mlp_static
  run "$dir/mlp_shared"
  run "$dir/mlp_static"
}
cmake_consumer "$tmp/find_package" -DCMAKE_PREFIX_PATH="$prefix" -DNABLA_EXPECT_VERSION="$version"
readelf -d "$tmp/find_package/mlp_shared" | grep -q "NEEDED.*\[$soname\]" || fail "find_package build does not use $soname"
cmake_consumer "$tmp/add_subdirectory" -DNABLA_SOURCE="$src"
echo "check_install: pkg-config, find_package and add_subdirectory builds of examples/mlp.c ran"
