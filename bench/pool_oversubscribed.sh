#!/usr/bin/env bash
# Claim: on a machine that other processes load, the default thread count
# (all CPUs) decodes no slower than one thread (backend/cpu/pool.c backs off).
# Starts LOAD busy-loop processes of its own (default: one per CPU), then
# interleaves ROUNDS runs of bench_generate_decode at --threads 1 and at the
# default, for each build dir given (to compare two builds in one run), and
# prints each run's decode tokens/s and the medians. Stops its own load by PID.
#   bench/pool_oversubscribed.sh [BUILD_DIR ...]   (default: build)
#   env: LOAD (busy processes), ROUNDS (default 5), PRESET (default gpt2-tiny)
set -euo pipefail
cd "$(dirname "$0")/.."
builds=("$@"); [ ${#builds[@]} -gt 0 ] || builds=(build)
load=${LOAD:-$(nproc)} rounds=${ROUNDS:-5} preset=${PRESET:-gpt2-tiny}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for ((i = 0; i < load; i++)); do (while :; do :; done) & pids+=($!); done
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; $load busy processes of ours; load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A runs
for ((r = 0; r < rounds; r++)); do
  for b in "${builds[@]}"; do
    for t in 1 0; do
      args=(--reps 3 "$preset"); [ "$t" = 1 ] && args=(--threads 1 "${args[@]}")
      tok=$("$b/bench_generate_decode" "${args[@]}" | awk '/^RESULT/ {print $4}')
      runs["$b $t"]+="$tok "
      echo "round $r $b threads=$([ "$t" = 1 ] && echo 1 || echo default): decode $tok tok/s"
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for b in "${builds[@]}"; do
  one=$(echo "${runs["$b 1"]}" | median) def=$(echo "${runs["$b 0"]}" | median)
  echo "RESULT $b decode tok/s median: 1 thread $one, default $def, default/1 thread $(awk -v a="$def" -v b="$one" 'BEGIN {printf "%.2f", a / b}')"
done
