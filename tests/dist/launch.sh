#!/usr/bin/env bash
# `nabla launch`: its errors, the command lines it builds for mpirun and for
# Slurm's srun (printed by --dry-run: no Slurm here), and a real 2-process
# job on loopback whose ranks write their lines in pieces to stdout and
# stderr: every line must come out whole, "[rank R] " naming the rank that
# wrote it, none lost; the job's exit status is the failing rank's.
# Usage: launch.sh NABLA_BIN.
set -u
nabla=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "launch: mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
. "$here/mpi_env.sh"
work=$(mktemp -d /tmp/nabla-launch.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# expect RC PATTERN CMD...: the exit status and a line of the output
expect() {
  local rc=$1 pat=$2; shift 2
  out=$("$@" 2>&1); got=$?
  [ "$got" = "$rc" ] || bad "'$*' exited $got, not $rc: $out"
  echo "$out" | grep -Eq -- "$pat" || bad "'$*' did not say /$pat/: $out"
}
unset SLURM_JOB_ID
expect 2 "missing '--'" "$nabla" launch -n 2 nabla train
expect 2 "no command after '--'" "$nabla" launch -n 2 --
expect 2 "at least 1" "$nabla" launch -n 0 -- true
expect 2 "-n N .* is required" "$nabla" launch -- true
expect 2 "--max-restarts needs a value" "$nabla" launch -n 2 --max-restarts
expect 2 "--hosts /nonexistent: No such file" "$nabla" launch -n 2 --hosts /nonexistent -- true
expect 1 "mpirun not found on \\\$PATH" env PATH=/nonexistent "$nabla" launch -n 2 -- true
expect 1 "srun not found on \\\$PATH" env PATH=/nonexistent SLURM_JOB_ID=7 "$nabla" launch -n 2 -- true
# the help of the command after "--" is the command's
expect 0 " -- nabla train --help\$" "$nabla" launch -n 2 --dry-run -- nabla train --help
# the command lines
self=$(readlink -f "$nabla")
expect 0 "^NABLA_THREADS=3 OMP_NUM_THREADS=3 NABLA_LAUNCH_ESCAPE=1 [^ ]*mpirun -np 2 --bind-to none --tag-output -x NABLA_THREADS -x OMP_NUM_THREADS -x NABLA_LAUNCH_ATTEMPT -x NABLA_LAUNCH_ESCAPE $self launch --as-rank -- nabla train 'a b'\$" \
  "$nabla" launch -n 2 --threads-per-proc 3 --dry-run -- nabla train "a b"
echo "localhost slots=2" > "$work/hosts"
expect 0 " --hostfile $work/hosts $self launch --as-rank -- true\$" "$nabla" launch -n 2 --hosts "$work/hosts" --dry-run -- true
expect 0 "^NABLA_THREADS=1 OMP_NUM_THREADS=1 NABLA_LAUNCH_ESCAPE=0 [^ ]*srun --ntasks=4 --cpus-per-task=1 --kill-on-bad-exit=1 $self launch --as-rank -- nabla train\$" \
  env SLURM_JOB_ID=7 "$nabla" launch -n 4 --threads-per-proc 1 --dry-run -- nabla train
expect 0 "srun --ntasks=2 --cpus-per-task=2 --kill-on-bad-exit=1 --nodefile=$work/hosts " \
  "$nabla" launch -n 2 --slurm --threads-per-proc 2 --hosts "$work/hosts" --dry-run -- true
# a real job: 300 lines per rank on stdout and 50 on stderr, each written in
# three pieces, with '[' and the escape byte in the text; rank 1 fails (exit
# 3) once rank 0 is done (a failing rank ends the job: mpirun kills the rest)
cat > "$work/chatty.sh" <<'EOS'
r=$OMPI_COMM_WORLD_RANK
i=0
while [ $i -lt 300 ]; do
  printf '[r%s-' "$r"; printf '%s-\001[1,1]<stdout>:' "$i"; printf 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n'
  if [ $((i % 6)) = 0 ]; then printf 'e%s-' "$r" >&2; printf '%s-' "$i" >&2; printf 'err\n' >&2; fi
  i=$((i + 1))
done
echo "threads $NABLA_THREADS $OMP_NUM_THREADS"
if [ "$r" = 0 ]; then touch "$DONE"; exit 0; fi
n=0
while [ ! -e "$DONE" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
exit 3
EOS
DONE=$work/rank0.done timeout -k 5 120 "$nabla" launch -n 2 --threads-per-proc 2 -- sh "$work/chatty.sh" > "$work/out" 2> "$work/err"
rc=$?
[ $rc = 3 ] || bad "the job exited $rc, not 3 (rank 1's status)"
for r in 0 1; do
  n=$(grep -Ec "^\[rank $r\] \[r$r-[0-9]+-"$'\001'"\[1,1\]<stdout>:x{63}\$" "$work/out")
  [ "$n" = 300 ] || bad "rank $r: $n whole stdout lines of 300"
  n=$(grep -Ec "^\[rank $r\] e$r-[0-9]+-err\$" "$work/err")
  [ "$n" = 50 ] || bad "rank $r: $n whole stderr lines of 50"
  grep -qx "\[rank $r\] threads 2 2" "$work/out" || bad "rank $r: NABLA_THREADS/OMP_NUM_THREADS not 2"
  grep -Eq "^\[rank $r\] nabla launch: pid [0-9]+ runs sh \(attempt 1\)\$" "$work/err" || bad "rank $r: no pid line"
done
# every line a rank wrote is prefixed (Open MPI's own lines on stderr are not)
n=$(grep -cv '^\[rank [01]\] ' "$work/out")
[ "$n" = 0 ] || bad "$n stdout lines without a rank prefix: $(grep -v '^\[rank [01]\] ' "$work/out" | head -3)"
if [ $fail -ne 0 ]; then echo "--- stdout (head)"; head -5 "$work/out"; echo "--- stderr"; head -20 "$work/err"; fi
[ $fail -eq 0 ] && echo "launch: errors, mpirun/srun command lines, 2 ranks x 350 whole prefixed lines, exit status 3"
exit $fail
