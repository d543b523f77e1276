#!/usr/bin/env bash
# The main job: install dependencies, build, and run nabla's default task.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
./build/example_mlp "$@"
