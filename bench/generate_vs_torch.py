"""nabla's KV-cached generation against PyTorch + transformers on the CPU,
side by side in one run: prefill tokens/s and greedy decode tokens/s for the
same model shapes (random weights, f32, same thread count), medians of REPS
runs after a warm-up, and the ratios.

nabla: build/bench_generate_decode (one process per preset; its RESULT line).
peer:  GPT2LMHeadModel / LlamaForCausalLM (eager attention), prefill = one
       forward over the prompt with use_cache, decode = one forward per token
       on the cache (what generate() does, without its bookkeeping).

Run with Debian's torch (apt-get install python3-torch; pip's pulls CUDA)
and transformers from PyPI in a venv with --system-site-packages:
  [THREADS=n] /tmp/hf/bin/python bench/generate_vs_torch.py [BUILD_DIR] [REPS] [PROMPT] [TOKENS] [preset ...]
(THREADS: both sides' thread count, default all CPUs)
"""
import os
import statistics
import subprocess
import sys
import time

# Debian 12's OpenBLAS takes recent Xeons for a Prescott (SSE3 kernels); nabla
# re-selects the kernels for the CPU's ISA, so give torch (same libopenblas)
# the same, before it loads; and make OpenBLAS's idle threads (torch uses
# them) sleep at once instead of spinning 0.1 s after each call.
if "OPENBLAS_CORETYPE" not in os.environ:
    flags = open("/proc/cpuinfo").read().split()
    if "avx512_bf16" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "CooperLake"
    elif "avx512f" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

# the presets of src/models/presets.c
PRESETS = {
    "gpt2-tiny": ("gpt2", dict(vocab=256, d=128, layers=4, heads=4, kv=4, ff=512, ctx=128)),
    "llama-tiny": ("llama", dict(vocab=256, d=128, layers=4, heads=4, kv=2, ff=384, ctx=128)),
    "gpt2-124m": ("gpt2", dict(vocab=50257, d=768, layers=12, heads=12, kv=12, ff=3072, ctx=1024)),
}


def peer_model(name):
    fam, p = PRESETS[name]
    if fam == "gpt2":
        cfg = GPT2Config(vocab_size=p["vocab"], n_embd=p["d"], n_layer=p["layers"], n_head=p["heads"],
                         n_inner=p["ff"], n_positions=p["ctx"], activation_function="gelu_new")
        return GPT2LMHeadModel(cfg).eval(), p["vocab"]
    cfg = LlamaConfig(vocab_size=p["vocab"], hidden_size=p["d"], num_hidden_layers=p["layers"],
                      num_attention_heads=p["heads"], num_key_value_heads=p["kv"], intermediate_size=p["ff"],
                      max_position_embeddings=p["ctx"], attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval(), p["vocab"]


def peer(name, reps, n_prompt, n_new):
    model, vocab = peer_model(name)
    ids = torch.tensor([[(i * 7919 + 13) % vocab for i in range(n_prompt)]])
    pre, dec = [], []
    with torch.no_grad():
        for r in range(reps + 1):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(n_new - 1):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            if r:  # the first run warms up
                pre.append(n_prompt / (t1 - t0))
                dec.append((n_new - 1) / (t2 - t1))
    return statistics.median(pre), statistics.median(dec)


def ours(build, name, reps, n_prompt, n_new, threads):
    out = subprocess.run([f"{build}/bench_generate_decode", "--reps", str(reps), "--prompt", str(n_prompt),
                          "--tokens", str(n_new), "--threads", str(threads), name],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            f = line.split()
            return float(f[2]), float(f[3]), float(f[4]), float(f[5]), float(f[6])
    raise RuntimeError(out)


def main():
    a = sys.argv[1:]
    build = a[0] if a else "build"
    reps = int(a[1]) if len(a) > 1 else 5
    n_prompt = int(a[2]) if len(a) > 2 else 64
    n_new = int(a[3]) if len(a) > 3 else 64
    names = a[4:] or ["gpt2-tiny", "llama-tiny"]
    threads = int(os.environ.get("THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {threads} threads; "
          f"prompt {n_prompt}, {n_new} new tokens, medians of {reps}\n")
    print("| preset | nabla prefill tok/s | torch prefill tok/s | ratio | nabla decode tok/s | torch decode tok/s | ratio "
          "| nabla decode / its floor |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        p_ours, d_ours, floor, _, _ = ours(build, name, reps, n_prompt, n_new, threads)
        p_peer, d_peer = peer(name, reps, n_prompt, n_new)
        print(f"| {name} | {p_ours:.0f} | {p_peer:.0f} | {p_ours / p_peer:.2f}x | {d_ours:.1f} | {d_peer:.1f} | "
              f"{d_ours / d_peer:.2f}x | {100 * d_ours / floor:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
