#!/usr/bin/env bash
# One sharded checkpoint per FSDP job, restorable onto another mesh. A
# 1-process run of 6 steps (checkpoints at 2, 4, 6) is the reference. Then:
#  - 2 processes, mesh.fsdp=2, 4 steps: step 4 is one checkpoint, each array
#    in two shards (params.00000.bin and params.00001.bin; the 33-row position
#    table as 17 + 16 rows), whose params and Adam state are the reference's
#    step 4 bit for bit (`nabla ckpt export` of the whole arrays, cmp);
#  - that run resumed to step 6 by 1 process (fsdp 2 -> 1), by 2 data-parallel
#    processes (fsdp -> data), and the reference's step 4 resumed by 2 FSDP
#    processes (1 -> fsdp 2): each gives the reference's losses of steps 5-6
#    and its step-6 params and Adam state, bit for bit.
# Gradient clipping is off: under FSDP its norm is summed in another order
# (docs/dist.md). Usage: ckpt_fsdp.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-ckpt-fsdp.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 model.max_seq_len=33 batch_size=4 grad_accum=2
        log_every=1 eval_every=0 checkpoint_every=2 checkpoint_keep=0 data.workers=0 model.dropout=0.1
        optim.grad_clip=0)
fail=0
one() { local d=$1; shift; "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }; }
two() {
  local d=$1; shift
  NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 ||
    { cat "$work/$d.log"; exit 1; }
}
# same_state RUN STEP: RUN's checkpoint STEP holds the reference's values of that step, item by item
same_state() {
  for item in params opt_state; do
    "$nabla" ckpt export "$work/ref/checkpoints" "$2" "$work/ref-$item-$2.st" --item "$item" > /dev/null &&
      "$nabla" ckpt export "$work/$1/checkpoints" "$2" "$work/$1-$item-$2.st" --item "$item" > /dev/null ||
      { echo "FAIL: exporting step $2 of $1"; fail=1; continue; }
    if cmp -s "$work/ref-$item-$2.st" "$work/$1-$item-$2.st"; then echo "$1: step $2 $item == the reference's"
    else echo "FAIL: $1: step $2 $item differs from the reference's"; fail=1; fi
  done
}
# same_losses RUN: RUN's losses of steps 5 and 6 are the reference's
same_losses() {
  local a b
  a=$(grep -E '"step":(5|6),"loss"' "$work/ref/metrics.jsonl" | grep -o '"loss":[^,]*')
  b=$(grep -E '"step":(5|6),"loss"' "$work/$1/metrics.jsonl" | grep -o '"loss":[^,]*')
  echo "$1: losses of steps 5-6:" $b "(reference:" $a")"
  if [ -z "$a" ] || [ "$a" != "$b" ]; then echo "FAIL: $1: losses differ"; fail=1; fi
  grep -q "resumed from the checkpoint at step 4" "$work/$1.log" || { echo "FAIL: $1 did not resume at step 4"; fail=1; }
}
one ref steps=6
two fsdp steps=4 mesh.fsdp=2
step4=$work/fsdp/checkpoints/step_00000004
for f in params.00000.bin params.00001.bin opt_state.00000.bin opt_state.00001.bin manifest.json COMMIT; do
  [ -f "$step4/$f" ] || { echo "FAIL: $step4/$f missing"; fail=1; }
done
tr -d ' \t\n' < "$step4/manifest.json" | grep -q '"start":\[17,0\]' || { echo "FAIL: no shard of the position table starts at row 17"; fail=1; }
[ -d "$work/fsdp/rank1/checkpoints" ] && [ -n "$(ls "$work/fsdp/rank1/checkpoints")" ] &&
  { echo "FAIL: rank 1 wrote a checkpoint of its own"; fail=1; }
same_state fsdp 4
cp -r "$work/fsdp" "$work/to_one"; one to_one steps=6; same_losses to_one; same_state to_one 6
cp -r "$work/fsdp" "$work/to_data"; two to_data steps=6 mesh.data=2; same_losses to_data; same_state to_data 6
cp -r "$work/ref" "$work/to_fsdp"; rm -rf "$work/to_fsdp/checkpoints/step_00000006"
two to_fsdp steps=6 mesh.fsdp=2; same_losses to_fsdp; same_state to_fsdp 6
[ $fail -eq 0 ] && echo "ckpt_fsdp: one sharded checkpoint per job; fsdp 2 -> 1, fsdp -> data, 1 -> fsdp 2 bit for bit"
exit $fail
