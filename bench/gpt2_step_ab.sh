#!/usr/bin/env bash
# Two builds of nabla (A and B: before and after a change) and the peers,
# interleaved in every round, on one GPT-2 training-step shape: per round
# A's bench_gpt2_step, B's, PyTorch eager, JAX, each compiling into a fresh
# cache directory. The RESULT lines carry the wall-clock median and the
# process's CPU time per step (what a one-thread step costs on a loaded
# machine). With PROXY=1 everything is held to AVX2 on an AVX-512 machine:
# nabla's kernels compiled for Haswell and its AVX2 GEMM, PyTorch on
# OpenBLAS Haswell and ATen's AVX2 kernels, XLA at AVX2.
#
#   bench/gpt2_step_ab.sh A_BENCH B_BENCH THREADS PRESET B T STEPS ROUNDS [VOCAB]
#   PROXY=1 bench/gpt2_step_ab.sh /tmp/base/build/bench_gpt2_step build/bench_gpt2_step 1 gpt2-tiny 16 128 10 3
#
# THREADS 1 pins to CPU 0, 2 to CPUs 0,1. JAX_PYTHON (default python3) has jax and optax.
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 th=$3 preset=$4 B=$5 T=$6 steps=$7 rounds=$8 vocab=${9:-0}
args=(--preset "$preset" --batch "$B" --seq "$T" --steps "$steps")
[ "$vocab" != 0 ] && args+=(--vocab "$vocab")
pin=(taskset -c 0); [ "$th" = 2 ] && pin=(taskset -c 0,1)
export OPENBLAS_THREAD_TIMEOUT=4
if [ "${PROXY:-0}" = 1 ]; then
  export NABLA_CC="cc -O3 -march=haswell -fno-math-errno -fopenmp-simd -fPIC -shared" NABLA_SGEMM_ISA=avx2
  export OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 XLA_FLAGS=--xla_cpu_max_isa=AVX2
elif [ -z "${OPENBLAS_CORETYPE:-}" ]; then # as bench/gpt2_step.sh
  if grep -qw avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=CooperLake
  elif grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  fi
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; PROXY=${PROXY:-0} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
for r in $(seq 1 "$rounds"); do
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  for side in "A=$a" "B=$b"; do
    cache=$(mktemp -d)
    echo -n "${side%%=*}: "
    NABLA_CACHE_DIR=$cache "${pin[@]}" "${side#*=}" "${args[@]}" --threads "$th" | grep RESULT
    rm -rf "$cache"
  done
  "${pin[@]}" /usr/bin/python3 bench/gpt2_step_torch.py "${args[@]}" --threads "$th" | grep RESULT
  "${pin[@]}" "${JAX_PYTHON:-python3}" bench/gpt2_step_jax.py "${args[@]}" --threads "$th" 2>/dev/null | grep RESULT
done
