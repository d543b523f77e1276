#!/usr/bin/env bash
# Runs the GPT-2 training-step benchmark and its peers interleaved, on one
# machine, in one go: for each round, nabla (bench_gpt2_step), PyTorch eager
# (bench/gpt2_step_torch.py with Debian's /usr/bin/python3) and JAX
# (bench/gpt2_step_jax.py with python3). nabla's first round compiles cold
# into an empty cache directory; a second process then compiles the same
# step warm (--compile-only) from the disk cache. The RESULT lines go to
# stdout; medians and ratios are worked out from them (bench/RESULTS.md).
#
#   bench/gpt2_step.sh BUILD_DIR PRESET B T STEPS ROUNDS [VOCAB]
#   bench/gpt2_step.sh build gpt2-124m 4 256 3 2 50304
#   bench/gpt2_step.sh build gpt2-tiny 4 64 10 3
#
# THREADS (default 2) is the thread count of all three; TASKSET (for example
# "taskset -c 1") pins each program; JAX_PYTHON (default python3) is the
# interpreter that has jax and optax.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} preset=${2:-gpt2-124m} B=${3:-4} T=${4:-256} steps=${5:-3} rounds=${6:-2} vocab=${7:-0}
args=(--preset "$preset" --batch "$B" --seq "$T" --steps "$steps")
[ "$vocab" != 0 ] && args+=(--vocab "$vocab")
threads=${THREADS:-2} jax_python=${JAX_PYTHON:-python3}
read -r -a pin <<< "${TASKSET:-}"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
# Debian 12's OpenBLAS (0.3.21) takes recent Xeons for a Prescott and runs its
# SSE3 kernels; nabla re-selects the kernels for the CPU's ISA (nb_jit_blas_core),
# so PyTorch, whose matmuls call the same OpenBLAS, gets the same ones.
# PyTorch's matmuls run on OpenBLAS's threads, which spin for 0.1 s after each
# call; make them sleep at once (nabla's own pool spins only ~0.1 ms).
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=CooperLake
  elif grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  fi
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_THREAD_TIMEOUT=$OPENBLAS_THREAD_TIMEOUT"
for r in $(seq 1 "$rounds"); do
  echo "== round $r"
  NABLA_CACHE_DIR=$cache "${pin[@]}" "./$build/bench_gpt2_step" "${args[@]}" --threads "$threads" --profile 6 | grep -E "^(RESULT|compile|last step|  step)"
  if [ "$r" = 1 ]; then
    echo -n "warm (second process): "
    NABLA_CACHE_DIR=$cache "${pin[@]}" "./$build/bench_gpt2_step" "${args[@]}" --threads "$threads" --compile-only
  fi
  "${pin[@]}" /usr/bin/python3 bench/gpt2_step_torch.py "${args[@]}" --threads "$threads" | grep RESULT
  "${pin[@]}" "$jax_python" bench/gpt2_step_jax.py "${args[@]}" --threads "$threads" 2>/dev/null | grep RESULT
done
