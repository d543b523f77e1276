#!/usr/bin/env bash
# LoRA SFT step time on gpt2-124m: nabla vs PEFT + transformers (Debian's CPU torch), the same
# random weights (one Hugging Face folder both load), threads, batch, sequence length, rank and
# targets (the attention projections: nabla's wq, wk, wv, wo; PEFT's c_attn and attn.c_proj),
# AdamW, no dropout; rounds alternate the two sides. Usage:
#   bench/lora_vs_peft.sh [BUILD_DIR] [ROUNDS] [STEPS] [BATCH] [SEQ] [THREADS]
#   (defaults: build 3 4 2 64 2; PYTHON: a python with peft + transformers, default /work/venv-peft2/bin/python)
# Prints one row per side and round (median step wall time, process CPU time) and the load;
# paste the table into bench/RESULTS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/${1:-build}/nabla
rounds=${2:-3} steps=${3:-4} B=${4:-2} T=${5:-64} threads=${6:-2} r=8
py=${PYTHON:-/work/venv-peft2/bin/python}
work=$(mktemp -d /tmp/nabla_lora_peft.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" "$root/bench/lora_peft_step.py" --make gpt2 2>/dev/null
# chat data (reverse a word), byte-level ids
awk 'BEGIN { srand(1); for (i = 0; i < 400; i++) { w = ""; n = 3 + int(rand() * 4);
  for (k = 0; k < n; k++) w = w substr("abcdefgh", 1 + int(rand() * 8), 1);
  r = ""; for (k = n; k >= 1; k--) r = r substr(w, k, 1);
  printf "{\"messages\": [{\"role\": \"user\", \"content\": \"reverse %s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", w, r > "chat.jsonl" } }'
cat > sft.yaml <<YAML
sft: {base: gpt2, chat_template: chatml}
lora: {target: '.*attn/w[qkvo]', rank: $r, alpha: $((2 * r))}
data: {train: chat.jsonl, eval: ""}
optim: {lr: 1.0e-4}
YAML
common="data.seq_len=$T batch_size=$B grad_accum=1 data.workers=0 eval_every=0 eval_steps=1 checkpoint_every=0 schedule.warmup_steps=0 remat=none"
echo "# $(date -u '+%F %T') UTC, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; B $B x T $T, r $r, $threads threads, $steps timed steps"
printf "| side | round | step ms (median) | process CPU s (all, incl. start-up) | load avg (1 min) before |\n|---|---|---|---|---|\n"
med() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
for round in $(seq 1 "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  rm -rf run
  /usr/bin/time -f "%U %S" -o cpu.txt "$bin" sft sft.yaml --run-dir run --threads "$threads" steps=$((steps + 1)) log_every=1 \
    $common > out.txt 2>&1 || { cat out.txt; exit 1; }
  # each step's wall time from its logged tokens/s (B x T tokens a step); step 1 (warm-up) left out
  ms=$(sed -n 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/p' run/metrics.jsonl | tail -n "$steps" | awk -v n=$((B * T)) '{ printf "%.1f\n", n / $1 * 1e3 }' | med)
  echo "| nabla | $round | $ms | $(awk '{ print $1 + $2 }' cpu.txt) | $load |"
  load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -f "%U %S" -o cpu.txt "$py" "$root/bench/lora_peft_step.py" gpt2 "$B" "$T" "$r" "$threads" "$steps" > pout.txt 2>perr.txt ||
    { cat perr.txt; exit 1; }
  ms=$(awk '/^step/ { print $4 }' pout.txt | med)
  pcpu=$(awk '/^step/ { print $6 }' pout.txt | med)
  echo "| PEFT | $round | $ms (CPU $pcpu per step) | $(awk '{ print $1 + $2 }' cpu.txt) | $load |"
done
