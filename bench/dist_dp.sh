#!/usr/bin/env bash
# Data parallel on one machine: gpt2-tiny, the same global batch (16 x 128,
# grad_accum 2) as 2 processes x 1 thread (mpirun, mesh.data=2) and as
# 1 process x 2 threads, interleaved ROUNDS times. Prints each run's median
# step time (the executable's, collectives included) and loop iteration,
# then the medians over rounds and the ratio. Needs build/nabla and a text
# corpus (default data/corpus/kjv.txt). Usage:
#   bench/dist_dp.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-60}
corpus=${CORPUS:-data/corpus/kjv.txt}
[ -f "$corpus" ] || { echo "no corpus at $corpus (scripts/corpus.sh, or CORPUS=file)"; exit 1; }
work=$(mktemp -d /tmp/nabla-bench-dp.XXXXXX)
trap 'rm -rf "$work"' EXIT
common=(configs/gpt2_tiny.yaml "data.train=$corpus" batch_size=16 grad_accum=2 "steps=$steps" log_every=10
        eval_every=0 checkpoint_every=0 data.workers=0)
parse() { sed -n 's/.*step \([0-9.]*\) ms (median), loop iteration \([0-9.]*\) ms.*/\1 \2/p' "$1"; }
one=() two=()
for r in $(seq "$rounds"); do
  build/nabla train --run-dir "$work/one$r" --threads 2 "${common[@]}" > "$work/one$r.log" 2>&1
  tests/dist/mpirun.sh 2 build/nabla train --run-dir "$work/two$r" --threads 1 "${common[@]}" mesh.data=2 \
    > "$work/two$r.log" 2>&1
  a=$(parse "$work/one$r.log"); b=$(parse "$work/two$r.log")
  echo "round $r: 1 process x 2 threads: step/iteration ms $a; 2 processes x 1 thread: $b"
  one+=("${a%% *}"); two+=("${b%% *}")
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
m1=$(med "${one[@]}"); m2=$(med "${two[@]}")
echo "median step: 1 process x 2 threads $m1 ms, 2 processes x 1 thread $m2 ms, ratio (2p/1p) $(awk -v a="$m2" -v b="$m1" 'BEGIN{printf "%.2f", a/b}')"
