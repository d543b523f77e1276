#!/usr/bin/env bash
# FSDP training is the one-process training: 2 processes with mesh.fsdp=2
# (parameters and Adam state sharded along their leading dim, gathered per
# layer, gradients psum_scatter'ed in rank order) and 1 process with the same
# global batch (4 rows, grad_accum 2) give the same loss and eval loss at
# every step, bit for bit. model.max_seq_len=33 makes the position table's
# 33 rows split as 17 + 16 (a padded shard). The gradient norm is a sum over
# each process's shards then over the processes, another order than one
# process's: it is compared within 1e-6 (relative). A second pair runs with
# remat=block (the gathers redone in the backward pass) and gradient clipping
# on (the clip scale comes from that norm): losses within 1e-6.
# Usage: train_fsdp.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-train-fsdp.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 model.max_seq_len=33 batch_size=4 grad_accum=2
        steps=4 log_every=1 checkpoint_every=4 data.workers=0 model.dropout=0.1)
fail=0
. "$here/compare.sh" # values KEY FILE, same KEY TOL A B
pair() { # NAME ARGS...: one process, then 2 processes with mesh.fsdp=2
  local name=$1; shift
  "$nabla" train --run-dir "$work/$name-one" "${common[@]}" "$@" > "$work/$name-one.log" 2>&1 ||
    { cat "$work/$name-one.log"; exit 1; }
  NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/$name-two" "${common[@]}" "$@" mesh.fsdp=2 \
    > "$work/$name-two.log" 2>&1 || { cat "$work/$name-two.log"; exit 1; }
}
pair plain optim.grad_clip=0 eval_every=2 eval_steps=1
same loss 0 "$work/plain-one/metrics.jsonl" "$work/plain-two/metrics.jsonl"
same eval_loss 0 "$work/plain-one/metrics.jsonl" "$work/plain-two/metrics.jsonl"
same grad_norm 1e-6 "$work/plain-one/metrics.jsonl" "$work/plain-two/metrics.jsonl"
pair remat remat=block eval_every=0
same loss 1e-6 "$work/remat-one/metrics.jsonl" "$work/remat-two/metrics.jsonl"
[ $fail -eq 0 ] && echo "train_fsdp: 2 FSDP processes == 1 process (4 steps: losses bit for bit; with clipping within 1e-6)"
exit $fail
