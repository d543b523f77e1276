#!/usr/bin/env bash
# Decode on llama.cpp's own GGUF file, two builds of nabla (A and B: before
# and after a change) beside llama.cpp, interleaved in every round: per round
# and thread count, A's generate-gguf side of bench/decode_vs_llamacpp.py,
# then B's llama, generate (nabla's own run dir) and generate-gguf sides (one
# round each, so load drifts hit all). Prints each side's table row (decode
# tok/s, tokens per CPU-second) and B's greedy-id agreement with llama.cpp.
#
#   bench/decode_gguf_ab.sh A_BUILD B_BUILD ROUNDS THREADS QUANT [decode_vs_llamacpp.py args...]
#   bench/decode_gguf_ab.sh /work/main/build build 3 1,2 q4_0 --act int8_block
#
# PEER_PYTHON (default /opt/peers/bin/python) has llama-cpp-python, gguf, numpy, safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 rounds=$3 threads=$4 quant=$5
shift 5
py=${PEER_PYTHON:-/opt/peers/bin/python}
common=(--rounds 1 --tokens 128 --quant "$quant" "$@")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; A=$a B=$b"
for r in $(seq 1 "$rounds"); do
  for T in ${threads//,/ }; do
    echo "== round $r T=$T $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$py" bench/decode_vs_llamacpp.py --build "$a" --threads "$T" --sides generate-gguf "${common[@]}" | grep -E '^\| [0-9]' | sed 's/^/A /'
    "$py" bench/decode_vs_llamacpp.py --build "$b" --threads "$T" --sides llama,generate,generate-gguf "${common[@]}" |
      grep -E '^\| [0-9]|greedy ids' | sed 's/^/B /'
  done
done
