#!/usr/bin/env bash
# Expert parallel on one machine: mixtral-tiny (8 experts, top-2), the same
# global batch (grad_accum 2) and capacity factor, as 1 process x 2 threads,
# 2 data-parallel processes x 1 thread (mesh.data=2) and 2 expert-parallel
# processes x 1 thread (mesh.expert=2: 4 experts each, tokens exchanged by
# all_to_all), interleaved ROUNDS times. Prints per run the median step time
# (the executable's, collectives included), tokens/s of the job from it, and
# the peak RSS of each process (/usr/bin/time's maximum resident set, set-up
# included: every process builds the whole model once before keeping its
# experts); then the medians over rounds and the ratios.
# Needs build/nabla, /usr/bin/time, mpirun and a text corpus
# (default data/corpus/kjv.txt, or CORPUS=file). Usage:
#   bench/dist_ep.sh [ROUNDS] [STEPS] [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; steps=${2:-10}; shift $(( $# < 2 ? $# : 2 ))
corpus=${CORPUS:-data/corpus/kjv.txt}
[ -f "$corpus" ] || { echo "no corpus at $corpus (scripts/corpus.sh, or CORPUS=file)"; exit 1; }
work=$(mktemp -d /tmp/nabla-bench-ep.XXXXXX)
trap 'rm -rf "$work"' EXIT
common=(configs/mixtral_tiny.yaml "data.train=$corpus" batch_size=8 data.seq_len=128 grad_accum=2
        model.capacity_factor=1.25 "steps=$steps" log_every=1 eval_every=0 checkpoint_every=0 data.workers=0 "$@")
tokens=$((8 * 128))
echo "date $(date -u +%FT%TZ), CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mixtral_tiny.yaml batch_size=8 data.seq_len=128 grad_accum=2 model.capacity_factor=1.25 ${*:-}, $steps steps"
step_ms() { sed -n 's/.*step \([0-9.]*\) ms (median).*/\1/p' "$1"; }
rss() { for f in "$@"; do sed -n 's/^maxrss_kb \([0-9]*\)/\1/p' "$f" | awk '{printf "%.0f ", $1/1024}'; done; }
state() { sed -n 's/^memory per process: params + optimizer state \([0-9.]*\) MiB.*/\1/p' "$1"; }
two() { # NAME MESH_KEY: 2 processes x 1 thread, each under /usr/bin/time
  tests/dist/mpirun.sh 2 sh -c 'exec /usr/bin/time -f "maxrss_kb %M" -o "$0.rank$OMPI_COMM_WORLD_RANK.rss" "$@" \
      > "$0.rank$OMPI_COMM_WORLD_RANK" 2>&1' "$work/$1.log" build/nabla train --run-dir "$work/$1" --threads 1 \
    "${common[@]}" "$2" || { cat "$work/$1.log.rank0"; exit 1; }
}
one=() dp=() ep=()
for r in $(seq "$rounds"); do
  /usr/bin/time -f "maxrss_kb %M" -o "$work/one$r.log.rss" build/nabla train --run-dir "$work/one$r" --threads 2 \
    "${common[@]}" > "$work/one$r.log" 2>&1 || { cat "$work/one$r.log"; exit 1; }
  two "dp$r" mesh.data=2
  two "ep$r" mesh.expert=2
  a=$(step_ms "$work/one$r.log"); b=$(step_ms "$work/dp$r.log.rank0"); c=$(step_ms "$work/ep$r.log.rank0")
  echo "round $r: step ms / peak RSS MiB per process / params + Adam state MiB per process:" \
    "1 process x 2 threads $a / $(rss "$work/one$r.log.rss")/ $(state "$work/one$r.log");" \
    "data=2 $b / $(rss "$work/dp$r.log.rank0.rss" "$work/dp$r.log.rank1.rss")/ $(state "$work/dp$r.log.rank0");" \
    "expert=2 $c / $(rss "$work/ep$r.log.rank0.rss" "$work/ep$r.log.rank1.rss")/ $(state "$work/ep$r.log.rank0")"
  one+=("$a"); dp+=("$b"); ep+=("$c")
done
echo "1 process:        $(grep -m1 '^model FLOPs/step' "$work/one1.log")"
echo "expert=2, rank 0: $(grep -m1 '^model FLOPs/step' "$work/ep1.log.rank0")"
echo "data=2, rank 0:   $(grep -m1 '^model FLOPs/step' "$work/dp1.log.rank0")"
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
m1=$(med "${one[@]}"); m2=$(med "${dp[@]}"); m3=$(med "${ep[@]}")
tps() { awk -v ms="$1" -v t="$tokens" 'BEGIN{printf "%.0f", t / (ms / 1000)}'; }
echo "median step: 1 process x 2 threads $m1 ms ($(tps "$m1") tokens/s), data=2 $m2 ms ($(tps "$m2") tokens/s)," \
  "expert=2 $m3 ms ($(tps "$m3") tokens/s); expert=2 / data=2 step time $(awk -v a="$m3" -v b="$m2" 'BEGIN{printf "%.2f", a/b}')," \
  "expert=2 / 1 process $(awk -v a="$m3" -v b="$m1" 'BEGIN{printf "%.2f", a/b}')"
