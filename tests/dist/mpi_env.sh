# Sourced by the multi-process tests: Open MPI on this machine only
# (loopback), more processes than cores allowed, run as root where a
# container makes the tests root. The environment reaches mpirun however it
# is started (tests/dist/mpirun.sh, or `nabla launch`).
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
# The sanitizer pass: LeakSanitizer reports ~3350 allocations of Open MPI's
# dlopen'ed components per process (no nabla frame in any: Open MPI 4.1.4,
# checked 2026-11-27), whose frames it cannot name after MPI_Finalize even
# with lsan.supp; leak checking is off under mpirun, and the tests count the
# context's bytes themselves (nb_ctx_bytes_in_use). ASan's other checks stay on.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# containers often run tests as root; Open MPI refuses that unless told
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
