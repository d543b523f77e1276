#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS (default 60) each, adding new
# inputs to tests/fuzz/corpus/<name>/: scripts/fuzz.sh [SECONDS] [NAME...]
# scripts/fuzz.sh check: only builds the fuzzers (clang) and replays the
# corpora through them (what the test suite does, so this build keeps compiling).
set -euo pipefail
cd "$(dirname "$0")/.."
# The library itself is built with coverage instrumentation (fuzzer-no-link):
# otherwise libFuzzer only sees the harness's own few edges.
CC=clang scripts/build.sh build-fuzz -DNABLA_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined"
if [ "${1:-}" = check ]; then
  (cd build-fuzz && ctest --output-on-failure -R '^fuzz/' -j "$(nproc)")
  exit
fi
secs=${1:-60}; shift || true
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do n=$(basename "$f" .c); names+=("${n#fuzz_}"); done
fi
for n in "${names[@]}"; do
  mkdir -p "tests/fuzz/corpus/$n"
  ./build-fuzz/"fuzz_$n" -max_total_time="$secs" -max_len=65536 "tests/fuzz/corpus/$n"
done
