#!/usr/bin/env bash
# Sharding rules (mesh.rules) in 2-process training, against the built-in
# layouts and one process reading the same batches (4 rows, grad_accum 2,
# dropout on, clipping off as in train_fsdp.sh):
#  (a) rules equal to FSDP's built-in ones ('.*' -> [fsdp]) give the
#      built-in run's losses, eval losses, gradient norms and step-4 state,
#      bit for bit (the same step);
#  (b) FSDP rules that keep the embeddings whole on every process
#      ('.*embed.*' -> []; their gradients psummed over fsdp), once more with
#      the kernels split by columns ('.*/kernel' -> [null, fsdp]: gathered
#      along dim 1): the 1-process losses, eval losses and step-4 state bit
#      for bit (gradient norms within 1e-6: a sum per shard, then over
#      processes);
#  (c) tensor rules that split only the MLP (the attention whole on both
#      processes): gpt2-tiny's losses, eval losses and gradient norms within
#      train_tp.sh's 1e-5 of one process (docs/dist.md derives it).
# Checkpoints: (b)'s are one per job (the embeddings written whole by
# process 0, the kernels as column blocks): the step-2 checkpoint resumes
# on 1 process (rules -> 1) and under the built-in FSDP rules (rules ->
# fsdp), and the 1-process one under (b)'s column rules (1 -> rules): each
# continues with the uninterrupted 1-process run's losses and step-4 state,
# bit for bit. (c)'s step-3 checkpoint resumes with its rules bit for bit.
# Usage: train_rules.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-train-rules.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 log_every=1 data.workers=0 checkpoint_keep=0 eval_steps=1)
fsdp=(model.max_seq_len=33 batch_size=4 grad_accum=2 steps=4 checkpoint_every=2 eval_every=2 model.dropout=0.1
      optim.grad_clip=0)
embed_rules="mesh.rules=[['.*embed.*', []], ['.*', [fsdp]]]"
cols_rules="mesh.rules=[['.*embed.*', []], ['.*/kernel', [null, fsdp]], ['.*', [fsdp]]]"
fail=0
. "$here/compare.sh" # values KEY FILE, same KEY TOL A B
one() { local d=$1; shift; "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }; }
two() {
  local d=$1; shift
  NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 ||
    { cat "$work/$d.log"; exit 1; }
}
state_same() { # A B STEP: the step's params and opt_state, byte for byte
  for item in params opt_state; do
    "$nabla" ckpt export "$work/$1/checkpoints" "$3" "$work/$1-$3-$item.st" --item $item > /dev/null &&
      "$nabla" ckpt export "$work/$2/checkpoints" "$3" "$work/$2-$3-$item.st" --item $item > /dev/null &&
      cmp -s "$work/$1-$3-$item.st" "$work/$2-$3-$item.st" || { echo "FAIL: step-$3 $item of $1 and $2 differ"; fail=1; }
  done
}
bits() { # A B: losses and eval losses bit for bit, gradient norms within TOL
  same loss 0 "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  same eval_loss 0 "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  same grad_norm "$3" "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
}
resumed() { grep -q "resumed from the checkpoint at step $2" "$work/$1.log" || { echo "FAIL: $1 did not resume at step $2"; fail=1; }; }

one one "${fsdp[@]}"
# (a) the built-in FSDP layout written as a rule
two builtin "${fsdp[@]}" mesh.fsdp=2
two explicit "${fsdp[@]}" mesh.fsdp=2 "mesh.rules=[['.*', [fsdp]]]"
bits builtin explicit 0
state_same builtin explicit 4
grep -q 'rules: \[\[".\*", \[fsdp\]\]\]' "$work/explicit/config.yaml" || { echo "FAIL: config.yaml lacks the rules"; fail=1; }
# (b) the embeddings whole; then the kernels by columns too
two embed "${fsdp[@]}" mesh.fsdp=2 "$embed_rules"
bits one embed 1e-6
state_same one embed 4
two cols "${fsdp[@]}" mesh.fsdp=2 "$cols_rules"
bits one cols 1e-6
state_same one cols 4
# its checkpoint: the table whole (one shard from process 0), wq's kernel as two blocks of 64 columns
manifest=$(tr -d ' \t\n' < "$work/cols/checkpoints/step_00000002/manifest.json")
echo "$manifest" | grep -q '"path":"embed/embedding","dtype":"f32","shape":\[256,128\],"nbytes":131072,"shards":\[{[^]]*"start":\[0,0\],"shape":\[256,128\][^]]*}\]' ||
  { echo "FAIL: the embedding table is not one whole shard in the checkpoint"; fail=1; }
echo "$manifest" | grep -q '"start":\[0,64\],"shape":\[128,64\]' || { echo "FAIL: no block of 64 columns at column 64"; fail=1; }
# checkpoints across layouts, from step 2
restart() { cp -r "$work/$2" "$work/$1"; rm -rf "$work/$1/checkpoints/step_00000004"; }
restart rules-one cols
one rules-one "${fsdp[@]}"
resumed rules-one 2
bits one rules-one 1e-6
state_same one rules-one 4
restart rules-fsdp embed
two rules-fsdp "${fsdp[@]}" mesh.fsdp=2
resumed rules-fsdp 2
bits one rules-fsdp 1e-6
state_same one rules-fsdp 4
restart one-rules one
two one-rules "${fsdp[@]}" mesh.fsdp=2 "$cols_rules"
resumed one-rules 2
bits one one-rules 1e-6
state_same one one-rules 4

# (c) tensor parallel, the MLP alone
TOL=1e-5
tp=(model.preset=gpt2-tiny model.max_seq_len=32 model.dropout=0.1 optim.grad_clip=1 batch_size=4 grad_accum=1 steps=6
    checkpoint_every=3 eval_every=3)
mlp_rules="mesh.rules=[['.*/mlp/wi/kernel', [null, tensor]], ['.*/mlp/wi/bias', [tensor]], ['.*/mlp/wo/kernel', [tensor]]]"
one tone "${tp[@]}"
two tmlp "${tp[@]}" mesh.tensor=2 "$mlp_rules"
same loss $TOL "$work/tone/metrics.jsonl" "$work/tmlp/metrics.jsonl"
same eval_loss $TOL "$work/tone/metrics.jsonl" "$work/tmlp/metrics.jsonl"
same grad_norm $TOL "$work/tone/metrics.jsonl" "$work/tmlp/metrics.jsonl"
grep -q "tensor parallel over mesh.tensor" "$work/tmlp.log" || { echo "FAIL: not a tensor-parallel run"; fail=1; }
manifest=$(tr -d ' \t\n' < "$work/tmlp/checkpoints/step_00000003/manifest.json")
echo "$manifest" | grep -q '"path":"layers/0/mlp/wi/kernel","dtype":"f32","shape":\[128,512\],"nbytes":262144,"shards":\[{[^]]*"start":\[0,0\],"shape":\[128,256\]' ||
  { echo "FAIL: the MLP's wi kernel is not split by columns"; fail=1; }
echo "$manifest" | grep -q '"path":"layers/0/attn/wq/kernel","dtype":"f32","shape":\[128,128\],"nbytes":65536,"shards":\[{[^]]*"start":\[0,0\],"shape":\[128,128\][^]]*}\]' ||
  { echo "FAIL: the attention's wq kernel is not whole"; fail=1; }
cp -r "$work/tmlp" "$work/tmlp-again"; rm -rf "$work/tmlp-again/checkpoints/step_00000006"
two tmlp-again "${tp[@]}" mesh.tensor=2 "$mlp_rules"
resumed tmlp-again 3
same loss 0 "$work/tmlp/metrics.jsonl" "$work/tmlp-again/metrics.jsonl"
state_same tmlp tmlp-again 6
[ $fail -eq 0 ] && echo "train_rules: explicit rules == the built-in FSDP run; whole embeddings and column-split kernels == 1 process bit for bit, checkpoints across layouts; an MLP-only tensor split within $TOL"
exit $fail
