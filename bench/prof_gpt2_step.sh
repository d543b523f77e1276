#!/usr/bin/env bash
# Claim (a use of the profiler, not a speed claim): what the op profile of
# one gpt2 training step says the floor is (every compiled step at its roof:
# max(FLOPs / FMA peak, bytes / memory bandwidth), the peaks measured and
# cached per machine) and where the time above it goes, by family and by
# step. Trains STEPS steps with profile.steps=STEPS and prints the table
# `nabla train` prints, the CPU share the run got, and where the page is.
#   bench/prof_gpt2_step.sh [BUILD_DIR] [CONFIG] [overrides...]
# Default: gpt2-124m at batch 4 x 256 tokens, 2 threads (about 4 minutes and
# 2.7 GB on 2 cores); the corpus comes from scripts/corpus.sh.
set -euo pipefail
build=${1:-build} config=${2:-configs/gpt2_124m.yaml}
shift 2 || shift $#
over=("$@")
[ ${#over[@]} -eq 0 ] && over=(batch_size=4 grad_accum=1 data.seq_len=256 steps=2 profile.steps=2 --threads 2)
run=$(mktemp -d /tmp/prof_gpt2_step.XXXXXX)
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: $build/nabla train $config --run-dir $run eval_every=0 checkpoint_every=0 log_every=1 ${over[*]}"
/usr/bin/time -f 'wall %e s, cpu %U+%S s, %P of a CPU, max rss %M kB' \
  "$build/nabla" train "$config" --run-dir "$run" eval_every=0 checkpoint_every=0 log_every=1 "${over[@]}" 2>&1 |
  sed -n -e '/^model FLOPs/p' -e '/^done:/,$p'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); the page: $run/profile.html, the profile: $run/profile/trace.ops.json"
