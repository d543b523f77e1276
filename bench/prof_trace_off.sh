#!/usr/bin/env bash
# Claim: with no trace recorded, the recorder (src/util/trace.h: a relaxed
# load and a branch per site) costs nothing measurable. Runs bench_gpt2_step
# of a build without the recorder (BASE) and of this one (NEW) alternately,
# ROUNDS times each (which goes first alternates), on the same arguments, and
# prints each side's median step, their ratio and the spread of the rounds.
#   bench/prof_trace_off.sh BASE_BUILD_DIR NEW_BUILD_DIR [ROUNDS] [bench_gpt2_step args...]
# BASE_BUILD_DIR: e.g. a build of the commit before the recorder
#   (git archive 0162377 | tar -x -C /tmp/base; cmake -S /tmp/base -B /tmp/base/build
#    -DCMAKE_BUILD_TYPE=RelWithDebInfo; cmake --build /tmp/base/build --target bench_gpt2_step).
set -euo pipefail
base=$1 new=$2 rounds=${3:-6}
shift 3 || shift $#
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--preset gpt2-tiny --batch 4 --seq 64 --steps 15 --threads 2)
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "args: ${args[*]}; $rounds rounds per side, interleaved"
step_of() { # the median step (seconds) of one run
  "$1/bench_gpt2_step" "${args[@]}" | sed -n 's/^RESULT nabla .*: step \([0-9.]*\) s (median.*/\1/p'
}
b=() n=()
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then b+=("$(step_of "$base")"); n+=("$(step_of "$new")")
  else n+=("$(step_of "$new")"); b+=("$(step_of "$base")"); fi
  echo "round $r: base ${b[-1]} s, new ${n[-1]} s"
done
python3 - "${b[*]}" "${n[*]}" <<'EOF'
import statistics as st, sys
b = [float(x) for x in sys.argv[1].split()]
n = [float(x) for x in sys.argv[2].split()]
mb, mn = st.median(b), st.median(n)
print(f"RESULT prof_trace_off: base {mb*1e3:.3f} ms, new (tracing off) {mn*1e3:.3f} ms (medians of {len(b)}), new/base {mn/mb:.4f}; "
      f"rounds base {min(b)*1e3:.2f}..{max(b)*1e3:.2f} ms, new {min(n)*1e3:.2f}..{max(n)*1e3:.2f} ms")
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
