#!/usr/bin/env bash
# `nabla plan --chip-spec cpu:this` against measured runs on this machine: one
# config trained as 1 process x (CPUs) threads, as 2 processes x (CPUs/2)
# threads with mesh.data=2 and with mesh.fsdp=2 (the same global batch), each
# timed (the trainer's median step) and its peak RSS taken (/usr/bin/time, per
# process); then the plan's step time and memory per device for the same
# layouts, and the ratio plan / measured. ROUNDS interleaves the three runs.
# Needs build/nabla, mpirun, /usr/bin/time and a text corpus. Usage:
#   [ROUNDS=1] bench/plan_validate.sh CONFIG [STEPS] [key=value ...]
#   e.g. bench/plan_validate.sh configs/gpt2_tiny.yaml 20
#        bench/plan_validate.sh configs/gpt2_124m.yaml 3 batch_size=4 data.seq_len=64
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1; steps=${2:-20}; shift $(( $# < 2 ? $# : 2 ))
corpus=${CORPUS:-data/corpus/kjv.txt}
[ -f "$corpus" ] || { echo "no corpus at $corpus (scripts/corpus.sh, or CORPUS=file)"; exit 1; }
cpus=$(nproc); half=$(( cpus / 2 > 0 ? cpus / 2 : 1 ))
work=$(mktemp -d /tmp/nabla-bench-plan.XXXXXX)
trap 'rm -rf "$work"' EXIT
common=("$config" "data.train=$corpus" grad_accum=2 "steps=$steps" log_every=1 eval_every=0 checkpoint_every=0
        data.workers=0 "$@")
export NABLA_MPI_TIMEOUT=${NABLA_MPI_TIMEOUT:-1800}
echo "date $(date -u +%FT%TZ), CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cpus CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "config $config ${*:-}, grad_accum=2, $steps steps"
step_ms() { sed -n 's/.*step \([0-9.]*\) ms (median).*/\1/p' "$1"; }
rss_mib() { sed -n 's/^maxrss_kb \([0-9]*\)/\1/p' "$1" | awk '{printf "%.1f", $1/1024}'; }
planned() { sed -n 's/^memory per process: params + optimizer state \([0-9.]*\) MiB; step buffers planned \([0-9.]*\) MiB.*/\1 \2/p' "$1"; }
rank2() { # NAME MESH: 2 processes, each under /usr/bin/time
  tests/dist/mpirun.sh 2 sh -c 'exec /usr/bin/time -f "maxrss_kb %M" -o "$0.rank$OMPI_COMM_WORLD_RANK.rss" "$@" \
      > "$0.rank$OMPI_COMM_WORLD_RANK" 2>&1' "$work/$1-$r.log" build/nabla train --run-dir "$work/$1-$r" \
    --threads "$half" "${common[@]}" "$2" || { cat "$work/$1-$r.log.rank0"; exit 1; }
}
for r in $(seq "${ROUNDS:-1}"); do
  /usr/bin/time -f "maxrss_kb %M" -o "$work/one-$r.log.rank0.rss" build/nabla train --run-dir "$work/one-$r" \
    --threads "$cpus" "${common[@]}" > "$work/one-$r.log.rank0" 2>&1 || { cat "$work/one-$r.log.rank0"; exit 1; }
  rank2 dp mesh.data=2
  rank2 fsdp mesh.fsdp=2
  echo "round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
build/nabla plan "${common[@]}" --chips 1 --chip-spec cpu:this --json > "$work/plan1.json"
build/nabla plan "${common[@]}" --chips 2 --chip-spec cpu:this --json > "$work/plan2.json"
grep -m1 '"source"' "$work/plan2.json" | sed 's/^ *"source": *//'
printf '%-10s %12s %12s %7s | %14s %14s %12s %7s\n' layout "step ms" "plan ms" ratio "RSS MiB" "state+buf MiB" "plan MiB" ratio
for name in one dp fsdp; do
  steps_=() rss_=()
  for r in $(seq "${ROUNDS:-1}"); do steps_+=("$(step_ms "$work/$name-$r.log.rank0")"); rss_+=("$(rss_mib "$work/$name-$r.log.rank0.rss")"); done
  m=$(med "${steps_[@]}"); rs=$(med "${rss_[@]}")
  read -r st buf <<< "$(planned "$work/$name-1.log.rank0")"
  case $name in one) f=plan1.json; lay="1 1 1 1";; dp) f=plan2.json; lay="2 1 1 1";; fsdp) f=plan2.json; lay="1 2 1 1";; esac
  read -r ps pm <<< "$(/usr/bin/python3 - "$work/$f" $lay <<'EOF'
import json, sys
p = json.load(open(sys.argv[1])); d, f, t, e = map(int, sys.argv[2:6])
l = next(l for l in p["layouts"] if (l["data"], l["fsdp"], l["tensor"], l["expert"]) == (d, f, t, e))
print(l["step_s"] * 1e3, l["mem_bytes"] / 2**20)
EOF
)"
  printf '%-10s %12.1f %12.1f %7.2f | %14s %14.1f %12.1f %7.2f\n' "$name" "$m" "$ps" "$(awk -v a="$ps" -v b="$m" 'BEGIN{print a/b}')" \
    "$rs" "$(awk -v a="$st" -v b="$buf" 'BEGIN{print a+b}')" "$pm" "$(awk -v a="$pm" -v b="$st" -v c="$buf" 'BEGIN{print a/(b+c)}')"
done
