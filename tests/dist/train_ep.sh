#!/usr/bin/env bash
# Expert-parallel training is the one-process training: 2 processes with
# mesh.expert=2 (each holds 2 of the 4 routed experts; the MoE layers send
# the dispatch buffer's slots to the experts' process with all_to_all and
# back) and 1 process with the same global batch (4 rows, grad_accum 2, so
# each micro-batch is one process's rows) train a small Mixtral-style model.
# model.capacity_factor=2 = n_experts / top_k makes the capacity
# C = ceil(2 N 2 / 4) = N: no token is dropped on either side (the capacity
# is per process's tokens, as MaxText's, so a smaller factor would drop
# other tokens than one process does).
#
# What is equal, and why: the forward pass computes each token's expert
# outputs from the same rows and weights, and the loss, moe_lb and moe_z are
# summed over the micro-batches in the same order (psum in rank order), so
# step 1's loss is the same bits. The experts' kernel gradients are not:
# one process sums each micro-batch's C slots, then adds the two sums; a
# process of the job sums its experts' 2C slots (both processes' tokens) in
# one dot. Those sums round differently (a few ulp of f32), Adam turns that
# into parameter differences of about lr x 1e-7 per step, and the later
# losses, moe_lb and grad_norm may differ in their last digits: compared
# within 1e-6 (relative), 12x the largest difference seen here (8e-8, the
# loss of step 4 in one run; the same bits in another). A bug in the exchange
# or the gradient sums moves them by 1e-5 and more (docs/dist.md).
# Usage: train_ep.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-train-ep.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" model.preset=mixtral-tiny model.n_layers=2 model.d_model=32
        model.n_heads=2 model.n_kv_heads=2 model.moe_d_ff=48 model.n_experts=4 model.top_k=2
        model.capacity_factor=2 model.lb_loss_coef=0.01 model.z_loss_coef=0.001 data.seq_len=32 batch_size=4
        grad_accum=2 steps=4 log_every=1 checkpoint_every=4 data.workers=0 eval_every=2 eval_steps=1)
fail=0
. "$here/compare.sh" # values KEY FILE, same KEY TOL A B
"$nabla" train --run-dir "$work/one" "${common[@]}" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/two" "${common[@]}" mesh.expert=2 \
  > "$work/two.log" 2>&1 || { cat "$work/two.log"; exit 1; }
first() { grep '"step":1,"loss"' "$1" | grep -o "\"$2\":[^,}]*"; }
for k in loss moe_lb moe_z; do
  a=$(first "$work/one/metrics.jsonl" $k); b=$(first "$work/two/metrics.jsonl" $k)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "step 1 $a: the same bits"; else echo "FAIL: step 1: $a vs $b"; fail=1; fi
done
same loss 1e-6 "$work/one/metrics.jsonl" "$work/two/metrics.jsonl"
same moe_lb 1e-6 "$work/one/metrics.jsonl" "$work/two/metrics.jsonl"
same grad_norm 1e-6 "$work/one/metrics.jsonl" "$work/two/metrics.jsonl"
same eval_loss 1e-6 "$work/one/metrics.jsonl" "$work/two/metrics.jsonl"
[ $fail -eq 0 ] && echo "train_ep: 2 expert-parallel processes == 1 process (step 1 bit for bit; 4 steps within 1e-6)"
exit $fail
