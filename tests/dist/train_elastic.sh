#!/usr/bin/env bash
# Elastic restore: a checkpoint written by a 2-process data-parallel job
# resumes in 1 process (2 -> 1), and a 1-process checkpoint in a 2-process
# job (1 -> 2, rank 1 restoring from the job's checkpoint in the run dir),
# with the same global stream of batches: the losses and gradient norms of
# steps 1..8 equal those of an uninterrupted 1-process run bit for bit (the
# same global batch, grad_accum 2: 1 process == 2 processes, train_dp).
# steps changes between the parts; the schedule is constant so the learning
# rate does not depend on it. The same for the trainer's packed path
# (caller's examples packed into rows, as SFT: tests/dist/elastic_packed.c).
# Usage: train_elastic.sh NABLA_BIN ELASTIC_PACKED_BIN.
set -u
nabla=$1
packed=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "train_elastic: mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
. "$here/mpi_env.sh"
export NABLA_DIST_TIMEOUT=30 # a rank left waiting fails within seconds, not minutes
work=$(mktemp -d /tmp/nabla-train-elastic.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 batch_size=4 grad_accum=2 log_every=1 eval_every=0
        checkpoint_every=4 data.workers=0 model.dropout=0.1 schedule.kind=constant)
one() { "$nabla" train --run-dir "$work/$1" "${common[@]}" "steps=$2" >> "$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }; }
two() {
  timeout -k 5 200 "$nabla" launch -n 2 --threads-per-proc 1 -- "$nabla" train --run-dir "$work/$1" "${common[@]}" \
    "steps=$2" mesh.data=2 >> "$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }
}
one ref 8
two down 4; one down 8   # 2 -> 1
one up 4; two up 8       # 1 -> 2
# packed: the program runs RUN_DIR to STEPS (as 1 process, or 2 under launch)
pone() { "$packed" "$work/$1" "$2" >> "$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }; }
ptwo() {
  timeout -k 5 200 "$nabla" launch -n 2 --threads-per-proc 1 -- "$packed" "$work/$1" "$2" >> "$work/$1.log" 2>&1 ||
    { cat "$work/$1.log"; exit 1; }
}
pone pref 8
ptwo pdown 4; pone pdown 8
pone pup 4; ptwo pup 8
fail=0
grep -q "resumed from the checkpoint at step 4" "$work/down.log" || { echo "FAIL: 2 -> 1 did not resume at step 4"; fail=1; }
grep -q "^\[rank 0\] resumed from the checkpoint at step 4" "$work/up.log" || { echo "FAIL: 1 -> 2 did not resume at step 4"; fail=1; }
grep -q "^trained steps 5..8" "$work/pdown.log" || { echo "FAIL: packed 2 -> 1 did not resume at step 4"; fail=1; }
grep -q "^\[rank 0\] trained steps 5..8" "$work/pup.log" || { echo "FAIL: packed 1 -> 2 did not resume at step 4"; fail=1; }
for run in down up pdown pup; do
  ref=ref; [ "${run#p}" != "$run" ] && ref=pref
  steps=$(grep -o '"step":[0-9]*' "$work/$run/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
  [ "$steps" = "1 2 3 4 5 6 7 8 " ] || { echo "FAIL: $run: metrics.jsonl steps $steps"; fail=1; }
  for key in loss grad_norm; do
    a=$(grep -o "\"$key\":[^,}]*" "$work/$ref/metrics.jsonl")
    b=$(grep -o "\"$key\":[^,}]*" "$work/$run/metrics.jsonl")
    echo "$key, $run:" $b
    if [ -z "$a" ] || [ "$a" != "$b" ]; then echo "FAIL: $run: $key differs from the uninterrupted run:" $a; fail=1; fi
  done
done
[ $fail -eq 0 ] && echo "train_elastic: 2 -> 1 and 1 -> 2 processes at step 4 continue bit-identically (8 steps; windows and packed examples)"
exit $fail
