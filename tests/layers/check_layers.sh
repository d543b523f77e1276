#!/usr/bin/env bash
# Proves that the layering rules of docs/design.md can fail the build:
#   1. includes: cmake/check_layers.cmake passes on a copy of the tree, then
#      fails, naming the file and the rule, on each violation put into it;
#   2. links: the fixture project (tests/layers/fixture) builds, and fails at
#      its per-library --no-undefined link when a lower library calls a higher
#      one through a hand-written declaration (no include to scan), although
#      the product that links every library together still would.
#   check_layers.sh SOURCE_DIR LAYERS_TABLE C_COMPILER
set -euo pipefail
src=$1 table=$2 cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nabla-layers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_layers: $*" >&2; exit 1; }

tree=$tmp/tree
mkdir -p "$tree"
cp -r "$src/src" "$src/include" "$src/tools" "$tree/"
scan() { cmake -DROOT="$tree" -DTABLE="$table" -P "$src/cmake/check_layers.cmake" >"$tmp/out" 2>&1; }
scan || { cat "$tmp/out" >&2; fail "the unmodified tree does not pass"; }

# violate FILE LINE EXPECTED: appends LINE to FILE, expects the scan to fail
# with EXPECTED in its report, then restores FILE
violate() {
  local file=$1 line=$2 want=$3
  cp "$tree/$file" "$tmp/saved"
  printf '%s\n' "$line" >>"$tree/$file"
  if scan; then fail "$file with '$line' passed the scan"; fi
  grep -qF -- "$want" "$tmp/out" || { cat "$tmp/out" >&2; fail "$file with '$line': report lacks '$want'"; }
  cp "$tmp/saved" "$tree/$file"
}
# allowed FILE LINE: the scan still passes with LINE appended to FILE
allowed() {
  cp "$tree/$1" "$tmp/saved"
  printf '%s\n' "$2" >>"$tree/$1"
  scan || { cat "$tmp/out" >&2; fail "$1 with '$2' fails the scan"; }
  cp "$tmp/saved" "$tree/$1"
}
allowed src/optim/tx.c '#include "core/ir.h"'        # the IR contract, shared by core
allowed src/prof/tb.c '#include "nabla/compile.h"'   # prof may use compile
allowed src/train/run.c '#include "nabla/nn.h"'      # through models
violate src/nn/apply.c '#include "nabla/train.h"' \
  'src/nn/apply.c (nn) includes "nabla/train.h" of train, which nn may not use'
violate src/compile/fuse.c '#include "core/internal.h"' \
  'src/compile/fuse.c (compile) includes "core/internal.h", a private header of core'
violate src/runtime/exe.c '#include "../train/internal.h"' \
  'src/runtime/exe.c (compile) includes "../train/internal.h" of train'
violate include/nabla/nn.h '#include "nabla/optim.h"' \
  'include/nabla/nn.h (nn) includes "nabla/optim.h" of optim, which nn may not use'
violate src/data/elem.c '#include "ckpt/internal.h"' \
  'src/data/elem.c (data) includes "ckpt/internal.h" of ckpt, which data may not use'
echo '/* a transformation-private header */' >"$tree/src/transform/private.h"
violate src/core/prims/call.c '#include "transform/private.h"' \
  'src/core/prims/call.c includes "transform/private.h": src/core/ may not include src/transform/'
scan || { cat "$tmp/out" >&2; fail "the restored tree does not pass"; }

# links
build() { cmake -S "$src/tests/layers/fixture" -B "$tmp/fx" -DNABLA_SOURCE_DIR="$src" -DCMAKE_C_COMPILER="$cc" "$@" \
            >"$tmp/out" 2>&1 && cmake --build "$tmp/fx" >>"$tmp/out" 2>&1; }
build -DFIXTURE_VIOLATE=OFF || { cat "$tmp/out" >&2; fail "the fixture does not build"; }
cmake --build "$tmp/fx" --target fixture_all >/dev/null 2>&1 || fail "the fixture's product does not link"
if build -DFIXTURE_VIOLATE=ON; then fail "the fixture built although low calls high"; fi
grep -q "undefined reference to .fixture_high" "$tmp/out" || { cat "$tmp/out" >&2; fail "no undefined fixture_high in the report"; }
grep -q "nabla_layercheck_low" "$tmp/out" || { cat "$tmp/out" >&2; fail "the failing link is not nabla_layercheck_low"; }
cmake --build "$tmp/fx" --target fixture_all >/dev/null 2>&1 || fail "the fixture's product no longer links (it should: only the layer check fails)"
echo "check_layers: ok"
