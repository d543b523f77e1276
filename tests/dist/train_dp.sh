#!/usr/bin/env bash
# Data-parallel training is the one-process training, bit for bit: the same
# global batch (4 rows, grad_accum 2) as 2 processes (mesh.data=2, one
# micro-batch each, gradients psum'd in rank order) and as 1 process (two
# micro-batches added in order) give the same loss and gradient norm at every
# step and the same final parameters. Usage: train_dp.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nabla-train-dp.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$here"/../../docs/design.md "$here"/../../docs/compiler.md > "$work/text.txt"
common=(--threads 1 "data.train=$work/text.txt" data.seq_len=32 batch_size=4 grad_accum=2 steps=4 log_every=1
        eval_every=0 checkpoint_every=4 data.workers=0 model.dropout=0.1)
"$nabla" train --run-dir "$work/one" "${common[@]}" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
NABLA_MPI_TIMEOUT=200 "$here/mpirun.sh" 2 "$nabla" train --run-dir "$work/two" "${common[@]}" mesh.data=2 \
  > "$work/two.log" 2>&1 || { cat "$work/two.log"; exit 1; }
fail=0
for key in loss grad_norm; do
  a=$(grep -o "\"$key\":[^,}]*" "$work/one/metrics.jsonl")
  b=$(grep -o "\"$key\":[^,}]*" "$work/two/metrics.jsonl")
  echo "$key, 1 process:  " $a
  echo "$key, 2 processes:" $b
  if [ -z "$a" ] || [ "$a" != "$b" ]; then echo "FAIL: $key differs"; fail=1; fi
done
# the parameters of the final checkpoint, file by file: the job's one
# checkpoint (rank 0 writes the replicated state; rank 1 keeps none of its own)
[ -d "$work/two/rank1/checkpoints" ] && [ -n "$(ls "$work/two/rank1/checkpoints")" ] &&
  { echo "FAIL: rank 1 wrote a checkpoint of its own"; fail=1; }
for d in "$work/two/checkpoints"; do
  n=0
  while IFS= read -r f; do
    rel=${f#"$d"/}
    if ! cmp -s "$f" "$work/one/checkpoints/$rel"; then echo "FAIL: $d/$rel differs"; fail=1; fi
    n=$((n + 1))
  done < <(find "$d" -path '*params*' -type f)
  if [ $n -eq 0 ]; then echo "FAIL: no params files in $d"; fail=1; fi
  echo "$d: $n params files compared"
done
[ $fail -eq 0 ] && echo "train_dp: 2 processes == 1 process, bit for bit (4 steps)"
exit $fail
