#!/usr/bin/env bash
# Overlap of collectives with computation, 2 processes on this machine
# (docs/dist.md, "Compiled steps"). Two parts:
#  1. bench_dist_overlap: a psum of ELEMS f32 independent of an N^3 matmul,
#     async vs sync vs each alone, interleaved inside one job; once with the
#     runtime polling MPI between steps (default) and once without
#     (NABLA_DIST_PROGRESS=none).
#  2. gpt2-tiny data parallel (mesh.data=2) and FSDP (mesh.fsdp=2), 16 x 128
#     tokens per step, grad_accum 2, 1 thread per process: async (default) vs
#     sync (NABLA_JIT_DISABLE=async), interleaved ROUNDS times. Prints rank 0's
#     median step time and, from a trace of steps 11-15, the ms per step in
#     collective steps: the waits and starts (async) or the collectives' own
#     steps (sync).
# Usage: bench/dist_overlap.sh [ROUNDS (3)] [STEPS (20)] [ELEMS (4194304)] [N (768)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-20}
elems=${3:-4194304}
n=${4:-768}
. tests/dist/mpi_env.sh
run2() { timeout 600 mpirun -np 2 --bind-to none "$@"; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## 1. psum vs matmul"
for mode in poll none; do
  echo "progress: $mode"
  NABLA_DIST_PROGRESS=$mode run2 build/bench_dist_overlap "$elems" "$n" 15 | sed 's/^/  /'
done
echo "## 2. gpt2-tiny, 2 processes"
work=$(mktemp -d /tmp/nabla-bench-overlap.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat docs/design.md docs/compiler.md docs/dist.md docs/train.md > "$work/text.txt"
common=(configs/gpt2_tiny.yaml "data.train=$work/text.txt" --threads 1 batch_size=16 grad_accum=2 "steps=$steps" log_every=10
        eval_every=0 checkpoint_every=0 data.workers=0 profile.steps=11-15)
# collective ms per traced step: async waits, async starts, sync collective steps
coll() {
  python3 - "$1" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
w = s = y = 0.0
for e in ev:
    if e.get("ph") != "X": continue
    name = e.get("name", "")
    op = name.split(" ")[0]
    if e.get("cat") == "collective" and name.split(" ")[1] == "wait": w += e["dur"]
    elif e.get("cat") == "collective": s += e["dur"]
    elif e.get("cat") == "eval" and op in ("psum", "pmax", "all_gather", "psum_scatter"): y += e["dur"]
print("%.1f %.1f %.1f" % (w / 5e3, s / 5e3, y / 5e3))
EOF
}
parse() { sed -n 's/.*step \([0-9.]*\) ms (median), loop iteration \([0-9.]*\) ms.*/\1/p' "$1"; }
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
for layout in data fsdp; do
  declare -a st_async=() st_sync=() w_async=() s_async=() c_sync=()
  for r in $(seq "$rounds"); do
    for mode in async sync; do
      dir="$work/$layout-$mode-$r"
      dis=""; [ $mode = sync ] && dis=async
      NABLA_JIT_DISABLE=$dis run2 build/nabla train --run-dir "$dir" "${common[@]}" "mesh.$layout=2" > "$dir.log" 2>&1 ||
        { tail -20 "$dir.log"; exit 1; }
      step=$(parse "$dir.log"); read -r w s y < <(coll "$dir/profile/trace.json")
      echo "$layout round $r $mode: step $step ms; per step in collectives: wait $w ms, start $s ms, synchronous $y ms"
      if [ $mode = async ]; then st_async+=("$step"); w_async+=("$w"); s_async+=("$s"); else st_sync+=("$step"); c_sync+=("$y"); fi
    done
  done
  a=$(med "${st_async[@]}"); b=$(med "${st_sync[@]}")
  echo "$layout: median step async $a ms (waits $(med "${w_async[@]}") ms + starts $(med "${s_async[@]}") ms per step)," \
       "sync $b ms (collective steps $(med "${c_sync[@]}") ms per step), async/sync $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')"
done
