#!/usr/bin/env bash
# Held-out perplexity of one trained model under every quantization nabla
# has (docs/quant.md "Perplexity"), and llama.cpp's on the same GGUF files.
# The model: `nabla train` of llama-tiny (Llama architecture, byte-level, d
# 128, 4 layers, GQA 4/2, d_ff 384) on the KJV corpus minus its last 2% of
# lines (bench/quant_qat.sh's split), 1000 steps. Each variant is a run dir
# from `nabla quantize --rules` (W8A8 static: calibrated with --calibrate on
# the training text, 16 batches of 8 windows) or a GGUF file from `nabla
# quantize --format gguf`, scored by `nabla eval` on the first WINDOWS
# windows of 128 + 1 held-out bytes; llama.cpp scores the same GGUF files on
# the same ids (bench/llamacpp_perplexity.py: llama-cpp-python's
# llama_decode, since the file has no vocabulary for llama-perplexity).
#   bench/quant_perplexity.sh [BUILD_DIR]   (WORK, THREADS, WINDOWS, PY: a Python with llama_cpp;
#     MODEL, STEPS, TRAIN_ARGS: another model, e.g. bench/quant_perplexity_large.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
nabla=$build/nabla
work=${WORK:-/tmp/nabla-bench-quant}
threads=${THREADS:-2}
windows=${WINDOWS:-200}
py=${PY:-/work/venv-llamacpp/bin/python}
model_name=${MODEL:-llama-tiny}
steps=${STEPS:-1000}
read -r -a train_args <<<"${TRAIN_ARGS:-model.preset=llama-tiny}"
mkdir -p "$work"
[ -s data/corpus/kjv.txt ] || scripts/corpus.sh
if [ ! -s "$work/heldout.txt" ]; then
  n=$(wc -l <data/corpus/kjv.txt)
  head -n $((n * 98 / 100)) data/corpus/kjv.txt >"$work/train.txt"
  tail -n +$((n * 98 / 100 + 1)) data/corpus/kjv.txt >"$work/heldout.txt"
fi
if ! grep -qs "\"step\":$steps," "$work/llama/metrics.jsonl"; then
  "$nabla" train --run-dir "$work/llama" --threads "$threads" data.train="$work/train.txt" data.eval="$work/heldout.txt" \
    "${train_args[@]}" steps="$steps" >"$work/llama.log"
fi
rules() { # name, the rule's fields
  printf "quant:\n  rules:\n    - {module_path: '.*', %s}\n" "$2" >"$work/ppl-$1.yaml"
}
rules int8_pc "weight_qtype: int8"
rules int8_g32 "weight_qtype: int8, tile_size: 32"
rules int4_g32 "weight_qtype: int4, tile_size: 32"
rules nf4_g64 "weight_qtype: nf4, tile_size: 64"
rules fp8_e4m3 "weight_qtype: fp8_e4m3"
rules w8a8_dyn "weight_qtype: int8, act_qtype: int8_dynamic"
rules w8a8_static "weight_qtype: int8, act_qtype: int8_static, act_calibration: absmax"
for v in int8_pc int8_g32 int4_g32 nf4_g64 fp8_e4m3 w8a8_dyn w8a8_static; do
  rm -rf "$work/llama-$v"
  calib=()
  [ $v = w8a8_static ] && calib=(--calibrate "$work/train.txt" --calib-batches 16)
  "$nabla" quantize "$work/llama" --rules "$work/ppl-$v.yaml" "${calib[@]}" -o "$work/llama-$v" 2>/dev/null
done
for t in f32 q8_0 q4_0 q4_k; do
  "$nabla" quantize "$work/llama" --format gguf --type $t -o "$work/llama-$t.gguf" 2>/dev/null
done
score() { # the nll and perplexity of eval's first line
  awk '/^nll/ {print $2, $5}' | tr -d ',;'
}
row() { # label, nabla's model, [nabla eval options]
  local label=$1 model=$2
  shift 2
  read -r nll ppl < <("$nabla" eval "$model" --data "$work/heldout.txt" --seq-len 128 --max-windows "$windows" --threads "$threads" "$@" | score)
  printf "| %s | %.4f | %.3f |" "$label" "$nll" "$ppl"
}
peer() { # gguf
  if [ -x "$py" ] && "$py" -c 'import llama_cpp' 2>/dev/null; then
    read -r nll ppl < <("$py" bench/llamacpp_perplexity.py "$1" "$work/heldout.txt" --seq-len 128 --max-windows "$windows" \
      --threads "$threads" 2>/dev/null | score)
    printf " %.4f | %.3f |\n" "$nll" "$ppl"
  else
    printf " (no llama_cpp) | |\n"
  fi
}
echo "Held-out perplexity, $model_name (nabla train, $steps steps), $windows windows of 128 bytes of held-out KJV"
echo "($(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $threads threads)"
echo
echo "| model | nabla nll | nabla ppl | llama.cpp nll | llama.cpp ppl |"
echo "|---|---|---|---|---|"
row "f32" "$work/llama"; echo " | |"
row "int8 per-channel, weight-only" "$work/llama-int8_pc"; echo " | |"
row "int8 g32, weight-only" "$work/llama-int8_g32"; echo " | |"
row "int4 g32, weight-only" "$work/llama-int4_g32"; echo " | |"
row "nf4 g64, weight-only" "$work/llama-nf4_g64"; echo " | |"
row "fp8 e4m3 per-channel, weight-only" "$work/llama-fp8_e4m3"; echo " | |"
row "W8A8 dynamic (int8 per-channel, per-token activations)" "$work/llama-w8a8_dyn"; echo " | |"
row "W8A8 static (int8 per-channel, calibrated absmax)" "$work/llama-w8a8_static"; echo " | |"
row "GGUF F32" "$work/llama-f32.gguf"; peer "$work/llama-f32.gguf"
row "GGUF Q8_0 (int8_block activations)" "$work/llama-q8_0.gguf"; peer "$work/llama-q8_0.gguf"
row "GGUF Q8_0 weight-only" "$work/llama-q8_0.gguf" --gguf-act none; echo " | |"
row "GGUF Q4_0 (int8_block activations)" "$work/llama-q4_0.gguf"; peer "$work/llama-q4_0.gguf"
row "GGUF Q4_K (rows not a multiple of 256 fall back to Q4_0)" "$work/llama-q4_k.gguf"; peer "$work/llama-q4_k.gguf"
