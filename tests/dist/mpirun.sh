#!/usr/bin/env bash
# Runs a command as NP processes of one MPI job on this machine (loopback),
# bounded in time: mpirun.sh NP CMD [ARGS...]. The limit is
# NABLA_MPI_TIMEOUT seconds (default 240), mpirun's own --timeout, with
# coreutils timeout behind it in case mpirun itself hangs.
set -u
np=$1; shift
limit=${NABLA_MPI_TIMEOUT:-240}
command -v mpirun >/dev/null || { echo "mpirun.sh: mpirun not found (apt-get install openmpi-bin): skipped"; exit 77; }
. "$(dirname "$0")/mpi_env.sh"
exec timeout -k 5 $((limit + 10)) mpirun -np "$np" --oversubscribe --bind-to none --timeout "$limit" "$@"
