#!/usr/bin/env bash
# Claim (issue 16, GRPO): GRPO raises a tiny pretrained model's exact-match
# reward on held-out prompts by a clear margin in minutes on 2 cores, and its
# rollouts (the serve engine, batched and paged) run at the engine's own
# speed. One run, in order:
#   1. `nabla train`: a byte-level llama (2 layers, d 64) on lines "abc=cba"
#      (the reversal) and "abc=abc" (the copy), half and half, 600 steps;
#   2. `nabla grpo` from it: prompts "\nabc=" with the reversal as "answer",
#      reward exact (the completion's letters == answer), 8 prompts x 8
#      completions per step, STEPS steps; greedy exact match on 64 held-out
#      prompts (words the base never saw) every 10 steps and at step 0;
#   3. bench_serve_decode on the same base with 64 sequences of a 5-token
#      prompt, 4 tokens each (the rollout's shape, greedy, one request per
#      sequence): the serve benchmark's decode tokens/s beside GRPO's.
# Usage: bench/grpo_reverse.sh [BUILD_DIR] [STEPS]   (default build, 60)
# Prints a table to paste into bench/RESULTS.md; report.html of the GRPO run
# (the reward curve) is left in the printed work dir.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/${1:-build}
steps=${2:-60}
work=$(mktemp -d /tmp/nabla_grpo.XXXXXX)
cd "$work"
python3 - <<'PY'
import json, random
rng = random.Random(1)
L = "abcdefgh"
def w(): return "".join(rng.choice(L) for _ in range(3))
held = set()
while len(held) < 64: held.add(w())
def seen():
    x = w()
    while x in held: x = w()
    return x
with open("lm.txt", "w") as f:
    for _ in range(20000):
        x = seen()
        f.write(f"{x}={x[::-1] if rng.random() < 0.5 else x}\n")
with open("train.jsonl", "w") as f:
    for _ in range(2000):
        x = seen()
        f.write(json.dumps({"prompt": f"\n{x}=", "answer": x[::-1]}) + "\n")
with open("eval.jsonl", "w") as f:
    for x in sorted(held):
        f.write(json.dumps({"prompt": f"\n{x}=", "answer": x[::-1]}) + "\n")
PY
cat > base.yaml <<'YAML'
model: {preset: llama-tiny, vocab_size: 256, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 4, d_ff: 128, max_seq_len: 32}
data: {train: lm.txt, seq_len: 32, workers: 0}
optim: {lr: 3.0e-3, weight_decay: 0}
schedule: {kind: cosine, warmup_steps: 20}
batch_size: 32
steps: 600
eval_every: 0
log_every: 100
checkpoint_every: 0
YAML
cat > grpo.yaml <<'YAML'
data: {train: train.jsonl, eval: eval.jsonl, seq_len: 10}
optim: {lr: 1.0e-4, weight_decay: 0}
schedule: {kind: constant, warmup_steps: 0}
batch_size: 8
eval_every: 10
log_every: 1
checkpoint_every: 0
grpo:
  base: base
  num_generations: 8
  max_completion_length: 5
  stop_token_id: 10
  loss_type: dapo
  eval_prompts: 64
  rewards:
    - {kind: exact, pattern: '^([a-h]+)', field: answer}
YAML
t0=$(date +%s.%N)
"$build/nabla" train base.yaml --run-dir base --threads 2 > base.out
t1=$(date +%s.%N)
"$build/nabla" grpo grpo.yaml --run-dir grpo --threads 2 steps="$steps" > grpo.out
t2=$(date +%s.%N)
"$build/bench_serve_decode" --run-dir base --seqs 64 --prompt 5 --tokens 4 --reps 5 --threads 2 > serve.out
echo "date $(date -u '+%Y-%m-%d %H:%M UTC'); CPU $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load before/after: see uptime"
uptime
echo "work dir: $work (grpo/report.html has the reward curve)"
printf "pretraining 600 steps: %.1f s, final loss %s\n" "$(echo "$t1 - $t0" | bc)" "$(sed -n 's/^done: step [0-9]*, loss \([0-9.]*\).*/\1/p' base.out)"
printf "GRPO %s steps: %.1f s wall (compile included)\n" "$steps" "$(echo "$t2 - $t1" | bc)"
echo
echo "| step | held-out exact match (64 prompts, greedy) | train reward (mean of the step's 64 samples) |"
echo "|---|---|---|"
python3 - "$work/grpo/metrics.jsonl" <<'PY'
import json, sys
ev, tr = {}, {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "eval_reward" in j: ev[j["step"]] = j["eval_reward"]
    elif "reward" in j: tr[j["step"]] = j["reward"]
for s in sorted(ev):
    print(f"| {s} | {ev[s]:.3f} | {tr[s]:.3f} |" if s in tr else f"| {s} | {ev[s]:.3f} | - |")
PY
echo
grep '^rollouts:' grpo.out
grep '^done:' grpo.out
echo "serve benchmark, the same base, 64 sequences x (5-token prompt, 4 tokens): $(grep '^RESULT' serve.out)"
echo "  (RESULT serve prefill_tok_s decode_tok_s floor_tok_s bytes_per_token bandwidth_GB_s decode_tok_per_cpu_s)"
