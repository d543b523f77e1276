#!/usr/bin/env bash
# Tensor parallel against data parallel and threads on one machine: gpt2-tiny,
# the same global batch (16 x 128, grad_accum 2) as 1 process x 2 threads,
# 2 processes x 1 thread with mesh.data=2 and 2 processes x 1 thread with
# mesh.tensor=2 (every process runs the whole batch on half the heads and
# half of d_ff, 2 psums per layer forward and 2 in backward), interleaved
# ROUNDS times. Prints per run the median step time (the executable's,
# collectives included), tokens/s of the job and each process's peak RSS
# (/usr/bin/time, set-up included), then the medians over rounds.
# Needs build/nabla, /usr/bin/time, mpirun and a text corpus. Usage:
#   [CORPUS=file] bench/dist_tp.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-30}
corpus=${CORPUS:-data/corpus/kjv.txt}
[ -f "$corpus" ] || { echo "no corpus at $corpus (scripts/corpus.sh, or CORPUS=file)"; exit 1; }
work=$(mktemp -d /tmp/nabla-bench-tp.XXXXXX)
trap 'rm -rf "$work"' EXIT
B=16 T=128
common=(configs/gpt2_tiny.yaml "data.train=$corpus" batch_size=$B data.seq_len=$T grad_accum=2 "steps=$steps" log_every=10
        eval_every=0 checkpoint_every=0 data.workers=0)
echo "date $(date -u +%FT%TZ), CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
step_ms() { sed -n 's/.*step \([0-9.]*\) ms (median).*/\1/p' "$1"; }
rss() { for f in "$@"; do sed -n 's/^maxrss_kb \([0-9]*\)/\1/p' "$f" | awk '{printf "%.0f ", $1/1024}'; done; }
two() { # NAME KEY=VALUE: 2 processes x 1 thread, each under /usr/bin/time
  tests/dist/mpirun.sh 2 sh -c 'exec /usr/bin/time -f "maxrss_kb %M" -o "$0.rank$OMPI_COMM_WORLD_RANK.rss" "$@" \
      > "$0.rank$OMPI_COMM_WORLD_RANK" 2>&1' "$work/$1.log" build/nabla train --run-dir "$work/$1" --threads 1 \
    "${common[@]}" "$2" || { cat "$work/$1.log.rank0"; exit 1; }
}
one=() dp=() tp=()
for r in $(seq "$rounds"); do
  /usr/bin/time -f "maxrss_kb %M" -o "$work/one$r.log.rss" build/nabla train --run-dir "$work/one$r" --threads 2 \
    "${common[@]}" > "$work/one$r.log" 2>&1 || { cat "$work/one$r.log"; exit 1; }
  two dp$r mesh.data=2
  two tp$r mesh.tensor=2
  a=$(step_ms "$work/one$r.log"); b=$(step_ms "$work/dp$r.log.rank0"); c=$(step_ms "$work/tp$r.log.rank0")
  echo "round $r: step ms: 1 process x 2 threads $a (RSS $(rss "$work/one$r.log.rss")MiB); data=2 $b (RSS $(rss "$work/dp$r.log".rank{0,1}.rss)MiB); tensor=2 $c (RSS $(rss "$work/tp$r.log".rank{0,1}.rss)MiB)"
  one+=("$a"); dp+=("$b"); tp+=("$c")
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
m1=$(med "${one[@]}"); m2=$(med "${dp[@]}"); m3=$(med "${tp[@]}")
tok() { awk -v ms="$1" -v n=$((B * T)) 'BEGIN{printf "%.0f", n / (ms / 1000)}'; }
echo "median step (tokens/s): 1 process x 2 threads $m1 ms ($(tok "$m1")), data=2 $m2 ms ($(tok "$m2")), tensor=2 $m3 ms ($(tok "$m3"))"
echo "ratios to 1 process: data=2 $(awk -v a="$m2" -v b="$m1" 'BEGIN{printf "%.2f", a/b}'), tensor=2 $(awk -v a="$m3" -v b="$m1" 'BEGIN{printf "%.2f", a/b}')"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
