#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test; then the
# same suite again under AddressSanitizer + UndefinedBehaviorSanitizer (set
# NABLA_SKIP_SANITIZE=1 to skip that second pass). The Python peer tests run in
# a venv that scripts/peers.sh makes here (pip, network on the first run);
# NABLA_SKIP_PY_PEERS=1 skips both. Between the two passes, scripts/fuzz.sh
# check builds everything with clang (the fuzzers' compiler) and replays the
# fuzz corpora (NABLA_SKIP_CLANG=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/corpus.sh   # the default corpus: tests/cli/test_configs trains every shipped config on it
[ "${NABLA_SKIP_PY_PEERS:-0}" = 1 ] || scripts/peers.sh
jobs=$(nproc)
scripts/build.sh build
(cd build && ctest --output-on-failure -j "$jobs")
# the clang build of scripts/fuzz.sh, with the corpora replayed through it
[ "${NABLA_SKIP_CLANG:-0}" = 1 ] || scripts/fuzz.sh check
if [ "${NABLA_SKIP_SANITIZE:-0}" != 1 ]; then
  scripts/build.sh build-asan -DNABLA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  (cd build-asan && NABLA_SANITIZED=1 ctest --output-on-failure -j "$jobs")
fi
