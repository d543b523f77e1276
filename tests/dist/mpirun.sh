#!/usr/bin/env bash
# Runs a command as NP processes of one MPI job on this machine (loopback),
# bounded in time: mpirun.sh NP CMD [ARGS...]. The limit is
# NABLA_MPI_TIMEOUT seconds (default 240), mpirun's own --timeout, with
# coreutils timeout behind it in case mpirun itself hangs.
set -u
np=$1; shift
limit=${NABLA_MPI_TIMEOUT:-240}
command -v mpirun >/dev/null || { echo "mpirun.sh: mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
export OMPI_MCA_rmaps_base_oversubscribe=1
# under LeakSanitizer (the sanitizer pass), Open MPI's own allocations are not ours
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp"
# containers often run tests as root; Open MPI refuses that unless told
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
exec timeout -k 5 $((limit + 10)) mpirun -np "$np" --oversubscribe --bind-to none --timeout "$limit" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo "$@"
