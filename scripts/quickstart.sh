#!/usr/bin/env bash
# The main job: install dependencies, build, and run nabla's default task.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
scripts/corpus.sh   # the default English corpus (docs/corpus.md), for the trainer
./build/nabla train "$@"   # the default: a tiny GPT on the corpus (docs/train.md), in runs/default
# ... then sample from it (KV-cached, streaming; docs/generate.md)
./build/nabla generate --run-dir runs/default --prompt "And God said" --max-tokens 100 --seed 1
