#!/usr/bin/env bash
# FSDP memory per process: one model, the same global batch, run as 1 process,
# as 2 data-parallel processes (mesh.data=2: the same rows per process as
# FSDP, whole parameters) and as 2 processes with mesh.fsdp=2, each with
# remat=none and remat=block. Prints per process: the peak RSS (/usr/bin/time's maximum
# resident set, set-up included: every process builds the whole model once
# before keeping its shard), the params + optimizer state it holds, and the
# step executable's planned buffer peak (intermediates after liveness reuse
# plus outputs not written in place); then the step time (median).
# Needs build/nabla, /usr/bin/time, mpirun and a text corpus. Usage:
#   [REMATS="none block"] bench/dist_fsdp_memory.sh CONFIG [STEPS] [extra key=value ...]
#   e.g. bench/dist_fsdp_memory.sh configs/gpt2_tiny.yaml 6
#        bench/dist_fsdp_memory.sh configs/gpt2_124m.yaml 2 batch_size=4 data.seq_len=128
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1; steps=${2:-6}; shift $(( $# < 2 ? $# : 2 ))
corpus=${CORPUS:-data/corpus/kjv.txt}
[ -f "$corpus" ] || { echo "no corpus at $corpus (scripts/corpus.sh, or CORPUS=file)"; exit 1; }
work=$(mktemp -d /tmp/nabla-bench-fsdp.XXXXXX)
trap 'rm -rf "$work"' EXIT
common=("$config" "data.train=$corpus" grad_accum=2 "steps=$steps" log_every=1 eval_every=0 checkpoint_every=0
        data.workers=0 --threads 1 "$@")
echo "date $(date -u +%FT%TZ), CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "config $config ${*:-}, grad_accum=2, 1 thread per process"
row() { # NAME LOGS...: the planned numbers of the first log, the max RSS of each
  local name=$1; shift
  local mem step rss
  mem=$(sed -n 's/^memory per process: params + optimizer state \([0-9.]*\) MiB; step buffers planned \([0-9.]*\) MiB (intermediates \([0-9.]*\) MiB)/\1 \2 \3/p' "$1")
  step=$(sed -n 's/.*step \([0-9.]*\) ms (median).*/\1/p' "$1")
  rss=$(for f in "$@"; do sed -n 's/^maxrss_kb \([0-9]*\)/\1/p' "$f.rss" | awk '{printf "%.1f ", $1/1024}'; done)
  read -r st pk ar <<< "$mem"
  printf '%-26s state %8.1f MiB  step buffers planned %8.1f MiB (intermediates %8.1f)  peak RSS per process %s MiB  step %s ms\n' \
    "$name" "$st" "$pk" "$ar" "$rss" "$step"
}
export NABLA_MPI_TIMEOUT=${NABLA_MPI_TIMEOUT:-1800} # a big model compiles for minutes on a loaded machine
for remat in ${REMATS:-none block}; do
  # /usr/bin/time around each rank: its own maximum resident set
  /usr/bin/time -f "maxrss_kb %M" -o "$work/one-$remat.log.rss" build/nabla train --run-dir "$work/one-$remat" \
    "${common[@]}" remat=$remat > "$work/one-$remat.log" 2>&1 || { cat "$work/one-$remat.log"; exit 1; }
  tests/dist/mpirun.sh 2 sh -c 'exec /usr/bin/time -f "maxrss_kb %M" -o "$0.rank$OMPI_COMM_WORLD_RANK.rss" "$@" \
      > "$0.rank$OMPI_COMM_WORLD_RANK" 2>&1' "$work/two-$remat.log" build/nabla train --run-dir "$work/two-$remat" \
    "${common[@]}" remat=$remat mesh.fsdp=2 || { cat "$work/two-$remat.log.rank0"; exit 1; }
  tests/dist/mpirun.sh 2 sh -c 'exec /usr/bin/time -f "maxrss_kb %M" -o "$0.rank$OMPI_COMM_WORLD_RANK.rss" "$@" \
      > "$0.rank$OMPI_COMM_WORLD_RANK" 2>&1' "$work/dp-$remat.log" build/nabla train --run-dir "$work/dp-$remat" \
    "${common[@]}" remat=$remat mesh.data=2 || { cat "$work/dp-$remat.log.rank0"; exit 1; }
  row "1 process, remat=$remat" "$work/one-$remat.log"
  row "data=2, remat=$remat" "$work/dp-$remat.log.rank0" "$work/dp-$remat.log.rank1"
  row "fsdp=2, remat=$remat" "$work/two-$remat.log.rank0" "$work/two-$remat.log.rank1"
done
