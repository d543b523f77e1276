#!/usr/bin/env bash
# QAT against PTQ on gpt2-tiny (docs/quant.md "QAT"): two runs of the default
# `nabla train` (gpt2-tiny, byte-level, the KJV corpus minus its last 2% of
# lines, 1000 steps, seed 0), one plain f32 and one with quant.rules (int4
# g32 fake quantization on every linear, weights only); both converted with
# `nabla quantize --rules` (the same int4 g32 rule) and scored by `nabla
# eval` on the held-out 2%. Prints a markdown table for bench/RESULTS.md.
#   bench/quant_qat.sh [BUILD_DIR]      (WORK=dir to keep the runs; THREADS=n)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
nabla=$build/nabla
work=${WORK:-/tmp/nabla-bench-quant}
threads=${THREADS:-2}
mkdir -p "$work"
[ -s data/corpus/kjv.txt ] || scripts/corpus.sh
# the same split for every quant benchmark: the last 2% of lines held out
if [ ! -s "$work/heldout.txt" ]; then
  n=$(wc -l <data/corpus/kjv.txt)
  head -n $((n * 98 / 100)) data/corpus/kjv.txt >"$work/train.txt"
  tail -n +$((n * 98 / 100 + 1)) data/corpus/kjv.txt >"$work/heldout.txt"
fi
cat >"$work/int4_g32.yaml" <<'EOF'
quant:
  rules:
    - {module_path: '.*', weight_qtype: int4, tile_size: 32}
EOF
train() { # name, extra overrides...
  local name=$1
  shift
  [ -s "$work/$name/metrics.jsonl" ] && grep -q '"step":1000' "$work/$name/metrics.jsonl" && return 0
  "$nabla" train --run-dir "$work/$name" --threads "$threads" data.train="$work/train.txt" data.eval="$work/heldout.txt" \
    model.preset=gpt2-tiny steps=1000 "$@" >"$work/$name.log"
}
evaluate() { # model -> "nll ppl"
  "$nabla" eval "$1" --data "$work/heldout.txt" --threads "$threads" | awk '/^nll/ {print $2, $5}' | tr -d ',;'
}
train f32
train qat quant.rules="$work/int4_g32.yaml"
for r in f32 qat; do
  rm -rf "$work/$r-int4"
  "$nabla" quantize "$work/$r" --rules "$work/int4_g32.yaml" -o "$work/$r-int4" 2>/dev/null
done
read -r f_nll f_ppl < <(evaluate "$work/f32")
read -r p_nll p_ppl < <(evaluate "$work/f32-int4")
read -r q_nll q_ppl < <(evaluate "$work/qat")
read -r qp_nll qp_ppl < <(evaluate "$work/qat-int4")
echo "QAT vs PTQ, gpt2-tiny, 1000 steps each, held-out KJV ($(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $threads threads)"
echo
echo "| model | held-out nll (nats/token) | perplexity | vs f32 |"
echo "|---|---|---|---|"
awk -v a="$f_nll" -v b="$p_nll" -v c="$q_nll" -v d="$qp_nll" -v pa="$f_ppl" -v pb="$p_ppl" -v pc="$q_ppl" -v pd="$qp_ppl" 'BEGIN {
  printf "| f32 (plain training) | %.4f | %.3f | |\n", a, pa
  printf "| PTQ int4 g32 of the f32 model | %.4f | %.3f | %+.4f |\n", b, pb, b - a
  printf "| QAT model, f32 weights | %.4f | %.3f | %+.4f |\n", c, pc, c - a
  printf "| QAT model converted to int4 g32 | %.4f | %.3f | %+.4f |\n", d, pd, d - a
}'
