#!/usr/bin/env bash
# Peak resident memory and step time of SFT on gpt2-124m: LoRA (r 8 on the
# attention projections; the base frozen: no gradient, no AdamW state) vs
# full fine-tuning (every parameter trained), the same data, batch and
# sequence length, in one run, alternated. Usage:
#   bench/lora_rss.sh [BUILD_DIR] [ROUNDS]      (default build, 2)
# Appends nothing itself: paste its table into bench/RESULTS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/${1:-build}/nabla
rounds=${2:-2}
work=$(mktemp -d /tmp/nabla_lora_rss.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
# a byte-level text and a chat data set (reverse a word), made here
awk 'BEGIN { srand(1); for (i = 0; i < 2000; i++) { w = ""; n = 3 + int(rand() * 4);
  for (k = 0; k < n; k++) w = w substr("abcdefgh", 1 + int(rand() * 8), 1);
  r = ""; for (k = n; k >= 1; k--) r = r substr(w, k, 1);
  print w " " r > "base.txt";
  printf "{\"messages\": [{\"role\": \"user\", \"content\": \"reverse %s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", w, r > "chat.jsonl" } }'
common="data.seq_len=256 batch_size=4 grad_accum=1 data.workers=0 eval_every=0 checkpoint_every=0 schedule.warmup_steps=0 remat=none"
"$bin" train "$root/configs/gpt2_124m.yaml" --run-dir base --threads 2 data.train=base.txt steps=1 log_every=1 $common >/dev/null
cat > sft.yaml <<'YAML'
sft: {base: base, chat_template: chatml}
lora: {target: '.*attn/w[qkvo]', rank: 8, alpha: 16}
data: {train: chat.jsonl, eval: ""}
optim: {lr: 1.0e-4}
YAML
printf "| side | round | peak RSS (MiB) | step ms (median of 6) | trainable parameters |\n|---|---|---|---|---|\n"
for r in $(seq 1 "$rounds"); do
  for side in lora full; do
    rm -rf "run_$side"
    extra=""
    [ "$side" = full ] && extra="lora.target="
    /usr/bin/time -f "%M" -o rss.txt "$bin" sft sft.yaml --run-dir "run_$side" --threads 2 steps=6 log_every=1 \
      eval_steps=1 $common $extra > out.txt 2>&1 || { cat out.txt; exit 1; }
    rss=$(( $(cat rss.txt) / 1024 ))
    ms=$(sed -n 's/.*step \([0-9.]*\) ms (median).*/\1/p' out.txt)
    np=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' out.txt)
    echo "| $side | $r | $rss | $ms | $np |"
  done
done
