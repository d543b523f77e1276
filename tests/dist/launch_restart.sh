#!/usr/bin/env bash
# `nabla launch --max-restarts`: a 2-process data-parallel training whose
# rank 1 is killed (kill -9, by the PID the launcher names) mid-run is
# restarted and resumes from the last committed checkpoint; its
# metrics.jsonl then holds every step once (the rows the killed job wrote
# after its last checkpoint are dropped and redone) with losses and
# gradient norms bit-identical to an uninterrupted run (1 process, the same
# global batch: docs/dist.md shows 1 process == 2 processes, dist/train_dp).
# Usage: launch_restart.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "launch_restart: mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
. "$here/mpi_env.sh"
export NABLA_DIST_TIMEOUT=20 # a rank left waiting for the dead one gives up within seconds
work=$(mktemp -d /tmp/nabla-launch-restart.XXXXXX)
launcher=
trap '[ -n "$launcher" ] && kill "$launcher" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 batch_size=4 grad_accum=2 steps=40 log_every=1
        eval_every=0 checkpoint_every=5 data.workers=0 model.dropout=0.1)
"$nabla" train --run-dir "$work/ref" "${common[@]}" > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; exit 1; }
timeout -k 5 280 "$nabla" launch -n 2 --threads-per-proc 1 --max-restarts 2 -- \
  "$nabla" train --run-dir "$work/two" "${common[@]}" mesh.data=2 > "$work/out" 2> "$work/err" &
launcher=$!
# rank 1's trainer, once rank 0 has logged step 7 (past the checkpoint at 5)
pid=
for _ in $(seq 1200); do
  pid=$(sed -n 's/^\[rank 1\] nabla launch: pid \([0-9]*\) runs .* (attempt 1)$/\1/p' "$work/err" | head -1)
  last=$(grep -o '"step":[0-9]*' "$work/two/metrics.jsonl" 2>/dev/null | tail -1 | cut -d: -f2)
  [ -n "$pid" ] && [ "${last:-0}" -ge 7 ] && break
  sleep 0.1
done
fail=0
if [ -z "$pid" ] || [ "${last:-0}" -lt 7 ]; then echo "FAIL: rank 1's pid or step 7 never came"; fail=1
else
  kill -9 "$pid" && echo "killed rank 1 (pid $pid) after step $last"
fi
wait "$launcher"; rc=$?
launcher=
[ $rc = 0 ] || { echo "FAIL: the launcher exited $rc"; fail=1; }
grep -q "nabla launch: the job failed (exit [0-9]*); restarting it (1 of 2 restarts)" "$work/err" || { echo "FAIL: no restart"; fail=1; }
grep -Eq '^\[rank 1\] nabla launch: pid [0-9]+ runs .* \(attempt 2\)$' "$work/err" || { echo "FAIL: no attempt 2"; fail=1; }
resumed=$(sed -n 's/^\[rank 0\] resumed from the checkpoint at step \([0-9]*\)$/\1/p' "$work/out" | tail -1)
echo "the restarted job resumed from step ${resumed:-?}"
[ -n "$resumed" ] && [ "$resumed" -ge 5 ] || { echo "FAIL: the restarted job did not resume from a checkpoint"; fail=1; }
steps=$(grep -o '"step":[0-9]*' "$work/two/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "$(seq -s ' ' 1 40) " ] || { echo "FAIL: metrics.jsonl steps: $steps"; fail=1; }
for key in loss grad_norm; do
  a=$(grep -o "\"$key\":[^,}]*" "$work/ref/metrics.jsonl")
  b=$(grep -o "\"$key\":[^,}]*" "$work/two/metrics.jsonl")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "FAIL: $key differs"; diff <(echo "$a") <(echo "$b") | head -6; fail=1
  fi
done
if [ $fail -ne 0 ]; then echo "--- launcher stderr"; tail -30 "$work/err"; echo "--- stdout"; tail -10 "$work/out"; fi
[ $fail -eq 0 ] && echo "launch_restart: rank 1 killed after step $last, restarted from step $resumed: 40 steps once each, bit-identical to the uninterrupted run"
exit $fail
