#!/usr/bin/env bash
# One sharded checkpoint per expert-parallel job, restorable onto another
# mesh with the same values. A 1-process run (ref) and a 2-process
# mesh.expert=2 run (ep) of the same small Mixtral-style model train 6 steps,
# checkpoints at 2, 4, 6. Then:
#  - ep's step 4 is one checkpoint whose expert kernels are two shards (rows
#    0-1 and 2-3 of the 4 experts) and whose other arrays are written once;
#  - ep resumed from its step 4 (expert=2 -> expert=2) ends with ep's
#    step-6 params and Adam state, bit for bit;
#  - 2 -> 1 and 1 -> 2: ep's step 4 resumed by 1 process, and ref's step 4
#    by 2 expert-parallel processes, each for one step at optim.lr=1e-30
#    (an update below half an ulp of every parameter: the step keeps the
#    parameters' bits) and saved: the saved params are the restored step's
#    bit for bit, so the restore put every row where it belongs (the
#    one-process training is not bit-identical to the expert-parallel one,
#    docs/dist.md, so a later step is no reference);
#  - those two resumes' first losses (the forward pass on the restored
#    parameters) equal the loss of step 5 of the run they came from.
# Gradient clipping is off: its norm is summed in another order across the
# shards. Usage: ckpt_ep.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-ckpt-ep.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" model.preset=mixtral-tiny model.n_layers=2 model.d_model=32
        model.n_heads=2 model.n_kv_heads=2 model.moe_d_ff=48 model.n_experts=4 model.top_k=2
        model.capacity_factor=2 data.seq_len=32 batch_size=4 grad_accum=2 log_every=1 eval_every=0
        checkpoint_every=2 checkpoint_keep=0 data.workers=0 optim.grad_clip=0)
still=(steps=5 optim.lr=1e-30 optim.weight_decay=0 checkpoint_every=1)
fail=0
one() { local d=$1; shift; "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }; }
two() {
  local d=$1; shift
  NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" mesh.expert=2 \
    > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }
}
# same ITEM RUN_A STEP_A RUN_B STEP_B: the item's whole arrays are the same bytes
same() {
  "$nabla" ckpt export "$work/$2/checkpoints" "$3" "$work/a.st" --item "$1" > /dev/null &&
    "$nabla" ckpt export "$work/$4/checkpoints" "$5" "$work/b.st" --item "$1" > /dev/null ||
    { echo "FAIL: exporting $1 of $2 step $3 or $4 step $5"; fail=1; return; }
  if cmp -s "$work/a.st" "$work/b.st"; then echo "$4 step $5 $1 == $2 step $3"
  else echo "FAIL: $4 step $5 $1 differs from $2 step $3"; fail=1; fi
}
loss_of() { grep "\"step\":$2,\"loss\"" "$work/$1/metrics.jsonl" | grep -o '"loss":[^,]*'; }
resumed_at_4() { grep -q "resumed from the checkpoint at step 4" "$work/$1.log" || { echo "FAIL: $1 did not resume at step 4"; fail=1; }; }
one ref steps=6
two ep steps=6
step4=$work/ep/checkpoints/step_00000004
for f in params.00000.bin params.00001.bin opt_state.00000.bin opt_state.00001.bin manifest.json COMMIT; do
  [ -f "$step4/$f" ] || { echo "FAIL: $step4/$f missing"; fail=1; }
done
tr -d ' \t\n' < "$step4/manifest.json" | grep -q '"start":\[2,0,0\]' ||
  { echo "FAIL: no expert shard starts at expert 2"; fail=1; }
[ -n "$(ls -A "$work/ep/rank1/checkpoints" 2>/dev/null)" ] && { echo "FAIL: rank 1 wrote a checkpoint of its own"; fail=1; }
cp -r "$work/ep" "$work/ep_ep"; rm -rf "$work/ep_ep/checkpoints/step_00000006"
two ep_ep steps=6; resumed_at_4 ep_ep; same params ep 6 ep_ep 6; same opt_state ep 6 ep_ep 6
cp -r "$work/ep" "$work/to_one"; rm -rf "$work/to_one/checkpoints/step_00000006"
one to_one "${still[@]}"; resumed_at_4 to_one; same params ep 4 to_one 5
cp -r "$work/ref" "$work/to_ep"; rm -rf "$work/to_ep/checkpoints/step_00000006"
two to_ep "${still[@]}"; resumed_at_4 to_ep; same params ref 4 to_ep 5
for pair in "ep to_one" "ref to_ep"; do
  set -- $pair
  a=$(loss_of "$1" 5); b=$(loss_of "$2" 5)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "$2: step 5 $b == $1's"; else echo "FAIL: $2: step 5 $b vs $1's $a"; fail=1; fi
done
[ $fail -eq 0 ] && echo "ckpt_ep: one sharded checkpoint per job; expert 2 -> 2, 2 -> 1, 1 -> 2 restore the values bit for bit"
exit $fail
