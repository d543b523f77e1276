#!/usr/bin/env bash
# Tensor-parallel training is the one-process training within f32
# reduction-order tolerance: 2 processes with mesh.tensor=2 (heads, kv heads
# and d_ff split; q/k/v and the MLP's input linears by columns, the output
# linears by rows with a psum over "tensor") and 1 process reading the same
# batch (4 rows, grad_accum 1) for 6 steps; once gpt2-tiny (biases, tied
# embedding, dropout on: residual dropout is drawn alike on both processes),
# once llama-tiny (4 heads over 2 kv heads: GQA, one kv head per process;
# SwiGLU; remat=block: the blocks' collectives redone in the backward
# pass). Losses, eval losses and gradient norms agree within TOL relative
# (1e-5, docs/dist.md derives it: each row-parallel output is a sum of two
# halves of its k-loop added once more, a reordering worth a few f32 ulps of
# each activation, which the steps carry on without growing: at most 1.4e-7
# measured in 6 steps). Then the checkpoint of the tensor-parallel run (one per job,
# each split leaf written as two blocks along the dim it is split) resumes
# on 2 processes bit for bit, and on 1 process (tensor 2 -> 1) within TOL
# of the uninterrupted run, and a 1-process checkpoint on 2 (1 -> tensor 2).
# Last, mesh.data x mesh.tensor other than the job's processes is refused.
# Usage: train_tp.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-train-tp.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
TOL=1e-5
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 batch_size=4 grad_accum=1 log_every=1
        data.workers=0 eval_every=3 eval_steps=1 checkpoint_keep=0)
fail=0
. "$here/compare.sh" # values KEY FILE, same KEY TOL A B
one() { local d=$1; shift; "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }; }
two() {
  local d=$1; shift
  NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/$d" "${common[@]}" "$@" mesh.tensor=2 \
    > "$work/$d.log" 2>&1 || { cat "$work/$d.log"; exit 1; }
}
compare() { # A B: losses, eval losses, gradient norms within TOL
  same loss $TOL "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  same eval_loss $TOL "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
  same grad_norm $TOL "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
}
gpt2=(model.preset=gpt2-tiny model.max_seq_len=32 model.dropout=0.1 optim.grad_clip=1 checkpoint_every=3)
one gpt2-one steps=6 "${gpt2[@]}"
two gpt2-two steps=6 "${gpt2[@]}"
compare gpt2-one gpt2-two
llama=(model.preset=llama-tiny model.max_seq_len=32 optim.grad_clip=1 checkpoint_every=3 remat=block)
one llama-one steps=6 "${llama[@]}"
two llama-two steps=6 "${llama[@]}"
compare llama-one llama-two
# the job's one checkpoint: wq's kernel [128, 128] as two blocks of 64 columns
step3=$work/gpt2-two/checkpoints/step_00000003
tr -d ' \t\n' < "$step3/manifest.json" | grep -q '"start":\[0,64\],"shape":\[128,64\]' ||
  { echo "FAIL: no block of 64 columns at column 64 in the tensor-parallel checkpoint"; fail=1; }
# tensor 2 -> 2 (bit for bit), 2 -> 1 and 1 -> 2 (within TOL) from step 3
resume() { # NAME FROM ONE|TWO
  cp -r "$work/$2" "$work/$1"; rm -rf "$work/$1/checkpoints/step_00000006"
  $3 "$1" steps=6 "${gpt2[@]}"
  grep -q "resumed from the checkpoint at step 3" "$work/$1.log" || { echo "FAIL: $1 did not resume at step 3"; fail=1; }
}
resume two-two gpt2-two two
same loss 0 "$work/gpt2-two/metrics.jsonl" "$work/two-two/metrics.jsonl"
for item in params opt_state; do
  "$nabla" ckpt export "$work/gpt2-two/checkpoints" 6 "$work/a-$item.st" --item $item > /dev/null &&
    "$nabla" ckpt export "$work/two-two/checkpoints" 6 "$work/b-$item.st" --item $item > /dev/null &&
    cmp -s "$work/a-$item.st" "$work/b-$item.st" || { echo "FAIL: the resumed tensor-parallel run's step-6 $item differs"; fail=1; }
done
resume two-one gpt2-two one
same loss $TOL "$work/gpt2-two/metrics.jsonl" "$work/two-one/metrics.jsonl"
resume one-two gpt2-one two
same loss $TOL "$work/gpt2-one/metrics.jsonl" "$work/one-two/metrics.jsonl"
# a mesh that is not the job's processes is refused, naming the axes
NABLA_MPI_TIMEOUT=60 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/bad" "${common[@]}" steps=1 mesh.tensor=2 \
  mesh.data=2 grad_accum=2 > "$work/bad.log" 2>&1 && { echo "FAIL: data=2 x tensor=2 on 2 processes ran"; fail=1; }
grep -q "data=2, fsdp=1, expert=1, tensor=2 do not multiply to the job's 2 processes" "$work/bad.log" ||
  { cat "$work/bad.log"; echo "FAIL: no error naming the mesh"; fail=1; }
[ $fail -eq 0 ] && echo "train_tp: 2 tensor-parallel processes == 1 process within $TOL (gpt2-tiny, llama-tiny GQA); checkpoints across meshes"
exit $fail
