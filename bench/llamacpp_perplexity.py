#!/usr/bin/env python3
"""llama.cpp's held-out nll of a GGUF file, on the windows `nabla eval` scores.

The model is byte-level without a vocabulary in the file (nabla's "ids
only" GGUF), so llama.cpp is given token ids, not text: the bytes of the
text, cut as `nabla eval` cuts them (consecutive windows of seq_len + 1
ids, stride seq_len). Each window's first seq_len ids go through one
llama_decode (llama_cpp.Llama.eval, logits for every position), and the nll
of each next id comes from the log-softmax of its logits (numpy, f64).
Prints the same two lines as `nabla eval`: all predictions, and each
window's second half (llama-perplexity's scoring; llama-perplexity itself
cannot tokenize a vocabulary-less file).

Usage: /work/venv-llamacpp/bin/python bench/llamacpp_perplexity.py FILE.gguf TEXT [--seq-len 128] [--threads 2]
"""
import argparse
import math

import numpy as np
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("text")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-windows", type=int, default=0)
    a = ap.parse_args()
    ids = list(open(a.text, "rb").read())
    T = a.seq_len
    windows = (len(ids) - 1) // T
    if a.max_windows:
        windows = min(windows, a.max_windows)
    llm = Llama(model_path=a.gguf, n_ctx=T, n_batch=T, n_ubatch=T, logits_all=True, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False)
    nll = half = 0.0
    n = n_half = 0
    for w in range(windows):
        win = ids[w * T:w * T + T + 1]
        llm.reset()
        llm.eval(win[:T])
        logits = np.asarray(llm.scores[:T], dtype=np.float64)
        mx = logits.max(axis=1, keepdims=True)
        lse = (mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1)))
        per = lse - logits[np.arange(T), win[1:]]
        nll += per.sum()
        n += T
        half += per[T // 2:].sum()
        n_half += T - T // 2
    print(f"llama.cpp: {a.gguf} on {a.text}: {windows} windows of {T} tokens ({n} predictions)")
    print(f"nll {nll / n:.6f} nats/token, perplexity {math.exp(nll / n):.4f}; second halves: nll {half / n_half:.6f}, "
          f"perplexity {math.exp(half / n_half):.4f}")


if __name__ == "__main__":
    main()
