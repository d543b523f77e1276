#!/usr/bin/env bash
# A job with a broken rank must end within seconds, failing, with a message
# naming the rank: rank 1 exits early ("exit") or never joins ("hang", where
# rank 0's collective times out after 3 s) or dies while a compiled step's
# psum is in flight ("inflight"). Usage: dead_rank.sh BINARY
# (build/dist_test_collectives).
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
fail=0
for mode in exit hang inflight; do
  start=$(date +%s)
  out=$(NABLA_MPI_TIMEOUT=60 "$here/mpirun.sh" 2 "$bin" "$mode" 2>&1)
  rc=$?
  took=$(( $(date +%s) - start ))
  echo "--- $mode: exit $rc after ${took}s"
  echo "$out" | grep -v '^$' | head -20
  if [ $rc -eq 0 ]; then echo "FAIL $mode: the job succeeded"; fail=1; fi
  if [ $took -gt 30 ]; then echo "FAIL $mode: took ${took}s (more than 30)"; fail=1; fi
  if ! echo "$out" | grep -Eq "rank 1( |\b|$)|for rank 1|process rank 1"; then echo "FAIL $mode: no message names rank 1"; fail=1; fi
done
[ $fail -eq 0 ] && echo "dead_rank: 3 broken jobs ended in time, naming rank 1"
exit $fail
