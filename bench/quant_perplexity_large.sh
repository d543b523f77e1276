#!/usr/bin/env bash
# The perplexity table (bench/quant_perplexity.sh) for a larger model:
# a Llama-architecture byte-level model of d 256, 4 layers, 8 heads / 4 KV
# heads, d_ff 768 (every row a multiple of 256, so GGUF Q4_K is real Q4_K,
# not the Q4_0 fallback), untied lm_head, 3.3M parameters (4x llama-tiny),
# trained by `nabla train` for 250 steps of 16 x 128 bytes of KJV (18 min
# at 4.3 s/step on 2 cores under a load average of 15). Same held-out split,
# quantizations, GGUF files and llama.cpp peer as the small table.
#   bench/quant_perplexity_large.sh [BUILD_DIR]   (WORK, THREADS, WINDOWS, PY as quant_perplexity.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-/tmp/nabla-bench-quant-large}
export MODEL="llama d256 x4 (d_ff 768)" STEPS=${STEPS:-250}
export TRAIN_ARGS="model.preset=llama-tiny model.d_model=256 model.n_layers=4 model.n_heads=8 model.n_kv_heads=4 \
model.d_ff=768 eval_every=250 checkpoint_every=250"
exec bench/quant_perplexity.sh "$@"
