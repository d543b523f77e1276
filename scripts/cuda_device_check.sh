#!/usr/bin/env bash
# The CUDA backend's checks on a machine with a GPU, from prebuilt binaries:
#   scripts/cuda_device_check.sh CARRY_DIR [SECONDS]
# CARRY_DIR holds carry.tar.xz (bin/: stripped test and bench binaries,
# lib/: the shared libraries they need that the GPU machine may lack) and the
# torch peer (gpt2_step_torch.py, gpt2_step_args.py). Runs, within SECONDS
# (default 215): the machine's facts; the cuda tests proper one by one
# (backend/test_backend, compile/test_jit_prims, train/test_cuda_step,
# backend/test_cuda_codegen, compile/test_jit_dot under NABLA_BACKEND=cuda);
# then the other unit tests under
# NABLA_BACKEND=cuda in parallel; then the gpt2 step benchmark on cuda,
# on the CPU and in PyTorch on the GPU. Logs go to $OUT (logs.tar.gz,
# summary.txt, env.txt); the summary is printed last.
set -u
carry=$(cd "$1" && pwd) budget=${2:-215}
out=${OUT:-/tmp/nabla-device-out}
mkdir -p "$out/logs"
t0=$(date +%s)
left() { echo $((t0 + budget - $(date +%s))); }
d=/tmp/nabla-device
mkdir -p "$d" /tmp/nabla-build
tar -xJf "$carry/carry.tar.xz" -C "$d"
{
  echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  grep -m1 "model name" /proc/cpuinfo; nproc; head -2 /etc/os-release; ldd --version | head -1; gcc --version | head -1
  echo "== CUDA libraries"; ldconfig -p | grep -E "libcuda\.so|libnvrtc\.so|libcublasLt\.so"
  find / -xdev \( -name "libnvrtc.so*" -o -name "libcublasLt.so*" \) 2>/dev/null | head -8
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
lt=$(find / -xdev -name "libcublasLt.so.13*" 2>/dev/null | head -1)
nv=$(find / -xdev -name "libnvrtc.so.13*" 2>/dev/null | grep -v alt | head -1)
export LD_LIBRARY_PATH="$d/lib:${lt:+$(dirname "$lt"):}${nv:+$(dirname "$nv"):}${LD_LIBRARY_PATH:-}"
export NABLA_SOURCE_DIR=$PWD NABLA_BUILD_DIR=/tmp/nabla-build NABLA_BIN=/bin/false NABLA_CUDA_POISON=1
summary=$out/summary.txt
: > "$summary"
# run NAME TIMEOUT [VAR=VALUE...]: one binary, its log, a summary line
run() {
  local name=$1 to=$2
  shift 2
  local s=$(date +%s%N)
  env "$@" timeout "$to" "$d/bin/$name" > "$out/logs/$name.log" 2>&1
  local rc=$? ms=$((($(date +%s%N) - s) / 1000000))
  local last=$(grep -E "passed, [0-9]+ failed|SKIPPED" "$out/logs/$name.log" | tail -2 | tr '\n' ' ')
  echo "$name ${*:-} rc=$rc ${ms}ms $last" >> "$summary"
}
export -f run
export d out summary
echo "== cuda tests proper" >> "$summary"
for t in backend_test_cuda_codegen backend_test_backend compile_test_jit_prims train_test_cuda_step; do
  run "$t" 70
  tail -n 1 "$summary"
done
run compile_test_jit_dot 70 NABLA_BACKEND=cuda # every dot layout and dtype pair: which go to cuBLASLt, all against the interpreter
tail -n 1 "$summary"
echo "== the suite under NABLA_BACKEND=cuda ($(left) s left)" >> "$summary"
to=$(( $(left) - 75 ))
[ "$to" -gt 100 ] && to=100
if [ "$to" -gt 10 ]; then
  ls "$d/bin" | grep _test_ | grep -v -E "test_cuda_codegen|test_cuda_step|backend_test_backend|compile_test_jit_prims|compile_test_jit_dot" |
    xargs -P 12 -I{} bash -c "run {} $to NABLA_BACKEND=cuda"
fi
echo "== gpt2 step ($(left) s left)" >> "$summary"
b="$d/bin/bench_gpt2_step"
if [ "$(left)" -gt 40 ]; then
  for dev in cuda cpu; do
    NABLA_BACKEND=$dev timeout 25 "$b" --preset gpt2-tiny --batch 4 --seq 64 --steps 10 --threads 16 --profile 4 > "$out/logs/gpt2_tiny_$dev.log" 2>&1
    grep -E "^RESULT|^compile|last step|  step " "$out/logs/gpt2_tiny_$dev.log" | sed "s/^/[$dev] /" >> "$summary"
  done
  (cd "$carry" && timeout 25 python3 gpt2_step_torch.py --preset gpt2-tiny --batch 4 --seq 64 --steps 10 --device cuda) > "$out/logs/gpt2_tiny_torch.log" 2>&1
  grep "^RESULT" "$out/logs/gpt2_tiny_torch.log" >> "$summary"
fi
if [ "$(left)" -gt 25 ]; then
  NABLA_BACKEND=cuda timeout $(( $(left) - 12 )) "$b" --preset gpt2-124m --batch 4 --seq 256 --steps 3 --threads 16 --profile 6 > "$out/logs/gpt2_124m_cuda.log" 2>&1
  grep -E "^RESULT|^compile|last step|  step " "$out/logs/gpt2_124m_cuda.log" | sed "s/^/[cuda 124m] /" >> "$summary"
  (cd "$carry" && timeout 20 python3 gpt2_step_torch.py --preset gpt2-124m --batch 4 --seq 256 --steps 3 --device cuda) > "$out/logs/gpt2_124m_torch.log" 2>&1
  grep "^RESULT" "$out/logs/gpt2_124m_torch.log" >> "$summary"
fi
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
echo "== summary ($(left) s left)"
cat "$summary"
